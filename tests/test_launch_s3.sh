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
. "$TSR_ROOT/tests/launch.sh"
JOB="--config $CFG --training.seq_len=32 --metrics.log_freq=1 --lr_scheduler.warmup_steps=2 --training.steps=24 \
--training.global_batch_size=8 --training.local_batch_size=2 --checkpoint.enable --checkpoint.interval=4 \
--checkpoint.last_save_model_only=false --training.dataset=tokens --training.dataset_path=$TSR_TMP/data"
run_np 2 "$T" train $JOB --job.dump_folder="$TSR_TMP/ref" >ref.log 2>&1 || fail "ref: exit $?"

# archived NAME PREFIX: the run NAME finished in one launch, its final
# checkpoint archived under s3://bkt/PREFIX/ equals its local one, and the run
# equals the uninterrupted one (compare: losses, data positions, every sample
# once, the final checkpoint)
archived() {
    grep -q '"event": "finish", "launch": 1, "status": "ok", "restarts": 0' "$TSR_TMP/$1/launch.jsonl" ||
        { fail "$1: the run did not finish in one launch"; tail -3 "$TSR_TMP/$1/launch.jsonl" >&2; }
    expect 0 "ls the archive of $1" "$T" ls "s3://bkt/$2/" --json
    $PY -c 'import json; v = json.load(open("out.txt")); assert (24, "committed") in [(d["step"], d["status"]) for d in v], v' ||
        fail "$1: the final checkpoint was not archived"
    expect 0 "pull the final archive of $1" "$T" pull "s3://bkt/$2/step-00000024" "pulled-$1"
    expect 0 "the archive of $1 equals the local checkpoint" "$T" ckpt diff "$TSR_TMP/$1/checkpoint/step-00000024" "pulled-$1"
    compare ref "$1" 0
}

proxy_start --fail-first 6 --only-method PUT,POST
AWS_ENDPOINT_URL=$PROXY_URL TSR_S3_MAX_ATTEMPTS=2 TSR_S3_RETRY_SECONDS=5 "$T" launch -np 2 --backoff 0.2 -- train $JOB \
    --job.dump_folder="$TSR_TMP/arch" --checkpoint.archive_url=s3://bkt/run/ --checkpoint.archive_interval=1 \
    >arch.log 2>&1 || { fail "arch: exit $?"; tail -5 arch.log >&2; }
proxy_stop
n=$(grep -c "archive of .*step-000000[0-9][0-9] to s3://bkt/run/step-000000[0-9][0-9] failed" arch.log)
[ "$n" -ge 1 ] || { fail "arch: no archive failure reported during the outage"; grep -i archiv arch.log >&2; }
archived arch run

# chaos: S3 outages, and nothing else
"$T" launch -np 2 --backoff 0.2 --chaos 1.5,5,s3 -- train $JOB --job.dump_folder="$TSR_TMP/chaos" \
    --checkpoint.archive_url=s3://bkt/chaos/ --checkpoint.archive_interval=1 >chaos.log 2>&1 ||
    { fail "chaos: exit $?"; tail -5 chaos.log >&2; }
n=$(grep -c '"event": "chaos", .*"kind": "s3"' "$TSR_TMP/chaos/launch.jsonl")
[ "$n" -ge 1 ] || fail "chaos: no S3 outage injected"
grep -v '"kind": "s3"' "$TSR_TMP/chaos/launch.jsonl" | grep -q '"event": "chaos"' && fail "chaos: a fault of another kind"
grep -q "HTTP 503 SlowDown: an injected S3 outage (tessera launch --chaos) (attempt 1; retrying)" chaos.log ||
    { fail "chaos: no request retried through an injected outage"; grep -i 's3\|archiv' chaos.log | head >&2; }
archived chaos chaos
finish "launch s3: an S3 outage while archiving reported, the run finished, nothing lost; injected outages (--chaos s3) retried through"
