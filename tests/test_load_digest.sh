#!/bin/sh
# test_load_digest.sh: the load's digest check (FORMAT.md 4.4) catches a layout
# conversion gone wrong, which every frame checksum passes: with a bug planted in
# what each rank reads (TSR_FAULT_LOAD, ckpt/load_fault.h) - every box read one
# row off (shift), ranks 0 and 1 reading each other's boxes (swap), every rank
# reading rank 0's box (bcast) - a load fails, naming a tensor and both digests
# (every bug in an FSDP layout, one each in a TP, a PP and a flat layout), before the caller sees the data; the
# same load without the bug passes; a box read right but sent wrong to the ranks
# holding its replicas (send) is named by the check of the copies; a frame
# decoded wrong (decode) or damaged on the disk is named by a read with every
# checksum after the digest check refused it; a frame its decoder refuses
# fails its rank's load and the others learn it. tsr-timeout: 450
. "$TSR_ROOT/tests/mpi.sh"

expect 0 "synth" $T ckpt synth ck --bytes 1M --dtype mix --tensors 7 --frame-bytes 16K
# every bug in the FSDP layout, one in each other (each bug in two layouts or more)
for L in dp_shard=4:shift,swap,bcast tp=4:swap pp=2,dp_shard=2:bcast dp_shard=3,flat:shift; do
    bugs=$(echo "${L#*:}" | tr ',' ' ') L=${L%:*}
    n=$(echo "$L" | tr ',=' '  ' | awk '{ n = 1; for (i = 2; i <= NF; i += 2) n *= $i; print n }')
    # without the bug (one layout here: test_reshard.sh loads many, each checked)
    [ "$L" = pp=2,dp_shard=2 ] && expect 0 "load in $L" run_np "$n" $T ckpt check ck --layout "$L"
    for f in $bugs; do
        export TSR_FAULT_LOAD=$f # the ranks inherit it from mpirun
        expect 1 "load in $L with the bug '$f' planted" run_np "$n" $T ckpt check ck --layout "$L"
        unset TSR_FAULT_LOAD
        grep -q "tensor .*: the digest of the data loaded is [0-9a-f]\{16\}, the MANIFEST's [0-9a-f]\{16\}" err.txt ||
            fail "$L, $f: not the digest check's refusal: $(head -3 err.txt)"
    done
done
# a box read right but sent wrong to the ranks that hold a replica of it: with
# 2 replicas, and with 3 (two identical wrong copies, which a xor of the copies
# alone would not see): the copies' check names the tensor
for L in dp_replicate=2,dp_shard=2 dp_replicate=3; do
    n=$(echo "$L" | tr ',=' '  ' | awk '{ n = 1; for (i = 2; i <= NF; i += 2) n *= $i; print n }')
    export TSR_FAULT_LOAD=send
    expect 1 "load in $L with the bug 'send' planted" run_np "$n" $T ckpt check ck --layout "$L"
    unset TSR_FAULT_LOAD
    grep -q "tensor .*: the digest of the boxes read is the MANIFEST's ([0-9a-f]\{16\}), but ranks that received a copy of one hold other data" err.txt ||
        fail "$L, send: not the copies' check refusal: $(head -3 err.txt)"
    expect 0 "load in $L without it" run_np "$n" $T ckpt check ck --layout "$L"
done
# the same where a box goes in many pieces (of about 2 MiB; the bit flipped is
# in the last): each piece's share is taken as it is received
expect 0 "synth big" $T ckpt synth big --bytes 24M --dtype bf16 --tensors 2
export TSR_FAULT_LOAD=send
expect 1 "load of 12 MiB boxes on 2 replicas with the bug 'send' planted" run_np 2 $T ckpt check big --layout dp_replicate=2
unset TSR_FAULT_LOAD
grep -q "tensor .*: the digest of the boxes read is the MANIFEST's ([0-9a-f]\{16\}), but ranks that received a copy of one hold other data" err.txt ||
    fail "big, send: not the copies' check refusal: $(head -3 err.txt)"
expect 0 "load of 12 MiB boxes on 2 replicas without it" run_np 2 $T ckpt check big --layout dp_replicate=2
# a decoder gone wrong (decode: a bit of every decoded frame flipped, the stored
# bytes sound): where the digest check stands in for the decoded frames'
# checksums, it refuses the load and a read with every checksum names the
# frame; without the digest check the frame's raw checksum names it at once
export TSR_FAULT_LOAD=decode
expect 1 "load on 3 ranks with the bug 'decode' planted" run_np 3 $T ckpt check ck --layout dp_shard=3
grep -q "the digest check refused [0-9]* tensors*; read again with every checksum: .*frame [0-9]* .*checksum mismatch (decoded bytes)" err.txt ||
    fail "decode: not the digest check's refusal naming a frame: $(head -3 err.txt)"
expect 1 "the same without the digest check" run_np 3 $T ckpt check ck --layout dp_shard=3 --no-digest-check
grep -q "frame [0-9]* .*checksum mismatch (decoded bytes)" err.txt && ! grep -q "digest" err.txt ||
    fail "decode, no digest check: not the frame's checksum: $(head -3 err.txt)"
unset TSR_FAULT_LOAD
expect 0 "the same load without the bug" run_np 3 $T ckpt check ck --layout dp_shard=3
# a frame damaged on the disk (a raw frame: no decoder sees it first): the digest
# check, which stands in for the frames' checksums, refuses the load, and the
# read with every checksum names the frame by its stored bytes' checksum
expect 0 "synth raw" $T ckpt synth raw --bytes 256K --dtype bf16 --tensors 2 --frame-bytes 16K --codec raw
flip raw/data-00000.tsd $((4096 + 100)) || fail "damaging raw" # inside the first frame's stored bytes
expect 1 "load on 3 ranks of a frame damaged on the disk" run_np 3 $T ckpt check raw --layout dp_shard=3
grep -q "the digest check refused 1 tensor; read again with every checksum: .*data-00000.tsd: frame 0 (offset 4096) .*checksum mismatch (stored bytes)" err.txt ||
    fail "a damaged frame: not the digest check's refusal naming it: $(head -3 err.txt)"
# a frame its decoder refuses (the first byte of a compressed frame damaged):
# the rank that reads it fails alone; the digest check's all-reduce, which
# also carries every rank's outcome, tells the others, and no rank waits
expect 0 "synth f32" $T ckpt synth enc --bytes 1M --dtype f32 --tensors 3 --frame-bytes 16K
flip enc/data-00000.tsd 4096 || fail "damaging enc"
expect 1 "load on 3 ranks of a frame its decoder refuses" run_np 3 $T ckpt check enc --layout dp_shard=3
grep -q "rank 0: .*data-00000.tsd: frame 0 (offset 4096) of model.layers.0.w: " err.txt &&
    [ "$(grep -c "rank [12]: enc: the load failed on another rank" err.txt)" = 2 ] ||
    fail "an undecodable frame: not named on its rank and reported by the others: $(head -3 err.txt)"
finish "the load's digest check catches a box read off, two shards swapped, one shard sent to all, a copy sent wrong, a frame decoded wrong and one damaged on the disk"
