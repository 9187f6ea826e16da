/* engine_save.c: the phases of a save; engine.c runs them in this order.
 *   plan    every rank agrees that it can save; rank 0 makes room (rewinding,
 *           retention); the cached plan of which rank writes which box
 *   stage   this rank's boxes and blobs copied into the arena: the only part the
 *           caller waits for
 *   write   in the background: this rank's data file, through tsr_save
 *   commit  in the background: the commit exchange. Every rank reports to rank 0,
 *           which commits the MANIFEST when all succeeded and sends its verdict
 *           back; a failed save's files are removed, a committed step is queued
 *           for archiving and retention runs. The exchange has a deadline
 *           (commit_timeout_s): a rank that misses it fails the save, and the
 *           engine then refuses to save again, since its background comm may
 *           still deliver the late rank's message. */
#include "engine_impl.h"
#include "fence.h"

/* The commit exchange on the background comm: reports to rank 0, its verdict back. */
#define TAG_REPORT 1
#define TAG_VERDICT 2
#define VERDICT_BROKEN 1u /* flag: a rank missed the exchange; its message may come later */

static void deferred_free(save_job *j);
static void deferred_start(tsr_engine *e);
static int deferred_box(tsr_engine *e, size_t b, tsr_error *err);
static int deferred_finish(tsr_engine *e, tsr_error *err);
static int copy_idle(void *ctx, int run);

void engine_job_clear(save_job *j) {
    deferred_free(j);
    free(j->tensors);
    free(j->names);
    free(j->boxes);
    free(j->blobs);
    memset(j, 0, sizeof *j);
}
#include "mem.h"

/* ------------------------------------------------------------ retention */

/* ROOT/spare: where a recycling engine's retention keeps data files to write over. */
static void spare_dir(const tsr_engine *e, char *buf, size_t len) { snprintf(buf, len, "%s/spare", e->root); }

/* Keeps the newest K committed steps (and the newest clean one, when those are
 * all poisoned: tsr_retention_keep); removes older ones, and uncommitted step
 * directories (failed or interrupted saves) older than the newest committed one,
 * or all of them before a save (make_room), when no save of this job is in
 * flight and the folder lock keeps other writers out. */
/* Whether a newer launch has fenced this engine out of ROOT (FORMAT.md 4.6):
 * then rank 0 removes and moves nothing there (its saves are refused by the
 * writer's checks). A FENCE that cannot be read fences it out too. */
static int fenced_out(tsr_engine *e) {
    if (!e->opts.write.epoch) return 0;
    tsr_fence f;
    tsr_error fe = {0};
    int rc = tsr_fence_read(e->root, &f, &fe);
    uint64_t at = rc ? 0 : tsr_fence_epoch(&f);
    tsr_fence_free(&f);
    if (rc) tsr_log(0, "%s; nothing is removed from the folder", fe.msg);
    else if (at > e->opts.write.epoch)
        tsr_log(0, "fenced: %s: this writer's epoch %llu is older than the folder's fence, epoch %llu: nothing is "
                "removed from the folder", e->root, (unsigned long long)e->opts.write.epoch, (unsigned long long)at);
    return rc || at > e->opts.write.epoch;
}

void engine_retention(tsr_engine *e, int before_save) {
    if (fenced_out(e)) return;
    tsr_step_info *v = NULL;
    size_t count = 0;
    if (tsr_list_steps(e->root, &v, &count) || count == 0) {
        free(v);
        return;
    }
    long n = (long)count;
    long newest = -1;
    int *keep = malloc(count * sizeof *keep);
    if (!keep) {
        free(v);
        return;
    }
    tsr_retention_keep(v, count, e->opts.keep_latest, keep);
    for (long i = 0; i < n; i++)
        if (v[i].committed) newest = i;
    for (long i = 0; i < n; i++) {
        int remove = 0;
        if (v[i].committed && !keep[i]) remove = 1;
        else if (!v[i].committed && (i < newest || before_save)) remove = 1;
        if (!remove) continue;
        char path[PATH_MAX + 80];
        snprintf(path, sizeof path, "%s/%s", e->root, v[i].name);
        if (e->arch && tsr_archiver_holds(e->arch, path)) continue; /* not archived yet */
        tsr_error rerr;
        char spare[PATH_MAX + 16];
        spare_dir(e, spare, sizeof spare);
        int recycle = e->opts.recycle && v[i].committed && (tsr_store_caps(e->root) & TSR_STORE_RENAME);
        if ((recycle ? tsr_retire_step_dir(path, spare, &rerr) : tsr_remove_step_dir(path, &rerr)) == 0) {
            if (!v[i].committed && e->opts.quiet) continue; /* the failed save: its owner said it */
            tsr_log(before_save ? 1 : 2, "%s: removed (%s)", path,
                    v[i].committed ? "retention" : "uncommitted: left by a failed or interrupted save");
        }
        else tsr_log(1, "retention: %s", rerr.msg);
    }
    free(keep);
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
        if (!(tsr_store_caps(e->root) & TSR_STORE_RENAME)) {
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
    if (e->rewind_pending && !fenced_out(e)) {
        move_aside(e);
        e->rewind_pending = 0;
    }
    engine_retention(e, 1);
}


/* ----------------------------------------------------------------- plan */

int engine_agree(tsr_engine *e, uint64_t step, int64_t code, int here_rc, int *broken, tsr_error *err) {
    /* before any rank writes: the others leave the agreement only after rank 0
     * has entered it */
    if (e->rank == 0 && code >= AGREE_REPLAN) make_room(e);
    /* the lowest code and the highest; collectives, which no late point-to-point
     * message of an earlier save on e->bg can disturb */
    int64_t lo = code, hi = -code;
    tsr_error ce = {0};
    if (tsr_comm_allreduce_min(e->bg, &lo, &ce) || tsr_comm_allreduce_min(e->bg, &hi, &ce))
        return here_rc ? here_rc : tsr_err(err, ce.code ? ce.code : TSR_EIO, "save of step %llu: %s",
                                            (unsigned long long)step, ce.msg);
    hi = -hi;
    if (lo == AGREE_INVALID) return here_rc ? here_rc : tsr_err(err, TSR_EINVAL, "save of step %llu: another rank's state is invalid or could not be staged",
                                                              (unsigned long long)step);
    if (lo == AGREE_BROKEN) { /* the background comm may deliver a late message of that save */
        int here = *broken;
        *broken = 1; /* learnt from another rank */
        return tsr_err(err, TSR_EIO, "save of step %llu: an earlier commit timed out%s; the engine cannot save until restarted",
                       (unsigned long long)step, here ? "" : " on another rank");
    }
    if (lo == AGREE_CACHED) return 0;
    if (hi == AGREE_CACHED) { /* the ranks that kept their plan are past the point of planning */
        e->have_plan = 0;
        return tsr_err(err, TSR_EINVAL, "save of step %llu: the state's layout changed on some ranks only; this save "
                       "is skipped and the next one plans again", (unsigned long long)step);
    }
    return AGREE_REPLAN;
}

int engine_save_plan(tsr_engine *e, uint64_t step, const tsr_state *st, int *broken, int *later, tsr_error *err) {
    int rc = engine_check_state(st, err);
    uint64_t key = rc ? 0 : engine_state_key(st);
    int64_t code = rc ? AGREE_INVALID : *broken ? AGREE_BROKEN : e->have_plan && key == e->plan_key ? AGREE_CACHED : AGREE_REPLAN;
    *later = code == AGREE_CACHED && !e->opts.sync;
    if (*later) return 0;
    int a = engine_agree(e, step, code, rc, broken, err);
    if (a != AGREE_REPLAN) return a;
    return engine_plan_save(e, st, err);
}

/* ---------------------------------------------------------------- write */

/* Writes this rank's data file of the staged job: declarations, boxes, blobs;
 * its chunk table (owned by *sp) in *table. *sp is set whenever the save began. */
static int write_file(tsr_engine *e, tsr_save **sp, const uint8_t **table, size_t *table_len, tsr_error *err) {
    save_job *j = &e->job;
    if (tsr_ckpt_is_committed(j->dir))
        return tsr_err(err, TSR_EINVAL, "%s: already holds a committed checkpoint", j->dir);
    tsr_write_opts wo = e->opts.write;
    wo.expected_bytes = j->staged_bytes;
    char spare[PATH_MAX + 16];
    spare_dir(e, spare, sizeof spare);
    wo.spare_dir = e->opts.recycle ? spare : NULL;
    if (!e->enc) e->enc = tsr_encoder_new(wo.threads, err);
    tsr_save *s = *sp = e->enc ? tsr_save_begin_with(j->dir, e->rank, j->save_id, &wo, e->enc, err) : NULL;
    if (!s) return err->code ? err->code : TSR_EIO;
    if (j->deferred) tsr_save_set_idle(s, copy_idle, e);
    int rc = 0;
    for (size_t i = 0; !rc && i < j->n_tensors; i++) {
        const tsr_tensor_decl *t = &j->tensors[i];
        rc = tsr_save_tensor(s, t->name, t->group, t->dtype, t->ndim, t->shape, &t->placement, err);
    }
    for (size_t i = 0; !rc && i < j->n_boxes; i++) {
        rc = deferred_box(e, i, err); /* its staging copy done (it overlaps the earlier boxes' writes) */
        if (!rc)
            rc = tsr_save_box_stable(s, j->tensors[j->boxes[i].tensor].name, &j->boxes[i].box,
                                     e->arena + j->boxes[i].off, j->boxes[i].stats_taken ? &j->boxes[i].stats : NULL,
                                     err);
    }
    for (size_t i = 0; !rc && i < j->n_blobs; i++)
        rc = tsr_save_blob(s, j->blobs[i].name, j->blobs[i].rank, e->arena + j->blobs[i].off, j->blobs[i].size, err);
    if (!rc) rc = tsr_save_finish(s, table, table_len, err);
    if (!rc && *table_len > INT_MAX - 4)
        rc = tsr_err(err, TSR_EINVAL, "%s: a chunk table of %zu bytes, over 2 GiB", j->dir, *table_len);
    return rc;
}

/* --------------------------------------------------------------- commit */

/* Every rank reports [i32 status][its table, or its error message] to rank 0,
 * through the gather's tree, which rank 0 waits `timeout` for; the others wait
 * twice as long for its verdict, so that they hear of a timeout from it rather
 * than race it. On rank 0
 * *all and *counts receive the reports. @return the exchange's status (cerr). */
static int report(tsr_engine *e, double timeout, int rc, const tsr_error *err, const uint8_t *table,
                  size_t table_len, uint8_t **all, size_t **counts, tsr_error *cerr) {
    size_t mlen = 4 + (rc ? strlen(err->msg) + 1 : table_len);
    uint8_t *msg = malloc(mlen);
    if (msg) {
        tsr_st32(msg, (uint32_t)rc);
        if (rc) memcpy(msg + 4, err->msg, strlen(err->msg) + 1);
        else if (table_len) memcpy(msg + 4, table, table_len);
    }
    int comm_rc = 0;
    /* a verdict already here: rank 0 gave up on this rank, and a report now would
     * only wait for a receive that never comes */
    if (e->rank == 0 || !tsr_comm_iprobe(e->bg, 0, TAG_VERDICT))
        comm_rc = tsr_comm_gatherv_deadline(e->bg, 0, TAG_REPORT, msg, msg ? mlen : 0, timeout, all, counts, cerr);
    free(msg);
    return comm_rc;
}

/* Rank 0 decides: commit when every rank reported success. The verdict, into
 * outcome: [i32 status][u32 flags][message]. */
static void decide(tsr_engine *e, tsr_save *s, int comm_rc, const tsr_error *cerr, const uint8_t *all,
                   const size_t *counts, uint8_t *outcome) {
    int orc = comm_rc;
    tsr_error oerr = *cerr;
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
        if (!orc) orc = tsr_save_commit(s, tables, lens, e->size, e->job.step, &e->job.layout, &oerr);
        free(tables);
        free(lens);
    }
    tsr_st32(outcome, (uint32_t)orc);
    tsr_st32(outcome + 4, comm_rc ? VERDICT_BROKEN : 0); /* a failed gather may leave messages behind */
    if (orc) snprintf((char *)outcome + 8, MSG_LEN, "%s", oerr.msg);
}

/* Rank 0 sends its verdict (outcome), the others receive it into outcome.
 * @return 1 when no verdict came (the step may yet be committed: outcome then
 * holds this rank's failure); *broken when rank 0 could not send it. */
static int exchange_verdict(tsr_engine *e, double timeout, int comm_rc, const tsr_error *cerr, uint8_t *outcome,
                            size_t outcome_len, int *broken) {
    tsr_error verr = {0};
    if (e->rank == 0) {
        /* a commit is not undone when the verdict cannot be sent */
        if (tsr_comm_bcast_deadline(e->bg, 0, TAG_VERDICT, outcome, outcome_len, timeout, &verr)) {
            tsr_log(0, "save of step %llu: %s", (unsigned long long)e->job.step, verr.msg);
            *broken = 1;
        }
        return 0;
    }
    /* after a report that could not be sent, only a verdict already here counts */
    if (!tsr_comm_bcast_deadline(e->bg, 0, TAG_VERDICT, outcome, outcome_len, comm_rc ? 1e-3 : 2 * timeout, &verr))
        return 0;
    tsr_st32(outcome, (uint32_t)TSR_EIO);
    snprintf((char *)outcome + 8, MSG_LEN, "%s", comm_rc ? cerr->msg : verr.msg);
    return 1;
}

/* After the verdict: a failed save's file removed (not without a verdict: rank
 * 0 may have committed the step; an uncommitted one is removed by retention
 * later) and err set; on rank 0 a committed step queued for archiving and
 * retention run. */
static void finish(tsr_engine *e, tsr_save *s, int final, int unknown, const uint8_t *outcome, tsr_error *err) {
    save_job *j = &e->job;
    if (final) {
        if (s && !unknown) tsr_save_abort(s);
        tsr_err(err, final, "save of step %llu to %s failed: %s%s", (unsigned long long)j->step, j->dir,
                (const char *)outcome + 8, unknown ? " (this rank's data file is left in place)" : "");
        if (!e->opts.quiet) tsr_log(0, "%s", err->msg);
    } else if (e->rank == 0) {
        char regular[PATH_MAX + 40], name[32];
        tsr_step_dir_name(j->step, name, sizeof name);
        snprintf(regular, sizeof regular, "%s/%s", e->root, name);
        uint64_t every = e->opts.archive_every ? e->opts.archive_every : 1;
        if (e->arch && j->step % every == 0 && !strcmp(regular, j->dir) && tsr_archiver_add(e->arch, j->dir))
            tsr_log(0, "%s: cannot queue it for archiving: out of memory", j->dir);
        engine_retention(e, 0);
    }
}

int engine_run_job(tsr_engine *e, tsr_error *err, int *broken) {
    tsr_save *s = NULL;
    const uint8_t *table = NULL;
    size_t table_len = 0;
    *err = (tsr_error){0};
    *broken = 0;
    int rc = 0;
    deferred_start(e);
    if (e->job.agree_later) { /* the save call left the agreement to here */
        tsr_error ae = {0};
        int a = engine_agree(e, e->job.step, AGREE_CACHED, 0, broken, &ae);
        if (a) { /* every rank learnt the same: none writes */
            rc = deferred_finish(e, err);
            if (!rc) *err = ae;
            return rc ? rc : a;
        }
    }
    rc = write_file(e, &s, &table, &table_len, err);
    tsr_error ferr = {0};
    int frc = deferred_finish(e, &ferr); /* the copy's failure, where the writes had none */
    if (!rc && frc) {
        rc = frc;
        *err = ferr;
    }

    double timeout = e->opts.commit_timeout_s > 0 ? e->opts.commit_timeout_s : 0;
    uint8_t *all = NULL;
    size_t *counts = NULL;
    tsr_error cerr = {0};
    int comm_rc = report(e, timeout, rc, err, table, table_len, &all, &counts, &cerr);
    uint8_t outcome[8 + MSG_LEN] = {0};
    if (e->rank == 0) decide(e, s, comm_rc, &cerr, all, counts, outcome);
    free(all);
    free(counts);
    int unknown = exchange_verdict(e, timeout, comm_rc, &cerr, outcome, sizeof outcome, broken);
    int final = (int32_t)tsr_ld32(outcome);
    *broken |= unknown || (tsr_ld32(outcome + 4) & VERDICT_BROKEN);
    finish(e, s, final, unknown, outcome, err);
    tsr_save_free(s);
    return final;
}

/* ---------------------------------------------------------------- stage */

int engine_arena_reserve(tsr_engine *e, size_t need, tsr_error *err) {
    if (need <= e->arena_cap) return 0;
    if (e->arena && e->arena_pinned) tsr_mem_unpin(e->arena, e->arena_for);
    if (e->arena) munmap(e->arena, e->arena_cap);
    e->arena_for = TSR_MEM_HOST, e->arena_pinned = 0;
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

static int copy_decls(save_job *j, const tsr_state *st, tsr_error *err) {
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

/* The staging copy, cut into pieces spread over the encoder's threads (idle
 * between saves): one core's memcpy does not reach the memory bandwidth. Only a
 * copy: checksums are computed in the background, where a pass that reads the
 * data costs the writes less than a longer stall would cost training.
 * Deferred (overlap_staging), it runs in the background as the pool's
 * background loop, in box order, ahead of the encoding: each box is written as
 * soon as its pieces are copied, so that the disk starts with the first box
 * rather than after the last, and the copy, which the caller waits for, keeps
 * the threads' first claim. */
#define STAGE_PIECE (8u << 20)
typedef struct stage_piece {
    uint8_t *dst;
    const uint8_t *src;
    size_t len;
    tsr_mem_kind mem; /* of src */
    const char *tensor;
    size_t box; /* the job's box it belongs to */
    int dtype;  /* the tensor's, and -1 where the copy takes no statistics */
} stage_piece;
typedef struct stage_copy {
    stage_piece *pieces;
    size_t n, cap;
    size_t *box_end;    /* per box: one past the index of its last piece */
    size_t *box_left;   /* per box: its pieces not copied yet */
    size_t left;        /* pieces not copied yet */
    tsr_engine *e;      /* deferred: told (staging = 0) when the last piece is done */
    staged *boxes;      /* the job's: each piece's statistics added to its box's */
    pthread_mutex_t mu; /* the counts and the first failed copy */
    pthread_cond_t cv;  /* a box done */
    int rc;
    tsr_error err;
} stage_copy;

/* The caller may change its state: the copy is over. */
static void staging_done(tsr_engine *e) {
    pthread_mutex_lock(&e->mu);
    e->staging = 0;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

static void stage_one(void *ctx, size_t i, int worker) {
    (void)worker;
    stage_copy *sc = ctx;
    const stage_piece *p = &sc->pieces[i];
    tsr_error e = {0};
    tsr_stats st;
    tsr_stats_init(&st);
    /* host memory of f32 or bf16: the statistics taken in the copy's pass, for free */
    int took = p->dtype >= 0 && tsr_stats_copy(p->dtype, p->dst, p->src, p->len, &st);
    int rc = took ? 0 : tsr_mem_to_host(p->dst, p->src, p->len, p->mem, &e);
    pthread_mutex_lock(&sc->mu);
    if (took) tsr_stats_merge(&sc->boxes[p->box].stats, &st);
    else sc->boxes[p->box].stats_taken = 0;
    if (rc && !sc->rc) sc->rc = tsr_err(&sc->err, e.code ? e.code : TSR_EIO, "staging %s: %s", p->tensor, e.msg);
    if (--sc->box_left[p->box] == 0) pthread_cond_broadcast(&sc->cv);
    int last = --sc->left == 0;
    pthread_mutex_unlock(&sc->mu);
    if (last && sc->e) staging_done(sc->e);
}

/* The job's identity: where, which step, the layout, a save id unique to this
 * engine's save, and its own copy of the declarations. */
static int job_begin(tsr_engine *e, const char *dir, uint64_t step, const tsr_state *st, tsr_error *err) {
    engine_job_clear(&e->job);
    save_job *j = &e->job;
    snprintf(j->dir, sizeof j->dir, "%s", dir);
    j->step = step;
    j->layout = st->layout;
    if (!j->layout.pp) j->layout = (tsr_layout){1, 1, 1, 1, 0, 0};
    uint64_t ids[3] = {tsr_hash(e->engine_id, 16), step, e->n_saves};
    uint64_t h1 = tsr_hash(ids, sizeof ids), h2 = tsr_hash(&h1, sizeof h1);
    memcpy(j->save_id, &h1, 8);
    memcpy(j->save_id + 8, &h2, 8);
    return copy_decls(j, st, err);
}

/* Rank -1 blobs are rank 0's to write. */
static int blob_is_mine(const tsr_engine *e, const tsr_state_blob *b) { return b->rank != -1 || e->rank == 0; }

/* The arena bytes of this rank's boxes then blobs (each aligned); room in the
 * job for their records. */
static int stage_size(tsr_engine *e, const tsr_state *st, size_t *need, tsr_error *err) {
    save_job *j = &e->job;
    size_t nb = 0;
    *need = 0;
    for (size_t i = 0; i < e->n_mine; i++) {
        const tsr_state_box *b = &st->boxes[e->mine[i]];
        int rc = tsr_mem_usable(b->mem, err);
        if (rc) return rc;
        *need += tsr_align_up(tsr_box_volume(&b->box) * tsr_dtype_size(st->tensors[b->tensor].dtype), TSR_ALIGN);
    }
    for (size_t i = 0; i < st->n_blobs; i++) {
        if (!blob_is_mine(e, &st->blobs[i])) continue;
        if (strlen(st->blobs[i].name) > TSR_MAX_NAME)
            return tsr_err(err, TSR_EINVAL, "blob name too long: %.64s", st->blobs[i].name);
        *need += tsr_align_up(st->blobs[i].size, 64);
        nb++;
    }
    j->boxes = malloc((e->n_mine + 1) * sizeof *j->boxes);
    j->blobs = malloc((nb + 1) * sizeof *j->blobs);
    if (!j->boxes || !j->blobs) return tsr_err(err, TSR_ENOMEM, "out of memory");
    return 0;
}

/* The copy of this rank's boxes to the start of the arena, planned (*off: where
 * they end) into sc. */
static int plan_copy(tsr_engine *e, const tsr_state *st, stage_copy *sc, size_t *off, tsr_error *err) {
    save_job *j = &e->job;
    if (!e->enc && !(e->enc = tsr_encoder_new(e->opts.write.threads, err))) return err ? err->code : TSR_ENOMEM;
    *off = 0;
    sc->box_end = calloc(e->n_mine + 1, sizeof *sc->box_end);
    sc->box_left = calloc(e->n_mine + 1, sizeof *sc->box_left);
    if (!sc->box_end || !sc->box_left) return tsr_err(err, TSR_ENOMEM, "out of memory");
    sc->boxes = j->boxes;
    for (size_t i = 0; i < e->n_mine; i++) {
        const tsr_state_box *b = &st->boxes[e->mine[i]];
        int dtype = st->tensors[b->tensor].dtype;
        size_t bytes = tsr_box_volume(&b->box) * tsr_dtype_size(dtype);
        /* statistics in the copy where the save takes them and the box has them */
        int stats = b->mem == TSR_MEM_HOST && !e->opts.write.no_digests && tsr_stats_dtype(dtype);
        j->boxes[j->n_boxes] = (staged){b->tensor, b->box, *off, {0, 0, 0, 0}, stats};
        tsr_stats_init(&j->boxes[j->n_boxes].stats);
        for (size_t o = 0; o < bytes; o += STAGE_PIECE) {
            if (tsr_grow((void **)&sc->pieces, &sc->cap, sc->n, sizeof *sc->pieces))
                return tsr_err(err, TSR_ENOMEM, "out of memory");
            size_t len = bytes - o < STAGE_PIECE ? bytes - o : STAGE_PIECE;
            /* the job's copy of the name: it outlives the caller's state */
            sc->pieces[sc->n++] = (stage_piece){e->arena + *off + o, (const uint8_t *)b->data + o, len, b->mem,
                                                j->tensors[b->tensor].name, j->n_boxes, stats ? dtype : -1};
            sc->box_left[j->n_boxes]++;
        }
        sc->box_end[j->n_boxes++] = sc->n;
        *off += tsr_align_up(bytes, TSR_ALIGN);
    }
    sc->left = sc->n;
    return 0;
}

static void copy_free(stage_copy *sc) {
    if (!sc) return;
    pthread_mutex_destroy(&sc->mu);
    pthread_cond_destroy(&sc->cv);
    free(sc->pieces);
    free(sc->box_end);
    free(sc->box_left);
    free(sc);
}

/* Runs a planned copy over the encoder's threads, in the save call. */
static int run_copy(tsr_engine *e, stage_copy *sc, tsr_error *err) {
    tsr_pool_for(tsr_encoder_pool(e->enc), sc->n, stage_one, sc);
    if (sc->rc && err) *err = sc->err;
    return sc->rc;
}

static void deferred_free(save_job *j) {
    copy_free(j->deferred);
    j->deferred = NULL;
}

/* In the background, first: the copy that overlap_staging deferred starts on
 * the pool's workers. */
static void deferred_start(tsr_engine *e) {
    stage_copy *sc = e->job.deferred;
    if (!sc) return;
    sc->e = e;
    if (sc->n) tsr_pool_start(tsr_encoder_pool(e->enc), sc->n, stage_one, sc);
    else staging_done(e);
}

/* Box b of the job staged: its pieces not taken by a worker are copied here,
 * then the others waited for. @return the copy's first failure. */
static int deferred_box(tsr_engine *e, size_t b, tsr_error *err) {
    stage_copy *sc = e->job.deferred;
    if (!sc) return 0;
    if (sc->box_end[b]) tsr_pool_help(tsr_encoder_pool(e->enc), sc->box_end[b] - 1, SIZE_MAX);
    pthread_mutex_lock(&sc->mu);
    while (sc->box_left[b] && !sc->rc) pthread_cond_wait(&sc->cv, &sc->mu);
    int rc = sc->rc;
    if (rc && err) *err = sc->err;
    pthread_mutex_unlock(&sc->mu);
    return rc;
}

/* The writer's idle work (tsr_save_set_idle): one piece of the deferred copy
 * that no thread has taken yet. */
static int copy_idle(void *ctx, int run) {
    tsr_pool *p = tsr_encoder_pool(((tsr_engine *)ctx)->enc);
    return run ? tsr_pool_help(p, SIZE_MAX, 1) > 0 : tsr_pool_unclaimed(p) > 0;
}

/* The deferred copy run to its end (the caller may then change its state:
 * tsr_engine_staged returns) and freed. @return its first failure. */
static int deferred_finish(tsr_engine *e, tsr_error *err) {
    stage_copy *sc = e->job.deferred;
    if (!sc) return 0;
    if (sc->n) tsr_pool_finish(tsr_encoder_pool(e->enc));
    int rc = sc->rc;
    if (rc && err) *err = sc->err;
    deferred_free(&e->job);
    return rc;
}

/* Copies this rank's boxes to the start of the arena (*off: where they end),
 * or with overlap_staging plans the copy for the background. */
static int stage_boxes(tsr_engine *e, const tsr_state *st, size_t *off, tsr_error *err) {
    stage_copy *sc = calloc(1, sizeof *sc);
    if (!sc) return tsr_err(err, TSR_ENOMEM, "out of memory");
    pthread_mutex_init(&sc->mu, NULL);
    pthread_cond_init(&sc->cv, NULL);
    int rc = plan_copy(e, st, sc, off, err);
    if (!rc && e->opts.overlap_staging && !e->opts.sync) {
        e->job.deferred = sc;
        return 0;
    }
    if (!rc) rc = run_copy(e, sc, err);
    copy_free(sc);
    return rc;
}

/* Copies this rank's blobs after the boxes, from off. @return where they end. */
static size_t stage_blobs(tsr_engine *e, const tsr_state *st, size_t off) {
    save_job *j = &e->job;
    for (size_t i = 0; i < st->n_blobs; i++) {
        const tsr_state_blob *b = &st->blobs[i];
        if (!blob_is_mine(e, b)) continue;
        staged_blob *sb = &j->blobs[j->n_blobs++];
        snprintf(sb->name, sizeof sb->name, "%s", b->name);
        sb->rank = b->rank;
        sb->off = off;
        sb->size = b->size;
        if (b->size) memcpy(e->arena + off, b->data, b->size);
        off += tsr_align_up(b->size, 64);
    }
    return off;
}

/* Boxes in device memory are staged into an arena pinned for that device's
 * copies (the link's full speed, and copies that run beside the step's
 * kernels): pinned once, when the first such state comes (tsr_engine_prepare's
 * or the first save's), and kept while the arena is. A failed pinning is
 * logged once; the copies are then slower. */
void engine_arena_pin(tsr_engine *e, const tsr_state *st) {
    for (size_t i = 0; e->arena && i < e->n_mine; i++) {
        tsr_mem_kind k = st->boxes[e->mine[i]].mem;
        if (k == TSR_MEM_HOST || k == e->arena_for) continue;
        double t0 = tsr_now();
        if (e->arena_pinned) tsr_mem_unpin(e->arena, e->arena_for);
        tsr_error pe = {0};
        e->arena_for = k;
        e->arena_pinned = tsr_mem_pin(e->arena, e->arena_cap, k, &pe) == 0;
        e->pin_seconds += tsr_now() - t0;
        if (!e->arena_pinned) tsr_log(1, "the staging arena (%zu bytes) is not pinned: %s", e->arena_cap, pe.msg);
        return;
    }
}

int engine_stage(tsr_engine *e, const char *dir, uint64_t step, const tsr_state *st, tsr_error *err) {
    size_t need = 0, off = 0;
    int rc = job_begin(e, dir, step, st, err);
    if (!rc) rc = stage_size(e, st, &need, err);
    if (!rc) rc = engine_arena_reserve(e, need, err);
    if (!rc) engine_arena_pin(e, st);
    if (!rc) rc = stage_boxes(e, st, &off, err);
    if (!rc) e->job.staged_bytes = stage_blobs(e, st, off);
    return rc;
}
