/* cmd_reshard.c: tessera reshard: a checkpoint rewritten for another layout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "cli.h"
#include "commands.h"
#include "tessera.h"

static const char USAGE[] =
    "usage: tessera reshard SRC DST --layout L [--only model] [--dtype bf16|f16|f32]\n"
    "                       [--codec auto|raw|zstd|bytegroup] [--level N] [--threads N]\n"
    "                       [--piece SIZE] [--force] [--json]\n"
    "Rewrites the committed checkpoint SRC (or the newest one under a root) into DST\n"
    "for layout L (\"pp=2,dp_shard=4,tp=2\", \"dp_shard=1\" for one consolidated set):\n"
    "one data file per rank of L holding exactly what that rank loads, so that a job\n"
    "in layout L loads it with no resharding. Reads only the frames it needs.\n"
    "  --only model   keep the model tensors (drop optimizer and other groups)\n"
    "  --dtype T      store every floating tensor as T (exact where T holds the value)\n"
    "  --codec, --level  the target's frame codec and zstd level (default auto, 1)\n"
    "  --threads N    cores to use (default: the online cores); up to 2N data files\n"
    "                 are written at once, fewer share the cores' encoding\n"
    "  --piece SIZE   the most raw bytes read and written at a time (default 16M)\n"
    "  --force        write L even when more than half of its ranks would hold no\n"
    "                 data (refused otherwise: each rank gets a data file, so a\n"
    "                 layout far wider than the checkpoint writes mostly empty files)\n"
    "Memory: about W x (2 x SIZE + 40 MiB of frame buffers) for W files written at\n"
    "once (W <= 2N), whatever the checkpoint's size (16 MiB pieces, 2 cores: under\n"
    "300 MiB).\n"
    "DST has one writer: a step of a root (DST named step-N) is written in place\n"
    "under the root's lock; any other DST is written as .DST.tmp-PID-N beside it\n"
    "and renamed to DST once committed, so that it appears complete or not at all,\n"
    "and of two runs into one new DST one fails, naming it. A failed reshard\n"
    "removes what it wrote; a killed one leaves that folder (or an uncommitted step).\n";

static void on_progress(void *user, uint64_t done, uint64_t total) {
    tsr_progress *p = user;
    p->total = total;
    tsr_progress_add(p, done - p->done);
}

int tsr_cmd_reshard(int argc, char **argv) {
    const char *src = NULL, *dst = NULL, *layout = NULL, *v;
    tsr_reshard_opts o = tsr_reshard_opts_default();
    int json = 0;
    for (int i = 1; i < argc; i++) {
        int r;
        uint64_t n;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return fputs(USAGE, stdout), EXIT_OK;
        if ((r = tsr_opt(argc, argv, &i, "layout", 1, &v))) {
            if (r < 0) return EXIT_USAGE;
            layout = v;
        } else if ((r = tsr_opt(argc, argv, &i, "only", 1, &v))) {
            if (r < 0 || strcmp(v, "model")) return tsr_usage_error("reshard", "--only takes model");
            o.model_only = 1;
        } else if ((r = tsr_opt(argc, argv, &i, "dtype", 1, &v))) {
            if (r < 0 || !(o.dtype = tsr_dtype_parse(v)) || !tsr_dtype_is_float(o.dtype))
                return tsr_usage_error("reshard", "--dtype takes a floating type: bf16, f16, f32, f64");
        } else if ((r = tsr_opt(argc, argv, &i, "codec", 1, &v))) {
            if (r < 0 || tsr_parse_codec(v, &o.write.codec))
                return tsr_usage_error("reshard", "--codec is auto, raw, zstd or bytegroup");
        } else if ((r = tsr_opt(argc, argv, &i, "level", 1, &v))) {
            if (r < 0 || tsr_parse_u64(v, &n) || n < 1 || n > 19)
                return tsr_usage_error("reshard", "--level takes 1 to 19");
            o.write.level = (int)n;
        } else if ((r = tsr_opt(argc, argv, &i, "threads", 1, &v))) {
            if (r < 0 || tsr_parse_u64(v, &n) || n > 1024)
                return tsr_usage_error("reshard", "--threads takes a number up to 1024");
            o.threads = (int)n;
        } else if ((r = tsr_opt(argc, argv, &i, "piece", 1, &v))) {
            if (r < 0 || tsr_parse_size(v, &n) || n < 4096 || n > (1ull << 32))
                return tsr_usage_error("reshard", "--piece takes a size from 4k to 4G");
            o.piece_bytes = (size_t)n;
        } else if (tsr_opt(argc, argv, &i, "force", 0, &v)) {
            o.force = 1;
        } else if (tsr_opt(argc, argv, &i, "json", 0, &v)) {
            json = 1;
        } else if (argv[i][0] == '-') {
            return tsr_usage_error("reshard", "unknown option %s (see --help)", argv[i]);
        } else if (!src) {
            src = argv[i];
        } else if (!dst) {
            dst = argv[i];
        } else {
            return tsr_usage_error("reshard", "SRC and DST only (see --help)");
        }
    }
    if (!src || !dst || !layout) return tsr_usage_error("reshard", "needs SRC, DST and --layout L (see --help)");
    tsr_error e = {0};
    if (tsr_layout_parse(layout, &o.layout, &e)) return tsr_usage_error("reshard", "--layout: %s", e.msg);
    char from[4096];
    tsr_resolve_ckpt_dir("reshard", src, from, sizeof from);
    tsr_progress pr;
    tsr_progress_start(&pr, "reshard", 0);
    o.progress = on_progress;
    o.user = &pr;
    double t0 = tsr_now();
    int rc = tsr_reshard(from, dst, &o, &e);
    tsr_progress_end(&pr);
    if (rc) {
        fprintf(stderr, "tessera reshard: %s\n", e.msg);
        return EXIT_FAIL;
    }
    char lt[128], sz[32];
    tsr_layout_format(&o.layout, lt, sizeof lt);
    if (json) {
        printf("{\"src\":");
        tsr_json_str(stdout, from);
        printf(",\"dst\":");
        tsr_json_str(stdout, dst);
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        printf(",\"layout\":\"%s\",\"bytes\":%llu,\"seconds\":%.3f,\"peak_rss_bytes\":%llu}\n", lt,
               (unsigned long long)pr.done, tsr_now() - t0, (unsigned long long)ru.ru_maxrss * 1024);
    } else {
        printf("resharded %s into %s for %s: %s in %.2f s\n", from, dst, lt, tsr_fmt_bytes(pr.done, sz, sizeof sz),
               tsr_now() - t0);
    }
    return EXIT_OK;
}
