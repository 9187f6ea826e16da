/* matmul.h: the linear layer, out = inp @ w^T, as PyTorch's nn.Linear (no bias).
 * float32, row-major. CPU: OpenBLAS sgemm; a CUDA twin takes device pointers.
 * Backward functions add into their gradients (+=); a NULL gradient is skipped. */
#ifndef TSR_MATMUL_H
#define TSR_MATMUL_H

/* out (N,OC) = inp (N,C) @ w^T, w (OC,C) as PyTorch's nn.Linear stores it. */
void tsr_matmul_fwd(float *out, const float *inp, const float *w, int N, int C, int OC);
/* dinp (N,C) += dout (N,OC) @ w; dw (OC,C) += dout^T @ inp. */
void tsr_matmul_bwd(float *dinp, float *dw, const float *dout, const float *inp, const float *w, int N, int C,
                    int OC);

/* CPU only. tsr_blas_serial_begin() makes OpenBLAS (when built on pthreads)
 * run one thread per call, for code that calls sgemm from several OpenMP
 * threads at once; it returns what tsr_blas_serial_end() needs to restore the
 * previous thread count. The kernels use it themselves; callers need it only
 * for sgemm calls of their own inside a parallel region. */
int tsr_blas_serial_begin(void);
void tsr_blas_serial_end(int saved);

#endif
