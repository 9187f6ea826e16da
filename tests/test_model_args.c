/* test_model_args.c: the model description of a checkpoint (the train.model blob):
 * its context length (max_seq_len) round-trips, a text written before the field
 * existed reads with the documented default, a bad value is refused, and the
 * shape comparison that guards resuming ignores it but still names a shape
 * that differs. */
#include <string.h>

#include "check.h"
#include "model.h"

int main(void) {
    tsr_error e = {0};
    tsr_model_args a, b;
    char text[512], why[256];
    CHECK_OK(tsr_model_args_get("debug", &a, &e));
    CHECK(a.max_seq_len == TSR_MODEL_DEFAULT_MAX_SEQ_LEN, "debug flavor: max_seq_len %d", a.max_seq_len);
    a.max_seq_len = 4096;
    tsr_model_args_to_text(&a, text, sizeof text);
    CHECK(strstr(text, " max_seq_len=4096") != NULL, "text: %s", text);
    CHECK_OK(tsr_model_args_parse(text, &b, &e));
    CHECK(b.max_seq_len == 4096 && b.dim == a.dim && b.vocab_size == a.vocab_size, "parsed max_seq_len %d", b.max_seq_len);
    CHECK(tsr_model_flavor_of(&b) && strcmp(tsr_model_flavor_of(&b), "debug") == 0, "the flavor is still debug");

    /* a checkpoint written before the field: the default */
    const char *old = "flavor=debug dim=128 n_layers=4 n_heads=4 n_kv_heads=2 ffn_dim=384 vocab_size=320 "
                      "norm_eps=9.99999975e-06 rope_theta=500000 rope_factor=0 rope_low=0 rope_high=0 rope_orig=0";
    CHECK_OK(tsr_model_args_parse(old, &b, &e));
    CHECK(b.max_seq_len == TSR_MODEL_DEFAULT_MAX_SEQ_LEN && TSR_MODEL_DEFAULT_MAX_SEQ_LEN == 2048, "old text: %d",
          b.max_seq_len);

    /* bad values */
    static const char *const bad[] = {" max_seq_len=0", " max_seq_len=-5", " max_seq_len=x", " max_seq_len=12q",
                                      " max_seq_len=99999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char t[600];
        snprintf(t, sizeof t, "%s%s", old, bad[i]);
        e.msg[0] = 0;
        CHECK(tsr_model_args_parse(t, &b, &e) == TSR_ECORRUPT && strstr(e.msg, "max_seq_len"), "%s: %s", bad[i], e.msg);
    }

    /* resuming: another context length is the same model; another shape is not */
    CHECK(tsr_model_args_compare(&a, old, why, sizeof why) == 0, "max_seq_len compared: %s", why);
    a.max_seq_len = 64;
    CHECK(tsr_model_args_compare(&a, text, why, sizeof why) == 0, "max_seq_len compared: %s", why);
    a.dim = 256, a.n_heads = 8;
    CHECK(tsr_model_args_compare(&a, text, why, sizeof why) == 1 && strncmp(why, "dim:", 4) == 0, "why: %s", why);
    return check_failures ? 1 : 0;
}
