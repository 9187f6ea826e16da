/* matmul.cu: the linear layer through cuBLAS, f32 in and out (no TF32), one
 * handle per process on the current device, queued on the caller's stream.
 * Row-major X (R, C) is column-major X^T, so out = inp @ w^T becomes
 * out^T = w @ inp^T in cuBLAS's terms. */
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
