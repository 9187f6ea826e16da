/* export_verify.c: an export's digests checked from the export alone
 * (tsr_export_verify, FORMAT.md 13): the files of a safetensors folder (its
 * index's, or model.safetensors) or one safetensors file, each with its
 * "__metadata__", and GGUF files (tsr_gguf_read). Also what import
 * shares with it: the files of a Hugging Face folder and their metadata. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "export_impl.h"
#include "gguf.h"
#include "safetensors.h"

const char *tsr_export_status_name(tsr_export_status s) {
    static const char *const names[] = {"OK", "MISMATCH", "NOT RECORDED", "UNSUPPORTED", "MISSING"};
    return (unsigned)s < sizeof names / sizeof *names ? names[s] : "?";
}

/* ------------------------------------------------------ safetensors files */

static char *read_small(const char *path, size_t max, tsr_error *e) {
    uint64_t size;
    int fd = tsr_open_regular(path, &size, e);
    if (fd < 0) return NULL;
    char *buf = size <= max ? malloc((size_t)size + 1) : NULL;
    int rc = size > max ? tsr_err(e, TSR_EINVAL, "%s: larger than %zu bytes", path, max)
             : !buf     ? tsr_err(e, TSR_ENOMEM, "out of memory")
                        : tsr_pread_all(fd, path, buf, (size_t)size, 0, e);
    close(fd);
    if (rc) {
        free(buf);
        return NULL;
    }
    buf[size] = 0;
    return buf;
}

int tsr_export_st_files(const char *dir, char ***names, size_t *n, tsr_error *e) {
    char path[PATH_MAX];
    *names = NULL;
    *n = 0;
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (access(path, F_OK) != 0) {
        if (!(*names = calloc(1, sizeof **names)) || !((*names)[0] = strdup("model.safetensors"))) {
            free(*names), *names = NULL;
            return tsr_err(e, TSR_ENOMEM, "out of memory");
        }
        *n = 1;
        return 0;
    }
    char *text = read_small(path, 64 << 20, e);
    if (!text) return e->code;
    cJSON *c = cJSON_Parse(text);
    free(text);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(c, "weight_map");
    int rc = cJSON_IsObject(wm) ? 0 : tsr_err(e, TSR_EINVAL, "%s: no weight_map object", path);
    size_t cap = rc ? 0 : (size_t)cJSON_GetArraySize(wm);
    if (!rc && !(*names = calloc(cap + 1, sizeof **names))) rc = tsr_err(e, TSR_ENOMEM, "out of memory");
    for (const cJSON *x = rc ? NULL : wm->child; x && !rc; x = x->next) {
        if (!cJSON_IsString(x) || !*x->valuestring || strchr(x->valuestring, '/') || !strcmp(x->valuestring, "..")) {
            rc = tsr_err(e, TSR_EINVAL, "%s: weight_map: %s: not a file name", path, x->string);
            break;
        }
        size_t k = 0;
        while (k < *n && strcmp((*names)[k], x->valuestring) != 0) k++;
        if (k == *n && !((*names)[(*n)++] = strdup(x->valuestring))) rc = tsr_err(e, TSR_ENOMEM, "out of memory");
    }
    cJSON_Delete(c);
    if (rc) tsr_export_st_files_free(*names, *n), *names = NULL, *n = 0;
    return rc;
}

void tsr_export_st_files_free(char **names, size_t n) {
    for (size_t k = 0; names && k < n; k++) free(names[k]);
    free(names);
}

/* ------------------------------------------------------------- the check */

typedef struct vctx {
    void (*check)(void *user, const tsr_export_check *c);
    void *user;
    tsr_export_provenance *prov;
    const char *first; /* the file whose step and hash prov holds */
    long failed;
} vctx;

/* A string value of the metadata, or NULL. */
static const char *meta_str(const cJSON *meta, const char *prefix, const char *name) {
    char key[TSR_MAX_NAME + 64];
    snprintf(key, sizeof key, "%s%s", prefix, name);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(meta, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* The file's step and MANIFEST hash, which every file of the export shares. */
static int take_provenance(vctx *v, const char *file, const cJSON *meta, tsr_error *e) {
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(meta, TSR_EXPORT_KEY_STEP);
    const cJSON *mh = cJSON_GetObjectItemCaseSensitive(meta, TSR_EXPORT_KEY_MANIFEST);
    uint64_t step = 0, hash = 0;
    int has_step = st != NULL, has_hash = mh != NULL;
    if (st && !(cJSON_IsString(st) && tsr_parse_u64(st->valuestring, &step) == 0))
        return tsr_err(e, TSR_ECORRUPT, "%s: %s is not a step in decimal", file, TSR_EXPORT_KEY_STEP);
    if (mh && !(cJSON_IsString(mh) && tsr_export_hex(mh->valuestring, &hash) == 0))
        return tsr_err(e, TSR_ECORRUPT, "%s: %s is not 16 hex digits", file, TSR_EXPORT_KEY_MANIFEST);
    tsr_export_provenance *p = v->prov;
    if (!v->first) {
        v->first = file;
        p->has_step = has_step, p->step = step, p->has_manifest = has_hash, p->manifest_xxh3 = hash;
        return 0;
    }
    if (has_step != p->has_step || step != p->step || has_hash != p->has_manifest || hash != p->manifest_xxh3)
        return tsr_err(e, TSR_ECORRUPT, "%s and %s record other sources (step, MANIFEST hash): not one export",
                       v->first, file);
    return 0;
}

/* One tensor of a file: n elements of dtype (0: a type without a digest) at
 * data, in the file's order. */
static int check_tensor(vctx *v, const char *file, const cJSON *meta, const char *name, int dtype, uint32_t ndim,
                        const uint64_t *shape, const void *data, uint64_t n, tsr_error *e) {
    tsr_export_check c = {.file = file, .name = name, .dtype = dtype, .ndim = ndim};
    memcpy(c.shape, shape, ndim * sizeof *shape);
    const char *rec = meta_str(meta, TSR_EXPORT_KEY_DIGEST, name);
    if (rec && tsr_export_hex(rec, &c.recorded))
        return tsr_err(e, TSR_ECORRUPT, "%s: %s%s is not 16 hex digits", file, TSR_EXPORT_KEY_DIGEST, name);
    size_t es = dtype ? tsr_dtype_size(dtype) : 0;
    uint64_t crc = es ? tsr_digest_tensor(0, es, data, n) : 0; /* a digest is a key xor this */
    if (es) c.digest = tsr_digest_key(name, dtype) ^ crc;
    c.status = !rec ? TSR_EXPORT_NOT_RECORDED : !es ? TSR_EXPORT_UNSUPPORTED
               : c.digest == c.recorded ? TSR_EXPORT_OK : TSR_EXPORT_MISMATCH;
    const char *src = meta_str(meta, TSR_EXPORT_KEY_SOURCE, name);
    const char *srd = meta_str(meta, TSR_EXPORT_KEY_SOURCE_DIGEST, name);
    if (src && srd && es) {
        if (tsr_export_hex(srd, &c.source_recorded))
            return tsr_err(e, TSR_ECORRUPT, "%s: %s%s is not 16 hex digits", file, TSR_EXPORT_KEY_SOURCE_DIGEST, name);
        c.source = src;
        c.source_digest = tsr_digest_key(src, dtype) ^ crc;
        c.source_status = c.source_digest == c.source_recorded ? TSR_EXPORT_OK : TSR_EXPORT_MISMATCH;
    }
    if (c.status == TSR_EXPORT_MISMATCH || c.status == TSR_EXPORT_UNSUPPORTED ||
        (c.source && c.source_status != TSR_EXPORT_OK))
        v->failed++;
    if (v->check) v->check(v->user, &c);
    return 0;
}

/* The digests a file records of tensors it does not hold. */
static void check_missing(vctx *v, const char *file, const cJSON *meta, int (*holds)(const void *f, const char *name),
                          const void *f) {
    size_t pl = strlen(TSR_EXPORT_KEY_DIGEST);
    for (const cJSON *x = meta->child; x; x = x->next) {
        if (strncmp(x->string, TSR_EXPORT_KEY_DIGEST, pl) != 0 || holds(f, x->string + pl)) continue;
        tsr_export_check c = {.file = file, .name = x->string + pl, .status = TSR_EXPORT_MISSING};
        if (cJSON_IsString(x)) tsr_export_hex(x->valuestring, &c.recorded);
        v->failed++;
        if (v->check) v->check(v->user, &c);
    }
}

static int st_holds(const void *f, const char *name) { return tsr_st_find(f, name) >= 0; }

/* One safetensors file: its path, and its name for messages. */
static int verify_st_file(vctx *v, const char *path, const char *fname, tsr_error *e) {
    tsr_st_file *f = NULL;
    int rc = tsr_st_open(path, &f, e);
    const cJSON *meta = rc ? NULL : tsr_st_metadata(f);
    if (!rc) rc = take_provenance(v, fname, meta, e);
    for (size_t i = 0; !rc && i < tsr_st_count(f); i++) {
        const tsr_st_entry *en = tsr_st_get(f, i);
        uint64_t n = (en->end - en->begin) / tsr_dtype_size(en->dtype);
        rc = check_tensor(v, fname, meta, en->name, en->dtype, en->ndim, en->shape, tsr_st_bytes(f, i), n, e);
    }
    if (!rc) check_missing(v, fname, meta, st_holds, f);
    tsr_st_close(f);
    return rc;
}

/* ------------------------------------------------------------- GGUF files */

/* GGUF (v2 and v3), read by tsr_gguf_read: the string key/values that start
 * with "tessera." taken as the provenance, each tensor checked. */

/* ggml's element types with a digest: the tessera dtype of their elements. */
static int gg_dtype(uint32_t t) {
    switch (t) {
    case 0: return TSR_F32;
    case 1: return TSR_F16;
    case 24: return TSR_I8;
    case 25: return TSR_I16;
    case 26: return TSR_I32;
    case 27: return TSR_I64;
    case 28: return TSR_F64;
    case 30: return TSR_BF16;
    default: return 0;
    }
}

static int gg_holds(const void *f, const char *name) { return tsr_gguf_find(f, name) >= 0; }

/* The "tessera." string key/values of g into meta. */
static int gg_meta(const tsr_gguf_file *g, const char *fname, cJSON *meta, tsr_error *e) {
    for (uint64_t k = 0; k < g->n_kv; k++) {
        const tsr_gguf_kv *kv = &g->kv[k];
        char key[TSR_MAX_NAME + 64], val[4097];
        if (kv->key_len >= sizeof key || memchr(kv->key, 0, kv->key_len) || kv->key_len < 8 ||
            memcmp(kv->key, "tessera.", 8))
            continue;
        memcpy(key, kv->key, kv->key_len), key[kv->key_len] = 0;
        if (kv->type != TSR_GGUF_STRING) continue;
        if (kv->val_len >= sizeof val || memchr(kv->val, 0, kv->val_len))
            return tsr_err(e, TSR_ECORRUPT, "%s: %s: not a string value", fname, key);
        memcpy(val, kv->val, kv->val_len), val[kv->val_len] = 0;
        if (cJSON_GetObjectItemCaseSensitive(meta, key)) return tsr_err(e, TSR_ECORRUPT, "%s: key %s twice", fname, key);
        if (!cJSON_AddStringToObject(meta, key, val)) return tsr_err(e, TSR_ENOMEM, "out of memory");
    }
    return 0;
}

static int verify_gguf(vctx *v, const char *path, const char *fname, tsr_error *e) {
    uint64_t size;
    int fd = tsr_open_regular(path, &size, e);
    if (fd < 0) return fd;
    void *m = size ? mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    close(fd);
    if (size && m == MAP_FAILED) return tsr_err(e, TSR_EIO, "%s: cannot map: %s", path, strerror(errno));
    tsr_gguf_file g;
    int rc = tsr_gguf_read(m, size, fname, &g, e);
    if (rc) {
        if (size) munmap(m, (size_t)size);
        return rc;
    }
    cJSON *meta = cJSON_CreateObject();
    rc = meta ? gg_meta(&g, fname, meta, e) : tsr_err(e, TSR_ENOMEM, "out of memory");
    if (!rc) rc = take_provenance(v, fname, meta, e);
    const uint8_t *data = (const uint8_t *)m + g.data;
    for (uint64_t i = 0; !rc && i < g.n_t; i++) {
        const tsr_gguf_tensor *t = &g.t[i];
        int dt = gg_dtype(t->type);
        uint64_t n = 1, bytes = 0, shape[TSR_GGUF_MAX_DIMS];
        for (uint32_t d = 0; d < t->ndim && !rc; d++) {
            shape[d] = t->dims[t->ndim - 1 - d];
            if (tsr_mul_ovf(n, t->dims[d], &n))
                rc = tsr_err(e, TSR_ECORRUPT, "%s: tensor %s: its dims overflow", fname, t->name);
        }
        if (!rc && dt && (tsr_mul_ovf(n, tsr_dtype_size(dt), &bytes) || bytes > size - g.data - t->offset))
            rc = tsr_err(e, TSR_ECORRUPT, "%s: tensor %s: %llu bytes at offset %llu run past the end", fname, t->name,
                         (unsigned long long)bytes, (unsigned long long)t->offset);
        if (!rc) rc = check_tensor(v, fname, meta, t->name, dt, t->ndim, shape, data + t->offset, n, e);
    }
    if (!rc) check_missing(v, fname, meta, gg_holds, &g);
    tsr_gguf_file_free(&g);
    cJSON_Delete(meta);
    if (size) munmap(m, (size_t)size);
    return rc;
}

/* -------------------------------------------------------------- the entry */

long tsr_export_verify(const char *path, void (*check)(void *user, const tsr_export_check *c), void *user,
                       tsr_export_provenance *prov, tsr_error *e) {
    tsr_export_provenance p0;
    if (!prov) prov = &p0;
    memset(prov, 0, sizeof *prov);
    vctx v = {check, user, prov, NULL, 0};
    struct stat st;
    if (stat(path, &st) != 0) return tsr_err(e, errno == ENOENT ? TSR_ENOTFOUND : TSR_EIO, "%s: %s", path, strerror(errno));
    int rc = 0;
    if (S_ISDIR(st.st_mode)) {
        char **names = NULL, fp[PATH_MAX + 300];
        size_t n = 0;
        prov->format = TSR_EXPORT_SAFETENSORS;
        rc = tsr_export_st_files(path, &names, &n, e);
        for (size_t k = 0; !rc && k < n; k++) {
            snprintf(fp, sizeof fp, "%s/%s", path, names[k]);
            rc = verify_st_file(&v, fp, names[k], e);
        }
        prov->n_files = n;
        tsr_export_st_files_free(names, n);
    } else {
        uint8_t magic[4] = {0};
        int fd = tsr_open_regular(path, NULL, e);
        if (fd < 0) return fd;
        ssize_t got = pread(fd, magic, 4, 0);
        close(fd);
        char base[PATH_MAX];
        tsr_path_base(path, base, sizeof base);
        prov->n_files = 1;
        if (got == 4 && !memcmp(magic, "GGUF", 4)) {
            prov->format = TSR_EXPORT_GGUF;
            rc = verify_gguf(&v, path, base, e);
        } else {
            prov->format = TSR_EXPORT_SAFETENSORS;
            rc = verify_st_file(&v, path, base, e);
        }
    }
    return rc ? rc : v.failed;
}
