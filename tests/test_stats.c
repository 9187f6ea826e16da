/* test_stats.c: tensor statistics and poisoned checkpoints (FORMAT.md 4.5).
 * FORMAT.md's test vectors; the shares of uneven pieces (vector kernels and
 * their tails) merge into the whole tensor's statistics, equal to a plain loop
 * here; a save by two writers in frames of 64 bytes records each float
 * tensor's statistics as computed here, none for integers, and marks the
 * header poisoned exactly when a NaN or an infinity is saved; a MANIFEST whose
 * tensor counts non-finite values without the header's bit, or more than its
 * volume, is refused; the test vector of format 1.0 has none and is clean;
 * chunks copied as they are stored record the statistics declared whole
 * (tsr_save_tensor_stats), poisoned included; the latest step, the step before
 * a bound (a rollback's) and retention's choice skip poisoned steps; the digest's
 * share and the statistics taken together (tsr_digest_stats_box) are bit for
 * bit what the two apart give, for f32 and bf16 over several blocks with tails
 * and non-finite values, for boxes of one run and of many, and for other dtypes.
 *
 *   test_stats --plant SRC DST TENSORS STEP: writes DST, a copy of the
 *   checkpoint SRC (every tensor decoded and saved again, the blobs copied,
 *   train.step and the step set to STEP) with, for each NAME of the
 *   comma-separated TENSORS, element 0 of NAME a NaN, or for NAME=X every
 *   element of NAME times X (the shell tests' poisoned training checkpoints
 *   and moved tensors). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "casts.h"
#include "check.h"
#include "common.h"
#include "encoder.h"
#include "tessera.h"

static tsr_error e;

#include "two_writers.h"

/* The reference: a plain loop over the exact values. */
static tsr_stats reference(int dtype, const void *data, size_t n) {
    tsr_stats s = {INFINITY, -INFINITY, 0, 0};
    for (size_t i = 0; i < n; i++) {
        double x = tsr_load_f64(dtype, data, i);
        if (!isfinite(x)) {
            s.nonfinite++;
            continue;
        }
        s.min = x < s.min ? x : s.min;
        s.max = x > s.max ? x : s.max;
        s.l2 += x * x;
    }
    s.l2 = sqrt(s.l2);
    if (s.min == 0) s.min = 0;
    if (s.max == 0) s.max = 0;
    return s;
}

static int same(double a, double b) { return a == b && signbit(a) == signbit(b); }

static int close_l2(double a, double b) { return a == b || fabs(a - b) <= 1e-12 * fmax(fabs(a), fabs(b)); }

#define CHECK_STATS(got, want, ...)                                                                            \
    CHECK(same((got).min, (want).min) && same((got).max, (want).max) && close_l2((got).l2, (want).l2) &&      \
              (got).nonfinite == (want).nonfinite,                                                             \
          "%s: got (%g, %g, %.17g, %llu), want (%g, %g, %.17g, %llu)", __VA_ARGS__, (got).min, (got).max,      \
          (got).l2, (unsigned long long)(got).nonfinite, (want).min, (want).max, (want).l2,                    \
          (unsigned long long)(want).nonfinite)

static tsr_stats of(int dtype, const void *data, size_t n) {
    tsr_stats s;
    tsr_stats_init(&s);
    tsr_stats_run(dtype, data, n, &s);
    tsr_stats_finish(&s);
    return s;
}

/* FORMAT.md 4.5's table. */
static void vectors(void) {
    uint32_t s[6] = {0x3FC00000, 0xC0000000, 0x7FC00000, 0x00000000, 0x80000000, 0x7F800000};
    uint16_t t[4] = {0x4040, 0xC080, 0x8000, 0x0000}, u[3] = {0xFC00, 0x7E00, 0x7C01};
    uint8_t v[2] = {0x7F, 0x38};
    uint64_t z64[2] = {0x8000000000000000ull, 0x8000000000000000ull};
    int32_t n[2] = {7, -7};
    tsr_stats got = of(TSR_F32, s, 6), want = {-2, 1.5, 2.5, 2};
    CHECK_STATS(got, want, "s");
    got = of(TSR_BF16, t, 4), want = (tsr_stats){-4, 3, 5, 0};
    CHECK_STATS(got, want, "t.bf16");
    got = of(TSR_F16, u, 3), want = (tsr_stats){INFINITY, -INFINITY, 0, 3};
    CHECK_STATS(got, want, "u.f16");
    got = of(TSR_F8E4M3, v, 2), want = (tsr_stats){1, 1, 1, 1};
    CHECK_STATS(got, want, "v.e4m3");
    got = of(TSR_F64, z64, 2), want = (tsr_stats){0, 0, 0, 0};
    CHECK_STATS(got, want, "w.zero");
    tsr_stats none;
    tsr_stats_init(&none);
    CHECK(tsr_stats_run(TSR_I32, n, 2, &none) == 0 && !tsr_stats_dtype(TSR_I32) && !tsr_stats_dtype(TSR_BOOL),
          "integers have no statistics");
}

/* 1001 elements of f32 and bf16 with NaNs and infinities here and there (in the
 * vector kernels' lanes and in their tails), in uneven pieces merged in
 * reverse: the whole's statistics, equal to the plain loop's. */
static void shares_merge(void) {
    enum { N = 1001 };
    static float f[N];
    static uint16_t h[N];
    for (int i = 0; i < N; i++) f[i] = (float)((i * 7919) % 2001 - 1000) / 64.0f;
    f[3] = NAN, f[500] = INFINITY, f[1000] = -INFINITY, f[17] = -0.0f;
    for (int i = 0; i < N; i++) h[i] = tsr_f32_to_bf16(f[i]);
    static const size_t cuts[] = {0, 1, 9, 64, 65, 600, 993, N};
    for (int k = 0; k < 2; k++) {
        int dt = k ? TSR_BF16 : TSR_F32;
        const uint8_t *p = k ? (const uint8_t *)h : (const uint8_t *)f;
        size_t es = tsr_dtype_size(dt);
        tsr_stats acc;
        tsr_stats_init(&acc);
        for (int c = 6; c >= 0; c--) {
            tsr_stats share;
            tsr_stats_init(&share);
            tsr_stats_run(dt, p + cuts[c] * es, cuts[c + 1] - cuts[c], &share);
            tsr_stats_merge(&acc, &share);
        }
        tsr_stats_finish(&acc);
        tsr_stats want = reference(dt, p, N);
        CHECK_STATS(acc, want, k ? "bf16 pieces" : "f32 pieces");
        CHECK(want.nonfinite == 3, "three non-finite planted");
    }
}

static int same_stats(const tsr_stats *a, const tsr_stats *b) {
    return memcmp(&a->min, &b->min, sizeof a->min) == 0 && memcmp(&a->max, &b->max, sizeof a->max) == 0 &&
           memcmp(&a->l2, &b->l2, sizeof a->l2) == 0 && a->nonfinite == b->nonfinite;
}

static void one_pass(void) {
    enum { ROWS = 300, COLS = 701, N = ROWS * COLS }; /* 210300 elements: 3 blocks and a tail */
    static float f[N];
    static uint16_t h[N];
    static int64_t q[N];
    uint64_t x = 7;
    for (int i = 0; i < N; i++) {
        x = tsr_splitmix64(x);
        f[i] = (float)((int64_t)(x >> 40) - (1 << 23)) / 1e6f;
        q[i] = (int64_t)x;
    }
    f[3] = NAN, f[70000] = INFINITY, f[N - 1] = -INFINITY, f[17] = -0.0f, f[N - 5] = 1e30f;
    for (int i = 0; i < N; i++) h[i] = tsr_f32_to_bf16(f[i]);
    static const int dts[] = {TSR_F32, TSR_BF16, TSR_I64};
    const void *mem[] = {f, h, q};
    const uint64_t shape[2] = {ROWS, COLS};
    /* runs: the whole, from odd starts and lengths; boxes: rows (one run), columns (many) */
    static const uint64_t runs[][2] = {{0, N}, {1, N - 2}, {65533, 70001}, {5, 7}, {0, 0}};
    static const tsr_box boxes[] = {{2, {0, 0}, {ROWS, COLS}}, {2, {7, 0}, {200, COLS}}, {2, {9, 0}, {1, 300}},
                                    {2, {3, 5}, {100, 600}}, {2, {0, 0}, {0, COLS}}};
    for (int k = 0; k < 3; k++) {
        int dt = dts[k];
        size_t es = tsr_dtype_size(dt);
        for (size_t r = 0; r < sizeof runs / sizeof *runs; r++) {
            const uint8_t *p = (const uint8_t *)mem[k] + runs[r][0] * es;
            tsr_stats a, b;
            tsr_stats_init(&a), tsr_stats_init(&b);
            uint64_t sa = tsr_digest_stats_box(dt, &(uint64_t){N}, &(tsr_box){1, {runs[r][0]}, {runs[r][1]}}, p, &a);
            uint64_t sb = tsr_digest_run(es, N, runs[r][0], p, runs[r][1]);
            tsr_stats_run(dt, p, runs[r][1], &b);
            CHECK(sa == sb && same_stats(&a, &b), "%s, run %zu: together differs (%016llx, %016llx; l2 %a, %a)",
                  tsr_dtype_name(dt), r, (unsigned long long)sa, (unsigned long long)sb, a.l2, b.l2);
        }
        for (size_t i = 0; i < sizeof boxes / sizeof *boxes; i++) {
            /* the box's memory, row-major, copied out of the whole */
            const tsr_box *bx = &boxes[i];
            uint8_t *m = malloc(tsr_box_volume(bx) * es + 1), *o = m;
            REQUIRE(m, "out of memory");
            for (uint64_t row = 0; row < bx->extent[0]; row++, o += bx->extent[1] * es)
                memcpy(o, (const uint8_t *)mem[k] + ((bx->offset[0] + row) * COLS + bx->offset[1]) * es,
                       bx->extent[1] * es);
            tsr_stats a, b;
            tsr_stats_init(&a), tsr_stats_init(&b);
            uint64_t sa = tsr_digest_stats_box(dt, shape, bx, m, &a);
            uint64_t sb = tsr_digest_box(es, shape, bx, m);
            tsr_stats_run(dt, m, tsr_box_volume(bx), &b);
            CHECK(sa == sb && same_stats(&a, &b), "%s, box %zu: one pass differs", tsr_dtype_name(dt), i);
            free(m);
        }
    }
}

/* Every vector kernel this processor has (AVX-512F, AVX2, the portable ones)
 * against the plain loop, over 5 of the fast kernels' blocks and a tail: one
 * array with no non-finite element (the fast path alone, extremes in the last
 * lanes of a block and -0 the smallest magnitude), one with a NaN in a block,
 * an infinity in another and -inf in the tail (those blocks taken again). */
static void kernels(void) {
    enum { N = 5 * 4096 + 77 };
    static float f[N], g[N];
    static uint16_t h[N], k[N];
    uint64_t x = 11;
    for (int i = 0; i < N; i++) {
        x = tsr_splitmix64(x);
        f[i] = (float)((int64_t)(x >> 40) - (1 << 23)) / 1e5f;
    }
    f[4095] = 1e20f, f[8191] = -3e19f, f[100] = -0.0f, f[N - 1] = 2e20f;
    memcpy(g, f, sizeof f);
    g[5000] = NAN, g[13000] = -INFINITY, g[20000] = INFINITY, g[N - 3] = -INFINITY, g[16383] = -5e20f;
    for (int i = 0; i < N; i++) h[i] = tsr_f32_to_bf16(f[i]), k[i] = tsr_f32_to_bf16(g[i]);
    const void *mem[4] = {f, g, h, k};
    int most = tsr_stats_kernels(-1);
    for (int level = most; level >= 0; level--) {
        CHECK(tsr_stats_kernels(level) == level, "level %d set", level);
        for (int m = 0; m < 4; m++) {
            int dt = m < 2 ? TSR_F32 : TSR_BF16;
            char what[80];
            snprintf(what, sizeof what, "kernel level %d, %s, %s", level, tsr_dtype_name(dt),
                     m % 2 ? "non-finite elements" : "finite");
            CHECK_STATS(of(dt, mem[m], N), reference(dt, mem[m], N), what);
        }
    }
    CHECK(tsr_stats_kernels(-1) == most, "the widest restored");
    printf("statistics kernels compared: levels %d to 0 (2: AVX-512F, 1: AVX2, 0: portable)\n", most);
}

/* tsr_stats_copy at every kernel level: the bytes copied exactly, the
 * statistics the plain loop's, a tail under a vector copied too; refused
 * (nothing written) for a destination off the vectors' alignment and for
 * dtypes it has no pass for. */
static void stats_copy(void) {
    enum { N = 3 * 4096 + 45 };
    static float f[N], d[N + 16] __attribute__((aligned(64)));
    static uint16_t h[N], hd[N + 32] __attribute__((aligned(64)));
    for (int i = 0; i < N; i++) f[i] = (float)((i * 7919) % 4001 - 2000) / 16.0f;
    f[5000] = NAN, f[N - 2] = INFINITY;
    for (int i = 0; i < N; i++) h[i] = tsr_f32_to_bf16(f[i]);
    int most = tsr_stats_kernels(-1);
    for (int level = most; level >= 0; level--) {
        tsr_stats_kernels(level);
        memset(d, 0, sizeof d), memset(hd, 0, sizeof hd);
        tsr_stats a, b;
        tsr_stats_init(&a), tsr_stats_init(&b);
        int fa = tsr_stats_copy(TSR_F32, d, f, sizeof f, &a), fb = tsr_stats_copy(TSR_BF16, hd, h, sizeof h, &b);
        CHECK(fa == (level > 0) && fb == (level > 0), "level %d: tsr_stats_copy took %d and %d", level, fa, fb);
        if (level == 0) continue;
        tsr_stats_finish(&a), tsr_stats_finish(&b);
        CHECK(!memcmp(d, f, sizeof f) && d[N] == 0, "level %d: f32 copy differs or overran", level);
        CHECK(!memcmp(hd, h, sizeof h) && hd[N] == 0, "level %d: bf16 copy differs or overran", level);
        CHECK_STATS(a, reference(TSR_F32, f, N), "tsr_stats_copy f32");
        CHECK_STATS(b, reference(TSR_BF16, h, N), "tsr_stats_copy bf16");
        tsr_stats c;
        tsr_stats_init(&c);
        d[1] = 0;
        CHECK(tsr_stats_copy(TSR_F32, d + 1, f, 4096, &c) == 0 && d[1] == 0 && c.nonfinite == 0 && c.l2 == 0,
              "level %d: an unaligned destination refused, untouched", level);
        CHECK(tsr_stats_copy(TSR_F16, d, f, 4096, &c) == 0 && tsr_stats_copy(TSR_I32, d, f, 4096, &c) == 0,
              "f16 and i32 refused");
    }
    tsr_stats_kernels(-1);
}

/* The engine's saves, where the staging copy takes the statistics of boxes of
 * f32 and bf16 in host memory (tsr_stats_copy): two pieces of 8 MiB and more a
 * box, a NaN in one piece; with the copy in the save call and overlapped, and
 * with the portable kernels alone (the frames' shares then): each tensor's
 * statistics the plain loop's. */
static void engine_saves(const char *tmp) {
    enum { NW = 2400000, NH = 4500000 }; /* 9.6 MB of f32, 9 MB of bf16 */
    float *wf = aligned_alloc(64, NW * sizeof *wf);
    uint16_t *hh = aligned_alloc(64, NH * sizeof *hh);
    REQUIRE(wf && hh, "out of memory");
    uint64_t x = 5;
    for (size_t i = 0; i < NW; i++) x = tsr_splitmix64(x), wf[i] = (float)((int64_t)(x >> 44) - (1 << 19)) / 4096.0f;
    for (size_t i = 0; i < NH; i++) hh[i] = tsr_f32_to_bf16(wf[i % NW] * 3);
    wf[NW - 100] = NAN;
    tsr_tensor_decl d[2] = {{"w", "model", TSR_F32, 1, {NW}, {-1, 0, TSR_PP_ALL, -1}},
                            {"h", "model", TSR_BF16, 2, {NH / 1500, 1500}, {0, 1, TSR_PP_ALL, -1}}};
    tsr_state_box sb[2] = {{0, {1, {0}, {NW}}, wf, TSR_MEM_HOST}, {1, {2, {0, 0}, {NH / 1500, 1500}}, hh, TSR_MEM_HOST}};
    tsr_state st = {d, 2, sb, 2, NULL, 0, {1, 1, 1, 1, 0, 0}};
    tsr_stats want[2] = {reference(TSR_F32, wf, NW), reference(TSR_BF16, hh, NH)};
    int most = tsr_stats_kernels(-1);
    for (int k = 0; k < 4; k++) {
        int overlap = k & 1, level = k < 2 ? most : 0;
        tsr_stats_kernels(level);
        char root[PATH_MAX];
        snprintf(root, sizeof root, "%s/engine-%d", tmp, k);
        tsr_comm *comm = tsr_comm_self();
        tsr_engine_opts o = tsr_engine_opts_default();
        o.overlap_staging = overlap;
        o.write.codec = TSR_CODEC_RAW;
        tsr_engine *eng = comm ? tsr_engine_new(root, comm, &o, &e) : NULL;
        REQUIRE(eng, "%s", e.msg);
        CHECK_OK(tsr_engine_save(eng, 3, &st, &e));
        CHECK_OK(tsr_engine_wait(eng, &e));
        tsr_engine_free(eng);
        tsr_comm_free(comm);
        char dir[PATH_MAX + 32];
        snprintf(dir, sizeof dir, "%s/step-00000003", root);
        tsr_ckpt *ck = tsr_ckpt_open(dir, &e);
        REQUIRE(ck, "%s", e.msg);
        for (int t = 0; t < 2; t++) {
            tsr_stats got;
            char what[80];
            snprintf(what, sizeof what, "engine save of %s, kernels %d, overlap %d", d[t].name, level, overlap);
            CHECK(tsr_ckpt_tensor_stats(ck, (size_t)tsr_ckpt_find(ck, d[t].name), &got) == 1, "%s: none", what);
            CHECK_STATS(got, want[t], what);
        }
        CHECK(tsr_ckpt_poisoned(ck), "the NaN poisons the engine's save");
        CHECK(tsr_ckpt_verify(ck, NULL, NULL, 1, &e) == 0, "the engine's save verifies: %s", e.msg);
        tsr_ckpt_close(ck);
    }
    tsr_stats_kernels(-1);
    free(wf), free(hh);
}

/* The MANIFEST of dir with tensor `name`'s non-finite count set, and
 * (clear_flag) the header's poisoned bit cleared; parsed back (0 or the refusal). */
typedef struct nf_edit {
    const char *name;
    uint64_t nonfinite;
    int clear_flag;
} nf_edit;

static void edit_nonfinite(tsr_manifest *m, void *ctx) {
    const nf_edit *x = ctx;
    for (size_t i = 0; i < m->n_tensors; i++)
        if (!strcmp(m->tensors[i].name, x->name)) m->tensors[i].stats.nonfinite = x->nonfinite;
    if (x->clear_flag) m->flags = 0;
}

static int rewrite(const char *dir, const char *name, uint64_t nonfinite, int clear_flag) {
    nf_edit x = {name, nonfinite, clear_flag};
    return rewrite_manifest(dir, edit_nonfinite, &x, 0);
}

static void declare_stats(tsr_save *s, void *ctx) { CHECK_OK(tsr_save_tensor_stats(s, "w", ctx, &e)); }

static void saved(const char *tmp) {
    for (int i = 0; i < R * K; i++) w[i] = (float)i * 0.25f - 3.0f;
    for (int i = 0; i < 7; i++) ids[i] = (int64_t)i * i * 1000 - 7;
    char dir[PATH_MAX];
    for (int poison = 0; poison < 2; poison++) {
        if (poison) w[7] = NAN, w[22] = -INFINITY;
        snprintf(dir, sizeof dir, "%s/%s", tmp, poison ? "poisoned" : "clean");
        REQUIRE(save_two(dir, 0, 0, 0) == 0, "%s", e.msg);
        tsr_ckpt *ck = tsr_ckpt_open(dir, &e);
        REQUIRE(ck, "%s", e.msg);
        tsr_stats got, want = reference(TSR_F32, w, R * K);
        CHECK(tsr_ckpt_tensor_stats(ck, (size_t)tsr_ckpt_find(ck, "w"), &got) == 1, "w has statistics");
        CHECK_STATS(got, want, poison ? "w, poisoned" : "w");
        CHECK(poison || (got.min == -3 && got.max == 4.25), "w's min and max: %g %g", got.min, got.max);
        CHECK(tsr_ckpt_tensor_stats(ck, (size_t)tsr_ckpt_find(ck, "ids"), &got) == 0, "ids has none");
        CHECK(tsr_ckpt_tensor_stats(ck, 99, &got) == TSR_EINVAL, "no tensor 99");
        CHECK(tsr_ckpt_poisoned(ck) == poison, "poisoned %d", tsr_ckpt_poisoned(ck));
        CHECK(tsr_step_poisoned(dir) == poison, "tsr_step_poisoned %d", tsr_step_poisoned(dir));
        CHECK(tsr_ckpt_version(ck) == (1u << 16 | TSR_FORMAT_MINOR), "format 1.%d", TSR_FORMAT_MINOR);
        tsr_ckpt_close(ck);
    }
    /* the rules of FORMAT.md 9 */
    CHECK(rewrite(dir, "w", 2, 1) == TSR_ECORRUPT && strstr(e.msg, "does not mark the checkpoint poisoned"),
          "non-finite values without the header's bit: %s", e.msg);
    CHECK(rewrite(dir, "w", R * K + 1, 0) == TSR_ECORRUPT && strstr(e.msg, "non-finite elements, over its"),
          "more non-finite values than elements: %s", e.msg);
    CHECK(rewrite(dir, "w", 2, 0) == 0, "as written: %s", e.msg);

    /* format 1.0 (the test vector): no statistics, not poisoned */
    const char *root = getenv("TSR_ROOT");
    char vec[PATH_MAX];
    snprintf(vec, sizeof vec, "%s/formats/testdata/step-00000007", root ? root : ".");
    tsr_ckpt *ck = tsr_ckpt_open(vec, &e);
    if (ck) {
        tsr_stats got;
        for (size_t i = 0; i < tsr_ckpt_n_tensors(ck); i++)
            CHECK(tsr_ckpt_tensor_stats(ck, i, &got) == 0, "a 1.0 tensor with statistics");
        CHECK(!tsr_ckpt_poisoned(ck) && !tsr_step_poisoned(vec), "a 1.0 file poisoned");
        tsr_ckpt_close(ck);
    } else {
        CHECK(0, "the test vector: %s", e.msg);
    }

    /* chunks copied as they are stored: statistics only where declared */
    char copy[PATH_MAX];
    snprintf(copy, sizeof copy, "%s/copied", tmp);
    tsr_ckpt *src = tsr_ckpt_open(dir, &e);
    REQUIRE(src, "%s", e.msg);
    tsr_stats declared;
    tsr_ckpt_tensor_stats(src, (size_t)tsr_ckpt_find(src, "w"), &declared);
    for (int declare = 0; declare < 2; declare++) {
        copy_chunks(src, copy, declare ? declare_stats : NULL, &declared);
        ck = tsr_ckpt_open(copy, &e);
        REQUIRE(ck, "%s", e.msg);
        tsr_stats got;
        int has = tsr_ckpt_tensor_stats(ck, (size_t)tsr_ckpt_find(ck, "w"), &got);
        CHECK(declare ? has == 1 : has == 0, "copied chunks, declared %d: %d", declare, has);
        if (declare) CHECK_STATS(got, declared, "declared");
        CHECK(tsr_ckpt_poisoned(ck) == declare, "the copy poisoned: %d", tsr_ckpt_poisoned(ck));
        tsr_ckpt_close(ck);
    }
    tsr_ckpt_close(src);
}

/* The selections: steps 1 (clean), 2 (poisoned), 3 (clean), 4 and 5 (poisoned). */
static void selection(const char *tmp) {
    char root[PATH_MAX], dir[PATH_MAX + 32], path[PATH_MAX + 64];
    snprintf(root, sizeof root, "%s/root", tmp);
    for (int k = 1; k <= 5; k++) {
        int poison = k == 2 || k >= 4;
        w[7] = poison ? NAN : 0.5f, w[22] = 1;
        snprintf(dir, sizeof dir, "%s/step-%08d", root, k);
        REQUIRE(save_two(dir, 0, 0, 0) == 0, "%s", e.msg);
    }
    uint64_t step = 0;
    CHECK(tsr_latest_step(root, &step, path, sizeof path) == 0 && step == 3 && strstr(path, "step-00000003"),
          "the latest step: %llu", (unsigned long long)step);
    CHECK(tsr_latest_step_before(root, 3, &step, NULL, 0) == 0 && step == 1, "before 3: %llu",
          (unsigned long long)step);
    CHECK(tsr_latest_step_before(root, 1, &step, NULL, 0) == TSR_ENOTFOUND, "before 1: none");
    tsr_step_info *v = NULL;
    size_t n = 0;
    REQUIRE(tsr_list_steps(root, &v, &n) == 0 && n == 5, "five steps");
    for (size_t i = 0; i < n; i++) CHECK(v[i].poisoned == (v[i].step == 2 || v[i].step >= 4), "step %zu", i + 1);
    int keep[5];
    static const int want[4][5] = {{1, 1, 1, 1, 1}, {0, 0, 1, 0, 1}, {0, 0, 1, 1, 1}, {0, 0, 1, 1, 1}};
    static const uint32_t ks[4] = {0, 1, 2, 3};
    for (int t = 0; t < 4; t++) {
        tsr_retention_keep(v, n, ks[t], keep);
        CHECK(!memcmp(keep, want[t], sizeof keep), "keep %u: %d %d %d %d %d", ks[t], keep[0], keep[1], keep[2],
              keep[3], keep[4]);
    }
    free(v);
}

/* --plant SRC DST TENSOR STEP */
static int plant(const char *src_dir, const char *dst, const char *tensor, uint64_t step) {
    tsr_ckpt *src = tsr_ckpt_open(src_dir, &e);
    REQUIRE(src, "%s", e.msg);
    tsr_save *s = tsr_save_begin(dst, 0, NULL, NULL, &e);
    REQUIRE(s, "%s", e.msg);
    int planted = 0;
    for (size_t i = 0; i < tsr_ckpt_n_tensors(src); i++) {
        tsr_tensor_info t;
        tsr_ckpt_tensor(src, i, &t);
        CHECK_OK(tsr_save_tensor(s, t.name, t.group, t.dtype, t.ndim, t.shape, &t.placement, &e));
        tsr_box whole = {t.ndim, {0}, {0}};
        for (uint32_t d = 0; d < t.ndim; d++) whole.extent[d] = t.shape[d];
        uint8_t *buf = malloc(t.raw_bytes + 8);
        REQUIRE(buf, "out of memory");
        CHECK_OK(tsr_ckpt_read(src, i, &whole, buf, &e));
        size_t nlen = strlen(t.name);
        for (const char *p = tensor; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL) {
            if (strncmp(p, t.name, nlen) || (p[nlen] && p[nlen] != ',' && p[nlen] != '=') || !t.raw_bytes) continue;
            planted++;
            if (p[nlen] != '=') tsr_store_from_f64(t.dtype, buf, 0, NAN);
            else
                for (size_t k = 0; k < t.raw_bytes / tsr_dtype_size(t.dtype); k++)
                    tsr_store_from_f64(t.dtype, buf, k, tsr_load_f64(t.dtype, buf, k) * atof(p + nlen + 1));
        }
        CHECK_OK(tsr_save_box(s, t.name, &whole, buf, &e));
        free(buf);
    }
    for (size_t i = 0; i < tsr_ckpt_n_blobs(src); i++) {
        tsr_blob_info b;
        tsr_ckpt_blob(src, i, &b);
        uint8_t *buf = malloc(b.size + 8);
        REQUIRE(buf, "out of memory");
        CHECK_OK(tsr_ckpt_read_blob(src, i, buf, &e));
        if (!strcmp(b.name, "train.step") && b.size == 8) tsr_st64(buf, step);
        CHECK_OK(tsr_save_blob(s, b.name, b.rank, buf, b.size, &e));
        free(buf);
    }
    tsr_layout l = tsr_ckpt_layout(src);
    CHECK_OK(tsr_save_finish(s, NULL, NULL, &e));
    CHECK_OK(tsr_save_commit(s, NULL, NULL, 0, step, &l, &e));
    tsr_save_free(s);
    tsr_ckpt_close(src);
    CHECK(planted, "no tensor of %s to change", tensor);
    return check_done();
}

int main(int argc, char **argv) {
    if (argc == 6 && !strcmp(argv[1], "--plant")) return plant(argv[2], argv[3], argv[4], strtoull(argv[5], NULL, 10));
    char tmp[] = "/tmp/tsr-stats-XXXXXX";
    REQUIRE(mkdtemp(tmp), "mkdtemp");
    vectors();
    shares_merge();
    one_pass();
    kernels();
    stats_copy();
    engine_saves(tmp);
    saved(tmp);
    selection(tmp);
    tsr_remove_tree(tmp);
    return check_done();
}
