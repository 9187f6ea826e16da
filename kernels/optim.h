/* optim.h: the optimizer step and the helpers of gradient clipping, over flat
 * float32 buffers; CUDA twin later. */
#ifndef TSR_OPTIM_H
#define TSR_OPTIM_H

#include <stddef.h>

/* One step of PyTorch's AdamW on n parameters, in place: p -= lr * wd * p
 * (decoupled weight decay), m and v move toward g and g^2 by (1 - beta), then
 * p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps).
 * g is taken times gscale (gradient clipping: 1 leaves it as it is, to the bit).
 * t is the 1-based step (t = 1 on the first update). */
void tsr_adamw(float *p, const float *g, float gscale, float *m, float *v, size_t n, float lr, float beta1, float beta2,
               float eps, float weight_decay, long t);
/* Sum of squares of x (n), accumulated in double; the same bits for any thread
 * count (fixed chunks summed in order). */
double tsr_sumsq(const float *x, size_t n);

#endif
