#!/bin/sh
# The S3 part of make bench: push and pull of a checkpoint of over 1 GiB (stored)
# to an S3 server on loopback (Ceph's RADOS Gateway, tests/rgw.sh, on a cluster made
# for the run; S3_SERVER=moto for moto), against the AWS CLI's `aws s3 cp
# --recursive` of the same files to the same server in the same run: throughput
# (MB/s of object bytes) and client CPU seconds per GiB. Goals: at least 1.2x the
# AWS CLI's throughput both ways, with at most 0.5x its CPU.
# Usage: tools/bench_s3.sh TESSERA WORKDIR
T=$1 OUT=$2
export TSR_ROOT=$(cd "$(dirname "$0")/.." && pwd) TSR_TMP="$OUT/s3tmp"
rm -rf "$OUT" && mkdir -p "$TSR_TMP" || exit 1
export S3_SERVER=${S3_SERVER:-rgw}
. "$TSR_ROOT/tests/s3.sh"
s3_start bkt
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none"
CK="$OUT/ck/step-00000001"
# every frame encoded (push sends such files as they are: the transfer alone is measured)
$MPIRUN -np 4 "$T" ckpt synth "$CK" --layout dp_shard=2,tp=2 --bytes 1600M --dtype bf16 --codec bytegroup >/dev/null || exit 1
bytes=$(du -sb "$CK" | cut -f1)
# run WHAT CMD...: wall and CPU (user + system) seconds of CMD into $OUT/WHAT
run() {
    what=$1; shift
    /usr/bin/time -f "%e %U %S" -o "$OUT/$what.time" "$@" >"$OUT/$what.out" 2>"$OUT/$what.err" ||
        { echo "bench s3: $what failed:"; tail -5 "$OUT/$what.err"; exit 1; }
}
# a fresh cluster is slower at its first GiB (pools, allocations): a push not measured first
"$T" push "$OUT/ck" s3://bkt/warm-up/ >/dev/null 2>&1 && "$T" rm s3://bkt/warm-up/step-00000001 >/dev/null 2>&1 ||
    { echo "bench s3: the warm-up push failed"; exit 1; }
run tessera-push "$T" push "$OUT/ck" s3://bkt/tessera/
run awscli-push aws s3 cp --quiet --recursive "$CK" s3://bkt/awscli/step-00000001
run tessera-pull "$T" pull s3://bkt/tessera/step-00000001 "$OUT/pulled-tessera"
run awscli-pull aws s3 cp --quiet --recursive s3://bkt/awscli/step-00000001 "$OUT/pulled-awscli"
cmp -s "$CK/MANIFEST" "$OUT/pulled-tessera/MANIFEST" && "$T" ckpt diff "$CK" "$OUT/pulled-tessera" >/dev/null ||
    { echo "bench s3: the pulled checkpoint differs"; exit 1; }
report() { # direction
    awk -v b="$bytes" -v dir="$1" -v srv="$S3_SERVER" -v t="$(cat "$OUT/tessera-$1.time")" -v a="$(cat "$OUT/awscli-$1.time")" 'BEGIN {
        split(t, x, " "); split(a, y, " "); gib = b / 1073741824
        tr = b / x[1] / 1e6; ar = b / y[1] / 1e6
        tc = (x[2] + x[3]) / gib; ac = (y[2] + y[3]) / gib
        printf "s3 %s of %.2f GiB on %s: tessera %.0f MB/s, aws s3 cp %.0f MB/s: %.2fx (goal >= 1.2)  %s\n",
            dir, gib, srv, tr, ar, tr / ar, (tr / ar >= 1.2) ? "ok" : "MISSED"
        printf "s3 %s client CPU: tessera %.2f s/GiB, aws s3 cp %.2f s/GiB: %.2fx (goal <= 0.5)  %s\n",
            dir, tc, ac, tc / ac, (tc / ac <= 0.5) ? "ok" : "MISSED" }'
}
report push
report pull
# the bucket's bytes of a push of checkpoints saved raw (codec auto under load: the
# main job's), and the step's bytes after tessera ckpt compact, against the raw
# bytes: the small model's f32 training state (AdamW) and its bf16 weights
R="$OUT/ratio"
"$T" train --config "$TSR_ROOT/train/configs/small.toml" --job.dump_folder="$R" --training.steps=2 \
    --checkpoint.enable=true --checkpoint.interval=2 --checkpoint.last_save_model_only=true \
    --checkpoint.export_dtype=bfloat16 >"$OUT/ratio.log" 2>&1 ||
    { echo "bench s3: the training run for the ratios failed:"; tail -5 "$OUT/ratio.log"; exit 1; }
for c in step-00000002:f32:0.85 model-step-00000002:bf16:0.7; do
    d="$R/checkpoint/${c%%:*}" goal=${c##*:} dt=${c#*:}
    "$T" push "$d" s3://bkt/ratio/ >/dev/null 2>&1 || { echo "bench s3: push of $d failed"; exit 1; }
    bucket=$(aws s3 ls --recursive --summarize "s3://bkt/ratio/${c%%:*}/" | sed -n 's/.*Total Size: //p')
    res=$("$T" ckpt compact "$d" --json) || { echo "bench s3: compact of $d failed"; exit 1; }
    echo "$res" | sed 's/.*"raw_bytes":\([0-9]*\),"bytes_before":\([0-9]*\),"bytes_after":\([0-9]*\).*/\1 \2 \3/' |
        awk -v b="$bucket" -v dt="${dt%:*}" -v g="$goal" '{
        printf "push, %s checkpoint saved raw (small model, %.3fx its raw bytes on disk): %.1f MB in the bucket, %.3fx its raw bytes (goal <= %s)  %s\n", dt, $2 / $1, b / 1e6, b / $1, g, (b / $1 <= g) ? "ok" : "MISSED"
        printf "compact, the same %s checkpoint: %.1f -> %.1f MB, %.3fx its raw bytes (goal <= %s)  %s\n", dt, $2 / 1e6, $3 / 1e6, $3 / $1, g, ($3 / $1 <= g) ? "ok" : "MISSED" }'
done
s3_stop
rm -rf "$OUT"
