/* config_check.c: the job config's defaults, its validation against the world
 * size, and the learning-rate schedule it describes. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "config_impl.h"

/* ------------------------------------------------------------ defaults */

void tsr_config_defaults(tsr_train_config *c) {
    memset(c, 0, sizeof *c);
    strcpy(c->job.dump_folder, "./outputs");
    strcpy(c->job.description, "default job");
    strcpy(c->model.name, "llama3");
    c->model.flavor = TSR_FLAVOR_DEBUG;
    strcpy(c->optimizer.name, "AdamW");
    c->optimizer.lr = 8e-4;
    c->optimizer.beta1 = 0.9;
    c->optimizer.beta2 = 0.95;
    c->optimizer.eps = 1e-8;
    c->optimizer.weight_decay = 0.1;
    c->lr_scheduler.warmup_steps = 200;
    c->lr_scheduler.decay_ratio = -1.0;
    c->lr_scheduler.decay_type = TSR_DECAY_COSINE;
    c->lr_scheduler.min_lr_factor = 0.0;
    c->training.local_batch_size = 8;
    c->training.global_batch_size = -1;
    c->training.seq_len = 2048;
    c->training.max_norm = 1.0;
    c->training.steps = 10000;
    c->training.seed = -1;
    strcpy(c->training.dataset, "synthetic");
    c->training.skip_data_after_step = -1;
    c->training.sdc_check_interval = 10;
    c->training.mixed_precision_param = TSR_F32;
    c->training.mixed_precision_reduce = TSR_F32;
    c->parallelism.data_parallel_replicate_degree = 1;
    c->parallelism.data_parallel_shard_degree = -1;
    c->parallelism.tensor_parallel_degree = 1;
    c->parallelism.pipeline_parallel_degree = 1;
    c->parallelism.pipeline_parallel_microbatch_size = 1;
    c->parallelism.pipeline_parallel_schedule = TSR_SCHED_1F1B;
    c->checkpoint.enable = false;
    strcpy(c->checkpoint.folder, TSR_CONFIG_DEFAULT_CKPT_FOLDER);
    c->checkpoint.interval = 500;
    c->checkpoint.keep_latest_k = 10;
    c->checkpoint.async_mode = TSR_ASYNC_DISABLED;
    c->checkpoint.load_step = -1;
    c->checkpoint.last_save_model_only = true;
    c->checkpoint.export_dtype = TSR_F32;
    c->checkpoint.initial_load_model_only = true;
    c->checkpoint.archive_interval = 1;
    c->checkpoint.commit_timeout_s = 1800;
    c->checkpoint.codec = TSR_CODEC_AUTO;
    c->metrics.log_freq = 10;
    strcpy(c->metrics.file, "metrics.jsonl");
}

/* ------------------------------------------------------------ validation */

int tsr_config_validate(tsr_train_config *c, int world_size, tsr_error *err) {
    if (world_size < 1) return tsr_err(err, TSR_EINVAL, "config: world size %d: must be >= 1", world_size);
    int rep = c->parallelism.data_parallel_replicate_degree, tp = c->parallelism.tensor_parallel_degree,
        pp = c->parallelism.pipeline_parallel_degree, shard = c->parallelism.data_parallel_shard_degree;
    int64_t others = (int64_t)rep * tp * pp;
    if (shard == -1) {
        if (others > world_size || world_size % others)
            return tsr_err(err, TSR_EINVAL,
                           "parallelism: %d ranks cannot be split: data_parallel_replicate_degree (%d) * "
                           "tensor_parallel_degree (%d) * pipeline_parallel_degree (%d) = %lld does not "
                           "divide the world size %d",
                           world_size, rep, tp, pp, (long long)others, world_size);
        shard = (int)(world_size / others);
    }
    int64_t product = others * shard;
    if (product != world_size)
        return tsr_err(err, TSR_EINVAL,
                       "parallelism: data_parallel_replicate_degree (%d) * data_parallel_shard_degree (%d) * "
                       "tensor_parallel_degree (%d) * pipeline_parallel_degree (%d) = %lld, but the job "
                       "has %d rank%s: the product of the degrees must equal the world size",
                       rep, shard, tp, pp, (long long)product, world_size, world_size == 1 ? "" : "s");
    int64_t dp = (int64_t)rep * shard;
    int64_t per_step = dp * c->training.local_batch_size;
    if (per_step > INT_MAX)
        return tsr_err(err, TSR_EINVAL, "training.local_batch_size (%d) * data-parallel degree (%lld) is too large",
                       c->training.local_batch_size, (long long)dp);
    int global = c->training.global_batch_size;
    if (global == -1) global = (int)per_step;
    else if (global % per_step)
        return tsr_err(err, TSR_EINVAL,
                       "training.global_batch_size (%d) must be a multiple of local_batch_size (%d) * "
                       "data-parallel degree (%lld) = %lld",
                       global, c->training.local_batch_size, (long long)dp, (long long)per_step);
    if (pp > 1 && c->training.local_batch_size % c->parallelism.pipeline_parallel_microbatch_size)
        return tsr_err(err, TSR_EINVAL,
                       "training.local_batch_size (%d) must be a multiple of "
                       "parallelism.pipeline_parallel_microbatch_size (%d) with pipeline parallelism",
                       c->training.local_batch_size, c->parallelism.pipeline_parallel_microbatch_size);
    if (strcmp(c->training.dataset, "synthetic") != 0 && !c->training.dataset_path[0])
        return tsr_err(err, TSR_EINVAL,
                       "training.dataset \"%s\": only \"synthetic\" is built in; set training.dataset_path to "
                       "a directory of token shards (tessera data prep) or training.dataset = \"synthetic\"",
                       c->training.dataset);
    if (c->training.mixed_precision_reduce != TSR_F32)
        return tsr_err(err, TSR_EINVAL,
                       "training.mixed_precision_reduce = \"bfloat16\": tessera reduces gradients in float32 only "
                       "(TorchTitan's default); set it to \"float32\" or leave it out");
    if (c->parallelism.data_plane == TSR_PLANE_NCCL && c->training.device != TSR_DEVICE_CUDA)
        return tsr_err(err, TSR_EINVAL,
                       "parallelism.data_plane = \"nccl\" needs training.device = \"cuda\" (training.device is "
                       "\"%s\"): NCCL moves GPU memory only; leave data_plane at \"auto\"",
                       c->training.device == TSR_DEVICE_GUARD ? "guard" : "cpu");
    /* Only now, when every check has passed, resolve: validate leaves *c alone on error. */
    c->parallelism.data_parallel_shard_degree = shard;
    c->training.global_batch_size = global;
    if (c->training.seed == -1) c->training.seed = TSR_CONFIG_DEFAULT_SEED;
    if (c->lr_scheduler.warmup_steps > c->training.steps && !strstr(c->warnings, "warmup_steps ("))
        tsr_cfg_warn(c, "config: lr_scheduler.warmup_steps (%d) > training.steps (%d): the lr never reaches "
                       "optimizer.lr",
                    c->lr_scheduler.warmup_steps, c->training.steps);
    if (c->checkpoint.last_save_in_hf && c->checkpoint.enable && !c->checkpoint.last_save_model_only)
        return tsr_err(err, TSR_EINVAL, "checkpoint.last_save_in_hf needs checkpoint.last_save_model_only = true "
                       "(the Hugging Face folder is the model only), as TorchTitan's does");
    /* A folder of one's own says checkpoints are wanted; with enable false none is
     * saved there, and the job does not resume from it. */
    if (!c->checkpoint.enable && strcmp(c->checkpoint.folder, TSR_CONFIG_DEFAULT_CKPT_FOLDER) != 0 &&
        !strstr(c->warnings, "checkpoint.folder (\""))
        tsr_cfg_warn(c, "config: checkpoint.folder (\"%.200s\") is set but checkpoint.enable is false: no checkpoint "
                       "is saved there and the job does not resume from it (set checkpoint.enable = true)",
                    c->checkpoint.folder);
    return 0;
}

/* ------------------------------------------------------------ learning rate */

double tsr_config_lr_at(const tsr_train_config *c, int step) {
    double lr = c->optimizer.lr, m = c->lr_scheduler.min_lr_factor;
    int64_t S = c->training.steps, W = c->lr_scheduler.warmup_steps, s = step;
    if (s < 1) s = 1;
    if (s > S) s = S;
    if (W > 0 && s <= W) return lr * (double)s / (double)W;
    int64_t D = S - W;
    if (c->lr_scheduler.decay_ratio >= 0) {
        int64_t d = llround(c->lr_scheduler.decay_ratio * (double)S);
        if (d < D) D = d;
    }
    if (D <= 0 || s <= S - D) return lr; /* warmup done, not yet decaying */
    double p = (double)(s - (S - D)) / (double)(D + 1), f;
    switch (c->lr_scheduler.decay_type) {
    case TSR_DECAY_LINEAR: f = 1.0 - p; break;
    case TSR_DECAY_SQRT: f = 1.0 - sqrt(p); break;
    default: f = 0.5 * (1.0 + cos(M_PI * p)); break;
    }
    return lr * (m + (1.0 - m) * f);
}
