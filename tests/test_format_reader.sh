#!/bin/sh
# test_format_reader.sh: FORMAT.md is enough to read tessera's checkpoints.
# tests/format_reader.py, a reader written from FORMAT.md alone, decodes the test
# vector formats/testdata (section 12) and finds exactly expected.txt's contents;
# it refuses the vector with one frame byte flipped, and reports an expected
# value changed; it reads synthetic checkpoints of every dtype (frames of 64 bytes,
# cut along inner dims; and the default codecs); it and tessera read a MANIFEST
# with records wider than v1.0's (chunk records of 1 MiB, packed) and refuse at
# once one whose packed CHUNKS declares 2 GiB of records; its layout rule (section 10)
# holds for the worked examples and gives the boxes tessera reshard writes; it
# finds a training checkpoint and a model-only checkpoint as section 11 describes
# them (blobs, tensors, placements); and its digests (section 4.4) are the test
# vectors' (a changed one is reported) and those tessera records, which it
# recomputes in every checkpoint it reads; and so are its statistics (section
# 4.5), vectors and recorded ones (a planted NaN: poisoned).
. "$TSR_ROOT/tests/common.sh"
cd "${TSR_TMP:?}" || exit 1
need_py
PY=$TSR_PY
R="$TSR_ROOT/tests/format_reader.py"
V="$TSR_ROOT/formats/testdata"

$PY "$R" "$V/step-00000007" "$V/expected.txt" >out.txt 2>&1
rc=$?
[ $rc = 77 ] && { echo "FAIL: format_reader.py lacks what it needs under $PY:" >&2; cat out.txt >&2; exit 1; }
[ $rc = 0 ] || { fail "the reader does not find the test vector as expected.txt says"; cat out.txt >&2; }

# a changed expected value is reported, naming the element
sed 's/^-12.5 -12.375 /-12.5 -12.25 /' "$V/expected.txt" >changed.txt
cmp -s changed.txt "$V/expected.txt" && fail "expected.txt does not start layers.0.w with -12.5 -12.375"
expect 1 "a changed expected value" $PY "$R" "$V/step-00000007" changed.txt
grep -q "tensor layers.0.w element 1" out.txt || fail "no element named: $(cat out.txt)"

# a flipped byte in a frame (the first of data-00001.tsd) is refused
mkdir -p flipped && cp "$V"/step-00000007/* flipped/ && chmod u+w flipped/*
printf '\001' | dd of=flipped/data-00001.tsd bs=1 seek=4100 conv=notrunc 2>/dev/null
expect 1 "a flipped frame byte" $PY "$R" flipped "$V/expected.txt"
grep -q "refused" out.txt || fail "no refusal: $(cat out.txt)"

# section 4.4: the test vectors' digests, computed here from the spec; a changed
# digest is reported
expect 0 "the digest test vectors" $PY "$R" --vectors "$TSR_ROOT/formats/FORMAT.md"
sed 's/`b7ce0eb120c18dd3`/`b7ce0eb120c18dd4`/' "$TSR_ROOT/formats/FORMAT.md" >changed.md
expect 1 "a changed digest vector" $PY "$R" --vectors changed.md
grep -q "vector c.i64: digest b7ce0eb120c18dd3, FORMAT.md says b7ce0eb120c18dd4" out.txt ||
    fail "the changed vector is not named: $(cat out.txt)"
# section 4.5: the statistics' vectors; a changed one is reported
expect 0 "the statistics test vectors" $PY "$R" --vectors "$TSR_ROOT/formats/FORMAT.md"
grep -q "and the statistics of its 5 (4.5)" out.txt || fail "not every statistics vector read: $(cat out.txt)"
sed 's/| 3.0, -4.0, -0.0, 0.0 (`4040 C080 8000 0000`) | -4 | 3 | 5 | 0 |/| 3.0, -4.0, -0.0, 0.0 (`4040 C080 8000 0000`) | -4 | 3 | 5.5 | 0 |/' \
    "$TSR_ROOT/formats/FORMAT.md" >changed.md
cmp -s changed.md "$TSR_ROOT/formats/FORMAT.md" && fail "FORMAT.md lacks the t.bf16 statistics vector"
expect 1 "a changed statistics vector" $PY "$R" --vectors changed.md
grep -q "vector t.bf16: statistics" out.txt || fail "the changed statistics vector is not named: $(cat out.txt)"

# synthetic checkpoints of every dtype: tiny frames (cut along inner dims), and
# the default codecs (bytegroup, zstd, raw); every tensor's digest recomputed
expect 0 "synth with 64-byte frames" "$T" ckpt synth small --bytes 16K --dtype mix --threads 1 --frame-bytes 64
expect 0 "read the 64-byte frames" $PY "$R" small
grep -q "12 tensors (12 digests checked, 9 statistics)" out.txt || fail "not every digest and statistics checked: $(cat out.txt)"
expect 0 "synth" "$T" ckpt synth mixed --bytes 256K --dtype mix --threads 1
expect 0 "read the default codecs" $PY "$R" mixed
expect 0 "synth with a NaN" "$T" ckpt synth nan --bytes 64K --dtype mix --threads 1 --nan optim.layers.1.w:3
expect 0 "read a poisoned checkpoint" $PY "$R" nan
grep -q "(12 digests checked, 9 statistics, poisoned)" out.txt || fail "not poisoned: $(cat out.txt)"

# FORMAT.md 4.2-4.3 by hand (tests/test_manifest.c rewrites a MANIFEST): every
# record wider than v1.0's, as a later minor version may write them (chunk
# records of 1 MiB, packed), read as they were; and a packed CHUNKS that
# declares 2 GiB of zero records (a zstd frame of 64 KiB) that no tensor holds:
# tessera and the reader refuse it before decoding it, naming the MANIFEST and
# the reason (the reader with 1 GiB of address space, where decoding would not
# fit; one BLAS thread, so that numpy's threads do not take it on a large machine)
TM="$TSR_BUILD/tests/test_manifest"
[ -x "$TM" ] || fail "$TM is not built"
expect 0 "synth for hand-made MANIFESTs" "$T" ckpt synth wide --bytes 16K --dtype mix --threads 1
cp -r wide hostile && chmod -R u+w wide hostile
expect 0 "wider records" "$TM" --widen wide
expect 0 "verify wider records" "$T" ckpt verify wide
expect 0 "read wider records" $PY "$R" wide
expect 0 "a packed CHUNKS of 2 GiB of records" "$TM" --hostile hostile
expect 1 "verify a packed CHUNKS of 2 GiB of records" "$T" ckpt verify hostile
grep -q "hostile/MANIFEST: CHUNKS declares 13421772 records, more than" err.txt ||
    fail "verify does not name the MANIFEST and the count: $(cat err.txt)"
expect 1 "read a packed CHUNKS of 2 GiB of records" \
    env OPENBLAS_NUM_THREADS=1 sh -c 'ulimit -v 1048576 && exec "$@"' sh $PY "$R" hostile
grep -q "refused: CHUNKS: 13421772 records" out.txt || fail "the reader does not refuse the count: $(cat out.txt)"

# section 10: the worked examples, by the reader's layout rule; and that rule
# gives exactly the boxes tessera reshard writes (one data file per rank) for
# uneven, flat, replicated and pipeline layouts (6 layers on 4 and 5 stages)
cat >examples.py <<'PYEOF'
import sys
sys.path.insert(0, sys.argv[1])
import format_reader as f
def T(name, shape, tp, fsdp, role, layer):
    return dict(name=name, group="model", shape=shape, tp_dim=tp, fsdp=fsdp, pp_role=role, layer=layer)
lay = dict(pp=2, dp_replicate=1, dp_shard=2, tp=2, n_layers=3, flat=0)
ts = [T("layers.1.attention.wq.weight", (6, 4), 0, 1, 3, 1), T("layers.1.attention.wo.weight", (4, 5), 1, 1, 3, 1)]
b = {r: f.rank_boxes(lay, ts, r) for r in range(8)}
assert (0, (5, 0), (1, 4)) in b[3] and (0, (2, 0), (1, 4)) in b[2] and (0, (0, 0), (2, 4)) in b[0], b
assert all(not b[r] for r in range(4, 8)) and (1, (0, 3), (2, 2)) in b[1], b
lay4 = dict(lay, dp_shard=4)
rows = [f.rank_boxes(lay4, [T("output.weight", (3, 4), -1, 1, 2, -1)], (4 + ds) * 2) for ds in range(4)]
assert rows == [[(0, (0, 0), (1, 4))], [(0, (1, 0), (1, 4))], [(0, (2, 0), (1, 4))], []], rows
flat = dict(pp=1, dp_replicate=1, dp_shard=3, tp=1, n_layers=0, flat=1)
got = [f.rank_boxes(flat, [T("a", (2, 3), -1, 1, 0, -1), T("b", (4,), -1, 1, 0, -1)], r) for r in range(3)]
assert got == [[(0, (0, 0), (1, 3)), (0, (1, 0), (1, 1))], [(0, (1, 1), (1, 2)), (1, (0,), (2,))],
               [(1, (2,), (2,))]], got
assert [f.cut(5, 4, i) for i in range(4)] == [(0, 2), (2, 4), (4, 5), (5, 5)]
assert [f.cut(2, 4, i) for i in range(4)] == [(0, 1), (1, 2), (2, 2), (2, 2)]
PYEOF
expect 0 "the worked examples of section 10" $PY examples.py "$TSR_ROOT/tests"
for L in pp=2,dp_shard=3,tp=2 pp=2,dp_shard=3,tp=2,flat dp_replicate=2,dp_shard=2,tp=3 pp=4,dp_shard=2,flat pp=5,tp=2; do
    rm -rf rs
    expect 0 "reshard to $L" "$T" reshard mixed rs --layout $L
    expect 0 "the boxes of $L by section 10" $PY "$R" rs --layout
    grep -q "(0 digests checked" out.txt && fail "reshard to $L recorded no digest: $(cat out.txt)"
    grep -q " 0 statistics" out.txt && fail "reshard to $L recorded no statistics: $(cat out.txt)"
done

# a training checkpoint and the model-only one (section 11)
"$T" train --config "$TSR_ROOT/train/configs/debug.toml" --job.dump_folder=run --training.steps=2 \
    --training.seq_len=32 --checkpoint.enable=true --checkpoint.interval=2 \
    --checkpoint.last_save_model_only=true >train.log 2>&1 || { fail "train"; tail -5 train.log >&2; }
expect 0 "the training checkpoint as section 11 says" $PY "$R" run/checkpoint/step-00000002 --trainer
expect 0 "the model-only checkpoint as section 11 says" $PY "$R" run/checkpoint/model-step-00000002 --trainer
finish "the reader from FORMAT.md reads the test vector, synthetic and training checkpoints"
