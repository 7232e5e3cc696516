/* Tests for formats/tokenizer: golden encodings of the shared tinystories
 * models, handcrafted tokenizer.json files for each supported component,
 * streaming = whole decode, the synthetic writer, and broken files. */
#include "tests/testutil.h"

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
        double dt = pi2_now() - t0;
        if (sizes[si] >= 32000)
            fprintf(stderr, "synthetic vocab %d: write+load %.3f s\n", sizes[si], dt);
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

/* ---- handcrafted files ---- */

/* A minimal BPE: vocab a b c ab bc abc, merges by rank. */
static const char *MINI =
    "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, \"ab\": 3, \"bc\": 4, \"abc\": 5},"
    " \"merges\": [\"b c\", \"a b\", \"a bc\"]}}";

static void test_minimal(void **state)
{
    (void)state;
    pi2_tok *t = load_str(MINI);
    assert_int_equal(pi2_tok_vocab_size(t), 6);
    assert_int_equal(pi2_tok_bos(t), -1);
    assert_int_equal(pi2_tok_eos(t), -1);
    ASSERT_IDS(t, "abc", 5);
    ASSERT_IDS(t, "ab", 3);
    ASSERT_NO_IDS(t, "");
    pi2_tok_free(t);
    pi2_tok_free(NULL);
    expect_load_error("{", 1, PI2_EFORMAT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_tinystories),
        cmocka_unit_test(test_golden_tinystories_drelu),
        cmocka_unit_test(test_synthetic),
        cmocka_unit_test(test_minimal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
