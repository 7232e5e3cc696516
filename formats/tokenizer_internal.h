/* Internals shared by the tokenizer's files; formats/tokenizer.h is the
 * contract.
 *   tokenizer.c         the object's lifetime and accessors, the vocab
 *                       lookup, the added-token trie, the helpers below
 *   tokenizer_load.c    tokenizer.json into the object (vocab, merges,
 *                       added tokens, steps, bos/eos)
 *   tokenizer_encode.c  text to ids (and the normalizer the loader uses)
 *   tokenizer_decode.c  ids to text, whole and streaming */
#ifndef PI2_TOKENIZER_INTERNAL_H
#define PI2_TOKENIZER_INTERNAL_H

#include "formats/tokenizer.h"

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

/* growable buffers */

/* Bytes, kept NUL-terminated once anything was put. */
typedef struct {
    char *p;
    size_t n, cap;
} sbuf;

/* Append d[0..n); 0 or PI2_ENOMEM (b unchanged then). */
int tok_sb_put(sbuf *b, const void *d, size_t n);
void tok_sb_free(sbuf *b);

/* Offsets into the original text, one per byte of a normalized text. */
typedef struct {
    size_t *p;
    size_t n, cap;
} zvec;

/* UTF-8 */

/* Length of the character at s (1..4); invalid or truncated sequences count
 * as one byte and set *cp to UINT32_MAX. */
size_t tok_u8_next(const uint8_t *s, size_t n, uint32_t *cp);

/* the tokenizer object */

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

/* Hashes of the open-addressing tables: of a piece, of an integer key. */
uint64_t tok_hash_bytes(const char *s, size_t n);
uint64_t tok_mix64(uint64_t x);

static inline const char *piece_at(const pi2_tok *t, size_t id) { return t->pdata + t->poff[id]; }

/* Any id (model or added) whose piece is exactly s[0..n), or -1. */
int32_t tok_vocab_find(const pi2_tok *t, const char *s, size_t n);

/* Model-vocab id only (what BPE sees), or -1. */
static inline int32_t model_find(const pi2_tok *t, const char *s, size_t n)
{
    int32_t id = tok_vocab_find(t, s, n);
    return id >= 0 && (size_t)id < t->n_model ? id : -1;
}

/* Slots of an open-addressing table for n keys: a power of two, at least 16,
 * at most half full. */
static inline size_t tok_table_cap(size_t n)
{
    size_t cap = 16;
    while (cap < n * 2)
        cap *= 2;
    return cap;
}

/* Build the trie of the added tokens whose "normalized" flag is `normalized`
 * (their patterns set); find the child of a node on byte b (0: none). */
int tok_trie_build(pi2_tok *t, match_set *ms, bool normalized, pi2_err *err);
uint32_t tok_trie_child(const match_set *ms, uint32_t node, uint8_t b);

/* The normalizer steps on s[0..n), each output byte keeping the original
 * offset of the byte it came from (orig0 + its index in s). Works in the
 * buffer pairs nb/no (contents replaced, kept allocated for reuse); returns
 * the index (0 or 1) of the pair holding the result, or PI2_ENOMEM. */
int tok_normalize(const pi2_tok *t, sbuf nb[2], zvec no[2], const char *s, size_t n, size_t orig0);

/* A file-provided string made fit for a one-line message (escaped, cut
 * after ~48 bytes) in buf; SHOW gives each use its own buffer. */
const char *tok_show(const char *s, size_t n, char *buf, size_t cap);
#define SHOW(s, n) tok_show((s), (n), (char[160]){0}, 160)
#define SHOWZ(s) SHOW((s), strlen(s))

#endif
