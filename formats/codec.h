/* codec.h: the frame codec of format v1 (FORMAT.md, "Codecs"). Internal.
 *
 * A frame is the raw bytes of a sub-box of one chunk (or a piece of a blob),
 * encoded on its own. Codecs: TSR_CODEC_RAW (stored as is), TSR_CODEC_ZSTD (one
 * zstd frame), TSR_CODEC_BYTEGROUP (f32/f16/bf16 only: element bits regrouped into
 * byte planes, each plane zstd-coded or stored raw). */
#ifndef TSR_CODEC_H
#define TSR_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "tsr_formats.h"

/* Per-thread codec state (zstd contexts, scratch planes). Reused across frames. */
typedef struct tsr_codec tsr_codec;
tsr_codec *tsr_codec_new(void);
void tsr_codec_free(tsr_codec *c);

/* tsr_codec_bound(): the most bytes tsr_frame_encode can write for raw_size bytes
 * with any codec. */
size_t tsr_codec_bound(size_t raw_size);

/* tsr_frame_stores_raw(): 1 when tsr_frame_encode would store these bytes raw
 * without running a coder (codec RAW, or zstd on bytes that look like noise), so
 * that a writer may write them from where they are. */
int tsr_frame_stores_raw(int dtype, int codec, const void *raw, size_t raw_size);
/* tsr_frame_encode(): encodes `raw` (raw_size bytes of elements of `dtype`; a blob
 * frame passes TSR_U8) into `out` (capacity out_cap >= tsr_codec_bound(raw_size)).
 * `codec` is a TSR_CODEC_* request: AUTO picks bytegroup for f32/f16/bf16, zstd
 * otherwise; any request falls back to RAW when the encoded form is not smaller
 * than the raw bytes. BYTEGROUP on a dtype other than f32/f16/bf16 is TSR_EINVAL.
 * `level` is the zstd level.
 * @return 0 and *out_size, *out_codec (the codec actually used), or a negative
 * tsr_status with err set. */
int tsr_frame_encode(tsr_codec *c, int dtype, int codec, int level, const void *raw,
                     size_t raw_size, void *out, size_t out_cap, size_t *out_size,
                     int *out_codec, tsr_error *err);

/* tsr_frame_decode(): decodes `in` (in_size stored bytes written with `codec` for
 * elements of `dtype`) into exactly raw_size bytes at `raw`. Every length inside
 * the stored bytes is checked: a malformed or hostile input is TSR_ECORRUPT, never
 * an out-of-bounds access.
 * @return 0, or a negative tsr_status with err set (the message says what is
 * wrong but not which file or frame: callers prefix that). */
int tsr_frame_decode(tsr_codec *c, int dtype, int codec, const void *in, size_t in_size,
                     void *raw, size_t raw_size, tsr_error *err);

/* tsr_codec_name(): "raw", "zstd", "bytegroup", or "?". */
const char *tsr_codec_name(int codec);

#endif
