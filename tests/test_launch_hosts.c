/* test_launch_hosts.c: the hosts of tessera launch over machines: Open MPI's
 * hostfile (hosts, slots, comments; a bad line named by file and line; a host
 * twice; an empty file) and Slurm's compressed host list (ranges keep their
 * zero padding, lists and plain names mix; bad ranges refused). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "launch.h"

static void reset(launch_opts *o) {
    free(o->hosts);
    free(o->slots);
    memset(o, 0, sizeof *o);
}

/* The hosts as "a:2 b:0 ..." */
static const char *list(const launch_opts *o, char *buf, size_t len) {
    buf[0] = 0;
    for (int i = 0; i < o->n_hosts; i++)
        snprintf(buf + strlen(buf), len - strlen(buf), "%s%s:%d", i ? " " : "", o->hosts[i], o->slots[i]);
    return buf;
}

static int file_of(const char *path, const char *text, launch_opts *o, char *why, size_t len) {
    FILE *f = fopen(path, "w");
    REQUIRE(f && fputs(text, f) >= 0 && fclose(f) == 0, "write %s", path);
    return launch_hosts_file(path, o, why, len);
}

int main(void) {
    char path[] = "/tmp/tsr-test-hosts-XXXXXX", why[512], buf[1024];
    int fd = mkstemp(path);
    REQUIRE(fd >= 0, "mkstemp");
    close(fd);
    launch_opts o = {0};
    CHECK(file_of(path, "# the cluster\nnode01 slots=4\n\nnode02 max_slots=8 slots=2  # a comment\nnode03\n", &o, why,
                  sizeof why) == 0, "hostfile: %s", why);
    CHECK(!strcmp(list(&o, buf, sizeof buf), "node01:4 node02:2 node03:0"), "hostfile: %s", buf);
    reset(&o);
    CHECK(file_of(path, "a slots=2\nb slots=two\n", &o, why, sizeof why) && strstr(why, path) && strstr(why, ":2:") &&
              strstr(why, "slots=two"), "a bad count named by line: %s", why);
    reset(&o);
    CHECK(file_of(path, "a\nb cpus=4\n", &o, why, sizeof why) && strstr(why, ":2:") && strstr(why, "cpus=4"),
          "an unknown word: %s", why);
    reset(&o);
    CHECK(file_of(path, "a\nb\na\n", &o, why, sizeof why) && strstr(why, ":3:") && strstr(why, "listed twice"),
          "a host twice: %s", why);
    reset(&o);
    CHECK(file_of(path, "# nobody\n", &o, why, sizeof why) && strstr(why, "no host"), "empty: %s", why);
    reset(&o);
    unlink(path);
    CHECK(launch_hosts_file(path, &o, why, sizeof why) && strstr(why, "cannot open"), "missing: %s", why);
    reset(&o);

    CHECK(launch_hosts_slurm("node[08-10,12],login,gpu[1-2]-ib", &o, why, sizeof why) == 0, "slurm: %s", why);
    CHECK(!strcmp(list(&o, buf, sizeof buf), "node08:0 node09:0 node10:0 node12:0 login:0 gpu1-ib:0 gpu2-ib:0"),
          "slurm list: %s", buf);
    reset(&o);
    CHECK(launch_hosts_slurm("n[3-1]", &o, why, sizeof why) && strstr(why, "range"), "a backward range: %s", why);
    reset(&o);
    CHECK(launch_hosts_slurm("n[1-x]", &o, why, sizeof why) && strstr(why, "not a number"), "a range of words: %s", why);
    reset(&o);
    CHECK(launch_hosts_slurm("n[1-2", &o, why, sizeof why) && strstr(why, "closed"), "an open bracket: %s", why);
    reset(&o);
    CHECK(launch_hosts_slurm("n[1-2],n2", &o, why, sizeof why) && strstr(why, "twice"), "a host twice: %s", why);
    reset(&o);
    CHECK(launch_hosts_slurm("", &o, why, sizeof why) && strstr(why, "empty"), "empty: %s", why);
    reset(&o);
    return check_failures ? 1 : 0;
}
