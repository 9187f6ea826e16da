/* manifest_encode.c: the bytes of a MANIFEST (FORMAT.md section 4.1): the header,
 * the section table, then the six sections, STRINGS first, CHUNKS and FRAMES
 * packed (4.3). */
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "manifest.h"
#include "manifest_impl.h"

#include <zstd.h>

#define N_SEC 6 /* STRINGS, FILES, TENSORS, CHUNKS, FRAMES, BLOBS: types 1..6 */
#define PACK_LEVEL 3 /* zstd's level for packed sections */

static const uint32_t rec_size[N_SEC] = {1, TSR_REC_FILE, TSR_REC_TENSOR_V14, TSR_REC_CHUNK, TSR_REC_FRAME,
                                         TSR_REC_BLOB};

static int sbuf_zero(tsr_sbuf *b, size_t n) {
    if (n == 0) return 0;
    if (tsr_sb_reserve(b, n)) return TSR_ENOMEM;
    memset(b->p + b->n, 0, n);
    b->n += n;
    return 0;
}

/* Interns string s into the STRINGS buffer; returns its offset. Consecutive
 * identical strings (the group of each tensor) are stored once. */
typedef struct strtab {
    tsr_sbuf b;
    const char *last;
    uint32_t last_off;
} strtab;

static int strtab_add(strtab *st, const char *s, uint32_t *off, uint32_t *len) {
    size_t n = strlen(s);
    if (st->last && strcmp(st->last, s) == 0) {
        *off = st->last_off;
        *len = (uint32_t)n;
        return 0;
    }
    if (tsr_sb_reserve(&st->b, n)) return TSR_ENOMEM;
    *off = (uint32_t)st->b.n;
    *len = (uint32_t)n;
    memcpy(st->b.p + st->b.n, s, n);
    st->b.n += n;
    st->last = s;
    st->last_off = *off;
    return 0;
}

/* ------------------------------------------------------------- records */
/* Each writes its section's records into p (zeroed, count x record size). */

static void put_files(const tsr_manifest *m, uint8_t *p) {
    for (size_t i = 0; i < m->n_files; i++, p += TSR_REC_FILE) {
        tsr_st32(p, m->files[i].id);
        tsr_st64(p + 8, m->files[i].size);
    }
}

/* @return 0, or TSR_ENOMEM from the string table. */
static int put_tensors(const tsr_manifest *m, strtab *st, uint8_t *p) {
    for (size_t i = 0; i < m->n_tensors; i++, p += TSR_REC_TENSOR_V14) {
        const tsr_mf_tensor *t = &m->tensors[i];
        uint32_t off, len;
        if (strtab_add(st, t->name, &off, &len)) return TSR_ENOMEM;
        tsr_st32(p, off), tsr_st32(p + 4, len);
        if (strtab_add(st, t->group, &off, &len)) return TSR_ENOMEM;
        tsr_st32(p + 8, off), tsr_st32(p + 12, len);
        p[16] = (uint8_t)t->dtype;
        p[17] = (uint8_t)t->ndim;
        p[18] = (uint8_t)t->placement.tp_dim;
        p[19] = t->placement.fsdp;
        p[20] = t->placement.pp_role;
        tsr_st32(p + 24, (uint32_t)t->placement.layer);
        tsr_st32(p + 28, t->chunk_first);
        tsr_st32(p + 32, t->chunk_count);
        for (uint32_t d = 0; d < t->ndim && d < TSR_MAX_DIMS; d++) tsr_st64(p + 40 + 8 * d, t->shape[d]);
        /* v1.2's digest (offset 104, bit 0) is never written */
        if (t->digest_flags & TSR_MF_DIGEST) { /* v1.4 (4.4): else zero */
            tsr_st64(p + 152, t->digest);
            tsr_st32(p + 112, TSR_MF_DIGEST);
        }
        if (t->digest_flags & TSR_MF_STATS) { /* v1.3 (4.5): else all zero */
            tsr_st32(p + 112, tsr_ld32(p + 112) | TSR_MF_STATS);
            tsr_st64(p + 120, tsr_f64_bits(t->stats.min));
            tsr_st64(p + 128, tsr_f64_bits(t->stats.max));
            tsr_st64(p + 136, tsr_f64_bits(t->stats.l2));
            tsr_st64(p + 144, t->stats.nonfinite);
        }
    }
    return 0;
}

/* Records first .. first + n - 1 of CHUNKS (and below, of FRAMES). */
static void put_chunks(const tsr_manifest *m, size_t first, size_t n, uint8_t *p) {
    for (size_t i = first; i < first + n; i++, p += TSR_REC_CHUNK) {
        const tsr_mf_chunk *c = &m->chunks[i];
        tsr_st32(p, c->tensor);
        tsr_st32(p + 4, c->file_id);
        tsr_st32(p + 8, c->frame_first);
        tsr_st32(p + 12, c->frame_count);
        p[16] = (uint8_t)c->split_dim;
        tsr_st64(p + 24, c->frame_rows);
        for (uint32_t d = 0; d < c->box.ndim && d < TSR_MAX_DIMS; d++) {
            tsr_st64(p + 32 + 8 * d, c->box.offset[d]);
            tsr_st64(p + 96 + 8 * d, c->box.extent[d]);
        }
    }
}

static void put_frames(const tsr_manifest *m, size_t first, size_t n, uint8_t *p) {
    for (size_t i = first; i < first + n; i++, p += TSR_REC_FRAME) {
        const tsr_mf_frame *f = &m->frames[i];
        tsr_st64(p, f->offset);
        tsr_st64(p + 8, f->stored_size);
        tsr_st64(p + 16, f->raw_size);
        tsr_st64(p + 24, f->raw_hash);
        tsr_st64(p + 32, f->stored_hash);
        p[40] = (uint8_t)f->codec;
    }
}

/* @return 0, or TSR_ENOMEM from the string table. */
static int put_blobs(const tsr_manifest *m, strtab *st, uint8_t *p) {
    for (size_t i = 0; i < m->n_blobs; i++, p += TSR_REC_BLOB) {
        const tsr_mf_blob *b = &m->blobs[i];
        uint32_t off, len;
        if (strtab_add(st, b->name, &off, &len)) return TSR_ENOMEM;
        tsr_st32(p, off), tsr_st32(p + 4, len);
        tsr_st32(p + 8, (uint32_t)b->rank);
        tsr_st32(p + 12, b->file_id);
        tsr_st32(p + 16, b->frame_first);
        tsr_st32(p + 20, b->frame_count);
        tsr_st64(p + 24, b->size);
    }
    return 0;
}

/* --------------------------------------------------------------- file */

/* The header: magic, version, sizes, step, save id, layout, epoch. */
static void put_header(const tsr_manifest *m, uint8_t *buf, size_t total) {
    memcpy(buf, TSR_MF_MAGIC, 8);
    tsr_st16(buf + 8, TSR_FORMAT_MAJOR);
    tsr_st16(buf + 10, TSR_FORMAT_MINOR);
    tsr_st32(buf + 12, TSR_MF_HEADER_SIZE);
    tsr_st64(buf + 16, total);
    tsr_st64(buf + 24, m->step);
    memcpy(buf + 32, m->save_id, 16);
    tsr_st32(buf + 48, N_SEC);
    tsr_st32(buf + 52, m->flags & TSR_MF_POISONED);
    tsr_st64(buf + 56, m->created);
    tsr_st32(buf + 64, m->layout.pp);
    tsr_st32(buf + 68, m->layout.dp_replicate);
    tsr_st32(buf + 72, m->layout.dp_shard);
    tsr_st32(buf + 76, m->layout.tp);
    tsr_st32(buf + 80, m->layout.n_layers);
    tsr_st32(buf + 84, m->layout.flags);
    tsr_st64(buf + 88, m->epoch);
}

/* Lays out the header, the section table and the sections (each 8-aligned, of
 * types types[s]), then the checksum, into one malloc'ed buffer. */
static int assemble(const tsr_manifest *m, const tsr_sbuf recs[N_SEC], const uint32_t types[N_SEC],
                    const size_t counts[N_SEC], uint8_t **out, size_t *out_len, tsr_error *err) {
    size_t off = tsr_align_up(TSR_MF_HEADER_SIZE + N_SEC * 32, 8), offs[N_SEC];
    for (int s = 0; s < N_SEC; s++) {
        offs[s] = off;
        off = tsr_align_up(off + recs[s].n, 8);
    }
    size_t total = off + 8;
    if (total > TSR_MF_MAX_SIZE)
        return tsr_err(err, TSR_EINVAL, "manifest would be %zu bytes, over the 4 GiB limit", total);
    uint8_t *buf = calloc(1, total);
    if (!buf) return tsr_err(err, TSR_ENOMEM, "out of memory encoding the manifest");
    put_header(m, buf, total);
    for (int s = 0; s < N_SEC; s++) {
        uint8_t *e = buf + TSR_MF_HEADER_SIZE + 32 * s;
        tsr_st32(e, types[s]);
        tsr_st32(e + 4, 1); /* every v1 section is required */
        tsr_st64(e + 8, offs[s]);
        tsr_st64(e + 16, recs[s].n);
        tsr_st32(e + 24, rec_size[s]);
        tsr_st32(e + 28, (uint32_t)counts[s]);
        if (recs[s].n) memcpy(buf + offs[s], recs[s].p, recs[s].n);
    }
    tsr_st64(buf + total - 8, tsr_hash(buf, total - 8));
    *out = buf;
    *out_len = total;
    return 0;
}

typedef void (*put_fn)(const tsr_manifest *m, size_t first, size_t n, uint8_t *p);

/* Section records made by `put` (count records of rec bytes), packed into *out
 * (FORMAT.md 4.3): block by block, each byte-shuffled and fed to one zstd
 * frame, so that neither the records nor their shuffle are ever whole in memory. */
static int pack_section(const tsr_manifest *m, put_fn put, size_t rec, size_t count, tsr_sbuf *out, tsr_error *err) {
    size_t n = rec * count, bn = TSR_MF_PACK_BLOCK * rec;
    if (n > TSR_MF_MAX_PACKED)
        return tsr_err(err, TSR_EINVAL, "%zu bytes of manifest records, over the 4 GiB limit", n);
    ZSTD_CCtx *z = ZSTD_createCCtx();
    uint8_t *blk = malloc(bn), *shuf = malloc(bn);
    size_t r = z && blk && shuf ? ZSTD_CCtx_setParameter(z, ZSTD_c_compressionLevel, PACK_LEVEL) : 0;
    if (z && !ZSTD_isError(r)) r = ZSTD_CCtx_setPledgedSrcSize(z, n); /* the frame declares it */
    int rc = !z || !blk || !shuf ? tsr_err(err, TSR_ENOMEM, "out of memory encoding the manifest") : 0;
    for (size_t i0 = 0; !rc && !ZSTD_isError(r) && (i0 < count || i0 == 0); i0 += TSR_MF_PACK_BLOCK) {
        size_t k = count - i0 < TSR_MF_PACK_BLOCK ? count - i0 : TSR_MF_PACK_BLOCK;
        memset(blk, 0, k * rec);
        put(m, i0, k, blk);
        tsr_mf_transpose(blk, k, rec, shuf);
        ZSTD_inBuffer in = {shuf, k * rec, 0};
        ZSTD_EndDirective mode = i0 + k >= count ? ZSTD_e_end : ZSTD_e_continue;
        do {
            if (tsr_sb_reserve(out, ZSTD_CStreamOutSize())) {
                rc = tsr_err(err, TSR_ENOMEM, "out of memory encoding the manifest");
                break;
            }
            ZSTD_outBuffer o = {out->p + out->n, out->cap - out->n - 1, 0}; /* less the NUL */
            r = ZSTD_compressStream2(z, &o, &in, mode);
            out->n += o.pos;
        } while (!ZSTD_isError(r) && (mode == ZSTD_e_end ? r != 0 : in.pos < in.size));
    }
    if (!rc && ZSTD_isError(r)) rc = tsr_err(err, TSR_EINVAL, "packing manifest records: %s", ZSTD_getErrorName(r));
    ZSTD_freeCCtx(z);
    free(blk), free(shuf);
    return rc;
}

int tsr_manifest_encode(const tsr_manifest *m, unsigned flags, uint8_t **out, size_t *out_len, tsr_error *err) {
    strtab st = {0};
    tsr_sbuf recs[N_SEC] = {{0}};
    size_t counts[N_SEC] = {0, m->n_files, m->n_tensors, m->n_chunks, m->n_frames, m->n_blobs};
    uint32_t types[N_SEC] = {TSR_SEC_STRINGS, TSR_SEC_FILES, TSR_SEC_TENSORS, TSR_SEC_CHUNKS, TSR_SEC_FRAMES,
                             TSR_SEC_BLOBS};
    int pack = !(flags & TSR_MF_PLAIN), rc = 0, nomem = 0; /* packed: CHUNKS and FRAMES */
    for (int s = 1; s < N_SEC && !rc && !nomem; s++) {
        if (counts[s] > UINT32_MAX) rc = tsr_err(err, TSR_EINVAL, "too many records for one manifest section");
        else if (!pack || (s != 3 && s != 4)) nomem = sbuf_zero(&recs[s], counts[s] * rec_size[s]) != 0;
    }
    if (!rc && !nomem) {
        put_files(m, (uint8_t *)recs[1].p);
        /* names in this order */
        nomem = put_tensors(m, &st, (uint8_t *)recs[2].p) || put_blobs(m, &st, (uint8_t *)recs[5].p);
    }
    if (nomem) rc = tsr_err(err, TSR_ENOMEM, "out of memory encoding the manifest");
    if (!rc && !pack) {
        put_chunks(m, 0, m->n_chunks, (uint8_t *)recs[3].p);
        put_frames(m, 0, m->n_frames, (uint8_t *)recs[4].p);
    }
    if (!rc && pack) {
        rc = pack_section(m, put_chunks, rec_size[3], counts[3], &recs[3], err);
        if (!rc) rc = pack_section(m, put_frames, rec_size[4], counts[4], &recs[4], err);
        types[3] += TSR_SEC_PACKED, types[4] += TSR_SEC_PACKED;
    }
    recs[0] = st.b; /* the STRINGS section: one byte records */
    counts[0] = st.b.n;
    if (!rc) rc = assemble(m, recs, types, counts, out, out_len, err);
    for (int s = 0; s < N_SEC; s++) free(recs[s].p);
    return rc;
}
