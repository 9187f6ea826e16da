/* fuzz_frame.c: libFuzzer target for the frame codec (formats/codec.c).
 *
 * Input: [0] dtype, [1] codec, [2..5] raw_size (LE, at most 1 MiB), [6..9] a byte
 * position, [10] an xor mask, [11] zstd level selector, then the payload.
 *  1. tsr_frame_decode of the payload as stored bytes of (dtype, codec, raw_size):
 *     must not crash; a refusal is TSR_ECORRUPT (or EINVAL/ENOMEM), success fills
 *     exactly raw_size bytes.
 *  2. Round trip: the payload, cut to whole elements of a valid dtype, encoded
 *     with the requested codec and decoded with the codec the encoder reports:
 *     must give the same bytes.
 *  3. The encoded bytes with one byte changed (position and mask from the input)
 *     or cut short: decoding must not crash, and if it succeeds it yields raw_size
 *     bytes (checked by ASan: the output buffer has exactly that size). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "common.h"
#include "tessera.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define HDR 12
#define MAX_RAW (1u << 20)

static tsr_codec *codec(void) {
    static tsr_codec *c;
    if (!c) c = tsr_codec_new();
    if (!c) __builtin_trap();
    return c;
}

static void check_refusal(int rc, const tsr_error *e) {
    if (rc == 0) return;
    if (rc != TSR_ECORRUPT && rc != TSR_EINVAL && rc != TSR_ENOMEM) __builtin_trap();
    if (e->code != rc || e->msg[0] == 0) __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < HDR) return 0;
    tsr_codec *c = codec();
    tsr_error e = {0};
    int dtype = data[0] % 17;          /* 0 and 16: unknown */
    int dcodec = data[1] % 5;          /* 3 and 4: unknown */
    size_t raw_size = tsr_ld32(data + 2) % (MAX_RAW + 1);
    const uint8_t *payload = data + HDR;
    size_t plen = size - HDR;

    /* 1. hostile stored bytes (exact-size copies: ASan sees overreads) */
    uint8_t *in = malloc(plen ? plen : 1), *raw = malloc(raw_size ? raw_size : 1);
    if (!in || !raw) __builtin_trap();
    if (plen) memcpy(in, payload, plen);
    int rc = tsr_frame_decode(c, dtype, dcodec, in, plen, raw, raw_size, &e);
    check_refusal(rc, &e);
    if (rc == 0 && dcodec == TSR_CODEC_RAW && (plen != raw_size || (plen && memcmp(raw, in, plen))))
        __builtin_trap();
    free(in);
    free(raw);

    /* 2. round trip of the payload as elements of a valid dtype */
    int dt = 1 + data[0] % 15;
    int req = (int)(data[1] % 4) - 1; /* AUTO, RAW, ZSTD, BYTEGROUP */
    static const int levels[] = {1, 1, 3, -1, 6, 16};
    int level = levels[data[11] % 6];
    size_t es = tsr_dtype_size(dt);
    size_t n = plen / es * es;
    if (level >= 16 && n > 8192) level = 3; /* zstd's optimal parser: slow on big inputs */
    size_t cap = tsr_codec_bound(n);
    uint8_t *src = malloc(n ? n : 1), *enc = malloc(cap ? cap : 1), *dec = malloc(n ? n : 1);
    if (!src || !enc || !dec) __builtin_trap();
    if (n) memcpy(src, payload, n);
    size_t enc_n = 0;
    int used = -1;
    memset(&e, 0, sizeof e);
    rc = tsr_frame_encode(c, dt, req, level, src, n, enc, cap, &enc_n, &used, &e);
    int plane = dt == TSR_F32 || dt == TSR_F16 || dt == TSR_BF16;
    if (req == TSR_CODEC_BYTEGROUP && !plane) {
        if (rc != TSR_EINVAL) __builtin_trap(); /* bytegroup is for f32/f16/bf16 only */
    } else {
        if (rc != 0) __builtin_trap();
        if (used != TSR_CODEC_RAW && used != TSR_CODEC_ZSTD && used != TSR_CODEC_BYTEGROUP) __builtin_trap();
        if (used == TSR_CODEC_BYTEGROUP && !plane) __builtin_trap();
        if (enc_n > cap || (used == TSR_CODEC_RAW ? enc_n != n : enc_n >= n)) __builtin_trap();
        memset(&e, 0, sizeof e);
        if (tsr_frame_decode(c, dt, used, enc, enc_n, dec, n, &e) != 0) __builtin_trap();
        if (n && memcmp(src, dec, n) != 0) __builtin_trap();

        /* 3. the encoded frame, damaged: one byte changed, or cut short */
        if (enc_n > 0) {
            uint32_t pos = tsr_ld32(data + 6);
            size_t dn = enc_n;
            uint8_t *bad = malloc(enc_n);
            if (!bad) __builtin_trap();
            memcpy(bad, enc, enc_n);
            if (data[10] == 0) dn = pos % enc_n; /* truncated */
            else bad[pos % enc_n] ^= data[10];
            uint8_t *out = malloc(n ? n : 1);
            if (!out) __builtin_trap();
            memset(&e, 0, sizeof e);
            rc = tsr_frame_decode(c, dt, used, bad, dn, out, n, &e);
            check_refusal(rc, &e);
            /* the same bytes under the other codecs */
            for (int k = 0; k < 3; k++) {
                if (k == used) continue;
                memset(&e, 0, sizeof e);
                check_refusal(tsr_frame_decode(c, dt, k, bad, dn, out, n, &e), &e);
            }
            free(out);
            free(bad);
        }
    }
    free(src);
    free(enc);
    free(dec);
    return 0;
}
