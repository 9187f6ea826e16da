/* archive.c: copies of committed checkpoints between a local directory and an
 * S3 location (archive.h): the data files first, the MANIFEST last, so that a
 * copy cut short is never a committed checkpoint on the other side. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "archive.h"
#include "common.h"
#include "manifest.h"

/* The data file names of the checkpoint in dir (local or remote), from its
 * MANIFEST, and their total size. */
static int data_files(const char *dir, char (**names)[32], size_t *n, uint64_t *bytes, tsr_error *err) {
    tsr_ckpt *ck = tsr_ckpt_open(dir, err);
    if (!ck) return err ? err->code : TSR_ECORRUPT;
    *n = tsr_ckpt_n_files(ck);
    *bytes = 0;
    *names = calloc(*n ? *n : 1, sizeof **names);
    if (!*names) {
        tsr_ckpt_close(ck);
        return tsr_err(err, TSR_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < *n; i++) {
        tsr_file_info f;
        tsr_ckpt_file(ck, i, &f);
        tsr_data_file_name(f.file_id, (*names)[i], sizeof **names);
        *bytes += f.size;
    }
    tsr_ckpt_close(ck);
    return 0;
}

int tsr_archive_push_step(tsr_s3 *s3, const char *step_dir, const char *dst, tsr_s3_transfer *t, tsr_error *err) {
    char bucket[TSR_S3_MAX_BUCKET], prefix[TSR_S3_MAX_KEY];
    int rc = tsr_s3_split(dst, bucket, sizeof bucket, prefix, sizeof prefix, err);
    if (rc) return rc;
    size_t pl = strlen(prefix);
    if (pl && prefix[pl - 1] == '/') prefix[--pl] = 0;
    if (!tsr_ckpt_is_committed(step_dir))
        return tsr_err(err, TSR_ENOTFOUND, "%s: no MANIFEST (not a committed checkpoint)", step_dir);
    char (*names)[32] = NULL;
    size_t n = 0;
    uint64_t bytes = 0;
    if ((rc = data_files(step_dir, &names, &n, &bytes, err))) return rc;
    for (size_t i = 0; i <= n && !rc; i++) {
        const char *name = i < n ? names[i] : "MANIFEST"; /* the MANIFEST last */
        char path[PATH_MAX + 40], key[TSR_S3_MAX_KEY + 40];
        snprintf(path, sizeof path, "%s/%s", step_dir, name);
        snprintf(key, sizeof key, "%s%s%s", prefix, pl ? "/" : "", name);
        if (strlen(key) >= TSR_S3_MAX_KEY) rc = tsr_err(err, TSR_EINVAL, "s3://%s/%s: key too long", bucket, key);
        else rc = tsr_s3_upload_file(s3, path, bucket, key, t, err);
    }
    free(names);
    return rc;
}

int tsr_archive_pull_step(tsr_s3 *s3, const char *src, const char *dir, tsr_s3_transfer *t, tsr_error *err) {
    char bucket[TSR_S3_MAX_BUCKET], prefix[TSR_S3_MAX_KEY];
    int rc = tsr_s3_split(src, bucket, sizeof bucket, prefix, sizeof prefix, err);
    if (rc) return rc;
    size_t pl = strlen(prefix);
    if (pl && prefix[pl - 1] == '/') prefix[--pl] = 0;
    char (*names)[32] = NULL;
    size_t n = 0;
    uint64_t bytes = 0;
    if ((rc = data_files(src, &names, &n, &bytes, err))) return rc;
    int e = tsr_mkdir_p(dir);
    if (e) rc = tsr_err(err, e == ENOSPC ? TSR_ENOSPC : TSR_EIO, "%s: cannot create directory: %s", dir, strerror(e));
    char manifest[PATH_MAX + 40];
    snprintf(manifest, sizeof manifest, "%s/MANIFEST", dir);
    if (!rc && access(manifest, F_OK) == 0)
        rc = tsr_err(err, TSR_EINVAL, "%s: already holds a committed checkpoint", dir);
    for (size_t i = 0; i <= n && !rc; i++) {
        const char *name = i < n ? names[i] : "MANIFEST";
        char path[PATH_MAX + 40], key[TSR_S3_MAX_KEY + 40];
        snprintf(path, sizeof path, "%s/%s", dir, name);
        snprintf(key, sizeof key, "%s%s%s", prefix, pl ? "/" : "", name);
        rc = tsr_s3_download_file(s3, bucket, key, path, t, err);
    }
    free(names);
    int fd = rc ? -1 : open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) { /* the renames survive a crash */
        if (fsync(fd) != 0) rc = tsr_err(err, TSR_EIO, "%s: fsync: %s", dir, strerror(errno));
        close(fd);
    }
    return rc;
}
