/* loss.c: softmax cross-entropy. The forward makes three passes over a row (its
 * max; exps written and summed; scaled by 1/sum) and computes each exp once. */
#include "loss.h"
#include "activation.h" /* tsr_exp, tsr_rowmax */

#include <math.h>
#include <stddef.h>

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
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j < V; j++) {
            float e = tsr_exp(x[j] - mx);
            p[j] = e;
            sum += e;
        }
        float inv = 1.0f / sum;
#pragma omp simd
        for (int j = 0; j < V; j++) p[j] *= inv;
        losses[i] = counted ? logf(sum) + mx - xt : 0.0f;
        count += counted;
    }
    return count;
}

void tsr_xent_bwd(float *dlogits, const float *probs, const int *targets, const float *dloss, int N, int V) {
    tsr_xent_part_bwd(dlogits, probs, targets, dloss, N, V, 0, V);
}

void tsr_xent_part_stats(float *stats, const float *logits, int N, int Vt) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *x = logits + (size_t)i * Vt;
        float mx = tsr_rowmax(x, Vt), sum = 0.0f;
        if (Vt > 0) {
#pragma omp simd reduction(+ : sum)
            for (int j = 0; j < Vt; j++) sum += tsr_exp(x[j] - mx);
        }
        stats[2 * i] = mx, stats[2 * i + 1] = sum;
    }
}

int tsr_xent_part_fwd(float *losses, float *probs, const float *logits, const int *targets, int N, int Vt, int v0,
                      const float *stats, int parts) {
    int count = 0;
#pragma omp parallel for schedule(static) reduction(+ : count)
    for (int i = 0; i < N; i++) {
        /* the row's max and sum of exps over every part, combined in part order */
        float mx = -INFINITY, sum = 0.0f;
        for (int r = 0; r < parts; r++) {
            float m = stats[(size_t)r * 2 * N + 2 * i];
            mx = m > mx ? m : mx;
        }
        for (int r = 0; r < parts; r++) {
            const float *st = stats + (size_t)r * 2 * N + 2 * i;
            if (st[1] > 0.0f) sum += st[1] * tsr_exp(st[0] - mx);
        }
        const float *x = logits + (size_t)i * Vt;
        float *p = probs + (size_t)i * Vt;
        int t = targets[i] - v0, here = targets[i] >= 0 && t >= 0 && t < Vt;
        float xt = here ? x[t] : 0.0f, inv = 1.0f / sum;
#pragma omp simd
        for (int j = 0; j < Vt; j++) p[j] = tsr_exp(x[j] - mx) * inv;
        losses[i] = here ? logf(sum) + mx - xt : 0.0f;
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
#pragma omp simd
        for (int j = 0; j < Vt; j++) d[j] += p[j] * dl;
        if (t >= v0 && t - v0 < Vt) d[t - v0] -= dl;
    }
}

double tsr_xent_sum(const float *losses, int N) {
    double sum = 0;
    for (int i = 0; i < N; i++) sum += losses[i];
    return sum;
}
