/* Chat templates: the entry point (variables as HF passes them) and the
 * built-in templates, written in the same Jinja the interpreter runs. */
#include "formats/jinja_internal.h"

#include <stdlib.h>
#include <string.h>

/* The [INST] and Vicuna templates share this check: after an optional
 * system message, user and assistant turns alternate, a user turn first. */
#define JX_SPLIT_SYSTEM                                                                                              \
    "{%- if messages and messages[0].role == 'system' -%}\n"                                                       \
    "    {%- set system = messages[0].content -%}\n"                                                               \
    "    {%- set turns = messages[1:] -%}\n"                                                                        \
    "{%- else -%}\n"                                                                                                \
    "    {%- set turns = messages -%}\n"                                                                            \
    "{%- endif -%}\n"
#define JX_ALTERNATE                                                                                                 \
    "    {%- if (m.role == 'user') != (loop.index0 % 2 == 0) -%}\n"                                                \
    "        {{- raise_exception('roles must alternate user, assistant, user, ... after an optional system "        \
    "message') -}}\n"                                                                                               \
    "    {%- endif -%}\n"

static const char CHATML[] =
    "{% for m in messages %}\n"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}\n"
    "{% endfor %}\n"
    "{% if add_generation_prompt %}\n"
    "{{- '<|im_start|>assistant\\n' -}}\n"
    "{% endif %}\n";

/* Llama-2-chat: <s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {answer} </s><s>[INST] ... */
static const char LLAMA2[] =
    JX_SPLIT_SYSTEM
    "{%- for m in turns -%}\n"
    JX_ALTERNATE
    "    {%- if m.role == 'user' -%}\n"
    "        {%- set text = m.content -%}\n"
    "        {%- if loop.first and system is defined -%}\n"
    "            {%- set text = '<<SYS>>\\n' + system + '\\n<</SYS>>\\n\\n' + text -%}\n"
    "        {%- endif -%}\n"
    "        {{- bos_token + '[INST] ' + text | trim + ' [/INST]' -}}\n"
    "    {%- else -%}\n"
    "        {{- ' ' + m.content | trim + ' ' + eos_token -}}\n"
    "    {%- endif -%}\n"
    "{%- endfor -%}\n";

/* Mistral-Instruct: <s>[INST] {system}\n\n{user} [/INST]{answer}</s>[INST] ... */
static const char MISTRAL[] =
    JX_SPLIT_SYSTEM
    "{{- bos_token -}}\n"
    "{%- for m in turns -%}\n"
    JX_ALTERNATE
    "    {%- if m.role == 'user' and loop.first and system is defined -%}\n"
    "        {{- '[INST] ' + system + '\\n\\n' + m.content + ' [/INST]' -}}\n"
    "    {%- elif m.role == 'user' -%}\n"
    "        {{- '[INST] ' + m.content + ' [/INST]' -}}\n"
    "    {%- else -%}\n"
    "        {{- m.content + eos_token -}}\n"
    "    {%- endif -%}\n"
    "{%- endfor -%}\n";

/* Vicuna v1.1: {system} USER: {user} ASSISTANT: {answer}</s>USER: ... */
static const char VICUNA[] =
    JX_SPLIT_SYSTEM
    "{%- if system is not defined -%}\n"
    "    {%- set system = \"A chat between a curious user and an artificial intelligence assistant. \"\n"
    "                     \"The assistant gives helpful, detailed, and polite answers to the user's questions.\" -%}\n"
    "{%- endif -%}\n"
    "{{- system + ' ' -}}\n"
    "{%- for m in turns -%}\n"
    JX_ALTERNATE
    "    {%- if m.role == 'user' -%}\n"
    "        {{- 'USER: ' + m.content + ' ' -}}\n"
    "    {%- else -%}\n"
    "        {{- 'ASSISTANT: ' + m.content + eos_token -}}\n"
    "    {%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{- 'ASSISTANT:' -}}\n"
    "{%- endif -%}\n";

const char *const pi2_jinja_builtin_names[] = {"chatml", "llama2", "mistral", "vicuna", NULL};

const char *pi2_jinja_builtin(const char *name)
{
    static const char *const texts[] = {CHATML, LLAMA2, MISTRAL, VICUNA};
    for (size_t i = 0; name && pi2_jinja_builtin_names[i]; i++)
        if (strcmp(name, pi2_jinja_builtin_names[i]) == 0)
            return texts[i];
    return NULL;
}

/* The template as Jinja's lexer sees it: \r\n and \r become \n, and one
 * trailing newline goes (keep_trailing_newline is off). */
static void normalize(jx_ctx *c, const char *t, size_t n)
{
    char *s = jx_alloc(c, n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (t[i] == '\r') {
            s[k++] = '\n';
            if (i + 1 < n && t[i + 1] == '\n')
                i++;
        } else {
            s[k++] = t[i];
        }
    }
    if (k && s[k - 1] == '\n')
        k--;
    s[k] = 0;
    c->src = s;
    c->src_len = k;
}

static void bind(jx_frame *f, const char *name, jx_val v)
{
    size_t i = f->n++;
    f->names[i] = name;
    f->vals[i] = v;
}

static jx_val cstr(const char *s) { return s ? jx_str(s, strlen(s)) : jx_str("", 0); }

static void run(jx_ctx *c, const char *tmpl, size_t tmpl_len, const pi2_chat_msg *msgs, size_t n_msgs,
                const pi2_chat_vars *vars)
{
    normalize(c, tmpl, tmpl_len);
    jx_list *ml = jx_list_new(c, n_msgs);
    for (size_t i = 0; i < n_msgs; i++) {
        if (!msgs[i].role)
            jx_fail(c, 0, PI2_EINVAL, "message %zu has no role", i);
        jx_dict *d = jx_dict_new(c, 2);
        jx_dict_set(c, d, jx_str("role", 4), cstr(msgs[i].role));
        jx_dict_set(c, d, jx_str("content", 7), msgs[i].content ? cstr(msgs[i].content) : jx_none());
        jx_list_push(c, ml, (jx_val){.t = V_DICT, .u.d = d});
    }
    enum { NG = 10 };
    jx_frame *g = jx_alloc(c, sizeof *g), *top = jx_alloc(c, sizeof *top);
    g->names = jx_alloc(c, NG * sizeof *g->names);
    g->vals = jx_alloc(c, NG * sizeof *g->vals);
    g->cap = NG;
    bind(g, "messages", (jx_val){.t = V_LIST, .u.l = ml});
    bind(g, "bos_token", cstr(vars ? vars->bos_token : NULL));
    bind(g, "eos_token", cstr(vars ? vars->eos_token : NULL));
    bind(g, "add_generation_prompt", jx_bool(vars && vars->add_generation_prompt));
    bind(g, "tools", jx_none());
    bind(g, "documents", jx_none());
    bind(g, "raise_exception", (jx_val){.t = V_FUNC, .u.fn = FN_RAISE});
    bind(g, "range", (jx_val){.t = V_FUNC, .u.fn = FN_RANGE});
    bind(g, "namespace", (jx_val){.t = V_FUNC, .u.fn = FN_NAMESPACE});
    top->up = g;
    c->frame = top;
    jx_lex(c);
    jx_body body = jx_parse(c);
    jx_exec(c, &body);
}

int pi2_jinja_render(const char *tmpl, size_t tmpl_len, const pi2_chat_msg *msgs, size_t n_msgs,
                     const pi2_chat_vars *vars, char **out, size_t *out_len, pi2_err *err)
{
    if (out)
        *out = NULL;
    if (out_len)
        *out_len = 0;
    if (!out || (!tmpl && tmpl_len) || (!msgs && n_msgs))
        return pi2_err_set(err, PI2_EINVAL, "chat template: bad arguments");
    if (tmpl_len > JX_MAX_TEMPLATE)
        return pi2_err_set(err, PI2_ERANGE, "chat template: %zu bytes, more than the %d allowed", tmpl_len,
                           JX_MAX_TEMPLATE);
    jx_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return pi2_err_set(err, PI2_ENOMEM, "chat template: out of memory");
    if (setjmp(c->jb)) {
        int code = c->err.code ? c->err.code : PI2_EFORMAT;
        pi2_err_set(err, code, "%s", c->err.msg);
        free(c->out);
        jx_arena_free(c);
        free(c);
        return code;
    }
    run(c, tmpl ? tmpl : "", tmpl_len, msgs, n_msgs, vars);
    char *res = c->out ? c->out : pi2_strdup("");
    size_t len = c->out_len;
    jx_arena_free(c);
    free(c);
    if (!res)
        return pi2_err_set(err, PI2_ENOMEM, "chat template: out of memory");
    *out = res;
    if (out_len)
        *out_len = len;
    return 0;
}
