/* test_hostile.c: a MANIFEST (and data files) with hostile values are refused with
 * an error that names the problem, never a crash or an out-of-bounds access.
 *
 * A small valid checkpoint is written with the public API (two writers, so two data
 * files; a 2-D tensor in two chunks, a 3-D one split along dim 1, a 0-d one, an
 * empty one, blobs; 4 KiB frames). Its MANIFEST is taken apart into header and
 * sections (xmf), each case patches fields at the byte level (FORMAT.md section 4)
 * or rebuilds the file (extra, missing, repeated, re-strided sections), the trailer
 * is recomputed so that the checksum passes and the validator itself is exercised,
 * and the result goes through tsr_manifest_parse (from an exact-size buffer) and
 * tsr_ckpt_open. Refusals must have the expected class and a message naming the
 * MANIFEST and the problem; accepted variants must read back every element. Then
 * every truncation of the MANIFEST, a MANIFEST over 4 GiB, and damaged, missing or
 * foreign data files (tsr_ckpt_verify and tsr_ckpt_read), and a valid zstd frame
 * a little larger than its raw bytes. TSR_VERBOSE=1 prints every case's outcome. */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zstd.h>

#include "check.h"
#include "common.h"
#include "manifest.h"
#include "tessera.h"

/* ------------------------------------------------------------------ files */

/* printf into one of 16 rotating path buffers */
static const char *P(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *P(const char *fmt, ...) {
    static char bufs[16][4096];
    static int next;
    char *b = bufs[next++ % 16];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b, sizeof bufs[0], fmt, ap);
    va_end(ap);
    REQUIRE(n > 0 && (size_t)n < sizeof bufs[0], "path too long");
    return b;
}

static uint8_t *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    REQUIRE(f, "cannot open %s: %s", path, strerror(errno));
    REQUIRE(fseek(f, 0, SEEK_END) == 0, "seek %s", path);
    long n = ftell(f);
    REQUIRE(n >= 0 && fseek(f, 0, SEEK_SET) == 0, "seek %s", path);
    uint8_t *b = malloc((size_t)n + 1);
    REQUIRE(b && fread(b, 1, (size_t)n, f) == (size_t)n, "cannot read %s", path);
    fclose(f);
    *len = (size_t)n;
    return b;
}

static void spit(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    REQUIRE(f, "cannot create %s: %s", path, strerror(errno));
    REQUIRE(fwrite(b, 1, n, f) == n && fclose(f) == 0, "cannot write %s", path);
}

static void copy_file(const char *src, const char *dst) {
    size_t n;
    uint8_t *b = slurp(src, &n);
    spit(dst, b, n);
    free(b);
}

static void copy_ckpt(const char *src, const char *dst) {
    REQUIRE(mkdir(dst, 0755) == 0 || errno == EEXIST, "mkdir %s: %s", dst, strerror(errno));
    copy_file(P("%s/MANIFEST", src), P("%s/MANIFEST", dst));
    copy_file(P("%s/data-00000.tsd", src), P("%s/data-00000.tsd", dst));
    copy_file(P("%s/data-00001.tsd", src), P("%s/data-00001.tsd", dst));
}

static uint8_t *dup_exact(const uint8_t *b, size_t n) { /* ASan sees any read past n */
    uint8_t *c = malloc(n ? n : 1);
    REQUIRE(c, "out of memory");
    if (n) memcpy(c, b, n);
    return c;
}

/* ------------------------------------------------------ the checkpoint */

typedef struct tspec {
    const char *name, *group;
    int dtype;
    uint32_t ndim;
    uint64_t shape[3];
} tspec;
/* sorted by name, as in the MANIFEST */
static const tspec TS[] = {
    {"a.w", "model", TSR_F32, 2, {64, 48}},         /* 2 chunks (one per file), 2 frames each */
    {"b.ids", "model", TSR_I32, 1, {3000}},         /* 3 frames */
    {"c.scalar", "optim", TSR_I64, 0, {0}},         /* 0-d: 1 frame */
    {"d.empty", "optim", TSR_F32, 2, {0, 16}},      /* volume 0: no chunk */
    {"e.h", "model", TSR_BF16, 3, {2, 64, 40}},     /* split along dim 1: 4 frames */
};
enum { NT = sizeof TS / sizeof TS[0] };

typedef struct bspec {
    const char *name;
    int32_t rank;
    size_t size;
    int file;
} bspec;
static const bspec BS[] = {
    {"empty", -1, 0, 0}, {"meta", -1, 100, 0}, {"rng", 0, 10000, 1}, {"rng", 1, 300, 1}};
enum { NB = sizeof BS / sizeof BS[0] };

static void blob_fill(const bspec *b, uint8_t *p) {
    for (size_t j = 0; j < b->size; j++) p[j] = (uint8_t)(j * 7 + (uint32_t)b->rank * 13 + (uint8_t)b->name[0]);
}

static void save_box(tsr_save *s, const tspec *t, const tsr_box *box) {
    tsr_error e = {0};
    size_t n = tsr_box_volume(box) * tsr_dtype_size(t->dtype);
    void *buf = malloc(n ? n : 1);
    REQUIRE(buf, "out of memory");
    tsr_synth_fill(t->name, t->dtype, t->ndim, t->shape, box, buf);
    REQUIRE(tsr_save_box(s, t->name, box, buf, &e) == 0, "%s", e.msg);
    free(buf);
}

static tsr_box whole_box(const tspec *t) {
    tsr_box b = {.ndim = t->ndim};
    for (uint32_t d = 0; d < t->ndim; d++) b.extent[d] = t->shape[d];
    return b;
}

/* Writes the checkpoint into dir with two writers (data-00000, data-00001). */
static void write_ckpt(const char *dir, const uint8_t sid[16]) {
    tsr_error e = {0};
    tsr_write_opts o = tsr_write_opts_default();
    o.frame_bytes = 4096;
    o.threads = 2;
    o.encode_share = 1; /* every frame encoded as auto picks, whatever the timing: the mutations name frames */
    tsr_save *s[2];
    for (uint32_t w = 0; w < 2; w++) {
        s[w] = tsr_save_begin(dir, w, sid, &o, &e);
        REQUIRE(s[w], "%s", e.msg);
    }
    for (int i = 0; i < NT; i++) {
        const tspec *t = &TS[i];
        REQUIRE(tsr_save_tensor(s[0], t->name, t->group, t->dtype, t->ndim, t->shape, NULL, &e) == 0, "%s", e.msg);
        if (i == 0)
            REQUIRE(tsr_save_tensor(s[1], t->name, t->group, t->dtype, t->ndim, t->shape, NULL, &e) == 0, "%s", e.msg);
    }
    for (int i = 0; i < NT; i++) {
        tsr_box b = whole_box(&TS[i]);
        if (i == 0) {
            b.extent[0] = 32;
            save_box(s[0], &TS[0], &b);
            b.offset[0] = 32;
            save_box(s[1], &TS[0], &b);
        } else {
            save_box(s[0], &TS[i], &b);
        }
    }
    for (int i = NB - 1; i >= 0; i--) { /* out of order: the writer sorts */
        uint8_t *p = malloc(BS[i].size + 1);
        REQUIRE(p, "out of memory");
        blob_fill(&BS[i], p);
        REQUIRE(tsr_save_blob(s[BS[i].file], BS[i].name, BS[i].rank, p, BS[i].size, &e) == 0, "%s", e.msg);
        free(p);
    }
    const uint8_t *tables[2];
    size_t lens[2];
    for (int w = 0; w < 2; w++) REQUIRE(tsr_save_finish(s[w], &tables[w], &lens[w], &e) == 0, "%s", e.msg);
    REQUIRE(tsr_save_commit(s[0], tables, lens, 2, 7, NULL, &e) == 0, "%s", e.msg);
    tsr_save_free(s[0]);
    tsr_save_free(s[1]);
}

static int why_set(char *why, size_t wlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int why_set(char *why, size_t wlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, wlen, fmt, ap);
    va_end(ap);
    return 1;
}

/* Opens dir and checks everything: verify finds nothing, every tensor (by index:
 * names may have been changed by a case) and blob reads back exactly. Returns 0,
 * or 1 with the reason in why. */
static int deep_check(const char *dir, char *why, size_t wlen) {
    tsr_error e = {0};
    tsr_ckpt *ck = tsr_ckpt_open(dir, &e);
    if (!ck) return why_set(why, wlen, "open: %s", e.msg);
    int bad = 0;
    long probs = tsr_ckpt_verify(ck, NULL, NULL, 2, &e);
    if (probs != 0) bad = why_set(why, wlen, "verify: %ld problems", probs);
    if (!bad && (tsr_ckpt_n_tensors(ck) != NT || tsr_ckpt_n_blobs(ck) != NB))
        bad = why_set(why, wlen, "%zu tensors, %zu blobs", tsr_ckpt_n_tensors(ck), tsr_ckpt_n_blobs(ck));
    for (int i = 0; !bad && i < NT; i++) {
        const tspec *t = &TS[i];
        tsr_tensor_info ti;
        tsr_ckpt_tensor(ck, (size_t)i, &ti);
        if (ti.dtype != t->dtype || ti.ndim != t->ndim) {
            bad = why_set(why, wlen, "tensor %d: dtype/ndim", i);
            break;
        }
        tsr_box b = whole_box(t);
        size_t n = tsr_box_volume(&b) * tsr_dtype_size(t->dtype);
        void *buf = malloc(n ? n : 1);
        REQUIRE(buf, "out of memory");
        if (tsr_ckpt_read(ck, (size_t)i, &b, buf, &e))
            bad = why_set(why, wlen, "read %s: %s", t->name, e.msg);
        else if (tsr_synth_check(t->name, t->dtype, t->ndim, t->shape, &b, buf, NULL))
            bad = why_set(why, wlen, "%s: wrong content", t->name);
        free(buf);
    }
    for (int i = 0; !bad && i < NB; i++) {
        uint8_t *want = malloc(BS[i].size + 1), *got = malloc(BS[i].size + 1);
        REQUIRE(want && got, "out of memory");
        blob_fill(&BS[i], want);
        tsr_blob_info bi;
        tsr_ckpt_blob(ck, (size_t)i, &bi);
        if (bi.size != BS[i].size) bad = why_set(why, wlen, "blob %d: size", i);
        else if (tsr_ckpt_read_blob(ck, (size_t)i, got, &e))
            bad = why_set(why, wlen, "blob %d: %s", i, e.msg);
        else if (BS[i].size && memcmp(want, got, BS[i].size))
            bad = why_set(why, wlen, "blob %d: wrong content", i);
        free(want), free(got);
    }
    tsr_ckpt_close(ck);
    return bad;
}

/* --------------------------------------------------- MANIFEST surgery */

enum { STR = 1, FIL, TEN, CHK, FRM, BLB };

typedef struct xsec {
    uint32_t type, flags, rec, count;
    uint8_t *d;
    size_t n;
} xsec;
typedef struct xmf {
    uint8_t hdr[128];
    uint32_t hsize; /* header size when packed (bytes past 128 are zero) */
    int ns;
    xsec s[96];
} xmf;

static void unpack(const uint8_t *b, size_t n, xmf *x) {
    memset(x, 0, sizeof *x);
    REQUIRE(n >= 136, "short MANIFEST");
    memcpy(x->hdr, b, 128);
    x->hsize = tsr_ld32(b + 12);
    x->ns = (int)tsr_ld32(b + 48);
    REQUIRE(x->hsize == 128 && x->ns == 6, "unexpected MANIFEST layout");
    for (int i = 0; i < x->ns; i++) {
        const uint8_t *e = b + 128 + 32 * i;
        xsec *s = &x->s[i];
        s->type = tsr_ld32(e), s->flags = tsr_ld32(e + 4);
        s->rec = tsr_ld32(e + 24), s->count = tsr_ld32(e + 28);
        uint64_t off = tsr_ld64(e + 8);
        s->n = tsr_ld64(e + 16);
        REQUIRE(off + s->n <= n - 8, "section outside");
        s->d = dup_exact(b + off, s->n);
        if (s->type > TSR_SEC_PACKED) { /* packed (FORMAT.md 4.3; one block here): patched as plain records */
            size_t rn = (size_t)s->rec * s->count;
            uint8_t *shuf = malloc(rn + 1), *recs = malloc(rn + 1);
            REQUIRE(shuf && recs && ZSTD_decompress(shuf, rn, s->d, s->n) == rn, "packed section %u", s->type);
            tsr_mf_transpose(shuf, s->rec, s->count, recs);
            free(shuf), free(s->d);
            s->d = recs, s->n = rn, s->type -= TSR_SEC_PACKED;
        }
    }
}

static void xfree(xmf *x) {
    for (int i = 0; i < x->ns; i++) free(x->s[i].d);
    x->ns = 0;
}

/* Lays the sections out after the table, 8-aligned, in x's order; sets
 * header_size, section_count, file_size and the trailer. */
static uint8_t *pack(const xmf *x, size_t *out_n) {
    size_t off = tsr_align_up(x->hsize + 32 * (size_t)x->ns, 8), offs[96];
    for (int i = 0; i < x->ns; i++) {
        offs[i] = off;
        off = tsr_align_up(off + x->s[i].n, 8);
    }
    size_t n = off + 8;
    uint8_t *b = calloc(1, n);
    REQUIRE(b, "out of memory");
    memcpy(b, x->hdr, 128);
    tsr_st32(b + 12, x->hsize);
    tsr_st64(b + 16, n);
    tsr_st32(b + 48, (uint32_t)x->ns);
    for (int i = 0; i < x->ns; i++) {
        uint8_t *e = b + x->hsize + 32 * i;
        const xsec *s = &x->s[i];
        tsr_st32(e, s->type), tsr_st32(e + 4, s->flags);
        tsr_st64(e + 8, offs[i]), tsr_st64(e + 16, s->n);
        tsr_st32(e + 24, s->rec), tsr_st32(e + 28, s->count);
        if (s->n) memcpy(b + offs[i], s->d, s->n);
    }
    tsr_st64(b + n - 8, tsr_hash(b, n - 8));
    *out_n = n;
    return b;
}

static void fix_trailer(uint8_t *b, size_t n) { tsr_st64(b + n - 8, tsr_hash(b, n - 8)); }

static xsec *S(xmf *x, uint32_t type) {
    for (int i = 0; i < x->ns; i++)
        if (x->s[i].type == type) return &x->s[i];
    REQUIRE(0, "no section %u", type);
    return NULL;
}
static uint8_t *R(xmf *x, uint32_t type, uint32_t i) {
    xsec *s = S(x, type);
    REQUIRE(i < s->count, "no record %u in section %u", i, type);
    return s->d + (size_t)i * s->rec;
}
static int name_is(xmf *x, const uint8_t *ref, const char *name) {
    xsec *st = S(x, STR);
    uint32_t off = tsr_ld32(ref), len = tsr_ld32(ref + 4);
    return (uint64_t)off + len <= st->n && len == strlen(name) && memcmp(st->d + off, name, len) == 0;
}
static uint32_t Ti(xmf *x, const char *name) { /* tensor index */
    xsec *s = S(x, TEN);
    for (uint32_t i = 0; i < s->count; i++)
        if (name_is(x, s->d + (size_t)i * s->rec, name)) return i;
    REQUIRE(0, "no tensor %s", name);
    return 0;
}
static uint8_t *T(xmf *x, const char *name) { return R(x, TEN, Ti(x, name)); }
static uint8_t *C(xmf *x, const char *name, uint32_t k) { /* chunk k of a tensor */
    uint8_t *t = T(x, name);
    REQUIRE(k < tsr_ld32(t + 32), "%s has no chunk %u", name, k);
    return R(x, CHK, tsr_ld32(t + 28) + k);
}
static uint8_t *F(xmf *x, const char *name, uint32_t k) { /* frame k of a tensor */
    return R(x, FRM, tsr_ld32(C(x, name, 0) + 8) + k);
}
static uint8_t *B(xmf *x, const char *name, int32_t rank) {
    xsec *s = S(x, BLB);
    for (uint32_t i = 0; i < s->count; i++) {
        uint8_t *p = s->d + (size_t)i * s->rec;
        if (name_is(x, p, name) && (int32_t)tsr_ld32(p + 8) == rank) return p;
    }
    REQUIRE(0, "no blob %s/%d", name, rank);
    return NULL;
}
static uint8_t *BF(xmf *x, const char *name, int32_t rank, uint32_t k) { /* frame k of a blob */
    uint8_t *b = B(x, name, rank);
    REQUIRE(k < tsr_ld32(b + 20), "blob %s has no frame %u", name, k);
    return R(x, FRM, tsr_ld32(b + 16) + k);
}

/* Appends bytes to STRINGS; returns their offset. */
static uint32_t add_str(xmf *x, const void *s, size_t len) {
    xsec *st = S(x, STR);
    uint8_t *d = realloc(st->d, st->n + len + 1);
    REQUIRE(d, "out of memory");
    memcpy(d + st->n, s, len);
    st->d = d;
    uint32_t off = (uint32_t)st->n;
    st->n += len;
    st->count = (uint32_t)st->n;
    return off;
}
static void set_ref(uint8_t *p, uint32_t off, uint32_t len) { tsr_st32(p, off), tsr_st32(p + 4, len); }
static void rename_to(xmf *x, uint8_t *rec, const void *s, size_t len) { set_ref(rec, add_str(x, s, len), (uint32_t)len); }

/* Changes a section's record size: each record keeps its first bytes; new bytes are `fill`. */
static void restride(xmf *x, uint32_t type, uint32_t rec, uint8_t fill) {
    xsec *s = S(x, type);
    uint8_t *d = malloc((size_t)rec * s->count + 1);
    REQUIRE(d, "out of memory");
    memset(d, fill, (size_t)rec * s->count + 1);
    for (uint32_t i = 0; i < s->count; i++)
        memcpy(d + (size_t)i * rec, s->d + (size_t)i * s->rec, rec < s->rec ? rec : s->rec);
    free(s->d);
    s->d = d;
    s->rec = rec;
    s->n = (size_t)rec * s->count;
}

static void add_sec(xmf *x, uint32_t type, uint32_t flags, uint32_t rec, uint32_t count) {
    REQUIRE(x->ns < 96, "too many sections");
    xsec *s = &x->s[x->ns++];
    *s = (xsec){type, flags, rec, count, NULL, (size_t)rec * count};
    s->d = malloc(s->n + 1);
    REQUIRE(s->d, "out of memory");
    for (size_t i = 0; i < s->n; i++) s->d[i] = (uint8_t)(0xC3 ^ i);
}
static void dup_sec(xmf *x, uint32_t type) {
    xsec *s = S(x, type);
    REQUIRE(x->ns < 96, "too many sections");
    x->s[x->ns] = *s;
    x->s[x->ns].d = dup_exact(s->d, s->n);
    x->ns++;
}
static void del_sec(xmf *x, uint32_t type) {
    xsec *s = S(x, type);
    free(s->d);
    int i = (int)(s - x->s);
    memmove(&x->s[i], &x->s[i + 1], (size_t)(x->ns - i - 1) * sizeof *s);
    x->ns--;
}
static void swap_bytes(uint8_t *a, uint8_t *b, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint8_t t = a[i];
        a[i] = b[i], b[i] = t;
    }
}

/* The section table entry of `type` in packed bytes. */
static uint8_t *E(uint8_t *b, uint32_t type) {
    uint32_t ns = tsr_ld32(b + 48), hs = tsr_ld32(b + 12);
    for (uint32_t i = 0; i < ns; i++)
        if (tsr_ld32(b + hs + 32 * i) == type) return b + hs + 32 * i;
    REQUIRE(0, "no section %u", type);
    return NULL;
}
static uint64_t E_off(uint8_t *b, uint32_t t) { return tsr_ld64(E(b, t) + 8); }

/* ---------------------------------------------------------------- cases */

#define X(fn, ...) static void fn(xmf *x) { __VA_ARGS__; }
#define Y(fn, ...) static void fn(uint8_t *b, size_t n) { __VA_ARGS__; }
#define ST16(p, v) tsr_st16((p), (uint16_t)(v))
#define ST32(p, v) tsr_st32((p), (uint32_t)(v))
#define ST64(p, v) tsr_st64((p), (uint64_t)(v))
#define ADD32(p, v) tsr_st32((p), tsr_ld32(p) + (uint32_t)(v))
#define ADD64(p, v) tsr_st64((p), tsr_ld64(p) + (uint64_t)(v))
static const char name256[] =
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

/* header and section table (packed bytes) */
Y(b_size_plus, ST64(b + 16, n + 8))
Y(b_size_minus, ST64(b + 16, n - 1))
Y(b_magic, b[3] ^= 0x20)
Y(b_major2, ST16(b + 8, 2))
Y(b_major_ffff, ST16(b + 8, 0xFFFF))
Y(b_minor9, ST16(b + 10, 9))
Y(b_hsize_small, ST32(b + 12, 120))
Y(b_hsize_odd, ST32(b + 12, 131))
Y(b_hsize_past, ST32(b + 12, n))
Y(b_hsize_huge, ST32(b + 12, 0xFFFFFFF8u))
Y(b_nsec0, ST32(b + 48, 0))
Y(b_nsec5, ST32(b + 48, 5))
Y(b_nsec_huge, ST32(b + 48, 0x7FFFFFFF))
Y(b_nsec_max, ST32(b + 48, 0xFFFFFFFF))
Y(b_count_plus, ADD32(E(b, TEN) + 28, 1))
Y(b_count_huge, ST32(E(b, FRM) + 28, 0xFFFFFFFF))
Y(b_count_size_past, ADD32(E(b, BLB) + 28, 1); ADD64(E(b, BLB) + 16, 32))
Y(b_size_huge, ST32(E(b, FRM) + 28, 0xFFFFFFFF); ST64(E(b, FRM) + 16, 48ull * 0xFFFFFFFF))
Y(b_off_eof, ST64(E(b, FIL) + 8, n))
Y(b_off_trailer, ST64(E(b, FIL) + 8, n - 8))
Y(b_off_huge, ST64(E(b, TEN) + 8, UINT64_MAX - 7))
Y(b_off_unaligned, ADD64(E(b, TEN) + 8, 4))
Y(b_off_in_table, ST64(E(b, STR) + 8, 128 + 32))
Y(b_off_in_header, ST64(E(b, STR) + 8, 0))
Y(b_overlap, ST64(E(b, FIL) + 8, E_off(b, STR)))
Y(b_overlap_tail, ST64(E(b, BLB) + 8, E_off(b, FRM) + 8))
Y(b_rec_small, ST32(E(b, TEN) + 24, tsr_ld32(E(b, TEN) + 24) / 2); ADD32(E(b, TEN) + 28, tsr_ld32(E(b, TEN) + 28)))
Y(b_rec_zero, ST32(E(b, FIL) + 24, 0); ST64(E(b, FIL) + 16, 0))
Y(b_flip_body, b[n / 2] ^= 1)
Y(b_flip_trailer, b[n - 1] ^= 1)

/* sections rebuilt */
X(x_hsize136, x->hsize = 136)
X(x_minor9_bigrec, ST16(x->hdr + 10, 9); restride(x, FIL, 24, 0xA5); restride(x, TEN, 120, 0xA5);
  restride(x, CHK, 168, 0xA5); restride(x, FRM, 64, 0xA5); restride(x, BLB, 40, 0xA5))
X(x_rec_small_tensor, restride(x, TEN, 100, 0))
X(x_rec_small_frame, restride(x, FRM, 41, 0))
X(x_rec_small_blob, restride(x, BLB, 28, 0))
X(x_rec_small_chunk, restride(x, CHK, 159, 0))
X(x_rec_small_file, restride(x, FIL, 12, 0))
X(x_opt_sec, add_sec(x, 1000, 0, 8, 3))
X(x_opt_sec_flags, add_sec(x, 7, 0xFFFFFFFE, 1, 5); add_sec(x, 0, 0, 0, 0))
X(x_opt_secs_many, for (int i = 0; i < 20; i++) add_sec(x, 100 + (uint32_t)i, 0, 4, (uint32_t)i))
X(x_opt_secs_70, for (int i = 0; i < 70; i++) add_sec(x, 100 + (uint32_t)i, 0, 8, 1))
X(x_hsize132, x->hsize = 132)
X(x_req_sec, add_sec(x, 1000, 1, 8, 3))
X(x_req_sec_empty, add_sec(x, 0xFFFFFFFF, 3, 0, 0))
X(x_reordered, xsec t = x->s[0]; x->s[0] = x->s[5]; x->s[5] = t; t = x->s[1]; x->s[1] = x->s[3]; x->s[3] = t)
/* packed sections (FORMAT.md 4.3): section `type` packed again, then spoiled
 * by `how`: 0 not at all, 1 its first byte (the zstd magic), 2 a byte after
 * the frame, 3 the frame cut short, 4 one record more than the frame holds */
static void repack(xmf *x, uint32_t type, int how) {
    xsec *s = S(x, type);
    size_t rn = (size_t)s->rec * s->count, bound = ZSTD_compressBound(rn);
    uint8_t *shuf = malloc(rn + 1), *z = malloc(bound + 1);
    REQUIRE(shuf && z, "out of memory");
    tsr_mf_transpose(s->d, s->count, s->rec, shuf);
    size_t zn = ZSTD_compress(z, bound, shuf, rn, 3);
    REQUIRE(!ZSTD_isError(zn), "zstd");
    free(shuf), free(s->d);
    if (how == 1) z[0] ^= 0xFF;
    if (how == 2) z[zn++] = 0;
    if (how == 3) zn -= 3;
    if (how == 4) s->count++;
    s->d = z, s->n = zn, s->type += TSR_SEC_PACKED;
}
X(x_packed_files, repack(x, FIL, 0))
X(x_packed_tensors_blobs, repack(x, TEN, 0); repack(x, BLB, 0))
X(x_packed_not_zstd, repack(x, CHK, 1))
X(x_packed_trailing, repack(x, FRM, 2))
X(x_packed_cut, repack(x, FRM, 3))
X(x_packed_count, repack(x, CHK, 4))
X(x_packed_and_plain, dup_sec(x, CHK); repack(x, CHK, 0))
X(x_packed_strings, repack(x, STR, 0))
X(x_packed_huge, repack(x, FRM, 0); S(x, FRM + TSR_SEC_PACKED)->rec = 1u << 30; S(x, FRM + TSR_SEC_PACKED)->count = 5)
X(x_missing_blobs, del_sec(x, BLB))
X(x_missing_strings, del_sec(x, STR))
X(x_missing_frames, del_sec(x, FRM))
X(x_dup_files, dup_sec(x, FIL))
X(x_dup_tensors, dup_sec(x, TEN))
X(x_dup_strings_empty, add_sec(x, STR, 1, 1, 0))
X(x_retyped_blobs, S(x, BLB)->type = 77; S(x, 77)->flags = 0)

/* strings and names */
X(x_ref_past, ST32(T(x, "a.w"), S(x, STR)->n))
X(x_ref_len_past, ST32(T(x, "a.w") + 4, S(x, STR)->n + 1))
X(x_ref_wrap, set_ref(T(x, "a.w"), 0xFFFFFFFFu, 2))
X(x_ref_len_huge, set_ref(T(x, "a.w"), 1, 0xFFFFFFFFu))
X(x_group_ref_past, ST32(T(x, "b.ids") + 8, 0xFFFFFFF0u))
X(x_blob_ref_past, ST32(B(x, "meta", -1) + 4, 0x10000))
X(x_name_slash, rename_to(x, T(x, "a.w"), "a/w", 3))
X(x_name_dotdot, rename_to(x, T(x, "a.w"), "a..w", 4))
X(x_name_parent, rename_to(x, T(x, "a.w"), "..", 2))
X(x_name_nul, rename_to(x, T(x, "a.w"), "a\0w", 3))
X(x_name_space, rename_to(x, T(x, "a.w"), "a w", 3))
X(x_name_empty, set_ref(T(x, "a.w"), 0, 0))
X(x_name_lead_dot, rename_to(x, T(x, "a.w"), ".a", 2))
X(x_name_trail_dot, rename_to(x, T(x, "a.w"), "a.", 2))
X(x_name_256, rename_to(x, T(x, "a.w"), name256, 256))
/* (the digest, which the name keys, dropped: FORMAT.md 4.4) */
X(x_name_255, ST32(T(x, "a.w") + 112, 0); rename_to(x, T(x, "a.w"), name256, 255))
X(x_name_high, rename_to(x, T(x, "a.w"), "a\xC3\xA9", 3))
X(x_group_slash, rename_to(x, T(x, "b.ids") + 8, "x/y", 3))
X(x_blob_name_slash, rename_to(x, B(x, "meta", -1), "m/../x", 6))
X(x_unsorted, uint8_t t[8]; memcpy(t, T(x, "a.w"), 8); memcpy(T(x, "a.w"), T(x, "b.ids"), 8);
  memcpy(R(x, TEN, 1), t, 8))
X(x_dup_name, memcpy(T(x, "b.ids"), T(x, "a.w"), 8))

/* tensors */
X(x_dtype0, T(x, "a.w")[16] = 0)
X(x_dtype16, T(x, "b.ids")[16] = 16)
X(x_dtype99, T(x, "a.w")[16] = 99)
X(x_ndim9, T(x, "a.w")[17] = 9)
X(x_ndim255, T(x, "c.scalar")[17] = 255)
X(x_shape_past_ndim, ST64(T(x, "a.w") + 40 + 16, 5))
X(x_shape_0d, ST64(T(x, "c.scalar") + 40, 1))
X(x_shape_last, ST64(T(x, "e.h") + 40 + 56, 1))
X(x_vol_overflow, ST64(T(x, "d.empty") + 40, 1ull << 40); ST64(T(x, "d.empty") + 48, 1ull << 40))
X(x_vol_2_62, ST64(T(x, "d.empty") + 40, 1ull << 30); ST64(T(x, "d.empty") + 48, 1ull << 31))
X(x_vol_zero_huge, ST64(T(x, "d.empty") + 48, UINT64_MAX)) /* 0 x 2^64-1: volume 0, accepted */
X(x_tp_dim2, T(x, "a.w")[18] = 2)
X(x_tp_dim_m2, T(x, "a.w")[18] = 0xFE)
X(x_tp_dim_0d, T(x, "c.scalar")[18] = 0)
X(x_tp_dim1, T(x, "a.w")[18] = 1) /* valid */
X(x_fsdp2, T(x, "a.w")[19] = 2)
X(x_pp_role4, T(x, "a.w")[20] = 4)
X(x_layer_no_role, ST32(T(x, "a.w") + 24, 5))
X(x_role_no_layer, T(x, "a.w")[20] = 3)
X(x_role_layer, T(x, "a.w")[20] = 3; ST32(T(x, "a.w") + 24, 5); ST32(x->hdr + 80, 6)) /* valid */
X(x_role_layer_n5, T(x, "a.w")[20] = 3; ST32(T(x, "a.w") + 24, 5); ST32(x->hdr + 80, 5))
X(x_role_layer_n0, T(x, "a.w")[20] = 3; ST32(T(x, "a.w") + 24, 5)) /* n_layers stays 0 */
X(x_layer_max_pp2, T(x, "a.w")[20] = 3; ST32(T(x, "a.w") + 24, INT32_MAX); ST32(x->hdr + 64, 2);
  ST32(x->hdr + 80, 2))
X(x_layer_max_nmax, T(x, "a.w")[20] = 3; ST32(T(x, "a.w") + 24, INT32_MAX); ST32(x->hdr + 80, 1u << 31)) /* valid */

/* the layout in the header: degrees at offsets 64 (pp), 68, 72, 76 (tp), n_layers at 80 */
X(x_pp0, ST32(x->hdr + 64, 0))
X(x_tp0, ST32(x->hdr + 76, 0))
X(x_pp_max, ST32(x->hdr + 64, 0xFFFFFFFFu))
X(x_dpr_max, ST32(x->hdr + 68, 0xFFFFFFFFu))
X(x_dps_max, ST32(x->hdr + 72, 0xFFFFFFFFu))
X(x_tp_max, ST32(x->hdr + 76, 0xFFFFFFFFu))
X(x_degrees_max, for (int i = 0; i < 4; i++) ST32(x->hdr + 64 + 4 * i, 0xFFFFFFFFu))
X(x_ranks_2_31, ST32(x->hdr + 72, 1u << 31)) /* valid: the most ranks */
X(x_ranks_2_31_1, ST32(x->hdr + 72, (1u << 31) + 1))
X(x_ranks_2_32, ST32(x->hdr + 64, 65536); ST32(x->hdr + 76, 65536))
X(x_nlayers_max, ST32(x->hdr + 80, 0xFFFFFFFFu))
X(x_nlayers_2_31_1, ST32(x->hdr + 80, (1u << 31) + 1))
X(x_nlayers_pp, ST32(x->hdr + 64, 4); ST32(x->hdr + 80, 2)) /* valid: more stages than layers */
X(x_chunk_first, ADD32(T(x, "b.ids") + 28, 1))
X(x_chunk_count_less, ADD32(T(x, "a.w") + 32, -1))
X(x_chunk_count_more, ADD32(T(x, "e.h") + 32, 1))
X(x_chunk_count_huge, ST32(T(x, "e.h") + 32, 0xFFFFFFFF))
static void x_empty_with_chunk(xmf *x) { /* a chunk (1 x 16) for the 0 x 16 tensor */
    xsec *c = S(x, CHK);
    uint32_t at = tsr_ld32(T(x, "d.empty") + 28);
    uint8_t *d = calloc((size_t)c->rec * (c->count + 1), 1);
    REQUIRE(d, "out of memory");
    memcpy(d, c->d, (size_t)c->rec * at);
    memcpy(d + (size_t)c->rec * (at + 1), c->d + (size_t)c->rec * at, (size_t)c->rec * (c->count - at));
    uint8_t *r = d + (size_t)c->rec * at;
    tsr_st32(r, Ti(x, "d.empty"));
    tsr_st32(r + 8, tsr_ld32(r + c->rec + 8)); /* the frame range of the next chunk */
    tsr_st32(r + 12, 1);
    tsr_st64(r + 24, 1);
    tsr_st64(r + 96, 1), tsr_st64(r + 104, 16);
    free(c->d);
    c->d = d, c->count++, c->n += c->rec;
    ADD32(T(x, "d.empty") + 32, 1);
    ADD32(T(x, "e.h") + 28, 1);
}

/* chunks */
X(x_chunk_other_tensor, ST32(C(x, "a.w", 1), Ti(x, "d.empty")))
X(x_chunk_other_ndim, ST32(C(x, "a.w", 1), Ti(x, "b.ids")))
X(x_chunk_tensor_past, ST32(C(x, "a.w", 0), 99))
X(x_chunk_file_unknown, ST32(C(x, "b.ids", 0) + 4, 7))
X(x_chunk_outside, ST64(C(x, "a.w", 1) + 32, 33))
X(x_chunk_off_wrap, ST64(C(x, "a.w", 1) + 32 + 8, UINT64_MAX))
X(x_chunk_ext_wrap, ST64(C(x, "a.w", 1) + 96 + 8, UINT64_MAX - 0))
X(x_chunk_ext0, ST64(C(x, "a.w", 1) + 96 + 8, 0))
X(x_chunk_past_ndim, ST64(C(x, "a.w", 0) + 32 + 16, 1))
X(x_chunk_past_ndim_ext, ST64(C(x, "a.w", 0) + 96 + 56, 1))
X(x_chunk_0d_ext, ST64(C(x, "c.scalar", 0) + 96, 1))
X(x_chunk_overlap, ST64(C(x, "a.w", 1) + 32, 16))
X(x_chunk_uncovered, ST64(T(x, "a.w") + 40, 65))
X(x_chunk_uncovered_cols, ST64(T(x, "e.h") + 48 + 8, 41))
X(x_chunk_unsorted, uint8_t *c0 = C(x, "a.w", 0); uint8_t *c1 = C(x, "a.w", 1);
  swap_bytes(c0, c1, 160); swap_bytes(c0 + 8, c1 + 8, 4))
X(x_frame_count_plus, ADD32(C(x, "a.w", 0) + 12, 1))
X(x_frame_count_zero, ST32(C(x, "c.scalar", 0) + 12, 0))
X(x_frame_count_huge, ST32(C(x, "e.h", 0) + 12, 0xFFFFFFFF))
X(x_split_dim2, C(x, "a.w", 0)[16] = 2)
X(x_split_dim_255, C(x, "e.h", 0)[16] = 255)
X(x_split_dim_0d, C(x, "c.scalar", 0)[16] = 1)
X(x_rows0, ST64(C(x, "a.w", 0) + 24, 0))
X(x_rows_past, ST64(C(x, "a.w", 0) + 24, 33))
X(x_rows_huge, ST64(C(x, "e.h", 0) + 24, UINT64_MAX))
X(x_rows_0d, ST64(C(x, "c.scalar", 0) + 24, 2))
X(x_rows_other, ST64(C(x, "a.w", 0) + 24, 16)) /* same frame count, other boxes */
X(x_frame_first, ADD32(C(x, "a.w", 1) + 8, 1))
X(x_frame_first_huge, ST32(C(x, "a.w", 0) + 8, 0xFFFFFFF0u))

/* frames */
X(x_raw_size, ADD64(F(x, "a.w", 1) + 16, 4))
X(x_raw_size_0d, ST64(F(x, "c.scalar", 0) + 16, 4))
X(x_frame_unaligned, ADD64(F(x, "b.ids", 1), 8))
X(x_frame_off0, ST64(F(x, "a.w", 0), 0))
X(x_frame_off_huge, ST64(F(x, "e.h", 3), 1ull << 62))
X(x_frame_off_max, ST64(F(x, "e.h", 3), UINT64_MAX - 4095))
X(x_frames_overlap, ST64(F(x, "b.ids", 1), tsr_ld64(F(x, "b.ids", 0))))
X(x_frame_gap, ADD64(F(x, "b.ids", 2), 4096))
X(x_file_short, ADD64(R(x, FIL, 0) + 8, -4096))
X(x_file_long, ADD64(R(x, FIL, 1) + 8, 4096))
X(x_stored_past, F(x, "e.h", 3)[40] = 1; ST64(F(x, "e.h", 3) + 8, 1ull << 40))
X(x_stored_limit, uint8_t *f = F(x, "e.h", 3); uint64_t raw = tsr_ld64(f + 16); f[40] = 1;
  ST64(f + 8, raw + raw / 128 + 4096 + 1))
X(x_stored0, F(x, "a.w", 0)[40] = 1; ST64(F(x, "a.w", 0) + 8, 0))
X(x_raw_stored, F(x, "b.ids", 0)[40] = 0; ST64(F(x, "b.ids", 0) + 8, tsr_ld64(F(x, "b.ids", 0) + 16) + 1))
X(x_codec3, F(x, "a.w", 0)[40] = 3)
X(x_codec255, F(x, "e.h", 1)[40] = 255)
X(x_bytegroup_int, F(x, "b.ids", 0)[40] = 2)
X(x_bytegroup_i64, F(x, "c.scalar", 0)[40] = 2)

/* blobs */
X(x_blob_size, ADD64(B(x, "meta", -1) + 24, 1))
X(x_blob_size_less, ADD64(B(x, "rng", 0) + 24, -1))
X(x_blob_codec2, BF(x, "rng", 0, 1)[40] = 2)
X(x_blob_codec3, BF(x, "meta", -1, 0)[40] = 3)
X(x_blob_rank_m2, ST32(B(x, "meta", -1) + 8, -2))
X(x_blob_rank_min, ST32(B(x, "meta", -1) + 8, INT32_MIN))
X(x_blob_raw0, BF(x, "meta", -1, 0)[40] = 1; ST64(BF(x, "meta", -1, 0) + 16, 0); ST64(B(x, "meta", -1) + 24, 0))
X(x_blob_raw_big, uint8_t *f = BF(x, "meta", -1, 0); f[40] = 1; ST64(f + 16, (256ull << 20) + 1);
  ST64(B(x, "meta", -1) + 24, (256ull << 20) + 1))
X(x_blob_file, ST32(B(x, "rng", 1) + 12, 9))
X(x_blob_frame_first, ADD32(B(x, "rng", 1) + 16, 1))
X(x_blob_frame_count, ADD32(B(x, "rng", 1) + 20, 1))
X(x_blob_frame_count_huge, ST32(B(x, "rng", 1) + 20, 0xFFFFFFFF))
X(x_blob_empty_frames, ST32(B(x, "empty", -1) + 20, 1); ST32(B(x, "empty", -1) + 16, 0))
X(x_blob_unsorted, uint8_t t[8]; uint8_t *m = B(x, "meta", -1); uint8_t *r = B(x, "rng", 0);
  memcpy(t, m, 8); memcpy(m, r, 8); memcpy(r, t, 8))
X(x_blob_repeated, ST32(B(x, "rng", 1) + 8, 0))
X(x_blob_rank_order, ST32(B(x, "rng", 0) + 8, 5)) /* (rng,5) before (rng,1) */

/* files */
X(x_file_unaligned, ADD64(R(x, FIL, 0) + 8, 1))
X(x_file_zero, ST64(R(x, FIL, 1) + 8, 0))
X(x_file_huge, ST64(R(x, FIL, 1) + 8, (1ull << 62) + 4096))
X(x_file_unsorted, ST32(R(x, FIL, 0), 1); ST32(R(x, FIL, 1), 0))
X(x_file_repeated, ST32(R(x, FIL, 1), 0))
X(x_files_none, xsec *s = S(x, FIL); s->count = 0; s->n = 0)

typedef struct hcase {
    const char *desc;
    void (*x)(xmf *);              /* structural patch, or NULL */
    void (*b)(uint8_t *, size_t);  /* byte patch after packing, or NULL */
    int code;                      /* expected status; 0: accepted */
    const char *want;              /* substring of the message, or NULL */
    int nofix;                     /* keep the (now wrong) trailer */
} hcase;

#define OK 0
#define BAD TSR_ECORRUPT
static const hcase cases[] = {
    {"unmodified (unpack/pack round trip)", NULL, NULL, OK, NULL, 0},
    /* header */
    {"file_size field larger than the file", NULL, b_size_plus, BAD, "says", 0},
    {"file_size field smaller than the file", NULL, b_size_minus, BAD, "says", 0},
    {"bad magic", NULL, b_magic, BAD, "magic", 0},
    {"trailer does not match (body byte flipped)", NULL, b_flip_body, BAD, "checksum", 1},
    {"trailer does not match (trailer byte flipped)", NULL, b_flip_trailer, BAD, "checksum", 1},
    {"version_major 2", NULL, b_major2, TSR_EVERSION, "version", 0},
    {"version_major 65535", NULL, b_major_ffff, TSR_EVERSION, "version", 0},
    {"version_minor 9", NULL, b_minor9, OK, NULL, 0},
    {"header_size 120 (below 128)", NULL, b_hsize_small, BAD, "header", 0},
    {"header_size 131", NULL, b_hsize_odd, BAD, NULL, 0},
    {"header_size past the end", NULL, b_hsize_past, BAD, NULL, 0},
    {"header_size 2^32-8", NULL, b_hsize_huge, BAD, NULL, 0},
    {"header_size 136 (larger header, table after it)", x_hsize136, NULL, OK, NULL, 0},
    /* FORMAT.md neither requires header_size to be a multiple of 8 (only section
     * offsets are) nor bounds the number of sections: both files are valid */
    {"header_size 132 (table at offset 132, sections 8-aligned)", x_hsize132, NULL, OK, NULL, 0},
    {"70 unknown optional sections", x_opt_secs_70, NULL, OK, NULL, 0},
    /* section table */
    /* packed sections */
    {"FILES packed", x_packed_files, NULL, OK, NULL, 0},
    {"TENSORS and BLOBS packed", x_packed_tensors_blobs, NULL, OK, NULL, 0},
    {"packed CHUNKS: not a zstd frame", x_packed_not_zstd, NULL, BAD, "packed section type 20: not a zstd frame", 0},
    {"packed FRAMES: a byte after the zstd frame", x_packed_trailing, NULL, BAD, "bytes after its zstd frame", 0},
    {"packed FRAMES: the zstd frame cut short", x_packed_cut, NULL, BAD, "packed section type 21", 0},
    {"packed CHUNKS: a record more than its frame holds", x_packed_count, NULL, BAD, "its zstd frame declares", 0},
    {"CHUNKS both plain and packed", x_packed_and_plain, NULL, BAD, "appears twice (packed or not)", 0},
    {"STRINGS packed (not a packed type)", x_packed_strings, NULL, BAD, "(type 17)", 0},
    {"packed FRAMES of 5 GiB of records", x_packed_huge, NULL, BAD, "over the 4 GiB limit", 0},
    {"section_count 0", NULL, b_nsec0, BAD, "missing", 0},
    {"section_count 5 (BLOBS entry dropped)", NULL, b_nsec5, BAD, "missing", 0},
    {"section_count 2^31-1 (table past the end)", NULL, b_nsec_huge, BAD, "section", 0},
    {"section_count 2^32-1", NULL, b_nsec_max, BAD, "section", 0},
    {"TENSORS count + 1 (count > size / record_size)", NULL, b_count_plus, BAD, "records", 0},
    {"FRAMES count 2^32-1, size unchanged", NULL, b_count_huge, BAD, "records", 0},
    {"BLOBS count and size + 1 record (past the trailer)", NULL, b_count_size_past, BAD, "outside", 0},
    {"FRAMES count 2^32-1 with matching size (past the end)", NULL, b_size_huge, BAD, "outside", 0},
    {"FILES offset = file size", NULL, b_off_eof, BAD, "outside", 0},
    {"FILES offset = the trailer's", NULL, b_off_trailer, BAD, "outside", 0},
    {"TENSORS offset 2^64-8 (offset + size wraps)", NULL, b_off_huge, BAD, "outside", 0},
    {"TENSORS offset not 8-aligned", NULL, b_off_unaligned, BAD, "section", 0},
    {"STRINGS inside the section table", NULL, b_off_in_table, BAD, "outside", 0},
    {"STRINGS at offset 0 (the header)", NULL, b_off_in_header, BAD, "outside", 0},
    {"FILES overlaps STRINGS", NULL, b_overlap, BAD, "overlap", 0},
    {"BLOBS overlaps the tail of FRAMES", NULL, b_overlap_tail, BAD, "overlap", 0},
    {"TENSORS record_size halved (below v1.0's), count doubled", NULL, b_rec_small, BAD, "record size", 0},
    {"FILES record_size 0 (size 0, count kept)", NULL, b_rec_zero, BAD, "record size", 0},
    {"TENSORS record_size 100", x_rec_small_tensor, NULL, BAD, "record size", 0},
    {"CHUNKS record_size 159", x_rec_small_chunk, NULL, BAD, "record size", 0},
    {"FRAMES record_size 41", x_rec_small_frame, NULL, BAD, "record size", 0},
    {"BLOBS record_size 28", x_rec_small_blob, NULL, BAD, "record size", 0},
    {"FILES record_size 12", x_rec_small_file, NULL, BAD, "record size", 0},
    {"v1.9 with longer records (extra nonzero bytes)", x_minor9_bigrec, NULL, OK, NULL, 0},
    {"unknown optional section (type 1000)", x_opt_sec, NULL, OK, NULL, 0},
    {"unknown optional sections: type 7 (flags without bit 0), type 0 empty", x_opt_sec_flags, NULL, OK, NULL, 0},
    {"20 unknown optional sections", x_opt_secs_many, NULL, OK, NULL, 0},
    {"unknown required section (type 1000)", x_req_sec, NULL, BAD, "required", 0},
    {"unknown required empty section (type 2^32-1)", x_req_sec_empty, NULL, BAD, "required", 0},
    {"sections in another order", x_reordered, NULL, OK, NULL, 0},
    {"BLOBS section missing", x_missing_blobs, NULL, BAD, "missing", 0},
    {"STRINGS section missing", x_missing_strings, NULL, BAD, "missing", 0},
    {"FRAMES section missing", x_missing_frames, NULL, BAD, "missing", 0},
    {"BLOBS retyped to unknown optional type 77 (missing)", x_retyped_blobs, NULL, BAD, "missing", 0},
    {"FILES section repeated", x_dup_files, NULL, BAD, "twice", 0},
    {"TENSORS section repeated", x_dup_tensors, NULL, BAD, "twice", 0},
    {"second, empty STRINGS section", x_dup_strings_empty, NULL, BAD, "twice", 0},
    /* string references and names */
    {"tensor name offset = STRINGS size", x_ref_past, NULL, BAD, "string", 0},
    {"tensor name length past STRINGS", x_ref_len_past, NULL, BAD, "string", 0},
    {"tensor name offset 2^32-1 (off + len wraps in 32 bits)", x_ref_wrap, NULL, BAD, "string", 0},
    {"tensor name length 2^32-1", x_ref_len_huge, NULL, BAD, "string", 0},
    {"group name offset past STRINGS", x_group_ref_past, NULL, BAD, "string", 0},
    {"blob name length past STRINGS", x_blob_ref_past, NULL, BAD, "string", 0},
    {"name with '/'", x_name_slash, NULL, BAD, "name", 0},
    {"name with '..'", x_name_dotdot, NULL, BAD, "name", 0},
    {"name '..'", x_name_parent, NULL, BAD, "name", 0},
    {"name with NUL", x_name_nul, NULL, BAD, "name", 0},
    {"name with a space", x_name_space, NULL, BAD, "name", 0},
    {"empty name", x_name_empty, NULL, BAD, "name", 0},
    {"name with a leading '.'", x_name_lead_dot, NULL, BAD, "name", 0},
    {"name with a trailing '.'", x_name_trail_dot, NULL, BAD, "name", 0},
    {"name of 256 bytes", x_name_256, NULL, BAD, "name", 0},
    {"name with bytes >= 0x80", x_name_high, NULL, BAD, "name", 0},
    {"name of 255 bytes (valid, order kept)", x_name_255, NULL, OK, NULL, 0},
    {"group name with '/'", x_group_slash, NULL, BAD, "name", 0},
    {"blob name 'm/../x'", x_blob_name_slash, NULL, BAD, "name", 0},
    {"tensor names not sorted", x_unsorted, NULL, BAD, "sorted", 0},
    {"tensor name repeated", x_dup_name, NULL, BAD, "a.w", 0},
    /* tensors */
    {"dtype 0", x_dtype0, NULL, BAD, "a.w", 0},
    {"dtype 16", x_dtype16, NULL, BAD, "b.ids", 0},
    {"dtype 99", x_dtype99, NULL, BAD, "a.w", 0},
    {"ndim 9", x_ndim9, NULL, BAD, "a.w", 0},
    {"ndim 255", x_ndim255, NULL, BAD, "c.scalar", 0},
    {"nonzero shape[2] of a 2-d tensor", x_shape_past_ndim, NULL, BAD, "a.w", 0},
    {"nonzero shape[0] of a 0-d tensor", x_shape_0d, NULL, BAD, "c.scalar", 0},
    {"nonzero shape[7] of a 3-d tensor", x_shape_last, NULL, BAD, "e.h", 0},
    {"shape 2^40 x 2^40 (volume overflows)", x_vol_overflow, NULL, BAD, "d.empty", 0},
    {"shape 2^30 x 2^31 f32 (2^63 bytes)", x_vol_2_62, NULL, BAD, "d.empty", 0},
    {"shape 0 x (2^64-1): volume 0", x_vol_zero_huge, NULL, OK, NULL, 0},
    {"tp_dim 2 of a 2-d tensor", x_tp_dim2, NULL, BAD, "a.w", 0},
    {"tp_dim -2", x_tp_dim_m2, NULL, BAD, "a.w", 0},
    {"tp_dim 0 of a 0-d tensor", x_tp_dim_0d, NULL, BAD, "c.scalar", 0},
    {"tp_dim 1 of a 2-d tensor (valid)", x_tp_dim1, NULL, OK, NULL, 0},
    {"fsdp 2", x_fsdp2, NULL, BAD, "a.w", 0},
    {"pp_role 4", x_pp_role4, NULL, BAD, "a.w", 0},
    {"layer 5 without pp_role 3", x_layer_no_role, NULL, BAD, "a.w", 0},
    {"pp_role 3 with layer -1", x_role_no_layer, NULL, BAD, "a.w", 0},
    {"pp_role 3 with layer 5, n_layers 6 (valid)", x_role_layer, NULL, OK, NULL, 0},
    {"pp_role 3 with layer 5, n_layers 5", x_role_layer_n5, NULL, BAD, "a.w", 0},
    {"pp_role 3 with layer 5, n_layers 0", x_role_layer_n0, NULL, BAD, "a.w", 0},
    {"layer 2^31-1 with pp 2, n_layers 2", x_layer_max_pp2, NULL, BAD, "a.w", 0},
    {"layer 2^31-1 with n_layers 2^31 (valid)", x_layer_max_nmax, NULL, OK, NULL, 0},
    /* layout */
    {"layout pp 0", x_pp0, NULL, BAD, "layout", 0},
    {"layout tp 0", x_tp0, NULL, BAD, "layout", 0},
    {"layout pp 2^32-1", x_pp_max, NULL, BAD, "layout", 0},
    {"layout dp_replicate 2^32-1", x_dpr_max, NULL, BAD, "layout", 0},
    {"layout dp_shard 2^32-1", x_dps_max, NULL, BAD, "layout", 0},
    {"layout tp 2^32-1", x_tp_max, NULL, BAD, "layout", 0},
    {"layout: every degree 2^32-1", x_degrees_max, NULL, BAD, "layout", 0},
    {"layout dp_shard 2^31 (valid: the most ranks)", x_ranks_2_31, NULL, OK, NULL, 0},
    {"layout dp_shard 2^31+1", x_ranks_2_31_1, NULL, BAD, "layout", 0},
    {"layout pp 65536 x tp 65536 (2^32 ranks)", x_ranks_2_32, NULL, BAD, "layout", 0},
    {"layout n_layers 2^32-1", x_nlayers_max, NULL, BAD, "n_layers", 0},
    {"layout n_layers 2^31+1", x_nlayers_2_31_1, NULL, BAD, "n_layers", 0},
    {"layout pp 4, n_layers 2 (valid)", x_nlayers_pp, NULL, OK, NULL, 0},
    {"chunk_first + 1", x_chunk_first, NULL, BAD, "b.ids", 0},
    {"chunk_count - 1 (next tensor's range does not follow)", x_chunk_count_less, NULL, BAD, "chunk", 0},
    {"chunk_count + 1 on the last tensor with chunks", x_chunk_count_more, NULL, BAD, "e.h", 0},
    {"chunk_count 2^32-1", x_chunk_count_huge, NULL, BAD, "e.h", 0},
    {"a chunk for the tensor of volume 0", x_empty_with_chunk, NULL, BAD, "d.empty", 0},
    /* chunks */
    {"chunk names another tensor", x_chunk_other_tensor, NULL, BAD, "a.w", 0},
    {"chunk names another tensor of other ndim", x_chunk_other_ndim, NULL, BAD, "chunk", 0},
    {"chunk names tensor 99", x_chunk_tensor_past, NULL, BAD, "chunk", 0},
    {"chunk in unknown file 7", x_chunk_file_unknown, NULL, BAD, "b.ids", 0},
    {"chunk box outside the shape", x_chunk_outside, NULL, BAD, "a.w", 0},
    {"chunk offset 2^64-1 (offset + extent wraps)", x_chunk_off_wrap, NULL, BAD, "a.w", 0},
    {"chunk extent 2^64-1", x_chunk_ext_wrap, NULL, BAD, "a.w", 0},
    {"chunk of volume 0", x_chunk_ext0, NULL, BAD, "a.w", 0},
    {"chunk offset[2] of a 2-d tensor nonzero", x_chunk_past_ndim, NULL, BAD, "a.w", 0},
    {"chunk extent[7] of a 2-d tensor nonzero", x_chunk_past_ndim_ext, NULL, BAD, "a.w", 0},
    {"chunk extent[0] of a 0-d tensor nonzero", x_chunk_0d_ext, NULL, BAD, "c.scalar", 0},
    {"chunks overlap (volumes still add up)", x_chunk_overlap, NULL, BAD, "overlap", 0},
    {"chunks do not cover the tensor (shape[0] 65)", x_chunk_uncovered, NULL, BAD, "a.w", 0},
    {"chunk does not cover the tensor (shape[2] 41)", x_chunk_uncovered_cols, NULL, BAD, "e.h", 0},
    {"chunks not sorted by offset", x_chunk_unsorted, NULL, BAD, "a.w", 0},
    {"frame_count + 1", x_frame_count_plus, NULL, BAD, "a.w", 0},
    {"frame_count 0 (0-d)", x_frame_count_zero, NULL, BAD, "c.scalar", 0},
    {"frame_count 2^32-1", x_frame_count_huge, NULL, BAD, "e.h", 0},
    {"split_dim 2 of a 2-d tensor", x_split_dim2, NULL, BAD, "a.w", 0},
    {"split_dim 255", x_split_dim_255, NULL, BAD, "e.h", 0},
    {"split_dim 1 of a 0-d tensor", x_split_dim_0d, NULL, BAD, "c.scalar", 0},
    {"frame_rows 0", x_rows0, NULL, BAD, "a.w", 0},
    {"frame_rows 33 > extent 32", x_rows_past, NULL, BAD, "a.w", 0},
    {"frame_rows 2^64-1", x_rows_huge, NULL, BAD, "e.h", 0},
    {"frame_rows 2 of a 0-d tensor", x_rows_0d, NULL, BAD, "c.scalar", 0},
    {"frame_rows 16 (same count, other frame sizes)", x_rows_other, NULL, BAD, "a.w", 0},
    {"frame_first + 1", x_frame_first, NULL, BAD, "a.w", 0},
    {"frame_first 2^32-16", x_frame_first_huge, NULL, BAD, "a.w", 0},
    /* frames */
    {"raw_size + 4", x_raw_size, NULL, BAD, "a.w", 0},
    {"raw_size 4 of an i64 scalar", x_raw_size_0d, NULL, BAD, "c.scalar", 0},
    {"frame offset not 4096-aligned", x_frame_unaligned, NULL, BAD, "offset", 0},
    {"frame offset 0 (in the header)", x_frame_off0, NULL, BAD, "offset", 0},
    {"frame offset 2^62 (past the file)", x_frame_off_huge, NULL, BAD, "offset", 0},
    {"frame offset 2^64-4096", x_frame_off_max, NULL, BAD, "offset", 0},
    {"two frames at the same offset", x_frames_overlap, NULL, BAD, "offset", 0},
    {"gap of 4096 bytes before a frame", x_frame_gap, NULL, BAD, "offset", 0},
    {"data file size 4096 below its frames' end", x_file_short, NULL, BAD, "size", 0},
    {"data file size 4096 past its frames' end", x_file_long, NULL, BAD, "size", 0},
    {"stored_size 2^40 (past the file)", x_stored_past, NULL, BAD, "frame", 0},
    {"stored_size 0", x_stored0, NULL, BAD, "size", 0},
    {"stored_size raw + raw/128 + 4097 (one above the limit)", x_stored_limit, NULL, BAD, "stored size", 0},
    {"raw codec with stored_size != raw_size", x_raw_stored, NULL, BAD, "raw", 0},
    {"codec 3", x_codec3, NULL, BAD, "codec", 0},
    {"codec 255", x_codec255, NULL, BAD, "codec", 0},
    {"bytegroup codec on an i32 tensor", x_bytegroup_int, NULL, BAD, "b.ids", 0},
    {"bytegroup codec on an i64 tensor", x_bytegroup_i64, NULL, BAD, "c.scalar", 0},
    /* blobs */
    {"blob size + 1 (frames do not add up)", x_blob_size, NULL, BAD, "meta", 0},
    {"blob size - 1", x_blob_size_less, NULL, BAD, "rng", 0},
    {"blob frame with codec 2", x_blob_codec2, NULL, BAD, "rng", 0},
    {"blob frame with codec 3", x_blob_codec3, NULL, BAD, "meta", 0},
    {"blob rank -2", x_blob_rank_m2, NULL, BAD, "meta", 0},
    {"blob rank INT32_MIN", x_blob_rank_min, NULL, BAD, "meta", 0},
    {"blob frame raw_size 0", x_blob_raw0, NULL, BAD, "raw size", 0},
    {"blob frame raw_size 256 MiB + 1", x_blob_raw_big, NULL, BAD, "raw size", 0},
    {"blob in unknown file 9", x_blob_file, NULL, BAD, "rng", 0},
    {"blob frame_first + 1", x_blob_frame_first, NULL, BAD, "rng", 0},
    {"blob frame_count + 1", x_blob_frame_count, NULL, BAD, "rng", 0},
    {"blob frame_count 2^32-1", x_blob_frame_count_huge, NULL, BAD, "rng", 0},
    {"empty blob with a frame", x_blob_empty_frames, NULL, BAD, "blob", 0},
    {"blobs not sorted by name", x_blob_unsorted, NULL, BAD, "sorted", 0},
    {"blob (name, rank) repeated", x_blob_repeated, NULL, BAD, "rng", 0},
    {"blobs not sorted by rank", x_blob_rank_order, NULL, BAD, "rng", 0},
    /* files */
    {"data file size not a multiple of 4096", x_file_unaligned, NULL, BAD, "size", 0},
    {"data file size 0", x_file_zero, NULL, BAD, "size", 0},
    {"data file size 2^62 + 4096", x_file_huge, NULL, BAD, "size", 0},
    {"FILES not sorted by id", x_file_unsorted, NULL, BAD, "sorted", 0},
    {"FILES id repeated", x_file_repeated, NULL, BAD, "repeated", 0},
    {"FILES empty", x_files_none, NULL, BAD, "file", 0},
};

static int verbose; /* TSR_VERBOSE=1: print every case's outcome */

static void expect(const char *desc, const char *how, int rc, const tsr_error *e, int code,
                   const char *want) {
    if (verbose) printf("%-60.60s %-18s %-9s %s\n", desc, how, rc ? tsr_status_name(rc) : "accepted", rc ? e->msg : "");
    if (code == 0) {
        CHECK(rc == 0, "%s [%s]: refused: %s", desc, how, e->msg);
        return;
    }
    CHECK(rc == code, "%s [%s]: returned %d (%s), expected %s: %s", desc, how, rc,
          tsr_status_name(rc), tsr_status_name(code), rc ? e->msg : "");
    if (rc == 0) return;
    CHECK(e->code == rc, "%s [%s]: err.code %d, returned %d", desc, how, e->code, rc);
    CHECK(strstr(e->msg, "MANIFEST") != NULL, "%s [%s]: message does not name the MANIFEST: %s",
          desc, how, e->msg);
    if (want)
        CHECK(strstr(e->msg, want) != NULL, "%s [%s]: message does not say \"%s\": %s", desc, how,
              want, e->msg);
}

static void run_case(const hcase *c, const uint8_t *good, size_t good_n, const char *work) {
    xmf x;
    unpack(good, good_n, &x);
    if (c->x) c->x(&x);
    size_t n;
    uint8_t *b = pack(&x, &n);
    xfree(&x);
    if (!c->x && !c->b) { /* unpack() unpacks packed sections: the same as m written plain */
        tsr_manifest m;
        tsr_error pe = {0};
        uint8_t *plain = NULL;
        size_t pn = 0;
        CHECK(tsr_manifest_parse(good, good_n, "good", 0, &m, &pe) == 0 &&
                  tsr_manifest_encode(&m, TSR_MF_PLAIN, &plain, &pn, &pe) == 0,
              "%s: %s", c->desc, pe.msg);
        CHECK(plain && n == pn && memcmp(b, plain, n) == 0, "%s: pack(unpack(m)) differs from m in plain sections",
              c->desc);
        CHECK(good_n < pn, "%s: the written MANIFEST (%zu bytes) is not packed (plain: %zu)", c->desc, good_n, pn);
        if (plain) tsr_manifest_free(&m);
        free(plain);
    }
    if (c->b) {
        c->b(b, n);
        if (!c->nofix) fix_trailer(b, n);
    }
    /* in memory */
    tsr_manifest m;
    tsr_error e = {0};
    int rc = tsr_manifest_parse(b, n, "hostile/MANIFEST", 0, &m, &e);
    expect(c->desc, "tsr_manifest_parse", rc, &e, c->code, c->want);
    if (rc == 0) tsr_manifest_free(&m);
    /* as a checkpoint */
    spit(P("%s/MANIFEST", work), b, n);
    memset(&e, 0, sizeof e);
    tsr_ckpt *ck = tsr_ckpt_open(work, &e);
    expect(c->desc, "tsr_ckpt_open", ck ? 0 : e.code, &e, c->code, c->want);
    tsr_ckpt_close(ck);
    if (c->code == 0 && ck) {
        char why[1200];
        CHECK(deep_check(work, why, sizeof why) == 0, "%s: accepted but does not read back: %s", c->desc, why);
    }
    free(b);
}

/* ----------------------------------------------------------- truncation */

static void truncations(const uint8_t *good, size_t n, const char *work) {
    int bad_plain = 0, bad_fixed = 0, bad_open = 0;
    for (size_t len = 0; len < n; len++) {
        tsr_manifest m;
        tsr_error e = {0};
        uint8_t *b = dup_exact(good, len);
        int rc = tsr_manifest_parse(b, len, "trunc/MANIFEST", 0, &m, &e);
        if (rc != TSR_ECORRUPT || !strstr(e.msg, "MANIFEST")) {
            if (bad_plain++ < 5)
                CHECK(0, "MANIFEST truncated to %zu of %zu bytes: returned %d: %s", len, n, rc, e.msg);
            if (!rc) tsr_manifest_free(&m);
        }
        /* the same bytes as a checkpoint's MANIFEST */
        spit(P("%s/MANIFEST", work), b, len);
        memset(&e, 0, sizeof e);
        tsr_ckpt *ck = tsr_ckpt_open(work, &e);
        if (ck || e.code != TSR_ECORRUPT) {
            if (bad_open++ < 5)
                CHECK(0, "tsr_ckpt_open with a MANIFEST truncated to %zu bytes: %s", len, ck ? "opened" : e.msg);
        }
        tsr_ckpt_close(ck);
        /* with file_size and trailer made consistent: the sections must not fit */
        if (len >= 136) {
            tsr_st64(b + 16, len);
            fix_trailer(b, len);
            memset(&e, 0, sizeof e);
            rc = tsr_manifest_parse(b, len, "trunc/MANIFEST", 0, &m, &e);
            if (rc != TSR_ECORRUPT) {
                if (bad_fixed++ < 5)
                    CHECK(0, "MANIFEST truncated to %zu bytes, file_size and trailer fixed: returned %d: %s",
                          len, rc, e.msg);
                if (!rc) tsr_manifest_free(&m);
            }
        }
        free(b);
    }
    CHECK(bad_plain + bad_fixed + bad_open == 0, "truncations: %d plain, %d fixed, %d open not refused",
          bad_plain, bad_fixed, bad_open);
}

/* A MANIFEST over 4 GiB (a sparse file) is refused without being read. */
static void huge_manifest(const char *work) {
    const char *path = P("%s/MANIFEST", work);
    spit(path, "TSRMNFST", 8);
    if (truncate(path, (off_t)(4ull << 30) + 8) != 0) {
        fprintf(stderr, "note: no sparse 4 GiB file here (%s); huge MANIFEST case skipped\n", strerror(errno));
        return;
    }
    tsr_error e = {0};
    tsr_ckpt *ck = tsr_ckpt_open(work, &e);
    CHECK(!ck && e.code == TSR_ECORRUPT && strstr(e.msg, "MANIFEST"),
          "MANIFEST of 4 GiB + 8 bytes: %s", ck ? "opened" : e.msg);
    tsr_ckpt_close(ck);
    REQUIRE(truncate(path, 0) == 0, "truncate");
}

/* ---------------------------------------------------------- data files */

typedef struct problems {
    int n, named;
    const char *file;
    char first[1200];
} problems;

static void on_problem(void *user, const char *msg) {
    problems *p = user;
    if (!p->n++) snprintf(p->first, sizeof p->first, "%s", msg);
    if (strstr(msg, p->file)) p->named++;
}

typedef enum { D_TRUNC_FRAME, D_TRUNC_HEADER, D_MISSING, D_FOREIGN, D_FOREIGN0, D_FLIP, D_HDR_PAD,
               D_GAP_BYTE, D_EMPTY_FILE } dmode;
typedef struct dcase {
    const char *desc;
    dmode mode;
    int file;        /* the damaged data file */
    int tensor;      /* a tensor with frames in it (-1: none) */
    int blob;        /* a blob with frames in it (-1: none) */
} dcase;

static const dcase dcases[] = {
    {"data-00001.tsd truncated by 4096 bytes", D_TRUNC_FRAME, 1, 0, 2},
    {"data-00001.tsd truncated inside its header", D_TRUNC_HEADER, 1, 0, 3},
    {"data-00001.tsd empty", D_EMPTY_FILE, 1, 0, 2},
    {"data-00001.tsd missing", D_MISSING, 1, 0, 2},
    {"data-00001.tsd from another save (save_id differs)", D_FOREIGN, 1, 0, 3},
    {"data-00000.tsd from another save (save_id differs)", D_FOREIGN0, 0, 2, 1},
    {"data-00000.tsd: a byte of the first frame flipped", D_FLIP, 0, 0, -1},
    {"data-00000.tsd: nonzero header padding byte", D_HDR_PAD, 0, 4, 1},
    {"data-00000.tsd: nonzero byte after the first frame", D_GAP_BYTE, 0, 0, -1},
};

static void damage(const dcase *c, const char *dir, const char *other) {
    const char *path = P("%s/data-%05d.tsd", dir, c->file);
    size_t n;
    uint8_t *b = slurp(path, &n);
    switch (c->mode) {
    case D_TRUNC_FRAME: REQUIRE(truncate(path, (off_t)n - 4096) == 0, "truncate"); break;
    case D_TRUNC_HEADER: REQUIRE(truncate(path, 100) == 0, "truncate"); break;
    case D_EMPTY_FILE: REQUIRE(truncate(path, 0) == 0, "truncate"); break;
    case D_MISSING: REQUIRE(unlink(path) == 0, "unlink"); break;
    case D_FOREIGN:
    case D_FOREIGN0: {
        const char *src = P("%s/data-%05d.tsd", other, c->file);
        size_t m;
        uint8_t *o = slurp(src, &m);
        REQUIRE(m == n && memcmp(o + 16, b + 16, 16) != 0, "other checkpoint: same layout, another save id");
        free(o);
        copy_file(src, path);
        break;
    }
    case D_FLIP: b[4096 + 10] ^= 0x40, spit(path, b, n); break;
    case D_HDR_PAD: b[100] = 1, spit(path, b, n); break;
    case D_GAP_BYTE: b[8191] = 0x5A, spit(path, b, n); break;
    }
    free(b);
}

static void data_file_cases(const char *good, const char *other, const char *base) {
    for (size_t i = 0; i < sizeof dcases / sizeof dcases[0]; i++) {
        const dcase *c = &dcases[i];
        const char *dir = P("%s/damaged-%zu", base, i);
        copy_ckpt(good, dir);
        damage(c, dir, other);
        char fname[32];
        snprintf(fname, sizeof fname, "data-%05d.tsd", c->file);
        tsr_error e = {0};
        tsr_ckpt *ck = tsr_ckpt_open(dir, &e);
        CHECK(ck, "%s: open (reads only the MANIFEST) failed: %s", c->desc, e.msg);
        if (!ck) continue;
        problems p = {.file = fname};
        long np = tsr_ckpt_verify(ck, on_problem, &p, 2, &e);
        CHECK(np > 0, "%s: verify found %ld problems%s%s", c->desc, np, np < 0 ? ": " : "", np < 0 ? e.msg : "");
        CHECK(np < 0 || np == p.n, "%s: verify returned %ld, reported %d", c->desc, np, p.n);
        CHECK(p.named > 0, "%s: no verify message names %s (first: %s)", c->desc, fname, p.first);
        if (c->tensor >= 0) {
            const tspec *t = &TS[c->tensor];
            tsr_box box = whole_box(t);
            size_t nb = tsr_box_volume(&box) * tsr_dtype_size(t->dtype);
            void *buf = malloc(nb ? nb : 1);
            REQUIRE(buf, "out of memory");
            memset(&e, 0, sizeof e);
            int rc = tsr_ckpt_read(ck, (size_t)c->tensor, &box, buf, &e);
            CHECK(rc == TSR_ECORRUPT || rc == TSR_ENOTFOUND || rc == TSR_EIO,
                  "%s: read of %s returned %d: %s", c->desc, t->name, rc, e.msg);
            CHECK(rc == 0 || (e.code == rc && strstr(e.msg, fname)), "%s: read of %s: message does not name %s: %s",
                  c->desc, t->name, fname, e.msg);
            free(buf);
        }
        if (c->blob >= 0) {
            uint8_t *buf = malloc(BS[c->blob].size + 1);
            REQUIRE(buf, "out of memory");
            memset(&e, 0, sizeof e);
            int rc = tsr_ckpt_read_blob(ck, (size_t)c->blob, buf, &e);
            CHECK(rc == TSR_ECORRUPT || rc == TSR_ENOTFOUND || rc == TSR_EIO,
                  "%s: read of blob %s returned %d: %s", c->desc, BS[c->blob].name, rc, e.msg);
            CHECK(rc == 0 || strstr(e.msg, fname), "%s: read of blob %s: message does not name %s: %s", c->desc,
                  BS[c->blob].name, fname, e.msg);
            free(buf);
        }
        tsr_ckpt_close(ck);
    }
}

/* ------------------------------------------- a valid zstd frame, larger */

/* The file of frame fi (from its chunk or blob). */
static uint32_t frame_file(xmf *x, uint32_t fi) {
    xsec *c = S(x, CHK), *b = S(x, BLB);
    for (uint32_t i = 0; i < c->count; i++) {
        const uint8_t *p = c->d + (size_t)i * c->rec;
        if (fi >= tsr_ld32(p + 8) && fi - tsr_ld32(p + 8) < tsr_ld32(p + 12)) return tsr_ld32(p + 4);
    }
    for (uint32_t i = 0; i < b->count; i++) {
        const uint8_t *p = b->d + (size_t)i * b->rec;
        if (fi >= tsr_ld32(p + 16) && fi - tsr_ld32(p + 16) < tsr_ld32(p + 20)) return tsr_ld32(p + 12);
    }
    REQUIRE(0, "frame %u has no owner", fi);
    return 0;
}

/* FORMAT.md section 6 allows any zstd frame (RFC 8878) that declares its content
 * size and has nothing after it; no rule bounds its size. Incompressible data
 * coded by zstd is slightly larger than the raw bytes (3 bytes per block plus the
 * frame header): a 4 MiB frame from stock zstd is 4 MiB + ~105 bytes. Here the
 * 4096 raw bytes of a frame of b.ids become one zstd frame of 16 raw blocks (4151
 * bytes), the data file is re-packed, and the checkpoint must read back. */
static void zstd_overhead_case(const char *good, const char *base) {
    const char *desc = "zstd frame of 16 raw blocks (stored_size = raw_size + 55)";
    size_t mn, dn;
    uint8_t *mf = slurp(P("%s/MANIFEST", good), &mn);
    uint8_t *data = slurp(P("%s/data-00000.tsd", good), &dn);
    xmf x;
    unpack(mf, mn, &x);
    uint8_t *f = F(&x, "b.ids", 0);
    uint32_t fi = (uint32_t)((f - S(&x, FRM)->d) / S(&x, FRM)->rec);
    uint64_t off = tsr_ld64(f), raw = tsr_ld64(f + 16);
    REQUIRE(f[40] == TSR_CODEC_RAW && raw == 4096 && frame_file(&x, fi) == 0, "b.ids frame 0: raw, 4096 bytes, file 0");
    /* the zstd frame: magic, FHD (single segment, 2-byte content size), FCS - 256, blocks */
    uint8_t z[4 + 1 + 2 + 16 * (3 + 256)];
    size_t zn = 0;
    tsr_st32(z, 0xFD2FB528u), zn = 4;
    z[zn++] = 0x60;
    tsr_st16(z + zn, 4096 - 256), zn += 2;
    for (int k = 0; k < 16; k++) {
        uint32_t bh = 256u << 3 | (k == 15); /* raw block of 256 bytes, last flag */
        z[zn++] = (uint8_t)bh, z[zn++] = (uint8_t)(bh >> 8), z[zn++] = (uint8_t)(bh >> 16);
        memcpy(z + zn, data + off + 256 * (size_t)k, 256), zn += 256;
    }
    REQUIRE(zn == sizeof z, "zstd frame size");
    {   /* it is a valid zstd frame of the raw bytes, by libzstd itself */
        uint8_t back[4096];
        size_t r = ZSTD_decompress(back, sizeof back, z, zn);
        REQUIRE(!ZSTD_isError(r) && r == 4096 && memcmp(back, data + off, 4096) == 0 &&
                    ZSTD_getFrameContentSize(z, zn) == 4096 && ZSTD_findFrameCompressedSize(z, zn) == zn,
                "hand-made zstd frame is not valid");
    }
    /* re-pack data-00000: the frame now takes two pages */
    uint8_t *nd = calloc(dn + 4096, 1);
    REQUIRE(nd, "out of memory");
    memcpy(nd, data, off);
    memcpy(nd + off, z, zn);
    memcpy(nd + off + 8192, data + off + 4096, dn - off - 4096);
    xsec *fr = S(&x, FRM);
    for (uint32_t i = 0; i < fr->count; i++) {
        uint8_t *p = fr->d + (size_t)i * fr->rec;
        if (frame_file(&x, i) == 0 && tsr_ld64(p) > off) ADD64(p, 4096);
    }
    f[40] = TSR_CODEC_ZSTD;
    tsr_st64(f + 8, zn);
    tsr_st64(f + 32, tsr_hash(z, zn));
    for (uint32_t i = 0; i < S(&x, FIL)->count; i++)
        if (tsr_ld32(R(&x, FIL, i)) == 0) ADD64(R(&x, FIL, i) + 8, 4096);
    size_t n;
    uint8_t *b = pack(&x, &n);
    xfree(&x);
    const char *dir = P("%s/zstd-overhead", base);
    copy_ckpt(good, dir);
    spit(P("%s/MANIFEST", dir), b, n);
    spit(P("%s/data-00000.tsd", dir), nd, dn + 4096);
    tsr_manifest m;
    tsr_error e = {0};
    int rc = tsr_manifest_parse(b, n, "zstd-overhead/MANIFEST", 0, &m, &e);
    expect(desc, "tsr_manifest_parse", rc, &e, 0, NULL);
    if (!rc) tsr_manifest_free(&m);
    char why[1200];
    CHECK(deep_check(dir, why, sizeof why) == 0, "%s: %s", desc, why);
    free(b), free(nd), free(mf), free(data);
}

/* ----------------------------------------------------------------- main */

int main(void) {
    const char *tmp = getenv("TSR_TMP"), *v = getenv("TSR_VERBOSE");
    verbose = v && *v && strcmp(v, "0") != 0;
    char made[64] = "", base[4096];
    if (tmp && *tmp) {
        snprintf(base, sizeof base, "%s", P("%s/hostile", tmp));
        REQUIRE(mkdir(base, 0755) == 0 || errno == EEXIST, "mkdir %s: %s", base, strerror(errno));
    } else {
        snprintf(made, sizeof made, "/tmp/tsr-hostile.XXXXXX");
        REQUIRE(mkdtemp(made), "mkdtemp: %s", strerror(errno));
        snprintf(base, sizeof base, "%s", made);
    }
    char good[4096], other[4096], work[4096];
    snprintf(good, sizeof good, "%s", P("%s/good/step-00000007", base));
    snprintf(other, sizeof other, "%s", P("%s/other/step-00000007", base));
    snprintf(work, sizeof work, "%s", P("%s/work", base));
    static const uint8_t sid_a[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    static const uint8_t sid_b[16] = {0xA0, 0xA1, 0xA2, 0xA3, 0xA4, 0xA5, 0xA6, 0xA7,
                                      0xA8, 0xA9, 0xAA, 0xAB, 0xAC, 0xAD, 0xAE, 0xAF};
    write_ckpt(good, sid_a);
    write_ckpt(other, sid_b);
    char why[1200];
    REQUIRE(deep_check(good, why, sizeof why) == 0, "the unmodified checkpoint: %s", why);
    copy_ckpt(good, work);

    size_t n;
    uint8_t *mf = slurp(P("%s/MANIFEST", good), &n);
    {   /* the checkpoint has the shape the cases assume */
        xmf x;
        unpack(mf, n, &x);
        REQUIRE(S(&x, TEN)->count == NT && S(&x, BLB)->count == NB && S(&x, FIL)->count == 2, "layout");
        REQUIRE(tsr_ld32(T(&x, "a.w") + 32) == 2 && tsr_ld32(C(&x, "a.w", 0) + 12) >= 2 &&
                    tsr_ld32(T(&x, "d.empty") + 32) == 0 && tsr_ld32(C(&x, "e.h", 0) + 12) == 4 &&
                    C(&x, "e.h", 0)[16] == 1 && tsr_ld32(C(&x, "b.ids", 0) + 12) == 3 &&
                    tsr_ld32(B(&x, "rng", 0) + 20) == 3 && tsr_ld32(C(&x, "a.w", 1) + 4) == 1,
                "unexpected chunk/frame layout");
        xfree(&x);
    }

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], mf, n, work);
    truncations(mf, n, work);
    huge_manifest(work);
    data_file_cases(good, other, base);
    zstd_overhead_case(good, base);
    free(mf);

    if (made[0]) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", made);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", made);
    }
    size_t valid = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) valid += cases[i].code == OK;
    printf("%zu MANIFEST cases (%zu hostile, refused; %zu valid variants, read back), %zu truncations, %zu data file "
           "cases\n", sizeof cases / sizeof cases[0], sizeof cases / sizeof cases[0] - valid, valid, n,
           sizeof dcases / sizeof dcases[0]);
    return check_done();
}
