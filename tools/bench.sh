#!/bin/sh
# make bench: every benchmark, each a ratio against a baseline measured in the same run.
set -e
BUILD=${1:-build/release}
T="$BUILD/tessera"
echo "== codec: tessera's frame codec against plain zstd, one core, N(0, 0.02) weights"
$T bench codec
echo
echo "== plan: sort-and-sweep resharding planner, one core"
$T bench plan
