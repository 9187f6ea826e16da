/* pool.c: the thread pool behind frame encoding and decoding. */
#include "pool.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

/* A loop of items: claimed in index order under the pool's lock, run outside it. */
typedef struct loop {
    void (*fn)(void *, size_t, int);
    void *ctx;
    size_t total, next, finished;
    int live;
} loop;

enum { LOOP_BG, LOOP_FG }; /* tsr_pool_start's loop, whose items go first; tsr_pool_for's */

struct tsr_pool {
    int n;              /* threads in all, the caller included */
    pthread_t *threads; /* n - 1 workers */
    pthread_mutex_t mu;
    pthread_cond_t start, done;
    int stopping;
    loop loops[2];
};

typedef struct worker_arg {
    tsr_pool *p;
    int id;
} worker_arg;

/* Under p->mu: the next unclaimed item of loop `which`, or -1 for any loop (the
 * background's first). @return the loop, or NULL when none has one left. */
static loop *claim(tsr_pool *p, int which, size_t *i) {
    for (int k = which < 0 ? 0 : which; k < 2 && (which < 0 || k == which); k++) {
        loop *l = &p->loops[k];
        if (l->live && l->next < l->total) {
            *i = l->next++;
            return l;
        }
    }
    return NULL;
}

/* Under p->mu: runs item i of l unlocked, then counts it. */
static void run_one(tsr_pool *p, loop *l, size_t i, int id) {
    void (*fn)(void *, size_t, int) = l->fn;
    void *ctx = l->ctx;
    pthread_mutex_unlock(&p->mu);
    fn(ctx, i, id);
    pthread_mutex_lock(&p->mu);
    if (++l->finished == l->total) pthread_cond_broadcast(&p->done);
}

static void *worker_main(void *argp) {
    worker_arg *a = argp;
    tsr_pool *p = a->p;
    int id = a->id;
    free(a);
    pthread_mutex_lock(&p->mu);
    for (;;) {
        size_t i;
        loop *l = claim(p, -1, &i);
        if (l) run_one(p, l, i, id);
        else if (p->stopping) break;
        else pthread_cond_wait(&p->start, &p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

tsr_pool *tsr_pool_new(int threads) {
    if (threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        threads = c > 0 ? (int)c : 1;
    }
    tsr_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->start, NULL);
    pthread_cond_init(&p->done, NULL);
    p->threads = calloc((size_t)threads, sizeof *p->threads);
    if (!p->threads) {
        free(p);
        return NULL;
    }
    for (int i = 1; i < threads; i++) {
        worker_arg *a = malloc(sizeof *a);
        if (!a || pthread_create(&p->threads[i - 1], NULL, worker_main, (*a = (worker_arg){p, i}, a))) {
            free(a);
            p->n = i;
            tsr_pool_free(p);
            return NULL;
        }
    }
    return p;
}

int tsr_pool_size(const tsr_pool *p) { return p->n; }

/* Under p->mu: loop `which` set to run fn over n items. */
static void begin(tsr_pool *p, int which, size_t n, void (*fn)(void *, size_t, int), void *ctx) {
    p->loops[which] = (loop){fn, ctx, n, 0, 0, 1};
    pthread_cond_broadcast(&p->start);
}

/* Under p->mu: runs at most max of loop `which`'s items up to index upto on
 * this thread while any is unclaimed, then with `all` waits until every item
 * has finished. @return the items run. */
static size_t take_part(tsr_pool *p, int which, size_t upto, size_t max, int all) {
    loop *l = &p->loops[which];
    size_t i, ran = 0;
    while (ran < max && l->live && l->next <= upto && claim(p, which, &i)) {
        run_one(p, l, i, 0);
        ran++;
    }
    while (all && l->live && l->finished < l->total) pthread_cond_wait(&p->done, &p->mu);
    return ran;
}

void tsr_pool_for(tsr_pool *p, size_t n, void (*fn)(void *, size_t, int), void *ctx) {
    if (n == 0) return;
    pthread_mutex_lock(&p->mu);
    begin(p, LOOP_FG, n, fn, ctx);
    take_part(p, LOOP_FG, SIZE_MAX, SIZE_MAX, 1);
    p->loops[LOOP_FG].live = 0;
    pthread_mutex_unlock(&p->mu);
}

void tsr_pool_start(tsr_pool *p, size_t n, void (*fn)(void *, size_t, int), void *ctx) {
    pthread_mutex_lock(&p->mu);
    begin(p, LOOP_BG, n, fn, ctx);
    pthread_mutex_unlock(&p->mu);
}

size_t tsr_pool_help(tsr_pool *p, size_t upto, size_t max) {
    pthread_mutex_lock(&p->mu);
    size_t ran = take_part(p, LOOP_BG, upto, max, 0);
    pthread_mutex_unlock(&p->mu);
    return ran;
}

size_t tsr_pool_unclaimed(tsr_pool *p) {
    pthread_mutex_lock(&p->mu);
    const loop *l = &p->loops[LOOP_BG];
    size_t n = l->live ? l->total - l->next : 0;
    pthread_mutex_unlock(&p->mu);
    return n;
}

void tsr_pool_finish(tsr_pool *p) {
    pthread_mutex_lock(&p->mu);
    take_part(p, LOOP_BG, SIZE_MAX, SIZE_MAX, 1);
    p->loops[LOOP_BG].live = 0;
    pthread_mutex_unlock(&p->mu);
}

void tsr_pool_free(tsr_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stopping = 1;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->threads[i - 1], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->start);
    pthread_cond_destroy(&p->done);
    free(p->threads);
    free(p);
}
