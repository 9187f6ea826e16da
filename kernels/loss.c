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
    if (!dlogits) return;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        int t = targets[i];
        if (t < 0 || t >= V) continue;
        const float *p = probs + (size_t)i * V;
        float *d = dlogits + (size_t)i * V, dl = dloss[i];
#pragma omp simd
        for (int j = 0; j < V; j++) d[j] += p[j] * dl;
        d[t] -= dl;
    }
}

double tsr_xent_sum(const float *losses, int N) {
    double sum = 0;
    for (int i = 0; i < N; i++) sum += losses[i];
    return sum;
}
