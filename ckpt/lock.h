/* lock.h: a checkpoint folder that a tool writes whole (reshard, import, ckpt
 * synth): where it writes, so that the folder has one writer and a run that
 * reports success leaves a checkpoint that verifies. Internal. */
#ifndef TSR_LOCK_H
#define TSR_LOCK_H

#include "tsr_ckpt.h"

/* A tool writes the checkpoint folder DST
 *  - named step-N (a step of a root, as training writes it): in place, holding
 *    the root's lock (tsr_folder_lock_for_ckpt); an interrupted write leaves an
 *    uncommitted step, which the root's next save removes;
 *  - any other local name: into a new folder beside it, PARENT/.NAME.tmp-PID-R,
 *    renamed to DST once committed: DST appears complete or not at all, and of
 *    two writers of one new DST only the first rename succeeds (rename(2) does
 *    not replace a folder that is not empty), while each writer's cleanup
 *    touches only its own folder;
 *  - any other name on object storage, which renames nothing: in place,
 *    holding the lease DST/LOCK. */
typedef struct tsr_ckpt_out tsr_ckpt_out;

/* tsr_ckpt_out_begin(): takes the lock above and, for a local DST that is not a
 * step, makes the folder beside it. Refused: a DST that holds a committed
 * checkpoint (TSR_EINVAL), that another writer holds (TSR_EBUSY, naming the
 * holder), or, written beside, that exists and is not an empty folder
 * (TSR_EINVAL). The message names DST. */
int tsr_ckpt_out_begin(const char *dst, tsr_ckpt_out **out, tsr_error *err);
/* tsr_ckpt_out_dir(): the folder to write the checkpoint into. */
const char *tsr_ckpt_out_dir(const tsr_ckpt_out *o);
/* tsr_ckpt_out_end(): with ok (the checkpoint in the folder is committed),
 * renames a folder written beside DST to DST and syncs DST's parent: TSR_EBUSY
 * naming DST when DST is no longer empty (another writer's rename came first).
 * Without ok, or when the rename fails, the folder written beside is removed (an
 * in-place local one only when empty). Then releases the lock and frees o
 * (NULL: nothing). @return 0 or the error. */
int tsr_ckpt_out_end(tsr_ckpt_out *o, int ok, tsr_error *err);

#endif
