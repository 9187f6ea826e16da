/* comm_mpi.c: what the planes over MPI share (comm_mpi.h): the error of a
 * failed MPI call and the waits of ranks that share cores. */
#include <sched.h>
#include <stdlib.h>
#include <time.h>

#include "comm_mpi.h"

int tsr_mpi_err(tsr_error *err, int rc, const char *what) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return tsr_err(err, TSR_EIO, "MPI %s failed: %.*s", what, len, msg);
}

/* Whether this node runs more ranks than the cores this process may use (Open
 * MPI's mpirun says how many ranks it started here): decided once. */
int tsr_mpi_shared_cores(void) {
    static int shared = -1;
    if (shared < 0) {
        const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
        cpu_set_t set;
        int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
        shared = local && atoi(local) > cores;
    }
    return shared;
}

/* Tests every 20 us at first, then less often up to every 250 us: a collective
 * advances only while its ranks call into MPI, so the sleeps stay short. */
int tsr_mpi_wait(MPI_Request *q) {
    if (!tsr_mpi_shared_cores()) return MPI_Wait(q, MPI_STATUS_IGNORE);
    long ns = 20000;
    for (;;) {
        int done = 0, rc = MPI_Test(q, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS || done) return rc;
        struct timespec ts = {0, ns};
        nanosleep(&ts, NULL);
        if (ns < 250000) ns *= 2;
    }
}
