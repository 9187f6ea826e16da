/* layers.cu: RoPE (Meta's interleaved pairs), SwiGLU and the softmax
 * cross-entropy (whole or vocabulary-parallel), forward and backward, as their
 * CPU twins compute them (the exponentials with CUDA's expf; sums over a row in a
 * fixed block tree). */
#include <math.h>

#include "cuda_impl.h"

#define GRID(n) tsr_cu_blocks((n), TSR_CU_THREADS), TSR_CU_THREADS, 0, tsr_cu_stream(s)
#define FOR_EACH(i, n) for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)
#define ROW_THREADS 256

/* One thread per pair (x[2i], x[2i+1]) of every head vector; dir -1 rotates back. */
static __global__ void rope_k(float *x, const float *cos_t, const float *sin_t, size_t pairs, int T, int H, int half,
                              float dir) {
    FOR_EACH(k, pairs) {
        int i = (int)(k % half);
        size_t bt = k / half / H;
        int t = (int)(bt % T);
        float c = cos_t[(size_t)t * half + i], si = dir * sin_t[(size_t)t * half + i];
        float *v = x + 2 * k;
        float x0 = v[0], x1 = v[1];
        v[0] = x0 * c - x1 * si;
        v[1] = x0 * si + x1 * c;
    }
}
/* cos_t and sin_t: tsr_rope_tables', in device memory. */
extern "C" void tsr_cuda_rope_fwd(float *x, const float *cos_t, const float *sin_t, int B, int T, int H, int hd,
                                  tsr_stream *s) {
    size_t pairs = (size_t)B * T * H * (hd / 2);
    if (pairs) rope_k<<<GRID(pairs)>>>(x, cos_t, sin_t, pairs, T, H, hd / 2, 1.0f);
}
extern "C" void tsr_cuda_rope_bwd(float *dx, const float *cos_t, const float *sin_t, int B, int T, int H, int hd,
                                  tsr_stream *s) {
    size_t pairs = (size_t)B * T * H * (hd / 2);
    if (pairs) rope_k<<<GRID(pairs)>>>(dx, cos_t, sin_t, pairs, T, H, hd / 2, -1.0f);
}

static __global__ void swiglu_fwd_k(float *out, const float *gate, const float *up, size_t n) {
    FOR_EACH(i, n) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}
extern "C" void tsr_cuda_swiglu_fwd(float *out, const float *gate, const float *up, size_t n, tsr_stream *s) {
    if (n) swiglu_fwd_k<<<GRID(n)>>>(out, gate, up, n);
}
static __global__ void swiglu_bwd_k(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                                    size_t n) {
    FOR_EACH(i, n) {
        float g = gate[i], sg = 1.0f / (1.0f + expf(-g));
        if (dgate) dgate[i] += dout[i] * up[i] * sg * (1.0f + g * (1.0f - sg));
        if (dup) dup[i] += dout[i] * g * sg;
    }
}
extern "C" void tsr_cuda_swiglu_bwd(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                                    size_t n, tsr_stream *s) {
    if (n && (dgate || dup)) swiglu_bwd_k<<<GRID(n)>>>(dgate, dup, dout, gate, up, n);
}

/* One block per row: max, the exponentials and their sum, probabilities, loss. */
static __global__ void xent_fwd_k(float *losses, float *probs, const float *logits, const int *targets, int V) {
    const float *x = logits + (size_t)blockIdx.x * V;
    float *p = probs + (size_t)blockIdx.x * V;
    int t = targets[blockIdx.x], counted = t >= 0 && t < V;
    float xt = counted ? x[t] : 0.0f; /* read before p overwrites x when they alias */
    __syncthreads();
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, x[j]);
    mx = tsr_cu_block_reduce<ROW_THREADS>(mx, 1);
    float sum = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float e = expf(x[j] - mx);
        p[j] = e;
        sum += e;
    }
    sum = tsr_cu_block_reduce<ROW_THREADS>(sum, 0);
    float inv = 1.0f / sum;
    for (int j = threadIdx.x; j < V; j += blockDim.x) p[j] *= inv;
    if (threadIdx.x == 0) losses[blockIdx.x] = counted ? logf(sum) + mx - xt : 0.0f;
}
extern "C" void tsr_cuda_xent_fwd(float *losses, float *probs, const float *logits, const int *targets, int N, int V,
                                  tsr_stream *s) {
    if (N <= 0) return;
    if (V <= 0) {
        cudaMemsetAsync(losses, 0, (size_t)N * sizeof *losses, tsr_cu_stream(s));
        return;
    }
    xent_fwd_k<<<N, ROW_THREADS, 0, tsr_cu_stream(s)>>>(losses, probs, logits, targets, V);
}
static __global__ void xent_bwd_k(float *dlogits, const float *probs, const int *targets, const float *dloss, int V) {
    int t = targets[blockIdx.x];
    if (t < 0 || t >= V) return;
    const float *p = probs + (size_t)blockIdx.x * V;
    float *d = dlogits + (size_t)blockIdx.x * V, dl = dloss[blockIdx.x];
    for (int j = threadIdx.x; j < V; j += blockDim.x) d[j] += j == t ? p[j] * dl - dl : p[j] * dl;
}
extern "C" void tsr_cuda_xent_bwd(float *dlogits, const float *probs, const int *targets, const float *dloss, int N,
                                  int V, tsr_stream *s) {
    if (dlogits && N > 0 && V > 0) xent_bwd_k<<<N, ROW_THREADS, 0, tsr_cu_stream(s)>>>(dlogits, probs, targets, dloss, V);
}

/* Vocabulary-parallel cross-entropy (tsr_xent_part_*): a part holds columns
 * [v0, v0 + Vt) of the V classes. One block per row, as above. */

/* stats (N,2): the row's max over the part and the sum of exp(logit - max); an
 * empty part (Vt = 0) reads nothing and writes -inf and 0. */
static __global__ void xent_part_stats_k(float *stats, const float *logits, int Vt) {
    const float *x = logits + (size_t)blockIdx.x * Vt;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < Vt; j += blockDim.x) mx = fmaxf(mx, x[j]);
    mx = tsr_cu_block_reduce<ROW_THREADS>(mx, 1);
    float sum = 0.0f;
    for (int j = threadIdx.x; j < Vt; j += blockDim.x) sum += expf(x[j] - mx);
    sum = tsr_cu_block_reduce<ROW_THREADS>(sum, 0);
    if (threadIdx.x == 0) stats[2 * blockIdx.x] = mx, stats[2 * blockIdx.x + 1] = sum;
}
extern "C" void tsr_cuda_xent_part_stats(float *stats, const float *logits, int N, int Vt, tsr_stream *s) {
    if (N > 0) xent_part_stats_k<<<N, ROW_THREADS, 0, tsr_cu_stream(s)>>>(stats, logits, Vt > 0 ? Vt : 0);
}

/* Every thread combines the parts' stats of its row itself, in part order as the
 * CPU does (a few reads, the same result in every thread), then writes its
 * columns of the softmax; the loss where the target is in this part. */
static __global__ void xent_part_fwd_k(float *losses, float *probs, const float *logits, const int *targets, int N,
                                       int Vt, int v0, const float *stats, int parts) {
    size_t i = blockIdx.x;
    float mx = -INFINITY, sum = 0.0f;
    for (int r = 0; r < parts; r++) mx = fmaxf(mx, stats[(size_t)r * 2 * N + 2 * i]);
    for (int r = 0; r < parts; r++) {
        const float *st = stats + (size_t)r * 2 * N + 2 * i;
        if (st[1] > 0.0f) sum += st[1] * expf(st[0] - mx);
    }
    const float *x = logits + i * Vt;
    float *p = probs + i * Vt;
    int t = targets[i] - v0, here = targets[i] >= 0 && t >= 0 && t < Vt;
    float xt = here ? x[t] : 0.0f, inv = 1.0f / sum;
    __syncthreads(); /* xt is read before p overwrites x when they alias */
    for (int j = threadIdx.x; j < Vt; j += blockDim.x) p[j] = expf(x[j] - mx) * inv;
    if (threadIdx.x == 0) losses[i] = here ? logf(sum) + mx - xt : 0.0f;
}
extern "C" void tsr_cuda_xent_part_fwd(float *losses, float *probs, const float *logits, const int *targets, int N,
                                       int Vt, int v0, const float *stats, int parts, tsr_stream *s) {
    if (N > 0)
        xent_part_fwd_k<<<N, ROW_THREADS, 0, tsr_cu_stream(s)>>>(losses, probs, logits, targets, N, Vt > 0 ? Vt : 0,
                                                                 v0, stats, parts);
}

/* dlogits += probs * dloss[i] on a counted row (0 <= target < V), then less
 * dloss[i] at a target in the part: the CPU's two roundings there. */
static __global__ void xent_part_bwd_k(float *dlogits, const float *probs, const int *targets, const float *dloss,
                                       int Vt, int v0, int V) {
    int t = targets[blockIdx.x];
    if (t < 0 || t >= V) return;
    const float *p = probs + (size_t)blockIdx.x * Vt;
    float *d = dlogits + (size_t)blockIdx.x * Vt, dl = dloss[blockIdx.x];
    int tl = t - v0; /* the target's column in the part, if it is there */
    for (int j = threadIdx.x; j < Vt; j += blockDim.x) {
        float v = d[j] + p[j] * dl;
        d[j] = j == tl ? v - dl : v;
    }
}
extern "C" void tsr_cuda_xent_part_bwd(float *dlogits, const float *probs, const int *targets, const float *dloss,
                                       int N, int Vt, int v0, int V, tsr_stream *s) {
    if (dlogits && N > 0 && Vt > 0)
        xent_part_bwd_k<<<N, ROW_THREADS, 0, tsr_cu_stream(s)>>>(dlogits, probs, targets, dloss, Vt, v0, V);
}
