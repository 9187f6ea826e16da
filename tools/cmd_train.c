/* cmd_train.c: tessera train: the training job (train/). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "commands.h"
#include "config.h"
#include "job.h"
#include "trainer.h"

static const char USAGE[] =
    "usage: [mpirun -np N] tessera train --config FILE [--section.key=value ...] [--model-info]\n"
    "Trains a Llama 3 style model on CPU over N ranks, on the mesh\n"
    "[pp][dp_replicate][dp_shard][tp] given by the parallelism.* keys (their product\n"
    "is N; data_parallel_shard_degree -1 takes the rest). FILE is a TorchTitan-style\n"
    "TOML job config (train/configs/*.toml); each --section.key=value overrides one key.\n"
    "With checkpoint.enable, a job whose checkpoint folder holds checkpoints resumes\n"
    "from the newest committed one (or checkpoint.load_step), in any layout.\n"
    "  --model-info   print the model's parameter count and per-rank memory under\n"
    "                 the config's layout, without allocating it, and exit\n"
    "Logs every metrics.log_freq steps: loss, grad norm, learning rate, tokens/s and\n"
    "the time blocked on checkpoints; the same as JSON lines in metrics.file. The\n"
    "last line sums the run: steps, tokens/s, the time blocked on checkpoints and\n"
    "rank 0's time in the collectives of training (waits for other ranks included).\n";

/* The library's messages: errors and warnings from every rank, information
 * (checkpoints archived, removed by retention) from rank 0. */
static void train_log(void *user, int level, const char *msg) {
    (void)user;
    const char *r = getenv("OMPI_COMM_WORLD_RANK");
    if (level <= 1 || !r || !strcmp(r, "0")) fprintf(stderr, "tessera train: %s\n", msg);
}

/* checkpoint.last_save_in_hf: the model-only last save (ROOT/model-step-N) as
 * a Hugging Face folder ROOT/hf-step-N (tsr_export: safetensors in the export
 * dtype, config.json, the tokenizer), written by rank 0 once training is done,
 * from the model-only save of the last step there (this run's, or an earlier
 * one's when it resumed at the last step); without one (preempted), none. */
static int last_save_in_hf(const tsr_train_config *c) {
    char root[PATH_MAX], src[PATH_MAX + 32], dst[PATH_MAX + 32], m[PATH_MAX + 48];
    if (tsr_job_join(root, sizeof root, c->job.dump_folder, c->checkpoint.folder)) return EXIT_FAIL;
    snprintf(src, sizeof src, "%s/model-step-%08d", root, c->training.steps);
    snprintf(dst, sizeof dst, "%s/hf-step-%08d", root, c->training.steps);
    snprintf(m, sizeof m, "%s/MANIFEST", src);
    if (access(m, F_OK) != 0) {
        printf("checkpoint.last_save_in_hf: no model-only save of step %d (%s): no Hugging Face folder\n",
               c->training.steps, src);
        return EXIT_OK;
    }
    tsr_export_opts o = tsr_export_opts_default();
    o.format = TSR_EXPORT_SAFETENSORS;
    o.dtype = c->checkpoint.export_dtype;
    tsr_export_info info;
    tsr_error e = {0};
    if (tsr_export(src, dst, &o, &info, &e)) {
        fprintf(stderr, "tessera train: checkpoint.last_save_in_hf: %s\n", e.msg);
        return EXIT_FAIL;
    }
    printf("Hugging Face folder (checkpoint.last_save_in_hf): %s: %zu tensors in %zu file(s)\n", dst, info.n_tensors,
           info.n_files);
    return EXIT_OK;
}

int tsr_cmd_train(int argc, char **argv) {
    const char *config = NULL;
    int info = 0;
    tsr_train_config cfg;
    tsr_error e = {0};
    for (int i = 1; i < argc; i++) {
        const char *v;
        int r;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(USAGE, stdout);
            return EXIT_OK;
        }
        if ((r = tsr_opt(argc, argv, &i, "config", 1, &v))) {
            if (r < 0) return EXIT_USAGE;
            config = v;
        } else if (strcmp(argv[i], "--model-info") == 0) {
            info = 1;
        } else if (strncmp(argv[i], "--", 2) != 0 || !strchr(argv[i], '.')) {
            return tsr_usage_error("train", "unexpected argument '%s' (see --help)", argv[i]);
        }
    }
    if (!config) return tsr_usage_error("train", "--config FILE is required (see --help)");
    tsr_set_log(train_log, NULL);
    if (tsr_config_load(&cfg, config, &e)) {
        fprintf(stderr, "tessera train: %s\n", e.msg);
        return e.code == TSR_EINVAL ? EXIT_USAGE : EXIT_FAIL;
    }
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--config") == 0) {
            i++;
            continue;
        }
        if (strncmp(argv[i], "--config=", 9) == 0 || strcmp(argv[i], "--model-info") == 0) continue;
        if (tsr_config_override(&cfg, argv[i], &e)) {
            fprintf(stderr, "tessera train: %s\n", e.msg);
            return EXIT_USAGE;
        }
    }
    if (info) {
        int world = cfg.parallelism.data_parallel_replicate_degree *
                    (cfg.parallelism.data_parallel_shard_degree > 0 ? cfg.parallelism.data_parallel_shard_degree : 1) *
                    cfg.parallelism.tensor_parallel_degree * cfg.parallelism.pipeline_parallel_degree;
        if (tsr_config_validate(&cfg, world, &e) || tsr_model_report(&cfg, stdout, &e)) {
            fprintf(stderr, "tessera train: %s\n", e.msg);
            return EXIT_USAGE;
        }
        return EXIT_OK;
    }
    tsr_comm *world = tsr_cli_comm("train");
    if (!world) return EXIT_FAIL;
    int rank = (int)tsr_comm_rank(world), rc = EXIT_OK;
    if (tsr_config_validate(&cfg, (int)tsr_comm_size(world), &e)) {
        if (rank == 0) fprintf(stderr, "tessera train: %s\n", e.msg);
        tsr_comm_free(world);
        return EXIT_USAGE;
    }
    if (rank == 0 && cfg.n_warnings) fputs(cfg.warnings, stderr);
    tsr_cli_set_threads();
    tsr_trainer *t = NULL;
    tsr_model_args shapes;
    int made = cfg.model.flavor == TSR_FLAVOR_CHECKPOINT
                   ? (tsr_train_start_shapes(&cfg, &shapes, &e) || tsr_trainer_new_args(&cfg, &shapes, world, &t, &e))
                   : tsr_trainer_new(&cfg, world, &t, &e);
    if (made || tsr_trainer_run(t, stdout, &e)) {
        fprintf(stderr, "tessera train: rank %d: %s\n", rank, e.msg);
        rc = EXIT_FAIL;
        /* a rank that fails alone would leave the others waiting in a collective:
         * leaving without MPI_Finalize makes mpirun end the whole job (committed
         * checkpoints are untouched; one in flight stays uncommitted) */
        if (tsr_comm_size(world) > 1) {
            fflush(stdout);
            fflush(stderr);
            _exit(EXIT_FAIL);
        }
    }
    if (rc == EXIT_OK && rank == 0 && cfg.checkpoint.enable && cfg.checkpoint.last_save_in_hf) rc = last_save_in_hf(&cfg);
    tsr_trainer_free(t);
    tsr_comm_free(world);
    return rc;
}
