/* hf.h: Hugging Face's Llama layout: parameter names, and the rotary
 * convention of q and k (shared by export and import). */
#ifndef TSR_HF_H
#define TSR_HF_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

/* tsr_hf_name(): the Hugging Face name of parameter p of np (model.h order);
 * *heads: the head count of a q or k weight, whose rows must be permuted (0: none). */
void tsr_hf_name(const tsr_model_args *a, size_t p, size_t np, char *out, size_t len, int *heads);

/* tsr_hf_permute(): w (heads * hd, cols) from Meta's interleaved rotary pairs to
 * Hugging Face's halves (within each head, row 2i + j goes to row j * hd/2 + i),
 * or back with inverse = 1, into out. */
void tsr_hf_permute(const float *w, float *out, int heads, int hd, uint64_t cols, int inverse);

#endif
