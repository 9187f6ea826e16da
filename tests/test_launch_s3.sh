#!/bin/sh
# tsr-timeout: 300
# An S3 outage while a supervised run archives its checkpoints to S3 (moto on
# loopback behind tests/s3proxy.py, which answers the first 6 uploads with 503
# SlowDown; the client tries each request twice): the archives caught by the
# outage are reported and given up, training never stops (no restart), the
# archives after it succeed, and nothing is lost: the final checkpoint is
# archived, the archive equals the local checkpoint, which equals an
# uninterrupted run's, and every sample was trained once. Then the same with the
# outages injected by tessera launch --chaos (kind s3: every S3 request of the
# ranks answered 503 for 3 s), straight to moto: each push retries through the
# outage, and the run ends as before.
. "$TSR_ROOT/tests/mpi.sh"
cd "$TSR_TMP" || exit 1
. "$TSR_ROOT/tests/s3.sh"
s3_start bkt
CFG="$TSR_ROOT/train/configs/debug.toml"
PY=/usr/bin/python3
"$T" data prep --out "$TSR_TMP/data" --synthetic 1M >/dev/null || fail "data prep"
JOB="--config $CFG --training.seq_len=32 --metrics.log_freq=1 --lr_scheduler.warmup_steps=2 --training.steps=24 \
--training.global_batch_size=8 --training.local_batch_size=2 --checkpoint.enable --checkpoint.interval=4 \
--checkpoint.last_save_model_only=false --training.dataset=tokens --training.dataset_path=$TSR_TMP/data"
run_np 2 "$T" train $JOB --job.dump_folder="$TSR_TMP/ref" >ref.log 2>&1 || fail "ref: exit $?"

proxy_start --fail-first 6 --only-method PUT,POST
AWS_ENDPOINT_URL=$PROXY_URL TSR_S3_MAX_ATTEMPTS=2 TSR_S3_RETRY_SECONDS=5 "$T" launch -np 2 --backoff 0.2 -- train $JOB \
    --job.dump_folder="$TSR_TMP/arch" --checkpoint.archive_url=s3://bkt/run/ --checkpoint.archive_interval=1 \
    >arch.log 2>&1 || { fail "arch: exit $?"; tail -5 arch.log >&2; }
proxy_stop
grep -q '"event": "finish", "launch": 1, "status": "ok", "restarts": 0' "$TSR_TMP/arch/launch.jsonl" ||
    { fail "arch: the run did not finish in one launch"; tail -3 "$TSR_TMP/arch/launch.jsonl" >&2; }
n=$(grep -c "archive of .*step-000000[0-9][0-9] to s3://bkt/run/step-000000[0-9][0-9] failed" arch.log)
[ "$n" -ge 1 ] || { fail "arch: no archive failure reported during the outage"; grep -i archiv arch.log >&2; }
expect 0 "ls the archive" "$T" ls s3://bkt/run/ --json
$PY -c 'import json; v = json.load(open("out.txt")); assert (24, "committed") in [(d["step"], d["status"]) for d in v], v' ||
    fail "arch: the final checkpoint was not archived"
expect 0 "pull the final archive" "$T" pull s3://bkt/run/step-00000024 pulled
expect 0 "the archive equals the local checkpoint" "$T" ckpt diff "$TSR_TMP/arch/checkpoint/step-00000024" pulled
"$T" ckpt diff "$TSR_TMP/ref/checkpoint/step-00000024" "$TSR_TMP/arch/checkpoint/step-00000024" --json >diff.json
$PY -c 'import json, sys; d = json.load(open(sys.argv[1]))["differences"]
sys.exit(0 if d == ["blob train.config (rank -1): contents differ"] else 1)' diff.json ||
    { fail "arch: the final checkpoint differs from an uninterrupted run's"; cat diff.json >&2; }
$PY "$TSR_ROOT/tests/samples_check.py" "$TSR_TMP/arch/metrics.jsonl" "$TSR_TMP/arch/launch.jsonl" 24 >/dev/null ||
    fail "arch: samples lost or trained twice"

# chaos: S3 outages, and nothing else
"$T" launch -np 2 --backoff 0.2 --chaos 1.5,5,s3 -- train $JOB --job.dump_folder="$TSR_TMP/chaos" \
    --checkpoint.archive_url=s3://bkt/chaos/ --checkpoint.archive_interval=1 >chaos.log 2>&1 ||
    { fail "chaos: exit $?"; tail -5 chaos.log >&2; }
grep -q '"event": "finish", "launch": 1, "status": "ok", "restarts": 0' "$TSR_TMP/chaos/launch.jsonl" ||
    { fail "chaos: the run did not finish in one launch"; tail -3 "$TSR_TMP/chaos/launch.jsonl" >&2; }
n=$(grep -c '"event": "chaos", .*"kind": "s3"' "$TSR_TMP/chaos/launch.jsonl")
[ "$n" -ge 1 ] || fail "chaos: no S3 outage injected"
grep -v '"kind": "s3"' "$TSR_TMP/chaos/launch.jsonl" | grep -q '"event": "chaos"' && fail "chaos: a fault of another kind"
grep -q "HTTP 503 SlowDown: an injected S3 outage (tessera launch --chaos) (attempt 1; retrying)" chaos.log ||
    { fail "chaos: no request retried through an injected outage"; grep -i 's3\|archiv' chaos.log | head >&2; }
expect 0 "ls the chaos archive" "$T" ls s3://bkt/chaos/ --json
$PY -c 'import json; v = json.load(open("out.txt")); assert (24, "committed") in [(d["step"], d["status"]) for d in v], v' ||
    fail "chaos: the final checkpoint was not archived"
expect 0 "pull the final chaos archive" "$T" pull s3://bkt/chaos/step-00000024 pulled_chaos
expect 0 "the chaos archive equals the local checkpoint" "$T" ckpt diff "$TSR_TMP/chaos/checkpoint/step-00000024" pulled_chaos
"$T" ckpt diff "$TSR_TMP/ref/checkpoint/step-00000024" "$TSR_TMP/chaos/checkpoint/step-00000024" --json >diff.json
$PY -c 'import json, sys; d = json.load(open(sys.argv[1]))["differences"]
sys.exit(0 if d == ["blob train.config (rank -1): contents differ"] else 1)' diff.json ||
    { fail "chaos: the final checkpoint differs from an uninterrupted run's"; cat diff.json >&2; }
finish "launch s3: an S3 outage while archiving reported, the run finished, nothing lost; injected outages (--chaos s3) retried through"
