/* config_impl.h: what the parts of the job config share: config.c (the table
 * of keys, values stored into fields, the writer), config_toml.c (the TOML
 * reader and the command-line overrides) and config_check.c (defaults,
 * validation, the learning rate). Not a public interface. */
#ifndef TSR_CONFIG_IMPL_H
#define TSR_CONFIG_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

#define MAX_STRING 4096 /* bytes of one decoded string value */

/* ------------------------------------------------------------ the keys */

enum kind { K_STR, K_INT, K_FLOAT, K_BOOL, K_CHOICE };

enum {
    F_MINUS1 = 1,    /* -1 is also allowed (it means "unset" / "resolve later") */
    F_LO_OPEN = 2,   /* the value must be > lo, not >= lo */
    F_HI_OPEN = 4,   /* the value must be < hi, not <= hi */
    F_NONEMPTY = 8,  /* a string that must not be empty */
    F_OURS = 16,     /* tessera's own key: not in TorchTitan */
};

typedef struct choice {
    const char *name; /* the first name of each value is the canonical one */
    int value;
} choice;

typedef struct keydef {
    const char *section, *key;
    int kind;
    size_t off, size; /* the field in tsr_train_config; size: bytes of a string field */
    double lo, hi;    /* allowed range of an int or float */
    int flags;
    const choice *choices; /* K_CHOICE: NULL-terminated */
    const char *minus1;    /* F_MINUS1: what -1 means, for messages */
} keydef;

/* What a (section, key) names. */
enum { T_KEY, T_IGNORED, T_MUST_BE_ONE, T_UNKNOWN_KEY, T_UNKNOWN_SECTION };
/* tsr_cfg_classify(): what section.key names; *k gets the key (aliases
 * resolved) when it is T_KEY. */
int tsr_cfg_classify(const char *section, const char *key, const keydef **k);

/* What a section name is: one of tessera's, one of TorchTitan's that tessera
 * ignores, or unknown. */
enum { S_UNKNOWN, S_KNOWN, S_IGNORED };
int tsr_cfg_section(const char *name);

/* " (did you mean X?)" into buf when a known key or section is close to the
 * one given, else "". @return buf */
const char *tsr_cfg_suggest_key(const char *section, const char *key, char *buf, size_t len);
const char *tsr_cfg_suggest_section(const char *section, char *buf, size_t len);

/* tsr_cfg_warn(): one line appended to c->warnings (counted even when there is
 * no room for its text). */
void tsr_cfg_warn(tsr_train_config *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ------------------------------------------------------------ values */

/* A value as read from the file or the command line. */
enum vtype { V_STRING, V_INT, V_FLOAT, V_BOOL, V_COMPOUND };

typedef struct value {
    int type;
    char str[MAX_STRING]; /* V_STRING, decoded */
    int64_t i;
    double f;
    bool b;
    char shown[96]; /* the value as the user wrote it, cut, for messages */
} value;

/* tsr_cfg_set_shown(): v->shown from the n bytes the user wrote at s (newlines
 * as spaces, cut with "..."). */
void tsr_cfg_set_shown(value *v, const char *s, size_t n);
/* tsr_cfg_parse_number(): a TOML decimal integer or float from exactly s[0..n)
 * (underscores allowed between digits). @return V_INT, V_FLOAT, or -1 with a
 * reason in *why. */
int tsr_cfg_parse_number(const char *s, size_t n, int64_t *iv, double *fv, const char **why);
/* tsr_cfg_apply(): stores v into section.key of c, warns about an ignored key,
 * or fails (TSR_EINVAL) naming `where` ("FILE:LINE" or the argument) and the
 * reason. *set_key receives the key set (NULL when ignored). */
int tsr_cfg_apply(tsr_train_config *c, const char *where, const char *section, const char *key, const value *v,
                  const keydef **set_key, tsr_error *err);

#endif
