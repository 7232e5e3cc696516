/* Synthetic tokenizer.json writer (contract in convert/synth_tok.h). */
#include "convert/synth_tok.h"
#include "formats/tokenizer_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
