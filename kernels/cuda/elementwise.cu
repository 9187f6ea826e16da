/* elementwise.cu: fill, add, bf16 casts, AdamW and the order-free hash, one
 * element per thread in grid-stride loops; each element computed as its CPU
 * twin computes it. */
#include <math.h>

#include "cuda_impl.h"

#define GRID(n) tsr_cu_blocks((n), TSR_CU_THREADS), TSR_CU_THREADS, 0, tsr_cu_stream(s)
#define FOR_EACH(i, n) for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

static __global__ void fill_k(float *x, size_t n, float v) {
    FOR_EACH(i, n) x[i] = v;
}
extern "C" void tsr_cuda_fill(float *x, size_t n, float v, tsr_stream *s) {
    if (n) fill_k<<<GRID(n)>>>(x, n, v);
}

static __global__ void add_k(float *out, const float *a, const float *b, size_t n) {
    FOR_EACH(i, n) out[i] = a[i] + b[i];
}
extern "C" void tsr_cuda_add(float *out, const float *a, const float *b, size_t n, tsr_stream *s) {
    if (n) add_k<<<GRID(n)>>>(out, a, b, n);
}

/* As tsr_f32_to_bf16: NaN stays a quiet NaN, the rest rounds to nearest even. */
static __global__ void to_bf16_k(uint16_t *out, const float *in, size_t n) {
    FOR_EACH(i, n) out[i] = tsr_cu_bf16(in[i]);
}
extern "C" void tsr_cuda_f32_to_bf16(uint16_t *out, const float *in, size_t n, tsr_stream *s) {
    if (n) to_bf16_k<<<GRID(n)>>>(out, in, n);
}

static __global__ void from_bf16_k(float *out, const uint16_t *in, size_t n) {
    FOR_EACH(i, n) out[i] = __uint_as_float((uint32_t)in[i] << 16);
}
extern "C" void tsr_cuda_bf16_to_f32(float *out, const uint16_t *in, size_t n, tsr_stream *s) {
    if (n) from_bf16_k<<<GRID(n)>>>(out, in, n);
}

/* The float operations of tsr_adamw, in its order (no fused multiply-adds, so
 * that the result is the CPU's to the bit). */
static __global__ void adamw_k(float *p, const float *g, float gscale, float *m, float *v, size_t n, float beta1,
                               float beta2, float eps, float step, float rsq_bc2, float decay) {
    FOR_EACH(i, n) {
        float gi = __fmul_rn(g[i], gscale);
        float mi = __fadd_rn(__fmul_rn(beta1, m[i]), __fmul_rn(1.0f - beta1, gi));
        float vi = __fadd_rn(__fmul_rn(beta2, v[i]), __fmul_rn(__fmul_rn(1.0f - beta2, gi), gi));
        m[i] = mi;
        v[i] = vi;
        float den = __fadd_rn(__fmul_rn(sqrtf(vi), rsq_bc2), eps);
        p[i] = __fsub_rn(__fmul_rn(p[i], decay), __fdiv_rn(__fmul_rn(step, mi), den));
    }
}
extern "C" void tsr_cuda_adamw(float *p, const float *g, float gscale, float *m, float *v, size_t n, float lr, float beta1,
                               float beta2, float eps, float weight_decay, long t, tsr_stream *s) {
    double bc1 = 1.0 - pow((double)beta1, (double)t), bc2 = 1.0 - pow((double)beta2, (double)t);
    float step = (float)(lr / bc1), rsq_bc2 = (float)(1.0 / sqrt(bc2)), decay = 1.0f - lr * weight_decay;
    if (n) adamw_k<<<GRID(n)>>>(p, g, gscale, m, v, n, beta1, beta2, eps, step, rsq_bc2, decay);
}

/* tsr_hash_sum's terms (base/common.h's tsr_mix64), summed per thread, then
 * per warp, then one atomic add a warp: integer sums, so the order is free. */
static __device__ __forceinline__ uint64_t hash_mix(uint64_t x) {
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
static __global__ void hash_sum_k(unsigned long long *acc, const uint32_t *x, size_t n, uint64_t index0) {
    uint64_t s = 0;
    FOR_EACH(i, n) s += hash_mix((uint64_t)x[i] + (index0 + i) * 0x9e3779b97f4a7c15ull); /* TSR_HASH_K */
    for (int o = 16; o > 0; o /= 2) s += __shfl_down_sync(0xffffffffu, (unsigned long long)s, o);
    if ((threadIdx.x & 31) == 0 && s) atomicAdd(acc, (unsigned long long)s);
}
extern "C" void tsr_cuda_hash_sum_add(uint64_t *acc, const void *x, size_t n, uint64_t index0, tsr_stream *s) {
    if (n) hash_sum_k<<<GRID(n)>>>((unsigned long long *)acc, (const uint32_t *)x, n, index0);
}
