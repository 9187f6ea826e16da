/* test_manifest.c: the MANIFEST's packed sections (FORMAT.md 4.3) over several
 * blocks. One tensor of 200003 rows stored a row a chunk (200003 chunks and
 * frames: three blocks of 65536 records and a short one) in two files, with
 * checksums and stored sizes that differ from frame to frame: encoded packed and
 * plain, both parse back to the same records, the packed sections decode to
 * the plain ones' bytes by FORMAT.md's layout read literally, the packed file is
 * far smaller, and encoding what was parsed gives the same bytes again. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zstd.h>

#include "check.h"
#include "common.h"
#include "manifest.h"

enum { ROWS = 200003, COLS = 24 };

static tsr_error e;

static void build(tsr_manifest *m) {
    tsr_manifest_init(m);
    m->step = 12;
    memcpy(m->save_id, "tessera-test-pak", 16);
    tsr_mf_tensor t = {.name = "w", .group = "model", .dtype = TSR_U8, .ndim = 2, .shape = {ROWS, COLS},
                       .placement = {-1, 1, TSR_PP_ALL, -1}};
    REQUIRE(tsr_manifest_add_tensor(m, &t) == 0, "tensor");
    uint64_t pos[2] = {4096, 4096};
    for (uint32_t i = 0; i < ROWS; i++) {
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

int main(void) {
    tsr_manifest m, back;
    build(&m);
    uint8_t *packed = NULL, *plain = NULL, *again = NULL;
    size_t pn = 0, ln = 0, an = 0;
    CHECK_OK(tsr_manifest_encode(&m, 0, &packed, &pn, &e));
    CHECK_OK(tsr_manifest_encode(&m, TSR_MF_PLAIN, &plain, &ln, &e));
    CHECK(packed && plain && pn * 4 < ln, "packed %zu bytes, plain %zu", pn, ln);
    CHECK(packed && tsr_ld16(packed + 10) == 1 && tsr_ld32(packed + 128 + 32 * 3) == TSR_SEC_PACKED + TSR_SEC_CHUNKS &&
              tsr_ld32(packed + 128 + 32 * 4) == TSR_SEC_PACKED + TSR_SEC_FRAMES,
          "version 1.1, CHUNKS and FRAMES packed");
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
    free(packed), free(plain), free(again);
    tsr_manifest_free(&m);
    if (!check_failures) printf("packed sections: %d chunks and frames in 4 blocks each, %zu bytes packed, %zu plain\n", ROWS, pn, ln);
    return check_failures ? 1 : 0;
}
