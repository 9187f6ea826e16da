/* loss.h: softmax cross-entropy over V classes. float32, row-major; CUDA twin
 * later. Backward adds into its gradient (+=). */
#ifndef TSR_LOSS_H
#define TSR_LOSS_H

/* logits (N,V); targets (N): a target < 0 is ignored (loss 0, no gradient), and so
 * is one >= V (the caller's bug; never read out of bounds). losses (N) =
 * logsumexp(logits) - logits[target]. probs (N,V) = softmax(logits), written for
 * every row, ignored or not; probs may alias logits (written in place).
 * @return the number of counted targets. */
int tsr_xent_fwd(float *losses, float *probs, const float *logits, const int *targets, int N, int V);
/* dlogits (N,V) += (probs - onehot(target)) * dloss[i] for each counted row; dloss (N),
 * e.g. 1/count for a mean. dlogits must not alias probs. */
void tsr_xent_bwd(float *dlogits, const float *probs, const int *targets, const float *dloss, int N, int V);
/* tsr_xent_sum(): the sum of losses (N) in double, in index order (the same
 * result on every run and thread count). */
double tsr_xent_sum(const float *losses, int N);

#endif
