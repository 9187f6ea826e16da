/* check.h: the assertions of tessera's tests.
 * A test program exits 0 when every check passed, 1 when one failed, and 77 when
 * a resource it needs is missing (it says which on stderr). */
#ifndef TSR_CHECK_H
#define TSR_CHECK_H

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "tessera.h"

static int check_failures;

#define CHECK(cond, ...)                                                         \
    do {                                                                         \
        if (!(cond)) {                                                           \
            check_failures++;                                                    \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                        \
            fputc('\n', stderr);                                                 \
        }                                                                        \
    } while (0)

/* CHECK_OK(call): call returns a tsr_status; `e` is the tsr_error in scope. */
#define CHECK_OK(call)                                                           \
    do {                                                                         \
        int rc_ = (call);                                                        \
        CHECK(rc_ == 0, "%s returned %d: %s", #call, rc_, e.msg);                 \
    } while (0)

#define REQUIRE(cond, ...)                                                       \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "%s:%d: required: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                        \
            fputc('\n', stderr);                                                 \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

#define SKIP(...)                                                                \
    do {                                                                         \
        fprintf(stderr, "SKIP: ");                                               \
        fprintf(stderr, __VA_ARGS__);                                            \
        fputc('\n', stderr);                                                     \
        exit(77);                                                                \
    } while (0)

static inline int check_done(void) {
    if (check_failures) fprintf(stderr, "%d check(s) failed\n", check_failures);
    return check_failures ? 1 : 0;
}

/* check_mpi_relaunch(): a test run alone starts this same program on `ranks`
 * ranks under mpirun (as tests/mpi.sh runs MPI jobs), with a wall-clock limit
 * in seconds: a hang anywhere, MPI_Finalize included, fails the test (exit
 * 124). mpirun comes with the set-up (tools/deps.sh): missing, it is a failure.
 * Returns only when it cannot start mpirun. */
static inline int check_mpi_relaunch(const char *ranks, const char *limit_s) {
    REQUIRE(system("command -v mpirun >/dev/null 2>&1") == 0, "mpirun is not installed (make deps)");
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    REQUIRE(n > 0, "cannot find this program");
    self[n] = 0;
    /* Open MPI's own allocations outlive MPI_Finalize: no leak checking */
    setenv("ASAN_OPTIONS", "detect_leaks=0:abort_on_error=1", 1);
    setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 1);
    execlp("timeout", "timeout", limit_s, "mpirun", "--allow-run-as-root", "--oversubscribe", "-np", ranks, self,
           (char *)NULL);
    perror("timeout mpirun");
    return 1;
}

#endif
