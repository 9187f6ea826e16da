#!/bin/sh
# tsr-timeout: 300
# checkpoint.exclude_from_loading (TorchTitan's): the parts of the state a load
# leaves fresh. A reference run A of 8 steps saves steps 4 and 8; then, each from
# a copy of A's step 4 (one rank, the debug model), every number compared as the
# same doubles:
#   - optimizer, lr_scheduler and dataloader left out: steps 5..8 are steps 1..4 of
#     a run of as many steps (the schedule spans training.steps) that loads A's
#     step 4 as a model alone (initial_load_model_only): zero
#     moments with AdamW's count from 1, the schedule from its start, the data
#     from its first sample; the step count goes on (5..8);
#   - that run resumed from its own step 6 without the option: steps 7 and 8 as
#     before (the counts' origins kept in the checkpoint);
#   - train_state left out: the steps count from 1 again, everything else loaded:
#     its steps 1..4 are A's 5..8, and A's step 4 in the folder is moved aside at
#     the first save (no longer the newest);
#   - the names refused (test_config has the parse).
. "$TSR_ROOT/tests/common.sh"
cd "${TSR_TMP:?}" || exit 1
CFG="$TSR_ROOT/train/configs/debug.toml"
PY=/usr/bin/python3
"$T" data prep --out data --synthetic 256k >/dev/null || fail "data prep"
job() { # NAME STEPS [ARGS]
    name=$1 steps=$2; shift 2
    "$T" train --config "$CFG" --training.seq_len=32 --metrics.log_freq=1 --lr_scheduler.warmup_steps=3 \
        --training.steps="$steps" --training.global_batch_size=4 --training.local_batch_size=4 \
        --checkpoint.enable=true --checkpoint.interval=2 --checkpoint.last_save_model_only=false \
        --training.dataset=tokens --training.dataset_path=data --job.dump_folder="$name" "$@" >"$name.log" 2>&1 ||
        { fail "$name: exit $?"; tail -3 "$name.log" >&2; }
}
# same A FROM B FROM N: N steps of A from step FROM equal to B's from its step FROM
# (loss, grad_norm, lr, first_sample)
same() {
    $PY - "$1/metrics.jsonl" "$2" "$3/metrics.jsonl" "$4" "$5" <<'PYEOF' || fail "$1 from step $2 is not $3 from step $4"
import json, sys
def load(p):
    return {o["step"]: o for o in map(json.loads, open(p))}
a, b = load(sys.argv[1]), load(sys.argv[3])
fa, fb, n = int(sys.argv[2]), int(sys.argv[4]), int(sys.argv[5])
for k in range(n):
    x, y = a.get(fa + k), b.get(fb + k)
    assert x and y, "step %d or %d missing" % (fa + k, fb + k)
    for f in ("loss", "grad_norm", "lr", "first_sample"):
        assert x[f] == y[f], "%s: step %d %r, step %d %r" % (f, fa + k, x[f], fb + k, y[f])
PYEOF
}
from4() { mkdir -p "$1/checkpoint" && cp -r a/checkpoint/step-00000004 "$1/checkpoint/"; }

job a 8
job model 8 --checkpoint.initial_load_path=a/checkpoint/step-00000004 --checkpoint.initial_load_model_only=true
from4 fresh
job fresh 8 --checkpoint.exclude_from_loading=optimizer,lr_scheduler,dataloader
grep -q "resumed from .*step-00000004 (the durable tier, step 4, .*left out: optimizer, lr_scheduler, dataloader)" \
    fresh.log || { fail "fresh: the parts left out not said"; grep resumed fresh.log >&2; }
same fresh 5 model 1 4
# its own step 6, resumed without the option: the origins come with it
mkdir -p again/checkpoint && cp -r fresh/checkpoint/step-00000006 again/checkpoint/
job again 8
same again 7 fresh 7 2
# the step count left out: from 1, the rest loaded
from4 restart
job restart 8 --checkpoint.exclude_from_loading=train_state
grep -q "resumed from .*(the durable tier, step 0, .*left out: train_state)" restart.log ||
    { fail "restart: not from step 0"; grep resumed restart.log >&2; }
same restart 1 a 5 4
ls -d restart/checkpoint/step-00000004.abandoned-* >/dev/null 2>&1 ||
    fail "restart: A's step 4 not moved aside: $(ls restart/checkpoint)"
expect 0 "the restart's last step verifies" "$T" ckpt verify restart/checkpoint/step-00000004
# the names
expect 2 "a part that is none" "$T" train --config "$CFG" --checkpoint.exclude_from_loading=optimizer,weights
grep -q '"weights" is not a part of the state' err.txt || fail "a part that is none: $(cat err.txt)"
expect 2 "the model left out" "$T" train --config "$CFG" --checkpoint.exclude_from_loading=model
grep -q '"model" cannot be left out' err.txt || fail "the model left out: $(cat err.txt)"
finish "exclude_from_loading: optimizer, lr_scheduler and dataloader left out is a model-only start with the step count kept; the origins survive a resume; train_state left out counts from 1 with the rest loaded"
