/* corpus.h: the default training text of tessera: generated, never downloaded.
 *
 * A deterministic function of a seed that reads like a small, consistent world:
 *  - a "world" drawn from the seed: people (name, home town, trade, age, pet,
 *    favourite food and colour), towns, the countries they lie in and their
 *    capitals;
 *  - stories: sentences from a probabilistic grammar of a few hundred words
 *    (subject / verb / object with number agreement, adjectives, numbers written
 *    as words, places, times), about a protagonist whose facts stay true;
 *  - fact sheets and question/answer pairs that repeat the world's facts, the
 *    frequent people far more often than the rare ones (memorisation);
 *  - arithmetic ("17 + 25 = 42", "9 * 7 = 63") and counting lines (patterns).
 * Documents are separated by the byte TSR_CORPUS_DOC_SEP, which occurs nowhere
 * else; the byte-level tokenizer turns it into TSR_BYTE_EOT
 * (tsr_byte_tokenize(text, len, TSR_CORPUS_DOC_SEP, out)). Every other byte is
 * printable ASCII or '\n'.
 *
 * Its byte entropy is about 4.8 bits under an order-0 model (3.3 nats) and 2.1
 * under an order-2 one. A 2-layer, 128-wide byte-level transformer (T 128,
 * batch 32, AdamW 3e-3) reaches a validation loss of 1.0 nats in 300 steps and
 * 0.76 in 400; the facts and sums reward more training. */
#ifndef TSR_CORPUS_H
#define TSR_CORPUS_H

#include <stddef.h>
#include <stdint.h>

#include "tsr_formats.h"

#define TSR_CORPUS_DOC_SEP 0x1e /* ASCII record separator: ends each document */
#define TSR_CORPUS_DEFAULT_BYTES (8u << 20)

/* tsr_corpus_generate(): exactly `bytes` bytes of the corpus of `seed` in a new
 * buffer *text (NUL-terminated, free() it), its length in *len. The corpus of a
 * seed is one endless stream: a shorter one is a prefix of a longer one, and the
 * last document may be cut short.
 * @return 0, or TSR_ENOMEM. */
int tsr_corpus_generate(uint64_t seed, size_t bytes, char **text, size_t *len, tsr_error *err);

#endif
