#!/bin/sh
# test_runner.sh: the test harness itself (tests/run.sh, common.sh, mpi.sh), run on
# small stand-in tests in a copy of the tree: a test over its time limit fails,
# named; a test with 77 failed checks fails (exit 1, not a skip) and prints no
# success line; a multi-rank test without mpirun fails instead of skipping; a
# skip, a pass and a per-test limit are counted as such; the ten slowest tests are
# listed with the share of their limit.
# tsr-timeout: 180 (the runner takes the first such line: this one, not the stand-in's below)
. "$TSR_ROOT/tests/common.sh"
cd "$TSR_TMP" || exit 1
R=$TSR_TMP/root
mkdir -p "$R/tests" build/tests
cp "$TSR_ROOT/tests/run.sh" "$TSR_ROOT/tests/common.sh" "$TSR_ROOT/tests/mpi.sh" "$TSR_ROOT/tests/py_setup.sh" \
    "$TSR_ROOT/tests/llama_setup.sh" "$TSR_ROOT"/tests/requirements*.txt "$R/tests/"

cat >"$R/tests/test_a_pass.sh" <<'EOF'
. "$TSR_ROOT/tests/common.sh"
[ 1 = 1 ] || fail "arithmetic"
finish "a: all fine"
EOF
cat >"$R/tests/test_b_77fails.sh" <<'EOF'
. "$TSR_ROOT/tests/common.sh"
i=0
while [ $i -lt 77 ]; do fail "check $i"; i=$((i + 1)); done
finish "b: SUCCESS LINE"
EOF
cat >"$R/tests/test_c_hang.sh" <<'EOF'
. "$TSR_ROOT/tests/common.sh"
sleep 10
EOF
cat >"$R/tests/test_d_skip.sh" <<'EOF'
echo "SKIP: no such resource" >&2
exit 77
EOF
cat >"$R/tests/test_e_slow.sh" <<'EOF'
# tsr-timeout: 8
. "$TSR_ROOT/tests/common.sh"
sleep 5
finish "e: slow but within its own limit"
EOF
cat >"$R/tests/test_f_mpi.sh" <<'EOF'
PATH=/nonexistent-bin
. "$TSR_ROOT/tests/mpi.sh"
finish "f: SUCCESS LINE"
EOF
printf '#!/bin/sh\nexit 0\n' >build/tessera && chmod +x build/tessera  # common.sh wants one

start=$(date +%s)
TSR_TEST_TIMEOUT= sh "$R/tests/run.sh" build none 1 >run.out 2>&1
rc=$?
secs=$(( $(date +%s) - start ))
# the stand-in suite with a 3 s default limit (test_e has its own, 8 s)
sed -i 's/echo "${n:-600}"/echo "${n:-3}"/' "$R/tests/run.sh"
TSR_TEST_TIMEOUT= sh "$R/tests/run.sh" build none 1 >run3.out 2>&1
rc3=$?
secs3=$(( $(date +%s) - start - secs ))

[ $rc = 1 ] || fail "run.sh (600 s limit) exited $rc, expected 1"
grep -q "^PASS test_a_pass" run.out || fail "the passing test did not pass"
grep -q "^PASS test_c_hang" run.out || fail "a 10 s test under a 600 s limit did not pass"
grep -q "^FAIL test_b_77fails (exit 1," run.out || fail "77 failed checks did not fail with exit 1"
grep -q "SUCCESS LINE" run.out && fail "a success line was printed although checks failed"
grep -q "^SKIP test_d_skip: SKIP: no such resource" run.out || fail "the skip was not counted"
grep -q "^FAIL test_f_mpi (exit 1," run.out || fail "a multi-rank test without mpirun did not fail"
grep -q "mpirun is not installed" run.out || fail "no reason given for the missing mpirun"
grep -q "^3 passed, 2 failed, 1 skipped$" run.out || fail "run.sh totals: $(tail -n 1 run.out)"

# each test's time, the slowest first with the share of its limit, and the total
grep -q "^the ten slowest" run.out && grep -Eq "^ +1[0-9] s +1%  test_c_hang$" run.out ||
    fail "the slowest tests are not listed with their share of the limit"
grep -Eq "^ +[5-7] s +(62|75|87)%  test_e_slow$" run3.out || fail "test_e_slow's share of its own 8 s limit is not listed"
grep -q "^all tests: [0-9]* s$" run.out || fail "the suite's time is not printed"

[ $rc3 = 1 ] || fail "run.sh (3 s limit) exited $rc3, expected 1"
grep -q "^FAIL test_c_hang: timed out after 3s" run3.out || fail "a hanging test was not failed by name"
grep -q "^PASS test_e_slow" run3.out || fail "the per-test limit (tsr-timeout: 8) was not used"
grep -q "^2 passed, 3 failed, 1 skipped$" run3.out || fail "run.sh totals with 3 s: $(tail -n 1 run3.out)"
[ $secs3 -lt 20 ] || fail "the 3 s limit took ${secs3}s: the hang was not cut short"
TSR_TEST_TIMEOUT=1 sh "$R/tests/run.sh" build none 1 >run1.out 2>&1
grep -q "^FAIL test_e_slow: timed out after 1s" run1.out || fail "TSR_TEST_TIMEOUT did not override tsr-timeout"

[ $fails = 0 ] || { sed 's/^/    /' run.out run3.out >&2; }
finish "runner: time limits, exit statuses, skips and missing mpirun as expected"
