/* fuzz_tokens.c: libFuzzer target for the token-shard header check (the data
 * loader opens shards from anywhere). Each input is a whole shard file. The
 * in-memory check and tsr_tokens_open on the same bytes written to a file must
 * agree (status, width, count); an accepted shard's tokens lie inside the
 * input; every refusal says why. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "tokens.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char path[4096];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!path[0]) {
        const char *dir = getenv("TMPDIR");
        snprintf(path, sizeof path, "%s/fuzz_tokens.%d.bin", dir && dir[0] ? dir : "/tmp", (int)getpid());
    }
    tsr_error e = {0};
    int width = -1;
    size_t count = 99;
    int rc = tsr_tokens_header("fuzz.bin", data, size, &width, &count, &e);
    if (rc != 0) {
        if (!e.msg[0] || width != 0 || count != 0) __builtin_trap(); /* every refusal says why */
    } else {
        if ((width != 2 && width != 4) || TSR_TOKENS_HEADER_BYTES + (uint64_t)count * (uint64_t)width != size)
            __builtin_trap();
    }
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    size_t w = fwrite(data, 1, size, f);
    if (fclose(f) != 0 || w != size) {
        unlink(path);
        return 0;
    }
    tsr_token_shard *s = NULL;
    tsr_error e2 = {0};
    int rc2 = tsr_tokens_open(path, &s, &e2);
    unlink(path);
    if (rc2 != rc) __builtin_trap(); /* the file and the bytes get the same answer */
    if (rc2 != 0) {
        if (!e2.msg[0] || s) __builtin_trap();
        return 0;
    }
    if (tsr_tokens_width(s) != width || tsr_tokens_count(s) != count) __builtin_trap();
    uint32_t vocab = size > 12 ? data[12] * 256u + 1 : 257, max = 0;
    for (size_t i = 0; i < count; i++) {
        const uint8_t *t = data + TSR_TOKENS_HEADER_BYTES + i * (size_t)width;
        uint32_t v = width == 2 ? tsr_ld16(t) : tsr_ld32(t);
        if (tsr_tokens_get(s, i) != v) __builtin_trap();
        if (v > max) max = v;
    }
    tsr_error e3 = {0};
    int rc3 = tsr_tokens_check(s, vocab, &e3);
    if ((rc3 == 0) != (count == 0 || max < vocab) || (rc3 && !e3.msg[0])) __builtin_trap();
    tsr_tokens_close(s);
    return 0;
}
