/* cmd_plot.c: tessera plot: the loss curve of a trainer's metrics file, drawn
 * to a PNG by gnuplot.
 *
 * The metrics file is JSON lines, one object per logged step, e.g.
 *   {"step": 10, "loss": 4.1, "grad_norm": 1.2, "lr": 0.0008, ...}
 * A resumed run appends to the same file, so a step can appear more than once;
 * the last value logged for a step is the one drawn, which keeps the curve
 * unbroken. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "commands.h"

extern char **environ;

static const char plot_help[] =
    "usage: tessera plot METRICS.jsonl [-o PNG] [--title T] [--table]\n"
    "Draws loss against step from the JSON-lines metrics file the trainer writes\n"
    "(one object per logged step with numeric \"step\" and \"loss\") to a PNG, with\n"
    "gnuplot. Lines that are not such objects are skipped with a warning naming the\n"
    "line. When a step appears more than once (a resumed run appends to the same\n"
    "file), its last value is drawn.\n"
    "  -o, --output PNG  the image to write (default: loss.png next to METRICS)\n"
    "  --title T         the title of the plot (default: the metrics path)\n"
    "  --table           print the step and loss columns that would be drawn, and\n"
    "                    draw nothing (needs no gnuplot)\n"
    "Exit status: 0 drawn, 1 no data or the file or gnuplot failed, 2 bad usage.\n";

#define MAX_WARNINGS 10 /* bad lines reported one by one; the rest are counted */

typedef struct point {
    double step, loss;
    size_t order; /* line order, so that the last value of a step wins */
} point;

/* ------------------------------------------------------------ one JSON line */

typedef struct jcur {
    const char *p;
} jcur;

static void jws(jcur *c) {
    while (*c->p == ' ' || *c->p == '\t' || *c->p == '\r' || *c->p == '\n') c->p++;
}

/* A JSON string; its first bytes (unescaped enough to compare keys) into out. */
static int jstring(jcur *c, char *out, size_t cap) {
    size_t n = 0;
    if (*c->p != '"') return -1;
    c->p++;
    for (;;) {
        char ch = *c->p;
        if (!ch || ch == '\n') return -1;
        c->p++;
        if (ch == '"') break;
        if (ch == '\\') {
            if (!*c->p) return -1;
            ch = *c->p++;
            if (ch == 'u') {
                for (int i = 0; i < 4; i++, c->p++)
                    if (!*c->p || !strchr("0123456789abcdefABCDEF", *c->p)) return -1;
                ch = '?';
            } else if (!strchr("\"\\/bfnrt", ch)) return -1;
        } else if ((unsigned char)ch < 0x20) return -1;
        if (out && n + 1 < cap) out[n++] = ch;
    }
    if (out) out[n] = 0;
    return 0;
}

/* A JSON number (RFC 8259 grammar) into *v. */
static int jnumber(jcur *c, double *v) {
    const char *s = c->p, *p = s;
    if (*p == '-') p++;
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9')
        while (*p >= '0' && *p <= '9') p++;
    else return -1;
    if (*p == '.') {
        p++;
        if (*p < '0' || *p > '9') return -1;
        while (*p >= '0' && *p <= '9') p++;
    }
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-') p++;
        if (*p < '0' || *p > '9') return -1;
        while (*p >= '0' && *p <= '9') p++;
    }
    *v = strtod(s, NULL);
    c->p = p;
    return 0;
}

static int jvalue(jcur *c, int depth);

static int jcompound(jcur *c, int depth) {
    char close = *c->p == '{' ? '}' : ']';
    int is_obj = close == '}';
    c->p++;
    jws(c);
    if (*c->p == close) {
        c->p++;
        return 0;
    }
    for (;;) {
        jws(c);
        if (is_obj) {
            if (jstring(c, NULL, 0)) return -1;
            jws(c);
            if (*c->p++ != ':') return -1;
            jws(c);
        }
        if (jvalue(c, depth + 1)) return -1;
        jws(c);
        if (*c->p == ',') {
            c->p++;
            continue;
        }
        if (*c->p++ != close) return -1;
        return 0;
    }
}

static int jvalue(jcur *c, int depth) {
    double d;
    if (depth > 32) return -1;
    switch (*c->p) {
    case '"': return jstring(c, NULL, 0);
    case '{':
    case '[': return jcompound(c, depth);
    case 't': return strncmp(c->p, "true", 4) ? -1 : (c->p += 4, 0);
    case 'f': return strncmp(c->p, "false", 5) ? -1 : (c->p += 5, 0);
    case 'n': return strncmp(c->p, "null", 4) ? -1 : (c->p += 4, 0);
    default: return jnumber(c, &d);
    }
}

/* Reads one metrics line: a JSON object with numeric "step" and "loss".
 * @return 0, or -1 with the reason in *why. */
static int metrics_line(const char *line, double *step, double *loss, const char **why) {
    jcur c = {line};
    int have_step = 0, have_loss = 0;
    *why = "not a JSON object";
    jws(&c);
    if (*c.p != '{') return -1;
    c.p++;
    jws(&c);
    if (*c.p == '}') c.p++;
    else
        for (;;) {
            char key[32];
            jws(&c);
            if (jstring(&c, key, sizeof key)) return -1;
            jws(&c);
            if (*c.p++ != ':') return -1;
            jws(&c);
            int is_step = strcmp(key, "step") == 0, is_loss = strcmp(key, "loss") == 0;
            if ((is_step || is_loss) && (*c.p == '-' || (*c.p >= '0' && *c.p <= '9'))) {
                double v;
                if (jnumber(&c, &v)) return -1;
                if (is_step) *step = v, have_step = 1;
                else *loss = v, have_loss = 1;
            } else {
                if (jvalue(&c, 0)) return -1;
                if (is_step) have_step = -1;
                if (is_loss) have_loss = -1;
            }
            jws(&c);
            if (*c.p == ',') {
                c.p++;
                continue;
            }
            if (*c.p++ != '}') return -1;
            break;
        }
    jws(&c);
    if (*c.p) {
        *why = "text after the JSON object";
        return -1;
    }
    if (have_step != 1) {
        *why = have_step ? "\"step\" is not a number" : "no \"step\"";
        return -1;
    }
    if (have_loss != 1) {
        *why = have_loss ? "\"loss\" is not a number" : "no \"loss\"";
        return -1;
    }
    if (*step < 0 || *step != floor(*step) || *step > 1e15) {
        *why = "\"step\" is not a whole number >= 0";
        return -1;
    }
    if (!isfinite(*loss)) {
        *why = "\"loss\" is not finite";
        return -1;
    }
    return 0;
}

static int by_step_then_order(const void *a, const void *b) {
    const point *x = a, *y = b;
    if (x->step != y->step) return x->step < y->step ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

/* Reads the file into the points to draw: sorted by step, one per step.
 * @return 0, or -1 after saying why on stderr. */
static int read_points(const char *path, point **out, size_t *n_out) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "tessera plot: %s: %s\n", path, strerror(errno));
        return -1;
    }
    point *pts = NULL;
    size_t n = 0, cap = 0, lineno = 0, skipped = 0;
    char *line = NULL;
    size_t lcap = 0;
    ssize_t len;
    int rc = 0;
    while ((len = getline(&line, &lcap, f)) >= 0) {
        lineno++;
        if (memchr(line, 0, (size_t)len)) {
            line[0] = 'x', line[1] = 0; /* a NUL byte: report it as not JSON */
        }
        const char *s = line;
        while (*s == ' ' || *s == '\t' || *s == '\r' || *s == '\n') s++;
        if (!*s) continue; /* blank lines are not worth a warning */
        double step = 0, loss = 0;
        const char *why;
        if (metrics_line(line, &step, &loss, &why)) {
            if (++skipped <= MAX_WARNINGS)
                fprintf(stderr, "tessera plot: warning: %s:%zu: skipped: %s\n", path, lineno, why);
            continue;
        }
        if (tsr_grow((void **)&pts, &cap, n, sizeof *pts)) {
            fprintf(stderr, "tessera plot: out of memory\n");
            rc = -1;
            break;
        }
        pts[n] = (point){step, loss, n};
        n++;
    }
    if (!rc && ferror(f)) {
        fprintf(stderr, "tessera plot: %s: read error\n", path);
        rc = -1;
    }
    free(line);
    fclose(f);
    if (skipped > MAX_WARNINGS)
        fprintf(stderr, "tessera plot: warning: %s: %zu more lines skipped\n", path, skipped - MAX_WARNINGS);
    if (rc) {
        free(pts);
        return -1;
    }
    tsr_sort(pts, n, sizeof *pts, by_step_then_order);
    /* keep the last of each run of equal steps */
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (i + 1 < n && pts[i + 1].step == pts[i].step) continue;
        pts[k++] = pts[i];
    }
    *out = pts;
    *n_out = k;
    return 0;
}

/* ------------------------------------------------------------ gnuplot */

/* A gnuplot single-quoted string: no escapes inside, '' is one quote; newlines
 * would end the command, so they become spaces. */
static void gp_quote(FILE *f, const char *s) {
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'') fputs("''", f);
        else if (*s == '\n' || *s == '\r') fputc(' ', f);
        else fputc(*s, f);
    }
    fputc('\'', f);
}

/* Runs gnuplot on the script with stdout on /dev/null. @return its exit status,
 * -2 when gnuplot is not installed, -1 when it could not be run. */
static int run_gnuplot(const char *script) {
    posix_spawn_file_actions_t fa;
    if (posix_spawn_file_actions_init(&fa)) return -1;
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    char *argv[] = {"gnuplot", (char *)script, NULL};
    pid_t pid;
    int e = posix_spawnp(&pid, "gnuplot", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (e) return e == ENOENT ? -2 : -1;
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return -1;
    if (WIFEXITED(status)) return WEXITSTATUS(status) == 127 ? -2 : WEXITSTATUS(status);
    return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

static int is_png(const char *path) {
    static const unsigned char magic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    unsigned char head[8];
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t n = fread(head, 1, sizeof head, f);
    fclose(f);
    return n == sizeof head && memcmp(head, magic, sizeof magic) == 0;
}

static int draw(const char *out, const char *title, const point *pts, size_t n) {
    const char *tmp = getenv("TMPDIR");
    char dir[4096], data[4200], script[4200];
    snprintf(dir, sizeof dir, "%s/tessera-plot.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "tessera plot: cannot make a temporary directory in %s: %s\n", tmp && *tmp ? tmp : "/tmp",
                strerror(errno));
        return EXIT_FAIL;
    }
    snprintf(data, sizeof data, "%s/loss.dat", dir);
    snprintf(script, sizeof script, "%s/plot.gp", dir);
    int rc = EXIT_FAIL;
    FILE *f = fopen(data, "w");
    if (!f) {
        fprintf(stderr, "tessera plot: %s: %s\n", data, strerror(errno));
        goto done;
    }
    fprintf(f, "# step loss\n");
    for (size_t i = 0; i < n; i++) fprintf(f, "%.0f %.9g\n", pts[i].step, pts[i].loss);
    if (fclose(f)) {
        fprintf(stderr, "tessera plot: %s: write error\n", data);
        goto done;
    }
    f = fopen(script, "w");
    if (!f) {
        fprintf(stderr, "tessera plot: %s: %s\n", script, strerror(errno));
        goto done;
    }
    /* pngcairo draws anti-aliased lines; the plain png terminal is the fallback */
    fputs("if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
          "    set terminal pngcairo size 1000,600\n"
          "} else {\n"
          "    set terminal png size 1000,600\n"
          "}\n",
          f);
    fputs("set output ", f);
    gp_quote(f, out);
    fputs("\nset title ", f);
    gp_quote(f, title);
    fputs(" noenhanced\nset xlabel 'step'\nset ylabel 'loss'\nset grid\nset key off\n", f);
    fputs("plot ", f);
    gp_quote(f, data);
    fprintf(f, " using 1:2 with %s linewidth 2 linecolor rgb '#1f77b4'\n", n > 1 ? "lines" : "points");
    fputs("unset output\n", f);
    if (fclose(f)) {
        fprintf(stderr, "tessera plot: %s: write error\n", script);
        goto done;
    }
    int g = run_gnuplot(script);
    if (g == -2) fprintf(stderr, "tessera plot: gnuplot is missing: run make deps (or apt-get install gnuplot-nox)\n");
    else if (g == -1) fprintf(stderr, "tessera plot: cannot run gnuplot: %s\n", strerror(errno));
    else if (g != 0) fprintf(stderr, "tessera plot: gnuplot failed (exit status %d) drawing %s\n", g, out);
    else if (!is_png(out)) fprintf(stderr, "tessera plot: gnuplot wrote no PNG image to %s\n", out);
    else rc = EXIT_OK;
done:
    unlink(data);
    unlink(script);
    rmdir(dir);
    return rc;
}

/* ------------------------------------------------------------ the command */

int tsr_cmd_plot(int argc, char **argv) {
    const char *metrics = NULL, *out = NULL, *title = NULL, *val;
    int table = 0;
    for (int i = 1; i < argc; i++) {
        int r;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(plot_help, stdout);
            return EXIT_OK;
        }
        if (strcmp(argv[i], "-o") == 0) {
            if (i + 1 >= argc) return tsr_usage_error("plot", "-o needs a value");
            out = argv[++i];
        } else if ((r = tsr_opt(argc, argv, &i, "output", 1, &val))) {
            if (r < 0) return EXIT_USAGE;
            out = val;
        } else if ((r = tsr_opt(argc, argv, &i, "title", 1, &val))) {
            if (r < 0) return EXIT_USAGE;
            title = val;
        } else if ((r = tsr_opt(argc, argv, &i, "table", 0, &val))) {
            table = 1;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return tsr_usage_error("plot", "unknown option %s (tessera plot --help)", argv[i]);
        } else if (!metrics) {
            metrics = argv[i];
        } else {
            return tsr_usage_error("plot", "one metrics file at a time (got %s and %s)", metrics, argv[i]);
        }
    }
    if (!metrics) return tsr_usage_error("plot", "no metrics file given");
    if (out && !*out) return tsr_usage_error("plot", "-o needs a file name");

    char def_out[4096];
    if (!out) {
        const char *slash = strrchr(metrics, '/');
        if (slash) snprintf(def_out, sizeof def_out, "%.*s/loss.png", (int)(slash - metrics), metrics);
        else snprintf(def_out, sizeof def_out, "loss.png");
        out = def_out;
    }
    if (!title) title = metrics;

    struct stat st;
    if (stat(metrics, &st) == 0 && S_ISDIR(st.st_mode)) {
        fprintf(stderr, "tessera plot: %s: is a directory, not a metrics file\n", metrics);
        return EXIT_FAIL;
    }
    point *pts;
    size_t n;
    if (read_points(metrics, &pts, &n)) return EXIT_FAIL;
    if (n == 0) {
        fprintf(stderr, "tessera plot: %s: no data points (lines with numeric \"step\" and \"loss\")\n", metrics);
        free(pts);
        return EXIT_FAIL;
    }
    if (table) {
        printf("# step loss\n");
        for (size_t i = 0; i < n; i++) printf("%.0f %.9g\n", pts[i].step, pts[i].loss);
        free(pts);
        return EXIT_OK;
    }
    /* Open the output ourselves first: gnuplot only warns when it cannot, and
     * would then draw to its stdout. */
    int existed = access(out, F_OK) == 0;
    int fd = open(out, O_WRONLY | O_CREAT, 0644);
    if (fd < 0) {
        fprintf(stderr, "tessera plot: cannot write %s: %s\n", out, strerror(errno));
        free(pts);
        return EXIT_FAIL;
    }
    close(fd);
    int rc = draw(out, title, pts, n);
    if (rc == EXIT_OK)
        printf("wrote %s: %zu points, steps %.0f to %.0f, loss %.4g to %.4g\n", out, n, pts[0].step,
               pts[n - 1].step, pts[0].loss, pts[n - 1].loss);
    else if (!existed) unlink(out); /* no empty image left behind */
    free(pts);
    return rc;
}
