/* Tokenizer: loading a Hugging Face tokenizer.json (model vocab and merges,
 * added tokens, normalizer / pre-tokenizer / decoder steps, bos and eos). */
#include "formats/tokenizer_internal.h"
#include "formats/jsonread.h"
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

/* String member k of o (at most TOK_MAX_PIECE bytes) copied into *out. */
static int get_str(const pi2_tok *t, json_t *o, const char *w, const char *k, char **out, size_t *len, pi2_err *err)
{
    const char *s;
    int rc = pi2_jr_str(&(pi2_jr){t->name, err}, o, w, k, TOK_MAX_PIECE + 1, &s);
    if (rc)
        return rc;
    *len = strlen(s);
    *out = memdup0(s, *len);
    return *out ? 0 : load_oom(t, err);
}

/* A string member of exactly one character, copied. */
static int get_char(const pi2_tok *t, json_t *o, const char *w, const char *k, char **out, size_t *len,
                    pi2_err *err)
{
    int rc = get_str(t, o, w, k, out, len, err);
    if (rc)
        return rc;
    if (!utf8_one_char(*out, *len)) {
        free(*out);
        *out = NULL;
        return pi2_jr_fail(&(pi2_jr){t->name, err}, PI2_EFORMAT, w, k, "must be exactly one character");
    }
    return 0;
}

/* Metaspace's prepend_scheme, or for files from before it add_prefix_space
 * alone. */
static int get_scheme(const pi2_jr *r, json_t *o, const char *w, int *scheme)
{
    static const char *const names[] = {[SCHEME_ALWAYS] = "always", [SCHEME_FIRST] = "first",
                                        [SCHEME_NEVER] = "never"};
    bool aps;
    int rc = pi2_jr_bool_or(r, o, w, "add_prefix_space", true, &aps);
    if (rc)
        return rc;
    json_t *ps = json_object_get(o, "prepend_scheme");
    if (!ps || json_is_null(ps)) {
        *scheme = aps ? SCHEME_ALWAYS : SCHEME_NEVER;
        return 0;
    }
    if ((rc = pi2_jr_enum(r, o, w, "prepend_scheme", names, 3, "always, first or never", scheme)))
        return rc;
    if (!aps && *scheme != SCHEME_NEVER)
        return pi2_jr_fail(r, PI2_EFORMAT, w, "add_prefix_space", "false does not match prepend_scheme \"%s\"",
                           names[*scheme]);
    return 0;
}

/* Replace {"pattern": {"String": p}, "content": c} (Regex unsupported). */
static int get_replace(const pi2_tok *t, json_t *o, const char *w, tok_op *op, pi2_err *err)
{
    const pi2_jr r = {t->name, err};
    json_t *pat;
    char pw[320];
    int rc = pi2_jr_obj(&r, o, w, "pattern", false, &pat);
    if (rc)
        return rc;
    if (json_object_get(pat, "Regex"))
        return pi2_jr_fail(&r, PI2_EUNSUPPORTED, w, "pattern", "a Regex pattern is not supported");
    pi2_jr_path(pw, sizeof pw, w, "pattern");
    if ((rc = get_str(t, pat, pw, "String", &op->a, &op->alen, err)))
        return rc;
    if (op->alen == 0)
        return pi2_jr_fail(&r, PI2_EUNSUPPORTED, pw, "String", "an empty pattern is not supported");
    return get_str(t, o, w, "content", &op->b, &op->blen, err);
}

/* Strip {"content": c, "start": n, "stop": n}. */
static int get_strip(const pi2_tok *t, json_t *o, const char *w, tok_op *op, pi2_err *err)
{
    const pi2_jr r = {t->name, err};
    long long start, stop;
    int rc = get_char(t, o, w, "content", &op->a, &op->alen, err);
    if (rc == 0)
        rc = pi2_jr_int(&r, o, w, "start", 0, TOK_MAX_STRIP, &start);
    if (rc == 0)
        rc = pi2_jr_int(&r, o, w, "stop", 0, TOK_MAX_STRIP, &stop);
    if (rc == 0) {
        op->start = (size_t)start;
        op->stop = (size_t)stop;
    }
    return rc;
}

enum { WHAT_NORM, WHAT_PRE, WHAT_DEC };

/* The members of one step of kind `type`, at w, into op. */
static int parse_op(const pi2_tok *t, json_t *j, int what, const char *w, const char *type, tok_op *op,
                    pi2_err *err)
{
    if (what == WHAT_NORM && !strcmp(type, "Prepend")) {
        op->kind = OP_PREPEND;
        return get_str(t, j, w, "prepend", &op->a, &op->alen, err);
    }
    if (what != WHAT_PRE && !strcmp(type, "Replace")) {
        op->kind = OP_REPLACE;
        return get_replace(t, j, w, op, err);
    }
    const pi2_jr r = {t->name, err};
    if (what != WHAT_NORM && !strcmp(type, "Metaspace")) {
        op->kind = OP_METASPACE;
        int rc = get_char(t, j, w, "replacement", &op->a, &op->alen, err);
        if (!rc)
            rc = get_scheme(&r, j, w, &op->scheme);
        if (!rc)
            rc = pi2_jr_bool_or(&r, j, w, "split", true, &op->split);
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
        return get_strip(t, j, w, op, err);
    }
    return pi2_jr_fail(&r, PI2_EUNSUPPORTED, w, "type", "\"%s\" is not supported here", SHOWZ(type));
}

/* The step j at w (null: none), a Sequence flattened into its members. */
static int parse_ops(const pi2_tok *t, json_t *j, int what, const char *w, tok_op **ops, int *n, int depth,
                     pi2_err *err)
{
    static const char *const names[] = {"normalizer", "pre_tokenizer", "decoder"};
    static const char *const seqkey[] = {"normalizers", "pretokenizers", "decoders"};
    const pi2_jr r = {t->name, err};
    if (json_is_null(j))
        return 0;
    if (!json_is_object(j))
        return pi2_jr_fail(&r, PI2_EFORMAT, w, NULL, "expected an object or null, got %s", pi2_json_type_name(j));
    if (depth > TOK_MAX_DEPTH)
        return pi2_jr_fail(&r, PI2_ERANGE, w, NULL, "Sequences nested deeper than %d", TOK_MAX_DEPTH);
    const char *type;
    int rc = pi2_jr_str(&r, j, w, "type", TOK_MAX_PIECE + 1, &type);
    if (rc)
        return rc;
    if (!strcmp(type, "Sequence")) {
        json_t *arr;
        size_t na;
        if ((rc = pi2_jr_arr(&r, j, w, seqkey[what], SIZE_MAX, &arr, &na)))
            return rc;
        for (size_t i = 0; i < na; i++) {
            char cw[320];
            snprintf(cw, sizeof cw, "%s.%s[%zu]", w, seqkey[what], i);
            if ((rc = parse_ops(t, json_array_get(arr, i), what, cw, ops, n, depth + 1, err)))
                return rc;
        }
        return 0;
    }
    if (*n >= TOK_MAX_OPS)
        return pi2_jr_fail(&r, PI2_ERANGE, w, NULL, "more than %d %s steps", TOK_MAX_OPS, names[what]);
    tok_op *grown = realloc(*ops, (size_t)(*n + 1) * sizeof **ops);
    if (!grown)
        return load_oom(t, err);
    *ops = grown;
    tok_op *op = &grown[*n];
    memset(op, 0, sizeof *op);
    (*n)++; /* counted now so a half-parsed op is freed with the rest */
    return parse_op(t, j, what, w, type, op, err);
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

/* Why vocab entry key: v is refused (seen[id]: an earlier piece has id). */
static int vocab_refuse(const pi2_tok *t, const char *key, size_t klen, json_t *v, const uint8_t *seen, pi2_err *err)
{
    const pi2_jr r = {t->name, err};
    char k[176];
    long long id;
    snprintf(k, sizeof k, "\"%s\"", SHOW(key, klen));
    int rc = pi2_jr_int_val(&r, v, "model.vocab", k, 0, INT64_MAX, &id);
    if (rc)
        return rc;
    if ((uint64_t)id >= t->n_model)
        return pi2_jr_fail(&r, PI2_ERANGE, "model.vocab", k, "id %lld is out of range (ids must be 0..%zu, dense)", id,
                           t->n_model - 1);
    if (seen[id])
        return pi2_jr_fail(&r, PI2_EFORMAT, "model.vocab", k, "id %lld is used twice (also by \"%s\")", id,
                           SHOW(piece_at(t, (size_t)id), t->plen[id]));
    return pi2_jr_fail(&r, PI2_ERANGE, "model.vocab", NULL, "the piece with id %lld is longer than %u bytes", id,
                       TOK_MAX_PIECE);
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
        long long id = json_is_integer(v) ? json_integer_value(v) : -1;
        if (id < 0 || (uint64_t)id >= n || seen[id] || klen > TOK_MAX_PIECE) {
            rc = vocab_refuse(t, key, klen, v, seen, err);
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

/* model.merges (n entries, at most TOK_MAX_MERGES): "a b" strings or
 * ["a", "b"] pairs, not mixed. */
static int load_merges(pi2_tok *t, json_t *merges, size_t n, pi2_err *err)
{
    const pi2_jr r = {t->name, err};
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
        char w[40]; /* named only when refused: there may be 10^5 merges */
        const char *a, *b;
        size_t al, bl;
        if (legacy) {
            /* "a b": exactly one space; "#version" lines are skipped */
            if (!json_is_string(m)) {
                snprintf(w, sizeof w, "model.merges[%zu]", i);
                rc = pi2_jr_fail(&r, PI2_EFORMAT, w, NULL, "expected a \"left right\" string like merges[0], got %s",
                                 pi2_json_type_name(m));
                break;
            }
            const char *s = json_string_value(m);
            size_t sl = json_string_length(m);
            if (sl >= 8 && !memcmp(s, "#version", 8))
                continue;
            const char *sp = memchr(s, ' ', sl);
            if (!sp || memchr(sp + 1, ' ', sl - (size_t)(sp - s) - 1)) {
                snprintf(w, sizeof w, "model.merges[%zu]", i);
                rc = pi2_jr_fail(&r, PI2_EFORMAT, w, NULL, "\"%s\" is not two tokens separated by one space",
                                 SHOW(s, sl));
                break;
            }
            a = s;
            al = (size_t)(sp - s);
            b = sp + 1;
            bl = sl - al - 1;
        } else {
            if (!json_is_array(m) || json_array_size(m) != 2 || !json_is_string(json_array_get(m, 0)) ||
                !json_is_string(json_array_get(m, 1))) {
                snprintf(w, sizeof w, "model.merges[%zu]", i);
                rc = pi2_jr_fail(&r, PI2_EFORMAT, w, NULL,
                                 "expected a [\"left\", \"right\"] pair of strings (all merges are pairs or "
                                 "all strings)");
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
            snprintf(w, sizeof w, "model.merges[%zu]", i);
            rc = pi2_jr_fail(&r, PI2_EFORMAT, w, NULL, "token \"%s\" is not in the vocab", SHOW(bad, bad_len));
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
    const pi2_jr r = {t->name, err};
    size_t n = json_array_size(arr);
    for (size_t i = 0; i < n; i++) {
        json_t *o;
        char w[48];
        snprintf(w, sizeof w, "added_tokens[%zu]", i);
        long long id;
        int rc;
        if ((rc = pi2_jr_elem_obj(&r, arr, i, w, &o)) || (rc = pi2_jr_int(&r, o, w, "id", INT64_MIN, INT64_MAX, &id)))
            return rc;
        added_tok *a = &t->added[t->n_added];
        if ((rc = get_str(t, o, w, "content", &a->content, &a->clen, err)))
            return rc;
        bool single_word;
        if ((rc = pi2_jr_bool_or(&r, o, w, "special", false, &a->special)) ||
            (rc = pi2_jr_bool_or(&r, o, w, "normalized", !a->special, &a->normalized)) ||
            (rc = pi2_jr_bool_or(&r, o, w, "lstrip", false, &a->lstrip)) ||
            (rc = pi2_jr_bool_or(&r, o, w, "rstrip", false, &a->rstrip)) ||
            (rc = pi2_jr_bool_or(&r, o, w, "single_word", false, &single_word))) {
            free(a->content);
            a->content = NULL;
            return rc;
        }
        t->n_added++; /* owned from here on */
        if (single_word)
            return pi2_jr_fail(&r, PI2_EUNSUPPORTED, w, "single_word", "true is not supported (token \"%s\")",
                               SHOW(a->content, a->clen));
        if (a->clen == 0) { /* HF ignores empty added tokens */
            a->plen = 0;
            continue;
        }
        /* HF: a token already in the model vocab keeps its vocab id; a new one
         * gets the next id after the vocab and earlier added tokens. */
        int32_t have = tok_vocab_find(t, a->content, a->clen);
        if (have >= 0 && seen[have])
            return pi2_jr_fail(&r, PI2_EFORMAT, w, "content", "\"%s\" is listed twice", SHOW(a->content, a->clen));
        int32_t expect = have >= 0 ? have : (int32_t)t->n_total;
        if (id != expect)
            return pi2_jr_fail(&r, PI2_EFORMAT, w, "id", "%lld for \"%s\", but %s %d", id, SHOW(a->content, a->clen),
                               have >= 0 ? "the vocab gives it" : "the next free id is", expect);
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
    const pi2_jr r = {t->name, err};
    const char *type;
    int rc;
    if (json_object_get(model, "type")) {
        if ((rc = pi2_jr_str(&r, model, "model", "type", TOK_MAX_PIECE + 1, &type)))
            return rc;
        if (strcmp(type, "BPE"))
            return pi2_jr_fail(&r, PI2_EUNSUPPORTED, "model", "type", "\"%s\" is not supported (only BPE)",
                               SHOWZ(type));
    }
    json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout) && !(json_is_number(dropout) && json_number_value(dropout) == 0.0))
        return pi2_jr_fail(&r, PI2_EUNSUPPORTED, "model", "dropout", "BPE dropout is not supported");
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        json_t *v = json_object_get(model, affixes[i]);
        if (v && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0))
            return pi2_jr_fail(&r, PI2_EUNSUPPORTED, "model", affixes[i], "BPE affixes are not supported");
    }
    if ((rc = pi2_jr_bool_or(&r, model, "model", "byte_fallback", false, &t->byte_fallback)) ||
        (rc = pi2_jr_bool_or(&r, model, "model", "fuse_unk", false, &t->fuse_unk)) ||
        (rc = pi2_jr_bool_or(&r, model, "model", "ignore_merges", false, &t->ignore_merges)))
        return rc;
    json_t *unk = json_object_get(model, "unk_token");
    if (unk && !json_is_null(unk)) {
        size_t ul;
        if ((rc = get_str(t, model, "model", "unk_token", &t->unk_token, &ul, err)))
            return rc;
    }
    return 0;
}

/* Array k of o, absent or null read as none (*arr NULL, *n 0). */
static int opt_arr(const pi2_jr *r, json_t *o, const char *w, const char *k, size_t max, json_t **arr, size_t *n)
{
    *arr = json_object_get(o, k);
    *n = 0;
    if (!*arr || json_is_null(*arr)) {
        *arr = NULL;
        return 0;
    }
    return pi2_jr_arr(r, o, w, k, max, arr, n);
}

/* The model vocab (with room for the added tokens), its merges, the byte
 * and unk ids, then the added tokens. The piece arena becomes t->pdata. */
static int load_tables(pi2_tok *t, json_t *root, json_t *model, pi2_err *err)
{
    const pi2_jr r = {t->name, err};
    sbuf arena = {0};
    json_t *vocab, *added, *merges;
    size_t na, nm;
    int rc;
    if ((rc = pi2_jr_obj(&r, model, "model", "vocab", false, &vocab)))
        return rc;
    size_t nv = json_object_size(vocab);
    if (nv > TOK_MAX_VOCAB)
        return pi2_jr_fail(&r, PI2_ERANGE, "model", "vocab", "%zu entries, at most %u allowed", nv, TOK_MAX_VOCAB);
    if ((rc = opt_arr(&r, root, "", "added_tokens", TOK_MAX_ADDED, &added, &na)))
        return rc;
    t->n_model = t->n_total = nv;
    rc = load_vocab(t, vocab, nv + na, &arena, err);
    t->pdata = arena.p;
    if (rc)
        return rc;
    if (nv == 0)
        return pi2_jr_fail(&r, PI2_EFORMAT, "model", "vocab", "empty");
    for (size_t id = 0; id < nv; id++)
        vocab_insert(t, (int32_t)id);
    if ((rc = opt_arr(&r, model, "model", "merges", TOK_MAX_MERGES, &merges, &nm)) ||
        (rc = load_merges(t, merges, nm, err)))
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
        if (j && (rc = parse_ops(t, j, w, keys[w], dst[w], cnt[w], 0, err)))
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
    const pi2_jr r = {t->name, err};
    json_t *model;
    int rc;
    if (!json_is_object(root))
        return pi2_jr_fail(&r, PI2_EFORMAT, "", NULL, "expected an object, got %s", pi2_json_type_name(root));
    if ((rc = pi2_jr_obj(&r, root, "", "model", false, &model)) || (rc = load_model_opts(t, model, err)) ||
        (rc = load_tables(t, root, model, err)) || (rc = load_steps(t, root, err)) || (rc = added_patterns(t, err)))
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
