/* compact.h: a committed checkpoint with its raw frames encoded, for what is
 * kept. Internal (the push, the archiver and `tessera ckpt compact` use it).
 *
 * A save under load stores frames raw (codec auto: the writer is kept busy, the
 * encoder's cores are the job's); what is kept afterwards need not be. Each
 * raw frame is encoded the way a save with codec auto encodes one (the frame
 * codec's choice: bytegroup for f32/f16/bf16, zstd otherwise; kept raw where
 * that is not smaller); frames already encoded are copied as they are stored.
 * The chunks, their frame geometry, every raw_size and raw_hash, the blobs,
 * the step, the save id and the layout stay; only the frames' offsets, stored
 * sizes, stored hashes and codecs, and the files' sizes change. */
#ifndef TSR_COMPACT_H
#define TSR_COMPACT_H

#include "store.h"
#include "tsr_ckpt.h"

typedef struct tsr_recode_stats {
    uint64_t files;     /* data files rewritten */
    uint64_t frames;    /* raw frames stored encoded */
    uint64_t bytes_in;  /* sizes of the rewritten files before ... */
    uint64_t bytes_out; /* ... and after */
} tsr_recode_stats;

/* The rewriting of one committed checkpoint: its MANIFEST read once, its data
 * files rewritten one at a time into any store, then the new MANIFEST. Memory:
 * two frames per thread (their stored and encoded bytes), whatever the size of
 * the checkpoint. */
typedef struct tsr_recode tsr_recode;
/* tsr_recode_open(): the committed checkpoint in the local step_dir, encoded on
 * `threads` threads (<= 0: the online cores). */
tsr_recode *tsr_recode_open(const char *step_dir, int threads, tsr_error *err);
void tsr_recode_close(tsr_recode *r); /* NULL is a no-op */
/* tsr_recode_progress(): fn(user, bytes) is called with the bytes of the source
 * files consumed as a file is rewritten. */
void tsr_recode_progress(tsr_recode *r, void (*fn)(void *user, uint64_t bytes), void *user);
/* tsr_recode_ckpt(): the source checkpoint, open (its files, in the order
 * tsr_ckpt_file gives them, are the files i below). */
tsr_ckpt *tsr_recode_ckpt(const tsr_recode *r);
/* tsr_recode_file_raw(): 1 when data file i holds raw frames of more than
 * TSR_ALIGN bytes (only such a file can get smaller: a frame takes whole blocks
 * of the file), else 0. A file rewritten has every raw frame encoded where that
 * is smaller, small ones too. */
int tsr_recode_file_raw(const tsr_recode *r, size_t i);
/* tsr_recode_file(): writes data file i, its raw frames encoded, as a new
 * object of the same name in dst (in order, from aligned buffers: a folder or
 * an S3 prefix), made durable (the write file's finish); on failure nothing of
 * it is left in dst. Each frame's stored bytes are checked (stored hash,
 * padding) as they are read. */
int tsr_recode_file(tsr_recode *r, size_t i, tsr_store *dst, tsr_error *err);
/* tsr_recode_changed(): 1 once a rewritten file holds a frame stored otherwise
 * than in the source (then the MANIFEST differs). */
int tsr_recode_changed(const tsr_recode *r);
/* tsr_recode_manifest(): the MANIFEST for the files rewritten so far (the others
 * as they are): the source's bytes when nothing changed, else the records
 * updated, validated and encoded (owned by r, valid until tsr_recode_close). */
int tsr_recode_manifest(tsr_recode *r, const uint8_t **bytes, size_t *len, tsr_error *err);
void tsr_recode_stats_get(const tsr_recode *r, tsr_recode_stats *st);

/* tsr_ckpt_compact(): re-encodes the raw frames of the committed checkpoint in
 * the local step_dir in place, atomically. Holds the lock of its folder
 * (tsr_folder_lock_for_ckpt: a running job or a pull into it refuses it, and
 * it refuses them) and a flock of the parent folder (one compact at a time
 * there, also of a folder that is not a step, whose lock is only checked).
 * The new data files (the others hard-linked) and MANIFEST go into the
 * sibling folder STEP_DIR.compact, made durable, which is then
 * exchanged with step_dir in one rename (renameat2 RENAME_EXCHANGE) and the
 * parent folder synced; the old files, now in STEP_DIR.compact, are removed.
 * A crash at any point leaves step_dir the old or the new complete checkpoint,
 * and at most a STEP_DIR.compact (invisible to listings and retention), which
 * the next compact of the step removes first. A checkpoint without raw frames,
 * or whose raw frames do not get smaller, is left as it is (*st: files 0).
 * A reader that loads step_dir meanwhile may fail on a checksum, never read
 * wrong values. */
int tsr_ckpt_compact(const char *step_dir, int threads, tsr_recode_stats *st, tsr_error *err);

#endif
