/* check.h: the assertions of tessera's tests.
 * A test program exits 0 when every check passed, 1 when one failed, and 77 when
 * a resource it needs is missing (it says which on stderr). */
#ifndef TSR_CHECK_H
#define TSR_CHECK_H

#include <stdio.h>
#include <stdlib.h>

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

#endif
