/* test_digest.c: the tensor digest (FORMAT.md 4.4). The test vectors of
 * FORMAT.md; the shares of any boxes that tile a tensor add up to its digest, in
 * any order; a save by two writers in frames of 64 bytes records every tensor's
 * digest, which tsr_ckpt_verify recomputes; a MANIFEST whose digest is off by
 * one (its checksums made right) fails verify naming the tensor and both values;
 * one without digests (as before format 1.2) reads and verifies, and says it
 * has none; a digest declared whole (tsr_save_tensor_digest) is checked against
 * the writers' shares at the commit, and recorded where a chunk copied as it is
 * stored leaves no share; with tsr_write_opts.no_digests on either writer, no
 * digest and no statistics are recorded of the tensors it declares (whatever
 * the other writer's shares), and the checkpoint reads and verifies. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common.h"
#include "encoder.h"

static tsr_error e;

#include "two_writers.h"

static void vectors(void) {
    float a = 0.5f;
    uint16_t b[3] = {0x3f80, 0xbf80, 0};
    int64_t c[6] = {-1, 0, 1, 2, -3, 4};
    uint64_t sa[1] = {0}, sb[1] = {3}, sc[2] = {2, 3}, se[1] = {0};
    tsr_box ba = {0, {0}, {0}}, bb = {1, {0}, {3}}, bc = {2, {0, 0}, {2, 3}}, be = {1, {0}, {0}};
    CHECK(tsr_digest_key("a", TSR_F32) == 0xd2f6d0996f37a720ull, "key of a");
    CHECK((tsr_digest_key("a", TSR_F32) ^ tsr_digest_box(4, sa, &ba, &a)) == 0x9f810db53714109aull, "digest of a");
    CHECK((tsr_digest_key("b.bf16", TSR_BF16) ^ tsr_digest_box(2, sb, &bb, b)) == 0x0a5814776dbd3d5full, "b.bf16");
    CHECK(tsr_digest_key("c.i64", TSR_I64) == 0xe0ba01d434ab44beull, "key of c.i64");
    CHECK((tsr_digest_key("c.i64", TSR_I64) ^ tsr_digest_box(8, sc, &bc, c)) == 0xb7ce0eb120c18dd3ull, "c.i64");
    CHECK(tsr_digest_tensor(tsr_digest_key("c.i64", TSR_I64), 8, c, 6) == 0xb7ce0eb120c18dd3ull, "c.i64 whole");
    CHECK((tsr_digest_key("e", TSR_F32) ^ tsr_digest_box(4, se, &be, NULL)) == 0x6881790369f3a86aull,
          "a tensor of volume 0: its key");
    /* the CRC's convention: CRC-64/XZ's check value is that of initial value
     * and final xor all ones, whose CRC of "123456789" differs from ours by a
     * constant that only the length fixes */
    CHECK(tsr_digest_tensor(0, 1, "123456789", 9) == 0x2b9c7ee4e2780c8aull, "CRC of 123456789");
}

/* A (5, 6, 7) tensor of every element size, cut into a grid of uneven boxes
 * (each copied out row-major), their shares combined backwards: the whole
 * tensor's CRC; each share taken in place (tsr_digest_region) is the same, and
 * a run's (tsr_digest_run) the share of its elements. */
static void shares_add_up(void) {
    enum { A = 5, B = 6, C = 7 };
    static const uint64_t cuts[3][4] = {{0, 2, 3, A}, {0, 1, 4, B}, {0, 5, 6, C}};
    uint64_t shape[3] = {A, B, C};
    for (size_t es = 1; es <= 8; es *= 2) {
        uint8_t all[A * B * C * 8], part[A * B * C * 8];
        for (size_t i = 0; i < sizeof all; i++) all[i] = (uint8_t)(i * 2654435761u >> 13);
        tsr_box whole = {3, {0, 0, 0}, {A, B, C}};
        uint64_t want = tsr_digest_box(es, shape, &whole, all), sum = 0;
        CHECK(want == (tsr_digest_key("t", 1) ^ tsr_digest_tensor(tsr_digest_key("t", 1), es, all, A * B * C)),
              "element size %zu: the whole box's share is the tensor's CRC", es);
        CHECK((tsr_digest_run(es, A * B * C, 0, all, 100) ^ tsr_digest_run(es, A * B * C, 100, all + 100 * es,
                                                                          A * B * C - 100)) == want,
              "element size %zu: two runs", es);
        for (int i = 2; i >= 0; i--)
            for (int j = 2; j >= 0; j--)
                for (int k = 2; k >= 0; k--) {
                    tsr_box bx = {3, {cuts[0][i], cuts[1][j], cuts[2][k]},
                                  {cuts[0][i + 1] - cuts[0][i], cuts[1][j + 1] - cuts[1][j], cuts[2][k + 1] - cuts[2][k]}};
                    tsr_box_copy(part, &bx, all, &whole, &bx, es);
                    uint64_t share = tsr_digest_box(es, shape, &bx, part);
                    sum ^= share;
                    /* the same box's share taken where it lies in the whole's memory */
                    CHECK(tsr_digest_region(es, shape, &whole, all, &bx) == share,
                          "element size %zu: box (%llu,%llu,%llu): its share in place differs", es,
                          (unsigned long long)bx.offset[0], (unsigned long long)bx.offset[1],
                          (unsigned long long)bx.offset[2]);
                    /* and in slabs of one row of dim 0 after another, accumulated */
                    tsr_digest_acc acc;
                    tsr_digest_acc_init(&acc);
                    for (uint64_t r = 0; r < bx.extent[0]; r++) {
                        tsr_box slab = bx;
                        slab.offset[0] += r, slab.extent[0] = 1;
                        tsr_digest_acc_region(&acc, es, shape, &whole, all, &slab);
                    }
                    CHECK(tsr_digest_acc_share(&acc, es, A * B * C) == share,
                          "element size %zu: box (%llu,%llu,%llu): its slabs' accumulated share differs", es,
                          (unsigned long long)bx.offset[0], (unsigned long long)bx.offset[1],
                          (unsigned long long)bx.offset[2]);
                }
        CHECK(sum == want, "element size %zu: the boxes' shares combine to %016llx, the tensor's is %016llx", es,
              (unsigned long long)sum, (unsigned long long)want);
        /* a changed element, or two swapped, change it */
        all[17 * es] ^= 1;
        CHECK(tsr_digest_box(es, shape, &whole, all) != want, "element size %zu: a bit flipped", es);
        all[17 * es] ^= 1;
        uint8_t t[8];
        memcpy(t, all, es), memcpy(all, all + es, es), memcpy(all + es, t, es);
        CHECK(memcmp(all, all + es, es) == 0 || tsr_digest_box(es, shape, &whole, all) != want,
              "element size %zu: two elements swapped", es);
    }
}

static long problems_found;
static char last_problem[2048];
static void on_problem(void *user, const char *msg) {
    (void)user;
    problems_found++;
    snprintf(last_problem, sizeof last_problem, "%s", msg);
}

static long verify(const char *dir) {
    tsr_ckpt *ck = tsr_ckpt_open(dir, &e);
    REQUIRE(ck, "%s", e.msg);
    problems_found = 0;
    long n = tsr_ckpt_verify(ck, on_problem, NULL, 1, &e);
    tsr_ckpt_close(ck);
    return n;
}

/* An edit of w's entry in a MANIFEST: its digest off by `delta`, or (clear)
 * not recorded (nor its statistics); its statistics' max moved by max_delta and
 * its L2 norm scaled by l2_scale. */
typedef struct w_edit {
    uint64_t delta;
    int clear;
    double max_delta, l2_scale;
} w_edit;

static void edit_w(tsr_manifest *m, void *ctx) {
    const w_edit *x = ctx;
    for (size_t i = 0; i < m->n_tensors; i++)
        if (!strcmp(m->tensors[i].name, "w")) {
            m->tensors[i].digest += x->delta;
            m->tensors[i].stats.max += x->max_delta;
            m->tensors[i].stats.l2 *= x->l2_scale;
            if (x->clear) m->tensors[i].digest_flags = 0;
        }
}

static void rewrite_w(const char *dir, uint64_t delta, int clear, double max_delta, double l2_scale) {
    w_edit x = {delta, clear, max_delta, l2_scale};
    REQUIRE(rewrite_manifest(dir, edit_w, &x, 1) == 0, "%s", e.msg);
}

static void declare_dw(tsr_save *s, void *ctx) { CHECK_OK(tsr_save_tensor_digest(s, "w", *(uint64_t *)ctx, &e)); }

static void saved_and_verified(const char *tmp) {
    for (int i = 0; i < R * K; i++) w[i] = (float)i * 0.25f - 3.0f;
    for (int i = 0; i < 7; i++) ids[i] = (int64_t)i * i * 1000 - 7;
    tsr_box all_w = {2, {0, 0}, {R, K}}, all_i = {1, {0}, {7}};
    uint64_t dw = tsr_digest_key("w", TSR_F32) ^ tsr_digest_box(4, shape_w, &all_w, w);
    uint64_t di = tsr_digest_key("ids", TSR_I64) ^ tsr_digest_box(8, shape_i, &all_i, ids);
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/two", tmp);
    REQUIRE(save_two(dir, 0, 0, 0) == 0, "%s", e.msg);
    tsr_ckpt *ck = tsr_ckpt_open(dir, &e);
    REQUIRE(ck, "%s", e.msg);
    uint64_t got = 0;
    CHECK(tsr_ckpt_tensor_digest(ck, (size_t)tsr_ckpt_find(ck, "w"), &got) == 1 && got == dw,
          "w: recorded %016llx, its data's %016llx", (unsigned long long)got, (unsigned long long)dw);
    CHECK(tsr_ckpt_tensor_digest(ck, (size_t)tsr_ckpt_find(ck, "ids"), &got) == 1 && got == di, "ids");
    CHECK(tsr_ckpt_version(ck) == (1u << 16 | TSR_FORMAT_MINOR), "format 1.%d", TSR_FORMAT_MINOR);
    tsr_ckpt_close(ck);
    CHECK(verify(dir) == 0, "verify of a sound checkpoint: %s", last_problem);

    /* statistics that the data contradicts (the digest right): verify
     * recomputes them and names the tensor and both values; an L2 norm within
     * FORMAT.md 4.5's tolerance passes */
    rewrite_w(dir, 0, 0, 1, 1);
    CHECK(verify(dir) == 1 && strstr(last_problem, "tensor w: its data's statistics differ from the MANIFEST's: min -3 "
                                                   "and max 4.25, the MANIFEST says -3 and 5.25"),
          "verify of a max off by one: %ld problems, %s", problems_found, last_problem);
    rewrite_w(dir, 0, 0, -1, 1 + 1e-6);
    CHECK(verify(dir) == 1 && strstr(last_problem, "tensor w: its data's statistics differ from the MANIFEST's: L2 norm"),
          "verify of an L2 norm 1e-6 off: %ld problems, %s", problems_found, last_problem);
    rewrite_w(dir, 0, 0, 0, 1 / (1 + 1e-6) * (1 + 1e-12));
    CHECK(verify(dir) == 0, "verify of an L2 norm 1e-12 off: %s", last_problem);

    /* the digest off by one: verify names the tensor and both values */
    rewrite_w(dir, 1, 0, 0, 1);
    CHECK(verify(dir) == 1, "verify of a digest off by one found %ld problems", problems_found);
    char want[128];
    snprintf(want, sizeof want, "tensor w: its data's digest is %016llx, the MANIFEST's %016llx",
             (unsigned long long)dw, (unsigned long long)(dw + 1));
    CHECK(strstr(last_problem, want), "verify says: %s", last_problem);

    /* no digest recorded (a file before 1.2): read and verified, none said */
    rewrite_w(dir, (uint64_t)-1, 1, 0, 1);
    ck = tsr_ckpt_open(dir, &e);
    REQUIRE(ck, "%s", e.msg);
    CHECK(tsr_ckpt_tensor_digest(ck, (size_t)tsr_ckpt_find(ck, "w"), &got) == 0, "w has no digest");
    CHECK(tsr_ckpt_tensor_digest(ck, 99, &got) == TSR_EINVAL, "no tensor 99");
    tsr_ckpt_close(ck);
    CHECK(verify(dir) == 0, "verify without a digest: %s", last_problem);

    /* a digest declared whole: the commit refuses one that the shares contradict */
    snprintf(dir, sizeof dir, "%s/declared-wrong", tmp);
    CHECK(save_two(dir, 1, dw ^ 4, 0) == TSR_ECORRUPT, "a wrong declared digest committed");
    CHECK(strstr(e.msg, "tensor w: the digest of the data written is"), "%s", e.msg);
    snprintf(dir, sizeof dir, "%s/declared-right", tmp);
    CHECK(save_two(dir, 1, dw, 0) == 0, "a right declared digest: %s", e.msg);

    /* chunks copied as they are stored: no share, the declared digest recorded */
    char copy[PATH_MAX];
    snprintf(copy, sizeof copy, "%s/copied", tmp);
    tsr_ckpt *src = tsr_ckpt_open(dir, &e);
    REQUIRE(src, "%s", e.msg);
    for (int declare = 0; declare < 2; declare++) {
        copy_chunks(src, copy, declare ? declare_dw : NULL, &dw);
        ck = tsr_ckpt_open(copy, &e);
        REQUIRE(ck, "%s", e.msg);
        int has = tsr_ckpt_tensor_digest(ck, (size_t)tsr_ckpt_find(ck, "w"), &got);
        CHECK(declare ? has == 1 && got == dw : has == 0, "copied chunks, declared %d: %d %016llx", declare, has,
              (unsigned long long)got);
        CHECK(tsr_ckpt_tensor_digest(ck, (size_t)tsr_ckpt_find(ck, "ids"), &got) == 0, "ids copied, not declared");
        tsr_ckpt_close(ck);
        CHECK(verify(copy) == 0, "verify of the copy: %s", last_problem);
    }
    tsr_ckpt_close(src);

    /* without the shares (tsr_write_opts.no_digests): nothing recorded of the
     * tensors such a writer declares, whatever the other wrote of them */
    for (int bare = 1; bare < 4; bare++) {
        snprintf(dir, sizeof dir, "%s/bare-%d", tmp, bare);
        REQUIRE(save_two(dir, 0, 0, bare) == 0, "no_digests on writers %d: %s", bare, e.msg);
        ck = tsr_ckpt_open(dir, &e);
        REQUIRE(ck, "%s", e.msg);
        tsr_stats st;
        size_t iw = (size_t)tsr_ckpt_find(ck, "w"), ii = (size_t)tsr_ckpt_find(ck, "ids");
        CHECK(tsr_ckpt_tensor_digest(ck, iw, &got) == 0, "no_digests on writers %d: w has a digest", bare);
        CHECK(tsr_ckpt_tensor_stats(ck, iw, &st) == 0, "no_digests on writers %d: w has statistics", bare);
        /* ids: written by writer 1, declared by both */
        CHECK(tsr_ckpt_tensor_digest(ck, ii, &got) == 0, "no_digests on writers %d: ids has a digest", bare);
        tsr_ckpt_close(ck);
        CHECK(verify(dir) == 0, "verify without the shares: %s", last_problem);
    }
}

/* A block of columns: many runs a gap apart, the gap's product taken by its
 * tables once it repeats; the region's share against each row's own run's. */
static void column_block(void) {
    enum { ROWS = 300, COLS = 64, C0 = 10, W = 21 };
    static uint16_t m[ROWS * COLS];
    for (int i = 0; i < ROWS * COLS; i++) m[i] = (uint16_t)(i * 2654435761u >> 7);
    uint64_t shape[2] = {ROWS, COLS}, want = 0;
    for (int r = 0; r < ROWS; r++) want ^= tsr_digest_run(2, ROWS * COLS, (uint64_t)r * COLS + C0, m + r * COLS + C0, W);
    tsr_box whole = {2, {0, 0}, {ROWS, COLS}}, block = {2, {0, C0}, {ROWS, W}};
    CHECK(tsr_digest_region(2, shape, &whole, m, &block) == want, "a block of %d columns over %d rows", W, ROWS);
    m[(ROWS - 1) * COLS + C0] ^= 4;
    CHECK(tsr_digest_region(2, shape, &whole, m, &block) != want, "the block's last row changed");
}

int main(void) {
    char tmp[] = "/tmp/tsr-digest-XXXXXX";
    REQUIRE(mkdtemp(tmp), "mkdtemp");
    vectors();
    shares_add_up();
    column_block();
    saved_and_verified(tmp);
    tsr_remove_tree(tmp);
    return check_failures ? 1 : 0;
}
