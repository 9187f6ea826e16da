#!/bin/sh
# Special files in a checkpoint: a FIFO in place of MANIFEST or of a data file,
# and a directory in place of a data file, are refused at once with an error
# that names the file and says "not a regular file" by ckpt verify, ckpt check,
# reshard, export and logits (a FIFO used to block them in open() forever);
# likewise import (a FIFO as model.safetensors) and train (a FIFO as a token
# shard). Every command runs under timeout, so a hang fails the test.
. "$TSR_ROOT/tests/common.sh"
cd "$TSR_TMP" || exit 1
command -v timeout >/dev/null || { echo "FAIL: timeout (coreutils) is missing" >&2; exit 1; }
CFG="$TSR_ROOT/train/configs/debug.toml"
"$T" data prep --out data --synthetic 64k >/dev/null || fail "data prep"
"$T" train --config "$CFG" --job.dump_folder=run --training.steps=1 --training.seq_len=32 \
    --training.dataset=tokens --training.dataset_path=data --checkpoint.enable=true --checkpoint.interval=1 \
    --checkpoint.last_save_model_only=false >train.log 2>&1 || { fail "train"; tail -5 train.log >&2; }
A=run/checkpoint/step-00000001
[ -f "$A/MANIFEST" ] && [ -f "$A/data-00000.tsd" ] || { fail "no checkpoint to damage"; exit 1; }

# refused CASE FILE CMD...: exits 1 (not 124: a hang) naming FILE as not regular
refused() {
    what=$1 file=$2; shift 2
    timeout 20 "$@" >out.txt 2>err.txt
    got=$?
    if [ $got = 124 ]; then
        fail "$what: hung (killed after 20 s)"
    elif [ $got != 1 ]; then
        fail "$what: exit $got, expected 1"; sed 's/^/    /' err.txt >&2
    elif ! cat out.txt err.txt | grep "$file" | grep -q "not a regular file"; then
        fail "$what: no error naming $file as not a regular file"; cat out.txt err.txt | sed 's/^/    /' >&2
    fi
}

damage() { # DIR FILE KIND: a copy of the checkpoint with FILE replaced by a fifo or a dir
    rm -rf "$1" && cp -r "$A" "$1" && rm "$1/$2" || { fail "copy $1"; return; }
    if [ "$3" = fifo ]; then mkfifo "$1/$2"; else mkdir "$1/$2"; fi || fail "mk$3 $1/$2"
}

for case in "MANIFEST fifo" "data-00000.tsd fifo" "data-00000.tsd dir"; do
    set -- $case
    f=$1 kind=$2 D=bad-$kind-$f
    damage "$D" "$f" "$kind"
    refused "ckpt verify ($kind as $f)" "$D/$f" "$T" ckpt verify "$D"
    refused "ckpt check ($kind as $f)" "$D/$f" "$T" ckpt check "$D"
    refused "reshard ($kind as $f)" "$D/$f" "$T" reshard "$D" "out-$D" --layout dp_shard=1
    refused "export safetensors ($kind as $f)" "$D/$f" "$T" export "$D" --format safetensors "hf-$D"
    refused "export gguf ($kind as $f)" "$D/$f" "$T" export "$D" --format gguf "$D.gguf"
    refused "logits ($kind as $f)" "$D/$f" "$T" logits "$D" --tokens 1,2,3
    [ -e "$D.gguf" ] && fail "export gguf ($kind as $f) left $D.gguf"
done

# import: a FIFO as model.safetensors of a Hugging Face directory
expect 0 "export for import" "$T" export "$A" --format safetensors hf
rm -f hf/model.safetensors && mkfifo hf/model.safetensors
refused "import (fifo as model.safetensors)" hf/model.safetensors "$T" import hf imported --layout dp_shard=1
# train: a FIFO as a token shard
shard=$(ls data | grep -v '^\.' | head -1)
[ -n "$shard" ] || fail "no token shard in data"
rm -rf data2 && cp -r data data2 && rm "data2/$shard" && mkfifo "data2/$shard"
refused "train (fifo as $shard)" "data2/$shard" "$T" train --config "$CFG" --job.dump_folder=run2 --training.steps=1 \
    --training.seq_len=32 --training.dataset=tokens --training.dataset_path=data2
finish "special files: a FIFO or a directory in place of a checkpoint file is refused at once, naming it"
