/* tsr_comm.h: the public part of comm/: a group of ranks and its collectives.
 * Conventions: tessera.h. */
#ifndef TSR_COMM_H
#define TSR_COMM_H

#include <stddef.h>
#include <stdint.h>
#include "tsr_base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ communication */

/* A group of ranks and its control plane: bytes for the engine and the command
 * (the group, broadcast, gathers with a deadline, barriers, point to point),
 * over MPI (comm/control_mpi.c). Blocking; every rank of the group calls a
 * collective in the same order. A tsr_comm may be used from one thread at a
 * time; the engine duplicates the caller's for its own thread. The trainer's
 * typed collectives on host or device memory are the data plane, comm/data_plane.h. */
typedef struct tsr_comm tsr_comm;

/* tsr_comm_self(): a group of one rank (no MPI needed). */
tsr_comm *tsr_comm_self(void);
/* tsr_comm_mpi_world(): MPI_COMM_WORLD, initializing MPI (with
 * MPI_THREAD_MULTIPLE) if it is not yet; tsr_comm_free finalizes what it
 * initialized. */
tsr_comm *tsr_comm_mpi_world(tsr_error *err);
/* tsr_comm_dup(): a new communicator over the same ranks (collective). */
tsr_comm *tsr_comm_dup(tsr_comm *c, tsr_error *err);
void tsr_comm_free(tsr_comm *c);
uint32_t tsr_comm_rank(const tsr_comm *c);
uint32_t tsr_comm_size(const tsr_comm *c);

/* tsr_comm_split(): collective; the ranks passing the same color >= 0 form a new
 * communicator (ordered by key, then rank); color -1 gets NULL and no error. */
tsr_comm *tsr_comm_split(tsr_comm *c, int color, int key, tsr_error *err);

/* tsr_comm_node_rank(): collective; this rank's place among the ranks of the
 * group on its node (one shared-memory domain): *rank of *size (0 of 1 alone). */
int tsr_comm_node_rank(tsr_comm *c, uint32_t *rank, uint32_t *size, tsr_error *err);

int tsr_comm_barrier(tsr_comm *c, tsr_error *err);
/* tsr_comm_barrier_idle(): a barrier that sleeps (1 ms polls) instead of
 * spinning, for ranks that wait a long time and should leave the cores to
 * those that work. */
int tsr_comm_barrier_idle(tsr_comm *c, tsr_error *err);
/* tsr_comm_bcast(): root's n bytes at buf to every rank. */
int tsr_comm_bcast(tsr_comm *c, uint32_t root, void *buf, size_t n, tsr_error *err);
/* tsr_comm_allreduce_min(): the minimum of every rank's *v, into *v everywhere. */
int tsr_comm_allreduce_min(tsr_comm *c, int64_t *v, tsr_error *err);
/* tsr_comm_allreduce_xor_sum_u64(): v holds n pairs of words (n at most
 * INT_MAX); into v everywhere, in one all-reduce, each pair's first words xored
 * and its second words summed modulo 2^64 over every rank. */
int tsr_comm_allreduce_xor_sum_u64(tsr_comm *c, uint64_t *v, size_t n, tsr_error *err);
/* tsr_comm_allgatherv(): every rank's n bytes, concatenated in rank order into
 * *all (malloc'ed) on every rank; counts[r] (malloc'ed, size ranks) is rank r's
 * byte count. */
int tsr_comm_allgatherv(tsr_comm *c, const void *buf, size_t n, uint8_t **all, size_t **counts,
                        tsr_error *err);
/* Exchanges with a deadline, for work that must not hang on a rank that never
 * arrives (the engine's commit): point to point under `tag`, polled with short
 * sleeps instead of blocking. Only receivers wait: a sender returns at once and
 * the comm keeps its copy of the message until it is taken. timeout_s <= 0 waits
 * forever. Each rank's n must be below 2 GiB. A message that comes after its
 * receiver gave up is never received: a group that timed out should not run
 * such an exchange again (the engine stops saving). A timeout is TSR_EIO with a
 * message naming the ranks, e.g. "ranks 3, 5 did not report within 2.0 s".
 * tsr_comm_gatherv_deadline(): only `root` receives every rank's message (as
 * tsr_comm_allgatherv lays them out), gathered in a tree: each
 * rank forwards its own message and those of the ranks below it, so that no
 * rank receives more than about sqrt(size) messages. The root waits until
 * timeout_s for all; a rank with ranks below it waits a share of timeout_s
 * (every rank must pass the same), then forwards what came, marking the rest
 * late. The root's error names the late ranks, and those whose messages would
 * have come through them. */
int tsr_comm_gatherv_deadline(tsr_comm *c, uint32_t root, int tag, const void *buf, size_t n,
                              double timeout_s, uint8_t **all, size_t **counts, tsr_error *err);
/* tsr_comm_gather_fanin(): how many ranks send to each rank of that tree (the
 * most messages one rank receives) in a group of `size`. */
uint32_t tsr_comm_gather_fanin(uint32_t size);
/* tsr_comm_bcast_deadline(): root's n bytes at buf to every rank; the others
 * wait until timeout_s for them ("rank 0 did not answer within 2.0 s"). */
int tsr_comm_bcast_deadline(tsr_comm *c, uint32_t root, int tag, void *buf, size_t n, double timeout_s,
                            tsr_error *err);
/* tsr_comm_iprobe(): 1 if a message from peer with tag is waiting, else 0. Not
 * collective, never blocks. */
int tsr_comm_iprobe(tsr_comm *c, uint32_t peer, int tag);
/* Point to point: a message of n bytes with a tag (0..32767), received whole
 * (sent by tsr_comm_isend). Messages between two ranks with one tag arrive in
 * the order they were sent. */
int tsr_comm_recv(tsr_comm *c, uint32_t peer, int tag, void *buf, size_t n, tsr_error *err);
/* Nonblocking point to point: requests collect in a tsr_comm_reqs, and
 * tsr_comm_waitall completes all of them (and empties the set). */
typedef struct tsr_comm_reqs tsr_comm_reqs;
tsr_comm_reqs *tsr_comm_reqs_new(void);
void tsr_comm_reqs_free(tsr_comm_reqs *r);
int tsr_comm_isend(tsr_comm *c, uint32_t peer, int tag, const void *buf, size_t n, tsr_comm_reqs *r,
                   tsr_error *err);
int tsr_comm_irecv(tsr_comm *c, uint32_t peer, int tag, void *buf, size_t n, tsr_comm_reqs *r,
                   tsr_error *err);
int tsr_comm_waitall(tsr_comm *c, tsr_comm_reqs *r, tsr_error *err);
/* tsr_comm_reqs_count(): the requests added to r since it was last emptied (a
 * message over 1 GiB adds several). tsr_comm_waitany(): waits until one of them
 * not yet seen completes and sets *index to its place in that order; SIZE_MAX
 * (and r emptied) when every one has. After a failure, tsr_comm_waitall waits
 * for the rest. */
size_t tsr_comm_reqs_count(const tsr_comm_reqs *r);
int tsr_comm_waitany(tsr_comm *c, tsr_comm_reqs *r, size_t *index, tsr_error *err);

#ifdef __cplusplus
}
#endif
#endif
