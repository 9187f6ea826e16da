/* loss.c: softmax cross-entropy. The forward makes four passes over a row (its
 * max; exps written; summed; scaled by 1/sum) and computes each exp once.
 *
 * The element-wise passes are built for the widest vector unit the processor
 * has (target_clones, chosen once at load time): the same float operations in
 * the same order whatever the width (no contraction into fused multiply-adds:
 * -std=c11), so their bits do not depend on it. The sums are kept out of them,
 * in loops of their own built for the baseline unit: a vector sum's order
 * follows its width, and the sums keep the order they have always had. */
#include "loss.h"
#include "common.h"
#include "activation.h" /* tsr_exp, tsr_rowmax */

#include <math.h>
#include <stddef.h>
#include <stdlib.h>


/* e (n) = exp(x - mx); e may alias x. */
TSR_WIDEST static void exp_shifted(float *e, const float *x, float mx, int n) {
#pragma omp simd
    for (int j = 0; j < n; j++) e[j] = tsr_exp(x[j] - mx);
}

/* x (n) *= a */
TSR_WIDEST static void scale(float *x, float a, int n) {
#pragma omp simd
    for (int j = 0; j < n; j++) x[j] *= a;
}

/* p (n) = exp(x - mx) * inv; p may alias x. */
TSR_WIDEST static void exp_shifted_scaled(float *p, const float *x, float mx, float inv, int n) {
#pragma omp simd
    for (int j = 0; j < n; j++) p[j] = tsr_exp(x[j] - mx) * inv;
}

/* d (n) += p * a */
TSR_WIDEST static void add_scaled(float *d, const float *p, float a, int n) {
#pragma omp simd
    for (int j = 0; j < n; j++) d[j] += p[j] * a;
}

static float row_sum(const float *x, int n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int j = 0; j < n; j++) s += x[j];
    return s;
}

int tsr_xent_fwd(float *losses, float *probs, const float *logits, const int *targets, int N, int V) {
    int count = 0;
    if (V <= 0) {
        for (int i = 0; i < N; i++) losses[i] = 0.0f;
        return 0;
    }
#pragma omp parallel for schedule(static) reduction(+ : count)
    for (int i = 0; i < N; i++) {
        const float *x = logits + (size_t)i * V;
        float *p = probs + (size_t)i * V;
        int t = targets[i];
        int counted = t >= 0 && t < V;
        float xt = counted ? x[t] : 0.0f; /* read before p overwrites x when they alias */
        float mx = tsr_rowmax(x, V);
        exp_shifted(p, x, mx, V);
        float se = row_sum(p, V);
        scale(p, 1.0f / se, V);
        losses[i] = counted ? logf(se) + mx - xt : 0.0f;
        count += counted;
    }
    return count;
}

void tsr_xent_bwd(float *dlogits, const float *probs, const int *targets, const float *dloss, int N, int V) {
    tsr_xent_part_bwd(dlogits, probs, targets, dloss, N, V, 0, V);
}

/* The exps of a row go to a row of scratch of each thread's (the logits are
 * the caller's), then are summed as before. */
void tsr_xent_part_stats(float *stats, const float *logits, int N, int Vt) {
#pragma omp parallel
    {
        float *e = Vt > 0 ? malloc((size_t)Vt * sizeof *e) : NULL;
#pragma omp for schedule(static)
        for (int i = 0; i < N; i++) {
            const float *x = logits + (size_t)i * Vt;
            float mx = tsr_rowmax(x, Vt), se = 0.0f;
            if (Vt > 0 && e) {
                exp_shifted(e, x, mx, Vt);
                se = row_sum(e, Vt);
            } else if (Vt > 0) { /* no memory for the row: the same sum, its exps in the narrow unit */
#pragma omp simd reduction(+ : se)
                for (int j = 0; j < Vt; j++) se += tsr_exp(x[j] - mx);
            }
            stats[2 * i] = mx, stats[2 * i + 1] = se;
        }
        free(e);
    }
}

int tsr_xent_part_fwd(float *losses, float *probs, const float *logits, const int *targets, int N, int Vt, int v0,
                      const float *stats, int parts) {
    int count = 0;
#pragma omp parallel for schedule(static) reduction(+ : count)
    for (int i = 0; i < N; i++) {
        /* the row's max and sum of exps over every part, combined in part order */
        float mx = -INFINITY, se = 0.0f;
        for (int r = 0; r < parts; r++) {
            float m = stats[(size_t)r * 2 * N + 2 * i];
            mx = m > mx ? m : mx;
        }
        for (int r = 0; r < parts; r++) {
            const float *st = stats + (size_t)r * 2 * N + 2 * i;
            if (st[1] > 0.0f) se += st[1] * tsr_exp(st[0] - mx);
        }
        const float *x = logits + (size_t)i * Vt;
        float *p = probs + (size_t)i * Vt;
        int t = targets[i] - v0, here = targets[i] >= 0 && t >= 0 && t < Vt;
        float xt = here ? x[t] : 0.0f;
        exp_shifted_scaled(p, x, mx, 1.0f / se, Vt);
        losses[i] = here ? logf(se) + mx - xt : 0.0f;
        count += here;
    }
    return count;
}

void tsr_xent_part_bwd(float *dlogits, const float *probs, const int *targets, const float *dloss, int N, int Vt,
                       int v0, int V) {
    if (!dlogits) return;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        int t = targets[i];
        if (t < 0 || t >= V) continue;
        const float *p = probs + (size_t)i * Vt;
        float *d = dlogits + (size_t)i * Vt, dl = dloss[i];
        add_scaled(d, p, dl, Vt);
        if (t >= v0 && t - v0 < Vt) d[t - v0] -= dl;
    }
}

double tsr_xent_sum(const float *losses, int N) {
    double sum = 0;
    for (int i = 0; i < N; i++) sum += losses[i];
    return sum;
}
