/* test_gather.c: the commit's gather with a deadline, in its tree. Run alone,
 * the program starts itself on 7 ranks under mpirun: the tree then has 3
 * ranks below the root (1, 2, 3) and 1 gathers the reports of 4, 5 and 6.
 *  - every rank reports (sizes 0 to a few KiB, each rank's own bytes): the root
 *    receives each in rank order, for root 0 and for root 2 (the tree relabelled);
 *  - rank 5 never reports: rank 1 forwards what came after half the timeout, and
 *    the root fails within the timeout naming rank 5 alone;
 *  - rank 1 reports 3 s late: the root fails naming rank 1, and 4, 5, 6 as the
 *    ranks whose reports go through it.
 * Each case uses its own tag: a report that comes after its receiver gave up
 * stays unreceived (as the engine stops saving after a timeout). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "common.h"
#include "tsr_comm.h"

static tsr_error e;
enum { RANKS = 7 };

/* Rank r's report for case `tag`: (r * 997) % 3000 bytes, byte i = r + i + tag. */
static size_t report(uint32_t r, int tag, uint8_t *buf) {
    size_t n = (r * 997u) % 3000u;
    for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)(r + i + (unsigned)tag);
    return n;
}

/* Every rank reports; the root checks each report. */
static void all_report(tsr_comm *c, uint32_t root, int tag) {
    uint32_t me = tsr_comm_rank(c);
    uint8_t mine[3000], want[3000];
    size_t n = report(me, tag, mine), *counts = NULL;
    uint8_t *all = NULL;
    CHECK_OK(tsr_comm_gatherv_deadline(c, root, tag, mine, n, 30, &all, &counts, &e));
    if (me == root && all && counts) {
        size_t off = 0;
        for (uint32_t r = 0; r < RANKS; r++) {
            size_t k = report(r, tag, want);
            CHECK(counts[r] == k && memcmp(all + off, want, k) == 0, "root %u: rank %u's report (%zu bytes, want %zu)",
                  root, r, counts[r], k);
            off += counts[r];
        }
    } else {
        CHECK(me == root || (!all && !counts), "rank %u: nothing gathered outside the root", me);
    }
    free(all), free(counts);
    tsr_comm_barrier(c, NULL);
}

/* Rank `late` reports after `delay` s (or never, delay < 0); the root's error. */
static void one_late(tsr_comm *c, uint32_t late, double delay, int tag, const char *want) {
    uint32_t me = tsr_comm_rank(c);
    uint8_t mine[3000];
    size_t n = report(me, tag, mine), *counts = NULL;
    uint8_t *all = NULL;
    double t0 = tsr_now();
    int rc = 0;
    if (me == late && delay > 0) usleep((useconds_t)(delay * 1e6));
    if (me != late || delay > 0) rc = tsr_comm_gatherv_deadline(c, 0, tag, mine, n, 1.0, &all, &counts, &e);
    double took = tsr_now() - t0;
    if (me == 0) {
        CHECK(rc == TSR_EIO && strstr(e.msg, want), "late rank %u: the root's error: %s (want \"%s\")", late,
              rc ? e.msg : "none", want);
        CHECK(took < 1.8, "late rank %u: the root gave up after %.2f s, timeout 1 s", late, took);
    } else if (me != late) {
        CHECK(rc == 0, "late rank %u: rank %u: %s", late, me, e.msg); /* a sender forwards what it has */
    }
    free(all), free(counts);
    tsr_comm_barrier(c, NULL);
}

int main(void) {
    if (!getenv("OMPI_COMM_WORLD_SIZE") && !getenv("PMI_SIZE")) return check_mpi_relaunch("7", "120");
    tsr_comm *c = tsr_comm_mpi_world(&e);
    REQUIRE(c, "%s", e.msg);
    REQUIRE(tsr_comm_size(c) == RANKS, "run on %d ranks", RANKS);
    all_report(c, 0, 101);
    all_report(c, 2, 102);
    one_late(c, 5, -1, 103, "rank 5 did not report within 1.0 s");
    one_late(c, 1, 3.0, 104, "rank 1 did not report within 1.0 s (nor ranks 4, 5, 6, whose reports go through it)");
    int failed = check_failures;
    uint32_t me = tsr_comm_rank(c);
    tsr_comm_free(c);
    if (me == 0 && !failed) printf("gather tree: every report in order; a late leaf and a late relay named\n");
    return failed ? 1 : 0;
}
