/* export_files.c: what the safetensors and GGUF exports share: staging of
 * their files, the error of a failed write, GPT-2's byte alphabet. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "casts.h"
#include "common.h"
#include "export_impl.h"

/* GPT-2's bytes_to_unicode: the character that stands for byte b in a byte-level
 * BPE vocabulary (printable Latin-1 bytes stand for themselves, the others for
 * U+0100 onwards), as a code point, or written as UTF-8 into out (at most 2
 * bytes and a NUL). */
int tsr_gpt2_byte_codepoint(int b) {
    int cp = b;
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)) {
        cp = 256;
        for (int x = 0; x < b; x++) cp += !((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174);
    }
    return cp;
}
void tsr_gpt2_byte_char(int b, char out[3]) {
    int cp = tsr_gpt2_byte_codepoint(b), n = 0;
    if (cp < 0x80) out[n++] = (char)cp;
    else out[n++] = (char)(0xC0 | cp >> 6), out[n++] = (char)(0x80 | (cp & 0x3F));
    out[n] = 0;
}

/* An export's files are written into a staging directory DEST/.tessera-tmp-PID
 * (next to their final names, on the same filesystem) and renamed into DEST only
 * when every one is complete: each file is fsynced, then renamed (config.json
 * last), then DEST is fsynced. A failed export removes the staging directory; a
 * killed one leaves only it: never a file under a final name. */

/* An error for a failed write: a full disk says so. */
int tsr_export_out_error(tsr_error *e, const char *path, const char *what, int err) {
    return tsr_err(e, err == ENOSPC || err == EDQUOT ? TSR_ENOSPC : TSR_EIO, "%s: cannot %s: %s", path, what,
                   strerror(err ? err : EIO));
}

static int fsync_path(const char *path, int dir, tsr_error *e) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | (dir ? O_DIRECTORY : O_NONBLOCK));
    if (fd < 0) return tsr_export_out_error(e, path, "open", errno);
    int rc = fsync(fd) ? tsr_export_out_error(e, path, "fsync", errno) : 0;
    close(fd);
    return rc;
}

/* tsr_export_stage_make(): creates DEST/.tessera-tmp-PID into stage. */
int tsr_export_stage_make(const char *dest, char *stage, size_t len, tsr_error *e) {
    if (snprintf(stage, len, "%s/.tessera-tmp-%ld", dest, (long)getpid()) >= (int)len)
        return tsr_err(e, TSR_EINVAL, "%s: path too long", dest);
    tsr_remove_tree(stage); /* a leftover of a killed export that had the same pid */
    if (mkdir(stage, 0755) != 0) return tsr_export_out_error(e, stage, "create", errno);
    return 0;
}

/* tsr_export_stage_commit(): syncs every file of the staging directory, renames each into
 * DEST (config.json last), syncs DEST and removes the staging directory. On
 * failure the files already renamed are removed too. */
int tsr_export_stage_commit(const char *stage, const char *dest, tsr_error *e) {
    char (*names)[256] = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    DIR *d = opendir(stage);
    if (!d) return tsr_export_out_error(e, stage, "open", errno);
    struct dirent *ent;
    while (!rc && (ent = readdir(d))) {
        if (!strcmp(ent->d_name, ".") || !strcmp(ent->d_name, "..")) continue;
        if (strlen(ent->d_name) >= sizeof *names) rc = tsr_err(e, TSR_EINVAL, "%s/%s: name too long", stage, ent->d_name);
        else if (tsr_grow((void **)&names, &cap, n, sizeof *names)) rc = tsr_err(e, TSR_ENOMEM, "out of memory");
        else snprintf(names[n++], sizeof *names, "%s", ent->d_name);
    }
    closedir(d);
    for (size_t i = 0; i + 1 < n; i++) /* config.json last: it tells readers that a model is there */
        if (!strcmp(names[i], "config.json")) {
            char t[256];
            memcpy(t, names[i], sizeof t), memcpy(names[i], names[n - 1], sizeof t), memcpy(names[n - 1], t, sizeof t);
        }
    char from[PATH_MAX + 300], to[PATH_MAX + 300];
    for (size_t i = 0; !rc && i < n; i++) {
        snprintf(from, sizeof from, "%s/%s", stage, names[i]);
        rc = fsync_path(from, 0, e);
    }
    size_t moved = 0;
    for (; !rc && moved < n; moved++) {
        snprintf(from, sizeof from, "%s/%s", stage, names[moved]);
        snprintf(to, sizeof to, "%s/%s", dest, names[moved]);
        if (rename(from, to) != 0) rc = tsr_export_out_error(e, to, "rename into place", errno);
    }
    if (!rc) rc = fsync_path(dest, 1, e);
    if (rc)
        for (size_t i = 0; i < moved; i++) {
            snprintf(to, sizeof to, "%s/%s", dest, names[i]);
            unlink(to);
        }
    free(names);
    tsr_remove_tree(stage);
    return rc;
}


/* ------------------------------------------------------ digests of an export */

/* The checkpoint's index of decl t's tensor, or a negative status. */
static long export_find(tsr_ckpt *ck, const tsr_tensor_decl *t, tsr_export_tensor *out, tsr_error *e) {
    tsr_tensor_info ti;
    long i = tsr_model_find(ck, t, &ti, e);
    if (i < 0) return i;
    *out = (tsr_export_tensor){ti.name, ti.dtype, 0, 0};
    out->has_digest = tsr_ckpt_tensor_digest(ck, (size_t)i, &out->digest) == 1;
    return i;
}

int tsr_export_find(tsr_ckpt *ck, const tsr_tensor_decl *t, tsr_export_tensor *out, tsr_error *e) {
    long i = export_find(ck, t, out, e);
    return i < 0 ? (int)i : 0;
}

int tsr_export_read(tsr_ckpt *ck, const tsr_tensor_decl *t, float *dst, tsr_export_tensor *out, tsr_error *e) {
    long i = export_find(ck, t, out, e);
    if (i < 0) return (int)i;
    const char *name = out->name;
    int dtype = out->dtype;
    tsr_box box = {t->ndim, {0}, {0}};
    memcpy(box.extent, t->shape, sizeof box.extent);
    uint64_t n = tsr_box_volume(&box);
    size_t es = tsr_dtype_size(dtype);
    /* the elements as stored: f32 straight into dst, others beside it */
    void *raw = dtype == TSR_F32 ? (void *)dst : malloc(n * es + 1);
    if (!raw) return tsr_err(e, TSR_ENOMEM, "out of memory for %s", name);
    int rc = tsr_ckpt_read(ck, (size_t)i, &box, raw, e);
    if (!rc && out->has_digest) {
        uint64_t got = tsr_digest_tensor(tsr_digest_key(name, dtype), es, raw, n);
        if (got != out->digest)
            rc = tsr_err(e, TSR_ECORRUPT,
                         "%s: tensor %s: the data read has digest %016llx, its MANIFEST records %016llx (the frames' "
                         "checksums hold: it is not the tensor that was saved); nothing exported",
                         tsr_ckpt_dir(ck), name, (unsigned long long)got, (unsigned long long)out->digest);
    }
    if (raw != dst) {
        for (uint64_t x = 0; !rc && x < n; x++) dst[x] = (float)tsr_load_f64(dtype, raw, x);
        free(raw);
    }
    return rc;
}

int tsr_export_digest_of(const char *name, int dtype, const void *data, uint64_t n, const tsr_export_tensor *src,
                         int keep, tsr_export_digest *out, tsr_error *e) {
    size_t es = tsr_dtype_size(dtype);
    uint64_t crc = tsr_digest_tensor(0, es, data, n); /* the digest is a key xor this */
    out->digest = tsr_digest_key(name, dtype) ^ crc;
    out->tied = keep && src->has_digest && src->dtype == dtype;
    if (!out->tied) return 0;
    uint64_t as_src = tsr_digest_key(src->name, src->dtype) ^ crc;
    if (as_src != src->digest)
        return tsr_err(e, TSR_ECORRUPT,
                       "%s (tensor %s): the bytes to export have digest %016llx under the source's name, its MANIFEST "
                       "records %016llx: the export changed values it keeps",
                       name, src->name, (unsigned long long)as_src, (unsigned long long)src->digest);
    return 0;
}

int tsr_export_hex(const char *s, uint64_t *v) {
    uint64_t x = 0;
    int k = 0;
    for (; k < 16; k++) {
        char c = s[k];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return -1;
        x = x << 4 | (uint64_t)d;
    }
    if (s[k]) return -1;
    *v = x;
    return 0;
}
