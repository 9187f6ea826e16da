/* model.h: the Llama 3 style decoder of the trainer: its named shapes, its
 * parameters as global tensors with their placement on the mesh, and their
 * initialization.
 *
 * Parameters (TorchTitan's names; W are nn.Linear weights, (out, in)):
 *   tok_embeddings.weight              (V, C)        stage 0, replicated over tp
 *   layers.L.attention_norm.weight     (C)           replicated over tp
 *   layers.L.attention.wq.weight       (NH*hd, C)    tp by rows (heads split)
 *   layers.L.attention.wk.weight       (NKV*hd, C)   tp by rows
 *   layers.L.attention.wv.weight       (NKV*hd, C)   tp by rows
 *   layers.L.attention.wo.weight       (C, NH*hd)    tp by columns
 *   layers.L.ffn_norm.weight           (C)           replicated over tp
 *   layers.L.feed_forward.w1.weight    (F, C)        tp by rows
 *   layers.L.feed_forward.w2.weight    (C, F)        tp by columns
 *   layers.L.feed_forward.w3.weight    (F, C)        tp by rows
 *   norm.weight                        (C)           last stage
 *   output.weight                      (V, C)        last stage, replicated over tp
 * Every parameter is FSDP-sharded on dim 0 of its TP-local piece. Optimizer
 * moments are tensors of the same shapes and placement named
 * "optim.exp_avg.<param>" and "optim.exp_avg_sq.<param>" (group "optim").
 */
#ifndef TSR_MODEL_H
#define TSR_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "rope.h"
#include "tsr_ckpt.h"

typedef struct tsr_model_args {
    char flavor[16];
    int dim;          /* C */
    int n_layers;
    int n_heads;      /* NH */
    int n_kv_heads;   /* NKV, divides NH */
    int ffn_dim;      /* F, SwiGLU hidden size */
    int vocab_size;   /* V */
    float norm_eps;
    float rope_theta;
    tsr_rope_scaling rope_scaling; /* factor 0: none */
    int max_seq_len;  /* the context length: the most positions the model is meant
                         for (not a shape: jobs of other lengths may resume it) */
} tsr_model_args;

/* The context length of a model whose description does not give one (a
 * checkpoint written before the field existed, a Hugging Face config.json
 * without max_position_embeddings): 2048, Hugging Face LlamaConfig's default and
 * the trainer's default training.seq_len. */
#define TSR_MODEL_DEFAULT_MAX_SEQ_LEN 2048

/* Parameters of one layer, in this order; n_layers * TSR_LAYER_PARAMS of them
 * follow the embedding, then norm.weight and output.weight. */
enum {
    TSR_P_ATTN_NORM, TSR_P_WQ, TSR_P_WK, TSR_P_WV, TSR_P_WO,
    TSR_P_FFN_NORM, TSR_P_W1, TSR_P_W2, TSR_P_W3, TSR_LAYER_PARAMS
};

/* tsr_model_args_get(): the named shapes "debug" (about 1M parameters), "small"
 * (about 10M), "124m" (GPT-2 124M's shapes: 12 layers, 768 wide, 12 heads,
 * vocabulary 50304), "1b" (Llama 3.2 1B), "8b" (Llama 3.1 8B) and "405b" (Llama 3.1 405B), with
 * max_seq_len TSR_MODEL_DEFAULT_MAX_SEQ_LEN (the trainer sets its training.seq_len). */
int tsr_model_args_get(const char *flavor, tsr_model_args *a, tsr_error *err);
/* tsr_model_flavor_of(): the name of the named shapes equal to a (whatever
 * a->flavor says), or NULL. */
const char *tsr_model_flavor_of(const tsr_model_args *a);
static inline int tsr_model_head_dim(const tsr_model_args *a) { return a->dim / a->n_heads; }

/* The parameters as global tensors (model group) followed by the optimizer's
 * (optim group): 3 * tsr_model_n_params(a) declarations. */
typedef struct tsr_model_decls {
    size_t n_params;         /* parameters; decls holds 3 * n_params */
    tsr_tensor_decl *decls;
    char *names;             /* the names' storage */
} tsr_model_decls;
static inline size_t tsr_model_n_params(const tsr_model_args *a) {
    return (size_t)a->n_layers * TSR_LAYER_PARAMS + 3;
}
int tsr_model_decls_make(const tsr_model_args *a, tsr_model_decls *d, tsr_error *err);
void tsr_model_decls_free(tsr_model_decls *d);
/* tsr_model_param_index(): index of layer L's parameter p (TSR_P_*); the
 * embedding is 0, norm.weight n-2, output.weight n-1. */
static inline size_t tsr_model_param_index(int layer, int p) {
    return 1 + (size_t)layer * TSR_LAYER_PARAMS + (size_t)p;
}
/* tsr_model_param_count(): the number of parameter elements. */
uint64_t tsr_model_param_count(const tsr_model_args *a);

/* tsr_model_init_box(): fills `dst` (the memory of `box` of parameter `p`) with
 * its initial values: each element a function of (seed, name, global index)
 * only, so that every layout starts from the same weights. Norm weights are 1;
 * the embedding N(0, 1); output N(0, 1/C); wq, wk, wv, w1 N(0, 0.02^2); wo, w2,
 * w3 N(0, (0.02 / sqrt(2 (L + 1)))^2) (TorchTitan's depth-scaled init). */
void tsr_model_init_box(const tsr_model_args *a, const tsr_model_decls *d, size_t p,
                        const tsr_box *box, float *dst, uint64_t seed);

/* tsr_model_args_to_text() / tsr_model_args_from_text(): the shapes as one
 * line "flavor=debug dim=128 ... rope_orig=0 max_seq_len=64" (the train.model
 * blob of a checkpoint, so that a checkpoint of another shape is refused with a
 * message that says which key differs). tsr_model_args_compare() ignores
 * max_seq_len, which is not a shape. */
void tsr_model_args_to_text(const tsr_model_args *a, char *buf, size_t len);
int tsr_model_args_compare(const tsr_model_args *a, const char *text, char *why, size_t why_len);
/* tsr_model_args_parse(): the shapes from that text (the train.model blob of a
 * checkpoint); every key must be present and sane, else an error naming it,
 * except max_seq_len: a text without it (written before it existed) reads as
 * TSR_MODEL_DEFAULT_MAX_SEQ_LEN. */
int tsr_model_args_parse(const char *text, tsr_model_args *a, tsr_error *err);

/* tsr_model_args_from_ckpt(): the shapes of the model in a checkpoint (its
 * train.model blob); an error says when it has none. */
int tsr_model_args_from_ckpt(tsr_ckpt *ck, tsr_model_args *a, tsr_error *err);
/* tsr_model_find(): the index of the checkpoint's tensor named like t, with its
 * info in *ti; or a negative status when it is missing, of another shape, or not
 * floating (the error names it). */
long tsr_model_find(tsr_ckpt *ck, const tsr_tensor_decl *t, tsr_tensor_info *ti, tsr_error *err);
/* tsr_model_read_f32(): the elements of `box` of the checkpoint's tensor named
 * like t, converted to f32 into dst; an error when it is missing or its shape
 * differs from t's, or it is not floating. */
int tsr_model_read_f32(tsr_ckpt *ck, const tsr_tensor_decl *t, const tsr_box *box, float *dst, tsr_error *err);

#endif
