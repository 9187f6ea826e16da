/* engine_plan.c: the save plan: every rank's boxes gathered once per layout
 * (cached by a key of the state's shape), which rank writes which box. */
#include "engine_impl.h"

/* ------------------------------------------------------------- planning */

uint64_t engine_state_key(const tsr_state *st) {
    uint64_t h = tsr_hash(&st->n_tensors, sizeof st->n_tensors);
    for (size_t i = 0; i < st->n_tensors; i++) {
        const tsr_tensor_decl *t = &st->tensors[i];
        h ^= tsr_hash(t->name, strlen(t->name)) * 31 + i;
        uint64_t fields[12] = {(uint64_t)t->dtype, t->ndim, (uint64_t)(int64_t)t->placement.tp_dim, t->placement.fsdp,
                               t->placement.pp_role, (uint64_t)(int64_t)t->placement.layer};
        h = h * 1099511628211ull ^ tsr_hash(fields, sizeof fields);
        h = h * 1099511628211ull ^ tsr_hash(t->shape, t->ndim * sizeof(uint64_t));
    }
    for (size_t i = 0; i < st->n_boxes; i++) {
        const tsr_state_box *b = &st->boxes[i];
        h = h * 1099511628211ull ^ tsr_hash(&b->tensor, sizeof b->tensor);
        h = h * 1099511628211ull ^ tsr_hash(b->box.offset, b->box.ndim * sizeof(uint64_t));
        h = h * 1099511628211ull ^ tsr_hash(b->box.extent, b->box.ndim * sizeof(uint64_t));
    }
    return h;
}

/* Serialized box list: per box, u32 tensor, u32 ndim, ndim x (offset, extent). */
static uint8_t *pack_boxes(const tsr_state *st, size_t *len) {
    size_t n = 0;
    for (size_t i = 0; i < st->n_boxes; i++) n += 8 + 16 * st->boxes[i].box.ndim;
    uint8_t *p = malloc(n ? n : 1), *q = p;
    if (!p) return NULL;
    for (size_t i = 0; i < st->n_boxes; i++) {
        const tsr_state_box *b = &st->boxes[i];
        tsr_st32(q, b->tensor);
        tsr_st32(q + 4, b->box.ndim);
        q += 8;
        for (uint32_t d = 0; d < b->box.ndim; d++, q += 16) {
            tsr_st64(q, b->box.offset[d]);
            tsr_st64(q + 8, b->box.extent[d]);
        }
    }
    *len = n;
    return p;
}


void engine_all_boxes_free(all_boxes *a) {
    free(a->v);
    free(a->held);
    free(a->n_held);
}

int engine_gather_boxes(tsr_comm *c, const tsr_state *st, all_boxes *out, tsr_error *err) {
    size_t len = 0;
    uint8_t *mine = pack_boxes(st, &len), *all = NULL;
    size_t *counts = NULL;
    if (!mine) return tsr_err(err, TSR_ENOMEM, "out of memory");
    int rc = tsr_comm_allgatherv(c, mine, len, &all, &counts, err);
    free(mine);
    if (rc) return rc;
    uint32_t n = tsr_comm_size(c);
    size_t total = 0;
    for (uint32_t r = 0; r < n; r++) total += counts[r] / 8 + 1; /* an upper bound on boxes */
    out->v = malloc(total * sizeof *out->v);
    out->held = calloc(n, sizeof *out->held);
    out->n_held = calloc(n, sizeof *out->n_held);
    if (!out->v || !out->held || !out->n_held) {
        engine_all_boxes_free(out);
        free(all), free(counts);
        return tsr_err(err, TSR_ENOMEM, "out of memory");
    }
    size_t k = 0, off = 0;
    for (uint32_t r = 0; r < n; r++) {
        out->held[r] = out->v + k;
        const uint8_t *p = all + off, *end = all + off + counts[r];
        while (p + 8 <= end) {
            tsr_rank_box *b = &out->v[k++];
            b->tensor = tsr_ld32(p);
            b->box.ndim = tsr_ld32(p + 4);
            p += 8;
            for (uint32_t d = 0; d < b->box.ndim && d < TSR_MAX_DIMS; d++, p += 16) {
                b->box.offset[d] = tsr_ld64(p);
                b->box.extent[d] = tsr_ld64(p + 8);
            }
            out->n_held[r]++;
        }
        off += counts[r];
    }
    free(all), free(counts);
    return 0;
}

static int cmp_rank_box(const tsr_rank_box *a, const tsr_rank_box *b) {
    if (a->tensor != b->tensor) return a->tensor < b->tensor ? -1 : 1;
    for (uint32_t d = 0; d < a->box.ndim; d++)
        if (a->box.offset[d] != b->box.offset[d]) return a->box.offset[d] < b->box.offset[d] ? -1 : 1;
    return 0;
}

/* The index in plan->boxes of (tensor, box), or -1. */
long engine_plan_find(const tsr_save_plan *p, uint32_t tensor, const tsr_box *box) {
    tsr_rank_box key = {tensor, *box};
    size_t lo = 0, hi = p->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = cmp_rank_box(&p->boxes[mid], &key);
        if (c == 0) return (long)mid;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

int engine_check_state(const tsr_state *st, tsr_error *err) {
    for (size_t i = 0; i < st->n_boxes; i++) {
        const tsr_state_box *b = &st->boxes[i];
        if (b->tensor >= st->n_tensors) return tsr_err(err, TSR_EINVAL, "state box %zu: tensor %u of %zu", i, b->tensor, st->n_tensors);
        const tsr_tensor_decl *t = &st->tensors[b->tensor];
        if (b->box.ndim != t->ndim) return tsr_err(err, TSR_EINVAL, "%s: box has %u dims, tensor %u", t->name, b->box.ndim, t->ndim);
        for (uint32_t d = 0; d < t->ndim; d++)
            if (b->box.offset[d] > t->shape[d] || b->box.extent[d] > t->shape[d] - b->box.offset[d])
                return tsr_err(err, TSR_EINVAL, "%s: box outside the tensor's shape in dim %u", t->name, d);
    }
    return 0;
}

size_t *engine_elem_sizes(const tsr_state *st) {
    size_t *es = malloc((st->n_tensors + 1) * sizeof *es);
    if (es)
        for (size_t i = 0; i < st->n_tensors; i++) es[i] = tsr_dtype_size(st->tensors[i].dtype);
    return es;
}

/* Plans (every rank, after engine_agree said so): e->mine lists the state boxes
 * this rank writes. */
int engine_plan_save(tsr_engine *e, const tsr_state *st, tsr_error *err) {
    uint64_t key = engine_state_key(st);
    int rc = 0;
    e->have_plan = 0;
    all_boxes ab = {0};
    if ((rc = engine_gather_boxes(e->comm, st, &ab, err))) return rc;
    size_t *es = engine_elem_sizes(st);
    tsr_save_plan plan = {0};
    if (!es) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    if (!rc) rc = tsr_save_plan_build(ab.held, ab.n_held, e->size, es, &plan, err);
    free(es);
    engine_all_boxes_free(&ab);
    if (rc) return rc;
    free(e->mine);
    e->mine = malloc((st->n_boxes + 1) * sizeof *e->mine);
    e->n_mine = 0;
    if (!e->mine) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    for (size_t i = 0; !rc && i < st->n_boxes; i++) {
        if (tsr_box_volume(&st->boxes[i].box) == 0) continue;
        long k = engine_plan_find(&plan, st->boxes[i].tensor, &st->boxes[i].box);
        if (k >= 0 && plan.writer[k] == e->rank) {
            e->mine[e->n_mine++] = i;
            plan.writer[k] = UINT32_MAX; /* a box listed twice by this rank is written once */
        }
    }
    tsr_save_plan_free(&plan);
    if (!rc) {
        e->plan_key = key;
        e->have_plan = 1;
    }
    return rc;
}
