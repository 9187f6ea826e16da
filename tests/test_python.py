"""test_python.py DIR TRAINED: the Python package (python/tessera) against the
library and against tests/format_reader.py, an independent reader of FORMAT.md.
DIR: a scratch folder; TRAINED: a checkpoint root written by `tessera train`
on 2 ranks (tp=2). Prints "FAIL: ..." for each failed check, exits 1 if any."""
import os
import sys

import numpy as np

import tessera

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import format_reader  # noqa: E402

fails = []


def check(ok, what):
    if not ok:
        fails.append(what)
        print("FAIL: " + what)


def raises(fn, *words):
    """fn() raises tessera.Error whose message holds every word."""
    try:
        fn()
    except tessera.Error as e:
        msg = str(e)
        check(all(w in msg for w in words), "error %r lacks %s" % (msg, words))
        return msg
    check(False, "no error where one holding %s was due" % (words,))
    return ""


d, trained = sys.argv[1], sys.argv[2]
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
    ck.verify()
    raises(lambda: ck.read("nope"), step_dir, "no tensor named 'nope'")
    raises(lambda: ck.read("f32", offset=(4, 0), extent=(2, 7)), "f32", "outside")
    raises(lambda: ck.read("f32", offset=(0,), extent=(1,)), "f32", "2 dims")
    raises(lambda: ck.blob("note", rank=3), "no blob 'note' of rank 3")
# the independent reader agrees, bit for bit
ref = format_reader.Checkpoint(step_dir)
for i, t in enumerate(ref.tensors):
    name = t["name"]
    want = ref.tensor(i)
    got = ck_val = tessera.open(step_dir).read(name)
    check(np.asarray(got).tobytes() == np.asarray(want).tobytes(), "%s: not what format_reader.py reads" % name)

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

# 4. PyTorch, where it imports: tensors out (bfloat16 for bf16) and in
try:
    import torch
except ImportError:
    torch = None
    print("SKIP: torch does not import: the PyTorch checks are skipped")
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

if fails:
    sys.exit(1)
print("python: %d dtypes round trip, boxes, blobs, errors, the trained checkpoint as format_reader.py reads it%s"
      % (len(arrays), ", PyTorch" if torch is not None else ""))
