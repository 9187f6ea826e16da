#!/bin/sh
# gpu_check.sh: the GPU check, prepared here and run on a GPU machine that has no
# network, no packages and at most 8 minutes for it.
#   sh tools/gpu_check.sh prepare OUT [BUILD]   (here; BUILD defaults to build/cuda,
#       from make cuda-variant) puts in OUT the build's command and GPU test, the
#       shared libraries they link but the C library's and CUDA's (liburing, zstd,
#       curl, MPI, ...), Open MPI's runtime (mpirun and orted, their plugins and help
#       files, in OUT/mpi: the GPU machine may have no mpirun), the debug and 124m
#       configs, the models' FLOP per token (OUT/model-flops.txt, from tessera bench
#       gemm) and this script; and the same as OUT.tar.xz. GPU_CHECK_QUICK=1: no
#       archive and the debug model's FLOP only (enough to rehearse). A BUILD
#       without CUDA (its flags file says) makes a bundle that can only rehearse.
#   sh OUT/gpu_check.sh run [SUMMARY]   (on the GPU machine) runs the phases below;
#       each prints PASS, FAIL, INCOMPLETE (no verdict in its time), SKIP or INFO
#       lines with figures, all into SUMMARY (default OUT/gpu-summary.txt); the
#       runs' logs and metrics stay in OUT/work (GPU_CHECK_WORK, emptied first; the
#       checkpoints are removed at the end unless GPU_CHECK_KEEP=1). Exit 0 only
#       when no line is FAIL (a kernel test, a sanitizer's error, an equality or
#       cross-resume check, a run that did not finish); the rates are INFO lines.
#   sh OUT/gpu_check.sh rehearse [SUMMARY]   (here, without a GPU) the same phases
#       with training.device = "guard" in place of "cuda" (the device's call
#       sequence on host memory; bitwise the CPU's) and the debug model only: the
#       parsing, the comparisons, the cross-resumes and the carried mpirun are
#       proven before a GPU is spent; what needs a GPU is a SKIP line.
#   sh OUT/gpu_check.sh compare REF RUN KEY MODE TOL [FROM]   the phases' comparison
#       of two metrics files (MODE rel, abs or bits): exit 0 when within TOL.
# The phases, in order; each command has its own time limit (seconds, sized for an
# H100), and none runs past GPU_CHECK_SECONDS (470) from the start:
#   1 kernels   test_cuda, every CUDA twin against its CPU kernel (30); the same
#               under compute-sanitizer's memcheck and racecheck (50 each); tessera
#               bench gpu (35): the bf16 8192^3 rate (the denominator of model
#               FLOP/s below: bench gpu measures no other shape) and the staging
#               of saves of device state against a pinned cudaMemcpy
#   2 equality  the debug model, 20 steps (20 a run, 5 runs), device against cpu:
#               f32 (loss within 1e-5 relative every step, grad norm 1e-4), bf16
#               (loss within 0.02 absolute), two device runs bitwise equal (the
#               metrics' 17 digits, the checkpoints' tensors and blobs)
#   3 rates     124m at seq 1024 (35) and 1b at 2048 (the run of phase 4), bf16
#               where the trainer has it, the largest batch whose --model-info
#               memory fits 80% of the GPU: tokens/s, model FLOP/s (6 P + 6 L T D
#               a token, as tessera bench gemm counts) against phase 1's rate,
#               peak device memory (nvidia-smi's memory.used of the whole GPU)
#   4 saves     1b with its full state saved every 20 steps, to /dev/shm where it
#               has room (120): blocked time per save, step time with and without
#               a save in flight; the staging rate is bench gpu's (phase 1)
#   5 resumes   a device checkpoint resumed on 2 CPU ranks (FSDP) and a CPU one on
#               2 device ranks (TP) sharing the GPU (data_plane auto: staged), each
#               within 1e-4 of the uninterrupted run from the step after; 2 device
#               ranks (FSDP) with data_plane = "staged" against the CPU run (20 a run)
#   6 memcheck  compute-sanitizer memcheck on 2 device steps, f32 then bf16 (50 each)
# The limits add up to more than 470 s: past it, the last phases get what is left.
set -u
cmd=${1:-}

# val(line, key): a number of one line of tessera's JSON (the metrics file's
# "key": value, bench's "key":value)
VAL_AWK='function val(line, k,   i, s) {
    i = index(line, "\"" k "\":")
    if (!i) return ""
    s = substr(line, i + length(k) + 3)
    sub(/^ */, "", s)
    sub(/[,}].*/, "", s)
    return s
}'

# compare REF RUN KEY MODE TOL [FROM]: KEY of RUN's metrics against REF's at every
# step of REF from FROM (a resumed run appends: a step's last line counts). MODE rel:
# |a-b|/|a|, abs: |a-b|, bits: the same 17 digits. Prints the worst; 0 when within TOL.
compare() {
    for c_f in "$1" "$2"; do
        [ -f "$c_f" ] || { echo "$3: no metrics file $c_f (the run did not start)"; return 1; }
    done
    awk -v key="$3" -v mode="$4" -v tol="$5" -v from="${6:-1}" "$VAL_AWK"'
    FNR == 1 { f++ }
    { s = val($0, "step"); if (s == "") next; v = val($0, key); if (f == 1) a[s] = v; else b[s] = v }
    END {
        n = 0; missing = 0; worst = 0; at = ""; ndiff = 0; first = ""
        for (s in a) {
            if (s + 0 < from + 0) continue
            if (!(s in b) || a[s] == "" || b[s] == "") { missing++; continue }
            n++
            if (mode == "bits") d = (a[s] == b[s]) ? 0 : 1
            else {
                d = a[s] - b[s]; if (d < 0) d = -d
                if (mode == "rel" && a[s] + 0 != 0) d /= (a[s] < 0 ? -a[s] : a[s])
            }
            if (d > 0) { ndiff++; if (first == "" || s + 0 < first + 0) first = s }
            if (at == "" || d > worst) { worst = d; at = s }
        }
        if (mode == "bits")
            printf "%s: %d of %d steps differ%s", key, ndiff, n, (ndiff ? " (first at step " first ")" : " (bitwise equal)")
        else
            printf "%s: worst %s difference %.3g%s over %d steps (tolerance %g)", key,
                (mode == "rel" ? "relative" : "absolute"), worst, (worst > 0 ? " at step " at : ""), n, tol
        if (missing) printf "; %d step(s) missing", missing
        printf "\n"
        exit !(n > 0 && missing == 0 && worst <= tol + 0)
    }' "$1" "$2"
}

# model_flops TESSERA CONFIG FLAVOR: "FLAVOR P A": the flavor's matmul parameters P
# and its attention FLOP per token per position A, from tessera bench gemm at
# sequence 1 (FLOP per token = 6 P + 6 L T D = 6 P + T A)
model_flops() {
    j=$("$1" bench gemm --config "$2" --model.flavor="$3" --training.seq_len=1 --training.local_batch_size=1 \
        --training.global_batch_size=1 --seconds 0 --json) || return 1
    echo "$j" | awk -v f="$3" "$VAL_AWK"'{ p = val($0, "matmul_params"); t = val($0, "flop_per_token")
        if (p == "" || t == "") exit 1; printf "%s %s %.0f\n", f, p, t - 6 * p }'
}

case $cmd in
prepare)
    OUT=${2:?usage: gpu_check.sh prepare OUT [BUILD]}
    ROOT=$(cd "$(dirname "$0")/.." && pwd)
    B=${3:-$ROOT/build/cuda}
    [ -x "$B/tessera" ] || { echo "gpu_check: $B/tessera is not built (make cuda-variant)" >&2; exit 1; }
    bins="$B/tessera"
    if cut -d"|" -f1 "$B/flags" 2>/dev/null | grep -q -- -DTSR_CUDA && [ -x "$B/tests/test_cuda" ]; then
        bins="$bins $B/tests/test_cuda"
    else
        echo "gpu_check: $B is not a CUDA build with its tests/test_cuda: this bundle can rehearse, not run" >&2
    fi
    # Open MPI's runtime, where ompi_info says it is (any prefix): the launcher and
    # its daemon, the plugins (pkglibdir), help files (pkgdatadir), its settings
    # (sysconfdir), and PMIx's plugins and help files beside its library
    command -v ompi_info >/dev/null ||
        { echo "gpu_check: no ompi_info: Open MPI is needed to carry mpirun (make deps)" >&2; exit 1; }
    mpath() { ompi_info --parsable --path "$1" | sed -n "s/^path:$1://p" | head -n 1; }
    mbin=$(mpath bindir) mlib=$(mpath pkglibdir) mdata=$(mpath pkgdatadir) metc=$(mpath sysconfdir)
    for f in "$mbin/orterun" "$mbin/orted" "$mlib" "$mdata"; do
        [ -e "$f" ] || { echo "gpu_check: Open MPI's $f is missing" >&2; exit 1; }
    done
    [ ! -e "$OUT" ] || [ -f "$OUT/gpu_check.sh" ] ||
        { echo "gpu_check: $OUT exists and is not a bundle: not replaced" >&2; exit 1; }
    rm -rf "$OUT" && mkdir -p "$OUT/lib" "$OUT/configs" "$OUT/mpi/bin" "$OUT/mpi/lib" "$OUT/mpi/share" "$OUT/mpi/etc" || exit 1
    cp $bins "$0" "$OUT/" || exit 1
    [ "$(basename "$0")" = gpu_check.sh ] || mv "$OUT/$(basename "$0")" "$OUT/gpu_check.sh"
    cp "$ROOT/train/configs/debug.toml" "$ROOT/train/configs/124m.toml" "$OUT/configs/" || exit 1
    # plain copies, not links: mpirun is orterun
    cp "$mbin/orterun" "$OUT/mpi/bin/mpirun" && cp "$mbin/orterun" "$mbin/orted" "$OUT/mpi/bin/" &&
        cp -r "$mlib" "$OUT/mpi/lib/openmpi" && cp -r "$mdata" "$OUT/mpi/share/openmpi" || exit 1
    [ -f "$metc/openmpi-mca-params.conf" ] && cp "$metc/openmpi-mca-params.conf" "$OUT/mpi/etc/"
    pmix=$(ldd "$mlib"/mca_pmix_*.so 2>/dev/null | awk '$1 ~ /^libpmix\.so/ && $3 ~ /^\// { print $3; exit }')
    if [ -n "$pmix" ]; then
        pdir=$(dirname "$(dirname "$(readlink -f "$pmix")")") # libpmix is in PREFIX/lib
        mkdir -p "$OUT/mpi/pmix/lib" "$OUT/mpi/pmix/share"
        [ -d "$pdir/lib/pmix" ] && cp -r "$pdir/lib/pmix" "$OUT/mpi/pmix/lib/"
        [ -d "$pdir/share/pmix" ] && cp -r "$pdir/share/pmix" "$OUT/mpi/pmix/share/"
    fi
    ompi_info --parsable | sed -n 's/^ompi:version:full:/Open MPI /p' | head -n 1 >"$OUT/mpi/VERSION"
    # the libraries to carry: all but the C library's own and CUDA's (the GPU
    # machine has the toolkit, found through the binaries' rpath, and the driver)
    for f in $bins "$OUT"/mpi/bin/* "$OUT"/mpi/lib/openmpi/*.so $(ls "$OUT"/mpi/pmix/lib/pmix/*.so 2>/dev/null); do
        ldd "$f" 2>/dev/null
    done | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u |
        grep -Ev '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*|libcuda|libcudart|libcublas|libcublasLt|libnccl)\.so' |
        while read -r lib; do cp -L "$lib" "$OUT/lib/" || exit 1; done || exit 1
    # the models' FLOP per token, measured here: the 1b model's takes 20 s
    flavors="debug 124m 1b"
    [ "${GPU_CHECK_QUICK:-0}" = 1 ] && flavors=debug
    for f in $flavors; do
        model_flops "$B/tessera" "$ROOT/train/configs/debug.toml" "$f" >>"$OUT/model-flops.txt" ||
            { echo "gpu_check: tessera bench gemm could not count the $f model's FLOP" >&2; exit 1; }
    done
    if [ "${GPU_CHECK_QUICK:-0}" = 1 ]; then
        echo "gpu_check: prepared $OUT ($(ls "$OUT/lib" | wc -l) libraries, $(cat "$OUT/mpi/VERSION"), $(du -sh "$OUT" | cut -f1); no archive)"
        exit 0
    fi
    # one compressed file too, for a machine that is sent files by size
    tar -C "$(dirname "$OUT")" -cJf "$OUT.tar.xz" "$(basename "$OUT")" || exit 1
    echo "gpu_check: prepared $OUT ($(ls "$OUT/lib" | wc -l) libraries, $(cat "$OUT/mpi/VERSION"), $(du -sh "$OUT" | cut -f1); $OUT.tar.xz $(du -sh "$OUT.tar.xz" | cut -f1)); on the GPU machine: sh $OUT/gpu_check.sh run"
    exit 0
    ;;
compare)
    [ $# -ge 6 ] || { echo "usage: gpu_check.sh compare REF RUN KEY MODE TOL [FROM]" >&2; exit 2; }
    shift
    compare "$@"
    exit $?
    ;;
run) MODE=run DEV=cuda ;;
rehearse) MODE=rehearse DEV=guard ;;
*)
    echo "usage: gpu_check.sh prepare OUT [BUILD] | run [SUMMARY] | rehearse [SUMMARY] | compare REF RUN KEY MODE TOL [FROM]" >&2
    exit 2
    ;;
esac

# ---- run and rehearse ----
HERE=$(cd "$(dirname "$0")" && pwd)
SUMMARY=${2:-$HERE/gpu-summary.txt}
W=${GPU_CHECK_WORK:-$HERE/work}
T=$HERE/tessera
CFGD=$HERE/configs/debug.toml CFGM=$HERE/configs/124m.toml
START=$(date +%s) DEADLINE=${GPU_CHECK_SECONDS:-470}
fails=0
rm -rf "$W" && mkdir -p "$W" || exit 1
: >"$SUMMARY" || exit 1

out() { echo "$*" | tee -a "$SUMMARY"; }
verdict() { # PASS|FAIL|INCOMPLETE|SKIP|INFO TEXT...
    out "$*"
    [ "$1" = FAIL ] && fails=$((fails + 1))
    return 0
}
limit() { # BUDGET: a command's time limit: its budget, at most what is left of the check
    l_left=$((DEADLINE - ($(date +%s) - START)))
    [ "$1" -lt "$l_left" ] && l_left=$1
    echo "$l_left"
}
# timed NAME BUDGET CMD...: CMD with its output in $W/NAME.log under its time limit;
# sets took (seconds) and t_rc (CMD's status, 124 or 137: killed at the limit)
timed() {
    t_name=$1 t_lim=$(limit "$2")
    shift 2
    took=0 t_rc=124
    if [ "$t_lim" -lt 5 ]; then
        echo "gpu_check: no time left to run it" >"$W/$t_name.log"
        return $t_rc
    fi
    t_start=$(date +%s)
    timeout -k 10 "$t_lim" "$@" >"$W/$t_name.log" 2>&1
    t_rc=$?
    took=$(($(date +%s) - t_start))
    if [ $t_rc = 124 ] || [ $t_rc = 137 ]; then echo "gpu_check: killed at its time limit, $t_lim s" >>"$W/$t_name.log"; fi
    return $t_rc
}
why() { # NAME: how the run NAME ended, for a FAIL line
    echo "exit $t_rc after $took s; its log ends: $(grep -v '^ *$' "$W/$1.log" | tail -n 2 | tr '\n' ' ')"
}
# train NAME NP BUDGET ARGS...: tessera train with ARGS in $W/NAME on NP ranks
train() {
    j_name=$1 j_np=$2 j_budget=$3
    shift 3
    if [ "$j_np" = 1 ]; then
        timed "$j_name" "$j_budget" "$T" train "$@" --job.dump_folder="$W/$j_name"
    elif [ -z "$MPIRUN" ]; then
        echo "gpu_check: no mpirun" >"$W/$j_name.log"
        t_rc=127 took=0
        return 1
    else
        timed "$j_name" "$j_budget" "$MPIRUN" --allow-run-as-root --oversubscribe -np "$j_np" "$T" train "$@" \
            --job.dump_folder="$W/$j_name"
    fi
}
# check WHAT REF RUN KEY MODE TOL [FROM]...: one line per comparison, PASS or FAIL
check() {
    c_what=$1
    shift
    if c_line=$(compare "$@"); then verdict PASS "$c_what: $c_line"; else verdict FAIL "$c_what: $c_line"; fi
}
metrics() { echo "$W/$1/metrics.jsonl"; }
# span METRICS FROM TO SEQ: "n mean_step_s tokens_per_s blocked_s" over the steps
# FROM..TO (a step's time: its tokens over its tokens/s, which counts the time since
# the last line: the blocking of the save after the step before included)
span() {
    [ -f "$1" ] || { echo "0 0 0 0"; return; }
    awk -v from="$2" -v to="$3" -v T="$4" "$VAL_AWK"'
    { s = val($0, "step") + 0; if (s < from || s > to) next
      tok = val($0, "samples") * T; tps = val($0, "tokens_per_s") + 0
      if (tps > 0) { n++; sec += tok / tps; toks += tok; blk += val($0, "ckpt_blocked_s") } }
    END { if (n) printf "%d %.6f %.1f %.6f\n", n, sec / n, toks / sec, blk; else print "0 0 0 0" }' "$1"
}
fmt() { awk -v x="$1" -v f="$2" 'BEGIN { printf f, x }'; }
# flop_per_token FLAVOR SEQ: the trainer's FLOP per token (6 P + 6 L T D)
flop_per_token() {
    [ -f "$HERE/model-flops.txt" ] && grep -q "^$1 " "$HERE/model-flops.txt" ||
        model_flops "$T" "$CFGD" "$1" >>"$HERE/model-flops.txt" 2>/dev/null || { echo 0; return; }
    awk -v f="$1" -v T="$2" '$1 == f { printf "%.0f\n", 6 * $2 + T * $3; exit }' "$HERE/model-flops.txt"
}
# peak device memory: nvidia-smi's memory.used of GPU 0 (the whole GPU: every
# process and the context), sampled every 200 ms while a run lasts
mem_start() {
    mem_pid=""
    [ -n "$SMI" ] || return 0
    mem_base=$(nvidia-smi -i 0 --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -n 1)
    nvidia-smi -i 0 --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$W/$1.mem" 2>/dev/null &
    mem_pid=$!
}
mem_stop() { # NAME: "peak ... MiB" or why not
    if [ -z "$mem_pid" ]; then echo "peak device memory: n/a (no nvidia-smi)"; return; fi
    kill "$mem_pid" 2>/dev/null
    wait "$mem_pid" 2>/dev/null
    echo "peak device memory $(sort -n "$W/$1.mem" | tail -n 1) MiB (nvidia-smi memory.used of the whole GPU, every 200 ms; $mem_base MiB before); the trainer's: $(sed -n 's/^device memory: //p' "$W/$1.log" | head -n 1)"
}

# ---- the machine ----
SMI=$(command -v nvidia-smi || true)
out "== gpu_check $MODE $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n), $(nproc) cores; training.device = $DEV"
if [ -n "$SMI" ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | sed 's/^/gpu: /' | tee -a "$SUMMARY"
else
    out "gpu: no nvidia-smi on this machine"
fi
# mpirun: the carried one, which matches the libmpi the command loads from
# OUT/lib (another Open MPI's launcher may not speak to it); the machine's own
# is probed and named only (GPU_CHECK_MPIRUN picks another)
sys_mpirun=$(command -v mpirun || true)
if [ -n "$sys_mpirun" ]; then
    out "mpirun on this machine: $sys_mpirun ($("$sys_mpirun" --version 2>&1 | head -n 1))"
else
    out "mpirun on this machine: none"
fi
export LD_LIBRARY_PATH="$HERE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
MPIRUN=${GPU_CHECK_MPIRUN:-}
if [ -z "$MPIRUN" ] && [ -x "$HERE/mpi/bin/mpirun" ]; then
    MPIRUN=$HERE/mpi/bin/mpirun
    M=$HERE/mpi
    # Open MPI and PMIx found where they were built unless told: the carried tree
    export OPAL_PREFIX="$M" OPAL_PKGLIBDIR="$M/lib/openmpi" OPAL_PKGDATADIR="$M/share/openmpi" OPAL_SYSCONFDIR="$M/etc"
    export PMIX_PREFIX="$M/pmix" PMIX_PKGLIBDIR="$M/pmix/lib/pmix" PMIX_PKGDATADIR="$M/pmix/share/pmix"
    export PMIX_MCA_mca_base_component_path="$M/pmix/lib/pmix"
    # one node: ranks are forked, no ssh or rsh needed
    export OMPI_MCA_plm=isolated OMPI_MCA_rmaps_base_oversubscribe=1
    out "mpirun used: the carried $(cat "$M/VERSION" 2>/dev/null) ($MPIRUN)"
else
    [ -n "$MPIRUN" ] || MPIRUN=$sys_mpirun
    out "mpirun used: ${MPIRUN:-none: the checks on 2 ranks will fail}"
fi
# the trainer's mixed precision keys: a key the config parser knows rejects a bad
# value (a TorchTitan key tessera ignores takes any)
MP=0
if "$T" train --config "$CFGD" --training.mixed_precision_param=bfloat16 --training.mixed_precision_reduce=float32 \
    --model-info >/dev/null 2>&1 &&
    ! "$T" train --config "$CFGD" --training.mixed_precision_param=nonsense --model-info >/dev/null 2>&1; then
    MP=1
fi
mp() { # float32|bfloat16: the arguments that pick the precision
    [ $MP = 1 ] && echo "--training.mixed_precision_param=$1 --training.mixed_precision_reduce=float32"
}
[ $MP = 1 ] || out "training.mixed_precision_param: not a key of this build's trainer (the bf16 checks fail; the f32 ones run on its only path)"

# ---- 1 kernels and the GEMM rate ----
GEMM_TFLOPS=0
if [ $MODE = rehearse ]; then
    out "== 1 kernels: rehearsal"
    verdict SKIP "kernels: test_cuda, compute-sanitizer and tessera bench gpu need a GPU"
    # the denominator of model FLOP/s here: the host's sgemm on the debug model's products
    if timed bench_gemm 30 "$T" bench gemm --config "$CFGD" --training.seq_len=32 --seconds 1 --json; then
        GEMM_TFLOPS=$(awk "$VAL_AWK"'/peak_Fps/ { printf "%.6f\n", val($0, "peak_Fps") / 1e12; exit }' "$W/bench_gemm.log")
        verdict INFO "gemm rate (rehearsal's denominator): host sgemm on the debug model's products (tessera bench gemm): $(fmt "$GEMM_TFLOPS" '%.4f') TFLOP/s"
    else
        verdict FAIL "gemm rate: tessera bench gemm: $(why bench_gemm)"
    fi
else
    out "== 1 kernels: every CUDA twin against its CPU kernel"
    if [ ! -x "$HERE/test_cuda" ]; then
        verdict FAIL "kernels: no test_cuda in this bundle (prepared from a build without CUDA)"
    else
        timed test_cuda 30 "$HERE/test_cuda"
        rc=$t_rc
        grep -iE 'fail|error' "$W/test_cuda.log" | head -n 10 | tee -a "$SUMMARY"
        tail -n 3 "$W/test_cuda.log" | tee -a "$SUMMARY"
        if [ $rc = 0 ]; then verdict PASS "kernels: test_cuda passed in $took s"
        else verdict FAIL "kernels: test_cuda: $(why test_cuda)"; fi
        # the same test under CUDA's memory and race checkers, where the machine
        # has them: an out-of-bounds access or a race that happens to give the
        # right numbers fails here (API errors are not reported: NCCL's start
        # probes kernels for other architectures and ignores the refusals)
        CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
        if [ -z "$CS" ]; then
            verdict SKIP "sanitizers: no compute-sanitizer on this machine"
        else
            for tool in memcheck racecheck; do
                timed "$tool" 50 "$CS" --tool $tool --report-api-errors no --error-exitcode 99 "$HERE/test_cuda"
                trc=$t_rc
                grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|Race|========= [A-Z]" "$W/$tool.log" | sort | uniq -c |
                    head -n 20 | tee -a "$SUMMARY"
                # racecheck reports hazards inside cuBLASLt's own kernels (nvjet_*,
                # split-K and bias-add variants seen on an H200) that tessera cannot
                # change: those alone do not fail the check, every other one does
                if [ $tool = racecheck ] && [ $trc = 99 ] && grep -q "Race reported" "$W/$tool.log" &&
                    ! grep "Race reported" "$W/$tool.log" | grep -vq "at nvjet_"; then
                    out "racecheck: every hazard is inside cuBLASLt's kernels (nvjet_*): not counted"
                    trc=0
                fi
                case $trc in
                0) verdict PASS "$tool: test_cuda, no error, in $took s" ;;
                124 | 137) verdict INCOMPLETE "$tool: test_cuda did not finish in its $took s: no verdict" ;;
                *) verdict FAIL "$tool: test_cuda: $(why "$tool")" ;;
                esac
            done
        fi
    fi
    # what a save of device state costs a training loop (README, "GPU"), and the rate
    bdir=/dev/shm/tessera-gpu-bench-$$
    [ -d /dev/shm ] || bdir=$W/gpu-bench
    timed bench_gpu 35 "$T" bench gpu --dir "$bdir" --bytes "${GPU_BENCH_BYTES:-4G}" --steps 20
    rm -rf "$bdir"
    tee -a "$SUMMARY" <"$W/bench_gpu.log"
    GEMM_TFLOPS=$(sed -n 's/^gemm: .*: \([0-9.]*\) TFLOP\/s$/\1/p' "$W/bench_gpu.log" | head -n 1)
    if [ -n "$GEMM_TFLOPS" ]; then
        verdict INFO "gemm rate: bf16 8192^3 through cuBLASLt: $GEMM_TFLOPS TFLOP/s (the in-run denominator; bench gpu measures no other shape, so the models' own shapes have no rate of their own here)"
    else
        GEMM_TFLOPS=0
        verdict FAIL "gemm rate: tessera bench gpu printed none: $(why bench_gpu)"
    fi
    case $t_rc in 0 | 1) ;; *) verdict FAIL "bench gpu: $(why bench_gpu)" ;; esac
fi

# ---- 2 equality: the device trainer against the CPU's ----
# the debug model's runs: 20 s each on the GPU machine; the host of a rehearsal
# may be small and shared
SEQ=64 SB=20
[ $MODE = rehearse ] && SEQ=32 SB=60
"$T" data prep --out "$W/data" --synthetic 1M >"$W/data.log" 2>&1 || verdict FAIL "data prep: $(tail -n 1 "$W/data.log")"
SMALL="--config $CFGD --training.seq_len=$SEQ --training.global_batch_size=8 --training.local_batch_size=8 \
--training.steps=20 --metrics.log_freq=1 --lr_scheduler.warmup_steps=2 --training.dataset=tokens \
--training.dataset_path=$W/data --checkpoint.enable=true --checkpoint.interval=10 --checkpoint.async_mode=async"
out "== 2 equality: the debug model (seq $SEQ, batch 8), 20 steps, training.device = $DEV against cpu"
train eq_cpu32 1 $SB $SMALL --training.device=cpu $(mp float32) || verdict FAIL "eq_cpu32: $(why eq_cpu32)"
# the two device runs in the same folder, one after the other: their checkpoints
# hold the same config, so every byte of their tensors and blobs can be compared
for r in a b; do
    train eq_dev 1 $SB $SMALL --training.device=$DEV $(mp float32) || verdict FAIL "eq_dev32$r: $(why eq_dev)"
    rm -rf "${W:?}/eq_dev32$r" && mv "$W/eq_dev.log" "$W/eq_dev32$r.log" && mv "$W/eq_dev" "$W/eq_dev32$r" 2>/dev/null
done
check "equality f32 ($DEV against cpu)" "$(metrics eq_cpu32)" "$(metrics eq_dev32a)" loss rel 1e-5
check "equality f32 ($DEV against cpu)" "$(metrics eq_cpu32)" "$(metrics eq_dev32a)" grad_norm rel 1e-4
check "equality bitwise (two $DEV runs)" "$(metrics eq_dev32a)" "$(metrics eq_dev32b)" loss bits 0
check "equality bitwise (two $DEV runs)" "$(metrics eq_dev32a)" "$(metrics eq_dev32b)" grad_norm bits 0
for s in 00000010 00000020; do
    if d=$("$T" ckpt diff "$W/eq_dev32a/checkpoint/step-$s" "$W/eq_dev32b/checkpoint/step-$s" --json 2>&1); then
        verdict PASS "equality bitwise (two $DEV runs): checkpoint step-$s: every tensor and blob the same ($d)"
    else
        verdict FAIL "equality bitwise (two $DEV runs): checkpoint step-$s: $(echo "$d" | cut -c1-400)"
    fi
done
if [ $MP = 1 ]; then
    train eq_cpu16 1 $SB $SMALL --training.device=cpu $(mp bfloat16) || verdict FAIL "eq_cpu16: $(why eq_cpu16)"
    train eq_dev16 1 $SB $SMALL --training.device=$DEV $(mp bfloat16) || verdict FAIL "eq_dev16: $(why eq_dev16)"
    check "equality bf16 ($DEV against cpu)" "$(metrics eq_cpu16)" "$(metrics eq_dev16)" loss abs 0.02
    # bf16 that gives f32's numbers bit for bit is not in effect
    if compare "$(metrics eq_dev32a)" "$(metrics eq_dev16)" loss bits 0 >/dev/null; then
        verdict FAIL "equality bf16: the bf16 run's losses are the f32 run's bit for bit: bf16 is not in effect"
    else
        verdict INFO "bf16 against f32 ($DEV): $(compare "$(metrics eq_dev32a)" "$(metrics eq_dev16)" loss abs 1)"
    fi
else
    verdict FAIL "equality bf16: training.mixed_precision_param is not a key of this trainer"
fi

# ---- 3 and 4: rates of the 124m and 1b models, and saves of the 1b's full state ----
# rates NAME FLAVOR SEQ BATCH FROM TO: the INFO line of a run's steps FROM..TO
rates() {
    set -- "$1" "$2" "$3" "$4" $(span "$(metrics "$1")" "$5" "$6" "$3")
    fpt=$(flop_per_token "$2" "$3")
    [ "$5" -gt 0 ] || { verdict FAIL "rate $2: no step in its metrics: $(why "$1")"; return; }
    verdict INFO "rate $2 (seq $3, batch $4, $PREC): $(fmt "$7" '%.0f') tokens/s, $(fmt "$6" '%.4f') s a step (mean of $5 steps); $(fmt "$fpt" '%.4g') FLOP a token: $(awk -v t="$7" -v f="$fpt" -v g="$GEMM_TFLOPS" 'BEGIN { m = t * f / 1e12; printf "%.4g TFLOP/s of model FLOP, MFU %.2f%% of the in-run GEMM rate (%s TFLOP/s)", m, (g > 0 ? 100 * m / g : 0), g }')"
}
# batch FLAVOR SEQ B: the largest batch from B down whose memory (tessera train
# --model-info) is at most 80% of the GPU's
batch() {
    b_total=$(nvidia-smi -i 0 --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -n 1)
    b=$3
    while [ "$b" -gt 1 ]; do
        b_need=$("$T" train --config "$CFGM" --model.flavor="$1" --training.seq_len="$2" --training.local_batch_size="$b" \
            --training.global_batch_size="$b" $(mp "$PRECISION") --model-info 2>/dev/null |
            sed -n 's/^largest: rank [0-9]*, \([0-9.]*\) GiB$/\1/p')
        awk -v n="${b_need:-1e9}" -v t="${b_total:-0}" 'BEGIN { exit !(n * 1024 <= 0.8 * t) }' && break
        b=$((b / 2))
    done
    echo "$b"
}
PRECISION=float32
[ $MP = 1 ] && PRECISION=bfloat16
PREC=$PRECISION
[ $MP = 1 ] || PREC="float32 (the trainer's only path)"
# the saves of phase 4: every SAVE_EVERY steps of 2 * SAVE_EVERY, into memory
# where there is room for two (a save commits while the one before is kept)
saves() { # NAME FLAVOR SEQ BATCH ARGS...
    s_name=$1 s_fl=$2 s_seq=$3 s_b=$4
    shift 4
    # KiB for two full states (f32 parameters and AdamW's two moments) and a half
    s_params=$("$T" train "$@" --model.flavor="$s_fl" --model-info 2>/dev/null |
        sed -n 's/^model [^:]*: \([0-9]*\) parameters.*/\1/p')
    s_need=$((${s_params:-0} * 12 * 5 / 2 / 1024))
    s_dir=$W
    if [ -d /dev/shm ] && [ "$(df -Pk /dev/shm | awk 'NR == 2 { print $4 }')" -gt "$s_need" ]; then
        s_dir=/dev/shm/tessera-gpu-check-$$
    fi
    mem_start "$s_name"
    train "$s_name" 1 "$SAVE_BUDGET" "$@" --model.flavor="$s_fl" --training.seq_len="$s_seq" --training.local_batch_size="$s_b" \
        --training.global_batch_size="$s_b" --training.steps=$((2 * SAVE_EVERY)) --metrics.log_freq=1 \
        --training.device=$DEV $(mp "$PRECISION") --checkpoint.enable=true --checkpoint.interval=$SAVE_EVERY \
        --checkpoint.keep_latest_k=1 --checkpoint.async_mode=async --checkpoint.last_save_model_only=false \
        --checkpoint.folder="$s_dir/$s_name"
    s_rc=$t_rc
    s_mem=$(mem_stop "$s_name")
    rm -rf "${s_dir:?}/$s_name"
    [ "$s_dir" = "$W" ] || rmdir "$s_dir" 2>/dev/null
    [ $s_rc = 0 ] && verdict PASS "saves $s_fl: $((2 * SAVE_EVERY)) steps with a save every $SAVE_EVERY (to $s_dir) ran in $took s; $s_mem"
    [ $s_rc = 0 ] || verdict FAIL "saves $s_fl: $(why "$s_name"); $s_mem"
    # steps 2..SAVE_EVERY-1: no save yet (the first pays for starting); SAVE_EVERY+1..
    # 2*SAVE_EVERY-1: the first save in flight, its blocking in the first of them
    rates "$s_name" "$s_fl" "$s_seq" "$s_b" $((SAVE_EVERY < 10 ? 2 : 6)) $((SAVE_EVERY - 1))
    set -- $(span "$(metrics "$s_name")" 2 $((SAVE_EVERY - 1)) "$s_seq") $(span "$(metrics "$s_name")" $((SAVE_EVERY + 1)) \
        $((2 * SAVE_EVERY - 1)) "$s_seq")
    if [ "$1" -gt 0 ] && [ "$5" -gt 0 ]; then
        verdict INFO "saves $s_fl: blocked $(fmt "$8" '%.4f') s by the save of step $SAVE_EVERY; step $(fmt "$2" '%.4f') s without a save in flight, $(fmt "$6" '%.4f') s with one ($(awk -v a="$2" -v b="$6" 'BEGIN { printf "%+.2f%%", 100 * (b / a - 1) }'), the blocking included)"
        sed -n 's/^done: .* s, \(.* blocked on checkpoints\),.*/saves '"$s_fl"': the whole run: \1 (the last save waited for at the end included)/p' \
            "$W/$s_name.log" | tee -a "$SUMMARY"
    else
        verdict FAIL "saves $s_fl: too few steps in its metrics to measure the saves"
    fi
    if [ $MODE = run ]; then
        s_st=$(sed -n 's/^ *staging *//p' "$W/bench_gpu.log" | head -n 1)
        verdict INFO "saves $s_fl: staging against a pinned copy: ${s_st:-none} (tessera bench gpu, phase 1: the train log reports no staging rate of its own)"
    fi
}
if [ $MODE = rehearse ]; then
    out "== 3 rates and 4 saves: rehearsal, the debug model (124m and 1b need a GPU)"
    verdict SKIP "rate 124m (seq 1024) and 1b (seq 2048): a GPU's"
    SAVE_EVERY=6 SAVE_BUDGET=40
    saves rate_debug debug $SEQ 8 --config "$CFGD" --training.dataset=tokens --training.dataset_path="$W/data"
else
    out "== 3 rates: 124m at seq 1024, 1b at seq 2048 (the run of phase 4)"
    b=$(batch 124m 1024 8)
    mem_start rate_124m
    train rate_124m 1 35 --config "$CFGM" --model.flavor=124m --training.seq_len=1024 --training.local_batch_size="$b" \
        --training.global_batch_size="$b" --training.steps=20 --metrics.log_freq=1 --checkpoint.enable=false \
        --training.device=cuda $(mp "$PRECISION")
    r_rc=$t_rc
    r_mem=$(mem_stop rate_124m)
    [ $r_rc = 0 ] && verdict PASS "rate 124m: 20 steps ran in $took s; $r_mem"
    [ $r_rc = 0 ] || verdict FAIL "rate 124m: $(why rate_124m); $r_mem"
    rates rate_124m 124m 1024 "$b" 6 20
    out "== 4 saves: 1b at seq 2048, its full state saved every 20 steps"
    SAVE_EVERY=20 SAVE_BUDGET=120
    saves rate_1b 1b 2048 "$(batch 1b 2048 4)" --config "$CFGM"
fi

# ---- 5 cross-resumes and ranks that share the GPU ----
out "== 5 resumes: checkpoints of step 10 across devices and layouts; 2 ranks on one GPU, staged"
from10() { # SRC DST: DST's checkpoint folder holds SRC's step 10 only
    rm -rf "${W:?}/$2" && mkdir -p "$W/$2/checkpoint" &&
        cp -r "$W/$1/checkpoint/step-00000010" "$W/$2/checkpoint/" 2>/dev/null && return 0
    echo "gpu_check: $1 has no checkpoint of step 10 to resume from" >"$W/$2.log"
    t_rc=1 took=0
    return 1
}
# resumed WHAT NAME: the resumed run NAME against the uninterrupted CPU run from step 11
resumed() {
    if ! grep -q "resumed from .*step-00000010" "$W/$2.log"; then
        verdict FAIL "$1: did not resume from step 10: $(why "$2")"
        return
    fi
    verdict INFO "$1: $(awk "$VAL_AWK"'FNR == 1 { f++ } val($0, "step") + 0 == 11 { v[f] = val($0, "loss") }
        END { printf "the first step after the resume, 11: loss %s, uninterrupted %s", v[2], v[1] }' \
        "$(metrics eq_cpu32)" "$(metrics "$2")")"
    for k in loss grad_norm; do check "$1" "$(metrics eq_cpu32)" "$(metrics "$2")" $k rel 1e-4 11; done
}
X="$SMALL $(mp float32)"
from10 eq_dev32a res_dev_cpu &&
    train res_dev_cpu 2 $SB $X --training.device=cpu --training.local_batch_size=4
resumed "resume $DEV -> 2 cpu ranks (dp_shard=2)" res_dev_cpu
from10 eq_cpu32 res_cpu_dev &&
    train res_cpu_dev 2 $SB $X --training.device=$DEV --parallelism.tensor_parallel_degree=2
resumed "resume cpu -> 2 $DEV ranks on one device (tp=2, data_plane auto)" res_cpu_dev
# the trainer says which data plane it chose: two ranks on one GPU stage
if grep -q "^device $DEV [0-9]*; .*; data plane staged through the host$" "$W/res_cpu_dev.log"; then
    verdict PASS "2 $DEV ranks on one device: the trainer chose the host-staged data plane"
else
    verdict FAIL "2 $DEV ranks on one device: no 'data plane staged through the host' line: $(grep "^device " "$W/res_cpu_dev.log" | head -n 1)"
fi
train staged2 2 $SB $X --training.device=$DEV --training.local_batch_size=4 --checkpoint.enable=false \
    --parallelism.data_plane=staged || verdict FAIL "staged2: $(why staged2)"
check "staged: 2 $DEV ranks on one device (dp_shard=2) against 1 cpu rank" "$(metrics eq_cpu32)" "$(metrics staged2)" loss rel 1e-5
check "staged: 2 $DEV ranks on one device (dp_shard=2) against 1 cpu rank" "$(metrics eq_cpu32)" "$(metrics staged2)" grad_norm rel 1e-4

# ---- 6 compute-sanitizer on the trainer's device steps ----
if [ $MODE = rehearse ]; then
    out "== 6 memcheck: rehearsal"
    verdict SKIP "memcheck of 2 device training steps: compute-sanitizer needs a GPU"
else
    out "== 6 memcheck: compute-sanitizer memcheck on 2 device steps of the debug model"
    CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
    if [ -z "$CS" ]; then
        verdict SKIP "memcheck of 2 training steps: no compute-sanitizer on this machine"
    else
        for p in float32 bfloat16; do
            [ $p = bfloat16 ] && [ $MP = 0 ] && continue
            timed "memcheck_train_$p" 50 "$CS" --tool memcheck --report-api-errors no --error-exitcode 99 "$T" train \
                $SMALL --training.steps=2 --checkpoint.enable=false --training.device=cuda $(mp $p) \
                --job.dump_folder="$W/memcheck_train_$p"
            grep -E "ERROR SUMMARY|Invalid" "$W/memcheck_train_$p.log" | sort | uniq -c | head -n 10 | tee -a "$SUMMARY"
            case $t_rc in
            0) verdict PASS "memcheck of 2 training steps ($p): no error, in $took s" ;;
            124 | 137) verdict INCOMPLETE "memcheck of 2 training steps ($p): did not finish in its $took s: no verdict" ;;
            *) verdict FAIL "memcheck of 2 training steps ($p): $(why "memcheck_train_$p")" ;;
            esac
        done
    fi
fi

# the logs and metrics stay; the checkpoints go (GPU_CHECK_KEEP=1 keeps them)
[ "${GPU_CHECK_KEEP:-0}" = 1 ] || rm -rf "$W"/*/checkpoint "$W/data"
out "== gpu_check $MODE: $fails failed, in $(($(date +%s) - START)) s (limit $DEADLINE s); logs in $W"
[ "$fails" = 0 ]
