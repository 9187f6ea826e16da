/* cmd_dcp.c: the conversions to and from PyTorch Distributed Checkpoint (DCP)
 * folders, `tessera import --from dcp` and `tessera export --format dcp`: DCP's
 * metadata is a pickle that only PyTorch reads, so they run the Python
 * package's tessera.dcp (python/tessera/dcp.py) under $TSR_PYTHON (default
 * python3), which writes and reads the tessera side through libtessera. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "commands.h"

/* The interpreter's start: PyTorch is there, or it is said so. */
static const char BOOT[] =
    "import sys\n"
    "try:\n"
    "    import torch  # noqa: F401\n"
    "    import tessera.dcp\n"
    "except ImportError as e:\n"
    "    print('tessera %s: DCP folders are read and written by PyTorch, and %s cannot import it: %s "
    "(set TSR_PYTHON to a Python with torch, and the package tessera on its path)' % (sys.argv[1], sys.executable, e),"
    " file=sys.stderr)\n"
    "    sys.exit(1)\n"
    "sys.exit(tessera.dcp.main(sys.argv[1:]))\n";

/* In a source tree (build/B/tessera), the package and the library of this
 * build; an installed package is on the interpreter's own path. */
static void source_tree_paths(void) {
    char exe[PATH_MAX], path[PATH_MAX + 64];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return;
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (!slash) return;
    *slash = 0; /* the binary's folder */
    snprintf(path, sizeof path, "%s/../../python/tessera/dcp.py", exe);
    if (access(path, R_OK) == 0) {
        const char *old = getenv("PYTHONPATH");
        char pp[2 * PATH_MAX + 80];
        snprintf(pp, sizeof pp, "%s/../../python%s%s", exe, old && *old ? ":" : "", old && *old ? old : "");
        setenv("PYTHONPATH", pp, 1);
        snprintf(path, sizeof path, "%s/libtessera-core.so.0", exe);
        if (!getenv("TESSERA_LIB") && access(path, R_OK) == 0) setenv("TESSERA_LIB", exe, 1);
    }
}

int tsr_cmd_dcp(const char *verb, const char *src, const char *dst, const char *opt, const char *val) {
    const char *py = getenv("TSR_PYTHON");
    if (!py || !*py) py = "python3";
    source_tree_paths();
    char *argv[10];
    int n = 0;
    argv[n++] = (char *)py, argv[n++] = "-c", argv[n++] = (char *)BOOT, argv[n++] = (char *)verb;
    argv[n++] = (char *)src, argv[n++] = (char *)dst;
    if (opt) argv[n++] = (char *)opt, argv[n++] = (char *)val;
    argv[n] = NULL;
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return fprintf(stderr, "tessera %s: fork: %s\n", verb, strerror(errno)), EXIT_FAIL;
    if (pid == 0) {
        execvp(py, argv);
        fprintf(stderr, "tessera %s: cannot run %s (TSR_PYTHON): %s\n", verb, py, strerror(errno));
        _exit(EXIT_FAIL);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return fprintf(stderr, "tessera %s: waitpid: %s\n", verb, strerror(errno)), EXIT_FAIL;
    if (WIFEXITED(st)) return WEXITSTATUS(st) == EXIT_USAGE ? EXIT_USAGE : WEXITSTATUS(st) ? EXIT_FAIL : EXIT_OK;
    fprintf(stderr, "tessera %s: %s ended by signal %d\n", verb, py, WTERMSIG(st));
    return EXIT_FAIL;
}
