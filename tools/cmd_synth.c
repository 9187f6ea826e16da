/* cmd_synth.c: tessera ckpt synth and tessera ckpt check: a synthetic checkpoint,
 * written by any number of ranks in any layout through the engine, and checked
 * element by element after a load in any other layout. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "casts.h"
#include "cli.h"
#include "commands.h"
#include "lock.h"
#include "tessera.h"

static const char synth_help[] =
    "usage: [mpirun -np N] tessera ckpt synth DIR --bytes SIZE [--dtype bf16|f32|mix]\n"
    "           [--tensors N] [--step S] [--layout L] [--threads N] [--frame-bytes SIZE]\n"
    "           [--codec auto|raw|zstd|bytegroup] [--nan TENSOR[:INDEX] ...]\n"
    "       tessera ckpt synth DIR --check     (the same as 'tessera ckpt check DIR')\n"
    "Writes a checkpoint into DIR whose content is a deterministic function of tensor\n"
    "name and global element index (Gaussian-like values, std 0.02, for float\n"
    "dtypes). N tensors (default 8) of about SIZE/N bytes, shaped and placed like the\n"
    "layers of a model: the first on the first pipeline stage, the last on the last,\n"
    "the others one layer each; split over tp by rows, by columns or not at all in\n"
    "turn, and over dp_shard by rows. --dtype mix alternates bf16 model and f32 optim\n"
    "tensors and adds small tensors of other dtypes and shapes. Under mpirun each rank\n"
    "writes the boxes it holds under layout L (default dp_shard=<ranks>), e.g.\n"
    "pp=2,dp_shard=2,tp=2; replicated boxes are written once. DIR has one writer: a\n"
    "step of a root (DIR named step-N) is written in place under the root's lock;\n"
    "any other DIR as .DIR.tmp-PID-N beside it, renamed to DIR once committed.\n"
    "--nan plants a NaN at the row-major INDEX (default 0) of the float tensor\n"
    "TENSOR (named as 'ckpt info' shows them, e.g. model.layers.1.w): the checkpoint\n"
    "is committed and marked poisoned (FORMAT.md 4.5). Up to 8 times.\n";

static const char check_help[] =
    "usage: [mpirun -np M] tessera ckpt check DIR [--layout L] [--threads N] [--no-digest-check]\n"
    "Loads the synthetic checkpoint in DIR (or the newest under a root) on the ranks\n"
    "of this job in layout L (default dp_shard=<ranks>), resharding on load, and\n"
    "compares every element with the synthetic content. Exit 1 naming the first wrong\n"
    "element. --no-digest-check: the load checks the frames' checksums only, not the\n"
    "tensors' digests (which otherwise stand in for the decoded frames' checksums).\n";

/* ------------------------------------------------------------ the model */

typedef struct synth_model {
    tsr_tensor_decl *t;
    char (*names)[64];
    size_t n;
    uint32_t n_layers;
} synth_model;

static void model_free(synth_model *m) {
    free(m->t);
    free(m->names);
}

static int synth_model_make(uint64_t bytes, const char *dtype, uint64_t n, synth_model *m) {
    int mix = strcmp(dtype, "mix") == 0;
    size_t extra = mix ? 4 : 0;
    m->t = calloc(n + extra, sizeof *m->t);
    m->names = calloc(n + extra, sizeof *m->names);
    if (!m->t || !m->names) return -1;
    m->n = n + extra;
    m->n_layers = n > 2 ? (uint32_t)(n - 2) : 0;
    uint64_t per = bytes / n;
    for (uint64_t i = 0; i < n; i++) {
        tsr_tensor_decl *t = &m->t[i];
        t->dtype = mix ? (i % 2 ? TSR_F32 : TSR_BF16) : tsr_dtype_parse(dtype);
        t->group = mix && i % 2 ? "optim" : "model";
        snprintf(m->names[i], sizeof m->names[i], "%s.layers.%llu.w", t->group, (unsigned long long)i);
        t->name = m->names[i];
        size_t es = tsr_dtype_size(t->dtype);
        int kind = (int)(i % 3);
        if (kind == 2) { /* a vector, replicated over tp, split over dp_shard */
            t->ndim = 1;
            t->shape[0] = per / es ? per / es : 1;
            t->placement.tp_dim = -1;
        } else { /* a matrix; rows are odd so that splits are uneven */
            uint64_t cols = 1024 + 8 * (i % 2), rows = per / (cols * es);
            t->ndim = 2;
            t->shape[0] = rows | 1;
            t->shape[1] = cols;
            t->placement.tp_dim = (int8_t)kind; /* 0: by rows (column-parallel), 1: by columns */
        }
        t->placement.fsdp = 1;
        if (i == 0) t->placement.pp_role = TSR_PP_FIRST, t->placement.layer = -1;
        else if (i == n - 1) t->placement.pp_role = TSR_PP_LAST, t->placement.layer = -1;
        else t->placement.pp_role = TSR_PP_LAYER, t->placement.layer = (int32_t)(i - 1);
    }
    if (mix) {
        tsr_placement rep = {-1, 0, TSR_PP_ALL, -1};
        m->t[n] = (tsr_tensor_decl){"model.norm", "model", TSR_F32, 1, {2048}, {-1, 1, TSR_PP_LAST, -1}};
        m->t[n + 1] = (tsr_tensor_decl){"optim.step_count", "optim", TSR_I64, 0, {0}, rep};
        m->t[n + 2] = (tsr_tensor_decl){"model.mask", "model", TSR_BOOL, 3, {3, 5, 7}, {2, 1, TSR_PP_ALL, -1}};
        m->t[n + 3] = (tsr_tensor_decl){"model.ids", "model", TSR_I32, 1, {1000}, {-1, 1, TSR_PP_FIRST, -1}};
    }
    return 0;
}

/* This rank's boxes of the model under layout l, with memory. */
typedef struct rank_state {
    tsr_rank_box *boxes;
    size_t n;
    tsr_state_box *sb;
    uint64_t bytes;
} rank_state;

static void rank_state_free(rank_state *r) {
    for (size_t i = 0; r->sb && i < r->n; i++) free(r->sb[i].data);
    free(r->sb);
    free(r->boxes);
}

static int rank_state_make(const tsr_layout *l, const tsr_tensor_decl *t, size_t nt, uint32_t rank, rank_state *r,
                           tsr_error *e) {
    memset(r, 0, sizeof *r);
    if (tsr_layout_boxes(l, t, nt, rank, &r->boxes, &r->n, e)) return -1;
    r->sb = calloc(r->n + 1, sizeof *r->sb);
    if (!r->sb) return -1;
    for (size_t i = 0; i < r->n; i++) {
        size_t bytes = tsr_box_volume(&r->boxes[i].box) * tsr_dtype_size(t[r->boxes[i].tensor].dtype);
        r->sb[i] = (tsr_state_box){r->boxes[i].tensor, r->boxes[i].box, malloc(bytes ? bytes : 1), TSR_MEM_HOST};
        if (!r->sb[i].data) return -1;
        r->bytes += bytes;
    }
    return 0;
}

/* ------------------------------------------------------------ options */

#define MAX_NAN 8
typedef struct synth_opts {
    const char *dir, *dtype, *layout;
    uint64_t bytes, tensors, step, threads, frame_bytes;
    int codec, check, have_bytes, no_digest_check;
    char nan_name[MAX_NAN][256]; /* --nan: tensor and row-major index of each NaN planted */
    uint64_t nan_index[MAX_NAN];
    int n_nan;
} synth_opts;

static int parse_opts(const char *cmd, int argc, char **argv, synth_opts *o) {
    const char *v;
    *o = (synth_opts){.dtype = "bf16", .tensors = 8, .codec = TSR_CODEC_AUTO};
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = tsr_opt(argc, argv, &i, "bytes", 1, &v))) {
            if (r < 0 || tsr_parse_size(v, &o->bytes)) return tsr_usage_error(cmd, "--bytes takes a size like 256M");
            o->have_bytes = 1;
        } else if ((r = tsr_opt(argc, argv, &i, "dtype", 1, &v))) {
            if (r < 0 || (strcmp(v, "mix") && strcmp(v, "bf16") && strcmp(v, "f32")))
                return tsr_usage_error(cmd, "--dtype is bf16, f32 or mix");
            o->dtype = v;
        } else if ((r = tsr_opt(argc, argv, &i, "tensors", 1, &v))) {
            if (r < 0 || tsr_parse_u64(v, &o->tensors) || o->tensors == 0 || o->tensors > 1000000)
                return tsr_usage_error(cmd, "--tensors takes a number from 1 to 1000000");
        } else if ((r = tsr_opt(argc, argv, &i, "step", 1, &v))) {
            if (r < 0 || tsr_parse_u64(v, &o->step)) return tsr_usage_error(cmd, "--step takes a number");
        } else if ((r = tsr_opt(argc, argv, &i, "threads", 1, &v))) {
            if (r < 0 || tsr_parse_u64(v, &o->threads) || o->threads > 1024)
                return tsr_usage_error(cmd, "--threads takes a number up to 1024");
        } else if ((r = tsr_opt(argc, argv, &i, "frame-bytes", 1, &v))) {
            if (r < 0 || tsr_parse_size(v, &o->frame_bytes) || !o->frame_bytes || o->frame_bytes > (256u << 20))
                return tsr_usage_error(cmd, "--frame-bytes takes a size up to 256M");
        } else if ((r = tsr_opt(argc, argv, &i, "layout", 1, &v))) {
            if (r < 0) return EXIT_USAGE;
            o->layout = v;
        } else if ((r = tsr_opt(argc, argv, &i, "codec", 1, &v))) {
            if (r < 0) return EXIT_USAGE;
            if (tsr_parse_codec(v, &o->codec)) return tsr_usage_error(cmd, "--codec is auto, raw, zstd or bytegroup");
        } else if ((r = tsr_opt(argc, argv, &i, "check", 0, &v))) {
            o->check = 1;
        } else if ((r = tsr_opt(argc, argv, &i, "no-digest-check", 0, &v))) {
            o->no_digest_check = 1;
        } else if ((r = tsr_opt(argc, argv, &i, "nan", 1, &v))) {
            const char *colon = r < 0 ? NULL : strrchr(v, ':');
            if (r < 0 || o->n_nan == MAX_NAN || strlen(v) >= sizeof o->nan_name[0] ||
                (colon && tsr_parse_u64(colon + 1, &o->nan_index[o->n_nan])))
                return tsr_usage_error(cmd, "--nan takes TENSOR[:INDEX], up to %d times", MAX_NAN);
            snprintf(o->nan_name[o->n_nan], sizeof o->nan_name[0], "%.*s", colon ? (int)(colon - v) : (int)strlen(v), v);
            o->n_nan++;
        } else if (argv[i][0] == '-') {
            return tsr_usage_error(cmd, "unknown option %s", argv[i]);
        } else if (!o->dir) {
            o->dir = argv[i];
        } else {
            return tsr_usage_error(cmd, "one DIR only");
        }
    }
    if (!o->dir) return tsr_usage_error(cmd, "missing DIR");
    return 0;
}

/* --nan: each NaN into this rank's box that holds its element, if any.
 * @return 0, or -1 naming a tensor that is not a float tensor of the model or
 * an index past its volume. */
static int plant_nans(const synth_opts *o, const synth_model *m, rank_state *rs, const char *cmd) {
    for (int k = 0; k < o->n_nan; k++) {
        const tsr_tensor_decl *d = NULL;
        size_t ti = 0;
        for (; ti < m->n && !d; ti++)
            if (!strcmp(m->t[ti].name, o->nan_name[k])) d = &m->t[ti];
        uint64_t vol = 1, idx[TSR_MAX_DIMS], rest = o->nan_index[k];
        for (uint32_t j = 0; d && j < d->ndim; j++) vol *= d->shape[j];
        if (!d || !tsr_dtype_is_float(d->dtype) || rest >= vol) {
            fprintf(stderr, "tessera %s: --nan %s:%llu: %s\n", cmd, o->nan_name[k], (unsigned long long)rest,
                    !d ? "no such tensor" : rest >= vol ? "index past the tensor" : "not a float tensor");
            return -1;
        }
        for (uint32_t j = d->ndim; j-- > 0;) idx[j] = rest % d->shape[j], rest /= d->shape[j];
        for (size_t i = 0; i < rs->n; i++) {
            const tsr_box *b = &rs->sb[i].box;
            uint64_t off = 0;
            int in = rs->sb[i].tensor == ti - 1;
            for (uint32_t j = 0; in && j < d->ndim; j++) {
                in = idx[j] >= b->offset[j] && idx[j] < b->offset[j] + b->extent[j];
                off = off * b->extent[j] + (idx[j] - b->offset[j]);
            }
            if (in) tsr_store_from_f64(d->dtype, rs->sb[i].data, off, NAN);
        }
    }
    return 0;
}

/* The layout of the job: --layout, or dp_shard=<ranks>; it must cover the ranks. */
static int job_layout(const char *cmd, const char *text, uint32_t ranks, tsr_layout *l) {
    *l = (tsr_layout){1, 1, ranks, 1, 0, 0};
    if (text) {
        tsr_error e = {0};
        if (tsr_layout_parse(text, l, &e)) return tsr_usage_error(cmd, "%s", e.msg);
    }
    if (tsr_layout_size(l) != ranks) {
        char b[128];
        tsr_layout_format(l, b, sizeof b);
        return tsr_usage_error(cmd, "layout %s needs %u ranks, this job has %u", b, tsr_layout_size(l), ranks);
    }
    return 0;
}

/* Every rank agrees on the exit status (the worst). */
static int agree(tsr_comm *c, int status) {
    int64_t v = -status;
    tsr_comm_allreduce_min(c, &v, NULL);
    return (int)-v;
}

/* ------------------------------------------------------------- check */

static int run_check(const char *cmd, const synth_opts *o, tsr_comm *comm) {
    uint32_t rank = tsr_comm_rank(comm), ranks = tsr_comm_size(comm);
    char dir[PATH_MAX];
    tsr_resolve_ckpt_dir(cmd, o->dir, dir, sizeof dir);
    tsr_error e = {0};
    tsr_ckpt *ck = tsr_ckpt_open(dir, &e);
    int status = ck ? 0 : EXIT_FAIL;
    if (!ck) fprintf(stderr, "tessera %s: %s\n", cmd, e.msg);
    if ((status = agree(comm, status))) {
        tsr_ckpt_close(ck);
        return status;
    }
    tsr_layout l;
    if ((status = agree(comm, job_layout(cmd, o->layout, ranks, &l)))) {
        tsr_ckpt_close(ck);
        return status;
    }
    l.n_layers = tsr_ckpt_layout(ck).n_layers;
    size_t nt = tsr_ckpt_n_tensors(ck);
    tsr_tensor_decl *t = calloc(nt + 1, sizeof *t);
    for (size_t i = 0; t && i < nt; i++) {
        tsr_tensor_info ti;
        tsr_ckpt_tensor(ck, i, &ti);
        t[i] = (tsr_tensor_decl){ti.name, ti.group, ti.dtype, ti.ndim, {0}, ti.placement};
        memcpy(t[i].shape, ti.shape, sizeof t[i].shape);
    }
    rank_state rs;
    status = t && rank_state_make(&l, t, nt, rank, &rs, &e) == 0 ? 0 : EXIT_FAIL;
    if (status) fprintf(stderr, "tessera %s: %s\n", cmd, e.msg[0] ? e.msg : "out of memory");
    tsr_engine *eng = NULL;
    if (!(status = agree(comm, status))) {
        tsr_engine_opts eo = tsr_engine_opts_default();
        eo.write.threads = (int)o->threads;
        eo.no_digest_check = o->no_digest_check;
        eng = tsr_engine_new(dir, comm, &eo, &e);
        if (!eng) status = EXIT_FAIL, fprintf(stderr, "tessera %s: %s\n", cmd, e.msg);
    }
    double t0 = tsr_now(), secs = 0;
    if (!(status = agree(comm, status))) {
        tsr_state st = {t, nt, rs.sb, rs.n, NULL, 0, l};
        if (tsr_engine_load(eng, dir, &st, NULL, &e)) {
            fprintf(stderr, "tessera %s: rank %u: %s\n", cmd, rank, e.msg);
            status = EXIT_FAIL;
        }
        secs = tsr_now() - t0;
    }
    for (size_t i = 0; !status && i < rs.n; i++) {
        const tsr_tensor_decl *d = &t[rs.sb[i].tensor];
        uint64_t bad[TSR_MAX_DIMS];
        if (tsr_synth_check(d->name, d->dtype, d->ndim, d->shape, &rs.sb[i].box, rs.sb[i].data, bad)) {
            printf("rank %u: %s[", rank, d->name);
            for (uint32_t k = 0; k < d->ndim; k++) printf("%s%llu", k ? "," : "", (unsigned long long)bad[k]);
            printf("]: differs from the synthetic content\n");
            status = EXIT_FAIL;
        }
    }
    status = agree(comm, status);
    if (!status && rank == 0) {
        char lb[128], a[32];
        tsr_layout_format(&l, lb, sizeof lb);
        printf("ok: %s: every element of %zu tensors matches, loaded on %u rank(s) in layout %s (%s on rank 0 in %.3f s)\n",
               dir, nt, ranks, lb, tsr_fmt_bytes(rs.bytes, a, sizeof a), secs);
    }
    tsr_engine_free(eng);
    rank_state_free(&rs);
    free(t);
    tsr_ckpt_close(ck);
    return status;
}

int tsr_cmd_ckpt_check(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return fputs(check_help, stdout), EXIT_OK;
    synth_opts o;
    int rc = parse_opts("ckpt check", argc, argv, &o);
    if (rc) return rc;
    tsr_comm *comm = tsr_cli_comm("ckpt check");
    if (!comm) return EXIT_FAIL;
    rc = run_check("ckpt check", &o, comm);
    tsr_comm_free(comm);
    return rc;
}

/* ------------------------------------------------------------- synth */

int tsr_cmd_ckpt_synth(int argc, char **argv) {
    const char *cmd = "ckpt synth";
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return fputs(synth_help, stdout), EXIT_OK;
    synth_opts o;
    int rc = parse_opts(cmd, argc, argv, &o);
    if (rc) return rc;
    if (!o.check && !o.have_bytes) return tsr_usage_error(cmd, "missing --bytes SIZE");
    tsr_comm *comm = tsr_cli_comm(cmd);
    if (!comm) return EXIT_FAIL;
    if (o.check) {
        rc = run_check(cmd, &o, comm);
        tsr_comm_free(comm);
        return rc;
    }
    uint32_t rank = tsr_comm_rank(comm), ranks = tsr_comm_size(comm);
    tsr_layout l;
    int status = agree(comm, job_layout(cmd, o.layout, ranks, &l));
    synth_model m = {0};
    rank_state rs = {0};
    tsr_error e = {0};
    /* DIR has one writer, rank 0 (lock.h): refused when it holds a checkpoint or
     * another writer holds it; every rank writes into the folder rank 0 names */
    tsr_ckpt_out *out = NULL;
    char dir[PATH_MAX + 340] = "";
    if (!status && rank == 0 && tsr_ckpt_out_begin(o.dir, &out, &e)) {
        fprintf(stderr, "tessera %s: %s\n", cmd, e.msg);
        status = EXIT_FAIL;
    }
    if (out) snprintf(dir, sizeof dir, "%s", tsr_ckpt_out_dir(out));
    if (!(status = agree(comm, status)) && tsr_comm_bcast(comm, 0, dir, sizeof dir, &e)) {
        fprintf(stderr, "tessera %s: %s\n", cmd, e.msg);
        status = EXIT_FAIL;
    }
    status = agree(comm, status);
    if (!status && synth_model_make(o.bytes, o.dtype, o.tensors, &m)) status = EXIT_FAIL;
    l.n_layers = m.n_layers;
    if (!status && rank_state_make(&l, m.t, m.n, rank, &rs, &e)) {
        fprintf(stderr, "tessera %s: %s\n", cmd, e.msg[0] ? e.msg : "out of memory");
        status = EXIT_FAIL;
    }
    status = agree(comm, status);
    tsr_progress pr;
    tsr_progress_start(&pr, "synth", rs.bytes);
    for (size_t i = 0; !status && i < rs.n; i++) {
        const tsr_tensor_decl *d = &m.t[rs.sb[i].tensor];
        tsr_synth_fill(d->name, d->dtype, d->ndim, d->shape, &rs.sb[i].box, rs.sb[i].data);
        tsr_progress_add(&pr, tsr_box_volume(&rs.sb[i].box) * tsr_dtype_size(d->dtype));
    }
    tsr_progress_end(&pr);
    if (!status && plant_nans(&o, &m, &rs, cmd)) status = EXIT_FAIL;
    status = agree(comm, status);
    tsr_engine *eng = NULL;
    if (!status) {
        tsr_engine_opts eo = tsr_engine_opts_default();
        eo.write.threads = (int)o.threads;
        eo.write.codec = o.codec;
        if (o.frame_bytes) eo.write.frame_bytes = o.frame_bytes;
        eo.sync = 1;
        eng = tsr_engine_new(dir, comm, &eo, &e);
        if (!eng) status = EXIT_FAIL, fprintf(stderr, "tessera %s: %s\n", cmd, e.msg);
    }
    double secs = 0;
    if (!(status = agree(comm, status))) {
        char cfg[256];
        int len = snprintf(cfg, sizeof cfg, "synth bytes=%llu dtype=%s tensors=%llu\n", (unsigned long long)o.bytes,
                           o.dtype, (unsigned long long)o.tensors);
        uint64_t le = o.step, rng[2] = {0x9e3779b97f4a7c15ull * (rank + 1), rank};
        tsr_state_blob blobs[3] = {{"meta.step", -1, &le, sizeof le},
                                   {"meta.config", -1, cfg, (size_t)len},
                                   {"rng", (int32_t)rank, rng, sizeof rng}};
        tsr_state st = {m.t, m.n, rs.sb, rs.n, blobs, 3, l};
        double t0 = tsr_now();
        if (tsr_engine_save_dir(eng, dir, o.step, &st, &e)) {
            fprintf(stderr, "tessera %s: rank %u: %s\n", cmd, rank, e.msg);
            status = EXIT_FAIL;
        }
        status = agree(comm, status);
        secs = tsr_now() - t0;
    }
    tsr_engine_free(eng);
    /* every rank's part committed: rank 0 renames DIR into place, or removes
     * what this run wrote */
    if (rank == 0 && tsr_ckpt_out_end(out, !status, &e)) {
        fprintf(stderr, "tessera %s: %s\n", cmd, e.msg);
        status = EXIT_FAIL;
    }
    status = agree(comm, status);
    if (!status && rank == 0) {
        char a[32], lb[128];
        uint64_t total = 0;
        for (size_t i = 0; i < m.n; i++) {
            uint64_t b = tsr_dtype_size(m.t[i].dtype);
            for (uint32_t d = 0; d < m.t[i].ndim; d++) b *= m.t[i].shape[d];
            total += b;
        }
        tsr_layout_format(&l, lb, sizeof lb);
        printf("wrote %s: %zu tensors, %s raw, step %llu, %u rank(s) in layout %s, %.3f s\n", o.dir, m.n,
               tsr_fmt_bytes(total, a, sizeof a), (unsigned long long)o.step, ranks, lb, secs);
    }
    rank_state_free(&rs);
    model_free(&m);
    tsr_comm_free(comm);
    return status;
}
