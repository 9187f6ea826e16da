"""ref_kernels.py: PyTorch reference for tests/test_kernels.c.

Usage: ref_kernels.py DIR. Exits 3 when numpy or torch cannot be imported. Reads DIR/kernels.idx and the arrays it lists (written
by test_kernels), recomputes every op in float64 with PyTorch (autograd for the
backward passes, fed the same upstream gradients), and compares each output of
the C kernels by relative error ||c - ref|| / ||ref||. Prints one line per
tensor; exits 1 naming the op, case and tensor when an error exceeds 1e-5.
"""
import math
import os
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:  # test_kernels reports exit status 3 as the missing package
    print(f"torch does not import under {sys.executable} (the tests' Python is tests/py_setup.sh's): {e}", file=sys.stderr)
    sys.exit(3)

TOL = 1e-5
torch.set_default_dtype(torch.float64)


def load_index(d):
    cases, order = {}, []
    with open(os.path.join(d, "kernels.idx")) as f:
        for line in f:
            w = line.split()
            if not w:
                continue
            if w[0] == "case":
                params = {}
                for kv in w[3:]:
                    k, v = kv.split("=")
                    params[k] = float(v) if any(c in v for c in ".e") else int(v)
                cases[w[1]] = {"op": w[2], "p": params, "t": {}}
                order.append(w[1])
            elif w[0] == "tensor":
                name, tensor, dt, nd = w[1], w[2], w[3], int(w[4])
                shape = [int(x) for x in w[5 : 5 + nd]]
                dtype = {"f32": np.float32, "i32": np.int32, "f64": np.float64}[dt]
                a = np.fromfile(os.path.join(d, f"{name}.{tensor}.bin"), dtype=dtype)
                n = math.prod(shape)
                if a.size != n:
                    sys.exit(f"{name}.{tensor}: {a.size} elements in the file, shape {shape} wants {n}")
                cases[name]["t"][tensor] = torch.from_numpy(a.reshape(shape).astype(np.float64 if dt != "i32" else np.int64))
            else:
                sys.exit(f"kernels.idx: unknown line {line!r}")
    return cases, order


failures = []


def relerr(c, ref):
    c, ref = c.to(torch.float64), ref.to(torch.float64)
    if c.shape != ref.shape:
        return math.inf
    den = ref.norm().item()
    num = (c - ref).norm().item()
    if den == 0.0:
        return num  # the reference is all zeros: absolute
    return num / den


def compare(op, case, name, c, ref):
    e = relerr(c, ref)
    ok = e <= TOL  # NaN fails
    print(f"{'ok  ' if ok else 'FAIL'} {op} {case} {name}: relative error {e:.3g}")
    if not ok:
        failures.append(f"{op} {case} {name}: relative error {e:.3g} > {TOL:g}")


def must_differ(op, case, what, c, wrong):
    """A negative control: the data must tell the right convention from a wrong one."""
    e = relerr(c, wrong)
    if not e > 1e-3:
        failures.append(f"{op} {case}: the test data cannot tell it from {what} (error {e:.3g})")


def leaf(x):
    return x.clone().requires_grad_(True)


def ref_matmul(cs, p, t):
    inp, w = leaf(t["inp"]), leaf(t["w"])
    out = F.linear(inp, w)
    out.backward(t["dout"])
    return {"out": out, "dinp": inp.grad, "dw": w.grad}


def ref_embed(cs, p, t):
    tok, V = t["tokens"], p["V"]
    valid = (tok >= 0) & (tok < V)
    wte = leaf(t["wte"])
    rows = F.embedding(tok.clamp(0, V - 1), wte)
    out = rows * valid.unsqueeze(1)
    out.backward(t["dout"])
    return {"out": out, "dwte": wte.grad}


def ref_rmsnorm(cs, p, t):
    x, w = leaf(t["inp"]), leaf(t["w"])
    rstd = torch.rsqrt(x.pow(2).mean(-1) + p["eps"])
    out = x * rstd.unsqueeze(-1) * w
    out.backward(t["dout"])
    return {"out": out, "rstd": rstd, "dinp": x.grad, "dw": w.grad}


def llama3_freqs(hd, theta, factor, low, high, orig):
    """freq[i] = theta^(-2i/hd), then Llama 3.1's frequency scaling when factor != 0."""
    freqs = 1.0 / theta ** (torch.arange(0, hd, 2)[: hd // 2] / hd)
    if factor == 0:
        return freqs
    out = []
    for f in freqs.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < orig / high:
            out.append(f)
        elif wavelen > orig / low:
            out.append(f / factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return torch.tensor(out)


def ref_rope(cs, p, t):
    B, T, H, hd = p["B"], p["T"], p["H"], p["hd"]
    freqs = llama3_freqs(hd, p["theta"], p["factor"], p["low"], p["high"], p["orig"])
    ang = torch.outer(torch.arange(T, dtype=torch.float64), freqs)  # (T, hd/2)
    cis = torch.polar(torch.ones_like(ang), ang).view(1, T, 1, hd // 2)
    x = leaf(t["x"])
    xc = torch.view_as_complex(x.reshape(B, T, H, hd // 2, 2))  # Meta's interleaved pairs
    out = torch.view_as_real(xc * cis).reshape(B, T, H, hd)
    out.backward(t["dout"])
    # negative control: Hugging Face's rotate_half pairs x[i] with x[i + hd/2]
    c = torch.cat([ang.cos(), ang.cos()], -1).view(1, T, 1, hd)
    s = torch.cat([ang.sin(), ang.sin()], -1).view(1, T, 1, hd)
    xd = t["x"]
    hf = xd * c + torch.cat([-xd[..., hd // 2 :], xd[..., : hd // 2]], -1) * s
    if T > 1:
        must_differ("rope", cs, "rotate_half (Hugging Face's layout)", t["out"], hf)
    return {"cos": ang.cos(), "sin": ang.sin(), "out": out, "dx": x.grad}


def attention(q, k, v, NH, NKV, group_of):
    """q (B,T,NH,hd), k, v (B,T,NKV,hd); group_of(h) = the kv head of query head h."""
    B, T, _, hd = q.shape
    idx = torch.tensor([group_of(h) for h in range(NH)])
    kk, vv = k[:, :, idx], v[:, :, idx]  # (B,T,NH,hd)
    qt, kt, vt = (a.transpose(1, 2) for a in (q, kk, vv))  # (B,NH,T,hd)
    s = qt @ kt.transpose(-1, -2) / math.sqrt(hd)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    att = torch.softmax(s.masked_fill(~mask, -math.inf), -1)
    return (att @ vt).transpose(1, 2), att


def ref_attention(cs, p, t):
    NH, NKV = p["NH"], p["NKV"]
    rep = NH // NKV
    q, k, v = leaf(t["q"]), leaf(t["k"]), leaf(t["v"])
    out, att = attention(q, k, v, NH, NKV, lambda h: h // rep)
    out.backward(t["dout"])
    if NKV not in (1, NH):  # negative control: heads assigned round-robin instead of in groups
        wrong, _ = attention(t["q"], t["k"], t["v"], NH, NKV, lambda h: h % NKV)
        must_differ("attention", cs, "round-robin kv heads", t["out"], wrong)
    return {"out": out, "att": att, "dq": q.grad, "dk": k.grad, "dv": v.grad}


def ref_swiglu(cs, p, t):
    g, u = leaf(t["gate"]), leaf(t["up"])
    out = F.silu(g) * u
    out.backward(t["dout"])
    return {"out": out, "dgate": g.grad, "dup": u.grad}


def ref_xent(cs, p, t):
    tgt, V = t["targets"], p["V"]
    valid = (tgt >= 0) & (tgt < V)
    x = leaf(t["logits"])
    losses = F.cross_entropy(x, torch.where(valid, tgt, -100), ignore_index=-100, reduction="none")
    (losses * t["dloss"]).sum().backward()
    if p["count"] != int(valid.sum()):
        failures.append(f"xent {cs}: count {p['count']}, PyTorch counts {int(valid.sum())}")
    return {"losses": losses, "probs": torch.softmax(t["logits"], -1), "dlogits": x.grad}


def ref_adamw(cs, p, t):
    param = t["p0"].clone().requires_grad_(True)
    opt = torch.optim.AdamW([param], lr=p["lr"], betas=(p["beta1"], p["beta2"]), eps=p["eps"], weight_decay=p["wd"])
    if p["t0"]:
        opt.state[param] = {"step": torch.tensor(float(p["t0"])), "exp_avg": t["m0"].clone(), "exp_avg_sq": t["v0"].clone()}
    for s in range(p["steps"]):
        param.grad = t["g"][s].clone() * p["gscale"]
        opt.step()
    st = opt.state[param]
    # the change of p too: ||p|| alone would hide a wrong update
    compare("adamw", cs, "p - p0", t["p"] - t["p0"], param.detach() - t["p0"])
    return {"p": param.detach(), "m": st["exp_avg"], "v": st["exp_avg_sq"]}


def ref_sumsq(cs, p, t):
    x = t["x"]
    return {"sumsq": (x * x).sum()}


def main():
    d = sys.argv[1]
    cases, order = load_index(d)
    for cs in order:
        c = cases[cs]
        ref = globals()["ref_" + c["op"]](cs, c["p"], c["t"])
        for name, r in ref.items():
            compare(c["op"], cs, name, c["t"][name], r.detach())
    if failures:
        print(f"{len(failures)} comparison(s) failed:", file=sys.stderr)
        for f in failures:
            print("  " + f, file=sys.stderr)
        sys.exit(1)
    print(f"all {len(order)} cases agree with PyTorch within {TOL:g}")


if __name__ == "__main__":
    main()
