/* tsr_convert.h: the public part of convert/: offline resharding of a
 * checkpoint, and its export to and import from other formats. Conventions: tessera.h. */
#ifndef TSR_CONVERT_H
#define TSR_CONVERT_H

#include <stddef.h>
#include <stdint.h>
#include "tsr_ckpt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* --------------------------------------------------------- offline reshard */

/* tsr_reshard(): rewrites the committed checkpoint in src_dir for `layout` into
 * dst_dir, in one process: one data file per rank of the target layout, holding
 * exactly the boxes that rank loads (replicated boxes once, writers balanced by
 * bytes), so that loading it in that layout needs no resharding. It streams:
 * each box is read (only the frames it overlaps) and written in pieces of at most
 * piece_bytes, several writers at once; memory stays near writers x (2 pieces +
 * the encoder's frame buffers) whatever the checkpoint's size. Blobs are copied.
 * DST has one writer and appears only once committed: a step-N DST is written in
 * place under its root's lock; any other local DST beside it as .DST.tmp-PID-N and
 * renamed into place (a second writer of the same new DST fails, TSR_EBUSY; a
 * killed run leaves that folder). A target layout in which more than
 * half of the ranks (of two or more) would hold no element is refused
 * (TSR_EINVAL, saying how many), unless `force` is set. */
typedef struct tsr_reshard_opts {
    tsr_layout layout;     /* target; n_layers 0 keeps the source's */
    int force;             /* write even when most target ranks would hold no data */
    int model_only;        /* keep the "model" group only */
    int dtype;             /* 0, or the dtype of every floating tensor of the target */
    tsr_write_opts write;  /* codec, level, frame size of the target */
    int threads;           /* cores to use (0: the online cores); up to twice as many
                              writers run at once, fewer share their encoding */
    size_t piece_bytes;    /* default 16 MiB */
    void (*progress)(void *user, uint64_t done, uint64_t total); /* raw bytes; may be NULL */
    void *user;
} tsr_reshard_opts;
tsr_reshard_opts tsr_reshard_opts_default(void);
int tsr_reshard(const char *src_dir, const char *dst_dir, const tsr_reshard_opts *o, tsr_error *err);


/* ------------------------------------------------------------------ export */

/* tsr_export(): the model of the committed checkpoint step_dir (any layout, any
 * dtype; only the model's tensors are read) for inference, in format o->format:
 *  - TSR_EXPORT_SAFETENSORS: out is a folder that receives a Hugging Face
 *    LlamaForCausalLM: config.json, the byte-level tokenizer (tokenizer.json,
 *    tokenizer_config.json, special_tokens_map.json: one id per byte, no BOS
 *    added) and model.safetensors, or model-0000K-of-0000N.safetensors files of
 *    at most shard_size bytes with model.safetensors.index.json. Tensors get
 *    Hugging Face's names; q and k are permuted to its rotary convention.
 *  - TSR_EXPORT_GGUF: out is a v3 file that llama.cpp loads as a llama model:
 *    llama.* and general.* keys, the byte-level tokenizer (a byte-level BPE
 *    without merges), tensors token_embd, blk.N.attn_q, ..., output_norm, output
 *    (dims innermost first, 32-byte aligned), norms in f32.
 * Matrices (every tensor, for safetensors) are written in dtype. Both give the
 * model's context length (max_seq_len of its train.model blob). Files are
 * written under temporary names (a .tessera-tmp-PID directory next to them) and
 * renamed into place, config.json last, only when all are complete and synced:
 * a failed export leaves nothing, a killed one only that directory. A full disk
 * is TSR_ENOSPC naming the file; an unknown format, TSR_EINVAL. *info (may be
 * NULL) receives what was written. Every tensor read is held to its MANIFEST
 * digest (FORMAT.md 4.4; TSR_ECORRUPT naming it, nothing written), and the
 * files record the checkpoint's step, its MANIFEST's hash and every tensor's
 * digest as written (FORMAT.md 13; tsr_export_verify checks them). */
typedef enum tsr_export_format {
    TSR_EXPORT_SAFETENSORS, /* the default */
    TSR_EXPORT_GGUF,
    TSR_EXPORT_N_FORMATS
} tsr_export_format;
/* tsr_export_format_parse(): the format of a name, "safetensors" or "gguf"; -1
 * for any other. */
int tsr_export_format_parse(const char *name);
typedef struct tsr_export_opts {
    tsr_export_format format;
    int dtype;           /* TSR_F32, TSR_BF16 or TSR_F16; 0: the dtype of the
                            checkpoint's matrices when they all have the same of
                            those, else f32 */
    uint64_t shard_size; /* safetensors: bytes per file; default 2 GiB */
} tsr_export_opts;
typedef struct tsr_export_info {
    size_t n_tensors;
    uint64_t bytes;  /* GGUF: the file's size; safetensors: tensor data */
    size_t n_files;  /* safetensors files (1 for GGUF) */
    int dtype;       /* the dtype of the matrices */
} tsr_export_info;
tsr_export_opts tsr_export_opts_default(void);
int tsr_export(const char *step_dir, const char *out, const tsr_export_opts *o, tsr_export_info *info,
               tsr_error *err);


/* ------------------------------------------------------- export digests */

/* tsr_export_verify(): recomputes every tensor digest an export records
 * (FORMAT.md 13) from the export alone: `path` is a GGUF file, a safetensors
 * file, or a folder of model.safetensors or of the files that its
 * model.safetensors.index.json lists. Calls `check` (may be NULL) once per
 * tensor of the files, in file order, and once per digest recorded for a tensor
 * that no file holds (TSR_EXPORT_MISSING). A tensor that records its source's
 * name and MANIFEST digest has that digest recomputed too, from the same bytes
 * under the source's name and dtype. *prov (may be NULL) gets the recorded
 * step and MANIFEST hash. @return the number of tensors that failed (a digest
 * that differs, or one that cannot be computed), or a negative tsr_status
 * (TSR_ECORRUPT for a file that breaks its format, naming it) when the check
 * could not run. */
typedef enum tsr_export_status {
    TSR_EXPORT_OK,           /* the bytes have the recorded digest */
    TSR_EXPORT_MISMATCH,     /* they do not */
    TSR_EXPORT_NOT_RECORDED, /* the file records no digest for it */
    TSR_EXPORT_UNSUPPORTED,  /* recorded, but the stored type has no digest (a GGUF block type) */
    TSR_EXPORT_MISSING       /* recorded, but no file holds the tensor */
} tsr_export_status;
typedef struct tsr_export_check {
    const char *file;   /* the file that holds it (that records it, for MISSING) */
    const char *name;   /* as exported */
    int dtype;          /* its stored dtype (0: none, a GGUF block type) */
    uint32_t ndim;
    uint64_t shape[TSR_MAX_DIMS]; /* in the digest's order: outermost first (a GGUF file's dims reversed) */
    tsr_export_status status;
    uint64_t digest;    /* computed from the file (status OK or MISMATCH) */
    uint64_t recorded;  /* from the metadata (status other than NOT_RECORDED) */
    const char *source; /* NULL, or the checkpoint tensor whose dtype, values and order it keeps */
    tsr_export_status source_status; /* OK or MISMATCH, with a source */
    uint64_t source_digest, source_recorded;
} tsr_export_check;
typedef struct tsr_export_provenance {
    int format;         /* TSR_EXPORT_SAFETENSORS or TSR_EXPORT_GGUF */
    size_t n_files;
    int has_step, has_manifest;
    uint64_t step, manifest_xxh3;
} tsr_export_provenance;
long tsr_export_verify(const char *path, void (*check)(void *user, const tsr_export_check *c), void *user,
                       tsr_export_provenance *prov, tsr_error *err);
/* tsr_export_status_name(): "OK", "MISMATCH", "NOT RECORDED", "UNSUPPORTED", "MISSING". */
const char *tsr_export_status_name(tsr_export_status s);


/* ------------------------------------------------------------------ import */

/* tsr_import(): the Hugging Face LlamaForCausalLM in folder hf (config.json, and
 * model.safetensors or the files that model.safetensors.index.json lists; f32,
 * bf16, f16 or f64 tensors; a tensor whose file records its digest, as tessera's
 * export does (FORMAT.md 13), is held to it: TSR_ECORRUPT naming the tensor and
 * both values, nothing committed) as a committed tessera checkpoint in out, in f32, in
 * `layout` (NULL: one rank): q and k go back from Hugging Face's rotary
 * convention to Meta's, and the model's shapes go into the train.model blob (its
 * context length from max_position_embeddings, 2048 when config.json has none).
 * An out that already holds a committed checkpoint is TSR_EINVAL; a missing or
 * bad key of config.json, or a tensor missing or of another shape, is an error
 * naming it. *info (may be NULL) receives the shapes' flavor, the parameter count
 * and the layout written. */
typedef struct tsr_import_info {
    char flavor[16];
    uint64_t n_params;
    tsr_layout layout;
} tsr_import_info;
int tsr_import(const char *hf, const char *out, const tsr_layout *layout, tsr_import_info *info, tsr_error *err);

#ifdef __cplusplus
}
#endif
#endif
