/* test_kernels.c: the CPU kernels against PyTorch.
 *
 * For each op and a few shapes (GQA and plain multi-head attention, odd sizes,
 * T = 1, ignored targets, out-of-range tokens) this program draws seeded random
 * inputs, runs forward and backward, and writes inputs and outputs under
 * $TSR_TMP: raw native-endian arrays "<case>.<name>.bin" and an index
 * "kernels.idx" whose lines are
 *     case <case> <op> key=value ...
 *     tensor <case> <name> f32|i32|f64 <ndim> <dims...>
 * Then tests/ref_kernels.py recomputes everything with PyTorch in float64
 * (autograd for the backward passes, with the same upstream gradients) and fails
 * naming the op, case, tensor and relative error when one exceeds 1e-5.
 *
 * Checks here in C, without PyTorch: every backward adds into its gradients
 * (gradients prefilled with g0 end as g0 + the gradient from zero); a NULL
 * gradient leaves the others unchanged; forward outputs are fully overwritten
 * (they start as NaN, as do attention's scratch and att); in-place aliasing that
 * the headers allow; bitwise-equal results for 1, 2 and 3 threads where the
 * headers promise it; tsr_exp against exp() and at its ends; the memory
 * kernels (mem.h): fill, copy and add exactly, memory of each kind zeroed or
 * refused.
 * Without PyTorch (/usr/bin/python3 -c "import torch" fails) the test fails: it
 * does not skip, since these kernels must be checked. */
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

#include "activation.h"
#include "attention.h"
#include "check.h"
#include "embed.h"
#include "loss.h"
#include "matmul.h"
#include "buffers.h"
#include "norm.h"
#include "optim.h"
#include "rope.h"

/* The memory kernels: exact, over every element and none past the end. */
static void check_mem(void) {
    enum { N = 1003 };
    tsr_error e = {0};
    float *a = tsr_mem_alloc(TSR_MEM_HOST, (N + 1) * sizeof *a, &e), b[N + 1], out[N + 1];
    REQUIRE(a, "%s", e.msg);
    int bad = 0;
    for (size_t i = 0; i <= N; i++) bad += a[i] != 0.0f || signbit(a[i]);
    CHECK(bad == 0, "host memory from tsr_mem_alloc: %d of %d floats not +0", bad, N + 1);
    CHECK((uintptr_t)a % TSR_ALIGN == 0, "tsr_mem_alloc: not aligned to %d", TSR_ALIGN);
    a[N] = b[N] = out[N] = 7.0f; /* guards */
    tsr_k_fill(a, N, -1.5f);
    tsr_k_fill(b, N, 0.25f);
    bad = 0;
    for (size_t i = 0; i < N; i++) bad += a[i] != -1.5f || b[i] != 0.25f;
    CHECK(bad == 0 && a[N] == 7.0f && b[N] == 7.0f, "tsr_k_fill: %d wrong, guards %g %g", bad, a[N], b[N]);
    for (size_t i = 0; i < N; i++) a[i] = (float)i * 0.1f, b[i] = 1.0f / (float)(i + 1);
    tsr_k_add(out, a, b, N);
    bad = 0;
    for (size_t i = 0; i < N; i++) bad += out[i] != a[i] + b[i];
    CHECK(bad == 0 && out[N] == 7.0f, "tsr_k_add: %d of %d not a + b", bad, N);
    tsr_k_add(a, a, b, N); /* in place */
    CHECK(!memcmp(a, out, N * sizeof *a), "tsr_k_add in place differs");
    tsr_k_fill(a, N, 0.0f);
    bad = 0;
    for (size_t i = 0; i < N; i++) bad += a[i] != 0.0f || signbit(a[i]);
    CHECK(bad == 0, "tsr_k_fill with +0: %d not +0", bad);
    tsr_k_fill(a, N, -0.0f);
    CHECK(signbit(a[0]) && signbit(a[N - 1]), "tsr_k_fill with -0 wrote +0");
    tsr_k_copy(a, out, N * sizeof *a);
    CHECK(!memcmp(a, out, N * sizeof *a) && a[N] == 7.0f, "tsr_k_copy: the bytes differ or overran");
    tsr_k_copy(a, NULL, 0); /* nothing to copy */
    CHECK(tsr_mem_to_host(b, a, N * sizeof *a, TSR_MEM_HOST, NULL) == 0, "tsr_mem_to_host from host memory failed");
    CHECK(!memcmp(b, out, N * sizeof *b), "tsr_mem_to_host from host memory");
    { /* the streamed host copy: every alignment of both ends, lengths around its blocks */
        enum { M = 3 * 4096 + 300 };
        uint8_t *src = malloc(M + 64), *dst = malloc(M + 64 + 2);
        REQUIRE(src && dst, "out of memory");
        for (size_t i = 0; i < M + 64; i++) src[i] = (uint8_t)(i * 131 + 7);
        int ok = 1;
        size_t lens[] = {0, 1, 4095, 4096, 4097, 4096 + 127, 4096 + 128, M};
        for (size_t so = 0; so < 33; so += 11)
            for (size_t dof = 0; dof < 64; dof += 13)
                for (size_t k = 0; k < sizeof lens / sizeof *lens; k++) {
                    memset(dst, 0xee, M + 64 + 2);
                    CHECK(tsr_mem_to_host(dst + dof, src + so, lens[k], TSR_MEM_HOST, NULL) == 0, "copy");
                    ok = ok && !memcmp(dst + dof, src + so, lens[k]) && dst[dof + lens[k]] == 0xee &&
                         (dof == 0 || dst[dof - 1] == 0xee);
                }
        CHECK(ok, "tsr_mem_to_host: a host copy at some alignment or length differs or overran");
        free(src);
        free(dst);
    }
    /* the loss sum: in double, in index order */
    double want = 0;
    for (size_t i = 0; i < N; i++) want += out[i];
    CHECK(tsr_xent_sum(out, N) == want && tsr_xent_sum(out, 0) == 0, "tsr_xent_sum %.17g, want %.17g",
          tsr_xent_sum(out, N), want);
    tsr_mem_free(TSR_MEM_HOST, a);
    tsr_mem_free(TSR_MEM_HOST, NULL);
    /* device memory: refused on a host build, by name */
    CHECK(tsr_mem_alloc(TSR_MEM_CUDA, 64, &e) == NULL && e.code == TSR_EINVAL && strstr(e.msg, "cuda"),
          "cuda memory on a host build: %s", e.msg);
    CHECK(tsr_mem_usable(TSR_MEM_HOST, &e) == 0 && tsr_mem_usable(TSR_MEM_CUDA, &e) == TSR_EINVAL,
          "tsr_mem_usable");
}

static const char *tmp;
static FILE *idx;

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}
static float unif(void) { return (float)((double)(next() >> 11) / 9007199254740992.0 * 2.0 - 1.0); } /* [-1,1) */

static float *fbuf(size_t n) {
    float *p = malloc((n ? n : 1) * sizeof *p);
    REQUIRE(p, "out of memory");
    return p;
}
static float *frand(size_t n, float scale) {
    float *p = fbuf(n);
    for (size_t i = 0; i < n; i++) p[i] = scale * unif();
    return p;
}
static float *fzero(size_t n) {
    float *p = fbuf(n);
    memset(p, 0, (n ? n : 1) * sizeof *p);
    return p;
}
static float *fnan(size_t n) {
    float *p = fbuf(n);
    for (size_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}
static float *fcopy(const float *x, size_t n) {
    float *p = fbuf(n);
    memcpy(p, x, n * sizeof *p);
    return p;
}

static void save(const char *cs, const char *name, const char *dt, const void *x, int nd, const int *dims) {
    size_t n = 1, es = strcmp(dt, "f64") ? 4 : 8;
    fprintf(idx, "tensor %s %s %s %d", cs, name, dt, nd);
    for (int d = 0; d < nd; d++) {
        fprintf(idx, " %d", dims[d]);
        n *= (size_t)dims[d];
    }
    fputc('\n', idx);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.%s.bin", tmp, cs, name);
    FILE *f = fopen(path, "wb");
    REQUIRE(f, "cannot create %s", path);
    REQUIRE(fwrite(x, es, n, f) == n && fclose(f) == 0, "cannot write %s", path);
}
#define SAVE(cs, name, x, ...) save(cs, name, "f32", x, (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int)), (int[]){__VA_ARGS__})
#define SAVE_I(cs, name, x, ...) save(cs, name, "i32", x, (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int)), (int[]){__VA_ARGS__})

static void declare(const char *cs, const char *op, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void declare(const char *cs, const char *op, const char *fmt, ...) {
    fprintf(idx, "case %s %s ", cs, op);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(idx, fmt, ap);
    va_end(ap);
    fputc('\n', idx);
}

/* got == g0 + G elementwise, up to float rounding: a backward that overwrote its
 * gradient, or added twice, fails this. */
static void check_accum(const char *what, const float *got, const float *g0, const float *G, size_t n) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        float want = g0[i] + G[i];
        if (!(fabsf(got[i] - want) <= 1e-5f * (fabsf(g0[i]) + fabsf(G[i])) + 1e-6f)) bad++;
    }
    CHECK(bad == 0, "%s: %zu of %zu elements are not g0 + gradient (backward must add)", what, bad, n);
}
/* ||a - b|| <= 1e-6 ||b||: the same sums, maybe added in another order. */
static void check_close(const char *what, const float *a, const float *b, size_t n) {
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), r += (double)b[i] * b[i];
    CHECK(d <= 1e-12 * r, "%s: relative difference %.3g", what, sqrt(d / (r > 0 ? r : 1)));
}
static void check_same(const char *what, const float *a, const float *b, size_t n) {
    CHECK(memcmp(a, b, n * sizeof *a) == 0, "%s: not bitwise equal", what);
}
static void check_finite(const char *what, const float *a, size_t n) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += !isfinite(a[i]);
    CHECK(bad == 0, "%s: %zu of %zu elements not written (still NaN) or not finite", what, bad, n);
}

static void case_matmul(int N, int C, int OC) {
    char cs[64];
    snprintf(cs, sizeof cs, "matmul_%dx%dx%d", N, C, OC);
    size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
    float *inp = frand(ni, 1), *w = frand(nw, 0.5f), *out = fnan(no), *dout = frand(no, 1);
    tsr_matmul_fwd(out, inp, w, N, C, OC);
    check_finite(cs, out, no);
    float *dinp = fzero(ni), *dw = fzero(nw);
    tsr_matmul_bwd(dinp, dw, dout, inp, w, N, C, OC);
    declare(cs, "matmul", "N=%d C=%d OC=%d", N, C, OC);
    SAVE(cs, "inp", inp, N, C);
    SAVE(cs, "w", w, OC, C);
    SAVE(cs, "out", out, N, OC);
    SAVE(cs, "dout", dout, N, OC);
    SAVE(cs, "dinp", dinp, N, C);
    SAVE(cs, "dw", dw, OC, C);
    float *g0 = frand(ni, 1), *h0 = frand(nw, 1), *g = fcopy(g0, ni), *h = fcopy(h0, nw);
    tsr_matmul_bwd(g, h, dout, inp, w, N, C, OC);
    check_accum("matmul dinp", g, g0, dinp, ni);
    check_accum("matmul dw", h, h0, dw, nw);
    memcpy(h, h0, nw * sizeof *h);
    tsr_matmul_bwd(NULL, h, dout, inp, w, N, C, OC);
    check_accum("matmul dw (dinp NULL)", h, h0, dw, nw);
    for (int t = 1; t <= 3; t += 2) { /* the products are cut into one block per thread */
        omp_set_num_threads(t);
        float *o2 = fnan(no), *g2 = fzero(ni), *h2 = fzero(nw);
        tsr_matmul_fwd(o2, inp, w, N, C, OC);
        tsr_matmul_bwd(g2, h2, dout, inp, w, N, C, OC);
        check_close("matmul out, threads", o2, out, no);
        check_close("matmul dinp, threads", g2, dinp, ni);
        check_close("matmul dw, threads", h2, dw, nw);
        free(o2), free(g2), free(h2);
    }
    omp_set_num_threads(2);
    free(inp), free(w), free(out), free(dout), free(dinp), free(dw), free(g0), free(h0), free(g), free(h);
}

static void case_embed(int N, int C, int V) {
    char cs[64];
    snprintf(cs, sizeof cs, "embed_%dx%dx%d", N, C, V);
    int *tok = malloc((size_t)N * sizeof *tok);
    REQUIRE(tok, "out of memory");
    for (int i = 0; i < N; i++) tok[i] = (int)(next() % (uint64_t)(V / 2 + 1)); /* repeats */
    if (N > 3) tok[1] = -1, tok[2] = V; /* out of range: zero row, no gradient */
    size_t no = (size_t)N * C, nw = (size_t)V * C;
    float *wte = frand(nw, 1), *out = fnan(no), *dout = frand(no, 1), *dwte = fzero(nw);
    tsr_embed_fwd(out, tok, wte, N, C, V);
    check_finite(cs, out, no);
    tsr_embed_bwd(dwte, dout, tok, N, C, V);
    declare(cs, "embed", "N=%d C=%d V=%d", N, C, V);
    SAVE_I(cs, "tokens", tok, N);
    SAVE(cs, "wte", wte, V, C);
    SAVE(cs, "out", out, N, C);
    SAVE(cs, "dout", dout, N, C);
    SAVE(cs, "dwte", dwte, V, C);
    float *g0 = frand(nw, 1), *g = fcopy(g0, nw);
    tsr_embed_bwd(g, dout, tok, N, C, V);
    check_accum("embed dwte", g, g0, dwte, nw);
    float *ref = fcopy(g0, nw); /* same bits for any thread count */
    omp_set_num_threads(1);
    tsr_embed_bwd(ref, dout, tok, N, C, V);
    for (int t = 2; t <= 3; t++) {
        omp_set_num_threads(t);
        memcpy(g, g0, nw * sizeof *g);
        tsr_embed_bwd(g, dout, tok, N, C, V);
        check_same("embed dwte, threads", g, ref, nw);
    }
    omp_set_num_threads(2);
    free(ref);
    free(tok), free(wte), free(out), free(dout), free(dwte), free(g0), free(g);
}

/* scale: of the inputs; at 0.01, mean(x^2) is near eps, so eps matters. */
static void case_rmsnorm(int N, int C, float scale, float eps) {
    char cs[64];
    snprintf(cs, sizeof cs, "rmsnorm_%dx%d_%g", N, C, scale);
    size_t n = (size_t)N * C;
    float *inp = frand(n, scale), *w = frand((size_t)C, 1), *out = fnan(n), *rstd = fnan((size_t)N);
    float *dout = frand(n, 1), *dinp = fzero(n), *dw = fzero((size_t)C);
    tsr_rmsnorm_fwd(out, rstd, inp, w, N, C, eps);
    check_finite(cs, out, n);
    check_finite(cs, rstd, (size_t)N);
    tsr_rmsnorm_bwd(dinp, dw, dout, inp, w, rstd, N, C);
    declare(cs, "rmsnorm", "N=%d C=%d eps=%.9g", N, C, eps);
    SAVE(cs, "inp", inp, N, C);
    SAVE(cs, "w", w, C);
    SAVE(cs, "out", out, N, C);
    SAVE(cs, "rstd", rstd, N);
    SAVE(cs, "dout", dout, N, C);
    SAVE(cs, "dinp", dinp, N, C);
    SAVE(cs, "dw", dw, C);
    float *g0 = frand(n, 1), *h0 = frand((size_t)C, 1), *g = fcopy(g0, n), *h = fcopy(h0, (size_t)C);
    tsr_rmsnorm_bwd(g, h, dout, inp, w, rstd, N, C);
    check_accum("rmsnorm dinp", g, g0, dinp, n);
    check_accum("rmsnorm dw", h, h0, dw, (size_t)C);
    memcpy(g, g0, n * sizeof *g);
    tsr_rmsnorm_bwd(g, NULL, dout, inp, w, rstd, N, C);
    check_accum("rmsnorm dinp (dw NULL)", g, g0, dinp, n);
    float *ref = fcopy(h0, (size_t)C);
    omp_set_num_threads(1);
    tsr_rmsnorm_bwd(NULL, ref, dout, inp, w, rstd, N, C);
    for (int t = 2; t <= 3; t++) {
        omp_set_num_threads(t);
        memcpy(h, h0, (size_t)C * sizeof *h);
        tsr_rmsnorm_bwd(NULL, h, dout, inp, w, rstd, N, C);
        check_same("rmsnorm dw, threads", h, ref, (size_t)C);
    }
    omp_set_num_threads(2);
    float *x = fcopy(inp, n), *r2 = fbuf((size_t)N); /* out aliasing inp */
    tsr_rmsnorm_fwd(x, r2, x, w, N, C, eps);
    check_same("rmsnorm in place", x, out, n);
    free(inp), free(w), free(out), free(rstd), free(dout), free(dinp), free(dw), free(g0), free(h0), free(g);
    free(h), free(ref), free(x), free(r2);
}

/* scaled: 0 off, 1 Llama 3.1's, 2 a custom one that puts frequencies of hd = 16
 * in all three bands (kept, divided, blended). */
static void case_rope(int B, int T, int H, int hd, float theta, int scaled) {
    char cs[64];
    snprintf(cs, sizeof cs, "rope_%dx%dx%dx%d_s%d", B, T, H, hd, scaled);
    tsr_rope_scaling s = {0};
    if (scaled == 1) s = tsr_rope_llama3_scaling();
    if (scaled == 2) s = (tsr_rope_scaling){.factor = 4, .low_freq_factor = 1, .high_freq_factor = 4, .original_max_pos = 256};
    size_t n = (size_t)B * T * H * hd, nt = (size_t)T * (hd / 2);
    float *ct = fnan(nt), *st = fnan(nt);
    tsr_rope_tables(ct, st, T, hd, theta, scaled ? &s : NULL);
    check_finite(cs, ct, nt);
    float *x = frand(n, 1), *y = fcopy(x, n), *dy = frand(n, 1), *dx = fcopy(dy, n);
    tsr_rope_fwd(y, ct, st, B, T, H, hd);
    tsr_rope_bwd(dx, ct, st, B, T, H, hd);
    declare(cs, "rope", "B=%d T=%d H=%d hd=%d theta=%.9g factor=%.9g low=%.9g high=%.9g orig=%d", B, T, H, hd,
            theta, s.factor, s.low_freq_factor, s.high_freq_factor, s.original_max_pos);
    SAVE(cs, "cos", ct, T, hd / 2);
    SAVE(cs, "sin", st, T, hd / 2);
    SAVE(cs, "x", x, B, T, H, hd);
    SAVE(cs, "out", y, B, T, H, hd);
    SAVE(cs, "dout", dy, B, T, H, hd);
    SAVE(cs, "dx", dx, B, T, H, hd);
    tsr_rope_bwd(y, ct, st, B, T, H, hd); /* the inverse rotation brings x back */
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += !(fabsf(y[i] - x[i]) <= 1e-5f);
    CHECK(bad == 0, "%s: rope_bwd(rope_fwd(x)) != x at %zu elements", cs, bad);
    free(ct), free(st), free(x), free(y), free(dy), free(dx);
}

static void case_attention(int B, int T, int NH, int NKV, int hd) {
    char cs[64];
    snprintf(cs, sizeof cs, "attention_%dx%dx%dx%dx%d", B, T, NH, NKV, hd);
    size_t nq = (size_t)B * T * NH * hd, nk = (size_t)B * T * NKV * hd, na = (size_t)B * NH * T * T;
    float *q = frand(nq, 3), *k = frand(nk, 1), *v = frand(nk, 1), *out = fnan(nq), *att = fnan(na);
    tsr_attention_fwd(out, att, q, k, v, B, T, NH, NKV, hd);
    check_finite(cs, out, nq);
    check_finite(cs, att, na);
    size_t ns = tsr_attention_scratch(B, T, NH, hd);
    CHECK(ns >= na, "%s: scratch of %zu floats", cs, ns);
    float *scratch = fnan(ns), *dout = frand(nq, 1), *dq = fzero(nq), *dk = fzero(nk), *dv = fzero(nk);
    tsr_attention_bwd(dq, dk, dv, scratch, dout, q, k, v, att, B, T, NH, NKV, hd);
    declare(cs, "attention", "B=%d T=%d NH=%d NKV=%d hd=%d", B, T, NH, NKV, hd);
    SAVE(cs, "q", q, B, T, NH, hd);
    SAVE(cs, "k", k, B, T, NKV, hd);
    SAVE(cs, "v", v, B, T, NKV, hd);
    SAVE(cs, "out", out, B, T, NH, hd);
    SAVE(cs, "att", att, B, NH, T, T);
    SAVE(cs, "dout", dout, B, T, NH, hd);
    SAVE(cs, "dq", dq, B, T, NH, hd);
    SAVE(cs, "dk", dk, B, T, NKV, hd);
    SAVE(cs, "dv", dv, B, T, NKV, hd);
    float *g0 = frand(nq, 1), *h0 = frand(nk, 1), *u0 = frand(nk, 1);
    float *g = fcopy(g0, nq), *h = fcopy(h0, nk), *u = fcopy(u0, nk);
    for (size_t i = 0; i < ns; i++) scratch[i] = NAN;
    tsr_attention_bwd(g, h, u, scratch, dout, q, k, v, att, B, T, NH, NKV, hd);
    check_accum("attention dq", g, g0, dq, nq);
    check_accum("attention dk", h, h0, dk, nk);
    check_accum("attention dv", u, u0, dv, nk);
    memcpy(h, h0, nk * sizeof *h);
    tsr_attention_bwd(NULL, h, NULL, scratch, dout, q, k, v, att, B, T, NH, NKV, hd);
    check_accum("attention dk (dq, dv NULL)", h, h0, dk, nk);
    memcpy(u, u0, nk * sizeof *u);
    tsr_attention_bwd(NULL, NULL, u, scratch, dout, q, k, v, att, B, T, NH, NKV, hd);
    check_accum("attention dv (dq, dk NULL)", u, u0, dv, nk);
    for (int t = 1; t <= 3; t += 2) {
        omp_set_num_threads(t);
        float *o2 = fnan(nq), *a2 = fnan(na), *k2 = fzero(nk);
        tsr_attention_fwd(o2, a2, q, k, v, B, T, NH, NKV, hd);
        tsr_attention_bwd(NULL, k2, NULL, scratch, dout, q, k, v, a2, B, T, NH, NKV, hd);
        check_same("attention out, threads", o2, out, nq);
        check_same("attention dk, threads", k2, dk, nk);
        free(o2), free(a2), free(k2);
    }
    omp_set_num_threads(2);
    free(q), free(k), free(v), free(out), free(att), free(scratch), free(dout), free(dq), free(dk), free(dv);
    free(g0), free(h0), free(u0), free(g), free(h), free(u);
}

static void case_swiglu(size_t n) {
    char cs[64];
    snprintf(cs, sizeof cs, "swiglu_%zu", n);
    float *gate = frand(n, 4), *up = frand(n, 1), *out = fnan(n), *dout = frand(n, 1), *dg = fzero(n), *du = fzero(n);
    tsr_swiglu_fwd(out, gate, up, n);
    check_finite(cs, out, n);
    tsr_swiglu_bwd(dg, du, dout, gate, up, n);
    declare(cs, "swiglu", "n=%zu", n);
    SAVE(cs, "gate", gate, (int)n);
    SAVE(cs, "up", up, (int)n);
    SAVE(cs, "out", out, (int)n);
    SAVE(cs, "dout", dout, (int)n);
    SAVE(cs, "dgate", dg, (int)n);
    SAVE(cs, "dup", du, (int)n);
    float *g0 = frand(n, 1), *h0 = frand(n, 1), *g = fcopy(g0, n), *h = fcopy(h0, n);
    tsr_swiglu_bwd(g, h, dout, gate, up, n);
    check_accum("swiglu dgate", g, g0, dg, n);
    check_accum("swiglu dup", h, h0, du, n);
    memcpy(h, h0, n * sizeof *h);
    tsr_swiglu_bwd(NULL, h, dout, gate, up, n);
    check_accum("swiglu dup (dgate NULL)", h, h0, du, n);
    free(gate), free(up), free(out), free(dout), free(dg), free(du), free(g0), free(h0), free(g), free(h);
}

/* The vocabulary-parallel cross-entropy against the whole one: the columns cut
 * into `parts` as a tp layout cuts them (the last parts empty when V is small),
 * each part's stats gathered, then each part's probabilities, losses (summed
 * over the parts: each row's loss comes from the part holding its target) and
 * gradient put side by side. */
static void check_xent_parts(const char *cs, const float *logits, const int *tgt, const float *dloss, int N, int V,
                             const float *losses, const float *probs, const float *dl, int count, int parts) {
    size_t n = (size_t)N * V;
    int per = V / parts + (V % parts != 0), total = 0;
    float *stats = fnan((size_t)parts * 2 * N), *P = fnan(n), *D = fzero(n), *L = fzero((size_t)N);
    for (int r = 0; r < parts; r++) {
        int v0 = per * r < V ? per * r : V, Vt = V - v0 < per ? V - v0 : per;
        float *x = fnan((size_t)N * Vt + 1);
        for (int i = 0; i < N; i++) memcpy(x + (size_t)i * Vt, logits + (size_t)i * V + v0, (size_t)Vt * sizeof *x);
        tsr_xent_part_stats(stats + (size_t)r * 2 * N, x, N, Vt);
        free(x);
    }
    for (int r = 0; r < parts; r++) {
        int v0 = per * r < V ? per * r : V, Vt = V - v0 < per ? V - v0 : per;
        float *x = fnan((size_t)N * Vt + 1), *l = fnan((size_t)N), *d = fzero((size_t)N * Vt + 1);
        for (int i = 0; i < N; i++) memcpy(x + (size_t)i * Vt, logits + (size_t)i * V + v0, (size_t)Vt * sizeof *x);
        total += tsr_xent_part_fwd(l, x, x, tgt, N, Vt, v0, stats, parts); /* in place */
        tsr_xent_part_bwd(d, x, tgt, dloss, N, Vt, v0, V);
        for (int i = 0; i < N; i++) {
            L[i] += l[i];
            memcpy(P + (size_t)i * V + v0, x + (size_t)i * Vt, (size_t)Vt * sizeof *x);
            memcpy(D + (size_t)i * V + v0, d + (size_t)i * Vt, (size_t)Vt * sizeof *x);
        }
        free(x), free(l), free(d);
    }
    char what[96];
    CHECK(total == count, "%s in %d parts: %d targets counted, the whole %d", cs, parts, total, count);
    snprintf(what, sizeof what, "%s in %d parts: losses", cs, parts);
    check_close(what, L, losses, (size_t)N);
    snprintf(what, sizeof what, "%s in %d parts: probs", cs, parts);
    check_close(what, P, probs, n);
    snprintf(what, sizeof what, "%s in %d parts: dlogits", cs, parts);
    check_close(what, D, dl, n);
    free(stats), free(P), free(D), free(L);
}

static void case_xent(int N, int V, float scale) {
    char cs[64];
    snprintf(cs, sizeof cs, "xent_%dx%d", N, V);
    size_t n = (size_t)N * V;
    int *tgt = malloc((size_t)N * sizeof *tgt);
    REQUIRE(tgt, "out of memory");
    int ignored = 0;
    for (int i = 0; i < N; i++) tgt[i] = (int)(next() % (uint64_t)V);
    if (N > 2) tgt[0] = -1, tgt[N - 1] = -100, tgt[1] = V - 1, ignored = 2;
    if (N > 4) tgt[3] = V, ignored++; /* out of range: ignored too */
    float *logits = frand(n, scale), *probs = fnan(n), *losses = fnan((size_t)N), *dloss = frand((size_t)N, 1);
    if (N > 2) logits[(size_t)1 * V] = 80.0f; /* a large logit: needs the max subtracted */
    int count = tsr_xent_fwd(losses, probs, logits, tgt, N, V);
    CHECK(count == N - ignored, "%s: %d targets counted, expected %d", cs, count, N - ignored);
    check_finite(cs, probs, n);
    float *dl = fzero(n);
    tsr_xent_bwd(dl, probs, tgt, dloss, N, V);
    check_xent_parts(cs, logits, tgt, dloss, N, V, losses, probs, dl, count, 2);
    check_xent_parts(cs, logits, tgt, dloss, N, V, losses, probs, dl, count, 3);
    declare(cs, "xent", "N=%d V=%d count=%d", N, V, count);
    SAVE_I(cs, "targets", tgt, N);
    SAVE(cs, "logits", logits, N, V);
    SAVE(cs, "losses", losses, N);
    SAVE(cs, "probs", probs, N, V);
    SAVE(cs, "dloss", dloss, N);
    SAVE(cs, "dlogits", dl, N, V);
    float *g0 = frand(n, 1), *g = fcopy(g0, n);
    tsr_xent_bwd(g, probs, tgt, dloss, N, V);
    check_accum("xent dlogits", g, g0, dl, n);
    float *x = fcopy(logits, n), *l2 = fnan((size_t)N); /* probs written over logits */
    int c2 = tsr_xent_fwd(l2, x, x, tgt, N, V);
    CHECK(c2 == count, "xent in place count");
    check_same("xent in place probs", x, probs, n);
    check_same("xent in place losses", l2, losses, (size_t)N);
    free(tgt), free(logits), free(probs), free(losses), free(dloss), free(dl), free(g0), free(g), free(x), free(l2);
}

/* steps AdamW steps from step t0 (state m0, v0), with a fresh gradient each step. */
static void case_adamw(size_t n, long t0, int steps, float lr, float wd, float gscale) {
    char cs[64];
    snprintf(cs, sizeof cs, "adamw_%zu_t%ld", n, t0);
    float b1 = 0.9f, b2 = 0.95f, eps = 1e-8f;
    float *p0 = frand(n, 1), *m0 = t0 ? frand(n, 0.1f) : fzero(n), *v0 = fbuf(n);
    for (size_t i = 0; i < n; i++) v0[i] = t0 ? 0.01f * (1.0f + unif()) : 0.0f;
    float *g = frand(n * (size_t)steps, 1), *p = fcopy(p0, n), *m = fcopy(m0, n), *v = fcopy(v0, n);
    for (int s = 0; s < steps; s++) tsr_adamw(p, g + (size_t)s * n, gscale, m, v, n, lr, b1, b2, eps, wd, t0 + 1 + s);
    declare(cs, "adamw", "n=%zu t0=%ld steps=%d lr=%.9g beta1=%.9g beta2=%.9g eps=%.9g wd=%.9g gscale=%.9g", n, t0,
            steps, lr, b1, b2, eps, wd, gscale);
    SAVE(cs, "p0", p0, (int)n);
    SAVE(cs, "m0", m0, (int)n);
    SAVE(cs, "v0", v0, (int)n);
    SAVE(cs, "g", g, steps, (int)n);
    SAVE(cs, "p", p, (int)n);
    SAVE(cs, "m", m, (int)n);
    SAVE(cs, "v", v, (int)n);
    free(p0), free(m0), free(v0), free(g), free(p), free(m), free(v);
}

static void case_sumsq(size_t n) {
    char cs[64];
    snprintf(cs, sizeof cs, "sumsq_%zu", n);
    float *x = frand(n, 3), *y = fcopy(x, n);
    double ss = tsr_sumsq(x, n);
    for (int t = 1; t <= 3; t++) {
        omp_set_num_threads(t);
        double s2 = tsr_sumsq(x, n);
        CHECK(memcmp(&s2, &ss, sizeof ss) == 0, "%s: sum of squares differs with %d threads", cs, t);
    }
    omp_set_num_threads(2);
    declare(cs, "sumsq", "n=%zu", n);
    SAVE(cs, "x", x, (int)n);
    save(cs, "sumsq", "f64", &ss, 0, NULL);
    free(x), free(y);
}

/* tsr_exp against exp() in double over the whole float range it covers, and at
 * the ends; tsr_rowmax against a plain loop. */
static void check_exp(void) {
    double worst = 0;
    for (double x = -87.5; x <= 88.3; x += 1.7e-4) {
        float y = tsr_exp((float)x);
        double ref = exp((double)(float)x), rel = fabs(y - ref) / ref;
        if (rel > worst) worst = rel;
    }
    CHECK(worst <= 2e-7, "tsr_exp: relative error %.3g", worst);
    float big[] = {88.5f, 100.0f, 1e30f, INFINITY}, tiny[] = {-87.8f, -100.0f, -1e9f, -3.4e38f, -INFINITY};
    for (size_t i = 0; i < sizeof big / sizeof *big; i++) CHECK(tsr_exp(big[i]) == INFINITY, "tsr_exp(%g)", big[i]);
    for (size_t i = 0; i < sizeof tiny / sizeof *tiny; i++) CHECK(tsr_exp(tiny[i]) == 0.0f, "tsr_exp(%g)", tiny[i]);
    CHECK(isnan(tsr_exp(NAN)) && isnan(tsr_exp(-NAN)), "tsr_exp(NaN) must be NaN");
    CHECK(tsr_exp(0.0f) == 1.0f, "tsr_exp(0) = %.9g", tsr_exp(0.0f));
    for (int n = 1; n <= 40; n++) {
        float x[40], mx = -INFINITY;
        for (int j = 0; j < n; j++) x[j] = unif(), mx = x[j] > mx ? x[j] : mx;
        CHECK(tsr_rowmax(x, n) == mx, "tsr_rowmax of %d", n);
    }
}

int main(void) {
    tmp = getenv("TSR_TMP");
    const char *root = getenv("TSR_ROOT"), *py = getenv("TSR_PY");
    REQUIRE(tmp && root && py, "TSR_TMP, TSR_ROOT and TSR_PY must be set (tests/run.sh sets them)");
    char path[4096];
    snprintf(path, sizeof path, "%s/kernels.idx", tmp);
    idx = fopen(path, "w");
    REQUIRE(idx, "cannot create %s", path);
    omp_set_num_threads(2);

    check_exp();
    check_mem();
    case_matmul(1, 1, 1);
    case_matmul(5, 7, 3);
    case_matmul(33, 130, 257); /* cut by columns of out */
    case_matmul(300, 64, 40);  /* cut by rows of out */
    case_embed(1, 3, 2);
    case_embed(10, 70, 13);
    case_rmsnorm(1, 3, 2, 1e-5f); /* (C = 1 is ill-conditioned in float32: dx is proportional to eps) */
    case_rmsnorm(3, 5, 2, 1e-5f);
    case_rmsnorm(67, 130, 2, 1e-5f);
    case_rmsnorm(40, 33, 0.01f, 1e-5f);
    case_rope(2, 5, 3, 8, 10000.0f, 0);
    case_rope(1, 300, 2, 16, 10000.0f, 2);
    case_rope(1, 9000, 1, 128, 500000.0f, 1); /* past 8192 with Llama 3.1's scaling */
    case_rope(2, 1, 1, 4, 500000.0f, 1);
    case_attention(2, 70, 4, 2, 16);  /* GQA, a partial second block */
    case_attention(1, 1, 3, 3, 8);    /* T = 1 */
    case_attention(1, 130, 6, 1, 12); /* one kv head, three blocks */
    case_attention(2, 64, 2, 2, 32);  /* multi-head, exactly one block */
    case_attention(1, 9, 8, 2, 5);    /* odd sizes */
    case_swiglu(1);
    case_swiglu(1001);
    case_xent(1, 1, 1);
    case_xent(9, 11, 3);
    case_xent(4, 1000, 5);
    case_adamw(1000, 0, 3, 0.05f, 0.1f, 1.0f);
    case_adamw(257, 999, 2, 0.01f, 0.0f, 0.375f);
    case_adamw(200003, 5, 2, 0.01f, 0.1f, 0.8125f); /* split over threads */
    case_sumsq(1);
    case_sumsq(300007);
    REQUIRE(fclose(idx) == 0, "cannot write %s", path);

    if (check_done()) return 1;
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' '%s/tests/ref_kernels.py' '%s'", py, root, tmp);
    int rc = system(cmd);
    if (rc == -1 || !WIFEXITED(rc)) REQUIRE(0, "cannot run %s", cmd);
    /* 3: ref_kernels.py could not import torch; 127: no such interpreter. A
     * missing reference is a failure, not a skip: these kernels must be checked. */
    if (WEXITSTATUS(rc) == 3 || WEXITSTATUS(rc) == 127) {
        fprintf(stderr, "%s has no torch: the tests' Python environment is tests/py_setup.sh's\n", py);
        return 1;
    }
    CHECK(rc == 0, "tests/ref_kernels.py: the kernels disagree with PyTorch (exit status %d)", WEXITSTATUS(rc));
    return check_done();
}
