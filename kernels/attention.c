/* attention.c: causal GQA on sgemm and OpenMP.
 *
 * Work is cut into tasks of ATT_BLK query rows of one head. Causality means rows
 * r0..r1 only see keys 0..r1, so each task multiplies (r1-r0, hd) by (hd, r1)
 * rather than by (hd, T): the products skip the upper triangle except inside the
 * diagonal block. Tasks have unequal costs (later blocks see more keys), so they
 * are handed out dynamically, largest first (the task index is block-major).
 *
 * Backward, per head, with P the probabilities, dO the output gradient and
 * s = 1/sqrt(hd):
 *   dP = dO V^T,   dS = s P * (dP - rowsum(P * dP))   (softmax backward),
 *   dQ += dS K,    dK += dS^T Q,    dV += P^T dO.
 * Pass 1 (tasks over query-row blocks of a head) writes dS into scratch and adds
 * dQ. Pass 2 (tasks over key-row blocks of a kv head) adds dK and dV, summing
 * the query heads of the group in order, so no two tasks write one element.
 * The tasks keep every core busy, so each of their sgemm calls runs on one
 * thread (tsr_blas_serial_begin; see matmul.c). */
#include "attention.h"
#include "common.h"
#include "activation.h" /* tsr_exp, tsr_rowmax */
#include "matmul.h"     /* tsr_blas_serial_begin */

#include <cblas.h>
#include <math.h>

#define ATT_BLK 64

/* The row loops of a task are built for the widest vector unit the processor
 * has (target_clones, chosen once at load time): their element-wise operations
 * give the same bits at any width (no contraction into fused multiply-adds:
 * -std=c11). Their sums are calls to the loops below, built for the baseline
 * unit, so that each sum keeps the order it has always had (a vector sum's
 * order follows its width). noinline: inlined into a wide caller they would
 * be built wide. */

__attribute__((noinline)) static float row_sum(const float *x, int n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int j = 0; j < n; j++) s += x[j];
    return s;
}

__attribute__((noinline)) static float row_dot(const float *x, const float *y, int n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int j = 0; j < n; j++) s += x[j] * y[j];
    return s;
}

/* Rows r0..r1 of P (rows T floats apart), each holding its scores for keys
 * 0..i: their softmax, and zeros after key i. */
TSR_WIDEST static void softmax_rows(float *P, int r0, int r1, int T) {
    for (int i = r0; i < r1; i++) {
        float *p = P + (size_t)i * T;
        float mx = tsr_rowmax(p, i + 1);
#pragma omp simd
        for (int j = 0; j <= i; j++) p[j] = tsr_exp(p[j] - mx);
        float inv = 1.0f / row_sum(p, i + 1);
#pragma omp simd
        for (int j = 0; j <= i; j++) p[j] *= inv;
        for (int j = i + 1; j < T; j++) p[j] = 0.0f;
    }
}

/* Rows r0..r1 of dS (rows T floats apart), holding dP for keys 0..i: the
 * softmax's backward dS = s P (dP - rowsum(P dP)), and zeros after key i up
 * to key r1 (pass 2 reads the diagonal block whole). */
TSR_WIDEST static void softmax_bwd_rows(float *dS, const float *P, int r0, int r1, int T, float scale) {
    for (int i = r0; i < r1; i++) {
        const float *p = P + (size_t)i * T;
        float *d = dS + (size_t)i * T, dot = row_dot(p, d, i + 1);
#pragma omp simd
        for (int j = 0; j <= i; j++) d[j] = scale * p[j] * (d[j] - dot);
        for (int j = i + 1; j < r1; j++) d[j] = 0.0f;
    }
}

static int bad_shape(int B, int T, int NH, int NKV, int hd) {
    return B <= 0 || T <= 0 || NH <= 0 || NKV <= 0 || hd <= 0 || NH % NKV != 0;
}

size_t tsr_attention_scratch(int B, int T, int NH, int hd) {
    (void)hd;
    if (B <= 0 || T <= 0 || NH <= 0) return 0;
    return (size_t)B * (size_t)NH * (size_t)T * (size_t)T;
}

void tsr_attention_fwd(float *out, float *att, const float *q, const float *k, const float *v, int B, int T, int NH,
                       int NKV, int hd) {
    if (bad_shape(B, T, NH, NKV, hd)) return;
    int rep = NH / NKV, nblk = (T + ATT_BLK - 1) / ATT_BLK;
    size_t qs = (size_t)NH * hd, ks = (size_t)NKV * hd; /* row strides of q/out and k/v */
    float scale = 1.0f / sqrtf((float)hd);
    long ntask = (long)B * NH * nblk;
    int nthr = tsr_blas_serial_begin();
#pragma omp parallel for schedule(dynamic, 1)
    for (long task = 0; task < ntask; task++) {
        int blk = nblk - 1 - (int)(task / ((long)B * NH)), h = (int)(task % NH), b = (int)(task / NH % B);
        int r0 = blk * ATT_BLK, r1 = r0 + ATT_BLK < T ? r0 + ATT_BLK : T;
        const float *qh = q + (size_t)b * T * qs + (size_t)h * hd;             /* row t at qh + t*qs */
        const float *kh = k + (size_t)b * T * ks + (size_t)(h / rep) * hd;     /* row t at kh + t*ks */
        const float *vh = v + (size_t)b * T * ks + (size_t)(h / rep) * hd;
        float *oh = out + (size_t)b * T * qs + (size_t)h * hd;
        float *P = att + ((size_t)b * NH + h) * T * T; /* (T,T) */
        // P[r0:r1, 0:r1] = scale * Q[r0:r1] K[0:r1]^T
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, r1, hd, scale, qh + r0 * qs, (int)qs, kh,
                    (int)ks, 0.0f, P + (size_t)r0 * T, T);
        softmax_rows(P, r0, r1, T); /* over keys 0..i, zeros after */
        // out[r0:r1] = P[r0:r1, 0:r1] V[0:r1]
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, hd, r1, 1.0f, P + (size_t)r0 * T, T, vh,
                    (int)ks, 0.0f, oh + r0 * qs, (int)qs);
    }
    tsr_blas_serial_end(nthr);
}

void tsr_attention_bwd(float *dq, float *dk, float *dv, float *scratch, const float *dout, const float *q,
                       const float *k, const float *v, const float *att, int B, int T, int NH, int NKV, int hd) {
    if (bad_shape(B, T, NH, NKV, hd) || (!dq && !dk && !dv)) return;
    int rep = NH / NKV, nblk = (T + ATT_BLK - 1) / ATT_BLK;
    size_t qs = (size_t)NH * hd, ks = (size_t)NKV * hd;
    float scale = 1.0f / sqrtf((float)hd);
    int nthr = tsr_blas_serial_begin();
    if (dq || dk) { /* pass 1: dS into scratch, dQ */
        long ntask = (long)B * NH * nblk;
#pragma omp parallel for schedule(dynamic, 1)
        for (long task = 0; task < ntask; task++) {
            int blk = nblk - 1 - (int)(task / ((long)B * NH)), h = (int)(task % NH), b = (int)(task / NH % B);
            int r0 = blk * ATT_BLK, r1 = r0 + ATT_BLK < T ? r0 + ATT_BLK : T;
            const float *doh = dout + (size_t)b * T * qs + (size_t)h * hd;
            const float *kh = k + (size_t)b * T * ks + (size_t)(h / rep) * hd;
            const float *vh = v + (size_t)b * T * ks + (size_t)(h / rep) * hd;
            const float *P = att + ((size_t)b * NH + h) * T * T;
            float *dS = scratch + ((size_t)b * NH + h) * T * T;
            // dP[r0:r1, 0:r1] = dO[r0:r1] V[0:r1]^T, written where dS goes
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, r1, hd, 1.0f, doh + r0 * qs, (int)qs, vh,
                        (int)ks, 0.0f, dS + (size_t)r0 * T, T);
            softmax_bwd_rows(dS, P, r0, r1, T, scale);
            if (dq) { // dQ[r0:r1] += dS[r0:r1, 0:r1] K[0:r1]
                float *dqh = dq + (size_t)b * T * qs + (size_t)h * hd;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, hd, r1, 1.0f, dS + (size_t)r0 * T, T,
                            kh, (int)ks, 1.0f, dqh + r0 * qs, (int)qs);
            }
        }
    }
    if (dk || dv) { /* pass 2: key rows c0..c1 of kv head g get their gradient from query rows c0..T */
        long ntask = (long)B * NKV * nblk;
#pragma omp parallel for schedule(dynamic, 1)
        for (long task = 0; task < ntask; task++) {
            int blk = (int)(task / ((long)B * NKV)), g = (int)(task % NKV), b = (int)(task / NKV % B);
            int c0 = blk * ATT_BLK, c1 = c0 + ATT_BLK < T ? c0 + ATT_BLK : T;
            for (int h = g * rep; h < (g + 1) * rep; h++) {
                const float *qh = q + (size_t)b * T * qs + (size_t)h * hd;
                const float *doh = dout + (size_t)b * T * qs + (size_t)h * hd;
                size_t head = ((size_t)b * NH + h) * T * T;
                if (dk) { // dK[c0:c1] += dS[c0:T, c0:c1]^T Q[c0:T]
                    float *dkg = dk + (size_t)b * T * ks + (size_t)g * hd;
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c1 - c0, hd, T - c0, 1.0f,
                                scratch + head + (size_t)c0 * T + c0, T, qh + c0 * qs, (int)qs, 1.0f, dkg + c0 * ks,
                                (int)ks);
                }
                if (dv) { // dV[c0:c1] += P[c0:T, c0:c1]^T dO[c0:T]
                    float *dvg = dv + (size_t)b * T * ks + (size_t)g * hd;
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c1 - c0, hd, T - c0, 1.0f,
                                att + head + (size_t)c0 * T + c0, T, doh + c0 * qs, (int)qs, 1.0f, dvg + c0 * ks,
                                (int)ks);
                }
            }
        }
    }
    tsr_blas_serial_end(nthr);
}
