/* mem.c: memory of a kind, on the host. */
#include "mem.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"

int tsr_mem_usable(tsr_mem_kind kind, tsr_error *err) {
    if (kind == TSR_MEM_HOST) return 0;
    return tsr_err(err, TSR_EINVAL, "%s memory: this build holds host memory only",
                   kind == TSR_MEM_CUDA ? "cuda" : "unknown");
}

void *tsr_mem_alloc(tsr_mem_kind kind, size_t n, tsr_error *err) {
    if (tsr_mem_usable(kind, err)) return NULL;
    void *p = tsr_alloc_aligned(n);
    if (!p) {
        tsr_err(err, TSR_ENOMEM, "out of memory for %zu MiB", n >> 20);
        return NULL;
    }
    memset(p, 0, n);
    return p;
}

void tsr_mem_free(tsr_mem_kind kind, void *p) {
    (void)kind;
    free(p);
}

void tsr_mem_to_host(void *dst, const void *src, size_t n, tsr_mem_kind kind) {
    (void)kind;
    memcpy(dst, src, n);
}
