#!/bin/sh
# make bench: every benchmark, each a ratio against a baseline measured in the same run.
set -e
BUILD=${1:-build/release}
T="$BUILD/tessera"
OUT=runs/bench
mkdir -p "$OUT"
# no binding: each rank's thread pool may use every core
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none"
echo "== codec: tessera's frame codec against plain zstd, one core, N(0, 0.02) weights"
$T bench codec
echo
echo "== plan: sort-and-sweep resharding planner, one core"
$T bench plan
echo
echo "== save: stall against memcpy, background write throughput against the disk"
$T bench save --dir "$OUT/save" --bytes 1G
echo
echo "== load: 1 GiB saved on 4 ranks (dp_shard=2,tp=2), loaded there and on 3 ranks (dp_shard=3)"
rm -rf "$OUT/load"
$MPIRUN -np 4 $T ckpt synth "$OUT/load" --layout dp_shard=2,tp=2 --bytes 1G --dtype bf16 >/dev/null
$MPIRUN -np 4 $T bench load "$OUT/load" --layout dp_shard=3
rm -rf "$OUT"
