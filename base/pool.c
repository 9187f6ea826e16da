/* pool.c: the thread pool behind frame encoding and decoding. */
#include "pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

struct tsr_pool {
    int n;                /* threads in all, the caller included */
    pthread_t *threads;   /* n - 1 workers */
    pthread_mutex_t mu;
    pthread_cond_t start, done;
    unsigned long generation;
    int stopping, active;
    void (*fn)(void *, size_t, int);
    void *ctx;
    size_t total;
    atomic_size_t next;
};

typedef struct worker_arg {
    tsr_pool *p;
    int id;
} worker_arg;

static void run_items(tsr_pool *p, int id) {
    for (;;) {
        size_t i = atomic_fetch_add(&p->next, 1);
        if (i >= p->total) return;
        p->fn(p->ctx, i, id);
    }
}

static void *worker_main(void *argp) {
    worker_arg *a = argp;
    tsr_pool *p = a->p;
    int id = a->id;
    free(a);
    unsigned long seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stopping && p->generation == seen) pthread_cond_wait(&p->start, &p->mu);
        if (p->stopping) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        run_items(p, id);
        pthread_mutex_lock(&p->mu);
        if (--p->active == 0) pthread_cond_signal(&p->done);
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

void tsr_pool_for(tsr_pool *p, size_t n, void (*fn)(void *, size_t, int), void *ctx) {
    if (n == 0) return;
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->total = n;
    atomic_store(&p->next, 0);
    p->active = p->n - 1;
    p->generation++;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
    run_items(p, 0);
    pthread_mutex_lock(&p->mu);
    while (p->active > 0) pthread_cond_wait(&p->done, &p->mu);
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
