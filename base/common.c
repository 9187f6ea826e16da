/* common.c: errors, logging, checksum and allocation helpers. */
#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>
#if defined(__x86_64__)
/* XXH3 on the widest vectors this CPU has (AVX2, AVX-512; the plain build's
 * SSE2 otherwise): the same hashes, a quarter less of the CPU a save spends on
 * its checksums */
#include <xxh_x86dispatch.h>
#endif

static const char *const status_names[] = {
    "OK", "EINVAL", "EIO", "ECORRUPT", "ENOMEM", "ENOTFOUND", "EVERSION", "ENOSPC", "EBUSY",
};

const char *tsr_status_name(int status) {
    int i = -status;
    if (i < 0 || i >= (int)(sizeof status_names / sizeof status_names[0])) return "E?";
    return status_names[i];
}

int tsr_err(tsr_error *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->code = code;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

void tsr_err_prefix(tsr_error *err, const char *fmt, ...) {
    if (!err) return;
    char prefix[512], old[TSR_ERROR_MSG];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    old[sizeof old - 1] = 0;
    size_t p = strlen(prefix), o = strlen(old), cap = sizeof err->msg - 1;
    if (p > cap) p = cap;
    memcpy(err->msg, prefix, p);
    size_t n = p;
    if (n + 2 <= cap) memcpy(err->msg + n, ": ", 2), n += 2;
    if (o > cap - n) o = cap - n;
    memcpy(err->msg + n, old, o);
    err->msg[n + o] = 0;
}

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static tsr_log_fn log_fn;
static void *log_user;

void tsr_set_log(tsr_log_fn fn, void *user) {
    pthread_mutex_lock(&log_mu);
    log_fn = fn;
    log_user = user;
    pthread_mutex_unlock(&log_mu);
}

void tsr_log(int level, const char *fmt, ...) {
    pthread_mutex_lock(&log_mu);
    tsr_log_fn fn = log_fn;
    void *user = log_user;
    pthread_mutex_unlock(&log_mu);
    if (!fn) return;
    char msg[TSR_ERROR_MSG];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fn(user, level, msg);
}

uint64_t tsr_hash(const void *data, size_t len) { return XXH3_64bits(data, len); }

int tsr_grow(void **arr, size_t *cap, size_t n, size_t elem) {
    if (n < *cap) return 0;
    size_t nc = *cap ? *cap * 2 : 16, bytes;
    if (nc < *cap || __builtin_mul_overflow(nc, elem, &bytes)) return TSR_ENOMEM;
    void *p = realloc(*arr, bytes);
    if (!p) return TSR_ENOMEM;
    *arr = p;
    *cap = nc;
    return 0;
}

void *tsr_alloc_aligned(size_t size) {
    void *p = NULL;
    if (posix_memalign(&p, TSR_ALIGN, size ? tsr_align_up(size, TSR_ALIGN) : TSR_ALIGN)) return NULL;
    return p;
}

int tsr_rename_new(const char *from, const char *to) {
    if (renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE) == 0) return 0;
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) return errno;
    if (link(from, to) != 0) return errno;
    unlink(from);
    return 0;
}

int tsr_mkdir_p(const char *path) {
    char tmp[PATH_MAX];
    size_t n = strlen(path);
    if (n >= sizeof tmp) return ENAMETOOLONG;
    memcpy(tmp, path, n + 1);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0755) && errno != EEXIST) return errno;
        *p = '/';
    }
    if (mkdir(tmp, 0755) && errno != EEXIST) return errno;
    struct stat st;
    if (stat(tmp, &st)) return errno;
    return S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
}

static const char *file_kind(mode_t m) {
    return S_ISFIFO(m) ? "a FIFO" : S_ISDIR(m) ? "a directory" : S_ISCHR(m) ? "a character device" :
           S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : S_ISLNK(m) ? "a symbolic link" : "special";
}

int tsr_open_regular(const char *path, uint64_t *size, tsr_error *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        int e = errno;
        return tsr_err(err, e == ENOENT ? TSR_ENOTFOUND : TSR_EIO, "%s: %s", path, e == ENOENT ? "missing" : strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return tsr_err(err, TSR_EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return tsr_err(err, TSR_EIO, "%s: not a regular file (%s)", path, file_kind(st.st_mode));
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(fd);
        return tsr_err(err, TSR_EIO, "%s: fcntl: %s", path, strerror(e));
    }
    if (size) *size = (uint64_t)st.st_size;
    return fd;
}

int tsr_pread_all(int fd, const char *path, void *buf, size_t len, uint64_t off, tsr_error *err) {
    for (size_t done = 0; done < len;) {
        ssize_t n = pread(fd, (char *)buf + done, len - done, (off_t)(off + done));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0)
            return tsr_err(err, TSR_EIO, "%s: read of %zu bytes at %llu: %s", path, len, (unsigned long long)off,
                           strerror(errno));
        if (n == 0)
            return tsr_err(err, TSR_ECORRUPT, "%s: unexpected end of file at %llu (truncated)", path,
                           (unsigned long long)(off + done));
        done += (size_t)n;
    }
    return 0;
}

int tsr_pwrite_all(int fd, const char *path, const void *buf, size_t len, uint64_t off, tsr_error *err) {
    for (size_t done = 0; done < len;) {
        ssize_t n = pwrite(fd, (const char *)buf + done, len - done, (off_t)(off + done));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0)
            return tsr_err(err, errno == ENOSPC || errno == EDQUOT ? TSR_ENOSPC : TSR_EIO,
                           "%s: write of %zu bytes at %llu: %s", path, len, (unsigned long long)off, strerror(errno));
        if (n == 0)
            return tsr_err(err, TSR_ENOSPC, "%s: short write at %llu", path, (unsigned long long)(off + done));
        done += (size_t)n;
    }
    return 0;
}

int tsr_sb_reserve(tsr_sbuf *b, size_t k) {
    if (b->oom) return TSR_ENOMEM;
    if (b->p && b->n + k + 1 <= b->cap) return 0;
    size_t nc = b->cap ? b->cap * 2 : 1024;
    while (nc < b->n + k + 1) nc *= 2;
    char *np = realloc(b->p, nc);
    if (!np) {
        b->oom = 1;
        return TSR_ENOMEM;
    }
    b->p = np;
    b->cap = nc;
    return 0;
}

void tsr_sb_put(tsr_sbuf *b, const void *s, size_t k) {
    if (tsr_sb_reserve(b, k)) return;
    if (k) memcpy(b->p + b->n, s, k);
    b->n += k;
    b->p[b->n] = 0;
}

void tsr_sb_printf(tsr_sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = b->cap - b->n;
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? room : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = 1;
            return;
        }
        if (b->p && (size_t)k < room) {
            b->n += (size_t)k;
            return;
        }
        if (tsr_sb_reserve(b, (size_t)k)) return;
    }
}

double tsr_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int tsr_parse_u64(const char *s, uint64_t *out) {
    if (!s || !*s) return -1;
    uint64_t v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9') return -1;
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, (uint64_t)(*p - '0'), &v)) return -1;
    }
    *out = v;
    return 0;
}

int tsr_parse_size(const char *s, uint64_t *out) {
    if (!s || !*s) return -1;
    char num[32];
    size_t n = strlen(s);
    uint64_t mult = 1;
    char last = s[n - 1];
    if (last == 'b' || last == 'B') { /* "256MB", "256MiB" */
        n--;
        if (n && (s[n - 1] == 'i')) n--;
        last = n ? s[n - 1] : 0;
    }
    switch (last) {
    case 'k': case 'K': mult = 1ull << 10; n--; break;
    case 'm': case 'M': mult = 1ull << 20; n--; break;
    case 'g': case 'G': mult = 1ull << 30; n--; break;
    case 't': case 'T': mult = 1ull << 40; n--; break;
    default: break;
    }
    if (n == 0 || n >= sizeof num) return -1;
    memcpy(num, s, n);
    num[n] = 0;
    uint64_t v;
    if (tsr_parse_u64(num, &v) || __builtin_mul_overflow(v, mult, &v)) return -1;
    *out = v;
    return 0;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

void tsr_remove_tree(const char *dir) { nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

int tsr_fsync_dir(const char *dir, const char *what, tsr_error *err) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int rc = fd >= 0 ? fsync(fd) : -1, e = errno;
    if (fd >= 0) close(fd);
    if (rc != 0)
        return tsr_err(err, TSR_EIO, "%s: fsync of the directory%s%s: %s", dir, what ? " after " : "", what ? what : "",
                       strerror(e));
    return 0;
}

const char *tsr_path_base(const char *path, char *buf, size_t len) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && path[b - 1] != '/') b--;
    snprintf(buf, len, "%.*s", (int)(n - b), path + b);
    return buf;
}
