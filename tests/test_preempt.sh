#!/bin/sh
# tsr-timeout: 300
# tessera launch --preempt-grace: a preempted supervisor (SIGTERM, or SIGUSR1
# as Slurm sends before the end of an allocation) stops the job after a step
# the ranks agree on, its state committed to the local tier and, where the
# last measured save fits the grace, to the durable tier; it exits 3 saying
# the deadline was met and which step the next launch resumes from, and the
# next launch resumes from exactly that step (the local tier's snapshot, or
# the durable checkpoint with the local tier off) and ends with the losses,
# data positions and final checkpoint of an uninterrupted run, every sample
# trained once. A second signal during the grace ends the job at once.
. "$TSR_ROOT/tests/mpi.sh"
. "$TSR_ROOT/tests/launch.sh"
sup() {
    dir=$1 np=$2; shift 2
    "$T" launch -np "$np" $FAST "$@" -- train $JOB ${TRAIN_EXTRA:-} --job.dump_folder="$TSR_TMP/$dir" >>"$TSR_TMP/$dir.log" 2>&1 &
    SUP=$!
}
# preempted DIR SIGNAL: the supervisor of DIR preempted once step 9 is trained;
# it must exit 3 after its report; S: the step the ranks stopped after
preempted() {
    S=
    wait_step "$1" 9 || return 1
    kill -"$2" $SUP
    wait $SUP
    rc=$?
    [ $rc = 3 ] || { fail "$1: tessera launch exited $rc after SIG$2, expected 3"; tail -15 "$TSR_TMP/$1.log" >&2; return 1; }
    S=$(ev "$1" "e['event']=='preempted'" step)
}

run_np 2 "$T" train $JOB --job.dump_folder="$TSR_TMP/ref" >"$TSR_TMP/ref.log" 2>&1 || fail "ref: exit $?"
# rank 0 works 60 ms longer a step (TSR_FAULT_SLOW; the values do not change),
# so that the signal comes well before the 24th step on a fast machine too
export TSR_FAULT_SLOW=0:60

# SIGTERM with the local tier on (a snapshot every 2 steps): the step the ranks
# stop at is committed to both tiers (the last save, measured, fits 10 s), and
# the next launch takes it from the local tier
TRAIN_EXTRA="--checkpoint.local_interval=2"
sup term 2 --preempt-grace 10
preempted term TERM
s=$S
[ -n "$s" ] && [ "$s" -ge 9 ] && [ "$s" -lt 24 ] || fail "term: stopped after step '$s'"
ev term "e['event']=='preempt' and e['signal']=='SIGTERM' and e['grace_s']==10" >/dev/null || fail "term: no preempt event"
ev term "e['event']=='preempted' and e['deadline_met'] and e['local_step']==$s and e['durable_step']==$s and \
e['resume_step']==$s and e['resume_tier']=='local' and e['seconds']<=10" >/dev/null ||
    { fail "term: not committed to both tiers within the grace"; tail -n 2 "$TSR_TMP/term/launch.jsonl" >&2; }
grep -q "preemption: the ranks stopped after step $s; the local tier committed it, the durable tier committed it, in .* (deadline met)" "$TSR_TMP/term.log" &&
    grep -q "the next launch resumes from step $s (the local tier" "$TSR_TMP/term.log" ||
    { fail "term: the report"; tail -5 "$TSR_TMP/term.log" >&2; }
[ "$(grep -c '"step": ' "$TSR_TMP/term/metrics.jsonl")" = "$s" ] || fail "term: steps trained after step $s"
expect 0 "term: the durable checkpoint of step $s verifies" "$T" ckpt verify "$TSR_TMP/term/checkpoint/step-$(printf %08d "$s")"
sup term 2 --preempt-grace 10
finished term 0
grep -q "resumed from .* (the local tier, step $s," "$TSR_TMP/term.log" || fail "term: not resumed from the local tier's step $s"
compare ref term 0

# SIGUSR1 with the local tier off: the durable tier alone, resumed from it
TRAIN_EXTRA=""
sup usr1 2 --preempt-grace 10
preempted usr1 USR1
s=$S
[ -n "$s" ] && [ "$s" -ge 9 ] && [ "$s" -lt 24 ] || fail "usr1: stopped after step '$s'"
ev usr1 "e['event']=='preempted' and e['signal']=='SIGUSR1' and e['deadline_met'] and e['local_step']==-1 and \
e['durable_step']==$s and e['resume_step']==$s and e['resume_tier']=='durable'" >/dev/null ||
    { fail "usr1: not committed to the durable tier"; tail -n 2 "$TSR_TMP/usr1/launch.jsonl" >&2; }
sup usr1 2 --preempt-grace 10
finished usr1 0
grep -q "resumed from .*step-$(printf %08d "$s") (the durable tier, step $s," "$TSR_TMP/usr1.log" ||
    fail "usr1: not resumed from the durable step $s"
compare ref usr1 0

# a second signal during the grace ends the job at once (the ranks are
# stopped, SIGSTOP, so that the grace cannot end otherwise)
sup twice 2 --preempt-grace 60
wait_step twice 5
for k in 0 1; do kill -STOP "$(rank_pid twice 1 $k)"; done
kill -TERM $SUP
wait_for twice "e['event']=='preempt'"
t0=$(date +%s)
kill -TERM $SUP
wait $SUP
rc=$?
[ $rc = 3 ] || fail "twice: exit $rc, expected 3"
[ $(($(date +%s) - t0)) -lt 20 ] || fail "twice: the second signal did not end the job at once"
ev twice "e['event']=='preempted' and not e['deadline_met']" >/dev/null || fail "twice: the deadline reported met"
finish "preemption: SIGTERM and SIGUSR1 stop the job with its state committed within the grace; the next launch resumes from it"
