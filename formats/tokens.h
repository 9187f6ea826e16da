/* tokens.h: token shards in llm.c's .bin layout, and the byte-level tokenizer.
 *
 * A shard is a header of 256 little-endian int32, then the tokens:
 *   header[0]  magic: 20240520 for uint16 tokens, 20240801 for uint32 tokens
 *   header[1]  version: 1 with the uint16 magic, 7 with the uint32 magic
 *              (the values llm.c's dev/data/data_common.py writes)
 *   header[2]  number of tokens n, 0 <= n <= INT32_MAX
 *   header[3..255]  zero when written; not read
 * followed by n tokens of 2 or 4 bytes, little-endian, and nothing else: the file
 * is exactly 1024 + n * width bytes.
 *
 * Byte-level tokenizer: a token is a byte value (0..255); TSR_BYTE_EOT (256) ends
 * a document. Its vocabulary is TSR_BYTE_VOCAB tokens (a trainer may round it up,
 * e.g. to a multiple of 64, for its embedding table). Byte-level shards are
 * written with uint16 tokens unless the caller asks for uint32.
 *
 * Errors follow tessera.h: 0 or a negative tsr_status, and a message in *err that
 * names the file and the reason. */
#ifndef TSR_TOKENS_H
#define TSR_TOKENS_H

#include <stddef.h>
#include <stdint.h>

#include "tsr_formats.h"

#define TSR_TOKENS_HEADER_INTS 256
#define TSR_TOKENS_HEADER_BYTES (4 * TSR_TOKENS_HEADER_INTS)
#define TSR_TOKENS_MAGIC_U16 20240520
#define TSR_TOKENS_VERSION_U16 1
#define TSR_TOKENS_MAGIC_U32 20240801
#define TSR_TOKENS_VERSION_U32 7
#define TSR_TOKENS_MAX 2147483647u /* header[2] is an int32 */

#define TSR_BYTE_VOCAB 257
#define TSR_BYTE_EOT 256

/* tsr_tokens_write(): writes n tokens to a shard at `path`, each stored in
 * token_bytes (2 or 4) bytes. The file is written under a temporary name and
 * renamed into place, so `path` is either the old file or the whole new one.
 * @return 0; TSR_EINVAL for a bad width, n > TSR_TOKENS_MAX or a token that does
 * not fit in 2 bytes (the message gives its index and value); TSR_EIO or
 * TSR_ENOSPC when the write fails. */
int tsr_tokens_write(const char *path, const uint32_t *tokens, size_t n, int token_bytes, tsr_error *err);

/* An open shard: the file mapped read-only. */
typedef struct tsr_token_shard tsr_token_shard;

/* tsr_tokens_open(): opens and checks a shard: magic, the version that goes with
 * it, and a file size of exactly 1024 + n * width bytes.
 * @return 0 and *out; TSR_ENOTFOUND when the file does not exist, TSR_EIO when
 * it cannot be read, TSR_ECORRUPT for a file shorter than its header, a bad
 * magic, a negative count, or a size that does not match the count (the message
 * says truncated when it is short), TSR_EVERSION for a known magic with another
 * version. */
int tsr_tokens_open(const char *path, tsr_token_shard **out, tsr_error *err);

/* tsr_tokens_header(): the checks of tsr_tokens_open on a shard's bytes: `data`
 * holds at least the header (or all `size` bytes when size is shorter), `size` is
 * the whole shard's length, `name` goes into the messages.
 * @return 0 with *width (2 or 4) and *count; the errors of tsr_tokens_open. */
int tsr_tokens_header(const char *name, const uint8_t *data, uint64_t size, int *width, size_t *count,
                      tsr_error *err);

size_t tsr_tokens_count(const tsr_token_shard *s);
/* tsr_tokens_get(): token i, for i < tsr_tokens_count(s). */
uint32_t tsr_tokens_get(const tsr_token_shard *s, size_t i);
/* tsr_tokens_width(): bytes per token, 2 or 4. */
int tsr_tokens_width(const tsr_token_shard *s);
/* tsr_tokens_path(): the path the shard was opened with. */
const char *tsr_tokens_path(const tsr_token_shard *s);

/* tsr_tokens_check(): scans every token of the shard.
 * @return 0 when all are < vocab; TSR_ECORRUPT naming the file, the index and
 * the value of the first one that is not. */
int tsr_tokens_check(const tsr_token_shard *s, uint32_t vocab, tsr_error *err);

void tsr_tokens_close(tsr_token_shard *s);

/* tsr_byte_tokenize(): the byte-level tokenizer: out[i] = text[i] for each of the
 * len bytes, except that a byte equal to doc_sep (when doc_sep is 0..255) becomes
 * TSR_BYTE_EOT; doc_sep -1 keeps every byte. out holds len tokens. */
void tsr_byte_tokenize(const void *text, size_t len, int doc_sep, uint32_t *out);

#endif
