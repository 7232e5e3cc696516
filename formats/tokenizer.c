/* Tokenizer: the object's lifetime and accessors, the vocab lookup, the
 * added-token trie, and the buffers, UTF-8 and message helpers the loader,
 * the encoder and the decoders share.
 *
 * Why it is built this way:
 * - Vocab (string -> id), merges ((left, right) -> rank, new id) and the
 *   trie's edges are open addressing hash tables built once at load; the
 *   loader fills the merge table and the encoder reads it.
 */
#include "formats/tokenizer_internal.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* growable buffers                                                          */

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

int tok_sb_put(sbuf *b, const void *d, size_t n)
{
    if (sb_grow(b, n))
        return PI2_ENOMEM;
    if (n)
        memcpy(b->p + b->n, d, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

void tok_sb_free(sbuf *b)
{
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

/* ------------------------------------------------------------------------ */
/* UTF-8                                                                     */

/* Length of the character at s (1..4). Invalid or truncated sequences count
 * as one byte and set *cp to UINT32_MAX. Strict like Rust's from_utf8: no
 * overlongs, no surrogates, nothing above U+10FFFF. */
size_t tok_u8_next(const uint8_t *s, size_t n, uint32_t *cp)
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

/* ------------------------------------------------------------------------ */
/* the tokenizer object                                                      */

uint64_t tok_hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 31);
}

uint64_t tok_mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

/* Any id (model or added) whose piece is exactly s[0..n), or -1. */
int32_t tok_vocab_find(const pi2_tok *t, const char *s, size_t n)
{
    if (!t->htab)
        return -1;
    size_t h = (size_t)tok_hash_bytes(s, n) & t->hmask;
    for (;;) {
        int32_t id = t->htab[h];
        if (id < 0)
            return -1;
        if (t->plen[id] == n && memcmp(piece_at(t, (size_t)id), s, n) == 0)
            return id;
        h = (h + 1) & t->hmask;
    }
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

/* A file-provided string made fit for a one-line message: control bytes
 * and quotes escaped, cut (on a character boundary) after ~48 bytes. */
const char *tok_show(const char *s, size_t n, char *buf, size_t cap)
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

uint32_t tok_trie_child(const match_set *ms, uint32_t node, uint8_t b)
{
    uint64_t key = ((uint64_t)node << 8 | b) + 1;
    size_t h = (size_t)tok_mix64(key) & ms->emask;
    for (;;) {
        if (ms->ekey[h] == 0)
            return 0; /* the root is never a child */
        if (ms->ekey[h] == key)
            return ms->eval[h];
        h = (h + 1) & ms->emask;
    }
}

/* The trie of the added tokens with that "normalized" flag. */
int tok_trie_build(pi2_tok *t, match_set *ms, bool normalized, pi2_err *err)
{
    size_t total = 0;
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].normalized == normalized && t->added[i].plen > 0 &&
            !pi2_add_size(total, t->added[i].plen, &total))
            return pi2_err_set(err, PI2_ERANGE, "%s: added tokens too long", t->name);
    size_t cap = tok_table_cap(total);
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
            uint32_t child = tok_trie_child(ms, node, b);
            if (!child) {
                uint64_t key = ((uint64_t)node << 8 | b) + 1;
                size_t h = (size_t)tok_mix64(key) & ms->emask;
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
    return tok_vocab_find(t, piece, strlen(piece));
}

bool pi2_tok_is_special(const pi2_tok *t, int id)
{
    return t && id >= 0 && (size_t)id < t->n_total && t->special[id];
}

int pi2_tok_unk(const pi2_tok *t) { return t ? t->unk_id : -1; }
