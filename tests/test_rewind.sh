#!/bin/sh
# Rewinding, on 2 ranks (FSDP): a job that reached step 10 (checkpoints every 2
# steps) is restarted with checkpoint.load_step=4. Its first save moves the abandoned future (the
# committed steps 6, 8, 10) aside as step-N.abandoned-<time>, with a message, and
# the job goes on and exits 0; its losses and gradient norms at steps 5..8 are
# those of the first run to the last digit of metrics.jsonl; `ckpt ls` shows the moved steps as abandoned; the next automatic
# resume takes the rewound run's step 8, not the abandoned step 10; retention
# (keep_latest_k=1) never counts or removes the abandoned steps.
. "$TSR_ROOT/tests/mpi.sh"
CFG="$TSR_ROOT/train/configs/debug.toml"
PY=/usr/bin/python3
$PY -c 'import json' 2>/dev/null || { echo "FAIL: /usr/bin/python3 is missing" >&2; exit 1; }
ROOT="$TSR_TMP/run/checkpoint"
train() { # NAME ARGS...: a job in $TSR_TMP/run, its output in NAME.log
    name=$1; shift
    run_np 2 "$T" train --config "$CFG" --training.seq_len=32 --training.local_batch_size=4 --metrics.log_freq=1 \
        --lr_scheduler.warmup_steps=2 --lr_scheduler.min_lr_factor=1 \
        --training.dataset=tokens --training.dataset_path="$TSR_TMP/data" --job.dump_folder="$TSR_TMP/run" \
        --checkpoint.enable=true --checkpoint.interval=2 --checkpoint.last_save_model_only=false "$@" \
        >"$TSR_TMP/$name.log" 2>&1
}

"$T" data prep --out "$TSR_TMP/data" --synthetic 1M >/dev/null || fail "data prep"
train first --training.steps=10 || fail "first run: exit $?"
for s in 2 4 6 8 10; do
    [ -f "$ROOT/step-0000000$s/MANIFEST" ] || [ -f "$ROOT/step-000000$s/MANIFEST" ] || fail "first run: step $s not committed"
done

# the rewind: from step 4 to step 8
train rewind --training.steps=8 --checkpoint.load_step=4
rc=$?
[ $rc = 0 ] || { fail "rewind to step 4: exit $rc"; tail -5 "$TSR_TMP/rewind.log" >&2; }
grep -q "resumed from .*step-00000004" "$TSR_TMP/rewind.log" || fail "rewind: not resumed from step 4"
for s in 00000006 00000008 00000010; do
    n=$(ls -d "$ROOT"/step-$s.abandoned-* 2>/dev/null | wc -l)
    [ "$n" = 1 ] || fail "step $s: $n abandoned copies, expected 1"
    ls "$ROOT"/step-$s.abandoned-*/MANIFEST >/dev/null 2>&1 || fail "step $s: the abandoned copy lost its MANIFEST"
    grep -q "step-$s: moved aside to .*step-$s.abandoned-" "$TSR_TMP/rewind.log" || fail "step $s: no message on moving it aside"
done
[ -d "$ROOT/step-00000010" ] && fail "step 10 of the abandoned future is still a step directory"
for s in 6 8; do
    [ -f "$ROOT/step-0000000$s/MANIFEST" ] || fail "rewind: step $s not committed"
done
# the same data and state from step 4 (and an lr that does not depend on
# training.steps): the same losses and gradient norms, to the last printed digit
# of metrics.jsonl (%.9g), where the rewound run appended its steps 5..8
$PY - "$TSR_TMP/run/metrics.jsonl" <<'EOF' || fail "rewind: steps 5..8 differ from the first run's"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
first, again = rows[:10], rows[10:14]
assert [r["step"] for r in first] == list(range(1, 11)), [r["step"] for r in first]
assert [r["step"] for r in again] == [5, 6, 7, 8], [r["step"] for r in again]
for r in again:
    f = first[r["step"] - 1]
    assert (f["loss"], f["grad_norm"]) == (r["loss"], r["grad_norm"]), (f, r)
EOF

# ckpt ls shows them
expect 0 "ckpt ls" "$T" ckpt ls "$ROOT"
for s in 6 8 10; do
    grep -Eq "^$s +abandoned .*step-0*$s\.abandoned-" out.txt || fail "ckpt ls: step $s not shown as abandoned"
done
grep -Eq "^8 +committed" out.txt || fail "ckpt ls: the new step 8 is not shown as committed"
expect 0 "ckpt ls --json" "$T" ckpt ls "$ROOT" --json
$PY - out.txt <<'EOF' || fail "ckpt ls --json: abandoned steps"
import json, sys
v = json.load(open(sys.argv[1]))
ab = sorted(d["step"] for d in v if d["status"] == "abandoned")
assert ab == [6, 8, 10], ab
assert all(d["dir"].startswith("step-") and ".abandoned-" in d["dir"] for d in v if d["status"] == "abandoned")
EOF

# automatic resume: the newest step of the new future (8), not the abandoned 10;
# retention keeps one committed step and leaves the abandoned ones alone
train auto --training.steps=10 --checkpoint.keep_latest_k=1 || fail "automatic resume: exit $?"
grep -q "resumed from .*step-00000008 " "$TSR_TMP/auto.log" || fail "automatic resume did not take step 8: $(grep resumed "$TSR_TMP/auto.log")"
[ -f "$ROOT/step-00000010/MANIFEST" ] || fail "automatic resume: step 10 not committed"
n=$(ls -d "$ROOT"/step-*.abandoned-* | wc -l)
[ "$n" = 3 ] || fail "retention: $n abandoned steps left, expected 3"
n=$(ls -d "$ROOT"/step-???????? | wc -l)
[ "$n" = 1 ] || fail "retention: $n step directories, expected 1 (keep_latest_k=1)"
finish "rewind: abandoned steps moved aside, listed, ignored by resume and retention"
