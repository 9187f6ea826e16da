/* cuda_impl.h: what the CUDA kernels share (the .cu files of kernels/cuda). Not installed. */
#ifndef TSR_CUDA_IMPL_H
#define TSR_CUDA_IMPL_H

#include <cuda_runtime.h>
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

#ifdef __CUDACC__
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
