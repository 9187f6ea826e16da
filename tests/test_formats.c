/* test_formats.c: the inference formats' rules, unit by unit: the safetensors
 * header writer against the reader (every entry back, offsets in order), hostile
 * headers built in memory (each refused with its reason), and GGUF's tensor
 * name limit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gguf.h"
#include "safetensors.h"

/* A file in memory: header for the entries, then `data` bytes of filler. */
static uint8_t *file_of(tsr_st_entry *e, size_t n, size_t *len) {
    uint8_t *hdr = NULL;
    size_t hl = 0;
    tsr_error err;
    if (tsr_st_header(e, n, NULL, &hdr, &hl, &err)) return NULL;
    uint64_t data = n ? e[n - 1].end : 0;
    uint8_t *f = malloc(hl + data + 1);
    memcpy(f, hdr, hl);
    for (uint64_t i = 0; i < data; i++) f[hl + i] = (uint8_t)(i * 7);
    free(hdr);
    *len = hl + (size_t)data;
    return f;
}

/* A raw header text as a file with `data` bytes after it. */
static uint8_t *raw_file(const char *json, uint64_t hl_field, size_t data, size_t *len) {
    size_t n = strlen(json);
    uint8_t *f = calloc(1, 8 + n + data + 1);
    for (int i = 0; i < 8; i++) f[i] = (uint8_t)(hl_field >> (8 * i));
    memcpy(f + 8, json, n);
    *len = 8 + n + data;
    return f;
}

static void expect_refused(const char *json, uint64_t hl, size_t data, const char *reason) {
    size_t len = 0;
    uint8_t *f = raw_file(json, hl ? hl : strlen(json), data, &len);
    tsr_st_file *st = NULL;
    tsr_error e = {0};
    int rc = tsr_st_parse(f, len, "t.safetensors", &st, &e);
    CHECK(rc != 0 && !st, "accepted: %s", json);
    CHECK(strstr(e.msg, "t.safetensors") && strstr(e.msg, reason), "%s: message '%s' lacks '%s'", json, e.msg, reason);
    tsr_st_close(st);
    free(f);
}

int main(void) {
    /* the writer's header reads back entry for entry */
    tsr_st_entry e[3] = {
        {"model.embed_tokens.weight", TSR_BF16, 2, {5, 3}, 0, 0},
        {"model.norm.weight", TSR_F32, 1, {3}, 0, 0},
        {"lm_head.weight", TSR_F16, 2, {5, 3}, 0, 0},
    };
    size_t len = 0;
    uint8_t *f = file_of(e, 3, &len);
    CHECK(f != NULL, "header");
    CHECK(((len - (size_t)e[2].end) - 8) % 8 == 0, "header padded to 8 bytes");
    CHECK(e[0].begin == 0 && e[0].end == 30 && e[1].begin == 30 && e[1].end == 42 && e[2].end == 72, "offsets");
    tsr_st_file *st = NULL;
    tsr_error err = {0};
    CHECK(tsr_st_parse(f, len, "w.safetensors", &st, &err) == 0, "parse: %s", err.msg);
    if (st) {
        CHECK(tsr_st_count(st) == 3, "count");
        for (int i = 0; i < 3; i++) {
            long k = tsr_st_find(st, e[i].name);
            CHECK(k >= 0, "%s found", e[i].name);
            if (k < 0) continue;
            const tsr_st_entry *g = tsr_st_get(st, (size_t)k);
            CHECK(g->dtype == e[i].dtype && g->ndim == e[i].ndim && g->shape[0] == e[i].shape[0] &&
                      g->begin == e[i].begin && g->end == e[i].end,
                  "%s read back", e[i].name);
            CHECK(tsr_st_bytes(st, (size_t)k)[0] == (uint8_t)(e[i].begin * 7), "%s bytes", e[i].name);
        }
        CHECK(tsr_st_find(st, "nothing") == -1, "absent name");
    }
    tsr_st_close(st);
    free(f);
    /* an unknown dtype cannot be written */
    tsr_st_entry bad = {"x", TSR_U64, 1, {1}, 0, 0};
    uint8_t *h = NULL;
    size_t hl;
    CHECK(tsr_st_header(&bad, 1, NULL, &h, &hl, &err) == TSR_EINVAL && strstr(err.msg, "x"), "u64 refused");
    free(h);

    /* hostile headers */
    const char *ok = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    expect_refused(ok, 1ull << 40, 8, "header length");
    expect_refused(ok, 4096, 8, "past the end");
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,16]}}", 0, 8, "past the end");
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                   0, 8, "overlaps");
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 0, 8, "data_offsets");
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 0, 8, "shape needs");
    expect_refused("{\"a\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]}}", 0, 8, "unknown dtype");
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 0, 8, "hole");
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 0, 8, "after the last");
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 0, 8, "bad shape");
    expect_refused("[1,2]", 0, 0, "not a JSON object");
    expect_refused("{\"a\":", 0, 0, "not a JSON object");
    expect_refused("", 0, 0, "not a JSON object");

    /* GGUF names: at most 63 bytes of printable ASCII */
    char name[80];
    memset(name, 'x', sizeof name);
    name[63] = 0;
    CHECK(tsr_gguf_name_check(name, &err) == 0, "63 bytes allowed");
    name[63] = 'x';
    name[64] = 0;
    CHECK(tsr_gguf_name_check(name, &err) == TSR_EINVAL && strstr(err.msg, "64 bytes"), "64 bytes refused: %s", err.msg);
    CHECK(tsr_gguf_name_check("", &err) == TSR_EINVAL, "empty refused");
    CHECK(tsr_gguf_name_check("blk.0.attn q", &err) == TSR_EINVAL && strstr(err.msg, "byte 10"), "space refused");
    CHECK(tsr_gguf_name_check("blk.11.attn_output.weight", &err) == 0, "a real name");
    return check_done();
}
