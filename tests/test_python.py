"""test_python.py DIR TRAINED LOGITS TOKENS [--no-torch]: the Python package (python/tessera)
against the library and against tests/format_reader.py, an independent reader of
FORMAT.md. DIR: a scratch folder; TRAINED: a checkpoint root written by `tessera
train` on 2 ranks (tp=2); LOGITS: `tessera logits` of it for TOKENS (float32, T x
V). The PyTorch checks (tensors in and out, tessera.torch) need torch: without it
they fail, unless --no-torch says to leave them out and to prove that the package
works with numpy alone (it must not import torch). Prints "FAIL: ..." for each
failed check, exits 1 if any."""
import os
import sys

import numpy as np

import tessera

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import format_reader  # noqa: E402
from pycheck import check, fails, raises  # noqa: E402

d, trained = sys.argv[1], sys.argv[2]
no_torch = sys.argv[5:] == ["--no-torch"]
rng = np.random.default_rng(7)

# 1. every dtype the package writes, 0-d to 3-d and empty, read whole and in boxes
arrays = {
    "f32": rng.standard_normal((5, 7)).astype(np.float32),
    "f16": rng.standard_normal((3, 4, 5)).astype(np.float16),
    "f64": np.float64(2.5),
    "i8": rng.integers(-128, 127, 33, dtype=np.int8),
    "i16": rng.integers(-30000, 30000, (2, 9), dtype=np.int16),
    "i32": rng.integers(-2**31, 2**31 - 1, (4, 4), dtype=np.int32),
    "i64": rng.integers(-2**62, 2**62, 6, dtype=np.int64),
    "u8": rng.integers(0, 255, (3, 3), dtype=np.uint8),
    "u16": rng.integers(0, 65535, 10, dtype=np.uint16),
    "u32": rng.integers(0, 2**32 - 1, 10, dtype=np.uint32),
    "u64": rng.integers(0, 2**63, 4, dtype=np.uint64),
    "bool": rng.integers(0, 2, 12).astype(np.bool_),
    "empty": np.zeros((0, 4), dtype=np.float32),
    "noncontiguous": rng.standard_normal((6, 8)).astype(np.float32)[:, ::2],
}
bf16_bits = rng.integers(0, 65535, (4, 5), dtype=np.uint16)
step_dir = os.path.join(d, "np", "step-00000005")
tessera.save(step_dir, dict(arrays, bf16=(bf16_bits, "bf16")), step=5, blobs={"note": b"hello", "empty": b""})
with tessera.open(os.path.join(d, "np")) as ck:  # a root: its newest step
    check(ck.step == 5 and ck.path == step_dir, "open(root): step %d at %s" % (ck.step, ck.path))
    for name, a in arrays.items():
        t = ck.tensors[name]
        check(t.shape == np.shape(a), "%s: shape %s, saved %s" % (name, t.shape, np.shape(a)))
        got = ck.read(name)
        check(got.dtype == np.asarray(a).dtype and np.array_equal(got, a), "%s: read back differs" % name)
    check(ck.tensors["u16"].dtype == "u16" and ck.tensors["bf16"].dtype == "bf16", "dtype names")
    check(np.array_equal(ck.read("bf16"), bf16_bits), "bf16: its bits differ")
    f = ck.read("bf16", bf16="float32")
    check(f.dtype == np.float32 and np.array_equal(f.view(np.uint32) >> 16, bf16_bits.astype(np.uint32)),
          "bf16 as float32: not the bits shifted")
    sub = ck.read("f16", offset=(1, 0, 2), extent=(2, 4, 3))
    check(np.array_equal(sub, arrays["f16"][1:3, 0:4, 2:5]), "f16: a box differs from the slice")
    check(ck.read("i32", offset=(2, 1), extent=(0, 3)).shape == (0, 3), "an empty box")
    check(ck.blobs == {("note", -1): 5, ("empty", -1): 0}, "blobs %s" % ck.blobs)
    check(ck.blob("note") == b"hello" and ck.blob("empty") == b"", "blob contents")
    check(ck.read_blobs([("empty", -1), ("note", -1), ("note", -1)]) == [b"", b"hello", b"hello"],
          "read_blobs: not the blobs in order")
    raises(lambda: ck.read_blobs([("note", -1), ("nope", -1)]), "no blob 'nope' of rank -1")
    ck.verify()
    raises(lambda: ck.read("nope"), step_dir, "no tensor named 'nope'")
    raises(lambda: ck.read("f32", offset=(4, 0), extent=(2, 7)), "f32", "outside")
    raises(lambda: ck.read("f32", offset=(0,), extent=(1,)), "f32", "2 dims")
    raises(lambda: ck.blob("note", rank=3), "no blob 'note' of rank 3")
    # out=: read in place into an array of the box's elements and element size
    # (any dtype of that size, any shape), returned as it is; any other refused,
    # naming the tensor, and left as it was
    dst = np.full(7 * 5, -1, dtype=np.int32)
    got = ck.read("f32", out=dst)
    check(got is dst and np.array_equal(dst.view(np.float32).reshape(5, 7), arrays["f32"]), "out=: not read in place")
    dst = np.zeros((2, 4, 3), dtype=np.float16)
    check(np.array_equal(ck.read("f16", offset=(1, 0, 2), extent=(2, 4, 3), out=dst), arrays["f16"][1:3, 0:4, 2:5]),
          "out=: a box read in place differs")
    for what, bad in (("too few elements", np.full(34, 9, np.float32)),
                      ("elements of 8 bytes", np.full(35, 9, np.float64)),
                      ("not C-contiguous", np.full((7, 5), 9, np.float32).T),
                      ("read-only", np.full(35, 9, np.float32)),
                      ("not an array", bytearray(140))):
        if what == "read-only":
            bad.flags.writeable = False
        before = bytes(bad) if isinstance(bad, bytearray) else bad.copy()
        raises(lambda: ck.read("f32", out=bad), "f32", "out must be a writable C-contiguous array of 35 elements "
               "of 4 bytes")
        check(bytes(bad) == before if isinstance(bad, bytearray) else np.array_equal(bad, before),
              "out= %s: written although refused" % what)
# read_many: boxes of several tensors in one call, frames that neighbour each
# other read at once, a frame two reads need (big's rows 1000:1100 cross its
# first two frames of 1024 rows, both also in the whole read) decoded for both;
# given arrays filled in place, the others made and returned; one bad read
# refuses them all before any is read
big = rng.standard_normal((2600, 1024)).astype(np.float32)  # 3 frames of 4 MiB at most
many_dir = os.path.join(d, "many", "step-00000001")
tessera.save(many_dir, dict(arrays, big=big, bf16=(bf16_bits, "bf16")), step=1)
with tessera.open(many_dir) as ck:
    given = np.full(35, -1, np.float32)
    got = ck.read_many([("big", None, None, None), ("big", (1000, 3), (100, 1000), None), ("f32", None, None, given),
                        ("f16", (1, 0, 2), (2, 4, 3), None), ("empty", None, None, None), ("bf16", None, None, None),
                        ("i64", (2,), (3,), None)], threads=3)
    want = [big, big[1000:1100, 3:1003], arrays["f32"], arrays["f16"][1:3, 0:4, 2:5], arrays["empty"], bf16_bits,
            arrays["i64"][2:5]]
    check(len(got) == len(want) and got[2] is given, "read_many: not the arrays read into")
    for k, (g, w) in enumerate(zip(got, want)):
        check(np.array_equal(g.reshape(np.shape(w)), w), "read_many: read %d differs" % k)
    given = np.full(35, -1, np.float32)
    raises(lambda: ck.read_many([("f32", None, None, given), ("big", (2599, 0), (2, 1024), None)]), "big", "outside")
    raises(lambda: ck.read_many([("f32", None, None, given), ("nope", None, None, None)]), "no tensor named 'nope'")
    check(np.all(given == -1), "read_many: a read done although another was refused")
    check(ck.read_many([]) == [], "read_many of nothing")
# the independent reader agrees, bit for bit
ref = format_reader.Checkpoint(step_dir)
with tessera.open(step_dir) as ck:
    for i, t in enumerate(ref.tensors):
        got, want = ck.read(t["name"]), ref.tensor(i)
        check(got.tobytes() == np.asarray(want).tobytes(), "%s: not what format_reader.py reads" % t["name"])

# 2. errors: no checkpoint, a damaged one, a dtype the format has not, a bad name
raises(lambda: tessera.open(os.path.join(d, "nowhere")), "nowhere")
raises(lambda: tessera.save(os.path.join(d, "c", "step-00000001"), {"c": np.zeros(2, np.complex64)}), "complex64")
raises(lambda: tessera.save(os.path.join(d, "n", "step-00000001"), {"a b": np.zeros(2, np.float32)}), "a b")
check(not os.path.exists(os.path.join(d, "n", "step-00000001", "MANIFEST")), "a refused save committed")
data = os.path.join(step_dir, "data-00000.tsd")
raw = bytearray(open(data, "rb").read())
raw[-1] ^= 0x5A  # the last frame's last byte
open(data, "wb").write(bytes(raw))
with tessera.open(step_dir) as ck:
    raises(ck.verify, "data-00000.tsd", "problem")

# 3. a checkpoint trained on 2 ranks (tp=2): every tensor as the independent reader reads it
with tessera.open(trained) as ck:
    check(ck.layout["tp"] == 2, "trained: layout %s" % ck.layout)
    wq = ck.tensors["layers.0.attention.wq.weight"]
    check(wq.placement["tp_dim"] == 0 and wq.group == "model", "wq: placement %s" % (wq.placement,))
    check(ck.tensors["output.weight"].placement["tp_dim"] == 0, "output.weight: not split over tp")
    ref = format_reader.Checkpoint(ck.path)
    for i, t in enumerate(ref.tensors):
        got = ck.read(t["name"])
        check(got.tobytes() == ref.tensor(i).tobytes(), "trained %s: not what format_reader.py reads" % t["name"])
    check(int.from_bytes(ck.blob("train.step"), "little") == ck.step, "train.step blob")
    ck.verify()

# 4. PyTorch: tensors out (bfloat16 for bf16) and in; with --no-torch, the package
# has not needed it
torch = None
if no_torch:
    check("torch" not in sys.modules, "the package imported torch")
else:
    try:
        import torch
    except ImportError as e:
        check(False, "torch does not import under %s: %s" % (sys.executable, e))
if torch is not None:
    t = torch.randn(3, 5).to(torch.bfloat16)
    tessera.save(os.path.join(d, "pt", "step-00000002"), {"w": t, "x": torch.arange(6, dtype=torch.int64)}, step=2)
    with tessera.open(os.path.join(d, "pt")) as ck:
        check(ck.tensors["w"].dtype == "bf16", "a bfloat16 tensor saved as %s" % ck.tensors["w"].dtype)
        w = ck.read("w", torch=True)
        check(w.dtype == torch.bfloat16 and torch.equal(w, t), "bfloat16 round trip")
        check(torch.equal(ck.read("x", torch=True), torch.arange(6)), "int64 round trip")
        check(torch.equal(ck.read("w", offset=(1, 1), extent=(2, 3), torch=True), t[1:3, 1:4]), "a box as torch")
    with tessera.open(trained) as ck:
        name = "layers.1.feed_forward.w2.weight"
        check(torch.equal(ck.read(name, torch=True), torch.from_numpy(ck.read(name))), "torch=True differs")

# 5. tessera.torch: a PyTorch Llama module with Hugging Face's names, filled from the
# checkpoint trained on 2 ranks, gives tessera's logits (tests/hf_llama.py's forward)
if torch is not None:
    import hf_llama
    import tessera.torch as tt

    with tessera.open(trained) as ck:
        a = dict(w.split("=", 1) for w in ck.blob("train.model").decode().split())
        C, L, NH, NKV, F, V = (int(a[k]) for k in ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim",
                                                 "vocab_size"))
        hd = C // NH
        check(float(a["rope_factor"]) == 0, "the trained model scales its rotary frequencies")
    lin = lambda i, o: torch.nn.Linear(i, o, bias=False).double()
    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.embed_tokens = torch.nn.Embedding(V, C).double()
    model.model.norm = torch.nn.Module()
    model.model.norm.weight = torch.nn.Parameter(torch.zeros(C, dtype=torch.float64))
    model.model.layers = torch.nn.ModuleList()
    for _ in range(L):
        blk = torch.nn.Module()
        blk.self_attn = torch.nn.Module()
        blk.self_attn.q_proj, blk.self_attn.k_proj = lin(C, NH * hd), lin(C, NKV * hd)
        blk.self_attn.v_proj, blk.self_attn.o_proj = lin(C, NKV * hd), lin(NH * hd, C)
        blk.mlp = torch.nn.Module()
        blk.mlp.gate_proj, blk.mlp.up_proj, blk.mlp.down_proj = lin(C, F), lin(C, F), lin(F, C)
        for nm in ("input_layernorm", "post_attention_layernorm"):
            setattr(blk, nm, torch.nn.Module())
            getattr(blk, nm).weight = torch.nn.Parameter(torch.zeros(C, dtype=torch.float64))
        model.model.layers.append(blk)
    model.lm_head = lin(C, V)
    loaded = tt.load_state_dict(model, trained)
    check(len(loaded) == 9 * L + 3, "load_state_dict filled %d tensors, not %d" % (len(loaded), 9 * L + 3))
    cfg = {"hidden_size": C, "num_attention_heads": NH, "num_key_value_heads": NKV, "rms_norm_eps": float(a["norm_eps"]),
           "num_hidden_layers": L, "rope_theta": float(a["rope_theta"]), "architectures": ["LlamaForCausalLM"],
           "rope_scaling": None, "tie_word_embeddings": False}
    tokens = [int(x) for x in sys.argv[4].split(",")]
    ref = hf_llama.forward(cfg, model.state_dict(), tokens)
    got = torch.from_numpy(np.fromfile(sys.argv[3], dtype="<f4").astype(np.float64)).view(len(tokens), -1)
    err = ((got - ref).norm() / ref.norm()).item()
    check(err <= 1e-5, "the PyTorch module's logits differ from tessera logits: relative error %.3g" % err)
    # a box of q in Hugging Face's order is that part of the whole
    sd = {"model.layers.1.self_attn.q_proj.weight": torch.zeros(3 * hd // 2, 40)}
    tt.load_state_dict(sd, trained, boxes={"model.layers.1.self_attn.q_proj.weight": ((hd + 3, 16), (3 * hd // 2, 40))})
    whole = model.model.layers[1].self_attn.q_proj.weight.detach().float()
    check(torch.equal(sd["model.layers.1.self_attn.q_proj.weight"], whole[hd + 3:hd + 3 + 3 * hd // 2, 16:56]),
          "a box of q_proj differs from that part of the whole")
    # TorchTitan's names as the checkpoint has them, a bf16 target converted
    sd = {"layers.0.feed_forward.w2.weight": torch.zeros(C, F, dtype=torch.bfloat16)}
    tt.load_state_dict(sd, trained)
    with tessera.open(trained) as ck:
        check(torch.equal(sd["layers.0.feed_forward.w2.weight"],
                          torch.from_numpy(ck.read("layers.0.feed_forward.w2.weight")).to(torch.bfloat16)),
              "a bf16 target: not the f32 weights rounded")
    raises(lambda: tt.load_state_dict({"lm_head.weight": torch.zeros(V, C + 1)}, trained), "lm_head.weight",
           "output.weight", "(%d, %d)" % (V, C))
    raises(lambda: tt.load_state_dict({"model.nothing.weight": torch.zeros(2)}, trained), "model.nothing.weight")
    # strict=False: the rest loaded, and what was skipped said both ways
    sd = {"norm.weight": torch.zeros(C), "model.nothing.weight": torch.zeros(2)}
    got = tt.load_state_dict(sd, trained, strict=False)
    with tessera.open(trained) as ck:
        rest = sorted(set(ck.tensors) - {"norm.weight"})
        check(list(got) == ["norm.weight"] and torch.equal(sd["norm.weight"], torch.from_numpy(ck.read("norm.weight")))
              and got.missing_keys == ["model.nothing.weight"] and got.unexpected_keys == rest,
              "strict=False: filled %s, missing %s, unexpected %d (expected %d)"
              % (list(got), got.missing_keys, len(got.unexpected_keys), len(rest)))
    raises(lambda: tt.load_state_dict({"norm.weight": torch.zeros(C, dtype=torch.int32)}, trained), "norm.weight",
           "int32")
    tt.save(model.state_dict(), os.path.join(d, "hf", "step-00000009"), step=9)
    with tessera.open(os.path.join(d, "hf")) as ck:
        check(ck.step == 9 and torch.equal(torch.from_numpy(ck.read("lm_head.weight")), model.lm_head.weight.detach()),
              "tessera.torch.save: lm_head.weight does not read back")

if fails:
    sys.exit(1)
print("python: %d dtypes round trip, boxes, blobs, errors, the trained checkpoint as format_reader.py reads it%s"
      % (len(arrays), ", PyTorch in and out, a Hugging Face-named module with tessera's logits (relative error %.2g)"
         % err if torch is not None else " (numpy only, no torch)"))
