/* s3.c: the S3 client (s3.h): locations and settings. The request runner and
 * the operations are in s3_request.c, the XML answers in s3_xml.c, multipart
 * uploads, file transfers and the streaming writer in s3_transfer.c. */
#include <curl/curl.h>
#include <ini.h>
#include <libxml/parser.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "s3.h"
#include "s3_impl.h"

/* ------------------------------------------------------------ utilities */

int tsr_s3_is_url(const char *s) { return s && strncmp(s, "s3://", 5) == 0; }

int tsr_s3_split(const char *url, char *bucket, size_t blen, char *key, size_t klen, tsr_error *err) {
    if (!tsr_s3_is_url(url)) return tsr_err(err, TSR_EINVAL, "%s: not an s3:// location", url);
    const char *b = url + 5, *slash = strchr(b, '/');
    size_t bl = slash ? (size_t)(slash - b) : strlen(b);
    if (bl < 3 || bl >= blen || bl > 63)
        return tsr_err(err, TSR_EINVAL, "%s: a bucket name has 3 to 63 characters", url);
    for (size_t i = 0; i < bl; i++)
        if (!((b[i] >= 'a' && b[i] <= 'z') || (b[i] >= '0' && b[i] <= '9') || b[i] == '-' || b[i] == '.'))
            return tsr_err(err, TSR_EINVAL, "%s: bad bucket name (lower-case letters, digits, '-' and '.')", url);
    memcpy(bucket, b, bl);
    bucket[bl] = 0;
    const char *k = slash ? slash + 1 : "";
    if (strlen(k) >= klen || strlen(k) >= TSR_S3_MAX_KEY) return tsr_err(err, TSR_EINVAL, "%s: key too long", url);
    /* "a//b" is "a/b", as in a path: locations are joined with '/' */
    size_t o = 0;
    for (; *k == '/'; k++) {}
    for (; *k; k++)
        if (!(*k == '/' && o && key[o - 1] == '/')) key[o++] = *k;
    key[o] = 0;
    return 0;
}

/* A size from the environment ("8M"), or dflt when unset, malformed or 0. */
static uint64_t parse_size_env(const char *name, uint64_t dflt) {
    uint64_t v;
    const char *s = getenv(name);
    return s && !tsr_parse_size(s, &v) && v ? v : dflt;
}

static double env_double(const char *name, double dflt) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    double x = strtod(v, NULL);
    return x > 0 ? x : dflt;
}

/* ------------------------------------------------------------- settings */

typedef struct ini_ctx {
    const char *profile; /* section wanted */
    int config_file;     /* ~/.aws/config: "profile NAME", except "default" */
    tsr_s3 *s;
    int have_key, have_region, have_endpoint, have_style;
    char style[16];
} ini_ctx;

static int ini_cb(void *user, const char *section, const char *name, const char *value) {
    ini_ctx *c = user;
    char want[300];
    if (c->config_file && strcmp(c->profile, "default") != 0)
        snprintf(want, sizeof want, "profile %s", c->profile);
    else
        snprintf(want, sizeof want, "%s", c->profile);
    if (strcmp(section, want) != 0) return 1;
    tsr_s3 *s = c->s;
    if (!strcmp(name, "aws_access_key_id")) snprintf(s->key_id, sizeof s->key_id, "%s", value), c->have_key |= 1;
    else if (!strcmp(name, "aws_secret_access_key")) snprintf(s->secret, sizeof s->secret, "%s", value), c->have_key |= 2;
    else if (!strcmp(name, "aws_session_token")) snprintf(s->token, sizeof s->token, "%s", value);
    else if (!strcmp(name, "region")) snprintf(s->region, sizeof s->region, "%s", value), c->have_region = 1;
    else if (!strcmp(name, "endpoint_url")) snprintf(s->endpoint, sizeof s->endpoint, "%s", value), c->have_endpoint = 1;
    else if (!strcmp(name, "s3")) { /* nested: "s3 =\n  addressing_style = path" */
        char k[64], v[16];
        if (sscanf(value, " %63[a-z_] = %15s", k, v) == 2 && !strcmp(k, "addressing_style"))
            snprintf(c->style, sizeof c->style, "%s", v), c->have_style = 1;
    }
    return 1;
}

static void home_file(const char *env, const char *rel, char *out, size_t len) {
    const char *v = getenv(env);
    if (v && *v) {
        snprintf(out, len, "%s", v);
        return;
    }
    const char *home = getenv("HOME");
    snprintf(out, len, "%s/%s", home ? home : "/", rel);
}

static void lock_cb(CURL *h, curl_lock_data d, curl_lock_access a, void *u) {
    (void)h, (void)a;
    pthread_mutex_lock(&((tsr_s3 *)u)->locks[d]);
}
static void unlock_cb(CURL *h, curl_lock_data d, void *u) {
    (void)h;
    pthread_mutex_unlock(&((tsr_s3 *)u)->locks[d]);
}

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static int global_ok;
static void global_init(void) {
    global_ok = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
    xmlInitParser();
}

tsr_s3 *tsr_s3_new(const char *endpoint, tsr_error *err) {
    pthread_once(&global_once, global_init);
    if (!global_ok) {
        tsr_err(err, TSR_EIO, "s3: libcurl failed to initialise");
        return NULL;
    }
    tsr_s3 *s = calloc(1, sizeof *s);
    if (!s) {
        tsr_err(err, TSR_ENOMEM, "out of memory");
        return NULL;
    }
    const char *profile = getenv("AWS_PROFILE");
    if (!profile || !*profile) profile = "default";
    ini_ctx c = {.profile = profile, .s = s};
    char path[PATH_MAX];
    home_file("AWS_CONFIG_FILE", ".aws/config", path, sizeof path);
    c.config_file = 1;
    ini_parse(path, ini_cb, &c); /* a missing file is no error */
    home_file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials", path, sizeof path);
    c.config_file = 0;
    ini_parse(path, ini_cb, &c);

    const char *id = getenv("AWS_ACCESS_KEY_ID"), *sec = getenv("AWS_SECRET_ACCESS_KEY");
    if (id && *id && sec && *sec) {
        snprintf(s->key_id, sizeof s->key_id, "%s", id);
        snprintf(s->secret, sizeof s->secret, "%s", sec);
        const char *tok = getenv("AWS_SESSION_TOKEN");
        snprintf(s->token, sizeof s->token, "%s", tok ? tok : "");
        c.have_key = 3;
    }
    const char *r = getenv("AWS_REGION");
    if (!r || !*r) r = getenv("AWS_DEFAULT_REGION");
    if (r && *r) snprintf(s->region, sizeof s->region, "%s", r), c.have_region = 1;
    if (!c.have_region) snprintf(s->region, sizeof s->region, "us-east-1");
    const char *ep = endpoint;
    if (!ep || !*ep) ep = getenv("AWS_ENDPOINT_URL_S3");
    if (!ep || !*ep) ep = getenv("AWS_ENDPOINT_URL");
    if (ep && *ep) snprintf(s->endpoint, sizeof s->endpoint, "%s", ep), c.have_endpoint = 1;
    if (!c.have_endpoint) snprintf(s->endpoint, sizeof s->endpoint, "https://s3.%s.amazonaws.com", s->region);
    size_t el = strlen(s->endpoint);
    while (el && s->endpoint[el - 1] == '/') s->endpoint[--el] = 0;
    if (strncmp(s->endpoint, "http://", 7) != 0 && strncmp(s->endpoint, "https://", 8) != 0) {
        tsr_err(err, TSR_EINVAL, "s3: endpoint %s: expected http://HOST[:PORT] or https://HOST[:PORT]", s->endpoint);
        free(s);
        return NULL;
    }
    if (c.have_key != 3) {
        tsr_err(err, TSR_EINVAL,
                "s3: no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE with "
                "aws_access_key_id and aws_secret_access_key in %s (profile %s)", path, profile);
        free(s);
        return NULL;
    }
    const char *style = getenv("TSR_S3_ADDRESSING");
    if (!style || !*style) style = c.have_style ? c.style : NULL;
    s->path_style = style ? strcmp(style, "virtual") != 0 : c.have_endpoint;
    snprintf(s->sigv4, sizeof s->sigv4, "aws:amz:%s:s3", s->region);
    s->part_size = parse_size_env("TSR_S3_PART_SIZE", DEFAULT_PART);
    if (s->part_size < MIN_PART) s->part_size = MIN_PART;
    if (s->part_size > MAX_PART) s->part_size = MAX_PART;
    s->parallel = (int)parse_size_env("TSR_S3_PARALLEL", 8);
    if (s->parallel > 64) s->parallel = 64;
    s->max_attempts = (int)parse_size_env("TSR_S3_MAX_ATTEMPTS", 10);
    uint64_t mk = parse_size_env("TSR_S3_MAX_KEYS", 0);
    if (mk) snprintf(s->max_keys, sizeof s->max_keys, "%llu", (unsigned long long)(mk < 1000 ? mk : 1000));
    s->retry_seconds = env_double("TSR_S3_RETRY_SECONDS", 300);
    s->stall_seconds = env_double("TSR_S3_STALL_SECONDS", 30);
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++) pthread_mutex_init(&s->locks[i], NULL);
    pthread_mutex_init(&s->idle_mu, NULL);
    s->share = curl_share_init();
    if (s->share) {
        curl_share_setopt(s->share, CURLSHOPT_LOCKFUNC, lock_cb);
        curl_share_setopt(s->share, CURLSHOPT_UNLOCKFUNC, unlock_cb);
        curl_share_setopt(s->share, CURLSHOPT_USERDATA, s);
        curl_share_setopt(s->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
        curl_share_setopt(s->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
    }
    return s;
}

void tsr_s3_free(tsr_s3 *s) {
    if (!s) return;
    for (int i = 0; i < s->n_idle; i++) curl_multi_cleanup(s->idle[i]);
    pthread_mutex_destroy(&s->idle_mu);
    if (s->share) curl_share_cleanup(s->share);
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++) pthread_mutex_destroy(&s->locks[i]);
    memset(s->secret, 0, sizeof s->secret);
    free(s);
}
