/* bench_gemm.c: `tessera bench gemm --config FILE [--section.key=value ...]
 * [--seconds S] [--json]`.
 *
 * The machine's single-precision GEMM throughput on the model's own matrix
 * products: the baseline that the trainer's model FLOP/s is measured against.
 *
 * One training step on one rank (tp = 1) of the config's model, batch B and
 * sequence length T (N = B * T rows) makes, for each linear layer with weight
 * (OC, C) - wq, wk, wv, wo, w1, w2, w3 in each of the n_layers layers, and the
 * output head -
 *   forward   out (N,OC)  = inp (N,C) @ w^T        2 N C OC FLOP
 *   backward  dinp (N,C) += dout (N,OC) @ w        2 N C OC FLOP
 *             dw (OC,C)  += dout^T (OC,N) @ inp    2 N C OC FLOP
 * that is 6 N P FLOP for P matmul parameters (the weights of those layers: not
 * the embedding, not the norms). This runs exactly those products, on random
 * operands, as many whole steps' worth as fit in --seconds (at least 3 each,
 * the two variants below alternating step by step), and reports the best
 * step's throughput of each:
 *   blas   each product one cblas_sgemm, OpenBLAS's own threads;
 *   split  each product through the trainer's kernel (kernels/matmul.c), which
 *          cuts it into one single-threaded sgemm per OpenMP thread;
 * both with the trainer's thread count (tsr_cli_set_threads). The peak is the
 * better of the two.
 *
 * It also prints the model's FLOP per token as the trainer's figure counts it:
 *   6 P + 6 n_layers T D
 * (D = n_heads * head_dim): 6 P for the matmuls above, and 6 L T D for the
 * attention scores QK^T and the weighted sum PV over the causal half of the
 * T x T matrix (2 products of 2 D T / 2 FLOP per token forward, twice that
 * backward). Model FLOP/s = tokens/s * FLOP per token. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "commands.h"
#include "config.h"
#include "matmul.h"
#include "model.h"

static void usage(FILE *f) {
    fputs("usage: tessera bench gemm --config FILE [--section.key=value ...] [--seconds S] [--json]\n"
          "  The single-precision GEMM throughput of this machine on the matrix products of\n"
          "  one training step of the config's model (forward and both backward products of\n"
          "  every linear layer, batch x seq_len rows, one rank), with the trainer's threads:\n"
          "  as plain OpenBLAS sgemm calls and through the trainer's matmul kernel; the\n"
          "  better is the peak. Also the model's FLOP per token, 6 P + 6 n_layers T D.\n"
          "  --seconds S  time to spend (default 20; at least 3 steps of each variant)\n"
          "  --json       print one JSON object\n",
          f);
}

typedef struct shape {
    const char *name;
    int C, OC, count; /* weight (OC, C), used `count` times a step */
} shape;

typedef struct operands {
    float *inp, *w, *out, *dout, *dinp, *dw;
} operands;

static void fill(float *p, size_t n, uint64_t *s) {
    for (size_t i = 0; i < n; i++) {
        *s = *s * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (float)((double)(*s >> 40) / (double)(1 << 24) - 0.5) * 0.1f;
    }
}

/* One step's products; split: through tsr_matmul_*, else plain cblas_sgemm. */
static void step_products(const shape *sh, int nsh, int N, const operands *o, int split) {
    for (int k = 0; k < nsh; k++) {
        int C = sh[k].C, OC = sh[k].OC;
        for (int r = 0; r < sh[k].count; r++) {
            if (split) {
                tsr_matmul_fwd(o->out, o->inp, o->w, N, C, OC);
                tsr_matmul_bwd(o->dinp, o->dw, o->dout, o->inp, o->w, N, C, OC);
            } else {
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, o->inp, C, o->w, C, 0.0f, o->out,
                            OC);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, o->dout, OC, o->w, C, 1.0f,
                            o->dinp, C);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, o->dout, OC, o->inp, C, 1.0f,
                            o->dw, C);
            }
        }
    }
}

/* The best step time of each variant (best[0] blas, best[1] split) in about
 * `seconds`: the two alternate, step by step, so that both meet the same load
 * from the rest of the machine; at least 3 steps each, after one warm-up. */
static void time_steps(const shape *sh, int nsh, int N, const operands *o, double seconds, double best[2],
                       int steps[2]) {
    for (int split = 0; split < 2; split++) {
        step_products(sh, nsh, N, o, split);
        best[split] = INFINITY;
        steps[split] = 0;
    }
    double start = tsr_now();
    while (steps[1] < 3 || tsr_now() - start < seconds) {
        for (int split = 0; split < 2; split++) {
            double t0 = tsr_now();
            step_products(sh, nsh, N, o, split);
            double dt = tsr_now() - t0;
            if (dt < best[split]) best[split] = dt;
            steps[split]++;
        }
    }
}

int tsr_cmd_bench_gemm(int argc, char **argv) {
    const char *config = NULL, *v;
    double seconds = 20;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        int r;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return EXIT_OK;
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if ((r = tsr_opt(argc, argv, &i, "config", 1, &v)) != 0) {
            if (r < 0) return EXIT_USAGE;
            config = v;
        } else if ((r = tsr_opt(argc, argv, &i, "seconds", 1, &v)) != 0) {
            char *end;
            if (r < 0) return EXIT_USAGE;
            seconds = strtod(v, &end);
            if (*end || !(seconds >= 0 && seconds <= 3600))
                return tsr_usage_error("bench gemm", "bad --seconds '%s' (want 0 to 3600)", v);
        } else if (strncmp(argv[i], "--", 2) != 0 || !strchr(argv[i], '.')) {
            fprintf(stderr, "tessera bench gemm: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return EXIT_USAGE;
        }
    }
    if (!config) return tsr_usage_error("bench gemm", "--config FILE is required (see --help)");
    tsr_train_config cfg;
    tsr_error e = {0};
    if (tsr_config_load(&cfg, config, &e)) {
        fprintf(stderr, "tessera bench gemm: %s\n", e.msg);
        return e.code == TSR_EINVAL ? EXIT_USAGE : EXIT_FAIL;
    }
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config") || !strcmp(argv[i], "--seconds")) {
            i++;
            continue;
        }
        if (strncmp(argv[i], "--", 2) != 0 || !strchr(argv[i], '.')) continue;
        if (tsr_config_override(&cfg, argv[i], &e)) {
            fprintf(stderr, "tessera bench gemm: %s\n", e.msg);
            return EXIT_USAGE;
        }
    }
    tsr_model_args a;
    if (tsr_model_args_get(tsr_flavor_name(cfg.model.flavor), &a, &e)) {
        fprintf(stderr, "tessera bench gemm: %s (a named model flavor is needed)\n", e.msg);
        return EXIT_USAGE;
    }
    int B = cfg.training.local_batch_size, T = cfg.training.seq_len;
    if (B < 1 || T < 1) return tsr_usage_error("bench gemm", "training.local_batch_size and seq_len must be >= 1");
    int hd = tsr_model_head_dim(&a), C = a.dim, F = a.ffn_dim, L = a.n_layers;
    int Dq = a.n_heads * hd, Dkv = a.n_kv_heads * hd, N = B * T;
    const shape sh[] = {
        {"wq", C, Dq, L}, {"wk", C, Dkv, L}, {"wv", C, Dkv, L}, {"wo", Dq, C, L},
        {"w1", C, F, L},  {"w3", C, F, L},   {"w2", F, C, L},   {"output", C, a.vocab_size, 1},
    };
    int nsh = (int)(sizeof sh / sizeof *sh);
    uint64_t P = 0;
    size_t max_in = 0, max_out = 0, max_w = 0;
    for (int k = 0; k < nsh; k++) {
        P += (uint64_t)sh[k].C * (uint64_t)sh[k].OC * (uint64_t)sh[k].count;
        if ((size_t)sh[k].C > max_in) max_in = (size_t)sh[k].C;
        if ((size_t)sh[k].OC > max_out) max_out = (size_t)sh[k].OC;
        if ((size_t)sh[k].C * (size_t)sh[k].OC > max_w) max_w = (size_t)sh[k].C * (size_t)sh[k].OC;
    }
    double step_flop = 6.0 * (double)N * (double)P;
    double flop_per_token = 6.0 * (double)P + 6.0 * (double)L * (double)T * (double)Dq;

    tsr_cli_set_threads();
    int threads = omp_get_max_threads(), blas_threads = openblas_get_num_threads();
    operands o;
    size_t sizes[6] = {(size_t)N * max_in, max_w, (size_t)N * max_out, (size_t)N * max_out, (size_t)N * max_in, max_w};
    float **ptrs[6] = {&o.inp, &o.w, &o.out, &o.dout, &o.dinp, &o.dw};
    int oom = 0;
    uint64_t seed = 42;
    for (int k = 0; k < 6; k++) {
        *ptrs[k] = malloc(sizes[k] * sizeof(float));
        if (!*ptrs[k]) oom = 1;
        else fill(*ptrs[k], sizes[k], &seed);
    }
    if (oom) {
        for (int k = 0; k < 6; k++) free(*ptrs[k]);
        fprintf(stderr, "tessera bench gemm: out of memory for the operands\n");
        return EXIT_FAIL;
    }
    int steps[2];
    double best[2];
    time_steps(sh, nsh, N, &o, seconds, best, steps);
    double t_blas = best[0], t_split = best[1];
    int steps_blas = steps[0], steps_split = steps[1];
    for (int k = 0; k < 6; k++) free(*ptrs[k]);
    double f_blas = step_flop / t_blas, f_split = step_flop / t_split, peak = f_blas > f_split ? f_blas : f_split;
    if (json) {
        printf("{\"model\":\"%s\",\"batch\":%d,\"seq_len\":%d,\"threads\":%d,\"openblas_threads\":%d,"
               "\"matmul_params\":%llu,\"flop_per_token\":%.0f,\"step_gemm_flop\":%.0f,"
               "\"blas_seconds\":%.6f,\"blas_steps\":%d,\"blas_Fps\":%.0f,"
               "\"split_seconds\":%.6f,\"split_steps\":%d,\"split_Fps\":%.0f,\"peak_Fps\":%.0f}\n",
               a.flavor, B, T, threads, blas_threads, (unsigned long long)P, flop_per_token, step_flop, t_blas,
               steps_blas, f_blas, t_split, steps_split, f_split, peak);
    } else {
        printf("model %s, batch %d x %d tokens: %llu matmul parameters; %.4g FLOP per token (6 P + 6 L T D)\n",
               a.flavor, B, T, (unsigned long long)P, flop_per_token);
        printf("sgemm on the step's products (%.4g FLOP), %d threads, best of %d steps: %.2f GFLOP/s as OpenBLAS calls\n",
               step_flop, threads, steps_blas, f_blas / 1e9);
        printf("sgemm through the trainer's matmul kernel, best of %d steps: %.2f GFLOP/s\n", steps_split,
               f_split / 1e9);
        printf("peak: %.2f GFLOP/s\n", peak / 1e9);
    }
    return EXIT_OK;
}
