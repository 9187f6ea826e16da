/* codec.c: the frame codec of format v1 (FORMAT.md, "Codecs").
 *
 * Stored forms:
 *   RAW        the raw bytes.
 *   ZSTD       exactly one zstd frame, with its content size, of the raw bytes.
 *   BYTEGROUP  (f32, f16, bf16) the elements split into nplanes = element size
 *              byte planes of n = raw_size / element size bytes (kernels/planes.h).
 *              A header of nplanes entries of 8 bytes, {u8 method (0 raw, 1 zstd),
 *              u8 reserved[3] = 0, u32 stored_len (LE)}, then the planes' stored
 *              bytes in plane order. Method 0: n raw bytes. Method 1: one zstd frame
 *              with content size n. The stored size is exactly
 *              8 * nplanes + sum(stored_len).
 *
 * Encoder: plane 0 (the exponent-bearing plane) is zstd-coded; another plane is
 * zstd-coded only when the order-0 entropy of a sample of it says zstd saves at
 * least 3%. A zstd plane that is not smaller than n bytes is stored raw, and a
 * frame (any codec) that is not smaller than raw_size is stored RAW.
 *
 * The planes are coded by zstd's entropy stage with a minimal sequence producer
 * (zstd >= 1.5.4): an exponent plane is nearly all literals (short matches cost
 * more than the Huffman-coded bytes they replace), so the producer emits only runs
 * of one byte value (offset 1) and leaves the rest to zstd's Huffman literals.
 * That is faster than zstd's own match finders on such data and as small as
 * their best (level 19). From level 16 up (zstd's optimal parsers), zstd's own
 * match finder at that level is used instead, for data with long repeats. */
#define ZSTD_STATIC_LINKING_ONLY /* ZSTD_registerSequenceProducer (zstd >= 1.5.4) */
#include "codec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>
#include <zstd_errors.h>

#include "common.h"
#include "planes.h"

#if ZSTD_VERSION_NUMBER >= 10504
#define TSR_HAVE_SEQPROD 1
#else
#define TSR_HAVE_SEQPROD 0
#endif

#define BG_ENTRY 8          /* bytes per bytegroup header entry */
#define BG_MAX_PLANES 4
#define PLANE_ZSTD_LEVEL 16 /* from this level up, planes use zstd's own match finder */
#define RUN_MIN 16          /* shortest run the plane sequence producer emits */

enum { MODE_NONE = 0, MODE_FRAME, MODE_PLANE };

/* The zstd contexts are made on first use: a reader never needs the compression
 * context, a writer of raw frames neither, and opening a checkpoint stays cheap. */
struct tsr_codec {
    ZSTD_CCtx *cctx;
    ZSTD_DCtx *dctx;
    int cmode, clevel; /* parameters currently set on cctx */
    uint8_t *scratch;  /* planes */
    size_t scratch_cap;
};

tsr_codec *tsr_codec_new(void) {
    return calloc(1, sizeof(tsr_codec));
}

void tsr_codec_free(tsr_codec *c) {
    if (!c) return;
    ZSTD_freeCCtx(c->cctx);
    ZSTD_freeDCtx(c->dctx);
    free(c->scratch);
    free(c);
}

const char *tsr_codec_name(int codec) {
    switch (codec) {
    case TSR_CODEC_RAW: return "raw";
    case TSR_CODEC_ZSTD: return "zstd";
    case TSR_CODEC_BYTEGROUP: return "bytegroup";
    default: return "?";
    }
}

/* Every encoded form is at most raw_size bytes (anything larger falls back to
 * RAW), but a bytegroup attempt writes its header and raw planes before that
 * decision: 8 * 4 bytes more than raw_size. */
size_t tsr_codec_bound(size_t raw_size) {
    size_t extra = BG_ENTRY * BG_MAX_PLANES;
    return raw_size > SIZE_MAX - extra ? SIZE_MAX : raw_size + extra;
}

static int is_plane_dtype(int dtype) {
    return dtype == TSR_F32 || dtype == TSR_F16 || dtype == TSR_BF16;
}

static int scratch_reserve(tsr_codec *c, size_t size, tsr_error *err) {
    if (size <= c->scratch_cap) return 0;
    size_t cap = c->scratch_cap ? c->scratch_cap : 1u << 16;
    while (cap < size) cap = cap > SIZE_MAX / 2 ? size : cap * 2;
    uint8_t *p = malloc(cap);
    if (!p) return tsr_err(err, TSR_ENOMEM, "codec: cannot allocate %zu bytes of scratch", cap);
    free(c->scratch);
    c->scratch = p;
    c->scratch_cap = cap;
    return 0;
}

/* ------------------------------------------------------------ zstd setup */

#if TSR_HAVE_SEQPROD
/* The plane sequence producer: runs of RUN_MIN or more equal bytes become a
 * literal (the run's first byte) and a match at offset 1; everything else is
 * literals. Any run of 15+ bytes holds an 8-aligned 8-byte word of one value, so
 * the scan tests one word per 8 bytes. */
static size_t plane_producer(void *state, ZSTD_Sequence *seqs, size_t cap, const void *src,
                             size_t n, const void *dict, size_t dict_size, int level,
                             size_t window) {
    (void)state, (void)dict, (void)dict_size, (void)level, (void)window;
    const uint8_t *s = src;
    const uint64_t ones = 0x0101010101010101ull;
    size_t ns = 0, lit = 0, i = 0;
    if (cap == 0) return ZSTD_SEQUENCE_PRODUCER_ERROR;
    while (i + 8 <= n) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        if (w != (w & 0xFF) * ones) {
            i += 8;
            continue;
        }
        uint8_t b = s[i];
        size_t st = i, e = i + 8;
        while (st > lit && s[st - 1] == b) st--;
        for (;;) {
            if (e + 8 <= n) {
                memcpy(&w, s + e, 8);
                if (w == (uint64_t)b * ones) {
                    e += 8;
                    continue;
                }
            }
            while (e < n && s[e] == b) e++;
            break;
        }
        if (e - st >= RUN_MIN) {
            if (ns + 2 > cap) return ZSTD_SEQUENCE_PRODUCER_ERROR;
            seqs[ns].offset = 1;
            seqs[ns].litLength = (unsigned)(st + 1 - lit);
            seqs[ns].matchLength = (unsigned)(e - st - 1);
            seqs[ns].rep = 0;
            ns++;
            lit = e;
        }
        i = e;
    }
    seqs[ns].offset = 0;
    seqs[ns].litLength = (unsigned)(n - lit);
    seqs[ns].matchLength = 0;
    seqs[ns].rep = 0;
    return ns + 1;
}
#endif

static int zset(size_t r, tsr_error *err) {
    if (!ZSTD_isError(r)) return 0;
    return tsr_err(err, TSR_EINVAL, "codec: zstd parameter refused: %s", ZSTD_getErrorName(r));
}

/* Puts the parameters for `mode` at `level` on the compression context. */
static int cctx_setup(tsr_codec *c, int mode, int level, tsr_error *err) {
    if (!c->cctx && !(c->cctx = ZSTD_createCCtx()))
        return tsr_err(err, TSR_ENOMEM, "codec: out of memory for a zstd compression context");
    if (c->cmode == mode && c->clevel == level) return 0;
    ZSTD_CCtx *z = c->cctx;
    c->cmode = MODE_NONE;
    int rc = zset(ZSTD_CCtx_reset(z, ZSTD_reset_session_and_parameters), err);
    if (!rc) rc = zset(ZSTD_CCtx_setParameter(z, ZSTD_c_checksumFlag, 0), err);
    if (!rc) rc = zset(ZSTD_CCtx_setParameter(z, ZSTD_c_contentSizeFlag, 1), err);
    if (!rc) rc = zset(ZSTD_CCtx_setParameter(z, ZSTD_c_compressionLevel, level), err);
    if (!rc && mode == MODE_PLANE && level < PLANE_ZSTD_LEVEL) {
        /* A fast, small match finder: the fallback of the sequence producer (and
         * the finder itself where the producer API is missing). */
        rc = zset(ZSTD_CCtx_setParameter(z, ZSTD_c_strategy, ZSTD_fast), err);
        if (!rc) rc = zset(ZSTD_CCtx_setParameter(z, ZSTD_c_windowLog, 17), err);
        if (!rc) rc = zset(ZSTD_CCtx_setParameter(z, ZSTD_c_hashLog, 6), err);
        if (!rc) rc = zset(ZSTD_CCtx_setParameter(z, ZSTD_c_minMatch, 7), err);
        if (!rc) rc = zset(ZSTD_CCtx_setParameter(z, ZSTD_c_targetLength, 0), err);
#if TSR_HAVE_SEQPROD
        if (!rc) rc = zset(ZSTD_CCtx_setParameter(z, ZSTD_c_enableSeqProducerFallback, 1), err);
        if (!rc) ZSTD_registerSequenceProducer(z, NULL, plane_producer);
#endif
    }
    if (rc) return rc;
    c->cmode = mode;
    c->clevel = level;
    return 0;
}

/* Compresses src into dst (capacity cap). @return 0 and *out_len, 1 when the
 * result does not fit in cap, or a negative tsr_status. */
static int zcompress(tsr_codec *c, const uint8_t *src, size_t n, uint8_t *dst, size_t cap,
                     size_t *out_len, tsr_error *err) {
    size_t r = ZSTD_compress2(c->cctx, dst, cap, src, n);
    if (!ZSTD_isError(r)) {
        *out_len = r;
        return 0;
    }
    if (ZSTD_getErrorCode(r) == ZSTD_error_dstSize_tooSmall) return 1;
    c->cmode = MODE_NONE; /* reset the context before its next use */
    if (ZSTD_getErrorCode(r) == ZSTD_error_memory_allocation)
        return tsr_err(err, TSR_ENOMEM, "codec: zstd is out of memory");
    return tsr_err(err, TSR_EINVAL, "codec: zstd compression failed: %s", ZSTD_getErrorName(r));
}

/* Decodes the zstd frame src[0, len) into exactly n bytes at dst. */
static int zdecompress(tsr_codec *c, const uint8_t *src, size_t len, uint8_t *dst, size_t n,
                       const char *what, int plane, tsr_error *err) {
    char where[32] = "";
    if (plane >= 0) snprintf(where, sizeof where, " plane %d", plane);
    if (len < 4 || tsr_ld32(src) != ZSTD_MAGICNUMBER)
        return tsr_err(err, TSR_ECORRUPT, "%s%s: not a zstd frame (%zu bytes, bad magic)", what,
                       where, len);
    unsigned long long fcs = ZSTD_getFrameContentSize(src, len);
    if (fcs == ZSTD_CONTENTSIZE_ERROR)
        return tsr_err(err, TSR_ECORRUPT, "%s%s: malformed or truncated zstd frame header", what,
                       where);
    if (fcs == ZSTD_CONTENTSIZE_UNKNOWN)
        return tsr_err(err, TSR_ECORRUPT, "%s%s: zstd frame does not record its content size",
                       what, where);
    if (fcs != n)
        return tsr_err(err, TSR_ECORRUPT, "%s%s: zstd frame holds %llu bytes, expected %zu",
                       what, where, fcs, n);
    size_t fl = ZSTD_findFrameCompressedSize(src, len);
    if (ZSTD_isError(fl))
        return tsr_err(err, TSR_ECORRUPT, "%s%s: malformed or truncated zstd frame (%s)", what,
                       where, ZSTD_getErrorName(fl));
    if (fl != len)
        return tsr_err(err, TSR_ECORRUPT,
                       "%s%s: zstd frame is %zu bytes but %zu bytes are stored", what, where, fl,
                       len);
    if (!c->dctx && !(c->dctx = ZSTD_createDCtx()))
        return tsr_err(err, TSR_ENOMEM, "%s%s: out of memory for a zstd decompression context", what, where);
    size_t r = ZSTD_decompressDCtx(c->dctx, dst, n, src, len);
    if (ZSTD_isError(r)) {
        if (ZSTD_getErrorCode(r) == ZSTD_error_memory_allocation)
            return tsr_err(err, TSR_ENOMEM, "%s%s: zstd is out of memory", what, where);
        return tsr_err(err, TSR_ECORRUPT, "%s%s: corrupt zstd frame: %s", what, where,
                       ZSTD_getErrorName(r));
    }
    if (r != n)
        return tsr_err(err, TSR_ECORRUPT, "%s%s: zstd frame decoded to %zu bytes, expected %zu",
                       what, where, r, n);
    return 0;
}

/* --------------------------------------------------------------- encode */

/* 1 when the order-0 entropy of (a sample of) the plane says a zstd (Huffman)
 * coding of it saves at least 3%. The sample is the whole plane up to 64 KiB,
 * else 16 spans of 4 KiB spread evenly over it. */
static int plane_worth_coding(const uint8_t *p, size_t n) {
    enum { SPAN = 4096, NSPAN = 16 };
    uint32_t h[4][256];
    memset(h, 0, sizeof h);
    size_t total = 0;
    for (size_t k = 0; k < NSPAN; k++) {
        size_t start, len;
        if (n <= (size_t)SPAN * NSPAN) {
            if (k) break;
            start = 0, len = n;
        } else {
            start = (n - SPAN) / (NSPAN - 1) * k, len = SPAN;
        }
        const uint8_t *q = p + start;
        size_t i = 0;
        for (; i + 4 <= len; i += 4) {
            h[0][q[i]]++;
            h[1][q[i + 1]]++;
            h[2][q[i + 2]]++;
            h[3][q[i + 3]]++;
        }
        for (; i < len; i++) h[0][q[i]]++;
        total += len;
    }
    if (total == 0) return 0;
    double bits = 0;
    for (int s = 0; s < 256; s++) {
        uint32_t cnt = h[0][s] + h[1][s] + h[2][s] + h[3][s];
        if (cnt) bits -= cnt * log2((double)cnt / (double)total);
    }
    /* Estimated stored size: the entropy plus ~64 bytes of table per 128 KiB
     * block and a frame header. */
    double est = bits / 8 / (double)total * (double)n + 64.0 * (double)(n / (128 << 10) + 1) + 16;
    return est <= 0.97 * (double)n;
}

static int encode_bytegroup(tsr_codec *c, int dtype, int level, const uint8_t *raw,
                            size_t raw_size, uint8_t *out, size_t *out_size, tsr_error *err) {
    size_t np = tsr_dtype_size(dtype), n = raw_size / np;
    if (n > UINT32_MAX)
        return tsr_err(err, TSR_EINVAL, "codec: a bytegroup plane of %zu bytes exceeds 4 GiB", n);
    int rc = scratch_reserve(c, raw_size, err);
    if (rc) return rc;
    uint8_t *planes[BG_MAX_PLANES];
    for (size_t p = 0; p < np; p++) planes[p] = c->scratch + p * n;
    tsr_planes_split(dtype, raw, n, planes);

    size_t pos = BG_ENTRY * np;
    for (size_t p = 0; p < np; p++) {
        uint8_t *e = out + BG_ENTRY * p;
        size_t len = 0;
        int method = 0;
        /* plane 0 is tried unless it looks like noise (random bits compress to nothing) */
        if (n > 1 && plane_worth_coding(planes[p], n)) {
            rc = cctx_setup(c, MODE_PLANE, level, err);
            if (!rc) rc = zcompress(c, planes[p], n, out + pos, n - 1, &len, err);
            if (rc < 0) return rc;
            method = rc == 0;
        }
        if (!method) {
            memcpy(out + pos, planes[p], n);
            len = n;
        }
        e[0] = (uint8_t)method;
        e[1] = e[2] = e[3] = 0;
        tsr_st32(e + 4, (uint32_t)len);
        pos += len;
    }
    *out_size = pos;
    return 0;
}

int tsr_frame_stores_raw(int dtype, int codec, const void *raw, size_t raw_size) {
    if (codec == TSR_CODEC_RAW || raw_size == 0) return 1;
    if (codec == TSR_CODEC_AUTO) codec = is_plane_dtype(dtype) ? TSR_CODEC_BYTEGROUP : TSR_CODEC_ZSTD;
    return codec == TSR_CODEC_ZSTD && !plane_worth_coding(raw, raw_size);
}

int tsr_frame_encode(tsr_codec *c, int dtype, int codec, int level, const void *raw,
                     size_t raw_size, void *out, size_t out_cap, size_t *out_size,
                     int *out_codec, tsr_error *err) {
    if (!c || (!raw && raw_size) || !out || !out_size || !out_codec)
        return tsr_err(err, TSR_EINVAL, "codec: encode: NULL argument");
    size_t es = tsr_dtype_size(dtype);
    if (!es) return tsr_err(err, TSR_EINVAL, "codec: encode: unknown dtype %d", dtype);
    if (raw_size % es)
        return tsr_err(err, TSR_EINVAL, "codec: encode: %zu bytes is not a whole number of %s elements",
                       raw_size, tsr_dtype_name(dtype));
    if (out_cap < tsr_codec_bound(raw_size))
        return tsr_err(err, TSR_EINVAL,
                       "codec: encode: output capacity %zu is below the bound %zu for %zu bytes",
                       out_cap, tsr_codec_bound(raw_size), raw_size);
    if (codec == TSR_CODEC_AUTO) {
        codec = is_plane_dtype(dtype) ? TSR_CODEC_BYTEGROUP : TSR_CODEC_ZSTD;
    } else if (codec == TSR_CODEC_BYTEGROUP) {
        if (!is_plane_dtype(dtype))
            return tsr_err(err, TSR_EINVAL, "codec: bytegroup applies to f32, f16 and bf16, not %s",
                           tsr_dtype_name(dtype));
    } else if (codec != TSR_CODEC_RAW && codec != TSR_CODEC_ZSTD) {
        return tsr_err(err, TSR_EINVAL, "codec: unknown codec %d", codec);
    }

    uint8_t *o = out;
    size_t len = 0;
    int rc = 1; /* 1: store raw */
    /* bytes that look like noise (order-0 entropy, sampled) are stored raw at
     * once: running zstd over them costs time and gains nothing */
    if (raw_size > 0 && codec == TSR_CODEC_ZSTD && !plane_worth_coding(raw, raw_size)) {
        rc = 1;
    } else if (raw_size > 0 && codec == TSR_CODEC_ZSTD) {
        rc = cctx_setup(c, MODE_FRAME, level, err);
        if (!rc) rc = zcompress(c, raw, raw_size, o, raw_size - 1, &len, err);
    } else if (raw_size > 0 && codec == TSR_CODEC_BYTEGROUP) {
        rc = encode_bytegroup(c, dtype, level, raw, raw_size, o, &len, err);
        if (!rc && len >= raw_size) rc = 1;
    }
    if (rc < 0) return rc;
    if (rc == 1) {
        if (raw_size) memcpy(o, raw, raw_size);
        len = raw_size;
        codec = TSR_CODEC_RAW;
    }
    *out_size = len;
    *out_codec = codec;
    return 0;
}

/* --------------------------------------------------------------- decode */

static int decode_bytegroup(tsr_codec *c, int dtype, const uint8_t *in, size_t in_size,
                            uint8_t *raw, size_t raw_size, tsr_error *err) {
    size_t np = tsr_dtype_size(dtype);
    if (raw_size % np)
        return tsr_err(err, TSR_ECORRUPT,
                       "bytegroup: raw size %zu is not a whole number of %zu-byte %s elements",
                       raw_size, np, tsr_dtype_name(dtype));
    size_t n = raw_size / np, hdr = BG_ENTRY * np;
    if (in_size < hdr)
        return tsr_err(err, TSR_ECORRUPT,
                       "bytegroup: %zu stored bytes cannot hold the %zu-byte plane header",
                       in_size, hdr);
    size_t off[BG_MAX_PLANES], len[BG_MAX_PLANES], pos = hdr, nz = 0;
    for (size_t p = 0; p < np; p++) {
        const uint8_t *e = in + BG_ENTRY * p;
        if (e[0] > 1)
            return tsr_err(err, TSR_ECORRUPT, "bytegroup plane %zu: unknown method %u", p, e[0]);
        if (e[1] | e[2] | e[3])
            return tsr_err(err, TSR_ECORRUPT, "bytegroup plane %zu: reserved bytes are not zero",
                           p);
        len[p] = tsr_ld32(e + 4);
        if (e[0] == 0 && len[p] != n)
            return tsr_err(err, TSR_ECORRUPT,
                           "bytegroup plane %zu: raw plane of %zu bytes, expected %zu", p, len[p],
                           n);
        if (len[p] > in_size - pos)
            return tsr_err(err, TSR_ECORRUPT,
                           "bytegroup plane %zu: stored length %zu runs past the end of the "
                           "%zu-byte frame",
                           p, len[p], in_size);
        off[p] = pos;
        pos += len[p];
        nz += e[0];
    }
    if (pos != in_size)
        return tsr_err(err, TSR_ECORRUPT,
                       "bytegroup: header and planes make %zu bytes but %zu are stored", pos,
                       in_size);
    int rc = scratch_reserve(c, nz * n, err);
    if (rc) return rc;
    const uint8_t *planes[BG_MAX_PLANES];
    uint8_t *z = c->scratch;
    for (size_t p = 0; p < np; p++) {
        if (in[BG_ENTRY * p] == 0) {
            planes[p] = in + off[p];
            continue;
        }
        rc = zdecompress(c, in + off[p], len[p], z, n, "bytegroup", (int)p, err);
        if (rc) return rc;
        planes[p] = z;
        z += n;
    }
    tsr_planes_merge(dtype, planes, n, raw);
    return 0;
}

int tsr_frame_decode(tsr_codec *c, int dtype, int codec, const void *in, size_t in_size,
                     void *raw, size_t raw_size, tsr_error *err) {
    if (!c || (!in && in_size) || (!raw && raw_size))
        return tsr_err(err, TSR_EINVAL, "codec: decode: NULL argument");
    const uint8_t *i = in;
    switch (codec) {
    case TSR_CODEC_RAW:
        if (in_size != raw_size)
            return tsr_err(err, TSR_ECORRUPT, "raw frame of %zu bytes, expected %zu", in_size,
                           raw_size);
        if (raw_size) memcpy(raw, in, raw_size);
        return 0;
    case TSR_CODEC_ZSTD: return zdecompress(c, i, in_size, raw, raw_size, "zstd", -1, err);
    case TSR_CODEC_BYTEGROUP:
        if (!is_plane_dtype(dtype))
            return tsr_err(err, TSR_ECORRUPT, "bytegroup frame of dtype %s (%d): only f32, f16 "
                           "and bf16 can be bytegrouped", tsr_dtype_name(dtype), dtype);
        return decode_bytegroup(c, dtype, i, in_size, raw, raw_size, err);
    default: return tsr_err(err, TSR_ECORRUPT, "unknown codec %d", codec);
    }
}
