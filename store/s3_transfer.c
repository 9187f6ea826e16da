/* s3_transfer.c: multipart uploads (create, parts, complete, abort, resume),
 * the file transfers (tsr_s3_upload_file, tsr_s3_download_file) and the
 * streaming writer. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "common.h"
#include "pool.h"
#include "s3.h"
#include "s3_impl.h"

/* ------------------------------------------------------------ multipart */

typedef struct part {
    uint64_t off, len;
    char checksum[48], payload[65]; /* its SHA-256, base64 and hex (s3_impl.h) */
    char etag[80];
    int have; /* already uploaded (resume) */
} part;

static int create_upload(tsr_s3 *s, const char *bucket, const char *key, const char *content_hash, char *upload_id,
                         size_t idlen, tsr_error *err) {
    req r;
    s3_req_init(&r, "POST", bucket, key);
    snprintf(r.query, sizeof r.query, "uploads=");
    snprintf(r.extra[0], sizeof r.extra[0], "x-amz-checksum-algorithm: SHA256");
    r.content_type = "application/octet-stream"; /* the object's, as a PUT's */
    if (content_hash && *content_hash)
        snprintf(r.extra[1], sizeof r.extra[1], "x-amz-meta-tessera-xxh3: %s", content_hash);
    r.what = "(CreateMultipartUpload)";
    r.resp_max = MAX_XML;
    int rc = s3_run1(s, &r, err);
    upload_id[0] = 0;
    if (!rc) tsr_s3_xml_upload_id(r.resp.p, r.resp.n, upload_id, idlen);
    free(r.resp.p);
    if (!rc && !upload_id[0])
        rc = tsr_err(err, TSR_EIO, "s3://%s/%s: CreateMultipartUpload: no UploadId in the answer", bucket, key);
    return rc;
}

static void abort_upload(tsr_s3 *s, const char *bucket, const char *key, const char *upload_id) {
    req r;
    s3_req_init(&r, "DELETE", bucket, key);
    tsr_sbuf q = {0};
    s3_query_add(&q, "uploadId", upload_id);
    if (!s3_set_query(&r, &q, NULL)) {
        r.what = "(AbortMultipartUpload)";
        tsr_error e;
        if (s3_run1(s, &r, &e)) tsr_log(1, "%s", e.msg);
    }
    free(r.resp.p);
}

/* Uploads parts[i] for i < n that are not `have`, from memory (bufs[i]) or from
 * fd at parts[i].off, as parts first+i of upload_id. Records their ETags. */
static int upload_parts(tsr_s3 *s, const char *bucket, const char *key, const char *upload_id, part *parts,
                        size_t n, size_t first, uint8_t *const *bufs, int fd, tsr_s3_transfer *t, tsr_error *err) {
    req *rs = calloc(n ? n : 1, sizeof *rs);
    req **rp = calloc(n ? n : 1, sizeof *rp);
    char (*what)[32] = calloc(n ? n : 1, 32);
    if (!rs || !rp || !what) {
        free(rs), free(rp), free(what);
        return tsr_err(err, TSR_ENOMEM, "out of memory");
    }
    size_t m = 0;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        if (parts[i].have) continue;
        req *r = &rs[i];
        s3_req_init(r, "PUT", bucket, key);
        tsr_sbuf q = {0};
        char num[16];
        snprintf(num, sizeof num, "%zu", first + i + 1);
        s3_query_add(&q, "partNumber", num);
        s3_query_add(&q, "uploadId", upload_id);
        rc = s3_set_query(r, &q, err);
        if (bufs) r->body = bufs[i];
        else r->body_fd = fd, r->body_off = parts[i].off;
        r->body_len = parts[i].len;
        snprintf(r->checksum, sizeof r->checksum, "%s", parts[i].checksum);
        snprintf(r->payload, sizeof r->payload, "%s", parts[i].payload);
        snprintf(what[i], 32, "part %zu", first + i + 1);
        r->what = what[i];
        rp[m++] = r;
    }
    if (!rc) rc = s3_run(s, rp, m, s->parallel, t, err);
    for (size_t i = 0; i < n; i++) {
        if (!rc && !parts[i].have) {
            snprintf(parts[i].etag, sizeof parts[i].etag, "%s", rs[i].etag);
            if (t) t->parts_sent++;
        }
        free(rs[i].resp.p);
    }
    free(rs), free(rp), free(what);
    return rc;
}

/* 1 when the upload `upload_id` is gone (ListParts: NoSuchUpload): completed or
 * aborted; nobody but its writer completes it. */
static int upload_gone(tsr_s3 *s, const char *bucket, const char *key, const char *upload_id) {
    req r;
    s3_req_init(&r, "GET", bucket, key);
    r.resp_max = MAX_XML;
    r.what = "(ListParts)";
    tsr_sbuf q = {0};
    s3_query_add(&q, "uploadId", upload_id);
    int rc = s3_set_query(&r, &q, NULL);
    if (!rc) rc = s3_run1(s, &r, NULL);
    free(r.resp.p);
    return rc == TSR_ENOTFOUND;
}

/* new_only: with If-None-Match: *, so that an object put meanwhile is never
 * replaced (TSR_EBUSY; a retry that finds its own upload completed succeeds). */
static int complete_upload(tsr_s3 *s, const char *bucket, const char *key, const char *upload_id, const part *parts,
                           size_t n, int new_only, tsr_error *err) {
    tsr_sbuf b = {0};
    tsr_sb_printf(&b, "<CompleteMultipartUpload xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">");
    for (size_t i = 0; i < n; i++) {
        if (!parts[i].etag[0]) {
            free(b.p);
            return tsr_err(err, TSR_EIO, "s3://%s/%s: part %zu has no ETag", bucket, key, i + 1);
        }
        /* an ETag holds no '<' or '&' (it is a quoted hex digest) */
        tsr_sb_printf(&b, "<Part><ETag>%s</ETag><PartNumber>%zu</PartNumber><ChecksumSHA256>%s</ChecksumSHA256></Part>",
                      parts[i].etag, i + 1, parts[i].checksum);
    }
    tsr_sb_printf(&b, "</CompleteMultipartUpload>");
    if (b.oom) {
        free(b.p);
        return tsr_err(err, TSR_ENOMEM, "out of memory");
    }
    req r;
    s3_req_init(&r, "POST", bucket, key);
    tsr_sbuf q = {0};
    s3_query_add(&q, "uploadId", upload_id);
    int rc = s3_set_query(&r, &q, err);
    r.body = (const uint8_t *)b.p;
    r.body_len = b.n;
    r.what = "(CompleteMultipartUpload)";
    r.resp_max = MAX_XML;
    if (new_only) snprintf(r.extra[0], sizeof r.extra[0], "If-None-Match: *");
    if (!rc) rc = s3_run1(s, &r, err); /* an <Error> in a 200 answer is a failure too (judge) */
    if (rc && new_only && r.status == 412) {
        if (r.attempts > 1 && upload_gone(s, bucket, key, upload_id)) { /* this completion's own object */
            free(r.resp.p);
            free(b.p);
            return 0;
        }
        rc = tsr_err(err, TSR_EBUSY, "s3://%s/%s: exists: another writer put it first (HTTP 412)", bucket, key);
    }
    if (!rc && !tsr_s3_xml_complete_ok(r.resp.p, r.resp.n))
        rc = tsr_err(err, TSR_EIO, "s3://%s/%s: CompleteMultipartUpload: unexpected answer", bucket, key);
    free(r.resp.p);
    free(b.p);
    return rc;
}

/* 1 when the part [off, off + len) of fd has the MD5 `etag` (quoted hex, as S3
 * gives for a part sent without server-side encryption). */
static int part_md5_matches(int fd, uint64_t off, uint64_t len, const char *etag) {
    enum { CHUNK = 1 << 20 };
    uint8_t *buf = malloc(CHUNK);
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    int ok = buf && md && EVP_DigestInit_ex(md, EVP_md5(), NULL);
    for (uint64_t o = 0; ok && o < len;) {
        size_t want = len - o < CHUNK ? (size_t)(len - o) : CHUNK;
        ssize_t g = pread(fd, buf, want, (off_t)(off + o));
        ok = g > 0 && EVP_DigestUpdate(md, buf, (size_t)g);
        o += g > 0 ? (uint64_t)g : 0;
    }
    unsigned char d[16];
    char hex[40];
    ok = ok && EVP_DigestFinal_ex(md, d, NULL);
    for (int i = 0; ok && i < 16; i++) snprintf(hex + 2 * i, 3, "%02x", d[i]);
    const char *e = etag[0] == '"' ? etag + 1 : etag;
    ok = ok && strncmp(e, hex, 32) == 0 && (e[32] == '"' || e[32] == 0);
    free(buf);
    EVP_MD_CTX_free(md);
    return ok;
}

/* What find_resumable compares the listed parts against. */
typedef struct resume_ctx {
    part *parts;
    size_t n;
    int fd;
    tsr_s3_transfer *t;
} resume_ctx;

static void resume_part(void *user, unsigned long k, uint64_t size, const char *etag, const char *ck) {
    resume_ctx *rs = user;
    if (k < 1 || k > rs->n) return;
    part *pt = &rs->parts[k - 1];
    int same = size == pt->len && etag[0] &&
               (ck[0] ? !strcmp(ck, pt->checksum) : part_md5_matches(rs->fd, pt->off, pt->len, etag));
    if (same) {
        pt->have = 1;
        snprintf(pt->etag, sizeof pt->etag, "%s", etag);
        if (rs->t) rs->t->parts_resumed++;
    }
}

/* The newest unfinished upload of exactly `key`, and its parts: have[i] set for
 * part i+1 when it is listed with the expected size and checksum (its SHA-256,
 * or, where the server does not list that, its ETag as the part's MD5). */
static int find_resumable(tsr_s3 *s, const char *bucket, const char *key, int fd, part *parts, size_t n,
                          char *upload_id, size_t idlen, tsr_s3_transfer *t, tsr_error *err) {
    upload_id[0] = 0;
    req r;
    s3_req_init(&r, "GET", bucket, "");
    r.resp_max = MAX_XML;
    tsr_sbuf q = {0};
    s3_query_add(&q, "prefix", key);
    s3_query_add(&q, "uploads", NULL);
    int rc = s3_set_query(&r, &q, err);
    if (!rc) rc = s3_run1(s, &r, err);
    if (!rc) tsr_s3_xml_newest_upload(r.resp.p, r.resp.n, key, upload_id, idlen);
    free(r.resp.p);
    if (rc) return rc;
    if (!upload_id[0]) return 0;
    resume_ctx rs = {parts, n, fd, t};
    char marker[32] = "";
    for (;;) {
        s3_req_init(&r, "GET", bucket, key);
        r.resp_max = MAX_XML;
        r.what = "(ListParts)";
        if (marker[0]) s3_query_add(&q, "part-number-marker", marker);
        s3_query_add(&q, "uploadId", upload_id);
        if ((rc = s3_set_query(&r, &q, err))) break;
        rc = s3_run1(s, &r, err);
        if (rc == TSR_ENOTFOUND) { /* finished or aborted meanwhile */
            free(r.resp.p);
            upload_id[0] = 0;
            return 0;
        }
        int more = rc ? 0 : tsr_s3_xml_list_parts(r.resp.p, r.resp.n, resume_part, &rs, marker, sizeof marker);
        free(r.resp.p);
        if (rc || !more) break;
    }
    return rc;
}

/* A batch of parts read and hashed on the pool's threads, one part a thread. */
typedef struct {
    int fd;
    const char *path;
    part *parts;
    uint8_t **bufs;
    int *rc;
    tsr_error *errs;
} hash_batch;

static void hash_part(void *ctx, size_t k, int worker) {
    hash_batch *h = ctx;
    part *p = &h->parts[k];
    if ((h->rc[k] = tsr_pread_all(h->fd, h->path, h->bufs[k], (size_t)p->len, p->off, &h->errs[k]))) return;
    unsigned char d[32];
    EVP_Digest(h->bufs[k], (size_t)p->len, d, NULL, EVP_sha256(), NULL);
    s3_body_sha256(d, p->checksum, p->payload);
}

/* Hashes a file to upload: XXH3 of the whole (the content hash) and the SHA-256 of
 * each part. The parts' SHA-256 (the costly one) is spread over the cores, a batch
 * of whole parts at a time, each batch fed to XXH3 in order from memory; parts too
 * large to hold a batch of go in one pass on one thread. */
static int hash_file(int fd, const char *path, uint64_t size, part *parts, size_t n, char hex[40], tsr_error *err) {
    enum { CHUNK = 8 << 20, MAX_THREADS = 8, BATCH_BYTES = 256 << 20 };
    XXH3_state_t *x = XXH3_createState();
    if (!x) return tsr_err(err, TSR_ENOMEM, "out of memory");
    XXH3_64bits_reset(x);
    uint64_t psz = n ? parts[0].len : 0;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    size_t threads = n > 1 && psz && psz <= BATCH_BYTES / 2 ? (size_t)(BATCH_BYTES / psz) : 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads > (size_t)(cpus > 0 ? cpus : 1)) threads = (size_t)(cpus > 0 ? cpus : 1);
    if (threads > n) threads = n;
    uint8_t *bufs[MAX_THREADS] = {0};
    int rcs[MAX_THREADS];
    tsr_error errs[MAX_THREADS];
    tsr_pool *pool = threads > 1 ? tsr_pool_new((int)threads) : NULL;
    for (size_t k = 0; pool && k < threads; k++)
        if (!(bufs[k] = malloc((size_t)psz))) threads = k; /* fewer threads, or one pass */
    int rc = 0;
    if (pool && threads > 1) {
        for (size_t b = 0; b < n && !rc; b += threads) {
            size_t m = n - b < threads ? n - b : threads;
            hash_batch h = {fd, path, parts + b, bufs, rcs, errs};
            tsr_pool_for(pool, m, hash_part, &h);
            for (size_t k = 0; k < m && !rc; k++) {
                if ((rc = rcs[k]) && err) *err = errs[k];
                else XXH3_64bits_update(x, bufs[k], (size_t)parts[b + k].len);
            }
        }
    } else {
        EVP_MD_CTX *md = EVP_MD_CTX_new();
        uint8_t *buf = malloc(CHUNK);
        if (!buf || !md) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
        for (size_t i = 0; i < n && !rc; i++) {
            EVP_DigestInit_ex(md, EVP_sha256(), NULL);
            for (uint64_t o = 0; o < parts[i].len && !rc; o += CHUNK) {
                size_t want = parts[i].len - o < CHUNK ? (size_t)(parts[i].len - o) : CHUNK;
                if ((rc = tsr_pread_all(fd, path, buf, want, parts[i].off + o, err))) break;
                EVP_DigestUpdate(md, buf, want);
                XXH3_64bits_update(x, buf, want);
            }
            unsigned char d[32];
            if (!rc && EVP_DigestFinal_ex(md, d, NULL)) s3_body_sha256(d, parts[i].checksum, parts[i].payload);
        }
        free(buf);
        EVP_MD_CTX_free(md);
    }
    if (!rc) s3_content_hash_hex(size ? XXH3_64bits_digest(x) : tsr_hash("", 0), hex);
    for (size_t k = 0; k < MAX_THREADS; k++) free(bufs[k]);
    tsr_pool_free(pool);
    XXH3_freeState(x);
    return rc;
}

/* The part size for an object of `size` bytes: the client's, grown so that at
 * most MAX_PARTS parts are needed. */
static uint64_t part_size_for(const tsr_s3 *s, uint64_t size) {
    uint64_t p = s->part_size;
    while (size / p >= MAX_PARTS) p *= 2;
    return p;
}

int tsr_s3_upload_file(tsr_s3 *s, const char *path, const char *bucket, const char *key, tsr_s3_transfer *t,
                       tsr_error *err) {
    uint64_t size;
    int fd = tsr_open_regular(path, &size, err);
    if (fd < 0) return fd;
    uint64_t psz = part_size_for(s, size);
    size_t n = size <= psz ? 1 : (size_t)((size + psz - 1) / psz);
    part *parts = calloc(n, sizeof *parts);
    if (!parts) {
        close(fd);
        return tsr_err(err, TSR_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        parts[i].off = (uint64_t)i * psz;
        parts[i].len = i + 1 < n ? psz : size - parts[i].off;
    }
    char hex[40];
    int rc = hash_file(fd, path, size, parts, n, hex, err);
    tsr_s3_object have;
    int hr = rc ? rc : tsr_s3_head(s, bucket, key, &have, err);
    if (!rc && hr == 0 && have.size == size && !strcmp(have.content_hash, hex)) {
        if (t) t->skipped = 1;
        if (t && t->progress) t->progress(t->user, size);
        goto out;
    }
    if (!rc && hr != 0 && hr != TSR_ENOTFOUND) rc = hr;
    if (rc) goto out;
    if (n == 1) { /* one PUT, streamed from the file */
        req r;
        s3_req_init(&r, "PUT", bucket, key);
        r.body_fd = fd;
        r.body_len = size;
        snprintf(r.checksum, sizeof r.checksum, "%s", parts[0].checksum);
        snprintf(r.payload, sizeof r.payload, "%s", parts[0].payload);
        r.content_type = "application/octet-stream";
        snprintf(r.extra[0], sizeof r.extra[0], "x-amz-meta-tessera-xxh3: %s", hex);
        rc = s3_run(s, (req *[]){&r}, 1, 1, t, err);
        free(r.resp.p);
        if (!rc && t) t->parts_sent++;
        goto out;
    }
    for (int fresh = 0; fresh < 2; fresh++) {
        char upload_id[512];
        if (!fresh) rc = find_resumable(s, bucket, key, fd, parts, n, upload_id, sizeof upload_id, t, err);
        else upload_id[0] = 0;
        if (!rc && !upload_id[0]) {
            for (size_t i = 0; i < n; i++) parts[i].have = 0, parts[i].etag[0] = 0;
            rc = create_upload(s, bucket, key, hex, upload_id, sizeof upload_id, err);
        }
        if (rc) break;
        if (t && t->progress)
            for (size_t i = 0; i < n; i++)
                if (parts[i].have) t->progress(t->user, parts[i].len);
        rc = upload_parts(s, bucket, key, upload_id, parts, n, 0, NULL, fd, t, err);
        if (!rc) rc = complete_upload(s, bucket, key, upload_id, parts, n, 0, err);
        if (rc) {
            abort_upload(s, bucket, key, upload_id);
            break;
        }
        /* a resumed upload was started for this content (its hash is the object's
         * metadata, set when it was created): check; else start afresh once */
        rc = tsr_s3_head(s, bucket, key, &have, err);
        if (rc || (have.size == size && !strcmp(have.content_hash, hex))) break;
        if (fresh) rc = tsr_err(err, TSR_EIO, "s3://%s/%s: the uploaded object does not match %s", bucket, key, path);
    }
out:
    free(parts);
    close(fd);
    return rc;
}

/* The pull's writer thread: it hashes each window of downloaded ranges in order
 * and writes it (O_DIRECT where the file system takes it: no page cache to fill
 * and reclaim), while the next window downloads into the other set of buffers. */
enum { DL_ALIGN = 4096, DL_BUFFERS = 128 << 20 };
typedef struct {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int fd, direct;
    const char *path;
    XXH3_state_t *x;
    uint8_t **bufs; /* the window handed over */
    size_t n, *lens;
    uint64_t off;   /* the file offset of its first range */
    int full, stop, rc;
    tsr_error err;
} dl_writer;

static void *dl_write(void *arg) {
    dl_writer *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->full && !w->stop) pthread_cond_wait(&w->cv, &w->mu);
        if (!w->full) break;
        pthread_mutex_unlock(&w->mu);
        int rc = 0;
        uint64_t off = w->off;
        for (size_t k = 0; k < w->n && !rc; k++) {
            size_t len = w->lens[k], padded = len;
            XXH3_64bits_update(w->x, w->bufs[k], len);
            if (w->direct && len % DL_ALIGN) { /* the file's tail: cut back to size at the end */
                padded = (len + DL_ALIGN - 1) / DL_ALIGN * DL_ALIGN;
                memset(w->bufs[k] + len, 0, padded - len);
            }
            rc = tsr_pwrite_all(w->fd, w->path, w->bufs[k], padded, off, &w->err);
            off += len;
        }
        pthread_mutex_lock(&w->mu);
        if (rc && !w->rc) w->rc = rc;
        w->full = 0;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* Waits until the writer has taken in its window; hands it the next when bufs. */
static int dl_hand(dl_writer *w, uint8_t **bufs, size_t n, size_t *lens, uint64_t off, tsr_error *err) {
    pthread_mutex_lock(&w->mu);
    while (w->full) pthread_cond_wait(&w->cv, &w->mu);
    int rc = w->rc;
    if (!rc && bufs) {
        w->bufs = bufs, w->n = n, w->lens = lens, w->off = off, w->full = 1;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    if (rc && err) *err = w->err;
    return rc;
}

int tsr_s3_download_file(tsr_s3 *s, const char *bucket, const char *key, const char *path, tsr_s3_transfer *t,
                         tsr_error *err) {
    tsr_s3_object o;
    int rc = tsr_s3_head(s, bucket, key, &o, err);
    if (rc) return rc;
    char tmp[PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.part", path);
    uint64_t psz = part_size_for(s, o.size);
    size_t n = o.size ? (size_t)((o.size + psz - 1) / psz) : 0;
    /* ranges a window: as many as run at once, two windows of buffers within DL_BUFFERS */
    size_t win = (size_t)s->parallel, cap = (size_t)((psz + DL_ALIGN - 1) / DL_ALIGN * DL_ALIGN);
    if (win * 2 * cap > DL_BUFFERS) win = DL_BUFFERS / (2 * cap) ? DL_BUFFERS / (2 * cap) : 1;
    if (win > n) win = n ? n : 1;
    int direct = psz % DL_ALIGN == 0;
    int fd = direct ? open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0644) : -1;
    if (fd < 0) direct = 0, fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return tsr_err(err, TSR_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    dl_writer w = {.fd = fd, .direct = direct, .path = tmp, .x = XXH3_createState()};
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    uint8_t **bufs = calloc(2 * win, sizeof *bufs);
    size_t *lens = calloc(2 * win, sizeof *lens);
    req *rs = calloc(win, sizeof *rs);
    req **rp = calloc(win, sizeof *rp);
    int started = 0;
    if (!w.x || !bufs || !lens || !rs || !rp) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    for (size_t k = 0; !rc && k < 2 * win && n; k++)
        if (posix_memalign((void **)&bufs[k], DL_ALIGN, cap)) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    if (!rc) XXH3_64bits_reset(w.x);
    if (!rc && n && pthread_create(&w.th, NULL, dl_write, &w) != 0)
        rc = tsr_err(err, TSR_EIO, "%s: cannot start the writer thread", tmp);
    else if (!rc && n) started = 1;
    for (size_t b = 0, set = 0; !rc && b < n; b += win, set ^= 1) {
        size_t m = n - b < win ? n - b : win;
        for (size_t k = 0; k < m; k++) {
            uint64_t off = (uint64_t)(b + k) * psz, len = b + k + 1 < n ? psz : o.size - off;
            req *r = &rs[k];
            s3_req_init(r, "GET", bucket, key);
            snprintf(r->extra[0], sizeof r->extra[0], "Range: bytes=%llu-%llu", (unsigned long long)off,
                     (unsigned long long)(off + len - 1));
            r->out = bufs[set * win + k];
            r->out_cap = (size_t)len;
            lens[set * win + k] = (size_t)len;
            rp[k] = r;
        }
        rc = s3_run(s, rp, m, s->parallel, t, err);
        for (size_t k = 0; k < m; k++) {
            if (!rc && rs[k].got != lens[set * win + k])
                rc = tsr_err(err, TSR_EIO, "s3://%s/%s: range %zu: %zu bytes received", bucket, key, b + k, rs[k].got);
            free(rs[k].resp.p);
        }
        if (!rc) rc = dl_hand(&w, bufs + set * win, m, lens + set * win, (uint64_t)b * psz, err);
    }
    if (started) {
        int wrc = dl_hand(&w, NULL, 0, NULL, 0, rc ? NULL : err);
        if (!rc) rc = wrc;
        pthread_mutex_lock(&w.mu);
        w.stop = 1;
        pthread_cond_broadcast(&w.cv);
        pthread_mutex_unlock(&w.mu);
        pthread_join(w.th, NULL);
    }
    for (size_t k = 0; bufs && k < 2 * win; k++) free(bufs[k]);
    free(bufs), free(lens), free(rs), free(rp);
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);
    /* the padding of an O_DIRECT tail cut off (and an empty object's file made) */
    if (!rc && ftruncate(fd, (off_t)o.size) != 0)
        rc = tsr_err(err, errno == ENOSPC ? TSR_ENOSPC : TSR_EIO, "%s: %s", tmp, strerror(errno));
    if (rc) goto fail;
    char hex[40];
    s3_content_hash_hex(o.size ? XXH3_64bits_digest(w.x) : tsr_hash("", 0), hex);
    XXH3_freeState(w.x);
    w.x = NULL;
    if (o.content_hash[0]) {
        if (strcmp(hex, o.content_hash) != 0) {
            rc = tsr_err(err, TSR_ECORRUPT, "s3://%s/%s: downloaded bytes hash to %s, the object says %s", bucket, key,
                         hex, o.content_hash);
            goto fail;
        }
    }
    /* writeback (of what O_DIRECT did not write) starts now, while the next file
     * downloads; the caller fsyncs */
    if (sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE) != 0 && errno != ENOSYS && errno != EINVAL) {
        rc = tsr_err(err, TSR_EIO, "%s: %s", tmp, strerror(errno));
        goto fail;
    }
    if (close(fd) != 0) {
        fd = -1;
        rc = tsr_err(err, TSR_EIO, "%s: %s", tmp, strerror(errno));
        goto fail;
    }
    fd = -1;
    if (rename(tmp, path) != 0) {
        rc = tsr_err(err, TSR_EIO, "%s: rename to %s: %s", tmp, path, strerror(errno));
        goto fail;
    }
    return 0;
fail:
    if (w.x) XXH3_freeState(w.x);
    if (fd >= 0) close(fd);
    unlink(tmp);
    return rc;
}

/* --------------------------------------------------------------- writer */

struct tsr_s3_writer {
    tsr_s3 *s;
    char bucket[TSR_S3_MAX_BUCKET], key[TSR_S3_MAX_KEY];
    char upload_id[512];
    uint64_t size, psz;
    int nbuf, cur;      /* part buffers, the one being filled */
    uint8_t **bufs;
    size_t *fill;
    part *parts;        /* every part sent so far */
    size_t n_parts, cap_parts;
    int new_only;       /* the object must not exist: never replace one put meanwhile */
};

tsr_s3_writer *tsr_s3_writer_new(tsr_s3 *s, const char *bucket, const char *key, int new_only, tsr_error *err) {
    tsr_s3_writer *w = calloc(1, sizeof *w);
    if (!w) goto nomem;
    w->s = s;
    w->new_only = new_only;
    snprintf(w->bucket, sizeof w->bucket, "%s", bucket);
    snprintf(w->key, sizeof w->key, "%s", key);
    w->psz = s->part_size;
    w->nbuf = s->parallel < 4 ? s->parallel : 4;
    w->bufs = calloc((size_t)w->nbuf, sizeof *w->bufs);
    w->fill = calloc((size_t)w->nbuf, sizeof *w->fill);
    if (!w->bufs || !w->fill) goto nomem;
    return w;
nomem:
    if (w) free(w->bufs), free(w->fill), free(w);
    tsr_err(err, TSR_ENOMEM, "out of memory");
    return NULL;
}

uint64_t tsr_s3_writer_size(const tsr_s3_writer *w) { return w->size; }

/* Sends the filled buffers 0..k-1 as the next parts. */
static int writer_flush(tsr_s3_writer *w, int k, tsr_error *err) {
    if (k == 0) return 0;
    if (!w->upload_id[0] && create_upload(w->s, w->bucket, w->key, NULL, w->upload_id, sizeof w->upload_id, err))
        return err ? err->code : TSR_EIO;
    size_t first = w->n_parts;
    for (int i = 0; i < k; i++) {
        if (tsr_grow((void **)&w->parts, &w->cap_parts, w->n_parts, sizeof *w->parts))
            return tsr_err(err, TSR_ENOMEM, "out of memory");
        part *p = &w->parts[w->n_parts++];
        memset(p, 0, sizeof *p);
        p->len = w->fill[i];
        unsigned char md[32];
        EVP_Digest(w->bufs[i], w->fill[i], md, NULL, EVP_sha256(), NULL);
        s3_body_sha256(md, p->checksum, p->payload);
    }
    int rc = upload_parts(w->s, w->bucket, w->key, w->upload_id, w->parts + first, (size_t)k, first, w->bufs, -1,
                          NULL, err);
    for (int i = 0; i < k; i++) w->fill[i] = 0;
    w->cur = 0;
    return rc;
}

int tsr_s3_writer_append(tsr_s3_writer *w, const void *buf, size_t len, tsr_error *err) {
    const uint8_t *p = buf;
    while (len) {
        if (!w->bufs[w->cur] && !(w->bufs[w->cur] = malloc(w->psz))) return tsr_err(err, TSR_ENOMEM, "out of memory");
        size_t room = (size_t)(w->psz - w->fill[w->cur]), n = len < room ? len : room;
        memcpy(w->bufs[w->cur] + w->fill[w->cur], p, n);
        w->fill[w->cur] += n;
        w->size += n;
        p += n, len -= n;
        if (w->fill[w->cur] == w->psz) {
            /* keep the last full buffer back: the object may end there, and an
             * object of one part is sent with one PUT */
            if (w->cur + 1 < w->nbuf) {
                w->cur++;
            } else {
                int rc = writer_flush(w, w->nbuf, err);
                if (rc) return rc;
            }
        }
    }
    return 0;
}

static void writer_free(tsr_s3_writer *w) {
    for (int i = 0; i < w->nbuf; i++) free(w->bufs[i]);
    free(w->bufs), free(w->fill), free(w->parts), free(w);
}

int tsr_s3_writer_finish(tsr_s3_writer *w, tsr_error *err) {
    int rc = 0;
    int k = w->cur + (w->fill[w->cur] > 0);
    if (!w->upload_id[0] && k <= 1) {
        rc = (w->new_only ? tsr_s3_put_new : tsr_s3_put)(w->s, w->bucket, w->key,
                                                         w->bufs[0] ? w->bufs[0] : (const uint8_t *)"", w->fill[0], err);
    } else {
        rc = writer_flush(w, k, err);
        if (!rc) rc = complete_upload(w->s, w->bucket, w->key, w->upload_id, w->parts, w->n_parts, w->new_only, err);
        if (rc && w->upload_id[0]) abort_upload(w->s, w->bucket, w->key, w->upload_id);
    }
    writer_free(w);
    return rc;
}

void tsr_s3_writer_abort(tsr_s3_writer *w) {
    if (!w) return;
    if (w->upload_id[0]) abort_upload(w->s, w->bucket, w->key, w->upload_id);
    writer_free(w);
}
