/* norm.h: RMSNorm as in Llama, y = x * rsqrt(mean(x^2) + eps) * w.
 * float32, row-major; CUDA twin later. Backward adds into its gradients (+=);
 * a NULL gradient is skipped. */
#ifndef TSR_NORM_H
#define TSR_NORM_H

/* inp, out (N,C); w (C); rstd (N) = 1/sqrt(mean(inp^2) + eps) per row, saved for
 * backward. out may alias inp. */
void tsr_rmsnorm_fwd(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps);
/* dinp (N,C) += d/dinp, dw (C) += d/dw of sum(dout * out), given the forward's
 * inp, w and rstd. dw sums its rows in a fixed order whatever the thread count.
 * dinp must not alias dout. */
void tsr_rmsnorm_bwd(float *dinp, float *dw, const float *dout, const float *inp, const float *w, const float *rstd,
                     int N, int C);

#endif
