#!/bin/sh
# The trainer's device code path on a machine without a GPU: training.device =
# "guard" keeps the trainer's memory where host code cannot touch it (only the
# kernels and copies of its kernel context reach it: any other access is a crash
# that names the spot) and stages its collectives through the host, as ranks
# that share a GPU do. 10 steps of the debug model with checkpoints every 3 steps
# on 1 rank, FSDP, TP, PP (1F1B), HSDP and FSDP+TP give bitwise the losses and
# gradient norms of the same layout on the CPU; a checkpoint of guard ranks
# resumes on CPU ranks in another layout, and a CPU checkpoint on guard ranks,
# within 1e-4 of the uninterrupted run; the final model-only export (bf16, cast
# by the trainer's kernels) holds what the CPU run's does. Mixed precision
# (bf16 operands) gives bitwise the CPU's too, and losses near float32's.
. "$TSR_ROOT/tests/mpi.sh"
. "$TSR_ROOT/tests/train_jobs.sh"

"$T" data prep --out "$TSR_TMP/data" --synthetic 1M >/dev/null || fail "data prep"
CK="--checkpoint.enable=true --checkpoint.interval=3 --checkpoint.async_mode=async --checkpoint.export_dtype=bfloat16"
both() { # NAME NP ARGS...: the job on the CPU and on the guard kind, bitwise equal
    b_name=$1 b_np=$2; shift 2
    train "cpu_$b_name" "$b_np" $CK "$@"
    train "guard_$b_name" "$b_np" $CK --training.device=guard "$@"
    compare "cpu_$b_name" "guard_$b_name" 0
}
both one 1 --training.global_batch_size=8 --training.local_batch_size=8
both fsdp2 2 --training.global_batch_size=8 --training.local_batch_size=4
both tp2 2 --training.global_batch_size=8 --training.local_batch_size=8 --parallelism.tensor_parallel_degree=2
both pp2 2 --training.global_batch_size=8 --training.local_batch_size=8 --parallelism.pipeline_parallel_degree=2 \
    --parallelism.pipeline_parallel_microbatch_size=2
both hsdp4 4 --training.global_batch_size=8 --training.local_batch_size=2 \
    --parallelism.data_parallel_replicate_degree=2 --parallelism.data_parallel_shard_degree=2
both fsdp_tp4 4 --training.global_batch_size=8 --training.local_batch_size=4 --parallelism.tensor_parallel_degree=2
grep -q "layout pp=1,dp_replicate=1,dp_shard=2,tp=2[,;]" "$TSR_TMP/guard_fsdp_tp4.log" ||
    fail "fsdp_tp4: not the layout asked for"
# the staging arena pinned for device copies before the first step, reported
# apart from the saves' blocked time; host state is not pinned
grep -q "^checkpoint staging: [0-9]* MiB pinned for device copies in [0-9.]* s, before the first step" \
    "$TSR_TMP/guard_one.log" || fail "guard: the staging arena's pinning not reported before the first step"
grep -q "pinned" "$TSR_TMP/cpu_one.log" && fail "cpu: host state reported pinned"
# the log says where the trainer runs, its products' precision and its data plane
grep -q "^device guard 0; matrix products with f32 operands; data plane staged through the host$" \
    "$TSR_TMP/guard_fsdp2.log" || fail "guard_fsdp2: the device line is missing or wrong"
grep -q "^device " "$TSR_TMP/cpu_fsdp2.log" && fail "cpu_fsdp2: a device line for the default CPU run"

# the model-only exports of the CPU and guard runs: the same tensors, the same
# bytes; only the config blob differs (it names the device)
for l in one fsdp2; do
    "$T" ckpt diff "$TSR_TMP/cpu_$l/checkpoint/model-step-00000010" "$TSR_TMP/guard_$l/checkpoint/model-step-00000010" \
        --json >"$TSR_TMP/diff_$l.json" 2>&1
    $PY -c 'import json, sys
d = json.load(open(sys.argv[1]))
assert d["differences"] == ["blob train.config (rank -1): contents differ"], d["differences"]
assert d["tensors"] and all(t["elements_differ"] == 0 for t in d["tensors"]), d["tensors"]' "$TSR_TMP/diff_$l.json" ||
        { fail "$l: the model-only exports differ"; cat "$TSR_TMP/diff_$l.json" >&2; }
done

# cross-resumes from step 6: guard (dp_shard=2) -> CPU (tp=2), CPU (dp_shard=2) -> guard (pp=2)
from6() { # SRC DST: DST's checkpoint folder holds SRC's step 6 only
    mkdir -p "$TSR_TMP/$2/checkpoint"
    cp -r "$TSR_TMP/$1/checkpoint/step-00000006" "$TSR_TMP/$2/checkpoint/" || fail "no step 6 in $1"
}
from6 guard_fsdp2 g2c
train g2c 2 $CK --training.global_batch_size=8 --training.local_batch_size=8 --parallelism.tensor_parallel_degree=2
from6 cpu_fsdp2 c2g
train c2g 2 $CK --training.device=guard --training.global_batch_size=8 --training.local_batch_size=8 \
    --parallelism.pipeline_parallel_degree=2 --parallelism.pipeline_parallel_microbatch_size=2
for r in g2c c2g; do
    grep -q "resumed from .*step-00000006" "$TSR_TMP/$r.log" || fail "$r: did not resume from step 6"
    compare cpu_one "$r" 1e-4 7
done

# mixed precision (training.mixed_precision_param = "bfloat16": bf16 operands of
# every matrix product, f32 sums and master state): the guard kind bitwise the
# CPU's; the losses within 0.02 of the float32 run's, and not the same numbers
MP="--training.mixed_precision_param=bfloat16 --training.mixed_precision_reduce=float32"
both bf16_one 1 --training.global_batch_size=8 --training.local_batch_size=8 $MP
both bf16_fsdp_tp4 4 --training.global_batch_size=8 --training.local_batch_size=4 --parallelism.tensor_parallel_degree=2 $MP
grep -q "^device cpu 0; matrix products with bf16 operands; data plane none (1 rank)$" "$TSR_TMP/cpu_bf16_one.log" ||
    fail "cpu_bf16_one: the device line does not say bf16"
$PY - "$TSR_TMP/cpu_one/metrics.jsonl" "$TSR_TMP/cpu_bf16_one/metrics.jsonl" <<'EOF' || fail "bf16: losses not within 0.02 of float32's, or the same"
import json, sys
f32, bf16 = ({o["step"]: o["loss"] for o in map(json.loads, open(p))} for p in sys.argv[1:3])
assert sorted(f32) == sorted(bf16) and len(f32) == 10, (sorted(f32), sorted(bf16))
worst = max(abs(f32[s] - bf16[s]) for s in f32)
print("bf16 against float32: %d steps, worst loss difference %.4g" % (len(f32), worst))
sys.exit(0 if worst <= 0.02 and any(f32[s] != bf16[s] for s in f32) else 1)
EOF

# refused by name, before any step: gradients reduced in bf16; NCCL without a GPU
refused() { # NAME MESSAGE ARGS...
    r_name=$1 r_msg=$2; shift 2
    "$T" train --config "$CFG" $COMMON --training.steps=2 --job.dump_folder="$TSR_TMP/$r_name" "$@" \
        >"$TSR_TMP/$r_name.out" 2>&1 && fail "$r_name: exit 0"
    grep -qF "$r_msg" "$TSR_TMP/$r_name.out" || { fail "$r_name: not refused by name"; cat "$TSR_TMP/$r_name.out" >&2; }
    grep -q "^step " "$TSR_TMP/$r_name.out" && fail "$r_name: trained before failing"
}
refused reduce_bf16 'training.mixed_precision_reduce = "bfloat16": tessera reduces gradients in float32 only' \
    --training.mixed_precision_reduce=bfloat16
refused nccl_guard 'parallelism.data_plane = "nccl" needs training.device = "cuda" (training.device is "guard")' \
    --training.device=guard --parallelism.data_plane=nccl

# a device this build cannot hold is refused before any step, by name
if ! cut -d"|" -f1 "$TSR_BUILD/flags" | grep -q -- "-DTSR_CUDA"; then
    "$T" train --config "$CFG" $COMMON --training.steps=2 --job.dump_folder="$TSR_TMP/nocuda" --training.device=cuda \
        >"$TSR_TMP/nocuda.out" 2>&1 && fail "training.device = cuda in a build without CUDA: exit 0"
    grep -q "training.device: cuda memory: this build holds host memory only" "$TSR_TMP/nocuda.out" ||
        { fail "training.device = cuda: not refused by name"; cat "$TSR_TMP/nocuda.out" >&2; }
    grep -q "^step " "$TSR_TMP/nocuda.out" && fail "training.device = cuda: trained before failing"
fi

finish "the trainer on the guard kind: bitwise the CPU's in six layouts and with bf16 operands, cross-resumes ok"
