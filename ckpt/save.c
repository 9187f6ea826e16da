/* save.c: the writer of format v1. One tsr_save writes one data file (a rank's
 * part of a checkpoint) and, on the committing rank, the MANIFEST. */
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "codec.h"
#include "common.h"
#include "manifest.h"
#include "pool.h"
#include "store.h"
#include "tsr_ckpt.h"
#include "encoder.h"
#include "fence.h"
#include "save_impl.h"

#define BATCH_PER_THREAD 2 /* frames encoded per thread between writes */
#define SLOT_GROUPS 4      /* batches in the ring: one encoding, the rest writing */

typedef struct slot {
    uint8_t *buf; /* aligned, cap bytes */
    int want;     /* the codec asked for: the save's, or raw (adaptive) */
    const uint8_t *direct; /* a raw frame written from the caller's memory, or NULL */
    const void *submitted; /* the buffer of its last queued write */
    size_t cap;
    size_t stored;
    int codec;
    uint64_t raw_hash, stored_hash;
    uint64_t share; /* the frame's share of its tensor's digest (FORMAT.md 4.4) */
    tsr_stats stats; /* and of its statistics (4.5) */
    int rc;
    tsr_error err;
} slot;

struct tsr_save {
    char dir[PATH_MAX];
    uint32_t file_id;
    uint8_t save_id[16];
    tsr_write_opts opts;
    tsr_store *store;
    tsr_wfile *wf;
    uint64_t pos;     /* where the next frame goes */
    tsr_manifest tab; /* this writer's table */
    name_index index; /* tab's tensors by name */
    tsr_encoder *enc;    /* threads, codecs and frame buffers */
    int own_enc;         /* created by (and freed with) this save */
    uint8_t *table_bytes;
    size_t table_len;
    int group;  /* the group of the encoder's slots the next batch is encoded into */
    int finished, failed;
    int (*idle)(void *ctx, int run); /* tsr_save_set_idle */
    void *idle_ctx;
    struct late_frame *late; /* frames written before their checksums */
    size_t n_late, cap_late;
    declared *declared; /* tsr_save_tensor_digest, tsr_save_tensor_stats */
    size_t n_declared, cap_declared;
};

/* A raw frame written from stable memory before its checksums were computed:
 * tsr_save_finish computes them, from the same memory. */
typedef struct late_frame {
    size_t frame; /* index in the table */
    const uint8_t *raw;
    size_t len;
    int of_tensor;   /* its digest and statistics shares too: tensor in tab (declaration order), frame box */
    uint32_t tensor;
    tsr_box box;
    uint64_t share;
    tsr_stats stats;
    int stats_known; /* the box's statistics came with it: the digest's share alone */
} late_frame;

/* The encoder: a thread pool, a codec per thread and the frame buffers, kept
 * across saves (the engine holds one), so that a save neither starts threads nor
 * faults in fresh buffers. */
struct tsr_encoder {
    tsr_pool *pool;
    tsr_codec **codecs;
    slot *slots;
    size_t n_slots;
    double share, credit; /* adaptive encoding: the share of frames encoded; the fraction owed */
};

tsr_encoder *tsr_encoder_new(int threads, tsr_error *err) {
    tsr_encoder *enc = calloc(1, sizeof *enc);
    if (!enc) goto nomem;
    enc->pool = tsr_pool_new(threads);
    if (!enc->pool) {
        tsr_encoder_free(enc);
        tsr_err(err, TSR_ENOMEM, "cannot start the encoder threads");
        return NULL;
    }
    int nt = tsr_pool_size(enc->pool);
    enc->codecs = calloc((size_t)nt, sizeof *enc->codecs);
    enc->n_slots = SLOT_GROUPS * (size_t)nt * BATCH_PER_THREAD;
    enc->slots = calloc(enc->n_slots, sizeof *enc->slots);
    enc->share = 1;
    if (!enc->codecs || !enc->slots) goto nomem;
    for (int i = 0; i < nt; i++)
        if (!(enc->codecs[i] = tsr_codec_new())) goto nomem;
    return enc;
nomem:
    tsr_encoder_free(enc);
    tsr_err(err, TSR_ENOMEM, "out of memory for the encoder");
    return NULL;
}

tsr_pool *tsr_encoder_pool(tsr_encoder *enc) { return enc->pool; }

void tsr_encoder_free(tsr_encoder *enc) {
    if (!enc) return;
    if (enc->codecs && enc->pool)
        for (int i = 0; i < tsr_pool_size(enc->pool); i++) tsr_codec_free(enc->codecs[i]);
    free(enc->codecs);
    tsr_pool_free(enc->pool);
    for (size_t i = 0; enc->slots && i < enc->n_slots; i++) free(enc->slots[i].buf);
    free(enc->slots);
    free(enc);
}

/* The frame size a writer uses for the option frame_bytes. */
static size_t frame_bytes_of(size_t frame_bytes) {
    if (frame_bytes == 0) return tsr_write_opts_default().frame_bytes;
    return frame_bytes > TSR_MAX_FRAME_RAW ? TSR_MAX_FRAME_RAW : frame_bytes;
}

/* The byte offset and size of each of the *n frames of a box (free both). */
static int frame_cuts(const tsr_box *box, size_t es, size_t frame_bytes, uint64_t **offs, uint64_t **sizes,
                      uint64_t *n) {
    tsr_mf_chunk c = {.box = *box};
    tsr_frame_geometry(box, es, frame_bytes_of(frame_bytes), &c.split_dim, &c.frame_rows);
    uint64_t nf = tsr_frame_count(box, c.split_dim, c.frame_rows);
    *offs = malloc((nf + 1) * sizeof **offs);
    *sizes = malloc((nf + 1) * sizeof **sizes);
    if (!*offs || !*sizes) {
        free(*offs), free(*sizes);
        *offs = *sizes = NULL;
        return TSR_ENOMEM;
    }
    uint64_t off = 0;
    for (uint64_t k = 0; k < nf; k++) {
        tsr_box fb;
        tsr_frame_box(&c, k, &fb);
        (*offs)[k] = off;
        (*sizes)[k] = tsr_box_volume(&fb) * es;
        off += (*sizes)[k];
    }
    *n = nf;
    return 0;
}

tsr_write_opts tsr_write_opts_default(void) {
    return (tsr_write_opts){.codec = TSR_CODEC_AUTO, .level = 1, .frame_bytes = 4u << 20};
}

/* Creates the writer's data file (s->file_id's). A writer without an epoch
 * creates it or writes over it. One with an epoch never writes into a file it did
 * not create (FORMAT.md 4.6): it creates exclusively, and a name taken is
 * checked against the fence (a newer launch's file: fenced); otherwise it is a
 * leftover of an earlier attempt, passed over for the id opts.id_stride further
 * (never removed: it may be another writer's by now), or, without a stride,
 * removed and the file created once more. A spare file moves in only where the
 * name is free. */
static int create_data_file(tsr_save *s, tsr_error *err) {
    char name[64];
    for (int tries = 0;; tries++) {
        tsr_data_file_name(s->file_id, name, sizeof name);
        int flags = s->opts.epoch ? TSR_CREATE_NEW : 0;
        if (s->opts.spare_dir && s->opts.spare_dir[0] && (tsr_store_caps(s->dir) & TSR_STORE_RENAME)) {
            char from[PATH_MAX + 80], to[PATH_MAX + 80];
            snprintf(from, sizeof from, "%s/%s", s->opts.spare_dir, name);
            snprintf(to, sizeof to, "%s/%s", s->dir, name);
            if (s->opts.epoch ? tsr_rename_new(from, to) == 0 : rename(from, to) == 0) flags = TSR_CREATE_OVERWRITE;
        }
        tsr_error e = {0};
        int rc = tsr_store_create(s->store, name, flags, &s->wf, &e);
        if (rc != TSR_EBUSY || !s->opts.epoch || tries >= 16) {
            if (rc && err) *err = e;
            return rc;
        }
        if ((rc = tsr_fence_admit(s->dir, &s->opts.epoch, 0, err))) return rc;
        if (s->opts.id_stride) {
            if (s->file_id > UINT32_MAX - s->opts.id_stride) return tsr_err(err, TSR_EBUSY, "%s", e.msg);
            tsr_log(1, "%s/%s: taken (a leftover of an earlier attempt at this step): written as file id %u instead",
                    s->dir, name, s->file_id + s->opts.id_stride);
            s->file_id += s->opts.id_stride;
        } else if (tries > 0 || (rc = tsr_store_remove(s->store, name, err))) {
            return rc ? rc : tsr_err(err, TSR_EBUSY, "%s", e.msg);
        }
    }
}

tsr_save *tsr_save_begin(const char *step_dir, uint32_t file_id, const uint8_t *save_id,
                         const tsr_write_opts *opts, tsr_error *err) {
    return tsr_save_begin_with(step_dir, file_id, save_id, opts, NULL, err);
}

tsr_save *tsr_save_begin_with(const char *step_dir, uint32_t file_id, const uint8_t *save_id,
                              const tsr_write_opts *opts, tsr_encoder *enc, tsr_error *err) {
    tsr_save *s = calloc(1, sizeof *s);
    if (!s) {
        tsr_err(err, TSR_ENOMEM, "out of memory");
        return NULL;
    }
    tsr_manifest_init(&s->tab);
    snprintf(s->dir, sizeof s->dir, "%s", step_dir);
    s->file_id = file_id;
    s->opts = opts ? *opts : tsr_write_opts_default();
    s->opts.frame_bytes = frame_bytes_of(s->opts.frame_bytes);
    if (s->opts.codec < TSR_CODEC_AUTO || s->opts.codec > TSR_CODEC_BYTEGROUP) {
        tsr_err(err, TSR_EINVAL, "unknown codec %d", s->opts.codec);
        goto fail;
    }
    if (save_id) memcpy(s->save_id, save_id, 16);
    else if (getrandom(s->save_id, 16, 0) != 16) {
        tsr_err(err, TSR_EIO, "cannot draw a random save id");
        goto fail;
    }
    /* a fenced writer creates nothing: the data file of a step a newer launch
     * committed is never opened (its commit is checked again) */
    if (s->opts.epoch && tsr_fence_admit(step_dir, &s->opts.epoch, 0, err)) goto fail;
    s->store = tsr_store_open(step_dir, 1, err);
    if (!s->store) goto fail;
    if (create_data_file(s, err)) goto fail;
    s->opts.spare_dir = NULL; /* the caller's string is not kept */
    if (s->opts.expected_bytes) tsr_wfile_reserve(s->wf, TSR_DATA_HEADER_SIZE + s->opts.expected_bytes);
    s->enc = enc;
    if (!s->enc) {
        if (!(s->enc = tsr_encoder_new(s->opts.threads, err))) goto fail;
        s->own_enc = 1;
    }
    /* The header block: written first, so that even an empty file is valid. */
    uint8_t *hdr = tsr_alloc_aligned(TSR_DATA_HEADER_SIZE);
    if (!hdr) {
        tsr_err(err, TSR_ENOMEM, "out of memory");
        goto fail;
    }
    tsr_data_header_encode(hdr, s->file_id, s->save_id);
    int rc = tsr_wfile_write(s->wf, hdr, TSR_DATA_HEADER_SIZE, 0, err);
    free(hdr);
    if (rc) goto fail;
    s->pos = TSR_DATA_HEADER_SIZE;
    return s;
fail:
    tsr_save_abort(s);
    tsr_save_free(s);
    return NULL;
}

int tsr_save_tensor(tsr_save *s, const char *name, const char *group, int dtype, uint32_t ndim,
                    const uint64_t *shape, const tsr_placement *placement, tsr_error *err) {
    if (!group) group = "model";
    if (s->finished) return tsr_err(err, TSR_EINVAL, "%s: the save is finished", name);
    if (!name || !tsr_name_valid(name, strlen(name)))
        return tsr_err(err, TSR_EINVAL, "invalid tensor name \"%.64s\" (1-255 of [A-Za-z0-9_.:+-], no empty component)",
                       name ? name : "(null)");
    if (!tsr_name_valid(group, strlen(group)))
        return tsr_err(err, TSR_EINVAL, "%s: invalid group name \"%.64s\"", name, group);
    if (!tsr_dtype_size(dtype)) return tsr_err(err, TSR_EINVAL, "%s: unknown dtype %d", name, dtype);
    if (ndim > TSR_MAX_DIMS) return tsr_err(err, TSR_EINVAL, "%s: %u dims, over the limit of 8", name, ndim);
    if (save_index_find(&s->index, &s->tab, name) >= 0) return tsr_err(err, TSR_EINVAL, "%s: declared twice", name);
    /* the digest and the statistics (floating dtypes): the writer's shares, combined as its boxes are encoded */
    tsr_mf_tensor t = {.name = name, .group = group, .dtype = dtype, .ndim = ndim,
                       .digest_flags = s->opts.no_digests ? 0
                                                          : TSR_MF_DIGEST | (tsr_stats_dtype(dtype) ? TSR_MF_STATS : 0)};
    tsr_stats_init(&t.stats);
    uint64_t bytes = tsr_dtype_size(dtype);
    for (uint32_t d = 0; d < ndim; d++) {
        t.shape[d] = shape[d];
        if (tsr_mul_ovf(bytes, shape[d], &bytes) || bytes > (1ull << 62))
            return tsr_err(err, TSR_EINVAL, "%s: over 2^62 bytes", name);
    }
    t.placement = placement ? *placement : (tsr_placement){-1, 0, TSR_PP_ALL, -1};
    const tsr_placement *pl = &t.placement;
    if (pl->tp_dim < -1 || pl->tp_dim >= (int)ndim || pl->fsdp > 1 || pl->pp_role > 3 ||
        (pl->pp_role == TSR_PP_LAYER ? pl->layer < 0 : pl->layer != -1))
        return tsr_err(err, TSR_EINVAL, "%s: placement out of range", name);
    if (tsr_manifest_add_tensor(&s->tab, &t) || save_index_insert(&s->index, &s->tab, (uint32_t)(s->tab.n_tensors - 1)))
        return tsr_err(err, TSR_ENOMEM, "out of memory");
    return 0;
}

/* The declaration of what is known of tensor `name` as a whole (NULL: not declared). */
static declared *declare(tsr_save *s, const char *name, tsr_error *err) {
    long ti = save_index_find(&s->index, &s->tab, name);
    if (ti < 0) {
        tsr_err(err, TSR_ENOTFOUND, "%s: tensor not declared", name);
        return NULL;
    }
    for (size_t i = 0; i < s->n_declared; i++)
        if (s->declared[i].name == s->tab.tensors[ti].name) return &s->declared[i];
    if (tsr_grow((void **)&s->declared, &s->cap_declared, s->n_declared, sizeof *s->declared)) {
        tsr_err(err, TSR_ENOMEM, "out of memory");
        return NULL;
    }
    s->declared[s->n_declared] = (declared){.name = s->tab.tensors[ti].name};
    return &s->declared[s->n_declared++];
}

int tsr_save_tensor_digest(tsr_save *s, const char *name, uint64_t digest, tsr_error *err) {
    declared *d = declare(s, name, err);
    if (!d) return err ? err->code : TSR_ENOTFOUND;
    d->digest = digest;
    d->has |= TSR_MF_DIGEST;
    return 0;
}

int tsr_save_tensor_stats(tsr_save *s, const char *name, const tsr_stats *stats, tsr_error *err) {
    declared *d = declare(s, name, err);
    if (!d) return err ? err->code : TSR_ENOTFOUND;
    if (!tsr_stats_dtype(s->tab.tensors[save_index_find(&s->index, &s->tab, name)].dtype)) return 0;
    d->stats = *stats;
    d->has |= TSR_MF_STATS;
    return 0;
}

/* ------------------------------------------------------ encode and write */

typedef struct encode_job {
    tsr_save *s;
    int stable;             /* raw stays untouched until the save finishes */
    int late;               /* direct frames' checksums left to tsr_save_finish */
    int dtype;
    const uint8_t *raw;     /* the first frame's raw bytes */
    const uint64_t *offs;   /* raw offset of each frame in the batch */
    const uint64_t *sizes;  /* raw size of each frame */
    slot *slots;            /* where frame i is encoded */
    const tsr_mf_chunk *chunk; /* the frames' chunk (NULL: a blob's frames) ... */
    uint64_t first;            /* ... and the index in it of the batch's first frame */
    const uint64_t *shape;     /* the tensor's shape */
    int stats_known;           /* the box's statistics came with it (tsr_save_box_stable) */
} encode_job;

static int slot_reserve(slot *sl, size_t need) {
    need = tsr_align_up(need, TSR_ALIGN);
    if (sl->cap >= need) return 0;
    free(sl->buf);
    sl->buf = tsr_alloc_aligned(need);
    sl->cap = sl->buf ? need : 0;
    return sl->buf ? 0 : TSR_ENOMEM;
}

/* Frame k of chunk c's share of the digest, returned, and of the statistics,
 * added to *stats (NULL: known already): its raw bytes at raw, read once. */
static uint64_t frame_shares(const tsr_mf_chunk *c, uint64_t k, int dtype, const uint64_t *shape, const uint8_t *raw,
                             tsr_stats *stats) {
    tsr_box fb;
    tsr_frame_box(c, k, &fb);
    return stats ? tsr_digest_stats_box(dtype, shape, &fb, raw, stats)
                 : tsr_digest_box(tsr_dtype_size(dtype), shape, &fb, raw);
}

static void encode_one(void *ctx, size_t i, int worker) {
    encode_job *j = ctx;
    slot *sl = &j->slots[i];
    const uint8_t *raw = j->raw + j->offs[i];
    size_t n = j->sizes[i];
    sl->rc = 0;
    sl->direct = NULL;
    /* the digest's share while the bytes are in cache for the checksum and the
     * codec (a late frame's with its checksums, at tsr_save_finish) */
    int direct = j->stable && n % TSR_ALIGN == 0 && (uintptr_t)raw % TSR_ALIGN == 0 &&
                 tsr_frame_stores_raw(j->dtype, sl->want, raw, n);
    tsr_stats_init(&sl->stats);
    int shares = j->chunk && !j->s->opts.no_digests && !(direct && j->late);
    sl->share = shares ? frame_shares(j->chunk, j->first + i, j->dtype, j->shape, raw,
                                      j->stats_known ? NULL : &sl->stats)
                       : 0;
    /* a frame stored as it is, aligned in memory that outlives the writes, is
     * written from there: no copy (a copy slows the writes it overlaps) */
    if (direct) {
        sl->direct = raw;
        sl->stored = n;
        sl->codec = TSR_CODEC_RAW;
        sl->raw_hash = sl->stored_hash = j->late ? 0 : tsr_hash(raw, n);
        return;
    }
    if (slot_reserve(sl, tsr_codec_bound(n))) {
        sl->rc = tsr_err(&sl->err, TSR_ENOMEM, "out of memory for a frame buffer");
        return;
    }
    sl->raw_hash = tsr_hash(raw, n);
    sl->rc = tsr_frame_encode(j->s->enc->codecs[worker], j->dtype, sl->want, j->s->opts.level, raw, n,
                              sl->buf, sl->cap, &sl->stored, &sl->codec, &sl->err);
    if (sl->rc) return;
    /* a raw frame's stored bytes are its raw bytes: one hash serves both */
    sl->stored_hash = sl->codec == TSR_CODEC_RAW ? sl->raw_hash : tsr_hash(sl->buf, sl->stored);
    size_t padded = tsr_align_up(sl->stored, TSR_ALIGN);
    memset(sl->buf + sl->stored, 0, padded - sl->stored);
}

/* Adaptive encoding (codec AUTO): the writer busy first. Encoding shrinks what
 * the writer has to write but costs the encoder's time; a save is fastest when
 * neither waits for the other. After each batch the share of frames encoded
 * moves by one step: up when the batch waited for the writer (earlier writes of
 * its slots still in flight, a full queue, or a store that writes as it is
 * called: the writer is the slower, smaller frames help), down when it did not (the writer idled
 * while the encoder worked: raw frames, which cost a hash, keep it fed). It
 * settles where the writer is just kept busy, and is kept in the encoder from
 * one save to the next. */
#define SHARE_STEP 0.0625
#define WAITED 0.05  /* the writer's share of a batch's time above which it counts as waited for */
#define QUEUED 0.5e-3 /* seconds: a submit that takes longer waited for the writer */

/* The codec of each frame of a batch: the save's, or raw for those the share
 * leaves out (spread evenly: every 1/share-th frame encoded). */
static void batch_codecs(tsr_save *s, int codec, slot *slots, size_t batch) {
    tsr_encoder *enc = s->enc;
    double share = s->opts.encode_share > 0 ? s->opts.encode_share : enc->share;
    for (size_t i = 0; i < batch; i++) {
        slots[i].want = codec;
        if (s->opts.codec != TSR_CODEC_AUTO) continue;
        enc->credit += share;
        if (enc->credit >= 1 - 1e-9) enc->credit -= 1;
        else slots[i].want = TSR_CODEC_RAW;
    }
}

static void share_update(tsr_encoder *enc, double t_io, double t_enc) {
    if (t_io > WAITED * (t_io + t_enc)) enc->share = enc->share + SHARE_STEP > 1 ? 1 : enc->share + SHARE_STEP;
    else enc->share = enc->share - SHARE_STEP < 0 ? 0 : enc->share - SHARE_STEP;
}

/* With an idle hook (tsr_save_set_idle) and stable memory: while a batch's slots
 * still have writes in flight, the hook's work runs instead of a wait; while it
 * has work left, the batch is stored raw, its frames' checksums left to
 * tsr_save_finish: the disk is kept fed at almost no cost to the threads, which
 * the hook's work needs. @return 1 for such a batch. */
static int idle_until_free(tsr_save *s, const slot *slots, size_t batch, int stable) {
    if (!s->idle || !stable) return 0;
    for (size_t i = 0; i < batch && s->idle; i++)
        while (s->idle && slots[i].submitted && tsr_wfile_busy(s->wf, slots[i].submitted))
            if (!s->idle(s->idle_ctx, 1)) s->idle = NULL;
    if (s->idle && !s->idle(s->idle_ctx, 0)) s->idle = NULL;
    return s->idle != NULL;
}

/* Encodes the frames (raw + offs[k], sizes[k]) for k < n and appends them to the
 * data file, recording them in the table. The slots form SLOT_GROUPS groups used
 * in turn: before a batch is encoded into a group, only that group's earlier
 * writes are waited for, so the other groups' writes stay queued (io_uring,
 * several in flight) while the thread pool encodes, and the disk never idles
 * between batches. The last writes stay in flight when this returns (the frames
 * are in the slots, not in the caller's memory), so that the next box's encoding
 * overlaps them; tsr_save_finish waits for them. With codec AUTO each frame is
 * encoded or raw as the share says. */
static int write_frames(tsr_save *s, int dtype, int codec, const uint8_t *raw, const uint64_t *offs,
                        const uint64_t *sizes, int stable, size_t n, const tsr_mf_chunk *chunk, int stats_known,
                        const char *what, tsr_error *err) {
    tsr_mf_tensor *t = chunk ? &s->tab.tensors[chunk->tensor] : NULL; /* whose digest the frames add to */
    size_t group_slots = s->enc->n_slots / SLOT_GROUPS;
    int adaptive = s->opts.codec == TSR_CODEC_AUTO;
    int rc = 0;
    for (size_t done = 0; done < n && !rc; s->group = (s->group + 1) % SLOT_GROUPS) {
        size_t batch = n - done < group_slots ? n - done : group_slots;
        slot *slots = s->enc->slots + (size_t)s->group * group_slots;
        double t0 = tsr_now(), t_io = 0;
        int late = idle_until_free(s, slots, batch, stable);
        for (size_t i = 0; i < batch && !rc; i++)
            if (slots[i].submitted) rc = tsr_wfile_release(s->wf, slots[i].submitted, err);
        if (rc) break;
        if (late)
            for (size_t i = 0; i < batch; i++) slots[i].want = TSR_CODEC_RAW;
        else
            batch_codecs(s, codec, slots, batch);
        encode_job job = {s, stable, late, dtype, raw, offs + done, sizes + done, slots, chunk, done,
                          t ? t->shape : NULL, stats_known};
        double t1 = tsr_now();
        tsr_pool_for(s->enc->pool, batch, encode_one, &job);
        double t2 = tsr_now();
        for (size_t i = 0; i < batch; i++) {
            slot *sl = &slots[i];
            if (sl->rc) {
                if (err) *err = sl->err;
                tsr_err_prefix(err, "%s: frame %zu", what, done + i);
                rc = sl->rc;
                break;
            }
            size_t padded = tsr_align_up(sl->stored, TSR_ALIGN);
            sl->submitted = sl->direct ? (const void *)sl->direct : sl->buf;
            double ts = tsr_now();
            if ((rc = tsr_wfile_submit(s->wf, sl->submitted, padded, s->pos, err))) break;
            ts = tsr_now() - ts;
            if (ts > QUEUED) t_io += ts; /* the writer was full, or writes as it is called */
            tsr_mf_frame f = {.offset = s->pos, .stored_size = sl->stored, .raw_size = sizes[done + i],
                              .raw_hash = sl->raw_hash, .stored_hash = sl->stored_hash,
                              .codec = sl->codec, .file_id = s->file_id};
            int is_late = late && sl->direct; /* its checksums (and share) 0 until tsr_save_finish */
            if ((is_late && tsr_grow((void **)&s->late, &s->cap_late, s->n_late, sizeof *s->late)) ||
                tsr_manifest_add_frame(&s->tab, &f)) {
                rc = tsr_err(err, TSR_ENOMEM, "out of memory");
                break;
            }
            if (is_late) {
                late_frame *l = &s->late[s->n_late++];
                *l = (late_frame){s->tab.n_frames - 1, sl->direct, sl->stored, 0, 0, {0}, 0, {0, 0, 0, 0}, 0};
                if (t && !s->opts.no_digests) {
                    l->of_tensor = 1;
                    l->stats_known = stats_known;
                    l->tensor = chunk->tensor;
                    tsr_frame_box(chunk, done + i, &l->box);
                }
            } else if (t) {
                t->digest ^= sl->share;
                tsr_stats_merge(&t->stats, &sl->stats);
            }
            s->pos += padded;
        }
        if (adaptive && !late) share_update(s->enc, t_io + (t1 - t0), t2 - t1);
        done += batch;
    }
    return rc;
}

static int check_open(tsr_save *s, const char *what, tsr_error *err) {
    if (s->failed) return tsr_err(err, TSR_EINVAL, "%s: an earlier write of this save failed", what);
    if (s->finished) return tsr_err(err, TSR_EINVAL, "%s: the save is finished", what);
    return 0;
}

static int save_box(tsr_save *s, const char *name, const tsr_box *box, const void *data, int stable,
                    const tsr_stats *stats, tsr_error *err);

int tsr_save_box(tsr_save *s, const char *name, const tsr_box *box, const void *data,
                 tsr_error *err) {
    return save_box(s, name, box, data, 0, NULL, err);
}

int tsr_save_box_stable(tsr_save *s, const char *name, const tsr_box *box, const void *data, const tsr_stats *stats,
                        tsr_error *err) {
    return save_box(s, name, box, data, 1, stats, err);
}

static int save_box(tsr_save *s, const char *name, const tsr_box *box, const void *data, int stable,
                    const tsr_stats *stats, tsr_error *err) {
    int rc = check_open(s, name, err);
    if (rc) return rc;
    long ti = save_index_find(&s->index, &s->tab, name);
    if (ti < 0) return tsr_err(err, TSR_ENOTFOUND, "%s: tensor not declared", name);
    const tsr_mf_tensor *t = &s->tab.tensors[ti];
    if (box->ndim != t->ndim)
        return tsr_err(err, TSR_EINVAL, "%s: box has %u dims, tensor has %u", name, box->ndim, t->ndim);
    for (uint32_t d = 0; d < t->ndim; d++)
        if (box->offset[d] > t->shape[d] || box->extent[d] > t->shape[d] - box->offset[d])
            return tsr_err(err, TSR_EINVAL, "%s: box outside the tensor's shape in dim %u", name, d);
    uint64_t vol = tsr_box_volume(box);
    if (vol == 0) return 0; /* nothing to store */
    size_t es = tsr_dtype_size(t->dtype);
    int codec = s->opts.codec;
    if (codec == TSR_CODEC_BYTEGROUP && !(t->dtype == TSR_F32 || t->dtype == TSR_F16 || t->dtype == TSR_BF16))
        codec = TSR_CODEC_ZSTD;
    tsr_mf_chunk c = {.tensor = (uint32_t)ti, .file_id = s->file_id, .box = *box};
    tsr_frame_geometry(box, es, s->opts.frame_bytes, &c.split_dim, &c.frame_rows);
    uint64_t nf = tsr_frame_count(box, c.split_dim, c.frame_rows);
    if (nf == UINT64_MAX || nf > UINT32_MAX) return tsr_err(err, TSR_EINVAL, "%s: too many frames", name);
    c.frame_first = (uint32_t)s->tab.n_frames;
    c.frame_count = (uint32_t)nf;
    uint64_t *offs = NULL, *sizes = NULL;
    if (frame_cuts(box, es, s->opts.frame_bytes, &offs, &sizes, &nf))
        return tsr_err(err, TSR_ENOMEM, "out of memory");
    stats = stats && tsr_stats_dtype(t->dtype) ? stats : NULL;
    rc = write_frames(s, t->dtype, codec, data, offs, sizes, stable, nf, &c, stats != NULL, name, err);
    free(offs), free(sizes);
    if (!rc && stats && !s->opts.no_digests) tsr_stats_merge(&s->tab.tensors[ti].stats, stats);
    if (!rc && tsr_manifest_add_chunk(&s->tab, &c)) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    if (rc) s->failed = 1;
    return rc;
}

/* A batch of a chunk copy: frame first + i of src read into slot i. */
typedef struct copy_job {
    tsr_ckpt *src;
    size_t first;
    slot *slots;
} copy_job;

static void copy_one(void *ctx, size_t i, int worker) {
    (void)worker;
    copy_job *j = ctx;
    slot *sl = &j->slots[i];
    tsr_frame_info fi;
    sl->rc = tsr_ckpt_frame(j->src, j->first + i, &fi);
    if (sl->rc) {
        tsr_err(&sl->err, sl->rc, "no frame %zu", j->first + i);
        return;
    }
    if (slot_reserve(sl, tsr_align_up(fi.stored_size, TSR_ALIGN))) {
        sl->rc = tsr_err(&sl->err, TSR_ENOMEM, "out of memory for a frame buffer");
        return;
    }
    sl->direct = NULL;
    sl->rc = tsr_ckpt_read_stored(j->src, j->first + i, sl->buf, &sl->err);
}

int tsr_save_chunk_copy(tsr_save *s, const char *name, tsr_ckpt *src, size_t chunk, tsr_error *err) {
    int rc = check_open(s, name, err);
    if (rc) return rc;
    long ti = save_index_find(&s->index, &s->tab, name);
    if (ti < 0) return tsr_err(err, TSR_ENOTFOUND, "%s: tensor not declared", name);
    const tsr_mf_tensor *t = &s->tab.tensors[ti];
    tsr_chunk_info ci;
    tsr_tensor_info si;
    if ((rc = tsr_ckpt_chunk(src, chunk, &ci)) || (rc = tsr_ckpt_tensor(src, ci.tensor, &si)))
        return tsr_err(err, rc, "%s: no chunk %zu in %s", name, chunk, tsr_ckpt_dir(src));
    if (si.dtype != t->dtype || ci.box.ndim != t->ndim)
        return tsr_err(err, TSR_EINVAL, "%s: chunk %zu of %s is %s with %u dims, the tensor here %s with %u", name,
                       chunk, tsr_ckpt_dir(src), tsr_dtype_name(si.dtype), ci.box.ndim, tsr_dtype_name(t->dtype),
                       t->ndim);
    for (uint32_t d = 0; d < t->ndim; d++)
        if (ci.box.offset[d] > t->shape[d] || ci.box.extent[d] > t->shape[d] - ci.box.offset[d])
            return tsr_err(err, TSR_EINVAL, "%s: chunk %zu outside the tensor's shape in dim %u", name, chunk, d);
    tsr_mf_chunk c = {.tensor = (uint32_t)ti, .file_id = s->file_id, .box = ci.box, .split_dim = ci.split_dim,
                      .frame_rows = ci.frame_rows, .frame_first = (uint32_t)s->tab.n_frames,
                      .frame_count = ci.n_frames};
    /* never decoded: no share of the digest or the statistics (tsr_save_tensor_digest, tsr_save_tensor_stats) */
    s->tab.tensors[ti].digest_flags = 0;
    size_t group_slots = s->enc->n_slots / SLOT_GROUPS;
    for (uint32_t done = 0; done < ci.n_frames && !rc; s->group = (s->group + 1) % SLOT_GROUPS) {
        /* a batch into the next group of slots, as write_frames fills them: the
         * group's earlier writes released, the frames read on the encoder's
         * threads at once (the disk serves several reads), then queued in order */
        size_t batch = ci.n_frames - done < group_slots ? ci.n_frames - done : group_slots;
        slot *slots = s->enc->slots + (size_t)s->group * group_slots;
        for (size_t i = 0; i < batch && !rc; i++) {
            if (slots[i].submitted) rc = tsr_wfile_release(s->wf, slots[i].submitted, err);
            slots[i].submitted = NULL;
        }
        copy_job job = {src, ci.first_frame + done, slots};
        if (!rc) tsr_pool_for(s->enc->pool, batch, copy_one, &job);
        for (size_t i = 0; i < batch && !rc; i++) {
            slot *sl = &slots[i];
            tsr_frame_info fi;
            if ((rc = sl->rc)) {
                if (err) *err = sl->err;
                break;
            }
            tsr_ckpt_frame(src, ci.first_frame + done + i, &fi);
            size_t padded = tsr_align_up(fi.stored_size, TSR_ALIGN);
            sl->submitted = sl->buf;
            if ((rc = tsr_wfile_submit(s->wf, sl->buf, padded, s->pos, err))) break;
            tsr_mf_frame f = {.offset = s->pos, .stored_size = fi.stored_size, .raw_size = fi.raw_size,
                              .raw_hash = fi.raw_hash, .stored_hash = fi.stored_hash, .codec = fi.codec,
                              .file_id = s->file_id};
            if (tsr_manifest_add_frame(&s->tab, &f)) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
            s->pos += padded;
        }
        done += (uint32_t)batch;
    }
    if (!rc && tsr_manifest_add_chunk(&s->tab, &c)) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    if (rc) {
        tsr_err_prefix(err, "%s: chunk copied from %s", name, tsr_ckpt_dir(src));
        s->failed = 1;
    }
    return rc;
}

int tsr_save_blob(tsr_save *s, const char *name, int32_t rank, const void *data, size_t size,
                  tsr_error *err) {
    int rc = check_open(s, name, err);
    if (rc) return rc;
    if (!name || !tsr_name_valid(name, strlen(name)))
        return tsr_err(err, TSR_EINVAL, "invalid blob name \"%.64s\"", name ? name : "(null)");
    if (rank < -1) return tsr_err(err, TSR_EINVAL, "blob %s: rank %d", name, rank);
    for (size_t i = 0; i < s->tab.n_blobs; i++)
        if (s->tab.blobs[i].rank == rank && strcmp(s->tab.blobs[i].name, name) == 0)
            return tsr_err(err, TSR_EINVAL, "blob %s (rank %d): written twice", name, rank);
    size_t fb = s->opts.frame_bytes;
    uint64_t nf = (size + fb - 1) / fb;
    tsr_mf_blob b = {.name = name, .rank = rank, .file_id = s->file_id,
                     .frame_first = (uint32_t)s->tab.n_frames, .frame_count = (uint32_t)nf, .size = size};
    uint64_t *offs = malloc((nf + 1) * sizeof *offs), *sizes = malloc((nf + 1) * sizeof *sizes);
    if (!offs || !sizes) {
        free(offs), free(sizes);
        return tsr_err(err, TSR_ENOMEM, "out of memory");
    }
    for (uint64_t k = 0; k < nf; k++) {
        offs[k] = k * fb;
        sizes[k] = size - offs[k] < fb ? size - offs[k] : fb;
    }
    int codec = s->opts.codec == TSR_CODEC_RAW ? TSR_CODEC_RAW : TSR_CODEC_ZSTD;
    char what[300];
    snprintf(what, sizeof what, "blob %s", name);
    rc = write_frames(s, TSR_U8, codec, data, offs, sizes, 0, nf, NULL, 0, what, err);
    free(offs), free(sizes);
    if (!rc && tsr_manifest_add_blob(&s->tab, &b)) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    if (rc) s->failed = 1;
    return rc;
}

void tsr_save_set_idle(tsr_save *s, int (*idle)(void *ctx, int run), void *ctx) {
    s->idle = idle;
    s->idle_ctx = ctx;
}

static void late_one(void *ctx, size_t i, int worker) {
    (void)worker;
    tsr_save *s = ctx;
    late_frame *l = &s->late[i];
    s->tab.frames[l->frame].raw_hash = s->tab.frames[l->frame].stored_hash = tsr_hash(l->raw, l->len);
    if (l->of_tensor) {
        const tsr_mf_tensor *t = &s->tab.tensors[l->tensor];
        tsr_stats_init(&l->stats);
        l->share = l->stats_known ? tsr_digest_box(tsr_dtype_size(t->dtype), t->shape, &l->box, l->raw)
                                  : tsr_digest_stats_box(t->dtype, t->shape, &l->box, l->raw, &l->stats);
    }
}

int tsr_save_finish(tsr_save *s, const uint8_t **table, size_t *table_len, tsr_error *err) {
    int rc = check_open(s, "finish", err);
    if (rc) return rc;
    s->idle = NULL;
    /* the checksums left for now: the memory is still the caller's stable copy,
     * and the last writes are in flight meanwhile */
    tsr_pool_for(s->enc->pool, s->n_late, late_one, s);
    for (size_t i = 0; i < s->n_late; i++)
        if (s->late[i].of_tensor) {
            s->tab.tensors[s->late[i].tensor].digest ^= s->late[i].share;
            tsr_stats_merge(&s->tab.tensors[s->late[i].tensor].stats, &s->late[i].stats);
        }
    s->n_late = 0;
    char name[64];
    tsr_data_file_name(s->file_id, name, sizeof name);
    rc = tsr_wfile_finish(s->wf, s->pos, err);
    s->wf = NULL;
    if (rc) goto fail;
    tsr_mf_file f = {s->file_id, s->pos};
    if (tsr_manifest_add_file(&s->tab, &f)) {
        rc = tsr_err(err, TSR_ENOMEM, "out of memory");
        goto fail;
    }
    memcpy(s->tab.save_id, s->save_id, 16);
    if ((rc = tsr_manifest_sort(&s->tab, err))) goto fail;
    if ((rc = tsr_manifest_validate(&s->tab, name, TSR_MF_PARTIAL, err))) goto fail;
    if ((rc = tsr_manifest_encode(&s->tab, TSR_MF_PLAIN, &s->table_bytes, &s->table_len, err))) goto fail;
    s->finished = 1;
    if (table) *table = s->table_bytes;
    if (table_len) *table_len = s->table_len;
    return 0;
fail:
    s->failed = 1;
    return rc;
}

int tsr_save_commit(tsr_save *s, const uint8_t *const *tables, const size_t *table_lens, size_t n,
                    uint64_t step, const tsr_layout *layout, tsr_error *err) {
    if (!s->finished) return tsr_err(err, TSR_EINVAL, "commit before tsr_save_finish");
    const uint8_t *own = s->table_bytes;
    size_t own_len = s->table_len;
    if (n == 0) {
        tables = &own;
        table_lens = &own_len;
        n = 1;
    }
    uint8_t *bytes = NULL;
    size_t len = 0;
    /* the fence, read just before the commit point (on S3 a GET before the
     * MANIFEST's PUT); a fence raised between the two is the readers' to
     * enforce (FORMAT.md 4.6). A writer without an epoch commits as the
     * folder's epoch of now. */
    uint64_t epoch = s->opts.epoch;
    int rc = tsr_fence_admit(s->dir, &epoch, 1, err);
    if (!rc) rc = save_merge_tables(tables, table_lens, n, s->save_id, step, epoch, layout, s->declared,
                                    s->n_declared, &bytes, &len, err);
    if (rc == TSR_ECORRUPT || rc == TSR_EINVAL) tsr_err_prefix(err, "%s: cannot commit", s->dir);
    /* with an epoch the commit never replaces one: a writer whose check just
     * passed cannot put over a newer launch's commit of the same step */
    if (!rc) rc = s->opts.epoch ? tsr_store_put_new(s->store, "MANIFEST", bytes, len, err)
                                : tsr_store_put_atomic(s->store, "MANIFEST", bytes, len, err);
    free(bytes);
    return rc;
}

void tsr_save_abort(tsr_save *s) {
    if (!s) return;
    int had = s->wf != NULL; /* its abort removed the file, if still its own */
    if (s->wf) tsr_wfile_abort(s->wf);
    s->wf = NULL;
    if (s->store && !s->opts.epoch) { /* with an epoch, a name is removed only by its own writer */
        char name[64];
        tsr_data_file_name(s->file_id, name, sizeof name);
        if (!had) tsr_store_remove(s->store, name, NULL);
        tsr_store_remove(s->store, "MANIFEST.tmp", NULL);
    }
    s->failed = 1;
}

void tsr_save_free(tsr_save *s) {
    if (!s) return;
    if (s->wf) tsr_wfile_abort(s->wf);
    if (s->own_enc) tsr_encoder_free(s->enc);
    free(s->index.slot);
    free(s->table_bytes);
    free(s->late);
    free(s->declared);
    tsr_manifest_free(&s->tab);
    tsr_store_close(s->store);
    free(s);
}
