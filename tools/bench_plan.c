/* bench_plan.c: `tessera bench plan [--chunks N] [--grid G] [--json]`.
 *
 * Times the resharding planner (tsr_plan_overlaps) on one thread, best of 3:
 *  - one tensor [3N, 1024] stored as N chunks along dim 0 of 2 and 4 rows in
 *    turn, read back as N boxes of 3 rows, so every needed box crosses a stored
 *    cut (about 1.5 N overlaps);
 *  - the same totals spread over T = floor(sqrt(N)) tensors of N / T chunks
 *    each (1000 x 1000 for the default), one planner call per tensor.
 *  - with --grid G, square grids: a tensor [10G, 10G] stored as G x G boxes of
 *    10 x 10, read as the same boxes (1 overlap a box) and as the boxes moved
 *    by 3 in both dims, cut at the edge (about 4): where the sweep scanned
 *    lists of active boxes, these scanned a whole row of boxes at each box.
 * Each result is checked: the overlaps come in (need, have) order and their
 * volumes add up to the needed volume (every needed element read exactly once,
 * as the stored chunks tile the tensor). The goal is under 2 s for 1M x 1M. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "commands.h"
#include "tessera.h"


#define COLS 1024
#define PASSES 3
#define GOAL_SECONDS 2.0

static void usage(FILE *f) {
    fprintf(f,
            "usage: tessera bench plan [--chunks N] [--grid G] [--json]\n"
            "  Times the resharding planner (sort and sweep) on one thread, best of %d:\n"
            "  one tensor stored as N chunks read as N boxes of another cut, then the same\n"
            "  totals as sqrt(N) tensors of sqrt(N) chunks each.\n"
            "  --chunks N  stored chunks (and needed boxes) in all (default 1000000)\n"
            "  --grid G    also a square grid of G x G stored boxes of 10 x 10, read as the\n"
            "              same boxes and as the boxes moved by 3 in both dims\n"
            "  --json      print one JSON object\n",
            PASSES);
}

/* Tensor [3c, COLS]: stored chunks of 2 and 4 rows in turn (the last one 3 if c
 * is odd), needed boxes of 3 rows. */
static void make_cuts(size_t c, tsr_box *have, tsr_box *need) {
    uint64_t row = 0;
    for (size_t i = 0; i < c; i++) {
        uint64_t rows = (c % 2 && i == c - 1) ? 3 : i % 2 ? 4 : 2;
        memset(&have[i], 0, sizeof have[i]);
        have[i].ndim = 2;
        have[i].offset[0] = row;
        have[i].extent[0] = rows;
        have[i].extent[1] = COLS;
        row += rows;
        memset(&need[i], 0, sizeof need[i]);
        need[i].ndim = 2;
        need[i].offset[0] = 3 * (uint64_t)i;
        need[i].extent[0] = 3;
        need[i].extent[1] = COLS;
    }
}

/* Tensor [10g, 10g]: stored boxes of a g x g grid of 10 x 10, needed boxes the
 * same moved by `shift` in both dims, the last ones cut at the edge. */
static void make_grid(size_t g, uint64_t shift, tsr_box *have, tsr_box *need) {
    uint64_t len = 10 * (uint64_t)g;
    for (size_t i = 0; i < g * g; i++) {
        memset(&have[i], 0, sizeof have[i]);
        have[i].ndim = 2;
        have[i].offset[0] = 10 * (uint64_t)(i / g);
        have[i].offset[1] = 10 * (uint64_t)(i % g);
        have[i].extent[0] = have[i].extent[1] = 10;
        need[i] = have[i];
        for (int d = 0; d < 2; d++) {
            need[i].offset[d] += shift; /* shift < 10 */
            if (need[i].offset[d] + need[i].extent[d] > len) need[i].extent[d] = len - need[i].offset[d];
        }
    }
}

/* @return 0 if the overlaps are in (need, have) order and cover every needed
 * element exactly once. */
static int verify(const tsr_box *need, size_t n, const tsr_overlap *o, size_t k) {
    uint64_t want = 0, got = 0;
    for (size_t i = 0; i < n; i++) want += tsr_box_volume(&need[i]);
    for (size_t p = 0; p < k; p++) {
        if (p && (o[p - 1].need > o[p].need || (o[p - 1].need == o[p].need && o[p - 1].have >= o[p].have)))
            return -1;
        if (o[p].need >= n || !tsr_box_contains(&need[o[p].need], &o[p].region)) return -1;
        got += tsr_box_volume(&o[p].region);
    }
    return got == want ? 0 : -1;
}

typedef struct result {
    size_t tensors, chunks_per_tensor, overlaps;
    uint64_t grid_shift; /* grid cases only */
    double seconds;
    int ok;
} result;

/* Plans `tensors` tensors of c chunks each (with `grid`, one tensor of a c = g x
 * g grid); best of PASSES passes over all of them. */
static int run_case(size_t tensors, size_t c, size_t grid, uint64_t shift, result *res) {
    tsr_box *have = malloc(c * sizeof *have), *need = malloc(c * sizeof *need);
    if (!have || !need) {
        fprintf(stderr, "tessera bench plan: cannot allocate 2 x %zu boxes\n", c);
        free(have);
        free(need);
        return -1;
    }
    if (grid) make_grid(grid, shift, have, need);
    else make_cuts(c, have, need);
    res->grid_shift = shift;
    res->tensors = tensors;
    res->chunks_per_tensor = c;
    res->seconds = INFINITY;
    res->ok = 1;
    for (int pass = 0; pass < PASSES; pass++) {
        double busy = 0;
        size_t total = 0;
        for (size_t t = 0; t < tensors; t++) {
            tsr_overlap *o = NULL;
            size_t k = 0;
            tsr_error err = {0};
            double t0 = tsr_now();
            int rc = tsr_plan_overlaps(need, c, have, c, &o, &k, &err);
            busy += tsr_now() - t0;
            if (rc) {
                fprintf(stderr, "tessera bench plan: %s\n", err.msg);
                free(have);
                free(need);
                return -1;
            }
            /* every tensor has the same cuts: check the first of each pass */
            if (t == 0 && verify(need, c, o, k)) res->ok = 0;
            total += k;
            free(o);
        }
        res->overlaps = total;
        if (busy < res->seconds) res->seconds = busy;
    }
    free(have);
    free(need);
    return 0;
}

int tsr_cmd_bench_plan(int argc, char **argv) {
    uint64_t chunks = 1000000, grid = 0;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int r;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return EXIT_OK;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if ((r = tsr_opt(argc, argv, &i, "chunks", 1, &v)) != 0) {
            if (r < 0) {
                usage(stderr);
                return EXIT_USAGE;
            }
            if (tsr_parse_u64(v, &chunks) || chunks < 1 || chunks > UINT32_MAX)
                return tsr_usage_error("bench plan", "bad --chunks '%s' (want 1 to 4294967295)", v);
        } else if ((r = tsr_opt(argc, argv, &i, "grid", 1, &v)) != 0) {
            if (r < 0) {
                usage(stderr);
                return EXIT_USAGE;
            }
            if (tsr_parse_u64(v, &grid) || grid < 1 || grid > 65535)
                return tsr_usage_error("bench plan", "bad --grid '%s' (want 1 to 65535)", v);
        } else {
            fprintf(stderr, "tessera bench plan: unknown argument '%s'\n", a);
            usage(stderr);
            return EXIT_USAGE;
        }
    }
    size_t n = (size_t)chunks, t = (size_t)sqrt((double)n);
    while (t * t > n) t--;
    while ((t + 1) * (t + 1) <= n) t++;
    result one, many, grids[2];
    if (run_case(1, n, 0, 0, &one) || run_case(t, n / t, 0, 0, &many)) return EXIT_FAIL;
    size_t g = (size_t)grid;
    for (int i = 0; i < 2 && g; i++)
        if (run_case(1, g * g, g, i ? 3 : 0, &grids[i])) return EXIT_FAIL;
    int ok = one.ok && many.ok && (!g || (grids[0].ok && grids[1].ok)), met = one.seconds < GOAL_SECONDS;
    if (json) {
        printf("{\"threads\":1,\"passes\":%d,\"goal_seconds\":%.1f,\"cases\":[", PASSES, GOAL_SECONDS);
        const result *r[4] = {&one, &many, &grids[0], &grids[1]};
        for (int i = 0; i < (g ? 4 : 2); i++) {
            printf("%s{\"tensors\":%zu,\"stored_chunks\":%zu,\"needed_boxes\":%zu,\"overlaps\":%zu,"
                   "\"seconds\":%.6f,\"verified\":%s",
                   i ? "," : "", r[i]->tensors, r[i]->tensors * r[i]->chunks_per_tensor,
                   r[i]->tensors * r[i]->chunks_per_tensor, r[i]->overlaps, r[i]->seconds,
                   r[i]->ok ? "true" : "false");
            if (i >= 2) printf(",\"grid\":%zu,\"grid_shift\":%llu", g, (unsigned long long)r[i]->grid_shift);
            printf("}");
        }
        printf("],\"goal_met\":%s}\n", met ? "true" : "false");
    } else {
        printf("plan: %zu stored chunks x %zu needed boxes -> %zu overlaps in %.3f s (goal: under "
               "%.0f s)%s\n", n, n, one.overlaps, one.seconds, GOAL_SECONDS, met ? "" : "  MISSED");
        printf("plan: %zu tensors x %zu stored chunks x %zu needed boxes -> %zu overlaps in %.3f s\n",
               many.tensors, many.chunks_per_tensor, many.chunks_per_tensor, many.overlaps,
               many.seconds);
        for (int i = 0; i < 2 && g; i++)
            printf("plan: grid %zu x %zu stored boxes of 10 x 10, needed moved by %llu -> %zu overlaps in "
                   "%.3f s\n", g, g, (unsigned long long)grids[i].grid_shift, grids[i].overlaps,
                   grids[i].seconds);
    }
    if (!ok) {
        fprintf(stderr, "tessera bench plan: the overlaps do not cover the needed boxes exactly once\n");
        return EXIT_FAIL;
    }
    return EXIT_OK;
}
