# launch.sh: sourced by the tests of tessera launch, after common.sh or mpi.sh:
# PY (the system's python3, with json), CFG (the debug model's config) and a
# token file of 1M synthetic tokens at TSR_TMP/data for the jobs; each test
# defines sup (its supervisor in the background, pid in SUP). DIR is a run's
# folder under TSR_TMP; its supervisor's log is TSR_TMP/DIR.log.
CFG="$TSR_ROOT/train/configs/debug.toml"
PY=/usr/bin/python3
$PY -c 'import json' 2>/dev/null || { echo "FAIL: /usr/bin/python3 is missing" >&2; exit 1; }
"$T" data prep --out "$TSR_TMP/data" --synthetic 1M >/dev/null || fail "data prep"
# JOB: 24 steps of the debug model at sequence 32, a checkpoint every 4 steps (a
# test may define its own); FAST: the supervisor's backoff and grace, short
JOB="--config $CFG --training.seq_len=32 --metrics.log_freq=1 --lr_scheduler.warmup_steps=2 --training.steps=24 \
--training.global_batch_size=8 --training.local_batch_size=2 --checkpoint.enable --checkpoint.interval=4 --training.dataset=tokens \
--training.dataset_path=$TSR_TMP/data"
FAST="--backoff 0.2 --grace 2"

# ev DIR EXPR [FIELD]: the events e of DIR/launch.jsonl for which EXPR holds;
# prints FIELD of the last one (or the count); exit 1 when there is none
cat >"$TSR_TMP/ev.py" <<'EOF'
import json, sys
es = [json.loads(l) for l in open(sys.argv[1])]
m = [e for e in es if eval(sys.argv[2], {"e": e})]
if m: print(m[-1][sys.argv[3]] if len(sys.argv) > 3 else len(m))
sys.exit(0 if m else 1)
EOF
ev() { $PY "$TSR_TMP/ev.py" "$TSR_TMP/$1/launch.jsonl" "$2" $3; }

# wait_for DIR EXPR: until an event of DIR matches (60 s at most, while the supervisor runs)
wait_for() {
    i=0
    until ev "$1" "$2" >/dev/null 2>&1; do
        sleep 0.05; i=$((i + 1))
        [ $i -lt 1200 ] && kill -0 $SUP 2>/dev/null || { fail "$1: no event $2"; tail -n 5 "$TSR_TMP/$1.log" >&2; return 1; }
    done
}
# wait_step DIR STEP: until the metrics of DIR hold STEP (the same limits)
wait_step() {
    i=0
    until grep -q "\"step\": $2," "$TSR_TMP/$1/metrics.jsonl" 2>/dev/null; do
        sleep 0.05; i=$((i + 1))
        [ $i -lt 1200 ] && kill -0 $SUP 2>/dev/null || { fail "$1: step $2 not reached"; tail -n 5 "$TSR_TMP/$1.log" >&2; return 1; }
    done
}
# rank_pid DIR LAUNCH RANK: the pid of a rank, from its first heartbeat
rank_pid() {
    wait_for "$1" "e['event']=='rank_up' and e['launch']==$2 and e['rank']==$3" &&
        ev "$1" "e['event']=='rank_up' and e['launch']==$2 and e['rank']==$3" pid
}
# finished DIR RESTARTS: the supervisor of DIR exited 0 after RESTARTS restarts
finished() {
    wait $SUP || { fail "$1: tessera launch exited $?"; tail -15 "$TSR_TMP/$1.log" >&2; }
    ev "$1" "e['event']=='finish' and e['status']=='ok' and e['restarts']==$2" >/dev/null ||
        { fail "$1: no finish after $2 restart(s)"; tail -3 "$TSR_TMP/$1/launch.jsonl" >&2; }
}
# compare REF NAME TOL: losses and gradient norms (TOL 0: the same doubles),
# the data position of every step (the same), every sample trained once
# (tests/samples_check.py), and with TOL 0 the final checkpoints' tensors too
compare() {
    $PY - "$TSR_TMP/$1/metrics.jsonl" "$TSR_TMP/$2/metrics.jsonl" "$3" <<'EOF' || fail "$2: losses differ from $1"
import json, sys
def values(p, key):
    d = {}
    for line in open(p):
        o = json.loads(line)
        d[o["step"]] = o[key]   # a resumed run appends: the last value wins
    return d
tol = float(sys.argv[3])
for key in ("loss", "grad_norm"):
    a, b = values(sys.argv[1], key), values(sys.argv[2], key)
    assert sorted(a) == sorted(b) == list(range(1, 25)), (sorted(a), sorted(b))
    worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in a)
    assert worst <= tol, "%s: worst relative difference %g" % (key, worst)
a, b = values(sys.argv[1], "first_sample"), values(sys.argv[2], "first_sample")
assert a == b, "the data positions differ: %s" % [(s, a[s], b[s]) for s in a if a[s] != b[s]]
EOF
    # every sample trained once, but for the windows the rollbacks skipped
    # (a run without the supervisor has no event log: no rollbacks)
    events=$TSR_TMP/$2/launch.jsonl
    [ -f "$events" ] || events=/dev/null
    $PY "$TSR_ROOT/tests/samples_check.py" "$TSR_TMP/$2/metrics.jsonl" "$events" 24 >/dev/null ||
        fail "$2: samples lost or trained twice"
    if [ "$3" = 0 ]; then
        # every tensor and blob the same, but the config (it names the job's folder)
        "$T" ckpt diff "$TSR_TMP/$1/checkpoint/step-00000024" "$TSR_TMP/$2/checkpoint/step-00000024" --json \
            >"$TSR_TMP/diff.json"
        $PY -c 'import json, sys; d = json.load(open(sys.argv[1]))["differences"]
sys.exit(0 if d == ["blob train.config (rank -1): contents differ"] else 1)' "$TSR_TMP/diff.json" ||
            { fail "$2: the final checkpoint differs from $1's"; cat "$TSR_TMP/diff.json" >&2; }
    fi
}

