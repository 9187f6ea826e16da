/*
 * tessera.h: the public interface of libtessera.
 *
 * libtessera writes and reads tessera checkpoints (format v1, specified in
 * formats/FORMAT.md): global tensors stored as boxes ("chunks") cut into
 * independently encoded, checksummed frames, plus named blobs, committed
 * atomically by a MANIFEST written last.
 *
 * Conventions, for every function below:
 *  - Functions that can fail return an int: 0 (TSR_OK) on success, or a
 *    negative tsr_status. When the caller passes a non-NULL `tsr_error *err`,
 *    err->code receives the same status and err->msg a one-line message that
 *    names the file, tensor, frame or request and the reason, e.g.
 *    "ck/step-00000010/data-00003.tsd: frame 17 of layers.4.wq: checksum mismatch".
 *  - Functions returning a pointer return NULL on failure and fill *err.
 *  - The library never exits the process and never prints; diagnostics go to the
 *    logging hook (tsr_set_log) only.
 *  - Nothing read from a file is trusted: every count, offset, size and shape is
 *    checked before use, and a file that breaks a rule of FORMAT.md is refused
 *    with TSR_ECORRUPT.
 *  - Objects are not thread-safe unless stated; distinct objects may be used from
 *    distinct threads.
 */
#ifndef TESSERA_H
#define TESSERA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TSR_VERSION_MAJOR 0
#define TSR_VERSION_MINOR 1
#define TSR_VERSION_PATCH 0
#define TSR_VERSION_STRING "0.1.0"

/* Format limits (FORMAT.md, "Limits"). */
#define TSR_MAX_DIMS 8          /* dimensions of a tensor */
#define TSR_MAX_NAME 255        /* bytes in a tensor, group or blob name */
#define TSR_ALIGN 4096          /* frames start at multiples of this file offset */
#define TSR_MAX_FRAME_RAW (256u << 20) /* raw bytes in one frame */
#define TSR_MAX_RANKS (1u << 31)  /* ranks of a layout (the product of its degrees): a rank is an i32 */
#define TSR_MAX_LAYERS (1u << 31) /* n_layers of a layout: a placement's layer is an i32 */

/* ------------------------------------------------------------------ errors */

typedef enum tsr_status {
    TSR_OK = 0,
    TSR_EINVAL = -1,    /* a bad argument from the caller */
    TSR_EIO = -2,       /* the storage failed: open, read, write, fsync, rename */
    TSR_ECORRUPT = -3,  /* a file breaks a rule of FORMAT.md or fails a checksum */
    TSR_ENOMEM = -4,    /* an allocation failed */
    TSR_ENOTFOUND = -5, /* no such tensor, blob, file or checkpoint */
    TSR_EVERSION = -6,  /* written by an incompatible (newer major) format version */
    TSR_ENOSPC = -7,    /* the storage is full */
    TSR_EBUSY = -8,     /* the operation conflicts with one in progress */
} tsr_status;

#define TSR_ERROR_MSG 1024
typedef struct tsr_error {
    int code;                /* a tsr_status */
    char msg[TSR_ERROR_MSG]; /* NUL-terminated, one line */
} tsr_error;

/* tsr_status_name(): a short name for a status ("EIO", "ECORRUPT", ...). */
const char *tsr_status_name(int status);

/* Logging hook. `level` is 0 (error), 1 (warning), 2 (info), 3 (debug).
 * With no hook set (the default), the library logs nothing. Thread-safe. */
typedef void (*tsr_log_fn)(void *user, int level, const char *msg);
void tsr_set_log(tsr_log_fn fn, void *user);

/* ------------------------------------------------------------------ dtypes */

/* Element types. The numeric codes are part of the format (FORMAT.md). */
typedef enum tsr_dtype {
    TSR_F32 = 1,
    TSR_F16 = 2,
    TSR_BF16 = 3,
    TSR_F64 = 4,
    TSR_F8E4M3 = 5,
    TSR_F8E5M2 = 6,
    TSR_I8 = 7,
    TSR_I16 = 8,
    TSR_I32 = 9,
    TSR_I64 = 10,
    TSR_U8 = 11,
    TSR_U16 = 12,
    TSR_U32 = 13,
    TSR_U64 = 14,
    TSR_BOOL = 15,
} tsr_dtype;

/* tsr_dtype_size(): bytes per element, or 0 for an unknown code. */
size_t tsr_dtype_size(int dtype);
/* tsr_dtype_name(): "f32", "bf16", ...; "?" for an unknown code. */
const char *tsr_dtype_name(int dtype);
/* tsr_dtype_parse(): the code for a name as printed by tsr_dtype_name(), or 0. */
int tsr_dtype_parse(const char *name);
/* tsr_dtype_is_float(): 1 for the floating-point dtypes, else 0. */
int tsr_dtype_is_float(int dtype);

/* ------------------------------------------------------------------- boxes */

/* A box of a global tensor: offset[d] and extent[d] in global element indices,
 * for d < ndim. Memory holding a box is that box, row-major and contiguous.
 * A 0-d box (ndim 0) holds one element. */
typedef struct tsr_box {
    uint32_t ndim;
    uint64_t offset[TSR_MAX_DIMS];
    uint64_t extent[TSR_MAX_DIMS];
} tsr_box;

/* tsr_box_volume(): elements in the box (product of extents; 1 for ndim 0). */
uint64_t tsr_box_volume(const tsr_box *b);

/* tsr_box_intersect(): sets *out to the intersection of a and b (same ndim).
 * @return 1 if the intersection holds at least one element, 0 otherwise. */
int tsr_box_intersect(const tsr_box *a, const tsr_box *b, tsr_box *out);

/* tsr_box_contains(): 1 if `inner` lies entirely inside `outer`, else 0. */
int tsr_box_contains(const tsr_box *outer, const tsr_box *inner);

/* tsr_box_copy(): the one strided copy of tessera. Copies the elements of
 * `region` from `src` (memory of box src_box) into `dst` (memory of box
 * dst_box). `region` must lie inside both boxes (checked by assertion in debug
 * builds). Contiguous runs are copied with memcpy; a region that is contiguous
 * in both buffers is one memcpy. */
void tsr_box_copy(void *dst, const tsr_box *dst_box, const void *src,
                  const tsr_box *src_box, const tsr_box *region, size_t elem_size);

/* tsr_box_pieces(): the number of pieces tsr_box_piece cuts `box` into: pieces
 * are row-major-contiguous sub-boxes of at most max_bytes (at least one element
 * each), cut the way a chunk is cut into frames (FORMAT.md section 3).
 * tsr_box_piece(): piece k of them, in order. Use them to walk a large box in
 * bounded memory. */
uint64_t tsr_box_pieces(const tsr_box *box, size_t elem_size, size_t max_bytes);
void tsr_box_piece(const tsr_box *box, size_t elem_size, size_t max_bytes, uint64_t k,
                   tsr_box *out);

/* --------------------------------------------------------------- placement */

/* How a tensor is laid out over the rank mesh [pp][dp_replicate][dp_shard][tp]
 * (DESIGN.md). Recorded with every tensor so that tools can compute any target
 * layout from mesh degrees alone. */
enum { TSR_PP_ALL = 0, TSR_PP_FIRST = 1, TSR_PP_LAST = 2, TSR_PP_LAYER = 3 };
typedef struct tsr_placement {
    int8_t tp_dim;   /* the dim split over tp ranks, or -1: replicated over tp */
    uint8_t fsdp;    /* 1: dim 0 of the TP-local piece split over dp_shard */
    uint8_t pp_role; /* TSR_PP_*: which pipeline stages hold the tensor */
    int32_t layer;   /* with TSR_PP_LAYER: the layer index; else -1 */
} tsr_placement;

/* The layout a checkpoint was saved with. */
#define TSR_LAYOUT_FLAT 1u /* flat (ZeRO-style) sharding of each group */
typedef struct tsr_layout {
    uint32_t pp, dp_replicate, dp_shard, tp; /* mesh degrees, each >= 1 */
    uint32_t n_layers;                       /* layers split over pp stages */
    uint32_t flags;                          /* TSR_LAYOUT_* */
} tsr_layout;

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
 * under layout l (DESIGN.md, "Global tensors, boxes and layouts"):
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

/* ------------------------------------------------------------ communication */

/* A group of ranks and its control plane: bytes for the engine and the command
 * (the group, broadcast, gathers with a deadline, barriers, point to point),
 * over MPI (comm/control_mpi.c). Blocking; every rank of the group calls a
 * collective in the same order. A tsr_comm may be used from one thread at a
 * time; the engine duplicates the caller's for its own thread. The trainer's
 * typed collectives on host or device memory are the data plane, comm/data_plane.h. */
typedef struct tsr_comm tsr_comm;

/* tsr_comm_self(): a group of one rank (no MPI needed). */
tsr_comm *tsr_comm_self(void);
/* tsr_comm_mpi_world(): MPI_COMM_WORLD, initializing MPI (with
 * MPI_THREAD_MULTIPLE) if it is not yet; tsr_comm_free finalizes what it
 * initialized. */
tsr_comm *tsr_comm_mpi_world(tsr_error *err);
/* tsr_comm_dup(): a new communicator over the same ranks (collective). */
tsr_comm *tsr_comm_dup(tsr_comm *c, tsr_error *err);
void tsr_comm_free(tsr_comm *c);
uint32_t tsr_comm_rank(const tsr_comm *c);
uint32_t tsr_comm_size(const tsr_comm *c);

/* tsr_comm_split(): collective; the ranks passing the same color >= 0 form a new
 * communicator (ordered by key, then rank); color -1 gets NULL and no error. */
tsr_comm *tsr_comm_split(tsr_comm *c, int color, int key, tsr_error *err);

int tsr_comm_barrier(tsr_comm *c, tsr_error *err);
/* tsr_comm_barrier_idle(): a barrier that sleeps (1 ms polls) instead of
 * spinning, for ranks that wait a long time and should leave the cores to
 * those that work. */
int tsr_comm_barrier_idle(tsr_comm *c, tsr_error *err);
/* tsr_comm_bcast(): root's n bytes at buf to every rank. */
int tsr_comm_bcast(tsr_comm *c, uint32_t root, void *buf, size_t n, tsr_error *err);
/* tsr_comm_allreduce_min(): the minimum of every rank's *v, into *v everywhere. */
int tsr_comm_allreduce_min(tsr_comm *c, int64_t *v, tsr_error *err);
/* tsr_comm_allgatherv(): every rank's n bytes, concatenated in rank order into
 * *all (malloc'ed) on every rank; counts[r] (malloc'ed, size ranks) is rank r's
 * byte count. */
int tsr_comm_allgatherv(tsr_comm *c, const void *buf, size_t n, uint8_t **all, size_t **counts,
                        tsr_error *err);
/* tsr_comm_gatherv(): like allgatherv, but only `root` receives (*all and
 * *counts are NULL elsewhere). */
int tsr_comm_gatherv(tsr_comm *c, uint32_t root, const void *buf, size_t n, uint8_t **all,
                     size_t **counts, tsr_error *err);
/* Exchanges with a deadline, for work that must not hang on a rank that never
 * arrives (the engine's commit): point to point under `tag`, polled with short
 * sleeps instead of blocking. Only receivers wait: a sender returns at once and
 * the comm keeps its copy of the message until it is taken. timeout_s <= 0 waits
 * forever. Each rank's n must be below 2 GiB. A message that comes after its
 * receiver gave up is never received: a group that timed out should not run
 * such an exchange again (the engine stops saving). A timeout is TSR_EIO with a
 * message naming the ranks, e.g. "ranks 3, 5 did not report within 2.0 s".
 * tsr_comm_gatherv_deadline(): as tsr_comm_gatherv; the root waits until
 * timeout_s for the others' messages. */
int tsr_comm_gatherv_deadline(tsr_comm *c, uint32_t root, int tag, const void *buf, size_t n,
                              double timeout_s, uint8_t **all, size_t **counts, tsr_error *err);
/* tsr_comm_bcast_deadline(): root's n bytes at buf to every rank; the others
 * wait until timeout_s for them ("rank 0 did not answer within 2.0 s"). */
int tsr_comm_bcast_deadline(tsr_comm *c, uint32_t root, int tag, void *buf, size_t n, double timeout_s,
                            tsr_error *err);
/* tsr_comm_iprobe(): 1 if a message from peer with tag is waiting, else 0. Not
 * collective, never blocks. */
int tsr_comm_iprobe(tsr_comm *c, uint32_t peer, int tag);
/* Point to point: a message of n bytes with a tag (0..32767). Messages between
 * two ranks with one tag arrive in the order they were sent. */
int tsr_comm_send(tsr_comm *c, uint32_t peer, int tag, const void *buf, size_t n, tsr_error *err);
int tsr_comm_recv(tsr_comm *c, uint32_t peer, int tag, void *buf, size_t n, tsr_error *err);
/* Nonblocking point to point: requests collect in a tsr_comm_reqs, and
 * tsr_comm_waitall completes all of them (and empties the set). */
typedef struct tsr_comm_reqs tsr_comm_reqs;
tsr_comm_reqs *tsr_comm_reqs_new(void);
void tsr_comm_reqs_free(tsr_comm_reqs *r);
int tsr_comm_isend(tsr_comm *c, uint32_t peer, int tag, const void *buf, size_t n, tsr_comm_reqs *r,
                   tsr_error *err);
int tsr_comm_irecv(tsr_comm *c, uint32_t peer, int tag, void *buf, size_t n, tsr_comm_reqs *r,
                   tsr_error *err);
int tsr_comm_waitall(tsr_comm *c, tsr_comm_reqs *r, tsr_error *err);

/* ------------------------------------------------------------------ saving */

enum {
    TSR_CODEC_AUTO = -1,     /* bytegroup for f32/f16/bf16, zstd otherwise, raw
                                where encoding gains nothing (the default) */
    TSR_CODEC_RAW = 0,
    TSR_CODEC_ZSTD = 1,
    TSR_CODEC_BYTEGROUP = 2,
};

typedef struct tsr_write_opts {
    int codec;          /* TSR_CODEC_*; default TSR_CODEC_AUTO */
    int level;          /* zstd level; default 1 */
    size_t frame_bytes; /* target raw bytes per frame; default 4 MiB */
    int threads;        /* encoder threads; default: the online cores */
    uint64_t expected_bytes; /* raw bytes this writer will store, if known (0: unknown):
                                the data file is preallocated, so that writes do not
                                extend it one by one */
} tsr_write_opts;

/* tsr_write_opts_default(): the defaults above. */
tsr_write_opts tsr_write_opts_default(void);

/* A save: one writer's part of one checkpoint. In a distributed save every
 * writing rank opens a tsr_save on the same step directory with its own
 * `file_id` (its data file data-<file_id>.tsd) and the same `save_id`; each
 * rank calls tsr_save_finish() to get its table; rank 0 gathers the tables and
 * calls tsr_save_commit(). A single process does all of it with file_id 0. */
typedef struct tsr_save tsr_save;

/* tsr_save_begin(): creates `step_dir` (and its parent) if needed and the data
 * file data-<file_id>.tsd inside it. `save_id` (16 bytes) identifies this save
 * in every file it writes; NULL draws a random one (single-process use).
 * `opts` may be NULL for the defaults. */
tsr_save *tsr_save_begin(const char *step_dir, uint32_t file_id, const uint8_t *save_id,
                         const tsr_write_opts *opts, tsr_error *err);

/* tsr_save_tensor(): declares a global tensor. Every box written of it later
 * names it. `group` is a short name such as "model" or "optim" (NULL: "model");
 * `placement` may be NULL (replicated everywhere). Names: 1..255 bytes of
 * [A-Za-z0-9_.:+-], no empty dot-separated component, unique in the checkpoint. */
int tsr_save_tensor(tsr_save *s, const char *name, const char *group, int dtype,
                    uint32_t ndim, const uint64_t *shape, const tsr_placement *placement,
                    tsr_error *err);

/* tsr_save_box(): writes one box of a declared tensor: encodes it into frames on
 * the thread pool and appends them to the data file. `data` is the box's
 * memory. Returns once `data` is no longer needed. */
int tsr_save_box(tsr_save *s, const char *name, const tsr_box *box, const void *data,
                 tsr_error *err);

/* tsr_save_blob(): writes a named blob of bytes. `rank` is -1 for a global blob
 * or the rank that owns it (RNG state, ...). (name, rank) is unique. */
int tsr_save_blob(tsr_save *s, const char *name, int32_t rank, const void *data,
                  size_t size, tsr_error *err);

/* tsr_save_finish(): writes the last frames, fsyncs and closes the data file,
 * and returns this writer's table (declared tensors, chunks, frames, blobs) as
 * bytes in *table / *table_len (owned by `s`, valid until tsr_save_free). */
int tsr_save_finish(tsr_save *s, const uint8_t **table, size_t *table_len, tsr_error *err);

/* tsr_save_commit(): merges the tables of all writers (tables[i] from writer i;
 * n == 0 uses this save's own table), checks that the chunks of every tensor
 * cover it exactly once, and writes the MANIFEST atomically: temporary name,
 * fsync, rename, fsync of the directory. Before it returns 0 nothing is
 * committed. `layout` may be NULL (1,1,1,1). */
int tsr_save_commit(tsr_save *s, const uint8_t *const *tables, const size_t *table_lens,
                    size_t n, uint64_t step, const tsr_layout *layout, tsr_error *err);

/* tsr_save_abort(): removes this writer's data file (and a temporary MANIFEST
 * it may have left). Safe after any failure; the save cannot be used after. */
void tsr_save_abort(tsr_save *s);

/* tsr_save_free(): releases the save (does not remove files). NULL is a no-op. */
void tsr_save_free(tsr_save *s);

/* ------------------------------------------------------------------ engine */

/* The distributed, asynchronous checkpoint engine (DESIGN.md, "Async save
 * pipeline" and "Load and online resharding"). Every rank of a tsr_comm opens one
 * on the same ROOT; saves and loads are collective. */
typedef struct tsr_engine tsr_engine;
typedef struct tsr_ckpt tsr_ckpt; /* an open checkpoint (section "reading") */

typedef struct tsr_engine_opts {
    tsr_write_opts write; /* codec, level, frame size, threads (0: the node's cores
                             divided among the ranks mpirun placed on it) */
    uint32_t keep_latest; /* retention: keep the newest K committed checkpoints; 0 keeps all */
    int sync;             /* 1: tsr_engine_save returns after the commit */
    /* Archiving (rank 0, in the background): each committed checkpoint of a step
     * that is a multiple of archive_every is pushed to archive_url
     * (s3://bucket/prefix; NULL or "" for none), where the newest archive_keep are
     * kept (0 keeps all). Local retention leaves a checkpoint alone until it is
     * archived. A failed push is retried, then logged; it never fails a save. */
    const char *archive_url;
    uint64_t archive_every; /* 0 or 1: every checkpoint */
    uint32_t archive_keep;
    /* Seconds rank 0 waits for the other ranks' reports at the end of a save (1800
     * by default; 0 waits forever); the others wait twice as long for its
     * verdict. A rank that misses it fails the save on every rank ("rank 2 did not
     * report within 1800.0 s") instead of hanging it, and the engine then refuses
     * further saves until it is restarted (tsr_engine_broken). The environment
     * variable TSR_COMMIT_TIMEOUT (seconds) overrides it. */
    double commit_timeout_s;
    /* 1: rank 0 holds the lock of ROOT (tsr_folder_lock_take) for the engine's
     * life, and tsr_engine_new fails on every rank, naming the holder, when
     * another writer holds it. */
    int lock_root;
} tsr_engine_opts;
tsr_engine_opts tsr_engine_opts_default(void);

/* A rank's state: the global tensors (the same list, in the same order, on every
 * rank), the boxes this rank holds with their memory, and blobs. A blob with rank
 * -1 is global and taken from rank 0; any other rank value is this rank's own. */
/* Where memory lives: host memory, or a device's (staging copies from it). */
typedef enum tsr_mem_kind { TSR_MEM_HOST = 0, TSR_MEM_CUDA = 1 } tsr_mem_kind;
typedef struct tsr_state_box {
    uint32_t tensor; /* index into tensors */
    tsr_box box;
    void *data;      /* the box's memory, row-major */
    tsr_mem_kind mem; /* what data is (0: host); this build holds host memory only */
} tsr_state_box;
typedef struct tsr_state_blob {
    const char *name;
    int32_t rank;
    const void *data;
    size_t size;
} tsr_state_blob;
typedef struct tsr_state {
    const tsr_tensor_decl *tensors;
    size_t n_tensors;
    const tsr_state_box *boxes;
    size_t n_boxes;
    const tsr_state_blob *blobs;
    size_t n_blobs;
    tsr_layout layout; /* recorded in the MANIFEST */
} tsr_state;

/* tsr_engine_new(): collective. `comm` must outlive the engine; the engine works
 * on a duplicate of it from its own thread. */
tsr_engine *tsr_engine_new(const char *root, tsr_comm *comm, const tsr_engine_opts *opts,
                           tsr_error *err);
/* tsr_engine_free(): waits for a save in flight and for the archiving of the
 * committed checkpoints, then releases everything. */
void tsr_engine_free(tsr_engine *e);

/* tsr_engine_save(): collective. Waits for the previous save if one is in flight
 * (tsr_engine_last_wait tells how long), plans which rank writes which box
 * (replicas once, balanced by bytes; cached while the state's layout is
 * unchanged), copies this rank's share into a staging arena allocated once, and
 * returns: encoding, writing (io_uring), the commit of the MANIFEST by rank 0 and
 * retention go on in the background. The state's memory may change as soon as it
 * returns. A failure of the background work never touches earlier checkpoints
 * and is reported by tsr_engine_poll / tsr_engine_wait. Before it saves, rank 0
 * makes room in ROOT: retention (keep_latest) is applied to the committed steps
 * (the newest is always kept), and uncommitted step directories, left by
 * earlier failed or interrupted saves, are removed, so that a job whose saves
 * filled the disk saves again once it keeps fewer checkpoints. */
int tsr_engine_save(tsr_engine *e, uint64_t step, const tsr_state *st, tsr_error *err);
/* tsr_engine_save_dir(): the same, into the directory `dir` instead of
 * ROOT/step-<step> (retention still applies to ROOT). */
int tsr_engine_save_dir(tsr_engine *e, const char *dir, uint64_t step, const tsr_state *st,
                        tsr_error *err);
/* tsr_engine_reserve(): allocates (and populates) the staging arena for saves
 * of up to `bytes` of this rank's state now, so that the first save costs a
 * save's memcpy and no allocation. Not collective. */
int tsr_engine_reserve(tsr_engine *e, size_t bytes, tsr_error *err);
/* tsr_engine_poll(): *done = 1 when no save is in flight; then returns the status
 * of the last save (0 if it committed). Not collective. */
int tsr_engine_poll(tsr_engine *e, int *done, tsr_error *err);
/* tsr_engine_wait(): blocks until no save is in flight; the last save's status. */
int tsr_engine_wait(tsr_engine *e, tsr_error *err);
/* Seconds the last tsr_engine_save waited for the previous save, and the seconds
 * it blocked the caller in all (wait, plan, staging). */
double tsr_engine_last_wait(const tsr_engine *e);
double tsr_engine_last_stall(const tsr_engine *e);
/* tsr_engine_broken(): 1 once a commit exchange timed out on this rank or, as
 * the next save learns, on another: every later save fails, and the job should
 * stop and restart from its last committed checkpoint. */
int tsr_engine_broken(tsr_engine *e);

/* tsr_engine_continue_from(): the state was loaded from `step`, and the job goes
 * on from there: the steps after it are an abandoned future. The first save
 * after this call moves every committed step directory of ROOT after `step`
 * aside (renamed step-N.abandoned-<UTC time>, never deleted; logged), so that
 * the latest step and retention see only the new future. Not collective. */
void tsr_engine_continue_from(tsr_engine *e, uint64_t step);

/* tsr_engine_load(): collective. Loads the checkpoint in step_dir (NULL: the
 * newest committed one under ROOT) into the boxes of `st`, in whatever layout
 * they are: each distinct box is read by one of the ranks that need it (only the
 * frames that overlap it, checksums checked) and sent to the others. Tensors are
 * matched by name; a tensor missing from the checkpoint or of another dtype or
 * shape is an error naming it, found before any data is read. On success, and if
 * ck_out is not NULL, *ck_out is the open checkpoint (for its blobs and step);
 * close it with tsr_ckpt_close. TSR_ENOTFOUND when ROOT holds no checkpoint. */
int tsr_engine_load(tsr_engine *e, const char *step_dir, const tsr_state *st, tsr_ckpt **ck_out,
                    tsr_error *err);

/* Every function below that takes a directory (root or step directory) also
 * takes an object-store location, s3://bucket/prefix. */

/* tsr_list_steps(): the step directories under root, sorted by step, into *out
 * (malloc'ed; free() it) and *n. @return 0, or TSR_ENOTFOUND if root cannot be
 * read. */
typedef struct tsr_step_info {
    uint64_t step;
    int committed; /* holds a MANIFEST (not validated) */
    char name[64]; /* the directory's name */
} tsr_step_info;
int tsr_list_steps(const char *root, tsr_step_info **out, size_t *n);

/* tsr_latest_step(): the newest committed step under root (into *step and, if
 * dir is not NULL, its path). @return 0, or TSR_ENOTFOUND. */
int tsr_latest_step(const char *root, uint64_t *step, char *dir, size_t len);

/* tsr_remove_step_dir(): removes a step directory, its MANIFEST first. */
int tsr_remove_step_dir(const char *dir, tsr_error *err);

/* tsr_list_abandoned_steps(): the step directories under root that a rewind
 * moved aside (named step-N.abandoned-<time>, see tsr_engine_continue_from),
 * sorted by step, like tsr_list_steps. tsr_list_steps, tsr_latest_step and
 * retention never see them. */
int tsr_list_abandoned_steps(const char *root, tsr_step_info **out, size_t *n);

/* One writer per checkpoint folder. tsr_folder_lock_take(): with `create`, takes
 * an exclusive lock on the folder `dir` (made if missing) until
 * tsr_folder_lock_release: flock(2) on dir/LOCK, a file that names the holder
 * ("host H, pid P, started T"); the lock dies with its process. On object
 * storage (s3://) it puts the lease object dir/LOCK instead, removed on release
 * (a holder that died leaves it: remove it by hand). Without `create`, only
 * checks that nobody holds it (*out stays NULL). @return 0, or TSR_EBUSY with a
 * message that names the holder. */
typedef struct tsr_folder_lock tsr_folder_lock;
int tsr_folder_lock_take(const char *dir, int create, tsr_folder_lock **out, tsr_error *err);
/* tsr_folder_lock_for_ckpt(): the lock for writing the checkpoint directory
 * ckpt_dir: its parent folder's lock, taken when ckpt_dir is named step-N,
 * else only checked. */
int tsr_folder_lock_for_ckpt(const char *ckpt_dir, tsr_folder_lock **out, tsr_error *err);
void tsr_folder_lock_release(tsr_folder_lock *l);

/* ----------------------------------------------------------------- reading */

typedef struct tsr_tensor_info {
    const char *name;   /* owned by the tsr_ckpt */
    const char *group;
    int dtype;
    uint32_t ndim;
    uint64_t shape[TSR_MAX_DIMS];
    tsr_placement placement;
    uint32_t n_chunks;
    uint64_t raw_bytes;    /* volume * element size */
    uint64_t stored_bytes; /* sum of the stored sizes of its frames */
} tsr_tensor_info;

typedef struct tsr_chunk_info {
    uint32_t tensor;   /* tensor index */
    uint32_t file_id;  /* data-<file_id>.tsd */
    tsr_box box;       /* in global indices */
    uint32_t n_frames;
    uint32_t split_dim;   /* frames cut along this dim ... */
    uint64_t frame_rows;  /* ... this many indices each (FORMAT.md, "Frames") */
    uint32_t first_frame; /* index of its first frame */
} tsr_chunk_info;

typedef struct tsr_frame_info {
    uint32_t file_id;
    uint64_t offset, stored_size, raw_size;
    uint64_t raw_hash, stored_hash; /* XXH3-64 */
    int codec;                      /* TSR_CODEC_RAW/ZSTD/BYTEGROUP */
} tsr_frame_info;

typedef struct tsr_blob_info {
    const char *name;
    int32_t rank; /* -1: global */
    uint64_t size;
    uint32_t file_id;
    uint32_t n_frames, first_frame;
} tsr_blob_info;

typedef struct tsr_file_info {
    uint32_t file_id;
    uint64_t size;
} tsr_file_info;

/* tsr_ckpt_open(): reads and validates the MANIFEST of a committed checkpoint
 * directory. Data files are opened on first use. */
tsr_ckpt *tsr_ckpt_open(const char *step_dir, tsr_error *err);
void tsr_ckpt_close(tsr_ckpt *ck); /* NULL is a no-op */
/* tsr_ckpt_read_manifest(): the MANIFEST bytes of step_dir (malloc'ed), unparsed;
 * tsr_ckpt_open_manifest(): opens step_dir with MANIFEST bytes read elsewhere (by
 * one rank, broadcast to the others). */
int tsr_ckpt_read_manifest(const char *step_dir, uint8_t **buf, size_t *len, tsr_error *err);
tsr_ckpt *tsr_ckpt_open_manifest(const char *step_dir, const uint8_t *buf, size_t len, tsr_error *err);

uint64_t tsr_ckpt_step(const tsr_ckpt *ck);
/* tsr_ckpt_version(): the MANIFEST's format version (major << 16 | minor). */
uint32_t tsr_ckpt_version(const tsr_ckpt *ck);
const uint8_t *tsr_ckpt_save_id(const tsr_ckpt *ck); /* 16 bytes */
tsr_layout tsr_ckpt_layout(const tsr_ckpt *ck);
const char *tsr_ckpt_dir(const tsr_ckpt *ck);

size_t tsr_ckpt_n_tensors(const tsr_ckpt *ck);
size_t tsr_ckpt_n_chunks(const tsr_ckpt *ck);
size_t tsr_ckpt_n_frames(const tsr_ckpt *ck);
size_t tsr_ckpt_n_blobs(const tsr_ckpt *ck);
size_t tsr_ckpt_n_files(const tsr_ckpt *ck);

/* Table accessors: index < count, else TSR_EINVAL. */
int tsr_ckpt_tensor(const tsr_ckpt *ck, size_t i, tsr_tensor_info *out);
int tsr_ckpt_chunk(const tsr_ckpt *ck, size_t i, tsr_chunk_info *out);
int tsr_ckpt_frame(const tsr_ckpt *ck, size_t i, tsr_frame_info *out);
int tsr_ckpt_blob(const tsr_ckpt *ck, size_t i, tsr_blob_info *out);
int tsr_ckpt_file(const tsr_ckpt *ck, size_t i, tsr_file_info *out);

/* tsr_ckpt_find(): the index of the tensor named `name`, or -1. O(log n). */
long tsr_ckpt_find(const tsr_ckpt *ck, const char *name);
/* tsr_ckpt_find_blob(): the index of blob (name, rank), or -1. */
long tsr_ckpt_find_blob(const tsr_ckpt *ck, const char *name, int32_t rank);

/* tsr_ckpt_read(): fills `dst` (the memory of `box`, row-major) with the
 * elements of tensor `tensor` inside `box`, which must lie inside the tensor's
 * shape. Reads and decodes only the frames that overlap the box, checking the
 * checksums of each. Thread-safe on one tsr_ckpt. */
int tsr_ckpt_read(tsr_ckpt *ck, size_t tensor, const tsr_box *box, void *dst,
                  tsr_error *err);

/* tsr_ckpt_read_chunk(): reads `region` of stored chunk `chunk` into dst, the
 * memory of dst_box; region must lie inside both. Decodes only the frames of the
 * chunk that overlap the region. With tsr_plan_overlaps, the way to read many
 * boxes at once. Thread-safe. */
int tsr_ckpt_read_chunk(tsr_ckpt *ck, size_t chunk, const tsr_box *region, void *dst,
                        const tsr_box *dst_box, tsr_error *err);

/* tsr_ckpt_read_blob(): copies blob `i` (size bytes) into dst. Thread-safe. */
int tsr_ckpt_read_blob(tsr_ckpt *ck, size_t i, void *dst, tsr_error *err);

/* tsr_ckpt_verify(): checks every rule of FORMAT.md that the MANIFEST alone
 * cannot show: every data file's size and header, every frame's checksums and
 * decoding, every padding byte. Calls `problem` once per problem found with a
 * message naming file, tensor and frame (it may be NULL).
 * @return the number of problems (0: the checkpoint is sound), or a negative
 * tsr_status if the check itself could not run. */
typedef void (*tsr_problem_fn)(void *user, const char *msg);
long tsr_ckpt_verify(tsr_ckpt *ck, tsr_problem_fn problem, void *user, int threads,
                     tsr_error *err);

/* tsr_ckpt_is_committed(): 1 if `step_dir` holds a MANIFEST file, else 0
 * (it does not validate it; tsr_ckpt_open does). */
int tsr_ckpt_is_committed(const char *step_dir);

/* tsr_step_dir_name(): writes "step-%08llu" into buf. */
void tsr_step_dir_name(uint64_t step, char *buf, size_t len);
/* tsr_parse_step_dir(): 1 and *step if `name` is a step directory name. */
int tsr_parse_step_dir(const char *name, uint64_t *step);

/* --------------------------------------------------------- offline reshard */

/* tsr_reshard(): rewrites the committed checkpoint in src_dir for `layout` into
 * dst_dir, in one process: one data file per rank of the target layout, holding
 * exactly the boxes that rank loads (replicated boxes once, writers balanced by
 * bytes), so that loading it in that layout needs no resharding. It streams:
 * each box is read (only the frames it overlaps) and written in pieces of at most
 * piece_bytes, several writers at once; memory stays near writers x (2 pieces +
 * the encoder's frame buffers) whatever the checkpoint's size. Blobs are copied.
 * The MANIFEST is written last: a failed or interrupted reshard leaves nothing
 * committed (a failure removes what it wrote). A target layout in which more than
 * half of the ranks (of two or more) would hold no element is refused
 * (TSR_EINVAL, saying how many), unless `force` is set. */
typedef struct tsr_reshard_opts {
    tsr_layout layout;     /* target; n_layers 0 keeps the source's */
    int force;             /* write even when most target ranks would hold no data */
    int model_only;        /* keep the "model" group only */
    int dtype;             /* 0, or the dtype of every floating tensor of the target */
    tsr_write_opts write;  /* codec, level, frame size of the target */
    int threads;           /* cores to use (0: the online cores); up to twice as many
                              writers run at once, fewer share their encoding */
    size_t piece_bytes;    /* default 16 MiB */
    void (*progress)(void *user, uint64_t done, uint64_t total); /* raw bytes; may be NULL */
    void *user;
} tsr_reshard_opts;
tsr_reshard_opts tsr_reshard_opts_default(void);
int tsr_reshard(const char *src_dir, const char *dst_dir, const tsr_reshard_opts *o, tsr_error *err);

/* --------------------------------------------------------------- synthetic */

/* The synthetic content used by tests and benchmarks: each element is a
 * deterministic function of the tensor name and its global row-major element
 * index. Float dtypes get Gaussian-like values with standard deviation 0.02;
 * integer dtypes get a hash of the index; bool gets 0/1. */

/* tsr_synth_fill(): fills the memory of `box` of tensor (name, dtype, shape). */
void tsr_synth_fill(const char *name, int dtype, uint32_t ndim, const uint64_t *shape,
                    const tsr_box *box, void *dst);
/* tsr_synth_check(): compares the memory of `box` with the synthetic content,
 * bit for bit. @return 0 if every element matches; otherwise 1, with the global
 * index (per dim) of the first wrong element in bad_index (may be NULL). */
int tsr_synth_check(const char *name, int dtype, uint32_t ndim, const uint64_t *shape,
                    const tsr_box *box, const void *data, uint64_t *bad_index);

#ifdef __cplusplus
}
#endif
#endif
