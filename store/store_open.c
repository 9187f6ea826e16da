/* store_open.c: the stores by scheme, one row each: tsr_store_open picks the
 * row of a location once, and wraps the store in the fault-injecting one. A new
 * kind of store is one file of operations (store.h, "for the implementations")
 * and one row here. The S3 row opens S3 only in a library built with it
 * (TSR_STORE_S3: libtessera and libtessera-core-s3, which link libcurl); the
 * core (libtessera-core) refuses s3:// by name instead. */
#include <limits.h>
#include <string.h>

#include "common.h"
#include "store.h"

typedef struct store_kind {
    const char *scheme; /* "s3://"; "" for a path (no scheme) */
    tsr_store *(*open)(const char *location, int create, tsr_error *err);
    unsigned caps; /* TSR_STORE_* */
} store_kind;

#ifdef TSR_STORE_S3
#define SCHEMES "s3:// or a path"
#else
#define SCHEMES "a path: this library has no S3"
/* s3:// in a library built without S3: refused, as an unknown scheme is. */
static tsr_store *s3_absent(const char *location, int create, tsr_error *err) {
    (void)create;
    tsr_err(err, TSR_EINVAL,
            "%s: this library was built without S3 (libtessera-core): s3:// needs libtessera-core-s3 or libtessera",
            location);
    return NULL;
}
#endif

static const store_kind KINDS[] = {
#ifdef TSR_STORE_S3
    {"s3://", tsr_store_s3_open, 0},
#else
    {"s3://", s3_absent, 0},
#endif
    {"", tsr_store_posix_open, TSR_STORE_DIRS | TSR_STORE_RENAME | TSR_STORE_LOCKS},
};

/* The row of location: the one whose scheme it starts with; a path (no
 * "SCHEME://" before its first '/') gets the row without one; NULL for an
 * unknown scheme. */
static const store_kind *kind_of(const char *location) {
    for (size_t i = 0; i < sizeof KINDS / sizeof KINDS[0]; i++)
        if (KINDS[i].scheme[0] && strncmp(location, KINDS[i].scheme, strlen(KINDS[i].scheme)) == 0) return &KINDS[i];
    const char *sep = strstr(location, "://"), *slash = strchr(location, '/');
    if (sep && sep > location && (!slash || sep < slash)) return NULL;
    return &KINDS[sizeof KINDS / sizeof KINDS[0] - 1];
}

unsigned tsr_store_caps(const char *location) {
    const store_kind *k = kind_of(location);
    return k ? k->caps : 0;
}

tsr_store *tsr_store_open(const char *location, int create, tsr_error *err) {
    if (strlen(location) >= PATH_MAX - 1) {
        tsr_err(err, TSR_EINVAL, "%s: path too long", location);
        return NULL;
    }
    const store_kind *k = kind_of(location);
    if (!k) {
        tsr_err(err, TSR_EINVAL, "%s: no store serves this scheme (" SCHEMES ")", location);
        return NULL;
    }
    tsr_store *s = k->open(location, create, err);
    return s ? tsr_store_fault_wrap(s, NULL, err) : NULL;
}
