/* buffers.c: fill, copy and add on host memory. */
#include "buffers.h"

#include <stdint.h>
#include <string.h>

void tsr_k_fill(float *x, size_t n, float v) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    if (bits == 0) { /* +0.0: all bytes zero */
        memset(x, 0, n * sizeof *x);
        return;
    }
    for (size_t i = 0; i < n; i++) x[i] = v;
}

void tsr_k_copy(void *dst, const void *src, size_t n) {
    if (n) memcpy(dst, src, n);
}

/* simd: with out possibly overlapping a or b, vectors would need a check for
 * overlap at run time, which -O2 does not add, and the loop stayed scalar;
 * out may be a or b exactly (each element read before it is written). */
void tsr_k_add(float *out, const float *a, const float *b, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}
