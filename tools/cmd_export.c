/* cmd_export.c: tessera export: a checkpoint's model in Hugging Face's Llama
 * layout (safetensors + config.json) or as GGUF (tsr_export, convert/). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "commands.h"
#include "common.h"
#include "s3.h"
#include "store.h"

static const char USAGE[] =
    "usage: tessera export CKPT --format safetensors OUT/ [--dtype f32|bf16|f16] [--shard-size SIZE]\n"
    "       tessera export CKPT --format gguf OUT.gguf [--dtype f32|bf16|f16]\n"
    "       tessera export CKPT --format dcp OUT/ [--threads N]\n"
    "Writes the model of checkpoint CKPT (any layout, any dtype; only the model's\n"
    "tensors are read) as a Hugging Face LlamaForCausalLM: config.json, the\n"
    "byte-level tokenizer (tokenizer.json, tokenizer_config.json,\n"
    "special_tokens_map.json: one id per byte, no BOS added) and\n"
    "model.safetensors, or model-0000K-of-0000N.safetensors shards of at most SIZE\n"
    "(default 2G) with model.safetensors.index.json. Tensors get Hugging Face's\n"
    "names; q and k are permuted to its rotary convention; --dtype applies to every\n"
    "tensor (default: the dtype of the checkpoint's matrices when they all have the\n"
    "same, f32, bf16 or f16; else f32).\n"
    "GGUF: a v3 file that llama.cpp loads as a llama model: llama.* and general.*\n"
    "keys, the byte-level tokenizer (as a byte-level BPE without merges: one id per\n"
    "byte, as tessera data prep gives; no BOS added), tensors token_embd,\n"
    "blk.N.attn_q, ..., output_norm, output (dims innermost first, 32-byte\n"
    "aligned), norms in f32, matrices in --dtype (default as above). Both formats\n"
    "give the model's context length (max_seq_len of its train.model blob).\n"
    "Files are written under temporary names (a .tessera-tmp-PID directory next to\n"
    "them) and renamed into place only when all are complete and synced: a failed\n"
    "export leaves nothing, a killed one only that directory.\n"
    "DCP: the whole checkpoint (model, optimizer, blobs) as a PyTorch Distributed\n"
    "Checkpoint folder that torch.distributed.checkpoint.load reads with\n"
    "FileSystemReader in any world size, each tensor under its own name, blobs that\n"
    "DCP wrote as they were, the trainer's as bytes objects; written by DCP's\n"
    "FileSystemWriter with N threads (default 1). DCP's metadata is a pickle: this\n"
    "runs the Python package (tessera.dcp) under $TSR_PYTHON (default python3),\n"
    "which needs torch.\n";

/* OUT = s3://bucket/prefix: the export is written to a local scratch directory
 * (under TMPDIR), then its files are uploaded, then the scratch is removed. */
static int export_to_s3(int argc, char **argv, const char *url, int gguf) {
    char tmp[PATH_MAX], local[PATH_MAX + 64];
    const char *td = getenv("TMPDIR");
    snprintf(tmp, sizeof tmp, "%s/tessera-export-XXXXXX", td && *td ? td : "/tmp");
    if (!mkdtemp(tmp)) {
        fprintf(stderr, "tessera export: %s: %s\n", tmp, strerror(errno));
        return EXIT_FAIL;
    }
    /* a GGUF OUT names a file: the scratch file gets its name */
    const char *base = strrchr(url + 5, '/');
    snprintf(local, sizeof local, "%s/%s", tmp, base && base[1] ? base + 1 : "model.gguf");
    char **args = calloc((size_t)argc + 1, sizeof *args);
    if (!args) {
        tsr_remove_tree(tmp);
        return EXIT_FAIL;
    }
    for (int i = 0; i < argc; i++) args[i] = argv[i] == url ? (gguf ? local : tmp) : argv[i];
    int rc = tsr_cmd_export(argc, args);
    free(args);
    if (rc == EXIT_OK) rc = tsr_upload_dir(gguf ? local : tmp, url, "export") ? EXIT_FAIL : EXIT_OK;
    if (rc == EXIT_OK) printf("uploaded to %s\n", url);
    tsr_remove_tree(tmp);
    return rc;
}

int tsr_cmd_export(int argc, char **argv) {
    const char *src = NULL, *dir = NULL, *format = NULL, *v;
    int dtype = 0; /* the checkpoint's */
    const char *threads = NULL;
    uint64_t shard_size = 2ull << 30;
    for (int i = 1; i < argc; i++) {
        int r;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return fputs(USAGE, stdout), EXIT_OK;
        if ((r = tsr_opt(argc, argv, &i, "format", 1, &v))) {
            if (r < 0) return EXIT_USAGE;
            format = v;
        } else if ((r = tsr_opt(argc, argv, &i, "dtype", 1, &v))) {
            if (r < 0 || !((dtype = tsr_dtype_parse(v)) == TSR_F32 || dtype == TSR_BF16 || dtype == TSR_F16))
                return tsr_usage_error("export", "--dtype takes f32, bf16 or f16");
        } else if ((r = tsr_opt(argc, argv, &i, "shard-size", 1, &v))) {
            if (r < 0 || tsr_parse_size(v, &shard_size) || shard_size < 1)
                return tsr_usage_error("export", "--shard-size takes a size");
        } else if ((r = tsr_opt(argc, argv, &i, "threads", 1, &v))) {
            uint64_t u;
            if (r < 0 || tsr_parse_u64(v, &u) || u < 1 || u > 1024)
                return tsr_usage_error("export", "--threads takes a count (1 to 1024)");
            threads = v;
        } else if (argv[i][0] == '-') {
            return tsr_usage_error("export", "unknown option %s (see --help)", argv[i]);
        } else if (!src) {
            src = argv[i];
        } else if (!dir) {
            dir = argv[i];
        } else {
            return tsr_usage_error("export", "CKPT and OUT only");
        }
    }
    if (!src || !dir || !format) return tsr_usage_error("export", "needs CKPT, --format and OUT (see --help)");
    if (!strcmp(format, "dcp")) {
        if (dtype || shard_size != 2ull << 30) return tsr_usage_error("export", "--dtype and --shard-size are not for dcp");
        return tsr_cmd_dcp("export", src, dir, threads ? "--threads" : NULL, threads);
    }
    if (threads) return tsr_usage_error("export", "--threads is for --format dcp");
    int fmt = tsr_export_format_parse(format);
    if (fmt < 0) return tsr_usage_error("export", "--format %s: safetensors, gguf or dcp", format);
    int gguf = fmt == TSR_EXPORT_GGUF;
    if (tsr_s3_is_url(dir)) return export_to_s3(argc, argv, dir, gguf);
    /* a folder or file of its own: of a local store */
    if (!(tsr_store_caps(dir) & TSR_STORE_DIRS))
        return tsr_usage_error("export", "%s: no store serves this scheme (s3:// or a path)", dir);
    char path[4096];
    tsr_resolve_ckpt_dir("export", src, path, sizeof path);
    tsr_error e = {0};
    tsr_export_opts o = tsr_export_opts_default();
    o.format = (tsr_export_format)fmt, o.dtype = dtype, o.shard_size = shard_size;
    tsr_export_info info;
    if (tsr_export(path, dir, &o, &info, &e)) {
        fprintf(stderr, "tessera export: %s\n", e.msg);
        return EXIT_FAIL;
    }
    if (gguf)
        printf("exported %s to %s: GGUF v3, llama, %zu tensors, %llu bytes, matrices %s\n", path, dir, info.n_tensors,
               (unsigned long long)info.bytes, tsr_dtype_name(info.dtype));
    else
        printf("exported %s to %s: %zu tensors, %llu bytes in %zu file(s), %s\n", path, dir, info.n_tensors,
               (unsigned long long)info.bytes, info.n_files, tsr_dtype_name(info.dtype));
    return EXIT_OK;
}
