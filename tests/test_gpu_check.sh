#!/bin/sh
# tools/gpu_check.sh without a GPU: prepare bundles the build (the CUDA variant's
# where it is built and current, else this build's: a bundle to rehearse with)
# with Open MPI's runtime; the bundle's comparison fails a difference past its
# tolerance and passes one within it; the rehearsal (training.device = guard, the
# debug model) passes every equality, bitwise and cross-resume check and skips,
# by name, what needs a GPU, run with this machine's Open MPI out of reach (a
# private mount namespace hides its files where the test may make one; the PATH
# lists no mpirun in any case), so that 2-rank jobs run on the carried mpirun.
# tsr-timeout: 300
. "$TSR_ROOT/tests/mpi.sh"

# the CUDA variant's bundle is the one a GPU machine gets: rehearsed where current
B=$TSR_BUILD
CB=$TSR_ROOT/build/cuda
if cut -d"|" -f1 "$CB/flags" 2>/dev/null | grep -q -- -DTSR_CUDA && [ -x "$CB/tests/test_cuda" ] &&
    [ -x "$CB/tessera" ] && [ ! "$T" -nt "$CB/tessera" ]; then
    B=$CB
fi
echo "bundle from $B"
OUT=$TSR_TMP/bundle
GPU_CHECK_QUICK=1 sh "$TSR_ROOT/tools/gpu_check.sh" prepare "$OUT" "$B" >"$TSR_TMP/prepare.log" 2>&1 ||
    { fail "prepare: exit $?"; cat "$TSR_TMP/prepare.log" >&2; finish; }
for f in tessera gpu_check.sh configs/debug.toml configs/124m.toml mpi/bin/mpirun mpi/bin/orted mpi/VERSION; do
    [ -s "$OUT/$f" ] || fail "prepare: no $f in the bundle"
done
[ "$B" = "$CB" ] && { [ -x "$OUT/test_cuda" ] || fail "prepare: no test_cuda in the CUDA build's bundle"; }
ls "$OUT"/lib/libmpi.so.* >/dev/null 2>&1 || fail "prepare: no libmpi in the bundle's lib"
ls "$OUT"/mpi/lib/openmpi/mca_*.so >/dev/null 2>&1 || fail "prepare: no Open MPI plugins in the bundle"
grep -q "^debug 827392 3072$" "$OUT/model-flops.txt" ||
    { fail "prepare: the debug model's FLOP (matmul parameters, attention per position)"; cat "$OUT/model-flops.txt" >&2; }

# the comparison: relative, absolute and bitwise, a missing step
M=$TSR_TMP/m
mkdir -p "$M"
line() { echo "{\"step\": $1, \"loss\": $2, \"grad_norm\": 1.5, \"lr\": 0.0001, \"tokens_per_s\": 10.0}"; }
{ line 1 6.0; line 2 5.0; line 3 4.0; } >"$M/ref"
{ line 1 6.0; line 2 5.0001; line 3 4.0; } >"$M/far"  # 2e-5 relative at step 2
{ line 1 6.0; line 2 5.00002; line 3 4.0; } >"$M/near" # 4e-6
{ line 1 6.0; line 2 5.0; } >"$M/short"
cmp_expect() { # STATUS ARGS...
    want=$1
    shift
    sh "$OUT/gpu_check.sh" compare "$@" >"$M/out" 2>&1
    got=$?
    [ $got = "$want" ] || { fail "compare $*: exit $got, expected $want"; cat "$M/out" >&2; }
}
cmp_expect 1 "$M/ref" "$M/far" loss rel 1e-5
grep -q "at step 2 over 3 steps" "$M/out" || fail "compare: the worst step is not named: $(cat "$M/out")"
cmp_expect 0 "$M/ref" "$M/near" loss rel 1e-5
cmp_expect 0 "$M/ref" "$M/far" loss abs 0.02
cmp_expect 1 "$M/ref" "$M/near" loss bits 0
cmp_expect 0 "$M/ref" "$M/ref" loss bits 0
cmp_expect 0 "$M/ref" "$M/far" loss bits 0 3
cmp_expect 1 "$M/ref" "$M/short" loss rel 1e-5
cmp_expect 1 "$M/ref" "$M/nothing" loss rel 1e-5

# a PATH without Open MPI's commands: every other command of this one
BIN=$TSR_TMP/bin
mkdir -p "$BIN"
for d in $(echo "$PATH" | tr : ' '); do
    [ -d "$d" ] || continue
    ls -d "$d"/* 2>/dev/null | grep -Ev '/(mpi|orte|ompi|opal|osh|shmem)[^/]*$' | xargs ln -s -t "$BIN" 2>/dev/null
done
command -v awk >/dev/null && [ -e "$BIN/awk" ] && [ ! -e "$BIN/mpirun" ] || fail "the PATH without Open MPI"
# this machine's Open MPI and PMIx files, hidden in a private mount namespace
HIDE="$(ompi_info --parsable --path pkglibdir | sed -n 's/^path:pkglibdir://p') \
$(ompi_info --parsable --path pkgdatadir | sed -n 's/^path:pkgdatadir://p')"
pmix=$(ldd "$(ompi_info --parsable --path pkglibdir | sed -n 's/^path:pkglibdir://p')"/mca_pmix_*.so 2>/dev/null |
    awk '$1 ~ /^libpmix\.so/ && $3 ~ /^\// { print $3; exit }')
[ -n "$pmix" ] && HIDE="$HIDE $(dirname "$(dirname "$(readlink -f "$pmix")")")"
FILES="$(readlink -f "$(command -v orterun)") $(readlink -f "$(command -v orted)")"
for l in $(ldd "$T" | awk '$1 ~ /^lib(mpi|open-rte|open-pal)\.so/ { print $3 }') $pmix; do FILES="$FILES $(readlink -f "$l")"; done
cat >"$TSR_TMP/hidden.sh" <<EOF
for f in $FILES; do mount --bind /dev/null "\$f" || exit 90; done
for d in $HIDE; do mount -t tmpfs none "\$d" || exit 90; done
[ ! -s "$(readlink -f "$(ldd "$T" | awk '$1 ~ /^libmpi\.so/ { print $3 }')")" ] || exit 90
exec env PATH="$BIN" "\$@"
EOF
SUMMARY=$TSR_TMP/summary.txt
if unshare --mount --propagation private true 2>/dev/null; then
    echo "rehearsal: this machine's Open MPI hidden ($HIDE $FILES) and off the PATH"
    unshare --mount --propagation private sh "$TSR_TMP/hidden.sh" sh "$OUT/gpu_check.sh" rehearse "$SUMMARY" \
        >"$TSR_TMP/rehearse.log" 2>&1
else
    echo "rehearsal: no private mount namespace here: this machine's Open MPI is off the PATH only"
    env PATH="$BIN" sh "$OUT/gpu_check.sh" rehearse "$SUMMARY" >"$TSR_TMP/rehearse.log" 2>&1
fi
rc=$?
[ $rc = 90 ] && fail "rehearsal: this machine's Open MPI could not be hidden"
[ $rc = 0 ] || fail "rehearse: exit $rc"
[ -s "$SUMMARY" ] || { fail "rehearse: no summary"; cat "$TSR_TMP/rehearse.log" >&2; finish; }
has() { # COUNT PATTERN: the summary has COUNT lines that match PATTERN
    n=$(grep -c "$2" "$SUMMARY")
    [ "$n" = "$1" ] || fail "summary: $n lines match '$2', expected $1"
}
has 1 "^mpirun on this machine: none$"
has 1 "^mpirun used: the carried Open MPI"
has 2 "^PASS equality f32 (guard against cpu): "
has 4 "^PASS equality bitwise (two guard runs): "
has 2 "^PASS equality bitwise (two guard runs): checkpoint step-000000[12]0: every tensor and blob the same"
has 1 "^PASS equality bf16 (guard against cpu): loss: "
has 1 "^INFO bf16 against f32 (guard): "
has 1 "^PASS saves debug: 12 steps with a save every 6"
has 1 "^INFO rate debug (seq 32, batch 8, .*tokens/s.* MFU [0-9.]*% of the in-run GEMM rate"
has 1 "^INFO saves debug: blocked [0-9.]* s by the save of step 6; step [0-9.]* s without a save in flight"
has 2 "^PASS resume guard -> 2 cpu ranks (dp_shard=2): "
has 2 "^PASS resume cpu -> 2 guard ranks on one device (tp=2, data_plane auto): "
has 2 "^PASS staged: 2 guard ranks on one device (dp_shard=2) against 1 cpu rank: "
has 1 "^PASS 2 guard ranks on one device: the trainer chose the host-staged data plane$"
has 1 "^SKIP kernels: test_cuda, compute-sanitizer and tessera bench gpu need a GPU"
has 1 "^SKIP rate 124m (seq 1024) and 1b (seq 2048)"
has 1 "^SKIP memcheck of 2 device training steps"
has 0 "^FAIL"
has 1 "^== gpu_check rehearse: 0 failed"
[ "$fails" = 0 ] || { echo "the summary:" >&2; cat "$SUMMARY" >&2; }
finish "gpu_check: prepared from $B; rehearsed on the guard kind with the carried mpirun, every check passed"
