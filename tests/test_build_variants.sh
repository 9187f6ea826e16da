#!/bin/sh
# A build is what it says: the host-only command says so in --version and links
# neither cuBLAS nor NCCL; the CUDA variant (make cuda-variant, built by make test
# wherever nvcc is) names the CUDA and NCCL versions it was built with and links
# both. A build folder records its flags: objects built with other flags (CUDA=1,
# another OPT) are out of date there, and make CUDA=1 builds in a folder of its own.
. "$TSR_ROOT/tests/common.sh"
cd "$TSR_TMP" || exit 1
"$T" --version >v.txt || fail "--version"
grep -q "built without CUDA" v.txt || fail "the host build's --version does not say it lacks CUDA: $(cat v.txt)"
ldd "$T" | grep -E "libcublas|libnccl|libcudart" && fail "the host build links CUDA libraries"

# the flags: one object in a folder of the test's own (make's own settings, when
# make test runs this, stay out of it)
unset MAKEFLAGS MFLAGS MAKELEVEL
expect 0 "make one object" make -s -C "$TSR_ROOT" BUILD="$TSR_TMP/b" "$TSR_TMP/b/base/box.o"
expect 0 "the same flags: up to date" make -q -C "$TSR_ROOT" BUILD="$TSR_TMP/b" "$TSR_TMP/b/base/box.o"
expect 1 "OPT=-O0: out of date" make -q -C "$TSR_ROOT" BUILD="$TSR_TMP/b" OPT=-O0 "$TSR_TMP/b/base/box.o"
expect 1 "CUDA=1: out of date" make -q -C "$TSR_ROOT" BUILD="$TSR_TMP/b" CUDA=1 "$TSR_TMP/b/base/box.o"
make -n -C "$TSR_ROOT" CUDA=1 all | grep -q "build/release-cuda/tessera" || fail "make CUDA=1 does not build in build/release-cuda"
make -n -C "$TSR_ROOT" all | grep -q "build/release-cuda" && fail "make (host) builds in build/release-cuda"

NVCC=${CUDA_HOME:-/usr/local/cuda}/bin/nvcc
if [ ! -x "$NVCC" ]; then
    echo "SKIP: no nvcc at $NVCC: the CUDA variant is not built here (the host checks passed)" >&2
    [ "$fails" = 0 ] && exit 77
    finish
fi
C=$TSR_ROOT/build/cuda/tessera
[ -x "$C" ] || { fail "$C is not built (make cuda-variant; make test builds it where nvcc is)"; finish; }
"$C" --version >cv.txt || fail "the CUDA build's --version"
grep -Eq "built with CUDA [0-9]+\.[0-9]+ \(cuBLAS\) and NCCL [0-9]+\.[0-9]+\.[0-9]+" cv.txt ||
    fail "the CUDA build's --version does not name CUDA and NCCL: $(cat cv.txt)"
ldd "$C" >ldd.txt
for lib in libcublas libcublasLt libnccl libcudart; do
    grep -q "$lib\.so" ldd.txt || fail "the CUDA build does not link $lib"
done
finish "build variants: the host build says it has no CUDA; the CUDA build names $(sed -n 2p cv.txt | sed 's/built with //') and links them; flags are tracked per folder"
