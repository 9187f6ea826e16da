/* engine.c: the distributed, asynchronous checkpoint engine: its life cycle.
 *
 * Save (engine_save.c): plan (cached) -> stage into one arena (the only part the
 * caller waits for) -> in a background thread: encode and write this rank's data
 * file through tsr_save (thread pool, io_uring), gather every rank's table and
 * status on rank 0, commit the MANIFEST there, broadcast the outcome, and on
 * failure remove this save's files everywhere. That exchange has a deadline
 * (commit_timeout_s): a rank that misses it fails the save, and the engine then
 * refuses to save again, since its background comm may still deliver the late
 * rank's message.
 * Load (engine_load.c): rank 0 reads the MANIFEST and broadcasts it; each distinct
 * needed box is read by one rank that needs it and sent to the others.
 * This file holds the background thread and runs a save's phases in order; the
 * phase files never call back into it. */
#include "engine_impl.h"
#include "fence.h"
#include "mem.h"

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

void tsr_engine_continue_from(tsr_engine *e, uint64_t step) {
    e->continue_from = step;
    e->rewind_pending = 1;
}


static void *bg_main(void *arg) {
    tsr_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        while (!e->pending && !e->stop) pthread_cond_wait(&e->cv, &e->mu);
        if (e->stop && !e->pending) break;
        e->pending = 0;
        pthread_mutex_unlock(&e->mu);
        tsr_error err;
        int broken = 0, rc = engine_run_job(e, &err, &broken);
        pthread_mutex_lock(&e->mu);
        e->last_status = rc;
        e->last_err = rc ? err : (tsr_error){0};
        e->broken |= broken;
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
    const char *nd = getenv("TSR_BENCH_NO_DIGESTS"); /* make bench's baseline only: saves without them */
    if (nd && *nd) {
        if (strcmp(nd, "1")) tsr_log(1, "TSR_BENCH_NO_DIGESTS=%s: not 1, ignored", nd);
        else e->opts.write.no_digests = 1;
    }
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    if (e->rank == 0 && getrandom(e->engine_id, 16, 0) != 16) memset(e->engine_id, 0x5a, 16);
    if (tsr_comm_bcast(comm, 0, e->engine_id, 16, err)) goto fail;
    int advance = e->opts.fence && !e->opts.write.epoch;
    if (e->opts.lock_root || advance) {
        /* rank 0 holds the folder, then fences the writers of earlier launches
         * out of it; every rank learns whether it could, and the epoch */
        char msg[MSG_LEN] = "";
        tsr_error lerr = {0};
        uint64_t epoch = 0;
        int lrc = e->rank == 0 && e->opts.lock_root ? tsr_folder_lock_take(e->root, 1, &e->lock, &lerr) : 0;
        if (!lrc && e->rank == 0 && advance && (lrc = tsr_fence_advance(e->root, &epoch, &lerr)) == TSR_ENOSPC) {
            /* a full disk (a leftover of a failed save, which the first save
             * removes): this run writes as the fence's epoch, alongside the
             * launch before it, rather than not at all */
            tsr_fence f;
            tsr_error ferr = {0};
            if (tsr_fence_read(e->root, &f, &ferr) == 0 && (epoch = tsr_fence_epoch(&f)) > 0) {
                tsr_log(0, "cannot raise the fence of the checkpoint folder: %s; this run writes as its epoch %llu",
                        lerr.msg, (unsigned long long)epoch);
                lrc = 0;
            }
            tsr_fence_free(&f);
        }
        if (lrc && e->rank == 0 && advance) tsr_err_prefix(&lerr, "cannot fence the checkpoint folder");
        if (lrc) snprintf(msg, sizeof msg, "%s", lerr.msg[0] ? lerr.msg : "cannot lock the checkpoint folder");
        int64_t hdr[2] = {lrc, (int64_t)epoch};
        if (tsr_comm_bcast(comm, 0, hdr, sizeof hdr, err) || tsr_comm_bcast(comm, 0, msg, sizeof msg, err)) goto fail;
        if (hdr[0]) {
            tsr_err(err, (int)hdr[0], "%s", msg);
            goto fail;
        }
        if (advance) e->opts.write.epoch = (uint64_t)hdr[1];
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
    if (e->arch) { /* the archives still queued go first; then what waited for them goes too */
        tsr_archiver_free(e->arch);
        e->arch = NULL;
        engine_retention(e, 0);
    }
    tsr_folder_lock_release(e->lock); /* after the last write into the folder */
    tsr_comm_free(e->bg);
    tsr_encoder_free(e->enc);
    engine_job_clear(&e->job);
    free(e->mine);
    if (e->arena && e->arena_pinned) tsr_mem_unpin(e->arena, e->arena_for);
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
uint64_t tsr_engine_epoch(const tsr_engine *e) { return e->opts.write.epoch; }
double tsr_engine_last_stall(const tsr_engine *e) { return e->last_stall; }
double tsr_engine_pin_seconds(const tsr_engine *e) { return e->pin_seconds; }

int tsr_engine_broken(tsr_engine *e) {
    pthread_mutex_lock(&e->mu);
    int b = e->broken;
    pthread_mutex_unlock(&e->mu);
    return b;
}


/* ------------------------------------------------------------------ save */

int tsr_engine_prepare(tsr_engine *e, const tsr_state *st, tsr_error *err) {
    /* after a rewind the first save plans, as without this call: its agreement
     * is where rank 0 moves the abandoned steps aside */
    if (e->rewind_pending) return 0;
    tsr_engine_wait(e, NULL); /* e->bg and the plan are the caller's */
    /* the first save's agreement, made now: rank 0 makes room, every rank
     * learns whether all states are valid */
    int rc = engine_check_state(st, err), broken = 0;
    int a = engine_agree(e, 0, rc ? AGREE_INVALID : AGREE_REPLAN, rc, &broken, err);
    if (a != AGREE_REPLAN) return a;
    rc = engine_plan_save(e, st, err);
    if (!rc) engine_arena_pin(e, st); /* device state: pinned now, not in the first save */
    return rc;
}

int tsr_engine_reserve(tsr_engine *e, size_t bytes, tsr_error *err) {
    tsr_engine_wait(e, NULL); /* the arena is not in use */
    return engine_arena_reserve(e, bytes, err);
}

void tsr_engine_staged(tsr_engine *e) {
    pthread_mutex_lock(&e->mu);
    while (e->staging) pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
}

int tsr_engine_save(tsr_engine *e, uint64_t step, const tsr_state *st, tsr_error *err) {
    char name[32], dir[PATH_MAX + 40];
    tsr_step_dir_name(step, name, sizeof name);
    snprintf(dir, sizeof dir, "%s/%s", e->root, name);
    return tsr_engine_save_dir(e, dir, step, st, err);
}

/* The previous save done, then plan and stage here; the write and the commit
 * exchange are handed to the background thread. */
int tsr_engine_save_dir(tsr_engine *e, const char *dir, uint64_t step, const tsr_state *st, tsr_error *err) {
    double t0 = tsr_now();
    tsr_error prev;
    if (tsr_engine_wait(e, &prev) && !e->opts.quiet) tsr_log(1, "previous save failed: %s", prev.msg);
    e->last_wait = tsr_now() - t0;
    int broken = tsr_engine_broken(e), later = 0;
    e->n_saves++; /* on every rank, whatever the outcome: the save ids stay the same everywhere */
    int rc = engine_save_plan(e, step, st, &broken, &later, err);
    if (broken) {
        pthread_mutex_lock(&e->mu);
        e->broken = 1;
        pthread_mutex_unlock(&e->mu);
    }
    if (!rc) rc = engine_stage(e, dir, step, st, err);
    if (rc && later) { /* the other ranks' backgrounds wait for this rank's word: it fails the save everywhere */
        tsr_error ae = {0};
        engine_agree(e, step, AGREE_INVALID, rc, &broken, &ae);
    }
    if (rc) return rc;
    e->job.agree_later = later;
    pthread_mutex_lock(&e->mu);
    e->busy = 1;
    e->pending = 1;
    e->staging = e->job.deferred != NULL;
    e->last_status = 0;
    pthread_mutex_unlock(&e->mu);
    pthread_cond_broadcast(&e->cv); /* after the unlock: the woken thread finds the lock free */
    e->last_stall = tsr_now() - t0;
    if (e->opts.sync) return tsr_engine_wait(e, err);
    return 0;
}
