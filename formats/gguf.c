/* gguf.c: the byte-level GGUF writer (layout in gguf.h). */
#include "gguf.h"

#include <errno.h>
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
