#!/bin/sh
# bench_preempt.sh TESSERA OUT: preemption with a deadline (make bench), on the
# virtual cluster of tests/vcluster.sh (3 hosts of 2 ranks, reached over ssh;
# needs root). The small model on 6 ranks under tessera launch --hostfile
# --preempt-grace 5, a snapshot in each host's memory every 5 steps and a durable
# checkpoint every 10: SIGTERM to the supervisor once step 12 is done; from its
# "preempted" event, the seconds from the signal to the local tier's commit and
# to the durable tier's, against the 5 s grace (goal: the local tier within it;
# the durable tier too, its last save measured as fitting), and the time to the
# job's end; then the next launch resumes from the step reported.
set -e
T=$(realpath "$1")
OUT=$(realpath -m "$2")
PY=python3
TSR_TMP="$OUT/preempt-cluster"
. tools/bench_cluster.sh
d="$OUT/preempt"
rm -rf "$d"
mkdir -p "$d"
JOB="$JOB_CLUSTER --training.steps=40 --job.dump_folder=$d"
HOSTS="-np 6 --hostfile $VC_HOSTFILE --listen $VC_HEAD"
$T launch $HOSTS --preempt-grace 5 -- train $JOB >"$d.log" 2>&1 &
sup=$!
until grep -q '"step": 12,' "$d/metrics.jsonl" 2>/dev/null; do
    kill -0 $sup 2>/dev/null || { echo "bench preempt: the job ended before step 12 ($d.log)" >&2; exit 1; }
    sleep 0.05
done
kill -TERM $sup
rc=0
wait $sup || rc=$?
[ $rc = 3 ] || { echo "bench preempt: tessera launch exited $rc, not 3 ($d.log)" >&2; exit 1; }
$PY - "$d/launch.jsonl" "$d.log" <<'EOF'
import json, re, sys
e = [x for x in map(json.loads, open(sys.argv[1])) if x["event"] == "preempted"][-1]
g = e["grace_s"]
local_ok = e["step"] >= 0 and e["local_step"] == e["step"] and e["local_s"] <= g
durable = e["step"] >= 0 and e["durable_step"] == e["step"]
print("preemption, small model on 3 hosts of 2 ranks: stopped after step %d; the local tier committed it %.2f s after "
      "the command, the durable tier %s; the job ended %.2f s after the signal (grace %.0f s; goal: the local tier "
      "within it)  %s" % (e["step"], e["local_s"], "%.2f s after it" % e["durable_s"] if durable else "did not",
                          e["seconds"], g, "ok" if local_ok and e["deadline_met"] else "MISSED"))
# the durable tier: committed within the grace where its measured save fitted
# what was left of it (the job's line says when it did not)
m = re.findall(r"^preempted after step \d+: .*the durable tier not saved \(its last save took ([0-9.]+) s",
               open(sys.argv[2]).read(), re.M)
if durable:
    print("preemption: the durable tier committed within the grace too (goal, when its measured save fits)  %s"
          % ("ok" if e["durable_s"] <= g else "MISSED"))
elif e["step"] < 0:
    print("preemption: not every rank reported what it committed within the grace  MISSED")
else:
    print("preemption: the durable tier not saved: its last save took %s s, more than the grace left after the step "
          "with the 1.5x margin (goal: saved when it fits)  %s" % (m[-1] if m else "?", "ok" if m else "MISSED"))
EOF
step=$(sed -n 's/.*"event": "preempted".*"resume_step": \([0-9]*\).*/\1/p' "$d/launch.jsonl")
$T launch $HOSTS -- train $JOB >>"$d.log" 2>&1 || { echo "bench preempt: the next launch failed ($d.log)" >&2; exit 1; }
grep -q "resumed from .* (the local tier, step $step," "$d.log" &&
    echo "preemption: the next launch resumed from step $step, in the local tier" ||
    echo "preemption: the next launch did not resume from step $step  MISSED"
