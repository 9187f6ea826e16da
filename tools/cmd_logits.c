/* cmd_logits.c: tessera logits: the model's forward pass on one rank. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "commands.h"
#include "common.h"
#include "trainer.h"

static const char USAGE[] =
    "usage: tessera logits CKPT --tokens 1,2,3,... [--out FILE]\n"
    "Runs the forward pass of the model in checkpoint CKPT (any layout, any\n"
    "floating dtype) on one rank over the given token ids, and prints the logits\n"
    "of the last position, one per line; --out FILE writes every position's\n"
    "logits instead, as little-endian float32 (tokens x vocabulary).\n";

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

int tsr_cmd_logits(int argc, char **argv) {
    const char *dir = NULL, *tokens = NULL, *out = NULL, *v;
    for (int i = 1; i < argc; i++) {
        int r;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return fputs(USAGE, stdout), EXIT_OK;
        if ((r = tsr_opt(argc, argv, &i, "tokens", 1, &v))) {
            if (r < 0) return EXIT_USAGE;
            tokens = v;
        } else if ((r = tsr_opt(argc, argv, &i, "out", 1, &v))) {
            if (r < 0) return EXIT_USAGE;
            out = v;
        } else if (argv[i][0] == '-') {
            return tsr_usage_error("logits", "unknown option %s (see --help)", argv[i]);
        } else if (!dir) {
            dir = argv[i];
        } else {
            return tsr_usage_error("logits", "one CKPT only");
        }
    }
    if (!dir || !tokens) return tsr_usage_error("logits", "needs CKPT and --tokens (see --help)");
    int T = 0, cap = 0, *tok = NULL;
    for (const char *p = tokens; *p;) {
        char *end;
        long x = strtol(p, &end, 10);
        if (end == p || x < 0 || x > 0x7fffffff || (*end && *end != ',')) {
            free(tok);
            return tsr_usage_error("logits", "--tokens takes comma-separated token ids");
        }
        if (T == cap) {
            cap = cap ? 2 * cap : 64;
            int *nt = realloc(tok, (size_t)cap * sizeof *nt);
            if (!nt) return free(tok), EXIT_FAIL;
            tok = nt;
        }
        tok[T++] = (int)x;
        p = *end ? end + 1 : end;
    }
    if (!T) return tsr_usage_error("logits", "--tokens is empty");
    char path[4096];
    tsr_resolve_ckpt_dir("logits", dir, path, sizeof path);
    tsr_error e = {0};
    tsr_ckpt *ck = tsr_ckpt_open(path, &e);
    tsr_model_args a;
    int rc = ck ? tsr_model_args_from_ckpt(ck, &a, &e) : e.code;
    for (int i = 0; !rc && i < T; i++)
        if (tok[i] >= a.vocab_size) rc = tsr_err(&e, TSR_EINVAL, "token %d at position %d: the vocabulary has %d", tok[i], i, a.vocab_size);
    tsr_train_config cfg;
    tsr_config_defaults(&cfg);
    cfg.training.seq_len = T;
    cfg.training.local_batch_size = 1;
    cfg.training.global_batch_size = 1;
    cfg.parallelism.data_parallel_shard_degree = 1;
    tsr_comm *self = tsr_comm_self();
    tsr_trainer *t = NULL;
    float *logits = malloc((size_t)T * (size_t)(rc ? 1 : a.vocab_size) * sizeof *logits);
    int *targets = malloc((size_t)T * sizeof *targets);
    if (!rc && (!self || !logits || !targets)) rc = tsr_err(&e, TSR_ENOMEM, "out of memory");
    if (!rc) rc = tsr_config_validate(&cfg, 1, &e);
    if (!rc) rc = tsr_trainer_new_args(&cfg, &a, self, &t, &e);
    if (!rc) rc = load_params(ck, t, &e);
    double loss, gnorm;
    for (int i = 0; !rc && i < T; i++) targets[i] = -1;
    if (!rc) {
        tsr_trainer_keep_logits(t, logits);
        rc = tsr_trainer_step(t, 1, tok, targets, 0, &loss, &gnorm, &e);
    }
    size_t V = rc ? 0 : (size_t)a.vocab_size;
    if (!rc && out) {
        FILE *f = fopen(out, "wb");
        if (!f || fwrite(logits, sizeof *logits, (size_t)T * V, f) != (size_t)T * V)
            rc = tsr_err(&e, TSR_EIO, "%s: cannot write", out);
        if (f && fclose(f) && !rc) rc = tsr_err(&e, TSR_EIO, "%s: cannot write", out);
    } else if (!rc) {
        for (size_t i = 0; i < V; i++) printf("%.9g\n", (double)logits[(size_t)(T - 1) * V + i]);
    }
    if (rc) fprintf(stderr, "tessera logits: %s\n", e.msg);
    tsr_trainer_free(t);
    tsr_comm_free(self);
    tsr_ckpt_close(ck);
    free(logits);
    free(targets);
    free(tok);
    return rc ? EXIT_FAIL : EXIT_OK;
}
