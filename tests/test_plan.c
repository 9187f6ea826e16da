/* test_plan.c: the planners.
 *
 *  - tsr_plan_overlaps against a brute-force O(n*m) reference, on the stored
 *    chunks of one random layout against the boxes every rank needs under
 *    another, and on random disjoint boxes (guillotine cuts) against random
 *    boxes, in 0 to 5 dims, with empty boxes; the same overlap set, in (need,
 *    have) order. Also 2-D and 3-D grids against other grids (tall thin boxes
 *    against wide flat ones among them), with extra, duplicate and empty boxes
 *    and coordinates up to 2^64, which a wrong interval structure in the sweep
 *    gets wrong. Large 1-D and 2-D cases, and square grids against the same
 *    grids moved, check the count, coverage and order.
 *  - tsr_save_plan_build: every distinct box assigned once, to a rank that holds
 *    it; bytes per rank add up; replicated boxes balanced (LPT bound: the most
 *    loaded rank is within the largest box of the ideal); deterministic, even
 *    when the ranks list their boxes in another order. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "tessera.h"

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint64_t next(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}
static uint64_t below(uint64_t n) { return n ? next() % n : 0; }

static tsr_box whole(uint32_t nd, const uint64_t *shape) {
    tsr_box b;
    memset(&b, 0, sizeof b);
    b.ndim = nd;
    for (uint32_t d = 0; d < nd; d++) b.extent[d] = shape[d];
    return b;
}

static int same_box(const tsr_box *a, const tsr_box *b) {
    if (a->ndim != b->ndim) return 0;
    for (uint32_t d = 0; d < a->ndim; d++)
        if (a->offset[d] != b->offset[d] || a->extent[d] != b->extent[d]) return 0;
    return 1;
}

/* ------------------------------------------------------------- overlaps */

/* Runs the planner and the brute-force reference; checks that they agree.
 * `covered`: the stored boxes cover the tensor exactly once, so the overlaps of
 * each needed box add up to its volume. */
static void check_overlaps(const tsr_box *need, size_t n, const tsr_box *have, size_t m,
                           int covered, const char *what) {
    tsr_error e = {0};
    tsr_overlap *o = NULL;
    size_t k = 0;
    int rc = tsr_plan_overlaps(need, n, have, m, &o, &k, &e);
    CHECK(rc == 0, "%s: plan overlaps failed: %s", what, e.msg);
    if (rc) return;
    size_t p = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t sum = 0;
        for (size_t j = 0; j < m; j++) {
            tsr_box x;
            if (!tsr_box_intersect(&need[i], &have[j], &x)) continue;
            sum += tsr_box_volume(&x);
            if (p >= k) {
                CHECK(0, "%s: missing overlap (%zu, %zu)", what, i, j);
                p++;
                continue;
            }
            CHECK(o[p].need == i && o[p].have == j && same_box(&o[p].region, &x),
                  "%s: overlap %zu is (%u, %u), expected (%zu, %zu) (or its region differs)", what,
                  p, o[p].need, o[p].have, i, j);
            p++;
        }
        if (covered)
            CHECK(sum == tsr_box_volume(&need[i]), "%s: needed box %zu covered %llu of %llu", what,
                  i, (unsigned long long)sum, (unsigned long long)tsr_box_volume(&need[i]));
    }
    CHECK(p == k, "%s: %zu overlaps, reference %zu", what, k, p);
    free(o);
}

static int is_stored_replica(const tsr_layout *l, const tsr_placement *pl, tsr_coord c) {
    /* one copy of each element: the replica at coordinate 0 of every replicating dim */
    if (c.dp_replicate) return 0;
    if (pl->tp_dim == -1 && c.tp) return 0;
    if (!(l->flags & TSR_LAYOUT_FLAT) && !pl->fsdp && c.dp_shard) return 0;
    if (pl->pp_role == TSR_PP_ALL && c.pp) return 0;
    return 1;
}

static tsr_layout random_layout(uint32_t n_layers) {
    tsr_layout l;
    do {
        l = (tsr_layout){1 + (uint32_t)below(4), 1 + (uint32_t)below(3), 1 + (uint32_t)below(5),
                         1 + (uint32_t)below(5), n_layers, below(3) ? 0 : TSR_LAYOUT_FLAT};
    } while (tsr_layout_size(&l) > 64);
    return l;
}

static void random_tensors(tsr_tensor_decl *t, size_t n, uint32_t n_layers, uint64_t maxdim,
                           char (*names)[32]) {
    for (size_t i = 0; i < n; i++) {
        memset(&t[i], 0, sizeof t[i]);
        snprintf(names[i], 32, "%c%zu", (char)('a' + below(26)), i);
        t[i].name = names[i];
        t[i].group = below(2) ? "model" : "optim";
        t[i].dtype = TSR_F32;
        t[i].ndim = (uint32_t)below(5);
        for (uint32_t d = 0; d < t[i].ndim; d++) t[i].shape[d] = 1 + below(maxdim);
        t[i].placement.tp_dim = (int8_t)(t[i].ndim ? (int)below(t[i].ndim + 1) - 1 : -1);
        t[i].placement.fsdp = (uint8_t)below(2);
        t[i].placement.pp_role = (uint8_t)below(4);
        t[i].placement.layer = t[i].placement.pp_role == TSR_PP_LAYER ? (int32_t)below(n_layers) : -1;
    }
}

/* All boxes of tensor `ti` held by the ranks of l; with `one_copy`, only one
 * replica of each element. */
static size_t tensor_boxes(const tsr_layout *l, const tsr_tensor_decl *t, size_t n, uint32_t ti,
                           int one_copy, tsr_box **out) {
    size_t cap = 16, k = 0;
    tsr_box *v = malloc(cap * sizeof *v);
    tsr_error e = {0};
    for (uint32_t r = 0; r < tsr_layout_size(l); r++) {
        if (one_copy && !is_stored_replica(l, &t[ti].placement, tsr_layout_coord(l, r))) continue;
        tsr_rank_box *b;
        size_t m;
        REQUIRE(tsr_layout_boxes(l, t, n, r, &b, &m, &e) == 0, "layout boxes: %s", e.msg);
        for (size_t i = 0; i < m; i++) {
            if (b[i].tensor != ti) continue;
            if (k == cap) v = realloc(v, (cap *= 2) * sizeof *v);
            v[k++] = b[i].box;
        }
        free(b);
    }
    *out = v;
    return k;
}

static void overlaps_layouts(int iters) {
    char names[6][32];
    for (int it = 0; it < iters && check_failures < 20; it++) {
        uint32_t nl = 1 + (uint32_t)below(6);
        tsr_layout la = random_layout(nl), lb = random_layout(nl);
        tsr_tensor_decl t[6];
        size_t n = 1 + below(6);
        random_tensors(t, n, nl, 13, names);
        for (uint32_t ti = 0; ti < n; ti++) {
            tsr_box *have, *need;
            size_t m = tensor_boxes(&la, t, n, ti, 1, &have);
            size_t k = tensor_boxes(&lb, t, n, ti, 0, &need);
            check_overlaps(need, k, have, m, 1, "layout to layout");
            free(have);
            free(need);
        }
    }
}

/* Cuts box b into disjoint pieces by random guillotine cuts until `budget`
 * pieces or unit boxes. */
static void guillotine(const tsr_box *b, int budget, tsr_box *out, size_t *n) {
    if (budget <= 1 || tsr_box_volume(b) <= 1 || b->ndim == 0) {
        out[(*n)++] = *b;
        return;
    }
    uint32_t d = (uint32_t)below(b->ndim);
    for (int tries = 0; b->extent[d] < 2 && tries < 8; tries++) d = (uint32_t)below(b->ndim);
    if (b->extent[d] < 2) {
        out[(*n)++] = *b;
        return;
    }
    uint64_t cut = 1 + below(b->extent[d] - 1);
    tsr_box lo = *b, hi = *b;
    lo.extent[d] = cut;
    hi.offset[d] += cut;
    hi.extent[d] -= cut;
    int bl = 1 + (int)below((uint64_t)budget - 1);
    guillotine(&lo, bl, out, n);
    guillotine(&hi, budget - bl, out, n);
}

static void overlaps_random(int iters) {
    tsr_box *have = malloc(512 * sizeof *have), *need = malloc(512 * sizeof *need);
    for (int it = 0; it < iters && check_failures < 20; it++) {
        uint32_t nd = (uint32_t)below(6);
        uint64_t shape[TSR_MAX_DIMS];
        for (uint32_t d = 0; d < nd; d++) shape[d] = 1 + below(it % 2 ? 40 : 9);
        tsr_box full = whole(nd, shape);
        size_t m = 0, n = below(200);
        guillotine(&full, 1 + (int)below(300), have, &m);
        for (size_t i = 0; i < n; i++) {
            need[i].ndim = nd;
            for (uint32_t d = 0; d < nd; d++) {
                need[i].offset[d] = below(shape[d] + 2);
                need[i].extent[d] = below(shape[d] + 2 - need[i].offset[d]);
            }
        }
        if (below(4) == 0 && m) have[below(m)].extent[0] = 0; /* an empty stored box */
        for (size_t j = 0; j < m; j++) { /* shuffle the stored boxes */
            size_t s = below(m);
            tsr_box x = have[j];
            have[j] = have[s];
            have[s] = x;
        }
        check_overlaps(need, n, have, m, 0, "random boxes");
    }
    /* 0-d: every box is the one element */
    tsr_box z;
    memset(&z, 0, sizeof z);
    for (size_t i = 0; i < 5; i++) need[i] = z;
    check_overlaps(need, 5, &z, 1, 1, "0-d");
    check_overlaps(need, 5, &z, 0, 0, "0-d, nothing stored");
    check_overlaps(need, 0, &z, 1, 0, "0-d, nothing needed");
    check_overlaps(NULL, 0, NULL, 0, 0, "nothing at all");
    free(have);
    free(need);
}

/* A random grid along [0, len): cuts[0] = 0 < cuts[1] < ... < cuts[g] = len,
 * g <= max_pieces, more often large than small. @return g. */
static size_t random_cuts(uint64_t len, size_t max_pieces, uint64_t *cuts) {
    uint64_t most = max_pieces < len ? max_pieces : len, g1 = 1 + below(most), g2 = 1 + below(most);
    size_t g = g1 > g2 ? g1 : g2;
    cuts[0] = 0;
    for (size_t i = 1; i < g; i++) { /* g - 1 distinct points of (0, len), insertion-sorted */
        uint64_t x;
        size_t j;
        do {
            x = 1 + below(len - 1);
            for (j = 1; j < i && cuts[j] != x; j++) {}
        } while (j < i);
        for (j = i; j > 1 && cuts[j - 1] > x; j--) cuts[j] = cuts[j - 1];
        cuts[j] = x;
    }
    cuts[g] = len;
    return g;
}

/* The boxes of the grid whose cuts along dim d are cuts[d][0..g[d]]. @return their number. */
static size_t grid_boxes(uint32_t nd, uint64_t cuts[][65], const size_t *g, tsr_box *out) {
    size_t n = 1;
    for (uint32_t d = 0; d < nd; d++) n *= g[d];
    for (size_t i = 0; i < n; i++) {
        tsr_box *b = &out[i];
        memset(b, 0, sizeof *b);
        b->ndim = nd;
        for (uint32_t d = 0, r = (uint32_t)i; d < nd; r /= (uint32_t)g[d], d++) {
            b->offset[d] = cuts[d][r % g[d]];
            b->extent[d] = cuts[d][r % g[d] + 1] - cuts[d][r % g[d]];
        }
    }
    return n;
}

/* x -> base + x * stride in every dim. */
static void stretch(tsr_box *b, size_t n, uint64_t base, uint64_t stride) {
    for (size_t i = 0; i < n; i++)
        for (uint32_t d = 0; d < b[i].ndim; d++) {
            b[i].offset[d] = base + b[i].offset[d] * stride;
            b[i].extent[d] *= stride;
        }
}

static void shuffle(tsr_box *b, size_t n) {
    for (size_t i = 0; i < n; i++) {
        size_t j = below(n);
        tsr_box x = b[i];
        b[i] = b[j];
        b[j] = x;
    }
}

/* Stored boxes: a random grid tiling [0, shape); needed: another grid, plus
 * random boxes inside (overlapping the grid and each other), copies of needed
 * boxes and empty boxes on both sides. Every fourth case, the stored grid is
 * cut along one dim only and the needed one along another: tall thin boxes
 * against wide flat ones, each stored box active across the whole sweep. Every
 * third, coordinates are stretched and moved so that the tensor ends at 2^64 - 1
 * in its longest dim. */
static void overlaps_grids(int iters) {
    static tsr_box have[1200], need[1200];
    static uint64_t cuts[TSR_MAX_DIMS][65];
    for (int it = 0; it < iters && check_failures < 20; it++) {
        uint32_t nd = 2 + (uint32_t)below(2);
        size_t cap = nd == 2 ? 28 : 9; /* pieces a dim, so at most 784 boxes a grid */
        int thin = it % 4 == 3, huge = it % 3 == 2;
        uint32_t dh = (uint32_t)below(nd), dn = (dh + 1 + (uint32_t)below(nd - 1)) % nd;
        uint64_t shape[TSR_MAX_DIMS];
        size_t gh[TSR_MAX_DIMS], gn[TSR_MAX_DIMS];
        for (uint32_t d = 0; d < nd; d++) shape[d] = 1 + below(it % 2 ? 200 : 30);
        for (uint32_t d = 0; d < nd; d++) gh[d] = random_cuts(shape[d], thin && d != dh ? 1 : cap, cuts[d]);
        size_t m = grid_boxes(nd, cuts, gh, have);
        for (uint32_t d = 0; d < nd; d++) gn[d] = random_cuts(shape[d], thin && d != dn ? 1 : cap, cuts[d]);
        size_t n = grid_boxes(nd, cuts, gn, need);
        size_t extra = below(40);
        for (size_t e = 0; e < extra; e++) {
            tsr_box *b = &need[n++];
            if (below(3) == 0) { /* a copy of a needed box */
                *b = need[below(n - 1)];
                continue;
            }
            b->ndim = nd;
            for (uint32_t d = 0; d < nd; d++) {
                b->offset[d] = below(shape[d]);
                b->extent[d] = 1 + below(shape[d] - b->offset[d]);
            }
        }
        for (size_t e = below(4); e > 0; e--) { /* empty boxes, in the middle of others */
            tsr_box *b = below(2) ? &need[n++] : &have[m++];
            b->ndim = nd;
            for (uint32_t d = 0; d < nd; d++) {
                b->offset[d] = below(shape[d]);
                b->extent[d] = 1 + below(shape[d] - b->offset[d]);
            }
            b->extent[below(nd)] = 0;
        }
        if (huge) {
            uint64_t longest = 0, stride = 1 + below((uint64_t)1 << 40);
            for (uint32_t d = 0; d < nd; d++) longest = shape[d] > longest ? shape[d] : longest;
            stretch(have, m, UINT64_MAX - longest * stride, stride);
            stretch(need, n, UINT64_MAX - longest * stride, stride);
        }
        shuffle(have, m);
        shuffle(need, n);
        /* (volumes of stretched boxes overflow: no coverage check for them) */
        check_overlaps(need, n, have, m, !huge, thin ? "thin grids" : "grids");
    }
}

/* Large cases: checks order, regions and, with `covered`, coverage without the
 * reference. @return the number of overlaps. */
static size_t check_large(const tsr_box *need, size_t n, const tsr_box *have, size_t m, int covered,
                          const char *what) {
    tsr_error e = {0};
    tsr_overlap *o = NULL;
    size_t k = 0;
    CHECK_OK(tsr_plan_overlaps(need, n, have, m, &o, &k, &e));
    uint64_t *sum = calloc(n, sizeof *sum);
    for (size_t p = 0; p < k; p++) {
        CHECK(o[p].need < n && o[p].have < m, "%s: index out of range", what);
        if (o[p].need >= n || o[p].have >= m) break;
        if (p) CHECK(o[p - 1].need < o[p].need || (o[p - 1].need == o[p].need && o[p - 1].have < o[p].have),
                     "%s: overlaps %zu, %zu out of order", what, p - 1, p);
        tsr_box x;
        CHECK(tsr_box_intersect(&need[o[p].need], &have[o[p].have], &x) && same_box(&x, &o[p].region),
              "%s: overlap %zu region", what, p);
        sum[o[p].need] += tsr_box_volume(&o[p].region);
    }
    for (size_t i = 0; i < n && covered; i++)
        if (sum[i] != tsr_box_volume(&need[i])) {
            CHECK(0, "%s: needed box %zu covered %llu of %llu", what, i, (unsigned long long)sum[i],
                  (unsigned long long)tsr_box_volume(&need[i]));
            break;
        }
    free(sum);
    free(o);
    return k;
}

static void grid(uint64_t rows, uint64_t cols, uint64_t gr, uint64_t gc, tsr_box *out) {
    uint64_t cr = (rows + gr - 1) / gr, cc = (cols + gc - 1) / gc;
    for (uint64_t i = 0; i < gr; i++)
        for (uint64_t j = 0; j < gc; j++) {
            tsr_box *b = &out[i * gc + j];
            memset(b, 0, sizeof *b);
            b->ndim = 2;
            b->offset[0] = i * cr < rows ? i * cr : rows;
            b->extent[0] = (b->offset[0] + cr < rows ? b->offset[0] + cr : rows) - b->offset[0];
            b->offset[1] = j * cc < cols ? j * cc : cols;
            b->extent[1] = (b->offset[1] + cc < cols ? b->offset[1] + cc : cols) - b->offset[1];
        }
}

static void overlaps_large(void) {
    size_t N = 200000;
    tsr_box *have = malloc(N * sizeof *have), *need = malloc(N * sizeof *need);
    /* 1-D cuts: N chunks of 3 rows against N-17 ceil-division pieces */
    uint64_t rows = 3 * N, np = N - 17, c = (rows + np - 1) / np;
    for (size_t i = 0; i < N; i++) {
        memset(&have[i], 0, sizeof have[i]);
        have[i].ndim = 2;
        have[i].offset[0] = 3 * i;
        have[i].extent[0] = 3;
        have[i].extent[1] = 64;
    }
    size_t n = 0;
    for (uint64_t i = 0; i < np && i * c < rows; i++, n++) {
        memset(&need[n], 0, sizeof need[n]);
        need[n].ndim = 2;
        need[n].offset[0] = i * c;
        need[n].extent[0] = (i * c + c < rows ? i * c + c : rows) - i * c;
        need[n].extent[1] = 64;
    }
    check_large(need, n, have, N, 1, "1-D cuts");
    /* 2-D grids of about N boxes, crossing */
    grid(1000, 1000, 400, 500, have);
    grid(1000, 1000, 450, 440, need);
    check_large(need, 450 * 440, have, 400 * 500, 1, "2-D grids");
    free(have);
    free(need);
}

/* Square grids: g^nd stored boxes of 10 x .. x 10 against the same grid moved
 * by 3 in every dim (its last boxes stick out). Where the sweep kept the active
 * boxes of a side in a list, each box scanned a whole row of them. Two boxes
 * meet iff their intervals meet in every dim, so the count is that of one
 * dim's meeting intervals, by brute force, to the power nd; with the regions
 * and the strict order checked, that pins down the whole overlap set. */
static void overlaps_square(uint32_t nd, uint64_t g) {
    size_t n = 1;
    for (uint32_t d = 0; d < nd; d++) n *= g;
    tsr_box *have = malloc(n * sizeof *have), *need = malloc(n * sizeof *need);
    for (size_t i = 0; i < n; i++) {
        memset(&have[i], 0, sizeof have[i]);
        have[i].ndim = nd;
        for (uint32_t d = 0, r = (uint32_t)i; d < nd; r /= (uint32_t)g, d++) {
            have[i].offset[d] = 10 * (r % g);
            have[i].extent[d] = 10;
        }
        need[i] = have[i];
        for (uint32_t d = 0; d < nd; d++) need[i].offset[d] += 3;
    }
    shuffle(have, n);
    shuffle(need, n);
    uint64_t per_dim = 0, want = 1;
    for (uint64_t a = 0; a < g; a++)
        for (uint64_t b = 0; b < g; b++) per_dim += 10 * a + 3 < 10 * b + 10 && 10 * b < 10 * a + 13;
    for (uint32_t d = 0; d < nd; d++) want *= per_dim;
    char what[64];
    snprintf(what, sizeof what, "square %u-D grid of %llu", nd, (unsigned long long)g);
    size_t k = check_large(need, n, have, n, 0, what);
    CHECK(k == want, "%s: %zu overlaps, expected %llu", what, k, (unsigned long long)want);
    free(have);
    free(need);
}

static void overlaps_errors(void) {
    tsr_box a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    a.ndim = 2;
    b.ndim = 1;
    a.extent[0] = a.extent[1] = b.extent[0] = 1;
    tsr_overlap *o = NULL;
    size_t k = 0;
    tsr_error e = {0};
    CHECK(tsr_plan_overlaps(&a, 1, &b, 1, &o, &k, &e) == TSR_EINVAL, "mixed dims accepted");
    b.ndim = 2;
    b.offset[1] = UINT64_MAX;
    b.extent[1] = 1;
    CHECK(tsr_plan_overlaps(&a, 1, &b, 1, &o, &k, &e) == TSR_EINVAL, "offset+extent overflow accepted");
    a.ndim = b.ndim = 9;
    CHECK(tsr_plan_overlaps(&a, 1, &b, 1, &o, &k, &e) == TSR_EINVAL, "9 dims accepted");
}

/* ------------------------------------------------------------- save plan */

typedef struct held_set {
    uint32_t n_ranks;
    tsr_rank_box **held;
    size_t *n_held;
} held_set;

static void held_free(held_set *h) {
    for (uint32_t r = 0; r < h->n_ranks; r++) free(h->held[r]);
    free(h->held);
    free(h->n_held);
}

static int cmp_rank_box(const void *pa, const void *pb) {
    const tsr_rank_box *a = pa, *b = pb;
    if (a->tensor != b->tensor) return a->tensor < b->tensor ? -1 : 1;
    for (uint32_t d = 0; d < a->box.ndim; d++)
        if (a->box.offset[d] != b->box.offset[d]) return a->box.offset[d] < b->box.offset[d] ? -1 : 1;
    for (uint32_t d = 0; d < a->box.ndim; d++)
        if (a->box.extent[d] != b->box.extent[d]) return a->box.extent[d] < b->box.extent[d] ? -1 : 1;
    return 0;
}

static int rank_holds(const held_set *h, uint32_t r, const tsr_rank_box *rb) {
    for (size_t i = 0; i < h->n_held[r]; i++)
        if (h->held[r][i].tensor == rb->tensor && same_box(&h->held[r][i].box, &rb->box)) return 1;
    return 0;
}

static int same_plan(const tsr_save_plan *a, const tsr_save_plan *b) {
    if (a->n != b->n || a->n_ranks != b->n_ranks) return 0;
    for (size_t i = 0; i < a->n; i++)
        if (a->writer[i] != b->writer[i] || cmp_rank_box(&a->boxes[i], &b->boxes[i])) return 0;
    return memcmp(a->bytes_per_rank, b->bytes_per_rank, a->n_ranks * sizeof *a->bytes_per_rank) == 0;
}

/* Builds the plan, checks it, and rebuilds it from shuffled lists. `groups`:
 * the ranks r with the same r % groups hold the same boxes, so the LPT bound
 * holds within each class. @return the plan (caller frees). */
static tsr_save_plan check_save_plan(held_set *h, const size_t *elem_size, int balanced_classes,
                                     const char *what) {
    tsr_error e = {0};
    tsr_save_plan p;
    int rc = tsr_save_plan_build((const tsr_rank_box *const *)h->held, h->n_held, h->n_ranks,
                                 elem_size, &p, &e);
    CHECK(rc == 0, "%s: save plan failed: %s", what, e.msg);
    if (rc) return p;
    /* distinct boxes, by a reference sort */
    size_t total = 0;
    for (uint32_t r = 0; r < h->n_ranks; r++) total += h->n_held[r];
    tsr_rank_box *all = malloc((total + 1) * sizeof *all);
    size_t k = 0;
    for (uint32_t r = 0; r < h->n_ranks; r++)
        for (size_t i = 0; i < h->n_held[r]; i++)
            if (tsr_box_volume(&h->held[r][i].box)) all[k++] = h->held[r][i];
    qsort(all, k, sizeof *all, cmp_rank_box);
    size_t distinct = 0;
    for (size_t i = 0; i < k; i++)
        if (!i || cmp_rank_box(&all[i], &all[i - 1])) all[distinct++] = all[i];
    CHECK(p.n == distinct, "%s: %zu plan entries, %zu distinct boxes", what, p.n, distinct);
    CHECK(p.n_ranks == h->n_ranks, "%s: n_ranks", what);
    uint64_t *bytes = calloc(h->n_ranks, sizeof *bytes), largest = 0, sum = 0;
    for (size_t i = 0; i < p.n && i < distinct; i++) {
        CHECK(cmp_rank_box(&p.boxes[i], &all[i]) == 0, "%s: entry %zu is not the %zu-th distinct box",
              what, i, i);
        CHECK(p.writer[i] < h->n_ranks && rank_holds(h, p.writer[i], &p.boxes[i]),
              "%s: entry %zu written by rank %u, which does not hold it", what, i, p.writer[i]);
        if (p.writer[i] >= h->n_ranks) continue;
        uint64_t b = tsr_box_volume(&p.boxes[i].box) * elem_size[p.boxes[i].tensor];
        bytes[p.writer[i]] += b;
        sum += b;
        if (b > largest) largest = b;
    }
    for (uint32_t r = 0; r < h->n_ranks; r++)
        CHECK(bytes[r] == p.bytes_per_rank[r], "%s: rank %u: %llu bytes, plan says %llu", what, r,
              (unsigned long long)bytes[r], (unsigned long long)p.bytes_per_rank[r]);
    if (balanced_classes) { /* classes of ranks r % balanced_classes hold the same boxes */
        uint32_t g = (uint32_t)balanced_classes, size = h->n_ranks / g;
        for (uint32_t c = 0; c < g; c++) {
            uint64_t class_bytes = 0, max = 0;
            for (uint32_t r = c; r < h->n_ranks; r += g) {
                class_bytes += bytes[r];
                if (bytes[r] > max) max = bytes[r];
            }
            CHECK(max <= class_bytes / size + largest, "%s: class %u: max %llu bytes, ideal %llu, "
                  "largest box %llu", what, c, (unsigned long long)max,
                  (unsigned long long)(class_bytes / size), (unsigned long long)largest);
        }
    }
    /* determinism: the same input, and each rank's list shuffled */
    tsr_save_plan q;
    CHECK_OK(tsr_save_plan_build((const tsr_rank_box *const *)h->held, h->n_held, h->n_ranks,
                                 elem_size, &q, &e));
    CHECK(same_plan(&p, &q), "%s: two builds differ", what);
    tsr_save_plan_free(&q);
    for (uint32_t r = 0; r < h->n_ranks; r++)
        for (size_t i = 0; i < h->n_held[r]; i++) {
            size_t j = below(h->n_held[r]);
            tsr_rank_box x = h->held[r][i];
            h->held[r][i] = h->held[r][j];
            h->held[r][j] = x;
        }
    CHECK_OK(tsr_save_plan_build((const tsr_rank_box *const *)h->held, h->n_held, h->n_ranks,
                                 elem_size, &q, &e));
    CHECK(same_plan(&p, &q), "%s: shuffled lists give another plan", what);
    tsr_save_plan_free(&q);
    free(bytes);
    free(all);
    return p;
}

static held_set held_from_layout(const tsr_layout *l, const tsr_tensor_decl *t, size_t n) {
    held_set h;
    h.n_ranks = tsr_layout_size(l);
    h.held = calloc(h.n_ranks, sizeof *h.held);
    h.n_held = calloc(h.n_ranks, sizeof *h.n_held);
    tsr_error e = {0};
    for (uint32_t r = 0; r < h.n_ranks; r++)
        REQUIRE(tsr_layout_boxes(l, t, n, r, &h.held[r], &h.n_held[r], &e) == 0, "%s", e.msg);
    return h;
}

static void save_plan_layouts(int iters) {
    char names[8][32];
    for (int it = 0; it < iters && check_failures < 20; it++) {
        uint32_t nl = 1 + (uint32_t)below(6);
        tsr_layout l = random_layout(nl);
        size_t n = below(9);
        tsr_tensor_decl t[8];
        size_t es[8];
        random_tensors(t, n, nl, 9, names);
        /* Flat with tp > 1 or pp > 1: the replicas of a tp-replicated or PP_ALL
         * tensor sit at different places of different group buffers, so they
         * are cut differently and partly overlap, which is not a valid input of
         * the save plan. Only dp_replicate copies are identical. */
        if (l.flags & TSR_LAYOUT_FLAT) l.tp = l.pp = 1;
        for (size_t i = 0; i < n; i++) es[i] = (size_t)1 << below(4);
        held_set h = held_from_layout(&l, t, n);
        tsr_save_plan p = check_save_plan(&h, es, 0, "layout");
        /* each element of each tensor is written exactly once */
        for (uint32_t ti = 0; ti < n; ti++) {
            tsr_box full = whole(t[ti].ndim, t[ti].shape);
            uint64_t vol = tsr_box_volume(&full), got = 0;
            for (size_t i = 0; i < p.n; i++)
                if (p.boxes[i].tensor == ti) got += tsr_box_volume(&p.boxes[i].box);
            CHECK(got == vol, "layout: tensor %u: %llu elements written, volume %llu", ti,
                  (unsigned long long)got, (unsigned long long)vol);
        }
        tsr_save_plan_free(&p);
        held_free(&h);
    }
}

/* Random disjoint boxes of a few tensors, each held by every rank of one class
 * (ranks r with r % classes == c). */
static void save_plan_replicated(int iters) {
    for (int it = 0; it < iters && check_failures < 20; it++) {
        uint32_t classes = 1 + (uint32_t)below(3), per = 1 + (uint32_t)below(8);
        held_set h;
        h.n_ranks = classes * per;
        h.held = calloc(h.n_ranks, sizeof *h.held);
        h.n_held = calloc(h.n_ranks, sizeof *h.n_held);
        size_t es[4] = {1, 2, 4, 8};
        static tsr_box pieces[4][300];
        size_t np[4];
        for (uint32_t ti = 0; ti < 4; ti++) {
            uint64_t shape[3] = {1 + below(64), 1 + below(64), 1 + below(8)};
            tsr_box full = whole(3, shape);
            np[ti] = 0;
            guillotine(&full, 1 + (int)below(300), pieces[ti], &np[ti]);
        }
        for (uint32_t c = 0; c < classes; c++) {
            tsr_rank_box list[1200];
            size_t k = 0;
            for (uint32_t ti = 0; ti < 4; ti++)
                for (size_t i = 0; i < np[ti]; i++)
                    if (pieces[ti][i].offset[2] % classes == c) /* the class's share */
                        list[k].tensor = ti, list[k++].box = pieces[ti][i];
            for (uint32_t r = c; r < h.n_ranks; r += classes) {
                h.held[r] = malloc((k + 1) * sizeof *h.held[r]);
                memcpy(h.held[r], list, k * sizeof *list);
                h.n_held[r] = k;
            }
        }
        tsr_save_plan p = check_save_plan(&h, es, (int)classes, "replicated");
        tsr_save_plan_free(&p);
        held_free(&h);
    }
}

static void save_plan_cases(void) {
    tsr_error e = {0};
    { /* tp-replicated tensors over tp=8: the writes spread over all 8 ranks */
        tsr_layout l = {1, 1, 1, 8, 0, 0};
        tsr_tensor_decl t[16];
        char names[16][32];
        size_t es[16];
        for (int i = 0; i < 16; i++) {
            memset(&t[i], 0, sizeof t[i]);
            snprintf(names[i], sizeof names[i], "norm.%d", i);
            t[i].name = names[i];
            t[i].ndim = 2;
            t[i].shape[0] = 64 + 8 * (uint64_t)i;
            t[i].shape[1] = 32;
            t[i].placement.tp_dim = -1;
            es[i] = 4;
        }
        held_set h = held_from_layout(&l, t, 16);
        tsr_save_plan p = check_save_plan(&h, es, 1, "tp-replicated");
        int writes[8] = {0}, writers = 0;
        for (size_t i = 0; i < p.n; i++) writes[p.writer[i]]++;
        for (int r = 0; r < 8; r++) writers += writes[r] > 0;
        CHECK(p.n == 16 && writers == 8, "tp-replicated: %zu boxes written by %d ranks", p.n, writers);
        /* LPT by hand: the 8 largest (norm.15 .. norm.8) go to ranks 0..7 */
        for (int i = 8; i < 16; i++)
            CHECK(p.writer[i] == (uint32_t)(15 - i), "norm.%d written by rank %u, expected %d", i,
                  p.writer[i], 15 - i);
        tsr_save_plan_free(&p);
        held_free(&h);
    }
    { /* nothing held */
        size_t nh[4] = {0};
        const tsr_rank_box *held[4] = {NULL};
        size_t es[1] = {4};
        tsr_save_plan p;
        CHECK_OK(tsr_save_plan_build(held, nh, 4, es, &p, &e));
        CHECK(p.n == 0 && p.n_ranks == 4 && p.bytes_per_rank && p.bytes_per_rank[3] == 0, "empty plan");
        tsr_save_plan_free(&p);
        tsr_save_plan_free(&p); /* twice is harmless */
        tsr_save_plan_free(NULL);
    }
    { /* errors */
        tsr_rank_box a[2];
        memset(a, 0, sizeof a);
        a[0].box.ndim = 1, a[0].box.extent[0] = 4;
        a[1].box.ndim = 2, a[1].box.extent[0] = 4, a[1].box.extent[1] = 1;
        const tsr_rank_box *held[2] = {&a[0], &a[1]};
        size_t nh[2] = {1, 1}, es[1] = {4}, es0[1] = {0};
        tsr_save_plan p;
        CHECK(tsr_save_plan_build(held, nh, 2, es, &p, &e) == TSR_EINVAL, "mixed dims accepted");
        CHECK(p.n == 0 && !p.boxes, "plan not cleared after an error");
        CHECK(tsr_save_plan_build(held, nh, 1, es0, &p, &e) == TSR_EINVAL, "element size 0 accepted");
        CHECK(tsr_save_plan_build(held, nh, 0, es, &p, &e) == TSR_EINVAL, "0 ranks accepted");
        tsr_save_plan_free(&p);
    }
    { /* flat with tp=2 and a tp-replicated tensor b [6] beside a [3] (cut 2 + 1
       * over tp): b sits in a buffer of its own (its replication class), so its
       * replicas are cut identically on both tp ranks and every element of a and b
       * is written exactly once */
        tsr_layout l = {1, 1, 2, 2, 0, TSR_LAYOUT_FLAT};
        tsr_tensor_decl t[2];
        memset(t, 0, sizeof t);
        t[0].name = "a", t[0].ndim = 1, t[0].shape[0] = 3, t[0].placement.tp_dim = 0;
        t[1].name = "b", t[1].ndim = 1, t[1].shape[0] = 6, t[1].placement.tp_dim = -1;
        size_t es[2] = {4, 4};
        held_set h = held_from_layout(&l, t, 2);
        tsr_save_plan p;
        CHECK_OK(tsr_save_plan_build((const tsr_rank_box *const *)h.held, h.n_held, h.n_ranks, es, &p, &e));
        uint64_t total = 0;
        for (uint32_t r = 0; r < p.n_ranks; r++) total += p.bytes_per_rank[r];
        CHECK(total == (3 + 6) * 4, "flat tp: %llu bytes planned, 36 expected", (unsigned long long)total);
        tsr_save_plan_free(&p);
        held_free(&h);
    }
    { /* replicas that overlap without being equal are refused */
        tsr_rank_box r0[1] = {{0, {1, {0}, {4}}}}, r1[1] = {{0, {1, {2}, {4}}}};
        const tsr_rank_box *held[2] = {r0, r1};
        size_t n_held[2] = {1, 1}, es[1] = {4};
        tsr_save_plan p;
        e.msg[0] = 0;
        int rc = tsr_save_plan_build(held, n_held, 2, es, &p, &e);
        CHECK(rc == TSR_EINVAL && strstr(e.msg, "overlap"), "partly overlapping replicas: rc %d '%s'", rc, e.msg);
        CHECK(p.n == 0 && !p.writer, "plan not cleared after an error");
    }
    { /* many boxes: 64 ranks, dp_replicate 4 x dp_shard 16, 4000 tensors */
        tsr_layout l = {1, 4, 16, 1, 0, 0};
        size_t n = 4000;
        tsr_tensor_decl *t = calloc(n, sizeof *t);
        size_t *es = malloc(n * sizeof *es);
        char(*names)[32] = malloc(n * sizeof *names);
        for (size_t i = 0; i < n; i++) {
            snprintf(names[i], sizeof names[i], "t%zu", i);
            t[i].name = names[i];
            t[i].ndim = 2;
            t[i].shape[0] = 16 + below(100);
            t[i].shape[1] = 1 + below(50);
            t[i].placement.tp_dim = -1;
            t[i].placement.fsdp = 1;
            es[i] = 2;
        }
        held_set h = held_from_layout(&l, t, n);
        tsr_save_plan p;
        CHECK_OK(tsr_save_plan_build((const tsr_rank_box *const *)h.held, h.n_held, h.n_ranks, es, &p, &e));
        uint64_t max = 0, total = 0, largest = 0;
        for (uint32_t r = 0; r < 64; r++) {
            total += p.bytes_per_rank[r];
            if (p.bytes_per_rank[r] > max) max = p.bytes_per_rank[r];
        }
        for (size_t i = 0; i < p.n; i++) {
            uint64_t b = tsr_box_volume(&p.boxes[i].box) * 2;
            if (b > largest) largest = b;
        }
        size_t want = 0; /* nonempty shards of each tensor */
        for (size_t i = 0; i < n; i++) {
            uint64_t rows = t[i].shape[0], c = (rows + 15) / 16;
            want += (rows + c - 1) / c;
        }
        CHECK(p.n == want, "many: %zu distinct boxes, want %zu", p.n, want);
        /* each box has 4 holders of the same dp_shard index: balance within 16
         * classes of 4, and no class is much heavier than the average */
        CHECK(max <= total / 64 * 2 + largest, "many: max %llu of total %llu", (unsigned long long)max,
              (unsigned long long)total);
        tsr_save_plan_free(&p);
        held_free(&h);
        free(t);
        free(es);
        free(names);
    }
}

int main(void) {
    const char *lng = getenv("TSR_LONG");
    int scale = lng && *lng ? 10 : 1;
    overlaps_errors();
    overlaps_random(2000 * scale);
    overlaps_grids(300 * scale);
    overlaps_layouts(300 * scale);
    overlaps_large();
    overlaps_square(2, 300);
    overlaps_square(3, 30);
    save_plan_cases();
    save_plan_replicated(300 * scale);
    save_plan_layouts(300 * scale);
    return check_done();
}
