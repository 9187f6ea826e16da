"""A Hugging Face-convention Llama in PyTorch (float64), reading the safetensors
files and config.json that `tessera export` writes with nothing but the file
format: the independent reference of tests/test_export.sh.

usage: hf_llama.py HFDIR TOKENS LOGITS.bin [TOL]
TOKENS: comma-separated ids; LOGITS.bin: tessera's logits (float32, T x V).
Exits 1 when the relative error ||a - b|| / ||b|| of the logits exceeds TOL
(default 1e-5)."""
import json
import math
import os
import struct
import sys

import numpy as np
import torch


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    assert n % 8 == 0 and 8 + n <= len(data), "header length %d" % n
    header = json.loads(data[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__")  # "format", and tessera's provenance and digests (FORMAT.md 13)
    assert meta.get("format") == "pt" and all(k == "format" or k.startswith("tessera.") for k in meta), meta
    body = data[8 + n:]
    out, end = {}, 0
    for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, e = t["data_offsets"]
        assert b == end, "%s: gap or overlap at %d" % (name, b)
        end = e
        raw = body[b:e]
        if t["dtype"] == "F32":
            a = np.frombuffer(raw, dtype="<f4")
        elif t["dtype"] == "BF16":
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif t["dtype"] == "F16":
            a = np.frombuffer(raw, dtype="<f2")
        else:
            raise SystemExit("unexpected dtype " + t["dtype"])
        assert a.size == int(np.prod(t["shape"])), name
        out[name] = torch.from_numpy(a.astype(np.float64).reshape(t["shape"]))
    assert end == len(body), "data section of %d bytes, tensors end at %d" % (len(body), end)
    return out


def load(hfdir):
    index = os.path.join(hfdir, "model.safetensors.index.json")
    w = {}
    if os.path.exists(index):
        idx = json.load(open(index))
        files = sorted(set(idx["weight_map"].values()))
        for f in files:
            w.update(read_safetensors(os.path.join(hfdir, f)))
        assert sorted(w) == sorted(idx["weight_map"]), "index and files disagree"
        size = sum(t.numel() for t in w.values())
        assert idx["metadata"]["total_size"] in (size * 4, size * 2), idx["metadata"]
    else:
        w = read_safetensors(os.path.join(hfdir, "model.safetensors"))
    return json.load(open(os.path.join(hfdir, "config.json"))), w


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def forward(cfg, w, tokens):
    C, NH, NKV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd, eps, L = C // NH, cfg["rms_norm_eps"], cfg["num_hidden_layers"]
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["rope_scaling"] is None
    T = len(tokens)
    inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = torch.outer(torch.arange(T, dtype=torch.float64), inv)
    cos, sin = torch.cat((ang, ang), -1).cos(), torch.cat((ang, ang), -1).sin()

    def rms(x, g):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * g

    x = w["model.embed_tokens.weight"][torch.tensor(tokens)]
    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    for l in range(L):
        p = "model.layers.%d." % l
        h = rms(x, w[p + "input_layernorm.weight"])
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(T, NH, hd).transpose(0, 1)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(T, NKV, hd).transpose(0, 1)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(T, NKV, hd).transpose(0, 1)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(NH // NKV, 0), v.repeat_interleave(NH // NKV, 0)
        att = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(hd) + mask, -1)
        a = (att @ v).transpose(0, 1).reshape(T, NH * hd)
        x = x + a @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        g, u = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(g) * u) @ w[p + "mlp.down_proj.weight"].T
    head = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else w["lm_head.weight"]
    return rms(x, w["model.norm.weight"]) @ head.T


def main():
    hfdir, tokens, logits_path = sys.argv[1], [int(t) for t in sys.argv[2].split(",")], sys.argv[3]
    tol = float(sys.argv[4]) if len(sys.argv) > 4 else 1e-5
    cfg, w = load(hfdir)
    ref = forward(cfg, w, tokens)
    got = torch.from_numpy(np.fromfile(logits_path, dtype="<f4").astype(np.float64)).view(len(tokens), -1)
    err = ((got - ref).norm() / ref.norm()).item()
    print("%s: logits of %d positions, relative error %.3g (tolerance %g)" % (hfdir, len(tokens), err, tol))
    sys.exit(0 if err <= tol else 1)


if __name__ == "__main__":
    main()
