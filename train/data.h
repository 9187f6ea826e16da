/* data.h: the trainer's data loader: batches of token samples from llm.c token
 * shards (formats/tokens.h), at a global position that resumes exactly on any
 * number of data-parallel ranks.
 *
 * The shards of a split are concatenated, in name order, into one stream of N
 * tokens. Sample i is the T+1 tokens starting at i*T (inputs: the first T,
 * targets: the last T, i.e. the inputs shifted by one), for i < S = (N-1)/T; the
 * tail that does not fill a sample is never served.
 *
 * An epoch visits all S samples once, in an order that is a seeded permutation
 * of [0, S) depending only on (seed, epoch). The position is global: (epoch,
 * samples of that order consumed, seed). The global batch at a position is the
 * next global_batch samples of the order, continuing into the next epoch's
 * order when this one runs out. Data-parallel rank r of D takes the slice
 * [r*B, (r+1)*B) of it (global_batch = B*D); so the concatenation of the D
 * ranks' batches is the batch one rank with B*D rows gets, and a position saved
 * on D ranks resumes on any other number. The order is computed, not stored: a
 * keyed Feistel permutation with cycle walking, O(1) memory and time per sample.
 *
 * Errors follow tessera.h: 0 or a negative tsr_status, with a message naming
 * the directory, shard file or position and the reason. */
#ifndef TSR_DATA_H
#define TSR_DATA_H

#include <stdint.h>

#include "tsr_ckpt.h"

/* The position in the data: a plain value, copied into and out of checkpoints
 * (tsr_data_pos_encode/decode give its 24-byte little-endian form). */
typedef struct tsr_data_pos {
    uint64_t epoch;  /* epochs completed */
    uint64_t sample; /* samples of this epoch's order consumed, < samples per epoch */
    uint64_t seed;   /* the seed of the order */
} tsr_data_pos;

#define TSR_DATA_POS_BYTES 24
void tsr_data_pos_encode(const tsr_data_pos *pos, uint8_t out[TSR_DATA_POS_BYTES]);
void tsr_data_pos_decode(const uint8_t in[TSR_DATA_POS_BYTES], tsr_data_pos *pos);

typedef struct tsr_loader tsr_loader;

/* tsr_loader_open(): the shards of a split, with samples of T+1 tokens.
 *  - `dir` a directory: its files NAME.bin where one of the '_'-separated words
 *    of NAME is `split`: train_000000.bin (tessera data prep),
 *    fineweb_train_000001.bin, tiny_shakespeare_val.bin (llm.c);
 *  - `dir` a glob pattern (it holds '*', '?' or '['), or one shard file: those
 *    files; split is not used and may be NULL.
 * Every shard is checked (tsr_tokens_open) and mapped.
 * @return 0 and *out; TSR_ENOTFOUND naming the directory, pattern or split when
 * there is nothing to read; the shard's error when one is bad; TSR_EINVAL when
 * T < 1 or the split holds fewer than T+1 tokens. */
int tsr_loader_open(const char *dir, const char *split, int T, tsr_loader **out, tsr_error *err);

/* tsr_loader_set_vocab(): from now on, tsr_loader_next() refuses a batch holding
 * a token >= vocab, naming the shard and the token's index in it. Without it,
 * only tokens above INT32_MAX are refused. */
void tsr_loader_set_vocab(tsr_loader *l, uint32_t vocab);

uint64_t tsr_loader_samples(const tsr_loader *l); /* S: samples per epoch */
uint64_t tsr_loader_tokens(const tsr_loader *l);  /* N: tokens of the split */
int tsr_loader_shards(const tsr_loader *l);       /* number of shard files */
int tsr_loader_seq_len(const tsr_loader *l);      /* T */

/* tsr_loader_sample_at(): the index (in [0, S)) of the k-th sample of the order
 * of (seed, epoch), for k < S. */
uint64_t tsr_loader_sample_at(const tsr_loader *l, uint64_t seed, uint64_t epoch, uint64_t k);

/* tsr_loader_next(): fills inputs and targets, each (B,T) row-major int, with
 * data-parallel rank dp_rank's B samples of the global batch at *pos
 * (global_batch = B * dp_size), then advances *pos by global_batch, into the
 * next epoch(s) when the batch goes past the end of this one.
 * @return 0; TSR_EINVAL for B < 1, a bad rank or a position whose sample is not
 * below S (saved on other data), *pos unchanged; TSR_ECORRUPT for a token out
 * of range (see tsr_loader_set_vocab), *pos unchanged. Thread-safe: it reads
 * the loader and writes only *pos, inputs and targets. */
int tsr_loader_next(tsr_loader *l, tsr_data_pos *pos, int B, int dp_rank, int dp_size, int *inputs, int *targets,
                    tsr_error *err);

void tsr_loader_close(tsr_loader *l);

#endif
