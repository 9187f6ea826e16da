#!/bin/sh
# bench_tier.sh TESSERA OUT: the local checkpoint tier (make bench). The small
# model on 8 ranks grouped as 2 nodes of 4 under tessera launch:
#  - recovery, a rank killed at step 25: from node memory (a snapshot every
#    step) and from the durable tier (a checkpoint every 10 steps, its files
#    dropped from the page cache after the kill, as after the loss of a node),
#    each split into relaunch (kill to the new launch), load (the job's own
#    figure) and start and first step (the rest, to the first step completed);
#    and the load of the same durable step from S3 (pushed to moto on loopback),
#    the other place a lost node's job finds its durable tier; and the ceiling
#    of the ratio against the disk (the step's files read from memory);
#  - the cost of a snapshot every step, partner copies included: the median
#    step time against no local tier, over the steps after the first 5 (in
#    which the tier's memory is first allocated); the whole run's time too.
set -e
T=$1
OUT=$2
PY=python3
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none"
JOB="--config train/configs/small.toml --parallelism.data_parallel_shard_degree=8 --metrics.log_freq=1 \
--checkpoint.interval=10"

# recover NAME LOCAL_INTERVAL: prints "total relaunch load first" in seconds
recover() {
    d="$OUT/$1"
    rm -rf "$d"
    mkdir -p "$d"
    $T launch -np 8 --nodes 2 --backoff 1 -- train $JOB --training.steps=30 --job.dump_folder="$d" \
        --checkpoint.local_interval="$2" >"$d.log" 2>&1 &
    sup=$!
    until grep -q '"step": 25,' "$d/metrics.jsonl" 2>/dev/null; do
        kill -0 $sup 2>/dev/null || { echo "bench tier: the job ended before step 25 ($d.log)" >&2; exit 1; }
        sleep 0.05
    done
    pid=$(sed -n 's/.*"event": "rank_up", "launch": 1, "rank": 5, "pid": \([0-9]*\).*/\1/p' "$d/launch.jsonl")
    t_kill=$(date +%s.%N)
    kill -9 "$pid"
    # the durable tier as a lost node leaves it: not in this machine's page cache
    sync
    if ! (echo 3 >/proc/sys/vm/drop_caches) 2>/dev/null; then
        find "$d/checkpoint" -type f -exec dd if={} iflag=nocache count=0 status=none \;
    fi
    wait $sup
    $PY - "$d/launch.jsonl" "$d.log" "$t_kill" <<'EOF'
import json, re, sys
es = [json.loads(l) for l in open(sys.argv[1])]
launch2 = [e["time"] for e in es if e["event"] == "launch" and e["launch"] == 2][0]
rec = [e["time"] for e in es if e["event"] == "recovered"][0]
load = float(re.findall(r"^resumed from .* in ([0-9.]+) s$", open(sys.argv[2]).read(), re.M)[-1])
kill = float(sys.argv[3])
print("%.3f %.3f %.3f %.3f" % (rec - kill, launch2 - kill, load, rec - launch2 - load))
EOF
}
loc=$(recover tier_local 1)
dur=$(recover tier_durable 0)
# the ceiling of the ratio on this machine: no load from memory takes less than
# reading its bytes from memory once; the durable step's files read from tmpfs,
# one reader per core, the best of 3
ds=$(sed -n 's/^resumed from .*\/step-0*\([0-9]*\) (the durable tier.*/\1/p' "$OUT/tier_durable.log" | tail -1)
mem=/dev/shm/tessera-bench-read-$$
rm -rf "$mem"
cp -r "$OUT/tier_durable/checkpoint/$(printf 'step-%08d' "$ds")" "$mem"
memread=9
for i in 1 2 3; do
    t0=$(date +%s.%N)
    ls "$mem"/data-*.tsd | xargs -P "$(nproc)" -n 1 cat >/dev/null
    memread=$(echo "$memread $t0 $(date +%s.%N)" | awk '{ t = $3 - $2; print (t < $1) ? t : $1 }')
done
membytes=$(du -sb "$mem" | cut -f1)
rm -rf "$mem"
# the durable step loaded from S3 on 8 ranks
export TSR_ROOT="$(cd "$(dirname "$0")/.." && pwd)" TSR_TMP="$OUT/tier_s3tmp"
rm -rf "$TSR_TMP" "$OUT/tier_s3"
mkdir -p "$TSR_TMP"
. "$TSR_ROOT/tests/s3.sh"
s3_start bkt
$T push "$OUT/tier_durable/checkpoint/$(printf 'step-%08d' "$ds")" s3://bkt/tier/ >/dev/null 2>&1 ||
    { echo "bench tier: the push of the durable step to S3 failed" >&2; exit 1; }
$MPIRUN -np 8 $T train $JOB --training.steps=$((ds + 1)) --job.dump_folder="$OUT/tier_s3" \
    --checkpoint.initial_load_path="s3://bkt/tier/$(printf 'step-%08d' "$ds")" --checkpoint.initial_load_model_only=false \
    >"$OUT/tier_s3.log" 2>&1
s3_stop || true
s3load=$(sed -n 's/^resumed from s3:.* in \([0-9.]*\) s$/\1/p' "$OUT/tier_s3.log" | tail -1)
[ -n "$s3load" ] || { echo "bench tier: the load from S3 failed ($OUT/tier_s3.log)" >&2; exit 1; }
grep -q "(the local tier, step 2[45]," "$OUT/tier_local.log" || echo "bench tier: the local run did not load step 24 or 25 from node memory"
echo "$loc $dur $s3load $memread $membytes" | awk '{
    printf "recovery, kill to the next step: local tier %.2f s (relaunch %.2f + load %.3f + start and first step %.2f), durable tier %.2f s (relaunch %.2f + load %.3f + start and first step %.2f)\n", $1, $2, $3, $4, $5, $6, $7, $8
    printf "recovery: loading from the local tier %.1fx faster than from the durable tier on disk, page cache dropped (goal >= 10x)  %s\n", $7 / $3, ($7 / $3 >= 10) ? "ok" : "MISSED"
    printf "recovery: the ceiling of that ratio here: the durable step'"'"'s %.0f MB read from memory on %d cores in %.3f s, so no load from memory is more than %.1fx faster than its load from this disk (%.3f s)\n", $11 / 1e6, '"$(nproc)"', $10, $7 / $10, $7
    printf "recovery: loading from the local tier %.1fx faster than from the durable tier on S3 (moto on loopback: %.3f s) (goal >= 10x)  %s\n", $9 / $3, $9, ($9 / $3 >= 10) ? "ok" : "MISSED"
    printf "recovery: kill to the next step from the local tier %.2f s (goal < 5 s)  %s\n", $1, ($1 < 5) ? "ok" : "MISSED" }'

# cost: 30 steps with a snapshot every step (2 nodes: partner copies), and
# without the local tier
for li in 0 1; do
    rm -rf "$OUT/tier_cost$li"
    $MPIRUN -np 8 $T train $JOB --training.steps=30 --job.dump_folder="$OUT/tier_cost$li" \
        --checkpoint.local_interval=$li --checkpoint.local_nodes=0,1 \
        --checkpoint.local_folder=/dev/shm/tessera-bench-$$ >"$OUT/tier_cost$li.log" 2>&1
    rm -rf /dev/shm/tessera-bench-$$
done
$PY - "$OUT/tier_cost0" "$OUT/tier_cost1" <<'EOF'
import json, re, statistics, sys
def figures(d):
    m = [json.loads(l) for l in open(d + "/metrics.jsonl")]
    steps = [m[i]["samples"] * 128 / m[i]["tokens_per_s"] for i in range(len(m)) if m[i]["step"] > 5]
    run = re.findall(r"^done: \d+ steps in ([0-9.]+) s", open(d + ".log").read(), re.M)[-1]
    return statistics.median(steps), float(run)
(a, ra), (b, rb) = figures(sys.argv[1]), figures(sys.argv[2])
print("local tier cost: %.3f s per step (median) with a snapshot every step and its partner copy against %.3f s "
      "without: %.1f%% slower (goal <= 5%%)  %s; the whole 30-step run %.1f s against %.1f s (%.1f%%, start-up included)"
      % (b, a, 100 * (b / a - 1), "ok" if b / a <= 1.05 else "MISSED", rb, ra, 100 * (rb / ra - 1)))
EOF
