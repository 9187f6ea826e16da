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

#endif
