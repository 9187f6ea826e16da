#!/bin/sh
# test_python_digest.sh: the Python package checks the digest of every tensor it
# reads whole (FORMAT.md 4.4) and refuses a tensor whose data was altered
# consistently, naming it and both digests; the checks are
# tests/test_python_digest.py, under the tests' Python over this build's core.
. "$TSR_ROOT/tests/common.sh"
cd "${TSR_TMP:?}" || exit 1
need_py
with_lib "$TSR_PY" "$TSR_ROOT/tests/test_python_digest.py" "$TSR_TMP" >out.txt 2>&1 ||
    fail "tests/test_python_digest.py: $(cat out.txt)"
cat out.txt
finish
