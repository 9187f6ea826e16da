/* store.h: where checkpoints live, behind one interface. Internal.
 *
 * A tsr_store is a location (a directory, or an S3 prefix) that
 * holds named objects: data files, MANIFEST. Writers create objects and write them
 * at 4096-aligned offsets from aligned buffers (O_DIRECT where the filesystem
 * allows), then finish (make durable) or abort (remove) them; the MANIFEST is put
 * atomically. Readers read byte ranges.
 *
 * Fault injection for tests: the environment variable TSR_FAULT="OP:N:KIND" makes
 * the Nth call (counted from 1, per process) of OP fail, where OP is write, fsync
 * (the final ones), datasync (those a write file queues every few MiB while it
 * writes) or rename, and KIND is ENOSPC, EIO or short (a write that stores half
 * its bytes and reports it), kill (the process sends itself SIGKILL at the call,
 * before it runs) or killafter (SIGKILL right after the call returns: a crash
 * between two steps of a commit). "OP:N:KIND:TEXT" counts only the calls on
 * paths that contain TEXT (a directory's fsync has the directory's path):
 * "fsync:1:killafter:step-00000004/MANIFEST.tmp" crashes once the MANIFEST of
 * step 4 is written and synced, before its rename. TSR_FAULT="delay:USEC:OP"
 * makes every OP take USEC longer (crash tests use it to widen the window in
 * which a save is in progress); "delay:USEC:OP:TEXT" only the calls on paths
 * that contain TEXT ("delay:4000000:fsync:data-00002" makes rank 2 report its
 * part of a save 4 s late: the commit deadline's tests). On S3, an upload's completion counts as the
 * fsync of its object and the MANIFEST's PUT as the rename. */
#ifndef TSR_STORE_H
#define TSR_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "tsr_ckpt.h"

typedef struct tsr_store tsr_store;
typedef struct tsr_rfile tsr_rfile;
typedef struct tsr_wfile tsr_wfile;

/* tsr_store_open(): the store at `location`: a directory path, or s3://bucket/prefix
 * (objects PREFIX/NAME through the S3 client, s3.h; write files are streaming
 * multipart uploads, written in order). With `create`, a directory and its
 * parents are made if missing. */
tsr_store *tsr_store_open(const char *location, int create, tsr_error *err);
int tsr_store_is_remote(const char *location);
void tsr_store_close(tsr_store *s);
const char *tsr_store_location(const tsr_store *s);

/* Reading. tsr_store_open_read sets *size. tsr_rfile_read reads exactly len bytes
 * at off (short reads are TSR_ECORRUPT: the object is smaller than it claims).
 * Thread-safe on one tsr_rfile. */
int tsr_store_open_read(tsr_store *s, const char *name, tsr_rfile **out, uint64_t *size,
                        tsr_error *err);
int tsr_rfile_read(tsr_rfile *f, void *buf, size_t len, uint64_t off, tsr_error *err);
void tsr_rfile_close(tsr_rfile *f);

/* Writing. */
int tsr_store_create(tsr_store *s, const char *name, tsr_wfile **out, tsr_error *err);
/* buf aligned to TSR_ALIGN, len and off multiples of TSR_ALIGN. */
int tsr_wfile_write(tsr_wfile *f, const void *buf, size_t len, uint64_t off, tsr_error *err);
/* Asynchronous writes (io_uring on files; a plain write where io_uring is not
 * available): tsr_wfile_submit queues a write with the same rules as
 * tsr_wfile_write; `buf` must stay untouched until tsr_wfile_complete, which waits
 * for every queued write and returns the first failure. Several writes are in
 * flight at once. */
int tsr_wfile_submit(tsr_wfile *f, const void *buf, size_t len, uint64_t off, tsr_error *err);
int tsr_wfile_complete(tsr_wfile *f, tsr_error *err);
/* tsr_wfile_release(): waits until no queued write reads from `buf` (the start
 * of a submitted buffer), so that it may be reused; other writes stay queued. */
int tsr_wfile_release(tsr_wfile *f, const void *buf, tsr_error *err);
/* tsr_wfile_reserve(): a hint that about `bytes` will be written: the file is
 * preallocated (best effort; nothing fails without it). */
void tsr_wfile_reserve(tsr_wfile *f, uint64_t bytes);
/* Sets the object's size to `size` (dropping a preallocation past it), makes it
 * durable (fsync) and closes it. */
int tsr_wfile_finish(tsr_wfile *f, uint64_t size, tsr_error *err);
/* Closes and removes a partial object. */
void tsr_wfile_abort(tsr_wfile *f);

/* tsr_store_put_atomic(): writes a whole object so that readers see either
 * nothing or all of it (temporary name, fsync, rename, directory fsync). */
int tsr_store_put_atomic(tsr_store *s, const char *name, const void *buf, size_t len,
                         tsr_error *err);
/* tsr_store_get(): reads a whole object (at most max bytes) into a malloc'ed buffer. */
int tsr_store_get(tsr_store *s, const char *name, size_t max, uint8_t **out, size_t *len,
                  tsr_error *err);
int tsr_store_exists(tsr_store *s, const char *name);
int tsr_store_remove(tsr_store *s, const char *name, tsr_error *err);
/* tsr_store_list(): calls fn for each name directly in the store, with its size;
 * a sub-directory (or deeper keys) as "NAME/" with size 0. A non-zero return
 * from fn stops and is returned. */
int tsr_store_list(tsr_store *s, int (*fn)(void *user, const char *name, uint64_t size), void *user,
                   tsr_error *err);

#endif
