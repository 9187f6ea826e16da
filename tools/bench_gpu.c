/* bench_gpu.c: tessera bench gpu: the GPU's bf16 matrix rate (cuBLASLt,
 * 8192^3, the baseline of model FLOP/s), and what a checkpoint of device state
 * costs the GPU, each figure against a baseline measured in the same run.
 *   staging rate = bytes of device state staged per second by a save (from the
 *       call until tsr_engine_staged returns) / a plain cudaMemcpy of the same
 *       bytes into page-locked memory (cudaHostAlloc): goal at least 0.8x;
 *   blocked = the time a stand-in training loop is held per save: the save call,
 *       and its wait before the next "optimizer step" for the copy to finish
 *       (tsr_engine_staged): goal under 10 ms;
 *   step cost = mean step time with a save every K steps / without saves: goal
 *       at most 1.03.
 * The stand-in step is a chain of f32 matrix products (cuBLAS) on a stream of
 * its own, about 200 ms long (--step-ms); the state is tensors of 256 MiB in
 * device memory. A save that takes longer to commit than the steps between saves
 * holds the next one (the blocked time says how much of it was that wait).
 * Only in the CUDA build, on a machine with a GPU (else it exits 77). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "commands.h"
#include "tessera.h"

static const char gpu_help[] =
    "usage: tessera bench gpu --dir DIR [--bytes SIZE] [--steps N] [--every K] [--step-ms MS] [--json]\n"
    "  The bf16 matrix rate (cuBLASLt, 8192^3, random operands), then what saving\n"
    "  device state costs a GPU training loop: the staging rate against\n"
    "  a pinned cudaMemcpy, the time the loop is blocked per save, and step time with\n"
    "  a save every K steps (default 10) against none, over N steps (default 30) of\n"
    "  a stand-in step of about MS milliseconds (default 200) of matrix products.\n"
    "  SIZE: the state's bytes (default 4G). DIR: where the checkpoints go (memory,\n"
    "  such as /dev/shm, keeps the disk out of it). Exits 77 without a GPU.\n";

#ifndef TSR_CUDA
int tsr_cmd_bench_gpu(int argc, char **argv) {
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) return fputs(gpu_help, stdout), EXIT_OK;
    fprintf(stderr, "tessera bench gpu: this build has no CUDA (make CUDA=1)\n");
    return 77;
}
#else
#include <cuda_runtime.h>

#include "casts.h"
#include "mem.h"
#include "tsr_cuda.h"

enum { PIECE = 256u << 20, GEMM_N = 4096 };

typedef struct gpu_state {
    size_t n; /* tensors */
    float **t;
    tsr_tensor_decl *decls;
    tsr_state_box *boxes;
    char (*names)[32];
} gpu_state;

static int state_new(gpu_state *g, size_t bytes, tsr_error *e) {
    memset(g, 0, sizeof *g);
    g->n = (bytes + PIECE - 1) / PIECE;
    g->t = calloc(g->n, sizeof *g->t);
    g->decls = calloc(g->n, sizeof *g->decls);
    g->boxes = calloc(g->n, sizeof *g->boxes);
    g->names = calloc(g->n, sizeof *g->names);
    if (!g->t || !g->decls || !g->boxes || !g->names) return tsr_err(e, TSR_ENOMEM, "out of memory");
    for (size_t i = 0; i < g->n; i++) {
        uint64_t elems = PIECE / 4;
        if (!(g->t[i] = tsr_mem_alloc(TSR_MEM_CUDA, PIECE, e))) return e->code;
        tsr_cuda_fill(g->t[i], elems, (float)i * 0.001f + 0.5f, NULL);
        snprintf(g->names[i], sizeof g->names[i], "model.t%zu", i);
        g->decls[i] = (tsr_tensor_decl){g->names[i], "model", TSR_F32, 1, {elems}, {-1, 0, TSR_PP_ALL, -1}};
        g->boxes[i] = (tsr_state_box){(uint32_t)i, {1, {0}, {elems}}, g->t[i], TSR_MEM_CUDA};
    }
    return tsr_cuda_sync(NULL, e);
}

static void state_free(gpu_state *g) {
    for (size_t i = 0; g->t && i < g->n; i++) tsr_mem_free(TSR_MEM_CUDA, g->t[i]);
    free(g->t), free(g->decls), free(g->boxes), free(g->names);
}

/* Seconds of a plain copy of the state into page-locked memory, best of 3. */
static double pinned_copy(const gpu_state *g, tsr_error *e) {
    void *h = NULL;
    if (cudaHostAlloc(&h, (size_t)g->n * PIECE, cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError();
        return tsr_err(e, TSR_ENOMEM, "cudaHostAlloc of %zu bytes failed", (size_t)g->n * PIECE), -1;
    }
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        double t0 = tsr_now();
        for (size_t i = 0; i < g->n; i++)
            if (cudaMemcpy((char *)h + i * PIECE, g->t[i], PIECE, cudaMemcpyDeviceToHost) != cudaSuccess) {
                cudaFreeHost(h);
                return tsr_err(e, TSR_EIO, "cudaMemcpy: %s", cudaGetErrorString(cudaGetLastError())), -1;
            }
        double t = tsr_now() - t0;
        if (t < best) best = t;
    }
    cudaFreeHost(h);
    return best;
}

/* TFLOP/s of out = inp @ w^T in bf16 through cuBLASLt at n x n x n on random
 * operands: the median of 10 products after 3, timed with events. */
static double gemm_rate(int n, tsr_error *e) {
    size_t nn = (size_t)n * n;
    uint16_t *h = malloc(nn * 2), *a = NULL, *b = NULL, *c = NULL;
    if (!h) return tsr_err(e, TSR_ENOMEM, "out of memory"), -1;
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < nn; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        h[i] = tsr_f32_to_bf16((float)(x >> 40) / 16777216.0f - 0.5f);
    }
    double rate = -1;
    cudaEvent_t t0 = NULL, t1 = NULL;
    float ms[10];
    if (!(a = tsr_mem_alloc(TSR_MEM_CUDA, nn * 2, e)) || !(b = tsr_mem_alloc(TSR_MEM_CUDA, nn * 2, e)) ||
        !(c = tsr_mem_alloc(TSR_MEM_CUDA, nn * 2, e)) || tsr_mem_from_host(a, h, nn * 2, TSR_MEM_CUDA, e) ||
        tsr_mem_from_host(b, h, nn * 2, TSR_MEM_CUDA, e))
        goto out;
    if (cudaEventCreate(&t0) != cudaSuccess || cudaEventCreate(&t1) != cudaSuccess) {
        tsr_err(e, TSR_EIO, "cannot create events");
        goto out;
    }
    for (int r = 0; r < 13; r++) {
        cudaEventRecord(t0, NULL);
        if (tsr_cuda_matmul_bf16_fwd(c, a, b, n, n, n, NULL)) {
            tsr_err(e, TSR_EIO, "cuBLASLt refused a %d^3 bf16 product", n);
            goto out;
        }
        cudaEventRecord(t1, NULL);
        if (cudaEventSynchronize(t1) != cudaSuccess) {
            tsr_err(e, TSR_EIO, "bf16 product: %s", cudaGetErrorString(cudaGetLastError()));
            goto out;
        }
        if (r >= 3) cudaEventElapsedTime(&ms[r - 3], t0, t1);
    }
    for (int i = 1; i < 10; i++) /* insertion sort: the median */
        for (int j = i; j > 0 && ms[j] < ms[j - 1]; j--) {
            float t = ms[j];
            ms[j] = ms[j - 1], ms[j - 1] = t;
        }
    rate = 2.0 * n * n * (double)n / ((ms[4] + ms[5]) / 2 * 1e-3) / 1e12;
out:
    if (t0) cudaEventDestroy(t0);
    if (t1) cudaEventDestroy(t1);
    tsr_mem_free(TSR_MEM_CUDA, a), tsr_mem_free(TSR_MEM_CUDA, b), tsr_mem_free(TSR_MEM_CUDA, c);
    free(h);
    return rate;
}

typedef struct loop_result {
    double step_s;    /* mean */
    double blocked_s; /* per save */
    double prev_s;    /* of which waiting for the previous save to finish, per save */
    int saves;
} loop_result;

/* steps stand-in steps of `chain` matrix products on stream s, with a save
 * every `every` steps (0: none). */
static int run_loop(tsr_engine *eng, const tsr_state *st, int steps, int every, int chain, float *m[3],
                    tsr_stream *s, uint64_t step0, loop_result *r, tsr_error *e) {
    memset(r, 0, sizeof *r);
    double total = 0;
    for (int k = 1; k <= steps; k++) {
        double t0 = tsr_now();
        for (int i = 0; i < chain; i++)
            if (tsr_cuda_matmul_fwd(m[(i + 1) % 2 ? 2 : 0], m[i % 2 ? 2 : 0], m[1], GEMM_N, GEMM_N, GEMM_N, s))
                return tsr_err(e, TSR_EIO, "cuBLAS refused a matrix product");
        if (tsr_cuda_sync(s, e)) return e->code;
        /* the optimizer step would write the state now: the last save's copy must be done */
        double tw = tsr_now();
        tsr_engine_staged(eng);
        r->blocked_s += tsr_now() - tw;
        if (every && k % every == 0) {
            double ts = tsr_now();
            if (tsr_engine_save(eng, step0 + (uint64_t)k, st, e)) return e->code;
            r->blocked_s += tsr_now() - ts;
            r->prev_s += tsr_engine_last_wait(eng);
            r->saves++;
        }
        total += tsr_now() - t0;
    }
    tsr_engine_staged(eng);
    r->step_s = total / steps;
    if (r->saves) r->blocked_s /= r->saves, r->prev_s /= r->saves;
    return tsr_engine_wait(eng, e);
}

int tsr_cmd_bench_gpu(int argc, char **argv) {
    const char *dir = NULL, *v;
    uint64_t bytes = 4ull << 30, steps = 30, every = 10, step_ms = 200;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        int r;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return fputs(gpu_help, stdout), EXIT_OK;
        if ((r = tsr_opt(argc, argv, &i, "dir", 1, &v))) {
            if (r < 0) return EXIT_USAGE;
            dir = v;
        } else if ((r = tsr_opt(argc, argv, &i, "bytes", 1, &v))) {
            if (r < 0 || tsr_parse_size(v, &bytes) || bytes < PIECE)
                return tsr_usage_error("bench gpu", "--bytes takes a size of at least 256M");
        } else if ((r = tsr_opt(argc, argv, &i, "steps", 1, &v))) {
            if (r < 0 || tsr_parse_u64(v, &steps) || steps < 1 || steps > 100000)
                return tsr_usage_error("bench gpu", "--steps takes a count from 1 to 100000");
        } else if ((r = tsr_opt(argc, argv, &i, "every", 1, &v))) {
            if (r < 0 || tsr_parse_u64(v, &every) || every < 1 || every > 100000)
                return tsr_usage_error("bench gpu", "--every takes a count from 1 to 100000");
        } else if ((r = tsr_opt(argc, argv, &i, "step-ms", 1, &v))) {
            if (r < 0 || tsr_parse_u64(v, &step_ms) || step_ms < 1 || step_ms > 100000)
                return tsr_usage_error("bench gpu", "--step-ms takes milliseconds from 1 to 100000");
        } else if (tsr_opt(argc, argv, &i, "json", 0, &v)) {
            json = 1;
        } else {
            return tsr_usage_error("bench gpu", "unknown argument %s", argv[i]);
        }
    }
    if (!dir) return tsr_usage_error("bench gpu", "missing --dir DIR");
    if (tsr_cuda_devices() == 0) {
        fprintf(stderr, "tessera bench gpu: no GPU on this machine\n");
        return 77;
    }
    mkdir(dir, 0755);
    tsr_error e = {0};
    double tflops = gemm_rate(8192, &e);
    if (tflops < 0) {
        fprintf(stderr, "tessera bench gpu: %s\n", e.msg);
        return EXIT_FAIL;
    }
    if (!json) printf("gemm: bf16 8192^3 through cuBLASLt (f32 accumulation): %.0f TFLOP/s\n", tflops);
    gpu_state g;
    tsr_engine *eng = NULL;
    float *m[3] = {0};
    cudaStream_t cs = NULL;
    int rc = state_new(&g, (size_t)bytes, &e);
    size_t total = g.n * (size_t)PIECE;
    double pinned = rc ? -1 : pinned_copy(&g, &e);
    if (pinned < 0) rc = e.code ? e.code : TSR_EIO;
    tsr_comm *comm = tsr_comm_self();
    tsr_engine_opts o = tsr_engine_opts_default();
    o.overlap_staging = 1;
    o.keep_latest = 1;
    o.write.codec = TSR_CODEC_RAW; /* the copy is measured here, not the codec */
    if (!rc && !(eng = tsr_engine_new(dir, comm, &o, &e))) rc = e.code ? e.code : TSR_EIO;
    tsr_state st = {g.decls, g.n, g.boxes, g.n, NULL, 0, {1, 1, 1, 1, 0, 0}};
    /* the first save reserves and pins the arena: not measured */
    if (!rc) rc = tsr_engine_save(eng, 1, &st, &e) || tsr_engine_wait(eng, &e);
    double staged = 1e30, commit = 1e30;
    for (int r = 0; !rc && r < 3; r++) {
        double t0 = tsr_now();
        if ((rc = tsr_engine_save(eng, 2 + (uint64_t)r, &st, &e))) break;
        tsr_engine_staged(eng);
        double t = tsr_now() - t0;
        if (t < staged) staged = t;
        rc = tsr_engine_wait(eng, &e);
        t = tsr_now() - t0;
        if (t < commit) commit = t;
    }
    for (int i = 0; !rc && i < 3; i++)
        if (!(m[i] = tsr_mem_alloc(TSR_MEM_CUDA, (size_t)GEMM_N * GEMM_N * 4, &e))) rc = e.code;
    if (!rc && cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking) != cudaSuccess)
        rc = tsr_err(&e, TSR_EIO, "cannot create a stream");
    /* a chain of about step_ms */
    int chain = 1;
    if (!rc) {
        /* weights of 1/N keep the chain's values where they started */
        tsr_cuda_fill(m[0], (size_t)GEMM_N * GEMM_N, 0.01f, NULL), tsr_cuda_fill(m[1], (size_t)GEMM_N * GEMM_N, 1.0f / GEMM_N, NULL);
        rc = tsr_cuda_sync(NULL, &e);
        loop_result cal;
        /* twice: the first pays for cuBLAS's start */
        for (int r = 0; r < 2 && !rc; r++) rc = run_loop(eng, &st, 2, 0, 8, m, (tsr_stream *)cs, 100, &cal, &e);
        if (!rc) chain = (int)(step_ms * 1e-3 / (cal.step_s / 8)) + 1;
    }
    loop_result none = {0}, with = {0};
    if (!rc) rc = run_loop(eng, &st, (int)steps, 0, chain, m, (tsr_stream *)cs, 1000, &none, &e);
    if (!rc) rc = run_loop(eng, &st, (int)steps, (int)every, chain, m, (tsr_stream *)cs, 1000, &with, &e);
    if (cs) cudaStreamDestroy(cs);
    for (int i = 0; i < 3; i++) tsr_mem_free(TSR_MEM_CUDA, m[i]);
    if (eng) tsr_engine_free(eng);
    tsr_comm_free(comm);
    state_free(&g);
    if (rc) {
        fprintf(stderr, "tessera bench gpu: %s\n", e.msg);
        return EXIT_FAIL;
    }
    double gbs = total / staged / 1e9, pin_gbs = total / pinned / 1e9, ratio = pinned / staged;
    double cost = with.step_s / none.step_s;
    int ok = ratio >= 0.8 && with.blocked_s < 0.010 && cost <= 1.03;
    if (json) {
        printf("{\"gemm_bf16_tflops\":%.1f,\"bytes\":%zu,\"staging_gbs\":%.2f,\"pinned_gbs\":%.2f,\"staging_ratio\":%.3f,\"blocked_ms\":%.3f,"
               "\"prev_wait_ms\":%.3f,\"commit_s\":%.3f,\"step_ms\":%.2f,\"step_ms_saves\":%.2f,\"step_cost\":%.4f,\"ok\":%s}\n",
               tflops, total, gbs, pin_gbs, ratio, with.blocked_s * 1e3, with.prev_s * 1e3, commit, none.step_s * 1e3, with.step_s * 1e3, cost,
               ok ? "true" : "false");
    } else {
        printf("save: %.2f GiB of device state (%zu tensors)\n", total / 1073741824.0, g.n);
        printf("  staging        %7.2f GB/s  pinned cudaMemcpy %.2f GB/s  ratio %.2fx (goal >= 0.8)  %s\n", gbs,
               pin_gbs, ratio, ratio >= 0.8 ? "ok" : "MISSED");
        printf("  commit         %7.3f s a save, staged to written to %s (%.2f GB/s)\n", commit, dir,
               total / commit / 1e9);
        printf("  blocked        %7.3f ms a save (%d saves, every %llu steps; goal < 10 ms; %.3f ms of it waiting for "
               "the save before)  %s\n",
               with.blocked_s * 1e3, with.saves, (unsigned long long)every, with.prev_s * 1e3,
               with.blocked_s < 0.010 ? "ok" : "MISSED");
        printf("  step           %7.2f ms without saves, %.2f ms with: %+.2f%% (goal <= 3%%)  %s\n", none.step_s * 1e3,
               with.step_s * 1e3, (cost - 1) * 100, cost <= 1.03 ? "ok" : "MISSED");
    }
    return ok ? EXIT_OK : EXIT_FAIL;
}
#endif
