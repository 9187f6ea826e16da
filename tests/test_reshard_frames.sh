#!/bin/sh
# A passthrough reshard (whole chunks copied as they are stored, neither decoded
# nor encoded) of chunks of thousands of frames, many times the batch of frames the
# writer copies at once whatever its thread count: FSDP 2 -> 1 with 1 and with 2
# threads; every element exact (ckpt diff), every frame copied (the same stored
# bytes and checksums), each chunk's frames in the source's order.
. "$TSR_ROOT/tests/mpi.sh"
cd "$TSR_TMP" || exit 1
PY=/usr/bin/python3
# one bf16 tensor of 12 MiB in zstd frames of 4 KiB: chunks of 1536 frames a rank
run_np 2 "$T" ckpt synth S --layout dp_shard=2 --bytes 12M --tensors 1 --dtype bf16 --frame-bytes 4K \
    --codec zstd >synth.log 2>&1 || { fail "synth S"; tail -3 synth.log >&2; }
for th in 1 2; do
    expect 0 "reshard with $th thread(s)" "$T" reshard S "S1-$th" --layout dp_shard=1 --threads $th
    expect 0 "diff S S1-$th" "$T" ckpt diff S "S1-$th"
done
TESSERA_BIN="$T" $PY - S S1-1 S1-2 <<'PYEOF' || fail "the frames were not copied as stored, in order"
import json, os, subprocess, sys
def chunks(d):
    info = json.loads(subprocess.check_output([os.environ["TESSERA_BIN"], "ckpt", "info", d, "--json"]))
    (t,) = info["tensors"]
    return [[(f["stored_hash"], f["raw_hash"], f["stored_size"], f["codec"]) for f in c["frames"]]
            for c in sorted(t["chunks"], key=lambda c: c["offset"])]
src = chunks(sys.argv[1])
assert len(src) == 2 and all(len(c) >= 1000 for c in src), "source chunks of %s frames" % [len(c) for c in src]
assert all(f[3] == "zstd" for c in src for f in c), "the source frames are not all zstd"
for d in sys.argv[2:]:
    got = [f for c in chunks(d) for f in c]
    want = [f for c in src for f in c]
    assert got == want, "%s: %d frames, %d differ from the source's in order" % (
        d, len(got), sum(a != b for a, b in zip(got, want)) + abs(len(got) - len(want)))
print("%d frames in 2 chunks copied as stored, in order, with 1 and 2 threads" % sum(len(c) for c in src))
PYEOF
finish
