#!/bin/sh
# tessera reshard to a layout much wider than the checkpoint: every target rank
# gets a data file, so a layout in which more than half of the ranks would hold
# no data is refused, saying how many, before anything is written; --force writes
# it anyway. Exactly half empty is allowed.
. "$TSR_ROOT/tests/common.sh"
cd "${TSR_TMP:?}" || exit 1

# 1 MiB in 4 tensors: the first on pipeline stage 0, layers 0 and 1 (n_layers 2),
# the last on the last stage
"$T" ckpt synth S --bytes 1M --tensors 4 --threads 1 >/dev/null 2>err.txt || { cat err.txt >&2; exit 1; }
# 1 MiB in 2 matrices of 257 and 255 rows
"$T" ckpt synth M --bytes 1M --tensors 2 --threads 1 >/dev/null 2>err.txt || { cat err.txt >&2; exit 1; }

# dp_shard=100000: FSDP splits the rows, so at most 512 ranks hold data
start=$(date +%s)
expect 1 "dp_shard=100000" timeout 60 "$T" reshard M W --layout dp_shard=100000
secs=$(( $(date +%s) - start ))
grep -q "of its 100000 ranks would hold no data" err.txt || fail "no count of the empty ranks: $(cat err.txt)"
grep -q -- "--force" err.txt || fail "the refusal does not suggest --force: $(cat err.txt)"
empty=$(sed -n 's/.*: \([0-9]*\) of its 100000 ranks.*/\1/p' err.txt)
[ -n "$empty" ] && [ "$empty" -ge 99488 ] && [ "$empty" -lt 100000 ] || fail "empty ranks: '$empty'"
[ -e W ] && fail "a refused reshard created W ($(ls W | wc -l) files)"
[ $secs -le 60 ] || fail "the refusal took $secs s"

# pp=7: stages 0, 1 and 6 hold data, 4 of 7 do not: refused
expect 1 "pp=7" "$T" reshard S P7 --layout pp=7
grep -q "4 of its 7 ranks would hold no data" err.txt || fail "pp=7: $(cat err.txt)"
[ -e P7 ] && fail "a refused reshard created P7"
# pp=6: 3 of 6 empty, exactly half: allowed
expect 0 "pp=6 (half the ranks empty)" "$T" reshard S P6 --layout pp=6
"$T" ckpt diff S P6 >/dev/null || fail "P6 differs from S"
# --force: written, 7 data files, equal to the source
expect 0 "pp=7 --force" "$T" reshard S P7 --layout pp=7 --force
"$T" ckpt verify P7 >/dev/null || fail "P7 does not verify"
n=$(ls P7 | grep -c '^data-')
[ "$n" = 7 ] || fail "P7: $n data files, expected 7"
"$T" ckpt diff S P7 >/dev/null || fail "P7 differs from S"
"$T" reshard --help | grep -q -- "--force" || fail "--help does not describe --force"

finish "reshard: wide layouts refused with the count of empty ranks, --force writes them"
