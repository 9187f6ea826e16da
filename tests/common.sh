# common.sh: sourced by the shell tests. $T is the tessera binary; fail counts
# failures; expect STATUS WHAT CMD... runs CMD with its output in out.txt /
# err.txt and checks its exit status; finish [MESSAGE] ends the test: exit 0
# (printing MESSAGE) when every check passed, else exit 1 with the count (never
# `exit $fails`: an exit status wraps at 256, and 77 reads as a skip).
T=${TESSERA:?TESSERA must name the tessera binary}
[ -x "$T" ] || { echo "FAIL: $T is not built" >&2; exit 1; }
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
expect() { # expected-status description command...
    want=$1; what=$2; shift 2
    "$@" >out.txt 2>err.txt
    got=$?
    [ "$got" = "$want" ] || { fail "$what: exit $got, expected $want"; sed 's/^/    /' err.txt >&2; }
}
# need_py: sets TSR_PY to the tests' Python (tests/py_setup.sh's environment:
# PyTorch, transformers, gguf, safetensors), which tests/run.sh exports; a test run
# by itself makes or finds it. Missing, the test fails.
need_py() {
    if [ -z "${TSR_PY:-}" ]; then
        TSR_PY=$(sh "$TSR_ROOT/tests/py_setup.sh") ||
            { echo "FAIL: the tests' Python environment (tests/py_setup.sh, above)" >&2; exit 1; }
        export TSR_PY
    fi
    export HF_HUB_OFFLINE=1 # transformers reads the test's files, never the hub
}
# with_lib PYTHON ARGS...: runs PYTHON with the package python/tessera over this
# build's libraries (TESSERA_LIB: the build folder, where the package loads the
# core, libtessera-core.so.0; a sanitizer build's needs the sanitizers' runtimes
# first)
with_lib() {
    _lib=$TSR_BUILD/libtessera-core.so.0 _pre=""
    [ -e "$_lib" ] || { echo "FAIL: $_lib is not built" >&2; return 1; }
    if nm -D "$_lib" | grep -q __asan_; then
        _pre="$(cc -print-file-name=libasan.so) $(cc -print-file-name=libubsan.so)"
    fi
    env LD_PRELOAD="$_pre" ASAN_OPTIONS=detect_leaks=0 TESSERA_LIB="$TSR_BUILD" PYTHONPATH="$TSR_ROOT/python" "$@"
}
flip() { # FILE OFFSET [N]: the N bytes (default 1) at OFFSET of FILE inverted in place
    /usr/bin/python3 - "$@" <<'EOF'
import sys
f, off = sys.argv[1], int(sys.argv[2])
n = int(sys.argv[3]) if len(sys.argv) > 3 else 1
with open(f, "r+b") as h:
    h.seek(off); b = bytearray(h.read(n))
    h.seek(off); h.write(bytes(x ^ 0xFF for x in b))
EOF
}
finish() { # [success message]
    if [ "$fails" = 0 ]; then
        [ $# = 0 ] || echo "$*"
        exit 0
    fi
    echo "$fails check(s) failed" >&2
    exit 1
}
