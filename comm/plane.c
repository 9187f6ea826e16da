/* plane.c: the data plane over a kernel context's memory: passed through to
 * MPI (host memory) or NCCL (a device's, on the context's stream), or staged
 * through host memory by the context's copies. */
#include "plane.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"

void tsr_plane_init(tsr_plane *p, tsr_kctx *kc, int staged) {
    memset(p, 0, sizeof *p);
    p->kc = kc;
    p->staged = staged || kc->mem == TSR_MEM_GUARD;
}

void tsr_plane_free(tsr_plane *p) {
    free(p->host);
    for (size_t i = 0; i < p->n_sends; i++) free(p->sends[i]);
    free(p->sends);
    memset(p, 0, sizeof *p);
}

/* The stream the data plane is given unstaged: none for host memory. */
static tsr_stream *stream(const tsr_plane *p) { return p->kc->mem == TSR_MEM_HOST ? NULL : p->kc->stream; }

/* Host staging of at least `bytes`. */
static void *host(tsr_plane *p, size_t bytes, tsr_error *err) {
    if (bytes > p->cap) {
        void *h = realloc(p->host, bytes);
        if (!h) {
            tsr_err(err, TSR_ENOMEM, "out of memory for %zu bytes of staging for the data plane", bytes);
            return NULL;
        }
        p->host = h, p->cap = bytes;
    }
    return p->host;
}

static size_t sum(const size_t *counts, uint32_t n) {
    size_t s = 0;
    for (uint32_t i = 0; i < n; i++) s += counts[i];
    return s;
}

/* n for every rank of the group (malloc'd), or NULL with TSR_ENOMEM. */
static size_t *even_counts(tsr_comm *c, size_t n, tsr_error *err) {
    uint32_t size = tsr_comm_size(c);
    size_t *counts = malloc(size * sizeof *counts);
    if (!counts) tsr_err(err, TSR_ENOMEM, "out of memory");
    for (uint32_t i = 0; counts && i < size; i++) counts[i] = n;
    return counts;
}

int tsr_plane_allreduce_sum(tsr_plane *p, tsr_comm *c, tsr_dtype dt, void *buf, size_t n, tsr_error *err) {
    if (!p->staged) return tsr_data_allreduce_sum(c, dt, buf, n, stream(p), err);
    size_t bytes = n * tsr_dtype_size(dt);
    void *h = host(p, bytes, err);
    if (!h) return err ? err->code : TSR_ENOMEM;
    int rc = tsr_kc_to_host(p->kc, h, buf, bytes, err);
    if (!rc) rc = tsr_data_allreduce_sum(c, dt, h, n, NULL, err);
    if (!rc) rc = tsr_kc_from_host(p->kc, buf, h, bytes, err);
    return rc;
}

int tsr_plane_allgatherv(tsr_plane *p, tsr_comm *c, tsr_dtype dt, const void *send, void *recv, const size_t *counts,
                         tsr_error *err) {
    if (!p->staged) return tsr_data_allgatherv(c, dt, send, recv, counts, stream(p), err);
    uint32_t me = tsr_comm_rank(c), size = tsr_comm_size(c);
    size_t es = tsr_dtype_size(dt), total = sum(counts, size), disp = sum(counts, me);
    char *h = host(p, total * es + 1, err);
    if (!h) return err ? err->code : TSR_ENOMEM;
    /* mine at its place in the result: the gather runs in place */
    int rc = tsr_kc_to_host(p->kc, h + disp * es, send, counts[me] * es, err);
    if (!rc) rc = tsr_data_allgatherv(c, dt, h + disp * es, h, counts, NULL, err);
    if (!rc) rc = tsr_kc_from_host(p->kc, recv, h, total * es, err);
    return rc;
}

int tsr_plane_allgather(tsr_plane *p, tsr_comm *c, tsr_dtype dt, const void *send, void *recv, size_t n,
                        tsr_error *err) {
    if (!p->staged) return tsr_data_allgather(c, dt, send, recv, n, stream(p), err);
    size_t *counts = even_counts(c, n, err);
    if (!counts) return TSR_ENOMEM;
    int rc = tsr_plane_allgatherv(p, c, dt, send, recv, counts, err);
    free(counts);
    return rc;
}

int tsr_plane_reduce_scatterv(tsr_plane *p, tsr_comm *c, tsr_dtype dt, const void *send, void *recv,
                              const size_t *counts, tsr_error *err) {
    if (!p->staged) return tsr_data_reduce_scatterv(c, dt, send, recv, counts, stream(p), err);
    uint32_t me = tsr_comm_rank(c), size = tsr_comm_size(c);
    size_t es = tsr_dtype_size(dt), total = sum(counts, size);
    char *h = host(p, (total + counts[me]) * es + 1, err);
    if (!h) return err ? err->code : TSR_ENOMEM;
    int rc = tsr_kc_to_host(p->kc, h, send, total * es, err);
    if (!rc) rc = tsr_data_reduce_scatterv(c, dt, h, h + total * es, counts, NULL, err);
    if (!rc) rc = tsr_kc_from_host(p->kc, recv, h + total * es, counts[me] * es, err);
    return rc;
}

int tsr_plane_reduce_scatter(tsr_plane *p, tsr_comm *c, tsr_dtype dt, const void *send, void *recv, size_t n,
                             tsr_error *err) {
    if (!p->staged) return tsr_data_reduce_scatter(c, dt, send, recv, n, stream(p), err);
    size_t *counts = even_counts(c, n, err);
    if (!counts) return TSR_ENOMEM;
    int rc = tsr_plane_reduce_scatterv(p, c, dt, send, recv, counts, err);
    free(counts);
    return rc;
}

int tsr_plane_send(tsr_plane *p, tsr_comm *c, uint32_t peer, int tag, tsr_dtype dt, const void *buf, size_t n,
                   tsr_comm_reqs *pending, tsr_error *err) {
    if (!p->staged) return tsr_data_send(c, peer, tag, dt, buf, n, pending, stream(p), err);
    size_t bytes = n * tsr_dtype_size(dt);
    void *h = malloc(bytes + 1);
    if (!h || tsr_grow((void **)&p->sends, &p->cap_sends, p->n_sends, sizeof *p->sends)) {
        free(h);
        return tsr_err(err, TSR_ENOMEM, "out of memory for a staged send of %zu bytes", bytes);
    }
    p->sends[p->n_sends++] = h; /* freed by tsr_plane_wait, after the send */
    int rc = tsr_kc_to_host(p->kc, h, buf, bytes, err);
    return rc ? rc : tsr_data_send(c, peer, tag, dt, h, n, pending, NULL, err);
}

int tsr_plane_recv(tsr_plane *p, tsr_comm *c, uint32_t peer, int tag, tsr_dtype dt, void *buf, size_t n,
                   tsr_error *err) {
    if (!p->staged) return tsr_data_recv(c, peer, tag, dt, buf, n, stream(p), err);
    size_t bytes = n * tsr_dtype_size(dt);
    void *h = host(p, bytes + 1, err);
    if (!h) return err ? err->code : TSR_ENOMEM;
    int rc = tsr_data_recv(c, peer, tag, dt, h, n, NULL, err);
    return rc ? rc : tsr_kc_from_host(p->kc, buf, h, bytes, err);
}

int tsr_plane_wait(tsr_plane *p, tsr_comm *c, tsr_comm_reqs *pending, tsr_error *err) {
    int rc = tsr_data_wait(c, pending, p->staged ? NULL : stream(p), err);
    for (size_t i = 0; i < p->n_sends; i++) free(p->sends[i]);
    p->n_sends = 0;
    return rc;
}
