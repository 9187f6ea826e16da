/* activation.h: SwiGLU, out = silu(gate) * up with silu(x) = x * sigmoid(x).
 * Elementwise over n floats; CUDA twin later. Backward adds into its gradients
 * (+=); a NULL gradient is skipped. */
#ifndef TSR_ACTIVATION_H
#define TSR_ACTIVATION_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* out (n) = silu(gate) * up; out may alias gate or up. */
void tsr_swiglu_fwd(float *out, const float *gate, const float *up, size_t n);
/* dgate (n) += dout * up * silu'(gate); dup (n) += dout * silu(gate). */
void tsr_swiglu_bwd(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n);

/* Elementwise math shared by the CPU kernels (activation, attention, loss):
 * host code only, no CUDA twin. */

/* tsr_exp(): e^x in float32 within 1e-7 relative (about 1 ulp), as a static
 * inline function that GCC vectorizes under `#pragma omp simd` (glibc's expf is
 * a call, so a loop around it runs one element at a time). The CPU softmaxes
 * and sigmoids use it. x >= 88.4 gives +inf and x <= -87.7 gives 0 (no
 * subnormals), for any such x up to +-inf; NaN gives NaN.
 * Method: |x| is first clamped to 100 (on the bits, so that the clamp is
 * integer, keeps NaN and vectorizes); then x = n ln2 + r with n = round(x/ln2)
 * and |r| <= ln2/2; e^r by its Taylor series to r^7 (truncation under 6e-9
 * relative); and 2^n written into the exponent bits, with n clamped to
 * [-127, 128] so that it gives 0 or infinity at the ends. */
static inline float tsr_exp(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    uint32_t mag = u & 0x7fffffffu, big = (mag > 0x42c80000u) & (mag <= 0x7f800000u); /* 100 < |x| <= inf */
    u = big ? (u & 0x80000000u) | 0x42c80000u : u;                                    /* +-100 */
    memcpy(&x, &u, sizeof x);
    const float round_magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float t = x * 1.44269504f + round_magic; /* the low mantissa bits of t hold n */
    float n = t - round_magic;
    float r = x - n * 0.693145752f; /* ln2 in two parts, so that n * ln2_hi is exact */
    r = r - n * 1.42860677e-6f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 +
                                                      r * (1.0f / 720 + r * (1.0f / 5040)))))));
    int32_t e;
    memcpy(&e, &t, sizeof e);
    e -= 0x4B400000;         /* the bits of round_magic: leaves n, within +-145 */
    e = e < -127 ? -127 : e; /* biased exponent 0: 2^n becomes 0 */
    e = e > 128 ? 128 : e;   /* biased exponent 255: infinity */
    uint32_t bits = (uint32_t)(e + 127) << 23;
    float s;
    memcpy(&s, &bits, sizeof s);
    return p * s;
}

/* tsr_rowmax(): the largest of x[0..n-1] (-inf for n = 0; NaNs are passed over,
 * they reach the caller's sum of exps instead). Eight running maxima that GCC
 * keeps in two vector registers: `omp simd reduction(max)` at -O2 keeps its
 * maximum in memory and runs ten times slower. */
static inline float tsr_rowmax(const float *x, int n) {
    float m[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int j = 0;
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; l++) m[l] = x[j + l] > m[l] ? x[j + l] : m[l];
    for (; j < n; j++) m[0] = x[j] > m[0] ? x[j] : m[0];
    float mx = m[0];
    for (int l = 1; l < 8; l++) mx = m[l] > mx ? m[l] : mx;
    return mx;
}

#endif
