/* bench_scale.c: `tessera bench scale [--model F] [--ranks N,...] [--json]`.
 *
 * What a job of N ranks computes to save and to load a checkpoint, without
 * starting N processes, on one core. For each N, a layout of tp=8, pp=16 and
 * dp_shard=N/128 (the shape of a Llama 3 405B job), and the model with its
 * AdamW moments:
 *  - save: every rank's boxes (what the save plan's all-gather delivers), the
 *    save plan (which rank writes which box), every writer's table as
 *    tsr_save_finish would return it (frames of 4 MiB, one data file a writer;
 *    about half of them encoded, as adaptive encoding leaves them, with stored
 *    sizes and checksums that stand in for real ones), and rank 0's commit:
 *    the tables merged, sorted, validated and encoded into the MANIFEST;
 *  - load onto 0.75x the ranks (dp_shard 3/4 as large): the MANIFEST parsed and
 *    validated (as every rank does), the load plan from every target rank's
 *    boxes, and target rank 0's read plan against the stored chunks.
 * Each side runs in a child process, so that its peak memory (maxrss) is its
 * own. The goals (issue: planning and MANIFEST under 10 s and 4 GiB at 16384
 * ranks, the MANIFEST under 64 MiB, a commit gather in a tree) are judged at
 * the largest N. */
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "commands.h"
#include "manifest.h"
#include "model.h"
#include "tessera.h"
#include "tsr_comm.h"

#define MAX_SCALES 8
#define GOAL_SECONDS 10.0
#define GOAL_PEAK (4ull << 30)
#define GOAL_MANIFEST (64ull << 20)
#define PP 16
#define TP 8

typedef struct scale_result {
    uint32_t ranks, load_ranks;
    uint64_t boxes, chunks, frames, manifest_bytes, pieces;
    double plan_s, tables_s, merge_s, parse_s, load_plan_s, read_plan_s;
    uint64_t save_peak, load_peak;
    int save_ok, load_ok;
    char why[sizeof(tsr_error){0}.msg];
} scale_result;

static void usage(FILE *f) {
    fprintf(f,
            "usage: tessera bench scale [--model F] [--ranks N,...] [--json]\n"
            "  Builds the save plan, the MANIFEST and a resharded load plan that a job of N\n"
            "  ranks (tp=8, pp=16, dp_shard=N/128) would make, without starting N processes,\n"
            "  and prints their time and peak memory on one core and the MANIFEST's size.\n"
            "  --model F   model shapes (default 405b; debug, small, 124m, 1b, 8b)\n"
            "  --ranks L   comma-separated rank counts, each a multiple of 512\n"
            "              (default 1024,4096,16384)\n"
            "  --keep DIR  keep each MANIFEST, as DIR/MANIFEST-<ranks>\n"
            "  --json      print one JSON object\n");
}

static uint64_t peak_rss(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (uint64_t)ru.ru_maxrss * 1024;
}

static tsr_layout layout_of(uint32_t ranks, uint32_t n_layers) {
    return (tsr_layout){PP, 1, ranks / (PP * TP), TP, n_layers, 0};
}

/* Every rank's boxes and the plan that gives each distinct box to one of them. */
static int plan_all(const tsr_layout *l, const tsr_model_decls *d, tsr_save_plan *plan, uint64_t *boxes,
                    tsr_error *err) {
    uint32_t n = tsr_layout_size(l);
    size_t nt = 3 * d->n_params;
    tsr_rank_box **held = calloc(n, sizeof *held);
    size_t *n_held = calloc(n, sizeof *n_held), *es = malloc(nt * sizeof *es);
    int rc = !held || !n_held || !es ? tsr_err(err, TSR_ENOMEM, "out of memory") : 0;
    for (size_t t = 0; !rc && t < nt; t++) es[t] = tsr_dtype_size(d->decls[t].dtype);
    *boxes = 0;
    for (uint32_t r = 0; !rc && r < n; r++) {
        rc = tsr_layout_boxes(l, d->decls, nt, r, &held[r], &n_held[r], err);
        *boxes += n_held[r];
    }
    if (!rc) rc = tsr_save_plan_build((const tsr_rank_box *const *)held, n_held, n, es, plan, err);
    for (uint32_t r = 0; held && r < n; r++) free(held[r]);
    free(held), free(n_held), free(es);
    return rc;
}

/* Writer w's table: the boxes the plan gives it (entries idx[0..n)), each a
 * chunk of frames packed into data file w, as tsr_save_finish encodes it. */
static int writer_table(const tsr_save_plan *plan, const size_t *idx, size_t n, uint32_t w,
                        const tsr_model_decls *d, const uint8_t sid[16], uint8_t **out, size_t *len,
                        tsr_error *err) {
    tsr_manifest m;
    tsr_manifest_init(&m);
    memcpy(m.save_id, sid, 16);
    size_t fb = tsr_write_opts_default().frame_bytes;
    uint64_t pos = TSR_DATA_HEADER_SIZE;
    uint32_t last = UINT32_MAX;
    int rc = 0;
    for (size_t i = 0; !rc && i < n; i++) {
        const tsr_rank_box *b = &plan->boxes[idx[i]];
        const tsr_tensor_decl *t = &d->decls[b->tensor];
        if (b->tensor != last) { /* entries come in tensor order */
            tsr_mf_tensor mt = {.name = t->name, .group = t->group, .dtype = t->dtype, .ndim = t->ndim,
                                .placement = t->placement};
            memcpy(mt.shape, t->shape, sizeof mt.shape);
            if (tsr_manifest_add_tensor(&m, &mt)) rc = TSR_ENOMEM;
            last = b->tensor;
        }
        size_t es = tsr_dtype_size(t->dtype);
        tsr_mf_chunk c = {.tensor = (uint32_t)(m.n_tensors - 1), .file_id = w,
                          .frame_first = (uint32_t)m.n_frames, .box = b->box};
        tsr_frame_geometry(&b->box, es, fb, &c.split_dim, &c.frame_rows);
        uint64_t nf = tsr_frame_count(&b->box, c.split_dim, c.frame_rows);
        c.frame_count = (uint32_t)nf;
        for (uint64_t k = 0; !rc && k < nf; k++) {
            tsr_box fbox;
            tsr_frame_box(&c, k, &fbox);
            /* as adaptive encoding leaves them: about half the frames encoded
             * (bytegroup, 70-85% of their raw size), the others raw (one checksum) */
            uint64_t raw = tsr_box_volume(&fbox) * es, h = tsr_splitmix64(pos ^ ((uint64_t)w << 40));
            uint64_t stored = h & 1 ? raw - raw * (15 + (h >> 8) % 16) / 100 : raw;
            tsr_mf_frame f = {pos, stored, raw, h, h & 1 ? tsr_splitmix64(h) : h,
                              h & 1 ? TSR_CODEC_BYTEGROUP : TSR_CODEC_RAW, w};
            pos = tsr_align_up(pos + stored, 4096);
            if (tsr_manifest_add_frame(&m, &f)) rc = TSR_ENOMEM;
        }
        if (!rc && tsr_manifest_add_chunk(&m, &c)) rc = TSR_ENOMEM;
    }
    tsr_mf_file f = {w, pos};
    if (!rc && tsr_manifest_add_file(&m, &f)) rc = TSR_ENOMEM;
    if (rc) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    if (!rc) rc = tsr_manifest_sort(&m, err);
    if (!rc) rc = tsr_manifest_validate(&m, "table", TSR_MF_PARTIAL, err);
    if (!rc) rc = tsr_manifest_encode(&m, TSR_MF_PLAIN, out, len, err); /* as tsr_save_finish */
    tsr_manifest_free(&m);
    return rc;
}

/* The save side: plan, the writers' tables, rank 0's MANIFEST (written to mf_path). */
static int save_side(const tsr_model_decls *d, uint32_t ranks, const char *mf_path, scale_result *r,
                     tsr_error *err) {
    tsr_layout l = layout_of(ranks, (uint32_t)(d->n_params - 3) / TSR_LAYER_PARAMS);
    tsr_save_plan plan = {0};
    double t0 = tsr_now();
    int rc = plan_all(&l, d, &plan, &r->boxes, err);
    r->plan_s = tsr_now() - t0;
    if (rc) return rc;
    /* the plan's entries by writer, in plan order (so by tensor) */
    size_t *start = calloc((size_t)ranks + 1, sizeof *start), *idx = malloc((plan.n + 1) * sizeof *idx);
    uint8_t **tables = calloc(ranks, sizeof *tables);
    size_t *lens = calloc(ranks, sizeof *lens);
    if (!start || !idx || !tables || !lens) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    for (size_t k = 0; !rc && k < plan.n; k++) start[plan.writer[k] + 1]++;
    for (uint32_t w = 0; !rc && w < ranks; w++) start[w + 1] += start[w];
    for (size_t k = 0; !rc && k < plan.n; k++) idx[start[plan.writer[k]]++] = k;
    for (uint32_t w = ranks; !rc && w > 0; w--) start[w] = start[w - 1];
    if (start) start[0] = 0;
    uint8_t sid[16] = "tessera-scale-01";
    r->chunks = plan.n;
    t0 = tsr_now();
    for (uint32_t w = 0; !rc && w < ranks; w++)
        rc = writer_table(&plan, idx + start[w], start[w + 1] - start[w], w, d, sid, &tables[w], &lens[w], err);
    r->tables_s = tsr_now() - t0;
    tsr_save_plan_free(&plan);
    free(start), free(idx);
    uint8_t *bytes = NULL;
    size_t len = 0;
    t0 = tsr_now();
    if (!rc) rc = tsr_manifest_merge((const uint8_t *const *)tables, lens, ranks, sid, 1, &l, &bytes, &len, err);
    r->merge_s = tsr_now() - t0;
    for (uint32_t w = 0; tables && w < ranks; w++) free(tables[w]);
    free(tables), free(lens);
    r->manifest_bytes = len;
    r->save_peak = peak_rss();
    FILE *f = rc ? NULL : fopen(mf_path, "wb");
    if (!rc && (!f || fwrite(bytes, 1, len, f) != len))
        rc = tsr_err(err, TSR_EIO, "%s: cannot write: %s", mf_path, strerror(errno));
    if (f && fclose(f) && !rc) rc = tsr_err(err, TSR_EIO, "%s: cannot write: %s", mf_path, strerror(errno));
    free(bytes);
    return rc;
}

/* Target rank 0's read plan: the entries of the load plan it reads, per tensor. */
static int read_plan(tsr_ckpt *ck, const tsr_save_plan *plan, const tsr_model_decls *d, uint64_t *pieces,
                     tsr_error *err) {
    tsr_box *need = malloc((plan->n + 1) * sizeof *need);
    int rc = need ? 0 : tsr_err(err, TSR_ENOMEM, "out of memory");
    *pieces = 0;
    for (size_t g = 0; !rc && g < plan->n;) {
        uint32_t t = plan->boxes[g].tensor;
        size_t h = g, n = 0;
        for (; h < plan->n && plan->boxes[h].tensor == t; h++)
            if (plan->writer[h] == 0) need[n++] = plan->boxes[h].box;
        long k = n ? tsr_ckpt_find(ck, d->decls[t].name) : 0;
        if (k < 0) rc = tsr_err(err, TSR_ENOTFOUND, "no tensor %s in the MANIFEST", d->decls[t].name);
        tsr_read_piece *p = NULL;
        size_t np = 0;
        if (!rc && n) rc = tsr_ckpt_plan_read(ck, (size_t)k, need, n, &p, &np, err);
        free(p);
        *pieces += np;
        g = h;
    }
    free(need);
    return rc;
}

/* The load side: the MANIFEST parsed, the load plan onto 0.75x the ranks, rank 0's reads. */
static int load_side(const tsr_model_decls *d, uint32_t ranks, const char *dir, const char *mf_path,
                     scale_result *r, tsr_error *err) {
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = tsr_ckpt_read_manifest(dir, &buf, &len, err); /* dir/MANIFEST: mf_path */
    if (rc) return rc;
    double t0 = tsr_now();
    tsr_ckpt *ck = tsr_ckpt_open_manifest(dir, buf, len, err);
    r->parse_s = tsr_now() - t0;
    free(buf);
    if (!ck) return TSR_ECORRUPT;
    r->frames = tsr_ckpt_n_frames(ck);
    tsr_layout l = layout_of(ranks, (uint32_t)(d->n_params - 3) / TSR_LAYER_PARAMS);
    l.dp_shard = l.dp_shard * 3 / 4;
    r->load_ranks = tsr_layout_size(&l);
    tsr_save_plan plan = {0};
    uint64_t boxes = 0;
    t0 = tsr_now();
    rc = plan_all(&l, d, &plan, &boxes, err);
    r->load_plan_s = tsr_now() - t0;
    t0 = tsr_now();
    if (!rc) rc = read_plan(ck, &plan, d, &r->pieces, err);
    r->read_plan_s = tsr_now() - t0;
    tsr_save_plan_free(&plan);
    tsr_ckpt_close(ck);
    r->load_peak = peak_rss();
    return rc;
}

/* Runs one side in a child; its result comes back through a pipe. */
static void run_child(int load, const tsr_model_decls *d, uint32_t ranks, const char *dir, const char *mf_path,
                      scale_result *r) {
    int fd[2];
    if (pipe(fd) != 0) {
        snprintf(r->why, sizeof r->why, "pipe: %s", strerror(errno));
        return;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        tsr_error err = {0};
        scale_result c = *r;
        int rc = load ? load_side(d, ranks, dir, mf_path, &c, &err) : save_side(d, ranks, mf_path, &c, &err);
        if (rc) snprintf(c.why, sizeof c.why, "%s", err.msg);
        *(load ? &c.load_ok : &c.save_ok) = rc == 0;
        ssize_t w = write(fd[1], &c, sizeof c);
        _exit(w == (ssize_t)sizeof c ? 0 : 1);
    }
    close(fd[1]);
    scale_result c;
    ssize_t got = pid > 0 ? read(fd[0], &c, sizeof c) : -1;
    close(fd[0]);
    int status = 0;
    if (pid > 0) waitpid(pid, &status, 0);
    if (got == (ssize_t)sizeof c) *r = c;
    else snprintf(r->why, sizeof r->why, "the %s side's process %s", load ? "load" : "save",
                  pid < 0 ? "could not start" : WIFSIGNALED(status) ? "was killed (out of memory?)" : "failed");
}

static int parse_ranks(const char *v, uint32_t *out, int *n) {
    *n = 0;
    for (const char *p = v; *p;) {
        char *end;
        errno = 0;
        unsigned long x = strtoul(p, &end, 10);
        if (end == p || errno || x < 512 || x % 512 || x > (1ul << 20) || *n == MAX_SCALES) return -1;
        out[(*n)++] = (uint32_t)x;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return *n ? 0 : -1;
}

static void print_text(const char *model, const scale_result *res, int n) {
    char a[32], b[32];
    printf("bench scale: model %s with AdamW moments, layouts tp=%d pp=%d dp_shard=N/%d, frames of %s, one core\n",
           model, TP, PP, TP * PP, tsr_fmt_bytes(tsr_write_opts_default().frame_bytes, a, sizeof a));
    for (int i = 0; i < n; i++) {
        const scale_result *r = &res[i];
        printf("scale %u ranks: %llu boxes held, %llu chunks, %llu frames\n", r->ranks,
               (unsigned long long)r->boxes, (unsigned long long)r->chunks, (unsigned long long)r->frames);
        if (!r->save_ok) {
            printf("  save: FAILED: %s\n", r->why);
            continue;
        }
        printf("  save: plan %.2f s; MANIFEST from %u tables %.2f s, %s (the writers' tables %.2f s, all "
               "in turn); peak %s\n",
               r->plan_s, r->ranks, r->merge_s, tsr_fmt_bytes(r->manifest_bytes, a, sizeof a), r->tables_s,
               tsr_fmt_bytes(r->save_peak, b, sizeof b));
        if (!r->load_ok) printf("  load: FAILED: %s\n", r->why);
        else
            printf("  load onto %u ranks: MANIFEST parsed %.2f s, plan %.2f s, rank 0's read plan %.3f s (%llu "
                   "pieces); peak %s\n",
                   r->load_ranks, r->parse_s, r->load_plan_s, r->read_plan_s, (unsigned long long)r->pieces,
                   tsr_fmt_bytes(r->load_peak, a, sizeof a));
    }
    const scale_result *r = &res[n - 1];
    if (!r->save_ok) return;
    double s = r->plan_s + r->merge_s;
    printf("goal: plan + MANIFEST at %u ranks %.2f s on one core (goal < %.0f s): %s\n", r->ranks, s,
           GOAL_SECONDS, s < GOAL_SECONDS ? "ok" : "MISSED");
    printf("goal: rank 0's peak memory at %u ranks %s (goal < %s): %s\n", r->ranks,
           tsr_fmt_bytes(r->save_peak, a, sizeof a), tsr_fmt_bytes(GOAL_PEAK, b, sizeof b),
           r->save_peak < GOAL_PEAK ? "ok" : "MISSED");
    uint32_t k = tsr_comm_gather_fanin(r->ranks);
    printf("goal: the commit's gather at %u ranks: a tree, rank 0 receives %u messages, each with up to %u ranks' "
           "tables (goal: not one message per rank): %s\n",
           r->ranks, k, k + 1, k < r->ranks - 1 ? "ok" : "MISSED");
    printf("goal: MANIFEST at %u ranks %s (goal < %s): %s\n", r->ranks,
           tsr_fmt_bytes(r->manifest_bytes, a, sizeof a), tsr_fmt_bytes(GOAL_MANIFEST, b, sizeof b),
           r->manifest_bytes < GOAL_MANIFEST ? "ok" : "MISSED");
}

static void print_json(const char *model, const scale_result *res, int n) {
    printf("{\"model\":");
    tsr_json_str(stdout, model);
    printf(",\"tp\":%d,\"pp\":%d,\"frame_bytes\":%zu,\"scales\":[", TP, PP, tsr_write_opts_default().frame_bytes);
    for (int i = 0; i < n; i++) {
        const scale_result *r = &res[i];
        printf("%s{\"ranks\":%u,\"load_ranks\":%u,\"boxes\":%llu,\"chunks\":%llu,\"frames\":%llu,"
               "\"manifest_bytes\":%llu,\"plan_s\":%.6f,\"tables_s\":%.6f,\"merge_s\":%.6f,\"save_peak\":%llu,"
               "\"parse_s\":%.6f,\"load_plan_s\":%.6f,\"read_plan_s\":%.6f,\"pieces\":%llu,\"load_peak\":%llu,"
               "\"ok\":%s",
               i ? "," : "", r->ranks, r->load_ranks, (unsigned long long)r->boxes, (unsigned long long)r->chunks,
               (unsigned long long)r->frames, (unsigned long long)r->manifest_bytes, r->plan_s, r->tables_s,
               r->merge_s, (unsigned long long)r->save_peak, r->parse_s, r->load_plan_s, r->read_plan_s,
               (unsigned long long)r->pieces, (unsigned long long)r->load_peak,
               r->save_ok && r->load_ok ? "true" : "false");
        if (!(r->save_ok && r->load_ok)) {
            printf(",\"error\":");
            tsr_json_str(stdout, r->why);
        }
        printf("}");
    }
    printf("]}\n");
}

int tsr_cmd_bench_scale(int argc, char **argv) {
    const char *model = "405b", *keep = NULL;
    uint32_t ranks[MAX_SCALES] = {1024, 4096, 16384};
    int n = 3, json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int r = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return EXIT_OK;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if ((r = tsr_opt(argc, argv, &i, "model", 1, &v)) > 0) {
            model = v;
        } else if (r == 0 && (r = tsr_opt(argc, argv, &i, "keep", 1, &v)) > 0) {
            keep = v;
        } else if (r == 0 && (r = tsr_opt(argc, argv, &i, "ranks", 1, &v)) > 0) {
            if (parse_ranks(v, ranks, &n))
                return tsr_usage_error("bench scale", "bad --ranks '%s' (want up to %d multiples of 512, "
                                       "comma-separated)", v, MAX_SCALES);
        } else {
            if (r == 0) fprintf(stderr, "tessera bench scale: unknown argument '%s'\n", a);
            usage(stderr);
            return EXIT_USAGE;
        }
    }
    tsr_model_args args;
    tsr_model_decls d;
    tsr_error err = {0};
    if (tsr_model_args_get(model, &args, &err) || tsr_model_decls_make(&args, &d, &err))
        return tsr_usage_error("bench scale", "%s", err.msg);
    char dir[] = "/tmp/tessera-scale-XXXXXX", mf[sizeof dir + 16];
    if (!mkdtemp(dir)) {
        fprintf(stderr, "tessera bench scale: cannot make a temporary folder: %s\n", strerror(errno));
        tsr_model_decls_free(&d);
        return EXIT_FAIL;
    }
    snprintf(mf, sizeof mf, "%s/MANIFEST", dir);
    scale_result res[MAX_SCALES];
    int ok = 1;
    for (int i = 0; i < n; i++) {
        memset(&res[i], 0, sizeof res[i]);
        res[i].ranks = ranks[i];
        if ((unsigned)args.n_layers < PP) {
            snprintf(res[i].why, sizeof res[i].why, "model %s has fewer than %d layers", model, PP);
        } else {
            run_child(0, &d, ranks[i], dir, mf, &res[i]);
            if (res[i].save_ok) run_child(1, &d, ranks[i], dir, mf, &res[i]);
        }
        ok = ok && res[i].save_ok && res[i].load_ok;
        char kept[PATH_MAX];
        snprintf(kept, sizeof kept, "%s/MANIFEST-%u", keep ? keep : "", ranks[i]);
        if (keep && res[i].save_ok && rename(mf, kept) != 0) {
            fprintf(stderr, "tessera bench scale: cannot keep %s: %s\n", kept, strerror(errno));
            ok = 0;
        }
        unlink(mf);
    }
    rmdir(dir);
    tsr_model_decls_free(&d);
    if (json) print_json(model, res, n);
    else print_text(model, res, n);
    for (int i = 0; i < n; i++)
        if (!(res[i].save_ok && res[i].load_ok))
            fprintf(stderr, "tessera bench scale: %u ranks: %s\n", res[i].ranks, res[i].why);
    return ok ? EXIT_OK : EXIT_FAIL;
}
