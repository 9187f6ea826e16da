/* tsr_ckpt.h: the public part of ckpt/: saving, the distributed engine, folder
 * locks, reading, synthetic content. Conventions: tessera.h. */
#ifndef TSR_CKPT_H
#define TSR_CKPT_H

#include <stddef.h>
#include <stdint.h>
#include "tsr_comm.h"
#include "tsr_reshard.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ saving */

typedef struct tsr_write_opts {
    int codec;          /* TSR_CODEC_*; default TSR_CODEC_AUTO: adaptive, each frame
                           encoded (bytegroup for floats, zstd otherwise) or stored
                           raw, so that neither the encoder nor the writer idles
                           (below); another value forces that codec */
    int level;          /* zstd level; default 1 */
    size_t frame_bytes; /* target raw bytes per frame; default 4 MiB */
    int threads;        /* encoder threads; default: the online cores */
    uint64_t expected_bytes; /* raw bytes this writer will store, if known (0: unknown):
                                the data file is preallocated, so that writes do not
                                extend it one by one */
    const char *spare_dir;   /* NULL, or a local folder of spare data files
                                (tsr_retire_step_dir): the data file of the same
                                name is moved from it and written over in place,
                                which in memory (/dev/shm) spares the kernel
                                allocating and zeroing its pages */
    double encode_share;     /* with TSR_CODEC_AUTO: 0 (default) learns the share of
                                frames to encode from who waits, the writer threads
                                or the encoder's; in (0, 1] pins it (tests) */
    int no_digests;          /* 1: the encode pass computes no digest share and no
                                statistics (FORMAT.md 4.4, 4.5), and the MANIFEST
                                records neither for the tensors this writer declares
                                ("not recorded": no load or verify can check them,
                                whatever the other writers computed). For measuring
                                what they cost (tessera bench save --digests), not
                                for checkpoints to keep */
    uint64_t epoch;          /* the launch's epoch (FORMAT.md 4.6; TSR_EPOCH_ENV), recorded
                                in the MANIFEST; a writer of an epoch older than the
                                folder's fence is refused before it creates its file
                                and before the commit ("fenced: ..."). 0: a writer
                                without one (a tool, the library by hand): it is
                                refused only a commit that readers would void.
                                With one, the writer never writes into a file it
                                did not create, nor commits over a MANIFEST */
    uint32_t id_stride;      /* with an epoch: the data file's name taken by a
                                leftover, the writer takes the file id this much
                                further (the engine: its world size, so that ranks
                                never meet); 0: the leftover is removed */
} tsr_write_opts;

/* tsr_write_opts_default(): the defaults above. */
tsr_write_opts tsr_write_opts_default(void);

/* A save: one writer's part of one checkpoint. In a distributed save every
 * writing rank opens a tsr_save on the same step directory with its own
 * `file_id` (its data file data-<file_id>.tsd) and the same `save_id`; each
 * rank calls tsr_save_finish() to get its table; rank 0 gathers the tables and
 * calls tsr_save_commit(). A single process does all of it with file_id 0. */
typedef struct tsr_save tsr_save;

/* tsr_save_begin(): creates `step_dir` (and its parent) if needed and the data
 * file data-<file_id>.tsd inside it. `save_id` (16 bytes) identifies this save
 * in every file it writes; NULL draws a random one (single-process use).
 * `opts` may be NULL for the defaults. */
tsr_save *tsr_save_begin(const char *step_dir, uint32_t file_id, const uint8_t *save_id,
                         const tsr_write_opts *opts, tsr_error *err);

/* tsr_save_tensor(): declares a global tensor. Every box written of it later
 * names it. `group` is a short name such as "model" or "optim" (NULL: "model");
 * `placement` may be NULL (replicated everywhere). Names: 1..255 bytes of
 * [A-Za-z0-9_.:+-], no empty dot-separated component, unique in the checkpoint. */
int tsr_save_tensor(tsr_save *s, const char *name, const char *group, int dtype,
                    uint32_t ndim, const uint64_t *shape, const tsr_placement *placement,
                    tsr_error *err);

/* tsr_save_tensor_digest(): the tensor's digest (FORMAT.md 4.4: tsr_digest_box)
 * is known to be `digest`, as when it is copied from another checkpoint. The
 * writer that commits records it where its writers' shares are missing (chunks
 * copied as they are stored add none), and refuses to commit where their sum
 * differs from it. TSR_ENOTFOUND if the tensor is not declared. */
int tsr_save_tensor_digest(tsr_save *s, const char *name, uint64_t digest, tsr_error *err);
/* tsr_save_tensor_stats(): the tensor's statistics (FORMAT.md 4.5, finished:
 * l2 the norm) are known to be *stats, as when it is copied from another
 * checkpoint. The committing writer records them where its writers' shares are
 * missing (chunks copied as they are stored add none); nothing for a dtype
 * without statistics. TSR_ENOTFOUND if the tensor is not declared. */
int tsr_save_tensor_stats(tsr_save *s, const char *name, const tsr_stats *stats, tsr_error *err);

/* tsr_save_box(): writes one box of a declared tensor: encodes it into frames on
 * the thread pool and appends them to the data file. `data` is the box's
 * memory. Returns once `data` is no longer needed. */
int tsr_save_box(tsr_save *s, const char *name, const tsr_box *box, const void *data,
                 tsr_error *err);

/* tsr_save_blob(): writes a named blob of bytes. `rank` is -1 for a global blob
 * or the rank that owns it (RNG state, ...). (name, rank) is unique. */
int tsr_save_blob(tsr_save *s, const char *name, int32_t rank, const void *data,
                  size_t size, tsr_error *err);

/* tsr_save_finish(): writes the last frames, fsyncs and closes the data file,
 * and returns this writer's table (declared tensors, chunks, frames, blobs) as
 * bytes in *table / *table_len (owned by `s`, valid until tsr_save_free). */
int tsr_save_finish(tsr_save *s, const uint8_t **table, size_t *table_len, tsr_error *err);

/* tsr_manifest_merge(): the MANIFEST's bytes (*bytes, malloc'ed) from the tables
 * of all writers (tables[i], from tsr_save_finish, of the save `save_id`):
 * parsed, merged, put in canonical order and validated (every tensor covered
 * exactly once). What rank 0 does at a commit before it writes the file. */
int tsr_manifest_merge(const uint8_t *const *tables, const size_t *table_lens, size_t n, const uint8_t save_id[16],
                       uint64_t step, const tsr_layout *layout, uint8_t **bytes, size_t *len, tsr_error *err);

/* tsr_save_commit(): merges the tables of all writers (tables[i] from writer i;
 * n == 0 uses this save's own table), checks that the chunks of every tensor
 * cover it exactly once, and writes the MANIFEST atomically: temporary name,
 * fsync, rename, fsync of the directory. Before it returns 0 nothing is
 * committed. `layout` may be NULL (1,1,1,1). */
int tsr_save_commit(tsr_save *s, const uint8_t *const *tables, const size_t *table_lens,
                    size_t n, uint64_t step, const tsr_layout *layout, tsr_error *err);

/* tsr_save_abort(): removes this writer's data file (and a temporary MANIFEST
 * it may have left). Safe after any failure; the save cannot be used after. */
void tsr_save_abort(tsr_save *s);

/* tsr_save_free(): releases the save (does not remove files). NULL is a no-op. */
void tsr_save_free(tsr_save *s);

/* ------------------------------------------------------------------ engine */

/* The distributed, asynchronous checkpoint engine (README, "Where things
 * happen": a save, a load). Every rank of a tsr_comm opens one
 * on the same ROOT; saves and loads are collective. */
typedef struct tsr_engine tsr_engine;
typedef struct tsr_ckpt tsr_ckpt; /* an open checkpoint (section "reading") */

typedef struct tsr_engine_opts {
    tsr_write_opts write; /* codec, level, frame size, threads (0: the node's cores
                             divided among the ranks mpirun placed on it) */
    uint32_t keep_latest; /* retention: keep the newest K committed checkpoints; 0 keeps all */
    int sync;             /* 1: tsr_engine_save returns after the commit */
    /* Archiving (rank 0, in the background): each committed checkpoint of a step
     * that is a multiple of archive_every is pushed to archive_url
     * (s3://bucket/prefix; NULL or "" for none), where the newest archive_keep are
     * kept (0 keeps all). Local retention leaves a checkpoint alone until it is
     * archived. A failed push is retried, then logged; it never fails a save. */
    const char *archive_url;
    uint64_t archive_every; /* 0 or 1: every checkpoint */
    uint32_t archive_keep;
    /* Seconds rank 0 waits for the other ranks' reports at the end of a save (1800
     * by default; 0 waits forever); the others wait twice as long for its
     * verdict. A rank that misses it fails the save on every rank ("rank 2 did not
     * report within 1800.0 s") instead of hanging it, and the engine then refuses
     * further saves until it is restarted (tsr_engine_broken). The environment
     * variable TSR_COMMIT_TIMEOUT (seconds) overrides it. */
    double commit_timeout_s;
    /* 1: rank 0 holds the lock of ROOT (tsr_folder_lock_take) for the engine's
     * life, and tsr_engine_new fails on every rank, naming the holder, when
     * another writer holds it. */
    int lock_root;
    /* 1: retention keeps the data files of the steps it removes in ROOT/spare
     * (tsr_retire_step_dir), one per rank, and the next saves write over them
     * (for checkpoints in memory: the local tier). Local roots only. */
    int recycle;
    /* 1: tsr_engine_save returns before this rank's boxes are copied: the copy
     * runs first in the background, overlapping what the caller does next, and
     * the caller calls tsr_engine_staged() before it changes the boxes' memory
     * (a training loop: before its next optimizer step; forward and backward only
     * read the weights). Blobs are copied before tsr_engine_save returns. */
    int overlap_staging;
    /* 1: a failed save is returned (tsr_engine_wait) but not logged: its owner
     * reports it (the local tier says a failure that repeats at every step once). */
    int quiet;
    /* 1: tsr_engine_load does not check the tensors' digests (FORMAT.md 4.4)
     * against the data it loaded. */
    int no_digest_check;
    /* 1: the engine writes ROOT as a launch (FORMAT.md 4.6): when write.epoch
     * is 0 (no TSR_EPOCH from a supervisor), rank 0 advances the fence of ROOT
     * in tsr_engine_new (tsr_fence_advance; after taking the lock with
     * lock_root), before anything is loaded or saved, and every rank writes
     * as that epoch (tsr_engine_epoch). */
    int fence;
} tsr_engine_opts;
tsr_engine_opts tsr_engine_opts_default(void);

/* A rank's state: the global tensors (the same list, in the same order, on every
 * rank), the boxes this rank holds with their memory, and blobs. A blob with rank
 * -1 is global and taken from rank 0; any other rank value is this rank's own. */
typedef struct tsr_state_box {
    uint32_t tensor; /* index into tensors */
    tsr_box box;
    void *data;      /* the box's memory, row-major */
    /* what data is (0: host). Device memory (TSR_MEM_CUDA in the CUDA build) is
     * staged through a pinned arena on streams of its own and loaded through host
     * buffers; the caller has finished (synchronized) the work that writes the
     * box before tsr_engine_save. */
    tsr_mem_kind mem;
} tsr_state_box;
typedef struct tsr_state_blob {
    const char *name;
    int32_t rank;
    const void *data;
    size_t size;
} tsr_state_blob;
typedef struct tsr_state {
    const tsr_tensor_decl *tensors;
    size_t n_tensors;
    const tsr_state_box *boxes;
    size_t n_boxes;
    const tsr_state_blob *blobs;
    size_t n_blobs;
    tsr_layout layout; /* recorded in the MANIFEST */
} tsr_state;

/* tsr_engine_new(): collective. `comm` must outlive the engine; the engine works
 * on a duplicate of it from its own thread. */
tsr_engine *tsr_engine_new(const char *root, tsr_comm *comm, const tsr_engine_opts *opts,
                           tsr_error *err);
/* tsr_engine_epoch(): the epoch the engine's saves record (FORMAT.md 4.6): its
 * write.epoch, or the one rank 0 advanced the fence to (opts.fence); 0: none. */
uint64_t tsr_engine_epoch(const tsr_engine *e);
/* tsr_engine_free(): waits for a save in flight and for the archiving of the
 * committed checkpoints, then releases everything. */
void tsr_engine_free(tsr_engine *e);

/* tsr_engine_save(): collective (every rank calls it, in the same order). Waits
 * for the previous save if one is in flight (tsr_engine_last_wait tells how
 * long), plans which rank writes which box (replicas once, balanced by bytes;
 * cached while the state's layout is unchanged), copies this rank's share into a
 * staging arena allocated once, and returns. While the cached plan holds, the
 * call exchanges nothing with the other ranks: the ranks agree that every state
 * is valid and every plan still good in the background, before anything is
 * written (an invalid state elsewhere then fails the save at tsr_engine_wait;
 * this rank's own invalid state fails the call). Encoding, writing (io_uring),
 * the commit of the MANIFEST by rank 0 and retention go on in the background.
 * The state's memory may change as soon as it returns. A failure of the
 * background work never touches earlier checkpoints and is reported by
 * tsr_engine_poll / tsr_engine_wait. Before it saves, rank 0
 * makes room in ROOT: retention (keep_latest) is applied to the committed steps
 * (the newest is always kept), and uncommitted step directories, left by
 * earlier failed or interrupted saves, are removed, so that a job whose saves
 * filled the disk saves again once it keeps fewer checkpoints. */
int tsr_engine_save(tsr_engine *e, uint64_t step, const tsr_state *st, tsr_error *err);
/* tsr_engine_save_dir(): the same, into the directory `dir` instead of
 * ROOT/step-<step> (retention still applies to ROOT). */
int tsr_engine_save_dir(tsr_engine *e, const char *dir, uint64_t step, const tsr_state *st,
                        tsr_error *err);
/* tsr_engine_staged(): with overlap_staging, waits until the last save's copy of
 * this rank's boxes is done (at once when it is, or without one in flight).
 * Not collective. */
void tsr_engine_staged(tsr_engine *e);
/* tsr_engine_reserve(): allocates (and populates) the staging arena for saves
 * of up to `bytes` of this rank's state now, so that the first save costs a
 * save's memcpy and no allocation. Not collective. */
int tsr_engine_reserve(tsr_engine *e, size_t bytes, tsr_error *err);
/* tsr_engine_prepare(): plans the saves of states laid out like st now
 * (collective: every rank, its own state), so that the first save finds its
 * plan made, like every later one of the same layout, and blocks the caller no
 * longer than they do; rank 0 makes room in ROOT now, as that save would,
 * and the staging arena is pinned for device state (tsr_engine_pin_seconds).
 * Optional: a save without a plan makes one. After tsr_engine_continue_from it
 * does nothing: the first save plans, and moves the abandoned steps aside. */
int tsr_engine_prepare(tsr_engine *e, const tsr_state *st, tsr_error *err);
/* tsr_engine_poll(): *done = 1 when no save is in flight; then returns the status
 * of the last save (0 if it committed). Not collective. */
int tsr_engine_poll(tsr_engine *e, int *done, tsr_error *err);
/* tsr_engine_wait(): blocks until no save is in flight; the last save's status. */
int tsr_engine_wait(tsr_engine *e, tsr_error *err);
/* Seconds the last tsr_engine_save waited for the previous save, and the seconds
 * it blocked the caller in all (wait, plan, staging). */
double tsr_engine_last_wait(const tsr_engine *e);
double tsr_engine_last_stall(const tsr_engine *e);
/* tsr_engine_pin_seconds(): the seconds spent pinning the staging arena for
 * the copies of device state (page-locking it: once per arena and device, in
 * tsr_engine_prepare where it is called, else in the first save of such a
 * state, whose blocked time then holds it). 0 for host state. */
double tsr_engine_pin_seconds(const tsr_engine *e);
/* tsr_engine_broken(): 1 once a commit exchange timed out on this rank or, as
 * the next save learns, on another: every later save fails, and the job should
 * stop and restart from its last committed checkpoint. */
int tsr_engine_broken(tsr_engine *e);

/* tsr_engine_continue_from(): the state was loaded from `step`, and the job goes
 * on from there: the steps after it are an abandoned future. The first save
 * after this call moves every committed step directory of ROOT after `step`
 * aside (renamed step-N.abandoned-<UTC time>, never deleted; logged), so that
 * the latest step and retention see only the new future. Not collective. */
void tsr_engine_continue_from(tsr_engine *e, uint64_t step);

/* tsr_engine_load(): collective. Loads the checkpoint in step_dir (NULL: the
 * newest committed one under ROOT; rank 0's MANIFEST is used, and each rank
 * reads the data files at its own step_dir, which may be a copy of the same
 * checkpoint on its node) into the boxes of `st`, in whatever layout
 * they are: each distinct box is read by one of the ranks that need it (only the
 * frames that overlap it, checksums checked) and sent to the others. Tensors are
 * matched by name; a tensor missing from the checkpoint or of another dtype or
 * shape is an error naming it, found before any data is read. Once loaded, every
 * tensor whose digest the MANIFEST records and whose every element some rank
 * loaded is checked: the ranks' shares of the digest (each computed from the
 * bytes it holds) are summed and compared with the MANIFEST's (TSR_ECORRUPT
 * naming the tensor and both values), unless opts.no_digest_check; a tensor
 * loaded only in part is not checked. On success, and if
 * ck_out is not NULL, *ck_out is the open checkpoint (for its blobs and step);
 * close it with tsr_ckpt_close. TSR_ENOTFOUND when ROOT holds no checkpoint. */
int tsr_engine_load(tsr_engine *e, const char *step_dir, const tsr_state *st, tsr_ckpt **ck_out,
                    tsr_error *err);

/* Every function below that takes a directory (root or step directory) also
 * takes an object-store location, s3://bucket/prefix. */

/* tsr_list_steps(): the step directories under root, sorted by step, into *out
 * (malloc'ed; free() it) and *n. @return 0, or TSR_ENOTFOUND if root cannot be
 * read. */
typedef struct tsr_step_info {
    uint64_t step;
    int committed; /* holds a MANIFEST (not validated) */
    int poisoned;  /* committed, and its MANIFEST's header marks it poisoned (tsr_step_poisoned) */
    char name[64]; /* the directory's name */
    uint64_t epoch; /* committed: the epoch its MANIFEST's header records (0: none) */
    int fenced;     /* committed, but by a fenced writer after its fence (FORMAT.md 4.6):
                       not a valid commit; no resume, rollback or retention counts it */
} tsr_step_info;
int tsr_list_steps(const char *root, tsr_step_info **out, size_t *n);

/* tsr_step_poisoned(): 1 if the MANIFEST of step_dir marks the checkpoint
 * poisoned (FORMAT.md 4.5: a tensor holds a NaN or an infinity), read from the
 * header alone (its first 64 bytes: one small read, also on object storage);
 * 0 if it does not, or there is no MANIFEST with a valid header to say so. */
int tsr_step_poisoned(const char *step_dir);

/* tsr_latest_step(): the newest committed step under root that is not
 * poisoned or fenced (into *step and, if dir is not NULL, its path): the one a
 * job resumes from; each fenced step newer than it is logged, named, as passed
 * over. @return 0, or TSR_ENOTFOUND. */
int tsr_latest_step(const char *root, uint64_t *step, char *dir, size_t len);
/* tsr_latest_step_before(): the same among the steps below `before`: the
 * step a rollback goes back to. */
int tsr_latest_step_before(const char *root, uint64_t before, uint64_t *step, char *dir, size_t len);

/* tsr_retention_keep(): which of the n steps of a listing (tsr_list_steps,
 * sorted by step) retention keeps of the committed ones, into keep[i] (1:
 * kept; uncommitted and fenced steps are 0, retention decides on the former by
 * itself and removes the latter): the
 * newest `k` (every one for k = 0) and, when those are all poisoned, the
 * newest clean one besides, so that a resume always has one. */
void tsr_retention_keep(const tsr_step_info *v, size_t n, uint32_t k, int *keep);

/* tsr_remove_step_dir(): removes a step directory, its MANIFEST first; under an
 * s3:// prefix with nothing stored, TSR_ENOTFOUND ("no such checkpoint"). */
int tsr_remove_step_dir(const char *dir, tsr_error *err);

/* tsr_retire_step_dir(): removes a local step directory as tsr_remove_step_dir
 * does, but first moves its data files into the folder `spare` (created if
 * missing; a spare of the same name is replaced), for a later save to write over
 * (tsr_write_opts.spare_dir). */
int tsr_retire_step_dir(const char *dir, const char *spare, tsr_error *err);

/* tsr_list_abandoned_steps(): the step directories under root that a rewind
 * moved aside (named step-N.abandoned-<time>, see tsr_engine_continue_from),
 * sorted by step, like tsr_list_steps. tsr_list_steps, tsr_latest_step and
 * retention never see them. */
int tsr_list_abandoned_steps(const char *root, tsr_step_info **out, size_t *n);

/* One writer per checkpoint folder. tsr_folder_lock_take(): with `create`, takes
 * an exclusive lock on the folder `dir` (made if missing) until
 * tsr_folder_lock_release: flock(2) on dir/LOCK, a file that names the holder
 * ("host H, pid P, started T"); the lock dies with its process. On object
 * storage (s3://) it puts the lease object dir/LOCK instead, removed on release
 * (a holder that died leaves it: remove it by hand). Without `create`, only
 * checks that nobody holds it (*out stays NULL). @return 0, or TSR_EBUSY with a
 * message that names the holder. */
typedef struct tsr_folder_lock tsr_folder_lock;
int tsr_folder_lock_take(const char *dir, int create, tsr_folder_lock **out, tsr_error *err);
/* tsr_folder_lock_for_ckpt(): the lock for writing the checkpoint directory
 * ckpt_dir: its parent folder's lock, taken when ckpt_dir is named step-N,
 * else only checked. */
int tsr_folder_lock_for_ckpt(const char *ckpt_dir, tsr_folder_lock **out, tsr_error *err);
void tsr_folder_lock_release(tsr_folder_lock *l);

/* ----------------------------------------------------------------- fencing */

/* Epochs (FORMAT.md 4.6): each launch of a job writes its checkpoint folder as
 * one epoch, a number that only grows for the folder, so that the ranks of an
 * earlier launch still running (a host cut off by a network partition) can
 * never commit over, or damage, the checkpoints of a later one. The supervisor
 * advances the folder's fence before each launch and gives the ranks the epoch
 * in the environment variable TSR_EPOCH_ENV (decimal); a trainer started
 * without it advances the fence itself (rank 0, before any load or save). */
#define TSR_EPOCH_ENV "TSR_EPOCH"

/* tsr_fence_advance(): raises the fence of the checkpoint folder `root` (a
 * path or s3://bucket/prefix, made if missing): writes ROOT/FENCE atomically
 * with a new record, the epoch one above both the fence's (1 when none) and
 * every epoch a MANIFEST there records, and the newest step committed (and
 * valid) now; the new epoch into *epoch. From then on writers of older epochs
 * are refused, and what they commit regardless is void. @return 0, TSR_ECORRUPT
 * for a damaged FENCE (naming it and the reason), or the store's error. */
int tsr_fence_advance(const char *root, uint64_t *epoch, tsr_error *err);

/* ----------------------------------------------------------- push and pull */

/* Copies of committed checkpoints between a local folder and object storage
 * (s3://bucket/prefix; credentials and settings from the environment, as the
 * tessera command takes them: `tessera push --help`). What a copy did, in all or
 * (tsr_copy_opts.step_done) for one checkpoint: */
typedef struct tsr_copy_stats {
    uint64_t steps;               /* checkpoints copied */
    uint64_t bytes;               /* bytes sent or received (objects found complete included) */
    double seconds;               /* the copies' time, from tsr_copy_opts.started on */
    uint64_t parts_sent;          /* push: parts (and single PUTs) sent */
    uint64_t parts_resumed;       /* push: parts of interrupted uploads found uploaded */
    uint64_t objects_skipped;     /* push: checkpoints with an object found complete, not sent again */
    uint64_t files_reencoded;     /* push: data files whose raw frames were encoded on the way */
    uint64_t frames_encoded;      /* push: those frames */
    uint64_t reencoded_bytes_in;  /* push: the bytes of those files before ... */
    uint64_t reencoded_bytes_out; /* ... and after */
} tsr_copy_stats;

/* What a copy reports as it goes, for a progress display: every member may be
 * NULL (a zeroed struct, or NULL for the options, reports nothing), and each is
 * called from the thread that called tsr_push or tsr_pull. */
typedef struct tsr_copy_opts {
    int threads; /* push: encoder threads for raw frames; <= 0: the online cores */
    void *user;  /* handed to each call below */
    /* a step of a root that is left out, and why ("ROOT/step-N: not committed,
     * skipped"), while the steps are listed */
    void (*skipped)(void *user, const char *msg);
    /* the copies begin: the bytes of the files of every step to copy */
    void (*started)(void *user, uint64_t total_bytes);
    /* n more bytes sent or received */
    void (*bytes)(void *user, uint64_t n);
    /* the checkpoint `from` is copied to `to`; *step: that checkpoint's part */
    void (*step_done)(void *user, const char *from, const char *to, const tsr_copy_stats *step);
} tsr_copy_opts;

/* tsr_push(): uploads the committed checkpoint src (a local step directory, to
 * dst_url/<its name>), or every committed step of the local root src (the others
 * are skipped, said to opts->skipped), to the root dst_url = s3://bucket/prefix.
 * Every step's MANIFEST is validated before any request; refused (TSR_EBUSY,
 * naming the holder) while a writer's lease is on dst_url. Each step goes as
 * the archiver pushes it: data files first, raw frames encoded on the way, the
 * MANIFEST last, so that a push cut short leaves no committed copy; objects
 * complete at dst_url are not sent again and interrupted uploads are resumed,
 * so that the same push run again finishes it. *out (may be NULL) gets what was
 * done. @return 0 or the error of the first step that failed, naming it. */
int tsr_push(const char *src, const char *dst_url, const tsr_copy_opts *opts, tsr_copy_stats *out,
             tsr_error *err);
/* tsr_pull(): downloads the committed checkpoint src_url (s3://bucket/prefix/
 * step-N) into the local folder dst, or every committed step of the root src_url
 * into dst/step-N: data files first, the MANIFEST last, each object's content
 * hash checked when tessera uploaded it. The S3 location is read first, so that
 * bad credentials or a missing bucket are reported with the server's reason.
 * dst has one writer: refused (TSR_EBUSY, naming the holder) while another holds
 * its lock (the root's, for a step directory dst), and held while the copy
 * runs. A step that dst holds committed already is refused (TSR_EINVAL). */
int tsr_pull(const char *src_url, const char *dst, const tsr_copy_opts *opts, tsr_copy_stats *out,
             tsr_error *err);

/* ----------------------------------------------------------------- reading */

typedef struct tsr_tensor_info {
    const char *name;   /* owned by the tsr_ckpt */
    const char *group;
    int dtype;
    uint32_t ndim;
    uint64_t shape[TSR_MAX_DIMS];
    tsr_placement placement;
    uint32_t n_chunks, first_chunk; /* its chunks: first_chunk .. + n_chunks (tsr_ckpt_chunk) */
    uint64_t raw_bytes;    /* volume * element size */
    uint64_t stored_bytes; /* sum of the stored sizes of its frames */
} tsr_tensor_info;

typedef struct tsr_chunk_info {
    uint32_t tensor;   /* tensor index */
    uint32_t file_id;  /* data-<file_id>.tsd */
    tsr_box box;       /* in global indices */
    uint32_t n_frames;
    uint32_t split_dim;   /* frames cut along this dim ... */
    uint64_t frame_rows;  /* ... this many indices each (FORMAT.md, "Frames") */
    uint32_t first_frame; /* index of its first frame */
} tsr_chunk_info;

typedef struct tsr_frame_info {
    uint32_t file_id;
    uint64_t offset, stored_size, raw_size;
    uint64_t raw_hash, stored_hash; /* XXH3-64 */
    int codec;                      /* TSR_CODEC_RAW/ZSTD/BYTEGROUP */
} tsr_frame_info;

typedef struct tsr_blob_info {
    const char *name;
    int32_t rank; /* -1: global */
    uint64_t size;
    uint32_t file_id;
    uint32_t n_frames, first_frame;
} tsr_blob_info;

typedef struct tsr_file_info {
    uint32_t file_id;
    uint64_t size;
} tsr_file_info;

/* tsr_ckpt_open(): reads and validates the MANIFEST of a committed checkpoint
 * directory. Data files are opened on first use. A step directory of a root
 * whose MANIFEST a fenced writer committed after its fence (FORMAT.md 4.6) is
 * refused (TSR_EBUSY, "fenced: ..." naming it, both epochs and the fence's
 * step); so is it by tsr_ckpt_read_manifest. */
tsr_ckpt *tsr_ckpt_open(const char *step_dir, tsr_error *err);
void tsr_ckpt_close(tsr_ckpt *ck); /* NULL is a no-op */
/* tsr_ckpt_read_manifest(): the MANIFEST bytes of step_dir (malloc'ed), unparsed;
 * tsr_ckpt_open_manifest(): opens step_dir with MANIFEST bytes read elsewhere (by
 * one rank, broadcast to the others). */
int tsr_ckpt_read_manifest(const char *step_dir, uint8_t **buf, size_t *len, tsr_error *err);
tsr_ckpt *tsr_ckpt_open_manifest(const char *step_dir, const uint8_t *buf, size_t len, tsr_error *err);

uint64_t tsr_ckpt_step(const tsr_ckpt *ck);
/* tsr_ckpt_epoch(): the epoch of the launch that wrote it (FORMAT.md 4.6); 0:
 * none (a writer without one, files before format 1.5). */
uint64_t tsr_ckpt_epoch(const tsr_ckpt *ck);
/* tsr_ckpt_version(): the MANIFEST's format version (major << 16 | minor). */
uint32_t tsr_ckpt_version(const tsr_ckpt *ck);
const uint8_t *tsr_ckpt_save_id(const tsr_ckpt *ck); /* 16 bytes */
tsr_layout tsr_ckpt_layout(const tsr_ckpt *ck);
const char *tsr_ckpt_dir(const tsr_ckpt *ck);

size_t tsr_ckpt_n_tensors(const tsr_ckpt *ck);
size_t tsr_ckpt_n_chunks(const tsr_ckpt *ck);
size_t tsr_ckpt_n_frames(const tsr_ckpt *ck);
size_t tsr_ckpt_n_blobs(const tsr_ckpt *ck);
size_t tsr_ckpt_n_files(const tsr_ckpt *ck);

/* Table accessors: index < count, else TSR_EINVAL. */
int tsr_ckpt_tensor(const tsr_ckpt *ck, size_t i, tsr_tensor_info *out);
int tsr_ckpt_chunk(const tsr_ckpt *ck, size_t i, tsr_chunk_info *out);
int tsr_ckpt_frame(const tsr_ckpt *ck, size_t i, tsr_frame_info *out);
int tsr_ckpt_blob(const tsr_ckpt *ck, size_t i, tsr_blob_info *out);
int tsr_ckpt_file(const tsr_ckpt *ck, size_t i, tsr_file_info *out);

/* tsr_ckpt_tensor_digest(): 1 and *digest when the MANIFEST records tensor i's
 * digest (FORMAT.md 4.4), 0 when it does not (files before format 1.2),
 * TSR_EINVAL for no such tensor. */
int tsr_ckpt_tensor_digest(const tsr_ckpt *ck, size_t i, uint64_t *digest);
/* tsr_ckpt_tensor_stats(): 1 and *out when the MANIFEST records tensor i's
 * statistics (FORMAT.md 4.5: min, max, L2 norm, non-finite count), 0 when it
 * does not (files before format 1.3, dtypes without statistics), TSR_EINVAL
 * for no such tensor. */
int tsr_ckpt_tensor_stats(const tsr_ckpt *ck, size_t i, tsr_stats *out);
/* tsr_ckpt_poisoned(): 1 if the checkpoint is marked poisoned (FORMAT.md 4.5:
 * a tensor holds a non-finite element), else 0. */
int tsr_ckpt_poisoned(const tsr_ckpt *ck);

/* tsr_ckpt_find(): the index of the tensor named `name`, or -1. O(log n). */
long tsr_ckpt_find(const tsr_ckpt *ck, const char *name);
/* tsr_ckpt_find_blob(): the index of blob (name, rank), or -1. */
long tsr_ckpt_find_blob(const tsr_ckpt *ck, const char *name, int32_t rank);

/* tsr_ckpt_read(): fills `dst` (the memory of `box`, row-major) with the
 * elements of tensor `tensor` inside `box`, which must lie inside the tensor's
 * shape. Reads and decodes only the frames that overlap the box, checking the
 * checksums of each: tsr_ckpt_read_many of that one read, on the calling
 * thread. Thread-safe on one tsr_ckpt. */
int tsr_ckpt_read(tsr_ckpt *ck, size_t tensor, const tsr_box *box, void *dst,
                  tsr_error *err);

/* One read of tsr_ckpt_read_many: box `box` of tensor `tensor` (inside its
 * shape) into dst, the memory of the box (row-major); with blob = 1, all of
 * blob `tensor` (tsr_ckpt_blob's index) into dst, its size in bytes (box not
 * used). */
typedef struct tsr_read_req {
    size_t tensor;
    tsr_box box;
    void *dst;
    int blob;
} tsr_read_req;

/* tsr_ckpt_read_many(): the n reads, side by side on `threads` threads: the
 * frames they need (only those), each read and decoded once, neighbouring ones
 * of a data file read at once, up to 8 MiB (one GET from a bucket instead of
 * one a frame). With check_digest, a read of a whole tensor whose MANIFEST
 * records its digest (FORMAT.md 4.4) is held to it, each frame's share taken
 * while in cache, in place of the frames' checksums (the digest proves the
 * bytes end to end); a mismatch reads that tensor again with every checksum, to
 * name a frame stored or decoded wrong, else fails TSR_ECORRUPT naming the
 * tensor and both digests. Every other read (a blob's too) is checked by the
 * frames' checksums, as tsr_ckpt_read. Thread-safe on one tsr_ckpt. */
int tsr_ckpt_read_many(tsr_ckpt *ck, const tsr_read_req *reqs, size_t n, int check_digest, int threads,
                       tsr_error *err);
/* tsr_ckpt_read_many_held(): the same reads for a caller that checks digests
 * itself (the engine's load, where ranks read parts of a tensor): a read with
 * held[q] = 1 (a tensor's box) gets no frame checksums (of the stored bytes nor
 * of the decoded ones; their zero padding is still checked) and share[q] = its
 * digest share (FORMAT.md 4.4, tsr_digest_region; without the key) of what
 * landed in its dst, taken slab by slab right after each copy, while in cache,
 * as the memory of share_box[q] (the extents of its box; share_box NULL: the
 * box itself), so that data landed in the wrong place gives another share. The
 * caller's digest check of the whole tensor then proves the bytes end to end.
 * Reads without held are checked by the checksums (share[q] = 0). held and
 * share_box may be NULL; share is needed with held. */
int tsr_ckpt_read_many_held(tsr_ckpt *ck, const tsr_read_req *reqs, size_t n, const uint8_t *held,
                            const tsr_box *share_box, uint64_t *share, int threads, tsr_error *err);
/* tsr_ckpt_read_whole(): all of tensor `tensor` into dst (row-major), held to
 * its digest where the MANIFEST records one: tsr_ckpt_read_many of one read
 * with check_digest, on the calling thread. */
int tsr_ckpt_read_whole(tsr_ckpt *ck, size_t tensor, void *dst, tsr_error *err);

/* tsr_ckpt_read_chunk(): reads `region` of stored chunk `chunk` into dst, the
 * memory of dst_box; region must lie inside both. Decodes only the frames of the
 * chunk that overlap the region, checking their checksums. Many boxes at once:
 * tsr_ckpt_read_many (neighbouring frames in one read). Thread-safe. */
int tsr_ckpt_read_chunk(tsr_ckpt *ck, size_t chunk, const tsr_box *region, void *dst,
                        const tsr_box *dst_box, tsr_error *err);

/* One read of a read plan: the part `region` of needed box `need` that lies in
 * one frame of one stored chunk. tsr_ckpt_read_chunk(ck, chunk, &region, ...)
 * reads it, decoding that frame only. */
typedef struct tsr_read_piece {
    uint32_t need;  /* index into the needed boxes */
    uint32_t chunk; /* the stored chunk (tsr_ckpt_chunk) */
    uint32_t frame; /* the frame it decodes (tsr_ckpt_frame: file, offset, sizes) */
    tsr_box region; /* global indices: inside the needed box, the chunk and the frame */
} tsr_read_piece;

/* tsr_ckpt_plan_read(): the reads that fill needed boxes need[0..n_need) of
 * tensor `tensor` (inside its shape; they may overlap each other): each needed
 * box against the stored chunks through tsr_plan_overlaps, every overlap cut
 * along the chunk's frames, so that each piece decodes one frame and pieces
 * spread over threads share the work frame by frame. *out (malloc'ed, free it)
 * receives *n_out pieces sorted by (need, chunk, frame); a committed checkpoint's
 * chunks cover each tensor, so the pieces of a needed box cover it.
 * @return 0, TSR_EINVAL (no such tensor, a box of other dims or outside the
 * shape) or TSR_ENOMEM. */
int tsr_ckpt_plan_read(const tsr_ckpt *ck, size_t tensor, const tsr_box *need, size_t n_need,
                       tsr_read_piece **out, size_t *n_out, tsr_error *err);

/* tsr_ckpt_read_stored(): frame `i` as it is stored (tsr_frame_info: its
 * stored_size bytes then zero padding to a multiple of TSR_ALIGN, all copied
 * into dst, which must hold that much), its stored checksum and padding
 * checked; not decoded. Thread-safe. */
int tsr_ckpt_read_stored(tsr_ckpt *ck, size_t i, void *dst, tsr_error *err);
/* tsr_ckpt_check_frame(): holds `stored` (stored_size bytes, from anywhere: the
 * frame's file, a copy of it, another checkpoint) to frame `i`'s record, as a
 * reader holds the bytes it reads: their stored checksum, their decoding with the
 * frame's codec (for its tensor's dtype) into exactly raw_size bytes at `raw`,
 * and the raw checksum of those. @return 0, TSR_ECORRUPT naming the frame, its
 * file and its tensor or blob, or TSR_ENOMEM. Thread-safe. */
int tsr_ckpt_check_frame(tsr_ckpt *ck, size_t i, const void *stored, void *raw, tsr_error *err);
/* tsr_ckpt_frame_owner(): "tensor NAME" or "blob NAME (rank R)": what frame `i`
 * holds a piece of, into buf (messages). @return 0, or TSR_EINVAL (no frame i). */
int tsr_ckpt_frame_owner(const tsr_ckpt *ck, size_t i, char *buf, size_t len);
/* tsr_ckpt_read_blob(): copies blob `i` (size bytes) into dst: tsr_ckpt_read_many
 * of that blob, on the calling thread. Thread-safe. */
int tsr_ckpt_read_blob(tsr_ckpt *ck, size_t i, void *dst, tsr_error *err);

/* tsr_ckpt_verify(): checks every rule of FORMAT.md that the MANIFEST alone
 * cannot show: every data file's size and header, every frame's checksums and
 * decoding, every padding byte, and each recorded digest (FORMAT.md 4.4)
 * against the one its decoded frames add up to. Calls `problem` once per problem found with a
 * message naming file, tensor and frame (it may be NULL).
 * @return the number of problems (0: the checkpoint is sound), or a negative
 * tsr_status if the check itself could not run. */
typedef void (*tsr_problem_fn)(void *user, const char *msg);
long tsr_ckpt_verify(tsr_ckpt *ck, tsr_problem_fn problem, void *user, int threads,
                     tsr_error *err);

/* tsr_ckpt_is_committed(): 1 if `step_dir` holds a MANIFEST file, else 0
 * (it does not validate it; tsr_ckpt_open does). */
int tsr_ckpt_is_committed(const char *step_dir);

/* tsr_step_dir_name(): writes "step-%08llu" into buf. */
void tsr_step_dir_name(uint64_t step, char *buf, size_t len);
/* tsr_parse_step_dir(): 1 and *step if `name` is a step directory name. */
int tsr_parse_step_dir(const char *name, uint64_t *step);

/* --------------------------------------------------------------- synthetic */

/* The synthetic content used by tests and benchmarks: each element is a
 * deterministic function of the tensor name and its global row-major element
 * index. Float dtypes get Gaussian-like values with standard deviation 0.02;
 * integer dtypes get a hash of the index; bool gets 0/1. */

/* tsr_synth_fill(): fills the memory of `box` of tensor (name, dtype, shape). */
void tsr_synth_fill(const char *name, int dtype, uint32_t ndim, const uint64_t *shape,
                    const tsr_box *box, void *dst);
/* tsr_synth_check(): compares the memory of `box` with the synthetic content,
 * bit for bit. @return 0 if every element matches; otherwise 1, with the global
 * index (per dim) of the first wrong element in bad_index (may be NULL). */
int tsr_synth_check(const char *name, int dtype, uint32_t ndim, const uint64_t *shape,
                    const tsr_box *box, const void *data, uint64_t *bad_index);

#ifdef __cplusplus
}
#endif
#endif
