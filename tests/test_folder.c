/* test_folder.c: the engine's checkpoint folder on one rank. The folder lock:
 * a second engine with lock_root on a held folder fails with TSR_EBUSY naming
 * this process, and works once the first is freed; a tool's lock for a step
 * directory is its parent's, and a directory not named step-N gets no lock file
 * in its parent. Room before a save: retention of committed steps beyond
 * keep_latest and removal of every uncommitted step directory, also when the
 * save then fails, and never the newest committed step. Rewinding: after
 * tsr_engine_continue_from(4) the next save moves the committed steps after 4
 * aside (here step 5, saved again at once); they are listed as abandoned and not as steps, and retention leaves
 * them alone. Recycling (the local tier's engine): retention keeps each
 * dropped step's data file in ROOT/spare, and the next save writes over that
 * very file (the same inode), cut to its new size when the state shrank; every
 * step read back holds its own values. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "tessera.h"

static tsr_error e;
static float w[64];
static uint64_t stepv;
static tsr_tensor_decl decls[1] = {{"model.w", "model", TSR_F32, 1, {64}, {-1, 0, TSR_PP_ALL, -1}}};
static tsr_state_box sb = {0, {1, {0}, {64}}, w, TSR_MEM_HOST};
static tsr_state_blob blob = {"meta.step", -1, &stepv, sizeof stepv};

static int save(tsr_engine *eng, uint64_t step) {
    tsr_state st = {decls, 1, &sb, 1, &blob, 1, {1, 1, 1, 1, 0, 0}};
    stepv = step;
    for (int i = 0; i < 64; i++) w[i] = (float)(i + step);
    int rc = tsr_engine_save(eng, step, &st, &e);
    return rc ? rc : tsr_engine_wait(eng, &e);
}

/* A save of a tensor of n floats (at most 16384), i + step each. */
static float big[16384];
static int save_n(tsr_engine *eng, uint64_t step, uint32_t n) {
    tsr_tensor_decl d = {"model.big", "model", TSR_F32, 1, {n}, {-1, 0, TSR_PP_ALL, -1}};
    tsr_state_box b = {0, {1, {0}, {n}}, big, TSR_MEM_HOST};
    tsr_state st = {&d, 1, &b, 1, &blob, 1, {1, 1, 1, 1, 0, 0}};
    stepv = step;
    for (uint32_t i = 0; i < n; i++) big[i] = (float)(i + step);
    int rc = tsr_engine_save(eng, step, &st, &e);
    return rc ? rc : tsr_engine_wait(eng, &e);
}

static int exists(const char *root, const char *name) {
    char p[1024];
    struct stat s;
    snprintf(p, sizeof p, "%s/%s", root, name);
    return stat(p, &s) == 0;
}

/* A fake leftover of a failed save: a step directory with a data file, no MANIFEST. */
static void leftover(const char *root, const char *name) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", root, name);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/%s/data-00000.tsd", root, name);
    FILE *f = fopen(p, "w");
    if (f) fputs("partial", f), fclose(f);
}

static size_t count(const char *root, int abandoned, uint64_t *steps) {
    tsr_step_info *v = NULL;
    size_t n = 0;
    if ((abandoned ? tsr_list_abandoned_steps : tsr_list_steps)(root, &v, &n)) return (size_t)-1;
    for (size_t i = 0; i < n && steps; i++) steps[i] = v[i].step;
    free(v);
    return n;
}

int main(void) {
    const char *t = getenv("TSR_TMP");
    char root[512], path[700];
    snprintf(root, sizeof root, "%s/folder", t ? t : "/tmp/tessera-folder");
    tsr_comm *comm = tsr_comm_self();
    tsr_engine_opts o = tsr_engine_opts_default();
    o.keep_latest = 0;
    o.write.threads = 1;
    o.sync = 1;
    o.lock_root = 1;

    /* the lock */
    tsr_engine *eng = tsr_engine_new(root, comm, &o, &e);
    REQUIRE(eng, "%s", e.msg);
    tsr_engine *second = tsr_engine_new(root, comm, &o, &e);
    char pid[32];
    snprintf(pid, sizeof pid, "pid %ld,", (long)getpid());
    CHECK(!second && e.code == TSR_EBUSY && strstr(e.msg, pid) && strstr(e.msg, "another writer"),
          "a second writer of a held folder: %s", second ? "started" : e.msg);
    tsr_engine_free(second);
    tsr_folder_lock *l = NULL;
    snprintf(path, sizeof path, "%s/step-00000077", root);
    CHECK(tsr_folder_lock_for_ckpt(path, &l, &e) == TSR_EBUSY && !l, "a tool writing a step of a held folder: %s", e.msg);
    o.lock_root = 0; /* a reader takes no lock */
    second = tsr_engine_new(root, comm, &o, &e);
    CHECK(second != NULL, "an engine without lock_root on a held folder: %s", e.msg);
    tsr_engine_free(second);
    o.lock_root = 1;

    /* room before a save: committed 1, 2, 3 and leftovers 0 and 9 */
    for (uint64_t s = 1; s <= 3; s++) CHECK(save(eng, s) == 0, "save %llu: %s", (unsigned long long)s, e.msg);
    tsr_engine_free(eng);
    leftover(root, "step-00000000");
    leftover(root, "step-00000009");
    o.keep_latest = 1;
    eng = tsr_engine_new(root, comm, &o, &e);
    REQUIRE(eng, "the lock is free again once its engine is freed: %s", e.msg);
    /* a file where step 4's directory would go: the save fails after the room is made */
    snprintf(path, sizeof path, "%s/step-00000004", root);
    FILE *f = fopen(path, "w");
    REQUIRE(f, "%s", path);
    fclose(f);
    CHECK(save(eng, 4) != 0, "a save into a file failed");
    unlink(path);
    uint64_t steps[16];
    size_t n = count(root, 0, steps);
    CHECK(n == 1 && steps[0] == 3, "before a failed save: only the newest committed step left, %zu steps (first %llu)",
          n, n ? (unsigned long long)steps[0] : 0ull);
    CHECK(!exists(root, "step-00000000") && !exists(root, "step-00000009"), "leftovers removed before the save");
    CHECK(save(eng, 4) == 0 && save(eng, 5) == 0, "saves after the room was made: %s", e.msg);
    n = count(root, 0, steps);
    CHECK(n == 1 && steps[0] == 5, "keep_latest 1 after saves 4 and 5: %zu steps", n);

    /* rewinding to step 4 of a folder that holds 5: the next save moves 5 aside */
    tsr_engine_continue_from(eng, 4);
    CHECK(save(eng, 5) == 0, "the first save after a rewind to 4, of step 5: %s", e.msg);
    n = count(root, 1, steps);
    CHECK(n == 1 && steps[0] == 5, "one abandoned step (5): %zu", n);
    uint64_t latest = 0;
    CHECK(tsr_latest_step(root, &latest, NULL, 0) == 0 && latest == 5, "the latest step is the new 5");
    tsr_step_info *v = NULL;
    size_t na = 0;
    REQUIRE(tsr_list_abandoned_steps(root, &v, &na) == 0 && na == 1, "abandoned list");
    CHECK(strncmp(v[0].name, "step-00000005.abandoned-", 24) == 0 && v[0].committed, "abandoned name %s", v[0].name);
    snprintf(path, sizeof path, "%s/%s", root, v[0].name);
    free(v);
    tsr_ckpt *ck = tsr_ckpt_open(path, &e);
    CHECK(ck && tsr_ckpt_verify(ck, NULL, NULL, 1, &e) == 0, "the abandoned step still verifies: %s", e.msg);
    tsr_ckpt_close(ck);
    CHECK(save(eng, 6) == 0 && save(eng, 7) == 0, "saves after the rewind: %s", e.msg);
    CHECK(count(root, 1, NULL) == 1 && count(root, 0, NULL) == 1, "retention keeps 1 step and the abandoned one");
    tsr_engine_free(eng);

    /* recycling: a dropped step's data file is written over by the next save */
    char rroot[600], spare[700];
    snprintf(rroot, sizeof rroot, "%s/recycle", t ? t : "/tmp/tessera-folder");
    snprintf(spare, sizeof spare, "%s/spare/data-00000.tsd", rroot);
    tsr_engine_opts ro = tsr_engine_opts_default();
    ro.keep_latest = 2;
    ro.write.threads = 1;
    ro.write.codec = TSR_CODEC_RAW;
    ro.sync = 1;
    ro.recycle = 1;
    eng = tsr_engine_new(rroot, comm, &ro, &e);
    REQUIRE(eng, "%s", e.msg);
    CHECK(save_n(eng, 1, 16384) == 0 && save_n(eng, 2, 16384) == 0, "recycle: saves 1 and 2: %s", e.msg);
    struct stat s1, s2;
    CHECK(stat(spare, &s1) != 0, "recycle: no spare before retention dropped a step");
    CHECK(save_n(eng, 3, 16384) == 0, "recycle: save 3: %s", e.msg);
    REQUIRE(stat(spare, &s1) == 0, "recycle: step 1's data file kept in spare/");
    CHECK(!exists(rroot, "step-00000001") && count(rroot, 0, NULL) == 2, "recycle: step 1 dropped, 2 steps kept");
    CHECK(save_n(eng, 4, 1000) == 0, "recycle: save 4, smaller: %s", e.msg); /* the spare is cut to size */
    snprintf(path, sizeof path, "%s/step-00000004/data-00000.tsd", rroot);
    CHECK(stat(path, &s2) == 0 && s2.st_ino == s1.st_ino, "recycle: step 4 wrote over step 1's file (inode %lu, %lu)",
          (unsigned long)s2.st_ino, (unsigned long)s1.st_ino);
    CHECK(s2.st_size < s1.st_size, "recycle: cut to its size: %lld bytes, the spare %lld", (long long)s2.st_size,
          (long long)s1.st_size);
    for (uint64_t step = 3; step <= 4; step++) {
        snprintf(path, sizeof path, "%s/step-%08llu", rroot, (unsigned long long)step);
        ck = tsr_ckpt_open(path, &e);
        static float back[16384];
        tsr_box want = {1, {0}, {step == 3 ? 16384u : 1000u}};
        int ok = ck && tsr_ckpt_verify(ck, NULL, NULL, 1, &e) == 0 && tsr_ckpt_read(ck, 0, &want, back, &e) == 0;
        for (uint32_t i = 0; ok && i < want.extent[0]; i++) ok = back[i] == (float)(i + step);
        CHECK(ok, "recycle: step %llu verifies and holds its values: %s", (unsigned long long)step, e.msg);
        tsr_ckpt_close(ck);
    }
    tsr_engine_free(eng);

    /* a directory not named step-N: no lock file appears in its parent */
    snprintf(path, sizeof path, "%s/plain", t ? t : "/tmp/tessera-folder");
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/plain/out", t ? t : "/tmp/tessera-folder");
    CHECK(tsr_folder_lock_for_ckpt(path, &l, &e) == 0 && !l, "an unheld parent of a plain directory: %s", e.msg);
    snprintf(path, sizeof path, "%s/plain", t ? t : "/tmp/tessera-folder");
    CHECK(!exists(path, "LOCK"), "no lock file in the parent of a plain directory");
    tsr_comm_free(comm);
    return check_done();
}
