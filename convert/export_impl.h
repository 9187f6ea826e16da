/* export_impl.h: what the export's files share (convert/). Not installed. */
#ifndef TSR_EXPORT_IMPL_H
#define TSR_EXPORT_IMPL_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "model.h"
#include "tsr_convert.h"

/* tsr_export_out_error(): the error for a failed create/write/rename of path
 * (what): a full disk (ENOSPC, EDQUOT) is TSR_ENOSPC, anything else TSR_EIO,
 * with the system's reason. @return the code. */
int tsr_export_out_error(tsr_error *e, const char *path, const char *what, int err);

/* An export's files are written into a staging directory DEST/.tessera-tmp-PID
 * (next to their final names, on the same filesystem) and renamed into DEST only
 * when every one is complete. tsr_export_stage_make(): creates it into stage.
 * tsr_export_stage_commit(): fsyncs each file of stage, renames each into dest
 * (config.json last), fsyncs dest and removes stage; on failure the files already
 * renamed are removed too. */
int tsr_export_stage_make(const char *dest, char *stage, size_t len, tsr_error *e);
int tsr_export_stage_commit(const char *stage, const char *dest, tsr_error *e);

/* GPT-2's bytes_to_unicode: the character that stands for byte b in a byte-level
 * BPE vocabulary, as a code point, or as UTF-8 into out (at most 2 bytes and a NUL). */
int tsr_gpt2_byte_codepoint(int b);
void tsr_gpt2_byte_char(int b, char out[3]);

/* ------------------------------------------- provenance and digests (FORMAT.md 13) */

/* The metadata keys of an export: safetensors __metadata__ and GGUF key/values
 * (strings): the source's step (decimal) and MANIFEST trailer (16 hex digits);
 * per tensor NAME (as exported) the digest of its bytes as stored (FORMAT.md 4.4
 * for NAME and the stored dtype; 16 hex digits) and, where the export kept the
 * source tensor's dtype, values and element order, that tensor's name and its
 * MANIFEST digest. */
#define TSR_EXPORT_KEY_STEP "tessera.step"
#define TSR_EXPORT_KEY_MANIFEST "tessera.manifest_xxh3"
#define TSR_EXPORT_KEY_DIGEST "tessera.tensor_digest."        /* + NAME (format 1.4 on) */
#define TSR_EXPORT_KEY_SOURCE "tessera.source."               /* + NAME */
#define TSR_EXPORT_KEY_SOURCE_DIGEST "tessera.source_tensor_digest." /* + NAME (format 1.4 on) */
#define TSR_EXPORT_HEX_ZERO "0000000000000000"                /* a value's width */

/* The checkpoint an export reads: the step, the MANIFEST's trailer, and per
 * tensor what tsr_export_read found. */
typedef struct tsr_export_source {
    tsr_ckpt *ck;
    uint64_t step, manifest_xxh3;
} tsr_export_source;

/* A model tensor as read from the checkpoint. */
typedef struct tsr_export_tensor {
    const char *name; /* the checkpoint's name (owned by ck) */
    int dtype;        /* as stored in the checkpoint */
    int has_digest;   /* the MANIFEST records its digest (checked by tsr_export_read) */
    uint64_t digest;
} tsr_export_tensor;

/* tsr_export_find(): the checkpoint's tensor for decl t, its dtype and MANIFEST
 * digest, without reading it. @return 0 or the error of tsr_model_find. */
int tsr_export_find(tsr_ckpt *ck, const tsr_tensor_decl *t, tsr_export_tensor *out, tsr_error *e);
/* tsr_export_read(): the whole tensor for decl t, as f32 into dst (its volume);
 * its elements as stored are held to its MANIFEST digest when one is recorded:
 * an export never writes data that is not the tensor that was saved
 * (TSR_ECORRUPT naming the tensor and both values). */
int tsr_export_read(tsr_ckpt *ck, const tsr_tensor_decl *t, float *dst, tsr_export_tensor *out, tsr_error *e);

/* What an export records of one tensor it writes: its digest as written (name
 * as exported, the stored dtype, n elements at data in the file's order) and,
 * with `keep` (the writer keeps the source's dtype and element order, and the
 * source has a digest), the source's: computed over the same bytes under the
 * source's name and dtype, it must equal the MANIFEST's (TSR_ECORRUPT if not:
 * the export changed what it promised to keep). */
typedef struct tsr_export_digest {
    uint64_t digest;
    int tied; /* the source's name and digest are recorded */
} tsr_export_digest;
int tsr_export_digest_of(const char *name, int dtype, const void *data, uint64_t n, const tsr_export_tensor *src,
                         int keep, tsr_export_digest *out, tsr_error *e);

/* tsr_export_st_files(): the safetensors files of a Hugging Face folder, by
 * name: those model.safetensors.index.json maps tensors to (each once, in the
 * order first named; a name with a '/' is TSR_EINVAL), or model.safetensors
 * where there is no index. Free with tsr_export_st_files_free. */
int tsr_export_st_files(const char *dir, char ***names, size_t *n, tsr_error *e);
void tsr_export_st_files_free(char **names, size_t n);

/* tsr_export_hex(): a metadata value of 16 hex digits into *v. @return 0, or
 * -1 when it is not one. */
int tsr_export_hex(const char *s, uint64_t *v);

/* The writers of the formats (export.c's table maps tsr_export_format to them):
 * the model of src->ck (shapes a, tensors d) into out (safetensors: a folder; GGUF:
 * a file), matrices in dtype (f32, bf16 or f16, chosen by tsr_export), with o's
 * options (o->shard_size set). *res receives the tensors, bytes and files
 * written (its dtype is the caller's). */
int tsr_export_safetensors(const tsr_export_source *src, const tsr_model_args *a, const tsr_model_decls *d,
                           const char *out, int dtype, const tsr_export_opts *o, tsr_export_info *res, tsr_error *e);
int tsr_export_gguf(const tsr_export_source *src, const tsr_model_args *a, const tsr_model_decls *d, const char *out,
                    int dtype, const tsr_export_opts *o, tsr_export_info *res, tsr_error *e);

#endif
