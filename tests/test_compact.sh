#!/bin/sh
# test_compact.sh: tessera ckpt compact. A training job's checkpoint, saved with
# its frames raw (codec auto under load), is re-encoded in place: its data files
# shrink to at most 0.85x the raw bytes (the f32 training state; a synthetic bf16
# checkpoint to at most 0.7x), it verifies, every tensor and blob equals a copy
# made before, and every frame keeps its raw size and raw checksum; a second
# compact leaves it as it is. Refused while another writer holds the folder's
# lock, or another compact works in the same folder. A failure injected mid-compact (ENOSPC) and crashes at each stage (a
# kill while the new data file is written, before its fsync, after the new
# MANIFEST is committed beside it but before the swap; the state a crash right
# after the swap leaves; kills at random times) leave the step a valid
# checkpoint with the same values, old or new, never neither, and the next
# compact finishes the work.
# tsr-timeout: 120
. "$TSR_ROOT/tests/common.sh"
cd "$TSR_TMP" || exit 1
PY=/usr/bin/python3
"$T" train --config "$TSR_ROOT/train/configs/debug.toml" --job.dump_folder=run --training.steps=4 \
    --checkpoint.enable=true --checkpoint.interval=4 --checkpoint.last_save_model_only=false >train.log 2>&1 ||
    { fail "train"; tail -5 train.log >&2; finish; }
S=run/checkpoint/step-00000004
cp -r "$S" orig || fail "copy of the checkpoint"

# frames: "codec raw_size raw_hash" per tensor frame, in MANIFEST order
frames() {
    "$T" ckpt info "$1" --json | $PY -c '
import json, sys
for t in json.load(sys.stdin)["tensors"]:
    for c in t["chunks"]:
        for f in c["frames"]:
            print(t["name"], c["offset"], c["split_dim"], c["frame_rows"], f["raw_size"], f["raw_hash"], f["codec"])'
}
# same_values A B: every tensor and blob equal, every frame's geometry and raw checksum
same_values() {
    "$T" ckpt diff "$1" "$2" >diff.txt 2>&1 || { fail "$3: values differ from the copy made before"; cat diff.txt >&2; }
    frames "$1" | cut -d' ' -f1-6 >a.frames && frames "$2" | cut -d' ' -f1-6 >b.frames || fail "$3: ckpt info --json"
    cmp -s a.frames b.frames || fail "$3: raw sizes or raw checksums differ"
    "$T" ckpt verify "$2" >/dev/null 2>&1 || fail "$3: does not verify"
}
raw_frames() { frames "$1" | grep -c ' raw$'; }
frames "$S" >before.frames
n=$(wc -l <before.frames)
[ "$(raw_frames "$S")" = "$n" ] && [ "$n" -gt 100 ] || fail "the training checkpoint's frames are not all raw: $(cut -d' ' -f7 before.frames | sort | uniq -c)"

# usage
expect 0 "compact --help" "$T" ckpt compact --help
grep -q "usage: tessera ckpt compact" out.txt || fail "compact --help: no usage"
expect 2 "compact without DIR" "$T" ckpt compact
expect 2 "compact with an unknown option" "$T" ckpt compact "$S" --frobnicate
expect 1 "compact of a missing directory" "$T" ckpt compact nowhere/step-00000001
grep -q "nowhere/step-00000001" err.txt || fail "compact of a missing directory: unclear error: $(cat err.txt)"

# refused while another writer holds the folder's lock (a running job or a pull)
(exec 9>>run/checkpoint/LOCK && flock 9 && exec sleep 30) &
holder=$!
n=0
while [ $n -lt 50 ] && flock -n run/checkpoint/LOCK true 2>/dev/null; do sleep 0.1; n=$((n + 1)); done
expect 1 "compact while the folder is locked" "$T" ckpt compact "$S"
grep -q "another writer holds this checkpoint folder" err.txt || fail "compact under a lock: no refusal: $(cat err.txt)"
kill $holder 2>/dev/null; wait $holder 2>/dev/null
cmp -s "$S/MANIFEST" orig/MANIFEST || fail "a refused compact changed the MANIFEST"
# ... and while another compact works in the same folder (a folder that is not a
# step has no root lock: the folder that holds it is flocked)
(exec 9<. && flock 9 && exec sleep 30) &
holder=$!
n=0
while [ $n -lt 50 ] && flock -n . true 2>/dev/null; do sleep 0.1; n=$((n + 1)); done
expect 1 "compact while another compact works beside" "$T" ckpt compact orig
grep -q "orig: another compact works in \." err.txt || fail "a concurrent compact: no refusal: $(cat err.txt)"
kill $holder 2>/dev/null; wait $holder 2>/dev/null

# an injected failure (no space for the new data file): exit 1, the file and the
# reason named, the step untouched, nothing left beside it
TSR_FAULT="write:3:ENOSPC:step-00000004.compact/data" expect 1 "compact with no space" "$T" ckpt compact "$S"
grep -q "step-00000004.compact/data-00000.tsd.*[Nn]o space" err.txt || fail "compact with no space: unclear error: $(cat err.txt)"
cmp -s "$S/MANIFEST" orig/MANIFEST && cmp -s "$S/data-00000.tsd" orig/data-00000.tsd || fail "a failed compact changed the step"
[ -e "$S.compact" ] && fail "a failed compact left $S.compact"

# crashes (SIGKILL at a store call): the step is the old checkpoint, whole
for fault in "write:2:kill:step-00000004.compact/data" "fsync:1:kill:step-00000004.compact/data" \
    "rename:1:killafter:step-00000004.compact/MANIFEST"; do
    TSR_FAULT=$fault "$T" ckpt compact "$S" >out.txt 2>err.txt
    rc=$?
    [ $rc = 137 ] || { fail "$fault: exit $rc, not killed"; cat err.txt >&2; }
    cmp -s "$S/MANIFEST" orig/MANIFEST || fail "$fault: the MANIFEST changed before the swap"
    same_values orig "$S" "after a crash at $fault"
    "$T" ckpt ls run/checkpoint >ls.txt 2>&1
    [ "$(grep -c committed ls.txt)" = 1 ] || fail "$fault: ckpt ls: $(cat ls.txt)"
done
[ -d "$S.compact" ] || fail "the crash after the MANIFEST beside the step left no $S.compact"

# compact: under the goal for f32 training state, same values and raw checksums
expect 0 "compact" "$T" ckpt compact "$S" --json
[ -e "$S.compact" ] && fail "compact left $S.compact"
$PY - <<'PYEOF' || fail "compact: ratio not under 0.85 of the raw bytes: $(cat out.txt)"
import json
s = json.load(open("out.txt"))["steps"][0]
r = s["bytes_after"] / s["raw_bytes"]
print("compact, f32 training state: %d -> %d bytes, %.3f of raw" % (s["bytes_before"], s["bytes_after"], r))
assert s["files_rewritten"] == 1 and s["frames_encoded"] > 100, s
assert s["bytes_after"] < s["bytes_before"] and r <= 0.85, r
PYEOF
same_values orig "$S" "compacted"
[ "$(raw_frames "$S")" -lt "$(raw_frames orig)" ] || fail "compact left every frame raw"
[ "$(du -sb "$S" | cut -f1)" -lt "$(du -sb orig | cut -f1)" ] || fail "the compacted step is not smaller on disk"
cp "$S/MANIFEST" compacted.MANIFEST
expect 0 "compact again" "$T" ckpt compact "$S"
grep -q "left as it is" out.txt || fail "a second compact did something: $(cat out.txt)"
cmp -s "$S/MANIFEST" compacted.MANIFEST || fail "a second compact rewrote the MANIFEST"

# a crash right after the swap leaves the new checkpoint in place and the old
# one beside it: invisible to listings, removed by the next compact
cp -r orig "$S.compact"
"$T" ckpt ls run/checkpoint >ls.txt 2>&1
[ "$(grep -c committed ls.txt)" = 1 ] || fail "the leftover beside the step is listed: $(cat ls.txt)"
expect 0 "compact after a crash past the swap" "$T" ckpt compact run/checkpoint
[ -e "$S.compact" ] && fail "compact did not remove the leftover $S.compact"
same_values orig "$S" "after the leftover's removal"

# kills at random times of a compact whose fsyncs are slow: each time the step
# is old or new and whole; the last compact finishes
i=0
for ms in 40 150 300 450 600 800; do
    i=$((i + 1))
    rm -rf "$S" && cp -r orig "$S"
    TSR_FAULT="delay:150000:fsync" "$T" ckpt compact "$S" >out.txt 2>&1 &
    pid=$!
    sleep "$(echo "$ms" | awk '{ printf "%.3f", $1 / 1000 }')"
    kill -9 $pid 2>/dev/null
    wait $pid 2>/dev/null
    same_values orig "$S" "killed after $ms ms"
done
expect 0 "compact after the kills" "$T" ckpt compact "$S"
same_values orig "$S" "compacted after the kills"
[ -e "$S.compact" ] && fail "$S.compact left after the last compact"

# bf16: a synthetic checkpoint stored raw, to at most 0.7x
"$T" ckpt synth bf/step-00000001 --bytes 6M --dtype bf16 --codec raw --step 1 >/dev/null || fail "synth bf16"
cp -r bf/step-00000001 bf-orig
expect 0 "compact bf16" "$T" ckpt compact bf --json
$PY - <<'PYEOF' || fail "compact bf16: ratio not under 0.7 of the raw bytes: $(cat out.txt)"
import json
s = json.load(open("out.txt"))["steps"][0]
r = s["bytes_after"] / s["raw_bytes"]
print("compact, bf16 (synthetic): %d -> %d bytes, %.3f of raw" % (s["bytes_before"], s["bytes_after"], r))
assert r <= 0.7, r
PYEOF
same_values bf-orig bf/step-00000001 "bf16 compacted"
expect 0 "synth --check of the compacted bf16 step" "$T" ckpt synth bf/step-00000001 --check

finish "compact: raw frames re-encoded in place (f32 state <= 0.85x, bf16 <= 0.7x), same values and raw checksums, atomic under crashes"
