/* fuzz_manifest.c: libFuzzer target for the MANIFEST parser and validator.
 *
 * Each input is parsed as is (mostly refused by the checksum), then, when it is
 * long enough, as a copy whose file_size field and trailer are made consistent, so
 * that the fuzzer gets past the checksum and explores the section table and the
 * validator. The input's last byte (overwritten by the recomputed trailer) chooses
 * TSR_MF_PARTIAL for that copy. Whatever parses must encode, and the encoding must
 * parse again and re-encode to identical bytes; a whole MANIFEST that parses must
 * also load: its layout within FORMAT.md's limits, and every tensor's boxes
 * computable under that layout and under pp=2 with its n_layers (what "tessera
 * ckpt check --layout pp=2" does). Everything is freed (leaks are reported).
 *
 * Seeds: with TSR_FUZZ_SEEDS=DIR in the environment, LLVMFuzzerInitialize first
 * writes into DIR a few MANIFESTs built in memory with richer structure than
 * "tessera ckpt synth" gives (tensors in several chunks over two files, 0-d, empty
 * and 8-d tensors, placements, ranked blobs), and a few that must be refused (a
 * layer past n_layers, mesh degrees and n_layers of 2^32-1); tests/fuzz.sh uses it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "manifest.h"
#include "tessera.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* m parsed: encode, parse the encoding, encode again: must succeed and agree. */
static void round_trip(const tsr_manifest *m, unsigned flags) {
    tsr_error e = {0};
    uint8_t *a = NULL, *b = NULL;
    size_t an = 0, bn = 0;
    unsigned form = m->n_chunks & 1 ? TSR_MF_PLAIN : 0; /* both forms, packed and plain */
    if (tsr_manifest_encode(m, form, &a, &an, &e) != 0) __builtin_trap();
    tsr_manifest m2;
    if (tsr_manifest_parse(a, an, "fuzz/encoded", flags, &m2, &e) != 0) __builtin_trap();
    if (tsr_manifest_encode(&m2, form, &b, &bn, &e) != 0) __builtin_trap();
    if (an != bn || memcmp(a, b, an) != 0) __builtin_trap();
    if (m2.n_tensors != m->n_tensors || m2.n_chunks != m->n_chunks || m2.n_frames != m->n_frames ||
        m2.n_blobs != m->n_blobs || m2.n_files != m->n_files || m2.step != m->step ||
        memcmp(m2.save_id, m->save_id, 16) != 0)
        __builtin_trap();
    tsr_manifest_free(&m2);
    free(a);
    free(b);
}

/* The boxes of every tensor of m for `rank` under layout l must be computable. */
static void boxes_or_trap(const tsr_manifest *m, const tsr_layout *l, uint32_t rank) {
    tsr_tensor_decl *d = calloc(m->n_tensors + 1, sizeof *d);
    if (!d) return;
    for (size_t i = 0; i < m->n_tensors; i++) {
        const tsr_mf_tensor *t = &m->tensors[i];
        d[i] = (tsr_tensor_decl){t->name, t->group, t->dtype, t->ndim, {0}, t->placement};
        memcpy(d[i].shape, t->shape, sizeof d[i].shape);
    }
    tsr_rank_box *b = NULL;
    size_t nb = 0;
    tsr_error e = {0};
    int rc = tsr_layout_boxes(l, d, m->n_tensors, rank, &b, &nb, &e);
    free(b);
    free(d);
    if (rc && rc != TSR_ENOMEM) {
        fprintf(stderr, "fuzz_manifest: accepted, but loading refuses it: %s\n", e.msg);
        __builtin_trap();
    }
}

/* An accepted MANIFEST loads: the validator refuses whatever loading would. */
static void loadable(const tsr_manifest *m) {
    const tsr_layout *l = &m->layout;
    const uint32_t deg[4] = {l->pp, l->dp_replicate, l->dp_shard, l->tp};
    uint64_t ranks = 1;
    for (int i = 0; i < 4; i++) {
        ranks *= deg[i];
        if (ranks == 0 || ranks > (1ull << 31)) { /* FORMAT.md section 7 */
            fprintf(stderr, "fuzz_manifest: accepted a layout of %u x %u x %u x %u ranks\n", l->pp,
                    l->dp_replicate, l->dp_shard, l->tp);
            __builtin_trap();
        }
    }
    if (l->n_layers > (1u << 31)) {
        fprintf(stderr, "fuzz_manifest: accepted n_layers %u\n", l->n_layers);
        __builtin_trap();
    }
    boxes_or_trap(m, l, 0);
    tsr_layout pp2 = {2, 1, 1, 1, l->n_layers, 0};
    boxes_or_trap(m, &pp2, 0);
    boxes_or_trap(m, &pp2, 1);
}

static void parse_one(const uint8_t *buf, size_t len, unsigned flags) {
    tsr_manifest m;
    tsr_error e = {0};
    int rc = tsr_manifest_parse(buf, len, "fuzz/MANIFEST", flags, &m, &e);
    if (rc == 0) {
        if (!(flags & TSR_MF_PARTIAL)) loadable(&m);
        round_trip(&m, flags);
        tsr_manifest_free(&m);
    } else {
        /* a refusal is ECORRUPT or EVERSION, with a message naming the file */
        if (rc != TSR_ECORRUPT && rc != TSR_EVERSION && rc != TSR_ENOMEM) __builtin_trap();
        if (e.code != rc || strstr(e.msg, "fuzz/MANIFEST") == NULL) __builtin_trap();
    }
}

/* ------------------------------------------------------------------ seeds */

typedef struct gen {
    tsr_manifest m;
    uint64_t pos[2]; /* where the next frame of each data file goes */
    int ok;
} gen;

static void gen_frames(gen *g, uint32_t file, uint64_t raw, size_t frame_bytes, int codec,
                       uint32_t *first, uint32_t *count) {
    (void)frame_bytes;
    tsr_mf_frame f = {.offset = g->pos[file], .raw_size = raw, .codec = codec, .file_id = file};
    f.stored_size = codec == TSR_CODEC_RAW ? raw : raw / 2 + 33;
    if (f.stored_size > raw + 32) f.stored_size = raw + 32;
    f.raw_hash = tsr_hash(&raw, sizeof raw);
    f.stored_hash = ~f.raw_hash;
    g->pos[file] = tsr_align_up(f.offset + f.stored_size, TSR_ALIGN);
    if (*count == 0) *first = (uint32_t)g->m.n_frames;
    (*count)++;
    if (tsr_manifest_add_frame(&g->m, &f)) g->ok = 0;
}

/* A tensor and its chunks (boxes given in sorted order), frames cut the writer's way. */
static void gen_tensor(gen *g, const char *name, const char *group, int dtype, uint32_t ndim,
                       const uint64_t *shape, const tsr_placement *pl, const tsr_box *boxes,
                       const uint32_t *files, size_t n, size_t frame_bytes, int codec) {
    tsr_mf_tensor t = {.name = name, .group = group, .dtype = dtype, .ndim = ndim};
    for (uint32_t d = 0; d < ndim; d++) t.shape[d] = shape[d];
    t.placement = pl ? *pl : (tsr_placement){-1, 0, TSR_PP_ALL, -1};
    t.chunk_first = (uint32_t)g->m.n_chunks;
    t.chunk_count = (uint32_t)n;
    if (tsr_manifest_add_tensor(&g->m, &t)) g->ok = 0;
    size_t es = tsr_dtype_size(dtype);
    uint32_t tensor = (uint32_t)(g->m.n_tensors - 1);
    for (size_t i = 0; i < n; i++) {
        tsr_mf_chunk c = {.tensor = tensor, .file_id = files[i], .box = boxes[i]};
        c.box.ndim = ndim;
        tsr_frame_geometry(&c.box, es, frame_bytes, &c.split_dim, &c.frame_rows);
        uint64_t nf = tsr_frame_count(&c.box, c.split_dim, c.frame_rows);
        for (uint64_t k = 0; k < nf; k++) {
            tsr_box fb;
            tsr_frame_box(&c, k, &fb);
            gen_frames(g, files[i], tsr_box_volume(&fb) * es, frame_bytes, codec, &c.frame_first,
                       &c.frame_count);
        }
        if (tsr_manifest_add_chunk(&g->m, &c)) g->ok = 0;
    }
}

static void gen_blob(gen *g, const char *name, int32_t rank, uint32_t file, uint64_t size,
                     size_t frame_bytes, int codec) {
    tsr_mf_blob b = {.name = name, .rank = rank, .file_id = file, .size = size};
    b.frame_first = (uint32_t)g->m.n_frames;
    for (uint64_t off = 0; off < size; off += frame_bytes)
        gen_frames(g, file, size - off < frame_bytes ? size - off : frame_bytes, frame_bytes, codec,
                   &b.frame_first, &b.frame_count);
    if (tsr_manifest_add_blob(&g->m, &b)) g->ok = 0;
}

#define BOX2(o0, o1, e0, e1) {.ndim = 2, .offset = {o0, o1}, .extent = {e0, e1}}

/* Writes the seed; a hostile one (which readers must refuse) is not validated. */
static void gen_write(gen *g, const char *dir, const char *name, int hostile) {
    for (uint32_t f = 0; f < 2; f++) {
        tsr_mf_file file = {f, g->pos[f]};
        if (tsr_manifest_add_file(&g->m, &file)) g->ok = 0;
    }
    tsr_error e = {0};
    uint8_t *buf = NULL;
    size_t len = 0;
    if (!g->ok || (!hostile && tsr_manifest_validate(&g->m, name, 0, &e)) ||
        tsr_manifest_encode(&g->m, hostile ? TSR_MF_PLAIN : 0, &buf, &len, &e)) {
        fprintf(stderr, "fuzz_manifest: seed %s not written: %s\n", name, g->ok ? e.msg : "out of memory");
    } else {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, name);
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(buf, 1, len, f) != len) fprintf(stderr, "fuzz_manifest: cannot write %s\n", path);
        if (f) fclose(f);
    }
    free(buf);
    tsr_manifest_free(&g->m);
}

static void gen_init(gen *g, uint64_t step) {
    tsr_manifest_init(&g->m);
    g->pos[0] = g->pos[1] = TSR_DATA_HEADER_SIZE;
    g->ok = 1;
    g->m.step = step;
    for (int i = 0; i < 16; i++) g->m.save_id[i] = (uint8_t)(step * 31 + (uint64_t)i);
}

static void write_seeds(const char *dir) {
    gen g;
    /* variants 3-5: variant 2 made hostile */
    static const char *const hostile[6] = {NULL, NULL, NULL, "hostile-layer-2^31-1", "hostile-degrees-2^32-1",
                                           "hostile-n_layers-2^32-1"};
    for (int variant = 0; variant < 6; variant++) {
        int v2 = variant >= 2;
        gen_init(&g, 100 + (uint64_t)variant);
        int bg = variant == 1 ? TSR_CODEC_RAW : TSR_CODEC_BYTEGROUP;
        if (v2) g.m.layout = (tsr_layout){2, 2, 4, 2, 12, TSR_LAYOUT_FLAT};
        if (variant == 4) g.m.layout = (tsr_layout){UINT32_MAX, UINT32_MAX, UINT32_MAX, UINT32_MAX, 12, 0};
        if (variant == 5) g.m.layout.n_layers = UINT32_MAX;
        uint64_t s2[2] = {64, 48};
        tsr_box grid[4] = {BOX2(0, 0, 32, 24), BOX2(0, 24, 32, 24), BOX2(32, 0, 32, 24), BOX2(32, 24, 32, 24)};
        uint32_t gf[4] = {0, 1, 0, 1};
        tsr_placement tp = {v2 ? 1 : -1, v2, v2 ? TSR_PP_LAYER : TSR_PP_ALL,
                            variant == 3 ? INT32_MAX : v2 ? 3 : -1};
        gen_tensor(&g, "a.grid", "model", TSR_F32, 2, s2, &tp, grid, gf, 4, 1024, bg);
        uint64_t s1[1] = {3000};
        tsr_box b1 = {.ndim = 1, .extent = {3000}};
        uint32_t f0[2] = {0, 0}, f1[2] = {1, 1};
        gen_tensor(&g, "b.ids", "model", TSR_I32, 1, s1, NULL, &b1, f0, 1, 4096, TSR_CODEC_ZSTD);
        tsr_box b0 = {.ndim = 0};
        gen_tensor(&g, "c.step", "optim", TSR_I64, 0, NULL, NULL, &b0, f1, 1, 4096, TSR_CODEC_RAW);
        uint64_t se[2] = {0, 16};
        gen_tensor(&g, "d.empty", "optim", TSR_F32, 2, se, NULL, NULL, NULL, 0, 4096, TSR_CODEC_RAW);
        uint64_t s3[3] = {2, 64, 40};
        tsr_box h[2] = {{.ndim = 3, .offset = {0, 0, 0}, .extent = {1, 64, 40}},
                        {.ndim = 3, .offset = {1, 0, 0}, .extent = {1, 64, 40}}};
        gen_tensor(&g, "e.h", "model", TSR_BF16, 3, s3, NULL, h, gf, 2, 2048, bg);
        uint64_t s8[8] = {2, 1, 2, 1, 2, 1, 2, 3};
        tsr_box b8[2] = {{.ndim = 8, .offset = {0}, .extent = {1, 1, 2, 1, 2, 1, 2, 3}},
                         {.ndim = 8, .offset = {1}, .extent = {1, 1, 2, 1, 2, 1, 2, 3}}};
        gen_tensor(&g, "f.8d", "model", TSR_U8, 8, s8, NULL, b8, gf, 2, 8, TSR_CODEC_RAW);
        if (v2) { /* many small tensors */
            for (int i = 0; i < 40; i++) {
                char name[32];
                snprintf(name, sizeof name, "g.layers.%02d.w", i);
                uint64_t sh[2] = {8, 8 + (uint64_t)i};
                tsr_box two[2] = {BOX2(0, 0, 4, 8 + (uint64_t)i), BOX2(4, 0, 4, 8 + (uint64_t)i)};
                if (i % 2 == 0) two[0].extent[0] = 8; /* one chunk: the whole tensor */
                tsr_placement lp = {0, 0, TSR_PP_LAYER, i % 12};
                gen_tensor(&g, name, i % 2 ? "optim" : "model", i % 3 ? TSR_BF16 : TSR_F16, 2, sh, &lp,
                           two, gf, 1 + (size_t)(i % 2), 64, TSR_CODEC_BYTEGROUP);
            }
        }
        gen_blob(&g, "cfg", -1, 0, 100, 4096, TSR_CODEC_ZSTD);
        gen_blob(&g, "rng", 0, 1, 5000, 4096, TSR_CODEC_RAW);
        gen_blob(&g, "rng", 1, 1, 0, 4096, TSR_CODEC_RAW);
        char name[32];
        snprintf(name, sizeof name, "generated-%d", variant);
        gen_write(&g, dir, hostile[variant] ? hostile[variant] : name, hostile[variant] != NULL);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *dir = getenv("TSR_FUZZ_SEEDS");
    if (dir && *dir) write_seeds(dir);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* an exact-size copy: ASan sees any read past the end */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    if (size) memcpy(buf, data, size);
    parse_one(buf, size, 0);
    if (size >= TSR_MF_HEADER_SIZE + 8) {
        unsigned flags = (data[size - 1] & 1) ? TSR_MF_PARTIAL : 0;
        tsr_st64(buf + 16, size);
        tsr_st64(buf + size - 8, tsr_hash(buf, size - 8));
        parse_one(buf, size, flags);
    }
    free(buf);
    return 0;
}
