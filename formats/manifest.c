/* manifest.c: the MANIFEST in memory: its string pool, appenders and canonical
 * order (FORMAT.md section 4). Encoding, parsing and validation live in
 * manifest_encode.c, manifest_parse.c and manifest_validate.c. */
#include "manifest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "manifest_impl.h"

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

const char *tsr_mf_strpool_add(tsr_manifest *m, const char *s, size_t len) {
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
    c.name = tsr_mf_strpool_add(m, t->name, strlen(t->name));
    c.group = tsr_mf_strpool_add(m, t->group, strlen(t->group));
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
    c.name = tsr_mf_strpool_add(m, b->name, strlen(b->name));
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

/* ------------------------------------------------------------------ sort */

int tsr_mf_cmp_box_offset(const tsr_box *a, const tsr_box *b) {
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
    return tsr_mf_cmp_box_offset(&a->box, &b->box);
}
int tsr_mf_cmp_blob(const void *pa, const void *pb) {
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
    tsr_sort(m->blobs, m->n_blobs, sizeof *m->blobs, tsr_mf_cmp_blob);
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

/* ------------------------------------------------------- packed sections */

/* In tiles of TILE x TILE bytes, so that both the reads and the writes of a
 * tile stay in cache. */
#define TILE 64

void tsr_mf_transpose(const uint8_t *in, size_t rows, size_t cols, uint8_t *out) {
    for (size_t r0 = 0; r0 < rows; r0 += TILE) {
        size_t r1 = rows - r0 < TILE ? rows : r0 + TILE;
        for (size_t c0 = 0; c0 < cols; c0 += TILE) {
            size_t c1 = cols - c0 < TILE ? cols : c0 + TILE;
            if (rows < cols) /* the inner loop along the side with the shorter stride */
                for (size_t r = r0; r < r1; r++)
                    for (size_t c = c0; c < c1; c++) out[c * rows + r] = in[r * cols + c];
            else
                for (size_t c = c0; c < c1; c++)
                    for (size_t r = r0; r < r1; r++) out[c * rows + r] = in[r * cols + c];
        }
    }
}
