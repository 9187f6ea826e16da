/* pool.h: a fixed thread pool that runs parallel-for loops. Internal.
 * The caller's thread takes part in the work, so a pool of 1 runs inline. */
#ifndef TSR_POOL_H
#define TSR_POOL_H

#include <stddef.h>

typedef struct tsr_pool tsr_pool;

/* tsr_pool_new(): a pool of `threads` workers in all (the caller counts as one);
 * threads <= 0 means the number of online cores. NULL if a thread cannot start. */
tsr_pool *tsr_pool_new(int threads);
void tsr_pool_free(tsr_pool *p);
int tsr_pool_size(const tsr_pool *p);

/* tsr_pool_for(): calls fn(ctx, i, worker) for every i in [0, n), spread over the
 * pool's threads; `worker` in [0, tsr_pool_size) identifies the thread (for
 * per-thread state). Returns when all calls are done. Not reentrant. */
void tsr_pool_for(tsr_pool *p, size_t n, void (*fn)(void *ctx, size_t i, int worker), void *ctx);

/* A loop in the background, one at a time: tsr_pool_start() hands fn(ctx, i,
 * worker) for every i in [0, n) to the pool's workers and returns at once; they
 * take its items before those of any tsr_pool_for loop (whose caller runs only
 * its own). tsr_pool_help() runs, on the calling thread (worker 0), at most `max`
 * of the items of index up to `upto` that no worker has taken yet, and returns
 * how many it ran; tsr_pool_finish() runs every
 * one left and waits until all have finished (with one thread in the pool, the
 * calling thread runs them all there). The caller tells items' completion apart
 * itself. */
void tsr_pool_start(tsr_pool *p, size_t n, void (*fn)(void *ctx, size_t i, int worker), void *ctx);
size_t tsr_pool_help(tsr_pool *p, size_t upto, size_t max);
/* tsr_pool_unclaimed(): the background loop's items no thread has taken yet. */
size_t tsr_pool_unclaimed(tsr_pool *p);
void tsr_pool_finish(tsr_pool *p);

#endif
