/* tsr_reshard.h: the public part of reshard/: the layout algebra (which boxes a
 * rank holds), the overlap planner and save plans. Conventions: tessera.h. */
#ifndef TSR_RESHARD_H
#define TSR_RESHARD_H

#include <stddef.h>
#include <stdint.h>
#include "tsr_formats.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ layouts */

/* tsr_layout_parse(): "pp=2,dp_replicate=1,dp_shard=4,tp=2" (any order, omitted
 * degrees are 1, empty text is all ones; "flat" or "flat=1" sets
 * TSR_LAYOUT_FLAT, "flat=0" clears it; "layers=N" sets n_layers, else it keeps
 * the value *out had). Bad text is TSR_EINVAL with a message naming the part, and
 * so is a layout past the format's limits (over TSR_MAX_RANKS ranks, n_layers over
 * TSR_MAX_LAYERS). */
int tsr_layout_parse(const char *text, tsr_layout *out, tsr_error *err);
/* tsr_layout_format(): the canonical text of a layout into buf (all four degrees;
 * layers=N when n_layers > 0; flat when set). */
void tsr_layout_format(const tsr_layout *l, char *buf, size_t len);
/* tsr_layout_size(): the number of ranks, pp * dp_replicate * dp_shard * tp; 0 for
 * a layout with a degree 0 or over TSR_MAX_RANKS ranks. */
uint32_t tsr_layout_size(const tsr_layout *l);

/* A rank's coordinates on the mesh [pp][dp_replicate][dp_shard][tp] (tp fastest). */
typedef struct tsr_coord {
    uint32_t pp, dp_replicate, dp_shard, tp;
} tsr_coord;
tsr_coord tsr_layout_coord(const tsr_layout *l, uint32_t rank);
uint32_t tsr_layout_rank(const tsr_layout *l, tsr_coord c);

/* A global tensor as a layout sees it. */
typedef struct tsr_tensor_decl {
    const char *name;
    const char *group; /* "model", "optim", ... (flat sharding is per group) */
    int dtype;
    uint32_t ndim;
    uint64_t shape[TSR_MAX_DIMS];
    tsr_placement placement;
} tsr_tensor_decl;

/* One box a rank holds: of tensor `tensor` (an index into the caller's list). */
typedef struct tsr_rank_box {
    uint32_t tensor;
    tsr_box box;
} tsr_rank_box;

/* tsr_layout_boxes(): the boxes that rank `rank` holds of each of the n tensors
 * under layout l (FORMAT.md, section 10, "Layouts"):
 *  - PP: layer L lives on stage L / ceil(n_layers / pp); TSR_PP_FIRST tensors on
 *    stage 0, TSR_PP_LAST on stage pp-1, TSR_PP_ALL on every stage. A rank of
 *    another stage holds nothing of the tensor.
 *  - TP: dim tp_dim is cut into tp pieces by ceil division (torch.chunk: piece t
 *    is [t*c, min((t+1)*c, n)) with c = ceil(n/tp); trailing pieces may be empty);
 *    tp_dim -1 replicates over tp.
 *  - FSDP (fsdp = 1, not flat): dim 0 of the TP-local piece is cut the same way
 *    into dp_shard pieces; fsdp = 0 replicates over dp_shard.
 *  - dp_replicate: copies.
 *  - Flat (TSR_LAYOUT_FLAT): for each group and replication class (the
 *    tensors replicated over pp and tp; over pp only; over tp only; over
 *    neither), on each (pp stage, tp rank), the TP-local pieces of those tensors
 *    held by that stage, in name order, are flattened and concatenated into one
 *    buffer of F elements, which is cut into dp_shard ranges by ceil division; a
 *    rank's range becomes, per tensor, at most 2*ndim-1 boxes. The fsdp flag is
 *    ignored. (Per class, so that replicas are cut identically.)
 * Boxes of volume 0 are left out. On success *out (malloc'ed; free() it) holds
 * *n_out boxes, in tensor order, and for one tensor in row-major order. */
int tsr_layout_boxes(const tsr_layout *l, const tsr_tensor_decl *tensors, size_t n, uint32_t rank,
                     tsr_rank_box **out, size_t *n_out, tsr_error *err);
/* tsr_layout_max_holders(): at most how many ranks of l hold an element of the n
 * tensors, from the degrees and shapes alone, without visiting the ranks (a
 * layout may have 2^31): the stages that hold a tensor x dp_replicate x the tp
 * ranks x the dp_shard ranks that the cuts above can give a non-empty piece (a
 * ceil division leaves only trailing pieces empty, and no more non-empty ones than
 * it cuts elements). tsr_layout_boxes of every rank gives the exact count. The
 * world size when a tensor does not fit the layout (tsr_layout_boxes says why). */
uint64_t tsr_layout_max_holders(const tsr_layout *l, const tsr_tensor_decl *tensors, size_t n);
/* tsr_layout_cut(): piece i of n elements cut into k by the rule above (ceil
 * division): its first element *off and its length *ext (0 past the end). */
void tsr_layout_cut(uint64_t n, uint32_t k, uint32_t i, uint64_t *off, uint64_t *ext);

/* tsr_layout_stage_of_layer(): the pipeline stage that holds layer `layer`
 * under l by the PP rule above: layer / ceil(n_layers / pp); 0 when pp is 1 or
 * n_layers 0. */
uint32_t tsr_layout_stage_of_layer(const tsr_layout *l, uint32_t layer);

/* tsr_range_boxes(): the boxes (at most 2*ndim-1, row-major order) that cover the
 * row-major element range [begin, end) of `box`. @return their count. */
size_t tsr_range_boxes(const tsr_box *box, uint64_t begin, uint64_t end, tsr_box *out);

/* ------------------------------------------------------------------ planning */

/* One overlap found by the planner: needed box `need` and stored box `have`
 * intersect in `region`. */
typedef struct tsr_overlap {
    uint32_t need, have;
    tsr_box region;
} tsr_overlap;

/* tsr_plan_overlaps(): every nonempty intersection between needed boxes
 * need[0..n_need) and stored boxes have[0..n_have) of one tensor (all of the same
 * ndim), by sort and sweep: O((n+m) log(n+m)) plus the overlaps found, not
 * O(n*m). *out (malloc'ed) receives *n_out overlaps sorted by (need, have).
 * Stored boxes must not overlap each other; needed boxes may. */
int tsr_plan_overlaps(const tsr_box *need, size_t n_need, const tsr_box *have, size_t n_have,
                      tsr_overlap **out, size_t *n_out, tsr_error *err);

/* A save plan: which rank writes which box, so that a box held by several ranks
 * (replicas) is written exactly once and the writers are balanced by bytes. */
typedef struct tsr_save_plan {
    size_t n;            /* entries */
    tsr_rank_box *boxes; /* every distinct (tensor, box), sorted by (tensor, offset) */
    uint32_t *writer;    /* the rank that writes boxes[i] */
    uint64_t *bytes_per_rank; /* bytes assigned to each rank */
    uint32_t n_ranks;
} tsr_save_plan;

/* tsr_save_plan_build(): from what every rank holds (held[r], n_held[r] for
 * r < n_ranks; boxes of one tensor held by several ranks must be equal or
 * disjoint), assigns each distinct box to one of the ranks holding it: largest
 * boxes first, each to the candidate with the fewest bytes so far (ties: lowest
 * rank). Deterministic: every rank computing it gets the same plan. `elem_size`
 * gives bytes per element of each tensor. */
int tsr_save_plan_build(const tsr_rank_box *const *held, const size_t *n_held, uint32_t n_ranks,
                        const size_t *elem_size, tsr_save_plan *plan, tsr_error *err);
void tsr_save_plan_free(tsr_save_plan *plan);

#ifdef __cplusplus
}
#endif
#endif
