/* data_plane.h: the data plane, the typed collectives of training (gradients,
 * gathered weights, activations between pipeline stages).
 *
 * The control plane (include/tessera.h, "communication") moves bytes for the
 * engine and the command; the data plane moves elements of a dtype, in memory
 * that a stream may own: MPI over host memory (data_mpi.c) and, with a stream in
 * the CUDA build, NCCL over device memory (data_nccl.c), behind these same calls. Every rank of the group calls a
 * collective in the same order, with the same dtype and counts.
 *
 * Dtypes: TSR_F32, TSR_F64 and TSR_BF16. Sums of bf16 are computed in f32 and
 * rounded once to bf16 (round to nearest even) at the end. Every rank computes
 * the same result, bit for bit, run after run.
 *
 * Errors: TSR_EINVAL for a dtype the plane does not carry, a count over what one
 * call can move (INT_MAX elements per rank) or a stream on a build without
 * devices; TSR_ENOMEM; TSR_EIO for a failed transfer, with MPI's reason. */
#ifndef TSR_DATA_PLANE_H
#define TSR_DATA_PLANE_H

#include "tsr_comm.h"

/* tsr_data_allreduce_sum(): the elementwise sum over ranks of n elements at buf,
 * in place on every rank. */
int tsr_data_allreduce_sum(tsr_comm *c, tsr_dtype dt, void *buf, size_t n, tsr_stream *s, tsr_error *err);

/* tsr_data_allgatherv(): rank i's counts[i] elements (at send; send may be recv
 * plus rank i's displacement, then it is used in place) concatenated in rank
 * order into recv (sum of counts elements) on every rank. */
int tsr_data_allgatherv(tsr_comm *c, tsr_dtype dt, const void *send, void *recv, const size_t *counts,
                        tsr_stream *s, tsr_error *err);
/* tsr_data_allgather(): tsr_data_allgatherv with n elements from every rank. */
int tsr_data_allgather(tsr_comm *c, tsr_dtype dt, const void *send, void *recv, size_t n, tsr_stream *s,
                       tsr_error *err);

/* tsr_data_reduce_scatterv(): the elementwise sum over ranks of send (sum of
 * counts elements on every rank), scattered: rank i gets its counts[i] elements
 * (those after the counts of ranks below it) into recv. send and recv must not
 * overlap. */
int tsr_data_reduce_scatterv(tsr_comm *c, tsr_dtype dt, const void *send, void *recv, const size_t *counts,
                             tsr_stream *s, tsr_error *err);
/* tsr_data_reduce_scatter(): tsr_data_reduce_scatterv with n elements for every
 * rank (send holds n times the group's size). */
int tsr_data_reduce_scatter(tsr_comm *c, tsr_dtype dt, const void *send, void *recv, size_t n, tsr_stream *s,
                            tsr_error *err);

/* Point to point between two ranks of the group, under a tag (0..32767);
 * messages between two ranks with one tag arrive in the order they were sent.
 * tsr_data_send(): starts sending n elements at buf to peer and returns; buf
 * must stay unchanged until tsr_data_wait() on `pending` has returned.
 * tsr_data_recv(): returns once n elements from peer are at buf (on a stream:
 * once the receive is ordered on it). tsr_data_wait(): completes every send
 * started with `pending` (a set from tsr_comm_reqs_new) and empties it. */
int tsr_data_send(tsr_comm *c, uint32_t peer, int tag, tsr_dtype dt, const void *buf, size_t n,
                  tsr_comm_reqs *pending, tsr_stream *s, tsr_error *err);
int tsr_data_recv(tsr_comm *c, uint32_t peer, int tag, tsr_dtype dt, void *buf, size_t n, tsr_stream *s,
                  tsr_error *err);
int tsr_data_wait(tsr_comm *c, tsr_comm_reqs *pending, tsr_stream *s, tsr_error *err);

/* tsr_data_seconds(): the wall seconds this process has spent inside the calls
 * above since it started, waits for slower peers included; for calls on a
 * stream (NCCL), which return once queued, the stream's seconds in them,
 * timed by events, once they are done (the trainer takes
 * it from its step time to tell its own work from the wait for others: the
 * supervisor's straggler rule, README "Keeping a run alive"). Counted by the
 * thread that makes the calls; read it from that thread. */
double tsr_data_seconds(void);

#endif
