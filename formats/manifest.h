/* manifest.h: the MANIFEST of format v1 in memory, its encoder, its parser and its
 * validator (FORMAT.md, section 4). Internal.
 *
 * The same encoding carries a writer's partial table from a rank to rank 0 during a
 * distributed save (TSR_MF_PARTIAL: the chunks need not cover their tensors yet). */
#ifndef TSR_MANIFEST_H
#define TSR_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include "tsr_formats.h"

#define TSR_MF_MAGIC "TSRMNFST"
#define TSR_DATA_MAGIC "TSRDATA1"
#define TSR_DATA_MINOR 0 /* the data files' (TSR_FORMAT_MAJOR/MINOR, the MANIFEST's: tsr_base.h) */
#define TSR_MF_HEADER_SIZE 128
#define TSR_MF_MAX_SIZE (4ull << 30)
#define TSR_DATA_HEADER_SIZE 4096
#define TSR_MAX_FILE_SIZE (1ull << 62)
/* The largest stored size a frame of `raw` bytes may have (FORMAT.md section 4.2):
 * room for any codec's overhead, including zstd frames written by other writers. */
#define TSR_MAX_STORED(raw) ((raw) + (raw) / 128 + 4096)

enum { TSR_SEC_STRINGS = 1, TSR_SEC_FILES, TSR_SEC_TENSORS, TSR_SEC_CHUNKS, TSR_SEC_FRAMES,
       TSR_SEC_BLOBS };
/* Section type TSR_SEC_PACKED + T (v1.1, T of FILES to BLOBS) holds section T's
 * records byte-shuffled and zstd-compressed (FORMAT.md 4.3), at most
 * TSR_MF_MAX_PACKED bytes of them. */
#define TSR_SEC_PACKED 16
#define TSR_MF_MAX_PACKED (4ull << 30)
#define TSR_MF_PACK_BLOCK 65536 /* records shuffled together */
enum { TSR_REC_FILE = 16, TSR_REC_TENSOR = 104, TSR_REC_CHUNK = 160, TSR_REC_FRAME = 48,
       TSR_REC_BLOB = 32 };
/* v1.2 appended the first digest to a TENSORS record (FORMAT.md 4.2), v1.3 the
 * statistics (4.5), v1.4 the digest of section 4.4. */
#define TSR_REC_TENSOR_V13 152
#define TSR_REC_TENSOR_V14 160
#define TSR_MF_STATS 2u  /* tsr_mf_tensor.digest_flags: the statistics are recorded (v1.3) */
#define TSR_MF_DIGEST 4u /* tsr_mf_tensor.digest_flags: the digest (4.4, v1.4) is recorded */
#define TSR_MF_POISONED 1u /* tsr_manifest.flags (the header's, v1.3): a tensor holds a non-finite element */

typedef struct tsr_mf_tensor {
    const char *name, *group; /* NUL-terminated, in the manifest's string arena */
    int dtype;
    uint32_t ndim;
    uint64_t shape[TSR_MAX_DIMS];
    tsr_placement placement;
    uint32_t chunk_first, chunk_count;
    /* FORMAT.md 4.4, with TSR_MF_DIGEST in digest_flags (files before v1.4
     * have none: the digest of v1.2 and v1.3 is not read). In a writer's table
     * on its way to rank 0: that writer's share of the CRC (the xor of its
     * boxes' shares, without the key), with the flag when every box it wrote
     * of the tensor added its share (a chunk copied as it is stored, never
     * decoded, adds none). */
    uint64_t digest;
    uint32_t digest_flags; /* TSR_MF_DIGEST, TSR_MF_STATS */
    /* FORMAT.md 4.5, with TSR_MF_STATS (a floating dtype, files from v1.3). In
     * a writer's table: that writer's share (stats.l2 the sum of squares), with
     * the flag when every box it wrote of the tensor added its share. */
    tsr_stats stats;
} tsr_mf_tensor;

typedef struct tsr_mf_chunk {
    uint32_t tensor, file_id, frame_first, frame_count;
    uint32_t split_dim;
    uint64_t frame_rows;
    tsr_box box; /* global indices; box.ndim = the tensor's ndim */
} tsr_mf_chunk;

typedef struct tsr_mf_frame {
    uint64_t offset, stored_size, raw_size, raw_hash, stored_hash;
    int codec;
    uint32_t file_id; /* not stored: the file of its chunk or blob */
} tsr_mf_frame;

typedef struct tsr_mf_blob {
    const char *name;
    int32_t rank;
    uint32_t file_id, frame_first, frame_count;
    uint64_t size;
} tsr_mf_blob;

typedef struct tsr_mf_file {
    uint32_t id;
    uint64_t size;
} tsr_mf_file;

typedef struct tsr_manifest {
    uint16_t version_major, version_minor;
    uint32_t flags; /* the header's: TSR_MF_POISONED */
    uint64_t step, created;
    uint64_t epoch; /* the header's (v1.5): the launch that wrote it (FORMAT.md 4.6); 0: none */
    uint8_t save_id[16];
    tsr_layout layout;
    tsr_mf_tensor *tensors;
    tsr_mf_chunk *chunks;
    tsr_mf_frame *frames;
    tsr_mf_blob *blobs;
    tsr_mf_file *files;
    size_t n_tensors, n_chunks, n_frames, n_blobs, n_files;
    size_t cap_tensors, cap_chunks, cap_frames, cap_blobs, cap_files;
    struct tsr_strpool *strings; /* owns every name */
} tsr_manifest;

/* Flags of tsr_manifest_parse / tsr_manifest_validate. */
#define TSR_MF_PARTIAL 1u /* a writer's table: chunks need not cover their tensors */

void tsr_manifest_init(tsr_manifest *m);
void tsr_manifest_free(tsr_manifest *m);

/* Appenders (grow the arrays; names are copied). Return 0 or TSR_ENOMEM. */
int tsr_manifest_add_tensor(tsr_manifest *m, const tsr_mf_tensor *t);
int tsr_manifest_add_chunk(tsr_manifest *m, const tsr_mf_chunk *c);
int tsr_manifest_add_frame(tsr_manifest *m, const tsr_mf_frame *f);
int tsr_manifest_add_blob(tsr_manifest *m, const tsr_mf_blob *b);
int tsr_manifest_add_file(tsr_manifest *m, const tsr_mf_file *f);

/* tsr_manifest_sort(): puts a manifest whose records were appended in any order
 * into canonical order: tensors by name, chunks by (tensor, offset), blobs by
 * (name, rank), files by id, frames in chunk order then blob order; rewrites every
 * index (chunk.tensor, tensor.chunk_first/count, frame_first). Chunks' `tensor`
 * fields must index the appended tensors. */
int tsr_manifest_sort(tsr_manifest *m, tsr_error *err);

/* tsr_mf_cmp_frame_pos(): a tsr_sort_ctx comparator of frame indices (uint32_t)
 * of the manifest ctx by where the frames lie: file id, then offset. */
int tsr_mf_cmp_frame_pos(const void *a, const void *b, void *ctx);

/* tsr_manifest_encode(): the bytes of the MANIFEST (malloc'ed into *out): v1.1,
 * CHUNKS and FRAMES packed (FORMAT.md 4.3); with TSR_MF_PLAIN every section as
 * plain records (a writer's table on its way to rank 0: quicker to make and to
 * take apart than to carry). */
#define TSR_MF_PLAIN 2u

/* tsr_mf_transpose(): out[c * rows + r] = in[r * cols + c]: the byte shuffle of
 * a block of a packed section (FORMAT.md 4.3) is the transpose of its `n`
 * records of `rec` bytes (rows = n, cols = rec); the transpose with rows = rec,
 * cols = n undoes it. */
void tsr_mf_transpose(const uint8_t *in, size_t rows, size_t cols, uint8_t *out);
int tsr_manifest_encode(const tsr_manifest *m, unsigned flags, uint8_t **out, size_t *out_len, tsr_error *err);

/* tsr_manifest_parse(): parses and validates `len` bytes read from `path` (used in
 * messages only). On success *m owns everything; on failure *m is freed. */
int tsr_manifest_parse(const uint8_t *buf, size_t len, const char *path, unsigned flags,
                       tsr_manifest *m, tsr_error *err);

/* tsr_manifest_validate(): every rule of FORMAT.md section 4 that concerns the
 * records (names, order, ranges, geometry, coverage, packing). */
int tsr_manifest_validate(tsr_manifest *m, const char *path, unsigned flags,
                          tsr_error *err);

/* tsr_layout_problem(): NULL if the layout is within FORMAT.md's limits (section
 * 7: every mesh degree at least 1, their product at most TSR_MAX_RANKS, n_layers at
 * most TSR_MAX_LAYERS); else what breaks them, written into buf. The MANIFEST's
 * validator and the layout parser share it. */
const char *tsr_layout_problem(const tsr_layout *l, char *buf, size_t len);

/* tsr_name_valid(): 1 if `name` (len bytes) is a valid name (FORMAT.md 4.2). */
int tsr_name_valid(const char *name, size_t len);

/* Frame geometry of a chunk (FORMAT.md section 3). */
/* tsr_frame_count(): frames of a chunk with these extents, or UINT64_MAX if the
 * geometry is invalid or the count overflows. */
uint64_t tsr_frame_count(const tsr_box *chunk_box, uint32_t split_dim, uint64_t frame_rows);
/* tsr_frame_box(): the box (global indices) of frame k of chunk c. */
void tsr_frame_box(const tsr_mf_chunk *c, uint64_t k, tsr_box *out);
/* tsr_frame_geometry(): the split_dim and frame_rows a writer uses for a chunk of
 * this box and element size with a target of frame_bytes raw bytes per frame. */
void tsr_frame_geometry(const tsr_box *box, size_t elem_size, size_t frame_bytes,
                        uint32_t *split_dim, uint64_t *frame_rows);
/* tsr_frames_in(): calls fn(user, k) for every frame k of chunk c that overlaps
 * `region` (global indices, inside the chunk), in frame order. Stops and returns
 * fn's value when it is nonzero. */
int tsr_frames_in(const tsr_mf_chunk *c, const tsr_box *region,
                  int (*fn)(void *user, uint64_t k), void *user);

/* Data file header (FORMAT.md section 5). */
void tsr_data_header_encode(uint8_t *hdr /* TSR_DATA_HEADER_SIZE bytes */, uint32_t file_id,
                            const uint8_t save_id[16]);
/* @return 0 if hdr is a valid header for (file_id, save_id), else TSR_ECORRUPT. */
int tsr_data_header_check(const uint8_t *hdr, uint32_t file_id, const uint8_t save_id[16],
                          const char *path, tsr_error *err);

/* tsr_data_file_name(): "data-%05u.tsd". */
void tsr_data_file_name(uint32_t file_id, char *buf, size_t len);

#endif
