#!/bin/sh
# test_plot.sh: tessera plot: a metrics file with a resumed (repeated) step range,
# a garbage line and an incomplete object gives an unbroken curve of the last value
# per step, drawn to a real PNG; and the error cases: bad usage (2), a missing
# file, no data, an unwritable output, gnuplot failing or missing (1). A run with
# the event log of tessera launch beside it (a rank lost, a NaN rolled back, a
# node dropped after a launch that failed at once, a torn line) is marked at the
# steps the job resumed from: in --marks, in the gnuplot script (caught by a
# gnuplot that keeps a copy) and in the picture.
. "$TSR_ROOT/tests/common.sh"
command -v gnuplot >/dev/null 2>&1 || { echo "FAIL: gnuplot is missing: run make deps" >&2; exit 1; }
cd "${TSR_TMP:-.}" || exit 1
is_png() { # the 8-byte PNG signature: 89 50 4e 47 0d 0a 1a 0a
    [ "$(od -An -tx1 -N8 "$1" 2>/dev/null | tr -d ' \n')" = "89504e470d0a1a0a" ]
}

# A run of 30 steps, a line of garbage (line 31), then a run resumed from step 20
# that logs steps 21..40 again with other values, and an object without a loss.
mkdir -p run
: >run/metrics.jsonl
s=1
while [ $s -le 30 ]; do
    echo "{\"step\": $s, \"loss\": $(awk "BEGIN{print 10 - $s * 0.2}"), \"grad_norm\": 1.2, \"lr\": 0.0008, \"tokens_per_s\": 5123.4, \"ckpt_blocked_s\": 0.001}" >>run/metrics.jsonl
    s=$((s + 1))
done
echo 'Traceback (most recent call last): not JSON' >>run/metrics.jsonl
s=21
while [ $s -le 40 ]; do
    echo "{\"step\":$s,\"loss\":$(awk "BEGIN{print 5 - ($s - 20) * 0.1}"),\"lr\":1e-3}" >>run/metrics.jsonl
    s=$((s + 1))
done
echo '{"step": 41, "grad_norm": 0.5}' >>run/metrics.jsonl
echo '' >>run/metrics.jsonl

# the table: one row per step, sorted, the resumed run's values win
expect 0 "plot --table" $T plot run/metrics.jsonl --table
rows=$(grep -vc '^#' out.txt)
[ "$rows" = 40 ] || fail "--table: 40 steps expected, got $rows"
awk '!/^#/ { if (NR > 2 && $1 != prev + 1) { print "gap or repeat at step " $1; exit 1 } prev = $1 }' out.txt ||
    fail "--table: steps are not 1..40 in order"
grep -q '^20 6$' out.txt || fail "--table: step 20 keeps the first run's 6: $(grep '^20 ' out.txt)"
grep -q '^21 4.9$' out.txt || fail "--table: step 21 has the resumed run's 4.9: $(grep '^21 ' out.txt)"
grep -q '^30 4$' out.txt || fail "--table: step 30 has the resumed run's 4: $(grep '^30 ' out.txt)"
grep -q '^40 3$' out.txt || fail "--table: step 40 is 3: $(grep '^40 ' out.txt)"
grep -q 'metrics.jsonl:31: skipped' err.txt || fail "the garbage line is named: $(cat err.txt)"
grep -q 'metrics.jsonl:52: skipped: no "loss"' err.txt || fail "the object without a loss is named: $(cat err.txt)"
[ "$(grep -c skipped err.txt)" = 2 ] || fail "exactly two lines skipped, the blank one silently: $(cat err.txt)"

# the picture: a PNG next to the metrics by default, or where -o says
expect 0 "plot, default output" $T plot run/metrics.jsonl
is_png run/loss.png || fail "run/loss.png is not a PNG"
grep -q 'wrote run/loss.png: 40 points, steps 1 to 40' out.txt || fail "summary line: $(cat out.txt)"
grep -q 'metrics.jsonl:31:' err.txt || fail "plot warns about line 31 too"
expect 0 "plot -o with a title" $T plot run/metrics.jsonl -o "it's a plot.png" --title "run 'A' (resumed)_x"
is_png "it's a plot.png" || fail "-o with a quote in the name: no PNG"
[ "$(wc -c <"it's a plot.png")" -gt 2000 ] || fail "the PNG is suspiciously small"
expect 0 "plot --output=" $T plot --output=two.png run/metrics.jsonl
is_png two.png || fail "--output=two.png is not a PNG"
echo '{"step": 7, "loss": 2.5}' >one.jsonl
expect 0 "plot a single point" $T plot one.jsonl -o one.png
is_png one.png || fail "a single point: no PNG"

# The fault story. A run of 40 steps under tessera launch: rank 3 lost at step 12,
# resumed from 10; a NaN at step 25, rolled back to the checkpoint of step 20; ranks
# 2 and 3 lost at step 33, node 1 dropped, a launch that fails before its first
# step (rank 0 lost), then resumed from 31. The metrics repeat the steps redone.
mkdir -p fault
metrics_range() { # FROM TO OFFSET
    s=$1
    while [ $s -le $2 ]; do
        echo "{\"step\": $s, \"loss\": $(awk "BEGIN{print 8 - $s * 0.1 + $3}")}" >>fault/metrics.jsonl
        s=$((s + 1))
    done
}
: >fault/metrics.jsonl
metrics_range 1 12 0
metrics_range 11 24 0.3
metrics_range 21 33 0.5
metrics_range 32 40 0.7
ev() { echo "{\"time\": $1, \"event\": \"$2\", \"launch\": $3$4}" >>fault/launch.jsonl; } # TIME EVENT LAUNCH FIELDS
: >fault/launch.jsonl
ev 1 start 0 ', "np": 4, "nodes": 2, "min_ranks": 2'
ev 2 launch 1 ', "np": 4, "nodes": 2, "extra_args": ""'
ev 3 rank_up 1 ', "rank": 3, "pid": 100, "node": 1'
ev 4 rank_exit 1 ', "rank": 3, "pid": 100, "node": 1, "step": 12, "phase": "step"'
ev 5 killed 1 ', "cause": "rank_exit", "why": "rank 3 left", "seconds": 0.1'
ev 6 relaunch 1 ', "restart": 1, "backoff_s": 0.5, "np": 4'
ev 7 launch 2 ', "np": 4, "nodes": 2, "extra_args": ""'
ev 8 recovered 2 ', "step": 11, "downtime_s": 2.0, "redone_steps": 2, "cost_s": 2.5'
ev 9 straggler 2 ', "rank": 1, "pid": 101, "node": 0, "step": 15, "compute_s": 0.5, "median_s": 0.1'
echo '{"time": 10, "event": "nan", "launch": 2, "rank": 0, "step": 25, "lo' >>fault/launch.jsonl # torn: line 10
ev 11 nan 2 ', "rank": 0, "step": 25, "loss": "nan", "grad_norm": "1.5"'
ev 12 killed 2 ', "cause": "nan", "why": "step 25: loss nan", "seconds": 0.1'
ev 13 rollback 2 ', "bad_step": 25, "checkpoint_step": 20, "skip_after": 20, "skip_steps": 5'
ev 14 relaunch 2 ', "restart": 2, "backoff_s": 0.5, "np": 4'
ev 15 launch 3 ', "np": 4, "nodes": 2, "extra_args": "--training.skip_data_after_step=20"'
ev 16 recovered 3 ', "step": 21, "downtime_s": 2.0, "redone_steps": 4, "cost_s": 2.5'
ev 17 rank_exit 3 ', "rank": 2, "pid": 102, "node": 1, "step": 33, "phase": "step"'
ev 18 rank_exit 3 ', "rank": 3, "pid": 103, "node": 1, "step": 33, "phase": "step"'
ev 19 killed 3 ', "cause": "rank_exit", "why": "rank 2 left", "seconds": 0.1'
ev 20 node_dropped 3 ', "node": 1, "failures": 2, "np": 2'
ev 21 node_memory_lost 3 ', "node": 1, "folder": "/dev/shm/x/node-1"'
ev 22 relaunch 3 ', "restart": 3, "backoff_s": 0.5, "np": 2'
ev 23 launch 4 ', "np": 2, "nodes": 1, "extra_args": ""'
ev 24 rank_exit 4 ', "rank": 0, "pid": 104, "node": 0, "step": 0, "phase": "start"'
ev 25 killed 4 ', "cause": "rank_exit", "why": "rank 0 left", "seconds": 0.1'
ev 26 relaunch 4 ', "restart": 4, "backoff_s": 1.0, "np": 2'
ev 27 launch 5 ', "np": 2, "nodes": 1, "extra_args": ""'
ev 28 recovered 5 ', "step": 32, "downtime_s": 3.0, "redone_steps": 2, "cost_s": 3.5'
ev 29 finish 5 ', "status": "ok", "restarts": 4'
ev 30 recovered 5 ', "step": "late"'
ev 31 rollback 5 ', "bad_step": 40'
printf '%s\n' '# step kind label' '10 restart restart (rank 3 lost)' \
    '20 rollback rollback to step 20 (NaN at step 25)' '31 node_dropped node 1 dropped (rank 2 lost)' \
    '31 restart restart (rank 0 lost)' >marks.want

expect 0 "plot --marks: launch.jsonl beside the metrics" $T plot fault/metrics.jsonl --marks
cmp -s marks.want out.txt || fail "--marks: expected $(cat marks.want), got $(cat out.txt)"
grep -q 'fault/launch.jsonl:10: skipped: not a JSON object' err.txt ||
    fail "the torn event line is named: $(cat err.txt)"
grep -q 'fault/launch.jsonl:30: skipped: "recovered": "step" is not a whole number >= 0' err.txt ||
    fail "an event without its step is named: $(cat err.txt)"
grep -q 'fault/launch.jsonl:31: skipped: "rollback" without "checkpoint_step"' err.txt ||
    fail "an event without its checkpoint step is named: $(cat err.txt)"
[ "$(grep -c skipped err.txt)" = 3 ] || fail "exactly three event lines skipped: $(cat err.txt)"
cp fault/launch.jsonl events.jsonl
expect 0 "plot --marks --events=FILE" $T plot fault/metrics.jsonl --marks --events=events.jsonl
cmp -s marks.want out.txt || fail "--events=FILE: expected $(cat marks.want), got $(cat out.txt)"
expect 0 "plot --marks --no-events" $T plot fault/metrics.jsonl --marks --no-events
[ "$(cat out.txt)" = "# step kind label" ] || fail "--no-events: no marks expected, got $(cat out.txt)"
# a relaunch that never trained (the supervisor gave up) is marked where it failed
printf '%s\n' '{"event": "rank_exit", "rank": 1, "step": 7}' '{"event": "killed", "cause": "rank_exit"}' \
    '{"event": "relaunch", "restart": 1}' '{"event": "finish", "status": "failed"}' >gaveup.jsonl
expect 0 "plot --marks, a relaunch that never trained" $T plot fault/metrics.jsonl --marks --events gaveup.jsonl
[ "$(tail -n +2 out.txt)" = "7 restart restart (rank 1 lost)" ] ||
    fail "a relaunch that never trained: $(cat out.txt)"

# the picture: a gnuplot that keeps a copy of its script shows what is drawn
mkdir -p spybin
printf '#!/bin/sh\ncp "$1" "%s/script.gp"\nexec "%s" "$@"\n' "$PWD" "$(command -v gnuplot)" >spybin/gnuplot
chmod +x spybin/gnuplot
expect 0 "plot with marks" env PATH="$PWD/spybin:$PATH" $T plot fault/metrics.jsonl -o marked.png
is_png marked.png || fail "with marks: no PNG"
grep -q 'wrote marked.png: 40 points, steps 1 to 40, .*; 4 mark(s) from fault/launch.jsonl' out.txt ||
    fail "the summary counts the marks: $(cat out.txt)"
for m in "10:restart (rank 3 lost)" "20:rollback to step 20 (NaN at step 25)" "31:node 1 dropped (rank 2 lost)" \
    "31:restart (rank 0 lost)"; do
    step=${m%%:*} label=${m#*:}
    grep -q "^set arrow from first $step, graph 0 to first $step, graph 1 nohead" script.gp ||
        fail "no line at step $step in the gnuplot script"
    grep -qF "set label '$label' at first $step, graph" script.gp || fail "no label '$label' at step $step"
done
[ "$(grep -c '^set arrow' script.gp)" = 3 ] ||
    fail "3 lines expected (one a step): $(grep '^set arrow' script.gp)"
[ "$(grep -c '^set label' script.gp)" = 4 ] || fail "4 labels expected: $(grep '^set label' script.gp)"
expect 0 "plot without marks" env PATH="$PWD/spybin:$PATH" $T plot fault/metrics.jsonl -o plain.png --no-events
is_png plain.png || fail "without marks: no PNG"
grep -q 'set arrow\|set label' script.gp && fail "--no-events: the script has marks"
cmp -s marked.png plain.png && fail "the marks change nothing in the picture"
expect 1 "plot --events, a missing file" $T plot fault/metrics.jsonl --events no-such-events.jsonl
grep -q "no-such-events.jsonl" err.txt || fail "the missing event log is named: $(cat err.txt)"
expect 2 "plot --events and --no-events" $T plot fault/metrics.jsonl --events events.jsonl --no-events
expect 2 "plot --events without a value" $T plot fault/metrics.jsonl --events

# usage
expect 0 "plot --help" $T plot --help
grep -q "usage: tessera plot" out.txt || fail "--help prints the usage"
grep -q -- "--events FILE" out.txt || fail "--help documents --events"
expect 2 "plot without a file" $T plot
expect 2 "plot with an unknown option" $T plot run/metrics.jsonl --frobnicate
expect 2 "plot with two files" $T plot run/metrics.jsonl one.jsonl
expect 2 "plot -o without a value" $T plot run/metrics.jsonl -o

# failures
expect 1 "plot a missing file" $T plot no-such.jsonl
grep -q "no-such.jsonl" err.txt || fail "the missing file is named: $(cat err.txt)"
printf 'garbage\n{"loss": 1}\n' >bad.jsonl
expect 1 "plot a file without data" $T plot bad.jsonl -o bad.png
grep -q "no data points" err.txt || fail "no data is said: $(cat err.txt)"
[ -e bad.png ] && fail "no image is written without data"
expect 1 "plot into a missing directory" $T plot run/metrics.jsonl -o no-such-dir/x.png
grep -q "no-such-dir/x.png" err.txt || fail "the unwritable output is named: $(cat err.txt)"
mkdir -p fakebin nobin
printf '#!/bin/sh\necho "gnuplot: simulated failure" >&2\nexit 3\n' >fakebin/gnuplot
chmod +x fakebin/gnuplot
expect 1 "gnuplot fails" env PATH="$PWD/fakebin:$PATH" $T plot run/metrics.jsonl -o failed.png
grep -q "gnuplot failed (exit status 3)" err.txt || fail "a gnuplot failure is said: $(cat err.txt)"
[ -e failed.png ] && fail "a failed plot leaves no empty image behind"
expect 1 "gnuplot missing" env PATH="$PWD/nobin" $T plot run/metrics.jsonl -o missing.png
grep -q "gnuplot is missing: run make deps" err.txt || fail "a missing gnuplot is said: $(cat err.txt)"

finish "test_plot: ok"
