/* buffers.h: the kernels that fill, copy and add the trainer's buffers, of any
 * memory kind (base/mem.h). The trainer touches activations only through them,
 * so that the same code runs over a device's memory. Host memory now; CUDA
 * twins later, behind the same calls. */
#ifndef TSR_BUFFERS_H
#define TSR_BUFFERS_H

#include <stddef.h>

#include "mem.h"

/* tsr_k_fill(): x (n) = v. */
void tsr_k_fill(float *x, size_t n, float v);
/* tsr_k_copy(): n bytes from src to dst, which do not overlap. */
void tsr_k_copy(void *dst, const void *src, size_t n);
/* tsr_k_add(): out (n) = a + b, elementwise; out may alias a or b. */
void tsr_k_add(float *out, const float *a, const float *b, size_t n);

#endif
