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

/* The fast kernels: the elements taken as finite, min and max by the
 * processor's own instructions, the squares summed in f64, n a multiple of 32.
 * Any non-finite element makes the sum of squares +inf or NaN (a finite f32's
 * square is below 2^256, and a block's sum far below f64's largest), so the
 * caller keeps a block's result only when that sum is finite and otherwise
 * takes the block again with the careful kernel above: a state with no NaN
 * costs one compare a block. AVX-512F and AVX2 (FMA), chosen at run time; each
 * also as a copy (tsr_stats_copy: the bytes loaded are stored to dst around the
 * caches, dst aligned to the vector), where the statistics cost nothing while
 * the copy waits for the memory. */
typedef void (*fast_fn)(void *dst, const void *src, uint64_t n, float *mn, float *mx, double *sq);

#if defined(__x86_64__)
#include <immintrin.h>

/* Written once for both widths W (512: AVX-512F, 256: AVX2): _mm##W##_ names
 * the same operation in each; the halves of a vector are the only difference. */
#define LO_SI512(r) _mm512_castsi512_si256(r)
#define HI_SI512(r) _mm512_extracti64x4_epi64(r, 1)
#define LO_PS512(x) _mm512_castps512_ps256(x)
#define HI_PS512(x) _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1))
#define LO_SI256(r) _mm256_castsi256_si128(r)
#define HI_SI256(r) _mm256_extracti128_si256(r, 1)
#define LO_PS256(x) _mm256_castps256_ps128(x)
#define HI_PS256(x) _mm256_extractf128_ps(x, 1)

/* A step's raw vectors r0, r1 at p (f32: two; bf16: one, its halves widened
 * << 16) as the f32 vectors a and b; stored to d, or not */
#define RAW_F32(W, p, r0, r1, a, b)                                                                       \
    __m##W##i r0 = _mm##W##_loadu_si##W((const __m##W##i *)(p));                                          \
    __m##W##i r1 = _mm##W##_loadu_si##W((const __m##W##i *)((p) + W / 8));                                \
    __m##W a = _mm##W##_castsi##W##_ps(r0), b = _mm##W##_castsi##W##_ps(r1)
#define RAW_BF16(W, p, r0, r1, a, b)                                                                      \
    __m##W##i r0 = _mm##W##_loadu_si##W((const __m##W##i *)(p)), r1 = r0;                                 \
    __m##W a = _mm##W##_castsi##W##_ps(_mm##W##_slli_epi32(_mm##W##_cvtepu16_epi32(LO_SI##W(r0)), 16));   \
    __m##W b = _mm##W##_castsi##W##_ps(_mm##W##_slli_epi32(_mm##W##_cvtepu16_epi32(HI_SI##W(r0)), 16))
#define STORE_F32(W, d, r0, r1) \
    _mm##W##_stream_si##W((__m##W##i *)(d), r0), _mm##W##_stream_si##W((__m##W##i *)((d) + W / 8), r1)
#define STORE_BF16(W, d, r0, r1) _mm##W##_stream_si##W((__m##W##i *)(d), r0), (void)(r1)
#define NO_STORE(W, d, r0, r1) (void)(r0), (void)(r1)
#define SQ(W, x, s0, s1)                                                                                  \
    s0 = _mm##W##_fmadd_pd(_mm##W##_cvtps_pd(LO_PS##W(x)), _mm##W##_cvtps_pd(LO_PS##W(x)), s0),           \
    s1 = _mm##W##_fmadd_pd(_mm##W##_cvtps_pd(HI_PS##W(x)), _mm##W##_cvtps_pd(HI_PS##W(x)), s1)

/* Steps of 2 * W / 32 elements (ES bytes each), n a multiple of 32. */
#define FAST(fn, TARGET, W, ES, RAW, STORE)                                                                   \
    __attribute__((target(TARGET))) static void fn(void *dst, const void *src, uint64_t n, float *omn,       \
                                                    float *omx, double *osq) {                               \
        enum { L = W / 32, STEP = 2 * L };                                                                    \
        const uint8_t *p = src;                                                                               \
        uint8_t *d = dst;                                                                                     \
        (void)d;                                                                                              \
        __m##W mn0 = _mm##W##_set1_ps(INFINITY), mn1 = mn0, mx0 = _mm##W##_set1_ps(-INFINITY), mx1 = mx0;     \
        __m##W##d s0 = _mm##W##_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;                                      \
        for (uint64_t j = 0; j < n; j += STEP) {                                                              \
            RAW(W, p + ES * j, r0, r1, a, b);                                                                 \
            STORE(W, d + ES * j, r0, r1);                                                                     \
            mn0 = _mm##W##_min_ps(a, mn0), mx0 = _mm##W##_max_ps(a, mx0);                                     \
            mn1 = _mm##W##_min_ps(b, mn1), mx1 = _mm##W##_max_ps(b, mx1);                                     \
            SQ(W, a, s0, s1);                                                                                 \
            SQ(W, b, s2, s3);                                                                                 \
        }                                                                                                     \
        float mn[L], mx[L];                                                                                   \
        double sq[L / 2];                                                                                     \
        _mm##W##_storeu_ps(mn, _mm##W##_min_ps(mn0, mn1));                                                    \
        _mm##W##_storeu_ps(mx, _mm##W##_max_ps(mx0, mx1));                                                    \
        _mm##W##_storeu_pd(sq, _mm##W##_add_pd(_mm##W##_add_pd(s0, s1), _mm##W##_add_pd(s2, s3)));            \
        *omn = mn[0], *omx = mx[0], *osq = 0;                                                                 \
        for (int l = 0; l < L; l++) *omn = mn[l] < *omn ? mn[l] : *omn, *omx = mx[l] > *omx ? mx[l] : *omx;   \
        for (int l = 0; l < L / 2; l++) *osq += sq[l];                                                        \
    }
FAST(fast_f32_512, "avx512f", 512, 4, RAW_F32, NO_STORE)
FAST(fast_bf16_512, "avx512f", 512, 2, RAW_BF16, NO_STORE)
FAST(copy_f32_512, "avx512f", 512, 4, RAW_F32, STORE_F32)
FAST(copy_bf16_512, "avx512f", 512, 2, RAW_BF16, STORE_BF16)
FAST(fast_f32_256, "avx2,fma", 256, 4, RAW_F32, NO_STORE)
FAST(fast_bf16_256, "avx2,fma", 256, 2, RAW_BF16, NO_STORE)
FAST(copy_f32_256, "avx2,fma", 256, 4, RAW_F32, STORE_F32)
FAST(copy_bf16_256, "avx2,fma", 256, 2, RAW_BF16, STORE_BF16)
#endif

#define FAST_BLOCK 4096 /* elements a fast kernel takes at a time (a multiple of 32) */

static int fast_level = -1; /* 2: AVX-512F, 1: AVX2, 0: none (the careful kernels alone) */

static int fast_supported(void) {
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx512f")) return 2;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 1;
#endif
    return 0;
}

int tsr_stats_kernels(int level) {
    int most = fast_supported();
    if (level < 0 || level > most) level = most;
    __atomic_store_n(&fast_level, level, __ATOMIC_RELAXED);
    return level;
}

/* The fast kernel for dtype (f32 or bf16), the copying one with copy; its
 * vector's bytes (the alignment its stores need) in *align. NULL: none. */
static fast_fn fast_kernel(int dtype, int copy, size_t *align) {
    int level = __atomic_load_n(&fast_level, __ATOMIC_RELAXED);
    if (level < 0) level = tsr_stats_kernels(-1);
    int f32 = dtype == TSR_F32;
    *align = level == 2 ? 64 : 32;
#if defined(__x86_64__)
    if (level == 2) return copy ? (f32 ? copy_f32_512 : copy_bf16_512) : (f32 ? fast_f32_512 : fast_bf16_512);
    if (level == 1) return copy ? (f32 ? copy_f32_256 : copy_bf16_256) : (f32 ? fast_f32_256 : fast_bf16_256);
#endif
    (void)f32, (void)copy;
    return NULL;
}

/* A run of f32 or bf16 (copied to dst as well when dst is not NULL): the fast
 * kernel block by block where it has one, the careful one for blocks with a
 * non-finite element and for the tail. @return the elements taken (the rest:
 * the caller's, when dst is not aligned for the kernel's stores). */
static uint64_t run_float(int dtype, void *dst, const uint8_t *p, uint64_t n, tsr_stats *s) {
    void (*careful)(const void *, uint64_t, tsr_stats *) = dtype == TSR_F32 ? run_f32 : run_bf16;
    size_t es = dtype == TSR_F32 ? 4 : 2, align;
    fast_fn fast = fast_kernel(dtype, dst != NULL, &align);
    if (dst && (!fast || (uintptr_t)dst % align)) return 0;
    uint64_t j = 0;
    while (fast && n - j >= 32) {
        uint64_t m = n - j >= FAST_BLOCK ? FAST_BLOCK : (n - j) / 32 * 32;
        float mn, mx;
        double sq;
        fast(dst ? (uint8_t *)dst + es * j : NULL, p + es * j, m, &mn, &mx, &sq);
        if (isfinite(sq)) {
            if (mn < s->min) s->min = mn;
            if (mx > s->max) s->max = mx;
            s->l2 += sq;
        } else
            careful(p + es * j, m, s);
        j += m;
    }
    if (dst) {
#if defined(__x86_64__)
        _mm_sfence(); /* the streamed stores ordered before what follows */
#endif
        memcpy((uint8_t *)dst + es * j, p + es * j, es * (n - j));
    }
    careful(p + es * j, n - j, s);
    return n;
}

int tsr_stats_copy(int dtype, void *dst, const void *src, size_t bytes, tsr_stats *acc) {
    size_t es = tsr_dtype_size(dtype);
    if ((dtype != TSR_F32 && dtype != TSR_BF16) || bytes % es) return 0;
    tsr_stats s;
    tsr_stats_init(&s);
    if (!run_float(dtype, dst, src, bytes / es, &s)) return 0;
    tsr_stats_merge(acc, &s);
    return 1;
}

uint64_t tsr_digest_stats_box(int dtype, const uint64_t *shape, const tsr_box *box, const void *data,
                              tsr_stats *acc) {
    tsr_stats_run(dtype, data, tsr_box_volume(box), acc);
    return tsr_digest_box(tsr_dtype_size(dtype), shape, box, data);
}

int tsr_stats_run(int dtype, const void *data, uint64_t n, tsr_stats *acc) {
    if (!tsr_stats_dtype(dtype)) return 0;
    tsr_stats s;
    tsr_stats_init(&s);
    if (dtype == TSR_F32 || dtype == TSR_BF16) run_float(dtype, NULL, data, n, &s);
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
