/* cmd_plot.c: tessera plot: the loss curve of a trainer's metrics file, drawn
 * to a PNG by gnuplot.
 *
 * The metrics file is JSON lines, one object per logged step, e.g.
 *   {"step": 10, "loss": 4.1, "grad_norm": 1.2, "lr": 0.0008, ...}
 * A resumed run appends to the same file, so a step can appear more than once;
 * the last value logged for a step is the one drawn, which keeps the curve
 * unbroken.
 *
 * A run under tessera launch has launch.jsonl beside its metrics: the
 * supervisor's events. Each relaunch becomes a mark on the curve at the step
 * the job went back to (the curve from there on is the new launch's), labelled
 * with why: a rank lost or hung, a node dropped, a NaN rolled back. */
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
    "usage: tessera plot METRICS.jsonl [-o PNG] [--title T] [--events FILE | --no-events]\n"
    "                    [--table] [--marks]\n"
    "Draws loss against step from the JSON-lines metrics file the trainer writes\n"
    "(one object per logged step with numeric \"step\" and \"loss\") to a PNG, with\n"
    "gnuplot. Lines that are not such objects are skipped with a warning naming the\n"
    "line. When a step appears more than once (a resumed run appends to the same\n"
    "file), its last value is drawn.\n"
    "The event log of tessera launch marks the curve: each restart is a dashed line\n"
    "at the step the job resumed from, labelled \"restart (rank 3 lost)\", \"restart\n"
    "(rank 3 hung)\", \"node 1 dropped (rank 2 lost)\" or \"rollback to step 8 (NaN\n"
    "at step 11)\". Its lines are read as the metrics' are: bad ones are skipped\n"
    "with a warning naming the line.\n"
    "  -o, --output PNG  the image to write (default: loss.png next to METRICS)\n"
    "  --title T         the title of the plot (default: the metrics path)\n"
    "  --events FILE     the event log of tessera launch (default: launch.jsonl next\n"
    "                    to METRICS, when there is one)\n"
    "  --no-events       no marks\n"
    "  --table           print the step and loss columns that would be drawn, and\n"
    "                    draw nothing (needs no gnuplot)\n"
    "  --marks           print the marks that would be drawn (step, kind: restart,\n"
    "                    node_dropped or rollback, label), and draw nothing\n"
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

/* A field of a JSON object line that a caller wants: a number, or with is_str
 * a string (its first bytes). have: 1 found, -1 found with another type, 0 not
 * there; a key given twice keeps its last value. */
typedef struct jfield {
    const char *key;
    int is_str;
    int have;
    double num;
    char str[32];
} jfield;

/* Reads one line that must be a JSON object, picking out the fields asked for.
 * @return 0, or -1 with the reason in *why. */
static int jfields(const char *line, jfield *f, int nf, const char **why) {
    jcur c = {line};
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
            jfield *k = NULL;
            for (int i = 0; i < nf; i++)
                if (strcmp(key, f[i].key) == 0) k = &f[i];
            if (k && k->is_str && *c.p == '"') {
                if (jstring(&c, k->str, sizeof k->str)) return -1;
                k->have = 1;
            } else if (k && !k->is_str && (*c.p == '-' || (*c.p >= '0' && *c.p <= '9'))) {
                if (jnumber(&c, &k->num)) return -1;
                k->have = 1;
            } else {
                if (jvalue(&c, 0)) return -1;
                if (k) k->have = -1;
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
    return 0;
}

/* Reads one metrics line: a JSON object with numeric "step" and "loss".
 * @return 0, or -1 with the reason in *why. */
static int metrics_line(const char *line, double *step, double *loss, const char **why) {
    jfield f[2] = {{.key = "step"}, {.key = "loss"}};
    if (jfields(line, f, 2, why)) return -1;
    if (f[0].have != 1) {
        *why = f[0].have ? "\"step\" is not a number" : "no \"step\"";
        return -1;
    }
    if (f[1].have != 1) {
        *why = f[1].have ? "\"loss\" is not a number" : "no \"loss\"";
        return -1;
    }
    *step = f[0].num;
    *loss = f[1].num;
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

/* What a JSON-lines reader does with one line that is not blank.
 * @return 0 taken, -1 skipped (the reason in *why), -2 out of memory. */
typedef int (*line_fn)(void *ctx, const char *line, const char **why);

/* Reads a JSON-lines file, line by line, into fn; a line fn skips gets a
 * warning naming the file and line (the metrics and the event log alike: a
 * torn or foreign line should not cost the whole picture).
 * @return 0, or -1 after saying why on stderr. */
static int read_jsonl(const char *path, line_fn fn, void *ctx) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "tessera plot: %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t lineno = 0, skipped = 0;
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
        const char *why = "";
        int r = fn(ctx, line, &why);
        if (r == -2) {
            fprintf(stderr, "tessera plot: out of memory\n");
            rc = -1;
            break;
        }
        if (r && ++skipped <= MAX_WARNINGS)
            fprintf(stderr, "tessera plot: warning: %s:%zu: skipped: %s\n", path, lineno, why);
    }
    if (!rc && ferror(f)) {
        fprintf(stderr, "tessera plot: %s: read error\n", path);
        rc = -1;
    }
    free(line);
    fclose(f);
    if (skipped > MAX_WARNINGS)
        fprintf(stderr, "tessera plot: warning: %s: %zu more lines skipped\n", path, skipped - MAX_WARNINGS);
    return rc;
}

static int by_step_then_order(const void *a, const void *b) {
    const point *x = a, *y = b;
    if (x->step != y->step) return x->step < y->step ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

typedef struct points {
    point *p;
    size_t n, cap;
} points;

static int point_line(void *ctx, const char *line, const char **why) {
    points *ps = ctx;
    double step = 0, loss = 0;
    if (metrics_line(line, &step, &loss, why)) return -1;
    if (tsr_grow((void **)&ps->p, &ps->cap, ps->n, sizeof *ps->p)) return -2;
    ps->p[ps->n] = (point){step, loss, ps->n};
    ps->n++;
    return 0;
}

/* Reads the file into the points to draw: sorted by step, one per step.
 * @return 0, or -1 after saying why on stderr. */
static int read_points(const char *path, point **out, size_t *n_out) {
    points ps = {0};
    if (read_jsonl(path, point_line, &ps)) {
        free(ps.p);
        return -1;
    }
    tsr_sort(ps.p, ps.n, sizeof *ps.p, by_step_then_order);
    /* keep the last of each run of equal steps */
    size_t k = 0;
    for (size_t i = 0; i < ps.n; i++) {
        if (i + 1 < ps.n && ps.p[i + 1].step == ps.p[i].step) continue;
        ps.p[k++] = ps.p[i];
    }
    *out = ps.p;
    *n_out = k;
    return 0;
}

/* ------------------------------------------------------------ the fault story */

/* One mark on the curve: a relaunch, at the step the job went back to. */
typedef struct mark {
    double step;
    const char *kind; /* "restart", "node_dropped" or "rollback" */
    char label[96];
    int pending;      /* the step is not known until the new launch trains */
    double fail_step; /* where the failure was: the step when it never trained */
    size_t order;     /* log order, kept among marks of one step */
} mark;

/* The event log read in order: a failure's events (rank_exit, hang or nan;
 * killed; node_dropped; rollback) come before its relaunch, and the new
 * launch's "recovered" names its first step, one after the step it resumed
 * from. Launches that fail before their first step leave their relaunches
 * pending until one recovers. */
typedef struct story {
    mark *m;
    size_t n, cap;
    char cause[48]; /* of the failure being read: "rank 3 lost" */
    double fail_step, node, rb_to, rb_bad;
    int have_node, have_rb;
    char why[96];
} story;

static void story_new_failure(story *s) {
    s->cause[0] = 0;
    s->fail_step = -1;
    s->have_node = s->have_rb = 0;
}

/* Pending marks whose launch never trained stay at their failure, or go. */
static void story_settle(story *s) {
    size_t k = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (s->m[i].pending) s->m[i].step = s->m[i].fail_step, s->m[i].pending = 0;
        if (s->m[i].step >= 0) s->m[k++] = s->m[i];
    }
    s->n = k;
}

enum { EV_NAME, EV_STEP, EV_RANK, EV_NODE, EV_CKPT, EV_BAD, EV_CAUSE, EV_N };

/* The numeric fields each event that tells the story must carry (a second
 * need that repeats the first: one field). */
static const struct {
    const char *event;
    int need[2];
} EV_NEEDS[] = {
    {"rank_exit", {EV_RANK, EV_STEP}},
    {"hang", {EV_RANK, EV_STEP}},
    {"nan", {EV_STEP, EV_STEP}},
    {"node_dropped", {EV_NODE, EV_NODE}},
    {"rollback", {EV_CKPT, EV_BAD}},
    {"recovered", {EV_STEP, EV_STEP}},
};

static int event_line(void *ctx, const char *line, const char **why) {
    story *s = ctx;
    jfield f[EV_N] = {[EV_NAME] = {.key = "event", .is_str = 1}, [EV_STEP] = {.key = "step"},
                      [EV_RANK] = {.key = "rank"}, [EV_NODE] = {.key = "node"},
                      [EV_CKPT] = {.key = "checkpoint_step"}, [EV_BAD] = {.key = "bad_step"},
                      [EV_CAUSE] = {.key = "cause", .is_str = 1}};
    if (jfields(line, f, EV_N, why)) return -1;
    if (f[EV_NAME].have != 1) {
        *why = "no \"event\" name";
        return -1;
    }
    const char *ev = f[EV_NAME].str;
    for (size_t i = 0; i < sizeof EV_NEEDS / sizeof *EV_NEEDS; i++) {
        if (strcmp(ev, EV_NEEDS[i].event)) continue;
        for (int j = 0; j < 2; j++) {
            const jfield *x = &f[EV_NEEDS[i].need[j]];
            if (x->have != 1 || x->num < 0 || x->num != floor(x->num) || x->num > 1e15) {
                if (x->have) snprintf(s->why, sizeof s->why, "\"%s\": \"%s\" is not a whole number >= 0", ev, x->key);
                else snprintf(s->why, sizeof s->why, "\"%s\" without \"%s\"", ev, x->key);
                *why = s->why;
                return -1;
            }
        }
    }
    double step = f[EV_STEP].num;
    if (!strcmp(ev, "start")) { /* a new supervisor: the last one's story is over */
        story_settle(s);
        story_new_failure(s);
    } else if (!strcmp(ev, "rank_exit") || !strcmp(ev, "hang")) {
        if (!s->cause[0]) { /* the first rank to go is the cause; the others follow it */
            snprintf(s->cause, sizeof s->cause, "rank %.0f %s", f[EV_RANK].num, ev[0] == 'h' ? "hung" : "lost");
            s->fail_step = step;
        }
    } else if (!strcmp(ev, "nan")) {
        if (!s->cause[0]) snprintf(s->cause, sizeof s->cause, "NaN at step %.0f", step), s->fail_step = step;
    } else if (!strcmp(ev, "killed")) {
        if (!s->cause[0]) snprintf(s->cause, sizeof s->cause, "%s", f[EV_CAUSE].have == 1 ? f[EV_CAUSE].str : "");
    } else if (!strcmp(ev, "node_dropped")) {
        s->have_node = 1;
        s->node = f[EV_NODE].num;
    } else if (!strcmp(ev, "rollback")) {
        s->have_rb = 1;
        s->rb_to = f[EV_CKPT].num;
        s->rb_bad = f[EV_BAD].num;
    } else if (!strcmp(ev, "relaunch")) {
        if (tsr_grow((void **)&s->m, &s->cap, s->n, sizeof *s->m)) return -2;
        mark *m = &s->m[s->n++];
        *m = (mark){.step = -1, .kind = "restart", .pending = 1, .fail_step = s->fail_step, .order = s->n};
        const char *c = s->cause[0] ? s->cause : "cause unknown";
        if (s->have_rb) { /* the step it goes back to is known now */
            m->kind = "rollback";
            m->step = s->rb_to;
            m->pending = 0;
            snprintf(m->label, sizeof m->label, "rollback to step %.0f (NaN at step %.0f)", s->rb_to, s->rb_bad);
        } else if (s->have_node) {
            m->kind = "node_dropped";
            snprintf(m->label, sizeof m->label, "node %.0f dropped (%s)", s->node, c);
        } else {
            snprintf(m->label, sizeof m->label, "restart (%s)", c);
        }
        story_new_failure(s);
    } else if (!strcmp(ev, "recovered")) {
        for (size_t i = 0; i < s->n; i++)
            if (s->m[i].pending) s->m[i].step = step - 1, s->m[i].pending = 0;
    }
    return 0; /* other events (rank_up, straggler, chaos, ...) tell no restart */
}

static int by_mark_step(const void *a, const void *b) {
    const mark *x = a, *y = b;
    if (x->step != y->step) return x->step < y->step ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

/* Reads an event log into its marks, sorted by step.
 * @return 0, or -1 after saying why on stderr. */
static int read_marks(const char *path, mark **out, size_t *n_out) {
    story s = {0};
    story_new_failure(&s);
    if (read_jsonl(path, event_line, &s)) {
        free(s.m);
        return -1;
    }
    story_settle(&s);
    tsr_sort(s.m, s.n, sizeof *s.m, by_mark_step);
    *out = s.m;
    *n_out = s.n;
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

/* The marks: a dashed line at each step, a label beside it (left of the line
 * in the right half, so that it stays inside) at the highest of four heights
 * where it overlaps no label drawn before it. */
static void gp_marks(FILE *f, const point *pts, size_t n, const mark *m, size_t nm) {
    static const struct {
        const char *kind, *color;
    } COLOR[] = {{"restart", "#ff7f0e"}, {"node_dropped", "#d62728"}, {"rollback", "#9467bd"}};
    enum { LEVELS = 4 };
    const double char_w = 0.009; /* a character of the default font, as a fraction of the plot's width */
    if (!nm) return;
    double lo = pts[0].step, hi = pts[n - 1].step;
    for (size_t i = 0; i < nm; i++) lo = fmin(lo, m[i].step), hi = fmax(hi, m[i].step);
    if (lo < pts[0].step || hi > pts[n - 1].step) { /* a mark beyond the data: the range must hold it */
        double pad = fmax(1, 0.02 * (hi - lo));
        fprintf(f, "set xrange [%.0f:%.0f]\n", lo - pad, hi + pad);
    }
    double end[LEVELS]; /* where the last label at each height ends */
    for (int l = 0; l < LEVELS; l++) end[l] = -1;
    for (size_t i = 0; i < nm; i++) {
        const char *color = COLOR[0].color;
        for (size_t c = 0; c < sizeof COLOR / sizeof *COLOR; c++)
            if (!strcmp(m[i].kind, COLOR[c].kind)) color = COLOR[c].color;
        if (i == 0 || m[i].step != m[i - 1].step) /* one line a step: the first fault there gives its colour */
            fprintf(f, "set arrow from first %.0f, graph 0 to first %.0f, graph 1 nohead dashtype 2 linewidth 1.5 "
                       "linecolor rgb '%s' front\n",
                    m[i].step, m[i].step, color);
        double x = hi > lo ? (m[i].step - lo) / (hi - lo) : 0.5, w = (double)(strlen(m[i].label) + 2) * char_w;
        int right = x > 0.5, level = -1, least = 0;
        double from = right ? x - w : x;
        for (int l = 0; l < LEVELS && level < 0; l++) { /* the highest free height, else the one freed first */
            if (end[l] < from) level = l;
            if (end[l] < end[least]) least = l;
        }
        if (level < 0) level = least;
        end[level] = right ? x : x + w;
        fputs("set label ", f);
        gp_quote(f, m[i].label);
        fprintf(f, " at first %.0f, graph %.2f %s offset character %s,0 textcolor rgb '%s' front noenhanced\n",
                m[i].step, 0.96 - 0.06 * level, right ? "right" : "left", right ? "-0.7" : "0.7", color);
    }
}

static int draw(const char *out, const char *title, const point *pts, size_t n, const mark *m, size_t nm) {
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
    gp_marks(f, pts, n, m, nm);
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
    const char *metrics = NULL, *out = NULL, *title = NULL, *events = NULL, *val;
    int table = 0, list_marks = 0, no_events = 0;
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
        } else if ((r = tsr_opt(argc, argv, &i, "events", 1, &val))) {
            if (r < 0) return EXIT_USAGE;
            events = val;
        } else if ((r = tsr_opt(argc, argv, &i, "no-events", 0, &val))) {
            no_events = 1;
        } else if ((r = tsr_opt(argc, argv, &i, "table", 0, &val))) {
            table = 1;
        } else if ((r = tsr_opt(argc, argv, &i, "marks", 0, &val))) {
            list_marks = 1;
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
    if (events && !*events) return tsr_usage_error("plot", "--events needs a file name");
    if (events && no_events) return tsr_usage_error("plot", "--events and --no-events together");

    char def_out[4096], def_events[4096];
    const char *slash = strrchr(metrics, '/');
    if (!out) {
        if (slash) snprintf(def_out, sizeof def_out, "%.*s/loss.png", (int)(slash - metrics), metrics);
        else snprintf(def_out, sizeof def_out, "loss.png");
        out = def_out;
    }
    if (!events && !no_events) { /* a run under tessera launch has its event log beside its metrics */
        if (slash) snprintf(def_events, sizeof def_events, "%.*s/launch.jsonl", (int)(slash - metrics), metrics);
        else snprintf(def_events, sizeof def_events, "launch.jsonl");
        if (access(def_events, F_OK) == 0) events = def_events;
    }
    if (!title) title = metrics;

    struct stat st;
    if (stat(metrics, &st) == 0 && S_ISDIR(st.st_mode)) {
        fprintf(stderr, "tessera plot: %s: is a directory, not a metrics file\n", metrics);
        return EXIT_FAIL;
    }
    if (events && stat(events, &st) == 0 && S_ISDIR(st.st_mode)) {
        fprintf(stderr, "tessera plot: %s: is a directory, not an event log\n", events);
        return EXIT_FAIL;
    }
    point *pts;
    mark *marks = NULL;
    size_t n, nm = 0;
    if (read_points(metrics, &pts, &n)) return EXIT_FAIL;
    if (n == 0) {
        fprintf(stderr, "tessera plot: %s: no data points (lines with numeric \"step\" and \"loss\")\n", metrics);
        free(pts);
        return EXIT_FAIL;
    }
    if (events && read_marks(events, &marks, &nm)) {
        free(pts);
        return EXIT_FAIL;
    }
    int rc = EXIT_OK;
    if (table || list_marks) {
        if (table) printf("# step loss\n");
        for (size_t i = 0; table && i < n; i++) printf("%.0f %.9g\n", pts[i].step, pts[i].loss);
        if (list_marks) printf("# step kind label\n");
        for (size_t i = 0; list_marks && i < nm; i++)
            printf("%.0f %s %s\n", marks[i].step, marks[i].kind, marks[i].label);
        goto done;
    }
    /* Open the output ourselves first: gnuplot only warns when it cannot, and
     * would then draw to its stdout. */
    int existed = access(out, F_OK) == 0;
    int fd = open(out, O_WRONLY | O_CREAT, 0644);
    if (fd < 0) {
        fprintf(stderr, "tessera plot: cannot write %s: %s\n", out, strerror(errno));
        rc = EXIT_FAIL;
        goto done;
    }
    close(fd);
    rc = draw(out, title, pts, n, marks, nm);
    if (rc == EXIT_OK) {
        printf("wrote %s: %zu points, steps %.0f to %.0f, loss %.4g to %.4g", out, n, pts[0].step, pts[n - 1].step,
               pts[0].loss, pts[n - 1].loss);
        if (events) printf("; %zu mark(s) from %s", nm, events);
        printf("\n");
    } else if (!existed) unlink(out); /* no empty image left behind */
done:
    free(pts);
    free(marks);
    return rc;
}
