/* trainer.c: the model on the mesh: parameter shards, the forward and backward
 * of a pipeline stage over micro-batches, gradient reduction and AdamW. The job
 * loop (data, checkpoints, logging) is in train_loop.c. */
#include "trainer_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "activation.h"
#include "attention.h"
#include "common.h"
#include "data_plane.h"
#include "embed.h"
#include "loss.h"
#include "matmul.h"
#include "norm.h"
#include "optim.h"
#include "rope.h"

/* ceil-division piece k of n over parts (torch.chunk), as [*begin, *begin+*len) */
static void piece(uint64_t n, uint32_t parts, uint32_t k, uint64_t *begin, uint64_t *len) {
    uint64_t c = (n + parts - 1) / parts, b = (uint64_t)k * c;
    if (b > n) b = n;
    uint64_t e = b + c < n ? b + c : n;
    *begin = b;
    *len = e - b;
}

/* ------------------------------------------------------------------- mesh */

/* The rank's place on the mesh, from the config alone (no communication). */
static int mesh_coords(tsr_trainer *t, tsr_error *err) {
    const tsr_train_config *c = &t->cfg;
    tsr_layout *l = &t->layout;
    *l = (tsr_layout){(uint32_t)c->parallelism.pipeline_parallel_degree,
                      (uint32_t)c->parallelism.data_parallel_replicate_degree,
                      (uint32_t)c->parallelism.data_parallel_shard_degree,
                      (uint32_t)c->parallelism.tensor_parallel_degree, (uint32_t)t->args.n_layers, 0};
    if (t->args.n_heads % l->tp || t->args.n_kv_heads % l->tp)
        return tsr_err(err, TSR_EINVAL,
                       "parallelism.tensor_parallel_degree=%u must divide the model's %d heads and %d kv heads",
                       l->tp, t->args.n_heads, t->args.n_kv_heads);
    t->co = tsr_layout_coord(l, t->rank);
    uint64_t per = (t->args.n_layers + l->pp - 1) / l->pp, nl = (uint64_t)t->args.n_layers;
    t->l0 = (int)(per * t->co.pp < nl ? per * t->co.pp : nl);
    t->l1 = (int)(per * (t->co.pp + 1) < nl ? per * (t->co.pp + 1) : nl);
    t->first = t->co.pp == 0;
    t->last = t->co.pp == l->pp - 1;
    tsr_coord k = t->co;
    if (!t->first) k.pp = t->co.pp - 1, t->prev = tsr_layout_rank(l, k);
    k = t->co;
    if (!t->last) k.pp = t->co.pp + 1, t->next = tsr_layout_rank(l, k);
    t->dp = l->dp_replicate * l->dp_shard;
    t->dp_rank = t->co.dp_replicate * l->dp_shard + t->co.dp_shard;
    return 0;
}

/* The groups: tp, dp_shard and dp_replicate neighbours of this rank. */
static int mesh_comms(tsr_trainer *t, tsr_error *err) {
    tsr_layout *l = &t->layout;
    if (tsr_layout_size(l) != tsr_comm_size(t->world))
        return tsr_err(err, TSR_EINVAL, "the mesh has %u ranks, the job %u", tsr_layout_size(l),
                       tsr_comm_size(t->world));
    tsr_coord k = t->co;
    k.tp = 0;
    t->tp = tsr_comm_split(t->world, (int)tsr_layout_rank(l, k), (int)t->co.tp, err);
    k = t->co, k.dp_shard = 0;
    if (t->tp) t->shard = tsr_comm_split(t->world, (int)tsr_layout_rank(l, k), (int)t->co.dp_shard, err);
    k = t->co, k.dp_replicate = 0;
    if (t->shard) t->rep = tsr_comm_split(t->world, (int)tsr_layout_rank(l, k), (int)t->co.dp_replicate, err);
    return !t->tp || !t->shard || !t->rep ? (err ? err->code : TSR_EIO) : 0;
}

/* ------------------------------------------------------------- parameters */

static int params_init(tsr_trainer *t, tsr_error *err) {
    size_t n = t->decls.n_params;
    tsr_rank_box *boxes = NULL;
    size_t nb = 0;
    int rc = tsr_layout_boxes(&t->layout, t->decls.decls, n, t->rank, &boxes, &nb, err);
    if (rc) return rc;
    t->par = calloc(n, sizeof *t->par);
    if (!t->par) {
        free(boxes);
        return tsr_err(err, TSR_ENOMEM, "out of memory");
    }
    uint32_t S = t->layout.dp_shard;
    size_t total_shard = 0, total_full = 0;
    for (size_t p = 0; p < n; p++) {
        param *q = &t->par[p];
        const tsr_tensor_decl *d = &t->decls.decls[p];
        const tsr_placement *pl = &d->placement;
        int layer = pl->layer;
        q->on_stage = pl->pp_role == TSR_PP_FIRST   ? t->first
                      : pl->pp_role == TSR_PP_LAST  ? t->last
                      : pl->pp_role == TSR_PP_LAYER ? (layer >= t->l0 && layer < t->l1)
                                                    : 1;
        if (!q->on_stage) continue;
        /* the TP-local piece: rows x cols */
        uint64_t shape[2] = {d->shape[0], d->ndim > 1 ? d->shape[1] : 1}, b;
        if (pl->tp_dim >= 0) piece(shape[pl->tp_dim], t->layout.tp, t->co.tp, &b, &shape[pl->tp_dim]);
        q->rows = shape[0];
        q->cols = shape[1];
        q->full_n = shape[0] * shape[1];
        q->counts = calloc(S, sizeof *q->counts);
        if (!q->counts) {
            free(boxes);
            return tsr_err(err, TSR_ENOMEM, "out of memory");
        }
        for (uint32_t s = 0; s < S; s++) {
            uint64_t rb, rl;
            piece(shape[0], S, s, &rb, &rl);
            q->counts[s] = rl * shape[1];
        }
        q->shard_n = q->counts[t->co.dp_shard];
        /* the rank's box, as the layout algebra gives it (absent when empty) */
        q->box.ndim = d->ndim;
        for (size_t i = 0; i < nb; i++)
            if (boxes[i].tensor == p) q->box = boxes[i].box;
        if (q->shard_n && tsr_box_volume(&q->box) != q->shard_n) {
            free(boxes);
            return tsr_err(err, TSR_EINVAL, "%s: shard of %llu elements, layout box of %llu", d->name,
                           (unsigned long long)q->shard_n, (unsigned long long)tsr_box_volume(&q->box));
        }
        /* norms contribute to the gradient norm once per tp group; tp-split ones from every tp rank */
        q->norm_counts = (pl->tp_dim >= 0 || t->co.tp == 0) && t->co.dp_replicate == 0;
        total_shard += q->shard_n;
        total_full += S > 1 ? q->full_n : 0;
    }
    free(boxes);
    t->n_shard_elems = total_shard;
    t->n_full_elems = total_full;
    return 0;
}

static int params_alloc(tsr_trainer *t, tsr_error *err) {
    size_t n = t->decls.n_params, total_shard = t->n_shard_elems;
    uint32_t S = t->layout.dp_shard;
    /* one arena: w, g, m, v shards, then the gathered weights and full gradients */
    size_t total = 4 * total_shard + 2 * t->n_full_elems;
    t->arena = tsr_alloc_aligned((total ? total : 1) * sizeof(float));
    if (!t->arena) return tsr_err(err, TSR_ENOMEM, "out of memory for %zu parameters", total_shard);
    memset(t->arena, 0, total * sizeof(float));
    float *a = t->arena;
    for (size_t p = 0; p < n; p++) {
        param *q = &t->par[p];
        if (!q->on_stage) continue;
        q->w = a, a += q->shard_n;
        q->g = a, a += q->shard_n;
        q->m = a, a += q->shard_n;
        q->v = a, a += q->shard_n;
        if (S > 1) {
            q->wf = a, a += q->full_n;
            q->gf = a, a += q->full_n;
        } else {
            q->wf = q->w;
            q->gf = q->g;
        }
        if (q->shard_n) tsr_model_init_box(&t->args, &t->decls, p, &q->box, q->w, (uint64_t)t->cfg.training.seed);
    }
    return 0;
}

/* ------------------------------------------------------------ activations */

/* Per-layer activations of one micro-batch (N = mbs * T tokens). */
static size_t layer_floats(const tsr_trainer *t) {
    size_t N = t->N, C = (size_t)t->args.dim;
    return 3 * N * C + 2 * N + 2 * N * t->Dq + 2 * N * t->Dkv + (size_t)t->mbs * t->NHt * t->T * t->T +
           3 * N * t->Ft;
}

static void layer_view(tsr_trainer *t, float *base, layer_act *la) {
    size_t N = t->N, C = (size_t)t->args.dim;
    float *p = base;
    la->h1 = p, p += N * C;
    la->rstd1 = p, p += N;
    la->q = p, p += N * t->Dq;
    la->k = p, p += N * t->Dkv;
    la->v = p, p += N * t->Dkv;
    la->att = p, p += (size_t)t->mbs * t->NHt * t->T * t->T;
    la->a = p, p += N * t->Dq;
    la->x2 = p, p += N * C;
    la->h2 = p, p += N * C;
    la->rstd2 = p, p += N;
    la->g = p, p += N * t->Ft;
    la->u = p, p += N * t->Ft;
    la->s = p, p += N * t->Ft;
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
    uint64_t fb, fl;
    piece((uint64_t)t->args.ffn_dim, t->layout.tp, t->co.tp, &fb, &fl);
    t->Ft = (size_t)fl;
    size_t N = t->N, C = (size_t)t->args.dim, V = (size_t)t->args.vocab_size;
    int L = t->l1 - t->l0;
    t->n_sets = t->layout.pp > 1 ? t->M : 1;
    t->per_set = (size_t)(L + 1) * N * C + (size_t)L * layer_floats(t) + (t->last ? N * C + N + N * V + N : 0);
    t->scratch = 2 * N * C + 2 * N * t->Dq + 2 * N * t->Dkv + 3 * N * t->Ft +
                 tsr_attention_scratch(t->mbs, t->T, t->NHt, hd) + (t->last ? N * V + N : 0) +
                 (t->layout.pp > 1 && !t->first ? (size_t)t->M * N * C : 0) + (size_t)t->T * (size_t)hd;
    return 0;
}

static int acts_alloc(tsr_trainer *t, tsr_error *err) {
    int hd = tsr_model_head_dim(&t->args);
    size_t N = t->N, C = (size_t)t->args.dim, V = (size_t)t->args.vocab_size;
    int L = t->l1 - t->l0;
    size_t total = t->per_set * (size_t)t->n_sets + t->scratch;
    t->act_arena = tsr_alloc_aligned(total * sizeof(float));
    t->sets = calloc((size_t)t->n_sets, sizeof *t->sets);
    t->tokens = calloc(2 * (size_t)t->B * t->T, sizeof *t->tokens);
    if (!t->act_arena || !t->sets || !t->tokens)
        return tsr_err(err, TSR_ENOMEM, "out of memory for activations (%zu MiB)", total * sizeof(float) >> 20);
    memset(t->act_arena, 0, total * sizeof(float));
    t->act_bytes = total * sizeof(float);
    float *p = t->act_arena;
    for (int j = 0; j < t->n_sets; j++) {
        act_set *s = &t->sets[j];
        s->layers = calloc((size_t)(L > 0 ? L : 1), sizeof *s->layers);
        if (!s->layers) return tsr_err(err, TSR_ENOMEM, "out of memory");
        s->xs = p, p += (size_t)(L + 1) * N * C;
        for (int l = 0; l < L; l++) {
            layer_view(t, p, &s->layers[l]);
            p += layer_floats(t);
        }
        if (t->last) {
            s->hf = p, p += N * C;
            s->rstdf = p, p += N;
            s->probs = p, p += N * V;
            s->losses = p, p += N;
        }
    }
    t->dres = p, p += N * C;
    t->dh = p, p += N * C;
    t->dq = p, p += N * t->Dq;
    t->da = p, p += N * t->Dq;
    t->dk = p, p += N * t->Dkv;
    t->dv = p, p += N * t->Dkv;
    t->ds = p, p += N * t->Ft;
    t->dg = p, p += N * t->Ft;
    t->du = p, p += N * t->Ft;
    t->att_scratch = p, p += tsr_attention_scratch(t->mbs, t->T, t->NHt, hd);
    if (t->last) {
        t->dlogits = p, p += N * V;
        t->dloss = p, p += N;
    }
    if (t->layout.pp > 1 && !t->first) t->dsend = p, p += (size_t)t->M * N * C;
    t->rope_cos = p, p += (size_t)t->T * hd / 2;
    t->rope_sin = p, p += (size_t)t->T * hd / 2;
    const tsr_rope_scaling *sc = t->args.rope_scaling.factor != 0 ? &t->args.rope_scaling : NULL;
    tsr_rope_tables(t->rope_cos, t->rope_sin, t->T, hd, t->args.rope_theta, sc);
    t->reqs = tsr_comm_reqs_new();
    if (!t->reqs) return tsr_err(err, TSR_ENOMEM, "out of memory");
    return 0;
}

/* ---------------------------------------------------------------- forward */

static int tp_sum(tsr_trainer *t, float *x, size_t n, tsr_error *err) {
    return t->layout.tp > 1 ? tsr_data_allreduce_sum(t->tp, TSR_F32, x, n, NULL, err) : 0;
}

static float *W(tsr_trainer *t, int layer, int k) { return t->par[tsr_model_param_index(layer, k)].wf; }
static float *G(tsr_trainer *t, int layer, int k) { return t->par[tsr_model_param_index(layer, k)].gf; }

static void add(float *y, const float *a, const float *b, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}

/* x (N,C) -> out (N,C) through layer `layer`, keeping what backward needs in la. */
static int layer_fwd(tsr_trainer *t, int layer, layer_act *la, const float *x, float *out, tsr_error *err) {
    int N = (int)t->N, C = t->args.dim, hd = tsr_model_head_dim(&t->args);
    int Dq = (int)t->Dq, Dkv = (int)t->Dkv, F = (int)t->Ft;
    tsr_rmsnorm_fwd(la->h1, la->rstd1, x, W(t, layer, TSR_P_ATTN_NORM), N, C, t->args.norm_eps);
    tsr_matmul_fwd(la->q, la->h1, W(t, layer, TSR_P_WQ), N, C, Dq);
    tsr_matmul_fwd(la->k, la->h1, W(t, layer, TSR_P_WK), N, C, Dkv);
    tsr_matmul_fwd(la->v, la->h1, W(t, layer, TSR_P_WV), N, C, Dkv);
    tsr_rope_fwd(la->q, t->rope_cos, t->rope_sin, t->mbs, t->T, t->NHt, hd);
    tsr_rope_fwd(la->k, t->rope_cos, t->rope_sin, t->mbs, t->T, t->NKVt, hd);
    tsr_attention_fwd(la->a, la->att, la->q, la->k, la->v, t->mbs, t->T, t->NHt, t->NKVt, hd);
    tsr_matmul_fwd(out, la->a, W(t, layer, TSR_P_WO), N, Dq, C); /* partial over tp */
    int rc = tp_sum(t, out, (size_t)N * C, err);
    if (rc) return rc;
    add(la->x2, x, out, (size_t)N * C);
    tsr_rmsnorm_fwd(la->h2, la->rstd2, la->x2, W(t, layer, TSR_P_FFN_NORM), N, C, t->args.norm_eps);
    if (F > 0) {
        tsr_matmul_fwd(la->g, la->h2, W(t, layer, TSR_P_W1), N, C, F);
        tsr_matmul_fwd(la->u, la->h2, W(t, layer, TSR_P_W3), N, C, F);
        tsr_swiglu_fwd(la->s, la->g, la->u, (size_t)N * F);
        tsr_matmul_fwd(out, la->s, W(t, layer, TSR_P_W2), N, F, C);
    } else {
        memset(out, 0, (size_t)N * C * sizeof *out);
    }
    if ((rc = tp_sum(t, out, (size_t)N * C, err))) return rc;
    add(out, la->x2, out, (size_t)N * C);
    return 0;
}

/* d(out) in t->dres (N,C) -> d(x) in t->dres, accumulating the weight gradients. */
static int layer_bwd(tsr_trainer *t, int layer, layer_act *la, const float *x, tsr_error *err) {
    int N = (int)t->N, C = t->args.dim, hd = tsr_model_head_dim(&t->args);
    int Dq = (int)t->Dq, Dkv = (int)t->Dkv, F = (int)t->Ft;
    size_t NC = (size_t)N * C;
    memset(t->dh, 0, NC * sizeof(float));
    if (F > 0) {
        memset(t->ds, 0, (size_t)N * F * sizeof(float));
        memset(t->dg, 0, (size_t)N * F * sizeof(float));
        memset(t->du, 0, (size_t)N * F * sizeof(float));
        tsr_matmul_bwd(t->ds, G(t, layer, TSR_P_W2), t->dres, la->s, W(t, layer, TSR_P_W2), N, F, C);
        tsr_swiglu_bwd(t->dg, t->du, t->ds, la->g, la->u, (size_t)N * F);
        tsr_matmul_bwd(t->dh, G(t, layer, TSR_P_W1), t->dg, la->h2, W(t, layer, TSR_P_W1), N, C, F);
        tsr_matmul_bwd(t->dh, G(t, layer, TSR_P_W3), t->du, la->h2, W(t, layer, TSR_P_W3), N, C, F);
    }
    int rc = tp_sum(t, t->dh, NC, err);
    if (rc) return rc;
    tsr_rmsnorm_bwd(t->dres, G(t, layer, TSR_P_FFN_NORM), t->dh, la->x2, W(t, layer, TSR_P_FFN_NORM), la->rstd2, N, C);
    /* attention: dres is now d(x2) */
    memset(t->da, 0, (size_t)N * Dq * sizeof(float));
    memset(t->dq, 0, (size_t)N * Dq * sizeof(float));
    memset(t->dk, 0, (size_t)N * Dkv * sizeof(float));
    memset(t->dv, 0, (size_t)N * Dkv * sizeof(float));
    tsr_matmul_bwd(t->da, G(t, layer, TSR_P_WO), t->dres, la->a, W(t, layer, TSR_P_WO), N, Dq, C);
    tsr_attention_bwd(t->dq, t->dk, t->dv, t->att_scratch, t->da, la->q, la->k, la->v, la->att, t->mbs, t->T,
                      t->NHt, t->NKVt, hd);
    tsr_rope_bwd(t->dq, t->rope_cos, t->rope_sin, t->mbs, t->T, t->NHt, hd);
    tsr_rope_bwd(t->dk, t->rope_cos, t->rope_sin, t->mbs, t->T, t->NKVt, hd);
    memset(t->dh, 0, NC * sizeof(float));
    tsr_matmul_bwd(t->dh, G(t, layer, TSR_P_WQ), t->dq, la->h1, W(t, layer, TSR_P_WQ), N, C, Dq);
    tsr_matmul_bwd(t->dh, G(t, layer, TSR_P_WK), t->dk, la->h1, W(t, layer, TSR_P_WK), N, C, Dkv);
    tsr_matmul_bwd(t->dh, G(t, layer, TSR_P_WV), t->dv, la->h1, W(t, layer, TSR_P_WV), N, C, Dkv);
    if ((rc = tp_sum(t, t->dh, NC, err))) return rc;
    tsr_rmsnorm_bwd(t->dres, G(t, layer, TSR_P_ATTN_NORM), t->dh, x, W(t, layer, TSR_P_ATTN_NORM), la->rstd1, N, C);
    return 0;
}

enum { TAG_FWD = 0, TAG_BWD = 1 };

/* Forward of micro-batch j (samples j*mbs ..) through this stage. */
static int mb_fwd(tsr_trainer *t, int j, tsr_error *err) {
    act_set *s = &t->sets[j % t->n_sets];
    size_t N = t->N, C = (size_t)t->args.dim, V = (size_t)t->args.vocab_size;
    const int *tok = t->tokens + (size_t)j * N, *tgt = t->tokens + (size_t)t->B * t->T + (size_t)j * N;
    int rc = 0;
    if (t->first)
        tsr_embed_fwd(s->xs, tok, t->par[0].wf, (int)N, (int)C, (int)V);
    else if ((rc = tsr_data_recv(t->world, t->prev, 2 * j + TAG_FWD, TSR_F32, s->xs, N * C, NULL, err)))
        return rc;
    int L = t->l1 - t->l0;
    for (int l = 0; l < L && !rc; l++)
        rc = layer_fwd(t, t->l0 + l, &s->layers[l], s->xs + (size_t)l * N * C, s->xs + (size_t)(l + 1) * N * C, err);
    if (rc) return rc;
    float *xL = s->xs + (size_t)L * N * C;
    if (!t->last)
        return tsr_data_send(t->world, t->next, 2 * j + TAG_FWD, TSR_F32, xL, N * C, t->reqs, NULL, err);
    size_t np = t->decls.n_params;
    tsr_rmsnorm_fwd(s->hf, s->rstdf, xL, t->par[np - 2].wf, (int)N, (int)C, t->args.norm_eps);
    tsr_matmul_fwd(s->probs, s->hf, t->par[np - 1].wf, (int)N, (int)C, (int)V);
    if (t->keep_logits && j == t->M - 1) memcpy(t->keep_logits, s->probs, (size_t)t->T * V * sizeof(float));
    tsr_xent_fwd(s->losses, s->probs, s->probs, tgt, (int)N, (int)V);
    double sum = 0;
    for (size_t i = 0; i < N; i++) sum += s->losses[i];
    t->loss_sum += sum;
    return 0;
}

static int mb_bwd(tsr_trainer *t, int j, tsr_error *err) {
    act_set *s = &t->sets[j % t->n_sets];
    size_t N = t->N, C = (size_t)t->args.dim, V = (size_t)t->args.vocab_size, np = t->decls.n_params;
    const int *tok = t->tokens + (size_t)j * N, *tgt = t->tokens + (size_t)t->B * t->T + (size_t)j * N;
    int L = t->l1 - t->l0, rc = 0;
    float *xL = s->xs + (size_t)L * N * C;
    if (t->last) {
        for (size_t i = 0; i < N; i++) t->dloss[i] = (float)t->inv_count;
        memset(t->dlogits, 0, N * V * sizeof(float));
        tsr_xent_bwd(t->dlogits, s->probs, tgt, t->dloss, (int)N, (int)V);
        memset(t->dh, 0, N * C * sizeof(float));
        tsr_matmul_bwd(t->dh, t->par[np - 1].gf, t->dlogits, s->hf, t->par[np - 1].wf, (int)N, (int)C, (int)V);
        memset(t->dres, 0, N * C * sizeof(float));
        tsr_rmsnorm_bwd(t->dres, t->par[np - 2].gf, t->dh, xL, t->par[np - 2].wf, s->rstdf, (int)N, (int)C);
    } else if ((rc = tsr_data_recv(t->world, t->next, 2 * j + TAG_BWD, TSR_F32, t->dres, N * C, NULL, err))) {
        return rc;
    }
    for (int l = L - 1; l >= 0 && !rc; l--)
        rc = layer_bwd(t, t->l0 + l, &s->layers[l], s->xs + (size_t)l * N * C, err);
    if (rc) return rc;
    if (t->first) {
        tsr_embed_bwd(t->par[0].gf, t->dres, tok, (int)N, (int)C, (int)V);
        return 0;
    }
    float *send = t->dsend + (size_t)j * N * C;
    memcpy(send, t->dres, N * C * sizeof(float));
    return tsr_data_send(t->world, t->prev, 2 * j + TAG_BWD, TSR_F32, send, N * C, t->reqs, NULL, err);
}

/* The micro-batches through the stage: GPipe (all forwards, then all backwards)
 * or 1F1B (warm-up forwards, then one forward and one backward in turn, then the
 * remaining backwards). Sends are nonblocking and receives blocking, so neither
 * schedule can deadlock. */
static int run_schedule(tsr_trainer *t, tsr_error *err) {
    int M = t->M, rc = 0;
    if (t->layout.pp == 1) {
        for (int j = 0; j < M && !rc; j++) {
            rc = mb_fwd(t, j, err);
            if (!rc) rc = mb_bwd(t, j, err);
        }
        return rc;
    }
    int warm = M;
    if (t->cfg.parallelism.pipeline_parallel_schedule == TSR_SCHED_1F1B) {
        warm = (int)(t->layout.pp - t->co.pp - 1);
        if (warm > M) warm = M;
    }
    int f = 0, b = 0;
    for (; f < warm && !rc; f++) rc = mb_fwd(t, f, err);
    while (f < M && !rc) {
        rc = mb_fwd(t, f++, err);
        if (!rc) rc = mb_bwd(t, b++, err);
    }
    while (b < M && !rc) rc = mb_bwd(t, b++, err);
    int rc2 = tsr_data_wait(t->world, t->reqs, NULL, rc ? NULL : err);
    return rc ? rc : rc2;
}

/* ------------------------------------------------------------------- step */

int tsr_trainer_step(tsr_trainer *t, int step, const int *inputs, const int *targets, int optimize,
                     double *loss, double *grad_norm, tsr_error *err) {
    size_t n = t->decls.n_params, bt = (size_t)t->B * t->T;
    uint32_t S = t->layout.dp_shard;
    int rc = 0;
    memcpy(t->tokens, inputs, bt * sizeof *inputs);
    memcpy(t->tokens + bt, targets, bt * sizeof *targets);
    /* the global number of counted targets: every rank of one dp index holds the
     * same ones, so only (pp 0, tp 0) ranks report */
    double cnt = 0;
    if (t->co.pp == 0 && t->co.tp == 0)
        for (size_t i = 0; i < bt; i++) cnt += targets[i] >= 0;
    if ((rc = tsr_data_allreduce_sum(t->world, TSR_F64, &cnt, 1, NULL, err))) return rc;
    t->inv_count = cnt > 0 ? 1.0 / cnt : 0.0;
    /* FSDP: gather the stage's weights; zero the gradients */
    for (size_t p = 0; p < n && !rc; p++) {
        param *q = &t->par[p];
        if (!q->on_stage) continue;
        if (S > 1) rc = tsr_data_allgatherv(t->shard, TSR_F32, q->w, q->wf, q->counts, NULL, err);
        memset(q->gf, 0, q->full_n * sizeof(float));
    }
    t->loss_sum = 0;
    if (!rc) rc = run_schedule(t, err);
    /* gradients: reduce-scatter over dp_shard, all-reduce over dp_replicate */
    for (size_t p = 0; p < n && !rc; p++) {
        param *q = &t->par[p];
        if (!q->on_stage) continue;
        if (S > 1) rc = tsr_data_reduce_scatterv(t->shard, TSR_F32, q->gf, q->g, q->counts, NULL, err);
        if (!rc && t->layout.dp_replicate > 1) rc = tsr_data_allreduce_sum(t->rep, TSR_F32, q->g, q->shard_n, NULL, err);
    }
    if (rc) return rc;
    /* the loss and the gradient norm, each counted once */
    double red[2] = {t->last && t->co.tp == 0 ? t->loss_sum : 0, 0};
    for (size_t p = 0; p < n; p++)
        if (t->par[p].on_stage && t->par[p].norm_counts) red[1] += tsr_sumsq(t->par[p].g, t->par[p].shard_n);
    if ((rc = tsr_data_allreduce_sum(t->world, TSR_F64, red, 2, NULL, err))) return rc;
    *loss = red[0] * t->inv_count;
    *grad_norm = sqrt(red[1]);
    if (!optimize) return 0;
    const tsr_train_config *c = &t->cfg;
    double clip = c->training.max_norm / (*grad_norm + 1e-6);
    float lr = (float)tsr_config_lr_at(c, step);
    t->last_lr = lr;
    for (size_t p = 0; p < n; p++) {
        param *q = &t->par[p];
        if (!q->on_stage || !q->shard_n) continue;
        if (clip < 1.0) tsr_scale(q->g, q->shard_n, (float)clip);
        tsr_adamw(q->w, q->g, q->m, q->v, q->shard_n, lr, (float)c->optimizer.beta1, (float)c->optimizer.beta2,
                  (float)c->optimizer.eps, (float)c->optimizer.weight_decay, step);
    }
    return 0;
}

/* ------------------------------------------------------------ life cycle */

int tsr_trainer_new(const tsr_train_config *cfg, tsr_comm *world, tsr_trainer **out, tsr_error *err) {
    tsr_model_args a;
    int rc = tsr_model_args_get(tsr_flavor_name(cfg->model.flavor), &a, err);
    a.max_seq_len = cfg->training.seq_len; /* as TorchTitan's model args take it */
    return rc ? rc : tsr_trainer_new_args(cfg, &a, world, out, err);
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
    if (!rc) rc = mesh_coords(t, err);
    if (!rc) rc = mesh_comms(t, err);
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
    free(t->arena);
    for (int j = 0; t->sets && j < t->n_sets; j++) free(t->sets[j].layers);
    free(t->sets);
    free(t->act_arena);
    free(t->tokens);
    tsr_comm_reqs_free(t->reqs);
    if (t->tp) tsr_comm_free(t->tp);
    if (t->shard) tsr_comm_free(t->shard);
    if (t->rep) tsr_comm_free(t->rep);
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

void tsr_trainer_keep_logits(tsr_trainer *t, float *dst) { t->keep_logits = dst; }
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
    if (!(rc = mesh_coords(&t, err))) {
        tsr_layout_format(&t.layout, lt, sizeof lt);
        fprintf(out, "model %s: %llu parameters (%.3f B); layout %s on %u ranks\n", t.args.flavor,
                (unsigned long long)tsr_model_param_count(&t.args), tsr_model_param_count(&t.args) / 1e9, lt,
                tsr_layout_size(&t.layout));
        fprintf(out, "per rank, f32: parameters + gradients + AdamW moments (shards), gathered weights and "
                     "gradients (FSDP), activations of a step:\n");
    }
    double worst = 0;
    uint32_t worst_rank = 0, n = tsr_layout_size(&t.layout);
    for (uint32_t r = 0; !rc && r < n; r++) {
        t.rank = r;
        if ((rc = mesh_coords(&t, err)) || (rc = params_init(&t, err)) || (rc = shapes_init(&t, err))) break;
        double state = 16.0 * t.n_shard_elems, full = 8.0 * t.n_full_elems;
        double acts = 4.0 * ((double)t.per_set * t.n_sets + (double)t.scratch);
        if (state + full + acts > worst) worst = state + full + acts, worst_rank = r;
        if (r < 8 || r == n - 1)
            fprintf(out, "  rank %u: %.2f GiB state + %.2f GiB gathered + %.2f GiB activations = %.2f GiB\n", r,
                    state / (1 << 30), full / (1 << 30), acts / (1 << 30), (state + full + acts) / (1 << 30));
        for (size_t p = 0; p < t.decls.n_params; p++) free(t.par[p].counts);
        free(t.par);
        t.par = NULL;
    }
    if (!rc) fprintf(out, "largest: rank %u, %.2f GiB\n", worst_rank, worst / (1 << 30));
    tsr_model_decls_free(&t.decls);
    return rc;
}
