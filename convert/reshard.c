/* reshard.c: tsr_reshard(), a committed checkpoint rewritten for another layout
 * in one process, streaming: every target rank's data file is written by a
 * writer of its own, each distinct box once (the save plan), read from the
 * source in pieces of bounded size (only the frames that overlap them), so
 * that memory stays at threads x piece bytes whatever the checkpoint's size. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "casts.h"
#include "common.h"
#include "encoder.h"
#include "lock.h"
#include "pool.h"
#include "tsr_convert.h"

tsr_reshard_opts tsr_reshard_opts_default(void) {
    tsr_reshard_opts o = {0};
    o.write = tsr_write_opts_default();
    o.piece_bytes = 16u << 20;
    return o;
}

typedef struct reshard_job {
    const tsr_reshard_opts *o;
    const char *dst;
    tsr_ckpt *src;
    tsr_tensor_decl *decls; /* the target's tensors */
    long *src_index;        /* each one's index in the source */
    const tsr_save_plan *plan;
    tsr_save **writers;
    uint32_t n_writers;
    size_t n_decls;
    uint8_t save_id[16];
    tsr_encoder **enc;      /* one per worker: a writer is begun and finished on one */
    const uint8_t **tables; /* each writer's table, from tsr_save_finish */
    size_t *table_lens;
    uint64_t total, done; /* raw bytes of the target, and written so far */
    uint64_t *src_share;  /* per target tensor of another dtype: the source digest's shares read */
    pthread_mutex_t mu;
    int rc;
    tsr_error err;
} reshard_job;

/* The global blob that names, for each tensor converted to another dtype, the
 * source's dtype and digest (its new digest is the output's own). */
#define SOURCE_BLOB "reshard.source_digests"

/* That blob's text: "NAME DTYPE DIGEST\n" (DIGEST in 16 hex digits) for each
 * converted tensor whose source records a digest; NULL when there is none.
 * malloc'd. */
static char *source_digests(const reshard_job *j, size_t *len) {
    size_t cap = 0, n = 0;
    char *text = NULL;
    for (size_t t = 0; t < j->n_decls; t++) {
        tsr_tensor_info si;
        uint64_t digest;
        tsr_ckpt_tensor(j->src, (size_t)j->src_index[t], &si);
        if (si.dtype == j->decls[t].dtype || tsr_ckpt_tensor_digest(j->src, (size_t)j->src_index[t], &digest) != 1)
            continue;
        size_t need = strlen(si.name) + 48;
        if (n + need > cap) {
            char *grown = realloc(text, cap = 2 * (n + need));
            if (!grown) {
                free(text);
                return NULL;
            }
            text = grown;
        }
        n += (size_t)snprintf(text + n, cap - n, "%s %s %016llx\n", si.name, tsr_dtype_name(si.dtype),
                              (unsigned long long)digest);
    }
    *len = n;
    return text;
}

/* Whether target box rb is made of whole chunks of the source, in the same
 * dtype and in a codec the target accepts: then they are copied as they are
 * stored (tsr_save_chunk_copy), neither decoded nor encoded. */
static int passthrough(const reshard_job *j, const tsr_rank_box *rb) {
    tsr_tensor_info si;
    tsr_ckpt_tensor(j->src, (size_t)j->src_index[rb->tensor], &si);
    if (si.dtype != j->decls[rb->tensor].dtype) return 0;
    uint64_t covered = 0;
    for (uint32_t k = si.first_chunk; k < si.first_chunk + si.n_chunks; k++) {
        tsr_chunk_info ci;
        tsr_ckpt_chunk(j->src, k, &ci);
        if (!tsr_box_intersect(&ci.box, &rb->box, NULL)) continue;
        if (!tsr_box_contains(&rb->box, &ci.box)) return 0;
        for (uint32_t f = 0; f < ci.n_frames && j->o->write.codec != TSR_CODEC_AUTO; f++) {
            tsr_frame_info fi;
            tsr_ckpt_frame(j->src, ci.first_frame + f, &fi);
            if (fi.codec != j->o->write.codec) return 0;
        }
        covered += tsr_box_volume(&ci.box);
    }
    return covered == tsr_box_volume(&rb->box);
}

/* Copies the source chunks that make up target box rb (passthrough() said so). */
static int copy_chunks(reshard_job *j, tsr_save *s, const tsr_rank_box *rb, tsr_error *e) {
    tsr_tensor_info si;
    tsr_ckpt_tensor(j->src, (size_t)j->src_index[rb->tensor], &si);
    int rc = 0;
    for (uint32_t k = si.first_chunk; k < si.first_chunk + si.n_chunks && !rc; k++) {
        tsr_chunk_info ci;
        tsr_ckpt_chunk(j->src, k, &ci);
        if (tsr_box_intersect(&ci.box, &rb->box, NULL)) rc = tsr_save_chunk_copy(s, j->decls[rb->tensor].name, j->src, k, e);
    }
    return rc;
}

static void progress(reshard_job *j, uint64_t bytes) {
    if (!j->o->progress) return;
    pthread_mutex_lock(&j->mu);
    j->done += bytes;
    j->o->progress(j->o->user, j->done, j->total);
    pthread_mutex_unlock(&j->mu);
}

/* Writer w (target rank w's data file), start to finish on one worker: its
 * tensors declared, its boxes piece by piece (read in the source dtype,
 * converted, written), its blobs, its table. */
static int write_writer(reshard_job *j, uint32_t w, int worker, uint8_t *in, uint8_t *out, tsr_error *e) {
    tsr_save *s = tsr_save_begin_with(j->dst, w, j->save_id, &j->o->write, j->enc[worker], e);
    if (!s) return e->code ? e->code : TSR_EIO;
    j->writers[w] = s;
    int rc = 0;
    for (size_t t = 0; t < j->n_decls && !rc; t++)
        rc = tsr_save_tensor(s, j->decls[t].name, j->decls[t].group, j->decls[t].dtype, j->decls[t].ndim,
                             j->decls[t].shape, &j->decls[t].placement, e);
    /* the committing writer: each tensor unconverted is the source's, digest
     * and statistics included, which the commit checks (the digest) against
     * what the writers decoded and records for the chunks copied as they are
     * stored */
    for (size_t t = 0; w == 0 && t < j->n_decls && !rc; t++) {
        tsr_tensor_info si;
        uint64_t digest;
        tsr_ckpt_tensor(j->src, (size_t)j->src_index[t], &si);
        tsr_stats st;
        if (si.dtype == j->decls[t].dtype && tsr_ckpt_tensor_digest(j->src, (size_t)j->src_index[t], &digest) == 1)
            rc = tsr_save_tensor_digest(s, j->decls[t].name, digest, e);
        if (!rc && si.dtype == j->decls[t].dtype && tsr_ckpt_tensor_stats(j->src, (size_t)j->src_index[t], &st) == 1)
            rc = tsr_save_tensor_stats(s, j->decls[t].name, &st, e);
    }
    size_t cap = j->o->piece_bytes;
    for (size_t i = 0; !rc && i < j->plan->n; i++) {
        if (j->plan->writer[i] != w) continue;
        const tsr_rank_box *rb = &j->plan->boxes[i];
        const tsr_tensor_decl *d = &j->decls[rb->tensor];
        if (passthrough(j, rb)) {
            if (!(rc = copy_chunks(j, s, rb, e))) progress(j, tsr_box_volume(&rb->box) * tsr_dtype_size(d->dtype));
            continue;
        }
        tsr_tensor_info si;
        tsr_ckpt_tensor(j->src, (size_t)j->src_index[rb->tensor], &si);
        size_t ses = tsr_dtype_size(si.dtype), tes = tsr_dtype_size(d->dtype);
        size_t widest = ses > tes ? ses : tes;
        uint64_t np = tsr_box_pieces(&rb->box, widest, cap);
        /* converted: the source digest's shares of what is read (the output's
         * digest is of the converted values, and proves nothing of the source) */
        uint64_t share = 0;
        for (uint64_t k = 0; !rc && k < np; k++) {
            tsr_box pc;
            tsr_box_piece(&rb->box, widest, cap, k, &pc);
            uint64_t n = tsr_box_volume(&pc);
            rc = tsr_ckpt_read(j->src, (size_t)j->src_index[rb->tensor], &pc, in, e);
            const uint8_t *data = in;
            if (!rc && si.dtype != d->dtype) {
                share ^= tsr_digest_box(ses, si.shape, &pc, in);
                for (uint64_t x = 0; x < n; x++) tsr_store_from_f64(d->dtype, out, x, tsr_load_f64(si.dtype, in, x));
                data = out;
            }
            if (!rc) rc = tsr_save_box(s, d->name, &pc, data, e);
            if (!rc) progress(j, n * tes);
        }
        pthread_mutex_lock(&j->mu);
        j->src_share[rb->tensor] ^= share;
        pthread_mutex_unlock(&j->mu);
    }
    if (w == 0 && !rc) { /* the converted tensors' source digests */
        size_t len = 0;
        char *text = source_digests(j, &len);
        if (text) rc = tsr_save_blob(s, SOURCE_BLOB, -1, text, len, e);
        free(text);
    }
    /* blobs: global ones and those of ranks the target lacks by writer 0, a
     * rank's own by that rank's writer */
    for (size_t b = 0; b < tsr_ckpt_n_blobs(j->src) && !rc; b++) {
        tsr_blob_info bi;
        tsr_ckpt_blob(j->src, b, &bi);
        if (!strcmp(bi.name, SOURCE_BLOB) && bi.rank < 0) continue; /* the source's own: this one's replaces it */
        uint32_t bw = bi.rank >= 0 && (uint32_t)bi.rank < j->n_writers ? (uint32_t)bi.rank : 0;
        if (bw != w) continue;
        uint8_t *buf = malloc(bi.size ? bi.size : 1);
        rc = buf ? tsr_ckpt_read_blob(j->src, b, buf, e) : tsr_err(e, TSR_ENOMEM, "out of memory for blob %s", bi.name);
        if (!rc) rc = tsr_save_blob(s, bi.name, bi.rank, buf, bi.size, e);
        free(buf);
    }
    if (!rc) rc = tsr_save_finish(s, &j->tables[w], &j->table_lens[w], e);
    return rc;
}

static void write_one(void *ctx, size_t w, int worker) {
    reshard_job *j = ctx;
    size_t cap = j->o->piece_bytes;
    uint8_t *in = malloc(cap), *out = malloc(cap);
    tsr_error e = {0};
    int rc = in && out ? 0 : tsr_err(&e, TSR_ENOMEM, "out of memory for %zu-byte pieces", cap);
    pthread_mutex_lock(&j->mu);
    rc = rc ? rc : j->rc; /* after a failure, the other writers stop */
    pthread_mutex_unlock(&j->mu);
    if (!rc) rc = write_writer(j, (uint32_t)w, worker, in, out, &e);
    free(in);
    free(out);
    if (rc) {
        pthread_mutex_lock(&j->mu);
        if (!j->rc) j->rc = rc, j->err = e;
        pthread_mutex_unlock(&j->mu);
    }
}

/* The target's tensors: the source's (model group only with model_only), float
 * ones in o->dtype when it is set. */
static int target_decls(reshard_job *j, size_t *n_out, tsr_error *err) {
    size_t n = tsr_ckpt_n_tensors(j->src), k = 0;
    j->decls = calloc(n + 1, sizeof *j->decls);
    j->src_index = calloc(n + 1, sizeof *j->src_index);
    if (!j->decls || !j->src_index) return tsr_err(err, TSR_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        tsr_tensor_info ti;
        tsr_ckpt_tensor(j->src, i, &ti);
        if (j->o->model_only && strcmp(ti.group, "model") != 0) continue;
        tsr_tensor_decl *d = &j->decls[k];
        *d = (tsr_tensor_decl){ti.name, ti.group, ti.dtype, ti.ndim, {0}, ti.placement};
        memcpy(d->shape, ti.shape, sizeof d->shape);
        if (j->o->dtype && tsr_dtype_is_float(ti.dtype)) d->dtype = j->o->dtype;
        j->src_index[k++] = (long)i;
    }
    *n_out = k;
    return 0;
}

/* The refusal of a layout in which more than half of the ranks would hold no
 * data (`empty` of them, or at least that many). */
static int refuse_wide(const char *src_dir, const tsr_layout *l, uint64_t empty, const char *at_least,
                       tsr_error *err) {
    char lt[160];
    tsr_layout_format(l, lt, sizeof lt);
    return tsr_err(err, TSR_EINVAL,
                   "%s: layout %s: %llu of its %u ranks would hold no data (%smore than half), yet each would "
                   "get a data file; choose fewer ranks, or force it (--force)",
                   src_dir, lt, (unsigned long long)empty, tsr_layout_size(l), at_least);
}

/* Each converted tensor's source, whole, against its MANIFEST digest: its key
 * and the shares the writers took as they read it. */
static int check_sources(const reshard_job *j, const char *src_dir, tsr_error *err) {
    for (size_t t = 0; t < j->n_decls; t++) {
        tsr_tensor_info si;
        uint64_t digest;
        tsr_ckpt_tensor(j->src, (size_t)j->src_index[t], &si);
        uint64_t got = tsr_digest_key(si.name, si.dtype) ^ j->src_share[t];
        if (si.dtype != j->decls[t].dtype && tsr_ckpt_tensor_digest(j->src, (size_t)j->src_index[t], &digest) == 1 &&
            digest != got)
            return tsr_err(err, TSR_ECORRUPT,
                           "%s: tensor %s: its data has digest %016llx, its MANIFEST records %016llx: not "
                           "the tensor saved; nothing written",
                           src_dir, si.name, (unsigned long long)got, (unsigned long long)digest);
    }
    return 0;
}

int tsr_reshard(const char *src_dir, const char *dst_dir, const tsr_reshard_opts *o, tsr_error *err) {
    if (o->dtype && !tsr_dtype_is_float(o->dtype))
        return tsr_err(err, TSR_EINVAL, "reshard: --dtype must be a floating type, not %s", tsr_dtype_name(o->dtype));
    if (o->piece_bytes < 4096) return tsr_err(err, TSR_EINVAL, "reshard: pieces of at least 4096 bytes");
    reshard_job j = {.o = o};
    tsr_pool *pool = NULL;
    pthread_mutex_init(&j.mu, NULL);
    tsr_save_plan plan = {0};
    tsr_rank_box **held = NULL;
    size_t *n_held = NULL, *esz = NULL, nt = 0;
    tsr_ckpt_out *out = NULL;
    int rc = 0;
    if (!(j.src = tsr_ckpt_open(src_dir, err))) {
        pthread_mutex_destroy(&j.mu);
        return err ? err->code : TSR_EIO;
    }
    tsr_layout l = o->layout;
    tsr_layout from = tsr_ckpt_layout(j.src);
    if (!l.n_layers) l.n_layers = from.n_layers;
    uint32_t nr = tsr_layout_size(&l);
    if ((rc = target_decls(&j, &nt, err))) goto out;
    /* Every target rank gets a data file: a layout far wider than the checkpoint
     * would write mostly empty ones. The bound refuses most such layouts before
     * anything is done per rank (a layout may have 2^31 ranks); the boxes of
     * every rank, below, the others. */
    uint64_t most = tsr_layout_max_holders(&l, j.decls, nt);
    if (!o->force && nr > 1 && most < nr && nr - most > nr / 2) {
        rc = refuse_wide(src_dir, &l, nr - most, "at least that many, ", err);
        goto out;
    }
    held = calloc(nr, sizeof *held);
    n_held = calloc(nr, sizeof *n_held);
    esz = calloc(nt + 1, sizeof *esz);
    j.writers = calloc(nr, sizeof *j.writers);
    if (!held || !n_held || !esz || !j.writers) {
        rc = tsr_err(err, TSR_ENOMEM, "out of memory");
        goto out;
    }
    for (size_t t = 0; t < nt; t++) esz[t] = tsr_dtype_size(j.decls[t].dtype);
    uint32_t empty = 0;
    for (uint32_t r = 0; r < nr && !rc; r++) {
        rc = tsr_layout_boxes(&l, j.decls, nt, r, &held[r], &n_held[r], err);
        if (!rc && !n_held[r]) { /* an empty rank costs no memory */
            free(held[r]);
            held[r] = NULL;
            empty++;
        }
    }
    if (rc) goto out;
    if (!o->force && nr > 1 && empty > nr / 2) {
        rc = refuse_wide(src_dir, &l, empty, "", err);
        goto out;
    }
    rc = tsr_save_plan_build((const tsr_rank_box *const *)held, n_held, nr, esz, &plan, err);
    if (rc) goto out;
    for (size_t i = 0; i < plan.n; i++) j.total += tsr_box_volume(&plan.boxes[i].box) * esz[plan.boxes[i].tensor];
    /* DST has one writer, and appears only once committed (lock.h) */
    if ((rc = tsr_ckpt_out_begin(dst_dir, &out, err))) goto out;
    j.plan = &plan;
    j.n_writers = nr;
    j.n_decls = nt;
    j.dst = tsr_ckpt_out_dir(out);
    if (getrandom(j.save_id, sizeof j.save_id, 0) != (ssize_t)sizeof j.save_id) memset(j.save_id, 0x5a, 16);
    /* the cores: writers at once (all of them when there are at most twice as
     * many as cores, so that none runs alone at the end), each encoding on its
     * share of the cores */
    long cores = o->threads > 0 ? o->threads : sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1) cores = 1;
    long writers = (long)nr <= 2 * cores ? (long)nr : cores;
    int enc_threads = cores / writers > 1 ? (int)(cores / writers) : 1;
    pool = tsr_pool_new((int)writers);
    int nw = pool ? tsr_pool_size(pool) : 0;
    j.enc = calloc((size_t)nw + 1, sizeof *j.enc);
    j.tables = calloc(nr, sizeof *j.tables);
    j.table_lens = calloc(nr, sizeof *j.table_lens);
    if (!pool || !j.enc || !j.tables || !j.table_lens) {
        rc = tsr_err(err, TSR_ENOMEM, "out of memory");
        goto out;
    }
    for (int w = 0; w < nw && !rc; w++)
        if (!(j.enc[w] = tsr_encoder_new(enc_threads, err))) rc = err ? err->code : TSR_ENOMEM;
    if (rc) goto out;
    if (!(j.src_share = calloc(nt + 1, sizeof *j.src_share))) {
        rc = tsr_err(err, TSR_ENOMEM, "out of memory");
        goto out;
    }
    tsr_pool_for(pool, nr, write_one, &j);
    if ((rc = j.rc)) {
        if (err) *err = j.err;
        goto out;
    }
    if ((rc = check_sources(&j, src_dir, err))) goto out;
    rc = tsr_save_commit(j.writers[0], j.tables, j.table_lens, nr, tsr_ckpt_step(j.src), &l, err);
out:
    for (uint32_t w = 0; j.writers && w < nr; w++) {
        if (rc && j.writers[w]) tsr_save_abort(j.writers[w]);
        tsr_save_free(j.writers[w]);
    }
    int end = tsr_ckpt_out_end(out, !rc, err); /* DST renamed into place, or what this run wrote removed */
    rc = rc ? rc : end;
    for (uint32_t r = 0; held && r < nr; r++) free(held[r]);
    free(held);
    free(n_held);
    free(esz);
    free(j.writers);
    free(j.decls);
    free(j.src_index);
    free(j.src_share);
    tsr_save_plan_free(&plan);
    for (int w = 0; j.enc && w < (pool ? tsr_pool_size(pool) : 0); w++) tsr_encoder_free(j.enc[w]);
    free(j.enc);
    free(j.tables);
    free(j.table_lens);
    tsr_pool_free(pool);
    tsr_ckpt_close(j.src);
    pthread_mutex_destroy(&j.mu);
    return rc;
}
