/* kctx.c: the kernel context's dispatch: the CUDA twin on device memory (the
 * CUDA build), else the CPU kernel, on the guard kind through the mapping that
 * kernels reach it by (base/mem_guard.c). */
#include "kctx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "activation.h"
#include "attention.h"
#include "buffers.h"
#include "casts.h"
#include "common.h"
#include "embed.h"
#include "hash.h"
#include "loss.h"
#include "matmul.h"
#include "norm.h"
#include "optim.h"
#include "rope.h"

#ifdef TSR_CUDA
#include <cuda_runtime.h>

#include "tsr_cuda.h"

#define ON_DEVICE(kc) ((kc)->mem == TSR_MEM_CUDA)
#define STREAM(kc) ((cudaStream_t)(kc)->stream)

/* Keeps the first failure of a queued call. */
static void cuda_failed(tsr_kctx *kc, cudaError_t e, const char *what) {
    if (e == cudaSuccess || kc->err.code) return;
    tsr_err(&kc->err, e == cudaErrorMemoryAllocation ? TSR_ENOMEM : TSR_EIO, "cuda: %s: %s", what,
            cudaGetErrorString(e));
}
static void cublas_failed(tsr_kctx *kc, int rc, const char *what) {
    if (!rc || kc->err.code) return;
    tsr_err(&kc->err, TSR_EIO, "cuda: %s: cuBLAS refused the call", what);
}
#else
#define ON_DEVICE(kc) 0
#endif

/* The address the CPU kernel works on for p: p itself on the host; on the
 * guard kind the kernels' mapping of it. Memory that is not the context's
 * (a host buffer handed to a device kernel) stops the process, naming the
 * kernel: on a GPU it would be an illegal address found later, elsewhere. */
static void *view(const tsr_kctx *kc, const void *p, const char *kernel) {
    if (!p || kc->mem != TSR_MEM_GUARD) return (void *)(uintptr_t)p;
    void *v = tsr_guard_view(p);
    if (!v) {
        fprintf(stderr, "tessera: kernel %s was given memory at %p that is not the kernel context's (guard kind): "
                        "host memory where a device buffer belongs\n", kernel, p);
        abort();
    }
    return v;
}
#define KV(p) view(kc, (p), __func__)

int tsr_kctx_devices(tsr_mem_kind kind) {
#ifdef TSR_CUDA
    if (kind == TSR_MEM_CUDA) return tsr_cuda_devices();
#endif
    (void)kind;
    return 0;
}

int tsr_kctx_init(tsr_kctx *kc, tsr_mem_kind kind, int device, tsr_error *err) {
    memset(kc, 0, sizeof *kc);
    kc->mem = kind;
    kc->device = kind == TSR_MEM_CUDA ? device : 0;
    int rc = tsr_mem_usable(kind, err);
#ifdef TSR_CUDA
    if (!rc && kind == TSR_MEM_CUDA) {
        cudaError_t e = cudaSetDevice(device);
        if (e != cudaSuccess) return tsr_err(err, TSR_EINVAL, "cuda: device %d: %s", device, cudaGetErrorString(e));
        size_t most = (size_t)1 << 40, a = tsr_cuda_sum_scratch(most), b = tsr_cuda_sumsq_ranges_scratch(most);
        size_t n = (a > b ? a : b) * sizeof(double);
        if (!(kc->sum_scratch = tsr_mem_alloc(kind, n, err))) rc = err ? err->code : TSR_ENOMEM;
    }
#endif
    (void)device;
    kc->gemm = TSR_F32;
    return rc;
}

void tsr_kctx_free(tsr_kctx *kc) {
    if (kc->sum_scratch) tsr_mem_free(kc->mem, kc->sum_scratch);
    if (kc->scratch) tsr_mem_free(kc->mem, kc->scratch);
    kc->sum_scratch = NULL, kc->scratch = NULL, kc->scratch_cap = 0;
}

/* The context's scratch, at least `bytes` of it, or NULL with the failure kept
 * (the kernel that needed it is skipped). Grown only in a step's first calls:
 * on a GPU the old one is freed once the kernels queued on it are done. */
static void *scratch(tsr_kctx *kc, size_t bytes) {
    if (bytes <= kc->scratch_cap) return kc->scratch;
#ifdef TSR_CUDA
    if (ON_DEVICE(kc) && !kc->err.code) tsr_cuda_sync(kc->stream, &kc->err);
#endif
    if (kc->err.code) return NULL;
    if (kc->scratch) tsr_mem_free(kc->mem, kc->scratch);
    kc->scratch_cap = 0;
    if (!(kc->scratch = tsr_mem_alloc(kc->mem, bytes, &kc->err))) {
        tsr_err_prefix(&kc->err, "%zu bytes of scratch for the kernels", bytes);
        return NULL;
    }
    kc->scratch_cap = bytes;
    return kc->scratch;
}

int tsr_kctx_mem_used(const tsr_kctx *kc, size_t *used, size_t *total) {
#ifdef TSR_CUDA
    size_t fr = 0, all = 0;
    if (ON_DEVICE(kc) && cudaMemGetInfo(&fr, &all) == cudaSuccess) {
        *used = all - fr, *total = all;
        return 0;
    }
#endif
    (void)kc, (void)used, (void)total;
    return -1;
}

void *tsr_kc_alloc(tsr_kctx *kc, size_t bytes, tsr_error *err) { return tsr_mem_alloc(kc->mem, bytes, err); }
void tsr_kc_free(tsr_kctx *kc, void *p) { tsr_mem_free(kc->mem, p); }

int tsr_kc_check(tsr_kctx *kc, tsr_error *err) {
    int rc = kc->err.code;
    if (!rc) return 0;
    if (err) *err = kc->err;
    kc->err = (tsr_error){0};
    return rc;
}

int tsr_kc_sync(tsr_kctx *kc, tsr_error *err) {
#ifdef TSR_CUDA
    if (ON_DEVICE(kc) && !kc->err.code) tsr_cuda_sync(kc->stream, &kc->err);
#endif
    return tsr_kc_check(kc, err);
}

int tsr_kc_to_host(tsr_kctx *kc, void *dst, const void *src, size_t bytes, tsr_error *err) {
#ifdef TSR_CUDA
    if (ON_DEVICE(kc)) {
        cuda_failed(kc, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, STREAM(kc)), "copy to the host");
        return tsr_kc_sync(kc, err);
    }
#endif
    if (bytes) memcpy(dst, KV(src), bytes);
    return tsr_kc_check(kc, err);
}

int tsr_kc_from_host(tsr_kctx *kc, void *dst, const void *src, size_t bytes, tsr_error *err) {
#ifdef TSR_CUDA
    if (ON_DEVICE(kc)) {
        cuda_failed(kc, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, STREAM(kc)), "copy from the host");
        return tsr_kc_sync(kc, err); /* src is the caller's again */
    }
#endif
    if (bytes) memcpy(KV(dst), src, bytes);
    return tsr_kc_check(kc, err);
}

/* ---------------------------------------------------------------- buffers */

void tsr_kc_zero(tsr_kctx *kc, void *x, size_t bytes) {
#ifdef TSR_CUDA
    if (ON_DEVICE(kc)) {
        cuda_failed(kc, cudaMemsetAsync(x, 0, bytes, STREAM(kc)), "zero");
        return;
    }
#endif
    if (bytes) memset(KV(x), 0, bytes);
}

void tsr_kc_fill(tsr_kctx *kc, float *x, size_t n, float v) {
#ifdef TSR_CUDA
    if (ON_DEVICE(kc)) {
        tsr_cuda_fill(x, n, v, kc->stream);
        return;
    }
#endif
    tsr_k_fill(KV(x), n, v);
}

void tsr_kc_copy(tsr_kctx *kc, void *dst, const void *src, size_t bytes) {
#ifdef TSR_CUDA
    if (ON_DEVICE(kc)) {
        if (bytes) cuda_failed(kc, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, STREAM(kc)), "copy");
        return;
    }
#endif
    if (bytes) tsr_k_copy(KV(dst), KV(src), bytes);
}

void tsr_kc_copy2d(tsr_kctx *kc, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                   size_t rows) {
    if (!width || !rows) return;
#ifdef TSR_CUDA
    if (ON_DEVICE(kc)) {
        cuda_failed(kc, cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice, STREAM(kc)),
                    "2-d copy");
        return;
    }
#endif
    char *d = KV(dst);
    const char *s = KV(src);
    for (size_t i = 0; i < rows; i++) memcpy(d + i * dpitch, s + i * spitch, width);
}

void tsr_kc_add(tsr_kctx *kc, float *out, const float *a, const float *b, size_t n) {
#ifdef TSR_CUDA
    if (ON_DEVICE(kc)) {
        tsr_cuda_add(out, a, b, n, kc->stream);
        return;
    }
#endif
    tsr_k_add(KV(out), KV(a), KV(b), n);
}

void tsr_kc_f32_to_bf16(tsr_kctx *kc, uint16_t *out, const float *in, size_t n) {
#ifdef TSR_CUDA
    if (ON_DEVICE(kc)) {
        tsr_cuda_f32_to_bf16(out, in, n, kc->stream);
        return;
    }
#endif
    uint16_t *o = KV(out);
    const float *x = KV(in);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) o[i] = tsr_f32_to_bf16(x[i]);
}

/* ---------------------------------------------------------------- layers */

void tsr_kc_embed_fwd(tsr_kctx *kc, float *out, const int *tokens, const float *wte, int N, int C, int V) {
#ifdef TSR_CUDA
    if (ON_DEVICE(kc)) {
        tsr_cuda_embed_fwd(out, tokens, wte, N, C, V, kc->stream);
        return;
    }
#endif
    tsr_embed_fwd(KV(out), KV(tokens), KV(wte), N, C, V);
}

void tsr_kc_embed_bwd(tsr_kctx *kc, float *dwte, const float *dout, const int *tokens, int N, int C, int V) {
#ifdef TSR_CUDA
    if (ON_DEVICE(kc)) {
        tsr_cuda_embed_bwd(dwte, dout, tokens, N, C, V, kc->stream);
        return;
    }
#endif
    tsr_embed_bwd(KV(dwte), KV(dout), KV(tokens), N, C, V);
}

void tsr_kc_rmsnorm_fwd(tsr_kctx *kc, float *out, float *rstd, const float *inp, const float *w, int N, int C,
                        float eps) {
#ifdef TSR_CUDA
    if (ON_DEVICE(kc)) {
        tsr_cuda_rmsnorm_fwd(out, rstd, inp, w, N, C, eps, kc->stream);
        return;
    }
#endif
    tsr_rmsnorm_fwd(KV(out), KV(rstd), KV(inp), KV(w), N, C, eps);
}

void tsr_kc_rmsnorm_bwd(tsr_kctx *kc, float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                        const float *rstd, int N, int C) {
#ifdef TSR_CUDA
    if (ON_DEVICE(kc)) {
        tsr_cuda_rmsnorm_bwd(dinp, dw, dout, inp, w, rstd, N, C, kc->stream);
        return;
    }
#endif
    tsr_rmsnorm_bwd(KV(dinp), KV(dw), KV(dout), KV(inp), KV(w), KV(rstd), N, C);
}

/* Mixed precision on the CPU: the operands rounded to bf16 in scratch (still
 * f32, so that sgemm multiplies exactly the values a GPU's bf16 tensor cores
 * would), in the order of `mixed_rows`: n[i] floats from src[i], NULL skipped.
 * @return the rounded copies (NULL where src was), or 0 when scratch failed. */
static int mixed_round(tsr_kctx *kc, int k, const float *const *src, const size_t *n, float **out) {
    size_t total = 0;
    for (int i = 0; i < k; i++) total += src[i] ? n[i] : 0;
    float *s = scratch(kc, (total ? total : 1) * sizeof(float));
    if (!s) return 0;
    s = KV(s);
    for (int i = 0; i < k; i++) {
        out[i] = NULL;
        if (!src[i]) continue;
        tsr_bf16_round(s, KV(src[i]), n[i]);
        out[i] = s;
        s += n[i];
    }
    return 1;
}

void tsr_kc_matmul_fwd(tsr_kctx *kc, float *out, const float *inp, const float *w, int N, int C, int OC) {
#ifdef TSR_CUDA
    if (ON_DEVICE(kc)) {
        if (kc->gemm == TSR_BF16) {
            uint16_t *s = scratch(kc, tsr_cuda_matmul_mixed_scratch(N, C, OC) * sizeof(uint16_t));
            if (s) cublas_failed(kc, tsr_cuda_matmul_mixed_fwd(out, inp, w, N, C, OC, s, kc->stream), "bf16 matmul forward");
            return;
        }
        cublas_failed(kc, tsr_cuda_matmul_fwd(out, inp, w, N, C, OC, kc->stream), "matmul forward");
        return;
    }
#endif
    if (kc->gemm == TSR_BF16) {
        const float *src[2] = {inp, w};
        size_t n[2] = {(size_t)N * C, (size_t)OC * C};
        float *r[2];
        if (mixed_round(kc, 2, src, n, r)) tsr_matmul_fwd(KV(out), r[0], r[1], N, C, OC);
        return;
    }
    tsr_matmul_fwd(KV(out), KV(inp), KV(w), N, C, OC);
}

void tsr_kc_matmul_bwd(tsr_kctx *kc, float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                       int N, int C, int OC) {
#ifdef TSR_CUDA
    if (ON_DEVICE(kc)) {
        if (kc->gemm == TSR_BF16) {
            uint16_t *s = scratch(kc, tsr_cuda_matmul_mixed_scratch(N, C, OC) * sizeof(uint16_t));
            if (s)
                cublas_failed(kc, tsr_cuda_matmul_mixed_bwd(dinp, dw, dout, inp, w, N, C, OC, s, kc->stream),
                              "bf16 matmul backward");
            return;
        }
        cublas_failed(kc, tsr_cuda_matmul_bwd(dinp, dw, dout, inp, w, N, C, OC, kc->stream), "matmul backward");
        return;
    }
#endif
    if (kc->gemm == TSR_BF16) {
        /* dinp needs dout and w, dw needs dout and inp */
        const float *src[3] = {dout, dinp ? w : NULL, dw ? inp : NULL};
        size_t n[3] = {(size_t)N * OC, (size_t)OC * C, (size_t)N * C};
        float *r[3];
        if (mixed_round(kc, 3, src, n, r)) tsr_matmul_bwd(KV(dinp), KV(dw), r[0], r[2], r[1], N, C, OC);
        return;
    }
    tsr_matmul_bwd(KV(dinp), KV(dw), KV(dout), KV(inp), KV(w), N, C, OC);
}

void tsr_kc_rope_fwd(tsr_kctx *kc, float *x, const float *cos_t, const float *sin_t, int B, int T, int H, int hd) {
#ifdef TSR_CUDA
    if (ON_DEVICE(kc)) {
        tsr_cuda_rope_fwd(x, cos_t, sin_t, B, T, H, hd, kc->stream);
        return;
    }
#endif
    tsr_rope_fwd(KV(x), KV(cos_t), KV(sin_t), B, T, H, hd);
}

void tsr_kc_rope_bwd(tsr_kctx *kc, float *dx, const float *cos_t, const float *sin_t, int B, int T, int H, int hd) {
#ifdef TSR_CUDA
    if (ON_DEVICE(kc)) {
        tsr_cuda_rope_bwd(dx, cos_t, sin_t, B, T, H, hd, kc->stream);
        return;
    }
#endif
    tsr_rope_bwd(KV(dx), KV(cos_t), KV(sin_t), B, T, H, hd);
}

void tsr_kc_attention_fwd(tsr_kctx *kc, float *out, float *att, const float *q, const float *k, const float *v, int B,
                          int T, int NH, int NKV, int hd) {
#ifdef TSR_CUDA
    if (ON_DEVICE(kc)) {
        if (kc->gemm == TSR_BF16) {
            void *s = scratch(kc, tsr_cuda_attention_tc_scratch(B, T, NH, NKV, hd));
            if (s) tsr_cuda_attention_tc_fwd(out, att, q, k, v, B, T, NH, NKV, hd, s, kc->stream);
            return;
        }
        tsr_cuda_attention_fwd(out, att, q, k, v, B, T, NH, NKV, hd, kc->stream);
        return;
    }
#endif
    tsr_attention_fwd(KV(out), KV(att), KV(q), KV(k), KV(v), B, T, NH, NKV, hd);
}

void tsr_kc_attention_bwd(tsr_kctx *kc, float *dq, float *dk, float *dv, float *att_scratch, const float *dout,
                          const float *q, const float *k, const float *v, const float *att, int B, int T, int NH,
                          int NKV, int hd) {
#ifdef TSR_CUDA
    if (ON_DEVICE(kc)) {
        if (kc->gemm == TSR_BF16) {
            void *s = scratch(kc, tsr_cuda_attention_tc_scratch(B, T, NH, NKV, hd));
            if (s) tsr_cuda_attention_tc_bwd(dq, dk, dv, att_scratch, dout, q, k, v, att, B, T, NH, NKV, hd, s, kc->stream);
            return;
        }
        tsr_cuda_attention_bwd(dq, dk, dv, att_scratch, dout, q, k, v, att, B, T, NH, NKV, hd, kc->stream);
        return;
    }
#endif
    tsr_attention_bwd(KV(dq), KV(dk), KV(dv), KV(att_scratch), KV(dout), KV(q), KV(k), KV(v), KV(att), B, T, NH, NKV, hd);
}

void tsr_kc_swiglu_fwd(tsr_kctx *kc, float *out, const float *gate, const float *up, size_t n) {
#ifdef TSR_CUDA
    if (ON_DEVICE(kc)) {
        tsr_cuda_swiglu_fwd(out, gate, up, n, kc->stream);
        return;
    }
#endif
    tsr_swiglu_fwd(KV(out), KV(gate), KV(up), n);
}

void tsr_kc_swiglu_bwd(tsr_kctx *kc, float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                       size_t n) {
#ifdef TSR_CUDA
    if (ON_DEVICE(kc)) {
        tsr_cuda_swiglu_bwd(dgate, dup, dout, gate, up, n, kc->stream);
        return;
    }
#endif
    tsr_swiglu_bwd(KV(dgate), KV(dup), KV(dout), KV(gate), KV(up), n);
}

/* ------------------------------------------------------------------ loss */

void tsr_kc_xent_fwd(tsr_kctx *kc, float *losses, float *probs, const float *logits, const int *targets, int N, int V) {
#ifdef TSR_CUDA
    if (ON_DEVICE(kc)) {
        tsr_cuda_xent_fwd(losses, probs, logits, targets, N, V, kc->stream);
        return;
    }
#endif
    tsr_xent_fwd(KV(losses), KV(probs), KV(logits), KV(targets), N, V);
}

void tsr_kc_xent_part_stats(tsr_kctx *kc, float *stats, const float *logits, int N, int Vt) {
#ifdef TSR_CUDA
    if (ON_DEVICE(kc)) {
        tsr_cuda_xent_part_stats(stats, logits, N, Vt, kc->stream);
        return;
    }
#endif
    tsr_xent_part_stats(KV(stats), KV(logits), N, Vt);
}

void tsr_kc_xent_part_fwd(tsr_kctx *kc, float *losses, float *probs, const float *logits, const int *targets, int N,
                          int Vt, int v0, const float *stats, int parts) {
#ifdef TSR_CUDA
    if (ON_DEVICE(kc)) {
        tsr_cuda_xent_part_fwd(losses, probs, logits, targets, N, Vt, v0, stats, parts, kc->stream);
        return;
    }
#endif
    tsr_xent_part_fwd(KV(losses), KV(probs), KV(logits), KV(targets), N, Vt, v0, KV(stats), parts);
}

void tsr_kc_xent_part_bwd(tsr_kctx *kc, float *dlogits, const float *probs, const int *targets, const float *dloss,
                          int N, int Vt, int v0, int V) {
#ifdef TSR_CUDA
    if (ON_DEVICE(kc)) {
        tsr_cuda_xent_part_bwd(dlogits, probs, targets, dloss, N, Vt, v0, V, kc->stream);
        return;
    }
#endif
    tsr_xent_part_bwd(KV(dlogits), KV(probs), KV(targets), KV(dloss), N, Vt, v0, V);
}

void tsr_kc_sum_add(tsr_kctx *kc, double *acc, const float *x, size_t n) {
#ifdef TSR_CUDA
    if (ON_DEVICE(kc)) {
        tsr_cuda_sum_add(acc, x, n, kc->sum_scratch, kc->stream);
        return;
    }
#endif
    if (n) *(double *)KV(acc) += tsr_xent_sum(KV(x), (int)n);
}

void tsr_kc_sumsq_add(tsr_kctx *kc, double *acc, const float *x, size_t n) {
#ifdef TSR_CUDA
    if (ON_DEVICE(kc)) {
        tsr_cuda_sumsq_add(acc, x, n, kc->sum_scratch, kc->stream);
        return;
    }
#endif
    if (n) *(double *)KV(acc) += tsr_sumsq(KV(x), n);
}

void tsr_kc_sumsq_ranges(tsr_kctx *kc, double *acc, const float *base, const uint64_t *ranges, int count,
                         size_t total) {
    if (count <= 0) return;
#ifdef TSR_CUDA
    if (ON_DEVICE(kc)) {
        tsr_cuda_sumsq_ranges(acc, base, ranges, count, total, kc->sum_scratch, kc->stream);
        return;
    }
#endif
    (void)total;
    const uint64_t *r = KV(ranges);
    const float *b = KV(base);
    double *a = KV(acc);
    for (int i = 0; i < count; i++)
        if (r[2 * i + 1]) *a += tsr_sumsq(b + r[2 * i], (size_t)r[2 * i + 1]);
}

void tsr_kc_hash_add(tsr_kctx *kc, uint64_t *acc, const void *x, size_t n, uint64_t index0) {
    if (!n) return;
#ifdef TSR_CUDA
    if (ON_DEVICE(kc)) {
        tsr_cuda_hash_sum_add(acc, x, n, index0, kc->stream);
        return;
    }
#endif
    *(uint64_t *)KV(acc) += tsr_hash_sum(KV(x), n, index0);
}

void tsr_kc_adamw(tsr_kctx *kc, float *p, const float *g, float gscale, float *m, float *v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, long t) {
#ifdef TSR_CUDA
    if (ON_DEVICE(kc)) {
        tsr_cuda_adamw(p, g, gscale, m, v, n, lr, beta1, beta2, eps, weight_decay, t, kc->stream);
        return;
    }
#endif
    tsr_adamw(KV(p), KV(g), gscale, KV(m), KV(v), n, lr, beta1, beta2, eps, weight_decay, t);
}
