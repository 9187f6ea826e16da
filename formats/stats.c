/* stats.c: a tensor's statistics (FORMAT.md section 4.5): over the elements of
 * a floating dtype, the minimum and maximum of the finite ones, the sum of
 * their squares (the L2 norm once whole) and the count of the others (NaN and
 * infinities). Each is a min, a max or a sum: the shares of any frames, boxes
 * or ranks combine in any order (tsr_stats_merge), as the digest's do. */
#include <math.h>

#include "casts.h"
#include "common.h"
#include "tsr_formats.h"

/* The f32 and bf16 kernels (the dtypes of training states): 8 lanes at a time
 * with GCC and Clang vector extensions, branch-free, the squares summed in
 * f64; cloned for AVX-512 and AVX2 (TSR_WIDEST_INT). */
typedef float f32x8 __attribute__((vector_size(32)));
typedef int32_t i32x8 __attribute__((vector_size(32)));
typedef double f64x8 __attribute__((vector_size(64)));
typedef uint16_t u16x8 __attribute__((vector_size(16)));

#define BLOCK 65536 /* elements between flushes of the lanes' non-finite counts (i32) */

void tsr_stats_init(tsr_stats *s) { *s = (tsr_stats){INFINITY, -INFINITY, 0, 0}; }

int tsr_stats_dtype(int dtype) { return tsr_dtype_is_float(dtype); }

static void add_one(tsr_stats *s, double x) {
    if (!isfinite(x)) {
        s->nonfinite++;
        return;
    }
    if (x < s->min) s->min = x;
    if (x > s->max) s->max = x;
    s->l2 += x * x;
}

/* n f32 bit patterns (bf16: widened, << 16) in `b`, lane-wise into the accumulators. */
#define LANES(b, mn, mx, sq, nf)                                                           \
    do {                                                                                   \
        i32x8 fin_ = (b & 0x7f800000) != 0x7f800000; /* -1: finite */                     \
        i32x8 keep_ = b & fin_;                                                            \
        f32x8 lo_ = (f32x8)(keep_ | (0x7f800000 & ~fin_));          /* +inf if not finite */ \
        f32x8 hi_ = (f32x8)(keep_ | ((int32_t)0xff800000 & ~fin_)); /* -inf if not finite */ \
        i32x8 lt_ = lo_ < mn, gt_ = hi_ > mx;                                              \
        mn = (f32x8)(((i32x8)lo_ & lt_) | ((i32x8)mn & ~lt_));                             \
        mx = (f32x8)(((i32x8)hi_ & gt_) | ((i32x8)mx & ~gt_));                             \
        f64x8 d_ = __builtin_convertvector((f32x8)keep_, f64x8);                           \
        sq += d_ * d_;                                                                     \
        nf += fin_ + 1; /* 1: not finite */                                                \
    } while (0)

#define FOLD(s, mn, mx, sq, nf)                                 \
    do {                                                        \
        for (int l_ = 0; l_ < 8; l_++) {                        \
            if (mn[l_] < s->min) s->min = mn[l_];               \
            if (mx[l_] > s->max) s->max = mx[l_];               \
            s->l2 += sq[l_];                                    \
            s->nonfinite += (uint64_t)nf[l_];                   \
        }                                                       \
    } while (0)

static inline double one_f32(const uint8_t *p, uint64_t j) {
    float x;
    memcpy(&x, p + 4 * j, 4);
    return x;
}
static inline double one_bf16(const uint8_t *p, uint64_t j) {
    uint16_t h;
    memcpy(&h, p + 2 * j, 2);
    return tsr_bf16_to_f32(h);
}

/* A run of n elements of type T (f32's or bf16's bits), 16 at a time in two
 * sets of 8 lanes (VT: 8 of them), so that the minimum's and maximum's chains
 * of compares overlap; each element's bits widened to f32's (<< WIDEN). The
 * lanes are folded into s every BLOCK, the rest added one by one. */
typedef uint32_t u32x8 __attribute__((vector_size(32)));
#define RUN_PASS(fn, T, VT, WIDEN, ONE)                                                                   \
    TSR_WIDEST_INT static void fn(const void *data, uint64_t n, tsr_stats *s) {                          \
        const uint8_t *p = data;                                                                         \
        uint64_t j = 0;                                                                                  \
        while (j + 16 <= n) {                                                                            \
            f32x8 mn0 = {INFINITY, INFINITY, INFINITY, INFINITY, INFINITY, INFINITY, INFINITY, INFINITY}; \
            f32x8 mx0 = -mn0, mn1 = mn0, mx1 = mx0;                                                      \
            f64x8 sq0 = {0}, sq1 = {0};                                                                  \
            i32x8 nf0 = {0}, nf1 = {0};                                                                  \
            uint64_t end = n - j > BLOCK ? j + BLOCK : n;                                                \
            for (; j + 16 <= end; j += 16) {                                                             \
                VT v0, v1;                                                                               \
                memcpy(&v0, p + sizeof(T) * j, sizeof v0);                                               \
                memcpy(&v1, p + sizeof(T) * (j + 8), sizeof v1);                                         \
                i32x8 b0 = (i32x8)(__builtin_convertvector(v0, u32x8) << WIDEN);                         \
                i32x8 b1 = (i32x8)(__builtin_convertvector(v1, u32x8) << WIDEN);                         \
                LANES(b0, mn0, mx0, sq0, nf0);                                                           \
                LANES(b1, mn1, mx1, sq1, nf1);                                                           \
            }                                                                                            \
            FOLD(s, mn0, mx0, sq0, nf0);                                                                 \
            FOLD(s, mn1, mx1, sq1, nf1);                                                                 \
        }                                                                                                \
        for (; j < n; j++) add_one(s, ONE(p, j));                                                        \
    }
RUN_PASS(run_f32, uint32_t, u32x8, 0, one_f32)
RUN_PASS(run_bf16, uint16_t, u16x8, 16, one_bf16)

uint64_t tsr_digest_stats_box(int dtype, const uint64_t *shape, const tsr_box *box, const void *data,
                              tsr_stats *acc) {
    tsr_stats_run(dtype, data, tsr_box_volume(box), acc);
    return tsr_digest_box(tsr_dtype_size(dtype), shape, box, data);
}

int tsr_stats_run(int dtype, const void *data, uint64_t n, tsr_stats *acc) {
    if (!tsr_stats_dtype(dtype)) return 0;
    tsr_stats s;
    tsr_stats_init(&s);
    if (dtype == TSR_F32) run_f32(data, n, &s);
    else if (dtype == TSR_BF16) run_bf16(data, n, &s);
    else
        for (uint64_t j = 0; j < n; j++) add_one(&s, tsr_load_f64(dtype, data, (size_t)j));
    tsr_stats_merge(acc, &s);
    return 1;
}

void tsr_stats_merge(tsr_stats *acc, const tsr_stats *share) {
    if (share->min < acc->min) acc->min = share->min;
    if (share->max > acc->max) acc->max = share->max;
    acc->l2 += share->l2;
    acc->nonfinite += share->nonfinite;
    /* -0 and +0 compare equal: whichever a share met first, a zero is +0 */
    if (acc->min == 0) acc->min = 0;
    if (acc->max == 0) acc->max = 0;
}

void tsr_stats_finish(tsr_stats *s) { s->l2 = sqrt(s->l2); }
