/* cmd_launch.c: tessera launch: its options and the job's config, handed to
 * the supervisor (launch/launch.h, README "Keeping a run alive"). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "commands.h"
#include "launch.h"

static const char USAGE[] =
    "usage: tessera launch -np N [--nodes K | --hostfile FILE] [--min-ranks M] [--max-restarts R]\n"
    "                      [--hang-timeout S] [--backoff S] [--grace S] [--preempt-grace S]\n"
    "                      [--listen ADDR[:PORT]] [--host-timeout S] [--orphan-timeout S] [--readmit-after S]\n"
    "                      [--chaos RATE[,SEED[,KINDS]]] -- train --config FILE [--section.key=value ...]\n"
    "Runs the training job on N ranks under mpirun and keeps it alive. Every rank\n"
    "reports to the supervisor (step, phase, loss, time) over a Unix socket, or TCP\n"
    "when the ranks are on other hosts, each record signed with a key of the\n"
    "launch; a rank that hears nothing from the supervisor for --orphan-timeout\n"
    "seconds (default 10) stops itself. The supervisor\n"
    "restarts the job (which resumes from its newest complete state: a snapshot\n"
    "in node memory, else its newest committed checkpoint) when:\n"
    "  - a rank exits or is killed (seen within 1 s);\n"
    "  - a rank's heartbeat stops for --hang-timeout seconds (default: 5x the median\n"
    "    step time, at least 5 s; 60 s while starting, loading or saving);\n"
    "  - the loss or gradient norm is not finite: the job rolls back to the newest\n"
    "    checkpoint before that step and skips the data from there to it\n"
    "    (training.skip_data_after_step, training.skip_data_steps);\n"
    "  - the ranks' replica check (training.sdc_check_interval) finds copies of a\n"
    "    tensor that differ (silent data corruption): the job names their ranks and\n"
    "    rolls back to its newest checkpoint, checked when it was saved; a rank that\n"
    "    a majority of its group outvoted counts as its node's failure;\n"
    "and reports a straggler: a rank whose median compute time (its step time less\n"
    "its waits in the collectives) over its last 8 steps is over 1.5x the other\n"
    "ranks' and at least 0.1 s above it.\n"
    "A failed job is ended (SIGTERM, then SIGKILL after --grace seconds, default 3)\n"
    "and relaunched after --backoff seconds (default 1; doubling, up to 30, while\n"
    "launches fail before their first step), at most\n"
    "R times (default 5). --nodes K groups the ranks into K nodes of N/K ranks (on\n"
    "one machine); a node whose ranks fail twice is dropped and the job restarts on\n"
    "N - N/K ranks, data_parallel_shard_degree -1 and the same global batch (and\n"
    "fewer replicas, data_parallel_replicate_degree, where they cannot hold all), if\n"
    "that is at least M (default: N), and its memory (its folder of the local\n"
    "checkpoint tier, checkpoint.local_interval) is removed, as a lost node's would\n"
    "be; the job's local tier folder goes once the run has finished (the ranks\n"
    "learn their nodes from --checkpoint.local_nodes, which it passes). Events go\n"
    "to DUMP/launch.jsonl (JSON lines); a summary ends the run. --chaos RATE[,SEED]\n"
    "injects faults at random, RATE seconds apart on average (exponential; SEED 1\n"
    "by default): a rank killed, a node killed (--nodes), a rank stopped, a NaN\n"
    "loss, ENOSPC on the next checkpoint write, an S3 outage of 3 s (when the job\n"
    "archives to S3), a bit of one rank's weights flipped (when the replica check\n"
    "runs and the weights have copies); each is a \"chaos\" event. KINDS\n"
    "(kill_rank, kill_node, stop_rank, nan, enospc, s3, bitflip, joined by '+')\n"
    "keeps to those.\n"
    "--preempt-grace S: SIGTERM or SIGUSR1 (a scheduler's preemption; Slurm's\n"
    "warning before the end of an allocation) no longer ends the job at once: every\n"
    "rank stops after the step under way, commits its state to the local tier\n"
    "and, when its last measured checkpoint save fits what is left of S seconds, to\n"
    "the durable tier; the job is ended when S seconds have passed. The summary says\n"
    "whether the deadline was met and which step the next launch resumes from\n"
    "(a \"preempted\" event). A second signal ends the job at once.\n"
    "--hostfile FILE (Open MPI's syntax: \"HOST slots=N\" a line) runs the job over\n"
    "those hosts, N/hosts ranks each, in rank order; inside a Slurm allocation\n"
    "(SLURM_JOB_NODELIST) without --hostfile or --nodes, over the allocation's\n"
    "hosts. Each host is a node: the local tier is in its memory, partner copies\n"
    "go to the next host. The ranks reach the supervisor at --listen ADDR[:PORT]\n"
    "(default: this machine's address towards the first host, a free port). A host\n"
    "whose ranks all stop answering for --host-timeout seconds (default 4; the\n"
    "ranks' watchdogs answer even while they wait in a collective) and which does\n"
    "not answer a TCP connection attempt either is lost: dropped at once, and the\n"
    "job restarts on the other hosts from their memory and\n"
    "partner copies, resharded. A dropped host that runs a probe again at a restart\n"
    "at least --readmit-after seconds later (default 60) is back in the job. A host\n"
    "that answers while its ranks are silent is up and they are stalled: a\n"
    "\"host_stalled\" event, and the hang timeout decides.\n"
    "Each launch has an epoch (TSR_EPOCH): writers of an\n"
    "older launch, cut off but still running, cannot commit (FORMAT.md).\n"
    "Exit status: 0 finished, 1 gave up, 2 bad usage, 3 preempted.\n";

static int num_opt(const char *v, double lo, double *out, const char *name) {
    char *end;
    errno = 0;
    double d = v ? strtod(v, &end) : 0;
    if (!v || end == v || *end || errno || !(d >= lo) || d > 1e9)
        return tsr_usage_error("launch", "%s needs a number >= %g, not '%s'", name, lo, v ? v : "");
    *out = d;
    return 0;
}

/* --chaos RATE[,SEED[,KINDS]] */
static int chaos_opt(const char *v, launch_opts *o) {
    char rate[64], seed_s[64] = "1";
    const char *comma = strchr(v, ','), *kinds = comma ? strchr(comma + 1, ',') : NULL;
    uint64_t seed = 1;
    snprintf(rate, sizeof rate, "%.*s", comma ? (int)(comma - v) : (int)strlen(v), v);
    if (comma) snprintf(seed_s, sizeof seed_s, "%.*s", kinds ? (int)(kinds - comma - 1) : (int)strlen(comma + 1), comma + 1);
    if (num_opt(rate, 0.1, &o->chaos_rate, "--chaos")) return -1;
    if (tsr_parse_u64(seed_s, &seed))
        return tsr_usage_error("launch", "--chaos RATE,SEED: the seed '%s' is not a number", seed_s);
    o->chaos_seed = seed;
    o->chaos_kinds = 0;
    if (kinds && launch_chaos_kinds(kinds + 1, &o->chaos_kinds))
        return tsr_usage_error("launch", "--chaos RATE,SEED,KINDS: '%s' is not a list of kill_rank, kill_node, "
                                         "stop_rank, nan, enospc, s3, bitflip joined by '+'", kinds + 1);
    return 0;
}

static int parse_args(int argc, char **argv, launch_opts *o) {
    double np = 0, nodes = 0, minr = 0, maxr = 5;
    const char *hostfile = NULL;
    char why[512];
    o->host_timeout = 4;
    o->orphan_timeout = 10;
    o->readmit_after = 60;
    o->hang_timeout = 0;
    o->backoff = 1;
    o->grace = 3;
    o->chaos_rate = 0;
    int i = 1;
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
        const char *v = NULL;
        int r = 0;
        if (!strcmp(argv[i], "-np") || !strcmp(argv[i], "-n")) {
            if (++i >= argc) return tsr_usage_error("launch", "-np needs a value");
            if (num_opt(argv[i], 1, &np, "-np")) return EXIT_USAGE;
        } else if ((r = tsr_opt(argc, argv, &i, "np", 1, &v))) {
            if (r < 0 || num_opt(v, 1, &np, "--np")) return EXIT_USAGE;
        } else if ((r = tsr_opt(argc, argv, &i, "nodes", 1, &v))) {
            if (r < 0 || num_opt(v, 1, &nodes, "--nodes")) return EXIT_USAGE;
        } else if ((r = tsr_opt(argc, argv, &i, "min-ranks", 1, &v))) {
            if (r < 0 || num_opt(v, 1, &minr, "--min-ranks")) return EXIT_USAGE;
        } else if ((r = tsr_opt(argc, argv, &i, "max-restarts", 1, &v))) {
            if (r < 0 || num_opt(v, 0, &maxr, "--max-restarts")) return EXIT_USAGE;
        } else if ((r = tsr_opt(argc, argv, &i, "hang-timeout", 1, &v))) {
            if (r < 0 || num_opt(v, 0.1, &o->hang_timeout, "--hang-timeout")) return EXIT_USAGE;
        } else if ((r = tsr_opt(argc, argv, &i, "backoff", 1, &v))) {
            if (r < 0 || num_opt(v, 0, &o->backoff, "--backoff")) return EXIT_USAGE;
        } else if ((r = tsr_opt(argc, argv, &i, "grace", 1, &v))) {
            if (r < 0 || num_opt(v, 0, &o->grace, "--grace")) return EXIT_USAGE;
        } else if ((r = tsr_opt(argc, argv, &i, "preempt-grace", 1, &v))) {
            if (r < 0 || num_opt(v, 0.1, &o->preempt_grace, "--preempt-grace")) return EXIT_USAGE;
        } else if ((r = tsr_opt(argc, argv, &i, "hostfile", 1, &v))) {
            if (r < 0) return EXIT_USAGE;
            hostfile = v;
        } else if ((r = tsr_opt(argc, argv, &i, "listen", 1, &v))) {
            if (r < 0) return EXIT_USAGE;
            o->listen = v;
        } else if ((r = tsr_opt(argc, argv, &i, "host-timeout", 1, &v))) {
            if (r < 0 || num_opt(v, 0.5, &o->host_timeout, "--host-timeout")) return EXIT_USAGE;
        } else if ((r = tsr_opt(argc, argv, &i, "readmit-after", 1, &v))) {
            if (r < 0 || num_opt(v, 0, &o->readmit_after, "--readmit-after")) return EXIT_USAGE;
        } else if ((r = tsr_opt(argc, argv, &i, "orphan-timeout", 1, &v))) {
            if (r < 0 || num_opt(v, 1, &o->orphan_timeout, "--orphan-timeout")) return EXIT_USAGE;
        } else if ((r = tsr_opt(argc, argv, &i, "chaos", 1, &v))) {
            if (r < 0 || chaos_opt(v, o)) return EXIT_USAGE;
        } else {
            return tsr_usage_error("launch", "unexpected argument '%s' (see --help)", argv[i]);
        }
    }
    if (np < 1) return tsr_usage_error("launch", "-np N is required (see --help)");
    if (i + 1 >= argc || strcmp(argv[i + 1], "train") != 0)
        return tsr_usage_error("launch", "the job comes after '--': -- train --config FILE ... (see --help)");
    o->np = (int)np, o->nodes = nodes > 0 ? (int)nodes : 1, o->min_ranks = minr > 0 ? (int)minr : o->np, o->max_restarts = (int)maxr;
    const char *slurm = getenv("SLURM_JOB_NODELIST");
    if (hostfile && nodes > 0) return tsr_usage_error("launch", "--nodes and --hostfile: with hosts, each host is a node");
    if (hostfile && launch_hosts_file(hostfile, o, why, sizeof why)) return tsr_usage_error("launch", "--hostfile %s", why);
    if (!hostfile && nodes == 0 && slurm && *slurm && launch_hosts_slurm(slurm, o, why, sizeof why))
        return tsr_usage_error("launch", "SLURM_JOB_NODELIST=%s: %s", slurm, why);
    if (o->n_hosts > 0) {
        if (o->np % o->n_hosts)
            return tsr_usage_error("launch", "-np %d does not spread evenly over the %d hosts", o->np, o->n_hosts);
        for (int h = 0; h < o->n_hosts; h++)
            if (o->slots[h] && o->slots[h] < o->np / o->n_hosts)
                return tsr_usage_error("launch", "host %s has %d slot(s); the job places %d ranks on each host",
                                       o->hosts[h], o->slots[h], o->np / o->n_hosts);
        if (o->chaos_rate > 0) return tsr_usage_error("launch", "--chaos needs the ranks on this machine (not --hostfile)");
        o->nodes = o->n_hosts;
    }
    if (o->listen && o->n_hosts == 0) return tsr_usage_error("launch", "--listen is for ranks on other hosts (--hostfile)");
    if (o->np % o->nodes) return tsr_usage_error("launch", "--nodes %d does not divide -np %d", o->nodes, o->np);
    if (o->min_ranks > o->np) return tsr_usage_error("launch", "--min-ranks %d is above -np %d", o->min_ranks, o->np);
    o->train_argc = argc - i - 1;
    o->train_argv = argv + i + 1;
    return 0;
}

/* The job's config as `tessera train` reads it: the folders, the global batch. */
static int load_config(const launch_opts *o, tsr_train_config *pristine) {
    const char *file = NULL;
    char **a = o->train_argv;
    for (int i = 1; i < o->train_argc; i++) {
        if (!strcmp(a[i], "--config") && i + 1 < o->train_argc) file = a[++i];
        else if (!strncmp(a[i], "--config=", 9)) file = a[i] + 9;
    }
    if (!file) return tsr_usage_error("launch", "the train command needs --config FILE");
    tsr_error e = {0};
    if (tsr_config_load(pristine, file, &e)) return tsr_usage_error("launch", "%s", e.msg);
    for (int i = 1; i < o->train_argc; i++) {
        if (!strcmp(a[i], "--config")) {
            i++;
            continue;
        }
        if (!strncmp(a[i], "--", 2) && strchr(a[i], '.') && strncmp(a[i], "--config=", 9) &&
            tsr_config_override(pristine, a[i], &e))
            return tsr_usage_error("launch", "%s", e.msg);
    }
    tsr_train_config v = *pristine; /* the supervisor validates its own copy again */
    if (tsr_config_validate(&v, o->np, &e)) return tsr_usage_error("launch", "%s", e.msg);
    return 0;
}


int tsr_cmd_launch(int argc, char **argv) {
    for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(USAGE, stdout);
            return EXIT_OK;
        }
    static launch_opts o;
    static tsr_train_config pristine;
    int rc = parse_args(argc, argv, &o);
    if (!rc) rc = load_config(&o, &pristine);
    return rc ? rc : launch_run(&o, &pristine);
}
