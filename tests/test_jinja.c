/* Tests for formats/jinja: the chat-template interpreter. Unit cases with
 * their exact output, errors with their exact codes and positions, hostile
 * templates (deep nesting, endless loops, huge output, random mutations of
 * real templates), and an oracle check: published chat templates, the
 * built-ins and the unit cases rendered over generated conversations by
 * Jinja itself (Python's jinja2, configured as Hugging Face transformers
 * configures it), compared byte for byte. The oracle part is skipped, saying
 * so, when no python3 with jinja2 is found; the TurboSparse template when
 * the shared directory is absent. */
#include "tests/testutil.h"

#include "formats/jinja.h"

#include <jansson.h>

/* ---- published templates (the text of their tokenizer_config.json) ---- */

/* meta-llama/Llama-2-7b-chat-hf */
static const char LLAMA2_CHAT[] =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
    "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif "
    "%}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ "
    "raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if "
    "loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
    "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if "
    "message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] "
    "== 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";

/* mistralai/Mistral-7B-Instruct-v0.1 (first release) */
static const char MISTRAL_V01[] =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ "
    "raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if "
    "message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == "
    "'assistant' %}{{ message['content'] + eos_token + ' ' }}{% else %}{{ raise_exception('Only user and assistant "
    "roles are supported!') }}{% endif %}{% endfor %}";

/* HuggingFaceH4/zephyr-7b-beta */
static const char ZEPHYR[] =
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] + "
    "eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + eos_token "
    "}}\n{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% "
    "endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}";

/* transformers' default ChatML template */
static const char CHATML_HF[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + "
    "'\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/* meta-llama/Meta-Llama-3-8B-Instruct */
static const char LLAMA3[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 "
    "%}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

/* google/gemma-7b-it */
static const char GEMMA[] =
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% "
    "endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ "
    "raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if "
    "(message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif "
    "%}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if "
    "add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}";

/* An indented multi-line template of the kind community fine-tunes publish
 * (lstrip_blocks and trim_blocks at work, a title filter). */
static const char INDENTED[] =
    "{% if messages[0]['role'] == 'system' %}\n"
    "    {% set loop_messages = messages[1:] %}\n"
    "    {% set system_message = messages[0]['content']  + ' ' %}\n"
    "{% else %}\n"
    "    {% set loop_messages = messages %}\n"
    "    {% set system_message = '' %}\n"
    "{% endif %}\n"
    "{% for message in loop_messages %}\n"
    "    {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\n"
    "        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}\n"
    "    {% endif %}\n"
    "    {% if loop.index0 == 0 %}\n"
    "        {% set content = system_message + message['content'] %}\n"
    "    {% else %}\n"
    "        {% set content = message['content'] %}\n"
    "    {% endif %}\n"
    "    {{ (message['role'] | title) + ': ' + content + '\\n' }}\n"
    "{% endfor %}\n"
    "{% if add_generation_prompt %}\n"
    "    {{ 'Assistant:' }}\n"
    "{% endif %}\n";

/* Mistral's later templates: {%- -%} control, selectattr, a system message
 * folded into the last user turn. */
static const char MISTRAL_LATER[] =
    "{%- if messages[0][\"role\"] == \"system\" %}\n"
    "    {%- set system_message = messages[0][\"content\"] %}\n"
    "    {%- set loop_messages = messages[1:] %}\n"
    "{%- else %}\n"
    "    {%- set loop_messages = messages %}\n"
    "{%- endif %}\n"
    "{%- set user_messages = loop_messages | selectattr(\"role\", \"equalto\", \"user\") | list %}\n"
    "\n"
    "{%- for message in loop_messages %}\n"
    "    {%- if (message[\"role\"] == \"user\") != (loop.index0 % 2 == 0) %}\n"
    "        {{- raise_exception(\"After the optional system message, conversation roles must alternate "
    "user/assistant/user/assistant/...\") }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "\n"
    "{{- bos_token }}\n"
    "{%- for message in loop_messages %}\n"
    "    {%- if message[\"role\"] == \"user\" %}\n"
    "        {%- if loop.last and system_message is defined %}\n"
    "            {{- \"[INST] \" + system_message + \"\\n\\n\" + message[\"content\"] + \"[/INST]\" }}\n"
    "        {%- else %}\n"
    "            {{- \"[INST] \" + message[\"content\"] + \"[/INST]\" }}\n"
    "        {%- endif %}\n"
    "    {%- elif message[\"role\"] == \"assistant\" %}\n"
    "        {{- \" \" + message[\"content\"] + eos_token}}\n"
    "    {%- else %}\n"
    "        {{- raise_exception(\"Only user and assistant roles are supported, with the exception of an initial "
    "optional system message!\") }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n";

/* In the style of Qwen2.5's template (its tools branch cut): attribute
 * access, tool turns merged into one user turn, neighbours by index. */
static const char QWEN_STYLE[] =
    "{%- if tools %}\n"
    "    {{- raise_exception('no tools here') }}\n"
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or "
    "(message.role == \"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n";

/* ---- helpers ---- */

static const pi2_chat_msg M3[] = {
    {"system", "Be brief."},
    {"user", "Hi 'there'"},
    {"assistant", "Hello!"},
};
static const pi2_chat_vars V3 = {"<s>", "</s>", true};

/* Render t over msgs; returns the code, *out (caller frees) on success. */
static int render(const char *t, const pi2_chat_msg *msgs, size_t n, const pi2_chat_vars *v, char **out,
                  pi2_err *e)
{
    size_t len = 0;
    pi2_err_clear(e);
    int rc = pi2_jinja_render(t, strlen(t), msgs, n, v, out, &len, e);
    if (rc == 0) {
        assert_non_null(*out);
        assert_int_equal((*out)[len], 0);
    } else {
        assert_null(*out);
        assert_int_equal(e->code, rc);
        assert_null(strchr(e->msg, '\n'));
        assert_true(strncmp(e->msg, "chat template", 13) == 0);
    }
    return rc;
}

typedef struct {
    const char *tmpl, *want;
} ucase;

static const ucase UNIT[] = {
    {"{{ messages|length }}", "3"},
    {"{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|"
     "{% endfor %}",
     "10TrueFalse3|21FalseFalse3|32FalseTrue3|"},
    {"{{ messages[0].role }}{{ messages[-1]['content'] }}", "systemHello!"},
    {"{% set x = 'a' ~ 1 ~ none %}{{ x }}", "a1None"},
    {"{% if not add_generation_prompt %}no{% elif messages|length > 2 %}many{% else %}few{% endif %}", "many"},
    {"{{ 7 % 3 }} {{ -7 % 3 }} {{ 7 // -2 }} {{ 2 ** 10 }} {{ 1 + 2 * 3 }} {{ -2 ** 2 }}", "1 2 -4 1024 7 4"},
    {"{{ messages[1:]|length }}{{ 'h\xc3\xa9llo'[1:3] }}{{ 'abc'[::-1] }}{{ [1, 2, 3][:-1] }}",
     "2\xc3\xa9l" "cba[1, 2]"},
    {"{{ '  x  '|trim }}|{{ 'Ab'|upper }}{{ 'Ab'|lower }}|{{ 'hello wORLD'|title }}|{{ 'hELLO'|capitalize }}",
     "x|ABab|Hello World|Hello"},
    {"{{ messages[0]|tojson }}", "{\"role\": \"system\", \"content\": \"Be brief.\"}"},
    {"{{ x is defined }}{{ bos_token is string }}{{ none is none }}{{ 3 is odd }}{{ 4 is divisibleby 2 }}"
     "{{ tools is none }}{{ x is not defined }}",
     "FalseTrueTrueTrueTrueTrueTrue"},
    {"{{ 'a' in 'cat' }}{{ 'system' in messages|map(attribute='role') }}{{ 2 not in [1] }}{{ 1 < 2 < 3 }}",
     "TrueTrueTrueTrue"},
    {"{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}", "3"},
    {"{% set x = 1 %}{% for m in messages %}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}", "2221"},
    {"{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}"
     "{{ i }}{% endfor %}",
     "0134"},
    {"{{ messages|selectattr('role', 'equalto', 'user')|list|length }}"
     "{{ messages|map(attribute='role')|join(',') }}",
     "1system,user,assistant"},
    {"{% for m in messages if m.role != 'system' %}{{ loop.index }}{{ m.role }}{% else %}none{% endfor %}"
     "{% for x in [] %}x{% else %}empty{% endfor %}",
     "1user2assistantempty"},
    {"  {% if true %}\n  x\n  {% endif %}\n  {# c #}\n{{ 1 }}  \n{% if true -%}\n\n  z {%- endif %}\n",
     "  x\n1  \nz"},
    {"{{ ' a '.strip() }}|{{ 'a,b'.split(',')|join('+') }}|{{ 'xy'.startswith('x') }}{{ 'xy'.endswith('x') }}|"
     "{{ {'a': 1}.get('b', 2) }}{% for k, v in {'a': 1}.items() %}{{ k }}={{ v }}{% endfor %}",
     "a|a+b|TrueFalse|2a=1"},
    {"{{ 'a\\nb\\t\\u00e9\\x41' }}", "a\nb\t\xc3\xa9" "A"},
    {"{{ [1, 'a', none, true] }}{{ {'k': 'it\\'s'} }}", "[1, 'a', None, True]{'k': \"it's\"}"},
    {"{{ 'y' if messages else 'n' }}{{ 'z' if false }}", "y"},
    {"{% set s %}a{{ 1 }}{% endset %}{{ s }}{{ s|length }}", "a12"},
    {"{{ x|default('d') }}{{ ''|default('e', true) }}{{ 'v'|d('w') }}", "dev"},
    {"{{ {'a': {'b': 1}} }}", "{'a': {'b': 1}}"},
    {"{% for i in [1,2,3] %}{{ loop.cycle('a','b') }}{{ loop.revindex }}{% endfor %}", "a3b2a1"},
    {"{{ '\xc3\xa9\xe6\x97\xa5\xf0\x9f\x99\x82'|length }}{% for ch in '\xc3\xa9\xe6\x97\xa5' %}[{{ ch }}]{% endfor %}",
     "3[\xc3\xa9][\xe6\x97\xa5]"},
    {"{{ 'ab' * 2 + '-' }}{{ [1] + [2] }}{{ (1, 'a') }}{{ (1,) }}{{ () }}", "abab-[1, 2](1, 'a')(1,)()"},
    {"{{ {'a': [1, 2]}|tojson(indent=2) }}", "{\n  \"a\": [\n    1,\n    2\n  ]\n}"},
    {"a\n  {%+ if true %}b{% endif %}", "a\n  b"},
    {"a\r\nb\n", "a\nb"},
    {"{% for a in [1,2] %}{% set outer = loop %}{% for b in [3] %}{{ outer.index }}{{ loop.index }}{% endfor %}"
     "{% endfor %}",
     "1121"},
    {"{{ 1 -}}   \n  {{- 2 }}", "12"},
    {"{{ 'it''s' }} {{ \"q\\\"\" }} {{ '\\\\' }}", "its q\" \\"},
    {"{{ messages[5] }}|{{ messages[0].nope }}|{{ messages[0]['nope'] is defined }}", "||False"},
    {"{% for m in messages %}{{ m.content|tojson }}{% endfor %}", "\"Be brief.\"\"Hi 'there'\"\"Hello!\""},
    {"{{ '\"<\\t>\\u2028'|tojson }}", "\"\\\"<\\t>\xe2\x80\xa8\""},
    {"{{ messages|rejectattr('role', 'in', ['system', 'user'])|map(attribute='content')|first }}", "Hello!"},
    {"{{ (messages|last).role|upper }}{{ messages|first|length }}{{ 'abc'|reverse }}{{ [1,2]|reverse|list }}",
     "ASSISTANT2cba[2, 1]"},
    {"{{ 'a-b c'.title() }}/{{ 'a-b c'|title }}/{{ \"o'neil 1st\".title() }}/{{ \"o'neil 1st\"|title }}",
     "A-B C/A-B C/O'Neil 1St/O'neil 1st"},
    {"{{ 'a b  c'.split() }}{{ 'a'.replace('a', 'bb') }}{{ 'aaa'|replace('a', 'b', 2) }}", "['a', 'b', 'c']bbbba"},
    {"{% if messages[0]['role'] == 'system' and not (messages|length < 2 or false) %}ok{% endif %}", "ok"},
    {"{{ '%' ~ (3 - 1) ~ '%' }}{{ 10 - 3 - 2 }}{{ 2 * 3 % 4 }}", "%2%52"},
    {"{# a comment with {{ tags }} and %} #}x{#- strip -#}  y", "xy"},
    {"{{ range(3)|list }}{{ range(1, 7, 2)|join }}{{ range(3, 0, -1)|list }}", "[0, 1, 2]135[3, 2, 1]"},
    {"{{ range(-9223372036854775807, 9223372036854775807, 4611686018427387904)|list }}"
     "{{ range(9223372036854775807, -9223372036854775807, -9223372036854775807)|list }}",
     "[-9223372036854775807, -4611686018427387903, 1, 4611686018427387905]"
     "[9223372036854775807, 0]"},
    {"{{ [1, 2, 3, 4][::9223372036854775807] }}{{ 'abcd'[3::-9223372036854775807] }}{{ 'abcd'[-100:100:2] }}"
     "{{ [1, 2, 3][5:1:-1] }}{{ 'abc'[1:1] }}",
     "[1]dac[3]"},
    {"{{ true and 'x' }}{{ 0 or 'y' }}{{ none or [] }}{{ 1 == true }}{{ 'a' < 'b' }}{{ [1, 2] < [1, 3] }}",
     "xy[]TrueTrueTrue"},
    {"{{ none.x }}|{{ none['x'] }}|{{ 5[0] }}|{{ 'abc'[10] }}|{{ 'abc'.x }}|{{ [1].x }}|{{ loop }}|{{ 1.x }}",
     "|||||||"},
    {"{{ x == y }}{{ x == none }}{{ none == none }}{{ true + 1 }}{{ true ~ 1 }}", "TrueFalseTrue2True1"},
    {"{{ 'abc'|first }}{{ '\xc3\xa9'|list }}{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}{{ {'b': 1}|items|list }}",
     "a['\xc3\xa9']{\"a\": 2, \"b\": 1}[('b', 1)]"},
    {"{{ ''.split() }}{{ 'a,b,'.split(',') }}{{ 'a  b '.split(' ') }}{{ ' a b c '.split(none, 1) }}",
     "[]['a', 'b', '']['a', '', 'b', '']['a', 'b c ']"},
    {"{{ x ~ 'a' }}{{ x|trim }}{{ x|length }}{% for a in x %}{% endfor %}{{ 'a' in x }}{{ 'a' not in x }}"
     "{{ x is sequence }}",
     "a0FalseTrueTrue"},
    {"{% for m in messages %}{% if loop.first %}{% continue %}{% endif %}{{ loop.previtem.role }}>{{ m.role }}"
     "{{ loop.nextitem is defined }} {% endfor %}",
     "system>userTrue user>assistantFalse "},
    {"{% for m in messages %}\n    {% for k, v in m.items() %}\n        {{- k }}={{ v }};\n    {% endfor %}\n"
     "{% endfor %}",
     "role=system;\ncontent=Be brief.;\nrole=user;\ncontent=Hi 'there';\nrole=assistant;\ncontent=Hello!;\n"},
    {"{%- set a = 1 -%}\n\n  {{ a }}  \n  {%- if a %} x {% endif -%}  \n  y\t{#- c #}\n", "1 x y"},
    {"{% if true %}  a  {% endif %}\n  b{%+ if true %}\n{% endif %}", "  a    b"},
    {"\t{% if true %}\n\tx\n\t{% endif %}\n \t {# c #} \n", "\tx\n "},
};

static void test_unit(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof UNIT / sizeof UNIT[0]; i++) {
        char *out = NULL;
        pi2_err e;
        int rc = render(UNIT[i].tmpl, M3, 3, &V3, &out, &e);
        if (rc || strcmp(out, UNIT[i].want) != 0) {
            fprintf(stderr, "case %zu: %s\n  got:  %s\n  want: %s\n", i, UNIT[i].tmpl, rc ? e.msg : out,
                    UNIT[i].want);
            fail();
        }
        free(out);
    }
}

static void test_builtins(void **state)
{
    (void)state;
    static const struct {
        const char *name, *want;
    } cases[] = {
        {"chatml", "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi 'there'<|im_end|>\n"
                   "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>assistant\n"},
        {"llama2", "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi 'there' [/INST] Hello! </s>"},
        {"mistral", "<s>[INST] Be brief.\n\nHi 'there' [/INST]Hello!</s>"},
        {"vicuna", "Be brief. USER: Hi 'there' ASSISTANT: Hello!</s>ASSISTANT:"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *t = pi2_jinja_builtin(cases[i].name);
        assert_non_null(t);
        assert_string_equal(pi2_jinja_builtin_names[i], cases[i].name);
        char *out = NULL;
        pi2_err e;
        assert_int_equal(render(t, M3, 3, &V3, &out, &e), 0);
        assert_string_equal(out, cases[i].want);
        free(out);
    }
    assert_null(pi2_jinja_builtin_names[4]);
    assert_null(pi2_jinja_builtin("nope"));
    assert_null(pi2_jinja_builtin(NULL));
    /* no system message; a user turn to answer */
    const pi2_chat_msg two[] = {{"user", " q1 "}, {"assistant", "a1"}, {"user", "q2"}};
    char *out = NULL;
    pi2_err e;
    assert_int_equal(render(pi2_jinja_builtin("llama2"), two, 3, &V3, &out, &e), 0);
    assert_string_equal(out, "<s>[INST] q1 [/INST] a1 </s><s>[INST] q2 [/INST]");
    free(out);
    assert_int_equal(render(pi2_jinja_builtin("vicuna"), two, 1, &V3, &out, &e), 0);
    assert_string_equal(out, "A chat between a curious user and an artificial intelligence assistant. The assistant "
                             "gives helpful, detailed, and polite answers to the user's questions. USER:  q1  "
                             "ASSISTANT:");
    free(out);
    /* roles out of turn */
    const pi2_chat_msg bad[] = {{"user", "a"}, {"user", "b"}};
    for (size_t i = 1; pi2_jinja_builtin_names[i]; i++) {
        assert_int_equal(render(pi2_jinja_builtin(pi2_jinja_builtin_names[i]), bad, 2, &V3, &out, &e), PI2_EINVAL);
        assert_non_null(strstr(e.msg, "roles must alternate"));
    }
    /* an empty conversation renders (to the generation prompt at most) */
    assert_int_equal(render(pi2_jinja_builtin("chatml"), NULL, 0, &V3, &out, &e), 0);
    assert_string_equal(out, "<|im_start|>assistant\n");
    free(out);
}

typedef struct {
    const char *tmpl;
    int code;
    const char *msg; /* a part of the message */
} ecase;

static const ecase ERRORS[] = {
    {"{% if true %}x", PI2_EFORMAT, "chat template:1:1: unexpected end of template: the 'if' block is not closed"},
    {"ab\n  {% endfor %}", PI2_EFORMAT, "chat template:2:6: unexpected 'endfor'"},
    {"{{ raise_exception('bad turn') }}", PI2_EINVAL, "chat template:1:4: bad turn"},
    {"{{ x.y }}", PI2_EFORMAT, "'x' is undefined"},
    {"{{ messages[0]['role'] + 1 }}", PI2_EFORMAT, "unsupported operand types for +: 'str' and 'int'"},
    {"{{ 1 / 2 }}", PI2_EUNSUPPORTED, "floats"},
    {"{{ 1.5 }}", PI2_EUNSUPPORTED, "floating-point"},
    {"{% macro m() %}{% endmacro %}", PI2_EUNSUPPORTED, "'macro' tag"},
    {"{{ 'abc }}", PI2_EFORMAT, "unterminated string"},
    {"{{ (1 }}", PI2_EFORMAT, "unexpected '}', expected ')'"},
    {"{# x", PI2_EFORMAT, "missing end of comment tag"},
    {"{{ x|nosuch }}", PI2_EFORMAT, "no filter named 'nosuch'"},
    {"{{ 1 is nosuch }}", PI2_EFORMAT, "no test named 'nosuch'"},
    {"{{ 1 // 0 }}", PI2_EFORMAT, "division or modulo by zero"},
    {"{{ 9223372036854775807 + 1 }}", PI2_ERANGE, "integer overflow"},
    {"{{ 99999999999999999999 }}", PI2_ERANGE, "out of range"},
    {"{{ range(1000000) }}", PI2_ERANGE, "range too big"},
    {"{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", PI2_ERANGE,
     "loop iterations"},
    {"{% set s = 'x' * 1000000 %}{% for i in range(100) %}{{ s }}{% endfor %}", PI2_ERANGE, "output longer"},
    {"{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", PI2_ERANGE,
     "MiB"},
    {"{{ 'x' * 9223372036854775807 }}", PI2_ERANGE, "repetition too large"},
    {"{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{{ s[5] }}{{ s|length }}{% endfor %}", PI2_ERANGE,
     "steps"},
    {"{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{% if s == s or 'y' in s %}{% endif %}{% endfor %}",
     PI2_ERANGE, "steps"},
    {"{% set l = range(100000)|list %}{% for i in range(100000) %}{% if 99999 in l %}{% endif %}{% endfor %}",
     PI2_ERANGE, "steps"},
    {"{{ messages[0]['role'] }", PI2_EFORMAT, "unexpected '}'"},
    {"{% for %}", PI2_EFORMAT, "expected a name"},
    {"{% set x = [1, 2] %}{{ x.append(3) }}", PI2_EFORMAT, "cannot be changed"},
    {"{% if true %}{% break %}{% endif %}", PI2_EFORMAT, "chat template:1:17: 'break' outside loop"},
    {"{{ -'a' }}", PI2_EFORMAT, "must be an integer"},
    {"{% for a in none %}{% endfor %}", PI2_EFORMAT, "'NoneType' object is not iterable"},
    {"{{ (1 if false) + 1 }}", PI2_EFORMAT, "undefined"},
    {"{{ 'a' + none }}", PI2_EFORMAT, "unsupported operand"},
    {"{{ 1 in 'abc' }}", PI2_EFORMAT, "requires string as left operand"},
    {"{% for x in 5 %}{% endfor %}", PI2_EFORMAT, "'int' object is not iterable"},
    {"{{ 'a' < 1 }}", PI2_EFORMAT, "not supported between"},
    {"{{ 1 + }}", PI2_EFORMAT, "unexpected end of print statement"},
    {"{% nosuch %}", PI2_EFORMAT, "unknown tag 'nosuch'"},
    {"{{ '\\u12' }}", PI2_EFORMAT, "truncated"},
    {"{{ x }} {% set ns.a = 1 %}", PI2_EFORMAT, "non-namespace"},
    {"{{ {'a': 1}|tojson(ensure_ascii=true) }}", PI2_EUNSUPPORTED, "ensure_ascii"},
    {"{{ x() }}", PI2_EFORMAT, "'x' is undefined"},
    {"{{ 'a' is divisibleby 2 }}", PI2_EFORMAT, "needs an integer"},
};

static void test_errors(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof ERRORS / sizeof ERRORS[0]; i++) {
        char *out = NULL;
        pi2_err e;
        int rc = render(ERRORS[i].tmpl, M3, 3, &V3, &out, &e);
        if (rc != ERRORS[i].code || !strstr(e.msg, ERRORS[i].msg)) {
            fprintf(stderr, "case %zu: %s\n  got:  %d %s\n  want: %d ...%s...\n", i, ERRORS[i].tmpl, rc,
                    rc ? e.msg : out, ERRORS[i].code, ERRORS[i].msg);
            fail();
        }
    }
    /* bad arguments */
    char *out = (char *)"x";
    size_t len = 7;
    pi2_err e = {0};
    assert_int_equal(pi2_jinja_render(NULL, 3, M3, 3, &V3, &out, &len, &e), PI2_EINVAL);
    assert_null(out);
    assert_int_equal(len, 0);
    assert_int_equal(pi2_jinja_render("x", 1, M3, 3, &V3, NULL, NULL, NULL), PI2_EINVAL);
    const pi2_chat_msg norole[] = {{NULL, "x"}};
    assert_int_equal(render("x", norole, 1, &V3, &out, &e), PI2_EINVAL);
    assert_non_null(strstr(e.msg, "message 0 has no role"));
    /* no error buffer: the code alone */
    assert_int_equal(pi2_jinja_render("{{", 2, M3, 3, &V3, &out, NULL, NULL), PI2_EFORMAT);
    /* a template over the size limit */
    size_t big = (1u << 20) + 1;
    char *t = malloc(big);
    assert_non_null(t);
    memset(t, 'a', big);
    assert_int_equal(pi2_jinja_render(t, big, M3, 3, &V3, &out, NULL, &e), PI2_ERANGE);
    free(t);
}

/* Content that is NULL, NUL bytes in the template, empty templates, no vars. */
static void test_edges(void **state)
{
    (void)state;
    char *out = NULL;
    size_t len = 0;
    pi2_err e = {0};
    const pi2_chat_msg nul[] = {{"user", NULL}};
    assert_int_equal(render("{{ messages[0].content }}{{ messages[0].content is none }}", nul, 1, &V3, &out, &e), 0);
    assert_string_equal(out, "NoneTrue");
    free(out);
    assert_int_equal(pi2_jinja_render("a\0b{{ 1 }}", 10, M3, 3, &V3, &out, &len, &e), 0);
    assert_int_equal(len, 4);
    assert_memory_equal(out, "a\0b1", 4);
    free(out);
    assert_int_equal(pi2_jinja_render("", 0, NULL, 0, NULL, &out, &len, &e), 0);
    assert_string_equal(out, "");
    free(out);
    assert_int_equal(render("[{{ bos_token }}{{ eos_token }}{{ add_generation_prompt }}]", NULL, 0, NULL, &out, &e),
                     0);
    assert_string_equal(out, "[False]");
    free(out);
}

/* Deep nesting and long inputs fail cleanly instead of overflowing the stack. */
static void test_hostile(void **state)
{
    (void)state;
    static const char *const unit[][3] = {
        {"{{ ", "(", "1 }}"}, {"{{ ", "not ", "1 }}"}, {"{{ ", "-", "1 }}"}, {"{{ ", "[", "1 }}"},
        {"", "{% if true %}", ""}, {"", "{% for x in [1] %}", ""}, {"{{ 1", "|trim", " }}"},
        {"{{ x", ".a", " }}"}, {"{{ x", "[0]", " }}"}, {"{{ 1", " + 1", " }}"}, {"{{ 'a'", " ~ 'a'", " }}"},
        {"{{ ", "{'a': ", "1 }}"}, {"{{ 1", " if 1 else 1", " }}"},
    };
    for (size_t u = 0; u < sizeof unit / sizeof unit[0]; u++) {
        for (size_t reps = 150; reps <= 20000; reps *= 10) {
            size_t n = strlen(unit[u][0]) + reps * strlen(unit[u][1]) + strlen(unit[u][2]) + 1;
            char *t = malloc(n);
            assert_non_null(t);
            size_t at = 0;
            for (size_t i = 0; i < reps + 2; i++) {
                const char *part = unit[u][i == 0 ? 0 : i == reps + 1 ? 2 : 1];
                memcpy(t + at, part, strlen(part));
                at += strlen(part);
            }
            t[at] = 0;
            char *out = NULL;
            pi2_err e;
            int rc = render(t, M3, 3, &V3, &out, &e); /* any clean result */
            free(out);
            (void)rc;
            free(t);
        }
    }
    /* many iterations of a cheap body stop at the step limit */
    char *out = NULL;
    pi2_err e;
    char heavy[4096] = "{% for i in range(100000) %}{{ 1";
    for (int i = 0; i < 300; i++)
        strcat(heavy, "+1");
    strcat(heavy, " }}{% endfor %}");
    int rc = render(heavy, M3, 3, &V3, &out, &e);
    assert_int_equal(rc, PI2_ERANGE);
    assert_non_null(strstr(e.msg, "steps"));
    /* random mutations of real templates: never a crash, always one clean line */
    static const char *const bits[] = {"{%", "%}", "{{", "}}", "{#", "#}", "-", "+", "for x in messages", "endfor",
                                       "if", "endif", "else", "(", ")", "[", "]", "'", "\"", "\\", "|", "loop.",
                                       "set x = ", "\n", " ", "is", "not", "~", "raise_exception(", ":", "{", "}"};
    const char *srcs[] = {LLAMA2_CHAT, ZEPHYR, MISTRAL_LATER, INDENTED, pi2_jinja_builtin("vicuna")};
    pi2_rng r;
    pi2_rng_seed(&r, 38);
    for (int it = 0; it < 3000; it++) {
        const char *s = srcs[pi2_rng_u64(&r) % 5];
        char buf[8192];
        size_t n = strlen(s);
        memcpy(buf, s, n);
        int muts = 1 + (int)(pi2_rng_u64(&r) % 4);
        for (int m = 0; m < muts; m++) {
            size_t at = n ? pi2_rng_u64(&r) % n : 0;
            switch (pi2_rng_u64(&r) % 3) {
            case 0: { /* delete a run */
                size_t k = 1 + pi2_rng_u64(&r) % 8;
                if (at + k > n)
                    k = n - at;
                memmove(buf + at, buf + at + k, n - at - k);
                n -= k;
                break;
            }
            case 1: { /* insert a piece */
                const char *b = bits[pi2_rng_u64(&r) % (sizeof bits / sizeof bits[0])];
                size_t k = strlen(b);
                if (n + k < sizeof buf) {
                    memmove(buf + at + k, buf + at, n - at);
                    memcpy(buf + at, b, k);
                    n += k;
                }
                break;
            }
            default:
                if (n)
                    buf[at] = (char)pi2_rng_u64(&r);
            }
        }
        size_t len;
        out = NULL;
        pi2_err_clear(&e);
        rc = pi2_jinja_render(buf, n, M3, 3, &V3, &out, &len, &e);
        if (rc) {
            assert_null(out);
            assert_null(strchr(e.msg, '\n'));
        } else {
            assert_non_null(out);
        }
        free(out);
    }
}

/* tokenizer_config.json: the template and its tokens in each published form. */
static void test_config(void **state)
{
    (void)state;
    pi2_chat_config cc;
    pi2_err e = {0};
#define PARSE(js) pi2_jinja_config_parse((js), strlen(js), "tc.json", &cc, &e)
    assert_int_equal(PARSE("{\"chat_template\": \"{{ x }}\", \"bos_token\": \"<s>\", \"eos_token\": "
                           "{\"__type\": \"AddedToken\", \"content\": \"</s>\", \"lstrip\": false}}"),
                     0);
    assert_string_equal(cc.chat_template, "{{ x }}");
    assert_string_equal(cc.bos_token, "<s>");
    assert_string_equal(cc.eos_token, "</s>");
    pi2_jinja_config_free(&cc);
    assert_null(cc.chat_template);
    pi2_jinja_config_free(&cc);
    pi2_jinja_config_free(NULL);
    assert_int_equal(PARSE("{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"t\"}, "
                           "{\"name\": \"default\", \"template\": \"d\"}], \"bos_token\": null}"),
                     0);
    assert_string_equal(cc.chat_template, "d");
    assert_null(cc.bos_token);
    assert_null(cc.eos_token);
    pi2_jinja_config_free(&cc);
    assert_int_equal(PARSE("{\"model_max_length\": 2048}"), 0);
    assert_null(cc.chat_template);
    /* Llama-2-era files: int(1e30), past any C integer */
    assert_int_equal(PARSE("{\"model_max_length\": 1000000000000000019884624838656, \"eos_token\": \"</s>\"}"), 0);
    assert_string_equal(cc.eos_token, "</s>");
    pi2_jinja_config_free(&cc);
    static const struct {
        const char *json;
        int code;
        const char *msg;
    } bad[] = {
        {"[]", PI2_EFORMAT, "tc.json: not a JSON object"},
        {"{", PI2_EFORMAT, "tc.json: not valid JSON"},
        {"{\"chat_template\": 5}", PI2_EFORMAT, "tc.json: chat_template: "},
        {"{\"chat_template\": \"a\", \"chat_template\": \"b\"}", PI2_EFORMAT, "not valid JSON"},
        {"{\"chat_template\": [{\"name\": \"x\", \"template\": \"t\"}]}", PI2_EUNSUPPORTED,
         "tc.json: chat_template: several templates and none named \"default\""},
        {"{\"chat_template\": [{\"name\": \"default\"}]}", PI2_ENOTFOUND, "chat_template[0].template"},
        {"{\"chat_template\": [7]}", PI2_EFORMAT, "chat_template[0]"},
        {"{\"eos_token\": {\"text\": \"x\"}}", PI2_ENOTFOUND, "tc.json: eos_token.content"},
        {"{\"bos_token\": [1]}", PI2_EFORMAT, "tc.json: bos_token"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        pi2_err_clear(&e);
        cc.chat_template = (char *)"x";
        int rc = PARSE(bad[i].json);
        if (rc != bad[i].code || !strstr(e.msg, bad[i].msg)) {
            fprintf(stderr, "case %zu: %s: got %d %s\n", i, bad[i].json, rc, e.msg);
            fail();
        }
        assert_null(cc.chat_template);
    }
    /* a template over the size limit */
    size_t big = (1u << 20) + 64;
    char *js = malloc(big);
    assert_non_null(js);
    memset(js, 'a', big);
    memcpy(js, "{\"chat_template\": \"", 19);
    memcpy(js + big - 3, "\"}", 3);
    assert_int_equal(pi2_jinja_config_parse(js, big - 1, "tc.json", &cc, &e), PI2_ERANGE);
    free(js);
#undef PARSE
    /* the published file */
    char path[1024];
    const char *sh = pi2t_shared();
    snprintf(path, sizeof path, "%s/published-formats/turbosparse-mistral-instruct/tokenizer_config.json",
             sh ? sh : "/nonexistent");
    assert_int_equal(pi2_jinja_config_read("/nonexistent/tokenizer_config.json", &cc, &e), PI2_ENOTFOUND);
    if (!pi2t_exists(path)) {
        fprintf(stderr, "skip: %s not found (set PI2_SHARED to the shared dir)\n", path);
        skip();
    }
    assert_int_equal(pi2_jinja_config_read(path, &cc, &e), 0);
    assert_string_equal(cc.bos_token, "<s>");
    assert_string_equal(cc.eos_token, "<|im_end|>");
    char *out = NULL;
    pi2_chat_vars v = {cc.bos_token, cc.eos_token, true};
    assert_int_equal(render(cc.chat_template, M3, 3, &v, &out, &e), 0);
    assert_string_equal(out, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi 'there'<|im_end|>\n"
                             "<|im_start|>assistant\nHello!<|im_end|>\n");
    free(out);
    pi2_jinja_config_free(&cc);
}

/* ---- the oracle: Python's jinja2 as transformers configures it ---- */

static const char ORACLE_PY[] =
    "import json, sys\n"
    "import jinja2, jinja2.ext\n"
    "from jinja2.sandbox import ImmutableSandboxedEnvironment\n"
    "class Raised(Exception):\n"
    "    pass\n"
    "def raise_exception(message):\n"
    "    raise Raised(message)\n"
    "def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):\n"
    "    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)\n"
    "env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])\n"
    "env.filters['tojson'] = tojson\n"
    "env.globals['raise_exception'] = raise_exception\n"
    "with open(sys.argv[1], encoding='utf-8') as f:\n"
    "    job = json.load(f)\n"
    "res = []\n"
    "for c in job['cases']:\n"
    "    try:\n"
    "        out = env.from_string(job['templates'][c['t']]).render(messages=c['messages'], bos_token=c['bos'], eos_token=c['eos'],\n"
    "                                   add_generation_prompt=c['gen'], tools=None, documents=None)\n"
    "        res.append({'ok': True, 'text': out})\n"
    "    except Raised as e:\n"
    "        res.append({'ok': False, 'raised': True, 'text': str(e)})\n"
    "    except Exception as e:\n"
    "        res.append({'ok': False, 'raised': False, 'text': type(e).__name__ + ': ' + str(e)})\n"
    "with open(sys.argv[2], 'w', encoding='utf-8') as f:\n"
    "    json.dump({'jinja2': jinja2.__version__, 'results': res}, f, ensure_ascii=False)\n";

/* A python3 that imports jinja2, into py (Debian's first: python3-jinja2);
 * false when there is none. */
static bool find_python(char *py, size_t cap)
{
    static const char *const cands[] = {"/usr/bin/python3", "python3"};
    for (size_t i = 0; i < 2; i++) {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "%s -c 'import jinja2' >/dev/null 2>&1", cands[i]);
        if (system(cmd) == 0) {
            snprintf(py, cap, "%s", cands[i]);
            return true;
        }
    }
    return false;
}

/* The chat_template of the shared TurboSparse tokenizer_config.json (caller
 * frees), or NULL when the shared directory is absent. */
static char *turbosparse_template(char *bos, char *eos, size_t cap)
{
    const char *sh = pi2t_shared();
    if (!sh)
        return NULL;
    char path[1024];
    snprintf(path, sizeof path, "%s/published-formats/turbosparse-mistral-instruct/tokenizer_config.json", sh);
    if (!pi2t_exists(path))
        return NULL;
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    assert_non_null(j);
    json_t *t = json_object_get(j, "chat_template");
    assert_true(json_is_string(t));
    snprintf(bos, cap, "%s", json_string_value(json_object_get(j, "bos_token")));
    snprintf(eos, cap, "%s", json_string_value(json_object_get(j, "eos_token")));
    char *s = strdup(json_string_value(t));
    json_decref(j);
    return s;
}

static const char *const CONTENTS[] = {
    "Hello",
    "",
    "  spaced out  ",
    "two\nlines\n",
    "quotes ' \" and \\ backslash",
    "unicode \xc3\xa9\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x99\x82",
    "tags {{ x }} {% if %} <|im_end|> </s>",
    "\ttab\t",
    " \xc2\xa0nbsp\xc2\xa0 ",
    "curly } braces { [INST]",
    "\xe3\x80\x80ideographic space\xe3\x80\x80",
};

typedef struct {
    size_t n;
    pi2_chat_msg m[16];
    bool gen;
} conv;

/* Conversations: with and without a system message, 1..6 turns, and some
 * with roles out of turn (those exercise raise_exception). */
static size_t make_convs(conv *cv, size_t cap)
{
    pi2_rng r;
    pi2_rng_seed(&r, 2026);
    size_t k = 0;
    const size_t nc = sizeof CONTENTS / sizeof CONTENTS[0];
    for (int sys = 0; sys < 2; sys++)
        for (int turns = 1; turns <= 6; turns++)
            for (int var = 0; var < 4; var++)
                for (int gen = 0; gen < 2 && k < cap; gen++) {
                    conv *c = &cv[k++];
                    c->n = 0;
                    c->gen = gen;
                    if (sys)
                        c->m[c->n++] = (pi2_chat_msg){"system", CONTENTS[pi2_rng_u64(&r) % nc]};
                    for (int t = 0; t < turns; t++) {
                        const char *role = t % 2 ? "assistant" : "user";
                        if (var == 2 && t == turns / 2) /* out of turn */
                            role = t % 2 ? "user" : "assistant";
                        c->m[c->n++] = (pi2_chat_msg){role, CONTENTS[pi2_rng_u64(&r) % nc]};
                        if (var == 3 && t % 2 == 1 && c->n + 2 < 8) /* tool results, one or two */
                            for (int j = 0; j <= t % 4 / 2; j++)
                                c->m[c->n++] = (pi2_chat_msg){"tool", CONTENTS[pi2_rng_u64(&r) % nc]};
                    }
                }
    return k;
}

static void test_oracle(void **state)
{
    (void)state;
    char py[64];
    if (!find_python(py, sizeof py)) {
        fprintf(stderr, "skip: no python3 with jinja2 (install python3-jinja2) to check rendering against\n");
        skip();
    }
    char bos[64] = "<s>", eos[64] = "</s>";
    char *turbo = turbosparse_template(bos, eos, sizeof bos);
    if (!turbo)
        fprintf(stderr, "note: shared published-formats not found: the TurboSparse template is not checked\n");
    const char *tmpls[128];
    size_t nt = 0;
    if (turbo)
        tmpls[nt++] = turbo;
    for (size_t i = 0; pi2_jinja_builtin_names[i]; i++)
        tmpls[nt++] = pi2_jinja_builtin(pi2_jinja_builtin_names[i]);
    const char *pub[] = {LLAMA2_CHAT, MISTRAL_V01, ZEPHYR,        CHATML_HF, LLAMA3,
                         GEMMA,       INDENTED,    MISTRAL_LATER, QWEN_STYLE};
    for (size_t i = 0; i < sizeof pub / sizeof pub[0]; i++)
        tmpls[nt++] = pub[i];
    size_t n_full = nt; /* templates rendered over every conversation */
    for (size_t i = 0; i < sizeof UNIT / sizeof UNIT[0] && nt < 128; i++)
        tmpls[nt++] = UNIT[i].tmpl;
    /* errors that are errors in Jinja too (not our limits or our subset) */
    for (size_t i = 0; i < sizeof ERRORS / sizeof ERRORS[0] && nt < 128; i++)
        if (ERRORS[i].code != PI2_ERANGE && ERRORS[i].code != PI2_EUNSUPPORTED)
            tmpls[nt++] = ERRORS[i].tmpl;

    static conv cv[128];
    size_t ncv = make_convs(cv, 128);
    assert_true(ncv < 128);
    json_t *job = json_object(), *jt = json_array(), *jc = json_array();
    for (size_t i = 0; i < nt; i++) {
        json_t *js = json_string(tmpls[i]);
        assert_non_null(js); /* UTF-8 */
        json_array_append_new(jt, js);
    }
    /* which (template, conversation) each case is: conversation ncv is M3 */
    size_t (*which)[2] = malloc(sizeof(size_t[2]) * (nt * (ncv + 1)));
    assert_non_null(which);
    size_t ncase = 0;
    for (size_t t = 0; t < nt; t++)
        for (size_t k = 0; k <= ncv; k++) {
            if ((k < ncv) != (t < n_full))
                continue;
            const pi2_chat_msg *m = k < ncv ? cv[k].m : M3;
            size_t n = k < ncv ? cv[k].n : 3;
            json_t *msgs = json_array();
            for (size_t i = 0; i < n; i++)
                json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", m[i].role, "content", m[i].content));
            json_array_append_new(jc, json_pack("{s:i, s:o, s:s, s:s, s:b}", "t", (int)t, "messages", msgs, "bos",
                                                k < ncv ? bos : "<s>", "eos", k < ncv ? eos : "</s>", "gen",
                                                k < ncv ? cv[k].gen : 1));
            which[ncase][0] = t;
            which[ncase][1] = k;
            ncase++;
        }
    json_object_set_new(job, "templates", jt);
    json_object_set_new(job, "cases", jc);

    char dir[64], in[128], outp[128], script[128], cmd[512];
    pi2t_tmpdir(dir, sizeof dir);
    snprintf(in, sizeof in, "%s/cases.json", dir);
    snprintf(outp, sizeof outp, "%s/results.json", dir);
    snprintf(script, sizeof script, "%s/oracle.py", dir);
    assert_int_equal(json_dump_file(job, in, 0), 0);
    pi2t_write(script, ORACLE_PY, strlen(ORACLE_PY));
    snprintf(cmd, sizeof cmd, "%s '%s' '%s' '%s'", py, script, in, outp);
    assert_int_equal(system(cmd), 0);
    json_error_t je;
    json_t *res = json_load_file(outp, 0, &je);
    assert_non_null(res);
    json_t *rs = json_object_get(res, "results");
    assert_int_equal(json_array_size(rs), ncase);

    size_t same = 0, raised = 0, errors = 0, bad = 0;
    for (size_t i = 0; i < ncase; i++) {
        size_t t = which[i][0], k = which[i][1];
        const pi2_chat_msg *m = k < ncv ? cv[k].m : M3;
        size_t n = k < ncv ? cv[k].n : 3;
        pi2_chat_vars v = {k < ncv ? bos : "<s>", k < ncv ? eos : "</s>", k < ncv ? cv[k].gen : true};
        json_t *r = json_array_get(rs, i);
        bool ok = json_is_true(json_object_get(r, "ok"));
        bool rais = json_is_true(json_object_get(r, "raised"));
        const char *want = json_string_value(json_object_get(r, "text"));
        char *out = NULL;
        size_t len = 0;
        pi2_err e = {0};
        int rc = pi2_jinja_render(tmpls[t], strlen(tmpls[t]), m, n, &v, &out, &len, &e);
        bool match;
        if (ok)
            match = rc == 0 && len == strlen(want) && memcmp(out, want, len) == 0;
        else if (rais)
            match = rc == PI2_EINVAL && strstr(e.msg, want) != NULL;
        else
            match = rc != 0 && rc != PI2_EINVAL;
        if (!match && bad++ < 5)
            fprintf(stderr, "mismatch: template %zu, conversation %zu (gen %d)\n  jinja2: %s%s\n  pi2:    %s\n", t, k,
                    (int)v.add_generation_prompt, ok ? "" : "error: ", want, rc ? e.msg : out);
        same += match;
        raised += !ok && rais;
        errors += !ok && !rais;
        free(out);
    }
    fprintf(stderr, "oracle: jinja2 %s, %zu templates, %zu renders: %zu identical (%zu raise_exception, %zu errors)\n",
            json_string_value(json_object_get(res, "jinja2")), nt, ncase, same, raised, errors);
    assert_int_equal(bad, 0);
    assert_true(raised > 0);
    assert_true(errors > 0);
    json_decref(res);
    json_decref(job);
    free(which);
    free(turbo);
    pi2t_rmtree(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unit),    cmocka_unit_test(test_builtins), cmocka_unit_test(test_errors),
        cmocka_unit_test(test_edges),   cmocka_unit_test(test_hostile),  cmocka_unit_test(test_config),
        cmocka_unit_test(test_oracle),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
