/* s3.c: the S3 client (s3.h): settings, the one request runner with its retry
 * loop, the S3 operations, file transfers and the streaming writer. */
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <ini.h>
#include <libxml/parser.h>
#include <libxml/tree.h>
#include <limits.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

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

static void sha256_b64(const unsigned char md[32], char out[48]) { EVP_EncodeBlock((unsigned char *)out, md, 32); }

/* A per-thread splitmix64 for the backoff's jitter. */
static double jitter01(void) {
    static __thread uint64_t x;
    if (!x) x = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)&x;
    return (double)(tsr_splitmix_next(&x) >> 11) / 9007199254740992.0;
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


/* ------------------------------------------------------- request runner */

typedef struct req {
    /* what to send */
    const char *method; /* GET PUT HEAD DELETE POST */
    const char *bucket, *key;
    char query[1400];   /* sorted and encoded, no '?' */
    const uint8_t *body;
    int body_fd;        /* or -1 */
    uint64_t body_off, body_len;
    char checksum[48];  /* base64 SHA-256 of the body, or "" */
    char extra[2][160]; /* more headers, "Name: value", or "" */
    const char *what;   /* "part 3" etc., for messages; may be NULL */
    /* where the answer's body goes: a fixed buffer, a file, or resp */
    uint8_t *out;
    size_t out_cap;
    int out_fd;         /* or -1 */
    uint64_t out_off;
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

static void req_init(req *r, const char *method, const char *bucket, const char *key) {
    memset(r, 0, sizeof *r);
    r->method = method;
    r->bucket = bucket;
    r->key = key ? key : "";
    r->body_fd = r->out_fd = -1;
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
    if (st >= 200 && st < 300 && (r->out || r->out_fd >= 0)) {
        if (r->out) {
            if (r->got + n > r->out_cap) {
                r->overflow = 1;
                return 0; /* more bytes than asked for */
            }
            memcpy(r->out + r->got, p, n);
        } else {
            size_t done = 0;
            while (done < n) {
                ssize_t w = pwrite(r->out_fd, p + done, n - done, (off_t)(r->out_off + r->got + done));
                if (w < 0 && errno == EINTR) continue;
                if (w <= 0) return 0;
                done += (size_t)w;
            }
        }
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

/* The text of child `name` of node, into out ("" when missing). */
static void xml_text(xmlNode *node, const char *name, char *out, size_t len) {
    out[0] = 0;
    for (xmlNode *n = node ? node->children : NULL; n; n = n->next)
        if (n->type == XML_ELEMENT_NODE && !strcmp((const char *)n->name, name)) {
            xmlChar *t = xmlNodeGetContent(n);
            snprintf(out, len, "%s", t ? (const char *)t : "");
            xmlFree(t);
            return;
        }
}

static xmlDoc *xml_read(const char *body, size_t n) {
    if (!n || n > INT_MAX) return NULL;
    return xmlReadMemory(body, (int)n, "s3.xml", NULL, XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING);
}

int tsr_s3_xml_error(const char *body, size_t n, char *code, size_t cl, char *msg, size_t ml) {
    code[0] = msg[0] = 0;
    xmlDoc *d = xml_read(body, n);
    if (!d) return 0;
    xmlNode *root = xmlDocGetRootElement(d);
    int is_err = root && !strcmp((const char *)root->name, "Error");
    if (is_err) {
        xml_text(root, "Code", code, cl);
        xml_text(root, "Message", msg, ml);
    }
    xmlFreeDoc(d);
    return is_err;
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
    hd = curl_slist_append(hd, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
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
    if (!strcmp(r->method, "POST")) /* not a form: a server must not parse it as one */
        hd = curl_slist_append(hd, "Content-Type: application/xml");
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
    if (st >= 500 || st == 429 || !strcmp(code, "SlowDown") || !strcmp(code, "RequestTimeout") ||
        !strcmp(code, "InternalError"))
        return 1;
    return r->err.code;
}

/* Runs the requests, at most `parallel` at once, each through the retry loop.
 * progress (may be NULL) hears the body bytes of each request that succeeds.
 * On the first request that fails for good, the rest are stopped and its error
 * is returned. */
static int run(tsr_s3 *s, req **rs, size_t n, int parallel, tsr_s3_transfer *t, tsr_error *err) {
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

static int run1(tsr_s3 *s, req *r, tsr_error *err) { return run(s, &r, 1, 1, NULL, err); }

/* ----------------------------------------------------------- operations */

int tsr_s3_head(tsr_s3 *s, const char *bucket, const char *key, tsr_s3_object *out, tsr_error *err) {
    req r;
    req_init(&r, "HEAD", bucket, key);
    int rc = run1(s, &r, err);
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
    req_init(&r, "GET", bucket, key);
    snprintf(r.extra[0], sizeof r.extra[0], "Range: bytes=%llu-%llu", (unsigned long long)off,
             (unsigned long long)(off + len - 1));
    r.out = buf;
    r.out_cap = len;
    int rc = run1(s, &r, err);
    free(r.resp.p);
    return rc;
}

int tsr_s3_get(tsr_s3 *s, const char *bucket, const char *key, size_t max, uint8_t **out, size_t *len,
               tsr_error *err) {
    req r;
    req_init(&r, "GET", bucket, key);
    r.resp_max = max;
    int rc = run1(s, &r, err);
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

static void content_hash_hex(uint64_t h, char out[40]) { snprintf(out, 40, "%016llx", (unsigned long long)h); }

int tsr_s3_put(tsr_s3 *s, const char *bucket, const char *key, const void *buf, size_t len, tsr_error *err) {
    req r;
    req_init(&r, "PUT", bucket, key);
    r.body = buf;
    r.body_len = len;
    unsigned char md[32];
    EVP_Digest(buf, len, md, NULL, EVP_sha256(), NULL);
    sha256_b64(md, r.checksum);
    char hex[40];
    content_hash_hex(tsr_hash(buf, len), hex);
    snprintf(r.extra[0], sizeof r.extra[0], "x-amz-meta-tessera-xxh3: %s", hex);
    int rc = run1(s, &r, err);
    free(r.resp.p);
    return rc;
}

int tsr_s3_delete(tsr_s3 *s, const char *bucket, const char *key, tsr_error *err) {
    req r;
    req_init(&r, "DELETE", bucket, key);
    int rc = run1(s, &r, err);
    free(r.resp.p);
    return rc;
}

static void query_add(tsr_sbuf *q, const char *name, const char *value) {
    if (q->n) tsr_sb_printf(q, "&");
    tsr_sb_printf(q, "%s=", name);
    if (value) uri_encode(q, value, 0);
}

static int set_query(req *r, tsr_sbuf *q, tsr_error *err) {
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
        req_init(&r, "GET", bucket, "");
        r.resp_max = MAX_XML;
        tsr_sbuf q = {0};
        /* parameters in sorted order: continuation-token, delimiter, list-type, max-keys, prefix */
        if (token[0]) query_add(&q, "continuation-token", token);
        if (delimiter && *delimiter) query_add(&q, "delimiter", delimiter);
        query_add(&q, "list-type", "2");
        if (s->max_keys[0]) query_add(&q, "max-keys", s->max_keys);
        if (prefix && *prefix) query_add(&q, "prefix", prefix);
        if ((rc = set_query(&r, &q, err))) break;
        rc = run1(s, &r, err);
        if (!rc) {
            char where[TSR_S3_MAX_BUCKET + TSR_S3_MAX_KEY + 8];
            snprintf(where, sizeof where, "s3://%s/%s", bucket, prefix ? prefix : "");
            rc = tsr_s3_xml_list_objects(r.resp.p, r.resp.n, where, token, sizeof token, fn, user, err);
        }
        free(r.resp.p);
    } while (!rc && token[0]);
    return rc;
}

int tsr_s3_xml_list_objects(const char *body, size_t len, const char *where, char *token, size_t tlen,
                            tsr_s3_list_fn fn, void *user, tsr_error *err) {
    token[0] = 0;
    xmlDoc *d = xml_read(body, len);
    if (!d) return tsr_err(err, TSR_EIO, "%s: ListObjectsV2: the answer is not XML", where);
    int rc = 0;
    xmlNode *root = xmlDocGetRootElement(d);
    char trunc[16];
    xml_text(root, "IsTruncated", trunc, sizeof trunc);
    xml_text(root, "NextContinuationToken", token, tlen);
    if (strcmp(trunc, "true") != 0) token[0] = 0;
    for (xmlNode *n = root ? root->children : NULL; n && !rc; n = n->next) {
        if (n->type != XML_ELEMENT_NODE) continue;
        tsr_s3_object o;
        memset(&o, 0, sizeof o);
        char size[32];
        if (!strcmp((const char *)n->name, "Contents")) {
            xml_text(n, "Key", o.key, sizeof o.key);
            xml_text(n, "Size", size, sizeof size);
            xml_text(n, "ETag", o.etag, sizeof o.etag);
            o.size = strtoull(size, NULL, 10);
            rc = fn(user, &o, 0);
        } else if (!strcmp((const char *)n->name, "CommonPrefixes")) {
            xml_text(n, "Prefix", o.key, sizeof o.key);
            rc = fn(user, &o, 1);
        }
    }
    xmlFreeDoc(d);
    return rc;
}

/* ------------------------------------------------------------ multipart */

typedef struct part {
    uint64_t off, len;
    char checksum[48];
    char etag[80];
    int have; /* already uploaded (resume) */
} part;

static int create_upload(tsr_s3 *s, const char *bucket, const char *key, const char *content_hash, char *upload_id,
                         size_t idlen, tsr_error *err) {
    req r;
    req_init(&r, "POST", bucket, key);
    snprintf(r.query, sizeof r.query, "uploads=");
    snprintf(r.extra[0], sizeof r.extra[0], "x-amz-checksum-algorithm: SHA256");
    if (content_hash && *content_hash)
        snprintf(r.extra[1], sizeof r.extra[1], "x-amz-meta-tessera-xxh3: %s", content_hash);
    r.what = "(CreateMultipartUpload)";
    r.resp_max = MAX_XML;
    int rc = run1(s, &r, err);
    upload_id[0] = 0;
    if (!rc) tsr_s3_xml_upload_id(r.resp.p, r.resp.n, upload_id, idlen);
    free(r.resp.p);
    if (!rc && !upload_id[0])
        rc = tsr_err(err, TSR_EIO, "s3://%s/%s: CreateMultipartUpload: no UploadId in the answer", bucket, key);
    return rc;
}

void tsr_s3_xml_upload_id(const char *body, size_t n, char *upload_id, size_t idlen) {
    upload_id[0] = 0;
    xmlDoc *d = xml_read(body, n);
    if (d) xml_text(xmlDocGetRootElement(d), "UploadId", upload_id, idlen);
    xmlFreeDoc(d);
}

static void abort_upload(tsr_s3 *s, const char *bucket, const char *key, const char *upload_id) {
    req r;
    req_init(&r, "DELETE", bucket, key);
    tsr_sbuf q = {0};
    query_add(&q, "uploadId", upload_id);
    if (!set_query(&r, &q, NULL)) {
        r.what = "(AbortMultipartUpload)";
        tsr_error e;
        if (run1(s, &r, &e)) tsr_log(1, "%s", e.msg);
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
        req_init(r, "PUT", bucket, key);
        tsr_sbuf q = {0};
        char num[16];
        snprintf(num, sizeof num, "%zu", first + i + 1);
        query_add(&q, "partNumber", num);
        query_add(&q, "uploadId", upload_id);
        rc = set_query(r, &q, err);
        if (bufs) r->body = bufs[i];
        else r->body_fd = fd, r->body_off = parts[i].off;
        r->body_len = parts[i].len;
        snprintf(r->checksum, sizeof r->checksum, "%s", parts[i].checksum);
        snprintf(what[i], 32, "part %zu", first + i + 1);
        r->what = what[i];
        rp[m++] = r;
    }
    if (!rc) rc = run(s, rp, m, s->parallel, t, err);
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

static int complete_upload(tsr_s3 *s, const char *bucket, const char *key, const char *upload_id, const part *parts,
                           size_t n, tsr_error *err) {
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
    req_init(&r, "POST", bucket, key);
    tsr_sbuf q = {0};
    query_add(&q, "uploadId", upload_id);
    int rc = set_query(&r, &q, err);
    r.body = (const uint8_t *)b.p;
    r.body_len = b.n;
    r.what = "(CompleteMultipartUpload)";
    r.resp_max = MAX_XML;
    if (!rc) rc = run1(s, &r, err); /* an <Error> in a 200 answer is a failure too (judge) */
    if (!rc && !tsr_s3_xml_complete_ok(r.resp.p, r.resp.n))
        rc = tsr_err(err, TSR_EIO, "s3://%s/%s: CompleteMultipartUpload: unexpected answer", bucket, key);
    free(r.resp.p);
    free(b.p);
    return rc;
}

int tsr_s3_xml_complete_ok(const char *body, size_t n) {
    xmlDoc *d = xml_read(body, n);
    xmlNode *root = d ? xmlDocGetRootElement(d) : NULL;
    /* AWS answers CompleteMultipartUploadResult; some servers ...Response */
    int ok = root && strncmp((const char *)root->name, "CompleteMultipartUpload", 23) == 0;
    xmlFreeDoc(d);
    return ok;
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
    req_init(&r, "GET", bucket, "");
    r.resp_max = MAX_XML;
    tsr_sbuf q = {0};
    query_add(&q, "prefix", key);
    query_add(&q, "uploads", NULL);
    int rc = set_query(&r, &q, err);
    if (!rc) rc = run1(s, &r, err);
    if (!rc) tsr_s3_xml_newest_upload(r.resp.p, r.resp.n, key, upload_id, idlen);
    free(r.resp.p);
    if (rc) return rc;
    if (!upload_id[0]) return 0;
    resume_ctx rs = {parts, n, fd, t};
    char marker[32] = "";
    for (;;) {
        req_init(&r, "GET", bucket, key);
        r.resp_max = MAX_XML;
        r.what = "(ListParts)";
        if (marker[0]) query_add(&q, "part-number-marker", marker);
        query_add(&q, "uploadId", upload_id);
        if ((rc = set_query(&r, &q, err))) break;
        rc = run1(s, &r, err);
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

void tsr_s3_xml_newest_upload(const char *body, size_t n, const char *key, char *upload_id, size_t idlen) {
    upload_id[0] = 0;
    xmlDoc *d = xml_read(body, n);
    char best_time[64] = "";
    xmlNode *lroot = d ? xmlDocGetRootElement(d) : NULL;
    for (xmlNode *u = lroot ? lroot->children : NULL; u; u = u->next) {
        if (u->type != XML_ELEMENT_NODE || strcmp((const char *)u->name, "Upload") != 0) continue;
        char k[TSR_S3_MAX_KEY], id[512], init[64];
        xml_text(u, "Key", k, sizeof k);
        xml_text(u, "UploadId", id, sizeof id);
        xml_text(u, "Initiated", init, sizeof init);
        if (strcmp(k, key) != 0 || !id[0]) continue;
        if (!upload_id[0] || strcmp(init, best_time) > 0) {
            snprintf(upload_id, idlen, "%s", id);
            snprintf(best_time, sizeof best_time, "%s", init);
        }
    }
    xmlFreeDoc(d);
}

int tsr_s3_xml_list_parts(const char *body, size_t n, tsr_s3_part_fn fn, void *user, char *marker, size_t mlen) {
    xmlDoc *d = xml_read(body, n);
    xmlNode *root = d ? xmlDocGetRootElement(d) : NULL;
    for (xmlNode *p = root ? root->children : NULL; p; p = p->next) {
        if (p->type != XML_ELEMENT_NODE || strcmp((const char *)p->name, "Part") != 0) continue;
        char num[16], size[32], etag[80], ck[64];
        xml_text(p, "PartNumber", num, sizeof num);
        xml_text(p, "Size", size, sizeof size);
        xml_text(p, "ETag", etag, sizeof etag);
        xml_text(p, "ChecksumSHA256", ck, sizeof ck);
        fn(user, strtoul(num, NULL, 10), strtoull(size, NULL, 10), etag, ck);
    }
    char trunc[16];
    xml_text(root, "IsTruncated", trunc, sizeof trunc);
    xml_text(root, "NextPartNumberMarker", marker, mlen);
    xmlFreeDoc(d);
    return strcmp(trunc, "true") == 0 && marker[0];
}

/* Hashes a file in one pass: XXH3 of the whole (the content hash) and the
 * SHA-256 of each part. */
static int hash_file(int fd, const char *path, uint64_t size, part *parts, size_t n, char hex[40], tsr_error *err) {
    enum { CHUNK = 8 << 20 };
    uint8_t *buf = malloc(CHUNK);
    XXH3_state_t *x = XXH3_createState();
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    int rc = 0;
    if (!buf || !x || !md) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    if (!rc) XXH3_64bits_reset(x);
    for (size_t i = 0; i < n && !rc; i++) {
        EVP_DigestInit_ex(md, EVP_sha256(), NULL);
        for (uint64_t o = 0; o < parts[i].len && !rc;) {
            size_t want = parts[i].len - o < CHUNK ? (size_t)(parts[i].len - o) : CHUNK;
            ssize_t g = pread(fd, buf, want, (off_t)(parts[i].off + o));
            if (g <= 0) {
                rc = tsr_err(err, TSR_EIO, "%s: read at %llu: %s", path, (unsigned long long)(parts[i].off + o),
                             g < 0 ? strerror(errno) : "the file shrank");
                break;
            }
            EVP_DigestUpdate(md, buf, (size_t)g);
            XXH3_64bits_update(x, buf, (size_t)g);
            o += (uint64_t)g;
        }
        unsigned char d[32];
        EVP_DigestFinal_ex(md, d, NULL);
        sha256_b64(d, parts[i].checksum);
    }
    if (!rc) content_hash_hex(size ? XXH3_64bits_digest(x) : tsr_hash("", 0), hex);
    free(buf);
    if (x) XXH3_freeState(x);
    EVP_MD_CTX_free(md);
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
        req_init(&r, "PUT", bucket, key);
        r.body_fd = fd;
        r.body_len = size;
        snprintf(r.checksum, sizeof r.checksum, "%s", parts[0].checksum);
        snprintf(r.extra[0], sizeof r.extra[0], "x-amz-meta-tessera-xxh3: %s", hex);
        rc = run(s, (req *[]){&r}, 1, 1, t, err);
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
        if (!rc) rc = complete_upload(s, bucket, key, upload_id, parts, n, err);
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

int tsr_s3_download_file(tsr_s3 *s, const char *bucket, const char *key, const char *path, tsr_s3_transfer *t,
                         tsr_error *err) {
    tsr_s3_object o;
    int rc = tsr_s3_head(s, bucket, key, &o, err);
    if (rc) return rc;
    char tmp[PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.part", path);
    int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return tsr_err(err, TSR_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    if (o.size && ftruncate(fd, (off_t)o.size) != 0) {
        rc = tsr_err(err, errno == ENOSPC ? TSR_ENOSPC : TSR_EIO, "%s: %s", tmp, strerror(errno));
        goto fail;
    }
    uint64_t psz = part_size_for(s, o.size);
    size_t n = o.size ? (size_t)((o.size + psz - 1) / psz) : 0;
    req *rs = calloc(n ? n : 1, sizeof *rs);
    req **rp = calloc(n ? n : 1, sizeof *rp);
    if (!rs || !rp) {
        free(rs), free(rp);
        rc = tsr_err(err, TSR_ENOMEM, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t off = (uint64_t)i * psz, len = i + 1 < n ? psz : o.size - off;
        req_init(&rs[i], "GET", bucket, key);
        snprintf(rs[i].extra[0], sizeof rs[i].extra[0], "Range: bytes=%llu-%llu", (unsigned long long)off,
                 (unsigned long long)(off + len - 1));
        rs[i].out_fd = fd;
        rs[i].out_off = off;
        rp[i] = &rs[i];
    }
    rc = run(s, rp, n, s->parallel, t, err);
    for (size_t i = 0; i < n; i++) {
        if (!rc && rs[i].got != (i + 1 < n ? psz : o.size - (uint64_t)i * psz))
            rc = tsr_err(err, TSR_EIO, "s3://%s/%s: range %zu: %zu bytes received", bucket, key, i, rs[i].got);
        free(rs[i].resp.p);
    }
    free(rs), free(rp);
    if (rc) goto fail;
    if (o.content_hash[0]) {
        char hex[40];
        part whole = {0, o.size, "", "", 0};
        if ((rc = hash_file(fd, tmp, o.size, &whole, 1, hex, err))) goto fail;
        if (strcmp(hex, o.content_hash) != 0) {
            rc = tsr_err(err, TSR_ECORRUPT, "s3://%s/%s: downloaded bytes hash to %s, the object says %s", bucket, key,
                         hex, o.content_hash);
            goto fail;
        }
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
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
};

tsr_s3_writer *tsr_s3_writer_new(tsr_s3 *s, const char *bucket, const char *key, tsr_error *err) {
    tsr_s3_writer *w = calloc(1, sizeof *w);
    if (!w) goto nomem;
    w->s = s;
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
        sha256_b64(md, p->checksum);
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
        rc = tsr_s3_put(w->s, w->bucket, w->key, w->bufs[0] ? w->bufs[0] : (const uint8_t *)"", w->fill[0], err);
    } else {
        rc = writer_flush(w, k, err);
        if (!rc) rc = complete_upload(w->s, w->bucket, w->key, w->upload_id, w->parts, w->n_parts, err);
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
