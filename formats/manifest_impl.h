/* manifest_impl.h: what the parts of the MANIFEST code share. Internal to formats/.
 *   manifest.c           the manifest in memory: names, appenders, canonical order
 *   manifest_encode.c    its bytes
 *   manifest_parse.c     bytes to records, then the validator
 *   manifest_validate.c  every rule of FORMAT.md section 4 on the records
 *   datafile.c           frame geometry and the data file header */
#ifndef TSR_MANIFEST_IMPL_H
#define TSR_MANIFEST_IMPL_H

#include "common.h"
#include "manifest.h"

/* A damaged or hostile MANIFEST: TSR_ECORRUPT with a message (err in scope). */
#define BAD(...) tsr_err(err, TSR_ECORRUPT, __VA_ARGS__)

/* tsr_mf_strpool_add(): copies s (len bytes, not NUL-terminated) into the
 * manifest's string pool, where it never moves. @return the copy, or NULL when
 * out of memory. */
const char *tsr_mf_strpool_add(tsr_manifest *m, const char *s, size_t len);

/* Orders of the canonical manifest (FORMAT.md 4.2): boxes by offset, dim by dim;
 * blobs by (name, rank). qsort-style results. */
int tsr_mf_cmp_box_offset(const tsr_box *a, const tsr_box *b);
int tsr_mf_cmp_blob(const void *pa, const void *pb);

#endif
