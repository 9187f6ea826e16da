/* datafile.c: the layout of a data file: how a chunk is cut into frames (FORMAT.md
 * section 3) and the file's header (section 5). */
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "manifest.h"

/* -------------------------------------------------------------- geometry */

uint64_t tsr_frame_count(const tsr_box *b, uint32_t split_dim, uint64_t frame_rows) {
    if (b->ndim == 0) return (split_dim == 0 && frame_rows == 1) ? 1 : UINT64_MAX;
    if (split_dim >= b->ndim || frame_rows == 0 || frame_rows > b->extent[split_dim])
        return UINT64_MAX;
    uint64_t n = 1;
    for (uint32_t d = 0; d < split_dim; d++)
        if (tsr_mul_ovf(n, b->extent[d], &n)) return UINT64_MAX;
    uint64_t runs = (b->extent[split_dim] + frame_rows - 1) / frame_rows;
    if (tsr_mul_ovf(n, runs, &n)) return UINT64_MAX;
    return n;
}

void tsr_frame_box(const tsr_mf_chunk *c, uint64_t k, tsr_box *out) {
    *out = c->box;
    if (c->box.ndim == 0) return;
    uint32_t s = c->split_dim;
    uint64_t r = c->frame_rows;
    uint64_t runs = (c->box.extent[s] + r - 1) / r;
    uint64_t j = k % runs, outer = k / runs;
    for (int d = (int)s - 1; d >= 0; d--) {
        out->offset[d] = c->box.offset[d] + outer % c->box.extent[d];
        out->extent[d] = 1;
        outer /= c->box.extent[d];
    }
    out->offset[s] = c->box.offset[s] + j * r;
    uint64_t left = c->box.extent[s] - j * r;
    out->extent[s] = left < r ? left : r;
}

void tsr_frame_geometry(const tsr_box *box, size_t elem_size, size_t frame_bytes,
                        uint32_t *split_dim, uint64_t *frame_rows) {
    if (box->ndim == 0) {
        *split_dim = 0;
        *frame_rows = 1;
        return;
    }
    if (frame_bytes < elem_size) frame_bytes = elem_size;
    /* inner[s] = bytes of one index of dim s */
    uint32_t s = 0;
    uint64_t inner = elem_size;
    uint64_t inners[TSR_MAX_DIMS];
    for (int d = (int)box->ndim - 1; d >= 0; d--) {
        inners[d] = inner;
        if (tsr_mul_ovf(inner, box->extent[d], &inner)) inner = UINT64_MAX;
    }
    for (s = 0; s + 1 < box->ndim && inners[s] > frame_bytes; s++) {
    }
    uint64_t rows = frame_bytes / inners[s];
    if (rows == 0) rows = 1;
    if (rows > box->extent[s]) rows = box->extent[s];
    /* frames of a whole multiple of TSR_ALIGN bytes where enough rows fit: in a
     * box that starts aligned (a save's staging arena), every frame but the last
     * then starts aligned too, and goes to an O_DIRECT write without a copy */
    uint64_t low = inners[s] & (~inners[s] + 1), q = low >= TSR_ALIGN ? 1 : TSR_ALIGN / low;
    if (rows < box->extent[s] && rows >= q) rows -= rows % q;
    if (rows > TSR_MAX_FRAME_RAW / inners[s]) rows = TSR_MAX_FRAME_RAW / inners[s];
    if (rows == 0) rows = 1;
    *split_dim = s;
    *frame_rows = rows;
}

uint64_t tsr_box_pieces(const tsr_box *box, size_t elem_size, size_t max_bytes) {
    if (tsr_box_volume(box) == 0) return 0;
    tsr_mf_chunk c = {.box = *box};
    tsr_frame_geometry(box, elem_size, max_bytes, &c.split_dim, &c.frame_rows);
    return tsr_frame_count(box, c.split_dim, c.frame_rows);
}

void tsr_box_piece(const tsr_box *box, size_t elem_size, size_t max_bytes, uint64_t k,
                   tsr_box *out) {
    tsr_mf_chunk c = {.box = *box};
    tsr_frame_geometry(box, elem_size, max_bytes, &c.split_dim, &c.frame_rows);
    tsr_frame_box(&c, k, out);
}

int tsr_frames_in(const tsr_mf_chunk *c, const tsr_box *region,
                  int (*fn)(void *user, uint64_t k), void *user) {
    const tsr_box *b = &c->box;
    if (b->ndim == 0) return fn(user, 0);
    uint32_t s = c->split_dim;
    uint64_t r = c->frame_rows;
    uint64_t runs = (b->extent[s] + r - 1) / r;
    uint64_t j0 = (region->offset[s] - b->offset[s]) / r;
    uint64_t j1 = (region->offset[s] + region->extent[s] - 1 - b->offset[s]) / r;
    /* odometer over the outer dims' indices inside the region */
    uint64_t idx[TSR_MAX_DIMS];
    for (uint32_t d = 0; d < s; d++) idx[d] = region->offset[d] - b->offset[d];
    for (;;) {
        uint64_t outer = 0;
        for (uint32_t d = 0; d < s; d++) outer = outer * b->extent[d] + idx[d];
        for (uint64_t j = j0; j <= j1; j++) {
            int rc = fn(user, outer * runs + j);
            if (rc) return rc;
        }
        int d = (int)s - 1;
        for (; d >= 0; d--) {
            if (++idx[d] < region->offset[d] - b->offset[d] + region->extent[d]) break;
            idx[d] = region->offset[d] - b->offset[d];
        }
        if (d < 0) return 0;
    }
}

/* ----------------------------------------------------------- data header */

void tsr_data_file_name(uint32_t file_id, char *buf, size_t len) {
    snprintf(buf, len, "data-%05u.tsd", file_id);
}

void tsr_data_header_encode(uint8_t *hdr, uint32_t file_id, const uint8_t save_id[16]) {
    memset(hdr, 0, TSR_DATA_HEADER_SIZE);
    memcpy(hdr, TSR_DATA_MAGIC, 8);
    tsr_st16(hdr + 8, TSR_FORMAT_MAJOR);
    tsr_st16(hdr + 10, TSR_DATA_MINOR);
    tsr_st32(hdr + 12, file_id);
    memcpy(hdr + 16, save_id, 16);
    tsr_st64(hdr + 32, tsr_hash(hdr, 32));
}

int tsr_data_header_check(const uint8_t *hdr, uint32_t file_id, const uint8_t save_id[16],
                          const char *path, tsr_error *err) {
    if (memcmp(hdr, TSR_DATA_MAGIC, 8) != 0)
        return tsr_err(err, TSR_ECORRUPT, "%s: not a tessera data file (bad magic)", path);
    if (tsr_ld64(hdr + 32) != tsr_hash(hdr, 32))
        return tsr_err(err, TSR_ECORRUPT, "%s: data file header checksum mismatch", path);
    if (tsr_ld16(hdr + 8) != TSR_FORMAT_MAJOR)
        return tsr_err(err, TSR_ECORRUPT, "%s: data file format version %u, expected %u", path,
                       tsr_ld16(hdr + 8), TSR_FORMAT_MAJOR);
    if (tsr_ld32(hdr + 12) != file_id)
        return tsr_err(err, TSR_ECORRUPT, "%s: header names file id %u", path, tsr_ld32(hdr + 12));
    if (memcmp(hdr + 16, save_id, 16) != 0)
        return tsr_err(err, TSR_ECORRUPT,
                       "%s: belongs to another save (save id differs from the MANIFEST's)", path);
    for (size_t i = 40; i < TSR_DATA_HEADER_SIZE; i++)
        if (hdr[i])
            return tsr_err(err, TSR_ECORRUPT, "%s: nonzero byte in header padding at offset %zu",
                           path, i);
    return 0;
}
