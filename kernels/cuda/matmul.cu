/* matmul.cu: the linear layer through cuBLAS, f32 in and out (no TF32), and
 * through cuBLASLt in bf16 with f32 accumulation (the mixed-precision path); one
 * handle of each per process on the current device, queued on the caller's
 * stream (one stream at a time: the handles and cuBLASLt's workspace are
 * shared). Row-major X (R, C) is column-major X^T, so out = inp @ w^T becomes
 * out^T = w @ inp^T in cuBLAS's terms. */
#include <cublasLt.h>
#include <cublas_v2.h>

#include "cuda_impl.h"

static cublasHandle_t handle_on(tsr_stream *s) {
    static cublasHandle_t h;
    if (!h && (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS || cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH) != CUBLAS_STATUS_SUCCESS))
        return NULL;
    cublasSetStream(h, tsr_cu_stream(s));
    return h;
}

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

/* One cuBLASLt product D = op(A) op(B) + beta D, column-major, A and B bf16, D of
 * type dt (bf16 or f32), f32 accumulation; the algorithm cuBLASLt's heuristic
 * ranks first within a 32 MiB workspace. */
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
    int ok = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == OK &&
             cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) == OK &&
             cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) == OK &&
             cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, ta == CUBLAS_OP_N ? m : k, ta == CUBLAS_OP_N ? k : m, lda) == OK &&
             cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, tb == CUBLAS_OP_N ? k : n, tb == CUBLAS_OP_N ? n : k, ldb) == OK &&
             cublasLtMatrixLayoutCreate(&ld, dt, m, n, ldd) == OK && cublasLtMatmulPreferenceCreate(&pref) == OK &&
             cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsz, sizeof wsz) == OK &&
             cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, ld, ld, pref, 1, &best, &found) == OK && found > 0 &&
             cublasLtMatmul(h, op, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &best.algo, ws, WORKSPACE,
                            tsr_cu_stream(s)) == OK;
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
