/* Generates a reply with kvslice from C: `generate MODEL PROMPT [POLICY BUDGET]`.
 * Streams the text to stdout, then asks a follow-up question in the same session (its KV cache
 * is kept between turns) when KVSLICE_FOLLOW_UP is set, and prints the KV cache's size on
 * stderr. Build: cc generate.c -I../../crates/kvslice-capi/include -L<target>/debug -lkvslice */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvslice.h"

static bool print_token(void *user_data, uint32_t token, const char *text, size_t len) {
    (void)token;
    size_t *count = user_data;
    *count += 1;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return true;
}

static int check(KvsliceStatus status, const char *what) {
    if (status != KVSLICE_STATUS_OK) {
        fprintf(stderr, "%s failed (status %d): %s\n", what, (int)status, kvslice_last_error());
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3 && argc != 5) {
        fprintf(stderr, "usage: %s MODEL PROMPT [POLICY BUDGET]\n", argv[0]);
        return 2;
    }
    const char *device = getenv("KVSLICE_DEVICE");
    KvsliceModel *model = NULL;
    if (check(kvslice_model_open(argv[1], device ? device : "cpu", &model), "kvslice_model_open")) return 1;
    KvsliceSession *session = NULL;
    const char *policy = argc == 5 ? argv[3] : NULL;
    const char *budget = argc == 5 ? argv[4] : NULL;
    if (check(kvslice_session_new(model, policy, budget, &session), "kvslice_session_new")) return 1;

    KvsliceGenerateOptions options = kvslice_generate_options_default();
    options.max_new_tokens = 24;
    options.chat = getenv("KVSLICE_RAW") == NULL;
    size_t pieces = 0;
    if (check(kvslice_session_generate(session, argv[2], &options, print_token, &pieces), "kvslice_session_generate"))
        return 1;
    printf("\n");
    const char *follow_up = getenv("KVSLICE_FOLLOW_UP");
    if (follow_up) {
        if (check(kvslice_session_generate(session, follow_up, &options, print_token, &pieces), "second turn"))
            return 1;
        printf("\n");
    }
    uint64_t entries = 0, bytes = 0;
    if (check(kvslice_session_kv(session, &entries, &bytes), "kvslice_session_kv")) return 1;
    fprintf(stderr, "kv: %llu entries, %llu bytes; %zu pieces\n", (unsigned long long)entries,
            (unsigned long long)bytes, pieces);

    /* the model cannot go while a session uses it */
    if (kvslice_model_free(model) != KVSLICE_STATUS_BUSY) {
        fprintf(stderr, "kvslice_model_free did not refuse a model with a live session\n");
        return 1;
    }
    if (check(kvslice_session_free(session), "kvslice_session_free")) return 1;
    if (check(kvslice_model_free(model), "kvslice_model_free")) return 1;
    /* freed handles are refused, not dereferenced */
    if (kvslice_session_free(session) != KVSLICE_STATUS_INVALID_HANDLE) {
        fprintf(stderr, "a freed session handle was accepted\n");
        return 1;
    }
    return 0;
}
