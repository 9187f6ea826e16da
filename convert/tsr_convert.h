/* tsr_convert.h: the public part of convert/: offline resharding of a
 * checkpoint, and its export to and import from other formats. Conventions: tessera.h. */
#ifndef TSR_CONVERT_H
#define TSR_CONVERT_H

#include <stddef.h>
#include <stdint.h>
#include "tsr_ckpt.h"

#ifdef __cplusplus
extern "C" {
#endif

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

#ifdef __cplusplus
}
#endif
#endif
