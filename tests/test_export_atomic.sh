#!/bin/sh
# tessera export is atomic: an export that fails (a data file missing, a frame
# whose bytes were damaged) exits 1 and leaves nothing behind: no file under a
# final name (config.json, model.safetensors, OUT.gguf) and no temporary; an
# export killed with SIGKILL while it writes leaves no file under a final name,
# and the next export completes. (A full disk: tests/test_export_enospc.sh.)
. "$TSR_ROOT/tests/common.sh"
cd "$TSR_TMP" || exit 1
CFG="$TSR_ROOT/train/configs/debug.toml"
"$T" data prep --out data --synthetic 64k >/dev/null || fail "data prep"
"$T" train --config "$CFG" --job.dump_folder=run --training.steps=1 --training.seq_len=32 \
    --training.dataset=tokens --training.dataset_path=data --checkpoint.enable=true --checkpoint.interval=1 \
    --checkpoint.last_save_model_only=true >train.log 2>&1 || { fail "train"; tail -5 train.log >&2; }
A=run/checkpoint/model-step-00000001
[ -f "$A/data-00000.tsd" ] || { fail "no model checkpoint in run/checkpoint"; exit 1; }

# nothing DIR [ALLOWED...]: DIR holds no entry (hidden ones included) but ALLOWED
nothing() {
    dir=$1; shift
    [ -d "$dir" ] || return 0
    for x in $(ls -A "$dir"); do
        ok=0
        for a in "$@"; do [ "$x" = "$a" ] && ok=1; done
        [ $ok = 1 ] || fail "$case: $dir/$x left behind"
    done
}

# a failed export CKPT: exit 1 with REASON, nothing under final names, no temporaries,
# into a new directory, an existing one holding a file of the user's, and as GGUF
failed() { # WHAT CKPT REASON
    case=$1 ck=$2 reason=$3
    rm -rf o && mkdir -p o/keep && echo mine >o/keep/notes.txt
    expect 1 "$case: export safetensors" "$T" export "$ck" --format safetensors o/new
    grep -q "$reason" err.txt || { fail "$case: no reason ($reason) given"; sed 's/^/    /' err.txt >&2; }
    [ -e o/new ] && fail "$case: the export made o/new"
    case="$1 (into a directory)"
    expect 1 "$case: export safetensors" "$T" export "$ck" --format safetensors o/keep --dtype bf16
    nothing o/keep notes.txt
    case="$1 (gguf)"
    expect 1 "$case: export gguf" "$T" export "$ck" --format gguf o/m.gguf
    grep -q "$reason" err.txt || { fail "$case: no reason ($reason) given"; sed 's/^/    /' err.txt >&2; }
    nothing o keep
}

# a data file missing (the second of two: the first holds the model's shapes, which
# export reads before it writes anything): reading the tensors is what fails
expect 0 "reshard to two files" "$T" reshard "$A" M --layout dp_shard=2
[ -f M/data-00001.tsd ] || fail "reshard to dp_shard=2 wrote no data-00001.tsd"
rm -f M/data-00001.tsd
failed "missing data file" M "data-00001.tsd"

# damaged bytes in the middle of the data file: a frame fails its check
rm -rf C && cp -r "$A" C
size=$(stat -c %s C/data-00000.tsd)
head -c 8192 /dev/urandom | dd of=C/data-00000.tsd bs=1 seek=$((size / 2)) conv=notrunc 2>/dev/null
expect 1 "verify of the damaged copy" "$T" ckpt verify C
failed "damaged frame" C "data-00000.tsd"

# killed while writing (SIGKILL once a file in OUT has 100 KiB): no file under a
# final name; the next export completes and its output checks
killed() { # FORMAT OUT FINAL... (ref/OUT: a complete export of the same model)
    fmt=$1 out=$2; shift 2
    case="export $fmt killed"
    caught=0
    for try in 1 2 3 4 5; do
        rm -rf k && mkdir k
        "$T" export big --format "$fmt" "k/$out" >/dev/null 2>&1 &
        pid=$!
        while kill -0 $pid 2>/dev/null; do
            [ -n "$(find k -type f -size +100k 2>/dev/null)" ] && { kill -KILL $pid 2>/dev/null; break; }
        done
        wait $pid
        [ $? = 137 ] || continue
        # the kill came after every file was in place (possible on a loaded machine): again
        complete=1
        for f in "$@"; do cmp -s "k/$f" "ref/$f" || complete=0; done
        [ $complete = 1 ] && continue
        caught=1
        break
    done
    [ $caught = 1 ] || { fail "$case: the export finished 5 times before it could be killed"; return; }
    for f in "$@"; do [ -e "k/$f" ] && fail "$case: k/$f exists after the kill"; done
    expect 0 "export $fmt after a killed one" "$T" export big --format "$fmt" "k/$out"
    for f in "$@"; do cmp -s "k/$f" "ref/$f" || fail "export $fmt after a killed one: k/$f differs from ref/$f"; done
}
# a model big enough that writing it takes a while: the small flavor, model only
"$T" train --config "$TSR_ROOT/train/configs/small.toml" --job.dump_folder=runbig --training.steps=1 \
    --training.seq_len=16 --training.local_batch_size=1 --training.dataset=tokens --training.dataset_path=data \
    --checkpoint.enable=true --checkpoint.interval=1 --checkpoint.last_save_model_only=true >trainbig.log 2>&1 ||
    { fail "train small"; tail -5 trainbig.log >&2; }
mv runbig/checkpoint/model-step-00000001 big || fail "no small model checkpoint"
mkdir -p ref
expect 0 "reference gguf export" "$T" export big --format gguf ref/m.gguf
expect 0 "reference safetensors export" "$T" export big --format safetensors ref/hf
killed gguf m.gguf m.gguf
killed safetensors hf hf/config.json hf/model.safetensors
"$T" import k/hf imported --layout dp_shard=1 >/dev/null 2>err.txt || fail "import of the export after a kill: $(cat err.txt)"
finish "export atomic: failed exports leave nothing, killed ones no file under a final name"
