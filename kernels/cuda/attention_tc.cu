/* attention_tc.cu: causal grouped-query attention on tensor cores, for the bf16
 * path (TorchTitan's policy: bf16 operands, f32 accumulation and results). The
 * layouts and semantics of tsr_attention_fwd/bwd; the f32 twins of attention.cu
 * stay the exact ones.
 *
 * q, k, v (and dout) are rounded to bf16 into head-major copies in scratch:
 * Q (B,NH,T,hd), K and V (B,NKV,T,hd). The NH/NKV = rep query heads of a group
 * are consecutive there, so a group's queries are one (rep*T, hd) matrix, and its
 * scores one (rep*T, T) block of att (B,NH,T,T): one strided-batched GEMM over
 * the B*NKV groups does every head. With s = 1/sqrt(hd), R = rep*T:
 *   S = s Q K^T  (R x T per group, f32 into att)    P = causal softmax(S) (f32 att, bf16 copy)
 *   O = P V      (R x hd, f32, permuted to out)
 *   dV = P^T dO  (T x hd: the sum over R sums the group's heads, in cuBLAS's fixed order)
 *   dP = dO V^T  (f32, in the caller's scratch_f32)  dS = s P * (dP - rowsum(P dP)) (bf16)
 *   dQ = dS K,   dK = dS^T Q
 * The products are cuBLAS's (bf16 inputs, CUBLAS_COMPUTE_32F, f32 outputs): the
 * upper triangle is multiplied too (zeros in P and dS), the price of one call per
 * product. Every sum has a fixed order, so results repeat run to run. Row-major
 * X (r, c) is column-major X^T, so each product is written for cuBLAS transposed. */
#include <math.h>

#include "cuda_impl.h"

#define GRID(n) tsr_cu_blocks((n), TSR_CU_THREADS), TSR_CU_THREADS, 0, tsr_cu_stream(s)
#define FOR_EACH(i, n) for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)
#define TC_ROW_THREADS 256
#define TC_ALIGN 256 /* bytes: each buffer of scratch starts on such a boundary */

/* The buffers carved from scratch, in this order: bf16 q, k, v, dout (head
 * major), bf16 P or dS (B,NH,T,T), and an f32 (B,NH,T,hd) for a product before
 * it is permuted (O, dQ, dK, dV in turn). */
struct tc_bufs {
    uint16_t *q, *k, *v, *dout, *p;
    float *f;
};

static size_t tc_up(size_t bytes) { return (bytes + TC_ALIGN - 1) / TC_ALIGN * TC_ALIGN; }
static int tc_bad(int B, int T, int NH, int NKV, int hd) {
    return B <= 0 || T <= 0 || NH <= 0 || NKV <= 0 || hd <= 0 || NH % NKV != 0;
}

/* The bytes of scratch, and with base the buffers in it. */
static size_t tc_layout(int B, int T, int NH, int NKV, int hd, void *base, tc_bufs *b) {
    size_t nq = (size_t)B * NH * T * hd, nk = (size_t)B * NKV * T * hd, na = (size_t)B * NH * T * T;
    size_t sizes[6] = {nq * 2, nk * 2, nk * 2, nq * 2, na * 2, nq * 4}, at = 0;
    char *p[6];
    for (int i = 0; i < 6; i++) p[i] = (char *)base + at, at += tc_up(sizes[i]);
    if (b) *b = tc_bufs{(uint16_t *)p[0], (uint16_t *)p[1], (uint16_t *)p[2], (uint16_t *)p[3], (uint16_t *)p[4], (float *)p[5]};
    return at;
}

extern "C" size_t tsr_cuda_attention_tc_scratch(int B, int T, int NH, int NKV, int hd) {
    return tc_bad(B, T, NH, NKV, hd) ? 0 : tc_layout(B, T, NH, NKV, hd, NULL, NULL);
}

/* dst (B,H,T,hd) bf16 = src (B,T,H,hd) f32 rounded to nearest even. */
static __global__ void to_heads_k(uint16_t *dst, const float *src, int T, int H, int hd, size_t n) {
    FOR_EACH(i, n) {
        size_t e = i % hd, t = i / hd % T, h = i / hd / T % H, b = i / hd / T / H;
        dst[i] = tsr_cu_bf16(src[((b * T + t) * H + h) * hd + e]);
    }
}
/* dst (B,T,H,hd) = src (B,H,T,hd), or += with add. */
static __global__ void from_heads_k(float *dst, const float *src, int T, int H, int hd, size_t n, int add) {
    FOR_EACH(i, n) {
        size_t e = i % hd, h = i / hd % H, t = i / hd / H % T, b = i / hd / H / T;
        float x = src[((b * H + h) * T + t) * hd + e];
        dst[i] = add ? dst[i] + x : x;
    }
}

/* Block r: row r of att (B,NH,T,T), query i = r % T, holding scaled scores: the
 * softmax over keys 0..i (max, exponentials and their sum in a fixed tree),
 * zeros after i; p16 gets the same row in bf16. */
static __global__ void tc_softmax_k(float *att, uint16_t *p16, int T) {
    size_t row = blockIdx.x;
    int i = (int)(row % T);
    float *p = att + row * T;
    uint16_t *h = p16 + row * T;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j <= i; j += blockDim.x) mx = fmaxf(mx, p[j]);
    mx = tsr_cu_block_reduce<TC_ROW_THREADS>(mx, 1);
    float sum = 0.0f;
    for (int j = threadIdx.x; j <= i; j += blockDim.x) sum += (p[j] = expf(p[j] - mx));
    float inv = 1.0f / tsr_cu_block_reduce<TC_ROW_THREADS>(sum, 0);
    for (int j = threadIdx.x; j < T; j += blockDim.x) {
        float x = j <= i ? p[j] * inv : 0.0f;
        p[j] = x;
        h[j] = tsr_cu_bf16(x);
    }
}

/* Block r: row r of dS = s P * (dP - rowsum(P * dP)) over keys 0..i, zeros
 * after i, in bf16, from the f32 P (att) and dP. */
static __global__ void tc_dsoftmax_k(uint16_t *ds16, const float *att, const float *dp, int T, float scale) {
    size_t row = blockIdx.x;
    int i = (int)(row % T);
    const float *p = att + row * T, *d = dp + row * T;
    uint16_t *o = ds16 + row * T;
    float dot = 0.0f;
    for (int j = threadIdx.x; j <= i; j += blockDim.x) dot += p[j] * d[j];
    dot = tsr_cu_block_reduce<TC_ROW_THREADS>(dot, 0);
    for (int j = threadIdx.x; j < T; j += blockDim.x) o[j] = tsr_cu_bf16(j <= i ? scale * p[j] * (d[j] - dot) : 0.0f);
}

/* One strided-batched product C = alpha op(A) op(B) (column-major, m x n, inner
 * k), A and B bf16, C f32 overwritten, f32 compute; a refusal is noted for
 * tsr_cuda_sync. @return 0, or -1 when cuBLAS refused. */
static int tc_gemm(cublasHandle_t h, const char *what, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                   float alpha, const uint16_t *A, int lda, long long sa, const uint16_t *Bm, int ldb, long long sb,
                   float *Cm, int ldc, long long sc, int batch) {
    const float beta = 0.0f;
    cublasStatus_t st = cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, &alpha, A, CUDA_R_16BF, lda, sa, Bm, CUDA_R_16BF,
                                                   ldb, sb, &beta, Cm, CUDA_R_32F, ldc, sc, batch, CUBLAS_COMPUTE_32F,
                                                   CUBLAS_GEMM_DEFAULT);
    if (st == CUBLAS_STATUS_SUCCESS) return 0;
    tsr_cu_fail(what, (int)st);
    return -1;
}

/* The three shapes of product, per group (batch B*NKV; R = rep*T query rows),
 * with X the row-major matrices as the comments of the file name them:
 *   rows_by_keys: C (R,T) = alpha X (R,hd) Y (T,hd)^T     (S = Q K^T, dP = dO V^T)
 *   rows_by_dim:  C (R,hd) = X (R,T) Y (T,hd)             (O = P V, dQ = dS K)
 *   keys_by_dim:  C (T,hd) = X (R,T)^T Y (R,hd)           (dV = P^T dO, dK = dS^T Q) */
static int rows_by_keys(cublasHandle_t h, const char *what, float *Cm, const uint16_t *X, const uint16_t *Y, float alpha,
                        int T, int R, int hd, int batch) {
    return tc_gemm(h, what, CUBLAS_OP_T, CUBLAS_OP_N, T, R, hd, alpha, Y, hd, (long long)T * hd, X, hd,
                   (long long)R * hd, Cm, T, (long long)R * T, batch);
}
static int rows_by_dim(cublasHandle_t h, const char *what, float *Cm, const uint16_t *X, const uint16_t *Y, int T, int R,
                       int hd, int batch) {
    return tc_gemm(h, what, CUBLAS_OP_N, CUBLAS_OP_N, hd, R, T, 1.0f, Y, hd, (long long)T * hd, X, T, (long long)R * T,
                   Cm, hd, (long long)R * hd, batch);
}
static int keys_by_dim(cublasHandle_t h, const char *what, float *Cm, const uint16_t *X, const uint16_t *Y, int T, int R,
                       int hd, int batch) {
    return tc_gemm(h, what, CUBLAS_OP_N, CUBLAS_OP_T, hd, T, R, 1.0f, Y, hd, (long long)R * hd, X, T, (long long)R * T,
                   Cm, hd, (long long)T * hd, batch);
}

/* The tensor-core cuBLAS handle of s, or NULL with the failure kept. */
static cublasHandle_t tc_handle(tsr_stream *s, const char *what) {
    cublasHandle_t h = tsr_cu_cublas(s, 1);
    if (!h) tsr_cu_fail(what, CUBLAS_STATUS_NOT_INITIALIZED);
    return h;
}

extern "C" void tsr_cuda_attention_tc_fwd(float *out, float *att, const float *q, const float *k, const float *v, int B,
                                          int T, int NH, int NKV, int hd, void *scratch, tsr_stream *s) {
    if (tc_bad(B, T, NH, NKV, hd)) return;
    cublasHandle_t h = tc_handle(s, "attention forward (tensor cores): no cuBLAS handle");
    if (!h) return;
    tc_bufs b;
    tc_layout(B, T, NH, NKV, hd, scratch, &b);
    int R = NH / NKV * T, batch = B * NKV;
    size_t nq = (size_t)B * NH * T * hd, nk = (size_t)B * NKV * T * hd;
    to_heads_k<<<GRID(nq)>>>(b.q, q, T, NH, hd, nq);
    to_heads_k<<<GRID(nk)>>>(b.k, k, T, NKV, hd, nk);
    to_heads_k<<<GRID(nk)>>>(b.v, v, T, NKV, hd, nk);
    if (rows_by_keys(h, "attention forward: S = Q K^T", att, b.q, b.k, 1.0f / sqrtf((float)hd), T, R, hd, batch)) return;
    tc_softmax_k<<<(unsigned)((size_t)B * NH * T), TC_ROW_THREADS, 0, tsr_cu_stream(s)>>>(att, b.p, T);
    if (rows_by_dim(h, "attention forward: O = P V", b.f, b.p, b.v, T, R, hd, batch)) return;
    from_heads_k<<<GRID(nq)>>>(out, b.f, T, NH, hd, nq, 0);
}

extern "C" void tsr_cuda_attention_tc_bwd(float *dq, float *dk, float *dv, float *scratch_f32, const float *dout,
                                          const float *q, const float *k, const float *v, const float *att, int B,
                                          int T, int NH, int NKV, int hd, void *scratch, tsr_stream *s) {
    if (tc_bad(B, T, NH, NKV, hd) || (!dq && !dk && !dv)) return;
    cublasHandle_t h = tc_handle(s, "attention backward (tensor cores): no cuBLAS handle");
    if (!h) return;
    tc_bufs b;
    tc_layout(B, T, NH, NKV, hd, scratch, &b);
    int R = NH / NKV * T, batch = B * NKV;
    size_t nq = (size_t)B * NH * T * hd, nk = (size_t)B * NKV * T * hd, na = (size_t)B * NH * T * T;
    /* the forward's copies may be gone (scratch is shared): made again, those needed */
    to_heads_k<<<GRID(nq)>>>(b.dout, dout, T, NH, hd, nq);
    if (dk) to_heads_k<<<GRID(nq)>>>(b.q, q, T, NH, hd, nq);
    if (dq) to_heads_k<<<GRID(nk)>>>(b.k, k, T, NKV, hd, nk);
    if (dq || dk) to_heads_k<<<GRID(nk)>>>(b.v, v, T, NKV, hd, nk);
    if (dv) { /* dV = P^T dO, the group's heads summed by the product */
        tsr_cuda_f32_to_bf16(b.p, att, na, s);
        if (keys_by_dim(h, "attention backward: dV = P^T dO", b.f, b.p, b.dout, T, R, hd, batch)) return;
        from_heads_k<<<GRID(nk)>>>(dv, b.f, T, NKV, hd, nk, 1);
    }
    if (!dq && !dk) return;
    if (rows_by_keys(h, "attention backward: dP = dO V^T", scratch_f32, b.dout, b.v, 1.0f, T, R, hd, batch)) return;
    /* dS over P's bf16 copy: the product of dV, queued before, has read it */
    tc_dsoftmax_k<<<(unsigned)((size_t)B * NH * T), TC_ROW_THREADS, 0, tsr_cu_stream(s)>>>(b.p, att, scratch_f32, T,
                                                                                          1.0f / sqrtf((float)hd));
    if (dq) {
        if (rows_by_dim(h, "attention backward: dQ = dS K", b.f, b.p, b.k, T, R, hd, batch)) return;
        from_heads_k<<<GRID(nq)>>>(dq, b.f, T, NH, hd, nq, 1);
    }
    if (dk) {
        if (keys_by_dim(h, "attention backward: dK = dS^T Q", b.f, b.p, b.q, T, R, hd, batch)) return;
        from_heads_k<<<GRID(nk)>>>(dk, b.f, T, NKV, hd, nk, 1);
    }
}
