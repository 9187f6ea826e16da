/* data.c: the data loader (see data.h): shards of a split as one token stream,
 * samples at stride T, a seeded per-epoch order computed on demand, and global
 * batches sliced by data-parallel rank. */
#include "data.h"

#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common.h"
#include "tokens.h"

struct tsr_loader {
    char *where; /* the directory or pattern, for messages */
    tsr_token_shard **shards;
    int n_shards;
    uint64_t *start; /* start[i]: stream index of shard i's first token; start[n_shards] = N */
    uint64_t n_tokens, n_samples;
    int T;
    uint32_t vocab; /* 0: not set */
};

void tsr_data_pos_encode(const tsr_data_pos *pos, uint8_t out[TSR_DATA_POS_BYTES]) {
    tsr_st64(out, pos->epoch);
    tsr_st64(out + 8, pos->sample);
    tsr_st64(out + 16, pos->seed);
}

void tsr_data_pos_decode(const uint8_t in[TSR_DATA_POS_BYTES], tsr_data_pos *pos) {
    pos->epoch = tsr_ld64(in);
    pos->sample = tsr_ld64(in + 8);
    pos->seed = tsr_ld64(in + 16);
}

/* ------------------------------------------------------------ opening */

/* 1 when one of the '_'-separated words of `name` (".bin" removed) is `split`. */
static int name_has_split(const char *name, const char *split) {
    size_t n = strlen(name), k = strlen(split);
    if (n < 4 || strcmp(name + n - 4, ".bin") != 0) return 0;
    n -= 4;
    for (size_t i = 0; i + k <= n; i++) {
        if ((i == 0 || name[i - 1] == '_') && memcmp(name + i, split, k) == 0 && (i + k == n || name[i + k] == '_'))
            return 1;
    }
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void free_list(char **list, size_t n) {
    for (size_t i = 0; i < n; i++) free(list[i]);
    free(list);
}

/* The shard paths of a directory's split, sorted by name. */
static int list_dir(const char *dir, const char *split, char ***out, size_t *n_out, tsr_error *err) {
    if (!split || !*split) return tsr_err(err, TSR_EINVAL, "%s: a directory of shards needs a split name (train, val)", dir);
    DIR *d = opendir(dir);
    if (!d) {
        int e = errno;
        return tsr_err(err, e == ENOENT ? TSR_ENOTFOUND : TSR_EIO, "%s: cannot open the directory: %s", dir,
                       strerror(e));
    }
    char **list = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    struct dirent *de;
    while (!rc && (de = readdir(d))) {
        if (!name_has_split(de->d_name, split)) continue;
        size_t len = strlen(dir) + strlen(de->d_name) + 2;
        char *p = malloc(len);
        if (!p || tsr_grow((void **)&list, &cap, n, sizeof *list)) {
            free(p);
            rc = tsr_err(err, TSR_ENOMEM, "%s: out of memory listing shards", dir);
            break;
        }
        snprintf(p, len, "%s/%s", dir, de->d_name);
        list[n++] = p;
    }
    closedir(d);
    if (!rc && n == 0)
        rc = tsr_err(err, TSR_ENOTFOUND, "%s: no %s shards (files NAME.bin with '%s' as a _-separated word of NAME)",
                     dir, split, split);
    if (rc) {
        free_list(list, n);
        return rc;
    }
    tsr_sort(list, n, sizeof *list, cmp_str);
    *out = list;
    *n_out = n;
    return 0;
}

/* The files a glob pattern names, sorted. */
static int list_glob(const char *pattern, char ***out, size_t *n_out, tsr_error *err) {
    glob_t g;
    int r = glob(pattern, 0, NULL, &g);
    if (r == GLOB_NOMATCH) return tsr_err(err, TSR_ENOTFOUND, "%s: no shard file matches", pattern);
    if (r) return tsr_err(err, r == GLOB_NOSPACE ? TSR_ENOMEM : TSR_EIO, "%s: cannot expand the pattern", pattern);
    char **list = calloc(g.gl_pathc + 1, sizeof *list);
    size_t n = 0;
    for (; list && n < g.gl_pathc; n++)
        if (!(list[n] = strdup(g.gl_pathv[n]))) break;
    globfree(&g);
    if (!list || n < g.gl_pathc) {
        free_list(list, n);
        return tsr_err(err, TSR_ENOMEM, "%s: out of memory listing shards", pattern);
    }
    *out = list;
    *n_out = n;
    return 0;
}

int tsr_loader_open(const char *dir, const char *split, int T, tsr_loader **out, tsr_error *err) {
    *out = NULL;
    if (T < 1) return tsr_err(err, TSR_EINVAL, "%s: sequence length T = %d: must be at least 1", dir, T);
    char **paths = NULL;
    size_t n = 0;
    struct stat st;
    int rc;
    if (stat(dir, &st) == 0 && S_ISDIR(st.st_mode)) {
        rc = list_dir(dir, split, &paths, &n, err);
    } else if (strpbrk(dir, "*?[")) {
        rc = list_glob(dir, &paths, &n, err);
    } else if (stat(dir, &st) == 0) { /* one shard file */
        paths = calloc(1, sizeof *paths);
        if (paths && (paths[0] = strdup(dir))) n = 1;
        rc = n ? 0 : tsr_err(err, TSR_ENOMEM, "%s: out of memory", dir);
    } else {
        int e = errno;
        rc = tsr_err(err, e == ENOENT ? TSR_ENOTFOUND : TSR_EIO, "%s: no such directory or shard file: %s", dir,
                     strerror(e));
    }
    if (rc) return rc;
    if (n > INT_MAX) {
        free_list(paths, n);
        return tsr_err(err, TSR_EINVAL, "%s: %zu shards: too many", dir, n);
    }
    tsr_loader *l = calloc(1, sizeof *l);
    if (l) {
        l->where = strdup(dir);
        l->shards = calloc(n, sizeof *l->shards);
        l->start = calloc(n + 1, sizeof *l->start);
    }
    if (!l || !l->where || !l->shards || !l->start) {
        free_list(paths, n);
        tsr_loader_close(l);
        return tsr_err(err, TSR_ENOMEM, "%s: out of memory", dir);
    }
    l->T = T;
    for (size_t i = 0; i < n; i++) {
        if ((rc = tsr_tokens_open(paths[i], &l->shards[i], err))) break;
        l->n_shards++;
        l->start[i] = l->n_tokens;
        l->n_tokens += tsr_tokens_count(l->shards[i]);
    }
    l->start[l->n_shards] = l->n_tokens;
    free_list(paths, n);
    if (!rc && l->n_tokens < (uint64_t)T + 1)
        rc = tsr_err(err, TSR_EINVAL, "%s: %s%s%llu tokens in %d shard(s), fewer than the T+1 = %d of one sample",
                     dir, split ? split : "", split ? ": " : "", (unsigned long long)l->n_tokens, l->n_shards, T + 1);
    if (rc) {
        tsr_loader_close(l);
        return rc;
    }
    l->n_samples = (l->n_tokens - 1) / (uint64_t)T;
    *out = l;
    return 0;
}

void tsr_loader_set_vocab(tsr_loader *l, uint32_t vocab) { l->vocab = vocab; }
uint64_t tsr_loader_samples(const tsr_loader *l) { return l->n_samples; }
uint64_t tsr_loader_tokens(const tsr_loader *l) { return l->n_tokens; }
int tsr_loader_shards(const tsr_loader *l) { return l->n_shards; }
int tsr_loader_seq_len(const tsr_loader *l) { return l->T; }

void tsr_loader_close(tsr_loader *l) {
    if (!l) return;
    for (int i = 0; i < l->n_shards; i++) tsr_tokens_close(l->shards[i]);
    free(l->shards);
    free(l->start);
    free(l->where);
    free(l);
}

/* ------------------------------------------------------------- order */

#define FEISTEL_ROUNDS 6

/* A balanced Feistel network on 2h-bit numbers is a bijection for any round
 * function; applying it again until the result is below S (cycle walking)
 * makes it a bijection of [0, S). The domain 2^2h is under 4*S, so a lookup
 * takes fewer than 4 passes on average. */
uint64_t tsr_loader_sample_at(const tsr_loader *l, uint64_t seed, uint64_t epoch, uint64_t k) {
    uint64_t S = l->n_samples;
    int h = 1;
    while (h < 32 && (1ull << (2 * h)) < S) h++;
    uint64_t mask = (1ull << h) - 1, key[FEISTEL_ROUNDS];
    uint64_t base = tsr_mix64(seed ^ 0x5eed5eed5eed5eedull) ^ tsr_splitmix64(epoch);
    for (int i = 0; i < FEISTEL_ROUNDS; i++) key[i] = tsr_mix64(base + (uint64_t)(i + 1) * TSR_GOLDEN64);
    uint64_t x = k;
    do {
        uint64_t L = x >> h, R = x & mask;
        for (int i = 0; i < FEISTEL_ROUNDS; i++) {
            uint64_t f = tsr_mix64(R ^ key[i]) & mask;
            uint64_t nl = R;
            R = L ^ f;
            L = nl;
        }
        x = L << h | R;
    } while (x >= S);
    return x;
}

/* ------------------------------------------------------------- batches */

/* The shard holding stream index g (g < N). */
static int shard_of(const tsr_loader *l, uint64_t g) {
    int lo = 0, hi = l->n_shards - 1;
    while (lo < hi) { /* the last shard whose start is <= g */
        int mid = lo + (hi - lo + 1) / 2;
        if (l->start[mid] <= g) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* Sample i into one row: inp is (T), tgt is (T), tgt[j] = inp[j+1]. */
static int read_sample(const tsr_loader *l, uint64_t i, int *inp, int *tgt, tsr_error *err) {
    int T = l->T, s = shard_of(l, i * (uint64_t)T);
    // tokens become ints: none may exceed INT_MAX, with or without a vocabulary
    uint32_t limit = l->vocab && l->vocab <= (uint32_t)INT_MAX ? l->vocab : (uint32_t)INT_MAX + 1;
    for (int j = 0; j <= T; j++) {
        uint64_t g = i * (uint64_t)T + (uint64_t)j;
        while (g >= l->start[s + 1]) s++; /* empty shards are skipped too */
        uint32_t t = tsr_tokens_get(l->shards[s], (size_t)(g - l->start[s]));
        if (t >= limit)
            return tsr_err(err, TSR_ECORRUPT, "%s: token %llu is %u, outside the vocabulary of %u%s",
                           tsr_tokens_path(l->shards[s]), (unsigned long long)(g - l->start[s]), t, limit,
                           l->vocab ? "" : " (no vocabulary set; tokens must fit in an int)");
        if (j < T) inp[j] = (int)t;
        if (j > 0) tgt[j - 1] = (int)t;
    }
    return 0;
}

int tsr_loader_next(tsr_loader *l, tsr_data_pos *pos, int B, int dp_rank, int dp_size, int *inputs, int *targets,
                    tsr_error *err) {
    if (B < 1 || dp_size < 1 || dp_rank < 0 || dp_rank >= dp_size)
        return tsr_err(err, TSR_EINVAL, "%s: batch of %d samples on data-parallel rank %d of %d: bad arguments",
                       l->where, B, dp_rank, dp_size);
    uint64_t S = l->n_samples;
    if (pos->sample >= S)
        return tsr_err(err, TSR_EINVAL,
                       "%s: data position (epoch %llu, sample %llu) is past the %llu samples of an epoch: saved on other data or another T?",
                       l->where, (unsigned long long)pos->epoch, (unsigned long long)pos->sample,
                       (unsigned long long)S);
    uint64_t global = (uint64_t)B * (uint64_t)dp_size;
    // global index u (from the position) lies in epoch pos->epoch + u / S at u % S
    for (int b = 0; b < B; b++) {
        uint64_t u = pos->sample + (uint64_t)dp_rank * (uint64_t)B + (uint64_t)b;
        uint64_t i = tsr_loader_sample_at(l, pos->seed, pos->epoch + u / S, u % S);
        int rc = read_sample(l, i, inputs + (size_t)b * (size_t)l->T, targets + (size_t)b * (size_t)l->T, err);
        if (rc) return rc;
    }
    uint64_t u = pos->sample + global;
    pos->epoch += u / S;
    pos->sample = u % S;
    return 0;
}
