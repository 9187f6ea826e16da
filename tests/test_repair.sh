#!/bin/sh
# test_repair.sh: tessera ckpt verify --repair DIR [--from SOURCE ...]. Damaged
# frames (and a damaged header, a missing data file) of a synthetic checkpoint
# are rewritten (a) from a copy of the same folder: the file comes out byte for
# byte the original, the damaged one kept aside as .damaged; (b) from an older
# step whose tensor model.norm did not change (another save, the frame at another
# offset); from a copy stored with another codec (raw bytes stored anew, in both
# directions); (c) from the checkpoint archived to S3 (moto on loopback); (d)
# with a frame that no source holds, the file is left byte for byte as it was
# and the error names the file, the tensor and the frame lost; (e) a source
# whose frame fails its own checksums is never copied in (the next source is
# taken); (f) a damaged MANIFEST is replaced by a copy's of the same save
# (kept aside as MANIFEST.damaged), never by another save's or by an archive's
# that stores the frames otherwise. A sound checkpoint is left alone; the
# folder's lock is honoured.
# tsr-timeout: 120
. "$TSR_ROOT/tests/common.sh"
cd "$TSR_TMP" || exit 1
PY=/usr/bin/python3
# frame_at CKPT TENSOR K [absent|present OTHER]: the offset of frame K (counted
# among the frames that qualify) of TENSOR in CKPT whose raw checksum OTHER
# holds in no frame (absent) or in some frame (present); its codec in $PWD/codec
frame_at() {
    "$T" ckpt info "$1" --json >a.json || { fail "ckpt info $1"; return; }
    if [ $# -gt 3 ]; then "$T" ckpt info "$5" --json >b.json || fail "ckpt info $5"; else echo '{"tensors":[]}' >b.json; fi
    $PY - "$2" "$3" "${4:-any}" <<'EOF'
import json, sys
name, k, cond = sys.argv[1], int(sys.argv[2]), sys.argv[3]
a, b = json.load(open("a.json")), json.load(open("b.json"))
other = {f["raw_hash"] for t in b["tensors"] for c in t["chunks"] for f in c["frames"]}
fr = [f for t in a["tensors"] if t["name"] == name for c in t["chunks"] for f in c["frames"]
      if cond == "any" or (cond == "absent") == (f["raw_hash"] not in other)]
open("codec", "w").write(fr[k]["codec"])
print(fr[k]["offset"])
EOF
}
synth() { # DIR STEP BYTES [options]: a small checkpoint of frames of 16 KiB
    d=$1 s=$2 b=$3; shift 3
    "$T" ckpt synth "$d" --bytes "$b" --tensors 4 --dtype mix --frame-bytes 16k --step "$s" "$@" >/dev/null ||
        fail "ckpt synth $d $*"
}
S=root/step-00000002 F=root/step-00000002/data-00000.tsd
synth $S 2 256k
cp -r $S orig && cp -r $S copy
reset() { cp orig/data-00000.tsd $F && rm -f $F.damaged $F.repair; }
clean() { # WHAT: no file left beside the data file
    [ -e $F.repair ] && fail "$1: left $F.repair"
    [ -e $F.damaged ] && fail "$1: left $F.damaged"
}
repaired() { # WHAT: identical to the original, verifies, the damaged file kept aside
    cmp -s $F orig/data-00000.tsd || fail "$1: the repaired file differs from the original"
    cmp -s $S/MANIFEST orig/MANIFEST || fail "$1: the MANIFEST changed"
    "$T" ckpt verify $S >/dev/null 2>&1 || fail "$1: does not verify"
    [ -e $F.repair ] && fail "$1: left $F.repair"
}

# usage
expect 0 "verify --help" "$T" ckpt verify --help
grep -q -- "--repair DIR \[--from SOURCE" out.txt && grep -q "data-N.tsd.damaged" out.txt ||
    fail "verify --help does not describe --repair"
expect 2 "--from without --repair" "$T" ckpt verify $S --from copy
expect 2 "--repair without DIR" "$T" ckpt verify --repair --from copy

# a sound checkpoint: nothing written
expect 0 "repair of a sound checkpoint" "$T" ckpt verify --repair $S --from copy
grep -q "0 data files repaired" out.txt || fail "repair of a sound checkpoint: $(cat out.txt)"
clean "repair of a sound checkpoint"

# (a) two frames and the header damaged, repaired from a copy of the folder
o1=$(frame_at $S model.layers.0.w 1) o2=$(frame_at $S optim.layers.3.w 2)
flip $F $((o1 + 100)) 3 && flip $F $((o2 + 7)) && flip $F 20
cp $F damaged.tsd
expect 1 "verify of the damaged checkpoint" "$T" ckpt verify $S
expect 0 "repair from a copy" "$T" ckpt verify --repair $S --from copy
repaired "repair from a copy"
cmp -s $F.damaged damaged.tsd || fail "the damaged file is not kept as $F.damaged"
grep -q "2 of 26 frames damaged: 2 repaired" out.txt && grep -q "header" out.txt &&
    grep -q "of tensor model.layers.0.w: repaired from copy" out.txt || fail "repair from a copy: report: $(cat out.txt)"
# the same as JSON
cp damaged.tsd $F
expect 0 "repair from a copy, --json" "$T" ckpt verify --repair $S --from copy --json
$PY -c '
import json, sys
d = json.load(open("out.txt"))
f = d["repair"][0]
assert d["ok"] and d["frames_repaired"] == 2 and f["damaged"] == 2 and f["repaired"] == 2 and f["lost"] == 0, d
assert f["rewritten"] and f["kept_aside"] and all(x["source"] == "copy" for x in f["damaged_frames"]), f
' || fail "repair --json: $(cat out.txt)"
repaired "repair from a copy, --json"
# the header alone needs no source; a missing data file is written anew
reset && flip $F 40
expect 0 "repair of a header, no source" "$T" ckpt verify --repair $S
repaired "repair of a header"
reset && rm $F
expect 0 "repair of a missing data file" "$T" ckpt verify --repair $S --from copy
repaired "repair of a missing data file"
[ -e $F.damaged ] && fail "a missing data file left a $F.damaged"

# (b) and (d): an older step (another save of other shapes) where model.norm did
# not change, but model.layers.0.w grew: its new frames are in no other copy
synth root/step-00000001 1 200k
reset
on=$(frame_at $S model.norm 0 present root/step-00000001)
ol=$(frame_at $S model.layers.0.w 0 absent root/step-00000001)
flip $F $((on + 50)) 2 && flip $F $((ol + 9))
cp $F damaged.tsd
expect 1 "repair with a frame lost" "$T" ckpt verify --repair $S --from root/step-00000001
cmp -s $F damaged.tsd || fail "a repair with a frame lost changed the file"
clean "a repair with a frame lost"
grep -q "data-00000.tsd: 1 of 26 frames lost" err.txt && grep -q "of tensor model.layers.0.w; the file is left as it is" err.txt ||
    fail "a repair with a frame lost: unclear error: $(cat err.txt)"
grep "frames lost" err.txt | grep -q "model.norm" && fail "model.norm named lost: $(cat err.txt)"
grep -q "frame [0-9]* (offset $ol) of tensor model.layers.0.w: lost" out.txt ||
    fail "the lost frame is not named with its offset: $(cat out.txt)"
reset && flip $F $((on + 50)) 2
expect 0 "repair from an older step" "$T" ckpt verify --repair $S --from root/step-00000001
repaired "repair from an older step"
grep -q "of tensor model.norm: repaired from root/step-00000001" out.txt || fail "repair from an older step: $(cat out.txt)"

# another codec: a frame stored encoded repaired from a copy stored raw (its raw
# bytes encoded again to the same stored bytes), and the other way round
synth rawc 2 256k --codec raw
reset
ob=$(frame_at $S model.layers.2.w 0) && cb=$(cat codec)
oz=$(frame_at $S model.mask 0) && cz=$(cat codec)
[ "$cz" = zstd ] || fail "model.mask is stored $cz, not zstd"
flip $F $((ob + 11)) && flip $F $((oz + 3))
expect 0 "repair from a raw copy" "$T" ckpt verify --repair $S --from rawc
repaired "repair from a raw copy ($cb and $cz frames)"
grep -q "raw bytes stored anew" out.txt || fail "repair from a raw copy: $(cat out.txt)"
cp -r rawc rawd && flip rawd/data-00000.tsd $((ob + 11))
expect 0 "repair of a raw copy from an encoded one" "$T" ckpt verify --repair rawd --from orig
cmp -s rawd/data-00000.tsd rawc/data-00000.tsd || fail "a raw frame repaired from an encoded copy differs"

# (e) a hostile source: its frame's bytes do not match its own checksums
cp -r orig hostile && flip hostile/data-00000.tsd $((o1 + 100)) 3
reset && flip $F $((o1 + 100)) 3 && cp $F damaged.tsd
expect 1 "repair from a hostile source" "$T" ckpt verify --repair $S --from hostile
cmp -s $F damaged.tsd || fail "a hostile source changed the file"
clean "a hostile source"
grep -q "a copy failed its check: hostile/data-00000.tsd" out.txt || fail "the hostile copy is not named: $(cat out.txt)"
expect 0 "repair from a hostile source, then a sound one" "$T" ckpt verify --repair $S --from hostile --from copy
repaired "repair past a hostile source"
grep -q "repaired from copy" out.txt || fail "repair past a hostile source: $(cat out.txt)"

# (f) a damaged MANIFEST: replaced by a copy's of the same save (and a damaged
# frame repaired after it), never by another save's; nothing changed when no
# source holds one
reset && cp orig/MANIFEST $S/MANIFEST && rm -f $S/MANIFEST.damaged
msize=$(wc -c <$S/MANIFEST)
flip $S/MANIFEST $((msize / 2)) && cp $S/MANIFEST damaged.mf
expect 1 "repair of a MANIFEST from another save only" "$T" ckpt verify --repair $S --from root/step-00000001
cmp -s $S/MANIFEST damaged.mf || fail "another save's MANIFEST was taken"
[ -e $S/MANIFEST.damaged ] && fail "a refused MANIFEST repair left files"
grep -q "no source holds a MANIFEST of these data files" err.txt || fail "MANIFEST not repaired: unclear: $(cat err.txt)"
flip $F $((o1 + 100))
expect 0 "repair of a MANIFEST and a frame" "$T" ckpt verify --repair $S --from root/step-00000001 --from copy
cmp -s $S/MANIFEST orig/MANIFEST || fail "the MANIFEST is not the copy's"
cmp -s $S/MANIFEST.damaged damaged.mf || fail "the damaged MANIFEST is not kept as MANIFEST.damaged"
grep -q "^MANIFEST: repaired from copy" out.txt && grep -q "of tensor model.layers.0.w: repaired from" out.txt ||
    fail "repair of a MANIFEST and a frame: report: $(cat out.txt)"
cmp -s $F orig/data-00000.tsd || fail "the frame was not repaired after the MANIFEST"
"$T" ckpt verify $S >/dev/null 2>&1 || fail "the checkpoint does not verify after its MANIFEST's repair"
rm -f $S/MANIFEST.damaged

# the folder's lock: a job (or a pull) writing root refuses the repair
reset && flip $F $((o1 + 100))
(exec 9>>root/LOCK && flock 9 && exec sleep 30) &
holder=$!
n=0
while [ $n -lt 50 ] && flock -n root/LOCK true 2>/dev/null; do sleep 0.1; n=$((n + 1)); done
expect 1 "repair while the folder is locked" "$T" ckpt verify --repair $S --from copy
grep -q "another writer holds this checkpoint folder" err.txt || fail "repair under a lock: $(cat err.txt)"
kill $holder 2>/dev/null; wait $holder 2>/dev/null
clean "repair under a lock"

# (c) from the archive in S3: the checkpoint stored raw, pushed (its frames
# encoded on the way), damaged locally, repaired from the bucket
. "$TSR_ROOT/tests/s3.sh"
s3_start bkt
export TSR_S3_RETRY_SECONDS=5
mkdir -p arch && cp -r rawc arch/step-00000002
expect 0 "push" "$T" push arch/step-00000002 s3://bkt/run/
cp -r arch/step-00000002 local
flip local/data-00000.tsd $((ob + 11)) 2 && flip local/data-00000.tsd $((oz + 5))
expect 1 "verify of the damaged local copy" "$T" ckpt verify local
expect 0 "repair from S3" "$T" ckpt verify --repair local --from s3://bkt/run/step-00000002
cmp -s local/data-00000.tsd rawc/data-00000.tsd || fail "repair from S3: the file differs from the original"
grep -q "repaired from s3://bkt/run/step-00000002" out.txt || fail "repair from S3: $(cat out.txt)"
# the archive's frames were encoded on the way: its MANIFEST is not the local one's
cp local/MANIFEST local.mf && msize=$(wc -c <local/MANIFEST) && flip local/MANIFEST $((msize / 3))
expect 1 "repair of a MANIFEST from an archive stored otherwise" "$T" ckpt verify --repair local --from s3://bkt/run/step-00000002
grep -q "no source holds a MANIFEST of these data files" err.txt || fail "MANIFEST from S3: unclear: $(cat err.txt)"
cp local.mf local/MANIFEST
expect 1 "repair of a checkpoint in S3" "$T" ckpt verify --repair s3://bkt/run/step-00000002
grep -q "local checkpoints only" err.txt || fail "repair in S3: unclear refusal: $(cat err.txt)"
finish "repair: from a copy, an older step, another codec and S3; lost frames leave the file as it was; hostile bytes never copied; a damaged MANIFEST from a copy of the same save"
