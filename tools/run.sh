#!/bin/sh
# make run: the main job, kept alive by tessera launch. Trains the small Llama
# (about 10M parameters) on the generated corpus on 4 ranks grouped as 2 nodes
# of 2 (dp_shard=2, tp=2), with asynchronous durable checkpoints every 25 steps
# and a snapshot in node memory (the local tier) every step. Mid-run it kills a
# rank (the job restarts on 4 ranks from node memory), then the 2 ranks of
# node 1 (its second failure: the node is dropped with its memory, and the job
# restarts on the 2 ranks of node 0, resharded from node 0's snapshots and its
# partner copies of node 1's files). The event log, the loss curve and the
# restarts are printed at the end, and the kept checkpoints are compacted
# (tessera ckpt compact: the saves stored them raw while training ran).
set -e
BUILD=${1:-build/release}
T="$BUILD/tessera"
RUN=runs/small
rm -rf "$RUN"
mkdir -p "$RUN"
EV="$RUN/launch.jsonl"
# pid_of LAUNCH RANK: the pid of a rank, from its rank_up event (empty until then)
pid_of() { sed -n "s/.*\"event\": \"rank_up\", \"launch\": $1, \"rank\": $2, \"pid\": \([0-9]*\).*/\1/p" "$EV" 2>/dev/null | tail -n 1; }
# wait_until CMD...: polls CMD every 0.2 s while the supervisor runs
wait_until() {
    until "$@"; do
        kill -0 "$SUP" 2>/dev/null || { echo "run: the supervisor ended early" >&2; exit 1; }
        sleep 0.2
    done
}
reached() { grep -q "\"step\": $1," "$RUN/metrics.jsonl" 2>/dev/null; }
has_pid() { [ -n "$(pid_of "$1" "$2")" ]; }

echo "== tessera launch: small model, 4 ranks as 2 nodes of 2 (dp_shard=2, tp=2); durable checkpoints every"
echo "   25 steps in $RUN/checkpoint, a local snapshot in node memory (/dev/shm) every step"
$T launch -np 4 --nodes 2 --min-ranks 2 --backoff 0.5 -- train --config train/configs/small.toml \
    --job.dump_folder="$RUN" --parallelism.data_parallel_shard_degree=2 --parallelism.tensor_parallel_degree=2 \
    --training.steps=120 --metrics.log_freq=10 --checkpoint.local_interval=1 2>&1 |
    grep --line-buffered -v ': removed (retention)$' | tee "$RUN/run.log" &
SUP=$! # the tee: it ends with the supervisor (the local tier's retention, every step, is not shown)
wait_until reached 30
wait_until has_pid 1 3
echo "== run: killing rank 3 (pid $(pid_of 1 3)) at step 30 or so"
kill -9 "$(pid_of 1 3)"
wait_until has_pid 2 2
wait_until has_pid 2 3
wait_until reached 70
echo "== run: killing node 1 (ranks 2 and 3: pids $(pid_of 2 2) $(pid_of 2 3)), its second failure"
kill -9 "$(pid_of 2 2)" "$(pid_of 2 3)"
wait "$SUP"
echo
echo "== the event log ($EV; rank_up and straggler events left out)"
grep -v '"event": "rank_up"\|"event": "straggler"' "$EV"
echo
echo "== the restarts"
grep "^resumed from\|node_dropped\|dropped;" "$RUN/run.log" || true
sed -n 's/.*"event": "recovered", \(.*\)}/recovered: \1/p' "$EV"
echo
echo "== the loss curve (the restarts: above)"
$T plot "$RUN/metrics.jsonl" -o "$RUN/loss.png" --title "tessera: small Llama under tessera launch, a rank then a node lost"
echo
echo "== the kept checkpoints compacted: saved raw while training kept every core busy, re-encoded now"
$T ckpt compact "$RUN/checkpoint"
echo
echo "== the checkpoints"
$T ckpt ls "$RUN/checkpoint"
last=$(ls -d "$RUN"/checkpoint/step-* | tail -n 1)
$T ckpt verify "$last"
[ -e "$(ls -d /dev/shm/tessera-* 2>/dev/null | head -n 1)" ] && echo "(other jobs' local tiers in /dev/shm: $(ls -d /dev/shm/tessera-* | wc -l))"
echo
echo "event log:   $EV"
echo "checkpoints: $RUN/checkpoint"
echo "loss plot:   $RUN/loss.png"
echo "metrics:     $RUN/metrics.jsonl"
