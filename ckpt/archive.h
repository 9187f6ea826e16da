/* archive.h: copies of committed checkpoints between local directories and S3.
 * Internal (the commands and the trainer's archiver use it). */
#ifndef TSR_ARCHIVE_H
#define TSR_ARCHIVE_H

#include "s3.h"
#include "tsr_ckpt.h"

/* tsr_archive_push_step(): uploads the committed checkpoint in the local
 * step_dir to dst (s3://bucket/prefix/step-N): its data files (objects already
 * complete are skipped, interrupted multipart uploads resumed), then the
 * MANIFEST, so that the remote copy is committed only when whole. */
int tsr_archive_push_step(tsr_s3 *s3, const char *step_dir, const char *dst, tsr_s3_transfer *t, tsr_error *err);
/* tsr_archive_pull_step(): downloads the committed checkpoint at src into the
 * local directory dir (made if missing; refused if it already holds one): data
 * files, then the MANIFEST. */
int tsr_archive_pull_step(tsr_s3 *s3, const char *src, const char *dir, tsr_s3_transfer *t, tsr_error *err);

/* The archiver: a thread that pushes committed checkpoints to an S3 root, one at
 * a time, in the order given (every request goes through the S3 client's retry
 * loop), then keeps the newest `keep` committed checkpoints there (0 keeps all).
 * A push that fails is logged and given up, never fatal: the next checkpoint is
 * pushed as usual.
 * tsr_archiver_free waits for the queue to drain. */
typedef struct tsr_archiver tsr_archiver;
tsr_archiver *tsr_archiver_new(const char *url, uint32_t keep, tsr_error *err);
int tsr_archiver_add(tsr_archiver *a, const char *step_dir);
/* 1 while step_dir is queued or being pushed (local retention leaves it alone). */
int tsr_archiver_holds(tsr_archiver *a, const char *step_dir);
void tsr_archiver_free(tsr_archiver *a);

#endif
