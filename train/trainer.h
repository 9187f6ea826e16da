/* trainer.h: the training job: the model on a mesh of ranks (FSDP, TP, PP and
 * replicated data parallelism), its steps, and its checkpoints through the
 * engine (README, "The trainer").
 *
 * The mesh is [pp][dp_replicate][dp_shard][tp] as in the layout algebra; a
 * rank's parameters are exactly the boxes tsr_layout_boxes gives it, so the
 * checkpoint of any layout loads into any other.
 *
 * Compute goes through the kernels (the headers of kernels/) and communication through
 * tsr_comm: a CUDA/NCCL backend replaces those two without touching this file's
 * callers.
 */
#ifndef TSR_TRAINER_H
#define TSR_TRAINER_H

#include <stdio.h>

#include "config.h"
#include "model.h"
#include "tsr_ckpt.h"

typedef struct tsr_trainer tsr_trainer;

/* tsr_trainer_new(): collective over `world`. `cfg` must be validated for the
 * world size. Allocates the rank's parameters, gradients, optimizer state and
 * activations, all zero: the parameters are then either loaded (a resumed job:
 * no time spent drawing values the load overwrites) or initialized with
 * tsr_trainer_init_params(). */
int tsr_trainer_new(const tsr_train_config *cfg, tsr_comm *world, tsr_trainer **out, tsr_error *err);
/* tsr_trainer_new_args(): the same for the model shapes `args` instead of the
 * config's flavor (a checkpoint's own shapes, an imported model). */
int tsr_trainer_new_args(const tsr_train_config *cfg, const tsr_model_args *args, tsr_comm *world,
                         tsr_trainer **out, tsr_error *err);
void tsr_trainer_free(tsr_trainer *t);
/* tsr_trainer_before_update(): fn(ctx) runs in every tsr_trainer_step that
 * optimizes, right before the optimizer changes the weights and moments (after
 * forward and backward, which only read them): where a checkpoint whose copy
 * overlaps the step waits for it (tsr_engine_staged). NULL: nothing. */
void tsr_trainer_before_update(tsr_trainer *t, void (*fn)(void *ctx), void *ctx);
/* tsr_trainer_init_params(): this rank's parameter shards as a fresh model's
 * (tsr_model_init_box with training.seed: the same values in any layout). */
int tsr_trainer_init_params(tsr_trainer *t, tsr_error *err);

/* tsr_trainer_step(): one optimizer step on this rank's part of a global batch:
 * inputs and targets (B_rank, T) with B_rank = global_batch / dp samples (every
 * rank of one data-parallel index passes the same ones). Forward and backward
 * over the micro-batches (pipeline schedule of the config), gradient reduction,
 * clipping, AdamW with the learning rate of `step` (1-based). *loss is the mean
 * loss of the global batch, *grad_norm the global norm before clipping (both the
 * same on every rank). With optimize == 0 it stops after the gradients (tests). */
int tsr_trainer_step(tsr_trainer *t, int step, const int *inputs, const int *targets, int optimize,
                     double *loss, double *grad_norm, tsr_error *err);

/* tsr_trainer_run(): the whole job: data, resume from the newest (or the
 * configured) checkpoint in any layout, the steps with logging to `log` (rank 0)
 * and the metrics file, checkpoints every interval steps, the final model-only
 * save. Collective. */
int tsr_trainer_run(tsr_trainer *t, FILE *log, tsr_error *err);

/* tsr_train_start_shapes(): the model shapes of the checkpoint the job would
 * start from (for model.flavor = "checkpoint"). */
int tsr_train_start_shapes(const tsr_train_config *cfg, tsr_model_args *a, tsr_error *err);

/* For tests and tools: the rank's shard of parameter p (TSR_P_* order of
 * model.h) and its gradient (after tsr_trainer_step), with its box; NULL when
 * the rank holds nothing of it. They are in the trainer's memory (a device's
 * with training.device = cuda): tsr_trainer_read copies n floats of one to the
 * host. Logits of the last micro-batch's first sample
 * are kept when keep_logits is set before the step ((T, V) floats). */
float *tsr_trainer_param(tsr_trainer *t, size_t p, tsr_box *box);
float *tsr_trainer_grad(tsr_trainer *t, size_t p, tsr_box *box);
int tsr_trainer_read(tsr_trainer *t, float *dst, const float *src, size_t n, tsr_error *err);
void tsr_trainer_keep_logits(tsr_trainer *t, float *dst);
const tsr_model_args *tsr_trainer_model(const tsr_trainer *t);
const tsr_model_decls *tsr_trainer_decls(const tsr_trainer *t);

/* tsr_model_report(): parameter count and per-rank memory of the config's model
 * under its layout (world = the product of its degrees), without allocating the
 * model: printed to `out`. */
int tsr_model_report(const tsr_train_config *cfg, FILE *out, tsr_error *err);

#endif
