/* comm_mpi.c: the communication interface over MPI (host memory), and the group
 * of one rank. Messages larger than INT_MAX bytes are split. */
#include <limits.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

struct tsr_comm {
    int is_mpi;
    MPI_Comm comm;
    uint32_t rank, size;
    int finalize; /* MPI_Finalize on free: this comm initialized MPI */
};

#define CHUNK (1 << 30)

tsr_comm *tsr_comm_self(void) {
    tsr_comm *c = calloc(1, sizeof *c);
    if (c) c->size = 1;
    return c;
}

static int mpi_err(tsr_error *err, int rc, const char *what) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return tsr_err(err, TSR_EIO, "MPI %s failed: %.*s", what, len, msg);
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
    if (c->is_mpi) {
        int rc = MPI_Comm_dup(c->comm, &d->comm);
        if (rc != MPI_SUCCESS) {
            mpi_err(err, rc, "Comm_dup");
            free(d);
            return NULL;
        }
        MPI_Comm_set_errhandler(d->comm, MPI_ERRORS_RETURN);
    }
    return d;
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
        mpi_err(err, rc, "Comm_split");
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
    *d = (tsr_comm){1, nc, (uint32_t)r, (uint32_t)s, 0};
    return d;
}

void tsr_comm_free(tsr_comm *c) {
    if (!c) return;
    if (c->is_mpi && c->comm != MPI_COMM_WORLD) MPI_Comm_free(&c->comm);
    if (c->finalize) MPI_Finalize();
    free(c);
}

uint32_t tsr_comm_rank(const tsr_comm *c) { return c->rank; }
uint32_t tsr_comm_size(const tsr_comm *c) { return c->size; }

int tsr_comm_barrier(tsr_comm *c, tsr_error *err) {
    if (!c->is_mpi) return 0;
    int rc = MPI_Barrier(c->comm);
    return rc == MPI_SUCCESS ? 0 : mpi_err(err, rc, "Barrier");
}

int tsr_comm_bcast(tsr_comm *c, uint32_t root, void *buf, size_t n, tsr_error *err) {
    if (!c->is_mpi) return 0;
    for (size_t off = 0; off < n || (n == 0 && off == 0); off += CHUNK) {
        int len = (int)(n - off < CHUNK ? n - off : CHUNK);
        int rc = MPI_Bcast((char *)buf + off, len, MPI_BYTE, (int)root, c->comm);
        if (rc != MPI_SUCCESS) return mpi_err(err, rc, "Bcast");
        if (n == 0) break;
    }
    return 0;
}

int tsr_comm_allreduce_min(tsr_comm *c, int64_t *v, tsr_error *err) {
    if (!c->is_mpi) return 0;
    int64_t in = *v;
    int rc = MPI_Allreduce(&in, v, 1, MPI_INT64_T, MPI_MIN, c->comm);
    return rc == MPI_SUCCESS ? 0 : mpi_err(err, rc, "Allreduce");
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
        int r = MPI_Allgather(&mine, 1, MPI_UINT64_T, all_n, 1, MPI_UINT64_T, c->comm);
        if (r != MPI_SUCCESS) rc = mpi_err(err, r, "Allgather");
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
        int r = MPI_Allgatherv(buf, (int)n, MPI_BYTE, out, rc_cnt, displs, MPI_BYTE, c->comm);
        if (r != MPI_SUCCESS) rc = mpi_err(err, r, "Allgatherv");
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

int tsr_comm_send(tsr_comm *c, uint32_t peer, int tag, const void *buf, size_t n, tsr_error *err) {
    if (!c->is_mpi) return tsr_err(err, TSR_EINVAL, "send on a group of one rank");
    for (size_t off = 0; off < n || off == 0; off += CHUNK) {
        int len = (int)(n - off < CHUNK ? n - off : CHUNK);
        int rc = MPI_Send((const char *)buf + off, len, MPI_BYTE, (int)peer, tag, c->comm);
        if (rc != MPI_SUCCESS) return mpi_err(err, rc, "Send");
        if (n == 0) break;
    }
    return 0;
}

int tsr_comm_recv(tsr_comm *c, uint32_t peer, int tag, void *buf, size_t n, tsr_error *err) {
    if (!c->is_mpi) return tsr_err(err, TSR_EINVAL, "recv on a group of one rank");
    for (size_t off = 0; off < n || off == 0; off += CHUNK) {
        int len = (int)(n - off < CHUNK ? n - off : CHUNK);
        int rc = MPI_Recv((char *)buf + off, len, MPI_BYTE, (int)peer, tag, c->comm, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_err(err, rc, "Recv");
        if (n == 0) break;
    }
    return 0;
}

int tsr_comm_gatherv(tsr_comm *c, uint32_t root, const void *buf, size_t n, uint8_t **all,
                     size_t **counts, tsr_error *err) {
    *all = NULL;
    *counts = NULL;
    if (!c->is_mpi) return tsr_comm_allgatherv(c, buf, n, all, counts, err);
    uint64_t mine = n;
    int is_root = c->rank == root;
    uint64_t *all_n = is_root ? calloc(c->size, sizeof *all_n) : NULL;
    int *cnt = is_root ? calloc(c->size, sizeof *cnt) : NULL, *displs = is_root ? calloc(c->size, sizeof *displs) : NULL;
    size_t *sizes = is_root ? calloc(c->size, sizeof *sizes) : NULL;
    int rc = is_root && (!all_n || !cnt || !displs || !sizes) ? tsr_err(err, TSR_ENOMEM, "out of memory") : 0;
    /* every rank takes part in both collectives, even after a local failure */
    int r = MPI_Gather(&mine, 1, MPI_UINT64_T, all_n, 1, MPI_UINT64_T, (int)root, c->comm);
    if (!rc && r != MPI_SUCCESS) rc = mpi_err(err, r, "Gather");
    uint8_t *out = NULL;
    uint64_t total = 0;
    if (is_root && !rc) {
        for (uint32_t i = 0; i < c->size; i++) total += all_n[i];
        if (total > INT_MAX) rc = tsr_err(err, TSR_EINVAL, "gather of %llu bytes: over 2 GiB", (unsigned long long)total);
        else if (!(out = malloc(total ? total : 1))) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
        int d = 0;
        for (uint32_t i = 0; !rc && i < c->size; i++) {
            cnt[i] = (int)all_n[i];
            sizes[i] = all_n[i];
            displs[i] = d;
            d += cnt[i];
        }
    }
    r = MPI_Gatherv(buf, (int)n, MPI_BYTE, out, cnt, displs, MPI_BYTE, (int)root, c->comm);
    if (!rc && r != MPI_SUCCESS) rc = mpi_err(err, r, "Gatherv");
    free(all_n), free(cnt), free(displs);
    if (rc) {
        free(out), free(sizes);
        return rc;
    }
    *all = out;
    *counts = sizes;
    return 0;
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
    for (size_t off = 0; off < n || off == 0; off += CHUNK) {
        int len = (int)(n - off < CHUNK ? n - off : CHUNK);
        MPI_Request q;
        int rc = send ? MPI_Isend((char *)buf + off, len, MPI_BYTE, (int)peer, tag, c->comm, &q)
                      : MPI_Irecv((char *)buf + off, len, MPI_BYTE, (int)peer, tag, c->comm, &q);
        if (rc != MPI_SUCCESS) return mpi_err(err, rc, send ? "Isend" : "Irecv");
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

int tsr_comm_waitall(tsr_comm *c, tsr_comm_reqs *r, tsr_error *err) {
    if (!r->n) return 0;
    int rc = MPI_Waitall((int)r->n, r->v, MPI_STATUSES_IGNORE);
    r->n = 0;
    return rc == MPI_SUCCESS ? 0 : mpi_err(err, rc, "Waitall");
}

/* ------------------------------------------------------ float collectives */

/* MPI counts are ints: element counts of one call must fit. */
static int int_counts(tsr_comm *c, const size_t *counts, int *cnt, int *displs, const char *what,
                      tsr_error *err) {
    size_t d = 0;
    for (uint32_t i = 0; i < c->size; i++) {
        if (counts[i] > INT_MAX || d > INT_MAX)
            return tsr_err(err, TSR_EINVAL, "%s: over INT_MAX elements", what);
        cnt[i] = (int)counts[i];
        displs[i] = (int)d;
        d += counts[i];
    }
    return 0;
}

static int allreduce_sum(tsr_comm *c, void *buf, size_t n, MPI_Datatype t, size_t esz, tsr_error *err) {
    if (!c->is_mpi) return 0;
    for (size_t off = 0; off < n; off += CHUNK / 8) {
        int len = (int)(n - off < CHUNK / 8 ? n - off : CHUNK / 8);
        int rc = MPI_Allreduce(MPI_IN_PLACE, (char *)buf + off * esz, len, t, MPI_SUM, c->comm);
        if (rc != MPI_SUCCESS) return mpi_err(err, rc, "Allreduce");
    }
    return 0;
}

int tsr_comm_allreduce_sum_f32(tsr_comm *c, float *buf, size_t n, tsr_error *err) {
    return allreduce_sum(c, buf, n, MPI_FLOAT, sizeof *buf, err);
}

int tsr_comm_allreduce_sum_f64(tsr_comm *c, double *buf, size_t n, tsr_error *err) {
    return allreduce_sum(c, buf, n, MPI_DOUBLE, sizeof *buf, err);
}

/* Allgatherv (gather = 1) or Reduce_scatter (sum) of f32 with per-rank counts. */
static int varcount_f32(tsr_comm *c, int gather, const float *send, float *recv, const size_t *counts,
                        tsr_error *err) {
    if (!c->is_mpi) {
        if (send != recv && counts[0]) memmove(recv, send, counts[0] * sizeof *recv);
        return 0;
    }
    const char *what = gather ? "Allgatherv" : "Reduce_scatter";
    int *cnt = malloc(c->size * sizeof *cnt), *displs = malloc(c->size * sizeof *displs);
    int rc = (!cnt || !displs) ? tsr_err(err, TSR_ENOMEM, "out of memory")
                               : int_counts(c, counts, cnt, displs, what, err);
    if (!rc) {
        int r;
        if (gather) {
            const void *sb = send == recv + displs[c->rank] ? MPI_IN_PLACE : send;
            r = MPI_Allgatherv(sb, cnt[c->rank], MPI_FLOAT, recv, cnt, displs, MPI_FLOAT, c->comm);
        } else {
            r = MPI_Reduce_scatter(send, recv, cnt, MPI_FLOAT, MPI_SUM, c->comm);
        }
        if (r != MPI_SUCCESS) rc = mpi_err(err, r, what);
    }
    free(cnt), free(displs);
    return rc;
}

int tsr_comm_allgatherv_f32(tsr_comm *c, const float *send, float *recv, const size_t *counts,
                            tsr_error *err) {
    return varcount_f32(c, 1, send, recv, counts, err);
}

int tsr_comm_reduce_scatterv_f32(tsr_comm *c, const float *send, float *recv, const size_t *counts,
                                 tsr_error *err) {
    return varcount_f32(c, 0, send, recv, counts, err);
}
