/* manifest_parse.c: a MANIFEST's bytes into records (FORMAT.md sections 4.1-4.3):
 * the header and its checksum, the section table, each section's records (a
 * packed section's decoded block by block, once its count is justified); then
 * the validator (manifest_validate.c) checks the records against each other. */
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "manifest.h"
#include "manifest_impl.h"

#include <zstd.h>

/* The sections of types 1..6 (index 0 unused) as the section table places them,
 * not yet decoded. */
typedef struct sections {
    const uint8_t *at[7]; /* the stored bytes (set also when empty: present) */
    uint64_t size[7];     /* stored bytes */
    uint32_t type[7], rec[7], count[7];
} sections;

/* The record size of v1.0 (FORMAT.md 4.2): the fields this tessera reads. */
static const uint32_t minrec[7] = {0, 1, TSR_REC_FILE, TSR_REC_TENSOR, TSR_REC_CHUNK, TSR_REC_FRAME, TSR_REC_BLOB};
/* The record size of the fields this tessera reads: v1.0's, and the statistics
 * v1.3 and the digest v1.4 append to TENSORS (read when a record holds them). */
static const uint32_t knownrec[7] = {0, 1, TSR_REC_FILE, TSR_REC_TENSOR_V14, TSR_REC_CHUNK, TSR_REC_FRAME,
                                     TSR_REC_BLOB};

/* The header: magic, size, checksum, version, step, save id, layout, epoch. The section
 * table's extent: *hsize and *nsec. */
static int parse_header(const uint8_t *buf, size_t len, const char *path, tsr_manifest *m, uint32_t *hsize,
                        uint32_t *nsec, tsr_error *err) {
    if (len < TSR_MF_HEADER_SIZE + 8) return BAD("%s: %zu bytes, too short for a MANIFEST", path, len);
    if (len > TSR_MF_MAX_SIZE) return BAD("%s: %zu bytes, over the 4 GiB limit", path, len);
    if (memcmp(buf, TSR_MF_MAGIC, 8) != 0) return BAD("%s: not a tessera MANIFEST (bad magic)", path);
    if (tsr_ld64(buf + 16) != len)
        return BAD("%s: file is %zu bytes but its header says %llu (truncated or extended)", path, len,
                   (unsigned long long)tsr_ld64(buf + 16));
    if (tsr_ld64(buf + len - 8) != tsr_hash(buf, len - 8))
        return BAD("%s: checksum mismatch (the MANIFEST is damaged)", path);
    m->version_major = tsr_ld16(buf + 8);
    m->version_minor = tsr_ld16(buf + 10);
    if (m->version_major != TSR_FORMAT_MAJOR)
        return tsr_err(err, TSR_EVERSION, "%s: format version %u.%u; this tessera reads %u.x", path,
                       m->version_major, m->version_minor, TSR_FORMAT_MAJOR);
    *hsize = tsr_ld32(buf + 12);
    *nsec = tsr_ld32(buf + 48);
    if (*hsize < TSR_MF_HEADER_SIZE) return BAD("%s: bad header size %u", path, *hsize);
    if ((uint64_t)*hsize + (uint64_t)*nsec * 32 > len - 8)
        return BAD("%s: section table (%u sections) past the end", path, *nsec);
    m->step = tsr_ld64(buf + 24);
    memcpy(m->save_id, buf + 32, 16);
    m->flags = tsr_ld32(buf + 52) & TSR_MF_POISONED; /* v1.3 (4.5); other bits ignored */
    m->created = tsr_ld64(buf + 56);
    m->layout.pp = tsr_ld32(buf + 64);
    m->layout.dp_replicate = tsr_ld32(buf + 68);
    m->layout.dp_shard = tsr_ld32(buf + 72);
    m->layout.tp = tsr_ld32(buf + 76);
    m->layout.n_layers = tsr_ld32(buf + 80);
    m->layout.flags = tsr_ld32(buf + 84);
    m->epoch = tsr_ld64(buf + 88); /* v1.5 (4.6); reserved, zero, before */
    return 0;
}

typedef struct sec_range {
    uint64_t lo, hi;
    uint32_t index;
} sec_range;

static int cmp_sec_range(const void *pa, const void *pb) {
    const sec_range *a = pa, *b = pb;
    if (a->lo != b->lo) return a->lo < b->lo ? -1 : 1;
    return (a->hi > b->hi) - (a->hi < b->hi);
}

/* A packed section (FORMAT.md 4.3) at p (size bytes) of `count` records of
 * `rec` bytes: one zstd frame that declares their bytes, at most 4 GiB, and ends
 * where the section does. Its headers only: nothing is decoded yet. */
static int check_packed(const uint8_t *p, uint64_t size, uint32_t rec, uint32_t count, const char *path,
                        uint32_t type, tsr_error *err) {
    uint64_t n = (uint64_t)rec * count;
    if (n > TSR_MF_MAX_PACKED)
        return BAD("%s: packed section type %u: %llu bytes of records, over the 4 GiB limit", path, type,
                   (unsigned long long)n);
    unsigned long long declared = ZSTD_getFrameContentSize(p, size);
    if (declared == ZSTD_CONTENTSIZE_ERROR)
        return BAD("%s: packed section type %u: not a zstd frame", path, type);
    if (declared != n)
        return BAD("%s: packed section type %u: its zstd frame declares %s%llu bytes, its %u records of %u take %llu",
                   path, type, declared == ZSTD_CONTENTSIZE_UNKNOWN ? "no size, not " : "",
                   declared == ZSTD_CONTENTSIZE_UNKNOWN ? 0ull : declared, count, rec, (unsigned long long)n);
    size_t fsz = ZSTD_findFrameCompressedSize(p, size);
    if (ZSTD_isError(fsz) || fsz != size)
        return BAD("%s: packed section type %u: %s", path, type,
                   ZSTD_isError(fsz) ? "its zstd frame is cut short" : "bytes after its zstd frame");
    return 0;
}

/* Entry s of the section table into *sec (a known type, packed or not) and
 * ranges[s]. Nothing is decoded yet. */
static int parse_entry(const uint8_t *buf, size_t len, const char *path, uint32_t hsize, uint32_t nsec,
                       uint32_t s, sections *sec, sec_range *ranges, tsr_error *err) {
    const uint8_t *e = buf + hsize + 32 * (size_t)s;
    uint32_t type = tsr_ld32(e), sflags = tsr_ld32(e + 4), rec = tsr_ld32(e + 24), count = tsr_ld32(e + 28);
    uint64_t off = tsr_ld64(e + 8), size = tsr_ld64(e + 16);
    uint64_t table_end = (uint64_t)hsize + (uint64_t)nsec * 32;
    int packed = type > TSR_SEC_PACKED + TSR_SEC_STRINGS && type <= TSR_SEC_PACKED + TSR_SEC_BLOBS;
    uint32_t t = packed ? type - TSR_SEC_PACKED : type;
    if (off % 8 || off < table_end || off > len - 8 || size > len - 8 - off)
        return BAD("%s: section %u (type %u) lies outside the section area", path, s, type);
    if (!packed && size != (uint64_t)rec * count)
        return BAD("%s: section %u (type %u): size %llu != %u records of %u bytes", path, s, type,
                   (unsigned long long)size, count, rec);
    ranges[s] = (sec_range){off, off + size, s};
    if (t < 1 || t > 6) {
        if (sflags & 1)
            return BAD("%s: unknown required section type %u (written by a newer tessera)", path, type);
        return 0;
    }
    if (sec->at[t]) return BAD("%s: section type %u appears twice (packed or not)", path, t);
    if (rec < minrec[t])
        return BAD("%s: section type %u: record size %u below %u", path, type, rec, minrec[t]);
    if (packed) {
        int rc = check_packed(buf + off, size, rec, count, path, type, err);
        if (rc) return rc;
    }
    sec->at[t] = buf + off;
    sec->size[t] = size;
    sec->type[t] = type;
    sec->rec[t] = rec;
    sec->count[t] = count;
    return 0;
}

/* The section table: every entry inside the file, no two sections overlapping,
 * every v1 section present once. */
static int parse_sections(const uint8_t *buf, size_t len, const char *path, uint32_t hsize, uint32_t nsec,
                          sections *sec, tsr_error *err) {
    /* section ranges, for the overlap check (nsec is bounded by the file size) */
    sec_range *ranges = malloc(((size_t)nsec + 1) * sizeof *ranges);
    if (!ranges) return tsr_err(err, TSR_ENOMEM, "%s: out of memory", path);
    int rc = 0;
    for (uint32_t s = 0; s < nsec && !rc; s++) rc = parse_entry(buf, len, path, hsize, nsec, s, sec, ranges, err);
    if (!rc) tsr_sort(ranges, nsec, sizeof *ranges, cmp_sec_range);
    for (uint32_t r = 1; r < nsec && !rc; r++)
        if (ranges[r].lo < ranges[r - 1].hi)
            rc = BAD("%s: sections %u and %u overlap", path, ranges[r - 1].index, ranges[r].index);
    free(ranges);
    for (int t = 1; t <= 6 && !rc; t++)
        if (!sec->at[t]) rc = BAD("%s: section type %d is missing", path, t);
    return rc;
}

/* A packed section's count costs nothing to declare (a zstd frame of 130 KB
 * can declare 4 GiB of records), but every record decoded costs memory and
 * time. So before CHUNKS and FRAMES are decoded, their counts are held to what
 * the sections read before them can hold: a tensor holds its chunk count, at
 * most one chunk per element (its chunks are disjoint and none is empty); a
 * chunk holds its frame count but at least one frame, a blob its frame count.
 * A count below these bounds costs no more than the records that justify it,
 * and is left to the validator, which says which record is wrong. */
static int check_count(const tsr_manifest *m, const sections *sec, int t, const char *path, tsr_error *err) {
    uint64_t n = sec->count[t], most = 0;
    if (t == TSR_SEC_CHUNKS) {
        for (size_t i = 0; i < m->n_tensors; i++) {
            const tsr_mf_tensor *x = &m->tensors[i];
            uint64_t vol = 1;
            for (uint32_t d = 0; d < x->ndim && vol; d++)
                if (tsr_mul_ovf(vol, x->shape[d], &vol)) vol = UINT64_MAX; /* the validator refuses it */
            if (x->chunk_count > vol)
                return BAD("%s: tensor %s: %u chunks for its %llu elements (a chunk holds one at least)", path,
                           x->name, x->chunk_count, (unsigned long long)vol);
            most += x->chunk_count; /* fewer than 2^32 terms below 2^32: no overflow */
        }
        if (n > most)
            return BAD("%s: CHUNKS declares %llu records, more than its tensors' chunk counts add up to (%llu)", path,
                       (unsigned long long)n, (unsigned long long)most);
    }
    if (t == TSR_SEC_FRAMES) {
        for (size_t i = 0; i < m->n_chunks && most < n; i++) /* most stays below 2^33: no overflow */
            most += m->chunks[i].frame_count ? m->chunks[i].frame_count : 1;
        for (size_t i = 0; i < m->n_blobs && most < n; i++) most += m->blobs[i].frame_count;
        if (n > most)
            return BAD("%s: FRAMES declares %llu records, more than its chunks and blobs have frames (%llu)", path,
                       (unsigned long long)n, (unsigned long long)most);
    }
    return 0;
}

/* Room for the records of section t, once its count is checked: a plain
 * section's count is bounded by the file's size, a packed CHUNKS's or FRAMES's
 * by check_count. (No rule bounds a packed FILES, TENSORS or BLOBS below 4 GiB
 * of records, but calloc's pages cost memory only once a record is written.) */
static int reserve(tsr_manifest *m, const sections *sec, int t, const char *path, tsr_error *err) {
    size_t n = sec->count[t];
    void *p = NULL;
    if (!n) return 0;
    switch (t) {
    case TSR_SEC_FILES: p = m->files = calloc(n, sizeof *m->files); m->cap_files = n; break;
    case TSR_SEC_TENSORS: p = m->tensors = calloc(n, sizeof *m->tensors); m->cap_tensors = n; break;
    case TSR_SEC_CHUNKS: p = m->chunks = calloc(n, sizeof *m->chunks); m->cap_chunks = n; break;
    case TSR_SEC_FRAMES: p = m->frames = calloc(n, sizeof *m->frames); m->cap_frames = n; break;
    case TSR_SEC_BLOBS: p = m->blobs = calloc(n, sizeof *m->blobs); m->cap_blobs = n; break;
    }
    return p ? 0 : tsr_err(err, TSR_ENOMEM, "%s: out of memory", path);
}

/* A block of a section's records: n of them from record `first`, `stride`
 * bytes apart at p. */
typedef struct block {
    const uint8_t *p;
    size_t stride, first, n;
} block;
typedef int (*block_fn)(const sections *sec, const block *b, const char *path, tsr_manifest *m, tsr_error *err);

/* Decodes the next `want` bytes of the zstd frame `in` into out, at most `cap`
 * at a time (each piece over the last: cap < want only for bytes dropped).
 * *left: ZSTD_decompressStream's last result, 0 once the frame is done. */
static int unpack_bytes(ZSTD_DCtx *d, ZSTD_inBuffer *in, uint8_t *out, size_t cap, uint64_t want, size_t *left,
                        const char *path, uint32_t type, tsr_error *err) {
    while (want) {
        ZSTD_outBuffer o = {out, want < cap ? want : cap, 0};
        while (o.pos < o.size) {
            size_t before = o.pos + in->pos;
            *left = ZSTD_decompressStream(d, &o, in);
            if (ZSTD_isError(*left))
                return BAD("%s: packed section type %u does not decode: %s", path, type, ZSTD_getErrorName(*left));
            if (o.pos + in->pos == before) return BAD("%s: packed section type %u does not decode: short", path, type);
        }
        want -= o.size;
    }
    return 0;
}

/* The records of packed section t (its frame checked by check_packed) to fn,
 * a block at a time, decoded to rec * count bytes and no more. A block
 * holds its records' byte planes in order, so the planes of the fields this
 * tessera reads (the first `keep` bytes of a record) come first: they are
 * unshuffled and passed on before the next block is decoded, and the planes of
 * fields a later minor version appended are decoded and dropped. Memory: two
 * blocks of known records (20 MiB at most), whatever the record size. */
static int unpack_section(const sections *sec, int t, block_fn fn, const char *path, tsr_manifest *m,
                          tsr_error *err) {
    const uint8_t *p = sec->at[t];
    uint64_t size = sec->size[t], rec = sec->rec[t], count = sec->count[t];
    uint32_t type = sec->type[t];
    size_t keep = rec < knownrec[t] ? rec : knownrec[t];
    size_t bn = (count < TSR_MF_PACK_BLOCK ? count : TSR_MF_PACK_BLOCK) * keep;
    ZSTD_DCtx *d = ZSTD_createDCtx();
    uint8_t *planes = malloc(bn + 1), *recs = malloc(bn + 1);
    int rc = d && planes && recs ? 0 : tsr_err(err, TSR_ENOMEM, "%s: out of memory", path);
    ZSTD_inBuffer in = {p, size, 0};
    size_t left = 1;
    for (size_t i0 = 0; !rc && i0 < count; i0 += TSR_MF_PACK_BLOCK) {
        size_t k = count - i0 < TSR_MF_PACK_BLOCK ? count - i0 : TSR_MF_PACK_BLOCK;
        rc = unpack_bytes(d, &in, planes, k * keep, k * keep, &left, path, type, err);
        if (!rc) {
            tsr_mf_transpose(planes, keep, k, recs);
            rc = fn(sec, &(block){recs, keep, i0, k}, path, m, err);
        }
        if (!rc) rc = unpack_bytes(d, &in, planes, bn, k * (rec - keep), &left, path, type, err);
    }
    while (!rc && left) { /* the frame's end (and checksum) after the records: nothing more decodes */
        uint8_t more;
        ZSTD_outBuffer o = {&more, 1, 0};
        size_t before = in.pos;
        left = ZSTD_decompressStream(d, &o, &in);
        if (ZSTD_isError(left) || o.pos || (left && in.pos == before))
            rc = BAD("%s: packed section type %u does not decode to its records: %s", path, type,
                     ZSTD_isError(left) ? ZSTD_getErrorName(left) : o.pos ? "more bytes" : "short");
    }
    ZSTD_freeDCtx(d);
    free(planes), free(recs);
    return rc;
}

/* The records of section t to fn: a plain section's in one block where they
 * lie, a packed one's as they are decoded. */
static int read_section(const sections *sec, int t, block_fn fn, const char *path, tsr_manifest *m,
                        tsr_error *err) {
    if (sec->type[t] != (uint32_t)t) return unpack_section(sec, t, fn, path, m, err);
    return fn(sec, &(block){sec->at[t], sec->rec[t], 0, sec->count[t]}, path, m, err);
}

/* A name: (offset, length) at p into the STRINGS section, valid, copied. */
static int get_str(const sections *sec, const uint8_t *p, const char *path, const char *what, size_t idx,
                   tsr_manifest *m, const char **out, tsr_error *err) {
    const uint8_t *strs = sec->at[TSR_SEC_STRINGS];
    uint32_t off = tsr_ld32(p), len = tsr_ld32(p + 4);
    if ((uint64_t)off + len > sec->size[TSR_SEC_STRINGS])
        return BAD("%s: %s %zu: name reference past the string table", path, what, idx);
    if (!tsr_name_valid((const char *)strs + off, len))
        return BAD("%s: %s %zu: invalid name \"%.*s\" (allowed: 1-255 of [A-Za-z0-9_.:+-], no "
                   "empty component)",
                   path, what, idx, (int)(len > 64 ? 64 : len), (const char *)strs + off);
    *out = tsr_mf_strpool_add(m, (const char *)strs + off, len);
    return *out ? 0 : tsr_err(err, TSR_ENOMEM, "out of memory");
}

/* The parsers of a block of records, one per section: each record into the
 * manifest's arrays (reserved for the section's count). */
static int parse_files(const sections *sec, const block *b, const char *path, tsr_manifest *m, tsr_error *err) {
    for (size_t j = 0; j < b->n; j++) {
        const uint8_t *p = b->p + j * b->stride;
        tsr_mf_file *f = &m->files[b->first + j];
        f->id = tsr_ld32(p);
        f->size = tsr_ld64(p + 8);
        m->n_files++;
    }
    return 0;
}

static int parse_tensors(const sections *sec, const block *b, const char *path, tsr_manifest *m, tsr_error *err) {
    for (size_t j = 0; j < b->n; j++) {
        const uint8_t *p = b->p + j * b->stride;
        size_t i = b->first + j;
        tsr_mf_tensor *t = &m->tensors[i];
        int rc = get_str(sec, p, path, "tensor", i, m, &t->name, err);
        if (rc || (rc = get_str(sec, p + 8, path, "tensor", i, m, &t->group, err))) return rc;
        t->dtype = p[16];
        t->ndim = p[17];
        t->placement.tp_dim = (int8_t)p[18];
        t->placement.fsdp = p[19];
        t->placement.pp_role = p[20];
        t->placement.layer = (int32_t)tsr_ld32(p + 24);
        t->chunk_first = tsr_ld32(p + 28);
        t->chunk_count = tsr_ld32(p + 32);
        if (t->ndim > TSR_MAX_DIMS) return BAD("%s: tensor %s: %u dims, over the limit of 8", path, t->name, t->ndim);
        for (uint32_t d = 0; d < TSR_MAX_DIMS; d++) {
            uint64_t v = tsr_ld64(p + 40 + 8 * d);
            if (d >= t->ndim && v)
                return BAD("%s: tensor %s: nonzero shape entry past its %u dims", path, t->name, t->ndim);
            t->shape[d] = v;
        }
        /* v1.4: the digest (FORMAT.md 4.4); v1.2's (bit 0) and unknown flag bits ignored */
        if (b->stride >= TSR_REC_TENSOR_V14) {
            t->digest_flags = tsr_ld32(p + 112) & TSR_MF_DIGEST;
            t->digest = t->digest_flags ? tsr_ld64(p + 152) : 0;
        }
        tsr_stats_init(&t->stats);
        /* v1.3: the statistics (4.5), of a floating dtype only (elsewhere the bit is ignored) */
        if (b->stride >= TSR_REC_TENSOR_V13 && (tsr_ld32(p + 112) & TSR_MF_STATS) && tsr_stats_dtype(t->dtype)) {
            t->digest_flags |= TSR_MF_STATS;
            t->stats = (tsr_stats){tsr_f64_of_bits(tsr_ld64(p + 120)), tsr_f64_of_bits(tsr_ld64(p + 128)),
                                   tsr_f64_of_bits(tsr_ld64(p + 136)), tsr_ld64(p + 144)};
        }
        m->n_tensors++;
    }
    return 0;
}

static int parse_chunks(const sections *sec, const block *b, const char *path, tsr_manifest *m, tsr_error *err) {
    for (size_t j = 0; j < b->n; j++) {
        const uint8_t *p = b->p + j * b->stride;
        size_t i = b->first + j;
        tsr_mf_chunk *c = &m->chunks[i];
        c->tensor = tsr_ld32(p);
        c->file_id = tsr_ld32(p + 4);
        c->frame_first = tsr_ld32(p + 8);
        c->frame_count = tsr_ld32(p + 12);
        c->split_dim = p[16];
        c->frame_rows = tsr_ld64(p + 24);
        if (c->tensor >= m->n_tensors)
            return BAD("%s: chunk %zu names tensor %u of %zu", path, i, c->tensor, m->n_tensors);
        c->box.ndim = m->tensors[c->tensor].ndim;
        for (uint32_t d = 0; d < TSR_MAX_DIMS; d++) {
            uint64_t o = tsr_ld64(p + 32 + 8 * d), x = tsr_ld64(p + 96 + 8 * d);
            if (d >= c->box.ndim && (o || x))
                return BAD("%s: chunk %zu of %s: nonzero box entry past its %u dims", path, i,
                           m->tensors[c->tensor].name, c->box.ndim);
            c->box.offset[d] = o;
            c->box.extent[d] = x;
        }
        m->n_chunks++;
    }
    return 0;
}

static int parse_frames(const sections *sec, const block *b, const char *path, tsr_manifest *m, tsr_error *err) {
    for (size_t j = 0; j < b->n; j++) {
        const uint8_t *p = b->p + j * b->stride;
        tsr_mf_frame *f = &m->frames[b->first + j];
        f->offset = tsr_ld64(p);
        f->stored_size = tsr_ld64(p + 8);
        f->raw_size = tsr_ld64(p + 16);
        f->raw_hash = tsr_ld64(p + 24);
        f->stored_hash = tsr_ld64(p + 32);
        f->codec = p[40];
        f->file_id = UINT32_MAX; /* set by the validator from the frame's chunk or blob */
        m->n_frames++;
    }
    return 0;
}

static int parse_blobs(const sections *sec, const block *b, const char *path, tsr_manifest *m, tsr_error *err) {
    for (size_t j = 0; j < b->n; j++) {
        const uint8_t *p = b->p + j * b->stride;
        size_t i = b->first + j;
        tsr_mf_blob *bl = &m->blobs[i];
        int rc = get_str(sec, p, path, "blob", i, m, &bl->name, err);
        if (rc) return rc;
        bl->rank = (int32_t)tsr_ld32(p + 8);
        bl->file_id = tsr_ld32(p + 12);
        bl->frame_first = tsr_ld32(p + 16);
        bl->frame_count = tsr_ld32(p + 20);
        bl->size = tsr_ld64(p + 24);
        m->n_blobs++;
    }
    return 0;
}

int tsr_manifest_parse(const uint8_t *buf, size_t len, const char *path, unsigned flags, tsr_manifest *m,
                       tsr_error *err) {
    /* each section after those whose records bound its count (check_count) */
    static const int order[5] = {TSR_SEC_FILES, TSR_SEC_TENSORS, TSR_SEC_CHUNKS, TSR_SEC_BLOBS, TSR_SEC_FRAMES};
    static const block_fn parsers[7] = {NULL, NULL, parse_files, parse_tensors, parse_chunks, parse_frames,
                                        parse_blobs};
    tsr_manifest_init(m);
    uint32_t hsize = 0, nsec = 0;
    sections sec = {0};
    int rc = parse_header(buf, len, path, m, &hsize, &nsec, err);
    if (!rc) rc = parse_sections(buf, len, path, hsize, nsec, &sec, err);
    for (int i = 0; i < 5 && !rc; i++) {
        int t = order[i];
        rc = check_count(m, &sec, t, path, err);
        if (!rc) rc = reserve(m, &sec, t, path, err);
        if (!rc) rc = read_section(&sec, t, parsers[t], path, m, err);
    }
    if (!rc) rc = tsr_manifest_validate(m, path, flags, err);
    if (rc) tsr_manifest_free(m);
    return rc;
}
