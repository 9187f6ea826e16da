/* mesh.c: the trainer's mesh [pp][dp_replicate][dp_shard][tp]: this rank's
 * coordinates, its pipeline stage's layers and neighbours (by the layout
 * algebra's stage rule, tsr_layout_stage_of_layer), the data-parallel index, and
 * the tp, dp_shard and dp_replicate groups. */
#include "trainer_impl.h"

#include "common.h"

/* The layers [*l0, *l1) of pipeline stage `stage`: those the layout algebra
 * puts there (stages hold contiguous ranges, in order; an empty one has
 * l0 = l1). */
static void stage_layers(const tsr_layout *l, uint32_t stage, int *l0, int *l1) {
    *l0 = *l1 = 0;
    for (uint32_t layer = 0; layer < l->n_layers; layer++) {
        uint32_t s = tsr_layout_stage_of_layer(l, layer);
        if (s < stage) *l0 = (int)layer + 1;
        if (s <= stage) *l1 = (int)layer + 1;
    }
}

int tsr_mesh_coords(tsr_trainer *t, tsr_error *err) {
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
    stage_layers(l, t->co.pp, &t->l0, &t->l1);
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

int tsr_mesh_comms(tsr_trainer *t, tsr_error *err) {
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

void tsr_mesh_comms_free(tsr_trainer *t) {
    if (t->tp) tsr_comm_free(t->tp);
    if (t->shard) tsr_comm_free(t->shard);
    if (t->rep) tsr_comm_free(t->rep);
}

int tsr_mesh_on_stage(const tsr_trainer *t, const tsr_placement *pl) {
    return pl->pp_role == TSR_PP_FIRST   ? t->first
           : pl->pp_role == TSR_PP_LAST  ? t->last
           : pl->pp_role == TSR_PP_LAYER ? (pl->layer >= t->l0 && pl->layer < t->l1)
                                         : 1;
}
