/* test_codec.c: the frame codec (formats/codec.c) and byte planes (kernels/planes.c).
 *
 * Round trips of every dtype with every codec request on several kinds of data and
 * sizes; the byte-plane transforms bit for bit; the compression ratio on N(0, 0.02)
 * data; and hostile stored bytes (truncations, every single-byte corruption, crafted
 * headers and zstd frames), which must be refused with TSR_ECORRUPT, never crash. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "check.h"
#include "codec.h"
#include "common.h"
#include "planes.h"
#include "tessera.h"

static uint64_t rng_state = 0x5EED;
static uint64_t rnd(void) { return tsr_splitmix_next(&rng_state); }

static double gauss(void) { /* N(0, 0.02), Box-Muller */
    double u1 = ((double)(rnd() >> 11) + 1.0) * 0x1p-53, u2 = (double)(rnd() >> 11) * 0x1p-53;
    return 0.02 * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static uint16_t to_bf16(float f) {
    uint32_t u = f32_bits(f);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static uint16_t to_f16(float f) { /* truncating; enough for test data */
    uint32_t u = f32_bits(f), sign = (u >> 16) & 0x8000u;
    int e = (int)((u >> 23) & 0xFF) - 127 + 15;
    uint32_t m = u & 0x7FFFFFu;
    if (e >= 31) return (uint16_t)(sign | 0x7C00u);
    if (e <= 0) {
        if (e < -10) return (uint16_t)sign;
        m |= 0x800000u;
        return (uint16_t)(sign | (m >> (14 - e)));
    }
    return (uint16_t)(sign | (uint32_t)e << 10 | m >> 13);
}

enum { D_RANDOM, D_CONST, D_GAUSS, D_ZERO, D_SPECIAL, D_SPARSE, N_KINDS };
static const char *const kind_names[N_KINDS] = {"random", "constant", "gaussian", "zero",
                                                 "special", "sparse"};

/* One "Gaussian-like" element of dtype at p. */
static void put_gauss(int dtype, uint8_t *p) {
    double g = gauss();
    switch (dtype) {
    case TSR_F32: { float f = (float)g; memcpy(p, &f, 4); break; }
    case TSR_F64: memcpy(p, &g, 8); break;
    case TSR_F16: tsr_st16(p, to_f16((float)g)); break;
    case TSR_BF16: tsr_st16(p, to_bf16((float)g)); break;
    case TSR_F8E5M2: p[0] = (uint8_t)(to_f16((float)g) >> 8); break;
    case TSR_F8E4M3: p[0] = (uint8_t)((rnd() & 0x80) | (0x18 + rnd() % 24)); break;
    case TSR_BOOL: p[0] = (uint8_t)(g > 0); break;
    default: {
        int64_t v = (int64_t)llround(g * 2000.0);
        uint64_t u = (uint64_t)v;
        size_t es = tsr_dtype_size(dtype);
        for (size_t k = 0; k < es; k++) p[k] = (uint8_t)(u >> (8 * k));
    }
    }
}

/* One special value of dtype at p: NaN, Inf, denormal, -0, extremes. */
static void put_special(int dtype, uint8_t *p) {
    static const uint32_t f32s[] = {0x7FC00000u, 0x7F800001u, 0xFFC00000u, 0x7F800000u,
                                    0xFF800000u, 0x00000001u, 0x807FFFFFu, 0x80000000u,
                                    0x00400000u, 0x7F7FFFFFu};
    static const uint16_t h16s[] = {0x7E00u, 0x7C01u, 0xFE00u, 0x7C00u, 0xFC00u,
                                    0x0001u, 0x83FFu, 0x8000u, 0x0200u, 0x7BFFu};
    static const uint16_t b16s[] = {0x7FC0u, 0x7F81u, 0xFFC0u, 0x7F80u, 0xFF80u,
                                    0x0001u, 0x807Fu, 0x8000u, 0x0040u, 0x7F7Fu};
    unsigned k = (unsigned)(rnd() % 10);
    size_t es = tsr_dtype_size(dtype);
    switch (dtype) {
    case TSR_F32: tsr_st32(p, f32s[k]); break;
    case TSR_F16: tsr_st16(p, h16s[k]); break;
    case TSR_BF16: tsr_st16(p, b16s[k]); break;
    case TSR_F64: {
        static const uint64_t d[] = {0x7FF8000000000000ull, 0x7FF0000000000000ull,
                                     0xFFF0000000000000ull, 0x0000000000000001ull,
                                     0x8000000000000000ull};
        tsr_st64(p, d[k % 5]);
        break;
    }
    default: /* integers, f8, bool: all-ones, sign bit alone, 0, 1 */
        for (size_t b = 0; b < es; b++) {
            uint8_t v = k % 4 == 0 ? 0xFF : k % 4 == 1 ? (b == es - 1 ? 0x80 : 0) : 0;
            if (k % 4 == 3 && b == 0) v = 1;
            p[b] = v;
        }
    }
}

static void fill(int dtype, int kind, uint8_t *buf, size_t n) {
    size_t es = tsr_dtype_size(dtype);
    uint8_t one[8];
    switch (kind) {
    case D_RANDOM:
        for (size_t i = 0; i < n * es; i++) buf[i] = (uint8_t)rnd();
        break;
    case D_CONST:
        put_gauss(dtype, one);
        for (size_t i = 0; i < n; i++) memcpy(buf + i * es, one, es);
        break;
    case D_ZERO: memset(buf, 0, n * es); break;
    case D_GAUSS:
    case D_SPECIAL:
    case D_SPARSE:
        for (size_t i = 0; i < n; i++) {
            if (kind == D_SPECIAL && rnd() % 8 == 0) {
                put_special(dtype, buf + i * es);
            } else if (kind == D_SPARSE && rnd() % 64 == 0) {
                size_t run = 1 + (size_t)(rnd() % 300);
                if (run > n - i) run = n - i;
                memset(buf + i * es, 0, run * es);
                i += run - 1;
            } else {
                put_gauss(dtype, buf + i * es);
            }
        }
        break;
    }
}

static int is_plane_dtype(int dtype) {
    return dtype == TSR_F32 || dtype == TSR_F16 || dtype == TSR_BF16;
}

/* Encodes into an exactly-bounded buffer, decodes from an exactly-sized copy into
 * an exactly-sized buffer, compares. @return the stored size (or 0 on failure). */
static size_t round_trip(tsr_codec *c, int dtype, int req, int level, const uint8_t *raw,
                         size_t raw_size, const char *what, int *used) {
    tsr_error e = {0};
    size_t cap = tsr_codec_bound(raw_size), out_size = 0;
    int codec = -99;
    uint8_t *out = malloc(cap ? cap : 1);
    REQUIRE(out, "out of memory");
    int rc = tsr_frame_encode(c, dtype, req, level, raw, raw_size, out, cap, &out_size, &codec,
                              &e);
    CHECK(rc == 0, "%s: encode returned %d: %s", what, rc, e.msg);
    if (rc) {
        free(out);
        return 0;
    }
    int want = req == TSR_CODEC_AUTO ? (is_plane_dtype(dtype) ? TSR_CODEC_BYTEGROUP : TSR_CODEC_ZSTD)
                                     : req;
    CHECK(codec == want || codec == TSR_CODEC_RAW, "%s: codec %d used for request %d", what,
          codec, req);
    CHECK(out_size <= cap, "%s: %zu stored bytes exceed the bound %zu", what, out_size, cap);
    if (codec == TSR_CODEC_RAW)
        CHECK(out_size == raw_size, "%s: raw frame of %zu bytes for %zu", what, out_size,
              raw_size);
    else
        CHECK(out_size < raw_size, "%s: %s frame of %zu bytes is not smaller than %zu", what,
              tsr_codec_name(codec), out_size, raw_size);
    uint8_t *in = malloc(out_size ? out_size : 1), *back = malloc(raw_size ? raw_size : 1);
    REQUIRE(in && back, "out of memory");
    memcpy(in, out, out_size);
    memset(back, 0xA5, raw_size);
    rc = tsr_frame_decode(c, dtype, codec, in, out_size, back, raw_size, &e);
    CHECK(rc == 0, "%s: decode (%s, %zu bytes) returned %d: %s", what, tsr_codec_name(codec),
          out_size, rc, e.msg);
    CHECK(rc || raw_size == 0 || memcmp(back, raw, raw_size) == 0,
          "%s: decoded bytes differ from the raw bytes", what);
    free(in);
    free(back);
    free(out);
    if (used) *used = codec;
    return rc ? 0 : (out_size ? out_size : 1);
}

static void test_round_trips(tsr_codec *c) {
    const size_t counts[] = {0, 1, 2, 3, 7, 15, 63, 64, 65, 127, 1000, 4097, 65539};
    const int reqs[] = {TSR_CODEC_AUTO, TSR_CODEC_RAW, TSR_CODEC_ZSTD, TSR_CODEC_BYTEGROUP};
    size_t big = (size_t)5 << 20;
    uint8_t *buf = malloc(big);
    REQUIRE(buf, "out of memory");
    char what[160];
    for (int dtype = 1; dtype <= 15; dtype++) {
        size_t es = tsr_dtype_size(dtype);
        REQUIRE(es, "dtype %d has no size", dtype);
        for (int kind = 0; kind < N_KINDS; kind++) {
            for (size_t ci = 0; ci <= sizeof counts / sizeof counts[0]; ci++) {
                size_t n = ci < sizeof counts / sizeof counts[0] ? counts[ci] : big / es;
                fill(dtype, kind, buf, n);
                for (size_t r = 0; r < sizeof reqs / sizeof reqs[0]; r++) {
                    if (reqs[r] == TSR_CODEC_BYTEGROUP && !is_plane_dtype(dtype)) continue;
                    /* 5 MiB: every request on Gaussian data, AUTO on the others. */
                    if (n == big / es && kind != D_GAUSS && reqs[r] != TSR_CODEC_AUTO) continue;
                    snprintf(what, sizeof what, "%s %s n=%zu request %s", tsr_dtype_name(dtype),
                             kind_names[kind], n, reqs[r] < 0 ? "auto" : tsr_codec_name(reqs[r]));
                    int used = -1;
                    size_t st = round_trip(c, dtype, reqs[r], 1, buf, n * es, what, &used);
                    if (!st) continue;
                    if (reqs[r] == TSR_CODEC_RAW)
                        CHECK(used == TSR_CODEC_RAW, "%s: used %d", what, used);
                    /* Compressible data must be compressed; random must not grow. */
                    if ((kind == D_ZERO || kind == D_CONST) && n * es >= 4096 &&
                        reqs[r] != TSR_CODEC_RAW)
                        CHECK(st * 20 < n * es, "%s: only %zu -> %zu bytes", what, n * es, st);
                    if (kind == D_RANDOM && n * es >= 4096 && reqs[r] == TSR_CODEC_AUTO)
                        CHECK(used == TSR_CODEC_RAW, "%s: random data stored as %s", what,
                              tsr_codec_name(used));
                    if (kind == D_GAUSS && n == big / es && reqs[r] == TSR_CODEC_AUTO &&
                        is_plane_dtype(dtype))
                        CHECK(used == TSR_CODEC_BYTEGROUP, "%s: stored as %s", what,
                              tsr_codec_name(used));
                }
            }
        }
    }
    /* Other levels (the plane coder switches to zstd's own match finder from 16),
     * and unaligned buffers. */
    const int levels[] = {-5, 0, 1, 3, 15, 16, 19};
    for (size_t li = 0; li < sizeof levels / sizeof levels[0]; li++) {
        for (int kind = 0; kind < N_KINDS; kind++) {
            int dts[] = {TSR_BF16, TSR_F32, TSR_F16, TSR_I32};
            for (int d = 0; d < 4; d++) {
                size_t n = 20000 + 1;
                fill(dts[d], kind, buf + 1, n);
                snprintf(what, sizeof what, "%s %s level %d unaligned", tsr_dtype_name(dts[d]),
                         kind_names[kind], levels[li]);
                round_trip(c, dts[d], TSR_CODEC_AUTO, levels[li], buf + 1,
                           n * tsr_dtype_size(dts[d]), what, NULL);
            }
        }
    }
    free(buf);
}

static void test_bad_args(tsr_codec *c) {
    tsr_error e = {0};
    uint8_t raw[64] = {1, 2, 3}, out[256];
    size_t sz = 0;
    int codec = 0;
    for (int dtype = 1; dtype <= 15; dtype++) {
        if (is_plane_dtype(dtype)) continue;
        e.code = 0;
        int rc = tsr_frame_encode(c, dtype, TSR_CODEC_BYTEGROUP, 1, raw, 64, out, sizeof out, &sz,
                                  &codec, &e);
        CHECK(rc == TSR_EINVAL && e.code == TSR_EINVAL && e.msg[0],
              "bytegroup on %s returned %d", tsr_dtype_name(dtype), rc);
    }
    CHECK(tsr_frame_encode(c, 0, TSR_CODEC_AUTO, 1, raw, 64, out, sizeof out, &sz, &codec, &e) ==
              TSR_EINVAL, "dtype 0");
    CHECK(tsr_frame_encode(c, 16, TSR_CODEC_AUTO, 1, raw, 64, out, sizeof out, &sz, &codec, &e) ==
              TSR_EINVAL, "dtype 16");
    CHECK(tsr_frame_encode(c, TSR_U8, 3, 1, raw, 64, out, sizeof out, &sz, &codec, &e) ==
              TSR_EINVAL, "codec 3");
    CHECK(tsr_frame_encode(c, TSR_U8, -2, 1, raw, 64, out, sizeof out, &sz, &codec, &e) ==
              TSR_EINVAL, "codec -2");
    CHECK(tsr_frame_encode(c, TSR_F32, TSR_CODEC_AUTO, 1, raw, 62, out, sizeof out, &sz, &codec,
                           &e) == TSR_EINVAL, "62 bytes of f32");
    CHECK(tsr_frame_encode(c, TSR_U8, TSR_CODEC_ZSTD, 1, raw, 64, out, 64, &sz, &codec, &e) ==
              TSR_EINVAL, "capacity below the bound");
    CHECK(tsr_codec_bound(0) >= 32 && tsr_codec_bound(1000) >= 1032, "bound");
    CHECK(!strcmp(tsr_codec_name(TSR_CODEC_RAW), "raw") &&
              !strcmp(tsr_codec_name(TSR_CODEC_ZSTD), "zstd") &&
              !strcmp(tsr_codec_name(TSR_CODEC_BYTEGROUP), "bytegroup") &&
              !strcmp(tsr_codec_name(9), "?"), "codec names");
    tsr_codec_free(NULL);
}

/* ------------------------------------------------------------------ planes */

static void test_planes(void) {
    size_t n = 65536;
    uint8_t *src = malloc(4 * n + 1), *p = malloc(4 * n), *back = malloc(4 * n + 1);
    REQUIRE(src && p && back, "out of memory");
    uint8_t *pl[4] = {p, p + n, p + 2 * n, p + 3 * n};
    for (int t = 0; t < 2; t++) {
        int dtype = t ? TSR_F16 : TSR_BF16;
        for (int off = 0; off < 2; off++) { /* aligned and unaligned buffers */
            for (size_t i = 0; i < n; i++) tsr_st16(src + off + 2 * i, (uint16_t)(i * 40503u));
            tsr_planes_split(dtype, src + off, n, pl);
            size_t bad = 0;
            for (size_t i = 0; i < n; i++) {
                uint16_t x = (uint16_t)(i * 40503u);
                uint8_t a = dtype == TSR_BF16 ? (uint8_t)((x >> 7) & 0xFF) : (uint8_t)(x >> 8);
                uint8_t b = dtype == TSR_BF16 ? (uint8_t)(((x >> 8) & 0x80) | (x & 0x7F))
                                              : (uint8_t)(x & 0xFF);
                bad += pl[0][i] != a || pl[1][i] != b;
            }
            CHECK(bad == 0, "%s split: %zu of 65536 patterns wrong", tsr_dtype_name(dtype), bad);
            memset(back, 0, 2 * n + 1);
            tsr_planes_merge(dtype, (const uint8_t *const *)pl, n, back + off);
            CHECK(memcmp(back + off, src + off, 2 * n) == 0, "%s merge is not the inverse",
                  tsr_dtype_name(dtype));
        }
    }
    /* f32: random patterns and specials. */
    static const uint32_t sp[] = {0, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u,
                                  0x7FFFFFFFu, 0xFFFFFFFFu, 1, 0x007FFFFFu, 0x80000001u,
                                  0x00800000u, 0x3F800000u, 0xBF800000u, 0x7F7FFFFFu};
    for (int off = 0; off < 2; off++) {
        for (size_t i = 0; i < n; i++) {
            uint32_t x = i < sizeof sp / sizeof sp[0] ? sp[i] : (uint32_t)rnd();
            tsr_st32(src + off + 4 * i, x);
        }
        tsr_planes_split(TSR_F32, src + off, n, pl);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) {
            uint32_t x = tsr_ld32(src + off + 4 * i);
            bad += pl[0][i] != (uint8_t)((x >> 23) & 0xFF) ||
                   pl[1][i] != (uint8_t)(((x >> 24) & 0x80) | ((x >> 16) & 0x7F)) ||
                   pl[2][i] != (uint8_t)((x >> 8) & 0xFF) || pl[3][i] != (uint8_t)(x & 0xFF);
        }
        CHECK(bad == 0, "f32 split: %zu patterns wrong", bad);
        memset(back, 0, 4 * n + 1);
        tsr_planes_merge(TSR_F32, (const uint8_t *const *)pl, n, back + off);
        CHECK(memcmp(back + off, src + off, 4 * n) == 0, "f32 merge is not the inverse");
    }
    /* Every count around the vectorized block size, exact-size buffers. */
    for (size_t m = 0; m < 300; m++) {
        int dts[3] = {TSR_F32, TSR_F16, TSR_BF16};
        for (int d = 0; d < 3; d++) {
            size_t es = tsr_dtype_size(dts[d]);
            uint8_t *s = malloc(m * es + 1), *b = malloc(m * es + 1), *q = malloc(m * es + 1);
            REQUIRE(s && b && q, "out of memory");
            for (size_t i = 0; i < m * es; i++) s[i] = (uint8_t)rnd();
            uint8_t *ql[4] = {q, q + m, q + 2 * m, q + 3 * m};
            tsr_planes_split(dts[d], s, m, ql);
            tsr_planes_merge(dts[d], (const uint8_t *const *)ql, m, b);
            CHECK(m == 0 || memcmp(s, b, m * es) == 0, "%s: %zu elements", tsr_dtype_name(dts[d]),
                  m);
            free(s);
            free(b);
            free(q);
        }
    }
    free(src);
    free(p);
    free(back);
}

/* ------------------------------------------------------------------- ratio */

static void test_ratio(tsr_codec *c) {
    size_t size = (size_t)4 << 20;
    uint8_t *buf = malloc(size);
    REQUIRE(buf, "out of memory");
    int dts[2] = {TSR_BF16, TSR_F32};
    double goal[2] = {1.40, 1.17};
    for (int d = 0; d < 2; d++) {
        fill(dts[d], D_GAUSS, buf, size / tsr_dtype_size(dts[d]));
        int used = -1;
        size_t st = round_trip(c, dts[d], TSR_CODEC_AUTO, 1, buf, size, "ratio", &used);
        double ratio = st ? (double)size / (double)st : 0;
        CHECK(used == TSR_CODEC_BYTEGROUP, "%s N(0,0.02) stored as %s", tsr_dtype_name(dts[d]),
              tsr_codec_name(used));
        CHECK(ratio >= goal[d], "%s N(0,0.02) ratio %.3f is below %.2f", tsr_dtype_name(dts[d]),
              ratio, goal[d]);
        fprintf(stderr, "%s N(0,0.02) 4 MiB: ratio %.3f (goal %.2f)\n", tsr_dtype_name(dts[d]),
                ratio, goal[d]);
    }
    free(buf);
}

/* ----------------------------------------------------------------- hostile */

/* Decodes a private, exactly-sized copy of in[0, len). */
static int decode_copy(tsr_codec *c, int dtype, int codec, const uint8_t *in, size_t len,
                       uint8_t *raw, size_t raw_size, tsr_error *e) {
    uint8_t *copy = malloc(len ? len : 1);
    REQUIRE(copy, "out of memory");
    memcpy(copy, in, len);
    e->code = 0;
    e->msg[0] = 0;
    int rc = tsr_frame_decode(c, dtype, codec, copy, len, raw, raw_size, e);
    free(copy);
    return rc;
}

static size_t encode_small(tsr_codec *c, int dtype, int req, const uint8_t *raw, size_t raw_size,
                           uint8_t *out, int *used) {
    tsr_error e = {0};
    size_t sz = 0;
    int rc = tsr_frame_encode(c, dtype, req, 1, raw, raw_size, out, tsr_codec_bound(raw_size), &sz,
                              used, &e);
    REQUIRE(rc == 0, "encode: %s", e.msg);
    return sz;
}

static void test_hostile_bytegroup(tsr_codec *c) {
    enum { N = 300 };
    uint8_t raw[2 * N], out[2 * N + 64], *back = malloc(2 * N);
    REQUIRE(back, "out of memory");
    tsr_error e = {0};
    fill(TSR_BF16, D_GAUSS, raw, N);
    int used = -1;
    size_t len = encode_small(c, TSR_BF16, TSR_CODEC_AUTO, raw, sizeof raw, out, &used);
    REQUIRE(used == TSR_CODEC_BYTEGROUP, "small bf16 frame stored as %s", tsr_codec_name(used));
    REQUIRE(out[0] == 1 && out[8] == 0, "expected plane 0 zstd and plane 1 raw, got %u %u", out[0],
            out[8]);
    size_t len0 = tsr_ld32(out + 4), raw1 = 16 + len0; /* plane 1 (raw) starts here */
    REQUIRE(len == 16 + len0 + N, "frame of %zu bytes", len);
    CHECK(decode_copy(c, TSR_BF16, used, out, len, back, sizeof raw, &e) == 0 &&
              memcmp(back, raw, sizeof raw) == 0, "intact frame: %s", e.msg);

    /* Every truncation. */
    size_t fails = 0;
    for (size_t t = 0; t < len; t++) {
        int rc = decode_copy(c, TSR_BF16, used, out, t, back, sizeof raw, &e);
        if (rc != TSR_ECORRUPT || e.code != TSR_ECORRUPT || !e.msg[0]) fails++;
    }
    CHECK(fails == 0, "%zu truncations not refused with ECORRUPT", fails);

    /* Every single-byte corruption, with every xor value. */
    size_t bad = 0, undetected_zstd = 0, tried = 0;
    uint8_t *mod = malloc(len);
    REQUIRE(mod, "out of memory");
    for (size_t i = 0; i < len; i++) {
        for (int x = 1; x < 256; x++) {
            memcpy(mod, out, len);
            mod[i] ^= (uint8_t)x;
            int rc = decode_copy(c, TSR_BF16, used, mod, len, back, sizeof raw, &e);
            tried++;
            if (rc) {
                if (rc != TSR_ECORRUPT || !e.msg[0]) {
                    bad++;
                    CHECK(0, "byte %zu ^ %d: decode returned %d (%s)", i, x, rc, e.msg);
                }
                continue;
            }
            int same = memcmp(back, raw, sizeof raw) == 0;
            if (i < 16) {
                bad++; /* header corruption must be refused */
                CHECK(0, "header byte %zu ^ %d accepted", i, x);
            } else if (i >= raw1) {
                if (same) bad++; /* a raw plane byte changes exactly one element */
                CHECK(!same, "raw plane byte %zu ^ %d decoded to the original", i, x);
            } else if (!same) {
                /* Inside the zstd frame of plane 0: zstd frames carry no checksum
                 * (tessera hashes frames itself), so some entropy-coded bit flips
                 * decode to other bytes. Counted, not an error. */
                undetected_zstd++;
            }
        }
    }
    CHECK(bad == 0, "%zu of %zu corruptions mishandled", bad, tried);
    fprintf(stderr, "bytegroup: %zu corruptions, %zu in the zstd plane decoded to other bytes\n",
            tried, undetected_zstd);

    /* Crafted headers. */
    struct {
        const char *what;
        size_t at;
        uint8_t v;
    } edits[] = {{"method 7", 0, 7},       {"method 2 on plane 1", 8, 2},
                 {"reserved byte 1", 1, 1}, {"reserved byte 3", 3, 0x80},
                 {"plane 1 reserved", 10, 4}};
    for (size_t k = 0; k < sizeof edits / sizeof edits[0]; k++) {
        memcpy(mod, out, len);
        mod[edits[k].at] = edits[k].v;
        int rc = decode_copy(c, TSR_BF16, used, mod, len, back, sizeof raw, &e);
        CHECK(rc == TSR_ECORRUPT && e.msg[0], "%s: returned %d", edits[k].what, rc);
    }
    uint32_t lens[][2] = {{0xFFFFFFFFu, N},          /* stored_len far too large */
                          {(uint32_t)len0 + 1, N},   /* one byte too many */
                          {(uint32_t)len0, N + 1},   /* raw plane of n + 1 */
                          {(uint32_t)len0 - 1, N},   /* lengths sum to one short */
                          {0, N},                    /* empty zstd plane */
                          {(uint32_t)len0, 0xFFFFFFF0u}};
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
        memcpy(mod, out, len);
        tsr_st32(mod + 4, lens[k][0]);
        tsr_st32(mod + 12, lens[k][1]);
        int rc = decode_copy(c, TSR_BF16, used, mod, len, back, sizeof raw, &e);
        CHECK(rc == TSR_ECORRUPT && e.msg[0], "stored_len %u/%u: returned %d", lens[k][0],
              lens[k][1], rc);
    }
    /* Lengths not summing: one extra byte at the end. */
    uint8_t *longer = malloc(len + 1);
    REQUIRE(longer, "out of memory");
    memcpy(longer, out, len);
    longer[len] = 0;
    CHECK(decode_copy(c, TSR_BF16, used, longer, len + 1, back, sizeof raw, &e) == TSR_ECORRUPT,
          "trailing byte accepted");
    /* Both planes stored raw is legal (decoder side), though the encoder never
     * writes it: build one and decode it. */
    uint8_t *rr = malloc(16 + 2 * N);
    REQUIRE(rr, "out of memory");
    memset(rr, 0, 16);
    tsr_st32(rr + 4, N);
    tsr_st32(rr + 12, N);
    uint8_t *pl[2] = {rr + 16, rr + 16 + N};
    tsr_planes_split(TSR_BF16, raw, N, pl);
    CHECK(decode_copy(c, TSR_BF16, TSR_CODEC_BYTEGROUP, rr, 16 + 2 * N, back, sizeof raw, &e) == 0
              && memcmp(back, raw, sizeof raw) == 0, "all-raw bytegroup frame: %s", e.msg);
    /* A zstd plane whose frame decodes to the wrong size, has trailing bytes, is
     * skippable, or lacks its content size. */
    {
        uint8_t z[2 * N + 64];
        size_t zl = ZSTD_compress(z, sizeof z, rr + 16, N - 1, 1);
        REQUIRE(!ZSTD_isError(zl), "zstd");
        uint8_t *f = malloc(16 + sizeof z + 1 + N);
        REQUIRE(f, "out of memory");
        memset(f, 0, 16);
        f[0] = 1;
        tsr_st32(f + 4, (uint32_t)zl);
        tsr_st32(f + 12, N);
        memcpy(f + 16, z, zl);
        memcpy(f + 16 + zl, rr + 16 + N, N);
        CHECK(decode_copy(c, TSR_BF16, TSR_CODEC_BYTEGROUP, f, 16 + zl + N, back, sizeof raw, &e)
                  == TSR_ECORRUPT, "zstd plane of n - 1 bytes accepted");
        zl = ZSTD_compress(z, sizeof z, rr + 16, N, 1);
        REQUIRE(!ZSTD_isError(zl), "zstd");
        tsr_st32(f + 4, (uint32_t)zl + 1);
        memcpy(f + 16, z, zl);
        f[16 + zl] = 0;
        memcpy(f + 16 + zl + 1, rr + 16 + N, N);
        CHECK(decode_copy(c, TSR_BF16, TSR_CODEC_BYTEGROUP, f, 16 + zl + 1 + N, back, sizeof raw,
                          &e) == TSR_ECORRUPT, "zstd plane with a trailing byte accepted");
        tsr_st32(f + 4, (uint32_t)zl);
        memcpy(f + 16 + zl, rr + 16 + N, N);
        CHECK(decode_copy(c, TSR_BF16, TSR_CODEC_BYTEGROUP, f, 16 + zl + N, back, sizeof raw, &e)
                  == 0 && memcmp(back, raw, sizeof raw) == 0, "hand-made frame: %s", e.msg);
        /* Plane 0 a skippable frame, then plane 0 a frame without content size. */
        tsr_st32(f + 16, 0x184D2A50u);
        tsr_st32(f + 20, 0);
        tsr_st32(f + 4, 8);
        memcpy(f + 24, rr + 16 + N, N);
        CHECK(decode_copy(c, TSR_BF16, TSR_CODEC_BYTEGROUP, f, 24 + N, back, sizeof raw, &e) ==
                  TSR_ECORRUPT, "skippable frame as a plane accepted");
        ZSTD_CCtx *zc = ZSTD_createCCtx();
        REQUIRE(zc, "zstd");
        ZSTD_CCtx_setParameter(zc, ZSTD_c_contentSizeFlag, 0);
        ZSTD_inBuffer ib = {rr + 16, N, 0};
        ZSTD_outBuffer ob = {f + 16, sizeof z, 0};
        REQUIRE(ZSTD_compressStream2(zc, &ob, &ib, ZSTD_e_end) == 0, "zstd stream");
        ZSTD_freeCCtx(zc);
        tsr_st32(f + 4, (uint32_t)ob.pos);
        memcpy(f + 16 + ob.pos, rr + 16 + N, N);
        CHECK(decode_copy(c, TSR_BF16, TSR_CODEC_BYTEGROUP, f, 16 + ob.pos + N, back, sizeof raw,
                          &e) == TSR_ECORRUPT, "plane frame without content size accepted");
        free(f);
    }
    free(rr);
    free(longer);
    free(mod);
    free(back);
}

static void test_hostile_zstd(tsr_codec *c) {
    enum { N = 1000 };
    uint8_t raw[2 * N], out[2 * N + 64], back[2 * N];
    tsr_error e = {0};
    fill(TSR_I16, D_GAUSS, raw, N);
    int used = -1;
    size_t len = encode_small(c, TSR_I16, TSR_CODEC_AUTO, raw, sizeof raw, out, &used);
    REQUIRE(used == TSR_CODEC_ZSTD, "small i16 frame stored as %s", tsr_codec_name(used));
    size_t fails = 0;
    for (size_t t = 0; t < len; t++)
        fails += decode_copy(c, TSR_I16, used, out, t, back, sizeof raw, &e) != TSR_ECORRUPT;
    CHECK(fails == 0, "%zu truncations of a zstd frame not refused with ECORRUPT", fails);
    uint8_t mod[sizeof out];
    size_t bad = 0, undetected = 0, tried = 0;
    static const uint8_t xors[] = {0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80, 0xFF};
    for (size_t i = 0; i < len; i++) {
        for (size_t k = 0; k < sizeof xors; k++) {
            memcpy(mod, out, len);
            mod[i] ^= xors[k];
            int rc = decode_copy(c, TSR_I16, used, mod, len, back, sizeof raw, &e);
            tried++;
            if (rc) {
                bad += rc != TSR_ECORRUPT || !e.msg[0];
            } else {
                bad += i < 4; /* the magic number */
                undetected += memcmp(back, raw, sizeof raw) != 0;
            }
        }
    }
    CHECK(bad == 0, "%zu of %zu zstd-frame corruptions mishandled", bad, tried);
    fprintf(stderr, "zstd: %zu corruptions, %zu decoded to other bytes (no zstd checksum)\n", tried,
            undetected);
    /* No content size; trailing bytes; two frames; a skippable frame. */
    ZSTD_CCtx *z = ZSTD_createCCtx();
    REQUIRE(z, "zstd");
    uint8_t f[4 * N + 64];
    ZSTD_CCtx_setParameter(z, ZSTD_c_contentSizeFlag, 0);
    ZSTD_inBuffer ib = {raw, sizeof raw, 0};
    ZSTD_outBuffer ob = {f, sizeof f, 0};
    size_t r = ZSTD_compressStream2(z, &ob, &ib, ZSTD_e_end); /* streaming: no size */
    REQUIRE(r == 0, "zstd stream");
    CHECK(decode_copy(c, TSR_I16, TSR_CODEC_ZSTD, f, ob.pos, back, sizeof raw, &e) == TSR_ECORRUPT,
          "zstd frame without content size accepted");
    memcpy(f, out, len);
    f[len] = 0;
    CHECK(decode_copy(c, TSR_I16, TSR_CODEC_ZSTD, f, len + 1, back, sizeof raw, &e) == TSR_ECORRUPT,
          "zstd frame with a trailing byte accepted");
    memcpy(f + len, out, len);
    CHECK(decode_copy(c, TSR_I16, TSR_CODEC_ZSTD, f, 2 * len, back, sizeof raw, &e) == TSR_ECORRUPT,
          "two zstd frames accepted");
    tsr_st32(f, 0x184D2A50u); /* skippable frame of 0 bytes, then the frame */
    tsr_st32(f + 4, 0);
    memcpy(f + 8, out, len);
    CHECK(decode_copy(c, TSR_I16, TSR_CODEC_ZSTD, f, 8 + len, back, sizeof raw, &e) == TSR_ECORRUPT,
          "skippable frame accepted");
    ZSTD_freeCCtx(z);
}

static void test_wrong_sizes(tsr_codec *c) {
    enum { N = 4096 };
    uint8_t raw[4 * N], out[4 * N + 64], back[4 * N + 8];
    tsr_error e = {0};
    struct {
        int dtype, req, want;
    } cases[] = {{TSR_BF16, TSR_CODEC_AUTO, TSR_CODEC_BYTEGROUP},
                 {TSR_F32, TSR_CODEC_AUTO, TSR_CODEC_BYTEGROUP},
                 {TSR_F16, TSR_CODEC_AUTO, TSR_CODEC_BYTEGROUP},
                 {TSR_I32, TSR_CODEC_AUTO, TSR_CODEC_ZSTD},
                 {TSR_F32, TSR_CODEC_RAW, TSR_CODEC_RAW}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int dt = cases[k].dtype;
        size_t es = tsr_dtype_size(dt), size = N * es;
        fill(dt, D_GAUSS, raw, N);
        int used = -1;
        size_t len = encode_small(c, dt, cases[k].req, raw, size, out, &used);
        CHECK(used == cases[k].want, "%s: stored as %s", tsr_dtype_name(dt), tsr_codec_name(used));
        long deltas[] = {-1, 1, -(long)es, (long)es, -(long)size};
        for (size_t d = 0; d < sizeof deltas / sizeof deltas[0]; d++) {
            size_t rs = (size_t)((long)size + deltas[d]);
            int rc = decode_copy(c, dt, used, out, len, back, rs, &e);
            CHECK(rc == TSR_ECORRUPT && e.msg[0], "%s %s: raw_size %zu for %zu returned %d",
                  tsr_dtype_name(dt), tsr_codec_name(used), rs, size, rc);
        }
        CHECK(decode_copy(c, dt, used, out, len, back, size, &e) == 0 &&
                  memcmp(back, raw, size) == 0, "%s: intact: %s", tsr_dtype_name(dt), e.msg);
    }
    /* A bytegroup frame claimed for an int dtype, and an unknown codec. */
    fill(TSR_BF16, D_GAUSS, raw, N);
    int used = -1;
    size_t len = encode_small(c, TSR_BF16, TSR_CODEC_AUTO, raw, 2 * N, out, &used);
    CHECK(decode_copy(c, TSR_I16, TSR_CODEC_BYTEGROUP, out, len, back, 2 * N, &e) == TSR_ECORRUPT,
          "bytegroup frame of i16 accepted");
    CHECK(decode_copy(c, TSR_BF16, 3, out, len, back, 2 * N, &e) == TSR_ECORRUPT, "codec 3");
    CHECK(decode_copy(c, TSR_BF16, -1, out, len, back, 2 * N, &e) == TSR_ECORRUPT, "codec -1");
}

int main(void) {
    tsr_codec *c = tsr_codec_new();
    REQUIRE(c, "tsr_codec_new failed");
    test_planes();
    test_bad_args(c);
    test_ratio(c);
    test_hostile_bytegroup(c);
    test_hostile_zstd(c);
    test_wrong_sizes(c);
    test_round_trips(c);
    tsr_codec_free(c);
    return check_done();
}
