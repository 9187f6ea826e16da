/* digest.c: the digest of a logical tensor (FORMAT.md section 4.4): its key
 * (XXH3-64 of its name seeded with its dtype code) xor the CRC-64 (ECMA-182,
 * reflected, initial value 0, no final xor) of its bytes in row-major order.
 * That CRC is linear: the CRC of the tensor is the xor, over any disjoint runs of
 * its bytes, of each run's CRC shifted by the bytes that follow it in the
 * tensor (times x^(8 n) modulo the polynomial), so every rank, frame or box
 * computes its share and the shares xor to the digest whatever the layout. The
 * bytes go through ISA-L's CRC-64 (folding with carry-less multiplies, the
 * widest the CPU has); the shifts are products in GF(2)[x] modulo the
 * polynomial, a few per run. */
#include <isa-l/crc64.h>
#include <pthread.h>
#include <xxhash.h>

#include "common.h"
#include "tsr_formats.h"

#define POLY 0xC96C5795D7870F42ull /* ECMA-182's polynomial, reflected */
#define ONE (1ull << 63)            /* x^0 in the reflected order (bit 63 - k holds x^k) */

uint64_t tsr_digest_key(const char *name, int dtype) {
    return XXH3_64bits_withSeed(name, strlen(name), (XXH64_hash_t)(unsigned)dtype);
}

/* The CRC of `len` bytes continued from `crc` (the CRC of what came before):
 * ISA-L's function inverts its state on entry and on return. */
static uint64_t crc_more(uint64_t crc, const void *p, uint64_t len) {
    return ~crc64_ecma_refl(~crc, p, len);
}

/* a * b modulo the polynomial, both reflected: one bit of a at a time. */
static uint64_t mulmod_bits(uint64_t a, uint64_t b) {
    uint64_t p = 0;
    for (uint64_t m = ONE; a; m >>= 1) {
        if (a & m) {
            p ^= b;
            a ^= m;
        }
        b = (b & 1) ? (b >> 1) ^ POLY : b >> 1;
    }
    return p;
}

static uint64_t crc_table[256]; /* the CRC of each byte value */
static uint64_t x2n[64];        /* x^(2^k) modulo the polynomial */
static int have_clmul;
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

#if defined(__x86_64__)
#include <smmintrin.h>
#include <wmmintrin.h>
/* The same with one carry-less multiply: the 127-bit product, shifted left by
 * one, holds in its high half the terms below x^64 and in its low half the
 * rest, which is (low half) * x^64: the CRC of the low half's 8 bytes (a byte
 * at a time: the table). */
__attribute__((target("pclmul,sse4.1"))) static uint64_t mulmod_clmul(uint64_t a, uint64_t b) {
    __m128i p = _mm_clmulepi64_si128(_mm_cvtsi64_si128((long long)a), _mm_cvtsi64_si128((long long)b), 0);
    uint64_t lo = (uint64_t)_mm_cvtsi128_si64(p), hi = (uint64_t)_mm_extract_epi64(p, 1);
    hi = hi << 1 | lo >> 63;
    lo <<= 1;
    for (int k = 0; k < 8; k++) lo = crc_table[lo & 0xff] ^ (lo >> 8);
    return hi ^ lo;
}
#endif

static uint64_t mulmod(uint64_t a, uint64_t b) {
#if defined(__x86_64__)
    if (have_clmul) return mulmod_clmul(a, b);
#endif
    return mulmod_bits(a, b);
}

static void tables_init(void) {
    for (uint64_t v = 0; v < 256; v++) {
        uint64_t c = v;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ POLY : c >> 1;
        crc_table[v] = c;
    }
    x2n[0] = ONE >> 1; /* x^1 */
    for (int k = 1; k < 64; k++) x2n[k] = mulmod_bits(x2n[k - 1], x2n[k - 1]);
#if defined(__x86_64__)
    /* the carry-less product where the CPU has it, once it gives the squares
     * just made one bit at a time (so both ways run wherever a digest is taken) */
    __builtin_cpu_init();
    int ok = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
    for (int k = 1; ok && k < 64; k++) ok = mulmod_clmul(x2n[k - 1], x2n[k - 1]) == x2n[k];
    have_clmul = ok;
#endif
}

/* x^(8 n) modulo the polynomial: the shift past n zero bytes. */
static uint64_t shift_of(uint64_t n) {
    uint64_t p = ONE;
    for (int k = 3; n; n >>= 1, k++)
        if (n & 1) p = mulmod(x2n[k & 63], p);
    return p;
}

uint64_t tsr_digest_run(size_t elem_size, uint64_t volume, uint64_t first, const void *data, uint64_t n) {
    if (n == 0) return 0;
    pthread_once(&tables_once, tables_init);
    uint64_t crc = crc_more(0, data, n * elem_size);
    uint64_t after = volume - first - n;
    return after ? mulmod(crc, shift_of(after * elem_size)) : crc;
}

uint64_t tsr_digest_tensor(uint64_t key, size_t elem_size, const void *data, uint64_t volume) {
    return key ^ crc_more(0, data, volume * elem_size);
}

void tsr_digest_acc_init(tsr_digest_acc *a) {
    a->crc = a->end = a->gap = 0;
    a->gap_shift = ONE;
    a->started = a->gap_uses = 0;
}

/* The product by a constant s by tables (linear in the other factor: each of
 * its 16 nibbles looks its product with s up), made from 64 products. */
#define TABLE_AFTER 32 /* uses of one gap after which its table is made */
static void mul_table_make(uint64_t t[16][16], uint64_t s) {
    for (int j = 0; j < 16; j++) {
        t[j][0] = 0;
        for (int b = 0; b < 4; b++) t[j][1 << b] = mulmod((uint64_t)1 << (4 * j + b), s);
        for (int v = 3; v < 16; v++)
            if (v & (v - 1)) t[j][v] = t[j][v & (v - 1)] ^ t[j][v & -v];
    }
}

static uint64_t mul_table(const uint64_t t[16][16], uint64_t a) {
    uint64_t p = 0;
    for (int j = 0; j < 16; j++) p ^= t[j][(a >> (4 * j)) & 15];
    return p;
}

/* The next run: n bytes at p, starting g bytes into the tensor (at or after the
 * end of the last), continued from the CRC so far shifted past the gap between
 * them: mostly the same gap (the rows of a block of columns), its shift kept,
 * and once it has served TABLE_AFTER runs, its tables. */
static void acc_run(tsr_digest_acc *a, uint64_t g, const uint8_t *p, uint64_t n) {
    if (a->started && g > a->end) {
        if (g - a->end != a->gap) a->gap = g - a->end, a->gap_shift = shift_of(a->gap), a->gap_uses = 0;
        if (++a->gap_uses == TABLE_AFTER) mul_table_make(a->gap_table, a->gap_shift);
        a->crc = a->gap_uses >= TABLE_AFTER ? mul_table(a->gap_table, a->crc) : mulmod(a->crc, a->gap_shift);
    }
    a->crc = crc_more(a->crc, p, n);
    a->end = g + n;
    a->started = 1;
}

uint64_t tsr_digest_acc_share(const tsr_digest_acc *a, size_t elem_size, uint64_t volume) {
    if (!a->started) return 0;
    pthread_once(&tables_once, tables_init);
    uint64_t bytes = volume * elem_size;
    return a->end < bytes ? mulmod(a->crc, shift_of(bytes - a->end)) : a->crc;
}

uint64_t tsr_digest_region(size_t elem_size, const uint64_t *shape, const tsr_box *mem_box, const void *data,
                           const tsr_box *region) {
    tsr_digest_acc a;
    tsr_digest_acc_init(&a);
    tsr_digest_acc_region(&a, elem_size, shape, mem_box, data, region);
    uint64_t volume = 1;
    for (uint32_t d = 0; d < region->ndim; d++) volume *= shape[d];
    return tsr_digest_acc_share(&a, elem_size, volume);
}

void tsr_digest_acc_region(tsr_digest_acc *a, size_t elem_size, const uint64_t *shape, const tsr_box *mem_box,
                           const void *data, const tsr_box *region) {
    uint32_t n = region->ndim;
    pthread_once(&tables_once, tables_init);
    if (n == 0) {
        acc_run(a, 0, data, elem_size);
        return;
    }
    if (tsr_box_volume(region) == 0) return;
    /* runs of consecutive global indices: dims c.. where every dim after c is
     * whole in the region, so in mem_box too (then also consecutive in its
     * memory); st[d], ms[d]: the tensor's and the memory's stride of dim d */
    uint64_t st[TSR_MAX_DIMS], ms[TSR_MAX_DIMS];
    st[n - 1] = ms[n - 1] = 1;
    for (uint32_t d = n - 1; d > 0; d--) st[d - 1] = st[d] * shape[d], ms[d - 1] = ms[d] * mem_box->extent[d];
    uint32_t c = n - 1;
    while (c > 0 && region->extent[c] == shape[c]) c--;
    uint64_t run = region->extent[c] * st[c];
    uint64_t i[TSR_MAX_DIMS] = {0}; /* the index in dims < c, relative to the region */
    const uint8_t *p = data;
    /* the runs in increasing global order */
    for (;;) {
        uint64_t g = region->offset[c] * st[c], m = (region->offset[c] - mem_box->offset[c]) * ms[c];
        for (uint32_t d = 0; d < c; d++) {
            g += (region->offset[d] + i[d]) * st[d];
            m += (region->offset[d] - mem_box->offset[d] + i[d]) * ms[d];
        }
        acc_run(a, g * elem_size, p + m * elem_size, run * elem_size);
        uint32_t d = c;
        while (d > 0 && ++i[d - 1] == region->extent[d - 1]) i[--d] = 0;
        if (d == 0) break;
    }
}

uint64_t tsr_digest_box(size_t elem_size, const uint64_t *shape, const tsr_box *box, const void *data) {
    return tsr_digest_region(elem_size, shape, box, data, box);
}
