/* tokens.c: llm.c token shards (.bin): writing, mapping and checking; the
 * byte-level tokenizer. Layout in tokens.h. */
#include "tokens.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

struct tsr_token_shard {
    char *path;
    const uint8_t *map; /* the whole file, header included */
    size_t map_len;
    const uint8_t *tok; /* map + TSR_TOKENS_HEADER_BYTES */
    size_t n;
    int width; /* bytes per token: 2 or 4 */
};

static int io_code(int e) { return e == ENOSPC || e == EDQUOT ? TSR_ENOSPC : TSR_EIO; }

static int write_all(int fd, const uint8_t *p, size_t len) {
    while (len) {
        ssize_t w = write(fd, p, len);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w, len -= (size_t)w;
    }
    return 0;
}

int tsr_tokens_write(const char *path, const uint32_t *tokens, size_t n, int token_bytes, tsr_error *err) {
    if (token_bytes != 2 && token_bytes != 4)
        return tsr_err(err, TSR_EINVAL, "%s: token width %d bytes: must be 2 or 4", path, token_bytes);
    if (n > TSR_TOKENS_MAX)
        return tsr_err(err, TSR_EINVAL, "%s: %zu tokens: a shard holds at most %u", path, n, TSR_TOKENS_MAX);
    if (token_bytes == 2)
        for (size_t i = 0; i < n; i++)
            if (tokens[i] > UINT16_MAX)
                return tsr_err(err, TSR_EINVAL, "%s: token %zu is %u, which does not fit in 2 bytes", path, i,
                               tokens[i]);
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return tsr_err(err, TSR_EINVAL, "%s: path too long", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        return tsr_err(err, e == ENOENT ? TSR_ENOTFOUND : io_code(e), "%s: cannot create: %s", tmp, strerror(e));
    }
    // buf is the header, then each round up to 16384 tokens in little-endian
    uint8_t buf[16384 * 4];
    memset(buf, 0, TSR_TOKENS_HEADER_BYTES);
    tsr_st32(buf, token_bytes == 2 ? TSR_TOKENS_MAGIC_U16 : TSR_TOKENS_MAGIC_U32);
    tsr_st32(buf + 4, token_bytes == 2 ? TSR_TOKENS_VERSION_U16 : TSR_TOKENS_VERSION_U32);
    tsr_st32(buf + 8, (uint32_t)n);
    int rc = write_all(fd, buf, TSR_TOKENS_HEADER_BYTES);
    for (size_t i = 0; rc == 0 && i < n;) {
        size_t k = n - i < 16384 ? n - i : 16384;
        for (size_t j = 0; j < k; j++) {
            if (token_bytes == 2) tsr_st16(buf + 2 * j, (uint16_t)tokens[i + j]);
            else tsr_st32(buf + 4 * j, tokens[i + j]);
        }
        rc = write_all(fd, buf, k * (size_t)token_bytes);
        i += k;
    }
    if (rc == 0) rc = fsync(fd);
    int e = errno;
    if (close(fd) && rc == 0) rc = -1, e = errno;
    if (rc == 0 && rename(tmp, path)) rc = -1, e = errno;
    if (rc) {
        unlink(tmp);
        return tsr_err(err, io_code(e), "%s: write failed: %s", path, strerror(e));
    }
    return 0;
}

int tsr_tokens_header(const char *name, const uint8_t *data, uint64_t size, int *width, size_t *count,
                      tsr_error *err) {
    *width = 0, *count = 0;
    if (size < TSR_TOKENS_HEADER_BYTES)
        return tsr_err(err, TSR_ECORRUPT, "%s: truncated: %llu bytes, shorter than the %d-byte header", name,
                       (unsigned long long)size, TSR_TOKENS_HEADER_BYTES);
    const uint8_t *h = data;
    uint32_t magic = tsr_ld32(h), version = tsr_ld32(h + 4);
    int32_t n = (int32_t)tsr_ld32(h + 8);
    int w = 0;
    if (magic == TSR_TOKENS_MAGIC_U16) w = 2;
    else if (magic == TSR_TOKENS_MAGIC_U32) w = 4;
    if (!w)
        return tsr_err(err, TSR_ECORRUPT,
                       "%s: bad magic %u: not a token shard (expected %d for uint16 or %d for uint32 tokens)", name,
                       magic, TSR_TOKENS_MAGIC_U16, TSR_TOKENS_MAGIC_U32);
    if (version != (w == 2 ? TSR_TOKENS_VERSION_U16 : TSR_TOKENS_VERSION_U32))
        return tsr_err(err, TSR_EVERSION, "%s: bad version %u for magic %u (expected %d)", name, version, magic,
                       w == 2 ? TSR_TOKENS_VERSION_U16 : TSR_TOKENS_VERSION_U32);
    if (n < 0) return tsr_err(err, TSR_ECORRUPT, "%s: bad token count %d in the header", name, n);
    uint64_t want = TSR_TOKENS_HEADER_BYTES + (uint64_t)n * (uint64_t)w;
    if (size < want)
        return tsr_err(err, TSR_ECORRUPT,
                       "%s: truncated: the header says %d tokens (%llu bytes), the file has %llu bytes", name, n,
                       (unsigned long long)want, (unsigned long long)size);
    if (size > want)
        return tsr_err(err, TSR_ECORRUPT,
                       "%s: token count %d does not match the file size: %llu bytes, %llu more than %d tokens take",
                       name, n, (unsigned long long)size, (unsigned long long)(size - want), n);
    *width = w, *count = (size_t)n;
    return 0;
}

int tsr_tokens_open(const char *path, tsr_token_shard **out, tsr_error *err) {
    *out = NULL;
    uint64_t size;
    int fd = tsr_open_regular(path, &size, err);
    if (fd < 0) return fd;
    if (size < TSR_TOKENS_HEADER_BYTES) {
        close(fd);
        return tsr_err(err, TSR_ECORRUPT, "%s: truncated: %llu bytes, shorter than the %d-byte header", path,
                       (unsigned long long)size, TSR_TOKENS_HEADER_BYTES);
    }
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) return tsr_err(err, TSR_EIO, "%s: cannot map: %s", path, strerror(e));
    const uint8_t *h = map;
    int width;
    size_t count;
    int rc = tsr_tokens_header(path, h, size, &width, &count, err);
    tsr_token_shard *s = rc ? NULL : calloc(1, sizeof *s);
    char *p = s ? strdup(path) : NULL;
    if (!rc && !p) rc = tsr_err(err, TSR_ENOMEM, "%s: out of memory", path);
    if (rc) {
        free(s);
        munmap(map, (size_t)size);
        return rc;
    }
    *s = (tsr_token_shard){p, map, (size_t)size, h + TSR_TOKENS_HEADER_BYTES, count, width};
    *out = s;
    return 0;
}

size_t tsr_tokens_count(const tsr_token_shard *s) { return s->n; }
int tsr_tokens_width(const tsr_token_shard *s) { return s->width; }
const char *tsr_tokens_path(const tsr_token_shard *s) { return s->path; }

uint32_t tsr_tokens_get(const tsr_token_shard *s, size_t i) {
    return s->width == 2 ? tsr_ld16(s->tok + 2 * i) : tsr_ld32(s->tok + 4 * i);
}

int tsr_tokens_check(const tsr_token_shard *s, uint32_t vocab, tsr_error *err) {
    for (size_t i = 0; i < s->n; i++) {
        uint32_t t = tsr_tokens_get(s, i);
        if (t >= vocab)
            return tsr_err(err, TSR_ECORRUPT, "%s: token %zu is %u, outside the vocabulary of %u", s->path, i, t,
                           vocab);
    }
    return 0;
}

void tsr_tokens_close(tsr_token_shard *s) {
    if (!s) return;
    munmap((void *)s->map, s->map_len);
    free(s->path);
    free(s);
}

void tsr_byte_tokenize(const void *text, size_t len, int doc_sep, uint32_t *out) {
    const uint8_t *b = text;
    for (size_t i = 0; i < len; i++) out[i] = (int)b[i] == doc_sep ? TSR_BYTE_EOT : b[i];
}
