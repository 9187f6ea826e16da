/* store_posix.c: the store on a POSIX filesystem. */
#include <errno.h>
#include <liburing.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "store.h"
#include "store_s3.h"

/* A store, read file or write file is local, or remote (s3://...) when its
 * `remote` is set: then every call goes to store_s3.c. */
struct tsr_store {
    char dir[PATH_MAX];
    s3_store *remote;
};
struct tsr_rfile {
    s3_rfile *remote;
    int fd;
    char path[PATH_MAX + 64];
};
#define RING_DEPTH 32
/* A write file queues an fdatasync after every FLUSH_EVERY bytes of writes (one
 * at a time, on the same ring), so that the storage drains its volatile cache
 * (a disk's, or a virtual disk's host cache) while the writer goes on encoding,
 * instead of all at once in the final fsync. Those flushes are only early work:
 * durability still comes from the fsync in tsr_wfile_finish. About one stored
 * bf16 frame: in paired runs of `bench save` here, 2-4 MiB steps did better
 * than 8, 16 or 32 MiB ones. */
#define FLUSH_EVERY ((uint64_t)4 << 20)
#define FLUSH_TAG ((uintptr_t)RING_DEPTH) /* user data of the flush's completion */
typedef struct pending {
    const void *buf;
    size_t len;
    uint64_t off;
} pending;
struct tsr_wfile {
    s3_wfile *remote;
    int fd;
    int direct;
    int have_ring;
    int reserved; /* preallocated: finish sets the final size */
    struct io_uring ring;
    pending inflight[RING_DEPTH];
    int n_inflight;
    int flushing;       /* an fdatasync is queued */
    uint64_t unflushed; /* bytes queued since the last one */
    int failed;      /* a queued write failed: its status */
    tsr_error ferr;  /* and its message */
    char path[PATH_MAX + 64];
};

static int write_all(tsr_wfile *f, const void *buf, size_t len, uint64_t off, tsr_error *err);
static int injected_write(tsr_wfile *f, int fault, const void *buf, size_t len, uint64_t off, tsr_error *err);

/* ------------------------------------------------------ fault injection */

static pthread_mutex_t fault_mu = PTHREAD_MUTEX_INITIALIZER;
static long fault_counts[4];
/* datasync: the fdatasyncs a write file queues while it writes (FLUSH_EVERY);
 * fsync: the final ones, of data files and of the MANIFEST */
enum { F_WRITE, F_FSYNC, F_RENAME, F_DATASYNC };

/* set by a "killafter" fault: fault_done() kills the process once the call is done */
static _Thread_local int kill_after;

/* @return 0 (no fault), ENOSPC, EIO, or -1 (short write) for this call of op on
 * `path`; a "kill" fault ends the process here, before the call. */
static int fault_check(int op, const char *path) {
    const char *spec = getenv("TSR_FAULT");
    if (!spec || !*spec) return 0;
    static const char *const names[] = {"write", "fsync", "rename", "datasync"};
    char opname[16], kind[16];
    long n;
    int end = 0;
    if (sscanf(spec, "%15[a-z]:%ld:%15[A-Za-z]%n", opname, &n, kind, &end) != 3 || !end) return 0;
    if (strcmp(opname, "delay") == 0) { /* "delay:USEC:OP[:TEXT]": every OP (on TEXT) takes USEC longer */
        if (strcmp(kind, names[op]) == 0 && n > 0 && (spec[end] != ':' || strstr(path, spec + end + 1))) {
            struct timespec ts = {(time_t)(n / 1000000), (long)(n % 1000000) * 1000};
            nanosleep(&ts, NULL);
        }
        return 0;
    }
    if (strcmp(opname, names[op]) != 0) return 0;
    /* "OP:N:KIND:TEXT": only calls on paths that contain TEXT count */
    if (spec[end] == ':' && !strstr(path, spec + end + 1)) return 0;
    pthread_mutex_lock(&fault_mu);
    long c = ++fault_counts[op];
    pthread_mutex_unlock(&fault_mu);
    if (c != n) return 0;
    if (strcmp(kind, "ENOSPC") == 0) return ENOSPC;
    if (strcmp(kind, "EIO") == 0) return EIO;
    if (strcmp(kind, "short") == 0) return -1;
    if (strcmp(kind, "kill") == 0) kill(getpid(), SIGKILL); /* a crash: nothing after this runs */
    if (strcmp(kind, "killafter") == 0) kill_after = 1;
    return 0;
}

/* After a call that fault_check let through: a crash right after it. */
static void fault_done(void) {
    if (kill_after) kill(getpid(), SIGKILL);
}

static int errno_status(int e) { return e == ENOSPC || e == EDQUOT ? TSR_ENOSPC : e == ENOENT ? TSR_ENOTFOUND : TSR_EIO; }

/* ---------------------------------------------------------------- store */

tsr_store *tsr_store_open(const char *location, int create, tsr_error *err) {
    if (strlen(location) >= PATH_MAX - 1) {
        tsr_err(err, TSR_EINVAL, "%s: path too long", location);
        return NULL;
    }
    if (tsr_store_is_remote(location)) {
        s3_store *r = s3st_open(location, err);
        tsr_store *s = r ? calloc(1, sizeof *s) : NULL;
        if (r && !s) tsr_err(err, TSR_ENOMEM, "out of memory");
        if (!s) {
            s3st_close(r);
            return NULL;
        }
        snprintf(s->dir, sizeof s->dir, "%s", location);
        s->remote = r;
        return s;
    }
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
    snprintf(s->dir, sizeof s->dir, "%s", location);
    return s;
}

int tsr_store_is_remote(const char *location) { return strncmp(location, "s3://", 5) == 0; }

void tsr_store_close(tsr_store *s) {
    if (s) s3st_close(s->remote);
    free(s);
}
const char *tsr_store_location(const tsr_store *s) { return s->dir; }

static void join(const tsr_store *s, const char *name, char *out, size_t len) {
    snprintf(out, len, "%s/%s", s->dir, name);
}

/* ------------------------------------------------------------- reading */

int tsr_store_open_read(tsr_store *s, const char *name, tsr_rfile **out, uint64_t *size,
                        tsr_error *err) {
    tsr_rfile *f = calloc(1, sizeof *f);
    if (!f) return tsr_err(err, TSR_ENOMEM, "out of memory");
    if (s->remote) {
        int rc = s3st_open_read(s->remote, name, &f->remote, size, err);
        if (rc) free(f);
        else *out = f;
        return rc;
    }
    join(s, name, f->path, sizeof f->path);
    f->fd = tsr_open_regular(f->path, size, err); /* a FIFO would block the open */
    if (f->fd < 0) {
        int rc = f->fd;
        free(f);
        return rc;
    }
    *out = f;
    return 0;
}

int tsr_rfile_read(tsr_rfile *f, void *buf, size_t len, uint64_t off, tsr_error *err) {
    if (f->remote) return s3st_read(f->remote, buf, len, off, err);
    size_t done = 0;
    while (done < len) {
        ssize_t n = pread(f->fd, (char *)buf + done, len - done, (off_t)(off + done));
        if (n < 0) {
            if (errno == EINTR) continue;
            return tsr_err(err, TSR_EIO, "%s: read of %zu bytes at %llu: %s", f->path, len,
                           (unsigned long long)off, strerror(errno));
        }
        if (n == 0)
            return tsr_err(err, TSR_ECORRUPT, "%s: unexpected end of file at %llu (truncated)",
                           f->path, (unsigned long long)(off + done));
        done += (size_t)n;
    }
    return 0;
}

void tsr_rfile_close(tsr_rfile *f) {
    if (!f) return;
    if (f->remote) s3st_rclose(f->remote);
    else close(f->fd);
    free(f);
}

/* ------------------------------------------------------------- writing */

int tsr_store_create(tsr_store *s, const char *name, tsr_wfile **out, tsr_error *err) {
    tsr_wfile *f = calloc(1, sizeof *f);
    if (!f) return tsr_err(err, TSR_ENOMEM, "out of memory");
    f->fd = -1;
    join(s, name, f->path, sizeof f->path);
    if (s->remote) {
        int rc = s3st_create(s->remote, name, &f->remote, err);
        if (rc) free(f);
        else *out = f;
        return rc;
    }
    f->direct = 1;
    f->fd = open(f->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0644);
    if (f->fd < 0 && errno == EINVAL) { /* the filesystem refuses O_DIRECT */
        f->direct = 0;
        f->fd = open(f->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    }
    if (f->fd < 0) {
        int e = errno;
        int rc = tsr_err(err, errno_status(e), "%s: cannot create: %s", f->path, strerror(e));
        free(f);
        return rc;
    }
    f->have_ring = io_uring_queue_init(RING_DEPTH, &f->ring, 0) == 0;
    *out = f;
    return 0;
}

static void ring_close(tsr_wfile *f) {
    if (f->have_ring) io_uring_queue_exit(&f->ring);
    f->have_ring = 0;
}

/* A queued fdatasync failed with errno e: the file fails (its first error wins). */
static void flush_failed(tsr_wfile *f, int e) {
    if (!f->failed) f->failed = tsr_err(&f->ferr, errno_status(e), "%s: fdatasync: %s", f->path, strerror(e));
}

/* Reaps one completion; a short write is finished with a plain write. */
static void reap_one(tsr_wfile *f) {
    struct io_uring_cqe *cqe;
    int r = io_uring_wait_cqe(&f->ring, &cqe);
    if (r < 0) {
        if (!f->failed) f->failed = tsr_err(&f->ferr, TSR_EIO, "%s: io_uring wait: %s", f->path, strerror(-r));
        f->n_inflight = 0;
        f->flushing = 0;
        return;
    }
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

int tsr_wfile_submit(tsr_wfile *f, const void *buf, size_t len, uint64_t off, tsr_error *err) {
    if (f->remote) return s3st_write(f->remote, buf, len, off, err); /* copied: nothing stays queued */
    if (f->failed) {
        if (err) *err = f->ferr;
        return f->failed;
    }
    int fault = fault_check(F_WRITE, f->path);
    if (fault) {
        f->failed = injected_write(f, fault, buf, len, off, &f->ferr);
        if (err) *err = f->ferr;
        return f->failed;
    }
    if (!f->have_ring) {
        int rc = write_all(f, buf, len, off, err);
        fault_done();
        return rc;
    }
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
    f->unflushed += len;
    fault_done();
    if (f->unflushed >= FLUSH_EVERY && !f->flushing && (fault = fault_check(F_DATASYNC, f->path)) > 0) {
        flush_failed(f, fault); /* reported by the next call, as a failed completion is */
        f->unflushed = 0;
    } else if (f->unflushed >= FLUSH_EVERY && !f->flushing && (sqe = io_uring_get_sqe(&f->ring))) {
        io_uring_prep_fsync(sqe, f->fd, IORING_FSYNC_DATASYNC);
        io_uring_sqe_set_data(sqe, (void *)FLUSH_TAG);
        if (io_uring_submit(&f->ring) >= 0) f->flushing = 1, f->unflushed = 0;
        fault_done();
    }
    return 0;
}

int tsr_wfile_complete(tsr_wfile *f, tsr_error *err) {
    if (f->remote) return 0;
    while (f->n_inflight > 0 || f->flushing) reap_one(f);
    for (int i = 0; i < RING_DEPTH; i++) f->inflight[i].buf = NULL;
    if (f->failed && err) *err = f->ferr;
    return f->failed;
}

int tsr_wfile_release(tsr_wfile *f, const void *buf, tsr_error *err) {
    if (f->remote) return 0;
    for (int i = 0; i < RING_DEPTH && f->n_inflight > 0; i++)
        while (f->inflight[i].buf == buf && f->n_inflight > 0) reap_one(f);
    if (f->failed && err) *err = f->ferr;
    return f->failed;
}

/* An injected write fault (fault_check's value): ENOSPC/EIO, or a short write
 * that stores half the bytes and reports no space. */
static int injected_write(tsr_wfile *f, int fault, const void *buf, size_t len, uint64_t off, tsr_error *err) {
    if (fault > 0)
        return tsr_err(err, errno_status(fault), "%s: write of %zu bytes at %llu: %s (injected)", f->path, len,
                       (unsigned long long)off, strerror(fault));
    size_t half = len / 2 / TSR_ALIGN * TSR_ALIGN;
    if (half && pwrite(f->fd, buf, half, (off_t)off) < 0) half = 0;
    return tsr_err(err, TSR_ENOSPC, "%s: short write (%zu of %zu bytes) at %llu (injected)", f->path, half, len,
                   (unsigned long long)off);
}

static int write_all(tsr_wfile *f, const void *buf, size_t len, uint64_t off, tsr_error *err) {
    size_t done = 0;
    while (done < len) {
        ssize_t n = pwrite(f->fd, (const char *)buf + done, len - done, (off_t)(off + done));
        if (n < 0) {
            if (errno == EINTR) continue;
            return tsr_err(err, errno_status(errno), "%s: write of %zu bytes at %llu: %s", f->path, len,
                           (unsigned long long)off, strerror(errno));
        }
        if (n == 0)
            return tsr_err(err, TSR_ENOSPC, "%s: short write at %llu", f->path, (unsigned long long)(off + done));
        done += (size_t)n;
    }
    return 0;
}

int tsr_wfile_write(tsr_wfile *f, const void *buf, size_t len, uint64_t off, tsr_error *err) {
    if (f->remote) return s3st_write(f->remote, buf, len, off, err);
    int fault = fault_check(F_WRITE, f->path);
    if (fault) return injected_write(f, fault, buf, len, off, err);
    int rc = write_all(f, buf, len, off, err);
    fault_done();
    return rc;
}

static int fsync_fault(int fd, const char *path) {
    int fault = fault_check(F_FSYNC, path);
    if (fault > 0) {
        errno = fault;
        return -1;
    }
    int rc = fsync(fd), e = errno;
    fault_done();
    errno = e;
    return rc;
}

void tsr_wfile_reserve(tsr_wfile *f, uint64_t bytes) {
    if (f->remote) return;
    if (bytes && fallocate(f->fd, 0, 0, (off_t)tsr_align_up(bytes, TSR_ALIGN)) == 0) f->reserved = 1;
}

int tsr_wfile_finish(tsr_wfile *f, uint64_t size, tsr_error *err) {
    if (f->remote) { /* the upload's completion stands for the fsync */
        int fault = fault_check(F_FSYNC, f->path);
        if (fault > 0) {
            s3st_abort(f->remote);
            free(f);
            return tsr_err(err, errno_status(fault), "%s: completing the upload: %s (injected)", f->path,
                           strerror(fault));
        }
        int rc = s3st_finish(f->remote, size, err);
        if (!rc) fault_done();
        free(f);
        return rc;
    }
    int rc = tsr_wfile_complete(f, err);
    ring_close(f);
    if (!rc && f->reserved && ftruncate(f->fd, (off_t)size) != 0)
        rc = tsr_err(err, TSR_EIO, "%s: truncate to %llu bytes: %s", f->path, (unsigned long long)size, strerror(errno));
    if (rc) {
        close(f->fd);
        unlink(f->path);
        free(f);
        return rc;
    }
    if (fsync_fault(f->fd, f->path) != 0)
        rc = tsr_err(err, errno_status(errno), "%s: fsync: %s", f->path, strerror(errno));
    if (close(f->fd) != 0 && !rc)
        rc = tsr_err(err, TSR_EIO, "%s: close: %s", f->path, strerror(errno));
    f->fd = -1;
    if (rc) {
        unlink(f->path);
    }
    free(f);
    return rc;
}

void tsr_wfile_abort(tsr_wfile *f) {
    if (!f) return;
    if (f->remote) {
        s3st_abort(f->remote);
        free(f);
        return;
    }
    if (f->have_ring) {
        tsr_wfile_complete(f, NULL);
        ring_close(f);
    }
    if (f->fd >= 0) close(f->fd);
    unlink(f->path);
    free(f);
}

static int fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync_fault(fd, dir);
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

int tsr_store_put_atomic(tsr_store *s, const char *name, const void *buf, size_t len,
                         tsr_error *err) {
    char path[PATH_MAX + 64], tmp[PATH_MAX + 80];
    join(s, name, path, sizeof path);
    if (s->remote) { /* one PUT: the object appears whole; it stands for the rename */
        int fault = fault_check(F_RENAME, path);
        if (fault > 0) return tsr_err(err, errno_status(fault), "%s: PUT: %s (injected)", path, strerror(fault));
        int rc = s3st_put(s->remote, name, buf, len, err);
        if (!rc) fault_done();
        return rc;
    }
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return tsr_err(err, errno_status(errno), "%s: cannot create: %s", tmp, strerror(errno));
    size_t done = 0;
    int rc = 0;
    int fault = fault_check(F_WRITE, tmp);
    if (fault)
        rc = tsr_err(err, fault > 0 ? errno_status(fault) : TSR_ENOSPC, "%s: write: %s (injected)", tmp,
                     fault > 0 ? strerror(fault) : "short write");
    while (!rc && done < len) {
        ssize_t n = write(fd, (const char *)buf + done, len - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) rc = tsr_err(err, errno_status(errno), "%s: write: %s", tmp, strerror(errno));
        else done += (size_t)n;
    }
    if (!rc) fault_done();
    if (!rc && fsync_fault(fd, tmp) != 0) rc = tsr_err(err, errno_status(errno), "%s: fsync: %s", tmp, strerror(errno));
    if (close(fd) != 0 && !rc) rc = tsr_err(err, TSR_EIO, "%s: close: %s", tmp, strerror(errno));
    if (!rc) {
        int f = fault_check(F_RENAME, tmp);
        if (f > 0 || (f == 0 && rename(tmp, path) != 0))
            rc = tsr_err(err, TSR_EIO, "%s: rename to %s: %s", tmp, name, strerror(f > 0 ? f : errno));
        else
            fault_done();
    }
    if (rc) {
        unlink(tmp);
        return rc;
    }
    if (fsync_dir(s->dir) != 0) {
        /* the rename may not survive a crash: the caller is told the put failed, so
         * the object must not stay visible either */
        rc = tsr_err(err, TSR_EIO, "%s: fsync of the directory after renaming %s: %s", s->dir, name,
                     strerror(errno));
        unlink(path);
        return rc;
    }
    return 0;
}

int tsr_store_get(tsr_store *s, const char *name, size_t max, uint8_t **out, size_t *len,
                  tsr_error *err) {
    if (s->remote) return s3st_get(s->remote, name, max, out, len, err);
    tsr_rfile *f;
    uint64_t size;
    int rc = tsr_store_open_read(s, name, &f, &size, err);
    if (rc) return rc;
    if (size > max) {
        rc = tsr_err(err, TSR_ECORRUPT, "%s: %llu bytes, over the limit of %zu", f->path,
                     (unsigned long long)size, max);
        tsr_rfile_close(f);
        return rc;
    }
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) {
        tsr_rfile_close(f);
        return tsr_err(err, TSR_ENOMEM, "out of memory reading %s", name);
    }
    rc = tsr_rfile_read(f, buf, size, 0, err);
    tsr_rfile_close(f);
    if (rc) {
        free(buf);
        return rc;
    }
    *out = buf;
    *len = size;
    return 0;
}

int tsr_store_exists(tsr_store *s, const char *name) {
    if (s->remote) return s3st_exists(s->remote, name);
    char path[PATH_MAX + 64];
    join(s, name, path, sizeof path);
    return access(path, F_OK) == 0;
}

int tsr_store_remove(tsr_store *s, const char *name, tsr_error *err) {
    if (s->remote) return s3st_remove(s->remote, name, err);
    char path[PATH_MAX + 64];
    join(s, name, path, sizeof path);
    if (unlink(path) != 0 && errno != ENOENT)
        return tsr_err(err, TSR_EIO, "%s: cannot remove: %s", path, strerror(errno));
    return 0;
}

int tsr_store_list(tsr_store *s, int (*fn)(void *user, const char *name, uint64_t size), void *user,
                   tsr_error *err) {
    if (s->remote) return s3st_list(s->remote, fn, user, err);
    DIR *d = opendir(s->dir);
    if (!d) return tsr_err(err, errno_status(errno), "%s: %s", s->dir, strerror(errno));
    struct dirent *ent;
    int rc = 0;
    while (!rc && (ent = readdir(d))) {
        if (!strcmp(ent->d_name, ".") || !strcmp(ent->d_name, "..")) continue;
        char path[PATH_MAX + 300], name[300];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", s->dir, ent->d_name);
        if (stat(path, &st) != 0) continue;
        snprintf(name, sizeof name, "%s%s", ent->d_name, S_ISDIR(st.st_mode) ? "/" : "");
        rc = fn(user, name, S_ISDIR(st.st_mode) ? 0 : (uint64_t)st.st_size);
    }
    closedir(d);
    return rc;
}
