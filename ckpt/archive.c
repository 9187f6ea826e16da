/* archive.c: copies of committed checkpoints between a local directory and an
 * S3 location (archive.h): the data files first, the MANIFEST last, so that a
 * copy cut short is never a committed checkpoint on the other side. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "archive.h"
#include "common.h"
#include "manifest.h"

/* The data file names of the checkpoint in dir (local or remote), from its
 * MANIFEST, and their total size. */
static int data_files(const char *dir, char (**names)[32], size_t *n, uint64_t *bytes, tsr_error *err) {
    tsr_ckpt *ck = tsr_ckpt_open(dir, err);
    if (!ck) return err ? err->code : TSR_ECORRUPT;
    *n = tsr_ckpt_n_files(ck);
    *bytes = 0;
    *names = calloc(*n ? *n : 1, sizeof **names);
    if (!*names) {
        tsr_ckpt_close(ck);
        return tsr_err(err, TSR_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < *n; i++) {
        tsr_file_info f;
        tsr_ckpt_file(ck, i, &f);
        tsr_data_file_name(f.file_id, (*names)[i], sizeof **names);
        *bytes += f.size;
    }
    tsr_ckpt_close(ck);
    return 0;
}

/* fsync of dir/name (name "." for the directory itself). */
static int fsync_in(const char *dir, const char *name, tsr_error *err) {
    char path[PATH_MAX + 40];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    int rc = fd < 0 || fsync(fd) != 0 ? tsr_err(err, TSR_EIO, "%s: fsync: %s", path, strerror(errno)) : 0;
    if (fd >= 0) close(fd);
    return rc;
}

/* Copies the checkpoint between the local directory `local` and the S3 location
 * `url` (push: to S3), file by file, the MANIFEST last. The file list comes from
 * the source's MANIFEST, which a push requires; a pull makes `local` first, and
 * refuses one that holds a committed checkpoint already. */
static int copy_step(tsr_s3 *s3, const char *local, const char *url, int push, tsr_s3_transfer *t,
                     tsr_error *err) {
    char bucket[TSR_S3_MAX_BUCKET], prefix[TSR_S3_MAX_KEY];
    int rc = tsr_s3_split(url, bucket, TSR_S3_MAX_BUCKET, prefix, TSR_S3_MAX_KEY, err);
    if (rc) return rc;
    size_t pl = strlen(prefix);
    if (pl && prefix[pl - 1] == '/') prefix[--pl] = 0;
    if (push && !tsr_ckpt_is_committed(local))
        return tsr_err(err, TSR_ENOTFOUND, "%s: no MANIFEST (not a committed checkpoint)", local);
    char (*names)[32] = NULL;
    size_t n = 0;
    uint64_t bytes = 0;
    if ((rc = data_files(push ? local : url, &names, &n, &bytes, err))) return rc;
    if (!push) {
        int e = tsr_mkdir_p(local);
        if (e) rc = tsr_err(err, e == ENOSPC ? TSR_ENOSPC : TSR_EIO, "%s: cannot create directory: %s", local, strerror(e));
        char manifest[PATH_MAX + 40];
        snprintf(manifest, sizeof manifest, "%s/MANIFEST", local);
        if (!rc && access(manifest, F_OK) == 0)
            rc = tsr_err(err, TSR_EINVAL, "%s: already holds a committed checkpoint", local);
    }
    for (size_t i = 0; i <= n && !rc; i++) {
        const char *name = i < n ? names[i] : "MANIFEST"; /* the MANIFEST last */
        char path[PATH_MAX + 40], key[TSR_S3_MAX_KEY + 40];
        snprintf(path, sizeof path, "%s/%s", local, name);
        snprintf(key, sizeof key, "%s%s%s", prefix, pl ? "/" : "", name);
        /* a pull: every data file durable before the MANIFEST comes (the writeback
         * of each began when it was downloaded) */
        for (size_t k = 0; !push && i == n && k < n && !rc; k++) rc = fsync_in(local, names[k], err);
        if (rc) break;
        if (strlen(key) >= TSR_S3_MAX_KEY) rc = tsr_err(err, TSR_EINVAL, "s3://%s/%s: key too long", bucket, key);
        else if (push) rc = tsr_s3_upload_file(s3, path, bucket, key, t, err);
        else rc = tsr_s3_download_file(s3, bucket, key, path, t, err);
    }
    if (!push && !rc) rc = fsync_in(local, "MANIFEST", err);
    free(names);
    return rc;
}

int tsr_archive_push_step(tsr_s3 *s3, const char *step_dir, const char *dst, tsr_s3_transfer *t, tsr_error *err) {
    return copy_step(s3, step_dir, dst, 1, t, err);
}

int tsr_archive_pull_step(tsr_s3 *s3, const char *src, const char *dir, tsr_s3_transfer *t, tsr_error *err) {
    int rc = copy_step(s3, dir, src, 0, t, err);
    return rc ? rc : fsync_in(dir, ".", err); /* the renames survive a crash */
}

/* ------------------------------------------------------------- archiver */

#include <pthread.h>


struct tsr_archiver {
    tsr_s3 *s3;
    char url[PATH_MAX]; /* s3://bucket/prefix, no trailing '/' */
    uint32_t keep;      /* remote retention: the newest K committed; 0 keeps all */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char (*queue)[PATH_MAX]; /* step directories waiting, oldest first */
    size_t n, cap;
    char busy[PATH_MAX];     /* the one being pushed, or "" */
    int stop;
};

static const char *step_name(const char *dir) {
    const char *s = strrchr(dir, '/');
    return s ? s + 1 : dir;
}

/* Keeps the newest `keep` committed checkpoints under the remote root; removes
 * older ones, and uncommitted steps older than the newest committed one. */
static void remote_retention(tsr_archiver *a) {
    tsr_step_info *v = NULL;
    size_t n = 0;
    if (tsr_list_steps(a->url, &v, &n)) return;
    long committed = 0, newest = -1;
    for (size_t i = 0; i < n; i++)
        if (v[i].committed) committed++, newest = (long)i;
    long drop = a->keep && committed > (long)a->keep ? committed - (long)a->keep : 0;
    for (size_t i = 0; i < n; i++) {
        int remove = (v[i].committed && drop > 0) || (!v[i].committed && (long)i < newest);
        if (v[i].committed && drop > 0) drop--;
        if (!remove) continue;
        char path[PATH_MAX + 80];
        snprintf(path, sizeof path, "%s/%s", a->url, v[i].name);
        tsr_error e;
        if (tsr_remove_step_dir(path, &e) == 0) tsr_log(2, "%s: removed (remote retention)", path);
        else tsr_log(1, "remote retention: %s", e.msg);
    }
    free(v);
}

static void *archiver_main(void *arg) {
    tsr_archiver *a = arg;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        while (!a->n && !a->stop) pthread_cond_wait(&a->cv, &a->mu);
        if (!a->n) break; /* stopped, and nothing left */
        snprintf(a->busy, sizeof a->busy, "%s", a->queue[0]);
        memmove(a->queue, a->queue + 1, (a->n - 1) * sizeof *a->queue);
        a->n--;
        pthread_mutex_unlock(&a->mu);

        char dst[2 * PATH_MAX];
        snprintf(dst, sizeof dst, "%s/%s", a->url, step_name(a->busy));
        tsr_error e = {0};
        /* no retries here: every request already goes through the S3 client's
         * retry loop (TSR_S3_MAX_ATTEMPTS, TSR_S3_RETRY_SECONDS), and a push
         * resumes what an earlier one left */
        int rc = tsr_archive_push_step(a->s3, a->busy, dst, NULL, &e);
        if (!rc) {
            tsr_log(2, "%s: archived to %s", a->busy, dst);
            remote_retention(a);
        } else {
            tsr_log(0, "archive of %s to %s failed: %s", a->busy, dst, e.msg);
        }
        pthread_mutex_lock(&a->mu);
        a->busy[0] = 0;
        pthread_cond_broadcast(&a->cv);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

tsr_archiver *tsr_archiver_new(const char *url, uint32_t keep, tsr_error *err) {
    char bucket[TSR_S3_MAX_BUCKET], key[TSR_S3_MAX_KEY];
    if (tsr_s3_split(url, bucket, sizeof bucket, key, sizeof key, err)) return NULL;
    tsr_archiver *a = calloc(1, sizeof *a);
    if (!a) {
        tsr_err(err, TSR_ENOMEM, "out of memory");
        return NULL;
    }
    snprintf(a->url, sizeof a->url, "%s", url);
    size_t n = strlen(a->url);
    while (n > 5 && a->url[n - 1] == '/') a->url[--n] = 0;
    a->keep = keep;
    if (!(a->s3 = tsr_s3_new(NULL, err))) {
        tsr_err_prefix(err, "archive to %s", url);
        free(a);
        return NULL;
    }
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    if (pthread_create(&a->thread, NULL, archiver_main, a) != 0) {
        tsr_s3_free(a->s3);
        free(a);
        tsr_err(err, TSR_ENOMEM, "cannot start the archive thread");
        return NULL;
    }
    return a;
}

int tsr_archiver_add(tsr_archiver *a, const char *step_dir) {
    pthread_mutex_lock(&a->mu);
    int rc = tsr_grow((void **)&a->queue, &a->cap, a->n, sizeof *a->queue);
    if (!rc) {
        snprintf(a->queue[a->n++], sizeof *a->queue, "%s", step_dir);
        pthread_cond_broadcast(&a->cv);
    }
    pthread_mutex_unlock(&a->mu);
    return rc;
}

int tsr_archiver_holds(tsr_archiver *a, const char *step_dir) {
    pthread_mutex_lock(&a->mu);
    int yes = !strcmp(a->busy, step_dir);
    for (size_t i = 0; i < a->n && !yes; i++) yes = !strcmp(a->queue[i], step_dir);
    pthread_mutex_unlock(&a->mu);
    return yes;
}

void tsr_archiver_free(tsr_archiver *a) {
    if (!a) return;
    pthread_mutex_lock(&a->mu);
    if (a->n || a->busy[0]) tsr_log(2, "waiting for %zu checkpoint(s) to be archived", a->n + (a->busy[0] != 0));
    a->stop = 1;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    pthread_join(a->thread, NULL);
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
    tsr_s3_free(a->s3);
    free(a->queue);
    free(a);
}
