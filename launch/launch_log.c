/* launch_log.c: tessera launch's event log (JSON lines) and messages: to the
 * operator (launch_say) and to the ranks (launch_tell: their commands). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "launch.h"

void launch_say(const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "tessera launch: %s\n", msg);
    fflush(stderr);
}

const char *launch_json(const char *s, char *buf, size_t len) {
    size_t o = 0;
    if (len < 3) return "\"\"";
    buf[o++] = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p && o + 8 < len; p++) {
        if (*p == '"' || *p == '\\') o += (size_t)snprintf(buf + o, len - o, "\\%c", *p);
        else if (*p < 0x20 || *p == 0x7F) o += (size_t)snprintf(buf + o, len - o, "\\u%04x", *p);
        else buf[o++] = (char)*p;
    }
    buf[o++] = '"';
    buf[o] = 0;
    return buf;
}

void launch_event(launch *L, const char *name, const char *fields, ...) {
    if (!L->events) return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    char rest[2048] = "";
    va_list ap;
    va_start(ap, fields);
    vsnprintf(rest, sizeof rest, fields, ap);
    va_end(ap);
    fprintf(L->events, "{\"time\": %.6f, \"event\": \"%s\", \"launch\": %d%s%s}\n",
            (double)ts.tv_sec + ts.tv_nsec * 1e-9, name, L->attempt, rest[0] ? ", " : "", rest);
    fflush(L->events);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double launch_median(const launch *L) {
    int n = L->n_hist < LAUNCH_HISTORY ? L->n_hist : LAUNCH_HISTORY;
    if (n < 3) return 0;
    double v[LAUNCH_HISTORY];
    memcpy(v, L->hist, (size_t)n * sizeof *v);
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Sends what the socket takes of b (n bytes) to c without blocking; the rest
 * goes first the next time. @return 1 if the whole of b went (or waits in
 * c->out), 0 if none of it could. */
static int send_sealed(conn *c, const uint8_t *b, size_t n) {
    if (c->n_out) { /* a command the socket took in part: its rest first (a stream) */
        ssize_t k = send(c->fd, c->out, c->n_out, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (k > 0) memmove(c->out, c->out + k, c->n_out -= (size_t)k);
        if (c->n_out) return 0;
    }
    ssize_t k = send(c->fd, b, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (k <= 0) return 0;
    if ((size_t)k < n) memcpy(c->out, b + k, c->n_out = n - (size_t)k);
    return 1;
}

void launch_tell(launch *L, int rank, uint32_t kind, uint64_t arg, const char *what) {
    int sent = 0;
    for (int i = 0; i < L->n_conns; i++) {
        conn *c = &L->conns[i];
        if (c->rank < 0 || (rank >= 0 && c->rank != rank)) continue;
        uint8_t b[TSR_HB_COMMAND];
        tsr_hb_command(kind, arg, c->seq_out + 1, b);
        tsr_hb_seal(L->key, c->nonce, b, TSR_HB_CMD_BODY);
        if (send_sealed(c, b, sizeof b)) sent = 1, c->seq_out++;
        else if (rank < 0 && what) launch_say("%s: the command did not reach rank %d", what, c->rank);
    }
    if (rank >= 0 && !sent && what) launch_say("%s: the command did not reach rank %d", what, rank);
}
