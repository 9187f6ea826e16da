/* repair.h: the damaged data files of a committed checkpoint rewritten from
 * other copies of their frames. Internal (`tessera ckpt verify --repair`).
 *
 * A frame is found in a source (another checkpoint folder: an older step, a
 * local-tier snapshot, a partner copy; or an archived checkpoint in object
 * storage, s3://bucket/prefix/step-N) by its raw checksum and raw size. The
 * MANIFEST of the damaged checkpoint does not change (but for one that fails
 * its own checks: below): a frame is repaired only
 * with stored bytes that its own record accepts (stored checksum, decoding with
 * its codec, raw checksum): the source's stored bytes when they are the same
 * (same stored checksum), else the source's raw bytes (decoded and checked
 * against the source's record) stored as the record says: as they are for a
 * raw frame, else encoded with the record's codec at a save's zstd level, kept
 * only when that gives the record's stored checksum. A frame that no source
 * holds in such a form is lost.
 *
 * Each damaged data file (missing, of another size, a header, padding or frame
 * that fails its check) is rewritten whole beside the old one, as
 * data-N.tsd.repair: the header made again from the MANIFEST, the sound frames
 * copied from the old file (checked again), the damaged ones from the sources,
 * padding zero; fsynced, then read back and checked completely (size, header,
 * padding, every frame's stored and raw checksums), and only then renamed into
 * place, the directory fsynced. The old file is kept aside as data-N.tsd.damaged
 * (hard-linked before the rename, which replaces an earlier one; readers ignore
 * it; remove it by hand). A file with any frame lost is left exactly as it is.
 * A crash leaves each file old or new, and at most a data-N.tsd.repair (ignored
 * by readers, written over by the next repair).
 *
 * A MANIFEST that fails its own checks (its trailer's checksum, a rule of the
 * format; a missing one means a save never committed, and is left so) is
 * replaced first by the first source's that opens, records the sizes of the
 * data files here and whose save id they carry (a copy of the same save stored
 * alike: a partner copy, a copy of the folder, an archive that kept the stored
 * bytes), written atomically and durably over it, the damaged one kept as
 * MANIFEST.damaged; then the data files are checked against it as above. */
#ifndef TSR_REPAIR_H
#define TSR_REPAIR_H

#include <stddef.h>
#include <stdint.h>

#include "tsr_ckpt.h"

/* One damaged frame, repaired or lost. */
typedef struct tsr_repair_frame {
    uint32_t file_id;
    uint32_t frame;      /* its index in the MANIFEST (ckpt info --frames) */
    uint64_t offset;     /* in its data file */
    const char *owner;   /* "tensor NAME" or "blob NAME (rank R)" */
    const char *problem; /* why it failed its check */
    const char *source;  /* the location it was repaired from; NULL: lost */
    int reencoded;       /* 1: the source's raw bytes stored anew, 0: its stored bytes copied */
} tsr_repair_frame;

/* One data file, once checked (and repaired); tsr_repair_opts.file gets it
 * before .frame gets its damaged frames. */
typedef struct tsr_repair_file {
    uint32_t file_id;
    const char *path;
    const char *problem; /* NULL, or the first problem besides its frames: missing, size, header, padding */
    uint64_t frames;     /* its frames */
    uint64_t damaged;    /* frames that fail their check */
    uint64_t repaired;   /* of those, the frames a source holds (written only when rewritten) */
    uint64_t lost;       /* of those, the frames no source holds: then the file is left as it is */
    int rewritten;       /* 1: the repaired file is in place */
    int kept_aside;      /* 1: the damaged file is kept as PATH.damaged */
    const char *error;   /* frames lost (or the rewrite failed): what, naming the file, tensors, blobs, frames */
} tsr_repair_file;

typedef struct tsr_repair_opts {
    const char *const *sources; /* checkpoint locations, searched in this order */
    size_t n_sources;
    void *user; /* handed to each call below; each member may be NULL */
    void (*frame)(void *user, const tsr_repair_frame *f);
    void (*file)(void *user, const tsr_repair_file *f);
    /* a source that cannot be opened (skipped), with the reason */
    void (*source_failed)(void *user, const char *msg);
    /* the MANIFEST, which failed its checks (problem), replaced by source's */
    void (*manifest)(void *user, const char *problem, const char *source);
} tsr_repair_opts;

typedef struct tsr_repair_stats {
    uint64_t files, files_damaged, files_repaired, files_lost;
    uint64_t frames_damaged, frames_repaired, frames_lost;
    int manifest_repaired; /* 1: the MANIFEST was replaced by a source's */
} tsr_repair_stats;

/* tsr_ckpt_repair(): checks every data file of the committed checkpoint in the
 * local folder dir and rewrites each damaged one from the sources (above),
 * holding the lock of its folder (tsr_folder_lock_for_ckpt) meanwhile. Sources
 * are opened only when a frame is damaged. *st (may be NULL) gets the counts.
 * @return 0 when every file is sound or repaired; TSR_ECORRUPT when frames are
 * lost (err: the first such file's error, and how many more); another
 * tsr_status when the repair could not run (dir not a local committed
 * checkpoint, its lock held, a write failing). */
int tsr_ckpt_repair(const char *dir, const tsr_repair_opts *o, tsr_repair_stats *st, tsr_error *err);

#endif
