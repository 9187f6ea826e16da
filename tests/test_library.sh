#!/bin/sh
# test_library.sh: what the shared libraries offer and need. libtessera.so
# exports exactly the functions that the public headers of its layers declare
# (base/ to ckpt/; the list made here by the compiler, cc -aux-info, not by the
# build's tools/exports.sh): no internal tsr_*, engine_* or s3_*. The core
# libraries export public functions only, among them every one the Python
# package binds, and need neither MPI nor BLAS nor OpenMP, the core no libcurl
# either (ldd and nm -u); the core refuses an s3:// location, naming it. The
# Python package loads the core from a build folder, the core with S3 for an
# s3:// location, libtessera.so where no core is, and round-trips a checkpoint
# over the core. Its ctypes structures match the C structs (tests/abi_layout.py).
. "$TSR_ROOT/tests/common.sh"
cd "${TSR_TMP:?}" || exit 1
need_py
B=${TSR_BUILD:?TSR_BUILD must name the build folder}
R=$TSR_ROOT
FULL=$B/libtessera.so.0 CORE=$B/libtessera-core.so.0 CORE_S3=$B/libtessera-core-s3.so.0
for l in "$FULL" "$CORE" "$CORE_S3"; do
    [ -e "$l" ] || { echo "FAIL: $l is not built" >&2; exit 1; }
done

# the public functions, by header, as the compiler reads tessera.h
echo '#include "tessera.h"' >pub.c
incs="-I$R/include"
for h in "$R"/*/tsr_*.h; do incs="$incs -I$(dirname "$h")"; done
# shellcheck disable=SC2086
cc -std=c11 -fsyntax-only -aux-info protos.txt $incs pub.c 2>cc.err ||
    { echo "FAIL: cc -aux-info over tessera.h: $(cat cc.err)" >&2; exit 1; }
grep -E '^/\* [^ ]*/tsr_[a-z_]+\.h:' protos.txt | sed -n 's|^/\* [^ ]*/\([a-z_]*\)/tsr_[a-z_]*\.h:.*[ *]\(tsr_[A-Za-z0-9_]*\) (.*|\1 \2|p' |
    sort -u >public.txt
[ "$(wc -l <public.txt)" -ge 50 ] || fail "only $(wc -l <public.txt) public functions read from the headers"
awk '{ print $2 }' public.txt | sort -u >public.all
# libtessera.so holds layers base to ckpt (README); convert/ is libtessera-train.a's
grep -E '^(base|formats|reshard|comm|ckpt) ' public.txt | awk '{ print $2 }' | sort -u >public.lib

exported() { # library: its defined dynamic symbols
    nm -D --defined-only "$1" | awk '{ print $3 }' | sed 's/@.*//' | sort -u
}
exported "$FULL" >full.txt
extra=$(comm -23 full.txt public.all | tr '\n' ' ')
[ -z "$extra" ] || fail "libtessera.so exports what no public header declares: $extra"
missing=$(comm -23 public.lib full.txt | tr '\n' ' ')
[ -z "$missing" ] || fail "libtessera.so does not export public functions: $missing"
grep -q '^tsr_push$' full.txt && grep -q '^tsr_pull$' full.txt || fail "libtessera.so lacks tsr_push or tsr_pull"

# the calls the Python package binds (its sig table)
sed -n 's/^ *"\(tsr_[a-z0-9_]*\)": (.*/\1/p' "$R/python/tessera/__init__.py" | sort -u >python.txt
[ "$(wc -l <python.txt)" -ge 10 ] || fail "only $(wc -l <python.txt) calls found in the Python package's table"
for l in "$CORE" "$CORE_S3"; do
    n=$(basename "$l")
    exported "$l" >core.txt
    extra=$(comm -23 core.txt public.all | tr '\n' ' ')
    [ -z "$extra" ] || fail "$n exports what no public header declares: $extra"
    missing=$(comm -23 python.txt core.txt | tr '\n' ' ')
    [ -z "$missing" ] || fail "$n lacks calls the Python package binds: $missing"
    ldd "$l" >ldd.txt || fail "ldd $n"
    bad=$(grep -E 'lib(mpi|open-rte|open-pal|openblas|blas|cblas|gomp)' ldd.txt | awk '{ print $1 }' | tr '\n' ' ')
    [ -z "$bad" ] || fail "$n needs $bad"
    bad=$(nm -D --undefined-only "$l" | awk '{ print $2 }' | grep -E '^(MPI_|ompi_|cblas_|GOMP_|omp_)' | tr '\n' ' ')
    [ -z "$bad" ] || fail "$n calls $bad"
done
ldd "$CORE" | grep -q 'libcurl' && fail "libtessera-core.so needs libcurl"
nm -D --undefined-only "$CORE" | grep -q ' curl_' && fail "libtessera-core.so calls curl_*"
ldd "$CORE_S3" | grep -q 'libcurl' || fail "libtessera-core-s3.so does not link libcurl"
readelf -d "$CORE" | grep -q 'Library soname: \[libtessera-core.so.0\]' || fail "libtessera-core.so has no soname libtessera-core.so.0"

# the Python package: which library it loads, a round trip over the core, and
# s3:// refused by the core, naming the location. py LIB ARGS: python over
# TESSERA_LIB=LIB (as with_lib, common.sh, for a sanitizer build)
pre=""
nm -D "$CORE" | grep -q __asan_ && pre="$(cc -print-file-name=libasan.so) $(cc -print-file-name=libubsan.so)"
py() {
    _l=$1; shift
    env LD_PRELOAD="$pre" ASAN_OPTIONS=detect_leaks=0 TESSERA_LIB="$_l" PYTHONPATH="$R/python" "$TSR_PY" "$@"
}
expect 0 "the Python package over the build folder" py "$B" -c '
import sys, numpy as np, tessera
print("local", tessera.library()._name)
print("s3", tessera.library(s3=True)._name)
tessera.save(sys.argv[1] + "/step-00000003", {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, step=3)
ck = tessera.open(sys.argv[1])
print("read", ck.step, ck.read("w").tolist(), ck._lib._name)' "$TSR_TMP/ck"
grep -qx "local $CORE" out.txt || fail "the package does not load $CORE: $(cat out.txt err.txt)"
grep -qx "s3 $CORE_S3" out.txt || fail "the package does not load $CORE_S3 for s3://: $(cat out.txt err.txt)"
grep -qx "read 3 \[\[0.0, 1.0, 2.0\], \[3.0, 4.0, 5.0\]\] $CORE" out.txt ||
    fail "a round trip over the core: $(cat out.txt err.txt)"
expect 0 "s3:// over the core alone" py "$CORE" -c '
import tessera
try:
    tessera.open("s3://no-bucket/ck/step-00000001")
    print("opened")
except tessera.Error as e:
    print("refused:", e)'
grep -q "^refused: s3://no-bucket/ck/step-00000001.*built without S3" out.txt ||
    fail "the core does not refuse s3:// by name: $(cat out.txt err.txt)"
# where no core is, libtessera.so as before
mkdir only-full && ln -s "$FULL" only-full/libtessera.so.0
expect 0 "the package without a core" py "$TSR_TMP/only-full" -c '
import tessera; print(tessera.library()._name)'
grep -qx "$TSR_TMP/only-full/libtessera.so.0" out.txt || fail "no fallback to libtessera.so.0: $(cat out.txt err.txt)"

# the ctypes structures against the C structs
expect 0 "the Python package's ctypes structures" "$TSR_PY" "$R/tests/abi_layout.py" "$R" "$TSR_TMP"
cat out.txt
grep -q "^FAIL" out.txt && sed -n 's/^FAIL: /    /p' out.txt >&2
finish "library: libtessera.so exports $(wc -l <full.txt) public functions and nothing else; the core needs no MPI, BLAS or curl and Python loads it"
