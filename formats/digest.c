/* digest.c: the digest of a logical tensor (FORMAT.md section 4.4): the sum
 * modulo 2^64, over its elements, of tsr_mix64((bits + index * K) ^ key), where
 * bits are the element as stored (little-endian, zero-extended), index its
 * global row-major index and key XXH3-64 of the tensor's name seeded with its
 * dtype code. A sum of one term per element: any rank, frame or box computes
 * its share, and the shares add up to the digest whatever the layout. */
#include <xxhash.h>

#include "common.h"
#include "digest_lanes.h"
#include "tsr_formats.h"

#define K TSR_DIGEST_K

uint64_t tsr_digest_key(const char *name, int dtype) {
    return XXH3_64bits_withSeed(name, strlen(name), (XXH64_hash_t)(unsigned)dtype);
}

static inline uint64_t term(uint64_t bits, uint64_t index, uint64_t key) {
    return tsr_mix64((bits + index * K) ^ key);
}

/* The run kernels, one per element size: 8 lanes of 64 bits at a time (GCC and
 * Clang vector extensions, digest_lanes.h), so that the mix vectorises without
 * -O3: with AVX-512 (vpmullq) a core mixes about as fast as XXH3 hashes the same
 * bytes; on other x86-64 the clones take AVX2 or SSE2. */
typedef uint8_t u8x8 __attribute__((vector_size(8)));
typedef uint16_t u16x8 __attribute__((vector_size(16)));
typedef uint32_t u32x8 __attribute__((vector_size(32)));

/* T the element's type, VT 8 of them as a vector (widened in one conversion:
 * a loop over the lanes does not vectorise for 16-bit elements) */
#define RUN_KERNEL(fn, T, VT, WIDEN)                                                              \
    TSR_WIDEST_INT static uint64_t fn(uint64_t key, uint64_t first, const void *data, uint64_t n) {  \
        const T *p = data;                                                                   \
        tsr_u64x8 acc = {0}, idx, kv;                                                        \
        TSR_DIGEST_LANES_INIT(idx, kv, first, key);                                          \
        uint64_t j = 0;                                                                      \
        for (; j + 8 <= n; j += 8) {                                                         \
            VT v;                                                                            \
            memcpy(&v, p + j, sizeof v);                                                     \
            tsr_u64x8 x = WIDEN(v);                                                          \
            TSR_DIGEST_LANES(acc, x, idx, kv);                                               \
        }                                                                                    \
        uint64_t s;                                                                          \
        TSR_DIGEST_LANES_SUM(s, acc);                                                        \
        for (; j < n; j++) {                                                                 \
            T v;                                                                             \
            memcpy(&v, p + j, sizeof v);                                                     \
            s += term(v, first + j, key);                                                    \
        }                                                                                    \
        return s;                                                                            \
    }

#define AS_IS(v) (v)
RUN_KERNEL(run8, uint8_t, u8x8, TSR_DIGEST_WIDEN)
RUN_KERNEL(run16, uint16_t, u16x8, TSR_DIGEST_WIDEN)
RUN_KERNEL(run32, uint32_t, u32x8, TSR_DIGEST_WIDEN)
RUN_KERNEL(run64, uint64_t, tsr_u64x8, AS_IS)

uint64_t tsr_digest_run(uint64_t key, size_t elem_size, uint64_t first, const void *data, uint64_t n) {
    switch (elem_size) {
    case 1: return run8(key, first, data, n);
    case 2: return run16(key, first, data, n);
    case 4: return run32(key, first, data, n);
    case 8: return run64(key, first, data, n);
    default: return 0;
    }
}

uint64_t tsr_digest_region(uint64_t key, size_t elem_size, const uint64_t *shape, const tsr_box *mem_box,
                           const void *data, const tsr_box *region) {
    uint32_t n = region->ndim;
    if (n == 0) return tsr_digest_run(key, elem_size, 0, data, 1);
    if (tsr_box_volume(region) == 0) return 0;
    /* runs of consecutive global indices: dims c.. where every dim after c is
     * whole in the region, so in mem_box too (then also consecutive in its
     * memory); st[d], ms[d]: the tensor's and the memory's stride of dim d */
    uint64_t st[TSR_MAX_DIMS], ms[TSR_MAX_DIMS];
    st[n - 1] = ms[n - 1] = 1;
    for (uint32_t d = n - 1; d > 0; d--) st[d - 1] = st[d] * shape[d], ms[d - 1] = ms[d] * mem_box->extent[d];
    uint32_t c = n - 1;
    while (c > 0 && region->extent[c] == shape[c]) c--;
    uint64_t run = region->extent[c] * st[c];
    uint64_t i[TSR_MAX_DIMS] = {0}; /* the index in dims < c, relative to the region */
    const uint8_t *p = data;
    uint64_t s = 0;
    for (;;) {
        uint64_t g = region->offset[c] * st[c], m = (region->offset[c] - mem_box->offset[c]) * ms[c];
        for (uint32_t d = 0; d < c; d++) {
            g += (region->offset[d] + i[d]) * st[d];
            m += (region->offset[d] - mem_box->offset[d] + i[d]) * ms[d];
        }
        s += tsr_digest_run(key, elem_size, g, p + m * elem_size, run);
        uint32_t d = c;
        while (d > 0 && ++i[d - 1] == region->extent[d - 1]) i[--d] = 0;
        if (d == 0) break;
    }
    return s;
}

uint64_t tsr_digest_box(uint64_t key, size_t elem_size, const uint64_t *shape, const tsr_box *box,
                        const void *data) {
    return tsr_digest_region(key, elem_size, shape, box, data, box);
}
