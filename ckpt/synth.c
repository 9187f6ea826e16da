/* synth.c: the synthetic checkpoint content (tessera.h, "synthetic"): a pure
 * function of tensor name and global element index, so that any rank can check any
 * box of a loaded tensor without the original. */
#include <string.h>

#include "casts.h"
#include "common.h"
#include "tsr_ckpt.h"

/* Irwin-Hall sum of four 16-bit uniforms: mean 0, unit variance, Gaussian-like. */
static inline float gaussish(uint64_t h) {
    float s = (float)(h & 0xffff) + (float)((h >> 16) & 0xffff) + (float)((h >> 32) & 0xffff) +
              (float)(h >> 48);
    /* each uniform on [0, 65535]: mean 32767.5, variance 65536^2/12 */
    return (s - 131070.0f) * (1.0f / 37837.23f);
}

static void synth_elem(int dtype, uint64_t seed, uint64_t idx, uint8_t *out) {
    uint64_t h = tsr_splitmix64(seed ^ tsr_splitmix64(idx));
    float g = 0.02f * gaussish(h);
    switch (dtype) {
    case TSR_F32: memcpy(out, &g, 4); break;
    case TSR_F64: {
        double d = 0.02 * (double)gaussish(h) + (double)(tsr_splitmix64(h) >> 40) * 1e-19;
        memcpy(out, &d, 8);
        break;
    }
    case TSR_BF16: { uint16_t v = tsr_f32_to_bf16(g); memcpy(out, &v, 2); break; }
    case TSR_F16: { uint16_t v = tsr_f32_to_f16(g); memcpy(out, &v, 2); break; }
    case TSR_F8E4M3: out[0] = tsr_f32_to_e4m3(g * 50.0f); break;
    case TSR_F8E5M2: out[0] = tsr_f32_to_e5m2(g * 50.0f); break;
    case TSR_BOOL: out[0] = (uint8_t)(h & 1); break;
    default: {
        size_t n = tsr_dtype_size(dtype);
        for (size_t i = 0; i < n; i++) out[i] = (uint8_t)(h >> (8 * i));
    }
    }
}

/* Walks the box row-major, calling fn for each element with its global flat index. */
static uint64_t flat_index(uint32_t ndim, const uint64_t *shape, const uint64_t *idx) {
    uint64_t f = 0;
    for (uint32_t d = 0; d < ndim; d++) f = f * shape[d] + idx[d];
    return f;
}

void tsr_synth_fill(const char *name, int dtype, uint32_t ndim, const uint64_t *shape,
                    const tsr_box *box, void *dst) {
    size_t es = tsr_dtype_size(dtype);
    uint64_t seed = tsr_hash(name, strlen(name));
    uint64_t n = tsr_box_volume(box);
    if (n == 0) return;
    uint64_t idx[TSR_MAX_DIMS];
    for (uint32_t d = 0; d < ndim; d++) idx[d] = box->offset[d];
    uint8_t *out = dst;
    /* the innermost dim is contiguous in both the box and the global index */
    uint64_t inner = ndim ? box->extent[ndim - 1] : 1;
    for (uint64_t done = 0; done < n; done += inner) {
        uint64_t base = flat_index(ndim, shape, idx);
        for (uint64_t i = 0; i < inner; i++) synth_elem(dtype, seed, base + i, out + (done + i) * es);
        int d = (int)ndim - 2;
        for (; d >= 0; d--) {
            if (++idx[d] < box->offset[d] + box->extent[d]) break;
            idx[d] = box->offset[d];
        }
    }
}

int tsr_synth_check(const char *name, int dtype, uint32_t ndim, const uint64_t *shape,
                    const tsr_box *box, const void *data, uint64_t *bad_index) {
    size_t es = tsr_dtype_size(dtype);
    uint64_t seed = tsr_hash(name, strlen(name));
    uint64_t n = tsr_box_volume(box);
    if (n == 0) return 0;
    uint64_t idx[TSR_MAX_DIMS];
    for (uint32_t d = 0; d < ndim; d++) idx[d] = box->offset[d];
    const uint8_t *in = data;
    uint64_t inner = ndim ? box->extent[ndim - 1] : 1;
    uint8_t want[8];
    for (uint64_t done = 0; done < n; done += inner) {
        uint64_t base = flat_index(ndim, shape, idx);
        for (uint64_t i = 0; i < inner; i++) {
            synth_elem(dtype, seed, base + i, want);
            if (memcmp(want, in + (done + i) * es, es) != 0) {
                if (bad_index) {
                    for (uint32_t d = 0; d < ndim; d++) bad_index[d] = idx[d];
                    if (ndim) bad_index[ndim - 1] += i;
                }
                return 1;
            }
        }
        int d = (int)ndim - 2;
        for (; d >= 0; d--) {
            if (++idx[d] < box->offset[d] + box->extent[d]) break;
            idx[d] = box->offset[d];
        }
    }
    return 0;
}
