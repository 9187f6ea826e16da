/* export_impl.h: what the export's files share (convert/). Not installed. */
#ifndef TSR_EXPORT_IMPL_H
#define TSR_EXPORT_IMPL_H

#include <stdint.h>

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

/* The writers of the formats (export.c's table maps tsr_export_format to them):
 * the model of ck (shapes a, tensors d) into out (safetensors: a folder; GGUF:
 * a file), matrices in dtype (f32, bf16 or f16, chosen by tsr_export), with o's
 * options (o->shard_size set). *res receives the tensors, bytes and files
 * written (its dtype is the caller's). */
int tsr_export_safetensors(tsr_ckpt *ck, const tsr_model_args *a, const tsr_model_decls *d, const char *out,
                           int dtype, const tsr_export_opts *o, tsr_export_info *res, tsr_error *e);
int tsr_export_gguf(tsr_ckpt *ck, const tsr_model_args *a, const tsr_model_decls *d, const char *out, int dtype,
                    const tsr_export_opts *o, tsr_export_info *res, tsr_error *e);

#endif
