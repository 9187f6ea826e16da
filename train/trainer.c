/* trainer.c: the model on the mesh: parameter shards, the forward and backward
 * of a micro-batch through a pipeline stage, gradient reduction and AdamW. The
 * mesh is in mesh.c, the schedule that runs the micro-batches in pipeline.c,
 * the job loop (data, logging) in train_loop.c and its checkpoints in
 * checkpoint.c. */
#include "trainer_impl.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "common.h"
#include "rope.h"

/* ------------------------------------------------------------- parameters */

static void group_counts_free(tsr_trainer *t) {
    for (uint32_t i = 0; t->group.by_tp && i < t->layout.tp; i++) free(t->group.by_tp[i]);
    free(t->group.by_tp);
    t->group.by_tp = NULL;
}

/* The elements of each parameter that each dp_shard rank of this rank's FSDP
 * group on stage `pp` holds (the ranks with this rank's dp_replicate and tp
 * coordinates): n[p * S + s], from the boxes tsr_layout_boxes gives them.
 * Cached per tp rank for the last stage asked (dp_replicate ranks hold copies:
 * the same counts), since the report asks for every rank of the mesh. */
static const size_t *group_counts(tsr_trainer *t, uint32_t pp, tsr_error *err) {
    uint32_t S = t->layout.dp_shard;
    size_t n = t->decls.n_params;
    if (t->group.by_tp && t->group.pp != pp) group_counts_free(t);
    if (!t->group.by_tp && !(t->group.by_tp = calloc(t->layout.tp, sizeof *t->group.by_tp))) {
        tsr_err(err, TSR_ENOMEM, "out of memory");
        return NULL;
    }
    t->group.pp = pp;
    size_t **c = &t->group.by_tp[t->co.tp];
    if (*c) return *c;
    if (!(*c = calloc(n * S, sizeof **c))) {
        tsr_err(err, TSR_ENOMEM, "out of memory");
        return NULL;
    }
    for (uint32_t s = 0; s < S; s++) {
        tsr_coord k = t->co;
        k.pp = pp, k.dp_shard = s;
        tsr_rank_box *boxes = NULL;
        size_t nb = 0;
        if (tsr_layout_boxes(&t->layout, t->decls.decls, n, tsr_layout_rank(&t->layout, k), &boxes, &nb, err)) {
            free(*c), *c = NULL;
            return NULL;
        }
        for (size_t i = 0; i < nb; i++) (*c)[boxes[i].tensor * S + s] += tsr_box_volume(&boxes[i].box);
        free(boxes);
    }
    return *c;
}

/* The TP-local piece of parameter p that FSDP cuts: the sum of the group's. */
static uint64_t tp_local(const tsr_trainer *t, const size_t *counts, size_t p) {
    uint64_t sum = 0;
    for (uint32_t s = 0; s < t->layout.dp_shard; s++) sum += counts[p * t->layout.dp_shard + s];
    return sum;
}

/* Which parameters this rank holds, and how: its shard (its box, as the layout
 * algebra gives it) and the TP-local piece of each that FSDP gathers. */
static int params_init(tsr_trainer *t, tsr_error *err) {
    size_t n = t->decls.n_params, nb = 0;
    uint32_t S = t->layout.dp_shard;
    tsr_rank_box *boxes = NULL;
    const size_t *counts = group_counts(t, t->co.pp, err);
    int rc = !counts ? (err ? err->code : TSR_ENOMEM)
                     : tsr_layout_boxes(&t->layout, t->decls.decls, n, t->rank, &boxes, &nb, err);
    if (!rc && !(t->par = calloc(n, sizeof *t->par))) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    size_t total_shard = 0;
    for (size_t p = 0; p < n && !rc; p++) {
        param *q = &t->par[p];
        const tsr_placement *pl = &t->decls.decls[p].placement;
        q->on_stage = tsr_mesh_on_stage(t, pl);
        if (!q->on_stage) continue;
        if (!(q->counts = malloc(S * sizeof *q->counts))) {
            rc = tsr_err(err, TSR_ENOMEM, "out of memory");
            break;
        }
        memcpy(q->counts, counts + p * S, S * sizeof *q->counts);
        q->full_n = tp_local(t, counts, p);
        q->shard_n = q->counts[t->co.dp_shard];
        q->box = (tsr_box){.ndim = t->decls.decls[p].ndim}; /* absent when empty */
        for (size_t i = 0; i < nb; i++)
            if (boxes[i].tensor == p) q->box = boxes[i].box;
        /* norms contribute to the gradient norm once per tp group; tp-split ones from every tp rank */
        q->norm_counts = (pl->tp_dim >= 0 || t->co.tp == 0) && t->co.dp_replicate == 0;
        total_shard += q->shard_n;
    }
    free(boxes);
    t->n_shard_elems = total_shard;
    if (!rc) rc = tsr_fsdp_units_init(t, err);
    return rc;
}

/* The ranges of the gradient block the gradient norm adds up here (each
 * parameter counted once over the world: norm_counts), in parameter order,
 * copied once to the trainer's memory. */
static int norm_ranges_init(tsr_trainer *t, tsr_error *err) {
    size_t n = t->decls.n_params;
    uint64_t *r = malloc(2 * n * sizeof *r + 1);
    if (!r) return tsr_err(err, TSR_ENOMEM, "out of memory");
    int k = 0;
    t->norm_total = 0;
    for (size_t p = 0; p < n; p++) {
        const param *q = &t->par[p];
        if (!q->on_stage || !q->norm_counts || !q->shard_n) continue;
        r[2 * k] = (uint64_t)(q->g - (t->arena + t->n_shard_elems)), r[2 * k + 1] = q->shard_n;
        t->norm_total += q->shard_n;
        k++;
    }
    int rc = 0;
    t->n_norm_ranges = k;
    if (!(t->norm_ranges = tsr_kc_alloc(&t->kc, 2 * (size_t)k * sizeof *r + 1, err))) rc = err ? err->code : TSR_ENOMEM;
    if (!rc && k) rc = tsr_kc_from_host(&t->kc, t->norm_ranges, r, 2 * (size_t)k * sizeof *r, err);
    free(r);
    return rc;
}

/* One allocation of the trainer's memory kind: the weight, gradient and both
 * moment shards (each a block in parameter order: a unit's shards are
 * contiguous), then with FSDP the unit buffers. */
static int params_alloc(tsr_trainer *t, tsr_error *err) {
    size_t n = t->decls.n_params, total_shard = t->n_shard_elems;
    size_t total = 4 * total_shard + t->n_full_elems;
    t->arena = tsr_kc_alloc(&t->kc, (total ? total : 1) * sizeof(float), err);
    if (!t->arena) {
        tsr_err_prefix(err, "%zu parameters", total_shard);
        return err ? err->code : TSR_ENOMEM;
    }
    float *a = t->arena;
    size_t at = 0;
    for (size_t p = 0; p < n; p++) {
        param *q = &t->par[p];
        if (!q->on_stage) continue;
        q->w = a + at, q->g = a + total_shard + at;
        q->m = a + 2 * total_shard + at, q->v = a + 3 * total_shard + at;
        q->wf = q->w, q->gf = q->g;
        at += q->shard_n;
    }
    t->w_unit = -1;
    int rc = norm_ranges_init(t, err);
    if (rc || t->layout.dp_shard == 1) return rc;
    t->wunit = a + 4 * total_shard;
    t->gunit = t->wunit + t->unit_max;
    t->rs = t->gunit + t->unit_max;
    for (int u = 0; u < t->n_units; u++) {
        const fsdp_unit *U = &t->units[u];
        size_t off = 0;
        for (size_t p = U->p0; U->on_stage && p < U->p1; p++) {
            t->par[p].wf = t->wunit + off, t->par[p].gf = t->gunit + off;
            off += t->par[p].full_n;
        }
    }
    return 0;
}

int tsr_trainer_init_params(tsr_trainer *t, tsr_error *err) {
    size_t most = 0;
    for (size_t p = 0; p < t->decls.n_params; p++)
        if (t->par[p].on_stage && t->par[p].shard_n > most) most = t->par[p].shard_n;
    float *h = malloc(most * sizeof *h + 1);
    if (!h) return tsr_err(err, TSR_ENOMEM, "out of memory for the initial values of %zu parameters", most);
    int rc = 0;
    for (size_t p = 0; p < t->decls.n_params && !rc; p++) {
        param *q = &t->par[p];
        if (!q->on_stage || !q->shard_n) continue;
        /* drawn on the host, copied to the trainer's memory */
        tsr_model_init_box(&t->args, &t->decls, p, &q->box, h, (uint64_t)t->cfg.training.seed);
        rc = tsr_kc_from_host(&t->kc, q->w, h, q->shard_n * sizeof *h, err);
    }
    free(h);
    return rc;
}

/* ------------------------------------------------------------ activations */

/* Every activation and scratch buffer of a step, in the order the arena is
 * carved: per micro-batch set the stage's inputs, per layer what backward
 * needs, on the last stage the head's; then the scratch, once. act_sizes()
 * gives the floats of each; where its pointer lives is in act_rows. */
enum act_scope { PER_SET, PER_LAYER, LAST_STAGE, SCRATCH };
enum {
    ACT_XS,
    ACT_H1, ACT_RSTD1, ACT_Q, ACT_K, ACT_V, ACT_ATT, ACT_A, ACT_X2, ACT_H2, ACT_RSTD2, ACT_G, ACT_U, ACT_S,
    ACT_HF, ACT_RSTDF, ACT_PROBS, ACT_LOSSES,
    ACT_DRES, ACT_DH, ACT_DQ, ACT_DA, ACT_DK, ACT_DV, ACT_DS, ACT_DG, ACT_DU, ACT_ATT_SCRATCH, ACT_DLOGITS,
    ACT_DLOSS, ACT_DSEND, ACT_ROPE_COS, ACT_ROPE_SIN, ACT_LOGIT_TMP, ACT_XSTATS, ACT_HALL, ACT_DHALL,
    N_ACT
};
static const struct act_row {
    int scope;
    size_t off; /* of the pointer in act_set, layer_act or tsr_trainer */
} act_rows[N_ACT] = {
    [ACT_XS] = {PER_SET, offsetof(act_set, xs)},
    [ACT_H1] = {PER_LAYER, offsetof(layer_act, h1)},
    [ACT_RSTD1] = {PER_LAYER, offsetof(layer_act, rstd1)},
    [ACT_Q] = {PER_LAYER, offsetof(layer_act, q)},
    [ACT_K] = {PER_LAYER, offsetof(layer_act, k)},
    [ACT_V] = {PER_LAYER, offsetof(layer_act, v)},
    [ACT_ATT] = {PER_LAYER, offsetof(layer_act, att)},
    [ACT_A] = {PER_LAYER, offsetof(layer_act, a)},
    [ACT_X2] = {PER_LAYER, offsetof(layer_act, x2)},
    [ACT_H2] = {PER_LAYER, offsetof(layer_act, h2)},
    [ACT_RSTD2] = {PER_LAYER, offsetof(layer_act, rstd2)},
    [ACT_G] = {PER_LAYER, offsetof(layer_act, g)},
    [ACT_U] = {PER_LAYER, offsetof(layer_act, u)},
    [ACT_S] = {PER_LAYER, offsetof(layer_act, s)},
    [ACT_HF] = {LAST_STAGE, offsetof(act_set, hf)},
    [ACT_RSTDF] = {LAST_STAGE, offsetof(act_set, rstdf)},
    [ACT_PROBS] = {LAST_STAGE, offsetof(act_set, probs)},
    [ACT_LOSSES] = {LAST_STAGE, offsetof(act_set, losses)},
    [ACT_DRES] = {SCRATCH, offsetof(tsr_trainer, dres)},
    [ACT_DH] = {SCRATCH, offsetof(tsr_trainer, dh)},
    [ACT_DQ] = {SCRATCH, offsetof(tsr_trainer, dq)},
    [ACT_DA] = {SCRATCH, offsetof(tsr_trainer, da)},
    [ACT_DK] = {SCRATCH, offsetof(tsr_trainer, dk)},
    [ACT_DV] = {SCRATCH, offsetof(tsr_trainer, dv)},
    [ACT_DS] = {SCRATCH, offsetof(tsr_trainer, ds)},
    [ACT_DG] = {SCRATCH, offsetof(tsr_trainer, dg)},
    [ACT_DU] = {SCRATCH, offsetof(tsr_trainer, du)},
    [ACT_ATT_SCRATCH] = {SCRATCH, offsetof(tsr_trainer, att_scratch)},
    [ACT_DLOGITS] = {SCRATCH, offsetof(tsr_trainer, dlogits)},
    [ACT_DLOSS] = {SCRATCH, offsetof(tsr_trainer, dloss)},
    [ACT_DSEND] = {SCRATCH, offsetof(tsr_trainer, dsend)},
    [ACT_ROPE_COS] = {SCRATCH, offsetof(tsr_trainer, rope_cos)},
    [ACT_ROPE_SIN] = {SCRATCH, offsetof(tsr_trainer, rope_sin)},
    [ACT_LOGIT_TMP] = {SCRATCH, offsetof(tsr_trainer, logit_tmp)},
    [ACT_XSTATS] = {SCRATCH, offsetof(tsr_trainer, xstats)},
    [ACT_HALL] = {SCRATCH, offsetof(tsr_trainer, h_all)},
    [ACT_DHALL] = {SCRATCH, offsetof(tsr_trainer, dh_all)},
};

static size_t max_size(size_t a, size_t b) { return a > b ? a : b; }

/* The floats of each buffer (0: this rank has none). N = mbs * T tokens of a
 * micro-batch; widths on this tp rank. With the output vocabulary-parallel over
 * dp_shard (fsdp.c), the head's buffers hold dp_shard N rows of the largest
 * shard's columns. */
static void act_sizes(const tsr_trainer *t, size_t sz[N_ACT]) {
    size_t N = t->N, C = (size_t)t->args.dim, V = t->Vt, L = (size_t)(t->l1 - t->l0);
    size_t S = t->layout.dp_shard, vp = t->last && t->head_vp, SN = S * N, vpv = vp * SN * t->head_rows;
    size_t hd = (size_t)tsr_model_head_dim(&t->args), last = t->last, pp_send = t->layout.pp > 1 && !t->first;
    size_t att = (size_t)t->mbs * t->NHt * t->T * t->T;
    size_t v[N_ACT] = {
        [ACT_XS] = (L + 1) * N * C, /* (L+1, N, C): each layer's input and the stage's output */
        [ACT_H1] = N * C, [ACT_RSTD1] = N, [ACT_Q] = N * t->Dq, [ACT_K] = N * t->Dkv, [ACT_V] = N * t->Dkv,
        [ACT_ATT] = att, /* (mbs, NHt, T, T) softmax */
        [ACT_A] = N * t->Dq, [ACT_X2] = N * C, [ACT_H2] = N * C, [ACT_RSTD2] = N,
        [ACT_G] = N * t->Ft, [ACT_U] = N * t->Ft, [ACT_S] = N * t->Ft,
        [ACT_HF] = last * N * C, [ACT_RSTDF] = last * N, [ACT_PROBS] = max_size(last * N * V, vpv),
        [ACT_LOSSES] = vp ? SN : last * N,
        [ACT_DRES] = N * C, [ACT_DH] = N * C, [ACT_DQ] = N * t->Dq, [ACT_DA] = N * t->Dq,
        [ACT_DK] = N * t->Dkv, [ACT_DV] = N * t->Dkv, [ACT_DS] = N * t->Ft, [ACT_DG] = N * t->Ft,
        [ACT_DU] = N * t->Ft, [ACT_ATT_SCRATCH] = tsr_attention_scratch(t->mbs, t->T, t->NHt, (int)hd),
        [ACT_DLOGITS] = max_size(last * N * V, vpv), [ACT_DLOSS] = vp ? SN : last * N,
        [ACT_DSEND] = pp_send * (size_t)t->M * N * C,
        [ACT_ROPE_COS] = (size_t)t->T * hd / 2, [ACT_ROPE_SIN] = (size_t)t->T * hd / 2,
        [ACT_LOGIT_TMP] = last * (t->layout.dp_shard > 1) * N * t->chunk_rows,
        [ACT_XSTATS] = vp ? S * 2 * SN : last * (t->layout.tp > 1) * t->layout.tp * 2 * N, /* every part's (rows,2) */
        [ACT_HALL] = vp * SN * C, [ACT_DHALL] = vp * SN * C,
    };
    memcpy(sz, v, sizeof v);
}

/* Buffers of one scope, from arena + *at on: each pointer set in `owner`
 * (unless arena or owner is NULL: counting only) and *at advanced. */
static void carve_scope(int scope, const size_t *sz, void *owner, float *arena, size_t *at) {
    for (int k = 0; k < N_ACT; k++) {
        if (act_rows[k].scope != scope || !sz[k]) continue;
        if (arena && owner) *(float **)(void *)((char *)owner + act_rows[k].off) = arena + *at;
        *at += sz[k];
    }
}

/* Carves the arena (NULL: counts only) into every buffer. @return its floats. */
static size_t act_carve(tsr_trainer *t, float *arena) {
    size_t sz[N_ACT], at = 0;
    act_sizes(t, sz);
    int L = t->l1 - t->l0;
    for (int j = 0; j < t->n_sets; j++) {
        act_set *s = arena ? &t->sets[j] : NULL;
        carve_scope(PER_SET, sz, s, arena, &at);
        for (int l = 0; l < L; l++) carve_scope(PER_LAYER, sz, s ? &s->layers[l] : NULL, arena, &at);
        carve_scope(LAST_STAGE, sz, s, arena, &at);
    }
    carve_scope(SCRATCH, sz, t, arena, &at);
    return at;
}

/* The shapes of a step, and the floats of activations and scratch. */
static int shapes_init(tsr_trainer *t, tsr_error *err) {
    const tsr_train_config *c = &t->cfg;
    int hd = tsr_model_head_dim(&t->args);
    t->T = c->training.seq_len;
    t->B = c->training.global_batch_size / (int)t->dp;
    t->mbs = t->layout.pp > 1 ? c->parallelism.pipeline_parallel_microbatch_size : c->training.local_batch_size;
    if (t->mbs > t->B) t->mbs = t->B;
    if (t->B % t->mbs)
        return tsr_err(err, TSR_EINVAL, "%d samples per data-parallel rank do not split into micro-batches of %d",
                       t->B, t->mbs);
    t->M = t->B / t->mbs;
    t->N = (size_t)t->mbs * t->T;
    t->NHt = t->args.n_heads / (int)t->layout.tp;
    t->NKVt = t->args.n_kv_heads / (int)t->layout.tp;
    t->Dq = (size_t)t->NHt * hd;
    t->Dkv = (size_t)t->NKVt * hd;
    /* the ffn width on this tp rank: the TP-local rows of w1 (of the stage's
     * first layer; a stage without layers asks stage 0, which holds layer 0) */
    size_t w1 = (size_t)tsr_model_param_index(t->l1 > t->l0 ? t->l0 : 0, TSR_P_W1);
    const size_t *counts = t->l1 > t->l0 ? NULL : group_counts(t, 0, err);
    if (t->l1 == t->l0 && !counts) return err ? err->code : TSR_ENOMEM;
    t->Ft = (counts ? tp_local(t, counts, w1) : t->par[w1].full_n) / (size_t)t->args.dim;
    /* the output's rows on this tp rank, cut as the layout cuts dim 0 */
    uint64_t v0, Vt;
    tsr_layout_cut((uint64_t)t->args.vocab_size, t->layout.tp, t->co.tp, &v0, &Vt);
    t->v0 = (size_t)v0, t->Vt = (size_t)Vt;
    /* the output vocabulary-parallel over dp_shard (fsdp.c) where that moves
     * less than gathering it: tp = 1, and fewer tokens in the shard group's
     * micro-batches than rows in the vocabulary */
    t->head_vp = 0, t->head_rows = 0;
    if (t->last && t->layout.dp_shard > 1 && t->layout.tp == 1) {
        for (uint32_t r = 0; r < t->layout.dp_shard; r++)
            if (t->hrow0[r + 1] - t->hrow0[r] > t->head_rows) t->head_rows = t->hrow0[r + 1] - t->hrow0[r];
        t->head_vp = (uint64_t)t->layout.dp_shard * t->N < t->Vt;
    }
    if (t->last && t->par[t->decls.n_params - 1].full_n != t->Vt * (size_t)t->args.dim)
        return tsr_err(err, TSR_EINVAL, "the output's rows on tp rank %u: %zu floats, not %zu rows", t->co.tp,
                       (size_t)t->par[t->decls.n_params - 1].full_n, t->Vt);
    t->n_sets = t->layout.pp > 1 ? t->M : 1;
    t->act_floats = act_carve(t, NULL);
    return 0;
}

/* The activations: one allocation of the trainer's memory kind, carved. */
static int acts_alloc(tsr_trainer *t, tsr_error *err) {
    int hd = tsr_model_head_dim(&t->args), L = t->l1 - t->l0;
    t->sets = calloc((size_t)t->n_sets, sizeof *t->sets);
    size_t ntok = 2 * (size_t)t->B * t->T, nmap = (size_t)t->layout.dp_shard * t->N;
    t->tok_map = malloc(nmap * sizeof *t->tok_map);
    t->tokens_host = malloc(ntok * sizeof *t->tokens_host);
    if (!t->sets || !t->tok_map || !t->tokens_host) return tsr_err(err, TSR_ENOMEM, "out of memory");
    for (int j = 0; j < t->n_sets; j++)
        if (!(t->sets[j].layers = calloc((size_t)(L > 0 ? L : 1), sizeof *t->sets[j].layers)))
            return tsr_err(err, TSR_ENOMEM, "out of memory");
    if (!(t->tokens = tsr_kc_alloc(&t->kc, ntok * sizeof *t->tokens, err)) ||
        !(t->tok_map_dev = tsr_kc_alloc(&t->kc, nmap * sizeof *t->tok_map_dev, err)) ||
        !(t->sums = tsr_kc_alloc(&t->kc, 3 * sizeof *t->sums, err)) ||
        !(t->act_arena = tsr_kc_alloc(&t->kc, t->act_floats * sizeof(float), err))) {
        tsr_err_prefix(err, "activations");
        return err ? err->code : TSR_ENOMEM;
    }
    for (int j = 0; j < t->n_sets && t->last && t->head_vp; j++)
        if (!(t->sets[j].ids_tgt_dev = tsr_kc_alloc(&t->kc, nmap * sizeof(int), err))) {
        tsr_err_prefix(err, "activations");
        return err ? err->code : TSR_ENOMEM;
    }
    act_carve(t, t->act_arena);
    /* the RoPE tables, computed on the host */
    size_t half = (size_t)t->T * hd / 2;
    float *tab = malloc(2 * half * sizeof *tab + 1);
    if (!tab) return tsr_err(err, TSR_ENOMEM, "out of memory");
    const tsr_rope_scaling *sc = t->args.rope_scaling.factor != 0 ? &t->args.rope_scaling : NULL;
    tsr_rope_tables(tab, tab + half, t->T, hd, t->args.rope_theta, sc);
    int rc = tsr_kc_from_host(&t->kc, t->rope_cos, tab, half * sizeof *tab, err);
    if (!rc) rc = tsr_kc_from_host(&t->kc, t->rope_sin, tab + half, half * sizeof *tab, err);
    free(tab);
    if (rc) return rc;
    t->reqs = tsr_comm_reqs_new();
    if (!t->reqs) return tsr_err(err, TSR_ENOMEM, "out of memory");
    return 0;
}

/* ---------------------------------------------------------------- forward */

static int tp_sum(tsr_trainer *t, float *x, size_t n, tsr_error *err) {
    return t->layout.tp > 1 ? tsr_plane_allreduce_sum(&t->plane, t->tp, TSR_F32, x, n, err) : 0;
}

static float *W(tsr_trainer *t, int layer, int k) { return t->par[tsr_model_param_index(layer, k)].wf; }
static float *G(tsr_trainer *t, int layer, int k) { return t->par[tsr_model_param_index(layer, k)].gf; }

/* x (N,C) -> out (N,C) through layer `layer`, keeping what backward needs in la. */
static int layer_fwd(tsr_trainer *t, int layer, layer_act *la, const float *x, float *out, tsr_error *err) {
    int N = (int)t->N, C = t->args.dim, hd = tsr_model_head_dim(&t->args);
    int Dq = (int)t->Dq, Dkv = (int)t->Dkv, F = (int)t->Ft;
    tsr_kc_rmsnorm_fwd(&t->kc, la->h1, la->rstd1, x, W(t, layer, TSR_P_ATTN_NORM), N, C, t->args.norm_eps);
    tsr_kc_matmul_fwd(&t->kc, la->q, la->h1, W(t, layer, TSR_P_WQ), N, C, Dq);
    tsr_kc_matmul_fwd(&t->kc, la->k, la->h1, W(t, layer, TSR_P_WK), N, C, Dkv);
    tsr_kc_matmul_fwd(&t->kc, la->v, la->h1, W(t, layer, TSR_P_WV), N, C, Dkv);
    tsr_kc_rope_fwd(&t->kc, la->q, t->rope_cos, t->rope_sin, t->mbs, t->T, t->NHt, hd);
    tsr_kc_rope_fwd(&t->kc, la->k, t->rope_cos, t->rope_sin, t->mbs, t->T, t->NKVt, hd);
    tsr_kc_attention_fwd(&t->kc, la->a, la->att, la->q, la->k, la->v, t->mbs, t->T, t->NHt, t->NKVt, hd);
    tsr_kc_matmul_fwd(&t->kc, out, la->a, W(t, layer, TSR_P_WO), N, Dq, C); /* partial over tp */
    int rc = tp_sum(t, out, (size_t)N * C, err);
    if (rc) return rc;
    tsr_kc_add(&t->kc, la->x2, x, out, (size_t)N * C);
    tsr_kc_rmsnorm_fwd(&t->kc, la->h2, la->rstd2, la->x2, W(t, layer, TSR_P_FFN_NORM), N, C, t->args.norm_eps);
    if (F > 0) {
        tsr_kc_matmul_fwd(&t->kc, la->g, la->h2, W(t, layer, TSR_P_W1), N, C, F);
        tsr_kc_matmul_fwd(&t->kc, la->u, la->h2, W(t, layer, TSR_P_W3), N, C, F);
        tsr_kc_swiglu_fwd(&t->kc, la->s, la->g, la->u, (size_t)N * F);
        tsr_kc_matmul_fwd(&t->kc, out, la->s, W(t, layer, TSR_P_W2), N, F, C);
    } else {
        tsr_kc_fill(&t->kc, out, (size_t)N * C, 0);
    }
    if ((rc = tp_sum(t, out, (size_t)N * C, err))) return rc;
    tsr_kc_add(&t->kc, out, la->x2, out, (size_t)N * C);
    return 0;
}

/* d(out) in t->dres (N,C) -> d(x) in t->dres, accumulating the weight gradients. */
static int layer_bwd(tsr_trainer *t, int layer, layer_act *la, const float *x, tsr_error *err) {
    int N = (int)t->N, C = t->args.dim, hd = tsr_model_head_dim(&t->args);
    int Dq = (int)t->Dq, Dkv = (int)t->Dkv, F = (int)t->Ft;
    size_t NC = (size_t)N * C;
    tsr_kc_fill(&t->kc, t->dh, NC, 0);
    if (F > 0) {
        tsr_kc_fill(&t->kc, t->ds, (size_t)N * F, 0);
        tsr_kc_fill(&t->kc, t->dg, (size_t)N * F, 0);
        tsr_kc_fill(&t->kc, t->du, (size_t)N * F, 0);
        tsr_kc_matmul_bwd(&t->kc, t->ds, G(t, layer, TSR_P_W2), t->dres, la->s, W(t, layer, TSR_P_W2), N, F, C);
        tsr_kc_swiglu_bwd(&t->kc, t->dg, t->du, t->ds, la->g, la->u, (size_t)N * F);
        tsr_kc_matmul_bwd(&t->kc, t->dh, G(t, layer, TSR_P_W1), t->dg, la->h2, W(t, layer, TSR_P_W1), N, C, F);
        tsr_kc_matmul_bwd(&t->kc, t->dh, G(t, layer, TSR_P_W3), t->du, la->h2, W(t, layer, TSR_P_W3), N, C, F);
    }
    int rc = tp_sum(t, t->dh, NC, err);
    if (rc) return rc;
    tsr_kc_rmsnorm_bwd(&t->kc, t->dres, G(t, layer, TSR_P_FFN_NORM), t->dh, la->x2, W(t, layer, TSR_P_FFN_NORM), la->rstd2, N, C);
    /* attention: dres is now d(x2) */
    tsr_kc_fill(&t->kc, t->da, (size_t)N * Dq, 0);
    tsr_kc_fill(&t->kc, t->dq, (size_t)N * Dq, 0);
    tsr_kc_fill(&t->kc, t->dk, (size_t)N * Dkv, 0);
    tsr_kc_fill(&t->kc, t->dv, (size_t)N * Dkv, 0);
    tsr_kc_matmul_bwd(&t->kc, t->da, G(t, layer, TSR_P_WO), t->dres, la->a, W(t, layer, TSR_P_WO), N, Dq, C);
    tsr_kc_attention_bwd(&t->kc, t->dq, t->dk, t->dv, t->att_scratch, t->da, la->q, la->k, la->v, la->att, t->mbs, t->T,
                      t->NHt, t->NKVt, hd);
    tsr_kc_rope_bwd(&t->kc, t->dq, t->rope_cos, t->rope_sin, t->mbs, t->T, t->NHt, hd);
    tsr_kc_rope_bwd(&t->kc, t->dk, t->rope_cos, t->rope_sin, t->mbs, t->T, t->NKVt, hd);
    tsr_kc_fill(&t->kc, t->dh, NC, 0);
    tsr_kc_matmul_bwd(&t->kc, t->dh, G(t, layer, TSR_P_WQ), t->dq, la->h1, W(t, layer, TSR_P_WQ), N, C, Dq);
    tsr_kc_matmul_bwd(&t->kc, t->dh, G(t, layer, TSR_P_WK), t->dk, la->h1, W(t, layer, TSR_P_WK), N, C, Dkv);
    tsr_kc_matmul_bwd(&t->kc, t->dh, G(t, layer, TSR_P_WV), t->dv, la->h1, W(t, layer, TSR_P_WV), N, C, Dkv);
    if ((rc = tp_sum(t, t->dh, NC, err))) return rc;
    tsr_kc_rmsnorm_bwd(&t->kc, t->dres, G(t, layer, TSR_P_ATTN_NORM), t->dh, x, W(t, layer, TSR_P_ATTN_NORM), la->rstd1, N, C);
    return 0;
}

/* ---------------------------------------------------------- micro-batches */

/* The first sample's logits (T, V) of the micro-batch (logits: this tp rank's
 * columns, (N, Vt)) into keep_logits, gathered from every tp rank. */
static int keep_logits(tsr_trainer *t, const float *logits, tsr_error *err) {
    size_t T = (size_t)t->T, V = (size_t)t->args.vocab_size, tp = t->layout.tp;
    if (tp == 1) return tsr_kc_to_host(&t->kc, t->keep_logits, logits, T * V * sizeof(float), err);
    size_t counts[tp], mine = 0;
    uint64_t v0[tp], w[tp];
    for (size_t r = 0; r < tp; r++) {
        tsr_layout_cut(V, (uint32_t)tp, (uint32_t)r, &v0[r], &w[r]);
        counts[r] = T * w[r];
        if (r < t->co.tp) mine += counts[r];
    }
    /* a test's and a tool's: gathered on the host */
    float *all = malloc(T * V * sizeof(float) + 1);
    if (!all) return tsr_err(err, TSR_ENOMEM, "out of memory for the logits of %zu tokens", T);
    int rc = tsr_kc_to_host(&t->kc, all + mine, logits, counts[t->co.tp] * sizeof(float), err);
    if (!rc) rc = tsr_data_allgatherv(t->tp, TSR_F32, all + mine, all, counts, NULL, err);
    for (size_t r = 0, at = 0; !rc && r < tp; at += counts[r], r++)
        for (size_t i = 0; i < T && w[r]; i++)
            memcpy(t->keep_logits + i * V + v0[r], all + at + i * w[r], w[r] * sizeof(float));
    free(all);
    return rc;
}

/* The output vocabulary-parallel over dp_shard for this micro-batch (not when
 * the caller keeps the logits: those are gathered by rows). */
static int head_vp(const tsr_trainer *t) { return t->head_vp && !t->keep_logits; }

/* Micro-batch j through this stage, forward: from the tokens or the previous
 * stage, to the next stage or the loss (the schedule: pipeline.c). */
static int mb_fwd(tsr_trainer *t, int j, tsr_error *err) {
    act_set *s = &t->sets[j % t->n_sets];
    size_t N = t->N, C = (size_t)t->args.dim, V = (size_t)t->args.vocab_size;
    size_t at_tok = (size_t)j * N, at_tgt = (size_t)t->B * t->T + (size_t)j * N;
    const int *tok = t->tokens + at_tok, *tgt = t->tokens + at_tgt; /* the trainer's memory */
    int rc = 0;
    if (t->first && t->layout.dp_shard > 1) {
        if ((rc = tsr_fsdp_embed_fwd(t, s, s->xs, t->tokens_host + at_tok, err))) return rc;
    } else if (t->first) {
        tsr_kc_embed_fwd(&t->kc, s->xs, tok, t->par[0].wf, (int)N, (int)C, (int)V);
    } else if ((rc = tsr_pipeline_recv_fwd(t, j, s->xs, err))) {
        return rc;
    }
    int L = t->l1 - t->l0;
    for (int l = 0; l < L && !rc; l++)
        if (!(rc = tsr_fsdp_gather(t, tsr_fsdp_layer_unit(t->l0 + l), err)))
            rc = layer_fwd(t, t->l0 + l, &s->layers[l], s->xs + (size_t)l * N * C, s->xs + (size_t)(l + 1) * N * C,
                           err);
    if (rc) return rc;
    float *xL = s->xs + (size_t)L * N * C;
    if (!t->last) return tsr_pipeline_send_fwd(t, j, xL, err);
    size_t np = t->decls.n_params, Vt = t->Vt;
    if ((rc = tsr_fsdp_norm_gather(t, err))) return rc;
    tsr_kc_rmsnorm_fwd(&t->kc, s->hf, s->rstdf, xL, t->par[np - 2].wf, (int)N, (int)C, t->args.norm_eps);
    if (head_vp(t)) return tsr_fsdp_vp_fwd(t, s, t->tokens_host + at_tgt, err);
    if (t->layout.dp_shard > 1) rc = tsr_fsdp_head_fwd(t, s->probs, s->hf, err);
    else tsr_kc_matmul_fwd(&t->kc, s->probs, s->hf, t->par[np - 1].wf, (int)N, (int)C, (int)Vt);
    if (!rc && t->keep_logits && j == t->M - 1) rc = keep_logits(t, s->probs, err);
    if (rc) return rc;
    if (t->layout.tp == 1) {
        tsr_kc_xent_fwd(&t->kc, s->losses, s->probs, s->probs, tgt, (int)N, (int)V);
    } else { /* vocabulary-parallel: every tp rank's row maxima and sums, then its columns */
        float *mine = t->xstats + (size_t)t->co.tp * 2 * N;
        tsr_kc_xent_part_stats(&t->kc, mine, s->probs, (int)N, (int)Vt);
        if ((rc = tsr_plane_allgather(&t->plane, t->tp, TSR_F32, mine, t->xstats, 2 * N, err))) return rc;
        tsr_kc_xent_part_fwd(&t->kc, s->losses, s->probs, s->probs, tgt, (int)N, (int)Vt, (int)t->v0, t->xstats,
                          (int)t->layout.tp);
    }
    tsr_kc_sum_add(&t->kc, &t->sums[0], s->losses, N);
    return 0;
}

/* And backward: from the loss or the next stage, to the previous stage or the
 * embedding's gradient. */
static int mb_bwd(tsr_trainer *t, int j, tsr_error *err) {
    act_set *s = &t->sets[j % t->n_sets];
    size_t N = t->N, C = (size_t)t->args.dim, V = (size_t)t->args.vocab_size, np = t->decls.n_params;
    const int *tok = t->tokens + (size_t)j * N, *tgt = t->tokens + (size_t)t->B * t->T + (size_t)j * N;
    int L = t->l1 - t->l0, rc = 0;
    float *xL = s->xs + (size_t)L * N * C;
    if (t->last) {
        if (head_vp(t)) {
            rc = tsr_fsdp_vp_bwd(t, s, t->dh, err);
        } else {
            tsr_kc_fill(&t->kc, t->dloss, N, (float)t->inv_count);
            tsr_kc_fill(&t->kc, t->dlogits, N * t->Vt, 0);
            tsr_kc_xent_part_bwd(&t->kc, t->dlogits, s->probs, tgt, t->dloss, (int)N, (int)t->Vt, (int)t->v0, (int)V);
            tsr_kc_fill(&t->kc, t->dh, N * C, 0);
            if (t->layout.dp_shard > 1) rc = tsr_fsdp_head_bwd(t, t->dh, t->dlogits, s->hf, err);
            else tsr_kc_matmul_bwd(&t->kc, t->dh, t->par[np - 1].gf, t->dlogits, s->hf, t->par[np - 1].wf, (int)N, (int)C,
                                (int)t->Vt);
            /* each tp rank's vocabulary columns add their part of d(h) */
            if (!rc) rc = tp_sum(t, t->dh, N * C, err);
        }
        if (!rc) rc = tsr_fsdp_norm_gather(t, err);
        if (rc) return rc;
        if (t->layout.dp_shard > 1) tsr_kc_fill(&t->kc, t->par[np - 2].gf, C, 0);
        tsr_kc_fill(&t->kc, t->dres, N * C, 0);
        tsr_kc_rmsnorm_bwd(&t->kc, t->dres, t->par[np - 2].gf, t->dh, xL, t->par[np - 2].wf, s->rstdf, (int)N, (int)C);
        if ((rc = tsr_fsdp_norm_reduce(t, err))) return rc;
    } else if ((rc = tsr_pipeline_recv_bwd(t, j, t->dres, err))) {
        return rc;
    }
    for (int l = L - 1; l >= 0 && !rc; l--) {
        int u = tsr_fsdp_layer_unit(t->l0 + l);
        if ((rc = tsr_fsdp_gather(t, u, err))) break;
        tsr_fsdp_grads_zero(t, u);
        rc = layer_bwd(t, t->l0 + l, &s->layers[l], s->xs + (size_t)l * N * C, err);
        if (!rc) rc = tsr_fsdp_grads_reduce(t, u, err);
    }
    if (rc) return rc;
    if (t->first && t->layout.dp_shard > 1) return tsr_fsdp_embed_bwd(t, s, t->dres, err);
    if (t->first) {
        tsr_kc_embed_bwd(&t->kc, t->par[0].gf, t->dres, tok, (int)N, (int)C, (int)V);
        return 0;
    }
    return tsr_pipeline_send_bwd(t, j, t->dres, err);
}

/* ------------------------------------------------------------------- step */

int tsr_trainer_step(tsr_trainer *t, int step, const int *inputs, const int *targets, int optimize,
                     double *loss, double *grad_norm, tsr_error *err) {
    size_t bt = (size_t)t->B * t->T;
    int rc = 0;
    /* the step's tokens, kept on the host too (FSDP gathers them there) */
    memcpy(t->tokens_host, inputs, bt * sizeof *inputs);
    memcpy(t->tokens_host + bt, targets, bt * sizeof *targets);
    if ((rc = tsr_kc_from_host(&t->kc, t->tokens, t->tokens_host, 2 * bt * sizeof *inputs, err))) return rc;
    /* the global number of counted targets: every rank of one dp index holds the
     * same ones, so only (pp 0, tp 0) ranks report (a host value: MPI); in the
     * same all-reduce, the ranks that ask the job to stop after this step */
    int voted = t->stop_poll && t->stop_poll();
    double cnt[2] = {0, voted};
    if (t->co.pp == 0 && t->co.tp == 0)
        for (size_t i = 0; i < bt; i++) cnt[0] += targets[i] >= 0;
    if ((rc = tsr_data_allreduce_sum(t->world, TSR_F64, cnt, 2, NULL, err))) return rc;
    t->inv_count = cnt[0] > 0 ? 1.0 / cnt[0] : 0.0;
    t->stop_agreed = cnt[1] > 0;
    /* the gradient shards accumulate the step's micro-batches (with FSDP, each
     * unit's reduced right after its backward); the weights changed since the
     * last gather */
    tsr_kc_fill(&t->kc, t->arena + t->n_shard_elems, t->n_shard_elems, 0);
    tsr_kc_zero(&t->kc, t->sums, 3 * sizeof *t->sums);
    t->w_unit = -1;
    rc = tsr_pipeline_run(t, mb_fwd, mb_bwd, err);
    /* HSDP: the shards' gradients all-reduced over dp_replicate */
    if (!rc && t->layout.dp_replicate > 1)
        rc = tsr_plane_allreduce_sum(&t->plane, t->rep, TSR_F32, t->arena + t->n_shard_elems, t->n_shard_elems, err);
    if (rc) return rc;
    /* the loss (sums[0], on the last stage: each tp rank the rows whose targets
     * it holds) and the gradient norm (sums[1]), each counted once, summed over
     * the world and brought to the host in one copy */
    tsr_kc_sumsq_ranges(&t->kc, &t->sums[1], t->arena + t->n_shard_elems, t->norm_ranges, t->n_norm_ranges,
                        t->norm_total);
    /* and the ranks asked to stop since the step began (sums[2]): a stop
     * asked during the step ends the job after it, not after the next one */
    static const double one = 1;
    if (!voted && t->stop_poll && t->stop_poll() &&
        (rc = tsr_kc_from_host(&t->kc, &t->sums[2], &one, sizeof one, err)))
        return rc;
    double red[3];
    if ((rc = tsr_plane_allreduce_sum(&t->plane, t->world, TSR_F64, t->sums, 3, err)) ||
        (rc = tsr_kc_to_host(&t->kc, red, t->sums, sizeof red, err)))
        return rc;
    t->stop_agreed |= red[2] > 0;
    *loss = red[0] * t->inv_count;
    *grad_norm = sqrt(red[1]);
    if (!optimize) return 0;
    if (t->before_update) t->before_update(t->before_update_ctx);
    const tsr_train_config *c = &t->cfg;
    double clip = c->training.max_norm / (*grad_norm + 1e-6);
    float lr = (float)tsr_config_lr_at(c, step - t->lr_origin);
    t->last_lr = lr;
    /* every parameter at once: the weight, gradient and moment blocks are in
     * the same parameter order, and the hyper-parameters shared */
    size_t S = t->n_shard_elems;
    if (S)
        tsr_kc_adamw(&t->kc, t->arena, t->arena + S, clip < 1.0 ? (float)clip : 1.0f, t->arena + 2 * S,
                     t->arena + 3 * S, S, lr, (float)c->optimizer.beta1, (float)c->optimizer.beta2,
                     (float)c->optimizer.eps, (float)c->optimizer.weight_decay, step - t->opt_origin);
    /* done before the step returns: a save that follows copies the state on
     * streams of its own, ordered after nothing */
    return tsr_kc_sync(&t->kc, err);
}

/* ------------------------------------------------------------ life cycle */

int tsr_trainer_new(const tsr_train_config *cfg, tsr_comm *world, tsr_trainer **out, tsr_error *err) {
    tsr_model_args a;
    int rc = tsr_model_args_get(tsr_flavor_name(cfg->model.flavor), &a, err);
    a.max_seq_len = cfg->training.seq_len; /* as TorchTitan's model args take it */
    return rc ? rc : tsr_trainer_new_args(cfg, &a, world, out, err);
}

/* The trainer's memory and kernels (training.device) and its data plane. A
 * GPU rank binds to the GPU of its node-local rank; ranks that share a GPU
 * (more of them on a node than GPUs) stage their collectives through the host
 * (NCCL refuses two ranks on one device), which parallelism.data_plane =
 * "nccl" refuses instead. The guard kind always stages. */
static int device_open(tsr_trainer *t, tsr_error *err) {
    tsr_device d = t->cfg.training.device;
    tsr_data_plane_mode mode = t->cfg.parallelism.data_plane;
    tsr_mem_kind kind = d == TSR_DEVICE_CUDA ? TSR_MEM_CUDA : d == TSR_DEVICE_GUARD ? TSR_MEM_GUARD : TSR_MEM_HOST;
    int device = 0, staged = mode == TSR_PLANE_STAGED;
    int rc = tsr_mem_usable(kind, err);
    if (!rc && kind == TSR_MEM_CUDA) {
        uint32_t lr = 0, ls = 1;
        int gpus = tsr_kctx_devices(kind);
        if ((rc = tsr_comm_node_rank(t->world, &lr, &ls, err))) return rc;
        if (gpus < 1) return tsr_err(err, TSR_EINVAL, "training.device = cuda: no GPU on this node");
        if ((int)ls > gpus && mode == TSR_PLANE_NCCL)
            return tsr_err(err, TSR_EINVAL,
                           "training.device = cuda: %u ranks on this node share its %d GPU(s), and NCCL refuses two "
                           "ranks on one GPU: run at most %d ranks a node, or set parallelism.data_plane = \"staged\"",
                           ls, gpus, gpus);
        staged |= (int)ls > gpus;
        device = (int)(lr % (uint32_t)gpus);
    }
    if (!rc) rc = tsr_kctx_init(&t->kc, kind, device, err);
    if (rc) {
        tsr_err_prefix(err, "training.device");
        return rc;
    }
    t->kc.gemm = t->cfg.training.mixed_precision_param == TSR_BF16 ? TSR_BF16 : TSR_F32;
    tsr_plane_init(&t->plane, &t->kc, staged && kind != TSR_MEM_HOST);
    return 0;
}

int tsr_trainer_new_args(const tsr_train_config *cfg, const tsr_model_args *args, tsr_comm *world,
                         tsr_trainer **out, tsr_error *err) {
    tsr_trainer *t = calloc(1, sizeof *t);
    if (!t) return tsr_err(err, TSR_ENOMEM, "out of memory");
    t->cfg = *cfg;
    t->world = world;
    t->args = *args;
    int rc = tsr_model_decls_make(&t->args, &t->decls, err);
    t->rank = tsr_comm_rank(world);
    if (!rc) rc = tsr_mesh_coords(t, err);
    if (!rc) rc = tsr_mesh_comms(t, err);
    if (!rc) rc = device_open(t, err);
    if (!rc) rc = params_init(t, err);
    if (!rc) rc = params_alloc(t, err);
    if (!rc) rc = shapes_init(t, err);
    if (!rc) rc = acts_alloc(t, err);
    if (rc) {
        tsr_trainer_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

void tsr_trainer_free(tsr_trainer *t) {
    if (!t) return;
    for (size_t p = 0; t->par && p < t->decls.n_params; p++) free(t->par[p].counts);
    free(t->par);
    tsr_kc_free(&t->kc, t->arena);
    for (int j = 0; t->sets && j < t->n_sets; j++) {
        free(t->sets[j].layers);
        free(t->sets[j].ids_in);
        free(t->sets[j].ids_tgt);
        tsr_kc_free(&t->kc, t->sets[j].ids_tgt_dev);
    }
    free(t->sets);
    tsr_kc_free(&t->kc, t->act_arena);
    tsr_kc_free(&t->kc, t->tokens);
    tsr_kc_free(&t->kc, t->tok_map_dev);
    tsr_kc_free(&t->kc, t->sums);
    tsr_kc_free(&t->kc, t->norm_ranges);
    free(t->tokens_host);
    free(t->tok_map);
    tsr_plane_free(&t->plane);
    tsr_kctx_free(&t->kc);
    tsr_comm_reqs_free(t->reqs);
    tsr_mesh_comms_free(t);
    group_counts_free(t);
    tsr_fsdp_units_free(t);
    tsr_model_decls_free(&t->decls);
    free(t);
}

float *tsr_trainer_param(tsr_trainer *t, size_t p, tsr_box *box) {
    if (p >= t->decls.n_params || !t->par[p].on_stage || !t->par[p].shard_n) return NULL;
    if (box) *box = t->par[p].box;
    return t->par[p].w;
}

float *tsr_trainer_grad(tsr_trainer *t, size_t p, tsr_box *box) {
    if (p >= t->decls.n_params || !t->par[p].on_stage || !t->par[p].shard_n) return NULL;
    if (box) *box = t->par[p].box;
    return t->par[p].g;
}

int tsr_trainer_read(tsr_trainer *t, float *dst, const float *src, size_t n, tsr_error *err) {
    return tsr_kc_to_host(&t->kc, dst, src, n * sizeof *dst, err);
}

void tsr_trainer_keep_logits(tsr_trainer *t, float *dst) { t->keep_logits = dst; }
void tsr_trainer_before_update(tsr_trainer *t, void (*fn)(void *ctx), void *ctx) {
    t->before_update = fn;
    t->before_update_ctx = ctx;
}
const tsr_model_args *tsr_trainer_model(const tsr_trainer *t) { return &t->args; }
const tsr_model_decls *tsr_trainer_decls(const tsr_trainer *t) { return &t->decls; }

/* ----------------------------------------------------------------- report */

int tsr_model_report(const tsr_train_config *cfg, FILE *out, tsr_error *err) {
    tsr_trainer t = {.cfg = *cfg};
    int rc = tsr_model_args_get(tsr_flavor_name(cfg->model.flavor), &t.args, err);
    if (!rc) rc = tsr_model_decls_make(&t.args, &t.decls, err);
    if (rc) return rc;
    char lt[128];
    t.rank = 0;
    if (!(rc = tsr_mesh_coords(&t, err))) {
        tsr_layout_format(&t.layout, lt, sizeof lt);
        fprintf(out, "model %s: %llu parameters (%.3f B); layout %s on %u ranks\n", t.args.flavor,
                (unsigned long long)tsr_model_param_count(&t.args), tsr_model_param_count(&t.args) / 1e9, lt,
                tsr_layout_size(&t.layout));
        fprintf(out, "per rank, f32: parameters + gradients + AdamW moments (shards), FSDP's buffers "
                     "(one unit's gathered weights and gradients: the largest of the embedding, a layer, the output; "
                     "and its reduced shards), activations of a step:\n");
    }
    double worst = 0;
    uint32_t worst_rank = 0, n = tsr_layout_size(&t.layout);
    for (uint32_t r = 0; !rc && r < n; r++) {
        t.rank = r;
        if ((rc = tsr_mesh_coords(&t, err)) || (rc = params_init(&t, err)) || (rc = shapes_init(&t, err))) break;
        double state = 16.0 * t.n_shard_elems, full = 4.0 * t.n_full_elems;
        double acts = 4.0 * (double)t.act_floats;
        if (state + full + acts > worst) worst = state + full + acts, worst_rank = r;
        if (r < 8 || r == n - 1)
            fprintf(out, "  rank %u: %.2f GiB state + %.2f GiB gathered + %.2f GiB activations = %.2f GiB\n", r,
                    state / (1 << 30), full / (1 << 30), acts / (1 << 30), (state + full + acts) / (1 << 30));
        for (size_t p = 0; p < t.decls.n_params; p++) free(t.par[p].counts);
        free(t.par);
        t.par = NULL;
        tsr_fsdp_units_free(&t);
    }
    if (!rc) fprintf(out, "largest: rank %u, %.2f GiB\n", worst_rank, worst / (1 << 30));
    group_counts_free(&t);
    tsr_model_decls_free(&t.decls);
    return rc;
}
