/* planes.h: byte planes of floating-point elements (FORMAT.md, "bytegroup").
 *
 * n elements of a 2- or 4-byte float dtype are split into `elem_size` planes of n
 * bytes each, with the exponent moved into plane 0 (bf16, f32) or the high byte in
 * plane 0 (f16), so that the exponent-bearing plane compresses well and the
 * mantissa planes can be stored raw. Merge is the exact inverse. CPU now; a CUDA
 * twin (for staging on the GPU) sits behind the same functions later. */
#ifndef TSR_PLANES_H
#define TSR_PLANES_H

#include <stddef.h>
#include <stdint.h>

/* tsr_planes_split(): src holds n elements of dtype (TSR_F32, TSR_F16 or TSR_BF16);
 * planes[p] receives n bytes, for p < tsr_dtype_size(dtype). */
void tsr_planes_split(int dtype, const void *src, size_t n, uint8_t *const *planes);
/* tsr_planes_merge(): the inverse of tsr_planes_split. */
void tsr_planes_merge(int dtype, const uint8_t *const *planes, size_t n, void *dst);

#endif
