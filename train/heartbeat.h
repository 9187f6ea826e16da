/* heartbeat.h: the training job's side of `tessera launch` (the supervisor,
 * launch/): each rank tells the supervisor where it is, and leaves
 * when the supervisor is gone.
 *
 * The supervisor listens on a Unix stream socket (the ranks on its machine) or
 * a TCP port (ranks on other hosts: --hostfile) and passes its address to the
 * ranks in TSR_HEARTBEAT (a path, or "tcp:ADDR:PORT"), with a per-launch key
 * (32 random bytes, 64 hex digits) in TSR_HEARTBEAT_KEY and, optionally, the
 * seconds after which a rank that hears nothing from it stops itself in
 * TSR_HEARTBEAT_ORPHAN_S. Each rank connects once. The supervisor's first
 * bytes on every connection are a hello (TSR_HB_HELLO bytes: magic u32 "TSHN"
 * | version u32 | nonce, 24 random bytes). Then the rank sends records
 * (TSR_HB_RECORD bytes, little-endian, below) at its phase changes and at the
 * end of every step, and the supervisor sends commands (TSR_HB_COMMAND bytes:
 * magic u32 "TSHC" | kind u32 | arg u64 | seq u64 | tag). Every record and
 * command ends with a tag, HMAC-SHA256 under the key of the connection's nonce
 * followed by the message's bytes before the tag, and carries a sequence
 * number that grows by one from 1 on each side of a connection: a sender
 * without the key, or one replaying a message of this or another connection,
 * is refused. End of stream on the rank's side means the supervisor died or
 * gave the job up, and the rank exits at once (a watchdog thread), so that no
 * rank outlives its supervisor, even one blocked in a collective; so does a
 * rank that has heard nothing from it (not even its TSR_HB_CMD_ALIVE, sent
 * twice a second) for TSR_HEARTBEAT_ORPHAN_S seconds: a rank cut off by a
 * network partition. The watchdog answers each TSR_HB_CMD_ALIVE with a
 * TSR_HB_ALIVE record (step: the command's arg), also while the training
 * thread is blocked: the supervisor tells a rank that waits for others from
 * one that is gone with its host. The other commands, which the watchdog
 * carries out: the faults of `tessera launch --chaos`: TSR_HB_CMD_NAN (arg:
 * the step of this launch whose loss is taken as NaN), TSR_HB_CMD_ENOSPC
 * (through the fault-injecting store, tsr_fault_set: the process's next write
 * to a store fails with ENOSPC), TSR_HB_CMD_S3 (an S3 outage:
 * tsr_fault_outage) and TSR_HB_CMD_BITFLIP (arg: which bit of which weight
 * this rank flips, at its next step boundary, on its training thread:
 * tsr_heartbeat_chaos_bitflip); and preemption, TSR_HB_CMD_PREEMPT (arg: the
 * grace in milliseconds: tsr_heartbeat_preempt).
 * Without TSR_HEARTBEAT every call here is a no-op.
 *
 * Record layout (112 bytes, version 3): magic u32 "TSHB" | version u16 |
 * phase u16 | seq u64 | rank u32 | world u32 | pid u32 | zero u32 | step i64 |
 * loss f64 | grad_norm f64 | time f64 (Unix seconds) | step_s f64 (this rank's
 * time for the step) | compute_s f64 (step_s less the time spent in the data
 * plane's calls, tsr_data_seconds: the rank's own work, without its waits for
 * the others; the straggler rule compares it) | tag (32 bytes).
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
 * corruption before it sees a rank's end of stream.
 *
 * A TSR_HB_PREEMPTED record is sent by every rank of a job that the
 * supervisor preempted (TSR_HB_CMD_PREEMPT), once it has stopped: step is the
 * last step it trained; loss the step its local tier committed then (-1:
 * none); grad_norm the step its durable tier committed then (-1: none, the
 * save did not fit the grace); step_s and compute_s the seconds from the
 * command (from the stop, on a rank that the others' vote stopped before the
 * command reached it) to those commits (0: none).
 */
#ifndef TSR_HEARTBEAT_H
#define TSR_HEARTBEAT_H

#include <stdint.h>

#include "tsr_base.h"

#define TSR_HB_MAGIC 0x42485354u /* "TSHB" little-endian */
#define TSR_HB_VERSION 3
#define TSR_HB_TAG 32      /* HMAC-SHA256 */
#define TSR_HB_KEY 32      /* the per-launch key's bytes */
#define TSR_HB_NONCE 24    /* a connection's nonce */
#define TSR_HB_BODY 80     /* a record's bytes before its tag */
#define TSR_HB_RECORD (TSR_HB_BODY + TSR_HB_TAG)
#define TSR_HB_CMD_MAGIC 0x43485354u /* "TSHC" little-endian */
#define TSR_HB_CMD_BODY 24
#define TSR_HB_COMMAND (TSR_HB_CMD_BODY + TSR_HB_TAG)
#define TSR_HB_HELLO_MAGIC 0x4e485354u /* "TSHN" little-endian */
#define TSR_HB_HELLO (8 + TSR_HB_NONCE)
#define TSR_HB_CMD_NAN 1     /* arg: a step of this launch whose loss is taken as NaN */
#define TSR_HB_CMD_ENOSPC 2  /* the next write to the durable tier fails: no space */
#define TSR_HB_CMD_S3 3      /* arg: milliseconds in which every S3 request fails (HTTP 503) */
#define TSR_HB_CMD_BITFLIP 4 /* arg: selects a bit of a weight that this rank flips (tsr_heartbeat_chaos_bitflip) */
#define TSR_HB_CMD_PREEMPT 5 /* arg: milliseconds of grace: stop after a step, its state committed (tsr_heartbeat_preempt) */
#define TSR_HB_CMD_ALIVE 6   /* arg: a count; the watchdog answers with TSR_HB_ALIVE */
#define TSR_HB_ENV "TSR_HEARTBEAT"
#define TSR_HB_KEY_ENV "TSR_HEARTBEAT_KEY"
#define TSR_HB_ORPHAN_ENV "TSR_HEARTBEAT_ORPHAN_S"

/* The phases a record reports. */
enum {
    TSR_HB_START = 1, /* connected: the job is starting (data, engine) */
    TSR_HB_LOAD,      /* resuming from a checkpoint */
    TSR_HB_STEP,      /* a step ended: step, loss, grad_norm, step_s */
    TSR_HB_SAVE,      /* a checkpoint of `step` is being staged */
    TSR_HB_DONE,      /* the job finished on this rank */
    TSR_HB_SDC,       /* the replica check of `step` failed: the verdict on this rank (above) */
    TSR_HB_PREEMPTED, /* preempted: stopped after `step`, what it committed (below) */
    TSR_HB_ALIVE,     /* the watchdog's answer to TSR_HB_CMD_ALIVE (step: its arg); not a phase change */
    TSR_HB_N_PHASES
};

typedef struct tsr_hb_record {
    uint32_t magic;
    uint16_t version, phase;
    uint64_t seq;
    uint32_t rank, world, pid;
    int64_t step;
    double loss, grad_norm, time, step_s, compute_s;
} tsr_hb_record;

/* tsr_hb_encode() / tsr_hb_decode(): a record to and from its TSR_HB_BODY
 * bytes (the tag: tsr_hb_seal). */
void tsr_hb_encode(const tsr_hb_record *r, uint8_t out[TSR_HB_BODY]);
void tsr_hb_decode(const uint8_t in[TSR_HB_BODY], tsr_hb_record *r);

/* tsr_hb_command(): the TSR_HB_CMD_BODY bytes of a command of `kind` with
 * `arg`, the sender's sequence number `seq` (the supervisor's side). */
void tsr_hb_command(uint32_t kind, uint64_t arg, uint64_t seq, uint8_t out[TSR_HB_CMD_BODY]);

/* tsr_hb_hello(): the TSR_HB_HELLO bytes the supervisor sends first on a
 * connection, with its nonce. */
void tsr_hb_hello(const uint8_t nonce[TSR_HB_NONCE], uint8_t out[TSR_HB_HELLO]);

/* tsr_hb_seal(): the tag of the `body` bytes of msg, under key and the
 * connection's nonce, into msg + body. tsr_hb_check(): 1 when msg + body holds
 * that tag (compared in constant time), else 0. */
void tsr_hb_seal(const uint8_t key[TSR_HB_KEY], const uint8_t nonce[TSR_HB_NONCE], uint8_t *msg, size_t body);
int tsr_hb_check(const uint8_t key[TSR_HB_KEY], const uint8_t nonce[TSR_HB_NONCE], const uint8_t *msg, size_t body);

/* tsr_hb_key_hex() / tsr_hb_parse_key(): the key as 64 lower-case hex digits
 * (out: 65 bytes) and back. @return 0, or -1 for a string that is not 64 hex
 * digits. */
void tsr_hb_key_hex(const uint8_t key[TSR_HB_KEY], char out[2 * TSR_HB_KEY + 1]);
int tsr_hb_parse_key(const char *s, uint8_t key[TSR_HB_KEY]);

/* tsr_hb_phase_name(): "start", "load", "step", "save", "done", "sdc",
 * "preempted", "alive"; "?" otherwise. */
const char *tsr_hb_phase_name(int phase);

typedef struct tsr_heartbeat tsr_heartbeat;

/* tsr_heartbeat_open(): under a supervisor (TSR_HEARTBEAT set), connects to it,
 * reads its hello, sends TSR_HB_START for `rank` of `world` and starts the
 * watchdog thread; *out is NULL when there is no supervisor. @return 0;
 * TSR_EINVAL when TSR_HEARTBEAT_KEY or TSR_HEARTBEAT_ORPHAN_S is missing or
 * malformed; TSR_EIO naming the address when the supervisor cannot be reached
 * or does not say hello (it is gone: the job must not run on). */
int tsr_heartbeat_open(int rank, int world, tsr_heartbeat **out, tsr_error *err);

/* tsr_heartbeat_send(): one record (h NULL: nothing), compute_s 0. Never
 * blocks: a record that does not fit the socket's buffer is dropped (the part
 * of one that did not fit goes first at the next record). A
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
