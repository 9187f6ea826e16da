/* safetensors.h: the inference formats' rules that tessera checks. Hugging
 * Face's safetensors files: an 8-byte little-endian
 * header length, a JSON header (tensor name -> dtype, shape, data offsets, and
 * "__metadata__"), padded with spaces to a multiple of 8, then the data. */
#ifndef TSR_SAFETENSORS_H
#define TSR_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "tsr_formats.h"

typedef struct tsr_st_entry {
    const char *name;
    int dtype; /* TSR_F32, TSR_F16, TSR_BF16, ... */
    uint32_t ndim;
    uint64_t shape[TSR_MAX_DIMS];
    uint64_t begin, end; /* byte offsets in the data section (filled by tsr_st_header) */
} tsr_st_entry;

/* tsr_st_dtype_name(): "F32", "BF16", ... as safetensors spells them; NULL if it has none. */
const char *tsr_st_dtype_name(int dtype);

/* tsr_st_header(): lays the n entries out back to back in the data section (in
 * order, filling begin/end) and builds the file's first bytes: the 8-byte length
 * and the padded JSON header with "__metadata__": {"format": "pt"}. *out is
 * malloc'ed (*len bytes); the data follows it. */
int tsr_st_header(tsr_st_entry *e, size_t n, const char *metadata, uint8_t **out, size_t *len, tsr_error *err);

/* Reading. A parsed file: every entry checked (known dtype, shape and byte
 * range that agree, ranges inside the data section, in order, without overlap
 * or hole, names unique and at most 255 bytes), so that tsr_st_bytes is safe. */
typedef struct tsr_st_file tsr_st_file;
/* tsr_st_parse(): from the first len bytes of a file held in memory (buf must
 * outlive the result); `what` names it in errors. */
int tsr_st_parse(const uint8_t *buf, size_t len, const char *what, tsr_st_file **out, tsr_error *err);
/* tsr_st_open(): a file, mapped read-only. */
int tsr_st_open(const char *path, tsr_st_file **out, tsr_error *err);
size_t tsr_st_count(const tsr_st_file *f);
const tsr_st_entry *tsr_st_get(const tsr_st_file *f, size_t i);
long tsr_st_find(const tsr_st_file *f, const char *name);
const uint8_t *tsr_st_bytes(const tsr_st_file *f, size_t i);
/* tsr_st_metadata(): the file's "__metadata__" object (checked an object when
 * parsed; an empty one when the file has none), the file's. */
const struct cJSON *tsr_st_metadata(const tsr_st_file *f);
void tsr_st_close(tsr_st_file *f);

#endif
