/* tsr_cuda.h: the CUDA twins of the CPU kernels (the headers of kernels/), built by
 * `make CUDA=1` from the .cu files of kernels/cuda. Each takes the same arguments as its CPU
 * twin, on device memory (TSR_MEM_CUDA), plus the stream it is queued on (NULL:
 * the default stream); it returns once queued. The CPU kernel is the oracle: a
 * twin computes the same function, and where the CPU kernel promises a fixed
 * summation order (embedding and RMSNorm weight gradients, the sum of squares)
 * the twin keeps one too, so that its results do not change from run to run.
 * Errors of a launch or of the work itself surface at tsr_cuda_sync, and so do
 * cuBLAS's refusals in the kernels that return nothing. */
#ifndef TSR_CUDA_H
#define TSR_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "tsr_base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* tsr_cuda_devices(): the number of GPUs this process can use: 0 in a build
 * without CUDA or where no device (or driver) is present. */
int tsr_cuda_devices(void);
/* tsr_cuda_sync(): waits for the work queued on s; TSR_EIO with CUDA's reason
 * ("cuda: <what>: <reason>") if a launch or the work failed, or with cuBLAS's
 * status ("cuda: <product>: cuBLAS status <n>") if a kernel that returns nothing
 * (the tensor-core attention) had a product refused since the last call. */
int tsr_cuda_sync(tsr_stream *s, tsr_error *err);

/* buffers.h */
void tsr_cuda_fill(float *x, size_t n, float v, tsr_stream *s);
void tsr_cuda_add(float *out, const float *a, const float *b, size_t n, tsr_stream *s);
/* casts.h: round to nearest even, as tsr_f32_to_bf16. */
void tsr_cuda_f32_to_bf16(uint16_t *out, const float *in, size_t n, tsr_stream *s);
void tsr_cuda_bf16_to_f32(float *out, const uint16_t *in, size_t n, tsr_stream *s);
/* embed.h. The backward's dwte is tsr_embed_bwd's to the bit (each row adds its
 * positions in order), without scratch or atomics: one block per position, the
 * first position of each token adding all of that token's rows. */
void tsr_cuda_embed_fwd(float *out, const int *tokens, const float *wte, int N, int C, int V, tsr_stream *s);
void tsr_cuda_embed_bwd(float *dwte, const float *dout, const int *tokens, int N, int C, int V, tsr_stream *s);
/* norm.h. The backward's dw is tsr_rmsnorm_bwd's to the bit: the same fixed
 * chunks of rows, each summed into a partial in row order (a block's threads
 * per chunk), the partials added in chunk order; no scratch, no atomics. */
void tsr_cuda_rmsnorm_fwd(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps,
                          tsr_stream *s);
void tsr_cuda_rmsnorm_bwd(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                          const float *rstd, int N, int C, tsr_stream *s);
/* optim.h */
void tsr_cuda_adamw(float *p, const float *g, float gscale, float *m, float *v, size_t n, float lr, float beta1, float beta2,
                    float eps, float weight_decay, long t, tsr_stream *s);
/* tsr_cuda_sumsq(): the sum of squares of x (n, device memory) in double into
 * *out, summed in fixed chunks in a fixed order (waits for s). @return 0, or
 * TSR_EIO (TSR_ENOMEM) with CUDA's reason. */
int tsr_cuda_sumsq(const float *x, size_t n, double *out, tsr_stream *s, tsr_error *err);
/* Accumulators in device memory, queued on s without allocation or wait: *acc
 * (one double) += the sum of x (n floats; tsr_xent_sum's, loss.h) or of its
 * squares (tsr_sumsq's, in tsr_cuda_sumsq's chunks: the same double), in
 * double, in fixed chunks added in order (the same bits every run); n == 0
 * adds nothing. scratch: tsr_cuda_sum_scratch(n) doubles of device memory
 * (never more than for n = 2^40, whatever n), which calls on one stream may
 * share. */
size_t tsr_cuda_sum_scratch(size_t n);
void tsr_cuda_sum_add(double *acc, const float *x, size_t n, double *scratch, tsr_stream *s);
void tsr_cuda_sumsq_add(double *acc, const float *x, size_t n, double *scratch, tsr_stream *s);
/* The sum of squares of many ranges of one buffer (a gradient norm over many
 * parameters) in two launches, queued on s without allocation or wait: *acc (one
 * double, device memory) += the sum over ranges of the squares of base[off,
 * off + n), in double. ranges: count pairs (off, n) of uint64_t in floats, in
 * device memory; total: the sum of their n (the caller knows it; it fixes the
 * chunks). The ranges laid end to end are cut into fixed chunks summed each by a
 * block, then added in order: the same bits every run, within about 1e-15
 * relative of the sum of tsr_sumsq over the ranges (not its grouping). count <= 0
 * or total == 0 adds nothing. scratch: tsr_cuda_sumsq_ranges_scratch(total)
 * doubles of device memory (never more than for total = 2^40, whatever total),
 * which calls on one stream may share with each other and with tsr_cuda_sum_add's. */
size_t tsr_cuda_sumsq_ranges_scratch(size_t total);
void tsr_cuda_sumsq_ranges(double *acc, const float *base, const uint64_t *ranges, int count, size_t total,
                           double *scratch, tsr_stream *s);
/* hash.h: *acc (one uint64_t, device memory) += tsr_hash_sum(x, n, index0)
 * over n 32-bit words of device memory, modulo 2^64 (integer atomics: the CPU's
 * value to the bit, whatever the order), queued on s without allocation or
 * wait; n == 0 adds nothing. */
void tsr_cuda_hash_sum_add(uint64_t *acc, const void *x, size_t n, uint64_t index0, tsr_stream *s);

/* rope.h: cos_t and sin_t are tsr_rope_tables', copied to the device. */
void tsr_cuda_rope_fwd(float *x, const float *cos_t, const float *sin_t, int B, int T, int H, int hd, tsr_stream *s);
void tsr_cuda_rope_bwd(float *dx, const float *cos_t, const float *sin_t, int B, int T, int H, int hd, tsr_stream *s);
/* activation.h */
void tsr_cuda_swiglu_fwd(float *out, const float *gate, const float *up, size_t n, tsr_stream *s);
void tsr_cuda_swiglu_bwd(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n,
                         tsr_stream *s);
/* loss.h: as tsr_xent_fwd, without the count of targets (the host has them). */
void tsr_cuda_xent_fwd(float *losses, float *probs, const float *logits, const int *targets, int N, int V,
                       tsr_stream *s);
void tsr_cuda_xent_bwd(float *dlogits, const float *probs, const int *targets, const float *dloss, int N, int V,
                       tsr_stream *s);
/* Vocabulary-parallel, as tsr_xent_part_stats, _fwd (without the count of
 * targets; probs may alias logits) and _bwd; stats (parts x (N,2)) on the device. */
void tsr_cuda_xent_part_stats(float *stats, const float *logits, int N, int Vt, tsr_stream *s);
void tsr_cuda_xent_part_fwd(float *losses, float *probs, const float *logits, const int *targets, int N, int Vt, int v0,
                            const float *stats, int parts, tsr_stream *s);
void tsr_cuda_xent_part_bwd(float *dlogits, const float *probs, const int *targets, const float *dloss, int N, int Vt,
                            int v0, int V, tsr_stream *s);
/* matmul.h, through cuBLAS in f32 (no TF32). @return 0, or TSR_EIO when cuBLAS
 * refuses the call. */
int tsr_cuda_matmul_fwd(float *out, const float *inp, const float *w, int N, int C, int OC, tsr_stream *s);
int tsr_cuda_matmul_bwd(float *dinp, float *dw, const float *dout, const float *inp, const float *w, int N, int C,
                        int OC, tsr_stream *s);
/* The same in bf16 through cuBLASLt, f32 accumulation (TorchTitan's mixed
 * precision): out (N, OC) = inp (N, C) @ w^T in bf16; dinp (bf16) += dout @ w;
 * dw, the f32 gradient, += dout^T @ inp. Within bf16's rounding of the CPU
 * kernel on the same (bf16) values. */
int tsr_cuda_matmul_bf16_fwd(uint16_t *out, const uint16_t *inp, const uint16_t *w, int N, int C, int OC, tsr_stream *s);
int tsr_cuda_matmul_bf16_bwd(uint16_t *dinp, float *dw, const uint16_t *dout, const uint16_t *inp, const uint16_t *w,
                             int N, int C, int OC, tsr_stream *s);

/* Mixed precision on f32 tensors (TorchTitan's bf16 policy): tsr_matmul_fwd and
 * _bwd (out = inp @ w^T; dinp += dout @ w; dw += dout^T @ inp; a NULL gradient
 * skipped) with every operand first rounded to bf16 (to nearest even, as
 * tsr_f32_to_bf16) into scratch, the products in cuBLASLt with f32 accumulation
 * and f32 results. Products of bf16 values are exact in f32, so the results are
 * the CPU kernel's on the rounded operands to within f32 summation order.
 * scratch: tsr_cuda_matmul_mixed_scratch(N, C, OC) uint16_t elements of device
 * memory, 256-byte aligned (as the allocator gives it), for both calls; calls on
 * one stream may share it. @return 0, or TSR_EIO when cuBLAS refuses the call. */
size_t tsr_cuda_matmul_mixed_scratch(int N, int C, int OC);
int tsr_cuda_matmul_mixed_fwd(float *out, const float *inp, const float *w, int N, int C, int OC, uint16_t *scratch,
                              tsr_stream *s);
int tsr_cuda_matmul_mixed_bwd(float *dinp, float *dw, const float *dout, const float *inp, const float *w, int N, int C,
                              int OC, uint16_t *scratch, tsr_stream *s);

/* attention.h: the same layouts; scratch as tsr_attention_scratch. */
void tsr_cuda_attention_fwd(float *out, float *att, const float *q, const float *k, const float *v, int B, int T,
                            int NH, int NKV, int hd, tsr_stream *s);
void tsr_cuda_attention_bwd(float *dq, float *dk, float *dv, float *scratch, const float *dout, const float *q,
                            const float *k, const float *v, const float *att, int B, int T, int NH, int NKV, int hd,
                            tsr_stream *s);
/* The same on tensor cores, for the bf16 path: q, k, v and dout rounded to bf16,
 * the products in cuBLAS with f32 accumulation, the softmax and its gradient in
 * f32; att keeps the f32 probabilities as tsr_attention_fwd's (within bf16's
 * rounding of the scores), out is overwritten, dq, dk and dv are added to (NULL:
 * skipped), the query heads of a group summed in a fixed order. scratch_f32:
 * tsr_attention_scratch(B,T,NH,hd) floats (dP), overwritten. scratch:
 * tsr_cuda_attention_tc_scratch(B,T,NH,NKV,hd) bytes of device memory, 256-byte
 * aligned, for both calls (the backward makes its bf16 copies again); calls on
 * one stream may share it. Shapes as tsr_attention_fwd's (bad ones: nothing
 * done, scratch 0). A refusal of cuBLAS is reported by the next tsr_cuda_sync. */
size_t tsr_cuda_attention_tc_scratch(int B, int T, int NH, int NKV, int hd);
void tsr_cuda_attention_tc_fwd(float *out, float *att, const float *q, const float *k, const float *v, int B, int T,
                               int NH, int NKV, int hd, void *scratch, tsr_stream *s);
void tsr_cuda_attention_tc_bwd(float *dq, float *dk, float *dv, float *scratch_f32, const float *dout, const float *q,
                               const float *k, const float *v, const float *att, int B, int T, int NH, int NKV, int hd,
                               void *scratch, tsr_stream *s);

#ifdef __cplusplus
}
#endif
#endif
