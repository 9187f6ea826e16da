#!/bin/sh
# deps.sh [run|test|bench]: installs the Debian packages that are missing for
#   run    building tessera and the main job (make, make run): the compiler, the
#          libraries tessera links, Open MPI, gnuplot for the loss plot;
#   test   make test: those, and clang with its sanitizer runtimes (fuzz targets),
#          Debian's python3 with numpy and venv (the tests' Python environment,
#          tests/py_setup.sh, and the package's numpy-only check), CMake, Ninja and
#          a C++ compiler (llama.cpp from source, tests/llama_setup.sh), Ceph (a
#          real S3 server on loopback, tests/rgw.sh), GNU time, iproute2,
#          util-linux and OpenSSH (the virtual cluster's namespaces and its
#          hosts' sshd, tests/vcluster.sh: its own, on its hosts' addresses);
#   bench  make bench: the run set, Ceph, GNU time, python3 and the virtual
#          cluster's iproute2, util-linux and OpenSSH.
set -e
run="build-essential pkg-config liburing-dev libzstd-dev libxxhash-dev libisal-dev libcurl4-openssl-dev libssl-dev
libxml2-dev libinih-dev libcjson-dev libopenmpi-dev openmpi-bin libopenblas-dev gnuplot-nox"
ceph="ceph-mon ceph-mgr ceph-osd radosgw ceph-common"
case ${1:-run} in
run) pkgs=$run;;
test) pkgs="$run clang libclang-rt-14-dev time python3 python3-numpy python3-venv cmake ninja-build g++ $ceph iproute2 util-linux openssh-client openssh-server";;
bench) pkgs="$run time python3 $ceph iproute2 util-linux openssh-client openssh-server";;
*) echo "usage: deps.sh [run|test|bench]" >&2; exit 2;;
esac
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
# the virtual cluster runs sshd itself: the package's service is not started
# (a policy that forbids it, for the install only, where there is none)
if [ ! -e /usr/sbin/policy-rc.d ] && echo "$missing" | grep -q openssh-server; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
apt-get update -qq
apt-get install -y -qq $missing >/dev/null
