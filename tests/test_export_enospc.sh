#!/bin/sh
# tessera export onto a full filesystem (a 2 MiB tmpfs, smaller than the debug
# model's 3.5 MB): exit 1 with "No space left on device" in the message, and
# nothing left on that filesystem: no config.json, no model.safetensors whose
# header promises bytes it lacks, no partial GGUF, no temporary. Needs root to
# mount the tmpfs; skips (77) without it.
. "$TSR_ROOT/tests/common.sh"
cd "$TSR_TMP" || exit 1
mkdir -p full
if [ "$(id -u)" != 0 ] || ! mount -t tmpfs -o size=2m tessera-test full 2>/dev/null; then
    echo "SKIP: cannot mount a tmpfs (needs root) for the full-disk export test" >&2
    exit 77
fi
trap 'umount "$TSR_TMP/full" 2>/dev/null' EXIT
trap 'exit 143' TERM # so that the EXIT trap runs on these too
trap 'exit 130' INT
"$T" data prep --out data --synthetic 64k >/dev/null || fail "data prep"
"$T" train --config "$TSR_ROOT/train/configs/debug.toml" --job.dump_folder=run --training.steps=1 \
    --training.seq_len=32 --training.dataset=tokens --training.dataset_path=data --checkpoint.enable=true \
    --checkpoint.interval=1 --checkpoint.last_save_model_only=true >train.log 2>&1 || { fail "train"; tail -5 train.log >&2; }
A=run/checkpoint/model-step-00000001
left() { [ -z "$(ls -A full)" ] || fail "$1: left on the full filesystem: $(cd full && find . -mindepth 1 | tr '\n' ' ')"; }
for fmt in safetensors gguf; do
    out=full/hf
    [ $fmt = gguf ] && out=full/m.gguf
    expect 1 "export $fmt onto a full filesystem" "$T" export "$A" --format $fmt $out
    grep -q "No space left on device" err.txt || { fail "export $fmt: the message does not say the disk is full"; sed 's/^/    /' err.txt >&2; }
    left "export $fmt"
    rm -rf full/*
    # into an existing directory: what was there stays, nothing else
    mkdir -p full/keep && echo mine >full/keep/notes.txt
    expect 1 "export $fmt into a full directory" "$T" export "$A" --format $fmt full/keep/$(basename $out)
    [ "$(ls -A full/keep)" = notes.txt ] || fail "export $fmt into full/keep: left $(ls -A full/keep | tr '\n' ' ')"
    rm -rf full/keep
    left "export $fmt into a directory"
done
# the same export where there is room succeeds: the failures were the disk's
expect 0 "export where there is room" "$T" export "$A" --format gguf m.gguf
finish "export enospc: a full disk fails with its reason and leaves nothing"
