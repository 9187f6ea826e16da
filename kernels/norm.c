/* norm.c: RMSNorm forward and backward, one pass over the rows each.
 *
 * A row's sums (of x^2; of dy w x) are loops built for the baseline vector unit,
 * so that they keep the order they have always had (a vector sum's order
 * follows its width). The element-wise loops run on the widest unit the
 * processor has (target_clones, chosen once at load time): the same float
 * operations in the same order whatever the width (no contraction into fused
 * multiply-adds: -std=c11), so their bits do not depend on it. */
#include "norm.h"
#include "common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>


static float sum_sq(const float *x, int C) {
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int c = 0; c < C; c++) ss += x[c] * x[c];
    return ss;
}

static float dot3(const float *dy, const float *w, const float *x, int C) {
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int c = 0; c < C; c++) dot += dy[c] * w[c] * x[c];
    return dot;
}

/* y (C) = x r w */
TSR_WIDEST static void scale_row(float *y, const float *x, float r, const float *w, int C) {
#pragma omp simd
    for (int c = 0; c < C; c++) y[c] = x[c] * r * w[c];
}

/* dx (C) += r (w dy - k x) */
TSR_WIDEST static void dx_row(float *dx, const float *dy, const float *x, const float *w, float r, float k, int C) {
#pragma omp simd
    for (int c = 0; c < C; c++) dx[c] += r * (w[c] * dy[c] - k * x[c]);
}

/* part (C) += dy x r */
TSR_WIDEST static void dw_row(float *part, const float *dy, const float *x, float r, int C) {
#pragma omp simd
    for (int c = 0; c < C; c++) part[c] += dy[c] * x[c] * r;
}

/* dw (C) += p */
TSR_WIDEST static void add_row(float *dw, const float *p, int c0, int c1) {
#pragma omp simd
    for (int c = c0; c < c1; c++) dw[c] += p[c];
}

void tsr_rmsnorm_fwd(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps) {
    if (C <= 0) return;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        float r = 1.0f / sqrtf(sum_sq(x, C) / (float)C + eps);
        scale_row(out + (size_t)i * C, x, r, w, C);
        rstd[i] = r;
    }
}

/* dw is a sum over all rows. Rather than a second pass over dout and inp by
 * columns, the rows are cut into at most NORM_CHUNKS fixed chunks, each chunk
 * sums its rows into its own partial (C), and the partials are added in chunk
 * order: one pass over the data, and the same bits for any thread count. */
#define NORM_CHUNKS 32
#define NORM_COLS 256 /* columns per task when the partials are added */

/* y = x r w with r = (mean(x^2) + eps)^-1/2, so for one row
 *   dx_c = r w_c dy_c - x_c r^3 / C * sum_j dy_j w_j x_j,   dw_c = sum_rows dy_c x_c r. */
static void rms_bwd_rows(float *dinp, float *part, const float *dout, const float *inp, const float *w,
                         const float *rstd, int i0, int i1, int C) {
    for (int i = i0; i < i1; i++) {
        const float *x = inp + (size_t)i * C, *dy = dout + (size_t)i * C;
        float r = rstd[i];
        if (dinp) {
            float k = r * r * dot3(dy, w, x, C) / (float)C;
            dx_row(dinp + (size_t)i * C, dy, x, w, r, k, C);
        }
        if (part) dw_row(part, dy, x, r, C);
    }
}

void tsr_rmsnorm_bwd(float *dinp, float *dw, const float *dout, const float *inp, const float *w, const float *rstd,
                     int N, int C) {
    if (N <= 0 || C <= 0 || (!dinp && !dw)) return;
    int nch = N < NORM_CHUNKS ? N : NORM_CHUNKS;
    float *parts = dw ? malloc((size_t)nch * (size_t)C * sizeof *parts) : NULL;
    if (dw && !parts) { /* no memory for partials: one chunk, summed straight into dw */
        rms_bwd_rows(dinp, dw, dout, inp, w, rstd, 0, N, C);
        return;
    }
    int nblk = (C + NORM_COLS - 1) / NORM_COLS;
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int k = 0; k < nch; k++) {
            int i0 = (int)((long)N * k / nch), i1 = (int)((long)N * (k + 1) / nch);
            float *part = parts ? parts + (size_t)k * C : NULL;
            if (part) memset(part, 0, (size_t)C * sizeof *part); /* zeroed by the thread that sums into it */
            rms_bwd_rows(dinp, part, dout, inp, w, rstd, i0, i1, C);
        }
        if (parts) {
#pragma omp for schedule(static)
            for (int b = 0; b < nblk; b++) {
                int c0 = b * NORM_COLS, c1 = c0 + NORM_COLS < C ? c0 + NORM_COLS : C;
                for (int k = 0; k < nch; k++) add_row(dw, parts + (size_t)k * C, c0, c1);
            }
        }
    }
    free(parts);
}
