/* data_nccl.h: the data plane on a stream, over NCCL (the CUDA build): what
 * data_mpi.c hands a call with a stream to. Device memory; every call is queued
 * on the stream and returns. bf16 sums are computed in f32 on the device and
 * rounded once, as on the host. Not a public interface. */
#ifndef TSR_DATA_NCCL_H
#define TSR_DATA_NCCL_H

#include "data_plane.h"

/* Each as its tsr_data_* namesake with s != NULL. The group's NCCL communicator
 * is made on first use (rank 0's unique id broadcast over MPI), on the device
 * that is current on each rank. */
int tsr_nccl_allreduce_sum(tsr_comm *c, tsr_dtype dt, void *buf, size_t n, tsr_stream *s, tsr_error *err);
int tsr_nccl_allgatherv(tsr_comm *c, tsr_dtype dt, const void *send, void *recv, const size_t *counts,
                        tsr_stream *s, tsr_error *err);
int tsr_nccl_reduce_scatterv(tsr_comm *c, tsr_dtype dt, const void *send, void *recv, const size_t *counts,
                             tsr_stream *s, tsr_error *err);
int tsr_nccl_send(tsr_comm *c, uint32_t peer, tsr_dtype dt, const void *buf, size_t n, tsr_stream *s,
                  tsr_error *err);
int tsr_nccl_recv(tsr_comm *c, uint32_t peer, tsr_dtype dt, void *buf, size_t n, tsr_stream *s, tsr_error *err);
/* Sends are held until the next receive, collective or wait, and queued with
 * the receive as one NCCL group (data_nccl.c says why). tsr_nccl_wait(): the
 * held sends queued, then waits for the work queued on s. */
int tsr_nccl_wait(tsr_stream *s, tsr_error *err);
/* tsr_nccl_seconds(): the seconds the streams spent in the calls above that
 * are done (timed by events around each one): waits for peers included. */
double tsr_nccl_seconds(void);

#endif
