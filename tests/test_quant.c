/* quant: Q4/Q8 layout, round-trip bounds, idempotence, the searched Q4
 * scale, activation quantization and the reference dot product (the SIMD kernels are tested
 * against it in test_kernels.c). */
#include "tests/testutil.h"

#include "formats/common.h"
#include "formats/quant.h"
#include "tests/testquant.h"

#include <float.h>
#include <math.h>

/* Fail with a formatted message (cmocka's assert_true only shows the text). */
#define CHECK(cond, ...)                              \
    do {                                              \
        if (!(cond)) {                                \
            print_error("check failed: %s: ", #cond); \
            print_error(__VA_ARGS__);                 \
            print_error("\n");                        \
            fail();                                   \
        }                                             \
    } while (0)

static const pi2_qtype QTYPES[] = {PI2_QT_Q8, PI2_QT_Q4};

static double f16d(uint16_t h) { return (double)pi2_f16_to_f32(h); }

/* fp16 spacing at |D| (as documented in quant.h). */
static double ulp16(uint16_t h)
{
    int e = (h >> 10) & 0x1f;
    return e == 0 ? ldexp(1.0, -24) : ldexp(1.0, e - 25);
}

/* Check the documented properties of one quantized row against its source:
 * the scale is d rounded toward zero, and each element's error is within
 * the bound of its category. Returns the number of elements whose error
 * exceeded |D|/2 (they must all be in the documented exceptions). */
static int check_row(const float *x, const qrow *q, const float *y, const char *what)
{
    int over_half = 0;
    for (int64_t g = 0; g < q->cols / PI2_Q_GROUP; g++) {
        const float *xg = x + g * PI2_Q_GROUP;
        const float *yg = y + g * PI2_Q_GROUP;
        uint16_t h = q->scales[g];
        double D = f16d(h), aD = fabs(D), m = group_m(xg);
        double d = q->t == PI2_QT_Q4 ? m / -8.0 : fabs(m) / 127.0;
        CHECK(h != 0x8000, "%s group %lld: zero scale stored as -0", what, (long long)g);
        CHECK(aD <= fabs(d) && fabs(d) < aD + ulp16(h), "%s group %lld: scale %a is not d=%a toward zero", what,
              (long long)g, D, d);
        if (q->t == PI2_QT_Q4 && h != 0)
            CHECK((D < 0) == (m > 0), "%s group %lld: Q4 scale sign", what, (long long)g);
        double bound = pi2_q_error_bound(q->t, h);
        for (int j = 0; j < PI2_Q_GROUP; j++) {
            double err = fabs((double)xg[j] - (double)yg[j]);
            CHECK(err <= bound, "%s group %lld elem %d: x=%a y=%a err=%a > bound %a (D=%a)", what, (long long)g, j,
                  (double)xg[j], (double)yg[j], err, bound, D);
            if (err > aD / 2)
                over_half++;
            if (q->t == PI2_QT_Q8) {
                if (aD >= 0x1p-14) /* normal scale: half a step for every element */
                    CHECK(err <= aD / 2, "%s group %lld elem %d: Q8 err=%a > D/2", what, (long long)g, j, err);
                else
                    CHECK(err <= fmax(aD / 2, fabs(m) - 127 * aD), "%s: Q8 subnormal clamp bound", what);
            } else if (h != 0 && (double)xg[j] / D > 7.5) { /* far side: clamped to 7*D */
                CHECK(yg[j] == (float)(7 * D), "%s: far-side element not clamped to 7D", what);
                CHECK(err <= fabs(m) - 7 * aD, "%s group %lld elem %d: far-side err=%a", what, (long long)g, j, err);
            } else {
                CHECK(err <= fmax(aD / 2, fabs(m) - 8 * aD), "%s group %lld elem %d: Q4 err=%a > max(|D|/2, |m|-8|D|)",
                      what, (long long)g, j, err);
                if (aD >= 0x1p-14)
                    CHECK(err <= aD / 2, "%s group %lld elem %d: Q4 near-side err=%a > |D|/2", what, (long long)g, j,
                          err);
            }
        }
    }
    return over_half;
}

/* ---- tests ---- */

static void test_type_names(void **state)
{
    (void)state;
    pi2_err err = {0};
    pi2_qtype t;
    const pi2_qtype all[] = {PI2_QT_F32, PI2_QT_Q8, PI2_QT_Q4};
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(pi2_q_type_parse(pi2_q_type_name(all[i]), &t, &err), 0);
        assert_int_equal(t, all[i]);
    }
    assert_string_equal(pi2_q_type_name(PI2_QT_Q4), "q4");
    assert_string_equal(pi2_q_type_name((pi2_qtype)9), "?");
    assert_int_equal(pi2_q_type_parse("Q4", &t, &err), PI2_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "'Q4'"));
    assert_non_null(strstr(err.msg, "f32, q8 or q4"));
    assert_int_equal(pi2_q_type_parse(NULL, &t, NULL), PI2_EUNSUPPORTED);
}

static void test_shapes_and_bad_cols(void **state)
{
    (void)state;
    assert_int_equal(pi2_q_payload_row_bytes(PI2_QT_Q4, 4096), 2048);
    assert_int_equal(pi2_q_payload_row_bytes(PI2_QT_Q8, 4096), 4096);
    assert_int_equal(pi2_q_payload_row_bytes(PI2_QT_F32, 5), 20);
    assert_int_equal(pi2_q_scale_row_count(PI2_QT_Q4, 4096), 128);
    assert_int_equal(pi2_q_scale_row_count(PI2_QT_Q8, 96), 3);
    assert_int_equal(pi2_q_scale_row_count(PI2_QT_F32, 4096), 0);

    pi2_err err = {0};
    assert_int_equal(pi2_q_check_cols(PI2_QT_Q4, 4096, "w", &err), 0);
    assert_int_equal(pi2_q_check_cols(PI2_QT_F32, 7, "norm", &err), 0);
    assert_int_equal(pi2_q_check_cols(PI2_QT_Q4, 100, "model.layers.0.mlp.up_proj.weight", &err), PI2_ESHAPE);
    assert_string_equal(err.msg,
                        "model.layers.0.mlp.up_proj.weight: 100 columns is not a multiple of the q4 group size 32");
    const int64_t bad[] = {0, -32, 16, 33, 4096 + 16};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        for (size_t k = 0; k < 2; k++) {
            pi2_err_clear(&err);
            assert_int_equal(pi2_q_check_cols(QTYPES[k], bad[i], "w", &err), PI2_ESHAPE);
            assert_int_equal(err.code, PI2_ESHAPE);
            assert_int_equal(pi2_q_payload_row_bytes(QTYPES[k], bad[i]), 0);
            assert_int_equal(pi2_q_scale_row_count(QTYPES[k], bad[i]), 0);
        }
    }
    pi2_err_clear(&err);
    assert_int_equal(pi2_q_check_cols(PI2_QT_F32, 0, "norm", &err), PI2_ESHAPE);
    assert_string_equal(err.msg, "norm: 0 columns (need at least 1)");
    assert_int_equal(pi2_q_check_cols(PI2_QT_F32, INT64_MAX, "w", NULL), PI2_ERANGE);
    assert_int_equal(pi2_q_check_cols((pi2_qtype)7, 32, "w", NULL), PI2_EINVAL);
    assert_int_equal(pi2_q_check_cols(PI2_QT_Q4, 4096, NULL, NULL), 0);
}

/* Nibble order, scale sign, rounding and Q4's clamp side on a handcrafted
 * group with scale -1 / +1. */
static void test_q4_layout(void **state)
{
    (void)state;
    float x[32];
    uint16_t s;
    uint8_t p[16];
    float y[32];
    /* m = -8 first, so d = 1: q_j = x_j + 8 = j, q_{j+16} = 15 - j. */
    for (int j = 0; j < 16; j++) {
        x[j] = (float)(j - 8);
        x[j + 16] = (float)(7 - j);
    }
    assert_int_equal(pi2_q_quantize_row(PI2_QT_Q4, x, 32, &s, p), 0);
    assert_int_equal(s, 0x3c00);
    for (int j = 0; j < 16; j++)
        assert_int_equal(p[j], j | (15 - j) << 4); /* low nibble: elem j, high: elem j+16 */
    assert_int_equal(p[0], 0xf0);
    assert_int_equal(p[15], 0x0f);
    pi2_q_dequantize_row(PI2_QT_Q4, &s, p, 32, y);
    assert_memory_equal(x, y, sizeof x);

    /* m = +8 first, so d = -1; values chosen around the rounding ties. */
    static const float in[8] = {8.0f, -8.0f, 2.5f, -2.5f, 0.49f, 7.5f, -7.5f, -7.6f};
    static const float out[8] = {8.0f, -7.0f, 3.0f, -3.0f, 0.0f, 8.0f, -7.0f, -7.0f};
    memset(x, 0, sizeof x);
    memcpy(x, in, sizeof in);
    assert_int_equal(pi2_q_quantize_row(PI2_QT_Q4, x, 32, &s, p), 0);
    assert_int_equal(s, 0xbc00);
    pi2_q_dequantize_row(PI2_QT_Q4, &s, p, 32, y);
    for (int j = 0; j < 8; j++)
        CHECK(y[j] == out[j], "elem %d: %g -> %g, want %g", j, (double)in[j], (double)y[j], (double)out[j]);
    for (int j = 8; j < 32; j++)
        assert_true(y[j] == 0.0f);
    assert_int_equal(p[0] & 0x0f, 0);  /* 8 / -1 = -8 -> q 0 */
    assert_int_equal(p[1] & 0x0f, 15); /* -8 / -1 = 8 -> clamp 15 */
    /* the far side of the grid: -m comes back as 7/8 of it (error |D|), and
     * -7.6 errs by 0.6 > |D|/2; both are within the documented bound */
    assert_true(fabsf(x[1] - y[1]) == 1.0f);
    assert_true(fabsf(x[7] - y[7]) > 0.5f);
    assert_true(fabsf(x[1] - y[1]) <= pi2_q_error_bound(PI2_QT_Q4, s));

    /* toward zero: d = 1 + 1.5*2^-11 would round to nearest as 1 + 2^-10;
     * stored as 1.0 and m still lands exactly on q = 0 */
    memset(x, 0, sizeof x);
    x[3] = -8.0f * (1.0f + 1.5f / 2048);
    x[4] = -x[3];
    assert_int_equal(pi2_q_quantize_row(PI2_QT_Q4, x, 32, &s, p), 0);
    assert_int_equal(s, 0x3c00);
    assert_int_equal(p[3] & 0x0f, 0);
    assert_int_equal(p[4] & 0x0f, 15);

    /* all zero (and negative zero): scale +0, every nibble 8 */
    for (int j = 0; j < 32; j++)
        x[j] = j & 1 ? -0.0f : 0.0f;
    assert_int_equal(pi2_q_quantize_row(PI2_QT_Q4, x, 32, &s, p), 0);
    assert_int_equal(s, 0);
    for (int j = 0; j < 16; j++)
        assert_int_equal(p[j], 0x88);
}

static void test_q8_layout(void **state)
{
    (void)state;
    float x[64] = {0};
    uint16_t s[2];
    uint8_t p[64];
    float y[64];
    static const float in[6] = {127.0f, -127.0f, 0.5f, -0.5f, 1.49f, -126.5f};
    static const uint8_t want[6] = {0x7f, 0x81, 0x01, 0xff, 0x01, 0x81};
    memcpy(x, in, sizeof in);
    x[32 + 5] = -254.0f; /* second group: d = 2 */
    x[32 + 6] = 3.0f;    /* 1.5 -> 2 (half away from zero) */
    assert_int_equal(pi2_q_quantize_row(PI2_QT_Q8, x, 64, s, p), 0);
    assert_int_equal(s[0], 0x3c00);
    assert_int_equal(s[1], 0x4000);
    assert_memory_equal(p, want, sizeof want);
    for (int j = 6; j < 32; j++)
        assert_int_equal(p[j], 0);
    assert_int_equal(p[32 + 5], 0x81);
    assert_int_equal(p[32 + 6], 2);
    pi2_q_dequantize_row(PI2_QT_Q8, s, p, 64, y);
    assert_true(y[0] == 127.0f && y[1] == -127.0f && y[2] == 1.0f && y[3] == -1.0f && y[5] == -127.0f);
    assert_true(y[32 + 5] == -254.0f && y[32 + 6] == 4.0f);

    /* toward zero: amax/127 = 1 + 1.5*2^-11 stores 1.0 and amax clamps to 127 */
    memset(x, 0, sizeof x);
    x[9] = -127.0f * (1.0f + 1.5f / 2048);
    assert_int_equal(pi2_q_quantize_row(PI2_QT_Q8, x, 32, s, p), 0);
    assert_int_equal(s[0], 0x3c00);
    assert_int_equal(p[9], 0x81);

    /* a subnormal scale below d: the clamped element errs by more than D/2,
     * up to the documented 127*ulp(D) */
    memset(x, 0, sizeof x);
    x[0] = (float)(127 * 1.9 * 0x1p-24);
    assert_int_equal(pi2_q_quantize_row(PI2_QT_Q8, x, 32, s, p), 0);
    assert_int_equal(s[0], 0x0001);
    assert_int_equal(p[0], 127);
    pi2_q_dequantize_row(PI2_QT_Q8, s, p, 32, y);
    double err = fabs((double)x[0] - (double)y[0]);
    assert_true(err > 0.5 * 0x1p-24);
    assert_true(err <= pi2_q_error_bound(PI2_QT_Q8, s[0]));
}

static void test_error_bound_values(void **state)
{
    (void)state;
    assert_true(pi2_q_error_bound(PI2_QT_Q4, 0x3c00) == 1.0f + 8.0f / 1024);
    assert_true(pi2_q_error_bound(PI2_QT_Q4, 0xbc00) == 1.0f + 8.0f / 1024);
    assert_true(pi2_q_error_bound(PI2_QT_Q4, 0x0000) == 8 * 0x1p-24f);
    assert_true(pi2_q_error_bound(PI2_QT_Q4, 0x7bff) == 65504.0f + 8 * 32.0f);
    assert_true(pi2_q_error_bound(PI2_QT_Q8, 0x3c00) == 0.5f);
    assert_true(pi2_q_error_bound(PI2_QT_Q8, 0x7bff) == 32752.0f);
    assert_true(pi2_q_error_bound(PI2_QT_Q8, 0x0001) == 127 * 0x1p-24f);
    assert_true(pi2_q_error_bound(PI2_QT_Q8, 0x0400) == 0x1p-15f); /* smallest normal: D/2 */
    assert_true(pi2_q_error_bound(PI2_QT_F32, 0) == 0.0f);
    assert_true(isinf(pi2_q_error_bound(PI2_QT_Q8, 0x7c00)));
}

/* Random rows of every distribution against the documented bounds, and
 * quantize(dequantize(q)) == q byte for byte. */
static void test_roundtrip_and_idempotence(void **state)
{
    (void)state;
    pi2_rng r;
    pi2_rng_seed(&r, 0x5eed);
    const int64_t shapes[] = {32, 64, 96, 4096 + 32};
    int far_side_hits = 0;
    for (size_t k = 0; k < 2; k++) {
        pi2_qtype t = QTYPES[k];
        for (int dist = 0; dist < D_COUNT; dist++) {
            for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
                for (int rep = 0; rep < 3; rep++) {
                    int64_t cols = shapes[si];
                    float *x = pi2_malloc_array((size_t)cols, sizeof(float));
                    float *y = pi2_malloc_array((size_t)cols, sizeof(float));
                    float *y2 = pi2_malloc_array((size_t)cols, sizeof(float));
                    assert_true(x && y && y2);
                    gen_row(&r, dist, t, x, cols);
                    qrow q = qrow_new(t, cols), q2 = qrow_new(t, cols);
                    CHECK(pi2_q_quantize_row(t, x, cols, q.scales, q.payload) == 0, "%s %s", pi2_q_type_name(t),
                          DIST_NAMES[dist]);
                    pi2_q_dequantize_row(t, q.scales, q.payload, cols, y);
                    char what[64];
                    snprintf(what, sizeof what, "%s/%s/%lld", pi2_q_type_name(t), DIST_NAMES[dist], (long long)cols);
                    int over = check_row(x, &q, y, what);
                    if (t == PI2_QT_Q4)
                        far_side_hits += over;
                    if (dist == D_ZERO) {
                        for (int64_t g = 0; g < cols / 32; g++)
                            assert_int_equal(q.scales[g], 0);
                    }
                    /* idempotence */
                    assert_int_equal(pi2_q_quantize_row(t, y, cols, q2.scales, q2.payload), 0);
                    CHECK(memcmp(q.scales, q2.scales, pi2_q_scale_row_count(t, cols) * 2) == 0,
                          "%s: scales change on requantization", what);
                    CHECK(memcmp(q.payload, q2.payload, pi2_q_payload_row_bytes(t, cols)) == 0,
                          "%s: payload changes on requantization", what);
                    pi2_q_dequantize_row(t, q2.scales, q2.payload, cols, y2);
                    assert_memory_equal(y, y2, (size_t)cols * sizeof(float));
                    qrow_free(&q);
                    qrow_free(&q2);
                    free(x);
                    free(y);
                    free(y2);
                }
            }
        }
    }
    /* the far-side exception is real, not just documented */
    assert_true(far_side_hits > 0);
}

static void test_quantize_rejects(void **state)
{
    (void)state;
    float x[64];
    uint16_t s[2];
    uint8_t p[256];
    const float bad_vals[] = {NAN, INFINITY, -INFINITY};
    const pi2_qtype all[] = {PI2_QT_F32, PI2_QT_Q8, PI2_QT_Q4};
    for (size_t k = 0; k < 3; k++) {
        for (size_t b = 0; b < 3; b++) {
            for (int j = 0; j < 64; j++)
                x[j] = (float)j;
            x[40] = bad_vals[b];
            memset(s, 0xab, sizeof s);
            memset(p, 0xab, sizeof p);
            assert_int_equal(pi2_q_quantize_row(all[k], x, 64, s, p), PI2_ERANGE);
            for (size_t i = 0; i < sizeof p; i++) /* nothing written */
                assert_int_equal(p[i], 0xab);
            assert_int_equal(s[0], 0xabab);
        }
    }
    /* scale limits: |d| < 65536 */
    memset(x, 0, sizeof x);
    x[5] = 524288.0f;
    assert_int_equal(pi2_q_quantize_row(PI2_QT_Q4, x, 32, s, p), PI2_ERANGE);
    x[5] = -524288.0f;
    assert_int_equal(pi2_q_quantize_row(PI2_QT_Q4, x, 32, s, p), PI2_ERANGE);
    x[5] = 524287.9375f;
    assert_int_equal(pi2_q_quantize_row(PI2_QT_Q4, x, 32, s, p), 0);
    assert_int_equal(s[0], 0xfbff); /* -65504 */
    assert_int_equal(pi2_q_quantize_row(PI2_QT_Q8, x, 32, s, p), 0);
    x[5] = 8323072.0f; /* 127 * 65536 */
    assert_int_equal(pi2_q_quantize_row(PI2_QT_Q8, x, 32, s, p), PI2_ERANGE);
    x[5] = 8323071.0f;
    assert_int_equal(pi2_q_quantize_row(PI2_QT_Q8, x, 32, s, p), 0);
    assert_int_equal(s[0], 0x7bff);
    x[5] = 1e30f; /* F32 takes any finite value */
    assert_int_equal(pi2_q_quantize_row(PI2_QT_F32, x, 32, NULL, p), 0);
    assert_int_equal(pi2_q_quantize_row((pi2_qtype)5, x, 32, s, p), PI2_EINVAL);
}

static void test_f32_passthrough(void **state)
{
    (void)state;
    float x[64], y[64], o[64];
    uint8_t p[256];
    for (int j = 0; j < 64; j++)
        x[j] = (float)j * 0.25f - 3.0f;
    assert_int_equal(pi2_q_quantize_row(PI2_QT_F32, x, 5, NULL, p), 0);
    assert_memory_equal(p, x, 5 * sizeof(float));
    assert_int_equal(pi2_q_quantize_row(PI2_QT_F32, x, 64, NULL, p), 0);
    pi2_q_dequantize_row(PI2_QT_F32, NULL, p + 0, 64, y);
    assert_memory_equal(x, y, sizeof x);
    for (int j = 0; j < 64; j++)
        o[j] = 1.0f;
    pi2_q_axpy_row(PI2_QT_F32, 2.0f, NULL, p, 64, o);
    for (int j = 0; j < 64; j++)
        assert_true(o[j] == 1.0f + 2.0f * x[j]);
    int8_t aq[64];
    float as[2] = {0.5f, 2.0f};
    for (int j = 0; j < 64; j++)
        aq[j] = (int8_t)(j % 7 - 3);
    double ref = 0;
    for (int j = 0; j < 64; j++)
        ref += (double)x[j] * aq[j] * as[j / 32];
    float got = pi2_q_dot_q8act_scalar(PI2_QT_F32, NULL, p, as, aq, 64);
    assert_true(fabs(got - ref) <= 1e-5 * fabs(ref));
}

static void test_q8act(void **state)
{
    (void)state;
    pi2_rng r;
    pi2_rng_seed(&r, 77);
    enum { N = 4096 + 32 };
    float *x = pi2_malloc_array(N, sizeof(float));
    float *s = pi2_malloc_array(N / 32, sizeof(float));
    int8_t *q = pi2_malloc_array(N, 1);
    assert_true(x && s && q);
    for (int rep = 0; rep < 20; rep++) {
        for (int j = 0; j < N; j++)
            x[j] = (float)ldexp(pi2_rng_normal(&r), (j / 32 * 5) % 60 - 40);
        pi2_q8act_quantize(x, N, s, q);
        for (int b = 0; b < N / 32; b++) {
            double amax = 0;
            int at = 0;
            for (int j = 0; j < 32; j++) {
                if (fabs((double)x[b * 32 + j]) > amax) {
                    amax = fabs((double)x[b * 32 + j]);
                    at = j;
                }
            }
            assert_true(s[b] == (float)amax / 127.0f);
            assert_int_equal(abs(q[b * 32 + at]), 127);
            for (int j = 0; j < 32; j++) {
                int v = q[b * 32 + j];
                assert_true(v >= -127 && v <= 127);
                double err = fabs((double)x[b * 32 + j] - (double)v * s[b]);
                CHECK(err <= 0.5 * s[b] + amax * 0x1p-21, "block %d elem %d err %g s %g", b, j, err, (double)s[b]);
            }
        }
    }
    /* special blocks: zero, tiny, NaN, inf, -amax; neighbours unaffected */
    float xs[5 * 32];
    for (int j = 0; j < 5 * 32; j++)
        xs[j] = 0.0f;
    xs[32 + 3] = 1e-31f; /* below 2^-100: zero block */
    xs[64 + 1] = 1.0f;
    xs[64 + 2] = NAN;
    xs[96 + 4] = -INFINITY;
    xs[128 + 0] = -127.0f; /* scale 1: exact ties */
    xs[128 + 1] = 2.5f;
    xs[128 + 2] = 3.5f;
    float ss[5];
    int8_t qs[5 * 32];
    pi2_q8act_quantize(xs, 5 * 32, ss, qs);
    assert_true(ss[0] == 0.0f && ss[1] == 0.0f);
    assert_true(isnan(ss[2]) && isnan(ss[3]));
    for (int j = 0; j < 4 * 32; j++)
        assert_int_equal(qs[j], 0);
    assert_true(ss[4] == 1.0f);
    assert_int_equal(qs[128], -127);
    assert_int_equal(qs[129], 2); /* rint: half to even */
    assert_int_equal(qs[130], 4);
    free(x);
    free(s);
    free(q);
}

/* Exact value of a row's dot: dequantized weights times dequantized
 * activations in double; *mag = sum of |terms| (the scale of float error). */
static double dot_ref(const qrow *w, const float *as, const int8_t *aq, double *mag)
{
    float *y = pi2_malloc_array((size_t)w->cols, sizeof(float));
    assert_non_null(y);
    pi2_q_dequantize_row(w->t, w->scales, w->payload, w->cols, y);
    double s = 0, m = 0;
    for (int64_t j = 0; j < w->cols; j++) {
        double v = (double)y[j] * ((double)aq[j] * (double)as[j / 32]);
        s += v;
        m += fabs(v);
    }
    free(y);
    *mag = m;
    return s;
}

static void test_dot_reference(void **state)
{
    (void)state;
    pi2_rng r;
    pi2_rng_seed(&r, 123);
    const int64_t shapes[] = {32, 64, 96, 160, 4096 + 32, 11008};
    for (size_t k = 0; k < 2; k++) {
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            for (int rep = 0; rep < 4; rep++) {
                int64_t n = shapes[si];
                float *x = pi2_malloc_array((size_t)n, sizeof(float));
                float *w = pi2_malloc_array((size_t)n, sizeof(float));
                float *as = pi2_malloc_array((size_t)n / 32, sizeof(float));
                int8_t *aq = pi2_malloc_array((size_t)n, 1);
                assert_true(x && w && as && aq);
                gen_row(&r, rep == 3 ? D_MIXED : D_GAUSS, QTYPES[k], w, n);
                gen_row(&r, rep == 2 ? D_HEAVY : D_GAUSS, QTYPES[k], x, n);
                qrow q = qrow_new(QTYPES[k], n);
                assert_int_equal(pi2_q_quantize_row(q.t, w, n, q.scales, q.payload), 0);
                pi2_q8act_quantize(x, n, as, aq);
                double mag, ref = dot_ref(&q, as, aq, &mag);
                float got = pi2_q_dot_q8act_scalar(q.t, q.scales, q.payload, as, aq, n);
                /* the float rounding of each block's combined scale, and of the result */
                double tol = 3 * 0x1p-24 * mag;
                CHECK(fabs((double)got - ref) <= tol, "%s n=%lld: got %.9g ref %.9g tol %g", pi2_q_type_name(q.t),
                      (long long)n, (double)got, ref, tol);
                /* the documented element bounds compose into a bound on the
                 * dot's quantization error: |w x - w' x'| <= |w - w'||x| + |w'||x - x'| */
                float *y = pi2_malloc_array((size_t)n, sizeof(float));
                assert_non_null(y);
                pi2_q_dequantize_row(q.t, q.scales, q.payload, n, y);
                double f = 0, qtol = 0;
                for (int64_t j = 0; j < n; j++) {
                    int64_t b = j / 32;
                    double amax = 0;
                    for (int i = 0; i < 32; i++)
                        amax = fmax(amax, fabs((double)x[b * 32 + i]));
                    f += (double)w[j] * x[j];
                    qtol += pi2_q_error_bound(q.t, q.scales[b]) * fabs((double)x[j]) +
                            fabs((double)y[j]) * (0.5 * as[b] + amax * 0x1p-21);
                }
                CHECK(fabs(ref - f) <= qtol * (1 + 1e-9), "%s n=%lld: quantized %g vs f32 %g (bound %g)",
                      pi2_q_type_name(q.t), (long long)n, ref, f, qtol);
                free(y);
                qrow_free(&q);
                free(x);
                free(w);
                free(as);
                free(aq);
            }
        }
    }
}

static void test_axpy(void **state)
{
    (void)state;
    pi2_rng r;
    pi2_rng_seed(&r, 99);
    enum { N = 4096 + 96 };
    float *w = pi2_malloc_array(N, sizeof(float)), *y = pi2_malloc_array(N, sizeof(float));
    float *o = pi2_malloc_array(N, sizeof(float)), *o0 = pi2_malloc_array(N, sizeof(float));
    assert_true(w && y && o && o0);
    for (size_t k = 0; k < 2; k++) {
        qrow q = qrow_new(QTYPES[k], N);
        gen_row(&r, D_MIXED, q.t, w, N);
        assert_int_equal(pi2_q_quantize_row(q.t, w, N, q.scales, q.payload), 0);
        pi2_q_dequantize_row(q.t, q.scales, q.payload, N, y);
        for (int j = 0; j < N; j++)
            o[j] = o0[j] = (float)pi2_rng_normal(&r);
        float a = -0.37f;
        pi2_q_axpy_row(q.t, a, q.scales, q.payload, N, o);
        for (int j = 0; j < N; j++) {
            float want = o0[j] + a * y[j]; /* the documented float evaluation */
            CHECK(o[j] == want, "%s elem %d: %a vs %a", pi2_q_type_name(q.t), j, (double)o[j], (double)want);
        }
        qrow_free(&q);
    }
    free(w);
    free(y);
    free(o);
    free(o0);
}

/* Every element's q is exactly round(x / D) (half away from zero, in
 * double) for the stored scale D, clamped: the quantizer's fast float path
 * must fall back to the exact one at near ties. Rows are built with many
 * values within a few ulps of half-integer multiples of the scale. */
static void test_rounding_exact(void **state)
{
    (void)state;
    pi2_rng rng;
    pi2_rng_seed(&rng, 77);
    const pi2_qtype types[] = {PI2_QT_Q4, PI2_QT_Q8};
    float x[256];
    uint16_t sc[8];
    uint8_t pay[256];
    for (int it = 0; it < 4000; it++) {
        pi2_qtype t = types[it & 1];
        double base = ldexp(1.0, (int)(pi2_rng_u64(&rng) % 30) - 20);
        for (int j = 0; j < 256; j++) {
            double v = pi2_rng_normal(&rng) * base;
            if (pi2_rng_u64(&rng) % 3 == 0) { /* near a half step of a plausible scale */
                double step = base * (t == PI2_QT_Q4 ? 0.5 : 0.03);
                v = (floor(v / step) + 0.5) * step;
                v = nextafterf((float)v, (pi2_rng_u64(&rng) & 1) ? INFINITY : -INFINITY);
            }
            x[j] = (float)v;
        }
        assert_int_equal(pi2_q_quantize_row(t, x, 256, sc, pay), 0);
        for (int j = 0; j < 256; j++) {
            double D = f16d(sc[j / 32]);
            int q;
            if (t == PI2_QT_Q4) {
                int e = D == 0 ? 8 : (int)round((double)x[j] / D) + 8;
                e = e < 0 ? 0 : e > 15 ? 15 : e;
                int k = j % 32;
                uint8_t b = pay[(j / 32) * 16 + (k % 16)];
                q = k < 16 ? (b & 0x0f) : (b >> 4);
                if (q != e)
                    fail_msg("q4 it %d elem %d: x=%a D=%a q=%d expected %d", it, j, (double)x[j], D, q, e);
            } else {
                int e = D == 0 ? 0 : (int)round((double)x[j] / D);
                e = e < -127 ? -127 : e > 127 ? 127 : e;
                q = (int8_t)pay[j];
                if (q != e)
                    fail_msg("q8 it %d elem %d: x=%a D=%a q=%d expected %d", it, j, (double)x[j], D, q, e);
            }
        }
    }
}

/* ---- the searched Q4 scale (pi2_q_quantize_row_search) ---- */

/* Group g's sum of imp_j * (x_j - y_j)^2 (imp NULL: weights 1). */
static double group_sq_err(const float *x, const float *y, const float *imp, int64_t g)
{
    double e = 0;
    for (int64_t j = g * PI2_Q_GROUP; j < (g + 1) * PI2_Q_GROUP; j++)
        e += (imp ? imp[j] : 1.0) * ((double)x[j] - y[j]) * ((double)x[j] - y[j]);
    return e;
}

/* Quantize x both ways; check every group's (weighted) error is no worse,
 * scales finite, the bytes the same on a second call; returns the total
 * errors in *plain_e and *search_e. */
static void check_search_row(const float *x, const float *imp, int64_t cols, const char *what, double *plain_e,
                             double *search_e)
{
    qrow p = qrow_new(PI2_QT_Q4, cols), q = qrow_new(PI2_QT_Q4, cols), q2 = qrow_new(PI2_QT_Q4, cols);
    float *yp = pi2_malloc_array((size_t)cols, sizeof(float)), *yq = pi2_malloc_array((size_t)cols, sizeof(float));
    assert_true(yp && yq);
    assert_int_equal(pi2_q_quantize_row(PI2_QT_Q4, x, cols, p.scales, p.payload), 0);
    assert_int_equal(pi2_q_quantize_row_search(PI2_QT_Q4, x, cols, imp, q.scales, q.payload), 0);
    assert_int_equal(pi2_q_quantize_row_search(PI2_QT_Q4, x, cols, imp, q2.scales, q2.payload), 0);
    CHECK(memcmp(q.scales, q2.scales, (size_t)cols / 16) == 0 && memcmp(q.payload, q2.payload, (size_t)cols / 2) == 0,
          "%s: not deterministic", what);
    pi2_q_dequantize_row(PI2_QT_Q4, p.scales, p.payload, cols, yp);
    pi2_q_dequantize_row(PI2_QT_Q4, q.scales, q.payload, cols, yq);
    for (int64_t g = 0; g < cols / PI2_Q_GROUP; g++) {
        double ep = group_sq_err(x, yp, imp, g), eq = group_sq_err(x, yq, imp, g);
        CHECK(eq <= ep, "%s group %lld: searched error %a above plain %a", what, (long long)g, eq, ep);
        CHECK((q.scales[g] & 0x7c00) != 0x7c00, "%s group %lld: scale not finite", what, (long long)g);
        double m = group_m(x + g * PI2_Q_GROUP), mi = 0; /* m is never clamped */
        for (int j = 0; j < PI2_Q_GROUP; j++)
            if (x[g * PI2_Q_GROUP + j] == m)
                mi = fabs(m - yq[g * PI2_Q_GROUP + j]);
        CHECK(mi <= fabs(f16d(q.scales[g])) * (0.5 + 0x1p-10) || ep == eq, "%s group %lld: m clamped", what,
              (long long)g);
        if (ep == 0) /* nothing to gain: the plain bytes */
            CHECK(q.scales[g] == p.scales[g] && !memcmp(q.payload + g * 16, p.payload + g * 16, 16),
                  "%s group %lld: exact group changed", what, (long long)g);
        *plain_e += ep;
        *search_e += eq;
    }
    qrow_free(&p);
    qrow_free(&q);
    qrow_free(&q2);
    free(yp);
    free(yq);
}

/* Every row distribution, unweighted and with random importances (some
 * zero): never worse per group, and clearly better on Gaussian rows. */
static void test_search_never_worse(void **state)
{
    (void)state;
    pi2_rng r;
    pi2_rng_seed(&r, 0x5ca1e);
    const int64_t shapes[] = {32, 96, 4096 + 32};
    double gauss_plain = 0, gauss_search = 0;
    for (int dist = 0; dist < D_COUNT; dist++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
            for (int rep = 0; rep < 4; rep++) {
                int64_t cols = shapes[si];
                float *x = pi2_malloc_array((size_t)cols, sizeof(float));
                float *imp = pi2_malloc_array((size_t)cols, sizeof(float));
                assert_true(x && imp);
                gen_row(&r, dist, PI2_QT_Q4, x, cols);
                for (int64_t j = 0; j < cols; j++)
                    imp[j] = j % 7 == 3 ? 0.0f : (float)exp(2.0 * pi2_rng_normal(&r));
                char what[64];
                snprintf(what, sizeof what, "%s/%lld/%s", DIST_NAMES[dist], (long long)cols, rep & 1 ? "imp" : "flat");
                double ep = 0, eq = 0;
                check_search_row(x, rep & 1 ? imp : NULL, cols, what, &ep, &eq);
                if (dist == D_GAUSS && !(rep & 1)) {
                    gauss_plain += ep;
                    gauss_search += eq;
                }
                free(x);
                free(imp);
            }
    CHECK(gauss_search < 0.92 * gauss_plain, "searched %g vs plain %g on Gaussian rows", gauss_search, gauss_plain);
}

/* Hand-made groups: all equal, one outlier among zeros, all zero,
 * fp16-subnormal scales, m's opposite at the far side, a huge group. */
static void test_search_adversarial(void **state)
{
    (void)state;
    float x[8 * PI2_Q_GROUP] = {0};
    for (int j = 0; j < 32; j++) {
        x[j] = 0.3f;                                /* all equal */
        x[32 + j] = j == 5 ? -7.0f : 0.0f;          /* one outlier, zeros */
        x[96 + j] = ldexpf((float)(j % 5) - 2, -27); /* subnormal scale */
        x[128 + j] = j == 0 ? 1.0f : j == 1 ? -1.0f : 0.01f * (float)(j - 16);
        x[160 + j] = j == 9 ? 100.0f : 0.5f;         /* outlier over a flat group */
        x[192 + j] = (j & 1 ? -1.0f : 1.0f) * 500000.0f;
        x[224 + j] = ldexpf(1.0f, -30) * (float)(j % 3);
    }
    double ep = 0, eq = 0;
    check_search_row(x, NULL, 8 * PI2_Q_GROUP, "adversarial", &ep, &eq);
    float imp[8 * PI2_Q_GROUP];
    for (int j = 0; j < 8 * PI2_Q_GROUP; j++)
        imp[j] = j % 2 ? 0.0f : 1e30f;
    check_search_row(x, imp, 8 * PI2_Q_GROUP, "adversarial/imp", &ep, &eq);
    uint16_t s[8];
    uint8_t p[128];
    assert_int_equal(pi2_q_quantize_row_search(PI2_QT_Q4, x, 256, NULL, s, p), 0);
    assert_int_equal(s[2], 0); /* the zero group as plain: +0 and every level 8 */
    for (int j = 32; j < 48; j++)
        assert_int_equal(p[j], 0x88);
}

/* Bad importances and values are refused with nothing written; Q8 rows
 * are the plain quantizer's. */
static void test_search_rejects(void **state)
{
    (void)state;
    float x[64], imp[64];
    for (int j = 0; j < 64; j++) {
        x[j] = (float)j - 30.5f;
        imp[j] = 1.0f;
    }
    uint16_t s[2], s2[2];
    uint8_t p[64], p2[64];
    const float bad[] = {-1.0f, NAN, INFINITY};
    for (size_t b = 0; b < 3; b++) {
        imp[17] = bad[b];
        memset(s, 0xab, sizeof s);
        memset(p, 0xab, sizeof p);
        assert_int_equal(pi2_q_quantize_row_search(PI2_QT_Q4, x, 64, imp, s, p), PI2_EINVAL);
        assert_int_equal(s[0], 0xabab);
        assert_int_equal(p[0], 0xab);
    }
    imp[17] = 1.0f;
    x[3] = NAN;
    assert_int_equal(pi2_q_quantize_row_search(PI2_QT_Q4, x, 64, imp, s, p), PI2_ERANGE);
    assert_int_equal(s[0], 0xabab);
    x[3] = 2.0f;
    assert_int_equal(pi2_q_quantize_row_search((pi2_qtype)7, x, 64, NULL, s, p), PI2_EINVAL);
    assert_int_equal(pi2_q_quantize_row_search(PI2_QT_Q8, x, 64, imp, s, p), 0);
    assert_int_equal(pi2_q_quantize_row(PI2_QT_Q8, x, 64, s2, p2), 0);
    assert_memory_equal(s, s2, sizeof s);
    assert_memory_equal(p, p2, sizeof p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_type_names),
        cmocka_unit_test(test_shapes_and_bad_cols),
        cmocka_unit_test(test_q4_layout),
        cmocka_unit_test(test_q8_layout),
        cmocka_unit_test(test_error_bound_values),
        cmocka_unit_test(test_roundtrip_and_idempotence),
        cmocka_unit_test(test_quantize_rejects),
        cmocka_unit_test(test_f32_passthrough),
        cmocka_unit_test(test_q8act),
        cmocka_unit_test(test_dot_reference),
        cmocka_unit_test(test_rounding_exact),
        cmocka_unit_test(test_axpy),
        cmocka_unit_test(test_search_never_worse),
        cmocka_unit_test(test_search_adversarial),
        cmocka_unit_test(test_search_rejects),
    };
    return cmocka_run_group_tests_name("quant", tests, NULL, NULL);
}
