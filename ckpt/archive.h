/* archive.h: copies of committed checkpoints between local directories and S3.
 * Internal (the commands and the trainer's archiver use it). */
#ifndef TSR_ARCHIVE_H
#define TSR_ARCHIVE_H

#include "compact.h"
#include "s3.h"
#include "tsr_ckpt.h"

/* tsr_archive_push_step(): uploads the committed checkpoint in the local
 * step_dir to dst (s3://bucket/prefix/step-N): its data files, then the
 * MANIFEST, so that the remote copy is committed only when whole. A data file
 * with raw frames (tsr_recode_file_raw) is uploaded with them encoded
 * (compact.h; `threads` encoder threads, <= 0: the online cores), streamed a
 * batch of frames at a time as a multipart upload through the S3 store (each
 * part's SHA-256 signed and checked by the server; no content-hash metadata,
 * which a stream does not know when it starts: the frames' checksums stand for
 * it), and the MANIFEST uploaded describes the frames as they are in the
 * bucket (same values, same raw checksums); *st (may be NULL) counts them. A
 * file without raw frames goes up as it is: an object already complete is
 * skipped, an interrupted multipart upload resumed. When dst holds a committed
 * copy of the same save already (a push that finished), nothing is sent. */
int tsr_archive_push_step(tsr_s3 *s3, const char *step_dir, const char *dst, int threads, tsr_s3_transfer *t,
                          tsr_recode_stats *st, tsr_error *err);
/* tsr_archive_pull_step(): downloads the committed checkpoint at src into the
 * local directory dir (made if missing; refused if it already holds one): data
 * files, then the MANIFEST. */
int tsr_archive_pull_step(tsr_s3 *s3, const char *src, const char *dir, tsr_s3_transfer *t, tsr_error *err);
/* tsr_archive_check_remote(): checks that the S3 location url can be read
 * (credentials, endpoint, bucket, signature: one listing of a key), so that a
 * failure is reported with the server's reason rather than as "nothing there".
 * tsr_pull does it first (copy.c); `tessera ls` too. @return 0 or the error. */
int tsr_archive_check_remote(const char *url, tsr_error *err);

/* The archiver: a thread that pushes committed checkpoints to an S3 root, one at
 * a time, in the order given (every request goes through the S3 client's retry
 * loop), then keeps the newest `keep` committed checkpoints there (0 keeps all).
 * Raw frames are encoded on the archiver's own thread. A push that fails is
 * logged and given up, never fatal: the next checkpoint is pushed as usual.
 * tsr_archiver_free waits for the queue to drain. */
typedef struct tsr_archiver tsr_archiver;
tsr_archiver *tsr_archiver_new(const char *url, uint32_t keep, tsr_error *err);
int tsr_archiver_add(tsr_archiver *a, const char *step_dir);
/* 1 while step_dir is queued or being pushed (local retention leaves it alone). */
int tsr_archiver_holds(tsr_archiver *a, const char *step_dir);
void tsr_archiver_free(tsr_archiver *a);

#endif
