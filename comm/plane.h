/* plane.h: the data plane (data_plane.h) over the memory of a kernel context
 * (kernels/kctx.h): the trainer's collectives and pipeline messages.
 *
 * Three ways, one set of calls: host memory goes to MPI as it is; device
 * memory to NCCL on the context's stream; and, staged, device memory (or the
 * guard kind that stands in for it) is copied to the host by the context,
 * moved by MPI and copied back. Staging is what runs where NCCL cannot: ranks
 * that share a GPU (NCCL refuses two ranks on one device), and the guard kind
 * on machines without one, so that every multi-rank device code path runs
 * there. The arguments and results are data_plane.h's. */
#ifndef TSR_PLANE_H
#define TSR_PLANE_H

#include "data_plane.h"
#include "kctx.h"

typedef struct tsr_plane {
    tsr_kctx *kc;
    int staged;          /* through host memory */
    void *host;          /* staging for a collective, grown as needed */
    size_t cap;
    void **sends;        /* staged sends' host copies, freed once the sends complete */
    size_t n_sends, cap_sends;
} tsr_plane;

/* tsr_plane_init(): staged: 1 to go through host memory (the guard kind always
 * does), 0 for MPI on host memory or NCCL on a device's. */
void tsr_plane_init(tsr_plane *p, tsr_kctx *kc, int staged);
void tsr_plane_free(tsr_plane *p);

int tsr_plane_allreduce_sum(tsr_plane *p, tsr_comm *c, tsr_dtype dt, void *buf, size_t n, tsr_error *err);
int tsr_plane_allgatherv(tsr_plane *p, tsr_comm *c, tsr_dtype dt, const void *send, void *recv, const size_t *counts,
                         tsr_error *err);
int tsr_plane_allgather(tsr_plane *p, tsr_comm *c, tsr_dtype dt, const void *send, void *recv, size_t n,
                        tsr_error *err);
int tsr_plane_reduce_scatterv(tsr_plane *p, tsr_comm *c, tsr_dtype dt, const void *send, void *recv,
                              const size_t *counts, tsr_error *err);
int tsr_plane_reduce_scatter(tsr_plane *p, tsr_comm *c, tsr_dtype dt, const void *send, void *recv, size_t n,
                             tsr_error *err);
int tsr_plane_send(tsr_plane *p, tsr_comm *c, uint32_t peer, int tag, tsr_dtype dt, const void *buf, size_t n,
                   tsr_comm_reqs *pending, tsr_error *err);
int tsr_plane_recv(tsr_plane *p, tsr_comm *c, uint32_t peer, int tag, tsr_dtype dt, void *buf, size_t n,
                   tsr_error *err);
int tsr_plane_wait(tsr_plane *p, tsr_comm *c, tsr_comm_reqs *pending, tsr_error *err);

#endif
