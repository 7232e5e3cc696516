/* Fuzz target: the server's request reader (runtime/serve_json.c), the
 * input as a chat and as a completions body. A request read must hold
 * what the contract promises (messages with a role and content, a
 * prompt, values in range) and a chat one must format (ChatML through the
 * template renderer); a refused one gets a message. */
#include "runtime/chat_format.h"
#include "runtime/serve_json.h"
#include "tests/fuzz/fuzz_util.h"

#include <stdlib.h>
#include <string.h>

static void check(const pi2_api_req *r, bool chat)
{
    bool ok = r->temperature >= 0 && r->temperature <= 2 && r->top_p > 0 && r->top_p <= 1 && r->n_stop <= 16 &&
              r->max_tokens >= -1;
    for (size_t i = 0; i < r->n_stop; i++)
        ok = ok && r->stop[i];
    if (chat) {
        ok = ok && r->n_msgs > 0 && r->msgs;
        for (size_t i = 0; ok && i < r->n_msgs; i++)
            ok = r->msgs[i].role && *r->msgs[i].role && r->msgs[i].content;
    } else {
        ok = ok && r->prompt;
    }
    if (!ok) {
        fprintf(stderr, "a read request breaks the contract\n");
        abort();
    }
    if (!chat)
        return;
    char *text = NULL;
    pi2_err e = {0};
    int rc = pi2_chat_format(NULL, r->msgs, r->n_msgs, true, &text, &e);
    if (rc != 0 && rc != PI2_ENOMEM && rc != PI2_ERANGE) {
        fprintf(stderr, "a read chat request does not format: %s\n", e.msg);
        abort();
    }
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    for (int chat = 0; chat < 2; chat++) {
        pi2_api_req r;
        pi2_err err = {0};
        int rc = pi2_api_req_parse(&r, chat, (const char *)data, size, &err);
        if (rc == 0)
            check(&r, chat);
        else if (!err.msg[0] || (rc != PI2_EINVAL && rc != PI2_ENOMEM)) {
            fprintf(stderr, "a refused request: code %d, message '%s'\n", rc, err.msg);
            abort();
        }
        pi2_api_req_free(&r);
    }
    return 0;
}
