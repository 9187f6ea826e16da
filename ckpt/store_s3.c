/* store_s3.c: the store's S3 side (store_s3.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "s3.h"
#include "store_s3.h"

struct s3_store {
    tsr_s3 *s3;
    char bucket[TSR_S3_MAX_BUCKET];
    char prefix[TSR_S3_MAX_KEY]; /* "" or ending in '/' */
};
struct s3_rfile {
    s3_store *st;
    char key[TSR_S3_MAX_KEY];
};
struct s3_wfile {
    tsr_s3_writer *w;
    char url[TSR_S3_MAX_KEY + 80];
    int failed;
    tsr_error ferr;
};

s3_store *s3st_open(const char *location, tsr_error *err) {
    s3_store *s = calloc(1, sizeof *s);
    if (!s) {
        tsr_err(err, TSR_ENOMEM, "out of memory");
        return NULL;
    }
    if (tsr_s3_split(location, s->bucket, sizeof s->bucket, s->prefix, sizeof s->prefix - 1, err)) {
        free(s);
        return NULL;
    }
    size_t n = strlen(s->prefix);
    if (n && s->prefix[n - 1] != '/') s->prefix[n] = '/', s->prefix[n + 1] = 0;
    s->s3 = tsr_s3_new(NULL, err);
    if (!s->s3) {
        tsr_err_prefix(err, "%s", location);
        free(s);
        return NULL;
    }
    return s;
}

void s3st_close(s3_store *s) {
    if (!s) return;
    tsr_s3_free(s->s3);
    free(s);
}

static int key_of(const s3_store *s, const char *name, char *key, tsr_error *err) {
    if ((size_t)snprintf(key, TSR_S3_MAX_KEY, "%s%s", s->prefix, name) >= TSR_S3_MAX_KEY)
        return tsr_err(err, TSR_EINVAL, "s3://%s/%s%s: key too long", s->bucket, s->prefix, name);
    return 0;
}

int s3st_open_read(s3_store *s, const char *name, s3_rfile **out, uint64_t *size, tsr_error *err) {
    s3_rfile *f = calloc(1, sizeof *f);
    if (!f) return tsr_err(err, TSR_ENOMEM, "out of memory");
    f->st = s;
    tsr_s3_object o;
    int rc = key_of(s, name, f->key, err);
    if (!rc) rc = tsr_s3_head(s->s3, s->bucket, f->key, &o, err);
    if (rc == TSR_ENOTFOUND) tsr_err(err, rc, "s3://%s/%s: missing", s->bucket, f->key);
    if (rc) {
        free(f);
        return rc;
    }
    *size = o.size;
    *out = f;
    return 0;
}

int s3st_read(s3_rfile *f, void *buf, size_t len, uint64_t off, tsr_error *err) {
    return tsr_s3_get_range(f->st->s3, f->st->bucket, f->key, off, len, buf, err);
}

void s3st_rclose(s3_rfile *f) { free(f); }

int s3st_create(s3_store *s, const char *name, s3_wfile **out, tsr_error *err) {
    char key[TSR_S3_MAX_KEY];
    if (key_of(s, name, key, err)) return err ? err->code : TSR_EINVAL;
    s3_wfile *f = calloc(1, sizeof *f);
    if (!f) return tsr_err(err, TSR_ENOMEM, "out of memory");
    snprintf(f->url, sizeof f->url, "s3://%s/%s", s->bucket, key);
    f->w = tsr_s3_writer_new(s->s3, s->bucket, key, err);
    if (!f->w) {
        free(f);
        return err ? err->code : TSR_ENOMEM;
    }
    *out = f;
    return 0;
}

int s3st_write(s3_wfile *f, const void *buf, size_t len, uint64_t off, tsr_error *err) {
    if (f->failed) {
        if (err) *err = f->ferr;
        return f->failed;
    }
    uint64_t at = tsr_s3_writer_size(f->w);
    int rc = off != at ? tsr_err(&f->ferr, TSR_EINVAL, "%s: write at %llu, but an object is written in order (next "
                                 "byte %llu)", f->url, (unsigned long long)off, (unsigned long long)at)
                       : tsr_s3_writer_append(f->w, buf, len, &f->ferr);
    if (rc) {
        f->failed = rc;
        if (err) *err = f->ferr;
    }
    return rc;
}

int s3st_finish(s3_wfile *f, uint64_t size, tsr_error *err) {
    int rc = f->failed;
    if (rc) {
        if (err) *err = f->ferr;
        tsr_s3_writer_abort(f->w);
    } else if (size != tsr_s3_writer_size(f->w)) {
        rc = tsr_err(err, TSR_EINVAL, "%s: finish at %llu bytes, but %llu were written", f->url,
                     (unsigned long long)size, (unsigned long long)tsr_s3_writer_size(f->w));
        tsr_s3_writer_abort(f->w);
    } else {
        rc = tsr_s3_writer_finish(f->w, err);
    }
    free(f);
    return rc;
}

void s3st_abort(s3_wfile *f) {
    if (!f) return;
    tsr_s3_writer_abort(f->w);
    free(f);
}

int s3st_put(s3_store *s, const char *name, const void *buf, size_t len, tsr_error *err) {
    char key[TSR_S3_MAX_KEY];
    int rc = key_of(s, name, key, err);
    return rc ? rc : tsr_s3_put(s->s3, s->bucket, key, buf, len, err);
}

int s3st_get(s3_store *s, const char *name, size_t max, uint8_t **out, size_t *len, tsr_error *err) {
    char key[TSR_S3_MAX_KEY];
    int rc = key_of(s, name, key, err);
    return rc ? rc : tsr_s3_get(s->s3, s->bucket, key, max, out, len, err);
}

int s3st_exists(s3_store *s, const char *name) {
    char key[TSR_S3_MAX_KEY];
    return !key_of(s, name, key, NULL) && tsr_s3_head(s->s3, s->bucket, key, NULL, NULL) == 0;
}

int s3st_remove(s3_store *s, const char *name, tsr_error *err) {
    char key[TSR_S3_MAX_KEY];
    int rc = key_of(s, name, key, err);
    return rc ? rc : tsr_s3_delete(s->s3, s->bucket, key, err);
}

typedef struct list_ctx {
    const s3_store *s;
    int (*fn)(void *, const char *, uint64_t);
    void *user;
} list_ctx;

static int list_one(void *user, const tsr_s3_object *o, int is_prefix) {
    list_ctx *c = user;
    size_t pl = strlen(c->s->prefix);
    if (strncmp(o->key, c->s->prefix, pl) != 0 || !o->key[pl]) return 0;
    return c->fn(c->user, o->key + pl, is_prefix ? 0 : o->size);
}

int s3st_list(s3_store *s, int (*fn)(void *user, const char *name, uint64_t size), void *user, tsr_error *err) {
    list_ctx c = {s, fn, user};
    return tsr_s3_list(s->s3, s->bucket, s->prefix, "/", list_one, &c, err);
}
