/* mem.c: memory of a kind: the host's, and in the CUDA build (TSR_CUDA) a
 * device's through the CUDA runtime. */
#include "mem.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common.h"

#ifdef TSR_CUDA
#include <cuda_runtime.h>

static int cuda_err(tsr_error *err, cudaError_t e, const char *what, size_t n) {
    return tsr_err(err, e == cudaErrorMemoryAllocation ? TSR_ENOMEM : TSR_EIO, "cuda memory: %s of %zu bytes: %s", what,
                   n, cudaGetErrorString(e));
}
#endif

int tsr_mem_usable(tsr_mem_kind kind, tsr_error *err) {
    if (kind == TSR_MEM_HOST) return 0;
#ifdef TSR_CUDA
    int n = 0;
    if (kind == TSR_MEM_CUDA) {
        cudaError_t e = cudaGetDeviceCount(&n);
        if (e == cudaSuccess && n > 0) return 0;
        cudaGetLastError();
        return tsr_err(err, TSR_EINVAL, "cuda memory: no GPU is present (%s)",
                       e == cudaSuccess ? "no device" : cudaGetErrorString(e));
    }
#endif
    return tsr_err(err, TSR_EINVAL, "%s memory: this build holds host memory only",
                   kind == TSR_MEM_CUDA ? "cuda" : "unknown");
}

void *tsr_mem_alloc(tsr_mem_kind kind, size_t n, tsr_error *err) {
    if (tsr_mem_usable(kind, err)) return NULL;
#ifdef TSR_CUDA
    if (kind == TSR_MEM_CUDA) {
        void *d = NULL;
        cudaError_t e = cudaMalloc(&d, n ? n : 1);
        if (e == cudaSuccess) e = cudaMemset(d, 0, n);
        if (e == cudaSuccess) return d;
        cuda_err(err, e, "allocation", n);
        cudaFree(d);
        return NULL;
    }
#endif
    /* a large buffer on transparent huge pages where the system allows them
     * (madvise mode): one fault per 2 MiB, not per 4 KiB page */
    enum { HUGE = 2 << 20 };
    void *p = NULL;
    if (n >= 2 * HUGE ? posix_memalign(&p, HUGE, (n + HUGE - 1) / HUGE * HUGE) : !(p = tsr_alloc_aligned(n))) p = NULL;
    if (!p) {
        tsr_err(err, TSR_ENOMEM, "out of memory for %zu MiB", n >> 20);
        return NULL;
    }
    if (n >= 2 * HUGE) madvise(p, (n + HUGE - 1) / HUGE * HUGE, MADV_HUGEPAGE);
    memset(p, 0, n);
    return p;
}

void tsr_mem_free(tsr_mem_kind kind, void *p) {
#ifdef TSR_CUDA
    if (kind == TSR_MEM_CUDA) {
        cudaFree(p);
        return;
    }
#endif
    (void)kind;
    free(p);
}

int tsr_mem_to_host(void *dst, const void *src, size_t n, tsr_mem_kind kind, tsr_error *err) {
#ifdef TSR_CUDA
    if (kind == TSR_MEM_CUDA) {
        cudaError_t e = cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost);
        return e == cudaSuccess ? 0 : cuda_err(err, e, "copy from the device", n);
    }
#endif
    (void)kind, (void)err;
    memcpy(dst, src, n);
    return 0;
}

int tsr_mem_from_host(void *dst, const void *src, size_t n, tsr_mem_kind kind, tsr_error *err) {
#ifdef TSR_CUDA
    if (kind == TSR_MEM_CUDA) {
        cudaError_t e = cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice);
        return e == cudaSuccess ? 0 : cuda_err(err, e, "copy to the device", n);
    }
#endif
    (void)kind, (void)err;
    memcpy(dst, src, n);
    return 0;
}
