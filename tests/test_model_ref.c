/* test_model_ref.c: the debug model against an independent PyTorch Llama.
 *
 * One training step without the optimizer (seq 16, batch 3, seed 7, two
 * ignored targets) on one rank; then everything the reference needs goes under
 * $TSR_TMP:
 *     model.json             the model args, the batch shape, the loss, the
 *                            gradient norm and the list of tensors below
 *     param.<name>.bin       each parameter, float32, row-major (the whole
 *                            tensor: on one rank each box is the tensor)
 *     grad.<name>.bin        its gradient after the step
 *     inputs.bin, targets.bin   int32 (B,T)
 *     logits.bin             float32 (T,V): sample 0 (the only micro-batch)
 * tests/ref_model.py rebuilds the model from the architecture in float64 with
 * these weights and fails naming the first of loss, logits or a gradient whose
 * relative error exceeds 1e-5. Its exit status is this test's. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

#include "check.h"
#include "config.h"
#include "trainer.h"

enum { T = 16, B = 3 };

static const char *tmp;

/* Writes n elements of `size` bytes to $TSR_TMP/file. */
static void save(const char *file, const void *data, size_t size, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", tmp, file);
    FILE *f = fopen(path, "wb");
    REQUIRE(f, "cannot create %s", path);
    REQUIRE(fwrite(data, size, n, f) == n, "cannot write %s", path);
    REQUIRE(fclose(f) == 0, "cannot write %s", path);
}

/* xorshift64*: the test's own deterministic tokens */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rng_next(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32);
}

/* Checks that box is the whole tensor d (one rank holds everything). */
static void check_whole(const tsr_tensor_decl *d, const tsr_box *box, const char *what) {
    CHECK(box->ndim == d->ndim, "%s of %s: box of %u dims, tensor of %u", what, d->name, box->ndim, d->ndim);
    for (uint32_t i = 0; i < d->ndim && i < box->ndim; i++)
        CHECK(box->offset[i] == 0 && box->extent[i] == d->shape[i],
              "%s of %s: dim %u is [%llu, +%llu), the tensor has %llu", what, d->name, i,
              (unsigned long long)box->offset[i], (unsigned long long)box->extent[i],
              (unsigned long long)d->shape[i]);
}

int main(void) {
    tmp = getenv("TSR_TMP");
    const char *root = getenv("TSR_ROOT"), *py = getenv("TSR_PY");
    REQUIRE(tmp && root && py, "TSR_TMP, TSR_ROOT and TSR_PY must be set (tests/run.sh sets them)");

    /* no reference, no test: a failure, as for the kernels */
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' -c 'import numpy, torch' >/dev/null 2>&1", py);
    int rc = system(cmd);
    if (rc == -1 || !WIFEXITED(rc) || WEXITSTATUS(rc) != 0) {
        fprintf(stderr, "%s cannot import numpy and torch: the tests' Python environment is tests/py_setup.sh's\n", py);
        return 1;
    }

    tsr_error e = {0};
    tsr_train_config cfg;
    tsr_config_defaults(&cfg);
    cfg.model.flavor = TSR_FLAVOR_DEBUG;
    cfg.training.seq_len = T;
    cfg.training.local_batch_size = B;
    cfg.training.global_batch_size = B;
    cfg.training.seed = 7;
    REQUIRE(tsr_config_validate(&cfg, 1, &e) == 0, "tsr_config_validate: %s", e.msg);
    tsr_comm *self = tsr_comm_self();
    REQUIRE(self, "tsr_comm_self: out of memory");
    tsr_trainer *t = NULL;
    REQUIRE(tsr_trainer_new(&cfg, self, &t, &e) == 0, "tsr_trainer_new: %s", e.msg);
    REQUIRE(tsr_trainer_init_params(t, &e) == 0, "init: %s", e.msg);
    const tsr_model_args *a = tsr_trainer_model(t);
    const tsr_model_decls *d = tsr_trainer_decls(t);
    int V = a->vocab_size;

    /* inputs and targets (B,T) in [0,V); two ignored targets, one in sample 0 */
    int inputs[B * T], targets[B * T];
    for (int i = 0; i < B * T; i++) {
        inputs[i] = (int)(rng_next() % (uint32_t)V);
        targets[i] = (int)(rng_next() % (uint32_t)V);
    }
    targets[5] = -1;
    targets[2 * T + 11] = -1;

    /* NaN until the step writes it: the reference then fails on anything unwritten */
    float *logits = malloc((size_t)T * V * sizeof *logits);
    REQUIRE(logits, "out of memory");
    for (size_t i = 0; i < (size_t)T * V; i++) logits[i] = NAN;
    tsr_trainer_keep_logits(t, logits);
    double loss = NAN, gnorm = NAN;
    CHECK_OK(tsr_trainer_step(t, 1, inputs, targets, 0, &loss, &gnorm, &e));
    CHECK(isfinite(loss) && loss > 0, "loss %g", loss);
    CHECK(isfinite(gnorm) && gnorm > 0, "gradient norm %g", gnorm);

    save("inputs.bin", inputs, sizeof *inputs, B * T);
    save("targets.bin", targets, sizeof *targets, B * T);
    save("logits.bin", logits, sizeof *logits, (size_t)T * V);

    char path[4096];
    snprintf(path, sizeof path, "%s/model.json", tmp);
    FILE *js = fopen(path, "w");
    REQUIRE(js, "cannot create %s", path);
    /* float fields as exact doubles, so that float64 sees tessera's float32 values */
    fprintf(js,
            "{\n  \"args\": {\"flavor\": \"%s\", \"dim\": %d, \"n_layers\": %d, \"n_heads\": %d, "
            "\"n_kv_heads\": %d, \"ffn_dim\": %d, \"vocab_size\": %d, \"norm_eps\": %.17g, "
            "\"rope_theta\": %.17g,\n    \"rope_scaling\": {\"factor\": %.17g, \"low_freq_factor\": %.17g, "
            "\"high_freq_factor\": %.17g, \"original_max_pos\": %d}},\n",
            a->flavor, a->dim, a->n_layers, a->n_heads, a->n_kv_heads, a->ffn_dim, a->vocab_size,
            (double)a->norm_eps, (double)a->rope_theta, (double)a->rope_scaling.factor,
            (double)a->rope_scaling.low_freq_factor, (double)a->rope_scaling.high_freq_factor,
            a->rope_scaling.original_max_pos);
    fprintf(js, "  \"batch\": %d, \"seq_len\": %d, \"loss\": %.17g, \"grad_norm\": %.17g,\n", B, T, loss, gnorm);
    fprintf(js, "  \"inputs\": \"inputs.bin\", \"targets\": \"targets.bin\", \"logits\": \"logits.bin\",\n");
    fprintf(js, "  \"tensors\": [");
    for (size_t p = 0; p < d->n_params; p++) {
        const tsr_tensor_decl *td = &d->decls[p];
        tsr_box wb, gb;
        float *w = tsr_trainer_param(t, p, &wb), *g = tsr_trainer_grad(t, p, &gb);
        REQUIRE(w && g, "%s: one rank holds no parameter or gradient", td->name);
        check_whole(td, &wb, "parameter");
        check_whole(td, &gb, "gradient");
        size_t n = (size_t)tsr_box_volume(&wb);
        char file[256];
        snprintf(file, sizeof file, "param.%s.bin", td->name);
        save(file, w, sizeof *w, n);
        snprintf(file, sizeof file, "grad.%s.bin", td->name);
        save(file, g, sizeof *g, n);
        fprintf(js, "%s\n    {\"name\": \"%s\", \"shape\": [", p ? "," : "", td->name);
        for (uint32_t i = 0; i < td->ndim; i++)
            fprintf(js, "%s%llu", i ? ", " : "", (unsigned long long)td->shape[i]);
        fprintf(js, "], \"param\": \"param.%s.bin\", \"grad\": \"grad.%s.bin\"}", td->name, td->name);
    }
    fprintf(js, "\n  ]\n}\n");
    REQUIRE(fclose(js) == 0, "cannot write %s", path);

    tsr_trainer_free(t);
    tsr_comm_free(self);
    free(logits);
    if (check_done()) return 1;

    snprintf(cmd, sizeof cmd, "'%s' '%s/tests/ref_model.py' '%s'", py, root, tmp);
    rc = system(cmd);
    if (rc == -1 || !WIFEXITED(rc)) REQUIRE(0, "cannot run %s", cmd);
    if (WEXITSTATUS(rc) == 3 || WEXITSTATUS(rc) == 127)
        fprintf(stderr, "%s has no torch: the tests' Python environment is tests/py_setup.sh's\n", py);
    else if (WEXITSTATUS(rc)) fprintf(stderr, "tests/ref_model.py: the debug model disagrees with PyTorch\n");
    return WEXITSTATUS(rc);
}
