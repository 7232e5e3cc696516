/* Chat formatting: a list of messages turned into the text a model was
 * trained to continue. Everything that knows a chat format lives behind
 * pi2_chat_format; the session (runtime/session.h), pi2-run chat and the
 * server only see its text.
 *
 * For now every model is rendered as ChatML:
 *     <|im_start|>ROLE\nCONTENT<|im_end|>\n      per message
 *     <|im_start|>assistant\n                    with add_generation_prompt
 * The model's own template (the container's chat_template) will be
 * rendered here too, when there is one. */
#ifndef PI2_CHAT_FORMAT_H
#define PI2_CHAT_FORMAT_H

#include "formats/common.h"

#include <stdbool.h>
#include <stddef.h>

/* One message: role ("system", "user", "assistant", ...) and its text,
 * both NUL-terminated UTF-8, borrowed. */
typedef struct pi2_chat_msg {
    const char *role;
    const char *content;
} pi2_chat_msg;

struct pi2_engine;

/* Render msgs[0..n) for the model of engine e (NULL: the built-in ChatML)
 * into *out (NUL-terminated, the caller frees); add_generation_prompt
 * appends what opens the assistant's reply. PI2_EINVAL for a message
 * without a role or content, PI2_ENOMEM. */
int pi2_chat_format(const struct pi2_engine *e, const pi2_chat_msg *msgs, size_t n, bool add_generation_prompt,
                    char **out, pi2_err *err);

#endif
