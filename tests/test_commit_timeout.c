/* test_commit_timeout.c: a rank that does not reach the commit of a save fails
 * the save instead of hanging it. Run alone, the program starts itself on 3
 * ranks under mpirun. Step 1 commits; then, with TSR_COMMIT_TIMEOUT=1 and rank 2
 * reporting 4 s late (its data file's fsync delayed by the fault-injecting
 * store, tsr_fault_set), the save of step 2 fails on every rank within a few
 * seconds naming rank 2, leaves no MANIFEST and no data file, step 1 still
 * loads and verifies, and the next save fails at once. Then with rank 0 late,
 * the others give up after twice the timeout naming rank 0 and keep their data
 * files, so that what rank 0 commits still loads.
 * The job then ends: MPI_Finalize does not hang on the late messages. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "common.h"
#include "store.h"
#include "tessera.h"

static tsr_error e;
enum { R = 96, C = 200, RANKS = 3, ROWS = R / RANKS };
static float w[ROWS * C]; /* this rank's rows of model.w */
static uint16_t h[C];     /* model.h, on every rank (written once) */
static uint64_t stepv;
static tsr_tensor_decl decls[2] = {
    {"model.w", "model", TSR_F32, 2, {R, C}, {-1, 1, TSR_PP_ALL, -1}},
    {"model.h", "model", TSR_BF16, 1, {C}, {-1, 0, TSR_PP_ALL, -1}},
};
static tsr_state_box sb[2];
static tsr_state_blob blob;

static float value(uint32_t rank, int seed, int i) {
    return (float)(((unsigned)i * 2654435761u + rank * 7919u + (unsigned)seed) % 10007) * 1e-4f;
}

/* This rank's state as of save `seed`. */
static tsr_state state(uint32_t rank, int seed) {
    for (int i = 0; i < ROWS * C; i++) w[i] = value(rank, seed, i);
    for (int i = 0; i < C; i++) h[i] = (uint16_t)(i * 31 + seed);
    stepv = (uint64_t)seed;
    sb[0] = (tsr_state_box){0, {2, {(uint64_t)rank * ROWS, 0}, {ROWS, C}}, w, TSR_MEM_HOST};
    sb[1] = (tsr_state_box){1, {1, {0}, {C}}, h, TSR_MEM_HOST};
    blob = (tsr_state_blob){"meta.step", -1, &stepv, sizeof stepv};
    return (tsr_state){decls, 2, sb, 2, &blob, 1, {1, 1, RANKS, 1, 0, 0}};
}

/* Loads step_dir into fresh boxes of this rank and compares with save `seed`. */
static int loads(tsr_engine *eng, uint32_t rank, const char *step_dir, int seed) {
    static float lw[ROWS * C];
    uint16_t lh[C];
    memset(lw, 0, sizeof lw);
    tsr_state_box lb[2] = {{0, {2, {(uint64_t)rank * ROWS, 0}, {ROWS, C}}, lw, TSR_MEM_HOST}, {1, {1, {0}, {C}}, lh, TSR_MEM_HOST}};
    tsr_state st = {decls, 2, lb, 2, NULL, 0, {1, 1, RANKS, 1, 0, 0}};
    if (tsr_engine_load(eng, step_dir, &st, NULL, &e)) return 0;
    for (int i = 0; i < ROWS * C; i++)
        if (lw[i] != value(rank, seed, i)) return 0;
    for (int i = 0; i < C; i++)
        if (lh[i] != (uint16_t)(i * 31 + seed)) return 0;
    return 1;
}

static int verifies(const char *dir) {
    tsr_ckpt *ck = tsr_ckpt_open(dir, &e);
    int ok = ck && tsr_ckpt_verify(ck, NULL, NULL, 1, &e) == 0;
    tsr_ckpt_close(ck);
    return ok;
}

/* Run alone: the same program on RANKS ranks (as tests/mpi.sh runs MPI jobs). */
static int relaunch(void) {
    unsetenv("TSR_COMMIT_TIMEOUT");
    return check_mpi_relaunch("3", "120");
}

int main(void) {
    if (!getenv("OMPI_COMM_WORLD_SIZE") && !getenv("PMI_SIZE")) return relaunch();
    tsr_comm *comm = tsr_comm_mpi_world(&e);
    REQUIRE(comm, "%s", e.msg);
    uint32_t rank = tsr_comm_rank(comm);
    REQUIRE(tsr_comm_size(comm) == RANKS, "run on %d ranks", RANKS);
    const char *t = getenv("TSR_TMP");
    char root[512], dir[700];
    snprintf(root, sizeof root, "%s/ckpt", t ? t : ".");
    if (rank == 0) { /* a fresh root when run by hand twice */
        for (int s = 1; s <= 4; s++) {
            snprintf(dir, sizeof dir, "%s/step-%08d", root, s);
            tsr_remove_step_dir(dir, NULL);
        }
    }
    tsr_comm_barrier_idle(comm, NULL); /* the sleeping barrier too (bench load waits in it) */
    tsr_engine_opts o = tsr_engine_opts_default();
    CHECK(o.commit_timeout_s == 1800, "default commit timeout %g s", o.commit_timeout_s);
    o.write.threads = 1;
    o.write.frame_bytes = 16384;

    /* step 1 commits as always */
    tsr_engine *eng = tsr_engine_new(root, comm, &o, &e);
    REQUIRE(eng, "%s", e.msg);
    tsr_state st = state(rank, 1);
    CHECK_OK(tsr_engine_save(eng, 1, &st, &e));
    CHECK_OK(tsr_engine_wait(eng, &e));
    tsr_engine_free(eng);

    /* step 2: rank 2 reports 4 s late; rank 0 gives up after 1 s and tells all */
    setenv("TSR_COMMIT_TIMEOUT", "1", 1);
    tsr_fault_set("delay:4000000:fsync:step-00000002/data-00002", NULL);
    eng = tsr_engine_new(root, comm, &o, &e);
    REQUIRE(eng, "%s", e.msg);
    st = state(rank, 2);
    double t0 = tsr_now();
    CHECK_OK(tsr_engine_save(eng, 2, &st, &e));
    int rc = tsr_engine_wait(eng, &e);
    double dt = tsr_now() - t0;
    fprintf(stderr, "rank %u: step 2 after %.1f s: %s\n", rank, dt, e.msg);
    CHECK(rc == TSR_EIO, "step 2 on rank %u: status %d: %s", rank, rc, e.msg);
    CHECK(strstr(e.msg, "save of step 2 ") && strstr(e.msg, "rank 2 did not report within 1.0 s"),
          "rank %u: the error names the step, rank 2 and the timeout: %s", rank, e.msg);
    if (rank == 2) CHECK(dt >= 3.9 && dt < 8, "rank 2 hears the verdict after its delay: %.1f s", dt);
    else CHECK(dt < 3.5, "rank %u waited %.1f s, not the 1 s timeout", rank, dt);
    tsr_comm_barrier(comm, NULL);
    if (rank == 0) {
        snprintf(dir, sizeof dir, "%s/step-00000002", root);
        CHECK(!tsr_ckpt_is_committed(dir), "step 2 committed");
        for (int r = 0; r < RANKS; r++) {
            char f[800];
            snprintf(f, sizeof f, "%s/data-%05d.tsd", dir, r);
            CHECK(access(f, F_OK) != 0, "%s left behind", f);
        }
        uint64_t latest = 0;
        CHECK(tsr_latest_step(root, &latest, NULL, 0) == 0 && latest == 1, "latest committed step %llu",
              (unsigned long long)latest);
        snprintf(dir, sizeof dir, "%s/step-00000001", root);
        CHECK(verifies(dir), "step 1 verifies: %s", e.msg);
    }
    /* the engine refuses to save again, at once and on every rank */
    t0 = tsr_now();
    st = state(rank, 3);
    rc = tsr_engine_save(eng, 3, &st, &e);
    CHECK(rc == TSR_EIO && strstr(e.msg, "an earlier commit timed out") && strstr(e.msg, "cannot save until restarted"),
          "rank %u: save after a timeout: %d: %s", rank, rc, e.msg);
    CHECK(tsr_now() - t0 < 2, "rank %u: the refusal took %.1f s", rank, tsr_now() - t0);
    snprintf(dir, sizeof dir, "%s/step-00000001", root);
    CHECK(loads(eng, rank, dir, 1), "rank %u: step 1 loads after the timeout: %s", rank, e.msg);
    tsr_engine_free(eng);

    /* step 4: rank 0 reports 4 s late; the others give up after 2 s, naming it,
     * and keep their files: rank 0 finds every report and commits */
    tsr_fault_set("delay:4000000:fsync:step-00000004/data-00000", NULL);
    eng = tsr_engine_new(root, comm, &o, &e);
    REQUIRE(eng, "%s", e.msg);
    st = state(rank, 4);
    t0 = tsr_now();
    CHECK_OK(tsr_engine_save(eng, 4, &st, &e));
    e = (tsr_error){0};
    rc = tsr_engine_wait(eng, &e);
    dt = tsr_now() - t0;
    fprintf(stderr, "rank %u: step 4 after %.1f s: %s\n", rank, dt, rc ? e.msg : "committed");
    if (rank == 0) {
        CHECK(rc == 0 && dt >= 3.9, "rank 0 commits step 4 after its delay: %.1f s: %s", dt, e.msg);
    } else {
        CHECK(rc == TSR_EIO && strstr(e.msg, "save of step 4 ") && strstr(e.msg, "rank 0 did not answer within 2.0 s"),
              "rank %u: %d: %s", rank, rc, e.msg);
        CHECK(dt >= 1.9 && dt < 3.9, "rank %u gave up after %.1f s, not twice the timeout", rank, dt);
    }
    tsr_comm_barrier(comm, NULL);
    snprintf(dir, sizeof dir, "%s/step-00000004", root);
    if (rank == 0) CHECK(verifies(dir), "step 4 verifies: %s", e.msg);
    CHECK(loads(eng, rank, dir, 4), "rank %u: step 4 loads: %s", rank, e.msg);
    /* a broken engine refuses in the save call; rank 0's is not broken, and its
     * save call exchanges nothing (its plan holds): its background learns from
     * the others before writing anything, and the wait says so */
    rc = tsr_engine_save(eng, 5, &st, &e);
    if (rank == 0) {
        CHECK(rc == 0, "rank 0: the save call of step 5 waited for the others: %d: %s", rc, e.msg);
        rc = tsr_engine_wait(eng, &e);
    }
    CHECK(rc == TSR_EIO && strstr(e.msg, rank ? "an earlier commit timed out;" : "timed out on another rank"),
          "rank %u: save after a timeout: %d: %s", rank, rc, e.msg);
    if (rank == 0) {
        snprintf(dir, sizeof dir, "%s/step-00000005", root);
        CHECK(access(dir, F_OK) != 0, "rank 0 began step 5 although the others refused it");
    }
    tsr_engine_free(eng);
    tsr_comm_free(comm); /* MPI_Finalize, with late messages unreceived */
    return check_done();
}
