/* model.c: named shapes, parameter declarations and initialization. */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "casts.h"
#include "common.h"

static const tsr_model_args FLAVORS[] = {
    /* flavor  dim  layers heads kv  ffn   vocab   eps    theta */
    {"debug", 128, 4, 4, 2, 384, 320, 1e-5f, 500000.0f, {0, 0, 0, 0}, TSR_MODEL_DEFAULT_MAX_SEQ_LEN},
    {"small", 384, 6, 6, 2, 1024, 320, 1e-5f, 500000.0f, {0, 0, 0, 0}, TSR_MODEL_DEFAULT_MAX_SEQ_LEN},
    {"124m", 768, 12, 12, 12, 2048, 50304, 1e-5f, 500000.0f, {0, 0, 0, 0}, TSR_MODEL_DEFAULT_MAX_SEQ_LEN},
    {"1b", 2048, 16, 32, 8, 8192, 128256, 1e-5f, 500000.0f, {32.0f, 1.0f, 4.0f, 8192}, TSR_MODEL_DEFAULT_MAX_SEQ_LEN},
    {"8b", 4096, 32, 32, 8, 14336, 128256, 1e-5f, 500000.0f, {8.0f, 1.0f, 4.0f, 8192}, TSR_MODEL_DEFAULT_MAX_SEQ_LEN},
    {"405b", 16384, 126, 128, 8, 53248, 128256, 1e-5f, 500000.0f, {8.0f, 1.0f, 4.0f, 8192}, TSR_MODEL_DEFAULT_MAX_SEQ_LEN},
};

const char *tsr_model_flavor_of(const tsr_model_args *a) {
    for (size_t i = 0; i < sizeof FLAVORS / sizeof *FLAVORS; i++) {
        tsr_model_args f = FLAVORS[i];
        memcpy(f.flavor, a->flavor, sizeof f.flavor);
        f.max_seq_len = a->max_seq_len;
        if (memcmp(&f, a, sizeof f) == 0) return FLAVORS[i].flavor;
    }
    return NULL;
}

int tsr_model_args_get(const char *flavor, tsr_model_args *a, tsr_error *err) {
    for (size_t i = 0; i < sizeof FLAVORS / sizeof *FLAVORS; i++)
        if (strcmp(flavor, FLAVORS[i].flavor) == 0) {
            *a = FLAVORS[i];
            return 0;
        }
    return tsr_err(err, TSR_EINVAL, "model flavor '%s': unknown (debug, small, 124m, 1b, 8b, 405b)", flavor);
}

static const char *const LAYER_NAMES[TSR_LAYER_PARAMS] = {
    "attention_norm.weight", "attention.wq.weight", "attention.wk.weight",
    "attention.wv.weight",   "attention.wo.weight", "ffn_norm.weight",
    "feed_forward.w1.weight", "feed_forward.w2.weight", "feed_forward.w3.weight",
};

/* The shape and placement of parameter p (name written into name). */
static tsr_tensor_decl param_decl(const tsr_model_args *a, size_t p, char *name, size_t len) {
    int hd = tsr_model_head_dim(a);
    uint64_t C = (uint64_t)a->dim, V = (uint64_t)a->vocab_size, F = (uint64_t)a->ffn_dim;
    uint64_t Dq = (uint64_t)a->n_heads * hd, Dkv = (uint64_t)a->n_kv_heads * hd;
    size_t n = tsr_model_n_params(a);
    tsr_tensor_decl t = {.name = name, .group = "model", .dtype = TSR_F32, .ndim = 2};
    t.placement = (tsr_placement){.tp_dim = -1, .fsdp = 1, .pp_role = TSR_PP_LAYER, .layer = -1};
    if (p == 0 || p == n - 1) {
        snprintf(name, len, "%s", p == 0 ? "tok_embeddings.weight" : "output.weight");
        t.shape[0] = V, t.shape[1] = C;
        t.placement.pp_role = p == 0 ? TSR_PP_FIRST : TSR_PP_LAST;
        /* the output is split over tp by vocabulary rows (TorchTitan's
         * ColwiseParallel with loss_parallel): each tp rank computes its
         * columns of the logits and of the loss */
        if (p != 0) t.placement.tp_dim = 0;
        return t;
    }
    if (p == n - 2) {
        snprintf(name, len, "norm.weight");
        t.ndim = 1, t.shape[0] = C;
        t.placement.pp_role = TSR_PP_LAST;
        return t;
    }
    int layer = (int)((p - 1) / TSR_LAYER_PARAMS), k = (int)((p - 1) % TSR_LAYER_PARAMS);
    snprintf(name, len, "layers.%d.%s", layer, LAYER_NAMES[k]);
    t.placement.layer = layer;
    switch (k) {
    case TSR_P_ATTN_NORM:
    case TSR_P_FFN_NORM: t.ndim = 1, t.shape[0] = C; break;
    case TSR_P_WQ: t.shape[0] = Dq, t.shape[1] = C, t.placement.tp_dim = 0; break;
    case TSR_P_WK:
    case TSR_P_WV: t.shape[0] = Dkv, t.shape[1] = C, t.placement.tp_dim = 0; break;
    case TSR_P_WO: t.shape[0] = C, t.shape[1] = Dq, t.placement.tp_dim = 1; break;
    case TSR_P_W1:
    case TSR_P_W3: t.shape[0] = F, t.shape[1] = C, t.placement.tp_dim = 0; break;
    case TSR_P_W2: t.shape[0] = C, t.shape[1] = F, t.placement.tp_dim = 1; break;
    }
    return t;
}

int tsr_model_decls_make(const tsr_model_args *a, tsr_model_decls *d, tsr_error *err) {
    memset(d, 0, sizeof *d);
    if (a->dim <= 0 || a->n_heads <= 0 || a->n_kv_heads <= 0 || a->dim % a->n_heads ||
        a->n_heads % a->n_kv_heads || tsr_model_head_dim(a) % 2 || a->n_layers < 1 || a->ffn_dim < 1 ||
        a->vocab_size < 1)
        return tsr_err(err, TSR_EINVAL, "model '%s': inconsistent shapes", a->flavor);
    size_t n = tsr_model_n_params(a);
    enum { NAME = 96 };
    d->decls = calloc(3 * n, sizeof *d->decls);
    d->names = calloc(3 * n, NAME);
    if (!d->decls || !d->names) {
        tsr_model_decls_free(d);
        return tsr_err(err, TSR_ENOMEM, "out of memory");
    }
    d->n_params = n;
    for (size_t p = 0; p < n; p++) {
        char *name = d->names + p * NAME;
        d->decls[p] = param_decl(a, p, name, NAME);
        for (int k = 1; k <= 2; k++) {
            char *oname = d->names + (k * n + p) * NAME;
            snprintf(oname, NAME, "optim.%s.%s", k == 1 ? "exp_avg" : "exp_avg_sq", name);
            d->decls[k * n + p] = d->decls[p];
            d->decls[k * n + p].name = oname;
            d->decls[k * n + p].group = "optim";
        }
    }
    return 0;
}

void tsr_model_decls_free(tsr_model_decls *d) {
    free(d->decls);
    free(d->names);
    memset(d, 0, sizeof *d);
}

uint64_t tsr_model_param_count(const tsr_model_args *a) {
    uint64_t C = (uint64_t)a->dim, hd = (uint64_t)tsr_model_head_dim(a);
    uint64_t per_layer = 2 * C + 2 * C * a->n_heads * hd + 2 * C * a->n_kv_heads * hd + 3 * C * a->ffn_dim;
    return (uint64_t)a->n_layers * per_layer + 2 * (uint64_t)a->vocab_size * C + C;
}

/* ------------------------------------------------------------ initialization */

/* A standard normal for element i of the stream `key`: Box-Muller on the pair
 * (i & ~1, i | 1), so that the value depends on the index alone. */
static float normal_at(uint64_t key, uint64_t i) {
    uint64_t r = tsr_splitmix64(key ^ tsr_splitmix64(i >> 1));
    double u1 = ((r >> 11) + 1.0) * 0x1.0p-53; /* (0, 1] */
    double u2 = (tsr_splitmix64(r) >> 11) * 0x1.0p-53;
    double rad = sqrt(-2.0 * log(u1)), ang = 2.0 * M_PI * u2;
    return (float)(rad * ((i & 1) ? sin(ang) : cos(ang)));
}

void tsr_model_init_box(const tsr_model_args *a, const tsr_model_decls *d, size_t p,
                        const tsr_box *box, float *dst, uint64_t seed) {
    const tsr_tensor_decl *t = &d->decls[p];
    uint64_t n = tsr_box_volume(box);
    if (t->ndim == 1) { /* norm weights */
        for (uint64_t i = 0; i < n; i++) dst[i] = 1.0f;
        return;
    }
    size_t np = d->n_params;
    double std = 0.02;
    if (p == 0) std = 1.0;
    else if (p == np - 1) std = 1.0 / sqrt((double)a->dim);
    else {
        int k = (int)((p - 1) % TSR_LAYER_PARAMS), layer = (int)((p - 1) / TSR_LAYER_PARAMS);
        if (k == TSR_P_WO || k == TSR_P_W2 || k == TSR_P_W3) std = 0.02 / sqrt(2.0 * (layer + 1));
    }
    uint64_t key = tsr_splitmix64(seed) ^ tsr_hash(t->name, strlen(t->name));
    uint64_t cols = box->extent[1], gcols = t->shape[1];
#pragma omp parallel for schedule(static)
    for (uint64_t r = 0; r < box->extent[0]; r++) {
        uint64_t base = (box->offset[0] + r) * gcols + box->offset[1];
        float *row = dst + r * cols;
        for (uint64_t c = 0; c < cols; c++) row[c] = (float)(std * normal_at(key, base + c));
    }
}

/* ------------------------------------------------------------ shapes as text */

void tsr_model_args_to_text(const tsr_model_args *a, char *buf, size_t len) {
    snprintf(buf, len,
             "flavor=%s dim=%d n_layers=%d n_heads=%d n_kv_heads=%d ffn_dim=%d vocab_size=%d "
             "norm_eps=%.9g rope_theta=%.9g rope_factor=%.9g rope_low=%.9g rope_high=%.9g rope_orig=%d max_seq_len=%d",
             a->flavor, a->dim, a->n_layers, a->n_heads, a->n_kv_heads, a->ffn_dim, a->vocab_size,
             (double)a->norm_eps, (double)a->rope_theta, (double)a->rope_scaling.factor,
             (double)a->rope_scaling.low_freq_factor, (double)a->rope_scaling.high_freq_factor,
             a->rope_scaling.original_max_pos, a->max_seq_len);
}

/* The next space-separated word of *p that is not max_seq_len=..., with its
 * length in *n; *p moves past it. */
static const char *next_shape_word(const char **p, size_t *n) {
    for (;;) {
        const char *w = *p;
        *n = strcspn(w, " ");
        *p = w + *n + (w[*n] == ' ');
        if (!(*n > 12 && strncmp(w, "max_seq_len=", 12) == 0)) return w;
    }
}

/* @return 0 if `text` describes the same shapes as a, else 1 with the first
 * differing key ("dim: checkpoint 256, job 128") in why. */
int tsr_model_args_compare(const tsr_model_args *a, const char *text, char *why, size_t why_len) {
    char mine[512];
    tsr_model_args_to_text(a, mine, sizeof mine);
    const char *p = mine, *q = text;
    for (;;) {
        size_t lp, lq;
        const char *wp = next_shape_word(&p, &lp), *wq = next_shape_word(&q, &lq);
        if (lp == 0 && lq == 0) return 0;
        if (lp != lq || memcmp(wp, wq, lp) != 0) {
            size_t kl = strcspn(wp, "=");
            snprintf(why, why_len, "%.*s: checkpoint has '%.*s', the job '%.*s'", (int)kl, wp, (int)lq, wq,
                     (int)lp, wp);
            return 1;
        }
    }
}

int tsr_model_args_parse(const char *text, tsr_model_args *a, tsr_error *err) {
    memset(a, 0, sizeof *a);
    double v[12];
    int n = 0;
    static const char *const keys[12] = {"dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size",
                                         "norm_eps", "rope_theta", "rope_factor", "rope_low", "rope_high", "rope_orig"};
    const char *p = strstr(text, "flavor=");
    if (!p || sscanf(p + 7, "%15s", a->flavor) != 1) return tsr_err(err, TSR_ECORRUPT, "model shapes: no flavor");
    for (int k = 0; k < 12; k++) {
        char pat[32];
        snprintf(pat, sizeof pat, " %s=", keys[k]);
        const char *q = strstr(text, pat);
        char *end;
        if (!q) return tsr_err(err, TSR_ECORRUPT, "model shapes: no %s", keys[k]);
        v[k] = strtod(q + strlen(pat), &end);
        if (end == q + strlen(pat) || !(v[k] >= 0) || v[k] > 1e9)
            return tsr_err(err, TSR_ECORRUPT, "model shapes: bad %s", keys[k]);
        n++;
    }
    a->dim = (int)v[0], a->n_layers = (int)v[1], a->n_heads = (int)v[2], a->n_kv_heads = (int)v[3];
    a->ffn_dim = (int)v[4], a->vocab_size = (int)v[5];
    a->norm_eps = (float)v[6], a->rope_theta = (float)v[7];
    a->rope_scaling = (tsr_rope_scaling){(float)v[8], (float)v[9], (float)v[10], (int)v[11]};
    a->max_seq_len = TSR_MODEL_DEFAULT_MAX_SEQ_LEN;
    const char *m = strstr(text, " max_seq_len=");
    if (m) {
        char *end;
        long x = strtol(m + 13, &end, 10);
        if (end == m + 13 || (*end && *end != ' ') || x < 1 || x > 0x7fffffff)
            return tsr_err(err, TSR_ECORRUPT, "model shapes: bad max_seq_len");
        a->max_seq_len = (int)x;
    }
    tsr_model_decls d;
    int rc = tsr_model_decls_make(a, &d, err); /* checks the shapes agree */
    if (!rc) tsr_model_decls_free(&d);
    return n == 12 ? rc : TSR_ECORRUPT;
}

/* ------------------------------------------------------------ checkpoints */

int tsr_model_args_from_ckpt(tsr_ckpt *ck, tsr_model_args *a, tsr_error *err) {
    long b = tsr_ckpt_find_blob(ck, "train.model", -1);
    if (b < 0) return tsr_err(err, TSR_ENOTFOUND, "%s: no train.model blob: not a model checkpoint", tsr_ckpt_dir(ck));
    tsr_blob_info bi;
    tsr_ckpt_blob(ck, (size_t)b, &bi);
    if (bi.size >= 4096) return tsr_err(err, TSR_ECORRUPT, "%s: train.model blob of %llu bytes", tsr_ckpt_dir(ck),
                                        (unsigned long long)bi.size);
    char text[4096] = {0};
    int rc = tsr_ckpt_read_blob(ck, (size_t)b, text, err);
    if (!rc && (rc = tsr_model_args_parse(text, a, err))) tsr_err_prefix(err, "%s", tsr_ckpt_dir(ck));
    return rc;
}

long tsr_model_find(tsr_ckpt *ck, const tsr_tensor_decl *t, tsr_tensor_info *ti, tsr_error *err) {
    long i = tsr_ckpt_find(ck, t->name);
    if (i < 0) return tsr_err(err, TSR_ENOTFOUND, "%s: no tensor %s", tsr_ckpt_dir(ck), t->name);
    tsr_ckpt_tensor(ck, (size_t)i, ti);
    if (ti->ndim != t->ndim || memcmp(ti->shape, t->shape, t->ndim * sizeof *ti->shape) || !tsr_dtype_is_float(ti->dtype))
        return tsr_err(err, TSR_EINVAL, "%s: %s has another shape or dtype (%s) than the model's", tsr_ckpt_dir(ck),
                       t->name, tsr_dtype_name(ti->dtype));
    return i;
}

int tsr_model_read_f32(tsr_ckpt *ck, const tsr_tensor_decl *t, const tsr_box *box, float *dst, tsr_error *err) {
    tsr_tensor_info ti;
    long i = tsr_model_find(ck, t, &ti, err);
    if (i < 0) return (int)i;
    if (ti.dtype == TSR_F32) return tsr_ckpt_read(ck, (size_t)i, box, dst, err);
    uint64_t n = tsr_box_volume(box);
    void *buf = malloc(n * tsr_dtype_size(ti.dtype) + 1);
    if (!buf) return tsr_err(err, TSR_ENOMEM, "out of memory for %s", t->name);
    int rc = tsr_ckpt_read(ck, (size_t)i, box, buf, err);
    for (uint64_t x = 0; !rc && x < n; x++) dst[x] = (float)tsr_load_f64(ti.dtype, buf, x);
    free(buf);
    return rc;
}
