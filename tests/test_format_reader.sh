#!/bin/sh
# test_format_reader.sh: FORMAT.md is enough to read tessera's checkpoints.
# tests/format_reader.py, a reader written from FORMAT.md alone, decodes the test
# vector formats/testdata (section 12) and finds exactly expected.txt's contents;
# it refuses the vector with one frame byte flipped, and reports an expected
# value changed; it reads synthetic checkpoints of every dtype (frames of 64 bytes,
# cut along inner dims; and the default codecs); and it finds a training
# checkpoint and a model-only checkpoint as section 11 describes them (blobs,
# tensors, placements).
. "$TSR_ROOT/tests/common.sh"
cd "${TSR_TMP:?}" || exit 1
PY=/usr/bin/python3
R="$TSR_ROOT/tests/format_reader.py"
V="$TSR_ROOT/formats/testdata"

$PY "$R" "$V/step-00000007" "$V/expected.txt" >out.txt 2>&1
rc=$?
[ $rc = 77 ] && { cat out.txt; exit 77; }
[ $rc = 0 ] || { fail "the reader does not find the test vector as expected.txt says"; cat out.txt >&2; }

# a changed expected value is reported, naming the element
sed 's/^-12.5 -12.375 /-12.5 -12.25 /' "$V/expected.txt" >changed.txt
cmp -s changed.txt "$V/expected.txt" && fail "expected.txt does not start layers.0.w with -12.5 -12.375"
expect 1 "a changed expected value" $PY "$R" "$V/step-00000007" changed.txt
grep -q "tensor layers.0.w element 1" out.txt || fail "no element named: $(cat out.txt)"

# a flipped byte in a frame (the first of data-00001.tsd) is refused
mkdir -p flipped && cp "$V"/step-00000007/* flipped/ && chmod u+w flipped/*
printf '\001' | dd of=flipped/data-00001.tsd bs=1 seek=4100 conv=notrunc 2>/dev/null
expect 1 "a flipped frame byte" $PY "$R" flipped "$V/expected.txt"
grep -q "refused" out.txt || fail "no refusal: $(cat out.txt)"

# synthetic checkpoints of every dtype: tiny frames (cut along inner dims), and
# the default codecs (bytegroup, zstd, raw)
expect 0 "synth with 64-byte frames" "$T" ckpt synth small --bytes 16K --dtype mix --threads 1 --frame-bytes 64
expect 0 "read the 64-byte frames" $PY "$R" small
expect 0 "synth" "$T" ckpt synth mixed --bytes 256K --dtype mix --threads 1
expect 0 "read the default codecs" $PY "$R" mixed

# a training checkpoint and the model-only one (section 11)
"$T" train --config "$TSR_ROOT/train/configs/debug.toml" --job.dump_folder=run --training.steps=2 \
    --training.seq_len=32 --checkpoint.enable=true --checkpoint.interval=2 \
    --checkpoint.last_save_model_only=true >train.log 2>&1 || { fail "train"; tail -5 train.log >&2; }
expect 0 "the training checkpoint as section 11 says" $PY "$R" run/checkpoint/step-00000002 --trainer
expect 0 "the model-only checkpoint as section 11 says" $PY "$R" run/checkpoint/model-step-00000002 --trainer
finish "the reader from FORMAT.md reads the test vector, synthetic and training checkpoints"
