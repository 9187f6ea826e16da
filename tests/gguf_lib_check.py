"""A GGUF export read back by the gguf library (gguf-py, llama.cpp's own Python
package: GGUFReader), against the checkpoint it came from (read with the Python
package python/tessera):
  - every tensor of the model is there and nothing else (rope_freqs where the
    checkpoint has rope scaling), each with the checkpoint's shape (GGUF lists
    dims innermost first), the asked type, and exactly the checkpoint's bytes in
    that type (f32 as stored; bf16 and f16 rounded to nearest even; norms stay f32);
  - every metadata key that llama.cpp reads for a Llama model is present with
    the type llama.cpp asks for, and the sizes it gives agree with the tensors.

usage: gguf_lib_check.py FILE.gguf CKPT f32|bf16|f16
Prints what it checked; exits 1 naming the first key or tensor that differs."""
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType

import tessera

U32, I32, F32, BOOL, STR, ARR = (GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.FLOAT32,
                                GGUFValueType.BOOL, GGUFValueType.STRING, GGUFValueType.ARRAY)
# the keys llama.cpp's loader reads for architecture "llama" with a byte-level
# BPE vocabulary (llama-model.cpp, llama-vocab.cpp), with their types; arrays as
# [ARRAY, element type]
KEYS = {
    "general.architecture": [STR], "general.alignment": [U32], "general.file_type": [U32],
    "llama.context_length": [U32], "llama.embedding_length": [U32], "llama.block_count": [U32],
    "llama.feed_forward_length": [U32], "llama.attention.head_count": [U32],
    "llama.attention.head_count_kv": [U32], "llama.rope.freq_base": [F32],
    "llama.rope.dimension_count": [U32], "llama.attention.layer_norm_rms_epsilon": [F32],
    "llama.vocab_size": [U32],
    "tokenizer.ggml.model": [STR], "tokenizer.ggml.pre": [STR], "tokenizer.ggml.tokens": [ARR, STR],
    "tokenizer.ggml.token_type": [ARR, I32], "tokenizer.ggml.merges": [ARR, STR],
    "tokenizer.ggml.eos_token_id": [U32], "tokenizer.ggml.bos_token_id": [U32],
    "tokenizer.ggml.add_bos_token": [BOOL], "tokenizer.ggml.add_eos_token": [BOOL],
}
GGUF_NAMES = {"attn_norm": "attention_norm", "attn_q": "attention.wq", "attn_k": "attention.wk",
              "attn_v": "attention.wv", "attn_output": "attention.wo", "ffn_norm": "ffn_norm",
              "ffn_gate": "feed_forward.w1", "ffn_down": "feed_forward.w2", "ffn_up": "feed_forward.w3"}
TYPES = {"f32": GGMLQuantizationType.F32, "bf16": GGMLQuantizationType.BF16, "f16": GGMLQuantizationType.F16}


def ckpt_name(name):
    """The checkpoint's (TorchTitan's) name of a GGUF tensor name."""
    top = {"token_embd.weight": "tok_embeddings.weight", "output_norm.weight": "norm.weight",
           "output.weight": "output.weight"}
    if name in top:
        return top[name]
    blk, layer, part, _ = name.split(".")
    assert blk == "blk" and part in GGUF_NAMES, "unexpected tensor %s" % name
    return "layers.%s.%s.weight" % (layer, GGUF_NAMES[part])


def as_type(w, want):
    """The checkpoint's tensor w (float32) in GGUF type want, as bytes."""
    if want == "f32":
        return w.astype("<f4").tobytes()
    if want == "f16":
        return w.astype("<f2").tobytes()
    bits = w.astype("<f4").view("<u4").astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2").tobytes()


def main():
    path, ckpt, want = sys.argv[1], sys.argv[2], sys.argv[3]
    r = GGUFReader(path)
    fields = r.fields
    for k, types in KEYS.items():
        assert k in fields, "%s: llama.cpp reads %s, which is missing" % (path, k)
        got = [t for t in fields[k].types]
        assert got == types, "%s: %s has type %s, llama.cpp reads %s" % (path, k, got, types)
    val = lambda k: fields[k].contents()  # noqa: E731
    assert val("general.architecture") == "llama"
    assert len(val("tokenizer.ggml.merges")) > 0, "tokenizer.ggml.merges is empty (gguf's writer refuses that)"

    with tessera.open(ckpt) as ck:
        model = {n for n, t in ck.tensors.items() if t.group == "model"}
        expect = set()
        L = val("llama.block_count")
        for name in ["token_embd.weight", "output_norm.weight", "output.weight"] + [
                "blk.%d.%s.weight" % (i, g) for i in range(L) for g in GGUF_NAMES]:
            expect.add(name)
        got = {t.name for t in r.tensors}
        extra = got - expect
        assert extra <= {"rope_freqs.weight"}, "%s: tensors not in a Llama model: %s" % (path, sorted(extra))
        assert expect <= got, "%s: missing tensors %s" % (path, sorted(expect - got))
        assert {ckpt_name(n) for n in expect} == model, "%s: the checkpoint's model tensors are %s" % (
            path, sorted(model ^ {ckpt_name(n) for n in expect}))
        for t in r.tensors:
            if t.name == "rope_freqs.weight":
                assert t.tensor_type == GGMLQuantizationType.F32 and list(t.shape) == [val(
                    "llama.rope.dimension_count") // 2], "rope_freqs: %s %s" % (t.tensor_type, list(t.shape))
                continue
            w = ck.read(ckpt_name(t.name))
            assert list(t.shape) == list(reversed(w.shape)), "%s: dims %s, the checkpoint's %s reversed" % (
                t.name, list(t.shape), list(w.shape))
            typ = "f32" if w.ndim == 1 else want  # norms stay f32
            assert t.tensor_type == TYPES[typ], "%s: type %s, want %s" % (t.name, t.tensor_type.name, typ)
            data = np.asarray(t.data).tobytes()
            assert data == as_type(w, typ), "%s: bytes differ from the checkpoint's %s in %s" % (
                t.name, ckpt_name(t.name), typ)
        emb = ck.read("tok_embeddings.weight")
        wk = ck.read("layers.0.attention.wk.weight")
        w1 = ck.read("layers.0.feed_forward.w1.weight")
    V, C = emb.shape
    hd = val("llama.rope.dimension_count")
    sizes = {"llama.vocab_size": V, "llama.embedding_length": C, "llama.feed_forward_length": w1.shape[0],
             "llama.attention.head_count": C // hd, "llama.attention.head_count_kv": wk.shape[0] // hd}
    for k, v in sizes.items():
        assert val(k) == v, "%s: %s is %s, the tensors say %s" % (path, k, val(k), v)
    assert len(val("tokenizer.ggml.tokens")) == V and len(val("tokenizer.ggml.token_type")) == V
    print("%s: %d tensors (%s) equal the checkpoint's, %d keys llama.cpp reads, by gguf's GGUFReader"
          % (path, len(r.tensors), want, len(KEYS)))


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print("FAIL: %s" % e)
        sys.exit(1)
