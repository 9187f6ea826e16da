/* encoder.h: the encoder of a save (threads, codecs, frame buffers), which the
 * engine keeps from one save to the next. Internal. */
#ifndef TSR_ENCODER_H
#define TSR_ENCODER_H

#include "tsr_ckpt.h"

typedef struct tsr_encoder tsr_encoder;

/* tsr_encoder_new(): `threads` encoder threads in all (<= 0: the online cores). */
tsr_encoder *tsr_encoder_new(int threads, tsr_error *err);
void tsr_encoder_free(tsr_encoder *enc);
/* tsr_encoder_pool(): the encoder's threads, for other work between saves (the
 * engine's staging copy). */
struct tsr_pool *tsr_encoder_pool(tsr_encoder *enc);

/* tsr_save_begin_with(): tsr_save_begin, encoding with `enc` (borrowed: it must
 * outlive the save and serve one save at a time); NULL makes one for this save. */
tsr_save *tsr_save_begin_with(const char *step_dir, uint32_t file_id, const uint8_t *save_id,
                              const tsr_write_opts *opts, tsr_encoder *enc, tsr_error *err);

/* tsr_save_box_stable(): tsr_save_box for memory that stays untouched until
 * tsr_save_finish returns (the engine's staging arena): raw frames aligned to
 * TSR_ALIGN are written from it without a copy, and stay in flight after the
 * call. `stats`: the box's statistics where the caller took them already (its
 * staging copy, tsr_stats_copy), for the tensor's instead of the frames'
 * shares; NULL: the frames' shares. */
int tsr_save_box_stable(tsr_save *s, const char *name, const tsr_box *box, const void *data, const tsr_stats *stats,
                        tsr_error *err);

/* tsr_save_set_idle(): work for the writer of s while the disk is busy: instead
 * of waiting for a write of stable memory to finish, it calls idle(ctx, 1),
 * which does a piece of other work and returns 1, or returns 0 when it has none
 * left (then it is never called again); idle(ctx, 0) only says whether work is
 * left. While it is, frames of stable memory are stored raw and their checksums
 * computed by tsr_save_finish. The engine's staging copy, which the loop waits
 * for, keeps the threads while the disk is fed. */
void tsr_save_set_idle(tsr_save *s, int (*idle)(void *ctx, int run), void *ctx);

/* tsr_save_chunk_copy(): chunk `chunk` of the open checkpoint src, of a tensor
 * declared here as `name` with the same dtype, stored as a chunk of this save
 * exactly as it is stored there: the same box and frame geometry, each frame's
 * stored bytes and checksums copied (read and checked, never decoded or
 * encoded). A reshard whose target boxes are made of whole source chunks costs
 * a read and a write. */
int tsr_save_chunk_copy(tsr_save *s, const char *name, tsr_ckpt *src, size_t chunk, tsr_error *err);

#endif
