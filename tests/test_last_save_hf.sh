#!/bin/sh
# checkpoint.last_save_in_hf (TorchTitan's): the last save of a run is also a
# Hugging Face folder, ROOT/hf-step-N (config.json, the tokenizer, safetensors in
# checkpoint.export_dtype), written from the model-only last save by the
# library's export: its digests verify against that save, its tensors are
# those of the model-only checkpoint (through transformers' safetensors reader);
# it needs last_save_model_only (TorchTitan's rule); a run that ends without a
# model-only save of its last step (resumed there, the save removed) says so and
# writes none.
. "$TSR_ROOT/tests/common.sh"
cd "$TSR_TMP" || exit 1
need_py
"$T" data prep --out data --synthetic 64k >/dev/null || fail "data prep"
JOB="--config $TSR_ROOT/train/configs/debug.toml --job.dump_folder=run --training.steps=3 --training.seq_len=32
    --training.dataset=tokens --training.dataset_path=data --checkpoint.enable=true --checkpoint.interval=3"
expect 0 "train with last_save_in_hf" "$T" train $JOB --checkpoint.last_save_in_hf=true --checkpoint.export_dtype=bfloat16
H=run/checkpoint/hf-step-00000003
grep -q "Hugging Face folder (checkpoint.last_save_in_hf): $H: " out.txt || fail "the folder not said: $(tail -3 out.txt)"
for f in config.json tokenizer.json model.safetensors; do [ -f "$H/$f" ] || fail "no $H/$f"; done
expect 0 "its digests verify" "$T" verify-export "$H"
with_lib "$TSR_PY" - "$H" run/checkpoint/model-step-00000003 <<'PYEOF' || fail "the folder's tensors are not the model-only save's"
import sys, torch, tessera, tessera.torch as tt
from safetensors.torch import load_file
st = load_file(sys.argv[1] + "/model.safetensors")
with tessera.open(sys.argv[2]) as ck:
    assert len(st) == len(ck.tensors), (len(st), len(ck.tensors))
    n = 0
    for name in ck.tensors:
        hf = tt.hf_name(name)
        assert st[hf].dtype == torch.bfloat16, (hf, st[hf].dtype)
        if "wq" in name or "wk" in name:
            continue  # q and k are permuted to Hugging Face's rotary order
        assert torch.equal(st[hf], ck.read(name, torch=True)), name
        n += 1
    assert n > 0
PYEOF
expect 2 "last_save_in_hf without last_save_model_only" "$T" train $JOB --checkpoint.last_save_in_hf=true \
    --checkpoint.last_save_model_only=false
grep -q "last_save_in_hf needs checkpoint.last_save_model_only" err.txt || fail "the rule not said: $(cat err.txt)"
# resumed at its last step: nothing trained; the model-only save of that step
# (an earlier run's) is there, so is the folder again; without it, none
rm -rf "$H"
expect 0 "a resume with nothing to train" "$T" train $JOB --checkpoint.last_save_in_hf=true
expect 0 "the folder written again from the model-only save there" "$T" verify-export "$H"
rm -rf "$H" run/checkpoint/model-step-00000003
expect 0 "a resume with nothing to train, no model-only save" "$T" train $JOB --checkpoint.last_save_in_hf=true
grep -q "no model-only save of step 3" out.txt || fail "a run with no model-only save: $(tail -3 out.txt)"
[ ! -e "$H" ] || fail "a folder written without a model-only save"
finish "last_save_in_hf: a Hugging Face folder from the last save, verified, bf16, the model's tensors"
