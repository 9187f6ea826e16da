/* cmd_export.c: tessera export: a checkpoint's model in Hugging Face's Llama
 * layout (safetensors + config.json). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "casts.h"
#include "cli.h"
#include "commands.h"
#include "common.h"
#include "gguf.h"
#include "hf.h"
#include "model.h"
#include "s3.h"
#include "safetensors.h"
#include "tokens.h"

static const char USAGE[] =
    "usage: tessera export CKPT --format safetensors OUT/ [--dtype f32|bf16|f16] [--shard-size SIZE]\n"
    "       tessera export CKPT --format gguf OUT.gguf [--dtype f32|bf16|f16]\n"
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
    "export leaves nothing, a killed one only that directory.\n";

static int out_error(tsr_error *e, const char *path, const char *what, int err);

static int write_config(const char *dir, const tsr_model_args *a, int dtype, tsr_error *e) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return out_error(e, path, "create", errno);
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
    return fclose(f) ? out_error(e, path, "write", errno) : 0;
}

/* GPT-2's bytes_to_unicode: the character that stands for byte b in a byte-level
 * BPE vocabulary (printable Latin-1 bytes stand for themselves, the others for
 * U+0100 onwards), as a code point, or written as UTF-8 into out (at most 2
 * bytes and a NUL). */
static int gpt2_byte_codepoint(int b) {
    int cp = b;
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)) {
        cp = 256;
        for (int x = 0; x < b; x++) cp += !((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174);
    }
    return cp;
}
static void gpt2_byte_char(int b, char out[3]) {
    int cp = gpt2_byte_codepoint(b), n = 0;
    if (cp < 0x80) out[n++] = (char)cp;
    else out[n++] = (char)(0xC0 | cp >> 6), out[n++] = (char)(0x80 | (cp & 0x3F));
    out[n] = 0;
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
    if (!f) return out_error(e, path, "create", errno);
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
        fprintf(f, "%s\"\\u%04x\": %d", !b ? "\n      " : b % 8 ? ", " : ",\n      ", gpt2_byte_codepoint(b), b);
    fprintf(f, ",\n      \"<|endoftext|>\": %d},\n    \"merges\": []}\n}\n", TSR_BYTE_EOT);
    if (fclose(f)) return out_error(e, path, "write", errno);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (!(f = fopen(path, "w"))) return out_error(e, path, "create", errno);
    fprintf(f,
            "{\n  \"tokenizer_class\": \"PreTrainedTokenizerFast\",\n  \"add_bos_token\": false,\n"
            "  \"add_eos_token\": false,\n  \"bos_token\": null,\n  \"eos_token\": \"<|endoftext|>\",\n"
            "  \"unk_token\": null,\n  \"pad_token\": null,\n  \"model_max_length\": %d,\n"
            "  \"clean_up_tokenization_spaces\": false,\n  \"split_special_tokens\": true\n}\n",
            a->max_seq_len);
    if (fclose(f)) return out_error(e, path, "write", errno);
    snprintf(path, sizeof path, "%s/special_tokens_map.json", dir);
    if (!(f = fopen(path, "w"))) return out_error(e, path, "create", errno);
    fprintf(f, "{\n  \"eos_token\": \"<|endoftext|>\"\n}\n");
    return fclose(f) ? out_error(e, path, "write", errno) : 0;
}

/* ------------------------------------------------------------------ GGUF */

/* GGUF v3 (formats/gguf.h). q and k stay in Meta's interleaved rotary
 * convention, which llama.cpp's llama architecture uses. */
/* The GGUF name of parameter p. */
static void gguf_name(size_t p, size_t np, char *out, size_t len) {
    static const char *const layer[TSR_LAYER_PARAMS] = {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                                                        "ffn_norm", "ffn_gate", "ffn_down", "ffn_up"};
    if (p == 0) snprintf(out, len, "token_embd.weight");
    else if (p == np - 2) snprintf(out, len, "output_norm.weight");
    else if (p == np - 1) snprintf(out, len, "output.weight");
    else snprintf(out, len, "blk.%d.%s.weight", (int)((p - 1) / TSR_LAYER_PARAMS), layer[(p - 1) % TSR_LAYER_PARAMS]);
}

/* tessera's byte-level tokenizer (formats/tokens.h: token = byte value, 256 = end
 * of text) as llama.cpp's byte-level BPE ("gpt2") without merges: ids 0..255 are
 * the bytes in GPT-2's byte-to-character alphabet (type 1, normal), so every byte
 * of any text becomes its own id and decodes back to itself; 256 is
 * <|endoftext|> (type 3, control), the end of generation; ids past it fill the
 * model's vocabulary as <unusedN> (type 5). The pre-tokenizer "qwen2" only
 * splits words (each still spelled byte by byte); unlike "default" it keeps
 * llama.cpp's detokenizer from removing spaces before punctuation. No BOS is
 * added: a prompt is its bytes, as in training. (llama.cpp reads text as UTF-8
 * and replaces invalid sequences by U+FFFD before tokenizing.) */
static void gguf_tokenizer(tsr_gguf_writer *g, int V) {
    tsr_gguf_kv_str(g, "tokenizer.ggml.model", "gpt2");
    tsr_gguf_kv_str(g, "tokenizer.ggml.pre", "qwen2");
    tsr_gguf_key(g, "tokenizer.ggml.tokens", TSR_GGUF_ARRAY);
    tsr_gguf_u32(g, TSR_GGUF_STRING), tsr_gguf_u64(g, (uint64_t)V);
    for (int i = 0; i < V; i++) {
        char t[32];
        if (i < 256) gpt2_byte_char(i, t);
        else if (i == TSR_BYTE_EOT) snprintf(t, sizeof t, "<|endoftext|>");
        else snprintf(t, sizeof t, "<unused%d>", i - 257);
        tsr_gguf_str(g, t);
    }
    tsr_gguf_key(g, "tokenizer.ggml.token_type", TSR_GGUF_ARRAY);
    tsr_gguf_u32(g, TSR_GGUF_I32), tsr_gguf_u64(g, (uint64_t)V);
    for (int i = 0; i < V; i++) tsr_gguf_u32(g, i < 256 ? 1u : i == TSR_BYTE_EOT ? 3u : 5u);
    tsr_gguf_key(g, "tokenizer.ggml.merges", TSR_GGUF_ARRAY);
    tsr_gguf_u32(g, TSR_GGUF_STRING), tsr_gguf_u64(g, 0);
    if (V > TSR_BYTE_EOT) { /* GPT-2's convention: <|endoftext|> for both, and BOS never added */
        tsr_gguf_kv_u32(g, "tokenizer.ggml.eos_token_id", TSR_BYTE_EOT);
        tsr_gguf_kv_u32(g, "tokenizer.ggml.bos_token_id", TSR_BYTE_EOT);
    }
    tsr_gguf_kv_bool(g, "tokenizer.ggml.add_bos_token", 0);
    tsr_gguf_kv_bool(g, "tokenizer.ggml.add_eos_token", 0);
}

/* Llama 3.1's rope scaling as llama.cpp takes it: a rope_freqs tensor of hd/2
 * frequency divisors. */
static void rope_factors(const tsr_model_args *a, float *out) {
    int hd = tsr_model_head_dim(a);
    const tsr_rope_scaling *s = &a->rope_scaling;
    double lo_wl = s->original_max_pos / s->low_freq_factor, hi_wl = s->original_max_pos / s->high_freq_factor;
    for (int i = 0; i < hd / 2; i++) {
        double freq = pow(a->rope_theta, -2.0 * i / hd), wl = 2 * M_PI / freq;
        if (wl < hi_wl) out[i] = 1.0f;
        else if (wl > lo_wl) out[i] = s->factor;
        else {
            double sm = (s->original_max_pos / wl - s->low_freq_factor) / (s->high_freq_factor - s->low_freq_factor);
            out[i] = (float)(1.0 / ((1 - sm) / s->factor + sm));
        }
    }
}

/* ------------------------------------------------------------------ output files */

/* An export's files are written into a staging directory DEST/.tessera-tmp-PID
 * (next to their final names, on the same filesystem) and renamed into DEST only
 * when every one is complete: each file is fsynced, then renamed (config.json
 * last), then DEST is fsynced. A failed export removes the staging directory; a
 * killed one leaves only it: never a file under a final name. */

/* An error for a failed write: a full disk says so. */
static int out_error(tsr_error *e, const char *path, const char *what, int err) {
    return tsr_err(e, err == ENOSPC || err == EDQUOT ? TSR_ENOSPC : TSR_EIO, "%s: cannot %s: %s", path, what,
                   strerror(err ? err : EIO));
}

static int fsync_path(const char *path, int dir, tsr_error *e) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | (dir ? O_DIRECTORY : O_NONBLOCK));
    if (fd < 0) return out_error(e, path, "open", errno);
    int rc = fsync(fd) ? out_error(e, path, "fsync", errno) : 0;
    close(fd);
    return rc;
}

/* stage_make(): creates DEST/.tessera-tmp-PID into stage. */
static int stage_make(const char *dest, char *stage, size_t len, tsr_error *e) {
    if (snprintf(stage, len, "%s/.tessera-tmp-%ld", dest, (long)getpid()) >= (int)len)
        return tsr_err(e, TSR_EINVAL, "%s: path too long", dest);
    tsr_remove_tree(stage); /* a leftover of a killed export that had the same pid */
    if (mkdir(stage, 0755) != 0) return out_error(e, stage, "create", errno);
    return 0;
}

/* stage_commit(): syncs every file of the staging directory, renames each into
 * DEST (config.json last), syncs DEST and removes the staging directory. On
 * failure the files already renamed are removed too. */
static int stage_commit(const char *stage, const char *dest, tsr_error *e) {
    char (*names)[256] = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    DIR *d = opendir(stage);
    if (!d) return out_error(e, stage, "open", errno);
    struct dirent *ent;
    while (!rc && (ent = readdir(d))) {
        if (!strcmp(ent->d_name, ".") || !strcmp(ent->d_name, "..")) continue;
        if (strlen(ent->d_name) >= sizeof *names) rc = tsr_err(e, TSR_EINVAL, "%s/%s: name too long", stage, ent->d_name);
        else if (tsr_grow((void **)&names, &cap, n, sizeof *names)) rc = tsr_err(e, TSR_ENOMEM, "out of memory");
        else snprintf(names[n++], sizeof *names, "%s", ent->d_name);
    }
    closedir(d);
    for (size_t i = 0; i + 1 < n; i++) /* config.json last: it tells readers that a model is there */
        if (!strcmp(names[i], "config.json")) {
            char t[256];
            memcpy(t, names[i], sizeof t), memcpy(names[i], names[n - 1], sizeof t), memcpy(names[n - 1], t, sizeof t);
        }
    char from[PATH_MAX + 300], to[PATH_MAX + 300];
    for (size_t i = 0; !rc && i < n; i++) {
        snprintf(from, sizeof from, "%s/%s", stage, names[i]);
        rc = fsync_path(from, 0, e);
    }
    size_t moved = 0;
    for (; !rc && moved < n; moved++) {
        snprintf(from, sizeof from, "%s/%s", stage, names[moved]);
        snprintf(to, sizeof to, "%s/%s", dest, names[moved]);
        if (rename(from, to) != 0) rc = out_error(e, to, "rename into place", errno);
    }
    if (!rc) rc = fsync_path(dest, 1, e);
    if (rc)
        for (size_t i = 0; i < moved; i++) {
            snprintf(to, sizeof to, "%s/%s", dest, names[i]);
            unlink(to);
        }
    free(names);
    tsr_remove_tree(stage);
    return rc;
}

static int export_gguf(tsr_ckpt *ck, const tsr_model_args *a, const tsr_model_decls *d, const char *path, int dtype,
                       uint64_t *bytes_out, tsr_error *e) {
    size_t np = d->n_params;
    int rope = a->rope_scaling.factor != 0, hd = tsr_model_head_dim(a);
    size_t nt = np + (size_t)rope;
    uint64_t *off = calloc(nt, sizeof *off), at = 0, largest = 0;
    int *type = calloc(nt, sizeof *type);
    if (!off || !type) {
        free(off), free(type);
        return tsr_err(e, TSR_ENOMEM, "out of memory");
    }
    for (size_t p = 0; p < nt; p++) {
        int norm = p >= np || d->decls[p].ndim == 1;
        type[p] = norm || dtype == TSR_F32 ? TSR_F32 : dtype;
        uint64_t n = p < np ? d->decls[p].shape[0] * (d->decls[p].ndim > 1 ? d->decls[p].shape[1] : 1) : (uint64_t)hd / 2;
        off[p] = at;
        at = tsr_align_up(at + n * tsr_dtype_size(type[p]), TSR_GGUF_ALIGN);
        if (n > largest) largest = n;
    }
    /* written as STAGE/NAME, then renamed to path (DIR/NAME) */
    char dest[PATH_MAX], stage[PATH_MAX], tmp[PATH_MAX + 300];
    const char *slash = strrchr(path, '/'), *fname = slash ? slash + 1 : path;
    snprintf(dest, sizeof dest, "%.*s", slash ? (int)(slash - path) + (slash == path) : 1, slash ? path : ".");
    int rc = stage_make(dest, stage, sizeof stage, e);
    snprintf(tmp, sizeof tmp, "%s/%s", stage, fname);
    FILE *f = rc ? NULL : fopen(tmp, "wb");
    if (!f) {
        if (!rc) rc = out_error(e, tmp, "create", errno), tsr_remove_tree(stage);
        free(off), free(type);
        return rc;
    }
    tsr_gguf_writer g;
    tsr_gguf_begin(&g, f, nt);
    tsr_gguf_kv_str(&g, "general.architecture", "llama");
    tsr_gguf_kv_str(&g, "general.name", "tessera");
    tsr_gguf_kv_u32(&g, "general.alignment", TSR_GGUF_ALIGN);
    tsr_gguf_kv_u32(&g, "general.file_type", dtype == TSR_F32 ? 0u : dtype == TSR_F16 ? 1u : 32u);
    tsr_gguf_kv_u32(&g, "llama.context_length", (uint32_t)a->max_seq_len);
    tsr_gguf_kv_u32(&g, "llama.embedding_length", (uint32_t)a->dim);
    tsr_gguf_kv_u32(&g, "llama.block_count", (uint32_t)a->n_layers);
    tsr_gguf_kv_u32(&g, "llama.feed_forward_length", (uint32_t)a->ffn_dim);
    tsr_gguf_kv_u32(&g, "llama.attention.head_count", (uint32_t)a->n_heads);
    tsr_gguf_kv_u32(&g, "llama.attention.head_count_kv", (uint32_t)a->n_kv_heads);
    tsr_gguf_kv_f32(&g, "llama.rope.freq_base", a->rope_theta);
    tsr_gguf_kv_f32(&g, "llama.attention.layer_norm_rms_epsilon", a->norm_eps);
    tsr_gguf_kv_u32(&g, "llama.rope.dimension_count", (uint32_t)hd);
    tsr_gguf_kv_u32(&g, "llama.vocab_size", (uint32_t)a->vocab_size);
    gguf_tokenizer(&g, a->vocab_size);
    for (size_t p = 0; p < nt && !rc; p++) {
        char name[96];
        if (p < np) gguf_name(p, np, name, sizeof name);
        else snprintf(name, sizeof name, "rope_freqs.weight");
        uint64_t dims[2];
        int ndim = p < np && d->decls[p].ndim == 2 ? 2 : 1;
        if (ndim == 2) dims[0] = d->decls[p].shape[1], dims[1] = d->decls[p].shape[0]; /* innermost first */
        else dims[0] = p < np ? d->decls[p].shape[0] : (uint64_t)hd / 2;
        uint32_t gt = type[p] == TSR_F32 ? TSR_GGML_F32 : type[p] == TSR_F16 ? TSR_GGML_F16 : TSR_GGML_BF16;
        if ((rc = tsr_gguf_tensor_info(&g, name, ndim, dims, gt, off[p], e))) {
            tsr_err_prefix(e, "%s", path);
            break;
        }
    }
    tsr_gguf_pad_to(&g, tsr_align_up(g.pos, TSR_GGUF_ALIGN));
    uint64_t base = g.pos;
    float *buf = malloc(largest * sizeof *buf + 4);
    uint16_t *half = malloc(largest * sizeof *half + 2);
    if (!rc && (!buf || !half)) rc = tsr_err(e, TSR_ENOMEM, "out of memory");
    for (size_t p = 0; p < nt && !rc; p++) {
        uint64_t n;
        if (p < np) {
            tsr_box box = {d->decls[p].ndim, {0}, {0}};
            memcpy(box.extent, d->decls[p].shape, sizeof box.extent);
            n = tsr_box_volume(&box);
            if ((rc = tsr_model_read_f32(ck, &d->decls[p], &box, buf, e))) break;
        } else {
            n = (uint64_t)hd / 2;
            rope_factors(a, buf);
        }
        tsr_gguf_pad_to(&g, base + off[p]);
        if (type[p] == TSR_F32) {
            tsr_gguf_f32s(&g, buf, n);
        } else {
            for (uint64_t x = 0; x < n; x++) half[x] = type[p] == TSR_BF16 ? tsr_f32_to_bf16(buf[x]) : tsr_f32_to_f16(buf[x]);
            tsr_gguf_u16s(&g, half, n);
        }
    }
    if (!rc && tsr_gguf_finish(&g)) rc = out_error(e, tmp, "write", g.bad);
    if (fclose(f) && !rc) rc = out_error(e, tmp, "write", errno);
    if (!rc) rc = stage_commit(stage, dest, e);
    else tsr_remove_tree(stage);
    *bytes_out = g.pos;
    free(buf), free(half), free(off), free(type);
    return rc;
}

/* The dtype of the checkpoint's model matrices, which an export keeps unless
 * --dtype says otherwise: f32, bf16 or f16 when they all have the same, else f32. */
static int ckpt_matrix_dtype(tsr_ckpt *ck, const tsr_model_decls *d, int *dtype, tsr_error *e) {
    int dt = 0;
    for (size_t p = 0; p < d->n_params; p++) {
        tsr_tensor_info ti;
        if (d->decls[p].ndim != 2) continue;
        long i = tsr_model_find(ck, &d->decls[p], &ti, e);
        if (i < 0) return (int)i;
        dt = dt == 0 || dt == ti.dtype ? ti.dtype : -1;
    }
    *dtype = dt == TSR_BF16 || dt == TSR_F16 ? dt : TSR_F32;
    return 0;
}

typedef struct shard {
    size_t first, n; /* entries */
    uint64_t bytes;
} shard;

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
    int gguf = strcmp(format, "gguf") == 0;
    if (!gguf && strcmp(format, "safetensors") != 0)
        return tsr_usage_error("export", "--format %s: safetensors or gguf", format);
    if (tsr_s3_is_url(dir)) return export_to_s3(argc, argv, dir, gguf);
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
    if (!rc && !dtype) rc = ckpt_matrix_dtype(ck, &d, &dtype, &e);
    if (!dtype) dtype = TSR_F32; /* only to fail tidily */
    if (gguf) {
        uint64_t bytes = 0;
        if (!rc) rc = export_gguf(ck, &a, &d, dir, dtype, &bytes, &e);
        if (rc) fprintf(stderr, "tessera export: %s\n", e.msg);
        else printf("exported %s to %s: GGUF v3, llama, %zu tensors, %llu bytes, matrices %s\n", path, dir,
                    d.n_params + (a.rope_scaling.factor != 0), (unsigned long long)bytes, tsr_dtype_name(dtype));
        tsr_model_decls_free(&d);
        tsr_ckpt_close(ck);
        return rc ? EXIT_FAIL : EXIT_OK;
    }
    size_t np = d.n_params;
    if (!rc && (!(ent = calloc(np, sizeof *ent)) || !(names = calloc(np, 96)) || !(sh = calloc(np, sizeof *sh))))
        rc = tsr_err(&e, TSR_ENOMEM, "out of memory");
    /* the entries, in shards of at most shard_size bytes (a larger tensor alone) */
    uint64_t largest = 0;
    for (size_t p = 0; !rc && p < np; p++) {
        int heads;
        tsr_hf_name(&a, p, np, names + p * 96, 96, &heads);
        const tsr_tensor_decl *td = &d.decls[p];
        tsr_tensor_info ti; /* every tensor checked before any file is written */
        long i = tsr_model_find(ck, td, &ti, &e);
        if (i < 0) {
            rc = (int)i;
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
    /* every file goes into the staging directory first (see stage_commit) */
    struct stat dst;
    int made_dir = stat(dir, &dst) != 0, mk = rc ? 0 : tsr_mkdir_p(dir);
    char stage[PATH_MAX];
    if (mk) rc = out_error(&e, dir, "create", mk);
    if (!rc) rc = stage_make(dir, stage, sizeof stage, &e);
    int staged = !rc;
    if (!rc) rc = write_config(stage, &a, dtype, &e);
    if (!rc) rc = write_tokenizer(stage, &a, &e);
    uint64_t total = 0;
    for (size_t s = 0; !rc && s < nsh; s++) {
        char file[4200], fname[64];
        if (nsh == 1) snprintf(fname, sizeof fname, "model.safetensors");
        else snprintf(fname, sizeof fname, "model-%05zu-of-%05zu.safetensors", s + 1, nsh);
        snprintf(file, sizeof file, "%s/%s", stage, fname);
        uint8_t *hdr = NULL;
        size_t hl = 0;
        if ((rc = tsr_st_header(ent + sh[s].first, sh[s].n, &hdr, &hl, &e))) break;
        FILE *f = fopen(file, "wb");
        if (!f) rc = out_error(&e, file, "create", errno);
        else if (fwrite(hdr, 1, hl, f) != hl) rc = out_error(&e, file, "write", errno);
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
            if (fwrite(wr, 1, bytes, f) != bytes) rc = out_error(&e, file, "write", errno);
            total += bytes;
        }
        if (f && fclose(f) && !rc) rc = out_error(&e, file, "write", errno);
    }
    if (!rc && nsh > 1) { /* the index */
        char file[4200];
        snprintf(file, sizeof file, "%s/model.safetensors.index.json", stage);
        FILE *f = fopen(file, "w");
        if (!f) rc = out_error(&e, file, "create", errno);
        else {
            fprintf(f, "{\n  \"metadata\": {\"total_size\": %llu},\n  \"weight_map\": {\n", (unsigned long long)total);
            for (size_t s = 0; s < nsh; s++)
                for (size_t p = sh[s].first; p < sh[s].first + sh[s].n; p++)
                    fprintf(f, "    \"%s\": \"model-%05zu-of-%05zu.safetensors\"%s\n", ent[p].name, s + 1, nsh,
                            p + 1 == np ? "" : ",");
            fprintf(f, "  }\n}\n");
            if (fclose(f)) rc = out_error(&e, file, "write", errno);
        }
    }
    if (!rc) rc = stage_commit(stage, dir, &e);
    else if (staged) tsr_remove_tree(stage);
    if (rc && made_dir) rmdir(dir); /* only if empty: nothing of ours is left */
    if (rc) fprintf(stderr, "tessera export: %s\n", e.msg);
    else printf("exported %s to %s: %zu tensors, %llu bytes in %zu file(s), %s\n", path, dir, np,
                (unsigned long long)total, nsh, tsr_dtype_name(dtype));
    free(buf), free(perm), free(outb), free(ent), free(names), free(sh);
    tsr_model_decls_free(&d);
    tsr_ckpt_close(ck);
    return rc ? EXIT_FAIL : EXIT_OK;
}
