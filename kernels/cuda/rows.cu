/* rows.cu: the embedding and RMSNorm, forward and backward, the sum of squares
 * and the device accumulators of sums and of sums of squares. Sums over a row use
 * a fixed block reduction; sums over rows (the weight gradients) go row by row in
 * order, one thread per column, so that each result is the same from run to run. */
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

/* One thread per column, positions in order: tsr_embed_bwd's sums exactly. */
static __global__ void embed_bwd_k(float *dwte, const float *dout, const int *tokens, int N, int C, int V) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    for (int i = 0; i < N; i++) {
        int tok = tokens[i];
        if (tok >= 0 && tok < V) dwte[(size_t)tok * C + c] += dout[(size_t)i * C + c];
    }
}
extern "C" void tsr_cuda_embed_bwd(float *dwte, const float *dout, const int *tokens, int N, int C, int V,
                                   tsr_stream *s) {
    if (dwte && N > 0 && C > 0)
        embed_bwd_k<<<(C + ROW_THREADS - 1) / ROW_THREADS, ROW_THREADS, 0, tsr_cu_stream(s)>>>(dwte, dout, tokens, N, C, V);
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
/* dw_c += sum over rows, in row order, of dy_c x_c r: one thread per column. */
static __global__ void rms_bwd_w_k(float *dw, const float *dout, const float *inp, const float *rstd, int N, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float acc = 0.0f;
    for (int i = 0; i < N; i++) acc += dout[(size_t)i * C + c] * inp[(size_t)i * C + c] * rstd[i];
    dw[c] += acc;
}
extern "C" void tsr_cuda_rmsnorm_bwd(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                                     const float *rstd, int N, int C, tsr_stream *s) {
    if (N <= 0 || C <= 0) return;
    if (dinp) rms_bwd_rows_k<<<N, ROW_THREADS, 0, tsr_cu_stream(s)>>>(dinp, dout, inp, w, rstd, C);
    if (dw) rms_bwd_w_k<<<(C + ROW_THREADS - 1) / ROW_THREADS, ROW_THREADS, 0, tsr_cu_stream(s)>>>(dw, dout, inp, rstd, N, C);
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

/* part[chunk] = the chunk's sum of x (SQ 0) or of its squares (SQ 1). */
template <int SQ>
static __global__ void chunk_sum_k(double *part, const float *x, size_t n, size_t len) {
    __shared__ double buf[ROW_THREADS];
    size_t i0 = (size_t)blockIdx.x * len, i1 = i0 + len < n ? i0 + len : n;
    double acc = 0.0;
    for (size_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) acc += SQ ? (double)x[i] * x[i] : (double)x[i];
    buf[threadIdx.x] = acc;
    __syncthreads();
    for (unsigned w = ROW_THREADS / 2; w > 0; w /= 2) {
        if (threadIdx.x < w) buf[threadIdx.x] += buf[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) part[blockIdx.x] = buf[0];
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
