/* job.h: the training job (train_job), shared by train_loop.c (the loop: data,
 * steps, logging) and checkpoint.c (its checkpoints: the durable tier through
 * the engine, the local tier, resume). Not a public interface. */
#ifndef TSR_JOB_H
#define TSR_JOB_H

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "data.h"
#include "heartbeat.h"
#include "local_tier.h"
#include "trainer_impl.h"

/* The blobs of a training checkpoint beside its tensors (checkpoint.c). */
enum { B_STEP, B_POS, B_CONFIG, B_MODEL, B_RNG, B_SCHED, N_BLOBS };

typedef struct train_job {
    tsr_trainer *t;
    tsr_engine *engine;
    char root[PATH_MAX];
    tsr_state_box *boxes;
    size_t n_boxes;
    tsr_state_blob blobs[N_BLOBS];
    uint8_t step_le[8], pos_bytes[TSR_DATA_POS_BYTES], rng_le[8];
    char *config_text;
    size_t config_len;
    char model_text[512], sched_text[128];
    /* the run */
    FILE *log, *metrics;
    tsr_loader *loader;
    int *inputs, *targets;
    tsr_data_pos pos;
    int start;          /* the step loaded (0: none); the run trains start+1.. */
    double t_log, blocked, blocked_total, step_time_total;
    double data_total; /* seconds of the steps in the data plane's collectives, waits included */
    size_t dev_peak, dev_total; /* a GPU's bytes in use at the end of a step, the most; its size */
    int steps_since;
    int last_save, last_save_refused; /* the step of the last save, and whether it was refused at once */
    tsr_error last_save_err;
    double save_t0;     /* tsr_now() when the save in flight began (0: none seen in flight) */
    double durable_s;   /* the last save's time to its commit, as the steps saw it (0: none measured) */
    int preempted;      /* the run stopped early: tsr_job_ckpt_preempt */
    tsr_heartbeat *hb; /* the supervisor's, under tessera launch; NULL otherwise */
    uint64_t first_sample; /* the step's batch: its first sample over the epochs */
    tsr_local_tier *local; /* the local tier (checkpoint.local_interval); NULL when off */
    char local_root[PATH_MAX];
    /* the replica check (sdc.c) */
    uint64_t *sdc_hash; /* two words of the trainer's memory: the hashes */
    double sdc_seconds; /* the checks' time */
    int sdc_checks;
} train_job;

/* out = rel if absolute or a location with a scheme (s3://bucket/prefix),
 * else base/rel. @return 1 if it does not fit. */
static inline int tsr_job_join(char *out, size_t len, const char *base, const char *rel) {
    int n = rel[0] == '/' || strstr(rel, "://") || !base[0] ? snprintf(out, len, "%s", rel)
                                                           : snprintf(out, len, "%s/%s", base, rel);
    return n < 0 || (size_t)n >= len;
}

/* checkpoint.c: the job's checkpoint policy.
 * tsr_job_ckpt_open(): after the loop's own opening (data, the texts of the
 * config and the model): the checkpoint root; with checkpoints (or
 * checkpoint.initial_load_path) the engine and the local tier, the resume from
 * the checkpoint the job starts from (the local tier's newest snapshot or the
 * durable tier's), the staging arena and the saves' plan; else, or with no
 * checkpoint to start from, fresh parameters.
 * tsr_job_ckpt_step(): after step `step`: its checkpoint every
 * checkpoint.interval steps and at the last, its snapshot in the local tier
 * every checkpoint.local_interval steps; the time they block counts in
 * j->blocked. Fails only when checkpointing cannot go on.
 * tsr_job_ckpt_staged(): before each optimizer step (tsr_trainer_before_update,
 * ctx the job): the copies of the last save and snapshot done.
 * tsr_job_ckpt_finish(): after the last step (rc: the run's status so far): the
 * last save completed, the model-only checkpoint; a failed checkpoint of the
 * last step fails the run.
 * tsr_job_ckpt_preempt(): collective; after step `step` at which the
 * supervisor asked the job to stop (tsr_heartbeat_preempt, agreed in the step):
 * the copies in flight done, `step`'s snapshot committed to the local tier and,
 * when the last durable save's measured time fits what is left of the grace on
 * every rank, its checkpoint committed to the durable tier; then the
 * TSR_HB_PREEMPTED record and a line in the log.
 * tsr_job_ckpt_close(): the local tier and the engine closed, the boxes freed. */
int tsr_job_ckpt_open(train_job *j, tsr_error *err);
/* tsr_job_ckpt_due(): whether tsr_job_ckpt_step saves or snapshots after `step`. */
int tsr_job_ckpt_due(const train_job *j, int step);
int tsr_job_ckpt_step(train_job *j, int step, tsr_error *err);
void tsr_job_ckpt_staged(void *ctx);
int tsr_job_ckpt_finish(train_job *j, int rc, tsr_error *err);
int tsr_job_ckpt_preempt(train_job *j, int step, tsr_error *err);
void tsr_job_ckpt_close(train_job *j);

/* sdc.c: the replica check (silent data corruption). tsr_job_sdc_step():
 * after step `step`'s optimizer step: the chaos bit flip the supervisor asked
 * for, if any; then, every training.sdc_check_interval steps, before every
 * checkpoint and at the last step, the holders of each replicated tensor
 * compare hashes of it. @return 0, or TSR_ECORRUPT naming the ranks and hosts
 * whose copies differ (every rank fails the step), or a collective's failure. */
int tsr_job_sdc_step(train_job *j, int step, tsr_error *err);

#endif
