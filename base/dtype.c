/* dtype.c: element types (FORMAT.md section 2). */
#include <string.h>

#include "tsr_base.h"

static const struct {
    const char *name;
    size_t size;
} dtypes[] = {
    [TSR_F32] = {"f32", 4},     [TSR_F16] = {"f16", 2},       [TSR_BF16] = {"bf16", 2},
    [TSR_F64] = {"f64", 8},     [TSR_F8E4M3] = {"f8e4m3", 1}, [TSR_F8E5M2] = {"f8e5m2", 1},
    [TSR_I8] = {"i8", 1},       [TSR_I16] = {"i16", 2},       [TSR_I32] = {"i32", 4},
    [TSR_I64] = {"i64", 8},     [TSR_U8] = {"u8", 1},         [TSR_U16] = {"u16", 2},
    [TSR_U32] = {"u32", 4},     [TSR_U64] = {"u64", 8},       [TSR_BOOL] = {"bool", 1},
};
#define N_DTYPES (int)(sizeof dtypes / sizeof dtypes[0])

size_t tsr_dtype_size(int dtype) { return dtype > 0 && dtype < N_DTYPES ? dtypes[dtype].size : 0; }

const char *tsr_dtype_name(int dtype) {
    return dtype > 0 && dtype < N_DTYPES ? dtypes[dtype].name : "?";
}

int tsr_dtype_parse(const char *name) {
    for (int i = 1; i < N_DTYPES; i++)
        if (strcmp(dtypes[i].name, name) == 0) return i;
    return 0;
}

int tsr_dtype_is_float(int dtype) { return dtype >= TSR_F32 && dtype <= TSR_F8E5M2; }
