#!/bin/sh
# test_export_digest.sh: the digests of exports and imports (FORMAT.md 13). A
# Hugging Face Llama imported (the checkpoint carries digests) and exported as
# safetensors (one file f32, shards bf16) and GGUF (f32, bf16): `tessera
# verify-export` finds every tensor OK, and an independent reader
# (tests/export_digest_check.py: the files parsed by their formats, digests by
# tests/format_reader.py) recomputes each recorded digest, the step, the MANIFEST
# hash and the source digests of the tensors an export keeps. One byte of one
# tensor changed in a safetensors file, a shard and a GGUF file: verify-export
# names it with both values and exits 1; import of the changed folder is refused
# naming the tensor, and nothing is committed. An import of an export has the
# source's digests wherever neither changed the tensor. A checkpoint whose data
# is not its MANIFEST's digest (set_digest.py: frames sound) exports nothing. An
# export of tessera before format 1.4 (1.2's digests under tessera.digest.NAME)
# is called neither changed nor verified, and imports.
# tsr-timeout: 120
. "$TSR_ROOT/tests/common.sh"
cd "${TSR_TMP:?}" || exit 1
need_py
PY=$TSR_PY
R=$TSR_ROOT/tests
export PYTHONPATH="$TSR_ROOT/python"
$PY "$R/make_hf.py" good hf0 >/dev/null || fail "make_hf"
expect 0 "import" "$T" import hf0 I1
"$T" ckpt info --json I1 | $PY -c '
import json, sys
t = json.load(sys.stdin)["tensors"]
assert t and all(x.get("digest") for x in t), "an imported tensor without a digest"' || fail "the import records no digests"

verify_ok() { # EXPORT NTENSORS
    expect 0 "verify-export $1" "$T" verify-export "$1"
    n=$(grep -c '^OK ' out.txt)
    [ "$n" = "$2" ] || fail "verify-export $1: $n tensors OK, not $2: $(head -3 out.txt)"
    grep -q "step 0, MANIFEST [0-9a-f]\{16\}: $2 tensor(s), $2 OK, 0 failed" out.txt || fail "verify-export $1: $(tail -1 out.txt)"
    $PY "$R/export_digest_check.py" "$1" I1 >chk.txt || fail "export_digest_check $1: $(cat chk.txt)"
}
expect 0 "export safetensors" "$T" export I1 --format safetensors st
verify_ok st 21
grep -q "tied to the checkpoint's tensors" chk.txt && ! grep -q " 0 tied" chk.txt || fail "no f32 tensor tied to its source"
expect 0 "export sharded bf16" "$T" export I1 --format safetensors sh --dtype bf16 --shard-size 64K
[ -f sh/model.safetensors.index.json ] || fail "no shards"
verify_ok sh 21
grep -q " 0 tied" chk.txt || fail "a bf16 export of an f32 checkpoint ties a tensor to its source"
expect 0 "export gguf f32" "$T" export I1 --format gguf m32.gguf
verify_ok m32.gguf 21
expect 0 "export gguf bf16" "$T" export I1 --format gguf m16.gguf --dtype bf16
verify_ok m16.gguf 21
# --json
"$T" verify-export --json m16.gguf | $PY -c '
import json, sys
d = json.load(sys.stdin)
assert d["format"] == "gguf" and d["step"] == 0 and d["ok"] == 21 and d["failed"] == 0, d
assert {t["status"] for t in d["tensors"]} == {"OK"} and any(t.get("source") for t in d["tensors"])' ||
    fail "verify-export --json"

# one byte of one tensor changed: the last tensor of each file
flip() { # FILE
    printf '\001' | dd of="$1" bs=1 seek=$(($(wc -c <"$1") - 3)) conv=notrunc 2>/dev/null
}
mismatch() { # EXPORT TENSOR
    expect 1 "verify-export of a changed $1" "$T" verify-export "$1"
    grep -q "^MISMATCH *$2: its bytes' digest is [0-9a-f]\{16\}, .* records [0-9a-f]\{16\}" out.txt ||
        fail "$1: $2 is not named with both digests: $(grep -v '^OK' out.txt | head -3)"
    [ "$(grep -vc '^OK ' out.txt)" = 2 ] || fail "$1: more than $2 reported: $(grep -v '^OK' out.txt)"
}
cp -r st bad && flip bad/model.safetensors
mismatch bad lm_head.weight
last=$(ls sh/model-*.safetensors | head -1)
cp -r sh badsh && flip "badsh/$(basename "$last")"
$PY -c '
import json, struct, sys
b = open(sys.argv[1], "rb").read(); hl, = struct.unpack_from("<Q", b); h = json.loads(b[8:8 + hl]); h.pop("__metadata__")
print(max(h, key=lambda n: h[n]["data_offsets"][1]))' "$last" >lastname.txt
mismatch badsh "$(cat lastname.txt)"
cp m32.gguf bad.gguf && flip bad.gguf
mismatch bad.gguf output.weight
# a GGUF file cut anywhere is refused, saying why, never read past its end
size=$(wc -c <m16.gguf)
for cut in 3 16 24 200 5000 $((size / 2)) $((size - 1)); do
    head -c $cut m16.gguf >cut.gguf
    expect 1 "verify-export of the first $cut bytes" "$T" verify-export cut.gguf
    [ -s err.txt ] || grep -q "^MISMATCH\|failed" out.txt || fail "the first $cut bytes: no reason given"
done
# a Hugging Face folder that tessera did not write: nothing to verify
expect 1 "verify-export without digests" "$T" verify-export hf0
grep -q "no tensor digest is recorded" err.txt || fail "no reason for a folder without digests: $(cat err.txt)"
expect 1 "verify-export of nothing" "$T" verify-export nothere
# an export of tessera before format 1.4 (its digests, another definition, under
# tessera.digest.NAME): nothing called changed; verify-export says why it checks
# nothing, and import takes it
cp -r st old
$PY -c '
import json, struct, sys
p = sys.argv[1]; b = open(p, "rb").read(); hl, = struct.unpack_from("<Q", b); h = json.loads(b[8:8 + hl])
m = h["__metadata__"]
for k in [k for k in m if k.startswith("tessera.tensor_digest.") or k.startswith("tessera.source_tensor_digest.")]:
    m[k.replace("tensor_digest", "digest")] = "%016x" % (int(m.pop(k), 16) ^ 1)
j = json.dumps(h).encode(); j += b" " * (-len(j) % 8)
open(p, "wb").write(struct.pack("<Q", len(j)) + j + b[8 + hl:])' old/model.safetensors || fail "old keys"
expect 1 "verify-export of an export before format 1.4" "$T" verify-export old
grep -q "^MISMATCH" out.txt && fail "an export before format 1.4 called changed: $(grep MISMATCH out.txt | head -2)"
grep -q "no tensor digest is recorded.*before format 1.4" err.txt || fail "no reason for an export before 1.4: $(cat err.txt)"
expect 0 "import of an export before format 1.4" "$T" import old I4

# import holds the files to their digests
expect 1 "import of a changed export" "$T" import bad I2
grep -q "tensor lm_head.weight: its data's digest is [0-9a-f]\{16\}, the file's metadata records [0-9a-f]\{16\}" err.txt ||
    fail "the import's refusal does not name the tensor and both digests: $(cat err.txt)"
[ -e I2 ] && fail "a refused import left I2"
expect 1 "import of a changed shard" "$T" import badsh I2
grep -q "tensor $(cat lastname.txt): its data's digest" err.txt || fail "the changed shard's tensor is not named: $(cat err.txt)"
# export then import: the same digests, except q and k (permuted twice, so equal too)
expect 0 "import of an export" "$T" import st I3
for c in I1 I3; do "$T" ckpt info --json $c >$c.json || fail "ckpt info $c"; done
$PY -c '
import json
a, b = ({t["name"]: t["digest"] for t in json.load(open(f))["tensors"]} for f in ("I1.json", "I3.json"))
assert a == b, [n for n in a if a[n] != b.get(n)]' || fail "export and import changed a digest"

# a checkpoint whose data is not its MANIFEST digest exports nothing
cp -r I1 Ibad
$PY "$R/set_digest.py" Ibad norm.weight 0123456789abcdef >/dev/null || fail "set_digest"
expect 1 "export of a checkpoint whose data is not its digest" "$T" export Ibad --format gguf x.gguf
grep -q "tensor norm.weight: the data read has digest [0-9a-f]\{16\}, its MANIFEST records 0123456789abcdef" err.txt ||
    fail "export's refusal: $(cat err.txt)"
[ -e x.gguf ] && fail "a refused export left x.gguf"
expect 1 "safetensors export of it" "$T" export Ibad --format safetensors xs
[ -e xs/model.safetensors ] && fail "a refused export left a file"
finish "exports record and prove their digests; import and verify-export check them"
