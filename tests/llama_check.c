/* llama_check.c: loads a GGUF file written by `tessera export --format gguf` in
 * llama.cpp (its own library, built elsewhere, through llama.h) and checks it
 * against tessera's own answers for the same prompt, given as files by
 * tests/test_llama.sh:
 *
 *   llama_check LIBDIR MODEL.gguf TEXT IDS GENERATED LOGITS TOL exact|rounded
 *     LIBDIR     the directory of llama.cpp's libraries (its CPU backends load from there)
 *     TEXT       the prompt's bytes
 *     IDS        tessera's ids of TEXT (`tessera data prep`), comma-separated
 *     GENERATED  `tessera logits --generate N` over TEXT: the N greedy ids, comma-separated
 *     LOGITS     `tessera logits --out` over IDS followed by the first N-1 GENERATED
 *                ids: float32, (len(IDS) + N - 1) x vocabulary
 *     TOL        the largest relative error ||llama - tessera|| / ||tessera|| of the
 *                logits of every position allowed
 *     exact      greedy decoding must give GENERATED (f32 weights);
 *     rounded    it may leave GENERATED only where tessera's own choice leads by
 *                less than twice the largest logit difference at that position
 *                (f16 and bf16 files: llama.cpp rounds activations to that type
 *                too, and near-ties may then go the other way)
 *
 * Checks, each failure printed with "FAIL:" and counted:
 *   - no warning or error from llama.cpp while it loads the model (its vocabulary
 *     is checked then), tokenizes, runs or detokenizes, but the one warning that
 *     the context llama.cpp rounds up to 256 positions exceeds the model's;
 *   - llama_tokenize(TEXT) (no BOS added: the file says so) gives exactly IDS;
 *   - llama_detokenize(IDS), and the pieces of the ids one by one, give TEXT;
 *   - the logits of every position of IDS and GENERATED, in one batch, are within
 *     TOL of LOGITS (flash attention off, f32 KV cache);
 *   - greedy decoding (the highest logit, the lowest id among equals) from TEXT,
 *     one token at a time through the KV cache, gives GENERATED (see exact and
 *     rounded), and its text is the bytes of the ids it gives.
 * Prints what it measured; exits 0 when every check passes, 1 otherwise.
 * Built without sanitizers: llama.cpp's libraries are not instrumented. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-backend.h"
#include "llama.h"

static int fails;
#define FAIL(...) (fprintf(stderr, "FAIL: " __VA_ARGS__), fputc('\n', stderr), fails++)

/* llama.cpp's log: warnings and errors are printed, and count as failures but
 * for the one named in `expected` (a prefix of the message): llama.cpp rounds a
 * context up to a multiple of 256 positions and then warns when that exceeds
 * the model's context length, as it does for these small models. */
static const char *phase = "start", *expected = "";
static char expected_buf[128];
static int last_level;
static void on_log(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level == GGML_LOG_LEVEL_CONT) level = (enum ggml_log_level)last_level;
    last_level = level;
    if (level != GGML_LOG_LEVEL_WARN && level != GGML_LOG_LEVEL_ERROR) return;
    int ok = *expected && strncmp(text, expected, strlen(expected)) == 0;
    fprintf(stderr, "llama.cpp (%s)%s: %s", phase, ok ? " (expected)" : "", text);
    if (!ok) FAIL("llama.cpp warned while %s: %s", phase, text);
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) b[n] = 0, *len = (size_t)n;
    return b;
}

static int *read_ids(const char *path, int *n) {
    size_t len;
    char *s = read_file(path, &len);
    if (!s) return NULL;
    int *ids = malloc((len / 2 + 1) * sizeof *ids);
    *n = 0;
    for (char *p = s, *end; ids && *p; p = end + (*end == ',')) {
        long x = strtol(p, &end, 10);
        if (end == p) break;
        ids[(*n)++] = (int)x;
    }
    free(s);
    return ids;
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

int main(int argc, char **argv) {
    if (argc != 9 || (strcmp(argv[8], "exact") && strcmp(argv[8], "rounded"))) {
        fprintf(stderr, "usage: llama_check LIBDIR MODEL.gguf TEXT IDS GENERATED LOGITS TOL exact|rounded\n");
        return 2;
    }
    const char *libdir = argv[1], *model_path = argv[2];
    double tol = atof(argv[7]);
    int exact = strcmp(argv[8], "exact") == 0;
    size_t text_len, logits_bytes;
    int T, G;
    char *text = read_file(argv[3], &text_len);
    int *ids = read_ids(argv[4], &T), *want_gen = read_ids(argv[5], &G);
    float *want = (float *)read_file(argv[6], &logits_bytes);
    if (!text || !ids || !want || !want_gen || T < 1 || G < 1) {
        fprintf(stderr, "FAIL: cannot read %s, %s, %s or %s\n", argv[3], argv[4], argv[5], argv[6]);
        return 1;
    }
    int P = T + G - 1; /* positions of the logits: the prompt and all generated ids but the last */
    llama_log_set(on_log, NULL);
    ggml_backend_load_all_from_path(libdir);
    llama_backend_init();

    phase = "loading the model";
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(model_path, mp);
    if (!model) {
        fprintf(stderr, "FAIL: llama.cpp cannot load %s\n", model_path);
        return 1;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int V = llama_vocab_n_tokens(vocab);
    if (logits_bytes != (size_t)P * (size_t)V * 4) {
        fprintf(stderr, "FAIL: %s: %zu bytes for %d tokens x %d\n", argv[6], logits_bytes, P, V);
        return 1;
    }
    printf("%s: vocabulary %d, context length %d, add BOS %d, add EOS %d\n", model_path, V,
           llama_model_n_ctx_train(model), llama_vocab_get_add_bos(vocab), llama_vocab_get_add_eos(vocab));

    /* text -> ids -> text */
    phase = "tokenizing";
    int cap = (int)text_len * 4 + 16;
    llama_token *got = malloc((size_t)cap * sizeof *got);
    int n = llama_tokenize(vocab, text, (int)text_len, got, cap, 1, 0);
    if (n != T || memcmp(got, ids, (size_t)T * sizeof *got) != 0) {
        FAIL("%s: llama.cpp tokenizes the %zu-byte text into %d ids, tessera into %d", model_path, text_len, n, T);
        for (int i = 0; i < n && i < T; i++)
            if (got[i] != ids[i]) {
                fprintf(stderr, "    first difference at %d: llama.cpp %d, tessera %d\n", i, got[i], ids[i]);
                break;
            }
    }
    char *back = malloc(text_len * 4 + 64);
    n = llama_detokenize(vocab, ids, T, back, (int)text_len * 4 + 64, 0, 0);
    if (n != (int)text_len || memcmp(back, text, text_len) != 0)
        FAIL("%s: llama_detokenize gives %d bytes, not the text's %zu (\"%.*s\")", model_path, n, text_len, n > 0 ? n : 0, back);
    size_t at = 0;
    for (int i = 0; i < T; i++) {
        n = llama_token_to_piece(vocab, ids[i], back + at, 16, 0, 0);
        at += n > 0 ? (size_t)n : 0;
    }
    if (at != text_len || memcmp(back, text, text_len) != 0)
        FAIL("%s: the pieces of the ids give %zu bytes, not the text", model_path, at);
    phase = "running";

    /* the logits of every position, the prompt and the generated ids in one batch */
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(P + 8);
    cp.n_batch = cp.n_ubatch = (uint32_t)(P + 8);
    cp.n_threads = cp.n_threads_batch = 1;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.type_k = cp.type_v = GGML_TYPE_F32;
    cp.no_perf = 1;
    uint32_t rounded = (cp.n_ctx + 255) / 256 * 256;
    if ((int)rounded > llama_model_n_ctx_train(model)) {
        snprintf(expected_buf, sizeof expected_buf, "llama_context: n_ctx_seq (%u) > n_ctx_train (%d)", rounded,
                 llama_model_n_ctx_train(model));
        expected = expected_buf;
    }
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "FAIL: llama.cpp cannot make a context\n");
        return 1;
    }
    struct llama_batch b = llama_batch_init(P, 0, 1);
    for (int i = 0; i < P; i++) {
        b.token[i] = i < T ? ids[i] : want_gen[i - T], b.pos[i] = i, b.n_seq_id[i] = 1, b.seq_id[i][0] = 0;
        b.logits[i] = 1;
    }
    b.n_tokens = P;
    if (llama_decode(ctx, b)) {
        fprintf(stderr, "FAIL: llama_decode of %d tokens\n", P);
        return 1;
    }
    double num = 0, den = 0, worst = 0, *band = calloc((size_t)P, sizeof *band);
    for (int i = 0; i < P; i++) {
        const float *l = llama_get_logits_ith(ctx, i), *w = want + (size_t)i * V;
        for (int v = 0; v < V; v++) {
            double d = (double)l[v] - w[v];
            num += d * d, den += (double)w[v] * w[v];
            if (fabs(d) > band[i]) band[i] = fabs(d);
        }
        if (band[i] > worst) worst = band[i];
    }
    double rel = sqrt(num / den);
    printf("logits of %d positions: relative error %.3g (tolerance %g), largest difference %.3g\n", P, rel, tol, worst);
    if (!(rel <= tol)) FAIL("%s: logits differ from tessera's: relative error %.3g > %g", model_path, rel, tol);

    /* greedy decoding from the text alone, one token at a time through the KV cache */
    llama_memory_clear(llama_get_memory(ctx), 1);
    struct llama_batch prompt = llama_batch_get_one(ids, T);
    if (llama_decode(ctx, prompt)) {
        fprintf(stderr, "FAIL: llama_decode of the prompt\n");
        return 1;
    }
    int *gen = malloc((size_t)G * sizeof *gen);
    for (int k = 0; k < G; k++) {
        if (k) {
            llama_token t = gen[k - 1];
            if (llama_decode(ctx, llama_batch_get_one(&t, 1))) {
                fprintf(stderr, "FAIL: llama_decode at generated token %d\n", k);
                return 1;
            }
        }
        gen[k] = argmax(llama_get_logits_ith(ctx, -1), V);
    }
    printf("llama.cpp generates:");
    for (int k = 0; k < G; k++) printf("%s%d", k ? "," : " ", gen[k]);
    printf("\n");
    int k = 0;
    while (k < G && gen[k] == want_gen[k]) k++;
    if (k < G) {
        const float *w = want + (size_t)(T - 1 + k) * V;
        double lead = (double)w[want_gen[k]] - w[gen[k]];
        if (exact || lead > 2 * band[T - 1 + k])
            FAIL("%s: greedy decoding differs from tessera's at generated token %d of %d: %d, tessera %d, whose logit "
                 "leads by %.3g (largest logit difference there %.3g)", model_path, k, G, gen[k], want_gen[k], lead,
                 band[T - 1 + k]);
        else
            printf("greedy decoding leaves tessera's at generated token %d of %d, where tessera's choice leads by "
                   "%.3g, within twice the logit difference there (%.3g): a near-tie\n", k, G, lead, band[T - 1 + k]);
    } else {
        printf("greedy decoding: %d tokens as tessera's\n", G);
    }
    phase = "detokenizing";
    char *cont = malloc((size_t)G * 64 + 1);
    n = llama_detokenize(vocab, gen, G, cont, G * 64, 0, 0);
    int same = n >= 0, pos = 0;
    for (int j = 0; same && j < G; j++)
        if (gen[j] < 256) same = pos < n && (unsigned char)cont[pos++] == gen[j];
    same = same && pos == n;
    if (!same) FAIL("%s: the generated text is not the bytes of the generated ids", model_path);
    else printf("continuation: \"%.*s\"\n", n, cont);

    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    free(text), free(ids), free(want), free(want_gen), free(got), free(back), free(gen), free(cont), free(band);
    return fails ? 1 : 0;
}
