/* store.h: where checkpoints live, behind one interface. Internal.
 *
 * A tsr_store is a location (a directory, or an S3 prefix) that holds named
 * objects: data files, MANIFEST. Writers create objects and write them at
 * 4096-aligned offsets from aligned buffers (O_DIRECT where the filesystem
 * allows), then finish (make durable) or abort (remove) them; the MANIFEST is put
 * atomically. Readers read byte ranges.
 *
 * The interface is a table of operations (tsr_store_ops) with one implementation
 * per kind of location, chosen once, from the location's scheme, by
 * tsr_store_open (store_open.c: one row per scheme): POSIX files written through
 * io_uring (store_posix.c) and S3 objects (store_s3.c). What a caller needs
 * beyond the calls (real directories, atomic renames, locks) it asks of
 * tsr_store_caps, never of the scheme. A third implementation wraps another and
 * injects faults (store_fault.c), the way SQLite's test VFS wraps the real one:
 * the same fault tests run against both stores, and the stores themselves hold
 * no test hooks.
 *
 * Who calls what, in order (every call may fail; a failed call leaves no object
 * half-made under its name):
 *   writer (ckpt/save.c, one per rank and step):
 *     tsr_store_open(step, create=1)
 *     tsr_store_create(data-R.tsd) -> tsr_wfile_reserve -> tsr_wfile_submit ...
 *       (tsr_wfile_release / tsr_wfile_busy to reuse a buffer)
 *       -> tsr_wfile_finish (every write done, durable) | tsr_wfile_abort (removed)
 *     tsr_store_close
 *   commit (tsr_save_commit in ckpt/save.c, on rank 0 once every writer has
 *   finished: the engine's commit, ckpt/engine_save.c):
 *     tsr_store_put_atomic(MANIFEST): the step exists from here on
 *   reader (ckpt/read.c, tsr_ckpt_open; the engine's load, the converters):
 *     tsr_store_open(step, 0) -> tsr_store_get(MANIFEST)
 *     -> tsr_store_open_read(data-R.tsd) -> tsr_rfile_map | tsr_rfile_read ...
 *     -> tsr_rfile_close -> tsr_store_close
 *   steps and retention (ckpt/steps.c), leases (ckpt/lock.c), the archiver
 *   (ckpt/archive.c): tsr_store_list, tsr_store_exists, tsr_store_get,
 *   tsr_store_put_atomic, tsr_store_remove (the MANIFEST first).
 * Every call on one tsr_store or tsr_wfile comes from one thread at a time,
 * but for tsr_rfile_read, which is thread-safe on one tsr_rfile.
 *
 * Fault injection for tests: tsr_fault_set("OP:N:KIND") makes the Nth call
 * (counted from 1, per process, from that tsr_fault_set) of OP fail, where OP is
 * write, fsync (the final ones: a write file's finish, a directory's sync),
 * datasync (those a write file asks for every few MiB while it writes; POSIX
 * only) or rename (the commit of an atomic put), and KIND is ENOSPC, EIO or
 * short (a write that stores half its bytes and reports no space), kill (the
 * process sends itself SIGKILL at the call, before it runs) or killafter (SIGKILL
 * right after the call returns: a crash between two steps of a commit).
 * "OP:N:KIND:TEXT" counts only the calls on paths that contain TEXT (a
 * directory's fsync has the directory's path): "fsync:1:killafter:
 * step-00000004/MANIFEST.tmp" crashes once the MANIFEST of step 4 is written and
 * synced, before its rename. "delay:USEC:OP" makes every OP take USEC longer
 * (crash tests use it to widen the window in which a save is in progress);
 * "delay:USEC:OP:TEXT" only the calls on paths that contain TEXT
 * ("delay:4000000:fsync:data-00002" makes rank 2 report its part of a save 4 s
 * late: the commit deadline's tests). "rate:MBPS:write[:TEXT]" makes every
 * write take its bytes at MBPS megabytes a second longer, in the calling thread:
 * a disk (or network) of about that speed, for benchmarks of a slow writer. A
 * path is LOCATION/NAME. On POSIX an
 * atomic put is NAME.tmp's write and fsync, its rename, and the directory's
 * fsync; on S3 an upload's completion counts as the fsync of its object, and an
 * atomic put is one PUT, which counts as the rename. The tessera command sets
 * the spec from the environment variable TSR_FAULT (tools/cli.c). */
#ifndef TSR_STORE_H
#define TSR_STORE_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include "tsr_base.h"

typedef struct tsr_store tsr_store;
typedef struct tsr_rfile tsr_rfile;
typedef struct tsr_wfile tsr_wfile;
typedef struct tsr_store_ops tsr_store_ops;

/* Called for each name by tsr_store_list; a non-zero return stops the listing. */
typedef int (*tsr_store_list_fn)(void *user, const char *name, uint64_t size);

/* tsr_store_open(): the store at `location`, chosen by its scheme from one table
 * (store_open.c): s3://bucket/prefix (objects PREFIX/NAME through the S3 client,
 * s3.h; write files are streaming multipart uploads, written in order), or a
 * directory path (no scheme). A location of another SCHEME:// is refused
 * (TSR_EINVAL, naming it), never taken for a path. With `create`, a directory and its
 * parents are made if missing. While a fault spec is set (tsr_fault_set), the
 * store comes wrapped in a fault-injecting one. */
tsr_store *tsr_store_open(const char *location, int create, tsr_error *err);

/* What a store can do, for the callers that need more than the calls below:
 * they ask the location's store instead of testing its scheme. */
enum {
    /* real directories: a location exists with nothing in it, and is removed
     * (rmdir) once empty; without, names are keys under a prefix and a location
     * with nothing stored under it does not exist */
    TSR_STORE_DIRS = 1u << 0,
    /* whole folders and objects renamed atomically, by the system (rename(2)):
     * a checkpoint written beside its name and renamed into place, a retired
     * step's files moved aside and reused, steps moved aside on a rewind */
    TSR_STORE_RENAME = 1u << 1,
    /* advisory locks on a file (flock), released when their holder dies;
     * without, a writer's lease is an object (LOCK) that it removes */
    TSR_STORE_LOCKS = 1u << 2,
};
/* tsr_store_caps(): the TSR_STORE_* of the store that would open `location`
 * (nothing is opened); 0 too for a scheme no store serves (which
 * tsr_store_open refuses). */
unsigned tsr_store_caps(const char *location);
void tsr_store_close(tsr_store *s);

/* Reading. tsr_store_open_read sets *size. tsr_rfile_read reads exactly len bytes
 * at off (short reads are TSR_ECORRUPT: the object is smaller than it claims).
 * Thread-safe on one tsr_rfile. */
int tsr_store_open_read(tsr_store *s, const char *name, tsr_rfile **out, uint64_t *size,
                        tsr_error *err);
int tsr_rfile_read(tsr_rfile *f, void *buf, size_t len, uint64_t off, tsr_error *err);
/* tsr_rfile_map(): the bytes [off, off + len) of the object in place, valid until
 * tsr_rfile_close, when the store maps the object (a local file in memory,
 * /dev/shm: reading it would only copy it); NULL when it does not, or for a range
 * outside the object: then tsr_rfile_read. */
const uint8_t *tsr_rfile_map(tsr_rfile *f, uint64_t off, size_t len);
void tsr_rfile_close(tsr_rfile *f);

/* Writing. flags: 0, TSR_CREATE_OVERWRITE or TSR_CREATE_NEW. */
int tsr_store_create(tsr_store *s, const char *name, int flags, tsr_wfile **out, tsr_error *err);
/* buf aligned to TSR_ALIGN, len and off multiples of TSR_ALIGN. */
int tsr_wfile_write(tsr_wfile *f, const void *buf, size_t len, uint64_t off, tsr_error *err);
/* Asynchronous writes (io_uring on files; a plain write where io_uring is not
 * available): tsr_wfile_submit queues a write with the same rules as
 * tsr_wfile_write; `buf` must stay untouched until tsr_wfile_release(buf), or
 * tsr_wfile_finish, which waits for every queued write and returns the first
 * failure (as does the complete operation, which finish uses). Several writes are in
 * flight at once. Every TSR_STORE_FLUSH_EVERY bytes submitted, the file is asked
 * to start making them durable (the datasync operation), without waiting. */
int tsr_wfile_submit(tsr_wfile *f, const void *buf, size_t len, uint64_t off, tsr_error *err);
/* tsr_wfile_release(): waits until no queued write reads from `buf` (the start
 * of a submitted buffer), so that it may be reused; other writes stay queued. */
int tsr_wfile_release(tsr_wfile *f, const void *buf, tsr_error *err);
/* tsr_wfile_busy(): 1 when tsr_wfile_release(buf) would wait now (completions
 * already there are taken in first), 0 when not or when the store cannot tell. */
int tsr_wfile_busy(tsr_wfile *f, const void *buf);
/* tsr_wfile_reserve(): a hint that about `bytes` will be written: the file is
 * preallocated (best effort; nothing fails without it). */
void tsr_wfile_reserve(tsr_wfile *f, uint64_t bytes);
/* Sets the object's size to `size` (dropping a preallocation past it), makes it
 * durable (fsync) and closes it; on failure the object is removed. */
int tsr_wfile_finish(tsr_wfile *f, uint64_t size, tsr_error *err);
/* Closes and removes a partial object. */
void tsr_wfile_abort(tsr_wfile *f);

/* tsr_store_put_atomic(): writes a whole object so that readers see either
 * nothing or all of it: one PUT on S3; on POSIX NAME.tmp is written, synced and
 * renamed to NAME, and the directory synced. */
int tsr_store_put_atomic(tsr_store *s, const char *name, const void *buf, size_t len,
                         tsr_error *err);
/* tsr_store_put_new(): the same, but NAME must not exist, and one put meanwhile
 * is never replaced: on POSIX NAME.tmp-UNIQUE is linked to NAME (renameat2's
 * RENAME_NOREPLACE, or link() where the filesystem lacks it); on S3 the PUT
 * carries If-None-Match: *. A name taken: TSR_EBUSY, and nothing of this put
 * stays. How a commit never replaces another writer's (FORMAT.md 4.6). */
int tsr_store_put_new(tsr_store *s, const char *name, const void *buf, size_t len, tsr_error *err);
/* tsr_store_get(): reads a whole object (at most max bytes) into a malloc'ed buffer. */
int tsr_store_get(tsr_store *s, const char *name, size_t max, uint8_t **out, size_t *len,
                  tsr_error *err);
/* tsr_store_exists(): 1 when NAME is there, 0 when it is not, or a TSR_E code (< 0)
 * with err set when the store could not tell (a server that does not answer is
 * not an absent object). */
int tsr_store_exists(tsr_store *s, const char *name, tsr_error *err);
int tsr_store_remove(tsr_store *s, const char *name, tsr_error *err);
/* tsr_store_list(): calls fn for each name directly in the store, with its size;
 * a sub-directory (or deeper keys) as "NAME/" with size 0. A non-zero return
 * from fn stops and is returned. */
int tsr_store_list(tsr_store *s, tsr_store_list_fn fn, void *user, tsr_error *err);

/* ---------------------------------------------------------- fault injection */

/* tsr_fault_set(): the process-wide fault spec (above); every store opened
 * afterwards injects it, counting calls from zero again. NULL or "" turns fault
 * injection off. @return 0, or TSR_EINVAL for a spec that does not parse (the
 * spec in force stays). */
int tsr_fault_set(const char *spec, tsr_error *err);
/* tsr_fault_set_at(): the fault spec of the stores opened afterwards at
 * `location` or below it (a directory or s3://bucket/prefix), counting calls
 * from zero again; a store takes the spec of the closest location above it
 * that has one (tsr_fault_set's counts as the location above every other).
 * NULL or "" removes the location's spec. Tests give each store its own.
 * @return 0, TSR_EINVAL for a spec that does not parse or too many locations. */
int tsr_fault_set_at(const char *location, const char *spec, tsr_error *err);
/* tsr_fault_outage(): an outage of the object storage at `location` or below it
 * (NULL or "": all of it) in this process for the next `seconds`: every S3
 * request on an object there whose attempt ends in that time is taken as
 * answered "HTTP 503 SlowDown" (an injected outage) and goes through the retry
 * loop as that answer would. 0 ends it. tsr_fault_in_outage(): whether one is
 * in force for the object at `path` (the S3 client asks). */
void tsr_fault_outage(const char *location, double seconds);
int tsr_fault_in_outage(const char *path);
/* tsr_store_fault_wrap(): a store that injects the faults of `spec` into the
 * calls on `inner`, counting its own calls, and otherwise hands each call to
 * `inner`, which it owns from then on (closed with it; closed at once when this
 * fails). spec NULL: the process-wide spec, its calls counted together with
 * those of every store so wrapped (what tsr_store_open does); when none is set,
 * `inner` itself comes back. */
tsr_store *tsr_store_fault_wrap(tsr_store *inner, const char *spec, tsr_error *err);

/* ------------------------------------------------ for the implementations */

/* Bytes a write file is given between two datasync requests: about one stored
 * bf16 frame. In paired runs of `bench save` here, 2-4 MiB steps did better than
 * 8, 16 or 32 MiB ones. */
#define TSR_STORE_FLUSH_EVERY ((uint64_t)4 << 20)

/* tsr_store_ops create flag: a small object written through the page cache
 * (writes of any size at any offset; no O_DIRECT, no io_uring), as NAME.tmp of
 * an atomic put. */
#define TSR_CREATE_BUFFERED 1
/* tsr_store_ops create flag: NAME may exist, and is then written over in place
 * (not emptied first: a file in memory keeps its pages, which spares allocating
 * and zeroing them) and cut to its size at finish. Local files only; other stores
 * ignore it. */
#define TSR_CREATE_OVERWRITE 2
/* tsr_store_ops create flag: NAME must not exist: a local file is created
 * exclusively (O_EXCL); an object is refused when one of that name is there at
 * the create, and its upload completes with If-None-Match: * (one put meanwhile
 * fails the finish). A name taken: TSR_EBUSY, nothing touched. A fenced
 * writer's way never to write into a file it did not create (FORMAT.md 4.6). */
#define TSR_CREATE_NEW 4

/* Each store, read file and write file starts with its header below; an
 * implementation extends it (its own struct, with the header first). */
struct tsr_store {
    const tsr_store_ops *ops;
    char location[PATH_MAX];
};
struct tsr_rfile {
    const tsr_store_ops *ops;
    const uint8_t *map; /* the whole object mapped, read-only, where that is cheap (a
                           file in memory: tmpfs); NULL otherwise */
    uint64_t map_size;
};
struct tsr_wfile {
    const tsr_store_ops *ops;
    uint64_t unflushed; /* bytes submitted since the last datasync request */
};

/* The operations of one kind of store. Each takes the store, read file or write
 * file it was reached through; errors as in the calls above, which hand each call
 * to these. Every operation is set, except where NULL is said to mean something;
 * read and read_close are those of the read files open_read makes (a wrapping
 * store hands out the read files of the store it wraps, and sets them NULL). */
struct tsr_store_ops {
    void (*close)(tsr_store *s);
    /* reading */
    int (*open_read)(tsr_store *s, const char *name, tsr_rfile **out, uint64_t *size, tsr_error *err);
    int (*read)(tsr_rfile *f, void *buf, size_t len, uint64_t off, tsr_error *err);
    void (*read_close)(tsr_rfile *f);
    int (*get)(tsr_store *s, const char *name, size_t max, uint8_t **out, size_t *len, tsr_error *err);
    /* writing: create takes TSR_CREATE_* flags; finish is the fsync */
    int (*create)(tsr_store *s, const char *name, int flags, tsr_wfile **out, tsr_error *err);
    int (*write)(tsr_wfile *f, const void *buf, size_t len, uint64_t off, tsr_error *err);
    int (*submit)(tsr_wfile *f, const void *buf, size_t len, uint64_t off, tsr_error *err);
    int (*complete)(tsr_wfile *f, tsr_error *err);
    int (*release)(tsr_wfile *f, const void *buf, tsr_error *err);
    int (*busy)(tsr_wfile *f, const void *buf); /* NULL: never busy */
    void (*reserve)(tsr_wfile *f, uint64_t bytes);
    /* datasync: starts making the bytes written so far durable, without waiting,
     * unless that is already under way; a failure is reported by a later call on
     * the file. @return 1 when started, 0 when not. NULL: the store has none. */
    int (*datasync)(tsr_wfile *f);
    int (*finish)(tsr_wfile *f, uint64_t size, tsr_error *err);
    void (*abort)(tsr_wfile *f);
    /* committing. put: an atomic put by itself (S3: one PUT). NULL: the store
     * stages one (tsr_store_put_staged), with rename (replaces `to`) and sync
     * (makes the entry `name` durable: the directory's fsync), used only then.
     * flags: 0, or TSR_PUT_NEW: NAME must not exist (tsr_store_put_new). */
    int (*put)(tsr_store *s, const char *name, const void *buf, size_t len, int flags, tsr_error *err);
    int (*rename)(tsr_store *s, const char *from, const char *to, int flags, tsr_error *err);
    int (*sync)(tsr_store *s, const char *name, tsr_error *err);
    /* names */
    int (*exists)(tsr_store *s, const char *name, tsr_error *err);
    int (*remove)(tsr_store *s, const char *name, tsr_error *err);
    int (*list)(tsr_store *s, tsr_store_list_fn fn, void *user, tsr_error *err);
};

/* The two stores (tsr_store_open chooses). */
tsr_store *tsr_store_posix_open(const char *dir, int create, tsr_error *err);
tsr_store *tsr_store_s3_open(const char *location, int create, tsr_error *err);

/* tsr_store_put_staged(): an atomic put through s's own operations: NAME.tmp
 * created (TSR_CREATE_BUFFERED), written and finished, renamed to NAME, and the
 * entry synced; whatever fails, no NAME.tmp stays, and no NAME when the sync
 * failed. For stores without a put of their own. */
int tsr_store_put_staged(tsr_store *s, const char *name, const void *buf, size_t len, int flags, tsr_error *err);
/* put and rename flag: the name put must not exist (its object is never replaced). */
#define TSR_PUT_NEW 1

/* tsr_store_join(): "LOCATION/NAME" into out (the path of a name in messages
 * and fault filters). */
void tsr_store_join(const tsr_store *s, const char *name, char *out, size_t len);

#endif
