/* rows.cu: the embedding and RMSNorm, forward and backward, the sum of squares
 * and the device accumulators of sums and of sums of squares (of one buffer or
 * of many ranges of one). Sums over a row use a fixed block reduction; sums over
 * rows (the weight gradients) keep their CPU twins' order exactly, so that each
 * result is the CPU's and the same from run to run. */
#include <math.h>

#include "cuda_impl.h"

#define ROW_THREADS 256

static __global__ void embed_fwd_k(float *out, const int *tokens, const float *wte, int N, int C, int V) {
    size_t total = (size_t)N * C;
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < total; k += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(k / C), c = (int)(k % C), tok = tokens[i];
        out[k] = tok >= 0 && tok < V ? wte[(size_t)tok * C + c] : 0.0f;
    }
}
extern "C" void tsr_cuda_embed_fwd(float *out, const int *tokens, const float *wte, int N, int C, int V,
                                   tsr_stream *s) {
    size_t total = (size_t)N * C;
    if (total) embed_fwd_k<<<tsr_cu_blocks(total, TSR_CU_THREADS), TSR_CU_THREADS, 0, tsr_cu_stream(s)>>>(out, tokens, wte, N, C, V);
}

/* The embedding's weight gradient, in tsr_embed_bwd's order to the bit: every
 * element of dwte adds the elements of dout of its token's positions one after
 * the other, in position order. Sort-free and without scratch: block i (one per
 * position) goes on only if position i is its token's first (no earlier
 * position holds it: a scan of tokens[0, i)). That block owns the token's row of
 * dwte (no atomics, no two blocks on one element): it finds the token's
 * positions from i on, a stretch of EMBED_THREADS at a time (a ballot per warp,
 * the set bits in order), and adds their rows of dout to registers that hold
 * EMBED_UNROLL columns per thread, loaded from dwte and stored back once per
 * stretch. Cost: the scans read O(N^2 / EMBED_THREADS) ints, from cache; dout is
 * read once, coalesced; a token held by many positions is the work of one block. */
#define EMBED_THREADS 256
#define EMBED_UNROLL 4

static __global__ void embed_bwd_k(float *dwte, const float *dout, const int *tokens, int N, int C, int V) {
    __shared__ unsigned masks[EMBED_THREADS / 32];
    int i = blockIdx.x, tok = tokens[i], lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (tok < 0 || tok >= V) return; /* the whole block: tok is the same in every thread */
    for (int j0 = 0; j0 < i; j0 += EMBED_THREADS) {
        int j = j0 + threadIdx.x;
        if (__syncthreads_or(j < i && tokens[j] == tok)) return; /* an earlier position owns the row */
    }
    float *row = dwte + (size_t)tok * C;
    for (int j0 = i; j0 < N; j0 += EMBED_THREADS) {
        int j = j0 + threadIdx.x;
        unsigned m = __ballot_sync(0xffffffffu, j < N && tokens[j] == tok);
        if (lane == 0) masks[warp] = m;
        __syncthreads();
        unsigned any = 0;
        for (int w = 0; w < EMBED_THREADS / 32; w++) any |= masks[w];
        for (int c0 = 0; any && c0 < C; c0 += EMBED_THREADS * EMBED_UNROLL) {
            float acc[EMBED_UNROLL];
#pragma unroll
            for (int u = 0; u < EMBED_UNROLL; u++) {
                int c = c0 + u * EMBED_THREADS + threadIdx.x;
                acc[u] = c < C ? row[c] : 0.0f;
            }
            for (int w = 0; w < EMBED_THREADS / 32; w++) /* the stretch's positions of tok, in order */
                for (unsigned mw = masks[w]; mw; mw &= mw - 1) {
                    const float *g = dout + (size_t)(j0 + 32 * w + __ffs(mw) - 1) * C;
#pragma unroll
                    for (int u = 0; u < EMBED_UNROLL; u++) {
                        int c = c0 + u * EMBED_THREADS + threadIdx.x;
                        if (c < C) acc[u] += g[c];
                    }
                }
#pragma unroll
            for (int u = 0; u < EMBED_UNROLL; u++) {
                int c = c0 + u * EMBED_THREADS + threadIdx.x;
                if (c < C) row[c] = acc[u];
            }
        }
        __syncthreads(); /* masks is rewritten by the next stretch */
    }
}
extern "C" void tsr_cuda_embed_bwd(float *dwte, const float *dout, const int *tokens, int N, int C, int V,
                                   tsr_stream *s) {
    if (dwte && N > 0 && C > 0) embed_bwd_k<<<N, EMBED_THREADS, 0, tsr_cu_stream(s)>>>(dwte, dout, tokens, N, C, V);
}

static __global__ void rms_fwd_k(float *out, float *rstd, const float *inp, const float *w, int C, float eps) {
    const float *x = inp + (size_t)blockIdx.x * C;
    float *y = out + (size_t)blockIdx.x * C;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) ss += x[c] * x[c];
    float r = 1.0f / sqrtf(tsr_cu_block_reduce<ROW_THREADS>(ss, 0) / (float)C + eps);
    for (int c = threadIdx.x; c < C; c += blockDim.x) y[c] = x[c] * r * w[c];
    if (threadIdx.x == 0) rstd[blockIdx.x] = r;
}
extern "C" void tsr_cuda_rmsnorm_fwd(float *out, float *rstd, const float *inp, const float *w, int N, int C,
                                     float eps, tsr_stream *s) {
    if (N > 0 && C > 0) rms_fwd_k<<<N, ROW_THREADS, 0, tsr_cu_stream(s)>>>(out, rstd, inp, w, C, eps);
}

/* dx_c += r (w_c dy_c - x_c r^2 / C sum_j dy_j w_j x_j), one block per row. */
static __global__ void rms_bwd_rows_k(float *dinp, const float *dout, const float *inp, const float *w,
                                      const float *rstd, int C) {
    size_t row = (size_t)blockIdx.x * C;
    const float *x = inp + row, *dy = dout + row;
    float r = rstd[blockIdx.x], dot = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dot += dy[c] * w[c] * x[c];
    float k = r * r * tsr_cu_block_reduce<ROW_THREADS>(dot, 0) / (float)C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dinp[row + c] += r * (w[c] * dy[c] - k * x[c]);
}
/* dw, in tsr_rmsnorm_bwd's order to the bit (norm.c): the rows cut into
 * nch = min(N, NORM_CHUNKS) chunks, rows [N k / nch, N (k+1) / nch) of chunk k;
 * each chunk sums dy_c x_c r over its rows in order into a partial from 0, and
 * dw_c adds the partials in chunk order. Block (16 columns) x (NORM_CHUNKS
 * chunks): thread (c, k) sums column c over chunk k, then the chunk-0 threads
 * add the partials from shared memory. Both levels in a fixed order, without
 * scratch or atomics; the products and sums rounded one by one (no fused
 * multiply-add), as the CPU's. NORM_CHUNKS must be norm.c's. */
#define NORM_CHUNKS 32
#define NORM_COLS 16
static __global__ void rms_bwd_w_k(float *dw, const float *dout, const float *inp, const float *rstd, int N, int C) {
    __shared__ float part[NORM_CHUNKS][NORM_COLS + 1];
    int c = blockIdx.x * NORM_COLS + threadIdx.x, k = threadIdx.y, nch = N < NORM_CHUNKS ? N : NORM_CHUNKS;
    float acc = 0.0f;
    if (c < C && k < nch) {
        int i0 = (int)((long)N * k / nch), i1 = (int)((long)N * (k + 1) / nch);
#pragma unroll 4
        for (int i = i0; i < i1; i++) {
            size_t at = (size_t)i * C + c;
            acc = __fadd_rn(acc, __fmul_rn(__fmul_rn(dout[at], inp[at]), rstd[i]));
        }
    }
    part[k][threadIdx.x] = acc;
    __syncthreads();
    if (k != 0 || c >= C) return;
    float d = dw[c];
    for (int j = 0; j < nch; j++) d = __fadd_rn(d, part[j][threadIdx.x]);
    dw[c] = d;
}
extern "C" void tsr_cuda_rmsnorm_bwd(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                                     const float *rstd, int N, int C, tsr_stream *s) {
    if (N <= 0 || C <= 0) return;
    if (dinp) rms_bwd_rows_k<<<N, ROW_THREADS, 0, tsr_cu_stream(s)>>>(dinp, dout, inp, w, rstd, C);
    if (dw)
        rms_bwd_w_k<<<(C + NORM_COLS - 1) / NORM_COLS, dim3(NORM_COLS, NORM_CHUNKS), 0, tsr_cu_stream(s)>>>(dw, dout, inp,
                                                                                                       rstd, N, C);
}

/* Fixed chunks, as tsr_sumsq: at most SUMSQ_CHUNKS chunks of at least SUMSQ_MIN
 * elements; one block sums a chunk in double (a fixed tree), then the chunks are
 * added in order (by the host for tsr_cuda_sumsq, by one device thread for the
 * accumulators). The plain sum (tsr_cuda_sum_add) uses the same chunks. */
#define SUMSQ_CHUNKS 64
#define SUMSQ_MIN 4096

/* sum_chunks(): the length of a chunk of n > 0 elements and their number (at
 * most SUMSQ_CHUNKS, whatever n). */
static int sum_chunks(size_t n, size_t *len) {
    *len = (n + SUMSQ_CHUNKS - 1) / SUMSQ_CHUNKS;
    if (*len < SUMSQ_MIN) *len = SUMSQ_MIN;
    return (int)((n + *len - 1) / *len);
}

/* *out (thread 0) = the sum of every thread's acc over the block, in a fixed
 * tree: the same bits from run to run. buf: ROW_THREADS doubles of shared memory. */
static __device__ void block_sum_to(double *out, double *buf, double acc) {
    buf[threadIdx.x] = acc;
    __syncthreads();
    for (unsigned w = ROW_THREADS / 2; w > 0; w /= 2) {
        if (threadIdx.x < w) buf[threadIdx.x] += buf[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) *out = buf[0];
}

/* part[chunk] = the chunk's sum of x (SQ 0) or of its squares (SQ 1). */
template <int SQ>
static __global__ void chunk_sum_k(double *part, const float *x, size_t n, size_t len) {
    __shared__ double buf[ROW_THREADS];
    size_t i0 = (size_t)blockIdx.x * len, i1 = i0 + len < n ? i0 + len : n;
    double acc = 0.0;
    for (size_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) acc += SQ ? (double)x[i] * x[i] : (double)x[i];
    block_sum_to(part + blockIdx.x, buf, acc);
}
extern "C" int tsr_cuda_sumsq(const float *x, size_t n, double *out, tsr_stream *s, tsr_error *err) {
    *out = 0.0;
    if (n == 0) return 0;
    size_t len;
    int nch = sum_chunks(n, &len);
    double *dpart = NULL, part[SUMSQ_CHUNKS], sum = 0.0;
    cudaError_t e = cudaMalloc((void **)&dpart, (size_t)nch * sizeof *dpart);
    if (e == cudaSuccess) {
        chunk_sum_k<1><<<nch, ROW_THREADS, 0, tsr_cu_stream(s)>>>(dpart, x, n, len);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(part, dpart, (size_t)nch * sizeof *part, cudaMemcpyDeviceToHost, tsr_cu_stream(s));
    if (e == cudaSuccess) e = cudaStreamSynchronize(tsr_cu_stream(s));
    cudaFree(dpart);
    if (e != cudaSuccess) {
        int code = e == cudaErrorMemoryAllocation ? TSR_ENOMEM : TSR_EIO;
        if (err) {
            err->code = code;
            snprintf(err->msg, sizeof err->msg, "cuda: sum of squares of %zu floats: %s", n, cudaGetErrorString(e));
        }
        return code;
    }
    for (int k = 0; k < nch; k++) sum += part[k];
    *out = sum;
    return 0;
}

/* *acc += the chunks' sums, added in order into 0 first: tsr_cuda_sumsq's
 * addition, so that the sum of squares added is the same double. One thread. */
static __global__ void sum_parts_k(double *acc, const double *part, int nch) {
    double sum = 0.0;
    for (int k = 0; k < nch; k++) sum += part[k];
    *acc += sum;
}
extern "C" size_t tsr_cuda_sum_scratch(size_t n) {
    size_t len;
    return n ? (size_t)sum_chunks(n, &len) : 0;
}
/* The two launches of an accumulator, queued on s: chunks into scratch, then
 * their sum into *acc. Calls on one stream may share scratch (the stream orders
 * them). */
template <int SQ>
static void sum_add(double *acc, const float *x, size_t n, double *scratch, tsr_stream *s) {
    if (n == 0) return;
    size_t len;
    int nch = sum_chunks(n, &len);
    chunk_sum_k<SQ><<<nch, ROW_THREADS, 0, tsr_cu_stream(s)>>>(scratch, x, n, len);
    sum_parts_k<<<1, 1, 0, tsr_cu_stream(s)>>>(acc, scratch, nch);
}
extern "C" void tsr_cuda_sum_add(double *acc, const float *x, size_t n, double *scratch, tsr_stream *s) {
    sum_add<0>(acc, x, n, scratch, s);
}
extern "C" void tsr_cuda_sumsq_add(double *acc, const float *x, size_t n, double *scratch, tsr_stream *s) {
    sum_add<1>(acc, x, n, scratch, s);
}

/* The sum of squares of many ranges of one buffer (the gradients of many
 * parameters) in one launch: the ranges laid end to end make `total` floats,
 * cut into nch fixed chunks of len floats (at most RANGES_CHUNKS chunks of at
 * least SUMSQ_MIN); block k sums chunk k in double into part[k] (each thread its
 * own elements in order, then a fixed tree), finding the pieces of ranges it
 * covers by walking the ranges in order; a second launch adds the chunks in
 * order into *acc. The chunks depend on the sizes only, so every run gives the
 * same bits; the sum is not tsr_sumsq's grouping, so it differs from the CPU's in
 * the last bits (rounding of doubles, about 1e-15 relative). */
#define RANGES_CHUNKS 1024

/* ranges_chunks(): the length of a chunk of total > 0 floats and their number. */
static int ranges_chunks(size_t total, size_t *len) {
    *len = (total + RANGES_CHUNKS - 1) / RANGES_CHUNKS;
    if (*len < SUMSQ_MIN) *len = SUMSQ_MIN;
    return (int)((total + *len - 1) / *len);
}

/* Block k: part[k] = the sum of squares of floats [k len, (k+1) len) of the
 * ranges laid end to end. ranges: count pairs (offset, n) in floats from base. */
static __global__ void ranges_sumsq_k(double *part, const float *base, const uint64_t *ranges, int count, size_t total,
                                      size_t len) {
    __shared__ double buf[ROW_THREADS];
    size_t v0 = (size_t)blockIdx.x * len, v1 = v0 + len < total ? v0 + len : total;
    size_t at = 0; /* where range r starts, end to end */
    double acc = 0.0;
    for (int r = 0; r < count && at < v1; r++) {
        size_t off = ranges[2 * (size_t)r], n = ranges[2 * (size_t)r + 1];
        size_t a = at > v0 ? at : v0, e = at + n < v1 ? at + n : v1; /* the chunk's piece of range r */
        if (a < e) {
            const float *x = base + off + (a - at);
            for (size_t i = threadIdx.x; i < e - a; i += blockDim.x) acc += (double)x[i] * x[i];
        }
        at += n;
    }
    block_sum_to(part + blockIdx.x, buf, acc);
}

/* *acc += the nch chunks' sums: each thread adds its chunks (t, t + ROW_THREADS,
 * ...) in order, then a fixed tree. One block. */
static __global__ void ranges_finish_k(double *acc, const double *part, int nch) {
    __shared__ double buf[ROW_THREADS];
    double sum = 0.0;
    for (int k = threadIdx.x; k < nch; k += blockDim.x) sum += part[k];
    buf[threadIdx.x] = sum;
    __syncthreads();
    for (unsigned w = ROW_THREADS / 2; w > 0; w /= 2) {
        if (threadIdx.x < w) buf[threadIdx.x] += buf[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) *acc += buf[0];
}

extern "C" size_t tsr_cuda_sumsq_ranges_scratch(size_t total) {
    size_t len;
    return total ? (size_t)ranges_chunks(total, &len) : 0;
}

extern "C" void tsr_cuda_sumsq_ranges(double *acc, const float *base, const uint64_t *ranges, int count, size_t total,
                                      double *scratch, tsr_stream *s) {
    if (count <= 0 || total == 0) return;
    size_t len;
    int nch = ranges_chunks(total, &len);
    ranges_sumsq_k<<<nch, ROW_THREADS, 0, tsr_cu_stream(s)>>>(scratch, base, ranges, count, total, len);
    ranges_finish_k<<<1, ROW_THREADS, 0, tsr_cu_stream(s)>>>(acc, scratch, nch);
}
