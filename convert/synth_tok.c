/* Synthetic tokenizer.json writer (contract in convert/synth_tok.h).
 *
 * The vocabulary is built in id order in a small string table, then written
 * by hand in the key order and layout of HF's own files, so the same
 * arguments always give the same bytes. */
#include "convert/synth_tok.h"
#include "formats/jsonutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The tokenizer reader's vocab cap (formats/tokenizer.h: 4M entries). */
#define SYNTH_MAX_VOCAB (1u << 22)
#define SYNTH_MAX_ADDED 1024
#define SYNTH_MAX_PIECE 16 /* filler pieces, in bytes */
#define SP "\xE2\x96\x81"  /* U+2581 "▁" */

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

static const char *const SPECIALS[] = {"<unk>", "<s>", "</s>"};

/* The vocabulary being built: pieces in id order with a hash index, and the
 * merges in rank order (merge i joins pieces ma[i] and mb[i]). */
typedef struct {
    pi2_sbuf arena; /* all pieces, back to back */
    size_t *off;
    uint32_t *len;
    int32_t *htab; /* piece -> id, -1 empty */
    size_t hmask, n, cap;
    int32_t *ma, *mb;
    size_t nm;
    char chars[96]; /* the single characters, letters first */
    size_t nc;
    size_t first_text; /* id of "▁", the first piece merges start from */
} gen_vocab;

static size_t gv_slot(const gen_vocab *g, const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 1099511628211ull;
    }
    return (size_t)(h ^ (h >> 31)) & g->hmask;
}

static const char *gv_piece(const gen_vocab *g, int32_t id) { return g->arena.p + g->off[id]; }

static int32_t gv_find(const gen_vocab *g, const char *s, size_t n)
{
    for (size_t h = gv_slot(g, s, n);; h = (h + 1) & g->hmask) {
        int32_t id = g->htab[h];
        if (id < 0 || (g->len[id] == n && !memcmp(gv_piece(g, id), s, n)))
            return id;
    }
}

static int gv_add(gen_vocab *g, const char *s, size_t n)
{
    if (g->n >= g->cap)
        return PI2_ERANGE;
    size_t id = g->n;
    g->off[id] = g->arena.len;
    pi2_sb_put(&g->arena, s, n);
    if (g->arena.failed)
        return PI2_ENOMEM;
    g->len[id] = (uint32_t)n;
    size_t h = gv_slot(g, s, n);
    while (g->htab[h] >= 0)
        h = (h + 1) & g->hmask;
    g->htab[h] = (int32_t)id;
    g->n++;
    return 0;
}

/* Pieces a and b side by side into buf (room for 2 * SYNTH_MAX_PIECE + 32
 * bytes: built-in words are short); their total length. */
static size_t gv_join(const gen_vocab *g, int32_t a, int32_t b, char *buf)
{
    memcpy(buf, gv_piece(g, a), g->len[a]);
    memcpy(buf + g->len[a], gv_piece(g, b), g->len[b]);
    return g->len[a] + g->len[b];
}

/* Is the join of a and b not a piece yet? */
static bool gv_is_new(const gen_vocab *g, int32_t a, int32_t b)
{
    char buf[2 * SYNTH_MAX_PIECE + 32];
    return gv_find(g, buf, gv_join(g, a, b, buf)) < 0;
}

/* Add the join of a and b as a new piece, made by the next merge. */
static int gv_merge(gen_vocab *g, int32_t a, int32_t b)
{
    char buf[2 * SYNTH_MAX_PIECE + 32];
    int rc = gv_add(g, buf, gv_join(g, a, b, buf));
    if (!rc) {
        g->ma[g->nm] = a;
        g->mb[g->nm] = b;
        g->nm++;
    }
    return rc;
}

static int32_t gv_char(const gen_vocab *g, size_t i) { return gv_find(g, &g->chars[i], 1); }

/* Specials, byte tokens, "▁" and printable ASCII (letters first, so a small
 * vocab still spells words). */
static int gv_base(gen_vocab *g)
{
    int rc = 0;
    for (int i = 0; !rc && i < 3; i++)
        rc = gv_add(g, SPECIALS[i], strlen(SPECIALS[i]));
    for (int b = 0; !rc && b < 256; b++) {
        char code[8];
        snprintf(code, sizeof code, "<0x%02X>", b);
        rc = gv_add(g, code, 6);
    }
    g->first_text = g->n;
    if (!rc)
        rc = gv_add(g, SP, 3);
    for (char ch = 'a'; ch <= 'z'; ch++)
        g->chars[g->nc++] = ch;
    for (char ch = 'A'; ch <= 'Z'; ch++)
        g->chars[g->nc++] = ch;
    for (char ch = '0'; ch <= '9'; ch++)
        g->chars[g->nc++] = ch;
    for (int ch = 0x21; ch < 0x7F; ch++)
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9')))
            g->chars[g->nc++] = (char)ch;
    for (size_t i = 0; !rc && i < g->nc && g->n < g->cap; i++)
        rc = gv_add(g, &g->chars[i], 1);
    return rc;
}

/* Words: "▁w", "▁wo", ... one merge each, built left to right. */
static int gv_words(gen_vocab *g)
{
    char buf[64];
    memcpy(buf, SP, 3);
    for (size_t w = 0; w < sizeof WORDS / sizeof *WORDS && g->n < g->cap; w++) {
        const char *word = WORDS[w];
        size_t wl = strlen(word);
        bool ok = true;
        for (size_t i = 0; i < wl; i++)
            ok = ok && gv_find(g, word + i, 1) >= 0;
        if (!ok)
            continue;
        int32_t left = (int32_t)g->first_text;
        for (size_t i = 0; i < wl && g->n < g->cap; i++) {
            buf[3 + i] = word[i];
            int32_t have = gv_find(g, buf, 4 + i);
            if (have < 0) {
                int rc = gv_merge(g, left, gv_find(g, word + i, 1));
                if (rc)
                    return rc;
                have = (int32_t)g->n - 1;
            }
            left = have;
        }
    }
    return 0;
}

/* A random new pair (piece, letter) or (piece, piece) within the length
 * cap, "▁" never inside; false after 64 tries. */
static bool gv_pick_random(const gen_vocab *g, pi2_rng *rng, int32_t *a, int32_t *b)
{
    size_t ft = g->first_text;
    for (int attempt = 0; attempt < 64; attempt++) {
        int32_t x = (int32_t)(ft + pi2_rng_u64(rng) % (g->n - ft));
        int32_t y;
        if (pi2_rng_u64(rng) % 10 < 7)
            y = gv_char(g, pi2_rng_u64(rng) % 26);
        else
            y = (int32_t)(ft + 1 + pi2_rng_u64(rng) % (g->n - ft - 1));
        if (y < 0 || g->len[x] + g->len[y] > SYNTH_MAX_PIECE)
            continue;
        if (g->len[y] >= 3 && !memcmp(gv_piece(g, y), SP, 3))
            continue;
        if (gv_is_new(g, x, y)) {
            *a = x;
            *b = y;
            return true;
        }
    }
    return false;
}

/* The fallback that always finds a pair while one is left: the next piece +
 * lowercase letter not tried yet, in order (*scan_a, *scan_b). */
static bool gv_pick_scan(const gen_vocab *g, size_t *scan_a, size_t *scan_b, int32_t *a, int32_t *b)
{
    while (*scan_a < g->n) {
        int32_t x = (int32_t)*scan_a, y = gv_char(g, *scan_b);
        bool found = g->len[x] + 1 <= SYNTH_MAX_PIECE && y >= 0 && gv_is_new(g, x, y);
        if (++*scan_b == 26) {
            *scan_b = 0;
            ++*scan_a;
        }
        if (found) {
            *a = x;
            *b = y;
            return true;
        }
    }
    return false;
}

/* Filler merges up to the vocab size: random (piece, piece) pairs,
 * deterministic from seed; "▁" only ever starts a piece, like
 * SentencePiece vocabularies. */
static int gv_filler(gen_vocab *g, uint64_t seed)
{
    pi2_rng rng;
    pi2_rng_seed(&rng, seed);
    size_t scan_a = g->first_text, scan_b = 0;
    while (g->n < g->cap) {
        int32_t a, b;
        if (!gv_pick_random(g, &rng, &a, &b) && !gv_pick_scan(g, &scan_a, &scan_b, &a, &b))
            return PI2_ERANGE;
        int rc = gv_merge(g, a, b);
        if (rc)
            return rc;
    }
    return 0;
}

static void put_escaped(pi2_sbuf *b, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\') {
            char e[2] = {'\\', (char)ch};
            pi2_sb_put(b, e, 2);
        } else if (ch < 0x20) {
            char e[8];
            snprintf(e, sizeof e, "\\u%04x", ch);
            pi2_sb_put(b, e, 6);
        } else {
            pi2_sb_put(b, s + i, 1);
        }
    }
}

/* One special added token of the "added_tokens" array. */
static void put_added(pi2_sbuf *js, size_t id, const char *content, bool last)
{
    char num[32];
    snprintf(num, sizeof num, "%zu", id);
    pi2_sb_str(js, "    {\"id\": ");
    pi2_sb_str(js, num);
    pi2_sb_str(js, ", \"content\": \"");
    put_escaped(js, content, strlen(content));
    pi2_sb_str(js, "\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, "
                   "\"special\": true}");
    pi2_sb_str(js, last ? "\n" : ",\n");
}

/* Everything between "added_tokens" and the model's vocab: the same for
 * every synthetic tokenizer. */
static const char PIPELINE[] =
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
    "    \"vocab\": {\n";

static void put_json(pi2_sbuf *js, const gen_vocab *g, int n_added, const char *const *added)
{
    pi2_sb_str(js, "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n"
                   "  \"added_tokens\": [\n");
    for (int i = 0; i < 3; i++)
        put_added(js, (size_t)i, SPECIALS[i], i == 2 && n_added == 0);
    for (int i = 0; i < n_added; i++)
        put_added(js, g->n + (size_t)i, added[i], i + 1 == n_added);
    pi2_sb_str(js, PIPELINE);
    for (size_t id = 0; id < g->n; id++) {
        char num[32];
        snprintf(num, sizeof num, "\": %zu%s\n", id, id + 1 < g->n ? "," : "");
        pi2_sb_str(js, "      \"");
        put_escaped(js, gv_piece(g, (int32_t)id), g->len[id]);
        pi2_sb_str(js, num);
    }
    pi2_sb_str(js, "    },\n    \"merges\": [\n");
    for (size_t i = 0; i < g->nm; i++) {
        pi2_sb_str(js, "      \"");
        put_escaped(js, gv_piece(g, g->ma[i]), g->len[g->ma[i]]);
        pi2_sb_str(js, " ");
        put_escaped(js, gv_piece(g, g->mb[i]), g->len[g->mb[i]]);
        pi2_sb_str(js, i + 1 < g->nm ? "\",\n" : "\"\n");
    }
    pi2_sb_str(js, "    ]\n  }\n}\n");
}

static void gv_free(gen_vocab *g)
{
    free(g->arena.p);
    free(g->off);
    free(g->len);
    free(g->htab);
    free(g->ma);
    free(g->mb);
}

/* Build the vocabulary of V pieces and its JSON text into *js. */
static int build(pi2_sbuf *js, size_t V, int n_added, const char *const *added, uint64_t seed)
{
    gen_vocab g = {.cap = V};
    size_t hcap = 16;
    while (hcap < V * 2)
        hcap *= 2;
    g.hmask = hcap - 1;
    g.off = pi2_malloc_array(V, sizeof *g.off);
    g.len = pi2_malloc_array(V, sizeof *g.len);
    g.htab = pi2_malloc_array(hcap, sizeof *g.htab);
    g.ma = pi2_malloc_array(V, sizeof *g.ma);
    g.mb = pi2_malloc_array(V, sizeof *g.mb);
    int rc = g.off && g.len && g.htab && g.ma && g.mb ? 0 : PI2_ENOMEM;
    if (!rc) {
        memset(g.htab, 0xff, hcap * sizeof *g.htab);
        if (!(rc = gv_base(&g)) && !(rc = gv_words(&g)) && !(rc = gv_filler(&g, seed))) {
            put_json(js, &g, n_added, added);
            rc = js->failed ? PI2_ENOMEM : 0;
        }
    }
    gv_free(&g);
    return rc;
}

int pi2_tok_write_synthetic(const char *path, int vocab_size, uint64_t seed, pi2_err *err)
{
    return pi2_tok_write_synthetic_added(path, vocab_size, 0, NULL, seed, err);
}

int pi2_tok_write_synthetic_added(const char *path, int vocab_size, int n_added, const char *const *added,
                                  uint64_t seed, pi2_err *err)
{
    if (n_added < 0 || n_added > SYNTH_MAX_ADDED || (n_added > 0 && !added))
        return pi2_err_set(err, PI2_EINVAL, "%s: %d added tokens (0..1024)", path, n_added);
    for (int i = 0; i < n_added; i++)
        if (!added[i] || !added[i][0] || strlen(added[i]) > 64)
            return pi2_err_set(err, PI2_EINVAL, "%s: added token %d is empty or longer than 64 bytes", path, i);
    if (!path)
        return pi2_err_set(err, PI2_EINVAL, "synthetic tokenizer: no path");
    if (vocab_size < 300 || (unsigned)vocab_size > SYNTH_MAX_VOCAB)
        return pi2_err_set(err, PI2_EINVAL, "%s: synthetic vocab size %d is out of range (300..%u)", path, vocab_size,
                           SYNTH_MAX_VOCAB);
    pi2_sbuf js = {0};
    int rc = build(&js, (size_t)vocab_size, n_added, added, seed);
    if (rc) {
        free(js.p);
        return pi2_err_set(err, rc, "%s: cannot build synthetic tokenizer (%s)", path, pi2_strerror(rc));
    }
    pi2_afile *f;
    rc = pi2_afile_open(&f, path, err);
    if (!rc) {
        rc = pi2_afile_write(f, js.p, js.len, err);
        if (rc)
            pi2_afile_abort(f);
        else
            rc = pi2_afile_commit(f, err);
    }
    free(js.p);
    return rc;
}
