#!/bin/sh
# tessera export and tessera logits: a model trained on 4 ranks (dp_shard=2,
# tp=2), resharded offline to one model-only bf16 file set, and exported to
# Hugging Face's layout (safetensors, sharded or not, f32 or bf16), is loaded by
# an independent PyTorch Llama written in Hugging Face's rotary convention that
# reads the files directly: its logits equal tessera logits within 1e-5. GGUF
# exports (f32, bf16, f16) are read back field by field by an independent reader,
# and by the gguf library (GGUFReader) against the checkpoint's tensors.
. "$TSR_ROOT/tests/mpi.sh"
cd "$TSR_TMP" || exit 1
need_py
PY=$TSR_PY
CFG="$TSR_ROOT/train/configs/debug.toml"
TOK=72,101,108,108,111,44,32,119,111,114,108,100,256,84,104,101
"$T" data prep --out data --synthetic 256k >/dev/null || fail "data prep"
run_np 4 "$T" train --config "$CFG" --job.dump_folder=run --training.steps=4 --training.seq_len=32 \
    --training.dataset=tokens --training.dataset_path=data --checkpoint.enable=true --checkpoint.interval=4 \
    --checkpoint.last_save_model_only=false --parallelism.tensor_parallel_degree=2 >train.log 2>&1 ||
    { fail "train"; tail -5 train.log >&2; }
A=run/checkpoint/step-00000004
# f32, one file, straight from the 4-rank layout
expect 0 "export f32" "$T" export "$A" --format safetensors hf32
expect 0 "logits A" "$T" logits "$A" --tokens $TOK --out a.bin
$PY "$TSR_ROOT/tests/hf_llama.py" hf32 $TOK a.bin || fail "f32 export: logits differ"
# the done-when path: reshard to one bf16 model-only set, export it in shards
expect 0 "reshard" "$T" reshard "$A" B --layout dp_shard=1 --only model --dtype bf16
expect 0 "export bf16" "$T" export B --format safetensors hf16 --dtype bf16 --shard-size 1M
[ -f hf16/model.safetensors.index.json ] || fail "no index for a sharded export"
expect 0 "logits B" "$T" logits B --tokens $TOK --out b.bin
$PY "$TSR_ROOT/tests/hf_llama.py" hf16 $TOK b.bin || fail "bf16 export: logits differ"
# against the f32 source's logits, the bf16 copy is as close as bf16 weights allow,
# and not within the f32 tolerance: the comparison can fail
$PY "$TSR_ROOT/tests/hf_llama.py" hf16 $TOK a.bin 2e-2 >/dev/null || fail "bf16 export far from the f32 logits"
$PY "$TSR_ROOT/tests/hf_llama.py" hf16 $TOK a.bin >/dev/null && fail "bf16 weights matched f32 logits"
# the last position's logits printed as text equal the file's
"$T" logits "$A" --tokens $TOK >last.txt || fail "logits as text"
$PY - <<'PYEOF' || fail "printed logits differ from the file"
import numpy as np
a = np.fromfile("a.bin", dtype="<f4").reshape(16, -1)
t = np.loadtxt("last.txt")
assert t.shape == (a.shape[1],) and np.allclose(t, a[-1], rtol=1e-6, atol=0), (t[:3], a[-1][:3])
PYEOF
# GGUF: every field and tensor read back by an independent reader, against the spec
# and against the Hugging Face export of the same checkpoint
for dt in f32 bf16 f16; do
    expect 0 "export gguf $dt" "$T" export "$A" --format gguf "m-$dt.gguf" --dtype $dt
    $PY "$TSR_ROOT/tests/gguf_check.py" "m-$dt.gguf" hf32 $dt || fail "gguf $dt does not check"
    # and by llama.cpp's own gguf library, against the checkpoint itself
    with_lib $PY "$TSR_ROOT/tests/gguf_lib_check.py" "m-$dt.gguf" "$A" $dt || fail "gguf $dt: gguf's GGUFReader"
done
# the check can fail: one byte of a tensor's data changed
cp m-f32.gguf bad.gguf
printf '\001' | dd of=bad.gguf bs=1 seek=$(($(wc -c <bad.gguf) - 3)) conv=notrunc 2>/dev/null
with_lib $PY "$TSR_ROOT/tests/gguf_lib_check.py" bad.gguf "$A" f32 >out.txt 2>&1 && fail "a changed byte passes GGUFReader's check"
grep -q "output.weight: bytes differ" out.txt || fail "a changed byte of output.weight is not named: $(cat out.txt)"
# errors
expect 2 "bad format" "$T" export "$A" --format onnx x
expect 2 "no tokens" "$T" logits "$A"
expect 1 "token past the vocabulary" "$T" logits "$A" --tokens 1,100000
grep -q "vocabulary" err.txt || fail "no reason for the bad token"
# --tokens takes decimal ids and single commas, nothing else
for bad in "1, 2" " 1" "1,,2" "1,2," ",1" "+1" "1 2" "0x10" "-1"; do
    expect 2 "--tokens '$bad'" "$T" logits "$A" --tokens "$bad"
    grep -q "single commas" err.txt || fail "no reason for --tokens '$bad'"
done
expect 2 "--tokens and --text" "$T" logits "$A" --tokens 1 --text a
# --text: its bytes are the tokens
"$T" logits "$A" --text "Hello, world" >text.txt || fail "logits --text"
"$T" logits "$A" --tokens 72,101,108,108,111,44,32,119,111,114,108,100 >ids.txt || fail "logits --tokens"
cmp -s text.txt ids.txt || fail "--text and the same bytes as --tokens give other logits"
# the context length (training.seq_len 32) bounds the prompt and what is generated
grep -q '"max_position_embeddings": 32,' hf32/config.json || fail "config.json: max_position_embeddings is not 32"
expect 0 "32 tokens" "$T" logits "$A" --text "$(printf '%032d' 0)"
expect 1 "33 tokens" "$T" logits "$A" --text "$(printf '%033d' 0)"
grep -q "context length is 32" err.txt || fail "no reason for a prompt past the context length"
expect 1 "30 tokens and 3 generated" "$T" logits "$A" --text "$(printf '%030d' 0)" --generate 3
grep -q "context length is 32" err.txt || fail "no reason for a generation past the context length"
expect 0 "30 tokens and 2 generated" "$T" logits "$A" --text "$(printf '%030d' 0)" --generate 2
grep -qE '^[0-9]+,[0-9]+$' out.txt || fail "--generate 2 does not print two ids: $(cat out.txt)"
expect 2 "--generate 0" "$T" logits "$A" --text a --generate 0
run_np 1 "$T" ckpt synth S --bytes 1M >/dev/null
expect 1 "not a model checkpoint" "$T" export S --format safetensors x
grep -q "train.model" err.txt || fail "no reason for a non-model checkpoint"
finish "export: safetensors (f32, sharded bf16) load in a PyTorch Llama with tessera's logits"
