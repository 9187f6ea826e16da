#!/bin/sh
# Two runs that write the same new checkpoint folder at once: `tessera reshard`,
# `tessera ckpt synth` and `tessera import`, into a plain folder (written beside
# it, renamed into place) and into a step of a root (written in place under the
# root's lock).
# Exactly one run exits 0 and the folder it reports then verifies; the other
# exits 1 with an error that names the folder; no temporary folder (.NAME.tmp-*)
# stays behind. Rounds for BUDGET seconds, FLOOR at least (both runs succeeding
# and one's cleanup removing the other's data file showed in 2 of 3 tries).
. "$TSR_ROOT/tests/common.sh"
cd "${TSR_TMP:?}" || exit 1
BUDGET=10 FLOOR=4

"$T" ckpt synth S --bytes 1M --tensors 4 --threads 1 >/dev/null 2>err.txt || { cat err.txt >&2; exit 1; }
# `tessera import` too, from a Hugging Face folder that the tests' Python writes
# (tests/run.sh sets TSR_PY; run alone without it, that race is left out)
if [ -n "${TSR_PY:-}" ]; then
    "$TSR_PY" "$TSR_ROOT/tests/make_hf.py" good hf >/dev/null || fail "make_hf"
else
    echo "note: TSR_PY is not set: no import races" >&2
fi

# race WHAT DST CMD...: CMD (which writes DST) twice at once; checks the outcome
race() {
    what=$1 dst=$2
    shift 2
    "$@" >a.out 2>a.err &
    pa=$!
    "$@" >b.out 2>b.err &
    pb=$!
    wait $pa; ra=$?
    wait $pb; rb=$?
    case "$ra $rb" in
    "0 1") loser=b ;;
    "1 0") loser=a ;;
    "0 0") fail "$what: both runs into $dst exited 0"; loser="" ;;
    *) fail "$what: exits $ra and $rb (one 0, one 1 expected): $(cat a.err b.err)"; return ;;
    esac
    "$T" ckpt verify "$dst" >/dev/null 2>verify.err ||
        fail "$what: $dst, reported written, does not verify: $(head -3 verify.err)"
    [ -z "$loser" ] || grep -q "^tessera .*: $dst: " $loser.err ||
        fail "$what: the failed run's error does not name $dst: $(cat $loser.err)"
    left=$(ls -a "$(dirname "$dst")" | grep '\.tmp-')
    [ -z "$left" ] || fail "$what: left behind: $left"
}

t0=$(date +%s)
i=0
while [ $i -lt $FLOOR ] || [ $(($(date +%s) - t0)) -lt $BUDGET ]; do
    i=$((i + 1))
    step=root/$(printf 'step-%08d' $i)
    race "reshard, round $i" R$i "$T" reshard S R$i --layout dp_shard=2 --threads 1
    race "ckpt synth, round $i" Y$i "$T" ckpt synth Y$i --bytes 1M --threads 1
    race "reshard into a step, round $i" $step "$T" reshard S $step --layout dp_shard=2 --threads 1
    rm -rf $step
    race "ckpt synth into a step, round $i" $step "$T" ckpt synth $step --bytes 1M --threads 1
    [ -d hf ] && race "import, round $i" I$i "$T" import hf I$i --layout dp_shard=$((i % 2 + 1))
    rm -rf R$i Y$i $step I$i
    [ $fails = 0 ] || break
done
finish "output race: $i rounds of races, one winner each, its folder verifies, the loser names it, nothing left"
