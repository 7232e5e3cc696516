/* Tests for formats/tokenizer: golden encodings of the shared tinystories
 * models, handcrafted tokenizer.json files for each supported component,
 * streaming = whole decode, the synthetic writer, and broken files. */
#include "tests/testutil.h"

#include "convert/synth_tok.h"
#include "formats/tokenizer.h"

#include <jansson.h>

/* ---- helpers ---- */

static pi2_tok *load_str(const char *json)
{
    pi2_tok *t = NULL;
    pi2_err e = {0};
    int rc = pi2_tok_load_mem(&t, json, strlen(json), "test.json", &e);
    if (rc)
        fprintf(stderr, "load failed: %s\n", e.msg);
    assert_int_equal(rc, 0);
    assert_non_null(t);
    return t;
}

static size_t encode(const pi2_tok *t, const char *text, int32_t *out, size_t cap)
{
    int32_t *ids = NULL;
    size_t n = 0;
    pi2_err e = {0};
    int rc = pi2_tok_encode(t, text, strlen(text), &ids, &n, &e);
    if (rc)
        fprintf(stderr, "encode failed: %s\n", e.msg);
    assert_int_equal(rc, 0);
    assert_non_null(ids);
    assert_true(n <= cap);
    memcpy(out, ids, n * sizeof *ids);
    free(ids);
    return n;
}

#define ASSERT_IDS(t, text, ...)                                                           \
    do {                                                                                   \
        const int32_t want_[] = {__VA_ARGS__};                                             \
        int32_t got_[256];                                                                 \
        size_t n_ = encode((t), (text), got_, 256);                                        \
        size_t wn_ = sizeof want_ / sizeof *want_;                                         \
        if (n_ != wn_ || memcmp(got_, want_, n_ * sizeof *got_)) {                         \
            fprintf(stderr, "encode(\"%s\"): got", (text));                                \
            for (size_t i_ = 0; i_ < n_; i_++)                                             \
                fprintf(stderr, " %d", got_[i_]);                                          \
            fprintf(stderr, "\n");                                                         \
        }                                                                                  \
        assert_int_equal(n_, wn_);                                                         \
        assert_memory_equal(got_, want_, n_ * sizeof *got_);                               \
    } while (0)

#define ASSERT_NO_IDS(t, text)                                 \
    do {                                                       \
        int32_t got_[4];                                       \
        assert_int_equal(encode((t), (text), got_, 4), 0);     \
    } while (0)

static char *decode(const pi2_tok *t, const int32_t *ids, size_t n, bool skip)
{
    char *s = NULL;
    pi2_err e = {0};
    assert_int_equal(pi2_tok_decode(t, ids, n, skip, &s, &e), 0);
    assert_non_null(s);
    return s;
}

/* Push ids one by one, concatenate everything returned. Checks each push
 * returns whole UTF-8 characters. */
static char *stream_decode(const pi2_tok *t, const int32_t *ids, size_t n, bool skip)
{
    pi2_tok_stream *s = NULL;
    pi2_err e = {0};
    assert_int_equal(pi2_tok_stream_create(&s, t, skip, &e), 0);
    size_t cap = 1024, len = 0;
    char *acc = malloc(cap);
    assert_non_null(acc);
    for (size_t i = 0; i <= n; i++) {
        const char *b;
        size_t bl;
        if (i < n)
            assert_int_equal(pi2_tok_stream_push(s, ids[i], &b, &bl, &e), 0);
        else
            assert_int_equal(pi2_tok_stream_flush(s, &b, &bl, &e), 0);
        /* a chunk never ends inside a multi-byte character */
        if (bl) {
            size_t k = bl;
            while (k > 0 && ((unsigned char)b[k - 1] & 0xC0) == 0x80)
                k--;
            assert_true(k > 0);
            unsigned char lead = (unsigned char)b[k - 1];
            size_t need = lead < 0x80 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
            assert_int_equal(bl - (k - 1), need);
        }
        while (len + bl + 1 > cap) {
            cap *= 2;
            acc = realloc(acc, cap);
            assert_non_null(acc);
        }
        memcpy(acc + len, b, bl);
        len += bl;
    }
    acc[len] = 0;
    pi2_tok_stream_free(s);
    return acc;
}

static void assert_roundtrip_decode(const pi2_tok *t, const int32_t *ids, size_t n, bool skip)
{
    char *whole = decode(t, ids, n, skip);
    char *streamed = stream_decode(t, ids, n, skip);
    if (strcmp(whole, streamed)) {
        fprintf(stderr, "whole   : [%s]\nstreamed: [%s]\nids:", whole, streamed);
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
    }
    assert_string_equal(whole, streamed);
    free(whole);
    free(streamed);
}

static void expect_load_error(const char *json, size_t len, int code)
{
    pi2_tok *t = (pi2_tok *)0x1;
    pi2_err e = {0};
    int rc = pi2_tok_load_mem(&t, json, len, "bad.json", &e);
    if (rc != code)
        fprintf(stderr, "expected %d, got %d (%s) for: %.200s\n", code, rc, e.msg, json);
    assert_int_equal(rc, code);
    assert_null(t);
    assert_int_equal(e.code, code);
    assert_non_null(strstr(e.msg, "bad.json"));
    assert_null(strchr(e.msg, '\n'));
}

/* ---- golden: the shared tinystories models ---- */

static void golden_model(const char *name)
{
    char dir[4096], path[4200];
    PI2T_SHARED_MODEL(dir, name);
    pi2_tok *t = NULL;
    pi2_err e = {0};
    int rc = pi2_tok_load(&t, dir, &e);
    if (rc)
        fprintf(stderr, "%s\n", e.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(pi2_tok_vocab_size(t), 2048);
    assert_int_equal(pi2_tok_bos(t), 1);
    assert_int_equal(pi2_tok_eos(t), 2);
    assert_int_equal(pi2_tok_unk(t), 0);
    assert_true(pi2_tok_is_special(t, 1));
    assert_false(pi2_tok_is_special(t, 3));
    assert_string_equal(pi2_tok_piece(t, 80), "\xE2\x96\x81");
    assert_int_equal(pi2_tok_find(t, "\xE2\x96\x81"), 80);
    assert_null(pi2_tok_piece(t, 2048));
    assert_null(pi2_tok_piece(t, -1));

    snprintf(path, sizeof path, "%s/EXPECTED.json", dir);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    assert_non_null(root);
    json_t *cases = json_object_get(root, "cases");
    assert_true(json_array_size(cases) > 0);
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *c = json_array_get(cases, i);
        const char *prompt = json_string_value(json_object_get(c, "prompt"));
        json_t *pids = json_object_get(c, "prompt_ids");
        json_t *gids = json_object_get(c, "generated_ids");
        const char *gtext = json_string_value(json_object_get(c, "generated_text"));
        assert_non_null(prompt);
        assert_non_null(gtext);

        int32_t *ids = NULL;
        size_t n = 0;
        assert_int_equal(pi2_tok_encode(t, prompt, strlen(prompt), &ids, &n, &e), 0);
        assert_int_equal(n, json_array_size(pids));
        for (size_t k = 0; k < n; k++)
            assert_int_equal(ids[k], json_integer_value(json_array_get(pids, k)));
        free(ids);

        size_t gn = json_array_size(gids);
        int32_t *g = calloc(gn + 1, sizeof *g);
        assert_non_null(g);
        for (size_t k = 0; k < gn; k++)
            g[k] = (int32_t)json_integer_value(json_array_get(gids, k));
        char *text = decode(t, g, gn, false);
        assert_string_equal(text, gtext);
        free(text);
        char *st = stream_decode(t, g, gn, false);
        assert_string_equal(st, gtext);
        free(st);
        free(g);
    }
    json_decref(root);
    pi2_tok_free(t);
}

static void test_golden_tinystories(void **state)
{
    (void)state;
    golden_model("tinystories-656k");
}

static void test_golden_tinystories_drelu(void **state)
{
    (void)state;
    golden_model("tinystories-656k-drelu");
}

/* ---- synthetic ---- */

static void test_synthetic(void **state)
{
    (void)state;
    char dir[64], path[128];
    pi2t_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    static const int sizes[] = {300, 1000, 32000, 128256};
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        pi2_err e = {0};
        double t0 = pi2_now();
        assert_int_equal(pi2_tok_write_synthetic(path, sizes[si], 42, &e), 0);
        pi2_tok *t = NULL;
        int rc = pi2_tok_load(&t, dir, &e);
        if (rc)
            fprintf(stderr, "%s\n", e.msg);
        assert_int_equal(rc, 0);
        assert_true(pi2_now() - t0 < 30.0); /* generous: catches only quadratic blow-ups */
        assert_int_equal(pi2_tok_vocab_size(t), sizes[si]);
        assert_int_equal(pi2_tok_bos(t), 1);
        assert_int_equal(pi2_tok_eos(t), 2);
        assert_int_equal(pi2_tok_unk(t), 0);
        assert_int_equal(pi2_tok_find(t, "<0x00>"), 3);
        assert_int_equal(pi2_tok_find(t, "<0xFF>"), 258);
        assert_int_equal(pi2_tok_find(t, "\xE2\x96\x81"), 259);

        static const char *const texts[] = {
            "Once upon a time, there was a little girl named Lily.",
            "Hello, World! 123\n\tTabs and\nnewlines.",
            "  leading spaces and trailing  ",
            "caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80 emoji",
            "",
            "x",
        };
        for (size_t k = 0; k < sizeof texts / sizeof *texts; k++) {
            int32_t *ids = NULL;
            size_t n = 0;
            assert_int_equal(pi2_tok_encode(t, texts[k], strlen(texts[k]), &ids, &n, &e), 0);
            char *back = decode(t, ids, n, false);
            assert_string_equal(back, texts[k]);
            free(back);
            assert_roundtrip_decode(t, ids, n, false);
            free(ids);
        }
        if (sizes[si] >= 1000) {
            static const char *const words[] = {"the", "cat", "and", "little", "friend", "because"};
            for (size_t k = 0; k < sizeof words / sizeof *words; k++) {
                char piece[32];
                snprintf(piece, sizeof piece, "\xE2\x96\x81%s", words[k]);
                int32_t id = pi2_tok_find(t, piece);
                assert_true(id > 259);
                int32_t got[8];
                assert_int_equal(encode(t, words[k], got, 8), 1);
                assert_int_equal(got[0], id);
            }
            int32_t got[16];
            size_t n = encode(t, "the cat and the dog", got, 16);
            assert_int_equal(n, 5);
            assert_int_equal(got[0], pi2_tok_find(t, "\xE2\x96\x81the"));
            assert_int_equal(got[3], got[0]);
        }
        pi2_tok_free(t);
    }
    /* deterministic from the seed */
    char p2[160];
    snprintf(p2, sizeof p2, "%s/b.json", dir);
    pi2_err e = {0};
    assert_int_equal(pi2_tok_write_synthetic(path, 5000, 7, &e), 0);
    assert_int_equal(pi2_tok_write_synthetic(p2, 5000, 7, &e), 0);
    char *a = NULL, *b = NULL;
    size_t al = 0, bl = 0;
    assert_int_equal(pi2_read_file(path, 1 << 26, &a, &al, &e), 0);
    assert_int_equal(pi2_read_file(p2, 1 << 26, &b, &bl, &e), 0);
    assert_int_equal(al, bl);
    assert_memory_equal(a, b, al);
    free(b);
    assert_int_equal(pi2_tok_write_synthetic(p2, 5000, 8, &e), 0);
    assert_int_equal(pi2_read_file(p2, 1 << 26, &b, &bl, &e), 0);
    assert_true(bl != al || memcmp(a, b, al) != 0); /* another seed, other filler merges */
    free(a);
    free(b);
    /* bad sizes */
    pi2_err_clear(&e);
    assert_int_equal(pi2_tok_write_synthetic(path, 299, 1, &e), PI2_EINVAL);
    assert_non_null(strstr(e.msg, path));
    pi2t_rmtree(dir);
}

/* Special tokens added after the vocabulary, as ChatML's after Llama's. */
static void test_synthetic_added(void **state)
{
    (void)state;
    char dir[64], path[128];
    pi2t_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    static const char *const added[] = {"<|im_end|>", "<|im_start|>", "q\"b\\s\n"};
    pi2_err e = {0};
    assert_int_equal(pi2_tok_write_synthetic_added(path, 1000, 3, added, 5, &e), 0);
    pi2_tok *t = NULL;
    assert_int_equal(pi2_tok_load(&t, dir, &e), 0);
    assert_int_equal(pi2_tok_vocab_size(t), 1003);
    for (int i = 0; i < 3; i++) {
        assert_string_equal(pi2_tok_piece(t, 1000 + i), added[i]); /* escaped in the JSON, read back */
        assert_true(pi2_tok_is_special(t, 1000 + i));
    }
    assert_int_equal(pi2_tok_eos(t), 2);
    int32_t got[16];
    size_t n = encode(t, "<|im_start|>hi<|im_end|>", got, 16);
    assert_true(n >= 3);
    assert_int_equal(got[0], 1001);
    assert_int_equal(got[n - 1], 1000);
    char *back = decode(t, got, n, true);
    assert_string_equal(back, "hi");
    free(back);
    pi2_tok_free(t);
    /* the vocabulary is the one written without them */
    char p2[160], *a = NULL, *b = NULL;
    size_t al = 0, bl = 0;
    snprintf(p2, sizeof p2, "%s/b.json", dir);
    assert_int_equal(pi2_tok_write_synthetic(p2, 1000, 5, &e), 0);
    assert_int_equal(pi2_read_file(path, 1 << 26, &a, &al, &e), 0);
    assert_int_equal(pi2_read_file(p2, 1 << 26, &b, &bl, &e), 0);
    const char *va = strstr(a, "\"normalizer\""), *vb = strstr(b, "\"normalizer\"");
    assert_non_null(va);
    assert_non_null(vb);
    assert_string_equal(va, vb);
    free(a);
    free(b);
    /* bad lists */
    static const char *const empty[] = {""};
    static const char *const nul[] = {NULL};
    char long_tok[80];
    memset(long_tok, 'x', 65);
    long_tok[65] = 0;
    const char *const too_long[] = {long_tok};
    assert_int_equal(pi2_tok_write_synthetic_added(p2, 1000, 1, empty, 5, &e), PI2_EINVAL);
    assert_int_equal(pi2_tok_write_synthetic_added(p2, 1000, 1, nul, 5, &e), PI2_EINVAL);
    assert_int_equal(pi2_tok_write_synthetic_added(p2, 1000, 1, too_long, 5, &e), PI2_EINVAL);
    assert_int_equal(pi2_tok_write_synthetic_added(p2, 1000, 1, NULL, 5, &e), PI2_EINVAL);
    assert_int_equal(pi2_tok_write_synthetic_added(p2, 1000, 1025, added, 5, &e), PI2_EINVAL);
    assert_int_equal(pi2_tok_write_synthetic_added(p2, 1000, -1, added, 5, &e), PI2_EINVAL);
    pi2t_rmtree(dir);
}

static void test_synthetic_errors(void **state)
{
    (void)state;
    char dir[64], path[128];
    pi2t_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    pi2_err e = {0};
    /* disk full part way: an error, and no file (not even a temp file) */
    pi2_afile_fail_after(100);
    int rc = pi2_tok_write_synthetic(path, 1000, 1, &e);
    pi2_afile_fail_after(-1);
    assert_int_equal(rc, PI2_ENOSPC);
    assert_false(pi2t_exists(path));
    char cmd[256];
    snprintf(cmd, sizeof cmd, "test -z \"$(ls -A '%s')\"", dir);
    assert_int_equal(system(cmd), 0);
    /* a directory that does not exist */
    char bad[160];
    snprintf(bad, sizeof bad, "%s/no/such/dir/tokenizer.json", dir);
    pi2_err_clear(&e);
    rc = pi2_tok_write_synthetic(bad, 1000, 1, &e);
    assert_true(rc < 0);
    assert_non_null(strstr(e.msg, "no/such/dir"));
    pi2_err_clear(&e);
    assert_int_equal(pi2_tok_write_synthetic(NULL, 1000, 1, &e), PI2_EINVAL);
    pi2_err_clear(&e);
    assert_int_equal(pi2_tok_write_synthetic(path, 1 << 30, 1, &e), PI2_EINVAL);
    assert_false(pi2t_exists(path));
    pi2t_rmtree(dir);
}

/* ---- handcrafted files ---- */

#define SP "\xE2\x96\x81" /* "▁" */

/* Merges by rank: vocab a b c d cd bc ab abcd aa aaaa. */
static const char *RANK_JSON =
    "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, \"d\": 3, \"cd\": 4, \"bc\": 5, "
    "\"ab\": 6, \"abcd\": 7, \"aa\": 8, \"aaaa\": 9}, \"merges\": [\"c d\", \"b c\", \"a b\", \"ab cd\", \"a a\", "
    "\"aa aa\"]}}";

static void test_merges_by_rank(void **state)
{
    (void)state;
    pi2_tok *t = load_str(RANK_JSON);
    assert_int_equal(pi2_tok_vocab_size(t), 10);
    assert_int_equal(pi2_tok_bos(t), -1);
    assert_int_equal(pi2_tok_eos(t), -1);
    assert_int_equal(pi2_tok_unk(t), -1);
    ASSERT_IDS(t, "abcd", 7);
    ASSERT_IDS(t, "abc", 0, 5); /* "b c" (rank 1) beats "a b" (rank 2) though it comes later */
    ASSERT_IDS(t, "bcd", 1, 4); /* "c d" (rank 0) first, then "b c" no longer applies */
    ASSERT_IDS(t, "aaaaa", 9, 0); /* equal ranks: leftmost first */
    ASSERT_IDS(t, "aaaa", 9);
    ASSERT_IDS(t, "dcba", 3, 2, 1, 0);
    ASSERT_IDS(t, "abcdabcd", 7, 7);
    ASSERT_NO_IDS(t, "");
    ASSERT_NO_IDS(t, "xyz"); /* no unk token: unknown characters are dropped, as HF does */
    /* no decoder: pieces joined with spaces */
    const int32_t ids[] = {7, 0, 5};
    char *s = decode(t, ids, 3, false);
    assert_string_equal(s, "abcd a bc");
    free(s);
    assert_roundtrip_decode(t, ids, 3, false);
    pi2_tok_free(t);
}

/* Both merges syntaxes ("a b" and ["a", "b"]) give the same tokenizer. */
static void test_merges_pair_syntax(void **state)
{
    (void)state;
    pi2_tok *a = load_str(RANK_JSON);
    pi2_tok *b = load_str("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, \"d\": 3, \"cd\": 4, "
                          "\"bc\": 5, \"ab\": 6, \"abcd\": 7, \"aa\": 8, \"aaaa\": 9}, \"merges\": [[\"c\", \"d\"], "
                          "[\"b\", \"c\"], [\"a\", \"b\"], [\"ab\", \"cd\"], [\"a\", \"a\"], [\"aa\", \"aa\"]]}}");
    static const char *const texts[] = {"abcd", "abc", "bcd", "aaaaa", "dcbaabcdaaab"};
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        int32_t x[64], y[64];
        size_t nx = encode(a, texts[i], x, 64), ny = encode(b, texts[i], y, 64);
        assert_int_equal(nx, ny);
        assert_memory_equal(x, y, nx * sizeof *x);
    }
    ASSERT_IDS(b, "abc", 0, 5);
    /* "#version" lines of old merges.txt-style lists are skipped */
    pi2_tok *c = load_str("{\"model\": {\"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"#version: 0.2\", "
                          "\"a b\"]}}");
    ASSERT_IDS(c, "ab", 2);
    pi2_tok_free(a);
    pi2_tok_free(b);
    pi2_tok_free(c);
}

/* A Llama-style tokenizer built with jansson: <unk> <s> </s>, optional
 * byte tokens, "▁" h i e l o ▁h ▁hi lo ▁he ll ▁hell ▁hello. */
static const char *const BF_WORDS[] = {SP, "h", "i", "e", "l", "o", SP "h", SP "hi", "lo", SP "he", "ll", SP "hell",
                                       SP "hello"};

static json_t *added_tok(int id, const char *content, bool special, bool normalized)
{
    return json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", id, "content", content, "single_word", 0, "lstrip", 0,
                     "rstrip", 0, "normalized", normalized, "special", special);
}

static json_t *llama_decoder(void)
{
    return json_pack("{s:s,s:[{s:s,s:{s:s},s:s},{s:s},{s:s},{s:s,s:s,s:i,s:i}]}", "type", "Sequence", "decoders",
                     "type", "Replace", "pattern", "String", SP, "content", " ", "type", "ByteFallback", "type", "Fuse",
                     "type", "Strip", "content", " ", "start", 1, "stop", 0);
}

static json_t *llama_normalizer(void)
{
    return json_pack("{s:s,s:[{s:s,s:s},{s:s,s:{s:s},s:s}]}", "type", "Sequence", "normalizers", "type", "Prepend",
                     "prepend", SP, "type", "Replace", "pattern", "String", " ", "content", SP);
}

static json_t *bf_json(bool bytes)
{
    json_t *vocab = json_object();
    int id = 0;
    json_object_set_new(vocab, "<unk>", json_integer(id++));
    json_object_set_new(vocab, "<s>", json_integer(id++));
    json_object_set_new(vocab, "</s>", json_integer(id++));
    for (int b = 0; bytes && b < 256; b++) {
        char code[8];
        snprintf(code, sizeof code, "<0x%02X>", b);
        json_object_set_new(vocab, code, json_integer(id++));
    }
    for (size_t i = 0; i < sizeof BF_WORDS / sizeof *BF_WORDS; i++)
        json_object_set_new(vocab, BF_WORDS[i], json_integer(id++));
    json_t *merges = json_pack("[[s,s],[s,s],[s,s],[s,s],[s,s],[s,s]]", SP, "h", SP "h", "i", SP "h", "e", "l", "l",
                               SP "he", "ll", SP "hell", "o");
    json_t *model = json_pack("{s:s,s:s,s:b,s:b,s:o,s:o}", "type", "BPE", "unk_token", "<unk>", "byte_fallback", bytes,
                              "fuse_unk", 1, "vocab", vocab, "merges", merges);
    json_t *added = json_pack("[o,o,o]", added_tok(0, "<unk>", true, false), added_tok(1, "<s>", true, false),
                              added_tok(2, "</s>", true, false));
    return json_pack("{s:o,s:o,s:n,s:o,s:o}", "added_tokens", added, "normalizer", llama_normalizer(), "pre_tokenizer",
                     "decoder", llama_decoder(), "model", model);
}

static pi2_tok *load_json_obj(json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT);
    assert_non_null(s);
    pi2_tok *t = load_str(s);
    free(s);
    json_decref(j);
    return t;
}

/* ids in the byte-fallback tokenizer */
enum { B_SP = 259, B_H = 260, B_I = 261, B_SPHI = 266, B_SPHELLO = 271 };
#define BYTE(x) (3 + (x))

static void test_byte_fallback(void **state)
{
    (void)state;
    pi2_tok *t = load_json_obj(bf_json(true));
    assert_int_equal(pi2_tok_vocab_size(t), 272);
    assert_int_equal(pi2_tok_bos(t), 1);
    assert_int_equal(pi2_tok_eos(t), 2);
    assert_int_equal(pi2_tok_find(t, SP "hi"), B_SPHI);
    ASSERT_IDS(t, "hi \xF0\x9F\x98\x80", B_SPHI, B_SP, BYTE(0xF0), BYTE(0x9F), BYTE(0x98), BYTE(0x80)); /* emoji */
    ASSERT_IDS(t, "\xE4\xB8\xAD hi", B_SP, BYTE(0xE4), BYTE(0xB8), BYTE(0xAD), B_SPHI);                  /* CJK */
    ASSERT_IDS(t, "\n", B_SP, BYTE(0x0A));
    ASSERT_IDS(t, "\xC3\xA9", B_SP, BYTE(0xC3), BYTE(0xA9));
    ASSERT_IDS(t, "hi  hello", B_SPHI, B_SP, B_SPHELLO);
    /* invalid UTF-8 goes through byte fallback too */
    ASSERT_IDS(t, "hi\xFF", B_SPHI, BYTE(0xFF));

    /* decode: byte runs become text; invalid runs one U+FFFD per byte */
    static const struct {
        int32_t ids[8];
        size_t n;
        const char *want;
    } dec[] = {
        {{B_SPHI, BYTE(0xF0), BYTE(0x9F), BYTE(0x98), BYTE(0x80)}, 5, "hi\xF0\x9F\x98\x80"},
        {{BYTE(0xE4), BYTE(0xB8), B_H}, 3, "\xEF\xBF\xBD\xEF\xBF\xBDh"},
        {{BYTE(0xE4), BYTE(0xB8), BYTE(0xAD), BYTE(0x61)}, 4, "\xE4\xB8\xAD" "a"},
        {{BYTE(0x61), BYTE(0xE4), BYTE(0xB8)}, 3, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
        {{B_SP, B_SP, B_H}, 3, " h"}, /* Strip removes one leading space of the whole text */
        {{1, B_SPHI, 2}, 3, "<s> hi</s>"},
    };
    for (size_t i = 0; i < sizeof dec / sizeof *dec; i++) {
        char *s = decode(t, dec[i].ids, dec[i].n, false);
        assert_string_equal(s, dec[i].want);
        free(s);
        assert_roundtrip_decode(t, dec[i].ids, dec[i].n, false);
    }
    const int32_t sp[] = {1, B_SPHI, 2};
    char *s = decode(t, sp, 3, true);
    assert_string_equal(s, "hi");
    free(s);
    assert_roundtrip_decode(t, sp, 3, true);

    /* "<0x00>" gives a NUL byte: the _len variant keeps it */
    const int32_t nul[] = {B_SPHI, BYTE(0), B_H};
    size_t len = 0;
    pi2_err e = {0};
    assert_int_equal(pi2_tok_decode_len(t, nul, 3, false, &s, &len, &e), 0);
    assert_int_equal(len, 4);
    assert_memory_equal(s, "hi\0h", 4);
    free(s);
    pi2_tok_free(t);
}

static void test_unk(void **state)
{
    (void)state;
    /* no byte tokens: ▁=3 h=4 i=5 ▁hi=10 */
    json_t *j = bf_json(false);
    pi2_tok *t = load_json_obj(json_deep_copy(j));
    assert_int_equal(pi2_tok_unk(t), 0);
    ASSERT_IDS(t, "hi \xF0\x9F\x98\x80\xE4\xB8\xAD" "x hi", 10, 3, 0, 10); /* fused */
    ASSERT_IDS(t, "xyz", 3, 0);
    ASSERT_IDS(t, "hixyhi", 10, 0, 4, 5);
    pi2_tok_free(t);

    json_object_set_new(json_object_get(j, "model"), "fuse_unk", json_false());
    t = load_json_obj(json_deep_copy(j));
    ASSERT_IDS(t, "hi \xF0\x9F\x98\x80\xE4\xB8\xAD" "x hi", 10, 3, 0, 0, 0, 10);
    ASSERT_IDS(t, "xyz", 3, 0, 0, 0);
    ASSERT_IDS(t, "hixyhi", 10, 0, 0, 4, 5);
    pi2_tok_free(t);

    json_object_set_new(json_object_get(j, "model"), "unk_token", json_null());
    t = load_json_obj(json_deep_copy(j));
    assert_int_equal(pi2_tok_unk(t), -1);
    ASSERT_IDS(t, "hi \xF0\x9F\x98\x80\xE4\xB8\xAD" "x hi", 10, 3, 10);
    ASSERT_IDS(t, "xyz", 3);
    pi2_tok_free(t);

    /* an unk_token missing from the vocab fails when it is needed, as HF */
    json_object_set_new(json_object_get(j, "model"), "unk_token", json_string("<missing>"));
    t = load_json_obj(j);
    ASSERT_IDS(t, "hi", 10);
    int32_t *ids = (int32_t *)0x1;
    size_t n = 7;
    pi2_err e = {0};
    assert_int_equal(pi2_tok_encode(t, "hix", 3, &ids, &n, &e), PI2_ENOTFOUND);
    assert_null(ids);
    assert_int_equal(n, 0);
    assert_non_null(strstr(e.msg, "<missing>"));
    pi2_tok_free(t);
}

/* A char whose bytes are only partly in the vocab goes to unk; as in HF a
 * pending unk is not flushed by a later byte-fallback character. */
static void test_partial_byte_tokens(void **state)
{
    (void)state;
    json_t *j = bf_json(true);
    json_t *vocab = json_object_get(json_object_get(j, "model"), "vocab");
    json_t *v = json_incref(json_object_get(vocab, "<0xA9>"));
    json_object_del(vocab, "<0xA9>");
    json_object_set_new(vocab, "<no-A9>", v);
    pi2_tok *t = load_json_obj(j);
    /* "é" = C3 A9: A9 missing -> unk; then "中" by bytes; the unk comes after */
    ASSERT_IDS(t, "h\xC3\xA9\xE4\xB8\xAD" "h", 265, BYTE(0xE4), BYTE(0xB8), BYTE(0xAD), 0, B_H);
    pi2_tok_free(t);
}

static void test_added_tokens(void **state)
{
    (void)state;
    pi2_tok *t = load_json_obj(bf_json(true));
    /* normalized:false tokens match in the raw text; the normalizer's
     * Prepend then applies to each piece between them */
    ASSERT_IDS(t, "hello<s>hi", B_SPHELLO, 1, B_SPHI);
    ASSERT_IDS(t, "<s>hi", 1, B_SPHI);
    ASSERT_IDS(t, "hi</s>", B_SPHI, 2);
    ASSERT_IDS(t, "<s></s><unk>", 1, 2, 0);
    ASSERT_IDS(t, "<s", B_SP, BYTE('<'), BYTE('s'));
    assert_true(pi2_tok_is_special(t, 1));
    assert_false(pi2_tok_is_special(t, B_SPHI));
    assert_false(pi2_tok_is_special(t, -1));
    pi2_tok_free(t);

    /* added tokens outside the vocab take the next ids; lstrip/rstrip eat
     * whitespace; longest match wins */
    json_t *j = bf_json(true);
    json_object_set_new(j, "normalizer", json_null());
    json_object_set_new(j, "pre_tokenizer",
                        json_pack("{s:s,s:s,s:s,s:b}", "type", "Metaspace", "replacement", SP, "prepend_scheme",
                                  "first", "split", 0));
    json_t *added = json_object_get(j, "added_tokens");
    json_t *a = added_tok(272, "<|im_start|>", true, false);
    json_object_set_new(a, "lstrip", json_true());
    json_array_append_new(added, a);
    a = added_tok(273, "<|im_end|>", true, false);
    json_object_set_new(a, "rstrip", json_true());
    json_array_append_new(added, a);
    json_array_append_new(added, added_tok(274, "<|im", false, false));
    json_array_append_new(added, added_tok(275, "hello world", false, false));
    t = load_json_obj(j);
    assert_int_equal(pi2_tok_vocab_size(t), 276);
    assert_string_equal(pi2_tok_piece(t, 273), "<|im_end|>");
    assert_int_equal(pi2_tok_find(t, "<|im_end|>"), 273);
    ASSERT_IDS(t, "hi  <|im_start|>hi", B_SPHI, 272, B_H, B_I);
    ASSERT_IDS(t, "hi<|im_end|>  hi", B_SPHI, 273, B_H, B_I);
    ASSERT_IDS(t, "<|imhi", 274, B_H, B_I);
    ASSERT_IDS(t, "<|im_x", 274, BYTE('_'), BYTE('x')); /* a longer token that fails part way */
    ASSERT_IDS(t, "<|im_start|><|im_end|>", 272, 273);
    ASSERT_IDS(t, "say hello world!", B_SP, BYTE('s'), BYTE('a'), BYTE('y'), B_SP, 275, BYTE('!'));
    const int32_t ids[] = {272, B_SPHI, 273, 275, 274};
    char *s = decode(t, ids, 5, false);
    assert_string_equal(s, "<|im_start|> hi<|im_end|>hello world<|im");
    free(s);
    s = decode(t, ids, 5, true);
    assert_string_equal(s, "hihello world<|im");
    free(s);
    assert_roundtrip_decode(t, ids, 5, false);
    assert_roundtrip_decode(t, ids, 5, true);
    pi2_tok_free(t);
}

/* The tinystories files mark their special tokens "normalized": true: HF
 * matches them in the normalized text, as "▁<|end_story|>". */
static void test_normalized_added_tokens(void **state)
{
    (void)state;
    char dir[4096];
    PI2T_SHARED_MODEL(dir, "tinystories-656k");
    pi2_tok *t = NULL;
    pi2_err e = {0};
    assert_int_equal(pi2_tok_load(&t, dir, &e), 0);
    ASSERT_IDS(t, "Hello <|end_story|> world <unk>", 80, 1288, 67, 2, 80, 410, 555, 0);
    ASSERT_IDS(t, "<|start_story|>Once", 1, 147, 682);
    pi2_tok_free(t);
}

static pi2_tok *bf_meta(const char *scheme, bool split)
{
    json_t *j = bf_json(true);
    json_object_set_new(j, "normalizer", json_null());
    json_object_set_new(j, "pre_tokenizer", json_pack("{s:s,s:s,s:s,s:b}", "type", "Metaspace", "replacement", SP,
                                                      "prepend_scheme", scheme, "split", split));
    return load_json_obj(j);
}

static void test_metaspace(void **state)
{
    (void)state;
    for (int split = 0; split < 2; split++) {
        pi2_tok *t = bf_meta("first", split);
        ASSERT_IDS(t, "hi hello", B_SPHI, B_SPHELLO);
        ASSERT_IDS(t, "<s>hi hello", 1, B_H, B_I, B_SPHELLO); /* not the first piece: no "▁" */
        ASSERT_IDS(t, " hi", B_SPHI);
        ASSERT_IDS(t, "hi<s> hello", B_SPHI, 1, B_SPHELLO);
        ASSERT_IDS(t, "hello  hi", B_SPHELLO, B_SP, B_SPHI);
        pi2_tok_free(t);

        t = bf_meta("always", split);
        ASSERT_IDS(t, "hi hello", B_SPHI, B_SPHELLO);
        ASSERT_IDS(t, "<s>hi hello", 1, B_SPHI, B_SPHELLO);
        ASSERT_IDS(t, " hi", B_SPHI);
        ASSERT_IDS(t, "hi<s> hello", B_SPHI, 1, B_SPHELLO);
        ASSERT_IDS(t, "hello  hi", B_SPHELLO, B_SP, B_SPHI);
        pi2_tok_free(t);

        t = bf_meta("never", split);
        ASSERT_IDS(t, "hi hello", B_H, B_I, B_SPHELLO);
        ASSERT_IDS(t, "<s>hi hello", 1, B_H, B_I, B_SPHELLO);
        ASSERT_IDS(t, " hi", B_SPHI);
        ASSERT_IDS(t, "hi<s> hello", B_H, B_I, 1, B_SPHELLO);
        ASSERT_IDS(t, "hello  hi", B_H, 262, 269, 264, B_SP, B_SPHI);
        pi2_tok_free(t);
    }
    /* Legacy spelling: add_prefix_space without prepend_scheme */
    json_t *j = bf_json(true);
    json_object_set_new(j, "normalizer", json_null());
    json_object_set_new(j, "pre_tokenizer", json_pack("{s:s,s:s,s:b}", "type", "Metaspace", "replacement", SP,
                                                      "add_prefix_space", 1));
    pi2_tok *t = load_json_obj(j);
    ASSERT_IDS(t, "<s>hi hello", 1, B_SPHI, B_SPHELLO);
    pi2_tok_free(t);
    /* Sequence of pre-tokenizers */
    j = bf_json(true);
    json_object_set_new(j, "normalizer", json_null());
    json_object_set_new(j, "pre_tokenizer",
                        json_pack("{s:s,s:[{s:s,s:s,s:s,s:b}]}", "type", "Sequence", "pretokenizers", "type",
                                  "Metaspace", "replacement", SP, "prepend_scheme", "first", "split", 1));
    t = load_json_obj(j);
    ASSERT_IDS(t, "hi hello", B_SPHI, B_SPHELLO);
    pi2_tok_free(t);
}

static void test_ignore_merges(void **state)
{
    (void)state;
    static const char *fmt =
        "{\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"x\", \"prepend_scheme\": \"never\"},"
        " \"model\": {\"type\": \"BPE\", \"ignore_merges\": %s, \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, \"d\": 3,"
        " \"cd\": 4, \"bc\": 5, \"ab\": 6, \"abcd\": 7, \"aa\": 8, \"aaaa\": 9, \"bcd\": 10, \"xbcd\": 11, \"x\": 12},"
        " \"merges\": [\"c d\", \"b c\", \"a b\", \"ab cd\", \"a a\", \"aa aa\"]}}";
    char buf[1024];
    snprintf(buf, sizeof buf, fmt, "true");
    pi2_tok *t = load_str(buf);
    ASSERT_IDS(t, "bcd", 10); /* in the vocab: taken whole, though no merge builds it */
    ASSERT_IDS(t, "bcd bcd", 10, 11);
    ASSERT_IDS(t, "abcd", 7);
    ASSERT_IDS(t, "bcda", 1, 4, 0);
    pi2_tok_free(t);
    snprintf(buf, sizeof buf, fmt, "false");
    t = load_str(buf);
    ASSERT_IDS(t, "bcd", 1, 4);
    ASSERT_IDS(t, "bcd bcd", 1, 4, 12, 1, 4);
    pi2_tok_free(t);
}

static pi2_tok *bf_with_decoder(json_t *decoder)
{
    json_t *j = bf_json(true);
    json_object_set_new(j, "decoder", decoder);
    return load_json_obj(j);
}

static void assert_decodes(const pi2_tok *t, const int32_t *ids, size_t n, const char *want)
{
    char *s = decode(t, ids, n, false);
    assert_string_equal(s, want);
    free(s);
    assert_roundtrip_decode(t, ids, n, false);
}

static void test_decoders(void **state)
{
    (void)state;
    const int32_t hihi[] = {B_SPHI, B_SPHI}, sphi[] = {B_SP, B_SPHI}, hhi[] = {B_H, B_SPHI};
    pi2_tok *t = bf_with_decoder(json_pack("{s:s,s:s,s:s,s:b}", "type", "Metaspace", "replacement", SP,
                                           "prepend_scheme", "always", "split", 1));
    assert_decodes(t, hihi, 2, "hi hi");
    assert_decodes(t, sphi, 2, " hi");
    assert_decodes(t, hhi, 2, "h hi");
    pi2_tok_free(t);
    t = bf_with_decoder(json_pack("{s:s,s:s,s:s}", "type", "Metaspace", "replacement", SP, "prepend_scheme", "never"));
    assert_decodes(t, hihi, 2, " hi hi");
    pi2_tok_free(t);

    /* Strip before Fuse applies to every token; after Fuse to the text */
    t = bf_with_decoder(json_pack("{s:s,s:[{s:s,s:{s:s},s:s},{s:s,s:s,s:i,s:i}]}", "type", "Sequence", "decoders",
                                  "type", "Replace", "pattern", "String", SP, "content", " ", "type", "Strip", "content",
                                  " ", "start", 1, "stop", 1));
    const int32_t strip[] = {B_SPHI, B_SPHI, B_SP, B_SP, B_H};
    assert_decodes(t, strip, 5, "hihih");
    pi2_tok_free(t);
    t = bf_with_decoder(json_pack("{s:s,s:[{s:s,s:{s:s},s:s},{s:s},{s:s,s:s,s:i,s:i}]}", "type", "Sequence",
                                  "decoders", "type", "Replace", "pattern", "String", SP, "content", " ", "type",
                                  "Fuse", "type", "Strip", "content", " ", "start", 1, "stop", 1));
    assert_decodes(t, strip, 5, "hi hi  h");
    const int32_t trail[] = {B_SPHI, B_SP, B_SP};
    assert_decodes(t, trail, 3, "hi ");
    pi2_tok_free(t);

    /* no decoder: pieces joined with spaces */
    t = bf_with_decoder(json_null());
    const int32_t nd[] = {B_SPHI, B_H, BYTE(0x41)};
    assert_decodes(t, nd, 3, SP "hi h <0x41>");
    pi2_tok_free(t);

    /* the Llama chain: "Strip the first space" and nothing else */
    t = load_json_obj(bf_json(true));
    assert_decodes(t, hihi, 2, "hi hi");
    assert_decodes(t, sphi, 2, " hi");
    /* out-of-range ids are skipped, as HF does */
    const int32_t bad[] = {-5, B_SPHI, 100000, B_SPHI};
    assert_decodes(t, bad, 4, "hi hi");
    pi2_tok_free(t);
}

/* Push by push: text comes out as soon as it is final. */
static void test_stream_incremental(void **state)
{
    (void)state;
    pi2_tok *t = load_json_obj(bf_json(true));
    pi2_tok_stream *s = NULL;
    pi2_err e = {0};
    assert_int_equal(pi2_tok_stream_create(&s, t, false, &e), 0);
    const char *b;
    size_t n;
    assert_int_equal(pi2_tok_stream_push(s, B_SPHI, &b, &n, &e), 0);
    assert_int_equal(n, 2);
    assert_memory_equal(b, "hi", 2); /* leading space stripped */
    assert_int_equal(pi2_tok_stream_push(s, B_SPHI, &b, &n, &e), 0);
    assert_int_equal(n, 3);
    assert_memory_equal(b, " hi", 3);
    /* a character split over byte tokens is held until its run ends */
    assert_int_equal(pi2_tok_stream_push(s, BYTE(0xE4), &b, &n, &e), 0);
    assert_int_equal(n, 0);
    assert_int_equal(pi2_tok_stream_push(s, BYTE(0xB8), &b, &n, &e), 0);
    assert_int_equal(n, 0);
    assert_int_equal(pi2_tok_stream_push(s, BYTE(0xAD), &b, &n, &e), 0);
    assert_int_equal(n, 0);
    assert_int_equal(pi2_tok_stream_push(s, B_H, &b, &n, &e), 0);
    assert_int_equal(n, 4);
    assert_memory_equal(b, "\xE4\xB8\xAD" "h", 4);
    assert_int_equal(pi2_tok_stream_push(s, BYTE(0xF0), &b, &n, &e), 0);
    assert_int_equal(n, 0);
    assert_int_equal(pi2_tok_stream_flush(s, &b, &n, &e), 0);
    assert_int_equal(n, 3);
    assert_memory_equal(b, "\xEF\xBF\xBD", 3);
    /* after a flush the stream starts over: the first space is stripped again */
    assert_int_equal(pi2_tok_stream_push(s, B_SPHI, &b, &n, &e), 0);
    assert_int_equal(n, 2);
    pi2_tok_stream_free(s);
    pi2_tok_stream_free(NULL);
    pi2_tok_free(t);
}

/* Property: streaming decode == whole decode, on random id sequences that
 * favour byte tokens forming (and breaking) multi-byte characters. */
static void random_stream_checks(const pi2_tok *t, pi2_rng *r, int rounds)
{
    int vs = pi2_tok_vocab_size(t);
    int byte0 = pi2_tok_find(t, "<0x00>");
    static const char *const chars[] = {"\xC3\xA9", "\xE4\xB8\xAD", "\xF0\x9F\x98\x80", "a", "\n"};
    for (int round = 0; round < rounds; round++) {
        int32_t ids[64];
        size_t n = 0, want = pi2_rng_u64(r) % 40;
        while (n < want) {
            uint64_t k = pi2_rng_u64(r) % 10;
            if (k < 4 && byte0 >= 0) {
                const char *c = chars[pi2_rng_u64(r) % 5];
                size_t cl = strlen(c);
                if (pi2_rng_u64(r) % 4 == 0)
                    cl = 1 + pi2_rng_u64(r) % cl; /* truncated character */
                for (size_t i = 0; i < cl && n < 64; i++)
                    ids[n++] = byte0 + (unsigned char)c[i];
            } else if (k == 4) {
                ids[n++] = (int32_t)(pi2_rng_u64(r) % 3); /* specials */
            } else {
                ids[n++] = (int32_t)(pi2_rng_u64(r) % (uint64_t)vs);
            }
        }
        assert_roundtrip_decode(t, ids, n, false);
        assert_roundtrip_decode(t, ids, n, true);
    }
}

static void test_stream_property(void **state)
{
    (void)state;
    pi2_rng r;
    pi2_rng_seed(&r, 1234);
    pi2_tok *t = load_json_obj(bf_json(true));
    random_stream_checks(t, &r, 400);
    pi2_tok_free(t);
    /* decoders where later steps hold text back: Replace/Strip/ByteFallback
     * after Fuse, Strip with stop, Metaspace before and after Fuse */
    json_t *decs[] = {
        json_pack("{s:s,s:[{s:s,s:{s:s},s:s},{s:s,s:s,s:i,s:i},{s:s},{s:s},{s:s,s:{s:s},s:s},"
                  "{s:s,s:s,s:i,s:i},{s:s},{s:s,s:{s:s},s:s}]}",
                  "type", "Sequence", "decoders", "type", "Replace", "pattern", "String", SP, "content", " ", "type",
                  "Strip", "content", " ", "start", 2, "stop", 0, "type", "ByteFallback", "type", "Fuse", "type",
                  "Replace", "pattern", "String", "hi", "content", "X", "type", "Strip", "content", "h", "start", 1,
                  "stop", 2, "type", "ByteFallback", "type", "Replace", "pattern", "String", "  ", "content", "_"),
        json_pack("{s:s,s:[{s:s},{s:s,s:s,s:s}]}", "type", "Sequence", "decoders", "type", "ByteFallback", "type",
                  "Metaspace", "replacement", SP, "prepend_scheme", "always"),
        json_pack("{s:s,s:[{s:s},{s:s,s:s,s:s},{s:s,s:s,s:i,s:i}]}", "type", "Sequence", "decoders", "type", "Fuse",
                  "type", "Metaspace", "replacement", SP, "prepend_scheme", "never", "type", "Strip", "content", " ",
                  "start", 0, "stop", 3),
        json_null(),
    };
    for (size_t i = 0; i < sizeof decs / sizeof *decs; i++) {
        t = bf_with_decoder(decs[i]);
        random_stream_checks(t, &r, 300);
        pi2_tok_free(t);
    }
}

static void test_stream_property_tinystories(void **state)
{
    (void)state;
    char dir[4096];
    PI2T_SHARED_MODEL(dir, "tinystories-656k");
    pi2_tok *t = NULL;
    pi2_err e = {0};
    assert_int_equal(pi2_tok_load(&t, dir, &e), 0);
    pi2_rng r;
    pi2_rng_seed(&r, 4321);
    random_stream_checks(t, &r, 300);
    pi2_tok_free(t);
}

/* A long prompt without a pre-tokenizer is one BPE word: it must not be
 * quadratic. (No timing assertion beyond a very generous bound.) */
static void test_long_input(void **state)
{
    (void)state;
    char dir[64], path[128];
    pi2t_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    pi2_err e = {0};
    assert_int_equal(pi2_tok_write_synthetic(path, 32000, 1, &e), 0);
    pi2_tok *t = NULL;
    assert_int_equal(pi2_tok_load(&t, path, &e), 0);
    size_t n = 200000;
    char *text = malloc(n + 1);
    assert_non_null(text);
    pi2_rng r;
    pi2_rng_seed(&r, 9);
    static const char *const words[] = {"the ", "little ", "cat ", "zqxj ", "\xE4\xB8\xAD ", "\n", "Hello, "};
    size_t k = 0;
    while (k < n) {
        const char *w = words[pi2_rng_u64(&r) % 7];
        size_t wl = strlen(w);
        if (k + wl > n)
            break;
        memcpy(text + k, w, wl);
        k += wl;
    }
    text[k] = 0;
    double t0 = pi2_now();
    int32_t *ids = NULL;
    size_t m = 0;
    assert_int_equal(pi2_tok_encode(t, text, k, &ids, &m, &e), 0);
    assert_true(pi2_now() - t0 < 20.0);
    char *back = decode(t, ids, m, false);
    assert_string_equal(back, text);
    free(back);
    free(ids);
    free(text);
    pi2_tok_free(t);
    pi2t_rmtree(dir);
}

/* Many added tokens sharing a prefix, and a text full of that prefix: the
 * trie keeps matching linear-ish (a generous bound only). */
static void test_many_added_tokens(void **state)
{
    (void)state;
    json_t *j = bf_json(true);
    json_t *added = json_object_get(j, "added_tokens");
    for (int i = 0; i < 20000; i++) {
        char c[32];
        snprintf(c, sizeof c, "<unused%d>", i);
        json_array_append_new(added, added_tok(272 + i, c, true, false));
    }
    pi2_tok *t = load_json_obj(j);
    assert_int_equal(pi2_tok_vocab_size(t), 272 + 20000);
    ASSERT_IDS(t, "hi<unused19999>hi<unused7><unused", 266, 272 + 19999, B_SPHI, 272 + 7, B_SP, BYTE('<'), BYTE('u'),
               BYTE('n'), BYTE('u'), BYTE('s'), 262, BYTE('d')); /* "e" is in the vocab */
    size_t n = 100000;
    char *text = malloc(n + 1);
    assert_non_null(text);
    for (size_t i = 0; i < n; i++)
        text[i] = "<unused"[i % 7];
    text[n] = 0;
    double t0 = pi2_now();
    int32_t *ids = NULL;
    size_t m = 0;
    pi2_err e = {0};
    assert_int_equal(pi2_tok_encode(t, text, n, &ids, &m, &e), 0);
    assert_true(pi2_now() - t0 < 20.0);
    free(ids);
    free(text);
    pi2_tok_free(t);
}

static void test_null_and_files(void **state)
{
    (void)state;
    assert_int_equal(pi2_tok_vocab_size(NULL), 0);
    assert_int_equal(pi2_tok_bos(NULL), -1);
    assert_int_equal(pi2_tok_eos(NULL), -1);
    assert_null(pi2_tok_piece(NULL, 0));
    assert_int_equal(pi2_tok_find(NULL, "a"), -1);
    pi2_err e = {0};
    int32_t *ids;
    size_t n;
    assert_int_equal(pi2_tok_encode(NULL, "a", 1, &ids, &n, &e), PI2_EINVAL);
    pi2_tok *t = (pi2_tok *)0x1;
    pi2_err_clear(&e);
    assert_int_equal(pi2_tok_load(&t, "/nonexistent/tokenizer.json", &e), PI2_ENOTFOUND);
    assert_null(t);
    assert_non_null(strstr(e.msg, "/nonexistent/tokenizer.json"));
    char dir[64], path[128];
    pi2t_tmpdir(dir, sizeof dir);
    pi2_err_clear(&e);
    assert_int_equal(pi2_tok_load(&t, dir, &e), PI2_ENOTFOUND); /* directory without tokenizer.json */
    assert_non_null(strstr(e.msg, "tokenizer.json"));
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    pi2t_write(path, "not json", 8);
    pi2_err_clear(&e);
    assert_int_equal(pi2_tok_load(&t, dir, &e), PI2_EFORMAT);
    assert_non_null(strstr(e.msg, path));
    pi2t_write(path, RANK_JSON, strlen(RANK_JSON));
    assert_int_equal(pi2_tok_load(&t, path, &e), 0);
    assert_int_equal(pi2_tok_vocab_size(t), 10);
    pi2_tok_free(t);
    pi2t_rmtree(dir);
}

/* ---- broken files ---- */

static void test_truncated(void **state)
{
    (void)state;
    json_t *j = bf_json(true);
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    size_t len = strlen(s);
    for (size_t cut = 0; cut < len; cut += 1 + cut / 64)
        expect_load_error(s, cut, PI2_EFORMAT);
    free(s);
}

/* The real file, cut and corrupted at many places: an error or a working
 * tokenizer, never a crash (ASan/UBSan watch). */
static void test_corrupt_real_file(void **state)
{
    (void)state;
    char dir[4096], path[4200];
    size_t len;
    PI2T_SHARED_MODEL(dir, "tinystories-656k");
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    char *text;
    pi2_err e = {0};
    assert_int_equal(pi2_read_file(path, 1 << 24, &text, &len, &e), 0);
    for (size_t cut = 0; cut < len; cut += 997)
        expect_load_error(text, cut, PI2_EFORMAT);
    pi2_rng r;
    pi2_rng_seed(&r, 77);
    for (int k = 0; k < 200; k++) {
        char *copy = malloc(len);
        assert_non_null(copy);
        memcpy(copy, text, len);
        for (int f = 0; f < 3; f++)
            copy[pi2_rng_u64(&r) % len] = (char)(pi2_rng_u64(&r) & 0xff);
        pi2_tok *t = NULL;
        pi2_err_clear(&e);
        int rc = pi2_tok_load_mem(&t, copy, len, "corrupt.json", &e);
        if (rc) {
            assert_null(t);
            assert_true(rc < 0);
            assert_non_null(strstr(e.msg, "corrupt.json"));
        } else {
            int32_t *ids = NULL;
            size_t n = 0;
            if (pi2_tok_encode(t, "Once upon a time \xE4\xB8\xAD", 20, &ids, &n, &e) == 0) {
                char *out = NULL;
                assert_int_equal(pi2_tok_decode(t, ids, n, false, &out, &e), 0);
                free(out);
                free(ids);
            }
            pi2_tok_free(t);
        }
        free(copy);
    }
    free(text);
}

#define MODEL_OK "\"model\": {\"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]}"

static void test_bad_files(void **state)
{
    (void)state;
    static const struct {
        const char *json;
        int code;
    } cases[] = {
        {"", PI2_EFORMAT},
        {"[]", PI2_EFORMAT},
        {"{}", PI2_ENOTFOUND},
        {"{\"model\": []}", PI2_EFORMAT},
        {"{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}", PI2_EUNSUPPORTED},
        {"{\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"a\", 0.0]]}}", PI2_EUNSUPPORTED},
        {"{\"model\": {\"type\": 5, \"vocab\": {\"a\": 0}}}", PI2_EFORMAT},
        {"{\"model\": {\"vocab\": [\"a\"]}}", PI2_EFORMAT},
        {"{\"model\": {\"merges\": []}}", PI2_ENOTFOUND},
        {"{\"model\": {\"vocab\": {}}}", PI2_EFORMAT},
        {"{\"model\": {\"vocab\": {\"a\": \"0\"}}}", PI2_EFORMAT},
        {"{\"model\": {\"vocab\": {\"a\": 0.5}}}", PI2_EFORMAT},
        {"{\"model\": {\"vocab\": {\"a\": -1}}}", PI2_ERANGE},
        {"{\"model\": {\"vocab\": {\"a\": 0, \"b\": 2}}}", PI2_ERANGE},           /* not dense */
        {"{\"model\": {\"vocab\": {\"a\": 0, \"b\": 0}}}", PI2_EFORMAT},          /* duplicate id */
        {"{\"model\": {\"vocab\": {\"a\": 0, \"a\": 1}}}", PI2_EFORMAT},          /* duplicate key */
        {"{\"model\": {\"vocab\": {\"a\": 99999999999}}}", PI2_ERANGE},
        {"{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": {}}}", PI2_EFORMAT},
        {"{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [\"a a\"]}}", PI2_EFORMAT}, /* "aa" missing */
        {"{\"model\": {\"vocab\": {\"a\": 0, \"aa\": 1}, \"merges\": [\"a x\"]}}", PI2_EFORMAT},
        {"{\"model\": {\"vocab\": {\"a\": 0, \"aa\": 1}, \"merges\": [\"a a a\"]}}", PI2_EFORMAT},
        {"{\"model\": {\"vocab\": {\"a\": 0, \"aa\": 1}, \"merges\": [\"aa\"]}}", PI2_EFORMAT},
        {"{\"model\": {\"vocab\": {\"a\": 0, \"aa\": 1}, \"merges\": [[\"a\"]]}}", PI2_EFORMAT},
        {"{\"model\": {\"vocab\": {\"a\": 0, \"aa\": 1}, \"merges\": [[\"a\", 1]]}}", PI2_EFORMAT},
        {"{\"model\": {\"vocab\": {\"a\": 0, \"aa\": 1}, \"merges\": [[\"a\", \"a\"], \"a a\"]}}", PI2_EFORMAT},
        {"{\"model\": {\"vocab\": {\"a\": 0, \"aa\": 1}, \"merges\": [\"a a\", [\"a\", \"a\"]]}}", PI2_EFORMAT},
        {"{\"model\": {\"vocab\": {\"a\": 0}, \"byte_fallback\": \"yes\"}}", PI2_EFORMAT},
        {"{\"model\": {\"vocab\": {\"a\": 0}, \"unk_token\": 5}}", PI2_EFORMAT},
        {"{\"model\": {\"vocab\": {\"a\": 0}, \"dropout\": 0.1}}", PI2_EUNSUPPORTED},
        {"{\"model\": {\"vocab\": {\"a\": 0}, \"continuing_subword_prefix\": \"##\"}}", PI2_EUNSUPPORTED},
        {"{\"model\": {\"vocab\": {\"a\": 0}, \"end_of_word_suffix\": \"</w>\"}}", PI2_EUNSUPPORTED},
        {"{\"normalizer\": {\"type\": \"NFKC\"}, " MODEL_OK "}", PI2_EUNSUPPORTED},
        {"{\"normalizer\": {\"type\": \"Replace\", \"pattern\": {\"Regex\": \" +\"}, \"content\": \" \"}, " MODEL_OK
         "}",
         PI2_EUNSUPPORTED},
        {"{\"normalizer\": {\"type\": \"Replace\", \"pattern\": {\"String\": \"\"}, \"content\": \" \"}, " MODEL_OK "}",
         PI2_EUNSUPPORTED},
        {"{\"normalizer\": {\"type\": \"Replace\", \"pattern\": {\"String\": \"a\"}}, " MODEL_OK "}", PI2_ENOTFOUND},
        {"{\"normalizer\": {\"type\": \"Replace\", \"pattern\": \"a\", \"content\": \"b\"}, " MODEL_OK "}",
         PI2_EFORMAT},
        {"{\"normalizer\": {\"type\": \"Prepend\", \"prepend\": 3}, " MODEL_OK "}", PI2_EFORMAT},
        {"{\"normalizer\": \"Prepend\", " MODEL_OK "}", PI2_EFORMAT},
        {"{\"normalizer\": {\"prepend\": \"x\"}, " MODEL_OK "}", PI2_ENOTFOUND},
        {"{\"normalizer\": {\"type\": \"Sequence\"}, " MODEL_OK "}", PI2_ENOTFOUND},
        {"{\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Lowercase\"}]}, " MODEL_OK "}",
         PI2_EUNSUPPORTED},
        {"{\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Sequence\", \"normalizers\": "
         "[{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Sequence\", \"normalizers\": [{\"type\": "
         "\"Sequence\", \"normalizers\": [{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Sequence\", "
         "\"normalizers\": [{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Sequence\", \"normalizers\": "
         "[{\"type\": \"Sequence\", \"normalizers\": []}]}]}]}]}]}]}]}]}]}, " MODEL_OK "}",
         PI2_ERANGE},
        {"{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, " MODEL_OK "}", PI2_EUNSUPPORTED},
        {"{\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"ab\"}, " MODEL_OK "}", PI2_EFORMAT},
        {"{\"pre_tokenizer\": {\"type\": \"Metaspace\"}, " MODEL_OK "}", PI2_ENOTFOUND},
        {"{\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"_\", \"prepend_scheme\": \"sometimes\"}, "
         MODEL_OK "}",
         PI2_EUNSUPPORTED},
        {"{\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"_\", \"prepend_scheme\": \"always\", "
         "\"add_prefix_space\": false}, " MODEL_OK "}",
         PI2_EFORMAT},
        {"{\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"_\", \"split\": 1}, " MODEL_OK "}",
         PI2_EFORMAT},
        {"{\"pre_tokenizer\": {\"type\": \"Replace\", \"pattern\": {\"String\": \"a\"}, \"content\": \"b\"}, " MODEL_OK
         "}",
         PI2_EUNSUPPORTED},
        {"{\"decoder\": {\"type\": \"ByteLevel\"}, " MODEL_OK "}", PI2_EUNSUPPORTED},
        {"{\"decoder\": {\"type\": \"Prepend\", \"prepend\": \"x\"}, " MODEL_OK "}", PI2_EUNSUPPORTED},
        {"{\"decoder\": {\"type\": \"Strip\", \"content\": \" \", \"start\": -1, \"stop\": 0}, " MODEL_OK "}",
         PI2_ERANGE},
        {"{\"decoder\": {\"type\": \"Strip\", \"content\": \" \", \"start\": 1}, " MODEL_OK "}", PI2_ENOTFOUND},
        {"{\"decoder\": {\"type\": \"Strip\", \"content\": \"\", \"start\": 1, \"stop\": 0}, " MODEL_OK "}",
         PI2_EFORMAT},
        {"{\"decoder\": {\"type\": \"Sequence\", \"decoders\": 3}, " MODEL_OK "}", PI2_EFORMAT},
        {"{\"decoder\": 7, " MODEL_OK "}", PI2_EFORMAT},
        {"{\"added_tokens\": {}, " MODEL_OK "}", PI2_EFORMAT},
        {"{\"added_tokens\": [5], " MODEL_OK "}", PI2_EFORMAT},
        {"{\"added_tokens\": [{\"content\": \"<s>\"}], " MODEL_OK "}", PI2_ENOTFOUND},
        {"{\"added_tokens\": [{\"id\": 3, \"content\": 5}], " MODEL_OK "}", PI2_EFORMAT},
        {"{\"added_tokens\": [{\"id\": 1, \"content\": \"ab\"}], " MODEL_OK "}", PI2_EFORMAT},  /* vocab says 2 */
        {"{\"added_tokens\": [{\"id\": 7, \"content\": \"<s>\"}], " MODEL_OK "}", PI2_EFORMAT}, /* next free is 3 */
        {"{\"added_tokens\": [{\"id\": -1, \"content\": \"<s>\"}], " MODEL_OK "}", PI2_EFORMAT},
        {"{\"added_tokens\": [{\"id\": 3, \"content\": \"<s>\"}, {\"id\": 4, \"content\": \"<s>\"}], " MODEL_OK "}",
         PI2_EFORMAT},
        {"{\"added_tokens\": [{\"id\": 3, \"content\": \"<s>\", \"single_word\": true}], " MODEL_OK "}",
         PI2_EUNSUPPORTED},
        {"{\"added_tokens\": [{\"id\": 3, \"content\": \"<s>\", \"special\": \"yes\"}], " MODEL_OK "}", PI2_EFORMAT},
        {"{\"model\": {\"vocab\": {\"a\\u0000\": 0}}}", PI2_EFORMAT}, /* NUL in a piece */
        {"{\"model\": {\"vocab\": {\"\xff\": 0}}}", PI2_EFORMAT},      /* not UTF-8 */
        {"{" MODEL_OK "} trailing", PI2_EFORMAT},
        {"{\"model\": {\"vocab\": {\"\\n\": 0, \"b\\r\": 0}}}", PI2_EFORMAT}, /* message stays one line */
        {"{\"model\": {\"type\": \"W\\nP\", \"vocab\": {\"a\": 0}}}", PI2_EUNSUPPORTED},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        expect_load_error(cases[i].json, strlen(cases[i].json), cases[i].code);

    /* oversize piece */
    size_t big = 20000;
    char *s = malloc(big + 64);
    assert_non_null(s);
    strcpy(s, "{\"model\": {\"vocab\": {\"");
    size_t k = strlen(s);
    memset(s + k, 'a', big);
    strcpy(s + k + big, "\": 0}}}");
    expect_load_error(s, strlen(s), PI2_ERANGE);
    free(s);

    /* valid but minimal files load */
    pi2_tok *t = load_str("{\"model\": {\"vocab\": {\"a\": 0}}}");
    ASSERT_IDS(t, "aa", 0, 0);
    pi2_tok_free(t);
    t = load_str("{\"added_tokens\": [{\"id\": 3, \"content\": \"\"}], \"normalizer\": null, \"decoder\": null, "
                 "\"post_processor\": {\"type\": \"Weird\"}, " MODEL_OK "}");
    assert_int_equal(pi2_tok_vocab_size(t), 3); /* empty added tokens are ignored, as HF */
    ASSERT_IDS(t, "ab", 2);
    pi2_tok_free(t);
}

/* bos/eos conventions */
static void test_bos_eos(void **state)
{
    (void)state;
    /* template names the bos */
    pi2_tok *t = load_str(
        "{\"added_tokens\": [{\"id\": 3, \"content\": \"<|begin|>\", \"special\": true}, {\"id\": 4, \"content\": "
        "\"<|end_of_text|>\", \"special\": true}], \"post_processor\": {\"type\": \"Sequence\", \"processors\": "
        "[{\"type\": \"ByteLevel\"}, {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": "
        "\"<|begin|>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"special_tokens\": "
        "{\"<|begin|>\": {\"id\": \"<|begin|>\", \"ids\": [3], \"tokens\": [\"<|begin|>\"]}}}]}, " MODEL_OK "}");
    assert_int_equal(pi2_tok_bos(t), 3);
    assert_int_equal(pi2_tok_eos(t), 4);
    pi2_tok_free(t);
    /* a special token after the sequence is not a bos; bos+1 not end-like */
    t = load_str("{\"added_tokens\": [{\"id\": 3, \"content\": \"<s>\", \"special\": true}, {\"id\": 4, \"content\": "
                 "\"<pad>\", \"special\": true}], \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": "
                 "[{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, {\"SpecialToken\": {\"id\": \"<pad>\", "
                 "\"type_id\": 0}}]}, " MODEL_OK "}");
    assert_int_equal(pi2_tok_bos(t), 3);
    assert_int_equal(pi2_tok_eos(t), -1);
    pi2_tok_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_tinystories),
        cmocka_unit_test(test_golden_tinystories_drelu),
        cmocka_unit_test(test_synthetic),
        cmocka_unit_test(test_synthetic_added),
        cmocka_unit_test(test_synthetic_errors),
        cmocka_unit_test(test_merges_by_rank),
        cmocka_unit_test(test_merges_pair_syntax),
        cmocka_unit_test(test_byte_fallback),
        cmocka_unit_test(test_unk),
        cmocka_unit_test(test_partial_byte_tokens),
        cmocka_unit_test(test_added_tokens),
        cmocka_unit_test(test_normalized_added_tokens),
        cmocka_unit_test(test_metaspace),
        cmocka_unit_test(test_ignore_merges),
        cmocka_unit_test(test_decoders),
        cmocka_unit_test(test_stream_incremental),
        cmocka_unit_test(test_stream_property),
        cmocka_unit_test(test_stream_property_tinystories),
        cmocka_unit_test(test_long_input),
        cmocka_unit_test(test_many_added_tokens),
        cmocka_unit_test(test_null_and_files),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_corrupt_real_file),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_bos_eos),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
