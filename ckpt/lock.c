/* lock.c: one writer per checkpoint folder.
 *
 * A local folder is locked with flock(2) on FOLDER/LOCK, a file that names the
 * holder (host, pid, start time). The kernel releases the lock when the holder's
 * file is closed, also when the process dies, so a lock never outlives its
 * holder; the file itself may stay behind and means nothing unless locked.
 * Object storage has no locks: there the folder holds a lease object PREFIX/LOCK
 * with the same text while a writer works, and a writer refuses a prefix where
 * one exists (a holder that died leaves it behind: it is removed by hand). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "store.h"

#define LOCK_NAME "LOCK"
#define HOLDER_MAX 512

struct tsr_folder_lock {
    int fd;          /* local: the locked file; -1 for a lease */
    tsr_store *lease; /* remote: the store that holds the lease object */
};

static void holder_text(char *buf, size_t len) {
    char host[256] = "?";
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = 0;
    time_t now = time(NULL);
    struct tm tm;
    char when[32] = "?";
    if (gmtime_r(&now, &tm)) strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    snprintf(buf, len, "host %s, pid %ld, started %s\n", host, (long)getpid(), when);
}

/* The holder's text as one line without its newline ("unknown" if empty). */
static void holder_line(char *buf, size_t n) {
    buf[n] = 0;
    char *nl = strchr(buf, '\n');
    if (nl) *nl = 0;
    for (char *p = buf; *p; p++)
        if ((unsigned char)*p < 32) *p = '?';
    if (!buf[0]) snprintf(buf, HOLDER_MAX, "holder not yet recorded");
}

static int refuse(tsr_error *err, const char *dir, char *holder) {
    return tsr_err(err, TSR_EBUSY,
                   "%s: another writer holds this checkpoint folder (%s; lock %s/" LOCK_NAME
                   "); only one job or tool may write a checkpoint folder at a time",
                   dir, holder, dir);
}

static int take_lease(const char *dir, int create, tsr_folder_lock **out, tsr_error *err) {
    tsr_store *st = tsr_store_open(dir, 0, err);
    if (!st) return err ? err->code : TSR_EIO;
    if (tsr_store_exists(st, LOCK_NAME)) {
        uint8_t *b = NULL;
        size_t n = 0;
        char holder[HOLDER_MAX + 1] = "";
        if (tsr_store_get(st, LOCK_NAME, HOLDER_MAX, &b, &n, NULL) == 0) {
            memcpy(holder, b, n < HOLDER_MAX ? n : HOLDER_MAX);
            holder_line(holder, n < HOLDER_MAX ? n : HOLDER_MAX);
        } else {
            snprintf(holder, sizeof holder, "holder unreadable");
        }
        free(b);
        tsr_store_close(st);
        int rc = refuse(err, dir, holder);
        tsr_err_prefix(err, "lease object present (remove it if its holder is gone)");
        return rc;
    }
    if (!create) {
        tsr_store_close(st);
        return 0;
    }
    char text[HOLDER_MAX];
    holder_text(text, sizeof text);
    int rc = tsr_store_put_atomic(st, LOCK_NAME, text, strlen(text), err);
    tsr_folder_lock *l = rc ? NULL : calloc(1, sizeof *l);
    if (!rc && !l) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    if (rc) {
        tsr_store_close(st);
        return rc;
    }
    l->fd = -1;
    l->lease = st;
    *out = l;
    return 0;
}

int tsr_folder_lock_take(const char *dir, int create, tsr_folder_lock **out, tsr_error *err) {
    *out = NULL;
    if (tsr_store_is_remote(dir)) return take_lease(dir, create, out, err);
    char path[PATH_MAX + 16];
    if (snprintf(path, sizeof path, "%s/" LOCK_NAME, dir) >= (int)sizeof path)
        return tsr_err(err, TSR_EINVAL, "%s: path too long", dir);
    if (create) {
        int e = tsr_mkdir_p(dir);
        if (e) return tsr_err(err, TSR_EIO, "%s: cannot create the checkpoint folder: %s", dir, strerror(e));
    }
    /* O_NONBLOCK: a FIFO planted under the name must not hang the open */
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NONBLOCK | (create ? O_CREAT : 0), 0644);
    if (fd < 0) {
        if (!create && (errno == ENOENT || errno == ENOTDIR)) return 0; /* nobody ever locked it */
        return tsr_err(err, errno == ENOSPC ? TSR_ENOSPC : TSR_EIO, "%s: cannot open the lock file: %s", path,
                       strerror(errno));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return tsr_err(err, TSR_EINVAL, "%s: not a regular file", path);
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        char holder[HOLDER_MAX + 1] = "";
        ssize_t n = e == EWOULDBLOCK ? pread(fd, holder, HOLDER_MAX, 0) : -1;
        close(fd);
        if (e != EWOULDBLOCK) return tsr_err(err, TSR_EIO, "%s: cannot lock: %s", path, strerror(e));
        holder_line(holder, n > 0 ? (size_t)n : 0);
        return refuse(err, dir, holder);
    }
    if (!create) { /* a check only: nobody holds it */
        close(fd);
        return 0;
    }
    char text[HOLDER_MAX];
    holder_text(text, sizeof text);
    size_t len = strlen(text);
    /* the holder's name is for people; a failure to write it does not lose the lock */
    if (ftruncate(fd, 0) != 0 || pwrite(fd, text, len, 0) != (ssize_t)len)
        tsr_log(1, "%s: cannot record the holder: %s", path, strerror(errno));
    tsr_folder_lock *l = calloc(1, sizeof *l);
    if (!l) {
        close(fd);
        return tsr_err(err, TSR_ENOMEM, "out of memory");
    }
    l->fd = fd;
    *out = l;
    return 0;
}

int tsr_folder_lock_for_ckpt(const char *ckpt_dir, tsr_folder_lock **out, tsr_error *err) {
    *out = NULL;
    char parent[PATH_MAX];
    size_t n = strlen(ckpt_dir);
    while (n > 1 && ckpt_dir[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && ckpt_dir[b - 1] != '/') b--;
    if (n - b >= 300 || b >= sizeof parent) return tsr_err(err, TSR_EINVAL, "%s: path too long", ckpt_dir);
    char name[300];
    snprintf(name, sizeof name, "%.*s", (int)(n - b), ckpt_dir + b);
    if (b == 0) snprintf(parent, sizeof parent, ".");
    else snprintf(parent, sizeof parent, "%.*s", b > 1 ? (int)(b - 1) : 1, ckpt_dir);
    uint64_t step;
    return tsr_folder_lock_take(parent, tsr_parse_step_dir(name, &step), out, err);
}

void tsr_folder_lock_release(tsr_folder_lock *l) {
    if (!l) return;
    if (l->lease) {
        tsr_error e;
        if (tsr_store_remove(l->lease, LOCK_NAME, &e)) tsr_log(1, "cannot remove the lease: %s", e.msg);
        tsr_store_close(l->lease);
    }
    if (l->fd >= 0) close(l->fd); /* releases the flock */
    free(l);
}
