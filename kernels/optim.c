/* optim.c: AdamW and the gradient-norm helpers. */
#include "optim.h"

#include <math.h>

void tsr_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1, float beta2, float eps,
               float weight_decay, long t) {
    /* bias corrections in double: beta2^t underflows slowly and 1 - beta2^t
     * loses digits in float for small t */
    double bc1 = 1.0 - pow((double)beta1, (double)t), bc2 = 1.0 - pow((double)beta2, (double)t);
    float step = (float)(lr / bc1), rsq_bc2 = (float)(1.0 / sqrt(bc2)), decay = 1.0f - lr * weight_decay;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float gi = g[i];
        float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * decay - step * mi / (sqrtf(vi) * rsq_bc2 + eps);
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

void tsr_scale(float *x, size_t n, float s) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) x[i] *= s;
}
