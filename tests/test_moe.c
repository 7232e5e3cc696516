/* runtime/moe: the routing rule the engine, the reference and calibration
 * share: the k largest logits, largest first, the lower index on ties, and
 * the softmax over the chosen. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "runtime/moe.h"

#include <math.h>

static void test_order_and_ties(void **state)
{
    (void)state;
    const float lg[6] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f, 2.0f};
    int ch[4];
    double w[4];
    pi2_moe_route(lg, 6, 4, ch, w);
    assert_int_equal(ch[0], 1); /* three tied at 2.0: by index */
    assert_int_equal(ch[1], 3);
    assert_int_equal(ch[2], 5);
    assert_int_equal(ch[3], 4);
    assert_true(w[0] == w[1] && w[1] == w[2]);
    assert_true(w[3] < w[0]);
    double sum = w[0] + w[1] + w[2] + w[3];
    assert_true(fabs(sum - 1.0) < 1e-12);
    assert_true(fabs(w[3] / w[0] - exp(-1.0)) < 1e-12);
}

static void test_all_and_one(void **state)
{
    (void)state;
    const float lg[3] = {-3.0f, -1.0f, -2.0f};
    int ch[3];
    double w[3];
    pi2_moe_route(lg, 3, 1, ch, w);
    assert_int_equal(ch[0], 1);
    assert_true(w[0] == 1.0);
    pi2_moe_route(lg, 3, 3, ch, w);
    assert_int_equal(ch[0], 1);
    assert_int_equal(ch[1], 2);
    assert_int_equal(ch[2], 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order_and_ties),
        cmocka_unit_test(test_all_and_one),
    };
    return cmocka_run_group_tests_name("moe", tests, NULL, NULL);
}
