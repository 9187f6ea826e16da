/* fuzz_s3_xml.c: libFuzzer target for the parsers of S3's XML answers (a
 * server, or anything between, may send any bytes): error bodies,
 * ListObjectsV2, CreateMultipartUpload, CompleteMultipartUpload,
 * ListMultipartUploads and ListParts. Each input is one answer body, given to
 * every parser. What comes out must be NUL-terminated inside its buffer, a
 * listing must stop when its callback says so, and a body that is not XML must
 * be refused with a message. */
#include <stdint.h>
#include <string.h>

#include "s3.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* a buffer of n bytes followed by guard bytes that must stay untouched */
#define GUARD 8
static void guard_set(char *b, size_t n) { memset(b + n, 0x5A, GUARD); }
static void guard_check(const char *b, size_t n) {
    if (strnlen(b, n) >= n) __builtin_trap(); /* NUL-terminated inside */
    for (size_t i = 0; i < GUARD; i++)
        if ((unsigned char)b[n + i] != 0x5A) __builtin_trap();
}

typedef struct listing {
    int calls, stop_after;
} listing;

static int on_object(void *user, const tsr_s3_object *o, int is_prefix) {
    listing *l = user;
    if (strnlen(o->key, sizeof o->key) >= sizeof o->key || strnlen(o->etag, sizeof o->etag) >= sizeof o->etag)
        __builtin_trap();
    if (is_prefix && (o->size || o->etag[0])) __builtin_trap(); /* a prefix has only its key */
    if (++l->calls == l->stop_after) return 7;
    return 0;
}

static void on_part(void *user, unsigned long number, uint64_t size, const char *etag, const char *checksum) {
    int *calls = user;
    if (strlen(etag) >= 80 || strlen(checksum) >= 64) __builtin_trap();
    (void)number, (void)size;
    ++*calls;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *body = (const char *)data;
    char code[16 + GUARD], msg[40 + GUARD];
    guard_set(code, 16), guard_set(msg, 40);
    int is_err = tsr_s3_xml_error(body, size, code, 16, msg, 40);
    guard_check(code, 16), guard_check(msg, 40);
    if (!is_err && (code[0] || msg[0])) __builtin_trap();

    char token[24 + GUARD];
    guard_set(token, 24);
    listing l = {0, size ? 1 + data[0] % 4 : 1};
    tsr_error e = {0};
    int rc = tsr_s3_xml_list_objects(body, size, "s3://b/p", token, 24, on_object, &l, &e);
    guard_check(token, 24);
    if (rc == 7) {
        if (l.calls != l.stop_after) __builtin_trap(); /* stops at once */
    } else if (rc == TSR_EIO) {
        if (l.calls || !strstr(e.msg, "s3://b/p: ListObjectsV2: the answer is not XML")) __builtin_trap();
    } else if (rc != 0 || l.calls >= l.stop_after) __builtin_trap();

    char id[20 + GUARD];
    guard_set(id, 20);
    tsr_s3_xml_upload_id(body, size, id, 20);
    guard_check(id, 20);

    int ok = tsr_s3_xml_complete_ok(body, size);
    if (ok && is_err) __builtin_trap(); /* one root element, one name */

    guard_set(id, 20);
    tsr_s3_xml_newest_upload(body, size, "a/b", id, 20);
    guard_check(id, 20);

    char marker[12 + GUARD];
    guard_set(marker, 12);
    int parts = 0;
    int more = tsr_s3_xml_list_parts(body, size, on_part, &parts, marker, 12);
    guard_check(marker, 12);
    if (more && !marker[0]) __builtin_trap();
    return 0;
}
