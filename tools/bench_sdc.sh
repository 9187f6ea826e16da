#!/bin/sh
# bench_sdc.sh TESSERA OUT: what the replica corruption check costs (make bench).
# The debug model on 4 ranks, dp_replicate=2 (two replicas of dp_shard=2), the
# replicas' state compared every 10 steps (training.sdc_check_interval=10)
# against the same job without the check (0), in alternating runs. Prints:
#  - the step time (the done line's tokens/s: the same tokens a step in both)
#    with the check against without, the median of the pairs' ratios; goal
#    under 1% more (runs on 4 ranks sharing 2 cores differ by a few percent
#    from one to the next: the median of several pairs);
#  - the check's own share of the steps' time inside the runs with it (their
#    "replica checks:" line), which no drift between runs touches.
set -e
T=$1
OUT=$2
PAIRS=5
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none"
mkdir -p "$OUT"

# run NAME INTERVAL: the job into $OUT/NAME, its log in $OUT/NAME.log
run() {
    rm -rf "$OUT/$1"
    $MPIRUN -np 4 $T train --config train/configs/debug.toml --job.dump_folder="$OUT/$1" --training.steps=40 \
        --metrics.log_freq=40 --parallelism.data_parallel_replicate_degree=2 --training.sdc_check_interval="$2" \
        >"$OUT/$1.log" 2>&1 || { echo "bench sdc: $1 failed ($OUT/$1.log)" >&2; exit 1; }
}

i=0
while [ $i -lt $PAIRS ]; do
    if [ $((i % 2)) -eq 0 ]; then run "on$i" 10; run "off$i" 0; else run "off$i" 0; run "on$i" 10; fi
    i=$((i + 1))
done
for f in "$OUT"/on*.log "$OUT"/off*.log; do
    grep -q '^done:' "$f" || { echo "bench sdc: no done line in $f" >&2; exit 1; }
done
# tokens/s of each run (the field before "tokens/s,"), the check's share of
# each run with it (the "replica checks:" line's percentage)
awk -v pairs=$PAIRS '
function tps(line,   n, f, i) { n = split(line, f, " "); for (i = 2; i <= n; i++) if (f[i] == "tokens/s,") return f[i - 1] }
FILENAME ~ /\/on[0-9]+\.log$/ && /^done:/ { k = FILENAME; sub(/.*\/on/, "", k); sub(/\.log$/, "", k); on[k] = tps($0) }
FILENAME ~ /\/off[0-9]+\.log$/ && /^done:/ { k = FILENAME; sub(/.*\/off/, "", k); sub(/\.log$/, "", k); off[k] = tps($0) }
/^replica checks:/ { n_share++; s = $0; sub(/.*s \(/, "", s); sub(/%.*/, "", s); share[n_share] = s; checks += $3 }
function median(v, n,   i, j, t) {
    for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j - 1] > v[j]; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
    return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
}
END {
    for (k = 0; k < pairs; k++) { r[k + 1] = off[k] / on[k]; a[k + 1] = on[k]; b[k + 1] = off[k] }
    m = (median(r, pairs) - 1) * 100
    printf "replica check every 10 steps, debug model on 4 ranks (dp_replicate=2): step time %+.2f%% against the runs without (%.1f vs %.1f tokens/s, medians of %d alternating pairs of 40-step runs) (goal < 1%%)  %s\n",
        m, median(a, pairs), median(b, pairs), pairs, (m < 1) ? "ok" : "MISSED"
    if (n_share == 0) { print "replica check: no \"replica checks:\" line in the runs with it"; exit 1 }
    s = median(share, n_share)
    printf "replica check every 10 steps: %.2f%% of the steps'"'"' time inside the runs with it (%d checks in %d runs; their replica checks: line, median) (goal < 1%%)  %s\n",
        s, checks, n_share, (s < 1) ? "ok" : "MISSED"
}' "$OUT"/on*.log "$OUT"/off*.log
rm -rf "$OUT"
