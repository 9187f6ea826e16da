/* heartbeat.c: the rank's side of the supervisor's heartbeat (heartbeat.h). */
#include <errno.h>
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
    uint64_t token;
    pthread_t watchdog;
    int watching;
    uint8_t cmd[TSR_HB_COMMAND]; /* a command being read (watchdog) */
    size_t cmd_have;
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

void tsr_hb_encode(const tsr_hb_record *r, uint8_t out[TSR_HB_RECORD]) {
    tsr_st32(out, r->magic);
    tsr_st16(out + 4, r->version);
    tsr_st16(out + 6, r->phase);
    tsr_st64(out + 8, r->token);
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

void tsr_hb_command(uint32_t kind, uint64_t arg, uint8_t out[TSR_HB_COMMAND]) {
    tsr_st32(out, TSR_HB_CMD_MAGIC);
    tsr_st32(out + 4, kind);
    tsr_st64(out + 8, arg);
}

void tsr_hb_decode(const uint8_t in[TSR_HB_RECORD], tsr_hb_record *r) {
    r->magic = tsr_ld32(in);
    r->version = tsr_ld16(in + 4);
    r->phase = tsr_ld16(in + 6);
    r->token = tsr_ld64(in + 8);
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
    static const char *const names[TSR_HB_N_PHASES] = {"?", "start", "load", "step", "save", "done", "sdc", "preempted"};
    return phase > 0 && phase < TSR_HB_N_PHASES ? names[phase] : "?";
}

/* The supervisor is gone: no rank may outlive it (it could no longer stop the
 * job), so this one leaves now, without MPI_Finalize: mpirun then ends the rest. */
static void supervisor_gone(const tsr_heartbeat *h, const char *why) {
    fprintf(stderr, "tessera train: rank %d: the supervisor (tessera launch) is gone (%s): exiting\n", h->rank, why);
    fflush(stderr);
    _exit(1);
}

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

/* A command from the supervisor, whole: carried out (unknown ones are ignored:
 * a newer supervisor's). */
static void on_command(tsr_heartbeat *h) {
    uint32_t kind = tsr_ld32(h->cmd + 4);
    if (tsr_ld32(h->cmd) != TSR_HB_CMD_MAGIC) kind = 0;
    if (kind == TSR_HB_CMD_NAN) atomic_store(&chaos_nan_step, (int64_t)tsr_ld64(h->cmd + 8));
    if (kind == TSR_HB_CMD_ENOSPC) tsr_fault_set("write:1:ENOSPC", NULL);
    if (kind == TSR_HB_CMD_S3) tsr_fault_outage(NULL, (double)tsr_ld64(h->cmd + 8) / 1000);
    if (kind == TSR_HB_CMD_BITFLIP) {
        atomic_store(&chaos_flip_arg, tsr_ld64(h->cmd + 8));
        atomic_store(&chaos_flip_pending, 1);
    }
    if (kind == TSR_HB_CMD_PREEMPT && !atomic_load(&preempt_asked)) {
        atomic_store(&preempt_grace_ms, tsr_ld64(h->cmd + 8));
        atomic_store(&preempt_heard, tsr_now());
        atomic_store(&preempt_asked, 1);
    }
    h->cmd_have = 0;
}

/* The watchdog: end of stream (or an error) means the supervisor died or gave
 * this job up; bytes are its commands. */
static void *watch(void *arg) {
    tsr_heartbeat *h = arg;
    for (;;) {
        struct pollfd p[2] = {{h->fd, POLLIN, 0}, {h->stop_fd, POLLIN, 0}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR) continue;
            return NULL;
        }
        if (p[1].revents) return NULL;
        if (!p[0].revents) continue;
        ssize_t n = recv(h->fd, h->cmd + h->cmd_have, TSR_HB_COMMAND - h->cmd_have, MSG_DONTWAIT);
        if (n == 0) supervisor_gone(h, "end of its connection");
        if (n < 0 && errno != EAGAIN && errno != EINTR) supervisor_gone(h, strerror(errno));
        if (n > 0 && (h->cmd_have += (size_t)n) == TSR_HB_COMMAND) on_command(h);
    }
}

static void send_record(tsr_heartbeat *h, int phase, int64_t step, double loss, double grad_norm, double step_s,
                        double compute_s) {
    if (!h) return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    tsr_hb_record r = {TSR_HB_MAGIC, TSR_HB_VERSION, (uint16_t)phase, h->token, (uint32_t)h->rank,
                       (uint32_t)h->world, (uint32_t)getpid(), step, loss, grad_norm,
                       (double)ts.tv_sec + ts.tv_nsec * 1e-9, step_s, compute_s};
    uint8_t b[TSR_HB_RECORD];
    tsr_hb_encode(&r, b);
    ssize_t n;
    do n = send(h->fd, b, sizeof b, MSG_DONTWAIT | MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN)) supervisor_gone(h, strerror(errno));
    /* EAGAIN: the supervisor is behind (or stopped): this record is dropped. A
     * partial send cannot happen for 80 bytes on a stream with room for one. */
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

static int parse_token(const char *s, uint64_t *out) {
    if (!s || strlen(s) != 16) return -1;
    uint64_t v = 0;
    for (int i = 0; i < 16; i++) {
        int c = s[i], d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return -1;
        v = v << 4 | (uint64_t)d;
    }
    *out = v;
    return 0;
}

static int connect_to(const char *path, tsr_heartbeat *h, tsr_error *err) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof a.sun_path) return tsr_err(err, TSR_EINVAL, "%s=%s: path too long", TSR_HB_ENV, path);
    memcpy(a.sun_path, path, strlen(path) + 1);
    h->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (h->fd < 0) return tsr_err(err, TSR_EIO, "heartbeat socket: %s", strerror(errno));
    int rc;
    do rc = connect(h->fd, (struct sockaddr *)&a, sizeof a);
    while (rc < 0 && errno == EINTR);
    if (rc < 0)
        return tsr_err(err, TSR_EIO, "%s: cannot reach the supervisor (tessera launch): %s", path, strerror(errno));
    h->stop_fd = eventfd(0, EFD_CLOEXEC);
    if (h->stop_fd < 0) return tsr_err(err, TSR_EIO, "heartbeat eventfd: %s", strerror(errno));
    return 0;
}

int tsr_heartbeat_open(int rank, int world, tsr_heartbeat **out, tsr_error *err) {
    *out = NULL;
    const char *path = getenv(TSR_HB_ENV);
    if (!path || !*path) return 0;
    tsr_heartbeat *h = calloc(1, sizeof *h);
    if (!h) return tsr_err(err, TSR_ENOMEM, "out of memory");
    h->fd = h->stop_fd = -1;
    h->rank = rank;
    h->world = world;
    int rc = parse_token(getenv(TSR_HB_TOKEN_ENV), &h->token)
                 ? tsr_err(err, TSR_EINVAL, "%s is set but %s is not 16 hex digits", TSR_HB_ENV, TSR_HB_TOKEN_ENV)
                 : connect_to(path, h, err);
    if (!rc && pthread_create(&h->watchdog, NULL, watch, h) != 0)
        rc = tsr_err(err, TSR_EIO, "heartbeat: cannot start the watchdog thread");
    if (rc) {
        if (h->fd >= 0) close(h->fd);
        if (h->stop_fd >= 0) close(h->stop_fd);
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
