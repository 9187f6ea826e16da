/* runtime.cu: the device count, error collection and the grid of a launch. */
#include <cuda_runtime.h>

#include "cuda_impl.h"

extern "C" int tsr_cuda_devices(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* no driver or no device: not an error of later calls */
        return 0;
    }
    return n;
}

/* The first failure noted by tsr_cu_fail since the last tsr_cuda_sync: what
 * failed and cuBLAS's status (0: none). */
static char failed_what[96];
static int failed_status;

void tsr_cu_fail(const char *what, int status) {
    if (failed_status) return;
    snprintf(failed_what, sizeof failed_what, "%s", what);
    failed_status = status ? status : -1;
}

extern "C" int tsr_cuda_sync(tsr_stream *s, tsr_error *err) {
    if (failed_status) {
        if (err) {
            err->code = TSR_EIO;
            snprintf(err->msg, sizeof err->msg, "cuda: %s: cuBLAS status %d", failed_what, failed_status);
        }
        failed_status = 0;
        cudaStreamSynchronize(tsr_cu_stream(s)); /* what was queued finishes before the caller frees it */
        return TSR_EIO;
    }
    cudaError_t e = cudaGetLastError();
    const char *what = "launch";
    if (e == cudaSuccess) {
        e = cudaStreamSynchronize(tsr_cu_stream(s));
        what = "stream";
    }
    if (e == cudaSuccess) return 0;
    if (err) {
        err->code = TSR_EIO;
        snprintf(err->msg, sizeof err->msg, "cuda: %s: %s", what, cudaGetErrorString(e));
    }
    return TSR_EIO;
}

unsigned tsr_cu_blocks(size_t n, unsigned threads) {
    size_t b = (n + threads - 1) / threads;
    return b == 0 ? 1u : b > TSR_CU_MAX_BLOCKS ? TSR_CU_MAX_BLOCKS : (unsigned)b;
}
