#!/bin/sh
# fuzz.sh: runs one libFuzzer target for a while.
#   sh tests/fuzz.sh BINARY SECONDS
# Run from an empty working directory (tests/run.sh gives each test one): builds a
# seed corpus there, chosen by the basename of BINARY
#   fuzz_manifest*  MANIFESTs of small synthetic checkpoints ("$TESSERA ckpt synth")
#                   and those the target writes itself (TSR_FUZZ_SEEDS=DIR)
#   fuzz_frame*     small inputs in the layout fuzz_frame.c reads
#   fuzz_config*    the job configs in train/configs, one with overrides
#   fuzz_tokens*    small token shards of both widths
#   fuzz_s3_xml*    S3's XML answers: errors, listings, multipart uploads
#   fuzz_gguf*      GGUF keys, values and tensor names as fuzz_gguf.c reads them
# then runs the fuzzer on corpus/ (new inputs) and seeds/ for SECONDS seconds.
# Exit 0 when the fuzzer found nothing; 1 otherwise, printing the input that
# failed and the tail of the log; 77 (with "SKIP: ...") when BINARY is missing.
# Environment: TESSERA (the tessera command; default build/asan/tessera or
# build/release/tessera under TSR_ROOT), TSR_ROOT (the repository).
BIN=$1
SECONDS_=${2:-30}
if [ -z "$BIN" ] || [ ! -f "$BIN" ] || [ ! -x "$BIN" ]; then
    echo "SKIP: fuzzer binary ${BIN:-(none given)} is missing (build it with make fuzz)" >&2
    exit 77
fi
case $SECONDS_ in
'' | *[!0-9]*) echo "usage: sh tests/fuzz.sh BINARY SECONDS" >&2; exit 2;;
esac
case $BIN in /*) ;; *) BIN=$(pwd)/$BIN;; esac
NAME=$(basename "$BIN")
ROOT=${TSR_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
WORK=$(pwd)
mkdir -p corpus seeds artifacts
LOG=$WORK/fuzz.log

# ------------------------------------------------------------------ seeds

find_tessera() {
    for t in "${TESSERA:-}" "$ROOT/build/asan/tessera" "$ROOT/build/release/tessera"; do
        [ -n "$t" ] && [ -x "$t" ] && { echo "$t"; return 0; }
    done
    return 1
}

seeds_manifest() {
    # MANIFESTs built in memory by the target itself (several chunks per tensor, ...)
    mkdir -p "$WORK/empty"
    TSR_FUZZ_SEEDS=$WORK/seeds "$BIN" -runs=0 "$WORK/empty" >"$WORK/gen.log" 2>&1 ||
        { echo "fuzz.sh: $NAME could not write its seeds:" >&2; tail -n 5 "$WORK/gen.log" >&2; }
    rmdir "$WORK/empty"
    # MANIFESTs of synthetic checkpoints written by the tessera command
    T=$(find_tessera) || { echo "fuzz.sh: no tessera command; no synthetic checkpoints as seeds" >&2; return 0; }
    i=0
    for spec in "64K mix 3 auto" "16K f32 1 auto" "256K bf16 4 auto" "64K mix 1 raw" \
                "32K mix 2 zstd" "128K f32 2 bytegroup" "8K bf16 5 auto" "1M mix 8 auto"; do
        set -- $spec
        i=$((i + 1))
        d=$WORK/synth/step-0000000$i
        if ASAN_OPTIONS="detect_leaks=0:${ASAN_OPTIONS:-}" "$T" ckpt synth "$d" --bytes "$1" \
               --dtype "$2" --tensors "$3" --codec "$4" --step "$i" --threads 1 >/dev/null 2>"$WORK/synth.err" &&
           [ -f "$d/MANIFEST" ]; then
            cp "$d/MANIFEST" "seeds/manifest-$i"
        else
            echo "fuzz.sh: $T ckpt synth $d --bytes $1 --dtype $2 --tensors $3 --codec $4 failed:" >&2
            tail -n 3 "$WORK/synth.err" >&2
        fi
    done
    rm -rf "$WORK/synth"
}

# A fuzz_frame input: dtype, codec, raw_size (u32 LE), position (u32 LE), xor,
# level, payload. Bytes are given as octal escapes for printf.
frame_seed() { # file dtype codec raw_size pos xor level payload-file
    f=$1
    le32() { printf "\\$(printf %03o $(($1 & 255)))\\$(printf %03o $((($1 >> 8) & 255)))\\$(printf %03o $((($1 >> 16) & 255)))\\$(printf %03o $((($1 >> 24) & 255)))"; }
    { printf "\\$(printf %03o "$2")\\$(printf %03o "$3")"; le32 "$4"; le32 "$5"
      printf "\\$(printf %03o "$6")\\$(printf %03o "$7")"; cat "$8"; } > "$f"
}

seeds_frame() {
    p=$WORK/payload
    # raw f32, 16 bytes
    printf 'ABCDEFGHIJKLMNOP' > "$p"; frame_seed seeds/raw-f32 1 0 16 3 1 0 "$p"
    # gaussian-like bf16 / f32 bytes: a slowly varying exponent, noisy mantissa
    i=0; : > "$p"
    while [ $i -lt 512 ]; do printf "\\$(printf %03o $(((i * 37) & 255)))\\074" >> "$p"; i=$((i + 1)); done
    frame_seed seeds/bf16 3 2 1024 100 8 0 "$p"
    frame_seed seeds/f32 1 2 1024 7 255 1 "$p"
    frame_seed seeds/f16-trunc 2 2 1024 77 0 2 "$p"
    # integers and bytes: zstd
    frame_seed seeds/i32 9 1 1024 5 4 3 "$p"
    frame_seed seeds/u8 11 0 1024 9 0 4 "$p"
    # a bytegroup frame of 4 f16 elements, both planes stored raw: decodes as is
    printf '\000\000\000\000\004\000\000\000\000\000\000\000\004\000\000\000\074\075\076\077\001\002\003\004' > "$p"
    frame_seed seeds/bytegroup-f16 2 2 8 0 1 0 "$p"
    # zstd frames of real data, when the zstd command is here
    if command -v zstd >/dev/null 2>&1; then
        head -c 3000 "$ROOT/formats/FORMAT.md" > "$WORK/text"
        if zstd -q -c "$WORK/text" > "$p" 2>/dev/null; then
            frame_seed seeds/zstd-text 11 1 3000 40 16 0 "$p"
            frame_seed seeds/zstd-text-f32 1 1 3000 40 16 0 "$p"
        fi
        rm -f "$WORK/text"
    fi
    rm -f "$p"
}

# small safetensors files: one tensor, two, a bf16 one, an empty header
seeds_safetensors() {
    st() { # file header-json data-bytes
        h=$2
        while [ $(( ${#h} % 8 )) -ne 0 ]; do h="$h "; done
        n=${#h}
        { printf "\\$(printf %03o $((n & 255)))\\$(printf %03o $((n >> 8)))\\000\\000\\000\\000\\000\\000"
          printf '%s' "$h"; printf '%s' "$3"; } > "$1"
    }
    st seeds/one '{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}' 'ABCDEFGH'
    st seeds/two '{"x.w":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},"y":{"dtype":"U8","shape":[3],"data_offsets":[8,11]}}' 'abcdefghijk'
    st seeds/empty '{}' ''
}

# job configs: the shipped ones, and one with overrides after the NUL byte
seeds_config() {
    for f in "$ROOT"/train/configs/*.toml; do cp "$f" "seeds/config-$(basename "$f" .toml)"; done
    { cat "$ROOT/train/configs/debug.toml"; printf '\000--training.steps=7\000checkpoint.enable\000--job.description=a "b"\000--lr_scheduler.decay_type=sqrt'; } > seeds/overrides
    printf '[training]\nseed = 3 # c\ndataset = '"'"'x\\y'"'"'\n[compile]\nenable = false\ncomponents = ["model"]\n' > seeds/small
}

# token shards: uint16 and uint32 tokens, an empty one, a wrong version
seeds_tokens() {
    le32() { printf "\\$(printf %03o $(($1 & 255)))\\$(printf %03o $((($1 >> 8) & 255)))\\$(printf %03o $((($1 >> 16) & 255)))\\$(printf %03o $((($1 >> 24) & 255)))"; }
    shard() { # file magic version count token-bytes
        { le32 "$2"; le32 "$3"; le32 "$4"; head -c 1012 /dev/zero; printf "$5"; } > "$1"
    }
    shard seeds/u16 20240520 1 4 'a\000b\000\000\001\377\377'
    shard seeds/u32 20240801 7 2 'abcd\000\001\000\000'
    shard seeds/empty 20240520 1 0 ''
    shard seeds/version 20240801 1 1 'wxyz'
}

# S3 answers as AWS writes them
seeds_s3_xml() {
    x='<?xml version="1.0" encoding="UTF-8"?>'
    ns='xmlns="http://s3.amazonaws.com/doc/2006-03-01/"'
    printf '%s<Error><Code>NoSuchKey</Code><Message>The specified key does not exist.</Message><Key>a/b</Key><RequestId>4442587FB7D0A2F9</RequestId></Error>' "$x" > seeds/error
    printf '%s<ListBucketResult %s><Name>bkt</Name><Prefix>a/</Prefix><KeyCount>2</KeyCount><MaxKeys>2</MaxKeys><IsTruncated>true</IsTruncated><NextContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=</NextContinuationToken><Contents><Key>a/b</Key><LastModified>2024-01-01T00:00:00.000Z</LastModified><ETag>&quot;9b2cf535f27731c974343645a3985328&quot;</ETag><Size>434234</Size><StorageClass>STANDARD</StorageClass></Contents><Contents><Key>a/c &amp; d</Key><Size>0</Size></Contents><CommonPrefixes><Prefix>a/step-1/</Prefix></CommonPrefixes></ListBucketResult>' "$x" "$ns" > seeds/list-objects
    printf '%s<InitiateMultipartUploadResult %s><Bucket>bkt</Bucket><Key>a/b</Key><UploadId>VXBsb2FkIElEIGZvciA2aWWpbmcncyBteS1tb3ZpZS5tMnRzIHVwbG9hZA</UploadId></InitiateMultipartUploadResult>' "$x" "$ns" > seeds/create
    printf '%s<CompleteMultipartUploadResult %s><Location>http://bkt.s3.amazonaws.com/a/b</Location><Bucket>bkt</Bucket><Key>a/b</Key><ETag>"3858f62230ac3c915f300c664312c11f-9"</ETag></CompleteMultipartUploadResult>' "$x" "$ns" > seeds/complete
    printf '%s<ListMultipartUploadsResult %s><Bucket>bkt</Bucket><Upload><Key>a/b</Key><UploadId>XMgbGlrZSBlbHZpbmcncyBub3QgaGF2aW5nIG11Y2ggbHVjaw</UploadId><Initiated>2024-01-01T00:00:00.000Z</Initiated></Upload><Upload><Key>a/b</Key><UploadId>VXBsb2FkIElEIGZvciBlbHZpbmcncyBteS1tb3ZpZS5tMnRzIHVwbG9hZA</UploadId><Initiated>2024-02-01T00:00:00.000Z</Initiated></Upload><Upload><Key>a/bc</Key><UploadId>x</UploadId></Upload></ListMultipartUploadsResult>' "$x" "$ns" > seeds/uploads
    printf '%s<ListPartsResult %s><Bucket>bkt</Bucket><Key>a/b</Key><UploadId>x</UploadId><PartNumberMarker>1</PartNumberMarker><NextPartNumberMarker>3</NextPartNumberMarker><MaxParts>2</MaxParts><IsTruncated>true</IsTruncated><Part><PartNumber>2</PartNumber><LastModified>2024-01-01T00:00:00.000Z</LastModified><ETag>"7778aef83f66abc1fa1e8477f296d394"</ETag><ChecksumSHA256>n4bQgYhMfWWaL+qgxVrQFaO/TxsrC4Is0V1sFbDwCgg=</ChecksumSHA256><Size>10485760</Size></Part><Part><PartNumber>3</PartNumber><ETag>"aaaa"</ETag><Size>5</Size></Part></ListPartsResult>' "$x" "$ns" > seeds/parts
    printf 'not xml at all' > seeds/text
}

# GGUF records: op, key (length byte, bytes), then the op's fields (fuzz_gguf.c)
seeds_gguf() {
    printf '\000\024general.architecture\001\000\000\000\002\014general.name\007tessera\003\004bool\001' > seeds/kv
    printf '\004\021token_embd.weight\002\100\000\000\000\000\000\000\000\001\001\000\000\000\000\000\000\036\000\000\000\040\000\000\000\000\000\000\000' > seeds/tensor
    printf '\004\014blk.0.attn q\001\010\000\000\000\000\000\000\000\000\000\000\000\000\000\000\000\000\000\000\000\001\000\001\000\000\000' > seeds/bad-name
    { printf '\004\100'; head -c 64 /dev/zero | tr '\000' x; printf '\001\001\000\000\000\000\000\000\000'; } > seeds/long-name
}

case $NAME in
fuzz_gguf*) seeds_gguf;;
fuzz_s3_xml*) seeds_s3_xml;;
fuzz_tokens*) seeds_tokens;;
fuzz_config*) seeds_config;;
fuzz_safetensors*) seeds_safetensors;;
fuzz_manifest*) seeds_manifest;;
fuzz_frame*) seeds_frame;;
*) echo "fuzz.sh: no seeds for $NAME" >&2;;
esac
echo "fuzz.sh: $NAME for ${SECONDS_}s, $(ls seeds | wc -l) seeds"

# ------------------------------------------------------------------- run

# detect_leaks stays on (the targets free everything); abort_on_error is left to
# libFuzzer, which writes the failing input before it exits.
ASAN_OPTIONS="detect_leaks=1:${ASAN_OPTIONS:-}" \
UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}" \
"$BIN" -max_total_time="$SECONDS_" -rss_limit_mb=2048 -max_len=65536 -timeout=10 \
    -print_final_stats=1 -artifact_prefix="$WORK/artifacts/" corpus seeds >"$LOG" 2>&1
rc=$?
found=$(ls artifacts 2>/dev/null)
if [ $rc -eq 0 ] && [ -z "$found" ]; then
    grep -E '^(Done|stat::number_of_executed_units|#[0-9]+ +DONE)' "$LOG" | tail -n 2
    echo "fuzz.sh: $NAME: nothing found ($(ls corpus | wc -l) new corpus inputs)"
    exit 0
fi
echo "fuzz.sh: $NAME FAILED (exit $rc)"
for a in $found; do
    f=$WORK/artifacts/$a
    echo "failing input: $f ($(wc -c < "$f") bytes)"
    if [ "$(wc -c < "$f")" -le 4096 ]; then
        echo "base64 of $a:"
        base64 < "$f"
    fi
done
echo "---- last lines of $LOG:"
tail -n 60 "$LOG"
exit 1
