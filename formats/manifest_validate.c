/* manifest_validate.c: every rule of FORMAT.md section 4 that concerns the records
 * of a MANIFEST: names, order, ranges, geometry, coverage, packing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "manifest.h"
#include "manifest_impl.h"

static const tsr_mf_file *find_file(const tsr_manifest *m, uint32_t id) {
    size_t lo = 0, hi = m->n_files;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (m->files[mid].id < id) lo = mid + 1;
        else hi = mid;
    }
    return lo < m->n_files && m->files[lo].id == id ? &m->files[lo] : NULL;
}

/* Checks that the chunks [first, first+n) of tensor t do not overlap: a sweep
 * along the dim with the most distinct chunk offsets, comparing each chunk only
 * with the chunks still open along that dim. */
typedef struct sweep_item {
    uint64_t lo, hi;
    uint32_t chunk;
} sweep_item;
static int cmp_sweep(const void *pa, const void *pb) {
    const sweep_item *a = pa, *b = pb;
    return (a->lo > b->lo) - (a->lo < b->lo);
}
static int cmp_u64(const void *pa, const void *pb) {
    uint64_t a = *(const uint64_t *)pa, b = *(const uint64_t *)pb;
    return (a > b) - (a < b);
}

static int check_overlap(const tsr_manifest *m, const tsr_mf_tensor *t, const char *path,
                         tsr_error *err) {
    size_t n = t->chunk_count;
    if (n < 2 || t->ndim == 0) return n < 2 ? 0 : BAD("%s: tensor %s: 0-d tensor with %zu chunks", path, t->name, n);
    const tsr_mf_chunk *cs = m->chunks + t->chunk_first;
    uint64_t *tmp = malloc(n * sizeof *tmp);
    sweep_item *items = malloc(n * sizeof *items);
    uint32_t *open = malloc(n * sizeof *open);
    int rc = 0;
    if (!tmp || !items || !open) {
        rc = tsr_err(err, TSR_ENOMEM, "out of memory");
        goto out;
    }
    uint32_t best = 0;
    size_t best_distinct = 0;
    for (uint32_t d = 0; d < t->ndim; d++) {
        for (size_t i = 0; i < n; i++) tmp[i] = cs[i].box.offset[d];
        tsr_sort(tmp, n, sizeof *tmp, cmp_u64);
        size_t distinct = 1;
        for (size_t i = 1; i < n; i++) distinct += tmp[i] != tmp[i - 1];
        if (distinct > best_distinct) best_distinct = distinct, best = d;
    }
    for (size_t i = 0; i < n; i++)
        items[i] = (sweep_item){cs[i].box.offset[best], cs[i].box.offset[best] + cs[i].box.extent[best],
                                (uint32_t)i};
    tsr_sort(items, n, sizeof *items, cmp_sweep);
    size_t nopen = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        size_t keep = 0;
        for (size_t j = 0; j < nopen; j++) {
            const sweep_item *o = &items[open[j]];
            if (o->hi <= items[i].lo) continue; /* closed */
            open[keep++] = open[j];
            tsr_box x;
            if (tsr_box_intersect(&cs[o->chunk].box, &cs[items[i].chunk].box, &x)) {
                rc = BAD("%s: tensor %s: chunks %u and %u overlap", path, t->name,
                         t->chunk_first + o->chunk, t->chunk_first + items[i].chunk);
                break;
            }
        }
        nopen = keep;
        open[nopen++] = (uint32_t)i;
    }
out:
    free(tmp), free(items), free(open);
    return rc;
}

/* The tensor or blob that frame fi belongs to, once frame ranges are known to be
 * consecutive (chunks, then blobs). */
static const char *frame_owner(const tsr_manifest *m, size_t fi) {
    size_t lo = 0, hi = m->n_chunks;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (m->chunks[mid].frame_first + (size_t)m->chunks[mid].frame_count <= fi) lo = mid + 1;
        else hi = mid;
    }
    if (lo < m->n_chunks && m->chunks[lo].frame_first <= fi) return m->tensors[m->chunks[lo].tensor].name;
    for (size_t b = 0; b < m->n_blobs; b++)
        if (fi >= m->blobs[b].frame_first && fi < (size_t)m->blobs[b].frame_first + m->blobs[b].frame_count)
            return m->blobs[b].name;
    return "?";
}

const char *tsr_layout_problem(const tsr_layout *l, char *buf, size_t len) {
    static const char *const names[4] = {"pp", "dp_replicate", "dp_shard", "tp"};
    const uint32_t deg[4] = {l->pp, l->dp_replicate, l->dp_shard, l->tp};
    uint64_t ranks = 1;
    for (int i = 0; i < 4; i++) {
        if (deg[i] == 0) {
            snprintf(buf, len, "mesh degree %s is 0", names[i]);
            return buf;
        }
        ranks *= deg[i]; /* < 2^31 * 2^32 before the check below: no overflow */
        if (ranks > TSR_MAX_RANKS) {
            snprintf(buf, len, "mesh degrees pp=%u dp_replicate=%u dp_shard=%u tp=%u make over %u ranks "
                     "(the limit: a rank is an i32)", l->pp, l->dp_replicate, l->dp_shard, l->tp,
                     TSR_MAX_RANKS);
            return buf;
        }
    }
    if (l->n_layers > TSR_MAX_LAYERS) {
        snprintf(buf, len, "n_layers %u over the limit of %u (a layer is an i32)", l->n_layers, TSR_MAX_LAYERS);
        return buf;
    }
    return NULL;
}


/* Files: sorted by id, each of a possible size. */
static int check_files(const tsr_manifest *m, const char *path, tsr_error *err) {
    for (size_t i = 0; i < m->n_files; i++) {
        const tsr_mf_file *f = &m->files[i];
        if (i && f->id <= m->files[i - 1].id) return BAD("%s: files not sorted by id or id %u repeated", path, f->id);
        if (f->size < TSR_DATA_HEADER_SIZE || f->size % TSR_ALIGN || f->size > TSR_MAX_FILE_SIZE)
            return BAD("%s: data file %u: bad size %llu", path, f->id, (unsigned long long)f->size);
    }
    return 0;
}

/* Tensors: names, order, dtype, size, placement, and chunk ranges that follow
 * each other and cover the chunk table. */
static int check_tensors(const tsr_manifest *m, const char *path, unsigned flags, tsr_error *err) {
    uint64_t next_chunk = 0;
    for (size_t i = 0; i < m->n_tensors; i++) {
        const tsr_mf_tensor *t = &m->tensors[i];
        size_t es = tsr_dtype_size(t->dtype);
        if (!tsr_name_valid(t->name, strlen(t->name)))
            return BAD("%s: tensor %zu: invalid name \"%.64s\"", path, i, t->name);
        if (!tsr_name_valid(t->group, strlen(t->group))) return BAD("%s: tensor %s: invalid group name", path, t->name);
        if (i && strcmp(m->tensors[i - 1].name, t->name) >= 0)
            return BAD("%s: tensor %s: names not sorted or repeated", path, t->name);
        if (!es) return BAD("%s: tensor %s: unknown dtype %d", path, t->name, t->dtype);
        if (t->ndim > TSR_MAX_DIMS) return BAD("%s: tensor %s: too many dims", path, t->name);
        uint64_t vol = 1;
        for (uint32_t d = 0; d < t->ndim; d++)
            if (tsr_mul_ovf(vol, t->shape[d], &vol)) return BAD("%s: tensor %s: volume overflows", path, t->name);
        if (tsr_mul_ovf(vol, es, &vol) || vol > (1ull << 62))
            return BAD("%s: tensor %s: over 2^62 bytes", path, t->name);
        const tsr_placement *pl = &t->placement;
        if (pl->tp_dim < -1 || pl->tp_dim >= (int)t->ndim || pl->fsdp > 1 || pl->pp_role > 3 ||
            (pl->pp_role == TSR_PP_LAYER ? pl->layer < 0 : pl->layer != -1))
            return BAD("%s: tensor %s: placement out of range", path, t->name);
        /* A writer's table does not know the layout yet; the MANIFEST does. */
        if (!(flags & TSR_MF_PARTIAL) && pl->pp_role == TSR_PP_LAYER && (uint32_t)pl->layer >= m->layout.n_layers)
            return BAD("%s: tensor %s: placement layer %d out of range: the layout has n_layers %u", path, t->name,
                       (int)pl->layer, m->layout.n_layers);
        /* the statistics (4.5): counts within the volume; a non-finite element poisons the checkpoint */
        if ((t->digest_flags & TSR_MF_STATS) && t->stats.nonfinite > vol / es)
            return BAD("%s: tensor %s: %llu non-finite elements, over its %llu", path, t->name,
                       (unsigned long long)t->stats.nonfinite, (unsigned long long)(vol / es));
        if (!(flags & TSR_MF_PARTIAL) && (t->digest_flags & TSR_MF_STATS) && t->stats.nonfinite &&
            !(m->flags & TSR_MF_POISONED))
            return BAD("%s: tensor %s: %llu non-finite elements, but the header does not mark the checkpoint "
                       "poisoned", path, t->name, (unsigned long long)t->stats.nonfinite);
        if (t->chunk_first != next_chunk)
            return BAD("%s: tensor %s: chunk range does not follow the previous tensor's", path, t->name);
        next_chunk += t->chunk_count;
        if (next_chunk > m->n_chunks) return BAD("%s: tensor %s: chunk range past the chunk table", path, t->name);
    }
    if (next_chunk != m->n_chunks)
        return BAD("%s: %llu chunks belong to no tensor", path, (unsigned long long)(m->n_chunks - next_chunk));
    return 0;
}

/* The frames of chunk ci of tensor t: raw sizes from the geometry, codecs the
 * dtype allows; each learns its file. */
static int check_chunk_frames(tsr_manifest *m, const tsr_mf_tensor *t, uint32_t ci, const char *path,
                              tsr_error *err) {
    const tsr_mf_chunk *c = &m->chunks[ci];
    size_t es = tsr_dtype_size(t->dtype);
    for (uint32_t k = 0; k < c->frame_count; k++) {
        tsr_box fb;
        tsr_frame_box(c, k, &fb);
        tsr_mf_frame *f = &m->frames[c->frame_first + k];
        uint64_t raw = tsr_box_volume(&fb) * es;
        if (f->raw_size != raw)
            return BAD("%s: frame %u of %s: raw size %llu, its box holds %llu bytes", path, k, t->name,
                       (unsigned long long)f->raw_size, (unsigned long long)raw);
        if (f->codec != TSR_CODEC_RAW && f->codec != TSR_CODEC_ZSTD &&
            !(f->codec == TSR_CODEC_BYTEGROUP && (t->dtype == TSR_F32 || t->dtype == TSR_F16 || t->dtype == TSR_BF16)))
            return BAD("%s: frame %u of %s: codec %d not allowed for %s", path, k, t->name, f->codec,
                       tsr_dtype_name(t->dtype));
        f->file_id = c->file_id;
    }
    return 0;
}

/* Chunk ci of tensor t_i: its tensor, file, box, order, frame geometry and frame
 * range (which must start at *next_frame; moved past it). *covered grows by its
 * volume, up to vol. */
static int check_chunk(tsr_manifest *m, size_t t_i, uint32_t ci, uint64_t vol, uint64_t *covered,
                       uint64_t *next_frame, const char *path, tsr_error *err) {
    const tsr_mf_tensor *t = &m->tensors[t_i];
    const tsr_mf_chunk *c = &m->chunks[ci];
    if (c->tensor != t_i)
        return BAD("%s: chunk %u is in tensor %s's range but names tensor %u", path, ci, t->name, c->tensor);
    if (c->box.ndim != t->ndim) return BAD("%s: chunk %u of %s: box has %u dims", path, ci, t->name, c->box.ndim);
    if (!find_file(m, c->file_id)) return BAD("%s: chunk %u of %s: unknown data file %u", path, ci, t->name, c->file_id);
    for (uint32_t d = 0; d < t->ndim; d++) {
        uint64_t end;
        if (tsr_add_ovf(c->box.offset[d], c->box.extent[d], &end) || end > t->shape[d])
            return BAD("%s: chunk %u of %s: box outside the tensor's shape in dim %u", path, ci, t->name, d);
    }
    uint64_t cvol = tsr_box_volume(&c->box);
    if (cvol == 0) return BAD("%s: chunk %u of %s: empty box", path, ci, t->name);
    *covered += cvol; /* each term <= vol <= 2^62: no overflow before the check */
    if (*covered > vol)
        return BAD("%s: tensor %s: chunks hold more elements than the tensor (overlap)", path, t->name);
    if (ci > t->chunk_first && tsr_mf_cmp_box_offset(&m->chunks[ci - 1].box, &c->box) >= 0)
        return BAD("%s: chunk %u of %s: chunks not sorted by offset", path, ci, t->name);
    uint64_t nf = tsr_frame_count(&c->box, c->split_dim, c->frame_rows);
    if (nf == UINT64_MAX || nf != c->frame_count)
        return BAD("%s: chunk %u of %s: frame geometry (split dim %u, %llu rows) gives %llu frames, record says %u",
                   path, ci, t->name, c->split_dim, (unsigned long long)c->frame_rows, (unsigned long long)nf,
                   c->frame_count);
    if (c->frame_first != *next_frame)
        return BAD("%s: chunk %u of %s: frame range does not follow the previous one", path, ci, t->name);
    *next_frame += c->frame_count;
    if (*next_frame > m->n_frames)
        return BAD("%s: chunk %u of %s: frame range past the frame table", path, ci, t->name);
    return check_chunk_frames(m, t, ci, path, err);
}

/* Every tensor's chunks: each sound, together covering the tensor (unless
 * partial) without overlapping. */
static int check_chunks(tsr_manifest *m, const char *path, unsigned flags, uint64_t *next_frame, tsr_error *err) {
    for (size_t t_i = 0; t_i < m->n_tensors; t_i++) {
        const tsr_mf_tensor *t = &m->tensors[t_i];
        uint64_t covered = 0, vol = 1;
        for (uint32_t d = 0; d < t->ndim; d++) vol *= t->shape[d];
        for (uint32_t ci = t->chunk_first; ci < t->chunk_first + t->chunk_count; ci++) {
            int rc = check_chunk(m, t_i, ci, vol, &covered, next_frame, path, err);
            if (rc) return rc;
        }
        if (!(flags & TSR_MF_PARTIAL) && covered != vol)
            return BAD("%s: tensor %s: chunks hold %llu of its %llu elements", path, t->name,
                       (unsigned long long)covered, (unsigned long long)vol);
        int rc = check_overlap(m, t, path, err);
        if (rc) return rc;
    }
    return 0;
}

/* Blobs: names, order, rank, file, frame ranges after the chunks', codecs, size. */
static int check_blobs(tsr_manifest *m, const char *path, uint64_t *next_frame, tsr_error *err) {
    for (size_t i = 0; i < m->n_blobs; i++) {
        const tsr_mf_blob *b = &m->blobs[i];
        if (!tsr_name_valid(b->name, strlen(b->name))) return BAD("%s: blob %zu: invalid name", path, i);
        if (i && tsr_mf_cmp_blob(&m->blobs[i - 1], b) >= 0)
            return BAD("%s: blob %s (rank %d): blobs not sorted or repeated", path, b->name, b->rank);
        if (b->rank < -1) return BAD("%s: blob %s: rank %d", path, b->name, b->rank);
        if (!find_file(m, b->file_id)) return BAD("%s: blob %s: unknown data file %u", path, b->name, b->file_id);
        if (b->frame_first != *next_frame)
            return BAD("%s: blob %s: frame range does not follow the previous one", path, b->name);
        *next_frame += b->frame_count;
        if (*next_frame > m->n_frames) return BAD("%s: blob %s: frame range past the frame table", path, b->name);
        uint64_t sum = 0;
        for (uint32_t k = 0; k < b->frame_count; k++) {
            tsr_mf_frame *f = &m->frames[b->frame_first + k];
            if (f->codec != TSR_CODEC_RAW && f->codec != TSR_CODEC_ZSTD)
                return BAD("%s: blob %s: frame %u: codec %d not allowed for a blob", path, b->name, k, f->codec);
            if (tsr_add_ovf(sum, f->raw_size, &sum)) return BAD("%s: blob %s: size overflows", path, b->name);
            f->file_id = b->file_id;
        }
        if (sum != b->size)
            return BAD("%s: blob %s: frames hold %llu bytes, record says %llu", path, b->name, (unsigned long long)sum,
                       (unsigned long long)b->size);
    }
    return 0;
}

/* Every frame's raw and stored sizes within their limits. */
static int check_frame_sizes(const tsr_manifest *m, const char *path, tsr_error *err) {
    for (size_t i = 0; i < m->n_frames; i++) {
        const tsr_mf_frame *f = &m->frames[i];
        if (f->raw_size == 0 || f->raw_size > TSR_MAX_FRAME_RAW)
            return BAD("%s: frame %zu of %s: raw size %llu out of range", path, i, frame_owner(m, i),
                       (unsigned long long)f->raw_size);
        if (f->codec == TSR_CODEC_RAW && f->stored_size != f->raw_size)
            return BAD("%s: frame %zu of %s: raw frame with stored size %llu != raw size %llu", path, i,
                       frame_owner(m, i), (unsigned long long)f->stored_size, (unsigned long long)f->raw_size);
        if (f->stored_size == 0 || f->stored_size > TSR_MAX_STORED(f->raw_size))
            return BAD("%s: frame %zu of %s: stored size %llu out of range", path, i, frame_owner(m, i),
                       (unsigned long long)f->stored_size);
    }
    return 0;
}

/* Packing: in each file, frames sorted by offset follow the header and each
 * other (each padded to TSR_ALIGN) and end where the file does. */
static int check_packing(const tsr_manifest *m, const char *path, tsr_error *err) {
    uint32_t *ord = malloc((m->n_frames + 1) * sizeof *ord);
    uint64_t *ends = malloc((m->n_files + 1) * sizeof *ends); /* where file i's frames end so far */
    if (!ord || !ends) {
        free(ord), free(ends);
        return tsr_err(err, TSR_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < m->n_frames; i++) ord[i] = (uint32_t)i;
    tsr_sort_ctx(ord, m->n_frames, sizeof *ord, tsr_mf_cmp_frame_pos, (void *)m);
    for (size_t i = 0; i < m->n_files; i++) ends[i] = TSR_DATA_HEADER_SIZE;
    int rc = 0;
    for (size_t i = 0; i < m->n_frames && !rc; i++) {
        const tsr_mf_frame *f = &m->frames[ord[i]];
        size_t fi = (size_t)(find_file(m, f->file_id) - m->files);
        if (f->offset != ends[fi])
            rc = BAD("%s: frame %u of %s in data file %u at offset %llu, expected %llu (frames must be packed)", path,
                     ord[i], frame_owner(m, ord[i]), f->file_id, (unsigned long long)f->offset,
                     (unsigned long long)ends[fi]);
        else if (f->stored_size > TSR_MAX_FILE_SIZE - f->offset)
            rc = BAD("%s: frame %u of %s: stored size too large", path, ord[i], frame_owner(m, ord[i]));
        else ends[fi] = tsr_align_up(f->offset + f->stored_size, TSR_ALIGN);
    }
    for (size_t i = 0; i < m->n_files && !rc; i++)
        if (m->files[i].size != ends[i])
            rc = BAD("%s: data file %u: size %llu, its frames end at %llu", path, m->files[i].id,
                     (unsigned long long)m->files[i].size, (unsigned long long)ends[i]);
    free(ends);
    free(ord);
    return rc;
}

int tsr_manifest_validate(tsr_manifest *m, const char *path, unsigned flags, tsr_error *err) {
    if (m->version_major != TSR_FORMAT_MAJOR)
        return tsr_err(err, TSR_EVERSION, "%s: format version %u", path, m->version_major);
    char why[200];
    if (tsr_layout_problem(&m->layout, why, sizeof why)) return BAD("%s: layout: %s", path, why);
    if (m->n_tensors > UINT32_MAX || m->n_chunks > UINT32_MAX || m->n_frames > UINT32_MAX ||
        m->n_blobs > UINT32_MAX || m->n_files > UINT32_MAX)
        return BAD("%s: too many records", path);
    uint64_t next_frame = 0; /* frames belong to chunks in order, then to blobs */
    int rc = check_files(m, path, err);
    if (!rc) rc = check_tensors(m, path, flags, err);
    if (!rc) rc = check_chunks(m, path, flags, &next_frame, err);
    if (!rc) rc = check_blobs(m, path, &next_frame, err);
    if (!rc && next_frame != m->n_frames)
        rc = BAD("%s: %llu frames belong to no chunk or blob", path, (unsigned long long)(m->n_frames - next_frame));
    if (!rc) rc = check_frame_sizes(m, path, err);
    if (!rc) rc = check_packing(m, path, err);
    return rc;
}
