/* two_writers.h: the small checkpoint that test_digest.c and test_stats.c
 * write and rewrite (included by each, after check.h, with a static tsr_error e
 * defined): w, an f32 [R, K] tensor whose rows writers 0 and 1 split, and ids,
 * an i64 [7] tensor written by writer 1, in frames of 64 bytes. */
#ifndef TSR_TWO_WRITERS_H
#define TSR_TWO_WRITERS_H

#include "manifest.h"
#include "store.h"
#include "tessera.h"

enum { R = 6, K = 5 };
static float w[R * K];
static int64_t ids[7];
static const uint64_t shape_w[2] = {R, K}, shape_i[1] = {7};

/* The two writers' save into dir; with `declare`, writer 0 declares w's digest
 * as `declared`; writer k with no_digests where bit k of `bare` is set.
 * @return the commit's result (e says why). */
static int save_two(const char *dir, int declare, uint64_t declared, int bare) {
    uint8_t id[16] = "two-writers";
    tsr_write_opts o = tsr_write_opts_default();
    o.frame_bytes = 64;
    o.threads = 1;
    tsr_save *s[2];
    const uint8_t *tables[2];
    size_t lens[2];
    for (int k = 0; k < 2; k++) {
        o.no_digests = bare >> k & 1;
        REQUIRE((s[k] = tsr_save_begin(dir, (uint32_t)k, id, &o, &e)), "%s", e.msg);
        CHECK_OK(tsr_save_tensor(s[k], "w", NULL, TSR_F32, 2, shape_w, NULL, &e));
        CHECK_OK(tsr_save_tensor(s[k], "ids", "optim", TSR_I64, 1, shape_i, NULL, &e));
        tsr_box rows = {2, {(uint64_t)k * 2, 0}, {k ? R - 2 : 2, K}};
        CHECK_OK(tsr_save_box(s[k], "w", &rows, w + k * 2 * K, &e));
    }
    tsr_box all_i = {1, {0}, {7}};
    CHECK_OK(tsr_save_box(s[1], "ids", &all_i, ids, &e));
    if (declare) CHECK_OK(tsr_save_tensor_digest(s[0], "w", declared, &e));
    for (int k = 0; k < 2; k++) CHECK_OK(tsr_save_finish(s[k], &tables[k], &lens[k], &e));
    int rc = tsr_save_commit(s[0], tables, lens, 2, 1, NULL, &e);
    for (int k = 0; k < 2; k++) {
        if (rc) tsr_save_abort(s[k]);
        tsr_save_free(s[k]);
    }
    return rc;
}

/* copy: the checkpoint src's chunks copied as they are stored (no shares, no
 * statistics computed), with what declare(s, ctx) declares of the tensors
 * (NULL: nothing) before the commit. */
static void copy_chunks(tsr_ckpt *src, const char *copy, void (*declare)(tsr_save *s, void *ctx), void *ctx) {
    tsr_remove_tree(copy);
    tsr_save *s = tsr_save_begin(copy, 0, NULL, NULL, &e);
    REQUIRE(s, "%s", e.msg);
    CHECK_OK(tsr_save_tensor(s, "w", NULL, TSR_F32, 2, shape_w, NULL, &e));
    CHECK_OK(tsr_save_tensor(s, "ids", "optim", TSR_I64, 1, shape_i, NULL, &e));
    for (size_t c = 0; c < tsr_ckpt_n_chunks(src); c++) {
        tsr_chunk_info ci;
        tsr_tensor_info ti;
        tsr_ckpt_chunk(src, c, &ci);
        tsr_ckpt_tensor(src, ci.tensor, &ti);
        CHECK_OK(tsr_save_chunk_copy(s, ti.name, src, c, &e));
    }
    if (declare) declare(s, ctx);
    CHECK_OK(tsr_save_finish(s, NULL, NULL, &e));
    CHECK_OK(tsr_save_commit(s, NULL, NULL, 0, 1, NULL, &e));
    tsr_save_free(s);
}

/* dir's MANIFEST parsed, changed by edit(m, ctx) and encoded again (its
 * checksums right); written back over dir's when `write`. @return 0, or the
 * refusal of the parse of what was encoded (e says why). */
static int rewrite_manifest(const char *dir, void (*edit)(tsr_manifest *m, void *ctx), void *ctx, int write) {
    uint8_t *buf;
    size_t len;
    REQUIRE(tsr_ckpt_read_manifest(dir, &buf, &len, &e) == 0, "%s", e.msg);
    tsr_manifest m;
    REQUIRE(tsr_manifest_parse(buf, len, "MANIFEST", 0, &m, &e) == 0, "%s", e.msg);
    free(buf);
    edit(&m, ctx);
    REQUIRE(tsr_manifest_encode(&m, 0, &buf, &len, &e) == 0, "%s", e.msg);
    tsr_manifest_free(&m);
    int rc = tsr_manifest_parse(buf, len, "MANIFEST", 0, &m, &e);
    if (!rc) tsr_manifest_free(&m);
    if (!rc && write) {
        tsr_store *st = tsr_store_open(dir, 0, &e);
        REQUIRE(st && tsr_store_put_atomic(st, "MANIFEST", buf, len, &e) == 0, "%s", e.msg);
        tsr_store_close(st);
    }
    free(buf);
    return rc;
}

#endif
