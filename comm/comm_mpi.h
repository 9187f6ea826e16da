/* comm_mpi.h: what the planes over MPI share (control_mpi.c, data_mpi.c,
 * data_nccl.c): the group itself, and (comm_mpi.c) the error of a failed MPI
 * call and the waits of ranks that share cores. Not a public interface. */
#ifndef TSR_COMM_MPI_H
#define TSR_COMM_MPI_H

#include <mpi.h>

#include "common.h"
#include "tsr_comm.h"

struct tsr_comm {
    int is_mpi;
    MPI_Comm comm;
    uint32_t rank, size;
    int finalize; /* MPI_Finalize on free: this comm initialized MPI */
    /* sends of the deadline exchanges, in flight: nobody waits for them (their
     * receiver may never come); each buffer is freed once its send completes */
    struct owned_send {
        MPI_Request q;
        void *buf;
    } *sends;
    size_t n_sends, cap_sends;
    void *nccl; /* the CUDA build's NCCL communicator of the group (ncclComm_t), made on first use */
    void (*nccl_free)(tsr_comm *c); /* set with nccl by the plane that made it: destroys it */
};

/* The largest message of one MPI call, in bytes; longer ones are split. */
#define TSR_MPI_CHUNK (1 << 30)

/* tsr_mpi_err(): TSR_EIO into err, "MPI <what> failed: <MPI's reason for rc>". */
int tsr_mpi_err(tsr_error *err, int rc, const char *what);

/* tsr_mpi_wait(): MPI_Wait(q), but where this node runs more ranks than it has
 * cores for them, a wait that sleeps between tests: Open MPI's blocking calls
 * spin there, calling sched_yield, and a make test of oversubscribed jobs spent
 * as much time in the kernel as in tessera. @return MPI's code. */
int tsr_mpi_wait(MPI_Request *q);
/* TSR_MPI_COLL(rc, MPI_Name, MPI_Iname, args...): rc = MPI_Name(args...) where
 * each rank has a core; MPI_Iname(args..., &q) and tsr_mpi_wait(&q) where ranks
 * share cores. */
int tsr_mpi_shared_cores(void);
#define TSR_MPI_COLL(rc, blocking, nonblocking, ...)                                                              \
    do {                                                                                                         \
        if (!tsr_mpi_shared_cores()) {                                                                           \
            (rc) = blocking(__VA_ARGS__);                                                                        \
        } else {                                                                                                 \
            MPI_Request q_;                                                                                      \
            (rc) = nonblocking(__VA_ARGS__, &q_);                                                                \
            if ((rc) == MPI_SUCCESS) (rc) = tsr_mpi_wait(&q_);                                                   \
        }                                                                                                        \
    } while (0)

#endif
