#!/bin/sh
# tsr-timeout: 600
# tessera launch over hosts (--hostfile), on the virtual cluster of
# tests/vcluster.sh (3 hosts, 2 ranks each, reached over ssh; the ranks report
# over TCP, every record signed with the launch's key; the local tier in each
# host's own /dev/shm, partner copies on the next host):
#   - a host killed mid-run (its processes, its link and its memory): the
#     supervisor finds its ranks silent, drops the host at once and the job
#     restarts on the 4 ranks of the other hosts from their memory and partner
#     copies, resharded; the host back, it rejoins at the next restart (a rank
#     killed), on 6 ranks again;
#   - a host cut off for 20 s while its ranks run on: dropped likewise, the job
#     goes on without it; the ranks cut off stop themselves (they hear nothing
#     from the supervisor: --orphan-timeout) and commit nothing;
#   - a host's ranks stopped (SIGSTOP) for 12 s, three times --host-timeout, while the
#     host runs: it answers on the network, so it is stalled, not lost
#     ("host_stalled"); once they go on, so does the job, with no restart (the
#     ranks find the supervisor's commands waiting: not orphans); then the
#     supervisor stopped for 12 s: it logs its own stall ("supervisor_stalled"),
#     and no restart follows;
#   - the supervisor preempted (SIGTERM) with a 10 s grace: the next launch,
#     inside a "Slurm allocation" of the same hosts (SLURM_JOB_NODELIST, no
#     --hostfile) of which h3 is dead from the start (mpirun fails, the probe
#     finds h3 dead), runs on h1 and h2 and resumes from the step the ranks
#     stopped after, h3's part from its partner copy.
# Each run trains every step's data exactly once (tests/samples_check.py) and
# ends with a checkpoint that verifies, as does every step it committed.
. "$TSR_ROOT/tests/mpi.sh"
. "$TSR_ROOT/tests/launch.sh"
. "$TSR_ROOT/tests/vcluster.sh"
trap vcluster_down EXIT
trap 'exit 1' INT TERM
vcluster_up 3
# 6 ranks, then 4: a global batch of 24 fits both (2 samples a rank, 2 or 3 micro-batches)
# a snapshot in memory every 4 steps, a durable checkpoint every 6: a fault at
# step 10 finds snapshot 8 (with its partner copies) newer than checkpoint 6
JOB="$JOB --training.global_batch_size=24 --checkpoint.interval=6 --checkpoint.local_interval=4"
sup() {
    dir=$1; shift
    "$T" launch -np 6 ${HOSTS---hostfile $VC_HOSTFILE} --listen "$VC_HEAD" --min-ranks 4 --readmit-after 0 $FAST "$@" -- train $JOB \
        --job.dump_folder="$TSR_TMP/$dir" >>"$TSR_TMP/$dir.log" 2>&1 &
    SUP=$!
}
# tessera processes on HOST
on_host() { ip netns pids "tsr${VC_NET##*.}$1" 2>/dev/null | while read -r p; do
    [ "$(cat /proc/$p/comm 2>/dev/null)" = tessera ] && echo $p; done; }
# done DIR: the supervisor of DIR exited 0, the run finished (after some restarts:
# a host lost is found by its silence or, first, by mpirun and then the probe)
done_ok() {
    wait $SUP || { fail "$1: tessera launch exited $?"; tail -15 "$TSR_TMP/$1.log" >&2; }
    ev "$1" "e['event']=='finish' and e['status']=='ok' and e['restarts']>=1" >/dev/null ||
        { fail "$1: no finish"; tail -3 "$TSR_TMP/$1/launch.jsonl" >&2; }
}
# checked DIR: every sample once over 24 steps, every committed step verifies
checked() {
    $PY "$TSR_ROOT/tests/samples_check.py" "$TSR_TMP/$1/metrics.jsonl" "$TSR_TMP/$1/launch.jsonl" 24 >/dev/null ||
        fail "$1: samples lost or trained twice"
    for d in "$TSR_TMP/$1"/checkpoint/step-*; do
        [ -f "$d/MANIFEST" ] || continue
        expect 0 "$1: $(basename "$d") verifies" "$T" ckpt verify "$d"
    done
    [ -f "$TSR_TMP/$1/checkpoint/step-00000024/MANIFEST" ] || fail "$1: no final checkpoint"
}
# the steps take at least 150 ms (rank 0 works longer: TSR_FAULT_SLOW; the
# values do not change), so that a fault lands mid-run on a fast machine too
export TSR_FAULT_SLOW=0:150

# a host killed: h3 (ranks 4 and 5, node 2)
sup kill
wait_step kill 10
ev kill "e['event']=='rank_up' and e['launch']==1 and e['rank']==5 and e['peer'].startswith('$VC_NET.3:')" >/dev/null ||
    fail "kill: rank 5 did not report from h3 ($VC_NET.3) over TCP"
vcluster_kill h3
wait_for kill "e['event']=='host_lost' and e['host']=='h3'" &&
    wait_for kill "e['event']=='node_dropped' and e['node']==2 and e['np']==4" &&
    wait_for kill "e['event']=='launch' and e['extra_args'].endswith('--checkpoint.local_nodes=0,1')"
grep -q "host h3 lost: " "$TSR_TMP/kill.log" || fail "kill: the loss of h3 not said"
l2=$(ev kill "e['event']=='launch' and e['extra_args'].endswith('--checkpoint.local_nodes=0,1')" launch)
wait_for kill "e['event']=='recovered' and e['launch']==$l2"
grep -q "resumed from .* (the local tier, step" "$TSR_TMP/kill.log" ||
    { fail "kill: not resumed from the hosts' memory"; grep "resumed" "$TSR_TMP/kill.log" >&2; }
down=$(ev kill "e['event']=='recovered'" downtime_s)
echo "kill: from the host's loss to the next step: ${down} s"
# h3 back (rebooted, empty memory); a rank of h1 killed: at that restart h3
# runs the probe and is back in the job, which resumes on 6 ranks again
vcluster_revive h3
s2=$(ev kill "e['event']=='recovered' and e['launch']==$l2" step)
wait_step kill $((s2 + 2))
kill -9 "$(ev kill "e['event']=='rank_up' and e['launch']==$l2 and e['rank']==1" pid)"
wait_for kill "e['event']=='host_back' and e['host']=='h3' and e['np']==6" &&
    wait_for kill "e['event']=='launch' and e['launch']>$l2 and e['np']==6"
done_ok kill
checked kill

# a host cut off for 20 s: h2 (ranks 2 and 3, node 1); its ranks run on
sup cut
wait_step cut 10
vcluster_cut h2
t0=$(date +%s)
wait_for cut "e['event']=='host_lost' and e['host']=='h2'" &&
    wait_for cut "e['event']=='launch' and e['extra_args'].endswith('--checkpoint.local_nodes=0,2')"
# within the orphan timeout (10 s) and a margin, the ranks cut off are gone
n=0
while [ -n "$(on_host h2)" ] && [ $n -lt 300 ]; do sleep 0.1; n=$((n + 1)); done
[ -z "$(on_host h2)" ] || fail "cut: the ranks cut off on h2 still run $(( $(date +%s) - t0 )) s after the cut"
left=$((20 - ($(date +%s) - t0)))
[ $left -gt 0 ] && sleep $left
vcluster_heal h2
done_ok cut
checked cut

# h2's ranks stopped for 12 s, over the orphan timeout (10 s) too (the default
# --host-timeout is 4 s; the other ranks wait for them in a collective: a hang
# timeout of 60 s)
sup stall --hang-timeout 60
wait_step stall 8
stopped=$(on_host h2)
[ -n "$stopped" ] || fail "stall: no ranks on h2"
kill -STOP $stopped
wait_for stall "e['event']=='host_stalled' and e['host']=='h2'"
sleep 8
kill -CONT $stopped
# then the supervisor stopped for 12 s: it says its own stall when it goes on,
# and the run ends with no restart
wait_step stall 14
kill -STOP $SUP
sleep 12
kill -CONT $SUP
finished stall 0
ev stall "e['event']=='supervisor_stalled' and e['seconds'] >= 11" >/dev/null ||
    fail "stall: the supervisor's own stall not logged"
ev stall "e['event'] in ('host_lost', 'hang', 'relaunch')" >/dev/null && fail "stall: taken for a fault"
checked stall

# preempted with a 10 s grace: the next launch resumes from the step the ranks stopped after
sup pre --preempt-grace 10
wait_step pre 9
kill -TERM $SUP
wait $SUP
rc=$?
[ $rc = 3 ] || { fail "pre: tessera launch exited $rc after SIGTERM, expected 3"; tail -15 "$TSR_TMP/pre.log" >&2; }
s=$(ev pre "e['event']=='preempted' and e['deadline_met'] and e['local_step']==e['step'] and e['resume_step']==e['step']" step) ||
    { fail "pre: the local tier did not commit the last step within the grace"; tail -n 2 "$TSR_TMP/pre/launch.jsonl" >&2; }
last=$(grep -o '"step": [0-9]*' "$TSR_TMP/pre/metrics.jsonl" | tail -n 1)
[ "$last" = "\"step\": $s" ] || fail "pre: steps trained after step $s ($last)"
# the relaunch inside a Slurm allocation of the same hosts: no --hostfile, the
# hosts of SLURM_JOB_NODELIST (the launcher stays ssh: no Slurm here), and h3
# dead from the start: mpirun cannot reach it, the probe finds it dead, and the
# job goes on over h1 and h2 from their memory (h3's snapshot from its partner copy)
n0=$(wc -l <"$TSR_TMP/pre/launch.jsonl")
vcluster_kill h3
HOSTS= SLURM_JOB_NODELIST="h[1-3]"
export SLURM_JOB_NODELIST
sup pre --preempt-grace 10
unset HOSTS SLURM_JOB_NODELIST
finished pre 1
mkdir -p "$TSR_TMP/pre2" && tail -n +$((n0 + 1)) "$TSR_TMP/pre/launch.jsonl" >"$TSR_TMP/pre2/launch.jsonl"
ev pre2 "e['event']=='host_lost' and e['host']=='h3' and e['probe']" >/dev/null ||
    fail "pre: h3, dead from the start, not found by the probe"
ev pre2 "e['event']=='launch' and e['np']==4" >/dev/null || fail "pre: no launch on the 4 ranks of h1 and h2"
for h in 1 2; do
    ev pre2 "e['event']=='rank_up' and e['peer'].startswith('$VC_NET.$h:')" >/dev/null ||
        fail "pre: no rank of the relaunch from SLURM_JOB_NODELIST's h$h ($VC_NET.$h)"
done
grep -q "resumed from .* (the local tier, step $s," "$TSR_TMP/pre.log" || fail "pre: not resumed from step $s"
checked pre
finish "hosts: a host killed (the job restarted on 4 ranks from the other hosts' memory, ${down} s to the next step), a host cut off 20 s (its ranks stopped themselves), a host's ranks and then the supervisor stopped 12 s (stalled, not lost), a preemption with a 10 s grace (resumed from step $s)"
