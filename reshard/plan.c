/* plan.c: the planners (DESIGN.md, "Global tensors, boxes and layouts" and
 * "Async save pipeline"):
 *  - tsr_plan_overlaps: which stored boxes each needed box reads, by sort and
 *    sweep along one dim, so that it scales as O((n+m) log(n+m)) plus the
 *    overlaps found, not O(n*m);
 *  - tsr_save_plan_build: which rank writes each distinct box, replicas written
 *    once, writers balanced by bytes (LPT: largest first, to the least loaded). */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "common.h"
#include "tessera.h"

/* ------------------------------------------------------------ radix sorts */

/* LSD radix sorts on 64-bit keys, 8 bits a pass, stable; passes whose byte is
 * the same in every key are skipped, so small keys cost few passes. `tmp` has
 * room for n entries. */
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
 * output of a million-box plan 4 KiB at a time costs more than the planning. */
static void *big_alloc(size_t n, size_t size) {
    if (n > SIZE_MAX / size) return NULL;
    void *p = malloc(n && size ? n * size : 1);
#ifdef MADV_HUGEPAGE
    if (p && n * size >= ((size_t)8 << 20)) {
        uintptr_t a = ((uintptr_t)p + 4095) & ~(uintptr_t)4095;
        uintptr_t e = ((uintptr_t)p + n * size) & ~(uintptr_t)4095;
        madvise((void *)a, e - a, MADV_HUGEPAGE); /* a hint: failure changes nothing */
    }
#endif
    return p;
}

/* An entry of a sweep's active list: a box whose interval in the sweep dim
 * ends at `end` (exclusive), with its interval [lo2, hi2) in a second dim, so
 * that most boxes that do not meet are told apart without loading them. */
typedef struct active {
    uint64_t end, lo2, hi2;
    uint64_t idx;
} active;

typedef struct active_list {
    active *v;
    size_t n, cap;
} active_list;

static int push_active(active_list *a, const tsr_box *b, uint32_t k, uint32_t k2, uint64_t idx) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 64;
        active *v = realloc(a->v, cap * sizeof *v);
        if (!v) return -1;
        a->v = v;
        a->cap = cap;
    }
    active *e = &a->v[a->n++];
    e->end = b->offset[k] + b->extent[k];
    e->lo2 = b->offset[k2];
    e->hi2 = b->offset[k2] + b->extent[k2];
    e->idx = idx;
    return 0;
}

typedef struct pair_list {
    uint64_t *v; /* need << 32 | have */
    size_t n, cap;
} pair_list;

static int push_pair(pair_list *p, uint64_t need, uint64_t have) {
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 1024;
        uint64_t *v = realloc(p->v, cap * sizeof *v);
        if (!v) return -1;
        p->v = v;
        p->cap = cap;
    }
    p->v[p->n++] = need << 32 | have;
    return 0;
}

static int boxes_meet(const tsr_box *a, const tsr_box *b, uint32_t nd) {
    for (uint32_t d = 0; d < nd; d++)
        if (a->offset[d] >= b->offset[d] + b->extent[d] || b->offset[d] >= a->offset[d] + a->extent[d])
            return 0;
    return 1;
}

/* A box starts at `x` in the sweep dim k: drop the other side's entries that
 * ended at or before x, record a pair with each remaining one that meets the
 * box (they meet in dim k already; with at most 2 dims, dim k2 settles it). */
static int sweep_event(const tsr_box *box, uint64_t idx, uint64_t x, uint32_t k2, active_list *other,
                       const tsr_box *other_boxes, uint32_t nd, int box_is_need, pair_list *pairs) {
    active *v = other->v;
    size_t n = other->n;
    uint64_t lo2 = box->offset[k2], hi2 = box->offset[k2] + box->extent[k2];
    for (size_t i = 0; i < n;) {
        if (v[i].end <= x) {
            v[i] = v[--n];
            continue;
        }
        if (v[i].lo2 < hi2 && lo2 < v[i].hi2 && (nd <= 2 || boxes_meet(box, &other_boxes[v[i].idx], nd))) {
            int rc = box_is_need ? push_pair(pairs, idx, v[i].idx) : push_pair(pairs, v[i].idx, idx);
            if (rc) return -1;
        }
        i++;
    }
    other->n = n;
    return 0;
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

/* The sweep proper: fills `pairs` with every (need, have) that meets. `ns`, `hs`
 * hold the indices of the nonempty boxes in .val; `scratch` has room for
 * nn + nh kv. @return 0 or -1 (out of memory). */
static int sweep(const tsr_box *need, kv *ns, size_t nn, const tsr_box *have, kv *hs, size_t nh,
                 uint32_t nd, kv *scratch, pair_list *pairs) {
    /* Sweep along the dim with the most distinct offsets among all boxes: it
     * keeps the active lists shortest. */
    uint32_t k = 0, k2 = 0; /* k2: the runner-up, checked first in the sweep */
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
    for (size_t i = 0; i < nn; i++) ns[i].key = need[ns[i].val].offset[k];
    for (size_t j = 0; j < nh; j++) hs[j].key = have[hs[j].val].offset[k];
    sort_kv(ns, scratch, nn);
    sort_kv(hs, scratch, nh);

    active_list an = {0}, ah = {0};
    int rc = 0;
    for (size_t i = 0, j = 0; (i < nn || j < nh) && !rc;) {
        /* at equal starts, stored boxes go first (either order finds every pair) */
        if (j < nh && (i == nn || hs[j].key <= ns[i].key)) {
            const tsr_box *b = &have[hs[j].val];
            rc = sweep_event(b, hs[j].val, hs[j].key, k2, &an, need, nd, 0, pairs);
            if (!rc) rc = push_active(&ah, b, k, k2, hs[j].val);
            j++;
        } else {
            const tsr_box *b = &need[ns[i].val];
            rc = sweep_event(b, ns[i].val, ns[i].key, k2, &ah, have, nd, 1, pairs);
            if (!rc) rc = push_active(&an, b, k, k2, ns[i].val);
            i++;
        }
    }
    free(an.v);
    free(ah.v);
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
