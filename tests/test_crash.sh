#!/bin/sh
# test_crash.sh: crash consistency. For 40 s (8 times at least), a 4-rank save is started and, once
# its data files are being written, one rank or all of them are killed with
# SIGKILL after a random delay. Afterwards the previous checkpoint loads and
# verifies, and the interrupted step is not listed as committed (or, when the
# commit finished before the kill, it verifies and loads exactly).
. "$TSR_ROOT/tests/mpi.sh"
# runs for 40 s, at least 8 (60 runs under make test-long, TSR_LONG; or TSR_CRASH_RUNS)
RUNS=${TSR_CRASH_RUNS:-$([ -n "${TSR_LONG:-}" ] && echo 60 || echo 0)}
BUDGET=40 FLOOR=8
t0=$(date +%s)
more() { # whether to run another kill
    if [ "$RUNS" -gt 0 ]; then [ $i -lt "$RUNS" ]; else [ $i -lt $FLOOR ] || [ $(( $(date +%s) - t0 )) -lt $BUDGET ]; fi
}
rand() { echo $(( $(od -An -N2 -tu2 /dev/urandom) % $1 )); }
# a process that has not exited (a zombie nobody reaps counts as gone)
alive() { st=$(ps -o stat= -p "$1" 2>/dev/null); [ -n "$st" ] && [ "${st#Z}" = "$st" ]; }

run_np 4 $T ckpt synth root/step-00000001 --layout dp_shard=2,tp=2 --bytes 32M --frame-bytes 256K >first.log 2>&1 \
    || { cat first.log >&2; fail "the first save"; exit 1; }
interrupted=0 committed=0
i=0
while more; do
    i=$((i + 1))
    dir=$(printf 'root/step-%08d' $((100 + i)))
    # every write takes 20 ms longer: the save lasts long enough to be hit
    TSR_FAULT=delay:20000:write mpirun --allow-run-as-root --oversubscribe -np 4 \
        $T ckpt synth "$dir" --layout dp_shard=2,tp=2 --bytes 32M --frame-bytes 256K >run.log 2>&1 &
    mp=$!
    (sleep 120; kill -9 $mp) >/dev/null 2>&1 & watchdog=$!
    # the rank processes, found before the save starts (pgrep can take a while)
    n=0 ranks=""
    while [ $(echo "$ranks" | wc -w) -lt 4 ] && kill -0 $mp 2>/dev/null && [ $n -lt 600 ]; do
        sleep 0.05; n=$((n + 1)); ranks=$(pgrep -P $mp)
    done
    n=0
    while [ ! -e "$dir/data-00000.tsd" ] && kill -0 $mp 2>/dev/null && [ $n -lt 3000 ]; do sleep 0.005; n=$((n + 1)); done
    sleep "0.$(printf "%03d" "$(rand 400)")"
    if [ $((i % 3)) = 0 ]; then victims=$ranks; what="all ranks"
    else victims=$(echo "$ranks" | sed -n "$(( $(rand 4) + 1 ))p"); what="one rank"; fi
    [ -n "$victims" ] && kill -9 $victims 2>/dev/null
    wait $mp 2>/dev/null
    pkill -P $watchdog sleep 2>/dev/null; kill $watchdog 2>/dev/null
    # no rank of the job outlives it for long
    n=0
    for p in $ranks; do
        while alive $p && [ $n -lt 100 ]; do sleep 0.1; n=$((n + 1)); done
        alive $p && fail "run $i: rank process $p survived the job by 10 s"
    done
    if [ -e "$dir/MANIFEST" ]; then
        committed=$((committed + 1))
        $T ckpt verify "$dir" >/dev/null 2>&1 || fail "run $i: $dir committed before the kill but does not verify"
        $T ckpt check "$dir" >/dev/null 2>&1 || fail "run $i: $dir committed before the kill but does not load"
    else
        interrupted=$((interrupted + 1))
        $T ckpt ls root >ls.txt 2>&1
        grep -q "^$((100 + i)) .*uncommitted" ls.txt || fail "run $i ($what): $dir not listed as uncommitted: $(grep "^$((100 + i)) " ls.txt)"
    fi
    $T ckpt verify root/step-00000001 >/dev/null 2>&1 || fail "run $i ($what): the previous checkpoint no longer verifies"
    $T ckpt check root/step-00000001 >/dev/null 2>&1 || fail "run $i ($what): the previous checkpoint no longer loads"
done
echo "$i kills: $interrupted interrupted a save, $committed came after the commit"
[ $interrupted -ge $((i * 2 / 3)) ] || fail "only $interrupted of $i kills landed during a save"
run_np 2 $T ckpt check root/step-00000001 --layout dp_shard=2 >/dev/null 2>&1 || fail "the previous checkpoint loads on 2 ranks"
finish
