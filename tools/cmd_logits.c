/* cmd_logits.c: tessera logits: the model's forward pass on one rank. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "commands.h"
#include "common.h"
#include "tokens.h"
#include "trainer.h"

static const char USAGE[] =
    "usage: tessera logits CKPT (--tokens 1,2,3,... | --text STRING) [--out FILE] [--generate N]\n"
    "Runs the forward pass of the model in checkpoint CKPT (any layout, any\n"
    "floating dtype) on one rank over a prompt, and prints the logits of the last\n"
    "position, one per line; --out FILE writes every prompt position's logits\n"
    "instead, as little-endian float32 (tokens x vocabulary).\n"
    "  --tokens IDS    token ids in decimal, separated by single commas, nothing\n"
    "                  else (no spaces, no signs, no empty items): 72,105\n"
    "  --text STRING   the prompt as text, in tessera's byte-level tokenizer: each\n"
    "                  byte of STRING is one token (as tessera data prep gives)\n"
    "  --generate N    greedy decoding: appends the most likely token (the lowest\n"
    "                  id among equals) N times and prints the N generated ids on\n"
    "                  one line, comma-separated, instead of the logits\n"
    "The prompt and the generated tokens together may not be longer than the\n"
    "model's context length (max_seq_len of its train.model blob).\n";

/* The parameters of the model, from the checkpoint, as f32. */
static int load_params(tsr_ckpt *ck, tsr_trainer *t, tsr_error *e) {
    const tsr_model_decls *d = tsr_trainer_decls(t);
    int rc = 0;
    for (size_t p = 0; p < d->n_params && !rc; p++) {
        tsr_box box;
        float *w = tsr_trainer_param(t, p, &box);
        rc = tsr_model_read_f32(ck, &d->decls[p], &box, w, e);
    }
    return rc;
}

/* --tokens: decimal ids separated by single commas; *n ids in a new array, or
 * NULL (with *n = 0 for an empty or malformed list, -1 when out of memory). */
static int *parse_ids(const char *s, long *n) {
    int *tok = malloc(strlen(s) / 2 * sizeof *tok + sizeof *tok);
    *n = tok ? 0 : -1;
    for (const char *p = s; tok;) {
        long x = 0;
        const char *q = p;
        while (*q >= '0' && *q <= '9' && x <= 0x7fffffff) x = x * 10 + (*q++ - '0');
        if (q == p || x > 0x7fffffff || (*q && *q != ',') || (*q == ',' && !q[1])) {
            free(tok);
            *n = 0;
            return NULL;
        }
        tok[(*n)++] = (int)x;
        if (!*q) break;
        p = q + 1;
    }
    return tok;
}

static int argmax(const float *x, size_t n) {
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return (int)best;
}

int tsr_cmd_logits(int argc, char **argv) {
    const char *dir = NULL, *tokens = NULL, *text = NULL, *out = NULL, *v;
    long gen = 0;
    for (int i = 1; i < argc; i++) {
        int r;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return fputs(USAGE, stdout), EXIT_OK;
        if ((r = tsr_opt(argc, argv, &i, "tokens", 1, &v))) {
            if (r < 0) return EXIT_USAGE;
            tokens = v;
        } else if ((r = tsr_opt(argc, argv, &i, "text", 1, &v))) {
            if (r < 0) return EXIT_USAGE;
            text = v;
        } else if ((r = tsr_opt(argc, argv, &i, "out", 1, &v))) {
            if (r < 0) return EXIT_USAGE;
            out = v;
        } else if ((r = tsr_opt(argc, argv, &i, "generate", 1, &v))) {
            char *end;
            if (r < 0) return EXIT_USAGE;
            gen = strtol(v, &end, 10);
            if (*v < '0' || *v > '9' || *end || gen < 1 || gen > 1000000)
                return tsr_usage_error("logits", "--generate takes a number of tokens from 1");
        } else if (argv[i][0] == '-') {
            return tsr_usage_error("logits", "unknown option %s (see --help)", argv[i]);
        } else if (!dir) {
            dir = argv[i];
        } else {
            return tsr_usage_error("logits", "one CKPT only");
        }
    }
    if (!dir || !tokens == !text) return tsr_usage_error("logits", "needs CKPT and one of --tokens or --text (see --help)");
    long T = 0;
    int *tok = NULL;
    if (tokens) {
        tok = parse_ids(tokens, &T);
        if (T < 0) return EXIT_FAIL;
        if (!tok) return tsr_usage_error("logits", "--tokens '%s': takes decimal token ids separated by single commas "
                                         "(1,2,3)", tokens);
    } else {
        T = (long)strlen(text);
        if (!T) return tsr_usage_error("logits", "--text is empty");
        if (!(tok = malloc((size_t)T * sizeof *tok))) return EXIT_FAIL;
        uint32_t *bytes = malloc((size_t)T * sizeof *bytes);
        if (!bytes) return free(tok), EXIT_FAIL;
        tsr_byte_tokenize(text, (size_t)T, -1, bytes);
        for (long i = 0; i < T; i++) tok[i] = (int)bytes[i];
        free(bytes);
    }
    /* the sequence the forward pass runs over: the prompt, then what is generated
     * (positions after the current end do not change the logits before it) */
    long L = T + (gen ? gen - 1 : 0);
    int *seq = calloc((size_t)L, sizeof *seq);
    if (!seq) return free(tok), EXIT_FAIL;
    memcpy(seq, tok, (size_t)T * sizeof *seq);
    char path[4096];
    tsr_resolve_ckpt_dir("logits", dir, path, sizeof path);
    tsr_error e = {0};
    tsr_ckpt *ck = tsr_ckpt_open(path, &e);
    tsr_model_args a;
    int rc = ck ? tsr_model_args_from_ckpt(ck, &a, &e) : e.code;
    if (!rc && T + gen > a.max_seq_len)
        rc = tsr_err(&e, TSR_EINVAL, "%s: %ld tokens (%ld in the prompt, %ld to generate): the model's context length is %d",
                     path, T + gen, T, gen, a.max_seq_len);
    for (long i = 0; !rc && i < T; i++)
        if (tok[i] >= a.vocab_size) rc = tsr_err(&e, TSR_EINVAL, "token %d at position %ld: the vocabulary has %d", tok[i], i, a.vocab_size);
    tsr_train_config cfg;
    tsr_config_defaults(&cfg);
    cfg.training.seq_len = (int)L;
    cfg.training.local_batch_size = 1;
    cfg.training.global_batch_size = 1;
    cfg.parallelism.data_parallel_shard_degree = 1;
    tsr_comm *self = tsr_comm_self();
    tsr_trainer *t = NULL;
    size_t V = rc ? 1 : (size_t)a.vocab_size;
    float *logits = rc ? NULL : malloc((size_t)L * V * sizeof *logits), *first = NULL;
    int *targets = malloc((size_t)L * sizeof *targets);
    if (!rc && (!self || !logits || !targets)) rc = tsr_err(&e, TSR_ENOMEM, "out of memory for %ld x %zu logits", L, V);
    if (!rc && gen && out && !(first = malloc((size_t)T * V * sizeof *first)))
        rc = tsr_err(&e, TSR_ENOMEM, "out of memory");
    if (!rc) rc = tsr_config_validate(&cfg, 1, &e);
    if (!rc) rc = tsr_trainer_new_args(&cfg, &a, self, &t, &e);
    if (!rc) rc = load_params(ck, t, &e);
    double loss, gnorm;
    for (long i = 0; !rc && i < L; i++) targets[i] = -1;
    if (!rc) tsr_trainer_keep_logits(t, logits);
    for (long k = 0; !rc && k < (gen ? gen : 1); k++) {
        if ((rc = tsr_trainer_step(t, 1, seq, targets, 0, &loss, &gnorm, &e))) break;
        if (k == 0 && first) memcpy(first, logits, (size_t)T * V * sizeof *first);
        if (!gen) break;
        int next = argmax(logits + (size_t)(T + k - 1) * V, V);
        if (T + k < L) seq[T + k] = next;
        printf("%s%d", k ? "," : "", next);
        if (k == gen - 1) printf("\n");
    }
    if (!rc && out) {
        const float *w = first ? first : logits;
        FILE *f = fopen(out, "wb");
        if (!f || fwrite(w, sizeof *w, (size_t)T * V, f) != (size_t)T * V)
            rc = tsr_err(&e, TSR_EIO, "%s: cannot write", out);
        if (f && fclose(f) && !rc) rc = tsr_err(&e, TSR_EIO, "%s: cannot write", out);
    } else if (!rc && !gen) {
        for (size_t i = 0; i < V; i++) printf("%.9g\n", (double)logits[(size_t)(T - 1) * V + i]);
    }
    if (rc) fprintf(stderr, "tessera logits: %s\n", e.msg);
    tsr_trainer_free(t);
    tsr_comm_free(self);
    tsr_ckpt_close(ck);
    free(logits);
    free(first);
    free(targets);
    free(seq);
    free(tok);
    return rc ? EXIT_FAIL : EXIT_OK;
}
