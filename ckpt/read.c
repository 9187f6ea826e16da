/* read.c: the reader of format v1: open and validate a MANIFEST, read boxes,
 * whole tensors and blobs frame by frame (verify.c checks a whole checkpoint). */
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "codec.h"
#include "common.h"
#include "fence.h"
#include "manifest.h"
#include "pool.h"
#include "store.h"
#include "load_fault.h"
#include "tsr_ckpt.h"
#include "read_impl.h"

static void reader_free(struct reader *r);


tsr_ckpt *tsr_ckpt_open_manifest(const char *step_dir, const uint8_t *buf, size_t len, tsr_error *err) {
    tsr_ckpt *ck = calloc(1, sizeof *ck);
    if (!ck) {
        tsr_err(err, TSR_ENOMEM, "out of memory");
        return NULL;
    }
    snprintf(ck->dir, sizeof ck->dir, "%s", step_dir);
    pthread_mutex_init(&ck->codec_mu, NULL);
    tsr_manifest_init(&ck->m);
    ck->store = tsr_store_open(step_dir, 0, err);
    if (!ck->store) goto fail;
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/MANIFEST", step_dir);
    if (tsr_manifest_parse(buf, len, path, 0, &ck->m, err)) goto fail;
    ck->files = calloc(ck->m.n_files + 1, sizeof *ck->files);
    ck->tensor_stored = calloc(ck->m.n_tensors + 1, sizeof *ck->tensor_stored);
    if (!ck->files || !ck->tensor_stored) {
        tsr_err(err, TSR_ENOMEM, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < ck->m.n_files; i++) pthread_mutex_init(&ck->files[i].mu, NULL);
    for (size_t i = 0; i < ck->m.n_chunks; i++) {
        const tsr_mf_chunk *c = &ck->m.chunks[i];
        for (uint32_t k = 0; k < c->frame_count; k++)
            ck->tensor_stored[c->tensor] += ck->m.frames[c->frame_first + k].stored_size;
    }
    return ck;
fail:
    tsr_ckpt_close(ck);
    return NULL;
}

/* The reader's rule of FORMAT.md 4.6 on the MANIFEST bytes of step_dir (their
 * header's step and epoch; the rest is validated when it is parsed). A FENCE
 * that cannot be read voids nothing (it is logged; writers refuse it). */
static int check_fence(const char *step_dir, const uint8_t *buf, size_t len, tsr_error *err) {
    char root[PATH_MAX];
    if (len < TSR_MF_HEADER_SIZE || memcmp(buf, TSR_MF_MAGIC, 8) != 0 || !tsr_fence_root(step_dir, root, sizeof root))
        return 0;
    uint64_t step = tsr_ld64(buf + 24), epoch = tsr_ld64(buf + 88);
    tsr_fence f;
    tsr_error e = {0};
    if (tsr_fence_read(root, &f, &e)) {
        tsr_log(1, "%s (the fence is not applied to %s)", e.msg, step_dir);
        return 0;
    }
    const tsr_fence_rec *by = tsr_fence_voids(&f, epoch, step);
    int rc = 0;
    if (by) {
        char t[32];
        tsr_fence_step_text(by, t, sizeof t);
        rc = tsr_err(err, TSR_EBUSY, "fenced: %s: step %llu of epoch %llu was committed after the fence of epoch %llu, "
                     "whose newest step was %s (%s/%s): not a valid commit", step_dir, (unsigned long long)step,
                     (unsigned long long)epoch, (unsigned long long)by->epoch, t, root, TSR_FENCE_NAME);
    }
    tsr_fence_free(&f);
    return rc;
}

int tsr_ckpt_read_manifest(const char *step_dir, uint8_t **buf, size_t *len, tsr_error *err) {
    tsr_store *st = tsr_store_open(step_dir, 0, err);
    if (!st) return err ? err->code : TSR_ENOTFOUND;
    int rc = tsr_store_get(st, "MANIFEST", TSR_MF_MAX_SIZE, buf, len, err);
    tsr_store_close(st);
    if (rc == TSR_ENOTFOUND) rc = tsr_err(err, TSR_ENOTFOUND, "%s: no MANIFEST (not a committed checkpoint)", step_dir);
    if (!rc && (rc = check_fence(step_dir, *buf, *len, err))) {
        free(*buf);
        *buf = NULL;
    }
    return rc;
}

tsr_ckpt *tsr_ckpt_open(const char *step_dir, tsr_error *err) {
    uint8_t *buf = NULL;
    size_t len = 0;
    if (tsr_ckpt_read_manifest(step_dir, &buf, &len, err)) return NULL;
    tsr_ckpt *ck = tsr_ckpt_open_manifest(step_dir, buf, len, err);
    free(buf);
    return ck;
}

void tsr_ckpt_close(tsr_ckpt *ck) {
    if (!ck) return;
    if (ck->files)
        for (size_t i = 0; i < ck->m.n_files; i++) {
            tsr_rfile_close(ck->files[i].rf);
            pthread_mutex_destroy(&ck->files[i].mu);
        }
    for (size_t i = 0; i < ck->n_free_codecs; i++) reader_free(ck->free_codecs[i]);
    free(ck->free_codecs);
    pthread_mutex_destroy(&ck->codec_mu);
    free(ck->files);
    free(ck->tensor_stored);
    tsr_manifest_free(&ck->m);
    tsr_store_close(ck->store);
    free(ck);
}

uint64_t tsr_ckpt_step(const tsr_ckpt *ck) { return ck->m.step; }
uint64_t tsr_ckpt_epoch(const tsr_ckpt *ck) { return ck->m.epoch; }
uint32_t tsr_ckpt_version(const tsr_ckpt *ck) {
    return (uint32_t)ck->m.version_major << 16 | ck->m.version_minor;
}
const uint8_t *tsr_ckpt_save_id(const tsr_ckpt *ck) { return ck->m.save_id; }
tsr_layout tsr_ckpt_layout(const tsr_ckpt *ck) { return ck->m.layout; }
const char *tsr_ckpt_dir(const tsr_ckpt *ck) { return ck->dir; }
size_t tsr_ckpt_n_tensors(const tsr_ckpt *ck) { return ck->m.n_tensors; }
size_t tsr_ckpt_n_chunks(const tsr_ckpt *ck) { return ck->m.n_chunks; }
size_t tsr_ckpt_n_frames(const tsr_ckpt *ck) { return ck->m.n_frames; }
size_t tsr_ckpt_n_blobs(const tsr_ckpt *ck) { return ck->m.n_blobs; }
size_t tsr_ckpt_n_files(const tsr_ckpt *ck) { return ck->m.n_files; }

int tsr_ckpt_tensor(const tsr_ckpt *ck, size_t i, tsr_tensor_info *out) {
    if (i >= ck->m.n_tensors) return tsr_err(NULL, TSR_EINVAL, "no tensor %zu", i);
    const tsr_mf_tensor *t = &ck->m.tensors[i];
    out->name = t->name;
    out->group = t->group;
    out->dtype = t->dtype;
    out->ndim = t->ndim;
    memcpy(out->shape, t->shape, sizeof out->shape);
    out->placement = t->placement;
    out->n_chunks = t->chunk_count;
    out->first_chunk = t->chunk_first;
    out->raw_bytes = tsr_dtype_size(t->dtype);
    for (uint32_t d = 0; d < t->ndim; d++) out->raw_bytes *= t->shape[d];
    out->stored_bytes = ck->tensor_stored[i];
    return 0;
}

int tsr_ckpt_tensor_digest(const tsr_ckpt *ck, size_t i, uint64_t *digest) {
    if (i >= ck->m.n_tensors) return TSR_EINVAL;
    if (!(ck->m.tensors[i].digest_flags & TSR_MF_DIGEST)) return 0;
    *digest = ck->m.tensors[i].digest;
    return 1;
}

int tsr_ckpt_tensor_stats(const tsr_ckpt *ck, size_t i, tsr_stats *out) {
    if (i >= ck->m.n_tensors) return TSR_EINVAL;
    if (!(ck->m.tensors[i].digest_flags & TSR_MF_STATS)) return 0;
    *out = ck->m.tensors[i].stats;
    return 1;
}

int tsr_ckpt_poisoned(const tsr_ckpt *ck) { return (ck->m.flags & TSR_MF_POISONED) != 0; }

int tsr_ckpt_chunk(const tsr_ckpt *ck, size_t i, tsr_chunk_info *out) {
    if (i >= ck->m.n_chunks) return TSR_EINVAL;
    const tsr_mf_chunk *c = &ck->m.chunks[i];
    *out = (tsr_chunk_info){c->tensor, c->file_id, c->box, c->frame_count, c->split_dim, c->frame_rows,
                            c->frame_first};
    return 0;
}

int tsr_ckpt_frame(const tsr_ckpt *ck, size_t i, tsr_frame_info *out) {
    if (i >= ck->m.n_frames) return TSR_EINVAL;
    const tsr_mf_frame *f = &ck->m.frames[i];
    *out = (tsr_frame_info){f->file_id, f->offset, f->stored_size, f->raw_size, f->raw_hash,
                            f->stored_hash, f->codec};
    return 0;
}

int tsr_ckpt_blob(const tsr_ckpt *ck, size_t i, tsr_blob_info *out) {
    if (i >= ck->m.n_blobs) return TSR_EINVAL;
    const tsr_mf_blob *b = &ck->m.blobs[i];
    *out = (tsr_blob_info){b->name, b->rank, b->size, b->file_id, b->frame_count, b->frame_first};
    return 0;
}

int tsr_ckpt_file(const tsr_ckpt *ck, size_t i, tsr_file_info *out) {
    if (i >= ck->m.n_files) return TSR_EINVAL;
    *out = (tsr_file_info){ck->m.files[i].id, ck->m.files[i].size};
    return 0;
}

long tsr_ckpt_find(const tsr_ckpt *ck, const char *name) {
    size_t lo = 0, hi = ck->m.n_tensors;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(ck->m.tensors[mid].name, name);
        if (c == 0) return (long)mid;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

long tsr_ckpt_find_blob(const tsr_ckpt *ck, const char *name, int32_t rank) {
    for (size_t i = 0; i < ck->m.n_blobs; i++)
        if (ck->m.blobs[i].rank == rank && strcmp(ck->m.blobs[i].name, name) == 0) return (long)i;
    return -1;
}

/* ----------------------------------------------------------- frames */

size_t ckpt_file_index(const tsr_ckpt *ck, uint32_t id) {
    size_t lo = 0, hi = ck->m.n_files;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (ck->m.files[mid].id < id) lo = mid + 1;
        else hi = mid;
    }
    return lo; /* the manifest guarantees the id exists */
}

/* Opens data file `fi` on first use and checks its size and header. */
int ckpt_open_file(tsr_ckpt *ck, size_t fi, tsr_rfile **out, tsr_error *err) {
    data_file *df = &ck->files[fi];
    pthread_mutex_lock(&df->mu);
    if (df->state == 0) {
        const tsr_mf_file *mf = &ck->m.files[fi];
        char name[64], path[PATH_MAX + 64];
        tsr_data_file_name(mf->id, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s", ck->dir, name);
        uint64_t size = 0;
        int rc = tsr_store_open_read(ck->store, name, &df->rf, &size, &df->err);
        if (!rc && size != mf->size)
            rc = tsr_err(&df->err, TSR_ECORRUPT, "%s: %llu bytes, the MANIFEST says %llu", path,
                         (unsigned long long)size, (unsigned long long)mf->size);
        if (!rc) {
            uint8_t *hdr = malloc(TSR_DATA_HEADER_SIZE);
            if (!hdr) rc = tsr_err(&df->err, TSR_ENOMEM, "out of memory");
            if (!rc) rc = tsr_rfile_read(df->rf, hdr, TSR_DATA_HEADER_SIZE, 0, &df->err);
            if (!rc) rc = tsr_data_header_check(hdr, mf->id, ck->m.save_id, path, &df->err);
            free(hdr);
        }
        df->state = rc ? rc : 1;
    }
    int rc = df->state < 0 ? df->state : 0;
    if (rc && err) *err = df->err;
    *out = df->rf;
    pthread_mutex_unlock(&df->mu);
    return rc;
}


void ckpt_frame_buf_free(frame_buf *b) {
    free(b->stored);
    free(b->raw);
}

/* A reader: a codec and frame buffers, pooled in the tsr_ckpt so that reads,
 * from any thread, neither set up codecs nor allocate buffers frame by frame. */
typedef struct reader {
    tsr_codec *codec;
    frame_buf fb;
} reader;

static void reader_free(struct reader *r) {
    if (!r) return;
    tsr_codec_free(r->codec);
    ckpt_frame_buf_free(&r->fb);
    free(r);
}

static reader *reader_get(tsr_ckpt *ck) {
    reader *r = NULL;
    pthread_mutex_lock(&ck->codec_mu);
    if (ck->n_free_codecs) r = ck->free_codecs[--ck->n_free_codecs];
    pthread_mutex_unlock(&ck->codec_mu);
    if (r) return r;
    r = calloc(1, sizeof *r);
    if (r && !(r->codec = tsr_codec_new())) {
        free(r);
        r = NULL;
    }
    return r;
}

static void reader_put(tsr_ckpt *ck, reader *r) {
    if (!r) return;
    pthread_mutex_lock(&ck->codec_mu);
    if (tsr_grow((void **)&ck->free_codecs, &ck->cap_free_codecs, ck->n_free_codecs, sizeof *ck->free_codecs)) {
        pthread_mutex_unlock(&ck->codec_mu);
        reader_free(r);
        return;
    }
    ck->free_codecs[ck->n_free_codecs++] = r;
    pthread_mutex_unlock(&ck->codec_mu);
}

/* Describes frame fi for messages: "data-00003.tsd: frame 17 of layers.4.wq". */
static void frame_where(const tsr_ckpt *ck, size_t fi, const char *owner, char *buf, size_t len) {
    const tsr_mf_frame *f = &ck->m.frames[fi];
    char name[64];
    tsr_data_file_name(f->file_id, name, sizeof name);
    snprintf(buf, len, "%s/%s: frame %zu (offset %llu) of %s", ck->dir, name, fi,
             (unsigned long long)f->offset, owner);
}

/* Frame fi's stored bytes at st (padded to TSR_ALIGN): their checksum (unless
 * the caller's digest check proves what they hold: by_digest) and the zero
 * padding checked. */
static int check_stored(const tsr_ckpt *ck, size_t fi, const char *owner, const uint8_t *st, int by_digest,
                        tsr_error *err) {
    const tsr_mf_frame *f = &ck->m.frames[fi];
    char where[PATH_MAX + 400];
    if (!by_digest && tsr_hash(st, f->stored_size) != f->stored_hash) {
        frame_where(ck, fi, owner, where, sizeof where);
        return tsr_err(err, TSR_ECORRUPT, "%s: checksum mismatch (stored bytes)", where);
    }
    for (size_t i = f->stored_size; i < tsr_align_up(f->stored_size, TSR_ALIGN); i++)
        if (st[i]) {
            frame_where(ck, fi, owner, where, sizeof where);
            return tsr_err(err, TSR_ECORRUPT, "%s: nonzero padding byte at file offset %llu", where,
                           (unsigned long long)(f->offset + i));
        }
    return 0;
}

static int fault_decode; /* tsr_ckpt_set_fault_decode */

void tsr_ckpt_set_fault_decode(int on) { fault_decode = on; }

/* Frame fi's stored bytes st (checked by the caller) decoded into raw (raw_size
 * bytes), and the raw checksum checked unless the caller's digest check proves
 * the decoded bytes (by_digest); *out is raw, or st itself for a raw frame (then
 * raw is not touched and may be NULL). */
static int decode_frame(const tsr_ckpt *ck, size_t fi, int dtype, const char *owner, const uint8_t *st, uint8_t *raw,
                        tsr_codec *codec, int by_digest, const uint8_t **out, tsr_error *err) {
    const tsr_mf_frame *f = &ck->m.frames[fi];
    char where[PATH_MAX + 400];
    int as_is = f->codec == TSR_CODEC_RAW && f->stored_size == f->raw_size; /* no decoding copy */
    int rc = as_is ? 0 : tsr_frame_decode(codec, dtype, f->codec, st, f->stored_size, raw, f->raw_size, err);
    if (rc) {
        frame_where(ck, fi, owner, where, sizeof where);
        tsr_err_prefix(err, "%s", where);
        return rc;
    }
    *out = as_is ? st : raw;
    if (fault_decode && !as_is && f->raw_size) raw[f->raw_size / 2] ^= 0x10; /* a decoder gone wrong */
    /* a raw frame's bytes are checked already when both checksums are one */
    if ((!as_is || f->raw_hash != f->stored_hash) && !by_digest && tsr_hash(*out, f->raw_size) != f->raw_hash) {
        frame_where(ck, fi, owner, where, sizeof where);
        return tsr_err(err, TSR_ECORRUPT, "%s: checksum mismatch (decoded bytes)", where);
    }
    return 0;
}

/* The stored bytes [off, off + len) of the data file of id file_id: the file's
 * own pages where the store maps it (a file in memory: no read), else read into
 * b->stored. */
static int fetch_stored(tsr_ckpt *ck, uint32_t file_id, uint64_t off, size_t len, frame_buf *b, const uint8_t **st,
                        tsr_error *err) {
    tsr_rfile *rf;
    int rc = ckpt_open_file(ck, ckpt_file_index(ck, file_id), &rf, err);
    if (rc) return rc;
    if ((*st = tsr_rfile_map(rf, off, len))) return 0;
    if (b->stored_cap < len) {
        free(b->stored);
        b->stored = tsr_alloc_aligned(len);
        b->stored_cap = b->stored ? len : 0;
        if (!b->stored) return tsr_err(err, TSR_ENOMEM, "out of memory");
    }
    *st = b->stored;
    return tsr_rfile_read(rf, b->stored, len, off, err);
}

/* Frame fi's stored bytes st: its padding and both checksums checked (with
 * by_digest neither: the caller's digest check of the whole tensor proves the
 * bytes that land, from the file through the decoder), and decoded into b->out
 * (b->raw, or st itself for a raw frame), or with `into` an encoded frame
 * straight into that memory (raw_size bytes; b->out is then into). `dtype` is
 * its tensor's dtype (TSR_U8 for a blob). */
static int decode_stored(tsr_ckpt *ck, size_t fi, int dtype, const char *owner, frame_buf *b, const uint8_t *st,
                         uint8_t *into, tsr_codec *codec, int by_digest, tsr_error *err) {
    const tsr_mf_frame *f = &ck->m.frames[fi];
    int as_is = f->codec == TSR_CODEC_RAW && f->stored_size == f->raw_size; /* no decoding copy */
    if (!as_is && !into && b->raw_cap < f->raw_size) {
        free(b->raw);
        b->raw = malloc(f->raw_size);
        b->raw_cap = b->raw ? f->raw_size : 0;
        if (!b->raw) return tsr_err(err, TSR_ENOMEM, "out of memory");
    }
    int rc = check_stored(ck, fi, owner, st, by_digest, err);
    return rc ? rc : decode_frame(ck, fi, dtype, owner, st, into ? into : b->raw, codec, by_digest, &b->out, err);
}

int ckpt_read_frame(tsr_ckpt *ck, size_t fi, int dtype, const char *owner, frame_buf *b, uint8_t *into,
                    tsr_codec *codec, int by_digest, tsr_error *err) {
    const tsr_mf_frame *f = &ck->m.frames[fi];
    const uint8_t *st;
    int rc = fetch_stored(ck, f->file_id, f->offset, tsr_align_up(f->stored_size, TSR_ALIGN), b, &st, err);
    return rc ? rc : decode_stored(ck, fi, dtype, owner, b, st, into, codec, by_digest, err);
}

int tsr_ckpt_read_stored(tsr_ckpt *ck, size_t fi, void *dst, tsr_error *err) {
    if (fi >= ck->m.n_frames) return tsr_err(err, TSR_EINVAL, "%s: no frame %zu", ck->dir, fi);
    const tsr_mf_frame *f = &ck->m.frames[fi];
    tsr_rfile *rf;
    int rc = ckpt_open_file(ck, ckpt_file_index(ck, f->file_id), &rf, err);
    if (rc) return rc;
    size_t padded = tsr_align_up(f->stored_size, TSR_ALIGN);
    const uint8_t *st = tsr_rfile_map(rf, f->offset, padded);
    if (st) memcpy(dst, st, padded);
    else if ((rc = tsr_rfile_read(rf, dst, padded, f->offset, err))) return rc;
    return check_stored(ck, fi, "a chunk copied as it is stored", dst, 0, err);
}

/* The dtype its codec sees (TSR_U8 for a blob's) and the owner ("tensor NAME",
 * "blob NAME (rank R)") of frame fi: chunks hold the first frames, in chunk
 * order, blobs the rest (the validator). */
static int frame_owner(const tsr_ckpt *ck, size_t fi, char *owner, size_t len) {
    const tsr_manifest *m = &ck->m;
    size_t lo = 0, hi = m->n_chunks;
    while (lo < hi) { /* the last chunk whose frames start at or before fi */
        size_t mid = (lo + hi) / 2;
        if (m->chunks[mid].frame_first <= fi) lo = mid + 1;
        else hi = mid;
    }
    if (lo && fi - m->chunks[lo - 1].frame_first < m->chunks[lo - 1].frame_count) {
        const tsr_mf_tensor *t = &m->tensors[m->chunks[lo - 1].tensor];
        snprintf(owner, len, "tensor %s", t->name);
        return t->dtype;
    }
    for (size_t i = 0; i < m->n_blobs; i++)
        if (fi - m->blobs[i].frame_first < m->blobs[i].frame_count) {
            snprintf(owner, len, "blob %s (rank %d)", m->blobs[i].name, m->blobs[i].rank);
            return TSR_U8;
        }
    snprintf(owner, len, "no tensor or blob");
    return TSR_U8;
}

int tsr_ckpt_frame_owner(const tsr_ckpt *ck, size_t i, char *buf, size_t len) {
    if (i >= ck->m.n_frames) return tsr_err(NULL, TSR_EINVAL, "no frame %zu", i);
    frame_owner(ck, i, buf, len);
    return 0;
}

int tsr_ckpt_check_frame(tsr_ckpt *ck, size_t fi, const void *stored, void *raw, tsr_error *err) {
    if (fi >= ck->m.n_frames) return tsr_err(err, TSR_EINVAL, "%s: no frame %zu", ck->dir, fi);
    const tsr_mf_frame *f = &ck->m.frames[fi];
    char owner[300], where[PATH_MAX + 700];
    int dtype = frame_owner(ck, fi, owner, sizeof owner);
    if (tsr_hash(stored, f->stored_size) != f->stored_hash) {
        frame_where(ck, fi, owner, where, sizeof where);
        return tsr_err(err, TSR_ECORRUPT, "%s: checksum mismatch (stored bytes)", where);
    }
    reader *rd = reader_get(ck);
    if (!rd) return tsr_err(err, TSR_ENOMEM, "out of memory");
    const uint8_t *out;
    int rc = decode_frame(ck, fi, dtype, owner, stored, raw, rd->codec, 0, &out, err);
    reader_put(ck, rd);
    if (!rc && out != raw) memcpy(raw, out, f->raw_size);
    return rc;
}

/* ------------------------------------------------------------- reading */

typedef struct read_ctx {
    tsr_ckpt *ck;
    const tsr_mf_tensor *t;
    const tsr_mf_chunk *c;
    const tsr_box *box; /* the destination box */
    const tsr_box *region;
    void *dst;
    frame_buf *fb;
    tsr_codec *codec;
    tsr_error *err;
    const tsr_box *share_box; /* with the digest's share: the box dst's memory is of (NULL: none) */
    int by_digest;            /* the caller's digest check proves what lands: no checksums */
    uint64_t share;
} read_ctx;

#define SHARE_SLAB (128u << 10) /* bytes copied, then their share taken while in cache */

/* Part `part` of frame box fbox (decoded in r->fb) into dst, unless it is
 * there already (landed: decoded into it), and with share_box its digest share
 * taken from dst slab by slab, each right after its copy (the share of what
 * landed, as dst's memory holds it). */
static void land(read_ctx *r, const tsr_box *fbox, const tsr_box *part, int landed) {
    size_t es = tsr_dtype_size(r->t->dtype);
    if (!r->share_box) {
        if (!landed) tsr_box_copy(r->dst, r->box, r->fb->out, fbox, part, es);
        return;
    }
    uint64_t rows = part->ndim ? part->extent[0] : 1, row_bytes = tsr_box_volume(part) / rows * es;
    uint64_t step = row_bytes >= SHARE_SLAB ? 1 : SHARE_SLAB / row_bytes, volume = 1;
    tsr_digest_acc acc; /* the slabs follow each other: one share for the part */
    tsr_digest_acc_init(&acc);
    for (uint32_t d = 0; d < r->t->ndim; d++) volume *= r->t->shape[d];
    for (uint64_t lo = 0; lo < rows; lo += step) {
        tsr_box slab = *part;
        if (slab.ndim) slab.offset[0] += lo, slab.extent[0] = rows - lo < step ? rows - lo : step;
        if (!landed) tsr_box_copy(r->dst, r->box, r->fb->out, fbox, &slab, es);
        for (uint32_t d = 0; d < slab.ndim; d++) slab.offset[d] += r->share_box->offset[d] - r->box->offset[d];
        tsr_digest_acc_region(&acc, es, r->t->shape, r->share_box, r->dst, &slab);
    }
    r->share ^= tsr_digest_acc_share(&acc, es, volume);
}

/* Where in dst frame box fbox lies, when all of it lands there and in one run
 * of dst's memory (dims before some dim j of extent 1, dims after it whole):
 * its frame can be decoded there, without a copy. NULL otherwise. */
static uint8_t *in_place(const read_ctx *r, const tsr_box *fbox, const tsr_box *part) {
    const tsr_box *d = r->box;
    if (tsr_box_volume(part) != tsr_box_volume(fbox)) return NULL;
    int j = (int)fbox->ndim - 1;
    while (j > 0 && fbox->extent[j] == d->extent[j]) j--;
    for (int k = 0; k < j; k++)
        if (fbox->extent[k] != 1) return NULL;
    uint64_t off = 0;
    for (uint32_t k = 0; k < fbox->ndim; k++) off = off * d->extent[k] + (fbox->offset[k] - d->offset[k]);
    return (uint8_t *)r->dst + off * tsr_dtype_size(r->t->dtype);
}

static int read_one_frame(void *user, uint64_t k) {
    read_ctx *r = user;
    size_t fi = r->c->frame_first + k;
    tsr_box fbox, part;
    tsr_frame_box(r->c, k, &fbox);
    if (!tsr_box_intersect(&fbox, r->region, &part)) return 0;
    uint8_t *into = in_place(r, &fbox, &part);
    int rc = ckpt_read_frame(r->ck, fi, r->t->dtype, r->t->name, r->fb, into, r->codec, r->by_digest, r->err);
    if (rc) return rc;
    land(r, &fbox, &part, into && r->fb->out == into);
    return 0;
}

int tsr_ckpt_read_chunk(tsr_ckpt *ck, size_t chunk, const tsr_box *region, void *dst, const tsr_box *dst_box,
                        tsr_error *err) {
    if (chunk >= ck->m.n_chunks) return tsr_err(err, TSR_EINVAL, "%s: no chunk %zu", ck->dir, chunk);
    const tsr_mf_chunk *c = &ck->m.chunks[chunk];
    if (!tsr_box_contains(&c->box, region) || !tsr_box_contains(dst_box, region))
        return tsr_err(err, TSR_EINVAL, "%s: chunk %zu of %s: region outside the chunk or the destination", ck->dir,
                       chunk, ck->m.tensors[c->tensor].name);
    if (tsr_box_volume(region) == 0) return 0;
    reader *rd = reader_get(ck);
    if (!rd) return tsr_err(err, TSR_ENOMEM, "out of memory");
    read_ctx r = {ck, &ck->m.tensors[c->tensor], c, dst_box, region, dst, &rd->fb, rd->codec, err, NULL, 0, 0};
    int rc = tsr_frames_in(c, region, read_one_frame, &r);
    reader_put(ck, rd);
    return rc;
}

/* Checks that box lies inside tensor t's shape. */
static int check_box(const tsr_mf_tensor *t, const tsr_box *box, tsr_error *err) {
    if (box->ndim != t->ndim)
        return tsr_err(err, TSR_EINVAL, "%s: box has %u dims, tensor has %u", t->name, box->ndim, t->ndim);
    for (uint32_t d = 0; d < t->ndim; d++)
        if (box->offset[d] > t->shape[d] || box->extent[d] > t->shape[d] - box->offset[d])
            return tsr_err(err, TSR_EINVAL, "%s: box outside the tensor's shape in dim %u", t->name, d);
    return 0;
}

/* --------------------------------------------------------- read plans */

typedef struct plan_ctx {
    const tsr_mf_chunk *c;
    const tsr_box *region;
    tsr_read_piece piece; /* need and chunk set; frame and region per frame */
    tsr_read_piece **out;
    size_t n, cap;
} plan_ctx;

static int add_piece(void *user, uint64_t k) {
    plan_ctx *p = user;
    tsr_box fb;
    tsr_frame_box(p->c, k, &fb);
    if (!tsr_box_intersect(&fb, p->region, &p->piece.region)) return 0;
    if (tsr_grow((void **)p->out, &p->cap, p->n, sizeof **p->out)) return TSR_ENOMEM;
    p->piece.frame = p->c->frame_first + (uint32_t)k;
    (*p->out)[p->n++] = p->piece;
    return 0;
}


int tsr_ckpt_plan_read(const tsr_ckpt *ck, size_t tensor, const tsr_box *need, size_t n_need, tsr_read_piece **out,
                       size_t *n_out, tsr_error *err) {
    *out = NULL;
    *n_out = 0;
    if (tensor >= ck->m.n_tensors) return tsr_err(err, TSR_EINVAL, "%s: no tensor %zu", ck->dir, tensor);
    const tsr_mf_tensor *t = &ck->m.tensors[tensor];
    for (size_t i = 0; i < n_need; i++) {
        int rc = check_box(t, &need[i], err);
        if (rc) return rc;
    }
    const tsr_mf_chunk *cs = ck->m.chunks + t->chunk_first;
    tsr_box *have = malloc(((size_t)t->chunk_count + 1) * sizeof *have);
    if (!have) return tsr_err(err, TSR_ENOMEM, "out of memory");
    for (uint32_t c = 0; c < t->chunk_count; c++) have[c] = cs[c].box;
    tsr_overlap *ov = NULL;
    size_t nov = 0;
    int rc = tsr_plan_overlaps(need, n_need, have, t->chunk_count, &ov, &nov, err);
    free(have);
    plan_ctx p = {.out = out};
    for (size_t k = 0; !rc && k < nov; k++) {
        p.c = &cs[ov[k].have];
        p.region = &ov[k].region;
        p.piece = (tsr_read_piece){.need = ov[k].need, .chunk = t->chunk_first + ov[k].have};
        if (tsr_frames_in(p.c, p.region, add_piece, &p)) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    }
    free(ov);
    if (rc) {
        free(*out);
        *out = NULL;
        return rc;
    }
    *n_out = p.n;
    return 0;
}

/* ------------------------------------------------------ many reads at once */

#define EXTENT_MAX (8u << 20) /* bytes of neighbouring frames read at once */

/* One frame's part of one read. */
typedef struct many_item {
    uint32_t req, chunk, frame;
    tsr_box region; /* global indices: in the read's box, the chunk and the frame */
    uint64_t share; /* of the read's digest, once landed (a read held to it) */
} many_item;

typedef struct many_ctx {
    tsr_ckpt *ck;
    const tsr_read_req *reqs;
    const uint8_t *held;      /* each read (NULL: none): its share taken, its frames' checksums left to the caller's digest */
    const tsr_box *share_box; /* each read's box its share is taken as (NULL: the read's own) */
    many_item *items;         /* by (file, offset) */
    size_t *ext;              /* extent e: items [ext[e], ext[e + 1]) */
    reader **readers;         /* per worker */
    pthread_mutex_t mu;
    int rc;
    tsr_error err;
} many_ctx;

static int item_order(const void *a, const void *b, void *ctx) {
    const tsr_mf_frame *fr = ctx, *x = &fr[((const many_item *)a)->frame], *y = &fr[((const many_item *)b)->frame];
    if (x->file_id != y->file_id) return x->file_id < y->file_id ? -1 : 1;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    uint32_t ra = ((const many_item *)a)->req, rb = ((const many_item *)b)->req;
    return (ra > rb) - (ra < rb);
}

/* Items [a, b) of one frame, its stored bytes at st: checked and decoded once,
 * each item's part landed in its read's memory. */
static int land_items(many_ctx *m, many_item *a, many_item *b, const uint8_t *st, reader *rd, tsr_error *err) {
    tsr_ckpt *ck = m->ck;
    if (a->chunk == UINT32_MAX) { /* a blob's frame: region.offset[0] is where it lies in the blob */
        char owner[300];
        snprintf(owner, sizeof owner, "blob %s", ck->m.blobs[m->reqs[a->req].tensor].name);
        uint8_t *into = b - a == 1 ? (uint8_t *)m->reqs[a->req].dst + a->region.offset[0] : NULL;
        int rc = decode_stored(ck, a->frame, TSR_U8, owner, &rd->fb, st, into, rd->codec, 0, err);
        for (many_item *it = a; !rc && it < b; it++) {
            uint8_t *to = (uint8_t *)m->reqs[it->req].dst + it->region.offset[0];
            if (rd->fb.out != to) memcpy(to, rd->fb.out, ck->m.frames[a->frame].raw_size);
        }
        return rc;
    }
    const tsr_mf_chunk *c = &ck->m.chunks[a->chunk];
    const tsr_mf_tensor *t = &ck->m.tensors[c->tensor];
    int by_digest = m->held != NULL; /* the checksums are skipped when every read of the frame is held */
    for (many_item *it = a; by_digest && it < b; it++) by_digest &= m->held[it->req];
    tsr_box fbox;
    tsr_frame_box(c, a->frame - c->frame_first, &fbox);
    read_ctx r = {ck, t, c, NULL, NULL, NULL, &rd->fb, rd->codec, err, NULL, by_digest, 0};
    uint8_t *into = NULL;
    if (b - a == 1) {
        r.box = &m->reqs[a->req].box, r.dst = m->reqs[a->req].dst;
        into = in_place(&r, &fbox, &a->region);
    }
    int rc = decode_stored(ck, a->frame, t->dtype, t->name, &rd->fb, st, into, rd->codec, by_digest, err);
    for (many_item *it = a; !rc && it < b; it++) {
        const tsr_read_req *q = &m->reqs[it->req];
        r.box = &q->box, r.dst = q->dst, r.share = 0;
        r.share_box = !m->held || !m->held[it->req] ? NULL : m->share_box ? &m->share_box[it->req] : &q->box;
        land(&r, &fbox, &it->region, into && rd->fb.out == into);
        it->share = r.share;
    }
    return rc;
}

/* Extent e: its neighbouring frames read at once, then each decoded and landed. */
static void read_extent(void *ctx, size_t e, int worker) {
    many_ctx *m = ctx;
    if (__atomic_load_n(&m->rc, __ATOMIC_RELAXED)) return; /* a read failed: the rest is not needed */
    tsr_ckpt *ck = m->ck;
    many_item *a = m->items + m->ext[e], *end = m->items + m->ext[e + 1];
    const tsr_mf_frame *f0 = &ck->m.frames[a->frame], *fl = &ck->m.frames[end[-1].frame];
    uint64_t off = f0->offset;
    tsr_error er = {0};
    reader *rd = m->readers[worker];
    const uint8_t *st = NULL;
    int rc = fetch_stored(ck, f0->file_id, off, fl->offset + tsr_align_up(fl->stored_size, TSR_ALIGN) - off, &rd->fb,
                          &st, &er);
    while (!rc && a < end) {
        many_item *b = a;
        while (b < end && b->frame == a->frame) b++;
        rc = land_items(m, a, b, st + (ck->m.frames[a->frame].offset - off), rd, &er);
        a = b;
    }
    if (rc) {
        pthread_mutex_lock(&m->mu);
        if (!m->rc) m->err = er, __atomic_store_n(&m->rc, rc, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&m->mu);
    }
}

/* The items of the reads, sorted, and their extents: runs of items whose frames
 * follow each other in one file, EXTENT_MAX bytes at most (a frame larger alone). */
static int plan_many(many_ctx *m, size_t n, size_t *n_items, size_t *n_ext, tsr_error *err) {
    tsr_ckpt *ck = m->ck;
    size_t ni = 0, cap = 0;
    for (size_t q = 0; q < n; q++) {
        if (m->reqs[q].blob) { /* its frames, each at its place in the blob */
            const tsr_mf_blob *bl = &ck->m.blobs[m->reqs[q].tensor];
            many_item it = {.req = (uint32_t)q, .chunk = UINT32_MAX};
            for (uint32_t k = 0; k < bl->frame_count; k++, it.region.offset[0] += ck->m.frames[it.frame].raw_size) {
                it.frame = bl->frame_first + k;
                if (tsr_grow((void **)&m->items, &cap, ni, sizeof *m->items))
                    return tsr_err(err, TSR_ENOMEM, "out of memory");
                m->items[ni++] = it;
            }
            continue;
        }
        tsr_read_piece *pc;
        size_t np;
        int rc = tsr_ckpt_plan_read(ck, m->reqs[q].tensor, &m->reqs[q].box, 1, &pc, &np, err);
        for (size_t i = 0; !rc && i < np; i++) {
            if (tsr_grow((void **)&m->items, &cap, ni, sizeof *m->items)) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
            else m->items[ni++] = (many_item){(uint32_t)q, pc[i].chunk, pc[i].frame, pc[i].region, 0};
        }
        free(pc);
        if (rc) return rc;
    }
    tsr_sort_ctx(m->items, ni, sizeof *m->items, item_order, ck->m.frames);
    if (!(m->ext = malloc((ni + 1) * sizeof *m->ext))) return tsr_err(err, TSR_ENOMEM, "out of memory");
    size_t ne = 0;
    uint64_t start = 0, next = 0;
    for (size_t i = 0; i < ni; i++) {
        const tsr_mf_frame *f = &ck->m.frames[m->items[i].frame];
        if (i && m->items[i].frame == m->items[i - 1].frame) continue;
        uint64_t end = f->offset + tsr_align_up(f->stored_size, TSR_ALIGN);
        if (!i || f->file_id != ck->m.frames[m->items[i - 1].frame].file_id || f->offset != next ||
            end - start > EXTENT_MAX)
            m->ext[ne++] = i, start = f->offset;
        next = end;
    }
    m->ext[ne] = ni;
    *n_items = ni, *n_ext = ne;
    return 0;
}

/* A read held to its tensor's digest was refused: read again with every
 * frame's checksums, so that a frame stored or decoded wrong is named, else the
 * digests named. */
static int digest_refused(tsr_ckpt *ck, const tsr_read_req *q, uint64_t got, uint64_t want, tsr_error *err) {
    int rc = tsr_ckpt_read(ck, q->tensor, &q->box, q->dst, err);
    if (rc) return rc;
    return tsr_err(err, TSR_ECORRUPT, "%s: tensor %s: the data read has digest %016llx, its MANIFEST records %016llx",
                   ck->dir, ck->m.tensors[q->tensor].name, (unsigned long long)got, (unsigned long long)want);
}

int tsr_ckpt_read_many_held(tsr_ckpt *ck, const tsr_read_req *reqs, size_t n, const uint8_t *held,
                            const tsr_box *share_box, uint64_t *share, int threads, tsr_error *err) {
    many_ctx m = {.ck = ck, .reqs = reqs, .held = held, .share_box = share_box};
    size_t ni = 0, ne = 0;
    int rc = 0;
    for (size_t q = 0; !rc && q < n; q++) {
        if (share) share[q] = 0;
        if (reqs[q].tensor >= (reqs[q].blob ? ck->m.n_blobs : ck->m.n_tensors))
            rc = tsr_err(err, TSR_EINVAL, "%s: no %s %zu", ck->dir, reqs[q].blob ? "blob" : "tensor", reqs[q].tensor);
        else if (held && held[q] && (reqs[q].blob || !share))
            rc = tsr_err(err, TSR_EINVAL, "%s: read %zu is held to a digest without a share to take", ck->dir, q);
        else if (held && held[q] && share_box &&
                 (share_box[q].ndim != reqs[q].box.ndim ||
                  memcmp(share_box[q].extent, reqs[q].box.extent, sizeof share_box[q].extent[0] * share_box[q].ndim)))
            rc = tsr_err(err, TSR_EINVAL, "%s: tensor %s: the share's box is not the read's shape", ck->dir,
                         ck->m.tensors[reqs[q].tensor].name);
    }
    if (!rc) rc = plan_many(&m, n, &ni, &ne, err); /* checks each box against its tensor's shape */
    tsr_pool *pool = NULL;
    int nw = 0;
    if (!rc && ne && (!(pool = tsr_pool_new(threads < 1 ? 1 : (size_t)threads > ne ? (int)ne : threads)) ||
                      !(m.readers = calloc((size_t)(nw = tsr_pool_size(pool)), sizeof *m.readers))))
        rc = tsr_err(err, TSR_ENOMEM, "cannot start reader threads");
    for (int w = 0; !rc && ne && w < nw; w++)
        if (!(m.readers[w] = reader_get(ck))) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    if (!rc && ne) {
        pthread_mutex_init(&m.mu, NULL);
        tsr_pool_for(pool, ne, read_extent, &m);
        pthread_mutex_destroy(&m.mu);
        if ((rc = m.rc) && err) *err = m.err;
    }
    for (int w = 0; m.readers && w < nw; w++) reader_put(ck, m.readers[w]);
    tsr_pool_free(pool);
    for (size_t i = 0; !rc && share && i < ni; i++) share[m.items[i].req] ^= m.items[i].share;
    free(m.readers), free(m.items), free(m.ext);
    return rc;
}

int tsr_ckpt_read_many(tsr_ckpt *ck, const tsr_read_req *reqs, size_t n, int check_digest, int threads,
                       tsr_error *err) {
    uint8_t *held = calloc(n + 1, 1);
    uint64_t *want = calloc(n + 1, sizeof *want), *got = calloc(n + 1, sizeof *got);
    int rc = held && want && got ? 0 : tsr_err(err, TSR_ENOMEM, "out of memory");
    for (size_t q = 0; !rc && check_digest && q < n; q++) {
        if (reqs[q].blob || reqs[q].tensor >= ck->m.n_tensors) continue; /* the latter refused by the read */
        const tsr_mf_tensor *t = &ck->m.tensors[reqs[q].tensor];
        int whole = reqs[q].box.ndim == t->ndim;
        for (uint32_t d = 0; whole && d < t->ndim; d++)
            whole = reqs[q].box.offset[d] == 0 && reqs[q].box.extent[d] == t->shape[d];
        held[q] = whole && tsr_box_volume(&reqs[q].box) && tsr_ckpt_tensor_digest(ck, reqs[q].tensor, &want[q]) == 1;
    }
    if (!rc) rc = tsr_ckpt_read_many_held(ck, reqs, n, held, NULL, got, threads, err);
    for (size_t q = 0; !rc && q < n; q++) {
        if (!held[q]) continue;
        const tsr_mf_tensor *t = &ck->m.tensors[reqs[q].tensor];
        uint64_t d = got[q] ^ tsr_digest_key(t->name, t->dtype);
        if (d != want[q]) rc = digest_refused(ck, &reqs[q], d, want[q], err);
    }
    free(got), free(held), free(want);
    return rc;
}

int tsr_ckpt_read(tsr_ckpt *ck, size_t tensor, const tsr_box *box, void *dst, tsr_error *err) {
    tsr_read_req q = {.tensor = tensor, .box = *box, .dst = dst};
    return tsr_ckpt_read_many(ck, &q, 1, 0, 1, err);
}

int tsr_ckpt_read_whole(tsr_ckpt *ck, size_t tensor, void *dst, tsr_error *err) {
    if (tensor >= ck->m.n_tensors) return tsr_err(err, TSR_EINVAL, "%s: no tensor %zu", ck->dir, tensor);
    const tsr_mf_tensor *t = &ck->m.tensors[tensor];
    tsr_read_req q = {.tensor = tensor, .box = {.ndim = t->ndim}, .dst = dst};
    for (uint32_t d = 0; d < t->ndim; d++) q.box.extent[d] = t->shape[d];
    return tsr_ckpt_read_many(ck, &q, 1, 1, 1, err);
}

int tsr_ckpt_read_blob(tsr_ckpt *ck, size_t i, void *dst, tsr_error *err) {
    tsr_read_req q = {.tensor = i, .dst = dst, .blob = 1};
    return tsr_ckpt_read_many(ck, &q, 1, 0, 1, err);
}
