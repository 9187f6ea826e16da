# mpi.sh: sourced by the multi-rank tests. run_np N CMD... runs CMD on N ranks
# (N = 1 without mpirun, so that the single-process path is covered too).
# mpirun is installed by the set-up (tools/deps.sh): missing, it is a failure.
. "$TSR_ROOT/tests/common.sh"
command -v mpirun >/dev/null ||
    { echo "FAIL: mpirun is not installed (the multi-rank tests need Open MPI: make deps)" >&2; exit 1; }
# Open MPI's own allocations outlive MPI_Finalize: leak checking stays on in the
# single-process tests, off for MPI jobs.
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1"
export OMPI_MCA_rmaps_base_oversubscribe=1
run_np() {
    n=$1; shift
    if [ "$n" = 1 ]; then "$@"; else timeout 300 mpirun --allow-run-as-root --oversubscribe -np "$n" "$@"; fi
}
