#!/bin/sh
# tessera reshard: offline rewrites between layouts (FSDP, TP, PP, replicated,
# flat, one consolidated set) load exactly in the new layout on its rank count
# and compare equal to the source with ckpt diff; whole source chunks are copied
# as they are stored; --dtype conversions are exact
# where the target holds the value (bf16 -> f32 -> bf16); --only model drops the
# other groups; bad input fails clearly (a layout far wider than the checkpoint
# at once); an interrupted reshard commits nothing.
. "$TSR_ROOT/tests/mpi.sh"
cd "$TSR_TMP" || exit 1
PY=/usr/bin/python3

# A: every dtype kind, 8 ranks; B: bf16 only, 6 ranks, uneven
run_np 8 "$T" ckpt synth A --layout pp=2,dp_shard=2,tp=2 --bytes 48M --dtype mix >/dev/null || fail "synth A"
run_np 6 "$T" ckpt synth B --layout dp_shard=3,tp=2 --bytes 24M --dtype bf16 >/dev/null || fail "synth B"

# to_layout SRC DST LAYOUT NP [reshard options]: reshard, verify, one data file per
# rank, every element exact when loaded in LAYOUT on NP ranks
to_layout() {
    src=$1 dst=$2 layout=$3 np=$4; shift 4
    "$T" reshard "$src" "$dst" --layout "$layout" "$@" >/dev/null || { fail "reshard $src -> $dst ($layout)"; return; }
    "$T" ckpt verify "$dst" >/dev/null || fail "$dst does not verify"
    files=$("$T" ckpt info "$dst" --json | $PY -c 'import json,sys; print(len(json.load(sys.stdin)["files"]))')
    [ "$files" = "$np" ] || fail "$dst: $files data files for $np ranks"
    # the synthetic content is per dtype: a converted checkpoint is compared by diff instead
    case "$*" in *--dtype*) return;; esac
    run_np "$np" "$T" ckpt check "$dst" --layout "$layout" >/dev/null || fail "$dst: check in $layout on $np ranks"
}
to_layout A A1 dp_shard=1 1
to_layout A A3 dp_shard=3 3
to_layout A A8 pp=2,dp_replicate=2,tp=2 8 --piece 64k --threads 3
to_layout A A4f dp_shard=4,flat 4
to_layout A3 A6 dp_shard=2,tp=3 6
for c in A1 A3 A8 A4f A6; do "$T" ckpt diff A $c >/dev/null || fail "ckpt diff A $c"; done

# passthrough: target boxes made of whole source chunks keep the source's
# frames as they are stored (same bytes, same checksums): consolidation (FSDP 4
# -> 1) copies every frame; FSDP 4 -> 2 those of the tensors whose halves are
# whole quarters (4097 rows: quarters of 1025 rows, halves of 2049, do not);
# a codec asked for that differs from theirs re-encodes (--codec raw: all raw)
run_np 4 "$T" ckpt synth P --layout dp_shard=4 --bytes 16M --dtype bf16 >/dev/null || fail "synth P"
to_layout P P2 dp_shard=2 2
to_layout P P1 dp_shard=1 1
to_layout P P1r dp_shard=1 1 --codec raw
for c in P2 P1 P1r; do "$T" ckpt diff P $c >/dev/null || fail "ckpt diff P $c"; done
TESSERA_BIN="$T" $PY - P P2 P1 P1r <<'PYEOF' || fail "passthrough frames"
import json, os, subprocess, sys
def frames(d):
    info = json.loads(subprocess.check_output([os.environ["TESSERA_BIN"], "ckpt", "info", d, "--json"]))
    return sorted((f["stored_hash"], f["stored_size"], f["codec"])
                  for t in info["tensors"] for c in t["chunks"] for f in c["frames"])
src = frames("P")
assert any(f[2] != "raw" for f in src), "the source has no encoded frame"
assert frames("P1") == src, "P1: frames not copied as stored"
p2 = frames("P2")
assert any(f in src for f in p2) and any(f not in src for f in p2), "P2: expected some frames copied, some not"
assert all(f[2] == "raw" for f in frames("P1r")), "P1r: --codec raw left encoded frames"
PYEOF
run_np 3 "$T" ckpt check A8 --layout dp_shard=3 >/dev/null || fail "A8 loaded on 3 ranks"

# dtypes: bf16 -> f32 -> bf16 is exact
to_layout B B32 pp=2,tp=2 4 --dtype f32 --codec zstd --level 3
"$T" reshard B32 B16 --layout dp_shard=2 --dtype bf16 >/dev/null || fail "reshard B32 -> B16"
# exact: the only difference is the blob that names the source's digests
"$T" ckpt diff B B16 --json >diff_b16.json
$PY - B B32 B16 <<'PYEOF' || fail "bf16 -> f32 -> bf16 is not exact, or the digests do not follow"
import json, subprocess, os, sys
d = json.load(open("diff_b16.json"))
assert d["differences"] == ["blob reshard.source_digests (rank -1): only in B"], d["differences"]
info = {c: json.loads(subprocess.check_output([os.environ["TESSERA"], "ckpt", "info", c, "--json"])) for c in sys.argv[1:]}
dig = {c: {t["name"]: t["digest"] for t in info[c]["tensors"]} for c in sys.argv[1:]}
# converted back, every tensor has the digest it had: same names, dtype and bits
assert dig["B"] == dig["B16"] and all(dig["B"].values()), "bf16 -> f32 -> bf16 changed a digest"
assert all(dig["B32"][n] != dig["B"][n] for n in dig["B"]), "an f32 tensor has its bf16 digest"
# B32 names each tensor's source dtype and digest: B's
sys.path.insert(0, os.path.join(os.environ["TSR_ROOT"], "tests"))
import format_reader
ck = format_reader.Checkpoint(sys.argv[2])
(i,) = [k for k, b in enumerate(ck.blobs) if b["name"] == "reshard.source_digests"]
rows = {l.split()[0]: tuple(l.split()[1:]) for l in ck.blob(i).decode().splitlines()}
assert rows == {n: ("bf16", v) for n, v in dig["B"].items()}, rows
PYEOF
run_np 2 "$T" ckpt check B16 --layout dp_shard=2 >/dev/null || fail "B16: check on 2 ranks"
$PY - B32 <<'PYEOF' || fail "B32 is not all f32"
import json, subprocess, os, sys
m = json.loads(subprocess.check_output([os.environ["TESSERA"], "ckpt", "info", sys.argv[1], "--json"]))
assert all(t["dtype"] == "f32" for t in m["tensors"]), [t["dtype"] for t in m["tensors"]]
PYEOF

# a converted tensor's source is held to its digest: a source whose data is not
# what its MANIFEST records (every frame's checksum intact) is refused by name
cp -r B Bbad && $PY "$TSR_ROOT/tests/set_digest.py" Bbad model.layers.0.w 0123456789abcdef >/dev/null || fail "set_digest"
"$T" reshard Bbad Bbad32 --layout dp_shard=1 --dtype f32 >/dev/null 2>reshard_bad.err && fail "reshard of a wrong digest: exit 0"
grep -q "tensor model.layers.0.w: its data has digest [0-9a-f]*, its MANIFEST records 0123456789abcdef" reshard_bad.err ||
    { fail "reshard of a wrong digest: not named"; cat reshard_bad.err >&2; }
[ -e Bbad32 ] && fail "reshard of a wrong digest: the output exists"

# --only model
"$T" reshard A AM --layout tp=2 --only model >/dev/null || fail "reshard --only model"
$PY - <<'PYEOF' || fail "--only model kept other groups"
import json, subprocess, os
info = lambda d: json.loads(subprocess.check_output([os.environ["TESSERA"], "ckpt", "info", d, "--json"]))
a, m = info("A"), info("AM")
want = sorted(t["name"] for t in a["tensors"] if t["group"] == "model")
got = sorted(t["name"] for t in m["tensors"])
assert want and got == want and len(want) < len(a["tensors"]), (want, got)
PYEOF

# bad input
expect 1 "DST holds a checkpoint" "$T" reshard A A1 --layout tp=2
grep -q "already holds a committed checkpoint" err.txt || fail "no reason for the committed DST"
expect 1 "missing SRC" "$T" reshard nowhere X --layout tp=2
grep -q "nowhere" err.txt || fail "the missing SRC is not named"
expect 2 "integer --dtype" "$T" reshard A X --layout tp=2 --dtype i32
expect 2 "bad layout" "$T" reshard A X --layout tq=2
expect 2 "no layout" "$T" reshard A X
[ -e X ] && fail "a failed reshard left X"
# a damaged frame in a chunk that would be copied as it is stored: refused, named
cp -r P Pbad
flip Pbad/data-00000.tsd $((4096 + 100)) || fail "damaging Pbad" # inside the first frame's stored bytes
expect 1 "a damaged frame copied as stored" "$T" reshard Pbad PbadX --layout dp_shard=1
grep -q "data-00000.tsd: frame 0 (offset 4096) of a chunk copied as it is stored: checksum mismatch (stored bytes)" err.txt || fail "the damaged frame is not named: $(cat err.txt)"
[ -e PbadX/MANIFEST ] && fail "a reshard of a damaged source committed"

# a layout far wider than the checkpoint: refused at once and in little memory,
# whatever its width (the ranks are not visited one by one)
"$T" ckpt synth M --bytes 1M --tensors 2 --threads 1 >/dev/null || fail "synth M"
for L in dp_shard=100000 dp_shard=2147483648 pp=2,tp=1000,dp_shard=1000 dp_shard=2000000000,flat; do
    start=$(date +%s)
    if [ -x /usr/bin/time ]; then
        expect 1 "reshard to $L" timeout 20 /usr/bin/time -f %M -o rss.txt "$T" reshard M W --layout $L
        [ "$(tail -1 rss.txt)" -lt 300000 ] || fail "$L: refused at a peak of $(tail -1 rss.txt) KiB"
    else
        expect 1 "reshard to $L" timeout 20 "$T" reshard M W --layout $L
    fi
    [ $(($(date +%s) - start)) -le 5 ] || fail "$L: refused after $(($(date +%s) - start)) s"
    grep -q "ranks would hold no data" err.txt || fail "$L: not refused as too wide: $(cat err.txt)"
done
[ -e W ] && fail "a refused reshard created W"

# interrupted: killed midway, nothing committed, and K does not appear (it is
# written as .K.tmp-PID-N beside it, which the kill leaves)
run_np 1 "$T" ckpt synth BIG --bytes 512M --dtype bf16 >/dev/null || fail "synth BIG"
"$T" reshard BIG K --layout dp_shard=4 --threads 1 --piece 1M >/dev/null 2>&1 &
pid=$!
i=0
while ! ls -d .K.tmp-$pid-* >/dev/null 2>&1 && [ $i -lt 400 ]; do sleep 0.01; i=$((i + 1)); done
sleep 0.2
kill -9 $pid 2>/dev/null
wait $pid 2>/dev/null
[ -e K ] && fail "an interrupted reshard left K"
ls -d .K.tmp-$pid-* >/dev/null 2>&1 || fail "no .K.tmp-$pid-* left by the killed reshard (was it killed midway?)"
"$T" ckpt verify .K.tmp-$pid-* >/dev/null 2>&1 && fail "an interrupted reshard verifies"
finish "offline reshard: layouts, dtypes, model only, errors and interruption ok"
