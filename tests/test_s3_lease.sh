#!/bin/sh
# One writer per checkpoint prefix on object storage (moto on loopback): while
# the lease object PREFIX/LOCK of another writer exists, `ckpt synth` into a step
# of the prefix and `push` to it are refused, naming the holder, and write
# nothing; once it is gone they work, and synth's own lease is removed when it
# ends. A lease check the server does not answer refuses the push.
. "$TSR_ROOT/tests/common.sh"
cd "$TSR_TMP" || exit 1
. "$TSR_ROOT/tests/s3.sh"
command -v aws >/dev/null || { echo "FAIL: the AWS CLI (aws) is not on PATH" >&2; exit 1; }
s3_start bkt
B=s3://bkt

expect 0 "a local checkpoint" "$T" ckpt synth ck/step-00000001 --bytes 64K
printf 'host elsewhere, pid 4242, started 2026-01-01T00:00:00Z\n' >lease.txt
aws s3 cp lease.txt $B/run/LOCK >/dev/null || fail "aws s3 cp of the lease"

expect 1 "synth into a leased prefix" "$T" ckpt synth $B/run/step-00000002 --bytes 64K
grep -q "another writer holds .*host elsewhere, pid 4242, started 2026-01-01T00:00:00Z" err.txt ||
    fail "synth: no refusal naming the lease's holder: $(cat err.txt)"
expect 1 "push to a leased prefix" "$T" push ck $B/run/
grep -q "another writer holds .*pid 4242" err.txt || fail "push: no refusal naming the lease's holder: $(cat err.txt)"
aws s3 ls $B/run/ --recursive >ls.txt
grep -q "step-" ls.txt && fail "something was written under the leased prefix: $(cat ls.txt)"

# a server that does not answer the lease check is not an absent lease: push
# stops at the check (HEAD of PREFIX/LOCK), naming it, and sends no data file
expect 1 "push to a server that does not answer" env TSR_S3_MAX_ATTEMPTS=2 "$T" push ck $B/run/ --endpoint http://127.0.0.1:9
grep -q "the lease object: .*run/LOCK: HEAD" err.txt && ! grep -q "PUT" err.txt ||
    fail "push: the unanswered lease check is not named (or data was sent): $(cat err.txt)"

aws s3 rm $B/run/LOCK >/dev/null || fail "aws s3 rm of the lease"
expect 0 "synth into a free prefix" "$T" ckpt synth $B/run/step-00000002 --bytes 64K
expect 0 "push to a free prefix" "$T" push ck $B/run/
aws s3 ls $B/run/ --recursive >ls.txt
grep -q "run/LOCK" ls.txt && fail "synth left its lease behind"
grep -q "step-00000001/MANIFEST" ls.txt && grep -q "step-00000002/MANIFEST" ls.txt || fail "missing steps: $(cat ls.txt)"
finish "s3 lease: synth and push refused while a lease exists, work once it is gone"
