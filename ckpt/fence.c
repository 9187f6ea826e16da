/* fence.c: epochs and fencing (fence.h; the rule: FORMAT.md 4.6): the FENCE
 * object's codec, the readers' rule and the writers' check. The FENCE is read
 * through the store, so that a folder and an S3 prefix are fenced alike;
 * the writers' side (the check, raising a fence) is fence_write.c's. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "fence.h"
#include "store.h"
#include "tsr_ckpt.h"

#define FENCE_HEAD "tessera-fence 1\n"

void tsr_fence_free(tsr_fence *f) {
    free(f->v);
    f->v = NULL;
    f->n = 0;
}

/* A decimal u64 of 1 to 20 digits at *p, no sign, no leading zero but "0". */
static int parse_u64(const char **p, const char *end, uint64_t *out) {
    const char *s = *p;
    uint64_t v = 0;
    size_t n = 0;
    while (s + n < end && s[n] >= '0' && s[n] <= '9') {
        if (tsr_mul_ovf(v, 10, &v) || tsr_add_ovf(v, (uint64_t)(s[n] - '0'), &v)) return 0;
        n++;
    }
    if (n == 0 || (n > 1 && s[0] == '0')) return 0;
    *p = s + n;
    *out = v;
    return 1;
}

static int take(const char **p, const char *end, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(end - *p) < n || memcmp(*p, word, n) != 0) return 0;
    *p += n;
    return 1;
}

int tsr_fence_parse(const uint8_t *buf, size_t len, const char *path, tsr_fence *f, tsr_error *err) {
    *f = (tsr_fence){0};
    const char *p = (const char *)buf, *end = p + len;
    if (len > TSR_FENCE_MAX_SIZE)
        return tsr_err(err, TSR_ECORRUPT, "%s: %zu bytes, over the %u of a FENCE", path, len, TSR_FENCE_MAX_SIZE);
    if (!take(&p, end, FENCE_HEAD))
        return tsr_err(err, TSR_ECORRUPT, "%s: not a FENCE (its first line is not \"tessera-fence 1\")", path);
    size_t cap = 0;
    for (size_t line = 2; p < end; line++) {
        tsr_fence_rec r = {0};
        int ok = take(&p, end, "epoch ") && parse_u64(&p, end, &r.epoch) && r.epoch > 0 && take(&p, end, " step ");
        if (ok && take(&p, end, "none")) r.has_step = 0;
        else if (ok) ok = parse_u64(&p, end, &r.step), r.has_step = 1;
        ok = ok && take(&p, end, "\n");
        if (!ok) {
            tsr_fence_free(f);
            return tsr_err(err, TSR_ECORRUPT, "%s: line %zu is not \"epoch E step S\" (E from 1, S a step or none)",
                           path, line);
        }
        if (f->n && r.epoch <= f->v[f->n - 1].epoch) {
            tsr_fence_free(f);
            return tsr_err(err, TSR_ECORRUPT, "%s: line %zu: epoch %" PRIu64 " after epoch %" PRIu64
                           " (epochs must grow)", path, line, r.epoch, f->v[f->n - 1].epoch);
        }
        if (tsr_grow((void **)&f->v, &cap, f->n, sizeof *f->v)) {
            tsr_fence_free(f);
            return tsr_err(err, TSR_ENOMEM, "out of memory");
        }
        f->v[f->n++] = r;
    }
    if (f->n == 0) return tsr_err(err, TSR_ECORRUPT, "%s: no fence in it (a FENCE holds at least one line)", path);
    return 0;
}

const char *tsr_fence_step_text(const tsr_fence_rec *r, char *buf, size_t len) {
    if (r->has_step) snprintf(buf, len, "%" PRIu64, r->step);
    else snprintf(buf, len, "none");
    return buf;
}

int tsr_fence_format(const tsr_fence *f, tsr_sbuf *b) {
    char t[32];
    tsr_sb_put(b, FENCE_HEAD, strlen(FENCE_HEAD));
    for (size_t i = 0; i < f->n; i++)
        tsr_sb_printf(b, "epoch %" PRIu64 " step %s\n", f->v[i].epoch, tsr_fence_step_text(&f->v[i], t, sizeof t));
    return b->oom ? TSR_ENOMEM : 0;
}

int tsr_fence_get(tsr_store *st, const char *root, tsr_fence *f, tsr_error *err) {
    *f = (tsr_fence){0};
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = tsr_store_get(st, TSR_FENCE_NAME, TSR_FENCE_MAX_SIZE + 1, &buf, &len, err);
    if (rc == TSR_ENOTFOUND) {
        if (err) *err = (tsr_error){0};
        return 0;
    }
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/%s", root, TSR_FENCE_NAME);
    if (!rc) rc = tsr_fence_parse(buf, len, path, f, err);
    else tsr_err_prefix(err, "%s", path);
    free(buf);
    return rc;
}

int tsr_fence_read(const char *root, tsr_fence *f, tsr_error *err) {
    *f = (tsr_fence){0};
    tsr_store *st = tsr_store_open(root, 0, NULL);
    if (!st) return 0; /* no folder: no fence */
    int rc = tsr_fence_get(st, root, f, err);
    tsr_store_close(st);
    return rc;
}

uint64_t tsr_fence_epoch(const tsr_fence *f) { return f->n ? f->v[f->n - 1].epoch : 0; }

const tsr_fence_rec *tsr_fence_voids(const tsr_fence *f, uint64_t epoch, uint64_t step) {
    for (size_t i = 0; i < f->n; i++)
        if (f->v[i].epoch > epoch && (!f->v[i].has_step || step > f->v[i].step)) return &f->v[i];
    return NULL;
}

int tsr_epoch_parse(const char *s, uint64_t *epoch, tsr_error *err) {
    if (tsr_parse_u64(s, epoch) || *epoch == 0)
        return tsr_err(err, TSR_EINVAL, "%s=%s: not an epoch (a decimal number from 1)", TSR_EPOCH_ENV, s);
    return 0;
}
