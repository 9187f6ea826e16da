/* layout.c: rank meshes and the boxes each rank holds under a layout (FORMAT.md,
 * section 10, "Layouts").
 *
 * The mesh is [pp][dp_replicate][dp_shard][tp], tp fastest. Every uneven cut is a
 * ceil division (torch.chunk, FSDP2): n elements into k pieces of c = ceil(n/k),
 * piece i = [i*c, min((i+1)*c, n)), so trailing pieces may be short or empty. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "manifest.h"
#include "tsr_reshard.h"

/* ------------------------------------------------------------ parse/format */

enum { K_PP, K_DPR, K_DPS, K_TP, K_LAYERS, K_FLAT, N_KEYS };
static const char *const key_names[N_KEYS] = {"pp", "dp_replicate", "dp_shard", "tp", "layers",
                                              "flat"};

/* A decimal number of at most 10 digits that fits in 32 bits. @return 0 or -1. */
static int parse_u32(const char *s, size_t len, uint32_t *out) {
    if (len == 0 || len > 10) return -1;
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (v > UINT32_MAX) return -1;
    *out = (uint32_t)v;
    return 0;
}

/* The world size in 64 bits (no overflow: four 32-bit factors would, so stop early). */
static uint64_t world64(const tsr_layout *l) {
    uint64_t w = (uint64_t)l->pp * l->dp_replicate;
    if (w > UINT32_MAX) return w;
    w *= l->dp_shard;
    if (w > UINT32_MAX) return w;
    return w * l->tp;
}

/* The limits are the format's (FORMAT.md section 7), so that every layout a
 * tool accepts can be recorded in a MANIFEST that readers accept. */
static int check_layout(const tsr_layout *l, tsr_error *err) {
    char text[160], why[200];
    tsr_layout_format(l, text, sizeof text);
    if (tsr_layout_problem(l, why, sizeof why)) return tsr_err(err, TSR_EINVAL, "layout %s: %s", text, why);
    return 0;
}

int tsr_layout_parse(const char *text, tsr_layout *out, tsr_error *err) {
    if (!text || !out) return tsr_err(err, TSR_EINVAL, "layout: NULL argument");
    tsr_layout l = {1, 1, 1, 1, out->n_layers, 0};
    uint32_t *deg[4] = {&l.pp, &l.dp_replicate, &l.dp_shard, &l.tp};
    unsigned seen = 0;
    /* The empty text is the layout of one rank (every degree 1). */
    for (const char *p = text; *p;) {
        const char *end = strchr(p, ',');
        if (!end) end = p + strlen(p);
        size_t len = (size_t)(end - p);
        const char *eq = memchr(p, '=', len);
        size_t klen = eq ? (size_t)(eq - p) : len;
        const char *val = eq ? eq + 1 : NULL;
        size_t vlen = eq ? (size_t)(end - val) : 0;
        int key = -1;
        for (int k = 0; k < N_KEYS; k++)
            if (strlen(key_names[k]) == klen && memcmp(p, key_names[k], klen) == 0) key = k;
        if (key < 0)
            return tsr_err(err, TSR_EINVAL,
                           "layout \"%.200s\": unknown part \"%.*s\" (want pp=, dp_replicate=, "
                           "dp_shard=, tp=, layers= or flat)",
                           text, (int)(len > 200 ? 200 : len), p);
        if (seen & (1u << key))
            return tsr_err(err, TSR_EINVAL, "layout \"%.200s\": %s given twice", text, key_names[key]);
        seen |= 1u << key;
        uint32_t v = 1;
        if (key == K_FLAT) {
            if (val && (parse_u32(val, vlen, &v) || v > 1))
                return tsr_err(err, TSR_EINVAL, "layout \"%.200s\": bad part \"%.*s\" (want flat, "
                               "flat=0 or flat=1)", text, (int)(len > 200 ? 200 : len), p);
            l.flags = v ? TSR_LAYOUT_FLAT : 0;
        } else {
            if (!val || parse_u32(val, vlen, &v) || (key != K_LAYERS && v == 0))
                return tsr_err(err, TSR_EINVAL, "layout \"%.200s\": bad part \"%.*s\" (want %s=N "
                               "with N a %snumber)", text, (int)(len > 200 ? 200 : len), p,
                               key_names[key], key == K_LAYERS ? "" : "positive ");
            if (key == K_LAYERS) l.n_layers = v;
            else *deg[key] = v;
        }
        if (!*end) break;
        p = end + 1;
        if (!*p) return tsr_err(err, TSR_EINVAL, "layout \"%.200s\": empty part at the end", text);
    }
    char why[200];
    if (tsr_layout_problem(&l, why, sizeof why))
        return tsr_err(err, TSR_EINVAL, "layout \"%.200s\": %s", text, why);
    *out = l;
    return 0;
}

void tsr_layout_format(const tsr_layout *l, char *buf, size_t len) {
    if (!buf || len == 0) return;
    int n = snprintf(buf, len, "pp=%u,dp_replicate=%u,dp_shard=%u,tp=%u", l->pp, l->dp_replicate,
                     l->dp_shard, l->tp);
    if (n >= 0 && (size_t)n < len && l->n_layers)
        n += snprintf(buf + n, len - (size_t)n, ",layers=%u", l->n_layers);
    if (n >= 0 && (size_t)n < len && (l->flags & TSR_LAYOUT_FLAT)) snprintf(buf + n, len - (size_t)n, ",flat");
}

uint32_t tsr_layout_size(const tsr_layout *l) {
    uint64_t w = world64(l);
    return w > TSR_MAX_RANKS ? 0 : (uint32_t)w; /* 0: not a valid layout */
}

tsr_coord tsr_layout_coord(const tsr_layout *l, uint32_t rank) {
    tsr_coord c = {0, 0, 0, 0};
    if (!l->tp || !l->dp_shard || !l->dp_replicate) return c;
    c.tp = rank % l->tp;
    rank /= l->tp;
    c.dp_shard = rank % l->dp_shard;
    rank /= l->dp_shard;
    c.dp_replicate = rank % l->dp_replicate;
    c.pp = rank / l->dp_replicate;
    return c;
}

uint32_t tsr_layout_rank(const tsr_layout *l, tsr_coord c) {
    return ((c.pp * l->dp_replicate + c.dp_replicate) * l->dp_shard + c.dp_shard) * l->tp + c.tp;
}

/* The pipeline stage of a layer: L / ceil(n_layers / pp), 0 with one stage (the
 * one place this rule is written; the trainer's stages follow it). */
uint32_t tsr_layout_stage_of_layer(const tsr_layout *l, uint32_t layer) {
    if (l->pp <= 1 || l->n_layers == 0) return 0;
    uint32_t per = l->n_layers / l->pp + (l->n_layers % l->pp != 0);
    return layer / per;
}

/* ------------------------------------------------------------------ boxes */

/* Piece i of n elements cut into k pieces by ceil division. */
void tsr_layout_cut(uint64_t n, uint32_t k, uint32_t i, uint64_t *off, uint64_t *ext) {
    uint64_t c = n / k + (n % k != 0), lo;
    if (tsr_mul_ovf(c, i, &lo) || lo >= n) {
        *off = n;
        *ext = 0;
        return;
    }
    *off = lo;
    *ext = n - lo < c ? n - lo : c;
}

static const char *tensor_name(const tsr_tensor_decl *t) { return t->name ? t->name : "(unnamed)"; }
static const char *tensor_group(const tsr_tensor_decl *t) { return t->group ? t->group : "model"; }

static int check_tensor(const tsr_layout *l, const tsr_tensor_decl *t, size_t i, tsr_error *err) {
    const tsr_placement *p = &t->placement;
    if (t->ndim > TSR_MAX_DIMS)
        return tsr_err(err, TSR_EINVAL, "tensor %zu '%.255s': %u dims (at most %d)", i,
                       tensor_name(t), t->ndim, TSR_MAX_DIMS);
    uint64_t v = 1;
    for (uint32_t d = 0; d < t->ndim; d++)
        if (tsr_mul_ovf(v, t->shape[d], &v))
            return tsr_err(err, TSR_EINVAL, "tensor %zu '%.255s': shape overflows 64 bits", i,
                           tensor_name(t));
    if (p->tp_dim < -1 || p->tp_dim >= (int)t->ndim)
        return tsr_err(err, TSR_EINVAL, "tensor %zu '%.255s': tp_dim %d out of range for %u dims", i,
                       tensor_name(t), p->tp_dim, t->ndim);
    if (p->pp_role > TSR_PP_LAYER)
        return tsr_err(err, TSR_EINVAL, "tensor %zu '%.255s': unknown pp_role %u", i, tensor_name(t),
                       p->pp_role);
    if (p->pp_role == TSR_PP_LAYER) {
        if (p->layer < 0)
            return tsr_err(err, TSR_EINVAL, "tensor %zu '%.255s': negative layer %d", i,
                           tensor_name(t), (int)p->layer);
        if (l->pp > 1 && l->n_layers == 0)
            return tsr_err(err, TSR_EINVAL, "tensor %zu '%.255s': layer %d, but the layout has "
                           "pp=%u and n_layers 0 (give layers=N)", i, tensor_name(t),
                           (int)p->layer, l->pp);
        if (l->pp > 1 && (uint32_t)p->layer >= l->n_layers)
            return tsr_err(err, TSR_EINVAL, "tensor %zu '%.255s': layer %d out of range for "
                           "n_layers %u", i, tensor_name(t), (int)p->layer, l->n_layers);
    }
    return 0;
}

/* The pipeline stage that holds the tensor; -1: every stage. */
static int64_t stage_of(const tsr_layout *l, const tsr_placement *p) {
    switch (p->pp_role) {
    case TSR_PP_FIRST: return 0;
    case TSR_PP_LAST: return l->pp - 1;
    case TSR_PP_LAYER: return tsr_layout_stage_of_layer(l, (uint32_t)p->layer);
    default: return -1;
    }
}

/* 1 if pipeline stage `stage` holds the tensor. */
static int stage_holds(const tsr_layout *l, const tsr_placement *p, uint32_t stage) {
    int64_t s = stage_of(l, p);
    return s < 0 || s == stage;
}

/* The piece of the tensor that tp rank `t` holds: the whole tensor, or a cut of
 * dim tp_dim. @return its volume. */
static uint64_t tp_local(const tsr_layout *l, const tsr_tensor_decl *t, uint32_t tpc, tsr_box *b) {
    b->ndim = t->ndim;
    for (uint32_t d = 0; d < t->ndim; d++) {
        b->offset[d] = 0;
        b->extent[d] = t->shape[d];
    }
    int k = t->placement.tp_dim;
    if (k >= 0) tsr_layout_cut(t->shape[k], l->tp, tpc, &b->offset[k], &b->extent[k]);
    return tsr_box_volume(b);
}

typedef struct box_list {
    tsr_rank_box *v;
    size_t n, cap;
} box_list;

static int push(box_list *bl, uint32_t tensor, const tsr_box *b, tsr_error *err) {
    if (tsr_grow((void **)&bl->v, &bl->cap, bl->n, sizeof *bl->v))
        return tsr_err(err, TSR_ENOMEM, "layout boxes: out of memory for %zu boxes", bl->n + 1);
    bl->v[bl->n].tensor = tensor;
    bl->v[bl->n].box = *b;
    bl->n++;
    return 0;
}

/* A tensor in flat order: by group, replication class, name (strcmp), index.
 * Each (group, class) is flattened into a buffer of its own. The class says over
 * which mesh dims the tensor is replicated (bit 0: pp, TSR_PP_ALL; bit 1: tp,
 * tp_dim -1), so that a buffer holds the same tensors at the same offsets on every
 * rank that replicates them, and replicas are cut identically: with one buffer per
 * group, a tp-replicated tensor behind tp-split ones of uneven size would start at
 * a different offset on each tp rank, and its replicas would overlap partially. */
typedef struct flat_key {
    const char *group, *name;
    uint32_t cls;
    uint32_t index;
} flat_key;

static uint32_t flat_class(const tsr_tensor_decl *t) {
    return (t->placement.pp_role == TSR_PP_ALL ? 1u : 0u) | (t->placement.tp_dim < 0 ? 2u : 0u);
}

static int cmp_flat_key(const void *a, const void *b) {
    const flat_key *x = a, *y = b;
    int c = strcmp(x->group, y->group);
    if (!c) c = (x->cls > y->cls) - (x->cls < y->cls);
    if (!c) c = strcmp(x->name, y->name);
    if (!c) c = (x->index > y->index) - (x->index < y->index);
    return c;
}

/* Flat: the rank's element range [begin[i], end[i]) of each tensor's TP-local
 * piece (begin == end: none). */
static int flat_ranges(const tsr_layout *l, const tsr_tensor_decl *tensors, size_t n, tsr_coord c,
                       uint64_t *begin, uint64_t *end, tsr_error *err) {
    flat_key *order = malloc((n ? n : 1) * sizeof *order);
    if (!order) return tsr_err(err, TSR_ENOMEM, "layout boxes: out of memory for %zu tensors", n);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        begin[i] = end[i] = 0;
        if (!stage_holds(l, &tensors[i].placement, c.pp)) continue;
        order[m].group = tensor_group(&tensors[i]);
        order[m].name = tensors[i].name ? tensors[i].name : "";
        order[m].cls = flat_class(&tensors[i]);
        order[m++].index = (uint32_t)i;
    }
    tsr_sort(order, m, sizeof *order, cmp_flat_key);
    for (size_t g = 0; g < m;) {
        size_t h = g;
        const char *group = order[g].group;
        uint32_t cls = order[g].cls;
        uint64_t F = 0;
        while (h < m && strcmp(order[h].group, group) == 0 && order[h].cls == cls) {
            tsr_box b;
            uint64_t v = tp_local(l, &tensors[order[h].index], c.tp, &b);
            begin[order[h].index] = F; /* the tensor's start in the group's buffer, for now */
            if (tsr_add_ovf(F, v, &F)) {
                free(order);
                return tsr_err(err, TSR_EINVAL, "group '%.255s': flattened size overflows 64 bits",
                               group);
            }
            h++;
        }
        uint64_t lo, hi;
        tsr_layout_cut(F, l->dp_shard, c.dp_shard, &lo, &hi);
        hi += lo;
        for (size_t k = g; k < h; k++) {
            uint32_t i = order[k].index;
            tsr_box b;
            uint64_t pre = begin[i], v = tp_local(l, &tensors[i], c.tp, &b);
            uint64_t s = lo > pre ? lo : pre, e = hi < pre + v ? hi : pre + v;
            begin[i] = e > s ? s - pre : 0;
            end[i] = e > s ? e - pre : 0;
        }
        g = h;
    }
    free(order);
    return 0;
}

int tsr_layout_boxes(const tsr_layout *l, const tsr_tensor_decl *tensors, size_t n, uint32_t rank,
                     tsr_rank_box **out, size_t *n_out, tsr_error *err) {
    if (!l || !out || !n_out || (n && !tensors))
        return tsr_err(err, TSR_EINVAL, "layout boxes: NULL argument");
    *out = NULL;
    *n_out = 0;
    int rc = check_layout(l, err);
    if (rc) return rc;
    uint32_t world = tsr_layout_size(l);
    if (rank >= world) return tsr_err(err, TSR_EINVAL, "layout boxes: rank %u of %u ranks", rank, world);
    if (n > UINT32_MAX) return tsr_err(err, TSR_EINVAL, "layout boxes: %zu tensors", n);
    for (size_t i = 0; i < n; i++)
        if ((rc = check_tensor(l, &tensors[i], i, err))) return rc;

    tsr_coord c = tsr_layout_coord(l, rank);
    int flat = (l->flags & TSR_LAYOUT_FLAT) != 0;
    uint64_t *begin = NULL, *end = NULL;
    if (flat) {
        begin = malloc((n ? n : 1) * sizeof *begin);
        end = malloc((n ? n : 1) * sizeof *end);
        if (!begin || !end) {
            free(begin);
            free(end);
            return tsr_err(err, TSR_ENOMEM, "layout boxes: out of memory for %zu tensors", n);
        }
        if ((rc = flat_ranges(l, tensors, n, c, begin, end, err))) {
            free(begin);
            free(end);
            return rc;
        }
    }
    box_list bl = {0};
    for (size_t i = 0; i < n && !rc; i++) {
        const tsr_tensor_decl *t = &tensors[i];
        if (!stage_holds(l, &t->placement, c.pp)) continue;
        tsr_box b;
        if (tp_local(l, t, c.tp, &b) == 0) continue;
        if (flat) {
            tsr_box pieces[2 * TSR_MAX_DIMS];
            size_t np = tsr_range_boxes(&b, begin[i], end[i], pieces);
            for (size_t k = 0; k < np && !rc; k++) rc = push(&bl, (uint32_t)i, &pieces[k], err);
            continue;
        }
        if (t->placement.fsdp) {
            if (t->ndim == 0) {
                if (c.dp_shard != 0) continue; /* one element: shard 0 holds it */
            } else {
                uint64_t off, ext;
                tsr_layout_cut(b.extent[0], l->dp_shard, c.dp_shard, &off, &ext);
                b.offset[0] += off;
                b.extent[0] = ext;
                if (ext == 0) continue;
            }
        }
        rc = push(&bl, (uint32_t)i, &b, err);
    }
    free(begin);
    free(end);
    if (rc) {
        free(bl.v);
        return rc;
    }
    if (!bl.v && !(bl.v = malloc(sizeof *bl.v)))
        return tsr_err(err, TSR_ENOMEM, "layout boxes: out of memory");
    *out = bl.v;
    *n_out = bl.n;
    return 0;
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* A rank holds data only where its stage holds a tensor, its tp piece of the
 * tensor is not empty and neither is its dp_shard piece of that (or its range of
 * a flat buffer, whose F is at most the elements of its class). */
uint64_t tsr_layout_max_holders(const tsr_layout *l, const tsr_tensor_decl *tensors, size_t n) {
    uint64_t world = tsr_layout_size(l);
    if (check_layout(l, NULL)) return world;
    for (size_t i = 0; i < n; i++)
        if (check_tensor(l, &tensors[i], i, NULL)) return world; /* no bound: tsr_layout_boxes says why */
    uint32_t *stage = malloc((n ? n : 1) * sizeof *stage);
    if (!stage) return world;
    uint64_t t_most = 0, d_most = 0, stages = 0, elems[4] = {0}; /* elements by flat_class */
    size_t ns = 0;
    for (size_t i = 0; i < n; i++) {
        const tsr_tensor_decl *t = &tensors[i];
        const tsr_placement *p = &t->placement;
        uint64_t v = 1;
        for (uint32_t d = 0; d < t->ndim; d++) v *= t->shape[d]; /* check_tensor: no overflow */
        if (v == 0) continue; /* an empty tensor is held nowhere */
        uint64_t *e = &elems[flat_class(t)];
        *e = tsr_add_ovf(*e, v, e) ? UINT64_MAX : *e;
        int64_t s = stage_of(l, p);
        if (s < 0) stages = l->pp;
        else stage[ns++] = (uint32_t)s;
        uint64_t tp = l->tp, dp = l->dp_shard; /* the pieces that may be non-empty */
        if (p->tp_dim >= 0 && t->shape[p->tp_dim] < tp) tp = t->shape[p->tp_dim];
        if (p->fsdp && t->ndim == 0) dp = 1; /* one element: shard 0 holds it */
        else if (p->fsdp && t->shape[0] < dp) dp = t->shape[0];
        if (tp > t_most) t_most = tp;
        if (dp > d_most) d_most = dp;
    }
    if (l->flags & TSR_LAYOUT_FLAT) { /* the cuts of a buffer, whose F is at most its class's elements */
        d_most = 0;
        for (int c = 0; c < 4; c++) d_most = elems[c] > d_most ? elems[c] : d_most;
        if (d_most > l->dp_shard) d_most = l->dp_shard;
    }
    if (!stages) {
        tsr_sort(stage, ns, sizeof *stage, cmp_u32);
        for (size_t i = 0; i < ns; i++) stages += i == 0 || stage[i] != stage[i - 1];
    }
    free(stage);
    return stages * l->dp_replicate * t_most * d_most; /* each factor at most its degree: at most world */
}

/* ------------------------------------------------------------ flat ranges */

/* The row-major element range [b, e) (0 <= b < e <= volume) of the sub-box of
 * dims d.. of `box` whose dims < d are fixed at fixed[0..d), relative to box. */
static size_t range_rec(const tsr_box *box, const uint64_t *stride, uint32_t d, uint64_t *fixed,
                        uint64_t b, uint64_t e, tsr_box *out) {
    uint64_t s = stride[d];
    size_t n = 0;
#define EMIT(lo, hi)                                                                   \
    do {                                                                               \
        tsr_box *o = &out[n++];                                                        \
        o->ndim = box->ndim;                                                           \
        for (uint32_t k = 0; k < d; k++) o->offset[k] = box->offset[k] + fixed[k], o->extent[k] = 1; \
        o->offset[d] = box->offset[d] + (lo);                                          \
        o->extent[d] = (hi) - (lo);                                                    \
        for (uint32_t k = d + 1; k < box->ndim; k++)                                   \
            o->offset[k] = box->offset[k], o->extent[k] = box->extent[k];              \
    } while (0)
    if (b % s == 0 && e % s == 0) { /* whole rows of dim d */
        EMIT(b / s, e / s);
        return n;
    }
    uint64_t i0 = b / s, i1 = (e - 1) / s;
    if (i0 == i1) { /* inside one index of dim d */
        fixed[d] = i0;
        return range_rec(box, stride, d + 1, fixed, b - i0 * s, e - i0 * s, out);
    }
    uint64_t first = i0, last = e / s; /* whole rows [first, last) */
    if (b % s) {
        fixed[d] = i0;
        n += range_rec(box, stride, d + 1, fixed, b % s, s, out + n);
        first = i0 + 1;
    }
    if (first < last) EMIT(first, last);
    if (e % s) {
        fixed[d] = last;
        n += range_rec(box, stride, d + 1, fixed, 0, e % s, out + n);
    }
#undef EMIT
    return n;
}

size_t tsr_range_boxes(const tsr_box *box, uint64_t begin, uint64_t end, tsr_box *out) {
    uint64_t vol = tsr_box_volume(box);
    if (end > vol) end = vol;
    if (begin >= end) return 0;
    if (box->ndim == 0) {
        out[0] = *box;
        return 1;
    }
    uint64_t stride[TSR_MAX_DIMS], fixed[TSR_MAX_DIMS];
    uint64_t s = 1;
    for (int d = (int)box->ndim - 1; d >= 0; d--) {
        stride[d] = s;
        s *= box->extent[d];
    }
    return range_rec(box, stride, 0, fixed, begin, end, out);
}
