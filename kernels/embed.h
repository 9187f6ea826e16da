/* embed.h: the token embedding lookup. float32, row-major; CUDA twin later.
 * Backward adds into its gradient (+=); a NULL gradient is skipped. */
#ifndef TSR_EMBED_H
#define TSR_EMBED_H

/* out (N,C) = wte[tokens[i]]; wte (V,C). A token outside [0,V) is the caller's
 * bug; its row of out is zeroed and wte is never read out of bounds. */
void tsr_embed_fwd(float *out, const int *tokens, const float *wte, int N, int C, int V);
/* dwte (V,C) += the rows of dout (N,C) scattered to their tokens; tokens outside
 * [0,V) are skipped. Deterministic: each row of dwte sums its tokens in order. */
void tsr_embed_bwd(float *dwte, const float *dout, const int *tokens, int N, int C, int V);

#endif
