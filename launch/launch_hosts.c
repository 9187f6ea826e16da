/* launch_hosts.c: the hosts of a job that spans machines (tessera launch
 * --hostfile FILE, or the host list of a Slurm allocation): read from Open
 * MPI's hostfile syntax or Slurm's compressed host list, and the address the
 * ranks reach the supervisor by; whether a silent host still answers. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "launch.h"

/* Appends host (len bytes) with its slots (0: not said). @return 0, or -1 with why. */
static int add_host(launch_opts *o, const char *host, size_t len, int slots, char *why, size_t wlen) {
    if (len == 0 || len >= LAUNCH_HOST_NAME) return snprintf(why, wlen, "host name '%.*s': empty or too long", (int)len, host), -1;
    for (int i = 0; i < o->n_hosts; i++)
        if (strlen(o->hosts[i]) == len && !memcmp(o->hosts[i], host, len))
            return snprintf(why, wlen, "host %.*s is listed twice", (int)len, host), -1;
    if (o->n_hosts == LAUNCH_MAX_HOSTS) return snprintf(why, wlen, "more than %d hosts", LAUNCH_MAX_HOSTS), -1;
    char(*h)[LAUNCH_HOST_NAME] = realloc(o->hosts, (size_t)(o->n_hosts + 1) * sizeof *h);
    int *s = h ? realloc(o->slots, (size_t)(o->n_hosts + 1) * sizeof *s) : NULL;
    if (h) o->hosts = h;
    if (s) o->slots = s;
    if (!h || !s) return snprintf(why, wlen, "out of memory"), -1;
    memcpy(o->hosts[o->n_hosts], host, len);
    o->hosts[o->n_hosts][len] = 0;
    o->slots[o->n_hosts++] = slots;
    return 0;
}

/* A count after "slots=" and the like. @return it, or -1. */
static int count_of(const char *v) {
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    return *v && !*end && !errno && n >= 1 && n <= 1 << 20 ? (int)n : -1;
}

int launch_hosts_file(const char *path, launch_opts *o, char *why, size_t len) {
    FILE *f = fopen(path, "r");
    if (!f) return snprintf(why, len, "%s: cannot open: %s", path, strerror(errno)), -1;
    char line[1024];
    int lineno = 0, rc = 0;
    while (!rc && fgets(line, sizeof line, f)) {
        lineno++;
        if (!strchr(line, '\n') && !feof(f)) {
            rc = (snprintf(why, len, "%s:%d: line too long", path, lineno), -1);
            break;
        }
        char *hash = strchr(line, '#'), *save = NULL, *tok;
        if (hash) *hash = 0;
        const char *host = NULL;
        int slots = 0;
        for (tok = strtok_r(line, " \t\r\n", &save); tok && !rc; tok = strtok_r(NULL, " \t\r\n", &save)) {
            const char *eq = strchr(tok, '=');
            if (!host && !eq) host = tok;
            else if (host && eq && (!strncmp(tok, "slots=", 6) || !strncmp(tok, "max_slots=", 10) ||
                                    !strncmp(tok, "max-slots=", 10))) {
                int n = count_of(eq + 1);
                if (n < 0) rc = (snprintf(why, len, "%s:%d: '%s': not a count of slots", path, lineno, tok), -1);
                else if (tok[0] == 's') slots = n;
            } else
                rc = (snprintf(why, len, "%s:%d: '%s': not a host or slots=N (Open MPI's hostfile syntax)", path,
                              lineno, tok), -1);
        }
        if (!rc && host && add_host(o, host, strlen(host), slots, why, len)) {
            char w[200];
            snprintf(w, sizeof w, "%s", why);
            rc = (snprintf(why, len, "%s:%d: %s", path, lineno, w), -1);
        }
    }
    fclose(f);
    if (!rc && o->n_hosts == 0) rc = (snprintf(why, len, "%s: no host in it", path), -1);
    return rc;
}

/* One item of a Slurm host list: PREFIX[RANGES]SUFFIX or a plain name; a
 * range keeps its zero padding ("n[08-10]": n08 n09 n10). */
static int slurm_item(launch_opts *o, const char *s, size_t n, char *why, size_t len) {
    const char *lb = memchr(s, '[', n), *rb = lb ? memchr(lb, ']', n - (size_t)(lb - s)) : NULL;
    if (!lb) return add_host(o, s, n, 0, why, len);
    if (!rb || memchr(rb + 1, '[', n - (size_t)(rb + 1 - s)))
        return snprintf(why, len, "'%.*s': one [ranges] group a name, closed", (int)n, s), -1;
    const char *p = lb + 1;
    while (p < rb) {
        const char *q = p;
        while (q < rb && *q != ',') q++;
        char a[24] = "", b[24] = "";
        const char *dash = memchr(p, '-', (size_t)(q - p));
        size_t la = (size_t)((dash ? dash : q) - p), lb2 = dash ? (size_t)(q - dash - 1) : 0;
        if (la == 0 || la >= sizeof a || (dash && (lb2 == 0 || lb2 >= sizeof b)))
            return snprintf(why, len, "'%.*s': a range is N or N-M", (int)n, s), -1;
        memcpy(a, p, la);
        if (dash) memcpy(b, dash + 1, lb2);
        else memcpy(b, a, la + 1);
        for (const char *c = a; *c; c++)
            if (!isdigit((unsigned char)*c)) return snprintf(why, len, "'%.*s': '%s' is not a number", (int)n, s, a), -1;
        for (const char *c = b; *c; c++)
            if (!isdigit((unsigned char)*c)) return snprintf(why, len, "'%.*s': '%s' is not a number", (int)n, s, b), -1;
        long lo = strtol(a, NULL, 10), hi = strtol(b, NULL, 10);
        if (hi < lo || hi - lo >= LAUNCH_MAX_HOSTS) return snprintf(why, len, "'%.*s': range %s-%s", (int)n, s, a, b), -1;
        for (long k = lo; k <= hi; k++) {
            char name[LAUNCH_HOST_NAME];
            int w = snprintf(name, sizeof name, "%.*s%0*ld%.*s", (int)(lb - s), s, (int)la, k,
                             (int)(n - (size_t)(rb + 1 - s)), rb + 1);
            if (w < 0 || w >= (int)sizeof name) return snprintf(why, len, "'%.*s': a name too long", (int)n, s), -1;
            if (add_host(o, name, (size_t)w, 0, why, len)) return -1;
        }
        p = q < rb ? q + 1 : q;
    }
    return 0;
}

int launch_hosts_slurm(const char *list, launch_opts *o, char *why, size_t len) {
    const char *s = list;
    while (*s) {
        const char *e = s;
        int depth = 0;
        while (*e && (depth || *e != ',')) depth += *e == '[' ? 1 : *e == ']' ? -1 : 0, e++;
        if (e > s && slurm_item(o, s, (size_t)(e - s), why, len)) return -1;
        s = *e ? e + 1 : e;
    }
    if (o->n_hosts == 0) return snprintf(why, len, "an empty host list"), -1;
    return 0;
}

int launch_local_addr(const char *host, char *out, size_t len, char *why, size_t wlen) {
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_DGRAM}, *res = NULL;
    int g = getaddrinfo(host, "9", &hints, &res);
    if (g) return snprintf(why, wlen, "host %s: cannot resolve: %s", host, gai_strerror(g)), -1;
    /* a datagram socket "connected" to it sends nothing: the kernel only picks
     * the route, and with it the address this machine uses towards the host */
    int fd = socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0), rc = -1;
    struct sockaddr_storage a;
    socklen_t al = sizeof a;
    if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 && getsockname(fd, (struct sockaddr *)&a, &al) == 0)
        rc = getnameinfo((struct sockaddr *)&a, al, out, (socklen_t)len, NULL, 0, NI_NUMERICHOST) == 0 ? 0 : -1;
    if (rc) snprintf(why, wlen, "host %s: no route to it from this machine: %s", host, strerror(errno));
    if (fd >= 0) close(fd);
    freeaddrinfo(res);
    return rc;
}

#define PROBE_S 15.0 /* seconds a host may take to run a probe */

void launch_probe_hosts(launch *L, const int *nodes, int n, int *ok) {
    pid_t *pids = calloc((size_t)n, sizeof *pids);
    if (!pids) {
        for (int i = 0; i < n; i++) ok[i] = 1; /* no probe: nothing is judged */
        return;
    }
    for (int i = 0; i < n; i++) { /* one mpirun a host, each running `true` there, all at once */
        char host[LAUNCH_HOST_NAME + 4];
        snprintf(host, sizeof host, "%s:1", L->o.hosts[nodes[i]]);
        fflush(NULL);
        char *argv[] = {"mpirun", "--host", host, "-np", "1", "true", NULL, NULL};
        if (geteuid() == 0) memmove(argv + 2, argv + 1, 6 * sizeof *argv), argv[1] = "--allow-run-as-root";
        pids[i] = fork();
        if (pids[i] == 0) launch_exec(argv, 1);
        if (pids[i] > 0) setpgid(pids[i], pids[i]);
    }
    double t0 = tsr_now();
    int left = n;
    while (left > 0) {
        left = 0;
        for (int i = 0; i < n; i++) {
            int st = -1;
            if (pids[i] < 0) ok[i] = 0, pids[i] = 0;
            if (pids[i] == 0) continue;
            pid_t w = waitpid(pids[i], &st, WNOHANG);
            if (w == 0 && tsr_now() - t0 < PROBE_S) {
                left++;
                continue;
            }
            if (w == 0) kill(-pids[i], SIGKILL), waitpid(pids[i], &st, 0), st = -1;
            ok[i] = st == 0;
            launch_event(L, "probe", "\"host\": \"%s\", \"ok\": %s, \"seconds\": %.3f", L->o.hosts[nodes[i]],
                         ok[i] ? "true" : "false", tsr_now() - t0);
            pids[i] = 0;
        }
        if (left) usleep(20000);
    }
    free(pids);
}

/* The attempt in flight: its end, if it has one (or has run out of time). */
static void probe_end(host_probe *p, double every) {
    struct pollfd q = {p->fd, POLLOUT, 0};
    double now = tsr_now();
    int e = 0;
    socklen_t el = sizeof e;
    if (poll(&q, 1, 0) > 0) {
        if (getsockopt(p->fd, SOL_SOCKET, SO_ERROR, &e, &el) != 0) e = errno;
    } else if (now - p->started <= every) {
        return;
    } else {
        e = ETIMEDOUT;
    }
    /* accepted or refused, the host's kernel answered: it runs, and is reached */
    if (e == 0 || e == ECONNREFUSED) p->answered = now;
    else p->failed = now;
    close(p->fd);
    p->fd = -1;
}

int launch_host_reach(launch *L, int node, const struct sockaddr_storage *addr, socklen_t len, double since) {
    if (!L->probes || node < 0 || node >= L->o.nodes) return -1;
    if (len == 0) return 0; /* no address to ask: silence alone decides */
    host_probe *p = &L->probes[node];
    double every = L->o.host_timeout / 2, now = tsr_now();
    if (p->fd >= 0) probe_end(p, every);
    if (p->fd < 0 && now - p->started >= every) {
        p->started = now;
        /* to the port the rank connects from: no one listens there, so a
         * host that is up refuses at once */
        p->fd = socket(addr->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (p->fd < 0) p->failed = now;
        else if (connect(p->fd, (const struct sockaddr *)addr, len) == 0 || errno == ECONNREFUSED) {
            p->answered = now;
            close(p->fd);
            p->fd = -1;
        } else if (errno != EINPROGRESS) {
            p->failed = now;
            close(p->fd);
            p->fd = -1;
        }
    }
    if (p->answered > since && p->answered >= p->failed) return 1;
    if (p->failed > since && p->failed > p->answered) return 0;
    return -1;
}

void launch_host_probes_reset(launch *L) {
    for (int i = 0; L->probes && i < L->o.nodes; i++) {
        if (L->probes[i].fd >= 0) close(L->probes[i].fd);
        L->probes[i] = (host_probe){.fd = -1};
    }
}
