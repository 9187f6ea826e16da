"""ref_model.py: a PyTorch Llama 3 for tests/test_model_ref.c.

Usage: ref_model.py DIR. Exits 3 when numpy or torch cannot be imported.
Reads DIR/model.json and the arrays it names (written by test_model_ref: the
model args, every parameter and its gradient after one step, the tokens, the
targets, the logits of sample 0 and the loss), builds the same model from the
architecture alone in float64, and compares tessera's loss, logits, gradient
norm and every gradient by relative error ||c - ref|| / ||ref||. Prints one
line per tensor and the largest error; exits 1 naming the first tensor whose
error exceeds 1e-5.

The model (Meta's Llama 3 reference, TorchTitan's parameter names):
    h = tok_embeddings[inputs]                                  (B,T,C)
    per layer: h = h + attention(rmsnorm(h, attention_norm))
               h = h + w2(silu(w1 x) * w3 x), x = rmsnorm(h, ffn_norm)
    logits = output(rmsnorm(h, norm))                           (B,T,V)
    loss = mean cross-entropy over the targets >= 0
rmsnorm(x, w) = x / sqrt(mean(x^2) + eps) * w; Linear weights are (out, in).
Attention: RoPE on q and k with the pairs (x[2i], x[2i+1]) rotated by
pos * theta^(-2i/hd) (Llama 3.1 frequency scaling when its factor is not 0),
query head h reads key/value head h // (NH/NKV), causal, scale 1/sqrt(hd).
"""
import json
import math
import os
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:  # test_model_ref reports exit status 3 as the missing package
    print(f"torch does not import under {sys.executable} (the tests' Python is tests/py_setup.sh's): {e}", file=sys.stderr)
    sys.exit(3)

TOL = 1e-5
torch.set_default_dtype(torch.float64)


def load(d, file, dtype, shape):
    a = np.fromfile(os.path.join(d, file), dtype=dtype)
    n = math.prod(shape)
    if a.size != n:
        sys.exit(f"{file}: {a.size} elements in the file, shape {list(shape)} wants {n}")
    return torch.from_numpy(a.reshape(shape).astype(np.int64 if dtype == np.int32 else np.float64))


def rope_freqs(hd, theta, s):
    """freq_i = theta^(-2i/hd), i < hd/2, with Llama 3.1's scaling when s["factor"] != 0."""
    freqs = [theta ** (-2.0 * i / hd) for i in range(hd // 2)]
    if s["factor"] != 0:
        old = s["original_max_pos"]
        low_wavelen = old / s["low_freq_factor"]
        high_wavelen = old / s["high_freq_factor"]
        scaled = []
        for f in freqs:
            wavelen = 2 * math.pi / f
            if wavelen < high_wavelen:  # high frequencies: unchanged
                scaled.append(f)
            elif wavelen > low_wavelen:  # low frequencies: divided by the factor
                scaled.append(f / s["factor"])
            else:  # in between: a linear blend in old / wavelen
                smooth = (old / wavelen - s["low_freq_factor"]) / (s["high_freq_factor"] - s["low_freq_factor"])
                scaled.append((1 - smooth) * f / s["factor"] + smooth * f)
        freqs = scaled
    return torch.tensor(freqs)


def rope(x, cis):
    """x (B,T,H,hd) real; cis (T,hd/2) complex: pairs (x[2i], x[2i+1]) as complex numbers times cis."""
    xc = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * cis[None, :, None, :]).reshape(x.shape)


def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def forward(a, P, inputs, targets):
    """P: parameter name -> float64 tensor. inputs, targets (B,T). Returns (logits (B,T,V), loss)."""
    Bn, T = inputs.shape
    C, NH, NKV = a["dim"], a["n_heads"], a["n_kv_heads"]
    hd = C // NH
    eps = a["norm_eps"]
    freqs = rope_freqs(hd, a["rope_theta"], a["rope_scaling"])
    angles = torch.outer(torch.arange(T, dtype=torch.float64), freqs)  # (T, hd/2)
    cis = torch.polar(torch.ones_like(angles), angles)
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)  # True above the diagonal: masked

    h = P["tok_embeddings.weight"][inputs]  # (B,T,C)
    for layer in range(a["n_layers"]):
        p = lambda name: P[f"layers.{layer}.{name}.weight"]  # noqa: E731
        x = rmsnorm(h, p("attention_norm"), eps)
        q = (x @ p("attention.wq").T).view(Bn, T, NH, hd)
        k = (x @ p("attention.wk").T).view(Bn, T, NKV, hd)
        v = (x @ p("attention.wv").T).view(Bn, T, NKV, hd)
        q, k = rope(q, cis), rope(k, cis)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B,H,T,hd)
        k = k.repeat_interleave(NH // NKV, dim=1)  # query head h -> kv head h // (NH/NKV)
        v = v.repeat_interleave(NH // NKV, dim=1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)  # (B,NH,T,T)
        s = s.masked_fill(causal, float("-inf"))
        att = torch.softmax(s, dim=-1) @ v  # (B,NH,T,hd)
        att = att.transpose(1, 2).reshape(Bn, T, NH * hd)
        h = h + att @ p("attention.wo").T
        x = rmsnorm(h, p("ffn_norm"), eps)
        ff = F.silu(x @ p("feed_forward.w1").T) * (x @ p("feed_forward.w3").T)
        h = h + ff @ p("feed_forward.w2").T
    h = rmsnorm(h, P["norm.weight"], eps)
    logits = h @ P["output.weight"].T  # (B,T,V)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)
    return logits, loss


def relerr(c, ref):
    if c.shape != ref.shape:
        return math.inf
    den = ref.norm().item()
    num = (c - ref).norm().item()
    return num / den if den > 0 else num


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: ref_model.py DIR")
    d = sys.argv[1]
    with open(os.path.join(d, "model.json")) as f:
        m = json.load(f)
    a, Bn, T = m["args"], m["batch"], m["seq_len"]
    V = a["vocab_size"]
    inputs = load(d, m["inputs"], np.int32, (Bn, T))
    targets = load(d, m["targets"], np.int32, (Bn, T))
    c_logits = load(d, m["logits"], np.float32, (T, V))
    P, G = {}, {}
    for t in m["tensors"]:
        P[t["name"]] = load(d, t["param"], np.float32, t["shape"]).requires_grad_(True)
        G[t["name"]] = load(d, t["grad"], np.float32, t["shape"])

    logits, loss = forward(a, P, inputs, targets)
    loss.backward()

    # (what, tessera's, the reference)
    rows = [
        ("loss", torch.tensor(m["loss"]), loss.detach()),
        ("logits (sample 0)", c_logits, logits[0].detach()),
        ("grad_norm", torch.tensor(m["grad_norm"]), torch.sqrt(sum(p.grad.pow(2).sum() for p in P.values()))),
    ]
    for t in m["tensors"]:
        ref = P[t["name"]].grad
        if ref is None:
            ref = torch.zeros_like(G[t["name"]])
        rows.append((f"grad {t['name']}", G[t["name"]], ref))

    first, worst = None, (0.0, "")
    for what, c, ref in rows:
        e = relerr(c, ref)
        ok = e <= TOL  # NaN fails
        print(f"{'ok  ' if ok else 'FAIL'} {what}: relative error {e:.3e} (|ref| {ref.norm().item():.4g})")
        if not ok and first is None:
            first = (what, e)
        if not e <= worst[0]:
            worst = (e, what)
    print(f"max relative error {worst[0]:.3e} ({worst[1]}), tolerance {TOL:g}")
    if first:
        print(f"ref_model: {first[0]} differs from PyTorch: relative error {first[1]:.3e} > {TOL:g}", file=sys.stderr)
        sys.exit(1)


main()
