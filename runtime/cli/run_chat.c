/* pi2-run chat: a conversation on a terminal, or scripted from stdin (one
 * user message per line; lines starting with '/' are commands). */
#include "runtime/cli/run.h"
#include "runtime/session.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int emit_stdout(void *ctx, const char *text, size_t len)
{
    (void)ctx;
    fwrite(text, 1, len, stdout);
    return fflush(stdout) != 0 || ferror(stdout) ? -1 : 0;
}

void run_chat_ctx(const run_opts *o, pi2_engine *e)
{
    if (o->ctx > 0)
        return;
    int want = pi2_desc_max_ctx(pi2_engine_desc(e));
    if (want > 2048)
        want = 2048;
    pi2_err ignored = {0};
    if (want > pi2_engine_ctx(e))
        (void)pi2_engine_set_ctx(e, want, &ignored); /* refused: the default stays */
}

static int chat_start(const run_opts *o, pi2_session *s, pi2_err *err)
{
    pi2_session_reset(s);
    return o->system && *o->system ? pi2_session_add(s, "system", o->system, err) : 0;
}

static void chat_help(FILE *f)
{
    fprintf(f, "Type a message and press Enter. Commands:\n"
               "  /reset  start a new conversation (the system prompt stays)\n"
               "  /quit   leave (so does end of input, Ctrl-D)\n"
               "  /help   this help\n");
}

/* One user line: a command or a turn. 1 to leave, 0 to go on, or a
 * PI2_E* code that ends the run (err filled). */
static int chat_line(const run_opts *o, pi2_session *s, const char *line, bool tty, pi2_err *err)
{
    if (line[0] == '/') {
        if (strcmp(line, "/quit") == 0 || strcmp(line, "/exit") == 0)
            return 1;
        if (strcmp(line, "/reset") == 0) {
            int rc = chat_start(o, s, err);
            if (rc == 0 && tty)
                fprintf(stderr, "(new conversation)\n");
            return rc;
        }
        if (strcmp(line, "/help") == 0)
            chat_help(stderr);
        else
            fprintf(stderr, "pi2-run: unknown command '%s'; /help lists them\n", line);
        return 0;
    }
    pi2_session_gen g = {.so = o->so, .max_tokens = o->n_predict, .emit = emit_stdout};
    pi2_session_result res;
    int rc = pi2_session_say(s, line, &g, &res, err);
    if (rc == PI2_ERANGE) { /* the conversation goes on: the message was not taken */
        fprintf(stderr, "pi2-run: %s; /reset starts over, --chat-drop-oldest drops the oldest turns\n", err->msg);
        return 0;
    }
    if (rc)
        return rc;
    fputc('\n', stdout);
    if (fflush(stdout) != 0 || ferror(stdout))
        return pi2_err_errno(err, PI2_EIO, errno, "cannot write to standard output");
    if (res.dropped > 0)
        fprintf(stderr, "(%d oldest message%s dropped to fit the context)\n", res.dropped, res.dropped > 1 ? "s" : "");
    if (res.finish == PI2_FINISH_CTX)
        fprintf(stderr, "pi2-run: the context of %d positions is full: the reply was cut; /reset starts over%s\n",
                pi2_engine_ctx(pi2_session_engine(s)), o->chat_drop_oldest ? "" : ", --chat-drop-oldest drops the oldest turns");
    if (o->stats)
        fprintf(stderr, "[prompt %d tokens, %d prefilled; reply %d tokens]\n", res.prompt_tokens, res.prefilled,
                res.completion_tokens);
    return 0;
}

int run_chat_template(const run_opts *o, const pi2_engine *e, pi2_chat_template *t, pi2_chat_config *cc,
                      const pi2_chat_template **use, pi2_err *err)
{
    *use = NULL;
    memset(cc, 0, sizeof *cc);
    if (o->chat_template) {
        int rc = pi2_chat_template_load(o->chat_template, t, cc, err);
        *use = rc == 0 ? t : NULL;
        return rc;
    }
    pi2_err e2 = {0};
    int rc = pi2_engine_chat_config(e, cc, &e2);
    if (rc == PI2_ENOTFOUND)
        return 0; /* ChatML */
    if (rc)
        return pi2_err_set(err, rc, "%s", e2.msg);
    *t = (pi2_chat_template){.text = cc->chat_template, .bos = cc->bos_token, .eos = cc->eos_token};
    *use = t;
    return 0;
}

int run_chat(const run_opts *o)
{
    pi2_err err = {0};
    pi2_engine *e = NULL;
    pi2_session *s = NULL;
    pi2_chat_template tmpl;
    pi2_chat_config cc = {0};
    char *line = NULL;
    size_t cap = 0;
    int rc, status = 1;
    bool tty = isatty(STDIN_FILENO) && isatty(STDERR_FILENO);
    if ((rc = open_engine(o, o->ctx, &e, &err)) != 0)
        goto out;
    run_chat_ctx(o, e);
    const pi2_chat_template *use;
    if ((rc = run_chat_template(o, e, &tmpl, &cc, &use, &err)) != 0 || (rc = pi2_session_create(&s, e, &err)) != 0)
        goto out;
    pi2_session_set_template(s, use);
    if ((rc = chat_start(o, s, &err)) != 0)
        goto out;
    pi2_session_set_drop_oldest(s, o->chat_drop_oldest);
    if (tty) {
        fprintf(stderr, "pi2-run chat: %d positions of context, up to %lld tokens a reply. /help for commands.\n",
                pi2_engine_ctx(e), o->n_predict);
    }
    for (;;) {
        if (tty)
            fputs("> ", stderr);
        ssize_t n = getline(&line, &cap, stdin);
        if (n < 0)
            break;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            line[--n] = 0;
        if (n == 0)
            continue;
        if ((size_t)n != strlen(line)) {
            fprintf(stderr, "pi2-run: a line holds a NUL byte; skipped\n");
            continue;
        }
        int r = chat_line(o, s, line, tty, &err);
        if (r == 1)
            break;
        if ((rc = r) != 0)
            goto out;
    }
    status = 0;
out:
    if (rc)
        fail(&err);
    free(line);
    pi2_session_free(s);
    pi2_jinja_config_free(&cc);
    pi2_engine_close(e);
    return status;
}
