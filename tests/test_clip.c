/* test_clip.c: gradient clipping. One optimizer step of the debug model on one
 * rank must be AdamW applied to the gradient scaled to norm training.max_norm
 * when the gradient's global norm G exceeds it, and to the gradient as it is
 * when not. The gradient comes from a step without the optimizer on a second
 * trainer with the same seed (the same weights and batch give the same
 * gradient); the expected weights from tsr_adamw on a copy.
 *
 * max_norm = G * 1e-6 makes the clipped update about a thousandth of the
 * unclipped one (the scaled gradient falls far below AdamW's eps), so a step
 * that skips clipping, or clips to another norm, is off by orders of magnitude
 * more than the tolerance (1e-6 of each weight). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "config.h"
#include "optim.h"
#include "trainer.h"

enum { T = 16, B = 2 };

static tsr_train_config base_config(double max_norm) {
    tsr_error e = {0};
    tsr_train_config cfg;
    tsr_config_defaults(&cfg);
    cfg.model.flavor = TSR_FLAVOR_DEBUG;
    cfg.training.seq_len = T;
    cfg.training.local_batch_size = B;
    cfg.training.global_batch_size = B;
    cfg.training.seed = 11;
    cfg.training.max_norm = max_norm;
    REQUIRE(tsr_config_validate(&cfg, 1, &e) == 0, "tsr_config_validate: %s", e.msg);
    return cfg;
}

int main(void) {
    tsr_error e = {0};
    tsr_comm *self = tsr_comm_self();
    REQUIRE(self, "tsr_comm_self: out of memory");
    int inputs[B * T], targets[B * T];
    uint32_t x = 12345;
    for (int i = 0; i < B * T; i++) {
        x = x * 1664525u + 1013904223u;
        inputs[i] = (int)(x >> 8) % 200;
        x = x * 1664525u + 1013904223u;
        targets[i] = (int)(x >> 8) % 200;
    }

    /* the gradient and its norm, without the optimizer */
    tsr_train_config cfg0 = base_config(1.0);
    tsr_trainer *ref = NULL;
    REQUIRE(tsr_trainer_new(&cfg0, self, &ref, &e) == 0, "tsr_trainer_new: %s", e.msg);
    REQUIRE(tsr_trainer_init_params(ref, &e) == 0, "init: %s", e.msg);
    double loss = 0, G = 0;
    REQUIRE(tsr_trainer_step(ref, 1, inputs, targets, 0, &loss, &G, &e) == 0, "step: %s", e.msg);
    REQUIRE(isfinite(G) && G > 0, "gradient norm %g", G);
    const tsr_model_decls *d = tsr_trainer_decls(ref);

    /* clipped (max_norm far below G) and not clipped (max_norm above G) */
    const double max_norms[2] = {G * 1e-6, G * 10};
    for (int c = 0; c < 2; c++) {
        tsr_train_config cfg = base_config(max_norms[c]);
        tsr_trainer *t = NULL;
        REQUIRE(tsr_trainer_new(&cfg, self, &t, &e) == 0, "tsr_trainer_new: %s", e.msg);
        REQUIRE(tsr_trainer_init_params(t, &e) == 0, "init: %s", e.msg);
        /* the weights before the step */
        float **w0 = calloc(d->n_params, sizeof *w0);
        REQUIRE(w0, "out of memory");
        for (size_t p = 0; p < d->n_params; p++) {
            tsr_box b;
            float *w = tsr_trainer_param(t, p, &b);
            size_t n = (size_t)tsr_box_volume(&b);
            w0[p] = malloc(n * sizeof(float) + 1);
            REQUIRE(w && w0[p], "%s: no weights", d->decls[p].name);
            memcpy(w0[p], w, n * sizeof(float));
        }
        double l1 = 0, g1 = 0;
        REQUIRE(tsr_trainer_step(t, 1, inputs, targets, 1, &l1, &g1, &e) == 0, "step: %s", e.msg);
        CHECK(l1 == loss && g1 == G, "max_norm %g: the step saw another batch or weights (loss %.17g vs %.17g, "
              "norm %.17g vs %.17g)", max_norms[c], l1, loss, g1, G);
        double scale = max_norms[c] / (G + 1e-6);
        if (scale > 1) scale = 1;
        float lr = (float)tsr_config_lr_at(&cfg, 1);
        double worst = 0;
        const char *worst_name = "";
        for (size_t p = 0; p < d->n_params; p++) {
            tsr_box b;
            const float *w1 = tsr_trainer_param(t, p, &b), *g = tsr_trainer_grad(ref, p, &b);
            size_t n = (size_t)tsr_box_volume(&b);
            float *gs = malloc(n * sizeof(float) + 1), *m = calloc(n + 1, sizeof(float)),
                  *v = calloc(n + 1, sizeof(float));
            REQUIRE(gs && m && v, "out of memory");
            for (size_t i = 0; i < n; i++) gs[i] = g[i] * (float)scale;
            float *want = w0[p];
            tsr_adamw(want, gs, 1.0f, m, v, n, lr, (float)cfg.optimizer.beta1, (float)cfg.optimizer.beta2,
                      (float)cfg.optimizer.eps, (float)cfg.optimizer.weight_decay, 1);
            for (size_t i = 0; i < n; i++) {
                double err = fabs((double)w1[i] - want[i]) / (fabs(want[i]) + 1e-3);
                if (err > worst) worst = err, worst_name = d->decls[p].name;
            }
            free(gs), free(m), free(v), free(w0[p]);
        }
        free(w0);
        printf("max_norm %.3g (gradient norm %.6g): the step is AdamW of the gradient times %.3g, worst relative "
               "difference %.3g (%s)\n", max_norms[c], G, scale, worst, worst_name);
        CHECK(worst <= 1e-6, "max_norm %g, gradient norm %g: the weights after the step differ from AdamW of the "
              "gradient scaled by %g: relative %g in %s", max_norms[c], G, scale, worst, worst_name);
        tsr_trainer_free(t);
    }
    tsr_trainer_free(ref);
    tsr_comm_free(self);
    return check_done();
}
