#!/bin/sh
# make run: the main job. Until the trainer lands, it demonstrates the checkpoint
# format end to end: write a synthetic checkpoint, list it, inspect it, verify it,
# read every element back, and show that one damaged byte is caught.
set -e
BUILD=${1:-build/release}
T="$BUILD/tessera"
RUN=runs/demo
rm -rf "$RUN"
mkdir -p "$RUN"
echo "== write a 256 MiB synthetic checkpoint (bf16 and f32 tensors, blobs)"
$T ckpt synth "$RUN/step-00000100" --bytes 256M --dtype mix --tensors 16 --step 100
echo
echo "== list the checkpoints"
$T ckpt ls "$RUN"
echo
echo "== its MANIFEST (first lines; 'tessera ckpt info DIR --json' prints all of it)"
$T ckpt info "$RUN/step-00000100" | head -n 16
echo
echo "== verify every checksum and rule"
$T ckpt verify "$RUN/step-00000100"
echo
echo "== read every element back and compare with the synthetic content"
$T ckpt synth "$RUN/step-00000100" --check
echo
echo "== flip one byte of a copy: verify names the file, frame and tensor"
cp -r "$RUN/step-00000100" "$RUN/damaged"
printf '\377' | dd of="$RUN/damaged/data-00000.tsd" bs=1 seek=5000000 conv=notrunc 2>/dev/null
if $T ckpt verify "$RUN/damaged"; then echo "the damage was not found" >&2; exit 1; fi
echo
echo "checkpoint: $RUN/step-00000100"
