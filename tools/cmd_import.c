/* cmd_import.c: tessera import: a Hugging Face Llama as a tessera checkpoint
 * (tsr_import, convert/). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "commands.h"

static const char USAGE[] =
    "usage: tessera import HFDIR OUT --layout L\n"
    "       tessera import --from dcp DCPDIR OUT [--step N]\n"
    "Reads a Hugging Face LlamaForCausalLM from HFDIR (config.json, and\n"
    "model.safetensors or shards listed in model.safetensors.index.json), converts\n"
    "q and k from its rotary convention back to Meta's, and writes the model as a\n"
    "committed tessera checkpoint OUT in layout L, in f32, with the model's shapes in\n"
    "the train.model blob (its context length from max_position_embeddings,\n"
    "2048 when config.json has none). Continue training from it with\n"
    "  tessera train --config ... --checkpoint.initial_load_path=OUT\n"
    "--from dcp: a PyTorch Distributed Checkpoint folder (FileSystemWriter's, as\n"
    "TorchTitan saves) into the tessera step directory OUT (local or s3://), as step\n"
    "N (default: the number of an OUT or DCPDIR ending in step-N, else 0): every\n"
    "tensor and value under its own name, what is not a tensor as the bytes DCP\n"
    "stored. DCP's metadata is a pickle that only PyTorch reads: this runs the\n"
    "Python package (tessera.dcp) under $TSR_PYTHON (default python3), which needs\n"
    "torch; convert only checkpoints you would load with torch.load.\n";

int tsr_cmd_import(int argc, char **argv) {
    const char *hf = NULL, *out = NULL, *layout = NULL, *from = NULL, *step = NULL, *v;
    for (int i = 1; i < argc; i++) {
        int r;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return fputs(USAGE, stdout), EXIT_OK;
        if ((r = tsr_opt(argc, argv, &i, "layout", 1, &v))) {
            if (r < 0) return EXIT_USAGE;
            layout = v;
        } else if ((r = tsr_opt(argc, argv, &i, "from", 1, &v))) {
            if (r < 0) return EXIT_USAGE;
            from = v;
        } else if ((r = tsr_opt(argc, argv, &i, "step", 1, &v))) {
            uint64_t u;
            if (r < 0 || tsr_parse_u64(v, &u)) return tsr_usage_error("import", "--step takes a step number");
            step = v;
        } else if (argv[i][0] == '-') {
            return tsr_usage_error("import", "unknown option %s (see --help)", argv[i]);
        } else if (!hf) {
            hf = argv[i];
        } else if (!out) {
            out = argv[i];
        } else {
            return tsr_usage_error("import", "HFDIR and OUT only");
        }
    }
    if (from && strcmp(from, "dcp") && strcmp(from, "hf"))
        return tsr_usage_error("import", "--from %s: dcp, or hf (the default)", from);
    if (from && !strcmp(from, "dcp")) {
        if (!hf || !out) return tsr_usage_error("import", "needs DCPDIR and OUT (see --help)");
        if (layout) return tsr_usage_error("import", "--layout is for a Hugging Face model; --from dcp keeps the chunks");
        return tsr_cmd_dcp("import", hf, out, step ? "--step" : NULL, step);
    }
    if (step) return tsr_usage_error("import", "--step is for --from dcp");
    if (!hf || !out) return tsr_usage_error("import", "needs HFDIR and OUT (see --help)");
    tsr_error e = {0};
    tsr_layout l = tsr_reshard_opts_default().layout;
    if (tsr_layout_parse(layout ? layout : "", &l, &e)) return tsr_usage_error("import", "--layout: %s", e.msg);
    tsr_import_info info;
    if (tsr_import(hf, out, &l, &info, &e)) {
        fprintf(stderr, "tessera import: %s\n", e.msg);
        return EXIT_FAIL;
    }
    char lt[128];
    tsr_layout_format(&info.layout, lt, sizeof lt);
    printf("imported %s (%s shapes, %.2fM parameters) into %s, layout %s\n", hf, info.flavor, info.n_params / 1e6, out,
           lt);
    return EXIT_OK;
}
