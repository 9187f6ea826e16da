/* cmd_repair.c: tessera ckpt verify --repair DIR [--from SOURCE ...]: the
 * damaged data files of a checkpoint rewritten from other copies of their
 * frames (ckpt/repair.h), then the whole checkpoint verified as `ckpt verify`
 * does. `ckpt verify` (cmd_ckpt.c) hands its arguments here when they hold
 * --repair or --from; its help describes both. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "commands.h"
#include "repair.h"
#include "tessera.h"

typedef struct repair_out {
    int json;
    int files;       /* file objects printed (JSON) */
    int open_frames; /* 1 while a JSON file object's frame list is open */
    int frames;      /* frames printed in it */
    int rewritten;   /* the current file's outcome, for its frames' lines */
    long problems;   /* verify's, after the repair */
} repair_out;

static void close_file(repair_out *o) {
    if (o->open_frames) printf("]}");
    o->open_frames = 0;
}

static void on_file(void *user, const tsr_repair_file *f) {
    repair_out *o = user;
    o->rewritten = f->rewritten;
    if (!f->damaged && !f->problem && !f->error) return; /* sound */
    if (o->json) {
        close_file(o);
        printf("%s{\"file\":", o->files++ ? "," : "");
        tsr_json_str(stdout, f->path);
        printf(",\"problem\":");
        if (f->problem) tsr_json_str(stdout, f->problem);
        else printf("null");
        printf(",\"frames\":%llu,\"damaged\":%llu,\"repaired\":%llu,\"lost\":%llu,\"rewritten\":%s,\"kept_aside\":%s,"
               "\"error\":",
               (unsigned long long)f->frames, (unsigned long long)f->damaged, (unsigned long long)f->repaired,
               (unsigned long long)f->lost, f->rewritten ? "true" : "false", f->kept_aside ? "true" : "false");
        if (f->error) tsr_json_str(stdout, f->error);
        else printf("null");
        printf(",\"damaged_frames\":[");
        o->open_frames = 1, o->frames = 0;
        return;
    }
    printf("%s: %llu of %llu frames damaged: %llu %s from other copies, %llu lost; ", f->path,
           (unsigned long long)f->damaged, (unsigned long long)f->frames, (unsigned long long)f->repaired,
           f->rewritten ? "repaired" : "found", (unsigned long long)f->lost);
    if (f->rewritten && f->kept_aside) printf("rewritten (the damaged file kept as %s.damaged)\n", f->path);
    else if (f->rewritten) printf("rewritten\n");
    else printf("left as it is\n");
    if (f->problem) printf("  %s\n", f->problem);
    if (f->error) fprintf(stderr, "tessera ckpt verify: %s\n", f->error);
}

static void on_frame(void *user, const tsr_repair_frame *f) {
    repair_out *o = user;
    if (o->json) {
        printf("%s{\"frame\":%u,\"offset\":%llu,\"owner\":", o->frames++ ? "," : "", f->frame,
               (unsigned long long)f->offset);
        tsr_json_str(stdout, f->owner);
        printf(",\"problem\":");
        tsr_json_str(stdout, f->problem);
        printf(",\"source\":");
        if (f->source) tsr_json_str(stdout, f->source);
        else printf("null");
        printf(",\"reencoded\":%s}", f->reencoded ? "true" : "false");
        return;
    }
    if (f->source)
        printf("  frame %u (offset %llu) of %s: %s %s (%s)\n", f->frame, (unsigned long long)f->offset, f->owner,
               o->rewritten ? "repaired from" : "found in", f->source,
               f->reencoded ? "its raw bytes stored anew" : "its stored bytes copied");
    else printf("  frame %u (offset %llu) of %s: lost\n", f->frame, (unsigned long long)f->offset, f->owner);
    printf("    %s\n", f->problem);
}

static void on_manifest(void *user, const char *problem, const char *source) {
    repair_out *o = user;
    if (o->json) return; /* "manifest_repaired" in the summary */
    printf("MANIFEST: repaired from %s (the damaged one kept as MANIFEST.damaged)\n    %s\n", source, problem);
}

static void on_source_failed(void *user, const char *msg) {
    (void)user;
    fprintf(stderr, "tessera ckpt verify: a source is skipped: %s\n", msg);
}

static void on_problem(void *user, const char *msg) {
    repair_out *o = user;
    if (o->json) {
        printf("%s", o->problems ? "," : "");
        tsr_json_str(stdout, msg);
    } else {
        printf("%s\n", msg);
    }
    o->problems++;
}

/* Adds a source: a checkpoint, or every committed step of a root (newest
 * first). @return 0, or -1 when out of memory. */
static int add_source(const char *loc, char ***srcs, size_t *n, size_t *cap) {
    tsr_step_info *steps = NULL;
    size_t count = 0, committed = 0;
    if (!tsr_ckpt_is_committed(loc) && tsr_list_steps(loc, &steps, &count) == 0)
        for (size_t i = 0; i < count; i++) committed += steps[i].committed > 0;
    size_t len = strlen(loc);
    while (len > 1 && loc[len - 1] == '/') len--;
    for (size_t k = 0; k < (committed ? count : 1); k++) {
        const tsr_step_info *s = committed ? &steps[count - 1 - k] : NULL;
        if (s && s->committed <= 0) continue;
        if (tsr_grow((void **)srcs, cap, *n, sizeof **srcs)) {
            free(steps);
            return -1;
        }
        size_t need = len + (s ? strlen(s->name) + 2 : 1);
        char *p = malloc(need);
        if (!p) {
            free(steps);
            return -1;
        }
        if (s) snprintf(p, need, "%.*s/%s", (int)len, loc, s->name);
        else snprintf(p, need, "%s", loc);
        (*srcs)[(*n)++] = p;
    }
    free(steps);
    return 0;
}

int tsr_cmd_ckpt_repair(int argc, char **argv) {
    const char *dir = NULL, *v;
    int json = 0, repair = 0, rc = EXIT_USAGE;
    uint64_t threads = 0;
    char **srcs = NULL;
    size_t n_src = 0, cap = 0;
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = tsr_opt(argc, argv, &i, "json", 0, &v))) json = 1;
        else if ((r = tsr_opt(argc, argv, &i, "repair", 0, &v))) repair = 1;
        else if ((r = tsr_opt(argc, argv, &i, "threads", 1, &v))) {
            if (r < 0 || tsr_parse_u64(v, &threads) || threads > 1024) {
                tsr_usage_error("ckpt verify", "--threads takes a number up to 1024");
                goto out;
            }
        } else if ((r = tsr_opt(argc, argv, &i, "from", 1, &v))) {
            if (r < 0) goto out;
            if (add_source(v, &srcs, &n_src, &cap)) {
                fprintf(stderr, "tessera ckpt verify: out of memory\n");
                rc = EXIT_FAIL;
                goto out;
            }
        } else if (argv[i][0] == '-') {
            tsr_usage_error("ckpt verify", "unknown option %s", argv[i]);
            goto out;
        } else if (!dir) dir = argv[i];
        else {
            tsr_usage_error("ckpt verify", "one DIR only");
            goto out;
        }
    }
    if (!repair) {
        tsr_usage_error("ckpt verify", "--from names the copies that --repair takes frames from: add --repair");
        goto out;
    }
    if (!dir) {
        tsr_usage_error("ckpt verify", "missing DIR");
        goto out;
    }
    char path[PATH_MAX];
    tsr_resolve_ckpt_dir("ckpt verify", dir, path, sizeof path);
    repair_out o = {.json = json};
    tsr_repair_opts opts = {(const char *const *)srcs, n_src, &o, on_frame, on_file, on_source_failed, on_manifest};
    tsr_repair_stats st;
    tsr_error e = {0};
    if (json) {
        printf("{\"dir\":");
        tsr_json_str(stdout, path);
        printf(",\"repair\":[");
    }
    int rrc = tsr_ckpt_repair(path, &opts, &st, &e);
    if (json) {
        close_file(&o);
        printf("],\"repair_error\":");
        if (rrc) tsr_json_str(stdout, e.msg);
        else printf("null");
    } else if (rrc && rrc != TSR_ECORRUPT) {
        fprintf(stderr, "tessera ckpt verify: %s\n", e.msg); /* lost frames are said per file */
    }
    /* the whole checkpoint, as ckpt verify checks it, unless the repair could
     * not run (not a local checkpoint, its folder locked, a write failing) */
    int ran = !rrc || rrc == TSR_ECORRUPT;
    tsr_error oe = {0};
    tsr_ckpt *ck = ran ? tsr_ckpt_open(path, &oe) : NULL;
    long n = -1;
    if (json) printf(",\"problems\":[");
    if (ck) n = tsr_ckpt_verify(ck, on_problem, &o, (int)threads, &e);
    if (json) {
        printf("],\"ok\":%s,\"manifest_repaired\":%s,\"files_repaired\":%llu,\"frames_repaired\":%llu,\"frames_lost\":%llu}\n",
               !rrc && n == 0 ? "true" : "false", st.manifest_repaired ? "true" : "false",
               (unsigned long long)st.files_repaired,
               (unsigned long long)st.frames_repaired, (unsigned long long)st.frames_lost);
    } else if (!ran) {
        /* the reason is said above */
    } else if (n < 0) {
        /* a MANIFEST that no source replaced: the repair's error says so */
        fprintf(stderr, "tessera ckpt verify: %s\n", ck ? e.msg : rrc ? e.msg : oe.msg);
    } else if (n == 0 && !rrc) {
        printf("ok: %s: %zu frames checked; %llu data file%s repaired (%llu frame%s)\n", path, tsr_ckpt_n_frames(ck),
               (unsigned long long)st.files_repaired, st.files_repaired == 1 ? "" : "s",
               (unsigned long long)st.frames_repaired, st.frames_repaired == 1 ? "" : "s");
    } else {
        fprintf(stderr, "%ld problem(s) in %s%s\n", n, path, rrc ? " after the repair" : "");
    }
    tsr_ckpt_close(ck);
    rc = !rrc && n == 0 ? EXIT_OK : EXIT_FAIL;
out:
    for (size_t i = 0; i < n_src; i++) free(srcs[i]);
    free(srcs);
    return rc;
}
