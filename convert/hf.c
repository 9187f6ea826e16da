/* hf.c: Hugging Face's Llama names and rotary convention. */
#include "hf.h"

#include <stdio.h>
#include <string.h>

/* The Hugging Face name of parameter p; *heads: the head count of a q or k
 * weight to permute (0: none). */
void tsr_hf_name(const tsr_model_args *a, size_t p, size_t np, char *out, size_t len, int *heads) {
    static const char *const layer[TSR_LAYER_PARAMS] = {
        "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
        "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
        "mlp.gate_proj.weight", "mlp.down_proj.weight", "mlp.up_proj.weight"};
    *heads = 0;
    if (p == 0) snprintf(out, len, "model.embed_tokens.weight");
    else if (p == np - 2) snprintf(out, len, "model.norm.weight");
    else if (p == np - 1) snprintf(out, len, "lm_head.weight");
    else {
        int k = (int)((p - 1) % TSR_LAYER_PARAMS);
        snprintf(out, len, "model.layers.%d.%s", (int)((p - 1) / TSR_LAYER_PARAMS), layer[k]);
        if (k == TSR_P_WQ) *heads = a->n_heads;
        if (k == TSR_P_WK) *heads = a->n_kv_heads;
    }
}

void tsr_hf_permute(const float *w, float *out, int heads, int hd, uint64_t cols, int inverse) {
    for (int h = 0; h < heads; h++)
        for (int i = 0; i < hd / 2; i++)
            for (int j = 0; j < 2; j++) {
                size_t meta = (size_t)h * hd + 2 * (size_t)i + (size_t)j, hf = (size_t)h * hd + (size_t)j * (hd / 2) + (size_t)i;
                memcpy(out + (inverse ? meta : hf) * cols, w + (inverse ? hf : meta) * cols, cols * sizeof *w);
            }
}

