/* train_loop.c: the training job around the trainer: data, the steps,
 * logging and metrics. Its checkpoints (resume, saves, the local tier) are
 * checkpoint.c's. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common.h"
#include "corpus.h"
#include "data_plane.h"
#include "job.h"
#include "tokens.h"

#define SYNTHETIC_BYTES (8u << 20) /* the default corpus: 8 MiB of text */
#define SYNTHETIC_SEED 1

/* The generated default dataset in DIR: train and val shards of the byte-level
 * tokens of the corpus (5% val), written once (by rank 0). */
static int prepare_synthetic(const char *dir, tsr_error *err) {
    char tr[PATH_MAX], va[PATH_MAX];
    if (tsr_job_join(tr, sizeof tr, dir, "train_000000.bin") || tsr_job_join(va, sizeof va, dir, "val_000000.bin"))
        return tsr_err(err, TSR_EINVAL, "%s: path too long", dir);
    struct stat st;
    if (stat(tr, &st) == 0 && stat(va, &st) == 0) return 0;
    int e = tsr_mkdir_p(dir);
    if (e) return tsr_err(err, TSR_EIO, "%s: cannot create: %s", dir, strerror(e));
    char *text = NULL;
    size_t len = 0;
    int rc = tsr_corpus_generate(SYNTHETIC_SEED, SYNTHETIC_BYTES, &text, &len, err);
    if (rc) return rc;
    uint32_t *tok = malloc(len * sizeof *tok);
    if (!tok) {
        free(text);
        return tsr_err(err, TSR_ENOMEM, "out of memory");
    }
    tsr_byte_tokenize(text, len, TSR_CORPUS_DOC_SEP, tok);
    size_t n_val = len / 20;
    rc = tsr_tokens_write(va, tok, n_val, 2, err);
    if (!rc) rc = tsr_tokens_write(tr, tok + n_val, len - n_val, 2, err);
    free(tok);
    free(text);
    return rc;
}

/* ------------------------------------------------------------------- job */

/* training.skip_data_*: the data of the next skip_data_steps steps is passed
 * over (tessera launch's rollback after a NaN), as the loader would serve it. */
static int skip_data(train_job *j, tsr_error *err) {
    const tsr_train_config *c = &j->t->cfg;
    for (int k = 0; k < c->training.skip_data_steps; k++) {
        int rc = tsr_loader_next(j->loader, &j->pos, j->t->B, (int)j->t->dp_rank, (int)j->t->dp, j->inputs, j->targets,
                                 err);
        if (rc) return rc;
    }
    if (j->log && c->training.skip_data_steps)
        fprintf(j->log, "step %d: skipping the data of %d step(s) (training.skip_data_steps)\n",
                c->training.skip_data_after_step + 1, c->training.skip_data_steps);
    return 0;
}

static int open_data(train_job *j, tsr_loader **out, tsr_error *err) {
    const tsr_train_config *c = &j->t->cfg;
    char dir[PATH_MAX];
    int rc = 0;
    if (strcmp(c->training.dataset, "synthetic") == 0) {
        if (tsr_job_join(dir, sizeof dir, c->job.dump_folder, "data")) return tsr_err(err, TSR_EINVAL, "job.dump_folder: path too long");
        if (j->t->rank == 0) rc = prepare_synthetic(dir, err);
        int64_t ok = rc ? 0 : 1;
        int rc2 = tsr_comm_allreduce_min(j->t->world, &ok, rc ? NULL : err);
        if (rc || rc2) return rc ? rc : rc2;
        if (!ok) return tsr_err(err, TSR_EIO, "%s: rank 0 could not prepare the synthetic dataset", dir);
    } else {
        snprintf(dir, sizeof dir, "%s", c->training.dataset_path);
    }
    if ((rc = tsr_loader_open(dir, "train", c->training.seq_len, out, err))) return rc;
    tsr_loader_set_vocab(*out, (uint32_t)j->t->args.vocab_size);
    return 0;
}

/* Rank 0's metrics file (JSON lines under the dump folder), for appending. */
static int open_metrics(train_job *j, tsr_error *err) {
    const tsr_train_config *c = &j->t->cfg;
    char path[PATH_MAX];
    int e = tsr_job_join(path, sizeof path, c->job.dump_folder, c->metrics.file) ? ENAMETOOLONG : tsr_mkdir_p(c->job.dump_folder);
    if (e || !(j->metrics = fopen(path, "a")))
        return tsr_err(err, TSR_EIO, "%s: cannot open the metrics file: %s", path, strerror(e ? e : errno));
    return 0;
}

/* Everything a run needs before its first step: data, buffers, the texts of
 * the config and the model, the engine (and the state it resumes from), the
 * metrics file. */
static int job_open(train_job *j, tsr_error *err) {
    tsr_trainer *t = j->t;
    const tsr_train_config *c = &t->cfg;
    size_t bt = (size_t)t->B * t->T;
    int rc = open_data(j, &j->loader, err);
    if (!rc && !(j->inputs = malloc(bt * sizeof *j->inputs)) | !(j->targets = malloc(bt * sizeof *j->targets)))
        rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    if (!rc && tsr_config_to_toml(c, &j->config_text, &j->config_len)) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    if (t->args.max_seq_len < c->training.seq_len) t->args.max_seq_len = c->training.seq_len;
    tsr_model_args_to_text(&t->args, j->model_text, sizeof j->model_text);
    j->pos = (tsr_data_pos){0, 0, (uint64_t)c->training.seed};
    if (!rc) rc = tsr_job_ckpt_open(j, err);
    if (!rc && t->rank == 0) rc = open_metrics(j, err);
    return rc;
}

/* Every rank learns whether all of them are ready before the first collective
 * of a step (rank 0 alone opens the metrics file, for one). */
static int all_ready(train_job *j, int rc, tsr_error *err) {
    int64_t ready = rc == 0;
    int rc2 = tsr_comm_allreduce_min(j->t->world, &ready, rc ? NULL : err);
    if (!rc && (rc2 || !ready)) rc = rc2 ? rc2 : tsr_err(err, TSR_EINVAL, "another rank could not start (its error is above)");
    return rc;
}

static void log_start(train_job *j) {
    tsr_trainer *t = j->t;
    const tsr_train_config *c = &t->cfg;
    char lt[128];
    tsr_layout_format(&t->layout, lt, sizeof lt);
    fprintf(j->log,
            "model %s: %.2fM parameters; layout %s; global batch %d x %d tokens, %d micro-batch(es) of %d per "
            "rank; steps %d..%d\n",
            t->args.flavor, tsr_model_param_count(&t->args) / 1e6, lt, c->training.global_batch_size, t->T, t->M,
            t->mbs, j->start + 1, c->training.steps);
    if (t->kc.mem != TSR_MEM_HOST || t->kc.gemm != TSR_F32) {
        const char *dev = t->kc.mem == TSR_MEM_CUDA ? "cuda" : t->kc.mem == TSR_MEM_GUARD ? "guard" : "cpu";
        const char *plane = tsr_comm_size(t->world) == 1 ? "none (1 rank)"
                            : t->plane.staged            ? "staged through the host"
                            : t->kc.mem == TSR_MEM_CUDA  ? "NCCL"
                                                         : "MPI";
        fprintf(j->log, "device %s %d; matrix products with %s operands; data plane %s\n", dev, t->kc.device,
                t->kc.gemm == TSR_BF16 ? "bf16" : "f32", plane);
    }
    fflush(j->log);
}

/* The step's line in the log and in the metrics file; the counters restart. */
static void log_step(train_job *j, int step, double loss, double gnorm) {
    tsr_trainer *t = j->t;
    double dt = tsr_now() - j->t_log;
    double tps = (double)t->cfg.training.global_batch_size * t->T * j->steps_since / (dt > 0 ? dt : 1e-9);
    if (j->log) {
        fprintf(j->log, "step %6d  loss %8.4f  grad_norm %7.3f  lr %.3e  tok/s %9.1f  ckpt_blocked %.3fs\n", step,
                loss, gnorm, (double)t->last_lr, tps, j->blocked);
        fflush(j->log);
    }
    if (j->metrics) { /* loss and grad_norm in 17 digits: the same doubles when read back */
        fprintf(j->metrics,
                "{\"step\": %d, \"loss\": %.17g, \"grad_norm\": %.17g, \"lr\": %.9g, \"tokens_per_s\": %.3f, "
                "\"ckpt_blocked_s\": %.6f, \"first_sample\": %llu, \"samples\": %d}\n",
                step, loss, gnorm, (double)t->last_lr, tps, j->blocked, (unsigned long long)j->first_sample,
                t->cfg.training.global_batch_size);
        fflush(j->metrics);
    }
    j->t_log = tsr_now();
    j->blocked = 0;
    j->steps_since = 0;
}

/* One step: a batch, forward, backward and update, its checkpoint, its log. */
static int train_step(train_job *j, int step, tsr_error *err) {
    tsr_trainer *t = j->t;
    const tsr_train_config *c = &t->cfg;
    double t0 = tsr_now(), waited = tsr_data_seconds();
    int rc = step == c->training.skip_data_after_step + 1 ? skip_data(j, err) : 0;
    uint64_t first = j->pos.epoch * tsr_loader_samples(j->loader) + j->pos.sample;
    j->first_sample = first;
    if (!rc) rc = tsr_loader_next(j->loader, &j->pos, t->B, (int)t->dp_rank, (int)t->dp, j->inputs, j->targets, err);
    double loss = 0, gnorm = 0;
    tsr_heartbeat_fault_slow(t->rank);
    if (!rc) rc = tsr_trainer_step(t, step, j->inputs, j->targets, 1, &loss, &gnorm, err);
    if (!rc && (tsr_heartbeat_fault_nan(first, c->training.global_batch_size) || tsr_heartbeat_chaos_nan(step)))
        loss = NAN;
    if (!rc) rc = tsr_job_sdc_step(j, step, err); /* before the step counts: its state is checked */
    double took = tsr_now() - t0; /* compute: less the waits in the data plane */
    size_t used = 0;
    if (!rc && !tsr_kctx_mem_used(&t->kc, &used, &j->dev_total) && used > j->dev_peak) j->dev_peak = used;
    double compute = took - (tsr_data_seconds() - waited);
    j->data_total += took - compute;
    if (!rc) tsr_heartbeat_step(j->hb, step, loss, gnorm, took, compute > 0 ? compute : 0);
    if (!rc && !isfinite(loss)) rc = tsr_err(err, TSR_EINVAL, "step %d: the loss is %g", step, loss);
    /* the step's line before its checkpoints: a job killed once a checkpoint
     * of the step has committed has its line (the checkpoints' blocking shows
     * in the next line) */
    double t1 = tsr_now();
    j->step_time_total += t1 - t0;
    j->steps_since++;
    if (!rc && (step % c->metrics.log_freq == 0 || step == j->start + 1 || step == c->training.steps))
        log_step(j, step, loss, gnorm);
    if (!rc) rc = tsr_job_ckpt_step(j, step, err);
    j->step_time_total += tsr_now() - t1;
    return rc;
}

static void log_done(train_job *j) {
    const tsr_train_config *c = &j->t->cfg;
    int n = c->training.steps - j->start;
    fprintf(j->log,
            "done: %d steps in %.1f s, %.1f tokens/s, %.3f s (%.2f%%) blocked on checkpoints, %.1f s (%.1f%%) in "
            "collectives; checkpoints in %s\n",
            n, j->step_time_total, (double)c->training.global_batch_size * j->t->T * n / j->step_time_total,
            j->blocked_total, 100 * j->blocked_total / j->step_time_total, j->data_total,
            100 * j->data_total / j->step_time_total, c->checkpoint.enable ? j->root : "(disabled)");
    if (j->sdc_checks)
        fprintf(j->log, "replica checks: %d in %.3f s (%.2f%% of the steps' time; training.sdc_check_interval=%d)\n",
                j->sdc_checks, j->sdc_seconds, 100 * j->sdc_seconds / j->step_time_total, c->training.sdc_check_interval);
    if (j->dev_total)
        fprintf(j->log, "device memory: peak %.2f GiB in use at the end of a step, of %.2f GiB\n",
                (double)j->dev_peak / (1 << 30), (double)j->dev_total / (1 << 30));
}

static void job_close(train_job *j) {
    if (j->metrics) fclose(j->metrics);
    if (j->sdc_hash) tsr_kc_free(&j->t->kc, j->sdc_hash);
    tsr_job_ckpt_close(j);
    tsr_loader_close(j->loader);
    free(j->inputs);
    free(j->targets);
    free(j->config_text);
}

/* Whether the supervisor asked the job to stop (a preemption). */
static int stop_asked(void) { return tsr_heartbeat_preempt(NULL, NULL); }

int tsr_trainer_run(tsr_trainer *t, FILE *log, tsr_error *err) {
    train_job j = {.t = t, .log = t->rank == 0 ? log : NULL};
    int rc = tsr_heartbeat_open(t->rank, (int)tsr_comm_size(t->world), &j.hb, err);
    if (!rc) rc = job_open(&j, err);
    tsr_trainer_before_update(t, tsr_job_ckpt_staged, &j);
    rc = all_ready(&j, rc, err);
    if (!rc && j.log) log_start(&j);
    j.t_log = tsr_now();
    t->stop_poll = stop_asked; /* agreed in a step's first all-reduce, or in its last */
    for (int step = j.start + 1; !rc && step <= t->cfg.training.steps; step++) {
        rc = train_step(&j, step, err);
        if (!rc && t->stop_agreed && step < t->cfg.training.steps) {
            rc = tsr_job_ckpt_preempt(&j, step, err);
            break;
        }
    }
    t->stop_poll = NULL;
    if (j.engine) rc = tsr_job_ckpt_finish(&j, rc, err);
    if (!rc && j.log && j.step_time_total > 0 && !j.preempted) log_done(&j); /* preempted: its own line */
    tsr_trainer_before_update(t, NULL, NULL);
    job_close(&j);
    if (!rc) tsr_heartbeat_send(j.hb, TSR_HB_DONE, t->cfg.training.steps, 0, 0, 0);
    tsr_heartbeat_close(j.hb);
    return rc;
}
