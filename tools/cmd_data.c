/* cmd_data.c: tessera data prep: text files, or the generated corpus, into
 * byte-level token shards in llm.c's .bin layout (formats/tokens.h), split into
 * DIR/val_NNNNNN.bin and DIR/train_NNNNNN.bin. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "common.h"
#include "commands.h"
#include "corpus.h"
#include "tessera.h"
#include "tokens.h"

static const char prep_help[] =
    "usage: tessera data prep --out DIR [--input FILE ...] [--synthetic SIZE] [--seed N]\n"
    "           [--val-fraction F] [--shard-tokens N] [--token-bytes 2|4] [--force] [--json]\n"
    "Tokenizes text with the byte-level tokenizer (a token per byte, 0..255, and the\n"
    "end-of-text token 256 after each document; vocabulary 257) and writes token\n"
    "shards in llm.c's .bin layout: DIR/val_000000.bin, ... then DIR/train_000000.bin,\n"
    "..., which tessera train reads.\n"
    "  --input FILE       a text file; each one is a document (repeat the option)\n"
    "  --synthetic SIZE   SIZE bytes (e.g. 8M) of the generated corpus: stories from a\n"
    "                     small grammar, facts, questions, sums; the default, 8M, when\n"
    "                     no --input is given\n"
    "  --seed N           the corpus seed (default 1); the same seed, the same text\n"
    "  --val-fraction F   the share of tokens, taken from the start, that goes to\n"
    "                     the val split (default 0.05; 0 writes no val shard)\n"
    "  --shard-tokens N   tokens per shard at most (default 100M; sizes like 64k)\n"
    "  --token-bytes 2|4  uint16 shards (default) or uint32 ones (llm.c's Llama 3 kind)\n"
    "  --force            replace the train_*.bin and val_*.bin already in DIR\n"
    "  --json             print what was written as JSON\n";

typedef struct prep_opts {
    const char *out;
    const char **inputs;
    int n_inputs;
    uint64_t synthetic, seed, shard_tokens;
    double val_fraction;
    int token_bytes, json, force, have_synthetic;
} prep_opts;

static int parse_opts(const char *cmd, int argc, char **argv, prep_opts *o) {
    const char *v;
    *o = (prep_opts){.seed = 1, .shard_tokens = 100u << 20, .val_fraction = 0.05, .token_bytes = 2};
    o->inputs = calloc((size_t)argc + 1, sizeof *o->inputs);
    if (!o->inputs) return fputs("tessera data prep: out of memory\n", stderr), EXIT_FAIL;
    for (int i = 1; i < argc; i++) {
        int r;
        if ((r = tsr_opt(argc, argv, &i, "out", 1, &v))) {
            if (r < 0) return EXIT_USAGE;
            o->out = v;
        } else if ((r = tsr_opt(argc, argv, &i, "input", 1, &v))) {
            if (r < 0) return EXIT_USAGE;
            o->inputs[o->n_inputs++] = v;
        } else if ((r = tsr_opt(argc, argv, &i, "synthetic", 1, &v))) {
            if (r < 0 || tsr_parse_size(v, &o->synthetic) || o->synthetic == 0)
                return tsr_usage_error(cmd, "--synthetic takes a size like 8M");
            o->have_synthetic = 1;
        } else if ((r = tsr_opt(argc, argv, &i, "seed", 1, &v))) {
            if (r < 0 || tsr_parse_u64(v, &o->seed)) return tsr_usage_error(cmd, "--seed takes a number");
        } else if ((r = tsr_opt(argc, argv, &i, "val-fraction", 1, &v))) {
            char *end = NULL;
            if (r >= 0) o->val_fraction = strtod(v, &end);
            if (r < 0 || !end || end == v || *end || !isfinite(o->val_fraction) || o->val_fraction < 0 ||
                o->val_fraction >= 1)
                return tsr_usage_error(cmd, "--val-fraction takes a number from 0 to below 1");
        } else if ((r = tsr_opt(argc, argv, &i, "shard-tokens", 1, &v))) {
            if (r < 0 || tsr_parse_size(v, &o->shard_tokens) || o->shard_tokens == 0 ||
                o->shard_tokens > TSR_TOKENS_MAX)
                return tsr_usage_error(cmd, "--shard-tokens takes a count from 1 to %u (sizes like 64k)", TSR_TOKENS_MAX);
        } else if ((r = tsr_opt(argc, argv, &i, "token-bytes", 1, &v))) {
            if (r < 0 || (strcmp(v, "2") && strcmp(v, "4"))) return tsr_usage_error(cmd, "--token-bytes is 2 or 4");
            o->token_bytes = v[0] - '0';
        } else if ((r = tsr_opt(argc, argv, &i, "json", 0, &v))) {
            o->json = 1;
        } else if ((r = tsr_opt(argc, argv, &i, "force", 0, &v))) {
            o->force = 1;
        } else if (argv[i][0] == '-') {
            return tsr_usage_error(cmd, "unknown option %s", argv[i]);
        } else {
            return tsr_usage_error(cmd, "unexpected argument %s (inputs are given with --input FILE)", argv[i]);
        }
    }
    if (!o->out) return tsr_usage_error(cmd, "missing --out DIR");
    if (o->n_inputs && o->have_synthetic) return tsr_usage_error(cmd, "--input and --synthetic exclude each other");
    if (!o->n_inputs && !o->have_synthetic) o->synthetic = TSR_CORPUS_DEFAULT_BYTES;
    return 0;
}

/* ------------------------------------------------------------ the sink */

/* Tokens arrive one by one; the first val_target go to val shards, the rest to
 * train shards, each shard holding at most `cap` tokens. */
typedef struct shard_rec {
    char *path;
    int val;
    uint64_t tokens;
} shard_rec;

typedef struct sink {
    const char *dir;
    int width;
    uint64_t val_target, seen, split_tokens[2];
    uint32_t *buf;
    size_t n, cap;
    int val; /* the split buf fills: 1 val, 0 train */
    int next_no[2];
    shard_rec *shards;
    size_t n_shards, shards_cap;
    tsr_error e;
    int failed;
} sink;

static int sink_flush(sink *s) {
    if (s->failed || s->n == 0) return s->failed;
    size_t len = strlen(s->dir) + 32;
    char *path = malloc(len);
    if (!path || tsr_grow((void **)&s->shards, &s->shards_cap, s->n_shards, sizeof *s->shards)) {
        free(path);
        s->failed = 1;
        snprintf(s->e.msg, sizeof s->e.msg, "out of memory");
        return 1;
    }
    snprintf(path, len, "%s/%s_%06d.bin", s->dir, s->val ? "val" : "train", s->next_no[s->val]++);
    if (tsr_tokens_write(path, s->buf, s->n, s->width, &s->e)) {
        free(path);
        s->failed = 1;
        return 1;
    }
    s->shards[s->n_shards++] = (shard_rec){path, s->val, s->n};
    s->split_tokens[s->val] += s->n;
    s->n = 0;
    return 0;
}

static void sink_push(sink *s, uint32_t tok) {
    int val = s->seen < s->val_target;
    if (val != s->val || s->n == s->cap) sink_flush(s);
    s->val = val;
    s->buf[s->n++] = tok;
    s->seen++;
}

/* --------------------------------------------------------- the output */

/* A name this command writes: train_NNNNNN.bin or val_NNNNNN.bin. */
static int is_our_shard(const char *name) {
    const char *p = !strncmp(name, "train_", 6) ? name + 6 : !strncmp(name, "val_", 4) ? name + 4 : NULL;
    if (!p) return 0;
    size_t k = strspn(p, "0123456789");
    return k >= 6 && strcmp(p + k, ".bin") == 0;
}

/* Shards of an earlier run would be read with the new ones: refuse, or with
 * --force remove them. */
static int clear_old(const char *cmd, const char *dir, int force) {
    DIR *d = opendir(dir);
    if (!d) return fprintf(stderr, "tessera %s: %s: %s\n", cmd, dir, strerror(errno)), EXIT_FAIL;
    struct dirent *de;
    int rc = 0;
    while (!rc && (de = readdir(d))) {
        if (!is_our_shard(de->d_name)) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (!force) {
            fprintf(stderr, "tessera %s: %s already holds token shards (%s); use --force to replace them\n", cmd, dir,
                    de->d_name);
            rc = EXIT_FAIL;
        } else if (unlink(path)) {
            fprintf(stderr, "tessera %s: %s: cannot remove: %s\n", cmd, path, strerror(errno));
            rc = EXIT_FAIL;
        }
    }
    closedir(d);
    return rc;
}

static void print_result(const prep_opts *o, const sink *s, uint64_t bytes, uint64_t docs) {
    const char *kind = o->token_bytes == 2 ? "uint16" : "uint32";
    if (o->json) {
        printf("{\"out\": ");
        tsr_json_str(stdout, o->out);
        printf(", \"source\": \"%s\"", o->n_inputs ? "input" : "synthetic");
        if (!o->n_inputs) printf(", \"seed\": %llu", (unsigned long long)o->seed);
        printf(", \"bytes\": %llu, \"documents\": %llu, \"token_bytes\": %d, \"vocab\": %d, \"eot\": %d",
               (unsigned long long)bytes, (unsigned long long)docs, o->token_bytes, TSR_BYTE_VOCAB, TSR_BYTE_EOT);
        printf(", \"train_tokens\": %llu, \"val_tokens\": %llu, \"shards\": [", (unsigned long long)s->split_tokens[0],
               (unsigned long long)s->split_tokens[1]);
        for (size_t i = 0; i < s->n_shards; i++) {
            printf("%s{\"path\": ", i ? ", " : "");
            tsr_json_str(stdout, s->shards[i].path);
            printf(", \"split\": \"%s\", \"tokens\": %llu}", s->shards[i].val ? "val" : "train",
                   (unsigned long long)s->shards[i].tokens);
        }
        printf("]}\n");
        return;
    }
    for (size_t i = 0; i < s->n_shards; i++)
        printf("wrote %s: %llu tokens (%s)\n", s->shards[i].path, (unsigned long long)s->shards[i].tokens, kind);
    char b[32];
    if (o->n_inputs) printf("%s: %d input file(s), %s", o->out, o->n_inputs, tsr_fmt_bytes(bytes, b, sizeof b));
    else printf("%s: generated corpus, seed %llu, %s", o->out, (unsigned long long)o->seed, tsr_fmt_bytes(bytes, b, sizeof b));
    int n_val = 0;
    for (size_t i = 0; i < s->n_shards; i++) n_val += s->shards[i].val;
    printf(", %llu document(s): %llu train tokens in %d shard(s), %llu val tokens in %d shard(s); byte-level vocabulary %d, end of text %d\n",
           (unsigned long long)docs, (unsigned long long)s->split_tokens[0], (int)s->n_shards - n_val,
           (unsigned long long)s->split_tokens[1], n_val, TSR_BYTE_VOCAB, TSR_BYTE_EOT);
}

/* ------------------------------------------------------------- sources */

/* Every input, checked before anything is written; their total size. */
static int stat_inputs(const char *cmd, const prep_opts *o, uint64_t *total) {
    *total = 0;
    for (int i = 0; i < o->n_inputs; i++) {
        struct stat st;
        if (stat(o->inputs[i], &st)) {
            fprintf(stderr, "tessera %s: %s: %s\n", cmd, o->inputs[i], strerror(errno));
            return EXIT_FAIL;
        }
        if (!S_ISREG(st.st_mode) || access(o->inputs[i], R_OK)) {
            fprintf(stderr, "tessera %s: %s: not a readable file\n", cmd, o->inputs[i]);
            return EXIT_FAIL;
        }
        *total += (uint64_t)st.st_size;
    }
    return 0;
}

static int feed_inputs(const char *cmd, const prep_opts *o, sink *s, tsr_progress *pr, uint64_t *bytes) {
    static unsigned char chunk[1 << 20];
    *bytes = 0;
    for (int i = 0; i < o->n_inputs && !s->failed; i++) {
        FILE *f = fopen(o->inputs[i], "rb");
        if (!f) {
            fprintf(stderr, "tessera %s: %s: %s\n", cmd, o->inputs[i], strerror(errno));
            return EXIT_FAIL;
        }
        size_t k;
        while (!s->failed && (k = fread(chunk, 1, sizeof chunk, f)) > 0) {
            for (size_t j = 0; j < k; j++) sink_push(s, chunk[j]);
            *bytes += k;
            tsr_progress_add(pr, k);
        }
        int bad = ferror(f);
        fclose(f);
        if (bad) {
            fprintf(stderr, "tessera %s: %s: read error\n", cmd, o->inputs[i]);
            return EXIT_FAIL;
        }
        sink_push(s, TSR_BYTE_EOT);
    }
    return 0;
}

int tsr_cmd_data_prep(int argc, char **argv) {
    const char *cmd = "data prep";
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return fputs(prep_help, stdout), EXIT_OK;
    prep_opts o;
    int rc = parse_opts(cmd, argc, argv, &o);
    if (rc) {
        free(o.inputs);
        return rc;
    }
    // the number of tokens, known before any is written, fixes the val split
    uint64_t total = 0;
    char *text = NULL;
    size_t text_len = 0;
    tsr_error e = {0};
    if (o.n_inputs) {
        rc = stat_inputs(cmd, &o, &total);
        total += (uint64_t)o.n_inputs;
    } else if (tsr_corpus_generate(o.seed, (size_t)o.synthetic, &text, &text_len, &e)) {
        fprintf(stderr, "tessera %s: %s\n", cmd, e.msg);
        rc = EXIT_FAIL;
    } else {
        total = text_len;
    }
    int mk = rc ? 0 : tsr_mkdir_p(o.out);
    if (mk) {
        fprintf(stderr, "tessera %s: %s: cannot create the directory: %s\n", cmd, o.out, strerror(mk));
        rc = EXIT_FAIL;
    }
    if (!rc) rc = clear_old(cmd, o.out, o.force);
    sink s = {.dir = o.out, .width = o.token_bytes, .val = 1};
    if (!rc) {
        uint64_t val = (uint64_t)llround(o.val_fraction * (double)total);
        s.val_target = val < total ? val : total - 1; /* train keeps at least one token */
        s.cap = (size_t)(o.shard_tokens < total ? o.shard_tokens : total);
        s.buf = malloc((s.cap ? s.cap : 1) * sizeof *s.buf);
        if (!s.buf) rc = EXIT_FAIL, fprintf(stderr, "tessera %s: out of memory\n", cmd);
    }
    uint64_t bytes = 0, docs = 0;
    if (!rc) {
        tsr_progress pr;
        tsr_progress_start(&pr, "prep", o.n_inputs ? total : text_len);
        if (o.n_inputs) {
            rc = feed_inputs(cmd, &o, &s, &pr, &bytes);
            docs = (uint64_t)o.n_inputs;
        } else {
            for (size_t i = 0; i < text_len && !s.failed; i++) {
                int sep = (unsigned char)text[i] == TSR_CORPUS_DOC_SEP;
                sink_push(&s, sep ? TSR_BYTE_EOT : (unsigned char)text[i]);
                docs += (uint64_t)sep;
            }
            docs += text_len && (unsigned char)text[text_len - 1] != TSR_CORPUS_DOC_SEP; /* the one cut short */
            bytes = text_len;
            tsr_progress_add(&pr, text_len);
        }
        if (!rc) sink_flush(&s);
        tsr_progress_end(&pr);
        if (!rc && s.failed) {
            fprintf(stderr, "tessera %s: %s\n", cmd, s.e.msg);
            rc = EXIT_FAIL;
        }
    }
    if (!rc && s.split_tokens[0] == 0) {
        fprintf(stderr, "tessera %s: no text to write\n", cmd);
        rc = EXIT_FAIL;
    }
    if (!rc) print_result(&o, &s, bytes, docs);
    for (size_t i = 0; i < s.n_shards; i++) {
        if (rc) unlink(s.shards[i].path); /* no partial set of shards is left behind */
        free(s.shards[i].path);
    }
    free(s.shards);
    free(s.buf);
    free(text);
    free(o.inputs);
    return rc;
}
