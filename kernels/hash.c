/* hash.c: the order-free hash of hash.h, over OpenMP threads. */
#include "hash.h"

#include "common.h"

uint64_t tsr_hash_sum(const uint32_t *x, size_t n, uint64_t index0) {
    uint64_t s = 0;
#pragma omp parallel for schedule(static) reduction(+ : s) if (n > (1u << 16))
    for (size_t i = 0; i < n; i++) s += tsr_mix64((uint64_t)x[i] + (index0 + i) * TSR_HASH_K);
    return s;
}
