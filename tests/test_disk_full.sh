#!/bin/sh
# A full disk, for real: checkpoints of the debug model (about 8.4 MB each, every
# frame encoded: checkpoint.codec=bytegroup, so that their size does not depend on
# adaptive encoding's timing) go to a 30 MiB tmpfs.
# 1. keep_latest_k=0 (keep all), a save every step: steps 1-3 commit, the saves
#    of steps 4 and 5 fail with ENOSPC; training goes on to step 5, but the job
#    whose last checkpoint failed exits 1 and says so, naming the step.
# 2. The same job resumed with keep_latest_k=1 makes room before each save
#    (retention of the committed steps beyond 1) and saves again: exit 0.
# 3. The disk filled up again by an uncommitted leftover of a failed save: the
#    next job removes it before its first save (never the newest committed step)
#    and saves.
# Needs root to mount the tmpfs (skips otherwise).
. "$TSR_ROOT/tests/common.sh"
CFG="$TSR_ROOT/train/configs/debug.toml"
MNT="$TSR_TMP/full"
mkdir -p "$MNT"
[ "$(id -u)" = 0 ] || { echo "SKIP: mounting a tmpfs needs root" >&2; exit 77; }
mount -t tmpfs -o size=30m tessera-test "$MNT" 2>err.txt ||
    { echo "SKIP: cannot mount a tmpfs: $(cat err.txt)" >&2; exit 77; }
trap 'umount "$MNT" 2>/dev/null' EXIT INT TERM
CK="$MNT/ckpt"
train() { # NAME ARGS...
    name=$1; shift
    "$T" train --config "$CFG" --training.seq_len=32 --metrics.log_freq=1 --lr_scheduler.warmup_steps=2 \
        --training.dataset=tokens --training.dataset_path="$TSR_TMP/data" --job.dump_folder="$TSR_TMP/run" \
        --checkpoint.enable=true --checkpoint.folder="$CK" --checkpoint.interval=1 --checkpoint.codec=bytegroup \
        --checkpoint.last_save_model_only=false "$@" >"$TSR_TMP/$name.log" 2>&1
}
committed() { [ -f "$CK/$1/MANIFEST" ]; }

"$T" data prep --out "$TSR_TMP/data" --synthetic 1M >/dev/null || fail "data prep"

# 1: the disk fills up
train fill --training.steps=5 --checkpoint.keep_latest_k=0
rc=$?
[ $rc = 1 ] || fail "a job whose last checkpoint failed: exit $rc, expected 1"
for s in 1 2 3; do committed step-0000000$s || fail "fill: step $s not committed"; done
for s in 4 5; do committed step-0000000$s && fail "fill: step $s committed on a full disk (make the tmpfs smaller)"; done
grep -q "step 4: checkpoint failed: .*No space left on device" "$TSR_TMP/fill.log" ||
    fail "fill: no ENOSPC report for step 4: $(grep -i 'step 4' "$TSR_TMP/fill.log" | head -3)"
grep -q "^step      5  loss" "$TSR_TMP/fill.log" || fail "fill: training stopped before step 5"
grep -q "checkpoint of the last step (5) failed; the newest committed checkpoint in .* is step 3" "$TSR_TMP/fill.log" ||
    fail "fill: the failure of the last checkpoint is not reported: $(tail -2 "$TSR_TMP/fill.log")"

# 2: resumed keeping one checkpoint: room is made before the save
train keep1 --training.steps=7 --checkpoint.keep_latest_k=1
rc=$?
[ $rc = 0 ] || { fail "resume with keep_latest_k=1: exit $rc"; grep -i "fail\|error" "$TSR_TMP/keep1.log" | head -5 >&2; }
grep -q "resumed from .*step-00000003" "$TSR_TMP/keep1.log" || fail "keep1: not resumed from step 3"
grep -q "checkpoint failed" "$TSR_TMP/keep1.log" && fail "keep1: a save failed: $(grep 'checkpoint failed' "$TSR_TMP/keep1.log" | head -1)"
committed step-00000007 || fail "keep1: step 7 not committed"
n=$(ls -d "$CK"/step-* | wc -l)
[ "$n" = 1 ] || fail "keep1: $n step directories, expected 1: $(ls "$CK")"

# 3: an uncommitted leftover (a data file of a save that never committed) fills the disk
mkdir -p "$CK/step-00000050"
dd if=/dev/zero of="$CK/step-00000050/data-00000.tsd" bs=1M count=64 2>/dev/null
avail=$(df -k "$MNT" | awk 'NR == 2 {print $4}')
[ "$avail" -lt 1024 ] || fail "the leftover did not fill the disk: $avail KiB free"
train leftover --training.steps=9 --checkpoint.keep_latest_k=1
rc=$?
[ $rc = 0 ] || { fail "resume over a leftover: exit $rc"; grep -i "fail\|error" "$TSR_TMP/leftover.log" | head -5 >&2; }
grep -q "resumed from .*step-00000007" "$TSR_TMP/leftover.log" || fail "leftover: not resumed from step 7"
grep -q "step-00000050: removed (uncommitted" "$TSR_TMP/leftover.log" || fail "leftover: its removal is not reported"
[ -d "$CK/step-00000050" ] && fail "leftover: step-00000050 is still there"
committed step-00000009 || fail "leftover: step 9 not committed"
finish "disk full: exit 1 on a failed last checkpoint; room made by retention and by removing leftovers"
