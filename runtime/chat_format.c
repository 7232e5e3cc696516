/* Chat formatting (see chat_format.h): a Jinja chat template rendered by
 * formats/jinja.h, ChatML when none is given. */
#include "runtime/chat_format.h"

#include <stdlib.h>
#include <string.h>

int pi2_chat_format(const pi2_chat_template *t, const pi2_chat_msg *msgs, size_t n, bool add_generation_prompt,
                    char **out, pi2_err *err)
{
    *out = NULL;
    for (size_t i = 0; i < n; i++)
        if (!msgs[i].role || !*msgs[i].role || !msgs[i].content)
            return pi2_err_set(err, PI2_EINVAL, "chat message %zu has no %s", i,
                               !msgs[i].role || !*msgs[i].role ? "role" : "content");
    const char *text = t && t->text ? t->text : pi2_jinja_builtin("chatml");
    pi2_chat_vars v = {.bos_token = t && t->bos ? t->bos : "", .eos_token = t && t->eos ? t->eos : "",
                       .add_generation_prompt = add_generation_prompt};
    size_t len;
    int rc = pi2_jinja_render(text, strlen(text), msgs, n, &v, out, &len, err);
    if (rc)
        return rc;
    size_t nb = strlen(v.bos_token);
    if (nb > 0 && len >= nb && memcmp(*out, v.bos_token, nb) == 0) /* the encoder adds BOS */
        memmove(*out, *out + nb, len - nb + 1);
    return 0;
}

int pi2_chat_template_load(const char *spec, pi2_chat_template *t, pi2_chat_config *cc, pi2_err *err)
{
    memset(t, 0, sizeof *t);
    memset(cc, 0, sizeof *cc);
    if ((t->text = pi2_jinja_builtin(spec)) != NULL)
        return 0;
    char buf[4096];
    const char *path = spec;
    if (pi2_is_dir(spec)) {
        if (!pi2_path_join(buf, sizeof buf, spec, "tokenizer_config.json"))
            return pi2_err_set(err, PI2_ERANGE, "%s: path too long", spec);
        path = buf;
    }
    char *data;
    size_t len;
    int rc = pi2_read_file(path, 4u << 20, &data, &len, err);
    if (rc)
        return rc;
    size_t k = 0;
    while (k < len && (data[k] == ' ' || data[k] == '\n' || data[k] == '\t' || data[k] == '\r'))
        k++;
    if (k < len && data[k] == '{' && (rc = pi2_jinja_config_parse(data, len, path, cc, err)) == 0) {
        free(data);
        if (!cc->chat_template) {
            pi2_jinja_config_free(cc);
            return pi2_err_set(err, PI2_ENOTFOUND, "%s: no chat_template in it", path);
        }
        t->text = cc->chat_template;
        t->bos = cc->bos_token;
        t->eos = cc->eos_token;
        return 0;
    }
    if (rc) { /* JSON, but not a tokenizer_config.json this reader takes */
        free(data);
        return rc;
    }
    cc->chat_template = data; /* the template's own text */
    t->text = data;
    return 0;
}
