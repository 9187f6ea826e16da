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
#include "local_tier.h"
#include "manifest.h"

#define TAG_SIZE 7101
#define TAG_DATA 7102

int tsr_local_root(const tsr_train_config *c, char *out, size_t len, tsr_error *err) {
    int n;
    if (c->checkpoint.local_folder[0]) {
        n = snprintf(out, len, "%s", c->checkpoint.local_folder);
    } else {
        char cwd[PATH_MAX] = "", abs[2 * PATH_MAX];
        const char *d = c->job.dump_folder;
        if (d[0] != '/' && !getcwd(cwd, sizeof cwd)) cwd[0] = 0;
        snprintf(abs, sizeof abs, "%s%s%s", cwd, cwd[0] ? "/" : "", d);
        uint64_t h = 1469598103934665603ull; /* FNV-1a */
        for (const char *p = abs; *p; p++) h = (h ^ (uint8_t)*p) * 1099511628211ull;
        n = snprintf(out, len, "/dev/shm/tessera-%016llx", (unsigned long long)h);
    }
    return n < 0 || (size_t)n >= len ? tsr_err(err, TSR_EINVAL, "checkpoint.local_folder: path too long") : 0;
}

int tsr_local_node_dir(const char *root, int node, char *out, size_t len, tsr_error *err) {
    int n = snprintf(out, len, "%s/node-%d", root, node);
    return n < 0 || (size_t)n >= len ? tsr_err(err, TSR_EINVAL, "%s: path too long", root) : 0;
}

/* ----------------------------------------------------------------- saving */

struct tsr_local_tier {
    char root[PATH_MAX], node_dir[PATH_MAX];
    tsr_engine *engine;
    tsr_comm *bg; /* the copy thread's duplicate of the world */
    int rank, world, n_nodes, per_node, node_idx, first_of_node;
    int ids[TSR_LOCAL_MAX_NODES];
    pthread_t thread;
    int have_thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int pending, quit; /* a step to copy is waiting; the thread is to end */
    uint64_t step;
    int have_staged; /* a snapshot saved, whose copies are not handed over yet */
    uint64_t staged;
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
    size_t got = 0;
    while (b && got < n) {
        ssize_t k = read(fd, b + got, n - got);
        if (k <= 0) break;
        got += (size_t)k;
    }
    close(fd);
    if (!b || got < n) {
        free(b);
        return b ? EIO : ENOMEM;
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
 * and any newer than those, keeping their data files in dir/spare for the
 * next snapshots to write over. */
static void prune(const char *dir, size_t keep) {
    tsr_step_info *v = NULL;
    size_t n = 0, seen = 0;
    if (tsr_list_steps(dir, &v, &n)) return;
    uint64_t floor = 0;
    for (size_t i = n; i-- > 0;)
        if (v[i].committed && ++seen == keep) floor = v[i].step;
    for (size_t i = 0; seen >= keep && i < n; i++)
        if (v[i].step < floor) {
            char p[PATH_MAX + 80];
            char spare[PATH_MAX + 16];
            snprintf(p, sizeof p, "%s/%s", dir, v[i].name);
            snprintf(spare, sizeof spare, "%s/spare", dir);
            if (tsr_retire_step_dir(p, spare, NULL)) tsr_remove_tree(p);
        }
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
        return e;
    }
    return 0;
}

/* Makes `path` a file of `size` bytes mapped to write: the spare file of the
 * same name in `spare` when there is one (its pages reused), else a new one. */
static int map_write(const char *path, const char *spare, uint64_t size, mapped *m) {
    m->p = NULL;
    m->size = size;
    rename(spare, path); /* no spare: a new file */
    m->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (m->fd < 0) return errno;
    if (ftruncate(m->fd, (off_t)size) != 0 ||
        (size && (m->p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, m->fd, 0)) == MAP_FAILED)) {
        int e = errno;
        close(m->fd);
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
    if (!rc && their_size != UINT64_MAX && ((e = tsr_mkdir_p(pdir)) || (e = map_write(tmp, spare, their_size, &theirs))))
        rc = tsr_err(err, TSR_EIO, "%s: cannot make the partner copy of rank %u: %s", tmp, from, strerror(e));
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
    int e = 0;
    if (!rc && lt->first_of_node && !tsr_ckpt_is_committed(dir) && (e = put_file(dir, "MANIFEST", mf, mf_len)))
        rc = tsr_err(err, TSR_EIO, "%s/MANIFEST: cannot write: %s", dir, strerror(e));
    if (!rc) rc = swap_with_partner(lt, name, mf, mf_len, err);
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
        if (copy_step(lt, step, &e))
            fprintf(stderr, "tessera: rank %d: local tier: the partner copy of step %llu failed: %s\n", lt->rank,
                    (unsigned long long)step, e.msg);
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

int tsr_local_open(const tsr_train_config *c, tsr_comm *world, tsr_local_tier **out, tsr_error *err) {
    *out = NULL;
    tsr_local_tier *lt = calloc(1, sizeof *lt);
    if (!lt) return tsr_err(err, TSR_ENOMEM, "out of memory");
    lt->rank = (int)tsr_comm_rank(world);
    lt->world = (int)tsr_comm_size(world);
    int rc = parse_nodes(c->checkpoint.local_nodes, lt->world, lt->ids, &lt->n_nodes, err);
    if (!rc) {
        lt->per_node = lt->world / lt->n_nodes;
        lt->node_idx = lt->rank / lt->per_node;
        lt->first_of_node = lt->rank % lt->per_node == 0;
        rc = tsr_local_root(c, lt->root, sizeof lt->root, err);
    }
    if (!rc) rc = tsr_local_node_dir(lt->root, lt->ids[lt->node_idx], lt->node_dir, sizeof lt->node_dir, err);
    int e = rc ? 0 : tsr_mkdir_p(lt->node_dir);
    if (e) rc = tsr_err(err, TSR_EIO, "%s: cannot create: %s", lt->node_dir, strerror(e));
    tsr_engine_opts eo = tsr_engine_opts_default();
    eo.write.codec = TSR_CODEC_RAW; /* memory is cheap to write and read; compression is not */
    eo.keep_latest = TSR_LOCAL_KEEP;
    eo.recycle = 1; /* each snapshot writes over the pages of one retired */
    eo.sync = 0; /* the save returns once staged; the next one hands its copies over */
    eo.commit_timeout_s = c->checkpoint.commit_timeout_s;
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
        fprintf(stderr, "tessera: rank %d: local tier: the snapshot of step %llu failed: %s\n", lt->rank,
                (unsigned long long)lt->staged, e.msg);
        return;
    }
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

/* The places pieces may be: ROOT/node-<k> and ROOT/node-<k>/partner. */
typedef struct sources {
    char (*dir)[PATH_MAX];
    size_t n;
} sources;

static int list_sources(const char *root, sources *s, tsr_error *err) {
    s->dir = NULL, s->n = 0;
    DIR *d = opendir(root);
    if (!d) return 0;
    struct dirent *e;
    size_t cap = 0;
    int rc = 0;
    while (!rc && (e = readdir(d))) {
        int k;
        char tail;
        if (sscanf(e->d_name, "node-%d%c", &k, &tail) != 1) continue;
        if (s->n + 2 > cap) {
            cap = cap ? 2 * cap : 16;
            void *p = realloc(s->dir, cap * sizeof *s->dir);
            if (!p) {
                rc = tsr_err(err, TSR_ENOMEM, "out of memory");
                break;
            }
            s->dir = p;
        }
        snprintf(s->dir[s->n++], PATH_MAX, "%.*s/node-%d", PATH_MAX - 80, root, k);
        snprintf(s->dir[s->n++], PATH_MAX, "%.*s/node-%d/partner", PATH_MAX - 80, root, k);
    }
    closedir(d);
    return rc;
}

/* The committed steps of every source, newest first, without repeats. */
static int candidate_steps(const sources *s, uint64_t **out, size_t *n_out) {
    uint64_t *v = NULL;
    size_t n = 0, cap = 0;
    for (size_t i = 0; i < s->n; i++) {
        tsr_step_info *st = NULL;
        size_t k = 0;
        if (tsr_list_steps(s->dir[i], &st, &k)) continue;
        for (size_t j = 0; j < k; j++) {
            if (!st[j].committed) continue;
            int dup = 0;
            for (size_t q = 0; q < n && !dup; q++) dup = v[q] == st[j].step;
            if (dup) continue;
            if (n == cap) {
                cap = cap ? 2 * cap : 16;
                uint64_t *p = realloc(v, cap * sizeof *v);
                if (!p) break;
                v = p;
            }
            v[n++] = st[j].step;
        }
        free(st);
    }
    for (size_t i = 1; i < n; i++) /* newest first */
        for (size_t j = i; j > 0 && v[j] > v[j - 1]; j--) {
            uint64_t t = v[j];
            v[j] = v[j - 1], v[j - 1] = t;
        }
    *out = v, *n_out = n;
    return 0;
}

/* The open MANIFEST of step `name` from the first source that holds a sound one. */
static tsr_ckpt *open_any(const sources *s, const char *name, FILE *log) {
    for (size_t i = 0; i < s->n; i++) {
        char dir[PATH_MAX + 40];
        snprintf(dir, sizeof dir, "%s/%s", s->dir[i], name);
        if (!tsr_ckpt_is_committed(dir)) continue;
        tsr_error e = {0};
        tsr_ckpt *ck = tsr_ckpt_open(dir, &e);
        if (ck) return ck;
        if (log) fprintf(log, "local tier: %s/MANIFEST refused: %s\n", dir, e.msg);
    }
    return NULL;
}

/* Finds each data file of ck at its size in some source, into paths[i].
 * @return 1 when every one is found, else 0 after logging why. */
static int find_files(const sources *s, const char *name, tsr_ckpt *ck, char (*paths)[PATH_MAX], FILE *log) {
    size_t nf = tsr_ckpt_n_files(ck);
    for (size_t f = 0; f < nf; f++) {
        tsr_file_info fi;
        char fname[64], bad[PATH_MAX + 200] = "";
        tsr_ckpt_file(ck, f, &fi);
        tsr_data_file_name(fi.file_id, fname, sizeof fname);
        int found = 0;
        for (size_t i = 0; i < s->n && !found; i++) {
            char p[PATH_MAX];
            struct stat st;
            snprintf(p, sizeof p, "%.*s/%s/%s", PATH_MAX - 120, s->dir[i], name, fname);
            if (stat(p, &st)) continue;
            if ((uint64_t)st.st_size == fi.size) {
                snprintf(paths[f], PATH_MAX, "%s", p);
                found = 1;
            } else {
                snprintf(bad, sizeof bad, "%s is %lld bytes, the MANIFEST names %llu: refused", p,
                         (long long)st.st_size, (unsigned long long)fi.size);
                if (log) fprintf(log, "local tier: %s\n", bad);
            }
        }
        if (!found) {
            if (log)
                fprintf(log, "local tier: %s is not complete: %s\n", name,
                        bad[0] ? "no sound copy of its data file" : "a data file is in no surviving node");
            if (log && !bad[0]) fprintf(log, "local tier: %s: %s is missing\n", name, fname);
            return 0;
        }
    }
    return 1;
}

/* ROOT/recover/NAME made of hard links to the pieces (copies where links fail). */
static int link_step(const char *root, const char *name, tsr_ckpt *ck, char (*paths)[PATH_MAX], char *dir,
                     size_t len, tsr_error *err) {
    char rec[PATH_MAX + 16], mf[PATH_MAX + 16];
    snprintf(rec, sizeof rec, "%s/recover", root);
    tsr_remove_tree(rec);
    if ((size_t)snprintf(dir, len, "%s/%s", rec, name) >= len) return tsr_err(err, TSR_EINVAL, "%s: path too long", rec);
    int e = tsr_mkdir_p(dir);
    for (size_t f = 0; !e && f < tsr_ckpt_n_files(ck); f++) {
        char to[PATH_MAX + 80];
        snprintf(to, sizeof to, "%s/%s", dir, strrchr(paths[f], '/') + 1);
        if (link(paths[f], to) == 0) continue;
        uint8_t *b = NULL;
        uint64_t n = 0;
        e = slurp(paths[f], &b, &n);
        if (!e) e = put_file(dir, strrchr(paths[f], '/') + 1, b, n);
        free(b);
    }
    snprintf(mf, sizeof mf, "%s/MANIFEST", tsr_ckpt_dir(ck));
    uint8_t *b = NULL;
    uint64_t n = 0;
    if (!e) e = slurp(mf, &b, &n); /* the MANIFEST last */
    if (!e) e = put_file(dir, "MANIFEST", b, n);
    free(b);
    return e ? tsr_err(err, TSR_EIO, "%s: cannot assemble the step: %s", dir, strerror(e)) : 0;
}

int tsr_local_assemble(const char *root, int64_t max_step, FILE *log, uint64_t *step, char *dir, size_t len,
                       tsr_error *err) {
    sources s;
    uint64_t *steps = NULL;
    size_t n = 0;
    int rc = list_sources(root, &s, err), found = 0;
    if (!rc) candidate_steps(&s, &steps, &n);
    for (size_t i = 0; !rc && !found && i < n; i++) {
        if (max_step >= 0 && steps[i] > (uint64_t)max_step) continue;
        char name[32];
        tsr_step_dir_name(steps[i], name, sizeof name);
        tsr_ckpt *ck = open_any(&s, name, log);
        if (!ck) continue;
        char (*paths)[PATH_MAX] = calloc(tsr_ckpt_n_files(ck) + 1, sizeof *paths);
        if (!paths) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
        if (!rc && find_files(&s, name, ck, paths, log)) {
            rc = link_step(root, name, ck, paths, dir, len, err);
            found = !rc;
            *step = steps[i];
        }
        free(paths);
        tsr_ckpt_close(ck);
    }
    free(steps);
    free(s.dir);
    return rc ? rc : found;
}

void tsr_local_forget_after(const char *root, uint64_t step) {
    sources s;
    char rec[PATH_MAX + 16];
    if (list_sources(root, &s, NULL)) return;
    for (size_t i = 0; i < s.n; i++) {
        tsr_step_info *v = NULL;
        size_t n = 0;
        if (tsr_list_steps(s.dir[i], &v, &n)) continue;
        for (size_t j = 0; j < n; j++)
            if (v[j].step > step) {
                char p[PATH_MAX + 80];
                snprintf(p, sizeof p, "%.*s/%s", PATH_MAX - 1, s.dir[i], v[j].name);
                tsr_remove_tree(p);
            }
        free(v);
    }
    free(s.dir);
    snprintf(rec, sizeof rec, "%s/recover", root);
    tsr_remove_tree(rec);
}
