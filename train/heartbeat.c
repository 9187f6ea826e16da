/* heartbeat.c: the rank's side of the supervisor's heartbeat (heartbeat.h). */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "heartbeat.h"
#include "store.h"

struct tsr_heartbeat {
    int fd, stop_fd;
    int rank, world;
    char addr[200]; /* TSR_HEARTBEAT */
    uint8_t key[TSR_HB_KEY], nonce[TSR_HB_NONCE];
    double orphan_s; /* TSR_HEARTBEAT_ORPHAN_S (0: never) */
    pthread_t watchdog;
    int watching;
    /* the sending side (the training thread and the watchdog's answers) */
    pthread_mutex_t send_lock;
    uint64_t seq_out;
    uint8_t pending[TSR_HB_RECORD]; /* the rest of a record the socket took in part */
    size_t n_pending;
    /* the watchdog's */
    uint8_t cmd[TSR_HB_COMMAND]; /* a command being read */
    size_t cmd_have;
    uint64_t seq_in;
    double heard; /* tsr_now() of the last command */
    struct sockaddr_storage peer; /* the supervisor's address as dialed (supervisor_reachable) */
    socklen_t peer_len;
};

static uint64_t bits_of(double d) {
    uint64_t u;
    memcpy(&u, &d, 8);
    return u;
}

static double double_of(uint64_t u) {
    double d;
    memcpy(&d, &u, 8);
    return d;
}

void tsr_hb_encode(const tsr_hb_record *r, uint8_t out[TSR_HB_BODY]) {
    tsr_st32(out, r->magic);
    tsr_st16(out + 4, r->version);
    tsr_st16(out + 6, r->phase);
    tsr_st64(out + 8, r->seq);
    tsr_st32(out + 16, r->rank);
    tsr_st32(out + 20, r->world);
    tsr_st32(out + 24, r->pid);
    tsr_st32(out + 28, 0);
    tsr_st64(out + 32, (uint64_t)r->step);
    tsr_st64(out + 40, bits_of(r->loss));
    tsr_st64(out + 48, bits_of(r->grad_norm));
    tsr_st64(out + 56, bits_of(r->time));
    tsr_st64(out + 64, bits_of(r->step_s));
    tsr_st64(out + 72, bits_of(r->compute_s));
}

void tsr_hb_command(uint32_t kind, uint64_t arg, uint64_t seq, uint8_t out[TSR_HB_CMD_BODY]) {
    tsr_st32(out, TSR_HB_CMD_MAGIC);
    tsr_st32(out + 4, kind);
    tsr_st64(out + 8, arg);
    tsr_st64(out + 16, seq);
}

void tsr_hb_hello(const uint8_t nonce[TSR_HB_NONCE], uint8_t out[TSR_HB_HELLO]) {
    tsr_st32(out, TSR_HB_HELLO_MAGIC);
    tsr_st32(out + 4, TSR_HB_VERSION);
    memcpy(out + 8, nonce, TSR_HB_NONCE);
}

/* HMAC-SHA256 under key of the nonce, then the body. */
static void tag_of(const uint8_t key[TSR_HB_KEY], const uint8_t nonce[TSR_HB_NONCE], const uint8_t *msg, size_t body,
                   uint8_t out[TSR_HB_TAG]) {
    uint8_t in[TSR_HB_NONCE + TSR_HB_BODY];
    memcpy(in, nonce, TSR_HB_NONCE);
    memcpy(in + TSR_HB_NONCE, msg, body < TSR_HB_BODY ? body : TSR_HB_BODY);
    unsigned len = TSR_HB_TAG;
    if (!HMAC(EVP_sha256(), key, TSR_HB_KEY, in, TSR_HB_NONCE + (body < TSR_HB_BODY ? body : TSR_HB_BODY), out, &len))
        memset(out, 0, TSR_HB_TAG); /* no tag: every check fails */
}

void tsr_hb_seal(const uint8_t key[TSR_HB_KEY], const uint8_t nonce[TSR_HB_NONCE], uint8_t *msg, size_t body) {
    tag_of(key, nonce, msg, body, msg + body);
}

int tsr_hb_check(const uint8_t key[TSR_HB_KEY], const uint8_t nonce[TSR_HB_NONCE], const uint8_t *msg, size_t body) {
    uint8_t t[TSR_HB_TAG];
    tag_of(key, nonce, msg, body, t);
    return CRYPTO_memcmp(t, msg + body, TSR_HB_TAG) == 0;
}

void tsr_hb_key_hex(const uint8_t key[TSR_HB_KEY], char out[2 * TSR_HB_KEY + 1]) {
    for (int i = 0; i < TSR_HB_KEY; i++) snprintf(out + 2 * i, 3, "%02x", key[i]);
}

int tsr_hb_parse_key(const char *s, uint8_t key[TSR_HB_KEY]) {
    if (!s || strlen(s) != 2 * TSR_HB_KEY) return -1;
    for (int i = 0; i < 2 * TSR_HB_KEY; i++) {
        int c = s[i], d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return -1;
        key[i / 2] = (uint8_t)(i % 2 ? key[i / 2] << 4 | d : d);
    }
    return 0;
}

void tsr_hb_decode(const uint8_t in[TSR_HB_BODY], tsr_hb_record *r) {
    r->magic = tsr_ld32(in);
    r->version = tsr_ld16(in + 4);
    r->phase = tsr_ld16(in + 6);
    r->seq = tsr_ld64(in + 8);
    r->rank = tsr_ld32(in + 16);
    r->world = tsr_ld32(in + 20);
    r->pid = tsr_ld32(in + 24);
    r->step = (int64_t)tsr_ld64(in + 32);
    r->loss = double_of(tsr_ld64(in + 40));
    r->grad_norm = double_of(tsr_ld64(in + 48));
    r->time = double_of(tsr_ld64(in + 56));
    r->step_s = double_of(tsr_ld64(in + 64));
    r->compute_s = double_of(tsr_ld64(in + 72));
}

const char *tsr_hb_phase_name(int phase) {
    static const char *const names[TSR_HB_N_PHASES] = {"?", "start", "load", "step", "save", "done", "sdc", "preempted",
                                                        "alive"};
    return phase > 0 && phase < TSR_HB_N_PHASES ? names[phase] : "?";
}

/* The supervisor is gone: no rank may outlive it (it could no longer stop the
 * job), so this one leaves now, without MPI_Finalize: mpirun then ends the rest. */
static void supervisor_gone(const tsr_heartbeat *h, const char *why) {
    fprintf(stderr, "tessera train: rank %d: the supervisor (tessera launch) is gone (%s): exiting\n", h->rank, why);
    fflush(stderr);
    _exit(1);
}

#define ORPHAN_STALLED 3 /* a silent supervisor that takes connections: times orphan_s a rank waits for it */

static _Atomic int64_t chaos_nan_step; /* TSR_HB_CMD_NAN's step (0: none) */

int tsr_heartbeat_chaos_nan(int64_t step) { return step > 0 && atomic_load(&chaos_nan_step) == step; }

static _Atomic int chaos_flip_pending; /* TSR_HB_CMD_BITFLIP came, not yet carried out */
static _Atomic uint64_t chaos_flip_arg;

int tsr_heartbeat_chaos_bitflip(uint64_t *arg) {
    if (!atomic_exchange(&chaos_flip_pending, 0)) return 0;
    *arg = atomic_load(&chaos_flip_arg);
    return 1;
}

static _Atomic int preempt_asked;       /* TSR_HB_CMD_PREEMPT came */
static _Atomic uint64_t preempt_grace_ms; /* its grace */
static _Atomic double preempt_heard;      /* tsr_now() when it came */

int tsr_heartbeat_preempt(double *heard, double *deadline) {
    if (!atomic_load(&preempt_asked)) return 0;
    if (heard) *heard = atomic_load(&preempt_heard);
    if (deadline) *deadline = atomic_load(&preempt_heard) + (double)atomic_load(&preempt_grace_ms) / 1000;
    return 1;
}

static void send_record(tsr_heartbeat *h, int phase, int64_t step, double loss, double grad_norm, double step_s,
                        double compute_s);

/* A command from the supervisor, whole: checked (one without the launch's
 * key, or replayed, is said and ignored) and carried out (unknown kinds are
 * ignored: a newer supervisor's). */
static void on_command(tsr_heartbeat *h) {
    h->cmd_have = 0;
    uint32_t kind = tsr_ld32(h->cmd + 4);
    uint64_t arg = tsr_ld64(h->cmd + 8), seq = tsr_ld64(h->cmd + 16);
    const char *bad = tsr_ld32(h->cmd) != TSR_HB_CMD_MAGIC                          ? "not a command"
                      : !tsr_hb_check(h->key, h->nonce, h->cmd, TSR_HB_CMD_BODY) ? "not signed with the launch's key"
                      : seq != h->seq_in + 1                                     ? "out of sequence (replayed?)"
                                                                                 : NULL;
    if (bad) {
        fprintf(stderr, "tessera train: rank %d: a heartbeat command refused: %s\n", h->rank, bad);
        return;
    }
    h->seq_in = seq;
    h->heard = tsr_now();
    if (kind == TSR_HB_CMD_ALIVE) send_record(h, TSR_HB_ALIVE, (int64_t)arg, 0, 0, 0, 0);
    if (kind == TSR_HB_CMD_NAN) atomic_store(&chaos_nan_step, (int64_t)arg);
    if (kind == TSR_HB_CMD_ENOSPC) tsr_fault_set("write:1:ENOSPC", NULL);
    if (kind == TSR_HB_CMD_S3) tsr_fault_outage(NULL, (double)arg / 1000);
    if (kind == TSR_HB_CMD_BITFLIP) {
        atomic_store(&chaos_flip_arg, arg);
        atomic_store(&chaos_flip_pending, 1);
    }
    if (kind == TSR_HB_CMD_PREEMPT && !atomic_load(&preempt_asked)) {
        atomic_store(&preempt_grace_ms, arg);
        atomic_store(&preempt_heard, tsr_now());
        atomic_store(&preempt_asked, 1);
    }
}

/* Whether the supervisor's address (the one this rank's connection reached)
 * takes a new connection within a second: its machine is up and reached, and
 * its process listens (a stalled supervisor's kernel still accepts). The
 * connection is closed at once. */
static int supervisor_reachable(const tsr_heartbeat *h) {
    if (!h->peer_len) return 0;
    int fd = socket(h->peer.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), e = -1;
    if (fd < 0) return 0;
    if (connect(fd, (const struct sockaddr *)&h->peer, h->peer_len) == 0) {
        e = 0;
    } else if (errno == EINPROGRESS) {
        struct pollfd p = {fd, POLLOUT, 0};
        socklen_t el = sizeof e;
        if (poll(&p, 1, 1000) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) != 0) e = -1;
    }
    close(fd);
    return e == 0;
}

/* The watchdog: end of stream (or an error) means the supervisor died or gave
 * this job up, and silence for orphan_s that it cannot reach this rank (a
 * network partition); bytes are its commands. A supervisor silent that still
 * takes connections is stalled, not cut off: the rank waits on for it, up to
 * ORPHAN_STALLED times orphan_s in all. */
static void *watch(void *arg) {
    tsr_heartbeat *h = arg;
    h->heard = tsr_now();
    double reached_at = 0; /* tsr_now() when a silent supervisor last took a connection */
    for (;;) {
        struct pollfd p[2] = {{h->fd, POLLIN, 0}, {h->stop_fd, POLLIN, 0}};
        int rc = poll(p, 2, h->orphan_s > 0 ? 200 : -1);
        if (rc < 0 && errno != EINTR) return NULL;
        if (rc > 0 && p[1].revents) return NULL;
        if (rc > 0 && p[0].revents) { /* what came first: a process stalled for a while finds commands waiting */
            ssize_t n = recv(h->fd, h->cmd + h->cmd_have, TSR_HB_COMMAND - h->cmd_have, MSG_DONTWAIT);
            if (n == 0) supervisor_gone(h, "end of its connection");
            if (n < 0 && errno != EAGAIN && errno != EINTR) supervisor_gone(h, strerror(errno));
            if (n > 0 && (h->cmd_have += (size_t)n) == TSR_HB_COMMAND) on_command(h);
        }
        double silent = tsr_now() - h->heard;
        if (h->orphan_s > 0 && silent > h->orphan_s) {
            if (silent <= ORPHAN_STALLED * h->orphan_s && tsr_now() - reached_at < h->orphan_s / 2) continue;
            if (silent <= ORPHAN_STALLED * h->orphan_s && supervisor_reachable(h)) {
                if (reached_at < h->heard)
                    fprintf(stderr, "tessera train: rank %d: nothing from the supervisor for %.1f s (%s %g), but it "
                            "takes connections: waiting on for it, up to %g s\n", h->rank, silent, TSR_HB_ORPHAN_ENV,
                            h->orphan_s, ORPHAN_STALLED * h->orphan_s);
                reached_at = tsr_now();
                continue;
            }
            char why[128];
            snprintf(why, sizeof why, "nothing from it for %.1f s, over the %g s of %s%s", silent, h->orphan_s,
                     TSR_HB_ORPHAN_ENV, silent > ORPHAN_STALLED * h->orphan_s ? " (and its stall's allowance)" : "");
            supervisor_gone(h, why);
        }
    }
}

/* Sends what the socket takes of b (n bytes) without blocking. @return the
 * bytes sent; a supervisor that is gone ends the process. */
static size_t send_some(tsr_heartbeat *h, const uint8_t *b, size_t n) {
    ssize_t k;
    do k = send(h->fd, b, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    while (k < 0 && errno == EINTR);
    if (k < 0 && (errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN)) supervisor_gone(h, strerror(errno));
    return k > 0 ? (size_t)k : 0; /* EAGAIN: the supervisor is behind, or cut off */
}

static void send_record(tsr_heartbeat *h, int phase, int64_t step, double loss, double grad_norm, double step_s,
                        double compute_s) {
    if (!h) return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    pthread_mutex_lock(&h->send_lock);
    if (h->n_pending) { /* a record the socket took in part: its rest first (a stream) */
        size_t k = send_some(h, h->pending, h->n_pending);
        memmove(h->pending, h->pending + k, h->n_pending - k);
        h->n_pending -= k;
    }
    if (!h->n_pending) { /* else this record is dropped, as one that finds the socket full */
        tsr_hb_record r = {TSR_HB_MAGIC, TSR_HB_VERSION, (uint16_t)phase, ++h->seq_out, (uint32_t)h->rank,
                           (uint32_t)h->world, (uint32_t)getpid(), step, loss, grad_norm,
                           (double)ts.tv_sec + ts.tv_nsec * 1e-9, step_s, compute_s};
        uint8_t b[TSR_HB_RECORD];
        tsr_hb_encode(&r, b);
        tsr_hb_seal(h->key, h->nonce, b, TSR_HB_BODY);
        size_t k = send_some(h, b, sizeof b);
        if (k == 0) h->seq_out--; /* nothing of it went: the next record takes its number */
        else if (k < sizeof b) memcpy(h->pending, b + k, h->n_pending = sizeof b - k);
    }
    pthread_mutex_unlock(&h->send_lock);
}

void tsr_heartbeat_send(tsr_heartbeat *h, int phase, int64_t step, double loss, double grad_norm, double step_s) {
    send_record(h, phase, step, loss, grad_norm, step_s, 0);
}

void tsr_heartbeat_step(tsr_heartbeat *h, int64_t step, double loss, double grad_norm, double step_s, double compute_s) {
    send_record(h, TSR_HB_STEP, step, loss, grad_norm, step_s, compute_s);
}

void tsr_heartbeat_sdc(tsr_heartbeat *h, int64_t step, int verdict, int holders, int agree) {
    send_record(h, TSR_HB_SDC, step, verdict, holders, agree, 0);
}

void tsr_heartbeat_preempted(tsr_heartbeat *h, int64_t step, int64_t local_step, int64_t durable_step,
                             double local_s, double durable_s) {
    send_record(h, TSR_HB_PREEMPTED, step, (double)local_step, (double)durable_step, local_s, durable_s);
}

/* A connected socket to addr: a Unix socket's path, or "tcp:HOST:PORT". */
static int dial(const char *addr, tsr_error *err) {
    if (strncmp(addr, "tcp:", 4) != 0) {
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        if (strlen(addr) >= sizeof a.sun_path) return tsr_err(err, TSR_EINVAL, "%s=%s: path too long", TSR_HB_ENV, addr);
        memcpy(a.sun_path, addr, strlen(addr) + 1);
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), rc = -1;
        if (fd >= 0) do rc = connect(fd, (struct sockaddr *)&a, sizeof a);
            while (rc < 0 && errno == EINTR);
        if (rc == 0) return fd;
        int e = errno;
        if (fd >= 0) close(fd);
        return tsr_err(err, TSR_EIO, "%s: cannot reach the supervisor (tessera launch): %s", addr, strerror(e));
    }
    char host[160];
    const char *colon = strrchr(addr + 4, ':');
    if (!colon || colon == addr + 4 || (size_t)(colon - addr - 4) >= sizeof host || !colon[1])
        return tsr_err(err, TSR_EINVAL, "%s=%s: not tcp:HOST:PORT", TSR_HB_ENV, addr);
    memcpy(host, addr + 4, (size_t)(colon - addr - 4));
    host[colon - addr - 4] = 0;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int g = getaddrinfo(host, colon + 1, &hints, &res);
    if (g) return tsr_err(err, TSR_EIO, "%s: cannot resolve the supervisor's address: %s", addr, gai_strerror(g));
    int fd = -1, e = 0;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        int rc = fd < 0 ? -1 : 0;
        if (fd >= 0) do rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
            while (rc < 0 && errno == EINTR);
        if (rc < 0) {
            e = errno;
            if (fd >= 0) close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0) return tsr_err(err, TSR_EIO, "%s: cannot reach the supervisor (tessera launch): %s", addr, strerror(e));
    int one = 1; /* records are small and each is news */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

#define HELLO_WAIT_S 10.0 /* seconds the supervisor may take to say hello */

/* The supervisor's hello: its version and the connection's nonce. */
static int read_hello(tsr_heartbeat *h, tsr_error *err) {
    uint8_t b[TSR_HB_HELLO];
    size_t have = 0;
    double t0 = tsr_now();
    while (have < sizeof b) {
        struct pollfd p = {h->fd, POLLIN, 0};
        double left = HELLO_WAIT_S - (tsr_now() - t0);
        if (left <= 0 || (poll(&p, 1, (int)(left * 1000) + 1) < 0 && errno != EINTR))
            return tsr_err(err, TSR_EIO, "%s: the supervisor did not say hello within %g s", h->addr, HELLO_WAIT_S);
        ssize_t n = recv(h->fd, b + have, sizeof b - have, MSG_DONTWAIT);
        if (n == 0) return tsr_err(err, TSR_EIO, "%s: the supervisor closed the connection before its hello", h->addr);
        if (n < 0 && errno != EAGAIN && errno != EINTR)
            return tsr_err(err, TSR_EIO, "%s: reading the supervisor's hello: %s", h->addr, strerror(errno));
        if (n > 0) have += (size_t)n;
    }
    if (tsr_ld32(b) != TSR_HB_HELLO_MAGIC || tsr_ld32(b + 4) != TSR_HB_VERSION)
        return tsr_err(err, TSR_EIO, "%s: not a tessera launch heartbeat of version %d (hello 0x%08x, version %u)",
                       h->addr, TSR_HB_VERSION, tsr_ld32(b), tsr_ld32(b + 4));
    memcpy(h->nonce, b + 8, TSR_HB_NONCE);
    return 0;
}

/* The environment's key and orphan timeout. */
static int read_env(tsr_heartbeat *h, tsr_error *err) {
    if (tsr_hb_parse_key(getenv(TSR_HB_KEY_ENV), h->key))
        return tsr_err(err, TSR_EINVAL, "%s is set but %s is not 64 hex digits", TSR_HB_ENV, TSR_HB_KEY_ENV);
    const char *o = getenv(TSR_HB_ORPHAN_ENV);
    char *end = NULL;
    h->orphan_s = o && *o ? strtod(o, &end) : 0;
    if (o && *o && (*end || !(h->orphan_s >= 0 && h->orphan_s < 1e6)))
        return tsr_err(err, TSR_EINVAL, "%s=%s: not a number of seconds", TSR_HB_ORPHAN_ENV, o);
    return 0;
}

int tsr_heartbeat_open(int rank, int world, tsr_heartbeat **out, tsr_error *err) {
    *out = NULL;
    const char *addr = getenv(TSR_HB_ENV);
    if (!addr || !*addr) return 0;
    tsr_heartbeat *h = calloc(1, sizeof *h);
    if (!h) return tsr_err(err, TSR_ENOMEM, "out of memory");
    h->fd = h->stop_fd = -1;
    h->rank = rank;
    h->world = world;
    snprintf(h->addr, sizeof h->addr, "%s", addr);
    pthread_mutex_init(&h->send_lock, NULL);
    int rc = read_env(h, err);
    if (!rc && (h->fd = dial(addr, err)) < 0) rc = h->fd;
    if (!rc) {
        h->peer_len = sizeof h->peer;
        if (getpeername(h->fd, (struct sockaddr *)&h->peer, &h->peer_len) != 0) h->peer_len = 0;
        rc = read_hello(h, err);
    }
    if (!rc && (h->stop_fd = eventfd(0, EFD_CLOEXEC)) < 0) rc = tsr_err(err, TSR_EIO, "heartbeat eventfd: %s", strerror(errno));
    if (!rc && pthread_create(&h->watchdog, NULL, watch, h) != 0)
        rc = tsr_err(err, TSR_EIO, "heartbeat: cannot start the watchdog thread");
    if (rc) {
        if (h->fd >= 0) close(h->fd);
        if (h->stop_fd >= 0) close(h->stop_fd);
        pthread_mutex_destroy(&h->send_lock);
        free(h);
        return rc;
    }
    h->watching = 1;
    tsr_heartbeat_send(h, TSR_HB_START, 0, 0, 0, 0);
    *out = h;
    return 0;
}

void tsr_heartbeat_close(tsr_heartbeat *h) {
    if (!h) return;
    if (h->watching) {
        uint64_t one = 1;
        if (write(h->stop_fd, &one, sizeof one) != sizeof one) return; /* the thread may still use h */
        pthread_join(h->watchdog, NULL);
    }
    close(h->fd);
    close(h->stop_fd);
    pthread_mutex_destroy(&h->send_lock);
    free(h);
}

static _Atomic uint64_t fault_nan_step; /* 0: none; set by the watchdog too */

void tsr_heartbeat_set_fault_nan(uint64_t step) { atomic_store(&fault_nan_step, step); }

int tsr_heartbeat_fault_nan(uint64_t first_sample, int global_batch) {
    uint64_t s = atomic_load(&fault_nan_step);
    return s > 0 && first_sample == (s - 1) * (uint64_t)global_batch;
}

static int fault_slow_rank = -1, fault_slow_ms;

void tsr_heartbeat_set_fault_slow(int rank, int ms) {
    fault_slow_rank = rank;
    fault_slow_ms = ms;
}

void tsr_heartbeat_fault_slow(int rank) {
    if (rank != fault_slow_rank || fault_slow_ms <= 0) return;
    struct timespec ts = {fault_slow_ms / 1000, (long)(fault_slow_ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}
