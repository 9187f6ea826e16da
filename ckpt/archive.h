/* archive.h: copies of committed checkpoints between local directories and S3.
 * Internal (the commands and the trainer's archiver use it). */
#ifndef TSR_ARCHIVE_H
#define TSR_ARCHIVE_H

#include "s3.h"
#include "tessera.h"

/* tsr_archive_push_step(): uploads the committed checkpoint in the local
 * step_dir to dst (s3://bucket/prefix/step-N): its data files (objects already
 * complete are skipped, interrupted multipart uploads resumed), then the
 * MANIFEST, so that the remote copy is committed only when whole. */
int tsr_archive_push_step(tsr_s3 *s3, const char *step_dir, const char *dst, tsr_s3_transfer *t, tsr_error *err);
/* tsr_archive_pull_step(): downloads the committed checkpoint at src into the
 * local directory dir (made if missing; refused if it already holds one): data
 * files, then the MANIFEST. */
int tsr_archive_pull_step(tsr_s3 *s3, const char *src, const char *dir, tsr_s3_transfer *t, tsr_error *err);

#endif
