/* export.c: tsr_export: a checkpoint's model for inference, in one of the
 * formats of tsr_export_format, each written by its own file (the table
 * below): safetensors in Hugging Face's Llama layout (export_safetensors.c),
 * GGUF (export_gguf.c); what they share is in export_files.c, and the check
 * of their digests from the files alone (FORMAT.md 13) in export_verify.c. */
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "export_impl.h"

/* The formats: the name --format takes, and the writer. */
static const struct export_format {
    const char *name;
    int (*write)(const tsr_export_source *src, const tsr_model_args *a, const tsr_model_decls *d, const char *out,
                 int dtype, const tsr_export_opts *o, tsr_export_info *res, tsr_error *e);
} FORMATS[TSR_EXPORT_N_FORMATS] = {
    [TSR_EXPORT_SAFETENSORS] = {"safetensors", tsr_export_safetensors},
    [TSR_EXPORT_GGUF] = {"gguf", tsr_export_gguf},
};

int tsr_export_format_parse(const char *name) {
    for (int f = 0; f < TSR_EXPORT_N_FORMATS; f++)
        if (!strcmp(name, FORMATS[f].name)) return f;
    return -1;
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

/* ------------------------------------------------------------------ export */

tsr_export_opts tsr_export_opts_default(void) {
    return (tsr_export_opts){.format = TSR_EXPORT_SAFETENSORS, .dtype = 0, .shard_size = 2ull << 30};
}

int tsr_export(const char *step_dir, const char *out, const tsr_export_opts *o, tsr_export_info *info, tsr_error *e) {
    tsr_export_opts def = tsr_export_opts_default(), opts;
    if (!o) o = &def;
    if ((unsigned)o->format >= TSR_EXPORT_N_FORMATS)
        return tsr_err(e, TSR_EINVAL, "export: format %d: safetensors or gguf", (int)o->format);
    if (o->dtype && !(o->dtype == TSR_F32 || o->dtype == TSR_BF16 || o->dtype == TSR_F16))
        return tsr_err(e, TSR_EINVAL, "export: dtype %s: f32, bf16 or f16", tsr_dtype_name(o->dtype));
    opts = *o;
    if (!opts.shard_size) opts.shard_size = def.shard_size;
    /* the MANIFEST read once: its trailer is the export's proof of its source */
    uint8_t *mf = NULL;
    size_t mf_len = 0;
    tsr_ckpt *ck = NULL;
    if (!tsr_ckpt_read_manifest(step_dir, &mf, &mf_len, e)) ck = tsr_ckpt_open_manifest(step_dir, mf, mf_len, e);
    tsr_export_source src = {ck, ck ? tsr_ckpt_step(ck) : 0, ck ? tsr_ld64(mf + mf_len - 8) : 0};
    free(mf);
    tsr_model_args a;
    tsr_model_decls d = {0};
    int dtype = o->dtype;
    int rc = ck ? tsr_model_args_from_ckpt(ck, &a, e) : e->code;
    if (!rc) rc = tsr_model_decls_make(&a, &d, e);
    if (!rc && !dtype) rc = ckpt_matrix_dtype(ck, &d, &dtype, e);
    if (!dtype) dtype = TSR_F32; /* only to fail tidily */
    tsr_export_info res = {0, 0, 1, dtype};
    if (!rc) rc = FORMATS[o->format].write(&src, &a, &d, out, dtype, &opts, &res, e);
    if (!rc && info) *info = res;
    tsr_model_decls_free(&d);
    tsr_ckpt_close(ck);
    return rc;
}
