/* casts.h: conversions between element types. CPU now; CUDA twins later. */
#ifndef TSR_CASTS_H
#define TSR_CASTS_H

#include <stddef.h>
#include <stdint.h>

/* Scalar conversions, round to nearest even; NaN stays NaN, overflow goes to
 * infinity (f16, bf16, e5m2) or saturates to the largest finite value (e4m3,
 * which has no infinity). */
uint16_t tsr_f32_to_bf16(float x);
float tsr_bf16_to_f32(uint16_t h);
uint16_t tsr_f32_to_f16(float x);
float tsr_f16_to_f32(uint16_t h);
uint8_t tsr_f32_to_e4m3(float x);
float tsr_e4m3_to_f32(uint8_t v);
uint8_t tsr_f32_to_e5m2(float x);
float tsr_e5m2_to_f32(uint8_t v);

/* tsr_bf16_round(): out[i] = in[i] rounded to bf16's precision (as
 * tsr_f32_to_bf16, then back to f32); out == in allowed. The operands of mixed
 * precision's matrix products on the CPU. */
void tsr_bf16_round(float *out, const float *in, size_t n);

/* tsr_load_f64(): element i of `n` elements of dtype at src, as a double. */
double tsr_load_f64(int dtype, const void *src, size_t i);
/* tsr_store_from_f64(): stores v as element i of dtype at dst (floats rounded to
 * nearest even, integers truncated toward zero and wrapped). */
void tsr_store_from_f64(int dtype, void *dst, size_t i, double v);

#endif
