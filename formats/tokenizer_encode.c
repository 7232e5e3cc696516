/* Tokenizer: encoding text to ids.
 *
 * Why it is built this way:
 * - HF's pipeline is reproduced step by step, because small deviations (where
 *   a "▁" goes, which merge wins) change token ids:
 *     raw text -> split on non-normalized added tokens -> normalizer (per
 *     piece) -> split on normalized added tokens -> pre-tokenizers -> BPE.
 * - The BPE merge loop is HF's own (models/bpe/word.rs merge_all): a min-heap
 *   of candidate merges keyed by (rank, position) over a linked list of
 *   symbols, stale entries skipped when popped. It is O(n log n) per word, so
 *   a tokenizer without a pre-tokenizer (the whole text is one "word") stays
 *   fast on long prompts.
 */
#include "formats/tokenizer_internal.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int32_t *p;
    size_t n, cap;
} ivec;

static int iv_push(ivec *v, int32_t x)
{
    if (pi2_grow(&v->p, &v->cap, v->n, sizeof *v->p, 64))
        return PI2_ENOMEM;
    v->p[v->n++] = x;
    return 0;
}

static int zv_push(zvec *v, size_t x)
{
    if (pi2_grow(&v->p, &v->cap, v->n, sizeof *v->p, 64))
        return PI2_ENOMEM;
    v->p[v->n++] = x;
    return 0;
}

/* `count` copies of x: the offsets of bytes that all came from one byte. */
static int zv_fill(zvec *v, size_t x, size_t count)
{
    for (size_t i = 0; i < count; i++)
        if (zv_push(v, x))
            return PI2_ENOMEM;
    return 0;
}

/* Rust char::is_whitespace. */
static bool is_ws(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

static bool merge_find(const pi2_tok *t, int32_t a, int32_t b, uint32_t *rank, int32_t *nid)
{
    if (!t->mkey)
        return false;
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t h = (size_t)tok_mix64(key) & t->mmask;
    for (;;) {
        uint64_t k = t->mkey[h];
        if (k == UINT64_MAX)
            return false;
        if (k == key) {
            *rank = t->mrank[h];
            *nid = t->mnew[h];
            return true;
        }
        h = (h + 1) & t->mmask;
    }
}

typedef struct {
    int32_t id;
    int32_t prev, next;
    bool dead;
} bsym;

typedef struct {
    uint32_t rank;
    uint32_t pos;
    int32_t nid;
} bmerge;

typedef struct {
    const pi2_tok *t;
    pi2_err *err;
    ivec out;
    sbuf nb[2]; /* normalizer ping-pong */
    zvec no[2];
    sbuf lt[TOK_MAX_OPS]; /* per pre-tokenizer level */
    zvec lo[TOK_MAX_OPS];
    bsym *sym;
    size_t nsym, csym;
    bmerge *heap;
    size_t nheap, cheap;
} enc_ctx;

static void enc_free(enc_ctx *c)
{
    for (int i = 0; i < 2; i++) {
        tok_sb_free(&c->nb[i]);
        free(c->no[i].p);
    }
    for (int i = 0; i < TOK_MAX_OPS; i++) {
        tok_sb_free(&c->lt[i]);
        free(c->lo[i].p);
    }
    free(c->sym);
    free(c->heap);
}

static int enc_oom(enc_ctx *c) { return pi2_err_set(c->err, PI2_ENOMEM, "%s: out of memory while encoding", c->t->name); }

static int sym_push(enc_ctx *c, int32_t id)
{
    if (pi2_grow(&c->sym, &c->csym, c->nsym, sizeof *c->sym, 256))
        return enc_oom(c);
    if (c->nsym >= INT32_MAX)
        return pi2_err_set(c->err, PI2_ERANGE, "%s: word too long to encode", c->t->name);
    bsym *s = &c->sym[c->nsym];
    s->id = id;
    s->prev = (int32_t)c->nsym - 1;
    s->next = -1;
    s->dead = false;
    if (c->nsym)
        c->sym[c->nsym - 1].next = (int32_t)c->nsym;
    c->nsym++;
    return 0;
}

static inline bool bm_less(const bmerge *a, const bmerge *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static int heap_push(enc_ctx *c, uint32_t rank, uint32_t pos, int32_t nid)
{
    if (pi2_grow(&c->heap, &c->cheap, c->nheap, sizeof *c->heap, 256))
        return enc_oom(c);
    bmerge m = {rank, pos, nid};
    size_t i = c->nheap++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!bm_less(&m, &c->heap[parent]))
            break;
        c->heap[i] = c->heap[parent];
        i = parent;
    }
    c->heap[i] = m;
    return 0;
}

static bmerge heap_pop(enc_ctx *c)
{
    bmerge top = c->heap[0];
    bmerge last = c->heap[--c->nheap];
    size_t i = 0, n = c->nheap;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const bmerge *best = &last;
        if (l < n && bm_less(&c->heap[l], best)) {
            m = l;
            best = &c->heap[l];
        }
        if (r < n && bm_less(&c->heap[r], best))
            m = r;
        if (m == i)
            break;
        c->heap[i] = c->heap[m];
        i = m;
    }
    if (n)
        c->heap[i] = last;
    return top;
}

/* HF BPE::merge_word's first pass: a symbol for each character in the model
 * vocab, else its byte tokens (byte_fallback), else unk (a run of unknown
 * characters is one unk with fuse_unk), else nothing, as HF drops it. */
static int bpe_symbols(enc_ctx *c, const char *w, size_t n)
{
    const pi2_tok *t = c->t;
    int rc;
    bool has_unk = false;
    c->nsym = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t cl = tok_u8_next((const uint8_t *)w + i, n - i, &cp);
        int32_t id = model_find(t, w + i, cl);
        if (id >= 0) {
            if (has_unk && (rc = sym_push(c, t->unk_id)))
                return rc;
            has_unk = false;
            if ((rc = sym_push(c, id)))
                return rc;
            i += cl;
            continue;
        }
        bool all = t->byte_fallback;
        for (size_t k = 0; all && k < cl; k++)
            all = t->byte_id[(uint8_t)w[i + k]] >= 0;
        if (all) {
            /* as HF: a pending unk is not flushed here */
            for (size_t k = 0; k < cl; k++)
                if ((rc = sym_push(c, t->byte_id[(uint8_t)w[i + k]])))
                    return rc;
        } else if (t->unk_token) {
            if (t->unk_id < 0)
                return pi2_err_set(c->err, PI2_ENOTFOUND, "%s: unk_token \"%s\" is not in the vocab", t->name,
                                   SHOWZ(t->unk_token));
            if (has_unk && !t->fuse_unk && (rc = sym_push(c, t->unk_id)))
                return rc;
            has_unk = true;
        }
        i += cl;
    }
    return has_unk ? sym_push(c, t->unk_id) : 0;
}

/* Queue the merge of symbol pos (piece `left`) with its right neighbour
 * (piece `right`), if the model has one. */
static int heap_candidate(enc_ctx *c, size_t pos, int32_t left, int32_t right)
{
    uint32_t rank;
    int32_t nid;
    return merge_find(c->t, left, right, &rank, &nid) ? heap_push(c, rank, (uint32_t)pos, nid) : 0;
}

/* HF Word::merge_all: apply the best-ranked merge (leftmost on ties) until
 * none applies; merged symbols are marked dead. */
static int bpe_merge_all(enc_ctx *c)
{
    int rc;
    c->nheap = 0;
    for (size_t k = 0; k + 1 < c->nsym; k++)
        if ((rc = heap_candidate(c, k, c->sym[k].id, c->sym[k + 1].id)))
            return rc;
    while (c->nheap) {
        bmerge top = heap_pop(c);
        bsym *s = c->sym, *cur = &s[top.pos];
        uint32_t rank;
        int32_t nid;
        if (cur->dead || cur->next < 0)
            continue;
        int32_t nx = cur->next;
        if (!merge_find(c->t, cur->id, s[nx].id, &rank, &nid) || nid != top.nid)
            continue; /* stale entry */
        cur->id = top.nid;
        cur->next = s[nx].next;
        s[nx].dead = true;
        if (cur->next >= 0)
            s[cur->next].prev = (int32_t)top.pos;
        if (cur->prev >= 0 && (rc = heap_candidate(c, (size_t)cur->prev, s[cur->prev].id, cur->id)))
            return rc;
        if (cur->next >= 0 && (rc = heap_candidate(c, top.pos, cur->id, s[cur->next].id)))
            return rc;
    }
    return 0;
}

/* HF BPE::merge_word + Word::merge_all on one pre-tokenized word. */
static int bpe_word(enc_ctx *c, const char *w, size_t n)
{
    const pi2_tok *t = c->t;
    int rc;
    if (n == 0)
        return 0;
    if (t->ignore_merges) {
        int32_t id = model_find(t, w, n);
        if (id >= 0)
            return iv_push(&c->out, id) ? enc_oom(c) : 0;
    }
    if ((rc = bpe_symbols(c, w, n)) || (rc = bpe_merge_all(c)))
        return rc;
    for (size_t k = 0; k < c->nsym; k++)
        if (!c->sym[k].dead && iv_push(&c->out, c->sym[k].id))
            return enc_oom(c);
    return 0;
}

/* Pre-tokenizer level `level` on one piece (orig: original offset of each
 * byte, for Metaspace's "first" scheme). */
static int run_pretok(enc_ctx *c, int level, const char *s, size_t n, const size_t *orig)
{
    const pi2_tok *t = c->t;
    if (n == 0)
        return 0;
    if (level == t->n_pre)
        return bpe_word(c, s, n);
    const tok_op *op = &t->pre[level];
    sbuf *b = &c->lt[level];
    zvec *z = &c->lo[level];
    b->n = z->n = 0;
    /* replace ' ' first, then decide on the prefix from the result */
    bool starts = s[0] == ' ' || (n >= op->alen && !memcmp(s, op->a, op->alen));
    bool prepend = !starts && (op->scheme == SCHEME_ALWAYS || (op->scheme == SCHEME_FIRST && orig[0] == 0));
    if (prepend && (tok_sb_put(b, op->a, op->alen) || zv_fill(z, orig[0], op->alen)))
        return enc_oom(c);
    for (size_t i = 0; i < n; i++) {
        const char *src = s[i] == ' ' ? op->a : s + i;
        size_t sl = s[i] == ' ' ? op->alen : 1;
        if (tok_sb_put(b, src, sl) || zv_fill(z, orig[i], sl))
            return enc_oom(c);
    }
    if (!op->split)
        return run_pretok(c, level + 1, b->p, b->n, z->p);
    /* split, each replacement character starting a new piece (HF
     * SplitDelimiterBehavior::MergedWithNext) */
    size_t st = 0;
    int rc;
    for (size_t i = 0; i + op->alen <= b->n;) {
        if (!memcmp(b->p + i, op->a, op->alen)) {
            if (i > st && (rc = run_pretok(c, level + 1, b->p + st, i - st, z->p + st)))
                return rc;
            st = i;
            i += op->alen;
        } else {
            i++;
        }
    }
    return run_pretok(c, level + 1, b->p + st, b->n - st, z->p + st);
}

/* Leftmost-longest added-token match in s[from..n). */
static bool find_added(const pi2_tok *t, const match_set *ms, const char *s, size_t n, size_t from, size_t *ms_,
                       size_t *me, const added_tok **which)
{
    if (ms->nnodes <= 1)
        return false;
    for (size_t i = from; i < n; i++) {
        uint8_t b0 = (uint8_t)s[i];
        if (!(ms->first[b0 >> 3] & (1u << (b0 & 7))))
            continue;
        uint32_t node = 0;
        int32_t best = -1;
        size_t best_end = 0;
        for (size_t j = i; j < n; j++) {
            node = tok_trie_child(ms, node, (uint8_t)s[j]);
            if (!node)
                break;
            if (ms->term[node] >= 0) {
                best = ms->term[node];
                best_end = j + 1;
            }
        }
        if (best >= 0) {
            *ms_ = i;
            *me = best_end;
            *which = &t->added[best];
            return true;
        }
    }
    return false;
}

/* Start of the whitespace run ending at s+end, not before `floor`. Scans
 * backwards so many lstrip tokens in a long text stay linear. */
static size_t ws_run_start(const char *s, size_t floor, size_t end)
{
    size_t i = end;
    while (i > floor) {
        size_t st = i - 1;
        while (st > floor && i - st < 4 && ((uint8_t)s[st] & 0xC0) == 0x80)
            st--;
        uint32_t cp;
        if (tok_u8_next((const uint8_t *)s + st, i - st, &cp) != i - st || cp == UINT32_MAX || !is_ws(cp))
            break;
        i = st;
    }
    return i;
}

static size_t ws_run_len(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t cl = tok_u8_next((const uint8_t *)s + i, n - i, &cp);
        if (cp == UINT32_MAX || !is_ws(cp))
            break;
        i += cl;
    }
    return i;
}

typedef int (*gap_fn)(enc_ctx *c, const char *s, size_t n, const size_t *orig, size_t orig0);

/* Split s on the added tokens of `ms` (HF AddedVocabulary::find_matches),
 * pushing their ids and handing the text between them to `gap`. */
static int split_added(enc_ctx *c, const match_set *ms, const char *s, size_t n, const size_t *orig, size_t orig0,
                       gap_fn gap)
{
    size_t pos = 0, done = 0, a, e;
    const added_tok *tok;
    int rc;
    while (find_added(c->t, ms, s, n, pos, &a, &e, &tok)) {
        if (tok->lstrip)
            a = ws_run_start(s, done, a);
        if (tok->rstrip)
            e += ws_run_len(s + e, n - e);
        if (a > done && (rc = gap(c, s + done, a - done, orig ? orig + done : NULL, orig0 + done)))
            return rc;
        if (iv_push(&c->out, tok->id))
            return enc_oom(c);
        done = pos = e;
    }
    if (done < n)
        return gap(c, s + done, n - done, orig ? orig + done : NULL, orig0 + done);
    return 0;
}

static int gap_pretok(enc_ctx *c, const char *s, size_t n, const size_t *orig, size_t orig0)
{
    (void)orig0;
    return run_pretok(c, 0, s, n, orig);
}

/* One normalizer step from (sb, sz) into (db, dz), each output byte keeping
 * the offset of the byte it came from. */
static int norm_step(const tok_op *op, const sbuf *sb, const zvec *sz, sbuf *db, zvec *dz)
{
    db->n = dz->n = 0;
    if (op->kind == OP_PREPEND) {
        if (tok_sb_put(db, op->a, op->alen) || tok_sb_put(db, sb->p, sb->n) || zv_fill(dz, sz->p[0], op->alen))
            return PI2_ENOMEM;
        for (size_t i = 0; i < sb->n; i++)
            if (zv_push(dz, sz->p[i]))
                return PI2_ENOMEM;
        return 0;
    }
    for (size_t i = 0; i < sb->n;) {
        if (sb->n - i >= op->alen && !memcmp(sb->p + i, op->a, op->alen)) {
            if (tok_sb_put(db, op->b, op->blen) || zv_fill(dz, sz->p[i], op->blen))
                return PI2_ENOMEM;
            i += op->alen;
        } else {
            if (tok_sb_put(db, sb->p + i, 1) || zv_push(dz, sz->p[i]))
                return PI2_ENOMEM;
            i++;
        }
    }
    return 0;
}

int tok_normalize(const pi2_tok *t, sbuf nb[2], zvec no[2], const char *s, size_t n, size_t orig0)
{
    int cur = 0;
    nb[0].n = no[0].n = 0;
    if (tok_sb_put(&nb[0], s, n))
        return PI2_ENOMEM;
    for (size_t i = 0; i < n; i++)
        if (zv_push(&no[0], orig0 + i))
            return PI2_ENOMEM;
    for (int k = 0; k < t->n_norm; k++) {
        const tok_op *op = &t->norm[k];
        if (op->kind == OP_PREPEND && nb[cur].n == 0)
            continue; /* HF prepends to non-empty text only */
        if (norm_step(op, &nb[cur], &no[cur], &nb[!cur], &no[!cur]))
            return PI2_ENOMEM;
        cur = !cur;
    }
    return cur;
}

/* Normalize one raw piece (starting at original offset orig0), then split it
 * on the normalized added tokens and pre-tokenize the rest. */
static int gap_normalize(enc_ctx *c, const char *s, size_t n, const size_t *orig_unused, size_t orig0)
{
    (void)orig_unused;
    int cur = tok_normalize(c->t, c->nb, c->no, s, n, orig0);
    if (cur < 0)
        return enc_oom(c);
    const sbuf *b = &c->nb[cur];
    if (b->n == 0)
        return 0;
    return split_added(c, &c->t->norm_set, b->p, b->n, c->no[cur].p, 0, gap_pretok);
}

int pi2_tok_encode(const pi2_tok *t, const char *text, size_t len, int32_t **ids, size_t *n, pi2_err *err)
{
    *ids = NULL;
    *n = 0;
    if (!t || (!text && len))
        return pi2_err_set(err, PI2_EINVAL, "tokenizer: encode called with no tokenizer or text");
    enc_ctx c = {.t = t, .err = err};
    int rc = 0;
    if (len)
        rc = split_added(&c, &t->raw_set, text, len, NULL, 0, gap_normalize);
    if (!rc && !c.out.p && !(c.out.p = malloc(sizeof *c.out.p))) /* never NULL on success */
        rc = enc_oom(&c);
    enc_free(&c);
    if (rc) {
        free(c.out.p);
        return rc;
    }
    *ids = c.out.p;
    *n = c.out.n;
    return 0;
}
