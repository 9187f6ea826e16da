/* kctx.h: a kernel context, the one door from the trainer to its memory.
 *
 * A context is a memory kind and a stream. Every kernel the trainer runs (the
 * step, the optimizer, parameter init, FSDP's packing) and every copy between
 * its memory and the host goes through the calls below, which run the CPU
 * kernel (the headers of kernels/) or its CUDA twin (kernels/cuda/tsr_cuda.h)
 * with the same arguments, queued on the context's stream. Host code never
 * reads or writes the context's memory itself: it copies with tsr_kc_to_host
 * and tsr_kc_from_host. The guard kind (TSR_MEM_GUARD, base/mem.h) runs the
 * CPU kernels on memory that host code cannot touch, so that a machine without
 * a GPU runs the device's call sequence and a stray host access crashes there;
 * a kernel handed memory that is not the context's (a host buffer on a device)
 * stops the process with the kernel's name.
 *
 * Kernels return once queued; a failure of a queued kernel (a CUDA launch, a
 * cuBLAS refusal) is kept, the first one, and returned by the next
 * tsr_kc_sync, tsr_kc_to_host or tsr_kc_check. Every kernel's semantics are
 * its CPU twin's (the headers named beside it). */
#ifndef TSR_KCTX_H
#define TSR_KCTX_H

#include <stddef.h>
#include <stdint.h>

#include "mem.h"

typedef struct tsr_kctx {
    tsr_mem_kind mem;
    int device;           /* CUDA: the device's number (0 for the host's kinds) */
    tsr_stream *stream;   /* CUDA: the stream the kernels are queued on (NULL: the default stream) */
    /* The operands of matrix products (tsr_kc_matmul_*; on a GPU attention's
     * too): TSR_F32 (the default: the exact path) or TSR_BF16, TorchTitan's
     * mixed precision: operands rounded to bf16, products accumulated and
     * stored in f32. Set by the owner after tsr_kctx_init. */
    tsr_dtype gemm;
    double *sum_scratch;  /* CUDA: the partial sums of tsr_kc_sum_add, tsr_kc_sumsq_add and tsr_kc_sumsq_ranges */
    void *scratch;        /* the bf16 operands of mixed precision, grown as needed */
    size_t scratch_cap;
    tsr_error err;        /* the first failure of a queued kernel (code 0: none) */
} tsr_kctx;

/* tsr_kctx_devices(): the devices this process can use for memory of `kind`:
 * the GPUs for TSR_MEM_CUDA (0 in a build without CUDA or without a GPU); 0
 * for the host's kinds, which need none. */
int tsr_kctx_devices(tsr_mem_kind kind);
/* tsr_kctx_init(): a context over memory of `kind` (tsr_mem_usable's error for a
 * kind this build lacks); for a device, device number `device` is made this
 * process's current one and the context works on its default stream. */
int tsr_kctx_init(tsr_kctx *kc, tsr_mem_kind kind, int device, tsr_error *err);
void tsr_kctx_free(tsr_kctx *kc);
/* tsr_kctx_mem_used(): for a device, its bytes in use (by every process on
 * it) and its size; -1 for the host's kinds, which report none. */
int tsr_kctx_mem_used(const tsr_kctx *kc, size_t *used, size_t *total);
/* tsr_kc_alloc(), tsr_kc_free(): memory of the context's kind, zeroed. */
void *tsr_kc_alloc(tsr_kctx *kc, size_t bytes, tsr_error *err);
void tsr_kc_free(tsr_kctx *kc, void *p);
/* tsr_kc_sync(): waits for everything queued; the first failure since the last
 * report. tsr_kc_check(): that failure without waiting. */
int tsr_kc_sync(tsr_kctx *kc, tsr_error *err);
int tsr_kc_check(tsr_kctx *kc, tsr_error *err);
/* Copies between the host and the context's memory, ordered after the kernels
 * queued before them. tsr_kc_to_host returns once the bytes are at dst;
 * tsr_kc_from_host once src may be reused. */
int tsr_kc_to_host(tsr_kctx *kc, void *dst, const void *src, size_t bytes, tsr_error *err);
int tsr_kc_from_host(tsr_kctx *kc, void *dst, const void *src, size_t bytes, tsr_error *err);

/* buffers.h, on the context's memory: zero `bytes` bytes; fill; copy (no
 * overlap); add. tsr_kc_copy2d(): `rows` rows of `width` bytes, from src every
 * spitch bytes to dst every dpitch bytes. */
void tsr_kc_zero(tsr_kctx *kc, void *x, size_t bytes);
void tsr_kc_fill(tsr_kctx *kc, float *x, size_t n, float v);
void tsr_kc_copy(tsr_kctx *kc, void *dst, const void *src, size_t bytes);
void tsr_kc_copy2d(tsr_kctx *kc, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows);
void tsr_kc_add(tsr_kctx *kc, float *out, const float *a, const float *b, size_t n);
/* casts.h: out (n bf16) = in (n f32), round to nearest even. */
void tsr_kc_f32_to_bf16(tsr_kctx *kc, uint16_t *out, const float *in, size_t n);
/* embed.h */
void tsr_kc_embed_fwd(tsr_kctx *kc, float *out, const int *tokens, const float *wte, int N, int C, int V);
void tsr_kc_embed_bwd(tsr_kctx *kc, float *dwte, const float *dout, const int *tokens, int N, int C, int V);
/* norm.h */
void tsr_kc_rmsnorm_fwd(tsr_kctx *kc, float *out, float *rstd, const float *inp, const float *w, int N, int C,
                        float eps);
void tsr_kc_rmsnorm_bwd(tsr_kctx *kc, float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                        const float *rstd, int N, int C);
/* matmul.h; with gemm = TSR_BF16 every operand is first rounded to bf16 (to
 * nearest even: products of bf16 values are exact in f32, so the CPU kernel on
 * the rounded values and a GPU's bf16 tensor cores agree but for the order of
 * the f32 sums) */
void tsr_kc_matmul_fwd(tsr_kctx *kc, float *out, const float *inp, const float *w, int N, int C, int OC);
void tsr_kc_matmul_bwd(tsr_kctx *kc, float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                       int N, int C, int OC);
/* rope.h: the tables in the context's memory */
void tsr_kc_rope_fwd(tsr_kctx *kc, float *x, const float *cos_t, const float *sin_t, int B, int T, int H, int hd);
void tsr_kc_rope_bwd(tsr_kctx *kc, float *dx, const float *cos_t, const float *sin_t, int B, int T, int H, int hd);
/* attention.h; on a GPU with gemm = TSR_BF16 its products run on the tensor
 * cores (bf16 operands, f32 accumulation and probabilities) */
void tsr_kc_attention_fwd(tsr_kctx *kc, float *out, float *att, const float *q, const float *k, const float *v, int B,
                          int T, int NH, int NKV, int hd);
void tsr_kc_attention_bwd(tsr_kctx *kc, float *dq, float *dk, float *dv, float *att_scratch, const float *dout,
                          const float *q, const float *k, const float *v, const float *att, int B, int T, int NH,
                          int NKV, int hd);
/* activation.h */
void tsr_kc_swiglu_fwd(tsr_kctx *kc, float *out, const float *gate, const float *up, size_t n);
void tsr_kc_swiglu_bwd(tsr_kctx *kc, float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                       size_t n);
/* loss.h, without the counts of targets (the host knows them) */
void tsr_kc_xent_fwd(tsr_kctx *kc, float *losses, float *probs, const float *logits, const int *targets, int N, int V);
void tsr_kc_xent_part_stats(tsr_kctx *kc, float *stats, const float *logits, int N, int Vt);
void tsr_kc_xent_part_fwd(tsr_kctx *kc, float *losses, float *probs, const float *logits, const int *targets, int N,
                          int Vt, int v0, const float *stats, int parts);
void tsr_kc_xent_part_bwd(tsr_kctx *kc, float *dlogits, const float *probs, const int *targets, const float *dloss,
                          int N, int Vt, int v0, int V);
/* Sums into one double of the context's memory: *acc += tsr_xent_sum(x, n)
 * (loss.h: in index order on the CPU), *acc += tsr_sumsq(x, n) (optim.h). No
 * allocation and no wait: a step's losses and squared gradients add up on the
 * device and come to the host in one copy. */
void tsr_kc_sum_add(tsr_kctx *kc, double *acc, const float *x, size_t n);
void tsr_kc_sumsq_add(tsr_kctx *kc, double *acc, const float *x, size_t n);
/* *acc += the sum of squares (tsr_sumsq) of each of `count` ranges of base,
 * in range order; ranges: `count` pairs (offset, length) in floats, in the
 * context's memory (uploaded once), `total` their summed lengths. One launch
 * on a GPU: the gradient norm of every parameter at once. */
void tsr_kc_sumsq_ranges(tsr_kctx *kc, double *acc, const float *base, const uint64_t *ranges, int count,
                         size_t total);
/* hash.h: *acc (one uint64_t of the context's memory) += tsr_hash_sum(x, n,
 * index0) over n 32-bit words at x, modulo 2^64. No allocation and no wait:
 * several calls add into one word (hash.h: the parts of a buffer add up) that
 * comes to the host in one copy; the same value on every kind. */
void tsr_kc_hash_add(tsr_kctx *kc, uint64_t *acc, const void *x, size_t n, uint64_t index0);
/* optim.h; one call over the whole state where the hyper-parameters are shared
 * (the update is element-wise) */
void tsr_kc_adamw(tsr_kctx *kc, float *p, const float *g, float gscale, float *m, float *v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, long t);

#endif
