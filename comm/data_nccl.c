/* data_nccl.c: the data plane on a stream, over NCCL (data_nccl.h). Built with
 * TSR_CUDA only. NCCL has no v-collectives: uneven all-gathers are grouped
 * broadcasts and uneven reduce-scatters grouped reduces, one per rank. */
#ifdef TSR_CUDA
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>

#include "comm_mpi.h"
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

int tsr_nccl_allreduce_sum(tsr_comm *c, tsr_dtype dt, void *buf, size_t n, tsr_stream *s, tsr_error *err) {
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

int tsr_nccl_allgatherv(tsr_comm *c, tsr_dtype dt, const void *send, void *recv, const size_t *counts,
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

int tsr_nccl_reduce_scatterv(tsr_comm *c, tsr_dtype dt, const void *send, void *recv, const size_t *counts,
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

int tsr_nccl_send(tsr_comm *c, uint32_t peer, tsr_dtype dt, const void *buf, size_t n, tsr_stream *s,
                  tsr_error *err) {
    ncclComm_t nc;
    ncclDataType_t t = ncclFloat32;
    size_t esz = 0;
    int rc = type_of(dt, "send", &t, &esz, err);
    if (rc || (rc = comm_of(c, &nc, err))) return rc;
    ncclResult_t r = ncclSend(buf, n, t, (int)peer, nc, stream(s));
    return r == ncclSuccess ? 0 : nccl_err(err, r, "Send");
}

int tsr_nccl_recv(tsr_comm *c, uint32_t peer, tsr_dtype dt, void *buf, size_t n, tsr_stream *s, tsr_error *err) {
    ncclComm_t nc;
    ncclDataType_t t = ncclFloat32;
    size_t esz = 0;
    int rc = type_of(dt, "recv", &t, &esz, err);
    if (rc || (rc = comm_of(c, &nc, err))) return rc;
    ncclResult_t r = ncclRecv(buf, n, t, (int)peer, nc, stream(s));
    return r == ncclSuccess ? 0 : nccl_err(err, r, "Recv");
}

int tsr_nccl_wait(tsr_stream *s, tsr_error *err) {
    cudaError_t e = cudaStreamSynchronize(stream(s));
    return e == cudaSuccess ? 0 : cuda_err(err, e, "stream");
}
#endif
