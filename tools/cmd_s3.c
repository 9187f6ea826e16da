/* cmd_s3.c: tessera push | pull | ls | rm: checkpoints to and from S3-compatible
 * object storage. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "archive.h"
#include "cli.h"
#include "commands.h"
#include "s3.h"
#include "store.h"
#include "tessera.h"

static const char settings_help[] =
    "Credentials and settings come from the environment the AWS way: AWS_ACCESS_KEY_ID,\n"
    "AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION (or AWS_DEFAULT_REGION),\n"
    "AWS_ENDPOINT_URL, AWS_PROFILE with ~/.aws/credentials and ~/.aws/config.\n"
    "--endpoint URL overrides the endpoint. Tuning: TSR_S3_PART_SIZE (default 8M),\n"
    "TSR_S3_PARALLEL (transfers in flight, default 8), TSR_S3_MAX_ATTEMPTS (default 10),\n"
    "TSR_S3_RETRY_SECONDS (default 300), TSR_S3_ADDRESSING=path|virtual.\n";

typedef struct xfer {
    tsr_progress bar;
    uint64_t bytes;
} xfer;

static void on_bytes(void *user, uint64_t n) {
    xfer *x = user;
    x->bytes += n;
    tsr_progress_add(&x->bar, n);
}

static int summed(void *user, const char *name, uint64_t size) {
    (void)name;
    *(uint64_t *)user += size;
    return 0;
}

/* The bytes of the files in a step directory (for the progress bar). */
static uint64_t dir_bytes(const char *dir) {
    uint64_t n = 0;
    tsr_error e;
    tsr_store *st = tsr_store_open(dir, 0, &e);
    if (st) tsr_store_list(st, summed, &n, NULL);
    tsr_store_close(st);
    return n;
}

static int stop_at_first(void *user, const tsr_s3_object *o, int is_prefix) {
    (void)user, (void)o, (void)is_prefix;
    return 1;
}

/* Checks that the S3 location url can be read (credentials, endpoint, bucket,
 * signature), so that a failure is reported with the server's reason rather than
 * as "nothing there". @return 0, or -1 after printing the reason. */
static int remote_check(const char *cmd, const char *url) {
    tsr_error e = {0};
    char bucket[TSR_S3_MAX_BUCKET], key[TSR_S3_MAX_KEY];
    tsr_s3 *s3 = tsr_s3_split(url, bucket, sizeof bucket, key, sizeof key, &e) ? NULL : tsr_s3_new(NULL, &e);
    int rc = s3 ? tsr_s3_list(s3, bucket, key, "/", stop_at_first, NULL, &e) : -1;
    tsr_s3_free(s3);
    if (rc < 0) {
        fprintf(stderr, "tessera %s: %s\n", cmd, e.msg);
        return -1;
    }
    return 0;
}

/* The committed steps to copy from src: src itself (*single = 1), or every
 * committed step of the root src. Paths into *dirs (malloc'ed). */
static int steps_of(const char *cmd, const char *src, char (**dirs)[PATH_MAX], size_t *n, int *single) {
    *dirs = NULL;
    *n = 0;
    *single = 0;
    if (tsr_s3_is_url(src) && remote_check(cmd, src)) return -1;
    if (tsr_ckpt_is_committed(src)) {
        *single = 1;
        if (!(*dirs = calloc(1, sizeof **dirs))) return -1;
        snprintf((*dirs)[0], sizeof **dirs, "%s", src);
        *n = 1;
        return 0;
    }
    tsr_step_info *v = NULL;
    size_t count = 0;
    if (tsr_list_steps(src, &v, &count) != 0) {
        fprintf(stderr, "tessera %s: %s: neither a committed checkpoint nor a root of step directories\n", cmd, src);
        return -1;
    }
    *dirs = calloc(count ? count : 1, sizeof **dirs);
    if (!*dirs) {
        free(v);
        return -1;
    }
    size_t len = strlen(src);
    while (len > 1 && src[len - 1] == '/') len--;
    for (size_t i = 0; i < count; i++) {
        if (!v[i].committed) {
            fprintf(stderr, "tessera %s: %.*s/%s: not committed, skipped\n", cmd, (int)len, src, v[i].name);
            continue;
        }
        snprintf((*dirs)[(*n)++], sizeof **dirs, "%.*s/%s", (int)len, src, v[i].name);
    }
    free(v);
    if (*n == 0) {
        fprintf(stderr, "tessera %s: %s: no committed checkpoint\n", cmd, src);
        return -1;
    }
    return 0;
}

static const char *base_name(const char *path, char *buf, size_t len) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && path[b - 1] != '/') b--;
    snprintf(buf, len, "%.*s", (int)(n - b), path + b);
    return buf;
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

/* push and pull: one copy per committed step, with one progress bar. */
static int copy_steps(const char *cmd, const char *src, const char *dst, int push, int json) {
    char (*dirs)[PATH_MAX] = NULL;
    size_t n = 0;
    int single;
    tsr_error e = {0};
    /* pull: one writer at a time in the local folder it writes into (DST, or the
     * folder of DST when DST is one step), checked before any request; push:
     * refused when a writer's lease is on the prefix */
    tsr_folder_lock *lock = NULL;
    /* push: the local source is read first (every step's MANIFEST validated), so
     * that a bad one costs no request */
    if (push && steps_of(cmd, src, &dirs, &n, &single)) return EXIT_FAIL;
    for (size_t i = 0; push && i < n; i++) {
        tsr_ckpt *ck = tsr_ckpt_open(dirs[i], &e);
        if (!ck) {
            fprintf(stderr, "tessera %s: %s\n", cmd, e.msg);
            free(dirs);
            return EXIT_FAIL;
        }
        tsr_ckpt_close(ck);
    }
    if (push ? tsr_folder_lock_take(dst, 0, &lock, &e)
             : tsr_folder_lock_take(dst, 0, &lock, &e) || tsr_folder_lock_for_ckpt(dst, &lock, &e)) {
        fprintf(stderr, "tessera %s: %s\n", cmd, e.msg);
        free(dirs);
        return EXIT_FAIL;
    }
    if (!push && steps_of(cmd, src, &dirs, &n, &single)) {
        tsr_folder_lock_release(lock);
        return EXIT_FAIL;
    }
    if (!push && !single && !lock && tsr_folder_lock_take(dst, 1, &lock, &e)) { /* a root: DST is the folder */
        fprintf(stderr, "tessera %s: %s\n", cmd, e.msg);
        free(dirs);
        return EXIT_FAIL;
    }
    tsr_s3 *s3 = tsr_s3_new(NULL, &e);
    if (!s3) {
        fprintf(stderr, "tessera %s: %s\n", cmd, e.msg);
        free(dirs);
        tsr_folder_lock_release(lock);
        return EXIT_FAIL;
    }
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) total += dir_bytes(dirs[i]);
    xfer x = {0};
    tsr_s3_transfer t = {on_bytes, &x, 0, 0, 0};
    uint64_t skipped = 0;
    tsr_recode_stats rs = {0}; /* push: data files re-encoded, all steps */
    tsr_progress_start(&x.bar, cmd, total);
    double t0 = tsr_now();
    int rc = 0;
    size_t dl = strlen(dst);
    while (dl > 1 && dst[dl - 1] == '/') dl--;
    for (size_t i = 0; i < n && !rc; i++) {
        char to[PATH_MAX + 300], name[300];
        /* push of a step: DST/NAME (DST is a root); pull of a step: DST itself;
         * copies of a root: DST/NAME for each step */
        if (single && !push) snprintf(to, sizeof to, "%.*s", (int)dl, dst);
        else snprintf(to, sizeof to, "%.*s/%s", (int)dl, dst, base_name(dirs[i], name, sizeof name));
        tsr_s3_transfer before = t;
        tsr_recode_stats st = {0};
        rc = push ? tsr_archive_push_step(s3, dirs[i], to, 0, &t, &st, &e)
                  : tsr_archive_pull_step(s3, dirs[i], to, &t, &e);
        skipped += t.skipped;
        t.skipped = 0;
        rs.files += st.files, rs.frames += st.frames, rs.bytes_in += st.bytes_in, rs.bytes_out += st.bytes_out;
        if (!rc && !json) {
            tsr_progress_end(&x.bar);
            fprintf(stderr, "%s %s -> %s", push ? "pushed" : "pulled", dirs[i], to);
            if (push)
                fprintf(stderr, " (%llu parts sent, %llu already uploaded)",
                        (unsigned long long)(t.parts_sent - before.parts_sent),
                        (unsigned long long)(t.parts_resumed - before.parts_resumed));
            if (st.files) {
                char a[32], b[32];
                fprintf(stderr, ", %llu data file(s) with raw frames re-encoded: %s -> %s",
                        (unsigned long long)st.files, tsr_fmt_bytes(st.bytes_in, a, sizeof a),
                        tsr_fmt_bytes(st.bytes_out, b, sizeof b));
            }
            fprintf(stderr, "\n");
            tsr_progress_start(&x.bar, cmd, total);
            x.bar.done = x.bytes;
        }
    }
    tsr_progress_end(&x.bar);
    double secs = tsr_now() - t0;
    tsr_s3_free(s3);
    tsr_folder_lock_release(lock);
    free(dirs);
    if (rc) {
        fprintf(stderr, "tessera %s: %s\n", cmd, e.msg);
        return EXIT_FAIL;
    }
    if (json)
        printf("{\"steps\":%zu,\"bytes\":%llu,\"seconds\":%.3f,\"parts_sent\":%llu,\"parts_resumed\":%llu,"
               "\"objects_skipped\":%llu,\"files_reencoded\":%llu,\"frames_encoded\":%llu,"
               "\"reencoded_bytes_in\":%llu,\"reencoded_bytes_out\":%llu}\n",
               n, (unsigned long long)x.bytes, secs, (unsigned long long)t.parts_sent,
               (unsigned long long)t.parts_resumed, (unsigned long long)skipped, (unsigned long long)rs.files,
               (unsigned long long)rs.frames, (unsigned long long)rs.bytes_in, (unsigned long long)rs.bytes_out);
    else {
        char b[32];
        printf("%s %zu checkpoint(s), %s in %.2f s (%.0f MB/s)\n", push ? "pushed" : "pulled", n,
               tsr_fmt_bytes(x.bytes, b, sizeof b), secs, secs > 0 ? (double)x.bytes / secs / 1e6 : 0.0);
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
    if (!tsr_parse_step_dir(base_name(loc, name, sizeof name), &step))
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
