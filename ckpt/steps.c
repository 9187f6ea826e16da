/* steps.c: step directories under a checkpoint root, local or s3://: their
 * names, whether each is committed (its MANIFEST exists), listing (committed,
 * uncommitted and abandoned), the newest committed one, and removal (MANIFEST
 * first). The engine's retention and the archiver build on these. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "fence.h"
#include "store.h"
#include "tsr_ckpt.h"

int tsr_ckpt_is_committed(const char *step_dir) {
    if (!(tsr_store_caps(step_dir) & TSR_STORE_DIRS)) { /* keys under a prefix */
        tsr_store *st = tsr_store_open(step_dir, 0, NULL);
        int yes = st && tsr_store_exists(st, "MANIFEST", NULL) == 1;
        tsr_store_close(st);
        return yes;
    }
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/MANIFEST", step_dir);
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* What the header of step_dir's MANIFEST says (its first 96 bytes: one small
 * read, also on object storage): *poisoned (FORMAT.md 4.5) and *epoch (4.6).
 * @return 0, or -1 when there is no MANIFEST with a valid header to say so. */
static int read_header(const char *step_dir, int *poisoned, uint64_t *epoch) {
    tsr_store *st = tsr_store_open(step_dir, 0, NULL);
    tsr_rfile *f = NULL;
    uint64_t size = 0;
    uint8_t h[96];
    int ok = st && tsr_store_open_read(st, "MANIFEST", &f, &size, NULL) == 0 && size >= sizeof h &&
             tsr_rfile_read(f, h, sizeof h, 0, NULL) == 0 && memcmp(h, "TSRMNFST", 8) == 0 &&
             tsr_ld16(h + 8) == TSR_FORMAT_MAJOR;
    if (ok) *poisoned = (tsr_ld32(h + 52) & 1u) != 0, *epoch = tsr_ld64(h + 88);
    if (f) tsr_rfile_close(f);
    tsr_store_close(st);
    return ok ? 0 : -1;
}

int tsr_step_poisoned(const char *step_dir) {
    int poisoned = 0;
    uint64_t epoch;
    return read_header(step_dir, &poisoned, &epoch) == 0 && poisoned;
}

void tsr_step_dir_name(uint64_t step, char *buf, size_t len) {
    snprintf(buf, len, "step-%08llu", (unsigned long long)step);
}

int tsr_parse_step_dir(const char *name, uint64_t *step) {
    if (strncmp(name, "step-", 5) != 0) return 0;
    const char *p = name + 5;
    size_t n = strlen(p);
    if (n < 8 || n > 20) return 0;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') return 0;
        if (tsr_mul_ovf(v, 10, &v) || tsr_add_ovf(v, (uint64_t)(p[i] - '0'), &v)) return 0;
    }
    *step = v;
    return 1;
}

typedef struct name_list {
    char (*v)[300];
    size_t n, cap;
} name_list;

static int collect_name(void *user, const char *name, uint64_t size) {
    (void)size;
    name_list *l = user;
    if (tsr_grow((void **)&l->v, &l->cap, l->n, sizeof *l->v)) return TSR_ENOMEM;
    snprintf(l->v[l->n++], sizeof *l->v, "%s", name);
    return 0;
}

/* Removes a step directory (local or s3://): the MANIFEST first, so that an
 * interrupted removal leaves an uncommitted step, never a damaged committed one. */
int tsr_remove_step_dir(const char *dir, tsr_error *err) {
    tsr_store *st = tsr_store_open(dir, 0, err);
    if (!st) return err ? err->code : TSR_ENOTFOUND;
    name_list l = {0};
    int rc = tsr_store_list(st, collect_name, &l, err);
    /* an object store has no directories: nothing under the prefix, no checkpoint */
    if (!rc && l.n == 0 && !(tsr_store_caps(dir) & TSR_STORE_DIRS))
        rc = tsr_err(err, TSR_ENOTFOUND, "%s: no such checkpoint (nothing is stored under it)", dir);
    int present = rc ? 0 : tsr_store_exists(st, "MANIFEST", err);
    if (present < 0) rc = present;
    if (present > 0) rc = tsr_store_remove(st, "MANIFEST", err);
    for (size_t i = 0; i < l.n && !rc; i++)
        if (strcmp(l.v[i], "MANIFEST") != 0 && l.v[i][strlen(l.v[i]) - 1] != '/') rc = tsr_store_remove(st, l.v[i], err);
    free(l.v);
    tsr_store_close(st);
    if (!rc && (tsr_store_caps(dir) & TSR_STORE_DIRS) && rmdir(dir) != 0)
        rc = tsr_err(err, TSR_EIO, "%s: cannot remove the directory: %s", dir, strerror(errno));
    return rc;
}

int tsr_retire_step_dir(const char *dir, const char *spare, tsr_error *err) {
    char mf[PATH_MAX + 16];
    snprintf(mf, sizeof mf, "%s/MANIFEST", dir);
    if (unlink(mf) != 0 && errno != ENOENT)
        return tsr_err(err, TSR_EIO, "%s: cannot remove: %s", mf, strerror(errno));
    int e = tsr_mkdir_p(spare);
    DIR *d = e ? NULL : opendir(dir);
    for (struct dirent *de; d && (de = readdir(d));) {
        size_t n = strlen(de->d_name);
        if (strncmp(de->d_name, "data-", 5) != 0 || n < 9 || strcmp(de->d_name + n - 4, ".tsd") != 0) continue;
        char from[PATH_MAX + 300], to[PATH_MAX + 300];
        snprintf(from, sizeof from, "%s/%s", dir, de->d_name);
        snprintf(to, sizeof to, "%s/%s", spare, de->d_name);
        rename(from, to); /* a file that cannot move is removed with the rest */
    }
    if (d) closedir(d);
    return tsr_remove_step_dir(dir, err);
}

static int cmp_steps(const void *a, const void *b) {
    const tsr_step_info *x = a, *y = b;
    return (x->step > y->step) - (x->step < y->step);
}

/* "step-N.abandoned-TIME": a step directory that a rewind moved aside. */
static int parse_abandoned_dir(const char *name, uint64_t *step) {
    const char *dot = strstr(name, ".abandoned-");
    if (!dot || !dot[11] || dot - name > 25) return 0;
    char head[32];
    snprintf(head, sizeof head, "%.*s", (int)(dot - name), name);
    return tsr_parse_step_dir(head, step);
}

/* The reader's rule (FORMAT.md 4.6): a step committed by a fenced writer after
 * its fence is not a valid commit. A FENCE that cannot be read voids nothing
 * (the listing would otherwise hide every checkpoint): it is logged, and
 * writers and the supervisor refuse it. */
static void mark_fenced(const char *root, tsr_step_info *v, size_t n) {
    tsr_fence f;
    tsr_error e = {0};
    if (tsr_fence_read(root, &f, &e)) {
        tsr_log(1, "%s (the fence is not applied to the steps listed)", e.msg);
        return;
    }
    for (size_t i = 0; i < n; i++) v[i].fenced = v[i].committed && tsr_fence_voids(&f, v[i].epoch, v[i].step);
    tsr_fence_free(&f);
}

static int list_steps(const char *root, int abandoned, tsr_step_info **out, size_t *count) {
    *out = NULL;
    *count = 0;
    tsr_store *st = tsr_store_open(root, 0, NULL);
    if (!st) return TSR_ENOTFOUND;
    name_list l = {0};
    int rc = tsr_store_list(st, collect_name, &l, NULL);
    tsr_store_close(st);
    tsr_step_info *v = NULL;
    size_t n = 0, cap = 0;
    for (size_t i = 0; i < l.n && !rc; i++) {
        uint64_t step;
        size_t len = strlen(l.v[i]);
        if (len && l.v[i][len - 1] == '/') l.v[i][len - 1] = 0; /* a directory */
        else continue;
        if (!(abandoned ? parse_abandoned_dir(l.v[i], &step) : tsr_parse_step_dir(l.v[i], &step))) continue;
        if (strlen(l.v[i]) >= sizeof v->name) continue;
        if ((rc = tsr_grow((void **)&v, &cap, n, sizeof *v))) break;
        char path[PATH_MAX + 300];
        snprintf(path, sizeof path, "%s/%s", root, l.v[i]);
        v[n].step = step;
        v[n].committed = tsr_ckpt_is_committed(path);
        v[n].poisoned = v[n].fenced = 0;
        v[n].epoch = 0;
        if (v[n].committed && !abandoned) read_header(path, &v[n].poisoned, &v[n].epoch);
        snprintf(v[n].name, sizeof v[n].name, "%s", l.v[i]);
        n++;
    }
    free(l.v);
    if (rc) {
        free(v);
        return rc;
    }
    if (!abandoned) mark_fenced(root, v, n);
    tsr_sort(v, n, sizeof *v, cmp_steps);
    *out = v;
    *count = n;
    return 0;
}

int tsr_list_steps(const char *root, tsr_step_info **out, size_t *count) {
    return list_steps(root, 0, out, count);
}

int tsr_list_abandoned_steps(const char *root, tsr_step_info **out, size_t *count) {
    return list_steps(root, 1, out, count);
}

int tsr_latest_step_before(const char *root, uint64_t before, uint64_t *step, char *dir, size_t len) {
    tsr_step_info *v = NULL;
    size_t n = 0;
    tsr_list_steps(root, &v, &n);
    int rc = TSR_ENOTFOUND;
    for (size_t i = n; i-- > 0;) {
        if (!v[i].committed || v[i].step >= before) continue;
        if (v[i].fenced) {
            tsr_log(1, "%s/%s: fenced: its MANIFEST (epoch %llu) was committed after a newer launch's fence "
                    "(%s/FENCE): not a valid commit, passed over", root, v[i].name,
                    (unsigned long long)v[i].epoch, root);
            continue;
        }
        if (v[i].poisoned) continue;
        *step = v[i].step;
        if (dir) snprintf(dir, len, "%s/%s", root, v[i].name);
        rc = 0;
        break;
    }
    free(v);
    return rc;
}

int tsr_latest_step(const char *root, uint64_t *step, char *dir, size_t len) {
    return tsr_latest_step_before(root, UINT64_MAX, step, dir, len);
}

void tsr_retention_keep(const tsr_step_info *v, size_t n, uint32_t k, int *keep) {
    size_t seen = 0;
    int clean = 0; /* a clean one is kept */
    for (size_t i = n; i-- > 0;) {
        keep[i] = 0;
        if (!v[i].committed || v[i].fenced) continue; /* a fenced one is no checkpoint: removed */
        if (k == 0 || seen < k) keep[i] = 1, seen++;
        else if (!clean && !v[i].poisoned) keep[i] = 1; /* the newest clean one, besides the newest k */
        if (keep[i] && !v[i].poisoned) clean = 1;
    }
}
