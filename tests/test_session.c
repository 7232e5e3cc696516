/* Tests of the conversation session (runtime/session.h) and the chat
 * format (runtime/chat_format.h) on a small generated model. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "bundle/bundle.h"
#include "convert/convert.h"
#include "convert/synth.h"
#include "runtime/chat_format.h"
#include "runtime/session.h"
#include "tests/testutil.h"

#include <stdlib.h>
#include <string.h>

static char g_dir[512], g_pi2[700];

static int group_setup(void **state)
{
    (void)state;
    pi2_err e = {0};
    char src[600], conv[700];
    pi2t_tmpdir(g_dir, sizeof g_dir);
    snprintf(src, sizeof src, "%s/tiny", g_dir);
    snprintf(conv, sizeof conv, "%s/tiny.pi2c", g_dir);
    snprintf(g_pi2, sizeof g_pi2, "%s/tiny.pi2", g_dir);
    pi2_synth_opts so;
    if (pi2_synth_preset("tiny", &so, &e) || pi2_synth_write(src, &so, NULL, NULL, &e))
        return fprintf(stderr, "synth: %s\n", e.msg), -1;
    pi2_convert_opts co;
    pi2_convert_defaults(&co);
    co.model_dir = src;
    co.out_path = conv;
    co.calib_tokens = 256;
    co.quiet = true;
    co.threads = 1;
    if (pi2_convert(&co, NULL, &e))
        return fprintf(stderr, "convert: %s\n", e.msg), -1;
    pi2_bundle_opts bo;
    pi2_bundle_defaults(&bo);
    bo.in_path = conv;
    bo.out_path = g_pi2;
    bo.allow_unsigned = true;
    bo.quiet = true;
    if (pi2_bundle_create(&bo, NULL, &e))
        return fprintf(stderr, "bundle: %s\n", e.msg), -1;
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    pi2t_rmtree(g_dir);
    return 0;
}

static pi2_engine *open_model(int ctx)
{
    pi2_engine_opts o;
    pi2_engine_defaults(&o);
    o.path = g_pi2;
    o.trust_unsigned = true;
    o.threads = 1;
    o.ctx = ctx;
    pi2_err e = {0};
    pi2_engine *eng = NULL;
    if (pi2_engine_open(&eng, &o, &e))
        fail_msg("open: %s", e.msg);
    return eng;
}

static pi2_session_gen greedy(long long max_tokens)
{
    return (pi2_session_gen){.so = {.temperature = 0, .top_p = 1, .seed = 1}, .max_tokens = max_tokens};
}

static void test_chat_format_chatml(void **state)
{
    (void)state;
    pi2_err e = {0};
    pi2_chat_msg m[] = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", ""}};
    char *out = NULL;
    assert_int_equal(pi2_chat_format(NULL, m, 4, true, &out, &e), 0);
    assert_string_equal(out, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                             "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n<|im_end|>\n"
                             "<|im_start|>assistant\n");
    free(out);
    assert_int_equal(pi2_chat_format(NULL, m, 1, false, &out, &e), 0);
    assert_string_equal(out, "<|im_start|>system\nBe brief.<|im_end|>\n");
    free(out);
    assert_int_equal(pi2_chat_format(NULL, m, 0, false, &out, &e), 0);
    assert_string_equal(out, "");
    free(out);
    pi2_chat_msg bad[] = {{"user", "x"}, {"", "y"}};
    out = (char *)1;
    assert_int_equal(pi2_chat_format(NULL, bad, 2, true, &out, &e), PI2_EINVAL);
    assert_null(out);
    /* a template that writes bos_token itself: the encoder adds BOS, so
     * the rendered prompt starts after it */
    pi2_chat_template l2 = {.text = pi2_jinja_builtin("llama2"), .bos = "<s>", .eos = "</s>"};
    assert_int_equal(pi2_chat_format(&l2, m + 1, 1, true, &out, &e), 0);
    assert_string_equal(out, "[INST] Hi [/INST]");
    free(out);
    /* the model's own, from its tokenizer_config.json (file or directory) */
    char dir[] = "/tmp/pi2chatXXXXXX", path[64];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"bos_token\": \"<s>\", \"eos_token\": {\"content\": \"</s>\"}, \"chat_template\": "
          "\"{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{{ eos_token }}{% endfor %}\"}",
          f);
    fclose(f);
    pi2_chat_template t;
    pi2_chat_config cc;
    assert_int_equal(pi2_chat_template_load(dir, &t, &cc, &e), 0);
    assert_string_equal(t.eos, "</s>");
    assert_int_equal(pi2_chat_format(&t, m, 2, false, &out, &e), 0);
    assert_string_equal(out, "<system>Be brief.</s><user>Hi</s>");
    free(out);
    pi2_jinja_config_free(&cc);
    assert_int_equal(pi2_chat_template_load("vicuna", &t, &cc, &e), 0);
    assert_non_null(t.text);
    pi2_err e2 = {0};
    f = fopen(path, "w");
    fputs("{\"bos_token\": \"<s>\"}", f);
    fclose(f);
    assert_int_equal(pi2_chat_template_load(path, &t, &cc, &e2), PI2_ENOTFOUND);
    remove(path);
    rmdir(dir);
    assert_non_null(strstr(e.msg, "message 1 has no role"));
}

static void test_stop_scan(void **state)
{
    (void)state;
    const char *stop[] = {"</s>", "", "END"};
    bool found;
    assert_int_equal(pi2_stop_scan("hello", 5, stop, 3, &found), 5);
    assert_false(found);
    assert_int_equal(pi2_stop_scan("hello</", 7, stop, 3, &found), 5); /* "</" may grow into "</s>" */
    assert_false(found);
    assert_int_equal(pi2_stop_scan("helloE", 6, stop, 3, &found), 5);
    assert_int_equal(pi2_stop_scan("hi</s>x END", 11, stop, 3, &found), 2);
    assert_true(found);
    assert_int_equal(pi2_stop_scan("hi END</s>", 10, stop, 3, &found), 3); /* the earliest */
    assert_true(found);
    assert_int_equal(pi2_stop_scan("ab", 2, NULL, 0, &found), 2);
    assert_int_equal(pi2_stop_scan("", 0, stop, 3, &found), 0);
}

/* The reference: greedy tokens after text from a fresh prefill, decoded. */
static char *fresh_reply(const char *text, int max_tokens)
{
    pi2_engine *e = open_model(256);
    pi2_err err = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(pi2_session_encode(e, text, &ids, &n, &err), 0);
    const pi2_model_desc *d = pi2_engine_desc(e);
    float *lg = malloc((size_t)d->vocab * sizeof *lg);
    int32_t out[256];
    int n_out = 0, pos = (int)n;
    assert_int_equal(pi2_engine_prefill(e, ids, (int)n, 0, lg, &err), 0);
    int n_valid = pi2_tok_vocab_size(pi2_engine_tokenizer(e));
    for (int i = 0; i < max_tokens; i++) {
        pi2_logits_mask_padding(lg, d->vocab, n_valid);
        int next = pi2_argmax(lg, d->vocab);
        if (pi2_desc_is_end(d, next))
            break;
        out[n_out++] = next;
        if (i + 1 < max_tokens)
            assert_int_equal(pi2_engine_decode(e, next, pos++, lg, &err), 0);
    }
    char *s = NULL;
    assert_int_equal(pi2_tok_decode(pi2_engine_tokenizer(e), out, (size_t)n_out, true, &s, &err), 0);
    free(lg);
    free(ids);
    pi2_engine_close(e);
    return s;
}

typedef struct sink {
    char buf[4096];
    size_t len;
    int calls, cancel_after;
} sink;

static int sink_emit(void *ctx, const char *t, size_t n)
{
    sink *k = ctx;
    assert_true(k->len + n < sizeof k->buf);
    memcpy(k->buf + k->len, t, n);
    k->len += n;
    k->buf[k->len] = 0;
    return 0;
}

static bool sink_cancel(void *ctx)
{
    sink *k = ctx;
    return ++k->calls > k->cancel_after;
}

static void test_complete_reuses_cache(void **state)
{
    (void)state;
    const char *text = "hello world, this is a test";
    char *want = fresh_reply(text, 12);
    pi2_engine *e = open_model(256);
    pi2_session *s = NULL;
    pi2_err err = {0};
    assert_int_equal(pi2_session_create(&s, e, &err), 0);
    sink k = {0};
    pi2_session_gen g = greedy(12);
    g.emit = sink_emit;
    g.ctx = &k;
    pi2_session_result r;
    assert_int_equal(pi2_session_complete(s, text, &g, &r, &err), 0);
    assert_string_equal(r.text, want);
    assert_string_equal(k.buf, want); /* streamed whole, in order */
    assert_int_equal(r.prefilled, r.prompt_tokens);
    assert_true(r.completion_tokens >= 1 && r.completion_tokens <= 12);
    /* the same prompt again: one token runs, the same reply */
    assert_int_equal(pi2_session_complete(s, text, &g, &r, &err), 0);
    assert_int_equal(r.prefilled, 1);
    assert_string_equal(r.text, want);
    /* a longer prompt sharing the start: only its new tokens run */
    int before = r.prompt_tokens;
    assert_int_equal(pi2_session_complete(s, "hello world, this is a test of more", &g, &r, &err), 0);
    assert_true(r.prefilled < r.prompt_tokens && r.prompt_tokens > before);
    /* no tokens asked: nothing, length */
    g = greedy(0);
    assert_int_equal(pi2_session_complete(s, text, &g, &r, &err), 0);
    assert_int_equal(r.finish, PI2_FINISH_LENGTH);
    assert_int_equal(r.len, 0);
    pi2_session_free(s);
    pi2_engine_close(e);
    free(want);
}

static void test_stop_and_cancel(void **state)
{
    (void)state;
    const char *text = "once upon a time";
    char *want = fresh_reply(text, 16);
    size_t wl = strlen(want);
    if (wl < 4) { /* the model ended its reply at once: nothing to cut */
        free(want);
        skip();
    }
    pi2_engine *e = open_model(256);
    pi2_session *s = NULL;
    pi2_err err = {0};
    assert_int_equal(pi2_session_create(&s, e, &err), 0);
    char stop[3] = {want[2], want[3], 0}; /* cuts at or before byte 2 */
    const char *stops[] = {stop};
    sink k = {0};
    pi2_session_gen g = greedy(16);
    g.stop = stops;
    g.n_stop = 1;
    g.emit = sink_emit;
    g.ctx = &k;
    pi2_session_result r;
    assert_int_equal(pi2_session_complete(s, text, &g, &r, &err), 0);
    assert_int_equal(r.finish, PI2_FINISH_STOP);
    assert_true(r.len <= 2);
    assert_memory_equal(r.text, want, r.len);
    assert_null(strstr(k.buf, stop));
    assert_string_equal(k.buf, r.text);
    /* cancelled after two steps */
    sink c = {.cancel_after = 2};
    g = greedy(16);
    g.cancel = sink_cancel;
    g.ctx = &c;
    assert_int_equal(pi2_session_complete(s, text, &g, &r, &err), 0);
    assert_int_equal(r.finish, PI2_FINISH_CANCEL);
    assert_int_equal(r.completion_tokens, 3);
    pi2_session_free(s);
    pi2_engine_close(e);
    free(want);
}

static void test_say_turns(void **state)
{
    (void)state;
    pi2_engine *e = open_model(512);
    pi2_session *s = NULL;
    pi2_err err = {0};
    assert_int_equal(pi2_session_create(&s, e, &err), 0);
    assert_int_equal(pi2_session_add(s, "system", "be nice", &err), 0);
    pi2_session_gen g = greedy(8);
    pi2_session_result r;
    assert_int_equal(pi2_session_say(s, "hello there", &g, &r, &err), 0);
    assert_int_equal(pi2_session_count(s), 3);
    int first = r.prompt_tokens;
    assert_int_equal(r.prefilled, first);
    assert_string_equal(pi2_session_msg(s, 2).role, "assistant");
    assert_string_equal(pi2_session_msg(s, 2).content, r.text);
    /* the second turn prefills its new text only */
    assert_int_equal(pi2_session_say(s, "how are you", &g, &r, &err), 0);
    assert_int_equal(pi2_session_count(s), 5);
    assert_true(r.prompt_tokens > first);
    assert_true(r.prefilled <= r.prompt_tokens - first);
    /* the whole conversation, formatted, is the prompt that would be run */
    char *text = NULL;
    pi2_chat_msg m[4];
    for (int i = 0; i < 4; i++)
        m[i] = pi2_session_msg(s, (size_t)i);
    assert_int_equal(pi2_chat_format(NULL, m, 4, true, &text, &err), 0);
    assert_non_null(strstr(text, "<|im_start|>user\nhow are you<|im_end|>\n<|im_start|>assistant\n"));
    free(text);
    /* reset: the system prompt's tokens stay in the cache */
    pi2_session_reset(s);
    assert_int_equal(pi2_session_count(s), 0);
    assert_int_equal(pi2_session_add(s, "system", "be nice", &err), 0);
    assert_int_equal(pi2_session_say(s, "hello there", &g, &r, &err), 0);
    assert_int_equal(r.prompt_tokens, first);
    assert_true(r.prefilled < first);
    pi2_session_free(s);
    pi2_engine_close(e);
}

static void test_context_full(void **state)
{
    (void)state;
    pi2_engine *e = open_model(96);
    pi2_session *s = NULL;
    pi2_err err = {0};
    assert_int_equal(pi2_session_create(&s, e, &err), 0);
    pi2_session_gen g = greedy(8);
    pi2_session_result r;
    char big[400];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = 0;
    /* a message over the context: refused, the conversation as before */
    assert_int_equal(pi2_session_say(s, big, &g, &r, &err), PI2_ERANGE);
    assert_non_null(strstr(err.msg, "context of 96 positions"));
    assert_int_equal(pi2_session_count(s), 0);
    assert_int_equal(pi2_session_complete(s, big, &g, &r, &err), PI2_ERANGE);
    /* a long reply stops when the context is full */
    g = greedy(1000);
    assert_int_equal(pi2_session_complete(s, "hi", &g, &r, &err), 0);
    assert_true(r.finish == PI2_FINISH_CTX || r.finish == PI2_FINISH_STOP);
    if (r.finish == PI2_FINISH_CTX)
        assert_int_equal(r.prompt_tokens + r.completion_tokens, 96 + 1);
    /* turns pile up until one does not fit; dropping the oldest goes on */
    g = greedy(8);
    int rc = 0, turns = 0;
    while (rc == 0 && turns < 20) {
        rc = pi2_session_say(s, "tell me more", &g, &r, &err);
        turns++;
    }
    assert_int_equal(rc, PI2_ERANGE);
    size_t kept = pi2_session_count(s);
    pi2_session_set_drop_oldest(s, true);
    int dropped = 0;
    for (int i = 0; i < 6; i++) {
        assert_int_equal(pi2_session_say(s, "tell me more", &g, &r, &err), 0);
        dropped += r.dropped;
        assert_true(r.prompt_tokens < 96);
    }
    assert_true(dropped > 0);
    assert_true(pi2_session_count(s) <= kept + 2);
    pi2_session_free(s);
    pi2_engine_close(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_format_chatml), cmocka_unit_test(test_stop_scan),
        cmocka_unit_test(test_complete_reuses_cache), cmocka_unit_test(test_stop_and_cancel),
        cmocka_unit_test(test_say_turns),          cmocka_unit_test(test_context_full),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
