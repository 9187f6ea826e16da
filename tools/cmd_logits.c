/* cmd_logits.c: tessera logits: the model's forward pass on one rank. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "casts.h"
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
    for (size_t p = 0; p < d->n_params; p++) {
        tsr_box box;
        float *w = tsr_trainer_param(t, p, &box);
        const tsr_tensor_decl *td = &d->decls[p];
        long i = tsr_ckpt_find(ck, td->name);
        if (i < 0) return tsr_err(e, TSR_ENOTFOUND, "%s: no tensor %s", tsr_ckpt_dir(ck), td->name);
        tsr_tensor_info ti;
        tsr_ckpt_tensor(ck, (size_t)i, &ti);
        if (ti.ndim != td->ndim || memcmp(ti.shape, td->shape, td->ndim * sizeof *ti.shape) || !tsr_dtype_is_float(ti.dtype))
            return tsr_err(e, TSR_EINVAL, "%s: %s has another shape or dtype (%s) than the model's", tsr_ckpt_dir(ck),
                           td->name, tsr_dtype_name(ti.dtype));
        uint64_t n = tsr_box_volume(&box);
        if (ti.dtype == TSR_F32) {
            if (tsr_ckpt_read(ck, (size_t)i, &box, w, e)) return e->code;
            continue;
        }
        void *buf = malloc(n * tsr_dtype_size(ti.dtype));
        if (!buf) return tsr_err(e, TSR_ENOMEM, "out of memory");
        int rc = tsr_ckpt_read(ck, (size_t)i, &box, buf, e);
        for (uint64_t x = 0; !rc && x < n; x++) w[x] = (float)tsr_load_f64(ti.dtype, buf, x);
        free(buf);
        if (rc) return rc;
    }
    return 0;
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
    char *text = NULL;
    int rc = ck ? 0 : e.code;
    long b = ck ? tsr_ckpt_find_blob(ck, "train.model", -1) : -1;
    if (!rc && b < 0) rc = tsr_err(&e, TSR_ENOTFOUND, "%s: no train.model blob: not a model checkpoint", path);
    tsr_blob_info bi;
    if (!rc) {
        tsr_ckpt_blob(ck, (size_t)b, &bi);
        text = bi.size < 4096 ? calloc(1, bi.size + 1) : NULL;
        rc = text ? tsr_ckpt_read_blob(ck, (size_t)b, text, &e) : tsr_err(&e, TSR_ECORRUPT, "%s: bad train.model blob", path);
    }
    if (!rc) rc = tsr_model_args_parse(text, &a, &e);
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
    free(text);
    free(logits);
    free(targets);
    free(tok);
    return rc ? EXIT_FAIL : EXIT_OK;
}
