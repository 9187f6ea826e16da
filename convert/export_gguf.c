/* export_gguf.c: a checkpoint's model as a GGUF v3 file that llama.cpp loads as
 * a llama model (tsr_export's TSR_EXPORT_GGUF), with tessera.* keys that record
 * its source and the digest of every tensor as stored (FORMAT.md 13). */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "casts.h"
#include "common.h"
#include "export_impl.h"
#include "gguf.h"
#include "tokens.h"

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

/* The GGUF name of tensor p of the file: the parameters, then rope_freqs. */
static void tensor_name(size_t p, size_t np, char *out, size_t len) {
    if (p < np) gguf_name(p, np, out, len);
    else snprintf(out, len, "rope_freqs.weight");
}

/* tessera's byte-level tokenizer (formats/tokens.h: token = byte value, 256 = end
 * of text) as llama.cpp's byte-level BPE ("gpt2") with no merge that applies: ids 0..255 are
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
        if (i < 256) tsr_gpt2_byte_char(i, t);
        else if (i == TSR_BYTE_EOT) snprintf(t, sizeof t, "<|endoftext|>");
        else snprintf(t, sizeof t, "<unused%d>", i - 257);
        tsr_gguf_str(g, t);
    }
    tsr_gguf_key(g, "tokenizer.ggml.token_type", TSR_GGUF_ARRAY);
    tsr_gguf_u32(g, TSR_GGUF_I32), tsr_gguf_u64(g, (uint64_t)V);
    for (int i = 0; i < V; i++) tsr_gguf_u32(g, i < 256 ? 1u : i == TSR_BYTE_EOT ? 3u : 5u);
    /* One merge that never applies, of the characters of byte 0xFF: that byte is
     * never in UTF-8, and llama.cpp tokenizes UTF-8 only. llama.cpp needs the
     * key; gguf-py's writer (and so its tools that rewrite a file) refuses an
     * empty array. */
    char ff[8], merge[16];
    tsr_gpt2_byte_char(0xFF, ff);
    snprintf(merge, sizeof merge, "%s %s", ff, ff);
    tsr_gguf_key(g, "tokenizer.ggml.merges", TSR_GGUF_ARRAY);
    tsr_gguf_u32(g, TSR_GGUF_STRING), tsr_gguf_u64(g, 1);
    tsr_gguf_str(g, merge);
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

/* The digests of a GGUF export (FORMAT.md 13), per tensor: its checkpoint
 * tensor (none for rope_freqs), the file offset of the value of its digest key
 * (16 hex digits, written as zeros and filled in once the data is written), and
 * its digests as written. */
typedef struct gguf_digests {
    tsr_export_tensor *from;
    uint64_t *pos;
    tsr_export_digest *dg;
} gguf_digests;

static void gguf_digests_free(gguf_digests *gd) { free(gd->from), free(gd->pos), free(gd->dg); }

/* The provenance keys: the step, the MANIFEST's hash, and per tensor its digest
 * (a place kept for it) and, where the file keeps the checkpoint tensor's dtype
 * (GGUF keeps every element's place: no permutation), that tensor's name and
 * MANIFEST digest. */
static void gguf_provenance(tsr_gguf_writer *g, const tsr_export_source *src, size_t np, size_t nt, const int *type,
                            gguf_digests *gd) {
    char key[160], val[24], name[96];
    snprintf(val, sizeof val, "%llu", (unsigned long long)src->step);
    tsr_gguf_kv_str(g, TSR_EXPORT_KEY_STEP, val);
    snprintf(val, sizeof val, "%016llx", (unsigned long long)src->manifest_xxh3);
    tsr_gguf_kv_str(g, TSR_EXPORT_KEY_MANIFEST, val);
    for (size_t p = 0; p < nt; p++) {
        tensor_name(p, np, name, sizeof name);
        snprintf(key, sizeof key, "%s%s", TSR_EXPORT_KEY_DIGEST, name);
        tsr_gguf_kv_str(g, key, TSR_EXPORT_HEX_ZERO);
        gd->pos[p] = g->pos - (sizeof TSR_EXPORT_HEX_ZERO - 1);
        const tsr_export_tensor *t = &gd->from[p];
        if (p < np && t->has_digest && t->dtype == type[p]) {
            snprintf(key, sizeof key, "%s%s", TSR_EXPORT_KEY_SOURCE, name);
            tsr_gguf_kv_str(g, key, t->name);
            snprintf(key, sizeof key, "%s%s", TSR_EXPORT_KEY_SOURCE_DIGEST, name);
            snprintf(val, sizeof val, "%016llx", (unsigned long long)t->digest);
            tsr_gguf_kv_str(g, key, val);
        }
    }
}

/* The digests as written, into the places kept for them. */
static int gguf_patch_digests(FILE *f, const char *file, size_t nt, const gguf_digests *gd, tsr_error *e) {
    for (size_t p = 0; p < nt; p++) {
        char val[24];
        snprintf(val, sizeof val, "%016llx", (unsigned long long)gd->dg[p].digest);
        if (fseek(f, (long)gd->pos[p], SEEK_SET) || fwrite(val, 16, 1, f) != 1)
            return tsr_export_out_error(e, file, "write", errno);
    }
    return fflush(f) ? tsr_export_out_error(e, file, "write", errno) : 0;
}

/* The model of src->ck (shapes a, tensors d) as the GGUF file path, matrices
 * in dtype, with its provenance and digests; *bytes_out receives the file's
 * size. */
static int gguf_file(const tsr_export_source *src, const tsr_model_args *a, const tsr_model_decls *d, const char *path,
                     int dtype, uint64_t *bytes_out, tsr_error *e) {
    tsr_ckpt *ck = src->ck;
    size_t np = d->n_params;
    int rope = a->rope_scaling.factor != 0, hd = tsr_model_head_dim(a);
    size_t nt = np + (size_t)rope;
    uint64_t *off = calloc(nt, sizeof *off), at = 0, largest = 0;
    int *type = calloc(nt, sizeof *type);
    gguf_digests gd = {calloc(nt, sizeof *gd.from), calloc(nt, sizeof *gd.pos), calloc(nt, sizeof *gd.dg)};
    tsr_export_tensor *from = gd.from;
    if (!off || !type || !gd.from || !gd.pos || !gd.dg) {
        free(off), free(type), gguf_digests_free(&gd);
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
    int rc = 0;
    for (size_t p = 0; p < np && !rc; p++) rc = tsr_export_find(ck, &d->decls[p], &from[p], e);
    if (rc) {
        free(off), free(type), gguf_digests_free(&gd);
        return rc;
    }
    /* written as STAGE/NAME, then renamed to path (DIR/NAME) */
    char dest[PATH_MAX], stage[PATH_MAX], tmp[PATH_MAX + 300];
    const char *slash = strrchr(path, '/'), *fname = slash ? slash + 1 : path;
    snprintf(dest, sizeof dest, "%.*s", slash ? (int)(slash - path) + (slash == path) : 1, slash ? path : ".");
    rc = tsr_export_stage_make(dest, stage, sizeof stage, e);
    snprintf(tmp, sizeof tmp, "%s/%s", stage, fname);
    FILE *f = rc ? NULL : fopen(tmp, "wb");
    if (!f) {
        if (!rc) rc = tsr_export_out_error(e, tmp, "create", errno), tsr_remove_tree(stage);
        free(off), free(type), gguf_digests_free(&gd);
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
    gguf_provenance(&g, src, np, nt, type, &gd);
    for (size_t p = 0; p < nt && !rc; p++) {
        char name[96];
        tensor_name(p, np, name, sizeof name);
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
            if ((rc = tsr_export_read(ck, &d->decls[p], buf, &from[p], e))) break;
        } else {
            n = (uint64_t)hd / 2;
            rope_factors(a, buf);
        }
        tsr_gguf_pad_to(&g, base + off[p]);
        char name[96];
        tensor_name(p, np, name, sizeof name);
        if (type[p] != TSR_F32)
            for (uint64_t x = 0; x < n; x++) half[x] = type[p] == TSR_BF16 ? tsr_f32_to_bf16(buf[x]) : tsr_f32_to_f16(buf[x]);
        /* the digest of the elements as the file holds them, in its order */
        const void *held = type[p] == TSR_F32 ? (const void *)buf : (const void *)half;
        if ((rc = tsr_export_digest_of(name, type[p], held, n, &from[p], p < np, &gd.dg[p], e))) break;
        if (type[p] == TSR_F32) tsr_gguf_f32s(&g, buf, n);
        else tsr_gguf_u16s(&g, half, n);
    }
    if (!rc && tsr_gguf_finish(&g)) rc = tsr_export_out_error(e, tmp, "write", g.bad);
    if (!rc) rc = gguf_patch_digests(f, tmp, nt, &gd, e);
    if (fclose(f) && !rc) rc = tsr_export_out_error(e, tmp, "write", errno);
    if (!rc) rc = tsr_export_stage_commit(stage, dest, e);
    else tsr_remove_tree(stage);
    *bytes_out = g.pos;
    free(buf), free(half), free(off), free(type), gguf_digests_free(&gd);
    return rc;
}

int tsr_export_gguf(const tsr_export_source *src, const tsr_model_args *a, const tsr_model_decls *d, const char *out,
                    int dtype, const tsr_export_opts *o, tsr_export_info *res, tsr_error *e) {
    (void)o; /* no option of its own */
    int rc = gguf_file(src, a, d, out, dtype, &res->bytes, e);
    res->n_tensors = d->n_params + (a->rope_scaling.factor != 0);
    res->n_files = 1;
    return rc;
}
