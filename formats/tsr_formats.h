/* tsr_formats.h: the public part of formats/: how a tensor is placed on the rank
 * mesh and the layout a checkpoint records (FORMAT.md). Conventions: tessera.h. */
#ifndef TSR_FORMATS_H
#define TSR_FORMATS_H

#include <stddef.h>
#include <stdint.h>
#include "tsr_base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* --------------------------------------------------------------- placement */

/* How a tensor is laid out over the rank mesh [pp][dp_replicate][dp_shard][tp]
 * (FORMAT.md, section 10, "Layouts"). Recorded with every tensor so that tools
 * can compute any target layout from mesh degrees alone. */
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

/* ------------------------------------------------------------------ codecs */

/* How a frame is encoded (FORMAT.md, "Frames"). */
enum {
    TSR_CODEC_AUTO = -1,     /* bytegroup for f32/f16/bf16, zstd otherwise, raw
                                where encoding gains nothing (the default) */
    TSR_CODEC_RAW = 0,
    TSR_CODEC_ZSTD = 1,
    TSR_CODEC_BYTEGROUP = 2,
};

/* ------------------------------------------------------------------ digest */

/* The digest of a logical tensor (FORMAT.md section 4.4): key xor the CRC-64
 * (ECMA-182 polynomial, reflected, initial value 0, no final xor) of its bytes
 * as stored, in global row-major order, with key = tsr_digest_key(name, dtype).
 * The CRC of the tensor is the xor of its runs' shares: a run's CRC shifted past
 * the bytes that follow it in the tensor. No layout, chunking or framing
 * changes it: the shares of any disjoint boxes xor to it. */

/* tsr_digest_key(): XXH3-64 of the tensor's name with its dtype code as seed. */
uint64_t tsr_digest_key(const char *name, int dtype);
/* tsr_digest_tensor(): the digest of a whole tensor of `volume` elements of
 * elem_size bytes at data, in row-major order. */
uint64_t tsr_digest_tensor(uint64_t key, size_t elem_size, const void *data, uint64_t volume);
/* tsr_digest_run(): the share of n elements of elem_size bytes at data, of
 * global indices first, first+1, ..., of a tensor of `volume` elements. */
uint64_t tsr_digest_run(size_t elem_size, uint64_t volume, uint64_t first, const void *data, uint64_t n);
/* tsr_digest_box(): the share of `box` (its memory at data, row-major) of a
 * tensor of this shape (box->ndim dims). */
uint64_t tsr_digest_box(size_t elem_size, const uint64_t *shape, const tsr_box *box, const void *data);
/* tsr_digest_region(): the share of `region` (within mem_box) of a tensor of
 * `shape`, whose memory holds mem_box (row-major) at data. */
uint64_t tsr_digest_region(size_t elem_size, const uint64_t *shape, const tsr_box *mem_box, const void *data,
                           const tsr_box *region);
/* The share of several regions of one tensor taken in turn (a region read in
 * slabs): each must lie wholly after the last in row-major order; the share is
 * their shares' xor at the cost of one: the CRC runs on from region to region
 * and is shifted past the tensor's end once (tsr_digest_acc_share). */
typedef struct tsr_digest_acc {
    uint64_t crc, end, gap, gap_shift; /* the CRC so far, in bytes: its end, the last gap and its shift */
    int started, gap_uses;
    uint64_t gap_table[16][16]; /* the product by gap_shift, a table a nibble, once the gap repeats */
} tsr_digest_acc;
void tsr_digest_acc_init(tsr_digest_acc *a);
void tsr_digest_acc_region(tsr_digest_acc *a, size_t elem_size, const uint64_t *shape, const tsr_box *mem_box,
                           const void *data, const tsr_box *region);
uint64_t tsr_digest_acc_share(const tsr_digest_acc *a, size_t elem_size, uint64_t volume);

/* -------------------------------------------------------------- statistics */

/* The statistics of a tensor of a floating dtype (f32, f16, bf16, f64, f8e4m3,
 * f8e5m2; FORMAT.md section 4.5), each element taken at its exact value: */
typedef struct tsr_stats {
    double min, max;    /* of the finite elements; +inf and -inf when there is none; a zero is +0 */
    double l2;          /* sqrt of the sum of the squares of the finite elements; in a share
                           (tsr_stats_run, tsr_stats_merge) the sum itself, until tsr_stats_finish */
    uint64_t nonfinite; /* elements that are NaN or infinite */
} tsr_stats;

/* tsr_stats_init(): the statistics of no element (the share to add to). */
void tsr_stats_init(tsr_stats *s);
/* tsr_stats_dtype(): 1 if tensors of dtype have statistics (the floating
 * dtypes), else 0 (integers and bool: exact values that cannot be non-finite). */
int tsr_stats_dtype(int dtype);
/* tsr_stats_run(): adds the share of n elements of dtype at data (in any order:
 * a frame's, a box's) to *acc. @return 1, or 0 (nothing added) for a dtype
 * without statistics. */
int tsr_stats_run(int dtype, const void *data, uint64_t n, tsr_stats *acc);
/* tsr_stats_copy(): copies `bytes` bytes of f32 or bf16 host memory from src
 * to dst (stored around the caches: a save's staging arena) and adds the
 * statistics of their elements to *acc, in the same pass: free while the copy
 * waits for the memory. @return 1, or 0 with nothing done where it has no such
 * pass (another dtype, a processor without AVX2, dst not aligned to its vectors):
 * the caller copies. */
int tsr_stats_copy(int dtype, void *dst, const void *src, size_t bytes, tsr_stats *acc);
/* tsr_stats_kernels(): the widest vector kernels tsr_stats_run may use from
 * now on (2: AVX-512F, 1: AVX2 with FMA, 0: the portable ones alone; -1 or
 * more than the processor has: the widest it has), for tests and benchmarks
 * that compare them. @return the level set. */
int tsr_stats_kernels(int level);
/* tsr_stats_merge(): adds the share `share` to *acc (min of mins, max of maxes,
 * sums of squares and of counts). */
void tsr_stats_merge(tsr_stats *acc, const tsr_stats *share);
/* tsr_stats_finish(): a share of the whole tensor into its statistics (l2 =
 * sqrt of the sum of squares). */
void tsr_stats_finish(tsr_stats *s);

/* tsr_digest_stats_box(): tsr_digest_box()'s share of `box` (its memory at
 * data, row-major) of a tensor of dtype and `shape`, returned, and
 * tsr_stats_run()'s share of its elements added to *acc (none for a dtype
 * without statistics), while the bytes are in cache. */
uint64_t tsr_digest_stats_box(int dtype, const uint64_t *shape, const tsr_box *box, const void *data,
                              tsr_stats *acc);

#ifdef __cplusplus
}
#endif
#endif
