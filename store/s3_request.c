/* s3_request.c: the S3 client's one request runner, with its retry loop, and
 * the operations of one request each (head, get, put, delete) and the listing. */
#include <curl/curl.h>
#include <errno.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "s3.h"
#include "s3_impl.h"
#include "store.h"

enum { TSR_S3_IO_BUFFER = 1 << 20 };

/* AWS URI encoding: unreserved bytes kept, '/' kept when keep_slash, the rest %XX. */
static void uri_encode(tsr_sbuf *b, const char *s, int keep_slash) {
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        unsigned c = *p;
        if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
            c == '.' || c == '~' || (c == '/' && keep_slash))
            tsr_sb_printf(b, "%c", c);
        else
            tsr_sb_printf(b, "%%%02X", c);
    }
}

void s3_body_sha256(const unsigned char md[32], char b64[48], char hex[65]) {
    EVP_EncodeBlock((unsigned char *)b64, md, 32);
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
}

/* A per-thread splitmix64 for the backoff's jitter. */
static double jitter01(void) {
    static __thread uint64_t x;
    if (!x) x = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)&x;
    return (double)(tsr_splitmix_next(&x) >> 11) / 9007199254740992.0;
}

void s3_req_init(req *r, const char *method, const char *bucket, const char *key) {
    memset(r, 0, sizeof *r);
    r->method = method;
    r->bucket = bucket;
    r->key = key ? key : "";
    r->body_fd = -1;
    r->resp_max = MAX_ERR_BODY;
}

static void req_reset_answer(req *r) {
    r->status = 0;
    r->resp.n = r->got = r->sent = 0;
    r->resp.oom = 0;
    r->etag[0] = r->content_hash[0] = 0;
    r->overflow = 0;
}

static void resp_append(req *r, const char *p, size_t n) {
    if (r->resp.n + n > r->resp_max) {
        r->overflow = 1;
        n = r->resp_max > r->resp.n ? r->resp_max - r->resp.n : 0;
    }
    tsr_sb_put(&r->resp, p, n);
    if (r->resp.oom) r->overflow = 1;
}

static size_t write_cb(char *p, size_t size, size_t nmemb, void *u) {
    req *r = u;
    size_t n = size * nmemb;
    long st = 0;
    curl_easy_getinfo(r->h, CURLINFO_RESPONSE_CODE, &st);
    if (st >= 200 && st < 300 && r->out) {
        if (r->got + n > r->out_cap) {
            r->overflow = 1;
            return 0; /* more bytes than asked for */
        }
        memcpy(r->out + r->got, p, n);
        r->got += n;
        return n;
    }
    resp_append(r, p, n);
    return n;
}

static size_t read_cb(char *p, size_t size, size_t nmemb, void *u) {
    req *r = u;
    size_t n = size * nmemb, left = (size_t)(r->body_len - r->sent);
    if (n > left) n = left;
    if (n == 0) return 0;
    if (r->body) {
        memcpy(p, r->body + r->sent, n);
    } else {
        ssize_t g = pread(r->body_fd, p, n, (off_t)(r->body_off + r->sent));
        if (g <= 0) return CURL_READFUNC_ABORT;
        n = (size_t)g;
    }
    r->sent += n;
    return n;
}

static int seek_cb(void *u, curl_off_t off, int origin) {
    req *r = u;
    if (origin != SEEK_SET || off < 0 || (uint64_t)off > r->body_len) return CURL_SEEKFUNC_CANTSEEK;
    r->sent = (uint64_t)off;
    return CURL_SEEKFUNC_OK;
}

static size_t header_cb(char *p, size_t size, size_t nmemb, void *u) {
    req *r = u;
    size_t n = size * nmemb;
    char line[512];
    size_t l = n < sizeof line - 1 ? n : sizeof line - 1;
    memcpy(line, p, l);
    line[l] = 0;
    while (l && (line[l - 1] == '\r' || line[l - 1] == '\n')) line[--l] = 0;
    char *colon = strchr(line, ':');
    if (!colon) return n;
    *colon = 0;
    char *v = colon + 1;
    while (*v == ' ') v++;
    if (!strcasecmp(line, "etag")) snprintf(r->etag, sizeof r->etag, "%s", v);
    else if (!strcasecmp(line, "content-length")) r->length = strtoull(v, NULL, 10);
    else if (!strcasecmp(line, "x-amz-meta-tessera-xxh3")) snprintf(r->content_hash, sizeof r->content_hash, "%s", v);
    return n;
}

static void location(const req *r, char *out, size_t len) {
    snprintf(out, len, "s3://%s/%s%s%s", r->bucket, r->key, r->what ? " " : "", r->what ? r->what : "");
}

static int build_url(tsr_s3 *s, const req *r, tsr_sbuf *u) {
    const char *sep = strstr(s->endpoint, "://");
    if (s->path_style) {
        tsr_sb_printf(u, "%s/", s->endpoint);
        uri_encode(u, r->bucket, 0);
        if (r->key[0]) tsr_sb_printf(u, "/");
    } else {
        tsr_sb_printf(u, "%.*s", (int)(sep + 3 - s->endpoint), s->endpoint);
        uri_encode(u, r->bucket, 0);
        tsr_sb_printf(u, ".%s/", sep + 3);
    }
    uri_encode(u, r->key, 1);
    if (r->query[0]) tsr_sb_printf(u, "?%s", r->query);
    return u->oom ? TSR_ENOMEM : 0;
}

static int req_start(tsr_s3 *s, CURLM *m, req *r) {
    req_reset_answer(r);
    tsr_sbuf url = {0};
    if (build_url(s, r, &url)) return tsr_err(&r->err, TSR_ENOMEM, "out of memory");
    CURL *h = curl_easy_init();
    if (!h) {
        free(url.p);
        return tsr_err(&r->err, TSR_ENOMEM, "s3: cannot create a curl handle");
    }
    struct curl_slist *hd = NULL;
    char line[4200];
    /* a signed payload hash: the server refuses a body that does not match it
     * (RGW 16 ignores x-amz-checksum-sha256; S3 keeps that for ListParts) */
    snprintf(line, sizeof line, "x-amz-content-sha256: %s", r->payload[0] ? r->payload : "UNSIGNED-PAYLOAD");
    hd = curl_slist_append(hd, line);
    if (r->checksum[0]) {
        snprintf(line, sizeof line, "x-amz-checksum-sha256: %s", r->checksum);
        hd = curl_slist_append(hd, line);
    }
    if (s->token[0]) {
        snprintf(line, sizeof line, "x-amz-security-token: %s", s->token);
        hd = curl_slist_append(hd, line);
    }
    for (int i = 0; i < 2; i++)
        if (r->extra[i][0]) hd = curl_slist_append(hd, r->extra[i]);
    if (r->content_type || !strcmp(r->method, "POST")) { /* a POST is not a form: no server may parse it as one */
        snprintf(line, sizeof line, "Content-Type: %s", r->content_type ? r->content_type : "application/xml");
        hd = curl_slist_append(hd, line);
    }
    r->hdrs = hd;
    r->h = h;
    curl_easy_setopt(h, CURLOPT_URL, url.p);
    free(url.p);
    curl_easy_setopt(h, CURLOPT_SHARE, s->share);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_AWS_SIGV4, s->sigv4);
    curl_easy_setopt(h, CURLOPT_USERNAME, s->key_id);
    curl_easy_setopt(h, CURLOPT_PASSWORD, s->secret);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, header_cb);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, write_cb);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, (long)(s->stall_seconds + 0.5));
    curl_easy_setopt(h, CURLOPT_PRIVATE, r);
    if (getenv("TSR_S3_VERBOSE")) curl_easy_setopt(h, CURLOPT_VERBOSE, 1L);
    /* bodies in and out in large pieces: fewer system calls and callbacks a GiB
     * (curl's defaults are 16 KiB received and 64 KiB sent at a time) */
    if (r->out) curl_easy_setopt(h, CURLOPT_BUFFERSIZE, TSR_S3_IO_BUFFER);
    if (r->body_len > 65536) curl_easy_setopt(h, CURLOPT_UPLOAD_BUFFERSIZE, TSR_S3_IO_BUFFER);
    if (!strcmp(r->method, "HEAD")) {
        curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    } else if (!strcmp(r->method, "PUT") || !strcmp(r->method, "POST")) {
        if (!strcmp(r->method, "PUT")) {
            curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
            curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)r->body_len);
        } else {
            curl_easy_setopt(h, CURLOPT_POST, 1L);
            curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)r->body_len);
        }
        curl_easy_setopt(h, CURLOPT_READFUNCTION, read_cb);
        curl_easy_setopt(h, CURLOPT_READDATA, r);
        curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, seek_cb);
        curl_easy_setopt(h, CURLOPT_SEEKDATA, r);
    } else if (strcmp(r->method, "GET") != 0) {
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, r->method);
    }
    r->attempts++;
    r->active = 1;
    if (curl_multi_add_handle(m, h) != CURLM_OK) {
        r->active = 0;
        return tsr_err(&r->err, TSR_EIO, "s3: cannot queue a request");
    }
    return 0;
}

static void req_end_attempt(CURLM *m, req *r) {
    if (r->h) {
        curl_multi_remove_handle(m, r->h);
        curl_easy_cleanup(r->h);
    }
    r->h = NULL;
    curl_slist_free_all(r->hdrs);
    r->hdrs = NULL;
    r->active = 0;
}

static int retryable_curl(CURLcode c) {
    switch (c) {
    case CURLE_COULDNT_CONNECT: case CURLE_OPERATION_TIMEDOUT: case CURLE_SEND_ERROR: case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING: case CURLE_PARTIAL_FILE: case CURLE_SSL_CONNECT_ERROR: case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_HTTP2: case CURLE_HTTP2_STREAM: case CURLE_READ_ERROR: case CURLE_WRITE_ERROR:
        return 1;
    default:
        return 0;
    }
}

/* Judges a finished attempt: 0 success, 1 retry (reason in r->err), or a
 * negative status (fatal, in r->err). */
static int judge(req *r, CURLcode cc) {
    char where[TSR_S3_MAX_KEY + 64], code[128], msg[512];
    location(r, where, sizeof where);
    char object[TSR_S3_MAX_KEY + 64];
    snprintf(object, sizeof object, "s3://%s/%s", r->bucket, r->key);
    if (tsr_fault_in_outage(object)) {
        tsr_err(&r->err, TSR_EIO, "%s: %s: HTTP 503 SlowDown: an injected S3 outage (tessera launch --chaos)", where,
                r->method);
        return 1;
    }
    if (r->overflow && r->out)
        return tsr_err(&r->err, TSR_ECORRUPT, "%s: %s: the server sent more than the %zu bytes asked for", where,
                       r->method, r->out_cap);
    if (cc != CURLE_OK) {
        tsr_err(&r->err, TSR_EIO, "%s: %s: %s", where, r->method, curl_easy_strerror(cc));
        return retryable_curl(cc) ? 1 : TSR_EIO;
    }
    curl_easy_getinfo(r->h, CURLINFO_RESPONSE_CODE, &r->status);
    long st = r->status;
    int is_err = tsr_s3_xml_error(r->resp.p, r->resp.n, code, sizeof code, msg, sizeof msg);
    if (st >= 200 && st < 300 && !is_err) {
        if (r->out && r->got != r->out_cap) {
            tsr_err(&r->err, TSR_EIO, "%s: GET: %zu bytes received of %zu", where, r->got, r->out_cap);
            return 1;
        }
        return 0;
    }
    if (!code[0]) snprintf(code, sizeof code, "%s", st == 404 ? "NotFound" : st == 403 ? "Forbidden" : "HTTP error");
    tsr_err(&r->err, st == 404 ? TSR_ENOTFOUND : TSR_EIO, "%s: %s: HTTP %ld %s%s%s", where, r->method, st, code,
            msg[0] ? ": " : "", msg);
    /* BadDigest and XAmzContentSHA256Mismatch: the server got other bytes than were
     * sent (the signed payload hash or x-amz-checksum-sha256 says so); sent again they
     * arrive whole. */
    if (st >= 500 || st == 429 || !strcmp(code, "SlowDown") || !strcmp(code, "RequestTimeout") ||
        !strcmp(code, "InternalError") || !strcmp(code, "BadDigest") || !strcmp(code, "XAmzContentSHA256Mismatch"))
        return 1;
    return r->err.code;
}

/* Runs the requests, at most `parallel` at once, each through the retry loop.
 * progress (may be NULL) hears the body bytes of each request that succeeds.
 * On the first request that fails for good, the rest are stopped and its error
 * is returned. */
int s3_run(tsr_s3 *s, req **rs, size_t n, int parallel, tsr_s3_transfer *t, tsr_error *err) {
    if (n == 0) return 0;
    CURLM *m = NULL;
    pthread_mutex_lock(&s->idle_mu);
    if (s->n_idle) m = s->idle[--s->n_idle];
    pthread_mutex_unlock(&s->idle_mu);
    if (!m && !(m = curl_multi_init())) return tsr_err(err, TSR_ENOMEM, "s3: cannot create a curl multi handle");
    if (parallel < 1) parallel = 1;
    curl_multi_setopt(m, CURLMOPT_MAX_HOST_CONNECTIONS, (long)parallel);
    size_t next = 0, done = 0, waiting = 0;
    int active = 0, rc = 0;
    req *failed = NULL;
    double t0 = tsr_now();
    while (done < n && !rc) {
        double now = tsr_now(), wake = now + 0.25;
        /* retries first, then new requests */
        for (size_t i = 0; waiting && i < next && active < parallel && !rc; i++) {
            req *r = rs[i];
            if (!r->waiting) continue;
            if (r->not_before > now) {
                if (r->not_before < wake) wake = r->not_before;
                continue;
            }
            r->waiting = 0, waiting--;
            if ((rc = req_start(s, m, r))) failed = r;
            else active++;
        }
        while (next < n && active < parallel && !rc) {
            req *r = rs[next++];
            if ((rc = req_start(s, m, r))) failed = r;
            else active++;
        }
        if (rc) break;
        int running;
        curl_multi_perform(m, &running);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(m, &left))) {
            if (msg->msg != CURLMSG_DONE) continue;
            req *r = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&r);
            int v = judge(r, msg->data.result);
            req_end_attempt(m, r);
            active--;
            if (v == 0) {
                r->done = 1, r->rc = 0, done++;
                if (t && t->progress) t->progress(t->user, r->body_len ? r->body_len : r->got);
                continue;
            }
            double elapsed = tsr_now() - t0;
            if (v == 1 && r->attempts < s->max_attempts && elapsed < s->retry_seconds) {
                double cap = 0.1 * (double)(1u << (r->attempts < 7 ? r->attempts : 7));
                if (cap > 8) cap = 8;
                r->not_before = tsr_now() + cap * jitter01();
                r->waiting = 1, waiting++;
                tsr_log(1, "%s (attempt %d; retrying)", r->err.msg, r->attempts);
                continue;
            }
            if (v == 1) {
                tsr_err_prefix(&r->err, "gave up after %d attempts in %.0f s", r->attempts, elapsed);
                v = r->err.code ? r->err.code : TSR_EIO;
            }
            r->done = 1, r->rc = v, done++;
            rc = v;
            failed = r;
            break;
        }
        if (rc || done == n) break;
        double wait = wake - tsr_now();
        int ms = wait > 0 ? (int)(wait * 1000) + 1 : 0;
        if (ms > 250) ms = 250;
        curl_multi_poll(m, NULL, 0, ms, NULL);
    }
    for (size_t i = 0; i < next; i++)
        if (rs[i]->active) req_end_attempt(m, rs[i]);
    pthread_mutex_lock(&s->idle_mu);
    if (s->n_idle < (int)(sizeof s->idle / sizeof *s->idle)) s->idle[s->n_idle++] = m, m = NULL;
    pthread_mutex_unlock(&s->idle_mu);
    if (m) curl_multi_cleanup(m);
    if (rc && err) {
        if (failed) *err = failed->err;
        err->code = rc;
    }
    return rc;
}

int s3_run1(tsr_s3 *s, req *r, tsr_error *err) { return s3_run(s, &r, 1, 1, NULL, err); }

/* ----------------------------------------------------------- operations */

int tsr_s3_head(tsr_s3 *s, const char *bucket, const char *key, tsr_s3_object *out, tsr_error *err) {
    req r;
    s3_req_init(&r, "HEAD", bucket, key);
    int rc = s3_run1(s, &r, err);
    if (!rc && out) {
        memset(out, 0, sizeof *out);
        snprintf(out->key, sizeof out->key, "%s", key);
        out->size = r.length;
        snprintf(out->etag, sizeof out->etag, "%s", r.etag);
        snprintf(out->content_hash, sizeof out->content_hash, "%s", r.content_hash);
    }
    free(r.resp.p);
    return rc;
}

int tsr_s3_get_range(tsr_s3 *s, const char *bucket, const char *key, uint64_t off, size_t len, void *buf,
                     tsr_error *err) {
    if (len == 0) return 0;
    req r;
    s3_req_init(&r, "GET", bucket, key);
    snprintf(r.extra[0], sizeof r.extra[0], "Range: bytes=%llu-%llu", (unsigned long long)off,
             (unsigned long long)(off + len - 1));
    r.out = buf;
    r.out_cap = len;
    int rc = s3_run1(s, &r, err);
    free(r.resp.p);
    return rc;
}

int tsr_s3_get(tsr_s3 *s, const char *bucket, const char *key, size_t max, uint8_t **out, size_t *len,
               tsr_error *err) {
    req r;
    s3_req_init(&r, "GET", bucket, key);
    r.resp_max = max;
    int rc = s3_run1(s, &r, err);
    if (!rc && r.overflow) rc = tsr_err(err, TSR_ECORRUPT, "s3://%s/%s: over the limit of %zu bytes", bucket, key, max);
    if (rc) {
        free(r.resp.p);
        return rc;
    }
    if (!r.resp.p) r.resp.p = calloc(1, 1);
    if (!r.resp.p) return tsr_err(err, TSR_ENOMEM, "out of memory");
    *out = (uint8_t *)r.resp.p;
    *len = r.resp.n;
    return 0;
}

void s3_content_hash_hex(uint64_t h, char out[40]) { snprintf(out, 40, "%016llx", (unsigned long long)h); }

static int put_object(tsr_s3 *s, const char *bucket, const char *key, const void *buf, size_t len, int new_only,
                      tsr_error *err) {
    req r;
    s3_req_init(&r, "PUT", bucket, key);
    r.body = buf;
    r.body_len = len;
    unsigned char md[32];
    EVP_Digest(buf, len, md, NULL, EVP_sha256(), NULL);
    s3_body_sha256(md, r.checksum, r.payload);
    r.content_type = "application/octet-stream";
    char hex[40];
    s3_content_hash_hex(tsr_hash(buf, len), hex);
    snprintf(r.extra[0], sizeof r.extra[0], "x-amz-meta-tessera-xxh3: %s", hex);
    if (new_only) snprintf(r.extra[1], sizeof r.extra[1], "If-None-Match: *");
    int rc = s3_run1(s, &r, err);
    free(r.resp.p);
    if (rc && new_only && r.status == 412) {
        /* taken: by another writer, or by this PUT itself when an earlier try
         * succeeded but its answer was lost (its content hash tells) */
        tsr_s3_object o;
        if (r.attempts > 1 && tsr_s3_head(s, bucket, key, &o, NULL) == 0 && o.size == len &&
            !strcmp(o.content_hash, hex))
            return 0;
        rc = tsr_err(err, TSR_EBUSY, "s3://%s/%s: exists: another writer put it first (HTTP 412)", bucket, key);
    }
    return rc;
}

int tsr_s3_put(tsr_s3 *s, const char *bucket, const char *key, const void *buf, size_t len, tsr_error *err) {
    return put_object(s, bucket, key, buf, len, 0, err);
}

int tsr_s3_put_new(tsr_s3 *s, const char *bucket, const char *key, const void *buf, size_t len, tsr_error *err) {
    return put_object(s, bucket, key, buf, len, 1, err);
}

int tsr_s3_delete(tsr_s3 *s, const char *bucket, const char *key, tsr_error *err) {
    req r;
    s3_req_init(&r, "DELETE", bucket, key);
    int rc = s3_run1(s, &r, err);
    free(r.resp.p);
    return rc;
}

void s3_query_add(tsr_sbuf *q, const char *name, const char *value) {
    if (q->n) tsr_sb_printf(q, "&");
    tsr_sb_printf(q, "%s=", name);
    if (value) uri_encode(q, value, 0);
}

int s3_set_query(req *r, tsr_sbuf *q, tsr_error *err) {
    int rc = 0;
    if (q->oom || (q->n && q->n >= sizeof r->query)) rc = tsr_err(err, TSR_EINVAL, "s3: query too long");
    else snprintf(r->query, sizeof r->query, "%s", q->p ? q->p : "");
    free(q->p);
    *q = (tsr_sbuf){0};
    return rc;
}

int tsr_s3_list(tsr_s3 *s, const char *bucket, const char *prefix, const char *delimiter, tsr_s3_list_fn fn,
                void *user, tsr_error *err) {
    char token[2048] = "";
    int rc = 0;
    do {
        req r;
        s3_req_init(&r, "GET", bucket, "");
        r.resp_max = MAX_XML;
        tsr_sbuf q = {0};
        /* parameters in sorted order: continuation-token, delimiter, list-type, max-keys, prefix */
        if (token[0]) s3_query_add(&q, "continuation-token", token);
        if (delimiter && *delimiter) s3_query_add(&q, "delimiter", delimiter);
        s3_query_add(&q, "list-type", "2");
        if (s->max_keys[0]) s3_query_add(&q, "max-keys", s->max_keys);
        if (prefix && *prefix) s3_query_add(&q, "prefix", prefix);
        if ((rc = s3_set_query(&r, &q, err))) break;
        rc = s3_run1(s, &r, err);
        if (!rc) {
            char where[TSR_S3_MAX_BUCKET + TSR_S3_MAX_KEY + 8];
            snprintf(where, sizeof where, "s3://%s/%s", bucket, prefix ? prefix : "");
            rc = tsr_s3_xml_list_objects(r.resp.p, r.resp.n, where, token, sizeof token, fn, user, err);
        }
        free(r.resp.p);
    } while (!rc && token[0]);
    return rc;
}
