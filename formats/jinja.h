/* Chat templates: a small Jinja interpreter for the `chat_template` of a
 * model's tokenizer_config.json, and built-in templates for models that
 * have none.
 *
 * A template renders as Hugging Face transformers renders it
 * (apply_chat_template): Jinja with trim_blocks and lstrip_blocks, the
 * loopcontrols extension (break, continue), an immutable sandbox, and these
 * variables: messages (a list of {"role", "content"} dicts), bos_token,
 * eos_token, add_generation_prompt, tools and documents (none); globals
 * raise_exception(msg) and range, namespace; HF's tojson
 * (json.dumps(x, ensure_ascii=False), indent and sort_keys accepted).
 * HF's strftime_now is not defined: templates that test for it take their
 * fixed fallback date, so a rendering never depends on the clock.
 *
 * The subset: {{ }}, {% %}, {# #}; whitespace control (-, +); if/elif/else,
 * for (loop.index, index0, revindex, revindex0, first, last, length,
 * previtem, nextitem, cycle; `for a, b in ...`; `for x in xs if cond`;
 * for/else), set (also `set ns.attr = v` and block set), break, continue,
 * generation; literals (strings with Python escapes, integers, true/false/
 * none, lists, dicts), subscripts, attributes, slices, calls, filters,
 * tests (`is [not] NAME`), comparisons (chained), and/or/not, in/not in,
 * + - * // % ** on integers, + on strings and lists, ~, conditional
 * expressions. Values: strings (UTF-8; length, indexes and slices count
 * code points), 64-bit integers, booleans, none, lists, dicts, undefined.
 * Filters: trim, length/count, upper, lower, title, capitalize, tojson,
 * string, int, list, first, last, join, default/d, replace, reverse, safe,
 * items, select/reject, selectattr/rejectattr, map(attribute=...), abs.
 * String methods: strip, lstrip, rstrip, upper, lower, title, capitalize,
 * startswith, endswith, split, replace; dict methods: get, items, keys,
 * values. Case mapping is ASCII only (other characters are kept).
 * Not supported (an error naming it): floats, macros, include/extends,
 * raw, filter blocks.
 *
 * Hostile templates neither crash nor hang: the template is at most 1 MiB,
 * nesting at most 200 deep, range() at most 100000 items (as Jinja's
 * sandbox), at most 1000000 loop iterations and 50000000 evaluation steps
 * per render (scanning or comparing a long string costs a step per 32
 * bytes, a list or dict one per item), 16 MiB of output and 256 MiB of
 * working memory.
 *
 * Errors are one line, "chat template:LINE:COL: problem" (positions in
 * bytes of the template text, line and column from 1):
 *   PI2_EFORMAT       syntax error, or a type error while rendering
 *                     (undefined attribute, 'a' + 1, ...)
 *   PI2_EINVAL        the template called raise_exception(msg): the message
 *                     is msg (e.g. the roles do not alternate)
 *   PI2_EUNSUPPORTED  a Jinja feature outside the subset
 *   PI2_ERANGE        a limit above was reached
 *   PI2_ENOMEM        out of memory
 */
#ifndef PI2_JINJA_H
#define PI2_JINJA_H

#include "formats/common.h"

#include <stdbool.h>
#include <stddef.h>

/* One message of a conversation. content NULL renders as none (Jinja's
 * None). Both are UTF-8 text, borrowed for the call. */
typedef struct pi2_chat_msg {
    const char *role;
    const char *content;
} pi2_chat_msg;

/* What a template sees besides the messages. NULL tokens are "". */
typedef struct pi2_chat_vars {
    const char *bos_token;
    const char *eos_token;
    bool add_generation_prompt;
} pi2_chat_vars;

/* Render template text tmpl (tmpl_len bytes, need not end in NUL) over
 * msgs[0..n_msgs). On success *out is a malloc'd NUL-terminated string the
 * caller frees and *out_len its length; on failure *out is NULL and err says
 * why (see above). */
int pi2_jinja_render(const char *tmpl, size_t tmpl_len, const pi2_chat_msg *msgs, size_t n_msgs,
                     const pi2_chat_vars *vars, char **out, size_t *out_len, pi2_err *err);

/* The text of a built-in template by name, or NULL when unknown:
 *   "chatml"   <|im_start|>role\ncontent<|im_end|>\n per message, and
 *              "<|im_start|>assistant\n" as the generation prompt
 *   "llama2"   Llama-2-chat: [INST] with a <<SYS>> block in the first turn
 *   "mistral"  Mistral-Instruct: [INST] turns, a system message folded into
 *              the first user turn
 *   "vicuna"   Vicuna v1.1: "USER: ... ASSISTANT: ..." after a system line
 * The [INST] and Vicuna templates require user and assistant turns to
 * alternate after an optional system message (raise_exception otherwise).
 * "llama2" and "mistral" write bos_token themselves, as the published
 * templates of those models do; "chatml" and "vicuna" do not. A caller that
 * prepends BOS when it encodes should not when the text starts with it. */
const char *pi2_jinja_builtin(const char *name);

/* The names above, NULL-terminated, for help texts. */
extern const char *const pi2_jinja_builtin_names[];

/* What a Hugging Face tokenizer_config.json says about chat: each member a
 * malloc'd string, NULL when the file has none. */
typedef struct pi2_chat_config {
    char *chat_template; /* "chat_template": a string, or from a list of
                            {"name", "template"} the one named "default" */
    char *bos_token;     /* "bos_token" / "eos_token": a string or an */
    char *eos_token;     /* AddedToken object's "content" */
} pi2_chat_config;

/* Read them from the JSON text json[0..len) (file names it in messages) or
 * from the file at path (at most 64 MiB). On failure *out is all NULL.
 * PI2_EFORMAT for a file that is not a JSON object or has a member of the
 * wrong type (messages "<file>: <key>: <problem>"), PI2_ERANGE for a
 * template over 1 MiB, PI2_EUNSUPPORTED for a list of templates without a
 * "default", PI2_EIO / PI2_ENOTFOUND from reading the file. */
int pi2_jinja_config_parse(const char *json, size_t len, const char *file, pi2_chat_config *out, pi2_err *err);
int pi2_jinja_config_read(const char *path, pi2_chat_config *out, pi2_err *err);
/* Free the strings and zero *cc; NULL is a no-op. */
void pi2_jinja_config_free(pi2_chat_config *cc);

#endif
