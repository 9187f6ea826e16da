/* matmul.c: the linear layer on OpenBLAS. Every product is sgemm; the backward
 * ones use beta = 1 so that gradients accumulate in place.
 *
 * Threads: the other kernels run on OpenMP's threads, and OpenBLAS built on
 * pthreads keeps a pool of its own. Two pools on the same cores fight: each
 * spins for a while after its work ends, stealing the core the other one needs
 * next. So large products are cut into one block of output rows (or columns)
 * per OpenMP thread, each block a single-threaded sgemm, and OpenBLAS's pool
 * stays idle. */
#include "matmul.h"

#include <cblas.h>
#include <omp.h>
#include <string.h>

/* Below this many multiply-adds, one thread does the product (OpenBLAS's own
 * threshold for going parallel is the same). */
#define MATMUL_PAR_MIN (1 << 18)

int tsr_blas_serial_begin(void) {
    /* OpenBLAS built on OpenMP is single-threaded inside a parallel region
     * already, and there openblas_set_num_threads would change OpenMP's own
     * thread count: leave it alone. */
    if (openblas_get_parallel() != OPENBLAS_THREAD) return 0;
    int n = openblas_get_num_threads();
    if (n > 1) openblas_set_num_threads(1);
    return n;
}

void tsr_blas_serial_end(int n) {
    if (n > 1) openblas_set_num_threads(n);
}

/* C (M,N) = alpha op(A) op(B) + beta C, row-major, with op(A) (M,K) and op(B) (K,N). */
static void sgemm_omp(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha,
                      const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    if ((double)M * N * K < MATMUL_PAR_MIN || omp_get_max_threads() == 1 || omp_in_parallel()) {
        cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    int serial = tsr_blas_serial_begin();
#pragma omp parallel
    {
        int nt = omp_get_num_threads(), t = omp_get_thread_num();
        int by_rows = M >= N, len = by_rows ? M : N;
        int chunk = ((len + nt - 1) / nt + 15) / 16 * 16; /* whole 64-byte lines per block */
        int lo = t * chunk, hi = lo + chunk < len ? lo + chunk : len;
        if (lo < hi && by_rows) { /* rows lo..hi of C and of op(A) */
            const float *a = ta == CblasNoTrans ? A + (size_t)lo * lda : A + lo;
            cblas_sgemm(CblasRowMajor, ta, tb, hi - lo, N, K, alpha, a, lda, B, ldb, beta, C + (size_t)lo * ldc, ldc);
        } else if (lo < hi) { /* columns lo..hi of C and of op(B) */
            const float *b = tb == CblasNoTrans ? B + lo : B + (size_t)lo * ldb;
            cblas_sgemm(CblasRowMajor, ta, tb, M, hi - lo, K, alpha, A, lda, b, ldb, beta, C + lo, ldc);
        }
    }
    tsr_blas_serial_end(serial);
}

void tsr_matmul_fwd(float *out, const float *inp, const float *w, int N, int C, int OC) {
    if (N <= 0 || OC <= 0) return;
    if (C <= 0) { /* an empty sum; BLAS would reject lda = 0 */
        memset(out, 0, (size_t)N * (size_t)OC * sizeof *out);
        return;
    }
    // out (N,OC) = inp (N,C) @ w^T
    sgemm_omp(CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, w, C, 0.0f, out, OC);
}

void tsr_matmul_bwd(float *dinp, float *dw, const float *dout, const float *inp, const float *w, int N, int C,
                    int OC) {
    if (N <= 0 || C <= 0 || OC <= 0) return; /* nothing to add */
    // dinp (N,C) += dout (N,OC) @ w (OC,C)
    if (dinp) sgemm_omp(CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, w, C, 1.0f, dinp, C);
    // dw (OC,C) += dout^T (OC,N) @ inp (N,C)
    if (dw) sgemm_omp(CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dw, C);
}
