#!/bin/sh
# test_reshard.sh: a checkpoint saved on N ranks in layout A loads on M ranks in
# layout B with every element exact: FSDP, TP, PP, replicated DP, all four
# combined, uneven sizes, flat sharding, 1 -> 8, 8 -> 1, 8 -> 3, 6 -> 4: as many of
# those as 60 s allow (5 at least, the most varied first), all under make test-long.
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

# the groups (a save and its loads), for 60 s at least 5 of them (every one under
# make test-long, TSR_LONG); the rest are named as left out
t0=$(date +%s) done_groups=0 skipped=""
group() { # name ranks layout [dtype] -- then "ranks layout" pairs to load it in
    name=$1
    if [ -z "${TSR_LONG:-}" ] && [ $done_groups -ge 5 ] && [ $(( $(date +%s) - t0 )) -ge 60 ]; then
        skipped="$skipped $name"; return
    fi
    done_groups=$((done_groups + 1))
    save "$@"
}
load() { [ "${skipped##* }" = "$1" ] || check "$@"; } # name ranks layout: unless its group was left out
group all4 16 pp=2,dp_replicate=2,dp_shard=2,tp=2
load all4 6 dp_shard=2,tp=3
load all4 8 pp=2,dp_replicate=2,tp=2
group uneven 5 dp_shard=5 f32
load uneven 7 tp=7
load uneven 6 pp=2,dp_shard=3
group flattp 8 pp=2,dp_shard=2,tp=2,flat
load flattp 3 tp=3
load flattp 6 pp=2,dp_shard=3,flat
group one 1 dp_shard=1
load one 8 pp=2,dp_shard=2,tp=2
group eight 8 pp=2,dp_shard=2,tp=2
load eight 1 dp_shard=1
load eight 3 dp_shard=3
group fsdp 4 dp_shard=4
load fsdp 3 dp_shard=3
load fsdp 1 dp_shard=1
group tp 4 tp=4 bf16
load tp 2 tp=2
load tp 3 dp_shard=3
group pp 3 pp=3
load pp 2 pp=2
load pp 4 pp=2,tp=2
group replicated 4 dp_replicate=2,dp_shard=2
load replicated 3 dp_replicate=3
load replicated 2 tp=2
group flat 4 dp_shard=4,flat
load flat 3 dp_shard=3
load flat 4 dp_shard=2,tp=2
load flat 5 dp_shard=5,flat
group six 6 dp_shard=3,tp=2
load six 4 pp=2,tp=2
[ -n "$skipped" ] && echo "left out for the time budget (make test-long runs them):$skipped"
# every saved checkpoint passes verify
for d in ck/*; do $T ckpt verify "$d" >/dev/null 2>&1 || fail "verify $d"; done
# a layout that does not match the job is bad usage
run_np 2 $T ckpt check ck/one --layout dp_shard=3 >/dev/null 2>&1
[ $? = 2 ] || fail "a layout of 3 ranks on a job of 2 is bad usage"
finish "all layout round trips exact"
