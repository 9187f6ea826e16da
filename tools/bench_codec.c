/* bench_codec.c: `tessera bench codec [--bytes SIZE] [--json]`.
 *
 * Measures, on one thread and on the same N(0, 0.02) bytes cut into 4 MiB frames
 * as the checkpoint writer cuts them, tessera's frame codec (AUTO, level 1) and
 * plain zstd at levels 1 and 3 (ZSTD_compress / ZSTD_decompress per frame), for
 * bf16 and f32: ratio (raw / stored), encode and decode MB/s (1e6 bytes/s of raw
 * data). Each timing is the best pass of at least 3 and of at least 0.5 s in all.
 * Every decode is compared with the raw bytes. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zstd.h>

#include "codec.h"
#include "common.h"
#include "commands.h"
#include "tessera.h"

#define FRAME_BYTES ((size_t)4 << 20)
#define LEVEL 1
#define MIN_PASSES 3
#define MIN_SECONDS 0.5
#define MAX_PASSES 1000

#define GOAL_BF16_RATIO 1.40
#define GOAL_F32_RATIO 1.17
#define GOAL_ENC_SPEEDUP 1.5
#define GOAL_DEC_MBPS 1000.0

enum { K_TESSERA, K_ZSTD1, K_ZSTD3, N_KINDS };
static const char *const kind_names[N_KINDS] = {"tessera", "zstd-1", "zstd-3"};

typedef struct result {
    double ratio, enc_mbps, dec_mbps;
} result;

static void usage(FILE *f) {
    fprintf(f,
            "usage: tessera bench codec [--bytes SIZE] [--json]\n"
            "  Compares tessera's frame codec (auto, level 1) with plain zstd -1 and -3 on\n"
            "  N(0, 0.02) bf16 and f32 data in 4 MiB frames, on one thread.\n"
            "  --bytes SIZE  bytes of data per dtype (default 256M; suffix K, M or G)\n"
            "  --json        print one JSON object instead of the table\n");
}

/* ----------------------------------------------------------------- data */

static uint16_t f32_to_bf16(float f) { /* round to nearest even; no NaNs here */
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Fills buf with n elements of N(0, 0.02) (Box-Muller), as bf16 or f32. */
static void gen_gaussian(int dtype, void *buf, size_t n, uint64_t seed) {
    uint8_t *p = buf;
    uint64_t s = seed;
    const double two_pi = 6.283185307179586476925286766559;
    for (size_t i = 0; i < n; i += 2) {
        double u1 = ((double)(tsr_splitmix_next(&s) >> 11) + 1.0) * 0x1p-53; /* (0, 1] */
        double u2 = (double)(tsr_splitmix_next(&s) >> 11) * 0x1p-53;       /* [0, 1) */
        double r = 0.02 * sqrt(-2.0 * log(u1));
        float v[2] = {(float)(r * cos(two_pi * u2)), (float)(r * sin(two_pi * u2))};
        for (size_t k = 0; k < 2 && i + k < n; k++) {
            if (dtype == TSR_BF16) {
                uint16_t h = f32_to_bf16(v[k]);
                memcpy(p + 2 * (i + k), &h, 2);
            } else {
                memcpy(p + 4 * (i + k), &v[k], 4);
            }
        }
    }
}

/* ------------------------------------------------------------ measuring */

typedef struct frames {
    size_t count;
    size_t *raw_off, *raw_len;   /* frame i: raw[raw_off, +raw_len) */
    size_t *st_off, *st_cap;     /* stored bytes at stored + st_off, capacity st_cap */
    size_t *st_len;              /* stored length after encoding */
    int *codec;                  /* codec tessera used */
    uint8_t *stored;
} frames;

static void frames_free(frames *f) {
    free(f->raw_off);
    free(f->raw_len);
    free(f->st_off);
    free(f->st_cap);
    free(f->st_len);
    free(f->codec);
    free(f->stored);
    memset(f, 0, sizeof *f);
}

static int frames_init(frames *f, size_t size) {
    memset(f, 0, sizeof *f);
    size_t count = (size + FRAME_BYTES - 1) / FRAME_BYTES;
    f->count = count;
    f->raw_off = calloc(count + 1, sizeof(size_t));
    f->raw_len = calloc(count + 1, sizeof(size_t));
    f->st_off = calloc(count + 1, sizeof(size_t));
    f->st_cap = calloc(count + 1, sizeof(size_t));
    f->st_len = calloc(count + 1, sizeof(size_t));
    f->codec = calloc(count + 1, sizeof(int));
    if (!f->raw_off || !f->raw_len || !f->st_off || !f->st_cap || !f->st_len || !f->codec)
        return -1;
    size_t total = 0;
    for (size_t i = 0; i < count; i++) {
        f->raw_off[i] = i * FRAME_BYTES;
        f->raw_len[i] = size - i * FRAME_BYTES < FRAME_BYTES ? size - i * FRAME_BYTES : FRAME_BYTES;
        size_t a = tsr_codec_bound(f->raw_len[i]), b = ZSTD_compressBound(f->raw_len[i]);
        f->st_off[i] = total;
        f->st_cap[i] = a > b ? a : b;
        total += f->st_cap[i];
    }
    f->stored = malloc(total ? total : 1);
    return f->stored ? 0 : -1;
}

/* One encode pass over all frames. @return 0, or 1 with a message on stderr. */
static int encode_pass(int kind, int dtype, tsr_codec *c, const uint8_t *raw, frames *f) {
    for (size_t i = 0; i < f->count; i++) {
        const uint8_t *src = raw + f->raw_off[i];
        uint8_t *dst = f->stored + f->st_off[i];
        if (kind == K_TESSERA) {
            tsr_error e = {0};
            int rc = tsr_frame_encode(c, dtype, TSR_CODEC_AUTO, LEVEL, src, f->raw_len[i], dst,
                                      f->st_cap[i], &f->st_len[i], &f->codec[i], &e);
            if (rc) {
                fprintf(stderr, "tessera bench codec: %s frame %zu: encode: %s\n",
                        tsr_dtype_name(dtype), i, e.msg);
                return 1;
            }
        } else {
            size_t r = ZSTD_compress(dst, f->st_cap[i], src, f->raw_len[i], kind == K_ZSTD1 ? 1 : 3);
            if (ZSTD_isError(r)) {
                fprintf(stderr, "tessera bench codec: %s frame %zu: ZSTD_compress: %s\n",
                        tsr_dtype_name(dtype), i, ZSTD_getErrorName(r));
                return 1;
            }
            f->st_len[i] = r;
        }
    }
    return 0;
}

static int decode_pass(int kind, int dtype, tsr_codec *c, uint8_t *out, const frames *f) {
    for (size_t i = 0; i < f->count; i++) {
        const uint8_t *src = f->stored + f->st_off[i];
        uint8_t *dst = out + f->raw_off[i];
        if (kind == K_TESSERA) {
            tsr_error e = {0};
            int rc = tsr_frame_decode(c, dtype, f->codec[i], src, f->st_len[i], dst,
                                      f->raw_len[i], &e);
            if (rc) {
                fprintf(stderr, "tessera bench codec: %s frame %zu: decode: %s\n",
                        tsr_dtype_name(dtype), i, e.msg);
                return 1;
            }
        } else {
            size_t r = ZSTD_decompress(dst, f->raw_len[i], src, f->st_len[i]);
            if (ZSTD_isError(r) || r != f->raw_len[i]) {
                fprintf(stderr, "tessera bench codec: %s frame %zu: ZSTD_decompress: %s\n",
                        tsr_dtype_name(dtype), i,
                        ZSTD_isError(r) ? ZSTD_getErrorName(r) : "wrong size");
                return 1;
            }
        }
    }
    return 0;
}

/* Times `pass` (encode when dec == NULL) and returns its best time in *best. */
static int timed(int kind, int dtype, tsr_codec *c, const uint8_t *raw, uint8_t *dec,
                 frames *f, double *best) {
    double total = 0;
    *best = INFINITY;
    for (int pass = 0; pass < MAX_PASSES && (pass < MIN_PASSES || total < MIN_SECONDS); pass++) {
        double t0 = tsr_now();
        int rc = dec ? decode_pass(kind, dtype, c, dec, f) : encode_pass(kind, dtype, c, raw, f);
        double t = tsr_now() - t0;
        if (rc) return rc;
        total += t;
        if (t < *best) *best = t;
    }
    if (*best <= 0) *best = 1e-9;
    return 0;
}

static int measure(int kind, int dtype, const uint8_t *raw, uint8_t *dec, size_t size,
                   result *res) {
    frames f;
    tsr_codec *c = NULL;
    int rc = 1;
    if (frames_init(&f, size)) {
        fprintf(stderr, "tessera bench codec: out of memory\n");
        goto out;
    }
    if (kind == K_TESSERA && !(c = tsr_codec_new())) {
        fprintf(stderr, "tessera bench codec: cannot create a codec (out of memory)\n");
        goto out;
    }
    double te, td;
    if (timed(kind, dtype, c, raw, NULL, &f, &te)) goto out;
    memset(dec, 0xA5, size);
    if (timed(kind, dtype, c, raw, dec, &f, &td)) goto out;
    if (memcmp(dec, raw, size) != 0) {
        size_t at = 0;
        while (at < size && dec[at] == raw[at]) at++;
        fprintf(stderr, "tessera bench codec: %s %s: decoded bytes differ from the raw bytes "
                "(first at byte %zu, frame %zu)\n", tsr_dtype_name(dtype), kind_names[kind], at,
                at / FRAME_BYTES);
        goto out;
    }
    size_t stored = 0;
    for (size_t i = 0; i < f.count; i++) stored += f.st_len[i];
    res->ratio = stored ? (double)size / (double)stored : 0;
    res->enc_mbps = (double)size / te / 1e6;
    res->dec_mbps = (double)size / td / 1e6;
    rc = 0;
out:
    tsr_codec_free(c);
    frames_free(&f);
    return rc;
}

/* ---------------------------------------------------------------- goals */

typedef struct goal {
    int dtype;
    const char *name, *what;
    double value, target;
    int met;
} goal;

static int make_goals(const int *dtypes, result res[][N_KINDS], goal *g) {
    int ng = 0;
    for (int d = 0; d < 2; d++) {
        const result *r = res[d];
        double ratio_goal = dtypes[d] == TSR_BF16 ? GOAL_BF16_RATIO : GOAL_F32_RATIO;
        g[ng++] = (goal){dtypes[d], "encode_speedup_vs_zstd3",
                         "tessera encode speed / zstd -3 encode speed",
                         r[K_TESSERA].enc_mbps / r[K_ZSTD3].enc_mbps, GOAL_ENC_SPEEDUP, 0};
        g[ng++] = (goal){dtypes[d], "ratio", "tessera ratio", r[K_TESSERA].ratio, ratio_goal, 0};
        g[ng++] = (goal){dtypes[d], "decode_mbps", "tessera decode MB/s", r[K_TESSERA].dec_mbps,
                         GOAL_DEC_MBPS, 0};
    }
    for (int i = 0; i < ng; i++) g[i].met = g[i].value >= g[i].target;
    return ng;
}

/* ----------------------------------------------------------------- main */

int tsr_cmd_bench_codec(int argc, char **argv) {
    size_t bytes = (size_t)256 << 20;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--bytes") || !strncmp(a, "--bytes=", 8)) {
            const char *v = a[7] == '=' ? a + 8 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v) {
                fprintf(stderr, "tessera bench codec: --bytes needs a value\n");
                usage(stderr);
                return 2;
            }
            uint64_t want;
            if (tsr_parse_size(v, &want) || want < 4 || want > SIZE_MAX) {
                fprintf(stderr, "tessera bench codec: bad size for --bytes: '%s' "
                        "(want at least 4 bytes, e.g. 64M)\n", v);
                return 2;
            }
            bytes = (size_t)want;
        } else {
            fprintf(stderr, "tessera bench codec: unknown argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    bytes &= ~(size_t)3; /* whole elements of both dtypes */

    const int dtypes[2] = {TSR_BF16, TSR_F32};
    result res[2][N_KINDS];
    memset(res, 0, sizeof res);
    uint8_t *raw = malloc(bytes), *dec = malloc(bytes);
    if (!raw || !dec) {
        fprintf(stderr, "tessera bench codec: cannot allocate 2 x %zu bytes\n", bytes);
        free(raw);
        free(dec);
        return 1;
    }
    int rc = 0;
    for (int d = 0; d < 2 && !rc; d++) {
        size_t es = tsr_dtype_size(dtypes[d]);
        gen_gaussian(dtypes[d], raw, bytes / es, 0x7E55E4A + (uint64_t)d);
        for (int k = 0; k < N_KINDS && !rc; k++)
            rc = measure(k, dtypes[d], raw, dec, bytes, &res[d][k]);
    }
    free(raw);
    free(dec);
    if (rc) return 1;

    goal g[6];
    int ng = make_goals(dtypes, res, g), missed = 0;
    for (int i = 0; i < ng; i++) missed += !g[i].met;

    if (json) {
        printf("{\"bytes_per_dtype\":%zu,\"frame_bytes\":%zu,\"level\":%d,\"threads\":1,"
               "\"data\":\"N(0,0.02)\",\"zstd\":\"%s\",\"results\":[",
               bytes, FRAME_BYTES, LEVEL, ZSTD_versionString());
        for (int d = 0; d < 2; d++)
            for (int k = 0; k < N_KINDS; k++)
                printf("%s{\"dtype\":\"%s\",\"codec\":\"%s\",\"ratio\":%.4f,\"encode_mbps\":%.1f,"
                       "\"decode_mbps\":%.1f}",
                       d || k ? "," : "", tsr_dtype_name(dtypes[d]), kind_names[k],
                       res[d][k].ratio, res[d][k].enc_mbps, res[d][k].dec_mbps);
        printf("],\"goals\":[");
        for (int i = 0; i < ng; i++)
            printf("%s{\"dtype\":\"%s\",\"name\":\"%s\",\"value\":%.4f,\"goal\":%.4g,\"met\":%s}",
                   i ? "," : "", tsr_dtype_name(g[i].dtype), g[i].name, g[i].value, g[i].target,
                   g[i].met ? "true" : "false");
        printf("],\"all_met\":%s}\n", missed ? "false" : "true");
        return 0;
    }

    printf("tessera bench codec: %zu bytes per dtype of N(0, 0.02), %zu MiB frames, one thread, "
           "zstd %s\n\n", bytes, FRAME_BYTES >> 20, ZSTD_versionString());
    printf("%-5s  %-8s  %7s  %12s  %12s\n", "dtype", "codec", "ratio", "encode MB/s",
           "decode MB/s");
    for (int d = 0; d < 2; d++)
        for (int k = 0; k < N_KINDS; k++)
            printf("%-5s  %-8s  %7.3f  %12.1f  %12.1f\n", tsr_dtype_name(dtypes[d]),
                   kind_names[k], res[d][k].ratio, res[d][k].enc_mbps, res[d][k].dec_mbps);
    printf("\n");
    for (int i = 0; i < ng; i++) {
        const char *dt = tsr_dtype_name(g[i].dtype), *ok = g[i].met ? "ok" : "MISSED";
        if (!strcmp(g[i].name, "encode_speedup_vs_zstd3"))
            printf("%-4s: %s: %.2fx (goal >= %.1f)  %s\n", dt, g[i].what, g[i].value, g[i].target,
                   ok);
        else if (!strcmp(g[i].name, "ratio"))
            printf("%-4s: %s: %.3f (goal >= %.2f)  %s\n", dt, g[i].what, g[i].value, g[i].target,
                   ok);
        else
            printf("%-4s: %s: %.0f (goal >= %.0f)  %s\n", dt, g[i].what, g[i].value, g[i].target,
                   ok);
    }
    printf("%s\n", missed ? "some goals MISSED" : "all goals met");
    return 0;
}
