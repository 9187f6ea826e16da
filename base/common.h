/* common.h: small internal helpers shared by every part of libtessera. Not installed. */
#ifndef TSR_COMMON_H
#define TSR_COMMON_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tsr_base.h"

/* tsr_err(): sets err (if non-NULL) to `code` and a printf-style message.
 * @return code, so that callers can write `return tsr_err(err, TSR_EIO, ...)`. */
int tsr_err(tsr_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* tsr_err_prefix(): prepends "prefix: " to err->msg (keeps the code). */
void tsr_err_prefix(tsr_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* tsr_log(): sends a message to the logging hook, if one is set. */
void tsr_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* tsr_hash(): the checksum of the format: XXH3-64 with seed 0. */
uint64_t tsr_hash(const void *data, size_t len);

static inline uint64_t tsr_align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* Overflow-checked arithmetic: return 1 on overflow. */
static inline int tsr_mul_ovf(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_mul_overflow(a, b, out);
}
static inline int tsr_add_ovf(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_add_overflow(a, b, out);
}

/* Little-endian loads and stores (the format is little-endian). */
static inline uint16_t tsr_ld16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t tsr_ld32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t tsr_ld64(const uint8_t *p) {
    return (uint64_t)tsr_ld32(p) | (uint64_t)tsr_ld32(p + 4) << 32;
}
static inline void tsr_st16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline void tsr_st32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void tsr_st64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
/* An f64's bits and back (stored as a u64, little-endian: FORMAT.md 4.5). */
static inline uint64_t tsr_f64_bits(double x) {
    uint64_t v;
    memcpy(&v, &x, 8);
    return v;
}
static inline double tsr_f64_of_bits(uint64_t v) {
    double x;
    memcpy(&x, &v, 8);
    return x;
}

/* tsr_mix64(): splitmix64's output function, a bijection of 64-bit words in
 * which every output bit depends on every input bit. */
static inline uint64_t tsr_mix64(uint64_t x) {
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
/* splitmix64's step between states: 2^64 over the golden ratio, odd. */
#define TSR_GOLDEN64 0x9e3779b97f4a7c15ull
/* tsr_splitmix64(): what a splitmix64 generator whose state is x gives next: a
 * hash of x that is cheap and good enough for synthetic data and initial weights. */
static inline uint64_t tsr_splitmix64(uint64_t x) { return tsr_mix64(x + TSR_GOLDEN64); }
/* tsr_splitmix_next(): the next number of the splitmix64 generator *state. */
static inline uint64_t tsr_splitmix_next(uint64_t *state) { return tsr_mix64(*state += TSR_GOLDEN64); }

/* tsr_sort(): qsort that accepts an empty (possibly NULL) array. */
static inline void tsr_sort(void *base, size_t n, size_t size, int (*cmp)(const void *, const void *)) {
    if (n > 1) qsort(base, n, size, cmp);
}

/* tsr_sort_ctx(): the same sort for a comparator that needs more than the two
 * elements (a table they index, say): cmp gets ctx as its third argument. */
static inline void tsr_sort_ctx(void *base, size_t n, size_t size,
                                int (*cmp)(const void *, const void *, void *), void *ctx) {
    if (n > 1) qsort_r(base, n, size, cmp, ctx);
}

/* tsr_grow(): makes room for one more element in a growable array: when n has
 * reached *cap, doubles the capacity (from 16) with realloc. *arr and *cap are
 * left unchanged on failure. @return 0, or TSR_ENOMEM (also when the new size in
 * bytes would not fit in a size_t). */
int tsr_grow(void **arr, size_t *cap, size_t n, size_t elem);

/* A growable string, and the one growable byte buffer: tsr_sb_printf and
 * tsr_sb_put (k bytes, any) append, and p stays NUL-terminated; after a failed
 * allocation oom is set and later calls do nothing. tsr_sb_reserve(): room for
 * k more bytes after n (and the NUL), for a caller that writes them itself;
 * @return 0 or TSR_ENOMEM. free(p) when done. */
typedef struct tsr_sbuf {
    char *p;
    size_t n, cap;
    int oom;
} tsr_sbuf;
void tsr_sb_printf(tsr_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void tsr_sb_put(tsr_sbuf *b, const void *s, size_t k);
int tsr_sb_reserve(tsr_sbuf *b, size_t k);

/* tsr_parse_size(): "256M", "4k", "1G", "123" (powers of 1024; an optional "B"
 * or "iB") into *out. @return 0, or -1 if the text is not a size. */
int tsr_parse_size(const char *s, uint64_t *out);
/* tsr_parse_u64(): a plain decimal number. @return 0 or -1. */
int tsr_parse_u64(const char *s, uint64_t *out);

/* tsr_now(): seconds on the monotonic clock. */
double tsr_now(void);

/* tsr_remove_tree(): rm -r of a directory that tessera made itself (best effort). */
void tsr_remove_tree(const char *dir);
/* tsr_mkdir_p(): creates a directory and its missing parents (mode 0755).
 * @return 0, or the errno of the first mkdir that failed. */
int tsr_mkdir_p(const char *path);
/* tsr_rename_new(): renames `from` to `to` only where `to` does not exist
 * (renameat2's RENAME_NOREPLACE; link() and unlink() where the filesystem lacks
 * it): a name that exists is never replaced. @return 0, or the errno (EEXIST:
 * `to` exists; nothing moved). */
int tsr_rename_new(const char *from, const char *to);
/* tsr_path_base(): the last component of path, trailing slashes dropped
 * ("a/b/" -> "b"), into buf. @return buf. */
const char *tsr_path_base(const char *path, char *buf, size_t len);

/* tsr_open_regular(): opens path for reading, refusing without blocking anything
 * that is not a regular file: a FIFO (whose open would wait for a writer
 * forever), a directory, a device or a socket. It opens with O_NONBLOCK, checks
 * with fstat, then clears the flag. *size (if non-NULL) gets the file's size.
 * @return the descriptor, or TSR_ENOTFOUND ("PATH: missing"), TSR_EIO ("PATH: not
 * a regular file (a FIFO)", or the system's reason) with err set. */
int tsr_open_regular(const char *path, uint64_t *size, tsr_error *err);
/* tsr_pread_all() / tsr_pwrite_all(): all len bytes at off of fd (the file
 * `path`, for messages), through interruptions and short transfers.
 * @return 0; TSR_ECORRUPT when the file ends first ("unexpected end of file at
 * N (truncated)"); TSR_ENOSPC for a full disk or a write that makes no
 * progress; TSR_EIO with the system's reason otherwise. */
int tsr_pread_all(int fd, const char *path, void *buf, size_t len, uint64_t off, tsr_error *err);
int tsr_pwrite_all(int fd, const char *path, const void *buf, size_t len, uint64_t off, tsr_error *err);
/* tsr_fsync_dir(): fsync of the directory dir, which makes a creation or rename
 * in it durable; `what` (may be NULL) names that for the message. @return 0, or
 * TSR_EIO "DIR: fsync of the directory after WHAT: reason". */
int tsr_fsync_dir(const char *dir, const char *what, tsr_error *err);

/* Aligned allocation (TSR_ALIGN) for O_DIRECT buffers; free with free(). */
void *tsr_alloc_aligned(size_t size);

/* Functions built for each x86-64 vector width and chosen once at load time
 * (target_clones): TSR_WIDEST for float loops (AVX-512F, AVX2 without FMA,
 * the baseline: the same roundings at every width), TSR_WIDEST_INT for integer
 * loops (x86-64-v4 and v3, for their 64-bit multiplies). Plain off x86-64 and
 * under AddressSanitizer (clang's has no ifunc resolvers). */
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TSR_NO_CLONES
#endif
#endif
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(TSR_NO_CLONES)
#define TSR_WIDEST __attribute__((target_clones("avx512f", "avx2", "default")))
#define TSR_WIDEST_INT __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TSR_WIDEST
#define TSR_WIDEST_INT
#endif

#endif
