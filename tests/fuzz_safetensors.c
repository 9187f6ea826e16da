/* fuzz_safetensors.c: libFuzzer target for the safetensors reader (tessera
 * import reads files from anywhere). Each input is a whole file: whatever
 * parses must describe tensors whose bytes lie inside the input, in order and
 * without overlap, with names that find themselves, and a metadata object;
 * everything is freed. */
#include <stdint.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tsr_st_file *f = NULL;
    tsr_error e = {0};
    if (tsr_st_parse(data, size, "fuzz", &f, &e) != 0) {
        if (!e.msg[0]) __builtin_trap(); /* every refusal says why */
        return 0;
    }
    if (!cJSON_IsObject(tsr_st_metadata(f))) __builtin_trap(); /* "__metadata__", or an empty object */
    uint64_t sum = 0;
    for (size_t i = 0; i < tsr_st_count(f); i++) {
        const tsr_st_entry *en = tsr_st_get(f, i);
        const uint8_t *b = tsr_st_bytes(f, i);
        if (b < data || b + (en->end - en->begin) > data + size) __builtin_trap();
        if (tsr_st_find(f, en->name) != (long)i) __builtin_trap();
        for (uint64_t k = en->begin; k < en->end; k++) sum += b[k - en->begin];
    }
    tsr_st_close(f);
    return (int)(sum & 0);
}
