/* copy.c: push and pull (tsr_ckpt.h): the committed steps to copy, the locks
 * and leases that keep one writer, then one copy per step (archive.c), with what
 * they did reported as they go. What `tessera push` and `tessera pull` call. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "archive.h"
#include "common.h"
#include "store.h"

static int stop_at_first(void *user, const tsr_s3_object *o, int is_prefix) {
    (void)user, (void)o, (void)is_prefix;
    return 1;
}

int tsr_archive_check_remote(const char *url, tsr_error *err) {
    char bucket[TSR_S3_MAX_BUCKET], key[TSR_S3_MAX_KEY];
    tsr_s3 *s3 = tsr_s3_split(url, bucket, sizeof bucket, key, sizeof key, err) ? NULL : tsr_s3_new(NULL, err);
    int rc = s3 ? tsr_s3_list(s3, bucket, key, "/", stop_at_first, NULL, err) : -1;
    tsr_s3_free(s3);
    if (rc >= 0) return 0;
    return err && err->code ? err->code : TSR_EIO;
}

static int summed(void *user, const char *name, uint64_t size) {
    (void)name;
    *(uint64_t *)user += size;
    return 0;
}

/* The bytes of the files in a step directory (for a progress display). */
static uint64_t dir_bytes(const char *dir) {
    uint64_t n = 0;
    tsr_error e;
    tsr_store *st = tsr_store_open(dir, 0, &e);
    if (st) tsr_store_list(st, summed, &n, NULL);
    tsr_store_close(st);
    return n;
}

/* A push or a pull: its steps (paths, malloc'ed), the lock it holds, and what
 * it reports. */
typedef struct copy_job {
    const tsr_copy_opts *o;
    int push;
    char (*dirs)[PATH_MAX];
    size_t n;
    int single; /* src is one step, not a root */
    tsr_folder_lock *lock;
    tsr_copy_stats total;
} copy_job;

static void on_bytes(void *user, uint64_t n) {
    copy_job *j = user;
    j->total.bytes += n;
    if (j->o->bytes) j->o->bytes(j->o->user, n);
}

/* The committed steps to copy from src: src itself (j->single), or every
 * committed step of the root src (the others said to o->skipped). */
static int steps_of(copy_job *j, const char *src, tsr_error *err) {
    if (tsr_s3_is_url(src)) {
        int rc = tsr_archive_check_remote(src, err);
        if (rc) return rc;
    }
    if (tsr_ckpt_is_committed(src)) {
        j->single = 1;
        if (!(j->dirs = calloc(1, sizeof *j->dirs))) return tsr_err(err, TSR_ENOMEM, "%s: out of memory", src);
        snprintf(j->dirs[0], sizeof *j->dirs, "%s", src);
        j->n = 1;
        return 0;
    }
    tsr_step_info *v = NULL;
    size_t count = 0;
    if (tsr_list_steps(src, &v, &count) != 0)
        return tsr_err(err, TSR_ENOTFOUND, "%s: neither a committed checkpoint nor a root of step directories", src);
    if (!(j->dirs = calloc(count ? count : 1, sizeof *j->dirs))) {
        free(v);
        return tsr_err(err, TSR_ENOMEM, "%s: out of memory listing its steps", src);
    }
    size_t len = strlen(src);
    while (len > 1 && src[len - 1] == '/') len--;
    for (size_t i = 0; i < count; i++) {
        if (!v[i].committed) {
            char msg[PATH_MAX + 100];
            snprintf(msg, sizeof msg, "%.*s/%s: not committed, skipped", (int)len, src, v[i].name);
            if (j->o->skipped) j->o->skipped(j->o->user, msg);
            continue;
        }
        snprintf(j->dirs[j->n++], sizeof *j->dirs, "%.*s/%s", (int)len, src, v[i].name);
    }
    free(v);
    return j->n ? 0 : tsr_err(err, TSR_ENOTFOUND, "%s: no committed checkpoint", src);
}

/* The steps and the locks, before any copy. pull: one writer at a time in the
 * local folder it writes into (dst, or the folder of dst when dst is one step),
 * checked before any request; push: refused when a writer's lease is on the
 * prefix, and the local source read first (every step's MANIFEST validated),
 * so that a bad one costs no request. */
static int copy_begin(copy_job *j, const char *src, const char *dst, tsr_error *err) {
    int rc = j->push ? steps_of(j, src, err) : 0;
    for (size_t i = 0; !rc && i < j->n; i++) {
        tsr_ckpt *ck = tsr_ckpt_open(j->dirs[i], err);
        if (!ck) rc = err && err->code ? err->code : TSR_ECORRUPT;
        tsr_ckpt_close(ck);
    }
    if (!rc) rc = tsr_folder_lock_take(dst, 0, &j->lock, err);
    if (!rc && !j->push) rc = tsr_folder_lock_for_ckpt(dst, &j->lock, err);
    if (!rc && !j->push) rc = steps_of(j, src, err);
    if (!rc && !j->push && !j->single && !j->lock) /* a root: dst is the folder */
        rc = tsr_folder_lock_take(dst, 1, &j->lock, err);
    return rc;
}

/* The first problem tsr_ckpt_verify reports. */
static void first_problem(void *user, const char *msg) {
    char *first = user;
    if (!first[0]) snprintf(first, 512, "%s", msg);
}

/* A pulled step, verified as `tessera ckpt verify` does (every frame decoded,
 * every digest added up; `threads` workers, <= 0: the online cores) before it
 * counts: one that fails is uncommitted again (its MANIFEST removed) and the
 * error names the first problem. */
static int verify_pulled(const char *dir, int threads, tsr_error *err) {
    tsr_ckpt *ck = tsr_ckpt_open(dir, err);
    if (!ck) return err && err->code ? err->code : TSR_ECORRUPT;
    char first[512] = "";
    long n = tsr_ckpt_verify(ck, first_problem, first, threads, err);
    tsr_ckpt_close(ck);
    if (n == 0) return 0;
    char manifest[PATH_MAX + 400];
    snprintf(manifest, sizeof manifest, "%s/MANIFEST", dir);
    unlink(manifest);
    if (n < 0) {
        tsr_err_prefix(err, "%s: pulled, but its check could not run; left uncommitted", dir);
        return err && err->code ? err->code : TSR_EIO;
    }
    return tsr_err(err, TSR_ECORRUPT, "%s: pulled, but %ld problem(s) found (first: %s); left uncommitted", dir, n,
                   first);
}

/* One copy per step, each reported to o->step_done. */
static int copy_steps(copy_job *j, tsr_s3 *s3, const char *dst, tsr_error *err) {
    const tsr_copy_opts *o = j->o;
    uint64_t total = 0;
    for (size_t i = 0; i < j->n; i++) total += dir_bytes(j->dirs[i]);
    if (o->started) o->started(o->user, total);
    double t0 = tsr_now();
    tsr_s3_transfer t = {on_bytes, j, 0, 0, 0};
    int rc = 0;
    size_t dl = strlen(dst);
    while (dl > 1 && dst[dl - 1] == '/') dl--;
    for (size_t i = 0; i < j->n && !rc; i++) {
        char to[PATH_MAX + 300], name[300];
        /* push of a step: DST/NAME (DST is a root); pull of a step: DST itself;
         * copies of a root: DST/NAME for each step */
        if (j->single && !j->push) snprintf(to, sizeof to, "%.*s", (int)dl, dst);
        else snprintf(to, sizeof to, "%.*s/%s", (int)dl, dst, tsr_path_base(j->dirs[i], name, sizeof name));
        tsr_s3_transfer before = t;
        uint64_t bytes_before = j->total.bytes;
        double start = tsr_now();
        tsr_recode_stats st = {0};
        rc = j->push ? tsr_archive_push_step(s3, j->dirs[i], to, o->threads, &t, &st, err)
                     : tsr_archive_pull_step(s3, j->dirs[i], to, &t, err);
        if (!rc && !j->push) rc = verify_pulled(to, o->threads, err);
        tsr_copy_stats one = {.steps = 1,
                              .bytes = j->total.bytes - bytes_before,
                              .parts_sent = t.parts_sent - before.parts_sent,
                              .parts_resumed = t.parts_resumed - before.parts_resumed,
                              .objects_skipped = (uint64_t)t.skipped,
                              .files_reencoded = st.files,
                              .frames_encoded = st.frames,
                              .reencoded_bytes_in = st.bytes_in,
                              .reencoded_bytes_out = st.bytes_out};
        t.skipped = 0;
        one.seconds = tsr_now() - start;
        j->total.objects_skipped += one.objects_skipped;
        j->total.files_reencoded += st.files, j->total.frames_encoded += st.frames;
        j->total.reencoded_bytes_in += st.bytes_in, j->total.reencoded_bytes_out += st.bytes_out;
        if (rc) break;
        j->total.steps++;
        if (o->step_done) o->step_done(o->user, j->dirs[i], to, &one);
    }
    j->total.parts_sent = t.parts_sent;
    j->total.parts_resumed = t.parts_resumed;
    j->total.seconds = tsr_now() - t0;
    return rc;
}

/* push (src local, dst on S3) or pull (src on S3, dst local). */
static int copy(int push, const char *src, const char *dst, const tsr_copy_opts *opts, tsr_copy_stats *out,
                tsr_error *err) {
    static const tsr_copy_opts none = {0};
    copy_job j = {.o = opts ? opts : &none, .push = push};
    if (out) memset(out, 0, sizeof *out);
    const char *remote = push ? dst : src;
    if (!tsr_s3_is_url(remote))
        return tsr_err(err, TSR_EINVAL, "%s: not an s3://bucket/prefix location (%s object storage)", remote,
                       push ? "push copies to" : "pull copies from");
    int rc = copy_begin(&j, src, dst, err);
    tsr_s3 *s3 = rc ? NULL : tsr_s3_new(NULL, err);
    if (!rc && !s3) rc = err && err->code ? err->code : TSR_EINVAL;
    if (!rc) rc = copy_steps(&j, s3, dst, err);
    tsr_s3_free(s3);
    tsr_folder_lock_release(j.lock);
    free(j.dirs);
    if (out) *out = j.total;
    return rc;
}

int tsr_push(const char *src, const char *dst_url, const tsr_copy_opts *opts, tsr_copy_stats *out,
             tsr_error *err) {
    return copy(1, src, dst_url, opts, out, err);
}

int tsr_pull(const char *src_url, const char *dst, const tsr_copy_opts *opts, tsr_copy_stats *out,
             tsr_error *err) {
    return copy(0, src_url, dst, opts, out, err);
}
