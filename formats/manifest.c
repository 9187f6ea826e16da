/* manifest.c: MANIFEST encoding, parsing and validation (FORMAT.md section 4). */
#include "manifest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

/* ------------------------------------------------------------ string pool */

/* Names are copied into blocks that never move, so pointers stay valid. */
typedef struct tsr_strblock {
    struct tsr_strblock *next;
    size_t used, cap;
    char data[];
} tsr_strblock;
typedef struct tsr_strpool {
    tsr_strblock *head;
} tsr_strpool;

static const char *strpool_add(tsr_manifest *m, const char *s, size_t len) {
    if (!m->strings) {
        m->strings = calloc(1, sizeof *m->strings);
        if (!m->strings) return NULL;
    }
    tsr_strblock *b = m->strings->head;
    if (!b || b->cap - b->used < len + 1) {
        size_t cap = len + 1 > 65536 ? len + 1 : 65536;
        tsr_strblock *nb = malloc(sizeof *nb + cap);
        if (!nb) return NULL;
        nb->next = b;
        nb->used = 0;
        nb->cap = cap;
        m->strings->head = nb;
        b = nb;
    }
    char *p = b->data + b->used;
    memcpy(p, s, len);
    p[len] = 0;
    b->used += len + 1;
    return p;
}

void tsr_manifest_init(tsr_manifest *m) {
    memset(m, 0, sizeof *m);
    m->version_major = TSR_FORMAT_MAJOR;
    m->version_minor = TSR_FORMAT_MINOR;
    m->layout = (tsr_layout){1, 1, 1, 1, 0, 0};
}

void tsr_manifest_free(tsr_manifest *m) {
    if (!m) return;
    free(m->tensors);
    free(m->chunks);
    free(m->frames);
    free(m->blobs);
    free(m->files);
    if (m->strings) {
        for (tsr_strblock *b = m->strings->head, *n; b; b = n) {
            n = b->next;
            free(b);
        }
        free(m->strings);
    }
    tsr_manifest_init(m);
}

#define APPEND(arr, n, cap, item)                                              \
    do {                                                                       \
        if (tsr_grow((void **)&(arr), &(cap), (n), sizeof *(arr))) return TSR_ENOMEM; \
        (arr)[(n)++] = *(item);                                                \
    } while (0)

int tsr_manifest_add_tensor(tsr_manifest *m, const tsr_mf_tensor *t) {
    tsr_mf_tensor c = *t;
    c.name = strpool_add(m, t->name, strlen(t->name));
    c.group = strpool_add(m, t->group, strlen(t->group));
    if (!c.name || !c.group) return TSR_ENOMEM;
    APPEND(m->tensors, m->n_tensors, m->cap_tensors, &c);
    return 0;
}
int tsr_manifest_add_chunk(tsr_manifest *m, const tsr_mf_chunk *c) {
    APPEND(m->chunks, m->n_chunks, m->cap_chunks, c);
    return 0;
}
int tsr_manifest_add_frame(tsr_manifest *m, const tsr_mf_frame *f) {
    APPEND(m->frames, m->n_frames, m->cap_frames, f);
    return 0;
}
int tsr_manifest_add_blob(tsr_manifest *m, const tsr_mf_blob *b) {
    tsr_mf_blob c = *b;
    c.name = strpool_add(m, b->name, strlen(b->name));
    if (!c.name) return TSR_ENOMEM;
    APPEND(m->blobs, m->n_blobs, m->cap_blobs, &c);
    return 0;
}
int tsr_manifest_add_file(tsr_manifest *m, const tsr_mf_file *f) {
    APPEND(m->files, m->n_files, m->cap_files, f);
    return 0;
}

/* ----------------------------------------------------------------- names */

int tsr_name_valid(const char *name, size_t len) {
    if (len == 0 || len > TSR_MAX_NAME) return 0;
    size_t comp = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)name[i];
        if (ch == '.') {
            if (comp == 0) return 0;
            comp = 0;
            continue;
        }
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '_' || ch == ':' || ch == '+' || ch == '-'))
            return 0;
        comp++;
    }
    return comp > 0;
}

/* -------------------------------------------------------------- geometry */

uint64_t tsr_frame_count(const tsr_box *b, uint32_t split_dim, uint64_t frame_rows) {
    if (b->ndim == 0) return (split_dim == 0 && frame_rows == 1) ? 1 : UINT64_MAX;
    if (split_dim >= b->ndim || frame_rows == 0 || frame_rows > b->extent[split_dim])
        return UINT64_MAX;
    uint64_t n = 1;
    for (uint32_t d = 0; d < split_dim; d++)
        if (tsr_mul_ovf(n, b->extent[d], &n)) return UINT64_MAX;
    uint64_t runs = (b->extent[split_dim] + frame_rows - 1) / frame_rows;
    if (tsr_mul_ovf(n, runs, &n)) return UINT64_MAX;
    return n;
}

void tsr_frame_box(const tsr_mf_chunk *c, uint64_t k, tsr_box *out) {
    *out = c->box;
    if (c->box.ndim == 0) return;
    uint32_t s = c->split_dim;
    uint64_t r = c->frame_rows;
    uint64_t runs = (c->box.extent[s] + r - 1) / r;
    uint64_t j = k % runs, outer = k / runs;
    for (int d = (int)s - 1; d >= 0; d--) {
        out->offset[d] = c->box.offset[d] + outer % c->box.extent[d];
        out->extent[d] = 1;
        outer /= c->box.extent[d];
    }
    out->offset[s] = c->box.offset[s] + j * r;
    uint64_t left = c->box.extent[s] - j * r;
    out->extent[s] = left < r ? left : r;
}

void tsr_frame_geometry(const tsr_box *box, size_t elem_size, size_t frame_bytes,
                        uint32_t *split_dim, uint64_t *frame_rows) {
    if (box->ndim == 0) {
        *split_dim = 0;
        *frame_rows = 1;
        return;
    }
    if (frame_bytes < elem_size) frame_bytes = elem_size;
    /* inner[s] = bytes of one index of dim s */
    uint32_t s = 0;
    uint64_t inner = elem_size;
    uint64_t inners[TSR_MAX_DIMS];
    for (int d = (int)box->ndim - 1; d >= 0; d--) {
        inners[d] = inner;
        if (tsr_mul_ovf(inner, box->extent[d], &inner)) inner = UINT64_MAX;
    }
    for (s = 0; s + 1 < box->ndim && inners[s] > frame_bytes; s++) {
    }
    uint64_t rows = frame_bytes / inners[s];
    if (rows == 0) rows = 1;
    if (rows > box->extent[s]) rows = box->extent[s];
    if (rows > TSR_MAX_FRAME_RAW / inners[s]) rows = TSR_MAX_FRAME_RAW / inners[s];
    if (rows == 0) rows = 1;
    *split_dim = s;
    *frame_rows = rows;
}

uint64_t tsr_box_pieces(const tsr_box *box, size_t elem_size, size_t max_bytes) {
    if (tsr_box_volume(box) == 0) return 0;
    tsr_mf_chunk c = {.box = *box};
    tsr_frame_geometry(box, elem_size, max_bytes, &c.split_dim, &c.frame_rows);
    return tsr_frame_count(box, c.split_dim, c.frame_rows);
}

void tsr_box_piece(const tsr_box *box, size_t elem_size, size_t max_bytes, uint64_t k,
                   tsr_box *out) {
    tsr_mf_chunk c = {.box = *box};
    tsr_frame_geometry(box, elem_size, max_bytes, &c.split_dim, &c.frame_rows);
    tsr_frame_box(&c, k, out);
}

int tsr_frames_in(const tsr_mf_chunk *c, const tsr_box *region,
                  int (*fn)(void *user, uint64_t k), void *user) {
    const tsr_box *b = &c->box;
    if (b->ndim == 0) return fn(user, 0);
    uint32_t s = c->split_dim;
    uint64_t r = c->frame_rows;
    uint64_t runs = (b->extent[s] + r - 1) / r;
    uint64_t j0 = (region->offset[s] - b->offset[s]) / r;
    uint64_t j1 = (region->offset[s] + region->extent[s] - 1 - b->offset[s]) / r;
    /* odometer over the outer dims' indices inside the region */
    uint64_t idx[TSR_MAX_DIMS];
    for (uint32_t d = 0; d < s; d++) idx[d] = region->offset[d] - b->offset[d];
    for (;;) {
        uint64_t outer = 0;
        for (uint32_t d = 0; d < s; d++) outer = outer * b->extent[d] + idx[d];
        for (uint64_t j = j0; j <= j1; j++) {
            int rc = fn(user, outer * runs + j);
            if (rc) return rc;
        }
        int d = (int)s - 1;
        for (; d >= 0; d--) {
            if (++idx[d] < region->offset[d] - b->offset[d] + region->extent[d]) break;
            idx[d] = region->offset[d] - b->offset[d];
        }
        if (d < 0) return 0;
    }
}

/* ----------------------------------------------------------- data header */

void tsr_data_file_name(uint32_t file_id, char *buf, size_t len) {
    snprintf(buf, len, "data-%05u.tsd", file_id);
}

void tsr_data_header_encode(uint8_t *hdr, uint32_t file_id, const uint8_t save_id[16]) {
    memset(hdr, 0, TSR_DATA_HEADER_SIZE);
    memcpy(hdr, TSR_DATA_MAGIC, 8);
    tsr_st16(hdr + 8, TSR_FORMAT_MAJOR);
    tsr_st16(hdr + 10, TSR_FORMAT_MINOR);
    tsr_st32(hdr + 12, file_id);
    memcpy(hdr + 16, save_id, 16);
    tsr_st64(hdr + 32, tsr_hash(hdr, 32));
}

int tsr_data_header_check(const uint8_t *hdr, uint32_t file_id, const uint8_t save_id[16],
                          const char *path, tsr_error *err) {
    if (memcmp(hdr, TSR_DATA_MAGIC, 8) != 0)
        return tsr_err(err, TSR_ECORRUPT, "%s: not a tessera data file (bad magic)", path);
    if (tsr_ld64(hdr + 32) != tsr_hash(hdr, 32))
        return tsr_err(err, TSR_ECORRUPT, "%s: data file header checksum mismatch", path);
    if (tsr_ld16(hdr + 8) != TSR_FORMAT_MAJOR)
        return tsr_err(err, TSR_ECORRUPT, "%s: data file format version %u, expected %u", path,
                       tsr_ld16(hdr + 8), TSR_FORMAT_MAJOR);
    if (tsr_ld32(hdr + 12) != file_id)
        return tsr_err(err, TSR_ECORRUPT, "%s: header names file id %u", path, tsr_ld32(hdr + 12));
    if (memcmp(hdr + 16, save_id, 16) != 0)
        return tsr_err(err, TSR_ECORRUPT,
                       "%s: belongs to another save (save id differs from the MANIFEST's)", path);
    for (size_t i = 40; i < TSR_DATA_HEADER_SIZE; i++)
        if (hdr[i])
            return tsr_err(err, TSR_ECORRUPT, "%s: nonzero byte in header padding at offset %zu",
                           path, i);
    return 0;
}

/* ------------------------------------------------------------------ sort */

static int cmp_box_offset(const tsr_box *a, const tsr_box *b) {
    for (uint32_t d = 0; d < a->ndim && d < b->ndim; d++) {
        if (a->offset[d] != b->offset[d]) return a->offset[d] < b->offset[d] ? -1 : 1;
    }
    return 0;
}
static int cmp_tensor_idx(const void *pa, const void *pb, void *ctx) {
    const tsr_manifest *m = ctx;
    uint32_t a = *(const uint32_t *)pa, b = *(const uint32_t *)pb;
    return strcmp(m->tensors[a].name, m->tensors[b].name);
}
static int cmp_chunk(const void *pa, const void *pb) {
    const tsr_mf_chunk *a = pa, *b = pb;
    if (a->tensor != b->tensor) return a->tensor < b->tensor ? -1 : 1;
    return cmp_box_offset(&a->box, &b->box);
}
static int cmp_blob(const void *pa, const void *pb) {
    const tsr_mf_blob *a = pa, *b = pb;
    int c = strcmp(a->name, b->name);
    if (c) return c;
    return (a->rank > b->rank) - (a->rank < b->rank);
}
int tsr_mf_cmp_frame_pos(const void *pa, const void *pb, void *ctx) {
    const tsr_manifest *m = ctx;
    const tsr_mf_frame *a = &m->frames[*(const uint32_t *)pa];
    const tsr_mf_frame *b = &m->frames[*(const uint32_t *)pb];
    if (a->file_id != b->file_id) return a->file_id < b->file_id ? -1 : 1;
    return (a->offset > b->offset) - (a->offset < b->offset);
}
static int cmp_file(const void *pa, const void *pb) {
    const tsr_mf_file *a = pa, *b = pb;
    return (a->id > b->id) - (a->id < b->id);
}

int tsr_manifest_sort(tsr_manifest *m, tsr_error *err) {
    size_t nt = m->n_tensors;
    uint32_t *order = malloc((nt + 1) * sizeof *order);
    uint32_t *rank_of = malloc((nt + 1) * sizeof *rank_of);
    tsr_mf_tensor *tensors = malloc((nt + 1) * sizeof *tensors);
    tsr_mf_frame *frames = malloc((m->n_frames + 1) * sizeof *frames);
    if (!order || !rank_of || !tensors || !frames) {
        free(order), free(rank_of), free(tensors), free(frames);
        return tsr_err(err, TSR_ENOMEM, "out of memory sorting the manifest");
    }
    for (size_t i = 0; i < nt; i++) order[i] = (uint32_t)i;
    tsr_sort_ctx(order, nt, sizeof *order, cmp_tensor_idx, m);
    for (size_t i = 0; i < nt; i++) {
        rank_of[order[i]] = (uint32_t)i;
        tensors[i] = m->tensors[order[i]];
        tensors[i].chunk_first = tensors[i].chunk_count = 0;
    }
    free(m->tensors);
    m->tensors = tensors;
    m->cap_tensors = nt + 1;
    for (size_t i = 0; i < m->n_chunks; i++) m->chunks[i].tensor = rank_of[m->chunks[i].tensor];
    tsr_sort(m->chunks, m->n_chunks, sizeof *m->chunks, cmp_chunk);
    for (size_t i = 0; i < m->n_chunks; i++) {
        tsr_mf_tensor *t = &m->tensors[m->chunks[i].tensor];
        if (t->chunk_count == 0) t->chunk_first = (uint32_t)i;
        t->chunk_count++;
    }
    uint32_t first = 0;
    for (size_t i = 0; i < nt; i++) {
        if (m->tensors[i].chunk_count == 0) m->tensors[i].chunk_first = first;
        first = m->tensors[i].chunk_first + m->tensors[i].chunk_count;
    }
    tsr_sort(m->blobs, m->n_blobs, sizeof *m->blobs, cmp_blob);
    tsr_sort(m->files, m->n_files, sizeof *m->files, cmp_file);
    size_t nf = 0;
    for (size_t i = 0; i < m->n_chunks + m->n_blobs; i++) {
        uint32_t *ff, fc;
        if (i < m->n_chunks) {
            ff = &m->chunks[i].frame_first;
            fc = m->chunks[i].frame_count;
        } else {
            ff = &m->blobs[i - m->n_chunks].frame_first;
            fc = m->blobs[i - m->n_chunks].frame_count;
        }
        if ((uint64_t)*ff + fc > m->n_frames) {
            free(order), free(rank_of), free(frames);
            return tsr_err(err, TSR_EINVAL, "frame range past the frame table");
        }
        if (fc) memcpy(frames + nf, m->frames + *ff, fc * sizeof *frames);
        *ff = (uint32_t)nf;
        nf += fc;
    }
    free(order);
    free(rank_of);
    if (nf != m->n_frames) {
        free(frames);
        return tsr_err(err, TSR_EINVAL, "%zu frames belong to no chunk or blob",
                       m->n_frames - nf);
    }
    free(m->frames);
    m->frames = frames;
    m->cap_frames = m->n_frames + 1;
    return 0;
}

/* ---------------------------------------------------------------- encode */

typedef struct sbuf {
    uint8_t *p;
    size_t len, cap;
} sbuf;

static int sbuf_reserve(sbuf *b, size_t n) {
    if (b->len + n <= b->cap) return 0;
    size_t nc = b->cap ? b->cap : 4096;
    while (nc < b->len + n) nc *= 2;
    uint8_t *p = realloc(b->p, nc);
    if (!p) return TSR_ENOMEM;
    b->p = p;
    b->cap = nc;
    return 0;
}

static int sbuf_zero(sbuf *b, size_t n) {
    if (n == 0) return 0;
    if (sbuf_reserve(b, n)) return TSR_ENOMEM;
    memset(b->p + b->len, 0, n);
    b->len += n;
    return 0;
}

/* Interns string s into the STRINGS buffer; returns its offset. Consecutive
 * identical strings (the group of each tensor) are stored once. */
typedef struct strtab {
    sbuf b;
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
    if (sbuf_reserve(&st->b, n)) return TSR_ENOMEM;
    *off = (uint32_t)st->b.len;
    *len = (uint32_t)n;
    memcpy(st->b.p + st->b.len, s, n);
    st->b.len += n;
    st->last = s;
    st->last_off = *off;
    return 0;
}

int tsr_manifest_encode(const tsr_manifest *m, uint8_t **out, size_t *out_len, tsr_error *err) {
    strtab st = {0};
    sbuf recs[6] = {{0}};
    uint32_t rsize[6] = {1, TSR_REC_FILE, TSR_REC_TENSOR, TSR_REC_CHUNK, TSR_REC_FRAME,
                         TSR_REC_BLOB};
    size_t counts[6] = {0, m->n_files, m->n_tensors, m->n_chunks, m->n_frames, m->n_blobs};
    int rc = 0;
    for (int s = 1; s < 6; s++) {
        if (counts[s] > UINT32_MAX) {
            rc = tsr_err(err, TSR_EINVAL, "too many records for one manifest section");
            goto out;
        }
        if (sbuf_zero(&recs[s], counts[s] * rsize[s])) goto nomem;
    }
    for (size_t i = 0; i < m->n_files; i++) {
        uint8_t *p = recs[1].p + i * TSR_REC_FILE;
        tsr_st32(p, m->files[i].id);
        tsr_st64(p + 8, m->files[i].size);
    }
    for (size_t i = 0; i < m->n_tensors; i++) {
        const tsr_mf_tensor *t = &m->tensors[i];
        uint8_t *p = recs[2].p + i * TSR_REC_TENSOR;
        uint32_t off, len;
        if (strtab_add(&st, t->name, &off, &len)) goto nomem;
        tsr_st32(p, off), tsr_st32(p + 4, len);
        if (strtab_add(&st, t->group, &off, &len)) goto nomem;
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
    }
    for (size_t i = 0; i < m->n_chunks; i++) {
        const tsr_mf_chunk *c = &m->chunks[i];
        uint8_t *p = recs[3].p + i * TSR_REC_CHUNK;
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
    for (size_t i = 0; i < m->n_frames; i++) {
        const tsr_mf_frame *f = &m->frames[i];
        uint8_t *p = recs[4].p + i * TSR_REC_FRAME;
        tsr_st64(p, f->offset);
        tsr_st64(p + 8, f->stored_size);
        tsr_st64(p + 16, f->raw_size);
        tsr_st64(p + 24, f->raw_hash);
        tsr_st64(p + 32, f->stored_hash);
        p[40] = (uint8_t)f->codec;
    }
    for (size_t i = 0; i < m->n_blobs; i++) {
        const tsr_mf_blob *b = &m->blobs[i];
        uint8_t *p = recs[5].p + i * TSR_REC_BLOB;
        uint32_t off, len;
        if (strtab_add(&st, b->name, &off, &len)) goto nomem;
        tsr_st32(p, off), tsr_st32(p + 4, len);
        tsr_st32(p + 8, (uint32_t)b->rank);
        tsr_st32(p + 12, b->file_id);
        tsr_st32(p + 16, b->frame_first);
        tsr_st32(p + 20, b->frame_count);
        tsr_st64(p + 24, b->size);
    }
    recs[0] = st.b;
    counts[0] = st.b.len;
    st.b = (sbuf){0};

    {
        size_t table = TSR_MF_HEADER_SIZE + 6 * 32;
        size_t off = tsr_align_up(table, 8), offs[6];
        for (int s = 0; s < 6; s++) {
            offs[s] = off;
            off = tsr_align_up(off + recs[s].len, 8);
        }
        size_t total = off + 8;
        if (total > TSR_MF_MAX_SIZE) {
            rc = tsr_err(err, TSR_EINVAL, "manifest would be %zu bytes, over the 4 GiB limit", total);
            goto out;
        }
        uint8_t *buf = calloc(1, total);
        if (!buf) goto nomem;
        memcpy(buf, TSR_MF_MAGIC, 8);
        tsr_st16(buf + 8, TSR_FORMAT_MAJOR);
        tsr_st16(buf + 10, TSR_FORMAT_MINOR);
        tsr_st32(buf + 12, TSR_MF_HEADER_SIZE);
        tsr_st64(buf + 16, total);
        tsr_st64(buf + 24, m->step);
        memcpy(buf + 32, m->save_id, 16);
        tsr_st32(buf + 48, 6);
        tsr_st64(buf + 56, m->created);
        tsr_st32(buf + 64, m->layout.pp);
        tsr_st32(buf + 68, m->layout.dp_replicate);
        tsr_st32(buf + 72, m->layout.dp_shard);
        tsr_st32(buf + 76, m->layout.tp);
        tsr_st32(buf + 80, m->layout.n_layers);
        tsr_st32(buf + 84, m->layout.flags);
        for (int s = 0; s < 6; s++) {
            uint8_t *e = buf + TSR_MF_HEADER_SIZE + 32 * s;
            tsr_st32(e, (uint32_t)(s + 1));
            tsr_st32(e + 4, 1); /* every v1 section is required */
            tsr_st64(e + 8, offs[s]);
            tsr_st64(e + 16, recs[s].len);
            tsr_st32(e + 24, rsize[s]);
            tsr_st32(e + 28, (uint32_t)counts[s]);
            if (recs[s].len) memcpy(buf + offs[s], recs[s].p, recs[s].len);
        }
        tsr_st64(buf + total - 8, tsr_hash(buf, total - 8));
        *out = buf;
        *out_len = total;
    }
    goto out;
nomem:
    rc = tsr_err(err, TSR_ENOMEM, "out of memory encoding the manifest");
out:
    free(st.b.p);
    for (int s = 0; s < 6; s++) free(recs[s].p);
    return rc;
}

/* ----------------------------------------------------------------- parse */

#define BAD(...) tsr_err(err, TSR_ECORRUPT, __VA_ARGS__)

typedef struct sec_range {
    uint64_t lo, hi;
    uint32_t index;
} sec_range;

static int cmp_sec_range(const void *pa, const void *pb) {
    const sec_range *a = pa, *b = pb;
    if (a->lo != b->lo) return a->lo < b->lo ? -1 : 1;
    return (a->hi > b->hi) - (a->hi < b->hi);
}

static int get_str(const uint8_t *strs, size_t slen, const uint8_t *p, const char *path,
                   const char *what, size_t idx, tsr_manifest *m, const char **out,
                   tsr_error *err) {
    uint32_t off = tsr_ld32(p), len = tsr_ld32(p + 4);
    if ((uint64_t)off + len > slen)
        return BAD("%s: %s %zu: name reference past the string table", path, what, idx);
    if (!tsr_name_valid((const char *)strs + off, len))
        return BAD("%s: %s %zu: invalid name \"%.*s\" (allowed: 1-255 of [A-Za-z0-9_.:+-], no "
                   "empty component)",
                   path, what, idx, (int)(len > 64 ? 64 : len), (const char *)strs + off);
    *out = strpool_add(m, (const char *)strs + off, len);
    return *out ? 0 : tsr_err(err, TSR_ENOMEM, "out of memory");
}

int tsr_manifest_parse(const uint8_t *buf, size_t len, const char *path, unsigned flags,
                       tsr_manifest *m, tsr_error *err) {
    tsr_manifest_init(m);
    int rc;
    if (len < TSR_MF_HEADER_SIZE + 8)
        return BAD("%s: %zu bytes, too short for a MANIFEST", path, len);
    if (len > TSR_MF_MAX_SIZE) return BAD("%s: %zu bytes, over the 4 GiB limit", path, len);
    if (memcmp(buf, TSR_MF_MAGIC, 8) != 0) return BAD("%s: not a tessera MANIFEST (bad magic)", path);
    if (tsr_ld64(buf + 16) != len)
        return BAD("%s: file is %zu bytes but its header says %llu (truncated or extended)", path,
                   len, (unsigned long long)tsr_ld64(buf + 16));
    if (tsr_ld64(buf + len - 8) != tsr_hash(buf, len - 8))
        return BAD("%s: checksum mismatch (the MANIFEST is damaged)", path);
    m->version_major = tsr_ld16(buf + 8);
    m->version_minor = tsr_ld16(buf + 10);
    if (m->version_major != TSR_FORMAT_MAJOR)
        return tsr_err(err, TSR_EVERSION, "%s: format version %u.%u; this tessera reads %u.x",
                       path, m->version_major, m->version_minor, TSR_FORMAT_MAJOR);
    uint32_t hsize = tsr_ld32(buf + 12);
    uint32_t nsec = tsr_ld32(buf + 48);
    if (hsize < TSR_MF_HEADER_SIZE) return BAD("%s: bad header size %u", path, hsize);
    uint64_t table_end = (uint64_t)hsize + (uint64_t)nsec * 32;
    if (table_end > len - 8) return BAD("%s: section table (%u sections) past the end", path, nsec);
    m->step = tsr_ld64(buf + 24);
    memcpy(m->save_id, buf + 32, 16);
    m->created = tsr_ld64(buf + 56);
    m->layout.pp = tsr_ld32(buf + 64);
    m->layout.dp_replicate = tsr_ld32(buf + 68);
    m->layout.dp_shard = tsr_ld32(buf + 72);
    m->layout.tp = tsr_ld32(buf + 76);
    m->layout.n_layers = tsr_ld32(buf + 80);
    m->layout.flags = tsr_ld32(buf + 84);

    const uint8_t *sec[7] = {0};
    uint64_t secsize[7] = {0}, seccount[7] = {0}, secrec[7] = {0};
    const uint32_t minrec[7] = {0, 1, TSR_REC_FILE, TSR_REC_TENSOR, TSR_REC_CHUNK, TSR_REC_FRAME,
                                TSR_REC_BLOB};
    /* section ranges, for the overlap check (nsec is bounded by the file size) */
    sec_range *ranges = malloc(((size_t)nsec + 1) * sizeof *ranges);
    if (!ranges) return tsr_err(err, TSR_ENOMEM, "%s: out of memory", path);
    for (uint32_t s = 0; s < nsec; s++) {
        const uint8_t *e = buf + hsize + 32 * (size_t)s;
        uint32_t type = tsr_ld32(e), sflags = tsr_ld32(e + 4), rec = tsr_ld32(e + 24),
                 count = tsr_ld32(e + 28);
        uint64_t off = tsr_ld64(e + 8), size = tsr_ld64(e + 16);
        if (off % 8 || off < table_end || off > len - 8 || size > len - 8 - off) {
            free(ranges);
            return BAD("%s: section %u (type %u) lies outside the section area", path, s, type);
        }
        if (size != (uint64_t)rec * count) {
            free(ranges);
            return BAD("%s: section %u (type %u): size %llu != %u records of %u bytes", path, s,
                       type, (unsigned long long)size, count, rec);
        }
        ranges[s] = (sec_range){off, off + size, s};
        if (type >= 1 && type <= 6) {
            if (sec[type] || secsize[type] || seccount[type]) {
                free(ranges);
                return BAD("%s: section type %u appears twice", path, type);
            }
            if (rec < minrec[type]) {
                free(ranges);
                return BAD("%s: section type %u: record size %u below %u", path, type, rec,
                           minrec[type]);
            }
            sec[type] = buf + off;
            secsize[type] = size;
            seccount[type] = count;
            secrec[type] = rec;
            if (!size) sec[type] = buf + off; /* present but empty */
        } else if (sflags & 1) {
            free(ranges);
            return BAD("%s: unknown required section type %u (written by a newer tessera)", path,
                       type);
        }
    }
    tsr_sort(ranges, nsec, sizeof *ranges, cmp_sec_range);
    for (uint32_t r = 1; r < nsec; r++)
        if (ranges[r].lo < ranges[r - 1].hi) {
            uint32_t a = ranges[r - 1].index, b = ranges[r].index;
            free(ranges);
            return BAD("%s: sections %u and %u overlap", path, a, b);
        }
    free(ranges);
    for (int t = 1; t <= 6; t++)
        if (!sec[t]) return BAD("%s: section type %d is missing", path, t);

    const uint8_t *strs = sec[TSR_SEC_STRINGS];
    size_t slen = secsize[TSR_SEC_STRINGS];
    /* Reserve the arrays (counts are bounded by the section sizes, so by len). */
#define RESERVE(arr, cnt, cap)                                                   \
    do {                                                                         \
        if ((cnt) > 0) {                                                         \
            (arr) = calloc((cnt), sizeof *(arr));                                \
            if (!(arr)) { rc = tsr_err(err, TSR_ENOMEM, "%s: out of memory", path); goto fail; } \
            (cap) = (cnt);                                                       \
        }                                                                        \
    } while (0)
    RESERVE(m->files, seccount[TSR_SEC_FILES], m->cap_files);
    RESERVE(m->tensors, seccount[TSR_SEC_TENSORS], m->cap_tensors);
    RESERVE(m->chunks, seccount[TSR_SEC_CHUNKS], m->cap_chunks);
    RESERVE(m->frames, seccount[TSR_SEC_FRAMES], m->cap_frames);
    RESERVE(m->blobs, seccount[TSR_SEC_BLOBS], m->cap_blobs);

    for (uint64_t i = 0; i < seccount[TSR_SEC_FILES]; i++) {
        const uint8_t *p = sec[TSR_SEC_FILES] + i * secrec[TSR_SEC_FILES];
        m->files[i].id = tsr_ld32(p);
        m->files[i].size = tsr_ld64(p + 8);
    }
    m->n_files = seccount[TSR_SEC_FILES];

    for (uint64_t i = 0; i < seccount[TSR_SEC_TENSORS]; i++) {
        const uint8_t *p = sec[TSR_SEC_TENSORS] + i * secrec[TSR_SEC_TENSORS];
        tsr_mf_tensor *t = &m->tensors[i];
        if ((rc = get_str(strs, slen, p, path, "tensor", i, m, &t->name, err))) goto fail;
        if ((rc = get_str(strs, slen, p + 8, path, "tensor", i, m, &t->group, err))) goto fail;
        t->dtype = p[16];
        t->ndim = p[17];
        t->placement.tp_dim = (int8_t)p[18];
        t->placement.fsdp = p[19];
        t->placement.pp_role = p[20];
        t->placement.layer = (int32_t)tsr_ld32(p + 24);
        t->chunk_first = tsr_ld32(p + 28);
        t->chunk_count = tsr_ld32(p + 32);
        if (t->ndim > TSR_MAX_DIMS) {
            rc = BAD("%s: tensor %s: %u dims, over the limit of 8", path, t->name, t->ndim);
            goto fail;
        }
        for (uint32_t d = 0; d < TSR_MAX_DIMS; d++) {
            uint64_t v = tsr_ld64(p + 40 + 8 * d);
            if (d >= t->ndim && v) {
                rc = BAD("%s: tensor %s: nonzero shape entry past its %u dims", path, t->name, t->ndim);
                goto fail;
            }
            t->shape[d] = v;
        }
        m->n_tensors++;
    }
    for (uint64_t i = 0; i < seccount[TSR_SEC_CHUNKS]; i++) {
        const uint8_t *p = sec[TSR_SEC_CHUNKS] + i * secrec[TSR_SEC_CHUNKS];
        tsr_mf_chunk *c = &m->chunks[i];
        c->tensor = tsr_ld32(p);
        c->file_id = tsr_ld32(p + 4);
        c->frame_first = tsr_ld32(p + 8);
        c->frame_count = tsr_ld32(p + 12);
        c->split_dim = p[16];
        c->frame_rows = tsr_ld64(p + 24);
        if (c->tensor >= m->n_tensors) {
            rc = BAD("%s: chunk %llu names tensor %u of %zu", path, (unsigned long long)i,
                     c->tensor, m->n_tensors);
            goto fail;
        }
        c->box.ndim = m->tensors[c->tensor].ndim;
        for (uint32_t d = 0; d < TSR_MAX_DIMS; d++) {
            uint64_t o = tsr_ld64(p + 32 + 8 * d), x = tsr_ld64(p + 96 + 8 * d);
            if (d >= c->box.ndim && (o || x)) {
                rc = BAD("%s: chunk %llu of %s: nonzero box entry past its %u dims", path,
                         (unsigned long long)i, m->tensors[c->tensor].name, c->box.ndim);
                goto fail;
            }
            c->box.offset[d] = o;
            c->box.extent[d] = x;
        }
        m->n_chunks++;
    }
    for (uint64_t i = 0; i < seccount[TSR_SEC_FRAMES]; i++) {
        const uint8_t *p = sec[TSR_SEC_FRAMES] + i * secrec[TSR_SEC_FRAMES];
        tsr_mf_frame *f = &m->frames[i];
        f->offset = tsr_ld64(p);
        f->stored_size = tsr_ld64(p + 8);
        f->raw_size = tsr_ld64(p + 16);
        f->raw_hash = tsr_ld64(p + 24);
        f->stored_hash = tsr_ld64(p + 32);
        f->codec = p[40];
        f->file_id = UINT32_MAX;
        m->n_frames++;
    }
    for (uint64_t i = 0; i < seccount[TSR_SEC_BLOBS]; i++) {
        const uint8_t *p = sec[TSR_SEC_BLOBS] + i * secrec[TSR_SEC_BLOBS];
        tsr_mf_blob *b = &m->blobs[i];
        if ((rc = get_str(strs, slen, p, path, "blob", i, m, &b->name, err))) goto fail;
        b->rank = (int32_t)tsr_ld32(p + 8);
        b->file_id = tsr_ld32(p + 12);
        b->frame_first = tsr_ld32(p + 16);
        b->frame_count = tsr_ld32(p + 20);
        b->size = tsr_ld64(p + 24);
        m->n_blobs++;
    }
    if ((rc = tsr_manifest_validate(m, path, flags, err))) goto fail;
    return 0;
fail:
    tsr_manifest_free(m);
    return rc;
}

/* -------------------------------------------------------------- validate */

static const tsr_mf_file *find_file(const tsr_manifest *m, uint32_t id) {
    size_t lo = 0, hi = m->n_files;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (m->files[mid].id < id) lo = mid + 1;
        else hi = mid;
    }
    return lo < m->n_files && m->files[lo].id == id ? &m->files[lo] : NULL;
}

/* Checks that the chunks [first, first+n) of tensor t do not overlap: a sweep
 * along the dim with the most distinct chunk offsets, comparing each chunk only
 * with the chunks still open along that dim. */
typedef struct sweep_item {
    uint64_t lo, hi;
    uint32_t chunk;
} sweep_item;
static int cmp_sweep(const void *pa, const void *pb) {
    const sweep_item *a = pa, *b = pb;
    return (a->lo > b->lo) - (a->lo < b->lo);
}
static int cmp_u64(const void *pa, const void *pb) {
    uint64_t a = *(const uint64_t *)pa, b = *(const uint64_t *)pb;
    return (a > b) - (a < b);
}

static int check_overlap(const tsr_manifest *m, const tsr_mf_tensor *t, const char *path,
                         tsr_error *err) {
    size_t n = t->chunk_count;
    if (n < 2 || t->ndim == 0) return n < 2 ? 0 : BAD("%s: tensor %s: 0-d tensor with %zu chunks", path, t->name, n);
    const tsr_mf_chunk *cs = m->chunks + t->chunk_first;
    uint64_t *tmp = malloc(n * sizeof *tmp);
    sweep_item *items = malloc(n * sizeof *items);
    uint32_t *open = malloc(n * sizeof *open);
    int rc = 0;
    if (!tmp || !items || !open) {
        rc = tsr_err(err, TSR_ENOMEM, "out of memory");
        goto out;
    }
    uint32_t best = 0;
    size_t best_distinct = 0;
    for (uint32_t d = 0; d < t->ndim; d++) {
        for (size_t i = 0; i < n; i++) tmp[i] = cs[i].box.offset[d];
        tsr_sort(tmp, n, sizeof *tmp, cmp_u64);
        size_t distinct = 1;
        for (size_t i = 1; i < n; i++) distinct += tmp[i] != tmp[i - 1];
        if (distinct > best_distinct) best_distinct = distinct, best = d;
    }
    for (size_t i = 0; i < n; i++)
        items[i] = (sweep_item){cs[i].box.offset[best], cs[i].box.offset[best] + cs[i].box.extent[best],
                                (uint32_t)i};
    tsr_sort(items, n, sizeof *items, cmp_sweep);
    size_t nopen = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        size_t keep = 0;
        for (size_t j = 0; j < nopen; j++) {
            const sweep_item *o = &items[open[j]];
            if (o->hi <= items[i].lo) continue; /* closed */
            open[keep++] = open[j];
            tsr_box x;
            if (tsr_box_intersect(&cs[o->chunk].box, &cs[items[i].chunk].box, &x)) {
                rc = BAD("%s: tensor %s: chunks %u and %u overlap", path, t->name,
                         t->chunk_first + o->chunk, t->chunk_first + items[i].chunk);
                break;
            }
        }
        nopen = keep;
        open[nopen++] = (uint32_t)i;
    }
out:
    free(tmp), free(items), free(open);
    return rc;
}

/* The tensor or blob that frame fi belongs to, once frame ranges are known to be
 * consecutive (chunks, then blobs). */
static const char *frame_owner(const tsr_manifest *m, size_t fi) {
    size_t lo = 0, hi = m->n_chunks;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (m->chunks[mid].frame_first + (size_t)m->chunks[mid].frame_count <= fi) lo = mid + 1;
        else hi = mid;
    }
    if (lo < m->n_chunks && m->chunks[lo].frame_first <= fi) return m->tensors[m->chunks[lo].tensor].name;
    for (size_t b = 0; b < m->n_blobs; b++)
        if (fi >= m->blobs[b].frame_first && fi < (size_t)m->blobs[b].frame_first + m->blobs[b].frame_count)
            return m->blobs[b].name;
    return "?";
}

const char *tsr_layout_problem(const tsr_layout *l, char *buf, size_t len) {
    static const char *const names[4] = {"pp", "dp_replicate", "dp_shard", "tp"};
    const uint32_t deg[4] = {l->pp, l->dp_replicate, l->dp_shard, l->tp};
    uint64_t ranks = 1;
    for (int i = 0; i < 4; i++) {
        if (deg[i] == 0) {
            snprintf(buf, len, "mesh degree %s is 0", names[i]);
            return buf;
        }
        ranks *= deg[i]; /* < 2^31 * 2^32 before the check below: no overflow */
        if (ranks > TSR_MAX_RANKS) {
            snprintf(buf, len, "mesh degrees pp=%u dp_replicate=%u dp_shard=%u tp=%u make over %u ranks "
                     "(the limit: a rank is an i32)", l->pp, l->dp_replicate, l->dp_shard, l->tp,
                     TSR_MAX_RANKS);
            return buf;
        }
    }
    if (l->n_layers > TSR_MAX_LAYERS) {
        snprintf(buf, len, "n_layers %u over the limit of %u (a layer is an i32)", l->n_layers, TSR_MAX_LAYERS);
        return buf;
    }
    return NULL;
}

int tsr_manifest_validate(tsr_manifest *m, const char *path, unsigned flags,
                          tsr_error *err) {
    int rc;
    if (m->version_major != TSR_FORMAT_MAJOR)
        return tsr_err(err, TSR_EVERSION, "%s: format version %u", path, m->version_major);
    char why[200];
    if (tsr_layout_problem(&m->layout, why, sizeof why)) return BAD("%s: layout: %s", path, why);
    if (m->n_tensors > UINT32_MAX || m->n_chunks > UINT32_MAX || m->n_frames > UINT32_MAX ||
        m->n_blobs > UINT32_MAX || m->n_files > UINT32_MAX)
        return BAD("%s: too many records", path);
    for (size_t i = 0; i < m->n_files; i++) {
        const tsr_mf_file *f = &m->files[i];
        if (i && f->id <= m->files[i - 1].id)
            return BAD("%s: files not sorted by id or id %u repeated", path, f->id);
        if (f->size < TSR_DATA_HEADER_SIZE || f->size % TSR_ALIGN || f->size > TSR_MAX_FILE_SIZE)
            return BAD("%s: data file %u: bad size %llu", path, f->id, (unsigned long long)f->size);
    }
    uint64_t next_chunk = 0;
    for (size_t i = 0; i < m->n_tensors; i++) {
        const tsr_mf_tensor *t = &m->tensors[i];
        size_t es = tsr_dtype_size(t->dtype);
        if (!tsr_name_valid(t->name, strlen(t->name)))
            return BAD("%s: tensor %zu: invalid name \"%.64s\"", path, i, t->name);
        if (!tsr_name_valid(t->group, strlen(t->group)))
            return BAD("%s: tensor %s: invalid group name", path, t->name);
        if (i && strcmp(m->tensors[i - 1].name, t->name) >= 0)
            return BAD("%s: tensor %s: names not sorted or repeated", path, t->name);
        if (!es) return BAD("%s: tensor %s: unknown dtype %d", path, t->name, t->dtype);
        if (t->ndim > TSR_MAX_DIMS) return BAD("%s: tensor %s: too many dims", path, t->name);
        uint64_t vol = 1;
        for (uint32_t d = 0; d < t->ndim; d++)
            if (tsr_mul_ovf(vol, t->shape[d], &vol)) return BAD("%s: tensor %s: volume overflows", path, t->name);
        if (tsr_mul_ovf(vol, es, &vol) || vol > (1ull << 62))
            return BAD("%s: tensor %s: over 2^62 bytes", path, t->name);
        const tsr_placement *pl = &t->placement;
        if (pl->tp_dim < -1 || pl->tp_dim >= (int)t->ndim || pl->fsdp > 1 || pl->pp_role > 3 ||
            (pl->pp_role == TSR_PP_LAYER ? pl->layer < 0 : pl->layer != -1))
            return BAD("%s: tensor %s: placement out of range", path, t->name);
        /* A writer's table does not know the layout yet; the MANIFEST does. */
        if (!(flags & TSR_MF_PARTIAL) && pl->pp_role == TSR_PP_LAYER && (uint32_t)pl->layer >= m->layout.n_layers)
            return BAD("%s: tensor %s: placement layer %d out of range: the layout has n_layers %u", path, t->name,
                       (int)pl->layer, m->layout.n_layers);
        if (t->chunk_first != next_chunk)
            return BAD("%s: tensor %s: chunk range does not follow the previous tensor's", path, t->name);
        next_chunk += t->chunk_count;
        if (next_chunk > m->n_chunks) return BAD("%s: tensor %s: chunk range past the chunk table", path, t->name);
    }
    if (next_chunk != m->n_chunks)
        return BAD("%s: %llu chunks belong to no tensor", path, (unsigned long long)(m->n_chunks - next_chunk));

    uint64_t next_frame = 0;
    for (size_t t_i = 0; t_i < m->n_tensors; t_i++) {
        const tsr_mf_tensor *t = &m->tensors[t_i];
        size_t es = tsr_dtype_size(t->dtype);
        uint64_t covered = 0, vol = 1;
        for (uint32_t d = 0; d < t->ndim; d++) vol *= t->shape[d];
        for (uint32_t ci = t->chunk_first; ci < t->chunk_first + t->chunk_count; ci++) {
            const tsr_mf_chunk *c = &m->chunks[ci];
            if (c->tensor != t_i) return BAD("%s: chunk %u is in tensor %s's range but names tensor %u", path, ci, t->name, c->tensor);
            if (c->box.ndim != t->ndim) return BAD("%s: chunk %u of %s: box has %u dims", path, ci, t->name, c->box.ndim);
            if (!find_file(m, c->file_id))
                return BAD("%s: chunk %u of %s: unknown data file %u", path, ci, t->name, c->file_id);
            for (uint32_t d = 0; d < t->ndim; d++) {
                uint64_t end;
                if (tsr_add_ovf(c->box.offset[d], c->box.extent[d], &end) || end > t->shape[d])
                    return BAD("%s: chunk %u of %s: box outside the tensor's shape in dim %u", path, ci, t->name, d);
            }
            uint64_t cvol = tsr_box_volume(&c->box);
            if (cvol == 0) return BAD("%s: chunk %u of %s: empty box", path, ci, t->name);
            covered += cvol; /* <= n_chunks * vol <= 2^94: checked below via per-chunk bound */
            if (covered > vol)
                return BAD("%s: tensor %s: chunks hold more elements than the tensor (overlap)", path, t->name);
            if (ci > t->chunk_first && cmp_box_offset(&m->chunks[ci - 1].box, &c->box) >= 0)
                return BAD("%s: chunk %u of %s: chunks not sorted by offset", path, ci, t->name);
            uint64_t nf = tsr_frame_count(&c->box, c->split_dim, c->frame_rows);
            if (nf == UINT64_MAX || nf != c->frame_count)
                return BAD("%s: chunk %u of %s: frame geometry (split dim %u, %llu rows) gives %llu frames, record says %u",
                           path, ci, t->name, c->split_dim, (unsigned long long)c->frame_rows,
                           (unsigned long long)nf, c->frame_count);
            if (c->frame_first != next_frame)
                return BAD("%s: chunk %u of %s: frame range does not follow the previous one", path, ci, t->name);
            next_frame += c->frame_count;
            if (next_frame > m->n_frames) return BAD("%s: chunk %u of %s: frame range past the frame table", path, ci, t->name);
            for (uint32_t k = 0; k < c->frame_count; k++) {
                tsr_box fb;
                tsr_frame_box(c, k, &fb);
                tsr_mf_frame *f = &m->frames[c->frame_first + k];
                uint64_t raw = tsr_box_volume(&fb) * es;
                if (f->raw_size != raw)
                    return BAD("%s: frame %u of %s: raw size %llu, its box holds %llu bytes", path, k, t->name,
                               (unsigned long long)f->raw_size, (unsigned long long)raw);
                if (f->codec != TSR_CODEC_RAW && f->codec != TSR_CODEC_ZSTD &&
                    !(f->codec == TSR_CODEC_BYTEGROUP &&
                      (t->dtype == TSR_F32 || t->dtype == TSR_F16 || t->dtype == TSR_BF16)))
                    return BAD("%s: frame %u of %s: codec %d not allowed for %s", path, k, t->name, f->codec,
                               tsr_dtype_name(t->dtype));
                f->file_id = c->file_id;
            }
        }
        if (!(flags & TSR_MF_PARTIAL)) {
            if (covered != vol)
                return BAD("%s: tensor %s: chunks hold %llu of its %llu elements", path, t->name,
                           (unsigned long long)covered, (unsigned long long)vol);
        }
        if ((rc = check_overlap(m, t, path, err))) return rc;
    }
    for (size_t i = 0; i < m->n_blobs; i++) {
        const tsr_mf_blob *b = &m->blobs[i];
        if (!tsr_name_valid(b->name, strlen(b->name)))
            return BAD("%s: blob %zu: invalid name", path, i);
        if (i && cmp_blob(&m->blobs[i - 1], b) >= 0)
            return BAD("%s: blob %s (rank %d): blobs not sorted or repeated", path, b->name, b->rank);
        if (b->rank < -1) return BAD("%s: blob %s: rank %d", path, b->name, b->rank);
        if (!find_file(m, b->file_id)) return BAD("%s: blob %s: unknown data file %u", path, b->name, b->file_id);
        if (b->frame_first != next_frame)
            return BAD("%s: blob %s: frame range does not follow the previous one", path, b->name);
        next_frame += b->frame_count;
        if (next_frame > m->n_frames) return BAD("%s: blob %s: frame range past the frame table", path, b->name);
        uint64_t sum = 0;
        for (uint32_t k = 0; k < b->frame_count; k++) {
            tsr_mf_frame *f = &m->frames[b->frame_first + k];
            if (f->codec != TSR_CODEC_RAW && f->codec != TSR_CODEC_ZSTD)
                return BAD("%s: blob %s: frame %u: codec %d not allowed for a blob", path, b->name, k, f->codec);
            if (tsr_add_ovf(sum, f->raw_size, &sum)) return BAD("%s: blob %s: size overflows", path, b->name);
            f->file_id = b->file_id;
        }
        if (sum != b->size)
            return BAD("%s: blob %s: frames hold %llu bytes, record says %llu", path, b->name,
                       (unsigned long long)sum, (unsigned long long)b->size);
    }
    if (next_frame != m->n_frames)
        return BAD("%s: %llu frames belong to no chunk or blob", path, (unsigned long long)(m->n_frames - next_frame));

    /* Frames: sizes, then packing per file (sorted by (file, offset)). */
    uint32_t *ord = malloc((m->n_frames + 1) * sizeof *ord);
    if (!ord) return tsr_err(err, TSR_ENOMEM, "out of memory");
    for (size_t i = 0; i < m->n_frames; i++) {
        const tsr_mf_frame *f = &m->frames[i];
        ord[i] = (uint32_t)i;
        if (f->raw_size == 0 || f->raw_size > TSR_MAX_FRAME_RAW) {
            free(ord);
            return BAD("%s: frame %zu of %s: raw size %llu out of range", path, i, frame_owner(m, i),
                       (unsigned long long)f->raw_size);
        }
        if (f->codec == TSR_CODEC_RAW && f->stored_size != f->raw_size) {
            free(ord);
            return BAD("%s: frame %zu of %s: raw frame with stored size %llu != raw size %llu", path, i, frame_owner(m, i),
                       (unsigned long long)f->stored_size, (unsigned long long)f->raw_size);
        }
        if (f->stored_size == 0 || f->stored_size > TSR_MAX_STORED(f->raw_size)) {
            free(ord);
            return BAD("%s: frame %zu of %s: stored size %llu out of range", path, i, frame_owner(m, i),
                       (unsigned long long)f->stored_size);
        }
    }
    tsr_sort_ctx(ord, m->n_frames, sizeof *ord, tsr_mf_cmp_frame_pos, m);
    /* ends[i]: where file i's packed frames end (a file with none: its header) */
    uint64_t *ends = malloc((m->n_files + 1) * sizeof *ends);
    if (!ends) {
        free(ord);
        return tsr_err(err, TSR_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < m->n_files; i++) ends[i] = TSR_DATA_HEADER_SIZE;
    rc = 0;
    for (size_t i = 0; i < m->n_frames; i++) {
        const tsr_mf_frame *f = &m->frames[ord[i]];
        size_t fi = (size_t)(find_file(m, f->file_id) - m->files);
        if (f->offset != ends[fi]) {
            rc = BAD("%s: frame %u of %s in data file %u at offset %llu, expected %llu (frames must be packed)",
                     path, ord[i], frame_owner(m, ord[i]), f->file_id, (unsigned long long)f->offset,
                     (unsigned long long)ends[fi]);
            break;
        }
        if (f->stored_size > TSR_MAX_FILE_SIZE - f->offset) {
            rc = BAD("%s: frame %u of %s: stored size too large", path, ord[i], frame_owner(m, ord[i]));
            break;
        }
        ends[fi] = tsr_align_up(f->offset + f->stored_size, TSR_ALIGN);
    }
    for (size_t i = 0; i < m->n_files && !rc; i++)
        if (m->files[i].size != ends[i])
            rc = BAD("%s: data file %u: size %llu, its frames end at %llu", path, m->files[i].id,
                     (unsigned long long)m->files[i].size, (unsigned long long)ends[i]);
    free(ends);
    free(ord);
    return rc;
}
