#!/bin/sh
# tsr-timeout: 240
# Epochs and fencing (FORMAT.md 4.6). A job saves as epoch 1 (TSR_EPOCH=1); the
# folder is fenced (`tessera ckpt fence`, which prints 2); a run of epoch 1 is
# then refused its save ("fenced: ..." naming the folder, the step and both
# epochs), creates no file and leaves every committed step as it was (verified);
# a run of epoch 2 saves. A MANIFEST of epoch 1 planted after the fence (a copy
# edited, its trailer re-hashed) is listed as fenced, refused by verify and the
# independent reader, and passed over, named, by a resume (a run by hand, which
# fences the folder itself: epoch 3). A damaged FENCE is refused, named. The
# same against S3 (moto), and in the local tier's node folder: raised by the
# launch's epoch, an older launch's snapshots refused, and a planted snapshot
# of an old epoch passed over by the recovery, named. On S3 too, a put that must
# not replace an object does not (test_fence_writers' store part).
. "$TSR_ROOT/tests/common.sh"
cd "${TSR_TMP:?}" || exit 1
need_py
CFG="$TSR_ROOT/train/configs/debug.toml"
SHM=/dev/shm/tessera-test-fence-$$
trap 'rm -rf "$SHM"' EXIT
"$T" data prep --out data --synthetic 1M >/dev/null || fail "data prep"
# train LOG STEPS [ARGS...]: a job of STEPS steps in run/ (checkpoints every 2 steps)
train() {
    log=$1 steps=$2; shift 2
    "$T" train --config "$CFG" --training.seq_len=32 --training.local_batch_size=4 --training.global_batch_size=4 \
        --training.dataset=tokens --training.dataset_path="$TSR_TMP/data" --job.dump_folder="$TSR_TMP/run" \
        --checkpoint.enable=true --checkpoint.interval=2 --checkpoint.last_save_model_only=false \
        --training.steps="$steps" "$@" >"$log" 2>&1
}
# plant SRC DST STEP EPOCH: a copy of step directory SRC as DST, its MANIFEST's
# step and epoch set and its trailer re-hashed (XXH3 through libxxhash)
plant() {
    mkdir -p "$2" && cp "$1"/* "$2"/ && /usr/bin/python3 - "$2/MANIFEST" "$3" "$4" <<'EOF'
import ctypes, struct, sys
x = ctypes.CDLL("libxxhash.so.0")
x.XXH3_64bits.restype = ctypes.c_uint64
x.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
m = bytearray(open(sys.argv[1], "rb").read())
struct.pack_into("<Q", m, 24, int(sys.argv[2]))
struct.pack_into("<Q", m, 88, int(sys.argv[3]))
struct.pack_into("<Q", m, len(m) - 8, x.XXH3_64bits(bytes(m[:-8]), len(m) - 8))
open(sys.argv[1], "wb").write(m)
EOF
}
epoch_of() { "$T" ckpt info "$1" --json | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["epoch"])'; }
R=run/checkpoint

# --- a folder: epoch 1 saves, the fence, epoch 1 refused, epoch 2 saves
TSR_EPOCH=1 train e1.log 4 || fail "epoch 1: exit $?"
[ "$(epoch_of $R/step-00000004)" = 1 ] || fail "step 4 does not record epoch 1: $(epoch_of $R/step-00000004)"
expect 0 "ckpt fence" "$T" ckpt fence $R
[ "$(cat out.txt)" = 2 ] || fail "ckpt fence printed '$(cat out.txt)', not 2"
printf 'tessera-fence 1\nepoch 2 step 4\n' | cmp -s - $R/FENCE || fail "FENCE: $(cat $R/FENCE)"
sums() { cat $R/step-0000000[24]/* | cksum; }
before=$(sums)
TSR_EPOCH=1 train old.log 6
grep -q "fenced: .*run/checkpoint: step 6: this writer's epoch 1 is older than the folder's fence, epoch 2" old.log ||
    { fail "epoch 1 after the fence: no fenced refusal"; tail -5 old.log >&2; }
[ -e $R/step-00000006 ] && fail "epoch 1 after the fence: $(ls $R/step-00000006) in step-00000006"
[ "$(sums)" = "$before" ] || fail "a fenced writer changed a committed step"
for s in 2 4; do expect 0 "verify step $s after the fenced run" "$T" ckpt verify $R/step-0000000$s; done
TSR_EPOCH=2 train e2.log 6 || fail "epoch 2: exit $?"
[ -e $R/step-00000006/MANIFEST ] && [ "$(epoch_of $R/step-00000006)" = 2 ] || fail "epoch 2 did not save step 6"

# --- an epoch 1 MANIFEST committed after the fence: void
plant $R/step-00000004 $R/step-00000008 8 1 || fail "plant"
expect 0 "ckpt ls" "$T" ckpt ls $R
grep -q "^8 *fenced .*fenced: .*step-00000008: step 8 of epoch 1 was committed after the fence of epoch 2, whose newest step was 4" \
    out.txt || { fail "ls does not show step 8 fenced"; cat out.txt >&2; }
expect 1 "verify of the planted step" "$T" ckpt verify $R/step-00000008
grep -q "fenced: .*step-00000008" err.txt || fail "verify: no fenced reason: $(cat err.txt)"
expect 1 "the reader of FORMAT.md on the planted step" "$TSR_PY" "$TSR_ROOT/tests/format_reader.py" $R/step-00000008
grep -q "refused: fenced: step 8 of epoch 1" out.txt || fail "format_reader: $(cat out.txt)"
expect 0 "the reader of FORMAT.md on step 6" "$TSR_PY" "$TSR_ROOT/tests/format_reader.py" $R/step-00000006
train byhand.log 10 || fail "a run by hand: exit $?"
grep -q "resumed from .*step-00000006 " byhand.log || { fail "not resumed from step 6"; grep resumed byhand.log >&2; }
grep -q "step-00000008: fenced: its MANIFEST (epoch 1) was committed after a newer launch's fence" byhand.log ||
    fail "the resume does not name the fenced step 8"
tail -n 1 $R/FENCE | grep -qx "epoch 3 step 6" || fail "a run by hand did not fence the folder: $(cat $R/FENCE)"
[ "$(epoch_of $R/step-00000010)" = 3 ] || fail "the run by hand did not save as epoch 3"

# --- a damaged FENCE: named, with the reason
cp $R/FENCE fence.good
printf 'tessera-fence 1\nepoch 3 step six\n' >$R/FENCE
expect 1 "ckpt fence of a damaged FENCE" "$T" ckpt fence $R
grep -q "run/checkpoint/FENCE: line 2 is not \"epoch E step S\"" err.txt || fail "damaged FENCE: $(cat err.txt)"
TSR_EPOCH=3 train damaged.log 12
grep -q "FENCE: line 2" damaged.log || fail "a save under a damaged FENCE does not name it"
[ -e $R/step-00000012/MANIFEST ] && fail "a save went through a damaged FENCE"
cp fence.good $R/FENCE

# --- S3: the same FENCE object and rules
. "$TSR_ROOT/tests/s3.sh"
s3_start bkt
trap 's3_stop; rm -rf "$SHM"' EXIT
S=s3://bkt/run
TSR_EPOCH=1 train s1.log 2 --checkpoint.folder=$S || { fail "s3 epoch 1: exit $?"; tail -3 s1.log >&2; }
expect 0 "s3 ckpt fence" "$T" ckpt fence $S
[ "$(cat out.txt)" = 2 ] || fail "s3 ckpt fence printed '$(cat out.txt)', not 2"
TSR_EPOCH=1 train s3old.log 4 --checkpoint.folder=$S
grep -q "fenced: s3://bkt/run: step 4: this writer's epoch 1 is older than the folder's fence, epoch 2" s3old.log ||
    { fail "s3: epoch 1 after the fence not refused"; tail -5 s3old.log >&2; }
expect 0 "s3 ls" "$T" ckpt ls $S
grep -q "^4 " out.txt && fail "s3: a fenced writer left step 4: $(cat out.txt)"
expect 0 "s3 verify step 2" "$T" ckpt verify $S/step-00000002
TSR_EPOCH=2 train s3new.log 4 --checkpoint.folder=$S || fail "s3 epoch 2: exit $?"
expect 0 "s3 verify step 4 of epoch 2" "$T" ckpt verify $S/step-00000004
# a commit never replaces an object: PUT with If-None-Match: *, and the exclusive create
TSR_S3_PART_SIZE=5M expect 0 "the store's calls that never replace, on S3" "$TSR_BUILD/tests/test_fence_writers" \
    s3://bkt/never

# --- the local tier: ROOT/node-0/FENCE raised by the launch's epoch
L="--checkpoint.local_interval=1 --checkpoint.local_folder=$SHM --checkpoint.interval=50 --job.dump_folder=$TSR_TMP/lt"
TSR_EPOCH=5 train l5.log 3 $L || fail "local tier, epoch 5: exit $?"
tail -n 1 $SHM/node-0/FENCE | grep -qx "epoch 5 step none" || fail "node-0/FENCE: $(cat $SHM/node-0/FENCE)"
TSR_EPOCH=6 train l6.log 3 $L || fail "local tier, epoch 6: exit $?"
tail -n 1 $SHM/node-0/FENCE | grep -qx "epoch 6 step 3" || fail "node-0/FENCE after epoch 6: $(cat $SHM/node-0/FENCE)"
TSR_EPOCH=5 train l5b.log 5 $L
grep -q "local tier: fenced: .*node-0: this launch's epoch 5 is older than the folder's fence, epoch 6" l5b.log ||
    fail "local tier: an older launch's open not refused: $(grep -i fence l5b.log | head -3)"
grep -q "fenced: .*node-0: step 4: this writer's epoch 5 is older" l5b.log ||
    fail "local tier: an older launch's snapshot not refused"
[ -e $SHM/node-0/step-00000004/MANIFEST ] && fail "local tier: a fenced snapshot was committed"
newest=$(ls -d $SHM/node-0/step-* | tail -n 1)
plant "$newest" $SHM/node-0/step-00000009 9 5 || fail "plant a snapshot"
TSR_EPOCH=7 train l7.log 5 $L || fail "local tier, epoch 7: exit $?"
grep -q "local tier: .*node-0/step-00000009/MANIFEST refused: fenced: .*step 9 of epoch 5 was committed after the fence of epoch 6" \
    l7.log || { fail "local tier: the planted snapshot was not refused, named"; grep -i "local tier\|resumed" l7.log >&2; }
grep -q "resumed from .*step-00000009" l7.log && fail "local tier: resumed from the planted snapshot"
finish
