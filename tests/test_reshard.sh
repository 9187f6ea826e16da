#!/bin/sh
# test_reshard.sh: a checkpoint saved on N ranks in layout A loads on M ranks in
# layout B with every element exact: FSDP, TP, PP, replicated DP, all four
# combined, uneven sizes, flat sharding, 1 -> 8, 8 -> 1, 8 -> 3, 6 -> 4.
. "$TSR_ROOT/tests/mpi.sh"

save() { # name ranks layout [dtype]
    run_np "$2" $T ckpt synth "ck/$1" --layout "$3" --bytes 3M --dtype "${4:-mix}" --tensors 7 \
        --frame-bytes 64K >"save-$1.log" 2>&1 || { fail "save $1 on $2 ranks ($3)"; sed 's/^/    /' "save-$1.log" | tail -20 >&2; }
}
check() { # name ranks layout
    if run_np "$2" $T ckpt check "ck/$1" --layout "$3" >check.log 2>&1; then
        echo "ok: $1 -> $2 rank(s), $3"
    else
        fail "load of $1 on $2 ranks in layout $3"; sed 's/^/    /' check.log | tail -20 >&2
    fi
}

save fsdp 4 dp_shard=4
check fsdp 3 dp_shard=3
check fsdp 1 dp_shard=1
save tp 4 tp=4 bf16
check tp 2 tp=2
check tp 3 dp_shard=3
save pp 3 pp=3
check pp 2 pp=2
check pp 4 pp=2,tp=2
save replicated 4 dp_replicate=2,dp_shard=2
check replicated 3 dp_replicate=3
check replicated 2 tp=2
save all4 16 pp=2,dp_replicate=2,dp_shard=2,tp=2
check all4 6 dp_shard=2,tp=3
check all4 8 pp=2,dp_replicate=2,tp=2
save uneven 5 dp_shard=5 f32
check uneven 7 tp=7
check uneven 6 pp=2,dp_shard=3
save flat 4 dp_shard=4,flat
check flat 3 dp_shard=3
check flat 4 dp_shard=2,tp=2
check flat 5 dp_shard=5,flat
save flattp 8 pp=2,dp_shard=2,tp=2,flat
check flattp 3 tp=3
check flattp 6 pp=2,dp_shard=3,flat
save one 1 dp_shard=1
check one 8 pp=2,dp_shard=2,tp=2
save eight 8 pp=2,dp_shard=2,tp=2
check eight 1 dp_shard=1
check eight 3 dp_shard=3
save six 6 dp_shard=3,tp=2
check six 4 pp=2,tp=2
# every saved checkpoint passes verify
for d in ck/*; do $T ckpt verify "$d" >/dev/null 2>&1 || fail "verify $d"; done
# a layout that does not match the job is bad usage
run_np 2 $T ckpt check ck/one --layout dp_shard=3 >/dev/null 2>&1
[ $? = 2 ] || fail "a layout of 3 ranks on a job of 2 is bad usage"
finish "all layout round trips exact"
