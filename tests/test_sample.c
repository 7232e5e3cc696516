/* sampling: greedy, temperature, top-k, top-p, seeds, bad options. */
#include "tests/testutil.h"

#include "runtime/sample.h"

#include <math.h>

static void test_greedy(void **state)
{
    (void)state;
    float l[5] = {1, 3, 3, -1, NAN};
    assert_int_equal(pi2_argmax(l, 5), 1); /* first of equal maxima */
    pi2_sampler *s;
    pi2_sample_opts o = {0, 0, 1, 1};
    assert_int_equal(pi2_sampler_create(&s, 5, &o, NULL), 0);
    assert_int_equal(pi2_sampler_next(s, l), 1);
    pi2_sampler_free(s);
    pi2_sampler_free(NULL);
    float n[2] = {NAN, 2};
    assert_int_equal(pi2_argmax(n, 2), 1);
}

static void histogram(const pi2_sample_opts *o, const float *l, int n, int draws, int *hist)
{
    pi2_sampler *s;
    assert_int_equal(pi2_sampler_create(&s, n, o, NULL), 0);
    memset(hist, 0, sizeof(int) * n);
    for (int i = 0; i < draws; i++)
        hist[pi2_sampler_next(s, l)]++;
    pi2_sampler_free(s);
}

static void test_distribution(void **state)
{
    (void)state;
    float l[4] = {logf(0.5f), logf(0.25f), logf(0.15f), logf(0.10f)};
    int h[4];
    pi2_sample_opts o = {1.0f, 0, 1.0f, 42};
    histogram(&o, l, 4, 40000, h);
    assert_true(abs(h[0] - 20000) < 600 && abs(h[1] - 10000) < 500 && abs(h[3] - 4000) < 350);
    o.top_k = 2; /* renormalised over {0, 1}: 2/3, 1/3 */
    histogram(&o, l, 4, 30000, h);
    assert_int_equal(h[2] + h[3], 0);
    assert_true(abs(h[0] - 20000) < 600);
    o.top_k = 0;
    o.top_p = 0.7f; /* 0.5 + 0.25 reaches 0.7 */
    histogram(&o, l, 4, 30000, h);
    assert_int_equal(h[2] + h[3], 0);
    o.top_p = 0.4f; /* only the first */
    histogram(&o, l, 4, 1000, h);
    assert_int_equal(h[0], 1000);
    /* same seed, same sequence; other seed, other sequence */
    int a[4], b[4];
    pi2_sample_opts p = {1.0f, 0, 1.0f, 7};
    histogram(&p, l, 4, 500, a);
    histogram(&p, l, 4, 500, b);
    assert_memory_equal(a, b, sizeof a);
}

static void test_bad_options(void **state)
{
    (void)state;
    pi2_sampler *s;
    pi2_err err = {0};
    pi2_sample_opts o = {-1, 0, 1, 0};
    assert_int_equal(pi2_sampler_create(&s, 4, &o, &err), PI2_EINVAL);
    assert_non_null(strstr(err.msg, "temperature"));
    o = (pi2_sample_opts){1, -1, 1, 0};
    assert_int_equal(pi2_sampler_create(&s, 4, &o, NULL), PI2_EINVAL);
    o = (pi2_sample_opts){1, 0, 0, 0};
    assert_int_equal(pi2_sampler_create(&s, 4, &o, NULL), PI2_EINVAL);
    o = (pi2_sample_opts){INFINITY, 0, 1, 0};
    assert_int_equal(pi2_sampler_create(&s, 4, &o, NULL), PI2_EINVAL);
    o = (pi2_sample_opts){1, 0, 1, 0};
    assert_int_equal(pi2_sampler_create(&s, 0, &o, NULL), PI2_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_distribution),
        cmocka_unit_test(test_bad_options),
    };
    return cmocka_run_group_tests_name("sample", tests, NULL, NULL);
}
