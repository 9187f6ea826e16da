/* store_fault.c: the fault-injecting store (store.h): it wraps another store,
 * fails or delays the calls a fault spec names (tsr_fault_set, or per location
 * tsr_fault_set_at), and hands every other call to the store it wraps. Read
 * files are those of the wrapped store: reads have no faults. It also keeps
 * the outages (tsr_fault_outage) that the S3 client asks about. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "store.h"

enum { F_WRITE, F_FSYNC, F_RENAME, F_DATASYNC, N_OPS };
static const char *const op_names[N_OPS] = {"write", "fsync", "rename", "datasync"};
enum { K_ENOSPC, K_EIO, K_SHORT, K_KILL, K_KILLAFTER, N_KINDS, K_DELAY = N_KINDS, K_RATE };
static const char *const kind_names[N_KINDS] = {"ENOSPC", "EIO", "short", "kill", "killafter"};

/* A parsed spec and its count of the calls it names; shared by the stores that
 * inject it, freed with the last. */
typedef struct fault_plan {
    atomic_int refs;
    atomic_long calls;
    int op, kind;
    long n;               /* the call that fails, counted from 1; the delay in microseconds; or the
                             rate in MB/s (each write sleeps its bytes at that rate: a slow disk) */
    char text[PATH_MAX];  /* only calls on paths that contain it count ("": all) */
} fault_plan;

typedef struct fault_store {
    tsr_store base;
    tsr_store *inner;
    fault_plan *plan;
} fault_store;

enum { RATE_PENDING = 64 };

typedef struct fault_wfile {
    tsr_wfile base;
    tsr_wfile *inner;
    fault_plan *plan;
    /* a rate fault: a device that takes one write after another at the rate,
     * while the caller goes on (a queued write is done when the device is) */
    double busy_until;
    struct {
        const void *buf;
        double done;
    } pend[RATE_PENDING];
    int failed;     /* an injected failure: its status, reported by every later call */
    tsr_error ferr; /* and its message */
    char path[PATH_MAX + 64];
} fault_wfile;

static const tsr_store_ops fault_ops;

/* ----------------------------------------------------------------- specs */

static int plan_parse(const char *spec, fault_plan **out, tsr_error *err) {
    char a[16], b[16];
    long n;
    int end = 0;
    if (sscanf(spec, "%15[a-z]:%ld:%15[A-Za-z]%n", a, &n, b, &end) != 3 || !end || (spec[end] && spec[end] != ':') ||
        n < 1)
        return tsr_err(err, TSR_EINVAL,
                       "fault spec \"%s\": expected OP:N:KIND[:TEXT], delay:USEC:OP[:TEXT] or rate:MBPS:write[:TEXT]",
                       spec);
    int delay = strcmp(a, "delay") == 0 || strcmp(a, "rate") == 0, op = -1;
    int kind = !delay ? -1 : a[0] == 'd' ? K_DELAY : K_RATE;
    const char *opname = delay ? b : a;
    for (int i = 0; i < N_OPS; i++)
        if (!strcmp(opname, op_names[i])) op = i;
    for (int i = 0; i < N_KINDS && !delay; i++)
        if (!strcmp(b, kind_names[i])) kind = i;
    if (op < 0)
        return tsr_err(err, TSR_EINVAL, "fault spec \"%s\": unknown operation %s (write, fsync, rename or datasync)",
                       spec, opname);
    if (kind < 0)
        return tsr_err(err, TSR_EINVAL, "fault spec \"%s\": unknown kind %s (ENOSPC, EIO, short, kill or killafter)",
                       spec, b);
    if (kind == K_RATE && op != F_WRITE)
        return tsr_err(err, TSR_EINVAL, "fault spec \"%s\": a rate limits writes only (rate:MBPS:write)", spec);
    const char *text = spec[end] == ':' ? spec + end + 1 : "";
    if (strlen(text) >= PATH_MAX) return tsr_err(err, TSR_EINVAL, "fault spec: path text too long");
    fault_plan *p = calloc(1, sizeof *p);
    if (!p) return tsr_err(err, TSR_ENOMEM, "out of memory");
    atomic_init(&p->refs, 1);
    atomic_init(&p->calls, 0);
    p->op = op, p->kind = kind, p->n = n;
    snprintf(p->text, sizeof p->text, "%s", text);
    *out = p;
    return 0;
}

static void plan_unref(fault_plan *p) {
    if (p && atomic_fetch_sub(&p->refs, 1) == 1) free(p);
}

/* The plans by location (tsr_fault_set_at; tsr_fault_set's is location ""),
 * which tsr_store_open wraps stores with, and the outages (tsr_fault_outage). */
#define MAX_RULES 16
typedef struct fault_rule {
    char location[PATH_MAX]; /* "": every store */
    fault_plan *plan;        /* NULL: the slot is free */
    double outage_until;     /* tsr_now() at which an outage there ends (0: none) */
} fault_rule;
static pthread_mutex_t rules_mu = PTHREAD_MUTEX_INITIALIZER;
static fault_rule rules[MAX_RULES];

/* Whether path is location or below it ("" is above everything). */
static int under(const char *path, const char *location) {
    size_t n = strlen(location);
    while (n > 0 && location[n - 1] == '/') n--;
    return n == 0 || (strncmp(path, location, n) == 0 && (path[n] == 0 || path[n] == '/'));
}

/* The rule of exactly `location`: made in a free slot when missing and `make`;
 * NULL when missing (or no slot is free). Under rules_mu. */
static fault_rule *rule_at(const char *location, int make) {
    fault_rule *free_slot = NULL;
    for (int i = 0; i < MAX_RULES; i++) {
        fault_rule *r = &rules[i];
        if ((r->plan || r->outage_until > 0) && !strcmp(r->location, location)) return r;
        if (!r->plan && r->outage_until <= 0 && !free_slot) free_slot = r;
    }
    if (!make || !free_slot) return NULL;
    snprintf(free_slot->location, sizeof free_slot->location, "%s", location);
    return free_slot;
}

int tsr_fault_set_at(const char *location, const char *spec, tsr_error *err) {
    location = location ? location : "";
    if (strlen(location) >= PATH_MAX) return tsr_err(err, TSR_EINVAL, "fault location too long");
    fault_plan *p = NULL;
    if (spec && *spec) {
        int rc = plan_parse(spec, &p, err);
        if (rc) return rc;
    }
    pthread_mutex_lock(&rules_mu);
    fault_rule *r = rule_at(location, p != NULL);
    fault_plan *old = r ? r->plan : NULL;
    if (r) r->plan = p;
    pthread_mutex_unlock(&rules_mu);
    plan_unref(old);
    if (p && !r) {
        plan_unref(p);
        return tsr_err(err, TSR_EINVAL, "%s: no room for another fault location (%d at most)", location, MAX_RULES);
    }
    return 0;
}

int tsr_fault_set(const char *spec, tsr_error *err) { return tsr_fault_set_at("", spec, err); }

/* The plan for a store at `location` (a reference the caller drops): that of
 * the closest location above it that has one. */
static fault_plan *plan_for(const char *location) {
    fault_plan *p = NULL;
    size_t best = 0;
    pthread_mutex_lock(&rules_mu);
    for (int i = 0; i < MAX_RULES; i++) {
        fault_rule *r = &rules[i];
        size_t n = strlen(r->location);
        if (r->plan && under(location, r->location) && (!p || n > best)) p = r->plan, best = n;
    }
    if (p) atomic_fetch_add(&p->refs, 1);
    pthread_mutex_unlock(&rules_mu);
    return p;
}

void tsr_fault_outage(const char *location, double seconds) {
    location = location ? location : "";
    pthread_mutex_lock(&rules_mu);
    fault_rule *r = rule_at(location, seconds > 0);
    if (r) r->outage_until = seconds > 0 ? tsr_now() + seconds : 0;
    pthread_mutex_unlock(&rules_mu);
}

int tsr_fault_in_outage(const char *path) {
    int yes = 0;
    pthread_mutex_lock(&rules_mu);
    double now = tsr_now();
    for (int i = 0; i < MAX_RULES && !yes; i++)
        yes = rules[i].outage_until > now && under(path, rules[i].location);
    pthread_mutex_unlock(&rules_mu);
    return yes;
}

/* ------------------------------------------------------------- injecting */

/* set by a "killafter" fault: fault_done() kills the process once the call is done */
static _Thread_local int kill_after;

/* @return 0 (no fault), ENOSPC, EIO, or -1 (short write) for this call of op on
 * `path`; a delay sleeps here, and a "kill" fault ends the process here, before
 * the call. */
static int fault_check(fault_plan *p, int op, const char *path) {
    if (p->op != op || (p->text[0] && !strstr(path, p->text))) return 0;
    if (p->kind == K_RATE) return 0; /* rate_write() */
    if (p->kind == K_DELAY) {
        struct timespec ts = {(time_t)(p->n / 1000000), (long)(p->n % 1000000) * 1000};
        nanosleep(&ts, NULL);
        return 0;
    }
    if (atomic_fetch_add(&p->calls, 1) + 1 != p->n) return 0;
    switch (p->kind) {
    case K_ENOSPC: return ENOSPC;
    case K_EIO: return EIO;
    case K_SHORT: return -1;
    case K_KILL: kill(getpid(), SIGKILL); return 0; /* a crash: nothing after this runs */
    default: kill_after = 1; return 0;
    }
}

static void sleep_until(double t) {
    double d = t - tsr_now();
    if (d <= 0) return;
    struct timespec ts = {(time_t)d, (long)(fmod(d, 1.0) * 1e9)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

/* A rate fault on a write of len bytes from buf: the emulated device takes it
 * after what it was given before. A plain write returns when the device is done
 * with it; a submitted one at once, and tsr_wfile_release/complete wait. */
static void rate_write(fault_wfile *f, const void *buf, size_t len, int submit) {
    fault_plan *p = f->plan;
    if (p->kind != K_RATE || (p->text[0] && !strstr(f->path, p->text))) return;
    double now = tsr_now(), t = (f->busy_until > now ? f->busy_until : now) + (double)len / ((double)p->n * 1e6);
    f->busy_until = t;
    int k = -1;
    for (int i = 0; submit && i < RATE_PENDING && k < 0; i++)
        if (!f->pend[i].buf || f->pend[i].buf == buf) k = i;
    if (k < 0) { /* a plain write, or no room to track it */
        sleep_until(t);
        return;
    }
    f->pend[k].buf = buf;
    f->pend[k].done = t;
}

/* The emulated device done with the writes from buf (NULL: with every write). */
static void rate_wait(fault_wfile *f, const void *buf) {
    if (f->plan->kind != K_RATE) return;
    if (!buf) sleep_until(f->busy_until);
    for (int i = 0; i < RATE_PENDING; i++) {
        if (!f->pend[i].buf || (buf && f->pend[i].buf != buf)) continue;
        sleep_until(f->pend[i].done);
        f->pend[i].buf = NULL;
    }
}

/* After a call that fault_check let through: a crash right after it. */
static void fault_done(void) {
    if (kill_after) kill(getpid(), SIGKILL);
}

static int errno_status(int e) { return e == ENOSPC ? TSR_ENOSPC : TSR_EIO; }

/* ---------------------------------------------------------------- store */

tsr_store *tsr_store_fault_wrap(tsr_store *inner, const char *spec, tsr_error *err) {
    fault_plan *p = NULL;
    if (spec && plan_parse(spec, &p, err)) {
        inner->ops->close(inner);
        return NULL;
    }
    if (!spec && !(p = plan_for(inner->location))) return inner;
    fault_store *s = calloc(1, sizeof *s);
    if (!s) {
        plan_unref(p);
        inner->ops->close(inner);
        tsr_err(err, TSR_ENOMEM, "out of memory");
        return NULL;
    }
    s->base.ops = &fault_ops;
    snprintf(s->base.location, sizeof s->base.location, "%s", inner->location);
    s->inner = inner;
    s->plan = p;
    return &s->base;
}

static tsr_store *inner_of(tsr_store *s) { return ((fault_store *)s)->inner; }

static void fault_close(tsr_store *st) {
    fault_store *s = (fault_store *)st;
    s->inner->ops->close(s->inner);
    plan_unref(s->plan);
    free(s);
}

static int fault_open_read(tsr_store *s, const char *name, tsr_rfile **out, uint64_t *size, tsr_error *err) {
    return inner_of(s)->ops->open_read(inner_of(s), name, out, size, err);
}

static int fault_get(tsr_store *s, const char *name, size_t max, uint8_t **out, size_t *len, tsr_error *err) {
    return inner_of(s)->ops->get(inner_of(s), name, max, out, len, err);
}

/* ------------------------------------------------------------- writing */

static int fault_create(tsr_store *st, const char *name, int flags, tsr_wfile **out, tsr_error *err) {
    fault_store *s = (fault_store *)st;
    fault_wfile *f = calloc(1, sizeof *f);
    if (!f) return tsr_err(err, TSR_ENOMEM, "out of memory");
    int rc = s->inner->ops->create(s->inner, name, flags, &f->inner, err);
    if (rc) {
        free(f);
        return rc;
    }
    f->base.ops = st->ops;
    f->plan = s->plan;
    tsr_store_join(st, name, f->path, sizeof f->path);
    *out = &f->base;
    return 0;
}

/* The file's injected failure, if any, into err. */
static int failed(fault_wfile *f, tsr_error *err) {
    if (f->failed && err) *err = f->ferr;
    return f->failed;
}

/* An injected write fault (fault_check's value): ENOSPC/EIO, or a short write
 * that stores half the bytes and reports no space. The file fails. */
static int injected_write(fault_wfile *f, int fault, const void *buf, size_t len, uint64_t off, tsr_error *err) {
    if (fault > 0) {
        f->failed = tsr_err(&f->ferr, errno_status(fault), "%s: write of %zu bytes at %llu: %s (injected)", f->path,
                            len, (unsigned long long)off, strerror(fault));
    } else {
        size_t half = len / 2 / TSR_ALIGN * TSR_ALIGN;
        if (half && f->inner->ops->write(f->inner, buf, half, off, NULL)) half = 0;
        f->failed = tsr_err(&f->ferr, TSR_ENOSPC, "%s: short write (%zu of %zu bytes) at %llu (injected)", f->path,
                            half, len, (unsigned long long)off);
    }
    return failed(f, err);
}

/* A write or a submit (`submit` set): the same faults. */
static int fault_write_or_submit(tsr_wfile *wf, const void *buf, size_t len, uint64_t off, int submit,
                                 tsr_error *err) {
    fault_wfile *f = (fault_wfile *)wf;
    if (f->failed) return failed(f, err);
    int fault = fault_check(f->plan, F_WRITE, f->path);
    if (fault) return injected_write(f, fault, buf, len, off, err);
    int rc = submit ? f->inner->ops->submit(f->inner, buf, len, off, err)
                    : f->inner->ops->write(f->inner, buf, len, off, err);
    if (!rc) rate_write(f, buf, len, submit);
    fault_done();
    return rc;
}

static int fault_write(tsr_wfile *f, const void *buf, size_t len, uint64_t off, tsr_error *err) {
    return fault_write_or_submit(f, buf, len, off, 0, err);
}

static int fault_submit(tsr_wfile *f, const void *buf, size_t len, uint64_t off, tsr_error *err) {
    return fault_write_or_submit(f, buf, len, off, 1, err);
}

static int fault_complete(tsr_wfile *wf, tsr_error *err) {
    fault_wfile *f = (fault_wfile *)wf;
    int rc = f->inner->ops->complete(f->inner, err);
    rate_wait(f, NULL);
    return f->failed ? failed(f, err) : rc;
}

static int fault_release(tsr_wfile *wf, const void *buf, tsr_error *err) {
    fault_wfile *f = (fault_wfile *)wf;
    int rc = f->inner->ops->release(f->inner, buf, err);
    rate_wait(f, buf);
    return f->failed ? failed(f, err) : rc;
}

static int fault_busy(tsr_wfile *wf, const void *buf) {
    fault_wfile *f = (fault_wfile *)wf;
    if (f->inner->ops->busy && f->inner->ops->busy(f->inner, buf)) return 1;
    if (f->plan->kind != K_RATE) return 0;
    double now = tsr_now();
    for (int i = 0; i < RATE_PENDING; i++)
        if (f->pend[i].buf == buf && f->pend[i].done > now) return 1;
    return 0;
}

static void fault_reserve(tsr_wfile *wf, uint64_t bytes) {
    fault_wfile *f = (fault_wfile *)wf;
    f->inner->ops->reserve(f->inner, bytes);
}

/* An injected failure stands for a queued fdatasync that failed: the next call
 * on the file reports it. Only stores that have a datasync see these. */
static int fault_datasync(tsr_wfile *wf) {
    fault_wfile *f = (fault_wfile *)wf;
    if (!f->inner->ops->datasync) return 0;
    int fault = fault_check(f->plan, F_DATASYNC, f->path);
    if (fault > 0) {
        if (!f->failed)
            f->failed =
                tsr_err(&f->ferr, errno_status(fault), "%s: fdatasync: %s (injected)", f->path, strerror(fault));
        return 1;
    }
    int started = f->inner->ops->datasync(f->inner);
    fault_done();
    return started;
}

static void fault_abort(tsr_wfile *wf) {
    fault_wfile *f = (fault_wfile *)wf;
    f->inner->ops->abort(f->inner);
    free(f);
}

/* The fsync: counted once the file's writes went well. */
static int fault_finish(tsr_wfile *wf, uint64_t size, tsr_error *err) {
    fault_wfile *f = (fault_wfile *)wf;
    int rc = f->inner->ops->complete(f->inner, err);
    rate_wait(f, NULL);
    if (f->failed) rc = failed(f, err);
    int fault = rc ? 0 : fault_check(f->plan, F_FSYNC, f->path);
    if (fault > 0) rc = tsr_err(err, errno_status(fault), "%s: fsync: %s (injected)", f->path, strerror(fault));
    if (rc) {
        fault_abort(wf);
        return rc;
    }
    rc = f->inner->ops->finish(f->inner, size, err);
    fault_done();
    free(f);
    return rc;
}

/* ---------------------------------------------------------- committing */

/* A store that puts by itself: its put is the commit, counted as a rename. A
 * store that stages its puts: the staging runs through this store, so that its
 * write, fsync, rename and sync meet the faults. */
static int fault_put(tsr_store *st, const char *name, const void *buf, size_t len, int flags, tsr_error *err) {
    fault_store *s = (fault_store *)st;
    if (!s->inner->ops->put) return tsr_store_put_staged(st, name, buf, len, flags, err);
    char path[PATH_MAX + 64];
    tsr_store_join(st, name, path, sizeof path);
    int fault = fault_check(s->plan, F_RENAME, path);
    if (fault > 0) return tsr_err(err, errno_status(fault), "%s: put: %s (injected)", path, strerror(fault));
    int rc = s->inner->ops->put(s->inner, name, buf, len, flags, err);
    fault_done();
    return rc;
}

static int fault_rename(tsr_store *st, const char *from, const char *to, int flags, tsr_error *err) {
    fault_store *s = (fault_store *)st;
    char path[PATH_MAX + 64];
    tsr_store_join(st, from, path, sizeof path);
    int fault = fault_check(s->plan, F_RENAME, path);
    if (fault > 0)
        return tsr_err(err, errno_status(fault), "%s: rename to %s: %s (injected)", path, to, strerror(fault));
    int rc = s->inner->ops->rename(s->inner, from, to, flags, err);
    fault_done();
    return rc;
}

/* The directory's fsync: its path is the location's. */
static int fault_sync(tsr_store *st, const char *name, tsr_error *err) {
    fault_store *s = (fault_store *)st;
    int fault = fault_check(s->plan, F_FSYNC, st->location);
    if (fault > 0)
        return tsr_err(err, errno_status(fault), "%s: fsync of the directory after renaming %s: %s (injected)",
                       st->location, name, strerror(fault));
    int rc = s->inner->ops->sync(s->inner, name, err);
    fault_done();
    return rc;
}

/* --------------------------------------------------------------- names */

static int fault_exists(tsr_store *s, const char *name, tsr_error *err) {
    return inner_of(s)->ops->exists(inner_of(s), name, err);
}

static int fault_remove(tsr_store *s, const char *name, tsr_error *err) {
    return inner_of(s)->ops->remove(inner_of(s), name, err);
}

static int fault_list(tsr_store *s, tsr_store_list_fn fn, void *user, tsr_error *err) {
    return inner_of(s)->ops->list(inner_of(s), fn, user, err);
}

static const tsr_store_ops fault_ops = {
    .close = fault_close,
    .open_read = fault_open_read,
    .read = NULL, /* the read files are the wrapped store's */
    .read_close = NULL,
    .get = fault_get,
    .create = fault_create,
    .write = fault_write,
    .submit = fault_submit,
    .complete = fault_complete,
    .release = fault_release,
    .busy = fault_busy,
    .reserve = fault_reserve,
    .datasync = fault_datasync,
    .finish = fault_finish,
    .abort = fault_abort,
    .put = fault_put,
    .rename = fault_rename,
    .sync = fault_sync,
    .exists = fault_exists,
    .remove = fault_remove,
    .list = fault_list,
};
