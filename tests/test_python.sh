#!/bin/sh
# test_python.sh: the Python package python/tessera over libtessera-core.so (ctypes),
# under the tests' Python (tests/py_setup.sh: numpy and PyTorch): every dtype
# round trips, boxes, blobs and errors; a checkpoint trained on 2 ranks (tp=2)
# reads exactly as tests/format_reader.py (written from FORMAT.md alone) reads it;
# PyTorch tensors in and out; tessera.torch.load_state_dict fills a PyTorch Llama
# module with Hugging Face's names from that checkpoint, whose logits
# (tests/hf_llama.py's forward) equal `tessera logits`. The same checks but
# PyTorch's run again under Debian's python3 with python3-numpy and no torch: the
# package needs numpy alone. The checks are tests/test_python.py.
. "$TSR_ROOT/tests/mpi.sh"
cd "${TSR_TMP:?}" || exit 1
need_py
SYS=/usr/bin/python3
$SYS -c 'import numpy' 2>/dev/null || { echo "FAIL: $SYS has no numpy (python3-numpy: make test installs it)" >&2; exit 1; }
run_np 2 "$T" train --config "$TSR_ROOT/train/configs/debug.toml" --training.steps=4 --checkpoint.enable \
    --checkpoint.interval=4 --parallelism.tensor_parallel_degree=2 --job.dump_folder=trained >train.log 2>&1 ||
    { fail "training the checkpoint to read"; tail -5 train.log >&2; }
# tessera's own logits of the trained model, for the PyTorch module that loads it
TOK=72,101,108,108,111,44,32,119,111,114,108,100,256,84,104,101
"$T" logits trained/checkpoint --tokens $TOK --out logits.bin >/dev/null 2>logits.err ||
    { fail "tessera logits"; cat logits.err >&2; }
mkdir env sys
with_lib "$TSR_PY" "$TSR_ROOT/tests/test_python.py" "$TSR_TMP/env" trained/checkpoint logits.bin $TOK >out.txt 2>&1 ||
    fail "tests/test_python.py under $TSR_PY: exit $?"
cat out.txt
with_lib $SYS "$TSR_ROOT/tests/test_python.py" "$TSR_TMP/sys" trained/checkpoint logits.bin $TOK --no-torch >out.txt 2>&1 ||
    fail "tests/test_python.py under $SYS without torch: exit $?"
cat out.txt
finish
