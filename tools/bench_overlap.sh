#!/bin/sh
# bench_overlap.sh TESSERA OUT: what checkpoints cost a training loop whose save
# copies overlap the next step (make bench). Two jobs, the same steps with a
# save every 5 steps and without checkpoints: 124m on one rank, and the small
# model on 4 ranks (dp_shard=4). Prints, for each:
#  - blocked per save: the loop's time in the save calls and in the waits
#    before the optimizer steps (ckpt_blocked_s, summed over the run, over the
#    saves), against a memcpy of the rank's saved bytes (parameters and both
#    AdamW moments in f32), from `tessera bench disk`'s one-thread memcpy
#    bandwidth measured in the same run; goal <= 0.1; the median save's beside
#    it (where ranks outnumber the cores, a save call's wall time holds
#    whatever slice of another thread the kernel runs at its wake-up);
#  - the mean step time (after the first 5) against the run without saves;
#    goal <= 5% above.
# For the small model also the digests' and statistics' part of that (FORMAT.md
# 4.4, 4.5): the runs with saves every 5 steps with them and without them
# (TSR_BENCH_NO_DIGESTS=1), twice each, alternately; goal: no measurable step
# cost (the mean step at most 1% above).
set -e
T=$1
OUT=$2
PY=python3
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none"
mkdir -p "$OUT"
memcpy=$($T bench disk --dir "$OUT/probe" --bytes 1G --json | sed 's/.*"memcpy_Bps":\([0-9.]*\).*/\1/')
rm -rf "$OUT/probe"

# run NAME NP ARGS...: a job into $OUT/NAME (the environment variable
# TSR_BENCH_NO_DIGESTS passed on when set)
run() {
    name=$1 np=$2
    shift 2
    rm -rf "$OUT/$name"
    $MPIRUN ${TSR_BENCH_NO_DIGESTS:+-x TSR_BENCH_NO_DIGESTS} -np "$np" $T train --job.dump_folder="$OUT/$name" --metrics.log_freq=1 "$@" >"$OUT/$name.log" 2>&1 ||
        { echo "bench overlap: $name failed ($OUT/$name.log)" >&2; exit 1; }
}

# report LABEL SAVED NOSAVE PARAMS RANKS
report() {
    $PY - "$OUT/$2/metrics.jsonl" "$OUT/$3/metrics.jsonl" "$4" "$5" "$memcpy" "$1" <<'EOF'
import json, sys
def load(p):
    return [json.loads(l) for l in open(p)]
saved, plain = load(sys.argv[1]), load(sys.argv[2])
params, ranks, memcpy, label = float(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), sys.argv[6]
def mean_step(ms):
    # seconds a step from tokens/s: every line is one step (log_freq = 1)
    ts = [1.0 / m["tokens_per_s"] for m in ms if m["step"] > 5]
    return sum(ts) / len(ts)
# tokens per step are the same in both runs: the ratio of the means of 1/(tokens/s)
ratio = mean_step(saved) / mean_step(plain)
saves = len([m for m in saved if m["step"] % 5 == 0])
blocked = sum(m["ckpt_blocked_s"] for m in saved) / saves
# each save's blocked time shows on the line of the step after it
each = sorted(m["ckpt_blocked_s"] for m in saved if m["step"] % 5 == 1 and m["step"] > 1)
median = each[len(each) // 2] if each else 0
state = 12.0 * params / ranks  # f32 parameters and both moments, per rank
copy = state / memcpy
print("%s: blocked %.1f ms per save (%d saves; median %.2f ms) against a memcpy of the rank's %.0f MB of state (%.1f ms): %.3fx (goal <= 0.1)  %s"
      % (label, blocked * 1e3, saves, median * 1e3, state / 1e6, copy * 1e3, blocked / copy, "ok" if blocked / copy <= 0.1 else "MISSED"))
print("%s: mean step %.2f%% above the run without checkpoints (goal <= 5%%)  %s"
      % (label, (ratio - 1) * 100, "ok" if ratio <= 1.05 else "MISSED"))
# the same cost seen inside the run with saves, which no drift of the machine
# between the two runs touches: the steps after a save (its copy, checksums and
# writes run beside them) against the median of the others
step = {m["step"]: 1.0 / m["tokens_per_s"] for m in saved if m["step"] > 5}
after = [v for k, v in step.items() if k % 5 == 1]
others = sorted(v for k, v in step.items() if k % 5 != 1)
if after and others:
    base = others[len(others) // 2]
    extra = sum(after) / len(after) - base
    print("%s: within the run with saves, a step after a save takes %.0f%% longer than the others' median: "
          "%.2f%% a step at a save every 5 (no goal)" % (label, extra / base * 100, extra / base * 100 / 5))
EOF
}

run o124_saved 1 --config train/configs/124m.toml --training.steps=30 --checkpoint.interval=5 --checkpoint.keep_latest_k=2
run o124_plain 1 --config train/configs/124m.toml --training.steps=30 --checkpoint.enable=false
p124=$($T train --config train/configs/124m.toml --model-info | sed -n 's/^model [^:]*: \([0-9]*\) parameters.*/\1/p')
report "124m, one rank" o124_saved o124_plain "$p124" 1
run osmall_saved 4 --config train/configs/small.toml --parallelism.data_parallel_shard_degree=4 --training.steps=60 \
    --checkpoint.interval=5 --checkpoint.keep_latest_k=2
run osmall_plain 4 --config train/configs/small.toml --parallelism.data_parallel_shard_degree=4 --training.steps=60 \
    --checkpoint.enable=false
psmall=$($T train --config train/configs/small.toml --model-info | sed -n 's/^model [^:]*: \([0-9]*\) parameters.*/\1/p')
report "small, 4 ranks" osmall_saved osmall_plain "$psmall" 4
small="--config train/configs/small.toml --parallelism.data_parallel_shard_degree=4 --training.steps=60
    --checkpoint.interval=5 --checkpoint.keep_latest_k=2"
for k in 1 2; do
    run osmall_dig$k 4 $small
    TSR_BENCH_NO_DIGESTS=1 run osmall_nodig$k 4 $small
done
$PY - "$OUT" <<'EOF'
import json, sys
def steps(name):
    ms = [json.loads(l) for l in open("%s/%s/metrics.jsonl" % (sys.argv[1], name))]
    return {m["step"]: 1.0 / m["tokens_per_s"] for m in ms if m["step"] > 5}
def mean_step(name):
    st = steps(name)
    return sum(st.values()) / len(st)
def after_save(name):
    # a step after a save against the median of the others, per step at a save every 5
    st = steps(name)
    after = [v for k, v in st.items() if k % 5 == 1]
    others = sorted(v for k, v in st.items() if k % 5 != 1)
    base = others[len(others) // 2]
    return (sum(after) / len(after) - base) / base / 5 * 100
runs = (1, 2)
dig = sum(mean_step("osmall_dig%d" % k) for k in runs)
nodig = sum(mean_step("osmall_nodig%d" % k) for k in runs)
within = sum(after_save("osmall_dig%d" % k) - after_save("osmall_nodig%d" % k) for k in runs) / len(runs)
print("small, 4 ranks, a save every 5 steps, with the digests and statistics against saves without them (two runs "
      "each, alternately): mean step %+.2f%% (runs apart: the machine's drift between runs shows here)" % ((dig / nodig - 1) * 100))
print("small, 4 ranks, a save every 5 steps: the digests' and statistics' step cost within the runs (the steps after "
      "a save against the others', with them minus without) %+.2f%% a step (goal <= +1%%)  %s"
      % (within, "ok" if within <= 1 else "MISSED"))
EOF
rm -rf "$OUT"/o124_* "$OUT"/osmall_*
