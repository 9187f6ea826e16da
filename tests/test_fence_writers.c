/* test_fence_writers.c: a fenced writer never writes into a file it did not
 * create, nor commits over a MANIFEST (FORMAT.md 4.6), whatever the timing.
 * Writers of two epochs save the same step of one folder:
 *  - an old writer's file is open when the fence rises and a newer writer saves
 *    the step: the newer one passes the old file over (the next file id by its
 *    stride), the old one goes on writing into its own file and is refused its
 *    commit; the newer step verifies and reads back its own values;
 *  - the moment between a writer's check and its file: an old writer whose fence
 *    read is stale (the FENCE put back as it was) finds the newer launch's file
 *    and MANIFEST of the step: its file goes elsewhere, its commit is refused
 *    ("exists"), the newer step intact;
 *  - an old writer's abort after its uncommitted step was removed and the step
 *    saved anew: the newer writer's file of the same name stays;
 *  - a leftover of a failed save, without a stride: removed, and the save commits;
 *  - tsr_store_put_new never replaces an object, an exclusive create never opens
 *    one, and of two exclusive writers of one name at most one finishes (on S3
 *    the other's completion is refused: one PUT, or a multipart upload);
 *    tsr_rename_new never replaces a name.
 *
 *   test_fence_writers LOCATION: the store's part alone, at LOCATION (s3://...:
 *   test_fence.sh, on its S3 server). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "common.h"
#include "fence.h"
#include "store.h"
#include "tessera.h"

static tsr_error e;
enum { R = 6, K = 5 };
static const uint64_t shape[2] = {R, K};

static tsr_save *begin(const char *dir, uint64_t epoch, uint32_t stride) {
    tsr_write_opts o = tsr_write_opts_default();
    o.frame_bytes = 64;
    o.threads = 1;
    o.epoch = epoch;
    o.id_stride = stride;
    tsr_save *s = tsr_save_begin(dir, 0, NULL, &o, &e);
    if (s) CHECK_OK(tsr_save_tensor(s, "w", NULL, TSR_F32, 2, shape, NULL, &e));
    return s;
}

static void rows(tsr_save *s, int from, int to, float v) {
    float buf[R * K];
    for (int i = 0; i < (to - from) * K; i++) buf[i] = v + (float)i;
    tsr_box b = {2, {(uint64_t)from, 0}, {(uint64_t)(to - from), K}};
    CHECK_OK(tsr_save_box(s, "w", &b, buf, &e));
}

static int commit(tsr_save *s) {
    const uint8_t *t;
    size_t len;
    int rc = tsr_save_finish(s, &t, &len, &e);
    if (!rc) rc = tsr_save_commit(s, &t, &len, 1, 4, NULL, &e);
    return rc;
}

static void problem(void *user, const char *msg) {
    ++*(int *)user;
    fprintf(stderr, "  verify: %s\n", msg);
}

/* The step verifies and holds the values of rows(0, R, v). */
static void intact(const char *dir, float v, const char *what) {
    tsr_ckpt *ck = tsr_ckpt_open(dir, &e);
    CHECK(ck, "%s: %s", what, e.msg);
    if (!ck) return;
    int n = 0;
    CHECK(tsr_ckpt_verify(ck, problem, &n, 1, &e) == 0 && n == 0, "%s: %d problem(s)", what, n);
    float got[R * K];
    tsr_box all = {2, {0, 0}, {R, K}};
    CHECK_OK(tsr_ckpt_read(ck, 0, &all, got, &e));
    int same = 1;
    for (int i = 0; i < R * K; i++) same &= got[i] == v + (float)i;
    CHECK(same, "%s: the values are not the newer writer's", what);
    tsr_ckpt_close(ck);
}

static int exists(const char *dir, const char *name) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

static int count_tmp(void *user, const char *name, uint64_t size);

/* Two writers create the object `name` of `size` bytes, both exclusively: at
 * most one of them finishes (a local file: the second create is refused; an
 * object: the second upload's completion is, If-None-Match), and the object
 * holds that writer's bytes. */
static void race(tsr_store *st, const char *name, size_t size) {
    uint8_t *buf[2];
    tsr_wfile *f[2] = {NULL, NULL};
    int made[2], done[2] = {-1, -1};
    for (int k = 0; k < 2; k++) {
        REQUIRE(posix_memalign((void **)&buf[k], 4096, size) == 0, "memory");
        memset(buf[k], 'A' + k, size);
        made[k] = tsr_store_create(st, name, TSR_CREATE_NEW, &f[k], &e);
    }
    CHECK(made[0] == 0, "%s: the first exclusive create: %s", name, e.msg);
    for (int k = 1; k >= 0; k--) /* the second writer finishes first */
        if (made[k] == 0) {
            done[k] = tsr_wfile_write(f[k], buf[k], size, 0, &e);
            if (!done[k]) done[k] = tsr_wfile_finish(f[k], size, &e);
            else tsr_wfile_abort(f[k]);
        } else
            CHECK(made[k] == TSR_EBUSY, "%s: the second create: %d %s", name, made[k], e.msg);
    int winner = done[1] == 0 ? 1 : 0;
    CHECK((done[0] == 0) + (done[1] == 0) == 1, "%s: %d writers finished (%d, %d)", name,
          (done[0] == 0) + (done[1] == 0), done[0], done[1]);
    CHECK(done[!winner] == -1 || done[!winner] == TSR_EBUSY, "%s: the loser: %d %s", name, done[!winner], e.msg);
    uint8_t *got = NULL;
    size_t len = 0;
    CHECK_OK(tsr_store_get(st, name, size + 1, &got, &len, &e));
    CHECK(got && len == size && !memcmp(got, buf[winner], size), "%s: not the finished writer's bytes", name);
    free(got);
    CHECK_OK(tsr_store_remove(st, name, &e));
    free(buf[0]), free(buf[1]);
}

/* The store's calls that never replace, at loc (a folder, or s3://). */
static void store_checks(const char *loc) {
    tsr_store *st = tsr_store_open(loc, 1, &e);
    REQUIRE(st, "%s", e.msg);
    CHECK_OK(tsr_store_put_new(st, "obj", "one", 3, &e));
    int rc = tsr_store_put_new(st, "obj", "two", 3, &e);
    CHECK(rc == TSR_EBUSY && strstr(e.msg, "obj"), "put_new over an object: %d %s", rc, e.msg);
    uint8_t *got = NULL;
    size_t len = 0;
    CHECK_OK(tsr_store_get(st, "obj", 16, &got, &len, &e));
    CHECK(got && len == 3 && !memcmp(got, "one", 3), "put_new replaced the object");
    free(got);
    tsr_wfile *f = NULL;
    rc = tsr_store_create(st, "obj", TSR_CREATE_NEW, &f, &e);
    CHECK(rc == TSR_EBUSY && !f, "an exclusive create over an object: %d %s", rc, e.msg);
    race(st, "small", 4096);
    if (!strncmp(loc, "s3://", 5)) race(st, "large", 11u << 20); /* several parts (TSR_S3_PART_SIZE=5M) */
    long left = 0;
    CHECK_OK(tsr_store_list(st, count_tmp, &left, &e));
    CHECK(left == 0, "%ld staging file(s) left", left);
    CHECK_OK(tsr_store_remove(st, "obj", &e));
    tsr_store_close(st);
}

static int count_tmp(void *user, const char *name, uint64_t size) {
    *(long *)user += strncmp(name, "obj.tmp", 7) == 0;
    return 0;
}

int main(int argc, char **argv) {
    int rc;
    if (argc == 2) { /* the store's part alone, at another location (test_fence.sh: s3://) */
        store_checks(argv[1]);
        return check_done();
    }
    char root[] = "/tmp/tsr-fencew-XXXXXX", dir[PATH_MAX];
    REQUIRE(mkdtemp(root), "mkdtemp");
    REQUIRE(tsr_fence_raise(root, 1, &e) == 0, "%s", e.msg);

    /* an old writer's open file across the fence and a newer save of its step */
    snprintf(dir, sizeof dir, "%s/step-00000004", root);
    tsr_save *old = begin(dir, 1, 2);
    REQUIRE(old, "%s", e.msg);
    rows(old, 0, 3, 100);
    REQUIRE(tsr_fence_raise(root, 2, &e) == 0, "%s", e.msg);
    tsr_save *cur = begin(dir, 2, 2);
    REQUIRE(cur, "%s", e.msg);
    CHECK(exists(dir, "data-00002.tsd"), "the newer writer did not pass the old file over");
    rows(cur, 0, R, 7);
    CHECK_OK(commit(cur));
    tsr_save_free(cur);
    rows(old, 3, R, 100); /* into its own file: nothing of the newer step's */
    rc = commit(old);
    CHECK(rc == TSR_EBUSY && strstr(e.msg, "fenced:"), "old writer's commit: %d %s", rc, e.msg);
    tsr_save_abort(old);
    tsr_save_free(old);
    intact(dir, 7, "step 4");

    /* the moment between the check and the file: a stale fence read */
    snprintf(dir, sizeof dir, "%s/step-00000006", root);
    cur = begin(dir, 2, 2);
    REQUIRE(cur, "%s", e.msg);
    rows(cur, 0, R, 9);
    CHECK_OK(commit(cur));
    tsr_save_free(cur);
    char fence[PATH_MAX], keep[PATH_MAX];
    snprintf(fence, sizeof fence, "%s/FENCE", root);
    snprintf(keep, sizeof keep, "%s/FENCE.kept", root);
    REQUIRE(rename(fence, keep) == 0, "rename FENCE");
    int fd = open(fence, O_WRONLY | O_CREAT | O_TRUNC, 0644); /* what the old writer read */
    REQUIRE(fd >= 0 && write(fd, "tessera-fence 1\nepoch 1 step none\n", 34) == 34, "FENCE");
    close(fd);
    old = begin(dir, 1, 2);
    CHECK(old, "the stale read should admit the old writer: %s", e.msg);
    if (old) {
        rows(old, 0, R, 100);
        rc = commit(old);
        CHECK(rc == TSR_EBUSY && strstr(e.msg, "exists"), "old writer's commit over a MANIFEST: %d %s", rc, e.msg);
        tsr_save_abort(old);
        tsr_save_free(old);
    }
    REQUIRE(rename(keep, fence) == 0, "rename FENCE back");
    intact(dir, 9, "step 6");

    /* an old writer's abort after its step was removed and saved anew */
    REQUIRE(tsr_fence_raise(root, 3, &e) == 0, "%s", e.msg);
    snprintf(dir, sizeof dir, "%s/step-00000008", root);
    old = begin(dir, 3, 2);
    REQUIRE(old, "%s", e.msg);
    rows(old, 0, 2, 100);
    tsr_remove_tree(dir); /* the next launch's retention: an uncommitted step */
    REQUIRE(tsr_fence_raise(root, 4, &e) == 0, "%s", e.msg);
    cur = begin(dir, 4, 2);
    REQUIRE(cur, "%s", e.msg);
    CHECK(exists(dir, "data-00000.tsd"), "the newer writer should take the free name");
    rows(cur, 0, R, 11);
    CHECK_OK(commit(cur));
    tsr_save_free(cur);
    tsr_save_abort(old);
    tsr_save_free(old);
    intact(dir, 11, "step 8 after the old writer's abort");

    /* a leftover without a stride: removed */
    snprintf(dir, sizeof dir, "%s/step-00000010", root);
    REQUIRE(tsr_mkdir_p(dir) == 0, "mkdir");
    char p[PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/data-00000.tsd", dir);
    fd = open(p, O_WRONLY | O_CREAT, 0644);
    REQUIRE(fd >= 0 && write(fd, "leftover", 8) == 8, "leftover");
    close(fd);
    cur = begin(dir, 4, 0);
    REQUIRE(cur, "%s", e.msg);
    rows(cur, 0, R, 13);
    CHECK_OK(commit(cur));
    tsr_save_free(cur);
    intact(dir, 13, "step 10 over a leftover");

    store_checks(root);
    char a[PATH_MAX], b[PATH_MAX];
    snprintf(a, sizeof a, "%s/a", root), snprintf(b, sizeof b, "%s/obj", root);
    fd = open(a, O_WRONLY | O_CREAT, 0644);
    close(fd);
    int fd2 = open(b, O_WRONLY | O_CREAT, 0644);
    close(fd2);
    CHECK(tsr_rename_new(a, b) == EEXIST && exists(root, "a"), "tsr_rename_new replaced a name");
    snprintf(b, sizeof b, "%s/b", root);
    CHECK(tsr_rename_new(a, b) == 0 && !exists(root, "a") && exists(root, "b"), "tsr_rename_new did not move");

    tsr_remove_tree(root);
    return check_done();
}
