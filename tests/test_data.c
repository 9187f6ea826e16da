/* test_data.c: token shards (write, read back, every header fault named with its
 * file), the byte tokenizer, the generated corpus (deterministic, consistent,
 * structured) and the data loader (every sample once per epoch, a seeded order,
 * the same global batch on 1..4 ranks, exact resume, batches across epochs). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "corpus.h"
#include "data.h"
#include "tessera.h"
#include "tokens.h"

static tsr_error e;
static char tmp[512];

static void path_of(char *out, size_t len, const char *name) { snprintf(out, len, "%s/%s", tmp, name); }

static uint8_t *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    REQUIRE(f, "open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc((size_t)n + 1);
    REQUIRE(p && fread(p, 1, (size_t)n, f) == (size_t)n, "read %s", path);
    fclose(f);
    *len = (size_t)n;
    return p;
}

static void spit(const char *path, const uint8_t *p, size_t len) {
    FILE *f = fopen(path, "wb");
    REQUIRE(f && fwrite(p, 1, len, f) == len && fclose(f) == 0, "write %s", path);
}

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* ---------------------------------------------------------------- shards */

static void test_roundtrip(void) {
    uint32_t tok[1000];
    for (int i = 0; i < 1000; i++) tok[i] = (uint32_t)(i * 65 + 3) % 65536;
    char p16[600], p32[600];
    path_of(p16, sizeof p16, "rt16.bin");
    path_of(p32, sizeof p32, "rt32.bin");
    CHECK_OK(tsr_tokens_write(p16, tok, 1000, 2, &e));
    for (int i = 0; i < 1000; i++) tok[i] = 0xfedc0000u + (uint32_t)i * 7919u;
    CHECK_OK(tsr_tokens_write(p32, tok, 1000, 4, &e));

    // the bytes on disk are llm.c's: magic, version, count, zeros, tokens
    size_t len;
    uint8_t *b = slurp(p16, &len);
    CHECK(len == 1024 + 2000, "uint16 shard is %zu bytes", len);
    CHECK(le32(b) == 20240520 && le32(b + 4) == 1 && le32(b + 8) == 1000, "uint16 header %u %u %u", le32(b),
          le32(b + 4), le32(b + 8));
    int zeros = 1;
    for (int i = 12; i < 1024; i++) zeros &= b[i] == 0;
    CHECK(zeros, "header[3..255] are zero");
    CHECK(b[1024 + 2 * 5] == (5 * 65 + 3) % 256 && b[1024 + 2 * 5 + 1] == (5 * 65 + 3) / 256, "token 5 little-endian");
    free(b);
    b = slurp(p32, &len);
    CHECK(len == 1024 + 4000, "uint32 shard is %zu bytes", len);
    CHECK(le32(b) == 20240801 && le32(b + 4) == 7 && le32(b + 8) == 1000, "uint32 header %u %u %u", le32(b),
          le32(b + 4), le32(b + 8));
    CHECK(le32(b + 1024 + 4 * 999) == 0xfedc0000u + 999u * 7919u, "last uint32 token");
    free(b);

    tsr_token_shard *s;
    CHECK_OK(tsr_tokens_open(p16, &s, &e));
    if (s) {
        CHECK(tsr_tokens_count(s) == 1000 && tsr_tokens_width(s) == 2, "count %zu width %d", tsr_tokens_count(s),
              tsr_tokens_width(s));
        int bad = -1;
        for (int i = 0; i < 1000 && bad < 0; i++)
            if (tsr_tokens_get(s, (size_t)i) != (uint32_t)(i * 65 + 3) % 65536) bad = i;
        CHECK(bad < 0, "uint16 token %d reads back wrong", bad);
        CHECK(strcmp(tsr_tokens_path(s), p16) == 0, "path");
        CHECK_OK(tsr_tokens_check(s, 65536, &e));
        CHECK(tsr_tokens_check(s, 60000, &e) == TSR_ECORRUPT && strstr(e.msg, p16) && strstr(e.msg, "vocabulary"),
              "a token >= vocab is named: %s", e.msg);
        tsr_tokens_close(s);
    }
    CHECK_OK(tsr_tokens_open(p32, &s, &e));
    if (s) {
        CHECK(tsr_tokens_count(s) == 1000 && tsr_tokens_width(s) == 4, "uint32 count/width");
        int bad = -1;
        for (int i = 0; i < 1000 && bad < 0; i++)
            if (tsr_tokens_get(s, (size_t)i) != 0xfedc0000u + (uint32_t)i * 7919u) bad = i;
        CHECK(bad < 0, "uint32 token %d reads back wrong", bad);
        tsr_tokens_close(s);
    }

    // an empty shard is valid
    char p0[600];
    path_of(p0, sizeof p0, "empty.bin");
    CHECK_OK(tsr_tokens_write(p0, NULL, 0, 2, &e));
    CHECK_OK(tsr_tokens_open(p0, &s, &e));
    if (s) {
        CHECK(tsr_tokens_count(s) == 0, "empty shard count");
        tsr_tokens_close(s);
    }

    // bad writes
    uint32_t big[2] = {5, 70000};
    char pb[600];
    path_of(pb, sizeof pb, "big.bin");
    CHECK(tsr_tokens_write(pb, big, 2, 2, &e) == TSR_EINVAL && strstr(e.msg, pb) && strstr(e.msg, "70000"),
          "a token over 65535 in a uint16 shard: %s", e.msg);
    CHECK(access(pb, F_OK) != 0, "nothing written for a refused shard");
    CHECK(tsr_tokens_write(pb, big, 2, 3, &e) == TSR_EINVAL && strstr(e.msg, pb), "width 3: %s", e.msg);
    char pn[600];
    path_of(pn, sizeof pn, "no/such/dir/x.bin");
    CHECK(tsr_tokens_write(pn, big, 1, 2, &e) != 0 && strstr(e.msg, "no/such/dir"), "unwritable path: %s", e.msg);
}

/* Writes `bytes` as a file, opens it as a shard, and expects status `want` and
 * a message holding the file name and `why`. */
static void expect_bad(const char *name, const uint8_t *bytes, size_t len, int want, const char *why) {
    char p[600];
    path_of(p, sizeof p, name);
    spit(p, bytes, len);
    tsr_token_shard *s = (tsr_token_shard *)1;
    e = (tsr_error){0};
    int rc = tsr_tokens_open(p, &s, &e);
    CHECK(rc == want && s == NULL, "%s: status %d (%s), expected %d", name, rc, e.msg, want);
    CHECK(strstr(e.msg, p) && strstr(e.msg, why), "%s: message '%s' names the file and '%s'", name, e.msg, why);
}

static void test_corruption(void) {
    uint32_t tok[100];
    for (int i = 0; i < 100; i++) tok[i] = (uint32_t)i;
    char good[600];
    path_of(good, sizeof good, "good.bin");
    CHECK_OK(tsr_tokens_write(good, tok, 100, 2, &e));
    size_t len;
    uint8_t *g = slurp(good, &len);
    uint8_t *b = malloc(len + 16);
    REQUIRE(b, "malloc");

    memcpy(b, g, len), put32(b, 20240521);
    expect_bad("magic.bin", b, len, TSR_ECORRUPT, "bad magic");
    memcpy(b, g, len), put32(b + 4, 2);
    expect_bad("version.bin", b, len, TSR_EVERSION, "bad version");
    memcpy(b, g, len), put32(b + 4, 7); /* the uint32 version with the uint16 magic */
    expect_bad("version7.bin", b, len, TSR_EVERSION, "bad version");
    memcpy(b, g, len);
    expect_bad("short.bin", b, len - 1, TSR_ECORRUPT, "truncated");
    expect_bad("header.bin", b, 1000, TSR_ECORRUPT, "truncated");
    expect_bad("nothing.bin", b, 0, TSR_ECORRUPT, "truncated");
    memcpy(b, g, len), put32(b + 8, 101);
    expect_bad("count.bin", b, len, TSR_ECORRUPT, "truncated");
    memcpy(b, g, len), put32(b + 8, 99);
    expect_bad("long.bin", b, len, TSR_ECORRUPT, "does not match the file size");
    memcpy(b, g, len), memset(b + len, 0, 16);
    expect_bad("tail.bin", b, len + 16, TSR_ECORRUPT, "does not match the file size");
    memcpy(b, g, len), put32(b + 8, 0x80000000u);
    expect_bad("negative.bin", b, len, TSR_ECORRUPT, "count");
    free(b);
    free(g);

    char missing[600];
    path_of(missing, sizeof missing, "missing.bin");
    tsr_token_shard *s;
    CHECK(tsr_tokens_open(missing, &s, &e) == TSR_ENOTFOUND && strstr(e.msg, missing), "missing file: %s", e.msg);
    CHECK(tsr_tokens_open(tmp, &s, &e) != 0 && strstr(e.msg, tmp), "a directory is not a shard: %s", e.msg);
}

static void test_tokenizer(void) {
    const char text[] = "ab\x1e\xff";
    uint32_t out[4];
    tsr_byte_tokenize(text, 4, TSR_CORPUS_DOC_SEP, out);
    CHECK(out[0] == 'a' && out[1] == 'b' && out[2] == TSR_BYTE_EOT && out[3] == 255, "tokens %u %u %u %u", out[0],
          out[1], out[2], out[3]);
    tsr_byte_tokenize(text, 4, -1, out);
    CHECK(out[2] == 0x1e, "doc_sep -1 keeps every byte");
    CHECK(TSR_BYTE_VOCAB == 257 && TSR_BYTE_EOT == 256, "byte vocabulary");
}

/* ---------------------------------------------------------------- corpus */

/* Entropy in bits per byte of an order-k model fitted to the text (k <= 2). */
static double entropy(const uint8_t *t, size_t n, int k) {
    size_t nctx = k == 0 ? 1 : k == 1 ? 256 : 65536;
    uint32_t *joint = calloc(nctx * 256, sizeof *joint), *ctx = calloc(nctx, sizeof *ctx);
    REQUIRE(joint && ctx, "malloc");
    for (size_t i = (size_t)k; i < n; i++) {
        size_t c = k == 0 ? 0 : k == 1 ? t[i - 1] : (size_t)t[i - 2] << 8 | t[i - 1];
        joint[c * 256 + t[i]]++;
        ctx[c]++;
    }
    double h = 0, total = (double)(n - (size_t)k);
    for (size_t c = 0; c < nctx; c++)
        for (int x = 0; x < 256; x++)
            if (joint[c * 256 + x]) h -= joint[c * 256 + x] / total * log2((double)joint[c * 256 + x] / ctx[c]);
    free(joint);
    free(ctx);
    return h;
}

static void test_corpus(void) {
    char *a, *b, *c;
    size_t na, nb, nc;
    size_t N = 1 << 20;
    CHECK_OK(tsr_corpus_generate(7, N, &a, &na, &e));
    CHECK_OK(tsr_corpus_generate(7, N / 3, &b, &nb, &e));
    CHECK_OK(tsr_corpus_generate(8, N, &c, &nc, &e));
    REQUIRE(a && b && c, "corpus: %s", e.msg);
    CHECK(na == N && nb == N / 3 && nc == N && a[N] == 0, "exact lengths %zu %zu %zu", na, nb, nc);
    CHECK(memcmp(a, b, nb) == 0, "a shorter corpus of a seed is a prefix of a longer one");
    char *a2;
    size_t na2;
    CHECK_OK(tsr_corpus_generate(7, N, &a2, &na2, &e));
    CHECK(a2 && na2 == N && memcmp(a, a2, N) == 0, "the same seed gives the same text");
    free(a2);
    size_t same = 0;
    for (size_t i = 0; i < N; i++) same += a[i] == c[i];
    CHECK(same < N / 4, "another seed gives another text (%zu of %zu bytes equal)", same, N);

    // bytes: printable ASCII, newlines and document separators, nothing else
    size_t docs = 0, bad = 0;
    for (size_t i = 0; i < N; i++) {
        unsigned char x = (unsigned char)a[i];
        docs += x == TSR_CORPUS_DOC_SEP;
        bad += !(x == '\n' || x == TSR_CORPUS_DOC_SEP || (x >= 32 && x < 127));
    }
    CHECK(bad == 0, "%zu bytes outside printable ASCII", bad);
    CHECK(docs > 1000, "%zu documents in 1 MiB", docs);

    // structure: order-2 entropy well below order-0, and order-0 that of text
    double h0 = entropy((uint8_t *)a, N, 0), h1 = entropy((uint8_t *)a, N, 1), h2 = entropy((uint8_t *)a, N, 2);
    printf("corpus entropy, bits/byte: order-0 %.3f, order-1 %.3f, order-2 %.3f\n", h0, h1, h2);
    CHECK(h0 > 3.5 && h0 < 5.5, "order-0 entropy %.3f is not that of text", h0);
    CHECK(h2 < h0 - 2.0 && h1 < h0 - 0.8, "order-2 entropy %.3f not well below order-0 %.3f", h2, h0);

    // every sum is right, and there are many of them
    int sums = 0, wrong = 0;
    for (char *p = a; (p = strchr(p, '\n')); p++) {
        unsigned x, y, z;
        char op;
        int used = 0;
        if (sscanf(p + 1, "%u %c %u = %u%n", &x, &op, &y, &z, &used) == 4 && used > 0 && p[1 + used] == '\n') {
            sums++;
            unsigned want = op == '+' ? x + y : op == '-' ? x - y : op == '*' ? x * y : ~0u;
            if (want != z) wrong++;
        }
    }
    CHECK(sums > 1000 && wrong == 0, "%d sums, %d wrong", sums, wrong);

    // facts hold: a person always lives in the same town
    int facts = 0, contradictions = 0;
    char who[64][16], where[64][24];
    int nwho = 0;
    for (char *p = a; (p = strstr(p, " lives in ")); p++) {
        char *s = p;
        while (s > a && s[-1] != '\n' && s[-1] != ' ' && s[-1] != '"') s--;
        char name[16] = {0}, town[24] = {0};
        if (p - s <= 0 || p - s >= 16 || s[0] < 'A' || s[0] > 'Z') continue; /* not "who lives in" */
        memcpy(name, s, (size_t)(p - s));
        if (sscanf(p + 10, "%23[A-Za-z]", town) != 1) continue;
        facts++;
        int k = 0;
        while (k < nwho && strcmp(who[k], name)) k++;
        if (k == nwho && nwho < 64) snprintf(who[nwho], 16, "%s", name), snprintf(where[nwho++], 24, "%s", town);
        else if (k < nwho && strcmp(where[k], town)) contradictions++;
    }
    CHECK(facts > 100 && contradictions == 0, "%d 'lives in' facts, %d contradictions", facts, contradictions);

    free(a);
    free(b);
    free(c);
    char *z;
    size_t nz;
    CHECK_OK(tsr_corpus_generate(1, 0, &z, &nz, &e));
    CHECK(z && nz == 0 && z[0] == 0, "an empty corpus");
    free(z);
}

/* ---------------------------------------------------------------- loader */

#define T_LEN 7

/* A split of tokens 0..n-1 (uint32, token = stream index) over shards of the
 * given sizes in dir/NAME. */
static void write_split(const char *dir, const char *prefix, const size_t *sizes, int n_shards) {
    mkdir(dir, 0755);
    uint32_t next = 0;
    for (int s = 0; s < n_shards; s++) {
        uint32_t *t = malloc((sizes[s] + 1) * sizeof *t);
        REQUIRE(t, "malloc");
        for (size_t i = 0; i < sizes[s]; i++) t[i] = next++;
        char p[700];
        snprintf(p, sizeof p, "%s/%s_%06d.bin", dir, prefix, s);
        CHECK_OK(tsr_tokens_write(p, t, sizes[s], 4, &e));
        free(t);
    }
}

/* One rank's batch at *pos; fails the test on error. */
static void batch(tsr_loader *l, tsr_data_pos *pos, int B, int r, int D, int *inp, int *tgt) {
    int rc = tsr_loader_next(l, pos, B, r, D, inp, tgt, &e);
    REQUIRE(rc == 0, "tsr_loader_next: %s", e.msg);
}

static void test_loader(void) {
    char dir[600];
    path_of(dir, sizeof dir, "split");
    // 1001 tokens over uneven shards and an empty one: S = 1000 / 7 = 142
    size_t sizes[] = {300, 0, 401, 17, 283};
    write_split(dir, "train", sizes, 5);
    size_t vsizes[] = {50};
    write_split(dir, "val", vsizes, 1);
    tsr_loader *l;
    CHECK_OK(tsr_loader_open(dir, "train", T_LEN, &l, &e));
    REQUIRE(l, "open: %s", e.msg);
    uint64_t S = tsr_loader_samples(l);
    CHECK(S == 142 && tsr_loader_tokens(l) == 1001 && tsr_loader_shards(l) == 5 && tsr_loader_seq_len(l) == T_LEN,
          "S %llu N %llu shards %d", (unsigned long long)S, (unsigned long long)tsr_loader_tokens(l),
          tsr_loader_shards(l));

    // every sample once per epoch, its tokens right (across shard edges), for
    // three epochs with batches that straddle the epoch ends (142 = 3*40 + 22)
    enum { B = 8, D = 5 };
    int inp[B * D * T_LEN], tgt[B * D * T_LEN];
    tsr_data_pos pos = {0, 0, 42};
    int seen[3][142] = {{0}};
    uint64_t u = 0; /* global sample counter */
    int wrong = 0;
    while (u < 3 * S) {
        for (int r = 0; r < D; r++) {
            tsr_data_pos p = pos;
            batch(l, &p, B, r, D, inp + r * B * T_LEN, tgt + r * B * T_LEN);
            if (r == D - 1) pos = p;
        }
        for (int k = 0; k < B * D; k++, u++) {
            int first = inp[k * T_LEN];
            uint64_t i = (uint64_t)first / T_LEN;
            for (int j = 0; j < T_LEN; j++)
                wrong += inp[k * T_LEN + j] != first + j || tgt[k * T_LEN + j] != first + j + 1;
            if (first % T_LEN || i >= S) wrong++;
            else if (u < 3 * S) seen[u / S][i]++;
        }
        CHECK(pos.epoch == u / S && pos.sample == u % S, "position (%llu, %llu) after %llu samples",
              (unsigned long long)pos.epoch, (unsigned long long)pos.sample, (unsigned long long)u);
    }
    CHECK(wrong == 0, "%d samples with wrong tokens", wrong);
    int missed = 0;
    for (int ep = 0; ep < 3; ep++)
        for (uint64_t i = 0; i < S; i++) missed += seen[ep][i] != 1;
    CHECK(missed == 0, "%d (epoch, sample) pairs not visited exactly once", missed);

    // the order depends on seed and epoch, and is not the identity
    int same_epoch = 0, same_seed = 0, fixed = 0;
    for (uint64_t k = 0; k < S; k++) {
        uint64_t x = tsr_loader_sample_at(l, 42, 0, k);
        same_epoch += x == tsr_loader_sample_at(l, 42, 1, k);
        same_seed += x == tsr_loader_sample_at(l, 43, 0, k);
        fixed += x == k;
        CHECK(x == tsr_loader_sample_at(l, 42, 0, k), "the order is a function");
    }
    CHECK(same_epoch < 20 && same_seed < 20 && fixed < 20, "orders agree too often: %d %d %d", same_epoch, same_seed,
          fixed);

    // the same global batch on 1, 2, 3, 4 ranks (B*D = 12), for 30 steps
    for (int Dn = 2; Dn <= 4; Dn++) {
        int Bn = 12 / Dn, diff = 0;
        tsr_data_pos p1 = {0, 130, 9}, pd = p1;
        int one[12 * T_LEN], one_t[12 * T_LEN], many[12 * T_LEN], many_t[12 * T_LEN];
        for (int step = 0; step < 30; step++) {
            batch(l, &p1, 12, 0, 1, one, one_t);
            tsr_data_pos next = pd;
            for (int r = 0; r < Dn; r++) { /* every rank advances to the same position */
                tsr_data_pos p = pd;
                batch(l, &p, Bn, r, Dn, many + r * Bn * T_LEN, many_t + r * Bn * T_LEN);
                if (r == 0) next = p;
                else diff += memcmp(&p, &next, sizeof p) != 0;
            }
            pd = next;
            diff += memcmp(one, many, sizeof one) != 0 || memcmp(one_t, many_t, sizeof one_t) != 0;
            diff += memcmp(&p1, &pd, sizeof p1) != 0;
        }
        CHECK(diff == 0, "%d ranks: %d steps differ from 1 rank", Dn, diff);
    }

    // resume from a copied position (through its encoded form, on a new loader)
    {
        tsr_data_pos p = {0, 0, 5};
        int a[3 * T_LEN], at[3 * T_LEN], b2[3 * T_LEN], bt[3 * T_LEN];
        for (int i = 0; i < 50; i++) batch(l, &p, 3, 1, 2, a, at);
        uint8_t enc[TSR_DATA_POS_BYTES];
        tsr_data_pos_encode(&p, enc);
        int ref[20][3 * T_LEN];
        for (int i = 0; i < 20; i++) batch(l, &p, 3, 1, 2, ref[i], at);
        tsr_loader *l2;
        CHECK_OK(tsr_loader_open(dir, "train", T_LEN, &l2, &e));
        tsr_data_pos q;
        tsr_data_pos_decode(enc, &q);
        int diff = 0;
        for (int i = 0; l2 && i < 20; i++) {
            batch(l2, &q, 3, 1, 2, b2, bt);
            diff += memcmp(ref[i], b2, sizeof b2) != 0;
        }
        CHECK(diff == 0 && memcmp(&p, &q, sizeof p) == 0, "resumed batches differ: %d", diff);
        tsr_loader_close(l2);
    }

    // a batch across the end of an epoch: the last 3 of epoch 4, the first 5 of 5
    {
        tsr_data_pos p = {4, S - 3, 11};
        int a[8 * T_LEN], at[8 * T_LEN];
        batch(l, &p, 8, 0, 1, a, at);
        CHECK(p.epoch == 5 && p.sample == 5, "after the straddling batch: (%llu, %llu)", (unsigned long long)p.epoch,
              (unsigned long long)p.sample);
        int bad = 0;
        for (int k = 0; k < 8; k++) {
            uint64_t want = k < 3 ? tsr_loader_sample_at(l, 11, 4, S - 3 + (uint64_t)k)
                                  : tsr_loader_sample_at(l, 11, 5, (uint64_t)k - 3);
            bad += (uint64_t)a[k * T_LEN] != want * T_LEN;
        }
        CHECK(bad == 0, "%d samples of the straddling batch are wrong", bad);
        // a global batch longer than an epoch: 2*S + 3 samples
        int *big = malloc((2 * S + 3) * T_LEN * sizeof *big), *bigt = malloc((2 * S + 3) * T_LEN * sizeof *bigt);
        REQUIRE(big && bigt, "malloc");
        tsr_data_pos q = {0, 1, 3};
        batch(l, &q, (int)(2 * S + 3), 0, 1, big, bigt);
        CHECK(q.epoch == 2 && q.sample == 4, "after 2S+3 samples from (0,1): (%llu, %llu)",
              (unsigned long long)q.epoch, (unsigned long long)q.sample);
        CHECK((uint64_t)big[(S + 5) * T_LEN] == tsr_loader_sample_at(l, 3, 1, 6) * T_LEN, "sample S+5 of the batch");
        free(big);
        free(bigt);
    }

    // bad calls leave the position alone
    {
        tsr_data_pos p = {0, S, 1}, keep = p;
        CHECK(tsr_loader_next(l, &p, 2, 0, 1, inp, tgt, &e) == TSR_EINVAL && strstr(e.msg, dir), "sample >= S: %s",
              e.msg);
        p.sample = 3, keep = p;
        CHECK(tsr_loader_next(l, &p, 2, 2, 2, inp, tgt, &e) == TSR_EINVAL, "rank 2 of 2");
        CHECK(tsr_loader_next(l, &p, 0, 0, 1, inp, tgt, &e) == TSR_EINVAL, "B = 0");
        tsr_loader_set_vocab(l, 900);
        int rc = 0;
        for (int i = 0; i < 200 && rc == 0; i++) rc = tsr_loader_next(l, &p, 1, 0, 1, inp, tgt, &e);
        CHECK(rc == TSR_ECORRUPT && strstr(e.msg, "train_00000") && strstr(e.msg, "vocabulary"),
              "a token >= vocab names its shard: %s", e.msg);
        tsr_loader_set_vocab(l, 1001);
        keep.sample = 0, p = keep;
        int err_count = 0;
        for (int i = 0; i < 200; i++) err_count += tsr_loader_next(l, &p, 1, 0, 1, inp, tgt, &e) != 0;
        CHECK(err_count == 0, "vocab 1001 admits tokens 0..1000");
    }
    tsr_loader_close(l);

    // the val split of the same directory, a glob, one file
    CHECK_OK(tsr_loader_open(dir, "val", T_LEN, &l, &e));
    if (l) {
        CHECK(tsr_loader_tokens(l) == 50 && tsr_loader_samples(l) == 7, "val split");
        tsr_loader_close(l);
    }
    char pat[700];
    snprintf(pat, sizeof pat, "%s/train_*.bin", dir);
    CHECK_OK(tsr_loader_open(pat, NULL, T_LEN, &l, &e));
    if (l) {
        CHECK(tsr_loader_tokens(l) == 1001 && tsr_loader_shards(l) == 5, "glob");
        tsr_loader_close(l);
    }
    snprintf(pat, sizeof pat, "%s/train_000002.bin", dir);
    CHECK_OK(tsr_loader_open(pat, "ignored", T_LEN, &l, &e));
    if (l) {
        CHECK(tsr_loader_tokens(l) == 401, "one file");
        tsr_loader_close(l);
    }

    // llm.c's names: fineweb_val_000000.bin, tiny_shakespeare_val.bin; not "interval"
    char d2[600];
    path_of(d2, sizeof d2, "llmc");
    size_t s1[] = {20};
    write_split(d2, "fineweb_val", s1, 1);
    char p[700], q[700];
    snprintf(p, sizeof p, "%s/fineweb_val_000000.bin", d2);
    snprintf(q, sizeof q, "%s/tiny_shakespeare_val.bin", d2);
    REQUIRE(rename(p, q) == 0, "rename");
    write_split(d2, "fineweb_val", s1, 1);
    write_split(d2, "interval", s1, 1);
    CHECK_OK(tsr_loader_open(d2, "val", T_LEN, &l, &e));
    if (l) {
        CHECK(tsr_loader_shards(l) == 2 && tsr_loader_tokens(l) == 40, "llm.c names: %d shards", tsr_loader_shards(l));
        tsr_loader_close(l);
    }

    // errors name what is missing or bad
    char nodir[600];
    path_of(nodir, sizeof nodir, "no-such-dir");
    CHECK(tsr_loader_open(nodir, "train", T_LEN, &l, &e) == TSR_ENOTFOUND && !l && strstr(e.msg, nodir),
          "missing dir: %s", e.msg);
    CHECK(tsr_loader_open(dir, "test", T_LEN, &l, &e) == TSR_ENOTFOUND && strstr(e.msg, dir) && strstr(e.msg, "test"),
          "missing split: %s", e.msg);
    snprintf(pat, sizeof pat, "%s/nothing_*.bin", dir);
    CHECK(tsr_loader_open(pat, NULL, T_LEN, &l, &e) == TSR_ENOTFOUND && strstr(e.msg, pat), "empty glob: %s", e.msg);
    CHECK(tsr_loader_open(dir, "val", 50, &l, &e) == TSR_EINVAL && strstr(e.msg, "50 tokens"), "T too long: %s",
          e.msg);
    CHECK(tsr_loader_open(dir, "train", 0, &l, &e) == TSR_EINVAL, "T = 0");
    snprintf(p, sizeof p, "%s/train_000003.bin", dir);
    size_t len;
    uint8_t *bytes = slurp(p, &len);
    spit(p, bytes, len - 2);
    free(bytes);
    CHECK(tsr_loader_open(dir, "train", T_LEN, &l, &e) == TSR_ECORRUPT && strstr(e.msg, p) && strstr(e.msg, "truncated"),
          "a truncated shard is named: %s", e.msg);
}

/* The order is a permutation for many sizes, including large ones. */
static void test_permutation(void) {
    char p[600];
    path_of(p, sizeof p, "perm.bin");
    static uint32_t t[100001];
    CHECK_OK(tsr_tokens_write(p, t, 100001, 2, &e));
    tsr_loader *l;
    const int Ts[] = {1, 3, 17, 1000, 50000};
    for (size_t c = 0; c < sizeof Ts / sizeof Ts[0]; c++) {
        CHECK_OK(tsr_loader_open(p, NULL, Ts[c], &l, &e));
        if (!l) continue;
        uint64_t S = tsr_loader_samples(l);
        CHECK(S == 100000 / (uint64_t)Ts[c], "S %llu", (unsigned long long)S);
        uint8_t *hit = calloc(S, 1);
        uint64_t dup = 0, inversions = 0, prev = 0;
        for (uint64_t k = 0; k < S; k++) {
            uint64_t x = tsr_loader_sample_at(l, 1234, 7, k);
            if (x >= S || hit[x]++) dup++;
            inversions += k && x < prev;
            prev = x;
        }
        CHECK(dup == 0, "T %d: %llu samples out of range or repeated", Ts[c], (unsigned long long)dup);
        // a random order descends about half of the time
        CHECK(S < 10 || (inversions > S / 3 && inversions < 2 * S / 3), "T %d: %llu descents in %llu", Ts[c],
              (unsigned long long)inversions, (unsigned long long)S);
        free(hit);
        tsr_loader_close(l);
    }
}

int main(void) {
    const char *t = getenv("TSR_TMP");
    if (t) snprintf(tmp, sizeof tmp, "%s/data", t);
    else snprintf(tmp, sizeof tmp, "/tmp/tsr-test-data.%d", (int)getpid());
    mkdir(tmp, 0755);
    test_roundtrip();
    test_corruption();
    test_tokenizer();
    test_corpus();
    test_loader();
    test_permutation();
    return check_done();
}
