/* launch_chaos.c: tessera launch --chaos RATE[,SEED[,KINDS]]: faults injected
 * at random into the job it watches (README, "Keeping a run alive"): a rank or
 * a node killed, a rank stopped, a NaN, ENOSPC on the durable tier, an S3
 * outage (every S3 request of the ranks answered 503 for LAUNCH_S3_OUTAGE_S
 * seconds, when the job archives to S3), a bit of one rank's weights flipped
 * (silent data corruption, when the job's replica check runs and its weights
 * have copies: its rank flips it at its next step boundary, and the check
 * finds it). KINDS ("kill_rank+s3") keeps to those kinds. The times between faults are exponential with mean RATE
 * seconds, from a generator seeded with SEED, and a fault waits until every
 * rank of the launch is training (not starting, loading or saving), and one
 * that ends a launch (a kill, a stop, a NaN) for a launch where none was
 * injected yet, so that each is detected on its own. Each one is
 * a "chaos" event in the event log, so that its detection and recovery can be
 * matched to it. */
#include <math.h>
#include <signal.h>
#include <sys/socket.h>

#include "common.h"
#include "s3.h"
#include "launch.h"

/* splitmix64: the chaos generator (one stream, from the seed). */
static uint64_t next_u64(launch *L) {
    uint64_t z = (L->chaos_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double uniform(launch *L) { return (double)(next_u64(L) >> 11) * 0x1.0p-53; }

static void schedule(launch *L, double from) { L->chaos_next = from - L->o.chaos_rate * log(1 - uniform(L)); }

void launch_chaos_start(launch *L) {
    if (L->o.chaos_rate <= 0) return;
    L->chaos_state = L->o.chaos_seed;
    schedule(L, tsr_now());
    launch_event(L, "chaos_plan", "\"mean_interval_s\": %.3f, \"seed\": %llu", L->o.chaos_rate,
                 (unsigned long long)L->o.chaos_seed);
}

/* Every rank of the launch is training. */
static int steady(const launch *L) {
    if (L->first_step < 0) return 0;
    for (int r = 0; r < L->np; r++)
        if (!L->ranks[r].claimed || L->ranks[r].done || L->ranks[r].phase != TSR_HB_STEP) return 0;
    return 1;
}

enum { K_KILL_RANK, K_KILL_NODE, K_STOP_RANK, K_NAN, K_ENOSPC, K_S3, K_BITFLIP, K_N };
static const char *const KIND[K_N] = {"kill_rank", "kill_node", "stop_rank", "nan", "enospc", "s3", "bitflip"};
static const int FATAL[K_N] = {1, 1, 1, 1, 0, 0, 1}; /* the kinds that end a launch */

int launch_chaos_kinds(const char *s, unsigned *mask) {
    *mask = 0;
    while (*s) {
        size_t n = strcspn(s, "+");
        int k = 0;
        while (k < K_N && (strlen(KIND[k]) != n || strncmp(s, KIND[k], n))) k++;
        if (k == K_N) return -1;
        *mask |= 1u << k;
        s += n + (s[n] == '+');
    }
    return *mask ? 0 : -1;
}

static void inject(launch *L, int kind) {
    int rank = (int)(next_u64(L) % (uint64_t)L->np);
    pid_t pid = L->ranks[rank].pid;
    int node = launch_node_of(L, rank);
    int64_t s = L->last_step + 2; /* the NaN's step: soon, not yet reached by any rank */
    switch (kind) {
    case K_KILL_RANK:
        launch_event(L, "chaos", "\"kind\": \"%s\", \"target\": \"rank %d\", \"rank\": %d, \"pid\": %d", KIND[kind],
                     rank, rank, (int)pid);
        kill(pid, SIGKILL);
        break;
    case K_KILL_NODE:
        launch_event(L, "chaos", "\"kind\": \"%s\", \"target\": \"node %d\", \"node\": %d, \"rank\": %d", KIND[kind],
                     node, node, rank - rank % L->per_node);
        for (int q = rank - rank % L->per_node; q < rank - rank % L->per_node + L->per_node; q++)
            kill(L->ranks[q].pid, SIGKILL);
        break;
    case K_STOP_RANK:
        launch_event(L, "chaos", "\"kind\": \"%s\", \"target\": \"rank %d\", \"rank\": %d, \"pid\": %d", KIND[kind],
                     rank, rank, (int)pid);
        kill(pid, SIGSTOP);
        break;
    case K_NAN:
        launch_event(L, "chaos", "\"kind\": \"%s\", \"target\": \"step %lld\", \"step\": %lld", KIND[kind],
                     (long long)s, (long long)s);
        launch_tell(L, -1, TSR_HB_CMD_NAN, (uint64_t)s, "chaos");
        break;
    case K_ENOSPC: /* the next write of every rank to the durable tier fails */
        launch_event(L, "chaos", "\"kind\": \"%s\", \"target\": \"the next checkpoint write\"", KIND[kind]);
        launch_tell(L, -1, TSR_HB_CMD_ENOSPC, 0, "chaos");
        break;
    case K_BITFLIP: { /* one rank's weights: its replica check (or its group's) names it */
        uint64_t arg = next_u64(L);
        launch_event(L, "chaos", "\"kind\": \"%s\", \"target\": \"rank %d\", \"rank\": %d, \"pid\": %d, \"node\": %d, "
                     "\"step\": %lld", KIND[kind], rank, rank, (int)pid, node, (long long)L->last_step);
        launch_tell(L, rank, TSR_HB_CMD_BITFLIP, arg, "chaos");
        break;
    }
    default: /* every S3 request fails for a while: the archiver retries, or gives a push up */
        launch_event(L, "chaos", "\"kind\": \"%s\", \"target\": \"S3 requests\", \"seconds\": %.1f", KIND[kind],
                     LAUNCH_S3_OUTAGE_S);
        launch_tell(L, -1, TSR_HB_CMD_S3, (uint64_t)(LAUNCH_S3_OUTAGE_S * 1000), "chaos");
        break;
    }
    L->chaos_faults++;
    if (FATAL[kind]) L->chaos_fatal = L->attempt;
}

void launch_chaos_tick(launch *L) {
    /* one fault that ends a launch per launch: each is detected on its own */
    if (L->o.chaos_rate <= 0 || (int)L->out >= 0 || L->chaos_fatal == L->attempt) return;
    double now = tsr_now();
    if (now < L->chaos_next || !steady(L)) return;
    const tsr_train_config *c = &L->cfg;
    int copies = c->parallelism.data_parallel_replicate_degree > 1 || c->parallelism.tensor_parallel_degree > 1;
    int kinds[K_N], n = 0, can[K_N] = {1, L->n_alive > 1, 1, 1, c->checkpoint.enable,
                                        c->checkpoint.enable && tsr_s3_is_url(c->checkpoint.archive_url),
                                        copies && c->training.sdc_check_interval > 0};
    for (int k = 0; k < K_N; k++)
        if (can[k] && (!L->o.chaos_kinds || (L->o.chaos_kinds >> k & 1))) kinds[n++] = k;
    if (n) inject(L, kinds[next_u64(L) % (uint64_t)n]);
    schedule(L, now);
}
