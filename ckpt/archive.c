/* archive.c: copies of committed checkpoints between a local directory and an
 * S3 location (archive.h): the data files first, the MANIFEST last, so that a
 * copy cut short is never a committed checkpoint on the other side. What goes
 * up has its raw frames encoded (compact.h): a save under load stores them
 * raw, what is kept need not be. */
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
#include "compact.h"
#include "manifest.h"

/* The data file names of the checkpoint in dir (local or remote), from its
 * MANIFEST. */
static int data_files(const char *dir, char (**names)[32], size_t *n, tsr_error *err) {
    tsr_ckpt *ck = tsr_ckpt_open(dir, err);
    if (!ck) return err ? err->code : TSR_ECORRUPT;
    *n = tsr_ckpt_n_files(ck);
    *names = calloc(*n ? *n : 1, sizeof **names);
    if (!*names) {
        tsr_ckpt_close(ck);
        return tsr_err(err, TSR_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < *n; i++) {
        tsr_file_info f;
        tsr_ckpt_file(ck, i, &f);
        tsr_data_file_name(f.file_id, (*names)[i], sizeof **names);
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

/* The bucket and the key prefix (no trailing '/') of url, and the key of name
 * under it. */
typedef struct remote {
    char bucket[TSR_S3_MAX_BUCKET], prefix[TSR_S3_MAX_KEY];
} remote;

static int remote_of(const char *url, remote *r, tsr_error *err) {
    int rc = tsr_s3_split(url, r->bucket, TSR_S3_MAX_BUCKET, r->prefix, TSR_S3_MAX_KEY, err);
    size_t pl = strlen(r->prefix);
    if (!rc && pl && r->prefix[pl - 1] == '/') r->prefix[pl - 1] = 0;
    return rc;
}

static int key_of(const remote *r, const char *name, char *key, tsr_error *err) {
    if ((size_t)snprintf(key, TSR_S3_MAX_KEY, "%s%s%s", r->prefix, r->prefix[0] ? "/" : "", name) >= TSR_S3_MAX_KEY)
        return tsr_err(err, TSR_EINVAL, "s3://%s/%s/%s: key too long", r->bucket, r->prefix, name);
    return 0;
}

/* Downloads the committed checkpoint at url into the local directory `local`,
 * file by file, the MANIFEST last (every data file durable before it comes);
 * makes `local` first, and refuses one that holds a committed checkpoint. */
static int pull_step(tsr_s3 *s3, const char *local, const char *url, tsr_s3_transfer *t, tsr_error *err) {
    remote rm;
    int rc = remote_of(url, &rm, err);
    if (rc) return rc;
    char (*names)[32] = NULL;
    size_t n = 0;
    if ((rc = data_files(url, &names, &n, err))) return rc;
    int e = tsr_mkdir_p(local);
    if (e) rc = tsr_err(err, e == ENOSPC ? TSR_ENOSPC : TSR_EIO, "%s: cannot create directory: %s", local, strerror(e));
    char manifest[PATH_MAX + 40];
    snprintf(manifest, sizeof manifest, "%s/MANIFEST", local);
    if (!rc && access(manifest, F_OK) == 0)
        rc = tsr_err(err, TSR_EINVAL, "%s: already holds a committed checkpoint", local);
    for (size_t i = 0; i <= n && !rc; i++) {
        const char *name = i < n ? names[i] : "MANIFEST"; /* the MANIFEST last */
        char path[PATH_MAX + 40], key[TSR_S3_MAX_KEY];
        snprintf(path, sizeof path, "%s/%s", local, name);
        /* the writeback of each data file began when it was downloaded */
        for (size_t k = 0; i == n && k < n && !rc; k++) rc = fsync_in(local, names[k], err);
        if (!rc) rc = key_of(&rm, name, key, err);
        if (!rc) rc = tsr_s3_download_file(s3, rm.bucket, key, path, t, err);
    }
    if (!rc) rc = fsync_in(local, "MANIFEST", err);
    free(names);
    return rc;
}

/* 1 when url holds a committed copy of the save save_id: its MANIFEST names
 * that save (a push uploads it last, once every data file is complete), and
 * every data file it lists is there at its size. */
static int pushed_before(tsr_s3 *s3, const remote *rm, const char *url, const uint8_t *save_id) {
    tsr_error e = {0};
    tsr_ckpt *ck = tsr_ckpt_open(url, &e);
    int yes = ck && memcmp(tsr_ckpt_save_id(ck), save_id, 16) == 0;
    for (size_t i = 0; yes && i < tsr_ckpt_n_files(ck); i++) {
        tsr_file_info f;
        tsr_s3_object o;
        char name[32], key[TSR_S3_MAX_KEY];
        tsr_ckpt_file(ck, i, &f);
        tsr_data_file_name(f.file_id, name, sizeof name);
        yes = !key_of(rm, name, key, NULL) && tsr_s3_head(s3, rm->bucket, key, &o, NULL) == 0 && o.size == f.size;
    }
    tsr_ckpt_close(ck);
    return yes;
}

static void on_recoded(void *user, uint64_t bytes) {
    tsr_s3_transfer *t = user;
    if (t && t->progress) t->progress(t->user, bytes);
}

/* Uploads the committed checkpoint in `local` to url, file by file, the
 * MANIFEST last. A data file with raw frames goes through the recoder (its
 * frames encoded, streamed as a multipart upload through the S3 store); the
 * others, and the MANIFEST when nothing was re-encoded, are uploaded as they
 * are (skipped when complete, resumed when interrupted). A checkpoint whose
 * re-encoded copy is committed at url already is not sent again. */
static int push_step(tsr_s3 *s3, const char *local, const char *url, int threads, tsr_s3_transfer *t,
                     tsr_recode_stats *st, tsr_error *err) {
    remote rm;
    int rc = remote_of(url, &rm, err);
    if (rc) return rc;
    if (!tsr_ckpt_is_committed(local))
        return tsr_err(err, TSR_ENOTFOUND, "%s: no MANIFEST (not a committed checkpoint)", local);
    tsr_recode *r = tsr_recode_open(local, threads, err);
    if (!r) return err ? err->code : TSR_ECORRUPT;
    tsr_recode_progress(r, on_recoded, t);
    tsr_ckpt *ck = tsr_recode_ckpt(r);
    size_t n = tsr_ckpt_n_files(ck);
    int any = 0;
    for (size_t i = 0; i < n; i++) any |= tsr_recode_file_raw(r, i);
    if (any && pushed_before(s3, &rm, url, tsr_ckpt_save_id(ck))) {
        const uint8_t *mf;
        size_t len;
        tsr_recode_manifest(r, &mf, &len, NULL); /* the source's: nothing rewritten */
        for (size_t i = 0; i < n; i++) {
            tsr_file_info f;
            tsr_ckpt_file(ck, i, &f);
            len += f.size;
        }
        if (t) t->skipped = 1;
        on_recoded(t, len);
        tsr_recode_close(r);
        return 0;
    }
    tsr_store *dst = any ? tsr_store_open(url, 0, err) : NULL;
    if (any && !dst) rc = err ? err->code : TSR_EIO;
    for (size_t i = 0; i < n && !rc; i++) {
        tsr_file_info f;
        char name[32], path[PATH_MAX + 40], key[TSR_S3_MAX_KEY];
        tsr_ckpt_file(ck, i, &f);
        tsr_data_file_name(f.file_id, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s", local, name);
        if (!(rc = key_of(&rm, name, key, err)))
            rc = tsr_recode_file_raw(r, i) ? tsr_recode_file(r, i, dst, err)
                                           : tsr_s3_upload_file(s3, path, rm.bucket, key, t, err);
    }
    char path[PATH_MAX + 40], key[TSR_S3_MAX_KEY];
    snprintf(path, sizeof path, "%s/MANIFEST", local);
    if (!rc) rc = key_of(&rm, "MANIFEST", key, err);
    if (!rc && !tsr_recode_changed(r)) {
        rc = tsr_s3_upload_file(s3, path, rm.bucket, key, t, err);
    } else if (!rc) {
        const uint8_t *mf;
        size_t len;
        rc = tsr_recode_manifest(r, &mf, &len, err);
        if (!rc) rc = tsr_s3_put(s3, rm.bucket, key, mf, len, err);
        if (!rc && t) t->parts_sent++;
        if (!rc && t && t->progress) t->progress(t->user, len);
    }
    if (st) tsr_recode_stats_get(r, st);
    tsr_store_close(dst);
    tsr_recode_close(r);
    return rc;
}

int tsr_archive_push_step(tsr_s3 *s3, const char *step_dir, const char *dst, int threads, tsr_s3_transfer *t,
                          tsr_recode_stats *st, tsr_error *err) {
    if (st) memset(st, 0, sizeof *st);
    return push_step(s3, step_dir, dst, threads, t, st, err);
}

int tsr_archive_pull_step(tsr_s3 *s3, const char *src, const char *dir, tsr_s3_transfer *t, tsr_error *err) {
    int rc = pull_step(s3, dir, src, t, err);
    return rc ? rc : fsync_in(dir, ".", err); /* the renames survive a crash */
}

/* ------------------------------------------------------------- archiver */

#include <pthread.h>

/* The archiver encodes on one thread (its own): the job's cores are the job's,
 * and one core encodes faster than most uplinks take the bytes. */
#define ARCHIVE_THREADS 1

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

/* Keeps the newest `keep` committed checkpoints under the remote root (and the
 * newest clean one: tsr_retention_keep); removes older ones, and uncommitted
 * steps older than the newest committed one. */
static void remote_retention(tsr_archiver *a) {
    tsr_step_info *v = NULL;
    size_t n = 0;
    if (tsr_list_steps(a->url, &v, &n)) return;
    long newest = -1;
    int *keep = malloc((n + 1) * sizeof *keep);
    if (!keep) {
        free(v);
        return;
    }
    tsr_retention_keep(v, n, a->keep, keep);
    for (size_t i = 0; i < n; i++)
        if (v[i].committed) newest = (long)i;
    for (size_t i = 0; i < n; i++) {
        int remove = (v[i].committed && !keep[i]) || (!v[i].committed && (long)i < newest);
        if (!remove) continue;
        char path[PATH_MAX + 80];
        snprintf(path, sizeof path, "%s/%s", a->url, v[i].name);
        tsr_error e;
        if (tsr_remove_step_dir(path, &e) == 0) tsr_log(2, "%s: removed (remote retention)", path);
        else tsr_log(1, "remote retention: %s", e.msg);
    }
    free(keep);
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
        tsr_recode_stats st;
        int rc = tsr_archive_push_step(a->s3, a->busy, dst, ARCHIVE_THREADS, NULL, &st, &e);
        if (!rc) {
            tsr_log(2, "%s: archived to %s (%llu data files re-encoded, %llu -> %llu bytes)", a->busy, dst,
                    (unsigned long long)st.files, (unsigned long long)st.bytes_in, (unsigned long long)st.bytes_out);
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
