/* attention.h: causal grouped-query attention with the probabilities kept for
 * backward. Query head h reads key/value head h / (NH/NKV) (NH a multiple of
 * NKV; NH == NKV is plain multi-head attention); scores are scaled by
 * 1/sqrt(hd). float32, row-major; every product is an sgemm. CUDA twin later.
 * Backward adds into its gradients (+=); a NULL gradient is skipped. */
#ifndef TSR_ATTENTION_H
#define TSR_ATTENTION_H

#include <stddef.h>

/* q (B,T,NH,hd), k and v (B,T,NKV,hd), out (B,T,NH,hd); att (B,NH,T,T) keeps the
 * softmax probabilities for backward (zero above the diagonal). Calls with
 * NH % NKV != 0 or a size <= 0 do nothing. */
void tsr_attention_fwd(float *out, float *att, const float *q, const float *k, const float *v, int B, int T, int NH,
                       int NKV, int hd);
/* The floats of scratch that tsr_attention_bwd needs: B*NH*T*T, one score
 * gradient per head (as large as att). */
size_t tsr_attention_scratch(int B, int T, int NH, int hd);
/* dq (B,T,NH,hd), dk and dv (B,T,NKV,hd) += the gradients of sum(dout * out),
 * given the forward's q, k, v and att. scratch: at least
 * tsr_attention_scratch(B,T,NH,hd) floats, overwritten. dk and dv sum the heads
 * of a group in head order whatever the thread count. */
void tsr_attention_bwd(float *dq, float *dk, float *dv, float *scratch, const float *dout, const float *q,
                       const float *k, const float *v, const float *att, int B, int T, int NH, int NKV, int hd);

#endif
