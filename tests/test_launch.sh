#!/bin/sh
# tsr-timeout: 400
# tessera launch, the supervisor: a rank killed (seen within 1 s), a rank
# stopped (a hang, named as stopped), a NaN loss (rolled back to the checkpoint
# before it, the data window skipped), a node whose ranks fail twice (dropped:
# the job goes on with fewer ranks) and the supervisor itself killed (no rank
# outlives it; a new supervisor finishes the run) each end in a finished run
# whose losses and final checkpoint equal an uninterrupted run's (with the same
# data skipped for the NaN): bitwise on the same layout, within 1e-4 on fewer
# ranks. Hostile heartbeats (garbage, a record not signed with the launch's
# key, a replayed one, a rank claimed twice, a rank out of range, a forged pid,
# a preemption record from a job not preempted) are refused, with their reason
# in the event
# log, and do not keep a stopped job alive. A supervisor stopped with SIGTERM
# ends the job before it exits; one whose job cannot start gives up after
# --max-restarts.
. "$TSR_ROOT/tests/mpi.sh"
. "$TSR_ROOT/tests/launch.sh"

# sup DIR NP [OPTIONS...]: the supervisor in the background (its pid in SUP)
sup() {
    dir=$1 np=$2; shift 2
    "$T" launch -np "$np" $FAST "$@" -- train $JOB ${TRAIN_EXTRA:-} --job.dump_folder="$TSR_TMP/$dir" >"$TSR_TMP/$dir.log" 2>&1 &
    SUP=$!
}
# usage: errors in the options or in the job's config before anything runs
expect 0 "launch --help" "$T" launch --help
grep -q "usage: tessera launch -np N" out.txt || fail "launch --help prints its usage"
expect 2 "launch without -np" "$T" launch -- train --config "$CFG"
expect 2 "launch without a job" "$T" launch -np 2
expect 2 "launch --nodes 3 of 2" "$T" launch -np 2 --nodes 3 -- train --config "$CFG"
expect 2 "launch with a bad key" "$T" launch -np 2 -- train --config "$CFG" --training.stepz=3 --job.dump_folder="$TSR_TMP/u"
grep -q "did you mean" err.txt || fail "launch with a bad key: no suggestion"
[ -e "$TSR_TMP/u" ] && fail "launch with a bad key: the job's folder was made"
# over hosts: each misuse refused, naming it, before anything runs (no host is reached)
printf 'ha slots=2\nhb slots=1 # one slot\n' >"$TSR_TMP/hosts"
hosts_bad() { # WANT WHAT ARGS...: exit 2 and WANT in the message
    hb_want=$1 hb_what=$2; shift 2 # (expect sets want and what)
    expect 2 "$hb_what" "$T" launch "$@" -- train --config "$CFG"
    grep -q -- "$hb_want" err.txt || fail "$hb_what: the message lacks '$hb_want': $(cat err.txt)"
}
hosts_bad "does not spread evenly over the 2 hosts" "-np not a multiple of the hosts" -np 3 --hostfile "$TSR_TMP/hosts"
hosts_bad "host hb has 1 slot(s); the job places 2 ranks" "too few slots" -np 4 --hostfile "$TSR_TMP/hosts"
hosts_bad "--chaos needs the ranks on this machine" "--chaos over hosts" -np 2 --hostfile "$TSR_TMP/hosts" --chaos 30
hosts_bad "--listen is for ranks on other hosts" "--listen without hosts" -np 2 --listen 127.0.0.1
hosts_bad "--nodes and --hostfile" "--nodes with --hostfile" -np 2 --nodes 2 --hostfile "$TSR_TMP/hosts"
hosts_bad "$TSR_TMP/nohosts: cannot open" "a hostfile that is not there" -np 2 --hostfile "$TSR_TMP/nohosts"

# bounded restarts: a job that cannot start is given up after --max-restarts,
# the backoff (0.2 s) doubling with each launch in a row that trained no step
"$T" launch -np 2 $FAST --max-restarts 2 -- train $JOB --job.dump_folder="$TSR_TMP/bad" \
    --training.dataset_path="$TSR_TMP/nowhere" >"$TSR_TMP/bad.log" 2>&1
rc=$?
[ $rc = 1 ] || fail "bad: exit $rc, expected 1"
[ "$(ev bad "e['event']=='relaunch'")" = 2 ] || fail "bad: not two relaunches"
ev bad "e['event']=='relaunch' and e['restart']==1 and e['backoff_s']==0.4" >/dev/null &&
    ev bad "e['event']=='relaunch' and e['restart']==2 and e['backoff_s']==0.8" >/dev/null ||
    { fail "bad: the backoff is not 0.4 s then 0.8 s"; grep relaunch "$TSR_TMP/bad/launch.jsonl" >&2; }
ev bad "e['event']=='finish' and e['status']=='failed' and e['restarts']==2 and e['rank_exits']==3" >/dev/null ||
    { fail "bad: no failed finish after 2 restarts"; tail -n 3 "$TSR_TMP/bad/launch.jsonl" >&2; }
grep -q "giving up" "$TSR_TMP/bad.log" || fail "bad: no 'giving up' said"

# the uninterrupted runs: 2 ranks, and 2 ranks with the data of steps 9-11 skipped
run_np 2 "$T" train $JOB --job.dump_folder="$TSR_TMP/ref" >"$TSR_TMP/ref.log" 2>&1 || fail "ref: exit $?"
run_np 2 "$T" train $JOB --job.dump_folder="$TSR_TMP/ref_skip" --training.skip_data_after_step=8 \
    --training.skip_data_steps=3 >"$TSR_TMP/ref_skip.log" 2>&1 || fail "ref_skip: exit $?"
grep -q "step 9: skipping the data of 3 step" "$TSR_TMP/ref_skip.log" || fail "ref_skip: no skip said"

# a rank killed: seen within 1 s, the job relaunched, resumed from step 8
sup kill 2
wait_step kill 10
pid=$(rank_pid kill 1 1)
t_kill=$(date +%s.%N)
kill -9 "$pid"
finished kill 1
t_seen=$(ev kill "e['event']=='rank_exit' and e['launch']==1 and e['rank']==1" time) || fail "kill: no rank_exit of rank 1"
$PY -c "import sys; sys.exit(0 if 0 <= $t_seen - $t_kill < 1.0 else 1)" ||
    fail "kill: the rank's exit was seen $t_seen, killed $t_kill: not within 1 s"
ev kill "e['event']=='recovered' and e['launch']==2 and e['cost_s'] > 0" >/dev/null || fail "kill: no recovered event with its cost"
ev kill "e['event']=='relaunch' and e['restart']==1 and e['backoff_s']==0.2" >/dev/null ||
    fail "kill: a launch that trained steps is not relaunched after the plain backoff (0.2 s)"
grep -q "resumed from" "$TSR_TMP/kill.log" || fail "kill: the relaunch did not resume"
compare ref kill 0

# a hang: rank 1 stopped; after the automatic hang timeout (5x the median step,
# at least 5 s: here the floor) the job is killed and relaunched. Checkpoints every
# 6 steps and the stop after step 7: rank 0 waits for rank 1 in a step, not in the
# save of step 12 (a save gets the start-up allowance under the automatic timeout)
TRAIN_EXTRA=--checkpoint.interval=6
sup hang 2
TRAIN_EXTRA=
wait_step hang 7
pid=$(rank_pid hang 1 1)
kill -STOP "$pid"
# while rank 1 is stopped, hostile heartbeats with the launch's socket and
# token: refused, and they do not keep the stopped job alive
pid0=$(rank_pid hang 1 0)
$PY - "$pid0" <<'EOF' || fail "hostile: the sender failed"
import hashlib, hmac, os, socket, struct, sys, time
env = dict(kv.split("=", 1) for kv in open("/proc/%s/environ" % sys.argv[1]).read().split("\0") if "=" in kv)
path, key = env["TSR_HEARTBEAT"], bytes.fromhex(env["TSR_HEARTBEAT_KEY"])
def send(make):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    hello = b""
    while len(hello) < 32:
        hello += s.recv(32 - len(hello))
    assert hello[:4] == b"TSHN" and struct.unpack("<I", hello[4:8])[0] == 3, hello
    s.sendall(make(hello[8:]))
    time.sleep(0.1)
    s.close()
def rec(rank, world, pid, version=3, phase=3, seq=1, compute=0.05, k=None):
    body = struct.pack("<IHHQIIIIqddddd", 0x42485354, version, phase, seq, rank, world, pid, 0, 50, 1.0, 1.0,
                       time.time(), 0.1, compute)
    return lambda nonce: body + hmac.new(k or key, nonce + body, hashlib.sha256).digest()
me = os.getpid()
send(lambda nonce: b"garbage!" * 14)
send(rec(1, 2, me, version=1))
send(rec(1, 2, me, compute=0.2))
send(rec(1, 2, me, k=bytes(x ^ 1 for x in key)))
send(rec(1, 2, me))
send(rec(5, 2, me))
send(rec(1, 2, 1))
send(rec(1, 2, me, phase=7))
send(rec(1, 2, me, seq=2))
EOF
finished hang 1
ev hang "e['event']=='hang' and e['rank']==1 and e['state']=='T' and e['timeout_s']==5 and 5 <= e['silent_s'] < 9" >/dev/null ||
    { fail "hang: not detected as rank 1 stopped after the automatic 5 s"; grep hang "$TSR_TMP/hang/launch.jsonl" >&2; }
for why in "not a heartbeat" "heartbeat version 1" "compute time 0.2 outside" "not signed with this launch" "rank 1 is already held by pid $pid" "rank 5 of 2" "the record says pid 1" "a preemption record, but this job was not preempted" "sequence number 2 where 1 was due"; do
    ev hang "e['event']=='refused' and e['launch']==1 and '$why' in e['reason']" >/dev/null ||
        fail "hostile: '$why' not refused"
done
compare ref hang 0

# a NaN loss at step 11: back to step 8, the data of steps 9-11 skipped
export TSR_FAULT_NAN=11
sup nan 2
unset TSR_FAULT_NAN
finished nan 1
ev nan "e['event']=='nan' and e['step']==11" >/dev/null || fail "nan: no nan event at step 11"
ev nan "e['event']=='rollback' and e['checkpoint_step']==8 and e['skip_steps']==3" >/dev/null || fail "nan: no rollback to 8"
ev nan "e['event']=='launch' and e['launch']==2 and 'skip_data_steps=3' in e['extra_args']" >/dev/null ||
    fail "nan: the relaunch does not skip the data"
compare ref_skip nan 0
# a supervisor started again on the run keeps its rollback's data window
sup nan 2
finished nan 0
ev nan "e['event']=='launch' and e['launch']==1 and 'skip_data_after_step=8 --training.skip_data_steps=3' in e['extra_args']" \
    >/dev/null || fail "nan: a new supervisor forgot the skipped window"
compare ref_skip nan 0

# a node dropped: 4 ranks on 2 nodes; rank 3 (node 1) killed, then the whole
# node (ranks 2 and 3); the job ends on the 2 ranks of node 0, resharded, the
# global batch kept
sup node 4 --nodes 2 --min-ranks 2
wait_step node 6
kill -9 "$(rank_pid node 1 3)"
wait_for node "e['event']=='rank_up' and e['launch']==2 and e['rank']==3"
wait_step node 12
kill -9 "$(rank_pid node 2 2)" "$(rank_pid node 2 3)"
finished node 2
ev node "e['event']=='node_dropped' and e['node']==1 and e['np']==2" >/dev/null || fail "node: node 1 not dropped"
ev node "e['event']=='launch' and e['launch']==3 and e['np']==2" >/dev/null || fail "node: no relaunch on 2 ranks"
grep -q "loaded as pp=1,dp_replicate=1,dp_shard=2,tp=1" "$TSR_TMP/node.log" || fail "node: the 2-rank relaunch did not reshard"
compare ref node 1e-4

# the supervisor killed: no rank outlives it; a new supervisor finishes the run
sup orphan 2
wait_step orphan 10
pgrep -f "job.dump_folder=$TSR_TMP/orphan" >/dev/null || fail "orphan: no process of the job found"
kill -9 $SUP
wait $SUP 2>/dev/null
i=0
while pgrep -f "job.dump_folder=$TSR_TMP/orphan" >/dev/null && [ $i -lt 100 ]; do sleep 0.05; i=$((i + 1)); done
pgrep -af "job.dump_folder=$TSR_TMP/orphan" >&2 && fail "orphan: processes of the job outlive their supervisor by 5 s"
sup orphan 2
finished orphan 0
compare ref orphan 0

# the supervisor asked to stop (SIGTERM): it ends the job first, then exits 1
sup term 2
wait_step term 6
kill -TERM $SUP
wait $SUP
rc=$?
[ $rc = 1 ] || fail "term: exit $rc, expected 1"
pgrep -af "job.dump_folder=$TSR_TMP/term" >&2 && fail "term: processes of the job outlive their supervisor"
ev term "e['event']=='killed' and e['cause']=='signal'" >/dev/null || fail "term: the job was not ended"
ev term "e['event']=='finish' and e['status']=='failed'" >/dev/null || fail "term: no finish event"
finish "launch: rank killed, hang, NaN rollback, node dropped, supervisor killed or stopped, hostile heartbeats ok"
