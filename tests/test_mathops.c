/* runtime/mathops: the top-k against a sort, and the engine's vectorized
 * activation rows against its one-value activation, special values
 * included. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "formats/common.h"
#include "runtime/mathops.h"
#include "tests/testutil.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* pi2_op_top_k against a sort, on random values with ties, k from 1 to n. */
static void test_top_k(void **state)
{
    (void)state;
    pi2_rng r;
    pi2_rng_seed(&r, 3);
    enum { N = 300 };
    float v[N], sorted[N];
    int32_t top[N];
    for (int it = 0; it < 200; it++) {
        int n = 1 + (int)(pi2_rng_uniform(&r) * N), k = 1 + (int)(pi2_rng_uniform(&r) * n);
        for (int i = 0; i < n; i++) /* a coarse grid: many ties */
            v[i] = (float)(int)(pi2_rng_uniform(&r) * 40) - 20.0f;
        memcpy(sorted, v, sizeof(float) * (size_t)n);
        qsort(sorted, (size_t)n, sizeof(float), pi2t_cmp_float_desc);
        memset(top, -1, sizeof top);
        pi2_op_top_k(v, n, k, top);
        bool seen[N] = {false};
        float picked[N];
        for (int i = 0; i < k; i++) {
            assert_true(top[i] >= 0 && top[i] < n);
            assert_false(seen[top[i]]); /* each index once */
            seen[top[i]] = true;
            picked[i] = v[top[i]];
        }
        qsort(picked, (size_t)k, sizeof(float), pi2t_cmp_float_desc);
        for (int i = 0; i < k; i++) /* the k largest values, ties in any order */
            assert_true(picked[i] == sorted[i]);
    }
}

/* The vectorized activation rows give pi2_op_act's bits, special values
 * included (closed gates are +0, NaN gates close, NaN ups pass open gates). */
static void test_act_rows(void **state)
{
    (void)state;
    enum { N = 203 };
    const float sp[] = {0.0f, -0.0f, 1.0f, -1.0f, 0x1p-140f, -0x1p-140f, INFINITY, -INFINITY, NAN, 3e38f};
    enum { NS = sizeof sp / sizeof *sp };
    float g[N], u[N], want[N];
    pi2_rng r;
    pi2_rng_seed(&r, 23);
    /* FATReLU with thresholds 0 (ReGLU), 0.5 (gates of [-4, 4] either side),
     * a tiny one and +inf (every gate closed; NaN gates too) */
    const struct { pi2_act act; float t; } acts[] = {
        {PI2_ACT_RELU, 0}, {PI2_ACT_DRELU, 0}, {PI2_ACT_SILU, 0}, {PI2_ACT_FATRELU, 0},
        {PI2_ACT_FATRELU, 0.5f}, {PI2_ACT_FATRELU, 0x1p-140f}, {PI2_ACT_FATRELU, INFINITY},
        {PI2_ACT_RELU, 0.5f}, /* t is FATReLU's only */
    };
    for (size_t a = 0; a < sizeof acts / sizeof *acts; a++)
        for (int n = 0; n <= N; n += n < 20 ? 1 : 61) {
            int open = 0;
            for (int i = 0; i < N; i++) {
                g[i] = i < NS * NS ? sp[i % NS] : (float)(pi2_rng_uniform(&r) * 8 - 4);
                u[i] = i < NS * NS ? sp[i / NS % NS] : (float)(pi2_rng_uniform(&r) * 8 - 4);
                want[i] = i < n ? pi2_op_act(acts[a].act, g[i], u[i], acts[a].t) : g[i];
                if (acts[a].act == PI2_ACT_FATRELU && i < n) /* the scalar twin is the definition */
                    assert_true(g[i] > acts[a].t ? want[i] == g[i] * u[i] || isnan(want[i]) : want[i] == 0.0f);
                open += i < n && want[i] != 0.0f;
            }
            pi2_op_act_rows(acts[a].act, g, u, n, acts[a].t);
            assert_memory_equal(g, want, sizeof g);
            if (acts[a].act == PI2_ACT_FATRELU && isinf(acts[a].t))
                assert_int_equal(open, 0);
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_top_k),
        cmocka_unit_test(test_act_rows),
    };
    return cmocka_run_group_tests_name("mathops", tests, NULL, NULL);
}
