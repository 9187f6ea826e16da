/* hash.h: an order-free 64-bit hash of a buffer's words, for comparing copies
 * that must be bitwise equal (the trainer's replicas: train/sdc.c). Integer
 * sums: the same value on any device, thread count or summation order; the
 * CUDA twin (tsr_cuda_hash_sum_add, kernels/cuda/tsr_cuda.h) gives it to the bit. */
#ifndef TSR_HASH_H
#define TSR_HASH_H

#include <stddef.h>
#include <stdint.h>

/* The index step of the mix: 2^64 over the golden ratio, odd. */
#define TSR_HASH_K 0x9e3779b97f4a7c15ull

/* tsr_hash_sum(): the sum modulo 2^64 over i < n of
 * tsr_mix64(x[i] + (index0 + i) * TSR_HASH_K) (base/common.h's splitmix64
 * output, a bijection). For a fixed index each word maps to a distinct term,
 * so a change to any one word (a flipped bit) always changes the sum; the
 * index makes a swap of two words change it too (but for a 2^-64 chance).
 * Sums of parts add up: the hash of x[0..n) is the hash of x[0..k) with
 * index0 plus that of x[k..n) with index0 + k. n == 0 gives 0. */
uint64_t tsr_hash_sum(const uint32_t *x, size_t n, uint64_t index0);

#endif
