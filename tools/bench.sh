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
$T bench plan --grid 1000
echo
echo "== scale: the save plan, the MANIFEST and a load plan onto 0.75x the ranks of a Llama 3 405B-shaped job"
echo "   (AdamW state) at 1024, 4096 and 16384 ranks, simulated on one core (no processes started)"
$T bench scale
echo
echo "== save: a step overlapping a save's copy blocked, against memcpy; background write throughput (adaptive"
echo "   encoding) against the disk, and against a slower disk (a rate-limited store)"
$T bench save --dir "$OUT/save" --bytes 1G
echo
echo "== digests at save: a save of the 124m model's state on one rank with the digest and statistics shares against"
echo "   the same save without them (codec raw, as a trainer with no core to spare saves, and auto), alternately, 25 rounds"
$T bench save --dir "$OUT/digests" --digests --rounds 25
echo
echo "== overlap: checkpoints every 5 steps against none, blocked per save and step time (124m on one rank,"
echo "   the small model on 4 ranks)"
sh tools/bench_overlap.sh "$T" "$OUT/overlap"
echo
echo "== load: 1 GiB saved on 4 ranks (dp_shard=2,tp=2), loaded there and on 3 ranks (dp_shard=3)"
rm -rf "$OUT/load"
$MPIRUN -np 4 $T ckpt synth "$OUT/load" --layout dp_shard=2,tp=2 --bytes 1G --dtype bf16 >/dev/null
# the rank outside the 3-rank layout sleeps while the others load (bench load's
# idle barrier) and yields in MPI's own waits, leaving the cores to the three
# that load, as a 3-rank job would (Open MPI's waits otherwise spin)
$MPIRUN --mca mpi_yield_when_idle 1 -np 4 $T bench load "$OUT/load" --layout dp_shard=3
echo
echo "== digests at load: the same checkpoint loaded with the digest check and without it, alternately, in the"
echo "   saved layout and on 3 ranks (dp_shard=3)"
$MPIRUN --mca mpi_yield_when_idle 1 -np 4 $T bench load "$OUT/load" --layout dp_shard=3 --digests --rounds 31
echo "   and the same with the page cache dropped before every load (read from the disk)"
$MPIRUN --mca mpi_yield_when_idle 1 -np 4 $T bench load "$OUT/load" --layout dp_shard=3 --digests --cold --rounds 3
echo
echo "== replica check: the debug model on 4 ranks (dp_replicate=2, dp_shard=2), the replicas compared every 10 steps"
echo "   (training.sdc_check_interval=10) against runs without (0), alternately; step time from the done lines"
sh tools/bench_sdc.sh "$T" "$OUT/sdc"
echo
num() { echo "$1" | sed "s/.*\"$2\":\([0-9.]*\).*/\1/"; }
echo "== load, cold: 2 GiB bf16 saved on 4 ranks (dp_shard=2,tp=2), the page cache dropped before every load,"
echo "   in the saved layout and on 3 ranks (dp_shard=3), against the disk's O_DIRECT read bandwidth"
rm -rf "$OUT/cold"
$MPIRUN -np 4 $T ckpt synth "$OUT/cold/ck" --layout dp_shard=2,tp=2 --bytes 2G --dtype bf16 >/dev/null
res=$($MPIRUN --mca mpi_yield_when_idle 1 -np 4 $T bench load "$OUT/cold/ck" --layout dp_shard=3 --cold --rounds 3 --json)
disk=$($T bench disk --dir "$OUT/cold/probe" --bytes 1G --json)
awk -v raw="$(num "$res" bytes)" -v st="$(num "$res" stored_bytes)" -v a="$(num "$res" saved_s)" \
    -v b="$(num "$res" other_s)" -v r="$(num "$disk" read_Bps)" 'BEGIN {
    printf "cold load, saved layout: %.2f s, %.0f MB/s of stored bytes (%.0f MB/s raw): %.2fx the disk read bandwidth (%.0f MB/s) (goal >= 0.8)  %s\n",
        a, st / a / 1e6, raw / a / 1e6, st / a / r, r / 1e6, (st / a / r >= 0.8) ? "ok" : "MISSED"
    printf "cold load, dp_shard=3 on 3 ranks: %.2f s: %.2fx the saved layout'"'"'s (goal <= 1.1)  %s\n", b, b / a, (b / a <= 1.1) ? "ok" : "MISSED" }'
rm -rf "$OUT/cold"
echo
echo "== reshard: bf16 checkpoints saved on 4 ranks (dp_shard=2,tp=2) rewritten offline for dp_shard=3"
for size in 2G 8G; do
    rm -rf "$OUT/rs"
    $MPIRUN -np 4 $T ckpt synth "$OUT/rs/src" --layout dp_shard=2,tp=2 --bytes $size --dtype bf16 >/dev/null
    # the source read from the disk, not from the page cache (where the kernel lets us)
    sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
    res=$($T reshard "$OUT/rs/src" "$OUT/rs/dst" --layout dp_shard=3 --json)
    disk=$($T bench disk --dir "$OUT/rs" --bytes 1G --json)
    awk -v size=$size -v b="$(num "$res" bytes)" -v s="$(num "$res" seconds)" -v rss="$(num "$res" peak_rss_bytes)" \
        -v w="$(num "$disk" write_Bps)" -v r="$(num "$disk" read_Bps)" 'BEGIN {
        printf "reshard %s: %.0f MB/s of raw bytes in %.1f s: %.2fx the disk write bandwidth (%.0f MB/s), %.2fx its read bandwidth (%.0f MB/s); peak RSS %.0f MiB\n",
            size, b / s / 1e6, s, b / s / w, w / 1e6, b / s / r, r / 1e6, rss / 1048576 }'
done
echo "== reshard without re-encoding: 2 GiB bf16 saved on 4 ranks (dp_shard=4) consolidated (dp_shard=1): whole"
echo "   chunks copied as they are stored; against the disk's read bandwidth (goal >= 0.8) and a raw-codec reshard"
rm -rf "$OUT/rs"
$MPIRUN -np 4 $T ckpt synth "$OUT/rs/src" --layout dp_shard=4 --bytes 2G --dtype bf16 >/dev/null
sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
res=$($T reshard "$OUT/rs/src" "$OUT/rs/dst" --layout dp_shard=1 --json)
sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
raw=$($T reshard "$OUT/rs/src" "$OUT/rs/raw" --layout dp_shard=1 --codec raw --json)
disk=$($T bench disk --dir "$OUT/rs" --bytes 1G --json)
stored=$(du -sb "$OUT/rs/src" | cut -f1)
# the floor of any rewrite on this disk: a copy of the source's files (cp, then sync)
sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
t0=$(date +%s.%N); cp -r "$OUT/rs/src" "$OUT/rs/cp"; sync; t1=$(date +%s.%N)
awk -v b="$(num "$res" bytes)" -v s="$(num "$res" seconds)" -v rs="$(num "$raw" seconds)" -v st="$stored" \
    -v r="$(num "$disk" read_Bps)" -v cp="$(echo "$t1 - $t0" | bc)" 'BEGIN {
    printf "reshard dp_shard=4 -> 1: %.2f s, %.0f MB/s of the source'"'"'s stored bytes (%.0f MB/s raw): %.2fx the disk read bandwidth (%.0f MB/s) (goal >= 0.8)  %s\n",
        s, st / s / 1e6, b / s / 1e6, st / s / r, r / 1e6, (st / s / r >= 0.8) ? "ok" : "MISSED"
    printf "reshard dp_shard=4 -> 1: %.2fx the time of a raw-codec reshard (%.2f s) (goal <= 1)  %s\n", s / rs, rs, (s <= rs) ? "ok" : "MISSED"
    printf "reshard dp_shard=4 -> 1: %.2fx the time of a plain copy of the source'"'"'s files on the same disk (cp -r, then sync: %.2f s)\n", s / cp, cp }'
rm -rf "$OUT/rs"

echo
echo "== local tier: recovery from node memory against the durable tier, and its cost per step (small model,"
echo "   8 ranks as 2 nodes of 4 under tessera launch)"
sh tools/bench_tier.sh "$T" "$OUT"

echo
echo "== preemption: tessera launch --preempt-grace 5 and SIGTERM, the small model on the virtual cluster, 3 hosts of"
echo "   2 ranks (a snapshot every 5 steps, a checkpoint every 10); what each tier committed within the grace, and the next launch"
sh tools/bench_preempt.sh "$T" "$OUT"

echo
echo "== host lost: the small model on the virtual cluster, 3 hosts of 2 ranks; a host killed: from the kill to the next"
echo "   training step, on the other hosts, from their memory and partner copies, resharded"
sh tools/bench_hosts.sh "$T" "$OUT"

echo
echo "== s3: push and pull of a 1 GiB checkpoint to an S3 server on loopback (Ceph RGW, made for the run), against aws s3 cp;"
echo "   the bytes that a push and tessera ckpt compact keep of checkpoints saved raw, against their raw bytes"
sh tools/bench_s3.sh "$T" "$OUT/s3"

echo
echo "== dcp: tessera beside PyTorch Distributed Checkpoint, 2 gloo processes, the same state and disk: DCP's"
echo "   FileSystemWriter (thread_count = cores, files synced) against tessera's plug-in (tessera.dcp), alternately"
PY=$(sh tests/py_setup.sh)
TESSERA_LIB="$BUILD" PYTHONPATH=python "$PY" tools/bench_dcp.py "$OUT/dcp" 2
echo
echo "== dcp to S3: the same 124m state to Ceph RGW on loopback (a cluster made for the run), 2 gloo processes:"
echo "   DCP with s3torchconnector against tessera's plug-in, both through tests/s3proxy.py --etag-header"
TESSERA_LIB="$BUILD" sh tools/bench_dcp_s3.sh "$OUT/dcp-s3" 2
echo
echo "== gemm: this machine's sgemm throughput on the 124m model's matrix products (the trainer's threads),"
echo "   measured before and after the training run below; the peak is the better of the two"
gemm=$($T bench gemm --config train/configs/124m.toml --json)
echo "$gemm"
echo
echo "== train: the 124m model (162M parameters), 2048 tokens an optimizer step in micro-batches of 4 x 64 tokens"
echo "   (gradient accumulation): on one rank (8 micro-batches a step, async checkpoint every 5 steps), then on 2 ranks"
echo "   (dp_shard=2: 4 micro-batches a rank; tp=2: 8), against the same sgemm peak; then one micro-batch a step"
rm -rf "$OUT/train"
$T train --config train/configs/124m.toml --job.dump_folder="$OUT/train" --training.steps=10 \
    --training.global_batch_size=32 --checkpoint.interval=5 --metrics.log_freq=5 | tee "$OUT/train.log"
gemm2=$($T bench gemm --config train/configs/124m.toml --json)
echo "$gemm2"
# model FLOP/s = tokens/s x FLOP per token (6 P + 6 L T D: P matmul parameters,
# L layers, T tokens a sequence, D attention width; see tools/bench_gemm.c),
# against the sgemm peak measured around it on the same products and threads
awk -v fpt="$(num "$gemm" flop_per_token)" -v p1="$(num "$gemm" peak_Fps)" -v p2="$(num "$gemm2" peak_Fps)" '/^done:/ {
    peak = p1 > p2 ? p1 : p2
    for (i = 1; i <= NF; i++) { if ($i == "tokens/s,") tps = $(i-1); if ($i ~ /^\(.*%\)$/ && share == "") share = $i }
    gsub(/[()%]/, "", share)
    printf "train 124m: %.1f tokens/s x %.4g FLOP/token = %.2f GFLOP/s of model FLOPs, %.2fx the sgemm peak (%.2f GFLOP/s) (goal >= 0.85)  %s\n", tps, fpt, tps * fpt / 1e9, tps * fpt / peak, peak / 1e9, (tps * fpt / peak >= 0.85) ? "ok" : "MISSED"
    printf "train 124m: %.2f%% of step time blocked on checkpoints, one every 5 steps (goal < 1%%)  %s\n", share, (share < 1) ? "ok" : "MISSED" }' "$OUT/train.log"
# the same model on 2 ranks, the machine's cores shared between them, against the
# same sgemm peak (the machine's, on one rank's products with every core)
for par in data_parallel_shard_degree tensor_parallel_degree; do
    rm -rf "$OUT/train2"
    $MPIRUN -np 2 $T train --config train/configs/124m.toml --job.dump_folder="$OUT/train2" --training.steps=4 \
        --training.global_batch_size=32 --metrics.log_freq=2 --parallelism.$par=2 >"$OUT/train2.log" 2>&1 ||
        { cat "$OUT/train2.log"; exit 1; }
    awk -v par=$par -v fpt="$(num "$gemm" flop_per_token)" -v p1="$(num "$gemm" peak_Fps)" -v p2="$(num "$gemm2" peak_Fps)" '/^done:/ {
        peak = p1 > p2 ? p1 : p2
        for (i = 1; i <= NF; i++) if ($i == "tokens/s,") tps = $(i-1)
        printf "train 124m, 2 ranks, %s=2: %.1f tokens/s = %.2f GFLOP/s of model FLOPs, %.2fx the sgemm peak (goal >= 0.75)  %s\n",
            par, tps, tps * fpt / 1e9, tps * fpt / peak, (tps * fpt / peak >= 0.75) ? "ok" : "MISSED" }' "$OUT/train2.log"
done
# one micro-batch of 4 x 64 tokens a step: the optimizer's pass over every
# parameter (AdamW, the gradient norm) weighs eight times as much on each token
rm -rf "$OUT/train"
$T train --config train/configs/124m.toml --job.dump_folder="$OUT/train" --training.steps=12 \
    --checkpoint.enable=false --metrics.log_freq=12 >"$OUT/train1.log" 2>&1 || { cat "$OUT/train1.log"; exit 1; }
awk -v fpt="$(num "$gemm" flop_per_token)" -v p1="$(num "$gemm" peak_Fps)" -v p2="$(num "$gemm2" peak_Fps)" '/^done:/ {
    peak = p1 > p2 ? p1 : p2
    for (i = 1; i <= NF; i++) if ($i == "tokens/s,") tps = $(i-1)
    printf "train 124m, one micro-batch of 4 x 64 tokens a step: %.1f tokens/s = %.2f GFLOP/s, %.2fx the sgemm peak (no goal: the optimizer step is paid every 256 tokens)\n",
        tps, tps * fpt / 1e9, tps * fpt / peak }' "$OUT/train1.log"
rm -rf "$OUT"

echo
echo "== chaos: effective training time (productive step time / wall time) under tessera launch --chaos,"
echo "   the debug model on 8 ranks as 2 nodes of 4, against the same job without faults (make bench-long: 20 min runs)"
sh tools/bench_chaos.sh "$T" "$OUT/chaos" short
