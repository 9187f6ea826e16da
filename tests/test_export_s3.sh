#!/bin/sh
# tessera export to s3:// (written to a scratch directory under TMPDIR, then
# uploaded) against moto on loopback: config.json is uploaded last; an export
# whose upload fails part way (a proxy answers 500 or 503 to config.json's PUT)
# deletes the objects it had uploaded, so that no partial model stays there;
# an export that fails before uploading (a data file missing) uploads nothing;
# the scratch directory is removed either way.
. "$TSR_ROOT/tests/common.sh"
cd "$TSR_TMP" || exit 1
. "$TSR_ROOT/tests/s3.sh"
s3_start bkt
mkdir -p scratch
export TMPDIR="$TSR_TMP/scratch" TSR_S3_RETRY_SECONDS=5
"$T" data prep --out data --synthetic 64k >/dev/null || fail "data prep"
"$T" train --config "$TSR_ROOT/train/configs/debug.toml" --job.dump_folder=run --training.steps=1 \
    --training.seq_len=32 --training.dataset=tokens --training.dataset_path=data --checkpoint.enable=true \
    --checkpoint.interval=1 --checkpoint.last_save_model_only=true >train.log 2>&1 || { fail "train"; tail -5 train.log >&2; }
A=run/checkpoint/model-step-00000001

keys() { # PREFIX: the keys under it, straight from moto
    "$S3_PY" - "$1" <<'PYEOF'
import os, sys, boto3
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")
r = s3.list_objects_v2(Bucket="bkt", Prefix=sys.argv[1])
print(" ".join(sorted(o["Key"] for o in r.get("Contents", []))))
PYEOF
}
no_scratch() { [ -z "$(ls -A scratch)" ] || fail "$1: left in TMPDIR: $(ls -A scratch | tr '\n' ' ')"; }

# a sharded export, uploaded in full: config.json is the last PUT
proxy_start
AWS_ENDPOINT_URL=$PROXY_URL expect 0 "export to s3" "$T" export "$A" --format safetensors s3://bkt/ok/ --shard-size 1M
proxy_stop
got=$(keys ok/)
want="ok/config.json ok/model-00001-of-00004.safetensors ok/model-00002-of-00004.safetensors ok/model-00003-of-00004.safetensors ok/model-00004-of-00004.safetensors ok/model.safetensors.index.json ok/special_tokens_map.json ok/tokenizer.json ok/tokenizer_config.json"
[ "$got" = "$want" ] || fail "export to s3: keys '$got', want '$want'"
last=$(grep ' PUT ' "$PROXY_LOG" | grep -v '^#' | sort -n | tail -1)
case "$last" in *"/ok/config.json "*) ;; *) fail "config.json was not the last upload: $last";; esac
no_scratch "export to s3"

# the upload of config.json fails (no retries): what was uploaded is deleted again
proxy_start --fail-rate 1 --only-method PUT --only-path 'config[.]json'
AWS_ENDPOINT_URL=$PROXY_URL TSR_S3_MAX_ATTEMPTS=1 expect 1 "export to s3, an upload failing" \
    "$T" export "$A" --format safetensors s3://bkt/bad/ --shard-size 1M
proxy_stop
grep -q "config.json" err.txt || { fail "the failed upload is not named"; sed 's/^/    /' err.txt >&2; }
got=$(keys bad/)
[ -z "$got" ] || fail "a failed upload left: $got"
no_scratch "export to s3, an upload failing"

# a data file missing: nothing is uploaded
expect 0 "reshard to two files" "$T" reshard "$A" M --layout dp_shard=2
rm -f M/data-00001.tsd
expect 1 "export to s3 of a checkpoint missing a data file" "$T" export M --format safetensors s3://bkt/miss/
grep -q "data-00001.tsd" err.txt || fail "the missing data file is not named"
expect 1 "gguf export to s3 of a checkpoint missing a data file" "$T" export M --format gguf s3://bkt/miss/m.gguf
got=$(keys miss/)
[ -z "$got" ] || fail "a failed export uploaded: $got"
no_scratch "export to s3 of a checkpoint missing a data file"
finish "export s3: config.json last, a failed upload deletes what it uploaded, nothing of a failed export"
