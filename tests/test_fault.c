/* test_fault.c: storage faults (tsr_fault_set: the Nth write, fsync, rename or
 * queued fdatasync fails with ENOSPC or EIO, or a write lands short) during a save: the caller sees an
 * error that names the file, its buffers are untouched, abort leaves no partial
 * files and no MANIFEST, and the earlier checkpoint still verifies. Each fault runs
 * in a child process so that its fault counter starts at zero. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "store.h"
#include "tessera.h"

static tsr_error e;
enum { ROWS = 64, COLS = 256 };
static float state[ROWS * COLS];

/* Saves `state` into dir. @return the first failing call's status, 0 if none. */
static int save(const char *dir, char *msg, size_t msglen) {
    tsr_write_opts o = tsr_write_opts_default();
    o.frame_bytes = 8192; /* 8 frames */
    o.threads = 2;
    e = (tsr_error){0};
    tsr_save *s = tsr_save_begin(dir, 0, NULL, &o, &e);
    int rc = s ? 0 : e.code;
    uint64_t shape[2] = {ROWS, COLS};
    tsr_box b = {2, {0, 0}, {ROWS, COLS}};
    if (!rc) rc = tsr_save_tensor(s, "model.w", NULL, TSR_F32, 2, shape, NULL, &e);
    if (!rc) rc = tsr_save_box(s, "model.w", &b, state, &e);
    if (!rc) rc = tsr_save_blob(s, "meta", -1, "x", 1, &e);
    if (!rc) rc = tsr_save_finish(s, NULL, NULL, &e);
    if (!rc) rc = tsr_save_commit(s, NULL, NULL, 0, 2, NULL, &e);
    if (rc && s) tsr_save_abort(s);
    tsr_save_free(s);
    snprintf(msg, msglen, "%s", e.msg);
    return rc;
}

static int verifies(const char *dir) {
    tsr_ckpt *ck = tsr_ckpt_open(dir, &e);
    if (!ck) return 0;
    long n = tsr_ckpt_verify(ck, NULL, NULL, 1, &e);
    float back[ROWS * COLS];
    tsr_box b = {2, {0, 0}, {ROWS, COLS}};
    int ok = n == 0 && tsr_ckpt_read(ck, 0, &b, back, &e) == 0 && memcmp(back, state, sizeof back) == 0;
    tsr_ckpt_close(ck);
    return ok;
}

int main(void) {
    const char *t = getenv("TSR_TMP");
    char base[512], good[600];
    snprintf(base, sizeof base, "%s", t ? t : "/tmp/tessera-fault");
    snprintf(good, sizeof good, "%s/step-00000001", base);
    for (int i = 0; i < ROWS * COLS; i++) state[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
    char msg[TSR_ERROR_MSG];
    REQUIRE(save(good, msg, sizeof msg) == 0, "the good save: %s", msg);
    REQUIRE(verifies(good), "the good checkpoint verifies");

    /* data file: header + 8 frames + blob = 10 writes; MANIFEST: 1 write */
    const char *specs[] = {"write:%d:ENOSPC", "write:%d:EIO", "write:%d:short", "fsync:%d:EIO", "fsync:%d:ENOSPC",
                           "rename:%d:EIO"};
    int faults = 0;
    for (size_t si = 0; si < sizeof specs / sizeof specs[0]; si++) {
        int max = strncmp(specs[si], "write", 5) == 0 ? 11 : strncmp(specs[si], "fsync", 5) == 0 ? 3 : 1;
        for (int n = 1; n <= max; n++) {
            char spec[64], dir[700];
            snprintf(spec, sizeof spec, specs[si], n);
            snprintf(dir, sizeof dir, "%s/step-%08d", base, 100 + faults++);
            pid_t pid = fork();
            REQUIRE(pid >= 0, "fork");
            if (pid == 0) {
                tsr_fault_set(spec, NULL);
                float before[ROWS * COLS];
                memcpy(before, state, sizeof before);
                int rc = save(dir, msg, sizeof msg);
                tsr_fault_set(NULL, NULL);
                if (rc == 0) {
                    fprintf(stderr, "%s: the save succeeded\n", spec);
                    _exit(1);
                }
                if (!strstr(msg, dir) && !strstr(msg, "data-00000.tsd") && !strstr(msg, "MANIFEST")) {
                    fprintf(stderr, "%s: error does not name the file: %s\n", spec, msg);
                    _exit(1);
                }
                if (memcmp(before, state, sizeof before) != 0) {
                    fprintf(stderr, "%s: the caller's state changed\n", spec);
                    _exit(1);
                }
                _exit(0);
            }
            int status;
            waitpid(pid, &status, 0);
            CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: child failed", spec);
            char f[800];
            snprintf(f, sizeof f, "%s/MANIFEST", dir);
            CHECK(access(f, F_OK) != 0, "%s: a MANIFEST exists after a failed save", spec);
            snprintf(f, sizeof f, "%s/MANIFEST.tmp", dir);
            CHECK(access(f, F_OK) != 0, "%s: MANIFEST.tmp left behind", spec);
            snprintf(f, sizeof f, "%s/data-00000.tsd", dir);
            CHECK(access(f, F_OK) != 0, "%s: partial data file left behind", spec);
            CHECK(!tsr_ckpt_is_committed(dir), "%s: listed as committed", spec);
            CHECK(verifies(good), "%s: the earlier checkpoint no longer verifies", spec);
        }
    }
    /* the fdatasyncs queued while a data file is written (one per 4 MiB): 12 MiB
     * of incompressible bytes, stored as they are, queue at least one */
    static uint8_t noise[12 << 20];
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < sizeof noise; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        noise[i] = (uint8_t)(x >> 32);
    }
    const char *dspecs[] = {"datasync:1:EIO", "datasync:1:ENOSPC"};
    for (size_t si = 0; si < 2; si++) {
        char dir[700];
        snprintf(dir, sizeof dir, "%s/step-%08d", base, 500 + (int)si);
        pid_t pid = fork();
        REQUIRE(pid >= 0, "fork");
        if (pid == 0) {
            tsr_fault_set(dspecs[si], NULL);
            tsr_write_opts o = tsr_write_opts_default();
            o.threads = 2;
            tsr_save *s = tsr_save_begin(dir, 0, NULL, &o, &e);
            uint64_t shape[1] = {sizeof noise};
            tsr_box b = {1, {0}, {sizeof noise}};
            int rc = s ? 0 : e.code;
            if (!rc) rc = tsr_save_tensor(s, "noise", NULL, TSR_U8, 1, shape, NULL, &e);
            if (!rc) rc = tsr_save_box(s, "noise", &b, noise, &e);
            if (!rc) rc = tsr_save_finish(s, NULL, NULL, &e);
            if (!rc) rc = tsr_save_commit(s, NULL, NULL, 0, 2, NULL, &e);
            if (rc && s) tsr_save_abort(s);
            tsr_save_free(s);
            int want = si == 0 ? TSR_EIO : TSR_ENOSPC;
            if (rc != want || !strstr(e.msg, "fdatasync") || !strstr(e.msg, "data-00000.tsd")) {
                fprintf(stderr, "%s: status %d (want %d), message: %s\n", dspecs[si], rc, want, e.msg);
                _exit(1);
            }
            _exit(0);
        }
        int status;
        waitpid(pid, &status, 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: child failed", dspecs[si]);
        char f[800];
        snprintf(f, sizeof f, "%s/data-00000.tsd", dir);
        CHECK(access(f, F_OK) != 0, "%s: partial data file left behind", dspecs[si]);
        CHECK(!tsr_ckpt_is_committed(dir), "%s: listed as committed", dspecs[si]);
        CHECK(verifies(good), "%s: the earlier checkpoint no longer verifies", dspecs[si]);
        faults++;
    }

    /* a fault past the last call changes nothing */
    char dir[700];
    snprintf(dir, sizeof dir, "%s/step-00000999", base);
    tsr_fault_set("write:1000:EIO", NULL);
    CHECK(save(dir, msg, sizeof msg) == 0 && verifies(dir), "no fault reached: %s", msg);
    tsr_fault_set(NULL, NULL);
    if (!check_failures) printf("%d injected faults, each reported and cleaned up\n", faults);
    return check_done();
}
