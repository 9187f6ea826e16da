/* test_testdata.c: the committed test vector formats/testdata (FORMAT.md section
 * 12) read with tessera's reader: every file has the size and XXH3 that
 * expected.txt lists (so a changed byte anywhere fails), the checkpoint verifies,
 * and every element of every tensor and every byte of every blob equals
 * expected.txt's. The vector must still exercise what it is for: the codecs raw,
 * zstd and bytegroup, a tensor in chunks of two data files, blobs. Then each file
 * with one byte flipped (a header, a frame, padding) must fail the same check.
 *
 * `test_testdata --generate OUT` writes a fresh vector: OUT/step-00000007 and
 * OUT/expected.txt (the MANIFEST's commit time differs on every run, zstd's
 * output may differ between versions: the committed bytes are the reference). */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "casts.h"
#include "check.h"
#include "common.h"

#define STEP 7
#define STEP_DIR "step-00000007"
#define MAX_FILES 8

/* ------------------------------------------------------------ the vector */

typedef struct vtensor {
    const char *name, *group;
    int dtype;
    uint32_t ndim;
    uint64_t shape[3];
    tsr_placement pl;
} vtensor;

enum { T_W, T_EMB, T_POS, T_MASK, T_SCALE, N_T };
static const vtensor VT[N_T] = {
    {"layers.0.w", "model", TSR_F32, 2, {16, 24}, {0, 1, TSR_PP_LAYER, 0}},
    {"emb.bf16", "model", TSR_BF16, 3, {4, 2, 64}, {1, 0, TSR_PP_FIRST, -1}},
    {"pos.i64", "optim", TSR_I64, 1, {32}, {-1, 1, TSR_PP_ALL, -1}},
    {"mask.u8", "model", TSR_U8, 2, {3, 40}, {-1, 0, TSR_PP_ALL, -1}},
    {"scale", "model", TSR_F32, 0, {0}, {-1, 0, TSR_PP_LAST, -1}},
};

/* Element i (row-major) of tensor t: every value is exact in its dtype. */
static double value(int t, uint64_t i) {
    long long k = (long long)i;
    switch (t) {
    case T_W: return (double)(k - 100) / 8.0;
    case T_EMB: return (double)((k * 5) % 33 - 16) / 4.0;
    case T_POS: return (double)((k * k * 1000 - 7) * (k % 2 ? -1 : 1));
    case T_MASK: return (double)((k * 7) % 5 < 2);
    default: return 0.5;
    }
}

/* The blob "note": a line of text padded with spaces to 512 bytes (so that zstd
 * gains enough to be used). */
#define NOTE_SIZE 512
static const char *note(void) {
    static char b[NOTE_SIZE];
    static const char text[] = "tessera test vector: a global blob stored as a zstd frame";
    memset(b, ' ', sizeof b);
    memcpy(b, text, sizeof text - 1);
    b[NOTE_SIZE - 1] = '\n';
    return b;
}
static const uint8_t RNG_BLOB[16] = {0x3a, 0x91, 0x07, 0xee, 0x52, 0x10, 0xc4, 0x7b,
                                     0x00, 0xff, 0x81, 0x26, 0x9d, 0x44, 0xe3, 0x18};

static uint64_t volume(const vtensor *t) {
    uint64_t v = 1;
    for (uint32_t d = 0; d < t->ndim; d++) v *= t->shape[d];
    return v;
}

/* The tensor's elements in its dtype, malloc'ed. */
static void *make_data(int t) {
    const vtensor *v = &VT[t];
    uint64_t n = volume(v);
    uint8_t *b = malloc(n * tsr_dtype_size(v->dtype));
    for (uint64_t i = 0; i < n; i++) {
        double x = value(t, i);
        if (v->dtype == TSR_F32) {
            float f = (float)x;
            memcpy(b + 4 * i, &f, 4);
        } else if (v->dtype == TSR_BF16) {
            tsr_st16(b + 2 * i, tsr_f32_to_bf16((float)x));
        } else if (v->dtype == TSR_I64) {
            tsr_st64(b + 8 * i, (uint64_t)(int64_t)x);
        } else {
            b[i] = (uint8_t)x;
        }
    }
    return b;
}

static tsr_box whole(const vtensor *t) {
    tsr_box b = {t->ndim, {0}, {0}};
    for (uint32_t d = 0; d < t->ndim; d++) b.extent[d] = t->shape[d];
    return b;
}

static int declare(tsr_save *s, int t, tsr_error *e) {
    const vtensor *v = &VT[t];
    return tsr_save_tensor(s, v->name, v->group, v->dtype, v->ndim, v->shape, &v->pl, e);
}

static int write_expected(const char *out, const char *ckdir);

/* Three writers into OUT/step-00000007: file 0 raw (frames of at most 384
 * bytes), file 1 zstd, file 2 bytegroup (frames of at most 1024 bytes). */
static int generate(const char *out) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/%s", out, STEP_DIR);
    static const uint8_t save_id[16] = "tessera-vector-1";
    tsr_error e = {0};
    tsr_save *s[3] = {0};
    int codecs[3] = {TSR_CODEC_RAW, TSR_CODEC_ZSTD, TSR_CODEC_BYTEGROUP};
    size_t frames[3] = {384, 4096, 1024};
    void *data[N_T];
    for (int t = 0; t < N_T; t++) data[t] = make_data(t);
    int rc = 0;
    for (int w = 0; w < 3 && !rc; w++) {
        tsr_write_opts o = tsr_write_opts_default();
        o.codec = codecs[w];
        o.frame_bytes = frames[w];
        o.threads = 1;
        if (!(s[w] = tsr_save_begin(dir, (uint32_t)w, save_id, &o, &e))) rc = e.code ? e.code : -1;
    }
    const vtensor *wt = &VT[T_W];
    tsr_box top = whole(wt), bottom = whole(wt);
    top.extent[0] = 8;
    bottom.offset[0] = 8, bottom.extent[0] = 8;
    const float *w = data[T_W];
    uint64_t step_le = STEP; /* little-endian hosts only write vectors */
    if (!rc) rc = declare(s[0], T_W, &e);
    if (!rc) rc = declare(s[0], T_SCALE, &e);
    if (!rc) rc = tsr_save_box(s[0], wt->name, &top, w, &e);
    tsr_box sc = whole(&VT[T_SCALE]);
    if (!rc) rc = tsr_save_box(s[0], VT[T_SCALE].name, &sc, data[T_SCALE], &e);
    if (!rc) rc = declare(s[1], T_POS, &e);
    if (!rc) rc = declare(s[1], T_MASK, &e);
    tsr_box bp = whole(&VT[T_POS]), bm = whole(&VT[T_MASK]);
    if (!rc) rc = tsr_save_box(s[1], VT[T_POS].name, &bp, data[T_POS], &e);
    if (!rc) rc = tsr_save_box(s[1], VT[T_MASK].name, &bm, data[T_MASK], &e);
    if (!rc) rc = tsr_save_blob(s[1], "note", -1, note(), NOTE_SIZE, &e);
    if (!rc) rc = tsr_save_blob(s[1], "rng", 1, RNG_BLOB, sizeof RNG_BLOB, &e);
    if (!rc) rc = declare(s[2], T_W, &e);
    if (!rc) rc = declare(s[2], T_EMB, &e);
    if (!rc) rc = tsr_save_box(s[2], wt->name, &bottom, w + 8 * 24, &e);
    tsr_box be = whole(&VT[T_EMB]);
    if (!rc) rc = tsr_save_box(s[2], VT[T_EMB].name, &be, data[T_EMB], &e);
    if (!rc) rc = tsr_save_blob(s[2], "train.step", -1, &step_le, 8, &e);
    const uint8_t *tables[3];
    size_t lens[3];
    for (int w2 = 0; w2 < 3 && !rc; w2++) rc = tsr_save_finish(s[w2], &tables[w2], &lens[w2], &e);
    tsr_layout l = {1, 1, 2, 1, 2, 0};
    if (!rc) rc = tsr_save_commit(s[0], tables, lens, 3, STEP, &l, &e);
    for (int w2 = 0; w2 < 3; w2++) {
        if (rc && s[w2]) tsr_save_abort(s[w2]);
        tsr_save_free(s[w2]);
    }
    for (int t = 0; t < N_T; t++) free(data[t]);
    if (rc) {
        fprintf(stderr, "generate %s: %s\n", dir, e.msg);
        return 1;
    }
    return write_expected(out, dir);
}

/* ------------------------------------------------------------ files */

static uint8_t *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    uint8_t *b = malloc(cap + 1);
    size_t r;
    while ((r = fread(b + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) b = realloc(b, (cap *= 2) + 1);
    }
    fclose(f);
    b[n] = 0;
    *len = n;
    return b;
}

static const char *const FILE_NAMES[] = {"MANIFEST", "data-00000.tsd", "data-00001.tsd", "data-00002.tsd"};
#define N_FILES (sizeof FILE_NAMES / sizeof *FILE_NAMES)

static int write_expected(const char *out, const char *ckdir) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/expected.txt", out);
    FILE *f = fopen(path, "w");
    if (!f) return fprintf(stderr, "%s: %s\n", path, strerror(errno)), 1;
    fprintf(f, "# The contents of the test vector step-00000007 beside this file (FORMAT.md section 12).\n"
               "# file NAME SIZE XXH3: every file of the checkpoint, its size and the XXH3-64 of its bytes\n");
    for (size_t i = 0; i < N_FILES; i++) {
        char p[PATH_MAX + 32];
        size_t len = 0;
        snprintf(p, sizeof p, "%s/%s", ckdir, FILE_NAMES[i]);
        uint8_t *b = slurp(p, &len);
        if (!b) return fprintf(stderr, "%s: %s\n", p, strerror(errno)), fclose(f), 1;
        fprintf(f, "file %s %zu %016llx\n", FILE_NAMES[i], len, (unsigned long long)tsr_hash(b, len));
        free(b);
    }
    fprintf(f, "step %d\nlayout pp=1 dp_replicate=1 dp_shard=2 tp=1 n_layers=2 flat=0\n", STEP);
    fprintf(f, "# tensor NAME GROUP DTYPE SHAPE TP_DIM FSDP PP_ROLE LAYER (SHAPE: dims joined by x, - for\n"
               "# no dims), then its elements in row-major order, in decimal\n");
    for (int t = 0; t < N_T; t++) {
        const vtensor *v = &VT[t];
        char shape[64] = "-";
        for (uint32_t d = 0, n = 0; d < v->ndim; d++)
            n += (uint32_t)snprintf(shape + n, sizeof shape - n, "%s%llu", d ? "x" : "", (unsigned long long)v->shape[d]);
        fprintf(f, "tensor %s %s %s %s %d %u %u %d\n", v->name, v->group, tsr_dtype_name(v->dtype), shape,
                v->pl.tp_dim, v->pl.fsdp, v->pl.pp_role, (int)v->pl.layer);
        uint64_t n = volume(v);
        for (uint64_t i = 0; i < n; i++)
            fprintf(f, "%.9g%s", value(t, i), (i + 1) % 16 == 0 || i + 1 == n ? "\n" : " ");
    }
    fprintf(f, "# blob NAME RANK SIZE, then its bytes in hex\n");
    struct {
        const char *name;
        int rank;
        const void *data;
        size_t size;
    } blobs[3];
    uint8_t step_le[8];
    tsr_st64(step_le, STEP);
    blobs[0].name = "note", blobs[0].rank = -1, blobs[0].data = note(), blobs[0].size = NOTE_SIZE;
    blobs[1].name = "rng", blobs[1].rank = 1, blobs[1].data = RNG_BLOB, blobs[1].size = sizeof RNG_BLOB;
    blobs[2].name = "train.step", blobs[2].rank = -1, blobs[2].data = step_le, blobs[2].size = 8;
    for (int b = 0; b < 3; b++) {
        fprintf(f, "blob %s %d %zu\n", blobs[b].name, blobs[b].rank, blobs[b].size);
        const uint8_t *p = blobs[b].data;
        for (size_t i = 0; i < blobs[b].size; i++)
            fprintf(f, "%02x%s", p[i], (i + 1) % 32 == 0 || i + 1 == blobs[b].size ? "\n" : "");
    }
    return fclose(f) ? 1 : 0;
}

/* ------------------------------------------------------------ expected.txt */

typedef struct tokens {
    char **v;
    size_t n, i;
} tokens;

/* The words of the text, comments (# to the end of the line) left out. */
static tokens tokenize(char *text) {
    tokens t = {0};
    size_t cap = 0;
    for (char *p = text; *p;) {
        if (*p == '#') {
            while (*p && *p != '\n') p++;
        } else if (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') {
            *p++ = 0;
        } else {
            if (t.n == cap) t.v = realloc(t.v, (cap = cap ? 2 * cap : 256) * sizeof *t.v);
            t.v[t.n++] = p;
            while (*p && *p != ' ' && *p != '\n' && *p != '\t' && *p != '\r' && *p != '#') p++;
        }
    }
    return t;
}

static const char *next(tokens *t) { return t->i < t->n ? t->v[t->i++] : ""; }

static int dtype_of(const char *name) {
    for (int d = 1; d < 32; d++)
        if (strcmp(tsr_dtype_name(d), name) == 0) return d;
    return 0;
}

/* The bits of decimal value `s` in dtype into out; 0, or -1 when the value is
 * not exact in the dtype (a broken expected.txt). */
static int encode(int dtype, const char *s, uint8_t *out) {
    char *end;
    if (dtype == TSR_F32 || dtype == TSR_BF16) {
        double x = strtod(s, &end);
        float f = (float)x;
        if (*end || (double)f != x) return -1;
        if (dtype == TSR_F32) return memcpy(out, &f, 4), 0;
        uint16_t h = tsr_f32_to_bf16(f);
        if (tsr_bf16_to_f32(h) != f) return -1;
        tsr_st16(out, h);
        return 0;
    }
    long long v = strtoll(s, &end, 10);
    if (*end) return -1;
    if (dtype == TSR_I64) return tsr_st64(out, (uint64_t)v), 0;
    if (dtype == TSR_U8 && v >= 0 && v <= 255) return out[0] = (uint8_t)v, 0;
    return -1;
}

/* --------------------------------------------------------------- checking */

/* Problems of the vector in dir (the step directory) against expected.txt's
 * tokens; `quiet` keeps the messages to one line each. @return their count. */
static int check_vector(const char *dir, tokens *t, int quiet) {
    int problems = 0;
#define PROBLEM(...) (problems++, quiet ? 0 : fprintf(stderr, __VA_ARGS__))
    t->i = 0;
    tsr_error e = {0};
    tsr_ckpt *ck = NULL;
    int files = 0, tensors = 0, blobs = 0;
    while (t->i < t->n) {
        const char *kw = next(t);
        if (strcmp(kw, "file") == 0) {
            const char *name = next(t);
            unsigned long long size = strtoull(next(t), NULL, 10), hash = strtoull(next(t), NULL, 16);
            char p[PATH_MAX];
            size_t len = 0;
            snprintf(p, sizeof p, "%s/%s", dir, name);
            uint8_t *b = slurp(p, &len);
            if (!b) PROBLEM("%s: cannot read: %s\n", p, strerror(errno));
            else if (len != size || tsr_hash(b, len) != hash)
                PROBLEM("%s: %zu bytes with XXH3 %016llx, expected.txt says %llu bytes, %016llx\n", p, len,
                        (unsigned long long)tsr_hash(b, len), size, hash);
            free(b);
            files++;
            continue;
        }
        if (!ck) { /* the files are listed first */
            ck = tsr_ckpt_open(dir, &e);
            if (!ck) {
                PROBLEM("%s: %s\n", dir, e.msg);
                break;
            }
            long bad = tsr_ckpt_verify(ck, NULL, NULL, 1, &e);
            if (bad) PROBLEM("%s: verify finds %ld problem(s) %s\n", dir, bad, bad < 0 ? e.msg : "");
        }
        if (strcmp(kw, "step") == 0) {
            unsigned long long s = strtoull(next(t), NULL, 10);
            if (tsr_ckpt_step(ck) != s) PROBLEM("step %llu, expected %llu\n", (unsigned long long)tsr_ckpt_step(ck), s);
        } else if (strcmp(kw, "layout") == 0) {
            tsr_layout l = tsr_ckpt_layout(ck);
            char want[200] = "", got[200];
            for (int k = 0; k < 6; k++) snprintf(want + strlen(want), sizeof want - strlen(want), "%s%s", k ? " " : "", next(t));
            snprintf(got, sizeof got, "pp=%u dp_replicate=%u dp_shard=%u tp=%u n_layers=%u flat=%u", l.pp,
                     l.dp_replicate, l.dp_shard, l.tp, l.n_layers, l.flags & TSR_LAYOUT_FLAT);
            if (strcmp(want, got)) PROBLEM("layout %s, expected %s\n", got, want);
        } else if (strcmp(kw, "tensor") == 0) {
            const char *name = next(t), *group = next(t), *dt = next(t), *shape = next(t);
            int tp = atoi(next(t)), fsdp = atoi(next(t)), pp = atoi(next(t)), layer = atoi(next(t));
            int dtype = dtype_of(dt);
            tsr_box box = {0, {0}, {0}};
            for (const char *p = shape; strcmp(shape, "-") && *p; p += *p == 'x')
                box.extent[box.ndim++] = strtoull(p, (char **)&p, 10);
            uint64_t n = tsr_box_volume(&box);
            size_t es = tsr_dtype_size(dtype);
            tensors++;
            long i = tsr_ckpt_find(ck, name);
            tsr_tensor_info ti;
            if (i < 0 || tsr_ckpt_tensor(ck, (size_t)i, &ti) || ti.dtype != dtype || ti.ndim != box.ndim ||
                memcmp(ti.shape, box.extent, box.ndim * sizeof *ti.shape) || strcmp(ti.group, group) ||
                ti.placement.tp_dim != tp || ti.placement.fsdp != fsdp || ti.placement.pp_role != pp ||
                ti.placement.layer != layer) {
                PROBLEM("tensor %s: missing, or not %s %s %s %d %d %d %d\n", name, group, dt, shape, tp, fsdp, pp, layer);
                t->i += n;
                continue;
            }
            uint8_t *got = malloc(n * es + 1), *want = malloc(es);
            if (tsr_ckpt_read(ck, (size_t)i, &box, got, &e)) {
                PROBLEM("tensor %s: %s\n", name, e.msg);
                t->i += n;
            } else {
                for (uint64_t x = 0; x < n; x++) {
                    const char *s = next(t);
                    if (encode(dtype, s, want)) PROBLEM("expected.txt: %s element %llu: '%s' is not a %s\n", name, (unsigned long long)x, s, dt);
                    else if (memcmp(got + x * es, want, es))
                        PROBLEM("tensor %s element %llu differs from %s\n", name, (unsigned long long)x, s);
                }
            }
            free(got);
            free(want);
        } else if (strcmp(kw, "blob") == 0) {
            const char *name = next(t);
            int rank = atoi(next(t));
            size_t size = strtoull(next(t), NULL, 10);
            blobs++;
            char *hex = calloc(1, 2 * size + 1);
            while (strlen(hex) < 2 * size && t->i < t->n) strncat(hex, next(t), 2 * size - strlen(hex));
            long b = tsr_ckpt_find_blob(ck, name, rank);
            tsr_blob_info bi;
            if (b < 0 || tsr_ckpt_blob(ck, (size_t)b, &bi) || bi.size != size) {
                PROBLEM("blob %s rank %d: missing or not %zu bytes\n", name, rank, size);
            } else {
                uint8_t *got = malloc(size + 1);
                if (tsr_ckpt_read_blob(ck, (size_t)b, got, &e)) PROBLEM("blob %s: %s\n", name, e.msg);
                else
                    for (size_t k = 0; k < size; k++) {
                        unsigned v;
                        if (sscanf(hex + 2 * k, "%2x", &v) != 1 || got[k] != v) {
                            PROBLEM("blob %s byte %zu differs\n", name, k);
                            break;
                        }
                    }
                free(got);
            }
            free(hex);
        } else {
            PROBLEM("expected.txt: unknown word '%s'\n", kw);
            break;
        }
    }
    if (ck && ((size_t)tensors != tsr_ckpt_n_tensors(ck) || (size_t)blobs != tsr_ckpt_n_blobs(ck)))
        PROBLEM("%zu tensors and %zu blobs, expected.txt lists %d and %d\n", tsr_ckpt_n_tensors(ck),
                tsr_ckpt_n_blobs(ck), tensors, blobs);
    if (ck && (size_t)files != tsr_ckpt_n_files(ck) + 1)
        PROBLEM("%zu data files, expected.txt lists %d files\n", tsr_ckpt_n_files(ck), files);
    tsr_ckpt_close(ck);
    return problems;
#undef PROBLEM
}

/* The vector still covers what it is for: all three codecs, a tensor whose
 * chunks lie in two data files, a chunk of several frames, global and rank blobs. */
static void check_coverage(const char *dir) {
    tsr_error e = {0};
    tsr_ckpt *ck = tsr_ckpt_open(dir, &e);
    REQUIRE(ck, "%s", e.msg);
    int codecs[3] = {0}, split = 0, multi = 0, rank_blob = 0;
    for (size_t i = 0; i < tsr_ckpt_n_frames(ck); i++) {
        tsr_frame_info fi;
        tsr_ckpt_frame(ck, i, &fi);
        if (fi.codec >= 0 && fi.codec < 3) codecs[fi.codec]++;
    }
    for (size_t i = 0; i < tsr_ckpt_n_tensors(ck); i++) {
        tsr_tensor_info ti;
        tsr_ckpt_tensor(ck, i, &ti);
        uint32_t file = UINT32_MAX;
        for (size_t c = 0; c < tsr_ckpt_n_chunks(ck); c++) {
            tsr_chunk_info ci;
            tsr_ckpt_chunk(ck, c, &ci);
            if (ci.tensor != i) continue;
            if (ci.n_frames > 1) multi = 1;
            if (file != UINT32_MAX && ci.file_id != file) split = 1;
            file = ci.file_id;
        }
    }
    for (size_t b = 0; b < tsr_ckpt_n_blobs(ck); b++) {
        tsr_blob_info bi;
        tsr_ckpt_blob(ck, b, &bi);
        if (bi.rank >= 0) rank_blob = 1;
    }
    CHECK(codecs[0] && codecs[1] && codecs[2], "frames by codec raw %d, zstd %d, bytegroup %d", codecs[0], codecs[1],
          codecs[2]);
    CHECK(split, "no tensor has chunks in two data files");
    CHECK(multi, "no chunk has more than one frame");
    CHECK(rank_blob && tsr_ckpt_n_blobs(ck) >= 2, "blobs: %zu, of a rank: %d", tsr_ckpt_n_blobs(ck), rank_blob);
    tsr_ckpt_close(ck);
}

static int copy_file(const char *from, const char *to) {
    size_t len = 0;
    uint8_t *b = slurp(from, &len);
    FILE *f = b ? fopen(to, "wb") : NULL;
    int ok = f && fwrite(b, 1, len, f) == len;
    if (f && fclose(f)) ok = 0;
    free(b);
    return ok ? 0 : -1;
}

/* Flips byte `off` of file path (0: done). */
static int flip(const char *path, long off) {
    FILE *f = fopen(path, "r+b");
    if (!f) return -1;
    int c = fseek(f, off, SEEK_SET) ? EOF : fgetc(f);
    int rc = c == EOF || fseek(f, off, SEEK_SET) || fputc(c ^ 0x01, f) == EOF;
    return fclose(f) || rc ? -1 : 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--generate") == 0) return generate(argv[2]);
    const char *root = getenv("TSR_ROOT"), *tmp = getenv("TSR_TMP");
    char vec[PATH_MAX], exp[PATH_MAX];
    snprintf(vec, sizeof vec, "%s/formats/testdata/%s", root ? root : ".", STEP_DIR);
    snprintf(exp, sizeof exp, "%s/formats/testdata/expected.txt", root ? root : ".");
    size_t len = 0;
    char *text = (char *)slurp(exp, &len);
    REQUIRE(text, "%s: %s (set TSR_ROOT to the source tree)", exp, strerror(errno));
    tokens t = tokenize(text);

    CHECK(check_vector(vec, &t, 0) == 0, "the committed vector %s differs from %s", vec, exp);
    check_coverage(vec);
    /* nothing in the step directory that expected.txt does not list */
    DIR *d = opendir(vec);
    REQUIRE(d, "%s: %s", vec, strerror(errno));
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        int listed = 0;
        for (size_t i = 0; i < N_FILES; i++) listed |= strcmp(de->d_name, FILE_NAMES[i]) == 0;
        CHECK(listed, "%s/%s: a file expected.txt does not list", vec, de->d_name);
    }
    closedir(d);

    /* one byte flipped anywhere in any file fails the check */
    char copy[PATH_MAX];
    snprintf(copy, sizeof copy, "%s/%s", tmp ? tmp : ".", STEP_DIR);
    REQUIRE(mkdir(copy, 0755) == 0 || errno == EEXIST, "%s: %s", copy, strerror(errno));
    for (size_t i = 0; i < N_FILES; i++) {
        char from[PATH_MAX + 32], to[PATH_MAX + 32];
        snprintf(from, sizeof from, "%s/%s", vec, FILE_NAMES[i]);
        snprintf(to, sizeof to, "%s/%s", copy, FILE_NAMES[i]);
        REQUIRE(copy_file(from, to) == 0, "copy %s: %s", from, strerror(errno));
    }
    CHECK(check_vector(copy, &t, 0) == 0, "the copy %s", copy);
    for (size_t i = 0; i < N_FILES; i++) {
        char p[PATH_MAX + 32];
        snprintf(p, sizeof p, "%s/%s", copy, FILE_NAMES[i]);
        struct stat st;
        REQUIRE(stat(p, &st) == 0, "%s", p);
        /* a header byte, header padding, the first frame's first byte, the last byte */
        long offs[4] = {9, 100, i == 0 ? 200 : 4096, (long)st.st_size - 1};
        for (int k = 0; k < 4; k++) {
            REQUIRE(flip(p, offs[k]) == 0, "flip %s at %ld", p, offs[k]);
            CHECK(check_vector(copy, &t, 1) > 0, "%s with byte %ld flipped passes", FILE_NAMES[i], offs[k]);
            REQUIRE(flip(p, offs[k]) == 0, "flip %s at %ld", p, offs[k]);
        }
    }
    free(t.v);
    free(text);
    return check_done();
}
