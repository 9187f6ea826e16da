#!/bin/sh
# tsr-timeout: 400
# Silent data corruption caught while training (train/sdc.c, README "Keeping a
# run alive"): the ranks that hold copies of a tensor compare hashes of them
# every training.sdc_check_interval steps and before every checkpoint.
# 1. 3 replicas (dp_replicate=3) on 3 ranks as 3 nodes under `tessera launch
#    --chaos 5,3625,bitflip`: the seed flips a bit of rank 2's weights early in
#    the first launch and again in the second (then nothing for 13 s). Each flip
#    is caught by the check within its interval, the majority names rank 2 and
#    its host in the job's log and blames it in an "sdc" event, the job rolls
#    back to its newest checkpoint and goes on, the second blame counts as node
#    2's repeat failure (the policy that drops nodes, which keeps it here: two
#    ranks cannot hold three replicas), and the run finishes with the losses and
#    final checkpoint of a run without flips, bitwise, every sample once. With
#    a global batch that 2 ranks can share, the second blame drops node 2 and
#    its replica, and the job finishes on 2 ranks (1b).
# 2. 2 replicas x 2 shards on 4 ranks as 2 nodes, seed 559: rank 1 flipped
#    about 1.1 s after the start, mid-run (rank 1 made 40 ms a step slower so
#    that the run lasts: TSR_FAULT_SLOW): two copies cannot tell which is right:
#    both holders (ranks 1 and 3) are named and none is blamed; the job rolls
#    back to its newest checkpoint (checked before it was saved) and finishes
#    equal to an uninterrupted run.
# 3. The check costs nothing where no tensor has two holders, is off with
#    training.sdc_check_interval=0, and passes in a clean run on tp=2 (the norm
#    weights over tp) with dp_replicate=2.
. "$TSR_ROOT/tests/mpi.sh"
. "$TSR_ROOT/tests/launch.sh" # ev, compare
job() { # GLOBAL_BATCH: 24 steps of the debug model, a checkpoint every 4, the replica check every 3
    echo "--config $CFG --training.seq_len=32 --metrics.log_freq=1 --lr_scheduler.warmup_steps=2 --training.steps=24" \
        "--training.global_batch_size=$1 --training.local_batch_size=2 --checkpoint.enable --checkpoint.interval=4" \
        "--training.dataset=tokens --training.dataset_path=$TSR_TMP/data --training.sdc_check_interval=3"
}
# caught DIR NP INTERVAL BLAMED: every flip of DIR's log is caught by the check
# of a step less than INTERVAL later, in the same launch, the flipped rank named
# in an "sdc" event (blamed or not, as BLAMED says) and in the job's errors; each
# failed launch is rolled back and relaunched; prints the number of flips
caught() {
    $PY - "$TSR_TMP/$1/launch.jsonl" "$TSR_TMP/$1.log" "$3" "$4" <<'PYEOF'
import json, re, sys
es = [json.loads(l) for l in open(sys.argv[1])]
log = open(sys.argv[2]).read()
interval, blamed = int(sys.argv[3]), sys.argv[4] == "1"
flips = [e for e in es if e["event"] == "chaos"]
said = re.findall(r"^tessera train: rank (\d+): chaos: flipped bit \d+ of element \d+ of \S+ after step (\d+)$", log, re.M)
assert flips and len(said) == len(flips), "flips: %d asked, %d done" % (len(flips), len(said))
for c, (rank, step) in zip(flips, said):
    assert c["kind"] == "bitflip" and c["rank"] == int(rank), (c, rank)
    sdc = [e for e in es if e["event"] == "sdc" and e["launch"] == c["launch"]]
    mine = [e for e in sdc if e["rank"] == c["rank"]]
    assert mine, "flip not caught: %s" % c
    s = mine[0]
    assert 0 <= s["step"] - int(step) < interval, "flip after step %s caught at step %d" % (step, s["step"])
    assert s["blamed"] == blamed and s["node"] == c["node"], s
    if blamed:
        assert len(sdc) == 1 and s["agree"] == 1 and s["holders"] == 3, sdc
    else:
        assert len(sdc) == 2 and all(e["holders"] == 2 and not e["blamed"] for e in sdc), sdc
    named = "named: rank %d (host " % c["rank"] if blamed else "no majority tells which copy is right"
    assert re.search(r"^tessera train: rank \d+: step %d: silent data corruption: .*%s" % (s["step"], re.escape(named)), log, re.M), \
        "the job's log does not name it at step %d" % s["step"]
    after = [e for e in es if e["launch"] == c["launch"] and e["event"] in ("killed", "sdc_rollback", "relaunch")]
    assert [e["event"] for e in after] == ["killed", "sdc_rollback", "relaunch"], after
    assert after[0]["cause"] == "sdc" and after[1]["bad_step"] == s["step"], after
    assert after[1]["checkpoint_step"] == (s["step"] - 1) // 4 * 4, after[1]
assert not [e for e in es if e["event"] in ("rank_exit", "hang", "nan")], "another fault reported"
fin = es[-1]
assert fin["event"] == "finish" and fin["status"] == "ok" and fin["sdcs"] == len(flips) == fin["restarts"], fin
print(len(flips))
PYEOF
}

# 1. three replicas: the odd one out is named and blamed, twice
run_np 3 "$T" train $(job 6) --parallelism.data_parallel_replicate_degree=3 --job.dump_folder="$TSR_TMP/ref3" \
    >"$TSR_TMP/ref3.log" 2>&1 || fail "ref3: exit $?"
grep -q "^replica checks: 12 in [0-9.]* s" "$TSR_TMP/ref3.log" ||
    { fail "ref3: not 12 replica checks (steps 3, 4, 6, 8, 9, 12, 15, 16, 18, 20, 21, 24)"; grep "^replica" "$TSR_TMP/ref3.log" >&2; }
"$T" launch -np 3 --nodes 3 --min-ranks 2 --max-restarts 6 $FAST --chaos 5,3625,bitflip -- train $(job 6) \
    --parallelism.data_parallel_replicate_degree=3 --job.dump_folder="$TSR_TMP/flip3" >"$TSR_TMP/flip3.log" 2>&1 ||
    { fail "flip3: exit $?"; tail -n 20 "$TSR_TMP/flip3.log" >&2; }
n=$(caught flip3 3 3 1) || fail "flip3: a flip not caught, named or rolled back as it should be"
[ "$n" = 2 ] || fail "flip3: $n flip(s), the seed gives 2"
ev flip3 "e['event']=='sdc' and e['rank']==2 and e['node']==2 and e['blamed']" >/dev/null ||
    fail "flip3: rank 2 (node 2) not blamed"
grep -q "^tessera launch: node 2 failed 2 times; kept: " "$TSR_TMP/flip3.log" ||
    { fail "flip3: the second blame is not node 2's repeat failure"; grep "node" "$TSR_TMP/flip3.log" >&2; }
grep -q "^tessera launch: silent data corruption at step [0-9]*: rank 2 (node 2) holds a copy that 1 of the 3 holders" \
    "$TSR_TMP/flip3.log" || fail "flip3: the supervisor does not name rank 2"
compare ref3 flip3 0

# 1b. the same with a global batch that 2 ranks can share: after its second
# blame node 2 is dropped, with its replica (dp_replicate 3 -> 2), and the job
# finishes on 2 ranks: losses within 1e-5 of the 3-replica run (the replicas'
# gradients are summed in another order), every sample once, the last
# checkpoint verifies
run_np 3 "$T" train $(job 12) --parallelism.data_parallel_replicate_degree=3 --job.dump_folder="$TSR_TMP/ref3b" \
    >"$TSR_TMP/ref3b.log" 2>&1 || fail "ref3b: exit $?"
"$T" launch -np 3 --nodes 3 --min-ranks 2 --max-restarts 6 $FAST --chaos 5,3625,bitflip -- train $(job 12) \
    --parallelism.data_parallel_replicate_degree=3 --job.dump_folder="$TSR_TMP/drop3" >"$TSR_TMP/drop3.log" 2>&1 ||
    { fail "drop3: exit $?"; tail -n 20 "$TSR_TMP/drop3.log" >&2; }
n=$(caught drop3 3 3 1) || fail "drop3: a flip not caught, named or rolled back as it should be"
[ "$n" = 2 ] || fail "drop3: $n flip(s), the seed gives 2"
grep -q "^tessera launch: node 2 failed 2 times: dropped; the job goes on with 2 ranks, 2 replicas (dp_replicate)$" \
    "$TSR_TMP/drop3.log" || { fail "drop3: node 2 not dropped after its second blame"; grep "node" "$TSR_TMP/drop3.log" >&2; }
ev drop3 "e['event']=='node_dropped' and e['node']==2 and e['np']==2 and e.get('dp_replicate')==2" >/dev/null ||
    fail "drop3: no node_dropped event for node 2 (2 ranks, 2 replicas)"
ev drop3 "e['event']=='finish' and e['np']==2" >/dev/null || fail "drop3: the job did not finish on 2 ranks"
compare ref3b drop3 1e-5
"$T" ckpt verify "$TSR_TMP/drop3/checkpoint/step-00000024" >/dev/null 2>"$TSR_TMP/drop3.verify" ||
    { fail "drop3: the last checkpoint does not verify"; cat "$TSR_TMP/drop3.verify" >&2; }

# 2. two replicas: both holders named, none blamed
run_np 4 "$T" train $(job 8) --parallelism.data_parallel_replicate_degree=2 --job.dump_folder="$TSR_TMP/ref4" \
    >"$TSR_TMP/ref4.log" 2>&1 || fail "ref4: exit $?"
TSR_FAULT_SLOW=1:40 "$T" launch -np 4 --nodes 2 --max-restarts 3 $FAST --chaos 5,559,bitflip -- train $(job 8) \
    --parallelism.data_parallel_replicate_degree=2 --job.dump_folder="$TSR_TMP/flip4" >"$TSR_TMP/flip4.log" 2>&1 ||
    { fail "flip4: exit $?"; tail -n 20 "$TSR_TMP/flip4.log" >&2; }
n=$(caught flip4 4 3 0) || fail "flip4: a flip not caught, named or rolled back as it should be"
[ "$n" = 1 ] || fail "flip4: $n flip(s), the seed gives 1"
ev flip4 "e['event']=='sdc' and e['rank']==3 and e['node']==1 and not e['blamed']" >/dev/null ||
    fail "flip4: rank 1's replica, rank 3 (node 1), not named"
grep -q "failed 2 times" "$TSR_TMP/flip4.log" && fail "flip4: a node charged with a corruption that no majority blamed"
compare ref4 flip4 0

# 3. no copies, no check; off; tp's copies agree in a clean run
run_np 2 "$T" train $(job 8) --job.dump_folder="$TSR_TMP/none" >"$TSR_TMP/none.log" 2>&1 || fail "none: exit $?"
grep -q "^replica checks" "$TSR_TMP/none.log" && fail "none: replica checks without copies"
run_np 2 "$T" train $(job 8) --parallelism.data_parallel_replicate_degree=2 --training.sdc_check_interval=0 \
    --job.dump_folder="$TSR_TMP/off" >"$TSR_TMP/off.log" 2>&1 || fail "off: exit $?"
grep -q "^replica checks" "$TSR_TMP/off.log" && fail "off: replica checks with training.sdc_check_interval=0"
run_np 4 "$T" train $(job 8) --parallelism.data_parallel_replicate_degree=2 --parallelism.tensor_parallel_degree=2 \
    --training.local_batch_size=4 --job.dump_folder="$TSR_TMP/tp" >"$TSR_TMP/tp.log" 2>&1 || fail "tp: exit $?"
grep -q "^replica checks: 12 in" "$TSR_TMP/tp.log" || fail "tp: the replica checks did not all pass"
finish "replica check: flips caught within the interval, named, rolled back, repeat charged to the node; runs equal"
