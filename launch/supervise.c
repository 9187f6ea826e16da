/* supervise.c: the supervisor of `tessera launch`, which runs the training job
 * under mpirun and keeps it alive (README, "Keeping a run alive"): the restart
 * policy (backoff, nodes dropped, NaN rollback), the event log and the summary. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "launch.h"
#include "local_tier.h"

static volatile sig_atomic_t stop_sig;
static volatile int stop_flag;
static int wake_w = -1;

static void on_signal(int sig) {
    stop_sig = sig;
    stop_flag = 1;
    if (wake_w >= 0 && write(wake_w, "x", 1) < 0) stop_flag = 1;
}

static int open_events(launch *L) {
    char path[PATH_MAX];
    int e = tsr_mkdir_p(L->cfg.job.dump_folder);
    if (e || snprintf(path, sizeof path, "%s/launch.jsonl", L->cfg.job.dump_folder) >= (int)sizeof path ||
        !(L->events = fopen(path, "a"))) {
        launch_say("%s/launch.jsonl: cannot open the event log: %s", L->cfg.job.dump_folder, strerror(e ? e : errno));
        return -1;
    }
    return 0;
}

/* A supervisor started again on a run (after its predecessor was killed)
 * takes the data window of the run's last NaN rollback from the event log:
 * the job may still resume from before it. */
static void restore_rollback(launch *L) {
    char path[PATH_MAX], line[4096];
    if (snprintf(path, sizeof path, "%s/launch.jsonl", L->cfg.job.dump_folder) >= (int)sizeof path) return;
    FILE *f = fopen(path, "r");
    if (!f) return;
    double t;
    long long c;
    int after, steps;
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "\"checkpoint_step\": "), *q = strstr(line, "\"skip_after\": ");
        if (!strstr(line, "\"event\": \"rollback\"") || !p || !q || sscanf(line, "{\"time\": %lf", &t) != 1 ||
            sscanf(p, "\"checkpoint_step\": %lld", &c) != 1 ||
            sscanf(q, "\"skip_after\": %d, \"skip_steps\": %d", &after, &steps) != 2 || after < 0 || steps < 0)
            continue;
        L->skip_after = after, L->skip_steps = steps, L->rollback_to = c > 0 ? (int)c : -1, L->rollback_time = t;
    }
    fclose(f);
    if (L->skip_after >= 0)
        launch_say("the run's last NaN rollback still applies: the data of %d step(s) after step %d is skipped",
                   L->skip_steps, L->skip_after);
}

/* A rollback is pending while a committed checkpoint after the one rolled back
 * to predates the rollback: the job would resume from it otherwise (not from a
 * poisoned one, which no resume chooses). */
static int rollback_pending(launch *L) {
    if (L->rollback_to < 0) return 0;
    tsr_step_info *v = NULL;
    size_t n = 0;
    int pending = 0;
    if (tsr_list_steps(L->root, &v, &n) == 0)
        for (size_t i = 0; i < n; i++) {
            char m[PATH_MAX + 80];
            struct stat st;
            snprintf(m, sizeof m, "%s/%s/MANIFEST", L->root, v[i].name);
            if (v[i].committed && !v[i].poisoned && (int64_t)v[i].step > L->rollback_to && stat(m, &st) == 0 &&
                st.st_mtim.tv_sec + st.st_mtim.tv_nsec * 1e-9 <= L->rollback_time) /* not whole seconds: a
                step rewritten in the second of the rollback is after it */
                pending = 1;
        }
    free(v);
    if (!pending) L->rollback_to = -1;
    return pending;
}

/* The job's config on np ranks with `replicate` replicas (0: as configured), as
 * the arguments below make it: on fewer or more ranks than at the start, the
 * shards spread over them and the global batch kept. */
static tsr_train_config config_at(const launch *L, const tsr_train_config *pristine, int np, int replicate) {
    tsr_train_config c = *pristine;
    if (np != L->o.np) {
        c.parallelism.data_parallel_shard_degree = -1;
        c.training.global_batch_size = L->global_batch;
        if (replicate > 0) c.parallelism.data_parallel_replicate_degree = replicate;
    }
    return c;
}

/* The arguments the supervisor adds to the train command of this launch. */
static int extra_args(launch *L, char bufs[LAUNCH_MAX_EXTRA][96], char **extra) {
    int n = 0;
    if (L->np != L->o.np) {
        snprintf(bufs[n++], 96, "--parallelism.data_parallel_shard_degree=-1");
        snprintf(bufs[n++], 96, "--training.global_batch_size=%d", L->global_batch);
        if (L->replicate > 0) snprintf(bufs[n++], 96, "--parallelism.data_parallel_replicate_degree=%d", L->replicate);
    }
    if (L->skip_after >= 0) {
        snprintf(bufs[n++], 96, "--training.skip_data_after_step=%d", L->skip_after);
        snprintf(bufs[n++], 96, "--training.skip_data_steps=%d", L->skip_steps);
    }
    if (rollback_pending(L)) snprintf(bufs[n++], 96, "--checkpoint.load_step=%d", L->rollback_to);
    if (L->cfg.checkpoint.local_interval > 0 && L->o.nodes > 1) { /* where each rank's node memory is */
        int k = snprintf(bufs[n], 96, "--checkpoint.local_nodes=");
        for (int i = 0; i < L->n_alive && k < 90; i++) k += snprintf(bufs[n] + k, (size_t)(96 - k), "%s%d", i ? "," : "", L->alive_nodes[i]);
        n++;
    }
    for (int i = 0; i < n; i++) extra[i] = bufs[i];
    return n;
}

/* A new launch: fresh key, rank table and connections. @return 0 or -1. */
static int start_launch(launch *L) {
    L->attempt++;
    free(L->ranks);
    free(L->conns);
    L->max_conns = L->np + LAUNCH_SPARE_CONNS;
    L->ranks = calloc((size_t)L->np, sizeof *L->ranks);
    L->conns = calloc((size_t)L->max_conns + 1, sizeof *L->conns);
    L->n_conns = 0;
    L->first_step = L->last_step = -1;
    launch_host_probes_reset(L);
    if (!L->ranks || !L->conns || getrandom(L->key, sizeof L->key, 0) != sizeof L->key) {
        launch_say("cannot start a launch: out of memory or no random key");
        return -1;
    }
    char bufs[LAUNCH_MAX_EXTRA][96], *extra[LAUNCH_MAX_EXTRA], all[LAUNCH_MAX_EXTRA * 100] = "", j[LAUNCH_MAX_EXTRA * 110];
    int n = extra_args(L, bufs, extra);
    for (int i = 0; i < n; i++) snprintf(all + strlen(all), sizeof all - strlen(all), "%s%s", i ? " " : "", extra[i]);
    /* the launch's epoch (FORMAT.md 4.6): the folder's fence raised before any
     * rank runs, so that the ranks of an earlier launch still running (cut off
     * from this machine) can no longer commit there */
    uint64_t epoch = 0;
    tsr_error fe = {0};
    if (L->cfg.checkpoint.enable && tsr_fence_advance(L->root, &epoch, &fe) == 0) {
        char ep[24];
        snprintf(ep, sizeof ep, "%llu", (unsigned long long)epoch);
        setenv(TSR_EPOCH_ENV, ep, 1);
    } else {
        unsetenv(TSR_EPOCH_ENV); /* the ranks' rank 0 raises the fence itself */
        if (L->cfg.checkpoint.enable) launch_say("%s: the fence is not raised here (%s); the job raises it", L->root, fe.msg);
    }
    launch_event(L, "launch", "\"np\": %d, \"nodes\": %d, \"epoch\": %llu, \"extra_args\": %s", L->np, L->n_alive,
                 (unsigned long long)epoch, launch_json(all, j, sizeof j));
    launch_say("launch %d: %d ranks%s%s", L->attempt, L->np, n ? ", with " : "", all);
    return launch_spawn(L, extra, n);
}

/* A dropped node's memory is lost with it: its local tier folder goes (on one
 * machine, the supervisor removes it, as a lost node would lose it). */
static void forget_node(launch *L, int node) {
    char root[PATH_MAX], dir[PATH_MAX], j[PATH_MAX + 8];
    if (L->o.n_hosts > 0) { /* another host's memory: gone with it, or never looked at again */
        if (L->cfg.checkpoint.local_interval > 0)
            launch_event(L, "node_memory_lost", "\"node\": %d, \"host\": %s", node, launch_json(L->o.hosts[node], j, sizeof j));
        return;
    }
    if (L->cfg.checkpoint.local_interval <= 0 || tsr_local_root(L->cfg.checkpoint.local_folder, L->cfg.job.dump_folder, root, sizeof root, NULL) ||
        tsr_local_node_dir(root, node, dir, sizeof dir, NULL))
        return;
    tsr_remove_tree(dir);
    launch_event(L, "node_memory_lost", "\"node\": %d, \"folder\": %s", node, launch_json(dir, j, sizeof j));
}

/* @return the node dropped, or -1. A node whose ranks failed twice, or a host lost at once (its ranks stopped
 * answering: it is gone, or cut off, and its memory with it), is dropped, if the job still fits: with the
 * shards spread over the ranks left, and where they cannot hold every replica
 * (dp_replicate), with as many replicas as they can (the dropped node's replica
 * goes with it, as in HSDP). */
static int account_node(launch *L, const tsr_train_config *pristine) {
    if (L->culprit < 0 || L->o.nodes <= 1 ||
        (L->out != OUT_RANK_EXIT && L->out != OUT_HANG && L->out != OUT_SDC && L->out != OUT_HOST))
        return -1; /* with OUT_SDC, the culprit is a rank its group's majority outvoted */
    int idx = L->culprit / L->per_node, node = L->alive_nodes[idx];
    if (++L->node_fails[node] < 2 && L->out != OUT_HOST) return -1;
    int np = L->np - L->per_node;
    tsr_train_config c = config_at(L, pristine, np, L->replicate);
    tsr_error e = {0};
    int fits = L->n_alive > 1 && np >= L->o.min_ranks && !tsr_config_validate(&c, np, &e);
    for (int r = c.parallelism.data_parallel_replicate_degree - 1; !fits && L->n_alive > 1 && np >= L->o.min_ranks && r >= 1; r--) {
        tsr_train_config f = c;
        f.parallelism.data_parallel_replicate_degree = r;
        if (!tsr_config_validate(&f, np, NULL)) fits = 1, L->replicate = r, c = f;
    }
    char nn[LAUNCH_HOST_NAME + 8], what[LAUNCH_HOST_NAME + 40];
    launch_node_name(L, node, nn, sizeof nn);
    if (L->out == OUT_HOST) snprintf(what, sizeof what, "%s lost", nn);
    else snprintf(what, sizeof what, "%s failed %d times", nn, L->node_fails[node]);
    if (!fits) {
        launch_say("%s; kept: %s", what, e.msg[0] ? e.msg : "fewer ranks would be below --min-ranks");
        return -1;
    }
    memmove(L->alive_nodes + idx, L->alive_nodes + idx + 1, (size_t)(L->n_alive - idx - 1) * sizeof *L->alive_nodes);
    L->n_alive--;
    L->dropped_at[node] = tsr_now();
    L->np = np;
    launch_event(L, "node_dropped", "\"node\": %d, \"failures\": %d, \"np\": %d, \"dp_replicate\": %d", node,
                 L->node_fails[node], np, c.parallelism.data_parallel_replicate_degree);
    forget_node(L, node);
    if (L->replicate > 0)
        launch_say("%s: dropped; the job goes on with %d ranks, %d replicas (dp_replicate)", what, np, L->replicate);
    else
        launch_say("%s: dropped; the job goes on with %d ranks", what, np);
    return node;
}

/* After a NaN at step s: back to the newest committed checkpoint c before s
 * that is not poisoned (the resume's choice: tsr_latest_step_before), skipping
 * the data of steps c+1..s. */
static void plan_rollback(launch *L) {
    int64_t s = L->bad_step, c = 0;
    uint64_t found;
    if (L->cfg.checkpoint.enable && s > 0 && tsr_latest_step_before(L->root, (uint64_t)s, &found, NULL, 0) == 0)
        c = (int64_t)found;
    int k = (int)(s - c);
    if (L->skip_after == (int)c) k += L->skip_steps; /* the same restart point: the windows add up */
    L->skip_after = (int)c;
    L->skip_steps = k;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    L->rollback_to = c > 0 ? (int)c : -1; /* none before s: the job starts over */
    L->rollback_bad = s;
    L->rollback_time = (double)ts.tv_sec;
    launch_event(L, "rollback", "\"bad_step\": %lld, \"checkpoint_step\": %lld, \"skip_after\": %d, \"skip_steps\": %d",
                 (long long)s, (long long)c, L->skip_after, L->skip_steps);
    launch_say("rollback: step %lld gave a non-finite value; back to the checkpoint of step %lld, skipping the data "
               "of %d step(s)", (long long)s, (long long)c, k);
}

/* After silent data corruption found by the replica check of step s: back to
 * the newest committed checkpoint before s that is not poisoned. The trainer
 * checks its replicas before every save (train/sdc.c), so that checkpoint was
 * checked at its own step, and a later one (none, unless the check was off for
 * a save) is passed over with checkpoint.load_step while it exists. The data
 * is not skipped: it was not at fault, and the steps done again train on it
 * as the run without the corruption did. */
static void plan_sdc_rollback(launch *L) {
    int64_t s = L->bad_step, c = 0;
    uint64_t found;
    if (L->cfg.checkpoint.enable && s > 0 && tsr_latest_step_before(L->root, (uint64_t)s, &found, NULL, 0) == 0)
        c = (int64_t)found;
    uint64_t newest;
    int later = L->cfg.checkpoint.enable && tsr_latest_step(L->root, &newest, NULL, 0) == 0 && (int64_t)newest >= s;
    if (later) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        L->rollback_to = c > 0 ? (int)c : -1;
        L->rollback_time = (double)ts.tv_sec;
    }
    launch_event(L, "sdc_rollback", "\"bad_step\": %lld, \"checkpoint_step\": %lld", (long long)s, (long long)c);
    launch_say("rollback: the replica check of step %lld failed; back to the checkpoint of step %lld%s", (long long)s,
               (long long)c, later ? ", passing over the later ones" : "");
}

/* Over hosts, at a restart: the hosts dropped at least --readmit-after seconds ago
 * that run a probe again (a host rebooted, a partition healed) come back, with
 * their ranks, if the job fits them (it resumes resharded onto more ranks). */
static void readmit_hosts(launch *L, const tsr_train_config *pristine, int skip) {
    int cand[LAUNCH_MAX_HOSTS], ok[LAUNCH_MAX_HOSTS], n = 0;
    for (int h = 0; h < L->o.n_hosts; h++)
        if (h != skip && L->dropped_at[h] > 0 && tsr_now() - L->dropped_at[h] >= L->o.readmit_after) cand[n++] = h;
    if (n == 0) return;
    launch_probe_hosts(L, cand, n, ok);
    for (int i = 0; i < n; i++) {
        if (!ok[i]) continue;
        int h = cand[i], np = L->np + L->per_node, replicate = np == L->o.np ? 0 : L->replicate;
        tsr_train_config c = config_at(L, pristine, np, replicate);
        if (tsr_config_validate(&c, np, NULL)) continue;
        int at = L->n_alive; /* in the host list's order */
        while (at > 0 && L->alive_nodes[at - 1] > h) at--;
        memmove(L->alive_nodes + at + 1, L->alive_nodes + at, (size_t)(L->n_alive - at) * sizeof *L->alive_nodes);
        L->alive_nodes[at] = h;
        L->n_alive++;
        L->np = np, L->replicate = replicate;
        L->dropped_at[h] = 0, L->node_fails[h] = 0;
        char j[LAUNCH_HOST_NAME + 8];
        launch_event(L, "host_back", "\"node\": %d, \"host\": %s, \"np\": %d", h, launch_json(L->o.hosts[h], j, sizeof j), np);
        launch_say("host %s answers again: back in the job, which goes on with %d ranks", L->o.hosts[h], np);
    }
}

/* Waits `s` seconds unless a stop signal comes first. */
static void backoff_wait(launch *L, double s) {
    double end = tsr_now() + s;
    while (!stop_flag && tsr_now() < end) {
        struct pollfd p = {L->wake_fd, POLLIN, 0};
        poll(&p, 1, (int)fmin(100, (end - tsr_now()) * 1000 + 1));
    }
}

static const char *const OUTCOME[OUT_N] = {"finished", "rank_exit", "hang", "nan", "job_exit", "usage", "signal",
                                           "sdc", "preempted", "host_lost"};

/* Ends a failed launch. @return 1 to relaunch, 0 to give up. */
static int after_failure(launch *L, const tsr_train_config *pristine, int *counts) {
    char j[300];
    launch_say("launch %d failed (%s): %s", L->attempt, OUTCOME[L->out], L->why);
    if (!L->failed_at) L->failed_at = tsr_now();
    if (L->last_step > L->failed_step) L->failed_step = L->last_step;
    launch_close_conns(L);
    /* after a host lost, mpirun waits for a daemon it cannot reach: not long */
    double k = launch_kill_all(L, L->out == OUT_HOST ? fmin(L->o.grace, 0.5) : L->o.grace);
    launch_event(L, "killed", "\"cause\": \"%s\", \"why\": %s, \"seconds\": %.3f", OUTCOME[L->out],
                 launch_json(L->why, j, sizeof j), k);
    if (L->o.n_hosts > 0 && L->out != OUT_HOST && L->out != OUT_SIGNAL && L->out != OUT_USAGE) {
        /* over hosts: mpirun may have ended the job for a host it lost before
         * the ranks' silence showed it, or could not reach one at the start */
        int ok[LAUNCH_MAX_HOSTS];
        launch_probe_hosts(L, L->alive_nodes, L->n_alive, ok);
        for (int i = 0; i < L->n_alive; i++)
            if (!ok[i]) {
                int lost = L->alive_nodes[i];
                launch_event(L, "host_lost", "\"node\": %d, \"host\": %s, \"probe\": true, \"cause\": \"%s\"", lost,
                             launch_json(L->o.hosts[lost], j, sizeof j), OUTCOME[L->out]);
                launch_say("host %s lost: it does not run a probe (the launch failed: %s)", L->o.hosts[lost], OUTCOME[L->out]);
                L->out = OUT_HOST, L->culprit = i * L->per_node;
                break;
            }
    }
    counts[L->out]++;
    if (L->out == OUT_SIGNAL || L->out == OUT_USAGE) return 0;
    if (L->restarts >= L->o.max_restarts) {
        launch_say("giving up: %d restart(s), the limit (--max-restarts)", L->restarts);
        return 0;
    }
    int lost = L->out == OUT_HOST && L->culprit >= 0 ? L->alive_nodes[L->culprit / L->per_node] : -1;
    int dropped = account_node(L, pristine);
    if (L->o.n_hosts > 0) {
        int before = L->n_alive;
        readmit_hosts(L, pristine, dropped >= 0 ? dropped : lost); /* (not the host this failure lost) */
        if (dropped < 0 && lost >= 0 && L->n_alive > before) {
            /* a lost host kept for --min-ranks goes now that others are back
             * (kept, it would fail the next launch); its index moved */
            for (int i = 0; i < L->n_alive; i++)
                if (L->alive_nodes[i] == lost) L->culprit = i * L->per_node;
            dropped = account_node(L, pristine);
        }
    }
    if (L->out == OUT_NAN) plan_rollback(L);
    if (L->out == OUT_SDC) plan_sdc_rollback(L);
    /* the backoff doubles with each launch in a row that trained no step */
    L->quick_fails = L->first_step >= 0 ? 0 : L->quick_fails + 1;
    double b = fmin(30, L->o.backoff * pow(2, L->quick_fails));
    if (L->out == OUT_HOST && L->first_step >= 0) b = 0; /* its cause is gone with the host: at once */
    L->restarts++;
    launch_event(L, "relaunch", "\"restart\": %d, \"backoff_s\": %.3f, \"np\": %d", L->restarts, b, L->np);
    backoff_wait(L, b);
    return !stop_flag;
}

static void summary(launch *L, int ok, const int *counts) {
    double wall = tsr_now() - L->t0, train = fmax(0, wall - L->lost_s);
    launch_event(L, "finish", "\"status\": \"%s\", \"restarts\": %d, \"rank_exits\": %d, \"hangs\": %d, \"nans\": %d, "
                 "\"job_exits\": %d, \"sdcs\": %d, \"hosts_lost\": %d, \"np\": %d, \"wall_s\": %.3f, \"lost_s\": %.3f, "
                 "\"train_s\": %.3f, \"chaos_faults\": %d", ok ? "ok" : L->preempting ? "preempted" : "failed", L->restarts,
                 counts[OUT_RANK_EXIT], counts[OUT_HANG], counts[OUT_NAN], counts[OUT_JOB_EXIT], counts[OUT_SDC],
                 counts[OUT_HOST], L->np, wall, L->lost_s, train, L->chaos_faults);
    launch_say("%s after %d launch(es): %d restart(s) (%d rank exit(s), %d hang(s), %d NaN rollback(s), %d job "
               "exit(s), %d silent data corruption(s)); %d of %d ranks at the end; %.1f s in all, %.1f s lost to "
               "failures, %.1f s of training", ok ? "finished" : L->preempting ? "preempted" : "gave up", L->attempt, L->restarts,
               counts[OUT_RANK_EXIT], counts[OUT_HANG], counts[OUT_NAN], counts[OUT_JOB_EXIT], counts[OUT_SDC], L->np,
               L->o.np, wall, L->lost_s, train);
}

static int supervise(launch *L, const tsr_train_config *pristine) {
    int counts[OUT_N] = {0}, ok = 0;
    char cmd[1024] = "", j[1200];
    for (int i = 0; i < L->o.train_argc; i++)
        snprintf(cmd + strlen(cmd), sizeof cmd - strlen(cmd), "%s%s", i ? " " : "", L->o.train_argv[i]);
    launch_event(L, "start", "\"np\": %d, \"nodes\": %d, \"min_ranks\": %d, \"max_restarts\": %d, \"hang_timeout_s\": "
                 "%.3f, \"pid\": %d, \"command\": %s", L->o.np, L->o.nodes, L->o.min_ranks, L->o.max_restarts,
                 L->o.hang_timeout, (int)getpid(), launch_json(cmd, j, sizeof j));
    launch_chaos_start(L);
    for (;;) {
        if (start_launch(L)) break;
        launch_watch(L, &stop_flag, &stop_sig);
        if (L->out == OUT_FINISHED && !L->preempting) {
            ok = 1;
            break;
        }
        if (L->preempting) break; /* no relaunch: the job was asked to stop */
        if (!after_failure(L, pristine, counts)) break;
    }
    if (!ok && !L->preempting && L->o.preempt_grace > 0 && (stop_sig == SIGTERM || stop_sig == SIGUSR1))
        L->preempting = 1, L->preempt_sig = stop_sig, L->preempt_t0 = tsr_now(); /* between launches */
    if (L->preempting && !L->preempt_end) L->preempt_end = tsr_now(); /* the grace ran out, or a second signal */
    launch_close_conns(L);
    launch_kill_all(L, L->o.grace);
    if (L->preempting) launch_preempt_report(L);
    char root[PATH_MAX];
    if (ok && L->cfg.checkpoint.local_interval > 0 && !tsr_local_root(L->cfg.checkpoint.local_folder, L->cfg.job.dump_folder, root, sizeof root, NULL))
        tsr_remove_tree(root); /* the run is over: its snapshots in memory are of no more use */
    summary(L, ok, counts);
    return ok ? LAUNCH_FINISHED : L->preempting ? LAUNCH_PREEMPTED : L->out == OUT_USAGE ? LAUNCH_USAGE : LAUNCH_GAVE_UP;
}

static void on_signals(const launch *L) {
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    if (L->o.preempt_grace > 0) sigaction(SIGUSR1, &sa, NULL); /* Slurm's warning before the end of an allocation */
    signal(SIGPIPE, SIG_IGN);
}

int launch_run(const launch_opts *o, const tsr_train_config *job) {
    static launch L0;
    static tsr_train_config pristine;
    launch *L = &L0;
    L->o = *o;
    pristine = *job;
    L->listen_fd = L->wake_fd = -1;
    L->skip_after = L->rollback_to = -1;
    L->cfg = pristine;
    tsr_error e = {0};
    if (tsr_config_validate(&L->cfg, L->o.np, &e)) {
        launch_say("%s", e.msg);
        return LAUNCH_USAGE;
    }
    L->global_batch = L->cfg.training.global_batch_size;
    const char *d = L->cfg.job.dump_folder, *f = L->cfg.checkpoint.folder;
    int n = f[0] == '/' ? snprintf(L->root, sizeof L->root, "%s", f) : snprintf(L->root, sizeof L->root, "%s/%s", d, f);
    if (n < 0 || (size_t)n >= sizeof L->root) {
        launch_say("checkpoint.folder: path too long");
        return LAUNCH_USAGE;
    }
    L->np = L->o.np;
    L->per_node = L->o.np / L->o.nodes;
    L->n_alive = L->o.nodes;
    L->alive_nodes = calloc((size_t)L->o.nodes, sizeof *L->alive_nodes);
    L->node_fails = calloc((size_t)L->o.nodes, sizeof *L->node_fails);
    L->dropped_at = calloc((size_t)L->o.nodes, sizeof *L->dropped_at);
    L->probes = calloc((size_t)L->o.nodes, sizeof *L->probes);
    int pipefd[2];
    restore_rollback(L);
    if (!L->alive_nodes || !L->node_fails || !L->dropped_at || !L->probes || pipe2(pipefd, O_CLOEXEC | O_NONBLOCK) || open_events(L) || launch_listen(L)) {
        launch_unlisten(L);
        return LAUNCH_GAVE_UP;
    }
    for (int i = 0; i < L->o.nodes; i++) L->alive_nodes[i] = i, L->probes[i].fd = -1;
    L->wake_fd = pipefd[0];
    wake_w = pipefd[1];
    on_signals(L);
    prctl(PR_SET_CHILD_SUBREAPER, 1); /* ranks whose mpirun died stay below the supervisor */
    L->t0 = tsr_now();
    int rc = supervise(L, &pristine);
    launch_unlisten(L);
    fclose(L->events);
    free(L->ranks);
    free(L->conns);
    free(L->alive_nodes);
    free(L->node_fails);
    free(L->dropped_at);
    launch_host_probes_reset(L);
    free(L->probes);
    return rc;
}
