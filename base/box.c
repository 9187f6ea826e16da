/* box.c: boxes of global tensors and the one strided copy (tsr_base.h, "boxes").
 * Save, load and resharding all copy through
 * tsr_box_copy. */
#include <assert.h>
#include <string.h>

#include "tsr_base.h"

uint64_t tsr_box_volume(const tsr_box *b) {
    uint64_t v = 1;
    for (uint32_t d = 0; d < b->ndim; d++) v *= b->extent[d];
    return v;
}

int tsr_box_intersect(const tsr_box *a, const tsr_box *b, tsr_box *out) {
    tsr_box r;
    r.ndim = a->ndim;
    int nonempty = 1;
    for (uint32_t d = 0; d < a->ndim; d++) {
        uint64_t lo = a->offset[d] > b->offset[d] ? a->offset[d] : b->offset[d];
        uint64_t ea = a->offset[d] + a->extent[d], eb = b->offset[d] + b->extent[d];
        uint64_t hi = ea < eb ? ea : eb;
        r.offset[d] = lo;
        r.extent[d] = hi > lo ? hi - lo : 0;
        if (hi <= lo) nonempty = 0;
    }
    if (out) *out = r;
    return nonempty;
}

int tsr_box_contains(const tsr_box *outer, const tsr_box *inner) {
    if (outer->ndim != inner->ndim) return 0;
    for (uint32_t d = 0; d < outer->ndim; d++) {
        if (inner->offset[d] < outer->offset[d]) return 0;
        if (inner->offset[d] + inner->extent[d] > outer->offset[d] + outer->extent[d]) return 0;
    }
    return 1;
}

void tsr_box_copy(void *dst, const tsr_box *dst_box, const void *src, const tsr_box *src_box,
                  const tsr_box *region, size_t elem_size) {
    assert(tsr_box_contains(dst_box, region) && tsr_box_contains(src_box, region));
    uint32_t nd = region->ndim;
    if (tsr_box_volume(region) == 0) return;
    /* Coalesce: the innermost dims that are whole in both boxes form one run. */
    uint64_t run = elem_size;
    int d = (int)nd - 1;
    for (; d >= 0; d--) {
        run *= region->extent[d];
        if (region->extent[d] != src_box->extent[d] || region->extent[d] != dst_box->extent[d]) {
            d--;
            break;
        }
    }
    /* dims [0, d] are iterated; dim d+1 .. nd-1 are inside one run */
    int outer = d + 1; /* number of iterated dims */
    uint64_t sstride[TSR_MAX_DIMS], dstride[TSR_MAX_DIMS];
    uint64_t ss = elem_size, ds = elem_size;
    for (int k = (int)nd - 1; k >= 0; k--) {
        sstride[k] = ss;
        dstride[k] = ds;
        ss *= src_box->extent[k];
        ds *= dst_box->extent[k];
    }
    const char *s = src;
    char *o = dst;
    uint64_t soff = 0, doff = 0;
    for (uint32_t k = 0; k < nd; k++) {
        soff += (region->offset[k] - src_box->offset[k]) * sstride[k];
        doff += (region->offset[k] - dst_box->offset[k]) * dstride[k];
    }
    if (outer == 0) {
        memcpy(o + doff, s + soff, run);
        return;
    }
    uint64_t idx[TSR_MAX_DIMS] = {0};
    for (;;) {
        memcpy(o + doff, s + soff, run);
        int k = outer - 1;
        for (; k >= 0; k--) {
            if (++idx[k] < region->extent[k]) {
                soff += sstride[k];
                doff += dstride[k];
                break;
            }
            soff -= (idx[k] - 1) * sstride[k];
            doff -= (idx[k] - 1) * dstride[k];
            idx[k] = 0;
        }
        if (k < 0) return;
    }
}
