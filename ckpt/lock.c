/* lock.c: one writer per checkpoint folder.
 *
 * A local folder is locked with flock(2) on FOLDER/LOCK, a file that names the
 * holder (host, pid, start time). The kernel releases the lock when the holder's
 * file is closed, also when the process dies, so a lock never outlives its
 * holder; the file itself may stay behind and means nothing unless locked.
 * Object storage has no locks: there the folder holds a lease object PREFIX/LOCK
 * with the same text while a writer works, and a writer refuses a prefix where
 * one exists (a holder that died leaves it behind: it is removed by hand).
 *
 * A checkpoint folder that a tool writes whole (lock.h) is a step of a root under
 * the root's lock, or a folder written beside its name and renamed into place. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "lock.h"
#include "store.h"
#include "tsr_ckpt.h"

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
    int present = tsr_store_exists(st, LOCK_NAME, err);
    if (present < 0) {
        tsr_store_close(st);
        tsr_err_prefix(err, "the lease object");
        return present;
    }
    if (present) {
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
    if (!(tsr_store_caps(dir) & TSR_STORE_LOCKS)) return take_lease(dir, create, out, err);
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

/* The folder that holds ckpt_dir (parent, "." for a bare name) and its own name
 * (name); *is_step: whether that name is step-N. */
static int split_ckpt_dir(const char *ckpt_dir, char parent[PATH_MAX], char name[300], int *is_step,
                          tsr_error *err) {
    size_t n = strlen(ckpt_dir);
    while (n > 1 && ckpt_dir[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && ckpt_dir[b - 1] != '/') b--;
    if (n - b >= 300 || b >= PATH_MAX) return tsr_err(err, TSR_EINVAL, "%s: path too long", ckpt_dir);
    snprintf(name, 300, "%.*s", (int)(n - b), ckpt_dir + b);
    if (b == 0) snprintf(parent, PATH_MAX, ".");
    else snprintf(parent, PATH_MAX, "%.*s", b > 1 ? (int)(b - 1) : 1, ckpt_dir);
    uint64_t step;
    *is_step = tsr_parse_step_dir(name, &step);
    return 0;
}

int tsr_folder_lock_for_ckpt(const char *ckpt_dir, tsr_folder_lock **out, tsr_error *err) {
    *out = NULL;
    char parent[PATH_MAX], name[300];
    int is_step, rc = split_ckpt_dir(ckpt_dir, parent, name, &is_step, err);
    return rc ? rc : tsr_folder_lock_take(parent, is_step, out, err);
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

/* ------------------------------------------------- a folder written whole */

struct tsr_ckpt_out {
    tsr_folder_lock *lock;
    int beside; /* written in dir beside dst, renamed to dst at the end */
    char dst[PATH_MAX], dir[PATH_MAX + 340], parent[PATH_MAX];
};

/* A local dst written beside must be new or an empty folder: rename(2) replaces
 * nothing else, and finding that out only at the end would waste the work. */
static int check_new(const char *dst, tsr_error *err) {
    DIR *d = opendir(dst);
    if (!d) {
        if (errno == ENOENT) return 0;
        return tsr_err(err, TSR_EINVAL, "%s: cannot write a checkpoint folder here: %s", dst, strerror(errno));
    }
    struct dirent *ent;
    int empty = 1;
    while (empty && (ent = readdir(d)))
        empty = !strcmp(ent->d_name, ".") || !strcmp(ent->d_name, "..");
    closedir(d);
    if (!empty)
        return tsr_err(err, TSR_EINVAL, "%s: exists and is not empty; a checkpoint folder is written only "
                       "where none exists or into an empty folder", dst);
    return 0;
}

/* PARENT/.NAME.tmp-PID-N, the first N free: the pid and a count tell apart the
 * runs of one machine and the threads of one process; a folder left by a killed
 * run of the same pid is skipped, not taken. */
static int make_beside(tsr_ckpt_out *o, const char *name, tsr_error *err) {
    static _Atomic unsigned seq;
    int e = tsr_mkdir_p(o->parent);
    if (e) return tsr_err(err, e == ENOSPC ? TSR_ENOSPC : TSR_EIO, "%s: cannot create the folder: %s", o->parent,
                          strerror(e));
    for (int tries = 0;; tries++) {
        snprintf(o->dir, sizeof o->dir, "%s/.%s.tmp-%ld-%u", o->parent, name, (long)getpid(), seq++);
        if (mkdir(o->dir, 0755) == 0) break;
        e = errno;
        if (e != EEXIST || tries == 100)
            return tsr_err(err, e == ENOSPC ? TSR_ENOSPC : TSR_EIO, "%s: cannot create %s: %s", o->dst, o->dir,
                           strerror(e));
    }
    o->beside = 1;
    return 0;
}

int tsr_ckpt_out_begin(const char *dst, tsr_ckpt_out **out, tsr_error *err) {
    *out = NULL;
    tsr_ckpt_out *o = calloc(1, sizeof *o);
    if (!o) return tsr_err(err, TSR_ENOMEM, "out of memory");
    char name[300];
    int is_step, remote = !(tsr_store_caps(dst) & TSR_STORE_RENAME); /* no writing beside and renaming */
    int rc = split_ckpt_dir(dst, o->parent, name, &is_step, err);
    if (!rc && snprintf(o->dst, sizeof o->dst, "%s", dst) >= (int)sizeof o->dst)
        rc = tsr_err(err, TSR_EINVAL, "%s: path too long", dst);
    snprintf(o->dir, sizeof o->dir, "%s", o->dst);
    if (!rc) rc = tsr_folder_lock_take(o->parent, is_step, &o->lock, err);
    if (!rc && !is_step && remote) rc = tsr_folder_lock_take(dst, 1, &o->lock, err);
    if (!rc && tsr_ckpt_is_committed(dst))
        rc = tsr_err(err, TSR_EINVAL, "%s: already holds a committed checkpoint", dst);
    if (!rc && !is_step && !remote && !(rc = check_new(dst, err))) rc = make_beside(o, name, err);
    if (rc) {
        if (rc == TSR_EBUSY) tsr_err_prefix(err, "%s: cannot write this checkpoint", dst);
        tsr_folder_lock_release(o->lock);
        free(o);
        return rc;
    }
    *out = o;
    return 0;
}

const char *tsr_ckpt_out_dir(const tsr_ckpt_out *o) { return o->dir; }

/* The committed folder renamed to dst, and the rename made durable. */
static int publish(const tsr_ckpt_out *o, tsr_error *err) {
    if (rename(o->dir, o->dst) != 0) {
        int e = errno;
        if (e == ENOTEMPTY || e == EEXIST)
            return tsr_err(err, TSR_EBUSY, "%s: another writer made this checkpoint folder while this run wrote "
                           "it; theirs is kept, this run's copy removed", o->dst);
        return tsr_err(err, TSR_EIO, "%s: cannot rename %s to it: %s", o->dst, o->dir, strerror(e));
    }
    char what[PATH_MAX + 16];
    snprintf(what, sizeof what, "renaming %s", o->dst);
    return tsr_fsync_dir(o->parent, what, err);
}

int tsr_ckpt_out_end(tsr_ckpt_out *o, int ok, tsr_error *err) {
    if (!o) return 0;
    int rc = ok && o->beside ? publish(o, err) : 0;
    if (o->beside && (!ok || rc)) tsr_remove_tree(o->dir);
    else if (!ok && (tsr_store_caps(o->dir) & TSR_STORE_DIRS)) rmdir(o->dir); /* empty once every writer removed its file */
    tsr_folder_lock_release(o->lock);
    free(o);
    return rc;
}
