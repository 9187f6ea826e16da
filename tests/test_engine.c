/* test_engine.c: the checkpoint engine on one rank: asynchronous saves return
 * after staging and may be overwritten at once; at most one save is in flight;
 * poll and wait report completion; retention keeps the newest K; a load fills
 * boxes of any shape; a mismatched checkpoint is refused before any data is read;
 * storage faults during a background save are reported, leave no files and no
 * MANIFEST, and leave earlier checkpoints and the caller's state intact; with
 * overlap_staging the copy runs after save returns and the state may change once
 * tsr_engine_staged has returned; tsr_engine_prepare plans ahead and makes
 * room. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "load_fault.h"
#include "mem.h"
#include "store.h"
#include "tessera.h"

static tsr_error e;
enum { R = 96, C = 200 };
static float w[R * C];
static uint16_t h[C];
static tsr_tensor_decl decls[2] = {
    {"model.w", "model", TSR_F32, 2, {R, C}, {0, 1, TSR_PP_ALL, -1}},
    {"model.h", "model", TSR_BF16, 1, {C}, {-1, 0, TSR_PP_ALL, -1}},
};

static void fill(int seed) {
    for (int i = 0; i < R * C; i++) w[i] = (float)((i * 2654435761u + (unsigned)seed) % 10007) * 1e-4f;
    for (int i = 0; i < C; i++) h[i] = (uint16_t)(i * 31 + seed);
}

static tsr_state whole_state(tsr_state_box *sb, tsr_state_blob *blob, const uint64_t *stepv) {
    sb[0] = (tsr_state_box){0, {2, {0, 0}, {R, C}}, w, TSR_MEM_HOST};
    sb[1] = (tsr_state_box){1, {1, {0}, {C}}, h, TSR_MEM_HOST};
    *blob = (tsr_state_blob){"meta.step", -1, stepv, sizeof *stepv};
    return (tsr_state){decls, 2, sb, 2, blob, 1, {1, 1, 1, 1, 0, 0}};
}

/* Loads step_dir into a 3x2 grid of boxes of model.w and all of model.h, and
 * compares with the arrays as filled by fill(seed). */
static int load_matches(tsr_engine *eng, const char *step_dir, int seed) {
    float *parts[6];
    tsr_state_box sb[7];
    int k = 0;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++, k++) {
            tsr_box b = {2, {(uint64_t)i * 32, (uint64_t)j * 100}, {32, 100}};
            parts[k] = calloc(32 * 100, sizeof(float));
            sb[k] = (tsr_state_box){0, b, parts[k], TSR_MEM_HOST};
        }
    uint16_t hh[C];
    sb[6] = (tsr_state_box){1, {1, {0}, {C}}, hh, TSR_MEM_HOST};
    tsr_state st = {decls, 2, sb, 7, NULL, 0, {1, 1, 1, 1, 0, 0}};
    tsr_ckpt *ck = NULL;
    int rc = tsr_engine_load(eng, step_dir, &st, &ck, &e);
    fill(seed);
    int ok = rc == 0;
    for (k = 0; ok && k < 6; k++)
        for (uint64_t r = 0; r < 32; r++)
            for (uint64_t c = 0; c < 100; c++)
                if (parts[k][r * 100 + c] != w[(sb[k].box.offset[0] + r) * C + sb[k].box.offset[1] + c]) ok = 0;
    if (ok && memcmp(hh, h, sizeof hh) != 0) ok = 0;
    if (ok) {
        long b = tsr_ckpt_find_blob(ck, "meta.step", -1);
        ok = b >= 0;
    }
    tsr_ckpt_close(ck);
    for (k = 0; k < 6; k++) free(parts[k]);
    return ok;
}

/* A decoder gone wrong (ENGINE_FAULT_DECODE: a bit of every decoded frame
 * flipped, the stored bytes sound): a whole load's digest check, which stands
 * in for the decoded frames' checksums, refuses it and the re-read with every
 * checksum names the frame; a load of part of a tensor, which no digest can
 * check, computes the decoded frames' checksums and names it at once. */
static void decoded_wrong(tsr_engine *eng, const char *root) {
    char dir[700];
    snprintf(dir, sizeof dir, "%s/step-00000030", root);
    tsr_ckpt *ck = tsr_ckpt_open(dir, &e);
    REQUIRE(ck, "%s", e.msg);
    size_t coded = 0;
    for (size_t i = 0; i < tsr_ckpt_n_frames(ck); i++) {
        tsr_frame_info fi;
        CHECK_OK(tsr_ckpt_frame(ck, i, &fi));
        coded += fi.codec != TSR_CODEC_RAW;
    }
    tsr_ckpt_close(ck);
    REQUIRE(coded > 0, "step 30 has no encoded frame to decode wrong");
    engine_set_fault_load(ENGINE_FAULT_DECODE);
    CHECK(!load_matches(eng, dir, 3) && strstr(e.msg, "the digest check refused") &&
              strstr(e.msg, "read again with every checksum") && strstr(e.msg, "checksum mismatch (decoded bytes)"),
          "a whole load decoded wrong: %s", e.msg);
    float *half = calloc((size_t)R / 2 * C, sizeof *half);
    REQUIRE(half, "out of memory");
    tsr_state_box hb = {0, {2, {0, 0}, {R / 2, C}}, half, TSR_MEM_HOST};
    tsr_state st = {decls, 2, &hb, 1, NULL, 0, {1, 1, 1, 1, 0, 0}};
    CHECK(tsr_engine_load(eng, dir, &st, NULL, &e) == TSR_ECORRUPT && !strstr(e.msg, "digest") &&
              strstr(e.msg, "checksum mismatch (decoded bytes)"),
          "a part of model.w decoded wrong: %s", e.msg);
    engine_set_fault_load(0);
    CHECK_OK(tsr_engine_load(eng, dir, &st, NULL, &e));
    free(half);
}

/* A deferred copy that overlaps the writes of the boxes already copied: on a
 * store slower than the copy (a rate limit), the caller is released (staged)
 * while the writes go on; the frames written while the copy ran are stored raw,
 * their checksums computed at the end; the later ones adaptively. The step holds
 * exactly the state of its save call, verifies and loads back. */
static void pipelined_save(const char *root, tsr_comm *comm) {
    enum { NT = 6, ROWS = 512, COLS = 2048 };
    uint64_t shape[2] = {ROWS, COLS};
    tsr_tensor_decl d[NT];
    tsr_state_box sb[NT];
    char names[NT][16];
    uint16_t *data[NT], *back = malloc((size_t)ROWS * COLS * 2);
    REQUIRE(back, "out of memory");
    for (int i = 0; i < NT; i++) {
        snprintf(names[i], sizeof names[i], "p.%d", i);
        d[i] = (tsr_tensor_decl){names[i], "model", TSR_BF16, 2, {ROWS, COLS}, {-1, 1, TSR_PP_ALL, -1}};
        data[i] = aligned_alloc(4096, (size_t)ROWS * COLS * 2);
        REQUIRE(data[i], "out of memory");
        tsr_box all = {2, {0, 0}, {ROWS, COLS}};
        tsr_synth_fill(names[i], TSR_BF16, 2, shape, &all, data[i]);
        sb[i] = (tsr_state_box){(uint32_t)i, all, data[i], TSR_MEM_HOST};
    }
    tsr_state st = {d, NT, sb, NT, NULL, 0, {1, 1, 1, 1, 0, 0}};
    char dir[700];
    snprintf(dir, sizeof dir, "%s-pipelined", root);
    tsr_engine_opts o = tsr_engine_opts_default();
    o.overlap_staging = 1;
    o.write.frame_bytes = 256 << 10; /* 8 frames a box, 48 in all */
    /* one thread: the copy's pieces are the writer's to run (no worker takes them
     * ahead), so the first box's frames are written while later boxes wait for
     * their copy, whatever the timing: the raw, late-checksummed path is taken */
    o.write.threads = 1;
    REQUIRE(tsr_fault_set("rate:60:write", &e) == 0, "%s", e.msg); /* 12 MiB: about 0.2 s */
    tsr_engine *eng = tsr_engine_new(dir, comm, &o, &e);
    REQUIRE(eng, "%s", e.msg);
    CHECK_OK(tsr_engine_save(eng, 7, &st, &e));
    tsr_engine_staged(eng);
    int done = 1;
    tsr_engine_poll(eng, &done, &e);
    CHECK(!done, "the copy released the caller while the writes went on");
    for (int i = 0; i < NT; i++) /* the optimizer step */
        for (size_t k = 0; k < (size_t)ROWS * COLS; k++) data[i][k] ^= 0x5a5a;
    CHECK_OK(tsr_engine_wait(eng, &e));
    tsr_fault_set(NULL, NULL);
    snprintf(dir, sizeof dir, "%s-pipelined/step-00000007", root);
    tsr_ckpt *ck = tsr_ckpt_open(dir, &e);
    REQUIRE(ck, "%s", e.msg);
    CHECK(tsr_ckpt_verify(ck, NULL, NULL, 1, &e) == 0, "the pipelined save verifies: %s", e.msg);
    size_t raw = 0;
    for (size_t i = 0; i < tsr_ckpt_n_frames(ck); i++) {
        tsr_frame_info fi;
        CHECK_OK(tsr_ckpt_frame(ck, i, &fi));
        raw += fi.codec == TSR_CODEC_RAW;
    }
    CHECK(tsr_ckpt_n_frames(ck) == NT * 8 && raw > 0, "%zu frames, %zu raw (those written while the copy ran)",
          tsr_ckpt_n_frames(ck), raw);
    for (int i = 0; i < NT; i++) {
        tsr_box all = {2, {0, 0}, {ROWS, COLS}};
        long ti = tsr_ckpt_find(ck, names[i]);
        CHECK(ti >= 0 && tsr_ckpt_read(ck, (size_t)ti, &all, back, &e) == 0, "read %s: %s", names[i], e.msg);
        for (size_t k = 0; k < (size_t)ROWS * COLS; k++) back[k] ^= 0x5a5a;
        CHECK(memcmp(back, data[i], (size_t)ROWS * COLS * 2) == 0, "%s holds the state of its save call", names[i]);
        free(data[i]);
    }
    tsr_ckpt_close(ck);
    tsr_engine_free(eng);
    free(back);
}

int main(void) {
    const char *t = getenv("TSR_TMP");
    char root[512];
    snprintf(root, sizeof root, "%s/engine", t ? t : "/tmp/tessera-engine");
    tsr_comm *comm = tsr_comm_self();
    tsr_engine_opts o = tsr_engine_opts_default();
    o.keep_latest = 2;
    o.write.frame_bytes = 16384;
    o.write.threads = 2;
    tsr_engine *eng = tsr_engine_new(root, comm, &o, &e);
    REQUIRE(eng, "%s", e.msg);

    /* Three async saves; the state changes right after each returns. */
    tsr_state_box sb[2];
    tsr_state_blob blob;
    uint64_t stepv;
    for (int s = 1; s <= 3; s++) {
        fill(s);
        stepv = (uint64_t)s;
        tsr_state st = whole_state(sb, &blob, &stepv);
        CHECK_OK(tsr_engine_save(eng, (uint64_t)s * 10, &st, &e));
        fill(1000 + s); /* scribble over the state: the save must not see it */
        stepv = 999;
    }
    int done = 0;
    tsr_engine_poll(eng, &done, &e);
    CHECK_OK(tsr_engine_wait(eng, &e));
    CHECK(tsr_engine_poll(eng, &done, &e) == 0 && done, "idle after wait");
    uint64_t latest;
    char dir[700];
    CHECK(tsr_latest_step(root, &latest, dir, sizeof dir) == 0 && latest == 30, "latest step %llu", (unsigned long long)latest);
    snprintf(dir, sizeof dir, "%s/step-00000010", root);
    CHECK(access(dir, F_OK) != 0, "retention removed step 10 (keep 2)");
    snprintf(dir, sizeof dir, "%s/step-00000020", root);
    CHECK(load_matches(eng, dir, 2), "step 20 holds the state as it was at its save");
    CHECK(load_matches(eng, NULL, 3), "the newest (step 30) holds state 3: %s", e.msg);
    decoded_wrong(eng, root);

    /* overlap_staging: save returns before the copy, which overlaps what the
     * caller does next; once tsr_engine_staged returns, the state may change
     * (a training loop's optimizer step) and the save still holds the old. */
    {
        char root2[600];
        snprintf(root2, sizeof root2, "%s-overlap", root);
        tsr_engine_opts o2 = o;
        o2.overlap_staging = 1;
        tsr_engine *e2 = tsr_engine_new(root2, comm, &o2, &e);
        REQUIRE(e2, "%s", e.msg);
        /* planned before the first save, which then finds its plan made; the
         * room that save would make is made now: a leftover of an interrupted
         * save goes */
        char left[700];
        snprintf(left, sizeof left, "%s/step-00000005", root2);
        mkdir(root2, 0755);
        REQUIRE(mkdir(left, 0755) == 0, "mkdir %s", left);
        snprintf(left, sizeof left, "%s/step-00000005/data-00000.tsd", root2);
        FILE *lf = fopen(left, "w");
        REQUIRE(lf && fputs("partial", lf) >= 0 && fclose(lf) == 0, "%s", left);
        fill(1);
        stepv = 1;
        tsr_state pst = whole_state(sb, &blob, &stepv);
        CHECK_OK(tsr_engine_prepare(e2, &pst, &e));
        CHECK(access(left, F_OK) != 0, "prepare removed the interrupted save's leftover %s", left);
        tsr_state_box wrong = {0, {2, {R, 0}, {1, C}}, w, TSR_MEM_HOST};
        tsr_state wst = {decls, 2, &wrong, 1, NULL, 0, {1, 1, 1, 1, 0, 0}};
        CHECK(tsr_engine_prepare(e2, &wst, &e) == TSR_EINVAL, "prepare refuses a box outside its tensor");
        CHECK_OK(tsr_engine_prepare(e2, &pst, &e));
        for (int s = 1; s <= 3; s++) {
            fill(s);
            stepv = (uint64_t)s;
            tsr_state st2 = whole_state(sb, &blob, &stepv);
            CHECK_OK(tsr_engine_save(e2, (uint64_t)s * 10, &st2, &e));
            stepv = 999; /* blobs are copied before save returns */
            tsr_engine_staged(e2);
            fill(2000 + s); /* the optimizer step */
        }
        CHECK_OK(tsr_engine_wait(e2, &e));
        snprintf(dir, sizeof dir, "%s/step-00000020", root2);
        CHECK(load_matches(e2, dir, 2), "overlapped: step 20 holds the state as it was at its save");
        CHECK(load_matches(e2, NULL, 3), "overlapped: step 30 holds state 3: %s", e.msg);
        tsr_engine_staged(e2); /* nothing in flight: returns at once */
        tsr_engine_free(e2);
    }

    /* A save while one is in flight waits for it. */
    fill(4);
    stepv = 4;
    tsr_state st = whole_state(sb, &blob, &stepv);
    CHECK_OK(tsr_engine_save(eng, 40, &st, &e));
    CHECK_OK(tsr_engine_save(eng, 50, &st, &e));
    CHECK(tsr_engine_last_wait(eng) >= 0 && tsr_engine_last_stall(eng) >= tsr_engine_last_wait(eng), "wait reported");
    CHECK_OK(tsr_engine_wait(eng, &e));

    /* Saving into a committed step fails in the background and changes nothing. */
    CHECK_OK(tsr_engine_save(eng, 50, &st, &e));
    CHECK(tsr_engine_wait(eng, &e) == TSR_EINVAL && strstr(e.msg, "already"), "second save of step 50: %s", e.msg);
    CHECK(load_matches(eng, NULL, 4), "step 50 intact");

    /* Mismatched tensors are refused before reading. */
    tsr_tensor_decl other[1] = {{"model.w", "model", TSR_F32, 2, {R, C + 1}, {0, 1, TSR_PP_ALL, -1}}};
    float dummy[4];
    tsr_state_box ob = {0, {2, {0, 0}, {1, 1}}, dummy, TSR_MEM_HOST};
    tsr_state bad = {other, 1, &ob, 1, NULL, 0, {1, 1, 1, 1, 0, 0}};
    CHECK(tsr_engine_load(eng, NULL, &bad, NULL, &e) == TSR_EINVAL && strstr(e.msg, "model.w"), "shape mismatch: %s", e.msg);
    tsr_tensor_decl missing[1] = {{"model.nope", "model", TSR_F32, 1, {4}, {-1, 0, TSR_PP_ALL, -1}}};
    tsr_state_box mb = {0, {1, {0}, {4}}, dummy, TSR_MEM_HOST};
    tsr_state miss = {missing, 1, &mb, 1, NULL, 0, {1, 1, 1, 1, 0, 0}};
    CHECK(tsr_engine_load(eng, NULL, &miss, NULL, &e) == TSR_ENOTFOUND && strstr(e.msg, "model.nope"), "missing tensor: %s", e.msg);
    tsr_state_box outside = {0, {2, {R, 0}, {1, C}}, dummy, TSR_MEM_HOST};
    tsr_state outs = {decls, 2, &outside, 1, NULL, 0, {1, 1, 1, 1, 0, 0}};
    CHECK(tsr_engine_save(eng, 60, &outs, &e) == TSR_EINVAL, "a box outside its tensor is refused at once");

    /* A box in device memory: loaded through host memory where this build holds
     * it; refused, naming the tensor and the kind, where it does not. */
    tsr_state_box db = {1, {1, {0}, {C}}, h, TSR_MEM_CUDA};
    tsr_state dst = {decls, 2, &db, 1, NULL, 0, {1, 1, 1, 1, 0, 0}};
    tsr_error ue = {0};
    if (tsr_mem_usable(TSR_MEM_CUDA, &ue) != 0) {
        CHECK(tsr_engine_load(eng, NULL, &dst, NULL, &e) == TSR_EINVAL && strstr(e.msg, "model.h") &&
                  strstr(e.msg, "cuda memory"), "a device box without a device: %s", e.msg);
        CHECK(tsr_engine_save(eng, 60, &dst, &e) == TSR_EINVAL && strstr(e.msg, "cuda memory"),
              "a device box without a device is not saved: %s", e.msg);
        fill(4);
        CHECK(load_matches(eng, NULL, 4), "the refusals changed nothing");
    }
    tsr_engine_free(eng);

    /* Faults in the background save, each in a child with a fresh fault counter. */
    const char *faults[] = {"write:1:EIO", "write:3:ENOSPC", "write:4:short", "fsync:1:EIO", "fsync:2:EIO", "rename:1:EIO"};
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++) {
        pid_t pid = fork();
        REQUIRE(pid >= 0, "fork");
        if (pid == 0) {
            tsr_engine_opts co = o;
            co.keep_latest = 0; /* keep everything: step 50 must survive */
            tsr_engine *ce = tsr_engine_new(root, comm, &co, &e);
            if (!ce) _exit(2);
            fill(7);
            float before[R * C];
            memcpy(before, w, sizeof before);
            uint64_t sv = 7;
            tsr_state_box csb[2];
            tsr_state_blob cb;
            tsr_state cst = whole_state(csb, &cb, &sv);
            tsr_fault_set(faults[i], NULL);
            int rc = tsr_engine_save(ce, 70 + i, &cst, &e);
            if (rc) _exit(3); /* staging itself must not fail */
            rc = tsr_engine_wait(ce, &e);
            tsr_fault_set(NULL, NULL);
            if (rc == 0) _exit(4);
            if (!strstr(e.msg, "step-000000")) _exit(5); /* the error names the step directory */
            if (memcmp(before, w, sizeof before)) _exit(6);
            /* the engine still works after a failure */
            if (tsr_engine_save(ce, 90 + i, &cst, &e) || tsr_engine_wait(ce, &e)) _exit(7);
            tsr_engine_free(ce);
            _exit(0);
        }
        int status;
        waitpid(pid, &status, 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: child exit %d", faults[i], WEXITSTATUS(status));
        char f[800];
        snprintf(f, sizeof f, "%s/step-%08zu", root, 70 + i);
        CHECK(!tsr_ckpt_is_committed(f), "%s: failed step listed as committed", faults[i]);
        snprintf(f, sizeof f, "%s/step-%08zu/data-00000.tsd", root, 70 + i);
        CHECK(access(f, F_OK) != 0, "%s: partial data file left", faults[i]);
    }
    /* earlier checkpoints still verify */
    eng = tsr_engine_new(root, comm, &o, &e);
    REQUIRE(eng, "%s", e.msg);
    snprintf(dir, sizeof dir, "%s/step-00000050", root);
    tsr_ckpt *ck = tsr_ckpt_open(dir, &e);
    CHECK(ck && tsr_ckpt_verify(ck, NULL, NULL, 1, &e) == 0, "step 50 verifies after the faults");
    tsr_ckpt_close(ck);
    tsr_engine_free(eng);
    pipelined_save(root, comm);
    tsr_comm_free(comm);
    return check_done();
}
