#!/bin/sh
# tessera's checkpoints in Hugging Face transformers itself, on the CPU, under the
# tests' Python (tests/py_setup.sh): a debug model trained 20 steps, its
# safetensors export, a prompt and tessera's logits over it; then
# tests/hf_transformers.py checks that AutoTokenizer gives tessera's ids and text
# back, AutoModelForCausalLM tessera's logits, a LlamaForCausalLM filled by
# tessera.torch.load_state_dict from the checkpoint itself the same logits, and
# that tessera.torch.save of its state dict reads back bit for bit.
. "$TSR_ROOT/tests/common.sh"
cd "$TSR_TMP" || exit 1
need_py
printf ' A cat, caf\303\251  \342\202\254 .\n\tThe story of Alma' >text.txt
od -An -tu1 -v text.txt | tr -s ' \n' ',,' | sed 's/^,//;s/,$//' >ids.txt
"$T" data prep --out data --synthetic 64k >/dev/null || fail "data prep"
"$T" train --config "$TSR_ROOT/train/configs/debug.toml" --job.dump_folder=run --training.steps=20 \
    --training.dataset=tokens --training.dataset_path=data --checkpoint.enable=true --checkpoint.interval=20 \
    >train.log 2>&1 || { fail "train"; tail -5 train.log >&2; }
mv run/checkpoint/step-00000020 ckpt || fail "no step 20"
expect 0 "export safetensors" "$T" export ckpt --format safetensors hf --dtype f32
expect 0 "logits" "$T" logits ckpt --tokens "$(cat ids.txt)" --out ref.bin
with_lib "$TSR_PY" "$TSR_ROOT/tests/hf_transformers.py" "$TSR_TMP" || fail "tests/hf_transformers.py: exit $?"
finish "transformers: the export's tokenizer and logits, and the checkpoint through tessera.torch, as tessera's"
