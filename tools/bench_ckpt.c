/* bench_ckpt.c: tessera bench save | load: the engine's figures, each a ratio
 * against a baseline measured in the same run on the same machine.
 *   save: stall = time a stand-in step overlapping the save is blocked by it / a
 *         memcpy of the same bytes;
 *         write throughput = raw bytes per second of the background save / the
 *         sequential O_DIRECT write bandwidth of the same disk (1 MiB writes, same
 *         directory), for incompressible and for bf16 Gaussian-like data.
 *   save --digests: wall time of a save of the 124m model's state with the
 *         digest and statistics shares / without them (tsr_write_opts.no_digests).
 *   load: load time in another layout on another rank count / load time in the
 *         layout the checkpoint was saved in; with --digests, load time with the
 *         digest check / without it (tsr_engine_opts.no_digest_check). */
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "commands.h"
#include "model.h"
#include "store.h"
#include "tessera.h"

/* Memory touched and locked, so that page faults and reclaim stay out of the
 * measurements (the engine locks its staging arena the same way). */
static void *alloc_populated(size_t n) {
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) return NULL;
    memset(p, 0, n);
    mlock(p, n);
    return p;
}


static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Deletes the files a probe left, and commits the filesystem's journal so that
 * the discard of their blocks is done before anything else is measured. */
static void probe_cleanup(const char *dir) {
    char path[PATH_MAX];
    for (int rep = 0; rep < 2; rep++) {
        snprintf(path, sizeof path, "%s/disk-probe-%d.tmp", dir, rep);
        unlink(path);
    }
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        syncfs(fd);
        close(fd);
    }
}

/* Sequential O_DIRECT write bandwidth of the disk under dir: bytes/s, writing
 * `bytes` of `noise` (random, never repeated: a virtual disk may store constant
 * or repeated blocks faster than real data, which would flatter the baseline) in
 * 1 MiB writes, then fsync; best of two. noise is 4096-aligned. The files stay
 * until probe_cleanup: deleting them now would make the filesystem discard their
 * blocks while the save that follows is measured. */
static double disk_bandwidth(const char *dir, const uint8_t *noise, size_t bytes) {
    char path[PATH_MAX];
    size_t chunk = 1 << 20;
    double best = 0;
    for (int rep = 0; rep < 2; rep++) {
        snprintf(path, sizeof path, "%s/disk-probe-%d.tmp", dir, rep);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
        if (fd < 0) fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) break;
        double t0 = tsr_now();
        size_t done = 0;
        for (; done + chunk <= bytes; done += chunk)
            if (pwrite(fd, noise + done, chunk, (off_t)done) != (ssize_t)chunk) break;
        fsync(fd);
        double bw = (double)done / (tsr_now() - t0);
        close(fd);
        if (bw > best) best = bw;
    }
    return best;
}

/* Write bandwidth through tessera's store of dir, with the fault spec in force
 * (a rate-limited store: rate:MBPS:write): `bytes` of noise in 4 MiB writes,
 * then the file's finish; bytes/s, or 0 when it cannot write. */
static double store_bandwidth(const char *dir, const uint8_t *noise, size_t bytes) {
    tsr_error e;
    tsr_store *s = tsr_store_open(dir, 1, &e);
    tsr_wfile *f = NULL;
    if (!s || tsr_store_create(s, "disk-probe-0.tmp", 0, &f, &e)) {
        tsr_store_close(s);
        return 0;
    }
    size_t chunk = 4u << 20, done = 0;
    double t0 = tsr_now();
    for (; done + chunk <= bytes; done += chunk)
        if (tsr_wfile_write(f, noise + done, chunk, done, &e)) break;
    int rc = tsr_wfile_finish(f, done, &e);
    double bw = rc ? 0 : (double)done / (tsr_now() - t0);
    tsr_store_close(s);
    return bw;
}

#define SLOW_MBPS 400
#define SLOW_MBPS_S "400"

static const char save_help[] =
    "usage: tessera bench save --dir DIR [--bytes SIZE] [--json]\n"
    "       tessera bench save --dir DIR --digests [--rounds R] [--json]\n"
    "Measures, on one rank, in DIR: the time a training step is blocked by an\n"
    "asynchronous save whose copy overlaps it (a stand-in step reads the state while\n"
    "the copy runs, waits for it, then writes the state) against a memcpy of the same\n"
    "bytes (goal: at most 0.1), and the raw bytes per second of the\n"
    "background save against the disk's sequential O_DIRECT write bandwidth, for\n"
    "incompressible data (goal: at least 0.9: raw bytes, the disk's own limit) and\n"
    "for bf16 Gaussian-like weights (goal: at least 1.0, never slower than writing\n"
    "them raw); and for the weights on a slower disk, emulated by a store that\n"
    "takes every write at " SLOW_MBPS_S " MB/s (rate:" SLOW_MBPS_S ":write), slower than the encoder,\n"
    "against raw writes through the same store (goal: at least 1.3). SIZE defaults\n"
    "to 1G (a quarter of it on the slow store).\n"
    "--digests: instead, the wall time of a save (the call to the commit) of the\n"
    "124m model's state on one rank (f32 parameters and both AdamW moments, 1.81 GiB)\n"
    "with the digest and statistics shares against the same save without them\n"
    "(tsr_write_opts.no_digests), alternately, R times each (default 9, at most 99)\n"
    "after one warm-up save of each, the median of the rounds' ratios (goal: at most\n"
    "3% more); for the codec a trainer with no core to spare uses (raw) and the\n"
    "default (auto). The statistics of f32 and bf16 are taken by the staging copy\n"
    "(free while it waits for the memory), the digest's shares by the encoder.\n";

typedef struct save_result {
    double stall_ratio, write_ratio; /* medians over the measured rounds */
    double stall, memcpy_s, write_bps, disk_bps;
} save_result;

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* The stand-in for a training step that overlaps a save's copy: forward and
 * backward read the state (a sum of every 8-byte word), then, once the save's
 * copy is done (tsr_engine_staged: the wait is what the step is blocked), the
 * optimizer writes it (a byte of every cache line). @return the seconds blocked. */
static double stand_in_step(tsr_engine *eng, uint8_t *data, size_t bytes) {
    uint64_t sum = 0, x;
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
        memcpy(&x, data + i, 8);
        sum += x;
    }
    double t0 = tsr_now();
    tsr_engine_staged(eng);
    double blocked = tsr_now() - t0;
    for (size_t i = 0; i < bytes; i += 64) data[i] = (uint8_t)(data[i] + 1 + (sum & 1));
    return blocked;
}

/* Rounds of: a memcpy of the state and the disk's bandwidth, measured just
 * before a save, so that each ratio compares like with like on this (noisy,
 * shared) machine; then the save. The first save warms up and is not counted. */
static int run_saves(const char *dir, int dtype, uint8_t *data, uint8_t *scratch, const uint8_t *noise, size_t bytes,
                     int slow_mbps, save_result *out, tsr_error *e) {
    enum { NT = 16, ROUNDS = 5 };
    tsr_remove_tree(dir);
    mkdir(dir, 0755);
    char spec[64];
    snprintf(spec, sizeof spec, "rate:%d:write", slow_mbps);
    if (slow_mbps && tsr_fault_set(spec, e)) return -1;
    tsr_comm *comm = tsr_comm_self();
    tsr_engine_opts o = tsr_engine_opts_default();
    o.keep_latest = 0; /* deleting old steps would compete with the measured saves */
    o.overlap_staging = 1; /* as the trainer saves: the copy overlaps the stand-in step */
    tsr_engine *eng = comm ? tsr_engine_new(dir, comm, &o, e) : NULL;
    if (!eng) {
        tsr_comm_free(comm);
        tsr_fault_set(NULL, NULL);
        return -1;
    }
    size_t es = tsr_dtype_size(dtype), per = bytes / NT / es;
    tsr_tensor_decl t[NT];
    tsr_state_box sb[NT];
    char names[NT][32];
    for (int i = 0; i < NT; i++) {
        snprintf(names[i], sizeof names[i], "layers.%d.w", i);
        t[i] = (tsr_tensor_decl){names[i], "model", dtype, 2, {per / 1024, 1024}, {-1, 1, TSR_PP_ALL, -1}};
        sb[i] = (tsr_state_box){(uint32_t)i, {2, {0, 0}, {per / 1024, 1024}}, data + (size_t)i * (per / 1024) * 1024 * es, TSR_MEM_HOST};
    }
    size_t state_bytes = per / 1024 * 1024 * es * NT;
    tsr_state st = {t, NT, sb, NT, NULL, 0, {1, 1, 1, 1, 0, 0}};
    double stall_r[ROUNDS], write_r[ROUNDS], stall[ROUNDS], mc[ROUNDS], bps[ROUNDS], disk[ROUNDS];
    int rc = 0;
    for (int r = -1; r < ROUNDS && !rc; r++) {
        double t0 = tsr_now();
        memcpy(scratch, data, state_bytes);
        double m = tsr_now() - t0;
        double d = slow_mbps ? store_bandwidth(dir, noise, state_bytes) : disk_bandwidth(dir, noise, state_bytes);
        rc = tsr_engine_save(eng, (uint64_t)r + 2, &st, e);
        double t1 = tsr_now(); /* the background save starts when save returns */
        double blocked = tsr_engine_last_stall(eng); /* the save call */
        if (!rc) blocked += stand_in_step(eng, data, state_bytes);
        if (!rc) rc = tsr_engine_wait(eng, e);
        double t2 = tsr_now();
        probe_cleanup(dir);
        if (r < 0) continue;
        stall[r] = blocked;
        mc[r] = m;
        bps[r] = (double)state_bytes / (t2 - t1);
        disk[r] = d;
        stall_r[r] = stall[r] / m;
        write_r[r] = bps[r] / d;
    }
    tsr_engine_free(eng);
    tsr_comm_free(comm);
    tsr_fault_set(NULL, NULL);
    tsr_remove_tree(dir);
    if (rc) return rc;
    out->stall_ratio = median(stall_r, ROUNDS);
    out->write_ratio = median(write_r, ROUNDS);
    out->stall = median(stall, ROUNDS);
    out->memcpy_s = median(mc, ROUNDS);
    out->write_bps = median(bps, ROUNDS);
    out->disk_bps = median(disk, ROUNDS);
    return 0;
}

/* The 124m model's state on one rank (f32 parameters, then both AdamW moments),
 * its boxes carved from one buffer holding the synthetic content. */
typedef struct model_state {
    tsr_model_decls d;
    tsr_rank_box *boxes;
    tsr_state_box *sb;
    size_t n;
    uint8_t *data;
    size_t bytes;
    tsr_state st;
} model_state;

static int model_state_make(model_state *m, const char *flavor, tsr_error *e) {
    tsr_model_args a;
    memset(m, 0, sizeof *m);
    if (tsr_model_args_get(flavor, &a, e) || tsr_model_decls_make(&a, &m->d, e)) return -1;
    size_t nt = 3 * m->d.n_params;
    tsr_layout l = {1, 1, 1, 1, (uint32_t)a.n_layers, 0};
    if (tsr_layout_boxes(&l, m->d.decls, nt, 0, &m->boxes, &m->n, e)) return -1;
    size_t *at = calloc(m->n + 1, sizeof *at);
    m->sb = calloc(m->n + 1, sizeof *m->sb);
    if (!at || !m->sb) return free(at), tsr_err(e, TSR_ENOMEM, "out of memory");
    for (size_t i = 0; i < m->n; i++) {
        at[i] = m->bytes;
        m->bytes += tsr_align_up(tsr_box_volume(&m->boxes[i].box) * tsr_dtype_size(m->d.decls[m->boxes[i].tensor].dtype),
                                 4096);
    }
    if (!(m->data = alloc_populated(m->bytes))) return free(at), tsr_err(e, TSR_ENOMEM, "cannot allocate %zu bytes", m->bytes);
    for (size_t i = 0; i < m->n; i++) {
        const tsr_tensor_decl *t = &m->d.decls[m->boxes[i].tensor];
        m->sb[i] = (tsr_state_box){m->boxes[i].tensor, m->boxes[i].box, m->data + at[i], TSR_MEM_HOST};
        tsr_synth_fill(t->name, t->dtype, t->ndim, t->shape, &m->boxes[i].box, m->data + at[i]);
    }
    free(at);
    m->st = (tsr_state){m->d.decls, nt, m->sb, m->n, NULL, 0, l};
    return 0;
}

static void model_state_free(model_state *m) {
    if (m->data) munmap(m->data, m->bytes);
    free(m->sb);
    free(m->boxes);
    tsr_model_decls_free(&m->d);
}

typedef struct digest_cost {
    double with_s, without_s, ratio; /* medians: seconds a save, the rounds' with / without */
    double lo, hi;                   /* the rounds' lowest and highest ratio */
} digest_cost;

/* One save's wall time, the call to the commit, into DIR/s; then the step is
 * removed and the filesystem's journal committed, out of the next one's time. */
static int timed_save(tsr_engine *eng, const char *dir, uint64_t step, const tsr_state *st, double *secs,
                      tsr_error *e) {
    char sub[PATH_MAX];
    if (snprintf(sub, sizeof sub, "%s/s", dir) >= (int)sizeof sub) return tsr_err(e, TSR_EINVAL, "%s: too long", dir);
    double t0 = tsr_now();
    int rc = tsr_engine_save_dir(eng, sub, step, st, e);
    if (!rc) rc = tsr_engine_wait(eng, e);
    *secs = tsr_now() - t0;
    tsr_remove_tree(sub);
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        syncfs(fd);
        close(fd);
    }
    return rc;
}

/* Saves of m's state with and without the digest and statistics shares, each
 * on an engine of its own (as the trainer's: the copy overlaps, no retention),
 * alternately, the order swapped every round; one warm-up save of each first. */
#define DIGEST_SAVE_ROUNDS 9 /* the disk's speed moves between saves: a median of several */
#define DIGEST_SAVE_MAX_ROUNDS 99
static int digest_saves(const char *dir, int codec, int rounds, model_state *m, digest_cost *out, tsr_error *e) {
    tsr_engine *eng[2] = {NULL, NULL};
    tsr_comm *comm[2] = {NULL, NULL};
    double t[2][DIGEST_SAVE_MAX_ROUNDS], ratio[DIGEST_SAVE_MAX_ROUNDS];
    char root[2][PATH_MAX];
    int rc = 0;
    for (int k = 0; k < 2 && !rc; k++) {
        if (snprintf(root[k], sizeof root[k], "%s/%s", dir, k ? "without" : "with") >= (int)sizeof root[k])
            return tsr_err(e, TSR_EINVAL, "%s: too long", dir);
        tsr_remove_tree(root[k]);
        mkdir(root[k], 0755);
        tsr_engine_opts o = tsr_engine_opts_default();
        o.keep_latest = 0;
        o.overlap_staging = 1;
        o.write.codec = codec;
        o.write.no_digests = k;
        comm[k] = tsr_comm_self();
        if (!comm[k] || !(eng[k] = tsr_engine_new(root[k], comm[k], &o, e))) rc = -1;
    }
    for (int r = -1; r < rounds && !rc; r++)
        for (int i = 0; i < 2 && !rc; i++) {
            int k = (r + 2 + i) % 2; /* the order alternates */
            double s = 0;
            rc = timed_save(eng[k], root[k], (uint64_t)r + 2, &m->st, &s, e);
            if (!rc && r >= 0) t[k][r] = s;
        }
    for (int k = 0; k < 2; k++) {
        tsr_engine_free(eng[k]);
        tsr_comm_free(comm[k]);
    }
    tsr_remove_tree(dir);
    if (rc) return rc;
    for (int r = 0; r < rounds; r++) ratio[r] = t[0][r] / t[1][r];
    out->ratio = median(ratio, rounds); /* sorts them */
    out->lo = ratio[0], out->hi = ratio[rounds - 1];
    out->with_s = median(t[0], rounds);
    out->without_s = median(t[1], rounds);
    return 0;
}

#define DIGEST_SAVE_GOAL 1.03

static int bench_save_digests(const char *dir, int rounds, int json) {
    model_state m;
    tsr_error e = {0};
    static const struct { int codec; const char *name; } codecs[] = {{TSR_CODEC_RAW, "raw"}, {TSR_CODEC_AUTO, "auto"}};
    digest_cost c[2];
    int rc = model_state_make(&m, "124m", &e);
    for (int k = 0; k < 2 && !rc; k++) {
        char sub[PATH_MAX];
        snprintf(sub, sizeof sub, "%s/digests-%s", dir, codecs[k].name);
        mkdir(sub, 0755);
        rc = digest_saves(sub, codecs[k].codec, rounds, &m, &c[k], &e);
    }
    size_t bytes = m.bytes;
    model_state_free(&m);
    if (rc) {
        fprintf(stderr, "tessera bench save --digests: %s\n", e.msg);
        return EXIT_FAIL;
    }
    if (json) {
        printf("{\"bytes\":%zu", bytes);
        for (int k = 0; k < 2; k++)
            printf(",\"%s_with_s\":%.4f,\"%s_without_s\":%.4f,\"%s_ratio\":%.4f", codecs[k].name, c[k].with_s,
                   codecs[k].name, c[k].without_s, codecs[k].name, c[k].ratio);
        printf("}\n");
        return EXIT_OK;
    }
    char a[32];
    for (int k = 0; k < 2; k++)
        printf("save of 124m's state on one rank (%s, f32 parameters and AdamW moments), codec %s: %.3f s with the "
               "digests and statistics, %.3f s without: %+.2f%% (median of %d alternating rounds' ratios, %+.1f%% to "
               "%+.1f%%; goal <= +3%%)  %s\n",
               tsr_fmt_bytes(bytes, a, sizeof a), codecs[k].name, c[k].with_s, c[k].without_s, (c[k].ratio - 1) * 100,
               rounds,
               (c[k].lo - 1) * 100, (c[k].hi - 1) * 100, c[k].ratio <= DIGEST_SAVE_GOAL ? "ok" : "MISSED");
    return EXIT_OK;
}

int tsr_cmd_bench_save(int argc, char **argv) {
    const char *dir = NULL, *v;
    uint64_t bytes = 1ull << 30;
    int json = 0, digests = 0, rounds = DIGEST_SAVE_ROUNDS;
    for (int i = 1; i < argc; i++) {
        int r;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return fputs(save_help, stdout), EXIT_OK;
        if ((r = tsr_opt(argc, argv, &i, "rounds", 1, &v))) {
            uint64_t n;
            if (r < 0 || tsr_parse_u64(v, &n) || !n || n > DIGEST_SAVE_MAX_ROUNDS)
                return tsr_usage_error("bench save", "--rounds takes 1 to %d", DIGEST_SAVE_MAX_ROUNDS);
            rounds = (int)n;
            continue;
        }
        if (tsr_opt(argc, argv, &i, "digests", 0, &v)) {
            digests = 1;
            continue;
        }
        if ((r = tsr_opt(argc, argv, &i, "dir", 1, &v))) {
            if (r < 0) return EXIT_USAGE;
            dir = v;
        } else if ((r = tsr_opt(argc, argv, &i, "bytes", 1, &v))) {
            if (r < 0 || tsr_parse_size(v, &bytes) || bytes < (64u << 20))
                return tsr_usage_error("bench save", "--bytes takes a size of at least 64M");
        } else if (tsr_opt(argc, argv, &i, "json", 0, &v)) {
            json = 1;
        } else {
            return tsr_usage_error("bench save", "unknown argument %s", argv[i]);
        }
    }
    if (!dir) return tsr_usage_error("bench save", "missing --dir DIR");
    mkdir(dir, 0755);
    if (digests) return bench_save_digests(dir, rounds, json);
    size_t n = (size_t)bytes;
    uint8_t *data = alloc_populated(n), *copy = alloc_populated(n), *noise = alloc_populated(n);
    if (!data || !copy || !noise) {
        fprintf(stderr, "tessera bench save: cannot allocate 3 x %zu bytes\n", n);
        return EXIT_FAIL;
    }
    tsr_error e = {0};
    save_result inc, bf, slow;
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i + 8 <= n; i += 8) { /* xorshift: incompressible bytes */
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(noise + i, &x, 8);
    }
    memcpy(data, noise, n);
    char sub[PATH_MAX];
    snprintf(sub, sizeof sub, "%s/incompressible", dir);
    if (run_saves(sub, TSR_U8, data, copy, noise, n, 0, &inc, &e)) {
        fprintf(stderr, "tessera bench save: %s\n", e.msg);
        return EXIT_FAIL;
    }
    uint64_t shape[1] = {n / 2};
    tsr_box all = {1, {0}, {n / 2}};
    tsr_synth_fill("bench.bf16", TSR_BF16, 1, shape, &all, data);
    snprintf(sub, sizeof sub, "%s/bf16", dir);
    if (run_saves(sub, TSR_BF16, data, copy, noise, n, 0, &bf, &e)) {
        fprintf(stderr, "tessera bench save: %s\n", e.msg);
        return EXIT_FAIL;
    }
    snprintf(sub, sizeof sub, "%s/bf16-slow", dir);
    if (run_saves(sub, TSR_BF16, data, copy, noise, n / 4, SLOW_MBPS, &slow, &e)) {
        fprintf(stderr, "tessera bench save: %s\n", e.msg);
        return EXIT_FAIL;
    }
    munmap(data, n);
    munmap(copy, n);
    munmap(noise, n);
    double stall = inc.stall_ratio > bf.stall_ratio ? inc.stall_ratio : bf.stall_ratio;
    int ok = stall <= 0.1 && inc.write_ratio >= 0.9 && bf.write_ratio >= 1.0 && slow.write_ratio >= 1.3;
    if (json) {
        printf("{\"bytes\":%zu,\"stall_ratio\":%.3f,\"incompressible_ratio\":%.3f,\"bf16_ratio\":%.3f,"
               "\"bf16_slow_ratio\":%.3f,\"stall_s\":%.6f,\"memcpy_s\":%.6f,\"incompressible_Bps\":%.0f,"
               "\"bf16_Bps\":%.0f,\"disk_Bps\":%.0f,\"bf16_slow_Bps\":%.0f,\"slow_disk_Bps\":%.0f,"
               "\"goals_met\":%s}\n",
               n, stall, inc.write_ratio, bf.write_ratio, slow.write_ratio, bf.stall, bf.memcpy_s, inc.write_bps,
               bf.write_bps, bf.disk_bps, slow.write_bps, slow.disk_bps, ok ? "true" : "false");
    } else {
        char a[32];
        printf("tessera bench save: %s of state on one rank, in %s; medians of 5 rounds, each against a memcpy\n"
               "and a disk write (O_DIRECT, 1 MiB writes of random bytes, fsync) measured just before it\n",
               tsr_fmt_bytes(n, a, sizeof a), dir);
        printf("stall: a step overlapping the save's copy blocked %.1f ms (memcpy %.1f ms): %.2fx memcpy, worst of "
               "both data kinds (goal <= 0.1)  %s\n",
               bf.stall * 1e3, bf.memcpy_s * 1e3, stall, stall <= 0.1 ? "ok" : "MISSED");
        printf("write, incompressible: %.0f MB/s raw, disk %.0f MB/s: %.2fx (goal >= 0.9)  %s\n", inc.write_bps / 1e6,
               inc.disk_bps / 1e6, inc.write_ratio, inc.write_ratio >= 0.9 ? "ok" : "MISSED");
        printf("write, bf16 weights:   %.0f MB/s raw, disk %.0f MB/s: %.2fx (goal >= 1.0)  %s\n", bf.write_bps / 1e6,
               bf.disk_bps / 1e6, bf.write_ratio, bf.write_ratio >= 1.0 ? "ok" : "MISSED");
        printf("write, bf16 weights, slow disk (a store at " SLOW_MBPS_S " MB/s): %.0f MB/s raw, raw writes through it "
               "%.0f MB/s: %.2fx (goal >= 1.3)  %s\n",
               slow.write_bps / 1e6, slow.disk_bps / 1e6, slow.write_ratio, slow.write_ratio >= 1.3 ? "ok" : "MISSED");
    }
    return EXIT_OK;
}

/* ------------------------------------------------------------------ load */

static const char load_help[] =
    "usage: mpirun -np N tessera bench load DIR --layout L [--rounds R] [--cold] [--digests] [--json]\n"
    "Loads the checkpoint in DIR in the layout it was saved in, on the ranks it was\n"
    "saved on, and in layout L on L's rank count (both at most N; the other ranks\n"
    "wait), alternately, R times (default 5) after one warm-up load; prints the best\n"
    "times and their ratio (goal: at most 1.15). --cold: the checkpoint's files are\n"
    "dropped from the page cache before every load (as after a restart on another\n"
    "machine), so that it is read from the disk. --digests: instead, in each of the\n"
    "two layouts, loads with the digest check against loads without it\n"
    "(tsr_engine_opts.no_digest_check), alternately, R times each after one warm-up\n"
    "load, the median of the rounds' ratios (goal: at most 5% more).\n";

/* The checkpoint's files out of the page cache: all of them where the kernel
 * lets this process drop caches, else each file's pages (fadvise). */
static void drop_cached(const char *dir) {
    sync();
    FILE *f = fopen("/proc/sys/vm/drop_caches", "w");
    if (f && fputs("3", f) >= 0 && fclose(f) == 0) return;
    if (f) fclose(f);
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        int fd = open(path, O_RDONLY);
        if (fd < 0) continue;
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
    if (d) closedir(d);
}

typedef struct layout_run {
    tsr_layout l;
    tsr_comm *comm; /* NULL on ranks outside the layout */
    tsr_state_box *sb;
    size_t n;
    tsr_rank_box *boxes;
    double best;
} layout_run;

static int prepare(layout_run *lr, tsr_comm *world, const tsr_tensor_decl *t, size_t nt, tsr_error *e) {
    uint32_t rank = tsr_comm_rank(world), size = tsr_layout_size(&lr->l);
    lr->comm = tsr_comm_split(world, rank < size ? 0 : -1, (int)rank, e);
    lr->best = 1e30;
    if (rank >= size) return 0;
    if (!lr->comm) return -1;
    if (tsr_layout_boxes(&lr->l, t, nt, rank, &lr->boxes, &lr->n, e)) return -1;
    lr->sb = calloc(lr->n + 1, sizeof *lr->sb);
    if (!lr->sb) return -1;
    for (size_t i = 0; i < lr->n; i++) {
        size_t bytes = tsr_box_volume(&lr->boxes[i].box) * tsr_dtype_size(t[lr->boxes[i].tensor].dtype);
        lr->sb[i] = (tsr_state_box){lr->boxes[i].tensor, lr->boxes[i].box, alloc_populated(bytes ? bytes : 1), TSR_MEM_HOST};
        if (!lr->sb[i].data) return -1;
    }
    return 0;
}

/* One timed load on the ranks of lr (all ranks of world take part in the
 * barriers); the time is the slowest rank's. */
static int timed_load(layout_run *lr, tsr_comm *world, const char *dir, const tsr_tensor_decl *t, size_t nt,
                      int cold, int no_check, double *secs, tsr_error *e) {
    tsr_engine *eng = NULL;
    int rc = 0;
    if (cold && tsr_comm_rank(world) == 0) drop_cached(dir);
    /* each layout as a job of its own rank count would run: the cores shared out */
    tsr_engine_opts o = tsr_engine_opts_default();
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    o.write.threads = cores / (long)tsr_layout_size(&lr->l) > 0 ? (int)(cores / (long)tsr_layout_size(&lr->l)) : 1;
    o.no_digest_check = no_check;
    if (lr->comm && !(eng = tsr_engine_new(dir, lr->comm, &o, e))) rc = -1;
    tsr_comm_barrier(world, NULL);
    double t0 = tsr_now();
    if (!rc && lr->comm) {
        tsr_state st = {t, nt, lr->sb, lr->n, NULL, 0, lr->l};
        rc = tsr_engine_load(eng, dir, &st, NULL, e);
    }
    int64_t neg_us = -(int64_t)((tsr_now() - t0) * 1e6), ok = rc == 0;
    /* the ranks outside the layout sleep meanwhile, as if they were not there
     * (MPI's own waits spin and take cores from the ranks that load) */
    tsr_comm_barrier_idle(world, NULL);
    tsr_comm_allreduce_min(world, &neg_us, NULL);
    tsr_comm_allreduce_min(world, &ok, NULL);
    tsr_engine_free(eng);
    *secs = (double)-neg_us * 1e-6;
    return ok ? 0 : -1;
}

#define DIGEST_LOAD_GOAL 1.05

/* Loads in each layout of runs with the digest check and without it,
 * alternately (the order swapped every round), after one warm-up load of each;
 * rank 0 prints, for each layout, the medians and the median of the rounds'
 * ratios. */
static int digest_loads(layout_run *runs, tsr_comm *world, const char *dir, const tsr_tensor_decl *t, size_t nt,
                        int cold, int rounds, int json, uint64_t total, tsr_error *e) {
    double *v = calloc((size_t)rounds * 6, sizeof *v), res[2][3];
    if (!v) return tsr_err(e, TSR_ENOMEM, "out of memory");
    int rc = 0;
    for (int k = 0; k < 2 && !rc; k++) {
        double *with = v + (size_t)rounds * 3 * k, *without = with + rounds, *ratio = without + rounds, s;
        for (int r = -1; r < rounds && !rc; r++)
            for (int i = 0; i < 2 && !rc; i++) {
                int no_check = (r + 2 + i) % 2;
                rc = timed_load(&runs[k], world, dir, t, nt, cold, no_check, &s, e);
                if (r >= 0) (no_check ? without : with)[r] = s;
            }
        for (int r = 0; r < rounds && !rc; r++) ratio[r] = with[r] / without[r];
        if (!rc) res[k][0] = median(with, rounds), res[k][1] = median(without, rounds), res[k][2] = median(ratio, rounds);
    }
    free(v);
    if (rc || tsr_comm_rank(world) != 0) return rc;
    char sz[32];
    tsr_fmt_bytes(total, sz, sizeof sz);
    for (int k = 0; k < 2; k++) {
        char l[64];
        tsr_layout_format(&runs[k].l, l, sizeof l);
        if (json)
            printf("{\"bytes\":%llu,\"layout\":\"%s\",\"resharded\":%s,\"with_s\":%.4f,\"without_s\":%.4f,"
                   "\"ratio\":%.4f}\n",
                   (unsigned long long)total, l, k ? "true" : "false", res[k][0], res[k][1], res[k][2]);
        else
            printf("load of %s, %s layout %s on %u ranks: %.3f s with the digest check, %.3f s without: %+.2f%% "
                   "(median of %d alternating rounds' ratios; goal <= +5%%)  %s\n",
                   sz, k ? "resharded to" : "saved", l, tsr_layout_size(&runs[k].l), res[k][0], res[k][1],
                   (res[k][2] - 1) * 100, rounds, res[k][2] <= DIGEST_LOAD_GOAL ? "ok" : "MISSED");
    }
    return 0;
}

int tsr_cmd_bench_load(int argc, char **argv) {
    const char *dir = NULL, *layout = NULL, *v;
    uint64_t rounds = 5;
    int json = 0, cold = 0, digests = 0;
    for (int i = 1; i < argc; i++) {
        int r;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return fputs(load_help, stdout), EXIT_OK;
        if (tsr_opt(argc, argv, &i, "cold", 0, &v)) {
            cold = 1;
            continue;
        }
        if (tsr_opt(argc, argv, &i, "digests", 0, &v)) {
            digests = 1;
            continue;
        }
        if ((r = tsr_opt(argc, argv, &i, "layout", 1, &v))) {
            if (r < 0) return EXIT_USAGE;
            layout = v;
        } else if ((r = tsr_opt(argc, argv, &i, "rounds", 1, &v))) {
            if (r < 0 || tsr_parse_u64(v, &rounds) || !rounds || rounds > 100)
                return tsr_usage_error("bench load", "--rounds takes 1 to 100");
        } else if (tsr_opt(argc, argv, &i, "json", 0, &v)) {
            json = 1;
        } else if (argv[i][0] == '-') {
            return tsr_usage_error("bench load", "unknown option %s", argv[i]);
        } else if (!dir) {
            dir = argv[i];
        } else {
            return tsr_usage_error("bench load", "one DIR only");
        }
    }
    if (!dir || !layout) return tsr_usage_error("bench load", "needs DIR and --layout L");
    tsr_comm *world = tsr_cli_comm("bench load");
    if (!world) return EXIT_FAIL;
    uint32_t rank = tsr_comm_rank(world), ranks = tsr_comm_size(world);
    tsr_error e = {0};
    tsr_ckpt *ck = tsr_ckpt_open(dir, &e);
    if (!ck) {
        fprintf(stderr, "tessera bench load: %s\n", e.msg);
        tsr_comm_free(world);
        return EXIT_FAIL;
    }
    layout_run runs[2] = {{.l = tsr_ckpt_layout(ck)}, {.l = {1, 1, 1, 1, 0, 0}}};
    if (tsr_layout_parse(layout, &runs[1].l, &e)) {
        tsr_ckpt_close(ck);
        tsr_comm_free(world);
        return tsr_usage_error("bench load", "%s", e.msg);
    }
    runs[1].l.n_layers = runs[0].l.n_layers;
    if (tsr_layout_size(&runs[0].l) > ranks || tsr_layout_size(&runs[1].l) > ranks) {
        tsr_ckpt_close(ck);
        tsr_comm_free(world);
        return tsr_usage_error("bench load", "the layouts need %u and %u ranks; this job has %u",
                               tsr_layout_size(&runs[0].l), tsr_layout_size(&runs[1].l), ranks);
    }
    size_t nt = tsr_ckpt_n_tensors(ck);
    tsr_tensor_decl *t = calloc(nt + 1, sizeof *t);
    uint64_t total = 0, stored = 0;
    for (size_t f = 0; f < tsr_ckpt_n_frames(ck); f++) {
        tsr_frame_info fi;
        if (!tsr_ckpt_frame(ck, f, &fi)) stored += fi.stored_size;
    }
    for (size_t i = 0; t && i < nt; i++) {
        tsr_tensor_info ti;
        tsr_ckpt_tensor(ck, i, &ti);
        t[i] = (tsr_tensor_decl){ti.name, ti.group, ti.dtype, ti.ndim, {0}, ti.placement};
        memcpy(t[i].shape, ti.shape, sizeof t[i].shape);
        total += ti.raw_bytes;
    }
    int rc = t ? 0 : -1;
    for (int k = 0; k < 2 && !rc; k++) rc = prepare(&runs[k], world, t, nt, &e);
    int64_t ok = rc == 0;
    tsr_comm_allreduce_min(world, &ok, NULL);
    double warm = 0;
    if (ok && timed_load(&runs[0], world, dir, t, nt, cold, 0, &warm, &e)) ok = 0;
    if (digests) {
        if (ok) ok = digest_loads(runs, world, dir, t, nt, cold, (int)rounds, json, total, &e) == 0;
    } else {
        for (uint64_t r = 0; ok && r < rounds; r++)
            for (int k = 0; k < 2 && ok; k++) {
                double s;
                if (timed_load(&runs[k], world, dir, t, nt, cold, 0, &s, &e)) ok = 0;
                else if (s < runs[k].best) runs[k].best = s;
            }
    }
    if (!ok) fprintf(stderr, "tessera bench load: rank %u: %s\n", rank, e.msg[0] ? e.msg : "failed");
    if (ok && rank == 0 && !digests) {
        char a[64], b[64], sz[32];
        tsr_layout_format(&runs[0].l, a, sizeof a);
        tsr_layout_format(&runs[1].l, b, sizeof b);
        double ratio = runs[1].best / runs[0].best;
        if (json)
            printf("{\"bytes\":%llu,\"stored_bytes\":%llu,\"cold\":%s,\"saved_layout\":\"%s\",\"saved_s\":%.4f,"
                   "\"other_layout\":\"%s\",\"other_s\":%.4f,\"ratio\":%.3f}\n",
                   (unsigned long long)total, (unsigned long long)stored, cold ? "true" : "false", a, runs[0].best,
                   b, runs[1].best, ratio);
        else
            printf("load of %s: saved layout %s on %u ranks %.3f s; layout %s on %u ranks %.3f s: "
                   "%.2fx (goal <= 1.15)  %s\n",
                   tsr_fmt_bytes(total, sz, sizeof sz), a, tsr_layout_size(&runs[0].l), runs[0].best, b,
                   tsr_layout_size(&runs[1].l), runs[1].best, ratio, ratio <= 1.15 ? "ok" : "MISSED");
    }
    for (int k = 0; k < 2; k++) {
        for (size_t i = 0; runs[k].sb && i < runs[k].n; i++) {
            size_t bytes = tsr_box_volume(&runs[k].sb[i].box) * tsr_dtype_size(t[runs[k].sb[i].tensor].dtype);
            munmap(runs[k].sb[i].data, bytes ? bytes : 1);
        }
        free(runs[k].sb);
        free(runs[k].boxes);
        tsr_comm_free(runs[k].comm);
    }
    free(t);
    tsr_ckpt_close(ck);
    tsr_comm_free(world);
    return ok ? EXIT_OK : EXIT_FAIL;
}

/* ------------------------------------------------------------------ disk */

static const char disk_help[] =
    "usage: tessera bench disk --dir DIR [--bytes SIZE] [--json]\n"
    "The disk's sequential O_DIRECT bandwidth in DIR, as the other benchmarks'\n"
    "baseline: SIZE (default 1G) of random bytes written in 1 MiB writes and\n"
    "fsynced (best of two), then read back in 1 MiB reads; and the memory's: a\n"
    "memcpy of the same bytes on one thread (best of three).\n";

/* Sequential O_DIRECT read bandwidth of the probe file disk_bandwidth left. */
static double read_bandwidth(const char *dir, uint8_t *buf, size_t bytes) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/disk-probe-0.tmp", dir);
    int fd = open(path, O_RDONLY | O_DIRECT);
    if (fd < 0) fd = open(path, O_RDONLY);
    if (fd < 0) return 0;
    size_t chunk = 1 << 20, done = 0;
    double t0 = tsr_now();
    for (; done + chunk <= bytes; done += chunk)
        if (pread(fd, buf + done, chunk, (off_t)done) != (ssize_t)chunk) break;
    double bw = (double)done / (tsr_now() - t0);
    close(fd);
    return bw;
}

int tsr_cmd_bench_disk(int argc, char **argv) {
    const char *dir = NULL, *v;
    uint64_t bytes = 1ull << 30;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        int r;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return fputs(disk_help, stdout), EXIT_OK;
        if ((r = tsr_opt(argc, argv, &i, "dir", 1, &v))) {
            if (r < 0) return EXIT_USAGE;
            dir = v;
        } else if ((r = tsr_opt(argc, argv, &i, "bytes", 1, &v))) {
            if (r < 0 || tsr_parse_size(v, &bytes) || bytes < (1u << 20) || bytes > (64ull << 30))
                return tsr_usage_error("bench disk", "--bytes takes 1M to 64G");
        } else if (tsr_opt(argc, argv, &i, "json", 0, &v)) {
            json = 1;
        } else {
            return tsr_usage_error("bench disk", "unknown argument %s", argv[i]);
        }
    }
    if (!dir) return tsr_usage_error("bench disk", "needs --dir DIR");
    mkdir(dir, 0755);
    size_t n = (size_t)bytes & ~(size_t)((1 << 20) - 1);
    uint8_t *noise = alloc_populated(n);
    if (!noise) {
        fprintf(stderr, "tessera bench disk: cannot allocate %zu bytes\n", n);
        return EXIT_FAIL;
    }
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i + 8 <= n; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(noise + i, &x, 8);
    }
    double w = disk_bandwidth(dir, noise, n), r = read_bandwidth(dir, noise, n), m = 0;
    probe_cleanup(dir);
    uint8_t *copy = alloc_populated(n);
    for (int k = 0; copy && k < 3; k++) {
        double t0 = tsr_now();
        memcpy(copy, noise, n);
        double bw = (double)n / (tsr_now() - t0);
        if (bw > m) m = bw;
    }
    if (copy) munmap(copy, n);
    munmap(noise, n);
    if (json) printf("{\"bytes\":%zu,\"write_Bps\":%.0f,\"read_Bps\":%.0f,\"memcpy_Bps\":%.0f}\n", n, w, r, m);
    else
        printf("disk in %s: write %.0f MB/s, read %.0f MB/s (O_DIRECT, 1 MiB, %zu MiB); memcpy %.0f MB/s\n", dir,
               w / 1e6, r / 1e6, n >> 20, m / 1e6);
    return w > 0 && r > 0 && m > 0 ? EXIT_OK : EXIT_FAIL;
}
