#!/bin/sh
# The trainer on many layouts: the losses and gradient norms of 10 steps of the
# debug model in nine layouts (FSDP, TP, PP with 1F1B, replicated, HSDP,
# PP+FSDP+TP and PP+replicated+TP on 8 ranks, uneven FSDP, GPipe on 3 stages of
# which one is empty) match the single-rank run within 1e-5; resume after
# SIGKILL is bitwise identical (the doubles of the metrics file, 17 digits) on
# the same layout and within 1e-4 on another layout and rank count; bad configs,
# a missing data directory and a checkpoint of another model fail before any
# step, with a message that names the problem.
. "$TSR_ROOT/tests/mpi.sh"
. "$TSR_ROOT/tests/train_jobs.sh"

# the data: the generated corpus, prepared once
"$T" data prep --out "$TSR_TMP/data" --synthetic 1M >/dev/null || fail "data prep"
# the tokens dataset name is any name other than synthetic
train ref 1 --training.global_batch_size=8 --training.local_batch_size=8
train fsdp2 2 --training.global_batch_size=8 --training.local_batch_size=4
train tp2 2 --training.global_batch_size=8 --training.local_batch_size=8 --parallelism.tensor_parallel_degree=2
train pp2_1f1b 2 --training.global_batch_size=8 --training.local_batch_size=8 --parallelism.pipeline_parallel_degree=2 \
    --parallelism.pipeline_parallel_microbatch_size=2
train rep2 2 --training.global_batch_size=8 --training.local_batch_size=4 --parallelism.data_parallel_replicate_degree=2
train all8 8 --training.global_batch_size=8 --training.local_batch_size=4 --parallelism.pipeline_parallel_degree=2 \
    --parallelism.tensor_parallel_degree=2 --parallelism.data_parallel_replicate_degree=1 \
    --parallelism.pipeline_parallel_microbatch_size=2
train hsdp4 4 --training.global_batch_size=8 --training.local_batch_size=2 \
    --parallelism.data_parallel_replicate_degree=2 --parallelism.data_parallel_shard_degree=2
train rep_all8 8 --training.global_batch_size=8 --training.local_batch_size=4 --parallelism.pipeline_parallel_degree=2 \
    --parallelism.tensor_parallel_degree=2 --parallelism.data_parallel_replicate_degree=2 \
    --parallelism.data_parallel_shard_degree=1 --parallelism.pipeline_parallel_microbatch_size=2
grep -q "layout pp=2,dp_replicate=2,dp_shard=1,tp=2[,;]" "$TSR_TMP/rep_all8.log" || fail "rep_all8: not the layout asked for"
grep -q "layout pp=2,dp_replicate=1,dp_shard=2,tp=2[,;]" "$TSR_TMP/all8.log" || fail "all8: not the layout asked for"
for l in fsdp2 tp2 pp2_1f1b rep2 all8 rep_all8 hsdp4; do compare ref $l 1e-5; done
# the last line's time in collectives: none on one rank; on 2 ranks a share of the steps
coll() { sed -n 's/^done: .*blocked on checkpoints, \([0-9.]*\) s (\([0-9.]*\)%) in collectives;.*/\1 \2/p' "$TSR_TMP/$1.log"; }
[ "$(coll ref)" = "0.0 0.0" ] || fail "ref: one rank reports time in collectives: '$(coll ref)'"
for l in fsdp2 tp2; do # seconds in one decimal: a 10-step job's share is the figure
    set -- $(coll $l)
    awk -v p="${2:-0}" 'BEGIN { exit !(p > 0 && p < 100) }' || fail "$l: no time in collectives on its last line: '$*'"
done
# uneven: 3 shards of 128 rows, 3 stages of 4 layers (2, 2, 0), GPipe
train ref6 1 --training.global_batch_size=6 --training.local_batch_size=6
train fsdp3 3 --training.global_batch_size=6 --training.local_batch_size=2
train pp3_gpipe 3 --training.global_batch_size=6 --training.local_batch_size=6 --parallelism.pipeline_parallel_degree=3 \
    --parallelism.pipeline_parallel_microbatch_size=1 --parallelism.pipeline_parallel_schedule=GPipe
compare ref6 fsdp3 1e-5
compare ref6 pp3_gpipe 1e-5

# resume: an uninterrupted 30-step run on 4 ranks (dp_shard=2, tp=2) with a checkpoint every 5 steps
RES="--training.steps=30 --training.global_batch_size=8 --training.local_batch_size=4 --checkpoint.enable=true \
--checkpoint.interval=5 --checkpoint.async_mode=async --training.dataset=tokens --training.dataset_path=$TSR_TMP/data"
job() { # NP DIR ARGS...
    np=$1 dir=$2; shift 2
    run_np "$np" "$T" train --config "$CFG" $COMMON $RES --job.dump_folder="$TSR_TMP/$dir" "$@"
}
job 4 full --parallelism.tensor_parallel_degree=2 --checkpoint.export_dtype=bfloat16 >"$TSR_TMP/full.log" 2>&1 ||
    fail "resume: uninterrupted run"
# killed with SIGKILL once step 10 is committed, then restarted on the same layout
killed_run() { # DIR: starts the job, kills it once step 10 is committed
    dir=$1
    job 4 "$dir" --parallelism.tensor_parallel_degree=2 >"$TSR_TMP/$dir.log" 2>&1 &
    pid=$!
    i=0
    while [ ! -f "$TSR_TMP/$dir/checkpoint/step-00000010/MANIFEST" ] && [ $i -lt 6000 ]; do sleep 0.05; i=$((i + 1)); done
    # SIGKILL: mpirun and every rank at once
    pkill -9 -P $pid 2>/dev/null; kill -9 $pid 2>/dev/null
    pkill -9 -f "job.dump_folder=$TSR_TMP/$dir" 2>/dev/null
    wait $pid 2>/dev/null
    [ -f "$TSR_TMP/$dir/checkpoint/step-00000010/MANIFEST" ] || fail "resume: step 10 never committed"
}
killed_run same
job 4 same --parallelism.tensor_parallel_degree=2 >"$TSR_TMP/same2.log" 2>&1 || fail "resume: restart on the same layout"
grep -q "resumed from" "$TSR_TMP/same2.log" || fail "resume: the restart did not resume"
compare full same 0
# killed, then restarted on 2 ranks (dp_shard=2): resharded on load
killed_run other
job 2 other --parallelism.tensor_parallel_degree=1 >"$TSR_TMP/other2.log" 2>&1 || fail "resume: restart on 2 ranks"
grep -q "resumed from.*loaded as pp=1,dp_replicate=1,dp_shard=2,tp=1" "$TSR_TMP/other2.log" ||
    fail "resume: the 2-rank restart did not reshard"
compare full other 1e-4
# the final model-only checkpoint verifies, holds the model's 39 tensors in bf16 and nothing else
M="$TSR_TMP/full/checkpoint/model-step-00000030"
"$T" ckpt verify "$M" >/dev/null || fail "model-only checkpoint does not verify"
"$T" ckpt info "$M" --json >"$TSR_TMP/model.json" || fail "ckpt info of the model-only checkpoint"
$PY - "$TSR_TMP/model.json" <<'EOF' || fail "model-only checkpoint: wrong tensors or dtype"
import json, sys
m = json.load(open(sys.argv[1]))
ts = m["tensors"]
assert len(ts) == 39 and all(t["dtype"] == "bf16" and not t["name"].startswith("optim.") for t in ts), ts[:3]
EOF

# errors before any step
expect_fail() { # NAME PATTERN CMD...: exits nonzero, says PATTERN, trains no step
    name=$1 pat=$2; shift 2
    "$@" >"$TSR_TMP/$name.out" 2>&1 && fail "$name: exit 0"
    grep -q "$pat" "$TSR_TMP/$name.out" || { fail "$name: no '$pat' in the message"; cat "$TSR_TMP/$name.out" >&2; }
    grep -q "^step " "$TSR_TMP/$name.out" && fail "$name: trained before failing"
    true
}
expect_fail badkey "did you mean" "$T" train --config "$CFG" --training.stepz=3
expect_fail badval "training.steps" "$T" train --config "$CFG" --training.steps=abc
expect_fail baddeg "tensor_parallel_degree" "$T" train --config "$CFG" --parallelism.tensor_parallel_degree=3
expect_fail nodata "$TSR_TMP/nowhere" "$T" train --config "$CFG" --job.dump_folder="$TSR_TMP/nd" \
    --training.dataset=tokens --training.dataset_path="$TSR_TMP/nowhere"
# a failure on one rank only ends the whole job at once, with its reason
expect_fail onerank "cannot open the metrics file" run_np 2 "$T" train --config "$CFG" $COMMON --training.steps=3 \
    --job.dump_folder="$TSR_TMP/onerank" --metrics.file=/nonexistent/m.jsonl --training.dataset=tokens \
    --training.dataset_path="$TSR_TMP/data"
mkdir -p "$TSR_TMP/shape"
cp -r "$TSR_TMP/full/checkpoint" "$TSR_TMP/shape/"
expect_fail shape "another model" "$T" train --config "$CFG" $COMMON --job.dump_folder="$TSR_TMP/shape" \
    --checkpoint.enable=true --model.flavor=small --training.dataset=tokens --training.dataset_path="$TSR_TMP/data"
"$T" train --config "$CFG" --model-info --model.flavor=8b --parallelism.data_parallel_shard_degree=64 \
    --parallelism.tensor_parallel_degree=8 --parallelism.pipeline_parallel_degree=4 >"$TSR_TMP/info.out" 2>&1 ||
    fail "model-info 8b"
grep -q "8030261248 parameters" "$TSR_TMP/info.out" || { fail "8b parameter count"; cat "$TSR_TMP/info.out" >&2; }
# a rank that misses a commit (its report 3 s late against a 1 s deadline): the
# save fails on every rank, the next save finds the engine unable to save, and
# the job stops instead of training on without checkpoints
TSR_COMMIT_TIMEOUT=1 TSR_FAULT=delay:3000000:fsync:data-00001 run_np 2 "$T" train --config "$CFG" $COMMON --training.steps=10 \
    --job.dump_folder="$TSR_TMP/hung" --checkpoint.enable --checkpoint.interval=2 --checkpoint.async_mode=async \
    --training.dataset=tokens --training.dataset_path="$TSR_TMP/data" >"$TSR_TMP/hung.out" 2>&1 &&
    fail "hung commit: the job went on"
grep -q "rank 1 did not report within 1.0 s" "$TSR_TMP/hung.out" || { fail "hung commit: not reported"; cat "$TSR_TMP/hung.out" >&2; }
grep -q "checkpointing cannot go on" "$TSR_TMP/hung.out" || { fail "hung commit: no stop"; cat "$TSR_TMP/hung.out" >&2; }
grep -q "^step *10 " "$TSR_TMP/hung.out" && fail "hung commit: trained to the end"
# checkpoint.codec = "auto" on a trainer that keeps every core busy (one rank, as
# many OpenMP threads as cores): every frame raw, since an encoded one would be paid
# for in step time; a codec asked for is kept
codecs() { # checkpoint root: "codec count" lines of its newest checkpoint's frames
    "$T" ckpt info "$1" --json 2>/dev/null | $PY -c '
import collections, json, sys
def walk(o):
    if isinstance(o, dict):
        if "codec" in o: yield o["codec"]
        for x in o.values(): yield from walk(x)
    elif isinstance(o, list):
        for x in o: yield from walk(x)
for k, n in sorted(collections.Counter(walk(json.load(sys.stdin))).items()): print(k, n)'
}
for codec in auto bytegroup; do
    "$T" train --config "$CFG" --job.dump_folder="$TSR_TMP/codec-$codec" --training.steps=2 --checkpoint.enable \
        --checkpoint.interval=2 --checkpoint.last_save_model_only=false --checkpoint.codec=$codec >/dev/null 2>&1 ||
        fail "codec $codec: train"
done
[ "$(codecs "$TSR_TMP/codec-auto/checkpoint" | cut -d' ' -f1)" = raw ] ||
    fail "codec auto with no core to spare: frames $(codecs "$TSR_TMP/codec-auto/checkpoint" | tr '\n' ' '), not all raw"
codecs "$TSR_TMP/codec-bytegroup/checkpoint" | grep -q "^bytegroup " ||
    fail "codec bytegroup asked for: frames $(codecs "$TSR_TMP/codec-bytegroup/checkpoint" | tr '\n' ' ')"

finish "trainer: layouts, resume and errors ok"
