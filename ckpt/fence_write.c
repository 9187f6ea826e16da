/* fence_write.c: the writers' side of fencing (fence.h; FORMAT.md 4.6): the
 * check before a file is created and before a commit (tsr_fence_admit), and
 * raising a folder's fence: the supervisor's tsr_fence_advance, the local
 * tier's tsr_fence_raise. The new FENCE is the old one with a record appended,
 * put atomically (the store's put_atomic): a reader sees the old fence or the
 * new one, never a mix. */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "fence.h"
#include "store.h"
#include "tsr_ckpt.h"

int tsr_fence_root(const char *step_dir, char *out, size_t len) {
    size_t n = strlen(step_dir);
    while (n > 1 && step_dir[n - 1] == '/') n--;
    size_t base = n;
    while (base > 0 && step_dir[base - 1] != '/') base--;
    char name[64];
    uint64_t step;
    if (n - base >= sizeof name) return 0;
    snprintf(name, sizeof name, "%.*s", (int)(n - base), step_dir + base);
    if (!tsr_parse_step_dir(name, &step)) return 0;
    size_t parent = base;
    while (parent > 1 && step_dir[parent - 1] == '/') parent--;
    if (parent == 0) snprintf(out, len, ".");
    else snprintf(out, len, "%.*s", (int)parent, step_dir);
    return 1;
}

int tsr_fence_admit(const char *step_dir, uint64_t *epoch_io, int commit, tsr_error *err) {
    uint64_t epoch = *epoch_io;
    char root[PATH_MAX], name[64];
    uint64_t step = 0;
    if (!tsr_fence_root(step_dir, root, sizeof root)) return 0;
    const char *base = strrchr(step_dir, '/');
    snprintf(name, sizeof name, "%s", base ? base + 1 : step_dir);
    tsr_parse_step_dir(name, &step);
    tsr_fence f;
    int rc = tsr_fence_read(root, &f, err);
    if (rc) {
        tsr_err_prefix(err, "%s: step %" PRIu64 ": cannot tell whether this writer is fenced", root, step);
        return rc;
    }
    uint64_t fe = tsr_fence_epoch(&f);
    const char *what = commit ? "nothing was committed" : "nothing was written";
    if (epoch > 0 && fe > epoch)
        rc = tsr_err(err, TSR_EBUSY, "fenced: %s: step %" PRIu64 ": this writer's epoch %" PRIu64
                     " is older than the folder's fence, epoch %" PRIu64 " (%s/%s): a newer launch writes the folder; %s",
                     root, step, epoch, fe, root, TSR_FENCE_NAME, what);
    else if (epoch == 0 && commit) /* an offline tool: it commits as the folder's epoch of now */
        *epoch_io = fe;
    tsr_fence_free(&f);
    return rc;
}

/* Raises the fence of root: to `epoch` (only upward; refused when it is newer),
 * or, with epoch 0, to one above both the fence's epoch and every epoch a
 * MANIFEST of the folder records; the new epoch into *out. */
static int raise_fence(const char *root, uint64_t epoch, uint64_t *out, tsr_error *err) {
    tsr_store *st = tsr_store_open(root, 1, err);
    if (!st) return err ? err->code : TSR_EIO;
    tsr_fence f;
    int rc = tsr_fence_get(st, root, &f, err);
    uint64_t fe = tsr_fence_epoch(&f), top = fe;
    if (!rc && epoch > 0 && fe > epoch)
        rc = tsr_err(err, TSR_EBUSY, "fenced: %s: this launch's epoch %" PRIu64 " is older than the folder's fence, "
                     "epoch %" PRIu64 " (%s/%s): a newer launch writes the folder", root, epoch, fe, root, TSR_FENCE_NAME);
    int todo = !rc && !(epoch > 0 && fe == epoch);
    /* the newest valid commit, and the newest epoch any MANIFEST records (a
     * launch that wrote with an epoch the fence never had: TSR_EPOCH set by hand) */
    tsr_fence_rec r = {epoch, 0, 0};
    tsr_step_info *v = NULL;
    size_t n = 0;
    if (todo && tsr_list_steps(root, &v, &n) == 0)
        for (size_t i = 0; i < n; i++) {
            if (!v[i].committed) continue;
            if (v[i].epoch > top) top = v[i].epoch;
            if (!v[i].fenced) r.step = v[i].step, r.has_step = 1;
        }
    free(v);
    if (todo && epoch == 0 && top == UINT64_MAX)
        rc = tsr_err(err, TSR_EINVAL, "%s/%s: the epochs are spent", root, TSR_FENCE_NAME);
    if (todo && epoch == 0) r.epoch = top + 1;
    if (todo && !rc && r.epoch <= top)
        rc = tsr_err(err, TSR_EBUSY, "fenced: %s: this launch's epoch %" PRIu64 " is not above epoch %" PRIu64
                     ", which a MANIFEST there records", root, epoch, top);
    tsr_sbuf b = {0};
    size_t cap = f.n;
    if (todo && !rc) {
        if (tsr_grow((void **)&f.v, &cap, f.n, sizeof *f.v)) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
        else f.v[f.n++] = r;
        if (!rc && tsr_fence_format(&f, &b)) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
        if (!rc && b.n > TSR_FENCE_MAX_SIZE)
            rc = tsr_err(err, TSR_EINVAL, "%s/%s: full (%zu fences)", root, TSR_FENCE_NAME, f.n - 1);
        if (!rc) rc = tsr_store_put_atomic(st, TSR_FENCE_NAME, b.p, b.n, err);
        if (!rc) fe = r.epoch;
    }
    if (!rc && out) *out = fe;
    free(b.p);
    tsr_fence_free(&f);
    tsr_store_close(st);
    return rc;
}

int tsr_fence_advance(const char *root, uint64_t *epoch, tsr_error *err) {
    return raise_fence(root, 0, epoch, err);
}

int tsr_fence_raise(const char *root, uint64_t epoch, tsr_error *err) {
    return raise_fence(root, epoch, NULL, err);
}
