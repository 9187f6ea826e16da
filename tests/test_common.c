/* test_common.c: the shared helpers of common.h: tsr_grow (growth, and refusal of
 * a capacity whose byte count does not fit in size_t), tsr_sort_ctx (the
 * comparator sees its table; two threads sort by different tables at once) and
 * splitmix64 (the published output sequence for seed 1234567); and the thread
 * pool of pool.h: a background loop runs beside foreground loops, every item of
 * each exactly once, help runs only unclaimed items up to its bound, finish
 * waits for all. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common.h"
#include "pool.h"

static void test_grow(void) {
    uint32_t *v = NULL;
    size_t n = 0, cap = 0;
    for (uint32_t i = 0; i < 1000; i++) {
        REQUIRE(tsr_grow((void **)&v, &cap, n, sizeof *v) == 0, "grow to %zu", n + 1);
        CHECK(cap > n, "capacity %zu for %zu elements", cap, n + 1);
        v[n++] = i;
    }
    int ok = 1;
    for (uint32_t i = 0; i < 1000; i++) ok = ok && v[i] == i;
    CHECK(ok, "the elements survive the reallocations");
    size_t before = cap;
    CHECK(tsr_grow((void **)&v, &cap, n - 1, sizeof *v) == 0 && cap == before, "no growth while there is room");
    free(v);

    /* 2^61 elements of 8 bytes, doubled: 2^65 bytes, which wraps to 0 in size_t */
    void *p = NULL;
    size_t huge = ((size_t)1 << 61), c = huge;
    CHECK(tsr_grow(&p, &c, huge, 8) == TSR_ENOMEM, "a capacity of 2^62 x 8 bytes is refused");
    CHECK(p == NULL && c == huge, "nothing changes on refusal (capacity %zu)", c);
    free(p);
    p = NULL;
    c = SIZE_MAX / 2 + 1; /* doubling itself wraps */
    CHECK(tsr_grow(&p, &c, c, 1) == TSR_ENOMEM && p == NULL, "a capacity past SIZE_MAX is refused");
    free(p);
}

/* Sorts indices 0..n-1 by the keys of the table given as ctx. */
static int by_key(const void *a, const void *b, void *ctx) {
    const int *key = ctx;
    int x = key[*(const int *)a], y = key[*(const int *)b];
    return (x > y) - (x < y);
}

typedef struct sort_job {
    int key[4096], idx[4096], ok;
} sort_job;

static void *sort_many(void *arg) {
    sort_job *j = arg;
    j->ok = 1;
    for (int round = 0; round < 50 && j->ok; round++) {
        for (int i = 0; i < 4096; i++) j->idx[i] = i;
        tsr_sort_ctx(j->idx, 4096, sizeof *j->idx, by_key, j->key);
        for (int i = 1; i < 4096; i++) j->ok = j->ok && j->key[j->idx[i - 1]] <= j->key[j->idx[i]];
    }
    return NULL;
}

static void test_sort_ctx(void) {
    tsr_sort_ctx(NULL, 0, sizeof(int), by_key, NULL); /* empty: no call */
    static sort_job a, b;
    for (int i = 0; i < 4096; i++) a.key[i] = (i * 7919) % 4096, b.key[i] = 4096 - i;
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, sort_many, &a) == 0, "pthread_create");
    sort_many(&b);
    pthread_join(t, NULL);
    CHECK(a.ok && b.ok, "two threads sort by their own tables (%d %d)", a.ok, b.ok);
    CHECK(b.idx[0] == 4095 && b.idx[4095] == 0, "descending keys reverse the order");
}

static void test_splitmix(void) {
    /* the reference sequence of splitmix64 seeded with 1234567 */
    const uint64_t want[5] = {6457827717110365317ull, 3203168211198807973ull, 9817491932198370423ull,
                              4593380528125082431ull, 16408922859458223821ull};
    uint64_t s = 1234567, s2 = 1234567;
    for (int i = 0; i < 5; i++) {
        uint64_t hashed = tsr_splitmix64(s2);
        s2 += TSR_GOLDEN64;
        uint64_t got = tsr_splitmix_next(&s);
        CHECK(got == want[i], "output %d: %llu, want %llu", i, (unsigned long long)got, (unsigned long long)want[i]);
        CHECK(hashed == got, "tsr_splitmix64 of the state gives the generator's next output (%d)", i);
    }
    CHECK(tsr_mix64(0) == 0, "the output function maps 0 to 0");
}

enum { BG_N = 400, FG_N = 50 };
static _Atomic int bg_runs[BG_N], fg_runs[FG_N];

static void bg_item(void *ctx, size_t i, int worker) {
    (void)ctx, (void)worker;
    for (volatile int k = 0; k < 20000; k++) {
    }
    bg_runs[i]++;
}

static void fg_item(void *ctx, size_t i, int worker) {
    (void)ctx;
    CHECK(worker == 0 || worker == 1 || worker == 2, "worker id %d", worker);
    fg_runs[i]++;
}

static void test_pool(void) {
    for (int threads = 1; threads <= 3; threads++) {
        tsr_pool *p = tsr_pool_new(threads);
        REQUIRE(p, "a pool of %d", threads);
        memset(bg_runs, 0, sizeof bg_runs);
        tsr_pool_start(p, BG_N, bg_item, NULL);
        /* the items up to 9 are taken, here or by a worker */
        tsr_pool_help(p, 9, SIZE_MAX);
        CHECK(tsr_pool_unclaimed(p) <= BG_N - 10, "help took the items up to its bound: %zu left",
              tsr_pool_unclaimed(p));
        size_t one = tsr_pool_help(p, SIZE_MAX, 1);
        CHECK(one <= 1, "help ran %zu items with a maximum of 1", one);
        for (int r = 0; r < 5; r++) { /* foreground loops while the background one runs */
            memset(fg_runs, 0, sizeof fg_runs);
            tsr_pool_for(p, FG_N, fg_item, NULL);
            int ok = 1;
            for (int i = 0; i < FG_N; i++) ok = ok && fg_runs[i] == 1;
            CHECK(ok, "%d threads: every foreground item once, the background loop live", threads);
        }
        tsr_pool_finish(p);
        CHECK(tsr_pool_unclaimed(p) == 0, "nothing unclaimed after finish");
        int ok = 1;
        for (int i = 0; i < BG_N; i++) ok = ok && bg_runs[i] == 1;
        CHECK(ok, "%d threads: every background item exactly once by the time finish returns", threads);
        tsr_pool_finish(p); /* none live: returns */
        tsr_pool_free(p);
    }
}

int main(void) {
    test_pool();
    test_grow();
    test_sort_ctx();
    test_splitmix();
    return check_done();
}
