/* cmd_ckpt.c: tessera ckpt ls | info | verify | diff | synth | compact | fence. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "casts.h"
#include "cli.h"
#include "commands.h"
#include "compact.h"
#include "tessera.h"

#define SLAB_BYTES (64u << 20) /* memory bound for walking a tensor */

static int wants_help(int argc, char **argv, const char *text) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(text, stdout);
            return 1;
        }
    return 0;
}

/* ------------------------------------------------------ step directories */

/* A checkpoint directory, or a root whose newest committed step is taken. */
static tsr_ckpt *open_ckpt(const char *cmd, const char *dir) {
    tsr_error e = {0};
    char path[PATH_MAX];
    tsr_resolve_ckpt_dir(cmd, dir, path, sizeof path);
    tsr_ckpt *ck = tsr_ckpt_open(path, &e);
    if (!ck) fprintf(stderr, "tessera %s: %s\n", cmd, e.msg);
    return ck;
}

static void totals(tsr_ckpt *ck, uint64_t *raw, uint64_t *stored) {
    *raw = *stored = 0;
    for (size_t i = 0; i < tsr_ckpt_n_tensors(ck); i++) {
        tsr_tensor_info t;
        tsr_ckpt_tensor(ck, i, &t);
        *raw += t.raw_bytes;
        *stored += t.stored_bytes;
    }
    for (size_t i = 0; i < tsr_ckpt_n_blobs(ck); i++) {
        tsr_blob_info b;
        tsr_ckpt_blob(ck, i, &b);
        *raw += b.size;
        for (uint32_t k = 0; k < b.n_frames; k++) {
            tsr_frame_info f;
            tsr_ckpt_frame(ck, b.first_frame + k, &f);
            *stored += f.stored_size;
        }
    }
}

/* ------------------------------------------------------------------- ls */

/* The tensors of ck that hold non-finite elements (FORMAT.md 4.5). */
static size_t n_poisoned_tensors(tsr_ckpt *ck) {
    size_t n = 0;
    for (size_t i = 0; i < tsr_ckpt_n_tensors(ck); i++) {
        tsr_stats st;
        n += tsr_ckpt_tensor_stats(ck, i, &st) == 1 && st.nonfinite;
    }
    return n;
}

static const char ls_help[] =
    "usage: tessera ckpt ls ROOT [--json]\n"
    "Lists the step directories under ROOT: step, status (committed, uncommitted: no\n"
    "MANIFEST, damaged: a MANIFEST that does not validate, abandoned: moved aside\n"
    "as step-N.abandoned-TIME when a job rewound to an earlier step; its directory\n"
    "is named at the end of the line), tensor count, raw and stored bytes. A\n"
    "poisoned checkpoint (a NaN or an infinity in its state, FORMAT.md 4.5; no\n"
    "resume, rollback or recovery chooses it) says so at the end of its line\n"
    "(\"poisoned\": true in --json). A step whose MANIFEST a fenced writer (of an\n"
    "older launch) committed after its fence is \"fenced\": not a valid commit\n"
    "(FORMAT.md 4.6; tessera ckpt fence), with the reason at the end of its line.\n";

int tsr_cmd_ckpt_ls(int argc, char **argv) {
    if (wants_help(argc, argv, ls_help)) return EXIT_OK;
    const char *root = NULL, *v;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = tsr_opt(argc, argv, &i, "json", 0, &v))) {
            if (r < 0) return EXIT_USAGE;
            json = 1;
        } else if (argv[i][0] == '-') return tsr_usage_error("ckpt ls", "unknown option %s", argv[i]);
        else if (!root) root = argv[i];
        else return tsr_usage_error("ckpt ls", "one ROOT only");
    }
    if (!root) return tsr_usage_error("ckpt ls", "missing ROOT");
    tsr_step_info *steps = NULL;
    size_t count = 0;
    long n = tsr_list_steps(root, &steps, &count) ? -1 : (long)count;
    if (n < 0) {
        fprintf(stderr, "tessera ckpt ls: %s: cannot read the directory\n", root);
        return EXIT_FAIL;
    }
    /* the abandoned steps, each after the regular step of the same number */
    tsr_step_info *ab = NULL;
    size_t n_ab = 0;
    if (tsr_list_abandoned_steps(root, &ab, &n_ab) == 0 && n_ab) {
        tsr_step_info *all = malloc((count + n_ab) * sizeof *all);
        if (!all) {
            fprintf(stderr, "tessera ckpt ls: out of memory\n");
            free(steps), free(ab);
            return EXIT_FAIL;
        }
        size_t a = 0, b = 0, k = 0;
        while (a < count || b < n_ab)
            if (b == n_ab || (a < count && steps[a].step <= ab[b].step)) all[k++] = steps[a++];
            else all[k] = ab[b++], all[k++].committed = -1; /* -1: abandoned */
        free(steps);
        steps = all;
        n = (long)k;
    }
    free(ab);
    if (json) printf("[");
    else printf("%-14s %-12s %8s %12s %12s %6s\n", "STEP", "STATUS", "TENSORS", "RAW", "STORED", "RATIO");
    for (long i = 0; i < n; i++) {
        char path[PATH_MAX], a[32], b[32];
        snprintf(path, sizeof path, "%s/%s", root, steps[i].name);
        int abandoned = steps[i].committed < 0;
        const char *status = abandoned ? "abandoned" : "uncommitted";
        tsr_error e = {0};
        tsr_ckpt *ck = NULL;
        uint64_t raw = 0, stored = 0;
        size_t nt = 0;
        if (tsr_ckpt_is_committed(path)) {
            ck = tsr_ckpt_open(path, &e);
            if (!abandoned) status = ck ? "committed" : steps[i].fenced ? "fenced" : "damaged";
        }
        if (ck) {
            totals(ck, &raw, &stored);
            nt = tsr_ckpt_n_tensors(ck);
        }
        if (json) {
            printf("%s{\"dir\":", i ? "," : "");
            tsr_json_str(stdout, steps[i].name);
            printf(",\"step\":%llu,\"status\":\"%s\"", (unsigned long long)steps[i].step, status);
            if (ck)
                printf(",\"tensors\":%zu,\"raw_bytes\":%llu,\"stored_bytes\":%llu,\"poisoned\":%s", nt,
                       (unsigned long long)raw, (unsigned long long)stored, tsr_ckpt_poisoned(ck) ? "true" : "false");
            if (!ck && e.msg[0]) {
                printf(",\"error\":");
                tsr_json_str(stdout, e.msg);
            }
            printf("}");
        } else if (ck) {
            char poison[64] = "";
            if (tsr_ckpt_poisoned(ck))
                snprintf(poison, sizeof poison, "  poisoned (%zu tensors hold NaN or Inf)", n_poisoned_tensors(ck));
            printf("%-14llu %-12s %8zu %12s %12s %6.3f%s%s%s\n", (unsigned long long)steps[i].step, status, nt,
                   tsr_fmt_bytes(raw, a, sizeof a), tsr_fmt_bytes(stored, b, sizeof b),
                   stored ? (double)raw / (double)stored : 1.0, abandoned ? "  " : "", abandoned ? steps[i].name : "",
                   poison);
        } else {
            printf("%-14llu %-12s %8s %12s %12s %6s%s%s%s%s\n", (unsigned long long)steps[i].step, status, "-", "-",
                   "-", "-", abandoned ? "  " : "", abandoned ? steps[i].name : "", e.msg[0] ? "  " : "", e.msg);
        }
        tsr_ckpt_close(ck);
    }
    if (json) printf("]\n");
    free(steps);
    return EXIT_OK;
}

/* ----------------------------------------------------------------- info */

static const char info_help[] =
    "usage: tessera ckpt info DIR [--json] [--frames]\n"
    "Shows the MANIFEST of the checkpoint in DIR (or of the newest one under a root):\n"
    "header, layout, data files, tensors with their placement, chunks and digest\n"
    "(FORMAT.md 4.4; '-' where the MANIFEST records none, as before format 1.2), their\n"
    "statistics (4.5: min and max of the finite values, L2 norm, count of NaN and\n"
    "infinities; '-' where none are recorded: integer tensors, files before 1.3),\n"
    "whether the checkpoint is poisoned (a non-finite value in a tensor), blobs.\n"
    "--frames also lists every frame; --json prints all of it, frames included.\n";

static void print_box(FILE *f, const tsr_box *b) {
    fputc('[', f);
    for (uint32_t d = 0; d < b->ndim; d++)
        fprintf(f, "%s%llu:%llu", d ? ", " : "", (unsigned long long)b->offset[d],
                (unsigned long long)(b->offset[d] + b->extent[d]));
    fputc(']', f);
}

static void placement_str(const tsr_placement *p, char *buf, size_t len) {
    char tp[16], pp[32];
    if (p->tp_dim < 0) snprintf(tp, sizeof tp, "tp:rep");
    else snprintf(tp, sizeof tp, "tp:dim%d", p->tp_dim);
    switch (p->pp_role) {
    case TSR_PP_FIRST: snprintf(pp, sizeof pp, "pp:first"); break;
    case TSR_PP_LAST: snprintf(pp, sizeof pp, "pp:last"); break;
    case TSR_PP_LAYER: snprintf(pp, sizeof pp, "pp:layer%d", p->layer); break;
    default: snprintf(pp, sizeof pp, "pp:all"); break;
    }
    snprintf(buf, len, "%s,%s,%s", tp, p->fsdp ? "fsdp" : "fsdp:rep", pp);
}

/* "key":x then sep; null for a value JSON cannot hold (an infinity: no finite element). */
static void json_f64(FILE *f, const char *key, double x, const char *sep) {
    if (isfinite(x)) fprintf(f, "\"%s\":%.17g%s", key, x, sep);
    else fprintf(f, "\"%s\":null%s", key, sep);
}

static void info_json(tsr_ckpt *ck) {
    tsr_layout l = tsr_ckpt_layout(ck);
    const uint8_t *id = tsr_ckpt_save_id(ck);
    uint32_t ver = tsr_ckpt_version(ck);
    printf("{\"dir\":");
    tsr_json_str(stdout, tsr_ckpt_dir(ck));
    printf(",\"version\":\"%u.%u\",\"step\":%llu,\"epoch\":%llu,\"save_id\":\"", ver >> 16, ver & 0xffff,
           (unsigned long long)tsr_ckpt_step(ck), (unsigned long long)tsr_ckpt_epoch(ck));
    for (int i = 0; i < 16; i++) printf("%02x", id[i]);
    printf("\",\"layout\":{\"pp\":%u,\"dp_replicate\":%u,\"dp_shard\":%u,\"tp\":%u,\"n_layers\":%u,\"flat\":%s}",
           l.pp, l.dp_replicate, l.dp_shard, l.tp, l.n_layers, l.flags & TSR_LAYOUT_FLAT ? "true" : "false");
    printf(",\"poisoned\":%s,\"files\":[", tsr_ckpt_poisoned(ck) ? "true" : "false");
    for (size_t i = 0; i < tsr_ckpt_n_files(ck); i++) {
        tsr_file_info f;
        tsr_ckpt_file(ck, i, &f);
        printf("%s{\"file_id\":%u,\"size\":%llu}", i ? "," : "", f.file_id, (unsigned long long)f.size);
    }
    printf("],\"tensors\":[");
    for (size_t i = 0; i < tsr_ckpt_n_tensors(ck); i++) {
        tsr_tensor_info t;
        tsr_ckpt_tensor(ck, i, &t);
        printf("%s{\"name\":", i ? "," : "");
        tsr_json_str(stdout, t.name);
        printf(",\"group\":");
        tsr_json_str(stdout, t.group);
        printf(",\"dtype\":\"%s\",\"shape\":[", tsr_dtype_name(t.dtype));
        for (uint32_t d = 0; d < t.ndim; d++) printf("%s%llu", d ? "," : "", (unsigned long long)t.shape[d]);
        printf("],\"placement\":{\"tp_dim\":%d,\"fsdp\":%u,\"pp_role\":%u,\"layer\":%d}", t.placement.tp_dim,
               t.placement.fsdp, t.placement.pp_role, t.placement.layer);
        uint64_t digest;
        if (tsr_ckpt_tensor_digest(ck, i, &digest) == 1) printf(",\"digest\":\"%016llx\"", (unsigned long long)digest);
        else printf(",\"digest\":null");
        tsr_stats st;
        if (tsr_ckpt_tensor_stats(ck, i, &st) == 1) {
            printf(",\"stats\":{");
            json_f64(stdout, "min", st.min, ","), json_f64(stdout, "max", st.max, ","), json_f64(stdout, "l2", st.l2, ",");
            printf("\"nonfinite\":%llu}", (unsigned long long)st.nonfinite);
        } else printf(",\"stats\":null");
        printf(",\"raw_bytes\":%llu,\"stored_bytes\":%llu,\"chunks\":[", (unsigned long long)t.raw_bytes,
               (unsigned long long)t.stored_bytes);
        long first = -1;
        for (size_t c = 0; c < tsr_ckpt_n_chunks(ck); c++) {
            tsr_chunk_info ci;
            tsr_ckpt_chunk(ck, c, &ci);
            if (ci.tensor != i) continue;
            printf("%s{\"file_id\":%u,\"offset\":[", first >= 0 ? "," : "", ci.file_id);
            first = (long)c;
            for (uint32_t d = 0; d < ci.box.ndim; d++) printf("%s%llu", d ? "," : "", (unsigned long long)ci.box.offset[d]);
            printf("],\"extent\":[");
            for (uint32_t d = 0; d < ci.box.ndim; d++) printf("%s%llu", d ? "," : "", (unsigned long long)ci.box.extent[d]);
            printf("],\"split_dim\":%u,\"frame_rows\":%llu,\"frames\":[", ci.split_dim, (unsigned long long)ci.frame_rows);
            for (uint32_t k = 0; k < ci.n_frames; k++) {
                tsr_frame_info f;
                tsr_ckpt_frame(ck, ci.first_frame + k, &f);
                printf("%s{\"offset\":%llu,\"stored_size\":%llu,\"raw_size\":%llu,\"codec\":\"%s\","
                       "\"raw_hash\":\"%016llx\",\"stored_hash\":\"%016llx\"}",
                       k ? "," : "", (unsigned long long)f.offset, (unsigned long long)f.stored_size,
                       (unsigned long long)f.raw_size, f.codec == 0 ? "raw" : f.codec == 1 ? "zstd" : "bytegroup",
                       (unsigned long long)f.raw_hash, (unsigned long long)f.stored_hash);
            }
            printf("]}");
        }
        printf("]}");
    }
    printf("],\"blobs\":[");
    for (size_t i = 0; i < tsr_ckpt_n_blobs(ck); i++) {
        tsr_blob_info b;
        tsr_ckpt_blob(ck, i, &b);
        printf("%s{\"name\":", i ? "," : "");
        tsr_json_str(stdout, b.name);
        printf(",\"rank\":%d,\"size\":%llu,\"file_id\":%u,\"frames\":%u}", b.rank, (unsigned long long)b.size,
               b.file_id, b.n_frames);
    }
    printf("]}\n");
}

int tsr_cmd_ckpt_info(int argc, char **argv) {
    if (wants_help(argc, argv, info_help)) return EXIT_OK;
    const char *dir = NULL, *v;
    int json = 0, frames = 0;
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = tsr_opt(argc, argv, &i, "json", 0, &v))) json = 1;
        else if ((r = tsr_opt(argc, argv, &i, "frames", 0, &v))) frames = 1;
        else if (argv[i][0] == '-') return tsr_usage_error("ckpt info", "unknown option %s", argv[i]);
        else if (!dir) dir = argv[i];
        else return tsr_usage_error("ckpt info", "one DIR only");
    }
    if (!dir) return tsr_usage_error("ckpt info", "missing DIR");
    tsr_ckpt *ck = open_ckpt("ckpt info", dir);
    if (!ck) return EXIT_FAIL;
    if (json) {
        info_json(ck);
        tsr_ckpt_close(ck);
        return EXIT_OK;
    }
    char a[32], b[32];
    uint64_t raw, stored;
    totals(ck, &raw, &stored);
    tsr_layout l = tsr_ckpt_layout(ck);
    uint32_t ver = tsr_ckpt_version(ck);
    const uint8_t *id = tsr_ckpt_save_id(ck);
    printf("checkpoint  %s\nformat      %u.%u\nstep        %llu\nepoch       %llu\nsave id     ", tsr_ckpt_dir(ck),
           ver >> 16, ver & 0xffff, (unsigned long long)tsr_ckpt_step(ck), (unsigned long long)tsr_ckpt_epoch(ck));
    for (int i = 0; i < 16; i++) printf("%02x", id[i]);
    printf("\nlayout      pp=%u,dp_replicate=%u,dp_shard=%u,tp=%u layers=%u%s\n", l.pp, l.dp_replicate,
           l.dp_shard, l.tp, l.n_layers, l.flags & TSR_LAYOUT_FLAT ? " flat" : "");
    printf("size        %s raw, %s stored (ratio %.3f)\n", tsr_fmt_bytes(raw, a, sizeof a),
           tsr_fmt_bytes(stored, b, sizeof b), stored ? (double)raw / (double)stored : 1.0);
    if (tsr_ckpt_poisoned(ck))
        printf("poisoned    yes: %zu tensor(s) hold NaN or Inf (no resume, rollback or recovery chooses it)\n",
               n_poisoned_tensors(ck));
    printf("files       %zu:", tsr_ckpt_n_files(ck));
    for (size_t i = 0; i < tsr_ckpt_n_files(ck); i++) {
        tsr_file_info f;
        tsr_ckpt_file(ck, i, &f);
        printf(" data-%05u.tsd (%s)", f.file_id, tsr_fmt_bytes(f.size, a, sizeof a));
    }
    printf("\n\n%-40s %-6s %-6s %-20s %-26s %6s %11s %11s  %-16s\n", "TENSOR", "GROUP", "DTYPE", "SHAPE", "PLACEMENT",
           "CHUNKS", "RAW", "STORED", "DIGEST");
    for (size_t i = 0; i < tsr_ckpt_n_tensors(ck); i++) {
        tsr_tensor_info t;
        tsr_ckpt_tensor(ck, i, &t);
        char shape[128] = "[", pl[64];
        size_t off = 1;
        for (uint32_t d = 0; d < t.ndim && off < sizeof shape - 24; d++)
            off += (size_t)snprintf(shape + off, sizeof shape - off, "%s%llu", d ? "," : "", (unsigned long long)t.shape[d]);
        snprintf(shape + off, sizeof shape - off, "]");
        placement_str(&t.placement, pl, sizeof pl);
        uint64_t digest;
        char dg[20] = "-";
        if (tsr_ckpt_tensor_digest(ck, i, &digest) == 1) snprintf(dg, sizeof dg, "%016llx", (unsigned long long)digest);
        printf("%-40s %-6s %-6s %-20s %-26s %6u %11s %11s  %s\n", t.name, t.group, tsr_dtype_name(t.dtype), shape, pl,
               t.n_chunks, tsr_fmt_bytes(t.raw_bytes, a, sizeof a), tsr_fmt_bytes(t.stored_bytes, b, sizeof b), dg);
    }
    printf("\n%-40s %14s %14s %14s %10s\n", "STATISTICS OF", "MIN", "MAX", "L2", "NONFINITE");
    for (size_t i = 0; i < tsr_ckpt_n_tensors(ck); i++) {
        tsr_tensor_info t;
        tsr_stats st;
        tsr_ckpt_tensor(ck, i, &t);
        if (tsr_ckpt_tensor_stats(ck, i, &st) == 1)
            printf("%-40s %14.7g %14.7g %14.7g %10llu\n", t.name, st.min, st.max, st.l2,
                   (unsigned long long)st.nonfinite);
        else printf("%-40s %14s %14s %14s %10s\n", t.name, "-", "-", "-", "-");
    }
    printf("\n%-40s %-10s %-40s %7s\n", "CHUNK OF", "FILE", "BOX", "FRAMES");
    for (size_t c = 0; c < tsr_ckpt_n_chunks(ck); c++) {
        tsr_chunk_info ci;
        tsr_tensor_info t;
        tsr_ckpt_chunk(ck, c, &ci);
        tsr_ckpt_tensor(ck, ci.tensor, &t);
        printf("%-40s data-%05u ", t.name, ci.file_id);
        print_box(stdout, &ci.box);
        printf("  %u (split dim %u, %llu rows each)\n", ci.n_frames, ci.split_dim, (unsigned long long)ci.frame_rows);
        for (uint32_t k = 0; frames && k < ci.n_frames; k++) {
            tsr_frame_info f;
            tsr_ckpt_frame(ck, ci.first_frame + k, &f);
            printf("    frame %-6u offset %-12llu stored %-10llu raw %-10llu %-9s raw %016llx stored %016llx\n",
                   ci.first_frame + k, (unsigned long long)f.offset, (unsigned long long)f.stored_size,
                   (unsigned long long)f.raw_size, f.codec == 0 ? "raw" : f.codec == 1 ? "zstd" : "bytegroup",
                   (unsigned long long)f.raw_hash, (unsigned long long)f.stored_hash);
        }
    }
    if (tsr_ckpt_n_blobs(ck)) {
        printf("\n%-40s %6s %11s %s\n", "BLOB", "RANK", "SIZE", "FILE");
        for (size_t i = 0; i < tsr_ckpt_n_blobs(ck); i++) {
            tsr_blob_info bl;
            tsr_ckpt_blob(ck, i, &bl);
            char rank[16];
            if (bl.rank < 0) snprintf(rank, sizeof rank, "global");
            else snprintf(rank, sizeof rank, "%d", bl.rank);
            printf("%-40s %6s %11s data-%05u\n", bl.name, rank, tsr_fmt_bytes(bl.size, a, sizeof a), bl.file_id);
        }
    }
    tsr_ckpt_close(ck);
    return EXIT_OK;
}

/* --------------------------------------------------------------- verify */

static const char verify_help[] =
    "usage: tessera ckpt verify DIR [--threads N] [--json]\n"
    "       tessera ckpt verify --repair DIR [--from SOURCE ...] [--threads N] [--json]\n"
    "Checks the checkpoint in DIR (or the newest under a root) against every rule of\n"
    "the format: the MANIFEST's structure and checksum, each data file's size and\n"
    "header, every frame's checksums and decoding, every padding byte. Prints one line\n"
    "per problem, naming file, tensor and frame. Exit 0: sound; 1: problems found.\n"
    "\n"
    "--repair rewrites each damaged data file of DIR (a local folder: missing, of\n"
    "another size, a bad header or padding, frames that fail their checks), then\n"
    "verifies the whole checkpoint. A damaged frame is taken from the first SOURCE\n"
    "(--from, in order; a checkpoint folder such as an older step, a local-tier\n"
    "snapshot or a partner copy, or an archive s3://bucket/prefix/step-N; a root\n"
    "stands for its committed steps, newest first) that holds a frame of the same raw\n"
    "checksum and raw size whose bytes pass the source's checks and, stored as DIR's\n"
    "MANIFEST records it (the source's stored bytes, or its raw bytes stored anew\n"
    "with the recorded codec), DIR's own. A MANIFEST that fails its own checks is\n"
    "first replaced by the first SOURCE's that records the sizes of DIR's data files\n"
    "and whose save id they carry (the damaged one kept as MANIFEST.damaged);\n"
    "otherwise the MANIFEST never changes. Each repaired\n"
    "file is written beside the old one (data-N.tsd.repair), synced, read back and\n"
    "checked whole, then renamed into place; the damaged file is kept as\n"
    "data-N.tsd.damaged (readers ignore it; remove it by hand). Prints per damaged\n"
    "file its frames damaged, repaired (and from where) and lost. A file with a frame\n"
    "that no source holds is left exactly as it is, with an error naming the file,\n"
    "the tensors or blobs and the frames lost. Holds the lock of DIR's folder.\n"
    "Exit 0: sound or repaired, and verified; 1: frames lost or problems left.\n";

typedef struct verify_out {
    int json;
    long n;
} verify_out;

static void on_problem(void *user, const char *msg) {
    verify_out *o = user;
    if (o->json) {
        printf("%s", o->n ? "," : "");
        tsr_json_str(stdout, msg);
    } else {
        printf("%s\n", msg);
    }
    o->n++;
}

/* The arguments of verify and compact: DIR [--threads N] [--json].
 * @return 0, or the usage error's exit status. */
static int dir_args(const char *cmd, int argc, char **argv, const char **dir, int *json, uint64_t *threads) {
    const char *v;
    *dir = NULL, *json = 0, *threads = 0;
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = tsr_opt(argc, argv, &i, "json", 0, &v))) *json = 1;
        else if ((r = tsr_opt(argc, argv, &i, "threads", 1, &v))) {
            if (r < 0 || tsr_parse_u64(v, threads) || *threads > 1024)
                return tsr_usage_error(cmd, "--threads takes a number up to 1024");
        } else if (argv[i][0] == '-') return tsr_usage_error(cmd, "unknown option %s", argv[i]);
        else if (!*dir) *dir = argv[i];
        else return tsr_usage_error(cmd, "one DIR only");
    }
    return *dir ? 0 : tsr_usage_error(cmd, "missing DIR");
}

int tsr_cmd_ckpt_verify(int argc, char **argv) {
    if (wants_help(argc, argv, verify_help)) return EXIT_OK;
    for (int i = 1; i < argc; i++) /* --repair [--from SOURCE ...]: cmd_repair.c */
        if (!strcmp(argv[i], "--repair") || !strncmp(argv[i], "--from", 6)) return tsr_cmd_ckpt_repair(argc, argv);
    const char *dir;
    int json, u;
    uint64_t threads;
    if ((u = dir_args("ckpt verify", argc, argv, &dir, &json, &threads))) return u;
    tsr_error e = {0};
    tsr_ckpt *ck = open_ckpt("ckpt verify", dir);
    if (!ck) {
        if (json) printf("{\"ok\":false,\"problems\":[\"cannot open the MANIFEST\"]}\n");
        return EXIT_FAIL;
    }
    verify_out o = {json, 0};
    if (json) {
        printf("{\"dir\":");
        tsr_json_str(stdout, tsr_ckpt_dir(ck));
        printf(",\"problems\":[");
    }
    long n = tsr_ckpt_verify(ck, on_problem, &o, (int)threads, &e);
    uint64_t raw, stored;
    totals(ck, &raw, &stored);
    if (json) printf("],\"ok\":%s,\"frames\":%zu,\"stored_bytes\":%llu}\n", n == 0 ? "true" : "false",
                     tsr_ckpt_n_frames(ck), (unsigned long long)stored);
    else if (n < 0) fprintf(stderr, "tessera ckpt verify: %s\n", e.msg);
    else if (n == 0) {
        char a[32];
        printf("ok: %s: %zu tensors, %zu blobs, %zu frames, %s checked\n", tsr_ckpt_dir(ck), tsr_ckpt_n_tensors(ck),
               tsr_ckpt_n_blobs(ck), tsr_ckpt_n_frames(ck), tsr_fmt_bytes(stored, a, sizeof a));
    } else {
        fprintf(stderr, "%ld problem(s) in %s\n", n, tsr_ckpt_dir(ck));
    }
    tsr_ckpt_close(ck);
    return n == 0 ? EXIT_OK : EXIT_FAIL;
}

/* ----------------------------------------------------------------- diff */

static const char diff_help[] =
    "usage: tessera ckpt diff A B [--json]\n"
    "Compares two checkpoints tensor by tensor (and blob by blob): tensors only in one,\n"
    "of different dtype or shape, or with different values, with the largest absolute\n"
    "difference, the count of elements that differ bitwise and the relative change\n"
    "||B-A|| / ||A|| (over the elements finite in both), the tensor that moved most\n"
    "first. Then a table of every tensor both hold alike, sorted the same way: its\n"
    "relative change from the values, and from the statistics (FORMAT.md 4.5: the L2\n"
    "norms A and B recorded, |l2(B) - l2(A)| / l2(A); '-' where one records none), so\n"
    "that the layer that moved most between two steps comes first. --json: that\n"
    "table as \"tensors\", the lines as \"differences\". Reads in bounded memory.\n"
    "Exit 0: no difference; 1: differences (or an error).\n";

/* What diff finds of a tensor both checkpoints hold alike. */
typedef struct tensor_diff {
    const char *name; /* A's */
    uint64_t ndiff;   /* elements that differ bitwise */
    double maxdiff;   /* the largest absolute difference (inf: a NaN on one side only) */
    double d2, a2;    /* sums of (b-a)^2 and of a^2 over the elements finite in both */
    double rel;       /* sqrt(d2 / a2): ||B-A|| / ||A|| (inf when ||A|| = 0 < ||B-A||) */
    int stats;        /* both record statistics (FORMAT.md 4.5): */
    double l2a, l2b;  /* their L2 norms */
} tensor_diff;

/* The relative change of the norms: |l2b - l2a| / l2a. */
static double l2_change(const tensor_diff *d) {
    return d->l2a > 0 ? fabs(d->l2b - d->l2a) / d->l2a : d->l2b > 0 ? INFINITY : 0;
}

/* Largest relative change first (NaN as the largest), then by name. */
static int cmp_moved(const void *x, const void *y) {
    const tensor_diff *p = x, *q = y;
    double a = isnan(p->rel) ? INFINITY : p->rel, b = isnan(q->rel) ? INFINITY : q->rel;
    if (a != b) return a > b ? -1 : 1;
    return strcmp(p->name, q->name);
}

/* Compares tensor ta of a with tb of b (same dtype and shape) into *out. */
static int diff_tensor(tsr_ckpt *a, size_t ta, tsr_ckpt *b, size_t tb, tensor_diff *out, tsr_error *e) {
    tsr_tensor_info t;
    tsr_ckpt_tensor(a, ta, &t);
    size_t es = tsr_dtype_size(t.dtype);
    tsr_box whole = {.ndim = t.ndim};
    for (uint32_t d = 0; d < t.ndim; d++) whole.extent[d] = t.shape[d];
    size_t slab = t.raw_bytes < SLAB_BYTES ? (size_t)t.raw_bytes + es : SLAB_BYTES; /* a small tensor, small buffers */
    uint8_t *x = malloc(slab), *y = malloc(slab);
    int rc = (!x || !y) ? -1 : 0;
    double *maxdiff = &out->maxdiff;
    uint64_t *ndiff = &out->ndiff;
    *out = (tensor_diff){.name = t.name};
    tsr_stats sa, sb;
    if (tsr_ckpt_tensor_stats(a, ta, &sa) == 1 && tsr_ckpt_tensor_stats(b, tb, &sb) == 1)
        out->stats = 1, out->l2a = sa.l2, out->l2b = sb.l2;
    uint64_t n = rc ? 0 : tsr_box_pieces(&whole, es, slab);
    for (uint64_t k = 0; k < n && !rc; k++) {
        tsr_box piece;
        tsr_box_piece(&whole, es, slab, k, &piece);
        if ((rc = tsr_ckpt_read(a, ta, &piece, x, e)) || (rc = tsr_ckpt_read(b, tb, &piece, y, e))) break;
        uint64_t m = tsr_box_volume(&piece);
        for (uint64_t i = 0; i < m; i++) {
            double u = tsr_load_f64(t.dtype, x, i);
            int fu = isfinite(u);
            if (fu) out->a2 += u * u;
            if (memcmp(x + i * es, y + i * es, es) == 0) continue;
            (*ndiff)++;
            double w = tsr_load_f64(t.dtype, y, i);
            if (fu && isfinite(w)) out->d2 += (w - u) * (w - u);
            double d = isnan(u) || isnan(w) ? (isnan(u) && isnan(w) ? 0 : INFINITY) : fabs(u - w);
            if (d > *maxdiff || isnan(d)) *maxdiff = d;
        }
    }
    out->rel = out->a2 > 0 ? sqrt(out->d2 / out->a2) : out->d2 > 0 ? INFINITY : 0;
    free(x), free(y);
    return rc;
}

/* The table of tensors both hold alike, the one that moved most first. */
static void print_moved(const tensor_diff *v, size_t n, int json) {
    char l2[64];
    if (json) printf("],\"tensors\":[");
    else if (n) printf("\n%-40s %14s %14s %14s %14s %12s\n", "TENSOR (moved most first)", "||B-A||/||A||", "L2 A",
                       "L2 B", "L2 CHANGE", "DIFFER");
    for (size_t i = 0; i < n; i++) {
        const tensor_diff *d = &v[i];
        if (json) {
            printf("%s{\"name\":", i ? "," : "");
            tsr_json_str(stdout, d->name);
            printf(",\"elements_differ\":%llu,", (unsigned long long)d->ndiff);
            json_f64(stdout, "max_abs_diff", d->maxdiff, ","), json_f64(stdout, "rel_change", d->rel, ",");
            if (d->stats)
                json_f64(stdout, "l2_a", d->l2a, ","), json_f64(stdout, "l2_b", d->l2b, ","),
                    json_f64(stdout, "l2_rel_change", l2_change(d), "}");
            else printf("\"l2_a\":null,\"l2_b\":null,\"l2_rel_change\":null}");
            continue;
        }
        if (d->stats) snprintf(l2, sizeof l2, "%14.6g %14.6g %14.6g", d->l2a, d->l2b, l2_change(d));
        else snprintf(l2, sizeof l2, "%14s %14s %14s", "-", "-", "-");
        printf("%-40s %14.6g %s %12llu\n", d->name, d->rel, l2, (unsigned long long)d->ndiff);
    }
}

int tsr_cmd_ckpt_diff(int argc, char **argv) {
    if (wants_help(argc, argv, diff_help)) return EXIT_OK;
    const char *pa = NULL, *pb = NULL, *v;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (tsr_opt(argc, argv, &i, "json", 0, &v)) json = 1;
        else if (argv[i][0] == '-') return tsr_usage_error("ckpt diff", "unknown option %s", argv[i]);
        else if (!pa) pa = argv[i];
        else if (!pb) pb = argv[i];
        else return tsr_usage_error("ckpt diff", "two checkpoints only");
    }
    if (!pb) return tsr_usage_error("ckpt diff", "needs two checkpoints A B");
    tsr_ckpt *a = open_ckpt("ckpt diff", pa), *b = a ? open_ckpt("ckpt diff", pb) : NULL;
    if (!a || !b) {
        tsr_ckpt_close(a);
        return EXIT_FAIL;
    }
    long differences = 0;
    int failed = 0;
    size_t na = tsr_ckpt_n_tensors(a), nb = tsr_ckpt_n_tensors(b), nmoved = 0;
    tensor_diff *moved = malloc((na + 1) * sizeof *moved);
    if (!moved) {
        fprintf(stderr, "tessera ckpt diff: out of memory\n");
        tsr_ckpt_close(a), tsr_ckpt_close(b);
        return EXIT_FAIL;
    }
    if (json) printf("{\"differences\":[");
#define REPORT(...)                                                 \
    do {                                                            \
        char line_[1200];                                           \
        snprintf(line_, sizeof line_, __VA_ARGS__);                 \
        if (json) {                                                 \
            printf("%s", differences ? "," : "");                   \
            tsr_json_str(stdout, line_);                            \
        } else                                                      \
            printf("%s\n", line_);                                  \
        differences++;                                              \
    } while (0)
    /* Tensors: a merge walk over the two name-sorted lists. */
    size_t i = 0, j = 0;
    while (i < na || j < nb) {
        tsr_tensor_info x, y;
        if (i < na) tsr_ckpt_tensor(a, i, &x);
        if (j < nb) tsr_ckpt_tensor(b, j, &y);
        int c = i >= na ? 1 : j >= nb ? -1 : strcmp(x.name, y.name);
        if (c < 0) {
            REPORT("%s: only in A", x.name);
            i++;
            continue;
        }
        if (c > 0) {
            REPORT("%s: only in B", y.name);
            j++;
            continue;
        }
        if (x.dtype != y.dtype || x.ndim != y.ndim || memcmp(x.shape, y.shape, sizeof x.shape) != 0) {
            REPORT("%s: dtype or shape differs (%s vs %s)", x.name, tsr_dtype_name(x.dtype), tsr_dtype_name(y.dtype));
        } else {
            tsr_error e = {0};
            if (diff_tensor(a, i, b, j, &moved[nmoved++], &e)) {
                fprintf(stderr, "tessera ckpt diff: %s\n", e.msg[0] ? e.msg : "out of memory");
                failed = 1;
                break;
            }
        }
        i++, j++;
    }
    /* the values that differ, the tensor that moved most first */
    tsr_sort(moved, nmoved, sizeof *moved, cmp_moved);
    for (size_t k = 0; !failed && k < nmoved; k++)
        if (moved[k].ndiff)
            REPORT("%s: %llu elements differ, max abs difference %.9g, relative change %.6g", moved[k].name,
                   (unsigned long long)moved[k].ndiff, moved[k].maxdiff, moved[k].rel);
    /* Blobs. */
    for (size_t k = 0; !failed && k < tsr_ckpt_n_blobs(a); k++) {
        tsr_blob_info x, y;
        tsr_ckpt_blob(a, k, &x);
        long o = tsr_ckpt_find_blob(b, x.name, x.rank);
        if (o < 0) {
            REPORT("blob %s (rank %d): only in A", x.name, x.rank);
            continue;
        }
        tsr_ckpt_blob(b, (size_t)o, &y);
        uint8_t *p = malloc(x.size + 1), *q = malloc(y.size + 1);
        tsr_error e = {0};
        if (!p || !q || tsr_ckpt_read_blob(a, k, p, &e) || tsr_ckpt_read_blob(b, (size_t)o, q, &e)) {
            fprintf(stderr, "tessera ckpt diff: %s\n", e.msg[0] ? e.msg : "out of memory");
            failed = 1;
        } else if (x.size != y.size || memcmp(p, q, x.size) != 0)
            REPORT("blob %s (rank %d): contents differ", x.name, x.rank);
        free(p), free(q);
    }
    for (size_t k = 0; !failed && k < tsr_ckpt_n_blobs(b); k++) {
        tsr_blob_info y;
        tsr_ckpt_blob(b, k, &y);
        if (tsr_ckpt_find_blob(a, y.name, y.rank) < 0) REPORT("blob %s (rank %d): only in B", y.name, y.rank);
    }
    /* the table of every tensor's change: in JSON always, in text when values differ */
    int values_differ = 0;
    for (size_t k = 0; k < nmoved; k++) values_differ |= moved[k].ndiff != 0;
    if (!failed && (json || values_differ)) print_moved(moved, nmoved, json);
    else if (json) printf("],\"tensors\":[");
    free(moved);
    if (json) printf("],\"same\":%s}\n", differences || failed ? "false" : "true");
    else if (!differences && !failed) printf("no differences\n");
    tsr_ckpt_close(a);
    tsr_ckpt_close(b);
    return differences || failed ? EXIT_FAIL : EXIT_OK;
}

/* -------------------------------------------------------------- compact */

static const char compact_help[] =
    "usage: tessera ckpt compact DIR [--threads N] [--json]\n"
    "Re-encodes in place the frames a save stored raw (codec auto under load) in\n"
    "the committed checkpoint DIR, a step directory, or in every committed step of\n"
    "the root DIR: each as a save with codec auto encodes one (bytegroup for\n"
    "f32/f16/bf16, zstd otherwise; raw where that is not smaller). The values, the\n"
    "raw checksums, the chunks and their frames stay; a step without raw frames is\n"
    "left as it is. Atomic: the new data files (the unchanged ones hard-linked) and\n"
    "MANIFEST are written and synced in DIR.compact beside DIR, which is then\n"
    "exchanged with DIR in one rename: a crash leaves DIR the old or the new\n"
    "checkpoint, and at most a DIR.compact, which the next compact removes. Holds\n"
    "the lock of DIR's folder: refused while a job or a pull writes there. A load\n"
    "of DIR meanwhile may fail on a checksum, never read wrong values.\n"
    "  --threads N  encoder threads (default: the online cores)\n"
    "  --json       {\"steps\":[...]}: each step's raw bytes, data file bytes before\n"
    "               and after, data files rewritten, frames encoded\n"
    "Exit 0: done; 1: a step could not be compacted (it is left as it was);\n"
    "2: bad usage.\n";

/* The raw bytes of the checkpoint in dir and the bytes of its data files. */
static int ckpt_sizes(const char *dir, uint64_t *raw, uint64_t *files, tsr_error *e) {
    tsr_ckpt *ck = tsr_ckpt_open(dir, e);
    if (!ck) return e->code ? e->code : TSR_EIO;
    uint64_t stored;
    totals(ck, raw, &stored);
    *files = 0;
    for (size_t i = 0; i < tsr_ckpt_n_files(ck); i++) {
        tsr_file_info f;
        tsr_ckpt_file(ck, i, &f);
        *files += f.size;
    }
    tsr_ckpt_close(ck);
    return 0;
}

/* Compacts one step; prints its line (text) or its JSON object. */
static int compact_step(const char *dir, int threads, int json, int first) {
    tsr_error e = {0};
    tsr_recode_stats st;
    uint64_t raw = 0, before = 0, after = 0;
    int rc = ckpt_sizes(dir, &raw, &before, &e);
    if (!rc) rc = tsr_ckpt_compact(dir, threads, &st, &e);
    if (!rc) rc = ckpt_sizes(dir, &raw, &after, &e);
    if (rc) {
        fprintf(stderr, "tessera ckpt compact: %s\n", e.msg);
        return EXIT_FAIL;
    }
    char a[32], b[32];
    if (json) {
        printf("%s{\"dir\":", first ? "" : ",");
        tsr_json_str(stdout, dir);
        printf(",\"raw_bytes\":%llu,\"bytes_before\":%llu,\"bytes_after\":%llu,\"files_rewritten\":%llu,"
               "\"frames_encoded\":%llu}",
               (unsigned long long)raw, (unsigned long long)before, (unsigned long long)after,
               (unsigned long long)st.files, (unsigned long long)st.frames);
    } else if (st.files) {
        printf("compacted %s: %s -> %s of data files (%.3f of the raw bytes), %llu frames encoded in %llu file(s)\n",
               dir, tsr_fmt_bytes(before, a, sizeof a), tsr_fmt_bytes(after, b, sizeof b),
               raw ? (double)after / (double)raw : 0.0, (unsigned long long)st.frames, (unsigned long long)st.files);
    } else {
        printf("%s: no raw frame that encodes smaller: left as it is (%s of data files)\n", dir,
               tsr_fmt_bytes(after, a, sizeof a));
    }
    return EXIT_OK;
}

int tsr_cmd_ckpt_compact(int argc, char **argv) {
    if (wants_help(argc, argv, compact_help)) return EXIT_OK;
    const char *dir;
    int json, u;
    uint64_t threads;
    if ((u = dir_args("ckpt compact", argc, argv, &dir, &json, &threads))) return u;
    if (!(tsr_store_caps(dir) & TSR_STORE_RENAME)) return tsr_usage_error("ckpt compact", "DIR is a local directory, not %s", dir);
    tsr_step_info *steps = NULL;
    size_t n = 0;
    int single = tsr_ckpt_is_committed(dir);
    if (!single && tsr_list_steps(dir, &steps, &n) != 0) {
        fprintf(stderr, "tessera ckpt compact: %s: neither a committed checkpoint nor a root of step directories\n",
                dir);
        free(steps);
        return EXIT_FAIL;
    }
    if (json) printf("{\"steps\":[");
    int rc = EXIT_OK, done = 0;
    size_t len = strlen(dir);
    while (len > 1 && dir[len - 1] == '/') len--;
    for (size_t i = 0; i < (single ? 1 : n) && rc == EXIT_OK; i++) {
        char path[PATH_MAX + 80];
        if (single) snprintf(path, sizeof path, "%s", dir);
        else if (!steps[i].committed) continue;
        else snprintf(path, sizeof path, "%.*s/%s", (int)len, dir, steps[i].name);
        rc = compact_step(path, (int)threads, json, !done);
        done++;
    }
    if (json) printf("],\"ok\":%s}\n", rc == EXIT_OK ? "true" : "false");
    free(steps);
    if (rc == EXIT_OK && !done) {
        fprintf(stderr, "tessera ckpt compact: %s: no committed checkpoint\n", dir);
        return EXIT_FAIL;
    }
    return rc;
}

/* ---------------------------------------------------------------- fence */

static const char fence_help[] =
    "usage: tessera ckpt fence ROOT\n"
    "Advances the fence of the checkpoint folder ROOT (a folder or s3://bucket/prefix;\n"
    "FORMAT.md 4.6) and prints the new epoch: ROOT/FENCE gets a record of the epoch,\n"
    "one above both the fence's (1 when none) and every epoch a MANIFEST there\n"
    "records, and of the newest step committed now. From then on a writer of an\n"
    "older epoch (a launch's rank still running: the epoch is TSR_EPOCH in its\n"
    "environment) is refused before it creates a file and before it commits, and a\n"
    "step it commits regardless, after the step the fence recorded, is passed over\n"
    "by every reader. tessera launch does this before each launch, and tessera train\n"
    "without TSR_EPOCH at its start; a job run with TSR_EPOCH=N writes as epoch N.\n"
    "Exit 0: fenced; 1: not (a damaged FENCE names itself and the reason).\n";

int tsr_cmd_ckpt_fence(int argc, char **argv) {
    if (wants_help(argc, argv, fence_help)) return EXIT_OK;
    const char *root = NULL;
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] == '-') return tsr_usage_error("ckpt fence", "unknown option %s", argv[i]);
        if (root) return tsr_usage_error("ckpt fence", "one ROOT only");
        root = argv[i];
    }
    if (!root) return tsr_usage_error("ckpt fence", "missing ROOT");
    tsr_error e = {0};
    uint64_t epoch = 0;
    if (tsr_fence_advance(root, &epoch, &e)) {
        fprintf(stderr, "tessera ckpt fence: %s\n", e.msg);
        return EXIT_FAIL;
    }
    printf("%llu\n", (unsigned long long)epoch);
    return EXIT_OK;
}
