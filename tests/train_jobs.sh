# train_jobs.sh: sourced by the trainer's tests (after mpi.sh). train NAME NP
# ARGS... runs a 10-step job of the debug model in $TSR_TMP/NAME on the tokens
# in $TSR_TMP/data; compare REF NAME TOL [FROM_STEP] checks NAME's losses and
# gradient norms against REF's (TOL 0: the same doubles, bit for bit).
CFG="$TSR_ROOT/train/configs/debug.toml"
PY=/usr/bin/python3
$PY -c 'import json' 2>/dev/null || { echo "FAIL: /usr/bin/python3 is missing" >&2; exit 1; }
# short steps: the debug model at sequence 32
COMMON="--training.seq_len=32 --metrics.log_freq=1 --lr_scheduler.warmup_steps=2"

# train NAME NP ARGS...: a 10-step job in $TSR_TMP/NAME
train() {
    name=$1 np=$2; shift 2
    run_np "$np" "$T" train --config "$CFG" $COMMON --training.steps=10 --job.dump_folder="$TSR_TMP/$name" \
        --training.dataset=tokens --training.dataset_path="$TSR_TMP/data" "$@" >"$TSR_TMP/$name.log" 2>&1 ||
        { fail "$name: exit $?"; tail -5 "$TSR_TMP/$name.log" >&2; }
}

# compare REF NAME TOL [FROM_STEP]: the losses and gradient norms of NAME against
# REF's (TOL 0: the same doubles, bit for bit)
compare() {
    $PY - "$TSR_TMP/$1/metrics.jsonl" "$TSR_TMP/$2/metrics.jsonl" "$3" "${4:-1}" <<'EOF' || fail "$2: losses or gradient norms differ from $1"
import json, sys
def values(p, key):
    d = {}
    for line in open(p):
        o = json.loads(line)
        d[o["step"]] = o[key]   # a resumed run appends: the last value wins
    return d
tol, first = float(sys.argv[3]), int(sys.argv[4])
ok = True
for key in ("loss", "grad_norm"):
    a, b = values(sys.argv[1], key), values(sys.argv[2], key)
    steps = [s for s in sorted(a) if s >= first]
    assert steps and all(s in b for s in steps), "steps missing: %s vs %s" % (sorted(a), sorted(b))
    if tol == 0:
        bad = [(s, a[s].hex(), b[s].hex()) for s in steps if a[s] != b[s]]
        print("%s: %d steps, %s bitwise equal%s" % (sys.argv[2], len(steps), key, "" if not bad else ": NOT at %s" % bad))
        ok = ok and not bad
        continue
    worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in steps)
    print("%s: %d steps, %s: worst relative difference %.3g (tolerance %g)" % (sys.argv[2], len(steps), key, worst, tol))
    ok = ok and worst <= tol
sys.exit(0 if ok else 1)
EOF
}

