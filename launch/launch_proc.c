/* launch_proc.c: tessera launch's processes: mpirun started in its own process
 * group, children reaped, and every process below the supervisor ended.
 *
 * Open MPI gives each rank a process group of its own, so signalling mpirun's
 * group does not reach the ranks: the supervisor walks /proc for every process
 * below itself instead. It is a child subreaper (supervise.c), so ranks whose
 * mpirun died are still below it. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "launch.h"

/* The state letter and parent of pid from /proc/PID/stat. @return 0 or -1. */
static int stat_of(pid_t pid, char *state, pid_t *ppid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    int pp;
    if (!p || sscanf(p + 1, " %c %d", state, &pp) != 2) return -1;
    *ppid = (pid_t)pp;
    return 0;
}

char launch_proc_state(pid_t pid) {
    char s;
    pid_t pp;
    return stat_of(pid, &s, &pp) ? '?' : s;
}

int launch_descends(pid_t pid, pid_t ancestor) {
    char s;
    for (int depth = 0; depth < 64 && pid > 1; depth++) {
        pid_t pp;
        if (stat_of(pid, &s, &pp)) return 0;
        if (pp == ancestor) return 1;
        pid = pp;
    }
    return 0;
}

/* Sends sig to every live process below the supervisor. @return how many there are. */
static int signal_below(int sig) {
    DIR *d = opendir("/proc");
    if (!d) return 0;
    pid_t self = getpid();
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        char s;
        pid_t pp;
        if (*end || pid <= 1 || pid == self || stat_of((pid_t)pid, &s, &pp) || s == 'Z') continue;
        if (!launch_descends((pid_t)pid, self)) continue;
        n++;
        if (sig) kill((pid_t)pid, sig);
    }
    closedir(d);
    return n;
}

void launch_reap(launch *L) {
    int st;
    pid_t p;
    while ((p = waitpid(-1, &st, WNOHANG)) > 0)
        if (p == L->mpirun) {
            L->mpirun_status = st;
            L->mpirun_exited = 1;
        }
}

static void nap(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

double launch_kill_all(launch *L, double grace) {
    double t0 = tsr_now();
    if (signal_below(SIGTERM) == 0) {
        launch_reap(L);
        return 0;
    }
    signal_below(SIGCONT); /* a stopped process acts on SIGTERM only once continued */
    int left = 1;
    while (tsr_now() - t0 < grace && (left = signal_below(0)) > 0) {
        launch_reap(L);
        nap(0.02);
    }
    if (left) {
        signal_below(SIGKILL);
        launch_event(L, "sigkill", "\"processes\": %d, \"after_s\": %.3f", left, tsr_now() - t0);
        while (tsr_now() - t0 < grace + 10 && signal_below(0) > 0) {
            launch_reap(L);
            nap(0.02);
        }
    }
    launch_reap(L);
    return tsr_now() - t0;
}

void launch_exec(char **argv, int quiet) {
    setpgid(0, 0);
    int fd = open("/dev/null", O_RDWR);
    if (fd >= 0) dup2(fd, 0);
    if (fd >= 0 && quiet) dup2(fd, 1), dup2(fd, 2);
    execvp(argv[0], argv);
    fprintf(stderr, "tessera launch: cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
}

/* What mpirun passes on to the ranks (on other hosts, the ranks' environment
 * is their remote shell's, with these added): tessera's variables (the
 * heartbeat's, the epoch, the test hooks), OpenMP's, the search paths and the
 * sanitizers' options. */
static int forwarded(const char *kv) {
    static const char *const prefixes[] = {"TSR_", "OMP_", "PATH=", "LD_LIBRARY_PATH=", "ASAN_OPTIONS=",
                                           "UBSAN_OPTIONS=", "LSAN_OPTIONS="};
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++)
        if (!strncmp(kv, prefixes[i], strlen(prefixes[i]))) return 1;
    return 0;
}

extern char **environ;

int launch_spawn(launch *L, char *const *extra, int n_extra) {
    static char self[PATH_MAX];
    ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
    if (k <= 0) {
        launch_say("cannot find the tessera binary (/proc/self/exe): %s", strerror(errno));
        return -1;
    }
    self[k] = 0;
    /* the heartbeat's address and this launch's key, in the supervisor's own
     * environment: mpirun inherits it and passes it on (-x) */
    char key[2 * TSR_HB_KEY + 1], orphan[32];
    tsr_hb_key_hex(L->key, key);
    snprintf(orphan, sizeof orphan, "%g", L->o.orphan_timeout);
    setenv(TSR_HB_ENV, L->hb_addr, 1);
    setenv(TSR_HB_KEY_ENV, key, 1);
    setenv(TSR_HB_ORPHAN_ENV, orphan, 1);
    size_t n_env = 0;
    for (char **e = environ; *e; e++) n_env += (size_t)forwarded(*e);
    char np[16], *hosts = NULL;
    snprintf(np, sizeof np, "%d", L->np);
    if (L->o.n_hosts > 0) { /* the hosts left, np / hosts ranks each: rank r on the host of index r / per_node */
        size_t len = 1;
        for (int i = 0; i < L->n_alive; i++) len += strlen(L->o.hosts[L->alive_nodes[i]]) + 16;
        if (!(hosts = malloc(len))) return -1;
        hosts[0] = 0;
        for (int i = 0, at = 0; i < L->n_alive; i++)
            at += snprintf(hosts + at, len - (size_t)at, "%s%s:%d", i ? "," : "", L->o.hosts[L->alive_nodes[i]], L->per_node);
    }
    char **argv = calloc(16 + 2 * n_env + (size_t)L->o.train_argc + (size_t)n_extra, sizeof *argv);
    char **names = calloc(n_env + 1, sizeof *names);
    if (!argv || !names) {
        free(argv), free(names), free(hosts);
        return -1;
    }
    size_t n = 0, m = 0;
    argv[n++] = "mpirun";
    if (geteuid() == 0) argv[n++] = "--allow-run-as-root";
    argv[n++] = "--oversubscribe", argv[n++] = "--bind-to", argv[n++] = "none";
    if (hosts) argv[n++] = "--host", argv[n++] = hosts;
    for (char **e = environ; *e && m < n_env; e++)
        if (forwarded(*e) && (names[m] = strndup(*e, strcspn(*e, "=")))) argv[n++] = "-x", argv[n++] = names[m++];
    argv[n++] = "-np", argv[n++] = np, argv[n++] = self;
    for (int i = 0; i < L->o.train_argc; i++) argv[n++] = L->o.train_argv[i];
    for (int i = 0; i < n_extra; i++) argv[n++] = extra[i];
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) launch_exec(argv, 0);
    for (size_t i = 0; i < m; i++) free(names[i]);
    free(names), free(argv), free(hosts);
    if (pid < 0) {
        launch_say("fork: %s", strerror(errno));
        return -1;
    }
    setpgid(pid, pid);
    L->mpirun = pid;
    L->mpirun_exited = 0;
    L->started = tsr_now();
    return 0;
}
