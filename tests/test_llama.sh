#!/bin/sh
# GGUF exports in the real llama.cpp: a debug model trained for a few steps is
# exported as GGUF in f32, bf16 and f16, with and without Llama 3.1 rope scaling
# (the same weights imported back from a Hugging Face config that asks for it),
# and loaded by llama.cpp's own library (built from the source that the
# llama-cpp-python 0.3.36 sdist vendors, CPU only, by tests/llama_setup.sh into a
# cache outside the repository). For each file tests/llama_check.c checks a text
# prompt with spaces, a leading space, double spaces, a tab, a newline, non-ASCII
# UTF-8 and " ." (which llama.cpp's default pre-tokenizer would rewrite):
#   - llama.cpp tokenizes it into exactly the ids of `tessera data prep`, with no
#     BOS, and detokenizes them back to the same bytes; no tokenizer warning;
#   - the logits of every position (the text's and the generated tokens') agree
#     with `tessera logits --out` of the same weights (1e-5 relative with f32
#     weights; f16 and bf16 files against the checkpoint resharded to that dtype,
#     within the rounding of llama.cpp's f16/bf16 products), and the f16 file
#     against the f32 logits fails 1e-5;
#   - greedy decoding of 50 tokens from the text equals `tessera logits --text
#     ... --generate 50` (f32 files: all 50; f16 and bf16 files: up to a near-tie
#     that their rounding may turn, see tests/llama_check.c), and its text is
#     those ids' bytes.
# The f32 file rewritten by the gguf library's own tool (gguf_new_metadata, a new
# description) passes the same checks. The safetensors export of the same
# checkpoint does the same with its tokenizer files (tests/hf_generate.py).
# The context length of the checkpoint (its training.seq_len, or the imported
# max_position_embeddings) is the GGUF's and config.json's, and stays when a job
# resumes the model at a shorter length.
. "$TSR_ROOT/tests/common.sh"
cd "$TSR_TMP" || exit 1
need_py
LL=$(sh "$TSR_ROOT/tests/llama_setup.sh") || { echo "FAIL: llama.cpp could not be installed for the test (see above)" >&2; exit 1; }
cc -std=c11 -O1 -g -Wall -Wextra -Werror -I"$LL/include" "$TSR_ROOT/tests/llama_check.c" \
    "$LL/lib/libllama.so" "$LL/lib/libggml.so" "$LL/lib/libggml-base.so" -Wl,-rpath,"$LL/lib" -lm \
    -o llama_check || { echo "FAIL: tests/llama_check.c does not build against $LL" >&2; exit 1; }
# one thread each: on a loaded machine, OpenMP's spinning threads cost more than they give
export OMP_NUM_THREADS=1
CFG="$TSR_ROOT/train/configs/debug.toml"
"$T" data prep --out data --synthetic 256k >/dev/null || fail "data prep"
"$T" train --config "$CFG" --job.dump_folder=run --training.steps=150 --training.local_batch_size=4 \
    --training.seq_len=128 --optimizer.lr=3e-3 --lr_scheduler.warmup_steps=10 --training.dataset=tokens \
    --training.dataset_path=data --checkpoint.enable=true --checkpoint.interval=150 >train.log 2>&1 ||
    { fail "train"; tail -5 train.log >&2; }
A=run/checkpoint/step-00000150

# the prompt (71 bytes: with 50 generated tokens, within the context length of 128),
# ending like the stories of the generated corpus
printf ' A cat, caf\303\251  \342\202\254 .\n\tThe story of Alma\n\nAlma was a hunter who lived in' >text.txt
"$T" data prep --out p --input text.txt --val-fraction 0 >/dev/null || fail "data prep of the prompt"
n=$(od -An -tu4 -j8 -N4 p/train_000000.bin | tr -d ' ')
[ "$n" = 72 ] || fail "data prep: $n tokens for 71 bytes and the end of text"
# tessera's ids: the shard's tokens without the end-of-text token after the document
od -An -tu2 -v -j1024 -N$((2 * n - 2)) p/train_000000.bin | tr -s ' \n' ',,' | sed 's/^,//;s/,$//' >ids.txt
TEXT=$(cat text.txt)

# reference CKPT NAME: tessera's 50 greedy tokens from the text (NAME.gen), and its
# logits over the text's ids and the first 49 of those (NAME.bin)
reference() {
    "$T" logits "$1" --text "$TEXT" --generate 50 >"$2.gen" || fail "logits --generate $2"
    "$T" logits "$1" --tokens "$(cat ids.txt),$(cut -d, -f1-49 "$2.gen")" --out "$2.bin" || fail "logits $2"
}
# check FILE.gguf NAME TOL exact|rounded: llama.cpp against tessera
check() {
    echo "== $1 against $2 (tolerance $3, greedy decoding $4)"
    ./llama_check "$LL/lib" "$1" text.txt ids.txt "$2.gen" "$2.bin" "$3" "$4" >"$1.out" 2>"$1.err" ||
        { fail "$1: llama.cpp disagrees with tessera"; cat "$1.err" >&2; }
    cat "$1.out"
}

# without rope scaling: f32, and bf16 / f16 against the checkpoint in that dtype
reference "$A" a
expect 0 "export gguf f32" "$T" export "$A" --format gguf m-f32.gguf --dtype f32
check m-f32.gguf a 1e-5 exact
grep -q "context length 128," m-f32.gguf.out || fail "the GGUF's context length is not the training seq_len 128"
grep -q "add BOS 0, add EOS 0" m-f32.gguf.out || fail "llama.cpp adds BOS or EOS to a prompt"
# the gguf library's tool rewrites the file (it refuses an empty array, such as an
# empty merges list), and llama.cpp finds the same model in the copy
"$TSR_PY" -m gguf.scripts.gguf_new_metadata --general-description "rewritten by gguf-py" m-f32.gguf \
    m-f32-new.gguf >new.log 2>&1 || { fail "gguf_new_metadata cannot rewrite the export"; tail -3 new.log >&2; }
"$TSR_PY" -c 'import gguf, sys; f = gguf.GGUFReader(sys.argv[1]).fields["general.description"]; assert f.contents() == "rewritten by gguf-py"' \
    m-f32-new.gguf || fail "the rewritten file lacks its new description"
check m-f32-new.gguf a 1e-5 exact
for dt in bf16 f16; do
    expect 0 "reshard $dt" "$T" reshard "$A" "$dt" --layout dp_shard=1 --only model --dtype $dt
    reference "$dt" "$dt"
    expect 0 "export gguf $dt" "$T" export "$A" --format gguf "m-$dt.gguf" --dtype $dt
done
check m-bf16.gguf bf16 4e-3 rounded
check m-f16.gguf f16 5e-4 rounded
# the comparison can fail: f16 weights against the f32 logits at the f32 tolerance
./llama_check "$LL/lib" m-f16.gguf text.txt ids.txt a.gen a.bin 1e-5 rounded >neg.out 2>neg.err &&
    fail "f16 weights matched the f32 logits within 1e-5"
grep -q "logits differ" neg.err || fail "the f16 file against f32 logits did not fail on its logits"

# with Llama 3.1 rope scaling: the same weights, imported from a Hugging Face
# config that asks for it (and for a context length of 200)
expect 0 "export safetensors" "$T" export "$A" --format safetensors hf --dtype f32
grep -q '"max_position_embeddings": 128,' hf/config.json || fail "config.json: max_position_embeddings is not 128"
# the safetensors export continues the prompt the same way (its tokenizer files read
# by the format, the weights by an independent PyTorch Llama)
"$TSR_PY" "$TSR_ROOT/tests/hf_generate.py" hf text.txt ids.txt a.gen || fail "the safetensors export differs"
sed -i 's/"rope_scaling": null/"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16}/; s/"max_position_embeddings": 128/"max_position_embeddings": 200/' hf/config.json
expect 0 "import with rope scaling" "$T" import hf R --layout dp_shard=1
reference R r
expect 0 "export gguf f32, rope scaling" "$T" export R --format gguf r-f32.gguf --dtype f32
check r-f32.gguf r 1e-5 exact
grep -q "context length 200," r-f32.gguf.out || fail "the imported context length 200 is not the GGUF's"
cmp -s r.bin a.bin && fail "rope scaling changed nothing in the logits"
for dt in bf16 f16; do
    expect 0 "reshard R $dt" "$T" reshard R "r$dt" --layout dp_shard=1 --only model --dtype $dt
    reference "r$dt" "r$dt"
    expect 0 "export gguf $dt, rope scaling" "$T" export R --format gguf "r-$dt.gguf" --dtype $dt
done
check r-bf16.gguf rbf16 4e-3 rounded
check r-f16.gguf rf16 5e-4 rounded
# a job that resumes the model at a shorter length keeps its context length
"$T" train --config "$CFG" --job.dump_folder=run --training.steps=151 --training.local_batch_size=4 \
    --training.seq_len=64 --training.dataset=tokens --training.dataset_path=data --checkpoint.enable=true \
    --checkpoint.interval=1 >resume.log 2>&1 || { fail "resume at seq_len 64"; tail -5 resume.log >&2; }
expect 0 "export after the resume" "$T" export run/checkpoint/step-00000151 --format safetensors hf151 --dtype f32
grep -q '"max_position_embeddings": 128,' hf151/config.json || fail "a resume at seq_len 64 lost the context length 128"
finish "llama: 6 GGUF files (f32, bf16, f16; with and without rope scaling) and one rewritten by gguf-py tokenize, decode and continue text as tessera does"
