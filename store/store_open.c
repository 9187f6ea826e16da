/* store_open.c: the choice of a store by its location, once: S3 for s3://,
 * POSIX files otherwise, wrapped by the fault-injecting store. */
#include <limits.h>
#include <string.h>

#include "common.h"
#include "store.h"

int tsr_store_is_remote(const char *location) { return strncmp(location, "s3://", 5) == 0; }

tsr_store *tsr_store_open(const char *location, int create, tsr_error *err) {
    if (strlen(location) >= PATH_MAX - 1) {
        tsr_err(err, TSR_EINVAL, "%s: path too long", location);
        return NULL;
    }
    tsr_store *s = tsr_store_is_remote(location) ? tsr_store_s3_open(location, err)
                                                 : tsr_store_posix_open(location, create, err);
    return s ? tsr_store_fault_wrap(s, NULL, err) : NULL;
}
