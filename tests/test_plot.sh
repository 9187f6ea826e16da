#!/bin/sh
# test_plot.sh: tessera plot: a metrics file with a resumed (repeated) step range,
# a garbage line and an incomplete object gives an unbroken curve of the last value
# per step, drawn to a real PNG; and the error cases: bad usage (2), a missing
# file, no data, an unwritable output, gnuplot failing or missing (1).
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

# usage
expect 0 "plot --help" $T plot --help
grep -q "usage: tessera plot" out.txt || fail "--help prints the usage"
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
