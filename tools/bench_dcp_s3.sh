#!/bin/sh
# The S3 side of the DCP comparison in make bench: tools/bench_dcp.py --s3 against
# Ceph's RADOS Gateway on loopback (tests/rgw.sh, a cluster made for the run;
# S3_SERVER=moto for moto): DCP with s3torchconnector against tessera's plug-in,
# the same state, processes and server. s3torchconnector's client (Mountpoint's)
# fails every upload whose CompleteMultipartUpload answer has no ETag header, and
# RGW 16 (like moto) gives the ETag in the body only: both clients save through
# tests/s3proxy.py --etag-header, which adds it and forwards everything else as
# it is; both load straight from the server (S3_LOAD_ENDPOINT), which the
# proxy's Python would otherwise slow for both on these few cores.
# Usage: tools/bench_dcp_s3.sh WORKDIR [WORLD] [--smoke]
OUT=$1; shift
export TSR_ROOT=$(cd "$(dirname "$0")/.." && pwd) TSR_TMP="$OUT/s3tmp"
rm -rf "$OUT" && mkdir -p "$TSR_TMP" || exit 1
PY=$(sh "$TSR_ROOT/tests/py_setup.sh") || exit 1
export S3_SERVER=${S3_SERVER:-rgw}
. "$TSR_ROOT/tests/s3.sh"
s3_start bkt
S3_LOAD_ENDPOINT=$AWS_ENDPOINT_URL
proxy_start --etag-header
S3_LOAD_ENDPOINT=$S3_LOAD_ENDPOINT AWS_ENDPOINT_URL=$PROXY_URL TESSERA_LIB="${TESSERA_LIB:-$TSR_ROOT/build/release}" PYTHONPATH="$TSR_ROOT/python" \
    "$PY" "$TSR_ROOT/tools/bench_dcp.py" --s3 s3://bkt/dcp "$@" || { echo "bench dcp s3: failed"; exit 1; }
