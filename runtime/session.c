/* A conversation over one engine (see session.h): prompt reuse through the
 * KV cache, the decode loop of a reply, stop strings, dropping old turns. */
#include "runtime/session.h"

#include <stdlib.h>
#include <string.h>

typedef struct owned_msg {
    char *role, *content;
} owned_msg;

struct pi2_session {
    pi2_engine *e;
    int ctx;
    int32_t *hist; /* [ctx] tokens in the KV cache, n_hist of them */
    size_t n_hist;
    char *kv_text; /* the text those tokens are, when known exactly (kv_ok) */
    bool kv_ok;
    float *logits; /* [vocab] */
    owned_msg *msgs;
    size_t n_msgs, cap_msgs;
    bool drop_oldest;
    const pi2_chat_template *tmpl; /* NULL: ChatML */
    char *reply; /* the last reply: len bytes, NUL-terminated */
    size_t len, cap;
};

int pi2_session_create(pi2_session **out, pi2_engine *e, pi2_err *err)
{
    *out = NULL;
    pi2_session *s = calloc(1, sizeof *s);
    if (!s)
        return pi2_err_set(err, PI2_ENOMEM, "out of memory for a session");
    s->e = e;
    s->ctx = pi2_engine_ctx(e);
    s->hist = pi2_malloc_array((size_t)s->ctx, sizeof *s->hist);
    s->logits = pi2_malloc_array((size_t)pi2_engine_desc(e)->vocab, sizeof *s->logits);
    s->reply = malloc(s->cap = 256);
    if (!s->hist || !s->logits || !s->reply) {
        pi2_session_free(s);
        return pi2_err_set(err, PI2_ENOMEM, "out of memory for a session");
    }
    s->reply[0] = 0;
    *out = s;
    return 0;
}

void pi2_session_free(pi2_session *s)
{
    if (!s)
        return;
    pi2_session_reset(s);
    free(s->msgs);
    free(s->hist);
    free(s->kv_text);
    free(s->logits);
    free(s->reply);
    free(s);
}

pi2_engine *pi2_session_engine(const pi2_session *s) { return s->e; }

void pi2_session_set_drop_oldest(pi2_session *s, bool on) { s->drop_oldest = on; }

int pi2_session_add(pi2_session *s, const char *role, const char *content, pi2_err *err)
{
    if (!role || !*role || !content)
        return pi2_err_set(err, PI2_EINVAL, "a chat message needs a role and a content");
    if (s->n_msgs == s->cap_msgs) {
        size_t cap = s->cap_msgs ? 2 * s->cap_msgs : 8;
        owned_msg *m = realloc(s->msgs, cap * sizeof *m);
        if (!m)
            return pi2_err_set(err, PI2_ENOMEM, "out of memory for a chat message");
        s->msgs = m;
        s->cap_msgs = cap;
    }
    owned_msg m = {pi2_strdup(role), pi2_strdup(content)};
    if (!m.role || !m.content) {
        free(m.role);
        free(m.content);
        return pi2_err_set(err, PI2_ENOMEM, "out of memory for a chat message");
    }
    s->msgs[s->n_msgs++] = m;
    return 0;
}

void pi2_session_set_template(pi2_session *s, const pi2_chat_template *t) { s->tmpl = t; }

/* Remove message i, keeping the order of the rest. */
static void msg_remove(pi2_session *s, size_t i)
{
    free(s->msgs[i].role);
    free(s->msgs[i].content);
    memmove(s->msgs + i, s->msgs + i + 1, (s->n_msgs - i - 1) * sizeof *s->msgs);
    s->n_msgs--;
}

void pi2_session_reset(pi2_session *s)
{
    while (s->n_msgs > 0)
        msg_remove(s, s->n_msgs - 1);
}

size_t pi2_session_count(const pi2_session *s) { return s->n_msgs; }

pi2_chat_msg pi2_session_msg(const pi2_session *s, size_t i)
{
    return (pi2_chat_msg){s->msgs[i].role, s->msgs[i].content};
}

int pi2_session_encode(const pi2_engine *e, const char *text, int32_t **ids, size_t *n, pi2_err *err)
{
    const pi2_model_desc *d = pi2_engine_desc(e);
    const pi2_tok *tok = pi2_engine_tokenizer(e);
    int32_t *t = NULL;
    size_t nt = 0;
    int rc = pi2_tok_encode(tok, text, strlen(text), &t, &nt, err);
    if (rc)
        return rc;
    int bos = d->bos_id >= 0 ? d->bos_id : pi2_tok_bos(tok);
    bool add = bos >= 0 && !(nt > 0 && t[0] == bos);
    int32_t *all = realloc(t, (nt + 1) * sizeof *all);
    if (!all) {
        free(t);
        return pi2_err_set(err, PI2_ENOMEM, "out of memory");
    }
    if (add) {
        memmove(all + 1, all, nt * sizeof *all);
        all[0] = bos;
        nt++;
    }
    *ids = all;
    *n = nt;
    return 0;
}

size_t pi2_stop_scan(const char *text, size_t len, const char *const *stop, size_t n_stop, bool *found)
{
    size_t first = len, hold = 0;
    *found = false;
    for (size_t i = 0; i < n_stop; i++) {
        size_t sl = strlen(stop[i]);
        if (sl == 0)
            continue;
        const char *p = sl <= len ? memmem(text, len, stop[i], sl) : NULL;
        if (p && (size_t)(p - text) < first) {
            first = (size_t)(p - text);
            *found = true;
        }
        /* the longest tail of text that is a proper prefix of stop[i] */
        for (size_t k = sl - 1 < len ? sl - 1 : len; k > hold; k--)
            if (memcmp(text + len - k, stop[i], k) == 0) {
                hold = k;
                break;
            }
    }
    return *found ? first : len - hold;
}

static int reply_put(pi2_session *s, const char *b, size_t n, pi2_err *err)
{
    if (s->len + n + 1 > s->cap) {
        size_t cap = s->cap;
        while (cap < s->len + n + 1)
            cap *= 2;
        char *p = realloc(s->reply, cap);
        if (!p)
            return pi2_err_set(err, PI2_ENOMEM, "out of memory for the reply");
        s->reply = p;
        s->cap = cap;
    }
    memcpy(s->reply + s->len, b, n);
    s->len += n;
    s->reply[s->len] = 0;
    return 0;
}

/* One reply's streaming state. */
typedef struct gen_run {
    const pi2_session_gen *g;
    size_t sent;  /* reply bytes emitted */
    bool stopped; /* a stop string was found: the reply ends before it */
    bool cancelled;
} gen_run;

/* New bytes b[0..n) of the reply: scan the stop strings, emit what is
 * final (all of it when final is set: nothing more will come). */
static int reply_grow(pi2_session *s, gen_run *r, const char *b, size_t n, bool final, pi2_err *err)
{
    int rc = reply_put(s, b, n, err);
    if (rc)
        return rc;
    bool found;
    size_t upto = pi2_stop_scan(s->reply, s->len, r->g->stop, r->g->n_stop, &found);
    if (found) {
        s->len = upto;
        s->reply[upto] = 0;
        r->stopped = true;
    } else if (final)
        upto = s->len;
    if (upto > r->sent && r->g->emit && !r->cancelled) {
        if (r->g->emit(r->g->ctx, s->reply + r->sent, upto - r->sent) != 0)
            r->cancelled = true;
    }
    if (upto > r->sent)
        r->sent = upto;
    return 0;
}

/* Prefill ids[0..n), after the longest prefix already in the cache (at
 * least the last token runs: its logits start the reply). */
static int prefill(pi2_session *s, const int32_t *ids, size_t n, pi2_session_result *res, pi2_err *err)
{
    size_t k = 0;
    while (k < s->n_hist && k < n && s->hist[k] == ids[k])
        k++;
    if (k == n)
        k = n - 1;
    s->n_hist = k;
    int rc = pi2_engine_prefill(s->e, ids + k, (int)(n - k), (int)k, s->logits, err);
    if (rc)
        return rc;
    memcpy(s->hist + k, ids + k, (n - k) * sizeof *ids);
    s->n_hist = n;
    res->prompt_tokens = (int)n;
    res->prefilled = (int)(n - k);
    return 0;
}

/* Sample, stream and feed back the reply's tokens (see session.h for when
 * it ends). */
static int decode_reply(pi2_session *s, const pi2_session_gen *g, pi2_session_result *res, pi2_err *err)
{
    const pi2_model_desc *d = pi2_engine_desc(s->e);
    const pi2_tok *tok = pi2_engine_tokenizer(s->e);
    pi2_sampler *smp = NULL;
    pi2_tok_stream *ts = NULL;
    gen_run r = {.g = g};
    int n_valid = pi2_tok_vocab_size(tok);
    int rc = pi2_sampler_create(&smp, d->vocab, &g->so, err);
    if (rc == 0)
        rc = pi2_tok_stream_create(&ts, tok, true, err);
    res->finish = PI2_FINISH_LENGTH;
    for (long long n_gen = 0; rc == 0 && n_gen < g->max_tokens;) {
        pi2_logits_mask_padding(s->logits, d->vocab, n_valid);
        int next = pi2_sampler_next(smp, s->logits);
        res->completion_tokens = (int)++n_gen;
        if (pi2_desc_is_end(d, next)) {
            res->finish = PI2_FINISH_STOP;
            break;
        }
        const char *b;
        size_t len;
        if ((rc = pi2_tok_stream_push(ts, next, &b, &len, err)) != 0 ||
            (rc = reply_grow(s, &r, b, len, false, err)) != 0)
            break;
        if (r.stopped || r.cancelled || (g->cancel && g->cancel(g->ctx)) || n_gen == g->max_tokens ||
            s->n_hist >= (size_t)s->ctx) {
            res->finish = r.stopped                      ? PI2_FINISH_STOP
                          : n_gen == g->max_tokens && !r.cancelled ? PI2_FINISH_LENGTH
                          : s->n_hist >= (size_t)s->ctx && !r.cancelled ? PI2_FINISH_CTX
                                                                         : PI2_FINISH_CANCEL;
            break;
        }
        if ((rc = pi2_engine_decode(s->e, next, (int)s->n_hist, s->logits, err)) != 0)
            break;
        s->hist[s->n_hist++] = next;
    }
    if (rc == 0 && !r.stopped) { /* what the stream still holds */
        const char *b;
        size_t len;
        if ((rc = pi2_tok_stream_flush(ts, &b, &len, err)) == 0)
            rc = reply_grow(s, &r, b, len, true, err);
        if (r.stopped)
            res->finish = PI2_FINISH_STOP;
    }
    pi2_tok_stream_free(ts);
    pi2_sampler_free(smp);
    return rc;
}

/* The prompt's tokens: the cache's and the new text's when the cache's
 * text is a prefix of text, else text's alone (pi2_session_encode). */
static int prompt_ids(pi2_session *s, const char *text, int32_t **ids, size_t *n, pi2_err *err)
{
    size_t kl = s->kv_ok ? strlen(s->kv_text) : 0;
    if (!s->kv_ok || strncmp(text, s->kv_text, kl) != 0)
        return pi2_session_encode(s->e, text, ids, n, err);
    int32_t *rest = NULL;
    size_t nr = 0;
    int rc = pi2_tok_encode(pi2_engine_tokenizer(s->e), text + kl, strlen(text + kl), &rest, &nr, err);
    if (rc)
        return rc;
    int32_t *all = pi2_malloc_array(s->n_hist + nr + 1, sizeof *all);
    if (!all) {
        free(rest);
        return pi2_err_set(err, PI2_ENOMEM, "out of memory");
    }
    memcpy(all, s->hist, s->n_hist * sizeof *all);
    memcpy(all + s->n_hist, rest, nr * sizeof *all);
    free(rest);
    *ids = all;
    *n = s->n_hist + nr;
    return 0;
}

/* Remember the cache's text: the prompt's, then that of the reply's
 * tokens fed back (from position from on), decoded as the reply streamed
 * them (so a conversation that quotes the reply starts with it). */
static void keep_text(pi2_session *s, const char *text, size_t from)
{
    free(s->kv_text);
    s->kv_text = NULL;
    s->kv_ok = false;
    char *gen = NULL;
    size_t gl = 0;
    pi2_err ignored = {0};
    if (pi2_tok_decode_len(pi2_engine_tokenizer(s->e), s->hist + from, s->n_hist - from, true, &gen, &gl, &ignored))
        return;
    size_t tl = strlen(text);
    s->kv_text = memchr(gen, 0, gl) ? NULL : malloc(tl + gl + 1);
    if (s->kv_text) {
        memcpy(s->kv_text, text, tl);
        memcpy(s->kv_text + tl, gen, gl);
        s->kv_text[tl + gl] = 0;
        s->kv_ok = true;
    }
    free(gen);
}

int pi2_session_complete(pi2_session *s, const char *text, const pi2_session_gen *g, pi2_session_result *res,
                         pi2_err *err)
{
    int32_t *ids = NULL;
    size_t n = 0;
    memset(res, 0, sizeof *res);
    s->len = 0;
    s->reply[0] = 0;
    res->text = s->reply;
    int rc = prompt_ids(s, text, &ids, &n, err);
    if (rc)
        return rc;
    if (n == 0)
        rc = pi2_err_set(err, PI2_EINVAL, "empty prompt and the model has no BOS token; give some text");
    else if (n >= (size_t)s->ctx)
        rc = pi2_err_set(err, PI2_ERANGE, "the prompt (%zu tokens) leaves no room for a reply in the context of %d positions",
                         n, s->ctx);
    if (rc == 0) {
        free(s->kv_text);
        s->kv_text = NULL;
        s->kv_ok = false;
        if ((rc = prefill(s, ids, n, res, err)) == 0)
            rc = decode_reply(s, g, res, err);
    }
    free(ids);
    if (rc == 0)
        keep_text(s, text, n);
    res->text = s->reply;
    res->len = s->len;
    return rc;
}

/* The conversation with `drop` messages left out after the leading system
 * ones, formatted for a reply, into *text. */
static int format_view(pi2_session *s, size_t drop, char **text, pi2_err *err)
{
    pi2_chat_msg *v = pi2_malloc_array(s->n_msgs, sizeof *v);
    if (!v)
        return pi2_err_set(err, PI2_ENOMEM, "out of memory");
    size_t ns = 0, nv = 0;
    while (ns < s->n_msgs && strcmp(s->msgs[ns].role, "system") == 0)
        ns++;
    for (size_t i = 0; i < s->n_msgs; i++)
        if (i < ns || i >= ns + drop)
            v[nv++] = pi2_session_msg(s, i);
    int rc = pi2_chat_format(s->tmpl, v, nv, true, text, err);
    free(v);
    return rc;
}

/* How many messages after the system ones to leave out so the prompt and
 * room for a reply fit (whole turns: a user message and what follows it
 * up to the next one; never the last message), and the prompt's text. */
static int fit_view(pi2_session *s, const pi2_session_gen *g, size_t *drop, char **text, pi2_err *err)
{
    size_t ns = 0;
    while (ns < s->n_msgs && strcmp(s->msgs[ns].role, "system") == 0)
        ns++;
    long long room = g->max_tokens < s->ctx / 2 ? g->max_tokens : s->ctx / 2;
    for (*drop = 0;; ) {
        int rc = format_view(s, *drop, text, err);
        if (rc || !s->drop_oldest)
            return rc;
        int32_t *ids = NULL;
        size_t n = 0;
        if ((rc = pi2_session_encode(s->e, *text, &ids, &n, err)) != 0)
            return rc;
        free(ids);
        if ((long long)n + (room > 0 ? room : 1) <= s->ctx)
            return 0;
        size_t d = *drop + 1; /* the turn: up to the next user message */
        while (ns + d < s->n_msgs - 1 && strcmp(s->msgs[ns + d].role, "user") != 0)
            d++;
        if (ns + d >= s->n_msgs) /* nothing left to drop but the new message */
            return 0;
        free(*text);
        *text = NULL;
        *drop = d;
    }
}

int pi2_session_say(pi2_session *s, const char *user, const pi2_session_gen *g, pi2_session_result *res,
                    pi2_err *err)
{
    memset(res, 0, sizeof *res);
    res->text = s->reply;
    int rc = pi2_session_add(s, "user", user, err);
    if (rc)
        return rc;
    char *text = NULL;
    size_t drop = 0;
    if ((rc = fit_view(s, g, &drop, &text, err)) == 0 && (rc = pi2_session_complete(s, text, g, res, err)) == 0)
        rc = pi2_session_add(s, "assistant", s->reply, err);
    free(text);
    if (rc) {
        msg_remove(s, s->n_msgs - 1);
        return rc;
    }
    size_t ns = 0;
    while (ns < s->n_msgs && strcmp(s->msgs[ns].role, "system") == 0)
        ns++;
    for (size_t i = 0; i < drop; i++)
        msg_remove(s, ns);
    res->dropped = (int)drop;
    return 0;
}
