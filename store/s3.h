/* s3.h: an S3 client over libcurl. Internal.
 *
 * Requests are signed with libcurl's SigV4 (CURLOPT_AWS_SIGV4, provider
 * "aws:amz:REGION:s3"), always with an explicit x-amz-content-sha256 header
 * (UNSIGNED-PAYLOAD; uploads carry x-amz-checksum-sha256 instead) and with query
 * parameters in sorted order, which is what the signature covers. Every request,
 * alone or one of many in flight on the curl multi interface, goes through one
 * retry loop: exponential backoff with full jitter on connection failures,
 * timeouts, stalls, 5xx, 429 and SlowDown, bounded in attempts and in total time;
 * other 4xx answers fail at once with the server's code and message.
 *
 * Settings, the AWS way: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
 * AWS_SESSION_TOKEN, AWS_REGION / AWS_DEFAULT_REGION, AWS_ENDPOINT_URL_S3 /
 * AWS_ENDPOINT_URL, AWS_PROFILE with AWS_SHARED_CREDENTIALS_FILE
 * (~/.aws/credentials) and AWS_CONFIG_FILE (~/.aws/config: region, endpoint_url,
 * s3 = addressing_style). Path-style addressing by default with a custom
 * endpoint, virtual-hosted style on AWS; TSR_S3_ADDRESSING=path|virtual decides.
 * Tuning: TSR_S3_PART_SIZE (bytes, K/M/G), TSR_S3_PARALLEL, TSR_S3_MAX_ATTEMPTS,
 * TSR_S3_RETRY_SECONDS (total time a request may spend retrying),
 * TSR_S3_STALL_SECONDS (a transfer that moves nothing for this long is retried),
 * TSR_S3_MAX_KEYS (ListObjectsV2 page size), TSR_S3_VERBOSE (libcurl's trace on
 * stderr: headers, with the signature but never the secret).
 * The secret never appears in messages or logs. */
#ifndef TSR_S3_H
#define TSR_S3_H

#include <stddef.h>
#include <stdint.h>

#include "tsr_base.h"

typedef struct tsr_s3 tsr_s3;

#define TSR_S3_MAX_KEY 1024
#define TSR_S3_MAX_BUCKET 64

/* tsr_s3_is_url(): 1 when s starts with "s3://". */
int tsr_s3_is_url(const char *s);
/* tsr_s3_split(): "s3://bucket/key/part" -> bucket, key ("" for none; a trailing
 * '/' is kept). */
int tsr_s3_split(const char *url, char *bucket, size_t blen, char *key, size_t klen, tsr_error *err);

/* tsr_s3_new(): a client with the settings above; `endpoint` (may be NULL)
 * overrides them. Fails without credentials. Thread-safe: requests may be made
 * from several threads at once. */
tsr_s3 *tsr_s3_new(const char *endpoint, tsr_error *err);
void tsr_s3_free(tsr_s3 *s);

typedef struct tsr_s3_object {
    char key[TSR_S3_MAX_KEY];
    uint64_t size;
    char etag[80];
    char content_hash[40]; /* x-amz-meta-tessera-xxh3 (hex), when tessera uploaded it */
} tsr_s3_object;

/* Objects. A missing object or bucket is TSR_ENOTFOUND. */
int tsr_s3_head(tsr_s3 *s, const char *bucket, const char *key, tsr_s3_object *out, tsr_error *err);
/* Reads exactly len bytes at off (a ranged GET). */
int tsr_s3_get_range(tsr_s3 *s, const char *bucket, const char *key, uint64_t off, size_t len, void *buf,
                     tsr_error *err);
/* Reads a whole object of at most max bytes into a malloc'ed buffer. */
int tsr_s3_get(tsr_s3 *s, const char *bucket, const char *key, size_t max, uint8_t **out, size_t *len,
               tsr_error *err);
/* One PUT with an x-amz-checksum-sha256 and the content hash as metadata. */
int tsr_s3_put(tsr_s3 *s, const char *bucket, const char *key, const void *buf, size_t len, tsr_error *err);
/* The same with If-None-Match: *: an object of that key is never replaced (taken:
 * TSR_EBUSY; a retry that finds this PUT's own object, by its content hash, succeeds). */
int tsr_s3_put_new(tsr_s3 *s, const char *bucket, const char *key, const void *buf, size_t len, tsr_error *err);
int tsr_s3_delete(tsr_s3 *s, const char *bucket, const char *key, tsr_error *err);
/* ListObjectsV2 over every page (continuation tokens): fn gets each object, and
 * with a delimiter each common prefix (is_prefix 1, only key set). A non-zero
 * return from fn stops the listing and is returned. */
typedef int (*tsr_s3_list_fn)(void *user, const tsr_s3_object *obj, int is_prefix);
int tsr_s3_list(tsr_s3 *s, const char *bucket, const char *prefix, const char *delimiter, tsr_s3_list_fn fn,
                void *user, tsr_error *err);

/* Files. progress (may be NULL) is called with byte counts as parts finish. */
typedef void (*tsr_s3_progress_fn)(void *user, uint64_t bytes);
typedef struct tsr_s3_transfer {
    tsr_s3_progress_fn progress;
    void *user;
    /* results */
    int skipped;            /* upload: the object was already complete */
    uint64_t parts_sent;    /* upload: parts sent by this call */
    uint64_t parts_resumed; /* upload: parts found already uploaded (ListParts) */
} tsr_s3_transfer;
/* tsr_s3_upload_file(): uploads a local file: skipped when the object already
 * holds it (size and content hash); one PUT when it fits in a part; else a
 * multipart upload (several parts in flight, a SHA-256 per part) that resumes an
 * interrupted upload of the same file (ListParts: parts of the same size and
 * checksum are not sent again) and is aborted when it fails. */
int tsr_s3_upload_file(tsr_s3 *s, const char *path, const char *bucket, const char *key, tsr_s3_transfer *t,
                       tsr_error *err);
/* tsr_s3_download_file(): downloads an object into `path` (written as path.part,
 * renamed when complete), with ranged GETs in parallel; checks the content hash
 * when the object has one. Its writeback has started; the caller fsyncs it when
 * it must be durable. */
int tsr_s3_download_file(tsr_s3 *s, const char *bucket, const char *key, const char *path, tsr_s3_transfer *t,
                         tsr_error *err);

/* A streaming upload: bytes appended in order, sent as parts of the client's
 * part size, several in flight; finish completes it, abort removes it. An object
 * under one part is sent with one PUT at finish. new_only: the completion (or
 * the PUT) carries If-None-Match: *, so that an object put meanwhile under the
 * key is never replaced (finish: TSR_EBUSY). */
typedef struct tsr_s3_writer tsr_s3_writer;
tsr_s3_writer *tsr_s3_writer_new(tsr_s3 *s, const char *bucket, const char *key, int new_only, tsr_error *err);
int tsr_s3_writer_append(tsr_s3_writer *w, const void *buf, size_t len, tsr_error *err);
uint64_t tsr_s3_writer_size(const tsr_s3_writer *w);
int tsr_s3_writer_finish(tsr_s3_writer *w, tsr_error *err); /* frees w */
void tsr_s3_writer_abort(tsr_s3_writer *w);                   /* frees w */

/* The XML answers of S3, parsed from a body of n bytes (the requests above use
 * these; tests and fuzzers call them directly). Text longer than a buffer is cut
 * to fit; a missing element reads as "". */

/* tsr_s3_xml_error(): 1 when the body is an <Error>, with its Code and Message
 * in code and msg; else 0 (both ""). */
int tsr_s3_xml_error(const char *body, size_t n, char *code, size_t cl, char *msg, size_t ml);
/* tsr_s3_xml_list_objects(): one page of ListObjectsV2: fn gets each Contents
 * (key, size, etag) and each CommonPrefixes (is_prefix 1); token gets
 * NextContinuationToken when IsTruncated is true, else "". @return 0, fn's
 * non-zero return, or TSR_EIO ("WHERE: ListObjectsV2: the answer is not XML"). */
int tsr_s3_xml_list_objects(const char *body, size_t n, const char *where, char *token, size_t tlen,
                            tsr_s3_list_fn fn, void *user, tsr_error *err);
/* tsr_s3_xml_upload_id(): the UploadId of a CreateMultipartUpload answer ("" if none). */
void tsr_s3_xml_upload_id(const char *body, size_t n, char *upload_id, size_t idlen);
/* tsr_s3_xml_complete_ok(): 1 when the body is a CompleteMultipartUpload
 * answer (its root is CompleteMultipartUploadResult or ...Response). */
int tsr_s3_xml_complete_ok(const char *body, size_t n);
/* tsr_s3_xml_newest_upload(): of a ListMultipartUploads answer, the UploadId of
 * the Upload of exactly `key` with the latest Initiated ("" if none). */
void tsr_s3_xml_newest_upload(const char *body, size_t n, const char *key, char *upload_id, size_t idlen);
/* tsr_s3_xml_list_parts(): one page of ListParts: fn gets each Part (number,
 * size, etag, checksum; a number or size that does not parse reads as 0);
 * marker gets NextPartNumberMarker. @return 1 when the answer is truncated and
 * has a marker (another page follows), else 0. */
typedef void (*tsr_s3_part_fn)(void *user, unsigned long number, uint64_t size, const char *etag,
                               const char *checksum);
int tsr_s3_xml_list_parts(const char *body, size_t n, tsr_s3_part_fn fn, void *user, char *marker, size_t mlen);

#endif
