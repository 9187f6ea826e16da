/* test_roundtrip.c: what is written is what is read, for every dtype and codec
 * (adaptive encoding too: raw and encoded frames mixed);
 * 0-d, 1-d, 8-d and empty tensors; reads of every box of a small tensor stored as a
 * grid of chunks; read plans; tensors of many frames, split along inner dims; thousands of
 * tensors; blobs; several writers committed by one; and the caller's mistakes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "common.h"
#include "store.h"
#include "tessera.h"

static tsr_error e;
static char tmp[512];
static int case_no;

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint64_t next(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}

typedef struct spec {
    const char *name;
    int dtype;
    uint32_t ndim;
    uint64_t shape[TSR_MAX_DIMS];
    uint8_t *data; /* the whole tensor, row-major */
} spec;

static uint64_t volume(const spec *s) {
    uint64_t v = 1;
    for (uint32_t d = 0; d < s->ndim; d++) v *= s->shape[d];
    return v;
}

static tsr_box whole_box(const spec *s) {
    tsr_box b = {.ndim = s->ndim};
    for (uint32_t d = 0; d < s->ndim; d++) b.extent[d] = s->shape[d];
    return b;
}

static void fill_random(spec *s) {
    size_t n = volume(s) * tsr_dtype_size(s->dtype);
    s->data = malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++) s->data[i] = (uint8_t)next();
    if (s->dtype == TSR_BOOL)
        for (size_t i = 0; i < n; i++) s->data[i] &= 1;
}

/* Writes box b of s (extracted with tsr_box_copy). */
static int put_box(tsr_save *sv, const spec *s, const tsr_box *b) {
    size_t es = tsr_dtype_size(s->dtype);
    uint64_t v = tsr_box_volume(b);
    uint8_t *buf = malloc(v * es + 1);
    tsr_box w = whole_box(s);
    tsr_box_copy(buf, b, s->data, &w, b, es);
    int rc = tsr_save_box(sv, s->name, b, buf, &e);
    free(buf);
    return rc;
}

/* Writes s as a grid of chunks: dim d cut into cuts[d] pieces (ceil division). */
static void put_grid(tsr_save *sv, const spec *s, const uint32_t *cuts) {
    uint32_t idx[TSR_MAX_DIMS] = {0};
    for (;;) {
        tsr_box b = {.ndim = s->ndim};
        int empty = 0;
        for (uint32_t d = 0; d < s->ndim; d++) {
            uint64_t step = (s->shape[d] + cuts[d] - 1) / cuts[d];
            b.offset[d] = idx[d] * step < s->shape[d] ? idx[d] * step : s->shape[d];
            uint64_t end = b.offset[d] + step < s->shape[d] ? b.offset[d] + step : s->shape[d];
            b.extent[d] = end - b.offset[d];
            if (!b.extent[d]) empty = 1;
        }
        if (!empty) CHECK_OK(put_box(sv, s, &b));
        int d = (int)s->ndim - 1;
        for (; d >= 0; d--) {
            if (++idx[d] < cuts[d]) break;
            idx[d] = 0;
        }
        if (d < 0) break;
    }
}

static void new_dir(char *out, size_t len) {
    snprintf(out, len, "%s/case-%03d", tmp, case_no++);
}

/* Reads box b of tensor s from ck and compares with the reference. */
static int check_box(tsr_ckpt *ck, const spec *s, const tsr_box *b) {
    long ti = tsr_ckpt_find(ck, s->name);
    if (ti < 0) {
        CHECK(0, "%s not found", s->name);
        return 1;
    }
    size_t es = tsr_dtype_size(s->dtype);
    uint64_t v = tsr_box_volume(b);
    uint8_t *got = malloc(v * es + 1), *want = malloc(v * es + 1);
    memset(got, 0xAB, v * es);
    tsr_box w = whole_box(s);
    tsr_box_copy(want, b, s->data, &w, b, es);
    int rc = tsr_ckpt_read(ck, (size_t)ti, b, got, &e);
    int bad = rc != 0 || memcmp(got, want, v * es) != 0;
    CHECK(!bad, "%s: box read differs (rc %d: %s)", s->name, rc, e.msg);
    free(got), free(want);
    return bad;
}

static tsr_save *begin(const char *dir, size_t frame_bytes, int codec) {
    tsr_write_opts o = tsr_write_opts_default();
    o.frame_bytes = frame_bytes;
    o.codec = codec;
    o.threads = 2;
    tsr_save *s = tsr_save_begin(dir, 0, NULL, &o, &e);
    REQUIRE(s, "tsr_save_begin(%s): %s", dir, e.msg);
    return s;
}

static void commit(tsr_save *s, uint64_t step) {
    CHECK_OK(tsr_save_finish(s, NULL, NULL, &e));
    CHECK_OK(tsr_save_commit(s, NULL, NULL, 0, step, NULL, &e));
    tsr_save_free(s);
}

static tsr_ckpt *open_ok(const char *dir) {
    tsr_ckpt *ck = tsr_ckpt_open(dir, &e);
    REQUIRE(ck, "open %s: %s", dir, e.msg);
    CHECK(tsr_ckpt_verify(ck, NULL, NULL, 2, &e) == 0, "verify %s", dir);
    return ck;
}

/* Every dtype, with each codec request, several chunks and frames. */
static void test_dtypes(void) {
    int codecs[] = {TSR_CODEC_AUTO, TSR_CODEC_RAW, TSR_CODEC_ZSTD, TSR_CODEC_BYTEGROUP};
    for (int ci = 0; ci < 4; ci++) {
        char dir[600];
        new_dir(dir, sizeof dir);
        tsr_save *sv = begin(dir, 256, codecs[ci]);
        spec specs[16];
        int n = 0;
        for (int dt = TSR_F32; dt <= TSR_BOOL; dt++) {
            spec *s = &specs[n++];
            char *name = malloc(32);
            snprintf(name, 32, "t.%s", tsr_dtype_name(dt));
            *s = (spec){name, dt, 2, {37, 13}, NULL};
            fill_random(s);
            CHECK_OK(tsr_save_tensor(sv, s->name, NULL, dt, 2, s->shape, NULL, &e));
            uint32_t cuts[] = {2, 1};
            put_grid(sv, s, cuts);
        }
        commit(sv, 7);
        tsr_ckpt *ck = open_ok(dir);
        CHECK(tsr_ckpt_step(ck) == 7, "step");
        for (int i = 0; i < n; i++) {
            tsr_box w = whole_box(&specs[i]);
            check_box(ck, &specs[i], &w);
            tsr_box edge = {2, {36, 0}, {1, 13}}; /* last row */
            check_box(ck, &specs[i], &edge);
            tsr_box col = {2, {0, 12}, {37, 1}}; /* last column */
            check_box(ck, &specs[i], &col);
            tsr_box mid = {2, {19, 3}, {2, 5}}; /* across the chunk boundary */
            check_box(ck, &specs[i], &mid);
        }
        /* the codec actually recorded */
        for (size_t f = 0; f < tsr_ckpt_n_frames(ck); f++) {
            tsr_frame_info fi;
            tsr_ckpt_frame(ck, f, &fi);
            if (codecs[ci] == TSR_CODEC_RAW) CHECK(fi.codec == TSR_CODEC_RAW, "raw requested, got %d", fi.codec);
        }
        tsr_ckpt_close(ck);
        for (int i = 0; i < n; i++) free(specs[i].data), free((char *)specs[i].name);
    }
}

/* Every box of a small tensor stored as a 3x2 grid of chunks with tiny frames. */
static void test_every_box(void) {
    char dir[600];
    new_dir(dir, sizeof dir);
    tsr_save *sv = begin(dir, 12, TSR_CODEC_AUTO); /* 3 f32 per frame */
    spec s = {"grid", TSR_F32, 2, {11, 7}, NULL};
    fill_random(&s);
    CHECK_OK(tsr_save_tensor(sv, s.name, NULL, s.dtype, 2, s.shape, NULL, &e));
    uint32_t cuts[] = {3, 2};
    put_grid(sv, &s, cuts);
    commit(sv, 1);
    tsr_ckpt *ck = open_ok(dir);
    int bad = 0;
    for (uint64_t r0 = 0; r0 < 11 && !bad; r0++)
        for (uint64_t r1 = r0 + 1; r1 <= 11 && !bad; r1++)
            for (uint64_t c0 = 0; c0 < 7 && !bad; c0++)
                for (uint64_t c1 = c0 + 1; c1 <= 7 && !bad; c1++) {
                    tsr_box b = {2, {r0, c0}, {r1 - r0, c1 - c0}};
                    bad = check_box(ck, &s, &b);
                }
    tsr_tensor_info ti;
    CHECK_OK(tsr_ckpt_tensor(ck, 0, &ti));
    CHECK(ti.n_chunks == 6, "6 chunks, got %u", ti.n_chunks);
    /* tsr_ckpt_read_chunk: each chunk, minus its first row and column where it has
     * them, read into the memory of the whole tensor */
    tsr_box all = whole_box(&s);
    float *got = malloc(11 * 7 * sizeof *got), *want = malloc(11 * 7 * sizeof *want);
    memset(got, 0, 11 * 7 * sizeof *got);
    memset(want, 0, 11 * 7 * sizeof *want);
    for (size_t c = 0; c < tsr_ckpt_n_chunks(ck); c++) {
        tsr_chunk_info ci;
        CHECK_OK(tsr_ckpt_chunk(ck, c, &ci));
        tsr_box r = ci.box;
        for (uint32_t d = 0; d < 2; d++)
            if (r.extent[d] > 1) r.offset[d]++, r.extent[d]--;
        CHECK_OK(tsr_ckpt_read_chunk(ck, c, &r, got, &all, &e));
        tsr_box_copy(want, &all, s.data, &all, &r, sizeof(float));
    }
    CHECK(memcmp(got, want, 11 * 7 * sizeof *got) == 0, "chunk regions read into the whole tensor");
    tsr_chunk_info c0;
    CHECK_OK(tsr_ckpt_chunk(ck, 0, &c0));
    tsr_box past = c0.box;
    past.extent[0]++; /* one row beyond the chunk */
    CHECK(tsr_ckpt_read_chunk(ck, 0, &past, got, &all, &e) == TSR_EINVAL && strstr(e.msg, "grid"),
          "a region outside the chunk: %s", e.msg);
    CHECK(tsr_ckpt_read_chunk(ck, 99, &c0.box, got, &all, &e) == TSR_EINVAL, "a chunk index past the end");
    free(got), free(want);
    tsr_ckpt_close(ck);
    free(s.data);
}

/* The box of frame k (0-based within the chunk) of chunk ci, from its geometry
 * (FORMAT.md, "Frames"): the reference the read plan is checked against. */
static tsr_box frame_box(const tsr_chunk_info *ci, uint64_t k) {
    tsr_box b = ci->box;
    uint32_t s = ci->split_dim;
    uint64_t runs = (b.extent[s] + ci->frame_rows - 1) / ci->frame_rows, outer = k / runs, j = k % runs;
    for (int d = (int)s - 1; d >= 0; d--) {
        b.offset[d] = ci->box.offset[d] + outer % ci->box.extent[d];
        b.extent[d] = 1;
        outer /= ci->box.extent[d];
    }
    b.offset[s] = ci->box.offset[s] + j * ci->frame_rows;
    uint64_t left = ci->box.extent[s] - j * ci->frame_rows;
    b.extent[s] = left < ci->frame_rows ? left : ci->frame_rows;
    return b;
}

static int box_inside(const tsr_box *outer, const tsr_box *in) {
    for (uint32_t d = 0; d < in->ndim; d++)
        if (in->offset[d] < outer->offset[d] || in->offset[d] + in->extent[d] > outer->offset[d] + outer->extent[d])
            return 0;
    return in->ndim == outer->ndim;
}

/* tsr_ckpt_plan_read on a 3x2 grid of chunks with 3-element frames: pieces in
 * (need, chunk, frame) order, each inside its needed box, its chunk and one
 * frame, together covering every needed box exactly (overlapping needs too), and
 * read through tsr_ckpt_read_chunk they give the stored data. */
static void test_read_plan(void) {
    char dir[600];
    new_dir(dir, sizeof dir);
    tsr_save *sv = begin(dir, 12, TSR_CODEC_AUTO);
    spec s = {"plan", TSR_F32, 2, {11, 7}, NULL};
    fill_random(&s);
    CHECK_OK(tsr_save_tensor(sv, s.name, NULL, s.dtype, 2, s.shape, NULL, &e));
    uint32_t cuts[] = {3, 2};
    put_grid(sv, &s, cuts);
    commit(sv, 1);
    tsr_ckpt *ck = open_ok(dir);
    tsr_box need[] = {whole_box(&s), {2, {3, 2}, {5, 4}}, {2, {4, 3}, {1, 1}}, {2, {10, 0}, {1, 7}},
                      {2, {0, 6}, {11, 1}}, {2, {3, 2}, {5, 4}}};
    size_t nn = sizeof need / sizeof *need;
    tsr_read_piece *p = NULL;
    size_t np = 0;
    CHECK_OK(tsr_ckpt_plan_read(ck, 0, need, nn, &p, &np, &e));
    uint64_t covered[6] = {0};
    float *got[6];
    for (size_t i = 0; i < nn; i++) got[i] = calloc(tsr_box_volume(&need[i]) + 1, sizeof(float));
    for (size_t k = 0; k < np; k++) {
        tsr_chunk_info ci;
        REQUIRE(p[k].need < nn && tsr_ckpt_chunk(ck, p[k].chunk, &ci) == 0, "piece %zu: need %u, chunk %u", k,
                p[k].need, p[k].chunk);
        if (k)
            CHECK(p[k - 1].need < p[k].need ||
                      (p[k - 1].need == p[k].need && (p[k - 1].chunk < p[k].chunk ||
                                                      (p[k - 1].chunk == p[k].chunk && p[k - 1].frame < p[k].frame))),
                  "piece %zu out of (need, chunk, frame) order", k);
        CHECK(ci.tensor == 0 && p[k].frame >= ci.first_frame && p[k].frame < ci.first_frame + ci.n_frames,
              "piece %zu: frame %u not of chunk %u", k, p[k].frame, p[k].chunk);
        tsr_box fb = frame_box(&ci, p[k].frame - ci.first_frame);
        CHECK(box_inside(&need[p[k].need], &p[k].region) && box_inside(&ci.box, &p[k].region) &&
                  box_inside(&fb, &p[k].region) && tsr_box_volume(&p[k].region) > 0,
              "piece %zu: region outside its needed box, chunk or frame", k);
        covered[p[k].need] += tsr_box_volume(&p[k].region);
        CHECK_OK(tsr_ckpt_read_chunk(ck, p[k].chunk, &p[k].region, got[p[k].need], &need[p[k].need], &e));
    }
    /* pieces in distinct frames of disjoint chunks are disjoint: volume is coverage */
    tsr_box all = whole_box(&s);
    for (size_t i = 0; i < nn; i++) {
        CHECK(covered[i] == tsr_box_volume(&need[i]), "box %zu: pieces hold %llu of %llu elements", i,
              (unsigned long long)covered[i], (unsigned long long)tsr_box_volume(&need[i]));
        float *want = calloc(tsr_box_volume(&need[i]) + 1, sizeof(float));
        tsr_box_copy(want, &need[i], s.data, &all, &need[i], sizeof(float));
        CHECK(memcmp(got[i], want, tsr_box_volume(&need[i]) * sizeof(float)) == 0, "box %zu read through its plan", i);
        free(want), free(got[i]);
    }
    free(p);
    CHECK_OK(tsr_ckpt_plan_read(ck, 0, need, 0, &p, &np, &e));
    CHECK(np == 0, "no needed box, %zu pieces", np);
    free(p);
    tsr_box outside = {2, {9, 0}, {3, 1}}, flat = {1, {0}, {7}};
    CHECK(tsr_ckpt_plan_read(ck, 1, need, 1, &p, &np, &e) == TSR_EINVAL && p == NULL, "a tensor index past the end");
    CHECK(tsr_ckpt_plan_read(ck, 0, &outside, 1, &p, &np, &e) == TSR_EINVAL && strstr(e.msg, "plan"),
          "a box outside the shape: %s", e.msg);
    CHECK(tsr_ckpt_plan_read(ck, 0, &flat, 1, &p, &np, &e) == TSR_EINVAL, "a box of other dims");
    tsr_ckpt_close(ck);
    free(s.data);
}

/* 0-d, 1-d, 8-d, empty tensors; frames split along an inner dim. */
static void test_shapes(void) {
    char dir[600];
    new_dir(dir, sizeof dir);
    tsr_save *sv = begin(dir, 4096, TSR_CODEC_AUTO);
    spec ss[] = {
        {"scalar", TSR_F64, 0, {0}, NULL},
        {"vec", TSR_U8, 1, {10000}, NULL},
        {"eight", TSR_I16, 8, {2, 3, 1, 2, 3, 2, 1, 2}, NULL},
        {"empty.rows", TSR_F32, 2, {0, 5}, NULL},
        {"empty.cols", TSR_BF16, 2, {3, 0}, NULL},
        {"inner.split", TSR_F32, 3, {2, 3, 5000}, NULL}, /* one index of dim 1: 20 KB > 4 KB */
        {"big.bf16", TSR_BF16, 2, {300, 1000}, NULL},
    };
    size_t n = sizeof ss / sizeof ss[0];
    for (size_t i = 0; i < n; i++) {
        fill_random(&ss[i]);
        CHECK_OK(tsr_save_tensor(sv, ss[i].name, "model", ss[i].dtype, ss[i].ndim, ss[i].shape, NULL, &e));
    }
    uint32_t one[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    put_grid(sv, &ss[0], one);
    uint32_t c1[] = {3};
    put_grid(sv, &ss[1], c1);
    uint32_t c8[] = {2, 2, 1, 1, 3, 1, 1, 2};
    put_grid(sv, &ss[2], c8);
    /* empty tensors: writing their (empty) whole box stores nothing */
    for (int k = 3; k <= 4; k++) {
        tsr_box w = whole_box(&ss[k]);
        CHECK_OK(tsr_save_box(sv, ss[k].name, &w, ss[k].data, &e));
    }
    uint32_t c3[] = {1, 2, 1};
    put_grid(sv, &ss[5], c3);
    uint32_t c2[] = {2, 1};
    put_grid(sv, &ss[6], c2);
    commit(sv, 2);
    tsr_ckpt *ck = open_ok(dir);
    for (size_t i = 0; i < n; i++) {
        tsr_box w = whole_box(&ss[i]);
        check_box(ck, &ss[i], &w);
    }
    tsr_tensor_info ti;
    CHECK_OK(tsr_ckpt_tensor(ck, (size_t)tsr_ckpt_find(ck, "empty.rows"), &ti));
    CHECK(ti.n_chunks == 0 && ti.raw_bytes == 0, "empty tensor: %u chunks", ti.n_chunks);
    long is = tsr_ckpt_find(ck, "inner.split");
    CHECK_OK(tsr_ckpt_tensor(ck, (size_t)is, &ti));
    int inner_split = 0;
    for (size_t c = 0; c < tsr_ckpt_n_chunks(ck); c++) {
        tsr_chunk_info ci;
        tsr_ckpt_chunk(ck, c, &ci);
        if (ci.tensor == (uint32_t)is && ci.split_dim == 2 && ci.n_frames > 1) inner_split = 1;
    }
    CHECK(inner_split, "inner.split: frames cut along dim 2");
    /* sub-boxes across frames of the 8-d and inner-split tensors */
    for (int k = 0; k < 300; k++) {
        for (int which = 2; which <= 6; which += 4) {
            spec *s = &ss[which];
            tsr_box b = {.ndim = s->ndim};
            for (uint32_t d = 0; d < s->ndim; d++) {
                b.offset[d] = next() % s->shape[d];
                b.extent[d] = 1 + next() % (s->shape[d] - b.offset[d]);
            }
            check_box(ck, s, &b);
        }
        spec *s = &ss[5];
        tsr_box b = {3, {next() % 2, next() % 3, next() % 5000}, {1, 1, 1}};
        b.extent[2] = 1 + next() % (5000 - b.offset[2]);
        check_box(ck, s, &b);
    }
    tsr_ckpt_close(ck);
    for (size_t i = 0; i < n; i++) free(ss[i].data);
}

/* Thousands of tensors, found by name and read back. */
static void test_many(void) {
    char dir[600];
    new_dir(dir, sizeof dir);
    tsr_save *sv = begin(dir, 1 << 20, TSR_CODEC_AUTO);
    enum { N = 3000 };
    static spec ss[N];
    static char names[N][32];
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "layers.%d.w%d", i % 100, i);
        ss[i] = (spec){names[i], i % 3 ? TSR_BF16 : TSR_F32, 1, {(uint64_t)(1 + i % 17)}, NULL};
        fill_random(&ss[i]);
        CHECK_OK(tsr_save_tensor(sv, ss[i].name, NULL, ss[i].dtype, 1, ss[i].shape, NULL, &e));
        tsr_box w = whole_box(&ss[i]);
        CHECK_OK(tsr_save_box(sv, ss[i].name, &w, ss[i].data, &e));
    }
    commit(sv, 3);
    tsr_ckpt *ck = open_ok(dir);
    CHECK(tsr_ckpt_n_tensors(ck) == N, "%zu tensors", tsr_ckpt_n_tensors(ck));
    for (int i = 0; i < N; i++) {
        tsr_box w = whole_box(&ss[i]);
        check_box(ck, &ss[i], &w);
        free(ss[i].data);
    }
    CHECK(tsr_ckpt_find(ck, "layers.0.nothing") == -1, "find of a missing name");
    tsr_ckpt_close(ck);
}

/* Blobs: global and per rank, empty, several frames. */
static void test_blobs(void) {
    char dir[600];
    new_dir(dir, sizeof dir);
    tsr_save *sv = begin(dir, 1000, TSR_CODEC_AUTO);
    uint8_t big[5555], small[3] = {1, 2, 3};
    for (size_t i = 0; i < sizeof big; i++) big[i] = (uint8_t)(i % 7 == 0 ? next() : i);
    CHECK_OK(tsr_save_blob(sv, "config", -1, big, sizeof big, &e));
    CHECK_OK(tsr_save_blob(sv, "rng", 0, small, 3, &e));
    CHECK_OK(tsr_save_blob(sv, "rng", 5, small, 2, &e));
    CHECK_OK(tsr_save_blob(sv, "empty", -1, NULL, 0, &e));
    CHECK(tsr_save_blob(sv, "rng", 5, small, 2, &e) == TSR_EINVAL, "a blob written twice");
    CHECK(tsr_save_blob(sv, "../x", -1, small, 2, &e) == TSR_EINVAL, "a blob with a bad name");
    commit(sv, 4);
    tsr_ckpt *ck = open_ok(dir);
    CHECK(tsr_ckpt_n_blobs(ck) == 4, "4 blobs");
    long i = tsr_ckpt_find_blob(ck, "config", -1);
    uint8_t got[5555];
    CHECK(i >= 0 && tsr_ckpt_read_blob(ck, (size_t)i, got, &e) == 0 && memcmp(got, big, sizeof big) == 0,
          "config blob round trip");
    i = tsr_ckpt_find_blob(ck, "rng", 5);
    tsr_blob_info bi;
    CHECK(i >= 0 && tsr_ckpt_blob(ck, (size_t)i, &bi) == 0 && bi.size == 2 && bi.rank == 5, "rng rank 5");
    CHECK(tsr_ckpt_read_blob(ck, (size_t)i, got, &e) == 0 && memcmp(got, small, 2) == 0, "rng rank 5 bytes");
    CHECK(tsr_ckpt_find_blob(ck, "rng", 1) == -1, "no rng for rank 1");
    i = tsr_ckpt_find_blob(ck, "empty", -1);
    CHECK(i >= 0 && tsr_ckpt_read_blob(ck, (size_t)i, got, &e) == 0, "empty blob");
    tsr_ckpt_close(ck);
}

/* Three writers, each its own data file and boxes; writer 0 commits. */
static void test_writers(void) {
    char dir[600];
    new_dir(dir, sizeof dir);
    uint8_t id[16] = "tessera-save-id";
    spec s = {"shared.w", TSR_BF16, 2, {30, 20}, NULL}, r = {"replicated.b", TSR_F32, 1, {20}, NULL};
    fill_random(&s);
    fill_random(&r);
    tsr_save *w[3];
    const uint8_t *tables[3];
    size_t lens[3];
    tsr_write_opts o = tsr_write_opts_default();
    o.frame_bytes = 100;
    for (uint32_t k = 0; k < 3; k++) {
        w[k] = tsr_save_begin(dir, k, id, &o, &e);
        REQUIRE(w[k], "writer %u: %s", k, e.msg);
        CHECK_OK(tsr_save_tensor(w[k], s.name, NULL, s.dtype, 2, s.shape, NULL, &e));
        CHECK_OK(tsr_save_tensor(w[k], r.name, NULL, r.dtype, 1, r.shape, NULL, &e));
        tsr_box b = {2, {10 * k, 0}, {10, 20}};
        CHECK_OK(put_box(w[k], &s, &b));
        if (k == 1) { /* the replicated tensor is written once */
            tsr_box rb = whole_box(&r);
            CHECK_OK(put_box(w[k], &r, &rb));
        }
        uint8_t rank_state = (uint8_t)(40 + k);
        CHECK_OK(tsr_save_blob(w[k], "rng", (int32_t)k, &rank_state, 1, &e));
        CHECK_OK(tsr_save_finish(w[k], &tables[k], &lens[k], &e));
    }
    CHECK(!tsr_ckpt_is_committed(dir), "not committed before the MANIFEST");
    tsr_ckpt *none = tsr_ckpt_open(dir, &e);
    CHECK(!none && e.code == TSR_ENOTFOUND, "open before commit: %s", e.msg);
    tsr_layout lay = {1, 1, 3, 1, 0, 0};
    CHECK_OK(tsr_save_commit(w[0], tables, lens, 3, 9, &lay, &e));
    for (int k = 0; k < 3; k++) tsr_save_free(w[k]);
    tsr_ckpt *ck = open_ok(dir);
    CHECK(tsr_ckpt_n_files(ck) == 3, "3 data files");
    CHECK(tsr_ckpt_layout(ck).dp_shard == 3, "layout recorded");
    tsr_box ws = whole_box(&s), wr = whole_box(&r);
    check_box(ck, &s, &ws);
    check_box(ck, &r, &wr);
    for (int k = 0; k < 3; k++) {
        long b = tsr_ckpt_find_blob(ck, "rng", k);
        uint8_t v = 0;
        CHECK(b >= 0 && tsr_ckpt_read_blob(ck, (size_t)b, &v, &e) == 0 && v == 40 + k, "rng of rank %d", k);
    }
    tsr_ckpt_close(ck);

    /* writers that disagree about a tensor, or leave a gap: no commit */
    new_dir(dir, sizeof dir);
    for (uint32_t k = 0; k < 2; k++) {
        w[k] = tsr_save_begin(dir, k, id, &o, &e);
        uint64_t shape[2] = {30, k ? 21u : 20u};
        CHECK_OK(tsr_save_tensor(w[k], s.name, NULL, s.dtype, 2, shape, NULL, &e));
        CHECK_OK(tsr_save_finish(w[k], &tables[k], &lens[k], &e));
    }
    CHECK(tsr_save_commit(w[0], tables, lens, 2, 1, NULL, &e) == TSR_EINVAL && strstr(e.msg, "shared.w") &&
              strstr(e.msg, "writers 0 and 1"),
          "disagreeing declarations: %s", e.msg);
    CHECK(!tsr_ckpt_is_committed(dir), "nothing committed");
    for (int k = 0; k < 2; k++) tsr_save_abort(w[k]), tsr_save_free(w[k]);
    CHECK(access(dir, F_OK) == 0, "directory stays");

    new_dir(dir, sizeof dir);
    tsr_save *g = begin(dir, 100, TSR_CODEC_AUTO);
    CHECK_OK(tsr_save_tensor(g, s.name, NULL, s.dtype, 2, s.shape, NULL, &e));
    tsr_box half = {2, {0, 0}, {15, 20}};
    CHECK_OK(put_box(g, &s, &half));
    CHECK_OK(tsr_save_finish(g, NULL, NULL, &e));
    CHECK(tsr_save_commit(g, NULL, NULL, 0, 1, NULL, &e) == TSR_ECORRUPT && strstr(e.msg, "shared.w"),
          "a gap in coverage refuses the commit: %s", e.msg);
    CHECK(!tsr_ckpt_is_committed(dir), "nothing committed");
    tsr_save_abort(g);
    tsr_save_free(g);
    free(s.data), free(r.data);
}

/* The caller's mistakes get clear errors. */
static void test_misuse(void) {
    char dir[600];
    new_dir(dir, sizeof dir);
    tsr_save *sv = begin(dir, 4096, TSR_CODEC_AUTO);
    uint64_t shape[2] = {4, 4};
    float data[16] = {0};
    CHECK_OK(tsr_save_tensor(sv, "a.b", NULL, TSR_F32, 2, shape, NULL, &e));
    CHECK(tsr_save_tensor(sv, "a.b", NULL, TSR_F32, 2, shape, NULL, &e) == TSR_EINVAL, "declared twice");
    const char *bad[] = {"", "a/b", "a..b", ".a", "a.", "a b", "x\ny"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(tsr_save_tensor(sv, bad[i], NULL, TSR_F32, 2, shape, NULL, &e) == TSR_EINVAL, "bad name '%s'", bad[i]);
    CHECK(tsr_save_tensor(sv, "c", NULL, 99, 2, shape, NULL, &e) == TSR_EINVAL, "bad dtype");
    CHECK(tsr_save_tensor(sv, "d", NULL, TSR_F32, 9, shape, NULL, &e) == TSR_EINVAL, "9 dims");
    tsr_placement pl = {2, 0, 0, -1};
    CHECK(tsr_save_tensor(sv, "e", NULL, TSR_F32, 2, shape, &pl, &e) == TSR_EINVAL, "tp dim out of range");
    tsr_box out = {2, {3, 0}, {2, 4}};
    CHECK(tsr_save_box(sv, "a.b", &out, data, &e) == TSR_EINVAL && strstr(e.msg, "a.b"), "box outside: %s", e.msg);
    tsr_box ok = {2, {0, 0}, {4, 4}};
    CHECK(tsr_save_box(sv, "nope", &ok, data, &e) == TSR_ENOTFOUND, "undeclared tensor");
    CHECK_OK(tsr_save_box(sv, "a.b", &ok, data, &e));
    CHECK(tsr_save_box(sv, "a.b", &ok, data, &e) == 0, "overlap is found when the table is built");
    CHECK(tsr_save_finish(sv, NULL, NULL, &e) == TSR_ECORRUPT && strstr(e.msg, "a.b"), "overlapping boxes: %s", e.msg);
    CHECK(tsr_save_commit(sv, NULL, NULL, 0, 1, NULL, &e) == TSR_EINVAL, "no commit after a failed finish");
    tsr_save_abort(sv);
    tsr_save_free(sv);
    char data_file[700];
    snprintf(data_file, sizeof data_file, "%s/data-00000.tsd", dir);
    CHECK(access(data_file, F_OK) != 0, "abort removes the data file");

    /* reads outside the shape */
    new_dir(dir, sizeof dir);
    sv = begin(dir, 4096, TSR_CODEC_AUTO);
    CHECK_OK(tsr_save_tensor(sv, "a", NULL, TSR_F32, 2, shape, NULL, &e));
    CHECK_OK(tsr_save_box(sv, "a", &ok, data, &e));
    commit(sv, 1);
    tsr_ckpt *ck = open_ok(dir);
    CHECK(tsr_ckpt_read(ck, 0, &out, data, &e) == TSR_EINVAL, "read outside the shape");
    tsr_box wrong = {1, {0}, {4}};
    CHECK(tsr_ckpt_read(ck, 0, &wrong, data, &e) == TSR_EINVAL, "read with the wrong ndim");
    CHECK(tsr_ckpt_read(ck, 5, &ok, data, &e) == TSR_EINVAL, "read of a tensor index past the end");
    tsr_ckpt_close(ck);
    CHECK(tsr_ckpt_open("/nonexistent/tessera", &e) == NULL && e.code == TSR_ENOTFOUND, "open of a missing dir");
}

/* Adaptive encoding (codec AUTO): a save of compressible f32 data in frames of
 * 64 KiB (128 of them) into dir, with the share of frames encoded pinned
 * (share > 0), or learned with a zstd level that makes the encoder slow or a
 * store fault that makes every write slow. Returns how many frames are raw and
 * how many encoded; every box reads back exactly and the checkpoint verifies. */
static void adaptive_save(const char *dir, double share, int level, size_t *raw, size_t *encoded) {
    tsr_write_opts o = tsr_write_opts_default();
    o.frame_bytes = 64 << 10;
    o.threads = 2;
    o.level = level;
    o.encode_share = share;
    tsr_save *sv = tsr_save_begin(dir, 0, NULL, &o, &e);
    REQUIRE(sv, "tsr_save_begin(%s): %s", dir, e.msg);
    spec sp = {"w", TSR_F32, 2, {2048, 1024}, NULL};
    sp.data = malloc(2048 * 1024 * sizeof(float));
    REQUIRE(sp.data, "out of memory");
    for (size_t i = 0; i < 2048 * 1024; i++) ((float *)sp.data)[i] = (float)(next() % 16) * 0.25f;
    CHECK_OK(tsr_save_tensor(sv, sp.name, NULL, sp.dtype, 2, sp.shape, NULL, &e));
    uint32_t cuts[] = {1, 1};
    put_grid(sv, &sp, cuts);
    commit(sv, 3);
    tsr_ckpt *ck = open_ok(dir);
    tsr_box w = whole_box(&sp);
    check_box(ck, &sp, &w);
    *raw = *encoded = 0;
    for (size_t f = 0; f < tsr_ckpt_n_frames(ck); f++) {
        tsr_frame_info fi;
        CHECK_OK(tsr_ckpt_frame(ck, f, &fi));
        if (fi.raw_size == (64 << 10)) ++*(fi.codec == TSR_CODEC_RAW ? raw : encoded);
    }
    tsr_ckpt_close(ck);
    free(sp.data);
}

static void test_adaptive(void) {
    char dir[600];
    size_t raw, enc;
    /* pinned at one half: every other frame raw */
    new_dir(dir, sizeof dir);
    adaptive_save(dir, 0.5, 1, &raw, &enc);
    CHECK(raw + enc == 128 && raw >= 63 && enc >= 63, "share 0.5: %zu raw and %zu encoded frames", raw, enc);
    /* a writer far slower than the encoder (50 ms a write): everything encoded */
    new_dir(dir, sizeof dir);
    REQUIRE(tsr_fault_set("delay:50000:write", &e) == 0, "%s", e.msg);
    adaptive_save(dir, 0, 1, &raw, &enc);
    tsr_fault_set(NULL, NULL);
    CHECK(enc >= 120, "a slow writer: only %zu of 128 frames encoded (%zu raw)", enc, raw);
    /* an encoder far slower than the writer (zstd level 19 into memory): mostly raw */
    char shm[600];
    snprintf(shm, sizeof shm, "/dev/shm/tessera-roundtrip-%d", (int)getpid());
    tsr_remove_tree(shm);
    adaptive_save(shm, 0, 19, &raw, &enc);
    tsr_remove_tree(shm);
    CHECK(raw >= 64, "a slow encoder: only %zu of 128 frames raw (%zu encoded)", raw, enc);
}

int main(void) {
    const char *t = getenv("TSR_TMP");
    snprintf(tmp, sizeof tmp, "%s", t ? t : "/tmp");
    if (!t) {
        snprintf(tmp, sizeof tmp, "/tmp/tessera-roundtrip-XXXXXX");
        REQUIRE(mkdtemp(tmp), "mkdtemp");
    }
    test_dtypes();
    test_every_box();
    test_read_plan();
    test_shapes();
    test_many();
    test_blobs();
    test_writers();
    test_misuse();
    test_adaptive();
    return check_done();
}
