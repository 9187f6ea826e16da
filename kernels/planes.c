/* planes.c: byte planes of f32/f16/bf16 elements (FORMAT.md, "bytegroup").
 *
 * Normative transforms, on the little-endian bits of each element:
 *   bf16 (u16 x): P0 = (x >> 7) & 0xFF                  exponent
 *                 P1 = ((x >> 8) & 0x80) | (x & 0x7F)   sign, 7 mantissa bits
 *   f32  (u32 x): P0 = (x >> 23) & 0xFF                 exponent
 *                 P1 = ((x >> 24) & 0x80) | ((x >> 16) & 0x7F)  sign, top 7 mantissa bits
 *                 P2 = (x >> 8) & 0xFF
 *                 P3 = x & 0xFF
 *   f16  (u16 x): P0 = x >> 8                           sign, exponent, 2 mantissa bits
 *                 P1 = x & 0xFF
 * Merge is the exact inverse.
 *
 * The loops work on blocks of BLK elements with a fixed trip count and restrict
 * pointers so that gcc -O2 (its "very cheap" vectorizer cost model) vectorizes
 * them; the tail is done one element at a time. Elements are loaded and stored
 * with memcpy: src and dst need no alignment. */
#include "planes.h"

#include <string.h>

#include "tsr_base.h"

#define BLK 64

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define LE16(x) __builtin_bswap16(x)
#define LE32(x) __builtin_bswap32(x)
#else
#define LE16(x) (x)
#define LE32(x) (x)
#endif

static inline uint16_t ld16(const uint8_t *p) {
    uint16_t x;
    memcpy(&x, p, 2);
    return LE16(x);
}
static inline uint32_t ld32(const uint8_t *p) {
    uint32_t x;
    memcpy(&x, p, 4);
    return LE32(x);
}
static inline void st16(uint8_t *p, uint16_t x) {
    x = LE16(x);
    memcpy(p, &x, 2);
}
static inline void st32(uint8_t *p, uint32_t x) {
    x = LE32(x);
    memcpy(p, &x, 4);
}

/* ------------------------------------------------------------------ bf16 */

static void bf16_split_blk(const uint8_t *restrict s, uint8_t *restrict p0,
                           uint8_t *restrict p1, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint16_t x = ld16(s + 2 * i);
        p0[i] = (uint8_t)(x >> 7);
        p1[i] = (uint8_t)(((x >> 8) & 0x80) | (x & 0x7F));
    }
}

static void bf16_split(const uint8_t *restrict s, uint8_t *restrict p0, uint8_t *restrict p1,
                       size_t n) {
    size_t i = 0;
    for (; i + BLK <= n; i += BLK) {
        for (size_t j = 0; j < BLK; j++) {
            uint16_t x = ld16(s + 2 * (i + j));
            p0[i + j] = (uint8_t)(x >> 7);
            p1[i + j] = (uint8_t)(((x >> 8) & 0x80) | (x & 0x7F));
        }
    }
    bf16_split_blk(s + 2 * i, p0 + i, p1 + i, n - i);
}

static void bf16_merge(const uint8_t *restrict p0, const uint8_t *restrict p1,
                       uint8_t *restrict d, size_t n) {
    size_t i = 0;
    for (; i + BLK <= n; i += BLK) {
        for (size_t j = 0; j < BLK; j++) {
            uint16_t a = p0[i + j], b = p1[i + j];
            st16(d + 2 * (i + j), (uint16_t)(((b & 0x80) << 8) | (a << 7) | (b & 0x7F)));
        }
    }
    for (; i < n; i++) {
        uint16_t a = p0[i], b = p1[i];
        st16(d + 2 * i, (uint16_t)(((b & 0x80) << 8) | (a << 7) | (b & 0x7F)));
    }
}

/* ------------------------------------------------------------------- f16 */

static void f16_split(const uint8_t *restrict s, uint8_t *restrict p0, uint8_t *restrict p1,
                      size_t n) {
    size_t i = 0;
    for (; i + BLK <= n; i += BLK) {
        for (size_t j = 0; j < BLK; j++) {
            uint16_t x = ld16(s + 2 * (i + j));
            p0[i + j] = (uint8_t)(x >> 8);
            p1[i + j] = (uint8_t)x;
        }
    }
    for (; i < n; i++) {
        uint16_t x = ld16(s + 2 * i);
        p0[i] = (uint8_t)(x >> 8);
        p1[i] = (uint8_t)x;
    }
}

static void f16_merge(const uint8_t *restrict p0, const uint8_t *restrict p1,
                      uint8_t *restrict d, size_t n) {
    size_t i = 0;
    for (; i + BLK <= n; i += BLK) {
        for (size_t j = 0; j < BLK; j++)
            st16(d + 2 * (i + j), (uint16_t)(p0[i + j] << 8 | p1[i + j]));
    }
    for (; i < n; i++) st16(d + 2 * i, (uint16_t)(p0[i] << 8 | p1[i]));
}

/* ------------------------------------------------------------------- f32 */

static inline void f32_split1(uint32_t x, uint8_t *a, uint8_t *b, uint8_t *c, uint8_t *d) {
    *a = (uint8_t)(x >> 23);
    *b = (uint8_t)(((x >> 24) & 0x80) | ((x >> 16) & 0x7F));
    *c = (uint8_t)(x >> 8);
    *d = (uint8_t)x;
}

static void f32_split(const uint8_t *restrict s, uint8_t *restrict p0, uint8_t *restrict p1,
                      uint8_t *restrict p2, uint8_t *restrict p3, size_t n) {
    size_t i = 0;
    for (; i + BLK <= n; i += BLK) {
        for (size_t j = 0; j < BLK; j++) {
            uint32_t x = ld32(s + 4 * (i + j));
            p0[i + j] = (uint8_t)(x >> 23);
            p1[i + j] = (uint8_t)(((x >> 24) & 0x80) | ((x >> 16) & 0x7F));
            p2[i + j] = (uint8_t)(x >> 8);
            p3[i + j] = (uint8_t)x;
        }
    }
    for (; i < n; i++) f32_split1(ld32(s + 4 * i), p0 + i, p1 + i, p2 + i, p3 + i);
}

static inline uint32_t f32_merge1(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
    return ((b & 0x80) << 24) | (a << 23) | ((b & 0x7F) << 16) | (c << 8) | d;
}

static void f32_merge(const uint8_t *restrict p0, const uint8_t *restrict p1,
                      const uint8_t *restrict p2, const uint8_t *restrict p3,
                      uint8_t *restrict d, size_t n) {
    size_t i = 0;
    for (; i + BLK <= n; i += BLK) {
        for (size_t j = 0; j < BLK; j++)
            st32(d + 4 * (i + j), f32_merge1(p0[i + j], p1[i + j], p2[i + j], p3[i + j]));
    }
    for (; i < n; i++) st32(d + 4 * i, f32_merge1(p0[i], p1[i], p2[i], p3[i]));
}

/* ------------------------------------------------------------------- API */

void tsr_planes_split(int dtype, const void *src, size_t n, uint8_t *const *planes) {
    const uint8_t *s = src;
    switch (dtype) {
    case TSR_BF16: bf16_split(s, planes[0], planes[1], n); break;
    case TSR_F16: f16_split(s, planes[0], planes[1], n); break;
    case TSR_F32: f32_split(s, planes[0], planes[1], planes[2], planes[3], n); break;
    default: break;
    }
}

void tsr_planes_merge(int dtype, const uint8_t *const *planes, size_t n, void *dst) {
    uint8_t *d = dst;
    switch (dtype) {
    case TSR_BF16: bf16_merge(planes[0], planes[1], d, n); break;
    case TSR_F16: f16_merge(planes[0], planes[1], d, n); break;
    case TSR_F32: f32_merge(planes[0], planes[1], planes[2], planes[3], d, n); break;
    default: break;
    }
}
