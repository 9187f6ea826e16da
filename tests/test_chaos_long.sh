#!/bin/sh
# tsr-timeout: 4500
# make test-long only (TSR_LONG=1; skipped otherwise): two 30-minute supervised
# runs of the debug model on 4 ranks as 2 nodes. With --chaos 60 (a fault a
# minute on average, of every kind): the run finishes with every step and every
# sample once, but for the windows the NaN rollbacks skipped. Without faults:
# no false alarm (no straggler, hang or NaN event) and no restart.
# TSR_CHAOS_MINUTES=M and TSR_CHAOS_RATE=S run M minutes each, at a fault per S
# seconds (a quick check of the test itself).
. "$TSR_ROOT/tests/mpi.sh"
[ -n "${TSR_LONG:-}" ] || { echo "SKIP: a 60-minute test, run by make test-long (TSR_LONG=1)" >&2; exit 77; }
CFG="$TSR_ROOT/train/configs/debug.toml"
PY=/usr/bin/python3
"$T" data prep --out "$TSR_TMP/data" --synthetic 4M >/dev/null || fail "data prep"
job() { # NAME STEPS
    echo "--config $CFG --training.seq_len=32 --metrics.log_freq=1 --lr_scheduler.warmup_steps=10 --training.steps=$2" \
        "--training.global_batch_size=8 --training.local_batch_size=2 --checkpoint.enable --checkpoint.interval=10" \
        "--checkpoint.keep_latest_k=3 --checkpoint.last_save_model_only=false --training.dataset=tokens" \
        "--training.dataset_path=$TSR_TMP/data --job.dump_folder=$TSR_TMP/$1"
}
sup() { # NAME STEPS [OPTIONS]
    name=$1 steps=$2; shift 2
    "$T" launch -np 4 --nodes 2 --min-ranks 2 --max-restarts 10000 --backoff 0.2 "$@" -- train $(job "$name" "$steps") \
        >"$TSR_TMP/$name.log" 2>&1 || { fail "$name: exit $?"; tail -5 "$TSR_TMP/$name.log" >&2; }
}
# the steps of 30 minutes, from the wall times of a 100-step and a 300-step run:
# their difference leaves out the start, which one run alone counted as steps
# (a run of 30 minutes so calibrated lasted 19)
MIN=${TSR_CHAOS_MINUTES:-30}
sup calibrate 100
sup calibrate3 300
steps=$($PY -c 'import json, sys
w = [[json.loads(l) for l in open(p) if "\"finish\"" in l][-1]["wall_s"] for p in sys.argv[1:3]]
print(max(100, int(60 * float(sys.argv[3]) / max((w[1] - w[0]) / 200, 1e-3))))' \
    "$TSR_TMP/calibrate/launch.jsonl" "$TSR_TMP/calibrate3/launch.jsonl" "$MIN")
echo "$MIN minutes: $steps steps"
sup clean "$steps"
n=$($PY -c 'import json, sys
print(sum(1 for l in open(sys.argv[1]) if json.loads(l)["event"] in ("straggler", "hang", "nan", "relaunch")))' \
    "$TSR_TMP/clean/launch.jsonl")
[ "$n" = 0 ] || { fail "clean: $n false alarm(s)"; grep -E "straggler|hang|nan|relaunch" "$TSR_TMP/clean/launch.jsonl" >&2; }
$PY "$TSR_ROOT/tests/samples_check.py" "$TSR_TMP/clean/metrics.jsonl" "$TSR_TMP/clean/launch.jsonl" "$steps" ||
    fail "clean: samples lost or trained twice"
sup chaos "$steps" --chaos "${TSR_CHAOS_RATE:-60},7" --hang-timeout 10
$PY "$TSR_ROOT/tests/samples_check.py" "$TSR_TMP/chaos/metrics.jsonl" "$TSR_TMP/chaos/launch.jsonl" "$steps" ||
    fail "chaos: samples lost or trained twice"
grep '"finish"' "$TSR_TMP/chaos/launch.jsonl" | tail -1
finish "chaos long: $MIN minutes of chaos with no lost step, $MIN minutes clean with no false alarm"
