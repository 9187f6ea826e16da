/* trainer_impl.h: the trainer's state, shared by trainer.c (the model on the
 * mesh), mesh.c (the mesh), pipeline.c (the schedules), fsdp.c (FSDP's units)
 * and the job (train_loop.c, checkpoint.c). Not a public interface. */
#ifndef TSR_TRAINER_IMPL_H
#define TSR_TRAINER_IMPL_H

#include "kctx.h"
#include "plane.h"
#include "trainer.h"

/* One parameter as this rank holds it, as the layout algebra places it
 * (tsr_layout_boxes): FSDP cuts the TP-local piece over dp_shard, and rank s of
 * the group holds counts[s] of its elements. */
typedef struct param {
    int on_stage;       /* this pipeline stage uses it */
    int norm_counts;    /* its gradient counts in the global norm on this rank */
    uint64_t full_n, shard_n; /* elements of the TP-local piece, and of the shard */
    size_t *counts;     /* elements per dp_shard rank */
    tsr_box box;        /* the rank's shard in global indices (volume shard_n) */
    float *w, *g, *m, *v; /* shard: weights, gradient, AdamW moments */
    float *wf, *gf;       /* TP-local piece: gathered weights, unreduced gradient (== w, g without FSDP;
                             with it, in the unit buffers: valid while its unit is gathered) */
} param;

/* An FSDP unit: parameters gathered and reduced together, [p0, p1): the
 * embedding, each layer, the final norm with the output. With dp_shard > 1 one
 * unit at a time is gathered (its weights into wunit, its gradients into gunit),
 * so that a rank holds its shards plus about two layers, not the stage. */
typedef struct fsdp_unit {
    size_t p0, p1;
    int on_stage;
    uint64_t full_n, shard_n; /* floats of the unit's TP-local pieces, and of this rank's shards */
    size_t *counts;           /* the unit's floats per dp_shard rank */
} fsdp_unit;

/* Activations of one layer for one micro-batch (N tokens): what backward needs. */
typedef struct layer_act {
    float *h1, *rstd1;  /* attention norm: output (N,C), 1/rms (N) */
    float *q, *k, *v;   /* (N,Dq), (N,Dkv), (N,Dkv), q and k after RoPE */
    float *att;         /* (mbs,NHt,T,T) softmax */
    float *a;           /* attention output (N,Dq) */
    float *x2;          /* residual after attention (N,C) */
    float *h2, *rstd2;  /* ffn norm */
    float *g, *u, *s;   /* w1, w3 outputs and SwiGLU (N,Ft) */
} layer_act;

typedef struct act_set {
    float *xs;          /* (L+1, N, C): the input of each local layer and the stage's output */
    layer_act *layers;
    float *hf, *rstdf, *probs, *losses; /* last stage: final norm, softmax (N,V), losses (N) */
    /* with FSDP: every dp_shard rank's token ids (dp_shard N, malloc'd), gathered
     * by the forward of the embedding (inputs) and of the vocabulary-parallel
     * output (targets), read again by their backward */
    int *ids_in, *ids_tgt;
    int *ids_tgt_dev;   /* ids_tgt in the trainer's memory, for the kernels */
} act_set;

struct tsr_trainer {
    tsr_train_config cfg;
    tsr_model_args args;
    tsr_model_decls decls;
    /* mesh (mesh.c) */
    tsr_comm *world, *tp, *shard, *rep;
    tsr_layout layout;
    tsr_coord co;
    uint32_t rank, prev, next, dp, dp_rank;
    int l0, l1;         /* this stage's layers [l0, l1) */
    int first, last;    /* first / last pipeline stage */
    /* where parameters, gradients, optimizer state and activations live, and
     * the one door to them: every kernel and copy goes through kc, every
     * collective through plane; host code never touches them (kctx.h) */
    tsr_kctx kc;
    tsr_plane plane;
    /* parameters */
    param *par;
    struct {
        uint32_t pp;    /* the stage of the cached counts */
        size_t **by_tp; /* per tp rank: elements of each parameter per dp_shard rank, or NULL */
    } group;
    float *arena;
    size_t n_shard_elems, n_full_elems; /* floats of the shards, and of FSDP's unit buffers */
    fsdp_unit *units;   /* n_layers + 2 of them */
    int n_units;
    uint64_t unit_max, unit_shard_max; /* the largest unit on the stage: TP-local, and my shards */
    float *wunit, *gunit, *rs;         /* a unit's gathered weights, unreduced gradients; my reduced shards */
    int w_unit;         /* the unit whose weights wunit holds, or -1 */
    /* the output (Vt rows) goes through wunit in rounds of chunk_rows rows of
     * every rank's shard, so that it needs no more than a layer does; the
     * embedding moves only the rows of the tokens (fsdp.c) */
    uint64_t chunk_rows, *vrow0;        /* rows per round; first embedding row of each dp_shard rank (S+1) */
    uint64_t hrounds, *hrow0;           /* the output's rounds, and first rows (Vt) */
    float *logit_tmp;   /* (N, chunk_rows): a block of logits or of their gradients */
    int *tok_map;       /* (dp_shard N): every rank's tokens' rows in my embedding shard, or -1 (host) */
    int *tok_map_dev;   /* the same in the trainer's memory, for the kernels */
    /* the output vocabulary-parallel over dp_shard (fsdp.c): whether, the most
     * rows a rank's shard has, h and d(h) of every rank's tokens (dp_shard N, C) */
    int head_vp;
    uint64_t head_rows;
    float *h_all, *dh_all;
    /* shapes of a step */
    int T, B, mbs, M;   /* seq len, samples per dp rank, micro-batch size and count */
    size_t N;           /* tokens per micro-batch */
    int NHt, NKVt;      /* heads on this tp rank */
    size_t Dq, Dkv, Ft; /* their widths, and the ffn width on this tp rank */
    size_t Vt, v0;      /* the output's vocabulary rows on this tp rank: [v0, v0 + Vt) */
    /* activations and scratch: one arena carved by the table in trainer.c */
    float *act_arena;
    size_t act_floats;
    act_set *sets;
    int n_sets;
    float *xstats, *dres, *dh, *dq, *da, *dk, *dv, *ds, *dg, *du, *att_scratch, *dlogits, *dloss, *dsend;
    float *rope_cos, *rope_sin;
    int *tokens;        /* inputs (B,T) then targets (B,T), in the trainer's memory */
    int *tokens_host;   /* the same on the host (FSDP gathers them there) */
    double *sums;       /* in the trainer's memory: the step's loss sum, gradient sum of squares and stop votes */
    uint64_t *norm_ranges; /* in the trainer's memory: (offset, length) in the gradient block of every
                              parameter the gradient norm counts here, one tsr_kc_sumsq_ranges */
    int n_norm_ranges;
    size_t norm_total;
    tsr_comm_reqs *reqs;
    double inv_count;
    float last_lr;
    /* the steps before which AdamW's count and the learning rate schedule began:
     * step t is the optimizer's (t - opt_origin)th and the schedule's
     * (t - lr_origin)th (0 but after a load that left them out:
     * checkpoint.exclude_from_loading; kept in train.lr_scheduler) */
    int opt_origin, lr_origin;
    float *keep_logits;
    void (*before_update)(void *ctx); /* tsr_trainer_before_update */
    void *before_update_ctx;
    int (*stop_poll)(void); /* 1: this rank asks the job to stop after the step (asked at its first and
                               last all-reduce; NULL: never) */
    int stop_agreed;        /* after a step: some rank asked (the same on every rank) */
};

/* mesh.c: the mesh. tsr_mesh_coords(): this rank's place on it from the config
 * alone (no communication): t->layout, co, the stage's layers [l0, l1) (the
 * layout algebra's stage rule, tsr_layout_stage_of_layer), first, last, prev,
 * next, dp, dp_rank. tsr_mesh_comms(): the groups of its tp, dp_shard and
 * dp_replicate neighbours (t->tp, shard, rep); tsr_mesh_comms_free() frees
 * them. tsr_mesh_on_stage(): whether this rank's stage holds a tensor so
 * placed. */
int tsr_mesh_coords(tsr_trainer *t, tsr_error *err);
int tsr_mesh_comms(tsr_trainer *t, tsr_error *err);
void tsr_mesh_comms_free(tsr_trainer *t);
int tsr_mesh_on_stage(const tsr_trainer *t, const tsr_placement *pl);

/* A micro-batch's pass through this stage (trainer.c's forward and backward):
 * micro-batch j (samples j*mbs ..) of the step's tokens, forward (its
 * activations kept in t->sets[j % n_sets]) or backward (its gradients
 * accumulated). */
typedef int (*tsr_mb_pass)(tsr_trainer *t, int j, tsr_error *err);

/* pipeline.c: tsr_pipeline_run(): the step's micro-batches through the stage on
 * the config's schedule (GPipe or 1F1B; with one stage each forward then its
 * backward), by the passes it is given, the sends completed. Between stages, micro-batch j's (N, C)
 * floats: its activations from the previous stage and to the next, their
 * gradients from the next and to the previous (copied into t->dsend first).
 * Sends are nonblocking, receives blocking. */
int tsr_pipeline_run(tsr_trainer *t, tsr_mb_pass fwd, tsr_mb_pass bwd, tsr_error *err);
int tsr_pipeline_recv_fwd(tsr_trainer *t, int j, float *x, tsr_error *err);
int tsr_pipeline_send_fwd(tsr_trainer *t, int j, const float *x, tsr_error *err);
int tsr_pipeline_recv_bwd(tsr_trainer *t, int j, float *dx, tsr_error *err);
int tsr_pipeline_send_bwd(tsr_trainer *t, int j, const float *dx, tsr_error *err);

/* fsdp.c: FSDP by units (dp_shard > 1; with dp_shard = 1 the gathers and
 * reductions are no-ops). Unit u: 0 the embedding, 1 + l layer l, the last the
 * final norm with the output. */
static inline int tsr_fsdp_layer_unit(int layer) { return 1 + layer; }
/* tsr_fsdp_units_init(): after the parameters' counts: the units, the rows of
 * the embedding's and the output's shards, the output's rounds,
 * t->n_full_elems. */
int tsr_fsdp_units_init(tsr_trainer *t, tsr_error *err);
void tsr_fsdp_units_free(tsr_trainer *t);
/* A layer unit: its weights gathered (nothing when they are there); its
 * gradient buffers zeroed before its backward; reduced into the shards after. */
int tsr_fsdp_gather(tsr_trainer *t, int u, tsr_error *err);
void tsr_fsdp_grads_zero(tsr_trainer *t, int u);
int tsr_fsdp_grads_reduce(tsr_trainer *t, int u, tsr_error *err);
/* The embedding (by its tokens' rows) and the output (in rounds): forward, and
 * backward with the gradients added to the shards (dh accumulates). */
int tsr_fsdp_embed_fwd(tsr_trainer *t, act_set *s, float *out, const int *tok, tsr_error *err);
int tsr_fsdp_embed_bwd(tsr_trainer *t, const act_set *s, const float *dout, tsr_error *err);
int tsr_fsdp_head_fwd(tsr_trainer *t, float *logits, const float *h, tsr_error *err);
int tsr_fsdp_head_bwd(tsr_trainer *t, float *dh, const float *dlogits, const float *h, tsr_error *err);
/* The output vocabulary-parallel over dp_shard (t->head_vp): forward, from
 * s->hf (N,C) of this rank's tokens and their targets: s->probs (dp_shard N
 * rows, my shard's columns) and the losses of the rows whose targets my shard
 * holds (into s->losses, dp_shard N, and t->sums[0]); backward: dh (N,C) =
 * d(h) of my tokens (written), my shard's gradient added. */
int tsr_fsdp_vp_fwd(tsr_trainer *t, act_set *s, const int *tgt, tsr_error *err);
int tsr_fsdp_vp_bwd(tsr_trainer *t, const act_set *s, float *dh, tsr_error *err);
/* The final norm's weight gathered; its gradient reduced. */
int tsr_fsdp_norm_gather(tsr_trainer *t, tsr_error *err);
int tsr_fsdp_norm_reduce(tsr_trainer *t, tsr_error *err);

#endif
