/* engine.c: the distributed, asynchronous checkpoint engine.
 *
 * Save: plan (cached) -> stage into one arena (the only part the caller waits
 * for) -> in a background thread: encode and write this rank's data file through
 * tsr_save (thread pool, io_uring), gather every rank's table and status on rank
 * 0, commit the MANIFEST there, broadcast the outcome, and on failure remove this
 * save's files everywhere. That exchange has a deadline (commit_timeout_s): a
 * rank that misses it fails the save, and the engine then refuses to save again,
 * since its background comm may still deliver the late rank's message.
 * Load: rank 0 reads the MANIFEST and broadcasts it; each distinct needed box is
 * read by one rank that needs it and sent to the others. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "archive.h"
#include "common.h"
#include "encoder.h"
#include "manifest.h"
#include "pool.h"
#include "store.h"

#define TAG_MOD 32000
#define MSG_LEN 1024
/* The commit exchange on the background comm: reports to rank 0, its verdict back. */
#define TAG_REPORT 1
#define TAG_VERDICT 2
#define VERDICT_BROKEN 1u /* flag: a rank missed the exchange; its message may come later */

typedef struct staged {
    uint32_t tensor;
    tsr_box box;
    size_t off; /* in the arena, TSR_ALIGN-aligned: raw frames are written from there */
} staged;

typedef struct staged_blob {
    char name[TSR_MAX_NAME + 1];
    int32_t rank;
    size_t off, size;
} staged_blob;

typedef struct job {
    char dir[PATH_MAX];
    uint64_t step;
    uint8_t save_id[16];
    tsr_layout layout;
    tsr_tensor_decl *tensors; /* names copied into names */
    size_t n_tensors;
    char *names;
    staged *boxes;
    size_t n_boxes;
    staged_blob *blobs;
    size_t n_blobs;
    uint64_t staged_bytes; /* raw bytes of the boxes and blobs */
} job;

struct tsr_engine {
    char root[PATH_MAX];
    tsr_comm *comm, *bg;
    uint32_t rank, size;
    tsr_engine_opts opts;
    uint8_t engine_id[16];
    uint64_t n_saves;
    /* plan cache */
    uint64_t plan_key;
    int have_plan;
    size_t *mine;   /* state box index of each box this rank writes */
    size_t n_mine;
    tsr_encoder *enc; /* the background save's threads and buffers, kept across saves */
    /* staging */
    uint8_t *arena;
    size_t arena_cap;
    /* background */
    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int pending, busy, stop;
    job job;
    int last_status;
    tsr_error last_err;
    int broken; /* a commit exchange timed out: e->bg may hold a late message */
    double last_wait, last_stall;
    tsr_archiver *arch; /* rank 0, when archiving */
    char archive_url[PATH_MAX];
    tsr_folder_lock *lock; /* rank 0, with opts.lock_root */
    int rewind_pending;    /* the next save moves the steps after continue_from aside */
    uint64_t continue_from;
};

/* Threads per rank when the caller leaves it open: the node's cores shared among
 * the ranks on this node (as mpirun reports them), at least one. Oversubscribed
 * pools only make the ranks of one node slow each other down. */
static int default_threads(void) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    if (!local) local = getenv("MPI_LOCALNRANKS");
    long ranks = local ? atol(local) : 1;
    if (cores < 1) cores = 1;
    if (ranks < 1) ranks = 1;
    return cores / ranks > 0 ? (int)(cores / ranks) : 1;
}

tsr_engine_opts tsr_engine_opts_default(void) {
    return (tsr_engine_opts){.write = tsr_write_opts_default(), .commit_timeout_s = 1800};
}

static void job_clear(job *j) {
    free(j->tensors);
    free(j->names);
    free(j->boxes);
    free(j->blobs);
    memset(j, 0, sizeof *j);
}

/* ------------------------------------------------------------ retention */

/* Keeps the newest K committed steps; removes older ones, and uncommitted step
 * directories (failed or interrupted saves) older than the newest committed one,
 * or all of them before a save (make_room), when no save of this job is in
 * flight and the folder lock keeps other writers out. */
static void retention(tsr_engine *e, int before_save) {
    tsr_step_info *v = NULL;
    size_t count = 0;
    if (tsr_list_steps(e->root, &v, &count) || count == 0) {
        free(v);
        return;
    }
    long n = (long)count;
    long committed = 0, newest = -1;
    for (long i = 0; i < n; i++)
        if (v[i].committed) committed++, newest = i;
    long drop = e->opts.keep_latest && committed > (long)e->opts.keep_latest ? committed - (long)e->opts.keep_latest : 0;
    for (long i = 0; i < n; i++) {
        int remove = 0;
        if (v[i].committed && drop > 0) remove = 1, drop--;
        else if (!v[i].committed && (i < newest || before_save)) remove = 1;
        if (!remove) continue;
        char path[PATH_MAX + 80];
        snprintf(path, sizeof path, "%s/%s", e->root, v[i].name);
        if (e->arch && tsr_archiver_holds(e->arch, path)) continue; /* not archived yet */
        tsr_error rerr;
        if (tsr_remove_step_dir(path, &rerr) == 0)
            tsr_log(before_save ? 1 : 2, "%s: removed (%s)", path,
                    v[i].committed ? "retention" : "uncommitted: left by a failed or interrupted save");
        else tsr_log(1, "retention: %s", rerr.msg);
    }
    free(v);
}

/* Rewinding: the committed steps after e->continue_from are renamed
 * step-N.abandoned-<UTC time> (another suffix if that name is taken), so that
 * nothing of the abandoned future is lost and nothing of it is seen as the latest
 * step or counted by retention. Uncommitted ones are left to retention. */
static void move_aside(tsr_engine *e) {
    tsr_step_info *v = NULL;
    size_t n = 0;
    if (tsr_list_steps(e->root, &v, &n)) return;
    char when[32] = "unknown";
    time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm)) strftime(when, sizeof when, "%Y%m%dT%H%M%SZ", &tm);
    for (size_t i = 0; i < n; i++) {
        if (v[i].step <= e->continue_from || !v[i].committed) continue;
        char from[PATH_MAX + 80], to[PATH_MAX + 160];
        snprintf(from, sizeof from, "%s/%s", e->root, v[i].name);
        if (tsr_store_is_remote(e->root)) {
            tsr_log(0, "%s: after step %llu, which this job continues from, but it cannot be moved aside on object "
                       "storage", from, (unsigned long long)e->continue_from);
            continue;
        }
        int rc = -1;
        for (int k = 1; k < 100 && rc != 0; k++) {
            if (k == 1) snprintf(to, sizeof to, "%s.abandoned-%s", from, when);
            else snprintf(to, sizeof to, "%s.abandoned-%s-%d", from, when, k);
            struct stat sb;
            if (lstat(to, &sb) == 0) continue; /* rename would replace an empty directory */
            rc = rename(from, to);
            if (rc != 0 && errno != EEXIST && errno != ENOTEMPTY) break;
        }
        if (rc == 0)
            tsr_log(0, "%s: moved aside to %s: it follows step %llu, which this job continues from (a rewind)", from,
                    to, (unsigned long long)e->continue_from);
        else
            tsr_log(0, "%s: cannot move it aside after the rewind to step %llu: %s", from,
                    (unsigned long long)e->continue_from, strerror(errno));
    }
    free(v);
}

/* Rank 0, before a save: no save of this job is in flight. */
static void make_room(tsr_engine *e) {
    if (e->rewind_pending) {
        move_aside(e);
        e->rewind_pending = 0;
    }
    retention(e, 1);
}

void tsr_engine_continue_from(tsr_engine *e, uint64_t step) {
    e->continue_from = step;
    e->rewind_pending = 1;
}

/* ------------------------------------------------------------ background */

static void run_job(tsr_engine *e) {
    job *j = &e->job;

    tsr_error err = {0};
    int rc = 0;
    tsr_save *s = NULL;
    if (tsr_ckpt_is_committed(j->dir))
        rc = tsr_err(&err, TSR_EINVAL, "%s: already holds a committed checkpoint", j->dir);
    if (!rc) {
        tsr_write_opts wo = e->opts.write;
        wo.expected_bytes = j->staged_bytes;
        if (!e->enc) e->enc = tsr_encoder_new(wo.threads, &err);
        s = e->enc ? tsr_save_begin_with(j->dir, e->rank, j->save_id, &wo, e->enc, &err) : NULL;
        if (!s) rc = err.code ? err.code : TSR_EIO;
    }
    for (size_t i = 0; !rc && i < j->n_tensors; i++) {
        const tsr_tensor_decl *t = &j->tensors[i];
        rc = tsr_save_tensor(s, t->name, t->group, t->dtype, t->ndim, t->shape, &t->placement, &err);
    }
    for (size_t i = 0; !rc && i < j->n_boxes; i++)
        rc = tsr_save_box_stable(s, j->tensors[j->boxes[i].tensor].name, &j->boxes[i].box, e->arena + j->boxes[i].off,
                                 &err);
    for (size_t i = 0; !rc && i < j->n_blobs; i++)
        rc = tsr_save_blob(s, j->blobs[i].name, j->blobs[i].rank, e->arena + j->blobs[i].off, j->blobs[i].size, &err);
    const uint8_t *table = NULL;
    size_t table_len = 0;
    if (!rc) rc = tsr_save_finish(s, &table, &table_len, &err);
    if (!rc && table_len > INT_MAX - 4)
        rc = tsr_err(&err, TSR_EINVAL, "%s: a chunk table of %zu bytes, over 2 GiB", j->dir, table_len);

    /* Every rank reports [i32 status][table, or its error message] to rank 0,
     * which waits commit_timeout_s for the reports; the others wait twice as long
     * for its verdict, so that they hear of a timeout from it rather than race it. */
    double timeout = e->opts.commit_timeout_s > 0 ? e->opts.commit_timeout_s : 0;
    size_t mlen = 4 + (rc ? strlen(err.msg) + 1 : table_len);
    uint8_t *msg = malloc(mlen);
    int comm_rc = 0;
    uint8_t *all = NULL;
    size_t *counts = NULL;
    if (msg) {
        tsr_st32(msg, (uint32_t)rc);
        if (rc) memcpy(msg + 4, err.msg, strlen(err.msg) + 1);
        else if (table_len) memcpy(msg + 4, table, table_len);
    }
    tsr_error cerr = {0};
    /* a verdict already here: rank 0 gave up on this rank, and a report now would
     * only wait for a receive that never comes */
    if (e->rank == 0 || !tsr_comm_iprobe(e->bg, 0, TAG_VERDICT))
        comm_rc = tsr_comm_gatherv_deadline(e->bg, 0, TAG_REPORT, msg, msg ? mlen : 0, e->rank ? 2 * timeout : timeout,
                                            &all, &counts, &cerr);
    free(msg);
    /* Rank 0 decides: commit when every rank succeeded. Verdict: [i32 status]
     * [u32 flags][message]. */
    uint8_t outcome[8 + MSG_LEN] = {0};
    if (e->rank == 0) {
        int orc = comm_rc;
        tsr_error oerr = cerr;
        if (!orc) {
            const uint8_t **tables = calloc(e->size, sizeof *tables);
            size_t *lens = calloc(e->size, sizeof *lens);
            size_t off = 0;
            for (uint32_t r = 0; r < e->size && !orc && tables && lens; r++) {
                if (counts[r] < 4) {
                    orc = tsr_err(&oerr, TSR_EIO, "rank %u: no report", r);
                    break;
                }
                int st = (int32_t)tsr_ld32(all + off);
                if (st) {
                    orc = st;
                    tsr_err(&oerr, st, "rank %u: %.*s", r, (int)(counts[r] - 4 > 900 ? 900 : counts[r] - 5),
                            (const char *)all + off + 4);
                }
                tables[r] = all + off + 4;
                lens[r] = counts[r] - 4;
                off += counts[r];
            }
            if (!tables || !lens) orc = tsr_err(&oerr, TSR_ENOMEM, "out of memory");
            if (!orc) orc = tsr_save_commit(s, tables, lens, e->size, j->step, &j->layout, &oerr);
            free(tables);
            free(lens);
        }
        tsr_st32(outcome, (uint32_t)orc);
        tsr_st32(outcome + 4, comm_rc ? VERDICT_BROKEN : 0); /* a failed gather may leave messages behind */
        if (orc) snprintf((char *)outcome + 8, MSG_LEN, "%s", oerr.msg);
    }
    free(all);
    free(counts);
    int unknown = 0, broken = 0; /* unknown: no verdict came, the step may yet be committed */
    if (e->rank == 0) {
        /* a commit is not undone when the verdict cannot be sent */
        if (tsr_comm_bcast_deadline(e->bg, 0, TAG_VERDICT, outcome, sizeof outcome, timeout, &cerr)) {
            tsr_log(0, "save of step %llu: %s", (unsigned long long)j->step, cerr.msg);
            broken = 1;
        }
    } else {
        /* after a report that could not be sent, only a verdict already here counts */
        tsr_error verr = {0};
        if (tsr_comm_bcast_deadline(e->bg, 0, TAG_VERDICT, outcome, sizeof outcome, comm_rc ? 1e-3 : 2 * timeout,
                                    &verr)) {
            unknown = 1;
            tsr_st32(outcome, (uint32_t)TSR_EIO);
            snprintf((char *)outcome + 8, MSG_LEN, "%s", comm_rc ? cerr.msg : verr.msg);
        }
    }
    int final = (int32_t)tsr_ld32(outcome);
    broken |= unknown || (tsr_ld32(outcome + 4) & VERDICT_BROKEN);
    if (final) {
        /* without a verdict this rank's file stays: rank 0 may have committed the
         * step (an uncommitted one is removed by retention later) */
        if (s && !unknown) tsr_save_abort(s);
        tsr_err(&err, final, "save of step %llu to %s failed: %s%s", (unsigned long long)j->step, j->dir,
                (const char *)outcome + 8, unknown ? " (this rank's data file is left in place)" : "");
        tsr_log(0, "%s", err.msg);
    } else if (e->rank == 0) {
        char regular[PATH_MAX + 40], name[32];
        tsr_step_dir_name(j->step, name, sizeof name);
        snprintf(regular, sizeof regular, "%s/%s", e->root, name);
        uint64_t every = e->opts.archive_every ? e->opts.archive_every : 1;
        if (e->arch && j->step % every == 0 && !strcmp(regular, j->dir) && tsr_archiver_add(e->arch, j->dir))
            tsr_log(0, "%s: cannot queue it for archiving: out of memory", j->dir);
        retention(e, 0);
    }
    tsr_save_free(s);
    pthread_mutex_lock(&e->mu);
    e->last_status = final;
    e->last_err = final ? err : (tsr_error){0};
    e->broken |= broken;
    pthread_mutex_unlock(&e->mu);
}

static void *bg_main(void *arg) {
    tsr_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        while (!e->pending && !e->stop) pthread_cond_wait(&e->cv, &e->mu);
        if (e->stop && !e->pending) break;
        e->pending = 0;
        pthread_mutex_unlock(&e->mu);
        run_job(e);
        pthread_mutex_lock(&e->mu);
        e->busy = 0;
        pthread_cond_broadcast(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* ---------------------------------------------------------------- engine */

tsr_engine *tsr_engine_new(const char *root, tsr_comm *comm, const tsr_engine_opts *opts, tsr_error *err) {
    tsr_engine *e = calloc(1, sizeof *e);
    if (!e) {
        tsr_err(err, TSR_ENOMEM, "out of memory");
        return NULL;
    }
    snprintf(e->root, sizeof e->root, "%s", root);
    e->comm = comm;
    e->rank = tsr_comm_rank(comm);
    e->size = tsr_comm_size(comm);
    e->opts = opts ? *opts : tsr_engine_opts_default();
    if (e->opts.write.threads <= 0) e->opts.write.threads = default_threads();
    const char *ct = getenv("TSR_COMMIT_TIMEOUT"); /* seconds; for operators and tests */
    if (ct && *ct) {
        char *end;
        double v = strtod(ct, &end);
        if (*end || !(v >= 0 && v <= 1e9)) tsr_log(1, "TSR_COMMIT_TIMEOUT=%s: not a number of seconds, ignored", ct);
        else e->opts.commit_timeout_s = v;
    }
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    if (e->rank == 0 && getrandom(e->engine_id, 16, 0) != 16) memset(e->engine_id, 0x5a, 16);
    if (tsr_comm_bcast(comm, 0, e->engine_id, 16, err)) goto fail;
    if (e->opts.lock_root) {
        /* rank 0 holds the folder; every rank learns whether it could */
        char msg[MSG_LEN] = "";
        tsr_error lerr = {0};
        int lrc = e->rank == 0 ? tsr_folder_lock_take(e->root, 1, &e->lock, &lerr) : 0;
        if (lrc) snprintf(msg, sizeof msg, "%s", lerr.msg[0] ? lerr.msg : "cannot lock the checkpoint folder");
        int64_t code = lrc;
        if (tsr_comm_bcast(comm, 0, &code, sizeof code, err) || tsr_comm_bcast(comm, 0, msg, sizeof msg, err)) goto fail;
        if (code) {
            tsr_err(err, (int)code, "%s", msg);
            goto fail;
        }
    }
    if (e->opts.archive_url && e->opts.archive_url[0]) {
        snprintf(e->archive_url, sizeof e->archive_url, "%s", e->opts.archive_url);
        e->opts.archive_url = e->archive_url;
        /* rank 0 archives; every rank learns whether it could start */
        char msg[MSG_LEN] = "";
        tsr_error aerr = {0};
        if (e->rank == 0 && !(e->arch = tsr_archiver_new(e->archive_url, e->opts.archive_keep, &aerr)))
            snprintf(msg, sizeof msg, "%s", aerr.msg[0] ? aerr.msg : "cannot start archiving");
        if (tsr_comm_bcast(comm, 0, msg, sizeof msg, err)) goto fail;
        if (msg[0]) {
            tsr_err(err, TSR_EINVAL, "%s", msg);
            goto fail;
        }
    }
    e->bg = tsr_comm_dup(comm, err);
    if (!e->bg) goto fail;
    if (pthread_create(&e->thread, NULL, bg_main, e) != 0) {
        tsr_err(err, TSR_ENOMEM, "cannot start the checkpoint thread");
        goto fail;
    }
    e->thread_started = 1;
    return e;
fail:
    tsr_engine_free(e);
    return NULL;
}

void tsr_engine_free(tsr_engine *e) {
    if (!e) return;
    if (e->thread_started) {
        pthread_mutex_lock(&e->mu);
        e->stop = 1;
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    tsr_archiver_free(e->arch);
    tsr_folder_lock_release(e->lock); /* after the last write into the folder */
    tsr_comm_free(e->bg);
    tsr_encoder_free(e->enc);
    job_clear(&e->job);
    free(e->mine);
    if (e->arena) munmap(e->arena, e->arena_cap); /* unlocks too */
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
}

int tsr_engine_poll(tsr_engine *e, int *done, tsr_error *err) {
    pthread_mutex_lock(&e->mu);
    *done = !e->busy;
    int rc = *done ? e->last_status : 0;
    if (rc && err) *err = e->last_err;
    pthread_mutex_unlock(&e->mu);
    return rc;
}

int tsr_engine_wait(tsr_engine *e, tsr_error *err) {
    pthread_mutex_lock(&e->mu);
    while (e->busy) pthread_cond_wait(&e->cv, &e->mu);
    int rc = e->last_status;
    if (rc && err) *err = e->last_err;
    pthread_mutex_unlock(&e->mu);
    return rc;
}

double tsr_engine_last_wait(const tsr_engine *e) { return e->last_wait; }
double tsr_engine_last_stall(const tsr_engine *e) { return e->last_stall; }

int tsr_engine_broken(tsr_engine *e) {
    pthread_mutex_lock(&e->mu);
    int b = e->broken;
    pthread_mutex_unlock(&e->mu);
    return b;
}

/* ------------------------------------------------------------- planning */

static uint64_t state_key(const tsr_state *st) {
    uint64_t h = tsr_hash(&st->n_tensors, sizeof st->n_tensors);
    for (size_t i = 0; i < st->n_tensors; i++) {
        const tsr_tensor_decl *t = &st->tensors[i];
        h ^= tsr_hash(t->name, strlen(t->name)) * 31 + i;
        uint64_t fields[12] = {(uint64_t)t->dtype, t->ndim, (uint64_t)(int64_t)t->placement.tp_dim, t->placement.fsdp,
                               t->placement.pp_role, (uint64_t)(int64_t)t->placement.layer};
        h = h * 1099511628211ull ^ tsr_hash(fields, sizeof fields);
        h = h * 1099511628211ull ^ tsr_hash(t->shape, t->ndim * sizeof(uint64_t));
    }
    for (size_t i = 0; i < st->n_boxes; i++) {
        const tsr_state_box *b = &st->boxes[i];
        h = h * 1099511628211ull ^ tsr_hash(&b->tensor, sizeof b->tensor);
        h = h * 1099511628211ull ^ tsr_hash(b->box.offset, b->box.ndim * sizeof(uint64_t));
        h = h * 1099511628211ull ^ tsr_hash(b->box.extent, b->box.ndim * sizeof(uint64_t));
    }
    return h;
}

/* Serialized box list: per box, u32 tensor, u32 ndim, ndim x (offset, extent). */
static uint8_t *pack_boxes(const tsr_state *st, size_t *len) {
    size_t n = 0;
    for (size_t i = 0; i < st->n_boxes; i++) n += 8 + 16 * st->boxes[i].box.ndim;
    uint8_t *p = malloc(n ? n : 1), *q = p;
    if (!p) return NULL;
    for (size_t i = 0; i < st->n_boxes; i++) {
        const tsr_state_box *b = &st->boxes[i];
        tsr_st32(q, b->tensor);
        tsr_st32(q + 4, b->box.ndim);
        q += 8;
        for (uint32_t d = 0; d < b->box.ndim; d++, q += 16) {
            tsr_st64(q, b->box.offset[d]);
            tsr_st64(q + 8, b->box.extent[d]);
        }
    }
    *len = n;
    return p;
}

/* Every rank's boxes, from an allgather: held[r] (n_held[r]) into one array. */
typedef struct all_boxes {
    tsr_rank_box *v;
    const tsr_rank_box **held;
    size_t *n_held;
} all_boxes;

static void all_boxes_free(all_boxes *a) {
    free(a->v);
    free(a->held);
    free(a->n_held);
}

static int gather_boxes(tsr_comm *c, const tsr_state *st, all_boxes *out, tsr_error *err) {
    size_t len = 0;
    uint8_t *mine = pack_boxes(st, &len), *all = NULL;
    size_t *counts = NULL;
    if (!mine) return tsr_err(err, TSR_ENOMEM, "out of memory");
    int rc = tsr_comm_allgatherv(c, mine, len, &all, &counts, err);
    free(mine);
    if (rc) return rc;
    uint32_t n = tsr_comm_size(c);
    size_t total = 0;
    for (uint32_t r = 0; r < n; r++) total += counts[r] / 8 + 1; /* an upper bound on boxes */
    out->v = malloc(total * sizeof *out->v);
    out->held = calloc(n, sizeof *out->held);
    out->n_held = calloc(n, sizeof *out->n_held);
    if (!out->v || !out->held || !out->n_held) {
        all_boxes_free(out);
        free(all), free(counts);
        return tsr_err(err, TSR_ENOMEM, "out of memory");
    }
    size_t k = 0, off = 0;
    for (uint32_t r = 0; r < n; r++) {
        out->held[r] = out->v + k;
        const uint8_t *p = all + off, *end = all + off + counts[r];
        while (p + 8 <= end) {
            tsr_rank_box *b = &out->v[k++];
            b->tensor = tsr_ld32(p);
            b->box.ndim = tsr_ld32(p + 4);
            p += 8;
            for (uint32_t d = 0; d < b->box.ndim && d < TSR_MAX_DIMS; d++, p += 16) {
                b->box.offset[d] = tsr_ld64(p);
                b->box.extent[d] = tsr_ld64(p + 8);
            }
            out->n_held[r]++;
        }
        off += counts[r];
    }
    free(all), free(counts);
    return 0;
}

static int cmp_rank_box(const tsr_rank_box *a, const tsr_rank_box *b) {
    if (a->tensor != b->tensor) return a->tensor < b->tensor ? -1 : 1;
    for (uint32_t d = 0; d < a->box.ndim; d++)
        if (a->box.offset[d] != b->box.offset[d]) return a->box.offset[d] < b->box.offset[d] ? -1 : 1;
    return 0;
}

/* The index in plan->boxes of (tensor, box), or -1. */
static long plan_find(const tsr_save_plan *p, uint32_t tensor, const tsr_box *box) {
    tsr_rank_box key = {tensor, *box};
    size_t lo = 0, hi = p->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = cmp_rank_box(&p->boxes[mid], &key);
        if (c == 0) return (long)mid;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

static int check_state(const tsr_state *st, tsr_error *err) {
    for (size_t i = 0; i < st->n_boxes; i++) {
        const tsr_state_box *b = &st->boxes[i];
        if (b->tensor >= st->n_tensors) return tsr_err(err, TSR_EINVAL, "state box %zu: tensor %u of %zu", i, b->tensor, st->n_tensors);
        const tsr_tensor_decl *t = &st->tensors[b->tensor];
        if (b->box.ndim != t->ndim) return tsr_err(err, TSR_EINVAL, "%s: box has %u dims, tensor %u", t->name, b->box.ndim, t->ndim);
        for (uint32_t d = 0; d < t->ndim; d++)
            if (b->box.offset[d] > t->shape[d] || b->box.extent[d] > t->shape[d] - b->box.offset[d])
                return tsr_err(err, TSR_EINVAL, "%s: box outside the tensor's shape in dim %u", t->name, d);
    }
    return 0;
}

static size_t *elem_sizes(const tsr_state *st) {
    size_t *es = malloc((st->n_tensors + 1) * sizeof *es);
    if (es)
        for (size_t i = 0; i < st->n_tensors; i++) es[i] = tsr_dtype_size(st->tensors[i].dtype);
    return es;
}

/* (Re)plans when the state's layout changed on any rank: e->mine lists the state
 * boxes this rank writes. */
static int plan_save(tsr_engine *e, const tsr_state *st, tsr_error *err) {
    uint64_t key = state_key(st);
    int64_t valid = e->have_plan && key == e->plan_key;
    int rc = tsr_comm_allreduce_min(e->comm, &valid, err);
    if (rc) return rc;
    if (valid) return 0;
    all_boxes ab = {0};
    if ((rc = gather_boxes(e->comm, st, &ab, err))) return rc;
    size_t *es = elem_sizes(st);
    tsr_save_plan plan = {0};
    if (!es) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    if (!rc) rc = tsr_save_plan_build(ab.held, ab.n_held, e->size, es, &plan, err);
    free(es);
    all_boxes_free(&ab);
    if (rc) return rc;
    free(e->mine);
    e->mine = malloc((st->n_boxes + 1) * sizeof *e->mine);
    e->n_mine = 0;
    if (!e->mine) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    for (size_t i = 0; !rc && i < st->n_boxes; i++) {
        if (tsr_box_volume(&st->boxes[i].box) == 0) continue;
        long k = plan_find(&plan, st->boxes[i].tensor, &st->boxes[i].box);
        if (k >= 0 && plan.writer[k] == e->rank) {
            e->mine[e->n_mine++] = i;
            plan.writer[k] = UINT32_MAX; /* a box listed twice by this rank is written once */
        }
    }
    tsr_save_plan_free(&plan);
    if (!rc) {
        e->plan_key = key;
        e->have_plan = 1;
    }
    return rc;
}

/* ---------------------------------------------------------------- save */

static int arena_reserve(tsr_engine *e, size_t need, tsr_error *err) {
    if (need <= e->arena_cap) return 0;
    if (e->arena) munmap(e->arena, e->arena_cap);
    size_t cap = tsr_align_up(need + need / 8, 1 << 21);
    /* populated up front: staging must run at memcpy speed, without page faults */
    void *p = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        e->arena = NULL;
        e->arena_cap = 0;
        return tsr_err(err, TSR_ENOMEM, "cannot allocate a staging arena of %zu bytes", cap);
    }
    madvise(p, cap, MADV_HUGEPAGE); /* fewer TLB misses in the staging copy */
    memset(p, 0, cap);              /* touch every page now, not during a save */
    /* pinned, as staging memory should be: the kernel must not reclaim it between
     * saves (a save would then fault it back in). Best effort: without the
     * privilege to lock memory it stays unpinned. */
    if (mlock(p, cap) != 0) tsr_log(2, "staging arena of %zu bytes not locked in memory", cap);
    e->arena = p;
    e->arena_cap = cap;
    return 0;
}

int tsr_engine_reserve(tsr_engine *e, size_t bytes, tsr_error *err) {
    tsr_engine_wait(e, NULL); /* the arena is not in use */
    return arena_reserve(e, bytes, err);
}

static int copy_decls(job *j, const tsr_state *st, tsr_error *err) {
    size_t names = 0;
    for (size_t i = 0; i < st->n_tensors; i++)
        names += strlen(st->tensors[i].name) + strlen(st->tensors[i].group ? st->tensors[i].group : "model") + 2;
    j->tensors = malloc((st->n_tensors + 1) * sizeof *j->tensors);
    j->names = malloc(names + 1);
    if (!j->tensors || !j->names) return tsr_err(err, TSR_ENOMEM, "out of memory");
    char *p = j->names;
    for (size_t i = 0; i < st->n_tensors; i++) {
        j->tensors[i] = st->tensors[i];
        const char *g = st->tensors[i].group ? st->tensors[i].group : "model";
        size_t a = strlen(st->tensors[i].name) + 1, b = strlen(g) + 1;
        memcpy(p, st->tensors[i].name, a);
        j->tensors[i].name = p;
        p += a;
        memcpy(p, g, b);
        j->tensors[i].group = p;
        p += b;
    }
    j->n_tensors = st->n_tensors;
    return 0;
}

int tsr_engine_save(tsr_engine *e, uint64_t step, const tsr_state *st, tsr_error *err) {
    char name[32], dir[PATH_MAX + 40];
    tsr_step_dir_name(step, name, sizeof name);
    snprintf(dir, sizeof dir, "%s/%s", e->root, name);
    return tsr_engine_save_dir(e, dir, step, st, err);
}

/* The staging copy, cut into pieces spread over the encoder's threads (idle
 * between saves): one core's memcpy does not reach the memory bandwidth. Only a
 * copy: checksums are computed in the background, where a pass that reads the
 * data costs the writes less than a longer stall would cost training. */
#define STAGE_PIECE (8u << 20)
typedef struct stage_piece {
    uint8_t *dst;
    const uint8_t *src;
    size_t len;
} stage_piece;
typedef struct stage_copy {
    stage_piece *pieces;
    size_t n, cap;
} stage_copy;

static void stage_one(void *ctx, size_t i, int worker) {
    (void)worker;
    const stage_piece *p = &((stage_copy *)ctx)->pieces[i];
    memcpy(p->dst, p->src, p->len);
}

int tsr_engine_save_dir(tsr_engine *e, const char *dir, uint64_t step, const tsr_state *st, tsr_error *err) {
    double t0 = tsr_now();
    tsr_error prev;
    if (tsr_engine_wait(e, &prev)) tsr_log(1, "previous save failed: %s", prev.msg);
    double t1 = tsr_now();
    e->last_wait = t1 - t0;
    int rc = check_state(st, err);
    pthread_mutex_lock(&e->mu);
    int broken = e->broken;
    pthread_mutex_unlock(&e->mu);
    int64_t ok = rc ? 0 : broken ? 1 : 2;
    /* every rank learns whether all states are usable, and whether every engine
     * can save, before any collective on them */
    if (tsr_comm_allreduce_min(e->comm, &ok, rc ? NULL : err) && !rc) return err ? err->code : TSR_EIO;
    if (!ok) return rc ? rc : tsr_err(err, TSR_EINVAL, "another rank's state is invalid");
    if (ok == 1) { /* the background comm may deliver a late message of that save */
        pthread_mutex_lock(&e->mu);
        e->broken = 1; /* learnt from another rank */
        pthread_mutex_unlock(&e->mu);
        return tsr_err(err, TSR_EIO, "save of step %llu: an earlier commit timed out%s; the engine cannot save until restarted",
                       (unsigned long long)step, broken ? "" : " on another rank");
    }
    /* before any rank writes: the others leave plan_save's collectives only
     * after rank 0 has entered them */
    if (e->rank == 0) make_room(e);
    if ((rc = plan_save(e, st, err))) return rc;

    job_clear(&e->job);
    job *j = &e->job;
    snprintf(j->dir, sizeof j->dir, "%s", dir);
    j->step = step;
    j->layout = st->layout;
    if (!j->layout.pp) j->layout = (tsr_layout){1, 1, 1, 1, 0, 0};
    e->n_saves++;
    uint64_t ids[3] = {tsr_hash(e->engine_id, 16), step, e->n_saves};
    uint64_t h1 = tsr_hash(ids, sizeof ids), h2 = tsr_hash(&h1, sizeof h1);
    memcpy(j->save_id, &h1, 8);
    memcpy(j->save_id + 8, &h2, 8);
    if ((rc = copy_decls(j, st, err))) return rc;
    /* sizes: my boxes, then blobs */
    size_t need = 0, nb = 0;
    for (size_t i = 0; i < e->n_mine; i++) {
        const tsr_state_box *b = &st->boxes[e->mine[i]];
        need += tsr_align_up(tsr_box_volume(&b->box) * tsr_dtype_size(st->tensors[b->tensor].dtype), TSR_ALIGN);
    }
    for (size_t i = 0; i < st->n_blobs; i++) {
        if (st->blobs[i].rank == -1 && e->rank != 0) continue;
        if (strlen(st->blobs[i].name) > TSR_MAX_NAME)
            return tsr_err(err, TSR_EINVAL, "blob name too long: %.64s", st->blobs[i].name);
        need += tsr_align_up(st->blobs[i].size, 64);
        nb++;
    }
    j->boxes = malloc((e->n_mine + 1) * sizeof *j->boxes);
    j->blobs = malloc((nb + 1) * sizeof *j->blobs);
    if (!j->boxes || !j->blobs) return tsr_err(err, TSR_ENOMEM, "out of memory");
    if ((rc = arena_reserve(e, need, err))) return rc;
    /* the staging copy, cut into pieces spread over the encoder's threads (idle
     * between saves): one core's memcpy does not reach the memory bandwidth */
    if (!e->enc && !(e->enc = tsr_encoder_new(e->opts.write.threads, err))) return err ? err->code : TSR_ENOMEM;
    stage_copy sc = {0};
    size_t off = 0;
    for (size_t i = 0; i < e->n_mine; i++) {
        const tsr_state_box *b = &st->boxes[e->mine[i]];
        size_t bytes = tsr_box_volume(&b->box) * tsr_dtype_size(st->tensors[b->tensor].dtype);
        for (size_t o = 0; o < bytes; o += STAGE_PIECE) {
            if (tsr_grow((void **)&sc.pieces, &sc.cap, sc.n, sizeof *sc.pieces)) {
                free(sc.pieces);
                return tsr_err(err, TSR_ENOMEM, "out of memory");
            }
            size_t len = bytes - o < STAGE_PIECE ? bytes - o : STAGE_PIECE;
            sc.pieces[sc.n++] = (stage_piece){e->arena + off + o, (const uint8_t *)b->data + o, len};
        }
        j->boxes[j->n_boxes++] = (staged){b->tensor, b->box, off};
        off += tsr_align_up(bytes, TSR_ALIGN);
    }
    tsr_pool_for(tsr_encoder_pool(e->enc), sc.n, stage_one, &sc);
    free(sc.pieces);
    for (size_t i = 0; i < st->n_blobs; i++) {
        const tsr_state_blob *b = &st->blobs[i];
        if (b->rank == -1 && e->rank != 0) continue;
        staged_blob *sb = &j->blobs[j->n_blobs++];
        snprintf(sb->name, sizeof sb->name, "%s", b->name);
        sb->rank = b->rank;
        sb->off = off;
        sb->size = b->size;
        if (b->size) memcpy(e->arena + off, b->data, b->size);
        off += tsr_align_up(b->size, 64);
    }
    j->staged_bytes = off;
    pthread_mutex_lock(&e->mu);
    e->busy = 1;
    e->pending = 1;
    e->last_status = 0;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    e->last_stall = tsr_now() - t0;
    if (e->opts.sync) return tsr_engine_wait(e, err);
    return 0;
}

/* ---------------------------------------------------------------- load */

/* One read of the load: a region of a stored chunk into a state box. */
typedef struct read_item {
    size_t state_box; /* index into st->boxes */
    size_t chunk;     /* checkpoint chunk index */
    tsr_box region;
} read_item;

typedef struct load_ctx {
    tsr_ckpt *ck;
    const tsr_state *st;
    read_item *items;
    size_t n_items, cap_items;
    pthread_mutex_t mu;
    int rc;
    tsr_error err;
} load_ctx;


static void load_piece(void *ctx, size_t i, int worker) {
    load_ctx *l = ctx;
    const read_item *it = &l->items[i];
    const tsr_state_box *b = &l->st->boxes[it->state_box];
    tsr_error e = {0};
    int rc = tsr_ckpt_read_chunk(l->ck, it->chunk, &it->region, b->data, &b->box, &e);
    if (rc) {
        pthread_mutex_lock(&l->mu);
        if (!l->rc) l->rc = rc, l->err = e;
        pthread_mutex_unlock(&l->mu);
    }
}

static int add_item(load_ctx *l, const read_item *it) {
    if (tsr_grow((void **)&l->items, &l->cap_items, l->n_items, sizeof *l->items)) return TSR_ENOMEM;
    l->items[l->n_items++] = *it;
    return 0;
}

/* Orders indices into the boxes of the tsr_state ctx by tensor. */
static int cmp_by_tensor(const void *a, const void *b, void *ctx) {
    const tsr_state *st = ctx;
    uint32_t x = st->boxes[*(const size_t *)a].tensor, y = st->boxes[*(const size_t *)b].tensor;
    return (x > y) - (x < y);
}

/* Adds one item per frame of the chunk that overlaps the region: a frame is then
 * decoded once, by one thread, and the threads share the work frame by frame. */
typedef struct frame_items {
    load_ctx *l;
    const tsr_mf_chunk *c;
    const tsr_box *region;
    size_t state_box, chunk;
} frame_items;

static int add_frame_item(void *user, uint64_t k) {
    frame_items *f = user;
    read_item it = {f->state_box, f->chunk, {0}};
    tsr_box fb;
    tsr_frame_box(f->c, k, &fb);
    if (!tsr_box_intersect(&fb, f->region, &it.region)) return 0;
    return add_item(f->l, &it);
}

/* The reads of the state boxes `mine` (n of them): per tensor, those boxes against
 * the stored chunks through the planner, each overlap cut along the frames. */
static int plan_reads(load_ctx *l, const long *ck_tensor, size_t *mine, size_t n, tsr_error *err) {
    tsr_ckpt *ck = l->ck;
    const tsr_state *st = l->st;
    size_t nc = tsr_ckpt_n_chunks(ck), nt = tsr_ckpt_n_tensors(ck);
    size_t *first = malloc((nt + 1) * sizeof *first);
    tsr_box *have = malloc((nc + 1) * sizeof *have), *need = malloc((n + 1) * sizeof *need);
    tsr_chunk_info *info = malloc((nc + 1) * sizeof *info);
    int rc = (!first || !have || !need || !info) ? tsr_err(err, TSR_ENOMEM, "out of memory") : 0;
    for (size_t t = 0; !rc && t <= nt; t++) first[t] = nc;
    for (size_t c = nc; !rc && c-- > 0;) { /* chunks are grouped by tensor */
        tsr_ckpt_chunk(ck, c, &info[c]);
        first[info[c].tensor] = c;
        have[c] = info[c].box;
    }
    tsr_sort_ctx(mine, n, sizeof *mine, cmp_by_tensor, (void *)st);
    for (size_t g = 0; !rc && g < n;) {
        uint32_t t = st->boxes[mine[g]].tensor;
        size_t h = g;
        for (; h < n && st->boxes[mine[h]].tensor == t; h++) need[h - g] = st->boxes[mine[h]].box;
        size_t ckt = (size_t)ck_tensor[t], c0 = first[ckt];
        tsr_tensor_info ti;
        tsr_ckpt_tensor(ck, ckt, &ti);
        tsr_overlap *ov = NULL;
        size_t nov = 0;
        rc = tsr_plan_overlaps(need, h - g, have + c0, ti.n_chunks, &ov, &nov, err);
        for (size_t k = 0; !rc && k < nov; k++) {
            const tsr_chunk_info *ci = &info[c0 + ov[k].have];
            tsr_mf_chunk mc = {.box = ci->box, .split_dim = ci->split_dim, .frame_rows = ci->frame_rows};
            frame_items f = {l, &mc, &ov[k].region, mine[g + ov[k].need], c0 + ov[k].have};
            if (tsr_frames_in(&mc, &ov[k].region, add_frame_item, &f)) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
        }
        free(ov);
        g = h;
    }
    free(first), free(have), free(need), free(info);
    return rc;
}

/* Rank 0 picks the directory and reads the MANIFEST; every rank opens it. */
static tsr_ckpt *open_everywhere(tsr_engine *e, const char *step_dir, tsr_error *err) {
    char dir[PATH_MAX];
    uint8_t *buf = NULL;
    size_t len = 0;
    int64_t hdr[2] = {0, 0}; /* status, length */
    tsr_error e0 = {0};
    if (e->rank == 0) {
        uint64_t step;
        if (step_dir) snprintf(dir, sizeof dir, "%s", step_dir);
        else if (tsr_latest_step(e->root, &step, dir, sizeof dir))
            hdr[0] = tsr_err(&e0, TSR_ENOTFOUND, "%s: no committed checkpoint", e->root);
        if (!hdr[0]) hdr[0] = tsr_ckpt_read_manifest(dir, &buf, &len, &e0);
        hdr[1] = (int64_t)len;
    }
    if (tsr_comm_bcast(e->comm, 0, hdr, sizeof hdr, err)) return NULL;
    if (hdr[0]) {
        char m[MSG_LEN] = {0};
        if (e->rank == 0) snprintf(m, sizeof m, "%s", e0.msg);
        tsr_comm_bcast(e->comm, 0, m, sizeof m, NULL);
        tsr_err(err, (int)hdr[0], "%s", m);
        free(buf);
        return NULL;
    }
    if (tsr_comm_bcast(e->comm, 0, dir, sizeof dir, err)) return NULL;
    if (e->rank != 0 && !(buf = malloc((size_t)hdr[1] + 1))) {
        tsr_err(err, TSR_ENOMEM, "out of memory");
        return NULL; /* the bcast below then hangs the others: MPI aborts the job */
    }
    if (tsr_comm_bcast(e->comm, 0, buf, (size_t)hdr[1], err)) {
        free(buf);
        return NULL;
    }
    tsr_ckpt *ck = tsr_ckpt_open_manifest(dir, buf, (size_t)hdr[1], err);
    free(buf);
    return ck;
}

int tsr_engine_load(tsr_engine *e, const char *step_dir, const tsr_state *st, tsr_ckpt **ck_out, tsr_error *err) {
    int rc = check_state(st, err);
    if (rc) return rc;
    tsr_ckpt *ck = open_everywhere(e, step_dir, err);
    if (!ck) return err ? err->code : TSR_EIO;
    long *ck_tensor = malloc((st->n_tensors + 1) * sizeof *ck_tensor);
    if (!ck_tensor) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    for (size_t i = 0; !rc && i < st->n_tensors; i++) {
        const tsr_tensor_decl *t = &st->tensors[i];
        long k = tsr_ckpt_find(ck, t->name);
        tsr_tensor_info ti;
        if (k < 0) {
            rc = tsr_err(err, TSR_ENOTFOUND, "%s: no tensor %s in the checkpoint", tsr_ckpt_dir(ck), t->name);
            break;
        }
        tsr_ckpt_tensor(ck, (size_t)k, &ti);
        int same = ti.dtype == t->dtype && ti.ndim == t->ndim;
        for (uint32_t d = 0; same && d < t->ndim; d++) same = ti.shape[d] == t->shape[d];
        if (!same) {
            char a[160] = "", b[160] = "";
            for (uint32_t d = 0; d < ti.ndim; d++) snprintf(a + strlen(a), sizeof a - strlen(a), "%s%llu", d ? "," : "", (unsigned long long)ti.shape[d]);
            for (uint32_t d = 0; d < t->ndim; d++) snprintf(b + strlen(b), sizeof b - strlen(b), "%s%llu", d ? "," : "", (unsigned long long)t->shape[d]);
            rc = tsr_err(err, TSR_EINVAL, "%s: tensor %s is %s [%s] in the checkpoint, %s [%s] here", tsr_ckpt_dir(ck),
                         t->name, tsr_dtype_name(ti.dtype), a, tsr_dtype_name(t->dtype), b);
            break;
        }
        ck_tensor[i] = k;
    }
    /* every rank sees the same decls, but a rank's local failure must stop all */
    int64_t ok = rc == 0;
    tsr_comm_allreduce_min(e->comm, &ok, NULL);
    if (!ok && !rc) rc = tsr_err(err, TSR_EINVAL, "load refused on another rank");

    all_boxes ab = {0};
    tsr_save_plan plan = {0};
    size_t *es = NULL;
    if (!rc) rc = gather_boxes(e->comm, st, &ab, err);
    if (!rc && !(es = elem_sizes(st))) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    if (!rc) rc = tsr_save_plan_build(ab.held, ab.n_held, e->size, es, &plan, err);

    tsr_comm_reqs *reqs = rc ? NULL : tsr_comm_reqs_new();
    load_ctx l = {.ck = ck, .st = st};
    pthread_mutex_init(&l.mu, NULL);
    long *mine_for = NULL; /* plan entry -> my state box index, for entries I read */
    size_t *mine = NULL, n_mine = 0;
    if (!rc && !reqs) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    if (!rc && !(mine_for = malloc((plan.n + 1) * sizeof *mine_for))) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    if (!rc && !(mine = malloc((st->n_boxes + 1) * sizeof *mine))) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    for (size_t k = 0; !rc && k < plan.n; k++) mine_for[k] = -1;
    /* 1: receives for the boxes another rank reads for me */
    for (size_t i = 0; !rc && i < st->n_boxes; i++) {
        const tsr_state_box *b = &st->boxes[i];
        if (tsr_box_volume(&b->box) == 0) continue;
        long k = plan_find(&plan, b->tensor, &b->box);
        if (k < 0) {
            rc = tsr_err(err, TSR_EIO, "load plan lost a box of %s", st->tensors[b->tensor].name);
            break;
        }
        size_t bytes = tsr_box_volume(&b->box) * es[b->tensor];
        if (plan.writer[k] == e->rank) {
            if (mine_for[k] < 0) {
                mine_for[k] = (long)i;
                mine[n_mine++] = i;
            } else { /* the same box twice in my own state: sent to myself after the read */
                rc = tsr_comm_irecv(e->comm, e->rank, (int)(k % TAG_MOD), b->data, bytes, reqs, err);
            }
        } else {
            rc = tsr_comm_irecv(e->comm, plan.writer[k], (int)(k % TAG_MOD), b->data, bytes, reqs, err);
        }
    }
    /* 2: my reads, planned against the stored chunks, spread over threads */
    if (!rc && n_mine) rc = plan_reads(&l, ck_tensor, mine, n_mine, err);
    if (!rc && l.n_items) {
        tsr_pool *pool = tsr_pool_new(e->opts.write.threads);
        if (!pool) rc = tsr_err(err, TSR_ENOMEM, "cannot start reader threads");
        else {
            tsr_pool_for(pool, l.n_items, load_piece, &l);
            tsr_pool_free(pool);
        }
        if (!rc && l.rc) {
            rc = l.rc;
            if (err) *err = l.err;
        }
    }
    /* 3: send what I read to every other rank that holds the same box (also on a
     * local read failure: the receivers are waiting; the status below tells them) */
    for (uint32_t r = 0; reqs && r < e->size; r++) {
        for (size_t i = 0; i < ab.n_held[r]; i++) {
            const tsr_rank_box *hb = &ab.held[r][i];
            if (tsr_box_volume(&hb->box) == 0) continue;
            long k = plan_find(&plan, hb->tensor, &hb->box);
            if (k < 0 || plan.writer[k] != e->rank) continue;
            /* held[me][i] is st->boxes[i]: its first copy was read in place */
            if (r == e->rank && mine_for[k] == (long)i) continue;
            const tsr_state_box *src = &st->boxes[mine_for[k]];
            tsr_error se;
            if (tsr_comm_isend(e->comm, r, (int)(k % TAG_MOD), src->data,
                               tsr_box_volume(&src->box) * es[src->tensor], reqs, &se) && !rc) {
                rc = se.code;
                if (err) *err = se;
            }
        }
    }
    if (reqs) {
        tsr_error we;
        if (tsr_comm_waitall(e->comm, reqs, &we) && !rc) {
            rc = we.code;
            if (err) *err = we;
        }
    }
    /* everyone learns whether every rank loaded */
    int64_t all_ok = rc == 0;
    tsr_comm_allreduce_min(e->comm, &all_ok, NULL);
    if (!rc && !all_ok) rc = tsr_err(err, TSR_EIO, "%s: the load failed on another rank", tsr_ckpt_dir(ck));
    tsr_comm_reqs_free(reqs);
    pthread_mutex_destroy(&l.mu);
    free(l.items);
    free(mine);
    free(mine_for);
    tsr_save_plan_free(&plan);
    free(es);
    all_boxes_free(&ab);
    free(ck_tensor);
    if (rc || !ck_out) tsr_ckpt_close(ck);
    else *ck_out = ck;
    return rc;
}
