/* mem.h: memory of a kind (include/tessera.h, tsr_mem_kind), and the kernels
 * that fill, copy and add buffers of it. The trainer takes its parameters,
 * gradients, optimizer state and activations from tsr_mem_alloc and touches
 * activations only through kernels, so that the same code runs over a device's
 * memory. Host memory now; CUDA twins later, behind the same calls. */
#ifndef TSR_MEM_H
#define TSR_MEM_H

#include <stddef.h>

#include "tessera.h"

/* tsr_mem_usable(): 0 if this build holds memory of `kind`; else TSR_EINVAL
 * ("cuda memory: this build holds host memory only"). */
int tsr_mem_usable(tsr_mem_kind kind, tsr_error *err);
/* tsr_mem_alloc(): n bytes of memory of `kind`, zeroed, aligned to TSR_ALIGN.
 * NULL on failure, with TSR_ENOMEM (naming the size) or tsr_mem_usable's
 * error. */
void *tsr_mem_alloc(tsr_mem_kind kind, size_t n, tsr_error *err);
/* tsr_mem_free(): frees what tsr_mem_alloc gave for `kind`; NULL is ignored. */
void tsr_mem_free(tsr_mem_kind kind, void *p);
/* tsr_mem_to_host(): copies n bytes from src (memory of `kind`, which must be
 * usable) to host memory at dst. The engine's staging copies through it. */
void tsr_mem_to_host(void *dst, const void *src, size_t n, tsr_mem_kind kind);

/* Kernels on the trainer's buffers (host memory in this build). */
/* tsr_k_fill(): x (n) = v. */
void tsr_k_fill(float *x, size_t n, float v);
/* tsr_k_copy(): n bytes from src to dst, which do not overlap. */
void tsr_k_copy(void *dst, const void *src, size_t n);
/* tsr_k_add(): out (n) = a + b, elementwise; out may alias a or b. */
void tsr_k_add(float *out, const float *a, const float *b, size_t n);

#endif
