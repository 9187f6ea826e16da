#!/bin/sh
# test_cli.sh: the tessera command: exit statuses (0 ok, 1 failure, 2 bad usage),
# --help on every subcommand, --json output that parses, and the synth / verify /
# corrupt / diff / ls workflow of the format.
. "$TSR_ROOT/tests/common.sh"
json_ok() { python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$1" || fail "$2: output is not JSON"; }

# usage
expect 2 "no command" $T
expect 0 "--help" $T --help
expect 0 "--version" $T --version
expect 2 "unknown command" $T frobnicate
expect 2 "unknown ckpt subcommand" $T ckpt frobnicate
for sub in ls info verify diff synth check; do
    expect 0 "ckpt $sub --help" $T ckpt $sub --help
    grep -q "usage: .*tessera ckpt $sub" out.txt || fail "ckpt $sub --help prints its usage"
done
expect 0 "bench codec --help" $T bench codec --help
expect 2 "synth without --bytes" $T ckpt synth x
expect 2 "synth with a bad size" $T ckpt synth x --bytes 12Q
expect 2 "synth with a bad dtype" $T ckpt synth x --bytes 1M --dtype f99
expect 2 "verify with an unknown option" $T ckpt verify x --frobnicate
expect 2 "diff with one argument" $T ckpt diff x

# write, list, inspect, verify
expect 0 "synth mix" $T ckpt synth root/step-00000010 --bytes 3M --dtype mix --tensors 5 --step 10
expect 0 "synth bf16" $T ckpt synth root/step-00000020 --bytes 2M --dtype bf16 --step 20
expect 1 "synth refuses to overwrite" $T ckpt synth root/step-00000020 --bytes 2M
mkdir -p root/step-00000030
expect 0 "ls" $T ckpt ls root
grep -q "^10 .*committed" out.txt || fail "ls shows step 10 committed"
grep -q "^30 .*uncommitted" out.txt || fail "ls shows step 30 uncommitted"
expect 0 "ls --json" $T ckpt ls root --json
json_ok out.txt "ls --json"
expect 0 "info" $T ckpt info root/step-00000010
grep -q "optim.step_count" out.txt || fail "info lists tensors"
grep -q "meta.config" out.txt || fail "info lists blobs"
expect 0 "info --json" $T ckpt info root/step-00000010 --json
json_ok out.txt "info --json"
python3 - <<'PY' || fail "info --json content"
import json
d = json.load(open("out.txt"))
assert d["step"] == 10 and d["version"] == "1.5", (d["step"], d["version"])
assert all(len(t["digest"]) == 16 and int(t["digest"], 16) >= 0 for t in d["tensors"]), "a digest per tensor"
names = [t["name"] for t in d["tensors"]]
assert names == sorted(names) and "model.norm" in names, names
for t in d["tensors"]:
    vol = 1
    for s in t["shape"]:
        vol *= s
    covered = 0
    for c in t["chunks"]:
        v = 1
        for x in c["extent"]:
            v *= x
        covered += v
        assert sum(f["raw_size"] for f in c["frames"]) > 0
    assert covered == vol, (t["name"], covered, vol)
PY
expect 0 "info of a root takes the newest" $T ckpt info root
grep -q "step        20" out.txt || fail "info of a root shows step 20"
expect 0 "verify" $T ckpt verify root/step-00000010
expect 0 "verify --json" $T ckpt verify root/step-00000010 --json
json_ok out.txt "verify --json"
expect 0 "synth --check" $T ckpt synth root/step-00000010 --check
expect 0 "diff of a checkpoint with itself" $T ckpt diff root/step-00000010 root/step-00000010
grep -q "no differences" out.txt || fail "diff says no differences"

# one flipped byte in a data file: verify names the tensor and exits 1
cp -r root/step-00000010 bad
size=$(stat -c %s bad/data-00000.tsd)
python3 - bad/data-00000.tsd <<'PY'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
b[8192 + 100] ^= 0x40   # inside the second frame
open(p, "wb").write(b)
PY
expect 1 "verify of a damaged data file" $T ckpt verify bad
grep -q "data-00000.tsd: frame .* of [a-z]" out.txt || fail "verify names file, frame and tensor: $(cat out.txt)"
expect 1 "check of a damaged checkpoint" $T ckpt synth bad --check
expect 1 "diff with a damaged checkpoint" $T ckpt diff root/step-00000010 bad

# a different checkpoint: diff reports the tensors that differ
expect 0 "synth other" $T ckpt synth other --bytes 3M --dtype mix --tensors 4 --step 10
expect 1 "diff of different checkpoints" $T ckpt diff root/step-00000010 other
grep -q "only in A" out.txt || fail "diff reports a tensor only in A"
expect 1 "diff --json" $T ckpt diff root/step-00000010 other --json
json_ok out.txt "diff --json"
# the same tensors with other values: f32 -> bf16 -> f32 rounds every value that
# bf16 cannot hold, and diff says so with the count and the largest difference
expect 0 "synth f32" $T ckpt synth f32 --bytes 1M --dtype f32 --tensors 3
expect 0 "reshard to bf16" $T reshard f32 f32-bf16 --layout dp_shard=1 --dtype bf16
expect 0 "reshard back to f32" $T reshard f32-bf16 f32-back --layout dp_shard=1 --dtype f32
expect 1 "diff of an f32 -> bf16 -> f32 round trip" $T ckpt diff f32 f32-back
grep -q "no differences" out.txt && fail "diff of an f32 -> bf16 -> f32 round trip: no differences"
grep -Eq ": [1-9][0-9]* elements differ, max abs difference [0-9.e-]*[1-9]" out.txt ||
    fail "diff of an f32 -> bf16 -> f32 round trip does not count the values that differ: $(cat out.txt)"
# (its one blob more names the converted tensors' source digests)
grep -v "^blob reshard.source_digests " out.txt | grep -q "dtype or shape differs\|only in" &&
    fail "the round trip changed dtypes or names: $(cat out.txt)"
expect 1 "diff --json of the round trip" $T ckpt diff f32 f32-back --json
python3 -c 'import json,sys; d = json.load(open("out.txt")); assert d["same"] is False and d["differences"], d' ||
    fail "diff --json of the round trip: not reported as different"

# a damaged MANIFEST: ls says damaged, verify and info exit 1 with the reason
cp -r root/step-00000020 root/step-00000040
printf 'x' | dd of=root/step-00000040/MANIFEST bs=1 seek=200 conv=notrunc 2>/dev/null
expect 0 "ls with a damaged step" $T ckpt ls root
grep -q "^40 .*damaged.*checksum" out.txt || fail "ls shows step 40 damaged: $(cat out.txt)"
expect 1 "verify of a damaged MANIFEST" $T ckpt verify root/step-00000040
grep -q "MANIFEST: checksum mismatch" err.txt || fail "verify names the MANIFEST: $(cat err.txt)"
expect 1 "info of a missing dir" $T ckpt info nowhere
rm root/step-00000020/data-00000.tsd
expect 1 "verify with a missing data file" $T ckpt verify root/step-00000020 --json
json_ok out.txt "verify --json"
# bench gemm: the debug model's matmul parameters and FLOP per token, from its
# shapes (dim 128, 4 layers, 4 heads of 32, 2 KV heads, SwiGLU 384, vocabulary
# 320; batch 8 x 64), and a throughput measured
expect 0 "bench gemm" $T bench gemm --config "$TSR_ROOT/train/configs/debug.toml" --seconds 0 --json
json_ok out.txt "bench gemm --json"
C=128 L=4 Dq=128 Dkv=64 F=384 V=320 B=8 S=64
P=$(( L * (C * Dq + 2 * C * Dkv + Dq * C + 3 * C * F) + C * V ))
num() { sed -n "s/.*\"$1\":\([0-9.]*\).*/\1/p" out.txt; }
[ "$(num matmul_params)" = $P ] || fail "bench gemm: matmul_params $(num matmul_params), expected $P"
[ "$(num flop_per_token)" = $(( 6 * P + 6 * L * S * Dq )) ] ||
    fail "bench gemm: flop_per_token $(num flop_per_token), expected $(( 6 * P + 6 * L * S * Dq ))"
[ "$(num step_gemm_flop)" = $(( 6 * B * S * P )) ] || fail "bench gemm: step_gemm_flop $(num step_gemm_flop)"
awk -v p="$(num peak_Fps)" -v b="$(num blas_Fps)" -v s="$(num split_Fps)" \
    'BEGIN { exit !(p > 0 && (p == b || p == s) && p >= b && p >= s) }' || fail "bench gemm: peak: $(cat out.txt)"
expect 2 "bench gemm without a config" $T bench gemm
expect 2 "bench gemm, a flavor from a checkpoint" $T bench gemm --config "$TSR_ROOT/train/configs/debug.toml" --model.flavor=checkpoint
# bench scale: 8b (32 layers) on 512 ranks (pp=16,dp_shard=4,tp=8): each layer's
# 7 matrices cut over tp and dp_shard (32 chunks each) and 2 norms over dp_shard
# (4), the output over tp and dp_shard (32), the embedding and the final norm 4
# each; three times with
# the AdamW moments. The MANIFEST is built from every writer's table, checked to
# cover every tensor, parsed again and planned onto 384 ranks
expect 0 "bench scale" $T bench scale --model 8b --ranks 512 --json
json_ok out.txt "bench scale --json"
[ "$(num chunks)" = $(( 3 * (32 * (7 * 32 + 2 * 4) + 32 + 2 * 4) )) ] || fail "bench scale: chunks $(num chunks)"
[ "$(num load_ranks)" = 384 ] || fail "bench scale: load_ranks $(num load_ranks)"
grep -q '"ok":true' out.txt && [ "$(num frames)" -ge "$(num chunks)" ] && [ "$(num manifest_bytes)" -gt 0 ] ||
    fail "bench scale: $(cat out.txt)"
expect 2 "bench scale, ranks not a multiple of 512" $T bench scale --ranks 1000
expect 2 "bench scale, an unknown model" $T bench scale --model 7b
# a location of a scheme no store serves is refused, naming it, never taken for a
# local path (nothing named gs: appears)
expect 1 "ckpt info of gs://" $T ckpt info gs://bkt/run/step-00000001
grep -q "gs://bkt/run/step-00000001: no store serves this scheme" err.txt || fail "ckpt info gs://: $(cat err.txt)"
expect 1 "ckpt synth into gs://" $T ckpt synth gs://bkt/run/step-00000001 --bytes 64K
grep -q "no store serves this scheme" err.txt || fail "ckpt synth gs://: $(cat err.txt)"
expect 2 "export to gs://" $T export gs://bkt/run/step-00000001 --format gguf gs://bkt/m.gguf
grep -q "gs://bkt/m.gguf: no store serves this scheme" err.txt || fail "export to gs://: $(cat err.txt)"
[ -e gs: ] && fail "a command made a local folder gs: for gs://"
finish "all command checks passed"
