/* test_heartbeat.c: the rank's side of tessera launch's heartbeat: the record
 * round-trips through its 72 bytes; without TSR_HEARTBEAT nothing happens; a
 * bad token or a supervisor that cannot be reached fail naming the cause; the
 * records reach a listening supervisor in order; a rank whose supervisor closes
 * the connection exits with status 1 at once (its watchdog); the NaN fault hook
 * hits exactly the batch of its step. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "common.h"
#include "heartbeat.h"

static void test_codec(void) {
    tsr_hb_record r = {TSR_HB_MAGIC, TSR_HB_VERSION, TSR_HB_STEP, 0x0123456789abcdefull, 7, 8, 4242, -5, NAN,
                       1.5, 1.7e9, 0.25, 0.125};
    uint8_t b[TSR_HB_RECORD];
    tsr_hb_encode(&r, b);
    CHECK(tsr_ld32(b) == TSR_HB_MAGIC && b[0] == 'T' && b[1] == 'S' && b[2] == 'H' && b[3] == 'B', "magic bytes");
    tsr_hb_record o;
    tsr_hb_decode(b, &o);
    CHECK(o.magic == r.magic && o.version == r.version && o.phase == r.phase && o.token == r.token, "header");
    CHECK(o.rank == 7 && o.world == 8 && o.pid == 4242 && o.step == -5, "fields");
    CHECK(isnan(o.loss) && o.grad_norm == 1.5 && o.time == 1.7e9 && o.step_s == 0.25 && o.compute_s == 0.125, "doubles");
    CHECK(TSR_HB_RECORD == 80 && TSR_HB_VERSION == 2 && tsr_ld64(b + 72) == 0x3fc0000000000000ull, "compute_s last");
    uint8_t cmd[TSR_HB_COMMAND];
    tsr_hb_command(TSR_HB_CMD_NAN, 42, cmd);
    CHECK(cmd[0] == 'T' && cmd[1] == 'S' && cmd[2] == 'H' && cmd[3] == 'C' && tsr_ld32(cmd + 4) == TSR_HB_CMD_NAN &&
              tsr_ld64(cmd + 8) == 42, "command bytes");
    CHECK(strcmp(tsr_hb_phase_name(TSR_HB_DONE), "done") == 0 && strcmp(tsr_hb_phase_name(99), "?") == 0, "names");
}

/* A listening socket at dir/hb. @return its descriptor. */
static int listen_at(const char *dir, char *path, size_t len) {
    snprintf(path, len, "%s/hb", dir);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    REQUIRE(strlen(path) < sizeof a.sun_path, "%s: too long", path);
    memcpy(a.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    REQUIRE(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 4) == 0, "listen at %s", path);
    return fd;
}

static int read_record(int fd, tsr_hb_record *r) {
    uint8_t b[TSR_HB_RECORD];
    size_t have = 0;
    while (have < sizeof b) {
        ssize_t n = read(fd, b + have, sizeof b - have);
        if (n <= 0) return -1;
        have += (size_t)n;
    }
    tsr_hb_decode(b, r);
    return 0;
}

static void test_open_errors(const char *dir) {
    tsr_error e = {0};
    tsr_heartbeat *h = (tsr_heartbeat *)1;
    unsetenv(TSR_HB_ENV);
    CHECK(tsr_heartbeat_open(0, 1, &h, &e) == 0 && h == NULL, "no supervisor: no heartbeat");
    tsr_heartbeat_send(NULL, TSR_HB_STEP, 1, 1, 1, 1); /* a no-op */
    tsr_heartbeat_close(NULL);
    char path[256];
    snprintf(path, sizeof path, "%s/nobody", dir);
    setenv(TSR_HB_ENV, path, 1);
    setenv(TSR_HB_TOKEN_ENV, "xyz", 1);
    CHECK(tsr_heartbeat_open(0, 1, &h, &e) == TSR_EINVAL && strstr(e.msg, TSR_HB_TOKEN_ENV), "bad token: %s", e.msg);
    setenv(TSR_HB_TOKEN_ENV, "00000000000000ff", 1);
    CHECK(tsr_heartbeat_open(0, 1, &h, &e) == TSR_EIO && strstr(e.msg, path), "nobody listens: %s", e.msg);
}

static void test_records(const char *dir) {
    char path[256];
    int lfd = listen_at(dir, path, sizeof path);
    setenv(TSR_HB_ENV, path, 1);
    setenv(TSR_HB_TOKEN_ENV, "0123456789abcdef", 1);
    tsr_error e = {0};
    tsr_heartbeat *h = NULL;
    CHECK_OK(tsr_heartbeat_open(3, 4, &h, &e));
    int c = accept(lfd, NULL, NULL);
    tsr_hb_record r;
    CHECK(c >= 0 && read_record(c, &r) == 0, "the first record");
    CHECK(r.magic == TSR_HB_MAGIC && r.phase == TSR_HB_START && r.token == 0x0123456789abcdefull && r.rank == 3 &&
              r.world == 4 && r.pid == (uint32_t)getpid(), "start record: phase %u rank %u", r.phase, r.rank);
    tsr_heartbeat_send(h, TSR_HB_STEP, 17, 2.5, 0.75, 0.125);
    CHECK(read_record(c, &r) == 0 && r.phase == TSR_HB_STEP && r.step == 17 && r.loss == 2.5 && r.grad_norm == 0.75 &&
              r.step_s == 0.125 && r.compute_s == 0, "step record");
    tsr_heartbeat_step(h, 18, 2.25, 0.5, 0.25, 0.0625);
    CHECK(read_record(c, &r) == 0 && r.phase == TSR_HB_STEP && r.step == 18 && r.step_s == 0.25 && r.compute_s == 0.0625,
          "step record with its compute time");
    /* a command, sent in two pieces: the watchdog carries it out whole */
    uint8_t cmd[TSR_HB_COMMAND];
    tsr_hb_command(TSR_HB_CMD_NAN, 21, cmd);
    CHECK(!tsr_heartbeat_chaos_nan(21), "no chaos NaN before the command");
    CHECK(write(c, cmd, 5) == 5, "the command's first bytes");
    usleep(50000);
    CHECK(!tsr_heartbeat_chaos_nan(21), "no chaos NaN from a partial command");
    CHECK(write(c, cmd + 5, sizeof cmd - 5) == (ssize_t)sizeof cmd - 5, "the rest of the command");
    double w0 = tsr_now();
    while (!tsr_heartbeat_chaos_nan(21) && tsr_now() - w0 < 5) usleep(10000);
    CHECK(tsr_heartbeat_chaos_nan(21) && !tsr_heartbeat_chaos_nan(20) && !tsr_heartbeat_chaos_nan(22),
          "the chaos NaN of step 21");
    tsr_heartbeat_close(h);
    char x;
    CHECK(read(c, &x, 1) == 0, "end of stream after close");
    close(c);
    /* the watchdog: a child whose supervisor closes its connection exits 1 */
    pid_t child = fork();
    if (child == 0) {
        tsr_heartbeat *hc = NULL;
        if (tsr_heartbeat_open(0, 1, &hc, NULL)) _exit(3);
        sleep(30);
        _exit(0);
    }
    c = accept(lfd, NULL, NULL);
    CHECK(c >= 0 && read_record(c, &r) == 0 && r.pid == (uint32_t)child, "the child's start record");
    double t0 = tsr_now();
    close(c);
    int st = 0;
    while (waitpid(child, &st, WNOHANG) == 0 && tsr_now() - t0 < 10) usleep(10000);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1, "the child did not exit 1 (status 0x%x)", st);
    CHECK(tsr_now() - t0 < 2, "the child took %.2f s to leave", tsr_now() - t0);
    kill(child, SIGKILL);
    waitpid(child, NULL, WNOHANG);
    close(lfd);
    unlink(path);
}

static void test_fault(void) {
    CHECK(!tsr_heartbeat_fault_nan(16, 8) && !tsr_heartbeat_fault_nan(0, 8), "no fault unless set");
    tsr_heartbeat_set_fault_nan(3);
    CHECK(tsr_heartbeat_fault_nan(16, 8) && !tsr_heartbeat_fault_nan(8, 8) && !tsr_heartbeat_fault_nan(24, 8),
          "the batch of step 3 is samples 16..23");
    tsr_heartbeat_set_fault_nan(0);
    CHECK(!tsr_heartbeat_fault_nan(16, 8), "no fault once turned off");
    /* the straggler hook sleeps on its rank only */
    tsr_heartbeat_set_fault_slow(1, 200);
    double t0 = tsr_now();
    tsr_heartbeat_fault_slow(0);
    CHECK(tsr_now() - t0 < 0.15, "another rank is not slowed");
    tsr_heartbeat_fault_slow(1);
    CHECK(tsr_now() - t0 >= 0.2, "the slow rank sleeps its 200 ms");
    tsr_heartbeat_set_fault_slow(-1, 0);
}

int main(void) {
    char dir[] = "/tmp/tsr-test-hb-XXXXXX";
    REQUIRE(mkdtemp(dir), "mkdtemp");
    test_codec();
    test_open_errors(dir);
    test_records(dir);
    test_fault();
    rmdir(dir);
    return check_failures ? 1 : 0;
}
