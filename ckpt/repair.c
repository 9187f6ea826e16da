/* repair.c: the damaged data files of a committed checkpoint rewritten from
 * other copies of their frames (repair.h).
 *
 * In order, per data file: scan (every byte of the old file held to the
 * MANIFEST: size, header, each frame through the reader's check, padding),
 * resolve (each damaged frame looked up in the sources by raw checksum and raw
 * size, the first candidate that passes both records' checks taken), rewrite
 * (the whole file beside the old one), check the new file, install it. The
 * frames' bytes are checked by the reader (tsr_ckpt_check_frame: one decoder);
 * this file only encodes, where a source stores a frame otherwise. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codec.h"
#include "common.h"
#include "manifest.h"
#include "repair.h"
#include "store.h"

#define MAX_RUNS 16 /* runs of lost frames named in a message, then a count */

/* A frame by its raw content: the key of a source's index. */
typedef struct raw_key {
    uint64_t raw_hash, raw_size;
    uint32_t frame;
} raw_key;

typedef struct source {
    const char *loc;
    tsr_ckpt *ck;   /* NULL until opened, or when it could not be */
    raw_key *keys;  /* its frames by (raw_hash, raw_size) */
    size_t n_keys;
    int opened;     /* 1 once tried */
} source;

/* A frame of the checkpoint repaired. */
typedef struct dframe {
    tsr_frame_info f;
    uint32_t idx; /* in the MANIFEST */
    int dtype;    /* what its codec sees: its tensor's, TSR_U8 for a blob's */
    int damaged;
    char *problem; /* why, when damaged (malloc'ed) */
    int src;       /* the source that repairs it; -1: none */
    uint32_t src_frame;
    int reencoded;
} dframe;

typedef struct repair {
    char dir[PATH_MAX];
    tsr_ckpt *ck;
    tsr_store *store;
    const tsr_repair_opts *o;
    source *srcs;
    dframe *fr; /* every frame, by (file, offset) */
    size_t n_fr;
    tsr_codec *codec;
    int level;
    uint8_t *st, *put; /* aligned: stored bytes as read; as made for a slot */
    size_t st_cap, put_cap;
    uint8_t *raw, *raw2;
    size_t raw_cap, raw2_cap;
} repair;

static int reserve(uint8_t **buf, size_t *cap, size_t need, int aligned) {
    need = aligned ? tsr_align_up(need ? need : 1, TSR_ALIGN) : (need ? need : 1);
    if (*cap >= need) return 0;
    free(*buf);
    *buf = aligned ? tsr_alloc_aligned(need) : malloc(need);
    *cap = *buf ? need : 0;
    return *buf ? 0 : TSR_ENOMEM;
}

/* Room for a frame of stored_size bytes read, and for any stored form of
 * raw_size bytes made. */
static int room(repair *r, uint64_t stored_size, uint64_t raw_size, tsr_error *err) {
    uint64_t made = tsr_codec_bound(raw_size) > stored_size ? tsr_codec_bound(raw_size) : stored_size;
    if (reserve(&r->st, &r->st_cap, stored_size, 1) || reserve(&r->put, &r->put_cap, made, 1) ||
        reserve(&r->raw, &r->raw_cap, raw_size, 0) || reserve(&r->raw2, &r->raw2_cap, raw_size, 0))
        return tsr_err(err, TSR_ENOMEM, "out of memory for a frame of %llu bytes", (unsigned long long)raw_size);
    return 0;
}

static int cmp_pos(const void *a, const void *b) {
    const dframe *x = a, *y = b;
    if (x->f.file_id != y->f.file_id) return x->f.file_id < y->f.file_id ? -1 : 1;
    return x->f.offset < y->f.offset ? -1 : x->f.offset > y->f.offset;
}

static int cmp_key(const void *a, const void *b) {
    const raw_key *x = a, *y = b;
    if (x->raw_hash != y->raw_hash) return x->raw_hash < y->raw_hash ? -1 : 1;
    if (x->raw_size != y->raw_size) return x->raw_size < y->raw_size ? -1 : 1;
    return x->frame < y->frame ? -1 : x->frame > y->frame;
}

/* Every frame with its dtype, in file order. */
static int frame_table(repair *r, tsr_error *err) {
    tsr_ckpt *ck = r->ck;
    r->n_fr = tsr_ckpt_n_frames(ck);
    r->fr = calloc(r->n_fr + 1, sizeof *r->fr);
    if (!r->fr) return tsr_err(err, TSR_ENOMEM, "out of memory");
    for (size_t i = 0; i < r->n_fr; i++) {
        tsr_ckpt_frame(ck, i, &r->fr[i].f);
        r->fr[i].idx = (uint32_t)i;
        r->fr[i].dtype = TSR_U8; /* blob frames: bytes */
        r->fr[i].src = -1;
    }
    for (size_t c = 0; c < tsr_ckpt_n_chunks(ck); c++) {
        tsr_chunk_info ci;
        tsr_tensor_info t;
        tsr_ckpt_chunk(ck, c, &ci);
        tsr_ckpt_tensor(ck, ci.tensor, &t);
        for (uint32_t k = 0; k < ci.n_frames; k++) r->fr[ci.first_frame + k].dtype = t.dtype;
    }
    tsr_sort(r->fr, r->n_fr, sizeof *r->fr, cmp_pos);
    return 0;
}

static void set_problem(dframe *d, const char *msg) {
    d->damaged = 1;
    if (!d->problem) d->problem = strdup(msg);
}

/* ------------------------------------------------------------------ scan */

/* Data file `name` against the MANIFEST: its frames fr[0..n) marked damaged
 * where their bytes fail the reader's check (or are not there); the first other
 * problem (missing, size, header, padding) into fprob. @return 1 when anything
 * is wrong with the file, else 0. */
static int scan_file(repair *r, const char *name, uint64_t want_size, uint32_t file_id, dframe *fr, size_t n,
                     char *fprob, size_t plen) {
    tsr_rfile *rf = NULL;
    uint64_t size = 0;
    tsr_error e = {0};
    int bad = 0;
    fprob[0] = 0;
    if (tsr_store_open_read(r->store, name, &rf, &size, &e)) {
        snprintf(fprob, plen, "%s", e.msg);
        for (size_t k = 0; k < n; k++) set_problem(&fr[k], "its data file cannot be read");
        return 1;
    }
    if (size != want_size) {
        snprintf(fprob, plen, "%s/%s: %llu bytes, the MANIFEST says %llu", r->dir, name, (unsigned long long)size,
                 (unsigned long long)want_size);
        bad = 1;
    }
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", r->dir, name);
    if (reserve(&r->st, &r->st_cap, TSR_DATA_HEADER_SIZE, 1) == 0) {
        if (size < TSR_DATA_HEADER_SIZE || tsr_rfile_read(rf, r->st, TSR_DATA_HEADER_SIZE, 0, &e) ||
            tsr_data_header_check(r->st, file_id, tsr_ckpt_save_id(r->ck), path, &e)) {
            if (!fprob[0]) snprintf(fprob, plen, "%s", size < TSR_DATA_HEADER_SIZE ? "no header" : e.msg);
            bad = 1;
        }
    }
    for (size_t k = 0; k < n; k++) {
        dframe *d = &fr[k];
        size_t padded = tsr_align_up(d->f.stored_size, TSR_ALIGN);
        if (d->f.offset + padded > size) {
            set_problem(d, "past the end of its data file");
            bad = 1;
            continue;
        }
        if (room(r, padded, d->f.raw_size, &e) || tsr_rfile_read(rf, r->st, padded, d->f.offset, &e) ||
            tsr_ckpt_check_frame(r->ck, d->idx, r->st, r->raw, &e)) {
            set_problem(d, e.msg);
            bad = 1;
            continue;
        }
        for (size_t i = d->f.stored_size; i < padded; i++)
            if (r->st[i]) {
                if (!fprob[0])
                    snprintf(fprob, plen, "%s: nonzero padding byte at offset %llu", path,
                             (unsigned long long)(d->f.offset + i));
                bad = 1;
                break;
            }
    }
    tsr_rfile_close(rf);
    return bad;
}

/* --------------------------------------------------------------- sources */

static void open_source(repair *r, source *s) {
    s->opened = 1;
    tsr_error e = {0};
    s->ck = tsr_ckpt_open(s->loc, &e);
    if (s->ck) {
        s->n_keys = tsr_ckpt_n_frames(s->ck);
        s->keys = malloc((s->n_keys + 1) * sizeof *s->keys);
        if (!s->keys) {
            tsr_err(&e, TSR_ENOMEM, "%s: out of memory for its index of frames", s->loc);
            tsr_ckpt_close(s->ck);
            s->ck = NULL;
        }
    }
    if (!s->ck) {
        if (r->o && r->o->source_failed) r->o->source_failed(r->o->user, e.msg);
        return;
    }
    for (size_t i = 0; i < s->n_keys; i++) {
        tsr_frame_info f;
        tsr_ckpt_frame(s->ck, i, &f);
        s->keys[i] = (raw_key){f.raw_hash, f.raw_size, (uint32_t)i};
    }
    tsr_sort(s->keys, s->n_keys, sizeof *s->keys, cmp_key);
}

/* The first key of s at or after (raw_hash, raw_size). */
static size_t lower_bound(const source *s, uint64_t raw_hash, uint64_t raw_size) {
    size_t lo = 0, hi = s->n_keys;
    raw_key want = {raw_hash, raw_size, 0};
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cmp_key(&s->keys[mid], &want) < 0) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Frame sj of source s made into the stored bytes of damaged frame d: read and
 * held to the source's record (stored checksum, padding, decoding, raw
 * checksum); its stored bytes taken as they are when they are the same, else
 * its raw bytes stored as d's record says; then held to d's own record. *out
 * (r->st or r->put): d's stored bytes, zero-padded to TSR_ALIGN. */
static int fetch(repair *r, source *s, uint32_t sj, const dframe *d, const uint8_t **out, int *reencoded,
                 tsr_error *err) {
    tsr_frame_info sf;
    tsr_ckpt_frame(s->ck, sj, &sf);
    if (sf.raw_size != d->f.raw_size) return tsr_err(err, TSR_EINVAL, "%s: frame %u: another raw size", s->loc, sj);
    int rc = room(r, sf.stored_size > d->f.stored_size ? sf.stored_size : d->f.stored_size, d->f.raw_size, err);
    if (!rc) rc = tsr_ckpt_read_stored(s->ck, sj, r->st, err);
    if (!rc) rc = tsr_ckpt_check_frame(s->ck, sj, r->st, r->raw, err);
    if (rc) return rc;
    size_t len = d->f.stored_size;
    if (sf.stored_size == d->f.stored_size && sf.stored_hash == d->f.stored_hash && sf.codec == d->f.codec) {
        *out = r->st, *reencoded = 0; /* its padding is checked zero */
    } else {
        *out = r->put, *reencoded = 1;
        if (d->f.codec == TSR_CODEC_RAW) {
            memcpy(r->put, r->raw, d->f.raw_size);
        } else {
            int codec;
            rc = tsr_frame_encode(r->codec, d->dtype, d->f.codec, r->level, r->raw, d->f.raw_size, r->put, r->put_cap,
                                  &len, &codec, err);
            if (rc) return rc;
            if (codec != d->f.codec || len != d->f.stored_size)
                return tsr_err(err, TSR_ECORRUPT,
                               "%s: frame %u holds the raw bytes, but they encode to %zu bytes of %s, not to the %llu "
                               "bytes of %s the slot holds",
                               s->loc, sj, len, tsr_codec_name(codec), (unsigned long long)d->f.stored_size,
                               tsr_codec_name(d->f.codec));
        }
        memset(r->put + len, 0, tsr_align_up(len, TSR_ALIGN) - len);
    }
    return tsr_ckpt_check_frame(r->ck, d->idx, *out, r->raw2, err);
}

/* The source frame that repairs d, if any: in the sources' order, candidates
 * that store it the same way first. A candidate that fails a check is passed
 * over, and the first such failure is added to d's problem. @return 1 found. */
static int resolve(repair *r, dframe *d) {
    char first_fail[TSR_ERROR_MSG] = "";
    for (size_t si = 0; si < r->o->n_sources; si++) {
        source *s = &r->srcs[si];
        if (!s->opened) open_source(r, s);
        if (!s->ck) continue;
        size_t lo = lower_bound(s, d->f.raw_hash, d->f.raw_size);
        for (int same = 1; same >= 0; same--)
            for (size_t k = lo; k < s->n_keys && s->keys[k].raw_hash == d->f.raw_hash &&
                                s->keys[k].raw_size == d->f.raw_size;
                 k++) {
                tsr_frame_info sf;
                tsr_ckpt_frame(s->ck, s->keys[k].frame, &sf);
                int is_same = sf.stored_hash == d->f.stored_hash && sf.stored_size == d->f.stored_size &&
                              sf.codec == d->f.codec;
                if (is_same != same) continue;
                tsr_error e = {0};
                const uint8_t *out;
                int reenc;
                if (fetch(r, s, s->keys[k].frame, d, &out, &reenc, &e) == 0) {
                    d->src = (int)si, d->src_frame = s->keys[k].frame, d->reencoded = reenc;
                    return 1;
                }
                if (!first_fail[0]) snprintf(first_fail, sizeof first_fail, "%s", e.msg);
            }
    }
    if (first_fail[0] && d->problem) {
        size_t len = strlen(d->problem) + strlen(first_fail) + 64;
        char *p = malloc(len);
        if (p) {
            snprintf(p, len, "%s; a copy failed its check: %s", d->problem, first_fail);
            free(d->problem);
            d->problem = p;
        }
    }
    return 0;
}

/* --------------------------------------------------------------- rewrite */

/* The stored bytes of frame d for the new file, padded: from the old file when
 * it is sound (checked again: it may have changed since the scan), else from its
 * source. */
static int frame_bytes(repair *r, tsr_rfile *old, const dframe *d, const uint8_t **out, tsr_error *err) {
    if (d->damaged) {
        int reenc;
        return fetch(r, &r->srcs[d->src], d->src_frame, d, out, &reenc, err);
    }
    size_t padded = tsr_align_up(d->f.stored_size, TSR_ALIGN);
    int rc = room(r, padded, d->f.raw_size, err);
    if (!rc) rc = tsr_rfile_read(old, r->st, padded, d->f.offset, err);
    if (!rc) rc = tsr_ckpt_check_frame(r->ck, d->idx, r->st, r->raw, err);
    if (rc) return rc;
    memset(r->st + d->f.stored_size, 0, padded - d->f.stored_size);
    *out = r->st;
    return 0;
}

/* Writes tmp: the header, every frame of fr[0..n) at its offset, size bytes in
 * all; made durable. On failure nothing of it is left. */
static int write_file(repair *r, const char *name, const char *tmp, uint32_t file_id, uint64_t size, const dframe *fr,
                      size_t n, tsr_error *err) {
    tsr_rfile *old = NULL;
    uint64_t old_size = 0;
    int rc = 0;
    for (size_t k = 0; k < n && !old; k++) /* the old file, when a sound frame is read from it */
        if (!fr[k].damaged && (rc = tsr_store_open_read(r->store, name, &old, &old_size, err))) return rc;
    tsr_wfile *wf = NULL;
    if ((rc = tsr_store_create(r->store, tmp, 0, &wf, err))) {
        tsr_rfile_close(old);
        return rc;
    }
    tsr_wfile_reserve(wf, size);
    rc = reserve(&r->put, &r->put_cap, TSR_DATA_HEADER_SIZE, 1) ? tsr_err(err, TSR_ENOMEM, "out of memory") : 0;
    if (!rc) {
        tsr_data_header_encode(r->put, file_id, tsr_ckpt_save_id(r->ck));
        rc = tsr_wfile_write(wf, r->put, TSR_DATA_HEADER_SIZE, 0, err);
    }
    for (size_t k = 0; k < n && !rc; k++) {
        const uint8_t *out;
        if (!(rc = frame_bytes(r, old, &fr[k], &out, err)))
            rc = tsr_wfile_write(wf, out, tsr_align_up(fr[k].f.stored_size, TSR_ALIGN), fr[k].f.offset, err);
    }
    tsr_rfile_close(old);
    if (!rc) return tsr_wfile_finish(wf, size, err);
    tsr_wfile_abort(wf);
    return rc;
}

/* The new file tmp read back and held to the MANIFEST, every byte of it. */
static int check_file(repair *r, const char *tmp, uint32_t file_id, uint64_t want_size, const dframe *fr, size_t n,
                      tsr_error *err) {
    tsr_rfile *rf;
    uint64_t size;
    char path[PATH_MAX + 96];
    snprintf(path, sizeof path, "%s/%s", r->dir, tmp);
    int rc = tsr_store_open_read(r->store, tmp, &rf, &size, err);
    if (rc) return rc;
    if (size != want_size)
        rc = tsr_err(err, TSR_ECORRUPT, "%s: %llu bytes written, the MANIFEST says %llu", path,
                     (unsigned long long)size, (unsigned long long)want_size);
    if (!rc) rc = room(r, TSR_DATA_HEADER_SIZE, 1, err);
    if (!rc) rc = tsr_rfile_read(rf, r->st, TSR_DATA_HEADER_SIZE, 0, err);
    if (!rc) rc = tsr_data_header_check(r->st, file_id, tsr_ckpt_save_id(r->ck), path, err);
    for (size_t k = 0; k < n && !rc; k++) {
        size_t padded = tsr_align_up(fr[k].f.stored_size, TSR_ALIGN);
        rc = room(r, padded, fr[k].f.raw_size, err);
        if (!rc) rc = tsr_rfile_read(rf, r->st, padded, fr[k].f.offset, err);
        if (!rc) rc = tsr_ckpt_check_frame(r->ck, fr[k].idx, r->st, r->raw, err);
        for (size_t i = fr[k].f.stored_size; i < padded && !rc; i++)
            if (r->st[i]) rc = tsr_err(err, TSR_ECORRUPT, "%s: nonzero padding byte written at %llu", path,
                                       (unsigned long long)(fr[k].f.offset + i));
    }
    tsr_rfile_close(rf);
    if (rc) tsr_err_prefix(err, "the repaired file, read back");
    return rc;
}

/* name, if it exists, linked as name.damaged (replacing an earlier one);
 * *kept says whether it was. @return 0, or TSR_EIO. */
static int keep_aside(repair *r, const char *name, int *kept, tsr_error *err) {
    char to[PATH_MAX + 96], aside[PATH_MAX + 112];
    snprintf(to, sizeof to, "%s/%s", r->dir, name);
    snprintf(aside, sizeof aside, "%s.damaged", to);
    *kept = 0;
    if (access(to, F_OK) != 0) return 0;
    if (unlink(aside) != 0 && errno != ENOENT)
        return tsr_err(err, TSR_EIO, "%s: cannot remove it: %s", aside, strerror(errno));
    if (link(to, aside) != 0) return tsr_err(err, TSR_EIO, "%s: cannot keep it as %s: %s", to, aside, strerror(errno));
    *kept = 1;
    return 0;
}

/* tmp in place of name; the old file, if any, kept as name.damaged. */
static int install(repair *r, const char *name, const char *tmp, int *kept, tsr_error *err) {
    char from[PATH_MAX + 96], to[PATH_MAX + 96];
    snprintf(from, sizeof from, "%s/%s", r->dir, tmp);
    snprintf(to, sizeof to, "%s/%s", r->dir, name);
    int rc = keep_aside(r, name, kept, err);
    if (rc) return rc;
    if (rename(from, to) != 0) return tsr_err(err, TSR_EIO, "%s: cannot rename it to %s: %s", from, to, strerror(errno));
    return tsr_fsync_dir(r->dir, name, err);
}

/* -------------------------------------------------------------- MANIFEST */

/* Whether ck (dir opened with a source's MANIFEST) describes dir's own data
 * files: every one of them there has the size it records and carries its save
 * id (a copy stored otherwise, such as an archive whose frames were encoded on
 * the way, has other sizes), and one at least is there. */
static int same_save(repair *r, tsr_ckpt *ck) {
    uint8_t hdr[TSR_DATA_HEADER_SIZE];
    int found = 0;
    for (size_t i = 0; i < tsr_ckpt_n_files(ck); i++) {
        tsr_file_info fi;
        char name[64];
        tsr_rfile *rf;
        uint64_t size;
        tsr_ckpt_file(ck, i, &fi);
        tsr_data_file_name(fi.file_id, name, sizeof name);
        if (tsr_store_open_read(r->store, name, &rf, &size, NULL)) continue;
        int ok = size == fi.size && size >= TSR_DATA_HEADER_SIZE && !tsr_rfile_read(rf, hdr, TSR_DATA_HEADER_SIZE, 0, NULL) &&
                 !tsr_data_header_check(hdr, fi.file_id, tsr_ckpt_save_id(ck), name, NULL);
        tsr_rfile_close(rf);
        if (!ok) return 0;
        found = 1;
    }
    return found;
}

/* dir's MANIFEST, which fails its checks (why), replaced by the first source's
 * that opens and describes dir's data files (same_save), written atomically
 * and durably over it (tsr_store_put_atomic), the damaged one kept as
 * MANIFEST.damaged. */
static int repair_manifest(repair *r, const char *why, tsr_repair_stats *st, tsr_error *err) {
    for (size_t i = 0; i < r->o->n_sources; i++) {
        uint8_t *buf = NULL;
        size_t len = 0;
        tsr_error e = {0};
        tsr_ckpt *ck = NULL;
        if (tsr_ckpt_read_manifest(r->o->sources[i], &buf, &len, &e) || !(ck = tsr_ckpt_open_manifest(r->dir, buf, len, &e))) {
            if (r->o->source_failed) r->o->source_failed(r->o->user, e.msg);
            free(buf);
            continue;
        }
        int fits = same_save(r, ck);
        tsr_ckpt_close(ck);
        int kept, rc = fits ? keep_aside(r, "MANIFEST", &kept, err) : 0;
        if (fits && !rc) rc = tsr_store_put_atomic(r->store, "MANIFEST", buf, len, err);
        free(buf);
        if (!fits) continue;
        if (rc) return rc;
        st->manifest_repaired = 1;
        if (r->o->manifest) r->o->manifest(r->o->user, why, r->o->sources[i]);
        return 0;
    }
    return tsr_err(err, TSR_ECORRUPT,
                   "%s (and no source holds a MANIFEST of these data files: one that opens, records their sizes and "
                   "whose save id they carry)",
                   why);
}

/* ---------------------------------------------------------------- report */

/* "DIR/data-N.tsd: K of M frames lost (...): frames 3-4 of tensor x, ...". */
static void lost_message(repair *r, const char *name, const dframe *fr, size_t n, uint64_t lost, tsr_sbuf *sb) {
    tsr_sb_printf(sb, "%s/%s: %llu of %zu frame%s lost (no source holds a copy that passes the checks): ", r->dir, name,
                  (unsigned long long)lost, n, n == 1 ? "" : "s");
    size_t runs = 0, more = 0;
    for (size_t k = 0; k < n;) {
        if (!fr[k].damaged || fr[k].src >= 0) {
            k++;
            continue;
        }
        char owner[300], next[300];
        tsr_ckpt_frame_owner(r->ck, fr[k].idx, owner, sizeof owner);
        size_t e = k + 1; /* the run: lost frames of one owner, consecutive in the file */
        while (e < n && fr[e].damaged && fr[e].src < 0 && fr[e].idx == fr[e - 1].idx + 1 &&
               tsr_ckpt_frame_owner(r->ck, fr[e].idx, next, sizeof next) == 0 && strcmp(next, owner) == 0)
            e++;
        if (runs++ < MAX_RUNS) {
            if (e - k == 1) tsr_sb_printf(sb, "%sframe %u of %s", runs > 1 ? ", " : "", fr[k].idx, owner);
            else tsr_sb_printf(sb, "%sframes %u-%u of %s", runs > 1 ? ", " : "", fr[k].idx, fr[e - 1].idx, owner);
        } else {
            more += e - k;
        }
        k = e;
    }
    if (more) tsr_sb_printf(sb, " and %zu more", more);
    tsr_sb_printf(sb, "; the file is left as it is");
}

static void report_frames(repair *r, const dframe *fr, size_t n) {
    if (!r->o || !r->o->frame) return;
    for (size_t k = 0; k < n; k++) {
        if (!fr[k].damaged) continue;
        char owner[300];
        tsr_ckpt_frame_owner(r->ck, fr[k].idx, owner, sizeof owner);
        tsr_repair_frame x = {fr[k].f.file_id, fr[k].idx, fr[k].f.offset, owner, fr[k].problem ? fr[k].problem : "",
                              fr[k].src >= 0 ? r->srcs[fr[k].src].loc : NULL, fr[k].reencoded};
        r->o->frame(r->o->user, &x);
    }
}

/* ------------------------------------------------------------------ main */

/* Data file i: scanned, resolved, rewritten when damaged and nothing is lost.
 * @return 0, TSR_ECORRUPT when frames are lost (*msg: the message), another
 * status when the rewrite failed (*msg too). */
static int repair_file(repair *r, size_t i, dframe *fr, size_t n, tsr_repair_stats *st, tsr_sbuf *msg) {
    tsr_file_info fi;
    tsr_ckpt_file(r->ck, i, &fi);
    char name[64], tmp[80], path[PATH_MAX + 64], fprob[PATH_MAX + 2 * TSR_ERROR_MSG];
    tsr_data_file_name(fi.file_id, name, sizeof name);
    snprintf(tmp, sizeof tmp, "%s.repair", name);
    snprintf(path, sizeof path, "%s/%s", r->dir, name);
    tsr_repair_file x = {.file_id = fi.file_id, .path = path, .frames = n};
    st->files++;
    int rc = 0;
    if (scan_file(r, name, fi.size, fi.file_id, fr, n, fprob, sizeof fprob)) {
        st->files_damaged++;
        x.problem = fprob[0] ? fprob : NULL;
        for (size_t k = 0; k < n; k++) {
            if (!fr[k].damaged) continue;
            x.damaged++;
            if (resolve(r, &fr[k])) x.repaired++;
            else x.lost++;
        }
        st->frames_damaged += x.damaged;
        if (x.lost) {
            lost_message(r, name, fr, n, x.lost, msg); /* nothing of the file changes */
            rc = TSR_ECORRUPT;
        } else {
            tsr_error e = {0};
            rc = write_file(r, name, tmp, fi.file_id, fi.size, fr, n, &e);
            if (!rc && (rc = check_file(r, tmp, fi.file_id, fi.size, fr, n, &e))) {
                tsr_error e2 = {0};
                tsr_store_remove(r->store, tmp, &e2);
            }
            if (!rc) rc = install(r, name, tmp, &x.kept_aside, &e);
            if (rc) tsr_sb_printf(msg, "%s: not repaired: %s", path, e.msg);
            x.rewritten = rc == 0;
        }
        st->frames_repaired += x.rewritten ? x.repaired : 0;
        st->frames_lost += x.lost;
        if (x.rewritten) st->files_repaired++;
        else st->files_lost++;
        if (rc) x.error = msg->p ? msg->p : "out of memory";
    }
    if (r->o && r->o->file) r->o->file(r->o->user, &x);
    report_frames(r, fr, n);
    return rc;
}

int tsr_ckpt_repair(const char *dir, const tsr_repair_opts *o, tsr_repair_stats *st_out, tsr_error *err) {
    static const tsr_repair_opts none;
    tsr_repair_stats st = {0};
    repair r = {.o = o ? o : &none, .level = tsr_write_opts_default().level};
    snprintf(r.dir, sizeof r.dir, "%s", dir);
    if (!(tsr_store_caps(dir) & TSR_STORE_RENAME))
        return tsr_err(err, TSR_EINVAL, "%s: repair rewrites local checkpoints only, not an object-store location",
                       dir);
    tsr_folder_lock *lock = NULL;
    int rc = tsr_folder_lock_for_ckpt(dir, &lock, err);
    if (rc) return rc;
    if (!(r.store = tsr_store_open(dir, 0, err))) rc = err ? err->code : TSR_EIO;
    tsr_error oe = {0};
    if (!rc && !(r.ck = tsr_ckpt_open(dir, &oe))) {
        rc = oe.code ? oe.code : TSR_EIO;
        /* a MANIFEST that fails its checks (not a missing one: an uncommitted save) */
        if (rc == TSR_ECORRUPT && r.o->n_sources) rc = repair_manifest(&r, oe.msg, &st, err);
        else if (err) *err = oe;
        if (!rc && !(r.ck = tsr_ckpt_open(dir, err))) rc = err ? err->code : TSR_EIO;
    }
    if (!rc) rc = frame_table(&r, err);
    if (!rc) {
        r.srcs = calloc(r.o->n_sources + 1, sizeof *r.srcs);
        r.codec = tsr_codec_new();
        if (!r.srcs || !r.codec) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
        for (size_t i = 0; !rc && i < r.o->n_sources; i++) r.srcs[i].loc = r.o->sources[i];
    }
    size_t n_lost = 0, k = 0;
    tsr_sbuf first = {0};
    for (size_t i = 0; !rc && i < tsr_ckpt_n_files(r.ck); i++) {
        tsr_file_info fi;
        tsr_ckpt_file(r.ck, i, &fi);
        size_t e = k;
        while (e < r.n_fr && r.fr[e].f.file_id == fi.file_id) e++;
        tsr_sbuf msg = {0};
        int frc = repair_file(&r, i, r.fr + k, e - k, &st, &msg);
        if (frc == TSR_ECORRUPT) {
            if (!n_lost++) first = msg, msg = (tsr_sbuf){0};
        } else if (frc) {
            rc = tsr_err(err, frc, "%s", msg.p ? msg.p : "out of memory");
        }
        free(msg.p);
        k = e;
    }
    if (!rc && n_lost) {
        if (n_lost > 1) tsr_sb_printf(&first, " (and %zu more files with frames lost)", n_lost - 1);
        rc = tsr_err(err, TSR_ECORRUPT, "%s", first.p ? first.p : "frames lost");
    }
    free(first.p);
    for (size_t i = 0; r.fr && i < r.n_fr; i++) free(r.fr[i].problem);
    for (size_t i = 0; r.srcs && i < r.o->n_sources; i++) {
        tsr_ckpt_close(r.srcs[i].ck);
        free(r.srcs[i].keys);
    }
    free(r.srcs), free(r.fr), free(r.st), free(r.put), free(r.raw), free(r.raw2);
    tsr_codec_free(r.codec);
    tsr_store_close(r.store);
    tsr_ckpt_close(r.ck);
    tsr_folder_lock_release(lock);
    if (st_out) *st_out = st;
    return rc;
}
