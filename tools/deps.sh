#!/bin/sh
# Installs the Debian packages tessera needs that are missing. Run by make test/run/bench.
set -e
pkgs="build-essential clang libclang-rt-14-dev pkg-config liburing-dev libzstd-dev libxxhash-dev
libcurl4-openssl-dev time libssl-dev libxml2-dev libinih-dev libcjson-dev libopenmpi-dev openmpi-bin libopenblas-dev gnuplot-nox python3-numpy python3-torch
ceph-mon ceph-mgr ceph-osd radosgw ceph-common"
missing=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" != 0 ]; then
    echo "tessera needs these Debian packages:$missing" >&2
    echo "install them as root: apt-get install$missing" >&2
    exit 1
fi
echo "installing:$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq $missing >/dev/null
