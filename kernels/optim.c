/* optim.c: AdamW and the gradient-norm helpers. */
#include "optim.h"

#include <omp.h>

#include <math.h>

/* The element-wise part of tsr_adamw on [i0, i1), built for the widest vector
 * unit the processor has (chosen once at load time): the same float operations
 * in the same order, and no contraction into fused multiply-adds (-std=c11), so
 * every build gives the same bits; only the width of the vectors changes. */
__attribute__((target_clones("avx512f", "avx2", "default"))) static void
adamw_range(float *p, const float *g, float *m, float *v, size_t i0, size_t i1, float gscale, float beta1, float beta2,
            float eps, float step, float rsq_bc2, float decay) {
    for (size_t i = i0; i < i1; i++) {
        float gi = g[i] * gscale;
        float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * decay - step * mi / (sqrtf(vi) * rsq_bc2 + eps);
    }
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
