/* casts.c: element type conversions. */
#include "casts.h"

#include <math.h>
#include <string.h>

#include "tsr_base.h"

static uint32_t f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}
static float bits_f32(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

uint16_t tsr_f32_to_bf16(float x) {
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
float tsr_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

void tsr_bf16_round(float *out, const float *in, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = tsr_bf16_to_f32(tsr_f32_to_bf16(in[i]));
}

/* Generic: round a finite float to a format with `mbits` mantissa bits and
 * exponent bias `bias`, max biased exponent emax_biased (for finite values). */
static uint32_t round_small(float x, int ebits, int mbits, int bias, int has_inf, uint32_t maxfinite,
                            uint32_t nan) {
    uint32_t u = f32_bits(x);
    uint32_t sign = (u >> 31) << (ebits + mbits);
    float a = fabsf(x);
    if (isnan(x)) return sign | nan;
    /* smallest normal 2^(1-bias); subnormal step 2^(1-bias-mbits) */
    int e;
    float m = frexpf(a, &e); /* a = m * 2^e, m in [0.5, 1) */
    if (a == 0.0f) return sign;
    int exp_unb = e - 1; /* a = 1.xxx * 2^exp_unb */
    int min_exp = 1 - bias;
    float q; /* a in units of the lowest mantissa step */
    int step_exp = (exp_unb < min_exp ? min_exp : exp_unb) - mbits;
    q = ldexpf(a, -step_exp);
    float r = nearbyintf(q); /* ties to even under the default rounding mode */
    (void)m;
    uint32_t mant = (uint32_t)r;
    uint32_t biased;
    if (exp_unb < min_exp) {
        /* subnormal: mant < 2^mbits, or rounds up into the smallest normal */
        biased = mant >> mbits; /* 0 or 1 */
        mant &= (1u << mbits) - 1;
    } else {
        biased = (uint32_t)(exp_unb + bias);
        if (mant >> (mbits + 1)) { /* rounded up to the next binade */
            mant >>= 1;
            biased++;
        }
        mant &= (1u << mbits) - 1;
    }
    uint32_t v = biased << mbits | mant;
    if (v > maxfinite) return sign | (has_inf ? ((1u << ebits) - 1) << mbits : maxfinite);
    return sign | v;
}

uint16_t tsr_f32_to_f16(float x) {
    if (isinf(x)) return (uint16_t)(x < 0 ? 0xfc00 : 0x7c00);
    return (uint16_t)round_small(x, 5, 10, 15, 1, 0x7bff, 0x7e00);
}
float tsr_f16_to_f32(uint16_t h) {
    uint32_t s = (uint32_t)(h >> 15), e = (h >> 10) & 0x1f, m = h & 0x3ff;
    float v;
    if (e == 0) v = ldexpf((float)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexpf((float)(m | 0x400), (int)e - 25);
    return s ? -v : v;
}

uint8_t tsr_f32_to_e4m3(float x) {
    if (isinf(x)) return (uint8_t)(x < 0 ? 0xfe : 0x7e); /* saturate */
    return (uint8_t)round_small(x, 4, 3, 7, 0, 0x7e, 0x7f);
}
float tsr_e4m3_to_f32(uint8_t b) {
    uint32_t s = b >> 7, e = (b >> 3) & 0xf, m = b & 7;
    float v;
    if (e == 15 && m == 7) v = NAN;
    else if (e == 0) v = ldexpf((float)m, -9);
    else v = ldexpf((float)(m | 8), (int)e - 10);
    return s ? -v : v;
}

uint8_t tsr_f32_to_e5m2(float x) {
    if (isinf(x)) return (uint8_t)(x < 0 ? 0xfc : 0x7c);
    return (uint8_t)round_small(x, 5, 2, 15, 1, 0x7b, 0x7e);
}
float tsr_e5m2_to_f32(uint8_t b) { return tsr_f16_to_f32((uint16_t)(b << 8)); }

double tsr_load_f64(int dtype, const void *src, size_t i) {
    const uint8_t *p = (const uint8_t *)src + i * tsr_dtype_size(dtype);
    union {
        float f;
        double d;
        int8_t i8;
        int16_t i16;
        int32_t i32;
        int64_t i64;
        uint8_t u8;
        uint16_t u16;
        uint32_t u32;
        uint64_t u64;
    } v;
    memcpy(&v, p, tsr_dtype_size(dtype));
    switch (dtype) {
    case TSR_F32: return v.f;
    case TSR_F64: return v.d;
    case TSR_F16: return tsr_f16_to_f32(v.u16);
    case TSR_BF16: return tsr_bf16_to_f32(v.u16);
    case TSR_F8E4M3: return tsr_e4m3_to_f32(v.u8);
    case TSR_F8E5M2: return tsr_e5m2_to_f32(v.u8);
    case TSR_I8: return v.i8;
    case TSR_I16: return v.i16;
    case TSR_I32: return v.i32;
    case TSR_I64: return (double)v.i64;
    case TSR_U8: case TSR_BOOL: return v.u8;
    case TSR_U16: return v.u16;
    case TSR_U32: return v.u32;
    case TSR_U64: return (double)v.u64;
    default: return NAN;
    }
}

void tsr_store_from_f64(int dtype, void *dst, size_t i, double x) {
    uint8_t *p = (uint8_t *)dst + i * tsr_dtype_size(dtype);
    union {
        float f;
        double d;
        uint8_t u8;
        uint16_t u16;
        uint32_t u32;
        uint64_t u64;
    } v;
    switch (dtype) {
    case TSR_F32: v.f = (float)x; break;
    case TSR_F64: v.d = x; break;
    case TSR_F16: v.u16 = tsr_f32_to_f16((float)x); break;
    case TSR_BF16: v.u16 = tsr_f32_to_bf16((float)x); break;
    case TSR_F8E4M3: v.u8 = tsr_f32_to_e4m3((float)x); break;
    case TSR_F8E5M2: v.u8 = tsr_f32_to_e5m2((float)x); break;
    case TSR_BOOL: v.u8 = x != 0; break;
    default: {
        /* integers: truncate toward zero, wrap to the width */
        double t = trunc(x);
        int64_t s = isfinite(t) && fabs(t) < 9.2e18 ? (int64_t)t : 0;
        v.u64 = (uint64_t)s;
        if (dtype == TSR_U64 && t >= 9.2e18 && t < 1.8e19) v.u64 = (uint64_t)t;
        if (dtype == TSR_I8 || dtype == TSR_U8) v.u8 = (uint8_t)v.u64;
        if (dtype == TSR_I16 || dtype == TSR_U16) v.u16 = (uint16_t)v.u64;
        if (dtype == TSR_I32 || dtype == TSR_U32) v.u32 = (uint32_t)v.u64;
    }
    }
    memcpy(p, &v, tsr_dtype_size(dtype));
}
