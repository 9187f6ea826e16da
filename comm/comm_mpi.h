/* comm_mpi.h: what the two planes over MPI share (control_mpi.c, data_mpi.c):
 * the group itself and the error of a failed MPI call. Not a public interface. */
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
};

/* The largest message of one MPI call, in bytes; longer ones are split. */
#define TSR_MPI_CHUNK (1 << 30)

/* tsr_mpi_err(): TSR_EIO into err, "MPI <what> failed: <MPI's reason for rc>". */
int tsr_mpi_err(tsr_error *err, int rc, const char *what);

#endif
