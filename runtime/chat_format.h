/* Chat formatting: a list of messages turned into the text a model was
 * trained to continue. Everything that knows a chat format lives behind
 * pi2_chat_format; the session (runtime/session.h), pi2-run chat and the
 * server only see its text.
 *
 * A format is a Jinja chat template, rendered by formats/jinja.h as
 * Hugging Face renders it: the model's own (its tokenizer_config.json's
 * chat_template, given with pi2-run --chat-template) or one of the
 * built-ins (chatml, llama2, mistral, vicuna). Without one, ChatML:
 *     <|im_start|>ROLE\nCONTENT<|im_end|>\n      per message
 *     <|im_start|>assistant\n                    with add_generation_prompt
 * the format of the published instruct models' template.
 *
 * BOS: the session's encoder puts the model's BOS token first (as the
 * prompt path does), so a template that writes bos_token itself (Llama-2,
 * Mistral) has that leading text taken off the rendered prompt: one BOS,
 * not two. */
#ifndef PI2_CHAT_FORMAT_H
#define PI2_CHAT_FORMAT_H

#include "formats/common.h"
#include "formats/jinja.h"

#include <stdbool.h>
#include <stddef.h>

/* A chat format: the template's text and the token texts it is given as
 * bos_token and eos_token (NULL: ""). All borrowed. */
typedef struct pi2_chat_template {
    const char *text;
    const char *bos, *eos;
} pi2_chat_template;

/* Render msgs[0..n) (pi2_chat_msg: formats/jinja.h) with template t (NULL:
 * ChatML) into *out (NUL-terminated, the caller frees); add_generation_prompt
 * appends what opens the assistant's reply. PI2_EINVAL for a message
 * without a role or content, or a template that refuses the conversation
 * (its raise_exception message); the renderer's codes otherwise
 * (formats/jinja.h). */
int pi2_chat_format(const pi2_chat_template *t, const pi2_chat_msg *msgs, size_t n, bool add_generation_prompt,
                    char **out, pi2_err *err);

/* The template `spec` names, into *t and its storage *cc (freed with
 * pi2_jinja_config_free): a built-in name (chatml, llama2, mistral,
 * vicuna), a tokenizer_config.json (a file, or the model directory that
 * holds it: its chat_template, bos_token and eos_token), or a file holding
 * the template's text. PI2_ENOTFOUND when a tokenizer_config.json has no
 * chat_template; the reader's codes otherwise. */
int pi2_chat_template_load(const char *spec, pi2_chat_template *t, pi2_chat_config *cc, pi2_err *err);

#endif
