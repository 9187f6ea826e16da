/* test_hash.c: the order-free hash that the trainer's replicas compare
 * (kernels/hash.h, tsr_kc_hash_add): its definition on a few words, one flipped
 * bit of any word (every bit of one word, one bit of every word) changes it, a
 * swap of two words changes it, parts add up at their index offsets, the value
 * does not depend on the thread count, and the kernel context gives the same
 * value on host and on guard memory (the device call sequence; test_cuda holds
 * the CUDA twin to it). */
#include <omp.h>
#include <string.h>

#include "check.h"
#include "common.h"
#include "hash.h"
#include "kctx.h"

/* The hash through a kernel context of `kind`, in two parts added into one
 * word of its memory, brought to the host in one copy. */
static uint64_t kc_hash(tsr_mem_kind kind, const uint32_t *x, size_t n, uint64_t index0) {
    tsr_error e = {0};
    tsr_kctx kc;
    CHECK_OK(tsr_kctx_init(&kc, kind, 0, &e));
    uint32_t *d = tsr_kc_alloc(&kc, (n ? n : 1) * sizeof *d, &e);
    uint64_t *acc = tsr_kc_alloc(&kc, sizeof *acc, &e), h = 0;
    REQUIRE(d && acc, "allocations: %s", e.msg);
    CHECK_OK(tsr_kc_from_host(&kc, d, x, n * sizeof *x, &e));
    tsr_kc_hash_add(&kc, acc, d, n / 3, index0);
    tsr_kc_hash_add(&kc, acc, d + n / 3, n - n / 3, index0 + n / 3);
    CHECK_OK(tsr_kc_to_host(&kc, &h, acc, sizeof h, &e));
    tsr_kc_free(&kc, d), tsr_kc_free(&kc, acc);
    tsr_kctx_free(&kc);
    return h;
}

int main(void) {
    /* the definition, on three words */
    const uint32_t w3[3] = {0, 1, 0x3f800000u};
    uint64_t want = 0;
    for (uint64_t i = 0; i < 3; i++) want += tsr_mix64(w3[i] + (7 + i) * TSR_HASH_K);
    CHECK(tsr_hash_sum(w3, 3, 7) == want, "three words: %016llx, not %016llx", (unsigned long long)tsr_hash_sum(w3, 3, 7),
          (unsigned long long)want);
    CHECK(tsr_hash_sum(w3, 0, 7) == 0, "no words: not 0");

    enum { N = 300007 };
    uint32_t *x = malloc(N * sizeof *x);
    REQUIRE(x, "out of memory");
    uint64_t s = 11;
    for (size_t i = 0; i < N; i++) x[i] = (uint32_t)tsr_splitmix_next(&s);
    uint64_t h = tsr_hash_sum(x, N, 0);
    /* every bit of one word, and one bit of every 1000th word */
    int same = 0;
    for (int b = 0; b < 32; b++) {
        x[12345] ^= 1u << b;
        same += tsr_hash_sum(x, N, 0) == h;
        x[12345] ^= 1u << b;
    }
    for (size_t i = 0; i < N; i += 1000) {
        x[i] ^= 1u << (i % 32);
        same += tsr_hash_sum(x, N, 0) == h;
        x[i] ^= 1u << (i % 32);
    }
    CHECK(same == 0, "%d single flipped bit(s) left the hash as it was", same);
    uint32_t t = x[5];
    x[5] = x[N - 2], x[N - 2] = t;
    CHECK(tsr_hash_sum(x, N, 0) != h, "two words swapped: the same hash");
    x[N - 2] = x[5], x[5] = t;
    CHECK(tsr_hash_sum(x, 1000, 0) + tsr_hash_sum(x + 1000, N - 1000, 1000) == h, "the parts do not add up");
    CHECK(tsr_hash_sum(x, N, 1) != h, "another index offset: the same hash");
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    CHECK(tsr_hash_sum(x, N, 0) == h, "one thread: another hash");
    omp_set_num_threads(threads);

    /* the kernel context: host and guard memory, the same value; a flipped bit seen there too */
    uint64_t h42 = tsr_hash_sum(x, N, 42);
    CHECK(kc_hash(TSR_MEM_HOST, x, N, 42) == h42, "host context: not tsr_hash_sum's value");
    CHECK(kc_hash(TSR_MEM_GUARD, x, N, 42) == h42, "guard context: not tsr_hash_sum's value");
    x[N - 1] ^= 1u << 31;
    uint64_t g = kc_hash(TSR_MEM_GUARD, x, N, 42);
    CHECK(g == tsr_hash_sum(x, N, 42) && g == kc_hash(TSR_MEM_HOST, x, N, 42) && g != h42,
          "a flipped bit on guard memory: %016llx (unflipped %016llx)", (unsigned long long)g, (unsigned long long)h42);
    free(x);
    return check_done();
}
