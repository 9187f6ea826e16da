#!/bin/sh
# py_setup.sh: the tests' Python environment, a virtual environment of Debian's
# python3 with exactly the packages pinned (versions and SHA-256) in
# tests/requirements.txt: PyTorch 2.x on the CPU, numpy, safetensors, transformers,
# gguf, torchtitan, s3torchconnector's client; then tests/requirements-sdist.txt,
# what PyPI has as source only, built by the setuptools just installed. It lives
# in the cache outside the repository, keyed by the hash of what decides its
# contents, so later runs reuse it and a changed file makes a new one:
#   ${TSR_CACHE:-/var/cache/tessera}/pyenv-KEY/
# torch's wheel asks for NVIDIA's CUDA libraries; where the dynamic linker finds
# the CUDA Toolkit's (/usr/local/cuda), only the four it lacks are installed (2.3 GB,
# about a minute the first time); elsewhere tests/requirements-cuda.txt adds the
# rest. One install at a time (flock); the folder counts only once its ok file is
# written last (a virtual environment cannot be renamed into place: its scripts
# name their folder), and a folder without it, left by a run that died, is
# removed and made anew. Prints the interpreter's path; exits 1, saying why, when
# it cannot.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${TSR_CACHE:-/var/cache/tessera}
BASE=/usr/bin/python3
die() { echo "py_setup: $*" >&2; exit 1; }
[ -x "$BASE" ] || die "$BASE is missing (Debian's python3: make deps-test)"
"$BASE" -c 'import ensurepip, venv' 2>/dev/null || die "$BASE cannot make virtual environments (python3-venv: make deps-test)"
REQS="$HERE/requirements.txt"
# the CUDA Toolkit's libraries that torch links and the four pinned packages do not bring
for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 libcufft.so.12 libcusparse.so.12 \
    libnvrtc.so.13 libnvJitLink.so.13 libcupti.so.13; do
    ldconfig -p 2>/dev/null | grep -q "^[[:space:]]*$lib " || { REQS="$REQS $HERE/requirements-cuda.txt"; break; }
done
SDIST=$HERE/requirements-sdist.txt
KEY=$( { "$BASE" -V; cat $REQS "$SDIST"; } | sha256sum | cut -c1-16)
DIR=$CACHE/pyenv-$KEY
if [ -f "$DIR/ok" ]; then
    echo "$DIR/bin/python"
    exit 0
fi
mkdir -p "$CACHE" || die "cannot create $CACHE (set TSR_CACHE to a writable directory)"
exec 9>"$CACHE/.pyenv-$KEY.lock" || die "cannot write in $CACHE"
flock 9
if [ -f "$DIR/ok" ]; then
    echo "$DIR/bin/python"
    exit 0
fi
rm -rf "$DIR"
echo "py_setup: installing the tests' Python packages ($(echo $REQS | sed "s|$HERE/|tests/|g")) into $DIR" >&2
"$BASE" -m venv "$DIR" || die "python3 -m venv $DIR failed"
args=""
for r in $REQS; do args="$args -r $r"; done
# no dependencies of their own: the files list every package, so that nothing
# unpinned comes in
"$DIR/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir --no-deps --require-hashes $args >&2 ||
    { rm -rf "$DIR"; die "pip could not install $REQS (is PyPI reachable?)"; }
# source-only packages, built by the setuptools just pinned
"$DIR/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir --no-deps --require-hashes \
    --no-build-isolation -r "$SDIST" >&2 ||
    { rm -rf "$DIR"; die "pip could not build $SDIST"; }
"$DIR/bin/python" -c 'import torch, numpy, safetensors, transformers, gguf, torchtitan.components.checkpoint, s3torchconnector.dcp; torch.ones(2) @ torch.ones(2)' >&2 ||
    { rm -rf "$DIR"; die "the packages installed but do not import"; }
echo "$REQS" >"$DIR/ok"
echo "$DIR/bin/python"
