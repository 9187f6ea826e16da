/* attention.cu: causal grouped-query attention, forward and backward, with the
 * probabilities kept (B, NH, T, T) as the CPU kernel keeps them. A plain
 * version, one block per query row (and per key row in backward's second pass),
 * every sum in a fixed order, so that results do not change from run to run;
 * the fused flash-style kernel replaces it once it can be measured on a GPU.
 * With s = 1/sqrt(hd): P = softmax(s Q K^T) (causal), O = P V;
 * dP = dO V^T, dS = s P * (dP - rowsum(P * dP)), dQ += dS K, dK += dS^T Q,
 * dV += P^T dO (the query heads of a group summed in head order). */
#include <math.h>

#include "cuda_impl.h"

#define ATT_THREADS 128

/* The dot product of n floats, in order. */
static __device__ float dot_n(const float *a, const float *b, int n) {
    float s = 0.0f;
    for (int d = 0; d < n; d++) s += a[d] * b[d];
    return s;
}

/* Block (b, h, i): row i of head h's probabilities, then row i of its output. */
static __global__ void att_fwd_k(float *out, float *att, const float *q, const float *k, const float *v, int T, int NH,
                                 int rep, int hd, float scale) {
    int i = blockIdx.x % T, h = blockIdx.x / T % NH, b = blockIdx.x / T / NH, g = h / rep;
    size_t qs = (size_t)NH * hd, ks = (size_t)(NH / rep) * hd;
    const float *qi = q + ((size_t)b * T + i) * qs + (size_t)h * hd;
    const float *kb = k + (size_t)b * T * ks + (size_t)g * hd, *vb = v + (size_t)b * T * ks + (size_t)g * hd;
    float *p = att + (((size_t)b * NH + h) * T + i) * T;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j <= i; j += blockDim.x) {
        p[j] = scale * dot_n(qi, kb + (size_t)j * ks, hd);
        mx = fmaxf(mx, p[j]);
    }
    mx = tsr_cu_block_reduce<ATT_THREADS>(mx, 1);
    float sum = 0.0f;
    for (int j = threadIdx.x; j <= i; j += blockDim.x) sum += (p[j] = expf(p[j] - mx));
    float inv = 1.0f / tsr_cu_block_reduce<ATT_THREADS>(sum, 0);
    for (int j = threadIdx.x; j < T; j += blockDim.x) p[j] = j <= i ? p[j] * inv : 0.0f;
    __syncthreads();
    float *o = out + ((size_t)b * T + i) * qs + (size_t)h * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j <= i; j++) acc += p[j] * vb[(size_t)j * ks + d];
        o[d] = acc;
    }
}

extern "C" void tsr_cuda_attention_fwd(float *out, float *att, const float *q, const float *k, const float *v, int B,
                                       int T, int NH, int NKV, int hd, tsr_stream *s) {
    if (B <= 0 || T <= 0 || NH <= 0 || NKV <= 0 || hd <= 0 || NH % NKV != 0) return;
    att_fwd_k<<<(unsigned)B * NH * T, ATT_THREADS, 0, tsr_cu_stream(s)>>>(out, att, q, k, v, T, NH, NH / NKV, hd,
                                                                        1.0f / sqrtf((float)hd));
}

/* Pass 1, block (b, h, i): row i of dS into scratch, and dQ's row i. */
static __global__ void att_bwd_q_k(float *dq, float *dS, const float *dout, const float *k, const float *v,
                                   const float *att, int T, int NH, int rep, int hd, float scale) {
    int i = blockIdx.x % T, h = blockIdx.x / T % NH, b = blockIdx.x / T / NH, g = h / rep;
    size_t qs = (size_t)NH * hd, ks = (size_t)(NH / rep) * hd, row = (((size_t)b * NH + h) * T + i) * T;
    const float *doi = dout + ((size_t)b * T + i) * qs + (size_t)h * hd;
    const float *kb = k + (size_t)b * T * ks + (size_t)g * hd, *vb = v + (size_t)b * T * ks + (size_t)g * hd;
    const float *p = att + row;
    float *d = dS + row, dot = 0.0f;
    for (int j = threadIdx.x; j <= i; j += blockDim.x) {
        d[j] = dot_n(doi, vb + (size_t)j * ks, hd);
        dot += p[j] * d[j];
    }
    dot = tsr_cu_block_reduce<ATT_THREADS>(dot, 0);
    for (int j = threadIdx.x; j < T; j += blockDim.x) d[j] = j <= i ? scale * p[j] * (d[j] - dot) : 0.0f;
    __syncthreads();
    if (!dq) return;
    float *dqi = dq + ((size_t)b * T + i) * qs + (size_t)h * hd;
    for (int e = threadIdx.x; e < hd; e += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j <= i; j++) acc += d[j] * kb[(size_t)j * ks + e];
        dqi[e] += acc;
    }
}

/* Pass 2, block (b, g, j): key row j of kv head g, from query rows j..T-1 of the
 * group's heads, in head order. */
static __global__ void att_bwd_kv_k(float *dk, float *dv, const float *dS, const float *dout, const float *q,
                                    const float *att, int T, int NH, int rep, int hd) {
    int NKV = NH / rep, j = blockIdx.x % T, g = blockIdx.x / T % NKV, b = blockIdx.x / T / NKV;
    size_t qs = (size_t)NH * hd, ks = (size_t)NKV * hd, krow = ((size_t)b * T + j) * ks + (size_t)g * hd;
    for (int e = threadIdx.x; e < hd; e += blockDim.x) {
        float ak = 0.0f, av = 0.0f;
        for (int h = g * rep; h < (g + 1) * rep; h++) {
            size_t head = ((size_t)b * NH + h) * T;
            for (int i = j; i < T; i++) {
                size_t at = (head + i) * T + j, qrow = ((size_t)b * T + i) * qs + (size_t)h * hd + e;
                ak += dS[at] * q[qrow];
                av += att[at] * dout[qrow];
            }
        }
        if (dk) dk[krow + e] += ak;
        if (dv) dv[krow + e] += av;
    }
}

extern "C" void tsr_cuda_attention_bwd(float *dq, float *dk, float *dv, float *scratch, const float *dout,
                                       const float *q, const float *k, const float *v, const float *att, int B, int T,
                                       int NH, int NKV, int hd, tsr_stream *s) {
    if (B <= 0 || T <= 0 || NH <= 0 || NKV <= 0 || hd <= 0 || NH % NKV != 0 || (!dq && !dk && !dv)) return;
    int rep = NH / NKV;
    att_bwd_q_k<<<(unsigned)B * NH * T, ATT_THREADS, 0, tsr_cu_stream(s)>>>(dq, scratch, dout, k, v, att, T, NH, rep,
                                                                          hd, 1.0f / sqrtf((float)hd));
    if (dk || dv)
        att_bwd_kv_k<<<(unsigned)B * NKV * T, ATT_THREADS, 0, tsr_cu_stream(s)>>>(dk, dv, scratch, dout, q, att, T, NH,
                                                                                rep, hd);
}
