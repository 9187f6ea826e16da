/* config.h: the trainer's job config: a TorchTitan-style TOML file plus
 * command-line overrides of single keys.
 *
 *   tessera train --config train/configs/small.toml --training.steps=50
 *
 * The file is the [section] / key = value subset of TOML that TorchTitan's job
 * configs use: comments (#), strings ("..." with escapes, and '...' literal
 * strings), decimal integers, floats (8e-4, 1.0), true / false. Arrays, inline
 * tables, dotted keys, multi-line strings and duplicate keys or sections are
 * refused with "FILE:LINE: reason" (arrays and inline tables are skipped only as
 * the values of TorchTitan keys that tessera ignores, so that TorchTitan's own
 * configs load).
 *
 * Keys have TorchTitan's names and, unless noted, TorchTitan's defaults. Keys
 * marked "tessera's own" below do not exist in TorchTitan. TorchTitan keys that
 * tessera cannot honour on CPU (compile.*, float8.*, activation_checkpoint.*,
 * training.mixed_precision_param, ...) are accepted and listed in
 * tsr_train_config.warnings ("ignored on CPU: ...") unless their value is false.
 * Older TorchTitan spellings are accepted as aliases: training.batch_size,
 * checkpoint.enable_checkpoint, checkpoint.model_weights_only,
 * lr_scheduler.lr_min, debug.seed.
 *
 * Usage: tsr_config_load (defaults, then the file), tsr_config_override for each
 * --section.key=value, tsr_config_validate once the world size is known, then
 * read the fields. tsr_config_to_toml gives the effective config as a file that
 * loads back to the same values (stored in checkpoints, printed by the trainer).
 */
#ifndef TSR_CONFIG_H
#define TSR_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tsr_ckpt.h"

#define TSR_CONFIG_STR 512       /* bytes in a string value, with its NUL */
#define TSR_CONFIG_WARNINGS 4096 /* bytes of warning text */

/* model.flavor. TorchTitan's "debugmodel" is an alias of debug, "8B" of 8b. */
typedef enum tsr_flavor {
    TSR_FLAVOR_DEBUG,
    TSR_FLAVOR_SMALL,
    TSR_FLAVOR_124M,
    TSR_FLAVOR_1B,
    TSR_FLAVOR_8B,
    TSR_FLAVOR_CHECKPOINT, /* tessera's own: the shapes of the checkpoint the job starts
                              from (an import of a model of other shapes) */
} tsr_flavor;

/* lr_scheduler.decay_type: the shape of the decay from lr to lr * min_lr_factor. */
typedef enum tsr_decay_type {
    TSR_DECAY_LINEAR, /* 1 - p */
    TSR_DECAY_SQRT,   /* 1 - sqrt(p) */
    TSR_DECAY_COSINE, /* (1 + cos(pi p)) / 2 */
} tsr_decay_type;

/* checkpoint.async_mode. TorchTitan's "async_with_pinned_mem" is read as async. */
typedef enum tsr_async_mode {
    TSR_ASYNC_DISABLED, /* the training loop waits for each save to commit */
    TSR_ASYNC_ON,       /* the loop waits only for staging (README, "Where things happen") */
} tsr_async_mode;

/* parallelism.pipeline_parallel_schedule ("1F1B", "GPipe"; any case). */
typedef enum tsr_pp_schedule {
    TSR_SCHED_1F1B,
    TSR_SCHED_GPIPE,
} tsr_pp_schedule;

/* parallelism.data_plane: how a device trainer's collectives move. */
typedef enum tsr_data_plane_mode {
    TSR_PLANE_AUTO,   /* NCCL where each rank of a node has a GPU of its own, else staged */
    TSR_PLANE_NCCL,   /* NCCL, on the trainer's stream; ranks that share a GPU are refused */
    TSR_PLANE_STAGED, /* through the host: copied there, MPI, copied back */
} tsr_data_plane_mode;

/* training.device: where the trainer's memory and kernels are. */
typedef enum tsr_device {
    TSR_DEVICE_CPU,   /* host memory, the CPU kernels */
    TSR_DEVICE_CUDA,  /* the rank's GPU (the CUDA build) */
    TSR_DEVICE_GUARD, /* tests: the device's call sequence on the CPU, over memory host code cannot touch
                         (TSR_MEM_GUARD), its collectives staged through the host */
} tsr_device;

typedef struct tsr_train_config {
    struct {
        char dump_folder[TSR_CONFIG_STR]; /* "./outputs": every output of the job goes under it */
        char description[TSR_CONFIG_STR]; /* "default job" */
    } job;
    struct {
        char name[32];     /* "llama3", the only architecture */
        tsr_flavor flavor; /* debug (TorchTitan: "debugmodel") */
    } model;
    struct {
        char name[32];       /* "AdamW", the only optimizer */
        double lr;           /* 8e-4, > 0 */
        double beta1, beta2; /* 0.9, 0.95, in [0, 1) */
        double eps;          /* 1e-8, > 0 */
        double weight_decay; /* 0.1, >= 0 (decoupled, AdamW) */
    } optimizer;
    struct {
        int warmup_steps;   /* 200: lr rises linearly over steps 1..warmup_steps */
        double decay_ratio; /* fraction of training.steps that decay, in [0, 1]; -1: unset,
                               decay starts right after warmup (TorchTitan's None) */
        tsr_decay_type decay_type; /* cosine (TorchTitan's default is linear; tessera's is cosine) */
        double min_lr_factor;      /* 0.0: the decay ends at lr * min_lr_factor, in [0, 1] */
    } lr_scheduler;
    struct {
        int local_batch_size;  /* 8: sequences per data-parallel rank per step */
        int global_batch_size; /* -1: local_batch_size * dp degree (resolved by validate);
                                  a multiple of it means gradient accumulation */
        int seq_len;           /* 2048: tokens per sequence */
        double max_norm;       /* 1.0: gradient clipping, global L2 norm, > 0 */
        int steps;             /* 10000: optimizer steps of the whole job */
        int64_t seed;          /* -1: unset (TorchTitan's None) -> TSR_CONFIG_DEFAULT_SEED by
                                  validate; else >= 0 */
        char dataset[TSR_CONFIG_STR];      /* "synthetic": the generated corpus; any other name
                                              reads the token shards in dataset_path */
        char dataset_path[TSR_CONFIG_STR]; /* "": a directory of train_*.bin / val_*.bin
                                              shards (tessera data prep) */
        /* tessera's own: skipping a window of data (tessera launch's NaN rollback,
           README "Keeping a run alive"): before step skip_data_after_step + 1 the
           data position advances by skip_data_steps global batches, which no step
           trains on. A job resumed after that step has the skip in its saved
           position already. */
        int skip_data_after_step; /* -1: no skip */
        int skip_data_steps;      /* 0 */
        /* TorchTitan's mixed precision: TSR_F32 ("float32", tessera's default,
           the exact path; TorchTitan's is "bfloat16") or TSR_BF16: matrix
           products take bf16 operands and accumulate in f32; the master
           weights, AdamW's moments and the checkpoints stay f32. */
        int mixed_precision_param;
        int mixed_precision_reduce; /* TSR_F32 only: gradients are reduced in f32 */
        tsr_device device;        /* "cpu" */
        /* tessera's own: every sdc_check_interval steps, and before every
           checkpoint, the ranks that hold copies of a tensor (dp_replicate
           replicas, the norm weights over tp) compare hashes of what they hold
           (train/sdc.c; README "Keeping a run alive"). 10; 0: off. */
        int sdc_check_interval;
    } training;
    struct {
        int data_parallel_replicate_degree; /* 1 */
        int data_parallel_shard_degree;     /* -1: the rest of the ranks (resolved by validate) */
        int tensor_parallel_degree;         /* 1 */
        int pipeline_parallel_degree;       /* 1 */
        int pipeline_parallel_microbatch_size; /* 1: sequences per pipeline micro-batch */
        tsr_pp_schedule pipeline_parallel_schedule; /* 1F1B */
        tsr_data_plane_mode data_plane;             /* "auto" */
    } parallelism;
    struct {
        bool enable;                  /* false (TorchTitan before mid-2025: enable_checkpoint) */
        char folder[TSR_CONFIG_STR];  /* "checkpoint", relative to job.dump_folder unless absolute */
        int interval;                 /* 500: save every this many steps */
        int keep_latest_k;            /* 10: keep the newest K checkpoints; 0 keeps all */
        tsr_async_mode async_mode;    /* disabled */
        int load_step;                /* -1: resume from the newest checkpoint; else that step */
        bool load_poisoned;           /* false: a load_step whose checkpoint is poisoned (a NaN or
                                         an infinity in its state) is refused; true: loaded
                                         (tessera's own) */
        bool last_save_model_only;    /* true: the final save holds the model only */
        int export_dtype;             /* TSR_F32 ("float32") or TSR_BF16 ("bfloat16"): dtype
                                         of the model-only last save */
        bool last_save_in_hf;         /* true: the model-only last save also as a Hugging Face
                                         folder (safetensors, config, tokenizer): ROOT/hf-step-N */
        char initial_load_path[TSR_CONFIG_STR]; /* "": a checkpoint to start from when the
                                                   job's own folder has none */
        bool initial_load_model_only; /* true: from initial_load_path take the model only */
        int exclude_from_loading;     /* TSR_EXCLUDE_* bits (TorchTitan's list): the parts of
                                         the state a load leaves fresh; 0: load all */
        /* tessera's own: archiving of committed checkpoints to object storage */
        char archive_url[TSR_CONFIG_STR]; /* "": none; s3://bucket/prefix */
        int archive_interval;             /* 1: archive every Nth checkpoint (step multiple of
                                             N x interval) */
        int archive_keep_latest_k;        /* 0: keep every archived checkpoint; else the newest K */
        double commit_timeout_s;          /* 1800: seconds rank 0 waits for the other ranks at
                                             the end of a save before it fails the save (0:
                                             forever; TSR_COMMIT_TIMEOUT overrides it) */
        int codec;                        /* TSR_CODEC_AUTO ("auto"): each frame encoded or stored
                                             raw, whichever keeps the writer busy; "raw", "zstd"
                                             or "bytegroup" force that codec */
        /* tessera's own: the local tier, snapshots in node memory (ckpt/local_tier.h) */
        int local_interval;                 /* 0: off; else a snapshot every N steps */
        char local_folder[TSR_CONFIG_STR];  /* "": /dev/shm/tessera-<hash of job.dump_folder> */
        char local_nodes[TSR_CONFIG_STR];   /* "": every rank on one node; "0,1,...": the ids of
                                               the nodes the ranks are spread over, in rank order
                                               (set by tessera launch) */
    } checkpoint;
    struct {
        int log_freq;               /* 10: log (and write a metrics line) every N steps */
        char file[TSR_CONFIG_STR];  /* tessera's own: "metrics.jsonl", the JSON-lines metrics,
                                       relative to job.dump_folder unless absolute */
    } metrics;

    /* "FILE:LINE: ignored on CPU: section.key = value" lines, '\n'-terminated,
     * one per TorchTitan key that tessera does not honour; n_warnings counts them
     * all (text that does not fit is cut at a line boundary). */
    char warnings[TSR_CONFIG_WARNINGS];
    int n_warnings;
} tsr_train_config;

/* checkpoint.exclude_from_loading: TorchTitan's names of the parts of a
 * checkpoint's state, as bits. The model cannot be left out. */
enum {
    TSR_EXCLUDE_OPTIMIZER = 1,    /* "optimizer": AdamW's moments zero, its step count from the load */
    TSR_EXCLUDE_LR_SCHEDULER = 2, /* "lr_scheduler": the schedule from its start at the load */
    TSR_EXCLUDE_DATALOADER = 4,   /* "dataloader": the data from its first sample */
    TSR_EXCLUDE_TRAIN_STATE = 8,  /* "train_state": the step count from 0 */
};
/* tsr_exclude_names(): bits as "optimizer, dataloader" into buf. @return buf. */
const char *tsr_exclude_names(int bits, char *buf, size_t len);

/* The seed used when training.seed is unset (-1). */
#define TSR_CONFIG_DEFAULT_SEED 42
/* checkpoint.folder by default. */
#define TSR_CONFIG_DEFAULT_CKPT_FOLDER "checkpoint"

/* tsr_config_defaults(): every field to its default (above); no warnings. */
void tsr_config_defaults(tsr_train_config *c);

/* tsr_config_load(): *c = defaults, then the keys of the TOML file at `path`
 * (NULL: defaults only). Errors (TSR_EINVAL) read "PATH:LINE: reason": a syntax
 * error, an unsupported TOML construct, an unknown section or key (with "did you
 * mean ...?" when a known one is close), a duplicate key or section, a value of
 * the wrong type (naming key, value and expected type) or out of range. A file
 * that cannot be read gives TSR_ENOTFOUND or TSR_EIO naming it. On error *c holds
 * the keys before the bad one. */
int tsr_config_load(tsr_train_config *c, const char *path, tsr_error *err);

/* tsr_config_parse(): the keys of the TOML text (len bytes, not necessarily
 * NUL-terminated) on top of *c, as tsr_config_load reads a file; errors read
 * "NAME:LINE: reason". tsr_config_load is this after tsr_config_defaults. */
int tsr_config_parse(tsr_train_config *c, const char *name, const char *text, size_t len, tsr_error *err);

/* tsr_config_override(): sets one key from "--section.key=value" or
 * "section.key=value". The value is read as the key's type; strings are taken
 * as they are (no quotes). A boolean key alone ("--checkpoint.enable") means
 * true. Errors as for tsr_config_load, prefixed with the argument. */
int tsr_config_override(tsr_train_config *c, const char *arg, tsr_error *err);

/* tsr_config_validate(): the checks that involve several keys or the job, and
 * the resolution of what was left to the job, for `world_size` ranks:
 *  - data_parallel_shard_degree -1 becomes world_size / (replicate * tp * pp);
 *    the product of the four degrees must equal world_size (the error says
 *    both);
 *  - global_batch_size -1 becomes local_batch_size * replicate * shard; else it
 *    must be a multiple of that (the quotient is the gradient accumulation);
 *  - with pipeline parallelism, local_batch_size must be a multiple of
 *    pipeline_parallel_microbatch_size;
 *  - training.seed -1 becomes TSR_CONFIG_DEFAULT_SEED;
 *  - a dataset other than "synthetic" needs training.dataset_path;
 *  - warmup_steps > steps is allowed but adds a warning;
 *  - a checkpoint.folder other than the default while checkpoint.enable is false
 *    adds a warning (nothing is saved there, nor resumed from it).
 * Idempotent. @return 0 or TSR_EINVAL with a message naming the keys. */
int tsr_config_validate(tsr_train_config *c, int world_size, tsr_error *err);

/* tsr_config_to_toml(): the effective config as TOML, every key with its
 * canonical name, into a malloc'd NUL-terminated *text of *len bytes (free()).
 * Loading it gives back the same field values. @return 0 or TSR_ENOMEM. */
int tsr_config_to_toml(const tsr_train_config *c, char **text, size_t *len);

/* tsr_config_lr_at(): the learning rate of step `step` (1-based, 1..steps):
 * linear warmup over steps 1..W (step s gets lr*s/W), then constant, then the
 * decay over the last D steps, D = round(decay_ratio * steps) or steps - W when
 * decay_ratio is unset, clamped to steps - W. Decay progress p runs over
 * 1/(D+1) .. D/(D+1) so that no step gets exactly the final lr*min_lr_factor
 * (TorchTitan's virtual last step). */
double tsr_config_lr_at(const tsr_train_config *c, int step);

/* tsr_flavor_name(): "debug", "small", "124m", "1b", "8b"; "?" otherwise. */
const char *tsr_flavor_name(int flavor);

#endif
