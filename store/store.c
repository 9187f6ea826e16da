/* store.c: the store's calls (store.h), each handed to the operations of the
 * store, read file or write file it is made on; the staged atomic put. The
 * stores build on it; store_open.c chooses one. */
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "common.h"
#include "store.h"

void tsr_store_close(tsr_store *s) {
    if (s) s->ops->close(s);
}


void tsr_store_join(const tsr_store *s, const char *name, char *out, size_t len) {
    snprintf(out, len, "%s/%s", s->location, name);
}

/* ------------------------------------------------------------- reading */

int tsr_store_open_read(tsr_store *s, const char *name, tsr_rfile **out, uint64_t *size, tsr_error *err) {
    return s->ops->open_read(s, name, out, size, err);
}

int tsr_rfile_read(tsr_rfile *f, void *buf, size_t len, uint64_t off, tsr_error *err) {
    return f->ops->read(f, buf, len, off, err);
}

const uint8_t *tsr_rfile_map(tsr_rfile *f, uint64_t off, size_t len) {
    if (!f->map || off > f->map_size || len > f->map_size - off) return NULL;
    return f->map + off;
}

void tsr_rfile_close(tsr_rfile *f) {
    if (f) f->ops->read_close(f);
}

int tsr_store_get(tsr_store *s, const char *name, size_t max, uint8_t **out, size_t *len, tsr_error *err) {
    return s->ops->get(s, name, max, out, len, err);
}

/* ------------------------------------------------------------- writing */

int tsr_store_create(tsr_store *s, const char *name, int flags, tsr_wfile **out, tsr_error *err) {
    return s->ops->create(s, name, flags & (TSR_CREATE_OVERWRITE | TSR_CREATE_NEW), out, err);
}

int tsr_wfile_write(tsr_wfile *f, const void *buf, size_t len, uint64_t off, tsr_error *err) {
    return f->ops->write(f, buf, len, off, err);
}

/* The datasync requests come from here, so that every store, and the fault
 * store around it, sees the same ones. */
int tsr_wfile_submit(tsr_wfile *f, const void *buf, size_t len, uint64_t off, tsr_error *err) {
    int rc = f->ops->submit(f, buf, len, off, err);
    if (rc) return rc;
    f->unflushed += len;
    if (f->unflushed >= TSR_STORE_FLUSH_EVERY && f->ops->datasync && f->ops->datasync(f)) f->unflushed = 0;
    return 0;
}


int tsr_wfile_release(tsr_wfile *f, const void *buf, tsr_error *err) { return f->ops->release(f, buf, err); }

int tsr_wfile_busy(tsr_wfile *f, const void *buf) { return f->ops->busy ? f->ops->busy(f, buf) : 0; }

void tsr_wfile_reserve(tsr_wfile *f, uint64_t bytes) { f->ops->reserve(f, bytes); }

int tsr_wfile_finish(tsr_wfile *f, uint64_t size, tsr_error *err) { return f->ops->finish(f, size, err); }

void tsr_wfile_abort(tsr_wfile *f) {
    if (f) f->ops->abort(f);
}

/* ---------------------------------------------------------- committing */

int tsr_store_put_atomic(tsr_store *s, const char *name, const void *buf, size_t len, tsr_error *err) {
    return s->ops->put ? s->ops->put(s, name, buf, len, 0, err) : tsr_store_put_staged(s, name, buf, len, 0, err);
}

int tsr_store_put_new(tsr_store *s, const char *name, const void *buf, size_t len, tsr_error *err) {
    return s->ops->put ? s->ops->put(s, name, buf, len, TSR_PUT_NEW, err)
                       : tsr_store_put_staged(s, name, buf, len, TSR_PUT_NEW, err);
}

int tsr_store_put_staged(tsr_store *s, const char *name, const void *buf, size_t len, int flags, tsr_error *err) {
    char tmp[PATH_MAX];
    /* a put that must not replace stages under a name of its own: two writers
     * of one name never write into one staging file */
    int unique = flags & TSR_PUT_NEW;
    uint64_t tag = 0;
    if (unique && getrandom(&tag, sizeof tag, 0) != sizeof tag)
        return tsr_err(err, TSR_EIO, "%s/%s: cannot draw a random name", s->location, name);
    int n = unique ? snprintf(tmp, sizeof tmp, "%s.tmp-%016llx", name, (unsigned long long)tag)
                   : snprintf(tmp, sizeof tmp, "%s.tmp", name);
    if ((size_t)n >= sizeof tmp) return tsr_err(err, TSR_EINVAL, "%s/%s: name too long", s->location, name);
    tsr_wfile *f;
    int rc = s->ops->create(s, tmp, TSR_CREATE_BUFFERED | (unique ? TSR_CREATE_NEW : 0), &f, err);
    if (rc) return rc;
    if ((rc = f->ops->write(f, buf, len, 0, err))) {
        f->ops->abort(f);
        return rc;
    }
    if ((rc = f->ops->finish(f, len, err))) return rc; /* a failed finish removes it */
    if ((rc = s->ops->rename(s, tmp, name, flags, err))) {
        s->ops->remove(s, tmp, NULL);
        return rc;
    }
    /* the rename may not survive a crash: the caller is told the put failed, so
     * the object must not stay visible either */
    if ((rc = s->ops->sync(s, name, err))) s->ops->remove(s, name, NULL);
    return rc;
}

/* --------------------------------------------------------------- names */

int tsr_store_exists(tsr_store *s, const char *name, tsr_error *err) { return s->ops->exists(s, name, err); }

int tsr_store_remove(tsr_store *s, const char *name, tsr_error *err) { return s->ops->remove(s, name, err); }

int tsr_store_list(tsr_store *s, tsr_store_list_fn fn, void *user, tsr_error *err) {
    return s->ops->list(s, fn, user, err);
}
