/* test_manifest.c: the MANIFEST's packed sections (FORMAT.md 4.3), valid and hostile.
 *
 * One tensor of 200003 rows stored a row a chunk (200003 chunks and frames:
 * three blocks of 65536 records and a short one) in two files, with checksums
 * and stored sizes that differ from frame to frame: encoded packed and plain,
 * both parse back to the same records, the packed sections decode to the plain
 * ones' bytes by FORMAT.md's layout read literally, the packed file is far
 * smaller, and encoding what was parsed gives the same bytes again.
 *
 * MANIFESTs made here by hand (the plain encoding taken apart, sections packed
 * by FORMAT.md's letter): the same records with every record wider than v1.0's
 * (4.2: a later minor version appends fields, readers ignore them; the bytes
 * past the v1.0 fields are a pattern), packed and plain; and 78 chunk records
 * of 1 MiB each, packed (the records of one block, not 65536 of 1 MiB, are
 * what a reader may need): both parse back to the same records. Hostile: a
 * packed CHUNKS or FRAMES that declares 2 GiB of records (one zstd frame of RLE
 * blocks: 64 KiB) that the other sections do not justify, by its count or by
 * a tensor's chunk count past its volume: each is refused with a message that
 * names the MANIFEST and the reason, in well under a second and without the
 * peak memory growing by 64 MiB (getrusage, each in a child of its own).
 *
 *   test_manifest --widen DIR            DIR/MANIFEST rewritten: wider records
 *   test_manifest --hostile DIR [COUNT]  DIR/MANIFEST rewritten: packed CHUNKS of
 *                                        COUNT zero records (default: 2 GiB of them)
 * so that tests/test_format_reader.sh gives both to tessera and format_reader.py. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <zstd.h>

#include "check.h"
#include "common.h"
#include "manifest.h"

enum { ROWS = 200003, COLS = 24 };

static tsr_error e;

/* m: the tensor "w" of `rows` rows of COLS bytes, a row a chunk and a frame,
 * the frames alternating between two files. */
static void build(tsr_manifest *m, uint32_t rows) {
    tsr_manifest_init(m);
    m->step = 12;
    memcpy(m->save_id, "tessera-test-pak", 16);
    tsr_mf_tensor t = {.name = "w", .group = "model", .dtype = TSR_U8, .ndim = 2, .shape = {rows, COLS},
                       .placement = {-1, 1, TSR_PP_ALL, -1}};
    REQUIRE(tsr_manifest_add_tensor(m, &t) == 0, "tensor");
    uint64_t pos[2] = {4096, 4096};
    for (uint32_t i = 0; i < rows; i++) {
        uint32_t file = i % 2;
        uint64_t h = tsr_splitmix64(i), stored = h & 1 ? 10 + h % 14 : COLS;
        tsr_mf_chunk c = {.tensor = 0, .file_id = file, .frame_first = i, .frame_count = 1, .split_dim = 0,
                          .frame_rows = 1, .box = {2, {i, 0}, {1, COLS}}};
        tsr_mf_frame f = {pos[file], stored, COLS, h, h & 1 ? tsr_splitmix64(h) : h,
                          h & 1 ? TSR_CODEC_ZSTD : TSR_CODEC_RAW, file};
        pos[file] += 4096;
        REQUIRE(tsr_manifest_add_chunk(m, &c) == 0 && tsr_manifest_add_frame(m, &f) == 0, "chunk %u", i);
    }
    for (uint32_t f = 0; f < 2; f++) {
        tsr_mf_file file = {f, pos[f]};
        REQUIRE(tsr_manifest_add_file(m, &file) == 0, "file");
    }
    REQUIRE(tsr_manifest_sort(m, &e) == 0 && tsr_manifest_validate(m, "built", 0, &e) == 0, "%s", e.msg);
}

/* Every chunk and frame of b equal to a's. */
static void same_records(const tsr_manifest *a, const tsr_manifest *b, const char *form) {
    CHECK(a->n_chunks == b->n_chunks && a->n_frames == b->n_frames && a->n_files == b->n_files, "%s: counts",
          form);
    size_t bad = 0;
    for (size_t i = 0; i < a->n_chunks && i < b->n_chunks; i++) {
        const tsr_mf_chunk *x = &a->chunks[i], *y = &b->chunks[i];
        bad += x->file_id != y->file_id || x->frame_first != y->frame_first || x->frame_count != y->frame_count ||
               x->box.offset[0] != y->box.offset[0] || x->box.extent[1] != y->box.extent[1];
    }
    for (size_t i = 0; i < a->n_frames && i < b->n_frames; i++) {
        const tsr_mf_frame *x = &a->frames[i], *y = &b->frames[i];
        bad += x->offset != y->offset || x->stored_size != y->stored_size || x->raw_hash != y->raw_hash ||
               x->stored_hash != y->stored_hash || x->codec != y->codec;
    }
    CHECK(bad == 0, "%s: %zu records differ", form, bad);
}

/* The section of type `type` in a MANIFEST's bytes: *at, *size, *rec, *count. */
static int find_section(const uint8_t *b, uint32_t type, const uint8_t **at, size_t *size, uint32_t *rec,
                        uint32_t *count) {
    for (uint32_t s = 0; s < tsr_ld32(b + 48); s++) {
        const uint8_t *t = b + 128 + 32 * s;
        if (tsr_ld32(t) != type) continue;
        *at = b + tsr_ld64(t + 8), *size = tsr_ld64(t + 16), *rec = tsr_ld32(t + 24), *count = tsr_ld32(t + 28);
        return 1;
    }
    return 0;
}

/* FORMAT.md 4.3 read literally: byte j of record b + i of the block of n records
 * starting at b is at b * rec + j * n + i. The packed section against the plain
 * one, byte for byte. */
static void by_the_letter(const uint8_t *packed, const uint8_t *plain, uint32_t type) {
    const uint8_t *pa, *la;
    size_t ps, ls;
    uint32_t rec, count, lrec, lcount;
    REQUIRE(find_section(packed, TSR_SEC_PACKED + type, &pa, &ps, &rec, &count) &&
                find_section(plain, type, &la, &ls, &lrec, &lcount) && rec == lrec && count == lcount,
            "section %u in both forms", type);
    size_t n = (size_t)rec * count, diff = 0;
    uint8_t *content = malloc(n + 1);
    REQUIRE(content && ZSTD_decompress(content, n, pa, ps) == n, "section %u decodes", type);
    for (size_t i = 0; i < count; i++) {
        size_t b = i / 65536 * 65536, bn = count - b < 65536 ? count - b : 65536;
        for (size_t j = 0; j < rec; j++) diff += content[b * rec + j * bn + (i - b)] != la[i * rec + j];
    }
    CHECK(diff == 0, "section %u: %zu bytes differ from FORMAT.md's layout", type, diff);
    free(content);
}

/* ---------------------------------------------------- MANIFESTs made by hand */

/* A MANIFEST taken apart: its header and its six sections, s[t - 1] of type t
 * (plain) or 16 + t (packed): record size, count, stored bytes. */
typedef struct hsec {
    uint32_t type, rec, count;
    uint8_t *d;
    size_t n;
} hsec;
typedef struct hmf {
    uint8_t hdr[128];
    hsec s[6];
} hmf;

/* The plain encoding of m, taken apart. */
static void take_apart(const tsr_manifest *m, hmf *x) {
    uint8_t *b = NULL;
    size_t n = 0;
    REQUIRE(tsr_manifest_encode(m, TSR_MF_PLAIN, &b, &n, &e) == 0, "%s", e.msg);
    REQUIRE(tsr_ld32(b + 12) == 128 && tsr_ld32(b + 48) == 6, "a plain MANIFEST of 6 sections");
    memcpy(x->hdr, b, 128);
    for (int i = 0; i < 6; i++) {
        const uint8_t *t = b + 128 + 32 * i;
        hsec *s = &x->s[i];
        *s = (hsec){tsr_ld32(t), tsr_ld32(t + 24), tsr_ld32(t + 28), malloc(tsr_ld64(t + 16) + 1), tsr_ld64(t + 16)};
        REQUIRE(s->type == (uint32_t)i + 1 && s->d, "section %d", i);
        memcpy(s->d, b + tsr_ld64(t + 8), s->n);
    }
    free(b);
}

/* The MANIFEST's bytes (v1.1): header, section table, the sections 8-aligned,
 * the trailer. Frees x's sections. */
static uint8_t *put_together(hmf *x, size_t *len) {
    size_t off[6], end = 128 + 32 * 6;
    for (int i = 0; i < 6; i++) off[i] = end, end = tsr_align_up(end + x->s[i].n, 8);
    uint8_t *b = calloc(end + 8, 1);
    REQUIRE(b, "out of memory");
    memcpy(b, x->hdr, 128);
    tsr_st16(b + 10, 1);
    tsr_st64(b + 16, end + 8);
    for (int i = 0; i < 6; i++) {
        uint8_t *t = b + 128 + 32 * i;
        hsec *s = &x->s[i];
        tsr_st32(t, s->type), tsr_st32(t + 4, 1), tsr_st64(t + 8, off[i]), tsr_st64(t + 16, s->n);
        tsr_st32(t + 24, s->rec), tsr_st32(t + 28, s->count);
        memcpy(b + off[i], s->d, s->n);
        free(s->d);
    }
    tsr_st64(b + end, tsr_hash(b, end));
    *len = end + 8;
    return b;
}

/* Section s's records widened to `rec` bytes, as by a later minor version
 * (FORMAT.md 4.2): the v1.0 fields as they were, then bytes a reader ignores. */
static void widen(hsec *s, uint32_t rec) {
    uint8_t *d = malloc((size_t)rec * s->count + 1);
    REQUIRE(d, "out of memory");
    for (size_t i = 0; i < s->count; i++) {
        uint8_t *r = d + i * rec;
        memcpy(r, s->d + i * s->rec, s->rec);
        for (size_t j = s->rec; j < rec; j++) r[j] = (uint8_t)(i * 131 + j * 7 + 1);
    }
    free(s->d);
    s->d = d, s->n = (size_t)rec * s->count, s->rec = rec;
}

/* Section s packed by FORMAT.md 4.3 read literally: in the block of n records
 * that starts at record b, byte j of record b + i at b * rec + j * n + i; the
 * whole in one zstd frame that declares its size. */
static void pack(hsec *s) {
    size_t rec = s->rec, count = s->count, all = rec * count, bound = ZSTD_compressBound(all);
    uint8_t *shuf = malloc(all + 1), *z = malloc(bound + 1);
    REQUIRE(shuf && z, "out of memory");
    for (size_t b = 0; b < count; b += 65536) {
        size_t n = count - b < 65536 ? count - b : 65536;
        for (size_t j0 = 0; j0 < rec; j0 += 64) /* 64 planes at a time: both sides stay in cache */
            for (size_t i = 0; i < n; i++)
                for (size_t j = j0; j < rec && j < j0 + 64; j++) shuf[b * rec + j * n + i] = s->d[(b + i) * rec + j];
    }
    size_t zn = ZSTD_compress(z, bound, shuf, all, 1);
    REQUIRE(!ZSTD_isError(zn), "zstd: %s", ZSTD_getErrorName(zn));
    free(shuf), free(s->d);
    s->d = z, s->n = zn, s->type += TSR_SEC_PACKED;
}

/* Section s replaced by a packed one of `count` records of zeros: one zstd
 * frame (RFC 8878) of RLE blocks, 4 bytes for 128 KiB of records, which
 * declares their size: 2 GiB of records in 64 KiB. */
static void zeros(hsec *s, uint32_t count) {
    uint64_t left = (uint64_t)s->rec * count;
    uint8_t *z = malloc(14 + 4 * (left / 131072 + 1)), *p = z;
    REQUIRE(z, "out of memory");
    tsr_st32(p, 0xFD2FB528), p += 4; /* the magic */
    *p++ = 0xC0;                     /* an 8-byte content size, a window descriptor, no checksum */
    *p++ = (17 - 10) << 3;           /* a window of 128 KiB */
    tsr_st64(p, left), p += 8;
    while (left) {
        uint32_t n = left < 131072 ? (uint32_t)left : 131072;
        left -= n;
        uint32_t h = (left == 0) | 1u << 1 | n << 3; /* last?, RLE, its size; then the byte repeated: 0 */
        p[0] = (uint8_t)h, p[1] = (uint8_t)(h >> 8), p[2] = (uint8_t)(h >> 16), p[3] = 0;
        p += 4;
    }
    free(s->d);
    s->d = z, s->n = (size_t)(p - z), s->count = count, s->type = s->type % TSR_SEC_PACKED + TSR_SEC_PACKED;
}

/* Every section wider than v1.0's (CHUNKS of chunk_rec bytes); FILES, CHUNKS,
 * FRAMES and BLOBS packed, STRINGS and TENSORS plain. */
static void widen_all(hmf *x, uint32_t chunk_rec) {
    widen(&x->s[TSR_SEC_FILES - 1], TSR_REC_FILE + 8);
    widen(&x->s[TSR_SEC_TENSORS - 1], TSR_REC_TENSOR_V14 + 24); /* past the fields of v1.4 */
    widen(&x->s[TSR_SEC_CHUNKS - 1], chunk_rec);
    widen(&x->s[TSR_SEC_FRAMES - 1], TSR_REC_FRAME + 17);
    widen(&x->s[TSR_SEC_BLOBS - 1], TSR_REC_BLOB + 8);
    for (int t = TSR_SEC_FILES; t <= TSR_SEC_BLOBS; t++)
        if (t != TSR_SEC_TENSORS) pack(&x->s[t - 1]);
}

/* m's records in a MANIFEST with wider records (widen_all): they parse back. */
static void wide(const tsr_manifest *m, uint32_t chunk_rec, const char *what) {
    hmf x;
    take_apart(m, &x);
    widen_all(&x, chunk_rec);
    size_t n = 0;
    uint8_t *b = put_together(&x, &n);
    tsr_manifest back;
    if (tsr_manifest_parse(b, n, what, 0, &back, &e) == 0) {
        same_records(m, &back, what);
        CHECK(back.n_tensors == 1 && !strcmp(back.tensors[0].name, "w") && back.tensors[0].shape[0] == m->n_chunks,
              "%s: the tensor", what);
        tsr_manifest_free(&back);
    } else {
        CHECK(0, "%s: %s", what, e.msg);
    }
    free(b);
}

/* The hostile MANIFEST b (n bytes) is refused with a message that names it and
 * `reason`, in under a second and without the peak memory growing by 64 MiB:
 * in a child of its own, so that no case's peak hides another's. */
static void refused(const char *what, uint8_t *b, size_t n, const char *reason) {
    pid_t pid = fork();
    REQUIRE(pid >= 0, "fork");
    if (pid == 0) {
        struct rusage r0, r1;
        struct timespec t0, t1;
        tsr_manifest m;
        getrusage(RUSAGE_SELF, &r0);
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int rc = tsr_manifest_parse(b, n, "hostile/MANIFEST", 0, &m, &e);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        getrusage(RUSAGE_SELF, &r1);
        double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
        long grew = (r1.ru_maxrss - r0.ru_maxrss) / 1024; /* MiB */
        check_failures = 0;
        CHECK(rc == TSR_ECORRUPT && strstr(e.msg, "hostile/MANIFEST: ") && strstr(e.msg, reason),
              "%s: refused (%d) with \"%s\", expected \"%s\"", what, rc, rc ? e.msg : "", reason);
        CHECK(s < 1 && grew < 64, "%s: %.2f s and %ld MiB more at the peak to refuse %zu bytes", what, s, grew, n);
        _exit(check_failures ? 1 : 0);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: status %d", what,
          status);
    free(b);
}

/* 2 GiB of chunk or frame records (13421772 of 160 bytes, 44739242 of 48)
 * declared by a packed section of 64 KiB. */
enum { HOSTILE_CHUNKS = 13421772, HOSTILE_FRAMES = 44739242 };

static void hostile(void) {
    tsr_manifest m;
    build(&m, 8);
    hmf x;
    size_t n = 0;
    take_apart(&m, &x);
    zeros(&x.s[TSR_SEC_CHUNKS - 1], HOSTILE_CHUNKS);
    uint8_t *b = put_together(&x, &n);
    CHECK(n < 80 << 10, "the hostile MANIFEST: %zu bytes", n);
    refused("packed CHUNKS of 2 GiB, its tensor 8 chunks", b, n,
            "CHUNKS declares 13421772 records, more than its tensors' chunk counts add up to (8)");

    take_apart(&m, &x); /* the tensor's chunk count agrees, but its 192 elements hold 192 chunks at most */
    tsr_st32(x.s[TSR_SEC_TENSORS - 1].d + 32, HOSTILE_CHUNKS);
    zeros(&x.s[TSR_SEC_CHUNKS - 1], HOSTILE_CHUNKS);
    b = put_together(&x, &n);
    refused("packed CHUNKS of 2 GiB, its tensor as many chunks of 192 elements", b, n,
            "tensor w: 13421772 chunks for its 192 elements");

    take_apart(&m, &x);
    zeros(&x.s[TSR_SEC_FRAMES - 1], HOSTILE_FRAMES);
    b = put_together(&x, &n);
    refused("packed FRAMES of 2 GiB, its chunks 8 frames", b, n,
            "FRAMES declares 44739242 records, more than its chunks and blobs have frames (8)");
    tsr_manifest_free(&m);
}

/* --widen DIR, --hostile DIR [COUNT]: DIR/MANIFEST rewritten (see the top). */
static int rewrite(const char *mode, const char *dir, const char *count) {
    char path[4096];
    snprintf(path, sizeof path, "%s/MANIFEST", dir);
    FILE *f = fopen(path, "rb");
    REQUIRE(f && fseek(f, 0, SEEK_END) == 0, "%s: cannot read", path);
    long len = ftell(f);
    uint8_t *b = malloc((size_t)len + 1);
    REQUIRE(len > 0 && b && fseek(f, 0, SEEK_SET) == 0 && fread(b, 1, (size_t)len, f) == (size_t)len,
            "%s: cannot read", path);
    fclose(f);
    tsr_manifest m;
    REQUIRE(tsr_manifest_parse(b, (size_t)len, path, 0, &m, &e) == 0, "%s", e.msg);
    free(b);
    hmf x;
    take_apart(&m, &x);
    if (!strcmp(mode, "--widen")) { /* chunk records of 1 MiB, as long as there are few */
        REQUIRE(m.n_chunks <= 64, "%s: %zu chunks: too many for records of 1 MiB", path, m.n_chunks);
        widen_all(&x, 1 << 20);
    } else {
        zeros(&x.s[TSR_SEC_CHUNKS - 1], count ? (uint32_t)strtoul(count, NULL, 0) : HOSTILE_CHUNKS);
    }
    size_t n = 0;
    b = put_together(&x, &n);
    f = fopen(path, "wb");
    REQUIRE(f && fwrite(b, 1, n, f) == n && fclose(f) == 0, "%s: cannot write", path);
    free(b);
    tsr_manifest_free(&m);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 3 && (!strcmp(argv[1], "--widen") || !strcmp(argv[1], "--hostile")))
        return rewrite(argv[1], argv[2], argc > 3 ? argv[3] : NULL);
    hostile();
    tsr_manifest m, back;
    build(&m, ROWS);
    uint8_t *packed = NULL, *plain = NULL, *again = NULL;
    size_t pn = 0, ln = 0, an = 0;
    CHECK_OK(tsr_manifest_encode(&m, 0, &packed, &pn, &e));
    CHECK_OK(tsr_manifest_encode(&m, TSR_MF_PLAIN, &plain, &ln, &e));
    CHECK(packed && plain && pn * 4 < ln, "packed %zu bytes, plain %zu", pn, ln);
    CHECK(packed && tsr_ld16(packed + 10) == TSR_FORMAT_MINOR &&
              tsr_ld32(packed + 128 + 32 * 3) == TSR_SEC_PACKED + TSR_SEC_CHUNKS &&
              tsr_ld32(packed + 128 + 32 * 4) == TSR_SEC_PACKED + TSR_SEC_FRAMES,
          "version 1.%d, CHUNKS and FRAMES packed", TSR_FORMAT_MINOR);
    if (packed && plain) {
        by_the_letter(packed, plain, TSR_SEC_CHUNKS);
        by_the_letter(packed, plain, TSR_SEC_FRAMES);
    }
    if (packed && tsr_manifest_parse(packed, pn, "packed", 0, &back, &e) == 0) {
        same_records(&m, &back, "packed");
        CHECK_OK(tsr_manifest_encode(&back, 0, &again, &an, &e));
        CHECK(again && an == pn && memcmp(again, packed, pn) == 0, "packed: encoding what was parsed differs");
        tsr_manifest_free(&back);
    } else {
        CHECK(0, "packed: %s", e.msg);
    }
    if (plain && tsr_manifest_parse(plain, ln, "plain", 0, &back, &e) == 0) {
        same_records(&m, &back, "plain");
        tsr_manifest_free(&back);
    } else {
        CHECK(0, "plain: %s", e.msg);
    }
    wide(&m, TSR_REC_CHUNK + 40, "wider records");
    tsr_manifest wm;
    build(&wm, 78);
    wide(&wm, 1 << 20, "chunk records of 1 MiB");
    tsr_manifest_free(&wm);
    free(packed), free(plain), free(again);
    tsr_manifest_free(&m);
    if (!check_failures)
        printf("packed sections: %d chunks and frames in 4 blocks each, %zu bytes packed, %zu plain; wider records; "
               "2 GiB of records declared, refused\n", ROWS, pn, ln);
    return check_failures ? 1 : 0;
}
