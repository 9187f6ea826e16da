/* config.c: the job config's keys: the table of every key tessera honours
 * (section, name, type, field, allowed range), the checks that store a value
 * into its field, and the effective config written back as TOML. The reader
 * and the overrides (config_toml.c) and the writer all walk the table, so a new
 * key is one new row. */
#include "config_impl.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common.h"

/* ------------------------------------------------------------ the keys */

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
static const choice codec_choices[] = {
    {"auto", TSR_CODEC_AUTO}, {"raw", TSR_CODEC_RAW}, {"zstd", TSR_CODEC_ZSTD}, {"bytegroup", TSR_CODEC_BYTEGROUP},
    {NULL, 0},
};
static const choice device_choices[] = {
    {"cpu", TSR_DEVICE_CPU}, {"cuda", TSR_DEVICE_CUDA}, {"guard", TSR_DEVICE_GUARD}, {NULL, 0},
};
static const choice plane_choices[] = {
    {"auto", TSR_PLANE_AUTO}, {"nccl", TSR_PLANE_NCCL}, {"staged", TSR_PLANE_STAGED}, {NULL, 0},
};
static const choice dtype_choices[] = {
    {"float32", TSR_F32}, {"bfloat16", TSR_BF16}, {NULL, 0},
};

/* store() writes choice fields through an int and tells int from int64_t fields by size. */
_Static_assert(sizeof(tsr_flavor) == sizeof(int) && sizeof(tsr_decay_type) == sizeof(int) &&
                   sizeof(tsr_async_mode) == sizeof(int) && sizeof(tsr_pp_schedule) == sizeof(int) &&
                   sizeof(tsr_device) == sizeof(int) && sizeof(tsr_data_plane_mode) == sizeof(int),
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
    {"training", "mixed_precision_param", K_CHOICE, OFF(training.mixed_precision_param), 0, 0, 0, dtype_choices, NULL},
    {"training", "mixed_precision_reduce", K_CHOICE, OFF(training.mixed_precision_reduce), 0, 0, 0, dtype_choices,
     NULL},
    {"training", "device", K_CHOICE, OFF(training.device), 0, 0, F_OURS, device_choices, NULL},
    {"training", "sdc_check_interval", K_INT, OFF(training.sdc_check_interval), 0, BIG, F_OURS, NULL, NULL},

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
    {"parallelism", "data_plane", K_CHOICE, OFF(parallelism.data_plane), 0, 0, F_OURS, plane_choices, NULL},

    {"checkpoint", "enable", K_BOOL, OFF(checkpoint.enable), 0, 0, 0, NULL, NULL},
    {"checkpoint", "folder", K_STR, OFF(checkpoint.folder), 0, 0, F_NONEMPTY, NULL, NULL},
    {"checkpoint", "interval", K_INT, OFF(checkpoint.interval), 1, BIG, 0, NULL, NULL},
    {"checkpoint", "keep_latest_k", K_INT, OFF(checkpoint.keep_latest_k), 0, BIG, 0, NULL, NULL},
    {"checkpoint", "async_mode", K_CHOICE, OFF(checkpoint.async_mode), 0, 0, 0, async_choices, NULL},
    {"checkpoint", "load_step", K_INT, OFF(checkpoint.load_step), 0, BIG, F_MINUS1, NULL,
     "the newest checkpoint"},
    {"checkpoint", "load_poisoned", K_BOOL, OFF(checkpoint.load_poisoned), 0, 0, F_OURS, NULL, NULL},
    {"checkpoint", "last_save_model_only", K_BOOL, OFF(checkpoint.last_save_model_only), 0, 0, 0, NULL,
     NULL},
    {"checkpoint", "export_dtype", K_CHOICE, OFF(checkpoint.export_dtype), 0, 0, 0, dtype_choices, NULL},
    {"checkpoint", "last_save_in_hf", K_BOOL, OFF(checkpoint.last_save_in_hf), 0, 0, 0, NULL, NULL},
    {"checkpoint", "initial_load_path", K_STR, OFF(checkpoint.initial_load_path), 0, 0, 0, NULL, NULL},
    {"checkpoint", "initial_load_model_only", K_BOOL, OFF(checkpoint.initial_load_model_only), 0, 0, 0,
     NULL, NULL},
    {"checkpoint", "archive_url", K_STR, OFF(checkpoint.archive_url), 0, 0, F_OURS, NULL, NULL},
    {"checkpoint", "archive_interval", K_INT, OFF(checkpoint.archive_interval), 1, BIG, F_OURS, NULL, NULL},
    {"checkpoint", "archive_keep_latest_k", K_INT, OFF(checkpoint.archive_keep_latest_k), 0, BIG, F_OURS, NULL,
     NULL},
    {"checkpoint", "commit_timeout_s", K_FLOAT, OFF(checkpoint.commit_timeout_s), 0, 1e9, F_OURS, NULL, NULL},
    {"checkpoint", "codec", K_CHOICE, OFF(checkpoint.codec), 0, 0, F_OURS, codec_choices, NULL},
    {"checkpoint", "local_interval", K_INT, OFF(checkpoint.local_interval), 0, BIG, F_OURS, NULL, NULL},
    {"checkpoint", "local_folder", K_STR, OFF(checkpoint.local_folder), 0, 0, F_OURS, NULL, NULL},
    {"checkpoint", "local_nodes", K_STR, OFF(checkpoint.local_nodes), 0, 0, F_OURS, NULL, NULL},

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
    {"training", "enable_cpu_offload"}, {"training", "compile"}, {"training", "gc_freq"},
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
    {"checkpoint", "create_seed_checkpoint"},
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

int tsr_cfg_section(const char *name) {
    if (in_list(name, sections, N_SECTIONS)) return S_KNOWN;
    return in_list(name, ignored_sections, N_IGNORED_SECTIONS) ? S_IGNORED : S_UNKNOWN;
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
const char *tsr_cfg_suggest_key(const char *section, const char *key, char *buf, size_t len) {
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

const char *tsr_cfg_suggest_section(const char *section, char *buf, size_t len) {
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

void tsr_cfg_warn(tsr_train_config *c, const char *fmt, ...) {
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

static const char *vtype_name(int t) {
    switch (t) {
    case V_STRING: return "a string";
    case V_INT: return "an integer";
    case V_FLOAT: return "a float";
    case V_BOOL: return "a boolean";
    default: return "an array or table";
    }
}

void tsr_cfg_set_shown(value *v, const char *s, size_t n) {
    size_t k = 0, cap = sizeof v->shown - 4;
    for (size_t j = 0; j < n && k < cap; j++) v->shown[k++] = (s[j] == '\n' || s[j] == '\r') ? ' ' : s[j];
    if (n > cap) memcpy(v->shown + k, "...", 3), k += 3;
    v->shown[k] = 0;
}

/* Reads a TOML decimal integer or float from exactly s[0..n). Underscores are
 * allowed between digits, as in TOML. @return V_INT, V_FLOAT, or -1 with a
 * reason in why. */
int tsr_cfg_parse_number(const char *s, size_t n, int64_t *iv, double *fv, const char **why) {
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

static const char *const EXCLUDE_NAMES[] = {"optimizer", "lr_scheduler", "dataloader", "train_state"};
#define N_EXCLUDE (sizeof EXCLUDE_NAMES / sizeof EXCLUDE_NAMES[0])

const char *tsr_exclude_names(int bits, char *buf, size_t len) {
    size_t at = 0;
    buf[0] = 0;
    for (size_t i = 0; i < N_EXCLUDE; i++)
        if (bits & (1 << i)) at += (size_t)snprintf(buf + at, at < len ? len - at : 0, "%s%s", at ? ", " : "", EXCLUDE_NAMES[i]);
    return buf;
}

/* checkpoint.exclude_from_loading: TorchTitan's list of names, as a TOML array
 * of strings (its text in v->str) or from the command line a comma-separated
 * list; each name once. */
static int exclude_list(tsr_train_config *c, const char *where, const value *v, tsr_error *err) {
    const char *s = v->type == V_STRING || v->type == V_COMPOUND ? v->str : v->shown;
    int bits = 0;
    for (const char *p = s; *p;) {
        while (*p && strchr("[], \t\n\r\"'", *p)) p++;
        if (*p == '#') { /* a comment in the array, to its line's end */
            p += strcspn(p, "\n");
            continue;
        }
        if (!*p) break;
        size_t n = strcspn(p, "[], \t\n\r\"'");
        size_t i = 0;
        while (i < N_EXCLUDE && !(strlen(EXCLUDE_NAMES[i]) == n && !strncmp(p, EXCLUDE_NAMES[i], n))) i++;
        if (n == 5 && !strncmp(p, "model", 5))
            return tsr_err(err, TSR_EINVAL, "%s: checkpoint.exclude_from_loading: \"model\" cannot be left out "
                           "(the model is what a load is for)", where);
        if (i == N_EXCLUDE)
            return tsr_err(err, TSR_EINVAL, "%s: checkpoint.exclude_from_loading: \"%.*s\" is not a part of the "
                           "state (optimizer, lr_scheduler, dataloader, train_state)", where, (int)n, p);
        if (bits & (1 << i))
            return tsr_err(err, TSR_EINVAL, "%s: checkpoint.exclude_from_loading: \"%s\" twice", where,
                           EXCLUDE_NAMES[i]);
        bits |= 1 << i;
        p += n;
    }
    c->checkpoint.exclude_from_loading = bits;
    return 0;
}

int tsr_cfg_classify(const char *section, const char *key, const keydef **k) {
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
int tsr_cfg_apply(tsr_train_config *c, const char *where, const char *section, const char *key,
                 const value *v, const keydef **set_key, tsr_error *err) {
    const keydef *k = NULL;
    char why[TSR_ERROR_MSG / 2], sug[192];
    *set_key = NULL;
    switch (tsr_cfg_classify(section, key, &k)) {
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
        if (!strcmp(section, "checkpoint") && !strcmp(key, "exclude_from_loading"))
            return exclude_list(c, where, v, err);
        /* A disabled feature that is ignored changes nothing: no warning. */
        if (!(v->type == V_BOOL && !v->b)) tsr_cfg_warn(c, "%s: ignored on CPU: %s.%s = %s", where, section, key, v->shown);
        return 0;
    case T_UNKNOWN_SECTION:
        return tsr_err(err, TSR_EINVAL, "%s: unknown section %s in %s.%s%s", where, section, section, key,
                       tsr_cfg_suggest_key(section, key, sug, sizeof sug));
    default:
        return tsr_err(err, TSR_EINVAL, "%s: unknown key %s.%s%s", where, section, key,
                       tsr_cfg_suggest_key(section, key, sug, sizeof sug));
    }
}

/* ------------------------------------------------------------ names */

const char *tsr_flavor_name(int flavor) {
    if (flavor < TSR_FLAVOR_DEBUG || flavor > TSR_FLAVOR_CHECKPOINT) return "?";
    return choice_name(flavor_choices, flavor);
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
