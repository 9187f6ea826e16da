/* s3_impl.h: what the files of the S3 client share (s3.c: settings;
 * s3_request.c: the request runner and the single-request operations;
 * s3_xml.c: the XML answers; s3_transfer.c: multipart uploads, file transfers
 * and the streaming writer). Internal to them. */
#ifndef TSR_S3_IMPL_H
#define TSR_S3_IMPL_H

#include <curl/curl.h>
#include <pthread.h>

#include "common.h"
#include "s3.h"

#define MIN_PART ((uint64_t)5 << 20) /* S3's smallest part (but the last) */
#define MAX_PARTS 10000
#define DEFAULT_PART ((uint64_t)8 << 20)
#define MAX_PART ((uint64_t)5 << 30)
#define MAX_XML ((size_t)64 << 20) /* the largest XML answer read */
#define MAX_ERR_BODY ((size_t)64 << 10)

struct tsr_s3 {
    char endpoint[512]; /* scheme://host[:port], no trailing '/' */
    char region[64];
    char sigv4[128];    /* "aws:amz:REGION:s3" */
    char key_id[256];
    char secret[256];
    char token[4096];
    int path_style;
    uint64_t part_size;
    int parallel, max_attempts;
    char max_keys[16]; /* ListObjectsV2 page size, "" for the server's (1000) */
    double retry_seconds, stall_seconds;
    CURLSH *share; /* DNS and TLS sessions */
    pthread_mutex_t locks[CURL_LOCK_DATA_LAST];
    /* idle multi handles, each keeping its connections open for the next run */
    pthread_mutex_t idle_mu;
    CURLM *idle[16];
    int n_idle;
};

/* One request and its answer, as the runner (s3_run) sends it and retries it. */
typedef struct req {
    /* what to send */
    const char *method; /* GET PUT HEAD DELETE POST */
    const char *bucket, *key;
    char query[1400];   /* sorted and encoded, no '?' */
    const uint8_t *body;
    int body_fd;        /* or -1 */
    uint64_t body_off, body_len;
    char checksum[48];  /* base64 SHA-256 of the body (x-amz-checksum-sha256), or "" */
    char payload[65];   /* hex SHA-256 of the body, signed as x-amz-content-sha256: S3, RGW
                         * and MinIO check the body against it; "": UNSIGNED-PAYLOAD */
    const char *content_type; /* of a PUT or POST body; NULL: application/xml for a POST, none for a PUT */
    char extra[2][160]; /* more headers, "Name: value", or "" */
    const char *what;   /* "part 3" etc., for messages; may be NULL */
    /* where the answer's body goes: a fixed buffer, or resp */
    uint8_t *out;
    size_t out_cap;
    size_t resp_max;
    /* the answer */
    long status;
    tsr_sbuf resp;
    size_t got, sent;
    char etag[80], content_hash[40];
    uint64_t length;
    /* state */
    CURL *h;
    struct curl_slist *hdrs;
    int attempts, waiting, active, done, overflow;
    double not_before;
    int rc;
    tsr_error err;
} req;

/* s3_req_init(): an empty request of `method` on bucket/key (key NULL: the
 * bucket), its answer kept in resp up to MAX_ERR_BODY bytes. */
void s3_req_init(req *r, const char *method, const char *bucket, const char *key);
/* s3_run(): runs the requests, at most `parallel` at once, each through the
 * retry loop. progress (t, may be NULL) hears the body bytes of each request
 * that succeeds. On the first request that fails for good, the rest are stopped
 * and its error is returned. s3_run1(): one request. */
int s3_run(tsr_s3 *s, req **rs, size_t n, int parallel, tsr_s3_transfer *t, tsr_error *err);
int s3_run1(tsr_s3 *s, req *r, tsr_error *err);
/* s3_query_add(): appends "name=value" (value URI-encoded; NULL: "name=") to a
 * query; parameters must be added in sorted order. s3_set_query(): moves the
 * query into r (TSR_EINVAL when too long) and frees it. */
void s3_query_add(tsr_sbuf *q, const char *name, const char *value);
int s3_set_query(req *r, tsr_sbuf *q, tsr_error *err);
/* s3_body_sha256(): a body's SHA-256 digest as x-amz-checksum-sha256 (base64) and
 * x-amz-content-sha256 (hex) want it. */
void s3_body_sha256(const unsigned char md[32], char b64[48], char hex[65]);
/* s3_content_hash_hex(): the content hash (XXH3) as x-amz-meta-tessera-xxh3 holds it. */
void s3_content_hash_hex(uint64_t h, char out[40]);

#endif
