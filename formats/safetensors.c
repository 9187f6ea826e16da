/* safetensors.c: the safetensors header. */
#include "safetensors.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <fcntl.h>
#include <math.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

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

int tsr_st_header(tsr_st_entry *e, size_t n, const char *metadata, uint8_t **out, size_t *len, tsr_error *err) {
    tsr_sbuf b = {0};
    tsr_sb_printf(&b, "{\"__metadata__\":{\"format\":\"pt\"%s}", metadata ? metadata : "");
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
        tsr_sb_printf(&b, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", e[i].name, dt);
        for (uint32_t d = 0; d < e[i].ndim; d++) {
            tsr_sb_printf(&b, "%s%llu", d ? "," : "", (unsigned long long)e[i].shape[d]);
            bytes *= e[i].shape[d];
        }
        e[i].begin = off;
        e[i].end = off + bytes;
        off = e[i].end;
        tsr_sb_printf(&b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)e[i].begin, (unsigned long long)e[i].end);
    }
    tsr_sb_printf(&b, "}");
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
    tsr_st64(o, hl);
    memcpy(o + 8, b.p, b.n);
    memset(o + 8 + b.n, ' ', hl - b.n);
    free(b.p);
    *out = o;
    *len = 8 + hl;
    return 0;
}

/* ------------------------------------------------------------------ reading */

#define ST_MAX_HEADER (100u << 20) /* the format's own limit */

struct tsr_st_file {
    const uint8_t *buf;
    size_t len, data_off;
    tsr_st_entry *e;
    size_t n;
    char *names;
    void *map; /* tsr_st_open's mapping */
    size_t map_len;
    cJSON *meta; /* "__metadata__", or an empty object */
};

static int st_dtype(const char *s) {
    static const int all[] = {TSR_F32, TSR_F16, TSR_BF16, TSR_F64, TSR_I8, TSR_I16, TSR_I32, TSR_I64, TSR_U8, TSR_BOOL};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        if (strcmp(s, tsr_st_dtype_name(all[i])) == 0) return all[i];
    return 0;
}

/* a JSON number that is a whole number in [0, 2^53) */
static int st_uint(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!(d >= 0) || d >= 9007199254740992.0 || d != floor(d)) return -1;
    *out = (uint64_t)d;
    return 0;
}

static int cmp_begin(const void *a, const void *b) {
    const tsr_st_entry *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const tsr_st_entry *)a)->name, ((const tsr_st_entry *)b)->name);
}

void tsr_st_close(tsr_st_file *f) {
    if (!f) return;
    if (f->map) munmap(f->map, f->map_len);
    free(f->e);
    free(f->names);
    cJSON_Delete(f->meta);
    free(f);
}

/* f's entries: names unique; byte ranges in order, without overlap or hole,
 * up to the end of its `data` bytes. */
static int check_ranges(tsr_st_file *f, uint64_t data, const char *what, tsr_error *err) {
    int rc = 0;
    tsr_st_entry *tmp = malloc((f->n + 1) * sizeof *tmp);
    if (!tmp) return tsr_err(err, TSR_ENOMEM, "out of memory");
    memcpy(tmp, f->e, f->n * sizeof *tmp);
    tsr_sort(tmp, f->n, sizeof *tmp, cmp_name);
    for (size_t i = 1; i < f->n && !rc; i++)
        if (strcmp(tmp[i].name, tmp[i - 1].name) == 0) rc = tsr_err(err, TSR_ECORRUPT, "%s: %s: named twice", what, tmp[i].name);
    free(tmp);
    if (rc) return rc;
    tsr_sort(f->e, f->n, sizeof *f->e, cmp_begin);
    uint64_t at = 0;
    for (size_t i = 0; i < f->n && !rc; i++) {
        if (f->e[i].begin < at)
            rc = tsr_err(err, TSR_ECORRUPT, "%s: %s overlaps %s", what, f->e[i].name, f->e[i - 1].name);
        else if (f->e[i].begin > at)
            rc = tsr_err(err, TSR_ECORRUPT, "%s: a hole of %llu bytes before %s", what,
                         (unsigned long long)(f->e[i].begin - at), f->e[i].name);
        at = f->e[i].end;
    }
    if (!rc && at != data)
        rc = tsr_err(err, TSR_ECORRUPT, "%s: %llu bytes after the last tensor", what, (unsigned long long)(data - at));
    return rc;
}

int tsr_st_parse(const uint8_t *buf, size_t len, const char *what, tsr_st_file **out, tsr_error *err) {
    *out = NULL;
    if (len < 8) return tsr_err(err, TSR_ECORRUPT, "%s: %zu bytes: too short for a safetensors file", what, len);
    uint64_t hl = tsr_ld64(buf);
    if (hl > ST_MAX_HEADER)
        return tsr_err(err, TSR_ECORRUPT, "%s: header length %llu: over the format's limit of %u bytes", what,
                       (unsigned long long)hl, ST_MAX_HEADER);
    if (hl > len - 8)
        return tsr_err(err, TSR_ECORRUPT, "%s: header length %llu runs past the end of the %zu-byte file", what,
                       (unsigned long long)hl, len);
    cJSON *root = cJSON_ParseWithLength((const char *)buf + 8, (size_t)hl);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return tsr_err(err, TSR_ECORRUPT, "%s: the header is not a JSON object", what);
    }
    tsr_st_file *f = calloc(1, sizeof *f);
    size_t n = 0, names = 0;
    for (cJSON *it = root->child; it; it = it->next)
        if (strcmp(it->string, "__metadata__") != 0) n++, names += strlen(it->string) + 1;
    int rc = 0;
    if (!f || !(f->e = calloc(n + 1, sizeof *f->e)) || !(f->names = malloc(names + 1))) {
        rc = tsr_err(err, TSR_ENOMEM, "out of memory");
        goto out;
    }
    f->buf = buf;
    f->len = len;
    f->data_off = 8 + (size_t)hl;
    uint64_t data = len - f->data_off;
    char *np = f->names;
    for (cJSON *it = root->child; it && !rc; it = it->next) {
        const char *name = it->string;
        if (strcmp(name, "__metadata__") == 0) {
            if (!cJSON_IsObject(it)) rc = tsr_err(err, TSR_ECORRUPT, "%s: __metadata__ is not an object", what);
            continue;
        }
        size_t nl = strlen(name);
        if (nl == 0 || nl > TSR_MAX_NAME) {
            rc = tsr_err(err, TSR_ECORRUPT, "%s: a tensor name of %zu bytes (1 to %d)", what, nl, TSR_MAX_NAME);
            break;
        }
        tsr_st_entry *e = &f->e[f->n];
        memcpy(np, name, nl + 1);
        e->name = np;
        np += nl + 1;
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype");
        const cJSON *sh = cJSON_GetObjectItemCaseSensitive(it, "shape");
        const cJSON *of = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
        if (!cJSON_IsObject(it) || !cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(of) ||
            cJSON_GetArraySize(of) != 2) {
            rc = tsr_err(err, TSR_ECORRUPT, "%s: %s: needs dtype, shape and two data_offsets", what, name);
            break;
        }
        if (!(e->dtype = st_dtype(dt->valuestring))) {
            rc = tsr_err(err, TSR_ECORRUPT, "%s: %s: unknown dtype %.32s", what, name, dt->valuestring);
            break;
        }
        int nd = cJSON_GetArraySize(sh);
        if (nd > TSR_MAX_DIMS) {
            rc = tsr_err(err, TSR_ECORRUPT, "%s: %s: %d dims (at most %d)", what, name, nd, TSR_MAX_DIMS);
            break;
        }
        e->ndim = (uint32_t)nd;
        uint64_t bytes = tsr_dtype_size(e->dtype);
        int d = 0;
        for (const cJSON *x = sh->child; x && !rc; x = x->next, d++)
            if (st_uint(x, &e->shape[d]) || tsr_mul_ovf(bytes, e->shape[d], &bytes))
                rc = tsr_err(err, TSR_ECORRUPT, "%s: %s: bad shape in dim %d", what, name, d);
        if (rc) break;
        if (st_uint(of->child, &e->begin) || st_uint(of->child->next, &e->end) || e->begin > e->end) {
            rc = tsr_err(err, TSR_ECORRUPT, "%s: %s: bad data_offsets", what, name);
            break;
        }
        if (e->end > data) {
            rc = tsr_err(err, TSR_ECORRUPT, "%s: %s: data_offsets [%llu, %llu] past the end of the %llu-byte data", what,
                         name, (unsigned long long)e->begin, (unsigned long long)e->end, (unsigned long long)data);
            break;
        }
        if (e->end - e->begin != bytes) {
            rc = tsr_err(err, TSR_ECORRUPT, "%s: %s: %llu bytes at data_offsets, the shape needs %llu", what, name,
                         (unsigned long long)(e->end - e->begin), (unsigned long long)bytes);
            break;
        }
        f->n++;
    }
    if (!rc && !(f->meta = cJSON_DetachItemFromObjectCaseSensitive(root, "__metadata__")) &&
        !(f->meta = cJSON_CreateObject()))
        rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    if (rc) goto out;
    if (!rc) rc = check_ranges(f, data, what, err);
out:
    cJSON_Delete(root);
    if (rc) {
        tsr_st_close(f);
        return rc;
    }
    tsr_sort(f->e, f->n, sizeof *f->e, cmp_name);
    *out = f;
    return 0;
}

int tsr_st_open(const char *path, tsr_st_file **out, tsr_error *err) {
    uint64_t size;
    int fd = tsr_open_regular(path, &size, err);
    if (fd < 0) return fd;
    size_t len = (size_t)size;
    void *m = len ? mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    close(fd);
    if (len && m == MAP_FAILED) return tsr_err(err, TSR_EIO, "%s: cannot map: %s", path, strerror(errno));
    static const uint8_t empty[1];
    int rc = tsr_st_parse(len ? m : empty, len, path, out, err);
    if (rc) {
        if (len) munmap(m, len);
        return rc;
    }
    (*out)->map = len ? m : NULL;
    (*out)->map_len = len;
    return 0;
}

size_t tsr_st_count(const tsr_st_file *f) { return f->n; }
const cJSON *tsr_st_metadata(const tsr_st_file *f) { return f->meta; }
const tsr_st_entry *tsr_st_get(const tsr_st_file *f, size_t i) { return &f->e[i]; }
const uint8_t *tsr_st_bytes(const tsr_st_file *f, size_t i) { return f->buf + f->data_off + f->e[i].begin; }

long tsr_st_find(const tsr_st_file *f, const char *name) {
    size_t lo = 0, hi = f->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(f->e[mid].name, name);
        if (c == 0) return (long)mid;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}
