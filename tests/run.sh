#!/bin/sh
# Runs every test: C test programs (tests/test_*.c, built into BUILD/tests), shell
# tests of the command (tests/test_*.sh) and the libFuzzer targets (tests/fuzz_*.c)
# for FUZZ_SECONDS each. Each test exits 0 (pass), 77 (skip, with the reason on
# stderr) or anything else (fail). Prints each test's time, then the ten slowest with
# the share of their limit they used, and ends with the line "N passed, N failed, N skipped".
# Each test runs under a time limit (then it fails, named): TSR_TEST_TIMEOUT seconds
# (default 600); a test whose source has a line with "tsr-timeout: N" gets N
# instead, unless TSR_TEST_TIMEOUT is set; the fuzz targets get FUZZ_SECONDS more.
BUILD=${1:-build/asan}
FUZZ=${2:-build/fuzz}
FUZZ_SECONDS=${3:-30}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "$BUILD" && pwd)
[ -d "$FUZZ" ] && FUZZ=$(cd "$FUZZ" && pwd)
export TESSERA="$BUILD/tessera" TSR_BUILD="$BUILD" TSR_ROOT="$ROOT"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# the tests' Python environment and llama.cpp, made once and cached outside the
# tree (minutes the first time), before any test's clock starts
setup_start=$(date +%s)
TSR_PY=$(sh "$ROOT/tests/py_setup.sh") || { echo "run.sh: the tests' Python environment could not be set up" >&2; exit 1; }
sh "$ROOT/tests/llama_setup.sh" >/dev/null || { echo "run.sh: llama.cpp could not be built for the tests" >&2; exit 1; }
export TSR_PY
echo "test tools: $TSR_PY, llama.cpp in $(sh "$ROOT/tests/llama_setup.sh") ($(( $(date +%s) - setup_start )) s)"
TMPBASE=$(mktemp -d /tmp/tessera-test.XXXXXX)
trap 'rm -rf "$TMPBASE"' EXIT INT TERM
pass=0 fail=0 skip=0 failed="" suite_start=$(date +%s)
times=""

limit_of() { # source file: its time limit in seconds
    if [ -n "${TSR_TEST_TIMEOUT:-}" ]; then echo "$TSR_TEST_TIMEOUT"; return; fi
    n=$(sed -n 's/.*tsr-timeout: *\([0-9][0-9]*\).*/\1/p' "$1" 2>/dev/null | head -n 1)
    echo "${n:-600}"
}

run_one() { # name, limit (seconds), command...
    name=$1 limit=$2; shift 2
    dir="$TMPBASE/$name"; mkdir -p "$dir"
    start=$(date +%s)
    # timeout signals the test's whole process group (servers and mpirun included),
    # then SIGKILL 10 s later
    ls /dev/shm >"$TMPBASE/shm.before" 2>/dev/null
    (cd "$dir" && TSR_TMP="$dir" timeout -k 10 "$limit" "$@") >"$dir.log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - start ))
    # Open MPI's shared-memory segments of ranks that were killed outlive them:
    # what the test left there is removed
    ls /dev/shm 2>/dev/null | grep -E '^(vader_segment|sm_segment)\.' | grep -vxF -f "$TMPBASE/shm.before" |
        while read -r f; do rm -f "/dev/shm/$f"; done
    times="$times$secs $limit $name
"
    if { [ $rc = 124 ] || [ $rc = 137 ]; } && [ $secs -ge "$limit" ]; then
        fail=$((fail + 1)); failed="$failed $name"
        echo "FAIL $name: timed out after ${limit}s (TSR_TEST_TIMEOUT or tsr-timeout: N in the test)"
        tail -n 40 "$dir.log" | sed 's/^/    /'
        return
    fi
    case $rc in
    0) pass=$((pass + 1)); echo "PASS $name (${secs}s)";;
    77) skip=$((skip + 1)); echo "SKIP $name: $(grep SKIP "$dir.log" | tail -1)";;
    *) fail=$((fail + 1)); failed="$failed $name"; echo "FAIL $name (exit $rc, ${secs}s)"
       tail -n 40 "$dir.log" | sed 's/^/    /';;
    esac
}

for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    # the GPU test of the CUDA variant (make cuda-variant) in place of this build's
    case $t in */test_cuda) [ -x "$ROOT/build/cuda/tests/test_cuda" ] && t=$ROOT/build/cuda/tests/test_cuda;; esac
    run_one "$(basename "$t")" "$(limit_of "$ROOT/tests/$(basename "$t").c")" "$t"
done
for t in "$ROOT"/tests/test_*.sh; do
    [ -f "$t" ] || continue
    run_one "$(basename "$t" .sh)" "$(limit_of "$t")" sh "$t"
done
if [ -d "$FUZZ" ]; then
    for f in "$FUZZ"/fuzz_*; do
        [ -x "$f" ] || continue
        run_one "$(basename "$f")" $(( $(limit_of "$ROOT/tests/$(basename "$f").c") + FUZZ_SECONDS )) \
            sh "$ROOT/tests/fuzz.sh" "$f" "$FUZZ_SECONDS"
    done
fi
echo "the ten slowest (seconds, share of the test's limit):"
printf '%s' "$times" | sort -rn | head -n 10 | awk '{ printf "  %5d s  %3d%%  %s\n", $1, 100 * $1 / $2, $3 }'
echo "all tests: $(( $(date +%s) - suite_start )) s"
[ -n "$failed" ] && echo "failed:$failed"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" = 0 ]
