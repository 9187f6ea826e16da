/* config_toml.c: the job config's text: a hand-written reader for the TOML
 * subset of TorchTitan's job configs (tables, keys, strings, numbers,
 * booleans; arrays and inline tables only in keys that tessera ignores), and
 * the command-line overrides --section.key=value. Both hand each value to
 * tsr_cfg_apply, which walks the table of keys in config.c. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "config_impl.h"

#define MAX_FILE_BYTES (1u << 20) /* a job config is a few KiB; refuse anything huge */

/* ------------------------------------------------------------ the TOML reader */

typedef struct reader {
    const char *path;
    const char *p, *end;
    int line;
    tsr_train_config *c;
    tsr_error *err;
    char section[128]; /* the current table, "" before the first header */
    int section_ignored;
    /* what the file has set so far, for duplicate checks */
    struct seen {
        char name[256];
        int line;
    } *seen;
    size_t n_seen, cap_seen;
} reader;

static int rerr(reader *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int rerr(reader *r, const char *fmt, ...) {
    char msg[TSR_ERROR_MSG];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return tsr_err(r->err, TSR_EINVAL, "%s:%d: %s", r->path, r->line, msg);
}

static void skip_ws(reader *r) {
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t')) r->p++;
}

static int at_eol(const reader *r) {
    return r->p >= r->end || *r->p == '\n' || (*r->p == '\r' && r->p + 1 < r->end && r->p[1] == '\n');
}

/* After a header or a value: spaces, an optional comment, the end of the line. */
static int expect_eol(reader *r, const char *after) {
    skip_ws(r);
    if (r->p < r->end && *r->p == '#')
        while (r->p < r->end && *r->p != '\n') r->p++;
    if (!at_eol(r)) {
        const char *e = r->p;
        while (e < r->end && *e != '\n' && *e != '\r' && e - r->p < 40) e++;
        return rerr(r, "unexpected text after %s: '%.*s'", after, (int)(e - r->p), r->p);
    }
    return 0;
}

static int is_bare(char ch) {
    return (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_' ||
           ch == '-';
}

/* A bare key into out. @return its length, 0 if none. */
static size_t read_bare(reader *r, char *out, size_t cap) {
    size_t n = 0;
    while (r->p < r->end && is_bare(*r->p)) {
        if (n + 1 < cap) out[n] = *r->p;
        n++;
        r->p++;
    }
    out[n < cap ? n : cap - 1] = 0;
    return n;
}

static void utf8_put(char *out, size_t *n, uint32_t cp) {
    if (cp < 0x80) out[(*n)++] = (char)cp;
    else if (cp < 0x800) {
        out[(*n)++] = (char)(0xC0 | cp >> 6);
        out[(*n)++] = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out[(*n)++] = (char)(0xE0 | cp >> 12);
        out[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[(*n)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        out[(*n)++] = (char)(0xF0 | cp >> 18);
        out[(*n)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[(*n)++] = (char)(0x80 | (cp & 0x3F));
    }
}

/* A "basic" string (escapes) or a 'literal' string, r->p at the quote. */
static int read_string(reader *r, value *v) {
    char q = *r->p;
    if (r->end - r->p >= 3 && r->p[1] == q && r->p[2] == q)
        return rerr(r, "multi-line strings are not supported");
    r->p++;
    size_t n = 0;
    for (;;) {
        if (r->p >= r->end || *r->p == '\n' || *r->p == '\r') return rerr(r, "unterminated string");
        unsigned char ch = (unsigned char)*r->p++;
        if (ch == (unsigned char)q) break;
        if (n + 5 > sizeof v->str) return rerr(r, "string longer than %d bytes", MAX_STRING - 5);
        if ((ch < 0x20 && ch != '\t') || ch == 0x7F)
            return rerr(r, "control character 0x%02x in a string (write it as an escape)", ch);
        if (ch != '\\' || q == '\'') {
            v->str[n++] = (char)ch;
            continue;
        }
        if (r->p >= r->end) return rerr(r, "unterminated string");
        char e = *r->p++;
        switch (e) {
        case 'b': v->str[n++] = '\b'; break;
        case 't': v->str[n++] = '\t'; break;
        case 'n': v->str[n++] = '\n'; break;
        case 'f': v->str[n++] = '\f'; break;
        case 'r': v->str[n++] = '\r'; break;
        case '"': v->str[n++] = '"'; break;
        case '\\': v->str[n++] = '\\'; break;
        case 'u':
        case 'U': {
            int digits = e == 'u' ? 4 : 8;
            uint32_t cp = 0;
            for (int i = 0; i < digits; i++) {
                char h = r->p < r->end ? *r->p : 0;
                int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                        : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
                if (d < 0) return rerr(r, "\\%c needs %d hex digits", e, digits);
                cp = cp * 16 + (uint32_t)d;
                r->p++;
            }
            if (cp == 0 || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
                return rerr(r, "\\%c%0*X is not a valid character here", e, digits, cp);
            utf8_put(v->str, &n, cp);
            break;
        }
        default: return rerr(r, "unknown escape \\%c in a string", e);
        }
    }
    v->str[n] = 0;
    v->type = V_STRING;
    return 0;
}

/* Skips an array or inline table (for ignored keys), which may span lines. */
static int skip_compound(reader *r) {
    int depth = 0;
    int start_line = r->line;
    while (r->p < r->end) {
        char ch = *r->p;
        if (ch == '"' || ch == '\'') {
            value tmp;
            if (read_string(r, &tmp)) return -1;
            continue;
        }
        if (ch == '#') {
            while (r->p < r->end && *r->p != '\n') r->p++;
            continue;
        }
        if (ch == '\n') r->line++;
        r->p++;
        if (ch == '[' || ch == '{') depth++;
        else if (ch == ']' || ch == '}') {
            if (--depth == 0) return 0;
        }
    }
    r->line = start_line;
    return rerr(r, "unterminated array or table");
}

/* A value at r->p. Arrays and inline tables are refused unless allow_compound. */
static int read_value(reader *r, value *v, int allow_compound) {
    const char *start = r->p;
    if (r->p >= r->end || at_eol(r) || *r->p == '#') return rerr(r, "missing value after '='");
    char ch = *r->p;
    if (ch == '"' || ch == '\'') {
        if (read_string(r, v)) return -1;
    } else if (ch == '[' || ch == '{') {
        if (!allow_compound)
            return rerr(r, "%s are not supported", ch == '[' ? "arrays" : "inline tables");
        if (skip_compound(r)) return -1;
        v->type = V_COMPOUND; /* its text, cut, in str (exclude_from_loading reads its names) */
        size_t n = (size_t)(r->p - start) < MAX_STRING - 1 ? (size_t)(r->p - start) : MAX_STRING - 1;
        memcpy(v->str, start, n);
        v->str[n] = 0;
    } else {
        const char *e = r->p;
        while (e < r->end && *e != ' ' && *e != '\t' && *e != '\n' && *e != '\r' && *e != '#') e++;
        size_t n = (size_t)(e - r->p);
        const char *why = "";
        tsr_cfg_set_shown(v, r->p, n);
        if (n == 4 && memcmp(r->p, "true", 4) == 0) v->type = V_BOOL, v->b = true;
        else if (n == 5 && memcmp(r->p, "false", 5) == 0) v->type = V_BOOL, v->b = false;
        else {
            int t = tsr_cfg_parse_number(r->p, n, &v->i, &v->f, &why);
            if (t < 0) {
                int alpha = (*r->p >= 'a' && *r->p <= 'z') || (*r->p >= 'A' && *r->p <= 'Z');
                return rerr(r, "invalid value '%s': %s", v->shown,
                            alpha ? "strings need quotes" : why);
            }
            v->type = t;
        }
        r->p = e;
    }
    tsr_cfg_set_shown(v, start, (size_t)(r->p - start));
    return 0;
}

static int read_header(reader *r) {
    r->p++; /* '[' */
    if (r->p < r->end && *r->p == '[') return rerr(r, "arrays of tables ([[...]]) are not supported");
    skip_ws(r);
    if (r->p < r->end && (*r->p == '"' || *r->p == '\'')) return rerr(r, "quoted section names are not supported");
    char name[128], dotted_name[128], part[128];
    size_t n = read_bare(r, name, sizeof name);
    if (n == 0) return rerr(r, "expected a section name after '['");
    if (n >= sizeof name) return rerr(r, "section name too long");
    int dotted = 0;
    snprintf(dotted_name, sizeof dotted_name, "%s", name);
    for (;;) {
        skip_ws(r);
        if (r->p >= r->end || *r->p != '.') break;
        r->p++;
        skip_ws(r);
        size_t pn = read_bare(r, part, sizeof part), dn = strlen(dotted_name);
        if (!pn) return rerr(r, "expected a name after '.' in the section name");
        if (dn + 1 + pn >= sizeof dotted_name) return rerr(r, "section name too long");
        dotted_name[dn] = '.';
        memcpy(dotted_name + dn + 1, part, pn + 1);
        dotted = 1;
    }
    if (r->p >= r->end || *r->p != ']') return rerr(r, "expected ']' to close the section name");
    r->p++;
    char sug[192];
    /* Dotted names only occur in TorchTitan sections tessera ignores ([quantize.linear.float8]). */
    if (dotted && tsr_cfg_section(name) != S_IGNORED)
        return rerr(r, "dotted section names are not supported ([%s])", dotted_name);
    if (tsr_cfg_section(name) == S_UNKNOWN)
        return rerr(r, "unknown section [%s]%s", name, tsr_cfg_suggest_section(name, sug, sizeof sug));
    /* The table itself must be new (TOML forbids defining a table twice). */
    char full[256];
    snprintf(full, sizeof full, "[%s]", dotted_name);
    for (size_t i = 0; i < r->n_seen; i++)
        if (strcmp(r->seen[i].name, full) == 0)
            return rerr(r, "section %s defined twice (first at line %d)", full, r->seen[i].line);
    if (tsr_grow((void **)&r->seen, &r->cap_seen, r->n_seen, sizeof *r->seen))
        return tsr_err(r->err, TSR_ENOMEM, "%s: out of memory", r->path);
    snprintf(r->seen[r->n_seen].name, sizeof r->seen[0].name, "%s", full);
    r->seen[r->n_seen++].line = r->line;
    snprintf(r->section, sizeof r->section, "%s", dotted_name);
    r->section_ignored = dotted;
    return expect_eol(r, "the section name");
}

static int read_keyval(reader *r) {
    char key[128], where[TSR_ERROR_MSG / 2];
    if (*r->p == '"' || *r->p == '\'') return rerr(r, "quoted keys are not supported");
    size_t n = read_bare(r, key, sizeof key);
    if (n == 0) {
        unsigned char ch = (unsigned char)*r->p;
        if (ch < 0x20 || ch >= 0x7F) return rerr(r, "unexpected byte 0x%02x", ch);
        return rerr(r, "expected a key, a [section] or a comment, got '%c'", ch);
    }
    if (n >= sizeof key) return rerr(r, "key too long");
    skip_ws(r);
    if (r->p < r->end && *r->p == '.') return rerr(r, "dotted keys are not supported (%s.)", key);
    if (r->p >= r->end || *r->p != '=') return rerr(r, "expected '=' after the key %s", key);
    r->p++;
    skip_ws(r);
    if (!r->section[0]) return rerr(r, "key %s is outside any [section]", key);
    const keydef *k = NULL;
    int what = r->section_ignored ? T_IGNORED : tsr_cfg_classify(r->section, key, &k);
    char sug[192];
    if (what == T_UNKNOWN_KEY)
        return rerr(r, "unknown key %s.%s%s", r->section, key, tsr_cfg_suggest_key(r->section, key, sug, sizeof sug));
    value *v = malloc(sizeof *v);
    if (!v) return tsr_err(r->err, TSR_ENOMEM, "%s: out of memory", r->path);
    int line = r->line;
    int rc = read_value(r, v, what == T_IGNORED);
    if (rc == 0) rc = expect_eol(r, "the value");
    /* duplicates: by canonical key, so an alias and its key clash too */
    char full[256];
    if (rc == 0) {
        if (what == T_KEY) snprintf(full, sizeof full, "%s.%s", k->section, k->key);
        else snprintf(full, sizeof full, "%s.%s", r->section, key);
        for (size_t i = 0; i < r->n_seen; i++)
            if (strcmp(r->seen[i].name, full) == 0) {
                rc = rerr(r, "duplicate key %s (first set at line %d)", full, r->seen[i].line);
                break;
            }
    }
    if (rc == 0) {
        snprintf(where, sizeof where, "%s:%d", r->path, line);
        const keydef *set;
        if (r->section_ignored) {
            if (!(v->type == V_BOOL && !v->b))
                tsr_cfg_warn(r->c, "%s: ignored on CPU: %s.%s = %s", where, r->section, key, v->shown);
        } else
            rc = tsr_cfg_apply(r->c, where, r->section, key, v, &set, r->err);
    }
    if (rc == 0) {
        if (tsr_grow((void **)&r->seen, &r->cap_seen, r->n_seen, sizeof *r->seen))
            rc = tsr_err(r->err, TSR_ENOMEM, "%s: out of memory", r->path);
        else {
            snprintf(r->seen[r->n_seen].name, sizeof r->seen[0].name, "%s", full);
            r->seen[r->n_seen++].line = line;
        }
    }
    free(v);
    return rc;
}

static int parse_text(reader *r) {
    if (r->end - r->p >= 3 && memcmp(r->p, "\xEF\xBB\xBF", 3) == 0) r->p += 3; /* UTF-8 BOM */
    while (r->p < r->end) {
        skip_ws(r);
        if (r->p >= r->end) break;
        char ch = *r->p;
        int rc = 0;
        if (ch == '#') {
            while (r->p < r->end && *r->p != '\n') {
                if (*r->p == 0) return rerr(r, "NUL byte in a comment");
                r->p++;
            }
        } else if (ch == '[') rc = read_header(r);
        else if (!at_eol(r)) rc = read_keyval(r);
        if (rc) return rc;
        if (r->p < r->end && *r->p == '\r') r->p++;
        if (r->p < r->end) {
            if (*r->p != '\n') return rerr(r, "unexpected character 0x%02x", (unsigned char)*r->p);
            r->p++;
            r->line++;
        }
    }
    return 0;
}

int tsr_config_load(tsr_train_config *c, const char *path, tsr_error *err) {
    tsr_config_defaults(c);
    if (!path) return 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return tsr_err(err, errno == ENOENT ? TSR_ENOTFOUND : TSR_EIO, "%s: cannot open: %s", path,
                       strerror(errno));
    char *text = malloc(MAX_FILE_BYTES + 1);
    if (!text) {
        fclose(f);
        return tsr_err(err, TSR_ENOMEM, "%s: out of memory", path);
    }
    size_t n = fread(text, 1, MAX_FILE_BYTES + 1, f);
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(text);
        return tsr_err(err, TSR_EIO, "%s: read error", path);
    }
    if (n > MAX_FILE_BYTES) {
        free(text);
        return tsr_err(err, TSR_EINVAL, "%s: larger than %u bytes: not a job config", path, MAX_FILE_BYTES);
    }
    int rc = tsr_config_parse(c, path, text, n, err);
    free(text);
    return rc;
}

int tsr_config_parse(tsr_train_config *c, const char *name, const char *text, size_t len, tsr_error *err) {
    reader r = {.path = name, .p = text, .end = text + len, .line = 1, .c = c, .err = err};
    int rc = parse_text(&r);
    free(r.seen);
    return rc;
}

/* ------------------------------------------------------------ overrides */

int tsr_config_override(tsr_train_config *c, const char *arg, tsr_error *err) {
    const char *a = arg;
    if (strncmp(a, "--", 2) == 0) a += 2;
    const char *eq = strchr(a, '=');
    const char *dot = memchr(a, '.', eq ? (size_t)(eq - a) : strlen(a));
    size_t name_len = eq ? (size_t)(eq - a) : strlen(a);
    if (!dot || dot == a || (size_t)(dot - a) + 1 >= name_len)
        return tsr_err(err, TSR_EINVAL, "%s: expected --section.key=value", arg);
    char section[128], key[128];
    size_t sl = (size_t)(dot - a), kl = name_len - sl - 1;
    if (sl >= sizeof section || kl >= sizeof key) return tsr_err(err, TSR_EINVAL, "%s: key too long", arg);
    memcpy(section, a, sl);
    section[sl] = 0;
    memcpy(key, dot + 1, kl);
    key[kl] = 0;
    if (strchr(key, '.')) return tsr_err(err, TSR_EINVAL, "%s: dotted keys are not supported", arg);

    const keydef *k = NULL;
    int what = tsr_cfg_classify(section, key, &k);
    value *v = calloc(1, sizeof *v);
    if (!v) return tsr_err(err, TSR_ENOMEM, "%s: out of memory", arg);
    int rc = 0;
    if (!eq) {
        /* "--checkpoint.enable": a boolean key alone means true, as in TorchTitan */
        if ((what == T_KEY && k->kind != K_BOOL) || what == T_MUST_BE_ONE)
            rc = tsr_err(err, TSR_EINVAL, "%s: needs a value (--%s.%s=VALUE)", arg, section, key);
        v->type = V_BOOL;
        v->b = true;
        snprintf(v->shown, sizeof v->shown, "true");
    } else {
        const char *s = eq + 1;
        size_t n = strlen(s);
        int want = what == T_KEY ? k->kind : what == T_MUST_BE_ONE ? K_INT : K_STR;
        const char *why;
        if (n >= sizeof v->str) {
            rc = tsr_err(err, TSR_EINVAL, "%s: value longer than %zu bytes", arg, sizeof v->str - 1);
        } else if (want == K_STR || want == K_CHOICE) {
            v->type = V_STRING;
            memcpy(v->str, s, n + 1);
            snprintf(v->shown, sizeof v->shown, what == T_IGNORED ? "%.80s" : "\"%.80s\"", s);
            /* an ignored key given false on the command line is as quiet as in a file */
            if (what == T_IGNORED && strcmp(s, "false") == 0) v->type = V_BOOL, v->b = false;
        } else if (want == K_BOOL) {
            snprintf(v->shown, sizeof v->shown, "\"%.80s\"", s);
            if (strcmp(s, "true") == 0) v->type = V_BOOL, v->b = true;
            else if (strcmp(s, "false") == 0) v->type = V_BOOL, v->b = false;
            else v->type = V_STRING, memcpy(v->str, s, n + 1);
        } else {
            snprintf(v->shown, sizeof v->shown, "%.80s", s);
            int t = tsr_cfg_parse_number(s, n, &v->i, &v->f, &why);
            if (t < 0) {
                v->type = V_STRING;
                memcpy(v->str, s, n + 1);
                snprintf(v->shown, sizeof v->shown, "\"%.80s\"", s);
            } else v->type = t;
        }
    }
    if (rc == 0) {
        const keydef *set;
        char where[TSR_ERROR_MSG / 2];
        snprintf(where, sizeof where, "%s", arg);
        if (what == T_IGNORED && !(!strcmp(section, "checkpoint") && !strcmp(key, "exclude_from_loading"))) {
            if (!(v->type == V_BOOL && !v->b))
                tsr_cfg_warn(c, "command line: ignored on CPU: %s.%s = %s", section, key, v->shown);
        } else /* (exclude_from_loading: its check) */
            rc = tsr_cfg_apply(c, where, section, key, v, &set, err);
    }
    free(v);
    return rc;
}
