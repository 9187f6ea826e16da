# vcluster.sh: a cluster of K virtual hosts on this machine for the multi-host
# tests and make bench, reached the way Open MPI reaches real hosts: its
# remote-shell launcher over ssh, to an sshd on each host.
# Sourced; needs TSR_TMP, root, iproute2, util-linux (nsenter, unshare) and
# OpenSSH (sshd, ssh, ssh-keygen).
#   vcluster_up K  makes hosts h1..hK in $TSR_TMP/vc: each its own network
#       namespace with one address 10.201.N.i on a bridge made for it (the root
#       namespace holds 10.201.N.254 there; N is chosen so that no route of this
#       machine overlaps 10.201.N.0/24), its own UTS namespace (hostname hI) and
#       its own mount namespace with a private /dev/shm and /run (tmpfs),
#       everything else shared (the test's folders are every host's), and an
#       sshd listening on its address only, with a host key and an authorized
#       key made for the cluster. Its processes are the host's: they are not
#       below the process that started them (as on a real host), so a
#       supervisor here cannot reach them through /proc. Sets VC_HOSTS ("h1 h2
#       ..."), VC_HOSTFILE (Open MPI's syntax, slots=VC_SLOTS each, default 2),
#       VC_AGENT (ssh with the cluster's config: VC_AGENT HOST COMMAND runs
#       COMMAND there), VC_HEAD (10.201.N.254: this machine's address on the
#       bridge), VC_MPI (mpirun with the agent and Open MPI's TCP traffic held
#       to the bridge's subnet; add --hostfile, -np and the command) and
#       VC_MPIRUN (VC_MPI over every host: add -np and the command), and exports
#       the same settings as OMPI_MCA_* variables, for an mpirun started by
#       another program (tessera launch), with mpi_yield_when_idle (the hosts
#       share this machine's cores).
#   vcluster_exec HOST COMMAND...  runs COMMAND on HOST (entering its
#       namespaces, not over ssh).
#   vcluster_kill HOST  kills every process on HOST, takes its link down and
#       empties its /dev/shm: a host lost with its memory.
#   vcluster_revive HOST  a killed HOST back, with empty memory (once ssh reaches it).
#   vcluster_cut HOST / vcluster_heal HOST  takes HOST's link down (its
#       processes run on, cut off: a network partition) and up again.
#   vcluster_down  kills every process on every host, removes the namespaces,
#       the links, the bridge and the mounts: nothing is left. Tests call it
#       from an EXIT trap; it may be called twice.
# Anything that cannot be made is a failure that says what, never a skip.
_vc_up=''

_vc_fail() {
    echo "FAIL: vcluster: $*" >&2
    vcluster_down
    exit 1
}

_vc_run() { # what command...: the command, or fail saying what
    _vc_what=$1; shift
    "$@" >"$VC_DIR/last.err" 2>&1 || _vc_fail "$_vc_what: $(cat "$VC_DIR/last.err")"
}

vcluster_up() { # K
    for _vc_c in ip nsenter unshare mount mpirun ssh ssh-keygen /usr/sbin/sshd; do
        command -v $_vc_c >/dev/null 2>&1 || { echo "FAIL: vcluster: $_vc_c is not on PATH" >&2; exit 1; }
    done
    [ "$(id -u)" = 0 ] || { echo "FAIL: vcluster: needs root (network and mount namespaces)" >&2; exit 1; }
    VC_DIR=$TSR_TMP/vc
    rm -rf "$VC_DIR" && mkdir -p "$VC_DIR/ns" || exit 1
    # a subnet no route here touches, and names no link or namespace has
    _vc_n=$(( ($$ % 200) + 20 ))
    _vc_tries=0
    while ip -4 route show match "10.201.$_vc_n.0/24" | grep -vq "^default" ||
        ip -4 -o addr show | grep -q "inet 10\.201\.$_vc_n\." ||
        ip link show "tsrbr$_vc_n" >/dev/null 2>&1 || [ -e "/run/netns/tsr${_vc_n}h1" ]; do
        _vc_n=$(( (_vc_n + 1) % 250 + 1 )); _vc_tries=$((_vc_tries + 1))
        [ $_vc_tries -lt 250 ] || { echo "FAIL: vcluster: no free 10.201.N.0/24 subnet" >&2; exit 1; }
    done
    VC_NET=10.201.$_vc_n
    VC_HEAD=$VC_NET.254
    VC_BRIDGE=tsrbr$_vc_n
    _vc_up=1
    # the namespace files need a private mount to be bound on
    _vc_run "a private mount for the namespaces" mount --bind "$VC_DIR/ns" "$VC_DIR/ns"
    _vc_run "a private mount for the namespaces" mount --make-private "$VC_DIR/ns"
    _vc_run "the bridge $VC_BRIDGE" ip link add "$VC_BRIDGE" type bridge
    _vc_run "the bridge's address" ip addr add "$VC_NET.254/24" dev "$VC_BRIDGE"
    _vc_run "the bridge up" ip link set "$VC_BRIDGE" up
    VC_HOSTS=''
    : >"$VC_DIR/hostfile"
    _vc_i=1
    while [ $_vc_i -le "$1" ]; do
        _vc_h=h$_vc_i _vc_ns=tsr${_vc_n}h$_vc_i
        _vc_run "namespace of $_vc_h" ip netns add "$_vc_ns"
        _vc_run "link of $_vc_h" ip link add "v${_vc_n}h$_vc_i" type veth peer name eth0 netns "$_vc_ns"
        _vc_run "link of $_vc_h" ip link set "v${_vc_n}h$_vc_i" master "$VC_BRIDGE" up
        _vc_run "address of $_vc_h" ip -n "$_vc_ns" addr add "$VC_NET.$_vc_i/24" dev eth0
        _vc_run "link of $_vc_h" ip -n "$_vc_ns" link set eth0 up
        _vc_run "loopback of $_vc_h" ip -n "$_vc_ns" link set lo up
        : >"$VC_DIR/ns/$_vc_h.mnt" && : >"$VC_DIR/ns/$_vc_h.uts" || _vc_fail "cannot make $VC_DIR/ns/$_vc_h.*"
        _vc_run "mount and UTS namespaces of $_vc_h" unshare --mount="$VC_DIR/ns/$_vc_h.mnt" \
            --uts="$VC_DIR/ns/$_vc_h.uts" sh -c "hostname $_vc_h && mount -t tmpfs -o size=4g,mode=1777 tsr-$_vc_h /dev/shm &&
mount -t tmpfs -o size=64m,mode=755 tsr-run-$_vc_h /run && mkdir -m 755 /run/sshd"
        VC_HOSTS="$VC_HOSTS${VC_HOSTS:+ }$_vc_h"
        echo "$_vc_h slots=${VC_SLOTS:-2}" >>"$VC_DIR/hostfile"
        _vc_i=$((_vc_i + 1))
    done
    # ssh: a host key and a user key of the cluster's own, and a client config
    # that names the hosts by their addresses (nothing in ~/.ssh or /etc is used)
    _vc_run "the cluster's keys" sh -c "ssh-keygen -q -t ed25519 -N '' -f '$VC_DIR/host_key' &&
ssh-keygen -q -t ed25519 -N '' -f '$VC_DIR/id' && cp '$VC_DIR/id.pub' '$VC_DIR/authorized_keys'"
    cat >"$VC_DIR/sshd_config" <<EOF
HostKey $VC_DIR/host_key
AuthorizedKeysFile $VC_DIR/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
X11Forwarding no
PrintMotd no
LogLevel ERROR
EOF
    {
        for _vc_h in $VC_HOSTS; do printf 'Host %s\n  HostName %s.%s\n' $_vc_h $VC_NET ${_vc_h#h}; done
        printf 'Host *\n  User root\n  IdentityFile %s\n  IdentitiesOnly yes\n  StrictHostKeyChecking no\n' "$VC_DIR/id"
        printf '  UserKnownHostsFile /dev/null\n  GlobalKnownHostsFile /dev/null\n  LogLevel ERROR\n  BatchMode yes\n'
        printf '  ConnectTimeout 5\n'
    } >"$VC_DIR/ssh_config"
    for _vc_h in $VC_HOSTS; do
        _vc_run "sshd of $_vc_h" vcluster_exec $_vc_h /usr/sbin/sshd -f "$VC_DIR/sshd_config" \
            -o "ListenAddress=$VC_NET.${_vc_h#h}" -o "PidFile=/run/sshd.pid"
    done
    VC_AGENT=$VC_DIR/vc-ssh
    printf '#!/bin/sh\n# vc-ssh HOST COMMAND...: COMMAND run on the virtual host HOST over ssh (Open MPI'"'"'s plm_rsh_agent)\nexec ssh -F %s "$@"\n' \
        "$VC_DIR/ssh_config" >"$VC_AGENT"
    chmod +x "$VC_AGENT"
    _vc_i=0 # every sshd answers
    for _vc_h in $VC_HOSTS; do
        until [ "$("$VC_AGENT" $_vc_h hostname 2>"$VC_DIR/last.err")" = $_vc_h ]; do
            _vc_i=$((_vc_i + 1))
            [ $_vc_i -lt 50 ] || _vc_fail "ssh to $_vc_h: $(cat "$VC_DIR/last.err")"
            sleep 0.1
        done
    done
    VC_HOSTFILE=$VC_DIR/hostfile
    # the hosts share this machine's cores: a rank that waits in a collective
    # yields its core (busy polling over TCP made the small model's steps 3x slower)
    export OMPI_MCA_plm_rsh_agent="$VC_AGENT" OMPI_MCA_oob_tcp_if_include="$VC_NET.0/24" \
        OMPI_MCA_btl_tcp_if_include="$VC_NET.0/24" OMPI_MCA_btl=self,vader,tcp OMPI_MCA_mpi_yield_when_idle=1
    # a remote shell's environment is its own: what the tests set is passed on
    # (the sanitizers' options, tessera's variables), as tessera launch does
    VC_MPI="mpirun --allow-run-as-root --oversubscribe --bind-to none -x PATH"
    for _vc_v in ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS LD_LIBRARY_PATH $(env | sed -n 's/^\(TSR_[A-Za-z0-9_]*\)=.*/\1/p'); do
        [ -n "$(printenv "$_vc_v")" ] && VC_MPI="$VC_MPI -x $_vc_v"
    done
    VC_MPIRUN="$VC_MPI --hostfile $VC_HOSTFILE"
}

vcluster_exec() { # HOST COMMAND...
    _vc_h=$1; shift
    nsenter --net="/run/netns/tsr${_vc_n}$_vc_h" --mount="$VC_DIR/ns/$_vc_h.mnt" --uts="$VC_DIR/ns/$_vc_h.uts" -- "$@"
}

vcluster_cut() { # HOST
    ip link set "v${_vc_n}$1" down
}

vcluster_heal() { # HOST
    ip link set "v${_vc_n}$1" up
}

vcluster_kill() { # HOST
    _vc_ns=tsr${_vc_n}$1
    ip link set "v${_vc_n}$1" down 2>/dev/null # first: a dead host says nothing more
    ip netns pids "$_vc_ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
    # its memory goes with it: an empty /dev/shm in its place
    nsenter --mount="$VC_DIR/ns/$1.mnt" -- sh -c "umount -l /dev/shm && mount -t tmpfs -o size=4g,mode=1777 tsr-$1 /dev/shm" \
        2>/dev/null
    return 0
}

vcluster_revive() { # HOST: a killed host back (empty memory), its sshd started again; returns once it answers
    ip link set "v${_vc_n}$1" up
    ip neigh flush dev "$VC_BRIDGE" to "$VC_NET.${1#h}" 2>/dev/null # the failed lookups of its address, forgotten
    vcluster_exec $1 /usr/sbin/sshd -f "$VC_DIR/sshd_config" -o "ListenAddress=$VC_NET.${1#h}" -o "PidFile=/run/sshd.pid"
    _vc_i=0
    until [ "$("$VC_AGENT" $1 hostname 2>"$VC_DIR/last.err")" = $1 ]; do
        _vc_i=$((_vc_i + 1))
        [ $_vc_i -lt 100 ] || { echo "FAIL: vcluster: $1 revived but ssh fails: $(cat "$VC_DIR/last.err")" >&2; return 1; }
        sleep 0.1
    done
}

vcluster_down() {
    [ -n "$_vc_up" ] || return 0
    _vc_up=''
    for _vc_f in "$VC_DIR"/ns/*.mnt; do
        [ -e "$_vc_f" ] || continue
        _vc_h=$(basename "$_vc_f" .mnt)
        ip netns pids "tsr${_vc_n}$_vc_h" 2>/dev/null | xargs -r kill -9 2>/dev/null
    done
    sleep 0.2
    for _vc_f in "$VC_DIR"/ns/*.mnt; do
        [ -e "$_vc_f" ] || continue
        _vc_h=$(basename "$_vc_f" .mnt)
        ip netns del "tsr${_vc_n}$_vc_h" 2>/dev/null # its veth goes with it
        umount "$VC_DIR/ns/$_vc_h.mnt" "$VC_DIR/ns/$_vc_h.uts" 2>/dev/null
    done
    ip link del "$VC_BRIDGE" 2>/dev/null
    umount "$VC_DIR/ns" 2>/dev/null
    unset OMPI_MCA_plm_rsh_agent OMPI_MCA_oob_tcp_if_include OMPI_MCA_btl_tcp_if_include OMPI_MCA_btl \
        OMPI_MCA_mpi_yield_when_idle
    rm -rf "$VC_DIR/ns"
    return 0
}
