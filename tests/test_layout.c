/* test_layout.c: layouts (parse, format, rank coordinates), the boxes each rank
 * holds under a layout, and the boxes of a flat element range.
 *
 *  - hand-written cases with expected boxes: uneven and empty TP pieces, FSDP
 *    inside TP, PP stages, flat sharding across a tensor boundary;
 *  - random layouts (each degree 1..4, at most 64 ranks) and tensor sets: every
 *    element of every tensor is held by exactly `replicas` ranks, no rank holds
 *    an element twice, the boxes match an independent reference (non-flat) or
 *    fall in the rank's ceil-division share of the group buffer (flat);
 *  - tsr_range_boxes on random boxes and ranges against element sets.
 *
 * The empty layout text is accepted: it is the layout of one rank (every degree 1). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "tessera.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}
static uint64_t below(uint64_t n) { return n ? next() % n : 0; }

/* The flat (row-major) indices, relative to box `frame`, of every element of box
 * b (inside frame), in b's row-major order. @return their count. */
static size_t flat_indices(const tsr_box *b, const tsr_box *frame, uint64_t *out) {
    uint64_t vol = tsr_box_volume(b);
    if (vol == 0) return 0;
    uint64_t idx[TSR_MAX_DIMS] = {0};
    for (uint64_t n = 0; n < vol; n++) {
        uint64_t p = 0;
        for (uint32_t d = 0; d < b->ndim; d++)
            p = p * frame->extent[d] + (b->offset[d] + idx[d] - frame->offset[d]);
        out[n] = p;
        for (int d = (int)b->ndim - 1; d >= 0; d--) {
            if (++idx[d] < b->extent[d]) break;
            idx[d] = 0;
        }
    }
    return (size_t)vol;
}

static tsr_box whole(uint32_t nd, const uint64_t *shape) {
    tsr_box b;
    memset(&b, 0, sizeof b);
    b.ndim = nd;
    for (uint32_t d = 0; d < nd; d++) b.extent[d] = shape[d];
    return b;
}

static tsr_layout mk_layout(uint32_t pp, uint32_t dpr, uint32_t dps, uint32_t tp, uint32_t nl,
                            uint32_t flags) {
    tsr_layout l = {pp, dpr, dps, tp, nl, flags};
    return l;
}

static tsr_tensor_decl mk_tensor(const char *name, const char *group, uint32_t nd,
                                 const uint64_t *shape, int tp_dim, int fsdp, int role, int layer) {
    tsr_tensor_decl t;
    memset(&t, 0, sizeof t);
    t.name = name;
    t.group = group;
    t.dtype = TSR_F32;
    t.ndim = nd;
    for (uint32_t d = 0; d < nd; d++) t.shape[d] = shape[d];
    t.placement.tp_dim = (int8_t)tp_dim;
    t.placement.fsdp = (uint8_t)fsdp;
    t.placement.pp_role = (uint8_t)role;
    t.placement.layer = layer;
    return t;
}

/* Checks that `got` is the box (tensor, off, ext). */
static void expect_box(const tsr_rank_box *got, uint32_t tensor, uint32_t nd, const uint64_t *off,
                       const uint64_t *ext, const char *what) {
    int ok = got->tensor == tensor && got->box.ndim == nd;
    for (uint32_t d = 0; ok && d < nd; d++)
        ok = got->box.offset[d] == off[d] && got->box.extent[d] == ext[d];
    CHECK(ok, "%s: got tensor %u box off[0]=%llu ext[0]=%llu", what, got->tensor,
          nd ? (unsigned long long)got->box.offset[0] : 0ull,
          nd ? (unsigned long long)got->box.extent[0] : 0ull);
}

static size_t boxes_of(const tsr_layout *l, const tsr_tensor_decl *t, size_t n, uint32_t rank,
                       tsr_rank_box **out) {
    tsr_error e = {0};
    size_t m = 0;
    int rc = tsr_layout_boxes(l, t, n, rank, out, &m, &e);
    REQUIRE(rc == 0, "tsr_layout_boxes rank %u: %s", rank, e.msg);
    return m;
}

/* ------------------------------------------------------------ hand cases */

static void hand_cases(void) {
    tsr_rank_box *b;
    size_t m;
    { /* [10, 6], tp=4 on dim 0: rows 3, 3, 3, 1 */
        uint64_t shape[2] = {10, 6};
        tsr_tensor_decl t = mk_tensor("w", NULL, 2, shape, 0, 0, TSR_PP_ALL, -1);
        tsr_layout l = mk_layout(1, 1, 1, 4, 0, 0);
        const uint64_t rows[4] = {3, 3, 3, 1};
        for (uint32_t r = 0; r < 4; r++) {
            m = boxes_of(&l, &t, 1, r, &b);
            CHECK(m == 1, "tp=4 rank %u: %zu boxes", r, m);
            uint64_t off[2] = {3 * r, 0}, ext[2] = {rows[r], 6};
            if (m == 1) expect_box(&b[0], 0, 2, off, ext, "[10,6] tp=4");
            free(b);
        }
    }
    { /* [2, 6], tp=4 on dim 0: rows 1, 1, 0, 0 (empty trailing pieces) */
        uint64_t shape[2] = {2, 6};
        tsr_tensor_decl t = mk_tensor("w", NULL, 2, shape, 0, 0, TSR_PP_ALL, -1);
        tsr_layout l = mk_layout(1, 1, 1, 4, 0, 0);
        for (uint32_t r = 0; r < 4; r++) {
            m = boxes_of(&l, &t, 1, r, &b);
            CHECK(m == (r < 2 ? 1u : 0u), "[2,6] tp=4 rank %u: %zu boxes", r, m);
            uint64_t off[2] = {r, 0}, ext[2] = {1, 6};
            if (m == 1) expect_box(&b[0], 0, 2, off, ext, "[2,6] tp=4");
            free(b);
        }
    }
    { /* FSDP inside TP: [10, 4], tp=2 on dim 0 (rows 0..5, 5..10), dp_shard=2 cuts
       * each TP piece's 5 rows into 3 and 2. Rank = dp_shard * 2 + tp. */
        uint64_t shape[2] = {10, 4};
        tsr_tensor_decl t = mk_tensor("w", NULL, 2, shape, 0, 1, TSR_PP_ALL, -1);
        tsr_layout l = mk_layout(1, 1, 2, 2, 0, 0);
        const uint64_t off0[4] = {0, 5, 3, 8}, ext0[4] = {3, 3, 2, 2};
        for (uint32_t r = 0; r < 4; r++) {
            m = boxes_of(&l, &t, 1, r, &b);
            CHECK(m == 1, "fsdp in tp rank %u: %zu boxes", r, m);
            uint64_t off[2] = {off0[r], 0}, ext[2] = {ext0[r], 4};
            if (m == 1) expect_box(&b[0], 0, 2, off, ext, "fsdp inside tp dim 0");
            free(b);
        }
        /* [8, 6], tp=2 on dim 1, fsdp over dp_shard=2 on dim 0: a 2x2 grid. */
        uint64_t shape2[2] = {8, 6};
        t = mk_tensor("w", NULL, 2, shape2, 1, 1, TSR_PP_ALL, -1);
        for (uint32_t r = 0; r < 4; r++) {
            m = boxes_of(&l, &t, 1, r, &b);
            CHECK(m == 1, "fsdp x tp rank %u: %zu boxes", r, m);
            uint64_t off[2] = {4 * (r / 2), 3 * (r % 2)}, ext[2] = {4, 3};
            if (m == 1) expect_box(&b[0], 0, 2, off, ext, "fsdp inside tp dim 1");
            free(b);
        }
        /* no fsdp: replicated over dp_shard */
        t.placement.fsdp = 0;
        for (uint32_t r = 0; r < 4; r++) {
            m = boxes_of(&l, &t, 1, r, &b);
            uint64_t off[2] = {0, 3 * (r % 2)}, ext[2] = {8, 3};
            CHECK(m == 1, "no fsdp rank %u: %zu boxes", r, m);
            if (m == 1) expect_box(&b[0], 0, 2, off, ext, "replicated over dp_shard");
            free(b);
        }
    }
    { /* PP: 5 layers over pp=4 -> 2 per stage: layers 0,1 | 2,3 | 4 | none. */
        uint64_t shape[1] = {4};
        tsr_tensor_decl t[8];
        const char *names[5] = {"l0", "l1", "l2", "l3", "l4"};
        for (int i = 0; i < 5; i++) t[i] = mk_tensor(names[i], NULL, 1, shape, -1, 0, TSR_PP_LAYER, i);
        t[5] = mk_tensor("emb", NULL, 1, shape, -1, 0, TSR_PP_FIRST, -1);
        t[6] = mk_tensor("out", NULL, 1, shape, -1, 0, TSR_PP_LAST, -1);
        t[7] = mk_tensor("all", NULL, 1, shape, -1, 0, TSR_PP_ALL, -1);
        tsr_layout l = mk_layout(4, 1, 1, 1, 5, 0);
        const char *expect[4] = {"l0 l1 emb all", "l2 l3 all", "l4 all", "out all"};
        for (uint32_t r = 0; r < 4; r++) {
            m = boxes_of(&l, t, 8, r, &b);
            char got[128] = "";
            for (size_t i = 0; i < m; i++)
                snprintf(got + strlen(got), sizeof got - strlen(got), "%s%s", i ? " " : "",
                         t[b[i].tensor].name);
            CHECK(strcmp(got, expect[r]) == 0, "pp stage %u holds '%s', expected '%s'", r, got,
                  expect[r]);
            free(b);
        }
    }
    { /* Flat, dp_shard=2, group "model" = b [5] then a [3, 4] in name order:
       * a (12 elements) then b (5): F = 17, c = 9. Rank 0: a[0, 9) = rows 0-1 and
       * (2, 0); rank 1: a[9, 12) = (2, 1..3), then b whole. Tensor "c" in group
       * "optim" is its own buffer: [2, 3] -> 3 elements each. Boxes come in tensor
       * order (b is tensor 0). */
        uint64_t sa[2] = {3, 4}, sb[1] = {5}, sc[2] = {2, 3};
        tsr_tensor_decl t[3] = {
            mk_tensor("b", "model", 1, sb, -1, 1, TSR_PP_ALL, -1),
            mk_tensor("a", "model", 2, sa, -1, 0, TSR_PP_ALL, -1),
            mk_tensor("c", "optim", 2, sc, -1, 1, TSR_PP_ALL, -1),
        };
        tsr_layout l = mk_layout(1, 1, 2, 1, 0, TSR_LAYOUT_FLAT);
        m = boxes_of(&l, t, 3, 0, &b);
        CHECK(m == 3, "flat rank 0: %zu boxes", m);
        if (m == 3) {
            expect_box(&b[0], 1, 2, (uint64_t[]){0, 0}, (uint64_t[]){2, 4}, "flat r0 a rows 0-1");
            expect_box(&b[1], 1, 2, (uint64_t[]){2, 0}, (uint64_t[]){1, 1}, "flat r0 a (2,0)");
            expect_box(&b[2], 2, 2, (uint64_t[]){0, 0}, (uint64_t[]){1, 3}, "flat r0 c row 0");
        }
        free(b);
        m = boxes_of(&l, t, 3, 1, &b);
        CHECK(m == 3, "flat rank 1: %zu boxes", m);
        if (m == 3) {
            expect_box(&b[0], 0, 1, (uint64_t[]){0}, (uint64_t[]){5}, "flat r1 b");
            expect_box(&b[1], 1, 2, (uint64_t[]){2, 1}, (uint64_t[]){1, 3}, "flat r1 a (2,1..3)");
            expect_box(&b[2], 2, 2, (uint64_t[]){1, 0}, (uint64_t[]){1, 3}, "flat r1 c row 1");
        }
        free(b);
        /* with tp=2 on dim 1 of a: a (tp-split) and b (tp-replicated) are in
         * buffers of their own. a's TP-local piece is [3, 2] (6 elements, 3 per
         * dp_shard rank), b has 5 (3 and 2). Rank 1 (s=0, t=1): b[0, 3), a's local
         * elements 0-2 = (0, 2..3) and (1, 2). Rank 3 (s=1, t=1): b[3, 5), a's
         * local 3-5 = (1, 3) and (2, 2..3). */
        t[1].placement.tp_dim = 1;
        l = mk_layout(1, 1, 2, 2, 0, TSR_LAYOUT_FLAT);
        m = boxes_of(&l, t, 2, 1, &b);
        CHECK(m == 3, "flat tp rank 1: %zu boxes", m);
        if (m == 3) {
            expect_box(&b[0], 0, 1, (uint64_t[]){0}, (uint64_t[]){3}, "flat tp r1 b");
            expect_box(&b[1], 1, 2, (uint64_t[]){0, 2}, (uint64_t[]){1, 2}, "flat tp r1 a row 0");
            expect_box(&b[2], 1, 2, (uint64_t[]){1, 2}, (uint64_t[]){1, 1}, "flat tp r1 a (1,2)");
        }
        free(b);
        m = boxes_of(&l, t, 2, 3, &b);
        CHECK(m == 3, "flat tp rank 3: %zu boxes", m);
        if (m == 3) {
            expect_box(&b[0], 0, 1, (uint64_t[]){3}, (uint64_t[]){2}, "flat tp r3 b");
            expect_box(&b[1], 1, 2, (uint64_t[]){1, 3}, (uint64_t[]){1, 1}, "flat tp r3 a (1,3)");
            expect_box(&b[2], 1, 2, (uint64_t[]){2, 2}, (uint64_t[]){1, 2}, "flat tp r3 a row 2");
        }
        free(b);
    }
    { /* 0-d tensors: replicated, or held by dp_shard 0 under fsdp */
        tsr_tensor_decl t[2] = {mk_tensor("s", NULL, 0, NULL, -1, 0, TSR_PP_ALL, -1),
                                mk_tensor("f", NULL, 0, NULL, -1, 1, TSR_PP_ALL, -1)};
        tsr_layout l = mk_layout(1, 1, 2, 1, 0, 0);
        m = boxes_of(&l, t, 2, 0, &b);
        CHECK(m == 2 && b[0].tensor == 0 && b[1].tensor == 1 && b[0].box.ndim == 0, "0-d rank 0");
        free(b);
        m = boxes_of(&l, t, 2, 1, &b);
        CHECK(m == 1 && b[0].tensor == 0, "0-d rank 1: %zu boxes", m);
        free(b);
    }
    { /* no tensors */
        tsr_layout l = mk_layout(1, 1, 1, 1, 0, 0);
        m = boxes_of(&l, NULL, 0, 0, &b);
        CHECK(m == 0, "no tensors: %zu boxes", m);
        free(b);
    }
}

static void error_cases(void) {
    uint64_t shape[2] = {4, 4};
    tsr_tensor_decl t = mk_tensor("layers.3.wq", NULL, 2, shape, 2, 0, TSR_PP_ALL, -1);
    tsr_layout l = mk_layout(2, 1, 1, 2, 4, 0);
    tsr_rank_box *b = NULL;
    size_t m = 0;
    tsr_error e = {0};
    int rc = tsr_layout_boxes(&l, &t, 1, 0, &b, &m, &e);
    CHECK(rc == TSR_EINVAL && e.code == TSR_EINVAL && strstr(e.msg, "layers.3.wq"),
          "tp_dim 2 of 2 dims: rc %d '%s'", rc, e.msg);
    t.placement.tp_dim = 0;
    t.placement.pp_role = TSR_PP_LAYER;
    t.placement.layer = 4;
    rc = tsr_layout_boxes(&l, &t, 1, 0, &b, &m, &e);
    CHECK(rc == TSR_EINVAL && strstr(e.msg, "layers.3.wq"), "layer 4 of 4: rc %d '%s'", rc, e.msg);
    l.n_layers = 0;
    t.placement.layer = 0;
    rc = tsr_layout_boxes(&l, &t, 1, 0, &b, &m, &e);
    CHECK(rc == TSR_EINVAL && strstr(e.msg, "layers.3.wq"), "n_layers 0 with pp=2: rc %d '%s'", rc,
          e.msg);
    l.pp = 1; /* one stage: the layer index does not matter */
    rc = tsr_layout_boxes(&l, &t, 1, 0, &b, &m, &e);
    CHECK(rc == 0 && m == 1, "pp=1 with n_layers 0: rc %d '%s'", rc, e.msg);
    free(b);
    t.placement.layer = -1;
    rc = tsr_layout_boxes(&l, &t, 1, 0, &b, &m, &e);
    CHECK(rc == TSR_EINVAL, "negative layer: rc %d", rc);
    t.placement.layer = 0;
    t.placement.pp_role = 9;
    rc = tsr_layout_boxes(&l, &t, 1, 0, &b, &m, &e);
    CHECK(rc == TSR_EINVAL, "pp_role 9: rc %d", rc);
    t.placement.pp_role = TSR_PP_ALL;
    rc = tsr_layout_boxes(&l, &t, 1, 2, &b, &m, &e); /* 2 ranks */
    CHECK(rc == TSR_EINVAL, "rank 2 of 2: rc %d", rc);
    l.tp = 0;
    rc = tsr_layout_boxes(&l, &t, 1, 0, &b, &m, &e);
    CHECK(rc == TSR_EINVAL && strstr(e.msg, "tp"), "tp=0: rc %d '%s'", rc, e.msg);
    l = mk_layout(65536, 1, 1, 65536, 0, 0);
    rc = tsr_layout_boxes(&l, &t, 1, 0, &b, &m, &e);
    CHECK(rc == TSR_EINVAL, "2^32 ranks: rc %d", rc);
    CHECK(tsr_layout_size(&l) == 0, "size of a 2^32-rank layout");
    l = mk_layout(1, 1, 1, 1, 0, 0);
    t.ndim = 9;
    rc = tsr_layout_boxes(&l, &t, 1, 0, &b, &m, &e);
    CHECK(rc == TSR_EINVAL && strstr(e.msg, "layers.3.wq"), "9 dims: rc %d", rc);
    t.ndim = 2;
    t.shape[0] = t.shape[1] = 1ull << 33;
    rc = tsr_layout_boxes(&l, &t, 1, 0, &b, &m, &e);
    CHECK(rc == TSR_EINVAL, "shape overflow: rc %d", rc);
}

/* ------------------------------------------------------------ parse/format */

static void parse_cases(void) {
    tsr_error e = {0};
    tsr_layout l = mk_layout(9, 9, 9, 9, 7, 0);
    CHECK_OK(tsr_layout_parse("pp=2,dp_shard=4,tp=2", &l, &e));
    CHECK(l.pp == 2 && l.dp_replicate == 1 && l.dp_shard == 4 && l.tp == 2 && l.flags == 0 &&
          l.n_layers == 7, "pp=2,dp_shard=4,tp=2: n_layers kept");
    CHECK_OK(tsr_layout_parse("dp_shard=3", &l, &e));
    CHECK(l.pp == 1 && l.dp_replicate == 1 && l.dp_shard == 3 && l.tp == 1, "dp_shard=3");
    CHECK_OK(tsr_layout_parse("tp=2,flat", &l, &e));
    CHECK(l.tp == 2 && l.flags == TSR_LAYOUT_FLAT && l.dp_shard == 1, "tp=2,flat");
    CHECK_OK(tsr_layout_parse("flat=1,layers=32,dp_replicate=2,pp=4", &l, &e));
    CHECK(l.flags == TSR_LAYOUT_FLAT && l.n_layers == 32 && l.pp == 4 && l.dp_replicate == 2, "any order");
    CHECK_OK(tsr_layout_parse("flat=0", &l, &e));
    CHECK(l.flags == 0 && l.n_layers == 32, "flat=0");
    /* empty text: the layout of one rank */
    l = mk_layout(3, 3, 3, 3, 5, TSR_LAYOUT_FLAT);
    CHECK_OK(tsr_layout_parse("", &l, &e));
    CHECK(l.pp == 1 && l.dp_replicate == 1 && l.dp_shard == 1 && l.tp == 1 && l.flags == 0 &&
          l.n_layers == 5, "empty text is all ones");

    const char *bad[] = {"tp=0", "tp=", "xx=2", "tp=2,tp=3", "tp", "tp=-1", "tp=2x", "tp=2,",
                         ",tp=2", "tp=2,,pp=2", "flat=2", "flat=", "tp=4294967296",
                         "pp=65536,tp=65536", "tp=99999999999", " tp=2", "TP=2", "layers="};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tsr_layout keep = mk_layout(5, 6, 7, 8, 9, 0), got = keep;
        e.code = 0;
        e.msg[0] = 0;
        int rc = tsr_layout_parse(bad[i], &got, &e);
        CHECK(rc == TSR_EINVAL && e.code == TSR_EINVAL && e.msg[0], "'%s' accepted", bad[i]);
        CHECK(memcmp(&got, &keep, sizeof got) == 0, "'%s' changed *out", bad[i]);
        CHECK(strstr(e.msg, bad[i]) != NULL, "'%s': message '%s' does not name it", bad[i], e.msg);
    }
    tsr_error e2 = {0};
    tsr_layout_parse("pp=2,xx=2", &l, &e2);
    CHECK(strstr(e2.msg, "\"xx=2\""), "message names the part: %s", e2.msg);

    char buf[256];
    tsr_layout_format(&(tsr_layout){2, 1, 4, 2, 0, 0}, buf, sizeof buf);
    CHECK(strcmp(buf, "pp=2,dp_replicate=1,dp_shard=4,tp=2") == 0, "format: %s", buf);
    tsr_layout_format(&(tsr_layout){1, 2, 1, 8, 32, TSR_LAYOUT_FLAT}, buf, sizeof buf);
    CHECK(strcmp(buf, "pp=1,dp_replicate=2,dp_shard=1,tp=8,layers=32,flat") == 0, "format: %s", buf);
    tsr_layout_format(&(tsr_layout){1, 2, 1, 8, 32, TSR_LAYOUT_FLAT}, buf, 5);
    CHECK(strcmp(buf, "pp=1") == 0, "format truncates: %s", buf);
    for (int it = 0; it < 2000; it++) {
        tsr_layout a = {1 + (uint32_t)below(1000), 1 + (uint32_t)below(4), 1 + (uint32_t)below(100),
                        1 + (uint32_t)below(16), (uint32_t)(below(3) ? below(200) : 0),
                        below(2) ? TSR_LAYOUT_FLAT : 0};
        tsr_layout b = {0};
        tsr_layout_format(&a, buf, sizeof buf);
        CHECK_OK(tsr_layout_parse(buf, &b, &e));
        CHECK(memcmp(&a, &b, sizeof a) == 0, "round trip of '%s'", buf);
        uint32_t w = tsr_layout_size(&a);
        CHECK(w == a.pp * a.dp_replicate * a.dp_shard * a.tp, "size of %s", buf);
        uint32_t r = (uint32_t)below(w);
        tsr_coord c = tsr_layout_coord(&a, r);
        CHECK(tsr_layout_rank(&a, c) == r, "rank %u of %s: coord round trip", r, buf);
        CHECK(c.tp == r % a.tp && c.dp_shard == r / a.tp % a.dp_shard &&
              c.pp == r / (a.tp * a.dp_shard * a.dp_replicate), "coords of rank %u in %s", r, buf);
    }
}

/* ----------------------------------------------------------- range boxes */

static void range_cases(void) {
    uint64_t *idx = malloc(4096 * sizeof *idx);
    int *mark = malloc(4096 * sizeof *mark);
    for (int it = 0; it < 20000; it++) {
        tsr_box box;
        memset(&box, 0, sizeof box);
        box.ndim = (uint32_t)below(6);
        for (uint32_t d = 0; d < box.ndim; d++) {
            box.offset[d] = below(10);
            box.extent[d] = 1 + below(5);
        }
        uint64_t vol = tsr_box_volume(&box);
        uint64_t b = below(vol + 1), e = b + below(vol - b + 1);
        tsr_box out[2 * TSR_MAX_DIMS];
        size_t n = tsr_range_boxes(&box, b, e, out);
        size_t cap = box.ndim ? 2 * box.ndim - 1 : 1;
        CHECK(n <= cap, "%zu boxes for %u dims", n, box.ndim);
        CHECK((n == 0) == (b == e), "empty range gives %zu boxes", n);
        memset(mark, 0, vol * sizeof *mark);
        int64_t last = -1;
        for (size_t k = 0; k < n && k < cap; k++) {
            CHECK(out[k].ndim == box.ndim && tsr_box_contains(&box, &out[k]), "box %zu outside", k);
            CHECK(tsr_box_volume(&out[k]) > 0, "empty box %zu", k);
            size_t m = flat_indices(&out[k], &box, idx);
            for (size_t i = 0; i < m; i++) {
                mark[idx[i]]++;
                CHECK((int64_t)idx[i] > last, "box %zu not in row-major order", k);
            }
            for (size_t i = 0; i < m; i++) last = (int64_t)idx[i] > last ? (int64_t)idx[i] : last;
        }
        for (uint64_t i = 0; i < vol; i++)
            CHECK(mark[i] == (i >= b && i < e), "element %llu covered %d times, range [%llu, %llu)",
                  (unsigned long long)i, mark[i], (unsigned long long)b, (unsigned long long)e);
        if (check_failures > 20) break;
    }
    /* a range past the end is cut at the volume */
    tsr_box box = whole(2, (uint64_t[]){3, 4}), out[3];
    size_t n = tsr_range_boxes(&box, 10, 100, out);
    CHECK(n == 1 && out[0].offset[0] == 2 && out[0].offset[1] == 2 && out[0].extent[1] == 2,
          "range past the end: %zu boxes", n);
    free(idx);
    free(mark);
}

/* ---------------------------------------------------------- random layouts */

/* Independent reference: piece i of n cut into k by ceil division. */
static void ref_piece(uint64_t n, uint64_t k, uint64_t i, uint64_t *off, uint64_t *ext) {
    uint64_t c = (n + k - 1) / k;
    uint64_t lo = i * c < n ? i * c : n, hi = lo + c < n ? lo + c : n;
    *off = lo;
    *ext = hi - lo;
}

static int ref_stage_holds(const tsr_layout *l, const tsr_placement *p, uint32_t stage) {
    if (p->pp_role == TSR_PP_FIRST) return stage == 0;
    if (p->pp_role == TSR_PP_LAST) return stage == l->pp - 1;
    if (p->pp_role == TSR_PP_LAYER && l->pp > 1) {
        uint32_t per = (l->n_layers + l->pp - 1) / l->pp;
        return (uint32_t)p->layer >= stage * per && (uint32_t)p->layer < (stage + 1) * per;
    }
    return 1;
}

static tsr_box ref_tp_local(const tsr_layout *l, const tsr_tensor_decl *t, uint32_t tpc) {
    tsr_box b = whole(t->ndim, t->shape);
    if (t->placement.tp_dim >= 0)
        ref_piece(t->shape[t->placement.tp_dim], l->tp, tpc, &b.offset[t->placement.tp_dim],
                  &b.extent[t->placement.tp_dim]);
    return b;
}

/* Flat buffers are per (group, replication class): class bit 0 = replicated over
 * pp (TSR_PP_ALL), bit 1 = replicated over tp (tp_dim -1). */
typedef struct sorted_ref {
    const char *group, *name;
    unsigned cls;
    size_t i;
} sorted_ref;
static int cmp_sorted_ref(const void *a, const void *b) {
    const sorted_ref *x = a, *y = b;
    int c = strcmp(x->group, y->group);
    if (!c) c = (x->cls > y->cls) - (x->cls < y->cls);
    return c ? c : strcmp(x->name, y->name);
}

static const char *const group_names[3] = {"model", "optim", "extra"};

static void random_layouts(int iters) {
    enum { MAXT = 10, MAXE = 4096 };
    static int count[MAXT][MAXE], stamp[MAXT][MAXE];
    static uint64_t idx[MAXE];
    static char names[MAXT][32];
    for (int it = 0; it < iters && check_failures < 20; it++) {
        tsr_layout l;
        do {
            l = mk_layout(1 + (uint32_t)below(4), 1 + (uint32_t)below(4), 1 + (uint32_t)below(4),
                          1 + (uint32_t)below(4), 1 + (uint32_t)below(7), below(2) ? TSR_LAYOUT_FLAT : 0);
        } while (tsr_layout_size(&l) > 64);
        int flat = l.flags != 0;
        size_t n = below(MAXT + 1);
        tsr_tensor_decl t[MAXT];
        for (size_t i = 0; i < n; i++) {
            uint32_t nd = (uint32_t)below(5);
            uint64_t shape[TSR_MAX_DIMS];
            for (uint32_t d = 0; d < nd; d++) shape[d] = below(12) ? 1 + below(6) : 0;
            snprintf(names[i], sizeof names[i], "%c.%zu", (char)('a' + below(26)), i);
            int role = (int)below(4);
            t[i] = mk_tensor(names[i], below(4) ? group_names[below(3)] : NULL, nd, shape,
                             nd ? (int)below(nd + 1) - 1 : -1, (int)below(2), role,
                             role == TSR_PP_LAYER ? (int)below(l.n_layers) : -1);
        }
        uint32_t world = tsr_layout_size(&l);
        memset(count, 0, sizeof count);
        memset(stamp, 0, sizeof stamp);
        for (uint32_t r = 0; r < world; r++) {
            tsr_coord c = tsr_layout_coord(&l, r);
            tsr_rank_box *b;
            size_t m = boxes_of(&l, t, n, r, &b);
            /* flat reference: the start of each held tensor in its group's buffer on
             * this (stage, tp), and the chunk size of each group */
            uint64_t prefix[MAXT] = {0}, chunk_of[MAXT] = {0}, F_of[MAXT] = {0}, got_of[MAXT] = {0};
            size_t group_of[MAXT] = {0};
            if (flat) {
                sorted_ref s[MAXT];
                size_t k = 0;
                for (size_t i = 0; i < n; i++)
                    if (ref_stage_holds(&l, &t[i].placement, c.pp))
                        s[k++] = (sorted_ref){t[i].group ? t[i].group : "model", t[i].name,
                                              (t[i].placement.pp_role == TSR_PP_ALL ? 1u : 0u) |
                                                  (t[i].placement.tp_dim < 0 ? 2u : 0u),
                                              i};
                qsort(s, k, sizeof *s, cmp_sorted_ref);
                for (size_t g = 0, gi = 0; g < k; gi++) {
                    size_t h = g;
                    uint64_t F = 0;
                    for (; h < k && strcmp(s[h].group, s[g].group) == 0 && s[h].cls == s[g].cls; h++) {
                        tsr_box lb = ref_tp_local(&l, &t[s[h].i], c.tp);
                        prefix[s[h].i] = F;
                        group_of[s[h].i] = gi;
                        F += tsr_box_volume(&lb);
                    }
                    F_of[gi] = F;
                    chunk_of[gi] = (F + l.dp_shard - 1) / l.dp_shard;
                    g = h;
                }
            }
            for (size_t k = 0; k < m; k++) {
                uint32_t ti = b[k].tensor;
                REQUIRE(ti < n, "tensor index %u of %zu", ti, n);
                const tsr_tensor_decl *tt = &t[ti];
                CHECK(k == 0 || b[k - 1].tensor <= ti, "rank %u: boxes not in tensor order", r);
                CHECK(tsr_box_volume(&b[k].box) > 0, "rank %u: empty box", r);
                tsr_box full = whole(tt->ndim, tt->shape);
                REQUIRE(b[k].box.ndim == tt->ndim && tsr_box_contains(&full, &b[k].box),
                        "rank %u: box outside tensor %s", r, tt->name);
                CHECK(ref_stage_holds(&l, &tt->placement, c.pp), "rank %u holds %s of another stage",
                      r, tt->name);
                tsr_box local = ref_tp_local(&l, tt, c.tp);
                CHECK(tsr_box_contains(&local, &b[k].box), "rank %u: box of %s outside its TP piece",
                      r, tt->name);
                if (!flat) { /* exactly the reference box */
                    CHECK(k == 0 || b[k - 1].tensor != ti, "rank %u: two boxes of %s", r, tt->name);
                    tsr_box want = local;
                    int holds = 1;
                    if (tt->placement.fsdp) {
                        if (tt->ndim == 0) holds = c.dp_shard == 0;
                        else {
                            uint64_t off, ext;
                            ref_piece(local.extent[0], l.dp_shard, c.dp_shard, &off, &ext);
                            want.offset[0] += off;
                            want.extent[0] = ext;
                        }
                    }
                    CHECK(holds && tsr_box_contains(&want, &b[k].box) && tsr_box_contains(&b[k].box, &want),
                          "rank %u: box of %s differs from the reference", r, tt->name);
                }
                size_t ne = flat_indices(&b[k].box, &full, idx);
                size_t nl = 0;
                static uint64_t lidx[MAXE];
                if (flat) nl = flat_indices(&b[k].box, &local, lidx);
                for (size_t i = 0; i < ne; i++) {
                    count[ti][idx[i]]++;
                    CHECK(stamp[ti][idx[i]] != (int)r + 1, "rank %u holds element %llu of %s twice",
                          r, (unsigned long long)idx[i], tt->name);
                    stamp[ti][idx[i]] = (int)r + 1;
                    if (flat && i < nl) {
                        uint64_t p = prefix[ti] + lidx[i];
                        CHECK(p / chunk_of[group_of[ti]] == c.dp_shard,
                              "flat: rank %u (dp_shard %u) holds buffer position %llu of %s (chunk %llu)",
                              r, c.dp_shard, (unsigned long long)p, tt->name,
                              (unsigned long long)chunk_of[group_of[ti]]);
                    }
                }
                if (flat) got_of[group_of[ti]] += ne;
                /* row-major order within a tensor */
                if (k > 0 && b[k - 1].tensor == ti) {
                    uint64_t prev[MAXE];
                    size_t pn = flat_indices(&b[k - 1].box, &full, prev);
                    CHECK(pn && ne && prev[pn - 1] < idx[0], "rank %u: boxes of %s out of order", r,
                          tt->name);
                }
            }
            if (flat)
                for (size_t gi = 0; gi < MAXT; gi++) {
                    uint64_t F = F_of[gi], ch = chunk_of[gi];
                    uint64_t lo = ch * c.dp_shard < F ? ch * c.dp_shard : F;
                    uint64_t share = F - lo < ch ? F - lo : ch;
                    CHECK(got_of[gi] == share, "flat: rank %u holds %llu elements of group %zu, "
                          "share %llu", r, (unsigned long long)got_of[gi], gi, (unsigned long long)share);
                }
            free(b);
        }
        for (size_t i = 0; i < n; i++) {
            const tsr_placement *p = &t[i].placement;
            uint64_t rep = l.dp_replicate * (p->tp_dim == -1 ? l.tp : 1) *
                           (!p->fsdp && !flat ? l.dp_shard : 1) * (p->pp_role == TSR_PP_ALL ? l.pp : 1);
            tsr_box full = whole(t[i].ndim, t[i].shape);
            uint64_t vol = tsr_box_volume(&full);
            for (uint64_t k = 0; k < vol; k++)
                CHECK(count[i][k] == (int)rep, "%s: element %llu held %d times, want %llu (layout "
                      "%u,%u,%u,%u flat %d, tp_dim %d fsdp %d role %d)", t[i].name,
                      (unsigned long long)k, count[i][k], (unsigned long long)rep, l.pp,
                      l.dp_replicate, l.dp_shard, l.tp, flat, p->tp_dim, p->fsdp, p->pp_role);
        }
    }
}

int main(void) {
    const char *lng = getenv("TSR_LONG");
    hand_cases();
    error_cases();
    parse_cases();
    range_cases();
    random_layouts(lng && *lng ? 200000 : 3000);
    return check_done();
}
