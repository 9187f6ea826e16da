/* data_nccl.c: the data plane on a stream, over NCCL (data_nccl.h). Built with
 * TSR_CUDA only. NCCL has no v-collectives: uneven all-gathers are grouped
 * broadcasts and uneven reduce-scatters grouped reduces, one per rank. */
#ifdef TSR_CUDA
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>

#include "comm_mpi.h"
#include "common.h"
#include "data_nccl.h"
#include "tsr_cuda.h"

static int nccl_err(tsr_error *err, ncclResult_t r, const char *what) {
    return tsr_err(err, TSR_EIO, "NCCL %s failed: %s", what, ncclGetErrorString(r));
}
static int cuda_err(tsr_error *err, cudaError_t e, const char *what) {
    return tsr_err(err, e == cudaErrorMemoryAllocation ? TSR_ENOMEM : TSR_EIO, "cuda: %s: %s", what, cudaGetErrorString(e));
}
static cudaStream_t stream(tsr_stream *s) { return (cudaStream_t)s; }

/* Destroys the group's communicator (tsr_comm_free calls it). */
static void nccl_free(tsr_comm *c) {
    if (c->nccl) ncclCommDestroy((ncclComm_t)c->nccl);
    c->nccl = NULL;
}

/* The group's communicator, made on first use. */
static int comm_of(tsr_comm *c, ncclComm_t *out, tsr_error *err) {
    if (!c->nccl) {
        ncclUniqueId id;
        ncclResult_t r = ncclSuccess;
        if (c->rank == 0 && (r = ncclGetUniqueId(&id)) != ncclSuccess) return nccl_err(err, r, "GetUniqueId");
        if (c->is_mpi) {
            int m = MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, c->comm);
            if (m != MPI_SUCCESS) return tsr_mpi_err(err, m, "Bcast of the NCCL id");
        }
        ncclComm_t nc;
        if ((r = ncclCommInitRank(&nc, (int)c->size, id, (int)c->rank)) != ncclSuccess)
            return nccl_err(err, r, "CommInitRank");
        c->nccl = nc;
        c->nccl_free = nccl_free;
    }
    *out = (ncclComm_t)c->nccl;
    return 0;
}

/* The NCCL type of dt; bf16 travels as f32 in sums (see widen). */
static int type_of(tsr_dtype dt, const char *what, ncclDataType_t *t, size_t *esz, tsr_error *err) {
    switch (dt) {
    case TSR_F32: *t = ncclFloat32; break;
    case TSR_F64: *t = ncclFloat64; break;
    case TSR_BF16: *t = ncclBfloat16; break;
    default: return tsr_err(err, TSR_EINVAL, "%s of %s: the data plane carries f32, f64 and bf16", what, tsr_dtype_name(dt));
    }
    *esz = tsr_dtype_size(dt);
    return 0;
}

/* A device buffer of n f32 on the stream's pool (freed with cudaFreeAsync). */
static int scratch(float **out, size_t n, tsr_stream *s, tsr_error *err) {
    cudaError_t e = cudaMallocAsync((void **)out, (n ? n : 1) * sizeof **out, stream(s));
    return e == cudaSuccess ? 0 : cuda_err(err, e, "scratch for a bf16 sum");
}

static int nccl_allreduce_sum(tsr_comm *c, tsr_dtype dt, void *buf, size_t n, tsr_stream *s, tsr_error *err) {
    ncclComm_t nc;
    ncclDataType_t t = ncclFloat32;
    size_t esz = 0;
    int rc = type_of(dt, "all-reduce", &t, &esz, err);
    if (rc || (rc = comm_of(c, &nc, err)) || n == 0) return rc;
    if (dt != TSR_BF16) {
        ncclResult_t r = ncclAllReduce(buf, buf, n, t, ncclSum, nc, stream(s));
        return r == ncclSuccess ? 0 : nccl_err(err, r, "AllReduce");
    }
    float *wide = NULL; /* bf16: widened, summed in f32, rounded once */
    if ((rc = scratch(&wide, n, s, err))) return rc;
    tsr_cuda_bf16_to_f32(wide, buf, n, s);
    ncclResult_t r = ncclAllReduce(wide, wide, n, ncclFloat32, ncclSum, nc, stream(s));
    if (r == ncclSuccess) tsr_cuda_f32_to_bf16(buf, wide, n, s);
    cudaFreeAsync(wide, stream(s));
    return r == ncclSuccess ? 0 : nccl_err(err, r, "AllReduce");
}

/* 1 if every rank's count is counts[0]. */
static int even(const tsr_comm *c, const size_t *counts) {
    for (uint32_t i = 1; i < c->size; i++)
        if (counts[i] != counts[0]) return 0;
    return 1;
}

static int nccl_allgatherv(tsr_comm *c, tsr_dtype dt, const void *send, void *recv, const size_t *counts,
                        tsr_stream *s, tsr_error *err) {
    ncclComm_t nc;
    ncclDataType_t t = ncclFloat32;
    size_t esz = 0;
    int rc = type_of(dt, "all-gather", &t, &esz, err);
    if (rc || (rc = comm_of(c, &nc, err))) return rc;
    ncclResult_t r;
    if (even(c, counts)) {
        r = ncclAllGather(send, recv, counts[0], t, nc, stream(s));
        return r == ncclSuccess ? 0 : nccl_err(err, r, "AllGather");
    }
    size_t at = 0;
    ncclGroupStart();
    for (uint32_t i = 0; i < c->size; i++) {
        char *dst = (char *)recv + at * esz;
        if (counts[i]) ncclBroadcast(i == c->rank ? send : dst, dst, counts[i], t, (int)i, nc, stream(s));
        at += counts[i];
    }
    r = ncclGroupEnd();
    return r == ncclSuccess ? 0 : nccl_err(err, r, "grouped Broadcast (all-gatherv)");
}

/* f32 or f64: grouped reduces, rank i's part to rank i. */
static int reduce_parts(tsr_comm *c, ncclComm_t nc, ncclDataType_t t, size_t esz, const void *send, void *recv,
                        const size_t *counts, tsr_stream *s, tsr_error *err) {
    size_t at = 0;
    ncclGroupStart();
    for (uint32_t i = 0; i < c->size; i++) {
        if (counts[i]) ncclReduce((const char *)send + at * esz, recv, counts[i], t, ncclSum, (int)i, nc, stream(s));
        at += counts[i];
    }
    ncclResult_t r = ncclGroupEnd();
    return r == ncclSuccess ? 0 : nccl_err(err, r, "grouped Reduce (reduce-scatterv)");
}

static int nccl_reduce_scatterv(tsr_comm *c, tsr_dtype dt, const void *send, void *recv, const size_t *counts,
                             tsr_stream *s, tsr_error *err) {
    ncclComm_t nc;
    ncclDataType_t t = ncclFloat32;
    size_t esz = 0, total = 0;
    int rc = type_of(dt, "reduce-scatter", &t, &esz, err);
    if (rc || (rc = comm_of(c, &nc, err))) return rc;
    for (uint32_t i = 0; i < c->size; i++) total += counts[i];
    if (dt != TSR_BF16 && even(c, counts)) {
        ncclResult_t r = ncclReduceScatter(send, recv, counts[0], t, ncclSum, nc, stream(s));
        return r == ncclSuccess ? 0 : nccl_err(err, r, "ReduceScatter");
    }
    if (dt != TSR_BF16) return reduce_parts(c, nc, t, esz, send, recv, counts, s, err);
    float *wide = NULL, *part = NULL; /* bf16: widened, summed in f32, rounded once */
    size_t mine = counts[c->rank];
    if ((rc = scratch(&wide, total, s, err))) return rc;
    if (!(rc = scratch(&part, mine, s, err))) {
        tsr_cuda_bf16_to_f32(wide, send, total, s);
        rc = reduce_parts(c, nc, ncclFloat32, sizeof(float), wide, part, counts, s, err);
        if (!rc) tsr_cuda_f32_to_bf16(recv, part, mine, s);
        cudaFreeAsync(part, stream(s));
    }
    cudaFreeAsync(wide, stream(s));
    return rc;
}

/* ------------------------------------------------ time, and paired sends */

/* The time the stream spends in the calls: each call between two events,
 * whose intervals tsr_nccl_seconds adds up once they are done (the wall time
 * of a queued call says nothing: it returns at once). */
#define N_MARKS 256
static cudaEvent_t marks[2 * N_MARKS];
static int n_marks, n_made;
static double stream_seconds;

/* Adds up the intervals that are done (all of them, waiting, with wait). */
static void collect(int wait) {
    int i = 0;
    for (; i < n_marks; i++) {
        if (wait) cudaEventSynchronize(marks[2 * i + 1]);
        float ms = 0;
        cudaError_t e = cudaEventElapsedTime(&ms, marks[2 * i], marks[2 * i + 1]);
        if (e == cudaErrorNotReady) break;
        if (e == cudaSuccess) stream_seconds += ms / 1e3;
        else cudaGetLastError();
    }
    /* the pending ones to the front, keeping every event made */
    for (int j = 0; j + i < n_marks; j++) {
        cudaEvent_t a = marks[2 * j], b = marks[2 * j + 1];
        marks[2 * j] = marks[2 * (j + i)], marks[2 * j + 1] = marks[2 * (j + i) + 1];
        marks[2 * (j + i)] = a, marks[2 * (j + i) + 1] = b;
    }
    n_marks -= i;
}

/* The start (end = 0) or the end of a call on s. Timing is best effort: an
 * event that cannot be made leaves the call untimed. */
static int mark(tsr_stream *s, int end) {
    if (!end && n_marks == N_MARKS) collect(1);
    int k = 2 * n_marks + end;
    if (k >= n_made) {
        if (cudaEventCreate(&marks[k]) != cudaSuccess) {
            cudaGetLastError();
            return 0;
        }
        n_made = k + 1;
    }
    if (cudaEventRecord(marks[k], stream(s)) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    if (end) n_marks++;
    return 1;
}

double tsr_nccl_seconds(void) {
    collect(0);
    return stream_seconds;
}

/* Sends are held and queued with the next receive, in one NCCL group, or by
 * the next collective or wait: NCCL's point-to-point calls block the stream
 * until the peer's matching call runs, so that a 1F1B stage sending forward
 * while its neighbour sends back would deadlock unless each send goes with the
 * receive that follows it (send forward / receive backward, as one). */
typedef struct held_send {
    const void *buf;
    size_t n;
    ncclDataType_t t;
    int peer;
    ncclComm_t nc;
    tsr_stream *s;
} held_send;
static held_send *held;
static size_t n_held, cap_held;

/* The held sends, inside the caller's group. */
static int queue_held(tsr_error *err) {
    int rc = 0;
    for (size_t i = 0; i < n_held; i++) {
        const held_send *h = &held[i];
        ncclResult_t r = ncclSend(h->buf, h->n, h->t, h->peer, h->nc, stream(h->s));
        if (r != ncclSuccess && !rc) rc = nccl_err(err, r, "Send");
    }
    n_held = 0;
    return rc;
}

/* The held sends, as one group of their own. */
static int flush_sends(tsr_error *err) {
    if (!n_held) return 0;
    int rc = 0;
    mark(held[0].s, 0);
    tsr_stream *s = held[0].s;
    ncclGroupStart();
    rc = queue_held(err);
    ncclResult_t r = ncclGroupEnd();
    mark(s, 1);
    return rc ? rc : r == ncclSuccess ? 0 : nccl_err(err, r, "grouped Send");
}

/* A call on the stream, after the held sends, between two marks. */
#define TIMED(s, call)                     \
    do {                                   \
        int rc_ = flush_sends(err);        \
        if (rc_) return rc_;               \
        int marked_ = mark((s), 0);        \
        rc_ = (call);                      \
        if (marked_) mark((s), 1);         \
        return rc_;                        \
    } while (0)

int tsr_nccl_allreduce_sum(tsr_comm *c, tsr_dtype dt, void *buf, size_t n, tsr_stream *s, tsr_error *err) {
    TIMED(s, nccl_allreduce_sum(c, dt, buf, n, s, err));
}

int tsr_nccl_allgatherv(tsr_comm *c, tsr_dtype dt, const void *send, void *recv, const size_t *counts,
                        tsr_stream *s, tsr_error *err) {
    TIMED(s, nccl_allgatherv(c, dt, send, recv, counts, s, err));
}

int tsr_nccl_reduce_scatterv(tsr_comm *c, tsr_dtype dt, const void *send, void *recv, const size_t *counts,
                             tsr_stream *s, tsr_error *err) {
    TIMED(s, nccl_reduce_scatterv(c, dt, send, recv, counts, s, err));
}

int tsr_nccl_send(tsr_comm *c, uint32_t peer, tsr_dtype dt, const void *buf, size_t n, tsr_stream *s,
                  tsr_error *err) {
    ncclComm_t nc;
    ncclDataType_t t = ncclFloat32;
    size_t esz = 0;
    int rc = type_of(dt, "send", &t, &esz, err);
    if (rc || (rc = comm_of(c, &nc, err))) return rc;
    if (n_held && held[0].s != s && (rc = flush_sends(err))) return rc;
    if (tsr_grow((void **)&held, &cap_held, n_held, sizeof *held))
        return tsr_err(err, TSR_ENOMEM, "out of memory for a held send");
    held[n_held++] = (held_send){buf, n, t, (int)peer, nc, s};
    return 0;
}

int tsr_nccl_recv(tsr_comm *c, uint32_t peer, tsr_dtype dt, void *buf, size_t n, tsr_stream *s, tsr_error *err) {
    ncclComm_t nc; /* made before the group: a communicator's start is not grouped */
    ncclDataType_t t = ncclFloat32;
    size_t esz = 0;
    int rc = type_of(dt, "recv", &t, &esz, err);
    if (rc || (rc = comm_of(c, &nc, err))) return rc;
    if (n_held && held[0].s != s && (rc = flush_sends(err))) return rc;
    int marked = mark(s, 0);
    ncclGroupStart();
    rc = queue_held(err);
    ncclResult_t r = ncclRecv(buf, n, t, (int)peer, nc, stream(s)), g = ncclGroupEnd();
    if (marked) mark(s, 1);
    if (rc) return rc;
    if (r != ncclSuccess) return nccl_err(err, r, "Recv");
    return g == ncclSuccess ? 0 : nccl_err(err, g, "grouped Send/Recv");
}

int tsr_nccl_wait(tsr_stream *s, tsr_error *err) {
    int rc = flush_sends(err);
    cudaError_t e = cudaStreamSynchronize(stream(s));
    if (rc) return rc;
    return e == cudaSuccess ? 0 : cuda_err(err, e, "stream");
}
#endif
