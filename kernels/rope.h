/* rope.h: rotary position embedding in the convention of Meta's Llama 3 reference:
 * the pairs (x[2i], x[2i+1]) of each head vector are rotated by the angle
 * pos * freq[i] (the last dim viewed as hd/2 complex numbers, as
 * torch.view_as_complex on (..., hd/2, 2)). This is NOT Hugging Face's
 * rotate_half layout, which pairs x[i] with x[i + hd/2]; converting weights
 * between the two permutes the rows of wq and wk.
 * float32, row-major; CUDA twin later. */
#ifndef TSR_ROPE_H
#define TSR_ROPE_H

typedef struct tsr_rope_scaling { /* Llama 3.1 frequency scaling; factor 0 = off */
    float factor, low_freq_factor, high_freq_factor;
    int original_max_pos;
} tsr_rope_scaling;

/* The scaling of Llama 3.1 and later: factor 8, low 1, high 4, original 8192. */
tsr_rope_scaling tsr_rope_llama3_scaling(void);

/* freq[i] = theta^(-2i/hd) for i < hd/2, then scaled as Llama 3.1's apply_scaling
 * when s is non-NULL and s->factor != 0: wavelengths 2 pi / freq shorter than
 * original_max_pos / high_freq_factor keep their frequency, those longer than
 * original_max_pos / low_freq_factor are divided by factor, and those between are
 * blended linearly in original_max_pos / wavelength. Computed in double.
 * cos_t, sin_t (T, hd/2) = cos, sin of pos * freq[i] for positions 0..T-1. */
void tsr_rope_tables(float *cos_t, float *sin_t, int T, int hd, float theta, const tsr_rope_scaling *s);

/* x (B,T,H,hd) rotated in place: position t uses row t of the tables. hd is even
 * (an odd last element would be left as it is). */
void tsr_rope_fwd(float *x, const float *cos_t, const float *sin_t, int B, int T, int H, int hd);
/* dx (B,T,H,hd) rotated back in place: the gradient of a rotation is its inverse.
 * Unlike the other backward functions this transforms dx, it does not add. */
void tsr_rope_bwd(float *dx, const float *cos_t, const float *sin_t, int B, int T, int H, int hd);

#endif
