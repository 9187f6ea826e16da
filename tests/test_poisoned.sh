#!/bin/sh
# test_poisoned.sh: a poisoned state is never resumed (FORMAT.md 4.5). A
# checkpoint with a NaN planted (ckpt synth --nan) is committed, marked poisoned,
# shown so by ckpt ls and info (text and --json), verifies, and its statistics
# are those the reader from FORMAT.md recomputes. In training: a poisoned step
# (a copy of a clean one with a NaN, tests/test_stats --plant) is skipped by the
# resume, which takes the newest clean step and moves the poisoned one aside;
# checkpoint.load_step naming a poisoned step is refused, naming its tensors with
# non-finite values, unless checkpoint.load_poisoned = true; a job whose state
# turns NaN (a NaN in an Adam moment) saves a poisoned step, and retention
# (keep_latest_k = 1) keeps the newest clean step besides it; the local tier's
# recovery skips its poisoned snapshot for the durable tier's clean step.
# ckpt diff puts the tensor that moved most first, from values and norms.
. "$TSR_ROOT/tests/common.sh"
cd "${TSR_TMP:?}" || exit 1
need_py
S="$TSR_BUILD/tests/test_stats"
[ -x "$S" ] || { fail "$S is not built"; finish; }

# --------------------------------------------------------- synth, ls, info
expect 0 "synth clean" "$T" ckpt synth root/step-00000001 --bytes 64K --dtype mix --tensors 4 --step 1
expect 0 "synth with a NaN" "$T" ckpt synth root/step-00000002 --bytes 64K --dtype mix --tensors 4 --step 2 \
    --nan model.layers.0.w:5
expect 1 "synth --nan of an integer tensor" "$T" ckpt synth x --bytes 64K --dtype mix --tensors 4 --nan model.ids
grep -q "nan model.ids:0: not a float tensor" err.txt || fail "synth --nan model.ids: $(cat err.txt)"
expect 0 "ls" "$T" ckpt ls root
grep -q "^2 .* committed .*poisoned (1 tensors hold NaN or Inf)" out.txt || fail "ls: step 2 not poisoned: $(cat out.txt)"
grep "^1 " out.txt | grep -q poisoned && fail "ls: step 1 poisoned: $(cat out.txt)"
expect 0 "ls --json" "$T" ckpt ls root --json
$TSR_PY -c 'import json, sys; d = json.load(open("out.txt"))
assert [(s["step"], s["poisoned"]) for s in d] == [(1, False), (2, True)], d' || fail "ls --json: $(cat out.txt)"
expect 0 "info" "$T" ckpt info root/step-00000002
grep -q "^poisoned    yes: 1 tensor(s) hold NaN or Inf" out.txt || fail "info: not poisoned: $(head -9 out.txt)"
grep -Eq "^model.layers.0.w +[-0-9.e]+ +[-0-9.e]+ +[0-9.e]+ +1$" out.txt || fail "info: no statistics of the NaN's tensor"
grep -Eq "^model.ids +- +- +- +-$" out.txt || fail "info: statistics of an integer tensor"
expect 0 "info --json" "$T" ckpt info root/step-00000002 --json
$TSR_PY -c 'import json, sys; d = json.load(open("out.txt")); t = {x["name"]: x["stats"] for x in d["tensors"]}
assert d["poisoned"] is True and t["model.layers.0.w"]["nonfinite"] == 1 and t["model.ids"] is None, d
assert t["model.norm"]["nonfinite"] == 0 and t["model.norm"]["min"] < 0 < t["model.norm"]["max"], t' ||
    fail "info --json: $(cat out.txt)"
expect 0 "info --json of a clean one" "$T" ckpt info root/step-00000001 --json
grep -q '"poisoned":false' out.txt || fail "info --json: a clean checkpoint poisoned"
expect 0 "verify a poisoned checkpoint" "$T" ckpt verify root/step-00000002
expect 0 "the reader from FORMAT.md" $TSR_PY "$TSR_ROOT/tests/format_reader.py" root/step-00000002
grep -q "(8 digests checked, 5 statistics, poisoned)" out.txt || fail "format_reader: $(cat out.txt)"

# ------------------------------------------------------------- training
J="--config $TSR_ROOT/train/configs/debug.toml --job.dump_folder=run --training.seq_len=32 --checkpoint.enable=true
--checkpoint.interval=1"
CK=run/checkpoint
# shellcheck disable=SC2086
"$T" train $J --training.steps=2 >a.log 2>&1 || { fail "train 2 steps"; tail -3 a.log >&2; }
expect 0 "plant a NaN: step 3" "$S" --plant $CK/step-00000002 $CK/step-00000003 output.weight 3
# the resume skips the poisoned step 3, and moves it aside as an abandoned future
# shellcheck disable=SC2086
"$T" train $J --training.steps=4 >b.log 2>&1 || { fail "train to step 4"; tail -3 b.log >&2; }
grep -q "^resumed from $CK/step-00000002 (the durable tier, step 2" b.log ||
    fail "the resume did not skip the poisoned step 3: $(grep resumed b.log)"
expect 0 "ls after the resume" "$T" ckpt ls $CK
grep -q "^3 .*abandoned.*poisoned" out.txt && grep -q "^4 .*committed" out.txt ||
    fail "the poisoned step 3 is not moved aside: $(cat out.txt)"

# load_step of a poisoned step: refused by name, unless load_poisoned
expect 0 "plant: step 5" "$S" --plant $CK/step-00000004 $CK/step-00000005 \
    layers.0.attention.wq.weight,optim.exp_avg.norm.weight 5
# shellcheck disable=SC2086
expect 1 "load_step of a poisoned step" "$T" train $J --training.steps=6 --checkpoint.load_step=5
grep -q "checkpoint.load_step=5: $CK/step-00000005 is poisoned: non-finite values in tensors \
layers.0.attention.wq.weight (1), optim.exp_avg.norm.weight (1); set checkpoint.load_poisoned = true" err.txt ||
    fail "the refusal does not name the tensors: $(tail -2 err.txt)"
# with the override, a NaN in a moment only (the loss of the first step finite):
# step 6 is saved poisoned, retention keeps step 4 (the newest clean) besides it,
# and the NaN loss of step 7 stops the job, its snapshot of step 6 left in the
# local tier
rm -rf $CK/step-00000005 "$TSR_TMP/shm"
expect 0 "plant: step 5, a moment" "$S" --plant $CK/step-00000004 $CK/step-00000005 optim.exp_avg.norm.weight 5
LT="--checkpoint.local_interval=1 --checkpoint.local_folder=$TSR_TMP/shm"
# shellcheck disable=SC2086
expect 1 "load_poisoned" "$T" train $J --training.steps=8 --checkpoint.load_step=5 --checkpoint.load_poisoned=true \
    --checkpoint.keep_latest_k=1 $LT
grep -q "^resumed from $CK/step-00000005 (the durable tier, step 5" out.txt ||
    fail "load_poisoned: not loaded: $(grep resumed out.txt; tail -2 err.txt)"
grep -q "step 7: the loss is nan" err.txt || fail "load_poisoned: the NaN did not stop the job: $(tail -2 err.txt)"
expect 0 "ls after retention" "$T" ckpt ls $CK
[ "$(grep -c committed out.txt)" = 2 ] && grep -q "^4 .*committed *[0-9. KMiB]*$" out.txt &&
    grep -q "^6 .*committed.*poisoned" out.txt || fail "retention did not keep the newest clean step: $(cat out.txt)"
expect 0 "the local tier's snapshot" "$T" ckpt ls "$TSR_TMP/shm/node-0"
grep -q "^6 .*poisoned" out.txt || fail "no poisoned snapshot of step 6 in the local tier: $(cat out.txt)"
# shellcheck disable=SC2086
"$T" train $J --training.steps=5 $LT >e.log 2>&1 || { fail "resume with the local tier"; tail -3 e.log >&2; }
grep -q "^resumed from $CK/step-00000004 (the durable tier, step 4" e.log ||
    fail "the recovery did not skip the local tier's poisoned step 6: $(grep 'resumed\|local tier' e.log)"

# ----------------------------------------------------------------- diff
expect 0 "synth f32" "$T" ckpt synth A --bytes 64K --dtype f32 --tensors 4 --threads 1
expect 0 "move two tensors" "$S" --plant A B model.layers.2.w=1.5,model.layers.1.w=0.99 0
expect 1 "diff" "$T" ckpt diff A B
head -1 out.txt | grep -q "^model.layers.2.w: [0-9]* elements differ, max abs difference [0-9.e-]*, relative change 0.5$" ||
    fail "diff: the tensor that moved most is not first: $(cat out.txt)"
grep -A1 "TENSOR (moved most first)" out.txt | tail -1 | grep -Eq "^model.layers.2.w +0.5 +[0-9.e]+ +[0-9.e]+ +0.5 " ||
    fail "diff: the table does not start with the tensor that moved most: $(cat out.txt)"
expect 1 "diff --json" "$T" ckpt diff A B --json
$TSR_PY -c 'import json; d = json.load(open("out.txt")); t = d["tensors"]
assert [x["name"] for x in t[:2]] == ["model.layers.2.w", "model.layers.1.w"], t
assert abs(t[0]["rel_change"] - 0.5) < 1e-6 and abs(t[0]["l2_rel_change"] - 0.5) < 1e-6, t
assert abs(t[1]["rel_change"] - 0.01) < 1e-5 and t[2]["rel_change"] == 0 and d["same"] is False, t' ||
    fail "diff --json: $(cat out.txt)"
finish "poisoned checkpoints are committed, shown and never chosen; ckpt diff ranks the tensors that moved"
