/* safetensors.h: Hugging Face's safetensors files: an 8-byte little-endian
 * header length, a JSON header (tensor name -> dtype, shape, data offsets, and
 * "__metadata__"), padded with spaces to a multiple of 8, then the data. */
#ifndef TSR_SAFETENSORS_H
#define TSR_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "tessera.h"

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
int tsr_st_header(tsr_st_entry *e, size_t n, uint8_t **out, size_t *len, tsr_error *err);

#endif
