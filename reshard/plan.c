/* plan.c: the planners (FORMAT.md, section 10, "Layouts"; README, "Where
 * things happen"):
 *  - tsr_plan_overlaps: which stored boxes each needed box reads, by a sweep
 *    along one dim that asks a priority search tree about a second, so that it
 *    takes O((n+m) log(n+m) + k) for k overlaps whatever the boxes, not O(n*m)
 *    (with more than 2 dims, k counts the pairs that meet in those two);
 *  - tsr_save_plan_build: which rank writes each distinct box, replicas written
 *    once, writers balanced by bytes (LPT: largest first, to the least loaded). */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "common.h"
#include "tsr_reshard.h"

/* ------------------------------------------------------------ radix sorts */

/* LSD radix sorts on 64-bit keys, 8 bits a pass, stable; passes whose byte is
 * the same in every key are skipped, so small keys cost few passes, and keys
 * already in order (boxes listed by offset, equal offsets) cost one look.
 * `tmp` has room for n entries. */
typedef struct kv {
    uint64_t key, val;
} kv;

#define RADIX_SORT(NAME, T, KEY)                                                            \
    static void NAME(T *a, T *tmp, size_t n) {                                              \
        if (n < 2) return;                                                                  \
        if (n < 32) { /* insertion sort */                                                  \
            for (size_t i = 1; i < n; i++) {                                                \
                T x = a[i];                                                                 \
                size_t j = i;                                                               \
                for (; j > 0 && KEY(a[j - 1]) > KEY(x); j--) a[j] = a[j - 1];               \
                a[j] = x;                                                                   \
            }                                                                               \
            return;                                                                         \
        }                                                                                   \
        size_t sorted = 1;                                                                  \
        while (sorted < n && KEY(a[sorted - 1]) <= KEY(a[sorted])) sorted++;                \
        if (sorted == n) return;                                                            \
        size_t cnt[8][256];                                                                 \
        memset(cnt, 0, sizeof cnt);                                                         \
        for (size_t i = 0; i < n; i++) {                                                    \
            uint64_t k = KEY(a[i]);                                                         \
            for (int b = 0; b < 8; b++) cnt[b][(k >> (8 * b)) & 255]++;                     \
        }                                                                                   \
        T *src = a, *dst = tmp;                                                             \
        for (int b = 0; b < 8; b++) {                                                       \
            if (cnt[b][(KEY(src[0]) >> (8 * b)) & 255] == n) continue;                      \
            size_t pos = 0;                                                                 \
            for (int v = 0; v < 256; v++) {                                                 \
                size_t c = cnt[b][v];                                                       \
                cnt[b][v] = pos;                                                            \
                pos += c;                                                                   \
            }                                                                               \
            for (size_t i = 0; i < n; i++) dst[cnt[b][(KEY(src[i]) >> (8 * b)) & 255]++] = src[i]; \
            T *t = src;                                                                     \
            src = dst;                                                                      \
            dst = t;                                                                        \
        }                                                                                   \
        if (src != a) memcpy(a, src, n * sizeof *a);                                        \
    }
#define KEY_U64(x) (x)
#define KEY_KV(x) ((x).key)
RADIX_SORT(sort_u64, uint64_t, KEY_U64)
RADIX_SORT(sort_kv, kv, KEY_KV)

/* --------------------------------------------------------------- overlaps */

/* malloc for the large arrays of a plan. Every byte of them is written, so they
 * are worth huge pages: on a machine where page faults are slow, faulting in the
 * output of a million-box plan 4 KiB at a time costs more than the planning.
 * With `zero`, calloc: fresh pages come zeroed, and those never touched cost
 * nothing. */
static void *big_alloc_z(size_t n, size_t size, int zero) {
    if (n > SIZE_MAX / size) return NULL;
    void *p = zero ? calloc(n ? n : 1, size) : malloc(n && size ? n * size : 1);
#ifdef MADV_HUGEPAGE
    if (p && n * size >= ((size_t)8 << 20)) {
        uintptr_t a = ((uintptr_t)p + 4095) & ~(uintptr_t)4095;
        uintptr_t e = ((uintptr_t)p + n * size) & ~(uintptr_t)4095;
        madvise((void *)a, e - a, MADV_HUGEPAGE); /* a hint: failure changes nothing */
    }
#endif
    return p;
}

static void *big_alloc(size_t n, size_t size) { return big_alloc_z(n, size, 0); }

typedef struct pair_list {
    uint64_t *v; /* need << 32 | have */
    size_t n, cap;
} pair_list;

static int push_pair(pair_list *p, uint64_t need, uint64_t have) {
    /* the call only when full: this is the planner's inner loop */
    if (p->n == p->cap && tsr_grow((void **)&p->v, &p->cap, p->n, sizeof *p->v)) return -1;
    p->v[p->n++] = need << 32 | have;
    return 0;
}

static int boxes_meet(const tsr_box *a, const tsr_box *b, uint32_t nd) {
    for (uint32_t d = 0; d < nd; d++)
        if (a->offset[d] >= b->offset[d] + b->extent[d] || b->offset[d] >= a->offset[d] + a->extent[d])
            return 0;
    return 1;
}

static int check_boxes(const char *what, const tsr_box *b, size_t n, uint32_t nd, tsr_error *err) {
    for (size_t i = 0; i < n; i++) {
        if (b[i].ndim != nd)
            return tsr_err(err, TSR_EINVAL, "plan overlaps: %s box %zu has %u dims, box 0 of the "
                           "first list %u", what, i, b[i].ndim, nd);
        for (uint32_t d = 0; d < nd; d++) {
            uint64_t e;
            if (tsr_add_ovf(b[i].offset[d], b[i].extent[d], &e))
                return tsr_err(err, TSR_EINVAL, "plan overlaps: %s box %zu: offset + extent of "
                               "dim %u overflows", what, i, d);
        }
    }
    return 0;
}

static int nonempty(const tsr_box *b) {
    for (uint32_t d = 0; d < b->ndim; d++)
        if (b->extent[d] == 0) return 0;
    return 1;
}

/* The active boxes of one side of the sweep, for the question "which of them
 * meet [lo, hi) in dim k2?": a priority search tree (McCreight). A box is the
 * point (x, y) of its interval [x, y) in dim k2, and it meets [lo, hi) iff
 * x < hi and y > lo, a quadrant. The tree's shape is fixed in advance: its P
 * leaves (a power of two) belong to the boxes in x order, and each node holds
 * at most one box of its subtree: among those not held higher up, one with the
 * largest y (a heap on y). A query stops at any node whose y is too small or
 * whose subtree starts at x >= hi, so it visits O(log n + reported) nodes
 * besides deletions; an insertion or a deletion moves boxes along one path,
 * O(log n). Boxes whose interval in the sweep dim has ended are deleted when a
 * query meets them (lazily): no end events to sort, and each box is deleted at
 * most once. No recursion: the tree is 33 levels deep at most. */
typedef struct pst_box {
    uint64_t x, y; /* its interval [x, y) in dim k2 */
    uint64_t end;  /* where its interval in the sweep dim k ends (exclusive) */
    uint64_t idx;  /* its index in the caller's list */
} pst_box;

/* A node: the y of the box it holds, beside the box's number, so that the heap
 * is kept without loading boxes; y 0 (no box is empty) marks a free node. */
typedef struct pst_node {
    uint64_t y, p;
} pst_node;

typedef struct pst {
    pst_box *box;   /* box[p], p = 0..n-1, in x order */
    pst_node *node; /* node v: 1-based, children 2v and 2v + 1; box p's leaf is P + p */
    uint64_t P;
    unsigned H; /* P = 2^H */
} pst;

/* Sets up the tree of one side, empty, and sorts `s` (the side's nonempty boxes
 * in .val) into sweep order: .key the offset in dim k, .val the box's number in
 * the tree. `tmp` has room for n kv. @return 0 or -1 (out of memory). */
static int pst_init(pst *t, const tsr_box *boxes, kv *s, size_t n, uint32_t k, uint32_t k2, kv *tmp) {
    for (t->P = 1, t->H = 0; t->P < n; t->P *= 2, t->H++) {}
    t->box = big_alloc(n, sizeof *t->box);
    t->node = big_alloc_z(2 * t->P, sizeof *t->node, 1); /* all free (y 0) */
    if (!t->box || !t->node) return -1;
    for (size_t i = 0; i < n; i++) s[i].key = boxes[s[i].val].offset[k2];
    sort_kv(s, tmp, n);
    for (size_t i = 0; i < n; i++) {
        const tsr_box *b = &boxes[s[i].val];
        t->box[i] = (pst_box){b->offset[k2], b->offset[k2] + b->extent[k2], b->offset[k] + b->extent[k],
                              s[i].val};
        s[i].key = b->offset[k];
        s[i].val = i;
    }
    sort_kv(s, tmp, n);
    return 0;
}

static void pst_free(pst *t) {
    free(t->box);
    free(t->node);
}

/* Walks down from the root: the box with the larger y stays, the other goes on
 * towards its own leaf, which only it can take, so the walk ends there at the
 * latest. */
static void pst_insert(pst *t, uint64_t p) {
    pst_node e = {t->box[p].y, p};
    for (uint64_t v = 1, d = 1;; d++) {
        if (!t->node[v].y) {
            t->node[v] = e;
            return;
        }
        if (e.y > t->node[v].y) {
            pst_node x = t->node[v];
            t->node[v] = e;
            e = x;
        }
        v = (t->P + e.p) >> (t->H - d);
    }
}

/* Empties node v: the child with the larger y moves up, and so on down. */
static void pst_delete(pst *t, uint64_t v) {
    while (v < t->P) {
        uint64_t c = 2 * v; /* the child that moves up */
        if (t->node[c + 1].y > t->node[c].y) c++;
        t->node[v] = t->node[c];
        if (!t->node[v].y) return;
        v = c;
    }
    t->node[v] = (pst_node){0, 0};
}

/* A box `q` of the other side starts at `now` in the sweep dim: records a pair
 * with each box of t that meets it. Such a box meets it in dim k2 (the
 * quadrant), has not ended in dim k (it started at or before `now`, being in
 * the tree), and, with more than 2 dims, meets it in the others too (checked
 * one by one: the bound then holds for the boxes met in dims k and k2).
 * @return 0 or -1 (out of memory). */
static int pst_query(pst *t, const pst_box *q, uint64_t now, const tsr_box *q_box,
                     const tsr_box *boxes, uint32_t nd, int q_is_need, pair_list *pairs) {
    /* depth first; the stack holds at most one node a level (33 levels) */
    struct {
        uint64_t v, first, leaves; /* a node, its first leaf (0-based), its number of leaves */
    } stack[64];
    size_t sp = 0;
    stack[sp].v = 1, stack[sp].first = 0, stack[sp++].leaves = t->P;
    while (sp) {
        sp--;
        uint64_t v = stack[sp].v, first = stack[sp].first, half = stack[sp].leaves / 2;
        if (t->node[v].y <= q->x) continue; /* free, or the heap: no y below is larger */
        const pst_box *b = &t->box[t->node[v].p];
        if (b->end <= now) { /* it left the sweep: delete it, look again */
            pst_delete(t, v);
            sp++; /* v again, still there on the stack */
            continue;
        }
        if (b->x < q->y) {
            if (nd <= 2 || boxes_meet(q_box, &boxes[b->idx], nd)) {
                int rc = q_is_need ? push_pair(pairs, q->idx, b->idx) : push_pair(pairs, b->idx, q->idx);
                if (rc) return -1;
            }
        } else if (t->box[first].x >= q->y) {
            continue; /* every x below is at least hi */
        }
        if (half) {
            stack[sp].v = 2 * v + 1, stack[sp].first = first + half, stack[sp++].leaves = half;
            stack[sp].v = 2 * v, stack[sp].first = first, stack[sp++].leaves = half;
        }
    }
    return 0;
}

/* The sweep proper: fills `pairs` with every (need, have) that meets. `ns`, `hs`
 * hold the indices of the nonempty boxes in .val; `scratch` has room for
 * nn + nh kv. The boxes start in the order of their offsets in the sweep dim k;
 * each one looks for the boxes of the other side that started before it, have
 * not ended yet and meet it in dim k2, in the other side's tree, then joins its
 * own. @return 0 or -1 (out of memory). */
static int sweep(const tsr_box *need, kv *ns, size_t nn, const tsr_box *have, kv *hs, size_t nh,
                 uint32_t nd, kv *scratch, pair_list *pairs) {
    /* Sweep along the dim with the most distinct offsets among all boxes (it
     * keeps the trees small), and ask the trees about the runner-up, the best
     * filter among the rest. */
    uint32_t k = 0, k2 = 0;
    if (nd > 1) {
        uint64_t *keys = (uint64_t *)scratch, *ktmp = keys + nn + nh;
        size_t best = 0, second = 0;
        for (uint32_t d = 0; d < nd; d++) {
            for (size_t i = 0; i < nn; i++) keys[i] = need[ns[i].val].offset[d];
            for (size_t j = 0; j < nh; j++) keys[nn + j] = have[hs[j].val].offset[d];
            sort_u64(keys, ktmp, nn + nh);
            size_t distinct = 1;
            for (size_t i = 1; i < nn + nh; i++) distinct += keys[i] != keys[i - 1];
            if (distinct > best) second = best, k2 = k, best = distinct, k = d;
            else if (distinct > second || d == 1) second = distinct, k2 = d;
        }
    }
    pst tn = {0}, th = {0};
    int rc = pst_init(&tn, need, ns, nn, k, k2, scratch);
    if (!rc) rc = pst_init(&th, have, hs, nh, k, k2, scratch);
    for (size_t i = 0, j = 0; (i < nn || j < nh) && !rc;) {
        /* at equal starts, stored boxes go first (either order finds every pair) */
        if (j < nh && (i == nn || hs[j].key <= ns[i].key)) {
            const pst_box *b = &th.box[hs[j].val];
            rc = pst_query(&tn, b, hs[j].key, &have[b->idx], need, nd, 0, pairs);
            pst_insert(&th, hs[j++].val);
        } else {
            const pst_box *b = &tn.box[ns[i].val];
            rc = pst_query(&th, b, ns[i].key, &need[b->idx], have, nd, 1, pairs);
            pst_insert(&tn, ns[i++].val);
        }
    }
    pst_free(&tn);
    pst_free(&th);
    return rc;
}

int tsr_plan_overlaps(const tsr_box *need, size_t n_need, const tsr_box *have, size_t n_have,
                      tsr_overlap **out, size_t *n_out, tsr_error *err) {
    if (!out || !n_out || (n_need && !need) || (n_have && !have))
        return tsr_err(err, TSR_EINVAL, "plan overlaps: NULL argument");
    *out = NULL;
    *n_out = 0;
    if (n_need > UINT32_MAX || n_have > UINT32_MAX)
        return tsr_err(err, TSR_EINVAL, "plan overlaps: %zu needed and %zu stored boxes (at most "
                       "2^32-1 each)", n_need, n_have);
    uint32_t nd = n_need ? need[0].ndim : n_have ? have[0].ndim : 0;
    if (nd > TSR_MAX_DIMS) return tsr_err(err, TSR_EINVAL, "plan overlaps: %u dims", nd);
    int rc = check_boxes("needed", need, n_need, nd, err);
    if (!rc) rc = check_boxes("stored", have, n_have, nd, err);
    if (rc) return rc;

    pair_list pairs = {0};
    kv *ns = NULL, *hs = NULL, *scratch = NULL;
    uint64_t *ptmp = NULL;
    tsr_overlap *o = NULL;
    if (nd == 0) { /* every 0-d box is the one element: all pairs meet */
        for (size_t i = 0; i < n_need; i++)
            for (size_t j = 0; j < n_have; j++)
                if (push_pair(&pairs, i, j)) goto nomem;
    } else {
        /* the nonempty boxes of each side */
        ns = big_alloc(n_need, sizeof *ns);
        hs = big_alloc(n_have, sizeof *hs);
        scratch = big_alloc(n_need + n_have + 1, sizeof *scratch);
        if (!ns || !hs || !scratch) goto nomem;
        size_t nn = 0, nh = 0;
        for (size_t i = 0; i < n_need; i++)
            if (nonempty(&need[i])) ns[nn++].val = i;
        for (size_t j = 0; j < n_have; j++)
            if (nonempty(&have[j])) hs[nh++].val = j;
        if (nn && nh) {
            /* most plans find about one overlap per box */
            pairs.cap = nn + nh;
            if (!(pairs.v = big_alloc(pairs.cap, sizeof *pairs.v))) goto nomem;
            if (sweep(need, ns, nn, have, hs, nh, nd, scratch, &pairs)) goto nomem;
        }
        free(ns);
        free(hs);
        ns = hs = NULL;
    }

    /* (need, have) order; the scratch space sorts them if it is large enough */
    if (scratch && pairs.n <= 2 * (n_need + n_have + 1)) {
        ptmp = (uint64_t *)scratch;
        scratch = NULL;
    } else if (!(ptmp = big_alloc(pairs.n, sizeof *ptmp))) {
        goto nomem;
    }
    sort_u64(pairs.v, ptmp, pairs.n);
    free(ptmp);
    free(scratch);
    ptmp = NULL;
    scratch = NULL;
    if (!(o = big_alloc(pairs.n, sizeof *o))) goto nomem;
    for (size_t p = 0; p < pairs.n; p++) {
        uint32_t i = (uint32_t)(pairs.v[p] >> 32), j = (uint32_t)pairs.v[p];
        o[p].need = i;
        o[p].have = j;
        tsr_box_intersect(&need[i], &have[j], &o[p].region);
    }
    *out = o;
    *n_out = pairs.n;
    free(pairs.v);
    return 0;

nomem:
    free(pairs.v);
    free(ns);
    free(hs);
    free(scratch);
    free(ptmp);
    return tsr_err(err, TSR_ENOMEM, "plan overlaps: out of memory (%zu needed, %zu stored boxes, "
                   "%zu overlaps so far)", n_need, n_have, pairs.n);
}

/* -------------------------------------------------------------- save plan */

/* One box as some rank holds it. */
typedef struct held_ref {
    const tsr_rank_box *rb;
    uint32_t rank;
    uint32_t pos; /* its index in the rank's list, so that the order is total */
} held_ref;

static int cmp_box_of(const tsr_rank_box *a, const tsr_rank_box *b) {
    if (a->tensor != b->tensor) return a->tensor < b->tensor ? -1 : 1;
    if (a->box.ndim != b->box.ndim) return a->box.ndim < b->box.ndim ? -1 : 1;
    for (uint32_t d = 0; d < a->box.ndim; d++)
        if (a->box.offset[d] != b->box.offset[d]) return a->box.offset[d] < b->box.offset[d] ? -1 : 1;
    for (uint32_t d = 0; d < a->box.ndim; d++)
        if (a->box.extent[d] != b->box.extent[d]) return a->box.extent[d] < b->box.extent[d] ? -1 : 1;
    return 0;
}

static int cmp_held(const void *pa, const void *pb) {
    const held_ref *a = pa, *b = pb;
    int c = cmp_box_of(a->rb, b->rb);
    if (c) return c;
    if (a->rank != b->rank) return a->rank < b->rank ? -1 : 1;
    return (a->pos > b->pos) - (a->pos < b->pos);
}

static void fmt_offset(const tsr_box *b, char *buf, size_t len) {
    size_t n = 0;
    buf[0] = 0;
    for (uint32_t d = 0; d < b->ndim && n < len; d++)
        n += (size_t)snprintf(buf + n, len - n, "%s%llu", d ? "," : "(", (unsigned long long)b->offset[d]);
    if (n < len) snprintf(buf + n, len - n, ")");
}

/* The distinct boxes of each tensor (plan->boxes, sorted by tensor) must not
 * overlap: replicas are equal or disjoint. Two replicas cut differently (flat
 * sharding of a tp-replicated tensor with tp > 1, say) would both be written. */
static int check_disjoint(const tsr_save_plan *plan, tsr_error *err) {
    int rc = 0;
    for (size_t a = 0, b; a < plan->n && !rc; a = b) {
        uint32_t t = plan->boxes[a].tensor, nd = plan->boxes[a].box.ndim;
        for (b = a + 1; b < plan->n && plan->boxes[b].tensor == t; b++) {}
        size_t n = b - a;
        if (n < 2 || nd == 0) continue;
        tsr_box *boxes = big_alloc(n, sizeof *boxes);
        kv *ns = big_alloc(n, sizeof *ns), *hs = big_alloc(n, sizeof *hs);
        kv *scratch = big_alloc(2 * n, sizeof *scratch);
        pair_list pairs = {big_alloc(2 * n, sizeof *pairs.v), 0, 2 * n};
        if (!boxes || !ns || !hs || !scratch || !pairs.v) {
            rc = tsr_err(err, TSR_ENOMEM, "save plan: out of memory for %zu boxes", n);
        } else {
            for (size_t i = 0; i < n; i++) {
                boxes[i] = plan->boxes[a + i].box;
                ns[i].val = hs[i].val = i;
            }
            if (sweep(boxes, ns, n, boxes, hs, n, nd, scratch, &pairs))
                rc = tsr_err(err, TSR_ENOMEM, "save plan: out of memory for the overlaps of %zu boxes", n);
            for (size_t p = 0; p < pairs.n && !rc; p++) {
                uint32_t i = (uint32_t)(pairs.v[p] >> 32), j = (uint32_t)pairs.v[p];
                if (i == j) continue;
                char oi[200], oj[200];
                fmt_offset(&boxes[i < j ? i : j], oi, sizeof oi);
                fmt_offset(&boxes[i < j ? j : i], oj, sizeof oj);
                rc = tsr_err(err, TSR_EINVAL, "save plan: tensor %u: the boxes held at %s and at %s "
                             "overlap without being equal (replicas must be equal or disjoint)", t, oi, oj);
            }
        }
        free(boxes);
        free(ns);
        free(hs);
        free(scratch);
        free(pairs.v);
    }
    return rc;
}

void tsr_save_plan_free(tsr_save_plan *plan) {
    if (!plan) return;
    free(plan->boxes);
    free(plan->writer);
    free(plan->bytes_per_rank);
    memset(plan, 0, sizeof *plan);
}

int tsr_save_plan_build(const tsr_rank_box *const *held, const size_t *n_held, uint32_t n_ranks,
                        const size_t *elem_size, tsr_save_plan *plan, tsr_error *err) {
    if (!plan) return tsr_err(err, TSR_EINVAL, "save plan: NULL plan");
    memset(plan, 0, sizeof *plan);
    if (n_ranks == 0) return tsr_err(err, TSR_EINVAL, "save plan: 0 ranks");
    if (!held || !n_held || !elem_size) return tsr_err(err, TSR_EINVAL, "save plan: NULL argument");

    /* Every nonempty box of every rank, sorted by (tensor, box, rank): replicas
     * of one box become neighbours, their holders in rank order. */
    size_t total = 0;
    for (uint32_t r = 0; r < n_ranks; r++) {
        if (n_held[r] && !held[r])
            return tsr_err(err, TSR_EINVAL, "save plan: rank %u holds %zu boxes at NULL", r, n_held[r]);
        if (n_held[r] > UINT32_MAX)
            return tsr_err(err, TSR_EINVAL, "save plan: rank %u holds %zu boxes", r, n_held[r]);
        total += n_held[r];
    }
    held_ref *refs = malloc((total ? total : 1) * sizeof *refs);
    if (!refs) return tsr_err(err, TSR_ENOMEM, "save plan: out of memory for %zu boxes", total);
    size_t m = 0;
    for (uint32_t r = 0; r < n_ranks; r++)
        for (size_t i = 0; i < n_held[r]; i++) {
            const tsr_rank_box *rb = &held[r][i];
            if (rb->box.ndim > TSR_MAX_DIMS) {
                free(refs);
                return tsr_err(err, TSR_EINVAL, "save plan: rank %u box %zu (tensor %u) has %u dims",
                               r, i, rb->tensor, rb->box.ndim);
            }
            if (!nonempty(&rb->box)) continue; /* nothing to write */
            refs[m].rb = rb;
            refs[m].rank = r;
            refs[m++].pos = (uint32_t)i;
        }
    tsr_sort(refs, m, sizeof *refs, cmp_held);

    /* Distinct boxes: group g is refs[first[g] .. first[g+1]). */
    size_t nd = 0;
    size_t *first = malloc((m + 1) * sizeof *first);
    if (!first) {
        free(refs);
        return tsr_err(err, TSR_ENOMEM, "save plan: out of memory for %zu boxes", m);
    }
    for (size_t i = 0; i < m; i++) {
        if (i && refs[i].rb->tensor == refs[i - 1].rb->tensor &&
            refs[i].rb->box.ndim != refs[i - 1].rb->box.ndim) {
            int rc = tsr_err(err, TSR_EINVAL, "save plan: tensor %u held with %u dims by rank %u "
                             "and %u dims by rank %u", refs[i].rb->tensor, refs[i - 1].rb->box.ndim,
                             refs[i - 1].rank, refs[i].rb->box.ndim, refs[i].rank);
            free(refs);
            free(first);
            return rc;
        }
        if (!i || cmp_box_of(refs[i].rb, refs[i - 1].rb)) first[nd++] = i;
    }
    first[nd] = m;

    plan->n = nd;
    plan->n_ranks = n_ranks;
    plan->boxes = malloc((nd ? nd : 1) * sizeof *plan->boxes);
    plan->writer = malloc((nd ? nd : 1) * sizeof *plan->writer);
    plan->bytes_per_rank = calloc(n_ranks, sizeof *plan->bytes_per_rank);
    kv *order = malloc((nd ? nd : 1) * sizeof *order), *tmp = malloc((nd ? nd : 1) * sizeof *tmp);
    int rc = 0;
    if (!plan->boxes || !plan->writer || !plan->bytes_per_rank || !order || !tmp) {
        rc = tsr_err(err, TSR_ENOMEM, "save plan: out of memory for %zu boxes", nd);
        goto done;
    }
    for (size_t g = 0; g < nd; g++) {
        const tsr_rank_box *rb = refs[first[g]].rb;
        plan->boxes[g] = *rb;
        uint64_t bytes;
        if (elem_size[rb->tensor] == 0) {
            rc = tsr_err(err, TSR_EINVAL, "save plan: tensor %u has element size 0", rb->tensor);
            goto done;
        }
        if (tsr_mul_ovf(tsr_box_volume(&rb->box), elem_size[rb->tensor], &bytes)) {
            rc = tsr_err(err, TSR_EINVAL, "save plan: a box of tensor %u holds more than 2^64 bytes",
                         rb->tensor);
            goto done;
        }
        order[g].key = ~bytes; /* largest first; equal sizes in (tensor, offset) order */
        order[g].val = g;
    }
    sort_kv(order, tmp, nd);
    if ((rc = check_disjoint(plan, err))) goto done;

    /* LPT: each box to the holder with the fewest bytes so far, lowest rank on ties. */
    for (size_t q = 0; q < nd; q++) {
        size_t g = order[q].val;
        uint64_t bytes = ~order[q].key;
        uint32_t best = refs[first[g]].rank;
        for (size_t i = first[g] + 1; i < first[g + 1]; i++)
            if (plan->bytes_per_rank[refs[i].rank] < plan->bytes_per_rank[best]) best = refs[i].rank;
        plan->writer[g] = best;
        plan->bytes_per_rank[best] += bytes;
    }

done:
    free(refs);
    free(first);
    free(order);
    free(tmp);
    if (rc) tsr_save_plan_free(plan);
    return rc;
}
