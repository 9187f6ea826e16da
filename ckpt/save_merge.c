/* save_merge.c: the commit's merge of the writers' tables into the MANIFEST
 * (rank 0, tsr_save_commit): tensors declared alike by every writer, their
 * chunks, frames, blobs and files renumbered into one table; the digests'
 * and statistics' shares combined (FORMAT.md 4.4, 4.5). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "save_impl.h"
#include "tsr_ckpt.h"

static uint64_t name_hash(const char *s) { return tsr_hash(s, strlen(s)); }

long save_index_find(const name_index *x, const tsr_manifest *m, const char *name) {
    if (!x->cap) return -1;
    size_t mask = x->cap - 1;
    for (size_t h = name_hash(name) & mask;; h = (h + 1) & mask) {
        uint32_t v = x->slot[h];
        if (v == UINT32_MAX) return -1;
        if (strcmp(m->tensors[v].name, name) == 0) return v;
    }
}

int save_index_insert(name_index *x, const tsr_manifest *m, uint32_t v) {
    if ((m->n_tensors + 1) * 2 > x->cap) {
        size_t cap = x->cap ? x->cap * 2 : 64;
        uint32_t *idx = malloc(cap * sizeof *idx);
        if (!idx) return TSR_ENOMEM;
        memset(idx, 0xff, cap * sizeof *idx);
        for (size_t i = 0; i < x->cap; i++) {
            uint32_t w = x->slot[i];
            if (w == UINT32_MAX) continue;
            size_t h = name_hash(m->tensors[w].name) & (cap - 1);
            while (idx[h] != UINT32_MAX) h = (h + 1) & (cap - 1);
            idx[h] = w;
        }
        free(x->slot);
        x->slot = idx;
        x->cap = cap;
    }
    size_t h = name_hash(m->tensors[v].name) & (x->cap - 1);
    while (x->slot[h] != UINT32_MAX) h = (h + 1) & (x->cap - 1);
    x->slot[h] = v;
    return 0;
}

static int same_decl(const tsr_mf_tensor *u, const tsr_mf_tensor *t) {
    return u->dtype == t->dtype && u->ndim == t->ndim && strcmp(u->group, t->group) == 0 &&
           memcmp(u->shape, t->shape, sizeof u->shape) == 0 &&
           u->placement.tp_dim == t->placement.tp_dim && u->placement.fsdp == t->placement.fsdp &&
           u->placement.pp_role == t->placement.pp_role && u->placement.layer == t->placement.layer;
}

/* The merge of the writers' tables, one table at a time: each parsed, added
 * and freed before the next, so that the merged manifest is the only copy. */
typedef struct merger {
    tsr_manifest *out;
    name_index names;      /* out's tensors */
    uint32_t *first;       /* the writer that first declared each of out's tensors */
    size_t cap_first;
} merger;

/* Adds writer w's table p to the merged manifest. Declarations of one tensor
 * by several writers must agree. */
static int merge_table(merger *g, const tsr_manifest *p, uint32_t w, tsr_error *err) {
    tsr_manifest *out = g->out;
    uint32_t *remap = malloc((p->n_tensors + 1) * sizeof *remap);
    if (!remap) goto nomem;
    for (size_t j = 0; j < p->n_tensors; j++) {
        const tsr_mf_tensor *t = &p->tensors[j];
        long v = save_index_find(&g->names, out, t->name);
        if (v >= 0 && !same_decl(&out->tensors[v], t)) {
            free(remap);
            return tsr_err(err, TSR_EINVAL,
                           "tensor %s: writers %u and %u declare it differently (dtype, shape, group or placement)",
                           t->name, g->first[v], w);
        }
        if (v < 0) {
            tsr_mf_tensor c = *t;
            c.chunk_first = c.chunk_count = 0;
            v = (long)out->n_tensors;
            if (tsr_manifest_add_tensor(out, &c) || save_index_insert(&g->names, out, (uint32_t)v) ||
                tsr_grow((void **)&g->first, &g->cap_first, (size_t)v, sizeof *g->first))
                goto nomem;
            g->first[v] = w;
        } else { /* the shares of the digest and statistics combine, known only when every writer's is */
            out->tensors[v].digest ^= t->digest;
            tsr_stats_merge(&out->tensors[v].stats, &t->stats);
            out->tensors[v].digest_flags &= t->digest_flags;
        }
        remap[j] = (uint32_t)v;
    }
    uint32_t fbase = (uint32_t)out->n_frames;
    for (size_t j = 0; j < p->n_frames; j++)
        if (tsr_manifest_add_frame(out, &p->frames[j])) goto nomem;
    for (size_t j = 0; j < p->n_chunks; j++) {
        tsr_mf_chunk c = p->chunks[j];
        c.tensor = remap[c.tensor];
        c.frame_first += fbase;
        if (tsr_manifest_add_chunk(out, &c)) goto nomem;
    }
    for (size_t j = 0; j < p->n_blobs; j++) {
        tsr_mf_blob b = p->blobs[j];
        b.frame_first += fbase;
        if (tsr_manifest_add_blob(out, &b)) goto nomem;
    }
    for (size_t j = 0; j < p->n_files; j++)
        if (tsr_manifest_add_file(out, &p->files[j])) goto nomem;
    free(remap);
    return 0;
nomem:
    free(remap);
    return tsr_err(err, TSR_ENOMEM, "out of memory merging tables");
}

/* Each digest whose shares every writer gave (their xor, the tensor's CRC)
 * finished with the tensor's key; then what was declared whole
 * (tsr_save_tensor_digest, tsr_save_tensor_stats) against them: a digest must
 * equal the finished one where every writer's share is known, else it is
 * recorded; statistics are recorded where the shares are missing. Then each
 * tensor's statistics are finished, and the header is marked poisoned when
 * one counts a non-finite element. */
static int apply_declared(merger *g, const declared *dec, size_t n_dec, tsr_error *err) {
    for (size_t v = 0; v < g->out->n_tensors; v++) {
        tsr_mf_tensor *t = &g->out->tensors[v];
        if (t->digest_flags & TSR_MF_DIGEST) t->digest ^= tsr_digest_key(t->name, t->dtype);
    }
    for (size_t i = 0; i < n_dec; i++) {
        long v = save_index_find(&g->names, g->out, dec[i].name);
        if (v < 0) continue;
        tsr_mf_tensor *t = &g->out->tensors[v];
        if ((dec[i].has & TSR_MF_DIGEST) && (t->digest_flags & TSR_MF_DIGEST) && t->digest != dec[i].digest)
            return tsr_err(err, TSR_ECORRUPT,
                           "tensor %s: the digest of the data written is %016llx, the tensor's (as declared) %016llx",
                           t->name, (unsigned long long)t->digest, (unsigned long long)dec[i].digest);
        if (dec[i].has & TSR_MF_DIGEST) t->digest = dec[i].digest;
        if ((dec[i].has & TSR_MF_STATS) && !(t->digest_flags & TSR_MF_STATS)) {
            t->stats = dec[i].stats;
            t->stats.l2 *= t->stats.l2; /* a share, finished below */
        }
        t->digest_flags |= dec[i].has;
    }
    for (size_t v = 0; v < g->out->n_tensors; v++) {
        tsr_mf_tensor *t = &g->out->tensors[v];
        if (!(t->digest_flags & TSR_MF_STATS)) {
            tsr_stats_init(&t->stats);
            continue;
        }
        tsr_stats_finish(&t->stats);
        if (t->stats.nonfinite) g->out->flags |= TSR_MF_POISONED;
    }
    return 0;
}

int save_merge_tables(const uint8_t *const *tables, const size_t *table_lens, size_t n, const uint8_t save_id[16],
                      uint64_t step, uint64_t epoch, const tsr_layout *layout, const declared *dec, size_t n_dec,
                      uint8_t **bytes, size_t *len, tsr_error *err) {
    tsr_manifest m;
    tsr_manifest_init(&m);
    merger g = {&m, {NULL, 0}, NULL, 0};
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        char what[64];
        tsr_manifest part;
        snprintf(what, sizeof what, "table of writer %zu", i);
        if ((rc = tsr_manifest_parse(tables[i], table_lens[i], what, TSR_MF_PARTIAL, &part, err))) break;
        if (memcmp(part.save_id, save_id, 16) != 0)
            rc = tsr_err(err, TSR_EINVAL, "table of writer %zu belongs to another save", i);
        if (!rc) rc = merge_table(&g, &part, (uint32_t)i, err);
        tsr_manifest_free(&part);
    }
    if (!rc) rc = apply_declared(&g, dec, n_dec, err);
    free(g.names.slot);
    free(g.first);
    if (rc) goto out;
    m.step = step;
    m.epoch = epoch;
    memcpy(m.save_id, save_id, 16);
    m.layout = layout ? *layout : (tsr_layout){1, 1, 1, 1, 0, 0};
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    m.created = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    if ((rc = tsr_manifest_sort(&m, err))) goto out;
    if ((rc = tsr_manifest_validate(&m, "MANIFEST", 0, err))) goto out;
    rc = tsr_manifest_encode(&m, 0, bytes, len, err);
out:
    tsr_manifest_free(&m);
    return rc;
}

int tsr_manifest_merge(const uint8_t *const *tables, const size_t *table_lens, size_t n, const uint8_t save_id[16],
                       uint64_t step, const tsr_layout *layout, uint8_t **bytes, size_t *len, tsr_error *err) {
    return save_merge_tables(tables, table_lens, n, save_id, step, 0, layout, NULL, 0, bytes, len, err);
}
