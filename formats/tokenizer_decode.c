/* Tokenizer: decoding ids to text.
 *
 * Why it is built this way:
 * - Decoding runs HF's decoder chain on a vector of token strings; the
 *   streaming decoder runs the same chain as a push-driven state machine (a
 *   Fuse turns the token stream into a character stream for the stages after
 *   it) and the tests check that both agree.
 */
#include "formats/tokenizer_internal.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char REPL_CHAR[] = "\xEF\xBF\xBD"; /* U+FFFD */

static bool utf8_valid(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        i += tok_u8_next((const uint8_t *)s + i, n - i, &cp);
        if (cp == UINT32_MAX)
            return false;
    }
    return true;
}

static bool byte_token(const char *s, size_t n, uint8_t *out)
{
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>')
        return false;
    /* u8::from_str_radix(&s[3..5], 16): two hex digits, or '+' and one */
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char ch = s[i];
        int d;
        if (ch >= '0' && ch <= '9')
            d = ch - '0';
        else if (ch >= 'a' && ch <= 'f')
            d = ch - 'a' + 10;
        else if (ch >= 'A' && ch <= 'F')
            d = ch - 'A' + 10;
        else if (ch == '+' && i == 3)
            continue;
        else
            return false;
        v = v * 16 + d;
    }
    *out = (uint8_t)v;
    return true;
}

/* Append s[0..n) to out with every `pat` replaced by `with` (HF Replace with
 * a String pattern; the Metaspace decoder is one too). With hold_tail, stop
 * before a tail that is a prefix of pat, which more text may complete.
 * *used: the bytes consumed. */
static int replace_run(sbuf *out, const char *s, size_t n, const char *pat, size_t plen, const char *with,
                       size_t wlen, bool hold_tail, size_t *used)
{
    size_t i = 0, run = 0;
    while (i < n) {
        size_t left = n - i;
        if (left >= plen && !memcmp(s + i, pat, plen)) {
            if (tok_sb_put(out, s + run, i - run) || tok_sb_put(out, with, wlen))
                return PI2_ENOMEM;
            i += plen;
            run = i;
        } else if (hold_tail && left < plen && !memcmp(s + i, pat, left)) {
            break;
        } else {
            i++;
        }
    }
    *used = i;
    return tok_sb_put(out, s + run, i - run);
}

/* A Replace or Metaspace step on one token (`first`: the sequence's first).
 * HF's Metaspace decoder turns the replacement character into a space, and
 * drops it in the first token unless the prepend scheme is "never". */
static int map_token(sbuf *out, const char *s, size_t n, const tok_op *op, bool first)
{
    size_t used;
    if (op->kind == OP_REPLACE)
        return replace_run(out, s, n, op->a, op->alen, op->b, op->blen, false, &used);
    bool drop = first && op->scheme != SCHEME_NEVER;
    return replace_run(out, s, n, op->a, op->alen, " ", drop ? 0 : 1, false, &used);
}

/* HF Strip on one whole token: the kept range [*a, *b). */
static void strip_range(const tok_op *op, const char *s, size_t n, size_t *a, size_t *b)
{
    size_t lo = 0, cut = 0;
    while (cut < op->start && n - lo >= op->alen && !memcmp(s + lo, op->a, op->alen)) {
        lo += op->alen;
        cut++;
    }
    size_t chars = 0;
    for (size_t i = lo; i < n; i++)
        chars += ((uint8_t)s[i] & 0xC0) != 0x80;
    size_t hi = n, k = 0;
    while (k < op->stop && k < chars && hi - lo >= op->alen && !memcmp(s + hi - op->alen, op->a, op->alen)) {
        hi -= op->alen;
        k++;
    }
    *a = lo;
    *b = hi;
}

typedef struct {
    sbuf *v;
    size_t n, cap;
} tvec;

static void tv_free(tvec *v)
{
    for (size_t i = 0; i < v->n; i++)
        tok_sb_free(&v->v[i]);
    free(v->v);
    v->v = NULL;
    v->n = v->cap = 0;
}

/* Append a new token holding s[0..n). */
static int tv_push(tvec *v, const char *s, size_t n)
{
    if (pi2_grow(&v->v, &v->cap, v->n, sizeof *v->v, 16))
        return PI2_ENOMEM;
    sbuf *b = &v->v[v->n];
    memset(b, 0, sizeof *b);
    v->n++;
    return tok_sb_put(b, s, n);
}

/* Where the tokens a step makes go: the next vector, or the stream's next
 * stage. */
typedef int (*emit_fn)(void *ctx, const char *p, size_t n);

/* HF ByteFallback on a finished run of byte tokens: one token of the bytes
 * when they are valid UTF-8, else one U+FFFD token per byte. Empties the run. */
static int emit_byte_run(sbuf *run, emit_fn emit, void *ctx)
{
    int rc = 0;
    if (run->n == 0)
        return 0;
    if (utf8_valid(run->p, run->n))
        rc = emit(ctx, run->p, run->n);
    else
        for (size_t i = 0; !rc && i < run->n; i++)
            rc = emit(ctx, REPL_CHAR, 3);
    run->n = 0;
    return rc;
}

static int tv_emit(void *v, const char *p, size_t n) { return tv_push(v, p, n); }

/* One decoder step over the whole token vector (HF decode_chain). */
static int dec_step(const tok_op *op, tvec *in, tvec *out)
{
    int rc = 0;
    switch (op->kind) {
    case OP_REPLACE:
    case OP_METASPACE:
        for (size_t i = 0; !rc && i < in->n; i++)
            if (!(rc = tv_push(out, "", 0)))
                rc = map_token(&out->v[out->n - 1], in->v[i].p, in->v[i].n, op, i == 0);
        break;
    case OP_STRIP:
        for (size_t i = 0; !rc && i < in->n; i++) {
            size_t a, b;
            strip_range(op, in->v[i].p, in->v[i].n, &a, &b);
            rc = tv_push(out, in->v[i].p + a, b - a);
        }
        break;
    case OP_FUSE:
        if (!(rc = tv_push(out, "", 0)))
            for (size_t i = 0; !rc && i < in->n; i++)
                rc = tok_sb_put(&out->v[0], in->v[i].p, in->v[i].n);
        break;
    case OP_BYTEFALLBACK: {
        sbuf run = {0};
        for (size_t i = 0; !rc && i < in->n; i++) {
            uint8_t byte;
            if (byte_token(in->v[i].p, in->v[i].n, &byte)) {
                rc = tok_sb_put(&run, &byte, 1);
            } else {
                rc = emit_byte_run(&run, tv_emit, out);
                if (!rc)
                    rc = tv_push(out, in->v[i].p, in->v[i].n);
            }
        }
        if (!rc)
            rc = emit_byte_run(&run, tv_emit, out);
        tok_sb_free(&run);
        break;
    }
    default:
        break;
    }
    return rc;
}

static bool keep_id(const pi2_tok *t, int32_t id, bool skip_special)
{
    /* HF skips ids it cannot map to a token */
    return id >= 0 && (size_t)id < t->n_total && !(skip_special && t->special[id]);
}

int pi2_tok_decode(const pi2_tok *t, const int32_t *ids, size_t n, bool skip_special, char **out, pi2_err *err)
{
    size_t len;
    return pi2_tok_decode_len(t, ids, n, skip_special, out, &len, err);
}

int pi2_tok_decode_len(const pi2_tok *t, const int32_t *ids, size_t n, bool skip_special, char **out, size_t *len,
                       pi2_err *err)
{
    *out = NULL;
    *len = 0;
    if (!t || (!ids && n))
        return pi2_err_set(err, PI2_EINVAL, "tokenizer: decode called with no tokenizer or ids");
    tvec cur = {0}, nxt = {0};
    sbuf res = {0};
    int rc = 0;
    for (size_t i = 0; !rc && i < n; i++)
        if (keep_id(t, ids[i], skip_special))
            rc = tv_push(&cur, piece_at(t, (size_t)ids[i]), t->plen[ids[i]]);
    for (int k = 0; !rc && t->has_decoder && k < t->n_dec; k++) {
        rc = dec_step(&t->dec[k], &cur, &nxt);
        tv_free(&cur);
        cur = nxt;
        memset(&nxt, 0, sizeof nxt);
    }
    for (size_t i = 0; !rc && i < cur.n; i++) {
        if (!t->has_decoder && i > 0)
            rc = tok_sb_put(&res, " ", 1);
        if (!rc)
            rc = tok_sb_put(&res, cur.v[i].p, cur.v[i].n);
    }
    if (!rc && !res.p)
        rc = tok_sb_put(&res, "", 0);
    tv_free(&cur);
    tv_free(&nxt);
    if (rc) {
        tok_sb_free(&res);
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory while decoding", t->name);
    }
    *out = res.p;
    *len = res.n;
    return 0;
}

/* ---- streaming ---- */

typedef struct {
    sbuf hold; /* ByteFallback run, or held bytes after a Fuse */
    sbuf tmp;  /* output handed to the next stage */
    size_t count;      /* Metaspace: tokens seen; Strip: content chars held */
    size_t start_left; /* Strip: leading chars still to strip */
    bool done;         /* ByteFallback after Fuse: cannot be a byte token */
} st_state;

struct pi2_tok_stream {
    const pi2_tok *t;
    bool skip_special;
    bool any; /* no decoder: a token was output (join with " ") */
    int fuse_at;
    st_state *st;
    sbuf out;
};

static void stream_reset(pi2_tok_stream *s)
{
    s->any = false;
    for (int k = 0; k < s->t->n_dec; k++) {
        s->st[k].hold.n = 0;
        s->st[k].count = 0;
        s->st[k].start_left = s->t->dec[k].start;
        s->st[k].done = false;
    }
}

void pi2_tok_stream_continue(pi2_tok_stream *s)
{
    s->any = true;
    for (int k = 0; k < s->t->n_dec; k++) {
        if (s->t->dec[k].kind == OP_METASPACE && s->st[k].count == 0)
            s->st[k].count = 1;
        if (s->t->dec[k].kind == OP_STRIP)
            s->st[k].start_left = 0;
    }
}

int pi2_tok_stream_create(pi2_tok_stream **out, const pi2_tok *t, bool skip_special, pi2_err *err)
{
    *out = NULL;
    if (!t)
        return pi2_err_set(err, PI2_EINVAL, "tokenizer: stream without a tokenizer");
    pi2_tok_stream *s = calloc(1, sizeof *s);
    if (!s || !(s->st = pi2_calloc_array((size_t)t->n_dec, sizeof *s->st))) {
        free(s);
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", t->name);
    }
    s->t = t;
    s->skip_special = skip_special;
    s->fuse_at = t->n_dec;
    for (int k = 0; k < t->n_dec; k++)
        if (t->dec[k].kind == OP_FUSE) {
            s->fuse_at = k;
            break;
        }
    stream_reset(s);
    *out = s;
    return 0;
}

void pi2_tok_stream_free(pi2_tok_stream *s)
{
    if (!s)
        return;
    for (int k = 0; s->t && k < s->t->n_dec; k++) {
        tok_sb_free(&s->st[k].hold);
        tok_sb_free(&s->st[k].tmp);
    }
    free(s->st);
    tok_sb_free(&s->out);
    free(s);
}

static int s_tok(pi2_tok_stream *s, int k, const char *p, size_t n);
static int s_chars(pi2_tok_stream *s, int k, const char *p, size_t n);

typedef struct {
    pi2_tok_stream *s;
    int k;
} stage_ref;

static int s_tok_emit(void *ref, const char *p, size_t n)
{
    stage_ref *r = ref;
    return s_tok(r->s, r->k, p, n);
}

/* Emit a finished ByteFallback run of stage k to stage k+1. */
static int s_bytes(pi2_tok_stream *s, int k)
{
    stage_ref next = {s, k + 1};
    return emit_byte_run(&s->st[k].hold, s_tok_emit, &next);
}

/* A whole token arrives at stage k (before any Fuse). */
static int s_tok(pi2_tok_stream *s, int k, const char *p, size_t n)
{
    const pi2_tok *t = s->t;
    if (k == t->n_dec)
        return tok_sb_put(&s->out, p, n);
    const tok_op *op = &t->dec[k];
    st_state *st = &s->st[k];
    int rc;
    switch (op->kind) {
    case OP_REPLACE:
    case OP_METASPACE:
        st->tmp.n = 0;
        if ((rc = map_token(&st->tmp, p, n, op, op->kind == OP_METASPACE && st->count++ == 0)))
            return rc;
        return s_tok(s, k + 1, st->tmp.p, st->tmp.n);
    case OP_STRIP: {
        size_t a, b;
        strip_range(op, p, n, &a, &b);
        return s_tok(s, k + 1, p + a, b - a);
    }
    case OP_BYTEFALLBACK: {
        uint8_t byte;
        if (byte_token(p, n, &byte))
            return tok_sb_put(&st->hold, &byte, 1);
        if ((rc = s_bytes(s, k)))
            return rc;
        return s_tok(s, k + 1, p, n);
    }
    case OP_FUSE:
        return s_chars(s, k + 1, p, n);
    default:
        return 0;
    }
}

/* HF Strip after a Fuse, on the characters as they come: up to `start`
 * leading content characters are dropped, trailing ones (up to `stop`) held
 * until a different character shows they are not trailing. Output in st->tmp. */
static int strip_chars(st_state *st, const tok_op *op, const char *p, size_t n)
{
    int rc;
    st->tmp.n = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t cl = tok_u8_next((const uint8_t *)p + i, n - i, &cp);
        bool is_c = cl == op->alen && !memcmp(p + i, op->a, cl);
        if (st->start_left > 0) {
            if (is_c) {
                st->start_left--;
                i += cl;
                continue;
            }
            st->start_left = 0;
        }
        if (op->stop == 0) {
            rc = tok_sb_put(&st->tmp, p + i, cl);
        } else if (is_c) {
            rc = tok_sb_put(&st->hold, p + i, cl);
            if (!rc && ++st->count > op->stop) {
                rc = tok_sb_put(&st->tmp, op->a, op->alen);
                memmove(st->hold.p, st->hold.p + op->alen, st->hold.n - op->alen);
                st->hold.n -= op->alen;
                st->count--;
            }
        } else {
            rc = tok_sb_put(&st->tmp, st->hold.p ? st->hold.p : "", st->hold.n);
            st->hold.n = 0;
            st->count = 0;
            if (!rc)
                rc = tok_sb_put(&st->tmp, p + i, cl);
        }
        if (rc)
            return rc;
        i += cl;
    }
    return 0;
}

/* Characters of the single fused token arrive at stage k (after a Fuse);
 * chunks always end on a character boundary. */
static int s_chars(pi2_tok_stream *s, int k, const char *p, size_t n)
{
    const pi2_tok *t = s->t;
    if (n == 0)
        return 0;
    if (k == t->n_dec)
        return tok_sb_put(&s->out, p, n);
    const tok_op *op = &t->dec[k];
    st_state *st = &s->st[k];
    int rc;
    switch (op->kind) {
    case OP_REPLACE: {
        /* hold back a tail that may still become a match */
        sbuf *h = &st->hold;
        size_t used;
        st->tmp.n = 0;
        if ((rc = tok_sb_put(h, p, n)) ||
            (rc = replace_run(&st->tmp, h->p, h->n, op->a, op->alen, op->b, op->blen, true, &used)))
            return rc;
        memmove(h->p, h->p + used, h->n - used);
        h->n -= used;
        return s_chars(s, k + 1, st->tmp.p, st->tmp.n);
    }
    case OP_METASPACE:
        st->tmp.n = 0;
        if ((rc = map_token(&st->tmp, p, n, op, true)))
            return rc;
        return s_chars(s, k + 1, st->tmp.p, st->tmp.n);
    case OP_STRIP:
        if ((rc = strip_chars(st, op, p, n)))
            return rc;
        return s_chars(s, k + 1, st->tmp.p, st->tmp.n);
    case OP_BYTEFALLBACK:
        /* the fused token is one token: a byte token only if it is exactly
         * "<0xXX>", which is known once it is longer than 6 bytes */
        if (st->done)
            return s_chars(s, k + 1, p, n);
        if ((rc = tok_sb_put(&st->hold, p, n)))
            return rc;
        if (st->hold.n > 6) {
            st->done = true;
            rc = s_chars(s, k + 1, st->hold.p, st->hold.n);
            st->hold.n = 0;
        }
        return rc;
    case OP_FUSE:
    default:
        return s_chars(s, k + 1, p, n);
    }
}

static int s_flush(pi2_tok_stream *s, int k)
{
    const pi2_tok *t = s->t;
    int rc = 0;
    if (k == t->n_dec)
        return 0;
    const tok_op *op = &t->dec[k];
    st_state *st = &s->st[k];
    if (k < s->fuse_at) {
        if (op->kind == OP_BYTEFALLBACK && (rc = s_bytes(s, k)))
            return rc;
        return s_flush(s, k + 1);
    }
    switch (op->kind) {
    case OP_REPLACE:
        rc = s_chars(s, k + 1, st->hold.p, st->hold.n);
        break;
    case OP_BYTEFALLBACK:
        if (!st->done && st->hold.n) {
            uint8_t byte;
            if (byte_token(st->hold.p, st->hold.n, &byte))
                rc = byte < 0x80 ? s_chars(s, k + 1, (const char *)&byte, 1) : s_chars(s, k + 1, REPL_CHAR, 3);
            else
                rc = s_chars(s, k + 1, st->hold.p, st->hold.n);
        }
        break;
    default: /* Strip drops its held trailing characters */
        break;
    }
    st->hold.n = 0;
    if (rc)
        return rc;
    return s_flush(s, k + 1);
}

/* What this push or flush gives the caller: the stream's output, or the
 * error of a failed allocation. */
static int stream_out(const pi2_tok_stream *s, int rc, const char **bytes, size_t *len, pi2_err *err)
{
    if (rc)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory while decoding", s->t->name);
    *bytes = s->out.p ? s->out.p : "";
    *len = s->out.n;
    return 0;
}

int pi2_tok_stream_push(pi2_tok_stream *s, int32_t id, const char **bytes, size_t *len, pi2_err *err)
{
    *bytes = "";
    *len = 0;
    if (!s)
        return pi2_err_set(err, PI2_EINVAL, "tokenizer: push to no stream");
    const pi2_tok *t = s->t;
    s->out.n = 0;
    int rc = 0;
    if (keep_id(t, id, s->skip_special)) {
        const char *p = piece_at(t, (size_t)id);
        size_t n = t->plen[id];
        if (!t->has_decoder) {
            if (s->any)
                rc = tok_sb_put(&s->out, " ", 1);
            if (!rc)
                rc = tok_sb_put(&s->out, p, n);
            s->any = true;
        } else {
            rc = s_tok(s, 0, p, n);
        }
    }
    return stream_out(s, rc, bytes, len, err);
}

int pi2_tok_stream_flush(pi2_tok_stream *s, const char **bytes, size_t *len, pi2_err *err)
{
    *bytes = "";
    *len = 0;
    if (!s)
        return pi2_err_set(err, PI2_EINVAL, "tokenizer: flush of no stream");
    s->out.n = 0;
    int rc = s->t->has_decoder ? s_flush(s, 0) : 0;
    stream_reset(s);
    return stream_out(s, rc, bytes, len, err);
}
