/* matmul.cu: the linear layer through cuBLAS, f32 in and out (no TF32), and
 * through cuBLASLt in bf16 with f32 accumulation (the mixed-precision path, on
 * bf16 tensors or on f32 tensors rounded to bf16 on the way in); one
 * handle of each per process on the current device, queued on the caller's
 * stream (one stream at a time: the handles and cuBLASLt's workspace are
 * shared). Row-major X (R, C) is column-major X^T, so out = inp @ w^T becomes
 * out^T = w @ inp^T in cuBLAS's terms. */
#include <cublasLt.h>
#include <cublas_v2.h>

#include "cuda_impl.h"

cublasHandle_t tsr_cu_cublas(tsr_stream *s, int tensor_ops) {
    static cublasHandle_t hs[2];
    cublasHandle_t *h = &hs[tensor_ops ? 1 : 0];
    cublasMath_t math = tensor_ops ? CUBLAS_DEFAULT_MATH : CUBLAS_PEDANTIC_MATH;
    if (!*h && cublasCreate(h) != CUBLAS_STATUS_SUCCESS) *h = NULL;
    if (!*h || cublasSetMathMode(*h, math) != CUBLAS_STATUS_SUCCESS) return NULL;
    cublasSetStream(*h, tsr_cu_stream(s));
    return *h;
}
static cublasHandle_t handle_on(tsr_stream *s) { return tsr_cu_cublas(s, 0); }

extern "C" int tsr_cuda_matmul_fwd(float *out, const float *inp, const float *w, int N, int C, int OC,
                                   tsr_stream *s) {
    cublasHandle_t h = handle_on(s);
    const float one = 1.0f, zero = 0.0f;
    if (!h) return TSR_EIO;
    return cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, &one, w, C, inp, C, &zero, out, OC) ==
                   CUBLAS_STATUS_SUCCESS ? 0 : TSR_EIO;
}

extern "C" int tsr_cuda_matmul_bwd(float *dinp, float *dw, const float *dout, const float *inp, const float *w, int N,
                                   int C, int OC, tsr_stream *s) {
    cublasHandle_t h = handle_on(s);
    const float one = 1.0f;
    if (!h) return TSR_EIO;
    if (dinp && cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, &one, w, C, dout, OC, &one, dinp, C) !=
                    CUBLAS_STATUS_SUCCESS)
        return TSR_EIO;
    if (dw && cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, &one, inp, C, dout, OC, &one, dw, C) !=
                  CUBLAS_STATUS_SUCCESS)
        return TSR_EIO;
    return 0;
}

/* The alignment of p in bytes, as cuBLASLt's preferences count it: the largest
 * power of two up to 256 that divides its address. */
static uint32_t alignment(const void *p) {
    uint32_t a = 256;
    while (a > 1 && (uintptr_t)p % a) a /= 2;
    return a;
}

/* One cuBLASLt product D = op(A) op(B) + beta D, column-major, A and B bf16, D of
 * type dt (bf16 or f32), f32 accumulation; the algorithm cuBLASLt's heuristic
 * ranks first within a 32 MiB workspace among those that work with the
 * pointers' alignment (a view into a larger buffer may be less aligned than the
 * 256 bytes cuBLASLt assumes by default); cublasGemmEx where cuBLASLt has none. */
static int lt_gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void *A, int lda,
                   const void *B, int ldb, cudaDataType_t dt, void *D, int ldd, float beta, tsr_stream *s) {
    enum { WORKSPACE = 32 << 20 };
    static cublasLtHandle_t h;
    static void *ws;
    if (!h && cublasLtCreate(&h) != CUBLAS_STATUS_SUCCESS) h = NULL;
    if (h && !ws && cudaMalloc(&ws, WORKSPACE) != cudaSuccess) ws = NULL, cudaGetLastError();
    if (!h || !ws) return TSR_EIO;
    const cublasStatus_t OK = CUBLAS_STATUS_SUCCESS;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t best;
    int found = 0;
    size_t wsz = WORKSPACE;
    const float alpha = 1.0f;
    uint32_t align_a = alignment(A), align_b = alignment(B), align_d = alignment(D);
    int ok = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == OK &&
             cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == OK &&
             cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) == OK &&
             cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, ta == CUBLAS_OP_N ? m : k, ta == CUBLAS_OP_N ? k : m, lda) == OK &&
             cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, tb == CUBLAS_OP_N ? k : n, tb == CUBLAS_OP_N ? n : k, ldb) == OK &&
             cublasLtMatrixLayoutCreate(&ld, dt, m, n, ldd) == OK && cublasLtMatmulPreferenceCreate(&pref) == OK &&
             cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsz, sizeof wsz) == OK &&
             cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof align_a) == OK &&
             cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof align_b) == OK &&
             cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof align_d) == OK &&
             cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof align_d) == OK;
    if (ok && cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, ld, ld, pref, 1, &best, &found) != OK) found = 0;
    if (ok && found > 0)
        ok = cublasLtMatmul(h, op, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &best.algo, ws, WORKSPACE,
                            tsr_cu_stream(s)) == OK;
    else if (ok) { /* no cuBLASLt kernel for these sizes or alignments: cuBLAS's general one, same types */
        cublasHandle_t hb = tsr_cu_cublas(s, 1);
        ok = hb && cublasGemmEx(hb, ta, tb, m, n, k, &alpha, A, CUDA_R_16BF, lda, B, CUDA_R_16BF, ldb, &beta, D, dt, ldd,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == OK;
    }
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
    return ok ? 0 : TSR_EIO;
}

extern "C" int tsr_cuda_matmul_bf16_fwd(uint16_t *out, const uint16_t *inp, const uint16_t *w, int N, int C, int OC,
                                        tsr_stream *s) {
    return lt_gemm(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, w, C, inp, C, CUDA_R_16BF, out, OC, 0.0f, s);
}

extern "C" int tsr_cuda_matmul_bf16_bwd(uint16_t *dinp, float *dw, const uint16_t *dout, const uint16_t *inp,
                                        const uint16_t *w, int N, int C, int OC, tsr_stream *s) {
    if (dinp && lt_gemm(CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, w, C, dout, OC, CUDA_R_16BF, dinp, C, 1.0f, s)) return TSR_EIO;
    if (dw && lt_gemm(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, inp, C, dout, OC, CUDA_R_32F, dw, C, 1.0f, s)) return TSR_EIO;
    return 0;
}

/* The mixed-precision linear layer on f32 tensors: each operand rounded to bf16
 * into scratch (tsr_cuda_f32_to_bf16), then one cuBLASLt product with f32
 * accumulation and an f32 result. The scratch holds, each from a 256-byte
 * boundary (cuBLASLt's preferred alignment), inp (N*C), w (OC*C) and dout
 * (N*OC) in that order. */
#define MIXED_ALIGN 128 /* bf16 elements in 256 bytes */
static size_t mixed_round_up(size_t n) { return (n + MIXED_ALIGN - 1) / MIXED_ALIGN * MIXED_ALIGN; }

extern "C" size_t tsr_cuda_matmul_mixed_scratch(int N, int C, int OC) {
    if (N <= 0 || C <= 0 || OC <= 0) return 0;
    return mixed_round_up((size_t)N * C) + mixed_round_up((size_t)OC * C) + (size_t)N * OC;
}

extern "C" int tsr_cuda_matmul_mixed_fwd(float *out, const float *inp, const float *w, int N, int C, int OC,
                                         uint16_t *scratch, tsr_stream *s) {
    if (N <= 0 || OC <= 0) return 0;
    if (C <= 0) { /* an empty sum: as sgemm with k = 0 leaves it, out = 0 */
        return cudaMemsetAsync(out, 0, (size_t)N * OC * sizeof *out, tsr_cu_stream(s)) == cudaSuccess ? 0 : TSR_EIO;
    }
    uint16_t *x16 = scratch, *w16 = x16 + mixed_round_up((size_t)N * C);
    tsr_cuda_f32_to_bf16(x16, inp, (size_t)N * C, s);
    tsr_cuda_f32_to_bf16(w16, w, (size_t)OC * C, s);
    return lt_gemm(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, w16, C, x16, C, CUDA_R_32F, out, OC, 0.0f, s);
}

extern "C" int tsr_cuda_matmul_mixed_bwd(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                                         int N, int C, int OC, uint16_t *scratch, tsr_stream *s) {
    if (N <= 0 || C <= 0 || OC <= 0 || (!dinp && !dw)) return 0;
    uint16_t *x16 = scratch, *w16 = x16 + mixed_round_up((size_t)N * C), *dy16 = w16 + mixed_round_up((size_t)OC * C);
    tsr_cuda_f32_to_bf16(dy16, dout, (size_t)N * OC, s);
    if (dinp) { /* dinp (N,C) += dout (N,OC) @ w (OC,C) */
        tsr_cuda_f32_to_bf16(w16, w, (size_t)OC * C, s);
        if (lt_gemm(CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, w16, C, dy16, OC, CUDA_R_32F, dinp, C, 1.0f, s)) return TSR_EIO;
    }
    if (dw) { /* dw (OC,C) += dout^T @ inp (N,C) */
        tsr_cuda_f32_to_bf16(x16, inp, (size_t)N * C, s);
        if (lt_gemm(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, x16, C, dy16, OC, CUDA_R_32F, dw, C, 1.0f, s)) return TSR_EIO;
    }
    return 0;
}
