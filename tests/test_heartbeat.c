/* test_heartbeat.c: the rank's side of tessera launch's heartbeat: the record
 * round-trips through its bytes and its tag proves them (any changed byte, a
 * wrong key or another connection's nonce fails it); without TSR_HEARTBEAT
 * nothing happens; a bad key, a bad orphan timeout, a supervisor that cannot
 * be reached or says no hello fail naming the cause; the records reach a
 * listening supervisor in order, signed and numbered, over a Unix socket and
 * over TCP; a command is carried out only when it is whole, signed and next in
 * sequence; TSR_HB_CMD_ALIVE is answered; a rank whose supervisor closes the
 * connection exits with status 1 at once, one that hears nothing for its
 * orphan timeout from a supervisor that still takes connections (stalled)
 * waits on, up to 3 times the timeout, and one that cannot reach it (a
 * partition) stops itself after the timeout; the NaN fault hook hits exactly
 * the batch of its step. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
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

static const char KEY_HEX[] = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
static uint8_t key[TSR_HB_KEY], nonce[TSR_HB_NONCE];

static void test_codec(void) {
    tsr_hb_record r = {TSR_HB_MAGIC, TSR_HB_VERSION, TSR_HB_STEP, 0x0123456789abcdefull, 7, 8, 4242, -5, NAN,
                       1.5, 1.7e9, 0.25, 0.125};
    uint8_t b[TSR_HB_RECORD];
    tsr_hb_encode(&r, b);
    CHECK(tsr_ld32(b) == TSR_HB_MAGIC && b[0] == 'T' && b[1] == 'S' && b[2] == 'H' && b[3] == 'B', "magic bytes");
    tsr_hb_record o;
    tsr_hb_decode(b, &o);
    CHECK(o.magic == r.magic && o.version == r.version && o.phase == r.phase && o.seq == r.seq, "header");
    CHECK(o.rank == 7 && o.world == 8 && o.pid == 4242 && o.step == -5, "fields");
    CHECK(isnan(o.loss) && o.grad_norm == 1.5 && o.time == 1.7e9 && o.step_s == 0.25 && o.compute_s == 0.125, "doubles");
    CHECK(TSR_HB_RECORD == 112 && TSR_HB_VERSION == 3 && tsr_ld64(b + 72) == 0x3fc0000000000000ull, "compute_s last");
    /* the tag: HMAC-SHA256 of nonce || body (the Python test of tessera
     * launch computes it with its own hmac module) */
    CHECK(tsr_hb_parse_key(KEY_HEX, key) == 0 && key[0] == 0 && key[31] == 0x1f, "the key's hex");
    char hex[2 * TSR_HB_KEY + 1];
    tsr_hb_key_hex(key, hex);
    CHECK(strcmp(hex, KEY_HEX) == 0, "the key back to hex: %s", hex);
    CHECK(tsr_hb_parse_key("00", key) && tsr_hb_parse_key(NULL, key), "short or missing keys refused");
    CHECK(tsr_hb_parse_key(KEY_HEX, key) == 0, "key");
    for (int i = 0; i < TSR_HB_NONCE; i++) nonce[i] = (uint8_t)(0xa0 + i);
    tsr_hb_seal(key, nonce, b, TSR_HB_BODY);
    CHECK(tsr_hb_check(key, nonce, b, TSR_HB_BODY), "a sealed record checks");
    for (int i = 0; i < TSR_HB_RECORD; i += 7) {
        b[i] ^= 0x10;
        CHECK(!tsr_hb_check(key, nonce, b, TSR_HB_BODY), "byte %d changed: the check fails", i);
        b[i] ^= 0x10;
    }
    uint8_t other[TSR_HB_KEY], n2[TSR_HB_NONCE];
    memcpy(other, key, sizeof other), other[5] ^= 1;
    memcpy(n2, nonce, sizeof n2), n2[23] ^= 1;
    CHECK(!tsr_hb_check(other, nonce, b, TSR_HB_BODY) && !tsr_hb_check(key, n2, b, TSR_HB_BODY),
          "another key or another connection's nonce: the check fails");
    uint8_t cmd[TSR_HB_COMMAND];
    tsr_hb_command(TSR_HB_CMD_NAN, 42, 9, cmd);
    CHECK(cmd[0] == 'T' && cmd[1] == 'S' && cmd[2] == 'H' && cmd[3] == 'C' && tsr_ld32(cmd + 4) == TSR_HB_CMD_NAN &&
              tsr_ld64(cmd + 8) == 42 && tsr_ld64(cmd + 16) == 9, "command bytes");
    uint8_t hello[TSR_HB_HELLO];
    tsr_hb_hello(nonce, hello);
    CHECK(tsr_ld32(hello) == TSR_HB_HELLO_MAGIC && tsr_ld32(hello + 4) == TSR_HB_VERSION && hello[8] == 0xa0, "hello");
    CHECK(strcmp(tsr_hb_phase_name(TSR_HB_DONE), "done") == 0 && strcmp(tsr_hb_phase_name(TSR_HB_ALIVE), "alive") == 0 &&
              strcmp(tsr_hb_phase_name(99), "?") == 0, "names");
}

/* A listening socket at dir/hb, or (dir NULL) on 127.0.0.1; its TSR_HEARTBEAT into addr. */
static int listener = -1; /* listen_at's last */

static int listen_at(const char *dir, char *addr, size_t len) {
    int fd;
    if (dir) {
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        snprintf(addr, len, "%s/hb", dir);
        REQUIRE(strlen(addr) < sizeof a.sun_path, "%s: too long", addr);
        memcpy(a.sun_path, addr, strlen(addr) + 1);
        fd = socket(AF_UNIX, SOCK_STREAM, 0);
        REQUIRE(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 64) == 0, "listen at %s", addr);
        return listener = fd;
    }
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    fd = socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 64) == 0 &&
                getsockname(fd, (struct sockaddr *)&a, &al) == 0, "listen on 127.0.0.1");
    snprintf(addr, len, "tcp:127.0.0.1:%d", ntohs(a.sin_port));
    return listener = fd;
}

/* The supervisor's side of a connection: accepted, and its hello sent. */
static int accept_hello(int lfd) {
    int c = accept(lfd, NULL, NULL);
    uint8_t hello[TSR_HB_HELLO];
    tsr_hb_hello(nonce, hello);
    REQUIRE(c >= 0 && write(c, hello, sizeof hello) == (ssize_t)sizeof hello, "accept and hello");
    return c;
}

/* One record, its tag checked. @return 0, -1 at the end of the stream, -2 for a bad tag. */
static int read_record(int fd, tsr_hb_record *r) {
    uint8_t b[TSR_HB_RECORD];
    size_t have = 0;
    while (have < sizeof b) {
        ssize_t n = read(fd, b + have, sizeof b - have);
        if (n <= 0) return -1;
        have += (size_t)n;
    }
    tsr_hb_decode(b, r);
    return tsr_hb_check(key, nonce, b, TSR_HB_BODY) ? 0 : -2;
}

static void send_command(int c, uint32_t kind, uint64_t arg, uint64_t seq, const uint8_t *k, size_t first) {
    uint8_t cmd[TSR_HB_COMMAND];
    tsr_hb_command(kind, arg, seq, cmd);
    tsr_hb_seal(k, nonce, cmd, TSR_HB_CMD_BODY);
    CHECK(write(c, cmd, first) == (ssize_t)first, "a command's first bytes");
    if (first < sizeof cmd) {
        usleep(50000);
        CHECK(write(c, cmd + first, sizeof cmd - first) == (ssize_t)(sizeof cmd - first), "the rest of the command");
    }
}

static int wait_nan(int64_t step) {
    double w0 = tsr_now();
    while (!tsr_heartbeat_chaos_nan(step) && tsr_now() - w0 < 2) usleep(10000);
    return tsr_heartbeat_chaos_nan(step);
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
    setenv(TSR_HB_KEY_ENV, "xyz", 1);
    CHECK(tsr_heartbeat_open(0, 1, &h, &e) == TSR_EINVAL && strstr(e.msg, TSR_HB_KEY_ENV), "bad key: %s", e.msg);
    setenv(TSR_HB_KEY_ENV, KEY_HEX, 1);
    setenv(TSR_HB_ORPHAN_ENV, "ten", 1);
    CHECK(tsr_heartbeat_open(0, 1, &h, &e) == TSR_EINVAL && strstr(e.msg, TSR_HB_ORPHAN_ENV), "bad orphan: %s", e.msg);
    unsetenv(TSR_HB_ORPHAN_ENV);
    CHECK(tsr_heartbeat_open(0, 1, &h, &e) == TSR_EIO && strstr(e.msg, path), "nobody listens: %s", e.msg);
    setenv(TSR_HB_ENV, "tcp:127.0.0.1", 1);
    CHECK(tsr_heartbeat_open(0, 1, &h, &e) == TSR_EINVAL && strstr(e.msg, "tcp:HOST:PORT"), "no port: %s", e.msg);
    /* a listener that says no hello: refused, naming it (after the hello's wait) */
    char addr[256];
    int lfd = listen_at(NULL, addr, sizeof addr);
    setenv(TSR_HB_ENV, addr, 1);
    pid_t child = fork();
    if (child == 0) {
        int c = accept(lfd, NULL, NULL);
        const char junk[TSR_HB_HELLO] = "HTTP/1.1 200 OK\r\n\r\n";
        if (c >= 0 && write(c, junk, sizeof junk) < 0) _exit(1);
        sleep(5);
        _exit(0);
    }
    CHECK(tsr_heartbeat_open(0, 1, &h, &e) == TSR_EIO && strstr(e.msg, addr) && strstr(e.msg, "not a tessera launch"),
          "no hello: %s", e.msg);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    close(lfd);
}

/* A child that opens its heartbeat and waits (30 s at most). */
static pid_t idle_rank(void) {
    pid_t child = fork();
    if (child == 0) {
        if (listener >= 0) close(listener); /* the supervisor's, not the rank's: it must not keep it open */
        tsr_heartbeat *hc = NULL;
        if (tsr_heartbeat_open(0, 1, &hc, NULL)) _exit(3);
        sleep(30);
        _exit(0);
    }
    return child;
}

/* Waits up to `limit` seconds for child to exit: its status in *st (0 while it
 * runs), and the seconds it took; it is killed after. */
static double wait_exit(pid_t child, double limit, int *st) {
    double t0 = tsr_now();
    *st = 0;
    while (waitpid(child, st, WNOHANG) == 0 && tsr_now() - t0 < limit) usleep(10000);
    double took = tsr_now() - t0;
    kill(child, SIGKILL);
    waitpid(child, NULL, WNOHANG);
    return took;
}

/* Records and commands over the listener at addr (a Unix socket or TCP). */
static void test_records(const char *dir) {
    char addr[256];
    int lfd = listen_at(dir, addr, sizeof addr);
    setenv(TSR_HB_ENV, addr, 1);
    setenv(TSR_HB_KEY_ENV, KEY_HEX, 1);
    pid_t child;
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair");
    child = fork();
    if (child == 0) { /* the rank: opens, sends, carries out commands, reports them on sv[1] */
        close(sv[0]);
        tsr_heartbeat *hc = NULL;
        if (tsr_heartbeat_open(3, 4, &hc, NULL)) _exit(3);
        tsr_heartbeat_send(hc, TSR_HB_STEP, 17, 2.5, 0.75, 0.125);
        tsr_heartbeat_step(hc, 18, 2.25, 0.5, 0.25, 0.0625);
        char x;
        while (read(sv[1], &x, 1) == 1) { /* asked: which chaos NaN steps are set */
            char ans = (char)('0' + wait_nan(21) + 2 * tsr_heartbeat_chaos_nan(22));
            if (write(sv[1], &ans, 1) != 1) _exit(4);
        }
        tsr_heartbeat_close(hc);
        _exit(0);
    }
    close(sv[1]);
    int c = accept_hello(lfd);
    tsr_hb_record r;
    CHECK(read_record(c, &r) == 0, "the first record, signed");
    CHECK(r.magic == TSR_HB_MAGIC && r.phase == TSR_HB_START && r.seq == 1 && r.rank == 3 && r.world == 4 &&
              r.pid == (uint32_t)child, "start record: phase %u seq %llu rank %u", r.phase, (unsigned long long)r.seq, r.rank);
    CHECK(read_record(c, &r) == 0 && r.phase == TSR_HB_STEP && r.seq == 2 && r.step == 17 && r.loss == 2.5 &&
              r.grad_norm == 0.75 && r.step_s == 0.125 && r.compute_s == 0, "step record");
    CHECK(read_record(c, &r) == 0 && r.phase == TSR_HB_STEP && r.seq == 3 && r.step == 18 && r.step_s == 0.25 &&
              r.compute_s == 0.0625, "step record with its compute time");
    char ans = 0, q = '?';
    /* a command under another key, then one out of sequence: ignored */
    uint8_t other[TSR_HB_KEY];
    memcpy(other, key, sizeof other), other[0] ^= 1;
    send_command(c, TSR_HB_CMD_NAN, 22, 1, other, TSR_HB_COMMAND);
    send_command(c, TSR_HB_CMD_NAN, 22, 5, key, TSR_HB_COMMAND);
    /* the right one, in two pieces: carried out whole */
    send_command(c, TSR_HB_CMD_NAN, 21, 1, key, 5);
    CHECK(write(sv[0], &q, 1) == 1 && read(sv[0], &ans, 1) == 1 && ans == '1',
          "the chaos NaN of step 21 only (the unsigned and the replayed command ignored): %c", ans);
    /* a replay of that same command: ignored */
    send_command(c, TSR_HB_CMD_NAN, 22, 1, key, TSR_HB_COMMAND);
    /* ALIVE: answered by the watchdog */
    send_command(c, TSR_HB_CMD_ALIVE, 77, 2, key, TSR_HB_COMMAND);
    CHECK(read_record(c, &r) == 0 && r.phase == TSR_HB_ALIVE && r.step == 77 && r.seq == 4, "the answer to ALIVE");
    CHECK(write(sv[0], &q, 1) == 1 && read(sv[0], &ans, 1) == 1 && ans == '1', "the replayed command ignored: %c", ans);
    close(sv[0]); /* the rank closes its heartbeat */
    char x;
    CHECK(read(c, &x, 1) == 0, "end of stream after close");
    int st = 0;
    waitpid(child, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the rank's status 0x%x", st);
    close(c);
    /* the watchdog: a child whose supervisor closes its connection exits 1 */
    child = idle_rank();
    c = accept_hello(lfd);
    CHECK(read_record(c, &r) == 0 && r.pid == (uint32_t)child, "the child's start record");
    close(c);
    double took = wait_exit(child, 10, &st);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1, "the child did not exit 1 (status 0x%x)", st);
    CHECK(took < 2, "the child took %.2f s to leave", took);
    /* cut off: a child that hears nothing (the connection open) for its orphan
     * timeout stops itself; ALIVE commands keep it going until they stop */
    setenv(TSR_HB_ORPHAN_ENV, "1.5", 1);
    child = idle_rank();
    unsetenv(TSR_HB_ORPHAN_ENV);
    c = accept_hello(lfd);
    CHECK(read_record(c, &r) == 0 && r.pid == (uint32_t)child, "the orphan's start record");
    double t0 = tsr_now();
    for (uint64_t k = 1; tsr_now() - t0 < 3; k++) { /* 3 s of ALIVE, twice the timeout */
        send_command(c, TSR_HB_CMD_ALIVE, k, k, key, TSR_HB_COMMAND);
        usleep(300000);
    }
    CHECK(waitpid(child, &st, WNOHANG) == 0, "the child left while the supervisor spoke");
    /* a supervisor silent that still takes connections (stalled): waited for,
     * up to 3 times the timeout */
    took = wait_exit(child, 12, &st);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1, "the orphan did not exit 1 (status 0x%x)", st);
    CHECK(took >= 3.5 && took < 9, "the rank left a silent supervisor that takes connections %.2f s after its last "
          "command (timeout 1.5 s: 4.5 s expected)", took);
    close(c);
    /* cut off (its address takes no connection): the rank leaves after the timeout */
    int fl = fcntl(lfd, F_GETFL);
    fcntl(lfd, F_SETFL, fl | O_NONBLOCK);
    while ((c = accept(lfd, NULL, NULL)) >= 0) close(c); /* the rank's tries of it */
    fcntl(lfd, F_SETFL, fl);
    setenv(TSR_HB_ORPHAN_ENV, "1.5", 1);
    child = idle_rank();
    unsetenv(TSR_HB_ORPHAN_ENV);
    c = accept_hello(lfd);
    CHECK(read_record(c, &r) == 0 && r.pid == (uint32_t)child, "the orphan's start record");
    close(lfd);
    took = wait_exit(child, 10, &st);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1, "the orphan did not exit 1 (status 0x%x)", st);
    CHECK(took >= 1 && took < 4, "the orphan left %.2f s after the last command (timeout 1.5 s)", took);
    close(c);
    if (dir) unlink(addr);
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
    test_records(dir);  /* over a Unix socket */
    test_records(NULL); /* over TCP on loopback */
    test_fault();
    rmdir(dir);
    return check_failures ? 1 : 0;
}
