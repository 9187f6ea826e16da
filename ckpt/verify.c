/* verify.c: tsr_ckpt_verify, every frame of a checkpoint read and checked
 * (checksums, padding, decoding), every byte of its data files accounted for,
 * and each tensor's digest and statistics recomputed. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "pool.h"
#include "read_impl.h"

typedef struct verify_ctx {
    tsr_ckpt *ck;
    uint32_t *order;        /* frames sorted by (file, offset) */
    const char **owner;     /* name of each frame's tensor or blob */
    int *dtype;             /* dtype of each frame */
    frame_buf *bufs;        /* per worker */
    tsr_codec **codecs;     /* per worker */
    pthread_mutex_t mu;
    tsr_problem_fn problem;
    void *user;
    long problems;
    int *file_bad;          /* per file: 1 when open/size/header failed (reported once) */
    uint32_t *chunk_of;     /* each frame's chunk, or UINT32_MAX for a blob's */
    uint64_t *keys;         /* each tensor's digest key */
    uint64_t *share;        /* each frame's share of its tensor's digest, once read */
    tsr_stats *stats;       /* each frame's statistics, once read (a tensor with TSR_MF_STATS) */
    uint8_t *read_ok;       /* each frame: 1 once read, checked and decoded */
} verify_ctx;

static void report(verify_ctx *v, const char *msg) {
    pthread_mutex_lock(&v->mu);
    v->problems++;
    if (v->problem) v->problem(v->user, msg);
    pthread_mutex_unlock(&v->mu);
}

static void verify_frame(void *ctx, size_t i, int worker) {
    verify_ctx *v = ctx;
    size_t fi = v->order[i];
    const tsr_mf_frame *f = &v->ck->m.frames[fi];
    size_t file = ckpt_file_index(v->ck, f->file_id);
    if (v->file_bad[file]) return;
    tsr_error e = {0};
    tsr_rfile *rf;
    if (ckpt_open_file(v->ck, file, &rf, &e)) return; /* reported per file */
    int rc = ckpt_read_frame(v->ck, fi, v->dtype[fi], v->owner[fi], &v->bufs[worker], NULL, v->codecs[worker], 0, &e);
    if (rc) {
        report(v, e.msg);
        return;
    }
    v->read_ok[fi] = 1;
    uint32_t ci = v->chunk_of[fi];
    if (ci == UINT32_MAX) return;
    const tsr_mf_chunk *c = &v->ck->m.chunks[ci];
    const tsr_mf_tensor *t = &v->ck->m.tensors[c->tensor];
    tsr_box fb;
    tsr_frame_box(c, fi - c->frame_first, &fb);
    const uint8_t *raw = v->bufs[worker].out;
    int dig = (t->digest_flags & TSR_MF_DIGEST) != 0, st = (t->digest_flags & TSR_MF_STATS) && tsr_stats_dtype(t->dtype);
    if (st) tsr_stats_init(&v->stats[fi]);
    if (dig && st) v->share[fi] = tsr_digest_stats_box(t->dtype, t->shape, &fb, raw, &v->stats[fi]);
    else if (dig) v->share[fi] = tsr_digest_box(tsr_dtype_size(t->dtype), t->shape, &fb, raw);
    else if (st) tsr_stats_run(t->dtype, raw, tsr_box_volume(&fb), &v->stats[fi]);
}

/* The statistics recomputed (acc, the sum of squares in l2) against the
 * MANIFEST's (FORMAT.md 4.5): min, max and the count exactly, l2 within a
 * relative 1e-9 (the sums' order is free). @return 1 when they agree. */
static int stats_agree(tsr_stats acc, const tsr_stats *rec, char *why, size_t len) {
    tsr_stats_finish(&acc);
    double tol = 1e-9 * (rec->l2 > acc.l2 ? rec->l2 : acc.l2);
    if (acc.nonfinite != rec->nonfinite)
        snprintf(why, len, "%llu non-finite elements, the MANIFEST says %llu", (unsigned long long)acc.nonfinite,
                 (unsigned long long)rec->nonfinite);
    else if (acc.min != rec->min || acc.max != rec->max)
        snprintf(why, len, "min %.9g and max %.9g, the MANIFEST says %.9g and %.9g", acc.min, acc.max, rec->min,
                 rec->max);
    else if (!(fabs(acc.l2 - rec->l2) <= tol) && !(isinf(acc.l2) && acc.l2 == rec->l2))
        snprintf(why, len, "L2 norm %.17g, the MANIFEST says %.17g", acc.l2, rec->l2);
    else
        return 1;
    return 0;
}

/* Each recorded digest against its key and its frames' shares (xor), and the recorded
 * statistics against its frames'; a tensor with a frame that could not be read
 * is reported already. */
static void verify_digests(verify_ctx *v) {
    const tsr_manifest *m = &v->ck->m;
    for (size_t ti = 0; ti < m->n_tensors; ti++) {
        const tsr_mf_tensor *t = &m->tensors[ti];
        int dig = (t->digest_flags & TSR_MF_DIGEST) != 0, st = (t->digest_flags & TSR_MF_STATS) && tsr_stats_dtype(t->dtype);
        if (!dig && !st) continue;
        uint64_t sum = v->keys[ti];
        tsr_stats acc;
        tsr_stats_init(&acc);
        int whole = 1;
        for (uint32_t c = t->chunk_first; c < t->chunk_first + t->chunk_count; c++)
            for (uint32_t k = 0; k < m->chunks[c].frame_count; k++) {
                size_t fi = m->chunks[c].frame_first + k;
                whole &= v->read_ok[fi];
                sum ^= v->share[fi];
                if (st) tsr_stats_merge(&acc, &v->stats[fi]);
            }
        if (!whole) continue;
        char msg[PATH_MAX + 700], why[300];
        if (dig && sum != t->digest) {
            snprintf(msg, sizeof msg,
                     "%s: tensor %s: its data's digest is %016llx, the MANIFEST's %016llx (the frames' checksums hold: "
                     "the data is not the tensor that was saved)",
                     v->ck->dir, t->name, (unsigned long long)sum, (unsigned long long)t->digest);
            report(v, msg);
        } else if (st && !stats_agree(acc, &t->stats, why, sizeof why)) {
            snprintf(msg, sizeof msg, "%s: tensor %s: its data's statistics differ from the MANIFEST's: %s", v->ck->dir,
                     t->name, why);
            report(v, msg);
        }
    }
}

/* Every byte of a data file is header (checked by open_file), frame bytes (stored
 * hash) or padding after a frame (checked zero by read_frame): the manifest's
 * packing rule and exact file size leave no other bytes. */
long tsr_ckpt_verify(tsr_ckpt *ck, tsr_problem_fn problem, void *user, int threads, tsr_error *err) {
    const tsr_manifest *m = &ck->m;
    verify_ctx v = {.ck = ck, .problem = problem, .user = user};
    pthread_mutex_init(&v.mu, NULL);
    tsr_pool *pool = tsr_pool_new(threads);
    long rc = 0;
    v.order = malloc((m->n_frames + 1) * sizeof *v.order);
    v.owner = malloc((m->n_frames + 1) * sizeof *v.owner);
    v.dtype = malloc((m->n_frames + 1) * sizeof *v.dtype);
    v.file_bad = calloc(m->n_files + 1, sizeof *v.file_bad);
    v.chunk_of = malloc((m->n_frames + 1) * sizeof *v.chunk_of);
    v.keys = malloc((m->n_tensors + 1) * sizeof *v.keys);
    v.share = calloc(m->n_frames + 1, sizeof *v.share);
    v.stats = calloc(m->n_frames + 1, sizeof *v.stats);
    v.read_ok = calloc(m->n_frames + 1, 1);
    char **blob_owner = calloc(m->n_blobs + 1, sizeof *blob_owner);
    int nw = pool ? tsr_pool_size(pool) : 0;
    v.bufs = calloc((size_t)nw + 1, sizeof *v.bufs);
    v.codecs = calloc((size_t)nw + 1, sizeof *v.codecs);
    if (!pool || !v.order || !v.owner || !v.dtype || !v.file_bad || !blob_owner || !v.bufs || !v.codecs ||
        !v.chunk_of || !v.keys || !v.share || !v.stats || !v.read_ok) {
        rc = tsr_err(err, TSR_ENOMEM, "out of memory");
        goto out;
    }
    for (int w = 0; w < nw; w++)
        if (!(v.codecs[w] = tsr_codec_new())) {
            rc = tsr_err(err, TSR_ENOMEM, "out of memory");
            goto out;
        }
    for (size_t i = 0; i < m->n_chunks; i++) {
        const tsr_mf_chunk *c = &m->chunks[i];
        for (uint32_t k = 0; k < c->frame_count; k++) {
            v.owner[c->frame_first + k] = m->tensors[c->tensor].name;
            v.dtype[c->frame_first + k] = m->tensors[c->tensor].dtype;
            v.chunk_of[c->frame_first + k] = (uint32_t)i;
        }
    }
    for (size_t i = 0; i < m->n_tensors; i++) v.keys[i] = tsr_digest_key(m->tensors[i].name, m->tensors[i].dtype);
    for (size_t i = 0; i < m->n_blobs; i++) {
        const tsr_mf_blob *b = &m->blobs[i];
        size_t len = strlen(b->name) + 32;
        blob_owner[i] = malloc(len);
        if (!blob_owner[i]) {
            rc = tsr_err(err, TSR_ENOMEM, "out of memory");
            goto out;
        }
        snprintf(blob_owner[i], len, "blob %s (rank %d)", b->name, b->rank);
        for (uint32_t k = 0; k < b->frame_count; k++) {
            v.owner[b->frame_first + k] = blob_owner[i];
            v.dtype[b->frame_first + k] = TSR_U8;
            v.chunk_of[b->frame_first + k] = UINT32_MAX;
        }
    }
    /* Each file: presence, size, header (once). */
    for (size_t fi = 0; fi < m->n_files; fi++) {
        tsr_error e = {0};
        tsr_rfile *rf;
        if (ckpt_open_file(ck, fi, &rf, &e)) {
            v.file_bad[fi] = 1;
            report(&v, e.msg);
        }
    }
    for (size_t i = 0; i < m->n_frames; i++) v.order[i] = (uint32_t)i;
    tsr_sort_ctx(v.order, m->n_frames, sizeof *v.order, tsr_mf_cmp_frame_pos, (void *)m);
    tsr_pool_for(pool, m->n_frames, verify_frame, &v);
    verify_digests(&v);
    rc = v.problems;
out:
    if (v.codecs)
        for (int w = 0; w < nw; w++) tsr_codec_free(v.codecs[w]);
    if (v.bufs)
        for (int w = 0; w < nw; w++) ckpt_frame_buf_free(&v.bufs[w]);
    if (blob_owner)
        for (size_t i = 0; i < m->n_blobs; i++) free(blob_owner[i]);
    free(blob_owner);
    free(v.codecs), free(v.bufs), free(v.order), free(v.owner), free(v.dtype), free(v.file_bad);
    free(v.chunk_of), free(v.keys), free(v.share), free(v.stats), free(v.read_ok);
    tsr_pool_free(pool);
    pthread_mutex_destroy(&v.mu);
    return rc;
}
