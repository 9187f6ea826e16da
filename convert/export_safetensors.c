/* export_safetensors.c: a checkpoint's model in Hugging Face's Llama layout
 * (tsr_export's TSR_EXPORT_SAFETENSORS): config.json, the byte-level tokenizer
 * and model.safetensors, or files of at most shard_size bytes with their
 * index, written into a staging directory and renamed into place. Each file's
 * __metadata__ carries the source's step and MANIFEST hash and the digests of
 * its tensors as written (FORMAT.md 13). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "casts.h"
#include "common.h"
#include "export_impl.h"
#include "hf.h"
#include "safetensors.h"
#include "tokens.h"

/* ------------------------------------------------------------- the folder */

static int write_config(const char *dir, const tsr_model_args *a, int dtype, tsr_error *e) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return tsr_export_out_error(e, path, "create", errno);
    fprintf(f,
            "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n"
            "  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n  \"num_attention_heads\": %d,\n"
            "  \"num_key_value_heads\": %d,\n  \"num_hidden_layers\": %d,\n  \"vocab_size\": %d,\n"
            "  \"rms_norm_eps\": %.9g,\n  \"rope_theta\": %.9g,\n  \"max_position_embeddings\": %d,\n"
            "  \"hidden_act\": \"silu\",\n  \"tie_word_embeddings\": false,\n  \"attention_bias\": false,\n"
            "  \"mlp_bias\": false,\n  \"head_dim\": %d,\n  \"torch_dtype\": \"%s\",\n",
            a->dim, a->ffn_dim, a->n_heads, a->n_kv_heads, a->n_layers, a->vocab_size, (double)a->norm_eps,
            (double)a->rope_theta, a->max_seq_len, tsr_model_head_dim(a),
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
    return fclose(f) ? tsr_export_out_error(e, path, "write", errno) : 0;
}

/* The same tokenizer for Hugging Face (tokenizers' tokenizer.json, read by
 * PreTrainedTokenizerFast): byte-level BPE without merges and without regex
 * splitting, so that each byte of any text is one id as in tessera data prep;
 * <|endoftext|> (256) is the end of text and is never matched inside text
 * (split_special_tokens); no BOS and no EOS are added, as in the GGUF file and
 * config.json. */
static int write_tokenizer(const char *dir, const tsr_model_args *a, tsr_error *e) {
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return tsr_export_out_error(e, path, "create", errno);
    static const char level[] = "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": false, "
                                "\"use_regex\": false}";
    fprintf(f,
            "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n"
            "  \"added_tokens\": [{\"id\": %d, \"content\": \"<|endoftext|>\", \"single_word\": false, \"lstrip\": false, "
            "\"rstrip\": false, \"normalized\": false, \"special\": true}],\n"
            "  \"normalizer\": null,\n  \"pre_tokenizer\": %s,\n  \"post_processor\": null,\n  \"decoder\": %s,\n"
            "  \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, \"continuing_subword_prefix\": null, "
            "\"end_of_word_suffix\": null, \"fuse_unk\": false, \"byte_fallback\": false, \"ignore_merges\": false,\n"
            "    \"vocab\": {",
            TSR_BYTE_EOT, level, level);
    for (int b = 0; b < 256; b++)
        fprintf(f, "%s\"\\u%04x\": %d", !b ? "\n      " : b % 8 ? ", " : ",\n      ", tsr_gpt2_byte_codepoint(b), b);
    fprintf(f, ",\n      \"<|endoftext|>\": %d},\n    \"merges\": []}\n}\n", TSR_BYTE_EOT);
    if (fclose(f)) return tsr_export_out_error(e, path, "write", errno);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (!(f = fopen(path, "w"))) return tsr_export_out_error(e, path, "create", errno);
    fprintf(f,
            "{\n  \"tokenizer_class\": \"PreTrainedTokenizerFast\",\n  \"add_bos_token\": false,\n"
            "  \"add_eos_token\": false,\n  \"bos_token\": null,\n  \"eos_token\": \"<|endoftext|>\",\n"
            "  \"unk_token\": null,\n  \"pad_token\": null,\n  \"model_max_length\": %d,\n"
            "  \"clean_up_tokenization_spaces\": false,\n  \"split_special_tokens\": true\n}\n",
            a->max_seq_len);
    if (fclose(f)) return tsr_export_out_error(e, path, "write", errno);
    snprintf(path, sizeof path, "%s/special_tokens_map.json", dir);
    if (!(f = fopen(path, "w"))) return tsr_export_out_error(e, path, "create", errno);
    fprintf(f, "{\n  \"eos_token\": \"<|endoftext|>\"\n}\n");
    return fclose(f) ? tsr_export_out_error(e, path, "write", errno) : 0;
}

/* ------------------------------------------------------------ the tensors */

/* A safetensors export in progress: the entries (Hugging Face names, shapes,
 * the export dtype) cut into files of at most shard_size bytes. */
typedef struct st_shard {
    size_t first, n; /* entries */
    uint64_t bytes;
} st_shard;
typedef struct st_export {
    tsr_ckpt *ck;
    const tsr_export_source *src;
    const tsr_model_args *a;
    const tsr_model_decls *d;
    int dtype;
    tsr_st_entry *ent;
    char *names; /* 96 bytes per entry */
    st_shard *sh;
    size_t nsh;
    float *buf, *perm; /* a tensor in f32, and permuted */
    void *outb;        /* a tensor in the export dtype */
    uint64_t total;    /* bytes of tensor data written */
    /* per entry: its checkpoint tensor; whether the export keeps its dtype,
     * values and order (not permuted, same dtype, a digest to tie to); its
     * digests as written */
    tsr_export_tensor *from;
    int *keep;
    tsr_export_digest *dg;
} st_export;

/* The entries, in files of at most shard_size bytes (a larger tensor alone); every
 * tensor is found in the checkpoint before any file is written. */
static int st_plan(st_export *x, uint64_t shard_size, tsr_error *e) {
    size_t np = x->d->n_params;
    if (!(x->ent = calloc(np, sizeof *x->ent)) || !(x->names = calloc(np, 96)) || !(x->sh = calloc(np, sizeof *x->sh)) ||
        !(x->from = calloc(np, sizeof *x->from)) || !(x->keep = calloc(np, sizeof *x->keep)) ||
        !(x->dg = calloc(np, sizeof *x->dg)))
        return tsr_err(e, TSR_ENOMEM, "out of memory");
    uint64_t largest = 0;
    for (size_t p = 0; p < np; p++) {
        int heads;
        tsr_hf_name(x->a, p, np, x->names + p * 96, 96, &heads);
        const tsr_tensor_decl *td = &x->d->decls[p];
        int rc = tsr_export_find(x->ck, td, &x->from[p], e);
        if (rc) return rc;
        x->keep[p] = !heads && x->from[p].dtype == x->dtype && x->from[p].has_digest;
        x->ent[p] = (tsr_st_entry){x->names + p * 96, x->dtype, td->ndim, {0}, 0, 0};
        memcpy(x->ent[p].shape, td->shape, sizeof x->ent[p].shape);
        uint64_t bytes = tsr_box_volume(&(tsr_box){td->ndim, {0}, {td->shape[0], td->ndim > 1 ? td->shape[1] : 0}}) *
                         tsr_dtype_size(x->dtype);
        if (bytes > largest) largest = bytes;
        st_shard *last = x->nsh ? &x->sh[x->nsh - 1] : NULL;
        if (!last || (last->bytes + bytes > shard_size && last->n > 0)) x->sh[x->nsh++] = (st_shard){p, 0, 0};
        x->sh[x->nsh - 1].n++;
        x->sh[x->nsh - 1].bytes += bytes;
    }
    size_t maxel = (size_t)(largest / tsr_dtype_size(x->dtype));
    if (!(x->buf = malloc(maxel * 4 + 4)) || !(x->perm = malloc(maxel * 8 + 8)) || !(x->outb = malloc(maxel * 4 + 4)))
        return tsr_err(e, TSR_ENOMEM, "out of memory for a %llu-byte tensor", (unsigned long long)largest);
    return 0;
}

/* Writes tensor p into f (file): read in f32, q and k permuted to Hugging Face's
 * rotary convention, converted to the export dtype. */
static int st_write_tensor(st_export *x, size_t p, FILE *f, const char *file, tsr_error *e) {
    const tsr_tensor_decl *td = &x->d->decls[p];
    tsr_box box = {td->ndim, {0}, {0}};
    memcpy(box.extent, td->shape, sizeof box.extent);
    uint64_t n = tsr_box_volume(&box);
    int rc = tsr_export_read(x->ck, td, x->buf, &x->from[p], e);
    if (rc) return rc;
    int heads;
    char tmp[96];
    tsr_hf_name(x->a, p, x->d->n_params, tmp, sizeof tmp, &heads);
    const float *src_f = x->buf;
    if (heads) {
        tsr_hf_permute(x->buf, x->perm, heads, tsr_model_head_dim(x->a), td->shape[1], 0);
        src_f = x->perm;
    }
    const void *wr = src_f;
    if (x->dtype != TSR_F32) {
        for (uint64_t k = 0; k < n; k++) tsr_store_from_f64(x->dtype, x->outb, k, src_f[k]);
        wr = x->outb;
    }
    if ((rc = tsr_export_digest_of(x->ent[p].name, x->dtype, wr, n, &x->from[p], x->keep[p], &x->dg[p], e))) return rc;
    size_t bytes = (size_t)n * tsr_dtype_size(x->dtype);
    if (fwrite(wr, 1, bytes, f) != bytes) return tsr_export_out_error(e, file, "write", errno);
    x->total += bytes;
    return 0;
}

/* The name of file s: model.safetensors, or model-0000K-of-0000N.safetensors. */
static void st_file_name(const st_export *x, size_t s, char *out, size_t len) {
    if (x->nsh == 1) snprintf(out, len, "model.safetensors");
    else snprintf(out, len, "model-%05zu-of-%05zu.safetensors", s + 1, x->nsh);
}

/* The header of file s: tsr_st_header's, its "__metadata__" object holding the
 * export's provenance and digests too (FORMAT.md 13). The digests of its
 * tensors are known once they are written: before (final 0) they are zeros of
 * the same width, so that the header written first has the final's length. */
static int st_header(const st_export *x, size_t s, int final, uint8_t **out, size_t *len, tsr_error *e) {
    tsr_sbuf b = {0};
    tsr_sb_printf(&b, ",\"%s\":\"%llu\",\"%s\":\"%016llx\"", TSR_EXPORT_KEY_STEP, (unsigned long long)x->src->step,
                  TSR_EXPORT_KEY_MANIFEST, (unsigned long long)x->src->manifest_xxh3);
    for (size_t p = x->sh[s].first; p < x->sh[s].first + x->sh[s].n; p++) {
        const char *n = x->ent[p].name;
        tsr_sb_printf(&b, ",\"%s%s\":\"%016llx\"", TSR_EXPORT_KEY_DIGEST, n, final ? (unsigned long long)x->dg[p].digest : 0ull);
        if (x->keep[p])
            tsr_sb_printf(&b, ",\"%s%s\":\"%s\",\"%s%s\":\"%016llx\"", TSR_EXPORT_KEY_SOURCE, n, x->from[p].name,
                          TSR_EXPORT_KEY_SOURCE_DIGEST, n, (unsigned long long)x->from[p].digest);
    }
    int rc = b.oom ? tsr_err(e, TSR_ENOMEM, "out of memory")
                   : tsr_st_header(x->ent + x->sh[s].first, x->sh[s].n, b.p, out, len, e);
    free(b.p);
    return rc;
}

static int st_write_shard(st_export *x, size_t s, const char *stage, tsr_error *e) {
    char file[PATH_MAX + 64], fname[64];
    st_file_name(x, s, fname, sizeof fname);
    snprintf(file, sizeof file, "%s/%s", stage, fname);
    uint8_t *hdr = NULL;
    size_t hl = 0, hl2 = 0;
    int rc = st_header(x, s, 0, &hdr, &hl, e);
    if (rc) return rc;
    FILE *f = fopen(file, "wb");
    if (!f) rc = tsr_export_out_error(e, file, "create", errno);
    else if (fwrite(hdr, 1, hl, f) != hl) rc = tsr_export_out_error(e, file, "write", errno);
    free(hdr);
    for (size_t p = x->sh[s].first; !rc && p < x->sh[s].first + x->sh[s].n; p++) rc = st_write_tensor(x, p, f, file, e);
    /* the header again, with the digests of what was written */
    if (!rc && !(rc = st_header(x, s, 1, &hdr, &hl2, e))) {
        if (hl2 != hl) rc = tsr_err(e, TSR_EINVAL, "%s: the final header is %zu bytes, not %zu", file, hl2, hl);
        else if (fseek(f, 0, SEEK_SET) || fwrite(hdr, 1, hl, f) != hl) rc = tsr_export_out_error(e, file, "write", errno);
        free(hdr);
    }
    if (f && fclose(f) && !rc) rc = tsr_export_out_error(e, file, "write", errno);
    return rc;
}

/* model.safetensors.index.json, for more than one file. */
static int st_write_index(const st_export *x, const char *stage, tsr_error *e) {
    char file[PATH_MAX + 64], fname[64];
    snprintf(file, sizeof file, "%s/model.safetensors.index.json", stage);
    FILE *f = fopen(file, "w");
    if (!f) return tsr_export_out_error(e, file, "create", errno);
    fprintf(f, "{\n  \"metadata\": {\"total_size\": %llu, \"%s\": \"%llu\", \"%s\": \"%016llx\"},\n  \"weight_map\": {\n",
            (unsigned long long)x->total, TSR_EXPORT_KEY_STEP, (unsigned long long)x->src->step, TSR_EXPORT_KEY_MANIFEST,
            (unsigned long long)x->src->manifest_xxh3);
    for (size_t s = 0; s < x->nsh; s++) {
        st_file_name(x, s, fname, sizeof fname);
        for (size_t p = x->sh[s].first; p < x->sh[s].first + x->sh[s].n; p++)
            fprintf(f, "    \"%s\": \"%s\"%s\n", x->ent[p].name, fname, p + 1 == x->d->n_params ? "" : ",");
    }
    fprintf(f, "  }\n}\n");
    return fclose(f) ? tsr_export_out_error(e, file, "write", errno) : 0;
}

/* The safetensors export into dir: every file goes into a staging directory
 * first (tsr_export_stage_commit). */
static int export_safetensors(st_export *x, const char *dir, uint64_t shard_size, tsr_error *e) {
    int rc = st_plan(x, shard_size, e);
    struct stat dst;
    int made_dir = stat(dir, &dst) != 0, mk = rc ? 0 : tsr_mkdir_p(dir);
    char stage[PATH_MAX];
    if (mk) rc = tsr_export_out_error(e, dir, "create", mk);
    if (!rc) rc = tsr_export_stage_make(dir, stage, sizeof stage, e);
    int staged = !rc;
    if (!rc) rc = write_config(stage, x->a, x->dtype, e);
    if (!rc) rc = write_tokenizer(stage, x->a, e);
    for (size_t s = 0; !rc && s < x->nsh; s++) rc = st_write_shard(x, s, stage, e);
    if (!rc && x->nsh > 1) rc = st_write_index(x, stage, e);
    if (!rc) rc = tsr_export_stage_commit(stage, dir, e);
    else if (staged) tsr_remove_tree(stage);
    if (rc && made_dir) rmdir(dir); /* only if empty: nothing of ours is left */
    return rc;
}

int tsr_export_safetensors(const tsr_export_source *src, const tsr_model_args *a, const tsr_model_decls *d,
                           const char *out, int dtype, const tsr_export_opts *o, tsr_export_info *res, tsr_error *e) {
    st_export x = {.ck = src->ck, .src = src, .a = a, .d = d, .dtype = dtype};
    int rc = export_safetensors(&x, out, o->shard_size, e);
    res->n_tensors = d->n_params, res->bytes = x.total, res->n_files = x.nsh;
    free(x.buf), free(x.perm), free(x.outb), free(x.ent), free(x.names), free(x.sh);
    free(x.from), free(x.keep), free(x.dg);
    return rc;
}
