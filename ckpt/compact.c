/* compact.c: a committed checkpoint with its raw frames encoded (compact.h):
 * its data files rewritten frame by frame into a store (a folder, or S3 for a
 * push), its MANIFEST updated, and `tessera ckpt compact`'s rewrite in place.
 *
 * A data file is rewritten in its frames' order, in batches of one frame per
 * thread: the batch's stored bytes are read (and checked) and its raw frames
 * encoded on the thread pool, then its writes are queued in order while the
 * next batch is read and encoded into the other group of slots. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codec.h"
#include "common.h"
#include "compact.h"
#include "manifest.h"
#include "pool.h"

#define GROUPS 2 /* slot groups: one encoded while the writes of the other drain */

typedef struct rslot {
    uint8_t *in, *out; /* aligned: a frame's stored bytes as read, and encoded */
    size_t in_cap, out_cap;
    const uint8_t *put; /* what is written: in or out, put_len bytes with padding */
    size_t put_len;
    const void *submitted; /* the buffer of its last queued write, or NULL */
    tsr_mf_frame nf;       /* the frame as rewritten (its offset set when queued) */
    int rc;
    tsr_error err;
} rslot;

struct tsr_recode {
    char dir[PATH_MAX];
    uint8_t *src_mf, *new_mf; /* the source MANIFEST's bytes; the rewritten one's */
    size_t src_len, new_len;
    tsr_manifest m;    /* the records, updated as files are rewritten */
    int parsed;
    tsr_ckpt *ck;      /* the source's frames, as they are stored */
    uint8_t *dtype;    /* per frame: the dtype its codec sees (TSR_U8 for a blob's) */
    uint32_t *order;   /* the frames by (file, offset) */
    size_t *first;     /* file i's frames: order[first[i] .. first[i + 1]) */
    tsr_pool *pool;
    tsr_codec **codecs; /* one per thread */
    rslot *slots;       /* GROUPS x threads */
    int threads, level, changed;
    tsr_recode_stats st;
    void (*progress)(void *user, uint64_t bytes);
    void *user;
};

void tsr_recode_close(tsr_recode *r) {
    if (!r) return;
    for (int i = 0; r->codecs && i < r->threads; i++) tsr_codec_free(r->codecs[i]);
    for (int i = 0; r->slots && i < GROUPS * r->threads; i++) free(r->slots[i].in), free(r->slots[i].out);
    tsr_pool_free(r->pool);
    tsr_ckpt_close(r->ck);
    if (r->parsed) tsr_manifest_free(&r->m);
    free(r->codecs), free(r->slots), free(r->dtype), free(r->order), free(r->first);
    free(r->src_mf), free(r->new_mf);
    free(r);
}

/* The frames' dtypes, and their order in the files. */
static int frame_tables(tsr_recode *r, tsr_error *err) {
    const tsr_manifest *m = &r->m;
    r->dtype = malloc(m->n_frames + 1);
    r->order = malloc((m->n_frames + 1) * sizeof *r->order);
    r->first = malloc((m->n_files + 1) * sizeof *r->first);
    if (!r->dtype || !r->order || !r->first) return tsr_err(err, TSR_ENOMEM, "out of memory");
    memset(r->dtype, TSR_U8, m->n_frames + 1); /* blob frames: bytes */
    for (size_t i = 0; i < m->n_chunks; i++) {
        const tsr_mf_chunk *c = &m->chunks[i];
        memset(r->dtype + c->frame_first, m->tensors[c->tensor].dtype, c->frame_count);
    }
    for (size_t i = 0; i < m->n_frames; i++) r->order[i] = (uint32_t)i;
    tsr_sort_ctx(r->order, m->n_frames, sizeof *r->order, tsr_mf_cmp_frame_pos, (void *)m);
    size_t k = 0;
    for (size_t i = 0; i < m->n_files; i++) {
        r->first[i] = k;
        while (k < m->n_frames && m->frames[r->order[k]].file_id == m->files[i].id) k++;
    }
    r->first[m->n_files] = k; /* every frame is in a listed file (the validator) */
    return 0;
}

tsr_recode *tsr_recode_open(const char *step_dir, int threads, tsr_error *err) {
    tsr_recode *r = calloc(1, sizeof *r);
    if (!r) {
        tsr_err(err, TSR_ENOMEM, "out of memory");
        return NULL;
    }
    snprintf(r->dir, sizeof r->dir, "%s", step_dir);
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/MANIFEST", step_dir);
    int rc = !(tsr_store_caps(step_dir) & TSR_STORE_RENAME) ? tsr_err(err, TSR_EINVAL, "%s: a local checkpoint directory is needed "
                                                     "here, not an object-store location", step_dir)
                                           : tsr_ckpt_read_manifest(step_dir, &r->src_mf, &r->src_len, err);
    if (!rc && !(rc = tsr_manifest_parse(r->src_mf, r->src_len, path, 0, &r->m, err))) r->parsed = 1;
    if (!rc && !(r->ck = tsr_ckpt_open_manifest(step_dir, r->src_mf, r->src_len, err))) rc = err ? err->code : TSR_EIO;
    if (!rc) rc = frame_tables(r, err);
    if (!rc && !(r->pool = tsr_pool_new(threads))) rc = tsr_err(err, TSR_ENOMEM, "cannot start the encoder threads");
    if (!rc) {
        r->threads = tsr_pool_size(r->pool);
        r->codecs = calloc((size_t)r->threads, sizeof *r->codecs);
        r->slots = calloc((size_t)(GROUPS * r->threads), sizeof *r->slots);
        if (!r->codecs || !r->slots) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
        for (int i = 0; !rc && i < r->threads; i++)
            if (!(r->codecs[i] = tsr_codec_new())) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    }
    r->level = tsr_write_opts_default().level; /* a save's, as for its encoded frames */
    if (rc) {
        tsr_recode_close(r);
        return NULL;
    }
    return r;
}

void tsr_recode_progress(tsr_recode *r, void (*fn)(void *user, uint64_t bytes), void *user) {
    r->progress = fn;
    r->user = user;
}

tsr_ckpt *tsr_recode_ckpt(const tsr_recode *r) { return r->ck; }

/* A raw frame of at most TSR_ALIGN bytes takes one block encoded or not: only
 * a larger one can make the file smaller. */
int tsr_recode_file_raw(const tsr_recode *r, size_t i) {
    for (size_t k = r->first[i]; k < r->first[i + 1]; k++) {
        tsr_frame_info f;
        tsr_ckpt_frame(r->ck, r->order[k], &f);
        if (f.codec == TSR_CODEC_RAW && f.raw_size > TSR_ALIGN) return 1;
    }
    return 0;
}

int tsr_recode_changed(const tsr_recode *r) { return r->changed; }

void tsr_recode_stats_get(const tsr_recode *r, tsr_recode_stats *st) { *st = r->st; }

/* ------------------------------------------------------------ rewriting */

static int reserve(uint8_t **buf, size_t *cap, size_t need) {
    need = tsr_align_up(need ? need : 1, TSR_ALIGN);
    if (*cap >= need) return 0;
    free(*buf);
    *buf = tsr_alloc_aligned(need);
    *cap = *buf ? need : 0;
    return *buf ? 0 : TSR_ENOMEM;
}

typedef struct batch {
    tsr_recode *r;
    rslot *slots;
    const uint32_t *frames; /* the frame of each slot */
} batch;

/* Slot i: its frame's stored bytes read and checked; a raw frame encoded as a
 * save with codec auto would (the codec keeps it raw where that is smaller). */
static void recode_one(void *ctx, size_t i, int worker) {
    batch *b = ctx;
    tsr_recode *r = b->r;
    rslot *s = &b->slots[i];
    uint32_t fi = b->frames[i];
    tsr_frame_info f;
    tsr_ckpt_frame(r->ck, fi, &f);
    s->nf = r->m.frames[fi];
    s->rc = 0;
    if (reserve(&s->in, &s->in_cap, f.stored_size)) {
        s->rc = tsr_err(&s->err, TSR_ENOMEM, "out of memory for a frame of %llu bytes",
                        (unsigned long long)f.stored_size);
        return;
    }
    if ((s->rc = tsr_ckpt_read_stored(r->ck, fi, s->in, &s->err))) return;
    s->put = s->in;
    if (f.codec == TSR_CODEC_RAW) {
        size_t len;
        int codec;
        if (f.stored_hash != f.raw_hash) {
            s->rc = tsr_err(&s->err, TSR_ECORRUPT, "a raw frame whose stored and raw checksums differ");
            return;
        }
        if (reserve(&s->out, &s->out_cap, tsr_codec_bound(f.raw_size))) {
            s->rc = tsr_err(&s->err, TSR_ENOMEM, "out of memory for a frame of %llu bytes",
                            (unsigned long long)f.raw_size);
            return;
        }
        s->rc = tsr_frame_encode(r->codecs[worker], r->dtype[fi], TSR_CODEC_AUTO, r->level, s->in, f.raw_size, s->out,
                                 s->out_cap, &len, &codec, &s->err);
        if (s->rc) return;
        if (codec != TSR_CODEC_RAW) {
            s->nf.codec = codec;
            s->nf.stored_size = len;
            s->nf.stored_hash = tsr_hash(s->out, len);
            memset(s->out + len, 0, tsr_align_up(len, TSR_ALIGN) - len);
            s->put = s->out;
        }
    }
    s->put_len = tsr_align_up(s->nf.stored_size, TSR_ALIGN);
}

/* "tensor NAME" or "blob NAME" for frame fi (messages). */
static void frame_owner(const tsr_manifest *m, uint32_t fi, char *buf, size_t len) {
    for (size_t i = 0; i < m->n_chunks; i++)
        if (fi - m->chunks[i].frame_first < m->chunks[i].frame_count) {
            snprintf(buf, len, "tensor %s", m->tensors[m->chunks[i].tensor].name);
            return;
        }
    for (size_t i = 0; i < m->n_blobs; i++)
        if (fi - m->blobs[i].frame_first < m->blobs[i].frame_count) {
            snprintf(buf, len, "blob %s", m->blobs[i].name);
            return;
        }
    snprintf(buf, len, "no tensor or blob");
}

/* Queues the writes of a batch of n encoded slots at *pos, in order, and
 * records the frames as rewritten. */
static int queue_batch(tsr_recode *r, size_t i, tsr_wfile *wf, rslot *slots, const uint32_t *frames, size_t n,
                       uint64_t *pos, tsr_error *err) {
    uint64_t consumed = 0;
    for (size_t j = 0; j < n; j++) {
        rslot *s = &slots[j];
        tsr_frame_info f;
        tsr_ckpt_frame(r->ck, frames[j], &f);
        if (s->rc) {
            char name[32], owner[300];
            tsr_data_file_name(r->m.files[i].id, name, sizeof name);
            frame_owner(&r->m, frames[j], owner, sizeof owner);
            if (err) *err = s->err;
            tsr_err_prefix(err, "%s/%s: frame %u at offset %llu (%s)", r->dir, name, frames[j],
                           (unsigned long long)f.offset, owner);
            return s->rc;
        }
        s->nf.offset = *pos;
        int rc = tsr_wfile_submit(wf, s->put, s->put_len, *pos, err);
        if (rc) return rc;
        s->submitted = s->put;
        if (s->nf.codec != f.codec) r->changed = 1, r->st.frames++;
        r->m.frames[frames[j]] = s->nf;
        *pos += s->put_len;
        consumed += tsr_align_up(f.stored_size, TSR_ALIGN);
    }
    if (r->progress) r->progress(r->user, consumed);
    return 0;
}

int tsr_recode_file(tsr_recode *r, size_t i, tsr_store *dst, tsr_error *err) {
    char name[32];
    tsr_data_file_name(r->m.files[i].id, name, sizeof name);
    tsr_file_info src;
    tsr_ckpt_file(r->ck, i, &src);
    tsr_wfile *wf = NULL;
    int rc = tsr_store_create(dst, name, 0, &wf, err);
    if (rc) return rc;
    uint8_t *hdr = tsr_alloc_aligned(TSR_DATA_HEADER_SIZE);
    if (!hdr) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    else tsr_data_header_encode(hdr, r->m.files[i].id, r->m.save_id);
    if (!rc) rc = tsr_wfile_write(wf, hdr, TSR_DATA_HEADER_SIZE, 0, err);
    free(hdr);
    if (!rc && r->progress) r->progress(r->user, TSR_DATA_HEADER_SIZE);
    uint64_t pos = TSR_DATA_HEADER_SIZE;
    size_t per = (size_t)r->threads;
    for (size_t k = r->first[i], g = 0; !rc && k < r->first[i + 1]; g = (g + 1) % GROUPS) {
        size_t n = r->first[i + 1] - k < per ? r->first[i + 1] - k : per;
        rslot *slots = r->slots + g * per;
        for (size_t j = 0; j < n && !rc; j++) /* the group's earlier writes done with its buffers */
            if (slots[j].submitted) rc = tsr_wfile_release(wf, slots[j].submitted, err), slots[j].submitted = NULL;
        if (rc) break;
        batch b = {r, slots, r->order + k};
        tsr_pool_for(r->pool, n, recode_one, &b);
        rc = queue_batch(r, i, wf, slots, r->order + k, n, &pos, err);
        k += n;
    }
    if (!rc) rc = tsr_wfile_finish(wf, pos, err);
    else tsr_wfile_abort(wf);
    for (int j = 0; j < GROUPS * r->threads; j++) r->slots[j].submitted = NULL;
    if (rc) return rc;
    r->m.files[i].size = pos;
    r->st.files++;
    r->st.bytes_in += src.size;
    r->st.bytes_out += pos;
    return 0;
}

int tsr_recode_manifest(tsr_recode *r, const uint8_t **bytes, size_t *len, tsr_error *err) {
    if (!r->changed) {
        *bytes = r->src_mf, *len = r->src_len;
        return 0;
    }
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/MANIFEST", r->dir);
    free(r->new_mf);
    r->new_mf = NULL;
    int rc = tsr_manifest_validate(&r->m, path, 0, err);
    if (!rc) rc = tsr_manifest_encode(&r->m, 0, &r->new_mf, &r->new_len, err);
    if (rc) {
        tsr_err_prefix(err, "%s: the rewritten MANIFEST", r->dir);
        return rc;
    }
    *bytes = r->new_mf, *len = r->new_len;
    return 0;
}

/* ------------------------------------------------------------- compact */

/* Calls fn(dir, name, user) for each entry of the folder dir but . and .. */
static int each_entry(const char *dir, int (*fn)(const char *dir, const char *name, void *user), void *user,
                      tsr_error *err) {
    DIR *d = opendir(dir);
    if (!d) return tsr_err(err, TSR_EIO, "%s: cannot read the directory: %s", dir, strerror(errno));
    int rc = 0;
    for (struct dirent *de; !rc && (de = readdir(d));)
        if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0) rc = fn(dir, de->d_name, user);
    closedir(d);
    return rc;
}

typedef struct entries {
    const char *to;     /* the folder that gets the links */
    const char (*skip)[32]; /* names rewritten there */
    size_t n_skip;
    tsr_error *err;
} entries;

/* Only files in a step directory: compact moves nothing else. */
static int check_entry(const char *dir, const char *name, void *user) {
    entries *x = user;
    char path[PATH_MAX + 300];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct stat sb;
    if (lstat(path, &sb) != 0) return tsr_err(x->err, TSR_EIO, "%s: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return tsr_err(x->err, TSR_EINVAL, "%s: not a regular file (a step directory holds files only)", path);
    return 0;
}

/* The files compact does not rewrite keep their data: hard links. */
static int link_entry(const char *dir, const char *name, void *user) {
    entries *x = user;
    if (!strcmp(name, "MANIFEST") || !strncmp(name, "MANIFEST.tmp", 12)) return 0; /* and staging names */
    for (size_t i = 0; i < x->n_skip; i++)
        if (!strcmp(name, x->skip[i])) return 0;
    char from[PATH_MAX + 300], to[PATH_MAX + 300];
    snprintf(from, sizeof from, "%s/%s", dir, name);
    snprintf(to, sizeof to, "%s/%s", x->to, name);
    if (link(from, to) != 0) return tsr_err(x->err, TSR_EIO, "%s: cannot link it as %s: %s", from, to, strerror(errno));
    return 0;
}

/* Removes the folder tmp if it is there (an interrupted compact's). */
static int remove_tmp(const char *tmp, tsr_error *err) {
    struct stat sb;
    if (lstat(tmp, &sb) != 0) return errno == ENOENT ? 0 : tsr_err(err, TSR_EIO, "%s: %s", tmp, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) return tsr_err(err, TSR_EINVAL, "%s: in the way of compact, and not a directory", tmp);
    return tsr_remove_step_dir(tmp, err);
}

/* The rewrite into tmp: raw files re-encoded, the others linked, the MANIFEST
 * committed there. *gain = 0 when nothing got smaller (tmp is then left empty). */
static int compact_into(tsr_recode *r, const char *dir, const char *tmp, int *gain, tsr_error *err) {
    tsr_ckpt *ck = tsr_recode_ckpt(r);
    size_t n = tsr_ckpt_n_files(ck), n_raw = 0;
    char (*raw)[32] = calloc(n + 1, sizeof *raw);
    if (!raw) return tsr_err(err, TSR_ENOMEM, "out of memory");
    tsr_store *ts = NULL;
    int rc = mkdir(tmp, 0755) != 0 ? tsr_err(err, TSR_EIO, "%s: cannot create: %s", tmp, strerror(errno)) : 0;
    if (!rc && !(ts = tsr_store_open(tmp, 0, err))) rc = err ? err->code : TSR_EIO;
    for (size_t i = 0; i < n && !rc; i++) {
        if (!tsr_recode_file_raw(r, i)) continue;
        tsr_file_info f;
        tsr_ckpt_file(ck, i, &f);
        tsr_data_file_name(f.file_id, raw[n_raw++], sizeof *raw);
        rc = tsr_recode_file(r, i, ts, err);
    }
    *gain = !rc && tsr_recode_changed(r);
    entries x = {tmp, (const char (*)[32])raw, n_raw, err};
    if (!rc && *gain) rc = each_entry(dir, link_entry, &x, err);
    const uint8_t *mf;
    size_t len;
    if (!rc && *gain) rc = tsr_recode_manifest(r, &mf, &len, err);
    if (!rc && *gain) rc = tsr_store_put_atomic(ts, "MANIFEST", mf, len, err); /* syncs tmp's entries */
    tsr_store_close(ts);
    free(raw);
    return rc;
}

int tsr_ckpt_compact(const char *step_dir, int threads, tsr_recode_stats *st, tsr_error *err) {
    memset(st, 0, sizeof *st);
    char dir[PATH_MAX], tmp[PATH_MAX + 16], parent[PATH_MAX];
    size_t n = strlen(step_dir);
    while (n > 1 && step_dir[n - 1] == '/') n--;
    if (n >= sizeof dir) return tsr_err(err, TSR_EINVAL, "%s: path too long", step_dir);
    snprintf(dir, sizeof dir, "%.*s", (int)n, step_dir);
    snprintf(tmp, sizeof tmp, "%s.compact", dir);
    const char *slash = strrchr(dir, '/');
    snprintf(parent, sizeof parent, "%.*s", slash ? (slash == dir ? 1 : (int)(slash - dir)) : 1, slash ? dir : ".");
    if (!(tsr_store_caps(dir) & TSR_STORE_RENAME)) return tsr_err(err, TSR_EINVAL, "%s: compact rewrites local checkpoints only", dir);
    /* the folder's lock (a root's: a job or a pull), and the parent folder
     * itself for compacts of a folder that is not a step (no lock is taken
     * for those): one compact at a time uses dir.compact */
    tsr_folder_lock *lock = NULL;
    int rc = tsr_folder_lock_for_ckpt(dir, &lock, err);
    if (rc) return rc;
    int pfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (pfd >= 0 && flock(pfd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK)
        rc = tsr_err(err, TSR_EBUSY, "%s: another compact works in %s", dir, parent);
    if (rc) {
        if (pfd >= 0) close(pfd);
        tsr_folder_lock_release(lock);
        return rc;
    }
    tsr_recode *r = tsr_recode_open(dir, threads, err);
    if (!r) rc = err ? err->code : TSR_EIO;
    int any = 0, gain = 0;
    for (size_t i = 0; !rc && i < tsr_ckpt_n_files(tsr_recode_ckpt(r)); i++) any |= tsr_recode_file_raw(r, i);
    entries x = {NULL, NULL, 0, err};
    if (!rc) rc = remove_tmp(tmp, err); /* what a crash left: a partial copy, or the old one */
    if (!rc && any) rc = each_entry(dir, check_entry, &x, err);
    if (!rc && any) rc = compact_into(r, dir, tmp, &gain, err);
    /* the swap: dir is the new checkpoint, tmp the old, at once */
    if (!rc && gain && renameat2(AT_FDCWD, tmp, AT_FDCWD, dir, RENAME_EXCHANGE) != 0)
        rc = tsr_err(err, TSR_EIO, "%s: cannot exchange it with %s (renameat2 RENAME_EXCHANGE): %s", dir, tmp,
                     strerror(errno));
    if (!rc && gain) rc = tsr_fsync_dir(parent, NULL, err);
    if (!rc && gain) tsr_recode_stats_get(r, st);
    if (r && any) { /* the old files, or what a failure left */
        tsr_error e = {0};
        if (remove_tmp(tmp, &e)) tsr_log(1, "compact: %s", e.msg);
    }
    tsr_recode_close(r);
    if (pfd >= 0) close(pfd); /* releases the flock */
    tsr_folder_lock_release(lock);
    return rc;
}
