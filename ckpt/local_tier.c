/* local_tier.c: snapshots in node memory, partner copies over the comm, and
 * the assembly of the newest complete step from the pieces that survive
 * (local_tier.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "fence.h"
#include "local_tier.h"
#include "manifest.h"

#define TAG_SIZE 7101
#define TAG_DATA 7102
#define TAG_ROOM 7109

int tsr_local_root(const char *folder, const char *dump_folder, char *out, size_t len, tsr_error *err) {
    int n;
    if (folder && folder[0]) {
        n = snprintf(out, len, "%s", folder);
    } else {
        char cwd[PATH_MAX] = "", abs[2 * PATH_MAX];
        const char *d = dump_folder;
        if (d[0] != '/' && !getcwd(cwd, sizeof cwd)) cwd[0] = 0;
        snprintf(abs, sizeof abs, "%s%s%s", cwd, cwd[0] ? "/" : "", d);
        uint64_t h = tsr_hash(abs, strlen(abs));
        n = snprintf(out, len, "/dev/shm/tessera-%016llx", (unsigned long long)h);
    }
    return n < 0 || (size_t)n >= len ? tsr_err(err, TSR_EINVAL, "checkpoint.local_folder: path too long") : 0;
}

int tsr_local_node_dir(const char *root, int node, char *out, size_t len, tsr_error *err) {
    int n = snprintf(out, len, "%s/node-%d", root, node);
    return n < 0 || (size_t)n >= len ? tsr_err(err, TSR_EINVAL, "%s: path too long", root) : 0;
}

/* ----------------------------------------------------------------- saving */

/* Failures of one kind (snapshots, partner copies) as they are said: the first
 * one, then every REPEAT_EVERY-th of a run in a row, then the step that works
 * again; a full node memory fails at every step and should not fill the log. */
#define REPEAT_EVERY 100
typedef struct failures {
    const char *what; /* "snapshot", "partner copy" */
    uint64_t n, since; /* failures in a row, from step `since` */
} failures;

static void failed(failures *f, int rank, uint64_t step, const char *msg) {
    if (f->n++ == 0) f->since = step;
    if (f->n == 1)
        fprintf(stderr, "tessera: rank %d: local tier: the %s of step %llu failed: %s\n", rank, f->what,
                (unsigned long long)step, msg);
    else if (f->n % REPEAT_EVERY == 0)
        fprintf(stderr, "tessera: rank %d: local tier: %llu failures of the %s in a row since step %llu; the last: %s\n",
                rank, (unsigned long long)f->n, f->what, (unsigned long long)f->since, msg);
}

static void worked(failures *f, int rank, uint64_t step) {
    if (f->n)
        fprintf(stderr, "tessera: rank %d: local tier: the %s of step %llu worked, after %llu failures since step %llu\n",
                rank, f->what, (unsigned long long)step, (unsigned long long)f->n, (unsigned long long)f->since);
    f->n = 0;
}

struct tsr_local_tier {
    char root[PATH_MAX], node_dir[PATH_MAX];
    tsr_engine *engine;
    tsr_comm *bg; /* the copy thread's duplicate of the world */
    tsr_comm *world_comm; /* the job's, for the recovery at a start (tsr_local_recover) */
    int rank, world, n_nodes, per_node, node_idx, first_of_node;
    uint64_t epoch; /* the launch's (tsr_local_opts.epoch) */
    int ids[TSR_LOCAL_MAX_NODES];
    pthread_t thread;
    int have_thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int pending, quit; /* a step to copy is waiting; the thread is to end */
    uint64_t step;
    int have_staged; /* a snapshot saved, whose copies are not handed over yet */
    uint64_t staged;
    failures snapshots, copies; /* the training thread's, the copy thread's */
};

/* checkpoint.local_nodes into ids and *n (one node, 0, when empty). */
static int parse_nodes(const char *s, int world, int *ids, int *n, tsr_error *err) {
    *n = 0;
    if (!s[0]) {
        ids[(*n)++] = 0;
        return 0;
    }
    for (const char *p = s; *p;) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > 1000000 || (*end && *end != ',') || *n >= TSR_LOCAL_MAX_NODES)
            return tsr_err(err, TSR_EINVAL, "checkpoint.local_nodes = \"%s\": not a list of node ids", s);
        ids[(*n)++] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (world % *n)
        return tsr_err(err, TSR_EINVAL, "checkpoint.local_nodes = \"%s\": %d nodes do not divide %d ranks", s, *n, world);
    return 0;
}

/* The file `path` whole, into *buf (malloc'ed) and *size. @return 0 or errno. */
static int slurp(const char *path, uint8_t **buf, uint64_t *size) {
    uint64_t n = 0;
    int fd = tsr_open_regular(path, &n, NULL);
    if (fd < 0) return ENOENT;
    uint8_t *b = malloc(n ? n : 1);
    int e = !b ? ENOMEM : tsr_pread_all(fd, path, b, n, 0, NULL) ? EIO : 0;
    close(fd);
    if (e) {
        free(b);
        return e;
    }
    *buf = b, *size = n;
    return 0;
}

/* Writes dir/name atomically (a temporary name, then rename). @return 0 or errno. */
static int put_file(const char *dir, const char *name, const void *buf, uint64_t size) {
    char tmp[PATH_MAX + 64], path[PATH_MAX + 64];
    int e = tsr_mkdir_p(dir);
    if (e) return e;
    snprintf(tmp, sizeof tmp, "%s/.%s.tmp-%d", dir, name, (int)getpid());
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return errno;
    size_t done = 0;
    while (done < size) {
        ssize_t k = write(fd, (const uint8_t *)buf + done, size - done);
        if (k <= 0) break;
        done += (size_t)k;
    }
    e = done < size ? (errno ? errno : EIO) : 0;
    close(fd);
    if (!e && rename(tmp, path)) e = errno;
    if (e) unlink(tmp);
    return e;
}

/* Removes the step directories of dir but the newest `keep` committed ones
 * (and the newest clean one, when those are poisoned: tsr_retention_keep) and
 * any newer than the oldest kept, keeping their data files in dir/spare for the
 * next snapshots to write over. */
static void prune(const char *dir, size_t keep) {
    tsr_step_info *v = NULL;
    size_t n = 0, seen = 0;
    if (tsr_list_steps(dir, &v, &n)) return;
    int *kept = malloc((n + 1) * sizeof *kept);
    if (!kept) {
        free(v);
        return;
    }
    tsr_retention_keep(v, n, (uint32_t)keep, kept);
    uint64_t floor = 0;
    for (size_t i = n; i-- > 0;)
        if (kept[i]) floor = v[i].step, seen++;
    for (size_t i = 0; seen >= keep && i < n; i++)
        if (v[i].step < floor || (v[i].committed && !kept[i])) {
            char p[PATH_MAX + 80];
            char spare[PATH_MAX + 16];
            snprintf(p, sizeof p, "%s/%s", dir, v[i].name);
            snprintf(spare, sizeof spare, "%s/spare", dir);
            if (tsr_retire_step_dir(p, spare, NULL)) tsr_remove_tree(p);
        }
    free(kept);
    free(v);
}

/* The MANIFEST of `step`, from rank 0 to every rank. */
static int share_manifest(tsr_local_tier *lt, const char *step_name, uint8_t **mf, uint64_t *mf_len,
                          tsr_error *err) {
    char dir[PATH_MAX + 80];
    snprintf(dir, sizeof dir, "%s/%s", lt->node_dir, step_name);
    size_t len = 0;
    int rc = lt->rank == 0 ? tsr_ckpt_read_manifest(dir, mf, &len, err) : 0;
    uint64_t n = rc ? 0 : len;
    int rc2 = tsr_comm_bcast(lt->bg, 0, &n, sizeof n, rc ? NULL : err);
    if (rc || rc2) return rc ? rc : rc2;
    if (!n) return tsr_err(err, TSR_EIO, "%s: rank 0 could not read the MANIFEST", dir);
    if (lt->rank != 0 && !(*mf = malloc(n))) return tsr_err(err, TSR_ENOMEM, "out of memory");
    *mf_len = n;
    return tsr_comm_bcast(lt->bg, 0, *mf, n, err);
}

/* A file's bytes mapped: whole (read) or made `size` bytes long (write). */
typedef struct mapped {
    int fd;
    uint8_t *p;
    uint64_t size;
} mapped;

/* Maps `path` to read. @return 0 or errno. */
static int map_read(const char *path, mapped *m) {
    m->p = NULL;
    m->fd = tsr_open_regular(path, &m->size, NULL);
    if (m->fd < 0) return ENOENT;
    if (m->size && (m->p = mmap(NULL, m->size, PROT_READ, MAP_SHARED | MAP_POPULATE, m->fd, 0)) == MAP_FAILED) {
        int e = errno;
        close(m->fd);
        m->fd = -1;
        return e;
    }
    return 0;
}

/* Makes `path` a file of `size` bytes mapped to write: the spare file of the
 * same name in `spare` when there is one (its pages reused), else a new one. */
static int map_write(const char *path, const char *spare, uint64_t size, mapped *m) {
    m->p = NULL;
    m->size = size;
    if (spare) rename(spare, path); /* no spare: a new file */
    m->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (m->fd < 0) return errno;
    /* the pages are reserved before they are mapped: a tmpfs without room for
     * them fails here (ENOSPC), not with SIGBUS at the first store */
    int e = ftruncate(m->fd, (off_t)size) != 0 ? errno : size ? posix_fallocate(m->fd, 0, (off_t)size) : 0;
    if (e || (size && (m->p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, m->fd, 0)) == MAP_FAILED)) {
        if (!e) e = errno;
        close(m->fd);
        m->fd = -1;
        unlink(path);
        return e;
    }
    return 0;
}

static void unmap(mapped *m) {
    if (m->p && m->p != MAP_FAILED) munmap(m->p, m->size);
    if (m->fd >= 0) close(m->fd);
    m->p = NULL, m->fd = -1;
}

/* This rank's data file of the step to its partner (the same place on the
 * next node); the previous node's to this rank, into this node's partner
 * folder. Sent from and received into the files' pages (mapped): the only copy
 * is the transfer's own. */
static int swap_with_partner(tsr_local_tier *lt, const char *step_name, const uint8_t *mf, uint64_t mf_len,
                             tsr_error *err) {
    uint32_t to = (uint32_t)((lt->rank + lt->per_node) % lt->world);
    uint32_t from = (uint32_t)((lt->rank - lt->per_node + lt->world) % lt->world);
    char fname[64], path[PATH_MAX + 200], pdir[PATH_MAX + 100], tmp[PATH_MAX + 200], spare[PATH_MAX + 200];
    tsr_data_file_name((uint32_t)lt->rank, fname, sizeof fname);
    snprintf(path, sizeof path, "%s/%s/%s", lt->node_dir, step_name, fname);
    mapped mine = {-1, NULL, 0}, theirs = {-1, NULL, 0};
    uint64_t my_size = UINT64_MAX, their_size = 0; /* UINT64_MAX: none written, nothing to copy */
    if (!map_read(path, &mine)) my_size = mine.size;
    snprintf(pdir, sizeof pdir, "%s/partner/%s", lt->node_dir, step_name);
    tsr_data_file_name(from, fname, sizeof fname);
    snprintf(tmp, sizeof tmp, "%s/.%s.tmp", pdir, fname);
    snprintf(spare, sizeof spare, "%s/partner/spare/%s", lt->node_dir, fname);
    tsr_comm_reqs *r = tsr_comm_reqs_new();
    if (!r) return tsr_err(err, TSR_ENOMEM, "out of memory");
    int rc = tsr_comm_isend(lt->bg, to, TAG_SIZE, &my_size, sizeof my_size, r, err), e = 0;
    if (!rc) rc = tsr_comm_irecv(lt->bg, from, TAG_SIZE, &their_size, sizeof their_size, r, err);
    if (!rc) rc = tsr_comm_waitall(lt->bg, r, err);
    int room = 1, their_room = 1; /* the copy's space is there: the receiver tells the sender */
    /* a fenced writer makes no copy (its partner learns there is no room) */
    if (!rc && their_size != UINT64_MAX && tsr_fence_admit(pdir, &(uint64_t){lt->epoch}, 0, err)) room = 0;
    else if (!rc && their_size != UINT64_MAX &&
             ((e = tsr_mkdir_p(pdir)) || (e = map_write(tmp, spare, their_size, &theirs)))) {
        tsr_err(err, TSR_EIO, "%s: cannot make the partner copy of rank %u: %s", tmp, from, strerror(e));
        room = 0;
    }
    if (!rc) rc = tsr_comm_isend(lt->bg, from, TAG_ROOM, &room, sizeof room, r, err);
    if (!rc) rc = tsr_comm_irecv(lt->bg, to, TAG_ROOM, &their_room, sizeof their_room, r, err);
    if (!rc) rc = tsr_comm_waitall(lt->bg, r, err);
    if (!rc && !room) rc = TSR_EIO; /* the message above */
    if (!rc && !their_room)
        rc = tsr_err(err, TSR_EIO, "rank %u has no room for the partner copy of this rank's file", to);
    if (!rc && my_size != UINT64_MAX) rc = tsr_comm_isend(lt->bg, to, TAG_DATA, mine.p, my_size, r, err);
    if (!rc && theirs.fd >= 0) rc = tsr_comm_irecv(lt->bg, from, TAG_DATA, theirs.p, their_size, r, err);
    if (!rc) rc = tsr_comm_waitall(lt->bg, r, err);
    tsr_comm_reqs_free(r);
    int had = theirs.fd >= 0;
    unmap(&mine);
    unmap(&theirs);
    snprintf(path, sizeof path, "%s/%s", pdir, fname);
    if (had && !rc && rename(tmp, path) != 0)
        rc = tsr_err(err, TSR_EIO, "%s: cannot write the partner copy of rank %u: %s", path, from, strerror(errno));
    if (had && rc) unlink(tmp);
    if (!rc && lt->first_of_node) rc = tsr_fence_admit(pdir, &(uint64_t){lt->epoch}, 1, err);
    if (!rc && lt->first_of_node && (e = put_file(pdir, "MANIFEST", mf, mf_len)))
        rc = tsr_err(err, TSR_EIO, "%s/MANIFEST: cannot write: %s", pdir, strerror(e));
    return rc;
}

/* The background work after the snapshot of `step` committed. */
static int copy_step(tsr_local_tier *lt, uint64_t step, tsr_error *err) {
    char name[32], dir[PATH_MAX + 40], pdir[PATH_MAX + 16];
    tsr_step_dir_name(step, name, sizeof name);
    uint8_t *mf = NULL;
    uint64_t mf_len = 0;
    int rc = share_manifest(lt, name, &mf, &mf_len, err);
    snprintf(dir, sizeof dir, "%s/%s", lt->node_dir, name);
    int e = 0, rc_put = 0;
    if (!rc && lt->first_of_node && !tsr_ckpt_is_committed(dir) &&
        !(rc_put = tsr_fence_admit(dir, &(uint64_t){lt->epoch}, 1, err)) && (e = put_file(dir, "MANIFEST", mf, mf_len)))
        rc_put = tsr_err(err, TSR_EIO, "%s/MANIFEST: cannot write: %s", dir, strerror(e));
    /* every rank exchanges with its partner whatever failed here (a full node
     * memory): one that skipped it would leave its partner waiting for ever */
    if (!rc) rc = swap_with_partner(lt, name, mf, mf_len, err); /* its error, if any, says more */
    if (!rc) rc = rc_put;
    free(mf);
    int rc2 = tsr_comm_barrier(lt->bg, rc ? NULL : err); /* every copy of the step is written */
    if (!rc) rc = rc2;
    if (lt->first_of_node) {
        snprintf(pdir, sizeof pdir, "%s/partner", lt->node_dir);
        if (lt->node_idx != 0) prune(lt->node_dir, TSR_LOCAL_KEEP); /* rank 0's engine keeps its own */
        prune(pdir, TSR_LOCAL_KEEP);
    }
    return rc;
}

static void *copy_thread(void *arg) {
    tsr_local_tier *lt = arg;
    pthread_mutex_lock(&lt->mu);
    for (;;) {
        while (!lt->pending && !lt->quit) pthread_cond_wait(&lt->cv, &lt->mu);
        if (!lt->pending) break;
        uint64_t step = lt->step;
        pthread_mutex_unlock(&lt->mu);
        tsr_error e = {0};
        if (copy_step(lt, step, &e)) failed(&lt->copies, lt->rank, step, e.msg);
        else worked(&lt->copies, lt->rank, step);
        pthread_mutex_lock(&lt->mu);
        lt->pending = 0;
        pthread_cond_broadcast(&lt->cv);
    }
    pthread_mutex_unlock(&lt->mu);
    return NULL;
}

/* Blocks until the copy thread has nothing in hand. */
static void wait_idle(tsr_local_tier *lt) {
    if (!lt->have_thread) return;
    pthread_mutex_lock(&lt->mu);
    while (lt->pending) pthread_cond_wait(&lt->cv, &lt->mu);
    pthread_mutex_unlock(&lt->mu);
}

static int start_thread(tsr_local_tier *lt, tsr_comm *world, tsr_error *err) {
    lt->bg = tsr_comm_dup(world, err);
    if (!lt->bg) return err ? err->code : TSR_EIO;
    pthread_mutex_init(&lt->mu, NULL);
    pthread_cond_init(&lt->cv, NULL);
    if (pthread_create(&lt->thread, NULL, copy_thread, lt))
        return tsr_err(err, TSR_EIO, "local tier: cannot start the copy thread");
    lt->have_thread = 1;
    return 0;
}

/* The node's fences (its own folder's and its partner folder's) raised to the
 * launch's epoch. A failure fails nothing here, where the ranks have not
 * agreed yet: it is said, and a fenced launch's writes are refused anyway. */
static void raise_fences(tsr_local_tier *lt) {
    char pdir[PATH_MAX + 16];
    snprintf(pdir, sizeof pdir, "%s/partner", lt->node_dir);
    const char *dirs[2] = {lt->node_dir, pdir};
    for (int i = 0; i < 2; i++) {
        tsr_error e = {0};
        if (tsr_fence_raise(dirs[i], lt->epoch, &e))
            fprintf(stderr, "tessera: rank %d: local tier: %s\n", lt->rank, e.msg);
    }
}

int tsr_local_open(const tsr_local_opts *o, tsr_comm *world, tsr_local_tier **out, tsr_error *err) {
    *out = NULL;
    tsr_local_tier *lt = calloc(1, sizeof *lt);
    if (!lt) return tsr_err(err, TSR_ENOMEM, "out of memory");
    lt->rank = (int)tsr_comm_rank(world);
    lt->world = (int)tsr_comm_size(world);
    lt->world_comm = world;
    int rc = parse_nodes(o->nodes ? o->nodes : "", lt->world, lt->ids, &lt->n_nodes, err);
    if (!rc) {
        lt->per_node = lt->world / lt->n_nodes;
        lt->node_idx = lt->rank / lt->per_node;
        lt->first_of_node = lt->rank % lt->per_node == 0;
        rc = tsr_local_root(o->folder, o->dump_folder, lt->root, sizeof lt->root, err);
    }
    if (!rc) rc = tsr_local_node_dir(lt->root, lt->ids[lt->node_idx], lt->node_dir, sizeof lt->node_dir, err);
    int e = rc ? 0 : tsr_mkdir_p(lt->node_dir);
    if (e) rc = tsr_err(err, TSR_EIO, "%s: cannot create: %s", lt->node_dir, strerror(e));
    lt->epoch = o->epoch;
    if (!rc && lt->epoch && lt->first_of_node) raise_fences(lt);
    tsr_engine_opts eo = tsr_engine_opts_default();
    eo.write.codec = TSR_CODEC_RAW; /* memory is cheap to write and read; compression is not */
    eo.keep_latest = TSR_LOCAL_KEEP;
    eo.recycle = 1; /* each snapshot writes over the pages of one retired */
    eo.sync = 0; /* the save returns once staged; the next one hands its copies over */
    eo.overlap_staging = 1; /* the copy overlaps the next step (tsr_local_staged) */
    eo.commit_timeout_s = o->commit_timeout_s;
    eo.quiet = 1; /* its failures are said here, once for a run of them */
    eo.write.epoch = o->epoch; /* the snapshots are fenced by the node folder's FENCE */
    lt->snapshots.what = "snapshot", lt->copies.what = "partner copy";
    if (!rc && !(lt->engine = tsr_engine_new(lt->node_dir, world, &eo, err))) rc = err ? err->code : TSR_EIO;
    if (!rc && lt->n_nodes > 1) rc = start_thread(lt, world, err);
    if (rc) {
        tsr_err_prefix(err, "local tier");
        tsr_local_free(lt);
        return rc;
    }
    *out = lt;
    return 0;
}

/* The snapshot saved last: waits for its commit (the engine's verdict, the
 * same on every rank) and hands its copies to the thread once the copies of
 * the one before are done. Every rank calls it at the same point. */
static void hand_over(tsr_local_tier *lt) {
    if (!lt->have_staged) return;
    lt->have_staged = 0;
    tsr_error e = {0};
    if (tsr_engine_wait(lt->engine, &e)) {
        failed(&lt->snapshots, lt->rank, lt->staged, e.msg);
        return;
    }
    worked(&lt->snapshots, lt->rank, lt->staged);
    if (!lt->have_thread) return;
    wait_idle(lt);
    pthread_mutex_lock(&lt->mu);
    lt->step = lt->staged;
    lt->pending = 1;
    pthread_cond_broadcast(&lt->cv);
    pthread_mutex_unlock(&lt->mu);
}

int tsr_local_save(tsr_local_tier *lt, uint64_t step, const tsr_state *st, tsr_error *err) {
    /* the previous snapshot's copies start before this save's retention may
     * remove the one before it, whose copies are then done */
    hand_over(lt);
    int rc = tsr_engine_save(lt->engine, step, st, err);
    if (rc) {
        tsr_err_prefix(err, "local tier: step %llu", (unsigned long long)step);
        return rc;
    }
    lt->staged = step;
    lt->have_staged = 1;
    return 0;
}

void tsr_local_staged(tsr_local_tier *lt) {
    if (lt) tsr_engine_staged(lt->engine);
}

void tsr_local_poll(tsr_local_tier *lt) {
    if (!lt || !lt->have_staged || !lt->have_thread) return;
    int done = 0, idle;
    tsr_engine_poll(lt->engine, &done, NULL);
    pthread_mutex_lock(&lt->mu);
    idle = !lt->pending;
    pthread_mutex_unlock(&lt->mu);
    if (done && idle) hand_over(lt); /* returns at once: nothing to wait for */
}

void tsr_local_flush(tsr_local_tier *lt) {
    if (lt) hand_over(lt);
}

void tsr_local_free(tsr_local_tier *lt) {
    if (!lt) return;
    if (lt->have_thread) {
        pthread_mutex_lock(&lt->mu);
        lt->quit = 1;
        pthread_cond_broadcast(&lt->cv);
        pthread_mutex_unlock(&lt->mu);
        pthread_join(lt->thread, NULL);
        pthread_mutex_destroy(&lt->mu);
        pthread_cond_destroy(&lt->cv);
    }
    if (lt->bg) tsr_comm_free(lt->bg);
    if (lt->engine) tsr_engine_free(lt->engine);
    free(lt);
}

/* --------------------------------------------------------------- recovery */

/* A node's report, from its first rank, of the steps it holds: records of
 *   u64 step | u32 files | files x (u32 id | u64 size | u8 held)
 * for each committed step (own snapshot or partner copy) between min_step and
 * max_step: the data files its MANIFEST names, each held by the node at that
 * size (own or partner copy) or not. */
static void put32(tsr_sbuf *b, uint32_t v) {
    uint8_t x[4];
    tsr_st32(x, v);
    tsr_sb_put(b, x, 4);
}

static void put64(tsr_sbuf *b, uint64_t v) {
    uint8_t x[8];
    tsr_st64(x, v);
    tsr_sb_put(b, x, 8);
}

/* Where this node holds file `name` of step `sname` at `size` bytes: its own
 * snapshot, else its partner copy, into path. @return 1 if held. A copy of
 * another size is refused, named in out. */
static int held_at(const tsr_local_tier *lt, const char *sname, const char *name, uint64_t size, char *path,
                   size_t len, FILE *out) {
    for (int k = 0; k < 2; k++) {
        struct stat st;
        snprintf(path, len, "%s%s/%s/%s", lt->node_dir, k ? "/partner" : "", sname, name);
        if (stat(path, &st)) continue;
        if ((uint64_t)st.st_size == size) return 1;
        fprintf(out, "local tier: %s is %lld bytes, the MANIFEST names %llu: refused\n", path, (long long)st.st_size,
                (unsigned long long)size);
    }
    return 0;
}

/* The committed steps of this node (own and partner) that are not poisoned,
 * newest first, unique: those a recovery may choose. */
static size_t node_steps(const tsr_local_tier *lt, uint64_t *v, size_t cap) {
    size_t n = 0;
    for (int k = 0; k < 2; k++) {
        char dir[PATH_MAX + 16];
        tsr_step_info *st = NULL;
        size_t m = 0;
        snprintf(dir, sizeof dir, "%s%s", lt->node_dir, k ? "/partner" : "");
        if (tsr_list_steps(dir, &st, &m)) continue;
        for (size_t j = 0; j < m; j++) {
            int dup = 0;
            for (size_t q = 0; q < n && !dup; q++) dup = v[q] == st[j].step;
            if (st[j].committed && !st[j].poisoned && !dup && n < cap) v[n++] = st[j].step; /* never a poisoned one */
        }
        free(st);
    }
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0 && v[j] > v[j - 1]; j--) {
            uint64_t t = v[j];
            v[j] = v[j - 1], v[j - 1] = t;
        }
    return n;
}

/* The open MANIFEST of step sname in this node (own, else partner). */
static tsr_ckpt *node_manifest(const tsr_local_tier *lt, const char *sname, char *dir, size_t len, FILE *out) {
    for (int k = 0; k < 2; k++) {
        snprintf(dir, len, "%s%s/%s", lt->node_dir, k ? "/partner" : "", sname);
        if (!tsr_ckpt_is_committed(dir)) continue;
        tsr_error e = {0};
        tsr_ckpt *ck = tsr_ckpt_open(dir, &e);
        if (ck) return ck;
        fprintf(out, "local tier: %s/MANIFEST refused: %s\n", dir, e.msg);
    }
    return NULL;
}

#define MAX_STEPS 64 /* a node holds 2 snapshots and 2 partner copies, and leftovers */

static int node_report(const tsr_local_tier *lt, int64_t min_step, int64_t max_step, FILE *out, tsr_sbuf *b) {
    uint64_t steps[MAX_STEPS];
    size_t n = node_steps(lt, steps, MAX_STEPS);
    int rc = 0;
    for (size_t i = 0; !rc && i < n; i++) {
        if ((min_step >= 0 && steps[i] < (uint64_t)min_step) || (max_step >= 0 && steps[i] > (uint64_t)max_step))
            continue;
        char sname[32], dir[PATH_MAX + 48], path[PATH_MAX + 160];
        tsr_step_dir_name(steps[i], sname, sizeof sname);
        tsr_ckpt *ck = node_manifest(lt, sname, dir, sizeof dir, out);
        if (!ck) continue;
        size_t nf = tsr_ckpt_n_files(ck);
        put64(b, steps[i]);
        put32(b, (uint32_t)nf);
        for (size_t f = 0; f < nf; f++) {
            tsr_file_info fi;
            char name[64];
            tsr_ckpt_file(ck, f, &fi);
            tsr_data_file_name(fi.file_id, name, sizeof name);
            uint8_t have = (uint8_t)held_at(lt, sname, name, fi.size, path, sizeof path, out);
            put32(b, fi.file_id);
            put64(b, fi.size);
            tsr_sb_put(b, &have, 1);
        }
        tsr_ckpt_close(ck);
        rc = b->oom ? TSR_ENOMEM : 0;
    }
    return rc;
}

/* One node's record of a step, parsed from its report. */
typedef struct record {
    const uint8_t *files; /* files x 13 bytes */
    uint32_t n_files;
} record;

/* The record of `step` in report r (len bytes). @return 1 if found. */
static int find_record(const uint8_t *r, size_t len, uint64_t step, record *out) {
    for (size_t o = 0; o + 12 <= len;) {
        uint64_t s = tsr_ld64(r + o);
        uint32_t nf = tsr_ld32(r + o + 8);
        if ((len - o - 12) / 13 < nf) return 0; /* damaged: nothing further */
        if (s == step) {
            *out = (record){r + o + 12, nf};
            return 1;
        }
        o += 12 + (size_t)nf * 13;
    }
    return 0;
}

/* The recovery plan: the step, its files, which node holds each at its size,
 * and the node that sends it to those that do not (-1: none). Every rank
 * computes the same from the same reports. */
typedef struct plan {
    uint64_t step;
    record files;   /* from the first node that reported the step */
    uint8_t *has;   /* has[k * files + f]: node k holds file f */
    int *holder;    /* node index of each file's holder: the first that has it */
    int manifest;   /* the node whose MANIFEST goes to the others */
} plan;

/* The newest step whose every file some node holds. @return 1 with *p, 0 none. */
static int choose(const tsr_local_tier *lt, const uint8_t *all, const size_t *counts, plan *p, FILE *out) {
    const uint8_t **rep = calloc((size_t)lt->n_nodes, sizeof *rep);
    size_t *len = calloc((size_t)lt->n_nodes, sizeof *len), off = 0;
    uint64_t best_tried = UINT64_MAX;
    int found = 0;
    for (int r = 0; rep && len && r < lt->world; off += counts[r], r++)
        if (r % lt->per_node == 0) rep[r / lt->per_node] = all + off, len[r / lt->per_node] = counts[r];
    for (;;) { /* the newest step below best_tried that any node reported */
        uint64_t step = 0;
        int any = 0;
        for (int k = 0; rep && len && k < lt->n_nodes; k++)
            for (size_t o = 0; o + 12 <= len[k]; o += 12 + (size_t)tsr_ld32(rep[k] + o + 8) * 13) {
                uint64_t s = tsr_ld64(rep[k] + o);
                if (s < best_tried && (!any || s > step)) step = s, any = 1;
            }
        if (!any) break;
        best_tried = step;
        int first = -1;
        for (int k = 0; k < lt->n_nodes && first < 0; k++)
            if (find_record(rep[k], len[k], step, &p->files)) first = k;
        uint32_t nf = p->files.n_files;
        free(p->holder);
        free(p->has);
        p->holder = malloc((nf + 1) * sizeof *p->holder);
        p->has = calloc((size_t)lt->n_nodes * nf + 1, 1);
        int complete = p->holder && p->has;
        for (int k = 0; complete && k < lt->n_nodes; k++) {
            record rk;
            if (!find_record(rep[k], len[k], step, &rk)) continue;
            for (uint32_t f = 0; f < nf; f++)
                for (uint32_t g = 0; g < rk.n_files; g++)
                    if (!memcmp(rk.files + 13 * g, p->files.files + 13 * f, 12) && rk.files[13 * g + 12])
                        p->has[(size_t)k * nf + f] = 1; /* the same id and size, held */
        }
        for (uint32_t f = 0; complete && f < nf; f++) {
            p->holder[f] = -1;
            for (int k = lt->n_nodes - 1; k >= 0; k--)
                if (p->has[(size_t)k * nf + f]) p->holder[f] = k;
            if (p->holder[f] < 0) {
                uint32_t id = tsr_ld32(p->files.files + 13 * f);
                char sname[32], name[64];
                tsr_step_dir_name(step, sname, sizeof sname);
                tsr_data_file_name(id, name, sizeof name);
                fprintf(out, "local tier: %s is not complete: a data file is in no surviving node\n", sname);
                fprintf(out, "local tier: %s: %s is missing\n", sname, name);
                complete = 0;
            }
        }
        if (complete) {
            p->step = step, p->manifest = first, found = 1;
            break;
        }
    }
    free(rep);
    free(len);
    return found;
}

/* Whether node k holds file f of the plan's step. */
static int node_has(const plan *p, int k, uint32_t f) { return p->has[(size_t)k * p->files.n_files + f]; }

/* The step's MANIFEST, from the first rank of node p->manifest to every rank. */
static int share_step_manifest(tsr_local_tier *lt, const plan *p, const char *sname, uint8_t **mf, uint64_t *n,
                               tsr_error *err) {
    uint32_t root = (uint32_t)(p->manifest * lt->per_node);
    size_t len = 0;
    char dir[PATH_MAX + 48];
    *mf = NULL;
    *n = 0;
    if ((uint32_t)lt->rank == root) {
        tsr_ckpt *ck = node_manifest(lt, sname, dir, sizeof dir, stderr);
        tsr_ckpt_close(ck);
        if (ck && !tsr_ckpt_read_manifest(dir, mf, &len, NULL)) *n = len;
    }
    int rc = tsr_comm_bcast(lt->world_comm, root, n, sizeof *n, err);
    if (!rc && !*n) rc = tsr_err(err, TSR_EIO, "local tier: %s: node %d could not read its MANIFEST", sname, p->manifest);
    if (!rc && !*mf && !(*mf = malloc(*n))) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    return rc ? rc : tsr_comm_bcast(lt->world_comm, root, *mf, *n, err);
}

/* The transfers of a recovery: for each file of the plan, the mapped file this
 * node sends (m[f]) or receives into (m[nf + f]). */
typedef struct moves {
    mapped *m;
    uint32_t nf;
} moves;

/* Maps what this node sends and receives, and links what it holds into dir.
 * Local work only: every rank then learns whether every node got this far. */
static int prepare_moves(tsr_local_tier *lt, const plan *p,
                         const char *sname, const char *dir, moves *mv, tsr_error *err) {
    int me = lt->node_idx, e = 0, rc = 0;
    char path[PATH_MAX + 160], to[PATH_MAX + 200];
    for (uint32_t f = 0; !rc && f < mv->nf; f++) {
        char name[64];
        uint64_t size = tsr_ld64(p->files.files + 13 * f + 4);
        tsr_data_file_name(tsr_ld32(p->files.files + 13 * f), name, sizeof name);
        int sends = 0;
        for (int k = 0; k < lt->n_nodes; k++) sends |= p->holder[f] == me && k != me && !node_has(p, k, f);
        if (node_has(p, me, f)) {
            snprintf(to, sizeof to, "%s/%s", dir, name);
            if (!held_at(lt, sname, name, size, path, sizeof path, stderr))
                rc = tsr_err(err, TSR_EIO, "local tier: %s/%s: gone from node %d", sname, name, me);
            else if (sends && (e = map_read(path, &mv->m[f])))
                rc = tsr_err(err, TSR_EIO, "%s: cannot map it to send: %s", path, strerror(e));
            else if (link(path, to) != 0) { /* copied where links fail */
                uint8_t *b = NULL;
                uint64_t n = 0;
                if ((e = slurp(path, &b, &n)) || (e = put_file(dir, name, b, n)))
                    rc = tsr_err(err, TSR_EIO, "%s: cannot copy it to %s: %s", path, dir, strerror(e));
                free(b);
            }
        } else { /* received from its holder */
            snprintf(to, sizeof to, "%s/.%s.tmp", dir, name);
            if ((e = map_write(to, NULL, size, &mv->m[mv->nf + f])))
                rc = tsr_err(err, TSR_EIO, "%s: cannot create: %s", to, strerror(e));
        }
    }
    return rc;
}

/* Posts every send and receive of the plan and waits for them (first ranks to
 * first ranks, from mapped files into mapped files). */
static int run_moves(tsr_local_tier *lt, const plan *p, moves *mv,
                     tsr_error *err) {
    int me = lt->node_idx, rc = 0;
    tsr_comm_reqs *r = tsr_comm_reqs_new();
    if (!r) return tsr_err(err, TSR_ENOMEM, "out of memory");
    for (uint32_t f = 0; !rc && f < mv->nf; f++) {
        uint64_t size = tsr_ld64(p->files.files + 13 * f + 4);
        if (p->holder[f] == me)
            for (int k = 0; !rc && k < lt->n_nodes; k++)
                if (k != me && !node_has(p, k, f))
                    rc = tsr_comm_isend(lt->world_comm, (uint32_t)(k * lt->per_node), TAG_DATA + 1, mv->m[f].p, size, r,
                                        err);
        if (!rc && !node_has(p, me, f))
            rc = tsr_comm_irecv(lt->world_comm, (uint32_t)(p->holder[f] * lt->per_node), TAG_DATA + 1,
                                mv->m[mv->nf + f].p, size, r, err);
    }
    if (!rc) rc = tsr_comm_waitall(lt->world_comm, r, err);
    tsr_comm_reqs_free(r);
    return rc;
}

/* Makes this node's ROOT/node-<id>/recover/S (dir): links to the pieces it
 * holds, the files it lacks received from the nodes that hold them, the
 * MANIFEST last. Collective; each node's first rank does the work. */
static int gather_files(tsr_local_tier *lt, const plan *p,
                        const char *sname, const uint8_t *mf, uint64_t mf_len, char *dir, size_t len, FILE *out,
                        tsr_error *err) {
    int first = lt->first_of_node, rc = 0, e = 0;
    char rec[PATH_MAX + 16], path[PATH_MAX + 160], to[PATH_MAX + 200];
    snprintf(rec, sizeof rec, "%s/recover", lt->node_dir);
    if ((size_t)snprintf(dir, len, "%s/%s", rec, sname) >= len) rc = tsr_err(err, TSR_EINVAL, "%s: path too long", rec);
    moves mv = {calloc(2 * (size_t)p->files.n_files + 1, sizeof(mapped)), first ? p->files.n_files : 0};
    if (!rc && !mv.m) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    for (uint32_t f = 0; mv.m && f < 2 * mv.nf; f++) mv.m[f].fd = -1;
    if (!rc && first) {
        tsr_remove_tree(rec);
        if ((e = tsr_mkdir_p(dir))) rc = tsr_err(err, TSR_EIO, "%s: cannot create: %s", dir, strerror(e));
    }
    if (!rc && first) rc = prepare_moves(lt, p, sname, dir, &mv, err);
    int64_t ok = !rc; /* every node ready, or none moves anything */
    int rc2 = tsr_comm_allreduce_min(lt->world_comm, &ok, rc ? NULL : err);
    if (!rc && (rc2 || !ok)) rc = rc2 ? rc2 : tsr_err(err, TSR_EIO, "local tier: %s: another node could not prepare it", sname);
    if (!rc && first) rc = run_moves(lt, p, &mv, err);
    for (uint32_t f = 0; mv.m && f < 2 * mv.nf; f++) unmap(&mv.m[f]);
    for (uint32_t f = 0; !rc && f < mv.nf; f++) {
        char name[64];
        if (node_has(p, lt->node_idx, f)) continue;
        tsr_data_file_name(tsr_ld32(p->files.files + 13 * f), name, sizeof name);
        snprintf(path, sizeof path, "%s/.%s.tmp", dir, name);
        snprintf(to, sizeof to, "%s/%s", dir, name);
        if (rename(path, to)) rc = tsr_err(err, TSR_EIO, "%s: cannot rename: %s", path, strerror(errno));
    }
    if (!rc && first && (e = put_file(dir, "MANIFEST", mf, mf_len)))
        rc = tsr_err(err, TSR_EIO, "%s/MANIFEST: cannot write: %s", dir, strerror(e));
    uint32_t got = 0;
    for (uint32_t f = 0; f < mv.nf; f++) got += !node_has(p, lt->node_idx, f);
    if (!rc && got)
        fprintf(lt->rank == 0 && out ? out : stderr, "local tier: %s: node %d received %u of its %u data files from other nodes\n",
                sname, lt->ids[lt->node_idx], got, mv.nf);
    free(mv.m);
    return rc;
}

int tsr_local_recover(tsr_local_tier *lt, int64_t min_step, FILE *log, uint64_t *step, char *dir, size_t len,
                      tsr_error *err) {
    FILE *out = log ? log : stderr;
    tsr_sbuf b = {0};
    if (lt->first_of_node && node_report(lt, min_step, -1, out, &b)) {
        fprintf(out, "local tier: node %d: out of memory listing its snapshots; it reports none\n", lt->node_idx);
        b.n = 0;
    }
    uint8_t *all = NULL;
    size_t *counts = NULL;
    int rc = tsr_comm_allgatherv(lt->world_comm, b.p, b.n, &all, &counts, err), rc2 = 0;
    free(b.p);
    if (rc) return rc;
    plan p = {0};
    int found = choose(lt, all, counts, &p, out);
    char sname[32];
    uint8_t *mf = NULL;
    uint64_t mf_len = 0;
    tsr_step_dir_name(p.step, sname, sizeof sname);
    if (found) rc = share_step_manifest(lt, &p, sname, &mf, &mf_len, err);
    if (found && !rc) rc = gather_files(lt, &p, sname, mf, mf_len, dir, len, log, err);
    /* every rank learns that every node's step is ready */
    int64_t ok = !rc;
    rc2 = found ? tsr_comm_allreduce_min(lt->world_comm, &ok, rc ? NULL : err) : 0;
    if (!rc && (rc2 || !ok)) rc = rc2 ? rc2 : tsr_err(err, TSR_EIO, "local tier: %s: another node could not assemble it", sname);
    *step = p.step;
    free(mf);
    free(p.holder);
    free(p.has);
    free(all);
    free(counts);
    return rc ? rc : found;
}

void tsr_local_forget_after(tsr_local_tier *lt, uint64_t step) {
    if (!lt->first_of_node) return;
    for (int k = 0; k < 3; k++) {
        char d[PATH_MAX + 16];
        snprintf(d, sizeof d, "%s%s", lt->node_dir, k == 1 ? "/partner" : k == 2 ? "/recover" : "");
        if (k == 2) {
            tsr_remove_tree(d);
            break;
        }
        tsr_step_info *v = NULL;
        size_t n = 0;
        if (tsr_list_steps(d, &v, &n)) continue;
        for (size_t j = 0; j < n; j++)
            if (v[j].step > step) {
                char p[PATH_MAX + 80];
                snprintf(p, sizeof p, "%.*s/%s", PATH_MAX - 1, d, v[j].name);
                tsr_remove_tree(p);
            }
        free(v);
    }
}
