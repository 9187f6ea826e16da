/* safetensors.c: the safetensors header. */
#include "safetensors.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

const char *tsr_st_dtype_name(int dtype) {
    switch (dtype) {
    case TSR_F32: return "F32";
    case TSR_F16: return "F16";
    case TSR_BF16: return "BF16";
    case TSR_F64: return "F64";
    case TSR_I8: return "I8";
    case TSR_I16: return "I16";
    case TSR_I32: return "I32";
    case TSR_I64: return "I64";
    case TSR_U8: return "U8";
    case TSR_BOOL: return "BOOL";
    default: return NULL;
    }
}

typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void put(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = 1;
            return;
        }
        if (b->p && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = (b->cap ? b->cap * 2 : 4096) + (size_t)k;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
}

int tsr_st_header(tsr_st_entry *e, size_t n, uint8_t **out, size_t *len, tsr_error *err) {
    sbuf b = {0};
    put(&b, "{\"__metadata__\":{\"format\":\"pt\"}");
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        const char *dt = tsr_st_dtype_name(e[i].dtype);
        if (!dt) {
            free(b.p);
            return tsr_err(err, TSR_EINVAL, "%s: safetensors has no dtype %s", e[i].name, tsr_dtype_name(e[i].dtype));
        }
        for (const char *c = e[i].name; *c; c++)
            if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20) {
                free(b.p);
                return tsr_err(err, TSR_EINVAL, "tensor name %s cannot go in a JSON header as it is", e[i].name);
            }
        uint64_t bytes = tsr_dtype_size(e[i].dtype);
        put(&b, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", e[i].name, dt);
        for (uint32_t d = 0; d < e[i].ndim; d++) {
            put(&b, "%s%llu", d ? "," : "", (unsigned long long)e[i].shape[d]);
            bytes *= e[i].shape[d];
        }
        e[i].begin = off;
        e[i].end = off + bytes;
        off = e[i].end;
        put(&b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)e[i].begin, (unsigned long long)e[i].end);
    }
    put(&b, "}");
    if (b.oom) {
        free(b.p);
        return tsr_err(err, TSR_ENOMEM, "out of memory");
    }
    size_t hl = (b.n + 7) / 8 * 8;
    uint8_t *o = malloc(8 + hl);
    if (!o) {
        free(b.p);
        return tsr_err(err, TSR_ENOMEM, "out of memory");
    }
    for (int i = 0; i < 8; i++) o[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(o + 8, b.p, b.n);
    memset(o + 8 + b.n, ' ', hl - b.n);
    free(b.p);
    *out = o;
    *len = 8 + hl;
    return 0;
}
