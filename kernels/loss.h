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

/* Vocabulary-parallel: a part holds columns [v0, v0 + Vt) of the V classes
 * (logits (N,Vt)); the parts together hold all of them.
 * tsr_xent_part_stats(): stats (N,2) = each row's max over the part and the sum
 * of exp(logit - max) (-inf and 0 for an empty part). */
void tsr_xent_part_stats(float *stats, const float *logits, int N, int Vt);
/* tsr_xent_part_fwd(): from every part's stats (parts x (N,2), in part order: the
 * same on every part), probs (N,Vt) = the part's columns of the softmax (may
 * alias logits); losses (N) = logsumexp - logits[target] for the rows whose
 * target is in this part, 0 for the others. @return the targets in this part. */
int tsr_xent_part_fwd(float *losses, float *probs, const float *logits, const int *targets, int N, int Vt, int v0,
                      const float *stats, int parts);
/* tsr_xent_part_bwd(): tsr_xent_bwd on the part: dlogits (N,Vt) += probs * dloss[i]
 * for each counted row (0 <= target < V), less dloss[i] at a target in the part. */
void tsr_xent_part_bwd(float *dlogits, const float *probs, const int *targets, const float *dloss, int N, int Vt,
                       int v0, int V);
/* tsr_xent_sum(): the sum of losses (N) in double, in index order (the same
 * result on every run and thread count). */
double tsr_xent_sum(const float *losses, int N);

#endif
