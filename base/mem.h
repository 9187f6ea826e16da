/* mem.h: memory of a kind (tsr_base.h, tsr_mem_kind): one allocator for the
 * trainer's parameters, gradients, optimizer state and activations, and the copy
 * that the engine's staging makes from any kind to the host: host memory, and in
 * the CUDA build (TSR_CUDA) a device's, behind the same calls. */
#ifndef TSR_MEM_H
#define TSR_MEM_H

#include <stddef.h>

#include "tsr_base.h"

/* tsr_mem_usable(): 0 if this build holds memory of `kind`; else TSR_EINVAL
 * ("cuda memory: this build holds host memory only"). */
int tsr_mem_usable(tsr_mem_kind kind, tsr_error *err);
/* tsr_mem_alloc(): n bytes of memory of `kind`, zeroed, aligned to TSR_ALIGN.
 * NULL on failure, with TSR_ENOMEM (naming the size) or tsr_mem_usable's
 * error. */
void *tsr_mem_alloc(tsr_mem_kind kind, size_t n, tsr_error *err);
/* tsr_mem_free(): frees what tsr_mem_alloc gave for `kind`; NULL is ignored. */
void tsr_mem_free(tsr_mem_kind kind, void *p);
/* tsr_mem_pin(): registers n bytes of host memory at p for copies with memory of
 * `kind` at the full speed of the link (CUDA: cudaHostRegister; nothing for host
 * memory). The engine pins its staging arena once, when a state first holds
 * device boxes. @return 0, or the reason (the memory then stays as it was). */
int tsr_mem_pin(void *p, size_t n, tsr_mem_kind kind, tsr_error *err);
/* tsr_mem_unpin(): undoes tsr_mem_pin, before the memory is freed. */
void tsr_mem_unpin(void *p, tsr_mem_kind kind);
/* tsr_mem_to_host(): copies n bytes from src (memory of `kind`, which must be
 * usable) to host memory at dst. The engine's staging copies through it; from
 * host memory its stores go around the caches (the staged bytes go to the disk,
 * not back to this CPU). For
 * device memory the copy runs on a stream of its own, ordered after nothing: the
 * caller has finished (synchronized) the work that writes src.
 * @return 0, or TSR_EIO with the device's reason (dst is then not to be used). */
int tsr_mem_to_host(void *dst, const void *src, size_t n, tsr_mem_kind kind, tsr_error *err);
/* tsr_mem_from_host(): copies n bytes of host memory at src to dst (memory of
 * `kind`, which must be usable). The engine's load fills device boxes through it.
 * @return 0, or TSR_EIO with the device's reason. */
int tsr_mem_from_host(void *dst, const void *src, size_t n, tsr_mem_kind kind, tsr_error *err);

/* The guard kind (TSR_MEM_GUARD, mem_guard.c): memory whose addresses host code
 * cannot touch (a fault there prints the buffer and the call stack, then ends
 * the process) while kernels reach the same bytes through a second mapping.
 * tsr_guard_view(): that mapping's address for an address inside a guard
 * buffer; NULL for any other address. */
void *tsr_guard_alloc(size_t n, tsr_error *err);
void tsr_guard_free(void *p);
void *tsr_guard_view(const void *p);

#endif
