#!/bin/sh
# tsr-timeout: 900
# test_dcp.sh: PyTorch Distributed Checkpoint (DCP) on tessera, with real DCP,
# DTensors and FSDP2 (fully_shard) on processes of the gloo backend on loopback
# (tests/dcp_check.py: the state, and the checks of every value):
#   - the storage plug-in (python/tessera/dcp.py): dcp.save through
#     tessera.dcp.Writer on 2 processes, checked by `tessera ckpt verify`, loaded
#     through tessera.dcp.Reader on 4 (a 2 x 2 mesh); dcp.async_save on 4, loaded
#     on 1 (no process group); the model of a checkpoint of `tessera train` on 2
#     ranks (tp=2) loaded into DTensors on 4 processes, the trainer's blob as bytes;
#     a checkpoint saved by PyTorch through the plug-in with TorchTitan's names
#     (DTensors on 2 processes, optimizer.state.NAME.exp_avg, train_state.step)
#     resumed by tessera train: the next steps bitwise those of the run whose
#     state it holds; the model alone without the optimizer's state;
#   - the conversions: checkpoints saved by DCP's own FileSystemWriter on 2 and 4
#     processes, `tessera import --from dcp`, verified, loaded through the plug-in
#     in another world size (sharded on another dim), `tessera export --format
#     dcp` back, and loaded by DCP's FileSystemReader on 1 or 2: every value equal;
#   - TorchTitan's own CheckpointManager (torchtitan from PyPI) and tessera's
#     (tessera.titan): TorchTitan's DCP save imported, resumed by tessera.titan
#     on 4 processes and 2, exported back and loaded by TorchTitan's manager;
#   - in a bucket (moto): the plug-in's save on 2 and load on 4, an import into
#     the bucket and an export from it, read back by DCP; make bench's S3
#     comparison (DCP with s3torchconnector beside the plug-in) on tiny states;
#   - bad input: a state dict key tessera cannot name (the save fails naming
#     it, nothing committed), a damaged data file (the load fails naming the
#     file and the checksum); the conversions' usage errors, a DCP folder that is
#     not one, an interpreter that is not there;
#   - in one process: a partial load (strict=False, what it skipped); the writer's
#     codec (bytegroup: bf16 in under 0.8x its bytes, read back the same into a
#     contiguous and a strided destination; a codec that is none refused).
. "$TSR_ROOT/tests/common.sh"
cd "${TSR_TMP:?}" || exit 1
need_py
export TSR_PYTHON="$TSR_PY"
chk() { # MODE WORLD LAYOUT PATH
    with_lib "$TSR_PY" "$TSR_ROOT/tests/dcp_check.py" "$1" "$2" "$3" "$4" 0 >out.txt 2>&1 ||
        { fail "dcp_check.py $*"; tail -n 20 out.txt >&2; }
    tail -n 1 out.txt
}
tsr() { with_lib "$T" "$@"; }

# the plug-in
chk save 2 fsdp "$TSR_TMP/p2/step-00000007"
expect 0 "a checkpoint written through the plug-in verifies" tsr ckpt verify p2/step-00000007
[ -f p2/step-00000007/data-00000.tsd ] && [ -f p2/step-00000007/data-00001.tsd ] ||
    fail "the plug-in on 2 processes: not a data file of each rank"
chk load 4 2d "$TSR_TMP/p2"
chk async 4 2d "$TSR_TMP/p4/step-00000003"
expect 0 "a checkpoint of dcp.async_save verifies" tsr ckpt verify p4/step-00000003
chk load 1 fsdp "$TSR_TMP/p4/step-00000003"

# a checkpoint of tessera train (2 ranks, tp=2) into DTensors of PyTorch on 4 processes
"$T" data prep --out data --synthetic 64k >/dev/null || fail "data prep"
. "$TSR_ROOT/tests/mpi.sh"
train() { # DIR [ARGS]: 4 steps of the debug model on 2 ranks (tp=2), saved every 2
    d=$1; shift
    run_np 2 "$T" train --config "$TSR_ROOT/train/configs/debug.toml" --job.dump_folder="$d" --training.steps=4 \
        --training.seq_len=32 --training.dataset=tokens --training.dataset_path=data --checkpoint.enable=true \
        --checkpoint.interval=2 --checkpoint.last_save_model_only=false --parallelism.tensor_parallel_degree=2 \
        --metrics.log_freq=1 "$@" >"$d.log" 2>&1 || { fail "tessera train in $d"; tail -5 "$d.log" >&2; }
}
losses() { grep -o '"step": [34], "loss": [^,]*' "$1/metrics.jsonl"; }
train trained
chk trained 4 2d "$TSR_TMP/trained/checkpoint"
# TorchTitan's trainer going on from it: tessera.titan's manager loads step 2
# whole on 2 processes (FSDP2), AdamW's count, param groups and schedule from
# the trainer's blobs, and takes a step
chk fromtrainer 2 - "$TSR_TMP/trained/checkpoint"

# a checkpoint saved by PyTorch through the plug-in, TorchTitan's names (step 2
# of that run as a TorchTitan state on 2 processes), resumed by tessera train:
# steps 3 and 4 bitwise those of the run that saved it; without the optimizer's
# state (checkpoint.initial_load_path), the model alone, from step 1
chk titan 2 fsdp "$TSR_TMP/trained/checkpoint/step-00000002,$TSR_TMP/pt/checkpoint/step-00000002"
expect 0 "the PyTorch save verifies" tsr ckpt verify pt/checkpoint/step-00000002
train pt
grep -q "resumed from .*step-00000002 (the durable tier, step 2, .*PyTorch's names: the data position from the step" \
    pt.log || { fail "not resumed from PyTorch's step 2"; grep -i "resum\|error" pt.log >&2; }
[ -n "$(losses trained)" ] && [ "$(losses pt)" = "$(losses trained)" ] ||
    fail "steps 3 and 4 after PyTorch's checkpoint: $(losses pt), not those of the run that saved it: $(losses trained)"
chk titan 2 model "$TSR_TMP/trained/checkpoint/step-00000002,$TSR_TMP/ptm0/step-00000002"
train ptm --checkpoint.initial_load_path="$TSR_TMP/ptm0/step-00000002"
grep -q "resumed from .*ptm0/step-00000002 (the durable tier, step 0, .*PyTorch's names: no optimizer state in it, model only" ptm.log ||
    { fail "the model alone of PyTorch's checkpoint"; grep -i "resum\|error" ptm.log >&2; }

# the conversions, from DCP's own folders of 2 and 4 processes and back
for w in 2 4; do
    lay=fsdp other=4 back=1; [ $w = 4 ] && lay=2d other=2 back=2
    chk dcpsave $w $lay "$TSR_TMP/titan$w/step-40"
    expect 0 "import --from dcp of $w processes" tsr import --from dcp titan$w/step-40 imp$w/step-00000040
    grep -q "imported titan$w/step-40: 29 tensors" out.txt || fail "import of $w: $(cat out.txt)"
    expect 0 "the import of $w processes verifies" tsr ckpt verify imp$w/step-00000040
    chk load $other tp "$TSR_TMP/imp$w"
    expect 0 "export --format dcp of the import of $w" tsr export imp$w --format dcp back$w --threads 2
    [ -f back$w/.metadata ] || fail "export of $w: no .metadata"
    chk dcpload $back fsdp "$TSR_TMP/back$w"
done

# TorchTitan's own checkpoint manager (the torchtitan package; its AdamW and lr
# schedule over an FSDP2 module): its DCP save on 2 processes imported; tessera's
# manager (tessera.titan) resumes it on 4 (async saves through the plug-in) and
# that on 2; the last exported to a DCP folder that TorchTitan's stock manager
# loads on 4. Every load: the model, the moments, AdamW's and the schedule's
# steps and the train state equal to what the saving processes held
chk ttsave 2 - "$TSR_TMP/tt/checkpoint,$TSR_TMP/tt3.pt"
expect 0 "import of TorchTitan's step 3" tsr import --from dcp tt/checkpoint/step-3 ttt/step-00000003
expect 0 "TorchTitan's step 3 imported verifies" tsr ckpt verify ttt/step-00000003
chk ttplug 4 async "$TSR_TMP/ttt,$TSR_TMP/tt3.pt,$TSR_TMP/tt4.pt"
expect 0 "tessera.titan's async save verifies" tsr ckpt verify ttt/step-00000004
# keep_latest_k = 2 counts committed steps: the save of 5 removes 3 and a step
# directory older than 5 that was never committed (a save that died), not a
# newer one (a save in flight, as far as any manager can tell), which no load
# takes either
mkdir ttt/step-00000002 ttt/step-00000009
chk ttplug 2 disabled "$TSR_TMP/ttt,$TSR_TMP/tt4.pt,$TSR_TMP/tt5.pt"
[ "$(ls ttt | tr '\n' ' ')" = "step-00000004 step-00000005 step-00000009 " ] ||
    fail "tessera.titan's keep_latest_k = 2: $(ls ttt)"
expect 0 "export of tessera.titan's step 5 for TorchTitan" tsr export ttt --format dcp ttb/checkpoint/step-5
chk ttload 4 - "$TSR_TMP/ttb/checkpoint,$TSR_TMP/tt5.pt"

# object storage (moto on loopback): the plug-in saves on 2 processes into a
# bucket and loads on 4; a DCP folder imported into the bucket, verified there,
# and exported from it back to a DCP folder that DCP reads
. "$TSR_ROOT/tests/s3.sh"
s3_start bkt
chk save 2 fsdp s3://bkt/p/step-00000007
expect 0 "the plug-in's save in a bucket verifies" tsr ckpt verify s3://bkt/p/step-00000007
chk load 4 2d s3://bkt/p
# one process loads it all through a proxy that logs each request, and reads
# it again through tessera.open (read_many): the frames of a data file that
# follow each other come in one GET, not one a frame: at most 7 GETs of a file
# (its header and a run of frames or two, for each of the two, and one for its
# blobs, which the plug-in writes together), where the file holds a dozen
# chunks and more; then every blob at once (read_blobs) in a new process: a
# GET of a file's header and one of its blobs, however many
proxy_start
direct=$AWS_ENDPOINT_URL AWS_ENDPOINT_URL=$PROXY_URL
chk load 1 fsdp s3://bkt/p
seen=$(wc -l <"$PROXY_LOG")
with_lib "$TSR_PY" -c 'import sys, tessera
with tessera.open(sys.argv[1]) as ck:
    assert len(ck.read_blobs(ck.blobs)) == len(ck.blobs) >= 7' s3://bkt/p/step-00000007 ||
    fail "read_blobs of every blob in the bucket's step 7"
AWS_ENDPOINT_URL=$direct
tsr ckpt info s3://bkt/p/step-00000007 >info.txt || fail "ckpt info of the bucket's step 7"
for f in data-00000 data-00001; do
    gets=$(grep -c "^[0-9]* GET /bkt/p/step-00000007/$f.tsd " "$PROXY_LOG")
    blob_gets=$(sed "1,${seen}d" "$PROXY_LOG" | grep -c "^[0-9]* GET /bkt/p/step-00000007/$f.tsd ")
    chunks=$(grep -c "^[^ ].* $f  *\[" info.txt)
    blobs=$(grep -c " global .* $f\$" info.txt)
    [ "$chunks" -ge 12 ] && [ "$gets" -ge 2 ] && [ "$gets" -le $((blob_gets + 7)) ] ||
        fail "a load on 1 process from the bucket: $((gets - blob_gets)) GETs of $f.tsd, which holds $chunks chunks and $blobs blobs"
    [ "$blob_gets" -le $((blobs ? 2 : 0)) ] ||
        fail "read_blobs: $blob_gets GETs of $f.tsd for its $blobs blobs, more than its header and one"
done
expect 0 "import --from dcp into a bucket" tsr import --from dcp titan2/step-40 s3://bkt/imp/step-00000040
expect 0 "the import in the bucket verifies" tsr ckpt verify s3://bkt/imp/step-00000040
expect 0 "export --format dcp from a bucket" tsr export s3://bkt/imp/step-00000040 --format dcp backs3
chk dcpload 2 fsdp "$TSR_TMP/backs3"
# the S3 comparison of make bench, on tiny states: DCP with s3torchconnector and
# the plug-in, 2 processes, saving through s3proxy.py --etag-header
# (s3torchconnector's client wants CompleteMultipartUpload's ETag as a header),
# loading straight from the server, every load's values checked by the script
proxy_start --etag-header
with_lib env AWS_ENDPOINT_URL="$PROXY_URL" S3_LOAD_ENDPOINT="$AWS_ENDPOINT_URL" "$TSR_PY" "$TSR_ROOT/tools/bench_dcp.py" --s3 s3://bkt/bench 2 --smoke \
    >bench.txt 2>&1 || { fail "bench_dcp.py --s3 --smoke"; tail -n 20 bench.txt >&2; }
[ "$(grep -c '^s3 .*DCP with s3torchconnector .*, tessera ' bench.txt)" = 3 ] || fail "bench_dcp.py --s3: $(tail -3 bench.txt)"
proxy_stop
grep -q "etag_added=[1-9]" "$PROXY_LOG" || fail "s3proxy.py --etag-header added no ETag: $(tail -1 "$PROXY_LOG")"
s3_stop

# usage and bad input: a key tessera cannot name, a damaged data file
chk errors 1 - "$TSR_TMP/errs"
expect 2 "import --from another" tsr import --from xyz a b
expect 2 "import --from dcp --layout" tsr import --from dcp a b --layout tp=2
expect 2 "export --format dcp --dtype" tsr export imp2 --format dcp x --dtype bf16
expect 2 "export --threads without dcp" tsr export imp2 --format gguf x.gguf --threads 2
expect 1 "import of a folder that is no DCP checkpoint" tsr import --from dcp p2 nowhere
grep -q "p2: not a DCP checkpoint folder" err.txt || fail "import of no DCP folder: $(cat err.txt)"
[ ! -e nowhere ] || fail "a failed import left nowhere/"
env TSR_PYTHON=/nonexistent/python sh -c '"$0" import --from dcp titan2/step-40 x >out.txt 2>err.txt' "$T"
grep -q "cannot run /nonexistent/python (TSR_PYTHON)" err.txt || fail "a missing interpreter: $(cat err.txt)"
finish "dcp: the plug-in on 1, 2 and 4 processes (save, async_save, load resharded), DCP folders of 2 and 4 processes imported and exported back, TorchTitan's checkpoint manager and tessera.titan across them, values equal"
