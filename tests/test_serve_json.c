/* Tests of the OpenAI-compatible API's JSON (runtime/serve_json.h):
 * requests read strictly, responses written as clients expect them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "runtime/serve_json.h"

#include <stdlib.h>
#include <string.h>

static int parse(pi2_api_req *r, bool chat, const char *body, pi2_err *e)
{
    return pi2_api_req_parse(r, chat, body, strlen(body), e);
}

static void test_chat_request(void **state)
{
    (void)state;
    pi2_api_req r;
    pi2_err e = {0};
    const char *body = "{\"model\":\"tiny\",\"messages\":[{\"role\":\"developer\",\"content\":\"be brief\"},"
                       "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hel\"},{\"type\":\"text\",\"text\":\"lo\"}]},"
                       "{\"role\":\"assistant\",\"content\":null}],\"max_completion_tokens\":7,\"temperature\":0,"
                       "\"top_p\":0.5,\"stop\":[\"a\",\"bc\"],\"seed\":42,\"stream\":true,\"n\":1,\"user\":\"x\","
                       "\"stream_options\":{\"include_usage\":true}}";
    assert_int_equal(parse(&r, true, body, &e), 0);
    assert_true(r.chat);
    assert_int_equal(r.n_msgs, 3);
    assert_string_equal(r.msgs[0].role, "system");
    assert_string_equal(r.msgs[0].content, "be brief");
    assert_string_equal(r.msgs[1].role, "user");
    assert_string_equal(r.msgs[1].content, "hello");
    assert_string_equal(r.msgs[2].content, "");
    assert_string_equal(r.model, "tiny");
    assert_int_equal(r.max_tokens, 7);
    assert_true(r.temperature == 0.0 && r.top_p == 0.5);
    assert_int_equal(r.n_stop, 2);
    assert_string_equal(r.stop[1], "bc");
    assert_true(r.has_seed);
    assert_int_equal(r.seed, 42);
    assert_true(r.stream);
    pi2_api_req_free(&r);
    pi2_api_req_free(&r); /* twice: a no-op */
    /* defaults */
    assert_int_equal(parse(&r, true, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":null}", &e), 0);
    assert_null(r.model);
    assert_int_equal(r.max_tokens, -1);
    assert_true(r.temperature == 1.0 && r.top_p == 1.0);
    assert_false(r.has_seed || r.stream);
    assert_int_equal(r.n_stop, 0);
    pi2_api_req_free(&r);
}

static void test_completion_request(void **state)
{
    (void)state;
    pi2_api_req r;
    pi2_err e = {0};
    assert_int_equal(parse(&r, false, "{\"prompt\":\"once\",\"max_tokens\":0,\"stop\":\"\\n\"}", &e), 0);
    assert_string_equal(r.prompt, "once");
    assert_int_equal(r.max_tokens, 0);
    assert_int_equal(r.n_stop, 1);
    assert_string_equal(r.stop[0], "\n");
    pi2_api_req_free(&r);
    assert_int_equal(parse(&r, false, "{\"prompt\":[\"one\"]}", &e), 0);
    assert_string_equal(r.prompt, "one");
    pi2_api_req_free(&r);
}

/* body -> PI2_EINVAL whose message holds `want` */
static void refused(bool chat, const char *body, size_t len, const char *want)
{
    pi2_api_req r;
    pi2_err e = {0};
    int rc = pi2_api_req_parse(&r, chat, body, len, &e);
    pi2_api_req_free(&r);
    if (rc != PI2_EINVAL || !strstr(e.msg, want))
        fail_msg("%s: rc %d, '%s' (wanted '%s')", body, rc, e.msg, want);
}

static void test_bad_requests(void **state)
{
    (void)state;
    static const struct {
        bool chat;
        const char *body, *want;
    } cases[] = {
        {true, "", "not valid JSON"},
        {true, "{\"messages\": [", "not valid JSON"},
        {true, "[1]", "a JSON object"},
        {true, "{}", "messages: expected a non-empty array"},
        {true, "{\"messages\":[]}", "messages: expected a non-empty array"},
        {true, "{\"messages\":\"hi\"}", "messages: expected"},
        {true, "{\"messages\":[1]}", "messages: expected an array of objects"},
        {true, "{\"messages\":[{\"content\":\"x\"}]}", "messages[0].role: expected a string"},
        {true, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", "messages[0].role: expected system"},
        {true, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", "messages[0].content"},
        {true, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", "text parts"},
        {false, "{}", "prompt: expected a string"},
        {false, "{\"prompt\":5}", "prompt"},
        {false, "{\"prompt\":[\"a\",\"b\"]}", "prompt"},
        {false, "{\"prompt\":\"a\",\"max_tokens\":\"8\"}", "max_tokens: expected an integer"},
        {false, "{\"prompt\":\"a\",\"max_tokens\":-1}", "max_tokens"},
        {false, "{\"prompt\":\"a\",\"max_tokens\":8.5}", "max_tokens"},
        {false, "{\"prompt\":\"a\",\"max_tokens\":99999999999}", "max_tokens"},
        {false, "{\"prompt\":\"a\",\"temperature\":3}", "temperature: expected a number in [0, 2]"},
        {false, "{\"prompt\":\"a\",\"temperature\":\"hot\"}", "temperature"},
        {false, "{\"prompt\":\"a\",\"top_p\":0}", "top_p: expected a number in (0, 1]"},
        {false, "{\"prompt\":\"a\",\"stop\":5}", "stop"},
        {false, "{\"prompt\":\"a\",\"stop\":[\"x\",1]}", "stop"},
        {false, "{\"prompt\":\"a\",\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\",\"11\",\"12\","
                "\"13\",\"14\",\"15\",\"16\",\"17\"]}", "stop"},
        {false, "{\"prompt\":\"a\",\"seed\":-1}", "seed"},
        {false, "{\"prompt\":\"a\",\"stream\":\"yes\"}", "stream: expected a boolean"},
        {false, "{\"prompt\":\"a\",\"n\":2}", "n: expected an integer in [1, 1]"},
        {false, "{\"prompt\":\"a\",\"model\":7}", "model: expected a string"},
        {false, "{\"prompt\":\"a\",\"prompt\":\"b\"}", "not valid JSON"},
        {false, "{\"prompt\":\"a\\u0000b\"}", "not valid JSON"},
        {false, "{\"prompt\":\"\xff\"}", "not valid JSON"},
        {false, "{\"prompt\":\"a\"} x", "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        refused(cases[i].chat, cases[i].body, strlen(cases[i].body), cases[i].want);
    /* a NUL byte inside the body */
    refused(false, "{\"prompt\":\"a\"}\0", 15, "not valid JSON");
    /* deep nesting: refused, not a crash */
    size_t n = 100000;
    char *deep = malloc(2 * n + 1);
    memset(deep, '[', n);
    memset(deep + n, ']', n);
    deep[2 * n] = 0;
    refused(true, deep, 2 * n, "not valid JSON");
    free(deep);
}

static void test_responses(void **state)
{
    (void)state;
    pi2_api_reply r = {.chat = true, .id = "chatcmpl-1", .created = 5, .model = "tiny", .finish = "stop",
                       .prompt_tokens = 3, .completion_tokens = 2};
    char *s = pi2_api_response(&r, "hi \"x\"", 6);
    assert_string_equal(s, "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"created\":5,\"model\":\"tiny\","
                           "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"hi \\\"x\\\"\"},"
                           "\"logprobs\":null,\"finish_reason\":\"stop\"}],"
                           "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5}}");
    free(s);
    r.finish = NULL;
    s = pi2_api_chunk(&r, true, "a\xff", 2); /* a bad byte: U+FFFD */
    assert_string_equal(s, "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":5,\"model\":\"tiny\","
                           "\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"a\xef\xbf\xbd\"},"
                           "\"logprobs\":null,\"finish_reason\":null}]}");
    free(s);
    r.finish = "length";
    s = pi2_api_chunk(&r, false, "", 0);
    assert_non_null(strstr(s, "\"delta\":{},\"logprobs\":null,\"finish_reason\":\"length\"}],\"usage\""));
    free(s);
    r.chat = false;
    r.id = "cmpl-1";
    s = pi2_api_response(&r, "\xc3\xa9t\xc3", 4); /* a cut character: U+FFFD */
    assert_non_null(strstr(s, "\"object\":\"text_completion\""));
    assert_non_null(strstr(s, "\"text\":\"\xc3\xa9t\xef\xbf\xbd\""));
    free(s);
    s = pi2_api_error("no \"such\" model", "invalid_request_error", "model", "model_not_found");
    assert_string_equal(s, "{\"error\":{\"message\":\"no \\\"such\\\" model\",\"type\":\"invalid_request_error\","
                           "\"param\":\"model\",\"code\":\"model_not_found\"}}");
    free(s);
    s = pi2_api_error("x", "server_error", NULL, NULL);
    assert_string_equal(s, "{\"error\":{\"message\":\"x\",\"type\":\"server_error\",\"param\":null,\"code\":null}}");
    free(s);
    s = pi2_api_models("tiny", 7);
    assert_string_equal(s, "{\"object\":\"list\",\"data\":[{\"id\":\"tiny\",\"object\":\"model\",\"created\":7,"
                           "\"owned_by\":\"pi2\"}]}");
    free(s);
    s = pi2_api_health(3, 1);
    assert_string_equal(s, "{\"status\":\"ok\",\"queue\":3,\"running\":1}");
    free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_request),
        cmocka_unit_test(test_completion_request),
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_responses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
