/* test_data_plane.c: the data plane's typed collectives (comm/data_plane.h). Run
 * alone, the program checks the group of one rank, then starts itself on 3
 * ranks under mpirun. On 3 ranks: all-reduce of f32, f64 and bf16 (bf16 summed
 * in f32: 256 + 1 + 1 is 258, which bf16 additions in turn would round to 256);
 * all-gatherv with uneven and empty parts, out of place and in place; the
 * even all-gather; reduce-scatterv with uneven and empty parts in f32 and bf16;
 * the even reduce-scatter; send and receive around the ring; every rank's
 * results equal bit for bit; and the errors: a dtype the plane does not carry,
 * and a stream on a build without devices. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "casts.h"
#include "check.h"
#include "common.h"
#include "data_plane.h"
#include "tessera.h"

static tsr_error e;
enum { RANKS = 3, N = 1000 };
/* uneven parts of the variable-count collectives: rank 1's is empty */
static const size_t counts[RANKS] = {7, 0, 5};

/* rank r's element i: small integers, exact in bf16 and in every sum */
static float val(uint32_t r, size_t i) { return (float)((i * 7 + r * 13) % 31) - 15.0f; }

/* 1 if every rank of c holds the same n bytes at p. */
static int same_everywhere(tsr_comm *c, const void *p, size_t n) {
    uint8_t *all = NULL;
    size_t *cnt = NULL;
    int ok = tsr_comm_allgatherv(c, p, n, &all, &cnt, &e) == 0;
    for (uint32_t r = 0; ok && r < tsr_comm_size(c); r++) ok = cnt[r] == n && !memcmp(all + r * n, p, n);
    free(all), free(cnt);
    return ok;
}

static void allreduce(tsr_comm *c, uint32_t me, uint32_t n) {
    static float f[N];
    static double d[N];
    static uint16_t h[N];
    for (size_t i = 0; i < N; i++) f[i] = val(me, i), d[i] = val(me, i) * 0.5, h[i] = tsr_f32_to_bf16(val(me, i));
    CHECK_OK(tsr_data_allreduce_sum(c, TSR_F32, f, N, NULL, &e));
    CHECK_OK(tsr_data_allreduce_sum(c, TSR_F64, d, N, NULL, &e));
    CHECK_OK(tsr_data_allreduce_sum(c, TSR_BF16, h, N, NULL, &e));
    int bad = 0;
    for (size_t i = 0; i < N; i++) {
        float want = 0;
        for (uint32_t r = 0; r < n; r++) want += val(r, i);
        bad += f[i] != want || d[i] != want * 0.5 || tsr_bf16_to_f32(h[i]) != want;
    }
    CHECK(bad == 0, "%d of %d all-reduced elements wrong", bad, N);
    CHECK(same_everywhere(c, f, sizeof f) && same_everywhere(c, d, sizeof d) && same_everywhere(c, h, sizeof h),
          "ranks disagree after all-reduce");
    /* bf16 sums in f32, rounded once */
    uint16_t x = tsr_f32_to_bf16(me == 0 ? 256.0f : 1.0f);
    CHECK_OK(tsr_data_allreduce_sum(c, TSR_BF16, &x, 1, NULL, &e));
    CHECK(tsr_bf16_to_f32(x) == 256.0f + (float)(n - 1), "bf16 256 + 1 + 1 is %g", tsr_bf16_to_f32(x));
}

static void allgather(tsr_comm *c, uint32_t me) {
    size_t off = 0, total = 0;
    for (uint32_t r = 0; r < RANKS; r++) off += r < me ? counts[r] : 0, total += counts[r];
    float mine[8], out[16], inplace[16];
    uint16_t hm[8], hout[16];
    for (size_t i = 0; i < counts[me]; i++) mine[i] = val(me, i), hm[i] = tsr_f32_to_bf16(val(me, i));
    memset(inplace, 0, sizeof inplace);
    memcpy(inplace + off, mine, counts[me] * sizeof *mine);
    CHECK_OK(tsr_data_allgatherv(c, TSR_F32, mine, out, counts, NULL, &e));
    CHECK_OK(tsr_data_allgatherv(c, TSR_F32, inplace + off, inplace, counts, NULL, &e));
    CHECK_OK(tsr_data_allgatherv(c, TSR_BF16, hm, hout, counts, NULL, &e));
    int bad = 0;
    for (uint32_t r = 0, k = 0; r < RANKS; r++)
        for (size_t i = 0; i < counts[r]; i++, k++)
            bad += out[k] != val(r, i) || inplace[k] != val(r, i) || hout[k] != tsr_f32_to_bf16(val(r, i));
    CHECK(bad == 0 && total == 12, "%d of %zu gathered elements wrong", bad, total);
    /* even: 4 from each rank */
    float ev[4 * RANKS];
    for (size_t i = 0; i < 4; i++) mine[i] = val(me, i);
    CHECK_OK(tsr_data_allgather(c, TSR_F32, mine, ev, 4, NULL, &e));
    bad = 0;
    for (uint32_t r = 0; r < RANKS; r++)
        for (size_t i = 0; i < 4; i++) bad += ev[r * 4 + i] != val(r, i);
    CHECK(bad == 0, "%d of %d all-gathered elements wrong", bad, 4 * RANKS);
}

static void reduce_scatter(tsr_comm *c, uint32_t me) {
    enum { TOT = 12 };
    float send[TOT], recv[8];
    uint16_t hs[TOT], hr[8];
    for (size_t i = 0; i < TOT; i++) send[i] = val(me, i), hs[i] = tsr_f32_to_bf16(val(me, i));
    CHECK_OK(tsr_data_reduce_scatterv(c, TSR_F32, send, recv, counts, NULL, &e));
    CHECK_OK(tsr_data_reduce_scatterv(c, TSR_BF16, hs, hr, counts, NULL, &e));
    size_t off = 0;
    for (uint32_t r = 0; r < me; r++) off += counts[r];
    int bad = 0;
    for (size_t i = 0; i < counts[me]; i++) {
        float want = 0;
        for (uint32_t r = 0; r < RANKS; r++) want += val(r, off + i);
        bad += recv[i] != want || tsr_bf16_to_f32(hr[i]) != want;
    }
    CHECK(bad == 0, "rank %u: %d of %zu reduce-scattered elements wrong", me, bad, counts[me]);
    /* even: 4 for each rank, in f64 */
    double dsend[4 * RANKS], drecv[4];
    for (size_t i = 0; i < 4 * RANKS; i++) dsend[i] = val(me, i);
    CHECK_OK(tsr_data_reduce_scatter(c, TSR_F64, dsend, drecv, 4, NULL, &e));
    bad = 0;
    for (size_t i = 0; i < 4; i++) {
        double want = 0;
        for (uint32_t r = 0; r < RANKS; r++) want += val(r, me * 4 + i);
        bad += drecv[i] != want;
    }
    CHECK(bad == 0, "rank %u: %d of 4 reduce-scattered f64 wrong", me, bad);
}

/* Each rank sends to the next around the ring and receives from the previous. */
static void ring(tsr_comm *c, uint32_t me) {
    float out[N], in[N];
    uint16_t hout[N], hin[N];
    for (size_t i = 0; i < N; i++) out[i] = val(me, i), hout[i] = tsr_f32_to_bf16(val(me, i) * 3);
    tsr_comm_reqs *pending = tsr_comm_reqs_new();
    REQUIRE(pending, "out of memory");
    uint32_t next = (me + 1) % RANKS, prev = (me + RANKS - 1) % RANKS;
    CHECK_OK(tsr_data_send(c, next, 5, TSR_F32, out, N, pending, NULL, &e));
    CHECK_OK(tsr_data_send(c, next, 5, TSR_BF16, hout, N, pending, NULL, &e));
    CHECK_OK(tsr_data_recv(c, prev, 5, TSR_F32, in, N, NULL, &e));
    CHECK_OK(tsr_data_recv(c, prev, 5, TSR_BF16, hin, N, NULL, &e));
    CHECK_OK(tsr_data_wait(c, pending, NULL, &e));
    int bad = 0;
    for (size_t i = 0; i < N; i++) bad += in[i] != val(prev, i) || hin[i] != tsr_f32_to_bf16(val(prev, i) * 3);
    CHECK(bad == 0, "rank %u: %d of %d received elements wrong", me, bad, N);
    tsr_comm_reqs_free(pending);
}

/* What the plane refuses, on any group. */
static void refusals(tsr_comm *c) {
    int32_t iv[4] = {1, 2, 3, 4};
    float f[4] = {0};
    CHECK(tsr_data_allreduce_sum(c, TSR_I32, iv, 4, NULL, &e) == TSR_EINVAL && strstr(e.msg, "i32"),
          "an i32 all-reduce: %s", e.msg);
    CHECK(iv[0] == 1, "a refused all-reduce changed its buffer");
    tsr_stream *s = (tsr_stream *)(uintptr_t)1; /* never dereferenced: refused first */
    CHECK(tsr_data_allreduce_sum(c, TSR_F32, f, 4, s, &e) == TSR_EINVAL && strstr(e.msg, "stream"),
          "a stream on a host build: %s", e.msg);
    CHECK(tsr_data_allgatherv(c, TSR_F16, f, f, counts, NULL, &e) == TSR_EINVAL, "f16 all-gather accepted");
}

/* The group of one rank: every collective is the rank's own data. */
static void self(void) {
    tsr_comm *c = tsr_comm_self();
    REQUIRE(c, "out of memory");
    float f[4] = {1.5f, -2, 3, 4}, g[4] = {0};
    uint16_t h[2] = {tsr_f32_to_bf16(1.5f), tsr_f32_to_bf16(-3)};
    size_t one[1] = {4};
    CHECK_OK(tsr_data_allreduce_sum(c, TSR_F32, f, 4, NULL, &e));
    CHECK_OK(tsr_data_allreduce_sum(c, TSR_BF16, h, 2, NULL, &e));
    CHECK(f[0] == 1.5f && tsr_bf16_to_f32(h[1]) == -3, "a sum over one rank changed the data");
    CHECK_OK(tsr_data_allgatherv(c, TSR_F32, f, g, one, NULL, &e));
    CHECK(!memcmp(f, g, sizeof f), "all-gather over one rank");
    memset(g, 0, sizeof g);
    CHECK_OK(tsr_data_reduce_scatterv(c, TSR_F32, f, g, one, NULL, &e));
    CHECK(!memcmp(f, g, sizeof f), "reduce-scatter over one rank");
    tsr_comm_reqs *pending = tsr_comm_reqs_new();
    CHECK(tsr_data_send(c, 0, 1, TSR_F32, f, 4, pending, NULL, &e) == TSR_EINVAL, "send on one rank accepted");
    tsr_comm_reqs_free(pending);
    refusals(c);
    tsr_comm_free(c);
}

/* Run alone: the same program on RANKS ranks (as tests/mpi.sh runs MPI jobs). */
static int relaunch(void) { return check_mpi_relaunch("3", "120"); }

int main(void) {
    if (!getenv("OMPI_COMM_WORLD_SIZE") && !getenv("PMI_SIZE")) {
        self();
        return check_failures ? check_done() : relaunch();
    }
    tsr_comm *c = tsr_comm_mpi_world(&e);
    REQUIRE(c, "%s", e.msg);
    REQUIRE(tsr_comm_size(c) == RANKS, "run on %d ranks", RANKS);
    uint32_t me = tsr_comm_rank(c);
    allreduce(c, me, RANKS);
    allgather(c, me);
    reduce_scatter(c, me);
    ring(c, me);
    refusals(c);
    /* the ranks of this job run on one node (a device's binding is by this rank) */
    uint32_t nr = 99, ns = 0;
    CHECK_OK(tsr_comm_node_rank(c, &nr, &ns, &e));
    CHECK(nr == me && ns == RANKS, "node rank %u of %u, not %u of %d", nr, ns, me, RANKS);
    tsr_comm_free(c);
    return check_done();
}
