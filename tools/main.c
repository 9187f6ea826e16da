/* main.c: the tessera command: a thin layer over libtessera. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "commands.h"
#include "tessera.h"

#ifdef TSR_CUDA /* for --version: the CUDA runtime and NCCL this binary was built with */
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

/* name NULL: a command of one word (`tessera train`) */
typedef struct command {
    const char *group, *name;
    int (*fn)(int, char **);
    const char *summary;
} command;

static const command commands[] = {
    {"train", NULL, tsr_cmd_train, "train a Llama model (config file and --section.key=value overrides)"},
    {"launch", NULL, tsr_cmd_launch, "run the training job under mpirun and keep it alive (restarts, hangs, NaN rollback)"},
    {"reshard", NULL, tsr_cmd_reshard, "rewrite a checkpoint for another layout, dtype or codec (offline)"},
    {"export", NULL, tsr_cmd_export, "write a checkpoint's model for Hugging Face (safetensors + config.json)"},
    {"import", NULL, tsr_cmd_import, "bring a Hugging Face Llama (safetensors + config.json) into a checkpoint"},
    {"verify-export", NULL, tsr_cmd_verify_export, "recompute the tensor digests an export records (safetensors or GGUF)"},
    {"logits", NULL, tsr_cmd_logits, "the model's logits for some tokens (forward pass on one rank)"},
    {"push", NULL, tsr_cmd_push, "upload checkpoints to S3-compatible storage (s3://bucket/prefix/)"},
    {"pull", NULL, tsr_cmd_pull, "download checkpoints from S3-compatible storage"},
    {"ls", NULL, tsr_cmd_ls, "list the checkpoints under a root, local or s3:// (as ckpt ls)"},
    {"rm", NULL, tsr_cmd_rm, "remove a checkpoint, local or s3:// (its MANIFEST first)"},
    {"plot", NULL, tsr_cmd_plot, "draw the loss curve of a metrics file to a PNG"},
    {"data", "prep", tsr_cmd_data_prep, "make token shards (llm.c .bin) from text or a generated corpus"},
    {"ckpt", "ls", tsr_cmd_ckpt_ls, "list the checkpoints under a root"},
    {"ckpt", "info", tsr_cmd_ckpt_info, "show a checkpoint's MANIFEST"},
    {"ckpt", "verify", tsr_cmd_ckpt_verify, "check every checksum and structural rule"},
    {"ckpt", "diff", tsr_cmd_ckpt_diff, "compare the tensors of two checkpoints"},
    {"ckpt", "synth", tsr_cmd_ckpt_synth, "write a synthetic checkpoint, in any layout"},
    {"ckpt", "check", tsr_cmd_ckpt_check, "load a synthetic checkpoint in any layout and check it"},
    {"ckpt", "compact", tsr_cmd_ckpt_compact, "re-encode a checkpoint's raw frames in place, atomically"},
    {"ckpt", "fence", tsr_cmd_ckpt_fence, "fence out the writers of earlier launches; print the new epoch"},
    {"bench", "codec", tsr_cmd_bench_codec, "frame codec against plain zstd"},
    {"bench", "plan", tsr_cmd_bench_plan, "resharding planner: 1M stored x 1M needed boxes"},
    {"bench", "scale", tsr_cmd_bench_scale, "save plan, MANIFEST and load plan of a 405B job at 1k-16k ranks, simulated"},
    {"bench", "save", tsr_cmd_bench_save, "save stall and write throughput against memcpy and the disk"},
    {"bench", "load", tsr_cmd_bench_load, "resharded load time against the saved layout's"},
    {"bench", "disk", tsr_cmd_bench_disk, "the disk's O_DIRECT write and read bandwidth (the baseline of the others)"},
    {"bench", "gemm", tsr_cmd_bench_gemm, "sgemm throughput on the model's matrix products (the trainer's baseline)"},
    {"bench", "gpu", tsr_cmd_bench_gpu, "bf16 matrix rate, and what saving device state costs a GPU loop (CUDA, a GPU)"},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *f, const char *group) {
    fprintf(f, "usage: tessera <command> [options]   (tessera <command> --help for each)\n\ncommands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (!group || strcmp(group, commands[i].group) == 0)
            fprintf(f, "  %-7s %-7s %s\n", commands[i].group, commands[i].name ? commands[i].name : "", commands[i].summary);
}

int main(int argc, char **argv) {
    if (tsr_cli_faults()) return EXIT_USAGE;
    if (argc < 2) {
        usage(stderr, NULL);
        return EXIT_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout, NULL);
        return EXIT_OK;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("tessera %s (checkpoint format %d.%d)\n", TSR_VERSION_STRING, TSR_FORMAT_MAJOR, TSR_FORMAT_MINOR);
#ifdef TSR_CUDA
        printf("built with CUDA %d.%d (cuBLAS) and NCCL %d.%d.%d\n", CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10,
               NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
#else
        printf("built without CUDA: host memory only (make CUDA=1 builds the GPU variant)\n");
#endif
        return EXIT_OK;
    }
    int known_group = 0;
    for (size_t i = 0; i < N_COMMANDS; i++) {
        if (strcmp(argv[1], commands[i].group) != 0) continue;
        if (!commands[i].name) return commands[i].fn(argc - 1, argv + 1);
        known_group = 1;
        if (argc >= 3 && strcmp(argv[2], commands[i].name) == 0) return commands[i].fn(argc - 2, argv + 2);
    }
    if (known_group) {
        if (argc >= 3 && (strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0)) {
            usage(stdout, argv[1]);
            return EXIT_OK;
        }
        fprintf(stderr, "tessera %s: unknown subcommand '%s'\n", argv[1], argc >= 3 ? argv[2] : "");
        usage(stderr, argv[1]);
        return EXIT_USAGE;
    }
    fprintf(stderr, "tessera: unknown command '%s'\n", argv[1]);
    usage(stderr, NULL);
    return EXIT_USAGE;
}
