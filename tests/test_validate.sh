#!/bin/sh
# test_validate.sh: the MANIFEST's validator agrees with loading. Variants of a
# synthetic checkpoint's MANIFEST (trailer recomputed) with a placement layer at or
# past n_layers, mesh degrees of 0 or 2^32-1, n_layers of 2^32-1, and the largest
# valid values, are given to `ckpt verify` and to `ckpt check --layout pp=2` on two
# ranks: both accept or both refuse, with the same reason, which names the MANIFEST
# (and the tensor). Every other command that reads a checkpoint (info, diff,
# reshard, export, logits, push, the trainer's load) refuses them with the same
# reason (each reason once: on its first variant).
. "$TSR_ROOT/tests/mpi.sh"
cd "${TSR_TMP:?}" || exit 1

# patch DIR KEY=VALUE...: rewrites DIR/MANIFEST (FORMAT.md section 4.1) with header
# fields pp, dp_replicate, dp_shard, tp, n_layers or a tensor's placement layer
# (layer:NAME), and the XXH3 trailer recomputed with the system's libxxhash.
patch() {
    python3 - "$@" <<'PY'
import ctypes, struct, sys
d, edits = sys.argv[1], sys.argv[2:]
path = d + "/MANIFEST"
b = bytearray(open(path, "rb").read())
hdr = {"pp": 64, "dp_replicate": 68, "dp_shard": 72, "tp": 76, "n_layers": 80}
hsize, nsec = struct.unpack_from("<I", b, 12)[0], struct.unpack_from("<I", b, 48)[0]
sec = {}
for s in range(nsec):
    typ, _, off, size, rec, count = struct.unpack_from("<IIQQII", b, hsize + 32 * s)
    sec[typ] = (off, rec, count)
for e in edits:
    k, v = e.split("=")
    if k in hdr:
        struct.pack_into("<I", b, hdr[k], int(v))
        continue
    assert k.startswith("layer:"), e
    name = k[6:].encode()
    soff = sec[1][0]
    off, rec, count = sec[3]
    for i in range(count):
        r = off + i * rec
        noff, nlen = struct.unpack_from("<II", b, r)
        if bytes(b[soff + noff:soff + noff + nlen]) == name:
            struct.pack_into("<i", b, r + 24, int(v))
            break
    else:
        sys.exit("no tensor %s" % name)
xxh = ctypes.CDLL("libxxhash.so.0")
xxh.XXH3_64bits.restype = ctypes.c_uint64
xxh.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
struct.pack_into("<Q", b, len(b) - 8, xxh.XXH3_64bits(bytes(b[:-8]), len(b) - 8))
open(path, "wb").write(b)
PY
}

# reason FILE: the message of a refusal, from the line naming the MANIFEST, without
# the command's name and the directory.
reason() { grep -m1 'MANIFEST: ' "$1" | sed 's/.*MANIFEST: //'; }

# a checkpoint of 4 tensors: the first on stage 0, layers 0 and 1, the last on the
# last stage; saved on one rank (n_layers 2)
$T ckpt synth base --bytes 64K --tensors 4 --threads 1 >/dev/null 2>err.txt || { cat err.txt >&2; exit 1; }
$T ckpt info base --json >info.json || fail "info of the base checkpoint"
python3 - <<'PY' || fail "the base checkpoint is not as expected"
import json
d = json.load(open("info.json"))
assert d["layout"]["n_layers"] == 2, d["layout"]
assert [t["name"] for t in d["tensors"]] == ["model.layers.%d.w" % i for i in range(4)], d["tensors"]
PY
run_np 2 $T ckpt check base --layout pp=2 >out.txt 2>err.txt ||
    { fail "ckpt check --layout pp=2 of the unmodified checkpoint"; cat err.txt >&2; }

# name | edits | ok or the text the refusal must hold
cases='layer-2^31-1|layer:model.layers.1.w=2147483647|tensor model.layers.1.w: placement layer 2147483647
layer-n_layers|layer:model.layers.2.w=2|tensor model.layers.2.w: placement layer 2
pp-2^32-1|pp=4294967295|layout: mesh degrees
dp_replicate-2^32-1|dp_replicate=4294967295|layout: mesh degrees
dp_shard-2^32-1|dp_shard=4294967295|layout: mesh degrees
tp-2^32-1|tp=4294967295|layout: mesh degrees
all-2^32-1|pp=4294967295 dp_replicate=4294967295 dp_shard=4294967295 tp=4294967295|layout: mesh degrees
pp-0|pp=0|layout: mesh degree pp is 0
n_layers-2^32-1|n_layers=4294967295|layout: n_layers 4294967295
n_layers-2^31|n_layers=2147483648|ok
dp_shard-2^31|dp_shard=2147483648|ok
layer-1-of-2|layer:model.layers.1.w=1|ok'

refused=0 seen=""
while IFS='|' read -r name edits want; do
    rm -rf "c-$name" out-*
    f0=$fails
    cp -r base "c-$name"
    # shellcheck disable=SC2086
    patch "c-$name" $edits </dev/null || { fail "$name: cannot patch the MANIFEST"; continue; }
    $T ckpt verify "c-$name" </dev/null >v.out 2>v.err
    vrc=$?
    run_np 2 $T ckpt check "c-$name" --layout pp=2 </dev/null >c.out 2>c.err
    crc=$?
    if [ "$want" = ok ]; then
        [ $vrc = 0 ] || { fail "$name: ckpt verify refuses a valid MANIFEST (exit $vrc)"; cat v.err >&2; }
        [ $crc = 0 ] || { fail "$name: ckpt check --layout pp=2 refuses a valid MANIFEST (exit $crc)"; cat c.err >&2; }
        continue
    fi
    [ $vrc = 1 ] || fail "$name: ckpt verify exit $vrc, expected 1 (refused)"
    [ $crc = 1 ] || fail "$name: ckpt check --layout pp=2 exit $crc, expected 1 (refused)"
    why=$(reason v.err)
    case $why in
    "$want"*) ;;
    *) fail "$name: ckpt verify says \"$why\", expected \"$want...\": $(cat v.err)";;
    esac
    [ "$(reason c.err)" = "$why" ] ||
        fail "$name: ckpt check --layout pp=2 says \"$(reason c.err)\", verify \"$why\": $(cat c.err)"
    # every other reader: the same refusal, for the first variant of each expected
    # reason (the variants of "layout: mesh degrees" differ only in which degree
    # is out of range)
    case "$seen" in *"|$want|"*) [ $fails = $f0 ] && refused=$((refused + 1)) &&
        echo "refused by verify and check (the other readers checked on an earlier variant): $name: $why"
        continue;; esac
    seen="$seen|$want|"
    for cmd in "ckpt info c-$name" "ckpt diff base c-$name" "reshard c-$name out-r --layout dp_shard=2" \
               "export c-$name --format safetensors out-st" "export c-$name --format gguf out.gguf" \
               "logits c-$name --tokens 1,2" "push c-$name s3://bucket/x --endpoint http://127.0.0.1:9"; do
        # shellcheck disable=SC2086
        AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test $T $cmd </dev/null >o.out 2>o.err
        rc=$?
        [ $rc = 1 ] || fail "$name: tessera $cmd: exit $rc, expected 1"
        [ "$(reason o.err)" = "$why" ] || fail "$name: tessera $cmd says \"$(cat o.err)\", verify \"$why\""
    done
    $T train --config "$TSR_ROOT/train/configs/debug.toml" --job.dump_folder=tr --training.steps=1 \
        --training.seq_len=16 --checkpoint.initial_load_path="c-$name" </dev/null >o.out 2>o.err
    rc=$?
    [ $rc = 1 ] || fail "$name: train from it: exit $rc, expected 1"
    [ "$(reason o.err)" = "$why" ] || fail "$name: train from it says \"$(tail -n 3 o.err)\", verify \"$why\""
    [ -e out-r ] && fail "$name: reshard left out-r behind"
    [ $fails = $f0 ] && refused=$((refused + 1)) && echo "refused by every reader: $name: $why"
done <<EOF
$cases
EOF
[ $refused = 9 ] || fail "$refused of 9 hostile variants refused by every reader alike"
finish "validator and readers agree on $(echo "$cases" | wc -l) MANIFEST variants"
