/* mem.c: memory of a kind: the host's, and in the CUDA build (TSR_CUDA) a
 * device's through the CUDA runtime. */
#include "mem.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common.h"

/* A host copy whose destination is not read again by this CPU soon (a save's
 * staging arena: the disk reads it): stored around the caches (non-temporal),
 * which spares the memory the read of each destination line before its write
 * and the caches the eviction of what the training step uses. glibc's memcpy
 * streams only copies above hundreds of MiB here; the staging copy runs in
 * pieces of a few MiB. */
#if defined(__x86_64__)
__attribute__((target("avx2"))) static void copy_stream_avx2(uint8_t *dst, const uint8_t *src, size_t n) {
    size_t head = (32 - ((uintptr_t)dst & 31)) & 31;
    if (head > n) head = n;
    memcpy(dst, src, head);
    dst += head, src += head, n -= head;
    for (; n >= 128; dst += 128, src += 128, n -= 128) {
        __m256i a = _mm256_loadu_si256((const __m256i *)src), b = _mm256_loadu_si256((const __m256i *)(src + 32));
        __m256i c = _mm256_loadu_si256((const __m256i *)(src + 64)), d = _mm256_loadu_si256((const __m256i *)(src + 96));
        _mm256_stream_si256((__m256i *)dst, a);
        _mm256_stream_si256((__m256i *)(dst + 32), b);
        _mm256_stream_si256((__m256i *)(dst + 64), c);
        _mm256_stream_si256((__m256i *)(dst + 96), d);
    }
    _mm_sfence();
    memcpy(dst, src, n);
}
#endif

static void copy_stream(void *dst, const void *src, size_t n) {
#if defined(__x86_64__)
    if (n >= 4096 && __builtin_cpu_supports("avx2")) {
        copy_stream_avx2(dst, src, n);
        return;
    }
#endif
    memcpy(dst, src, n);
}

#ifdef TSR_CUDA
#include <cuda_runtime.h>
#include <pthread.h>

static int cuda_err(tsr_error *err, cudaError_t e, const char *what, size_t n) {
    return tsr_err(err, e == cudaErrorMemoryAllocation ? TSR_ENOMEM : TSR_EIO, "cuda memory: %s of %zu bytes: %s", what,
                   n, cudaGetErrorString(e));
}
#endif

int tsr_mem_usable(tsr_mem_kind kind, tsr_error *err) {
    if (kind == TSR_MEM_HOST || kind == TSR_MEM_GUARD) return 0;
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
    if (kind == TSR_MEM_GUARD) return tsr_guard_alloc(n, err);
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
    if (kind == TSR_MEM_GUARD) {
        tsr_guard_free(p);
        return;
    }
#ifdef TSR_CUDA
    if (kind == TSR_MEM_CUDA) {
        cudaFree(p);
        return;
    }
#endif
    (void)kind;
    free(p);
}

#ifdef TSR_CUDA
/* Copies to the host go on streams of their own (non-blocking: they neither wait
 * for nor hold up the kernels of a step on the legacy default stream), several
 * at once from the staging threads: a few streams, made as needed and kept. */
enum { SPARE_STREAMS = 64 };
static pthread_mutex_t streams_mu = PTHREAD_MUTEX_INITIALIZER;
static cudaStream_t spare[SPARE_STREAMS];
static int n_spare;

static cudaStream_t stream_take(void) {
    cudaStream_t s = NULL;
    pthread_mutex_lock(&streams_mu);
    if (n_spare) s = spare[--n_spare];
    pthread_mutex_unlock(&streams_mu);
    if (!s && cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
        cudaGetLastError();
        s = NULL; /* the legacy stream then */
    }
    return s;
}
static void stream_give(cudaStream_t s) {
    if (!s) return;
    pthread_mutex_lock(&streams_mu);
    if (n_spare < SPARE_STREAMS) spare[n_spare++] = s, s = NULL;
    pthread_mutex_unlock(&streams_mu);
    if (s) cudaStreamDestroy(s);
}
#endif

int tsr_mem_pin(void *p, size_t n, tsr_mem_kind kind, tsr_error *err) {
    int rc = tsr_mem_usable(kind, err); /* a kind this build lacks says so */
    if (rc || kind != TSR_MEM_CUDA) return rc;
#ifdef TSR_CUDA
    cudaError_t e = cudaHostRegister(p, n, cudaHostRegisterDefault);
    if (e != cudaSuccess) return cuda_err(err, e, "pinning host memory", n);
#endif
    (void)p, (void)n;
    return 0;
}

void tsr_mem_unpin(void *p, tsr_mem_kind kind) {
#ifdef TSR_CUDA
    if (kind == TSR_MEM_CUDA && cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();
#endif
    (void)p, (void)kind;
}

/* The bytes of guard memory at p, for a copy of n bytes. */
static void *guard_bytes(const void *p, size_t n, tsr_error *err) {
    void *v = tsr_guard_view(p);
    if (!v || (n && !tsr_guard_view((const char *)p + n - 1)))
        tsr_err(err, TSR_EINVAL, "guard memory: a copy of %zu bytes at %p outside any guard buffer", n, p);
    return v;
}

int tsr_mem_to_host(void *dst, const void *src, size_t n, tsr_mem_kind kind, tsr_error *err) {
    if (kind == TSR_MEM_GUARD && n && !(src = guard_bytes(src, n, err))) return err ? err->code : TSR_EINVAL;
#ifdef TSR_CUDA
    if (kind == TSR_MEM_CUDA) {
        cudaStream_t s = stream_take();
        cudaError_t e = cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, s);
        if (e == cudaSuccess) e = cudaStreamSynchronize(s);
        stream_give(s);
        return e == cudaSuccess ? 0 : cuda_err(err, e, "copy from the device", n);
    }
#endif
    (void)kind, (void)err;
    copy_stream(dst, src, n);
    return 0;
}

int tsr_mem_from_host(void *dst, const void *src, size_t n, tsr_mem_kind kind, tsr_error *err) {
    if (kind == TSR_MEM_GUARD && n && !(dst = guard_bytes(dst, n, err))) return err ? err->code : TSR_EINVAL;
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
