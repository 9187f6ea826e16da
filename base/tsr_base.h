/* tsr_base.h: the public part of base/, the bottom layer: version, format limits,
 * errors and the logging hook, element types, boxes. Conventions: tessera.h. */
#ifndef TSR_BASE_H
#define TSR_BASE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TSR_VERSION_MAJOR 0
#define TSR_VERSION_MINOR 1
#define TSR_VERSION_PATCH 0
#define TSR_VERSION_STRING "0.1.0"
/* The checkpoint format this library writes (FORMAT.md, section 8): 1.1 packs
 * the MANIFEST's CHUNKS and FRAMES; it reads 1.0 and 1.1. */
#define TSR_FORMAT_MAJOR 1
#define TSR_FORMAT_MINOR 5

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

/* ----------------------------------------------------------- memory kinds */

/* Where memory lives: host memory, or a device's. Parameters, gradients,
 * optimizer state, activations and the engine's state boxes carry it; staging
 * copies from any kind this build holds. TSR_MEM_GUARD is host memory that
 * stands in for a device's (tests): host code that touches it crashes, naming
 * the spot; only kernels and copies reach it (base/mem.h). */
typedef enum tsr_mem_kind { TSR_MEM_HOST = 0, TSR_MEM_CUDA = 1, TSR_MEM_GUARD = 2 } tsr_mem_kind;

/* A stream orders the work on one device (in the CUDA build, a tsr_stream * is
 * a cudaStream_t). NULL is the host, or the device's default stream: a host
 * call is done when it returns. */
typedef struct tsr_stream tsr_stream;

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

#ifdef __cplusplus
}
#endif
#endif
