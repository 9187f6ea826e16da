/* test_config.c: the trainer's job config: every TOML value kind, every kind of
 * error with its FILE:LINE and key, aliases and ignored TorchTitan keys,
 * command-line overrides, "did you mean", degree resolution against world sizes,
 * the round trip through tsr_config_to_toml, the learning-rate schedule, and
 * every file in train/configs. */
#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "config.h"

static char tmpdir[512];
static char root[512];

/* Writes text to TSR_TMP/name and loads it; the path is returned in path. */
static int load_text(tsr_train_config *c, const char *name, const char *text, tsr_error *e, char *path,
                     size_t plen) {
    snprintf(path, plen, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    REQUIRE(f, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
    memset(e, 0, sizeof *e);
    return tsr_config_load(c, path, e);
}

/* Loading `text` must fail, and the message must hold every string given. */
static void expect_load_error(int line, const char *text, ...) {
    tsr_train_config c;
    tsr_error e;
    char path[600];
    int rc = load_text(&c, "bad.toml", text, &e, path, sizeof path);
    if (rc != TSR_EINVAL) {
        check_failures++;
        fprintf(stderr, "test line %d: load returned %d (want EINVAL) for:\n%s\n", line, rc, text);
        return;
    }
    va_list ap;
    va_start(ap, text);
    for (const char *want; (want = va_arg(ap, const char *));) {
        if (!strstr(e.msg, want)) {
            check_failures++;
            fprintf(stderr, "test line %d: message \"%s\" lacks \"%s\"\n", line, e.msg, want);
        }
    }
    va_end(ap);
}
#define BAD(text, ...) expect_load_error(__LINE__, text, __VA_ARGS__, (const char *)NULL)

/* An override must fail with every string given in its message. */
static void expect_override_error(int line, const char *arg, ...) {
    tsr_train_config c;
    tsr_error e = {0};
    tsr_config_defaults(&c);
    int rc = tsr_config_override(&c, arg, &e);
    if (rc != TSR_EINVAL) {
        check_failures++;
        fprintf(stderr, "test line %d: override %s returned %d, want EINVAL\n", line, arg, rc);
        return;
    }
    va_list ap;
    va_start(ap, arg);
    for (const char *want; (want = va_arg(ap, const char *));)
        if (!strstr(e.msg, want)) {
            check_failures++;
            fprintf(stderr, "test line %d: message \"%s\" lacks \"%s\"\n", line, e.msg, want);
        }
    va_end(ap);
}
#define BAD_OVERRIDE(arg, ...) expect_override_error(__LINE__, arg, __VA_ARGS__, (const char *)NULL)

static void test_defaults(void) {
    tsr_train_config c;
    tsr_error e = {0};
    CHECK_OK(tsr_config_load(&c, NULL, &e));
    CHECK(strcmp(c.job.dump_folder, "./outputs") == 0, "%s", c.job.dump_folder);
    CHECK(strcmp(c.model.name, "llama3") == 0, "%s", c.model.name);
    CHECK(c.model.flavor == TSR_FLAVOR_DEBUG, "%d", c.model.flavor);
    CHECK(strcmp(c.optimizer.name, "AdamW") == 0, "%s", c.optimizer.name);
    CHECK(c.optimizer.lr == 8e-4 && c.optimizer.beta1 == 0.9 && c.optimizer.beta2 == 0.95, "adam");
    CHECK(c.optimizer.eps == 1e-8 && c.optimizer.weight_decay == 0.1, "adam eps/wd");
    CHECK(c.lr_scheduler.warmup_steps == 200 && c.lr_scheduler.decay_ratio == -1.0, "sched");
    CHECK(c.lr_scheduler.decay_type == TSR_DECAY_COSINE && c.lr_scheduler.min_lr_factor == 0.0, "sched");
    CHECK(c.training.local_batch_size == 8 && c.training.global_batch_size == -1, "batch");
    CHECK(c.training.seq_len == 2048 && c.training.max_norm == 1.0 && c.training.steps == 10000, "training");
    CHECK(c.training.seed == -1 && strcmp(c.training.dataset, "synthetic") == 0, "seed/dataset");
    CHECK(c.parallelism.data_parallel_replicate_degree == 1 && c.parallelism.data_parallel_shard_degree == -1,
          "dp");
    CHECK(c.parallelism.tensor_parallel_degree == 1 && c.parallelism.pipeline_parallel_degree == 1, "tp/pp");
    CHECK(c.parallelism.pipeline_parallel_microbatch_size == 1, "mb");
    CHECK(c.parallelism.pipeline_parallel_schedule == TSR_SCHED_1F1B, "sched");
    CHECK(!c.checkpoint.enable && strcmp(c.checkpoint.folder, "checkpoint") == 0, "ckpt");
    CHECK(c.checkpoint.interval == 500 && c.checkpoint.keep_latest_k == 10, "ckpt");
    CHECK(c.checkpoint.async_mode == TSR_ASYNC_DISABLED && c.checkpoint.load_step == -1, "ckpt");
    CHECK(c.checkpoint.last_save_model_only && c.checkpoint.export_dtype == TSR_F32, "ckpt");
    CHECK(c.checkpoint.commit_timeout_s == 1800, "commit timeout %g", c.checkpoint.commit_timeout_s);
    CHECK(c.checkpoint.codec == TSR_CODEC_AUTO, "codec %d: adaptive by default", c.checkpoint.codec);
    /* the supervisor's keys: no local tier, no skipped data */
    CHECK(c.checkpoint.local_interval == 0 && !c.checkpoint.local_folder[0] && !c.checkpoint.local_nodes[0],
          "local tier: %d \"%s\" \"%s\"", c.checkpoint.local_interval, c.checkpoint.local_folder,
          c.checkpoint.local_nodes);
    CHECK(c.training.skip_data_after_step == -1 && c.training.skip_data_steps == 0, "skip data: %d %d",
          c.training.skip_data_after_step, c.training.skip_data_steps);
    CHECK(c.training.sdc_check_interval == 10, "replica check interval: %d, not 10", c.training.sdc_check_interval);
    CHECK(c.metrics.log_freq == 10 && strcmp(c.metrics.file, "metrics.jsonl") == 0, "metrics");
    CHECK(c.n_warnings == 0 && c.warnings[0] == 0, "warnings: %s", c.warnings);
    CHECK(strcmp(tsr_flavor_name(TSR_FLAVOR_124M), "124m") == 0, "flavor name");
    CHECK(strcmp(tsr_flavor_name(99), "?") == 0, "flavor name of a bad value");
}

static void test_value_kinds(void) {
    tsr_train_config c;
    tsr_error e;
    char path[600];
    const char *text =
        "\xEF\xBB\xBF# a comment on the first line, after a BOM\n"
        "\n"
        "   # an indented comment\n"
        "[job]\r\n"
        "dump_folder = \"out dir/\\\"q\\\"\\\\x\"   # escapes: quote, backslash\r\n"
        "description = \"tab\\there\\nnewline \\u00e9 \\U0001F600 \\b\\f\\r end\"\n"
        "\t\n"
        "[ model ]  # spaces in the header\n"
        "flavor = 'small'\n"
        "[optimizer]\n"
        "lr=8e-4\n"
        "beta1 = 0.5\n"
        "beta2 = 9.99E-1\n"
        "eps = 1e-10\n"
        "weight_decay = 0\n"
        "[lr_scheduler]\n"
        "warmup_steps = 1_000\n"
        "decay_ratio = 0.25\n"
        "decay_type = \"linear\"\n"
        "min_lr_factor = +0.125\n"
        "[training]\n"
        "local_batch_size = 16\n"
        "global_batch_size = -1\n"
        "seq_len = 512\n"
        "max_norm = 2\n"
        "steps = 2_000\n"
        "seed = 1234567890123\n"
        "dataset = \"fineweb\"\n"
        "dataset_path = 'C:\\data\\shards'\n"
        "[parallelism]\n"
        "data_parallel_replicate_degree = 2\n"
        "data_parallel_shard_degree = 3\n"
        "tensor_parallel_degree = 4\n"
        "pipeline_parallel_degree = 5\n"
        "pipeline_parallel_microbatch_size = 2\n"
        "pipeline_parallel_schedule = \"gpipe\"\n"
        "[checkpoint]\n"
        "enable = true\n"
        "folder = \"/abs/ck\"\n"
        "interval = 7\n"
        "keep_latest_k = 0\n"
        "async_mode = \"async\"\n"
        "load_step = 0\n"
        "last_save_model_only = false\n"
        "export_dtype = \"bfloat16\"\n"
        "initial_load_path = \"/seed/step-00000100\"\n"
        "initial_load_model_only = false\n"
        "commit_timeout_s = 2.5\n"
        "codec = \"zstd\"\n"
        "[metrics]\n"
        "log_freq = 3\n"
        "file = \"m.jsonl\"";  /* no newline at the end */
    CHECK_OK(load_text(&c, "kinds.toml", text, &e, path, sizeof path));
    CHECK(strcmp(c.job.dump_folder, "out dir/\"q\"\\x") == 0, "[%s]", c.job.dump_folder);
    CHECK(strcmp(c.job.description, "tab\there\nnewline \xC3\xA9 \xF0\x9F\x98\x80 \b\f\r end") == 0, "[%s]",
          c.job.description);
    CHECK(c.model.flavor == TSR_FLAVOR_SMALL, "%d", c.model.flavor);
    CHECK(c.optimizer.lr == 8e-4 && c.optimizer.beta1 == 0.5 && c.optimizer.beta2 == 0.999, "%g %g %g",
          c.optimizer.lr, c.optimizer.beta1, c.optimizer.beta2);
    CHECK(c.optimizer.eps == 1e-10 && c.optimizer.weight_decay == 0.0, "int 0 for a float key");
    CHECK(c.lr_scheduler.warmup_steps == 1000 && c.lr_scheduler.decay_ratio == 0.25, "%d %g",
          c.lr_scheduler.warmup_steps, c.lr_scheduler.decay_ratio);
    CHECK(c.lr_scheduler.decay_type == TSR_DECAY_LINEAR && c.lr_scheduler.min_lr_factor == 0.125, "sched");
    CHECK(c.training.local_batch_size == 16 && c.training.global_batch_size == -1, "batch");
    CHECK(c.training.seq_len == 512 && c.training.max_norm == 2.0 && c.training.steps == 2000, "training");
    CHECK(c.training.seed == 1234567890123LL, "%lld", (long long)c.training.seed);
    CHECK(strcmp(c.training.dataset, "fineweb") == 0, "%s", c.training.dataset);
    CHECK(strcmp(c.training.dataset_path, "C:\\data\\shards") == 0, "literal string: %s", c.training.dataset_path);
    CHECK(c.parallelism.data_parallel_replicate_degree == 2 && c.parallelism.data_parallel_shard_degree == 3,
          "dp");
    CHECK(c.parallelism.tensor_parallel_degree == 4 && c.parallelism.pipeline_parallel_degree == 5, "tp pp");
    CHECK(c.parallelism.pipeline_parallel_microbatch_size == 2, "mb");
    CHECK(c.parallelism.pipeline_parallel_schedule == TSR_SCHED_GPIPE, "schedule names ignore case");
    CHECK(c.checkpoint.enable && strcmp(c.checkpoint.folder, "/abs/ck") == 0 && c.checkpoint.interval == 7,
          "ckpt");
    CHECK(c.checkpoint.keep_latest_k == 0 && c.checkpoint.async_mode == TSR_ASYNC_ON &&
              c.checkpoint.load_step == 0,
          "ckpt");
    CHECK(!c.checkpoint.last_save_model_only && c.checkpoint.export_dtype == TSR_BF16, "ckpt");
    CHECK(strcmp(c.checkpoint.initial_load_path, "/seed/step-00000100") == 0 && !c.checkpoint.initial_load_model_only,
          "initial load");
    CHECK(c.checkpoint.commit_timeout_s == 2.5, "commit timeout %g", c.checkpoint.commit_timeout_s);
    CHECK(c.checkpoint.codec == TSR_CODEC_ZSTD, "codec %d", c.checkpoint.codec);
    CHECK(c.metrics.log_freq == 3 && strcmp(c.metrics.file, "m.jsonl") == 0, "metrics");
    CHECK(c.n_warnings == 0, "no warnings expected: %s", c.warnings);

    /* loading starts from the defaults: keys absent from this file are default */
    CHECK_OK(load_text(&c, "small.toml", "[training]\nsteps = 5\n", &e, path, sizeof path));
    CHECK(c.training.steps == 5 && c.training.seq_len == 2048 && c.optimizer.lr == 8e-4, "fresh defaults");
    CHECK(strcmp(c.job.dump_folder, "./outputs") == 0, "fresh defaults: %s", c.job.dump_folder);
    CHECK_OK(load_text(&c, "empty.toml", "", &e, path, sizeof path));
    CHECK(c.training.steps == 10000, "an empty file is the defaults");
}

/* A config written the way TorchTitan's llama3 configs are (arrays and literal
 * strings in keys tessera ignores, older key names, TorchTitan's flavors). */
static void test_torchtitan_config(void) {
    tsr_train_config c;
    tsr_error e;
    char path[600];
    const char *text =
        "# torchtitan Config.toml\n"
        "[job]\n"
        "dump_folder = \"./outputs\"\n"
        "description = \"Llama 3 debug training\"\n"
        "print_args = false\n"
        "use_for_integration_test = true\n"
        "[profiling]\n"
        "enable_profiling = false\n"
        "save_traces_folder = \"profile_trace\"\n"
        "profile_freq = 10\n"
        "[metrics]\n"
        "log_freq = 1\n"
        "enable_tensorboard = false\n"
        "save_tb_folder = \"tb\"\n"
        "[model]\n"
        "name = \"llama3\"\n"
        "flavor = \"debugmodel\"\n"
        "tokenizer_path = \"./tests/assets/tokenizer\"\n"
        "# converters = [\"float8\"]\n"
        "[optimizer]\n"
        "name = \"AdamW\"\n"
        "lr = 8e-4\n"
        "eps = 1e-8\n"
        "[lr_scheduler]\n"
        "warmup_steps = 2  # lr scheduler warm up, normally 20% of the train steps\n"
        "decay_ratio = 0.8\n"
        "decay_type = \"linear\"\n"
        "lr_min = 0.0\n"
        "[training]\n"
        "batch_size = 8\n"
        "seq_len = 2048\n"
        "max_norm = 1.0  # grad norm clipping\n"
        "steps = 10\n"
        "compile = false\n"
        "mixed_precision_param = \"bfloat16\"\n"
        "dataset = \"c4_test\"  # supported datasets: c4_test (2K), c4 (177M)\n"
        "[parallelism]\n"
        "data_parallel_replicate_degree = 1\n"
        "data_parallel_shard_degree = -1\n"
        "fsdp_reshard_after_forward = \"default\" # default / never / always\n"
        "tensor_parallel_degree = 1\n"
        "enable_async_tensor_parallel = false\n"
        "pipeline_parallel_degree = 1\n"
        "context_parallel_degree = 1\n"
        "module_fqns_per_model_part = [\n"
        "  [\"tok_embeddings\", \"layers.0\"],  # a comment inside\n"
        "  [\"layers.1\", \"output]\"],\n"
        "]\n"
        "[checkpoint]\n"
        "enable_checkpoint = true\n"
        "folder = \"checkpoint\"\n"
        "interval = 10\n"
        "model_weights_only = false\n"
        "export_dtype = \"float32\"\n"
        "async_mode = \"async_with_pinned_mem\"  # [\"disabled\", \"async\", \"async_with_pinned_mem\"]\n"
        "[activation_checkpoint]\n"
        "mode = 'selective'  # ['none', 'selective', 'full']\n"
        "selective_ac_option = '2'\n"
        "[compile]\n"
        "enable=false\n"
        "components = [\"model\", \"loss\"]\n"
        "[float8]\n"
        "enable_fsdp_float8_all_gather = false\n"
        "filter_fqns = [\"output\"]\n"
        "[quantize.linear.float8]\n"
        "filter_fqns = [\"output\"]\n"
        "[quantize.linear.mx]\n"
        "filter_fqns = [\"output\"]\n"
        "inline = { a = 1, b = \"}\" }\n"
        "[debug]\n"
        "seed = 7\n"
        "deterministic = false\n"
        "[validation]\n"
        "enabled = false\n"
        "freq = 5\n"
        "[oops]\n"; /* line 76: an unknown section stops the load here */
    int rc = load_text(&c, "titan.toml", text, &e, path, sizeof path);
    CHECK(rc == TSR_EINVAL && strstr(e.msg, "titan.toml:76: unknown section [oops]"),
          "line counting through a multi-line array: %s", e.msg);
    /* without the last line it loads */
    char *copy = strdup(text);
    *strstr(copy, "[oops]") = 0;
    CHECK_OK(load_text(&c, "titan.toml", copy, &e, path, sizeof path));
    free(copy);
    CHECK(c.model.flavor == TSR_FLAVOR_DEBUG, "debugmodel is debug");
    CHECK(c.training.local_batch_size == 8 && c.training.steps == 10, "batch_size alias");
    CHECK(c.checkpoint.enable && !c.checkpoint.last_save_model_only, "enable_checkpoint/model_weights_only");
    CHECK(c.checkpoint.async_mode == TSR_ASYNC_ON, "async_with_pinned_mem is async");
    CHECK(c.lr_scheduler.decay_ratio == 0.8 && c.lr_scheduler.min_lr_factor == 0.0, "lr_min alias");
    CHECK(c.training.seed == 7, "debug.seed alias: %lld", (long long)c.training.seed);
    CHECK(c.training.mixed_precision_param == TSR_BF16 && c.training.mixed_precision_reduce == TSR_F32,
          "mixed_precision_param taken (bf16 operands), mixed_precision_reduce float32 by default");
    /* warnings: one per ignored key whose value is not false */
    const char *want[] = {"titan.toml:6: ignored on CPU: job.use_for_integration_test = true",
                          "ignored on CPU: profiling.save_traces_folder = \"profile_trace\"",
                          "ignored on CPU: profiling.profile_freq = 10",
                          "ignored on CPU: metrics.save_tb_folder",
                          "ignored on CPU: model.tokenizer_path",
                          "ignored on CPU: parallelism.fsdp_reshard_after_forward",
                          "titan.toml:45: ignored on CPU: parallelism.module_fqns_per_model_part = [",
                          "ignored on CPU: activation_checkpoint.mode = 'selective'",
                          "titan.toml:58: ignored on CPU: activation_checkpoint.selective_ac_option = '2'",
                          "ignored on CPU: compile.components = [\"model\", \"loss\"]",
                          "ignored on CPU: float8.filter_fqns = [\"output\"]",
                          "ignored on CPU: quantize.linear.float8.filter_fqns",
                          "ignored on CPU: quantize.linear.mx.filter_fqns",
                          "ignored on CPU: quantize.linear.mx.inline = { a = 1, b = \"}\" }",
                          "ignored on CPU: validation.freq = 5"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        CHECK(strstr(c.warnings, want[i]), "warning \"%s\" missing from:\n%s", want[i], c.warnings);
    CHECK(c.n_warnings == (int)(sizeof want / sizeof want[0]), "%d warnings:\n%s", c.n_warnings, c.warnings);
    const char *quiet[] = {"print_args", "enable_profiling", "enable_tensorboard", "compile.enable",
                           "training.compile", "enable_async_tensor_parallel", "deterministic",
                           "context_parallel_degree", "enable_fsdp_float8_all_gather"};
    for (size_t i = 0; i < sizeof quiet / sizeof quiet[0]; i++)
        CHECK(!strstr(c.warnings, quiet[i]), "%s is false or 1: no warning, got:\n%s", quiet[i], c.warnings);
    /* c4_test is not here: validate says how to fix it; the override does */
    rc = tsr_config_validate(&c, 1, &e);
    CHECK(rc == TSR_EINVAL && strstr(e.msg, "training.dataset \"c4_test\"") &&
              strstr(e.msg, "training.dataset_path"),
          "%s", e.msg);
    CHECK_OK(tsr_config_override(&c, "--training.dataset=synthetic", &e));
    CHECK_OK(tsr_config_validate(&c, 4, &e));
    CHECK(c.parallelism.data_parallel_shard_degree == 4, "%d", c.parallelism.data_parallel_shard_degree);

    /* other spellings */
    CHECK_OK(load_text(&c, "f.toml", "[model]\nflavor = \"8B\"\n", &e, path, sizeof path));
    CHECK(c.model.flavor == TSR_FLAVOR_8B, "8B is 8b");
    CHECK_OK(load_text(&c, "f.toml", "[model]\nflavor = \"124M\"\n[checkpoint]\nasync_mode = \"disabled\"\n", &e,
                       path, sizeof path));
    CHECK(c.model.flavor == TSR_FLAVOR_124M && c.checkpoint.async_mode == TSR_ASYNC_DISABLED, "124M");
    CHECK_OK(load_text(&c, "f.toml", "[parallelism]\npipeline_parallel_schedule = \"1f1b\"\n", &e, path,
                       sizeof path));
    CHECK(c.parallelism.pipeline_parallel_schedule == TSR_SCHED_1F1B, "1f1b");
}

static void test_errors(void) {
    /* unsupported TOML */
    BAD("[training]\nsteps = [1, 2]\n", "bad.toml:2:", "arrays are not supported");
    BAD("[training]\nseq_len = { a = 1 }\n", "bad.toml:2:", "inline tables are not supported");
    BAD("[training]\ntraining.steps = 5\n", "bad.toml:2:", "dotted keys are not supported");
    BAD("[training.extra]\nsteps = 5\n", "bad.toml:1:", "dotted section names are not supported");
    BAD("[[training]]\n", "bad.toml:1:", "arrays of tables");
    BAD("[training]\n\"steps\" = 5\n", "bad.toml:2:", "quoted keys are not supported");
    BAD("[job]\ndescription = \"\"\"multi\nline\"\"\"\n", "bad.toml:2:", "multi-line strings");
    BAD("[job]\ndescription = '''x'''\n", "bad.toml:2:", "multi-line strings");
    BAD("steps = 5\n", "bad.toml:1:", "outside any [section]");
    /* TorchTitan's exclude_from_loading: a list of the parts a load leaves fresh */
    BAD("[checkpoint]\nexclude_from_loading = [\"optimizer\", \"weights\"]\n", "bad.toml:2:",
        "exclude_from_loading", "\"weights\" is not a part of the state", "lr_scheduler");
    BAD("[checkpoint]\nexclude_from_loading = [\"model\"]\n", "bad.toml:2:", "\"model\" cannot be left out");
    BAD("[checkpoint]\nexclude_from_loading = [\"dataloader\", \"dataloader\"]\n", "bad.toml:2:", "twice");
    BAD_OVERRIDE("--checkpoint.exclude_from_loading=optimizer,meteor", "exclude_from_loading", "\"meteor\"");
    {
        tsr_train_config c;
        tsr_error e;
        char path[600], names[128];
        CHECK(load_text(&c, "empty.toml", "[checkpoint]\nexclude_from_loading = [ ]\n", &e, path, sizeof path) == 0 &&
                  c.checkpoint.exclude_from_loading == 0,
              "exclude_from_loading = [ ]: %s", e.msg);
        CHECK(load_text(&c, "ex.toml", "[checkpoint]\nexclude_from_loading = [\n  \"optimizer\", # c\n  'train_state',\n]\n",
                        &e, path, sizeof path) == 0 &&
                  c.checkpoint.exclude_from_loading == (TSR_EXCLUDE_OPTIMIZER | TSR_EXCLUDE_TRAIN_STATE),
              "exclude_from_loading over lines: %d %s", c.checkpoint.exclude_from_loading, e.msg);
        CHECK(!strcmp(tsr_exclude_names(c.checkpoint.exclude_from_loading, names, sizeof names),
                      "optimizer, train_state"), "names: %s", names);
        CHECK_OK(tsr_config_load(&c, NULL, &e));
        CHECK(tsr_config_override(&c, "--checkpoint.exclude_from_loading=lr_scheduler,dataloader", &e) == 0 &&
                  c.checkpoint.exclude_from_loading == (TSR_EXCLUDE_LR_SCHEDULER | TSR_EXCLUDE_DATALOADER),
              "--checkpoint.exclude_from_loading=lr_scheduler,dataloader: %d %s", c.checkpoint.exclude_from_loading,
              e.msg);
    }
    /* syntax */
    BAD("# c\n\n[job]\n\n# c\ndescription = \"open\n", "bad.toml:6:", "unterminated string");
    BAD("[job]\ndescription = \"bad \\q escape\"\n", "bad.toml:2:", "unknown escape \\q");
    BAD("[job]\ndescription = \"\\u12\"\n", "bad.toml:2:", "hex digits");
    BAD("[job]\ndescription = \"\\uD800\"\n", "bad.toml:2:", "not a valid character");
    BAD("[job]\ndescription = \"a\x01b\"\n", "bad.toml:2:", "control character");
    BAD("[job]\ndescription =\n", "bad.toml:2:", "missing value");
    BAD("[job]\ndescription = # nothing\n", "bad.toml:2:", "missing value");
    BAD("[job]\ndescription \"x\"\n", "bad.toml:2:", "expected '='");
    BAD("[training]\nsteps = 5 6\n", "bad.toml:2:", "unexpected text after the value");
    BAD("[training] steps = 5\n", "bad.toml:1:", "unexpected text after the section name");
    BAD("[training\n", "bad.toml:1:", "expected ']'");
    BAD("[]\n", "bad.toml:1:", "expected a section name");
    BAD("[training]\n= 5\n", "bad.toml:2:", "expected a key");
    BAD("[model]\nflavor = debug\n", "bad.toml:2:", "invalid value 'debug'", "strings need quotes");
    BAD("[training]\nsteps = 007\n", "bad.toml:2:", "leading zeros");
    BAD("[training]\nsteps = 1__0\n", "bad.toml:2:", "underscore");
    BAD("[optimizer]\nlr = 1.\n", "bad.toml:2:", "decimal point");
    BAD("[optimizer]\nlr = 1e\n", "bad.toml:2:", "exponent");
    BAD("[training]\nseed = 99999999999999999999\n", "bad.toml:2:", "64 bits");
    BAD("[training]\nstart = 1979-05-27\n", "bad.toml:2:", "unknown key training.start");
    BAD("[training]\nsteps = 1979-05-27\n", "bad.toml:2:", "invalid value '1979-05-27'");
    BAD("[training]\nsteps = 0x10\n", "bad.toml:2:", "invalid value '0x10'");
    BAD("[training]\nsteps = 5\x01\n", "bad.toml:2:", "invalid value");
    BAD("[training]\n\x01 = 5\n", "bad.toml:2:", "unexpected byte 0x01");
    BAD("[compile]\ncomponents = [\"model\",\n", "bad.toml:2:", "unterminated array");
    /* duplicates */
    BAD("[training]\nsteps = 5\n# again\nsteps = 6\n", "bad.toml:4:", "duplicate key training.steps",
        "first set at line 2");
    BAD("[training]\nlocal_batch_size = 4\nbatch_size = 4\n", "bad.toml:3:",
        "duplicate key training.local_batch_size");
    BAD("[checkpoint]\nenable = true\nenable_checkpoint = true\n", "bad.toml:3:", "duplicate key checkpoint.enable");
    BAD("[training]\nsteps = 5\n[job]\n[training]\nseq_len = 4\n", "bad.toml:4:", "section [training] defined twice",
        "line 1");
    BAD("[compile]\nenable = true\nenable = false\n", "bad.toml:3:", "duplicate key compile.enable");
    /* unknown names, with and without a suggestion */
    BAD("[trainig]\nsteps = 5\n", "bad.toml:1:", "unknown section [trainig]", "did you mean training?");
    BAD("[training]\nstepz = 5\n", "bad.toml:2:", "unknown key training.stepz", "did you mean training.steps?");
    BAD("[training]\nlr = 0.1\n", "bad.toml:2:", "unknown key training.lr", "did you mean optimizer.lr?");
    BAD("[training]\nmixed_precison_param = \"bfloat16\"\n", "bad.toml:2:",
        "did you mean training.mixed_precision_param?");
    BAD("[lr_scheduler]\nwarmup_step = 5\n", "did you mean lr_scheduler.warmup_steps?");
    BAD("[zzzzzzzz]\n", "bad.toml:1:", "unknown section [zzzzzzzz]");
    BAD("[training]\nfrobnicate_everything = 1\n", "unknown key training.frobnicate_everything");
    {
        tsr_train_config c;
        tsr_error e;
        char path[600];
        load_text(&c, "bad.toml", "[training]\nfrobnicate_everything = 1\n", &e, path, sizeof path);
        CHECK(!strstr(e.msg, "did you mean"), "no close key, no suggestion: %s", e.msg);
        load_text(&c, "bad.toml", "[zzzzzzzz]\n", &e, path, sizeof path);
        CHECK(!strstr(e.msg, "did you mean"), "no close section, no suggestion: %s", e.msg);
    }
    /* types: the message names the key, the value and the expected type */
    BAD("[training]\nsteps = \"ten\"\n", "bad.toml:2:", "training.steps", "\"ten\"", "expected an integer");
    BAD("[training]\nsteps = 2.5\n", "bad.toml:2:", "training.steps", "2.5", "expected an integer");
    BAD("[optimizer]\nlr = \"fast\"\n", "bad.toml:2:", "optimizer.lr", "\"fast\"", "expected a number");
    BAD("[optimizer]\nlr = true\n", "optimizer.lr", "true", "expected a number");
    BAD("[checkpoint]\nenable = 1\n", "bad.toml:2:", "checkpoint.enable", "expected true or false, got 1");
    BAD("[checkpoint]\nenable = \"yes\"\n", "checkpoint.enable", "\"yes\"", "expected true or false");
    BAD("[model]\nflavor = 5\n", "model.flavor", "expected a string, got 5");
    BAD("[job]\ndump_folder = 3\n", "job.dump_folder", "expected a string, got 3");
    BAD("[training]\nseq_len = [1]\n", "bad.toml:2:", "arrays are not supported");
    BAD("[lr_scheduler]\ndecay_type = \"cosin\"\n", "bad.toml:2:", "lr_scheduler.decay_type",
        "\"cosin\" is not one of", "\"linear\"", "did you mean cosine?");
    BAD("[model]\nflavor = \"70B\"\n", "model.flavor", "\"70B\" is not one of");
    BAD("[checkpoint]\nexport_dtype = \"float16\"\n", "checkpoint.export_dtype", "\"float16\"");
    BAD("[model]\nname = \"gpt2\"\n", "bad.toml:2:", "model.name", "llama3");
    BAD("[optimizer]\nname = \"SGD\"\n", "optimizer.name", "AdamW");
    BAD("[job]\ndump_folder = \"\"\n", "job.dump_folder", "must not be empty");
    /* ranges */
    BAD("[training]\nsteps = 0\n", "bad.toml:2:", "training.steps", "0 is out of range", ">= 1");
    BAD("[training]\nsteps = 3000000000\n", "training.steps", "out of range");
    BAD("[training]\nseq_len = 0\n", "training.seq_len", "out of range");
    BAD("[training]\nlocal_batch_size = -1\n", "training.local_batch_size", "out of range");
    BAD("[training]\nglobal_batch_size = 0\n", "training.global_batch_size", "or -1");
    BAD("[training]\nmax_norm = 0.0\n", "training.max_norm", "> 0");
    BAD("[training]\nseed = -2\n", "training.seed", "out of range");
    BAD("[optimizer]\nlr = 0\n", "bad.toml:2:", "optimizer.lr", "0 is out of range", "> 0");
    BAD("[optimizer]\nlr = -1e-3\n", "optimizer.lr", "-1e-3 is out of range");
    BAD("[optimizer]\nlr = nan\n", "optimizer.lr", "out of range");
    BAD("[optimizer]\nlr = inf\n", "optimizer.lr", "out of range");
    BAD("[optimizer]\nbeta1 = 1.0\n", "optimizer.beta1", "[0, 1)");
    BAD("[optimizer]\neps = 0.0\n", "optimizer.eps", "out of range");
    BAD("[optimizer]\nweight_decay = -0.1\n", "optimizer.weight_decay", "out of range");
    BAD("[lr_scheduler]\nwarmup_steps = -1\n", "lr_scheduler.warmup_steps", "out of range");
    BAD("[lr_scheduler]\ndecay_ratio = 1.5\n", "lr_scheduler.decay_ratio", "[0, 1]");
    BAD("[lr_scheduler]\nmin_lr_factor = -0.1\n", "lr_scheduler.min_lr_factor", "out of range");
    BAD("[parallelism]\ntensor_parallel_degree = 0\n", "parallelism.tensor_parallel_degree", "out of range");
    BAD("[parallelism]\npipeline_parallel_degree = -1\n", "parallelism.pipeline_parallel_degree", "out of range");
    BAD("[parallelism]\ndata_parallel_replicate_degree = -1\n", "data_parallel_replicate_degree", "out of range");
    BAD("[parallelism]\ndata_parallel_shard_degree = -2\n", "data_parallel_shard_degree",
        "-2 is out of range", "or -1 (the rest of the ranks)");
    BAD("[parallelism]\ndata_parallel_shard_degree = 0\n", "data_parallel_shard_degree", "out of range");
    BAD("[parallelism]\npipeline_parallel_microbatch_size = 0\n", "pipeline_parallel_microbatch_size");
    BAD("[parallelism]\ncontext_parallel_degree = 2\n", "bad.toml:2:", "parallelism.context_parallel_degree = 2",
        "not supported");
    BAD("[parallelism]\nexpert_parallel_degree = \"x\"\n", "expert_parallel_degree");
    BAD("[checkpoint]\ninterval = 0\n", "checkpoint.interval", "out of range");
    BAD("[checkpoint]\nkeep_latest_k = -1\n", "checkpoint.keep_latest_k", "out of range");
    BAD("[checkpoint]\nload_step = -5\n", "checkpoint.load_step", "out of range");
    BAD("[metrics]\nlog_freq = 0\n", "metrics.log_freq", "out of range");
    {
        char big[700];
        memset(big, 'a', sizeof big);
        snprintf(big, sizeof big, "[job]\ndescription = \"%0600d\"\n", 0);
        BAD(big, "job.description", "longer than 511 bytes");
    }

    /* a missing or unreadable file */
    tsr_train_config c;
    tsr_error e = {0};
    char path[600];
    snprintf(path, sizeof path, "%s/no-such.toml", tmpdir);
    CHECK(tsr_config_load(&c, path, &e) == TSR_ENOTFOUND && strstr(e.msg, "no-such.toml"), "%s", e.msg);
    CHECK(tsr_config_load(&c, tmpdir, &e) != 0 && strstr(e.msg, tmpdir), "a directory: %s", e.msg);
}

static void test_overrides(void) {
    tsr_train_config c;
    tsr_error e = {0};
    char path[600];
    CHECK_OK(load_text(&c, "base.toml", "[training]\nsteps = 100\nseq_len = 64\n", &e, path, sizeof path));
    CHECK_OK(tsr_config_override(&c, "--training.steps=50", &e));
    CHECK_OK(tsr_config_override(&c, "optimizer.lr=3e-4", &e));
    CHECK_OK(tsr_config_override(&c, "--job.description=a \"quoted\" run, no escapes\\n", &e));
    CHECK_OK(tsr_config_override(&c, "--checkpoint.enable", &e));
    CHECK_OK(tsr_config_override(&c, "--checkpoint.last_save_model_only=false", &e));
    CHECK_OK(tsr_config_override(&c, "--model.flavor=8B", &e));
    CHECK_OK(tsr_config_override(&c, "--training.max_norm=2", &e));
    CHECK_OK(tsr_config_override(&c, "--training.seed=-1", &e));
    CHECK_OK(tsr_config_override(&c, "--training.batch_size=4", &e));
    CHECK_OK(tsr_config_override(&c, "--checkpoint.async_mode=async_with_pinned_mem", &e));
    CHECK_OK(tsr_config_override(&c, "--lr_scheduler.decay_ratio=0.5", &e));
    CHECK_OK(tsr_config_override(&c, "--lr_scheduler.decay_ratio=-1", &e));
    CHECK_OK(tsr_config_override(&c, "--job.dump_folder=runs/x=y", &e));
    CHECK_OK(tsr_config_override(&c, "--parallelism.context_parallel_degree=1", &e));
    CHECK(c.training.steps == 50 && c.training.seq_len == 64, "override after the file: %d", c.training.steps);
    CHECK(c.optimizer.lr == 3e-4, "%g", c.optimizer.lr);
    CHECK(strcmp(c.job.description, "a \"quoted\" run, no escapes\\n") == 0, "strings verbatim: %s",
          c.job.description);
    CHECK(c.checkpoint.enable && !c.checkpoint.last_save_model_only, "bools");
    CHECK(c.model.flavor == TSR_FLAVOR_8B && c.training.max_norm == 2.0 && c.training.seed == -1, "misc");
    CHECK(c.training.local_batch_size == 4 && c.checkpoint.async_mode == TSR_ASYNC_ON, "alias, choice");
    CHECK(c.lr_scheduler.decay_ratio == -1.0, "decay_ratio back to unset");
    CHECK(strcmp(c.job.dump_folder, "runs/x=y") == 0, "the first '=' splits: %s", c.job.dump_folder);
    CHECK(c.n_warnings == 0, "%s", c.warnings);
    /* ignored keys warn; false does not */
    CHECK_OK(tsr_config_override(&c, "--compile.enable=true", &e));
    CHECK_OK(tsr_config_override(&c, "--float8.enable_fsdp_float8_all_gather=false", &e));
    CHECK_OK(tsr_config_override(&c, "--activation_checkpoint.mode", &e));
    CHECK(c.n_warnings == 2 && strstr(c.warnings, "command line: ignored on CPU: compile.enable = true") &&
              strstr(c.warnings, "activation_checkpoint.mode"),
          "%d: %s", c.n_warnings, c.warnings);

    BAD_OVERRIDE("--training.steps=ten", "--training.steps=ten", "training.steps", "\"ten\"", "expected an integer");
    BAD_OVERRIDE("--training.steps=1.5", "training.steps", "1.5", "expected an integer");
    BAD_OVERRIDE("--training.steps=0", "training.steps", "out of range");
    BAD_OVERRIDE("--optimizer.lr=-1", "optimizer.lr", "out of range");
    BAD_OVERRIDE("--optimizer.lr=", "optimizer.lr", "expected a number");
    BAD_OVERRIDE("--checkpoint.enable=yes", "checkpoint.enable", "\"yes\"", "true or false");
    BAD_OVERRIDE("--model.flavor=huge", "model.flavor", "\"huge\" is not one of");
    BAD_OVERRIDE("--training.stepz=5", "unknown key training.stepz", "did you mean training.steps?");
    BAD_OVERRIDE("--trainig.steps=5", "unknown section trainig", "did you mean training.steps?");
    BAD_OVERRIDE("--optimizer.learning_rate_of_doom=5", "unknown key optimizer.learning_rate_of_doom");
    BAD_OVERRIDE("--training.steps", "needs a value");
    BAD_OVERRIDE("--parallelism.context_parallel_degree=4", "not supported");
    BAD_OVERRIDE("--steps=5", "expected --section.key=value");
    BAD_OVERRIDE("--.steps=5", "expected --section.key=value");
    BAD_OVERRIDE("--training.=5", "expected --section.key=value");
    BAD_OVERRIDE("--training.steps.x=5", "dotted keys");
    BAD_OVERRIDE("--parallelism.tensor_parallel_degree=0", "parallelism.tensor_parallel_degree", "out of range");
    BAD_OVERRIDE("--checkpoint.local_interval=-1", "checkpoint.local_interval", "out of range");
    BAD_OVERRIDE("--checkpoint.local_interval=every", "checkpoint.local_interval", "expected an integer");
    BAD_OVERRIDE("--training.skip_data_steps=-2", "training.skip_data_steps", "out of range");
    BAD_OVERRIDE("--training.sdc_check_interval=-1", "training.sdc_check_interval", "out of range");
    BAD_OVERRIDE("--training.skip_data_after_step=-2", "training.skip_data_after_step", "out of range");
    /* a failed override leaves the config as it was */
    tsr_config_defaults(&c);
    CHECK(tsr_config_override(&c, "--training.steps=-3", &e) == TSR_EINVAL, "negative steps");
    CHECK(c.training.steps == 10000, "unchanged after a failed override: %d", c.training.steps);
}

static void test_validate(void) {
    tsr_train_config c;
    tsr_error e = {0};
    tsr_config_defaults(&c);
    CHECK_OK(tsr_config_validate(&c, 1, &e));
    CHECK(c.parallelism.data_parallel_shard_degree == 1 && c.training.global_batch_size == 8, "1 rank");
    CHECK(c.training.seed == TSR_CONFIG_DEFAULT_SEED, "seed -1 is the default %lld", (long long)c.training.seed);
    CHECK_OK(tsr_config_validate(&c, 1, &e)); /* idempotent */
    CHECK(c.training.global_batch_size == 8, "idempotent");

    struct {
        int rep, shard, tp, pp, world, want_shard;
        const char *err1, *err2;
    } cases[] = {
        {1, -1, 1, 1, 8, 8, NULL, NULL},
        {1, -1, 2, 1, 8, 4, NULL, NULL},
        {1, -1, 2, 2, 8, 2, NULL, NULL},
        {2, -1, 1, 1, 6, 3, NULL, NULL},
        {2, 2, 2, 1, 8, 2, NULL, NULL},
        {1, -1, 3, 1, 8, 0, "does not divide the world size 8", "tensor_parallel_degree (3)"},
        {1, -1, 4, 4, 8, 0, "= 16 does not divide", NULL},
        {1, 2, 2, 1, 8, 0, "= 4, but the job has 8 ranks", "data_parallel_shard_degree (2)"},
        {1, 4, 1, 1, 2, 0, "= 4, but the job has 2 ranks", "must equal the world size"},
        {1, 1, 1, 1, 1, 1, NULL, NULL},
        {1, 2, 1, 1, 1, 0, "but the job has 1 rank:", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tsr_config_defaults(&c);
        c.parallelism.data_parallel_replicate_degree = cases[i].rep;
        c.parallelism.data_parallel_shard_degree = cases[i].shard;
        c.parallelism.tensor_parallel_degree = cases[i].tp;
        c.parallelism.pipeline_parallel_degree = cases[i].pp;
        int rc = tsr_config_validate(&c, cases[i].world, &e);
        if (!cases[i].err1) {
            CHECK(rc == 0, "case %zu: %s", i, e.msg);
            CHECK(c.parallelism.data_parallel_shard_degree == cases[i].want_shard, "case %zu: shard %d", i,
                  c.parallelism.data_parallel_shard_degree);
            CHECK(c.training.global_batch_size == 8 * cases[i].rep * cases[i].want_shard, "case %zu: global %d", i,
                  c.training.global_batch_size);
        } else {
            CHECK(rc == TSR_EINVAL && strstr(e.msg, cases[i].err1), "case %zu: %s", i, e.msg);
            CHECK(!cases[i].err2 || strstr(e.msg, cases[i].err2), "case %zu: %s", i, e.msg);
            CHECK(c.parallelism.data_parallel_shard_degree == cases[i].shard, "case %zu: unchanged on error", i);
        }
    }

    /* global batch: -1 resolves; a multiple is gradient accumulation; else an error */
    tsr_config_defaults(&c);
    c.training.global_batch_size = 64;
    CHECK_OK(tsr_config_validate(&c, 4, &e));
    CHECK(c.training.global_batch_size == 64, "kept");
    c.training.global_batch_size = 20;
    CHECK(tsr_config_validate(&c, 4, &e) == TSR_EINVAL && strstr(e.msg, "training.global_batch_size (20)") &&
              strstr(e.msg, "= 32"),
          "%s", e.msg);
    /* pipeline micro-batches */
    tsr_config_defaults(&c);
    c.parallelism.pipeline_parallel_degree = 2;
    c.parallelism.pipeline_parallel_microbatch_size = 3;
    CHECK(tsr_config_validate(&c, 2, &e) == TSR_EINVAL && strstr(e.msg, "pipeline_parallel_microbatch_size (3)"),
          "%s", e.msg);
    c.parallelism.pipeline_parallel_microbatch_size = 4;
    CHECK_OK(tsr_config_validate(&c, 2, &e));
    /* warmup longer than the run: allowed, with a warning (once) */
    tsr_config_defaults(&c);
    c.training.steps = 50;
    CHECK_OK(tsr_config_validate(&c, 1, &e));
    CHECK_OK(tsr_config_validate(&c, 1, &e));
    CHECK(c.n_warnings == 1 && strstr(c.warnings, "lr_scheduler.warmup_steps (200) > training.steps (50)"), "%s",
          c.warnings);
    /* checkpoint.folder given while checkpoint.enable is false: a warning (once) */
    tsr_config_defaults(&c);
    CHECK_OK(tsr_config_override(&c, "--checkpoint.folder=mine", &e));
    CHECK_OK(tsr_config_validate(&c, 1, &e));
    CHECK_OK(tsr_config_validate(&c, 1, &e));
    CHECK(c.n_warnings == 1 && strstr(c.warnings, "checkpoint.folder (\"mine\") is set but checkpoint.enable is false"),
          "%d: %s", c.n_warnings, c.warnings);
    /* enabled, or the default folder: no warning */
    CHECK_OK(tsr_config_override(&c, "--checkpoint.enable", &e));
    c.warnings[0] = 0, c.n_warnings = 0;
    CHECK_OK(tsr_config_validate(&c, 1, &e));
    CHECK(c.n_warnings == 0, "enabled: %s", c.warnings);
    tsr_config_defaults(&c);
    CHECK_OK(tsr_config_validate(&c, 1, &e));
    CHECK(c.n_warnings == 0, "defaults: %s", c.warnings);
    /* a dataset path makes any dataset name fine */
    tsr_config_defaults(&c);
    strcpy(c.training.dataset, "mine");
    CHECK(tsr_config_validate(&c, 1, &e) == TSR_EINVAL, "no path");
    strcpy(c.training.dataset_path, "data/mine");
    CHECK_OK(tsr_config_validate(&c, 1, &e));
    CHECK(tsr_config_validate(&c, 0, &e) == TSR_EINVAL && strstr(e.msg, "world size 0"), "%s", e.msg);
}

static char *to_toml(const tsr_train_config *c) {
    char *text = NULL;
    size_t len = 0;
    int rc = tsr_config_to_toml(c, &text, &len);
    REQUIRE(rc == 0 && text && strlen(text) == len, "to_toml: %d", rc);
    return text;
}

static int same_config(const tsr_train_config *a, const tsr_train_config *b) {
    /* the text comparison covers every key; these are the fields it could hide */
    return a->optimizer.lr == b->optimizer.lr && a->optimizer.eps == b->optimizer.eps &&
           a->lr_scheduler.decay_ratio == b->lr_scheduler.decay_ratio && a->training.seed == b->training.seed &&
           strcmp(a->job.description, b->job.description) == 0 &&
           strcmp(a->training.dataset_path, b->training.dataset_path) == 0 &&
           a->parallelism.pipeline_parallel_schedule == b->parallelism.pipeline_parallel_schedule &&
           a->checkpoint.export_dtype == b->checkpoint.export_dtype && a->model.flavor == b->model.flavor &&
           a->checkpoint.enable == b->checkpoint.enable;
}

static void test_round_trip(void) {
    tsr_train_config a, b;
    tsr_error e = {0};
    char path[600];
    /* the defaults */
    tsr_config_defaults(&a);
    char *t1 = to_toml(&a);
    CHECK_OK(load_text(&b, "rt.toml", t1, &e, path, sizeof path));
    char *t2 = to_toml(&b);
    CHECK(strcmp(t1, t2) == 0 && same_config(&a, &b), "defaults round trip:\n%s\n---\n%s", t1, t2);
    CHECK(b.n_warnings == 0, "%s", b.warnings);
    CHECK(strstr(t1, "[checkpoint]\nenable = false\n") && strstr(t1, "decay_ratio = -1.0  # unset"),
          "canonical names and notes:\n%s", t1);
    CHECK(strstr(t1, "file = \"metrics.jsonl\"  # tessera's own key"), "our keys are marked:\n%s", t1);
    CHECK(strstr(t1, "lr = 0.0008\n") && strstr(t1, "eps = 1e-08\n") && strstr(t1, "max_norm = 1.0\n"),
          "short float text:\n%s", t1);
    free(t1);
    free(t2);

    /* every field changed, with awkward strings and floats */
    tsr_config_defaults(&a);
    strcpy(a.job.dump_folder, "dir with \"quotes\" and \\ back\\slashes");
    strcpy(a.job.description, "tab\tnew\nline cr\r bell\x07 del\x7f \xC3\xA9");
    a.model.flavor = TSR_FLAVOR_1B;
    a.optimizer.lr = 0.1 + 0.2; /* 0.30000000000000004: needs 17 digits */
    a.optimizer.beta1 = 1.0 / 3.0;
    a.optimizer.beta2 = 0.999;
    a.optimizer.eps = 1e-300;
    a.optimizer.weight_decay = 0;
    a.lr_scheduler.warmup_steps = 0;
    a.lr_scheduler.decay_ratio = 0.8;
    a.lr_scheduler.decay_type = TSR_DECAY_SQRT;
    a.lr_scheduler.min_lr_factor = 1.0;
    a.training.local_batch_size = 3;
    a.training.global_batch_size = 12;
    a.training.seq_len = 4096;
    a.training.max_norm = 1e30;
    a.training.steps = 2147483647;
    a.training.seed = 9007199254740992LL;
    strcpy(a.training.dataset, "fineweb-edu");
    strcpy(a.training.dataset_path, "/data/fw");
    a.parallelism.data_parallel_replicate_degree = 2;
    a.parallelism.data_parallel_shard_degree = 4;
    a.parallelism.tensor_parallel_degree = 8;
    a.parallelism.pipeline_parallel_degree = 16;
    a.parallelism.pipeline_parallel_microbatch_size = 3;
    a.parallelism.pipeline_parallel_schedule = TSR_SCHED_GPIPE;
    a.checkpoint.enable = true;
    strcpy(a.checkpoint.folder, "/abs/ck");
    a.checkpoint.interval = 1;
    a.checkpoint.keep_latest_k = 0;
    a.checkpoint.async_mode = TSR_ASYNC_ON;
    a.checkpoint.load_step = 1234;
    a.checkpoint.last_save_model_only = false;
    a.checkpoint.export_dtype = TSR_BF16;
    strcpy(a.checkpoint.initial_load_path, "s3://bucket/prefix/step-00000010");
    a.checkpoint.initial_load_model_only = false;
    a.metrics.log_freq = 1;
    strcpy(a.metrics.file, "/tmp/m.jsonl");
    a.checkpoint.local_interval = 3;
    strcpy(a.checkpoint.local_folder, "/dev/shm/run 7");
    strcpy(a.checkpoint.local_nodes, "0,5,9");
    a.training.skip_data_after_step = 120;
    a.training.skip_data_steps = 4;
    t1 = to_toml(&a);
    CHECK_OK(load_text(&b, "rt2.toml", t1, &e, path, sizeof path));
    t2 = to_toml(&b);
    CHECK(strcmp(t1, t2) == 0, "round trip:\n%s\n---\n%s", t1, t2);
    CHECK(same_config(&a, &b), "fields differ after the round trip:\n%s", t1);
    CHECK(strcmp(a.job.dump_folder, b.job.dump_folder) == 0, "%s", b.job.dump_folder);
    CHECK(b.optimizer.lr == 0.1 + 0.2 && b.optimizer.beta1 == 1.0 / 3.0 && b.optimizer.eps == 1e-300, "floats exact");
    CHECK(b.training.max_norm == 1e30 && b.training.steps == 2147483647, "extremes");
    CHECK(b.training.seed == 9007199254740992LL && b.checkpoint.load_step == 1234, "ints");
    CHECK(b.parallelism.pipeline_parallel_degree == 16 && b.parallelism.pipeline_parallel_microbatch_size == 3, "pp");
    CHECK(b.checkpoint.keep_latest_k == 0 && !b.checkpoint.initial_load_model_only, "ckpt");
    CHECK(strcmp(b.metrics.file, "/tmp/m.jsonl") == 0 && b.metrics.log_freq == 1, "metrics");
    CHECK(b.checkpoint.local_interval == 3 && !strcmp(b.checkpoint.local_folder, "/dev/shm/run 7") &&
              !strcmp(b.checkpoint.local_nodes, "0,5,9"),
          "local tier after the round trip:\n%s", t1);
    CHECK(b.training.skip_data_after_step == 120 && b.training.skip_data_steps == 4, "skip data after the round trip");
    free(t1);
    free(t2);
}

static void test_lr_schedule(void) {
    tsr_train_config c;
    tsr_config_defaults(&c);
    c.optimizer.lr = 1.0;
    c.training.steps = 100;
    c.lr_scheduler.warmup_steps = 10;
    c.lr_scheduler.min_lr_factor = 0.1;
    /* warmup: step s gets s/W */
    CHECK(fabs(tsr_config_lr_at(&c, 1) - 0.1) < 1e-12, "%g", tsr_config_lr_at(&c, 1));
    CHECK(fabs(tsr_config_lr_at(&c, 5) - 0.5) < 1e-12, "%g", tsr_config_lr_at(&c, 5));
    CHECK(tsr_config_lr_at(&c, 10) == 1.0, "%g", tsr_config_lr_at(&c, 10));
    /* cosine over the 90 remaining steps, never below the floor, never at it */
    double prev = 2.0;
    for (int s = 11; s <= 100; s++) {
        double lr = tsr_config_lr_at(&c, s);
        CHECK(lr <= prev && lr > 0.1 && lr < 1.0, "step %d: %g", s, lr);
        prev = lr;
    }
    /* step 55 is 45 of the 90 decay steps: progress 45/91 (the virtual last step) */
    double want = 0.1 + 0.9 * 0.5 * (1.0 + cos(M_PI * 45.0 / 91.0));
    CHECK(fabs(tsr_config_lr_at(&c, 55) - want) < 1e-12, "%g vs %g", tsr_config_lr_at(&c, 55), want);
    CHECK(tsr_config_lr_at(&c, 100) < 0.1 + 0.01, "the end nears the floor: %g", tsr_config_lr_at(&c, 100));
    /* linear with decay_ratio 0.5: stable until step 50, then the last 50 steps decay */
    c.lr_scheduler.decay_type = TSR_DECAY_LINEAR;
    c.lr_scheduler.decay_ratio = 0.5;
    c.lr_scheduler.min_lr_factor = 0.0;
    CHECK(tsr_config_lr_at(&c, 30) == 1.0 && tsr_config_lr_at(&c, 50) == 1.0, "stable phase");
    CHECK(fabs(tsr_config_lr_at(&c, 51) - 50.0 / 51.0) < 1e-12, "%g", tsr_config_lr_at(&c, 51));
    CHECK(fabs(tsr_config_lr_at(&c, 100) - 1.0 / 51.0) < 1e-12, "%g", tsr_config_lr_at(&c, 100));
    /* sqrt */
    c.lr_scheduler.decay_type = TSR_DECAY_SQRT;
    CHECK(fabs(tsr_config_lr_at(&c, 51) - (1.0 - sqrt(1.0 / 51.0))) < 1e-12, "%g", tsr_config_lr_at(&c, 51));
    /* no warmup; decay_ratio 0: constant */
    c.lr_scheduler.warmup_steps = 0;
    c.lr_scheduler.decay_ratio = 0.0;
    CHECK(tsr_config_lr_at(&c, 1) == 1.0 && tsr_config_lr_at(&c, 100) == 1.0, "constant");
    /* warmup longer than the run: still rising at the end */
    c.lr_scheduler.warmup_steps = 200;
    CHECK(fabs(tsr_config_lr_at(&c, 100) - 0.5) < 1e-12, "%g", tsr_config_lr_at(&c, 100));
}

static void test_warning_overflow(void) {
    tsr_train_config c;
    tsr_error e;
    char path[600];
    size_t cap = 200000, n = 0;
    char *text = malloc(cap);
    REQUIRE(text, "malloc");
    n += (size_t)snprintf(text + n, cap - n, "[profiling]\n");
    for (int i = 0; i < 200; i++)
        n += (size_t)snprintf(text + n, cap - n, "k%03d = \"a value long enough to fill the buffer\"\n", i);
    CHECK_OK(load_text(&c, "many.toml", text, &e, path, sizeof path));
    CHECK(c.n_warnings == 200, "%d", c.n_warnings);
    size_t len = strlen(c.warnings);
    CHECK(len < sizeof c.warnings && len > 0 && c.warnings[len - 1] == '\n', "cut at a line boundary");
    free(text);
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static void test_shipped_configs(void) {
    char dir[700];
    snprintf(dir, sizeof dir, "%s/train/configs", root);
    DIR *d = opendir(dir);
    REQUIRE(d, "cannot open %s", dir);
    int n = 0, seen_debug = 0, seen_small = 0, seen_124m = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!ends_with(de->d_name, ".toml")) continue;
        char path[1000];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        tsr_train_config c;
        tsr_error e = {0};
        int rc = tsr_config_load(&c, path, &e);
        CHECK(rc == 0, "%s", e.msg);
        if (rc) continue;
        n++;
        CHECK(c.n_warnings == 0, "%s: our configs use no ignored keys:\n%s", de->d_name, c.warnings);
        CHECK_OK(tsr_config_validate(&c, 1, &e));
        CHECK_OK(tsr_config_override(&c, "--training.steps=3", &e));
        if (strcmp(de->d_name, "debug.toml") == 0) {
            seen_debug = 1;
            CHECK(c.model.flavor == TSR_FLAVOR_DEBUG && c.training.seq_len == 64 &&
                      c.training.local_batch_size == 8,
                  "debug.toml");
            tsr_config_load(&c, path, &e);
            CHECK(c.training.steps == 100, "debug.toml: 100 steps, not %d", c.training.steps);
        } else if (strcmp(de->d_name, "small.toml") == 0) {
            seen_small = 1;
            tsr_config_load(&c, path, &e);
            CHECK(c.model.flavor == TSR_FLAVOR_SMALL && c.training.seq_len == 128 && c.training.local_batch_size >= 1,
                  "small.toml");
            CHECK(c.training.steps >= 100 && c.training.steps <= 350, "small.toml: %d steps", c.training.steps);
            CHECK(c.optimizer.lr == 1e-3 && c.lr_scheduler.warmup_steps < c.training.steps / 5, "small.toml lr");
            CHECK(c.checkpoint.enable && c.checkpoint.interval < c.training.steps && c.checkpoint.keep_latest_k == 3 &&
                      c.checkpoint.async_mode == TSR_ASYNC_ON,
                  "small.toml checkpoints");
        } else if (strcmp(de->d_name, "124m.toml") == 0) {
            seen_124m = 1;
            CHECK(c.model.flavor == TSR_FLAVOR_124M && c.training.seq_len == 64 && c.training.local_batch_size == 4,
                  "124m.toml");
        }
        /* each shipped file also survives the round trip */
        tsr_config_load(&c, path, &e);
        char *t1 = to_toml(&c);
        tsr_train_config b;
        char p2[600];
        CHECK_OK(load_text(&b, "shipped-rt.toml", t1, &e, p2, sizeof p2));
        char *t2 = to_toml(&b);
        CHECK(strcmp(t1, t2) == 0, "%s round trip", de->d_name);
        free(t1);
        free(t2);
    }
    closedir(d);
    CHECK(n >= 3 && seen_debug && seen_small && seen_124m, "%d configs found in %s", n, dir);
}

int main(void) {
    const char *t = getenv("TSR_TMP"), *r = getenv("TSR_ROOT");
    snprintf(tmpdir, sizeof tmpdir, "%s", t && *t ? t : ".");
    snprintf(root, sizeof root, "%s", r && *r ? r : ".");
    test_defaults();
    test_value_kinds();
    test_torchtitan_config();
    test_errors();
    test_overrides();
    test_validate();
    test_round_trip();
    test_lr_schedule();
    test_warning_overflow();
    test_shipped_configs();
    return check_done();
}
