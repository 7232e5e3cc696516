/* A conversation over one engine: the messages so far, the tokens in the
 * engine's KV cache, and generation that streams a reply.
 *
 * The cache is reused across calls: a new prompt is compared with the
 * tokens already in the cache and only what differs is prefilled (from
 * the first differing position; the engine rewinds). When the text of the
 * cache (the previous prompt and the reply fed back to the model) is a
 * prefix of the new prompt, only the new text is encoded, so a chat turn
 * prefills its new tokens alone; the boundary is then tokenized as two
 * pieces rather than one, as interactive engines do.
 *
 * A reply ends at the model's end of turn (pi2_desc_is_end), after
 * max_tokens, at a stop string (not part of the reply), when the context is
 * full, or when the caller cancels. Text streams through emit as it becomes
 * final: UTF-8-complete, and never the start of a possible stop string.
 *
 * Chat formatting goes through pi2_chat_format (runtime/chat_format.h)
 * alone. A session is for one thread at a time; it borrows the engine
 * (close the session first) and is the engine's only user meanwhile. */
#ifndef PI2_SESSION_H
#define PI2_SESSION_H

#include "runtime/chat_format.h"
#include "runtime/engine.h"
#include "runtime/sample.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct pi2_session pi2_session;

/* How one reply is generated. Everything is borrowed for the call. */
typedef struct pi2_session_gen {
    pi2_sample_opts so;
    long long max_tokens;      /* tokens sampled at most (the end of turn included) */
    const char *const *stop;   /* stop strings (n_stop of them; empty ones ignored) */
    size_t n_stop;
    /* Final text, in order (may be NULL); non-zero cancels the reply. */
    int (*emit)(void *ctx, const char *text, size_t len);
    /* Asked before each decode step (may be NULL); true cancels the reply. */
    bool (*cancel)(void *ctx);
    void *ctx;
} pi2_session_gen;

typedef enum {
    PI2_FINISH_STOP,   /* end of turn or a stop string */
    PI2_FINISH_LENGTH, /* max_tokens */
    PI2_FINISH_CTX,    /* the context is full */
    PI2_FINISH_CANCEL  /* emit or cancel asked to stop */
} pi2_finish;

typedef struct pi2_session_result {
    pi2_finish finish;
    int prompt_tokens;     /* tokens of the prompt, BOS included */
    int prefilled;         /* of them, run this time (the rest were in the cache) */
    int completion_tokens; /* tokens sampled */
    int dropped;           /* messages dropped to make room (drop_oldest) */
    const char *text;      /* the whole reply, NUL-terminated; the session's, valid until its next call */
    size_t len;
} pi2_session_result;

/* Open a session over e (ctx positions: pi2_engine_ctx). Caller frees *out.
 * PI2_ENOMEM. */
int pi2_session_create(pi2_session **out, pi2_engine *e, pi2_err *err);
/* NULL is a no-op. */
void pi2_session_free(pi2_session *s);
pi2_engine *pi2_session_engine(const pi2_session *s);

/* When a chat prompt does not fit, drop the oldest messages after the
 * leading system ones (a user message with the reply that follows it)
 * until the prompt and room for a reply fit, rather than refuse it. */
void pi2_session_set_drop_oldest(pi2_session *s, bool on);
/* The chat format replies are prompted in (borrowed; NULL: ChatML). */
void pi2_session_set_template(pi2_session *s, const pi2_chat_template *t);

/* Append a message (copied). PI2_EINVAL without a role, PI2_ENOMEM. */
int pi2_session_add(pi2_session *s, const char *role, const char *content, pi2_err *err);
/* Forget the messages; the cache stays, so a shared start (a system
 * prompt) is not prefilled again. */
void pi2_session_reset(pi2_session *s);
size_t pi2_session_count(const pi2_session *s);
/* Message i (0 .. count-1), borrowed until the session changes. */
pi2_chat_msg pi2_session_msg(const pi2_session *s, size_t i);

/* One chat turn: add the user message, generate the assistant's reply
 * after the formatted conversation and add it (as far as it got). On an
 * error the user message is taken back and the conversation is as
 * before. PI2_ERANGE when the conversation does not fit the context
 * (the message says how far it is over), the engine's errors. */
int pi2_session_say(pi2_session *s, const char *user, const pi2_session_gen *g, pi2_session_result *res,
                    pi2_err *err);
/* Generate after text as it is (no chat formatting, messages untouched):
 * BOS, when the model has one, then text's tokens. PI2_ERANGE when the
 * prompt leaves no position for the reply, PI2_EINVAL for an empty prompt
 * on a model without BOS. */
int pi2_session_complete(pi2_session *s, const char *text, const pi2_session_gen *g, pi2_session_result *res,
                         pi2_err *err);

/* The prompt's tokens as a fresh session would run text: BOS (when the
 * model has one and text does not start with it), then text's. *ids is
 * the caller's. Safe from any thread (the tokenizer is read-only). */
int pi2_session_encode(const pi2_engine *e, const char *text, int32_t **ids, size_t *n, pi2_err *err);

/* Stop strings over the reply so far, text[0..len): returns the offset of
 * the earliest stop string and sets *found, or else the number of bytes
 * that can be emitted (those before the longest tail that could still
 * grow into a stop string). */
size_t pi2_stop_scan(const char *text, size_t len, const char *const *stop, size_t n_stop, bool *found);

#endif
