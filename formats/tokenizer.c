/* Tokenizer: Hugging Face tokenizer.json (BPE) loader, encoder, decoders.
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
 * - Vocab (string -> id) and merges ((left, right) -> rank, new id) are open
 *   addressing hash tables built once at load.
 * - Decoding runs HF's decoder chain on a vector of token strings; the
 *   streaming decoder runs the same chain as a push-driven state machine (a
 *   Fuse turns the token stream into a character stream for the stages after
 *   it) and the tests check that both agree.
 */
#include "formats/tokenizer.h"
#include "formats/jsonutil.h"

#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Caps for hostile files. The largest real vocabularies are ~256K tokens
 * with ~300K merges in files of tens of MB. */
#define TOK_MAX_FILE ((size_t)512 << 20)
#define TOK_MAX_VOCAB (1u << 22)
#define TOK_MAX_MERGES (1u << 23)
#define TOK_MAX_ADDED (1u << 20)
#define TOK_MAX_PIECE 16384u
#define TOK_MAX_OPS 64
#define TOK_MAX_DEPTH 8
#define TOK_MAX_STRIP 4096

static const char REPL_CHAR[] = "\xEF\xBF\xBD"; /* U+FFFD */

/* ------------------------------------------------------------------------ */
/* growable buffers                                                          */

typedef struct {
    char *p;
    size_t n, cap;
} sbuf;

/* Reserve room for `extra` more bytes plus a NUL. */
static int sb_grow(sbuf *b, size_t extra)
{
    size_t need;
    if (!pi2_add_size(b->n, extra, &need) || !pi2_add_size(need, 1, &need))
        return PI2_ENOMEM;
    if (need <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    char *p = realloc(b->p, cap);
    if (!p)
        return PI2_ENOMEM;
    b->p = p;
    b->cap = cap;
    return 0;
}

static int sb_put(sbuf *b, const void *d, size_t n)
{
    if (sb_grow(b, n))
        return PI2_ENOMEM;
    if (n)
        memcpy(b->p + b->n, d, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

static int sb_puts(sbuf *b, const char *s) { return sb_put(b, s, strlen(s)); }

static void sb_free(sbuf *b)
{
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

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

typedef struct {
    size_t *p;
    size_t n, cap;
} zvec;

static int zv_push(zvec *v, size_t x)
{
    if (pi2_grow(&v->p, &v->cap, v->n, sizeof *v->p, 64))
        return PI2_ENOMEM;
    v->p[v->n++] = x;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* UTF-8                                                                     */

/* Length of the character at s (1..4). Invalid or truncated sequences count
 * as one byte and set *cp to UINT32_MAX. Strict like Rust's from_utf8: no
 * overlongs, no surrogates, nothing above U+10FFFF. */
static size_t u8_next(const uint8_t *s, size_t n, uint32_t *cp)
{
    uint8_t b0 = s[0];
    *cp = UINT32_MAX;
    if (b0 < 0x80) {
        *cp = b0;
        return 1;
    }
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF;
    uint32_t c;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        need = 2;
        c = b0 & 0x1F;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        need = 3;
        c = b0 & 0x0F;
        if (b0 == 0xE0)
            lo = 0xA0;
        if (b0 == 0xED)
            hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        need = 4;
        c = b0 & 0x07;
        if (b0 == 0xF0)
            lo = 0x90;
        if (b0 == 0xF4)
            hi = 0x8F;
    } else {
        return 1;
    }
    if (n < need || s[1] < lo || s[1] > hi)
        return 1;
    c = (c << 6) | (s[1] & 0x3F);
    for (size_t i = 2; i < need; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 1;
        c = (c << 6) | (s[i] & 0x3F);
    }
    *cp = c;
    return need;
}

static bool utf8_valid(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        i += u8_next((const uint8_t *)s + i, n - i, &cp);
        if (cp == UINT32_MAX)
            return false;
    }
    return true;
}

/* Exactly one character? */
static bool utf8_one_char(const char *s, size_t n)
{
    uint32_t cp;
    return n > 0 && u8_next((const uint8_t *)s, n, &cp) == n && cp != UINT32_MAX;
}

/* Rust char::is_whitespace. */
static bool is_ws(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

/* ------------------------------------------------------------------------ */
/* the tokenizer object                                                      */

enum { SCHEME_ALWAYS, SCHEME_FIRST, SCHEME_NEVER };
enum { OP_PREPEND, OP_REPLACE, OP_METASPACE, OP_BYTEFALLBACK, OP_FUSE, OP_STRIP };

/* One normalizer, pre-tokenizer or decoder step (Sequences are flattened:
 * applying a Sequence is applying its members in order). */
typedef struct {
    int kind;
    char *a; /* Prepend text, Replace pattern, Metaspace/Strip character */
    size_t alen;
    char *b; /* Replace content */
    size_t blen;
    int scheme;  /* Metaspace */
    bool split;  /* Metaspace pre-tokenizer */
    size_t start, stop; /* Strip */
} tok_op;

typedef struct {
    char *content;
    size_t clen;
    char *pat; /* what is matched: content, or its normalized form */
    size_t plen;
    int32_t id;
    bool special, normalized, lstrip, rstrip;
} added_tok;

/* Added tokens in a byte trie (edges in a hash table): walking it from
 * each position finds the leftmost-longest match, as HF's Aho-Corasick
 * (MatchKind::LeftmostLongest) does, in time bounded by the match length. */
typedef struct {
    uint64_t *ekey; /* (node << 8 | byte) + 1; 0 = empty */
    uint32_t *eval; /* child node */
    size_t emask;
    int32_t *term; /* per node: index into added[], or -1 */
    size_t nnodes;
    uint8_t first[32]; /* bitmap of first bytes */
} match_set;

struct pi2_tok {
    char *name;
    size_t n_model, n_total; /* model vocab; plus added tokens outside it */
    char *pdata;             /* all pieces, NUL-terminated */
    size_t *poff;
    uint32_t *plen;
    int32_t *htab; /* piece -> id, -1 empty */
    size_t hmask;
    uint64_t *mkey; /* (left << 32 | right), UINT64_MAX empty */
    uint32_t *mrank;
    int32_t *mnew;
    size_t mmask, n_merges;
    int32_t byte_id[256];
    char *unk_token; /* NULL when the model has none */
    int32_t unk_id;  /* -1 when unk_token is not in the vocab */
    bool byte_fallback, fuse_unk, ignore_merges;
    tok_op *norm, *pre, *dec;
    int n_norm, n_pre, n_dec;
    bool has_decoder;
    added_tok *added;
    size_t n_added;
    match_set raw_set, norm_set;
    uint8_t *special; /* per id */
    int32_t bos, eos;
};

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 31);
}

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static inline const char *piece_at(const pi2_tok *t, size_t id) { return t->pdata + t->poff[id]; }

/* Any id (model or added) whose piece is exactly s[0..n), or -1. */
static int32_t vocab_find(const pi2_tok *t, const char *s, size_t n)
{
    if (!t->htab)
        return -1;
    size_t h = (size_t)hash_bytes(s, n) & t->hmask;
    for (;;) {
        int32_t id = t->htab[h];
        if (id < 0)
            return -1;
        if (t->plen[id] == n && memcmp(piece_at(t, (size_t)id), s, n) == 0)
            return id;
        h = (h + 1) & t->hmask;
    }
}

/* Model-vocab id only (what BPE sees), or -1. */
static inline int32_t model_find(const pi2_tok *t, const char *s, size_t n)
{
    int32_t id = vocab_find(t, s, n);
    return id >= 0 && (size_t)id < t->n_model ? id : -1;
}

static void vocab_insert(pi2_tok *t, int32_t id)
{
    size_t h = (size_t)hash_bytes(piece_at(t, (size_t)id), t->plen[id]) & t->hmask;
    while (t->htab[h] >= 0)
        h = (h + 1) & t->hmask;
    t->htab[h] = id;
}

static bool merge_find(const pi2_tok *t, int32_t a, int32_t b, uint32_t *rank, int32_t *nid)
{
    if (!t->mkey)
        return false;
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t h = (size_t)mix64(key) & t->mmask;
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

/* Insert or overwrite (HF collects merges into a map: a repeated pair keeps
 * the later rank). */
static void merge_put(pi2_tok *t, int32_t a, int32_t b, uint32_t rank, int32_t nid)
{
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t h = (size_t)mix64(key) & t->mmask;
    while (t->mkey[h] != UINT64_MAX && t->mkey[h] != key)
        h = (h + 1) & t->mmask;
    t->mkey[h] = key;
    t->mrank[h] = rank;
    t->mnew[h] = nid;
}

static void free_ops(tok_op *ops, int n)
{
    for (int i = 0; i < n; i++) {
        free(ops[i].a);
        free(ops[i].b);
    }
    free(ops);
}

void pi2_tok_free(pi2_tok *t)
{
    if (!t)
        return;
    free(t->name);
    free(t->pdata);
    free(t->poff);
    free(t->plen);
    free(t->htab);
    free(t->mkey);
    free(t->mrank);
    free(t->mnew);
    free(t->unk_token);
    free_ops(t->norm, t->n_norm);
    free_ops(t->pre, t->n_pre);
    free_ops(t->dec, t->n_dec);
    for (size_t i = 0; i < t->n_added; i++) {
        free(t->added[i].content);
        free(t->added[i].pat);
    }
    free(t->added);
    match_set *sets[] = {&t->raw_set, &t->norm_set};
    for (int i = 0; i < 2; i++) {
        free(sets[i]->ekey);
        free(sets[i]->eval);
        free(sets[i]->term);
    }
    free(t->special);
    free(t);
}

/* ------------------------------------------------------------------------ */
/* loading                                                                   */

static char *memdup0(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        if (n)
            memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

static const char *jtype(const json_t *j) { return pi2_json_type_name(j); }

/* A file-provided string made fit for a one-line message: control bytes
 * and quotes escaped, cut (on a character boundary) after ~48 bytes. */
static const char *show(const char *s, size_t n, char *buf, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if ((i >= 48 || o + 8 >= cap) && (ch & 0xC0) != 0x80) {
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        if (ch < 0x20 || ch == 0x7F || ch == '"' || ch == '\\')
            o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", ch);
        else
            buf[o++] = (char)ch;
    }
    buf[o] = 0;
    return buf;
}
#define SHOW(s, n) show((s), (n), (char[160]){0}, 160)
#define SHOWZ(s) SHOW((s), strlen(s))

/* Optional boolean member: absent or null -> def. */
static int get_bool(const pi2_tok *t, json_t *obj, const char *key, bool def, bool *out, const char *where,
                    pi2_err *err)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v))
        return pi2_err_set(err, PI2_EFORMAT, "%s: %s \"%s\" must be a boolean, not %s", t->name, where, key,
                           jtype(v));
    *out = json_is_true(v);
    return 0;
}

/* Required string member (copied). */
static int get_str(const pi2_tok *t, json_t *obj, const char *key, char **out, size_t *len, const char *where,
                   pi2_err *err)
{
    json_t *v = json_object_get(obj, key);
    if (!v || !json_is_string(v))
        return pi2_err_set(err, PI2_EFORMAT, "%s: %s needs a string \"%s\"%s%s", t->name, where, key,
                           v ? ", not " : "", v ? jtype(v) : "");
    size_t n = json_string_length(v);
    if (n > TOK_MAX_PIECE)
        return pi2_err_set(err, PI2_ERANGE, "%s: %s \"%s\" is longer than %u bytes", t->name, where, key,
                           TOK_MAX_PIECE);
    *out = memdup0(json_string_value(v), n);
    if (!*out)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", t->name);
    *len = n;
    return 0;
}

static int get_char(const pi2_tok *t, json_t *obj, const char *key, char **out, size_t *len, const char *where,
                    pi2_err *err)
{
    int rc = get_str(t, obj, key, out, len, where, err);
    if (rc)
        return rc;
    if (!utf8_one_char(*out, *len)) {
        free(*out);
        *out = NULL;
        return pi2_err_set(err, PI2_EFORMAT, "%s: %s \"%s\" must be exactly one character", t->name, where, key);
    }
    return 0;
}

static int get_scheme(const pi2_tok *t, json_t *obj, int *scheme, const char *where, pi2_err *err)
{
    json_t *ps = json_object_get(obj, "prepend_scheme");
    json_t *aps = json_object_get(obj, "add_prefix_space");
    if (aps && !json_is_null(aps) && !json_is_boolean(aps))
        return pi2_err_set(err, PI2_EFORMAT, "%s: %s \"add_prefix_space\" must be a boolean", t->name, where);
    if (ps && !json_is_null(ps)) {
        const char *s = json_string_value(ps);
        if (!s)
            return pi2_err_set(err, PI2_EFORMAT, "%s: %s \"prepend_scheme\" must be a string", t->name, where);
        if (!strcmp(s, "always"))
            *scheme = SCHEME_ALWAYS;
        else if (!strcmp(s, "first"))
            *scheme = SCHEME_FIRST;
        else if (!strcmp(s, "never"))
            *scheme = SCHEME_NEVER;
        else
            return pi2_err_set(err, PI2_EFORMAT, "%s: %s has unknown prepend_scheme \"%s\"", t->name, where, SHOWZ(s));
        if (json_is_false(aps) && *scheme != SCHEME_NEVER)
            return pi2_err_set(err, PI2_EFORMAT, "%s: %s add_prefix_space does not match declared prepend_scheme",
                               t->name, where);
    } else {
        /* Files from before prepend_scheme: add_prefix_space alone decides. */
        *scheme = json_is_false(aps) ? SCHEME_NEVER : SCHEME_ALWAYS;
    }
    return 0;
}

static int get_count(const pi2_tok *t, json_t *obj, const char *key, size_t *out, const char *where, pi2_err *err)
{
    json_t *v = json_object_get(obj, key);
    if (!v || !json_is_integer(v))
        return pi2_err_set(err, PI2_EFORMAT, "%s: %s needs an integer \"%s\"", t->name, where, key);
    json_int_t x = json_integer_value(v);
    if (x < 0 || x > TOK_MAX_STRIP)
        return pi2_err_set(err, PI2_ERANGE, "%s: %s \"%s\" = %lld is out of range", t->name, where, key,
                           (long long)x);
    *out = (size_t)x;
    return 0;
}

/* Replace {"pattern": {"String": p}, "content": c} (Regex unsupported). */
static int get_replace(const pi2_tok *t, json_t *obj, tok_op *op, const char *where, pi2_err *err)
{
    json_t *pat = json_object_get(obj, "pattern");
    if (!json_is_object(pat))
        return pi2_err_set(err, PI2_EFORMAT, "%s: %s needs a \"pattern\" object", t->name, where);
    if (json_object_get(pat, "Regex"))
        return pi2_err_set(err, PI2_EUNSUPPORTED, "%s: %s with a Regex pattern is not supported", t->name, where);
    int rc = get_str(t, pat, "String", &op->a, &op->alen, where, err);
    if (rc)
        return rc;
    if (op->alen == 0)
        return pi2_err_set(err, PI2_EUNSUPPORTED, "%s: %s with an empty pattern is not supported", t->name, where);
    return get_str(t, obj, "content", &op->b, &op->blen, where, err);
}

enum { WHAT_NORM, WHAT_PRE, WHAT_DEC };

static int parse_ops(const pi2_tok *t, json_t *j, int what, tok_op **ops, int *n, int depth, pi2_err *err)
{
    static const char *const names[] = {"normalizer", "pre_tokenizer", "decoder"};
    static const char *const seqkey[] = {"normalizers", "pretokenizers", "decoders"};
    const char *where = names[what];
    if (json_is_null(j))
        return 0;
    if (!json_is_object(j))
        return pi2_err_set(err, PI2_EFORMAT, "%s: %s must be an object or null, not %s", t->name, where, jtype(j));
    if (depth > TOK_MAX_DEPTH)
        return pi2_err_set(err, PI2_ERANGE, "%s: %s Sequences nested deeper than %d", t->name, where,
                           TOK_MAX_DEPTH);
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type)
        return pi2_err_set(err, PI2_EFORMAT, "%s: %s has no \"type\" string", t->name, where);
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(j, seqkey[what]);
        if (!json_is_array(arr))
            return pi2_err_set(err, PI2_EFORMAT, "%s: %s Sequence needs a \"%s\" array", t->name, where,
                               seqkey[what]);
        for (size_t i = 0; i < json_array_size(arr); i++) {
            int rc = parse_ops(t, json_array_get(arr, i), what, ops, n, depth + 1, err);
            if (rc)
                return rc;
        }
        return 0;
    }
    if (*n >= TOK_MAX_OPS)
        return pi2_err_set(err, PI2_ERANGE, "%s: more than %d %s steps", t->name, TOK_MAX_OPS, where);
    tok_op *grown = realloc(*ops, (size_t)(*n + 1) * sizeof **ops);
    if (!grown)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", t->name);
    *ops = grown;
    tok_op *op = &grown[*n];
    memset(op, 0, sizeof *op);
    (*n)++; /* counted now so a half-parsed op is freed with the rest */
    char wbuf[128];
    snprintf(wbuf, sizeof wbuf, "%s %s", where, SHOW(type, strlen(type) > 24 ? 24 : strlen(type)));
    if (what == WHAT_NORM && !strcmp(type, "Prepend")) {
        op->kind = OP_PREPEND;
        return get_str(t, j, "prepend", &op->a, &op->alen, wbuf, err);
    }
    if (what != WHAT_PRE && !strcmp(type, "Replace")) {
        op->kind = OP_REPLACE;
        return get_replace(t, j, op, wbuf, err);
    }
    if (what != WHAT_NORM && !strcmp(type, "Metaspace")) {
        op->kind = OP_METASPACE;
        int rc = get_char(t, j, "replacement", &op->a, &op->alen, wbuf, err);
        if (!rc)
            rc = get_scheme(t, j, &op->scheme, wbuf, err);
        if (!rc)
            rc = get_bool(t, j, "split", true, &op->split, wbuf, err);
        return rc;
    }
    if (what == WHAT_DEC && !strcmp(type, "ByteFallback")) {
        op->kind = OP_BYTEFALLBACK;
        return 0;
    }
    if (what == WHAT_DEC && !strcmp(type, "Fuse")) {
        op->kind = OP_FUSE;
        return 0;
    }
    if (what == WHAT_DEC && !strcmp(type, "Strip")) {
        op->kind = OP_STRIP;
        int rc = get_char(t, j, "content", &op->a, &op->alen, wbuf, err);
        if (!rc)
            rc = get_count(t, j, "start", &op->start, wbuf, err);
        if (!rc)
            rc = get_count(t, j, "stop", &op->stop, wbuf, err);
        return rc;
    }
    return pi2_err_set(err, PI2_EUNSUPPORTED, "%s: %s type \"%s\" is not supported", t->name, where, SHOWZ(type));
}

/* Reserve piece storage for `cap` ids. */
static int pieces_alloc(pi2_tok *t, size_t cap, pi2_err *err)
{
    t->poff = pi2_calloc_array(cap, sizeof *t->poff);
    t->plen = pi2_calloc_array(cap, sizeof *t->plen);
    t->special = pi2_calloc_array(cap, 1);
    size_t hcap = 16;
    while (hcap < cap * 2)
        hcap *= 2;
    t->htab = pi2_malloc_array(hcap, sizeof *t->htab);
    if (!t->poff || !t->plen || !t->special || !t->htab)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory for %zu tokens", t->name, cap);
    memset(t->htab, 0xff, hcap * sizeof *t->htab);
    t->hmask = hcap - 1;
    return 0;
}

/* model.vocab: {"piece": id, ...} with ids exactly 0..n-1. */
static int load_vocab(pi2_tok *t, json_t *vocab, size_t cap, sbuf *arena, pi2_err *err)
{
    size_t n = t->n_model;
    int rc = pieces_alloc(t, cap, err);
    if (rc)
        return rc;
    uint8_t *seen = pi2_calloc_array(n, 1);
    if (!seen)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", t->name);
    void *it = json_object_iter(vocab);
    for (; it; it = json_object_iter_next(vocab, it)) {
        const char *key = json_object_iter_key(it);
        size_t klen = json_object_iter_key_len(it);
        json_t *v = json_object_iter_value(it);
        if (!json_is_integer(v)) {
            rc = pi2_err_set(err, PI2_EFORMAT, "%s: vocab entry \"%s\" has %s id, not an integer", t->name, SHOW(key, klen),
                             jtype(v));
            break;
        }
        json_int_t id = json_integer_value(v);
        if (id < 0 || (uint64_t)id >= n) {
            rc = pi2_err_set(err, PI2_ERANGE,
                             "%s: vocab id %lld of \"%s\" is out of range (ids must be 0..%zu, dense)", t->name,
                             (long long)id, SHOW(key, klen), n - 1);
            break;
        }
        if (seen[id]) {
            rc = pi2_err_set(err, PI2_EFORMAT, "%s: vocab id %lld is used twice (\"%s\" and \"%s\")", t->name,
                             (long long)id, SHOW(piece_at(t, (size_t)id), t->plen[id]), SHOW(key, klen));
            break;
        }
        if (klen > TOK_MAX_PIECE) {
            rc = pi2_err_set(err, PI2_ERANGE, "%s: vocab piece with id %lld is longer than %u bytes", t->name,
                             (long long)id, TOK_MAX_PIECE);
            break;
        }
        seen[id] = 1;
        t->poff[id] = arena->n;
        t->plen[id] = (uint32_t)klen;
        if (sb_put(arena, key, klen) || sb_put(arena, "", 1)) {
            rc = pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", t->name);
            break;
        }
        t->pdata = arena->p; /* piece_at() in the duplicate message reads it */
    }
    free(seen);
    return rc;
}

static int load_merges(pi2_tok *t, json_t *merges, pi2_err *err)
{
    size_t n = json_array_size(merges);
    if (n > TOK_MAX_MERGES)
        return pi2_err_set(err, PI2_ERANGE, "%s: %zu merges (more than %u)", t->name, n, TOK_MAX_MERGES);
    size_t cap = 16;
    while (cap < n * 2)
        cap *= 2;
    t->mkey = pi2_malloc_array(cap, sizeof *t->mkey);
    t->mrank = pi2_malloc_array(cap, sizeof *t->mrank);
    t->mnew = pi2_malloc_array(cap, sizeof *t->mnew);
    if (!t->mkey || !t->mrank || !t->mnew)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory for %zu merges", t->name, n);
    memset(t->mkey, 0xff, cap * sizeof *t->mkey);
    t->mmask = cap - 1;
    sbuf cat = {0};
    int rc = 0;
    bool legacy = n > 0 && json_is_string(json_array_get(merges, 0));
    uint32_t rank = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(merges, i);
        const char *a, *b;
        size_t al, bl;
        if (legacy) {
            /* "a b": exactly one space; "#version" lines are skipped */
            if (!json_is_string(m)) {
                rc = pi2_err_set(err, PI2_EFORMAT, "%s: merge #%zu is %s; merges mix strings and pairs", t->name, i,
                                 jtype(m));
                break;
            }
            const char *s = json_string_value(m);
            size_t sl = json_string_length(m);
            if (sl >= 8 && !memcmp(s, "#version", 8))
                continue;
            const char *sp = memchr(s, ' ', sl);
            if (!sp || memchr(sp + 1, ' ', sl - (size_t)(sp - s) - 1)) {
                rc = pi2_err_set(err, PI2_EFORMAT, "%s: merge #%zu \"%s\" is not two tokens separated by one space",
                                 t->name, i, SHOW(s, sl));
                break;
            }
            a = s;
            al = (size_t)(sp - s);
            b = sp + 1;
            bl = sl - al - 1;
        } else {
            if (!json_is_array(m) || json_array_size(m) != 2 || !json_is_string(json_array_get(m, 0)) ||
                !json_is_string(json_array_get(m, 1))) {
                rc = pi2_err_set(err, PI2_EFORMAT, "%s: merge #%zu is not a [\"left\", \"right\"] pair of strings",
                                 t->name, i);
                break;
            }
            a = json_string_value(json_array_get(m, 0));
            al = json_string_length(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            bl = json_string_length(json_array_get(m, 1));
        }
        int32_t ia = model_find(t, a, al), ib = model_find(t, b, bl);
        cat.n = 0;
        if (sb_put(&cat, a, al) || sb_put(&cat, b, bl)) {
            rc = pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", t->name);
            break;
        }
        int32_t in = model_find(t, cat.p, cat.n);
        if (ia < 0 || ib < 0 || in < 0) {
            const char *bad = ia < 0 ? a : ib < 0 ? b : cat.p;
            size_t bad_len = ia < 0 ? al : ib < 0 ? bl : cat.n;
            rc = pi2_err_set(err, PI2_EFORMAT, "%s: merge #%zu uses token \"%s\" which is not in the vocab",
                             t->name, i, SHOW(bad, bad_len));
            break;
        }
        merge_put(t, ia, ib, rank++, in);
    }
    t->n_merges = rank;
    sb_free(&cat);
    return rc;
}

/* Apply the normalizer ops to a whole string (used for added-token
 * patterns); offsets are not needed here. */
static int normalize_plain(const pi2_tok *t, const char *s, size_t n, sbuf *out)
{
    sbuf cur = {0}, nxt = {0};
    int rc = sb_put(&cur, s, n);
    for (int k = 0; !rc && k < t->n_norm; k++) {
        const tok_op *op = &t->norm[k];
        nxt.n = 0;
        if (op->kind == OP_PREPEND) {
            if (cur.n == 0)
                continue;
            rc = sb_put(&nxt, op->a, op->alen);
            if (!rc)
                rc = sb_put(&nxt, cur.p, cur.n);
        } else {
            size_t i = 0;
            while (!rc && i < cur.n) {
                if (cur.n - i >= op->alen && !memcmp(cur.p + i, op->a, op->alen)) {
                    rc = sb_put(&nxt, op->b, op->blen);
                    i += op->alen;
                } else {
                    rc = sb_put(&nxt, cur.p + i, 1);
                    i++;
                }
            }
            if (!rc && !nxt.p)
                rc = sb_put(&nxt, "", 0);
        }
        sbuf tmp = cur;
        cur = nxt;
        nxt = tmp;
    }
    sb_free(&nxt);
    if (rc) {
        sb_free(&cur);
        return rc;
    }
    *out = cur;
    return 0;
}

static uint32_t trie_child(const match_set *ms, uint32_t node, uint8_t b)
{
    uint64_t key = ((uint64_t)node << 8 | b) + 1;
    size_t h = (size_t)mix64(key) & ms->emask;
    for (;;) {
        if (ms->ekey[h] == 0)
            return 0; /* the root is never a child */
        if (ms->ekey[h] == key)
            return ms->eval[h];
        h = (h + 1) & ms->emask;
    }
}

static int build_set(pi2_tok *t, match_set *ms, bool normalized, pi2_err *err)
{
    size_t total = 0;
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].normalized == normalized && t->added[i].plen > 0 &&
            !pi2_add_size(total, t->added[i].plen, &total))
            return pi2_err_set(err, PI2_ERANGE, "%s: added tokens too long", t->name);
    size_t cap = 16;
    while (cap < total * 2)
        cap *= 2;
    ms->ekey = pi2_calloc_array(cap, sizeof *ms->ekey);
    ms->eval = pi2_malloc_array(cap, sizeof *ms->eval);
    ms->term = pi2_malloc_array(total + 1, sizeof *ms->term);
    if (!ms->ekey || !ms->eval || !ms->term)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", t->name);
    ms->emask = cap - 1;
    ms->nnodes = 1;
    ms->term[0] = -1;
    for (size_t i = 0; i < t->n_added; i++) {
        const added_tok *a = &t->added[i];
        if (a->normalized != normalized || a->plen == 0)
            continue;
        uint8_t b0 = (uint8_t)a->pat[0];
        ms->first[b0 >> 3] |= (uint8_t)(1u << (b0 & 7));
        uint32_t node = 0;
        for (size_t k = 0; k < a->plen; k++) {
            uint8_t b = (uint8_t)a->pat[k];
            uint32_t child = trie_child(ms, node, b);
            if (!child) {
                uint64_t key = ((uint64_t)node << 8 | b) + 1;
                size_t h = (size_t)mix64(key) & ms->emask;
                while (ms->ekey[h])
                    h = (h + 1) & ms->emask;
                child = (uint32_t)ms->nnodes++;
                ms->ekey[h] = key;
                ms->eval[h] = child;
                ms->term[child] = -1;
            }
            node = child;
        }
        if (ms->term[node] < 0)
            ms->term[node] = (int32_t)i;
    }
    return 0;
}

/* seen[id]: an added token already took this id (duplicates). */
static int load_added_items(pi2_tok *t, json_t *arr, sbuf *arena, uint8_t *seen, pi2_err *err)
{
    size_t n = json_array_size(arr);
    for (size_t i = 0; i < n; i++) {
        json_t *o = json_array_get(arr, i);
        char where[48];
        snprintf(where, sizeof where, "added token #%zu", i);
        if (!json_is_object(o))
            return pi2_err_set(err, PI2_EFORMAT, "%s: %s is %s, not an object", t->name, where, jtype(o));
        json_t *jid = json_object_get(o, "id");
        if (!json_is_integer(jid))
            return pi2_err_set(err, PI2_EFORMAT, "%s: %s needs an integer \"id\"", t->name, where);
        json_int_t id = json_integer_value(jid);
        added_tok *a = &t->added[t->n_added];
        int rc = get_str(t, o, "content", &a->content, &a->clen, where, err);
        if (rc)
            return rc;
        bool single_word;
        rc = get_bool(t, o, "special", false, &a->special, where, err);
        if (!rc)
            rc = get_bool(t, o, "normalized", !a->special, &a->normalized, where, err);
        if (!rc)
            rc = get_bool(t, o, "lstrip", false, &a->lstrip, where, err);
        if (!rc)
            rc = get_bool(t, o, "rstrip", false, &a->rstrip, where, err);
        if (!rc)
            rc = get_bool(t, o, "single_word", false, &single_word, where, err);
        if (rc) {
            free(a->content);
            a->content = NULL;
            return rc;
        }
        t->n_added++; /* owned from here on */
        if (single_word)
            return pi2_err_set(err, PI2_EUNSUPPORTED, "%s: %s \"%s\" uses single_word, which is not supported",
                               t->name, where, SHOW(a->content, a->clen));
        if (a->clen == 0) { /* HF ignores empty added tokens */
            a->plen = 0;
            continue;
        }
        /* HF: a token already in the model vocab keeps its vocab id; a new one
         * gets the next id after the vocab and earlier added tokens. */
        int32_t have = vocab_find(t, a->content, a->clen);
        if (have >= 0 && seen[have])
            return pi2_err_set(err, PI2_EFORMAT, "%s: %s \"%s\" is listed twice", t->name, where,
                               SHOW(a->content, a->clen));
        int32_t expect = have >= 0 ? have : (int32_t)t->n_total;
        if (id != expect)
            return pi2_err_set(err, PI2_EFORMAT, "%s: %s \"%s\" has id %lld but %s %d", t->name, where,
                               SHOW(a->content, a->clen),
                               (long long)id, have >= 0 ? "the vocab gives it" : "the next free id is", expect);
        a->id = expect;
        seen[expect] = 1;
        if (have < 0) {
            size_t nid = t->n_total++;
            t->poff[nid] = arena->n;
            t->plen[nid] = (uint32_t)a->clen;
            if (sb_put(arena, a->content, a->clen) || sb_put(arena, "", 1))
                return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", t->name);
            t->pdata = arena->p;
            vocab_insert(t, (int32_t)nid);
        }
        if (a->special)
            t->special[a->id] = 1;
    }
    return 0;
}

static int load_added(pi2_tok *t, json_t *arr, sbuf *arena, pi2_err *err)
{
    size_t n = json_array_size(arr);
    t->added = pi2_calloc_array(n, sizeof *t->added);
    uint8_t *seen = pi2_calloc_array(t->n_total + n, 1);
    int rc = t->added && seen ? load_added_items(t, arr, arena, seen, err)
                              : pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", t->name);
    free(seen);
    return rc;
}

/* bos: the first SpecialToken before the Sequence in a TemplateProcessing
 * "single" template (also inside a processors Sequence). */
static int32_t template_bos(const pi2_tok *t, json_t *pp, int depth)
{
    if (!json_is_object(pp) || depth > TOK_MAX_DEPTH)
        return -1;
    const char *type = json_string_value(json_object_get(pp, "type"));
    if (!type)
        return -1;
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(pp, "processors");
        for (size_t i = 0; i < json_array_size(arr); i++) {
            int32_t r = template_bos(t, json_array_get(arr, i), depth + 1);
            if (r >= 0)
                return r;
        }
        return -1;
    }
    if (strcmp(type, "TemplateProcessing"))
        return -1;
    json_t *single = json_object_get(pp, "single");
    for (size_t i = 0; i < json_array_size(single); i++) {
        json_t *el = json_array_get(single, i);
        if (json_object_get(el, "Sequence"))
            return -1;
        json_t *st = json_object_get(el, "SpecialToken");
        const char *name = json_string_value(json_object_get(st, "id"));
        if (!name)
            continue;
        json_t *ids = json_object_get(json_object_get(json_object_get(pp, "special_tokens"), name), "ids");
        json_t *first = json_array_get(ids, 0);
        if (json_is_integer(first)) {
            json_int_t v = json_integer_value(first);
            if (v >= 0 && (uint64_t)v < t->n_total)
                return (int32_t)v;
        }
        return vocab_find(t, name, strlen(name));
    }
    return -1;
}

static bool looks_like_end(const char *s)
{
    if (!strncmp(s, "</", 2))
        return true;
    for (const char *p = s; *p; p++) {
        char c0 = (char)(p[0] | 0x20), c1 = p[1] ? (char)(p[1] | 0x20) : 0, c2 = c1 && p[2] ? (char)(p[2] | 0x20) : 0;
        if ((c0 == 'e' && c1 == 'n' && c2 == 'd') || (c0 == 'e' && c1 == 'o' && c2 == 's'))
            return true;
    }
    return false;
}

static int load_json(pi2_tok *t, json_t *root, pi2_err *err)
{
    sbuf arena = {0};
    int rc = 0;
    if (!json_is_object(root))
        return pi2_err_set(err, PI2_EFORMAT, "%s: top level is %s, not an object", t->name, jtype(root));
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model))
        return pi2_err_set(err, PI2_EFORMAT, "%s: no \"model\" object%s%s", t->name, model ? ", found " : "",
                           model ? jtype(model) : "");
    json_t *type = json_object_get(model, "type");
    if (type && !json_is_string(type))
        return pi2_err_set(err, PI2_EFORMAT, "%s: model \"type\" must be a string", t->name);
    if (type && strcmp(json_string_value(type), "BPE"))
        return pi2_err_set(err, PI2_EUNSUPPORTED, "%s: model type \"%s\" is not supported (only BPE)", t->name,
                           SHOW(json_string_value(type), json_string_length(type)));
    json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout) && !(json_is_number(dropout) && json_number_value(dropout) == 0.0))
        return pi2_err_set(err, PI2_EUNSUPPORTED, "%s: BPE dropout is not supported", t->name);
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        json_t *v = json_object_get(model, affixes[i]);
        if (v && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0))
            return pi2_err_set(err, PI2_EUNSUPPORTED, "%s: BPE %s is not supported", t->name, affixes[i]);
    }
    if ((rc = get_bool(t, model, "byte_fallback", false, &t->byte_fallback, "model", err)) ||
        (rc = get_bool(t, model, "fuse_unk", false, &t->fuse_unk, "model", err)) ||
        (rc = get_bool(t, model, "ignore_merges", false, &t->ignore_merges, "model", err)))
        return rc;
    json_t *unk = json_object_get(model, "unk_token");
    if (unk && !json_is_null(unk)) {
        size_t ul;
        if ((rc = get_str(t, model, "unk_token", &t->unk_token, &ul, "model", err)))
            return rc;
    }
    json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab))
        return pi2_err_set(err, PI2_EFORMAT, "%s: model has no \"vocab\" object%s%s", t->name, vocab ? ", found " : "",
                           vocab ? jtype(vocab) : "");
    size_t nv = json_object_size(vocab);
    if (nv > TOK_MAX_VOCAB)
        return pi2_err_set(err, PI2_ERANGE, "%s: vocab has %zu entries (more than %u)", t->name, nv, TOK_MAX_VOCAB);
    json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_null(added) && !json_is_array(added))
        return pi2_err_set(err, PI2_EFORMAT, "%s: \"added_tokens\" must be an array, not %s", t->name, jtype(added));
    size_t na = json_array_size(added);
    if (na > TOK_MAX_ADDED)
        return pi2_err_set(err, PI2_ERANGE, "%s: %zu added tokens (more than %u)", t->name, na, TOK_MAX_ADDED);
    t->n_model = t->n_total = nv;
    rc = load_vocab(t, vocab, nv + na, &arena, err);
    t->pdata = arena.p;
    if (rc)
        return rc;
    if (nv == 0)
        return pi2_err_set(err, PI2_EFORMAT, "%s: model vocab is empty", t->name);
    for (size_t id = 0; id < nv; id++)
        vocab_insert(t, (int32_t)id);
    json_t *merges = json_object_get(model, "merges");
    if (merges && !json_is_null(merges) && !json_is_array(merges))
        return pi2_err_set(err, PI2_EFORMAT, "%s: model \"merges\" must be an array, not %s", t->name, jtype(merges));
    if ((rc = load_merges(t, merges, err)))
        return rc;
    for (int b = 0; b < 256; b++) {
        char code[8];
        snprintf(code, sizeof code, "<0x%02X>", b);
        t->byte_id[b] = model_find(t, code, 6);
    }
    t->unk_id = t->unk_token ? model_find(t, t->unk_token, strlen(t->unk_token)) : -1;
    rc = added ? load_added(t, added, &arena, err) : 0;
    t->pdata = arena.p; /* the arena may have moved while growing, even on failure */
    if (rc)
        return rc;

    static const char *const keys[] = {"normalizer", "pre_tokenizer", "decoder"};
    tok_op **dst[] = {&t->norm, &t->pre, &t->dec};
    int *cnt[] = {&t->n_norm, &t->n_pre, &t->n_dec};
    for (int w = 0; w < 3; w++) {
        json_t *j = json_object_get(root, keys[w]);
        if (w == WHAT_DEC)
            t->has_decoder = j && !json_is_null(j);
        if (j && (rc = parse_ops(t, j, w, dst[w], cnt[w], 0, err)))
            return rc;
    }
    for (size_t i = 0; i < t->n_added; i++) {
        added_tok *a = &t->added[i];
        if (a->clen == 0)
            continue;
        if (a->normalized) {
            sbuf nb = {0};
            if (normalize_plain(t, a->content, a->clen, &nb))
                return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", t->name);
            a->pat = nb.p;
            a->plen = nb.n;
        } else {
            a->pat = memdup0(a->content, a->clen);
            a->plen = a->clen;
            if (!a->pat)
                return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", t->name);
        }
    }
    if ((rc = build_set(t, &t->raw_set, false, err)) || (rc = build_set(t, &t->norm_set, true, err)))
        return rc;

    t->bos = template_bos(t, json_object_get(root, "post_processor"), 0);
    if (t->bos < 0)
        t->bos = vocab_find(t, "<s>", 3);
    t->eos = vocab_find(t, "</s>", 4);
    if (t->eos < 0 && t->bos >= 0 && (size_t)t->bos + 1 < t->n_total && t->special[t->bos + 1] &&
        looks_like_end(piece_at(t, (size_t)t->bos + 1)))
        t->eos = t->bos + 1;
    return 0;
}

int pi2_tok_load_mem(pi2_tok **out, const char *json, size_t len, const char *name, pi2_err *err)
{
    *out = NULL;
    if (!name)
        name = "tokenizer.json";
    if (!json)
        return pi2_err_set(err, PI2_EINVAL, "%s: no JSON text", name);
    if (len > TOK_MAX_FILE)
        return pi2_err_set(err, PI2_ERANGE, "%s: %zu bytes is larger than the %zu byte limit", name, len,
                           TOK_MAX_FILE);
    pi2_tok *t = calloc(1, sizeof *t);
    if (!t)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", name);
    t->name = pi2_strdup(name);
    t->bos = t->eos = t->unk_id = -1;
    if (!t->name) {
        free(t);
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", name);
    }
    json_error_t jerr;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        for (char *q = jerr.text; *q; q++) /* keep the message on one line */
            if ((unsigned char)*q < 0x20)
                *q = ' ';
        int rc = pi2_err_set(err, PI2_EFORMAT, "%s: invalid JSON at line %d column %d: %s", name, jerr.line,
                             jerr.column, jerr.text);
        pi2_tok_free(t);
        return rc;
    }
    int rc = load_json(t, root, err);
    json_decref(root);
    if (rc) {
        pi2_tok_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

int pi2_tok_load(pi2_tok **out, const char *path, pi2_err *err)
{
    *out = NULL;
    if (!path)
        return pi2_err_set(err, PI2_EINVAL, "tokenizer: no path");
    char buf[4096];
    const char *file = path;
    if (pi2_is_dir(path)) {
        if (!pi2_path_join(buf, sizeof buf, path, "tokenizer.json"))
            return pi2_err_set(err, PI2_EINVAL, "%s: path too long", path);
        file = buf;
    }
    char *text;
    size_t len;
    int rc = pi2_read_file(file, TOK_MAX_FILE, &text, &len, err);
    if (rc)
        return rc;
    rc = pi2_tok_load_mem(out, text, len, file, err);
    free(text);
    return rc;
}

int pi2_tok_vocab_size(const pi2_tok *t) { return t ? (int)t->n_total : 0; }
int pi2_tok_bos(const pi2_tok *t) { return t ? t->bos : -1; }
int pi2_tok_eos(const pi2_tok *t) { return t ? t->eos : -1; }

const char *pi2_tok_piece(const pi2_tok *t, int id)
{
    if (!t || id < 0 || (size_t)id >= t->n_total)
        return NULL;
    return piece_at(t, (size_t)id);
}

int pi2_tok_find(const pi2_tok *t, const char *piece)
{
    if (!t || !piece)
        return -1;
    return vocab_find(t, piece, strlen(piece));
}

bool pi2_tok_is_special(const pi2_tok *t, int id)
{
    return t && id >= 0 && (size_t)id < t->n_total && t->special[id];
}

int pi2_tok_unk(const pi2_tok *t) { return t ? t->unk_id : -1; }

/* ------------------------------------------------------------------------ */
/* encoding                                                                  */

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
        sb_free(&c->nb[i]);
        free(c->no[i].p);
    }
    for (int i = 0; i < TOK_MAX_OPS; i++) {
        sb_free(&c->lt[i]);
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
    c->nsym = 0;
    bool has_unk = false;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t cl = u8_next((const uint8_t *)w + i, n - i, &cp);
        int32_t id = model_find(t, w + i, cl);
        if (id >= 0) {
            if (has_unk && (rc = sym_push(c, t->unk_id)))
                return rc;
            has_unk = false;
            if ((rc = sym_push(c, id)))
                return rc;
        } else {
            bool done = false;
            if (t->byte_fallback) {
                bool all = true;
                for (size_t k = 0; k < cl; k++)
                    all = all && t->byte_id[(uint8_t)w[i + k]] >= 0;
                if (all) {
                    /* as HF: a pending unk is not flushed here */
                    for (size_t k = 0; k < cl; k++)
                        if ((rc = sym_push(c, t->byte_id[(uint8_t)w[i + k]])))
                            return rc;
                    done = true;
                }
            }
            if (!done && t->unk_token) {
                if (t->unk_id < 0)
                    return pi2_err_set(c->err, PI2_ENOTFOUND, "%s: unk_token \"%s\" is not in the vocab", t->name,
                                       SHOWZ(t->unk_token));
                if (has_unk && !t->fuse_unk && (rc = sym_push(c, t->unk_id)))
                    return rc;
                has_unk = true;
            }
            /* no unk token: HF drops the character */
        }
        i += cl;
    }
    if (has_unk && (rc = sym_push(c, t->unk_id)))
        return rc;

    bsym *s = c->sym;
    c->nheap = 0;
    uint32_t rank;
    int32_t nid;
    for (size_t k = 0; k + 1 < c->nsym; k++)
        if (merge_find(t, s[k].id, s[k + 1].id, &rank, &nid) && (rc = heap_push(c, rank, (uint32_t)k, nid)))
            return rc;
    while (c->nheap) {
        bmerge top = heap_pop(c);
        s = c->sym;
        bsym *cur = &s[top.pos];
        if (cur->dead || cur->next < 0)
            continue;
        int32_t nx = cur->next;
        if (!merge_find(t, cur->id, s[nx].id, &rank, &nid) || nid != top.nid)
            continue; /* stale entry */
        cur->id = top.nid;
        cur->next = s[nx].next;
        s[nx].dead = true;
        if (cur->next >= 0)
            s[cur->next].prev = (int32_t)top.pos;
        if (cur->prev >= 0 && merge_find(t, s[cur->prev].id, cur->id, &rank, &nid) &&
            (rc = heap_push(c, rank, (uint32_t)cur->prev, nid)))
            return rc;
        cur = &c->sym[top.pos];
        if (cur->next >= 0 && merge_find(t, cur->id, c->sym[cur->next].id, &rank, &nid) &&
            (rc = heap_push(c, rank, top.pos, nid)))
            return rc;
    }
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
    if (prepend) {
        if (sb_put(b, op->a, op->alen))
            return enc_oom(c);
        for (size_t k = 0; k < op->alen; k++)
            if (zv_push(z, orig[0]))
                return enc_oom(c);
    }
    for (size_t i = 0; i < n; i++) {
        const char *src = s[i] == ' ' ? op->a : s + i;
        size_t sl = s[i] == ' ' ? op->alen : 1;
        if (sb_put(b, src, sl))
            return enc_oom(c);
        for (size_t k = 0; k < sl; k++)
            if (zv_push(z, orig[i]))
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
            node = trie_child(ms, node, (uint8_t)s[j]);
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
        if (u8_next((const uint8_t *)s + st, i - st, &cp) != i - st || cp == UINT32_MAX || !is_ws(cp))
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
        size_t cl = u8_next((const uint8_t *)s + i, n - i, &cp);
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

/* Normalize one raw piece (starting at original offset orig0), then split it
 * on the normalized added tokens and pre-tokenize the rest. */
static int gap_normalize(enc_ctx *c, const char *s, size_t n, const size_t *orig_unused, size_t orig0)
{
    (void)orig_unused;
    const pi2_tok *t = c->t;
    int cur = 0;
    sbuf *b = &c->nb[0];
    zvec *z = &c->no[0];
    b->n = z->n = 0;
    if (sb_put(b, s, n))
        return enc_oom(c);
    for (size_t i = 0; i < n; i++)
        if (zv_push(z, orig0 + i))
            return enc_oom(c);
    for (int k = 0; k < t->n_norm; k++) {
        const tok_op *op = &t->norm[k];
        sbuf *sb = &c->nb[cur], *db = &c->nb[!cur];
        zvec *sz = &c->no[cur], *dz = &c->no[!cur];
        if (op->kind == OP_PREPEND && sb->n == 0)
            continue;
        db->n = dz->n = 0;
        if (op->kind == OP_PREPEND) {
            if (sb_put(db, op->a, op->alen) || sb_put(db, sb->p, sb->n))
                return enc_oom(c);
            for (size_t i = 0; i < op->alen; i++)
                if (zv_push(dz, sz->p[0]))
                    return enc_oom(c);
            for (size_t i = 0; i < sb->n; i++)
                if (zv_push(dz, sz->p[i]))
                    return enc_oom(c);
        } else {
            size_t i = 0;
            while (i < sb->n) {
                if (sb->n - i >= op->alen && !memcmp(sb->p + i, op->a, op->alen)) {
                    if (sb_put(db, op->b, op->blen))
                        return enc_oom(c);
                    for (size_t q = 0; q < op->blen; q++)
                        if (zv_push(dz, sz->p[i]))
                            return enc_oom(c);
                    i += op->alen;
                } else {
                    if (sb_put(db, sb->p + i, 1) || zv_push(dz, sz->p[i]))
                        return enc_oom(c);
                    i++;
                }
            }
        }
        cur = !cur;
    }
    b = &c->nb[cur];
    z = &c->no[cur];
    if (b->n == 0)
        return 0;
    return split_added(c, &t->norm_set, b->p, b->n, z->p, 0, gap_pretok);
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

/* ------------------------------------------------------------------------ */
/* decoding                                                                  */

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

static int replace_into(sbuf *out, const char *s, size_t n, const tok_op *op)
{
    size_t i = 0, run = 0;
    while (i < n) {
        if (n - i >= op->alen && !memcmp(s + i, op->a, op->alen)) {
            if (sb_put(out, s + run, i - run) || sb_put(out, op->b, op->blen))
                return PI2_ENOMEM;
            i += op->alen;
            run = i;
        } else {
            i++;
        }
    }
    return sb_put(out, s + run, n - run);
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

static int metaspace_into(sbuf *out, const char *s, size_t n, const tok_op *op, bool first)
{
    size_t i = 0, run = 0;
    while (i < n) {
        if (n - i >= op->alen && !memcmp(s + i, op->a, op->alen)) {
            if (sb_put(out, s + run, i - run))
                return PI2_ENOMEM;
            if (!(first && op->scheme != SCHEME_NEVER) && sb_put(out, " ", 1))
                return PI2_ENOMEM;
            i += op->alen;
            run = i;
        } else {
            i++;
        }
    }
    return sb_put(out, s + run, n - run);
}

typedef struct {
    sbuf *v;
    size_t n, cap;
} tvec;

static void tv_free(tvec *v)
{
    for (size_t i = 0; i < v->n; i++)
        sb_free(&v->v[i]);
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
    return sb_put(b, s, n);
}

static int flush_bytes(tvec *dst, sbuf *run)
{
    int rc = 0;
    if (run->n == 0)
        return 0;
    if (utf8_valid(run->p, run->n))
        rc = tv_push(dst, run->p, run->n);
    else
        for (size_t i = 0; !rc && i < run->n; i++)
            rc = tv_push(dst, REPL_CHAR, 3);
    run->n = 0;
    return rc;
}

/* One decoder step over the whole token vector (HF decode_chain). */
static int dec_step(const tok_op *op, tvec *in, tvec *out)
{
    int rc = 0;
    switch (op->kind) {
    case OP_REPLACE:
        for (size_t i = 0; !rc && i < in->n; i++)
            if (!(rc = tv_push(out, "", 0)))
                rc = replace_into(&out->v[out->n - 1], in->v[i].p, in->v[i].n, op);
        break;
    case OP_METASPACE:
        for (size_t i = 0; !rc && i < in->n; i++)
            if (!(rc = tv_push(out, "", 0)))
                rc = metaspace_into(&out->v[out->n - 1], in->v[i].p, in->v[i].n, op, i == 0);
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
                rc = sb_put(&out->v[0], in->v[i].p, in->v[i].n);
        break;
    case OP_BYTEFALLBACK: {
        sbuf run = {0};
        for (size_t i = 0; !rc && i < in->n; i++) {
            uint8_t byte;
            if (byte_token(in->v[i].p, in->v[i].n, &byte)) {
                rc = sb_put(&run, &byte, 1);
            } else {
                rc = flush_bytes(out, &run);
                if (!rc)
                    rc = tv_push(out, in->v[i].p, in->v[i].n);
            }
        }
        if (!rc)
            rc = flush_bytes(out, &run);
        sb_free(&run);
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
            rc = sb_put(&res, " ", 1);
        if (!rc)
            rc = sb_put(&res, cur.v[i].p, cur.v[i].n);
    }
    if (!rc && !res.p)
        rc = sb_put(&res, "", 0);
    tv_free(&cur);
    tv_free(&nxt);
    if (rc) {
        sb_free(&res);
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
        sb_free(&s->st[k].hold);
        sb_free(&s->st[k].tmp);
    }
    free(s->st);
    sb_free(&s->out);
    free(s);
}

static int s_tok(pi2_tok_stream *s, int k, const char *p, size_t n);
static int s_chars(pi2_tok_stream *s, int k, const char *p, size_t n);

/* Emit a finished ByteFallback run of stage k to stage k+1. */
static int s_bytes(pi2_tok_stream *s, int k)
{
    st_state *st = &s->st[k];
    int rc = 0;
    if (st->hold.n == 0)
        return 0;
    if (utf8_valid(st->hold.p, st->hold.n)) {
        rc = s_tok(s, k + 1, st->hold.p, st->hold.n);
    } else {
        for (size_t i = 0; !rc && i < st->hold.n; i++)
            rc = s_tok(s, k + 1, REPL_CHAR, 3);
    }
    st->hold.n = 0;
    return rc;
}

/* A whole token arrives at stage k (before any Fuse). */
static int s_tok(pi2_tok_stream *s, int k, const char *p, size_t n)
{
    const pi2_tok *t = s->t;
    if (k == t->n_dec)
        return sb_put(&s->out, p, n);
    const tok_op *op = &t->dec[k];
    st_state *st = &s->st[k];
    int rc;
    switch (op->kind) {
    case OP_REPLACE:
        st->tmp.n = 0;
        if ((rc = replace_into(&st->tmp, p, n, op)))
            return rc;
        return s_tok(s, k + 1, st->tmp.p, st->tmp.n);
    case OP_METASPACE:
        st->tmp.n = 0;
        if ((rc = metaspace_into(&st->tmp, p, n, op, st->count++ == 0)))
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
            return sb_put(&st->hold, &byte, 1);
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

/* Characters of the single fused token arrive at stage k (after a Fuse);
 * chunks always end on a character boundary. */
static int s_chars(pi2_tok_stream *s, int k, const char *p, size_t n)
{
    const pi2_tok *t = s->t;
    if (n == 0)
        return 0;
    if (k == t->n_dec)
        return sb_put(&s->out, p, n);
    const tok_op *op = &t->dec[k];
    st_state *st = &s->st[k];
    int rc;
    switch (op->kind) {
    case OP_REPLACE: {
        /* hold back a tail that may still become a match */
        if ((rc = sb_put(&st->hold, p, n)))
            return rc;
        sbuf *h = &st->hold;
        st->tmp.n = 0;
        size_t i = 0, run = 0;
        while (i < h->n) {
            size_t left = h->n - i;
            if (left >= op->alen && !memcmp(h->p + i, op->a, op->alen)) {
                if (sb_put(&st->tmp, h->p + run, i - run) || sb_put(&st->tmp, op->b, op->blen))
                    return PI2_ENOMEM;
                i += op->alen;
                run = i;
            } else if (left < op->alen && !memcmp(h->p + i, op->a, left)) {
                break;
            } else {
                i++;
            }
        }
        if ((rc = sb_put(&st->tmp, h->p + run, i - run)))
            return rc;
        memmove(h->p, h->p + i, h->n - i);
        h->n -= i;
        return s_chars(s, k + 1, st->tmp.p, st->tmp.n);
    }
    case OP_METASPACE:
        st->tmp.n = 0;
        if ((rc = metaspace_into(&st->tmp, p, n, op, true)))
            return rc;
        return s_chars(s, k + 1, st->tmp.p, st->tmp.n);
    case OP_STRIP: {
        st->tmp.n = 0;
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            size_t cl = u8_next((const uint8_t *)p + i, n - i, &cp);
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
                rc = sb_put(&st->tmp, p + i, cl);
            } else if (is_c) {
                rc = sb_put(&st->hold, p + i, cl);
                if (!rc && ++st->count > op->stop) {
                    rc = sb_put(&st->tmp, op->a, op->alen);
                    memmove(st->hold.p, st->hold.p + op->alen, st->hold.n - op->alen);
                    st->hold.n -= op->alen;
                    st->count--;
                }
            } else {
                rc = sb_put(&st->tmp, st->hold.p ? st->hold.p : "", st->hold.n);
                st->hold.n = 0;
                st->count = 0;
                if (!rc)
                    rc = sb_put(&st->tmp, p + i, cl);
            }
            if (rc)
                return rc;
            i += cl;
        }
        return s_chars(s, k + 1, st->tmp.p, st->tmp.n);
    }
    case OP_BYTEFALLBACK:
        /* the fused token is one token: a byte token only if it is exactly
         * "<0xXX>", which is known once it is longer than 6 bytes */
        if (st->done)
            return s_chars(s, k + 1, p, n);
        if ((rc = sb_put(&st->hold, p, n)))
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
                rc = sb_put(&s->out, " ", 1);
            if (!rc)
                rc = sb_put(&s->out, p, n);
            s->any = true;
        } else {
            rc = s_tok(s, 0, p, n);
        }
    }
    if (rc)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory while decoding", t->name);
    *bytes = s->out.p ? s->out.p : "";
    *len = s->out.n;
    return 0;
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
    if (rc)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory while decoding", s->t->name);
    *bytes = s->out.p ? s->out.p : "";
    *len = s->out.n;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* synthetic tokenizer.json                                                  */

static const char *const WORDS[] = {
    "the", "be", "to", "of", "and", "a", "in", "that", "have", "i", "it", "for", "not", "on", "with", "he", "as",
    "you", "do", "at", "this", "but", "his", "by", "from", "they", "we", "say", "her", "she", "or", "an", "will",
    "my", "one", "all", "would", "there", "their", "what", "so", "up", "out", "if", "about", "who", "get", "which",
    "go", "me", "when", "make", "can", "like", "time", "no", "just", "him", "know", "take", "people", "into",
    "year", "your", "good", "some", "could", "them", "see", "other", "than", "then", "now", "look", "only", "come",
    "its", "over", "think", "also", "back", "after", "use", "two", "how", "our", "work", "first", "well", "way",
    "even", "new", "want", "because", "any", "these", "give", "day", "most", "us", "is", "was", "are", "were",
    "been", "has", "had", "did", "said", "went", "made", "very", "little", "big", "small", "happy", "sad", "play",
    "played", "friend", "friends", "mom", "dad", "girl", "boy", "dog", "cat", "bird", "tree", "house", "park",
    "ball", "toy", "car", "sun", "sky", "water", "fish", "food", "cake", "box", "book", "school", "home", "story",
    "once", "upon", "named", "lily", "tom", "ben", "sam", "sue", "anna", "max", "saw", "found", "wanted", "liked",
    "loved", "helped", "asked", "looked", "felt", "ran", "jumped", "smiled", "laughed", "cried", "never", "always",
    "again", "together", "many", "much", "more", "every", "each", "something", "nothing", "everyone", "where",
    "here", "why", "yes", "too", "down", "off", "under", "around", "inside", "outside", "red", "blue", "green",
    "yellow", "white", "black", "bright", "dark", "long", "short", "old", "young", "fast", "slow", "hot", "cold",
    "nice", "kind", "brave", "funny", "pretty", "strong", "tired", "hungry", "scared", "surprised", "excited",
    "careful", "special", "ground", "door", "window", "room", "bed", "garden", "flower", "flowers", "grass", "rain",
    "snow", "wind", "night", "morning", "today", "tomorrow", "soon", "later", "before", "while", "still", "should",
    "must", "may", "might", "let", "put", "keep", "find", "tell", "ask", "feel", "try", "leave", "call", "need",
    "help", "show", "hear", "run", "walk", "talk", "sit", "stand", "turn", "start", "stop", "open", "close", "eat",
    "drink", "sleep", "read", "write", "sing", "dance", "swim", "fly", "climb", "share", "learn", "world", "life",
    "hand", "head", "eyes", "face", "place", "thing", "things", "way", "part", "word", "words", "number", "man",
    "woman", "child", "children", "family", "water", "animal", "animals", "lesson", "idea", "game", "team", "king",
    "queen", "dragon", "magic", "forest", "river", "sea", "boat", "train", "hat", "shoe", "shirt", "dress", "apple",
    "cookie", "milk", "juice", "candy", "star", "moon", "light", "sound", "voice", "music", "song", "picture",
};

typedef struct {
    sbuf arena;
    zvec off;
    uint32_t *len;
    int32_t *htab;
    size_t hmask, n, cap;
} gen_vocab;

static int32_t gv_find(const gen_vocab *g, const char *s, size_t n)
{
    size_t h = (size_t)hash_bytes(s, n) & g->hmask;
    for (;;) {
        int32_t id = g->htab[h];
        if (id < 0)
            return -1;
        if (g->len[id] == n && !memcmp(g->arena.p + g->off.p[id], s, n))
            return id;
        h = (h + 1) & g->hmask;
    }
}

static int gv_add(gen_vocab *g, const char *s, size_t n)
{
    if (g->n >= g->cap)
        return PI2_ERANGE;
    size_t id = g->n;
    if (zv_push(&g->off, g->arena.n) || sb_put(&g->arena, s, n))
        return PI2_ENOMEM;
    g->len[id] = (uint32_t)n;
    size_t h = (size_t)hash_bytes(s, n) & g->hmask;
    while (g->htab[h] >= 0)
        h = (h + 1) & g->hmask;
    g->htab[h] = (int32_t)id;
    g->n++;
    return 0;
}

static int json_escape(sbuf *b, const char *s, size_t n)
{
    int rc = 0;
    for (size_t i = 0; !rc && i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\') {
            char e[2] = {'\\', (char)ch};
            rc = sb_put(b, e, 2);
        } else if (ch < 0x20) {
            char e[8];
            snprintf(e, sizeof e, "\\u%04x", ch);
            rc = sb_put(b, e, 6);
        } else {
            rc = sb_put(b, s + i, 1);
        }
    }
    return rc;
}

#define SP "\xE2\x96\x81" /* U+2581 "▁" */

int pi2_tok_write_synthetic(const char *path, int vocab_size, uint64_t seed, pi2_err *err)
{
    return pi2_tok_write_synthetic_added(path, vocab_size, 0, NULL, seed, err);
}

int pi2_tok_write_synthetic_added(const char *path, int vocab_size, int n_added, const char *const *added,
                                  uint64_t seed, pi2_err *err)
{
    if (n_added < 0 || n_added > 1024 || (n_added > 0 && !added))
        return pi2_err_set(err, PI2_EINVAL, "%s: %d added tokens (0..1024)", path, n_added);
    for (int i = 0; i < n_added; i++)
        if (!added[i] || !added[i][0] || strlen(added[i]) > 64)
            return pi2_err_set(err, PI2_EINVAL, "%s: added token %d is empty or longer than 64 bytes", path, i);
    if (!path)
        return pi2_err_set(err, PI2_EINVAL, "synthetic tokenizer: no path");
    if (vocab_size < 300 || (unsigned)vocab_size > TOK_MAX_VOCAB)
        return pi2_err_set(err, PI2_EINVAL, "%s: synthetic vocab size %d is out of range (300..%u)", path, vocab_size,
                           TOK_MAX_VOCAB);
    size_t V = (size_t)vocab_size;
    gen_vocab g = {0};
    int32_t *ma = pi2_malloc_array(V, sizeof *ma), *mb = pi2_malloc_array(V, sizeof *mb);
    size_t nm = 0;
    size_t hcap = 16;
    while (hcap < V * 2)
        hcap *= 2;
    g.len = pi2_malloc_array(V, sizeof *g.len);
    g.htab = pi2_malloc_array(hcap, sizeof *g.htab);
    g.hmask = hcap - 1;
    g.cap = V;
    sbuf js = {0};
    int rc = 0;
    if (!ma || !mb || !g.len || !g.htab) {
        rc = PI2_ENOMEM;
        goto done;
    }
    memset(g.htab, 0xff, hcap * sizeof *g.htab);

    /* specials, byte tokens, "▁" and printable ASCII (letters first, so a
     * small vocab still spells words) */
    static const char *const specials[] = {"<unk>", "<s>", "</s>"};
    for (int i = 0; !rc && i < 3; i++)
        rc = gv_add(&g, specials[i], strlen(specials[i]));
    for (int b = 0; !rc && b < 256; b++) {
        char code[8];
        snprintf(code, sizeof code, "<0x%02X>", b);
        rc = gv_add(&g, code, 6);
    }
    if (!rc)
        rc = gv_add(&g, SP, 3);
    char chars[96];
    size_t nc = 0;
    for (char ch = 'a'; ch <= 'z'; ch++)
        chars[nc++] = ch;
    for (char ch = 'A'; ch <= 'Z'; ch++)
        chars[nc++] = ch;
    for (char ch = '0'; ch <= '9'; ch++)
        chars[nc++] = ch;
    for (int ch = 0x21; ch < 0x7F; ch++)
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9')))
            chars[nc++] = (char)ch;
    for (size_t i = 0; !rc && i < nc && g.n < V; i++)
        rc = gv_add(&g, &chars[i], 1);
    size_t first_text = 259; /* "▁" */
    char buf[64];

    /* words: "▁w", "▁wo", ... one merge each, built left to right */
    for (size_t w = 0; !rc && w < sizeof WORDS / sizeof *WORDS && g.n < V; w++) {
        const char *word = WORDS[w];
        size_t wl = strlen(word);
        bool ok = true;
        for (size_t i = 0; i < wl; i++)
            ok = ok && gv_find(&g, word + i, 1) >= 0;
        if (!ok)
            continue;
        memcpy(buf, SP, 3);
        int32_t left = (int32_t)first_text;
        for (size_t i = 0; i < wl && g.n < V; i++) {
            buf[3 + i] = word[i];
            int32_t have = gv_find(&g, buf, 4 + i);
            if (have < 0) {
                if ((rc = gv_add(&g, buf, 4 + i)))
                    break;
                ma[nm] = left;
                mb[nm] = gv_find(&g, word + i, 1);
                nm++;
                have = (int32_t)g.n - 1;
            }
            left = have;
        }
    }

    /* filler merges: random (piece, piece) pairs, deterministic from seed;
     * "▁" only ever starts a piece, like SentencePiece vocabularies */
    pi2_rng rng;
    pi2_rng_seed(&rng, seed);
    size_t scan_a = first_text, scan_b = 0;
    while (!rc && g.n < V) {
        int32_t a = -1, b = -1;
        for (int attempt = 0; attempt < 64 && a < 0; attempt++) {
            int32_t x = (int32_t)(first_text + pi2_rng_u64(&rng) % (g.n - first_text));
            int32_t y;
            if (pi2_rng_u64(&rng) % 10 < 7)
                y = gv_find(&g, &chars[pi2_rng_u64(&rng) % 26], 1);
            else
                y = (int32_t)(first_text + 1 + pi2_rng_u64(&rng) % (g.n - first_text - 1));
            if (y < 0 || g.len[x] + g.len[y] > 16)
                continue;
            const char *ys = g.arena.p + g.off.p[y];
            if (g.len[y] >= 3 && !memcmp(ys, SP, 3))
                continue;
            memcpy(buf, g.arena.p + g.off.p[x], g.len[x]);
            memcpy(buf + g.len[x], ys, g.len[y]);
            if (gv_find(&g, buf, g.len[x] + g.len[y]) < 0) {
                a = x;
                b = y;
            }
        }
        /* fallback that always finds a pair: piece + lowercase letter */
        while (a < 0 && scan_a < g.n) {
            int32_t y = gv_find(&g, &chars[scan_b], 1);
            if (g.len[scan_a] + 1 <= 16 && y >= 0) {
                memcpy(buf, g.arena.p + g.off.p[scan_a], g.len[scan_a]);
                buf[g.len[scan_a]] = chars[scan_b];
                if (gv_find(&g, buf, g.len[scan_a] + 1) < 0) {
                    a = (int32_t)scan_a;
                    b = y;
                }
            }
            if (++scan_b == 26) {
                scan_b = 0;
                scan_a++;
            }
        }
        if (a < 0) {
            rc = PI2_ERANGE;
            break;
        }
        memcpy(buf, g.arena.p + g.off.p[a], g.len[a]);
        memcpy(buf + g.len[a], g.arena.p + g.off.p[b], g.len[b]);
        if ((rc = gv_add(&g, buf, g.len[a] + g.len[b])))
            break;
        ma[nm] = a;
        mb[nm] = b;
        nm++;
    }
    if (rc)
        goto done;

    rc = sb_puts(&js, "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n  \"added_tokens\": [\n");
    for (int i = 0; !rc && i < 3; i++) {
        char line[200];
        snprintf(line, sizeof line,
                 "    {\"id\": %d, \"content\": \"%s\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
                 "\"normalized\": false, \"special\": true}%s\n",
                 i, specials[i], i < 2 || n_added > 0 ? "," : "");
        rc = sb_puts(&js, line);
    }
    for (int i = 0; !rc && i < n_added; i++) {
        char line[200];
        snprintf(line, sizeof line, "    {\"id\": %zu, \"content\": \"", V + (size_t)i);
        if (!(rc = sb_puts(&js, line)) && !(rc = json_escape(&js, added[i], strlen(added[i])))) {
            snprintf(line, sizeof line,
                     "\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, "
                     "\"special\": true}%s\n",
                     i + 1 < n_added ? "," : "");
            rc = sb_puts(&js, line);
        }
    }
    if (!rc)
        rc = sb_puts(&js,
                     "  ],\n"
                     "  \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": "
                     "\"" SP "\"}, {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"" SP
                     "\"}]},\n"
                     "  \"pre_tokenizer\": null,\n"
                     "  \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": "
                     "\"<s>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"pair\": "
                     "[{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", "
                     "\"type_id\": 0}}, {\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 1}}, {\"Sequence\": {\"id\": "
                     "\"B\", \"type_id\": 1}}], \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [1], "
                     "\"tokens\": [\"<s>\"]}}},\n"
                     "  \"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": "
                     "{\"String\": \"" SP "\"}, \"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": "
                     "\"Fuse\"}, {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]},\n"
                     "  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n    \"unk_token\": \"<unk>\",\n"
                     "    \"continuing_subword_prefix\": null,\n    \"end_of_word_suffix\": null,\n"
                     "    \"fuse_unk\": true,\n    \"byte_fallback\": true,\n    \"ignore_merges\": false,\n"
                     "    \"vocab\": {\n");
    for (size_t id = 0; !rc && id < g.n; id++) {
        char num[32];
        snprintf(num, sizeof num, "\": %zu%s\n", id, id + 1 < g.n ? "," : "");
        if (!(rc = sb_puts(&js, "      \"")) && !(rc = json_escape(&js, g.arena.p + g.off.p[id], g.len[id])))
            rc = sb_puts(&js, num);
    }
    if (!rc)
        rc = sb_puts(&js, "    },\n    \"merges\": [\n");
    for (size_t i = 0; !rc && i < nm; i++) {
        if (!(rc = sb_puts(&js, "      \"")) && !(rc = json_escape(&js, g.arena.p + g.off.p[ma[i]], g.len[ma[i]])) &&
            !(rc = sb_puts(&js, " ")) && !(rc = json_escape(&js, g.arena.p + g.off.p[mb[i]], g.len[mb[i]])))
            rc = sb_puts(&js, i + 1 < nm ? "\",\n" : "\"\n");
    }
    if (!rc)
        rc = sb_puts(&js, "    ]\n  }\n}\n");

done:
    free(ma);
    free(mb);
    free(g.len);
    free(g.htab);
    sb_free(&g.arena);
    free(g.off.p);
    if (rc) {
        sb_free(&js);
        return pi2_err_set(err, rc, "%s: cannot build synthetic tokenizer (%s)", path, pi2_strerror(rc));
    }
    pi2_afile *f;
    rc = pi2_afile_open(&f, path, err);
    if (!rc) {
        rc = pi2_afile_write(f, js.p, js.n, err);
        if (rc)
            pi2_afile_abort(f);
        else
            rc = pi2_afile_commit(f, err);
    }
    sb_free(&js);
    return rc;
}
