/* test_box.c: box intersection and the strided box copy, against element-by-element
 * references on random boxes in 0 to 5 dims. */
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "tessera.h"

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}
static uint64_t below(uint64_t n) { return n ? next() % n : 0; }

static void random_box(uint32_t nd, const uint64_t *shape, tsr_box *b) {
    b->ndim = nd;
    for (uint32_t d = 0; d < nd; d++) {
        b->offset[d] = below(shape[d]);
        b->extent[d] = 1 + below(shape[d] - b->offset[d]);
    }
}

/* flat index of global index idx inside box b */
static uint64_t pos_in(const tsr_box *b, const uint64_t *idx) {
    uint64_t p = 0;
    for (uint32_t d = 0; d < b->ndim; d++) p = p * b->extent[d] + (idx[d] - b->offset[d]);
    return p;
}

int main(void) {
    for (int iter = 0; iter < 20000; iter++) {
        uint32_t nd = (uint32_t)below(6);
        uint64_t shape[TSR_MAX_DIMS];
        for (uint32_t d = 0; d < nd; d++) shape[d] = 1 + below(7);
        tsr_box a, b, x;
        random_box(nd, shape, &a);
        random_box(nd, shape, &b);
        int nonempty = tsr_box_intersect(&a, &b, &x);
        /* reference: an index is in x iff it is in a and in b */
        int ref = 1;
        for (uint32_t d = 0; d < nd; d++) {
            uint64_t lo = a.offset[d] > b.offset[d] ? a.offset[d] : b.offset[d];
            uint64_t hi = a.offset[d] + a.extent[d] < b.offset[d] + b.extent[d] ? a.offset[d] + a.extent[d]
                                                                                 : b.offset[d] + b.extent[d];
            if (hi <= lo) ref = 0;
            else CHECK(x.offset[d] == lo && x.extent[d] == hi - lo, "intersection dim %u", d);
        }
        CHECK(nonempty == ref, "nonempty %d, expected %d", nonempty, ref);
        if (!nonempty) continue;
        CHECK(tsr_box_contains(&a, &x) && tsr_box_contains(&b, &x), "intersection inside both");
        size_t es = (size_t)1 << below(4); /* 1, 2, 4, 8 bytes */
        uint64_t va = tsr_box_volume(&a), vb = tsr_box_volume(&b), vx = tsr_box_volume(&x);
        uint8_t *src = malloc(va * es), *dst = malloc(vb * es), *want = malloc(vb * es);
        for (uint64_t i = 0; i < va * es; i++) src[i] = (uint8_t)next();
        for (uint64_t i = 0; i < vb * es; i++) dst[i] = want[i] = (uint8_t)next();
        /* reference copy, element by element */
        uint64_t idx[TSR_MAX_DIMS];
        for (uint32_t d = 0; d < nd; d++) idx[d] = x.offset[d];
        for (uint64_t n = 0; n < vx; n++) {
            memcpy(want + pos_in(&b, idx) * es, src + pos_in(&a, idx) * es, es);
            for (int d = (int)nd - 1; d >= 0; d--) {
                if (++idx[d] < x.offset[d] + x.extent[d]) break;
                idx[d] = x.offset[d];
            }
        }
        tsr_box_copy(dst, &b, src, &a, &x, es);
        CHECK(memcmp(dst, want, vb * es) == 0, "copy of a %u-d region differs (iteration %d)", nd, iter);
        free(src), free(dst), free(want);
    }
    /* pieces: cover the box exactly, in row-major order, each within the limit */
    for (int iter = 0; iter < 2000; iter++) {
        uint32_t nd = (uint32_t)below(5);
        uint64_t shape[TSR_MAX_DIMS];
        for (uint32_t d = 0; d < nd; d++) shape[d] = 1 + below(9);
        tsr_box whole = {.ndim = nd};
        for (uint32_t d = 0; d < nd; d++) whole.extent[d] = shape[d];
        random_box(nd, shape, &whole);
        size_t es = 1 + below(8), maxb = 1 + below(200);
        uint64_t n = tsr_box_pieces(&whole, es, maxb), covered = 0;
        uint64_t vol = tsr_box_volume(&whole);
        uint8_t *seen = calloc(vol ? vol : 1, 1);
        for (uint64_t k = 0; k < n; k++) {
            tsr_box p;
            tsr_box_piece(&whole, es, maxb, k, &p);
            CHECK(tsr_box_contains(&whole, &p), "piece inside the box");
            uint64_t pv = tsr_box_volume(&p);
            CHECK(pv >= 1 && (pv == 1 || pv * es <= maxb), "piece size %llu x %zu within %zu",
                  (unsigned long long)pv, es, maxb);
            uint64_t first[TSR_MAX_DIMS];
            for (uint32_t d = 0; d < nd; d++) first[d] = p.offset[d];
            CHECK(pos_in(&whole, first) == covered, "pieces in row-major order");
            for (uint64_t i = 0; i < pv; i++) seen[covered + i]++;
            covered += pv;
        }
        CHECK(covered == vol, "pieces cover %llu of %llu", (unsigned long long)covered, (unsigned long long)vol);
        for (uint64_t i = 0; i < vol; i++) CHECK(seen[i] == 1, "element %llu covered %d times", (unsigned long long)i, seen[i]);
        free(seen);
    }
    return check_done();
}
