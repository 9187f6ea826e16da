/* launch.h: the supervisor of `tessera launch` (tools/cmd_launch.c parses its
 * options and the job's config): supervise.c the restart policy and the
 * summary; launch_proc.c the job's processes; launch_watch.c the heartbeat
 * socket and what it detects; launch_chaos.c the faults of --chaos;
 * launch_log.c the event log; launch_hosts.c the hosts of a job over
 * machines. */
#ifndef TSR_LAUNCH_H
#define TSR_LAUNCH_H

#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "config.h"
#include "heartbeat.h"

#define LAUNCH_MAX_EXTRA 8  /* arguments the supervisor adds to the train command */
#define LAUNCH_SPARE_CONNS 32 /* connections held at once beyond the ranks' */
#define LAUNCH_WINDOW 8     /* steps of a rank's straggler window */
#define LAUNCH_STRAGGLER_FLOOR 0.1 /* seconds a straggler's compute time exceeds the median's by, at least */
#define LAUNCH_HISTORY 64   /* step times behind the median */
#define LAUNCH_MAX_HOSTS 4096
#define LAUNCH_HOST_NAME 256
#define LAUNCH_ALIVE_EVERY 0.5 /* seconds between the supervisor's TSR_HB_CMD_ALIVE */
#define LAUNCH_STALL_S 2.0 /* seconds a turn of the watch may take before it is logged ("supervisor_stalled") */

typedef struct launch_opts {
    int np, nodes, min_ranks, max_restarts;
    double hang_timeout; /* seconds; 0: 5x the median step time, at least LAUNCH_HANG_FLOOR */
    double backoff;      /* seconds before the first relaunch; doubles, up to 30 s */
    double grace;        /* seconds between SIGTERM and SIGKILL */
    double preempt_grace; /* --preempt-grace: seconds a preempted job has to commit its state (0: no preemption) */
    double chaos_rate;   /* --chaos: mean seconds between injected faults (0: none) */
    uint64_t chaos_seed;
    unsigned chaos_kinds; /* bit k: fault kind k may be injected (0: every kind) */
    int train_argc;      /* the command after "--": train --config FILE ... */
    char **train_argv;
    /* a job over machines (--hostfile, or a Slurm allocation's hosts): each host a node */
    char (*hosts)[LAUNCH_HOST_NAME];
    int *slots;          /* each host's slots (0: not said) */
    int n_hosts;         /* 0: the ranks run on this machine (--nodes) */
    const char *listen;  /* --listen ADDR: the supervisor's address for the ranks (NULL: the one towards the first host) */
    double host_timeout; /* seconds without an answer to TSR_HB_CMD_ALIVE after which a host's ranks are lost */
    double orphan_timeout; /* seconds a rank runs on without hearing from the supervisor (TSR_HEARTBEAT_ORPHAN_S) */
    double readmit_after;  /* seconds a dropped host stays out before a restart probes it again */
} launch_opts;

#define LAUNCH_HANG_FLOOR 5.0   /* seconds: the automatic hang timeout's floor */
#define LAUNCH_START_ALLOW 60.0 /* seconds a rank may take to connect, load or save */

/* What ended a launch. */
typedef enum launch_outcome {
    OUT_FINISHED,  /* mpirun exited 0 */
    OUT_RANK_EXIT, /* a rank's connection ended before it was done */
    OUT_HANG,      /* a rank's heartbeat stopped */
    OUT_NAN,       /* a non-finite loss or gradient norm */
    OUT_JOB_EXIT,  /* mpirun exited nonzero with no rank seen leaving */
    OUT_USAGE,     /* mpirun exited 2: the job's arguments are wrong (no retry) */
    OUT_SIGNAL,    /* the supervisor was asked to stop */
    OUT_SDC,       /* the ranks' replica check found copies that differ (TSR_HB_SDC) */
    OUT_PREEMPTED, /* the supervisor was preempted (--preempt-grace): the job stopped, or its grace ran out */
    OUT_HOST,      /* every rank of a host stopped answering (--hostfile): the host is lost, or cut off */
    OUT_N
} launch_outcome;

#define LAUNCH_SDC_DRAIN_S 2.0 /* seconds the watch goes on reading the ranks' TSR_HB_SDC records */

typedef struct rank_state {
    int claimed, done;
    pid_t pid;
    int phase;
    int64_t step;
    double heard; /* tsr_now() of its last record from its training thread */
    double alive; /* tsr_now() of its last record of any kind (its watchdog's TSR_HB_ALIVE too) */
    double win[LAUNCH_WINDOW]; /* its compute times (step time less data-plane waits) */
    int n_win, i_win, straggling;
    /* its TSR_HB_PREEMPTED record (pre_seen) */
    int pre_seen;
    int64_t pre_step, pre_local, pre_durable;
    double pre_local_s, pre_durable_s;
    struct sockaddr_storage addr; /* over TCP: the address its connection came from (addr_len 0: none) */
    socklen_t addr_len;
} rank_state;

/* A host's reachability, asked while all its ranks are silent
 * (launch_host_reach): a TCP connection attempt to the address its ranks
 * connect from, which the host's kernel answers (accepted or refused) while it
 * runs and is connected, whatever its processes do. */
typedef struct host_probe {
    int fd;          /* the attempt in flight (-1: none) */
    double started;  /* tsr_now() of the last attempt's start */
    double answered; /* tsr_now() when the host last answered one (0: never) */
    double failed;   /* tsr_now() when one last went unanswered (0: never) */
    double said;     /* the silence (its start) already logged as a stall */
} host_probe;

typedef struct conn {
    int fd;
    pid_t pid; /* the peer's, from SO_PEERCRED (0 over TCP: the record's pid is the rank's word) */
    uid_t uid;
    int rank; /* -1 until its first record is accepted */
    double opened;
    char peer[64]; /* over TCP: the peer's address */
    struct sockaddr_storage sa; /* the same, for launch_host_reach */
    socklen_t sa_len;
    uint8_t nonce[TSR_HB_NONCE];
    uint64_t seq_in, seq_out; /* the last record's sequence number, and the last command's */
    uint8_t buf[TSR_HB_RECORD];
    size_t have;
    uint8_t out[TSR_HB_COMMAND]; /* the rest of a command the socket took in part */
    size_t n_out;
} conn;

typedef struct launch {
    launch_opts o;
    tsr_train_config cfg;
    char root[PATH_MAX]; /* the checkpoint folder */
    int global_batch;    /* the global batch at the first np (kept when ranks drop) */
    int replicate;       /* dp_replicate after a dropped node took a replica with it (0: as configured) */
    FILE *events;        /* DUMP/launch.jsonl */
    int n_refused;       /* refusals logged (at most 100 are) */
    /* the socket */
    int listen_fd, wake_fd; /* wake_fd: the read end of the signal pipe */
    char sock_dir[128], sock_path[160];
    char hb_addr[200];              /* TSR_HEARTBEAT: the socket's path, or tcp:ADDR:PORT */
    uint8_t key[TSR_HB_KEY];        /* this launch's */
    double alive_sent;              /* tsr_now() of the last TSR_HB_CMD_ALIVE */
    uint64_t alive_n;
    /* the current launch */
    int attempt, np;
    pid_t mpirun;
    int mpirun_status, mpirun_exited;
    double started; /* tsr_now() of the launch */
    conn *conns; /* max_conns = np + LAUNCH_SPARE_CONNS, and a slot for one refused at once */
    int n_conns, max_conns;
    rank_state *ranks; /* np of them */
    int64_t first_step, last_step; /* steps seen in this launch (-1: none) */
    /* what ended it */
    launch_outcome out;
    int culprit;   /* the rank that left or hung (-1: unknown) */
    int64_t bad_step;
    char why[256];
    double sdc_until; /* OUT_SDC: tsr_now() until which the ranks' records are still read */
    /* across launches */
    double hist[LAUNCH_HISTORY];
    int n_hist;
    int *alive_nodes, n_alive, per_node, *node_fails;
    double *dropped_at; /* tsr_now() when each node was dropped (0: not dropped) */
    host_probe *probes; /* each node's, over machines */
    int restarts;
    int quick_fails; /* launches in a row that failed before a step (the backoff's exponent) */
    int skip_after, skip_steps; /* the data window skipped (-1: none) */
    int rollback_to;            /* checkpoint.load_step of the relaunches after a NaN (-1: none) */
    int64_t rollback_bad;       /* the step that gave the NaN */
    double rollback_time;       /* Unix time of the rollback */
    double failed_at;           /* tsr_now() of the last failure, until the next first step */
    int64_t failed_step;        /* the newest step seen before it */
    double lost_s, t0;
    int last_np;
    /* --chaos (launch_chaos.c) */
    uint64_t chaos_state;
    double chaos_next; /* tsr_now() of the next fault */
    int chaos_faults;
    int chaos_fatal; /* the launch that got a fault which ends it (0: none yet) */
    /* preemption (launch_preempt.c) */
    int preempting, preempt_sig;
    double preempt_t0, preempt_end; /* tsr_now() of the signal, and of the job's end (0: not yet) */
} launch;

/* supervise.c ------------------------------------------------------------- */

enum { LAUNCH_FINISHED = 0, LAUNCH_GAVE_UP = 1, LAUNCH_USAGE = 2, LAUNCH_PREEMPTED = 3 };

/* launch_run(): runs the job of o (job: its config as `tessera train` reads it,
 * before validation) under mpirun and supervises it until it finishes, gives
 * up, or the supervisor is asked to stop (SIGTERM, SIGINT, SIGHUP; with
 * --preempt-grace, SIGTERM and SIGUSR1 preempt the job: launch_preempt.c).
 * @return LAUNCH_FINISHED, LAUNCH_GAVE_UP, LAUNCH_USAGE when the job's
 * arguments are wrong (mpirun exited 2: no retry), or LAUNCH_PREEMPTED. */
int launch_run(const launch_opts *o, const tsr_train_config *job);

/* launch_log.c ------------------------------------------------------------ */

/* launch_event(): one JSON line in the event log: {"time": Unix seconds,
 * "event": NAME, "launch": attempt, FIELDS}. fields is a printf format for the
 * rest of the object's members (without braces; "" for none); strings in it
 * must be escaped with launch_json (below). */
void launch_event(launch *L, const char *name, const char *fields, ...) __attribute__((format(printf, 3, 4)));

/* launch_json(): s as a JSON string with its quotes, cut to fit len. */
const char *launch_json(const char *s, char *buf, size_t len);

/* launch_say(): "tessera launch: MSG" on stderr. */
void launch_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* launch_tell(): a command (kind, arg) to rank `rank`'s connection, or every
 * rank's (-1), sealed with the launch's key; one that does not reach a rank is
 * said, prefixed by `what` (NULL: not said). */
void launch_tell(launch *L, int rank, uint32_t kind, uint64_t arg, const char *what);

/* launch_node_of(): the node (of the --nodes K at the start, or the host's
 * index in the host list) that holds rank. */
static inline int launch_node_of(const launch *L, int rank) {
    return L->per_node > 0 && rank >= 0 && rank / L->per_node < L->n_alive ? L->alive_nodes[rank / L->per_node] : 0;
}

/* launch_node_name(): "node K", or the host's name. */
static inline const char *launch_node_name(const launch *L, int node, char *buf, size_t len) {
    if (L->o.n_hosts > 0 && node >= 0 && node < L->o.n_hosts) snprintf(buf, len, "host %s", L->o.hosts[node]);
    else snprintf(buf, len, "node %d", node);
    return buf;
}

/* launch_median(): the median of the recent step times (0: fewer than 3). */
double launch_median(const launch *L);

/* launch_proc.c ----------------------------------------------------------- */

/* launch_spawn(): starts mpirun -np L->np with the train command, the extra
 * arguments and the heartbeat environment, in its own process group.
 * @return 0, or -1 after saying why. */
int launch_spawn(launch *L, char *const *extra, int n_extra);

/* launch_exec(): the child's side of starting a command of the supervisor:
 * its own process group, stdin (and with quiet, stdout and stderr) from
 * /dev/null, argv run; never returns. */
void launch_exec(char **argv, int quiet) __attribute__((noreturn));

/* launch_reap(): collects every exited child (mpirun, ranks it left behind);
 * notes mpirun's status in L. */
void launch_reap(launch *L);

/* launch_kill_all(): ends every process below the supervisor: SIGTERM (and
 * SIGCONT, for stopped ones), up to grace seconds, then SIGKILL; reaps them.
 * @return the seconds it took. */
double launch_kill_all(launch *L, double grace);

/* launch_descends(): whether pid is below `ancestor` in the process tree. */
int launch_descends(pid_t pid, pid_t ancestor);

/* launch_proc_state(): the state letter of pid (R, S, D, T, Z...; '?' if gone). */
char launch_proc_state(pid_t pid);

/* launch_hosts.c ---------------------------------------------------------- */

/* launch_hosts_file(): the hosts of Open MPI's hostfile at path ("HOST
 * [slots=N] [max_slots=N]" a line, # comments) into o->hosts, o->slots.
 * launch_hosts_slurm(): those of a Slurm host list (SLURM_JOB_NODELIST:
 * "node[01-03,07],login"). @return 0, or -1 with why (the file and line). */
int launch_hosts_file(const char *path, launch_opts *o, char *why, size_t len);
int launch_hosts_slurm(const char *list, launch_opts *o, char *why, size_t len);

/* launch_local_addr(): the numeric address this machine reaches host from
 * (its route's source) into out. @return 0, or -1 with why. */
int launch_local_addr(const char *host, char *out, size_t len, char *why, size_t wlen);

/* launch_probe_hosts(): runs `true` on the n hosts of nodes (an mpirun each,
 * all at once; 15 s at most), each logged ("probe"); ok[i]: 1 when host
 * nodes[i] ran it. */
void launch_probe_hosts(launch *L, const int *nodes, int n, int *ok);

/* launch_host_reach(): whether host `node`, whose ranks are all silent since
 * `since` (tsr_now()), still answers on the network: it is asked every
 * host_timeout / 2 at addr (an attempt unanswered for that long fails).
 * @return 1: it answered since then, and last; 0: the last attempt since then
 * went unanswered (or there is no address to ask); -1: none has ended since
 * then. */
int launch_host_reach(launch *L, int node, const struct sockaddr_storage *addr, socklen_t len, double since);

/* launch_host_probes_reset(): attempts in flight abandoned, history cleared
 * (a new launch). */
void launch_host_probes_reset(launch *L);

/* launch_chaos.c ---------------------------------------------------------- */

/* launch_chaos_start(): with --chaos, seeds the generator, plans the first
 * fault and logs the plan ("chaos_plan"). */
void launch_chaos_start(launch *L);

/* launch_chaos_tick(): injects the fault that is due, if the launch is
 * training: kills a rank or a node (with --nodes), stops a rank (SIGSTOP),
 * tells the ranks to take the loss of a coming step as NaN, or to fail their
 * next write to the durable tier with ENOSPC, or one rank to flip a bit of its
 * weights; logs it as a "chaos" event (kind, target) and plans the
 * next one. */
void launch_chaos_tick(launch *L);

/* launch_chaos_kinds(): "kill_rank+s3" (the kinds kill_rank, kill_node,
 * stop_rank, nan, enospc, s3, bitflip) into *mask. @return 0, or -1 for a name that is
 * none of them. */
int launch_chaos_kinds(const char *s, unsigned *mask);

#define LAUNCH_S3_OUTAGE_S 3.0 /* seconds of an injected S3 outage */

/* launch_watch.c ---------------------------------------------------------- */

/* launch_listen(): the heartbeat socket in a fresh private directory.
 * @return 0, or -1 after saying why. */
int launch_listen(launch *L);
void launch_unlisten(launch *L);

/* launch_watch(): watches the current launch until it ends; sets L->out,
 * culprit, bad_step and why. `stop` is set by the signal handler, `sig` the
 * signal it got (with --preempt-grace, SIGTERM and SIGUSR1 preempt the job,
 * and stop is cleared for a second signal). */
void launch_watch(launch *L, volatile int *stop, const volatile sig_atomic_t *sig);

/* launch_close_conns(): closes every connection (the ranks' watchdogs then end them). */
void launch_close_conns(launch *L);


/* launch_preempt.c -------------------------------------------------------- */

/* launch_preempt_begin(): the supervisor got SIGTERM or SIGUSR1 (sig) with
 * --preempt-grace S: every rank is told to stop after the step under way and commit
 * its state within S seconds (TSR_HB_CMD_PREEMPT); a rank that connects later
 * is told when it does (launch_preempt_rank_up). Logged ("preempt"). */
void launch_preempt_begin(launch *L, int sig);
void launch_preempt_rank_up(launch *L, int rank);
/* launch_preempt_record(): a rank's TSR_HB_PREEMPTED record (checked). */
void launch_preempt_record(launch *L, int rank, const tsr_hb_record *r);
/* launch_preempt_tick(): ends the launch (OUT_PREEMPTED) once the grace has
 * run out. */
void launch_preempt_tick(launch *L);
/* launch_preempt_report(): after the launch ended: what the ranks committed,
 * whether the deadline was met and what the next launch resumes from; logged
 * ("preempted") and said. */
void launch_preempt_report(launch *L);

#endif
