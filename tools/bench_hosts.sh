#!/bin/sh
# bench_hosts.sh TESSERA OUT [long]: tessera launch over hosts, on the virtual
# cluster of tests/vcluster.sh (3 hosts of 2 ranks reached over ssh; needs
# root): the small model, a snapshot in each host's memory every 5 steps, a
# durable checkpoint every 10, --host-timeout 4 (the default).
#   make bench: a host killed (its link, its processes, its memory) once step 12
#     is done: the seconds from the kill to the next training step, the job
#     relaunched on the other 2 hosts and resumed from their memory and the
#     partner copies, resharded from 6 ranks to 4 (goal: under 10 s).
#   long (make bench-long): 30 minutes with a host killed every 5 minutes and
#     back a minute later (readmitted at the next restart), a snapshot in
#     memory every step: the effective training time, the finish event's
#     train_s over its wall_s (goal: 95%).
set -e
T=$(realpath "$1")
OUT=$(realpath -m "$2")
MODE=${3:-}
PY=python3
TSR_TMP="$OUT/hosts${MODE:+-$MODE}"
. tools/bench_cluster.sh
d="$TSR_TMP/run"
steps=100000 every=""
# long: a snapshot in memory every step (the steps take seconds here: at one
# every 5, a fault redoes 2.5 steps on average, over 5% of 5 minutes alone)
[ -n "$MODE" ] && every=--checkpoint.local_interval=1 || steps=40
JOB="$JOB_CLUSTER --training.steps=$steps --job.dump_folder=$d $every"
$T launch -np 6 --hostfile "$VC_HOSTFILE" --listen "$VC_HEAD" --min-ranks 4 --max-restarts 100 -- train $JOB >"$d.log" 2>&1 &
sup=$!
wait_step() { # STEP
    until grep -q "\"step\": $1," "$d/metrics.jsonl" 2>/dev/null; do
        kill -0 $sup 2>/dev/null || { echo "bench hosts: the job ended before step $1 ($d.log)" >&2; exit 1; }
        sleep 0.05
    done
}
if [ -z "$MODE" ]; then
    wait_step 12
    t_kill=$(date +%s.%N)
    vcluster_kill h3
    n=0
    until grep -q '"event": "recovered"' "$d/launch.jsonl" 2>/dev/null; do
        n=$((n + 1))
        [ $n -lt 1200 ] && kill -0 $sup 2>/dev/null || { echo "bench hosts: no recovery after the kill ($d.log)" >&2; exit 1; }
        sleep 0.05
    done
    kill -TERM $sup
    wait $sup || true
    $PY - "$d/launch.jsonl" "$d.log" "$t_kill" <<'PYEOF'
import json, re, sys
es = [json.loads(l) for l in open(sys.argv[1])]
lost = [e for e in es if e["event"] == "host_lost"][0]
rec = [e for e in es if e["event"] == "recovered"][0]
launch = [e for e in es if e["event"] == "launch" and e["launch"] == rec["launch"]][0]
log = open(sys.argv[2]).read()
res = re.findall(r"^resumed from \S+ \(the (\w+) tier, step (\d+), saved as (\S+), loaded as (\S+)\)", log, re.M)
t = float(sys.argv[3])
tier, step, saved, loaded = res[-1] if res else ("?", "?", "?", "?")
total = rec["time"] - t
print("host killed, small model on 3 hosts of 2 ranks: lost found %.2f s after the kill (--host-timeout 4), the job "
      "trained again %.2f s after that on %d ranks, resumed from the %s tier's step %s (saved as %s, loaded as %s): "
      "%.2f s from the kill to the next step (goal: under 10 s, from memory, resharded)  %s"
      % (lost["time"] - t, rec["time"] - lost["time"], launch["np"], tier, step, saved, loaded, total,
         "ok" if total < 10 and tier == "local" and saved != loaded else "MISSED"))
PYEOF
    exit 0
fi
# long: a host fault every 5 minutes for 30 minutes, each host back a minute later
t0=$(date +%s)
k=0
for h in h2 h3 h1 h2 h3; do
    sleep $((t0 + 300 * (k + 1) - $(date +%s)))
    kill -0 $sup 2>/dev/null || { echo "bench hosts: the job ended early ($d.log)" >&2; exit 1; }
    vcluster_kill $h
    sleep 60
    vcluster_revive $h
    k=$((k + 1))
done
sleep $((t0 + 1800 - $(date +%s)))
kill -TERM $sup
wait $sup || true
$PY - "$d/launch.jsonl" <<'PYEOF'
import json, sys
es = [json.loads(l) for l in open(sys.argv[1])]
f = [e for e in es if e["event"] == "finish"][-1]
lost = len([e for e in es if e["event"] == "host_lost"])
back = len([e for e in es if e["event"] == "host_back"])
stalled = len([e for e in es if e["event"] == "host_stalled"])
eff = f["train_s"] / f["wall_s"]
print("host faults, small model on 3 hosts of 2 ranks, a snapshot in memory every step, a host killed every 5 minutes for %.0f s: %d host(s) lost, %d "
      "back, %d stall(s) of a host that answered (not lost), %d restart(s), %.1f s lost to failures: effective "
      "training time %.1f%% (goal: at least 95%%)  %s"
      % (f["wall_s"], lost, back, stalled, f["restarts"], f["lost_s"], 100 * eff, "ok" if eff >= 0.95 else "MISSED"))
PYEOF
