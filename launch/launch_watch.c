/* launch_watch.c: tessera launch's heartbeat socket and the watch over one
 * launch: records read and checked (refused ones logged with their reason), a
 * rank that leaves, a hang, a NaN, a straggler, mpirun's exit. */
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "launch.h"

#define UNCLAIMED_S 10.0 /* seconds a connection may stay silent before its first record */
#define MAX_REFUSALS_LOGGED 100

/* Over machines: a TCP port on the address the ranks reach this machine by
 * (--listen ADDR[:PORT], else the one towards the first host), and only there. */
static int listen_tcp(launch *L) {
    char addr[160], why[300], port[16] = "0";
    if (L->o.listen) {
        snprintf(addr, sizeof addr, "%s", L->o.listen);
        char *colon = strrchr(addr, ':');
        if (colon && !strchr(addr, ']') && strchr(addr, ':') == colon) { /* ADDR:PORT (not a bare IPv6 address) */
            snprintf(port, sizeof port, "%s", colon + 1);
            *colon = 0;
        }
    } else if (launch_local_addr(L->o.hosts[0], addr, sizeof addr, why, sizeof why)) {
        launch_say("the heartbeat's address: %s (give one with --listen ADDR)", why);
        return -1;
    }
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV}, *res = NULL;
    int g = getaddrinfo(addr, port, &hints, &res);
    if (g) {
        launch_say("--listen %s: not a numeric address and port: %s", L->o.listen ? L->o.listen : addr, gai_strerror(g));
        return -1;
    }
    int one = 1;
    L->listen_fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (L->listen_fd >= 0) setsockopt(L->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int bad = L->listen_fd < 0 || bind(L->listen_fd, res->ai_addr, res->ai_addrlen) || listen(L->listen_fd, 512);
    freeaddrinfo(res);
    struct sockaddr_storage a;
    socklen_t al = sizeof a;
    char host[80], serv[16];
    if (bad || getsockname(L->listen_fd, (struct sockaddr *)&a, &al) ||
        getnameinfo((struct sockaddr *)&a, al, host, sizeof host, serv, sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV)) {
        launch_say("heartbeat: cannot listen on %s port %s: %s", addr, port, strerror(errno));
        return -1;
    }
    snprintf(L->hb_addr, sizeof L->hb_addr, strchr(host, ':') ? "tcp:[%s]:%s" : "tcp:%s:%s", host, serv);
    return 0;
}

int launch_listen(launch *L) {
    if (L->o.n_hosts > 0) return listen_tcp(L);
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp || strlen(tmp) > 60) tmp = "/tmp";
    snprintf(L->sock_dir, sizeof L->sock_dir, "%s/tessera-launch-XXXXXX", tmp);
    if (!mkdtemp(L->sock_dir)) { /* mode 0700: only this user reaches the socket */
        launch_say("%s: cannot create: %s", L->sock_dir, strerror(errno));
        return -1;
    }
    snprintf(L->sock_path, sizeof L->sock_path, "%s/heartbeat", L->sock_dir);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    memcpy(a.sun_path, L->sock_path, strlen(L->sock_path) + 1);
    L->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (L->listen_fd < 0 || bind(L->listen_fd, (struct sockaddr *)&a, sizeof a) || listen(L->listen_fd, 128)) {
        launch_say("%s: cannot listen: %s", L->sock_path, strerror(errno));
        return -1;
    }
    snprintf(L->hb_addr, sizeof L->hb_addr, "%s", L->sock_path);
    return 0;
}

void launch_unlisten(launch *L) {
    if (L->listen_fd >= 0) close(L->listen_fd);
    L->listen_fd = -1;
    if (L->sock_path[0]) unlink(L->sock_path);
    if (L->sock_dir[0]) rmdir(L->sock_dir);
}

static void close_conn(launch *L, int i) {
    close(L->conns[i].fd);
    L->conns[i] = L->conns[--L->n_conns];
}

void launch_close_conns(launch *L) {
    while (L->n_conns) close_conn(L, L->n_conns - 1);
}

static void decide(launch *L, launch_outcome out, int culprit, int64_t step, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void decide(launch *L, launch_outcome out, int culprit, int64_t step, const char *fmt, ...) {
    if ((int)L->out >= 0) return; /* the first cause stands */
    L->out = out;
    L->culprit = culprit;
    L->bad_step = step;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(L->why, sizeof L->why, fmt, ap);
    va_end(ap);
}

/* A refused connection: logged (the first MAX_REFUSALS_LOGGED), then closed. */
static void refuse(launch *L, int i, const char *why) {
    conn *c = &L->conns[i];
    if (L->n_refused++ < MAX_REFUSALS_LOGGED) {
        char j[320];
        char pj[80], from[80];
        launch_event(L, "refused", "\"pid\": %d, \"claimed_rank\": %d, \"reason\": %s%s%s", (int)c->pid, c->rank,
                     launch_json(why, j, sizeof j), c->peer[0] ? ", \"peer\": " : "",
                     c->peer[0] ? launch_json(c->peer, pj, sizeof pj) : "");
        if (c->peer[0]) snprintf(from, sizeof from, "%s", c->peer);
        else snprintf(from, sizeof from, "pid %d", (int)c->pid);
        launch_say("heartbeat refused from %s: %s", from, why);
    }
    if (c->rank >= 0) /* a rank of the job that sends garbage is broken */
        decide(L, OUT_RANK_EXIT, c->rank, L->ranks[c->rank].step, "rank %d sent a bad heartbeat: %s", c->rank, why);
    close_conn(L, i);
}

/* The checks of one record from connection c. @return 0, or -1 with why. */
static int check_record(const launch *L, const conn *c, const tsr_hb_record *r, char *why, size_t len) {
    if (r->magic != TSR_HB_MAGIC) return snprintf(why, len, "not a heartbeat (magic 0x%08x)", r->magic), -1;
    if (r->version != TSR_HB_VERSION)
        return snprintf(why, len, "heartbeat version %u (this supervisor speaks %d)", r->version, TSR_HB_VERSION), -1;
    if (!tsr_hb_check(L->key, c->nonce, c->buf, TSR_HB_BODY))
        return snprintf(why, len, "not signed with this launch's key (a bad tag)"), -1;
    if (r->seq != c->seq_in + 1)
        return snprintf(why, len, "sequence number %llu where %llu was due (a replayed record)", (unsigned long long)r->seq,
                        (unsigned long long)c->seq_in + 1), -1;
    if (r->phase < TSR_HB_START || r->phase >= TSR_HB_N_PHASES) return snprintf(why, len, "unknown phase %u", r->phase), -1;
    if ((int)r->world != L->np || r->rank >= r->world)
        return snprintf(why, len, "rank %u of %u: this job has %d ranks", r->rank, r->world, L->np), -1;
    if (r->phase == TSR_HB_STEP ? !(r->compute_s >= 0 && r->compute_s <= r->step_s)
                                : r->phase != TSR_HB_PREEMPTED && r->compute_s != 0)
        return snprintf(why, len, "compute time %g outside 0..the step time %g", r->compute_s, r->step_s), -1;
    if (r->phase == TSR_HB_PREEMPTED && !L->preempting)
        return snprintf(why, len, "a preemption record, but this job was not preempted"), -1;
    if (r->phase == TSR_HB_PREEMPTED && !(r->loss >= -1 && r->loss <= (double)r->step && r->loss == (int64_t)r->loss &&
                                          r->grad_norm >= -1 && r->grad_norm <= (double)r->step &&
                                          r->grad_norm == (int64_t)r->grad_norm && r->step_s >= 0 && r->compute_s >= 0))
        return snprintf(why, len, "a preemption record with steps %g and %g of step %lld", r->loss, r->grad_norm,
                        (long long)r->step), -1;
    if (r->phase == TSR_HB_SDC && !(r->loss == 0 || r->loss == 1 || r->loss == 2))
        return snprintf(why, len, "a replica check record with verdict %g (not 0, 1 or 2)", r->loss), -1;
    if (r->phase == TSR_HB_SDC && !(r->grad_norm >= 0 && r->grad_norm <= r->world && r->grad_norm == (int)r->grad_norm &&
                                    r->step_s >= 0 && r->step_s <= r->grad_norm && r->step_s == (int)r->step_s))
        return snprintf(why, len, "a replica check record with %g of %g holders agreeing", r->step_s, r->grad_norm), -1;
    if (c->pid > 0 && (pid_t)r->pid != c->pid)
        return snprintf(why, len, "the record says pid %u, the sender is pid %d", r->pid, (int)c->pid), -1;
    if (c->rank >= 0 && (int)r->rank != c->rank)
        return snprintf(why, len, "rank %d claims to be rank %u", c->rank, r->rank), -1;
    if (c->rank < 0 && L->ranks[r->rank].claimed)
        return snprintf(why, len, "rank %u is already held by pid %d", r->rank, (int)L->ranks[r->rank].pid), -1;
    if (c->rank < 0 && c->pid > 0 && !launch_descends(c->pid, L->mpirun))
        return snprintf(why, len, "pid %d is not a process of this job (not below mpirun, pid %d)", (int)c->pid,
                        (int)L->mpirun), -1;
    return 0;
}

/* The median of a rank's window: one stall (a rank descheduled for a second
 * on a loaded machine) does not move it; a rank slow step after step does. */
static double window_median(const rank_state *s) {
    double v[LAUNCH_WINDOW];
    for (int i = 0; i < LAUNCH_WINDOW; i++) {
        int k = i;
        for (; k > 0 && v[k - 1] > s->win[i]; k--) v[k] = v[k - 1];
        v[k] = s->win[i];
    }
    return (v[(LAUNCH_WINDOW - 1) / 2] + v[LAUNCH_WINDOW / 2]) / 2;
}

/* The median of the other ranks' window medians (0: none has a full window). */
static double others_median(const launch *L, int rank) {
    double v[LAUNCH_SPARE_CONNS];
    int n = 0;
    for (int q = 0; q < L->np && n < LAUNCH_SPARE_CONNS; q++) /* at most 32 ranks sampled: enough for a median */
        if (q != rank && L->ranks[q].n_win >= LAUNCH_WINDOW) {
            double m = window_median(&L->ranks[q]);
            int k = n++;
            for (; k > 0 && v[k - 1] > m; k--) v[k] = v[k - 1];
            v[k] = m;
        }
    return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Straggler: the rank's median compute time (its step time less its waits in
 * the data plane: every rank waits for the slow one in the collectives, so
 * their step times are alike) over its last LAUNCH_WINDOW steps against 1.5x
 * the median of the other ranks', and at least LAUNCH_STRAGGLER_FLOOR seconds
 * above it (a loaded machine jitters small steps). */
static void check_straggler(launch *L, int rank, int64_t step) {
    rank_state *s = &L->ranks[rank];
    double med = others_median(L, rank);
    if (s->n_win < LAUNCH_WINDOW || med <= 0) return;
    double own = window_median(s);
    int slow = own > 1.5 * med && own - med >= LAUNCH_STRAGGLER_FLOOR;
    if (slow && !s->straggling) {
        s->straggling = 1;
        launch_event(L, "straggler", "\"rank\": %d, \"pid\": %d, \"node\": %d, \"step\": %lld, \"compute_s\": %.4f, "
                     "\"median_s\": %.4f", rank, (int)s->pid, launch_node_of(L, rank), (long long)step, own, med);
        launch_say("straggler: rank %d (node %d) computed %.3f s per step (median of its last %d steps), %.1fx the other "
                   "ranks' median %.3f s", rank, launch_node_of(L, rank), own, LAUNCH_WINDOW, own / med, med);
    } else if (!slow) {
        s->straggling = 0;
    }
}

static void on_step(launch *L, int rank, const tsr_hb_record *r) {
    rank_state *s = &L->ranks[rank];
    if (L->first_step < 0) {
        L->first_step = r->step;
        if (L->failed_at > 0) { /* the job is training again: what the last failure cost */
            double down = tsr_now() - L->failed_at, med = launch_median(L);
            int64_t redone = L->failed_step - (r->step - 1);
            if (redone < 0) redone = 0;
            double cost = down + (double)redone * med;
            L->lost_s += cost;
            launch_event(L, "recovered", "\"step\": %lld, \"downtime_s\": %.3f, \"redone_steps\": %lld, \"cost_s\": %.3f",
                         (long long)r->step, down, (long long)redone, cost);
            L->failed_at = 0;
        }
    }
    if (r->step > L->last_step) L->last_step = r->step;
    if (r->step > L->first_step && r->step_s > 0 && isfinite(r->step_s)) { /* not a launch's first (warm-up) step */
        L->hist[L->n_hist++ % LAUNCH_HISTORY] = r->step_s;
        s->win[s->i_win++ % LAUNCH_WINDOW] = r->compute_s;
        if (s->n_win < LAUNCH_WINDOW) s->n_win++;
    }
    if (!isfinite(r->loss) || !isfinite(r->grad_norm)) {
        if ((int)L->out >= 0) return; /* every rank reports it: the first one is logged */
        launch_event(L, "nan", "\"rank\": %d, \"step\": %lld, \"loss\": \"%g\", \"grad_norm\": \"%g\"", rank,
                     (long long)r->step, r->loss, r->grad_norm);
        decide(L, OUT_NAN, rank, r->step, "step %lld: loss %g, grad norm %g", (long long)r->step, r->loss, r->grad_norm);
        return;
    }
    check_straggler(L, rank, r->step);
}

/* A rank's TSR_HB_SDC record (train/heartbeat.h): the replica check failed.
 * The first record from any rank decides the launch's end; the named ranks'
 * are logged as "sdc" events, and a blamed one is the culprit (its node's
 * failure). */
static void on_sdc(launch *L, int rank, const tsr_hb_record *r) {
    int verdict = (int)r->loss, holders = (int)r->grad_norm, agree = (int)r->step_s;
    if (L->out != OUT_SDC && (int)L->out >= 0) return; /* another cause came first */
    if (L->out != OUT_SDC) {
        decide(L, OUT_SDC, -1, r->step, "silent data corruption: the replica check of step %lld failed",
               (long long)r->step);
        L->sdc_until = tsr_now() + LAUNCH_SDC_DRAIN_S;
    }
    if (verdict != 1 && verdict != 2) return;
    int node = launch_node_of(L, rank);
    launch_event(L, "sdc", "\"rank\": %d, \"pid\": %d, \"node\": %d, \"step\": %lld, \"holders\": %d, \"agree\": %d, "
                 "\"blamed\": %s", rank, (int)L->ranks[rank].pid, node, (long long)r->step, holders, agree,
                 verdict == 2 ? "true" : "false");
    launch_say("silent data corruption at step %lld: rank %d (node %d) holds a copy that %d of the %d holders of its "
               "group share%s", (long long)r->step, rank, node, agree, holders,
               verdict == 2 ? ": outvoted by the majority, blamed" : ": no majority, none blamed");
    size_t n = strlen(L->why);
    snprintf(L->why + n, sizeof L->why - n, "%s rank %d (node %d%s)", strstr(L->why, "; named") ? "," : "; named",
             rank, node, verdict == 2 ? ", blamed" : "");
    if (verdict == 2 && L->culprit < 0) L->culprit = rank;
}

static void on_record(launch *L, int i) {
    conn *c = &L->conns[i];
    tsr_hb_record r;
    tsr_hb_decode(c->buf, &r);
    char why[200];
    if (check_record(L, c, &r, why, sizeof why)) {
        refuse(L, i, why);
        return;
    }
    c->seq_in = r.seq;
    rank_state *s = &L->ranks[r.rank];
    if (c->rank < 0) {
        c->rank = (int)r.rank;
        s->claimed = 1;
        s->pid = c->pid > 0 ? c->pid : (pid_t)r.pid;
        s->addr = c->sa, s->addr_len = c->sa_len;
        char j[80];
        launch_event(L, "rank_up", "\"rank\": %u, \"pid\": %d, \"node\": %d%s%s", r.rank, (int)s->pid,
                     launch_node_of(L, c->rank), c->peer[0] ? ", \"peer\": " : "",
                     c->peer[0] ? launch_json(c->peer, j, sizeof j) : "");
        launch_preempt_rank_up(L, c->rank);
    }
    s->alive = tsr_now();
    if (r.phase == TSR_HB_ALIVE) return; /* its watchdog: the rank is there, wherever its training thread is */
    s->heard = tsr_now();
    s->phase = r.phase;
    if (r.phase == TSR_HB_STEP) s->step = r.step;
    if (r.phase == TSR_HB_DONE) s->done = 1;
    if (r.phase == TSR_HB_STEP) on_step(L, c->rank, &r);
    if (r.phase == TSR_HB_SDC) on_sdc(L, c->rank, &r);
    if (r.phase == TSR_HB_PREEMPTED) launch_preempt_record(L, c->rank, &r);
}

/* End of a connection: a rank that leaves before it is done fails the launch
 * (after a failed replica check every rank leaves: no news). */
static void on_eof(launch *L, int i, const char *how) {
    conn *c = &L->conns[i];
    if (c->rank >= 0 && !L->ranks[c->rank].done && L->out != OUT_SDC) {
        rank_state *s = &L->ranks[c->rank];
        launch_event(L, "rank_exit", "\"rank\": %d, \"pid\": %d, \"node\": %d, \"step\": %lld, \"phase\": \"%s\"",
                     c->rank, (int)s->pid, launch_node_of(L, c->rank), (long long)s->step, tsr_hb_phase_name(s->phase));
        char nn[LAUNCH_HOST_NAME + 8];
        decide(L, OUT_RANK_EXIT, c->rank, s->step, "rank %d (pid %d, %s) left at step %lld (%s)", c->rank,
               (int)s->pid, launch_node_name(L, launch_node_of(L, c->rank), nn, sizeof nn), (long long)s->step, how);
    } else if (c->rank < 0 && c->have) {
        refuse(L, i, "a partial record, then the end of the stream");
        return;
    }
    close_conn(L, i);
}

/* Reads what connection i has; its end of stream only with `ends` (a round
 * reads every connection's records before any end: a rank that found
 * corruption tells it before any rank can leave). @return 1 if it was closed. */
static int read_conn(launch *L, int i, int ends) {
    for (;;) {
        conn *c = &L->conns[i];
        ssize_t n = recv(c->fd, c->buf + c->have, TSR_HB_RECORD - c->have, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (n <= 0 && !ends) return 0; /* an end stays: the next pass sees it */
        if (n <= 0) {
            on_eof(L, i, n == 0 ? "its connection ended" : strerror(errno));
            return 1;
        }
        c->have += (size_t)n;
        if (c->have < TSR_HB_RECORD) continue;
        c->have = 0;
        int before = L->n_conns;
        on_record(L, i);
        if (L->n_conns != before) return 1;
    }
}

static void accept_all(launch *L) {
    for (;;) {
        struct sockaddr_storage a;
        socklen_t al = sizeof a;
        int fd = accept4(L->listen_fd, (struct sockaddr *)&a, &al, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;
        conn *c = &L->conns[L->n_conns];
        *c = (conn){.fd = fd, .uid = getuid(), .rank = -1, .opened = tsr_now()};
        if (a.ss_family == AF_UNIX) { /* a process of this machine: its pid and user */
            struct ucred cr = {0};
            socklen_t cl = sizeof cr;
            getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl);
            c->pid = cr.pid, c->uid = cr.uid;
        } else { /* a rank of another host: its address (the key is its proof) */
            char h[48], p[8];
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            if (!getnameinfo((struct sockaddr *)&a, al, h, sizeof h, p, sizeof p, NI_NUMERICHOST | NI_NUMERICSERV))
                snprintf(c->peer, sizeof c->peer, "%s:%s", h, p);
            c->sa = a, c->sa_len = al;
        }
        if (L->n_conns == L->max_conns) { /* the spare slot: refused at once */
            L->n_conns++;
            refuse(L, L->n_conns - 1, "too many connections");
            continue;
        }
        L->n_conns++;
        if (c->uid != getuid()) {
            refuse(L, L->n_conns - 1, "another user's process");
            continue;
        }
        uint8_t hello[TSR_HB_HELLO];
        if (getrandom(c->nonce, sizeof c->nonce, 0) != sizeof c->nonce) {
            refuse(L, L->n_conns - 1, "no random nonce for it");
            continue;
        }
        tsr_hb_hello(c->nonce, hello);
        if (send(fd, hello, sizeof hello, MSG_DONTWAIT | MSG_NOSIGNAL) != (ssize_t)sizeof hello)
            refuse(L, L->n_conns - 1, "its hello could not be sent");
    }
}

/* A hang: a rank silent for longer than its phase allows. */
static void check_hang(launch *L) {
    double now = tsr_now(), med = launch_median(L);
    double timeout = L->o.hang_timeout > 0 ? L->o.hang_timeout : fmax(LAUNCH_HANG_FLOOR, 5 * med);
    double startup = fmax(LAUNCH_START_ALLOW, timeout);
    for (int r = 0; r < L->np; r++) {
        rank_state *s = &L->ranks[r];
        if (s->done) continue;
        int steady = s->phase == TSR_HB_STEP || (s->phase == TSR_HB_SAVE && L->o.hang_timeout > 0);
        double allow = steady && (L->o.hang_timeout > 0 || med > 0) ? timeout : startup;
        double silent = now - (s->claimed ? s->heard : L->started);
        if (silent <= allow) continue;
        /* every rank waits for a stopped one: name the stopped one if there is */
        int culprit = r;
        for (int q = 0; q < L->np && L->o.n_hosts == 0; q++) /* (a rank of another host is not in this /proc) */
            if (L->ranks[q].claimed && launch_proc_state(L->ranks[q].pid) == 'T') culprit = q;
        rank_state *cs = &L->ranks[culprit];
        char st = cs->claimed && L->o.n_hosts == 0 ? launch_proc_state(cs->pid) : '?';
        launch_event(L, "hang", "\"rank\": %d, \"pid\": %d, \"node\": %d, \"state\": \"%c\", \"step\": %lld, "
                     "\"silent_s\": %.3f, \"timeout_s\": %.3f", culprit, (int)cs->pid, launch_node_of(L, culprit), st,
                     (long long)cs->step, silent, allow);
        decide(L, OUT_HANG, culprit, cs->step, "no heartbeat from rank %d for %.1f s (timeout %.1f s); rank %d (pid %d) "
               "is in state %c at step %lld", r, silent, allow, culprit, (int)cs->pid, st, (long long)cs->step);
        return;
    }
}

/* Over machines: a host none of whose ranks' watchdogs has answered
 * TSR_HB_CMD_ALIVE for host_timeout seconds, and which does not answer on the
 * network either (launch_host_reach), is gone or cut off from this machine:
 * lost (OUT_HOST). A host that answers is up and its ranks stalled (a busy
 * machine can stall a process for seconds; a rank stopped): logged, and left
 * to the hang timeout (check_hang), as is a rank silent alone. (A rank that
 * waits in a collective for others still answers.) */
static void check_lost(launch *L) {
    double now = tsr_now(), half = L->o.host_timeout / 2;
    for (int r = 0; r < L->np; r++) {
        rank_state *s = &L->ranks[r];
        if (!s->claimed || s->done) continue;
        int node = launch_node_of(L, r);
        double newest = 0; /* the newest answer from its host */
        for (int q = 0; q < L->np; q++)
            if (launch_node_of(L, q) == node && L->ranks[q].claimed && L->ranks[q].alive > newest) newest = L->ranks[q].alive;
        if (now - newest <= half) continue;
        int reach = launch_host_reach(L, node, &s->addr, s->addr_len, newest);
        if (now - newest <= L->o.host_timeout || reach < 0) continue;
        char nn[LAUNCH_HOST_NAME + 8];
        launch_node_name(L, node, nn, sizeof nn);
        host_probe *p = &L->probes[node];
        if (reach == 1) { /* up: said once a silence */
            if (p->said != newest) {
                p->said = newest;
                launch_event(L, "host_stalled", "\"node\": %d, \"host\": \"%s\", \"step\": %lld, \"silent_s\": %.3f, "
                             "\"timeout_s\": %.3f", node, nn + 5, (long long)s->step, now - newest, L->o.host_timeout);
                launch_say("%s: none of its ranks answered for %.1f s, but the host answers on the network: stalled, "
                           "not lost", nn, now - newest);
            }
            continue;
        }
        launch_event(L, "host_lost", "\"rank\": %d, \"pid\": %d, \"node\": %d, \"host\": \"%s\", \"step\": %lld, "
                     "\"silent_s\": %.3f, \"timeout_s\": %.3f", r, (int)s->pid, node, nn + 5, (long long)s->step,
                     now - newest, L->o.host_timeout);
        decide(L, OUT_HOST, r, s->step, "%s lost: none of its ranks answered for %.1f s (--host-timeout %g), nor the "
               "host itself", nn, now - newest, L->o.host_timeout);
        return;
    }
}

/* mpirun is gone: the records still buffered first, then its status. */
static void on_job_exit(launch *L) {
    for (int i = L->n_conns - 1; i >= 0; i--) read_conn(L, i, 0);
    for (int i = L->n_conns - 1; i >= 0; i--) read_conn(L, i, 1);
    if ((int)L->out >= 0) return;
    int st = L->mpirun_status;
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (L->preempting) {
        L->preempt_end = tsr_now();
        decide(L, OUT_PREEMPTED, -1, L->last_step, "the job stopped (mpirun exited with status %d)", code);
    }
    if (code == 0) decide(L, OUT_FINISHED, -1, L->last_step, "mpirun exited 0");
    else if (code == 2) decide(L, OUT_USAGE, -1, L->last_step, "mpirun exited 2: the train command is wrong");
    else decide(L, OUT_JOB_EXIT, -1, L->last_step, "mpirun exited with status %d", code);
}

/* After a failed replica check, the other ranks' records (which name the
 * copies that differ) are still read until every rank has left, for at most
 * LAUNCH_SDC_DRAIN_S seconds. */
static int sdc_draining(const launch *L) {
    if (L->out != OUT_SDC || tsr_now() > L->sdc_until) return 0;
    for (int i = 0; i < L->n_conns; i++)
        if (L->conns[i].rank >= 0) return 1;
    return 0;
}

void launch_watch(launch *L, volatile int *stop, const volatile sig_atomic_t *sig) {
    L->out = (launch_outcome)-1;
    double turn = tsr_now(); /* the last turn's start: a supervisor held off the cores says so */
    for (;;) {
        struct pollfd p[2 + 512];
        int np = 2, nc = L->n_conns < 512 ? L->n_conns : 512;
        p[0] = (struct pollfd){L->listen_fd, POLLIN, 0};
        p[1] = (struct pollfd){L->wake_fd, POLLIN, 0};
        for (int i = 0; i < nc; i++) p[np++] = (struct pollfd){L->conns[i].fd, POLLIN, 0};
        poll(p, (nfds_t)np, 100);
        if (tsr_now() - turn > LAUNCH_STALL_S) /* (said before this turn can end the watch) */
            launch_event(L, "supervisor_stalled", "\"seconds\": %.3f", tsr_now() - turn);
        turn = tsr_now();
        if (*stop && L->o.preempt_grace > 0 && !L->preempting && (*sig == SIGTERM || *sig == SIGUSR1)) {
            *stop = 0;
            launch_preempt_begin(L, *sig);
        }
        if (*stop) {
            decide(L, OUT_SIGNAL, -1, L->last_step, "the supervisor was asked to stop");
            return;
        }
        if (p[0].revents) accept_all(L);
        if (tsr_now() - L->alive_sent >= LAUNCH_ALIVE_EVERY) { /* the ranks' proof that this supervisor is there */
            L->alive_sent = tsr_now();
            launch_tell(L, -1, TSR_HB_CMD_ALIVE, ++L->alive_n, NULL);
        }
        for (int pass = 0; pass < 2; pass++) /* records, then ends of streams */
            for (int i = nc - 1; i >= 0; i--) /* from the end: closing moves the last one into i */
                if (p[2 + i].revents && i < L->n_conns) read_conn(L, i, pass);
        for (int i = L->n_conns - 1; i >= 0; i--)
            if (L->conns[i].rank < 0 && tsr_now() - L->conns[i].opened > UNCLAIMED_S) refuse(L, i, "no record in 10 s");
        if ((int)L->out >= 0 && !sdc_draining(L)) return;
        launch_reap(L);
        if (L->mpirun_exited) {
            on_job_exit(L);
            return;
        }
        if ((int)L->out >= 0) continue; /* reading the other ranks' TSR_HB_SDC records */
        if (L->preempting) { /* the grace is the only limit now */
            launch_preempt_tick(L);
            if ((int)L->out >= 0) return;
            continue;
        }
        if (L->o.n_hosts > 0) check_lost(L);
        if ((int)L->out < 0) check_hang(L);
        if ((int)L->out >= 0) return;
        launch_chaos_tick(L);
    }
}
