#!/bin/sh
# llama_setup.sh: builds the llama.cpp that tests/test_llama.sh runs, from source,
# into a cache outside the repository that later runs reuse:
#   ${TSR_CACHE:-/var/cache/tessera}/llama.cpp-0.3.36/
#     lib/      libllama, libllama-common and the ggml libraries (shared, CPU only)
#     bin/      llama-tokenize
#     include/  llama.h and ggml's headers
#     source    the llama.cpp tree it was built from (the sdist's vendor/llama.cpp)
# The source is the llama-cpp-python 0.3.36 source distribution on PyPI, which
# vendors llama.cpp's whole tree; it is fetched with pip (no dependencies, no
# wheel) and checked against its SHA-256 below. The build is CPU only with
# GGML_NATIVE=OFF (x86-64's baseline instructions, no -march=native), so that the
# results do not depend on the machine that built it: about 4 minutes on 2 cores
# the first time, 13 MB in the cache (the 77 MB sdist and the build tree are
# removed). One build at a time (flock); the result is built in a temporary folder
# and renamed into place, so that a run that waited or died never sees half of
# it. Prints the directory; exits 1, saying why, when it cannot.
# Needs pip (the tests' Python: tests/py_setup.sh), cmake, ninja, a C and C++
# compiler and tar.
set -eu
VERSION=0.3.36
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
CACHE=${TSR_CACHE:-/var/cache/tessera}
DIR=$CACHE/llama.cpp-$VERSION
if [ -f "$DIR/ok" ]; then
    echo "$DIR"
    exit 0
fi
die() { echo "llama_setup: $*" >&2; exit 1; }
for tool in cmake ninja cc c++ tar sha256sum flock; do
    command -v $tool >/dev/null || die "$tool is not installed: it is needed to build llama.cpp for the tests (make deps-test)"
done
PY=$(sh "$(dirname "$0")/py_setup.sh") || die "the tests' Python environment could not be set up (see above)"
mkdir -p "$CACHE" || die "cannot create $CACHE (set TSR_CACHE to a writable directory)"
# one build at a time; a run that waited finds it done
exec 9>"$CACHE/.llama.cpp-$VERSION.lock" || die "cannot write in $CACHE"
flock 9
if [ -f "$DIR/ok" ]; then
    echo "$DIR"
    exit 0
fi
WORK=$(mktemp -d "$CACHE/.llama.cpp-$VERSION.XXXXXX") || die "cannot write in $CACHE"
trap 'rm -rf "$WORK"' EXIT INT TERM
echo "llama_setup: building llama.cpp from llama-cpp-python==$VERSION (PyPI sdist) into $DIR" >&2
"$PY" -m pip download --quiet --disable-pip-version-check --no-cache-dir --no-binary llama-cpp-python --no-deps --dest "$WORK" "llama-cpp-python==$VERSION" >&2 ||
    die "pip download llama-cpp-python==$VERSION failed (is PyPI reachable?)"
SDIST=$WORK/llama_cpp_python-$VERSION.tar.gz
[ -f "$SDIST" ] || die "pip download gave no $SDIST"
echo "$SHA256  $SDIST" | sha256sum -c --quiet - >&2 || die "$SDIST: SHA-256 is not $SHA256"
tar -xzf "$SDIST" -C "$WORK" "llama_cpp_python-$VERSION/vendor/llama.cpp" ||
    die "$SDIST: no vendor/llama.cpp"
rm -f "$SDIST"
SRC=$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp
# shared libraries that find each other beside themselves, and llama-tokenize
# that finds them in ../lib; no tests, examples, server, curl or OpenSSL
cmake -S "$SRC" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
    -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_COMMON=ON \
    '-DCMAKE_BUILD_RPATH=$ORIGIN;$ORIGIN/../lib' >"$WORK/cmake.log" 2>&1 ||
    { tail -20 "$WORK/cmake.log" >&2; die "cmake could not configure llama.cpp (above)"; }
cmake --build "$WORK/build" --target llama llama-tokenize >"$WORK/build.log" 2>&1 ||
    { tail -20 "$WORK/build.log" >&2; die "llama.cpp did not build (above)"; }
mkdir "$WORK/out" "$WORK/out/lib" "$WORK/out/bin" "$WORK/out/include"
cp -P "$WORK/build/bin/"*.so* "$WORK/out/lib/"
cp "$WORK/build/bin/llama-tokenize" "$WORK/out/bin/"
cp "$SRC/include/llama.h" "$SRC/ggml/include/"*.h "$WORK/out/include/"
"$WORK/out/bin/llama-tokenize" --help >/dev/null 2>&1 || die "the llama-tokenize just built does not run"
echo "llama.cpp from llama-cpp-python==$VERSION (sdist sha256 $SHA256), vendor/llama.cpp" >"$WORK/out/source"
echo "llama-cpp-python==$VERSION" >"$WORK/out/ok"
rm -rf "$DIR"
mv "$WORK/out" "$DIR" || die "cannot move the build into $DIR"
echo "$DIR"
