/* fuzz_gguf.c: libFuzzer target for the GGUF writer (formats/gguf.h) and its
 * tensor-name rule. The input is a list of records, each an op byte and its
 * fields: a key/value pair (u32, f32, string or bool) or a tensor info (a name of
 * any bytes, dims, type, offset). The names are checked against the rule, written
 * by the writer to a temporary file, and read back by a small GGUF reader here:
 * every accepted key, value and tensor info must come back as written, in
 * order, every number little-endian; a refused name must be one that breaks the
 * rule (1..63 bytes of printable ASCII), refused with a message, and nothing of
 * it written. The library's reader (tsr_gguf_read) reads the file back too
 * (the same tensor infos, or a refusal with a message), and the input itself
 * as a GGUF file: whatever it accepts lies inside the input, names unique. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { MAX_REC = 64 };

typedef struct rec {
    int op; /* 0 u32, 1 f32, 2 string, 3 bool, 4 tensor info */
    char key[300], str[300];
    uint32_t u;
    int ndim;
    uint64_t dims[5], offset;
    int accepted;
} rec;

static rec recs[MAX_REC];

/* input reading: each field takes what is left when the input runs short */
typedef struct in {
    const uint8_t *p, *end;
} in;
static uint8_t in_u8(in *r) { return r->p < r->end ? *r->p++ : 0; }
static uint64_t in_uint(in *r, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) v |= (uint64_t)in_u8(r) << (8 * i);
    return v;
}
static void in_str(in *r, char *out, size_t cap) {
    size_t n = in_u8(r), k = 0;
    for (size_t i = 0; i < n && r->p < r->end; i++) {
        uint8_t c = in_u8(r);
        if (c && k + 1 < cap) out[k++] = (char)c; /* names are C strings */
    }
    out[k] = 0;
}

/* the rule, written out independently */
static int name_ok(const char *s) {
    size_t n = strlen(s);
    if (n < 1 || n > 63) return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x21 || (unsigned char)s[i] > 0x7e) return 0;
    return 1;
}

/* the reader */
typedef struct rd {
    const uint8_t *p;
    size_t n, at;
} rd;
static uint64_t rd_le(rd *r, int bytes) {
    if (r->at + (size_t)bytes > r->n) __builtin_trap(); /* the file ends early */
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) v |= (uint64_t)r->p[r->at + (size_t)i] << (8 * i);
    r->at += (size_t)bytes;
    return v;
}
static void rd_str(rd *r, const char *want) {
    uint64_t n = rd_le(r, 8);
    if (n != strlen(want) || r->at + n > r->n || memcmp(r->p + r->at, want, n) != 0) __builtin_trap();
    r->at += n;
}

/* tsr_gguf_read on the bytes at p: a refusal says why; what it accepts lies
 * inside them. @return the result, freed. */
static int read_lib(const uint8_t *p, size_t len, tsr_gguf_file *g) {
    tsr_error e = {0};
    int rc = tsr_gguf_read(p, len, "fuzz", g, &e);
    if (rc) {
        if (!e.msg[0]) __builtin_trap();
        return rc;
    }
    if (g->data > len) __builtin_trap();
    for (uint64_t k = 0; k < g->n_kv; k++) {
        const tsr_gguf_kv *kv = &g->kv[k];
        if (kv->key < p || kv->key_len > (uint64_t)(p + len - kv->key)) __builtin_trap();
        if (kv->val < p || kv->val_len > (uint64_t)(p + len - kv->val)) __builtin_trap();
    }
    for (uint64_t k = 0; k < g->n_t; k++) {
        const tsr_gguf_tensor *t = &g->t[k];
        if (!t->name[0] || t->ndim < 1 || t->ndim > TSR_GGUF_MAX_DIMS || t->offset > len - g->data) __builtin_trap();
        if (tsr_gguf_find(g, t->name) != (long)k) __builtin_trap();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tsr_gguf_file raw;
    if (read_lib(data, size, &raw) == 0) tsr_gguf_file_free(&raw);
    in r = {data, data + size};
    size_t n = 0, n_tensors = 0;
    while (r.p < r.end && n < MAX_REC) {
        rec *c = &recs[n++];
        memset(c, 0, sizeof *c);
        c->op = in_u8(&r) % 5;
        in_str(&r, c->key, sizeof c->key);
        if (c->op == 2) in_str(&r, c->str, sizeof c->str);
        else if (c->op == 4) {
            c->ndim = in_u8(&r) % 6; /* 0 and 5 are refused */
            for (int i = 0; i < c->ndim; i++) c->dims[i] = in_uint(&r, 8);
            c->u = (uint32_t)in_uint(&r, 4);
            c->offset = in_uint(&r, 8);
            c->accepted = name_ok(c->key) && c->ndim >= 1 && c->ndim <= 4;
            tsr_error e = {0};
            int rc = tsr_gguf_name_check(c->key, &e);
            if ((rc == 0) != name_ok(c->key)) __builtin_trap(); /* the rule, exactly */
            if (rc && !strstr(e.msg, "GGUF tensor name")) __builtin_trap();
            n_tensors += (size_t)c->accepted;
        } else c->u = (uint32_t)in_uint(&r, 4);
    }
    FILE *f = tmpfile();
    if (!f) return 0;
    tsr_gguf_writer g;
    tsr_gguf_begin(&g, f, n_tensors);
    size_t n_kv = 0;
    for (size_t i = 0; i < n; i++) { /* key/value pairs first, as the format has them */
        rec *c = &recs[i];
        float fv;
        memcpy(&fv, &c->u, 4);
        switch (c->op) {
        case 0: tsr_gguf_kv_u32(&g, c->key, c->u); break;
        case 1: tsr_gguf_kv_f32(&g, c->key, fv); break;
        case 2: tsr_gguf_kv_str(&g, c->key, c->str); break;
        case 3: tsr_gguf_kv_bool(&g, c->key, (int)(c->u & 0xff)); break;
        default: continue;
        }
        n_kv++;
    }
    for (size_t i = 0; i < n; i++) {
        rec *c = &recs[i];
        if (c->op != 4) continue;
        tsr_error e = {0};
        uint64_t before = g.pos;
        int rc = tsr_gguf_tensor_info(&g, c->key, c->ndim, c->dims, c->u, c->offset, &e);
        if ((rc == 0) != c->accepted || (rc && (!e.msg[0] || g.pos != before))) __builtin_trap();
    }
    tsr_gguf_pad_to(&g, (g.pos + TSR_GGUF_ALIGN - 1) / TSR_GGUF_ALIGN * TSR_GGUF_ALIGN);
    uint64_t data_at = g.pos;
    float fx[3] = {1.0f, -2.5f, (float)size};
    uint16_t hx[3] = {0x3c00, 0xbf80, (uint16_t)size};
    tsr_gguf_f32s(&g, fx, 3);
    tsr_gguf_u16s(&g, hx, 3);
    if (g.n_kv != n_kv || tsr_gguf_finish(&g) != 0) __builtin_trap();

    /* read it back */
    size_t len = (size_t)g.pos;
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf || fseek(f, 0, SEEK_END) || (size_t)ftell(f) != len || fseek(f, 0, SEEK_SET) ||
        fread(buf, 1, len, f) != len)
        __builtin_trap();
    fclose(f);
    rd b = {buf, len, 0};
    if (rd_le(&b, 4) != 0x46554747u /* "GGUF" */ || rd_le(&b, 4) != TSR_GGUF_VERSION) __builtin_trap();
    if (rd_le(&b, 8) != n_tensors || rd_le(&b, 8) != n_kv) __builtin_trap();
    for (size_t i = 0; i < n; i++) {
        rec *c = &recs[i];
        if (c->op == 4) continue;
        rd_str(&b, c->key);
        static const uint32_t type[4] = {TSR_GGUF_U32, TSR_GGUF_F32, TSR_GGUF_STRING, TSR_GGUF_BOOL};
        if (rd_le(&b, 4) != type[c->op]) __builtin_trap();
        if (c->op == 2) rd_str(&b, c->str);
        else if (c->op == 3) {
            if (rd_le(&b, 1) != ((c->u & 0xff) != 0)) __builtin_trap();
        } else if (rd_le(&b, 4) != c->u) __builtin_trap();
    }
    for (size_t i = 0; i < n; i++) {
        rec *c = &recs[i];
        if (c->op != 4 || !c->accepted) continue;
        rd_str(&b, c->key);
        if (rd_le(&b, 4) != (uint64_t)c->ndim) __builtin_trap();
        for (int k = 0; k < c->ndim; k++)
            if (rd_le(&b, 8) != c->dims[k]) __builtin_trap();
        if (rd_le(&b, 4) != c->u || rd_le(&b, 8) != c->offset) __builtin_trap();
    }
    if (b.at > data_at || data_at % TSR_GGUF_ALIGN) __builtin_trap();
    for (; b.at < data_at; b.at++)
        if (buf[b.at]) __builtin_trap(); /* zero padding */
    for (int k = 0; k < 3; k++) {
        uint32_t bits;
        memcpy(&bits, &fx[k], 4);
        if (rd_le(&b, 4) != bits) __builtin_trap();
    }
    for (int k = 0; k < 3; k++)
        if (rd_le(&b, 2) != hx[k]) __builtin_trap();
    if (b.at != len) __builtin_trap();
    tsr_gguf_file back;
    if (read_lib(buf, len, &back) == 0) { /* refused: a name twice or an offset past the end */
        if (back.n_t != n_tensors || back.n_kv != n_kv || back.version != TSR_GGUF_VERSION) __builtin_trap();
        uint64_t k = 0;
        for (size_t i = 0; i < n; i++) {
            rec *c = &recs[i];
            if (c->op != 4 || !c->accepted) continue;
            const tsr_gguf_tensor *t = &back.t[k++];
            if (strcmp(t->name, c->key) || t->ndim != (uint32_t)c->ndim || t->type != c->u || t->offset != c->offset)
                __builtin_trap();
            for (int d = 0; d < c->ndim; d++)
                if (t->dims[d] != c->dims[d]) __builtin_trap();
        }
        tsr_gguf_file_free(&back);
    }
    free(buf);
    return 0;
}
