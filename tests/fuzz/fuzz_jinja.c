/* Fuzz target: the chat-template interpreter (pi2_jinja_render). The input
 * is the template; its first byte, when the input is longer than one byte,
 * picks the conversation (none, a system turn and two turns, or turns out of
 * order) and add_generation_prompt. A render either succeeds with a
 * NUL-terminated string of the length it reports, or fails with a one-line
 * message that names the template and no output. An input that starts
 * (after that byte) with '{' is also read as a tokenizer_config.json
 * (pi2_jinja_config_parse), and its chat_template, if any, rendered. */
#include "formats/jinja.h"
#include "tests/fuzz/fuzz_util.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const pi2_chat_msg convs[3][4] = {
        {{"user", "x"}},
        {{"system", "Be brief."}, {"user", "Hi 'there' \xc3\xa9"}, {"assistant", " Hello! "}, {"user", NULL}},
        {{"assistant", "a"}, {"user", "{{ x }}"}, {"user", ""}, {"tool", "\n"}},
    };
    static const size_t nconv[3] = {0, 4, 4};
    unsigned sel = size > 1 ? data[0] : 0;
    const uint8_t *t = size > 1 ? data + 1 : data;
    size_t n = size > 1 ? size - 1 : size;
    char *tmpl = malloc(n ? n : 1); /* an exact copy: ASan sees reads past the end */
    if (!tmpl)
        return 0;
    memcpy(tmpl, t, n);
    pi2_chat_vars v = {"<s>", "</s>", (sel & 4) != 0};
    char *out = (char *)"not set";
    size_t len = 0;
    pi2_err err = {0};
    int rc = pi2_jinja_render(tmpl, n, convs[sel % 3], nconv[sel % 3], &v, &out, &len, &err);
    if (rc == 0) {
        if (!out || out[len] != 0)
            abort();
        free(out);
    } else if (out || err.code != rc || strncmp(err.msg, "chat template", 13) != 0 || strchr(err.msg, '\n')) {
        abort();
    }
    if (n && tmpl[0] == '{') {
        pi2_chat_config cc;
        pi2_err_clear(&err);
        if (pi2_jinja_config_parse(tmpl, n, "tokenizer_config.json", &cc, &err) == 0) {
            pi2_chat_vars cv = {cc.bos_token, cc.eos_token, true};
            if (cc.chat_template &&
                pi2_jinja_render(cc.chat_template, strlen(cc.chat_template), convs[1], 3, &cv, &out, &len, &err) == 0)
                free(out);
            pi2_jinja_config_free(&cc);
        } else if (cc.chat_template || cc.bos_token || cc.eos_token || !err.msg[0]) {
            abort();
        }
    }
    free(tmpl);
    return 0;
}
