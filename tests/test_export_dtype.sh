#!/bin/sh
# tessera export keeps the checkpoint's dtype unless --dtype is given: a bf16
# (or f16) checkpoint becomes bf16 (f16) safetensors and a GGUF file with bf16
# (f16) matrices and f32 norms, the same bytes as with --dtype bf16 (f16); an
# f32 checkpoint stays f32; --dtype still chooses.
. "$TSR_ROOT/tests/common.sh"
cd "$TSR_TMP" || exit 1
need_py
PY=$TSR_PY
"$T" data prep --out data --synthetic 64k >/dev/null || fail "data prep"
"$T" train --config "$TSR_ROOT/train/configs/debug.toml" --job.dump_folder=run --training.steps=1 \
    --training.seq_len=32 --training.dataset=tokens --training.dataset_path=data --checkpoint.enable=true \
    --checkpoint.interval=1 --checkpoint.last_save_model_only=true >train.log 2>&1 || { fail "train"; tail -5 train.log >&2; }
A=run/checkpoint/model-step-00000001
expect 0 "reshard to bf16" "$T" reshard "$A" B16 --layout dp_shard=1 --dtype bf16
expect 0 "reshard to f16" "$T" reshard "$A" H16 --layout dp_shard=1 --dtype f16

# st_dtypes DIR: the set of dtypes in DIR/model.safetensors, and config.json's torch_dtype
st_dtypes() {
    $PY - "$1" <<'PYEOF'
import json, struct, sys
d = sys.argv[1]
b = open(d + "/model.safetensors", "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
print(" ".join(sorted({v["dtype"] for k, v in h.items() if k != "__metadata__"})),
      json.load(open(d + "/config.json"))["torch_dtype"])
PYEOF
}
check_st() { # DIR WANT
    got=$(st_dtypes "$1")
    [ "$got" = "$2" ] || fail "$1: tensors and torch_dtype are '$got', want '$2'"
}
for c in "B16 BF16 bfloat16 bf16" "H16 F16 float16 f16" "$A F32 float32 f32"; do
    set -- $c
    ck=$1 st=$2 torch=$3 dt=$4 out=$(echo "$dt" | tr a-z A-Z)
    expect 0 "export $ck (no --dtype)" "$T" export "$ck" --format safetensors "hf-$dt"
    grep -q ", $dt\$" out.txt || fail "export $ck: the summary does not say $dt: $(cat out.txt)"
    check_st "hf-$dt" "$st $torch"
    # bit for bit what --dtype DT writes
    expect 0 "export $ck --dtype $dt" "$T" export "$ck" --format safetensors "hf-$dt-explicit" --dtype "$dt"
    cmp -s "hf-$dt/model.safetensors" "hf-$dt-explicit/model.safetensors" ||
        fail "export $ck: the default differs from --dtype $dt"
    # GGUF: matrices in the checkpoint's dtype, norms in f32, values the checkpoint's
    expect 0 "export $ck gguf (no --dtype)" "$T" export "$ck" --format gguf "m-$dt.gguf"
    grep -q "matrices $dt" out.txt || fail "gguf export $ck: matrices not $dt: $(cat out.txt)"
    $PY "$TSR_ROOT/tests/gguf_check.py" "m-$dt.gguf" "hf-$dt" "$dt" >/dev/null || fail "m-$dt.gguf does not check as $dt"
done
# --dtype still chooses: a bf16 checkpoint written as f32
expect 0 "export B16 --dtype f32" "$T" export B16 --format safetensors hf-up --dtype f32
check_st hf-up "F32 float32"
expect 0 "export B16 gguf --dtype f32" "$T" export B16 --format gguf up.gguf --dtype f32
$PY "$TSR_ROOT/tests/gguf_check.py" up.gguf hf-up f32 >/dev/null || fail "up.gguf does not check as f32"
finish "export dtype: bf16, f16 and f32 checkpoints keep their dtype; --dtype overrides"
