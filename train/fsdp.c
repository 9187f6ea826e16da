/* fsdp.c: FSDP by units. With dp_shard > 1 a rank holds its shards and gathers
 * one unit at a time: each layer whole (one all-gather, resharded after its
 * forward and gathered again for its backward, its gradients reduce-scattered
 * right after its backward); the embedding by the rows its tokens need; the
 * output vocabulary-parallel over dp_shard where the shard group's tokens are
 * fewer than its rows (tp = 1), else in rounds of rows that fit in the space of
 * a layer (all below). */
#include "trainer_impl.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"

void tsr_fsdp_units_free(tsr_trainer *t) {
    for (int u = 0; t->units && u < t->n_units; u++) free(t->units[u].counts);
    free(t->units);
    free(t->vrow0);
    free(t->hrow0);
    t->units = NULL;
    t->vrow0 = t->hrow0 = NULL;
}

/* The FSDP units (the embedding, each layer, the final norm with the output),
 * their sizes on this stage, and the floats of the unit buffers. */
int tsr_fsdp_units_init(tsr_trainer *t, tsr_error *err) {
    uint32_t S = t->layout.dp_shard;
    size_t np = t->decls.n_params;
    t->n_units = t->args.n_layers + 2;
    if (!(t->units = calloc((size_t)t->n_units, sizeof *t->units))) return tsr_err(err, TSR_ENOMEM, "out of memory");
    t->unit_max = t->unit_shard_max = 0;
    for (int u = 0; u < t->n_units; u++) {
        fsdp_unit *U = &t->units[u];
        U->p0 = u == 0 ? 0 : u == t->n_units - 1 ? np - 2 : tsr_model_param_index(u - 1, 0);
        U->p1 = u == 0 ? 1 : u == t->n_units - 1 ? np : U->p0 + TSR_LAYER_PARAMS;
        U->on_stage = t->par[U->p0].on_stage;
        if (!U->on_stage) continue;
        if (!(U->counts = calloc(S, sizeof *U->counts))) return tsr_err(err, TSR_ENOMEM, "out of memory");
        for (size_t p = U->p0; p < U->p1; p++) {
            U->full_n += t->par[p].full_n;
            U->shard_n += t->par[p].shard_n;
            for (uint32_t r = 0; r < S; r++) U->counts[r] += t->par[p].counts[r];
        }
        if (u == 0 || u == t->n_units - 1) continue; /* in rounds: below */
        if (U->full_n > t->unit_max) t->unit_max = U->full_n;
        if (U->shard_n > t->unit_shard_max) t->unit_shard_max = U->shard_n;
    }
    t->n_full_elems = 0;
    if (S == 1) return 0;
    /* the embedding (V, C) and the output (its TP-local rows, C), dim 0 split
     * over dp_shard: each rank's first row; rounds of chunk_rows rows of each
     * rank's shard of the output fit in the largest layer, and so do dp_shard
     * rows of the embedding */
    uint64_t C = (uint64_t)t->args.dim, most = 0, most_of[2] = {0, 0};
    uint64_t **row0[2] = {&t->vrow0, &t->hrow0};
    for (int h = 0; h < 2; h++) {
        const param *q = &t->par[h ? np - 1 : 0];
        if (!(*row0[h] = calloc(S + 1, sizeof **row0[h]))) return tsr_err(err, TSR_ENOMEM, "out of memory");
        for (uint32_t r = 0; q->on_stage && r < S; r++) {
            uint64_t rows = q->counts[r] / C;
            (*row0[h])[r + 1] = (*row0[h])[r] + rows;
            if (rows > most_of[h]) most_of[h] = rows;
        }
        if (q->on_stage && (*row0[h])[S] * C != q->full_n)
            return tsr_err(err, TSR_EINVAL, "FSDP: the %s's shards hold %llu of its %llu rows",
                           h ? "output" : "embedding", (unsigned long long)(*row0[h])[S],
                           (unsigned long long)(q->full_n / C));
        if (most_of[h] > most) most = most_of[h];
    }
    t->chunk_rows = t->unit_max / (S * C);
    if (t->chunk_rows < 1) t->chunk_rows = t->unit_max ? 1 : (most ? most : 1);
    if (t->chunk_rows > most && most) t->chunk_rows = most;
    t->hrounds = (most_of[1] + t->chunk_rows - 1) / t->chunk_rows;
    uint64_t chunk = C + S * t->chunk_rows * C; /* the final norm, then a round of the output */
    if (chunk > t->unit_max) t->unit_max = chunk;
    if (t->chunk_rows * C > t->unit_shard_max) t->unit_shard_max = t->chunk_rows * C;
    if (C > t->unit_shard_max) t->unit_shard_max = C;
    t->n_full_elems = 2 * t->unit_max + t->unit_shard_max;
    return 0;
}

enum { MAX_UNIT_PARAMS = TSR_LAYER_PARAMS };

/* Unit u's weights into wunit (each parameter's TP-local piece at its wf), unless
 * they are there: one all-gather of the unit's shards, rank-major into gunit
 * (free outside a unit's backward), then each rank's piece of each parameter in
 * place. */
int tsr_fsdp_gather(tsr_trainer *t, int u, tsr_error *err) {
    uint32_t S = t->layout.dp_shard;
    if (S == 1 || t->w_unit == u) return 0;
    const fsdp_unit *U = &t->units[u];
    int rc = tsr_plane_allgatherv(&t->plane, t->shard, TSR_F32, t->par[U->p0].w, t->gunit, U->counts, err);
    if (rc) return rc;
    uint64_t at[MAX_UNIT_PARAMS] = {0};
    const float *src = t->gunit;
    for (uint32_t r = 0; r < S; r++) {
        for (size_t p = U->p0; p < U->p1; p++) {
            size_t c = t->par[p].counts[r];
            tsr_kc_copy(&t->kc, t->par[p].wf + at[p - U->p0], src, c * sizeof(float));
            at[p - U->p0] += c, src += c;
        }
    }
    t->w_unit = u;
    return 0;
}

/* Before unit u's backward: its gradient buffers zeroed (with FSDP; without,
 * the gradients accumulate in the shards, zeroed once a step). */
void tsr_fsdp_grads_zero(tsr_trainer *t, int u) {
    if (t->layout.dp_shard > 1) tsr_kc_fill(&t->kc, t->gunit, t->units[u].full_n, 0);
}

/* After unit u's backward: its gradients reduce-scattered over dp_shard (packed
 * rank-major into wunit, whose weights the next unit replaces anyway) and added
 * to this rank's gradient shards. */
int tsr_fsdp_grads_reduce(tsr_trainer *t, int u, tsr_error *err) {
    uint32_t S = t->layout.dp_shard;
    if (S == 1) return 0;
    const fsdp_unit *U = &t->units[u];
    uint64_t at[MAX_UNIT_PARAMS] = {0};
    float *dst = t->wunit;
    t->w_unit = -1;
    for (uint32_t r = 0; r < S; r++) {
        for (size_t p = U->p0; p < U->p1; p++) {
            size_t c = t->par[p].counts[r];
            tsr_kc_copy(&t->kc, dst, t->par[p].gf + at[p - U->p0], c * sizeof(float));
            at[p - U->p0] += c, dst += c;
        }
    }
    int rc = tsr_plane_reduce_scatterv(&t->plane, t->shard, TSR_F32, t->wunit, t->rs, U->counts, err);
    if (!rc) tsr_kc_add(&t->kc, t->par[U->p0].g, t->par[U->p0].g, t->rs, U->shard_n);
    return rc;
}

/* Round k of the output (its TP-local rows, C) in rounds: each rank's rows
 * [k R, k R + R) of its shard (fewer at its end), gathered rank-major into dst;
 * counts[] gets each rank's floats, base[] each rank's first row in the chunk. */
static int round_gather(tsr_trainer *t, uint64_t k, float *dst, size_t *counts, uint64_t *base, tsr_error *err) {
    uint32_t S = t->layout.dp_shard;
    size_t p = t->decls.n_params - 1;
    uint64_t C = (uint64_t)t->args.dim, R = t->chunk_rows, at = 0;
    for (uint32_t r = 0; r < S; r++) {
        uint64_t rows = t->hrow0[r + 1] - t->hrow0[r], lo = k * R < rows ? k * R : rows;
        uint64_t n = rows - lo < R ? rows - lo : R;
        counts[r] = n * C, base[r] = at, at += n;
    }
    uint64_t mine = (k * R < t->par[p].counts[t->co.dp_shard] / C ? k * R : 0) * C;
    return tsr_plane_allgatherv(&t->plane, t->shard, TSR_F32, t->par[p].w + mine, dst, counts, err);
}

/* Round k's gradient of the output (in src, rank-major as round_gather placed
 * its rows) reduce-scattered and added to this rank's rows of it. */
static int round_reduce(tsr_trainer *t, uint64_t k, const float *src, const size_t *counts, tsr_error *err) {
    size_t p = t->decls.n_params - 1;
    uint64_t C = (uint64_t)t->args.dim, me = t->co.dp_shard;
    int rc = tsr_plane_reduce_scatterv(&t->plane, t->shard, TSR_F32, src, t->rs, counts, err);
    if (!rc && counts[me]) tsr_kc_add(&t->kc, t->par[p].g + k * t->chunk_rows * C, t->par[p].g + k * t->chunk_rows * C, t->rs,
                                     counts[me]);
    return rc;
}

/* The embedding with FSDP moves tokens and rows, never the (V, C) table: a
 * micro-batch touches at most N of its V rows. Every rank's tokens are gathered;
 * in rounds of P tokens a rank (S P rows fit in gunit), forward: each rank puts,
 * for every rank's tokens, the rows its shard holds (zeros for the others), and
 * a reduce-scatter hands each rank its own tokens' rows (a row plus zeros: the
 * row exactly); backward: the rows of d(out) are gathered, and each rank adds to
 * its shard's gradient the rows of the tokens it holds. */
static uint64_t embed_round(const tsr_trainer *t) {
    uint64_t P = t->unit_max / ((uint64_t)t->layout.dp_shard * (uint64_t)t->args.dim);
    return P < 1 ? 1 : P < t->N ? P : t->N; /* unit_max holds S C floats (units_init) */
}

/* Every rank's N tokens, rank-major, into *all (a new array, the old one
 * freed): once a micro-batch, in the forward; its backward reads them there. */
static int gather_tokens(tsr_trainer *t, const int *tok, int **all, tsr_error *err) {
    size_t *counts = NULL;
    uint8_t *raw = NULL;
    free(*all);
    *all = NULL;
    int rc = tsr_comm_allgatherv(t->shard, tok, t->N * sizeof *tok, &raw, &counts, err);
    for (uint32_t r = 0; !rc && r < t->layout.dp_shard; r++)
        if (counts[r] != t->N * sizeof *tok)
            rc = tsr_err(err, TSR_EINVAL, "FSDP: dp_shard rank %u sent %zu bytes of token ids, not %zu", r,
                         counts[r], t->N * sizeof *tok);
    free(counts);
    if (rc) free(raw);
    *all = rc ? NULL : (int *)(void *)raw;
    return rc;
}

/* Round [k0, k0 + n) of every rank's tokens: each one's row in my shard, or -1,
 * on the host (tok_map) and in the trainer's memory (tok_map_dev). */
static int shard_rows(tsr_trainer *t, const int *all, uint64_t k0, uint64_t n, tsr_error *err) {
    uint64_t lo = t->vrow0[t->co.dp_shard], hi = t->vrow0[t->co.dp_shard + 1];
    for (uint64_t i = 0; i < t->layout.dp_shard * n; i++) {
        int v = all[(i / n) * t->N + k0 + i % n];
        t->tok_map[i] = v >= 0 && (uint64_t)v >= lo && (uint64_t)v < hi ? (int)((uint64_t)v - lo) : -1;
    }
    return tsr_kc_from_host(&t->kc, t->tok_map_dev, t->tok_map, t->layout.dp_shard * n * sizeof *t->tok_map, err);
}

/* The embedding with FSDP: out (N,C) holds each token's row. */
int tsr_fsdp_embed_fwd(tsr_trainer *t, act_set *s, float *out, const int *tok, tsr_error *err) {
    uint64_t C = (uint64_t)t->args.dim, P = embed_round(t), S = t->layout.dp_shard;
    uint64_t rows = t->vrow0[t->co.dp_shard + 1] - t->vrow0[t->co.dp_shard];
    int rc = gather_tokens(t, tok, &s->ids_in, err);
    const int *all = s->ids_in;
    for (uint64_t k0 = 0; !rc && k0 < t->N; k0 += P) {
        uint64_t n = t->N - k0 < P ? t->N - k0 : P;
        if ((rc = shard_rows(t, all, k0, n, err))) break;
        /* the rows my shard holds, zeros for the others: the embedding's lookup on my rows */
        tsr_kc_embed_fwd(&t->kc, t->gunit, t->tok_map_dev, t->par[0].w, (int)(S * n), (int)C, (int)rows);
        rc = tsr_plane_reduce_scatter(&t->plane, t->shard, TSR_F32, t->gunit, out + k0 * C, n * C, err);
    }
    return rc;
}

/* Its backward: d(embedding) of my shard's rows, from every rank's dout (N,C). */
int tsr_fsdp_embed_bwd(tsr_trainer *t, const act_set *s, const float *dout, tsr_error *err) {
    uint64_t C = (uint64_t)t->args.dim, P = embed_round(t), S = t->layout.dp_shard;
    uint64_t rows = t->vrow0[t->co.dp_shard + 1] - t->vrow0[t->co.dp_shard];
    int rc = 0;
    for (uint64_t k0 = 0; !rc && k0 < t->N; k0 += P) {
        uint64_t n = t->N - k0 < P ? t->N - k0 : P;
        if ((rc = tsr_plane_allgather(&t->plane, t->shard, TSR_F32, dout + k0 * C, t->gunit, n * C, err))) break;
        if ((rc = shard_rows(t, s->ids_in, k0, n, err))) break;
        tsr_kc_embed_bwd(&t->kc, t->par[0].g, t->gunit, t->tok_map_dev, (int)(S * n), (int)C, (int)rows);
    }
    return rc;
}

/* The output with FSDP, in rounds: logits (N,V) = h (N,C) @ output^T, each
 * rank's block of a round into its columns. */
int tsr_fsdp_head_fwd(tsr_trainer *t, float *logits, const float *h, tsr_error *err) {
    uint32_t S = t->layout.dp_shard;
    size_t counts[S], N = t->N;
    uint64_t base[S], C = (uint64_t)t->args.dim, V = t->Vt;
    for (uint64_t k = 0; k < t->hrounds; k++) {
        int rc = round_gather(t, k, t->wunit + C, counts, base, err);
        if (rc) return rc;
        for (uint32_t r = 0; r < S; r++) {
            uint64_t n = counts[r] / C, col = t->hrow0[r] + k * t->chunk_rows;
            if (!n) continue;
            tsr_kc_matmul_fwd(&t->kc, t->logit_tmp, h, t->wunit + C + base[r] * C, (int)N, (int)C, (int)n);
            tsr_kc_copy2d(&t->kc, logits + col, V * sizeof(float), t->logit_tmp, n * sizeof(float), n * sizeof(float), N);
        }
    }
    t->w_unit = -1;
    return 0;
}

/* Its backward: dh (N,C) += dlogits @ output, and each round's d(output) rows
 * reduced. */
int tsr_fsdp_head_bwd(tsr_trainer *t, float *dh, const float *dlogits, const float *h, tsr_error *err) {
    uint32_t S = t->layout.dp_shard;
    size_t counts[S], N = t->N;
    uint64_t base[S], C = (uint64_t)t->args.dim, V = t->Vt;
    int rc = 0;
    for (uint64_t k = 0; k < t->hrounds && !rc; k++) {
        if ((rc = round_gather(t, k, t->wunit + C, counts, base, err))) break;
        uint64_t rows = base[S - 1] + counts[S - 1] / C;
        tsr_kc_fill(&t->kc, t->gunit + C, rows * C, 0);
        for (uint32_t r = 0; r < S; r++) {
            uint64_t n = counts[r] / C, col = t->hrow0[r] + k * t->chunk_rows;
            if (!n) continue;
            tsr_kc_copy2d(&t->kc, t->logit_tmp, n * sizeof(float), dlogits + col, V * sizeof(float), n * sizeof(float), N);
            tsr_kc_matmul_bwd(&t->kc, dh, t->gunit + C + base[r] * C, t->logit_tmp, h, t->wunit + C + base[r] * C, (int)N,
                           (int)C, (int)n);
        }
        rc = round_reduce(t, k, t->gunit + C, counts, err);
    }
    t->w_unit = -1;
    return rc;
}

/* The output vocabulary-parallel over dp_shard, where every rank's tokens are
 * fewer than the vocabulary's rows (t->head_vp, tp = 1): a rank's FSDP shard of
 * the output is a block of vocabulary rows, so instead of gathering the (V, C)
 * table in rounds, h (N, C) of every rank's tokens is gathered and each rank
 * computes the logits of all of them in its own columns: the softmax from every
 * rank's row statistics, the loss of each row where its target is. Backward:
 * d(logits) of my columns give my shard's gradient with no reduction, and my
 * part of every rank's d(h), reduce-scattered. */
int tsr_fsdp_vp_fwd(tsr_trainer *t, act_set *s, const int *tgt, tsr_error *err) {
    uint64_t S = t->layout.dp_shard, me = t->co.dp_shard, C = (uint64_t)t->args.dim, SN = S * t->N;
    uint64_t v0 = t->hrow0[me], Vm = t->hrow0[me + 1] - v0;
    const float *w = t->par[t->decls.n_params - 1].w;
    int rc = tsr_plane_allgather(&t->plane, t->shard, TSR_F32, s->hf, t->h_all, t->N * C, err);
    if (!rc) rc = gather_tokens(t, tgt, &s->ids_tgt, err);
    if (!rc) rc = tsr_kc_from_host(&t->kc, s->ids_tgt_dev, s->ids_tgt, SN * sizeof *s->ids_tgt, err);
    if (rc) return rc;
    tsr_kc_matmul_fwd(&t->kc, s->probs, t->h_all, w, (int)SN, (int)C, (int)Vm);
    float *mine = t->xstats + me * 2 * SN;
    tsr_kc_xent_part_stats(&t->kc, mine, s->probs, (int)SN, (int)Vm);
    if (!(rc = tsr_plane_allgather(&t->plane, t->shard, TSR_F32, mine, t->xstats, 2 * SN, err))) {
        tsr_kc_xent_part_fwd(&t->kc, s->losses, s->probs, s->probs, s->ids_tgt_dev, (int)SN, (int)Vm, (int)v0, t->xstats, (int)S);
        tsr_kc_sum_add(&t->kc, &t->sums[0], s->losses, SN);
    }
    return rc;
}

int tsr_fsdp_vp_bwd(tsr_trainer *t, const act_set *s, float *dh, tsr_error *err) {
    uint64_t S = t->layout.dp_shard, me = t->co.dp_shard, C = (uint64_t)t->args.dim, SN = S * t->N;
    uint64_t v0 = t->hrow0[me], Vm = t->hrow0[me + 1] - v0;
    param *q = &t->par[t->decls.n_params - 1];
    /* h_all is scratch shared by the micro-batches in flight: gathered again */
    int rc = tsr_plane_allgather(&t->plane, t->shard, TSR_F32, s->hf, t->h_all, t->N * C, err);
    if (rc) return rc;
    tsr_kc_fill(&t->kc, t->dloss, SN, (float)t->inv_count);
    tsr_kc_fill(&t->kc, t->dlogits, SN * Vm, 0);
    tsr_kc_xent_part_bwd(&t->kc, t->dlogits, s->probs, s->ids_tgt_dev, t->dloss, (int)SN, (int)Vm, (int)v0, t->args.vocab_size);
    tsr_kc_fill(&t->kc, t->dh_all, SN * C, 0);
    tsr_kc_matmul_bwd(&t->kc, t->dh_all, q->g, t->dlogits, t->h_all, q->w, (int)SN, (int)C, (int)Vm);
    return tsr_plane_reduce_scatter(&t->plane, t->shard, TSR_F32, t->dh_all, dh, t->N * C, err);
}

/* The final norm's weight with FSDP (C floats) gathered into wunit, or its
 * gradient (in gunit) reduced. */
int tsr_fsdp_norm_gather(tsr_trainer *t, tsr_error *err) {
    const param *q = &t->par[t->decls.n_params - 2];
    if (t->layout.dp_shard == 1) return 0;
    t->w_unit = -1; /* the norm's weight lies where a layer unit's first parameter does */
    return tsr_plane_allgatherv(&t->plane, t->shard, TSR_F32, q->w, q->wf, q->counts, err);
}

int tsr_fsdp_norm_reduce(tsr_trainer *t, tsr_error *err) {
    param *q = &t->par[t->decls.n_params - 2];
    if (t->layout.dp_shard == 1) return 0;
    int rc = tsr_plane_reduce_scatterv(&t->plane, t->shard, TSR_F32, q->gf, t->rs, q->counts, err);
    if (!rc) tsr_kc_add(&t->kc, q->g, q->g, t->rs, q->shard_n);
    return rc;
}
