/* test_fsdp.c: FSDP by units (train/fsdp.c). A model whose vocabulary is large
 * beside its layers (dim 16, 2 layers, 1000 tokens) trains 3 steps on 3 ranks
 * with dp_shard=3 (1000 rows: 334, 333, 333 per rank), and each rank trains the
 * same global batch alone (dp_shard=1) as the reference. Twice:
 *   - 12 samples of 32 tokens, 2 micro-batches a rank: the 3 ranks' 192 tokens
 *     are fewer than the vocabulary, so the output is vocabulary-parallel over
 *     dp_shard (every rank's h gathered, the softmax from every rank's row
 *     statistics);
 *   - 36 samples, one micro-batch of 384 tokens a rank: the output goes through
 *     the unit buffer in several rounds of rows.
 * In both the embedding's rows of every rank's tokens go in several rounds of
 * tokens (checked), each layer is gathered whole, and gradients are reduced
 * unit by unit and micro-batch by micro-batch:
 *   - every step's loss and gradient norm equal the reference's (1e-5);
 *   - every weight of every rank's shard equals the reference's element at the
 *     same global index after the 3 steps (1e-5 relative, 1e-6 absolute);
 *   - the FSDP buffers hold no more than about two layers (not the model).
 * Every norm's weights start at values of their own (not all 1), so that one
 * norm's weights used for another's fail the comparison.
 * Run alone, the program starts itself on 3 ranks under mpirun. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "config.h"
#include "tessera.h"
#include "trainer_impl.h"

enum { RANKS = 3, T = 32, MAX_GLOBAL = 36, STEPS = 3 };

static tsr_model_args model(void) {
    tsr_model_args a = {.flavor = "wide-vocab", .dim = 16, .n_layers = 2, .n_heads = 2, .n_kv_heads = 1,
                        .ffn_dim = 32, .vocab_size = 1000, .norm_eps = 1e-5f, .rope_theta = 500000.0f,
                        .max_seq_len = T};
    return a;
}

static tsr_trainer *trainer(tsr_comm *c, int shard, int global, int local) {
    tsr_error e = {0};
    tsr_train_config cfg;
    tsr_config_defaults(&cfg);
    cfg.model.flavor = TSR_FLAVOR_DEBUG;
    cfg.training.seq_len = T;
    cfg.training.global_batch_size = global;
    cfg.training.local_batch_size = local;
    cfg.training.seed = 7;
    cfg.parallelism.data_parallel_shard_degree = shard;
    REQUIRE(tsr_config_validate(&cfg, shard, &e) == 0, "tsr_config_validate: %s", e.msg);
    tsr_model_args a = model();
    tsr_trainer *t = NULL;
    REQUIRE(tsr_trainer_new_args(&cfg, &a, c, &t, &e) == 0, "tsr_trainer_new_args: %s", e.msg);
    REQUIRE(tsr_trainer_init_params(t, &e) == 0, "init: %s", e.msg);
    /* norm weights start at 1 in every norm: each one its own values here (the
     * same in every layout), so that a norm's weight taken for another's shows */
    for (size_t p = 0; p < t->decls.n_params; p++) {
        tsr_box b;
        float *w = tsr_trainer_param(t, p, &b);
        if (w && t->decls.decls[p].ndim == 1)
            for (uint64_t i = 0; i < b.extent[0]; i++) w[i] = 1.0f + 0.05f * (float)(p % 5) + 0.01f * (float)((b.offset[0] + i) % 7);
    }
    return t;
}

static int relaunch(void) { return check_mpi_relaunch("3", "300"); }

/* One run: `global` samples, `local` a micro-batch, on dp_shard=3 against the
 * reference; vp: whether the output should be vocabulary-parallel. */
static void run(tsr_comm *world, tsr_comm *self, int global, int local, int vp) {
    tsr_error e = {0};
    uint32_t me = tsr_comm_rank(world);
    static int inputs[MAX_GLOBAL * T], targets[MAX_GLOBAL * T];
    uint32_t x = 2024;
    for (int i = 0; i < global * T; i++) {
        x = x * 1664525u + 1013904223u;
        inputs[i] = (int)((x >> 8) % 1000);
        x = x * 1664525u + 1013904223u;
        targets[i] = (int)((x >> 8) % 1000);
    }
    tsr_trainer *ref = trainer(self, 1, global, local), *t = trainer(world, RANKS, global, local);
    CHECK(t->head_vp == vp, "%d samples of %d a micro-batch: the output %s vocabulary-parallel", global, local,
          t->head_vp ? "is" : "is not");
    if (!vp)
        CHECK(t->hrounds >= 5, "the output went through %llu rounds, not several", (unsigned long long)t->hrounds);
    /* the embedding's rows for every rank's tokens do not fit in the unit buffer
     * at once: they go in rounds of tokens */
    CHECK(t->unit_max < (uint64_t)RANKS * (uint64_t)model().dim * t->N,
          "a unit buffer of %llu floats holds the embedding rows of %d ranks' %zu tokens at once",
          (unsigned long long)t->unit_max, RANKS, t->N);
    uint64_t layer = t->units[1].full_n, model_floats = 0;
    for (size_t p = 0; p < t->decls.n_params; p++) model_floats += t->par[p].full_n;
    CHECK(t->n_full_elems <= 3 * layer && t->n_full_elems < model_floats / 4,
          "FSDP buffers of %zu floats: a layer is %llu, the model %llu", t->n_full_elems, (unsigned long long)layer,
          (unsigned long long)model_floats);
    size_t per = (size_t)(global / RANKS) * T;
    for (int s = 1; s <= STEPS; s++) {
        double l0, g0, l1, g1;
        REQUIRE(tsr_trainer_step(ref, s, inputs, targets, 1, &l0, &g0, &e) == 0, "reference step: %s", e.msg);
        REQUIRE(tsr_trainer_step(t, s, inputs + me * per, targets + me * per, 1, &l1, &g1, &e) == 0, "step: %s",
                e.msg);
        CHECK(fabs(l0 - l1) <= 1e-5 * fabs(l0) && fabs(g0 - g1) <= 1e-5 * fabs(g0),
              "%s, step %d: loss %.9g and gradient norm %.9g with FSDP, %.9g and %.9g alone",
              vp ? "vocabulary-parallel" : "rounds", s, l1, g1, l0, g0);
    }
    int bad = 0;
    for (size_t p = 0; p < t->decls.n_params; p++) {
        tsr_box b, rb;
        const float *w = tsr_trainer_param(t, p, &b), *rw = tsr_trainer_param(ref, p, &rb);
        if (!w) continue;
        const tsr_tensor_decl *d = &t->decls.decls[p];
        uint64_t cols = d->ndim == 2 ? b.extent[1] : 1, gcols = d->ndim == 2 ? d->shape[1] : 1;
        for (uint64_t i = 0; i < b.extent[0]; i++)
            for (uint64_t j = 0; j < cols; j++) {
                float got = w[i * cols + j];
                float want = rw[(b.offset[0] + i) * gcols + (d->ndim == 2 ? b.offset[1] : 0) + j];
                if (fabsf(got - want) > 1e-6f + 1e-5f * fabsf(want) && bad++ < 3)
                    fprintf(stderr, "rank %u: %s[%llu,%llu] is %.9g, %.9g alone\n", me, d->name,
                            (unsigned long long)(b.offset[0] + i), (unsigned long long)j, got, want);
            }
    }
    CHECK(bad == 0, "%s: rank %u: %d weights differ from the reference's", vp ? "vocabulary-parallel" : "rounds",
          me, bad);
    tsr_trainer_free(ref);
    tsr_trainer_free(t);
}

int main(void) {
    if (!getenv("OMPI_COMM_WORLD_SIZE") && !getenv("PMI_SIZE")) return relaunch();
    tsr_error e = {0};
    tsr_comm *world = tsr_comm_mpi_world(&e), *self = tsr_comm_self();
    REQUIRE(world && self, "%s", e.msg);
    REQUIRE(tsr_comm_size(world) == RANKS, "run on %d ranks", RANKS);
    run(world, self, 12, 2, 1);
    run(world, self, 36, 12, 0);
    tsr_comm_free(self);
    tsr_comm_free(world);
    return check_done();
}
