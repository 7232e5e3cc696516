/* The OpenAI-compatible API's JSON (see serve_json.h). */
#include "runtime/serve_json.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* What a parsed request owns: the document and the joined contents. */
typedef struct req_own {
    json_t *root;
    char **texts;
    size_t n_texts;
} req_own;

void pi2_api_req_free(pi2_api_req *r)
{
    if (!r)
        return;
    req_own *o = r->own_;
    if (o) {
        for (size_t i = 0; i < o->n_texts; i++)
            free(o->texts[i]);
        free(o->texts);
        json_decref(o->root);
        free(o);
    }
    free(r->msgs);
    free(r->stop);
    memset(r, 0, sizeof *r);
}

/* member k of obj, NULL when absent or null */
static json_t *member(json_t *obj, const char *k)
{
    json_t *v = json_object_get(obj, k);
    return json_is_null(v) ? NULL : v;
}

static int bad(pi2_err *err, const char *what, const char *expected)
{
    return pi2_err_set(err, PI2_EINVAL, "%s: expected %s", what, expected);
}

/* A message's content: a string, or text parts joined (kept in o). */
static int msg_content(json_t *c, req_own *o, size_t i, const char **out, pi2_err *err)
{
    char what[64];
    snprintf(what, sizeof what, "messages[%zu].content", i);
    if (!c) {
        *out = "";
        return 0;
    }
    if (json_is_string(c)) {
        *out = json_string_value(c);
        return 0;
    }
    if (!json_is_array(c))
        return bad(err, what, "a string or an array of text parts");
    size_t len = 0, j;
    json_t *p;
    json_array_foreach(c, j, p) {
        json_t *t = json_object_get(p, "type"), *x = json_object_get(p, "text");
        if (!json_is_object(p) || !json_is_string(t) || strcmp(json_string_value(t), "text") != 0 || !json_is_string(x))
            return bad(err, what, "text parts ({\"type\": \"text\", \"text\": STRING})");
        len += json_string_length(x);
    }
    char *s = malloc(len + 1), **texts = realloc(o->texts, (o->n_texts + 1) * sizeof *texts);
    if (texts)
        o->texts = texts;
    if (!s || !texts) {
        free(s);
        return pi2_err_set(err, PI2_ENOMEM, "out of memory");
    }
    o->texts[o->n_texts++] = s;
    len = 0;
    json_array_foreach(c, j, p) {
        json_t *x = json_object_get(p, "text");
        memcpy(s + len, json_string_value(x), json_string_length(x));
        len += json_string_length(x);
    }
    s[len] = 0;
    *out = s;
    return 0;
}

static int parse_messages(pi2_api_req *r, json_t *root, req_own *o, pi2_err *err)
{
    static const char *const roles[] = {"system", "developer", "user", "assistant", "tool"};
    json_t *m = member(root, "messages");
    if (!json_is_array(m) || json_array_size(m) == 0)
        return bad(err, "messages", "a non-empty array of messages");
    r->msgs = calloc(json_array_size(m), sizeof *r->msgs);
    if (!r->msgs)
        return pi2_err_set(err, PI2_ENOMEM, "out of memory");
    size_t i;
    json_t *msg;
    json_array_foreach(m, i, msg) {
        char what[64];
        snprintf(what, sizeof what, "messages[%zu].role", i);
        json_t *role = json_object_get(msg, "role");
        if (!json_is_object(msg))
            return bad(err, "messages", "an array of objects");
        if (!json_is_string(role))
            return bad(err, what, "a string");
        size_t k = 0;
        while (k < 5 && strcmp(json_string_value(role), roles[k]) != 0)
            k++;
        if (k == 5)
            return bad(err, what, "system, developer, user, assistant or tool");
        r->msgs[i].role = k == 1 ? "system" : roles[k];
        int rc = msg_content(member(msg, "content"), o, i, &r->msgs[i].content, err);
        if (rc)
            return rc;
        r->n_msgs++;
    }
    return 0;
}

static int parse_prompt(pi2_api_req *r, json_t *root, pi2_err *err)
{
    json_t *p = member(root, "prompt");
    if (json_is_array(p) && json_array_size(p) == 1)
        p = json_array_get(p, 0);
    if (!json_is_string(p))
        return bad(err, "prompt", "a string (or an array of one string)");
    r->prompt = json_string_value(p);
    return 0;
}

static int parse_stop(pi2_api_req *r, json_t *root, pi2_err *err)
{
    json_t *s = member(root, "stop");
    if (!s)
        return 0;
    if (!json_is_string(s) && (!json_is_array(s) || json_array_size(s) > 16))
        return bad(err, "stop", "a string or an array of at most 16 strings");
    size_t n = json_is_string(s) ? 1 : json_array_size(s);
    r->stop = calloc(n ? n : 1, sizeof *r->stop);
    if (!r->stop)
        return pi2_err_set(err, PI2_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_is_string(s) ? s : json_array_get(s, i);
        if (!json_is_string(x))
            return bad(err, "stop", "a string or an array of at most 16 strings");
        r->stop[r->n_stop++] = json_string_value(x);
    }
    return 0;
}

/* A number member in [lo, hi] (lo itself excluded when open_lo). */
static int parse_num(json_t *root, const char *k, double lo, double hi, bool open_lo, double *out, pi2_err *err)
{
    json_t *v = member(root, k);
    if (!v)
        return 0;
    double x = json_number_value(v);
    if (!json_is_number(v) || !isfinite(x) || x < lo || x > hi || (open_lo && x == lo)) {
        char want[64];
        snprintf(want, sizeof want, "a number in %c%g, %g]", open_lo ? '(' : '[', lo, hi);
        return bad(err, k, want);
    }
    *out = x;
    return 0;
}

static int parse_int(json_t *root, const char *k, long long lo, long long hi, long long *out, pi2_err *err)
{
    json_t *v = member(root, k);
    if (!v)
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
        char want[64];
        snprintf(want, sizeof want, "an integer in [%lld, %lld]", lo, hi);
        return bad(err, k, want);
    }
    *out = json_integer_value(v);
    return 0;
}

/* The members every request has. */
static int parse_common(pi2_api_req *r, json_t *root, pi2_err *err)
{
    json_t *model = member(root, "model"), *stream = member(root, "stream");
    if (model && !json_is_string(model))
        return bad(err, "model", "a string");
    r->model = model ? json_string_value(model) : NULL;
    if (stream && !json_is_boolean(stream))
        return bad(err, "stream", "a boolean");
    r->stream = stream && json_is_true(stream);
    long long n = 1, seed = -1;
    int rc;
    if ((rc = parse_int(root, "max_tokens", 0, 1 << 24, &r->max_tokens, err)) != 0 ||
        (r->chat && (rc = parse_int(root, "max_completion_tokens", 0, 1 << 24, &r->max_tokens, err)) != 0) ||
        (rc = parse_int(root, "n", 1, 1, &n, err)) != 0 || (rc = parse_int(root, "seed", 0, INT64_MAX, &seed, err)) != 0 ||
        (rc = parse_num(root, "temperature", 0, 2, false, &r->temperature, err)) != 0 ||
        (rc = parse_num(root, "top_p", 0, 1, true, &r->top_p, err)) != 0)
        return rc;
    r->has_seed = seed >= 0;
    r->seed = r->has_seed ? (uint64_t)seed : 0;
    return parse_stop(r, root, err);
}

int pi2_api_req_parse(pi2_api_req *r, bool chat, const char *body, size_t len, pi2_err *err)
{
    memset(r, 0, sizeof *r);
    r->chat = chat;
    r->max_tokens = -1;
    r->temperature = 1.0;
    r->top_p = 1.0;
    req_own *o = calloc(1, sizeof *o);
    if (!o)
        return pi2_err_set(err, PI2_ENOMEM, "out of memory");
    r->own_ = o;
    json_error_t je;
    o->root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!o->root)
        return pi2_err_set(err, PI2_EINVAL, "the body is not valid JSON: %s (line %d, column %d)", je.text, je.line,
                           je.column);
    if (!json_is_object(o->root))
        return pi2_err_set(err, PI2_EINVAL, "the body must be a JSON object");
    int rc = chat ? parse_messages(r, o->root, o, err) : parse_prompt(r, o->root, err);
    return rc ? rc : parse_common(r, o->root, err);
}

/* ---------------- responses ---------------- */

/* A JSON string of s[0..n), bad UTF-8 bytes as U+FFFD. */
static json_t *jstr(const char *s, size_t n)
{
    json_t *j = json_stringn(s, n);
    if (j || n > (SIZE_MAX - 1) / 3)
        return j;
    char *c = malloc(3 * n + 1);
    size_t m = 0;
    if (!c)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        json_t *one = NULL;
        size_t k = 1;
        unsigned char b = (unsigned char)s[i];
        if (b >= 0x80) /* a sequence of 2..4 bytes that jansson accepts, or one bad byte */
            for (k = 4; k >= 2; k--)
                if (i + k <= n && (one = json_stringn(s + i, k)) != NULL)
                    break;
        json_decref(one);
        if (b >= 0x80 && k < 2) {
            memcpy(c + m, "\xef\xbf\xbd", 3);
            m += 3;
            k = 1;
        } else {
            memcpy(c + m, s + i, k);
            m += k;
        }
        i += k - 1;
    }
    j = json_stringn(c, m);
    free(c);
    return j;
}

static char *dump(json_t *j)
{
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    return s;
}

char *pi2_api_error(const char *message, const char *type, const char *param, const char *code)
{
    json_t *e = json_pack("{s:o,s:s,s:s?,s:s?}", "message", jstr(message, strlen(message)), "type", type, "param",
                          param, "code", code);
    return dump(e ? json_pack("{s:o}", "error", e) : NULL);
}

char *pi2_api_models(const char *id, long long created)
{
    return dump(json_pack("{s:s,s:[{s:s,s:s,s:I,s:s}]}", "object", "list", "data", "id", id, "object", "model",
                          "created", (json_int_t)created, "owned_by", "pi2"));
}

char *pi2_api_health(int queued, int running)
{
    return dump(json_pack("{s:s,s:i,s:i}", "status", "ok", "queue", queued, "running", running));
}

static json_t *usage(const pi2_api_reply *r)
{
    return json_pack("{s:i,s:i,s:i}", "prompt_tokens", r->prompt_tokens, "completion_tokens", r->completion_tokens,
                     "total_tokens", r->prompt_tokens + r->completion_tokens);
}

/* The envelope: id, object, created, model, choices [choice], usage. */
static char *envelope(const pi2_api_reply *r, const char *object, json_t *choice, bool with_usage)
{
    json_t *j = json_pack("{s:s,s:s,s:I,s:s,s:[o]}", "id", r->id, "object", object, "created",
                          (json_int_t)r->created, "model", r->model, "choices", choice);
    if (j && with_usage)
        json_object_set_new(j, "usage", usage(r));
    return dump(j);
}

char *pi2_api_response(const pi2_api_reply *r, const char *text, size_t len)
{
    json_t *t = jstr(text, len);
    if (r->chat)
        return envelope(r, "chat.completion",
                        json_pack("{s:i,s:{s:s,s:o},s:n,s:s}", "index", 0, "message", "role", "assistant", "content", t,
                                  "logprobs", "finish_reason", r->finish ? r->finish : "stop"),
                        true);
    return envelope(r, "text_completion",
                    json_pack("{s:i,s:o,s:n,s:s}", "index", 0, "text", t, "logprobs", "finish_reason",
                              r->finish ? r->finish : "stop"),
                    true);
}

char *pi2_api_chunk(const pi2_api_reply *r, bool first, const char *text, size_t len)
{
    json_t *fin = r->finish ? json_string(r->finish) : json_null();
    if (!r->chat)
        return envelope(r, "text_completion",
                        json_pack("{s:i,s:o,s:n,s:o}", "index", 0, "text", jstr(text, len), "logprobs", "finish_reason",
                                  fin),
                        r->finish != NULL);
    json_t *delta = json_object();
    if (delta && first)
        json_object_set_new(delta, "role", json_string("assistant"));
    if (delta && !r->finish)
        json_object_set_new(delta, "content", jstr(text, len));
    return envelope(r, "chat.completion.chunk",
                    json_pack("{s:i,s:o,s:n,s:o}", "index", 0, "delta", delta, "logprobs", "finish_reason", fin),
                    r->finish != NULL);
}
