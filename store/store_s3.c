/* store_s3.c: the store on S3 (store.h), for locations written
 * s3://bucket/prefix. Objects are named PREFIX/NAME; a write file is a streaming
 * multipart upload (writes must come in order), so nothing is visible under its
 * name before finish; a put is one PUT, atomic by nature. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "s3.h"
#include "store.h"

typedef struct s3_store {
    tsr_store base;
    tsr_s3 *s3;
    char bucket[TSR_S3_MAX_BUCKET];
    char prefix[TSR_S3_MAX_KEY]; /* "" or ending in '/' */
} s3_store;
typedef struct s3_rfile {
    tsr_rfile base;
    s3_store *st;
    char key[TSR_S3_MAX_KEY];
} s3_rfile;
typedef struct s3_wfile {
    tsr_wfile base;
    tsr_s3_writer *w;
    char url[TSR_S3_MAX_KEY + 80];
    int failed;
    tsr_error ferr;
} s3_wfile;

static const tsr_store_ops s3_ops;

tsr_store *tsr_store_s3_open(const char *location, int create, tsr_error *err) {
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
    s->base.ops = &s3_ops;
    snprintf(s->base.location, sizeof s->base.location, "%s", location);
    return &s->base;
}

static void s3st_close(tsr_store *st) {
    s3_store *s = (s3_store *)st;
    tsr_s3_free(s->s3);
    free(s);
}

static int key_of(const s3_store *s, const char *name, char *key, tsr_error *err) {
    if ((size_t)snprintf(key, TSR_S3_MAX_KEY, "%s%s", s->prefix, name) >= TSR_S3_MAX_KEY)
        return tsr_err(err, TSR_EINVAL, "s3://%s/%s%s: key too long", s->bucket, s->prefix, name);
    return 0;
}

/* ------------------------------------------------------------- reading */

static int s3st_open_read(tsr_store *st, const char *name, tsr_rfile **out, uint64_t *size, tsr_error *err) {
    s3_store *s = (s3_store *)st;
    s3_rfile *f = calloc(1, sizeof *f);
    if (!f) return tsr_err(err, TSR_ENOMEM, "out of memory");
    f->base.ops = st->ops;
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
    *out = &f->base;
    return 0;
}

static int s3st_read(tsr_rfile *rf, void *buf, size_t len, uint64_t off, tsr_error *err) {
    s3_rfile *f = (s3_rfile *)rf;
    return tsr_s3_get_range(f->st->s3, f->st->bucket, f->key, off, len, buf, err);
}

static void s3st_read_close(tsr_rfile *f) { free(f); }

static int s3st_get(tsr_store *st, const char *name, size_t max, uint8_t **out, size_t *len, tsr_error *err) {
    s3_store *s = (s3_store *)st;
    char key[TSR_S3_MAX_KEY];
    int rc = key_of(s, name, key, err);
    return rc ? rc : tsr_s3_get(s->s3, s->bucket, key, max, out, len, err);
}

/* ------------------------------------------------------------- writing */

static int s3st_exists(tsr_store *st, const char *name, tsr_error *err);

static int s3st_create(tsr_store *st, const char *name, int flags, tsr_wfile **out, tsr_error *err) {
    s3_store *s = (s3_store *)st;
    char key[TSR_S3_MAX_KEY];
    if (key_of(s, name, key, err)) return err ? err->code : TSR_EINVAL;
    s3_wfile *f = calloc(1, sizeof *f);
    if (!f) return tsr_err(err, TSR_ENOMEM, "out of memory");
    f->base.ops = st->ops;
    snprintf(f->url, sizeof f->url, "s3://%s/%s", s->bucket, key);
    int there = flags & TSR_CREATE_NEW ? s3st_exists(st, name, err) : 0;
    if (there) {
        if (there > 0) tsr_err(err, TSR_EBUSY, "%s: cannot create: it exists (another writer's?)", f->url);
        free(f);
        return there > 0 ? TSR_EBUSY : there;
    }
    f->w = tsr_s3_writer_new(s->s3, s->bucket, key, !!(flags & TSR_CREATE_NEW), err);
    if (!f->w) {
        free(f);
        return err ? err->code : TSR_ENOMEM;
    }
    *out = &f->base;
    return 0;
}

/* Appends to the upload: the bytes are copied, so nothing stays queued. */
static int s3st_write(tsr_wfile *wf, const void *buf, size_t len, uint64_t off, tsr_error *err) {
    s3_wfile *f = (s3_wfile *)wf;
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

static int s3st_complete(tsr_wfile *f, tsr_error *err) { return 0; }

static int s3st_release(tsr_wfile *f, const void *buf, tsr_error *err) { return 0; }

static void s3st_reserve(tsr_wfile *f, uint64_t bytes) {}

/* The upload's completion stands for the fsync. */
static int s3st_finish(tsr_wfile *wf, uint64_t size, tsr_error *err) {
    s3_wfile *f = (s3_wfile *)wf;
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

static void s3st_abort(tsr_wfile *wf) {
    s3_wfile *f = (s3_wfile *)wf;
    tsr_s3_writer_abort(f->w);
    free(f);
}

/* ---------------------------------------------------------- committing */

static int s3st_put(tsr_store *st, const char *name, const void *buf, size_t len, int flags, tsr_error *err) {
    s3_store *s = (s3_store *)st;
    char key[TSR_S3_MAX_KEY];
    int rc = key_of(s, name, key, err);
    if (rc) return rc;
    return flags & TSR_PUT_NEW ? tsr_s3_put_new(s->s3, s->bucket, key, buf, len, err)
                               : tsr_s3_put(s->s3, s->bucket, key, buf, len, err);
}

/* --------------------------------------------------------------- names */

static int s3st_exists(tsr_store *st, const char *name, tsr_error *err) {
    s3_store *s = (s3_store *)st;
    char key[TSR_S3_MAX_KEY];
    int rc = key_of(s, name, key, err);
    if (!rc) rc = tsr_s3_head(s->s3, s->bucket, key, NULL, err);
    return rc == 0 ? 1 : rc == TSR_ENOTFOUND ? 0 : rc;
}

static int s3st_remove(tsr_store *st, const char *name, tsr_error *err) {
    s3_store *s = (s3_store *)st;
    char key[TSR_S3_MAX_KEY];
    int rc = key_of(s, name, key, err);
    return rc ? rc : tsr_s3_delete(s->s3, s->bucket, key, err);
}

typedef struct list_ctx {
    const s3_store *s;
    tsr_store_list_fn fn;
    void *user;
} list_ctx;

static int list_one(void *user, const tsr_s3_object *o, int is_prefix) {
    list_ctx *c = user;
    size_t pl = strlen(c->s->prefix);
    if (strncmp(o->key, c->s->prefix, pl) != 0 || !o->key[pl]) return 0;
    return c->fn(c->user, o->key + pl, is_prefix ? 0 : o->size);
}

/* Names directly under the location: objects, and "sub/" for deeper keys. */
static int s3st_list(tsr_store *st, tsr_store_list_fn fn, void *user, tsr_error *err) {
    s3_store *s = (s3_store *)st;
    list_ctx c = {s, fn, user};
    return tsr_s3_list(s->s3, s->bucket, s->prefix, "/", list_one, &c, err);
}

static const tsr_store_ops s3_ops = {
    .close = s3st_close,
    .open_read = s3st_open_read,
    .read = s3st_read,
    .read_close = s3st_read_close,
    .get = s3st_get,
    .create = s3st_create,
    .write = s3st_write,
    .submit = s3st_write,
    .complete = s3st_complete,
    .release = s3st_release,
    .reserve = s3st_reserve,
    .datasync = NULL, /* an upload is durable once complete, and not before */
    .finish = s3st_finish,
    .abort = s3st_abort,
    .put = s3st_put,
    .rename = NULL, /* put is atomic by itself */
    .sync = NULL,
    .exists = s3st_exists,
    .remove = s3st_remove,
    .list = s3st_list,
};
