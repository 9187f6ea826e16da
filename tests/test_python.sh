#!/bin/sh
# test_python.sh: the Python package python/tessera over libtessera.so (ctypes),
# under Debian's python3-numpy and python3-torch: every dtype round trips, boxes,
# blobs and errors; a checkpoint trained on 2 ranks (tp=2) reads exactly as
# tests/format_reader.py (written from FORMAT.md alone) reads it; PyTorch tensors
# in and out; tessera.torch.load_state_dict fills a PyTorch Llama module with Hugging
# Face's names from that checkpoint, whose logits (tests/hf_llama.py's forward)
# equal `tessera logits`. The checks are tests/test_python.py.
. "$TSR_ROOT/tests/mpi.sh"
cd "${TSR_TMP:?}" || exit 1
PY=/usr/bin/python3
$PY -c 'import numpy' 2>/dev/null || { echo "FAIL: /usr/bin/python3 has no numpy (python3-numpy: make deps)" >&2; exit 1; }
LIB=$TSR_BUILD/libtessera.so.0
[ -e "$LIB" ] || { echo "FAIL: $LIB is not built" >&2; exit 1; }
# a sanitizer build's library needs the sanitizers' runtimes loaded first
pre=""
if nm -D "$LIB" | grep -q __asan_; then
    pre="$(cc -print-file-name=libasan.so) $(cc -print-file-name=libubsan.so)"
fi
run_np 2 "$T" train --config "$TSR_ROOT/train/configs/debug.toml" --training.steps=4 --checkpoint.enable \
    --checkpoint.interval=4 --parallelism.tensor_parallel_degree=2 --job.dump_folder=trained >train.log 2>&1 ||
    { fail "training the checkpoint to read"; tail -5 train.log >&2; }
# tessera's own logits of the trained model, for the PyTorch module that loads it
TOK=72,101,108,108,111,44,32,119,111,114,108,100,256,84,104,101
"$T" logits trained/checkpoint --tokens $TOK --out logits.bin >/dev/null 2>logits.err ||
    { fail "tessera logits"; cat logits.err >&2; }
env LD_PRELOAD="$pre" ASAN_OPTIONS=detect_leaks=0 TESSERA_LIB="$LIB" PYTHONPATH="$TSR_ROOT/python" \
    $PY "$TSR_ROOT/tests/test_python.py" "$TSR_TMP" trained/checkpoint logits.bin $TOK >out.txt 2>&1 ||
    fail "tests/test_python.py: exit $?"
cat out.txt
finish
