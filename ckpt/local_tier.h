/* local_tier.h: the local checkpoint tier (README, "Keeping a run alive"):
 * snapshots of the job's state in node memory, with a copy of each rank's part
 * on a partner node, and the recovery of the newest complete state from what
 * survives a failure.
 *
 * Layout under the tier's folder ROOT (checkpoint.local_folder; by default
 * /dev/shm/tessera-<hash of job.dump_folder>):
 *   ROOT/node-<k>/step-N/             the snapshot files written by the ranks of
 *                                     node k (data-<rank>.tsd) and the MANIFEST
 *   ROOT/node-<k>/partner/step-N/     copies of the data files of the ranks of
 *                                     the previous node in the ring, and the
 *                                     MANIFEST
 *   ROOT/node-<k>/recover/step-N/     a step assembled on node k to be loaded:
 *                                     hard links to its pieces, and the files it
 *                                     lacked, received from other nodes
 * A snapshot is a checkpoint in the usual format (raw frames: no compression),
 * written by a second engine whose root is each rank's node folder and committed
 * as every checkpoint is (every rank's part written, then rank 0's MANIFEST).
 * Each node keeps the newest two snapshots, and two partner copies.
 *
 * Fencing (FORMAT.md 4.6): a launch with an epoch raises ROOT/node-<k>/FENCE
 * and ROOT/node-<k>/partner/FENCE to it when the tier opens (the node's first
 * rank; only upward), its snapshots are written as that epoch (refused once a
 * newer launch has raised the fence), partner copies and the MANIFESTs copied
 * between nodes are refused the same way, and the recovery passes over (and
 * logs, naming it) a snapshot or copy that a fenced writer committed after
 * the fence.
 *
 * Nodes: checkpoint.local_nodes lists the ids of the nodes the ranks are spread
 * over, evenly and in rank order ("0,1": ranks 0..W/2-1 on node 0, the rest on
 * node 1); empty, every rank is on node 0. tessera launch sets it.
 */
#ifndef TSR_LOCAL_TIER_H
#define TSR_LOCAL_TIER_H

#include <stdint.h>
#include <stdio.h>

#include "tsr_ckpt.h"

#define TSR_LOCAL_KEEP 2       /* snapshots kept per node, and partner copies */
#define TSR_LOCAL_MAX_NODES 256

/* The tier's options (the trainer's checkpoint.local_* and job.dump_folder). */
typedef struct tsr_local_opts {
    const char *folder;      /* checkpoint.local_folder; NULL or "": the default */
    const char *dump_folder; /* job.dump_folder: the default folder is named by its hash */
    const char *nodes;       /* checkpoint.local_nodes (below); NULL or "": one node */
    double commit_timeout_s; /* checkpoint.commit_timeout_s of the snapshots' engine */
    uint64_t epoch;          /* the launch's epoch (tsr_write_opts.epoch); 0: none */
} tsr_local_opts;

/* tsr_local_root(): the tier's folder: `folder` if set, else
 * /dev/shm/tessera-<hash of dump_folder made absolute (against the working
 * directory)>. @return 0, or TSR_EINVAL when it does not fit len. */
int tsr_local_root(const char *folder, const char *dump_folder, char *out, size_t len, tsr_error *err);

/* tsr_local_node_dir(): ROOT/node-<node> into out. @return 0, or TSR_EINVAL. */
int tsr_local_node_dir(const char *root, int node, char *out, size_t len, tsr_error *err);

typedef struct tsr_local_tier tsr_local_tier;

/* tsr_local_open(): collective over world. Opens the tier's engine on this
 * rank's node folder (created if missing) and, when the ranks span more than
 * one node, the thread that sends partner copies. @return 0; TSR_EINVAL for a
 * checkpoint.local_nodes that is not a list of node ids dividing the ranks. */
int tsr_local_open(const tsr_local_opts *o, tsr_comm *world, tsr_local_tier **out, tsr_error *err);

/* tsr_local_save(): collective. Saves `st` as the snapshot of `step` and
 * returns once it is staged (the engine's asynchronous save: encoding, writing
 * and the commit go on in the background). First the previous snapshot's
 * commit is waited for, and its copies are handed to the copy thread (once
 * those of the one before are done): the MANIFEST goes to every node's folder,
 * each rank sends its data file to its partner (the rank of the same place on
 * the next node, over the comm), and each node keeps TSR_LOCAL_KEEP of each.
 * A failure of the background work is written to stderr, naming the rank and
 * the step, and fails nothing. */
int tsr_local_save(tsr_local_tier *lt, uint64_t step, const tsr_state *st, tsr_error *err);

/* tsr_local_staged(): the last snapshot's copy of this rank's state done (its
 * engine overlaps the copy with the next step: tsr_engine_staged). Not
 * collective; NULL: nothing. */
void tsr_local_staged(tsr_local_tier *lt);
/* tsr_local_poll(): not collective; every step. Once the last snapshot has
 * committed and the copy thread is idle, hands its copies over at once, so
 * that partner copies follow their snapshot within a step or so, not at the
 * next snapshot. (Every rank hands over the same snapshots in the same order:
 * a save hands over any still staged.) */
void tsr_local_poll(tsr_local_tier *lt);

/* tsr_local_flush(): collective. The last snapshot's commit is waited for
 * and its copies are handed to the copy thread (at the end of a run). */
void tsr_local_flush(tsr_local_tier *lt);

/* tsr_local_free(): waits for the copies in flight and releases the tier. The
 * files stay (tessera launch removes them once the run is over). NULL: no-op. */
void tsr_local_free(tsr_local_tier *lt);

/* tsr_local_recover(): collective, at a (re)start. The newest step, not older
 * than min_step (-1: any), that the surviving nodes hold complete between them: a
 * MANIFEST and every data file it names, at the size it names, in some node's own
 * snapshot or partner copy. Each node's first rank reports what its own folder
 * holds (no rank looks into another node's memory, as on separate machines);
 * every rank picks the same step from the reports. A step whose pieces are
 * missing or damaged is passed over, each refusal written to log (NULL: stderr)
 * with the file and the reason. Then each node's first rank makes
 * ROOT/node-<id>/recover/step-N: links to the pieces it holds, the files it lacks
 * received from a node that holds them (over the comm), the MANIFEST last; its
 * path goes to dir on every rank of the node.
 * @return 1 with *step, 0 when no step is complete, or a negative status. */
int tsr_local_recover(tsr_local_tier *lt, int64_t min_step, FILE *log, uint64_t *step, char *dir, size_t len,
                      tsr_error *err);

/* tsr_local_forget_after(): each node's first rank removes its snapshots and
 * partner copies of a step after `step` (a future the job abandons on resuming
 * from `step`), and its recover folder. Called by every rank after a load. */
void tsr_local_forget_after(tsr_local_tier *lt, uint64_t step);

#endif
