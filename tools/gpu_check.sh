#!/bin/sh
# gpu_check.sh: the GPU check, in two steps, for a GPU machine without network or
# package access.
#   sh tools/gpu_check.sh prepare OUT   (here, after make cuda-variant) puts in OUT
#       the CUDA build's command and GPU test with the shared libraries they link
#       that are not the C library's or CUDA's (liburing, zstd, curl, MPI, ...),
#       and this script; and the same as OUT.tar.xz;
#   sh OUT/gpu_check.sh run [SUMMARY]   (on the GPU machine, in at most a few
#       minutes) runs every GPU kernel test against its CPU twin (under
#       compute-sanitizer's memcheck and racecheck too, where it is), then
#       tessera bench gpu, and writes one summary file (default
#       OUT/gpu-summary.txt). Exit 0 only if the tests passed.
set -u
cmd=${1:-}
case $cmd in
prepare)
    OUT=${2:?usage: gpu_check.sh prepare OUT}
    ROOT=$(cd "$(dirname "$0")/.." && pwd)
    B=$ROOT/build/cuda
    for f in "$B/tessera" "$B/tests/test_cuda"; do
        [ -x "$f" ] || { echo "gpu_check: $f is not built (make cuda-variant)" >&2; exit 1; }
    done
    mkdir -p "$OUT/lib" || exit 1
    cp "$B/tessera" "$B/tests/test_cuda" "$0" "$OUT/" || exit 1
    # the libraries to carry: all but the C library's own and CUDA's (the GPU
    # machine has the toolkit, found through the binaries' rpath, and the driver)
    ldd "$B/tessera" "$B/tests/test_cuda" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u |
        grep -Ev '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*|libcuda|libcudart|libcublas|libcublasLt|libnccl)\.so' |
        while read -r lib; do cp -L "$lib" "$OUT/lib/" || exit 1; done
    # one compressed file too, for a machine that is sent files by size
    tar -C "$(dirname "$OUT")" -cJf "$OUT.tar.xz" "$(basename "$OUT")" || exit 1
    echo "gpu_check: prepared $OUT ($(ls "$OUT/lib" | wc -l) libraries, $(du -sh "$OUT" | cut -f1); $OUT.tar.xz $(du -sh "$OUT.tar.xz" | cut -f1)); on the GPU machine: sh $OUT/gpu_check.sh run"
    ;;
run)
    HERE=$(cd "$(dirname "$0")" && pwd)
    SUMMARY=${2:-$HERE/gpu-summary.txt}
    export LD_LIBRARY_PATH="$HERE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    {
        echo "== gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ)"
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
        echo "== kernels: each CUDA twin against its CPU kernel"
        start=$(date +%s)
        timeout 300 "$HERE/test_cuda" 2>&1
        rc=$?
        echo "test_cuda: exit $rc in $(( $(date +%s) - start )) s"
        # the same test under CUDA's memory and race checkers, where the machine
        # has them: an out-of-bounds access or a race that happens to give the
        # right numbers fails here (API errors are not reported: NCCL's start
        # probes kernels for other architectures and ignores the refusals)
        cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
        if [ -n "$cs" ]; then
            for tool in memcheck racecheck; do
                echo "== $tool: test_cuda under compute-sanitizer"
                start=$(date +%s)
                timeout 120 "$cs" --tool $tool --report-api-errors no --error-exitcode 99 "$HERE/test_cuda" >"$HERE/$tool.log" 2>&1
                trc=$?
                grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|Race|========= [A-Z]" "$HERE/$tool.log" | sort | uniq -c | head -20
                echo "$tool: exit $trc in $(( $(date +%s) - start )) s"
                # racecheck reports hazards inside cuBLASLt's own kernels (nvjet_*,
                # split-K and bias-add variants seen on an H200) that tessera cannot
                # change: those alone do not fail the check, every other one does
                if [ $tool = racecheck ] && [ $trc = 99 ] && grep -q "Race reported" "$HERE/$tool.log" &&
                   ! grep "Race reported" "$HERE/$tool.log" | grep -vq "at nvjet_"; then
                    echo "racecheck: every hazard is inside cuBLASLt's kernels (nvjet_*): not counted"
                    trc=0
                fi
                [ $rc -eq 0 ] && [ $trc -ne 0 ] && rc=$trc
            done
        else
            echo "== no compute-sanitizer on this machine: the memory checks did not run"
        fi
        # what a save of device state costs a training loop (README, "GPU")
        echo "== bench gpu: the bf16 matrix rate; staging, blocked time and step cost of saves of device state"
        bdir=/dev/shm/tessera-gpu-bench-$$
        [ -d /dev/shm ] || bdir=$HERE/gpu-bench
        start=$(date +%s)
        timeout 240 "$HERE/tessera" bench gpu --dir "$bdir" --bytes "${GPU_BENCH_BYTES:-4G}" 2>&1
        echo "bench gpu: exit $? in $(( $(date +%s) - start )) s"
        rm -rf "$bdir"
    } >"$SUMMARY" 2>&1
    cat "$SUMMARY"
    exit $rc
    ;;
*)
    echo "usage: gpu_check.sh prepare OUT | run [SUMMARY]" >&2
    exit 2
    ;;
esac
