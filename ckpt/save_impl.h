/* save_impl.h: what the writer (save.c) and the commit's merge of the writers'
 * tables (save_merge.c) share. Internal. */
#ifndef TSR_SAVE_IMPL_H
#define TSR_SAVE_IMPL_H

#include "manifest.h"

/* The tensors of a manifest by name: open addressing over their indices. */
typedef struct name_index {
    uint32_t *slot; /* UINT32_MAX: empty */
    size_t cap;     /* a power of two, or 0 */
} name_index;

/* save_index_find(): the index in m of the tensor `name`, or -1. */
long save_index_find(const name_index *x, const tsr_manifest *m, const char *name);
/* save_index_insert(): adds tensor v of m (its name not in the index yet). 0 or TSR_ENOMEM. */
int save_index_insert(name_index *x, const tsr_manifest *m, uint32_t v);

/* What the caller knows of a whole tensor (a reshard: the source's), declared
 * with tsr_save_tensor_digest and tsr_save_tensor_stats: the commit checks the
 * digest against the writers' shares, and records either where a share is
 * missing (chunks copied as they are stored). */
typedef struct declared {
    const char *name; /* the writer's table's copy */
    uint64_t digest;
    tsr_stats stats; /* finished (l2 the norm) */
    unsigned has;    /* TSR_MF_DIGEST, TSR_MF_STATS */
} declared;

/* save_merge_tables(): the MANIFEST of a save (malloc'ed into *bytes) from its
 * writers' tables: the tensors' digests and statistics summed from their
 * shares (known where every writer's is) and the declared ones applied; the
 * header marked poisoned when a tensor holds a non-finite element, and its
 * epoch (FORMAT.md 4.6; 0: none) recorded. */
int save_merge_tables(const uint8_t *const *tables, const size_t *table_lens, size_t n, const uint8_t save_id[16],
                      uint64_t step, uint64_t epoch, const tsr_layout *layout, const declared *dec, size_t n_dec, uint8_t **bytes,
                      size_t *len, tsr_error *err);

#endif
