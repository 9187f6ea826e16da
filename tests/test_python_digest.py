"""test_python_digest.py DIR: the Python package (python/tessera) holds every
whole-tensor read to the tensor's MANIFEST digest (FORMAT.md 4.4). In DIR: a
checkpoint of every dtype reads back with its digests checked, each equal to
the one tests/format_reader.py computes in NumPy from the spec; then the data
of one tensor altered consistently - a checkpoint whose tensor w holds other
values, its frames hashed for them, under the original's digest
(tests/set_digest.py) - is refused naming w and both digests, while its other
tensors, a part of w and reads with the check off go through, and ck.verify()
reports it too. The check is the library's (tsr_ckpt_read_whole; a frame
stored or decoded wrong, and data landed in the wrong place, are
tests/test_corrupt.c's and test_load_digest.sh's). Prints "FAIL: ..." for each failed check, exits 1 if any."""
import os
import shutil
import sys

import numpy as np

import tessera

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import format_reader  # noqa: E402
import set_digest  # noqa: E402
from pycheck import check, fails, raises  # noqa: E402

d = sys.argv[1]
rng = np.random.default_rng(3)
arrays = {
    "w": rng.standard_normal((16, 24)).astype(np.float32),
    "h": rng.standard_normal((3, 5)).astype(np.float16),
    "b": (rng.integers(0, 65535, (4, 8), dtype=np.uint16), "bf16"),
    "i": rng.integers(-2**62, 2**62, 7, dtype=np.int64),
    "m": rng.integers(0, 2, 9).astype(np.bool_),
    "s": np.float64(0.25),
    "z": np.zeros((0, 3), dtype=np.float32),
}
A = os.path.join(d, "A/step-00000005")
tessera.save(A, arrays, step=5)

# 1. every tensor reads back, its digest checked, and the digest is the spec's
codes = {"w": 1, "h": 2, "b": 3, "i": 10, "m": 15, "s": 4, "z": 1}
with tessera.open(A) as ck:
    for name, v in arrays.items():
        want = v[0] if isinstance(v, tuple) else np.asarray(v)
        got = ck.read(name)
        check(got.shape == want.shape and np.array_equal(got, want), "%s does not read back" % name)
        rec = ck.digest(name)
        check(rec is not None, "%s: no digest recorded" % name)
        check(rec == format_reader.digest(name, codes[name], want),
              "%s: MANIFEST digest %s, the spec's %016x" % (name, rec, format_reader.digest(name, codes[name], want)))

# 2. w altered consistently: B holds other values of w (one element), its frames
# hashed for them; its MANIFEST is given A's digest of w
B = os.path.join(d, "B/step-00000005")
altered = dict(arrays)
altered["w"] = arrays["w"].copy()
altered["w"][7, 11] += 1.0
tessera.save(B, altered, step=5)
with tessera.open(A) as ck:
    original = ck.digest("w")
new = set_digest.set_digest(B, "w", original)
check(new != original, "the altered w has the original's digest")
with tessera.open(B) as ck:
    raises(lambda: ck.read("w"), "tensor w", "%016x" % new, "%016x" % original, "check_digest=False) skips")
    raises(lambda: ck.read("w", bf16="float32"), "tensor w")
    raises(lambda: ck.read_many([("h", None, None, None), ("w", None, None, None)]), "tensor w", "%016x" % new)
    check(np.array_equal(ck.read_many([("w", None, None, None)], check_digest=False)[0], altered["w"]),
          "read_many(check_digest=False) does not read w")
    check(np.array_equal(ck.read("w", check_digest=False), altered["w"]), "check_digest=False does not read w")
    check(np.array_equal(ck.read("w", offset=(0, 0), extent=(4, 24)), altered["w"][:4]), "a part of w is refused")
    check(np.array_equal(ck.read("h"), arrays["h"]), "another tensor of B is refused")
    raises(lambda: ck.verify(), "w", "digest")
    try:
        import torch  # noqa: F401
        raises(lambda: ck.read("w", torch=True), "tensor w")
    except ImportError:
        pass
with tessera.open(B, check_digests=False) as ck:
    check(np.array_equal(ck.read("w"), altered["w"]), "open(check_digests=False) does not read w")
    raises(lambda: ck.read("w", check_digest=True), "tensor w")


shutil.rmtree(os.path.join(d, "A")), shutil.rmtree(os.path.join(d, "B"))
print("python digests: %d checks failed" % len(fails) if fails else "python digests: every check passed")
sys.exit(1 if fails else 0)
