/* store_s3.h: the S3 side of the store (store.h), for locations written
 * s3://bucket/prefix. Internal: store_posix.c hands every call on a remote store,
 * read file or write file to these. Objects are named PREFIX/NAME; a write file
 * is a streaming multipart upload (writes must come in order), so nothing is
 * visible under its name before finish; a put is one PUT, atomic by nature. */
#ifndef TSR_STORE_S3_H
#define TSR_STORE_S3_H

#include <stddef.h>
#include <stdint.h>

#include "tsr_ckpt.h"

typedef struct s3_store s3_store;
typedef struct s3_rfile s3_rfile;
typedef struct s3_wfile s3_wfile;

s3_store *s3st_open(const char *location, tsr_error *err);
void s3st_close(s3_store *s);
int s3st_open_read(s3_store *s, const char *name, s3_rfile **out, uint64_t *size, tsr_error *err);
int s3st_read(s3_rfile *f, void *buf, size_t len, uint64_t off, tsr_error *err);
void s3st_rclose(s3_rfile *f);
int s3st_create(s3_store *s, const char *name, s3_wfile **out, tsr_error *err);
int s3st_write(s3_wfile *f, const void *buf, size_t len, uint64_t off, tsr_error *err);
int s3st_finish(s3_wfile *f, uint64_t size, tsr_error *err);
void s3st_abort(s3_wfile *f);
int s3st_put(s3_store *s, const char *name, const void *buf, size_t len, tsr_error *err);
int s3st_get(s3_store *s, const char *name, size_t max, uint8_t **out, size_t *len, tsr_error *err);
int s3st_exists(s3_store *s, const char *name);
int s3st_remove(s3_store *s, const char *name, tsr_error *err);
/* Names directly under the location: objects, and "sub/" for deeper keys. */
int s3st_list(s3_store *s, int (*fn)(void *user, const char *name, uint64_t size), void *user, tsr_error *err);

#endif
