/* cuda_impl.h: what the CUDA kernels share (the .cu files of kernels/cuda). Not installed. */
#ifndef TSR_CUDA_IMPL_H
#define TSR_CUDA_IMPL_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include "tsr_cuda.h"

/* A tsr_stream * is a cudaStream_t (NULL: the default stream). */
static inline cudaStream_t tsr_cu_stream(tsr_stream *s) { return (cudaStream_t)s; }

/* Grid-stride loops: at most this many blocks, each thread taking every
 * gridDim * blockDim-th element. */
#define TSR_CU_MAX_BLOCKS 65535u
#define TSR_CU_THREADS 256u
/* tsr_cu_blocks(): the blocks of a grid-stride launch over n elements. */
unsigned tsr_cu_blocks(size_t n, unsigned threads);

/* tsr_cu_cublas(): the process's cuBLAS handle on the current device, set to
 * queue on s, or NULL when cuBLAS cannot start. tensor_ops 0: pedantic math (f32
 * products in f32, no TF32: the f32 twins); 1: the default math, where products
 * of bf16 inputs may run on tensor cores (the mixed-precision kernels). One
 * stream at a time: a handle keeps the last stream it was given. (matmul.cu) */
cublasHandle_t tsr_cu_cublas(tsr_stream *s, int tensor_ops);
/* tsr_cu_fail(): records the failure of a kernel that returns nothing (a cuBLAS
 * call it makes refused: status), so that the next tsr_cuda_sync reports it as
 * "cuda: <what>: cuBLAS status <status>". The first failure is kept until then. (runtime.cu) */
void tsr_cu_fail(const char *what, int status);

#ifdef __CUDACC__
/* tsr_cu_bf16(): x rounded to bf16 as tsr_f32_to_bf16 rounds it: to nearest
 * even, NaN kept a quiet NaN, overflow to infinity. */
static __device__ __forceinline__ uint16_t tsr_cu_bf16(float x) {
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* tsr_cu_block_reduce(): the sum (or, with is_max, the maximum) of every thread's
 * v over a block of THREADS threads, in a fixed tree, so the same every run; every
 * thread gets it. Every thread of the block must call it. */
template <unsigned THREADS>
static __device__ float tsr_cu_block_reduce(float v, int is_max) {
    __shared__ float buf[THREADS];
    buf[threadIdx.x] = v;
    __syncthreads();
    for (unsigned w = THREADS / 2; w > 0; w /= 2) {
        if (threadIdx.x < w) {
            float o = buf[threadIdx.x + w];
            buf[threadIdx.x] = is_max ? fmaxf(buf[threadIdx.x], o) : buf[threadIdx.x] + o;
        }
        __syncthreads();
    }
    float r = buf[0];
    __syncthreads();
    return r;
}
#endif

#endif
