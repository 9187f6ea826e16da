/* manifest_parse.c: a MANIFEST's bytes into records (FORMAT.md section 4.1): the
 * header and its checksum, the section table, each section's records; then the
 * validator (manifest_validate.c) checks the records against each other. */
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "manifest.h"
#include "manifest_impl.h"

#include <zstd.h>

/* The sections of types 1..6 (index 0 unused) as the section table places them. */
typedef struct sections {
    const uint8_t *at[7];
    uint64_t size[7], count[7], rec[7];
    uint8_t *own[7]; /* a packed section's records, unpacked */
} sections;

/* The header: magic, size, checksum, version, step, save id, layout. The section
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
    m->created = tsr_ld64(buf + 56);
    m->layout.pp = tsr_ld32(buf + 64);
    m->layout.dp_replicate = tsr_ld32(buf + 68);
    m->layout.dp_shard = tsr_ld32(buf + 72);
    m->layout.tp = tsr_ld32(buf + 76);
    m->layout.n_layers = tsr_ld32(buf + 80);
    m->layout.flags = tsr_ld32(buf + 84);
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

/* Decodes the next `want` bytes of the zstd frame `in` into out. */
static int unpack_block(ZSTD_DCtx *d, ZSTD_inBuffer *in, uint8_t *out, size_t want, const char *path, uint32_t type,
                        tsr_error *err) {
    ZSTD_outBuffer o = {out, want, 0};
    while (o.pos < want) {
        size_t before = o.pos + in->pos, r = ZSTD_decompressStream(d, &o, in);
        if (ZSTD_isError(r)) return BAD("%s: packed section type %u does not decode: %s", path, type, ZSTD_getErrorName(r));
        if (o.pos + in->pos == before) return BAD("%s: packed section type %u does not decode: short", path, type);
    }
    return 0;
}

/* The records of a packed section (FORMAT.md 4.3) at p (size bytes): one zstd
 * frame that declares rec * count bytes and decodes to them, block by block
 * unshuffled into *out (malloc'ed). */
static int unpack_section(const uint8_t *p, uint64_t size, uint32_t rec, uint32_t count, const char *path,
                          uint32_t type, uint8_t **out, tsr_error *err) {
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
    size_t bn = (size_t)TSR_MF_PACK_BLOCK * rec;
    ZSTD_DCtx *d = ZSTD_createDCtx();
    uint8_t *blk = malloc(bn), *recs = malloc(n ? n : 1);
    int rc = d && blk && recs ? 0 : tsr_err(err, TSR_ENOMEM, "%s: out of memory", path);
    ZSTD_inBuffer in = {p, size, 0};
    for (size_t i0 = 0; !rc && i0 < count; i0 += TSR_MF_PACK_BLOCK) {
        size_t k = count - i0 < TSR_MF_PACK_BLOCK ? count - i0 : TSR_MF_PACK_BLOCK;
        rc = unpack_block(d, &in, blk, k * rec, path, type, err);
        if (!rc) tsr_mf_transpose(blk, rec, k, recs + i0 * rec);
    }
    ZSTD_freeDCtx(d);
    free(blk);
    if (rc) free(recs);
    else *out = recs;
    return rc;
}

/* Entry s of the section table into *sec (a known type, packed or not) and
 * ranges[s]. */
static int parse_entry(const uint8_t *buf, size_t len, const char *path, uint32_t hsize, uint32_t nsec,
                       uint32_t s, sections *sec, sec_range *ranges, tsr_error *err) {
    static const uint32_t minrec[7] = {0, 1, TSR_REC_FILE, TSR_REC_TENSOR, TSR_REC_CHUNK, TSR_REC_FRAME,
                                       TSR_REC_BLOB};
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
    if (sec->at[t] || sec->size[t] || sec->count[t])
        return BAD("%s: section type %u appears twice (packed or not)", path, t);
    if (rec < minrec[t])
        return BAD("%s: section type %u: record size %u below %u", path, type, rec, minrec[t]);
    sec->at[t] = buf + off; /* also when empty: present */
    if (packed) {
        int rc = unpack_section(buf + off, size, rec, count, path, type, &sec->own[t], err);
        if (rc) return rc;
        sec->at[t] = sec->own[t];
    }
    sec->size[t] = (uint64_t)rec * count;
    sec->count[t] = count;
    sec->rec[t] = rec;
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

/* Reserves the record arrays (counts are bounded by the section sizes, so by len). */
static int reserve(tsr_manifest *m, const sections *sec, const char *path, tsr_error *err) {
    const uint64_t *n = sec->count;
    if ((n[TSR_SEC_FILES] && !(m->files = calloc(n[TSR_SEC_FILES], sizeof *m->files))) ||
        (n[TSR_SEC_TENSORS] && !(m->tensors = calloc(n[TSR_SEC_TENSORS], sizeof *m->tensors))) ||
        (n[TSR_SEC_CHUNKS] && !(m->chunks = calloc(n[TSR_SEC_CHUNKS], sizeof *m->chunks))) ||
        (n[TSR_SEC_FRAMES] && !(m->frames = calloc(n[TSR_SEC_FRAMES], sizeof *m->frames))) ||
        (n[TSR_SEC_BLOBS] && !(m->blobs = calloc(n[TSR_SEC_BLOBS], sizeof *m->blobs))))
        return tsr_err(err, TSR_ENOMEM, "%s: out of memory", path);
    m->cap_files = n[TSR_SEC_FILES];
    m->cap_tensors = n[TSR_SEC_TENSORS];
    m->cap_chunks = n[TSR_SEC_CHUNKS];
    m->cap_frames = n[TSR_SEC_FRAMES];
    m->cap_blobs = n[TSR_SEC_BLOBS];
    return 0;
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

static void parse_files(const sections *sec, tsr_manifest *m) {
    for (uint64_t i = 0; i < sec->count[TSR_SEC_FILES]; i++) {
        const uint8_t *p = sec->at[TSR_SEC_FILES] + i * sec->rec[TSR_SEC_FILES];
        m->files[i].id = tsr_ld32(p);
        m->files[i].size = tsr_ld64(p + 8);
    }
    m->n_files = sec->count[TSR_SEC_FILES];
}

static int parse_tensors(const sections *sec, const char *path, tsr_manifest *m, tsr_error *err) {
    for (uint64_t i = 0; i < sec->count[TSR_SEC_TENSORS]; i++) {
        const uint8_t *p = sec->at[TSR_SEC_TENSORS] + i * sec->rec[TSR_SEC_TENSORS];
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
        m->n_tensors++;
    }
    return 0;
}

static int parse_chunks(const sections *sec, const char *path, tsr_manifest *m, tsr_error *err) {
    for (uint64_t i = 0; i < sec->count[TSR_SEC_CHUNKS]; i++) {
        const uint8_t *p = sec->at[TSR_SEC_CHUNKS] + i * sec->rec[TSR_SEC_CHUNKS];
        tsr_mf_chunk *c = &m->chunks[i];
        c->tensor = tsr_ld32(p);
        c->file_id = tsr_ld32(p + 4);
        c->frame_first = tsr_ld32(p + 8);
        c->frame_count = tsr_ld32(p + 12);
        c->split_dim = p[16];
        c->frame_rows = tsr_ld64(p + 24);
        if (c->tensor >= m->n_tensors)
            return BAD("%s: chunk %llu names tensor %u of %zu", path, (unsigned long long)i, c->tensor, m->n_tensors);
        c->box.ndim = m->tensors[c->tensor].ndim;
        for (uint32_t d = 0; d < TSR_MAX_DIMS; d++) {
            uint64_t o = tsr_ld64(p + 32 + 8 * d), x = tsr_ld64(p + 96 + 8 * d);
            if (d >= c->box.ndim && (o || x))
                return BAD("%s: chunk %llu of %s: nonzero box entry past its %u dims", path, (unsigned long long)i,
                           m->tensors[c->tensor].name, c->box.ndim);
            c->box.offset[d] = o;
            c->box.extent[d] = x;
        }
        m->n_chunks++;
    }
    return 0;
}

static void parse_frames(const sections *sec, tsr_manifest *m) {
    for (uint64_t i = 0; i < sec->count[TSR_SEC_FRAMES]; i++) {
        const uint8_t *p = sec->at[TSR_SEC_FRAMES] + i * sec->rec[TSR_SEC_FRAMES];
        tsr_mf_frame *f = &m->frames[i];
        f->offset = tsr_ld64(p);
        f->stored_size = tsr_ld64(p + 8);
        f->raw_size = tsr_ld64(p + 16);
        f->raw_hash = tsr_ld64(p + 24);
        f->stored_hash = tsr_ld64(p + 32);
        f->codec = p[40];
        f->file_id = UINT32_MAX; /* set by the validator from the frame's chunk or blob */
        m->n_frames++;
    }
}

static int parse_blobs(const sections *sec, const char *path, tsr_manifest *m, tsr_error *err) {
    for (uint64_t i = 0; i < sec->count[TSR_SEC_BLOBS]; i++) {
        const uint8_t *p = sec->at[TSR_SEC_BLOBS] + i * sec->rec[TSR_SEC_BLOBS];
        tsr_mf_blob *b = &m->blobs[i];
        int rc = get_str(sec, p, path, "blob", i, m, &b->name, err);
        if (rc) return rc;
        b->rank = (int32_t)tsr_ld32(p + 8);
        b->file_id = tsr_ld32(p + 12);
        b->frame_first = tsr_ld32(p + 16);
        b->frame_count = tsr_ld32(p + 20);
        b->size = tsr_ld64(p + 24);
        m->n_blobs++;
    }
    return 0;
}

int tsr_manifest_parse(const uint8_t *buf, size_t len, const char *path, unsigned flags, tsr_manifest *m,
                       tsr_error *err) {
    tsr_manifest_init(m);
    uint32_t hsize = 0, nsec = 0;
    sections sec = {0};
    int rc = parse_header(buf, len, path, m, &hsize, &nsec, err);
    if (!rc) rc = parse_sections(buf, len, path, hsize, nsec, &sec, err);
    if (!rc) rc = reserve(m, &sec, path, err);
    if (!rc) {
        parse_files(&sec, m);
        rc = parse_tensors(&sec, path, m, err);
    }
    if (!rc) rc = parse_chunks(&sec, path, m, err);
    if (!rc) {
        parse_frames(&sec, m);
        rc = parse_blobs(&sec, path, m, err);
    }
    for (int t = 1; t <= 6; t++) free(sec.own[t]);
    if (!rc) rc = tsr_manifest_validate(m, path, flags, err);
    if (rc) tsr_manifest_free(m);
    return rc;
}
