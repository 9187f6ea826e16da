#!/bin/sh
# Storage faults against the S3 store (moto on loopback): test_fault's cases
# (the Nth write, upload completion or MANIFEST PUT fails with ENOSPC or EIO, or
# a write lands short) run with saves into s3://bkt/fault, as they run into a
# directory on their own. Then the command: TSR_FAULT reaches the S3 store
# through `tessera ckpt synth` (an injected EIO on a write fails the save, named,
# and commits nothing), and a TSR_FAULT that does not parse is refused with
# exit 2 before anything runs.
. "$TSR_ROOT/tests/common.sh"
cd "$TSR_TMP" || exit 1
F=${TSR_BUILD:?TSR_BUILD must name the build directory}/tests/test_fault
[ -x "$F" ] || { echo "FAIL: $F is not built" >&2; exit 1; }
. "$TSR_ROOT/tests/s3.sh"
s3_start bkt

"$F" s3://bkt/fault || fail "test_fault against s3://bkt/fault"

expect 1 "synth with an injected write error" env TSR_FAULT=write:3:EIO "$T" ckpt synth s3://bkt/cmd/step-00000001 --bytes 1M
grep -q "s3://bkt/cmd/step-00000001/data-00000.tsd: write of .*Input/output error (injected)" err.txt ||
    fail "the injected write error is not reported: $(cat err.txt)"
"$T" ckpt ls s3://bkt/cmd >ls.txt 2>&1
grep -q "^1 .* committed" ls.txt && fail "step 1 committed although its save failed: $(cat ls.txt)"
expect 0 "synth without a fault" "$T" ckpt synth s3://bkt/cmd/step-00000001 --bytes 1M
expect 2 "a TSR_FAULT that does not parse" env TSR_FAULT=write:1:EPERM "$T" ckpt ls s3://bkt/cmd
grep -q "TSR_FAULT: .*unknown kind EPERM" err.txt || fail "the bad spec is not named: $(cat err.txt)"
finish "faults against the S3 store: each reported and cleaned up; TSR_FAULT reaches it from the command"
