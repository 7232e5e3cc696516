/* The JSON of the OpenAI-compatible API (pi2-run serve): requests read
 * strictly, responses and stream chunks written. The HTTP side lives in
 * runtime/cli/run_serve.c; this is its only use of jansson.
 *
 * Requests (POST /v1/chat/completions, /v1/completions), an object with:
 *   messages     chat: a non-empty array of {role, content}; role one of
 *                system, developer (read as system), user, assistant, tool;
 *                content a string, null (empty), or an array of
 *                {"type": "text", "text": STRING} parts (joined)
 *   prompt       completions: a string, or an array of exactly one string
 *   model        a string (the server checks it names its model)
 *   max_tokens   an integer 0 .. 2^24 (chat also max_completion_tokens)
 *   temperature  a number 0 .. 2 (default 1, as OpenAI's)
 *   top_p        a number in (0, 1] (default 1)
 *   stop         a string or an array of at most 16 strings
 *   seed         an integer >= 0
 *   stream       a boolean
 *   n            1 if given
 * null is the same as absent; other members are ignored. Anything else (a
 * wrong type, a value out of range, text that is not UTF-8 or holds NUL,
 * malformed JSON, duplicate keys) is PI2_EINVAL with a message that names
 * the member. */
#ifndef PI2_SERVE_JSON_H
#define PI2_SERVE_JSON_H

#include "runtime/chat_format.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct pi2_api_req {
    bool chat;
    pi2_chat_msg *msgs; /* chat: n_msgs of them */
    size_t n_msgs;
    const char *prompt; /* completions */
    const char *model;  /* NULL: not given */
    long long max_tokens; /* -1: not given */
    double temperature, top_p;
    bool has_seed;
    uint64_t seed;
    bool stream;
    const char **stop;
    size_t n_stop;
    void *own_; /* what the strings above live in */
} pi2_api_req;

/* Parse body[0..len) into *r (pi2_api_req_free it, also after an error).
 * PI2_EINVAL (see above), PI2_ENOMEM. */
int pi2_api_req_parse(pi2_api_req *r, bool chat, const char *body, size_t len, pi2_err *err);
void pi2_api_req_free(pi2_api_req *r);

/* A reply, for the response body or its stream chunks. */
typedef struct pi2_api_reply {
    bool chat;
    const char *id;    /* "chatcmpl-..." / "cmpl-..." */
    long long created; /* Unix seconds */
    const char *model;
    const char *finish; /* "stop", "length", or NULL (a chunk before the last) */
    int prompt_tokens, completion_tokens;
} pi2_api_reply;

/* Each returns a NUL-terminated JSON text (the caller frees), or NULL when
 * out of memory. Text that is not valid UTF-8 is written with U+FFFD for
 * the bad bytes. */
char *pi2_api_error(const char *message, const char *type, const char *param, const char *code);
char *pi2_api_models(const char *id, long long created);
char *pi2_api_health(int queued, int running);
/* The whole response: text[0..len) is the reply. */
char *pi2_api_response(const pi2_api_reply *r, const char *text, size_t len);
/* A stream chunk with text[0..len) (chat: the first one also carries the
 * role), or the last one (r->finish set, no text; with usage). */
char *pi2_api_chunk(const pi2_api_reply *r, bool first, const char *text, size_t len);

#endif
