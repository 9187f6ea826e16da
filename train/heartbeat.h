/* heartbeat.h: the training job's side of `tessera launch` (the supervisor,
 * launch/): each rank tells the supervisor where it is, and leaves
 * when the supervisor is gone.
 *
 * The supervisor listens on a Unix stream socket whose path it passes to the
 * ranks in TSR_HEARTBEAT, with a per-launch token (16 hex digits) in
 * TSR_HEARTBEAT_TOKEN. Each rank connects once and sends fixed-size records
 * (TSR_HB_RECORD bytes, little-endian, below) at its phase changes and at the
 * end of every step. End of stream on the rank's side means the supervisor
 * died or gave the job up, and the rank exits at once (a watchdog thread), so
 * that no rank outlives its supervisor, even one blocked in a collective. The
 * supervisor writes nothing else than commands (TSR_HB_COMMAND bytes: magic
 * u32 "TSHC" | kind u32 | arg u64), which the watchdog carries out: the faults
 * of `tessera launch --chaos`: TSR_HB_CMD_NAN (arg: the step of this launch
 * whose loss is taken as NaN), TSR_HB_CMD_ENOSPC (through the
 * fault-injecting store, tsr_fault_set: the process's next write to a store
 * fails with ENOSPC), TSR_HB_CMD_S3 (an S3 outage: tsr_fault_outage) and
 * TSR_HB_CMD_BITFLIP (arg: which bit of which weight this rank flips, at its
 * next step boundary, on its training thread: tsr_heartbeat_chaos_bitflip);
 * and preemption, TSR_HB_CMD_PREEMPT (arg: the grace in milliseconds:
 * tsr_heartbeat_preempt).
 * Without TSR_HEARTBEAT every call here is a no-op.
 *
 * Record layout (80 bytes, version 2): magic u32 "TSHB" | version u16 |
 * phase u16 | token u64 | rank u32 | world u32 | pid u32 | zero u32 | step i64 |
 * loss f64 | grad_norm f64 | time f64 (Unix seconds) | step_s f64 (this rank's
 * time for the step) | compute_s f64 (step_s less the time spent in the data
 * plane's calls, tsr_data_seconds: the rank's own work, without its waits for
 * the others; the straggler rule compares it).
 *
 * A TSR_HB_SDC record (silent data corruption: train/sdc.c) is sent by every
 * rank of a job whose replica check failed, before the rank fails its step:
 * step is the step checked; loss the verdict on this rank (0: not named, its
 * copies agree with the others' or with its group's majority; 1: named, its
 * group has no majority, so no copy is blamed; 2: named and blamed, a
 * majority of its group holds another hash); grad_norm the holders of its
 * group when their copies differ (else 0); step_s how many of them hold its
 * hash (itself included); compute_s 0. The ranks of a group that differs send
 * theirs before any rank can leave, so the supervisor learns of the
 * corruption before it sees a rank's end of stream. The layout is version 2's.
 *
 * A TSR_HB_PREEMPTED record is sent by every rank of a job that the
 * supervisor preempted (TSR_HB_CMD_PREEMPT), once it has stopped: step is the
 * last step it trained; loss the step its local tier committed then (-1:
 * none); grad_norm the step its durable tier committed then (-1: none, the
 * save did not fit the grace); step_s and compute_s the seconds from the
 * command (from the stop, on a rank that the others' vote stopped before the
 * command reached it) to those commits (0: none). The layout is version 2's.
 */
#ifndef TSR_HEARTBEAT_H
#define TSR_HEARTBEAT_H

#include <stdint.h>

#include "tsr_base.h"

#define TSR_HB_MAGIC 0x42485354u /* "TSHB" little-endian */
#define TSR_HB_VERSION 2
#define TSR_HB_RECORD 80
#define TSR_HB_CMD_MAGIC 0x43485354u /* "TSHC" little-endian */
#define TSR_HB_COMMAND 16
#define TSR_HB_CMD_NAN 1     /* arg: a step of this launch whose loss is taken as NaN */
#define TSR_HB_CMD_ENOSPC 2  /* the next write to the durable tier fails: no space */
#define TSR_HB_CMD_S3 3      /* arg: milliseconds in which every S3 request fails (HTTP 503) */
#define TSR_HB_CMD_BITFLIP 4 /* arg: selects a bit of a weight that this rank flips (tsr_heartbeat_chaos_bitflip) */
#define TSR_HB_CMD_PREEMPT 5 /* arg: milliseconds of grace: stop after a step, its state committed (tsr_heartbeat_preempt) */
#define TSR_HB_ENV "TSR_HEARTBEAT"
#define TSR_HB_TOKEN_ENV "TSR_HEARTBEAT_TOKEN"

/* The phases a record reports. */
enum {
    TSR_HB_START = 1, /* connected: the job is starting (data, engine) */
    TSR_HB_LOAD,      /* resuming from a checkpoint */
    TSR_HB_STEP,      /* a step ended: step, loss, grad_norm, step_s */
    TSR_HB_SAVE,      /* a checkpoint of `step` is being staged */
    TSR_HB_DONE,      /* the job finished on this rank */
    TSR_HB_SDC,       /* the replica check of `step` failed: the verdict on this rank (above) */
    TSR_HB_PREEMPTED, /* preempted: stopped after `step`, what it committed (below) */
    TSR_HB_N_PHASES
};

typedef struct tsr_hb_record {
    uint32_t magic;
    uint16_t version, phase;
    uint64_t token;
    uint32_t rank, world, pid;
    int64_t step;
    double loss, grad_norm, time, step_s, compute_s;
} tsr_hb_record;

/* tsr_hb_encode() / tsr_hb_decode(): a record to and from its 80 bytes. */
void tsr_hb_encode(const tsr_hb_record *r, uint8_t out[TSR_HB_RECORD]);
void tsr_hb_decode(const uint8_t in[TSR_HB_RECORD], tsr_hb_record *r);

/* tsr_hb_command(): the bytes of a command of `kind` with `arg` (the
 * supervisor's side). */
void tsr_hb_command(uint32_t kind, uint64_t arg, uint8_t out[TSR_HB_COMMAND]);

/* tsr_hb_phase_name(): "start", "load", "step", "save", "done"; "?" otherwise. */
const char *tsr_hb_phase_name(int phase);

typedef struct tsr_heartbeat tsr_heartbeat;

/* tsr_heartbeat_open(): under a supervisor (TSR_HEARTBEAT set), connects to it,
 * sends TSR_HB_START for `rank` of `world` and starts the watchdog thread;
 * *out is NULL when there is no supervisor. @return 0; TSR_EINVAL when
 * TSR_HEARTBEAT_TOKEN is missing or malformed; TSR_EIO naming the socket when
 * the supervisor cannot be reached (it is gone: the job must not run on). */
int tsr_heartbeat_open(int rank, int world, tsr_heartbeat **out, tsr_error *err);

/* tsr_heartbeat_send(): one record (h NULL: nothing), compute_s 0. Never
 * blocks: a record that does not fit the socket's buffer is dropped. A
 * supervisor that is gone (the connection refused or reset) ends the process
 * with status 1. tsr_heartbeat_step(): the record of a step that ended
 * (TSR_HB_STEP), with its compute time. */
void tsr_heartbeat_send(tsr_heartbeat *h, int phase, int64_t step, double loss, double grad_norm, double step_s);
void tsr_heartbeat_step(tsr_heartbeat *h, int64_t step, double loss, double grad_norm, double step_s, double compute_s);

/* tsr_heartbeat_sdc(): the TSR_HB_SDC record of a failed replica check at
 * `step` (h NULL: nothing): verdict 0, 1 or 2, the holders of this rank's
 * group whose copies differ and how many of them agree with it (0 and 0 when
 * its groups agree). */
void tsr_heartbeat_sdc(tsr_heartbeat *h, int64_t step, int verdict, int holders, int agree);

/* tsr_heartbeat_preempt(): 1 once the supervisor's TSR_HB_CMD_PREEMPT came
 * (tsr_now() when it came into *heard, that plus its grace into *deadline,
 * each unless NULL), else 0. The training loop asks at a step's first and last
 * all-reduce and stops after the step in which any rank was asked
 * (tsr_trainer's stop_poll, train_loop.c). tsr_heartbeat_preempted(): the
 * TSR_HB_PREEMPTED record (above; h NULL: nothing). */
int tsr_heartbeat_preempt(double *heard, double *deadline);
void tsr_heartbeat_preempted(tsr_heartbeat *h, int64_t step, int64_t local_step, int64_t durable_step,
                             double local_s, double durable_s);

/* tsr_heartbeat_close(): stops the watchdog and closes the connection (the
 * supervisor then sees end of stream). NULL is a no-op. */
void tsr_heartbeat_close(tsr_heartbeat *h);

/* The test hook of the supervisor's NaN rollback. tsr_heartbeat_set_fault_nan():
 * from now on (for the process), the global batch that step `step` (>= 1; 0
 * turns it off) of an uninterrupted run trains on has its loss taken as NaN;
 * the command sets it from TSR_FAULT_NAN (tools/cli.c). tsr_heartbeat_fault_nan():
 * 1 for that batch (the one starting at sample index (step-1)*global_batch over
 * the epochs), else 0; `first_sample` is epoch * samples_per_epoch + sample of
 * the position before the batch. */
void tsr_heartbeat_set_fault_nan(uint64_t step);
int tsr_heartbeat_fault_nan(uint64_t first_sample, int global_batch);

/* tsr_heartbeat_chaos_nan(): 1 when `step` is the step of this process that
 * the supervisor's TSR_HB_CMD_NAN named (the process's own numbering: a
 * relaunch, a new process, does not repeat it), else 0. */
int tsr_heartbeat_chaos_nan(int64_t step);

/* tsr_heartbeat_chaos_bitflip(): 1 once after the supervisor's
 * TSR_HB_CMD_BITFLIP came (its arg into *arg), else 0: the training loop asks
 * at each step boundary and flips the bit itself, through the kernel context
 * (the watchdog never touches the trainer's memory). */
int tsr_heartbeat_chaos_bitflip(uint64_t *arg);

/* The test hook of the straggler rule. tsr_heartbeat_set_fault_slow(): from now
 * on, rank `rank` (-1: none) works `ms` milliseconds longer each step; the
 * command sets it from TSR_FAULT_SLOW=RANK:MS (tools/cli.c).
 * tsr_heartbeat_fault_slow(): sleeps those milliseconds when `rank` is the slow
 * one. */
void tsr_heartbeat_set_fault_slow(int rank, int ms);
void tsr_heartbeat_fault_slow(int rank);

#endif
