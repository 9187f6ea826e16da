"""Writes Hugging Face Llama checkpoints for tests/test_import.sh with nothing but
the file format: random weights in a given shape, as config.json plus
safetensors (one file, or shards with an index), and damaged variants.

usage: make_hf.py good DIR [--shards N] [--dtype F32|BF16] [--tied]
       make_hf.py bad DIR KIND     (KIND: past_end overlap hole reversed header_len
                                    missing_key wrong_shape bad_json missing_shard)"""
import json
import os
import struct
import sys

import numpy as np

CFG = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=64, intermediate_size=96,
           num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, vocab_size=300,
           rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, rope_scaling=None)


def tensors(cfg, tied, rng):
    C, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = C // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * hd
    t = {"model.embed_tokens.weight": rng.normal(0, 1, (V, C)), "model.norm.weight": 1 + 0.1 * rng.normal(size=C)}
    if not tied:
        t["lm_head.weight"] = rng.normal(0, C ** -0.5, (V, C))
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        t[p + "input_layernorm.weight"] = 1 + 0.1 * rng.normal(size=C)
        t[p + "post_attention_layernorm.weight"] = 1 + 0.1 * rng.normal(size=C)
        t[p + "self_attn.q_proj.weight"] = rng.normal(0, 0.1, (C, C))
        t[p + "self_attn.k_proj.weight"] = rng.normal(0, 0.1, (kv, C))
        t[p + "self_attn.v_proj.weight"] = rng.normal(0, 0.1, (kv, C))
        t[p + "self_attn.o_proj.weight"] = rng.normal(0, 0.1, (C, C))
        t[p + "mlp.gate_proj.weight"] = rng.normal(0, 0.1, (F, C))
        t[p + "mlp.up_proj.weight"] = rng.normal(0, 0.1, (F, C))
        t[p + "mlp.down_proj.weight"] = rng.normal(0, 0.1, (C, F))
    return t


def encode(a, dtype):
    a = np.ascontiguousarray(a, dtype=np.float32)
    if dtype == "F32":
        return a.tobytes()
    u = a.view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2").tobytes()  # round to nearest even


def write_st(path, items, dtype, damage=None):
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, a in items:
        b = encode(a, dtype)
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    names = [n for n, _ in items]
    if damage == "past_end":
        header[names[-1]]["data_offsets"][1] += 4
    elif damage == "overlap":
        b0, e0 = header[names[1]]["data_offsets"]
        header[names[1]]["data_offsets"] = [b0 - 4, e0 - 4]
    elif damage == "hole":
        blobs.insert(1, b"\0" * 8)
        for n in names[1:]:
            header[n]["data_offsets"] = [x + 8 for x in header[n]["data_offsets"]]
    elif damage == "reversed":
        b0, e0 = header[names[1]]["data_offsets"]
        header[names[1]]["data_offsets"] = [e0, b0]
    elif damage == "wrong_shape":
        header[names[0]]["shape"] = [header[names[0]]["shape"][0] // 2, header[names[0]]["shape"][1] * 2]
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    n = len(h) if damage != "header_len" else 1 << 60
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", n) + h + b"".join(blobs))


def main():
    mode, d = sys.argv[1], sys.argv[2]
    args = sys.argv[3:]
    os.makedirs(d, exist_ok=True)
    cfg = dict(CFG)
    shards = int(args[args.index("--shards") + 1]) if "--shards" in args else 1
    dtype = args[args.index("--dtype") + 1] if "--dtype" in args else "F32"
    tied = "--tied" in args
    cfg["tie_word_embeddings"] = tied
    kind = args[0] if mode == "bad" else None
    if kind == "missing_key":
        del cfg["num_attention_heads"]
    if kind == "bad_json":
        open(os.path.join(d, "config.json"), "w").write("{not json")
    else:
        json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=1)
    t = tensors(CFG, tied, np.random.default_rng(5))
    items = list(t.items())
    if shards == 1 and kind != "missing_shard":
        write_st(os.path.join(d, "model.safetensors"), items, dtype, kind)
        return
    shards = max(shards, 2)
    wm, per = {}, (len(items) + shards - 1) // shards
    for s in range(shards):
        fname = "model-%05d-of-%05d.safetensors" % (s + 1, shards)
        part = items[s * per:(s + 1) * per]
        for n, _ in part:
            wm[n] = fname
        if kind == "missing_shard" and s == shards - 1:
            continue
        write_st(os.path.join(d, fname), part, dtype, kind)
    total = sum(len(encode(a, dtype)) for _, a in items)
    json.dump({"metadata": {"total_size": total}, "weight_map": wm}, open(os.path.join(d, "model.safetensors.index.json"), "w"))


if __name__ == "__main__":
    main()
