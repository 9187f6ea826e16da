/* activation.c: SwiGLU, elementwise.
 *
 * Each kernel cuts its n elements into blocks that OpenMP's threads share out,
 * and runs a block through a loop built for the widest vector unit the
 * processor has (target_clones, chosen once at load time): the same float
 * operations in the same order whatever the width (no contraction into fused
 * multiply-adds: -std=c11), so every element gets the same bits on any unit
 * and any thread count. tsr_exp is a few dozen vector operations, and on the
 * baseline unit (SSE, 4 floats) they, not the memory, set the pace. */
#include "activation.h"
#include "common.h"

#include <math.h>

#define ACT_BLOCK 8192 /* elements a task: 32 KiB of each operand */

TSR_WIDEST static void fwd_block(float *out, const float *gate, const float *up, size_t i0, size_t i1) {
#pragma omp simd
    for (size_t i = i0; i < i1; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + tsr_exp(-g)) * up[i];
    }
}

/* silu'(g) = s + g s (1 - s) with s = sigmoid(g). One loop per case of NULL
 * gradients, so that none of them branches (and each vectorizes). */
TSR_WIDEST static void bwd_block(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                             size_t i0, size_t i1) {
    if (dgate && dup) {
#pragma omp simd
        for (size_t i = i0; i < i1; i++) {
            float g = gate[i], s = 1.0f / (1.0f + tsr_exp(-g));
            dgate[i] += dout[i] * up[i] * s * (1.0f + g * (1.0f - s));
            dup[i] += dout[i] * g * s;
        }
    } else if (dgate) {
#pragma omp simd
        for (size_t i = i0; i < i1; i++) {
            float g = gate[i], s = 1.0f / (1.0f + tsr_exp(-g));
            dgate[i] += dout[i] * up[i] * s * (1.0f + g * (1.0f - s));
        }
    } else if (dup) {
#pragma omp simd
        for (size_t i = i0; i < i1; i++) {
            float g = gate[i];
            dup[i] += dout[i] * g / (1.0f + tsr_exp(-g));
        }
    }
}

void tsr_swiglu_fwd(float *out, const float *gate, const float *up, size_t n) {
    size_t nblk = (n + ACT_BLOCK - 1) / ACT_BLOCK;
#pragma omp parallel for schedule(static) if (nblk > 1)
    for (size_t b = 0; b < nblk; b++) fwd_block(out, gate, up, b * ACT_BLOCK, b + 1 < nblk ? (b + 1) * ACT_BLOCK : n);
}

void tsr_swiglu_bwd(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n) {
    if (!dgate && !dup) return;
    size_t nblk = (n + ACT_BLOCK - 1) / ACT_BLOCK;
#pragma omp parallel for schedule(static) if (nblk > 1)
    for (size_t b = 0; b < nblk; b++)
        bwd_block(dgate, dup, dout, gate, up, b * ACT_BLOCK, b + 1 < nblk ? (b + 1) * ACT_BLOCK : n);
}
