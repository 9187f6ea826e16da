/* control_mpi.c: the control plane over MPI (bytes: the group, broadcast,
 * gathers with and without a deadline, barriers, point to point), and the group
 * of one rank. The engine and the command use it; the trainer's typed
 * collectives are the data plane (data_mpi.c). Messages larger than INT_MAX
 * bytes are split. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm_mpi.h"

tsr_comm *tsr_comm_self(void) {
    tsr_comm *c = calloc(1, sizeof *c);
    if (c) c->size = 1;
    return c;
}

tsr_comm *tsr_comm_mpi_world(tsr_error *err) {
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    tsr_comm *c = calloc(1, sizeof *c);
    if (!c) {
        tsr_err(err, TSR_ENOMEM, "out of memory");
        return NULL;
    }
    if (!inited) {
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
            tsr_err(err, TSR_EIO, "MPI_Init_thread failed");
            free(c);
            return NULL;
        }
        c->finalize = 1;
    } else {
        MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_MULTIPLE) {
        tsr_err(err, TSR_EIO, "this MPI does not provide MPI_THREAD_MULTIPLE (got level %d)", provided);
        if (c->finalize) MPI_Finalize();
        free(c);
        return NULL;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    c->is_mpi = 1;
    c->comm = MPI_COMM_WORLD;
    int r, s;
    MPI_Comm_rank(c->comm, &r);
    MPI_Comm_size(c->comm, &s);
    c->rank = (uint32_t)r;
    c->size = (uint32_t)s;
    return c;
}

tsr_comm *tsr_comm_dup(tsr_comm *c, tsr_error *err) {
    tsr_comm *d = calloc(1, sizeof *d);
    if (!d) {
        tsr_err(err, TSR_ENOMEM, "out of memory");
        return NULL;
    }
    *d = *c;
    d->finalize = 0;
    d->sends = NULL;
    d->n_sends = d->cap_sends = 0;
    if (c->is_mpi) {
        int rc = MPI_Comm_dup(c->comm, &d->comm);
        if (rc != MPI_SUCCESS) {
            tsr_mpi_err(err, rc, "Comm_dup");
            free(d);
            return NULL;
        }
        MPI_Comm_set_errhandler(d->comm, MPI_ERRORS_RETURN);
    }
    return d;
}

int tsr_comm_node_rank(tsr_comm *c, uint32_t *rank, uint32_t *size, tsr_error *err) {
    *rank = 0, *size = 1;
    if (!c->is_mpi) return 0;
    MPI_Comm node;
    int rc = MPI_Comm_split_type(c->comm, MPI_COMM_TYPE_SHARED, (int)c->rank, MPI_INFO_NULL, &node);
    if (rc != MPI_SUCCESS) return tsr_mpi_err(err, rc, "Comm_split_type");
    int r = 0, s = 1;
    MPI_Comm_rank(node, &r);
    MPI_Comm_size(node, &s);
    MPI_Comm_free(&node);
    *rank = (uint32_t)r, *size = (uint32_t)s;
    return 0;
}

tsr_comm *tsr_comm_split(tsr_comm *c, int color, int key, tsr_error *err) {
    if (!c->is_mpi) {
        if (color < 0) return NULL;
        tsr_comm *d = tsr_comm_self();
        if (!d) tsr_err(err, TSR_ENOMEM, "out of memory");
        return d;
    }
    MPI_Comm nc;
    int rc = MPI_Comm_split(c->comm, color < 0 ? MPI_UNDEFINED : color, key, &nc);
    if (rc != MPI_SUCCESS) {
        tsr_mpi_err(err, rc, "Comm_split");
        return NULL;
    }
    if (nc == MPI_COMM_NULL) return NULL;
    tsr_comm *d = calloc(1, sizeof *d);
    if (!d) {
        MPI_Comm_free(&nc);
        tsr_err(err, TSR_ENOMEM, "out of memory");
        return NULL;
    }
    int r, s;
    MPI_Comm_set_errhandler(nc, MPI_ERRORS_RETURN);
    MPI_Comm_rank(nc, &r);
    MPI_Comm_size(nc, &s);
    *d = (tsr_comm){.is_mpi = 1, .comm = nc, .rank = (uint32_t)r, .size = (uint32_t)s};
    return d;
}

static void reap_sends(tsr_comm *c);

void tsr_comm_free(tsr_comm *c) {
    if (!c) return;
    reap_sends(c);
    /* a send still in flight went to a rank that gave up on it: its request is
     * freed and its buffer left to MPI, which may still read it */
    for (size_t i = 0; i < c->n_sends; i++) MPI_Request_free(&c->sends[i].q);
    free(c->sends);
    if (c->nccl_free) c->nccl_free(c); /* the data plane's, which made it */
    if (c->is_mpi && c->comm != MPI_COMM_WORLD) MPI_Comm_free(&c->comm);
    if (c->finalize) MPI_Finalize();
    free(c);
}

uint32_t tsr_comm_rank(const tsr_comm *c) { return c->rank; }
uint32_t tsr_comm_size(const tsr_comm *c) { return c->size; }

int tsr_comm_barrier(tsr_comm *c, tsr_error *err) {
    if (!c->is_mpi) return 0;
    int rc;
    TSR_MPI_COLL(rc, MPI_Barrier, MPI_Ibarrier, c->comm);
    return rc == MPI_SUCCESS ? 0 : tsr_mpi_err(err, rc, "Barrier");
}

static void poll_sleep(void);

int tsr_comm_barrier_idle(tsr_comm *c, tsr_error *err) {
    if (!c->is_mpi) return 0;
    MPI_Request q;
    int rc = MPI_Ibarrier(c->comm, &q), done = 0;
    while (rc == MPI_SUCCESS && !done && (rc = MPI_Test(&q, &done, MPI_STATUS_IGNORE)) == MPI_SUCCESS && !done)
        poll_sleep();
    return rc == MPI_SUCCESS ? 0 : tsr_mpi_err(err, rc, "Ibarrier");
}

int tsr_comm_bcast(tsr_comm *c, uint32_t root, void *buf, size_t n, tsr_error *err) {
    if (!c->is_mpi) return 0;
    for (size_t off = 0; off < n || (n == 0 && off == 0); off += TSR_MPI_CHUNK) {
        int len = (int)(n - off < TSR_MPI_CHUNK ? n - off : TSR_MPI_CHUNK);
        int rc;
        TSR_MPI_COLL(rc, MPI_Bcast, MPI_Ibcast, (char *)buf + off, len, MPI_BYTE, (int)root, c->comm);
        if (rc != MPI_SUCCESS) return tsr_mpi_err(err, rc, "Bcast");
        if (n == 0) break;
    }
    return 0;
}

int tsr_comm_allreduce_min(tsr_comm *c, int64_t *v, tsr_error *err) {
    if (!c->is_mpi) return 0;
    int64_t in = *v;
    int rc;
    TSR_MPI_COLL(rc, MPI_Allreduce, MPI_Iallreduce, &in, v, 1, MPI_INT64_T, MPI_MIN, c->comm);
    return rc == MPI_SUCCESS ? 0 : tsr_mpi_err(err, rc, "Allreduce");
}

/* The reduction of tsr_comm_allreduce_xor_sum_u64 on its pairs of words. */
static void xor_sum(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    const uint64_t *a = in;
    uint64_t *b = inout;
    for (int i = 0; i < *len; i++) b[2 * i] ^= a[2 * i], b[2 * i + 1] += a[2 * i + 1];
}

int tsr_comm_allreduce_xor_sum_u64(tsr_comm *c, uint64_t *v, size_t n, tsr_error *err) {
    if (!c->is_mpi || n == 0) return 0;
    if (n > INT_MAX) return tsr_err(err, TSR_EINVAL, "Allreduce of %zu pairs: over INT_MAX", n);
    MPI_Datatype pair;
    MPI_Op op;
    int rc = MPI_Type_contiguous(2, MPI_UINT64_T, &pair);
    if (rc != MPI_SUCCESS) return tsr_mpi_err(err, rc, "Type_contiguous");
    if ((rc = MPI_Type_commit(&pair)) == MPI_SUCCESS && (rc = MPI_Op_create(xor_sum, 1, &op)) == MPI_SUCCESS) {
        TSR_MPI_COLL(rc, MPI_Allreduce, MPI_Iallreduce, MPI_IN_PLACE, v, (int)n, pair, op, c->comm);
        MPI_Op_free(&op);
    }
    MPI_Type_free(&pair);
    return rc == MPI_SUCCESS ? 0 : tsr_mpi_err(err, rc, "Allreduce");
}

int tsr_comm_allgatherv(tsr_comm *c, const void *buf, size_t n, uint8_t **all, size_t **counts,
                        tsr_error *err) {
    size_t *cnt = calloc(c->size, sizeof *cnt);
    if (!cnt) return tsr_err(err, TSR_ENOMEM, "out of memory");
    if (!c->is_mpi) {
        uint8_t *out = malloc(n ? n : 1);
        if (!out) {
            free(cnt);
            return tsr_err(err, TSR_ENOMEM, "out of memory");
        }
        if (n) memcpy(out, buf, n);
        cnt[0] = n;
        *all = out;
        *counts = cnt;
        return 0;
    }
    uint64_t mine = n;
    uint64_t *all_n = calloc(c->size, sizeof *all_n);
    int *rc_cnt = calloc(c->size, sizeof *rc_cnt), *displs = calloc(c->size, sizeof *displs);
    int rc = (!all_n || !rc_cnt || !displs) ? tsr_err(err, TSR_ENOMEM, "out of memory") : 0;
    uint8_t *out = NULL;
    if (!rc) {
        int r;
        TSR_MPI_COLL(r, MPI_Allgather, MPI_Iallgather, &mine, 1, MPI_UINT64_T, all_n, 1, MPI_UINT64_T, c->comm);
        if (r != MPI_SUCCESS) rc = tsr_mpi_err(err, r, "Allgather");
    }
    uint64_t total = 0;
    for (uint32_t i = 0; !rc && i < c->size; i++) {
        cnt[i] = all_n[i];
        total += all_n[i];
    }
    if (!rc && total > INT_MAX) rc = tsr_err(err, TSR_EINVAL, "allgather of %llu bytes: over 2 GiB", (unsigned long long)total);
    if (!rc && !(out = malloc(total ? total : 1))) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    if (!rc) {
        int d = 0;
        for (uint32_t i = 0; i < c->size; i++) {
            rc_cnt[i] = (int)all_n[i];
            displs[i] = d;
            d += rc_cnt[i];
        }
        int r;
        TSR_MPI_COLL(r, MPI_Allgatherv, MPI_Iallgatherv, buf, (int)n, MPI_BYTE, out, rc_cnt, displs, MPI_BYTE, c->comm);
        if (r != MPI_SUCCESS) rc = tsr_mpi_err(err, r, "Allgatherv");
    }
    free(all_n), free(rc_cnt), free(displs);
    if (rc) {
        free(out);
        free(cnt);
        return rc;
    }
    *all = out;
    *counts = cnt;
    return 0;
}

int tsr_comm_recv(tsr_comm *c, uint32_t peer, int tag, void *buf, size_t n, tsr_error *err) {
    if (!c->is_mpi) return tsr_err(err, TSR_EINVAL, "recv on a group of one rank");
    for (size_t off = 0; off < n || off == 0; off += TSR_MPI_CHUNK) {
        int len = (int)(n - off < TSR_MPI_CHUNK ? n - off : TSR_MPI_CHUNK);
        MPI_Request q;
        int rc = MPI_Irecv((char *)buf + off, len, MPI_BYTE, (int)peer, tag, c->comm, &q);
        if (rc == MPI_SUCCESS) rc = tsr_mpi_wait(&q);
        if (rc != MPI_SUCCESS) return tsr_mpi_err(err, rc, "Recv");
        if (n == 0) break;
    }
    return 0;
}

/* ------------------------------------------------- exchanges with a deadline */

/* Polled instead of blocking, so that a rank that never arrives costs a timeout,
 * not the process. The sleep keeps a waiting thread off the cores it shares with
 * the encoder and the training loop. */
#define POLL_SLEEP_NS 1000000L

static void poll_sleep(void) {
    struct timespec ts = {0, POLL_SLEEP_NS};
    nanosleep(&ts, NULL);
}

/* Whether the deadline has passed (a deadline of 0: never). */
static int past(double deadline) { return deadline > 0 && tsr_now() >= deadline; }

/* "rank 3" or "ranks 3, 5" of the flagged ranks, into buf. */
static void rank_list(const uint8_t *flag, uint32_t n, char *buf, size_t len) {
    uint32_t k = 0;
    for (uint32_t r = 0; r < n; r++) k += flag[r];
    size_t o = (size_t)snprintf(buf, len, "%s", k > 1 ? "ranks " : "rank ");
    for (uint32_t r = 0, i = 0; r < n && o < len; r++)
        if (flag[r]) o += (size_t)snprintf(buf + o, len - o, "%s%u", i++ ? ", " : "", r);
}

int tsr_comm_iprobe(tsr_comm *c, uint32_t peer, int tag) {
    if (!c->is_mpi) return 0;
    int flag = 0;
    if (MPI_Iprobe((int)peer, tag, c->comm, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) return 0;
    return flag;
}

/* Frees the buffers of the owned sends that have completed. */
static void reap_sends(tsr_comm *c) {
    size_t k = 0;
    for (size_t i = 0; i < c->n_sends; i++) {
        int done = 0;
        MPI_Test(&c->sends[i].q, &done, MPI_STATUS_IGNORE);
        if (done) free(c->sends[i].buf);
        else c->sends[k++] = c->sends[i];
    }
    c->n_sends = k;
}

/* Sends n bytes from a copy that the comm owns until the send completes, and
 * returns at once: a send completes only when its receiver takes part (shared
 * memory returns each fragment to the sender), and that rank may be the late one. */
static int send_owned(tsr_comm *c, uint32_t peer, int tag, const void *buf, size_t n, tsr_error *err) {
    reap_sends(c);
    void *copy = malloc(n ? n : 1);
    if (!copy || tsr_grow((void **)&c->sends, &c->cap_sends, c->n_sends, sizeof *c->sends)) {
        free(copy);
        return tsr_err(err, TSR_ENOMEM, "out of memory");
    }
    if (n) memcpy(copy, buf, n);
    MPI_Request q;
    int rc = MPI_Isend(copy, (int)n, MPI_BYTE, (int)peer, tag, c->comm, &q);
    if (rc != MPI_SUCCESS) {
        free(copy);
        return tsr_mpi_err(err, rc, "Isend");
    }
    c->sends[c->n_sends++] = (struct owned_send){q, copy};
    return 0;
}

/* One rank's message to the root of a gather: 0 not arrived, 1 being
 * received, 2 here. */
typedef struct gather_part {
    int state;
    uint8_t *data;
    size_t size;
    MPI_Request q;
} gather_part;

/* Advances rank r's part without blocking. */
static int poll_part(tsr_comm *c, uint32_t r, int tag, gather_part *p, tsr_error *err) {
    int flag = 0, rc = MPI_SUCCESS;
    if (p->state == 0) {
        MPI_Message m;
        MPI_Status st;
        int cnt = 0;
        if ((rc = MPI_Improbe((int)r, tag, c->comm, &flag, &m, &st)) != MPI_SUCCESS) return tsr_mpi_err(err, rc, "Improbe");
        if (!flag) return 0;
        MPI_Get_count(&st, MPI_BYTE, &cnt);
        if (!(p->data = malloc(cnt > 0 ? (size_t)cnt : 1))) return tsr_err(err, TSR_ENOMEM, "out of memory");
        p->size = cnt > 0 ? (size_t)cnt : 0;
        if ((rc = MPI_Imrecv(p->data, cnt, MPI_BYTE, &m, &p->q)) != MPI_SUCCESS) return tsr_mpi_err(err, rc, "Imrecv");
        p->state = 1;
    }
    if (p->state == 1) {
        if ((rc = MPI_Test(&p->q, &flag, MPI_STATUS_IGNORE)) != MPI_SUCCESS) return tsr_mpi_err(err, rc, "Test");
        if (flag) p->state = 2;
    }
    return 0;
}

/* The gather tree. Ranks are numbered from the root (v = (rank - root) mod
 * size); v's children are v*k+1 .. v*k+k with k = ceil(sqrt(size)), so that no
 * rank receives more than about sqrt(size) messages and the tree is at most two
 * levels deep. */
typedef struct gather_tree {
    uint32_t n, root, k, depth; /* depth: that of the deepest rank */
} gather_tree;

static gather_tree tree_of(uint32_t n, uint32_t root) {
    gather_tree t = {n, root, 2, 0};
    while ((uint64_t)t.k * t.k < n) t.k++;
    for (uint32_t v = n - 1; v; v = (v - 1) / t.k) t.depth++;
    return t;
}
uint32_t tsr_comm_gather_fanin(uint32_t size) { return size > 1 ? tree_of(size, 0).k : 0; }

static uint32_t tree_rank(const gather_tree *t, uint32_t v) { return (uint32_t)(((uint64_t)v + t->root) % t->n); }
static uint32_t tree_v(const gather_tree *t, uint32_t r) { return (uint32_t)(((uint64_t)r + t->n - t->root) % t->n); }
static uint32_t tree_depth(const gather_tree *t, uint32_t v) {
    uint32_t d = 0;
    for (; v; v = (v - 1) / t->k) d++;
    return d;
}
/* The first child of v and the count of its children. */
static uint32_t tree_children(const gather_tree *t, uint32_t v, uint32_t *first) {
    uint64_t f = (uint64_t)v * t->k + 1;
    *first = (uint32_t)(f < t->n ? f : t->n);
    return f >= t->n ? 0 : (uint32_t)(f + t->k <= t->n ? t->k : t->n - f);
}

/* A report travelling up the tree: per rank of a subtree [u32 rank][u32 here]
 * [u64 len][len bytes]; here = 0 for a rank whose report did not come. */
#define REC_HEAD 16

static int rec_put(tsr_sbuf *sb, uint32_t rank, int here, const void *buf, size_t n) {
    uint8_t h[REC_HEAD];
    tsr_st32(h, rank);
    tsr_st32(h + 4, (uint32_t)here);
    tsr_st64(h + 8, n);
    tsr_sb_put(sb, h, REC_HEAD);
    if (n) tsr_sb_put(sb, buf, n);
    return sb->oom ? TSR_ENOMEM : 0;
}

/* Every rank of v's subtree: recorded "not here" into sb (a relay), or flagged
 * in gone (the root). */
static int put_missing(const gather_tree *t, uint32_t v, tsr_sbuf *sb, uint8_t *gone) {
    if (gone) gone[tree_rank(t, v)] = 1;
    if (sb && rec_put(sb, tree_rank(t, v), 0, NULL, 0)) return TSR_ENOMEM;
    uint32_t first, nc = tree_children(t, v, &first);
    for (uint32_t i = 0; i < nc; i++)
        if (put_missing(t, first + i, sb, gone)) return TSR_ENOMEM;
    return 0;
}

/* Waits until `deadline` for the reports of v's children (into p[0..nc)).
 * @return the count that did not come, or a negative status. */
static int wait_children(tsr_comm *c, const gather_tree *t, uint32_t first, uint32_t nc, int tag, double deadline,
                         gather_part *p, tsr_error *err) {
    uint32_t left = nc;
    while (left) {
        for (uint32_t i = 0; i < nc; i++) {
            int was = p[i].state, rc = poll_part(c, tree_rank(t, first + i), tag, &p[i], err);
            if (rc) return rc;
            if (p[i].state == 2 && was != 2) left--;
        }
        if (!left || past(deadline)) break;
        poll_sleep();
    }
    return (int)left;
}

/* The root's error for the ranks whose reports did not come: late[r] for a rank
 * that did not report, via[r] for one whose report would have come through a
 * late rank. */
static int late_error(const uint8_t *late, const uint8_t *via, uint32_t n, double timeout_s, tsr_error *err) {
    char who[256], also[256] = "";
    rank_list(late, n, who, sizeof who);
    int any = 0;
    for (uint32_t r = 0; r < n; r++) any |= via[r];
    if (any) {
        char list[200];
        rank_list(via, n, list, sizeof list);
        snprintf(also, sizeof also, " (nor %s, whose reports go through it)", list);
    }
    return tsr_err(err, TSR_EIO, "%s did not report within %.1f s%s", who, timeout_s, also);
}

/* The root: its own message and its children's reports (p[0..nc), the ranks
 * from `first`) in rank order into *all and *counts, straight from the
 * messages; or the error naming the ranks whose reports did not come. */
static int root_collect(tsr_comm *c, const gather_tree *t, const void *buf, size_t n, uint32_t first, uint32_t nc,
                        const gather_part *p, double timeout_s, uint8_t **all, size_t **counts, tsr_error *err) {
    uint8_t *late = calloc(t->n, 2), *via = late ? late + t->n : NULL; /* see late_error */
    const uint8_t **at = calloc(t->n, sizeof *at);
    size_t *sizes = calloc(t->n, sizeof *sizes), total = n;
    int rc = late && at && sizes ? 0 : tsr_err(err, TSR_ENOMEM, "out of memory");
    if (!rc) at[c->rank] = buf, sizes[c->rank] = n;
    for (uint32_t i = 0; !rc && i < nc; i++) {
        if (p[i].state != 2) { /* the child, and those whose reports go through it */
            late[tree_rank(t, first + i)] = 1;
            uint32_t cf, cn = tree_children(t, first + i, &cf);
            for (uint32_t k = 0; k < cn; k++) put_missing(t, cf + k, NULL, via);
            continue;
        }
        for (size_t off = 0; off + REC_HEAD <= p[i].size;) { /* built by a relay: well formed */
            const uint8_t *rec = p[i].data + off;
            uint32_t r = tsr_ld32(rec);
            uint64_t len = tsr_ld64(rec + 8);
            if (!tsr_ld32(rec + 4)) late[r] = 1;
            at[r] = rec + REC_HEAD, sizes[r] = len, total += len;
            off += REC_HEAD + len;
        }
    }
    for (uint32_t r = 0; !rc && r < t->n; r++)
        if (late[r]) rc = late_error(late, via, t->n, timeout_s, err);
    uint8_t *out = rc ? NULL : malloc(total ? total : 1);
    if (!rc && !out) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    for (size_t r = 0, o = 0; !rc && r < t->n; o += sizes[r], r++)
        if (sizes[r]) memcpy(out + o, at[r], sizes[r]);
    free(late), free(at);
    if (rc) {
        free(sizes), free(out);
        return rc;
    }
    *all = out;
    *counts = sizes;
    return 0;
}

int tsr_comm_gatherv_deadline(tsr_comm *c, uint32_t root, int tag, const void *buf, size_t n, double timeout_s,
                              uint8_t **all, size_t **counts, tsr_error *err) {
    *all = NULL;
    *counts = NULL;
    if (!c->is_mpi) return tsr_comm_allgatherv(c, buf, n, all, counts, err);
    if (n > INT_MAX) return tsr_err(err, TSR_EINVAL, "gather of %zu bytes from one rank: over 2 GiB", n);
    gather_tree t = tree_of(c->size, root);
    uint32_t v = tree_v(&t, c->rank), first, nc = tree_children(&t, v, &first);
    /* a rank at depth d waits for its children until (depth - d) / depth of the
     * timeout, so that its report, with whatever did not come marked, reaches
     * its parent before the parent gives up on it */
    double deadline = timeout_s > 0 ? tsr_now() + timeout_s * (t.depth - tree_depth(&t, v)) / t.depth : 0;
    /* each child's message as it arrives (a matched probe, then a nonblocking
     * receive of its size); nothing is posted for a child that has not sent,
     * so nothing is left to cancel when one never does */
    gather_part *p = calloc(nc + 1, sizeof *p);
    tsr_sbuf sb = {0};
    int rc = p ? 0 : tsr_err(err, TSR_ENOMEM, "out of memory");
    int missing = rc ? 0 : wait_children(c, &t, first, nc, tag, deadline, p, err);
    if (missing < 0) rc = missing;
    if (!rc && v == 0) rc = root_collect(c, &t, buf, n, first, nc, p, timeout_s, all, counts, err);
    /* a relay: its own report, then its children's, with whatever did not come marked */
    if (!rc && v != 0 && rec_put(&sb, c->rank, 1, buf, n)) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    for (uint32_t i = 0; !rc && v != 0 && i < nc; i++) {
        if (p[i].state == 2) {
            tsr_sb_put(&sb, p[i].data, p[i].size);
            if (sb.oom) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
            continue;
        }
        uint32_t cf, cn = tree_children(&t, first + i, &cf);
        for (uint32_t j = 0; !rc && j < cn; j++)
            if (put_missing(&t, cf + j, &sb, NULL)) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
        if (!rc && rec_put(&sb, tree_rank(&t, first + i), 0, NULL, 0)) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    }
    for (uint32_t i = 0; p && i < nc; i++) {
        /* a matched receive still in flight cannot be cancelled: its request is
         * freed and its buffer left to MPI */
        if (p[i].state == 1) MPI_Request_free(&p[i].q);
        else free(p[i].data);
    }
    free(p);
    if (!rc && v != 0)
        rc = sb.n > INT_MAX ? tsr_err(err, TSR_EINVAL, "gather of %zu bytes through rank %u: over 2 GiB", sb.n, c->rank)
                            : send_owned(c, tree_rank(&t, (v - 1) / t.k), tag, sb.p, sb.n, err);
    free(sb.p);
    return rc;
}

int tsr_comm_bcast_deadline(tsr_comm *c, uint32_t root, int tag, void *buf, size_t n, double timeout_s,
                            tsr_error *err) {
    if (!c->is_mpi) return 0;
    if (n > INT_MAX) return tsr_err(err, TSR_EINVAL, "broadcast of %zu bytes: over 2 GiB", n);
    int rc = 0;
    if (c->rank == root) {
        for (uint32_t r = 0; r < c->size && !rc; r++)
            if (r != root) rc = send_owned(c, r, tag, buf, n, err);
        return rc;
    }
    double deadline = timeout_s > 0 ? tsr_now() + timeout_s : 0;
    MPI_Request q;
    int done = 0;
    if ((rc = MPI_Irecv(buf, (int)n, MPI_BYTE, (int)root, tag, c->comm, &q)) != MPI_SUCCESS)
        return tsr_mpi_err(err, rc, "Irecv");
    for (;;) { /* tested at least once, even when the deadline has passed */
        if ((rc = MPI_Test(&q, &done, MPI_STATUS_IGNORE)) != MPI_SUCCESS) return tsr_mpi_err(err, rc, "Test");
        if (done || past(deadline)) break;
        poll_sleep();
    }
    if (done) return 0;
    /* a receive can be cancelled; if the message matched meanwhile it is here */
    MPI_Status st;
    int cancelled = 0;
    MPI_Cancel(&q);
    MPI_Wait(&q, &st);
    MPI_Test_cancelled(&st, &cancelled);
    if (!cancelled) return 0;
    return tsr_err(err, TSR_EIO, "rank %u did not answer within %.1f s", root, timeout_s);
}

struct tsr_comm_reqs {
    MPI_Request *v;
    size_t n, cap;
};

tsr_comm_reqs *tsr_comm_reqs_new(void) { return calloc(1, sizeof(tsr_comm_reqs)); }

void tsr_comm_reqs_free(tsr_comm_reqs *r) {
    if (!r) return;
    free(r->v);
    free(r);
}

static int reqs_push(tsr_comm_reqs *r, MPI_Request q) {
    if (tsr_grow((void **)&r->v, &r->cap, r->n, sizeof *r->v)) return TSR_ENOMEM;
    r->v[r->n++] = q;
    return 0;
}

static int p2p_nb(tsr_comm *c, int send, uint32_t peer, int tag, void *buf, size_t n, tsr_comm_reqs *r,
                  tsr_error *err) {
    if (!c->is_mpi) return tsr_err(err, TSR_EINVAL, "point to point on a group of one rank");
    for (size_t off = 0; off < n || off == 0; off += TSR_MPI_CHUNK) {
        int len = (int)(n - off < TSR_MPI_CHUNK ? n - off : TSR_MPI_CHUNK);
        MPI_Request q;
        int rc = send ? MPI_Isend((char *)buf + off, len, MPI_BYTE, (int)peer, tag, c->comm, &q)
                      : MPI_Irecv((char *)buf + off, len, MPI_BYTE, (int)peer, tag, c->comm, &q);
        if (rc != MPI_SUCCESS) return tsr_mpi_err(err, rc, send ? "Isend" : "Irecv");
        if (reqs_push(r, q)) return tsr_err(err, TSR_ENOMEM, "out of memory");
        if (n == 0) break;
    }
    return 0;
}

int tsr_comm_isend(tsr_comm *c, uint32_t peer, int tag, const void *buf, size_t n, tsr_comm_reqs *r,
                   tsr_error *err) {
    return p2p_nb(c, 1, peer, tag, (void *)buf, n, r, err);
}

int tsr_comm_irecv(tsr_comm *c, uint32_t peer, int tag, void *buf, size_t n, tsr_comm_reqs *r,
                   tsr_error *err) {
    return p2p_nb(c, 0, peer, tag, buf, n, r, err);
}

size_t tsr_comm_reqs_count(const tsr_comm_reqs *r) { return r->n; }

int tsr_comm_waitany(tsr_comm *c, tsr_comm_reqs *r, size_t *index, tsr_error *err) {
    (void)c;
    int i = MPI_UNDEFINED, rc = r->n ? MPI_Waitany((int)r->n, r->v, &i, MPI_STATUS_IGNORE) : MPI_SUCCESS;
    if (rc != MPI_SUCCESS) return tsr_mpi_err(err, rc, "Waitany");
    if (i == MPI_UNDEFINED) r->n = 0;
    *index = i == MPI_UNDEFINED ? SIZE_MAX : (size_t)i;
    return 0;
}

int tsr_comm_waitall(tsr_comm *c, tsr_comm_reqs *r, tsr_error *err) {
    if (!r->n) return 0;
    int rc = MPI_Waitall((int)r->n, r->v, MPI_STATUSES_IGNORE);
    r->n = 0;
    return rc == MPI_SUCCESS ? 0 : tsr_mpi_err(err, rc, "Waitall");
}
