/* test_fault.c: storage faults (the fault-injecting store, tsr_fault_set: the
 * Nth write, fsync, rename or queued fdatasync fails with ENOSPC or EIO, or a
 * write lands short) during a save: the caller sees an error that names the
 * file, its buffers are untouched, abort leaves no partial files and no
 * MANIFEST, and the earlier checkpoint still verifies. A fault one call past the
 * last of its operation changes nothing, which pins down the calls each store
 * makes. Each fault runs in a child process, so that a failure in one cannot
 * touch the next. A store wrapped with a spec of its own (tsr_store_fault_wrap)
 * counts its own calls, and specs that do not parse are refused. Specs and
 * outages set for a location hold there and below only.
 *
 * test_fault [LOCATION]: saves under LOCATION, a directory ($TSR_TMP by default)
 * or s3://bucket/prefix: the same cases run against the POSIX store and, from
 * tests/test_fault_s3.sh, against the S3 store. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "common.h"
#include "store.h"
#include "tessera.h"

static tsr_error e;
enum { ROWS = 64, COLS = 256 };
static float state[ROWS * COLS];
/* the fdatasyncs queued while a data file is written (one per 4 MiB): 12 MiB
 * of incompressible bytes, stored as they are, queue at least one */
static uint8_t noise[12 << 20];

/* Saves `state` (or `noise`) into dir. @return the first failing call's status,
 * 0 if none; its message in e. */
static int save(const char *dir, int with_noise) {
    tsr_write_opts o = tsr_write_opts_default();
    if (!with_noise) o.frame_bytes = 8192; /* 8 frames */
    o.threads = 2;
    o.encode_share = 1; /* the same files whatever the timing (adaptive encoding would vary them) */
    e = (tsr_error){0};
    tsr_save *s = tsr_save_begin(dir, 0, NULL, &o, &e);
    int rc = s ? 0 : e.code;
    uint64_t shape[2] = {ROWS, COLS}, nshape[1] = {sizeof noise};
    tsr_box b = {2, {0, 0}, {ROWS, COLS}}, nb = {1, {0}, {sizeof noise}};
    if (with_noise) {
        if (!rc) rc = tsr_save_tensor(s, "noise", NULL, TSR_U8, 1, nshape, NULL, &e);
        if (!rc) rc = tsr_save_box(s, "noise", &nb, noise, &e);
    } else {
        if (!rc) rc = tsr_save_tensor(s, "model.w", NULL, TSR_F32, 2, shape, NULL, &e);
        if (!rc) rc = tsr_save_box(s, "model.w", &b, state, &e);
        if (!rc) rc = tsr_save_blob(s, "meta", -1, "x", 1, &e);
    }
    if (!rc) rc = tsr_save_finish(s, NULL, NULL, &e);
    if (!rc) rc = tsr_save_commit(s, NULL, NULL, 0, 2, NULL, &e);
    if (rc && s) tsr_save_abort(s);
    tsr_save_free(s);
    return rc;
}

static int verifies(const char *dir) {
    tsr_ckpt *ck = tsr_ckpt_open(dir, &e);
    if (!ck) return 0;
    long n = tsr_ckpt_verify(ck, NULL, NULL, 1, &e);
    static float back[ROWS * COLS];
    tsr_box b = {2, {0, 0}, {ROWS, COLS}};
    int ok = n == 0 && tsr_ckpt_read(ck, 0, &b, back, &e) == 0 && memcmp(back, state, sizeof back) == 0;
    tsr_ckpt_close(ck);
    return ok;
}

/* 1 when the store at dir holds `name`. */
static int holds(const char *dir, const char *name) {
    tsr_store *st = tsr_store_open(dir, 0, NULL);
    int yes = st && tsr_store_exists(st, name, NULL) == 1;
    tsr_store_close(st);
    return yes;
}

/* What a case expects: the save fails (with `code` and `text` in its message
 * when set), or, with fails 0, succeeds. */
typedef struct expect {
    int fails, code;
    const char *text;
} expect;

/* The child's side: the save under `spec`. @return its exit status. */
static int child(const char *spec, const char *dir, int with_noise, expect x) {
    if (tsr_fault_set(spec, &e)) {
        fprintf(stderr, "%s: %s\n", spec, e.msg);
        return 1;
    }
    static float before[ROWS * COLS];
    memcpy(before, state, sizeof before);
    int rc = save(dir, with_noise);
    tsr_fault_set(NULL, NULL);
    if (!x.fails) {
        if (rc || (!with_noise && !verifies(dir))) {
            fprintf(stderr, "%s: a fault that should not be reached: %s\n", spec, e.msg);
            return 1;
        }
        return 0;
    }
    if (rc == 0) {
        fprintf(stderr, "%s: the save succeeded\n", spec);
        return 1;
    }
    if (!strstr(e.msg, dir) && !strstr(e.msg, "data-00000.tsd") && !strstr(e.msg, "MANIFEST")) {
        fprintf(stderr, "%s: error does not name the file: %s\n", spec, e.msg);
        return 1;
    }
    if ((x.code && rc != x.code) || (x.text && !strstr(e.msg, x.text))) {
        fprintf(stderr, "%s: status %d (want %d), message: %s\n", spec, rc, x.code, e.msg);
        return 1;
    }
    if (memcmp(before, state, sizeof before) != 0) {
        fprintf(stderr, "%s: the caller's state changed\n", spec);
        return 1;
    }
    return 0;
}

/* One fault: the save of dir under `spec` in a child, then what it left. */
static void fault_case(const char *spec, const char *dir, const char *good, int with_noise, expect x) {
    fflush(NULL);
    pid_t pid = fork();
    REQUIRE(pid >= 0, "fork");
    if (pid == 0) _exit(child(spec, dir, with_noise, x));
    int status;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: child failed", spec);
    if (x.fails) {
        CHECK(!holds(dir, "MANIFEST"), "%s: a MANIFEST exists after a failed save", spec);
        CHECK(!holds(dir, "MANIFEST.tmp"), "%s: MANIFEST.tmp left behind", spec);
        CHECK(!holds(dir, "data-00000.tsd"), "%s: partial data file left behind", spec);
        CHECK(!tsr_ckpt_is_committed(dir), "%s: listed as committed", spec);
    }
    CHECK(verifies(good), "%s: the earlier checkpoint no longer verifies", spec);
}

/* A store wrapped by tsr_store_fault_wrap with a spec of its own, which counts
 * its own calls: the second atomic put fails and leaves nothing, the others
 * succeed; a spec that does not parse is refused (and the store closed). */
static void wrapped_store(const char *base) {
    char loc[600];
    snprintf(loc, sizeof loc, "%s/wrapped", base);
    tsr_store *st = tsr_store_open(loc, 1, &e);
    REQUIRE(st, "%s", e.msg);
    st = tsr_store_fault_wrap(st, "rename:2:EIO", &e);
    REQUIRE(st, "%s", e.msg);
    CHECK_OK(tsr_store_put_atomic(st, "a", "1", 1, &e));
    int rc = tsr_store_put_atomic(st, "b", "2", 1, &e);
    CHECK(rc == TSR_EIO && strstr(e.msg, "wrapped/b") && strstr(e.msg, "(injected)"), "the second put: %d: %s", rc,
          e.msg);
    CHECK_OK(tsr_store_put_atomic(st, "c", "3", 1, &e));
    CHECK(tsr_store_exists(st, "a", NULL) == 1 && tsr_store_exists(st, "c", NULL) == 1, "the puts that succeeded are there");
    CHECK(!tsr_store_exists(st, "b", NULL) && !tsr_store_exists(st, "b.tmp", NULL), "the failed put left something");
    tsr_store_close(st);
    st = tsr_store_open(loc, 0, &e);
    REQUIRE(st, "%s", e.msg);
    CHECK(!tsr_store_fault_wrap(st, "rename:x:EIO", &e) && strstr(e.msg, "rename:x:EIO"), "a bad spec: %s", e.msg);
}

/* Specs by location (tsr_fault_set_at): a save under the faulted folder fails,
 * one beside it (whose name starts alike) does not; the closest location wins
 * over tsr_fault_set's; removing them ends the faults. Outages
 * (tsr_fault_outage) hold for the objects at or below their location only, and
 * end when told or when their time is up. */
static void by_location(const char *base) {
    char bad[600], near[600], dir[700];
    snprintf(bad, sizeof bad, "%s/loc", base);
    snprintf(near, sizeof near, "%s/loc2", base);
    CHECK_OK(tsr_fault_set_at(bad, "write:1:EIO", &e));
    snprintf(dir, sizeof dir, "%s/step-00000001", bad);
    CHECK(save(dir, 0) == TSR_EIO && strstr(e.msg, "(injected)"), "a save under %s: %s", bad, e.msg);
    snprintf(dir, sizeof dir, "%s/step-00000001", near);
    CHECK(save(dir, 0) == 0 && verifies(dir), "a save under %s, beside the faulted folder: %s", near, e.msg);
    CHECK_OK(tsr_fault_set("write:1:ENOSPC", &e));
    CHECK_OK(tsr_fault_set_at(bad, "write:1:EIO", &e)); /* its count from zero again */
    snprintf(dir, sizeof dir, "%s/step-00000002", bad);
    CHECK(save(dir, 0) == TSR_EIO, "the closest location's spec, not the process-wide one: %s", e.msg);
    snprintf(dir, sizeof dir, "%s/step-00000002", near);
    CHECK(save(dir, 0) == TSR_ENOSPC, "elsewhere the process-wide spec: %s", e.msg);
    tsr_fault_set(NULL, NULL);
    CHECK_OK(tsr_fault_set_at(bad, NULL, &e));
    snprintf(dir, sizeof dir, "%s/step-00000003", bad);
    CHECK(save(dir, 0) == 0 && verifies(dir), "the spec removed: %s", e.msg);

    tsr_fault_outage("s3://bkt/run", 60);
    CHECK(tsr_fault_in_outage("s3://bkt/run/step-00000001/MANIFEST") && tsr_fault_in_outage("s3://bkt/run"),
          "an object under the outage's location is not in it");
    CHECK(!tsr_fault_in_outage("s3://bkt/run2/x") && !tsr_fault_in_outage("s3://other/run/x"),
          "an object elsewhere is in the outage");
    tsr_fault_outage("s3://bkt/run", 0);
    CHECK(!tsr_fault_in_outage("s3://bkt/run/x"), "an ended outage holds");
    tsr_fault_outage(NULL, 0.05);
    CHECK(tsr_fault_in_outage("s3://any/x"), "an outage of every location misses an object");
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
    CHECK(!tsr_fault_in_outage("s3://any/x"), "an outage outlives its time");
}

int main(int argc, char **argv) {
    const char *t = getenv("TSR_TMP");
    char base[512], good[600], spec[64], dir[700];
    snprintf(base, sizeof base, "%s", argc > 1 ? argv[1] : t ? t : "/tmp/tessera-fault");
    int remote = !(tsr_store_caps(base) & TSR_STORE_DIRS); /* an object store: no directory fsyncs */
    snprintf(good, sizeof good, "%s/step-00000001", base);
    for (int i = 0; i < ROWS * COLS; i++) state[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < sizeof noise; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        noise[i] = (uint8_t)(x >> 32);
    }
    REQUIRE(save(good, 0) == 0, "the good save: %s", e.msg);
    REQUIRE(verifies(good), "the good checkpoint verifies");

    /* The calls of one save. write: the data file's header, 8 frames and a blob,
     * and on POSIX MANIFEST.tmp. fsync: the data file (on S3 its upload's
     * completion), and on POSIX MANIFEST.tmp and the directory. rename: the
     * MANIFEST's (on S3 its PUT). */
    const char *specs[] = {"write:%d:ENOSPC", "write:%d:EIO", "write:%d:short", "fsync:%d:EIO", "fsync:%d:ENOSPC",
                           "rename:%d:EIO"};
    int writes = remote ? 10 : 11, fsyncs = remote ? 1 : 3, faults = 0;
    for (size_t si = 0; si < sizeof specs / sizeof specs[0]; si++) {
        int max = specs[si][0] == 'w' ? writes : specs[si][0] == 'f' ? fsyncs : 1;
        for (int n = 1; n <= max + 1; n++) {
            snprintf(spec, sizeof spec, specs[si], n);
            snprintf(dir, sizeof dir, "%s/step-%08d", base, 100 + faults++);
            fault_case(spec, dir, good, 0, (expect){n <= max, 0, NULL});
        }
    }
    /* the fdatasyncs queued while a data file is written: POSIX only (an
     * upload is durable once complete, and not before) */
    const char *dspecs[] = {"datasync:1:EIO", "datasync:1:ENOSPC"};
    for (int si = 0; si < 2; si++) {
        snprintf(dir, sizeof dir, "%s/step-%08d", base, 500 + si);
        expect want = {!remote, si == 0 ? TSR_EIO : TSR_ENOSPC, "data-00000.tsd: fdatasync"};
        fault_case(dspecs[si], dir, good, 1, want);
        faults++;
    }

    /* a fault past the last call changes nothing */
    snprintf(dir, sizeof dir, "%s/step-00000999", base);
    CHECK(tsr_fault_set("write:1000:EIO", &e) == 0, "%s", e.msg);
    CHECK(save(dir, 0) == 0 && verifies(dir), "no fault reached: %s", e.msg);
    tsr_fault_set(NULL, NULL);
    /* a rate: every write takes its bytes at 1 MB/s, and the save is done only
     * once the emulated device is (64 KiB of state: at least 0.065 s), intact */
    snprintf(dir, sizeof dir, "%s/step-00000998", base);
    CHECK(tsr_fault_set("rate:1:write", &e) == 0, "%s", e.msg);
    double t0 = tsr_now();
    CHECK(save(dir, 0) == 0 && verifies(dir), "a save at a rate: %s", e.msg);
    double took = tsr_now() - t0;
    tsr_fault_set(NULL, NULL);
    CHECK(took >= sizeof state / 1e6, "a save of %zu bytes at 1 MB/s took %.3f s", sizeof state, took);
    wrapped_store(base);
    by_location(base);
    /* a spec that does not parse is refused, naming it */
    CHECK(tsr_fault_set("write:0:EIO", &e) == TSR_EINVAL && strstr(e.msg, "write:0:EIO"), "N of 0: %s", e.msg);
    CHECK(tsr_fault_set("read:1:EIO", &e) == TSR_EINVAL && strstr(e.msg, "read"), "unknown op: %s", e.msg);
    CHECK(tsr_fault_set("write:1:EPERM", &e) == TSR_EINVAL && strstr(e.msg, "EPERM"), "unknown kind: %s", e.msg);
    CHECK(tsr_fault_set("rate:100:fsync", &e) == TSR_EINVAL && strstr(e.msg, "writes only"), "a rate on fsync: %s",
          e.msg);
    if (!check_failures) printf("%s: %d injected faults, each reported and cleaned up\n", base, faults);
    return check_done();
}
