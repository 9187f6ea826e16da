#!/bin/sh
# test_crash_commit.sh: a crash at each step of a commit. A one-rank training job
# that saves every 2 steps sends itself SIGKILL (the store's fault injection,
# TSR_FAULT=OP:N:kill|killafter:PATH) in the save of step 4: after the data
# file's fsync, after MANIFEST.tmp is written, after its fsync, after the rename
# to MANIFEST, before the directory's fsync and after it. Each time the job dies
# by SIGKILL; every committed checkpoint verifies; step 4 is committed exactly
# when the rename happened, and listed as uncommitted otherwise; the restarted
# job resumes from the newest committed step, and then loses nothing: the loss
# and gradient norm of every step, and the tensors of its last checkpoint, are
# bitwise those of a job that was never killed (a crash may cut the metrics line
# of the step being saved, which runs after the save began: that step's line
# may be missing, but no other).
# Then a save that fails (EIO on the rename of step 2's MANIFEST), with
# synchronous and with asynchronous checkpoints: the failure is reported, step 2
# is not committed, and training goes on: steps 3 to 6 run with the same numbers
# as the job without a fault, steps 4 and 6 are saved and verify, and the job
# exits 0.
. "$TSR_ROOT/tests/common.sh"
CFG="$TSR_ROOT/train/configs/debug.toml"
PY=/usr/bin/python3
$PY -c 'import json' 2>/dev/null || { echo "FAIL: /usr/bin/python3 is missing" >&2; exit 1; }
ARGS="--training.seq_len=32 --metrics.log_freq=1 --lr_scheduler.warmup_steps=2 --training.steps=6
--training.global_batch_size=4 --training.local_batch_size=4 --checkpoint.enable=true --checkpoint.interval=2
--checkpoint.last_save_model_only=false --training.dataset=tokens --training.dataset_path=$TSR_TMP/data"
job() { # NAME [ARGS]: the job in $TSR_TMP/NAME, its output in $TSR_TMP/NAME.log (appended)
    name=$1; shift
    "$T" train --config "$CFG" $ARGS --job.dump_folder="$TSR_TMP/$name" "$@" >>"$TSR_TMP/$name.log" 2>&1
}

# same REF NAME: every step's loss and grad_norm of NAME (the last value of a step
# that ran twice) equal REF's, as doubles (the metrics carry 17 digits); only
# step 4's line may be missing
same() {
    $PY - "$TSR_TMP/$1/metrics.jsonl" "$TSR_TMP/$2/metrics.jsonl" <<'PYEOF' || fail "$2: the resumed job's numbers differ from $1"
import json, sys
def load(p):
    d = {}
    for line in open(p):
        o = json.loads(line)
        d[o["step"]] = (o["loss"], o["grad_norm"])
    return d
a, b = load(sys.argv[1]), load(sys.argv[2])
assert sorted(a) == list(range(1, 7)), sorted(a)
assert set(b) <= set(a) and set(a) - set(b) <= {4}, "steps %s, want %s" % (sorted(b), sorted(a))
bad = [(s, a[s][k].hex(), b[s][k].hex(), k) for s in b for k in (0, 1) if a[s][k] != b[s][k]]
assert not bad, bad
PYEOF
}

"$T" data prep --out "$TSR_TMP/data" --synthetic 1M >/dev/null || { fail "data prep"; exit 1; }
job ref || { fail "the job without a crash: exit $?"; tail -5 "$TSR_TMP/ref.log" >&2; exit 1; }

# NAME, TSR_FAULT, the newest committed step after the crash
while read -r name fault want; do
    before=$fails
    TSR_FAULT=$fault job "$name"
    rc=$?
    [ $rc = 137 ] || { fail "$name ($fault): exit $rc, not killed"; tail -3 "$TSR_TMP/$name.log" >&2; continue; }
    ck="$TSR_TMP/$name/checkpoint"
    "$T" ckpt ls "$ck" >"$TSR_TMP/$name.ls" 2>&1 || fail "$name: ckpt ls"
    newest=$(awk '$2 == "committed" { s = $1 } END { print s }' "$TSR_TMP/$name.ls")
    [ "$newest" = "$want" ] || fail "$name: newest committed step $newest, expected $want: $(cat "$TSR_TMP/$name.ls")"
    for d in "$ck"/step-*; do
        [ -f "$d/MANIFEST" ] || continue
        "$T" ckpt verify "$d" >/dev/null 2>&1 || fail "$name: committed $(basename "$d") does not verify"
    done
    if [ "$want" = 2 ]; then
        grep -q "^4 .*uncommitted" "$TSR_TMP/$name.ls" || fail "$name: step 4 not listed as uncommitted: $(cat "$TSR_TMP/$name.ls")"
        "$T" ckpt verify "$ck/step-00000004" >/dev/null 2>&1 && fail "$name: the interrupted step 4 verifies"
    fi
    # the restart resumes from the newest committed step and finishes
    : >"$TSR_TMP/$name.log"
    job "$name" || { fail "$name: the restart: exit $?"; tail -5 "$TSR_TMP/$name.log" >&2; continue; }
    grep -q "resumed from $ck/step-0000000$want " "$TSR_TMP/$name.log" ||
        fail "$name: did not resume from step $want: $(grep resumed "$TSR_TMP/$name.log")"
    same ref "$name"
    "$T" ckpt verify "$ck/step-00000006" >/dev/null 2>&1 || fail "$name: the last checkpoint does not verify"
    "$T" ckpt diff "$TSR_TMP/ref/checkpoint/step-00000006" "$ck/step-00000006" >"$TSR_TMP/$name.diff" 2>&1
    grep -v "^blob \|^no differences" "$TSR_TMP/$name.diff" >&2 && fail "$name: the last checkpoint's tensors differ"
    [ $fails = $before ] && echo "$name: killed ($fault), resumed from step $want, nothing lost"
done <<EOF2
after-data-fsync fsync:1:killafter:step-00000004/data- 2
after-manifest-write write:1:killafter:step-00000004/MANIFEST.tmp 2
after-manifest-fsync fsync:1:killafter:step-00000004/MANIFEST.tmp 2
after-rename rename:1:killafter:step-00000004/MANIFEST.tmp 4
before-dir-fsync fsync:3:kill:step-00000004 4
after-dir-fsync fsync:3:killafter:step-00000004 4
EOF2

# the save of step 2 fails; the job must go on through the saves of steps 4 and 6
# (an asynchronous save's failure surfaces at a later step: the job must not stop
# there either) and exit 0
for mode in disabled async; do
    name=failed-$mode
    TSR_FAULT=rename:1:EIO:step-00000002 job "$name" --checkpoint.async_mode=$mode
    rc=$?
    [ $rc = 0 ] || fail "$name: exit $rc after a failed save, not 0"
    ck="$TSR_TMP/$name/checkpoint"
    grep -q "save of step 2 to .*failed: .*MANIFEST.tmp-[0-9a-f]*: rename to MANIFEST" "$TSR_TMP/$name.log" ||
        fail "$name: the failed save is not reported: $(tail -3 "$TSR_TMP/$name.log")"
    grep -q "^step  *6 " "$TSR_TMP/$name.log" || fail "$name: training stopped after the failed save of step 2"
    "$T" ckpt ls "$ck" >"$TSR_TMP/$name.ls" 2>&1
    grep -q "^2 .*committed" "$TSR_TMP/$name.ls" && ! grep -q "^2 .*uncommitted" "$TSR_TMP/$name.ls" &&
        fail "$name: step 2 committed although its save failed"
    for st in 4 6; do
        grep -q "^$st .*committed" "$TSR_TMP/$name.ls" && "$T" ckpt verify "$ck/step-0000000$st" >/dev/null 2>&1 ||
            fail "$name: no committed, verified step $st after the failed save: $(cat "$TSR_TMP/$name.ls")"
    done
    same ref "$name"
done
finish "crash points of the commit: all recovered; a failed save: training went on"
