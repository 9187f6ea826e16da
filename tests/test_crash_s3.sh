#!/bin/sh
# test_crash_s3.sh: a crash at each step of a save straight into a bucket, where
# the data objects are uploaded first and the MANIFEST, the commit, last. A
# one-rank `ckpt synth` into s3://bkt/run/step-00000002 sends itself SIGKILL
# (TSR_FAULT, see store/store.h: on S3 an upload's completion counts as the
# fsync, the MANIFEST's PUT as the rename) after its data object's upload
# completed, before the MANIFEST's PUT and right after it. Each time: the
# process dies by SIGKILL; step 2 is committed exactly when the PUT happened
# (`ls` lists it uncommitted otherwise, and `ckpt verify` refuses it); the
# committed step 1 still verifies and loads; a committed step 2 verifies and
# loads; an uncommitted one is saved again over what the crash left and then
# verifies and loads.
. "$TSR_ROOT/tests/common.sh"
. "$TSR_ROOT/tests/s3.sh"
s3_start bkt
B=s3://bkt
SYNTH="--bytes 3M --dtype mix --tensors 4 --frame-bytes 256K"
"$T" ckpt synth $B/run/step-00000001 $SYNTH >/dev/null 2>&1 || { fail "the first save into the bucket"; exit 1; }
n=0
while read -r name fault want; do
    before=$fails
    n=$((n + 1))
    R=$B/crash$n
    "$T" ckpt synth $R/step-00000001 $SYNTH >/dev/null 2>&1 || { fail "$name: the first save"; continue; }
    TSR_FAULT=$fault "$T" ckpt synth $R/step-00000002 $SYNTH --step 2 >"$name.log" 2>&1
    rc=$?
    [ $rc = 137 ] || { fail "$name ($fault): exit $rc, not killed"; tail -3 "$name.log" >&2; continue; }
    "$T" ckpt ls $R >"$name.ls" 2>&1 || fail "$name: ckpt ls"
    "$T" ckpt verify $R/step-00000001 >/dev/null 2>&1 || fail "$name: step 1 no longer verifies"
    "$T" ckpt check $R/step-00000001 >/dev/null 2>&1 || fail "$name: step 1 no longer loads"
    if [ "$want" = committed ]; then
        grep -q "^2 .*committed" "$name.ls" && ! grep -q "^2 .*uncommitted" "$name.ls" ||
            fail "$name: step 2 not listed as committed: $(cat "$name.ls")"
        "$T" ckpt verify $R/step-00000002 >/dev/null 2>&1 || fail "$name: the committed step 2 does not verify"
    else
        grep -q "^2 .*uncommitted" "$name.ls" || fail "$name: step 2 not listed as uncommitted: $(cat "$name.ls")"
        "$T" ckpt verify $R/step-00000002 >/dev/null 2>&1 && fail "$name: the interrupted step 2 verifies"
        # the killed writer's lease is still there: a new save is refused, naming
        # it, until the lease is removed by hand (object storage has no locks)
        "$T" ckpt synth $R/step-00000002 $SYNTH --step 2 >/dev/null 2>"$name.lease" &&
            fail "$name: a save while the killed writer's lease is there"
        grep -q "another writer holds .*pid" "$name.lease" || fail "$name: no refusal naming the lease: $(cat "$name.lease")"
        aws s3 rm $R/LOCK >/dev/null || fail "$name: aws s3 rm of the lease"
        # the save, again, over what the crash left
        "$T" ckpt synth $R/step-00000002 $SYNTH --step 2 >/dev/null 2>&1 || fail "$name: saving step 2 again"
        "$T" ckpt verify $R/step-00000002 >/dev/null 2>&1 || fail "$name: step 2 saved again does not verify"
    fi
    "$T" ckpt check $R/step-00000002 >/dev/null 2>&1 || fail "$name: step 2 does not load"
    [ $fails = $before ] && echo "$name: killed ($fault), step 2 $want, everything committed verifies and loads"
done <<EOF2
after-data-upload fsync:1:killafter:step-00000002/data- uncommitted
before-manifest-put rename:1:kill:step-00000002/MANIFEST uncommitted
after-manifest-put rename:1:killafter:step-00000002/MANIFEST committed
EOF2
finish "crash points of a save into S3: all recovered"
