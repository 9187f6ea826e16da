#!/bin/sh
# A job that names a checkpoint folder while checkpoints are disabled says so on
# stderr (the trainer's config warnings) and still runs; it saves nothing there.
. "$TSR_ROOT/tests/common.sh"
cd "${TSR_TMP:?}" || exit 1
run() { "$T" train --config "$TSR_ROOT/train/configs/debug.toml" --job.dump_folder=job --training.steps=1 \
    --training.seq_len=16 "$@"; }
expect 0 "folder given, enable false" run --checkpoint.folder=ck
grep -q 'checkpoint.folder ("ck") is set but checkpoint.enable is false' err.txt ||
    fail "no warning for checkpoint.folder without checkpoint.enable: $(cat err.txt)"
[ -e job/ck ] && fail "a disabled checkpoint folder was written"
expect 0 "folder given, enable true" run --checkpoint.folder=ck --checkpoint.enable --checkpoint.interval=1
grep -q 'checkpoint.folder' err.txt && fail "a warning with checkpoint.enable = true: $(cat err.txt)"
[ -f job/ck/step-00000001/MANIFEST ] || fail "no checkpoint saved with checkpoint.enable = true"
finish "checkpoint.folder without checkpoint.enable: warned"
