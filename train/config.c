/* config.c: the job config: a hand-written reader for the TOML subset of
 * TorchTitan's job configs, command-line overrides, validation against the
 * world size, and the effective config written back as TOML.
 *
 * Every key tessera honours is one row of `keys` below (section, name, type,
 * field, allowed range); the reader, the overrides and the writer all walk
 * that table, so a new key is one new row. */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common.h"

#define MAX_FILE_BYTES (1u << 20) /* a job config is a few KiB; refuse anything huge */
#define MAX_STRING 4096           /* bytes of one decoded string value */

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

static const choice flavor_choices[] = {
    {"debug", TSR_FLAVOR_DEBUG}, {"small", TSR_FLAVOR_SMALL}, {"124m", TSR_FLAVOR_124M},
    {"1b", TSR_FLAVOR_1B},       {"8b", TSR_FLAVOR_8B},       {"debugmodel", TSR_FLAVOR_DEBUG},
    {"checkpoint", TSR_FLAVOR_CHECKPOINT}, {NULL, 0},
};
static const choice decay_choices[] = {
    {"linear", TSR_DECAY_LINEAR}, {"sqrt", TSR_DECAY_SQRT}, {"cosine", TSR_DECAY_COSINE}, {NULL, 0},
};
static const choice async_choices[] = {
    {"disabled", TSR_ASYNC_DISABLED}, {"async", TSR_ASYNC_ON},
    {"async_with_pinned_mem", TSR_ASYNC_ON}, {NULL, 0},
};
static const choice sched_choices[] = {
    {"1F1B", TSR_SCHED_1F1B}, {"GPipe", TSR_SCHED_GPIPE}, {NULL, 0},
};
static const choice dtype_choices[] = {
    {"float32", TSR_F32}, {"bfloat16", TSR_BF16}, {NULL, 0},
};

/* store() writes choice fields through an int and tells int from int64_t fields by size. */
_Static_assert(sizeof(tsr_flavor) == sizeof(int) && sizeof(tsr_decay_type) == sizeof(int) &&
                   sizeof(tsr_async_mode) == sizeof(int) && sizeof(tsr_pp_schedule) == sizeof(int),
               "choice fields are stored as int");
_Static_assert(sizeof(int) != sizeof(int64_t), "int and int64_t fields are told apart by size");

#define OFF(f) offsetof(tsr_train_config, f), sizeof(((tsr_train_config *)0)->f)
#define BIG 2147483647.0 /* INT_MAX: no upper bound */

/* In the order tsr_config_to_toml writes them. */
static const keydef keys[] = {
    {"job", "dump_folder", K_STR, OFF(job.dump_folder), 0, 0, F_NONEMPTY, NULL, NULL},
    {"job", "description", K_STR, OFF(job.description), 0, 0, 0, NULL, NULL},

    {"model", "name", K_STR, OFF(model.name), 0, 0, F_NONEMPTY, NULL, NULL},
    {"model", "flavor", K_CHOICE, OFF(model.flavor), 0, 0, 0, flavor_choices, NULL},

    {"optimizer", "name", K_STR, OFF(optimizer.name), 0, 0, F_NONEMPTY, NULL, NULL},
    {"optimizer", "lr", K_FLOAT, OFF(optimizer.lr), 0, 1e9, F_LO_OPEN, NULL, NULL},
    {"optimizer", "beta1", K_FLOAT, OFF(optimizer.beta1), 0, 1, F_HI_OPEN, NULL, NULL},
    {"optimizer", "beta2", K_FLOAT, OFF(optimizer.beta2), 0, 1, F_HI_OPEN, NULL, NULL},
    {"optimizer", "eps", K_FLOAT, OFF(optimizer.eps), 0, 1, F_LO_OPEN, NULL, NULL},
    {"optimizer", "weight_decay", K_FLOAT, OFF(optimizer.weight_decay), 0, 1e9, 0, NULL, NULL},

    {"lr_scheduler", "warmup_steps", K_INT, OFF(lr_scheduler.warmup_steps), 0, BIG, 0, NULL, NULL},
    {"lr_scheduler", "decay_ratio", K_FLOAT, OFF(lr_scheduler.decay_ratio), 0, 1, F_MINUS1, NULL,
     "unset: decay starts right after warmup"},
    {"lr_scheduler", "decay_type", K_CHOICE, OFF(lr_scheduler.decay_type), 0, 0, 0, decay_choices, NULL},
    {"lr_scheduler", "min_lr_factor", K_FLOAT, OFF(lr_scheduler.min_lr_factor), 0, 1, 0, NULL, NULL},

    {"training", "local_batch_size", K_INT, OFF(training.local_batch_size), 1, BIG, 0, NULL, NULL},
    {"training", "global_batch_size", K_INT, OFF(training.global_batch_size), 1, BIG, F_MINUS1, NULL,
     "local_batch_size * data-parallel degree"},
    {"training", "seq_len", K_INT, OFF(training.seq_len), 1, BIG, 0, NULL, NULL},
    {"training", "max_norm", K_FLOAT, OFF(training.max_norm), 0, 1e30, F_LO_OPEN, NULL, NULL},
    {"training", "steps", K_INT, OFF(training.steps), 1, BIG, 0, NULL, NULL},
    {"training", "seed", K_INT, OFF(training.seed), 0, 9007199254740992.0, F_MINUS1, NULL,
     "unset: the default seed 42"},
    {"training", "dataset", K_STR, OFF(training.dataset), 0, 0, F_NONEMPTY, NULL, NULL},
    {"training", "dataset_path", K_STR, OFF(training.dataset_path), 0, 0, 0, NULL, NULL},
    {"training", "skip_data_after_step", K_INT, OFF(training.skip_data_after_step), 0, BIG, F_MINUS1 | F_OURS, NULL,
     "no skip"},
    {"training", "skip_data_steps", K_INT, OFF(training.skip_data_steps), 0, BIG, F_OURS, NULL, NULL},

    {"parallelism", "data_parallel_replicate_degree", K_INT,
     OFF(parallelism.data_parallel_replicate_degree), 1, BIG, 0, NULL, NULL},
    {"parallelism", "data_parallel_shard_degree", K_INT, OFF(parallelism.data_parallel_shard_degree),
     1, BIG, F_MINUS1, NULL, "the rest of the ranks"},
    {"parallelism", "tensor_parallel_degree", K_INT, OFF(parallelism.tensor_parallel_degree), 1, BIG,
     0, NULL, NULL},
    {"parallelism", "pipeline_parallel_degree", K_INT, OFF(parallelism.pipeline_parallel_degree), 1,
     BIG, 0, NULL, NULL},
    {"parallelism", "pipeline_parallel_microbatch_size", K_INT,
     OFF(parallelism.pipeline_parallel_microbatch_size), 1, BIG, 0, NULL, NULL},
    {"parallelism", "pipeline_parallel_schedule", K_CHOICE, OFF(parallelism.pipeline_parallel_schedule),
     0, 0, 0, sched_choices, NULL},

    {"checkpoint", "enable", K_BOOL, OFF(checkpoint.enable), 0, 0, 0, NULL, NULL},
    {"checkpoint", "folder", K_STR, OFF(checkpoint.folder), 0, 0, F_NONEMPTY, NULL, NULL},
    {"checkpoint", "interval", K_INT, OFF(checkpoint.interval), 1, BIG, 0, NULL, NULL},
    {"checkpoint", "keep_latest_k", K_INT, OFF(checkpoint.keep_latest_k), 0, BIG, 0, NULL, NULL},
    {"checkpoint", "async_mode", K_CHOICE, OFF(checkpoint.async_mode), 0, 0, 0, async_choices, NULL},
    {"checkpoint", "load_step", K_INT, OFF(checkpoint.load_step), 0, BIG, F_MINUS1, NULL,
     "the newest checkpoint"},
    {"checkpoint", "last_save_model_only", K_BOOL, OFF(checkpoint.last_save_model_only), 0, 0, 0, NULL,
     NULL},
    {"checkpoint", "export_dtype", K_CHOICE, OFF(checkpoint.export_dtype), 0, 0, 0, dtype_choices, NULL},
    {"checkpoint", "initial_load_path", K_STR, OFF(checkpoint.initial_load_path), 0, 0, 0, NULL, NULL},
    {"checkpoint", "initial_load_model_only", K_BOOL, OFF(checkpoint.initial_load_model_only), 0, 0, 0,
     NULL, NULL},
    {"checkpoint", "archive_url", K_STR, OFF(checkpoint.archive_url), 0, 0, F_OURS, NULL, NULL},
    {"checkpoint", "archive_interval", K_INT, OFF(checkpoint.archive_interval), 1, BIG, F_OURS, NULL, NULL},
    {"checkpoint", "archive_keep_latest_k", K_INT, OFF(checkpoint.archive_keep_latest_k), 0, BIG, F_OURS, NULL,
     NULL},
    {"checkpoint", "commit_timeout_s", K_FLOAT, OFF(checkpoint.commit_timeout_s), 0, 1e9, F_OURS, NULL, NULL},

    {"metrics", "log_freq", K_INT, OFF(metrics.log_freq), 1, BIG, 0, NULL, NULL},
    {"metrics", "file", K_STR, OFF(metrics.file), 0, 0, F_NONEMPTY | F_OURS, NULL, NULL},
};
#define N_KEYS (sizeof keys / sizeof keys[0])

/* Older TorchTitan names of keys above. */
static const struct {
    const char *section, *key, *to_section, *to_key;
} aliases[] = {
    {"training", "batch_size", "training", "local_batch_size"},
    {"checkpoint", "enable_checkpoint", "checkpoint", "enable"},
    {"checkpoint", "model_weights_only", "checkpoint", "last_save_model_only"},
    {"lr_scheduler", "lr_min", "lr_scheduler", "min_lr_factor"},
    {"debug", "seed", "training", "seed"},
};
#define N_ALIASES (sizeof aliases / sizeof aliases[0])

/* TorchTitan keys of the sections above that tessera accepts and ignores. */
static const struct {
    const char *section, *key;
} ignored_keys[] = {
    {"job", "config_file"}, {"job", "use_for_integration_test"}, {"job", "print_args"},
    {"metrics", "enable_tensorboard"}, {"metrics", "disable_color_printing"},
    {"metrics", "save_tb_folder"}, {"metrics", "save_for_all_ranks"}, {"metrics", "enable_wandb"},
    {"model", "tokenizer_path"}, {"model", "hf_assets_path"}, {"model", "converters"},
    {"model", "print_after_conversion"},
    {"optimizer", "implementation"}, {"optimizer", "early_step_in_backward"},
    {"training", "enable_cpu_offload"}, {"training", "mixed_precision_param"},
    {"training", "mixed_precision_reduce"}, {"training", "compile"}, {"training", "gc_freq"},
    {"training", "gc_debug"}, {"training", "deterministic"}, {"training", "dtype"},
    {"parallelism", "enable_compiled_autograd"}, {"parallelism", "fsdp_reshard_after_forward"},
    {"parallelism", "disable_loss_parallel"}, {"parallelism", "enable_async_tensor_parallel"},
    {"parallelism", "enable_sequence_parallel"}, {"parallelism", "pipeline_parallel_split_points"},
    {"parallelism", "module_fqns_per_model_part"},
    {"parallelism", "pipeline_parallel_first_stage_less_layers"},
    {"parallelism", "pipeline_parallel_last_stage_less_layers"},
    {"parallelism", "pipeline_parallel_layers_per_stage"},
    {"parallelism", "pipeline_parallel_schedule_csv"},
    {"parallelism", "context_parallel_rotate_method"}, {"parallelism", "context_parallel_load_balancer"},
    {"checkpoint", "create_seed_checkpoint"}, {"checkpoint", "last_save_in_hf"},
    {"checkpoint", "initial_load_in_hf"}, {"checkpoint", "exclude_from_loading"},
    {"checkpoint", "enable_first_step_checkpoint"},
};
#define N_IGNORED (sizeof ignored_keys / sizeof ignored_keys[0])

/* TorchTitan degrees of parallelism tessera does not have: accepted only as 1,
 * since any other value changes how the ranks are laid out. */
static const char *const must_be_one[] = {
    "context_parallel_degree", "expert_parallel_degree", "expert_tensor_parallel_degree",
};
#define N_MUST_BE_ONE (sizeof must_be_one / sizeof must_be_one[0])

/* TorchTitan sections tessera ignores entirely (GPU, compiler, profiler, ...). */
static const char *const ignored_sections[] = {
    "profiling", "activation_checkpoint", "compile", "float8", "mx", "quantize", "comm",
    "memory_estimation", "fault_tolerance", "experimental", "validation", "debug",
};
#define N_IGNORED_SECTIONS (sizeof ignored_sections / sizeof ignored_sections[0])

static const char *const sections[] = {
    "job", "model", "optimizer", "lr_scheduler", "training", "parallelism", "checkpoint", "metrics",
};
#define N_SECTIONS (sizeof sections / sizeof sections[0])

/* ------------------------------------------------------------ small helpers */

static int in_list(const char *s, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(s, list[i]) == 0) return 1;
    return 0;
}

static const keydef *find_key(const char *section, const char *key) {
    for (size_t i = 0; i < N_KEYS; i++)
        if (strcmp(keys[i].section, section) == 0 && strcmp(keys[i].key, key) == 0) return &keys[i];
    return NULL;
}

/* Levenshtein distance, for "did you mean". Long strings are never close. */
static size_t edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 127 || lb > 127) return (size_t)-1;
    size_t row[128];
    for (size_t j = 0; j <= lb; j++) row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

typedef struct suggester {
    const char *want;
    size_t best;
    char out[256];
} suggester;

static void suggest_try(suggester *s, const char *cand) {
    size_t d = edit_distance(s->want, cand);
    if (d < s->best) {
        s->best = d;
        snprintf(s->out, sizeof s->out, "%s", cand);
    }
}

/* " (did you mean X?)" when X is close to `want`, else "". */
static const char *suggest_done(suggester *s, char *buf, size_t len) {
    size_t n = strlen(s->want), limit = n / 5;
    if (limit < 1) limit = 1;
    if (limit > 3) limit = 3;
    if (s->out[0] && s->best <= limit) snprintf(buf, len, " (did you mean %s?)", s->out);
    else buf[0] = 0;
    return buf;
}

/* The closest known "section.key" to section.key: a known key of that name in
 * another section wins (e.g. training.lr -> optimizer.lr). */
static const char *suggest_key(const char *section, const char *key, char *buf, size_t len) {
    char want[256], full[256];
    snprintf(want, sizeof want, "%s.%s", section, key);
    for (size_t i = 0; i < N_KEYS; i++)
        if (strcmp(keys[i].key, key) == 0) {
            snprintf(buf, len, " (did you mean %s.%s?)", keys[i].section, keys[i].key);
            return buf;
        }
    suggester s = {want, (size_t)-1, ""};
    for (size_t i = 0; i < N_KEYS; i++) {
        snprintf(full, sizeof full, "%s.%s", keys[i].section, keys[i].key);
        suggest_try(&s, full);
    }
    for (size_t i = 0; i < N_IGNORED; i++) {
        snprintf(full, sizeof full, "%s.%s", ignored_keys[i].section, ignored_keys[i].key);
        suggest_try(&s, full);
    }
    for (size_t i = 0; i < N_MUST_BE_ONE; i++) {
        snprintf(full, sizeof full, "parallelism.%s", must_be_one[i]);
        suggest_try(&s, full);
    }
    return suggest_done(&s, buf, len);
}

static const char *suggest_section(const char *section, char *buf, size_t len) {
    suggester s = {section, (size_t)-1, ""};
    for (size_t i = 0; i < N_SECTIONS; i++) suggest_try(&s, sections[i]);
    for (size_t i = 0; i < N_IGNORED_SECTIONS; i++) suggest_try(&s, ignored_sections[i]);
    return suggest_done(&s, buf, len);
}

/* The shortest decimal text that reads back as x, always with a '.' or an
 * exponent so that TOML reads it as a float. */
static void fmt_double(char *buf, size_t len, double x) {
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, len, "%.*g", prec, x);
        if (strtod(buf, NULL) == x) break;
    }
    if (!strpbrk(buf, ".eEn")) {
        size_t n = strlen(buf);
        if (n + 3 <= len) memcpy(buf + n, ".0", 3);
    }
}

static void add_warning(tsr_train_config *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add_warning(tsr_train_config *c, const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    c->n_warnings++;
    size_t have = strlen(c->warnings), n = strlen(line);
    if (have + n + 2 > sizeof c->warnings) return; /* counted, but no room for the text */
    memcpy(c->warnings + have, line, n);
    c->warnings[have + n] = '\n';
    c->warnings[have + n + 1] = 0;
}

/* ------------------------------------------------------------ values */

enum vtype { V_STRING, V_INT, V_FLOAT, V_BOOL, V_COMPOUND };

typedef struct value {
    int type;
    char str[MAX_STRING]; /* V_STRING, decoded */
    int64_t i;
    double f;
    bool b;
    char shown[96]; /* the value as the user wrote it, cut, for messages */
} value;

static const char *vtype_name(int t) {
    switch (t) {
    case V_STRING: return "a string";
    case V_INT: return "an integer";
    case V_FLOAT: return "a float";
    case V_BOOL: return "a boolean";
    default: return "an array or table";
    }
}

static void set_shown(value *v, const char *s, size_t n) {
    size_t k = 0, cap = sizeof v->shown - 4;
    for (size_t j = 0; j < n && k < cap; j++) v->shown[k++] = (s[j] == '\n' || s[j] == '\r') ? ' ' : s[j];
    if (n > cap) memcpy(v->shown + k, "...", 3), k += 3;
    v->shown[k] = 0;
}

/* Reads a TOML decimal integer or float from exactly s[0..n). Underscores are
 * allowed between digits, as in TOML. @return V_INT, V_FLOAT, or -1 with a
 * reason in why. */
static int parse_number(const char *s, size_t n, int64_t *iv, double *fv, const char **why) {
    char digits[128];
    size_t k = 0, j = 0;
    int is_float = 0;
    *why = "not a number";
    if (n == 0 || n >= sizeof digits) return -1;
    if (s[j] == '+' || s[j] == '-') digits[k++] = s[j++];
    const char *rest = s + j;
    size_t rn = n - j;
    if ((rn == 3 && (memcmp(rest, "inf", 3) == 0 || memcmp(rest, "nan", 3) == 0))) {
        memcpy(digits + k, rest, 3);
        digits[k + 3] = 0;
        *fv = strtod(digits, NULL);
        return V_FLOAT;
    }
    /* integer part: 0, or a digit 1-9 followed by digits */
    size_t start = j;
    int last_digit = 0;
    while (j < n && ((s[j] >= '0' && s[j] <= '9') || s[j] == '_')) {
        if (s[j] == '_') {
            if (!last_digit || j + 1 >= n || s[j + 1] < '0' || s[j + 1] > '9') {
                *why = "an underscore must be between digits";
                return -1;
            }
            last_digit = 0;
        } else {
            digits[k++] = s[j];
            last_digit = 1;
        }
        j++;
    }
    if (j == start) return -1;
    if (s[start] == '0' && j - start > 1) {
        *why = "leading zeros are not allowed";
        return -1;
    }
    if (j < n && s[j] == '.') {
        is_float = 1;
        digits[k++] = s[j++];
        size_t f0 = j;
        while (j < n && s[j] >= '0' && s[j] <= '9') digits[k++] = s[j++];
        if (j == f0) {
            *why = "a digit must follow the decimal point";
            return -1;
        }
    }
    if (j < n && (s[j] == 'e' || s[j] == 'E')) {
        is_float = 1;
        digits[k++] = s[j++];
        if (j < n && (s[j] == '+' || s[j] == '-')) digits[k++] = s[j++];
        size_t e0 = j;
        while (j < n && s[j] >= '0' && s[j] <= '9') digits[k++] = s[j++];
        if (j == e0) {
            *why = "a digit must follow the exponent";
            return -1;
        }
    }
    if (j != n) return -1;
    digits[k] = 0;
    errno = 0;
    if (is_float) {
        *fv = strtod(digits, NULL);
        if (errno == ERANGE && isinf(*fv)) {
            *why = "the float is too large";
            return -1;
        }
        return V_FLOAT;
    }
    long long v = strtoll(digits, NULL, 10);
    if (errno == ERANGE) {
        *why = "the integer does not fit in 64 bits";
        return -1;
    }
    *iv = v;
    return V_INT;
}

/* "must be >= 1", "must be in [0, 1)", "must be > 0 or -1 (the rest of the ranks)" */
static void range_text(const keydef *k, char *buf, size_t len) {
    char lo[40], hi[40];
    if (k->kind == K_INT) {
        snprintf(lo, sizeof lo, "%.0f", k->lo);
        snprintf(hi, sizeof hi, "%.0f", k->hi);
    } else {
        snprintf(lo, sizeof lo, "%g", k->lo);
        snprintf(hi, sizeof hi, "%g", k->hi);
    }
    int has_hi = k->kind == K_FLOAT ? k->hi < 1e8 : k->hi < BIG;
    if (!has_hi) snprintf(buf, len, "must be %s %s", k->flags & F_LO_OPEN ? ">" : ">=", lo);
    else
        snprintf(buf, len, "must be in %c%s, %s%c", k->flags & F_LO_OPEN ? '(' : '[', lo, hi,
                 k->flags & F_HI_OPEN ? ')' : ']');
    if (k->flags & F_MINUS1) {
        size_t n = strlen(buf);
        snprintf(buf + n, len - n, " or -1 (%s)", k->minus1);
    }
}

static int choice_lookup(const choice *ch, const char *s, int *out) {
    for (const choice *c = ch; c->name; c++)
        if (strcasecmp(c->name, s) == 0) {
            *out = c->value;
            return 0;
        }
    return -1;
}

static const char *choice_name(const choice *ch, int v) {
    for (const choice *c = ch; c->name; c++)
        if (c->value == v) return c->name;
    return "?";
}

/* Stores v into the field of k. On a type or range error, writes the reason
 * (without the key) into why and returns -1. */
static int store(tsr_train_config *c, const keydef *k, const value *v, char *why, size_t len) {
    char *field = (char *)c + k->off;
    char range[160];
    switch (k->kind) {
    case K_STR:
        if (v->type != V_STRING) {
            snprintf(why, len, "expected a string, got %s (%s)", v->shown, vtype_name(v->type));
            return -1;
        }
        if (strlen(v->str) >= k->size) {
            snprintf(why, len, "the string is longer than %zu bytes", k->size - 1);
            return -1;
        }
        if ((k->flags & F_NONEMPTY) && !v->str[0]) {
            snprintf(why, len, "must not be empty");
            return -1;
        }
        if (strcmp(k->key, "name") == 0 && strcmp(k->section, "model") == 0 && strcmp(v->str, "llama3")) {
            snprintf(why, len, "\"%.64s\" is not supported: tessera trains \"llama3\" only", v->str);
            return -1;
        }
        if (strcmp(k->key, "name") == 0 && strcmp(k->section, "optimizer") == 0 &&
            strcasecmp(v->str, "AdamW")) {
            snprintf(why, len, "\"%.64s\" is not supported: tessera has \"AdamW\" only", v->str);
            return -1;
        }
        strcpy(field, v->str);
        return 0;
    case K_CHOICE: {
        int out;
        if (v->type != V_STRING) {
            snprintf(why, len, "expected a string, got %s (%s)", v->shown, vtype_name(v->type));
            return -1;
        }
        if (choice_lookup(k->choices, v->str, &out)) {
            size_t n = (size_t)snprintf(why, len, "\"%s\" is not one of", v->str);
            for (const choice *ch = k->choices; ch->name && n < len; ch++)
                n += (size_t)snprintf(why + n, len - n, "%s \"%s\"", ch == k->choices ? "" : ",", ch->name);
            suggester s = {v->str, (size_t)-1, ""};
            for (const choice *ch = k->choices; ch->name; ch++) suggest_try(&s, ch->name);
            char sug[160];
            if (n < len) snprintf(why + n, len - n, "%s", suggest_done(&s, sug, sizeof sug));
            return -1;
        }
        *(int *)(void *)field = out;
        return 0;
    }
    case K_BOOL:
        if (v->type != V_BOOL) {
            snprintf(why, len, "expected true or false, got %s (%s)", v->shown, vtype_name(v->type));
            return -1;
        }
        *(bool *)(void *)field = v->b;
        return 0;
    case K_INT: {
        if (v->type != V_INT) {
            snprintf(why, len, "expected an integer, got %s (%s)", v->shown, vtype_name(v->type));
            return -1;
        }
        int ok = (double)v->i >= k->lo && (double)v->i <= k->hi;
        if ((k->flags & F_MINUS1) && v->i == -1) ok = 1;
        if (!ok) {
            range_text(k, range, sizeof range);
            snprintf(why, len, "%lld is out of range: %s", (long long)v->i, range);
            return -1;
        }
        if (k->size == sizeof(int64_t)) *(int64_t *)(void *)field = v->i;
        else *(int *)(void *)field = (int)v->i;
        return 0;
    }
    case K_FLOAT: {
        double x;
        if (v->type == V_INT) x = (double)v->i;
        else if (v->type == V_FLOAT) x = v->f;
        else {
            snprintf(why, len, "expected a number, got %s (%s)", v->shown, vtype_name(v->type));
            return -1;
        }
        int ok = isfinite(x) && (k->flags & F_LO_OPEN ? x > k->lo : x >= k->lo) &&
                 (k->flags & F_HI_OPEN ? x < k->hi : x <= k->hi);
        if ((k->flags & F_MINUS1) && x == -1.0) ok = 1;
        if (!ok) {
            range_text(k, range, sizeof range);
            snprintf(why, len, "%s is out of range: %s", v->shown, range);
            return -1;
        }
        *(double *)(void *)field = x;
        return 0;
    }
    }
    return -1;
}

/* What a (section, key) names. */
enum { T_KEY, T_IGNORED, T_MUST_BE_ONE, T_UNKNOWN_KEY, T_UNKNOWN_SECTION };

static int classify(const char *section, const char *key, const keydef **k) {
    *k = find_key(section, key);
    if (*k) return T_KEY;
    for (size_t i = 0; i < N_ALIASES; i++)
        if (strcmp(aliases[i].section, section) == 0 && strcmp(aliases[i].key, key) == 0) {
            *k = find_key(aliases[i].to_section, aliases[i].to_key);
            return T_KEY;
        }
    if (strcmp(section, "parallelism") == 0 && in_list(key, must_be_one, N_MUST_BE_ONE)) return T_MUST_BE_ONE;
    for (size_t i = 0; i < N_IGNORED; i++)
        if (strcmp(ignored_keys[i].section, section) == 0 && strcmp(ignored_keys[i].key, key) == 0)
            return T_IGNORED;
    if (in_list(section, ignored_sections, N_IGNORED_SECTIONS)) return T_IGNORED;
    if (in_list(section, sections, N_SECTIONS)) return T_UNKNOWN_KEY;
    return T_UNKNOWN_SECTION;
}

/* Applies one value to section.key. `where` prefixes messages ("FILE:LINE").
 * *set_key receives the key set (NULL when ignored), for duplicate checks. */
static int apply(tsr_train_config *c, const char *where, const char *section, const char *key,
                 const value *v, const keydef **set_key, tsr_error *err) {
    const keydef *k = NULL;
    char why[TSR_ERROR_MSG / 2], sug[192];
    *set_key = NULL;
    switch (classify(section, key, &k)) {
    case T_KEY:
        if (store(c, k, v, why, sizeof why))
            return tsr_err(err, TSR_EINVAL, "%s: %s.%s: %s", where, section, key, why);
        *set_key = k;
        return 0;
    case T_MUST_BE_ONE:
        if (v->type != V_INT || v->i != 1)
            return tsr_err(err, TSR_EINVAL, "%s: %s.%s = %s: not supported by tessera (only 1 is)", where,
                           section, key, v->shown);
        return 0;
    case T_IGNORED:
        /* A disabled feature that is ignored changes nothing: no warning. */
        if (!(v->type == V_BOOL && !v->b)) add_warning(c, "%s: ignored on CPU: %s.%s = %s", where, section, key, v->shown);
        return 0;
    case T_UNKNOWN_SECTION:
        return tsr_err(err, TSR_EINVAL, "%s: unknown section %s in %s.%s%s", where, section, section, key,
                       suggest_key(section, key, sug, sizeof sug));
    default:
        return tsr_err(err, TSR_EINVAL, "%s: unknown key %s.%s%s", where, section, key,
                       suggest_key(section, key, sug, sizeof sug));
    }
}

/* ------------------------------------------------------------ defaults */

const char *tsr_flavor_name(int flavor) {
    if (flavor < TSR_FLAVOR_DEBUG || flavor > TSR_FLAVOR_CHECKPOINT) return "?";
    return choice_name(flavor_choices, flavor);
}

void tsr_config_defaults(tsr_train_config *c) {
    memset(c, 0, sizeof *c);
    strcpy(c->job.dump_folder, "./outputs");
    strcpy(c->job.description, "default job");
    strcpy(c->model.name, "llama3");
    c->model.flavor = TSR_FLAVOR_DEBUG;
    strcpy(c->optimizer.name, "AdamW");
    c->optimizer.lr = 8e-4;
    c->optimizer.beta1 = 0.9;
    c->optimizer.beta2 = 0.95;
    c->optimizer.eps = 1e-8;
    c->optimizer.weight_decay = 0.1;
    c->lr_scheduler.warmup_steps = 200;
    c->lr_scheduler.decay_ratio = -1.0;
    c->lr_scheduler.decay_type = TSR_DECAY_COSINE;
    c->lr_scheduler.min_lr_factor = 0.0;
    c->training.local_batch_size = 8;
    c->training.global_batch_size = -1;
    c->training.seq_len = 2048;
    c->training.max_norm = 1.0;
    c->training.steps = 10000;
    c->training.seed = -1;
    strcpy(c->training.dataset, "synthetic");
    c->training.skip_data_after_step = -1;
    c->parallelism.data_parallel_replicate_degree = 1;
    c->parallelism.data_parallel_shard_degree = -1;
    c->parallelism.tensor_parallel_degree = 1;
    c->parallelism.pipeline_parallel_degree = 1;
    c->parallelism.pipeline_parallel_microbatch_size = 1;
    c->parallelism.pipeline_parallel_schedule = TSR_SCHED_1F1B;
    c->checkpoint.enable = false;
    strcpy(c->checkpoint.folder, TSR_CONFIG_DEFAULT_CKPT_FOLDER);
    c->checkpoint.interval = 500;
    c->checkpoint.keep_latest_k = 10;
    c->checkpoint.async_mode = TSR_ASYNC_DISABLED;
    c->checkpoint.load_step = -1;
    c->checkpoint.last_save_model_only = true;
    c->checkpoint.export_dtype = TSR_F32;
    c->checkpoint.initial_load_model_only = true;
    c->checkpoint.archive_interval = 1;
    c->checkpoint.commit_timeout_s = 1800;
    c->metrics.log_freq = 10;
    strcpy(c->metrics.file, "metrics.jsonl");
}

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
        v->type = V_COMPOUND;
    } else {
        const char *e = r->p;
        while (e < r->end && *e != ' ' && *e != '\t' && *e != '\n' && *e != '\r' && *e != '#') e++;
        size_t n = (size_t)(e - r->p);
        const char *why = "";
        set_shown(v, r->p, n);
        if (n == 4 && memcmp(r->p, "true", 4) == 0) v->type = V_BOOL, v->b = true;
        else if (n == 5 && memcmp(r->p, "false", 5) == 0) v->type = V_BOOL, v->b = false;
        else {
            int t = parse_number(r->p, n, &v->i, &v->f, &why);
            if (t < 0) {
                int alpha = (*r->p >= 'a' && *r->p <= 'z') || (*r->p >= 'A' && *r->p <= 'Z');
                return rerr(r, "invalid value '%s': %s", v->shown,
                            alpha ? "strings need quotes" : why);
            }
            v->type = t;
        }
        r->p = e;
    }
    set_shown(v, start, (size_t)(r->p - start));
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
    if (dotted && !in_list(name, ignored_sections, N_IGNORED_SECTIONS))
        return rerr(r, "dotted section names are not supported ([%s])", dotted_name);
    if (!in_list(name, sections, N_SECTIONS) && !in_list(name, ignored_sections, N_IGNORED_SECTIONS))
        return rerr(r, "unknown section [%s]%s", name, suggest_section(name, sug, sizeof sug));
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
    int what = r->section_ignored ? T_IGNORED : classify(r->section, key, &k);
    char sug[192];
    if (what == T_UNKNOWN_KEY)
        return rerr(r, "unknown key %s.%s%s", r->section, key, suggest_key(r->section, key, sug, sizeof sug));
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
                add_warning(r->c, "%s: ignored on CPU: %s.%s = %s", where, r->section, key, v->shown);
        } else
            rc = apply(r->c, where, r->section, key, v, &set, r->err);
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
    int what = classify(section, key, &k);
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
            int t = parse_number(s, n, &v->i, &v->f, &why);
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
        if (what == T_IGNORED) {
            if (!(v->type == V_BOOL && !v->b))
                add_warning(c, "command line: ignored on CPU: %s.%s = %s", section, key, v->shown);
        } else
            rc = apply(c, where, section, key, v, &set, err);
    }
    free(v);
    return rc;
}

/* ------------------------------------------------------------ validation */

int tsr_config_validate(tsr_train_config *c, int world_size, tsr_error *err) {
    if (world_size < 1) return tsr_err(err, TSR_EINVAL, "config: world size %d: must be >= 1", world_size);
    int rep = c->parallelism.data_parallel_replicate_degree, tp = c->parallelism.tensor_parallel_degree,
        pp = c->parallelism.pipeline_parallel_degree, shard = c->parallelism.data_parallel_shard_degree;
    int64_t others = (int64_t)rep * tp * pp;
    if (shard == -1) {
        if (others > world_size || world_size % others)
            return tsr_err(err, TSR_EINVAL,
                           "parallelism: %d ranks cannot be split: data_parallel_replicate_degree (%d) * "
                           "tensor_parallel_degree (%d) * pipeline_parallel_degree (%d) = %lld does not "
                           "divide the world size %d",
                           world_size, rep, tp, pp, (long long)others, world_size);
        shard = (int)(world_size / others);
    }
    int64_t product = others * shard;
    if (product != world_size)
        return tsr_err(err, TSR_EINVAL,
                       "parallelism: data_parallel_replicate_degree (%d) * data_parallel_shard_degree (%d) * "
                       "tensor_parallel_degree (%d) * pipeline_parallel_degree (%d) = %lld, but the job "
                       "has %d rank%s: the product of the degrees must equal the world size",
                       rep, shard, tp, pp, (long long)product, world_size, world_size == 1 ? "" : "s");
    int64_t dp = (int64_t)rep * shard;
    int64_t per_step = dp * c->training.local_batch_size;
    if (per_step > INT_MAX)
        return tsr_err(err, TSR_EINVAL, "training.local_batch_size (%d) * data-parallel degree (%lld) is too large",
                       c->training.local_batch_size, (long long)dp);
    int global = c->training.global_batch_size;
    if (global == -1) global = (int)per_step;
    else if (global % per_step)
        return tsr_err(err, TSR_EINVAL,
                       "training.global_batch_size (%d) must be a multiple of local_batch_size (%d) * "
                       "data-parallel degree (%lld) = %lld",
                       global, c->training.local_batch_size, (long long)dp, (long long)per_step);
    if (pp > 1 && c->training.local_batch_size % c->parallelism.pipeline_parallel_microbatch_size)
        return tsr_err(err, TSR_EINVAL,
                       "training.local_batch_size (%d) must be a multiple of "
                       "parallelism.pipeline_parallel_microbatch_size (%d) with pipeline parallelism",
                       c->training.local_batch_size, c->parallelism.pipeline_parallel_microbatch_size);
    if (strcmp(c->training.dataset, "synthetic") != 0 && !c->training.dataset_path[0])
        return tsr_err(err, TSR_EINVAL,
                       "training.dataset \"%s\": only \"synthetic\" is built in; set training.dataset_path to "
                       "a directory of token shards (tessera data prep) or training.dataset = \"synthetic\"",
                       c->training.dataset);
    /* Only now, when every check has passed, resolve: validate leaves *c alone on error. */
    c->parallelism.data_parallel_shard_degree = shard;
    c->training.global_batch_size = global;
    if (c->training.seed == -1) c->training.seed = TSR_CONFIG_DEFAULT_SEED;
    if (c->lr_scheduler.warmup_steps > c->training.steps && !strstr(c->warnings, "warmup_steps ("))
        add_warning(c, "config: lr_scheduler.warmup_steps (%d) > training.steps (%d): the lr never reaches "
                       "optimizer.lr",
                    c->lr_scheduler.warmup_steps, c->training.steps);
    /* A folder of one's own says checkpoints are wanted; with enable false none is
     * saved there, and the job does not resume from it. */
    if (!c->checkpoint.enable && strcmp(c->checkpoint.folder, TSR_CONFIG_DEFAULT_CKPT_FOLDER) != 0 &&
        !strstr(c->warnings, "checkpoint.folder (\""))
        add_warning(c, "config: checkpoint.folder (\"%.200s\") is set but checkpoint.enable is false: no checkpoint "
                       "is saved there and the job does not resume from it (set checkpoint.enable = true)",
                    c->checkpoint.folder);
    return 0;
}

/* ------------------------------------------------------------ learning rate */

double tsr_config_lr_at(const tsr_train_config *c, int step) {
    double lr = c->optimizer.lr, m = c->lr_scheduler.min_lr_factor;
    int64_t S = c->training.steps, W = c->lr_scheduler.warmup_steps, s = step;
    if (s < 1) s = 1;
    if (s > S) s = S;
    if (W > 0 && s <= W) return lr * (double)s / (double)W;
    int64_t D = S - W;
    if (c->lr_scheduler.decay_ratio >= 0) {
        int64_t d = llround(c->lr_scheduler.decay_ratio * (double)S);
        if (d < D) D = d;
    }
    if (D <= 0 || s <= S - D) return lr; /* warmup done, not yet decaying */
    double p = (double)(s - (S - D)) / (double)(D + 1), f;
    switch (c->lr_scheduler.decay_type) {
    case TSR_DECAY_LINEAR: f = 1.0 - p; break;
    case TSR_DECAY_SQRT: f = 1.0 - sqrt(p); break;
    default: f = 0.5 * (1.0 + cos(M_PI * p)); break;
    }
    return lr * (m + (1.0 - m) * f);
}

/* ------------------------------------------------------------ writing */

static void toml_string(tsr_sbuf *b, const char *s) {
    tsr_sb_printf(b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': tsr_sb_printf(b, "\\\""); break;
        case '\\': tsr_sb_printf(b, "\\\\"); break;
        case '\n': tsr_sb_printf(b, "\\n"); break;
        case '\t': tsr_sb_printf(b, "\\t"); break;
        case '\r': tsr_sb_printf(b, "\\r"); break;
        case '\b': tsr_sb_printf(b, "\\b"); break;
        case '\f': tsr_sb_printf(b, "\\f"); break;
        default:
            if (*p < 0x20 || *p == 0x7F) tsr_sb_printf(b, "\\u%04X", *p);
            else tsr_sb_printf(b, "%c", *p);
        }
    }
    tsr_sb_printf(b, "\"");
}

int tsr_config_to_toml(const tsr_train_config *c, char **text, size_t *len) {
    tsr_sbuf b = {0};
    tsr_sb_printf(&b, "# tessera job config (the effective values, every key)\n");
    const char *section = "";
    for (size_t i = 0; i < N_KEYS; i++) {
        const keydef *k = &keys[i];
        const char *field = (const char *)c + k->off;
        if (strcmp(section, k->section) != 0) {
            tsr_sb_printf(&b, "\n[%s]\n", k->section);
            section = k->section;
        }
        tsr_sb_printf(&b, "%s = ", k->key);
        char num[64];
        switch (k->kind) {
        case K_STR: toml_string(&b, field); break;
        case K_CHOICE: toml_string(&b, choice_name(k->choices, *(const int *)(const void *)field)); break;
        case K_BOOL: tsr_sb_printf(&b, "%s", *(const bool *)(const void *)field ? "true" : "false"); break;
        case K_INT:
            if (k->size == sizeof(int64_t)) tsr_sb_printf(&b, "%lld", (long long)*(const int64_t *)(const void *)field);
            else tsr_sb_printf(&b, "%d", *(const int *)(const void *)field);
            break;
        case K_FLOAT:
            fmt_double(num, sizeof num, *(const double *)(const void *)field);
            tsr_sb_printf(&b, "%s", num);
            break;
        }
        if (k->flags & F_OURS) tsr_sb_printf(&b, "  # tessera's own key");
        else if ((k->flags & F_MINUS1) && ((k->kind == K_FLOAT && *(const double *)(const void *)field == -1.0) ||
                                           (k->kind == K_INT && k->size == sizeof(int) &&
                                            *(const int *)(const void *)field == -1) ||
                                           (k->kind == K_INT && k->size == sizeof(int64_t) &&
                                            *(const int64_t *)(const void *)field == -1)))
            tsr_sb_printf(&b, "  # %s", k->minus1);
        tsr_sb_printf(&b, "\n");
    }
    if (b.oom || !b.p) {
        free(b.p);
        *text = NULL;
        if (len) *len = 0;
        return TSR_ENOMEM;
    }
    *text = b.p;
    if (len) *len = b.n;
    return 0;
}
