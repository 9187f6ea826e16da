/* import.c: a Hugging Face Llama (config.json and safetensors, single or
 * sharded) as a tessera checkpoint: tsr_import. The digests that tessera's
 * export records in the files (FORMAT.md 13) are checked on the way in. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "casts.h"
#include "common.h"
#include "export_impl.h"
#include "hf.h"
#include "lock.h"
#include "model.h"
#include "safetensors.h"
#include "tsr_convert.h"

static char *read_text(const char *path, size_t max, tsr_error *e) {
    int fd = tsr_open_regular(path, NULL, e);
    FILE *f = fd < 0 ? NULL : fdopen(fd, "rb");
    if (!f) {
        if (fd >= 0) tsr_err(e, TSR_EIO, "%s: %s", path, strerror(errno)), close(fd);
        return NULL;
    }
    char *buf = malloc(max + 1);
    size_t n = buf ? fread(buf, 1, max + 1, f) : 0;
    fclose(f);
    if (!buf || n > max) {
        free(buf);
        tsr_err(e, TSR_EINVAL, "%s: larger than %zu bytes", path, max);
        return NULL;
    }
    buf[n] = 0;
    return buf;
}

/* config.json -> shapes; an error names the missing or bad key. */
static int read_config(const char *dir, tsr_model_args *a, int *tied, tsr_error *e) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text = read_text(path, 1 << 20, e);
    if (!text) return e->code;
    cJSON *c = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(c)) {
        cJSON_Delete(c);
        return tsr_err(e, TSR_EINVAL, "%s: not a JSON object", path);
    }
    memset(a, 0, sizeof *a);
    static const char *const req[] = {"hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers",
                                      "vocab_size", "rms_norm_eps"};
    double v[6];
    int rc = 0;
    for (int k = 0; k < 6 && !rc; k++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(c, req[k]);
        if (!cJSON_IsNumber(x)) rc = tsr_err(e, TSR_EINVAL, "%s: no number %s", path, req[k]);
        else if (!(x->valuedouble > 0) || x->valuedouble > 1e9) rc = tsr_err(e, TSR_EINVAL, "%s: bad %s", path, req[k]);
        else v[k] = x->valuedouble;
    }
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(c, "architectures");
    if (!rc && arch && !(cJSON_IsArray(arch) && cJSON_IsString(arch->child) &&
                         strcmp(arch->child->valuestring, "LlamaForCausalLM") == 0))
        rc = tsr_err(e, TSR_EINVAL, "%s: architectures is not [\"LlamaForCausalLM\"]", path);
    if (!rc) {
        snprintf(a->flavor, sizeof a->flavor, "hf");
        a->dim = (int)v[0], a->ffn_dim = (int)v[1], a->n_heads = (int)v[2], a->n_layers = (int)v[3];
        a->vocab_size = (int)v[4], a->norm_eps = (float)v[5];
        const cJSON *kv = cJSON_GetObjectItemCaseSensitive(c, "num_key_value_heads");
        a->n_kv_heads = cJSON_IsNumber(kv) ? (int)kv->valuedouble : a->n_heads;
        const cJSON *th = cJSON_GetObjectItemCaseSensitive(c, "rope_theta");
        a->rope_theta = cJSON_IsNumber(th) ? (float)th->valuedouble : 10000.0f;
        const cJSON *mp = cJSON_GetObjectItemCaseSensitive(c, "max_position_embeddings");
        a->max_seq_len = TSR_MODEL_DEFAULT_MAX_SEQ_LEN;
        if (mp && !(cJSON_IsNumber(mp) && mp->valuedouble >= 1 && mp->valuedouble <= 0x7fffffff))
            rc = tsr_err(e, TSR_EINVAL, "%s: bad max_position_embeddings", path);
        else if (mp) a->max_seq_len = (int)mp->valuedouble;
        const cJSON *hd = cJSON_GetObjectItemCaseSensitive(c, "head_dim");
        if (cJSON_IsNumber(hd) && (int)hd->valuedouble * a->n_heads != a->dim)
            rc = tsr_err(e, TSR_EINVAL, "%s: head_dim %d is not hidden_size / num_attention_heads", path, (int)hd->valuedouble);
        const cJSON *tie = cJSON_GetObjectItemCaseSensitive(c, "tie_word_embeddings");
        *tied = cJSON_IsTrue(tie);
        const cJSON *rs = cJSON_GetObjectItemCaseSensitive(c, "rope_scaling");
        if (!rc && rs && !cJSON_IsNull(rs)) {
            const cJSON *ty = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
            const cJSON *f = cJSON_GetObjectItemCaseSensitive(rs, "factor");
            const cJSON *lo = cJSON_GetObjectItemCaseSensitive(rs, "low_freq_factor");
            const cJSON *hi = cJSON_GetObjectItemCaseSensitive(rs, "high_freq_factor");
            const cJSON *om = cJSON_GetObjectItemCaseSensitive(rs, "original_max_position_embeddings");
            if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "llama3") != 0 || !cJSON_IsNumber(f) ||
                !cJSON_IsNumber(lo) || !cJSON_IsNumber(hi) || !cJSON_IsNumber(om))
                rc = tsr_err(e, TSR_EINVAL, "%s: rope_scaling: only rope_type llama3 with factor, low_freq_factor, "
                             "high_freq_factor and original_max_position_embeddings", path);
            else
                a->rope_scaling = (tsr_rope_scaling){(float)f->valuedouble, (float)lo->valuedouble,
                                                     (float)hi->valuedouble, (int)om->valuedouble};
        }
    }
    cJSON_Delete(c);
    if (rc) return rc;
    const char *named = tsr_model_flavor_of(a);
    if (named) snprintf(a->flavor, sizeof a->flavor, "%s", named);
    tsr_model_decls d;
    if ((rc = tsr_model_decls_make(a, &d, e))) return tsr_err(e, TSR_EINVAL, "%s: %s", path, e->msg);
    tsr_model_decls_free(&d);
    return 0;
}

/* The safetensors files of HFDIR (tsr_export_st_files); the metadata of each
 * (tsr_st_metadata) holds the digests recorded by tessera's export. */
static int open_files(const char *dir, tsr_st_file ***files, size_t *n, tsr_error *e) {
    char **names = NULL;
    *files = NULL, *n = 0;
    size_t k = 0, nn = 0;
    int rc = tsr_export_st_files(dir, &names, &nn, e);
    if (!rc && !(*files = calloc(nn + 1, sizeof **files))) rc = tsr_err(e, TSR_ENOMEM, "out of memory");
    if (!rc) *n = nn;
    for (; !rc && k < nn; k++) {
        char fp[PATH_MAX + 300];
        snprintf(fp, sizeof fp, "%s/%s", dir, names[k]);
        rc = tsr_st_open(fp, &(*files)[k], e);
    }
    tsr_export_st_files_free(names, nn);
    return rc;
}

static int find_tensor(tsr_st_file **files, size_t n, const char *name, tsr_st_file **f, size_t *i, size_t *file) {
    for (size_t k = 0; k < n; k++) {
        long j = files[k] ? tsr_st_find(files[k], name) : -1;
        if (j >= 0) {
            *f = files[k];
            *i = (size_t)j;
            *file = k;
            return 0;
        }
    }
    return -1;
}

/* A tensor whose file records its digest (FORMAT.md 13) must have it. */
static int check_digest(const cJSON *meta, const tsr_st_entry *en, const uint8_t *data, uint64_t n, tsr_error *e) {
    char key[TSR_MAX_NAME + 64];
    snprintf(key, sizeof key, "%s%s", TSR_EXPORT_KEY_DIGEST, en->name);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(meta, key);
    uint64_t rec;
    if (!v) return 0;
    if (!cJSON_IsString(v) || tsr_export_hex(v->valuestring, &rec))
        return tsr_err(e, TSR_ECORRUPT, "tensor %s: its digest in the file's metadata (%s) is not 16 hex digits",
                       en->name, key);
    uint64_t got = tsr_digest_tensor(tsr_digest_key(en->name, en->dtype), tsr_dtype_size(en->dtype), data, n);
    if (got != rec)
        return tsr_err(e, TSR_ECORRUPT,
                       "tensor %s: its data's digest is %016llx, the file's metadata records %016llx (changed since "
                       "it was exported); nothing imported",
                       en->name, (unsigned long long)got, (unsigned long long)rec);
    return 0;
}

/* Writes the model, consolidated, into dir. */
static int write_ckpt(const char *dir, const tsr_model_args *a, const tsr_model_decls *d, tsr_st_file **files,
                      size_t nf, int tied, tsr_error *e) {
    tsr_save *s = tsr_save_begin(dir, 0, NULL, NULL, e);
    if (!s) return e->code;
    int rc = 0;
    size_t np = d->n_params;
    for (size_t p = 0; p < np && !rc; p++) {
        const tsr_tensor_decl *t = &d->decls[p];
        rc = tsr_save_tensor(s, t->name, t->group, TSR_F32, t->ndim, t->shape, &t->placement, e);
    }
    for (size_t p = 0; p < np && !rc; p++) {
        const tsr_tensor_decl *t = &d->decls[p];
        char hn[96];
        int heads;
        tsr_hf_name(a, p, np, hn, sizeof hn, &heads);
        tsr_st_file *f = NULL;
        size_t i = 0, fk = 0;
        if (find_tensor(files, nf, hn, &f, &i, &fk) &&
            !(p == np - 1 && tied && find_tensor(files, nf, "model.embed_tokens.weight", &f, &i, &fk) == 0)) {
            rc = tsr_err(e, TSR_ENOTFOUND, "no tensor %s in the safetensors files", hn);
            break;
        }
        const tsr_st_entry *en = tsr_st_get(f, i);
        if (en->ndim != t->ndim || memcmp(en->shape, t->shape, t->ndim * sizeof *t->shape) ||
            !(en->dtype == TSR_F32 || en->dtype == TSR_BF16 || en->dtype == TSR_F16 || en->dtype == TSR_F64)) {
            rc = tsr_err(e, TSR_EINVAL, "%s: shape or dtype (%s) is not what config.json gives", hn,
                         tsr_dtype_name(en->dtype));
            break;
        }
        uint64_t n = 1;
        for (uint32_t k = 0; k < t->ndim; k++) n *= t->shape[k];
        float *w = malloc(n * sizeof *w), *o = heads ? malloc(n * sizeof *o) : NULL;
        if (!w || (heads && !o)) rc = tsr_err(e, TSR_ENOMEM, "out of memory");
        const uint8_t *src = tsr_st_bytes(f, i);
        if (!rc) rc = check_digest(tsr_st_metadata(files[fk]), en, src, n, e);
        for (uint64_t x = 0; !rc && x < n; x++) w[x] = (float)tsr_load_f64(en->dtype, src, x);
        if (!rc && heads) tsr_hf_permute(w, o, heads, tsr_model_head_dim(a), t->shape[1], 1);
        tsr_box box = {t->ndim, {0}, {0}};
        memcpy(box.extent, t->shape, sizeof box.extent);
        if (!rc) rc = tsr_save_box(s, t->name, &box, heads ? o : w, e);
        free(w);
        free(o);
    }
    char text[512];
    tsr_model_args_to_text(a, text, sizeof text);
    const uint8_t *table;
    size_t tl;
    tsr_layout l = {1, 1, 1, 1, (uint32_t)a->n_layers, 0};
    if (!rc) rc = tsr_save_blob(s, "train.model", -1, text, strlen(text), e);
    if (!rc) rc = tsr_save_finish(s, &table, &tl, e);
    if (!rc) rc = tsr_save_commit(s, NULL, NULL, 0, 0, &l, e);
    if (rc) tsr_save_abort(s);
    tsr_save_free(s);
    return rc;
}

int tsr_import(const char *hf, const char *out, const tsr_layout *layout, tsr_import_info *info, tsr_error *e) {
    tsr_reshard_opts ro = tsr_reshard_opts_default();
    if (layout) ro.layout = *layout;
    if (tsr_ckpt_is_committed(out)) return tsr_err(e, TSR_EINVAL, "%s: already holds a committed checkpoint", out);
    tsr_model_args a;
    tsr_model_decls d = {0};
    tsr_st_file **files = NULL;
    size_t nf = 0;
    int tied = 0;
    int rc = read_config(hf, &a, &tied, e);
    if (!rc) rc = tsr_model_decls_make(&a, &d, e);
    if (!rc) rc = open_files(hf, &files, &nf, e);
    /* one rank: written as OUT (which has one writer and appears only once
     * committed, lock.h); else written consolidated beside it, then resharded */
    int direct = tsr_layout_size(&ro.layout) == 1 && !(ro.layout.flags & TSR_LAYOUT_FLAT);
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s.import-%d", out, (int)getpid());
    tsr_ckpt_out *o = NULL;
    if (!rc && direct) rc = tsr_ckpt_out_begin(out, &o, e);
    if (!rc) rc = write_ckpt(direct ? tsr_ckpt_out_dir(o) : tmp, &a, &d, files, nf, tied, e);
    if (direct) {
        int end = tsr_ckpt_out_end(o, !rc, e);
        rc = rc ? rc : end;
    } else {
        ro.layout.n_layers = (uint32_t)a.n_layers;
        if (!rc) rc = tsr_reshard(tmp, out, &ro, e);
        tsr_remove_tree(tmp);
    }
    for (size_t k = 0; files && k < nf; k++) tsr_st_close(files[k]);
    free(files);
    tsr_model_decls_free(&d);
    if (!rc && info) {
        snprintf(info->flavor, sizeof info->flavor, "%s", a.flavor);
        info->n_params = tsr_model_param_count(&a);
        info->layout = ro.layout;
    }
    return rc;
}
