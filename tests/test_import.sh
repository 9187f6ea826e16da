#!/bin/sh
# tessera import: a Hugging Face Llama written by a PyTorch-free reference
# writer (shapes of no named flavor; one file or shards with an index; f32 or
# bf16; tied embeddings) becomes a tessera checkpoint in any layout whose
# `tessera logits` equal those of an independent Hugging Face-convention Llama
# on the same files within 1e-5; export gives the same tensors back; training
# continues from an import; damaged files and configs fail with a clear error.
. "$TSR_ROOT/tests/mpi.sh"
cd "$TSR_TMP" || exit 1
need_py
PY=$TSR_PY
TOK=72,101,108,108,111,44,32,119,111,114,108,100,256,84,104,299
check() { # NAME HFDIR IMPORT-OPTIONS...
    name=$1 hf=$2; shift 2
    "$T" import "$hf" "$name" "$@" >/dev/null || { fail "import $name"; return; }
    "$T" ckpt verify "$name" >/dev/null || fail "$name does not verify"
    "$T" logits "$name" --tokens $TOK --out "$name.bin" || { fail "logits $name"; return; }
    $PY "$TSR_ROOT/tests/hf_llama.py" "$hf" $TOK "$name.bin" || fail "$name: logits differ from the reference"
}
$PY "$TSR_ROOT/tests/make_hf.py" good one || fail "make_hf one"
$PY "$TSR_ROOT/tests/make_hf.py" good sharded --shards 3 --dtype BF16 || fail "make_hf sharded"
$PY "$TSR_ROOT/tests/make_hf.py" good tied --tied || fail "make_hf tied"
check I1 one
check I2 sharded --layout dp_shard=2,tp=2
check I3 tied --layout pp=2
# export of an import gives the same tensors back
"$T" export I1 --format safetensors back >/dev/null || fail "export I1"
$PY - <<'PYEOF' || fail "export(import(x)) differs from x"
import sys
sys.path.insert(0, __import__("os").environ["TSR_ROOT"] + "/tests")
import hf_llama, torch
a, b = hf_llama.read_safetensors("one/model.safetensors"), hf_llama.read_safetensors("back/model.safetensors")
assert sorted(a) == sorted(b), sorted(set(a) ^ set(b))
bad = [n for n in a if not torch.equal(a[n].float(), b[n].float())]
assert not bad, bad
PYEOF
# training continues from an import of the debug shapes
"$T" train --config "$TSR_ROOT/train/configs/debug.toml" --job.dump_folder=run --training.steps=2 \
    --training.seq_len=16 --checkpoint.enable=true --checkpoint.interval=2 >/dev/null 2>&1 || fail "train debug"
"$T" export run/checkpoint/step-00000002 --format safetensors dbg >/dev/null || fail "export debug"
"$T" import dbg dbgimp --layout tp=2 >/dev/null || fail "import debug"
"$T" train --config "$TSR_ROOT/train/configs/debug.toml" --job.dump_folder=cont --training.steps=2 \
    --training.seq_len=16 --checkpoint.initial_load_path=dbgimp >cont.log 2>&1 || fail "train from an import"
grep -q "resumed from dbgimp.*model only" cont.log || fail "training did not start from the import"
# and from an import of shapes of no named flavor, with the shapes taken from it
"$T" train --config "$TSR_ROOT/train/configs/debug.toml" --model.flavor=checkpoint --job.dump_folder=cont2 \
    --training.steps=2 --training.seq_len=16 --checkpoint.initial_load_path=I2 >cont2.log 2>&1 ||
    { fail "train from a custom-shape import"; tail -3 cont2.log >&2; }
grep -q "model hf:" cont2.log && grep -q "resumed from I2" cont2.log || fail "custom shapes not taken from the import"
# damaged inputs: each refused with its own reason, naming the file, nothing committed
while read -r kind why; do
    $PY "$TSR_ROOT/tests/make_hf.py" bad "bad_$kind" "$kind" || fail "make_hf bad $kind"
    expect 1 "import of $kind" "$T" import "bad_$kind" "out_$kind"
    grep -q "$why" err.txt || fail "$kind: the reason '$why' is not said: $(cat err.txt)"
    [ -e "out_$kind/MANIFEST" ] && fail "$kind: committed a checkpoint"
done <<'EOF2'
past_end bad_past_end/model.safetensors: .*past the end
overlap bad_overlap/model.safetensors: model.norm.weight overlaps
hole bad_hole/model.safetensors: a hole of 8 bytes
reversed bad_reversed/model.safetensors: model.norm.weight: bad data_offsets
header_len bad_header_len/model.safetensors: header length
wrong_shape model.embed_tokens.weight: shape or dtype
missing_key bad_missing_key/config.json: no number num_attention_heads
bad_json bad_bad_json/config.json: not a JSON object
missing_shard bad_missing_shard/model-00002-of-00002.safetensors: missing
EOF2
finish "import: logits equal the reference in three layouts, round trip exact, errors clear"
