/* gguf.c: the byte-level GGUF writer and reader (layout in gguf.h). */
#include "gguf.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

int tsr_gguf_name_check(const char *name, tsr_error *err) {
    size_t n = strlen(name);
    if (n == 0 || n > TSR_GGUF_MAX_NAME)
        return tsr_err(err, TSR_EINVAL, "GGUF tensor name \"%.80s%s\": %zu bytes (1 to %d)", name, n > 80 ? "..." : "",
                       n, TSR_GGUF_MAX_NAME);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)name[i] < 0x21 || (unsigned char)name[i] > 0x7e)
            return tsr_err(err, TSR_EINVAL, "GGUF tensor name \"%s\": byte %zu is not printable ASCII", name, i);
    return 0;
}

void tsr_gguf_put(tsr_gguf_writer *g, const void *p, size_t n) {
    if (!g->bad && n && fwrite(p, 1, n, g->f) != n) g->bad = errno ? errno : EIO;
    g->pos += n;
}

void tsr_gguf_u32(tsr_gguf_writer *g, uint32_t v) {
    uint8_t b[4];
    tsr_st32(b, v);
    tsr_gguf_put(g, b, 4);
}

void tsr_gguf_u64(tsr_gguf_writer *g, uint64_t v) {
    uint8_t b[8];
    tsr_st64(b, v);
    tsr_gguf_put(g, b, 8);
}

static uint32_t f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

void tsr_gguf_f32s(tsr_gguf_writer *g, const float *x, size_t n) {
    uint8_t b[4096];
    for (size_t i = 0; i < n;) {
        size_t k = n - i < sizeof b / 4 ? n - i : sizeof b / 4;
        for (size_t j = 0; j < k; j++) tsr_st32(b + 4 * j, f32_bits(x[i + j]));
        tsr_gguf_put(g, b, 4 * k);
        i += k;
    }
}

void tsr_gguf_u16s(tsr_gguf_writer *g, const uint16_t *x, size_t n) {
    uint8_t b[4096];
    for (size_t i = 0; i < n;) {
        size_t k = n - i < sizeof b / 2 ? n - i : sizeof b / 2;
        for (size_t j = 0; j < k; j++) tsr_st16(b + 2 * j, x[i + j]);
        tsr_gguf_put(g, b, 2 * k);
        i += k;
    }
}

void tsr_gguf_str(tsr_gguf_writer *g, const char *s) {
    size_t n = strlen(s);
    tsr_gguf_u64(g, n);
    tsr_gguf_put(g, s, n);
}

void tsr_gguf_pad_to(tsr_gguf_writer *g, uint64_t to) {
    static const uint8_t zero[256];
    while (g->pos < to) tsr_gguf_put(g, zero, to - g->pos < sizeof zero ? (size_t)(to - g->pos) : sizeof zero);
}

void tsr_gguf_begin(tsr_gguf_writer *g, FILE *f, uint64_t n_tensors) {
    *g = (tsr_gguf_writer){f, 0, 0, 0};
    tsr_gguf_put(g, "GGUF", 4);
    tsr_gguf_u32(g, TSR_GGUF_VERSION);
    tsr_gguf_u64(g, n_tensors);
    tsr_gguf_u64(g, 0); /* the number of key/value pairs: patched by tsr_gguf_finish */
}

void tsr_gguf_key(tsr_gguf_writer *g, const char *key, uint32_t type) {
    tsr_gguf_str(g, key);
    tsr_gguf_u32(g, type);
    g->n_kv++;
}

void tsr_gguf_kv_u32(tsr_gguf_writer *g, const char *key, uint32_t v) {
    tsr_gguf_key(g, key, TSR_GGUF_U32);
    tsr_gguf_u32(g, v);
}

void tsr_gguf_kv_f32(tsr_gguf_writer *g, const char *key, float v) {
    tsr_gguf_key(g, key, TSR_GGUF_F32);
    tsr_gguf_u32(g, f32_bits(v));
}

void tsr_gguf_kv_str(tsr_gguf_writer *g, const char *key, const char *v) {
    tsr_gguf_key(g, key, TSR_GGUF_STRING);
    tsr_gguf_str(g, v);
}

void tsr_gguf_kv_bool(tsr_gguf_writer *g, const char *key, int v) {
    uint8_t b = v != 0;
    tsr_gguf_key(g, key, TSR_GGUF_BOOL);
    tsr_gguf_put(g, &b, 1);
}

int tsr_gguf_tensor_info(tsr_gguf_writer *g, const char *name, int ndim, const uint64_t *dims, uint32_t type,
                         uint64_t offset, tsr_error *err) {
    int rc = tsr_gguf_name_check(name, err);
    if (rc) return rc;
    if (ndim < 1 || ndim > 4)
        return tsr_err(err, TSR_EINVAL, "GGUF tensor %s: %d dimensions (1 to 4)", name, ndim);
    tsr_gguf_str(g, name);
    tsr_gguf_u32(g, (uint32_t)ndim);
    for (int i = 0; i < ndim; i++) tsr_gguf_u64(g, dims[i]);
    tsr_gguf_u32(g, type);
    tsr_gguf_u64(g, offset);
    return 0;
}

int tsr_gguf_finish(tsr_gguf_writer *g) {
    uint8_t b[8];
    tsr_st64(b, g->n_kv);
    if (!g->bad && (fseek(g->f, 16, SEEK_SET) || fwrite(b, 8, 1, g->f) != 1)) g->bad = errno ? errno : EIO;
    if (!g->bad && fflush(g->f)) g->bad = errno ? errno : EIO;
    return g->bad;
}

/* ------------------------------------------------------------- reading */

typedef struct rd {
    const uint8_t *p;
    uint64_t len, pos;
} rd;

static int need(rd *r, uint64_t n) { return n <= r->len - r->pos ? 0 : -1; }
static int rd_u32(rd *r, uint32_t *v) {
    if (need(r, 4)) return -1;
    *v = tsr_ld32(r->p + r->pos), r->pos += 4;
    return 0;
}
static int rd_u64(rd *r, uint64_t *v) {
    if (need(r, 8)) return -1;
    *v = tsr_ld64(r->p + r->pos), r->pos += 8;
    return 0;
}
static int rd_str(rd *r, const uint8_t **s, uint64_t *n) {
    if (rd_u64(r, n) || need(r, *n)) return -1;
    *s = r->p + r->pos, r->pos += *n;
    return 0;
}
/* The bytes of a value of a fixed-size type; 0 for strings, arrays and unknown types. */
static uint64_t scalar_size(uint32_t t) {
    static const uint8_t size[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t < 13 ? size[t] : 0;
}
static int skip(rd *r, uint32_t type, int depth) {
    const uint8_t *s;
    uint64_t n, k;
    uint32_t et;
    if (type == TSR_GGUF_STRING) return rd_str(r, &s, &n);
    if (type != TSR_GGUF_ARRAY) {
        uint64_t sz = scalar_size(type);
        if (!sz || need(r, sz)) return -1;
        r->pos += sz;
        return 0;
    }
    if (depth > 4 || rd_u32(r, &et) || rd_u64(r, &n)) return -1;
    uint64_t sz = scalar_size(et);
    if (sz) {
        if (tsr_mul_ovf(sz, n, &k) || need(r, k)) return -1;
        r->pos += k;
        return 0;
    }
    for (k = 0; k < n; k++)
        if (skip(r, et, depth + 1)) return -1;
    return 0;
}

long tsr_gguf_find(const tsr_gguf_file *g, const char *name) {
    for (uint64_t i = 0; i < g->n_t; i++)
        if (!strcmp(g->t[i].name, name)) return (long)i;
    return -1;
}

void tsr_gguf_file_free(tsr_gguf_file *g) {
    free(g->kv);
    free(g->t);
    memset(g, 0, sizeof *g);
}

static int read_kvs(rd *r, const char *what, tsr_gguf_file *g, tsr_error *err) {
    for (uint64_t k = 0; k < g->n_kv; k++) {
        tsr_gguf_kv *kv = &g->kv[k];
        if (rd_str(r, &kv->key, &kv->key_len) || rd_u32(r, &kv->type))
            return tsr_err(err, TSR_ECORRUPT, "%s: key/value %llu runs past the end", what, (unsigned long long)k);
        uint64_t at = r->pos;
        if (kv->type == TSR_GGUF_STRING) {
            if (rd_str(r, &kv->val, &kv->val_len))
                return tsr_err(err, TSR_ECORRUPT, "%s: key/value %llu: its string runs past the end", what,
                               (unsigned long long)k);
        } else if (skip(r, kv->type, 0)) {
            return tsr_err(err, TSR_ECORRUPT, "%s: key/value %llu (type %u) runs past the end or has no known type",
                           what, (unsigned long long)k, kv->type);
        } else {
            kv->val = r->p + at, kv->val_len = r->pos - at;
        }
        if (kv->key_len == 17 && !memcmp(kv->key, "general.alignment", 17) && kv->type == TSR_GGUF_U32) {
            g->alignment = tsr_ld32(kv->val);
            if (!g->alignment || (g->alignment & (g->alignment - 1)))
                return tsr_err(err, TSR_ECORRUPT, "%s: general.alignment %u: not a power of two", what, g->alignment);
        }
    }
    return 0;
}

static int by_name(const void *a, const void *b, void *ctx) {
    const tsr_gguf_file *g = ctx;
    return strcmp(g->t[*(const uint64_t *)a].name, g->t[*(const uint64_t *)b].name);
}

static int read_tensors(rd *r, const char *what, tsr_gguf_file *g, tsr_error *err) {
    for (uint64_t k = 0; k < g->n_t; k++) {
        tsr_gguf_tensor *t = &g->t[k];
        const uint8_t *s;
        uint64_t sl;
        if (rd_str(r, &s, &sl) || sl == 0 || sl > TSR_MAX_NAME || memchr(s, 0, sl) || rd_u32(r, &t->ndim) ||
            t->ndim == 0 || t->ndim > TSR_GGUF_MAX_DIMS)
            return tsr_err(err, TSR_ECORRUPT, "%s: tensor info %llu: a bad name or dimension count", what,
                           (unsigned long long)k);
        memcpy(t->name, s, sl);
        t->name[sl] = 0;
        for (uint32_t d = 0; d < t->ndim; d++)
            if (rd_u64(r, &t->dims[d])) return tsr_err(err, TSR_ECORRUPT, "%s: tensor %s: runs past the end", what, t->name);
        if (rd_u32(r, &t->type) || rd_u64(r, &t->offset))
            return tsr_err(err, TSR_ECORRUPT, "%s: tensor %s: runs past the end", what, t->name);
    }
    /* no name twice: sorted, each against the next */
    uint64_t *order = malloc((g->n_t + 1) * sizeof *order);
    if (!order) return tsr_err(err, TSR_ENOMEM, "out of memory");
    for (uint64_t k = 0; k < g->n_t; k++) order[k] = k;
    tsr_sort_ctx(order, g->n_t, sizeof *order, by_name, g);
    int rc = 0;
    for (uint64_t k = 1; !rc && k < g->n_t; k++)
        if (!strcmp(g->t[order[k - 1]].name, g->t[order[k]].name))
            rc = tsr_err(err, TSR_ECORRUPT, "%s: tensor %s named twice", what, g->t[order[k]].name);
    free(order);
    return rc;
}

int tsr_gguf_read(const uint8_t *p, uint64_t len, const char *what, tsr_gguf_file *g, tsr_error *err) {
    memset(g, 0, sizeof *g);
    g->alignment = TSR_GGUF_ALIGN;
    rd r = {p, len, 0};
    if (need(&r, 4) || memcmp(p, "GGUF", 4) != 0) return tsr_err(err, TSR_ECORRUPT, "%s: not a GGUF file (no magic)", what);
    r.pos = 4;
    if (rd_u32(&r, &g->version) || (g->version != 2 && g->version != 3))
        return tsr_err(err, TSR_ECORRUPT, "%s: GGUF version %u (2 or 3 are read)", what, g->version);
    if (rd_u64(&r, &g->n_t) || rd_u64(&r, &g->n_kv)) return tsr_err(err, TSR_ECORRUPT, "%s: the header runs past the end", what);
    /* a tensor info takes at least 8 + 1 + 4 + 8 + 4 + 8 bytes, a key/value 8 + 4 + 1 */
    if (g->n_t > len / 33 || g->n_kv > len / 13)
        return tsr_err(err, TSR_ECORRUPT, "%s: tensor count %llu or key count %llu past what the file can hold", what,
                       (unsigned long long)g->n_t, (unsigned long long)g->n_kv);
    g->kv = calloc(g->n_kv + 1, sizeof *g->kv);
    g->t = calloc(g->n_t + 1, sizeof *g->t);
    int rc = g->kv && g->t ? 0 : tsr_err(err, TSR_ENOMEM, "out of memory");
    if (!rc) rc = read_kvs(&r, what, g, err);
    if (!rc) rc = read_tensors(&r, what, g, err);
    if (!rc) {
        g->data = tsr_align_up(r.pos, g->alignment);
        if (g->data > len) rc = tsr_err(err, TSR_ECORRUPT, "%s: the data section starts past the end", what);
    }
    for (uint64_t k = 0; !rc && k < g->n_t; k++)
        if (g->t[k].offset > len - g->data)
            rc = tsr_err(err, TSR_ECORRUPT, "%s: tensor %s: its offset %llu is past the end", what, g->t[k].name,
                         (unsigned long long)g->t[k].offset);
    if (rc) tsr_gguf_file_free(g);
    return rc;
}
