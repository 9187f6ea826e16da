/* test_corrupt.c: every single-byte corruption of a small checkpoint is detected,
 * exhaustively: in the MANIFEST, every byte position with every one of its 255 other
 * values (parsed in memory), and every position once more through tsr_ckpt_open and
 * verify from disk; in each data file, byte positions spread over the whole file
 * (the new value cycling through all 255 changes across positions) for a time
 * budget with a floor, every one under make test-long (TSR_LONG), by
 * tsr_ckpt_verify and by reading every tensor and blob (frame by frame, and whole
 * held to its digest: tsr_ckpt_read_whole); the data files once more in
 * memory (/dev/shm), where they are read through a mapping.
 * Then each of a frame's two checksums on its own: a frame whose stored bytes
 * changed but decode to bytes that match raw_hash is caught by stored_hash alone,
 * and one whose stored bytes match stored_hash but decode to other bytes (a
 * coder's fault) by raw_hash alone; a whole read, held to the digest instead,
 * refuses both and names the frame by the checksum. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "codec.h"
#include "common.h"
#include "manifest.h"
#include "store.h"
#include "tessera.h"

static tsr_error e;

static void write_small(const char *dir) {
    uint8_t id[16] = "corruption-test";
    tsr_write_opts o = tsr_write_opts_default();
    o.frame_bytes = 96; /* several frames per tensor */
    o.threads = 1;
    const uint8_t *tables[2];
    size_t lens[2];
    tsr_save *w[2];
    float f[6 * 5];
    uint16_t h[8 * 4];
    int32_t iv[3] = {1, -2, 3};
    double scalar = 3.25;
    for (int i = 0; i < 30; i++) f[i] = 0.02f * (float)(i - 15);
    for (int i = 0; i < 32; i++) h[i] = (uint16_t)(0x3c00 + 37 * i);
    uint64_t sf[2] = {6, 5}, sh[2] = {8, 4}, si[1] = {3};
    for (uint32_t k = 0; k < 2; k++) {
        w[k] = tsr_save_begin(dir, k, id, &o, &e);
        REQUIRE(w[k], "%s", e.msg);
        CHECK_OK(tsr_save_tensor(w[k], "w.f32", NULL, TSR_F32, 2, sf, NULL, &e));
        CHECK_OK(tsr_save_tensor(w[k], "w.bf16", NULL, TSR_BF16, 2, sh, NULL, &e));
        CHECK_OK(tsr_save_tensor(w[k], "ids", NULL, TSR_I32, 1, si, NULL, &e));
        CHECK_OK(tsr_save_tensor(w[k], "scalar", "optim", TSR_F64, 0, NULL, NULL, &e));
        tsr_box b = {2, {3 * k, 0}, {3, 5}};
        CHECK_OK(tsr_save_box(w[k], "w.f32", &b, f + 15 * k, &e));
        if (k == 0) {
            tsr_box bh = {2, {0, 0}, {8, 4}}, bi = {1, {0}, {3}};
            CHECK_OK(tsr_save_box(w[k], "w.bf16", &bh, h, &e));
            CHECK_OK(tsr_save_box(w[k], "ids", &bi, iv, &e));
            CHECK_OK(tsr_save_blob(w[k], "config", -1, "lr=3e-4\n", 8, &e));
        } else {
            tsr_box bs = {0, {0}, {0}};
            CHECK_OK(tsr_save_box(w[k], "scalar", &bs, &scalar, &e));
            CHECK_OK(tsr_save_blob(w[k], "rng", 1, "0123456789abcdef", 16, &e));
        }
        CHECK_OK(tsr_save_finish(w[k], &tables[k], &lens[k], &e));
    }
    CHECK_OK(tsr_save_commit(w[0], tables, lens, 2, 5, NULL, &e));
    tsr_save_free(w[0]);
    tsr_save_free(w[1]);
}

/* 1 if the checkpoint in dir opens, verifies with no problem, and reads fully. */
static int verify_ok(const char *dir) {
    tsr_ckpt *ck = tsr_ckpt_open(dir, &e);
    if (!ck) return 0;
    long n = tsr_ckpt_verify(ck, NULL, NULL, 1, &e);
    tsr_ckpt_close(ck);
    return n == 0;
}

/* Reads every tensor (tsr_ckpt_read, or with `whole` tsr_ckpt_read_whole: held
 * to its digest in place of the frames' checksums) and every blob. */
static int read_ok(const char *dir, int whole) {
    tsr_ckpt *ck = tsr_ckpt_open(dir, &e);
    if (!ck) return 0;
    int ok = 1;
    uint8_t buf[4096];
    for (size_t i = 0; ok && i < tsr_ckpt_n_tensors(ck); i++) {
        tsr_tensor_info t;
        tsr_ckpt_tensor(ck, i, &t);
        tsr_box b = {.ndim = t.ndim};
        for (uint32_t d = 0; d < t.ndim; d++) b.extent[d] = t.shape[d];
        ok = (whole ? tsr_ckpt_read_whole(ck, i, buf, &e) : tsr_ckpt_read(ck, i, &b, buf, &e)) == 0;
    }
    for (size_t i = 0; ok && i < tsr_ckpt_n_blobs(ck); i++) ok = tsr_ckpt_read_blob(ck, i, buf, &e) == 0;
    tsr_ckpt_close(ck);
    return ok;
}

static uint8_t *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    REQUIRE(f, "open %s", path);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(*len);
    REQUIRE(fread(b, 1, *len, f) == *len, "read %s", path);
    fclose(f);
    return b;
}

static void poke(const char *path, size_t off, uint8_t v) {
    int fd = open(path, O_WRONLY);
    REQUIRE(fd >= 0 && pwrite(fd, &v, 1, (off_t)off) == 1, "write %s", path);
    close(fd);
}


/* Verify's problems, joined (the first few), for checking which check fired. */
static void collect(void *user, const char *msg) {
    char *all = user;
    size_t n = strlen(all);
    if (n + strlen(msg) + 2 < 4096) snprintf(all + n, 4096 - n, "%s\n", msg);
}

/* Data files of the checkpoint in dir, by verify and by read: every position with
 * `all` (make test-long), else as many as a time budget allows with a floor,
 * visited in an order that spreads any prefix over the whole file (position i*step
 * mod len, step coprime with len, near len/phi); truncated and extended. */
#define DATA_BUDGET_S 8.0 /* per file */
#define DATA_FLOOR 1024   /* positions per file, whatever the time */
static size_t gcd(size_t a, size_t b) { return b ? gcd(b, a % b) : a; }
static void data_files(const char *dir, int all) {
    for (int f = 0; f < 2; f++) {
        char path[700];
        snprintf(path, sizeof path, "%s/data-%05d.tsd", dir, f);
        size_t len;
        uint8_t *d = slurp(path, &len);
        long v_missed = 0, r_missed = 0;
        int failures_before = check_failures;
        size_t step = (size_t)((double)len * 0.6180339887) | 1, n = 0;
        while (gcd(step, len) != 1) step += 2;
        double t0 = tsr_now();
        for (; n < len && (all || n < DATA_FLOOR || tsr_now() - t0 < DATA_BUDGET_S); n++) {
            size_t pos = n * step % len;
            poke(path, pos, (uint8_t)(d[pos] ^ (1 + pos % 255)));
            if (verify_ok(dir) && v_missed++ < 5) CHECK(0, "%s byte %zu: verify passed", path, pos);
            if (read_ok(dir, 0) && r_missed++ < 5) CHECK(0, "%s byte %zu: read passed", path, pos);
            if (read_ok(dir, 1) && r_missed++ < 5) CHECK(0, "%s byte %zu: whole read passed", path, pos);
            poke(path, pos, d[pos]);
        }
        CHECK(v_missed == 0 && r_missed == 0, "%s: %ld corruptions missed by verify, %ld by read", path, v_missed,
              r_missed);
        /* truncated and extended */
        CHECK(truncate(path, (off_t)len - 1) == 0, "truncate");
        CHECK(!verify_ok(dir) && !read_ok(dir, 0) && !read_ok(dir, 1), "%s truncated by one byte: not detected", path);
        CHECK(truncate(path, (off_t)len + 1) == 0, "extend");
        CHECK(!verify_ok(dir), "%s extended by one byte: not detected", path);
        CHECK(truncate(path, (off_t)len) == 0, "restore");
        poke(path, len - 1, d[len - 1]);
        if (check_failures == failures_before)
            printf("%s: %zu positions of %zu, all detected\n", path, n, len);
        free(d);
    }
}

/* A checkpoint of one compressible f32 tensor in 4 zstd frames of 1 KiB. */
static void write_zstd(const char *dir) {
    tsr_write_opts o = tsr_write_opts_default();
    o.frame_bytes = 1024;
    o.threads = 1;
    o.codec = TSR_CODEC_ZSTD;
    static float v[1024];
    for (int i = 0; i < 1024; i++) v[i] = (float)(i % 7);
    uint64_t shape[2] = {16, 64};
    tsr_box b = {2, {0, 0}, {16, 64}};
    tsr_save *w = tsr_save_begin(dir, 0, NULL, &o, &e);
    REQUIRE(w, "%s", e.msg);
    CHECK_OK(tsr_save_tensor(w, "w", NULL, TSR_F32, 2, shape, NULL, &e));
    CHECK_OK(tsr_save_box(w, "w", &b, v, &e));
    CHECK_OK(tsr_save_finish(w, NULL, NULL, &e));
    CHECK_OK(tsr_save_commit(w, NULL, NULL, 0, 1, NULL, &e));
    tsr_save_free(w);
}

/* Replaces frame 0 of dir's checkpoint with a valid zstd encoding of other bytes
 * (one bit flipped) and rewrites its MANIFEST record: with `keep_raw_hash`, the
 * stored size and stored_hash describe the new bytes and raw_hash still the old
 * ones (only raw_hash can tell); otherwise raw_hash describes the new decoded
 * bytes and stored_hash still the old stored ones (only stored_hash can tell). */
static void swap_frame(const char *dir, int keep_raw_hash) {
    char mpath[800], dpath[800];
    snprintf(mpath, sizeof mpath, "%s/MANIFEST", dir);
    snprintf(dpath, sizeof dpath, "%s/data-00000.tsd", dir);
    size_t mlen, dlen;
    uint8_t *mb = slurp(mpath, &mlen), *d = slurp(dpath, &dlen);
    tsr_manifest m;
    REQUIRE(tsr_manifest_parse(mb, mlen, mpath, 0, &m, &e) == 0, "%s", e.msg);
    REQUIRE(m.n_frames >= 2, "%zu frames", m.n_frames);
    tsr_mf_frame *f = &m.frames[0];
    REQUIRE(f->codec == TSR_CODEC_ZSTD && f->stored_size <= TSR_ALIGN && f->offset + TSR_ALIGN <= dlen,
            "frame 0: codec %d, %llu stored bytes", f->codec, (unsigned long long)f->stored_size);
    tsr_codec *c = tsr_codec_new();
    uint8_t raw[1024], out[8192];
    REQUIRE(c && f->raw_size == sizeof raw, "codec");
    REQUIRE(tsr_frame_decode(c, TSR_F32, f->codec, d + f->offset, f->stored_size, raw, sizeof raw, &e) == 0, "%s",
            e.msg);
    raw[5] ^= 1;
    size_t n;
    int codec;
    REQUIRE(tsr_codec_bound(sizeof raw) <= sizeof out, "bound");
    REQUIRE(tsr_frame_encode(c, TSR_F32, TSR_CODEC_ZSTD, 3, raw, sizeof raw, out, sizeof out, &n, &codec, &e) == 0 &&
                codec == TSR_CODEC_ZSTD && n <= TSR_ALIGN,
            "re-encode: %s", e.msg);
    tsr_codec_free(c);
    memset(d + f->offset, 0, TSR_ALIGN);
    memcpy(d + f->offset, out, n);
    f->stored_size = n;
    if (keep_raw_hash) f->stored_hash = tsr_hash(out, n);
    else f->raw_hash = tsr_hash(raw, sizeof raw);
    uint8_t *enc;
    size_t elen;
    REQUIRE(tsr_manifest_encode(&m, 0, &enc, &elen, &e) == 0, "%s", e.msg);
    FILE *fp = fopen(mpath, "wb");
    REQUIRE(fp && fwrite(enc, 1, elen, fp) == elen && fclose(fp) == 0, "write %s", mpath);
    fp = fopen(dpath, "wb");
    REQUIRE(fp && fwrite(d, 1, dlen, fp) == dlen && fclose(fp) == 0, "write %s", dpath);
    free(enc);
    free(mb);
    free(d);
    tsr_manifest_free(&m);
}

/* Each checksum alone: the MANIFEST opens (it is well formed), and verify and
 * a read both fail with the message of the checksum that must catch it. */
static void one_checksum(const char *base, int keep_raw_hash) {
    const char *want = keep_raw_hash ? "checksum mismatch (decoded bytes)" : "checksum mismatch (stored bytes)";
    char dir[700];
    snprintf(dir, sizeof dir, "%s/%s", base, keep_raw_hash ? "raw-hash-only" : "stored-hash-only");
    write_zstd(dir);
    REQUIRE(verify_ok(dir) && read_ok(dir, 0) && read_ok(dir, 1), "%s: the pristine checkpoint is sound: %s", dir,
            e.msg);
    swap_frame(dir, keep_raw_hash);
    tsr_ckpt *ck = tsr_ckpt_open(dir, &e);
    REQUIRE(ck, "%s: the rewritten MANIFEST opens: %s", dir, e.msg);
    char problems[4096] = "";
    long n = tsr_ckpt_verify(ck, collect, problems, 1, &e);
    tsr_ckpt_close(ck);
    int verified = n == 1 && strstr(problems, want);
    CHECK(verified, "%s: verify found %ld problems, want one '%s': %s", dir, n, want, problems);
    e = (tsr_error){0};
    int read = !read_ok(dir, 0) && strstr(e.msg, want);
    CHECK(read, "%s: read: want '%s', got: %s", dir, want, e.msg);
    /* the whole read: the digest refuses it, the read again with the checksums
     * names the frame */
    e = (tsr_error){0};
    int whole = !read_ok(dir, 1) && strstr(e.msg, want) && strstr(e.msg, "data-00000.tsd: frame 0 ");
    CHECK(whole, "%s: whole read: want %s naming data-00000.tsd: frame 0, got: %s", dir, want, e.msg);
    if (verified && read && whole) printf("%s: caught by %s alone\n", dir, keep_raw_hash ? "raw_hash" : "stored_hash");
}

int main(void) {
    const char *t = getenv("TSR_TMP");
    char dir[600];
    snprintf(dir, sizeof dir, "%s/corrupt", t ? t : "/tmp");
    write_small(dir);
    REQUIRE(verify_ok(dir) && read_ok(dir, 0) && read_ok(dir, 1), "the pristine checkpoint is sound: %s", e.msg);

    /* MANIFEST, in memory: every position, every other value. */
    char mpath[700];
    snprintf(mpath, sizeof mpath, "%s/MANIFEST", dir);
    size_t mlen;
    uint8_t *m = slurp(mpath, &mlen);
    long missed = 0;
    double t0 = tsr_now();
    for (size_t pos = 0; pos < mlen; pos++) {
        uint8_t orig = m[pos];
        for (int v = 0; v < 256; v++) {
            if (v == orig) continue;
            m[pos] = (uint8_t)v;
            tsr_manifest mf;
            if (tsr_manifest_parse(m, mlen, "MANIFEST", 0, &mf, &e) == 0) {
                tsr_manifest_free(&mf);
                if (missed++ < 5) CHECK(0, "MANIFEST byte %zu = 0x%02x not detected", pos, v);
            }
        }
        m[pos] = orig;
    }
    CHECK(missed == 0, "%ld MANIFEST corruptions undetected", missed);
    printf("MANIFEST in memory: %.1f s\n", tsr_now() - t0);
    /* truncations and an appended byte */
    for (size_t len = 0; len < mlen; len++) {
        tsr_manifest mf;
        CHECK(tsr_manifest_parse(m, len, "MANIFEST", 0, &mf, &e) != 0, "MANIFEST truncated to %zu accepted", len);
    }
    /* MANIFEST, from disk through open and verify: every position. */
    t0 = tsr_now();
    for (size_t pos = 0; pos < mlen; pos++) {
        poke(mpath, pos, (uint8_t)(m[pos] ^ (1 + pos % 255)));
        CHECK(!verify_ok(dir), "MANIFEST byte %zu corrupted: verify passed", pos);
        CHECK(!read_ok(dir, 0), "MANIFEST byte %zu corrupted: read passed", pos);
        poke(mpath, pos, m[pos]);
    }
    free(m);
    printf("MANIFEST from disk: %.1f s\n", tsr_now() - t0);
    t0 = tsr_now();
    int all = getenv("TSR_LONG") != NULL;
    data_files(dir, all);
    printf("data files from disk: %.1f s\n", tsr_now() - t0);
    t0 = tsr_now();
    /* the same in memory (/dev/shm, tmpfs), where the reader maps the data files
     * and checks the frames in the file's own pages (the checks are the ones
     * above; the mapping is what differs) */
    char shm[128], cmd[900];
    snprintf(shm, sizeof shm, "/dev/shm/tessera-corrupt-%d", (int)getpid());
    snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s", shm, dir, shm);
    REQUIRE(system(cmd) == 0, "%s", cmd);
    tsr_store *st = tsr_store_open(shm, 0, &e);
    tsr_rfile *rf = NULL;
    uint64_t size = 0;
    REQUIRE(st && tsr_store_open_read(st, "data-00000.tsd", &rf, &size, &e) == 0, "%s: %s", shm, e.msg);
    CHECK(tsr_rfile_map(rf, 0, size) != NULL, "%s/data-00000.tsd is not mapped", shm);
    tsr_rfile_close(rf);
    tsr_store_close(st);
    data_files(shm, all);
    printf("data files in memory: %.1f s\n", tsr_now() - t0);
    snprintf(cmd, sizeof cmd, "rm -rf %s", shm);
    CHECK(system(cmd) == 0, "%s", cmd);
    CHECK(verify_ok(dir) && read_ok(dir, 0) && read_ok(dir, 1), "restored checkpoint is sound again: %s", e.msg);
    if (!check_failures) printf("MANIFEST: %zu positions x 255 values, all detected\n", mlen);
    one_checksum(t ? t : "/tmp", 0);
    one_checksum(t ? t : "/tmp", 1);
    return check_done();
}
