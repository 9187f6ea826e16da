/* test_guard.c: the guard kind (TSR_MEM_GUARD) and the kernel context over it.
 * Kernels and copies of a context reach guard memory and compute what they do
 * on host memory; a host read or write of it ends the process with SIGSEGV and
 * a message that names the buffer, the byte and the call stack; a kernel handed
 * host memory stops the process naming the kernel; the engine's staging copy
 * and load reach it as they reach a device's. */
#include <math.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>

#include "check.h"
#include "common.h"
#include "kctx.h"
#include "norm.h"

/* Runs fn(arg) in a child whose stderr goes to buf; the child's wait status. */
static int in_child(void (*fn)(void *), void *arg, char *buf, size_t len) {
    int fd[2];
    REQUIRE(pipe(fd) == 0, "pipe");
    fflush(NULL);
    pid_t pid = fork();
    REQUIRE(pid >= 0, "fork");
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        fn(arg);
        _exit(0);
    }
    close(fd[1]);
    size_t n = 0;
    ssize_t r;
    while (n + 1 < len && (r = read(fd[0], buf + n, len - 1 - n)) > 0) n += (size_t)r;
    buf[n] = 0;
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return st;
}

static void host_write(void *p) { ((volatile float *)p)[2] = 1.0f; }
static void host_read(void *p) { fprintf(stderr, "read %f\n", (double)((volatile float *)p)[1000]); }
static void kernel_on_host(void *p) {
    tsr_kctx kc;
    tsr_kctx_init(&kc, TSR_MEM_GUARD, 0, NULL);
    tsr_kc_fill(&kc, p, 4, 1.0f); /* p: host memory */
}

int main(void) {
    tsr_error e = {0};
    tsr_kctx kc;
    CHECK_OK(tsr_kctx_init(&kc, TSR_MEM_GUARD, 0, &e));
    enum { N = 7, C = 33 };
    float *x = tsr_kc_alloc(&kc, N * C * sizeof *x, &e), *y = tsr_kc_alloc(&kc, N * C * sizeof *y, &e);
    float *w = tsr_kc_alloc(&kc, C * sizeof *w, &e), *r = tsr_kc_alloc(&kc, N * sizeof *r, &e);
    REQUIRE(x && y && w && r, "guard allocations: %s", e.msg);

    /* kernels and copies on guard memory compute what they compute on the host */
    float hx[N * C], hw[C], hy[N * C], hr[N], gy[N * C], gr[N];
    uint64_t s = 7;
    for (int i = 0; i < N * C; i++) hx[i] = (float)((tsr_splitmix_next(&s) >> 40) / (double)(1 << 24)) - 0.5f;
    for (int i = 0; i < C; i++) hw[i] = 1.0f + 0.01f * (float)i;
    CHECK_OK(tsr_kc_from_host(&kc, x, hx, sizeof hx, &e));
    CHECK_OK(tsr_kc_from_host(&kc, w, hw, sizeof hw, &e));
    tsr_kc_rmsnorm_fwd(&kc, y, r, x, w, N, C, 1e-5f);
    tsr_rmsnorm_fwd(hy, hr, hx, hw, N, C, 1e-5f);
    CHECK_OK(tsr_kc_to_host(&kc, gy, y, sizeof gy, &e));
    CHECK_OK(tsr_kc_to_host(&kc, gr, r, sizeof gr, &e));
    CHECK(!memcmp(gy, hy, sizeof gy) && !memcmp(gr, hr, sizeof gr), "rmsnorm on guard memory differs from the host's");
    /* a 2-d copy: column block [3, 3 + 5) of x's rows into y's rows at column 10 */
    tsr_kc_fill(&kc, y, N * C, 0);
    tsr_kc_copy2d(&kc, y + 10, C * sizeof *y, x + 3, C * sizeof *x, 5 * sizeof *x, N);
    CHECK_OK(tsr_kc_to_host(&kc, gy, y, sizeof gy, &e));
    int ok = 1;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < C; j++) ok &= gy[i * C + j] == (j >= 10 && j < 15 ? hx[i * C + j - 7] : 0.0f);
    CHECK(ok, "copy2d on guard memory: wrong elements");
    /* the sums the step brings to the host */
    double *acc = tsr_kc_alloc(&kc, 2 * sizeof *acc, &e), hacc[2];
    REQUIRE(acc, "%s", e.msg);
    tsr_kc_sum_add(&kc, &acc[0], x, N * C);
    tsr_kc_sum_add(&kc, &acc[0], x, N * C);
    tsr_kc_sumsq_add(&kc, &acc[1], x, N * C);
    CHECK_OK(tsr_kc_to_host(&kc, hacc, acc, sizeof hacc, &e));
    double sum = 0, sq = 0;
    for (int i = 0; i < N * C; i++) sum += hx[i], sq += (double)hx[i] * hx[i];
    CHECK(fabs(hacc[0] - 2 * sum) < 1e-9 && fabs(hacc[1] - sq) < 1e-9, "sums: %g %g, not %g %g", hacc[0], hacc[1],
          2 * sum, sq);
    /* the engine's copies reach it as a device's */
    float back[N * C];
    CHECK_OK(tsr_mem_to_host(back, x, sizeof back, TSR_MEM_GUARD, &e));
    CHECK(!memcmp(back, hx, sizeof back), "tsr_mem_to_host of guard memory");
    CHECK(tsr_mem_to_host(back, hx, sizeof back, TSR_MEM_GUARD, &e) == TSR_EINVAL && strstr(e.msg, "guard"),
          "a copy from host memory as guard memory: %s", e.msg);

    /* host access: a crash that names the buffer, the byte and where */
    char out[8192];
    int st = in_child(host_write, x, out, sizeof out);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV, "a host write of guard memory: status %d", st);
    char want[128];
    snprintf(want, sizeof want, "byte 8 of a %zu-byte buffer", (size_t)N * C * sizeof(float));
    CHECK(strstr(out, "host code touched device memory") && strstr(out, want), "message: %s", out);
    CHECK(strstr(out, "host_write") || strstr(out, "test_guard("), "the call stack does not name the spot: %s", out);
    st = in_child(host_read, y, out, sizeof out);
    snprintf(want, sizeof want, "byte 4000 of a %zu-byte buffer", (size_t)N * C * sizeof(float));
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV && strstr(out, want), "a host read: status %d: %s", st, out);
    /* host memory handed to a kernel of the context */
    float host[4];
    st = in_child(kernel_on_host, host, out, sizeof out);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT && strstr(out, "kernel tsr_kc_fill was given memory"),
          "a kernel given host memory: status %d: %s", st, out);

    tsr_kc_free(&kc, x), tsr_kc_free(&kc, y), tsr_kc_free(&kc, w), tsr_kc_free(&kc, r), tsr_kc_free(&kc, acc);
    tsr_kctx_free(&kc);
    return check_done();
}
