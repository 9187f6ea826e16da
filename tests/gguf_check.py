"""An independent GGUF v3 reader for tests/test_export.sh: parses every field
of a file written by `tessera export --format gguf` by the specification
(llama.cpp's docs/gguf.md), checks the keys a llama model needs, tensor names,
dims, types, alignment and offsets, and compares every tensor's data with the
Hugging Face export of the same checkpoint (q and k permuted back to the
interleaved rotary convention that llama.cpp's llama architecture uses).

usage: gguf_check.py FILE.gguf HFDIR f32|bf16|f16"""
import json
import struct
import sys

import numpy as np

sys.path.insert(0, __import__("os").path.dirname(__file__))
import hf_llama  # noqa: E402

SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
GGML = {0: ("F32", 4), 1: ("F16", 2), 30: ("BF16", 2)}


class R:
    def __init__(self, b):
        self.b, self.p = b, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.b, self.p)
        self.p += struct.calcsize(fmt)
        assert self.p <= len(self.b), "read past the end"
        return v[0]

    def string(self):
        n = self.take("<Q")
        assert n < 1 << 20, "string of %d bytes" % n
        s = self.b[self.p:self.p + n].decode("utf-8")
        self.p += n
        return s

    def value(self, t):
        if t == 8:
            return self.string()
        if t == 9:
            et, n = self.take("<I"), self.take("<Q")
            return [self.value(et) for _ in range(n)]
        assert t in SCALAR, "value type %d" % t
        return self.take(SCALAR[t])


def main():
    path, hfdir, want = sys.argv[1], sys.argv[2], sys.argv[3].upper()
    data = open(path, "rb").read()
    r = R(data)
    assert data[:4] == b"GGUF", "magic"
    r.p = 4
    assert r.take("<I") == 3, "version"
    nt, nkv = r.take("<Q"), r.take("<Q")
    kv, types = {}, {}
    for _ in range(nkv):
        k = r.string()
        t = r.take("<I")
        assert k not in kv, "key %s twice" % k
        kv[k], types[k] = r.value(t), t
    cfg = json.load(open(hfdir + "/config.json"))
    V, C, L = cfg["vocab_size"], cfg["hidden_size"], cfg["num_hidden_layers"]
    hd = C // cfg["num_attention_heads"]
    need = {"general.architecture": (8, "llama"), "general.alignment": (4, 32),
            "llama.embedding_length": (4, C), "llama.block_count": (4, L),
            "llama.feed_forward_length": (4, cfg["intermediate_size"]),
            "llama.attention.head_count": (4, cfg["num_attention_heads"]),
            "llama.attention.head_count_kv": (4, cfg["num_key_value_heads"]),
            "llama.rope.dimension_count": (4, hd), "llama.vocab_size": (4, V),
            "general.file_type": (4, {"F32": 0, "F16": 1, "BF16": 32}[want]),
            "tokenizer.ggml.model": (8, "gpt2"), "tokenizer.ggml.pre": (8, "qwen2"),
            "tokenizer.ggml.eos_token_id": (4, 256), "tokenizer.ggml.add_bos_token": (7, False),
            "tokenizer.ggml.add_eos_token": (7, False),
            "llama.context_length": (4, cfg["max_position_embeddings"])}
    for k, (t, v) in need.items():
        assert k in kv and types[k] == t and kv[k] == v, "%s: %r (type %s), want %r" % (k, kv.get(k), types.get(k), v)
    assert types["llama.rope.freq_base"] == 6 and abs(kv["llama.rope.freq_base"] - cfg["rope_theta"]) <= 1e-3 * cfg["rope_theta"]
    assert types["llama.attention.layer_norm_rms_epsilon"] == 6
    assert abs(kv["llama.attention.layer_norm_rms_epsilon"] - cfg["rms_norm_eps"]) < 1e-9
    # the byte-level tokenizer: byte b is id b, spelled in GPT-2's byte-to-character
    # alphabet (its bytes_to_unicode), normal tokens; 256 ends text; one merge,
    # of byte 0xFF twice, which UTF-8 never holds
    toks, ttype = kv["tokenizer.ggml.tokens"], kv["tokenizer.ggml.token_type"]
    assert len(toks) == V and len(ttype) == V and types["tokenizer.ggml.merges"] == 9
    assert kv["tokenizer.ggml.merges"] == ["\u00ff \u00ff"], kv["tokenizer.ggml.merges"]
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    spell, extra = {}, 0
    for b in range(256):
        spell[b] = chr(b) if b in printable else chr(256 + extra)
        extra += b not in printable
    assert all(toks[b] == spell[b] and ttype[b] == 1 for b in range(256)), "byte tokens"
    assert toks[65] == "A" and toks[32] == "\u0120" and toks[10] == "\u010a"
    assert toks[256] == "<|endoftext|>" and ttype[256] == 3 and all(t == 5 for t in ttype[257:])
    assert len(set(toks)) == V, "token texts repeat"
    infos = {}
    for _ in range(nt):
        name = r.string()
        assert len(name.encode()) <= 63, "name %s over 63 bytes" % name
        nd = r.take("<I")
        dims = [r.take("<Q") for _ in range(nd)]
        t, off = r.take("<I"), r.take("<Q")
        assert name not in infos and t in GGML and off % 32 == 0, (name, t, off)
        infos[name] = (dims, t, off)
    base = (r.p + 31) // 32 * 32
    assert all(b == 0 for b in data[r.p:base]), "padding before the data"
    expect = {"token_embd.weight", "output_norm.weight", "output.weight"} | {
        "blk.%d.%s.weight" % (l, n) for l in range(L) for n in
        ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_down", "ffn_up")}
    assert set(infos) == expect, sorted(set(infos) ^ expect)
    hf = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
          "output.weight": "lm_head.weight"}
    per = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
           "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
           "ffn_gate": "mlp.gate_proj", "ffn_down": "mlp.down_proj", "ffn_up": "mlp.up_proj"}
    ref = hf_llama.load(hfdir)[1]
    spans = []
    for name, (dims, t, off) in infos.items():
        parts = name.split(".")
        src = hf.get(name) or "model.layers.%s.%s.weight" % (parts[1], per[parts[2]])
        w = ref[src].numpy()
        assert dims == list(w.shape[::-1]), "%s: dims %s for shape %s" % (name, dims, w.shape)
        tname, size = GGML[t]
        assert tname == ("F32" if w.ndim == 1 else want), "%s: type %s" % (name, tname)
        n = w.size
        b = base + off
        spans.append((b, b + n * size, name))
        raw = data[b:b + n * size]
        assert len(raw) == n * size, "%s: past the end of the file" % name
        if tname == "F32":
            got = np.frombuffer(raw, "<f4").astype(np.float64)
        elif tname == "BF16":
            got = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        else:
            got = np.frombuffer(raw, "<f2").astype(np.float64)
        if parts[-2] in ("attn_q", "attn_k"):  # HF halves back to interleaved pairs
            heads = w.shape[0] // hd
            w = w.reshape(heads, 2, hd // 2, -1).transpose(0, 2, 1, 3).reshape(w.shape)
        w32 = w.astype(np.float32)
        if tname == "BF16":
            u = w32.view(np.uint32)
            w32 = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)
        elif tname == "F16":
            w32 = w32.astype(np.float16)
        assert np.array_equal(got, w32.astype(np.float64).reshape(-1)), "%s: data differs" % name
    spans.sort()
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        assert e0 <= b1, "%s overlaps %s" % (n0, n1)
    assert spans[-1][1] <= len(data)
    print("%s: GGUF v3, %d keys, %d tensors, all checked (%s)" % (path, nkv, nt, want))


if __name__ == "__main__":
    main()
