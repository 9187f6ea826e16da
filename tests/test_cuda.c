/* test_cuda.c: each CUDA kernel against its CPU twin, the oracle, on random
 * inputs at several shapes (odd sizes included): exactly where the CPU kernel
 * fixes the order of its sums or does one rounding per element (fill, add, bf16
 * casts, AdamW, the embedding and its weight gradient, RMSNorm's weight
 * gradient), within a relative 1e-5 elsewhere (RMSNorm, the sum of squares, the
 * cross-entropy, whole and vocabulary-parallel, the device sums), within 1e-12
 * for the sum of squares over ranges, within f32 summation order of the CPU on
 * bf16-rounded operands for the mixed-precision matmul, and within bf16's
 * rounding for the tensor-core attention; device memory through the allocator
 * and staging's copy; the data plane on a stream (NCCL) over a group of one.
 * Skipped (exit 77) in a build without CUDA or on a machine without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common.h"

#ifndef TSR_CUDA
int main(void) { SKIP("built without CUDA (make CUDA=1 builds the kernels; this machine's GPU runs them)"); }
#else
#include <cuda_runtime.h>

#include <unistd.h>

#include "buffers.h"
#include "tsr_ckpt.h"
#include "data_plane.h"
#include "casts.h"
#include "activation.h"
#include "attention.h"
#include "embed.h"
#include "hash.h"
#include "loss.h"
#include "matmul.h"
#include "mem.h"
#include "norm.h"
#include "optim.h"
#include "rope.h"
#include "tsr_cuda.h"

static uint64_t rng = 12345;
static float frand(void) { return (float)((tsr_splitmix_next(&rng) >> 40) / (double)(1 << 24)) * 2.0f - 1.0f; }

/* A device copy of n host bytes. */
static void *dev(const void *host, size_t n) {
    tsr_error e = {0};
    void *d = tsr_mem_alloc(TSR_MEM_CUDA, n, &e);
    REQUIRE(d, "device allocation: %s", e.msg);
    REQUIRE(cudaMemcpy(d, host, n, cudaMemcpyHostToDevice) == cudaSuccess, "copy to the device");
    return d;
}
/* Device memory left as it is (a kernel's scratch): n bytes, at least 1. */
static void *dev_scratch(size_t n) {
    tsr_error e = {0};
    void *d = tsr_mem_alloc(TSR_MEM_CUDA, n ? n : 1, &e);
    REQUIRE(d, "device allocation of %zu bytes: %s", n, e.msg);
    return d;
}
static void back(void *host, const void *d, size_t n) {
    tsr_error e = {0};
    REQUIRE(tsr_cuda_sync(NULL, &e) == 0, "%s", e.msg);
    REQUIRE(tsr_mem_to_host(host, d, n, TSR_MEM_CUDA, &e) == 0, "copy from the device: %s", e.msg);
}
static float *randv(size_t n) {
    float *x = malloc(n * sizeof *x + 4);
    REQUIRE(x, "out of memory");
    for (size_t i = 0; i < n; i++) x[i] = frand();
    return x;
}
/* The largest relative difference of a against the oracle b (absolute below 1). */
static double rel(const float *a, const float *b, size_t n) {
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / fmax(1.0, fabs((double)b[i]));
        if (d > w || isnan(d)) w = isnan(d) ? INFINITY : d;
    }
    return w;
}

/* ||a - b|| / ||b||: the measure for sums of many products, whose elements may
 * cancel to near zero while their terms are large (f32 lands far under 1e-5). */
static double nrel(const float *a, const float *b, size_t n) {
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), r += (double)b[i] * b[i];
    return isnan(d) ? INFINITY : sqrt(d / (r > 0 ? r : 1));
}

static void test_elementwise(size_t n) {
    float *a = randv(n), *b = randv(n), *ref = malloc(n * 4 + 4), *got = malloc(n * 4 + 4);
    uint16_t *h16 = malloc(n * 2 + 2), *g16 = malloc(n * 2 + 2);
    a[0] = NAN;
    float *da = dev(a, n * 4), *db = dev(b, n * 4), *dout = dev(a, n * 4);
    tsr_k_add(ref, a, b, n);
    tsr_cuda_add(dout, da, db, n, NULL);
    back(got, dout, n * 4);
    CHECK(memcmp(ref + 1, got + 1, (n - 1) * 4) == 0, "add of %zu elements: not the CPU's", n);
    tsr_cuda_fill(dout, n, 0.375f, NULL);
    back(got, dout, n * 4);
    tsr_k_fill(ref, n, 0.375f);
    CHECK(memcmp(ref, got, n * 4) == 0, "fill of %zu elements", n);
    uint16_t *d16 = dev(h16, n * 2);
    tsr_cuda_f32_to_bf16(d16, da, n, NULL);
    back(g16, d16, n * 2);
    for (size_t i = 0; i < n; i++) h16[i] = tsr_f32_to_bf16(a[i]);
    CHECK(memcmp(h16, g16, n * 2) == 0, "f32 to bf16 of %zu elements (NaN included)", n);
    tsr_cuda_bf16_to_f32(dout, d16, n, NULL);
    back(got, dout, n * 4);
    for (size_t i = 0; i < n; i++) ref[i] = tsr_bf16_to_f32(h16[i]);
    CHECK(memcmp(ref + 1, got + 1, (n - 1) * 4) == 0 && isnan(got[0]), "bf16 to f32 of %zu elements", n);
    tsr_mem_free(TSR_MEM_CUDA, da), tsr_mem_free(TSR_MEM_CUDA, db), tsr_mem_free(TSR_MEM_CUDA, dout);
    tsr_mem_free(TSR_MEM_CUDA, d16);
    free(a), free(b), free(ref), free(got), free(h16), free(g16);
}

static void test_adamw(size_t n) {
    float *p = randv(n), *g = randv(n), *m = randv(n), *v = randv(n);
    for (size_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
    float *dp = dev(p, n * 4), *dg = dev(g, n * 4), *dm = dev(m, n * 4), *dv = dev(v, n * 4);
    float *gp = malloc(n * 4), *gm = malloc(n * 4), *gv = malloc(n * 4);
    for (long t = 1; t <= 3; t++) {
        tsr_adamw(p, g, 0.875f, m, v, n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
        tsr_cuda_adamw(dp, dg, 0.875f, dm, dv, n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t, NULL);
    }
    back(gp, dp, n * 4), back(gm, dm, n * 4), back(gv, dv, n * 4);
    CHECK(!memcmp(gp, p, n * 4) && !memcmp(gm, m, n * 4) && !memcmp(gv, v, n * 4),
          "AdamW on %zu parameters, 3 steps: not the CPU's bits (worst %.3g)", n, rel(gp, p, n));
    tsr_mem_free(TSR_MEM_CUDA, dp), tsr_mem_free(TSR_MEM_CUDA, dg);
    tsr_mem_free(TSR_MEM_CUDA, dm), tsr_mem_free(TSR_MEM_CUDA, dv);
    free(p), free(g), free(m), free(v), free(gp), free(gm), free(gv);
}

static void test_embed(int N, int C, int V) {
    int *tok = malloc((size_t)N * sizeof *tok);
    for (int i = 0; i < N; i++) tok[i] = (int)(tsr_splitmix_next(&rng) % (uint64_t)(V + 1)) - (i == 3); /* -1 and V too */
    float *wte = randv((size_t)V * C), *dout = randv((size_t)N * C), *dw = randv((size_t)V * C); /* added to */
    float *ref = malloc((size_t)N * C * 4), *got = malloc((size_t)(N > V ? N : V) * C * 4);
    int *dtok = dev(tok, (size_t)N * sizeof *tok);
    float *dwte = dev(wte, (size_t)V * C * 4), *dy = dev(dout, (size_t)N * C * 4);
    float *dx = dev(ref, (size_t)N * C * 4), *ddw = dev(dw, (size_t)V * C * 4);
    tsr_embed_fwd(ref, tok, wte, N, C, V);
    tsr_cuda_embed_fwd(dx, dtok, dwte, N, C, V, NULL);
    back(got, dx, (size_t)N * C * 4);
    CHECK(!memcmp(ref, got, (size_t)N * C * 4), "embedding forward N=%d C=%d V=%d", N, C, V);
    tsr_embed_bwd(dw, dout, tok, N, C, V);
    tsr_cuda_embed_bwd(ddw, dy, dtok, N, C, V, NULL);
    back(got, ddw, (size_t)V * C * 4);
    CHECK(!memcmp(dw, got, (size_t)V * C * 4), "embedding backward N=%d C=%d V=%d: not the CPU's sums (worst %.3g)", N,
          C, V, rel(got, dw, (size_t)V * C));
    tsr_mem_free(TSR_MEM_CUDA, dtok), tsr_mem_free(TSR_MEM_CUDA, dwte), tsr_mem_free(TSR_MEM_CUDA, dy);
    tsr_mem_free(TSR_MEM_CUDA, dx), tsr_mem_free(TSR_MEM_CUDA, ddw);
    free(tok), free(wte), free(dout), free(dw), free(ref), free(got);
}

static void test_rmsnorm(int N, int C) {
    size_t nc = (size_t)N * C;
    float *x = randv(nc), *w = randv((size_t)C), *dy = randv(nc);
    float *y = malloc(nc * 4), *r = malloc((size_t)N * 4), *dx = calloc(nc, 4), *dw = randv((size_t)C); /* added to */
    float *gy = malloc(nc * 4), *gr = malloc((size_t)N * 4), *gdx = malloc(nc * 4), *gdw = malloc((size_t)C * 4);
    float *d_x = dev(x, nc * 4), *d_w = dev(w, (size_t)C * 4), *d_dy = dev(dy, nc * 4);
    float *d_y = dev(y, nc * 4), *d_r = dev(r, (size_t)N * 4), *d_dx = dev(dx, nc * 4), *d_dw = dev(dw, (size_t)C * 4);
    tsr_rmsnorm_fwd(y, r, x, w, N, C, 1e-5f);
    tsr_cuda_rmsnorm_fwd(d_y, d_r, d_x, d_w, N, C, 1e-5f, NULL);
    back(gy, d_y, nc * 4), back(gr, d_r, (size_t)N * 4);
    CHECK(rel(gy, y, nc) < 1e-5 && rel(gr, r, (size_t)N) < 1e-5, "RMSNorm forward N=%d C=%d: %.3g", N, C, rel(gy, y, nc));
    tsr_rmsnorm_bwd(dx, dw, dy, x, w, r, N, C);
    tsr_cuda_rmsnorm_bwd(d_dx, d_dw, d_dy, d_x, d_w, d_r, N, C, NULL);
    back(gdx, d_dx, nc * 4), back(gdw, d_dw, (size_t)C * 4);
    CHECK(rel(gdx, dx, nc) < 1e-5, "RMSNorm backward N=%d C=%d: dx %.3g", N, C, rel(gdx, dx, nc));
    CHECK(!memcmp(gdw, dw, (size_t)C * 4), "RMSNorm backward N=%d C=%d: dw not the CPU's sums (worst %.3g)", N, C,
          rel(gdw, dw, (size_t)C));
    double s = tsr_sumsq(x, nc), gs = -1, gs2 = -2;
    tsr_error e = {0};
    CHECK(tsr_cuda_sumsq(d_x, nc, &gs, NULL, &e) == 0, "sum of squares: %s", e.msg);
    CHECK(fabs(gs - s) <= 1e-9 * s, "sum of squares of %zu: %.17g, the CPU %.17g", nc, gs, s);
    CHECK(tsr_cuda_sumsq(d_x, nc, &gs2, NULL, &e) == 0 && gs2 == gs, "sum of squares: not the same bits twice");
    float *ptrs[] = {d_x, d_w, d_dy, d_y, d_r, d_dx, d_dw};
    for (size_t i = 0; i < sizeof ptrs / sizeof *ptrs; i++) tsr_mem_free(TSR_MEM_CUDA, ptrs[i]);
    free(x), free(w), free(dy), free(y), free(r), free(dx), free(dw), free(gy), free(gr), free(gdx), free(gdw);
}

/* RoPE with Llama 3.1 scaling, SwiGLU, cross-entropy (with ignored targets),
 * the linear layer: within 1e-5 (the products by the norm of their difference). */
static void test_layers(int B, int T, int H, int hd, int V) {
    size_t nx = (size_t)B * T * H * hd, half = (size_t)T * (hd / 2);
    /* got holds any one result: the activations, the logits or the output
     * layer's weight gradient (V x C, larger than the activations when V > B*T) */
    size_t ngot = nx > (size_t)V * H * hd ? nx : (size_t)V * H * hd;
    if ((size_t)B * T * V > ngot) ngot = (size_t)B * T * V;
    float *x = randv(nx), *cs = malloc(half * 4), *sn = malloc(half * 4), *got = malloc(ngot * 4);
    tsr_rope_scaling sc = tsr_rope_llama3_scaling();
    tsr_rope_tables(cs, sn, T, hd, 500000.0f, &sc);
    float *dxp = dev(x, nx * 4), *dcs = dev(cs, half * 4), *dsn = dev(sn, half * 4);
    tsr_rope_fwd(x, cs, sn, B, T, H, hd);
    tsr_cuda_rope_fwd(dxp, dcs, dsn, B, T, H, hd, NULL);
    back(got, dxp, nx * 4);
    CHECK(rel(got, x, nx) < 1e-5, "RoPE forward B=%d T=%d H=%d hd=%d: %.3g", B, T, H, hd, rel(got, x, nx));
    tsr_rope_bwd(x, cs, sn, B, T, H, hd);
    tsr_cuda_rope_bwd(dxp, dcs, dsn, B, T, H, hd, NULL);
    back(got, dxp, nx * 4);
    CHECK(rel(got, x, nx) < 1e-5, "RoPE backward: %.3g", rel(got, x, nx));
    float *up = randv(nx), *dg = calloc(nx, 4), *du = calloc(nx, 4), *out = malloc(nx * 4);
    float *dup_ = dev(up, nx * 4), *ddg = dev(dg, nx * 4), *ddu = dev(du, nx * 4), *dout = dev(out, nx * 4);
    tsr_swiglu_fwd(out, x, up, nx);
    tsr_cuda_swiglu_fwd(dout, dxp, dup_, nx, NULL);
    back(got, dout, nx * 4);
    CHECK(rel(got, out, nx) < 1e-5, "SwiGLU forward of %zu: %.3g", nx, rel(got, out, nx));
    tsr_swiglu_bwd(dg, du, up, x, out, nx);
    tsr_cuda_swiglu_bwd(ddg, ddu, dup_, dxp, dout, nx, NULL);
    back(got, ddg, nx * 4);
    CHECK(rel(got, dg, nx) < 1e-5, "SwiGLU backward (gate): %.3g", rel(got, dg, nx));
    back(got, ddu, nx * 4);
    CHECK(rel(got, du, nx) < 1e-5, "SwiGLU backward (up): %.3g", rel(got, du, nx));
    int N = B * T;
    size_t nl = (size_t)N * V;
    float *lg = randv(nl), *pr = malloc(nl * 4), *ls = malloc((size_t)N * 4), *dl = calloc(nl, 4), *dloss = randv((size_t)N);
    int *tg = malloc((size_t)N * sizeof *tg);
    for (int i = 0; i < N; i++) tg[i] = i % 5 == 4 ? -1 : (int)(tsr_splitmix_next(&rng) % (uint64_t)V);
    float *dlg = dev(lg, nl * 4), *dpr = dev(pr, nl * 4), *dls = dev(ls, (size_t)N * 4), *ddl = dev(dl, nl * 4);
    float *ddloss = dev(dloss, (size_t)N * 4);
    int *dtg = dev(tg, (size_t)N * sizeof *tg);
    tsr_xent_fwd(ls, pr, lg, tg, N, V);
    tsr_cuda_xent_fwd(dls, dpr, dlg, dtg, N, V, NULL);
    back(got, dls, (size_t)N * 4);
    CHECK(rel(got, ls, (size_t)N) < 1e-5, "cross-entropy losses N=%d V=%d: %.3g", N, V, rel(got, ls, (size_t)N));
    tsr_xent_bwd(dl, pr, tg, dloss, N, V);
    tsr_cuda_xent_bwd(ddl, dpr, dtg, ddloss, N, V, NULL);
    back(got, ddl, nl * 4);
    CHECK(rel(got, dl, nl) < 1e-5, "cross-entropy backward: %.3g", rel(got, dl, nl));
    int C = H * hd, OC = V;
    float *w = randv((size_t)OC * C), *mo = malloc((size_t)N * OC * 4), *di = calloc(nx, 4), *dw = calloc((size_t)OC * C, 4);
    float *dw_ = dev(w, (size_t)OC * C * 4), *dmo = dev(mo, (size_t)N * OC * 4), *ddi = dev(di, nx * 4);
    float *ddw = dev(dw, (size_t)OC * C * 4);
    tsr_matmul_fwd(mo, x, w, N, C, OC);
    CHECK(tsr_cuda_matmul_fwd(dmo, dxp, dw_, N, C, OC, NULL) == 0, "cuBLAS forward refused");
    back(got, dmo, (size_t)N * OC * 4);
    CHECK(nrel(got, mo, (size_t)N * OC) < 1e-5, "matmul forward N=%d C=%d OC=%d: %.3g", N, C, OC, nrel(got, mo, (size_t)N * OC));
    tsr_matmul_bwd(di, dw, mo, x, w, N, C, OC);
    CHECK(tsr_cuda_matmul_bwd(ddi, ddw, dmo, dxp, dw_, N, C, OC, NULL) == 0, "cuBLAS backward refused");
    back(got, ddi, nx * 4);
    CHECK(nrel(got, di, nx) < 1e-5, "matmul backward (input): %.3g", nrel(got, di, nx));
    back(got, ddw, (size_t)OC * C * 4);
    CHECK(nrel(got, dw, (size_t)OC * C) < 1e-5, "matmul backward (weight): %.3g", nrel(got, dw, (size_t)OC * C));
    float *dptr[] = {dxp, dcs, dsn, dup_, ddg, ddu, dout, dlg, dpr, dls, ddl, ddloss, dw_, dmo, ddi, ddw};
    for (size_t i = 0; i < sizeof dptr / sizeof *dptr; i++) tsr_mem_free(TSR_MEM_CUDA, dptr[i]);
    tsr_mem_free(TSR_MEM_CUDA, dtg);
    free(x), free(cs), free(sn), free(got), free(up), free(dg), free(du), free(out), free(lg), free(pr), free(ls);
    free(dl), free(dloss), free(tg), free(w), free(mo), free(di), free(dw);
}

/* Vocabulary-parallel cross-entropy over `parts` parts of widths[r] columns (0:
 * an empty part), with targets ignored below 0 and at V: each part's stats, then
 * the forward from every part's device stats (in place on the even parts, probs
 * aliasing logits) and the backward (adding to a gradient), within 1e-5 of the
 * CPU's; an empty part's stats exactly -inf and 0. */
static void test_xent_part(int N, const int *widths, int parts) {
    int V = 0;
    for (int r = 0; r < parts; r++) V += widths[r];
    int *tg = malloc((size_t)N * sizeof *tg);
    for (int i = 0; i < N; i++) tg[i] = i % 5 == 4 ? -1 : i % 7 == 5 ? V : (int)(tsr_splitmix_next(&rng) % (uint64_t)V);
    float *st = malloc((size_t)parts * 2 * N * 4), *gst = malloc((size_t)parts * 2 * N * 4);
    float *dloss = randv((size_t)N), *ls = malloc((size_t)N * 4), *gls = malloc((size_t)N * 4);
    int *dtg = dev(tg, (size_t)N * sizeof *tg);
    float *dst = dev(st, (size_t)parts * 2 * N * 4), *ddloss = dev(dloss, (size_t)N * 4), *dls = dev(ls, (size_t)N * 4);
    float *lg[8], *pr[8], *dl[8], *dlg[8], *dpr[8], *ddl[8];
    REQUIRE(parts <= 8, "at most 8 parts");
    for (int r = 0; r < parts; r++) {
        size_t nl = (size_t)N * widths[r];
        lg[r] = randv(nl), dl[r] = randv(nl);
        for (size_t k = 0; k < nl; k++) lg[r][k] *= 8.0f; /* logits far apart: the max matters */
        pr[r] = r % 2 ? malloc(nl * 4 + 4) : lg[r];
        dlg[r] = dev(lg[r], nl * 4), ddl[r] = dev(dl[r], nl * 4);
        dpr[r] = r % 2 ? dev(lg[r], nl * 4) : dlg[r];
        tsr_xent_part_stats(st + (size_t)r * 2 * N, lg[r], N, widths[r]);
        tsr_cuda_xent_part_stats(dst + (size_t)r * 2 * N, dlg[r], N, widths[r], NULL);
    }
    back(gst, dst, (size_t)parts * 2 * N * 4);
    for (int r = 0; r < parts; r++) {
        const float *a = gst + (size_t)r * 2 * N, *b = st + (size_t)r * 2 * N;
        int empty_ok = 1;
        for (int i = 0; i < N && !widths[r]; i++) empty_ok &= a[2 * i] == -INFINITY && a[2 * i + 1] == 0.0f;
        double w = widths[r] ? rel(a, b, (size_t)2 * N) : 0.0;
        CHECK(widths[r] ? w < 1e-5 : empty_ok, "vocabulary-parallel stats N=%d, part %d of %d (%d columns): %.3g%s", N,
              r, parts, widths[r], w, empty_ok ? "" : " (an empty part's are not -inf and 0)");
    }
    float *got = malloc(((size_t)N * V + 1) * 4);
    for (int r = 0, v0 = 0; r < parts; v0 += widths[r], r++) {
        size_t nl = (size_t)N * widths[r];
        tsr_xent_part_fwd(ls, pr[r], lg[r], tg, N, widths[r], v0, st, parts);
        tsr_cuda_xent_part_fwd(dls, dpr[r], dlg[r], dtg, N, widths[r], v0, dst, parts, NULL);
        back(gls, dls, (size_t)N * 4);
        CHECK(rel(gls, ls, (size_t)N) < 1e-5, "vocabulary-parallel losses N=%d V=%d, part %d at %d (%d columns%s): "
              "%.3g", N, V, r, v0, widths[r], r % 2 ? "" : ", in place", rel(gls, ls, (size_t)N));
        if (nl) back(got, dpr[r], nl * 4);
        CHECK(rel(got, pr[r], nl) < 1e-5, "vocabulary-parallel probabilities, part %d: %.3g", r, rel(got, pr[r], nl));
        tsr_xent_part_bwd(dl[r], pr[r], tg, dloss, N, widths[r], v0, V);
        tsr_cuda_xent_part_bwd(ddl[r], dpr[r], dtg, ddloss, N, widths[r], v0, V, NULL);
        if (nl) back(got, ddl[r], nl * 4);
        CHECK(rel(got, dl[r], nl) < 1e-5, "vocabulary-parallel backward, part %d: %.3g", r, rel(got, dl[r], nl));
    }
    for (int r = 0; r < parts; r++) {
        if (r % 2) free(pr[r]), tsr_mem_free(TSR_MEM_CUDA, dpr[r]);
        free(lg[r]), free(dl[r]);
        tsr_mem_free(TSR_MEM_CUDA, dlg[r]), tsr_mem_free(TSR_MEM_CUDA, ddl[r]);
    }
    tsr_mem_free(TSR_MEM_CUDA, dtg), tsr_mem_free(TSR_MEM_CUDA, dst), tsr_mem_free(TSR_MEM_CUDA, ddloss);
    tsr_mem_free(TSR_MEM_CUDA, dls);
    free(tg), free(st), free(gst), free(dloss), free(ls), free(gls), free(got);
}

/* The device accumulators over n elements: the sum within 1e-5 of
 * tsr_xent_sum's, the sum of squares tsr_cuda_sumsq's double; a second call adds
 * the same double again; n == 0 adds nothing; the scratch for n within the
 * scratch for 2^40 elements (what a kernel context holds). */
/* The replicas' hash (hash.h): the CPU's value to the bit, added to what the
 * accumulator holds, at an index offset; a flipped bit changes it. */
static void test_hash(size_t n) {
    float *x = randv(n + 1);
    uint64_t acc = 0x0123456789abcdefull, got = 0, base = 0x0123456789abcdefull;
    float *dx = dev(x, (n + 1) * 4);
    uint64_t *dacc = dev(&acc, sizeof acc);
    tsr_cuda_hash_sum_add(dacc, dx, n, 1000, NULL);
    tsr_cuda_hash_sum_add(dacc, dx, 0, 5, NULL);
    back(&got, dacc, sizeof got);
    uint64_t want = base + tsr_hash_sum((const uint32_t *)x, n, 1000);
    CHECK(got == want, "hash of %zu words: %016llx on the device, %016llx on the CPU", n, (unsigned long long)got,
          (unsigned long long)want);
    if (n) { /* one bit of one word flipped */
        uint32_t w;
        memcpy(&w, &x[n / 2], 4);
        w ^= 1u << (n % 32);
        memcpy(&x[n / 2], &w, 4);
        REQUIRE(cudaMemcpy(dx, x, (n + 1) * 4, cudaMemcpyHostToDevice) == cudaSuccess, "copy to the device");
        uint64_t zero = 0, flipped = 0;
        REQUIRE(cudaMemcpy(dacc, &zero, 8, cudaMemcpyHostToDevice) == cudaSuccess, "copy to the device");
        tsr_cuda_hash_sum_add(dacc, dx, n, 1000, NULL);
        back(&flipped, dacc, sizeof flipped);
        CHECK(flipped == tsr_hash_sum((const uint32_t *)x, n, 1000) && flipped != want - base,
              "hash of %zu words with a bit flipped: %016llx, unflipped %016llx", n, (unsigned long long)flipped,
              (unsigned long long)(want - base));
    }
    tsr_mem_free(TSR_MEM_CUDA, dx), tsr_mem_free(TSR_MEM_CUDA, dacc);
    free(x);
}

static void test_sum_add(size_t n) {
    float *x = randv(n);
    size_t ns = tsr_cuda_sum_scratch(n);
    size_t most = tsr_cuda_sum_scratch((size_t)1 << 40);
    CHECK(ns >= 1 && ns <= most, "scratch of %zu doubles for %zu floats (%zu for 2^40)", ns, n, most);
    CHECK(tsr_cuda_sum_scratch(0) == 0, "scratch for no floats: %zu doubles", tsr_cuda_sum_scratch(0));
    double acc[2] = {0.0, 0.0}, one[2], two[2], gs = -1;
    float *dx = dev(x, n * 4);
    double *dacc = dev(acc, sizeof acc), *scr = dev(acc, (ns ? ns : 1) * sizeof(double));
    tsr_error e = {0};
    CHECK(tsr_cuda_sumsq(dx, n, &gs, NULL, &e) == 0, "sum of squares: %s", e.msg);
    for (int k = 0; k < 2; k++) {
        tsr_cuda_sum_add(dacc, dx, n, scr, NULL);
        tsr_cuda_sumsq_add(dacc + 1, dx, n, scr, NULL);
        tsr_cuda_sum_add(dacc, dx, 0, scr, NULL);
        tsr_cuda_sumsq_add(dacc + 1, dx, 0, scr, NULL);
        back(k ? two : one, dacc, sizeof acc);
    }
    double s = tsr_xent_sum(x, (int)n), sq = tsr_sumsq(x, n);
    CHECK(fabs(one[0] - s) <= 1e-5 * fmax(1.0, fabs(s)), "device sum of %zu floats: %.17g, the CPU %.17g", n, one[0],
          s);
    CHECK(fabs(one[1] - sq) <= 1e-5 * sq && one[1] == gs, "device sum of squares of %zu floats: %.17g, the CPU %.17g, "
          "tsr_cuda_sumsq %.17g", n, one[1], sq, gs);
    CHECK(two[0] == 2 * one[0] && two[1] == 2 * one[1], "device sums of %zu floats, twice: %.17g and %.17g, not twice "
          "%.17g and %.17g", n, two[0], two[1], one[0], one[1]);
    tsr_mem_free(TSR_MEM_CUDA, dx), tsr_mem_free(TSR_MEM_CUDA, dacc), tsr_mem_free(TSR_MEM_CUDA, scr);
    free(x);
}

/* The sum of squares over ranges of one buffer (out of order, overlapping, empty,
 * of one float, to the buffer's end; the ranges end to end longer than the
 * chunks' least, so that the chunks are more than their minimum and straddle
 * ranges): added to what *acc held, within 1e-12 of the sum of tsr_sumsq over the
 * ranges; the same bits twice; no ranges or no floats add nothing; the scratch
 * within the scratch for 2^40 floats (what a kernel context holds). */
static void test_sumsq_ranges(void) {
    enum { NB = 3000017 };
    static const uint64_t r[] = {1500000, 4096 * 70 + 3, 0, 1000003, 1000003, 0, 2999999, 18, 7, 12289,
                                 2000000, 1,             0, NB,      123,     999999};
    int count = (int)(sizeof r / sizeof *r / 2);
    float *x = randv(NB);
    size_t total = 0;
    double ref = 0, acc[3] = {0.25, 0.25, 7.0}, got[3];
    for (int i = 0; i < count; i++) total += r[2 * i + 1], ref += tsr_sumsq(x + r[2 * i], r[2 * i + 1]);
    size_t ns = tsr_cuda_sumsq_ranges_scratch(total), most = tsr_cuda_sumsq_ranges_scratch((size_t)1 << 40);
    CHECK(ns >= 1 && ns <= most && tsr_cuda_sumsq_ranges_scratch(0) == 0, "scratch of %zu doubles for %zu floats in "
          "ranges (%zu for 2^40, %zu for none)", ns, total, most, tsr_cuda_sumsq_ranges_scratch(0));
    float *dx = dev(x, (size_t)NB * 4);
    uint64_t *dr = dev(r, sizeof r);
    double *dacc = dev(acc, sizeof acc), *scr = dev_scratch(ns * sizeof(double));
    tsr_cuda_sumsq_ranges(dacc, dx, dr, count, total, scr, NULL);
    tsr_cuda_sumsq_ranges(dacc + 1, dx, dr, count, total, scr, NULL);
    tsr_cuda_sumsq_ranges(dacc + 2, dx, dr, 0, total, scr, NULL);
    tsr_cuda_sumsq_ranges(dacc + 2, dx, dr, count, 0, scr, NULL);
    back(got, dacc, sizeof acc);
    CHECK(fabs(got[0] - 0.25 - ref) <= 1e-12 * ref, "sum of squares over %d ranges (%zu floats): %.17g, the CPU %.17g",
          count, total, got[0] - 0.25, ref);
    CHECK(got[1] == got[0], "sum of squares over ranges: %.17g, then %.17g", got[0], got[1]);
    CHECK(got[2] == 7.0, "sum of squares over no ranges or no floats added %.17g", got[2] - 7.0);
    tsr_mem_free(TSR_MEM_CUDA, dx), tsr_mem_free(TSR_MEM_CUDA, dr), tsr_mem_free(TSR_MEM_CUDA, dacc);
    tsr_mem_free(TSR_MEM_CUDA, scr);
    free(x);
}

/* The linear layer in bf16 through cuBLASLt against the CPU kernel on the same
 * (bf16) values: the bf16 results within bf16's rounding (1e-2 by the norm), the
 * f32 weight gradient within 1e-5; the backward adds to what it is given. */
static void test_matmul_bf16(int N, int C, int OC) {
    size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    float *x = randv(ni), *w = randv(nw), *dy = randv(no), *dx = randv(ni), *dw = randv(nw);
    uint16_t *hx = malloc(ni * 2), *hw = malloc(nw * 2), *hdy = malloc(no * 2), *hdx = malloc(ni * 2);
    uint16_t *g16 = malloc((ni > no ? ni : no) * 2);
    float *y = malloc(no * 4), *got = malloc((ni > no ? (ni > nw ? ni : nw) : (no > nw ? no : nw)) * 4);
    /* the values bf16 holds, as f32, for the CPU oracle */
    for (size_t i = 0; i < ni; i++) hx[i] = tsr_f32_to_bf16(x[i]), x[i] = tsr_bf16_to_f32(hx[i]);
    for (size_t i = 0; i < ni; i++) hdx[i] = tsr_f32_to_bf16(dx[i]), dx[i] = tsr_bf16_to_f32(hdx[i]);
    for (size_t i = 0; i < nw; i++) hw[i] = tsr_f32_to_bf16(w[i]), w[i] = tsr_bf16_to_f32(hw[i]);
    for (size_t i = 0; i < no; i++) hdy[i] = tsr_f32_to_bf16(dy[i]), dy[i] = tsr_bf16_to_f32(hdy[i]);
    uint16_t *d_x = dev(hx, ni * 2), *d_w = dev(hw, nw * 2), *d_dy = dev(hdy, no * 2), *d_dx = dev(hdx, ni * 2);
    uint16_t *d_y = dev(hdy, no * 2);
    float *d_dw = dev(dw, nw * 4);
    tsr_matmul_fwd(y, x, w, N, C, OC);
    CHECK(tsr_cuda_matmul_bf16_fwd(d_y, d_x, d_w, N, C, OC, NULL) == 0, "cuBLASLt bf16 forward refused N=%d C=%d OC=%d", N,
          C, OC);
    back(g16, d_y, no * 2);
    for (size_t i = 0; i < no; i++) got[i] = tsr_bf16_to_f32(g16[i]);
    CHECK(nrel(got, y, no) < 1e-2, "bf16 matmul forward N=%d C=%d OC=%d: %.3g", N, C, OC, nrel(got, y, no));
    tsr_matmul_bwd(dx, dw, dy, x, w, N, C, OC);
    CHECK(tsr_cuda_matmul_bf16_bwd(d_dx, d_dw, d_dy, d_x, d_w, N, C, OC, NULL) == 0, "cuBLASLt bf16 backward refused");
    back(g16, d_dx, ni * 2);
    for (size_t i = 0; i < ni; i++) got[i] = tsr_bf16_to_f32(g16[i]);
    CHECK(nrel(got, dx, ni) < 1e-2, "bf16 matmul backward (input) N=%d C=%d OC=%d: %.3g", N, C, OC, nrel(got, dx, ni));
    back(got, d_dw, nw * 4);
    CHECK(nrel(got, dw, nw) < 1e-5, "bf16 matmul backward (f32 weight gradient) N=%d C=%d OC=%d: %.3g", N, C, OC,
          nrel(got, dw, nw));
    tsr_mem_free(TSR_MEM_CUDA, d_x), tsr_mem_free(TSR_MEM_CUDA, d_w), tsr_mem_free(TSR_MEM_CUDA, d_dy);
    tsr_mem_free(TSR_MEM_CUDA, d_dx), tsr_mem_free(TSR_MEM_CUDA, d_y), tsr_mem_free(TSR_MEM_CUDA, d_dw);
    free(x), free(w), free(dy), free(dx), free(dw), free(hx), free(hw), free(hdy), free(hdx), free(g16), free(y), free(got);
}

/* x (n) rounded to bf16 and back: the values the mixed-precision kernels multiply. */
static float *bf16_round(const float *x, size_t n) {
    float *r = malloc(n * 4 + 4);
    REQUIRE(r, "out of memory");
    for (size_t i = 0; i < n; i++) r[i] = tsr_bf16_to_f32(tsr_f32_to_bf16(x[i]));
    return r;
}
static float *absv(const float *x, size_t n) {
    float *r = malloc(n * 4 + 4);
    REQUIRE(r, "out of memory");
    for (size_t i = 0; i < n; i++) r[i] = fabsf(x[i]);
    return r;
}
static float *copyv(const float *x, size_t n) {
    float *r = malloc(n * 4 + 4);
    REQUIRE(r, "out of memory");
    return memcpy(r, x, n * 4);
}
/* The largest |a - b| / bound of an element, bound its sum of |terms| (a
 * difference where the bound is 0, or a NaN, is infinitely far). */
static double brel(const float *a, const float *b, const float *bound, size_t n) {
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]), q = d == 0 ? 0 : bound[i] > 0 ? d / bound[i] : INFINITY;
        if (isnan(d)) q = INFINITY;
        if (q > w) w = q;
    }
    return w;
}

/* The mixed-precision linear layer (f32 tensors, operands rounded to bf16, f32
 * accumulation and results) against the CPU kernel on the operands rounded to
 * bf16 here: products of bf16 values are exact in f32, so every element agrees
 * to f32 summation order, within 1e-4 of the sum of its |terms| (computed by the
 * same kernel on |operands|). An operand left unrounded is off by up to 2^-9 of a
 * term, which the shapes with few terms per sum (C or N of 1) show. The backward
 * adds to random gradients; with one gradient NULL, the other gets the same bits
 * again (and the NULL one is not touched). */
static void test_matmul_mixed(int N, int C, int OC) {
    size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    size_t nmax = ni > nw ? (ni > no ? ni : no) : (nw > no ? nw : no);
    float *x = randv(ni), *w = randv(nw), *dy = randv(no), *dx0 = randv(ni), *dw0 = randv(nw);
    float *xr = bf16_round(x, ni), *wr = bf16_round(w, nw), *dyr = bf16_round(dy, no);
    float *ax = absv(xr, ni), *aw = absv(wr, nw), *ady = absv(dyr, no);
    float *y = malloc(no * 4 + 4), *by = malloc(no * 4 + 4), *dx = copyv(dx0, ni), *dw = copyv(dw0, nw);
    float *bdx = absv(dx0, ni), *bdw = absv(dw0, nw), *got = malloc(nmax * 4 + 4), *got2 = malloc(nmax * 4 + 4);
    tsr_matmul_fwd(y, xr, wr, N, C, OC);
    tsr_matmul_fwd(by, ax, aw, N, C, OC);
    tsr_matmul_bwd(dx, dw, dyr, xr, wr, N, C, OC);
    tsr_matmul_bwd(bdx, bdw, ady, ax, aw, N, C, OC);
    float *d_x = dev(x, ni * 4), *d_w = dev(w, nw * 4), *d_dy = dev(dy, no * 4), *d_y = dev(dy, no * 4);
    float *d_dx = dev(dx0, ni * 4), *d_dw = dev(dw0, nw * 4), *d_dx2 = dev(dx0, ni * 4), *d_dw2 = dev(dw0, nw * 4);
    size_t ns = tsr_cuda_matmul_mixed_scratch(N, C, OC);
    CHECK(ns >= ni + nw + no, "mixed matmul scratch N=%d C=%d OC=%d: %zu elements, fewer than the operands' %zu", N, C,
          OC, ns, ni + nw + no);
    uint16_t *scr = dev_scratch(ns * sizeof(uint16_t));
    CHECK(tsr_cuda_matmul_mixed_fwd(d_y, d_x, d_w, N, C, OC, scr, NULL) == 0, "mixed matmul forward refused N=%d C=%d "
          "OC=%d", N, C, OC);
    back(got, d_y, no * 4);
    CHECK(brel(got, y, by, no) < 1e-4, "mixed matmul forward N=%d C=%d OC=%d: %.3g of the terms", N, C, OC,
          brel(got, y, by, no));
    CHECK(tsr_cuda_matmul_mixed_bwd(d_dx, d_dw, d_dy, d_x, d_w, N, C, OC, scr, NULL) == 0, "mixed matmul backward "
          "refused N=%d C=%d OC=%d", N, C, OC);
    back(got, d_dx, ni * 4);
    CHECK(brel(got, dx, bdx, ni) < 1e-4, "mixed matmul backward (input) N=%d C=%d OC=%d: %.3g of the terms", N, C, OC,
          brel(got, dx, bdx, ni));
    CHECK(tsr_cuda_matmul_mixed_bwd(d_dx2, NULL, d_dy, d_x, d_w, N, C, OC, scr, NULL) == 0, "mixed backward, no dw");
    back(got2, d_dx2, ni * 4);
    CHECK(!memcmp(got, got2, ni * 4), "mixed matmul backward (input) N=%d C=%d OC=%d: other bits without dw", N, C, OC);
    back(got, d_dw, nw * 4);
    CHECK(brel(got, dw, bdw, nw) < 1e-4, "mixed matmul backward (weight) N=%d C=%d OC=%d: %.3g of the terms", N, C, OC,
          brel(got, dw, bdw, nw));
    back(got2, d_dw2, nw * 4);
    CHECK(!memcmp(got2, dw0, nw * 4), "mixed matmul backward with dw NULL wrote the weight gradient");
    CHECK(tsr_cuda_matmul_mixed_bwd(NULL, d_dw2, d_dy, d_x, d_w, N, C, OC, scr, NULL) == 0, "mixed backward, no dinp");
    back(got2, d_dw2, nw * 4);
    CHECK(!memcmp(got, got2, nw * 4), "mixed matmul backward (weight) N=%d C=%d OC=%d: other bits without dinp", N, C,
          OC);
    float *dptr[] = {d_x, d_w, d_dy, d_y, d_dx, d_dw, d_dx2, d_dw2};
    for (size_t i = 0; i < sizeof dptr / sizeof *dptr; i++) tsr_mem_free(TSR_MEM_CUDA, dptr[i]);
    tsr_mem_free(TSR_MEM_CUDA, scr);
    free(x), free(w), free(dy), free(dx0), free(dw0), free(xr), free(wr), free(dyr), free(ax), free(aw), free(ady);
    free(y), free(by), free(dx), free(dw), free(bdx), free(bdw), free(got), free(got2);
}

/* Causal GQA: the probabilities, the output and the three gradients within 1e-4. */
static void test_attention(int B, int T, int NH, int NKV, int hd) {
    size_t nq = (size_t)B * T * NH * hd, nk = (size_t)B * T * NKV * hd, na = (size_t)B * NH * T * T;
    float *q = randv(nq), *k = randv(nk), *v = randv(nk), *dout = randv(nq), *out = malloc(nq * 4);
    float *att = malloc(na * 4), *scr = malloc(na * 4), *dq = calloc(nq, 4), *dk = calloc(nk, 4), *dv = calloc(nk, 4);
    float *got = malloc((na > nq ? na : nq) * 4);
    float *d_q = dev(q, nq * 4), *d_k = dev(k, nk * 4), *d_v = dev(v, nk * 4), *d_do = dev(dout, nq * 4);
    float *d_o = dev(out, nq * 4), *d_att = dev(att, na * 4), *d_scr = dev(scr, na * 4);
    float *d_dq = dev(dq, nq * 4), *d_dk = dev(dk, nk * 4), *d_dv = dev(dv, nk * 4);
    tsr_attention_fwd(out, att, q, k, v, B, T, NH, NKV, hd);
    tsr_cuda_attention_fwd(d_o, d_att, d_q, d_k, d_v, B, T, NH, NKV, hd, NULL);
    back(got, d_att, na * 4);
    CHECK(rel(got, att, na) < 1e-4, "attention probabilities B=%d T=%d NH=%d NKV=%d hd=%d: %.3g", B, T, NH, NKV, hd,
          rel(got, att, na));
    back(got, d_o, nq * 4);
    CHECK(rel(got, out, nq) < 1e-4, "attention output: %.3g", rel(got, out, nq));
    tsr_attention_bwd(dq, dk, dv, scr, dout, q, k, v, att, B, T, NH, NKV, hd);
    tsr_cuda_attention_bwd(d_dq, d_dk, d_dv, d_scr, d_do, d_q, d_k, d_v, d_att, B, T, NH, NKV, hd, NULL);
    back(got, d_dq, nq * 4);
    CHECK(rel(got, dq, nq) < 1e-4, "attention dq: %.3g", rel(got, dq, nq));
    back(got, d_dk, nk * 4);
    CHECK(rel(got, dk, nk) < 1e-4, "attention dk: %.3g", rel(got, dk, nk));
    back(got, d_dv, nk * 4);
    CHECK(rel(got, dv, nk) < 1e-4, "attention dv: %.3g", rel(got, dv, nk));
    float *dptr[] = {d_q, d_k, d_v, d_do, d_o, d_att, d_scr, d_dq, d_dk, d_dv};
    for (size_t i = 0; i < sizeof dptr / sizeof *dptr; i++) tsr_mem_free(TSR_MEM_CUDA, dptr[i]);
    free(q), free(k), free(v), free(dout), free(out), free(att), free(scr), free(dq), free(dk), free(dv), free(got);
}

/* The largest |a - b| over the largest |b - base| (base NULL: of |b|): a
 * difference measured against the size of what was computed. */
static double mrel(const float *a, const float *b, const float *base, size_t n) {
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]), m = fabs((double)b[i] - (base ? base[i] : 0.0f));
        if (isnan(e)) return INFINITY;
        d = e > d ? e : d, r = m > r ? m : r;
    }
    return d == 0 ? 0 : r > 0 ? d / r : INFINITY;
}

/* Causal GQA on tensor cores (bf16 operands) against the CPU's f32 kernel: the
 * probabilities and the output within 2e-2 of their largest value, each gradient
 * within 2e-2 of its largest (bf16 rounds by 2^-9; a wrong mask, group or
 * layout is off by far more); the gradients are added to random values. A second
 * backward with dq skipped gives dk and dv the same bits (a fixed order, also
 * for the sum over a group's heads). */
static void test_attention_tc(int B, int T, int NH, int NKV, int hd) {
    size_t nq = (size_t)B * T * NH * hd, nk = (size_t)B * T * NKV * hd, na = (size_t)B * NH * T * T;
    float *q = randv(nq), *k = randv(nk), *v = randv(nk), *dout = randv(nq), *out = malloc(nq * 4);
    float *att = malloc(na * 4), *scr = malloc(na * 4), *dq0 = randv(nq), *dk0 = randv(nk), *dv0 = randv(nk);
    float *dq = copyv(dq0, nq), *dk = copyv(dk0, nk), *dv = copyv(dv0, nk);
    float *got = malloc((na > nq ? na : nq) * 4), *gk = malloc(nk * 4), *gv = malloc(nk * 4), *g2 = malloc(nk * 4);
    float *d_q = dev(q, nq * 4), *d_k = dev(k, nk * 4), *d_v = dev(v, nk * 4), *d_do = dev(dout, nq * 4);
    float *d_o = dev(dout, nq * 4), *d_att = dev_scratch(na * 4), *d_scr = dev_scratch(na * 4);
    float *d_dq = dev(dq0, nq * 4), *d_dk = dev(dk0, nk * 4), *d_dv = dev(dv0, nk * 4);
    float *d_dk2 = dev(dk0, nk * 4), *d_dv2 = dev(dv0, nk * 4);
    size_t ns = tsr_cuda_attention_tc_scratch(B, T, NH, NKV, hd);
    CHECK(ns >= 2 * (2 * nq + 2 * nk + na), "tensor-core attention B=%d T=%d NH=%d NKV=%d hd=%d: scratch of %zu bytes, "
          "less than the bf16 copies", B, T, NH, NKV, hd, ns);
    void *tcs = dev_scratch(ns);
    tsr_attention_fwd(out, att, q, k, v, B, T, NH, NKV, hd);
    tsr_cuda_attention_tc_fwd(d_o, d_att, d_q, d_k, d_v, B, T, NH, NKV, hd, tcs, NULL);
    back(got, d_att, na * 4);
    CHECK(mrel(got, att, NULL, na) < 2e-2, "tensor-core attention probabilities B=%d T=%d NH=%d NKV=%d hd=%d: %.3g", B, T,
          NH, NKV, hd, mrel(got, att, NULL, na));
    back(got, d_o, nq * 4);
    CHECK(mrel(got, out, NULL, nq) < 2e-2, "tensor-core attention output B=%d T=%d NH=%d NKV=%d hd=%d: %.3g", B, T, NH,
          NKV, hd, mrel(got, out, NULL, nq));
    tsr_attention_bwd(dq, dk, dv, scr, dout, q, k, v, att, B, T, NH, NKV, hd);
    tsr_cuda_attention_tc_bwd(d_dq, d_dk, d_dv, d_scr, d_do, d_q, d_k, d_v, d_att, B, T, NH, NKV, hd, tcs, NULL);
    back(got, d_dq, nq * 4);
    CHECK(mrel(got, dq, dq0, nq) < 2e-2, "tensor-core attention dq B=%d T=%d NH=%d NKV=%d hd=%d: %.3g", B, T, NH, NKV,
          hd, mrel(got, dq, dq0, nq));
    back(gk, d_dk, nk * 4), back(gv, d_dv, nk * 4);
    CHECK(mrel(gk, dk, dk0, nk) < 2e-2, "tensor-core attention dk B=%d T=%d NH=%d NKV=%d hd=%d: %.3g", B, T, NH, NKV,
          hd, mrel(gk, dk, dk0, nk));
    CHECK(mrel(gv, dv, dv0, nk) < 2e-2, "tensor-core attention dv B=%d T=%d NH=%d NKV=%d hd=%d: %.3g", B, T, NH, NKV,
          hd, mrel(gv, dv, dv0, nk));
    tsr_cuda_attention_tc_bwd(NULL, d_dk2, d_dv2, d_scr, d_do, d_q, d_k, d_v, d_att, B, T, NH, NKV, hd, tcs, NULL);
    back(g2, d_dk2, nk * 4);
    CHECK(!memcmp(g2, gk, nk * 4), "tensor-core attention dk B=%d T=%d NH=%d NKV=%d hd=%d: other bits the second time",
          B, T, NH, NKV, hd);
    back(g2, d_dv2, nk * 4);
    CHECK(!memcmp(g2, gv, nk * 4), "tensor-core attention dv B=%d T=%d NH=%d NKV=%d hd=%d: other bits the second time",
          B, T, NH, NKV, hd);
    float *dptr[] = {d_q, d_k, d_v, d_do, d_o, d_att, d_scr, d_dq, d_dk, d_dv, d_dk2, d_dv2};
    for (size_t i = 0; i < sizeof dptr / sizeof *dptr; i++) tsr_mem_free(TSR_MEM_CUDA, dptr[i]);
    tsr_mem_free(TSR_MEM_CUDA, tcs);
    free(q), free(k), free(v), free(dout), free(out), free(att), free(scr), free(dq0), free(dk0), free(dv0);
    free(dq), free(dk), free(dv), free(got), free(gk), free(gv), free(g2);
}

/* The data plane on a stream (NCCL) over a group of one: every collective gives
 * back its input, bf16 through its f32 sum. */
static void test_nccl(size_t n) {
    tsr_comm *c = tsr_comm_self();
    cudaStream_t cs;
    REQUIRE(cudaStreamCreate(&cs) == cudaSuccess, "stream");
    tsr_stream *s = (tsr_stream *)cs;
    float *x = randv(n), *got = malloc(n * 4);
    uint16_t *h = malloc(n * 2), *g16 = malloc(n * 2);
    for (size_t i = 0; i < n; i++) h[i] = tsr_f32_to_bf16(x[i]);
    float *dx = dev(x, n * 4), *dy = dev(x, n * 4);
    uint16_t *dh = dev(h, n * 2), *dh2 = dev(h, n * 2);
    tsr_error e = {0};
    CHECK(tsr_data_allreduce_sum(c, TSR_F32, dx, n, s, &e) == 0, "NCCL all-reduce: %s", e.msg);
    CHECK(tsr_data_allreduce_sum(c, TSR_BF16, dh, n, s, &e) == 0, "NCCL bf16 all-reduce: %s", e.msg);
    CHECK(tsr_data_allgatherv(c, TSR_F32, dx, dy, &n, s, &e) == 0, "NCCL all-gatherv: %s", e.msg);
    CHECK(tsr_data_reduce_scatterv(c, TSR_BF16, dh, dh2, &n, s, &e) == 0, "NCCL bf16 reduce-scatterv: %s", e.msg);
    CHECK(tsr_data_wait(c, NULL, s, &e) == 0, "NCCL wait: %s", e.msg);
    back(got, dy, n * 4), back(g16, dh2, n * 2);
    CHECK(!memcmp(got, x, n * 4) && !memcmp(g16, h, n * 2), "NCCL collectives over one rank changed their input");
    /* a send is held and queued with the next receive as one group: to this
     * rank itself that is the only way it completes (an ungrouped send to
     * oneself blocks the stream); the time of the calls on the stream is
     * counted by events once they are done */
    double before = tsr_data_seconds();
    REQUIRE(cudaMemset(dy, 0, n * 4) == cudaSuccess, "memset");
    CHECK(tsr_data_send(c, 0, 3, TSR_F32, dx, n, NULL, s, &e) == 0, "NCCL send to oneself: %s", e.msg);
    CHECK(tsr_data_recv(c, 0, 3, TSR_F32, dy, n, s, &e) == 0, "NCCL receive from oneself: %s", e.msg);
    CHECK(tsr_data_wait(c, NULL, s, &e) == 0, "NCCL wait after a send and receive: %s", e.msg);
    back(got, dy, n * 4);
    CHECK(!memcmp(got, x, n * 4), "NCCL send/receive to oneself: the bytes did not arrive");
    CHECK(tsr_data_seconds() > before, "NCCL calls on a stream: no time counted (%g s before, %g after)", before,
          tsr_data_seconds());
    tsr_mem_free(TSR_MEM_CUDA, dx), tsr_mem_free(TSR_MEM_CUDA, dy);
    tsr_mem_free(TSR_MEM_CUDA, dh), tsr_mem_free(TSR_MEM_CUDA, dh2);
    cudaStreamDestroy(cs);
    tsr_comm_free(c);
    free(x), free(got), free(h), free(g16);
}

/* The engine with boxes in device memory: a save staged from the device (the
 * copy overlapped with the caller, as the trainer does: the state is scribbled on
 * only after tsr_engine_staged) and loaded back into device boxes and into host
 * boxes (a GPU checkpoint resumes on CPU ranks), bit for bit. */
static void test_engine_device(void) {
    enum { R = 300, C = 1031 };
    static tsr_tensor_decl decls[2] = {
        {"model.w", "model", TSR_F32, 2, {R, C}, {0, 1, TSR_PP_ALL, -1}},
        {"model.h", "model", TSR_BF16, 1, {C}, {-1, 0, TSR_PP_ALL, -1}},
    };
    const char *t = getenv("TSR_TMP");
    char root[512];
    snprintf(root, sizeof root, "%s/cuda-engine-%d", t ? t : "/tmp", (int)getpid());
    tsr_comm *comm = tsr_comm_self();
    tsr_engine_opts o = tsr_engine_opts_default();
    o.overlap_staging = 1;
    tsr_error e = {0};
    tsr_engine *eng = tsr_engine_new(root, comm, &o, &e);
    REQUIRE(eng, "%s", e.msg);
    float *w = randv((size_t)R * C), *gw = malloc((size_t)R * C * 4);
    uint16_t *h = malloc(C * 2), *gh = malloc(C * 2);
    for (int i = 0; i < C; i++) h[i] = tsr_f32_to_bf16(frand());
    float *dw = dev(w, (size_t)R * C * 4);
    uint16_t *dh = dev(h, C * 2);
    tsr_state_box sb[2] = {{0, {2, {0, 0}, {R, C}}, dw, TSR_MEM_CUDA}, {1, {1, {0}, {C}}, dh, TSR_MEM_CUDA}};
    tsr_state st = {decls, 2, sb, 2, NULL, 0, {1, 1, 1, 1, 0, 0}};
    CHECK(tsr_engine_save(eng, 10, &st, &e) == 0, "save from device memory: %s", e.msg);
    tsr_engine_staged(eng); /* a failed copy is reported by tsr_engine_wait */
    tsr_cuda_fill(dw, (size_t)R * C, -7.0f, NULL); /* the save must not see it */
    CHECK(tsr_engine_wait(eng, &e) == 0, "the save from device memory: %s", e.msg);
    char step[600];
    snprintf(step, sizeof step, "%s/step-%08d", root, 10);
    CHECK(tsr_engine_load(eng, step, &st, NULL, &e) == 0, "load into device memory: %s", e.msg);
    back(gw, dw, (size_t)R * C * 4), back(gh, dh, C * 2);
    CHECK(!memcmp(gw, w, (size_t)R * C * 4) && !memcmp(gh, h, C * 2), "device save and load: not the same bits");
    memset(gw, 0, (size_t)R * C * 4), memset(gh, 0, C * 2);
    tsr_state_box hb[2] = {{0, {2, {0, 0}, {R, C}}, gw, TSR_MEM_HOST}, {1, {1, {0}, {C}}, gh, TSR_MEM_HOST}};
    tsr_state hst = {decls, 2, hb, 2, NULL, 0, {1, 1, 1, 1, 0, 0}};
    CHECK(tsr_engine_load(eng, step, &hst, NULL, &e) == 0, "load of a device save into host memory: %s", e.msg);
    CHECK(!memcmp(gw, w, (size_t)R * C * 4) && !memcmp(gh, h, C * 2), "device save, host load: not the same bits");
    tsr_engine_free(eng);
    tsr_comm_free(comm);
    tsr_mem_free(TSR_MEM_CUDA, dw), tsr_mem_free(TSR_MEM_CUDA, dh);
    free(w), free(gw), free(h), free(gh);
    tsr_remove_tree(root);
}

int main(void) {
    int n = tsr_cuda_devices();
    if (n == 0) SKIP("no GPU on this machine: the CUDA kernels are built, not run");
    tsr_error e = {0};
    CHECK(tsr_mem_usable(TSR_MEM_CUDA, &e) == 0, "cuda memory not usable with %d GPU(s): %s", n, e.msg);
    setvbuf(stdout, NULL, _IOLBF, 0); /* each group's line stays when a later one crashes */
    size_t sizes[] = {1, 7, 4096, 1000003};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) test_elementwise(sizes[i]), test_adamw(sizes[i]);
    printf("elementwise, casts, AdamW: %d failure(s) so far\n", check_failures);
    test_embed(1, 1, 1), test_embed(37, 65, 11), test_embed(512, 768, 300);
    test_embed(2050, 1100, 7), test_embed(4099, 333, 50); /* tokens held by hundreds of positions; C > 1024 */
    test_rmsnorm(1, 1), test_rmsnorm(3, 257), test_rmsnorm(256, 768), test_rmsnorm(129, 4097);
    test_rmsnorm(40, 33), test_rmsnorm(8193, 200); /* chunks of unequal rows; many rows */
    printf("embedding, RMSNorm, sum of squares: %d failure(s) so far\n", check_failures);
    test_layers(1, 1, 1, 2, 1), test_layers(2, 17, 3, 64, 259), test_layers(4, 64, 8, 64, 1024);
    test_matmul_bf16(1, 1, 1), test_matmul_bf16(37, 65, 11), test_matmul_bf16(256, 768, 1024),
        test_matmul_bf16(129, 4096, 1000);
    test_matmul_mixed(1, 1, 1), test_matmul_mixed(3, 1, 5), test_matmul_mixed(1, 7, 3), test_matmul_mixed(37, 65, 11),
        test_matmul_mixed(256, 768, 1024), test_matmul_mixed(129, 4096, 1000);
    printf("RoPE, SwiGLU, cross-entropy, matmul (f32, bf16 and mixed): %d failure(s) so far\n", check_failures);
    static const int w3[] = {13, 0, 9}, w2[] = {5, 8}, w1[] = {13};
    test_xent_part(7, w3, 3), test_xent_part(7, w2, 2), test_xent_part(1, w1, 1), test_xent_part(257, w3, 3);
    size_t sums[] = {1, 1000, 12289, ((size_t)1 << 20) + 3};
    for (size_t i = 0; i < sizeof sums / sizeof *sums; i++) test_sum_add(sums[i]);
    test_sumsq_ranges();
    size_t hashes[] = {0, 1, 31, 33, 4097, ((size_t)1 << 22) + 5};
    for (size_t i = 0; i < sizeof hashes / sizeof *hashes; i++) test_hash(hashes[i]);
    printf("vocabulary-parallel cross-entropy, device sums, replica hash: %d failure(s) so far\n", check_failures);
    test_attention(1, 1, 1, 1, 1), test_attention(2, 67, 4, 2, 32), test_attention(1, 128, 8, 2, 64);
    test_attention_tc(1, 1, 1, 1, 1), test_attention_tc(2, 37, 6, 2, 24), test_attention_tc(1, 50, 4, 4, 64),
        test_attention_tc(2, 64, 8, 2, 64), test_attention_tc(1, 300, 2, 1, 16);
    printf("attention (f32 and tensor cores): %d failure(s) so far\n", check_failures);
    test_nccl(1), test_nccl(100003);
    printf("NCCL data plane: %d failure(s) so far\n", check_failures);
    test_engine_device();
    if (!check_failures) printf("cuda kernels: every twin matches its CPU kernel\n");
    return check_done();
}
#endif
