/* cmd_export.c: tessera export: a checkpoint's model in Hugging Face's Llama
 * layout (safetensors + config.json). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "casts.h"
#include "cli.h"
#include "commands.h"
#include "common.h"
#include "hf.h"
#include "model.h"
#include "safetensors.h"

static const char USAGE[] =
    "usage: tessera export CKPT --format safetensors OUT/ [--dtype f32|bf16|f16] [--shard-size SIZE]\n"
    "Writes the model of checkpoint CKPT (any layout, any dtype; only the model's\n"
    "tensors are read) as a Hugging Face LlamaForCausalLM: config.json and\n"
    "model.safetensors, or model-0000K-of-0000N.safetensors shards of at most SIZE\n"
    "(default 2G) with model.safetensors.index.json. Tensors get Hugging Face's\n"
    "names; q and k are permuted to its rotary convention; --dtype (default f32)\n"
    "applies to every tensor.\n";

static int write_config(const char *dir, const tsr_model_args *a, int dtype, tsr_error *e) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return tsr_err(e, TSR_EIO, "%s: %s", path, strerror(errno));
    fprintf(f,
            "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n"
            "  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n  \"num_attention_heads\": %d,\n"
            "  \"num_key_value_heads\": %d,\n  \"num_hidden_layers\": %d,\n  \"vocab_size\": %d,\n"
            "  \"rms_norm_eps\": %.9g,\n  \"rope_theta\": %.9g,\n  \"max_position_embeddings\": %d,\n"
            "  \"hidden_act\": \"silu\",\n  \"tie_word_embeddings\": false,\n  \"attention_bias\": false,\n"
            "  \"mlp_bias\": false,\n  \"head_dim\": %d,\n  \"torch_dtype\": \"%s\",\n",
            a->dim, a->ffn_dim, a->n_heads, a->n_kv_heads, a->n_layers, a->vocab_size, (double)a->norm_eps,
            (double)a->rope_theta, a->rope_scaling.factor != 0 ? 131072 : 8192, tsr_model_head_dim(a),
            dtype == TSR_BF16 ? "bfloat16" : dtype == TSR_F16 ? "float16" : "float32");
    if (a->rope_scaling.factor != 0)
        fprintf(f,
                "  \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": %.9g, \"low_freq_factor\": %.9g, "
                "\"high_freq_factor\": %.9g, \"original_max_position_embeddings\": %d},\n",
                (double)a->rope_scaling.factor, (double)a->rope_scaling.low_freq_factor,
                (double)a->rope_scaling.high_freq_factor, a->rope_scaling.original_max_pos);
    else
        fprintf(f, "  \"rope_scaling\": null,\n");
    fprintf(f, "  \"bos_token_id\": null,\n  \"eos_token_id\": 256\n}\n");
    return fclose(f) ? tsr_err(e, TSR_EIO, "%s: cannot write", path) : 0;
}

typedef struct shard {
    size_t first, n; /* entries */
    uint64_t bytes;
} shard;

int tsr_cmd_export(int argc, char **argv) {
    const char *src = NULL, *dir = NULL, *format = NULL, *v;
    int dtype = TSR_F32;
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
    if (strcmp(format, "safetensors") != 0)
        return tsr_usage_error("export", "--format %s: not available (safetensors)", format);
    char path[4096];
    tsr_resolve_ckpt_dir("export", src, path, sizeof path);
    tsr_error e = {0};
    tsr_ckpt *ck = tsr_ckpt_open(path, &e);
    tsr_model_args a;
    tsr_model_decls d = {0};
    tsr_st_entry *ent = NULL;
    char *names = NULL;
    shard *sh = NULL;
    size_t nsh = 0;
    float *buf = NULL, *perm = NULL;
    void *outb = NULL;
    int rc = ck ? tsr_model_args_from_ckpt(ck, &a, &e) : e.code;
    if (!rc) rc = tsr_model_decls_make(&a, &d, &e);
    size_t np = d.n_params;
    if (!rc && (!(ent = calloc(np, sizeof *ent)) || !(names = calloc(np, 96)) || !(sh = calloc(np, sizeof *sh))))
        rc = tsr_err(&e, TSR_ENOMEM, "out of memory");
    /* the entries, in shards of at most shard_size bytes (a larger tensor alone) */
    uint64_t largest = 0;
    for (size_t p = 0; !rc && p < np; p++) {
        int heads;
        tsr_hf_name(&a, p, np, names + p * 96, 96, &heads);
        const tsr_tensor_decl *td = &d.decls[p];
        long i = tsr_ckpt_find(ck, td->name);
        tsr_tensor_info ti;
        if (i < 0) {
            rc = tsr_err(&e, TSR_ENOTFOUND, "%s: no tensor %s", path, td->name);
            break;
        }
        tsr_ckpt_tensor(ck, (size_t)i, &ti);
        if (ti.ndim != td->ndim || memcmp(ti.shape, td->shape, td->ndim * sizeof *ti.shape) || !tsr_dtype_is_float(ti.dtype)) {
            rc = tsr_err(&e, TSR_EINVAL, "%s: %s has another shape or dtype than the model's", path, td->name);
            break;
        }
        ent[p] = (tsr_st_entry){names + p * 96, dtype, td->ndim, {0}, 0, 0};
        memcpy(ent[p].shape, td->shape, sizeof ent[p].shape);
        uint64_t bytes = tsr_box_volume(&(tsr_box){td->ndim, {0}, {td->shape[0], td->ndim > 1 ? td->shape[1] : 0}}) *
                         tsr_dtype_size(dtype);
        if (bytes > largest) largest = bytes;
        if (nsh == 0 || (sh[nsh - 1].bytes + bytes > shard_size && sh[nsh - 1].n > 0)) sh[nsh++] = (shard){p, 0, 0};
        sh[nsh - 1].n++;
        sh[nsh - 1].bytes += bytes;
    }
    size_t maxel = (size_t)(largest / tsr_dtype_size(dtype));
    if (!rc && (!(buf = malloc(maxel * 4 + 4)) || !(perm = malloc(maxel * 8 + 8)) || !(outb = malloc(maxel * 4 + 4))))
        rc = tsr_err(&e, TSR_ENOMEM, "out of memory for a %llu-byte tensor", (unsigned long long)largest);
    int mk = rc ? 0 : tsr_mkdir_p(dir);
    if (mk) rc = tsr_err(&e, TSR_EIO, "%s: cannot create: %s", dir, strerror(mk));
    if (!rc) rc = write_config(dir, &a, dtype, &e);
    uint64_t total = 0;
    for (size_t s = 0; !rc && s < nsh; s++) {
        char file[4200], fname[64];
        if (nsh == 1) snprintf(fname, sizeof fname, "model.safetensors");
        else snprintf(fname, sizeof fname, "model-%05zu-of-%05zu.safetensors", s + 1, nsh);
        snprintf(file, sizeof file, "%s/%s", dir, fname);
        uint8_t *hdr = NULL;
        size_t hl = 0;
        if ((rc = tsr_st_header(ent + sh[s].first, sh[s].n, &hdr, &hl, &e))) break;
        FILE *f = fopen(file, "wb");
        if (!f || fwrite(hdr, 1, hl, f) != hl) rc = tsr_err(&e, TSR_EIO, "%s: cannot write", file);
        free(hdr);
        for (size_t p = sh[s].first; !rc && p < sh[s].first + sh[s].n; p++) {
            const tsr_tensor_decl *td = &d.decls[p];
            tsr_box box = {td->ndim, {0}, {0}};
            memcpy(box.extent, td->shape, sizeof box.extent);
            uint64_t n = tsr_box_volume(&box);
            if ((rc = tsr_model_read_f32(ck, td, &box, buf, &e))) break;
            int heads;
            char tmp[96];
            tsr_hf_name(&a, p, np, tmp, sizeof tmp, &heads);
            const float *src_f = buf;
            if (heads) {
                tsr_hf_permute(buf, perm, heads, tsr_model_head_dim(&a), td->shape[1], 0);
                src_f = perm;
            }
            const void *wr = src_f;
            if (dtype != TSR_F32) {
                for (uint64_t x = 0; x < n; x++) tsr_store_from_f64(dtype, outb, x, src_f[x]);
                wr = outb;
            }
            size_t bytes = (size_t)n * tsr_dtype_size(dtype);
            if (fwrite(wr, 1, bytes, f) != bytes) rc = tsr_err(&e, TSR_EIO, "%s: cannot write", file);
            total += bytes;
        }
        if (f && fclose(f) && !rc) rc = tsr_err(&e, TSR_EIO, "%s: cannot write", file);
    }
    if (!rc && nsh > 1) { /* the index */
        char file[4200];
        snprintf(file, sizeof file, "%s/model.safetensors.index.json", dir);
        FILE *f = fopen(file, "w");
        if (!f) rc = tsr_err(&e, TSR_EIO, "%s: %s", file, strerror(errno));
        else {
            fprintf(f, "{\n  \"metadata\": {\"total_size\": %llu},\n  \"weight_map\": {\n", (unsigned long long)total);
            for (size_t s = 0; s < nsh; s++)
                for (size_t p = sh[s].first; p < sh[s].first + sh[s].n; p++)
                    fprintf(f, "    \"%s\": \"model-%05zu-of-%05zu.safetensors\"%s\n", ent[p].name, s + 1, nsh,
                            p + 1 == np ? "" : ",");
            fprintf(f, "  }\n}\n");
            if (fclose(f)) rc = tsr_err(&e, TSR_EIO, "%s: cannot write", file);
        }
    }
    if (rc) fprintf(stderr, "tessera export: %s\n", e.msg);
    else printf("exported %s to %s: %zu tensors, %llu bytes in %zu file(s), %s\n", path, dir, np,
                (unsigned long long)total, nsh, tsr_dtype_name(dtype));
    free(buf), free(perm), free(outb), free(ent), free(names), free(sh);
    tsr_model_decls_free(&d);
    tsr_ckpt_close(ck);
    return rc ? EXIT_FAIL : EXIT_OK;
}
