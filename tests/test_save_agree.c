/* test_save_agree.c: a save call whose cached plan still holds waits for no
 * other rank; the ranks agree in the background, before anything is written.
 * Run alone, the program starts itself on 3 ranks under mpirun.
 *  1. the first save plans (every rank in the call) and commits;
 *  2. rank 2 reaches the second save 1.5 s late: the others' save calls return
 *     at once (they waited for it in the call before), and the save commits;
 *  3. rank 1 saves another layout (its rows in two boxes): its call refuses the
 *     save, the others' waits say why, nothing of the step is written;
 *  4. the next save plans again on every rank and commits;
 *  5. rank 2's state is invalid: its call says so, the others' waits too, and
 *     6. the save after it commits. Every committed step loads back exactly. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "common.h"
#include "tessera.h"

static tsr_error e;
enum { R = 96, C = 200, RANKS = 3, ROWS = R / RANKS };
static float w[ROWS * C]; /* this rank's rows of model.w */
static uint16_t h[C];     /* model.h, on every rank */
static uint64_t stepv;
static tsr_tensor_decl decls[2] = {
    {"model.w", "model", TSR_F32, 2, {R, C}, {-1, 1, TSR_PP_ALL, -1}},
    {"model.h", "model", TSR_BF16, 1, {C}, {-1, 0, TSR_PP_ALL, -1}},
};
static tsr_state_box sb[3];
static tsr_state_blob blob;

static float value(uint32_t rank, int seed, int i) {
    return (float)(((unsigned)i * 2654435761u + rank * 7919u + (unsigned)seed) % 10007) * 1e-4f;
}

/* This rank's state as of save `seed`; split: its rows of model.w in two boxes. */
static tsr_state state(uint32_t rank, int seed, int split) {
    for (int i = 0; i < ROWS * C; i++) w[i] = value(rank, seed, i);
    for (int i = 0; i < C; i++) h[i] = (uint16_t)(i * 31 + seed);
    stepv = (uint64_t)seed;
    sb[0] = (tsr_state_box){0, {2, {(uint64_t)rank * ROWS, 0}, {ROWS, C}}, w, TSR_MEM_HOST};
    sb[1] = (tsr_state_box){1, {1, {0}, {C}}, h, TSR_MEM_HOST};
    if (split) {
        sb[0].box.extent[0] = ROWS / 2;
        sb[2] = (tsr_state_box){0, {2, {(uint64_t)rank * ROWS + ROWS / 2, 0}, {ROWS - ROWS / 2, C}},
                                w + (size_t)(ROWS / 2) * C, TSR_MEM_HOST};
    }
    blob = (tsr_state_blob){"meta.step", -1, &stepv, sizeof stepv};
    return (tsr_state){decls, 2, sb, split ? 3 : 2, &blob, 1, {1, 1, RANKS, 1, 0, 0}};
}

/* Loads step_dir into fresh boxes of this rank and compares with save `seed`. */
static int loads(tsr_engine *eng, uint32_t rank, const char *step_dir, int seed) {
    static float lw[ROWS * C];
    uint16_t lh[C];
    memset(lw, 0, sizeof lw);
    tsr_state_box lb[2] = {{0, {2, {(uint64_t)rank * ROWS, 0}, {ROWS, C}}, lw, TSR_MEM_HOST},
                           {1, {1, {0}, {C}}, lh, TSR_MEM_HOST}};
    tsr_state st = {decls, 2, lb, 2, NULL, 0, {1, 1, RANKS, 1, 0, 0}};
    if (tsr_engine_load(eng, step_dir, &st, NULL, &e)) return 0;
    for (int i = 0; i < ROWS * C; i++)
        if (lw[i] != value(rank, seed, i)) return 0;
    for (int i = 0; i < C; i++)
        if (lh[i] != (uint16_t)(i * 31 + seed)) return 0;
    return 1;
}

/* Save `step`, which rank `odd` refuses in its call (its error holds `why_odd`)
 * and the others at their wait (theirs name the step and hold `why`); nothing of
 * the step is written. */
static void refused(tsr_engine *eng, tsr_comm *comm, const char *root, const tsr_state *st, int step, uint32_t odd,
                    const char *why_odd, const char *why) {
    uint32_t rank = tsr_comm_rank(comm);
    char name[64], dir[700];
    snprintf(name, sizeof name, "save of step %d", step);
    int rc = tsr_engine_save(eng, (uint64_t)step, st, &e);
    if (rank == odd) {
        CHECK(rc == TSR_EINVAL && strstr(e.msg, why_odd), "rank %u: the save call of step %d: %d: %s", rank, step,
              rc, e.msg);
    } else {
        CHECK(rc == 0, "rank %u: the save call of step %d waited for rank %u: %d: %s", rank, step, odd, rc, e.msg);
        rc = tsr_engine_wait(eng, &e);
        CHECK(rc == TSR_EINVAL && strstr(e.msg, name) && strstr(e.msg, why), "rank %u: step %d: %d: %s", rank, step,
              rc, e.msg);
    }
    tsr_comm_barrier(comm, NULL);
    snprintf(dir, sizeof dir, "%s/step-%08d", root, step);
    CHECK(access(dir, F_OK) != 0, "rank %u: %s exists: the refused save wrote", rank, dir);
}

/* Save `step` (the state as of save `step`), which commits and loads back. */
static void commits(tsr_engine *eng, tsr_comm *comm, const char *root, const tsr_state *st, int step) {
    uint32_t rank = tsr_comm_rank(comm);
    char dir[700];
    CHECK_OK(tsr_engine_save(eng, (uint64_t)step, st, &e));
    CHECK_OK(tsr_engine_wait(eng, &e));
    snprintf(dir, sizeof dir, "%s/step-%08d", root, step);
    CHECK(loads(eng, rank, dir, step), "rank %u: step %d does not load back: %s", rank, step, e.msg);
    tsr_comm_barrier(comm, NULL);
}

int main(void) {
    if (!getenv("OMPI_COMM_WORLD_SIZE") && !getenv("PMI_SIZE")) return check_mpi_relaunch("3", "120");
    tsr_comm *comm = tsr_comm_mpi_world(&e);
    REQUIRE(comm, "%s", e.msg);
    uint32_t rank = tsr_comm_rank(comm);
    REQUIRE(tsr_comm_size(comm) == RANKS, "run on %d ranks", RANKS);
    const char *t = getenv("TSR_TMP");
    char root[512], dir[700];
    snprintf(root, sizeof root, "%s/ckpt", t ? t : ".");
    if (rank == 0) /* a fresh root when run by hand twice */
        for (int s = 1; s <= 6; s++) {
            snprintf(dir, sizeof dir, "%s/step-%08d", root, s);
            tsr_remove_step_dir(dir, NULL);
        }
    tsr_comm_barrier(comm, NULL);
    tsr_engine_opts o = tsr_engine_opts_default();
    o.write.threads = 1;
    o.write.frame_bytes = 16384;
    o.keep_latest = 0;
    tsr_engine *eng = tsr_engine_new(root, comm, &o, &e);
    REQUIRE(eng, "%s", e.msg);

    /* 1: the first save plans */
    tsr_state st = state(rank, 1, 0);
    CHECK_OK(tsr_engine_save(eng, 1, &st, &e));
    CHECK_OK(tsr_engine_wait(eng, &e));

    /* 2: rank 2 comes 1.5 s late; the others' calls do not wait for it */
    tsr_comm_barrier(comm, NULL);
    if (rank == 2) usleep(1500000);
    st = state(rank, 2, 0);
    double t0 = tsr_now();
    CHECK_OK(tsr_engine_save(eng, 2, &st, &e));
    double call = tsr_now() - t0;
    if (rank != 2) CHECK(call < 0.5, "rank %u: the save call of step 2 took %.2f s: it waited for rank 2", rank, call);
    CHECK_OK(tsr_engine_wait(eng, &e));
    if (rank != 2) CHECK(tsr_now() - t0 >= 1.4, "rank %u: step 2 committed before rank 2 saved", rank);
    snprintf(dir, sizeof dir, "%s/step-00000002", root);
    CHECK(loads(eng, rank, dir, 2), "rank %u: step 2 does not load back: %s", rank, e.msg);
    tsr_comm_barrier(comm, NULL);

    /* 3: rank 1 alone saves another layout */
    st = state(rank, 3, rank == 1);
    refused(eng, comm, root, &st, 3, 1, "changed on some ranks only", "changed on some ranks only");

    /* 4: every rank plans again (rank 1 keeps its two boxes) */
    st = state(rank, 4, rank == 1);
    commits(eng, comm, root, &st, 4);

    /* 5: rank 2's state is invalid (its box outside the tensor) */
    st = state(rank, 5, rank == 1);
    if (rank == 2) sb[0].box.offset[0] = R;
    refused(eng, comm, root, &st, 5, 2, "model.w", "another rank's state is invalid");

    /* 6: the next save commits */
    st = state(rank, 6, rank == 1);
    commits(eng, comm, root, &st, 6);
    tsr_engine_free(eng);
    tsr_comm_free(comm);
    return check_done();
}
