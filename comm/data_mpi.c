/* data_mpi.c: the data plane (data_plane.h) over MPI, host memory. f32 and f64 go to
 * MPI as they are; bf16 is moved as 16-bit words and summed in f32 (MPI has no
 * bf16), rounded to bf16 once at the end. A call with a stream goes to NCCL in the
 * CUDA build (data_nccl.c) and is refused in the others. */

#ifdef TSR_CUDA
#define ON_STREAM(call) \
    if (s) return call
#else
#define ON_STREAM(call)
#endif
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "casts.h"
#include "comm_mpi.h"
#include "data_nccl.h"
#include "data_plane.h"

/* Elements of one MPI_Allreduce; bf16 sums convert this many at a time. */
#define ALLREDUCE_CHUNK (TSR_MPI_CHUNK / 8)

static double data_seconds; /* tsr_data_seconds() */

/* The MPI type that carries dt (bf16: its 16-bit words), or 0 (with err) when
 * the plane does not carry dt; also refuses streams, which need devices. */
static int carry(tsr_dtype dt, tsr_stream *s, const char *what, MPI_Datatype *t, size_t *esz, tsr_error *err) {
    if (s) return tsr_err(err, TSR_EINVAL, "%s: a stream needs a build with devices (this one has the host only)", what);
    switch (dt) {
    case TSR_F32: *t = MPI_FLOAT; break;
    case TSR_F64: *t = MPI_DOUBLE; break;
    case TSR_BF16: *t = MPI_UINT16_T; break;
    default: return tsr_err(err, TSR_EINVAL, "%s of %s: the data plane carries f32, f64 and bf16", what, tsr_dtype_name(dt));
    }
    *esz = tsr_dtype_size(dt);
    return 0;
}

static void bf16_to_f32(float *dst, const uint16_t *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = tsr_bf16_to_f32(src[i]);
}

static void f32_to_bf16(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = tsr_f32_to_bf16(src[i]);
}

/* ----------------------------------------------------------- all-reduce */

/* In place, ALLREDUCE_CHUNK elements per call. */
static int allreduce_native(tsr_comm *c, void *buf, size_t n, MPI_Datatype t, size_t esz, tsr_error *err) {
    for (size_t off = 0; off < n; off += ALLREDUCE_CHUNK) {
        int len = (int)(n - off < ALLREDUCE_CHUNK ? n - off : ALLREDUCE_CHUNK);
        int rc;
        TSR_MPI_COLL(rc, MPI_Allreduce, MPI_Iallreduce, MPI_IN_PLACE, (char *)buf + off * esz, len, t, MPI_SUM, c->comm);
        if (rc != MPI_SUCCESS) return tsr_mpi_err(err, rc, "Allreduce");
    }
    return 0;
}

/* bf16: each chunk widened to f32, summed, rounded back. */
static int allreduce_bf16(tsr_comm *c, uint16_t *buf, size_t n, tsr_error *err) {
    size_t step = n < (1 << 20) ? n : (1 << 20);
    float *tmp = malloc((step ? step : 1) * sizeof *tmp);
    if (!tmp) return tsr_err(err, TSR_ENOMEM, "out of memory for an all-reduce of %zu bf16", n);
    int rc = 0;
    for (size_t off = 0; off < n && !rc; off += step) {
        size_t len = n - off < step ? n - off : step;
        bf16_to_f32(tmp, buf + off, len);
        rc = allreduce_native(c, tmp, len, MPI_FLOAT, sizeof *tmp, err);
        if (!rc) f32_to_bf16(buf + off, tmp, len);
    }
    free(tmp);
    return rc;
}

static int data_allreduce_sum_untimed(tsr_comm *c, tsr_dtype dt, void *buf, size_t n, tsr_stream *s, tsr_error *err) {
    ON_STREAM(tsr_nccl_allreduce_sum(c, dt, buf, n, s, err));
    MPI_Datatype t = MPI_DATATYPE_NULL;
    size_t esz = 0;
    int rc = carry(dt, s, "all-reduce", &t, &esz, err);
    if (rc || !c->is_mpi) return rc;
    return dt == TSR_BF16 ? allreduce_bf16(c, buf, n, err) : allreduce_native(c, buf, n, t, esz, err);
}

/* ------------------------------------------ all-gather, reduce-scatter */

/* MPI counts are ints: element counts of one call must fit. cnt and displs get
 * the group's size; *total the sum of counts. */
static int int_counts(tsr_comm *c, const size_t *counts, int **cnt, int **displs, size_t *total, const char *what,
                      tsr_error *err) {
    *cnt = malloc(c->size * sizeof **cnt);
    *displs = malloc(c->size * sizeof **displs);
    if (!*cnt || !*displs) return tsr_err(err, TSR_ENOMEM, "out of memory");
    size_t d = 0;
    for (uint32_t i = 0; i < c->size; i++) {
        if (counts[i] > INT_MAX || d > INT_MAX) return tsr_err(err, TSR_EINVAL, "%s: over INT_MAX elements", what);
        (*cnt)[i] = (int)counts[i];
        (*displs)[i] = (int)d;
        d += counts[i];
    }
    *total = d;
    return 0;
}

/* One rank: its own part, moved into place. */
static void self_part(const void *send, void *recv, size_t n, size_t esz) {
    if (send != recv && n) memmove(recv, send, n * esz);
}

static int data_allgatherv_untimed(tsr_comm *c, tsr_dtype dt, const void *send, void *recv, const size_t *counts,
                        tsr_stream *s, tsr_error *err) {
    ON_STREAM(tsr_nccl_allgatherv(c, dt, send, recv, counts, s, err));
    MPI_Datatype t = MPI_DATATYPE_NULL;
    size_t esz = 0, total = 0;
    int rc = carry(dt, s, "all-gather", &t, &esz, err);
    if (rc) return rc;
    if (!c->is_mpi) {
        self_part(send, recv, counts[0], esz);
        return 0;
    }
    int *cnt = NULL, *displs = NULL;
    rc = int_counts(c, counts, &cnt, &displs, &total, "Allgatherv", err);
    if (!rc) {
        const void *sb = send == (char *)recv + (size_t)displs[c->rank] * esz ? MPI_IN_PLACE : send;
        int r;
        TSR_MPI_COLL(r, MPI_Allgatherv, MPI_Iallgatherv, sb, cnt[c->rank], t, recv, cnt, displs, t, c->comm);
        if (r != MPI_SUCCESS) rc = tsr_mpi_err(err, r, "Allgatherv");
    }
    free(cnt), free(displs);
    return rc;
}

/* bf16: the whole send widened to f32, the rank's part rounded back. */
static int reduce_scatter_bf16(tsr_comm *c, const uint16_t *send, uint16_t *recv, const int *cnt, size_t total,
                               tsr_error *err) {
    size_t mine = (size_t)cnt[c->rank];
    float *wide = malloc((total ? total : 1) * sizeof *wide), *part = malloc((mine ? mine : 1) * sizeof *part);
    int rc = 0;
    if (!wide || !part) rc = tsr_err(err, TSR_ENOMEM, "out of memory for a reduce-scatter of %zu bf16", total);
    if (!rc) {
        bf16_to_f32(wide, send, total);
        int r;
        TSR_MPI_COLL(r, MPI_Reduce_scatter, MPI_Ireduce_scatter, wide, part, cnt, MPI_FLOAT, MPI_SUM, c->comm);
        if (r != MPI_SUCCESS) rc = tsr_mpi_err(err, r, "Reduce_scatter");
        else f32_to_bf16(recv, part, mine);
    }
    free(wide), free(part);
    return rc;
}

static int data_reduce_scatterv_untimed(tsr_comm *c, tsr_dtype dt, const void *send, void *recv, const size_t *counts,
                             tsr_stream *s, tsr_error *err) {
    ON_STREAM(tsr_nccl_reduce_scatterv(c, dt, send, recv, counts, s, err));
    MPI_Datatype t = MPI_DATATYPE_NULL;
    size_t esz = 0, total = 0;
    int rc = carry(dt, s, "reduce-scatter", &t, &esz, err);
    if (rc) return rc;
    if (!c->is_mpi) {
        self_part(send, recv, counts[0], esz);
        return 0;
    }
    int *cnt = NULL, *displs = NULL;
    rc = int_counts(c, counts, &cnt, &displs, &total, "Reduce_scatter", err);
    if (!rc && dt == TSR_BF16) {
        rc = reduce_scatter_bf16(c, send, recv, cnt, total, err);
    } else if (!rc) {
        int r;
        TSR_MPI_COLL(r, MPI_Reduce_scatter, MPI_Ireduce_scatter, send, recv, cnt, t, MPI_SUM, c->comm);
        if (r != MPI_SUCCESS) rc = tsr_mpi_err(err, r, "Reduce_scatter");
    }
    free(cnt), free(displs);
    return rc;
}

/* counts of n for each of the group's ranks (malloc'ed), or NULL. */
static size_t *even_counts(const tsr_comm *c, size_t n, tsr_error *err) {
    size_t *counts = malloc(c->size * sizeof *counts);
    if (!counts) tsr_err(err, TSR_ENOMEM, "out of memory");
    for (uint32_t i = 0; counts && i < c->size; i++) counts[i] = n;
    return counts;
}

int tsr_data_allgather(tsr_comm *c, tsr_dtype dt, const void *send, void *recv, size_t n, tsr_stream *s,
                       tsr_error *err) {
    size_t *counts = even_counts(c, n, err);
    if (!counts) return TSR_ENOMEM;
    int rc = tsr_data_allgatherv(c, dt, send, recv, counts, s, err);
    free(counts);
    return rc;
}

int tsr_data_reduce_scatter(tsr_comm *c, tsr_dtype dt, const void *send, void *recv, size_t n, tsr_stream *s,
                            tsr_error *err) {
    size_t *counts = even_counts(c, n, err);
    if (!counts) return TSR_ENOMEM;
    int rc = tsr_data_reduce_scatterv(c, dt, send, recv, counts, s, err);
    free(counts);
    return rc;
}

/* -------------------------------------------------------- point to point */

static int data_send_untimed(tsr_comm *c, uint32_t peer, int tag, tsr_dtype dt, const void *buf, size_t n,
                  tsr_comm_reqs *pending, tsr_stream *s, tsr_error *err) {
    ON_STREAM(tsr_nccl_send(c, peer, dt, buf, n, s, err));
    MPI_Datatype t = MPI_DATATYPE_NULL;
    size_t esz = 0;
    int rc = carry(dt, s, "send", &t, &esz, err);
    return rc ? rc : tsr_comm_isend(c, peer, tag, buf, n * esz, pending, err);
}

static int data_recv_untimed(tsr_comm *c, uint32_t peer, int tag, tsr_dtype dt, void *buf, size_t n, tsr_stream *s,
                  tsr_error *err) {
    ON_STREAM(tsr_nccl_recv(c, peer, dt, buf, n, s, err));
    MPI_Datatype t = MPI_DATATYPE_NULL;
    size_t esz = 0;
    int rc = carry(dt, s, "recv", &t, &esz, err);
    return rc ? rc : tsr_comm_recv(c, peer, tag, buf, n * esz, err);
}

static int data_wait_untimed(tsr_comm *c, tsr_comm_reqs *pending, tsr_stream *s, tsr_error *err) {
    ON_STREAM(tsr_nccl_wait(s, err));
    if (s) return tsr_err(err, TSR_EINVAL, "wait: a stream needs a build with devices (this one has the host only)");
    return tsr_comm_waitall(c, pending, err);
}

/* ------------------------------------------------------------- timing */

/* The public calls: each one's wall time is added to data_seconds; a call on
 * a stream returns once queued, and its time on the stream is NCCL's to add
 * (tsr_nccl_seconds, by events). */
#define ADD_TIME(s, t0) \
    if (!(s)) data_seconds += tsr_now() - (t0)

int tsr_data_allreduce_sum(tsr_comm *c, tsr_dtype dt, void *buf, size_t n, tsr_stream *s, tsr_error *err) {
    double t0 = tsr_now();
    int rc = data_allreduce_sum_untimed(c, dt, buf, n, s, err);
    ADD_TIME(s, t0);
    return rc;
}

int tsr_data_allgatherv(tsr_comm *c, tsr_dtype dt, const void *send, void *recv, const size_t *counts,
                        tsr_stream *s, tsr_error *err) {
    double t0 = tsr_now();
    int rc = data_allgatherv_untimed(c, dt, send, recv, counts, s, err);
    ADD_TIME(s, t0);
    return rc;
}

int tsr_data_reduce_scatterv(tsr_comm *c, tsr_dtype dt, const void *send, void *recv, const size_t *counts,
                             tsr_stream *s, tsr_error *err) {
    double t0 = tsr_now();
    int rc = data_reduce_scatterv_untimed(c, dt, send, recv, counts, s, err);
    ADD_TIME(s, t0);
    return rc;
}

int tsr_data_send(tsr_comm *c, uint32_t peer, int tag, tsr_dtype dt, const void *buf, size_t n,
                  tsr_comm_reqs *pending, tsr_stream *s, tsr_error *err) {
    double t0 = tsr_now();
    int rc = data_send_untimed(c, peer, tag, dt, buf, n, pending, s, err);
    ADD_TIME(s, t0);
    return rc;
}

int tsr_data_recv(tsr_comm *c, uint32_t peer, int tag, tsr_dtype dt, void *buf, size_t n, tsr_stream *s,
                  tsr_error *err) {
    double t0 = tsr_now();
    int rc = data_recv_untimed(c, peer, tag, dt, buf, n, s, err);
    ADD_TIME(s, t0);
    return rc;
}

int tsr_data_wait(tsr_comm *c, tsr_comm_reqs *pending, tsr_stream *s, tsr_error *err) {
    double t0 = tsr_now();
    int rc = data_wait_untimed(c, pending, s, err);
    ADD_TIME(s, t0);
    return rc;
}

double tsr_data_seconds(void) {
#ifdef TSR_CUDA
    return data_seconds + tsr_nccl_seconds();
#else
    return data_seconds;
#endif
}
