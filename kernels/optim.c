/* optim.c: AdamW and the gradient-norm helpers. */
#include "optim.h"

#include <omp.h>

#include <math.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* One element of tsr_adamw: the reference the vector loops below follow,
 * operation for operation (no contraction into fused multiply-adds: -std=c11). */
static inline void adamw_one(float *p, const float *g, float *m, float *v, size_t i, float gscale, float beta1,
                             float beta2, float eps, float step, float rsq_bc2, float decay) {
    float gi = g[i] * gscale;
    float mi = beta1 * m[i] + (1.0f - beta1) * gi;
    float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - step * mi / (sqrtf(vi) * rsq_bc2 + eps);
}

/* The vector loops work on 16 elements at a time in GCC's generic vectors, which
 * each build lowers to its widest unit (one AVX-512 register, two AVX, four
 * SSE). The square root is the one operation those vectors lack, and the
 * compiler does not vectorize sqrtf: with errno to set (the default, and the
 * Makefile's), a sqrtf is a branch to a library call, and a loop around it
 * stays scalar, four times slower than the memory it streams. So it is the
 * processor's vector square root, correctly rounded as sqrtf is: the same bits
 * as adamw_one for every element, whichever unit runs it. */
typedef float f32x16 __attribute__((vector_size(64)));
typedef void sqrt16_fn(float *x); /* x[0..15] = their square roots, in place */

static inline __attribute__((always_inline)) void adamw_vec(float *p, const float *g, float *m, float *v, size_t i0,
                                                            size_t i1, float gscale, float beta1, float beta2,
                                                            float eps, float step, float rsq_bc2, float decay,
                                                            sqrt16_fn *sqrt16) {
    float omb1 = 1.0f - beta1, omb2 = 1.0f - beta2;
    size_t i = i0;
    for (; i + 16 <= i1; i += 16) {
        f32x16 gi, mi, vi, pi, root; /* loaded and stored by memcpy: no alignment assumed */
        memcpy(&gi, g + i, sizeof gi);
        memcpy(&mi, m + i, sizeof mi);
        memcpy(&vi, v + i, sizeof vi);
        gi = gi * gscale;
        mi = beta1 * mi + omb1 * gi;
        vi = beta2 * vi + omb2 * gi * gi;
        memcpy(m + i, &mi, sizeof mi);
        memcpy(v + i, &vi, sizeof vi);
        float r[16];
        memcpy(r, &vi, sizeof r);
        sqrt16(r);
        memcpy(&root, r, sizeof root);
        memcpy(&pi, p + i, sizeof pi);
        pi = pi * decay - step * mi / (root * rsq_bc2 + eps);
        memcpy(p + i, &pi, sizeof pi);
    }
    for (; i < i1; i++) adamw_one(p, g, m, v, i, gscale, beta1, beta2, eps, step, rsq_bc2, decay);
}

#if defined(__x86_64__)
static inline __attribute__((always_inline, target("avx512f"))) void sqrt16_avx512(float *x) {
    _mm512_storeu_ps(x, _mm512_sqrt_ps(_mm512_loadu_ps(x)));
}
static inline __attribute__((always_inline, target("avx"))) void sqrt16_avx(float *x) {
    for (int k = 0; k < 16; k += 8) _mm256_storeu_ps(x + k, _mm256_sqrt_ps(_mm256_loadu_ps(x + k)));
}
static inline __attribute__((always_inline)) void sqrt16_sse(float *x) {
    for (int k = 0; k < 16; k += 4) _mm_storeu_ps(x + k, _mm_sqrt_ps(_mm_loadu_ps(x + k)));
}
__attribute__((target("avx512f"))) static void adamw_avx512(float *p, const float *g, float *m, float *v, size_t i0,
                                                            size_t i1, float gscale, float beta1, float beta2,
                                                            float eps, float step, float rsq_bc2, float decay) {
    adamw_vec(p, g, m, v, i0, i1, gscale, beta1, beta2, eps, step, rsq_bc2, decay, sqrt16_avx512);
}
__attribute__((target("avx2"))) static void adamw_avx2(float *p, const float *g, float *m, float *v, size_t i0,
                                                       size_t i1, float gscale, float beta1, float beta2, float eps,
                                                       float step, float rsq_bc2, float decay) {
    adamw_vec(p, g, m, v, i0, i1, gscale, beta1, beta2, eps, step, rsq_bc2, decay, sqrt16_avx);
}
static void adamw_sse(float *p, const float *g, float *m, float *v, size_t i0, size_t i1, float gscale, float beta1,
                      float beta2, float eps, float step, float rsq_bc2, float decay) {
    adamw_vec(p, g, m, v, i0, i1, gscale, beta1, beta2, eps, step, rsq_bc2, decay, sqrt16_sse);
}
#else
static inline void sqrt16_scalar(float *x) {
    for (int k = 0; k < 16; k++) x[k] = sqrtf(x[k]);
}
#endif

/* The element-wise part of tsr_adamw on [i0, i1), on the widest vector unit
 * the processor has. */
static void adamw_range(float *p, const float *g, float *m, float *v, size_t i0, size_t i1, float gscale, float beta1,
                        float beta2, float eps, float step, float rsq_bc2, float decay) {
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx512f"))
        adamw_avx512(p, g, m, v, i0, i1, gscale, beta1, beta2, eps, step, rsq_bc2, decay);
    else if (__builtin_cpu_supports("avx2"))
        adamw_avx2(p, g, m, v, i0, i1, gscale, beta1, beta2, eps, step, rsq_bc2, decay);
    else
        adamw_sse(p, g, m, v, i0, i1, gscale, beta1, beta2, eps, step, rsq_bc2, decay);
#else
    adamw_vec(p, g, m, v, i0, i1, gscale, beta1, beta2, eps, step, rsq_bc2, decay, sqrt16_scalar);
#endif
}

void tsr_adamw(float *p, const float *g, float gscale, float *m, float *v, size_t n, float lr, float beta1, float beta2,
               float eps, float weight_decay, long t) {
    /* bias corrections in double: beta2^t underflows slowly and 1 - beta2^t
     * loses digits in float for small t */
    double bc1 = 1.0 - pow((double)beta1, (double)t), bc2 = 1.0 - pow((double)beta2, (double)t);
    float step = (float)(lr / bc1), rsq_bc2 = (float)(1.0 / sqrt(bc2)), decay = 1.0f - lr * weight_decay;
    /* each thread one contiguous range, cut at multiples of 16 elements */
#pragma omp parallel if (n >= 65536)
    {
        size_t nt = (size_t)omp_get_num_threads(), id = (size_t)omp_get_thread_num();
        size_t per = (n + nt - 1) / nt;
        per = (per + 15) & ~(size_t)15;
        size_t i0 = id * per < n ? id * per : n, i1 = i0 + per < n ? i0 + per : n;
        adamw_range(p, g, m, v, i0, i1, gscale, beta1, beta2, eps, step, rsq_bc2, decay);
    }
}

/* Fixed chunks make the sum independent of the thread count (so that a resumed
 * run with other threads clips identically): at most SUMSQ_CHUNKS chunks of at
 * least SUMSQ_MIN elements, each summed by one thread, then added in order. */
#define SUMSQ_CHUNKS 64
#define SUMSQ_MIN 4096

double tsr_sumsq(const float *x, size_t n) {
    if (n == 0) return 0.0;
    size_t len = (n + SUMSQ_CHUNKS - 1) / SUMSQ_CHUNKS;
    if (len < SUMSQ_MIN) len = SUMSQ_MIN;
    int nch = (int)((n + len - 1) / len);
    double part[SUMSQ_CHUNKS];
#pragma omp parallel for schedule(static) if (nch > 1)
    for (int k = 0; k < nch; k++) {
        size_t i0 = (size_t)k * len, i1 = i0 + len < n ? i0 + len : n;
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (size_t i = i0; i < i1; i++) s += (double)x[i] * x[i];
        part[k] = s;
    }
    double s = 0.0;
    for (int k = 0; k < nch; k++) s += part[k];
    return s;
}
