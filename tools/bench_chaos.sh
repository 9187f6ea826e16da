#!/bin/sh
# bench_chaos.sh TESSERA OUT [short|long]: effective training time under
# tessera launch --chaos: productive step time (the step times of the steps the
# run keeps, from its metrics: each step's wall time less what it blocked on a
# checkpoint) over the supervisor's wall time, for the debug model on 8 ranks
# as 2 nodes of 4 (down to 4 ranks when a node is dropped), with a snapshot in
# the local tier every 5 steps (about 0.4 s: one every step of this tiny model
# would block it 10%) and a durable checkpoint every 100 (about 8 s; every 10
# blocked it 7%: a save of this model takes longer than 10 of its steps on 2
# cores). The baseline is the
# same job without faults, in the same run. short (make bench): 75 s at one
# fault per 20 s. long (make bench-long): 20 minutes at one fault per 5 minutes
# and 20 minutes at one per minute, against the goals (95% and 80%); the
# baseline runs 5 minutes.
set -e
T=$1 OUT=$2 MODE=${3:-short}
PY=/usr/bin/python3
CFG=train/configs/debug.toml
SEQ=64
rm -rf "$OUT"
mkdir -p "$OUT"
"$T" data prep --out "$OUT/data" --synthetic 4M >/dev/null
job() { # NAME STEPS: the job's arguments
    echo "--config $CFG --training.seq_len=$SEQ --metrics.log_freq=1 --lr_scheduler.warmup_steps=10" \
        "--training.steps=$2 --training.global_batch_size=16 --training.local_batch_size=2 --checkpoint.enable" \
        "--checkpoint.interval=100 --checkpoint.keep_latest_k=2 --checkpoint.last_save_model_only=false" \
        "--checkpoint.local_interval=5" \
        "--training.dataset=tokens --training.dataset_path=$OUT/data --job.dump_folder=$OUT/$1"
}
# effective NAME: "productive wall ratio faults restarts" of the run in OUT/NAME
effective() {
    $PY - "$OUT/$1" $SEQ <<'PYEOF'
import json, sys
d, seq = sys.argv[1], int(sys.argv[2])
steps = {}
for line in open(d + "/metrics.jsonl"):
    o = json.loads(line)
    steps[o["step"]] = o["samples"] * seq / o["tokens_per_s"] - o["ckpt_blocked_s"]  # the last run of a step wins
fin = [json.loads(l) for l in open(d + "/launch.jsonl") if '"finish"' in l][-1]
assert fin["status"] == "ok", fin
prod = sum(steps.values())
print("%.3f %.3f %.4f %d %d" % (prod, fin["wall_s"], prod / fin["wall_s"], fin.get("chaos_faults", 0), fin["restarts"]))
PYEOF
}
# run NAME STEPS [LAUNCH OPTIONS]: a supervised run; prints its effective line
run() {
    name=$1 steps=$2; shift 2
    "$T" launch -np 8 --nodes 2 --min-ranks 4 --max-restarts 10000 --backoff 0.2 "$@" -- train $(job "$name" "$steps") \
        >"$OUT/$name.log" 2>&1 || { echo "bench chaos: $name failed: see $OUT/$name.log" >&2; tail -5 "$OUT/$name.log" >&2; exit 1; }
    effective "$name"
}
# the steps that last about SECONDS, from a calibration run's step time
steps_for() {
    echo "$cal" | awk -v s="$1" '{ n = int(s / ($1 / 100)); print n < 20 ? 20 : n }'
}
cal=$(run calibrate 100)
say() { # LABEL LINE [GOAL]
    echo "$2" | awk -v l="$1" -v g="${3:-}" -v base="${base_ratio:-0}" '{
        printf "%-28s %6.1f s of steps in %6.1f s: effective training time %5.1f%%", l, $1, $2, 100 * $3
        if ($4 > 0) printf " (%d faults, %d restarts)", $4, $5
        if (base > 0) printf "; %.3fx the clean run", $3 / base
        if (g != "") printf "; goal >= %d%%: %s", g, (100 * $3 >= g ? "met" : "NOT met")
        printf "\n" }'
}
if [ "$MODE" = long ]; then
    clean=$(run clean "$(steps_for 300)")
    say "clean (5 min)" "$clean"
    base_ratio=$(echo "$clean" | awk '{ print $3 }')
    r=$(run chaos300 "$(steps_for 1200)" --chaos 300,1)
    say "1 fault / 5 min (20 min)" "$r" 95
    r=$(run chaos60 "$(steps_for 1200)" --chaos 60,1)
    say "1 fault / min (20 min)" "$r" 80
else
    n=$(steps_for 75)
    clean=$(run clean "$n")
    say "clean (75 s)" "$clean"
    base_ratio=$(echo "$clean" | awk '{ print $3 }')
    r=$(run chaos20 "$n" --chaos 20,3)
    say "1 fault / 20 s (75 s)" "$r"
fi
echo "(faults: a rank or a node killed, a rank stopped, a NaN rolled back, ENOSPC on a checkpoint; events in $OUT/*/launch.jsonl)"
