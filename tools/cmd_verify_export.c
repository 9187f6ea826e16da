/* cmd_verify_export.c: tessera verify-export: the digests an export records
 * (FORMAT.md 13) recomputed from the export alone (tsr_export_verify, convert/). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "commands.h"

static const char USAGE[] =
    "usage: tessera verify-export FILE_OR_DIR [--json]\n"
    "Recomputes from the export alone every tensor digest that `tessera export`\n"
    "recorded (FORMAT.md 13): FILE_OR_DIR is a GGUF file, a safetensors file, or a\n"
    "folder of model.safetensors or of the files its model.safetensors.index.json\n"
    "lists. One line per tensor: OK, MISMATCH (with the digest of the file's bytes\n"
    "and the recorded one), NOT RECORDED, UNSUPPORTED (a GGUF block type) or MISSING\n"
    "(recorded, but no file holds it); a tensor that keeps its checkpoint tensor's\n"
    "dtype and values also has that tensor's MANIFEST digest checked (source OK or\n"
    "MISMATCH). Then the recorded step and MANIFEST hash. Exit 1 when any digest\n"
    "differs or cannot be checked, when no digest at all is recorded, or when the\n"
    "files cannot be read.\n";

typedef struct report {
    FILE *out;
    int json;
    size_t n, ok, not_recorded;
} report;

static void on_check(void *user, const tsr_export_check *c) {
    report *r = user;
    r->n++;
    r->ok += c->status == TSR_EXPORT_OK && (!c->source || c->source_status == TSR_EXPORT_OK);
    r->not_recorded += c->status == TSR_EXPORT_NOT_RECORDED;
    if (r->json) {
        fprintf(r->out, "%s\n    {\"file\": ", r->n > 1 ? "," : "");
        tsr_json_str(r->out, c->file);
        fprintf(r->out, ", \"name\": ");
        tsr_json_str(r->out, c->name);
        fprintf(r->out, ", \"dtype\": \"%s\", \"status\": \"%s\"", c->dtype ? tsr_dtype_name(c->dtype) : "",
                tsr_export_status_name(c->status));
        if (c->status == TSR_EXPORT_OK || c->status == TSR_EXPORT_MISMATCH)
            fprintf(r->out, ", \"digest\": \"%016llx\"", (unsigned long long)c->digest);
        if (c->status != TSR_EXPORT_NOT_RECORDED) fprintf(r->out, ", \"recorded\": \"%016llx\"", (unsigned long long)c->recorded);
        if (c->source) {
            fprintf(r->out, ", \"source\": ");
            tsr_json_str(r->out, c->source);
            fprintf(r->out, ", \"source_status\": \"%s\", \"source_digest\": \"%016llx\", \"source_recorded\": \"%016llx\"",
                    tsr_export_status_name(c->source_status), (unsigned long long)c->source_digest,
                    (unsigned long long)c->source_recorded);
        }
        fprintf(r->out, "}");
        return;
    }
    fprintf(r->out, "%-12s %s", tsr_export_status_name(c->status), c->name);
    if (c->status == TSR_EXPORT_OK) fprintf(r->out, " %016llx", (unsigned long long)c->digest);
    else if (c->status == TSR_EXPORT_MISMATCH)
        fprintf(r->out, ": its bytes' digest is %016llx, %s records %016llx", (unsigned long long)c->digest, c->file,
                (unsigned long long)c->recorded);
    else if (c->status == TSR_EXPORT_UNSUPPORTED) fprintf(r->out, ": its stored type has no digest");
    else if (c->status == TSR_EXPORT_MISSING) fprintf(r->out, ": %s records a digest, no file holds it", c->file);
    if (c->source && c->source_status == TSR_EXPORT_OK) fprintf(r->out, " (source %s OK)", c->source);
    else if (c->source)
        fprintf(r->out, "; as source %s: %016llx, its MANIFEST's %016llx: MISMATCH", c->source,
                (unsigned long long)c->source_digest, (unsigned long long)c->source_recorded);
    fputc('\n', r->out);
}

int tsr_cmd_verify_export(int argc, char **argv) {
    const char *path = NULL;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return fputs(USAGE, stdout), EXIT_OK;
        if (!strcmp(argv[i], "--json")) json = 1;
        else if (argv[i][0] == '-') return tsr_usage_error("verify-export", "unknown option %s (see --help)", argv[i]);
        else if (!path) path = argv[i];
        else return tsr_usage_error("verify-export", "one FILE_OR_DIR only");
    }
    if (!path) return tsr_usage_error("verify-export", "needs FILE_OR_DIR (see --help)");
    report r = {stdout, json, 0, 0, 0};
    tsr_export_provenance p;
    tsr_error e = {0};
    if (json) fprintf(stdout, "{\n  \"tensors\": [");
    long bad = tsr_export_verify(path, on_check, &r, &p, &e);
    if (bad < 0) {
        if (json) fprintf(stdout, "\n  ]\n}\n");
        fprintf(stderr, "tessera verify-export: %s\n", e.msg);
        return EXIT_FAIL;
    }
    if (json) {
        fprintf(stdout, "\n  ],\n  \"path\": ");
        tsr_json_str(stdout, path);
        fprintf(stdout, ",\n  \"format\": \"%s\", \"files\": %zu,\n  \"step\": ",
                p.format == TSR_EXPORT_GGUF ? "gguf" : "safetensors", p.n_files);
        if (p.has_step) fprintf(stdout, "%llu", (unsigned long long)p.step);
        else fprintf(stdout, "null");
        fprintf(stdout, ", \"manifest_xxh3\": ");
        if (p.has_manifest) fprintf(stdout, "\"%016llx\"", (unsigned long long)p.manifest_xxh3);
        else fprintf(stdout, "null");
        fprintf(stdout, ",\n  \"checked\": %zu, \"ok\": %zu, \"failed\": %ld, \"not_recorded\": %zu\n}\n", r.n, r.ok, bad,
                r.not_recorded);
    } else {
        printf("%s: %s, %zu file(s), ", path, p.format == TSR_EXPORT_GGUF ? "GGUF" : "safetensors", p.n_files);
        if (p.has_step) printf("step %llu", (unsigned long long)p.step);
        else printf("no step recorded");
        if (p.has_manifest) printf(", MANIFEST %016llx", (unsigned long long)p.manifest_xxh3);
        printf(": %zu tensor(s), %zu OK, %ld failed, %zu not recorded\n", r.n, r.ok, bad, r.not_recorded);
    }
    if (!bad && r.n > 0 && r.not_recorded == r.n) {
        fprintf(stderr, "tessera verify-export: %s: no tensor digest is recorded (not written by tessera export, or "
                        "before it recorded them, or before format 1.4, whose digests it recorded under other keys, "
                        "tessera.digest.NAME): nothing verified\n", path);
        return EXIT_FAIL;
    }
    return bad ? EXIT_FAIL : EXIT_OK;
}
