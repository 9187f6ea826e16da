/* fuzz_config.c: libFuzzer target for the job config reader (train/config.c):
 * the TOML subset and the --section.key=value overrides. An input is the TOML
 * text up to its first NUL byte, then NUL-separated override arguments. Every
 * refusal must say why; a config that loads, overrides and validates must
 * write itself out as TOML that loads back to the same TOML. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static tsr_train_config a, b;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *text = (const char *)data;
    const uint8_t *nul = memchr(data, 0, size);
    size_t toml_len = nul ? (size_t)(nul - data) : size;
    tsr_error e = {0};
    tsr_config_defaults(&a);
    if (tsr_config_parse(&a, "fuzz.toml", text, toml_len, &e) != 0) {
        if (!e.msg[0]) __builtin_trap(); /* every refusal says why */
        return 0;
    }
    /* the overrides: each NUL-terminated piece after the text (the last one may
     * run to the end of the input) */
    for (size_t at = nul ? toml_len + 1 : size; at < size;) {
        const uint8_t *end = memchr(data + at, 0, size - at);
        size_t n = end ? (size_t)(end - (data + at)) : size - at;
        char *arg = malloc(n + 1);
        if (!arg) return 0;
        memcpy(arg, data + at, n);
        arg[n] = 0;
        memset(&e, 0, sizeof e);
        int rc = tsr_config_override(&a, arg, &e);
        free(arg);
        if (rc != 0) {
            if (!e.msg[0]) __builtin_trap();
            return 0;
        }
        at += n + 1;
    }
    memset(&e, 0, sizeof e);
    int world = 1 + (int)(size % 8);
    if (tsr_config_validate(&a, world, &e) != 0) {
        if (!e.msg[0]) __builtin_trap();
        return 0;
    }
    if (tsr_config_validate(&a, world, &e) != 0) __builtin_trap(); /* idempotent */
    for (int s = 1; s <= a.training.steps && s <= 4; s++) (void)tsr_config_lr_at(&a, s);
    char *t1 = NULL, *t2 = NULL;
    size_t n1 = 0, n2 = 0;
    if (tsr_config_to_toml(&a, &t1, &n1) != 0) return 0;
    memset(&e, 0, sizeof e);
    tsr_config_defaults(&b);
    if (tsr_config_parse(&b, "effective.toml", t1, n1, &e) != 0) __builtin_trap(); /* it must load back */
    if (tsr_config_to_toml(&b, &t2, &n2) != 0) {
        free(t1);
        return 0;
    }
    if (n1 != n2 || memcmp(t1, t2, n1) != 0) __builtin_trap(); /* to the same values */
    free(t1);
    free(t2);
    return 0;
}
