#!/bin/sh
# make run: the main job. Trains the small Llama (about 10M parameters) on the
# generated corpus on 4 ranks (dp_shard=2, tp=2) with asynchronous checkpoints,
# then draws the loss curve and lists the checkpoints.
set -e
BUILD=${1:-build/release}
T="$BUILD/tessera"
RUN=runs/small
rm -rf "$RUN"
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none"
echo "== train: small model, 4 ranks (dp_shard=2, tp=2), checkpoints every 25 steps in $RUN/checkpoint"
$MPIRUN -np 4 $T train --config train/configs/small.toml --job.dump_folder="$RUN" \
    --parallelism.data_parallel_shard_degree=2 --parallelism.tensor_parallel_degree=2
echo
echo "== the loss curve"
$T plot "$RUN/metrics.jsonl" -o "$RUN/loss.png" --title "tessera: small Llama, dp_shard=2 tp=2"
echo
echo "== the checkpoints"
$T ckpt ls "$RUN/checkpoint"
last=$(ls -d "$RUN"/checkpoint/step-* | tail -n 1)
$T ckpt verify "$last"
echo
echo "== resume on 2 ranks (dp_shard=2) from $last, resharded on load: 10 more steps"
$MPIRUN -np 2 $T train --config train/configs/small.toml --job.dump_folder="$RUN" \
    --parallelism.data_parallel_shard_degree=2 --training.steps=$(( $(basename "$last" | sed 's/step-0*//') + 10 )) \
    --metrics.log_freq=5
$T plot "$RUN/metrics.jsonl" -o "$RUN/loss.png" --title "tessera: small Llama, dp_shard=2 tp=2, resumed on 2 ranks"
echo
echo "checkpoints: $RUN/checkpoint"
echo "loss plot:   $RUN/loss.png"
echo "metrics:     $RUN/metrics.jsonl"
