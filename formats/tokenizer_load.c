/* Tokenizer: loading a Hugging Face tokenizer.json (model vocab and merges,
 * added tokens, normalizer / pre-tokenizer / decoder steps, bos and eos). */
#include "formats/tokenizer_internal.h"
#include "formats/jsonutil.h"

#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Exactly one character? */
static bool utf8_one_char(const char *s, size_t n)
{
    uint32_t cp;
    return n > 0 && tok_u8_next((const uint8_t *)s, n, &cp) == n && cp != UINT32_MAX;
}

static void vocab_insert(pi2_tok *t, int32_t id)
{
    size_t h = (size_t)tok_hash_bytes(piece_at(t, (size_t)id), t->plen[id]) & t->hmask;
    while (t->htab[h] >= 0)
        h = (h + 1) & t->hmask;
    t->htab[h] = id;
}

/* Insert or overwrite (HF collects merges into a map: a repeated pair keeps
 * the later rank). */
static void merge_put(pi2_tok *t, int32_t a, int32_t b, uint32_t rank, int32_t nid)
{
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t h = (size_t)tok_mix64(key) & t->mmask;
    while (t->mkey[h] != UINT64_MAX && t->mkey[h] != key)
        h = (h + 1) & t->mmask;
    t->mkey[h] = key;
    t->mrank[h] = rank;
    t->mnew[h] = nid;
}

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

static int load_oom(const pi2_tok *t, pi2_err *err)
{
    return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", t->name);
}

/* Append the piece of `id` to the arena (NUL-terminated). */
static int piece_store(pi2_tok *t, sbuf *arena, size_t id, const char *s, size_t n)
{
    t->poff[id] = arena->n;
    t->plen[id] = (uint32_t)n;
    if (tok_sb_put(arena, s, n) || tok_sb_put(arena, "", 1))
        return PI2_ENOMEM;
    t->pdata = arena->p;
    return 0;
}

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
        return load_oom(t, err);
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
    size_t hcap = tok_table_cap(cap);
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
        return load_oom(t, err);
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
        /* piece_store() sets pdata, which piece_at() in the duplicate message reads */
        if (piece_store(t, arena, (size_t)id, key, klen)) {
            rc = load_oom(t, err);
            break;
        }
    }
    free(seen);
    return rc;
}

static int load_merges(pi2_tok *t, json_t *merges, pi2_err *err)
{
    size_t n = json_array_size(merges);
    if (n > TOK_MAX_MERGES)
        return pi2_err_set(err, PI2_ERANGE, "%s: %zu merges (more than %u)", t->name, n, TOK_MAX_MERGES);
    size_t cap = tok_table_cap(n);
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
        if (tok_sb_put(&cat, a, al) || tok_sb_put(&cat, b, bl)) {
            rc = load_oom(t, err);
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
    tok_sb_free(&cat);
    return rc;
}

/* Apply the normalizer ops to a whole string (used for added-token
 * patterns); offsets are not needed here. */
static int normalize_plain(const pi2_tok *t, const char *s, size_t n, sbuf *out)
{
    sbuf nb[2] = {{0}};
    zvec no[2] = {{0}};
    int cur = tok_normalize(t, nb, no, s, n, 0);
    free(no[0].p);
    free(no[1].p);
    if (cur < 0) {
        tok_sb_free(&nb[0]);
        tok_sb_free(&nb[1]);
        return cur;
    }
    tok_sb_free(&nb[!cur]);
    *out = nb[cur];
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
        int32_t have = tok_vocab_find(t, a->content, a->clen);
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
            if (piece_store(t, arena, nid, a->content, a->clen))
                return load_oom(t, err);
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
                              : load_oom(t, err);
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
        return tok_vocab_find(t, name, strlen(name));
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

/* The model's options other than its tables: BPE only, without dropout or
 * affixes; byte_fallback, fuse_unk, ignore_merges, unk_token. */
static int load_model_opts(pi2_tok *t, json_t *model, pi2_err *err)
{
    int rc;
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
    return 0;
}

/* The model vocab (with room for the added tokens), its merges, the byte
 * and unk ids, then the added tokens. The piece arena becomes t->pdata. */
static int load_tables(pi2_tok *t, json_t *root, json_t *model, pi2_err *err)
{
    sbuf arena = {0};
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
    int rc = load_vocab(t, vocab, nv + na, &arena, err);
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
    return rc;
}

/* The normalizer, pre_tokenizer and decoder steps. */
static int load_steps(pi2_tok *t, json_t *root, pi2_err *err)
{
    static const char *const keys[] = {"normalizer", "pre_tokenizer", "decoder"};
    tok_op **dst[] = {&t->norm, &t->pre, &t->dec};
    int *cnt[] = {&t->n_norm, &t->n_pre, &t->n_dec};
    for (int w = 0; w < 3; w++) {
        json_t *j = json_object_get(root, keys[w]);
        int rc;
        if (w == WHAT_DEC)
            t->has_decoder = j && !json_is_null(j);
        if (j && (rc = parse_ops(t, j, w, dst[w], cnt[w], 0, err)))
            return rc;
    }
    return 0;
}

/* What each added token is matched as (its content, or for a "normalized"
 * one its normalized form), and the two tries they are found with. */
static int added_patterns(pi2_tok *t, pi2_err *err)
{
    for (size_t i = 0; i < t->n_added; i++) {
        added_tok *a = &t->added[i];
        if (a->clen == 0)
            continue;
        if (a->normalized) {
            sbuf nb = {0};
            if (normalize_plain(t, a->content, a->clen, &nb))
                return load_oom(t, err);
            a->pat = nb.p;
            a->plen = nb.n;
        } else {
            a->pat = memdup0(a->content, a->clen);
            a->plen = a->clen;
            if (!a->pat)
                return load_oom(t, err);
        }
    }
    int rc = tok_trie_build(t, &t->raw_set, false, err);
    return rc ? rc : tok_trie_build(t, &t->norm_set, true, err);
}

/* bos and eos by the conventions of tokenizer.h. */
static void find_bos_eos(pi2_tok *t, json_t *root)
{
    t->bos = template_bos(t, json_object_get(root, "post_processor"), 0);
    if (t->bos < 0)
        t->bos = tok_vocab_find(t, "<s>", 3);
    t->eos = tok_vocab_find(t, "</s>", 4);
    if (t->eos < 0 && t->bos >= 0 && (size_t)t->bos + 1 < t->n_total && t->special[t->bos + 1] &&
        looks_like_end(piece_at(t, (size_t)t->bos + 1)))
        t->eos = t->bos + 1;
}

static int load_json(pi2_tok *t, json_t *root, pi2_err *err)
{
    int rc;
    if (!json_is_object(root))
        return pi2_err_set(err, PI2_EFORMAT, "%s: top level is %s, not an object", t->name, jtype(root));
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model))
        return pi2_err_set(err, PI2_EFORMAT, "%s: no \"model\" object%s%s", t->name, model ? ", found " : "",
                           model ? jtype(model) : "");
    if ((rc = load_model_opts(t, model, err)) || (rc = load_tables(t, root, model, err)) ||
        (rc = load_steps(t, root, err)) || (rc = added_patterns(t, err)))
        return rc;
    find_bos_eos(t, root);
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
