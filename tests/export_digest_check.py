"""export_digest_check.py EXPORT CKPT: the provenance and digests that `tessera
export` records (FORMAT.md 13), recomputed by readers that share no code with
tessera: a safetensors folder or file parsed here from its format, a GGUF file
through the gguf library (GGUFReader), each tensor's digest computed by
tests/format_reader.py (NumPy, from FORMAT.md 4.4) over its bytes in the file's
order; the step and MANIFEST hash against CKPT's MANIFEST, and each source
digest against the MANIFEST's digest of the tensor it names (read by
format_reader.py too). Prints what it checked; exits 1 naming the first
difference."""
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import format_reader  # noqa: E402

CODES = {"F32": 1, "F16": 2, "BF16": 3, "F64": 4, "I8": 7, "I16": 8, "I32": 9, "I64": 10, "U8": 11, "BOOL": 15}
GGML = {0: 1, 1: 2, 30: 3}  # ggml F32, F16, BF16 -> FORMAT.md's dtype codes
UINT = {1: "<u1", 2: "<u2", 4: "<u4", 8: "<u8"}
SIZES = {1: 4, 2: 2, 3: 2, 4: 8, 7: 1, 8: 2, 9: 4, 10: 8, 11: 1, 15: 1}


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def safetensors_tensors(path):
    """(metadata, [(name, code, raw bytes)]) of one safetensors file."""
    b = open(path, "rb").read()
    hl, = struct.unpack_from("<Q", b, 0)
    h = json.loads(b[8:8 + hl])
    meta = h.pop("__metadata__", {})
    out = [(n, CODES[e["dtype"]], b[8 + hl + e["data_offsets"][0]:8 + hl + e["data_offsets"][1]]) for n, e in h.items()]
    return meta, out


def gguf_tensors(path):
    from gguf import GGUFReader
    r = GGUFReader(path)
    meta = {k: bytes(f.parts[-1]).decode() for k, f in r.fields.items() if k.startswith("tessera.")}
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    out = []
    for t in r.tensors:  # the file's bytes in its own order: ne[0] fastest
        out.append((t.name, GGML[int(t.tensor_type)], bytes(raw[t.data_offset:t.data_offset + t.n_bytes])))
    return meta, out


def main():
    export, ckdir = sys.argv[1], sys.argv[2]
    ck = format_reader.Checkpoint(ckdir)
    manifest = open(os.path.join(ckdir, "MANIFEST"), "rb").read()
    want_hash = "%016x" % struct.unpack_from("<Q", manifest, len(manifest) - 8)[0]
    src = {t["name"]: t for t in ck.tensors}
    if os.path.isdir(export):
        idx = os.path.join(export, "model.safetensors.index.json")
        files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) else ["model.safetensors"]
        parts = [safetensors_tensors(os.path.join(export, f)) for f in files]
    elif open(export, "rb").read(4) == b"GGUF":
        parts = [gguf_tensors(export)]
    else:
        parts = [safetensors_tensors(export)]
    n = tied = 0
    for meta, tensors in parts:
        if meta.get("tessera.step") != str(ck.step) or meta.get("tessera.manifest_xxh3") != want_hash:
            fail("step %s, MANIFEST hash %s recorded; the checkpoint's are %d, %s" %
                 (meta.get("tessera.step"), meta.get("tessera.manifest_xxh3"), ck.step, want_hash))
        for name, code, data in tensors:
            elems = np.frombuffer(data, dtype=UINT[SIZES[code]])
            rec = meta.get("tessera.tensor_digest." + name)
            got = format_reader.digest(name, code, elems)
            if rec is None or int(rec, 16) != got:
                fail("%s: digest %016x of its bytes, recorded %s" % (name, got, rec))
            n += 1
            s = meta.get("tessera.source." + name)
            if s is not None:
                sd = int(meta["tessera.source_tensor_digest." + name], 16)
                if s not in src or src[s]["digest"] != sd or src[s]["dtype"] != code:
                    fail("%s: source %s, digest %016x: not the checkpoint's tensor" % (name, s, sd))
                if format_reader.digest(s, code, elems) != sd:
                    fail("%s: its bytes under the source's name do not have the source's digest" % name)
                tied += 1
    print("%s: %d digests recomputed, %d tied to the checkpoint's tensors, step %d, MANIFEST %s" %
          (export, n, tied, ck.step, want_hash))


main()
