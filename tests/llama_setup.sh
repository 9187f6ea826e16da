#!/bin/sh
# llama_setup.sh: installs the llama.cpp that tests/test_llama.sh runs, from the npm
# registry, into a cache outside the repository that later runs reuse:
#   ${TSR_CACHE:-/var/cache/tessera}/llama.cpp-3.21.1/
#     lib/      libllama and libggml*, prebuilt for linux-x64 CPUs
#               (@node-llama-cpp/linux-x64@3.21.1)
#     include/  llama.h and ggml's headers, from the llama.cpp source that
#               node-llama-cpp@3.21.1 ships as llama/gitRelease.bundle
#     source    the llama.cpp commit those come from
# Only the two package tarballs are fetched (npm pack, which checks them against the
# registry's integrity hashes), not node-llama-cpp's dependencies nor other
# platforms' binaries. Prints the directory; exits 1, saying why, when it cannot.
# Needs npm, git and tar.
set -eu
VERSION=3.21.1
CACHE=${TSR_CACHE:-/var/cache/tessera}
DIR=$CACHE/llama.cpp-$VERSION
if [ -f "$DIR/ok" ]; then
    echo "$DIR"
    exit 0
fi
die() { echo "llama_setup: $*" >&2; exit 1; }
for tool in npm git tar; do
    command -v $tool >/dev/null || die "$tool is not installed: it is needed to install llama.cpp for the tests"
done
mkdir -p "$CACHE" || die "cannot create $CACHE (set TSR_CACHE to a writable directory)"
# one install at a time; a run that waited finds it done
if command -v flock >/dev/null; then
    exec 9>"$CACHE/.llama.cpp-$VERSION.lock" || die "cannot write in $CACHE"
    flock 9
    if [ -f "$DIR/ok" ]; then
        echo "$DIR"
        exit 0
    fi
fi
WORK=$(mktemp -d "$CACHE/.llama.cpp-$VERSION.XXXXXX") || die "cannot write in $CACHE"
trap 'rm -rf "$WORK"' EXIT INT TERM
echo "llama_setup: installing llama.cpp from node-llama-cpp@$VERSION into $DIR" >&2
(cd "$WORK" && npm pack --silent "node-llama-cpp@$VERSION" "@node-llama-cpp/linux-x64@$VERSION" >packed.txt) ||
    die "npm pack node-llama-cpp@$VERSION @node-llama-cpp/linux-x64@$VERSION failed (is the npm registry reachable?)"
mkdir "$WORK/main" "$WORK/bins" "$WORK/out" "$WORK/out/lib" "$WORK/out/include"
tar -xzf "$WORK/node-llama-cpp-$VERSION.tgz" -C "$WORK/main" package/llama/gitRelease.bundle ||
    die "node-llama-cpp-$VERSION.tgz: no llama/gitRelease.bundle"
tar -xzf "$WORK/node-llama-cpp-linux-x64-$VERSION.tgz" -C "$WORK/bins" ||
    die "node-llama-cpp-linux-x64-$VERSION.tgz: cannot unpack"
B=$WORK/bins/package/bins/linux-x64
[ -f "$B/libllama.v0.4.0.so" ] || die "@node-llama-cpp/linux-x64@$VERSION: no bins/linux-x64/libllama.v0.4.0.so"
cp "$B"/*.so "$WORK/out/lib/"
git init -q "$WORK/src"
git -C "$WORK/src" fetch -q "$WORK/main/package/llama/gitRelease.bundle" HEAD ||
    die "gitRelease.bundle: git cannot read it"
git -C "$WORK/src" archive FETCH_HEAD include ggml/include | tar -x -C "$WORK/out/include" ||
    die "gitRelease.bundle: no include/ or ggml/include/"
mv "$WORK/out/include/include/llama.h" "$WORK/out/include/"
cp "$WORK/out/include/ggml/include/"*.h "$WORK/out/include/"
rm -rf "$WORK/out/include/include" "$WORK/out/include/ggml"
git -C "$WORK/src" rev-parse FETCH_HEAD >"$WORK/out/source"
echo "node-llama-cpp@$VERSION" >"$WORK/out/ok"
rm -rf "$DIR"
mv "$WORK/out" "$DIR" || die "cannot move the install into $DIR"
echo "$DIR"
