/* cmd_s3.c: tessera push | pull | ls | rm: checkpoints to and from S3-compatible
 * object storage. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "archive.h"
#include "cli.h"
#include "commands.h"
#include "s3.h"
#include "tessera.h"

static const char settings_help[] =
    "Credentials and settings come from the environment the AWS way: AWS_ACCESS_KEY_ID,\n"
    "AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION (or AWS_DEFAULT_REGION),\n"
    "AWS_ENDPOINT_URL, AWS_PROFILE with ~/.aws/credentials and ~/.aws/config.\n"
    "--endpoint URL overrides the endpoint. Tuning: TSR_S3_PART_SIZE (default 8M),\n"
    "TSR_S3_PARALLEL (transfers in flight, default 8), TSR_S3_MAX_ATTEMPTS (default 10),\n"
    "TSR_S3_RETRY_SECONDS (default 300), TSR_S3_ADDRESSING=path|virtual.\n";

/* The progress bar of a push or pull, over the library's reports (tsr_copy_opts). */
typedef struct xfer {
    const char *cmd;
    int json;
    tsr_progress bar;
    uint64_t bytes, total;
} xfer;

static void on_skipped(void *user, const char *msg) {
    fprintf(stderr, "tessera %s: %s\n", ((xfer *)user)->cmd, msg);
}

static void on_started(void *user, uint64_t total) {
    xfer *x = user;
    x->total = total;
    tsr_progress_start(&x->bar, x->cmd, total);
}

static void on_bytes(void *user, uint64_t n) {
    xfer *x = user;
    x->bytes += n;
    tsr_progress_add(&x->bar, n);
}

/* One step copied: its line, between two bars (none with --json). */
static void on_step(void *user, const char *from, const char *to, const tsr_copy_stats *st) {
    xfer *x = user;
    int push = !strcmp(x->cmd, "push");
    if (x->json) return;
    tsr_progress_end(&x->bar);
    fprintf(stderr, "%s %s -> %s", push ? "pushed" : "pulled", from, to);
    if (push)
        fprintf(stderr, " (%llu parts sent, %llu already uploaded)", (unsigned long long)st->parts_sent,
                (unsigned long long)st->parts_resumed);
    if (st->files_reencoded) {
        char a[32], b[32];
        fprintf(stderr, ", %llu data file(s) with raw frames re-encoded: %s -> %s",
                (unsigned long long)st->files_reencoded, tsr_fmt_bytes(st->reencoded_bytes_in, a, sizeof a),
                tsr_fmt_bytes(st->reencoded_bytes_out, b, sizeof b));
    }
    fprintf(stderr, "\n");
    tsr_progress_start(&x->bar, x->cmd, x->total);
    x->bar.done = x->bytes;
}

/* Checks that the S3 location url can be read, so that a failure is reported
 * with the server's reason rather than as "nothing there". @return 0, or -1
 * after printing the reason. */
static int remote_check(const char *cmd, const char *url) {
    tsr_error e = {0};
    if (tsr_archive_check_remote(url, &e)) {
        fprintf(stderr, "tessera %s: %s\n", cmd, e.msg);
        return -1;
    }
    return 0;
}

/* Parses want positional arguments into args, --endpoint URL, and --json when
 * json is not NULL. @return 0, -1 after --help, or EXIT_USAGE. */
static int parse_args(const char *cmd, int argc, char **argv, const char *help, int want, const char **args,
                      int *json) {
    const char *v;
    int got = 0;
    for (int i = 1; i < argc; i++) {
        int r;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(help, stdout);
            fputs(settings_help, stdout);
            return -1;
        }
        if ((r = tsr_opt(argc, argv, &i, "endpoint", 1, &v))) {
            if (r < 0) return EXIT_USAGE;
            setenv("AWS_ENDPOINT_URL", v, 1);
        } else if (json && tsr_opt(argc, argv, &i, "json", 0, &v)) {
            *json = 1;
        } else if (argv[i][0] == '-') {
            return tsr_usage_error(cmd, "unknown option %s", argv[i]);
        } else if (got < want) {
            args[got++] = argv[i];
        } else {
            return tsr_usage_error(cmd, "unexpected argument %s", argv[i]);
        }
    }
    if (got < want) return tsr_usage_error(cmd, "missing arguments (see 'tessera %s --help')", cmd);
    return 0;
}

/* push and pull (tsr_push, tsr_pull): one copy per committed step, with one
 * progress bar, a line per step and the summary. */
static int copy_steps(const char *cmd, const char *src, const char *dst, int push, int json) {
    xfer x = {.cmd = cmd, .json = json};
    tsr_copy_opts o = {0, &x, on_skipped, on_started, on_bytes, on_step};
    tsr_copy_stats s;
    tsr_error e = {0};
    int rc = push ? tsr_push(src, dst, &o, &s, &e) : tsr_pull(src, dst, &o, &s, &e);
    tsr_progress_end(&x.bar);
    if (rc) {
        fprintf(stderr, "tessera %s: %s\n", cmd, e.msg);
        return EXIT_FAIL;
    }
    if (json)
        printf("{\"steps\":%llu,\"bytes\":%llu,\"seconds\":%.3f,\"parts_sent\":%llu,\"parts_resumed\":%llu,"
               "\"objects_skipped\":%llu,\"files_reencoded\":%llu,\"frames_encoded\":%llu,"
               "\"reencoded_bytes_in\":%llu,\"reencoded_bytes_out\":%llu}\n",
               (unsigned long long)s.steps, (unsigned long long)s.bytes, s.seconds,
               (unsigned long long)s.parts_sent, (unsigned long long)s.parts_resumed,
               (unsigned long long)s.objects_skipped, (unsigned long long)s.files_reencoded,
               (unsigned long long)s.frames_encoded, (unsigned long long)s.reencoded_bytes_in,
               (unsigned long long)s.reencoded_bytes_out);
    else {
        char b[32];
        printf("%s %llu checkpoint(s), %s in %.2f s (%.0f MB/s)\n", push ? "pushed" : "pulled",
               (unsigned long long)s.steps, tsr_fmt_bytes(s.bytes, b, sizeof b), s.seconds,
               s.seconds > 0 ? (double)s.bytes / s.seconds / 1e6 : 0.0);
    }
    return EXIT_OK;
}

static const char push_help[] =
    "usage: tessera push DIR DST [--endpoint URL] [--json]\n"
    "Uploads a committed checkpoint DIR (to DST/<its name>), or every committed\n"
    "checkpoint of the root DIR, to DST = s3://bucket/prefix/. Data files go first,\n"
    "the MANIFEST last: a checkpoint cut short is never listed as committed.\n"
    "Frames a save stored raw are encoded on the way (as a save with codec auto\n"
    "encodes them: bytegroup for f32/f16/bf16, zstd otherwise; raw where that is\n"
    "not smaller), a batch of frames at a time, and the MANIFEST uploaded\n"
    "describes them: the same values and raw checksums in fewer bytes. A data file\n"
    "without raw frames goes up as it is: objects already complete (size and\n"
    "content hash) are skipped and an interrupted multipart upload is resumed\n"
    "(parts of the same size and SHA-256 are not sent again); a step whose\n"
    "re-encoded copy is committed at DST already is not sent again. So running\n"
    "the same push again finishes it. --json adds the data files re-encoded and\n"
    "their bytes before and after.\n";

static const char pull_help[] =
    "usage: tessera pull SRC DST [--endpoint URL] [--json]\n"
    "Downloads the committed checkpoint SRC = s3://bucket/prefix/step-N into the\n"
    "directory DST, or every committed checkpoint of the root SRC into DST/step-N.\n"
    "Ranged GETs in parallel; data files first, the MANIFEST last; each object's\n"
    "content hash is checked when tessera uploaded it.\n";

/* push and pull: the same arguments, the remote side checked. */
static int copy_cmd(int argc, char **argv, int push) {
    const char *cmd = push ? "push" : "pull", *a[2];
    int json = 0;
    int r = parse_args(cmd, argc, argv, push ? push_help : pull_help, 2, a, &json);
    if (r) return r < 0 ? EXIT_OK : r;
    const char *remote = a[push ? 1 : 0];
    if (!tsr_s3_is_url(remote))
        return tsr_usage_error(cmd, "%s must be s3://bucket/prefix, not %s", push ? "DST" : "SRC", remote);
    return copy_steps(cmd, a[0], a[1], push, json);
}

int tsr_cmd_push(int argc, char **argv) { return copy_cmd(argc, argv, 1); }
int tsr_cmd_pull(int argc, char **argv) { return copy_cmd(argc, argv, 0); }

static const char rm_help[] =
    "usage: tessera rm LOCATION [--endpoint URL]\n"
    "Removes the checkpoint at LOCATION (s3://bucket/prefix/step-N, or a local step\n"
    "directory): the MANIFEST first, so that a removal cut short leaves an\n"
    "uncommitted step, then the data files.\n";

int tsr_cmd_rm(int argc, char **argv) {
    const char *loc;
    int r = parse_args("rm", argc, argv, rm_help, 1, &loc, NULL);
    if (r) return r < 0 ? EXIT_OK : r;
    char name[300];
    uint64_t step;
    if (!tsr_parse_step_dir(tsr_path_base(loc, name, sizeof name), &step))
        return tsr_usage_error("rm", "%s: not a step directory (step-NNNNNNNN)", loc);
    tsr_error e = {0};
    if (tsr_remove_step_dir(loc, &e)) {
        fprintf(stderr, "tessera rm: %s\n", e.msg);
        return EXIT_FAIL;
    }
    printf("removed %s\n", loc);
    return EXIT_OK;
}

/* tessera ls: tessera ckpt ls, with --endpoint. */
int tsr_cmd_ls(int argc, char **argv) {
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    if (!rest) return EXIT_FAIL;
    int n = 0;
    for (int i = 0; i < argc; i++) {
        const char *v;
        int r = i ? tsr_opt(argc, argv, &i, "endpoint", 1, &v) : 0;
        if (r < 0) {
            free(rest);
            return EXIT_USAGE;
        }
        if (r) setenv("AWS_ENDPOINT_URL", v, 1);
        else rest[n++] = argv[i];
    }
    for (int i = 1; i < n; i++)
        if (tsr_s3_is_url(rest[i]) && remote_check("ls", rest[i])) {
            free(rest);
            return EXIT_FAIL;
        }
    int rc = tsr_cmd_ckpt_ls(n, rest);
    free(rest);
    return rc;
}
