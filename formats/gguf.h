/* gguf.h: a byte-level GGUF v3 writer (llama.cpp's format), little-endian, and
 * a bounds-checked reader of GGUF v2 and v3 (tsr_gguf_read).
 *
 * A file is "GGUF", the version (3), the tensor count and the key/value count
 * (u64), the key/value pairs (a string key, a u32 value type, the value), the
 * tensor infos (a string name, a u32 dimension count, u64 dims innermost first,
 * a u32 ggml type, a u64 offset into the data), padding to the alignment, the
 * data. A string is a u64 byte count and the bytes. Every number is written
 * little-endian whatever the host.
 *
 * The writer appends to a FILE; the first failed write is remembered (bad) and
 * the rest become no-ops that still count bytes, so a caller checks once at the
 * end (tsr_gguf_finish). The key/value count is counted as keys are written and
 * patched into the header by tsr_gguf_finish. */
#ifndef TSR_GGUF_H
#define TSR_GGUF_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "tsr_formats.h"

/* value types of the key/value pairs */
enum {
    TSR_GGUF_U32 = 4,
    TSR_GGUF_I32 = 5,
    TSR_GGUF_F32 = 6,
    TSR_GGUF_BOOL = 7,
    TSR_GGUF_STRING = 8,
    TSR_GGUF_ARRAY = 9,
};
/* ggml tensor types */
enum { TSR_GGML_F32 = 0, TSR_GGML_F16 = 1, TSR_GGML_BF16 = 30 };
#define TSR_GGUF_VERSION 3
#define TSR_GGUF_ALIGN 32 /* general.alignment, and llama.cpp's default */

/* tsr_gguf_name_check(): a tensor name as GGUF (llama.cpp's GGML_MAX_NAME)
 * allows it: 1 to 63 bytes of printable ASCII. Export checks every name with it.
 * @return 0, or TSR_EINVAL naming the name and the reason. */
#define TSR_GGUF_MAX_NAME 63
int tsr_gguf_name_check(const char *name, tsr_error *err);

typedef struct tsr_gguf_writer {
    FILE *f;
    uint64_t pos;  /* bytes written (or that would have been) */
    uint64_t n_kv; /* key/value pairs written */
    int bad;       /* the errno of the first failed write; 0 */
} tsr_gguf_writer;

/* tsr_gguf_begin(): a writer on f (at its start) and the header for n_tensors. */
void tsr_gguf_begin(tsr_gguf_writer *g, FILE *f, uint64_t n_tensors);

/* Raw values. */
void tsr_gguf_put(tsr_gguf_writer *g, const void *p, size_t n);
void tsr_gguf_u32(tsr_gguf_writer *g, uint32_t v);
void tsr_gguf_u64(tsr_gguf_writer *g, uint64_t v);
void tsr_gguf_str(tsr_gguf_writer *g, const char *s);
/* n floats as f32, or n 16-bit values (bf16/f16 bits), little-endian */
void tsr_gguf_f32s(tsr_gguf_writer *g, const float *x, size_t n);
void tsr_gguf_u16s(tsr_gguf_writer *g, const uint16_t *x, size_t n);
/* zero bytes up to offset `to` (no-op when already there) */
void tsr_gguf_pad_to(tsr_gguf_writer *g, uint64_t to);

/* A key and its value type, counted; the value follows (for an array: the
 * element type, the u64 count, the elements). */
void tsr_gguf_key(tsr_gguf_writer *g, const char *key, uint32_t type);
void tsr_gguf_kv_u32(tsr_gguf_writer *g, const char *key, uint32_t v);
void tsr_gguf_kv_f32(tsr_gguf_writer *g, const char *key, float v);
void tsr_gguf_kv_str(tsr_gguf_writer *g, const char *key, const char *v);
void tsr_gguf_kv_bool(tsr_gguf_writer *g, const char *key, int v);

/* tsr_gguf_tensor_info(): one tensor info: name, ndim (1..4) dims innermost
 * first, ggml type, data offset. @return 0; TSR_EINVAL (nothing written) for a
 * name that tsr_gguf_name_check refuses or an ndim outside 1..4. */
int tsr_gguf_tensor_info(tsr_gguf_writer *g, const char *name, int ndim, const uint64_t *dims, uint32_t type,
                         uint64_t offset, tsr_error *err);

/* tsr_gguf_finish(): patches the key/value count into the header and flushes;
 * leaves the FILE open. @return 0, or the errno of the first failed write. */
int tsr_gguf_finish(tsr_gguf_writer *g);

/* ------------------------------------------------------------- reading */

#define TSR_GGUF_MAX_DIMS 8 /* what the reader takes (ggml's GGML_MAX_DIMS is 4) */

/* A key/value pair as stored: the key's bytes (not NUL-terminated), the value
 * type and the value's bytes in the file (a string's without its length; an
 * array's from its element type on). */
typedef struct tsr_gguf_kv {
    const uint8_t *key, *val;
    uint64_t key_len, val_len;
    uint32_t type;
} tsr_gguf_kv;

typedef struct tsr_gguf_tensor {
    char name[TSR_MAX_NAME + 1];
    uint32_t ndim, type;                  /* type: ggml's */
    uint64_t dims[TSR_GGUF_MAX_DIMS];     /* innermost first, as stored */
    uint64_t offset;                      /* into the data section, at most its length */
} tsr_gguf_tensor;

typedef struct tsr_gguf_file {
    uint32_t version, alignment; /* general.alignment's (a power of two), or 32 */
    uint64_t data;               /* the data section's offset in the file, at most its length */
    tsr_gguf_kv *kv;
    tsr_gguf_tensor *t;
    uint64_t n_kv, n_t;
} tsr_gguf_file;

/* tsr_gguf_read(): parses the len bytes at p (a whole file; `what` names it in
 * errors) into *g, whose kv point into p. Every count, length and offset is
 * checked against len; a tensor name must be 1 to TSR_MAX_NAME bytes without
 * NUL, and unique; arrays nest at most 4 deep. @return 0, or TSR_ECORRUPT
 * saying what is wrong where (nothing to free), or TSR_ENOMEM. */
int tsr_gguf_read(const uint8_t *p, uint64_t len, const char *what, tsr_gguf_file *g, tsr_error *err);
void tsr_gguf_file_free(tsr_gguf_file *g);
/* tsr_gguf_find(): the tensor named name, or -1. */
long tsr_gguf_find(const tsr_gguf_file *g, const char *name);

#endif
