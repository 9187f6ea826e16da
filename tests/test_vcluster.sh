#!/bin/sh
# test_vcluster.sh: the virtual cluster of tests/vcluster.sh, the ground of the
# multi-host tests. Three hosts: each has its own name, its own address on the
# test's bridge and nothing of another's /dev/shm, while the test's folder is
# every host's; mpirun reaches them through the agent (Open MPI's remote-shell
# launcher), 2 ranks a host; a checkpoint saved by 6 ranks over the 3 hosts
# into the shared folder is verified and loaded by 4 ranks on 2 of them in
# another layout; a host killed loses its processes and its memory; at the end
# no namespace, link, bridge, mount or process of the cluster is left.
# tsr-timeout: 240
. "$TSR_ROOT/tests/mpi.sh" # common.sh, and no leak checks in MPI jobs
cd "$TSR_TMP" || exit 1
. "$TSR_ROOT/tests/vcluster.sh"
trap vcluster_down EXIT
trap 'exit 1' INT TERM # (the EXIT trap then removes the cluster)
vcluster_up 3
[ "$VC_HOSTS" = "h1 h2 h3" ] || fail "hosts: $VC_HOSTS"

# names, addresses, private memory, the shared folder
for h in $VC_HOSTS; do
    n=${h#h}
    [ "$(vcluster_exec $h hostname)" = "$h" ] || fail "$h: hostname $(vcluster_exec $h hostname)"
    addrs=$(vcluster_exec $h ip -4 -o addr show | awk '{print $4}' | sort | tr '\n' ' ')
    [ "$addrs" = "$VC_NET.$n/24 127.0.0.1/8 " ] || fail "$h: addresses $addrs"
    vcluster_exec $h sh -c "echo $h >/dev/shm/mark && echo $h >$TSR_TMP/seen-$h" || fail "$h: cannot write"
done
[ "$(vcluster_exec h2 ls /dev/shm)" = mark ] && [ "$(vcluster_exec h2 cat /dev/shm/mark)" = h2 ] ||
    fail "h2's /dev/shm holds another host's files: $(vcluster_exec h2 ls /dev/shm)"
[ -e /dev/shm/mark ] && fail "a host's /dev/shm is this machine's"
[ "$(cat seen-h1 seen-h2 seen-h3 | tr '\n' ' ')" = "h1 h2 h3 " ] || fail "the test's folder is not every host's"
# one host reaches another on the bridge
vcluster_exec h1 /usr/bin/python3 -c "
import socket, sys
s = socket.create_connection(('$VC_NET.254', int(sys.argv[1])), timeout=5)
" 1 2>/dev/null && fail "a port nobody listens on answered"
/usr/bin/python3 -c "
import socket
s = socket.socket(); s.bind(('$VC_NET.254', 0)); s.listen(1); print(s.getsockname()[1]); import sys; sys.stdout.flush()
c, a = s.accept(); c.sendall(a[0].encode()); c.close()
" >port.txt &
lp=$!
n=0; while [ ! -s port.txt ] && [ $n -lt 50 ]; do sleep 0.1; n=$((n + 1)); done
got=$(vcluster_exec h3 /usr/bin/python3 -c "
import socket
s = socket.create_connection(('$VC_NET.254', $(cat port.txt)), timeout=5); print(s.recv(64).decode())
")
wait $lp
[ "$got" = "$VC_NET.3" ] || fail "h3 reached the bridge from '$got', not $VC_NET.3"

# mpirun over the hosts: 2 ranks a host, each on its own host's /dev/shm
$VC_MPIRUN -np 6 sh -c 'echo "$(hostname) $OMPI_COMM_WORLD_RANK $(cat /dev/shm/mark)"' >ranks.txt 2>mpirun.err ||
    { fail "mpirun over the hosts: exit $?"; cat mpirun.err >&2; }
[ "$(sort ranks.txt | awk '{print $1 "=" $3}' | sort -u | tr '\n' ' ')" = "h1=h1 h2=h2 h3=h3 " ] &&
    [ "$(awk '{print $1}' ranks.txt | sort | uniq -c | awk '{print $1}' | tr '\n' ' ')" = "2 2 2 " ] ||
    fail "ranks not 2 a host, each with its host's memory: $(tr '\n' ';' <ranks.txt)"

# a checkpoint over the hosts, into the shared folder; loaded on 2 of them
$VC_MPIRUN -np 6 "$T" ckpt synth "$TSR_TMP/ck" --layout dp_shard=3,tp=2 --bytes 16M >synth.out 2>synth.err ||
    { fail "ckpt synth on 6 ranks over 3 hosts: exit $?"; tail -5 synth.err >&2; }
expect 0 "verify of the checkpoint saved over the hosts" "$T" ckpt verify "$TSR_TMP/ck"
printf 'h1 slots=2\nh2 slots=2\n' >two
$VC_MPI --hostfile two -np 4 "$T" ckpt check "$TSR_TMP/ck" --layout dp_shard=4 >load.out 2>load.err ||
    { fail "load on 4 ranks over 2 hosts: exit $?"; tail -5 load.err >&2; }
grep -q "^ok: .*every element of 8 tensors matches, loaded on 4 rank(s) in layout .*dp_shard=4" load.out || fail "load over 2 hosts: $(cat load.out)"

# a host killed: its processes and its memory gone
vcluster_exec h3 sh -c 'exec sleep 300' 2>/dev/null &
n=0; while [ -z "$(ip netns pids tsr${VC_NET##*.}h3 2>/dev/null)" ] && [ $n -lt 50 ]; do sleep 0.1; n=$((n + 1)); done
vcluster_kill h3
[ -z "$(ip netns pids tsr${VC_NET##*.}h3 2>/dev/null)" ] || fail "h3's processes outlived its kill"
[ -z "$(vcluster_exec h3 ls /dev/shm)" ] || fail "h3's memory outlived its kill: $(vcluster_exec h3 ls /dev/shm)"
wait 2>/dev/null

# nothing left
net=$VC_NET bridge=$VC_BRIDGE dir=$VC_DIR
vcluster_down
trap - EXIT
ip link show "$bridge" >/dev/null 2>&1 && fail "the bridge $bridge is left"
ls /run/netns 2>/dev/null | grep -q "^tsr${net##*.}h" && fail "namespaces left: $(ls /run/netns)"
ip -4 -o addr show | grep -q "inet $net\." && fail "an address of $net.0/24 is left"
grep -q " $dir/ns" /proc/self/mounts && fail "mounts left: $(grep " $dir/ns" /proc/self/mounts)"
finish "vcluster: 3 hosts with their own names, addresses and memory; mpirun, a save and a resharded load over them; a host killed; nothing left"
