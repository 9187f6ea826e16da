/* digest_lanes.h: the digest's mix over 8 lanes (FORMAT.md 4.4), shared by the
 * digest's run kernels (digest.c) and the pass that computes the digest and the
 * statistics together (stats.c). Internal to formats/. */
#ifndef TSR_DIGEST_LANES_H
#define TSR_DIGEST_LANES_H

#include <stdint.h>

#include "tsr_formats.h"

typedef uint64_t tsr_u64x8 __attribute__((vector_size(64)));

/* The lanes' first indices times K and the key in every lane, for a run whose
 * first element has global index `first`. */
#define TSR_DIGEST_LANES_INIT(idx, kv, first, key)                          \
    do {                                                                    \
        for (int l_ = 0; l_ < 8; l_++)                                      \
            (idx)[l_] = ((first) + (uint64_t)l_) * TSR_DIGEST_K, (kv)[l_] = (key); \
    } while (0)

/* 8 elements' bits (zero-extended) in x: their terms added to acc, idx moved on
 * by 8 elements. x is clobbered. */
#define TSR_DIGEST_LANES(acc, x, idx, kv)                 \
    do {                                                  \
        (x) = ((x) + (idx)) ^ (kv);                       \
        (idx) += 8 * TSR_DIGEST_K;                        \
        (x) = ((x) ^ ((x) >> 30)) * 0xbf58476d1ce4e5b9ull; \
        (x) = ((x) ^ ((x) >> 27)) * 0x94d049bb133111ebull; \
        (acc) += (x) ^ ((x) >> 31);                       \
    } while (0)

/* 8 elements of 8, 16 or 32 bits (a vector of them) zero-extended to 64:
 * through 32 bits, which GCC turns into two vpmovzx (one conversion straight
 * to 64 bits it does one element at a time through the general registers). */
typedef uint32_t tsr_u32x8 __attribute__((vector_size(32)));
#define TSR_DIGEST_WIDEN(v) __builtin_convertvector(__builtin_convertvector((v), tsr_u32x8), tsr_u64x8)

/* s = the sum of the lanes of acc, modulo 2^64 (a macro: a function taking a
 * vector would change the ABI between the clones). */
#define TSR_DIGEST_LANES_SUM(s, acc)                 \
    do {                                             \
        (s) = 0;                                     \
        for (int l_ = 0; l_ < 8; l_++) (s) += (acc)[l_]; \
    } while (0)

/* Whether `box` of a tensor of `shape` (row-major) is one run of consecutive
 * global indices (every dim before the last partial one of extent 1), and then
 * the first's index in *first. */
static inline int tsr_box_one_run(const uint64_t *shape, const tsr_box *box, uint64_t *first) {
    uint64_t st = 1, g = 0;
    int partial = 0; /* a dim after this one is not whole */
    for (uint32_t d = box->ndim; d-- > 0;) {
        if (partial && box->extent[d] != 1) return 0;
        if (box->extent[d] != shape[d]) partial = 1;
        g += box->offset[d] * st;
        st *= shape[d];
    }
    *first = g;
    return 1;
}

#endif
