/* store_posix.c: the store on a POSIX filesystem (store.h): a directory of
 * files, written with O_DIRECT through io_uring. */
#include <errno.h>
#include <liburing.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "common.h"
#include "store.h"

typedef struct posix_rfile {
    tsr_rfile base;
    int fd;
    char path[PATH_MAX + 64];
} posix_rfile;

#define RING_DEPTH 32
/* A write file queues an fdatasync when asked (the datasync operation: every
 * TSR_STORE_FLUSH_EVERY bytes of writes; one at a time, on the same ring), so
 * that the storage drains its volatile cache (a disk's, or a virtual disk's host
 * cache) while the writer goes on encoding, instead of all at once in the final
 * fsync. Those flushes are only early work: durability still comes from the
 * fsync in finish. */
#define FLUSH_TAG ((uintptr_t)RING_DEPTH) /* user data of the flush's completion */
typedef struct pending {
    const void *buf;
    size_t len;
    uint64_t off;
} pending;
typedef struct posix_wfile {
    tsr_wfile base;
    int fd;
    int direct;
    int have_ring;
    int reserved; /* preallocated or written over: finish sets the final size */
    struct io_uring ring;
    pending inflight[RING_DEPTH];
    int n_inflight;
    int flushing;    /* an fdatasync is queued */
    int failed;      /* a queued write failed: its status */
    tsr_error ferr;  /* and its message */
    char path[PATH_MAX + 64];
} posix_wfile;

static const tsr_store_ops posix_ops;

static int errno_status(int e) { return e == ENOSPC || e == EDQUOT ? TSR_ENOSPC : e == ENOENT ? TSR_ENOTFOUND : TSR_EIO; }

/* ---------------------------------------------------------------- store */

tsr_store *tsr_store_posix_open(const char *location, int create, tsr_error *err) {
    if (create) {
        int e = tsr_mkdir_p(location);
        if (e) {
            tsr_err(err, errno_status(e), "%s: cannot create directory: %s", location, strerror(e));
            return NULL;
        }
    } else {
        struct stat st;
        if (stat(location, &st) != 0 || !S_ISDIR(st.st_mode)) {
            tsr_err(err, TSR_ENOTFOUND, "%s: no such directory", location);
            return NULL;
        }
    }
    tsr_store *s = calloc(1, sizeof *s);
    if (!s) {
        tsr_err(err, TSR_ENOMEM, "out of memory");
        return NULL;
    }
    s->ops = &posix_ops;
    snprintf(s->location, sizeof s->location, "%s", location);
    return s;
}

static void posix_close(tsr_store *s) { free(s); }

/* ------------------------------------------------------------- reading */

/* Opens NAME to read; with `map`, a file in memory is mapped too. */
static int open_read(tsr_store *s, const char *name, int map, tsr_rfile **out, uint64_t *size, tsr_error *err) {
    posix_rfile *f = calloc(1, sizeof *f);
    if (!f) return tsr_err(err, TSR_ENOMEM, "out of memory");
    f->base.ops = s->ops;
    tsr_store_join(s, name, f->path, sizeof f->path);
    f->fd = tsr_open_regular(f->path, size, err); /* a FIFO would block the open */
    if (f->fd < 0) {
        int rc = f->fd;
        free(f);
        return rc;
    }
    /* a file in memory is mapped: reading it would copy what is already there */
    struct statfs fs;
    if (map && *size && fstatfs(f->fd, &fs) == 0 && fs.f_type == TMPFS_MAGIC) {
        void *m = mmap(NULL, *size, PROT_READ, MAP_SHARED, f->fd, 0);
        if (m != MAP_FAILED) f->base.map = m, f->base.map_size = *size;
    }
    *out = &f->base;
    return 0;
}

static int posix_open_read(tsr_store *s, const char *name, tsr_rfile **out, uint64_t *size, tsr_error *err) {
    return open_read(s, name, 1, out, size, err);
}

static int posix_read(tsr_rfile *rf, void *buf, size_t len, uint64_t off, tsr_error *err) {
    posix_rfile *f = (posix_rfile *)rf;
    return tsr_pread_all(f->fd, f->path, buf, len, off, err);
}

static void posix_read_close(tsr_rfile *rf) {
    posix_rfile *f = (posix_rfile *)rf;
    if (rf->map) munmap((void *)rf->map, rf->map_size);
    close(f->fd);
    free(f);
}

static int posix_get(tsr_store *s, const char *name, size_t max, uint8_t **out, size_t *len, tsr_error *err) {
    tsr_rfile *f;
    uint64_t size;
    int rc = open_read(s, name, 0, &f, &size, err); /* read whole: no mapping */
    if (rc) return rc;
    if (size > max) {
        rc = tsr_err(err, TSR_ECORRUPT, "%s: %llu bytes, over the limit of %zu", ((posix_rfile *)f)->path,
                     (unsigned long long)size, max);
        posix_read_close(f);
        return rc;
    }
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) {
        posix_read_close(f);
        return tsr_err(err, TSR_ENOMEM, "out of memory reading %s", name);
    }
    rc = posix_read(f, buf, size, 0, err);
    posix_read_close(f);
    if (rc) {
        free(buf);
        return rc;
    }
    *out = buf;
    *len = size;
    return 0;
}

/* ------------------------------------------------------------- writing */

static int posix_create(tsr_store *s, const char *name, int flags, tsr_wfile **out, tsr_error *err) {
    posix_wfile *f = calloc(1, sizeof *f);
    if (!f) return tsr_err(err, TSR_ENOMEM, "out of memory");
    f->base.ops = s->ops;
    tsr_store_join(s, name, f->path, sizeof f->path);
    f->direct = !(flags & TSR_CREATE_BUFFERED);
    f->reserved = !!(flags & TSR_CREATE_OVERWRITE);
    int mode = O_WRONLY | O_CREAT | O_CLOEXEC | (flags & TSR_CREATE_NEW ? O_EXCL : f->reserved ? 0 : O_TRUNC);
    f->fd = open(f->path, mode | (f->direct ? O_DIRECT : 0), 0644);
    if (f->fd < 0 && f->direct && errno == EINVAL) { /* the filesystem refuses O_DIRECT */
        f->direct = 0;
        f->fd = open(f->path, mode, 0644);
    }
    if (f->fd < 0) {
        int e = errno;
        int rc = e == EEXIST && (flags & TSR_CREATE_NEW)
                     ? tsr_err(err, TSR_EBUSY, "%s: cannot create: it exists (another writer's?)", f->path)
                     : tsr_err(err, errno_status(e), "%s: cannot create: %s", f->path, strerror(e));
        free(f);
        return rc;
    }
    if (!(flags & TSR_CREATE_BUFFERED)) f->have_ring = io_uring_queue_init(RING_DEPTH, &f->ring, 0) == 0;
    *out = &f->base;
    return 0;
}

static void ring_close(posix_wfile *f) {
    if (f->have_ring) io_uring_queue_exit(&f->ring);
    f->have_ring = 0;
}

static int write_all(posix_wfile *f, const void *buf, size_t len, uint64_t off, tsr_error *err) {
    return tsr_pwrite_all(f->fd, f->path, buf, len, off, err);
}

/* A queued fdatasync failed with errno e: the file fails (its first error wins). */
static void flush_failed(posix_wfile *f, int e) {
    if (!f->failed) f->failed = tsr_err(&f->ferr, errno_status(e), "%s: fdatasync: %s", f->path, strerror(e));
}

static void take_cqe(posix_wfile *f, struct io_uring_cqe *cqe);

/* Reaps one completion; a short write is finished with a plain write. */
static void reap_one(posix_wfile *f) {
    struct io_uring_cqe *cqe;
    int r = io_uring_wait_cqe(&f->ring, &cqe);
    if (r < 0) {
        if (!f->failed) f->failed = tsr_err(&f->ferr, TSR_EIO, "%s: io_uring wait: %s", f->path, strerror(-r));
        f->n_inflight = 0;
        f->flushing = 0;
        return;
    }
    take_cqe(f, cqe);
}

static void take_cqe(posix_wfile *f, struct io_uring_cqe *cqe) {
    if ((uintptr_t)io_uring_cqe_get_data(cqe) == FLUSH_TAG) {
        int res = cqe->res;
        io_uring_cqe_seen(&f->ring, cqe);
        f->flushing = 0;
        if (res < 0) flush_failed(f, -res);
        return;
    }
    pending *slot = &f->inflight[(uintptr_t)io_uring_cqe_get_data(cqe)];
    pending done_p = *slot, *p = &done_p;
    slot->buf = NULL;
    int res = cqe->res;
    io_uring_cqe_seen(&f->ring, cqe);
    f->n_inflight--;
    if (f->failed) return;
    if (res < 0) {
        f->failed = tsr_err(&f->ferr, errno_status(-res), "%s: write of %zu bytes at %llu: %s", f->path, p->len,
                            (unsigned long long)p->off, strerror(-res));
    } else if ((size_t)res < p->len) {
        size_t done = (size_t)res;
        tsr_error e;
        if (write_all(f, (const char *)p->buf + done, p->len - done, p->off + done, &e)) {
            f->failed = e.code;
            f->ferr = e;
        }
    }
}

static int posix_submit(tsr_wfile *wf, const void *buf, size_t len, uint64_t off, tsr_error *err) {
    posix_wfile *f = (posix_wfile *)wf;
    if (f->failed) {
        if (err) *err = f->ferr;
        return f->failed;
    }
    if (!f->have_ring) return write_all(f, buf, len, off, err);
    /* slots are indexed by position; wait until one is free */
    while (f->n_inflight == RING_DEPTH) reap_one(f);
    int slot = -1;
    for (int i = 0; i < RING_DEPTH; i++)
        if (!f->inflight[i].buf) {
            slot = i;
            break;
        }
    if (slot < 0) { /* every slot busy though n_inflight < depth: cannot happen */
        return tsr_err(err, TSR_EIO, "%s: io_uring slot bookkeeping", f->path);
    }
    f->inflight[slot] = (pending){buf, len, off};
    struct io_uring_sqe *sqe = io_uring_get_sqe(&f->ring);
    if (!sqe) {
        f->inflight[slot].buf = NULL;
        return write_all(f, buf, len, off, err);
    }
    io_uring_prep_write(sqe, f->fd, buf, (unsigned)len, off);
    io_uring_sqe_set_data(sqe, (void *)(uintptr_t)slot);
    int r = io_uring_submit(&f->ring);
    if (r < 0) {
        f->inflight[slot].buf = NULL;
        return tsr_err(err, TSR_EIO, "%s: io_uring submit: %s", f->path, strerror(-r));
    }
    f->n_inflight++;
    return 0;
}

static int posix_datasync(tsr_wfile *wf) {
    posix_wfile *f = (posix_wfile *)wf;
    struct io_uring_sqe *sqe;
    if (!f->have_ring || f->flushing || !(sqe = io_uring_get_sqe(&f->ring))) return 0;
    io_uring_prep_fsync(sqe, f->fd, IORING_FSYNC_DATASYNC);
    io_uring_sqe_set_data(sqe, (void *)FLUSH_TAG);
    if (io_uring_submit(&f->ring) < 0) return 0;
    f->flushing = 1;
    return 1;
}

static int posix_complete(tsr_wfile *wf, tsr_error *err) {
    posix_wfile *f = (posix_wfile *)wf;
    while (f->have_ring && (f->n_inflight > 0 || f->flushing)) reap_one(f);
    for (int i = 0; i < RING_DEPTH; i++) f->inflight[i].buf = NULL;
    if (f->failed && err) *err = f->ferr;
    return f->failed;
}

static int posix_release(tsr_wfile *wf, const void *buf, tsr_error *err) {
    posix_wfile *f = (posix_wfile *)wf;
    for (int i = 0; i < RING_DEPTH && f->n_inflight > 0; i++)
        while (f->inflight[i].buf == buf && f->n_inflight > 0) reap_one(f);
    if (f->failed && err) *err = f->ferr;
    return f->failed;
}

static int posix_busy(tsr_wfile *wf, const void *buf) {
    posix_wfile *f = (posix_wfile *)wf;
    struct io_uring_cqe *cqe;
    while (f->have_ring && (f->n_inflight > 0 || f->flushing) && io_uring_peek_cqe(&f->ring, &cqe) == 0)
        take_cqe(f, cqe);
    for (int i = 0; i < RING_DEPTH && f->n_inflight > 0; i++)
        if (f->inflight[i].buf == buf) return 1;
    return 0;
}

static int posix_write(tsr_wfile *wf, const void *buf, size_t len, uint64_t off, tsr_error *err) {
    return write_all((posix_wfile *)wf, buf, len, off, err);
}

static void posix_reserve(tsr_wfile *wf, uint64_t bytes) {
    posix_wfile *f = (posix_wfile *)wf;
    if (bytes && fallocate(f->fd, 0, 0, (off_t)tsr_align_up(bytes, TSR_ALIGN)) == 0) f->reserved = 1;
}

/* Removes the file f wrote, closing it: only while its name is still that file
 * (the name may be another writer's by now: FORMAT.md 4.6). */
static void close_unlink_own(posix_wfile *f) {
    struct stat a, b;
    int own = fstat(f->fd, &a) == 0 && stat(f->path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
    if (own) unlink(f->path);
    close(f->fd);
}

static int posix_finish(tsr_wfile *wf, uint64_t size, tsr_error *err) {
    posix_wfile *f = (posix_wfile *)wf;
    int rc = posix_complete(wf, err);
    ring_close(f);
    if (!rc && f->reserved && ftruncate(f->fd, (off_t)size) != 0)
        rc = tsr_err(err, TSR_EIO, "%s: truncate to %llu bytes: %s", f->path, (unsigned long long)size, strerror(errno));
    if (!rc && fsync(f->fd) != 0) rc = tsr_err(err, errno_status(errno), "%s: fsync: %s", f->path, strerror(errno));
    if (rc) close_unlink_own(f);
    else if (close(f->fd) != 0) {
        rc = tsr_err(err, TSR_EIO, "%s: close: %s", f->path, strerror(errno));
        unlink(f->path);
    }
    free(f);
    return rc;
}

static void posix_abort(tsr_wfile *wf) {
    posix_wfile *f = (posix_wfile *)wf;
    if (f->have_ring) {
        posix_complete(wf, NULL);
        ring_close(f);
    }
    close_unlink_own(f);
    free(f);
}

/* ---------------------------------------------------------- committing */

static int posix_rename(tsr_store *s, const char *from, const char *to, int flags, tsr_error *err) {
    char a[PATH_MAX + 64], b[PATH_MAX + 64];
    tsr_store_join(s, from, a, sizeof a);
    tsr_store_join(s, to, b, sizeof b);
    if (!(flags & TSR_PUT_NEW)) {
        if (rename(a, b) != 0) return tsr_err(err, TSR_EIO, "%s: rename to %s: %s", a, to, strerror(errno));
        return 0;
    }
    int e = tsr_rename_new(a, b);
    if (e == EEXIST) return tsr_err(err, TSR_EBUSY, "%s: exists: another writer put it first", b);
    if (e) return tsr_err(err, TSR_EIO, "%s: rename to %s: %s", a, to, strerror(e));
    return 0;
}

/* The directory's fsync: makes the creation or rename of `name` durable. */
static int posix_sync(tsr_store *s, const char *name, tsr_error *err) {
    char what[PATH_MAX + 16];
    snprintf(what, sizeof what, "renaming %s", name);
    return tsr_fsync_dir(s->location, what, err);
}

/* --------------------------------------------------------------- names */

static int posix_exists(tsr_store *s, const char *name, tsr_error *err) {
    char path[PATH_MAX + 64];
    tsr_store_join(s, name, path, sizeof path);
    if (access(path, F_OK) == 0) return 1;
    if (errno == ENOENT || errno == ENOTDIR) return 0;
    return tsr_err(err, TSR_EIO, "%s: %s", path, strerror(errno));
}

static int posix_remove(tsr_store *s, const char *name, tsr_error *err) {
    char path[PATH_MAX + 64];
    tsr_store_join(s, name, path, sizeof path);
    if (unlink(path) != 0 && errno != ENOENT)
        return tsr_err(err, TSR_EIO, "%s: cannot remove: %s", path, strerror(errno));
    return 0;
}

static int posix_list(tsr_store *s, tsr_store_list_fn fn, void *user, tsr_error *err) {
    DIR *d = opendir(s->location);
    if (!d) return tsr_err(err, errno_status(errno), "%s: %s", s->location, strerror(errno));
    struct dirent *ent;
    int rc = 0;
    while (!rc && (ent = readdir(d))) {
        if (!strcmp(ent->d_name, ".") || !strcmp(ent->d_name, "..")) continue;
        char path[PATH_MAX + 300], name[300];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", s->location, ent->d_name);
        if (stat(path, &st) != 0) continue;
        snprintf(name, sizeof name, "%s%s", ent->d_name, S_ISDIR(st.st_mode) ? "/" : "");
        rc = fn(user, name, S_ISDIR(st.st_mode) ? 0 : (uint64_t)st.st_size);
    }
    closedir(d);
    return rc;
}

static const tsr_store_ops posix_ops = {
    .close = posix_close,
    .open_read = posix_open_read,
    .read = posix_read,
    .read_close = posix_read_close,
    .get = posix_get,
    .create = posix_create,
    .write = posix_write,
    .submit = posix_submit,
    .complete = posix_complete,
    .release = posix_release,
    .busy = posix_busy,
    .reserve = posix_reserve,
    .datasync = posix_datasync,
    .finish = posix_finish,
    .abort = posix_abort,
    .put = NULL, /* staged: NAME.tmp, rename, the directory's fsync */
    .rename = posix_rename,
    .sync = posix_sync,
    .exists = posix_exists,
    .remove = posix_remove,
    .list = posix_list,
};
