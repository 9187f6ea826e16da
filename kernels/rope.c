/* rope.c: rotary position embedding, interleaved pairs (Meta's Llama 3 layout). */
#include "rope.h"
#include "common.h"

#include <math.h>
#include <stddef.h>

tsr_rope_scaling tsr_rope_llama3_scaling(void) {
    tsr_rope_scaling s = {.factor = 8.0f, .low_freq_factor = 1.0f, .high_freq_factor = 4.0f,
                          .original_max_pos = 8192};
    return s;
}

static double scaled_freq(double f, const tsr_rope_scaling *s) {
    if (!s || s->factor == 0.0f) return f;
    double orig = s->original_max_pos, lo = s->low_freq_factor, hi = s->high_freq_factor;
    double wavelen = 2.0 * M_PI / f;
    if (wavelen < orig / hi) return f;                 /* short waves: untouched */
    if (wavelen > orig / lo || hi == lo) return f / s->factor; /* long waves: stretched */
    double smooth = (orig / wavelen - lo) / (hi - lo); /* 0 at the long end, 1 at the short end */
    return (1.0 - smooth) * f / s->factor + smooth * f;
}

void tsr_rope_tables(float *cos_t, float *sin_t, int T, int hd, float theta, const tsr_rope_scaling *s) {
    int half = hd / 2;
    for (int i = 0; i < half; i++) {
        double f = scaled_freq(pow((double)theta, -2.0 * i / hd), s);
        for (int t = 0; t < T; t++) {
            double a = (double)t * f;
            cos_t[(size_t)t * half + i] = (float)cos(a);
            sin_t[(size_t)t * half + i] = (float)sin(a);
        }
    }
}

/* The pairs (v[2i], v[2i+1]) of H head vectors of hd floats rotated by the
 * angles whose cos and sin are c, sn (hd/2), times dir. Built for the widest
 * vector unit the processor has (target_clones, chosen once at load time): the
 * same float operations whatever the width (no contraction into fused
 * multiply-adds: -std=c11), so the same bits. */
TSR_WIDEST static void
rotate_heads(float *x, const float *c, const float *sn, int H, int hd, float dir) {
    int half = hd / 2;
    for (int h = 0; h < H; h++) {
        float *v = x + (size_t)h * hd;
#pragma omp simd
        for (int i = 0; i < half; i++) {
            float x0 = v[2 * i], x1 = v[2 * i + 1], si = dir * sn[i];
            v[2 * i] = x0 * c[i] - x1 * si;
            v[2 * i + 1] = x0 * si + x1 * c[i];
        }
    }
}

/* dir = +1 rotates by +angle (forward), -1 by -angle (backward). */
static void rotate(float *x, const float *cos_t, const float *sin_t, int B, int T, int H, int hd, float dir) {
    int half = hd / 2;
#pragma omp parallel for schedule(static)
    for (long bt = 0; bt < (long)B * T; bt++) {
        int t = (int)(bt % T);
        rotate_heads(x + (size_t)bt * H * hd, cos_t + (size_t)t * half, sin_t + (size_t)t * half, H, hd, dir);
    }
}

void tsr_rope_fwd(float *x, const float *cos_t, const float *sin_t, int B, int T, int H, int hd) {
    rotate(x, cos_t, sin_t, B, T, H, hd, 1.0f);
}

void tsr_rope_bwd(float *dx, const float *cos_t, const float *sin_t, int B, int T, int H, int hd) {
    rotate(dx, cos_t, sin_t, B, T, H, hd, -1.0f);
}
