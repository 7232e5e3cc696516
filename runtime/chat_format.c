/* Chat formatting (see chat_format.h): ChatML, the format of the published
 * instruct models' chat_template, until the container carries its own. */
#include "runtime/chat_format.h"

#include <stdlib.h>
#include <string.h>

/* A growing string; an allocation failure sticks (checked once at the end). */
typedef struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
} sbuf;

static void sb_put(sbuf *b, const char *s)
{
    size_t n = strlen(s);
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n + 1);
    b->len += n;
}

int pi2_chat_format(const struct pi2_engine *e, const pi2_chat_msg *msgs, size_t n, bool add_generation_prompt,
                    char **out, pi2_err *err)
{
    (void)e; /* every model is ChatML for now */
    sbuf b = {0};
    *out = NULL;
    sb_put(&b, "");
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].role || !*msgs[i].role || !msgs[i].content) {
            free(b.p);
            return pi2_err_set(err, PI2_EINVAL, "chat message %zu has no %s", i,
                               !msgs[i].role || !*msgs[i].role ? "role" : "content");
        }
        sb_put(&b, "<|im_start|>");
        sb_put(&b, msgs[i].role);
        sb_put(&b, "\n");
        sb_put(&b, msgs[i].content);
        sb_put(&b, "<|im_end|>\n");
    }
    if (add_generation_prompt)
        sb_put(&b, "<|im_start|>assistant\n");
    if (b.oom) {
        free(b.p);
        return pi2_err_set(err, PI2_ENOMEM, "out of memory formatting the chat");
    }
    *out = b.p;
    return 0;
}
