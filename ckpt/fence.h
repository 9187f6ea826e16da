/* fence.h: epochs and fencing (FORMAT.md 4.6). Internal; tsr_fence_advance
 * and TSR_EPOCH_ENV are public (tsr_ckpt.h).
 *
 * Each launch of a job has an epoch, and a checkpoint folder's FENCE object
 * records, for every fence ever raised on it, its epoch and the newest step
 * committed when it was raised. Writers of an older epoch than the folder's
 * fence are refused (before they create a file, and before the commit), and
 * readers pass over a MANIFEST that a fenced writer committed after its fence
 * (the race between a writer's check and its commit):
 *   writers  tsr_save_begin, tsr_save_commit (save.c): tsr_fence_admit
 *   readers  tsr_list_steps (steps.c: tsr_step_info.fenced), tsr_ckpt_open
 *            (read.c): tsr_fence_voids
 *   raisers  the supervisor and a trainer run by hand (tsr_fence_advance),
 *            the local tier's node folders (tsr_fence_raise) */
#ifndef TSR_FENCE_H
#define TSR_FENCE_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "tsr_base.h"

#define TSR_FENCE_NAME "FENCE"
#define TSR_FENCE_MAX_SIZE (1u << 20) /* about 30000 fences */

/* One fence: its epoch, and the newest step committed in the folder when it
 * was raised (has_step 0: none was). */
typedef struct tsr_fence_rec {
    uint64_t epoch, step;
    int has_step;
} tsr_fence_rec;

/* A folder's FENCE: its records, oldest (lowest epoch) first; n == 0 when the
 * folder has none. */
typedef struct tsr_fence {
    tsr_fence_rec *v;
    size_t n;
} tsr_fence;

void tsr_fence_free(tsr_fence *f);

/* tsr_fence_parse(): the records of a FENCE's `len` bytes, read from `path`
 * (messages). @return 0, TSR_ECORRUPT naming path, the line and what breaks
 * FORMAT.md 4.6, or TSR_ENOMEM. */
int tsr_fence_parse(const uint8_t *buf, size_t len, const char *path, tsr_fence *f, tsr_error *err);

/* tsr_fence_format(): a FENCE of f's records, appended to b. @return 0 or
 * TSR_ENOMEM. */
int tsr_fence_format(const tsr_fence *f, tsr_sbuf *b);

/* tsr_fence_step_text(): a record's step as the FENCE writes it ("none" or
 * the decimal step), into buf; returns buf. */
const char *tsr_fence_step_text(const tsr_fence_rec *r, char *buf, size_t len);

/* tsr_fence_get(): the FENCE of the open store st of the folder root; as
 * tsr_fence_read. */
struct tsr_store;
int tsr_fence_get(struct tsr_store *st, const char *root, tsr_fence *f, tsr_error *err);

/* tsr_fence_read(): ROOT/FENCE of the folder `root` (a path or s3://),
 * parsed; a folder without one gives n == 0. @return 0, or the parse's error,
 * or the store's (a FENCE that cannot be read is not an absent one). */
int tsr_fence_read(const char *root, tsr_fence *f, tsr_error *err);

/* tsr_fence_epoch(): the folder's fence: the newest record's epoch, 0 for none. */
uint64_t tsr_fence_epoch(const tsr_fence *f);

/* tsr_fence_voids(): the reader's rule: a MANIFEST of (epoch, step) is not a
 * valid commit when a fence of a newer epoch recorded an older newest step (or
 * none): a fenced writer committed it after that fence. @return the first such
 * record, or NULL when the MANIFEST is valid. */
const tsr_fence_rec *tsr_fence_voids(const tsr_fence *f, uint64_t epoch, uint64_t step);

/* tsr_fence_root(): the folder whose FENCE governs the step directory
 * `step_dir` (a path or s3://): its parent, into out, when its last component
 * is a step directory's name (step-N). @return 1, or 0 when it is not (a
 * checkpoint outside a root: no fence applies). */
int tsr_fence_root(const char *step_dir, char *out, size_t len);

/* tsr_fence_admit(): the writer's check, before it creates its data file
 * (commit 0) and before it commits (commit 1) the step directory `step_dir`
 * as a writer of *epoch (0: one without, not a launch's: an offline tool).
 * Refused (TSR_EBUSY, "fenced: ..." naming the folder, the step, both epochs)
 * when the folder's fence is newer than *epoch > 0. A writer without an epoch
 * commits as the folder's fence epoch of the moment, which goes into *epoch
 * (the MANIFEST records it; readers then judge it as that epoch's). A step
 * directory outside a root is not checked. @return 0, the refusal, or the
 * FENCE's error (a damaged FENCE refuses every writer). */
int tsr_fence_admit(const char *step_dir, uint64_t *epoch, int commit, tsr_error *err);

/* tsr_fence_raise(): raises the fence of `root` to `epoch` (only upward):
 * appends (epoch, the newest valid committed step) when the fence is older,
 * does nothing when it is epoch already; refused (TSR_EBUSY, "fenced: ...")
 * when it is newer. The local tier's node folders, when the tier opens. */
int tsr_fence_raise(const char *root, uint64_t epoch, tsr_error *err);

/* tsr_epoch_parse(): the value of TSR_EPOCH (decimal, 1 to 2^64-1) into
 * *epoch. @return 0, or TSR_EINVAL naming the variable and the value. */
int tsr_epoch_parse(const char *s, uint64_t *epoch, tsr_error *err);

#endif
