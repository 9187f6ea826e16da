/* activation.c: SwiGLU, elementwise. */
#include "activation.h"

#include <math.h>

void tsr_swiglu_fwd(float *out, const float *gate, const float *up, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + tsr_exp(-g)) * up[i];
    }
}

/* silu'(g) = s + g s (1 - s) with s = sigmoid(g). One loop per case of NULL
 * gradients, so that none of them branches (and each vectorizes). */
void tsr_swiglu_bwd(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n) {
    if (dgate && dup) {
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n; i++) {
            float g = gate[i], s = 1.0f / (1.0f + tsr_exp(-g));
            dgate[i] += dout[i] * up[i] * s * (1.0f + g * (1.0f - s));
            dup[i] += dout[i] * g * s;
        }
    } else if (dgate) {
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n; i++) {
            float g = gate[i], s = 1.0f / (1.0f + tsr_exp(-g));
            dgate[i] += dout[i] * up[i] * s * (1.0f + g * (1.0f - s));
        }
    } else if (dup) {
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n; i++) {
            float g = gate[i];
            dup[i] += dout[i] * g / (1.0f + tsr_exp(-g));
        }
    }
}
