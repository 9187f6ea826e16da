#!/bin/sh
# Object storage against a real S3-compatible server on loopback, every request's
# signature checked: moto, or Ceph's RADOS Gateway with S3_SERVER=rgw (test_s3_rgw).
# On both: push / pull / ls / rm round trips, byte-identical, with multipart and
# single-PUT objects; raw frames encoded by push (a training checkpoint's f32 state
# to at most 0.85x its raw bytes in the bucket, bf16 to 0.7x; same values and raw
# checksums once pulled); AWS CLI interop both ways; a wrong secret and a missing
# bucket; direct loads and saves from and to the bucket in other layouts; a push
# killed midway and resumed without re-sending finished parts; archiving from the
# trainer (encoded too); a signed payload hash and Content-Type on every upload; a part altered in
# transit (RGW refuses it and the push sends it again; moto keeps it and pull refuses it).
# On moto only (the client's behaviour, whatever the server): faults from a proxy
# (500/503, resets, stalls; 429 retried; 403 and 400 not retried, each request
# counted; a 200 answer carrying an error; a failed multipart upload aborted;
# bytes altered in a download refused by pull).
# tsr-timeout: 900
. "$TSR_ROOT/tests/mpi.sh"
cd "$TSR_TMP" || exit 1
. "$TSR_ROOT/tests/s3.sh"
command -v aws >/dev/null || { echo "FAIL: the AWS CLI (aws) is not on PATH" >&2; exit 1; }
s3_start bkt
export TSR_S3_PART_SIZE=5M TSR_S3_MAX_ATTEMPTS=12 TSR_S3_RETRY_SECONDS=120
B=s3://bkt

# two committed checkpoints: step 10 in multipart objects (about 10 MiB per file),
# step 20 in single-PUT objects; and an uncommitted step 30. Their frames are all
# encoded (--codec bytegroup): push sends such files as they are, byte for byte
# (raw frames are encoded on the way: below)
run_np 2 "$T" ckpt synth ck/step-00000010 --layout dp_shard=2 --bytes 32M --dtype bf16 --codec bytegroup >/dev/null ||
    fail "synth 10"
run_np 2 "$T" ckpt synth ck/step-00000020 --layout tp=2 --bytes 2M --codec bytegroup >/dev/null || fail "synth 20"
mkdir -p ck/step-00000030 && echo partial > ck/step-00000030/data-00000.tsd

# --- round trips
expect 0 "push a root" "$T" push ck $B/run1/
grep -q "step-00000030: not committed, skipped" err.txt || fail "push did not say it skipped the uncommitted step"
expect 0 "ls" "$T" ls $B/run1/
[ "$(grep -c committed out.txt)" = 2 ] || { fail "ls: expected 2 committed steps"; cat out.txt >&2; }
TSR_S3_MAX_KEYS=1 expect 0 "ls, one key per page (continuation tokens)" "$T" ls $B/run1/
[ "$(grep -c committed out.txt)" = 2 ] || { fail "ls with pages of one key: expected 2 committed steps"; cat out.txt >&2; }
expect 0 "pull step 10" "$T" pull $B/run1/step-00000010 out10
expect 0 "ckpt diff after the round trip" "$T" ckpt diff ck/step-00000010 out10
grep -q "no differences" out.txt || fail "ckpt diff found differences"
for f in MANIFEST data-00000.tsd data-00001.tsd; do
    cmp -s ck/step-00000010/$f out10/$f || fail "pulled $f differs"
done
expect 0 "pull a root" "$T" pull $B/run1/ all
for s in 10 20; do
    for f in ck/step-000000$s/*; do cmp -s "$f" "all/step-000000$s/${f##*/}" || fail "root pull: $f differs"; done
done
[ -e all/step-00000030 ] && fail "the uncommitted step was pushed"
expect 1 "pull into a checkpoint" "$T" pull $B/run1/step-00000010 out10
grep -q "already holds a committed checkpoint" err.txt || fail "pull over a checkpoint: unclear error"
# a pulled step counts only once verified: a tensor whose data is not what its
# digest records (every frame's checksum intact) is refused by name, and the
# step is left uncommitted
cp -r ck/step-00000020 bad20 && python3 "$TSR_ROOT/tests/set_digest.py" bad20 model.layers.0.w 0123456789abcdef >/dev/null ||
    fail "set_digest"
expect 0 "push a checkpoint whose digest is wrong" "$T" push bad20 $B/bad/
expect 1 "pull a checkpoint whose digest is wrong" "$T" pull $B/bad/bad20 bad20pulled
grep -q "model.layers.0.w" err.txt && grep -q "left uncommitted" err.txt ||
    { fail "pull of a wrong digest: the tensor is not named"; cat err.txt >&2; }
[ -e bad20pulled/MANIFEST ] && fail "pull of a wrong digest: the step was committed"

# pushing again sends nothing
expect 0 "push again" "$T" push ck $B/run1/ --json
grep -q '"parts_sent":0,' out.txt || { fail "a second push sent parts again"; cat out.txt >&2; }

# --- the AWS CLI reads what tessera wrote, and tessera what the AWS CLI wrote
aws s3 cp --quiet $B/run1/step-00000010/data-00001.tsd cli-copy.tsd || fail "aws s3 cp from the bucket"
cmp -s cli-copy.tsd ck/step-00000010/data-00001.tsd || fail "aws s3 cp: the object tessera wrote differs"
aws s3 cp --quiet --recursive ck/step-00000010 $B/bycli/step-00000010 || fail "aws s3 cp to the bucket"
expect 0 "verify what the AWS CLI wrote" "$T" ckpt verify $B/bycli/step-00000010
expect 0 "pull what the AWS CLI wrote" "$T" pull $B/bycli/step-00000010 fromcli
for f in ck/step-00000010/*; do cmp -s "$f" "fromcli/${f##*/}" || fail "pull of the AWS CLI's $f differs"; done

# --- virtual-hosted addressing (bkt.localhost: curl resolves *.localhost to loopback)
AWS_ENDPOINT_URL=http://localhost:$S3_PORT TSR_S3_ADDRESSING=virtual expect 0 "virtual-hosted pull" \
    "$T" pull $B/run1/step-00000020 vhost
for f in ck/step-00000020/*; do cmp -s "$f" "vhost/${f##*/}" || fail "virtual-hosted pull: $f differs"; done

# --- a profile in the AWS files instead of the environment
printf '[other]\naws_access_key_id = nobody\naws_secret_access_key = nothing\n[arch]\naws_access_key_id = %s\naws_secret_access_key = %s\n' \
    "$AWS_ACCESS_KEY_ID" "$AWS_SECRET_ACCESS_KEY" > creds
printf '[profile arch]\nregion = us-east-1\nendpoint_url = %s\ns3 =\n    addressing_style = path\n' "$AWS_ENDPOINT_URL" > config
env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY -u AWS_ENDPOINT_URL -u AWS_REGION -u AWS_DEFAULT_REGION \
    AWS_PROFILE=arch AWS_SHARED_CREDENTIALS_FILE=creds AWS_CONFIG_FILE=config "$T" ls $B/run1/ >out.txt 2>err.txt ||
    { fail "ls with a profile"; cat err.txt >&2; }
[ "$(grep -c committed out.txt)" = 2 ] || fail "ls with a profile: expected 2 committed steps"

# --- a wrong secret: a clear authentication error, no secret printed
good=$AWS_SECRET_ACCESS_KEY
AWS_SECRET_ACCESS_KEY=wrong-$good expect 1 "pull with a wrong secret" "$T" pull $B/run1/step-00000020 bad
grep -q "SignatureDoesNotMatch" err.txt || { fail "a wrong secret: no SignatureDoesNotMatch"; cat err.txt >&2; }
grep -q -e "$good" err.txt && fail "the secret was printed"
[ -e bad/MANIFEST ] && fail "a failed pull left a MANIFEST"
expect 1 "pull from a bucket that does not exist" "$T" pull s3://no-such-bucket/run1/step-00000020 nob
grep -q "no-such-bucket.*NoSuchBucket" err.txt || { fail "a missing bucket: unclear error"; cat err.txt >&2; }
[ -e nob/MANIFEST ] && fail "a pull from a missing bucket left a MANIFEST"
expect 1 "push to a bucket that does not exist" "$T" push ck/step-00000020 s3://no-such-bucket/run1/
grep -q "no-such-bucket.*NoSuchBucket" err.txt || { fail "push to a missing bucket: unclear error"; cat err.txt >&2; }
AWS_ACCESS_KEY_ID= AWS_SECRET_ACCESS_KEY= expect 1 "no credentials" "$T" ls $B/run1/
grep -q "no credentials" err.txt || fail "missing credentials: unclear error"
AWS_ENDPOINT_URL=http://127.0.0.1:1 TSR_S3_MAX_ATTEMPTS=2 expect 1 "no server" "$T" pull $B/run1/step-00000020 bad
grep -qi "connect" err.txt || fail "no server: unclear error"

# --- direct loads and saves, in other layouts
expect 0 "verify in the bucket" "$T" ckpt verify $B/run1/step-00000010
run_np 3 "$T" ckpt check $B/run1/step-00000010 --layout dp_shard=3 >out.txt 2>err.txt || fail "check from the bucket on 3 ranks"
run_np 2 "$T" ckpt check $B/run1/step-00000020 --layout dp_shard=2 >out.txt 2>err.txt || fail "check step 20 on 2 ranks"
run_np 4 "$T" ckpt synth $B/direct/step-00000005 --layout dp_shard=2,tp=2 --bytes 24M >/dev/null 2>err.txt ||
    { fail "synth straight into the bucket"; cat err.txt >&2; }
run_np 1 "$T" ckpt check $B/direct/step-00000005 --layout dp_shard=1 >/dev/null 2>err.txt || fail "check of a direct save"
expect 0 "reshard from the bucket" "$T" reshard $B/direct/step-00000005 rs --layout dp_shard=3
run_np 3 "$T" ckpt check rs --layout dp_shard=3 >/dev/null 2>&1 || fail "check of a reshard from the bucket"
expect 0 "reshard into the bucket" "$T" reshard rs $B/rs2/step-00000001 --layout dp_shard=2
run_np 2 "$T" ckpt check $B/rs2/step-00000001 --layout dp_shard=2 >/dev/null 2>&1 || fail "check of a reshard into the bucket"
# export straight to the bucket: the files equal a local export's
"$T" train --config "$TSR_ROOT/train/configs/debug.toml" --job.dump_folder=m --training.steps=2 \
    --checkpoint.enable --checkpoint.interval=2 --checkpoint.last_save_model_only=false >/dev/null 2>&1 || fail "train m"
expect 0 "export to the bucket" "$T" export m/checkpoint/step-00000002 --format safetensors $B/hf/
expect 0 "export gguf to the bucket" "$T" export m/checkpoint/step-00000002 --format gguf $B/gguf/m.gguf
"$T" export m/checkpoint/step-00000002 --format safetensors hf >/dev/null || fail "local export"
"$T" export m/checkpoint/step-00000002 --format gguf m.gguf >/dev/null || fail "local gguf export"
aws s3 cp --quiet --recursive $B/hf/ hf-from-s3 && aws s3 cp --quiet $B/gguf/m.gguf m-from-s3.gguf ||
    fail "aws s3 cp of the exports"
for f in config.json model.safetensors; do cmp -s hf/$f hf-from-s3/$f || fail "exported $f differs"; done
cmp -s m.gguf m-from-s3.gguf || fail "exported gguf differs"
# --- raw frames are encoded on the way up: a training checkpoint (m above, f32
# state saved raw) and a synthetic bf16 one stored raw take at most 0.85x and 0.7x
# their raw bytes in the bucket; pull gives back a checkpoint that verifies, with
# the same values and raw checksums; a second push sends nothing
"$T" ckpt synth rawbf/step-00000003 --bytes 12M --codec raw --step 3 >/dev/null || fail "synth raw bf16"
frames() { # DIR: "tensor raw_size raw_hash codec" of each frame
    "$T" ckpt info "$1" --json | /usr/bin/python3 -c '
import json, sys
for t in json.load(sys.stdin)["tensors"]:
    for c in t["chunks"]:
        for f in c["frames"]:
            print(t["name"], f["raw_size"], f["raw_hash"], f["codec"])'
}
for c in m/checkpoint/step-00000002:f32:0.85 rawbf/step-00000003:bf16:0.7; do
    d=${c%%:*} goal=${c##*:} dt=${c#*:} name=$(basename "${c%%:*}")
    dt=${dt%:*}
    frames "$d" >local.frames
    grep -q " raw$" local.frames || fail "$d: no raw frame to encode"
    expect 0 "push of the raw $d" "$T" push "$d" $B/enc/ --json
    grep -q '"files_reencoded":[1-9]' out.txt || fail "push of $d re-encoded no file: $(cat out.txt)"
    total=$(aws s3 ls --recursive --summarize $B/enc/$name/ | sed -n 's/.*Total Size: //p')
    raw=$("$T" ckpt ls "$(dirname "$d")" --json | sed -n "s/.*\"dir\":\"$name\",[^}]*\"raw_bytes\":\([0-9]*\).*/\1/p")
    awk -v t="$total" -v r="$raw" -v g="$goal" -v dt="$dt" 'BEGIN {
        printf "push of a raw %s checkpoint: %d bytes in the bucket, %.3f of its %d raw bytes (goal <= %s)\n", dt, t, t / r, r, g
        exit !(r > 0 && t / r <= g) }' || fail "push of $d: the bucket holds more than $goal of the raw bytes"
    expect 0 "pull of the encoded $d" "$T" pull $B/enc/$name enc-$name
    expect 0 "verify the pulled $name" "$T" ckpt verify enc-$name
    expect 0 "diff the pulled $name" "$T" ckpt diff "$d" enc-$name
    frames enc-$name >pulled.frames
    cut -d' ' -f1-3 local.frames >a && cut -d' ' -f1-3 pulled.frames >b && cmp -s a b || fail "$name: raw sizes or checksums changed"
    grep -q " raw$" pulled.frames && [ "$(grep -c " raw$" pulled.frames)" -ge "$(grep -c " raw$" local.frames)" ] &&
        fail "$name: the pulled copy has as many raw frames as the local one"
    expect 0 "push of $d again" "$T" push "$d" $B/enc/ --json
    grep -q '"parts_sent":0,.*"files_reencoded":0,' out.txt || fail "a second push of $d sent something: $(cat out.txt)"
done
expect 0 "rm" "$T" rm $B/direct/step-00000005
# a checkpoint that is not there: said, exit 1, not "removed"
expect 1 "rm of a checkpoint that does not exist" "$T" rm $B/direct/step-00000005
grep -q "step-00000005: no such checkpoint" err.txt && ! grep -q removed out.txt ||
    fail "rm of a missing checkpoint: $(cat out.txt err.txt)"
[ -z "$(aws s3 ls --recursive $B/direct/)" ] || fail "rm left objects"

# what the last proxy counted and logged
counted() { # key: its count in the last proxy's "# summary" line (empty if none)
    sed -n "s/^# summary.* $1=\([0-9][0-9]*\).*/\1/p" "$PROXY_LOG"
}
seen() { # method, target pattern: requests the last proxy logged
    grep -c "^[0-9]* $1 [^ ]*$2[^ ]* fault=" "$PROXY_LOG"
}

if [ "$S3_SERVER" = moto ]; then
# --- the engine's load from a bucket reads the frames it needs that follow each
# other in a data file in one ranged GET: a checkpoint of 256 KiB frames (64 in
# each of its 2 files, 8 chunks of 8 frames) loaded on 3 ranks through a proxy
# that logs each request. A GET a frame would be 70 to 80 GETs a file (each
# file is read by 2 ranks); runs of frames make 2 ranks x (a header and a run a
# chunk) = 18: at most 3 a chunk of the file, whatever the frames' order
run_np 2 "$T" ckpt synth fr/step-00000001 --layout dp_shard=2 --bytes 32M --dtype bf16 --frame-bytes 256K \
    >/dev/null || fail "synth of 256 KiB frames"
expect 0 "push of 256 KiB frames" "$T" push fr/step-00000001 $B/frames/
proxy_start
AWS_ENDPOINT_URL=$PROXY_URL run_np 3 "$T" ckpt check $B/frames/step-00000001 --layout dp_shard=3 >/dev/null 2>err.txt ||
    { fail "check of 256 KiB frames from the bucket on 3 ranks"; cat err.txt >&2; }
proxy_stop
"$T" ckpt info fr/step-00000001 --json >info.json || fail "ckpt info --json of 256 KiB frames"
for f in 0 1; do
    set -- $(/usr/bin/python3 -c '
import json, sys
cs = [c for t in json.load(open("info.json"))["tensors"] for c in t["chunks"] if c["file_id"] == int(sys.argv[1])]
print(len(cs), sum(len(c["frames"]) for c in cs))' $f)
    gets=$(seen GET "frames/step-00000001/data-0000$f.tsd")
    [ "$2" -ge $((6 * $1)) ] && [ "$gets" -le $((3 * $1)) ] ||
        fail "the engine's load of data-0000$f.tsd ($1 chunks, $2 frames) took $gets GETs, over 3 a chunk"
done
# --- faults: 500/503, resets and stalls on a share of requests
proxy_start --fail-rate 0.15 --reset-rate 0.1 --stall-rate 0.05 --stall-seconds 3 --seed 11
TSR_S3_STALL_SECONDS=1 expect 0 "push through faults" "$T" push ck $B/faulty/ --endpoint "$PROXY_URL"
TSR_S3_STALL_SECONDS=1 expect 0 "pull through faults" "$T" pull $B/faulty/step-00000010 pulled-faulty --endpoint "$PROXY_URL"
for f in ck/step-00000010/*; do cmp -s "$f" "pulled-faulty/${f##*/}" || fail "faulty round trip: $f differs"; done
AWS_ENDPOINT_URL=$PROXY_URL TSR_S3_STALL_SECONDS=1 run_np 3 "$T" ckpt check $B/faulty/step-00000010 \
    --layout dp_shard=3 >/dev/null 2>err.txt || { fail "check through faults"; cat err.txt >&2; }
proxy_stop
# the counts in the summary line: each kind of fault happened at least once
[ -n "$(counted requests)" ] || fail "the proxy wrote no summary line: $(tail -n 2 "$PROXY_LOG")"
f500=$(counted fail500) f503=$(counted fail503)
[ $(( ${f500:-0} + ${f503:-0} )) -ge 1 ] || fail "the proxy answered no 500 or 503 (fail500=$f500 fail503=$f503)"
for k in reset stall; do
    [ "$(counted $k)" -ge 1 ] 2>/dev/null || fail "the proxy injected no $k ($k=$(counted $k))"
done

# --- single faults, each request counted in the proxy's log (lines "SEQ METHOD
# TARGET fault=... status=..."): which answers are retried and which are not
# 429 Too Many Requests is retried: two of them, then the object comes
proxy_start --inject 429:SlowDown --inject-count 2 --only-method GET --only-path 'run1/step-00000020/data-00000.tsd$'
expect 0 "pull through two 429 answers" "$T" pull $B/run1/step-00000020 p429 --endpoint "$PROXY_URL"
proxy_stop
for f in ck/step-00000020/*; do cmp -s "$f" "p429/${f##*/}" || fail "pull through 429: $f differs"; done
[ "$(counted injected)" = 2 ] || fail "429: the proxy answered $(counted injected) times, expected 2"
[ "$(seen GET 'step-00000020/data-00000.tsd')" = 3 ] ||
    fail "429: $(seen GET 'step-00000020/data-00000.tsd') GETs of the object, expected 3 (2 refused, 1 retry that got it)"
# 403 AccessDenied and 400 InvalidRequest fail at once: exactly one request each
proxy_start --inject 403:AccessDenied --inject-count 0 --only-method GET --only-path 'run1/step-00000020/data-00000.tsd$'
expect 1 "pull through 403 answers" "$T" pull $B/run1/step-00000020 p403 --endpoint "$PROXY_URL"
proxy_stop
grep -q "data-00000.tsd: GET: HTTP 403 AccessDenied" err.txt || { fail "403: unclear error"; cat err.txt >&2; }
[ "$(seen GET 'step-00000020/data-00000.tsd')" = 1 ] ||
    fail "403 was retried: $(seen GET 'step-00000020/data-00000.tsd') GETs of the object, expected 1"
[ -e p403/MANIFEST ] && fail "a pull refused with 403 left a MANIFEST"
proxy_start --inject 400:InvalidRequest --inject-count 0 --only-method PUT --only-path 'step-00000020/data-00000.tsd$'
expect 1 "push through 400 answers" "$T" push ck/step-00000020 $B/p400/ --endpoint "$PROXY_URL"
proxy_stop
grep -q "data-00000.tsd: PUT: HTTP 400 InvalidRequest" err.txt || { fail "400: unclear error"; cat err.txt >&2; }
[ "$(seen PUT 'step-00000020/data-00000.tsd')" = 1 ] ||
    fail "400 was retried: $(seen PUT 'step-00000020/data-00000.tsd') PUTs of the object, expected 1"
[ -z "$(aws s3 ls --recursive $B/p400/)" ] || fail "a push refused with 400 left objects"
# ... but 400 BadDigest (the body did not match its signed hash: altered on the
# way) is sent again: once refused, then the object lands whole
proxy_start --inject 400:BadDigest --inject-count 1 --only-method PUT --only-path 'step-00000020/data-00000.tsd$'
expect 0 "push through one 400 BadDigest" "$T" push ck/step-00000020 $B/bd400/ --endpoint "$PROXY_URL"
proxy_stop
[ "$(counted injected)" = 1 ] || fail "BadDigest: injected $(counted injected) times, expected 1"
[ "$(seen PUT 'step-00000020/data-00000.tsd')" = 2 ] ||
    fail "BadDigest: $(seen PUT 'step-00000020/data-00000.tsd') PUTs of the object, expected 2 (1 refused, 1 retry)"
expect 0 "pull after a BadDigest retry" "$T" pull $B/bd400/step-00000020 bd400
for f in ck/step-00000020/*; do cmp -s "$f" "bd400/${f##*/}" || fail "BadDigest retry: $f differs"; done

# a 200 answer that carries an <Error> (as S3 may answer CompleteMultipartUpload)
# is a failure: InternalError once is retried, and the push completes ...
proxy_start --inject 200:InternalError --only-method POST --only-path 'uploadId='
expect 0 "push through a CompleteMultipartUpload answered 200 with an error" \
    "$T" push ck/step-00000010 $B/c200/ --endpoint "$PROXY_URL"
proxy_stop
[ "$(counted injected)" = 1 ] || fail "200 with an error: injected $(counted injected) times, expected 1"
completes=$(seen POST 'uploadId=')
keys=$(grep "^[0-9]* POST [^ ]*uploadId=" "$PROXY_LOG" | awk '{ sub(/\?.*/, "", $3); print $3 }' | sort -u | wc -l)
[ "$completes" = $((keys + 1)) ] && [ "$keys" -ge 1 ] ||
    fail "200 with an error: $completes CompleteMultipartUpload requests for $keys objects, expected one retry"
expect 0 "pull after the retried completion" "$T" pull $B/c200/step-00000010 c200
for f in ck/step-00000010/*; do cmp -s "$f" "c200/${f##*/}" || fail "retried completion: $f differs"; done
# ... and when every attempt gets it, the push fails and aborts the upload: the
# AbortMultipartUpload is sent and no upload is left listed
proxy_start --inject 200:InternalError --inject-count 0 --only-method POST --only-path 'uploadId='
TSR_S3_MAX_ATTEMPTS=3 expect 1 "push whose CompleteMultipartUpload always answers 200 with an error" \
    "$T" push ck/step-00000010 $B/abort/ --endpoint "$PROXY_URL"
proxy_stop
grep -q "gave up after 3 attempts.*CompleteMultipartUpload.*InternalError" err.txt ||
    { fail "a failing completion: unclear error"; cat err.txt >&2; }
[ "$(seen POST 'uploadId=')" = 3 ] || fail "a failing completion: $(seen POST 'uploadId=') attempts, expected 3"
grep -q "^[0-9]* DELETE [^ ]*abort/step-00000010/data-[0-9]*.tsd?uploadId=[^ ]* fault=- status=204" "$PROXY_LOG" ||
    fail "the failed multipart upload was not aborted (no DELETE ?uploadId= answered 204)"
left=$(aws s3api list-multipart-uploads --bucket bkt --prefix abort/ --query 'length(Uploads || `[]`)' --output text) ||
    fail "aws s3api list-multipart-uploads"
[ "$left" = 0 ] || fail "the failed push left $left multipart upload(s) listed"
[ -z "$(aws s3 ls --recursive $B/abort/)" ] || fail "the failed push left objects"

# bytes altered in transit: a flipped byte in a GET answer; pull refuses the
# object (its content hash) and leaves no checkpoint
proxy_start --inject flip-response --only-method GET --only-path 'run1/step-00000020/data-00001.tsd$'
expect 1 "pull of a body altered in transit" "$T" pull $B/run1/step-00000020 flipdown --endpoint "$PROXY_URL"
proxy_stop
[ "$(counted injected)" = 1 ] || fail "flip-response: injected $(counted injected) times, expected 1"
grep -q "s3://bkt/run1/step-00000020/data-00001.tsd: downloaded bytes hash to [0-9a-f]*, the object says" err.txt ||
    { fail "a body altered in transit: no content-hash error"; cat err.txt >&2; }
[ -e flipdown/data-00001.tsd ] && fail "a body altered in transit was kept as data-00001.tsd"
[ -e flipdown/MANIFEST ] && fail "a pull of a body altered in transit left a MANIFEST"
fi # moto only

# a flipped byte in an upload, in part 2 of a multipart object. RGW (as S3 and MinIO)
# checks the part against its signed payload hash (x-amz-content-sha256) and refuses it
# with 400 XAmzContentSHA256Mismatch: the push sends the part again and completes.
# moto checks no hash of a body: the part lands, and pull refuses the object (its
# content hash).
part2='step-00000010/data-00000.tsd?partNumber=2&'
flipped() { grep -c "^[0-9]* PUT [^ ]*$part2[^ ]* fault=inject:flip-request status=$1" "$PROXY_LOG"; }
proxy_start --inject flip-request --only-method PUT --only-path 'step-00000010/data-00000\.tsd\?partNumber=2&'
"$T" push ck/step-00000010 $B/flipup/ --endpoint "$PROXY_URL" >out.txt 2>err.txt
pushed=$?
proxy_stop
[ "$(counted injected)" = 1 ] || fail "flip-request: injected $(counted injected) times, expected 1"
if [ "$S3_SERVER" = rgw ]; then
    [ $pushed = 0 ] || { fail "push with a part altered in transit once: exit $pushed"; cat err.txt >&2; }
    [ "$(flipped 400)" = 1 ] || fail "RGW did not refuse the altered part with 400: $(grep "$part2" "$PROXY_LOG")"
    [ "$(seen PUT "$part2")" = 2 ] || fail "the refused part was sent $(seen PUT "$part2") times, expected 2"
    expect 0 "pull after a part was sent again" "$T" pull $B/flipup/step-00000010 flipup
    for f in ck/step-00000010/*; do cmp -s "$f" "flipup/${f##*/}" || fail "part sent again: $f differs"; done
    # altered at every attempt: the push gives up, naming the object, the part and
    # the server's refusal, and nothing is committed
    proxy_start --inject flip-request --inject-count 0 --only-method PUT --only-path 'step-00000010/data-00000\.tsd\?partNumber=2&'
    TSR_S3_MAX_ATTEMPTS=2 expect 1 "push with a part altered at every attempt" \
        "$T" push ck/step-00000010 $B/flipall/ --endpoint "$PROXY_URL"
    proxy_stop
    grep -q "flipall/step-00000010/data-00000.tsd part 2: PUT: HTTP 400 XAmzContentSHA256Mismatch" err.txt ||
        { fail "a part refused at every attempt: unclear error"; cat err.txt >&2; }
    expect 0 "ls after the refused push" "$T" ls $B/flipall/
    grep -q " committed" out.txt && fail "a push whose part was refused is listed as committed"
else
    [ "$(flipped 200)" = 1 ] || fail "moto refused the altered part: $(grep "$part2" "$PROXY_LOG")"
    if [ $pushed = 0 ]; then
        expect 1 "pull of an object altered on its way up" "$T" pull $B/flipup/step-00000010 flipup
        grep -q "data-00000.tsd: downloaded bytes hash to" err.txt || { fail "an upload altered in transit: pull did not refuse it"; cat err.txt >&2; }
        [ -e flipup/MANIFEST ] && fail "a pull of an upload altered in transit left a MANIFEST"
    else
        fail "push through a part altered in transit on moto: exit $pushed"; cat err.txt >&2
    fi
fi
# an object altered on the server (its bytes no longer those its content hash
# names): pull refuses it
expect 0 "push for the server-side change" "$T" push ck/step-00000020 $B/altered/
h=$(aws s3api head-object --bucket bkt --key altered/step-00000020/data-00001.tsd --query 'Metadata."tessera-xxh3"' --output text)
[ -n "$h" ] && [ "$h" != None ] || fail "the pushed object has no tessera-xxh3 metadata: '$h'"
cp ck/step-00000020/data-00001.tsd changed.tsd
printf '\377' | dd of=changed.tsd bs=1 seek=1000 conv=notrunc 2>/dev/null
cmp -s changed.tsd ck/step-00000020/data-00001.tsd && fail "the local change did not take"
aws s3 cp --quiet changed.tsd $B/altered/step-00000020/data-00001.tsd --metadata "tessera-xxh3=$h" ||
    fail "aws s3 cp of the changed object"
expect 1 "pull of an object changed on the server" "$T" pull $B/altered/step-00000020 altered
grep -q "s3://bkt/altered/step-00000020/data-00001.tsd: downloaded bytes hash to [0-9a-f]*, the object says $h" err.txt ||
    { fail "an object changed on the server: no content-hash error"; cat err.txt >&2; }
[ -e altered/MANIFEST ] && fail "a pull of an object changed on the server left a MANIFEST"

# --- a push killed midway, then started again: nothing finished is sent twice,
# and meanwhile the step is not listed as committed
proxy_start --stall-rate 1 --stall-seconds 0.4 --only-method PUT --seed 1
AWS_ENDPOINT_URL=$PROXY_URL TSR_S3_PARALLEL=1 "$T" push ck/step-00000010 $B/killed/ >/dev/null 2>&1 &
pid=$!
n=0
while [ $n -lt 200 ] && [ "$(grep -c 'PUT .*partNumber' "$PROXY_LOG" 2>/dev/null)" -lt 5 ]; do sleep 0.1; n=$((n + 1)); done
kill -9 $pid 2>/dev/null
wait $pid 2>/dev/null
proxy_stop
expect 0 "ls after the kill" "$T" ls $B/killed/
grep -q committed out.txt && ! grep -q uncommitted out.txt && fail "a half-pushed checkpoint is listed as committed"
run_np 1 "$T" ckpt check $B/killed/step-00000010 --layout dp_shard=1 >/dev/null 2>&1 &&
    fail "a half-pushed checkpoint loads"
expect 0 "push again after the kill" "$T" push ck/step-00000010 $B/killed/ --json
# each data file is 3 parts: the first was complete (skipped whole), the second
# had parts uploaded (not sent again)
resumed=$(sed -n 's/.*"parts_resumed":\([0-9]*\).*/\1/p' out.txt)
skipped=$(sed -n 's/.*"objects_skipped":\([0-9]*\).*/\1/p' out.txt)
sent=$(sed -n 's/.*"parts_sent":\([0-9]*\).*/\1/p' out.txt)
[ "${resumed:-0}" -ge 1 ] && [ "${skipped:-0}" -ge 1 ] && [ "${sent:-9}" -le 2 ] ||
    { fail "the second push re-sent finished work: $(cat out.txt)"; cat err.txt >&2; }
expect 0 "pull after the resumed push" "$T" pull $B/killed/step-00000010 resumed
for f in ck/step-00000010/*; do cmp -s "$f" "resumed/${f##*/}" || fail "resumed push: $f differs"; done

# --- archiving from the trainer: every 2nd checkpoint, the newest 2 kept remotely
"$T" train --config "$TSR_ROOT/train/configs/debug.toml" --job.dump_folder=tr --training.steps=40 \
    --checkpoint.enable --checkpoint.interval=5 --checkpoint.keep_latest_k=1 --checkpoint.async_mode=async \
    --checkpoint.archive_url=$B/train/ --checkpoint.archive_interval=2 --checkpoint.archive_keep_latest_k=2 \
    --checkpoint.last_save_model_only=false >train.log 2>&1 || { fail "training with archiving"; tail train.log >&2; }
expect 0 "ls the archive" "$T" ls $B/train/ --json
/usr/bin/python3 - <<'PYEOF' || fail "archive: expected committed steps 30 and 40 only"
import json
v = json.load(open("out.txt"))
got = [(d["step"], d["status"]) for d in v]
assert got == [(30, "committed"), (40, "committed")], got
PYEOF
ls tr/checkpoint | grep -q step-00000040 || fail "local retention removed the newest checkpoint"
[ "$(ls tr/checkpoint | grep -c step-)" = 1 ] || fail "local retention kept more than 1"
expect 0 "pull the archive" "$T" pull $B/train/step-00000040 tr40
expect 0 "diff archived and local" "$T" ckpt diff tr/checkpoint/step-00000040 tr40
# the archiver encodes the raw frames of what it pushes too (the local copy stays as saved)
total=$(aws s3 ls --recursive --summarize $B/train/step-00000040/ | sed -n 's/.*Total Size: //p')
raw=$("$T" ls $B/train/ --json | sed -n 's/.*"dir":"step-00000040",[^}]*"raw_bytes":\([0-9]*\).*/\1/p')
awk -v t="$total" -v r="$raw" 'BEGIN { printf "archive of a training checkpoint: %.3f of the raw bytes in the bucket\n", t / r
    exit !(r > 0 && t / r <= 0.85) }' || fail "archive: the bucket holds more than 0.85 of the raw bytes ($total of $raw)"
"$T" ckpt verify tr40 >/dev/null || fail "the pulled archive does not verify"

# --- an archive that cannot succeed (no such bucket: refused at once, not
# retried): each failure is reported, training finishes, local retention goes on
"$T" train --config "$TSR_ROOT/train/configs/debug.toml" --job.dump_folder=trf --training.steps=20 \
    --checkpoint.enable --checkpoint.interval=5 --checkpoint.keep_latest_k=2 --checkpoint.async_mode=async \
    --checkpoint.archive_url=s3://no-such-bucket/run/ >trainf.log 2>&1 ||
    { fail "training with a failing archive stopped"; tail trainf.log >&2; }
n=$(grep -c "archive of trf/checkpoint/step-[0-9]* to s3://no-such-bucket/run/step-[0-9]* failed: .*NoSuchBucket" trainf.log)
[ "$n" = 4 ] || { fail "expected 4 archive failures reported, got $n"; grep -i archiv trainf.log >&2; }
[ "$(ls trf/checkpoint | grep -c "^step-")" = 2 ] || fail "local retention with a failing archive: $(ls trf/checkpoint)"
"$T" ckpt verify trf/checkpoint/step-00000020 >/dev/null || fail "the newest local checkpoint does not verify"

# --- tessera rm of a local step and of a local root's uncommitted step
mkdir -p rml && cp -r ck/step-00000010 rml/ && cp -r ck/step-00000010 rml/step-00000011 && rm rml/step-00000011/MANIFEST
expect 0 "rm a local step" "$T" rm rml/step-00000010
[ ! -e rml/step-00000010 ] || fail "rm left the local step"
expect 0 "rm a local uncommitted step" "$T" rm rml/step-00000011
[ ! -e rml/step-00000011 ] || fail "rm left the uncommitted local step"
expect 2 "rm of a directory that is not a step" "$T" rm rml
[ -d rml ] || fail "rm removed a directory that is not a step"

# --- what every upload carries: its body's SHA-256 as the signed payload hash
# (x-amz-content-sha256, which S3, RGW and MinIO check the body against; RGW 16 ignores
# x-amz-checksum-sha256) and Content-Type application/octet-stream, for a single PUT
# and for an object uploaded in parts (its CreateMultipartUpload)
"$T" ckpt synth sig/step-00000001 --bytes 18M --codec bytegroup --step 1 >/dev/null || fail "synth for sig"
[ "$(stat -c %s sig/step-00000001/data-00000.tsd)" -gt 10485760 ] || fail "sig: the data file is not over 2 parts"
TSR_S3_VERBOSE=1 "$T" push sig/step-00000001 $B/sig/ >sig.out 2>sig.err || fail "push with its headers shown"
want=$(openssl dgst -sha256 -r sig/step-00000001/MANIFEST | cut -c1-64)
grep -q "^x-amz-content-sha256: $want" sig.err || fail "the MANIFEST's PUT does not carry x-amz-content-sha256: $want"
for p in 1 2 3; do # the parts of 5 MiB, 5 MiB and the rest
    want=$(dd if=sig/step-00000001/data-00000.tsd bs=5242880 skip=$((p - 1)) count=1 2>/dev/null | openssl dgst -sha256 -r | cut -c1-64)
    grep -q "^x-amz-content-sha256: $want" sig.err || fail "part $p of data-00000.tsd does not carry x-amz-content-sha256: $want"
done
for k in MANIFEST data-00000.tsd; do
    ct=$(aws s3api head-object --bucket bkt --key sig/step-00000001/$k --query ContentType --output text)
    [ "$ct" = "application/octet-stream" ] || fail "$k: Content-Type $ct"
done
# the same for a data file encoded on the way (streamed in parts): the parts of the object
TSR_S3_VERBOSE=1 "$T" push rawbf/step-00000003 $B/sig2/ >sig.out 2>sig.err || fail "push of a raw step with its headers shown"
aws s3 cp --quiet $B/sig2/step-00000003/data-00000.tsd sig2.tsd || fail "aws s3 cp of the encoded object"
[ "$(stat -c %s sig2.tsd)" -gt 5242880 ] || fail "sig2: the encoded object is not over one part"
for p in 1 2; do
    want=$(dd if=sig2.tsd bs=5242880 skip=$((p - 1)) count=1 2>/dev/null | openssl dgst -sha256 -r | cut -c1-64)
    grep -q "^x-amz-content-sha256: $want" sig.err || fail "part $p of the encoded data-00000.tsd does not carry x-amz-content-sha256: $want"
done

finish "s3 on $S3_SERVER: round trips, interop, faults, resumed push and archiving ok"
