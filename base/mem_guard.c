/* mem_guard.c: the guard kind (TSR_MEM_GUARD), host memory that stands in for a
 * device's so that a machine without a GPU runs the trainer's device code path
 * and catches every stray host access in it.
 *
 * Each buffer is one memfd mapped twice: the address the caller gets (its
 * "device address") is mapped PROT_NONE, so host code that reads or writes
 * through it faults; a second mapping of the same pages, readable and
 * writable, is what the kernels of a context (kernels/kctx.c) and the copies
 * of mem.c reach it through, as a GPU's kernels and copy engines reach its
 * memory. No protection is changed while a program runs, so the engine's
 * staging copies on other threads and the step's kernels never race for it.
 *
 * A fault inside a guard buffer prints what was touched and the call stack
 * (the spot), then ends the process with SIGSEGV; any other fault goes to the
 * handler that was there before (Open MPI's, the sanitizers'). */
#include "mem.h"

#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common.h"

enum { MAX_GUARDS = 256 };

typedef struct guard {
    _Atomic(uintptr_t) view; /* the caller's address (0: a free slot) */
    uintptr_t alias;         /* the same pages, readable and writable */
    size_t len, size;        /* mapped (whole pages), asked for */
} guard;

static guard guards[MAX_GUARDS];
static pthread_mutex_t guards_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sigaction old_segv;
static int handler_set;

/* The slot whose view holds address a, or NULL. Reads the table without the
 * lock (the signal handler calls it): a slot's fields are set before its view
 * is published and its view cleared before they change. */
static guard *find(uintptr_t a) {
    for (int i = 0; i < MAX_GUARDS; i++) {
        uintptr_t v = atomic_load(&guards[i].view);
        if (v && a >= v && a < v + guards[i].len) return &guards[i];
    }
    return NULL;
}

/* Output from the signal handler: write(2) only, no stdio. */
static void put_str(const char *s) {
    ssize_t r = write(2, s, strlen(s));
    (void)r;
}

/* v in base 10 or 16 (with 0x). */
static void put_num(uintptr_t v, int hex) {
    char buf[24], *p = buf + sizeof buf;
    *--p = 0;
    do *--p = "0123456789abcdef"[v % (hex ? 16 : 10)];
    while ((v /= (hex ? 16 : 10)));
    if (hex) *--p = 'x', *--p = '0';
    put_str(p);
}

static void on_segv(int sig, siginfo_t *si, void *uc) {
    guard *g = find((uintptr_t)si->si_addr);
    if (!g) { /* not ours: the handler before us, or the default action */
        if (old_segv.sa_flags & SA_SIGINFO) {
            if (old_segv.sa_sigaction) {
                old_segv.sa_sigaction(sig, si, uc);
                return;
            }
        } else if (old_segv.sa_handler != SIG_DFL && old_segv.sa_handler != SIG_IGN) {
            old_segv.sa_handler(sig);
            return;
        }
        signal(SIGSEGV, SIG_DFL);
        return; /* the access faults again, now fatally */
    }
    uintptr_t a = (uintptr_t)si->si_addr, v = atomic_load(&g->view);
    put_str("tessera: host code touched device memory (the guard kind) at ");
    put_num(a, 1);
    put_str(": byte ");
    put_num(a - v, 0);
    put_str(" of a ");
    put_num(g->size, 0);
    put_str("-byte buffer at ");
    put_num(v, 1);
    put_str("; only the kernels and copies of a kernel context may. Where (addr2line -f -e BINARY OFFSET "
            "names each frame):\n");
    void *frames[48];
    int n = backtrace(frames, 48);
    backtrace_symbols_fd(frames, n, 2);
    signal(SIGSEGV, SIG_DFL); /* returning re-runs the access, which now ends the process */
}

void *tsr_guard_alloc(size_t n, tsr_error *err) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE), len = (n ? n + page - 1 : page) / page * page;
    int fd = memfd_create("tessera-guard", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)len)) {
        if (fd >= 0) close(fd);
        tsr_err(err, TSR_ENOMEM, "guard memory: no memfd of %zu bytes", len);
        return NULL;
    }
    void *view = mmap(NULL, len, PROT_NONE, MAP_SHARED, fd, 0);
    void *alias = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (view == MAP_FAILED || alias == MAP_FAILED) {
        if (view != MAP_FAILED) munmap(view, len);
        if (alias != MAP_FAILED) munmap(alias, len);
        tsr_err(err, TSR_ENOMEM, "guard memory: cannot map %zu bytes", len);
        return NULL;
    }
    pthread_mutex_lock(&guards_mu);
    guard *g = NULL;
    for (int i = 0; i < MAX_GUARDS && !g; i++)
        if (!atomic_load(&guards[i].view)) g = &guards[i];
    if (g) {
        g->alias = (uintptr_t)alias, g->len = len, g->size = n;
        atomic_store(&g->view, (uintptr_t)view);
        if (!handler_set) {
            struct sigaction sa;
            memset(&sa, 0, sizeof sa);
            sa.sa_sigaction = on_segv;
            sa.sa_flags = SA_SIGINFO | SA_NODEFER;
            sigemptyset(&sa.sa_mask);
            handler_set = sigaction(SIGSEGV, &sa, &old_segv) == 0;
            void *warm[1]; /* backtrace loads what it needs now, not in the handler */
            backtrace(warm, 1);
        }
    }
    pthread_mutex_unlock(&guards_mu);
    if (!g) {
        munmap(view, len), munmap(alias, len);
        tsr_err(err, TSR_ENOMEM, "guard memory: more than %d buffers", MAX_GUARDS);
        return NULL;
    }
    return view;
}

void tsr_guard_free(void *p) {
    if (!p) return;
    pthread_mutex_lock(&guards_mu);
    guard *g = find((uintptr_t)p);
    if (g && atomic_load(&g->view) == (uintptr_t)p) {
        atomic_store(&g->view, 0);
        munmap(p, g->len);
        munmap((void *)g->alias, g->len);
    }
    pthread_mutex_unlock(&guards_mu);
}

void *tsr_guard_view(const void *p) {
    guard *g = p ? find((uintptr_t)p) : NULL;
    return g ? (void *)(g->alias + ((uintptr_t)p - atomic_load(&g->view))) : NULL;
}
