#!/bin/sh
# One writer per checkpoint folder. While a training job runs with checkpoints
# in a folder: a second job on the same folder (2 ranks: the refusal is agreed by
# both) fails at start, naming the holder (host, pid, start time); `ckpt synth`
# and `reshard` into a step directory of the folder and `pull` into the folder
# are refused the same way, and nothing is written there. The lock dies with its
# holder: after a SIGKILL of the first job, a new job starts on the folder.
. "$TSR_ROOT/tests/mpi.sh"
CFG="$TSR_ROOT/train/configs/debug.toml"
CK="$TSR_TMP/run/checkpoint"
ARGS="--training.seq_len=32 --metrics.log_freq=1 --lr_scheduler.warmup_steps=2 --training.dataset=tokens
--training.dataset_path=$TSR_TMP/data --checkpoint.enable=true --checkpoint.last_save_model_only=false"

"$T" data prep --out "$TSR_TMP/data" --synthetic 1M >/dev/null || fail "data prep"
# a committed checkpoint elsewhere, as a source for reshard
expect 0 "ckpt synth (a source)" "$T" ckpt synth "$TSR_TMP/src/step-00000001" --bytes 64K

# the holder: a long job
"$T" train --config "$CFG" $ARGS --training.steps=100000 --checkpoint.interval=1000 \
    --job.dump_folder="$TSR_TMP/run" >"$TSR_TMP/holder.log" 2>&1 &
holder=$!
trap 'kill -9 $holder 2>/dev/null' EXIT INT TERM
i=0
while ! grep -q "pid $holder," "$CK/LOCK" 2>/dev/null && [ $i -lt 1200 ]; do sleep 0.05; i=$((i + 1)); done
grep -q "^host .*, pid $holder, started [0-9T:-]*Z$" "$CK/LOCK" || { fail "the lock file does not name the holder: $(cat "$CK/LOCK" 2>&1)"; exit 1; }

# a second job on the same folder, on 2 ranks
run_np 2 "$T" train --config "$CFG" $ARGS --training.steps=4 --training.local_batch_size=4 \
    --job.dump_folder="$TSR_TMP/run" >"$TSR_TMP/second.log" 2>&1
rc=$?
[ $rc != 0 ] || fail "a second job on a held folder: exit 0"
for r in 0 1; do
    grep -q "rank $r: .*another writer holds this checkpoint folder (host .*, pid $holder, started .*Z" "$TSR_TMP/second.log" ||
        fail "second job, rank $r: no refusal naming the holder"
done
grep -q "^step " "$TSR_TMP/second.log" && fail "the second job trained"

# the tools
expect 1 "ckpt synth into a held folder" "$T" ckpt synth "$CK/step-00000099" --bytes 64K
grep -q "another writer holds .*pid $holder" err.txt || fail "ckpt synth: no refusal naming the holder: $(cat err.txt)"
expect 1 "reshard into a held folder" "$T" reshard "$TSR_TMP/src/step-00000001" "$CK/step-00000098" --layout dp_shard=2
grep -q "another writer holds .*pid $holder" err.txt || fail "reshard: no refusal naming the holder: $(cat err.txt)"
AWS_ACCESS_KEY_ID=x AWS_SECRET_ACCESS_KEY=x AWS_REGION=us-east-1 \
    expect 1 "pull into a held folder" "$T" pull s3://bucket/ckpt "$CK" --endpoint http://127.0.0.1:9
grep -q "another writer holds .*pid $holder" err.txt || fail "pull: no refusal naming the holder: $(cat err.txt)"
AWS_ACCESS_KEY_ID=x AWS_SECRET_ACCESS_KEY=x AWS_REGION=us-east-1 \
    expect 1 "pull of a step into a held folder" "$T" pull s3://bucket/ckpt/step-00000001 "$CK/step-00000001" \
    --endpoint http://127.0.0.1:9
grep -q "another writer holds .*pid $holder" err.txt || fail "pull of a step: no refusal naming the holder: $(cat err.txt)"
for s in 99 98 01; do [ -e "$CK/step-000000$s" ] && fail "step-000000$s written into the held folder"; done
kill -0 $holder 2>/dev/null || fail "the holder died: $(tail -3 "$TSR_TMP/holder.log")"

# the holder dies without cleaning up: its lock file stays, its lock does not
kill -9 $holder
wait $holder 2>/dev/null
run_np 1 "$T" train --config "$CFG" $ARGS --training.steps=2 --checkpoint.interval=1 \
    --job.dump_folder="$TSR_TMP/run" >"$TSR_TMP/after.log" 2>&1 || fail "a job after the holder's SIGKILL: exit $?"
[ -f "$CK/step-00000002/MANIFEST" ] || fail "the job after the SIGKILL did not save"
expect 0 "ckpt synth into a free folder" "$T" ckpt synth "$CK/step-00000099" --bytes 64K
expect 0 "reshard into a free folder" "$T" reshard "$TSR_TMP/src/step-00000001" "$CK/step-00000098" --layout dp_shard=2
finish "folder lock: second job, synth, reshard and pull refused while held; free after a SIGKILL"
