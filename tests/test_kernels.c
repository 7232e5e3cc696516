/* kernels: the one ISA state, activation quantization against
 * pi2_q8act_quantize, the scalar twins against double-precision
 * dequantize-and-dot, and every SIMD kernel this CPU can run against its
 * scalar twin on ragged shapes (rows, tokens, blocks), shuffled separately
 * allocated rows, and extreme values. */
#include "tests/testutil.h"

#include "formats/common.h"
#include "formats/quant.h"
#include "runtime/kernels.h"

#include <float.h>
#include <math.h>
#include <sys/mman.h>
#include <unistd.h>

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

static int64_t rand_int(pi2_rng *r, int64_t lo, int64_t hi) /* [lo, hi] */
{
    return lo + (int64_t)(pi2_rng_u64(r) % (uint64_t)(hi - lo + 1));
}

static void *xmalloc(size_t n, size_t size)
{
    void *p = pi2_malloc_array(n ? n : 1, size);
    assert_non_null(p);
    return p;
}

/* ---- weight rows: each row its own exact-size allocation (so ASan sees
 * any overread), handed to the kernels in a shuffled order ---- */

typedef struct wrows {
    pi2_qtype t;
    int64_t n;
    int nrows;
    uint8_t **pay;
    uint16_t **sc;
    const uint8_t **wp; /* wp[r] = pay[perm[r]] */
    const uint16_t **ws;
} wrows;

enum { W_RANDOM, W_QUANTIZED, W_EXTREME };

static void wrows_fill(pi2_rng *r, wrows *w, int kind)
{
    int64_t nb = w->n / PI2_Q_GROUP;
    size_t pb = pi2_q_payload_row_bytes(w->t, w->n);
    float *x = xmalloc((size_t)w->n, sizeof(float));
    for (int i = 0; i < w->nrows; i++) {
        uint8_t *p = w->pay[i];
        uint16_t *s = w->sc[i];
        if (kind == W_QUANTIZED) {
            double sigma = ldexp(1.0, (int)rand_int(r, -8, 4));
            for (int64_t j = 0; j < w->n; j++)
                x[j] = (float)(sigma * pi2_rng_normal(r));
            assert_int_equal(pi2_q_quantize_row(w->t, x, w->n, s, p), 0);
            continue;
        }
        /* random bytes: every nibble, and -128 in Q8 */
        for (size_t k = 0; k < pb; k++)
            p[k] = (uint8_t)pi2_rng_u64(r);
        for (int64_t b = 0; b < nb; b++)
            s[b] = pi2_f32_to_f16((float)ldexp(pi2_rng_normal(r), (int)rand_int(r, -20, 8)));
        if (kind == W_EXTREME) {
            static const uint8_t pats[] = {0x80, 0x00, 0xff, 0x7f, 0x81, 0x88};
            int mode = (int)rand_int(r, 0, 9);
            if (mode < 6)
                memset(p, pats[mode], pb);
            else if (mode == 6) /* a zero-scale row */
                memset(s, 0, (size_t)nb * sizeof(uint16_t));
            else if (mode == 7) /* fp16 max and min subnormal scales */
                for (int64_t b = 0; b < nb; b++)
                    s[b] = (b & 1) ? 0xfbff : 0x0001;
        }
    }
    free(x);
}

static wrows wrows_new(pi2_rng *r, pi2_qtype t, int64_t n, int nrows, int kind)
{
    wrows w = {t, n, nrows, NULL, NULL, NULL, NULL};
    int64_t nb = n / PI2_Q_GROUP;
    w.pay = xmalloc((size_t)nrows, sizeof *w.pay);
    w.sc = xmalloc((size_t)nrows, sizeof *w.sc);
    w.wp = xmalloc((size_t)nrows, sizeof *w.wp);
    w.ws = xmalloc((size_t)nrows, sizeof *w.ws);
    int *perm = xmalloc((size_t)nrows, sizeof(int));
    for (int i = 0; i < nrows; i++) {
        w.pay[i] = xmalloc(pi2_q_payload_row_bytes(t, n), 1);
        w.sc[i] = xmalloc((size_t)nb, sizeof(uint16_t));
        perm[i] = i;
    }
    for (int i = nrows - 1; i > 0; i--) {
        int j = (int)rand_int(r, 0, i);
        int tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }
    for (int i = 0; i < nrows; i++) {
        w.wp[i] = w.pay[perm[i]];
        w.ws[i] = w.sc[perm[i]];
    }
    free(perm);
    wrows_fill(r, &w, kind);
    return w;
}

static void wrows_free(wrows *w)
{
    for (int i = 0; i < w->nrows; i++) {
        free(w->pay[i]);
        free(w->sc[i]);
    }
    free(w->pay);
    free(w->sc);
    free((void *)w->wp);
    free((void *)w->ws);
}

/* q of element j of a row (Q4: nibble - 8). */
static int wq_at(pi2_qtype t, const uint8_t *p, int64_t j)
{
    if (t == PI2_QT_Q8)
        return (int8_t)p[j];
    int64_t g = j / PI2_Q_GROUP, k = j % PI2_Q_GROUP;
    uint8_t b = p[g * PI2_Q4_GROUP_BYTES + (k % 16)];
    return (k < 16 ? (b & 0x0f) : (b >> 4)) - 8;
}

/* ---- activations ---- */

typedef struct acts {
    int T;
    int64_t n;
    float *x;
    float *as;
    int8_t *aq;
    int32_t *sums;
} acts;

enum { A_GAUSS, A_FULL, A_MIXED };

/* T tokens of n values; A_FULL: every q is +-127 (blocks of equal
 * magnitudes), A_MIXED: scales over many octaves, zero and tiny blocks. */
static acts acts_new(pi2_rng *r, int T, int64_t n, int kind)
{
    acts a = {T, n, NULL, NULL, NULL, NULL};
    int64_t nb = n / PI2_Q_GROUP;
    a.x = xmalloc((size_t)(T * n), sizeof(float));
    a.as = xmalloc((size_t)(T * nb), sizeof(float));
    a.aq = xmalloc((size_t)(T * n), 1);
    a.sums = xmalloc((size_t)(T * nb), sizeof(int32_t));
    for (int64_t i = 0; i < T * n; i++) {
        int64_t b = i / PI2_Q_GROUP;
        double v = pi2_rng_normal(r);
        if (kind == A_FULL)
            v = (b % 3 == 0) ? 1.0 : (b % 3 == 1) ? -1.0 : ((i & 1) ? 3.0 : -3.0);
        else if (kind == A_MIXED)
            v = (b % 7 == 3) ? 0.0 : (b % 7 == 5) ? v * 1e-32 : ldexp(v, (int)(b * 5 % 41) - 20);
        a.x[i] = (float)v;
    }
    pi2_k_act_quantize(a.x, n, T, n, a.as, a.aq, a.sums);
    return a;
}

static void acts_free(acts *a)
{
    free(a->x);
    free(a->as);
    free(a->aq);
    free(a->sums);
}

/* Unit activation scales and arbitrary q in [-127, 127] (sums recomputed):
 * with unit weight scales every partial sum is an integer. */
static void acts_unit(pi2_rng *r, acts *a)
{
    int64_t nb = a->n / PI2_Q_GROUP;
    for (int64_t i = 0; i < a->T * a->n; i++)
        a->aq[i] = (int8_t)rand_int(r, -127, 127);
    for (int64_t b = 0; b < a->T * nb; b++) {
        a->as[b] = 1.0f;
        int32_t s = 0;
        for (int j = 0; j < PI2_Q_GROUP; j++)
            s += a->aq[b * PI2_Q_GROUP + j];
        a->sums[b] = s;
    }
}

static void test_act_quantize(void **state)
{
    (void)state;
    pi2_rng r;
    pi2_rng_seed(&r, 11);
    for (int it = 0; it < 40; it++) {
        int T = (int)rand_int(&r, 1, 9);
        int64_t n = 32 * rand_int(&r, 1, 40), ldx = n + rand_int(&r, 0, 5), nb = n / 32;
        float *x = xmalloc((size_t)(T * ldx), sizeof(float));
        for (int64_t i = 0; i < T * ldx; i++) {
            double v = ldexp(pi2_rng_normal(&r), (int)rand_int(&r, -30, 30));
            int64_t b = (i % ldx) / 32;
            if (b % 5 == 1)
                v = 0.0;
            else if (b % 11 == 2)
                v = 1e-31 * v; /* below the zero threshold */
            else if (b % 13 == 3 && i % 7 == 0)
                v = (i & 8) ? INFINITY : NAN;
            else if (b % 17 == 4)
                v = (i & 1) ? 1.0 : -1.0; /* q = +-127 everywhere */
            x[i] = (float)v;
        }
        float *as = xmalloc((size_t)(T * nb), sizeof(float)), *as0 = xmalloc((size_t)nb, sizeof(float));
        int8_t *q = xmalloc((size_t)(T * n), 1), *q0 = xmalloc((size_t)n, 1);
        int32_t *sums = xmalloc((size_t)(T * nb), sizeof(int32_t));
        /* every path (AVX2's own, AVX-512's; NEON, dotprod and i8mm the
         * NEON one) gives pi2_q8act_quantize's bytes */
        pi2_isa isa = (pi2_isa)(it % PI2_ISA_COUNT);
        pi2_k_act_quantize_isa(isa, x, ldx, T, n, as, q, sums);
        for (int t = 0; t < T; t++) {
            pi2_q8act_quantize(x + t * ldx, n, as0, q0);
            CHECK(memcmp(as + t * nb, as0, (size_t)nb * sizeof(float)) == 0, "scales differ (%s, token %d, n=%lld)",
                  pi2_k_isa_name(isa), t, (long long)n);
            CHECK(memcmp(q + t * n, q0, (size_t)n) == 0, "q differ (token %d, n=%lld)", t, (long long)n);
            for (int64_t b = 0; b < nb; b++) {
                int32_t s = 0;
                for (int j = 0; j < 32; j++)
                    s += q0[b * 32 + j];
                CHECK(sums[t * nb + b] == s, "sum token %d block %lld: %d != %d", t, (long long)b,
                      sums[t * nb + b], s);
            }
        }
        free(x);
        free(as);
        free(as0);
        free(q);
        free(q0);
        free(sums);
    }
}

/* ---- matmul ---- */

/* Scalar twin against double-precision dequantize-and-dot: w_j from
 * pi2_q_dequantize_row (exact floats) times q_j * ascale, summed in double.
 * The twin rounds each block's combined scale to float (relative 2^-24)
 * and sums in float in the fixed order (16 stripes of at most nb / 16
 * FMAs per chunk of 64 blocks, a 4-level tree, one add per chunk). */
static void test_matmul_scalar_reference(void **state)
{
    (void)state;
    pi2_rng r;
    pi2_rng_seed(&r, 21);
    for (int it = 0; it < 24; it++) {
        pi2_qtype t = QTYPES[it & 1];
        int64_t n = 32 * rand_int(&r, 1, 70), nb = n / 32;
        int nrows = (int)rand_int(&r, 1, 9), T = (int)rand_int(&r, 1, 5);
        wrows w = wrows_new(&r, t, n, nrows, it % 3);
        acts a = acts_new(&r, T, n, it % 3 == 2 ? A_MIXED : A_GAUSS);
        float *out = xmalloc((size_t)(T * nrows), sizeof(float)), *deq = xmalloc((size_t)n, sizeof(float));
        pi2_k_matmul_isa(PI2_ISA_SCALAR, t, n, nrows, w.wp, w.ws, a.as, a.aq, a.sums, T, out, nrows);
        for (int i = 0; i < nrows; i++) {
            pi2_q_dequantize_row(t, w.ws[i], w.wp[i], n, deq);
            for (int k = 0; k < T; k++) {
                double ref = 0.0, mag = 0.0;
                for (int64_t j = 0; j < n; j++) {
                    double v = (double)deq[j] * ((double)a.aq[k * n + j] * (double)a.as[k * nb + j / 32]);
                    ref += v;
                    mag += fabs(v);
                }
                double got = out[k * nrows + i];
                double tol = ((double)nb / 16 + 8) * 0x1p-24 * mag + 1e-300; /* 16 stripes, tree, chunks */
                CHECK(fabs(got - ref) <= tol, "%s n=%lld row %d token %d: %.9g vs double %.9g (tol %g)",
                      pi2_q_type_name(t), (long long)n, i, k, got, ref, tol);
            }
        }
        free(out);
        free(deq);
        acts_free(&a);
        wrows_free(&w);
    }
}

/* out under `isa` (into a canary-filled buffer with row stride ldo) vs the
 * scalar twin: the same bits (kernels.h, Numerics; NaN as NaN). Entries
 * outside the [T][nrows] window must stay untouched. Returns the number
 * compared. */
static int compare_matmul(pi2_isa isa, const wrows *w, const acts *a, int T, const char *what)
{
    int64_t ldo = w->nrows + 3;
    size_t cap = (size_t)(T * ldo);
    float *got = xmalloc(cap, sizeof(float)), *ref = xmalloc(cap, sizeof(float));
    for (size_t i = 0; i < cap; i++)
        got[i] = ref[i] = -12345.0f;
    pi2_k_matmul_isa(isa, w->t, w->n, w->nrows, w->wp, w->ws, a->as, a->aq, a->sums, T, got, ldo);
    pi2_k_matmul_isa(PI2_ISA_SCALAR, w->t, w->n, w->nrows, w->wp, w->ws, a->as, a->aq, a->sums, T, ref, ldo);
    for (int t = 0; t < T; t++) {
        for (int64_t c = 0; c < ldo; c++) {
            float g = got[t * ldo + c], e = ref[t * ldo + c];
            if (c >= w->nrows) {
                CHECK(g == -12345.0f, "%s %s %s: wrote outside the window (t=%d col %lld)", pi2_k_isa_name(isa),
                      pi2_q_type_name(w->t), what, t, (long long)c);
                continue;
            }
            CHECK(g == e || (isnan(g) && isnan(e)),
                  "%s %s %s n=%lld rows=%d T=%d: row %lld token %d: %.9g != scalar %.9g", pi2_k_isa_name(isa),
                  pi2_q_type_name(w->t), what, (long long)w->n, w->nrows, T, (long long)c, t, (double)g, (double)e);
        }
    }
    free(got);
    free(ref);
    return T * w->nrows;
}

static void set_unit_scales(wrows *w)
{
    for (int i = 0; i < w->nrows; i++)
        for (int64_t b = 0; b < w->n / 32; b++)
            w->sc[i][b] = 0x3c00;
}

static bool isa_or_skip(pi2_isa isa, const char *what)
{
    if (pi2_k_isa_supported(isa))
        return true;
    print_message("kernels: %s %s kernels NOT exercised: this CPU does not support them\n", pi2_k_isa_name(isa),
                  what);
    return false;
}

static void matmul_suite(pi2_isa isa)
{
    if (!isa_or_skip(isa, "matmul"))
        skip();
    pi2_rng r;
    pi2_rng_seed(&r, 31 + (uint64_t)isa);
    /* 8192 + 32: past the one-token kernel's split activation copy */
    static const int64_t shapes[] = {32, 64, 96, 128, 160, 224, 2048 + 32, 8192 + 32};
    int compared = 0;
    for (size_t k = 0; k < 2; k++) {
        pi2_qtype t = QTYPES[k];
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0] + 3; si++) {
            int64_t n = si < sizeof shapes / sizeof shapes[0] ? shapes[si] : 32 * rand_int(&r, 1, 80);
            bool big = n > 1024;
            /* rows past 8, 16 and 32: the AVX2 panels of 8 rows (16+ tokens) and
             * the AVX-512 panels of 16, ragged */
            int nrows = big ? (int)rand_int(&r, 1, 20) : (int)rand_int(&r, 1, 50);
            /* 1. integer logic exactly: unit scales, arbitrary bytes and q */
            wrows w = wrows_new(&r, t, n, nrows, W_RANDOM);
            set_unit_scales(&w);
            acts a = acts_new(&r, PI2_K_MAX_T, n, A_GAUSS);
            acts_unit(&r, &a);
            for (int T = 1; T <= PI2_K_MAX_T; T += big ? 7 : 1)
                compared += compare_matmul(isa, &w, &a, T, "unit scales");
            acts_free(&a);
            /* 2. random scales, gaussian / full-range / mixed activations */
            wrows_fill(&r, &w, W_RANDOM);
            static const int Ts[] = {1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 31, 33, 63, 64};
            for (int ak = 0; ak < 3; ak++) {
                acts b = acts_new(&r, PI2_K_MAX_T, n, ak);
                for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++)
                    compared += compare_matmul(isa, &w, &b, Ts[ti], "random");
                acts_free(&b);
            }
            /* 3. quantized rows and extreme rows */
            for (int kind = W_QUANTIZED; kind <= W_EXTREME; kind++) {
                wrows_fill(&r, &w, kind);
                acts b = acts_new(&r, 17, n, kind == W_EXTREME ? A_FULL : A_GAUSS);
                for (int T = 1; T <= 17; T += big ? 4 : 1)
                    compared += compare_matmul(isa, &w, &b, T, kind == W_EXTREME ? "extreme" : "quantized");
                acts_free(&b);
            }
            wrows_free(&w);
        }
    }
    print_message("kernels: %s matmul bit-identical to scalar: %d outputs (q4, q8; n = 32..%d; T = 1..%d)\n",
                  pi2_k_isa_name(isa), compared, 8192 + 32, PI2_K_MAX_T);
}

static void test_matmul_avx2(void **state)
{
    (void)state;
    matmul_suite(PI2_ISA_AVX2);
}

static void test_matmul_avx512(void **state)
{
    (void)state;
    matmul_suite(PI2_ISA_AVX512);
}

static void test_matmul_neon(void **state)
{
    (void)state;
    matmul_suite(PI2_ISA_NEON);
}

static void test_matmul_dotprod(void **state)
{
    (void)state;
    matmul_suite(PI2_ISA_DOTPROD);
}

static void test_matmul_i8mm(void **state)
{
    (void)state;
    matmul_suite(PI2_ISA_I8MM);
}

/* The one ISA state: the best path until set, a forced path kept until
 * the next call, and errors leave it alone. */
static void test_isa_state(void **state)
{
    (void)state;
    pi2_isa best = pi2_k_isa_best();
    assert_true(pi2_k_isa_supported(PI2_ISA_SCALAR));
    assert_true(pi2_k_isa_supported(best));
    assert_int_equal(pi2_k_get_isa(), best);
    /* best is the highest supported */
    for (int i = (int)best + 1; i < PI2_ISA_COUNT; i++)
        assert_false(pi2_k_isa_supported((pi2_isa)i));
    assert_false(pi2_k_isa_supported((pi2_isa)42));
    print_message("kernels: isa best=%s; avx2 %s; avx512vnni %s; neon %s; dotprod %s; i8mm %s\n",
                  pi2_k_isa_name(best), pi2_k_isa_supported(PI2_ISA_AVX2) ? "supported" : "NOT supported",
                  pi2_k_isa_supported(PI2_ISA_AVX512) ? "supported" : "NOT supported (its kernels cannot run here)",
                  pi2_k_isa_supported(PI2_ISA_NEON) ? "supported" : "NOT supported",
                  pi2_k_isa_supported(PI2_ISA_DOTPROD) ? "supported" : "NOT supported",
                  pi2_k_isa_supported(PI2_ISA_I8MM) ? "supported" : "NOT supported");
    assert_string_equal(pi2_k_isa_name(PI2_ISA_SCALAR), "scalar");
    assert_string_equal(pi2_k_isa_name(PI2_ISA_AVX2), "avx2");
    assert_string_equal(pi2_k_isa_name(PI2_ISA_AVX512), "avx512vnni");
    assert_string_equal(pi2_k_isa_name(PI2_ISA_NEON), "neon");
    assert_string_equal(pi2_k_isa_name(PI2_ISA_DOTPROD), "dotprod");
    assert_string_equal(pi2_k_isa_name(PI2_ISA_I8MM), "i8mm");
    /* a build has one family's paths; a CPU runs only what was built */
    for (int i = 0; i < PI2_ISA_COUNT; i++)
        assert_true(pi2_k_isa_compiled((pi2_isa)i) || !pi2_k_isa_supported((pi2_isa)i));
    assert_false(pi2_k_isa_compiled(PI2_ISA_AVX2) && pi2_k_isa_compiled(PI2_ISA_NEON));
    assert_string_equal(pi2_k_isa_name((pi2_isa)9), "?");
    assert_int_equal(pi2_k_set_isa(PI2_ISA_SCALAR), 0);
    assert_int_equal(pi2_k_get_isa(), PI2_ISA_SCALAR);
    assert_int_equal(pi2_k_set_isa((pi2_isa)42), PI2_EINVAL);
    assert_int_equal(pi2_k_get_isa(), PI2_ISA_SCALAR);
    for (int i = 0; i < PI2_ISA_COUNT; i++) {
        if (!pi2_k_isa_supported((pi2_isa)i)) {
            assert_int_equal(pi2_k_set_isa((pi2_isa)i), PI2_EUNSUPPORTED);
            assert_int_equal(pi2_k_get_isa(), PI2_ISA_SCALAR); /* unchanged */
        }
    }
    assert_int_equal(pi2_k_set_isa(best), 0);
    assert_int_equal(pi2_k_get_isa(), best);
}

/* pi2_k_matmul follows pi2_k_set_isa; a forced unsupported path runs the
 * scalar twin. */
static void test_matmul_dispatch(void **state)
{
    (void)state;
    pi2_rng r;
    pi2_rng_seed(&r, 41);
    wrows w = wrows_new(&r, PI2_QT_Q4, 320, 6, W_QUANTIZED);
    acts a = acts_new(&r, 5, 320, A_GAUSS);
    float got[30], ref[30];
    for (int i = 0; i < PI2_ISA_COUNT; i++) {
        pi2_isa isa = (pi2_isa)i;
        pi2_k_matmul_isa(isa, w.t, w.n, w.nrows, w.wp, w.ws, a.as, a.aq, a.sums, 5, ref, 6);
        if (pi2_k_isa_supported(isa)) {
            assert_int_equal(pi2_k_set_isa(isa), 0);
            pi2_k_matmul(w.t, w.n, w.nrows, w.wp, w.ws, a.as, a.aq, a.sums, 5, got, 6);
            CHECK(memcmp(got, ref, sizeof got) == 0, "pi2_k_matmul under %s differs from the forced path",
                  pi2_k_isa_name(isa));
        } else {
            pi2_k_matmul_isa(PI2_ISA_SCALAR, w.t, w.n, w.nrows, w.wp, w.ws, a.as, a.aq, a.sums, 5, got, 6);
            CHECK(memcmp(got, ref, sizeof got) == 0, "unsupported %s did not fall back to scalar",
                  pi2_k_isa_name(isa));
        }
    }
    assert_int_equal(pi2_k_set_isa(pi2_k_isa_best()), 0);
    acts_free(&a);
    wrows_free(&w);
}

/* The AVX-512 one-token Q4 matmul with GFNI (high nibbles by an affine
 * map) and without (shift and mask): the same bits, over ragged blocks,
 * ragged row tiles and the largest split activation copy. */
static void test_matmul_gfni(void **state)
{
    (void)state;
    if (!isa_or_skip(PI2_ISA_AVX512, "matmul (GFNI)"))
        skip();
    if (pi2_k_set_gfni(true) != 0) {
        print_message("kernels: GFNI matmul NOT exercised: this CPU does not support it\n");
        skip();
    }
    assert_int_equal(pi2_k_set_isa(PI2_ISA_AVX512), 0);
    pi2_rng r;
    pi2_rng_seed(&r, 53);
    static const int64_t shapes[] = {32, 544, 2048 + 32, 8192};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int64_t n = shapes[si];
        for (int kind = W_RANDOM; kind <= W_EXTREME; kind++) {
            wrows w = wrows_new(&r, PI2_QT_Q4, n, 9, kind);
            acts a = acts_new(&r, 1, n, kind == W_EXTREME ? A_FULL : A_MIXED);
            float on[9], off[9];
            assert_int_equal(pi2_k_set_gfni(true), 0);
            pi2_k_matmul(PI2_QT_Q4, n, 9, w.wp, w.ws, a.as, a.aq, a.sums, 1, on, 1);
            assert_int_equal(pi2_k_set_gfni(false), 0);
            pi2_k_matmul(PI2_QT_Q4, n, 9, w.wp, w.ws, a.as, a.aq, a.sums, 1, off, 1);
            CHECK(memcmp(on, off, sizeof on) == 0, "n=%lld kind %d: the GFNI matmul differs", (long long)n, kind);
            acts_free(&a);
            wrows_free(&w);
        }
    }
    assert_int_equal(pi2_k_set_gfni(true), 0);
    assert_int_equal(pi2_k_set_isa(pi2_k_isa_best()), 0);
}

/* len bytes of src copied to the end of a page whose next page is not
 * mapped (a read past them faults); *map and *maplen to unmap. */
static void *guard_copy(const void *src, size_t len, void **map, size_t *maplen)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), span = (len + pg - 1) / pg * pg;
    uint8_t *m = mmap(NULL, span + pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(m != MAP_FAILED);
    assert_int_equal(mprotect(m + span, pg, PROT_NONE), 0);
    *map = m;
    *maplen = span + pg;
    memcpy(m + span - len, src, len);
    return m + span - len;
}

/* One token against rows of fewer than 16 blocks (a predictor's second
 * layer) on AVX-512 VNNI: the rows and activations padded with zero blocks
 * to 16 give the same bits through the full 16-block step, Q4 with and
 * without GFNI and Q8, for ragged row counts and with a prefetch range.
 * Each row and its scales end where an unmapped page begins: the short
 * path's loads stop at the row. */
static void test_matmul_short(void **state)
{
    (void)state;
    if (!isa_or_skip(PI2_ISA_AVX512, "matmul (short rows)"))
        skip();
    assert_int_equal(pi2_k_set_isa(PI2_ISA_AVX512), 0);
    pi2_rng r;
    pi2_rng_seed(&r, 59);
    static const int nbs[] = {1, 2, 3, 4, 5, 8, 12, 15};
    static const int rows[] = {1, 3, 9, 37};
    long compared = 0;
    for (int q = 0; q < 2; q++)
        for (size_t bi = 0; bi < sizeof nbs / sizeof *nbs; bi++)
            for (size_t ri = 0; ri < sizeof rows / sizeof *rows; ri++) {
                pi2_qtype t = q ? PI2_QT_Q8 : PI2_QT_Q4;
                int64_t nb = nbs[bi], n = nb * PI2_Q_GROUP, N = 16 * PI2_Q_GROUP;
                int nr = rows[ri], kind = (int)(bi + ri) % 3;
                wrows w = wrows_new(&r, t, n, nr, kind);
                acts a = acts_new(&r, 1, n, kind == W_EXTREME ? A_FULL : A_MIXED);
                size_t rb = pi2_q_payload_row_bytes(t, n), RB = pi2_q_payload_row_bytes(t, N);
                uint8_t *pay = calloc((size_t)nr, RB);
                uint16_t *sc = calloc((size_t)nr * 16, sizeof(uint16_t));
                const uint8_t **wp = xmalloc((size_t)nr, sizeof *wp);
                const uint16_t **ws = xmalloc((size_t)nr, sizeof *ws);
                for (int k = 0; k < nr; k++) {
                    memcpy(pay + (size_t)k * RB, w.wp[k], rb);
                    memcpy(sc + (size_t)k * 16, w.ws[k], (size_t)nb * sizeof(uint16_t));
                    wp[k] = pay + (size_t)k * RB;
                    ws[k] = sc + (size_t)k * 16;
                }
                int8_t aq[16 * PI2_Q_GROUP] = {0};
                float as[16] = {0};
                int32_t sums[16] = {0};
                memcpy(aq, a.aq, (size_t)n);
                memcpy(as, a.as, (size_t)nb * sizeof(float));
                memcpy(sums, a.sums, (size_t)nb * sizeof(int32_t));
                /* the short rows, each against a guard page */
                const uint8_t **gp = xmalloc((size_t)nr, sizeof *gp);
                const uint16_t **gs = xmalloc((size_t)nr, sizeof *gs);
                void *maps[2 * 37];
                size_t lens[2 * 37];
                for (int k = 0; k < nr; k++) {
                    gp[k] = guard_copy(w.wp[k], rb, &maps[2 * k], &lens[2 * k]);
                    gs[k] = guard_copy(w.ws[k], (size_t)nb * sizeof(uint16_t), &maps[2 * k + 1], &lens[2 * k + 1]);
                }
                float want[37], got[37];
                for (int g = 0; g < (q ? 1 : 2); g++) {
                    pi2_k_set_gfni(g == 0);
                    pi2_k_matmul(t, N, nr, wp, ws, as, aq, sums, 1, want, 1);
                    pi2_k_matmul(t, n, nr, gp, gs, a.as, a.aq, a.sums, 1, got, 1);
                    CHECK(memcmp(want, got, (size_t)nr * sizeof(float)) == 0,
                          "%s nb=%lld rows=%d gfni %d: short rows differ from the padded step", pi2_q_type_name(t),
                          (long long)nb, nr, g == 0);
                    pi2_k_matmul_pf(t, n, nr, gp, gs, a.as, a.aq, a.sums, 1, got, 1, pay, (int64_t)(nr * RB));
                    CHECK(memcmp(want, got, (size_t)nr * sizeof(float)) == 0,
                          "%s nb=%lld rows=%d: the prefetching short rows differ", pi2_q_type_name(t),
                          (long long)nb, nr);
                    compared += 2 * nr;
                }
                for (int k = 0; k < 2 * nr; k++)
                    munmap(maps[k], lens[k]);
                free(gp);
                free(gs);
                free(pay);
                free(sc);
                free(wp);
                free(ws);
                acts_free(&a);
                wrows_free(&w);
            }
    pi2_k_set_gfni(true);
    assert_int_equal(pi2_k_set_isa(pi2_k_isa_best()), 0);
    print_message("kernels: short rows (1..15 blocks, one token) bit-identical to the padded 16-block step: "
                  "%ld outputs\n", compared);
}

/* pi2_k_matmul_pf: the same bits as pi2_k_matmul on every path and token
 * count, whatever the prefetch range (none, shorter than a line, ragged,
 * longer than the rows, a reversed span, covering the weights). */
static void test_matmul_pf(void **state)
{
    (void)state;
    pi2_rng r;
    pi2_rng_seed(&r, 43);
    for (int q = 0; q < 2; q++) {
        pi2_qtype t = q ? PI2_QT_Q8 : PI2_QT_Q4;
        wrows w = wrows_new(&r, t, 544, 23, W_QUANTIZED);
        acts a = acts_new(&r, 5, 544, A_MIXED);
        size_t bl = 1 << 16;
        uint8_t *buf = xmalloc(bl, 1);
        memset(buf, 7, bl);
        const void *pf[] = {NULL, buf, buf + 100, buf, w.wp[3]};
        int64_t len[] = {0, 40, 12345, (int64_t)bl, -64};
        for (int i = 0; i < PI2_ISA_COUNT; i++) {
            if (!pi2_k_isa_supported((pi2_isa)i))
                continue;
            assert_int_equal(pi2_k_set_isa((pi2_isa)i), 0);
            for (int T = 1; T <= 5; T++)
                for (size_t k = 0; k < sizeof len / sizeof len[0]; k++) {
                    float got[5 * 23], ref[5 * 23];
                    pi2_k_matmul(t, w.n, w.nrows, w.wp, w.ws, a.as, a.aq, a.sums, T, ref, 23);
                    pi2_k_matmul_pf(t, w.n, w.nrows, w.wp, w.ws, a.as, a.aq, a.sums, T, got, 23, pf[k], len[k]);
                    CHECK(memcmp(got, ref, (size_t)T * 23 * sizeof(float)) == 0,
                          "%s q%d T=%d range %zu: pi2_k_matmul_pf differs from pi2_k_matmul",
                          pi2_k_isa_name((pi2_isa)i), q ? 8 : 4, T, k);
                }
        }
        assert_int_equal(pi2_k_set_isa(pi2_k_isa_best()), 0);
        free(buf);
        acts_free(&a);
        wrows_free(&w);
    }
}

/* pi2_k_down_rows_pf: the same bits as pi2_k_down_rows on every path and
 * token count, whatever the prefetch range, over ragged row groups and
 * more than one column chunk of the one-token kernel. */
static void test_down_rows_pf(void **state)
{
    (void)state;
    pi2_rng r;
    pi2_rng_seed(&r, 47);
    for (int q = 0; q < 2; q++) {
        pi2_qtype t = q ? PI2_QT_Q8 : PI2_QT_Q4;
        for (int shape = 0; shape < 2; shape++) {
            int64_t n = shape ? 4160 : 544;
            int nrows = shape ? 37 : 23;
            wrows w = wrows_new(&r, t, n, nrows, W_QUANTIZED);
            float *coef = xmalloc((size_t)3 * (size_t)nrows, sizeof(float));
            for (int i = 0; i < 3 * nrows; i++)
                coef[i] = (float)pi2_rng_normal(&r);
            float *init = xmalloc((size_t)3 * (size_t)n, sizeof(float));
            for (int64_t i = 0; i < 3 * n; i++)
                init[i] = (float)pi2_rng_normal(&r);
            float *got = xmalloc((size_t)3 * (size_t)n, sizeof(float));
            float *ref = xmalloc((size_t)3 * (size_t)n, sizeof(float));
            size_t bl = 1 << 16;
            uint8_t *buf = xmalloc(bl, 1);
            memset(buf, 7, bl);
            const void *pf[] = {NULL, buf, buf + 100, buf, w.wp[3]};
            int64_t len[] = {0, 40, 12345, (int64_t)bl, 64 * 1024};
            for (int i = 0; i < PI2_ISA_COUNT; i++) {
                if (!pi2_k_isa_supported((pi2_isa)i))
                    continue;
                assert_int_equal(pi2_k_set_isa((pi2_isa)i), 0);
                for (int T = 1; T <= 3; T++)
                    for (size_t k = 0; k < sizeof len / sizeof len[0]; k++) {
                        memcpy(ref, init, (size_t)T * (size_t)n * sizeof(float));
                        memcpy(got, init, (size_t)T * (size_t)n * sizeof(float));
                        pi2_k_down_rows(t, n, nrows, coef, nrows, w.wp, w.ws, T, ref, n);
                        pi2_k_down_rows_pf(t, n, nrows, coef, nrows, w.wp, w.ws, T, got, n, pf[k], len[k]);
                        CHECK(memcmp(got, ref, (size_t)T * (size_t)n * sizeof(float)) == 0,
                              "%s q%d n=%lld T=%d range %zu: pi2_k_down_rows_pf differs from pi2_k_down_rows",
                              pi2_k_isa_name((pi2_isa)i), q ? 8 : 4, (long long)n, T, k);
                    }
            }
            assert_int_equal(pi2_k_set_isa(pi2_k_isa_best()), 0);
            free(buf);
            free(got);
            free(ref);
            free(init);
            free(coef);
            wrows_free(&w);
        }
    }
}

/* ---- axpy ---- */

/* out0 + sum_r coef_r * dequant(row r) in double, and the scale of the
 * documented SIMD-vs-scalar bound: |out0| + Q * sum_r |c_r * d_rb| with
 * Q = 24 for Q4 (unsigned nibble plus offset), 128 for Q8. */
static void axpy_ref(const wrows *w, const float *coef, const float *out0, double *ref, double *scale)
{
    for (int64_t j = 0; j < w->n; j++) {
        ref[j] = out0[j];
        scale[j] = fabs((double)out0[j]);
    }
    for (int i = 0; i < w->nrows; i++) {
        if (coef[i] == 0.0f)
            continue;
        for (int64_t j = 0; j < w->n; j++) {
            double d = pi2_f16_to_f32(w->ws[i][j / 32]);
            ref[j] += (double)coef[i] * wq_at(w->t, w->wp[i], j) * d;
            scale[j] += (w->t == PI2_QT_Q4 ? 24.0 : 128.0) * fabs((double)coef[i] * d);
        }
    }
}

static void axpy_suite(pi2_isa isa, bool scalar_vs_double)
{
    pi2_rng r;
    pi2_rng_seed(&r, 51 + (uint64_t)isa);
    int checked = 0;
    for (int it = 0; it < 36; it++) {
        pi2_qtype t = QTYPES[it & 1];
        int64_t n = it < 8 ? 32 * (it / 2 + 1) : it < 12 ? 2048 + 32 : 32 * rand_int(&r, 1, 300);
        int nrows = (int)rand_int(&r, 0, 40);
        wrows w = wrows_new(&r, t, n, nrows, it % 3);
        float *coef = xmalloc((size_t)nrows, sizeof(float));
        int active = 0;
        for (int i = 0; i < nrows; i++) {
            int z = (int)rand_int(&r, 0, 3);
            coef[i] = z == 0 ? 0.0f : z == 1 ? -0.0f : (float)ldexp(pi2_rng_normal(&r), (int)rand_int(&r, -10, 10));
            active++; /* every row is read, zero coefficients too */
        }
        float *out0 = xmalloc((size_t)n, sizeof(float)), *got = xmalloc((size_t)n, sizeof(float));
        float *ref = xmalloc((size_t)n, sizeof(float));
        double *dref = xmalloc((size_t)n, sizeof(double)), *scale = xmalloc((size_t)n, sizeof(double));
        for (int64_t j = 0; j < n; j++)
            out0[j] = (float)pi2_rng_normal(&r);
        memcpy(got, out0, (size_t)n * sizeof(float));
        memcpy(ref, out0, (size_t)n * sizeof(float));
        pi2_k_axpy_rows_isa(isa, t, n, nrows, coef, w.wp, w.ws, got);
        pi2_k_axpy_rows_isa(PI2_ISA_SCALAR, t, n, nrows, coef, w.wp, w.ws, ref);
        axpy_ref(&w, coef, out0, dref, scale);
        for (int64_t j = 0; j < n; j++) {
            /* documented in runtime/kernels/down.c: (3m + 8) * 2^-24 * (|out| + Q sum |c d|) */
            double tol = (3.0 * active + 8) * 0x1p-24 * scale[j];
            CHECK(fabs((double)got[j] - (double)ref[j]) <= tol,
                  "%s axpy %s n=%lld rows=%d (active %d) j=%lld: %.9g vs scalar %.9g (tol %g)",
                  pi2_k_isa_name(isa), pi2_q_type_name(t), (long long)n, nrows, active, (long long)j, (double)got[j],
                  (double)ref[j], tol);
            if (scalar_vs_double) /* the scalar twin: one rounding per row and element */
                CHECK(fabs((double)ref[j] - dref[j]) <= (2.0 * active + 2) * 0x1p-24 * scale[j],
                      "scalar axpy %s j=%lld: %.9g vs double %.9g", pi2_q_type_name(t), (long long)j, (double)ref[j],
                      dref[j]);
            checked++;
        }
        if (active == 0)
            CHECK(memcmp(got, out0, (size_t)n * sizeof(float)) == 0, "axpy with only zero coefs changed out");
        free(coef);
        free(out0);
        free(got);
        free(ref);
        free(dref);
        free(scale);
        wrows_free(&w);
    }
    print_message("kernels: %s axpy verified: %d outputs\n", pi2_k_isa_name(isa), checked);
}

static void test_axpy_scalar(void **state)
{
    (void)state;
    axpy_suite(PI2_ISA_SCALAR, true);
}

static void test_axpy_avx2(void **state)
{
    (void)state;
    if (!isa_or_skip(PI2_ISA_AVX2, "axpy"))
        skip();
    axpy_suite(PI2_ISA_AVX2, false);
}

static void test_axpy_avx512(void **state)
{
    (void)state;
    if (!isa_or_skip(PI2_ISA_AVX512, "axpy"))
        skip();
    axpy_suite(PI2_ISA_AVX512, false);
}

/* ---- down: int8 coefficients ---- */

/* Coefficients [T][ldc] for the down tests: per (token, 16-row group) a
 * pattern: gaussian over many octaves, all zero (+0 or -0), tiny (below
 * the 2^-100 cut), one large value among small ones, or uniform. */
static void down_coefs(pi2_rng *r, float *coef, int T, int nrows, int64_t ldc)
{
    for (int t = 0; t < T; t++) {
        for (int g = 0; g < nrows; g += 16) {
            int mode = (int)rand_int(r, 0, 9);
            int e = (int)rand_int(r, -12, 6);
            for (int k = g; k < nrows && k < g + 16; k++) {
                double v = pi2_rng_normal(r);
                float c = mode == 0   ? 0.0f
                          : mode == 1 ? -0.0f
                          : mode == 2 ? (float)ldexp(v, -110)
                          : mode == 3 ? (float)(k == g ? ldexp(v, e + 12) : ldexp(v, e))
                          : mode == 4 ? (float)ldexp(k & 1 ? 1.0 : -1.0, e)
                                      : (float)ldexp(v, (int)rand_int(r, -10, 10));
                coef[t * ldc + k] = c;
            }
        }
        for (int64_t k = nrows; k < ldc; k++)
            coef[t * ldc + k] = NAN; /* never read */
    }
}

/* The scalar twin against double dequantize-and-accumulate, within the
 * bound documented in kernels.h. */
static void down_check_double(const wrows *w, const float *coef, int64_t ldc, int T, const float *out0,
                              const float *got, int64_t ldo)
{
    int64_t nb = w->n / 32;
    int G = (w->nrows + 15) / 16;
    for (int t = 0; t < T; t++)
        for (int64_t b = 0; b < nb; b++)
            for (int j = 0; j < 32; j++) {
                int64_t col = b * 32 + j;
                double o0 = out0[t * ldo + col], ref = o0, qerr = 0, mag = fabs(o0);
                for (int g = 0; g < w->nrows; g += 16) {
                    float m = 0;
                    double sw = 0;
                    for (int k = g; k < w->nrows && k < g + 16; k++) {
                        float c = coef[t * ldc + k] * pi2_f16_to_f32(w->ws[k][b]);
                        int wq = wq_at(w->t, w->wp[k], col);
                        m = fmaxf(m, fabsf(c));
                        ref += (double)coef[t * ldc + k] * pi2_f16_to_f32(w->ws[k][b]) * wq;
                        mag += fabs((double)c * wq);
                        sw += abs(wq);
                    }
                    qerr += (double)(m / 127.0f) / 2 * sw;
                }
                double tol = qerr * (1 + 0x1p-16) + (G + 2) * 0x1p-24 * (mag + qerr) + G * 16 * 128 * 0x1p-100;
                double v = got[t * ldo + col];
                CHECK(fabs(v - ref) <= tol, "scalar down %s n=%lld rows=%d t=%d col=%lld: %.9g vs double %.9g (tol %g)",
                      pi2_q_type_name(w->t), (long long)w->n, w->nrows, t, (long long)col, v, ref, tol);
            }
}

/* One shape of a down kernel (pi2_k_down_rows_isa or pi2_k_down_gemm_isa):
 * on the scalar twin against double (chk), on a SIMD path bit for bit
 * against the twin; columns past n (NaN) are never written. Returns the
 * outputs compared. */
typedef void (*down_fn)(pi2_isa isa, pi2_qtype wt, int64_t n, int nrows, const float *coef, int64_t ldc,
                        const uint8_t *const *wp, const uint16_t *const *ws, int T, float *out, int64_t ldo);
typedef void (*down_chk)(const wrows *w, const float *coef, int64_t ldc, int T, const float *out0, const float *got,
                         int64_t ldo);

static long down_case(pi2_rng *r, pi2_isa isa, const char *what, down_fn fn, down_chk chk, pi2_qtype t, int64_t n,
                      int nrows, int T, int kind, bool zero_check)
{
    wrows w = wrows_new(r, t, n, nrows, kind);
    int64_t ldc = nrows + rand_int(r, 0, 5), ldo = n + rand_int(r, 0, 40);
    float *coef = xmalloc((size_t)(T * ldc), sizeof(float));
    down_coefs(r, coef, T, nrows, ldc);
    size_t no = (size_t)(T * ldo);
    float *out0 = xmalloc(no, sizeof(float)), *got = xmalloc(no, sizeof(float)), *ref = xmalloc(no, sizeof(float));
    for (size_t i = 0; i < no; i++)
        out0[i] = (int64_t)(i % (size_t)ldo) < n ? (float)pi2_rng_normal(r) * (i % 5 == 0 ? 0.0f : 1.0f) : NAN;
    memcpy(got, out0, no * sizeof(float));
    memcpy(ref, out0, no * sizeof(float));
    fn(isa, t, n, nrows, coef, ldc, w.wp, w.ws, T, got, ldo);
    if (isa == PI2_ISA_SCALAR) {
        chk(&w, coef, ldc, T, out0, got, ldo);
    } else {
        fn(PI2_ISA_SCALAR, t, n, nrows, coef, ldc, w.wp, w.ws, T, ref, ldo);
        for (size_t i = 0; i < no; i++) {
            bool pad = (int64_t)(i % (size_t)ldo) >= n;
            CHECK(pad ? isnan(got[i]) : memcmp(&got[i], &ref[i], sizeof(float)) == 0,
                  "%s %s %s n=%lld rows=%d T=%d: out[%zu] = %.9g, scalar twin %.9g", pi2_k_isa_name(isa), what,
                  pi2_q_type_name(t), (long long)n, nrows, T, i, (double)got[i], (double)ref[i]);
        }
    }
    if (zero_check) { /* all coefficients +0 or -0: out is left bit-for-bit alone */
        for (int tt = 0; tt < T; tt++)
            for (int k = 0; k < nrows; k++)
                coef[tt * ldc + k] = rand_int(r, 0, 1) ? 0.0f : -0.0f;
        memcpy(got, out0, no * sizeof(float));
        fn(isa, t, n, nrows, coef, ldc, w.wp, w.ws, T, got, ldo);
        for (size_t i = 0; i < no; i++)
            CHECK(memcmp(&got[i], &out0[i], sizeof(float)) == 0 || (isnan(got[i]) && isnan(out0[i])),
                  "%s %s with zero coefficients changed out[%zu]", pi2_k_isa_name(isa), what, i);
    }
    free(coef);
    free(out0);
    free(got);
    free(ref);
    wrows_free(&w);
    return (long)T * n;
}

static void down_suite(pi2_isa isa)
{
    pi2_rng r;
    pi2_rng_seed(&r, 81 + (uint64_t)isa);
    long compared = 0;
    static const int Ts[] = {1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 31, 33, 63, 64};
    for (int it = 0; it < 40; it++) {
        pi2_qtype t = QTYPES[it & 1];
        int64_t n = it < 8 ? 32 * (it / 2 + 1) : it < 12 ? 2048 + 32 : 32 * rand_int(&r, 1, 80);
        int nrows = it < 4 ? (int)rand_int(&r, 1, 17) : (int)rand_int(&r, 1, n > 1024 ? 150 : 300);
        int T = it < 28 ? Ts[it % 14] : (int)rand_int(&r, 1, PI2_K_MAX_T);
        if (n > 1024 && T > 17 && isa == PI2_ISA_SCALAR)
            T = 17; /* the double reference is slow */
        compared += down_case(&r, isa, "down", pi2_k_down_rows_isa, down_check_double, t, n, nrows, T, it % 3, true);
    }
    print_message("kernels: %s down verified against %s: %ld outputs (q4, q8; n = 32..%d; T = 1..%d)\n",
                  pi2_k_isa_name(isa), isa == PI2_ISA_SCALAR ? "double" : "scalar (bit-exact)", compared, 2048 + 32,
                  PI2_K_MAX_T);
}

static void test_down_scalar(void **state)
{
    (void)state;
    down_suite(PI2_ISA_SCALAR);
}

static void test_down_avx2(void **state)
{
    (void)state;
    if (!isa_or_skip(PI2_ISA_AVX2, "down"))
        skip();
    down_suite(PI2_ISA_AVX2);
}

static void test_down_avx512(void **state)
{
    (void)state;
    if (!isa_or_skip(PI2_ISA_AVX512, "down"))
        skip();
    down_suite(PI2_ISA_AVX512);
}

/* arm64: every NEON level (neon, dotprod, i8mm) takes the one NEON down path */
static void test_down_neon(void **state)
{
    (void)state;
    if (!isa_or_skip(PI2_ISA_NEON, "down"))
        skip();
    down_suite(PI2_ISA_NEON);
    if (pi2_k_isa_supported(PI2_ISA_I8MM))
        down_suite(PI2_ISA_I8MM);
}

/* ---- prefill down GEMM: the twin against double, SIMD bit-exact ---- */

/* The twin against double dequantize-and-accumulate: per row, the
 * coefficient's int8 rounding (sigma / 2, sigma = the group's max |c| / 127)
 * times the requantized weight and the weight's (D / 2) times the
 * coefficient, plus float rounding over the groups' FMAs. */
static void gemm_check_double(const wrows *w, const float *coef, int64_t ldc, int T, const float *out0,
                              const float *got, int64_t ldo)
{
    int64_t nb = w->n / 32;
    int G = (w->nrows + 31) / 32;
    float qmax = w->t == PI2_QT_Q4 ? 8.0f : 128.0f;
    for (int t = 0; t < T; t++)
        for (int64_t b = 0; b < nb; b++)
            for (int j = 0; j < 32; j++) {
                int64_t col = b * 32 + j;
                double o0 = out0[t * ldo + col], ref = o0, qerr = 0, mag = fabs(o0);
                for (int g = 0; g < w->nrows; g += 32) {
                    float cm = 0, dm = 0;
                    for (int k = g; k < w->nrows && k < g + 32; k++) {
                        cm = fmaxf(cm, fabsf(coef[t * ldc + k]));
                        dm = fmaxf(dm, fabsf(pi2_f16_to_f32(w->ws[k][b])));
                    }
                    double sig = cm / 127.0, D = qmax * dm / 127.0;
                    for (int k = g; k < w->nrows && k < g + 32; k++) {
                        double c = coef[t * ldc + k], dw = (double)pi2_f16_to_f32(w->ws[k][b]) * wq_at(w->t, w->wp[k], col);
                        ref += c * dw;
                        mag += fabs(c * dw);
                        /* a group below 2^-100 is quantized to zeros, as activations are */
                        qerr += cm < 0x1p-100f ? fabs(c * dw) : (fabs(c) + sig) * D / 2 + sig / 2 * (fabs(dw) + D / 2);
                    }
                }
                double tol = qerr * (1 + 0x1p-16) + (G + 4) * 0x1p-24 * (mag + qerr) + G * 32 * 128 * 0x1p-100;
                double v = got[t * ldo + col];
                CHECK(fabs(v - ref) <= tol, "scalar down gemm %s n=%lld rows=%d t=%d col=%lld: %.9g vs double %.9g (tol %g)",
                      pi2_q_type_name(w->t), (long long)w->n, w->nrows, t, (long long)col, v, ref, tol);
            }
}

static void gemm_suite(pi2_isa isa)
{
    pi2_rng r;
    pi2_rng_seed(&r, 91 + (uint64_t)isa);
    long compared = 0;
    static const int Ts[] = {1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 31, 33, 63, 64};
    for (int it = 0; it < 36; it++) {
        pi2_qtype t = QTYPES[it & 1];
        int64_t n = it < 8 ? 32 * (it / 2 + 1) : it < 12 ? 2048 + 32 : 32 * rand_int(&r, 1, 40);
        int nrows = it < 4 ? (int)rand_int(&r, 1, 33) : (int)rand_int(&r, 1, n > 1024 ? 300 : 1100);
        int T = it < 28 ? Ts[it % 14] : (int)rand_int(&r, 1, PI2_K_MAX_T);
        if (isa == PI2_ISA_SCALAR && (int64_t)T * n * nrows > 4000000)
            T = 1 + (int)(4000000 / (n * nrows)); /* the double reference is slow */
        compared += down_case(&r, isa, "down gemm", pi2_k_down_gemm_isa, gemm_check_double, t, n, nrows, T, it % 3,
                              false);
    }
    print_message("kernels: %s down gemm verified against %s: %ld outputs (q4, q8; n = 32..%d; rows 1..1100; T = 1..%d)\n",
                  pi2_k_isa_name(isa), isa == PI2_ISA_SCALAR ? "double" : "scalar (bit-exact)", compared, 2048 + 32,
                  PI2_K_MAX_T);
}

static void test_gemm_scalar(void **state)
{
    (void)state;
    gemm_suite(PI2_ISA_SCALAR);
}

static void test_gemm_avx2(void **state)
{
    (void)state;
    if (!isa_or_skip(PI2_ISA_AVX2, "down gemm"))
        skip();
    gemm_suite(PI2_ISA_AVX2);
}

static void test_gemm_avx512(void **state)
{
    (void)state;
    if (!isa_or_skip(PI2_ISA_AVX512, "down gemm"))
        skip();
    gemm_suite(PI2_ISA_AVX512);
}

static void test_gemm_neon(void **state)
{
    (void)state;
    if (!isa_or_skip(PI2_ISA_NEON, "down gemm"))
        skip();
    gemm_suite(PI2_ISA_NEON);
}

/* ---- prefill gate/up superblock GEMM: the twin against double, SIMD bit-exact ---- */

/* T tokens of n values for the superblock kernels: Gaussian, scales over
 * many octaves, zero and tiny stretches (kind as acts_new). */
static void sb_inputs(pi2_rng *r, float *x, int T, int64_t n, int64_t ldx, int kind)
{
    for (int t = 0; t < T; t++)
        for (int64_t j = 0; j < ldx; j++) {
            int64_t b = j / PI2_Q_GROUP;
            double v = pi2_rng_normal(r);
            if (kind == A_FULL)
                v = (b % 3 == 0) ? 1.0 : (b % 3 == 1) ? -1.0 : ((j & 1) ? 3.0 : -3.0);
            else if (kind == A_MIXED)
                v = (j / 256 % 5 == 3) ? 0.0 : (b % 7 == 5) ? v * 1e-32 : ldexp(v, (int)(b * 5 % 41) - 20);
            x[t * ldx + j] = j < n ? (float)v : NAN; /* past n: never read */
        }
}

/* Per superblock: scale m / 127 (0 below 2^-100, with q 0), q within half
 * a step of x / scale, block sums exact; the SIMD path bit-identical. */
static void test_act_quantize_sb(void **state)
{
    (void)state;
    pi2_rng r;
    pi2_rng_seed(&r, 77);
    /* the vectorized path of this machine: AVX-512 or NEON */
    pi2_isa sisa = pi2_k_isa_supported(PI2_ISA_AVX512) ? PI2_ISA_AVX512 : PI2_ISA_NEON;
    bool simd = pi2_k_isa_supported(sisa);
    long checked = 0;
    for (int it = 0; it < 30; it++) {
        int T = (int)rand_int(&r, 1, 9);
        int64_t n = it < 6 ? 32 * (int64_t)(it + 7) : 32 * rand_int(&r, 1, 80), ldx = n + 16 * rand_int(&r, 0, 2);
        int64_t nb = n / 32, ns = (nb + 7) / 8;
        float *x = xmalloc((size_t)(T * ldx), sizeof(float));
        sb_inputs(&r, x, T, n, ldx, it % 3);
        float *s1 = xmalloc((size_t)(T * ns), sizeof(float)), *s2 = xmalloc((size_t)(T * ns), sizeof(float));
        int8_t *q1 = xmalloc((size_t)(T * n), 1), *q2 = xmalloc((size_t)(T * n), 1);
        int32_t *u1 = xmalloc((size_t)(T * nb), sizeof(int32_t)), *u2 = xmalloc((size_t)(T * nb), sizeof(int32_t));
        pi2_k_act_quantize_sb_isa(PI2_ISA_SCALAR, x, ldx, T, n, s1, q1, u1);
        for (int t = 0; t < T; t++) {
            for (int64_t s = 0; s < ns; s++) {
                int64_t j0 = s * 256, j1 = j0 + 256 < n ? j0 + 256 : n;
                float m = 0;
                for (int64_t j = j0; j < j1; j++)
                    m = fmaxf(m, fabsf(x[t * ldx + j]));
                float sc = s1[t * ns + s];
                CHECK(m < 0x1p-100f ? sc == 0.0f : sc == m / 127.0f, "n=%lld t=%d sb %lld: scale %g for max %g",
                      (long long)n, t, (long long)s, sc, m);
                for (int64_t j = j0; j < j1; j++) {
                    int q = q1[t * n + j];
                    CHECK(q >= -127 && q <= 127, "q %d", q);
                    if (sc == 0.0f)
                        CHECK(q == 0, "q %d in a zero superblock", q);
                    else
                        CHECK(fabs(x[t * ldx + j] / sc - q) <= 0.5 + 1e-4, "n=%lld j=%lld: x %g, q %d, scale %g",
                              (long long)n, (long long)j, x[t * ldx + j], q, sc);
                }
            }
            for (int64_t b = 0; b < nb; b++) {
                int32_t sum = 0;
                for (int j = 0; j < 32; j++)
                    sum += q1[t * n + b * 32 + j];
                CHECK(u1[t * nb + b] == sum, "block sum %d vs %d", u1[t * nb + b], sum);
            }
        }
        if (simd) {
            pi2_k_act_quantize_sb_isa(sisa, x, ldx, T, n, s2, q2, u2);
            const char *nm = pi2_k_isa_name(sisa);
            CHECK(memcmp(s1, s2, (size_t)(T * ns) * sizeof(float)) == 0, "n=%lld: %s scales differ", (long long)n, nm);
            CHECK(memcmp(q1, q2, (size_t)(T * n)) == 0, "n=%lld: %s q differ", (long long)n, nm);
            CHECK(memcmp(u1, u2, (size_t)(T * nb) * sizeof(int32_t)) == 0, "n=%lld: %s sums differ", (long long)n, nm);
        }
        checked += T * n;
        free(x);
        free(s1);
        free(s2);
        free(q1);
        free(q2);
        free(u1);
        free(u2);
    }
    print_message("kernels: superblock activations: %ld values checked%s%s\n", checked,
                  simd ? ", bit-identical on " : " (no AVX-512 or NEON here: scalar only)",
                  simd ? pi2_k_isa_name(sisa) : "");
}

/* The twin against double: per row and superblock, each block's factor
 * is within half a part (D / 2) of its scale, so the output is within
 * sum_b (D_s / 2) * |sum_j wq_j cq_j| * sigma_s of the exact product of
 * the quantized activations, plus float rounding over the superblocks'
 * FMAs; a superblock whose scales are all below 2^-100 adds nothing. */
static void sb_check_double(const wrows *w, const float *as, const int8_t *aq, int T, const float *got, int64_t ldo)
{
    int64_t n = w->n, nb = n / 32, ns = (nb + 7) / 8;
    for (int t = 0; t < T; t++)
        for (int r = 0; r < w->nrows; r++) {
            double ref = 0, qerr = 0, mag = 0;
            for (int64_t s = 0; s < ns; s++) {
                float m = 0;
                for (int64_t b = 8 * s; b < nb && b < 8 * s + 8; b++)
                    m = fmaxf(m, fabsf(pi2_f16_to_f32(w->ws[r][b])));
                double sig = as[t * ns + s], D = m * 0x1p-12;
                for (int64_t b = 8 * s; b < nb && b < 8 * s + 8; b++) {
                    int64_t blk = 0;
                    for (int j = 0; j < 32; j++)
                        blk += (int64_t)wq_at(w->t, w->wp[r], b * 32 + j) * aq[t * n + b * 32 + j];
                    double v = (double)pi2_f16_to_f32(w->ws[r][b]) * (double)blk * sig;
                    ref += v;
                    mag += fabs(v);
                    qerr += m < 0x1p-100f ? fabs(v) : D / 2 * fabs((double)blk) * sig;
                }
            }
            double tol = qerr * (1 + 0x1p-16) + (ns + 4) * 0x1p-24 * (mag + qerr) + 1e-300;
            double v = got[t * ldo + r];
            CHECK(fabs(v - ref) <= tol, "sb matmul n=%lld row %d t=%d: %.9g vs double %.9g (tol %g)", (long long)n, r,
                  t, v, ref, tol);
        }
}

static void test_matmul_sb(void **state)
{
    (void)state;
    pi2_rng r;
    pi2_rng_seed(&r, 131);
    bool simd = pi2_k_isa_supported(PI2_ISA_AVX2) || pi2_k_isa_supported(PI2_ISA_NEON);
    static const int Ts[] = {1, 2, 3, 5, 8, 9, 16, 17, 33, PI2_K_MAX_T};
    long compared = 0;
    for (int it = 0; it < 30; it++) {
        int64_t n = it < 6 ? 32 * (int64_t)(it + 5) : it < 10 ? 2048 + 32 : 32 * rand_int(&r, 1, 80);
        int nrows = it % 4 == 0 ? (int)rand_int(&r, 1, 17) : (int)rand_int(&r, 1, 70);
        int T = it < 20 ? Ts[it % 10] : (int)rand_int(&r, 1, PI2_K_MAX_T);
        int64_t nb = n / 32, ns = (nb + 7) / 8, ldo = nrows + rand_int(&r, 0, 5);
        wrows w = wrows_new(&r, PI2_QT_Q4, n, nrows, it % 3);
        float *x = xmalloc((size_t)(T * n), sizeof(float));
        sb_inputs(&r, x, T, n, n, (it / 3) % 3);
        float *as = xmalloc((size_t)(T * ns), sizeof(float));
        int8_t *aq = xmalloc((size_t)(T * n), 1);
        int32_t *su = xmalloc((size_t)(T * nb), sizeof(int32_t));
        pi2_k_act_quantize_sb(x, n, T, n, as, aq, su);
        float *o1 = xmalloc((size_t)(T * ldo), sizeof(float)), *o2 = xmalloc((size_t)(T * ldo), sizeof(float));
        for (int64_t i = 0; i < T * ldo; i++)
            o1[i] = o2[i] = -7.0f; /* overwritten (between rows: kept) */
        pi2_k_matmul_sb_isa(PI2_ISA_SCALAR, n, nrows, w.wp, w.ws, as, aq, su, T, o1, ldo);
        sb_check_double(&w, as, aq, T, o1, ldo);
        for (int isa = PI2_ISA_AVX2; isa < PI2_ISA_COUNT; isa++) {
            if (!pi2_k_isa_supported((pi2_isa)isa))
                continue;
            pi2_k_matmul_sb_isa((pi2_isa)isa, n, nrows, w.wp, w.ws, as, aq, su, T, o2, ldo);
            CHECK(memcmp(o1, o2, (size_t)(T * ldo) * sizeof(float)) == 0, "n=%lld rows=%d T=%d: %s differs from the twin",
                  (long long)n, nrows, T, pi2_k_isa_name((pi2_isa)isa));
        }
        for (int t = 0; t < T; t++)
            for (int64_t i = nrows; i < ldo; i++)
                CHECK(o1[t * ldo + i] == -7.0f && o2[t * ldo + i] == -7.0f, "wrote past the rows");
        compared += (long)T * nrows;
        wrows_free(&w);
        free(x);
        free(as);
        free(aq);
        free(su);
        free(o1);
        free(o2);
    }
    print_message("kernels: superblock matmul: %ld outputs against double%s\n", compared,
                  simd ? ", every SIMD path bit-identical to the twin" : " (no SIMD here: twin only)");
}

/* ---- dequant: exact on every path ---- */

static void test_dequant(void **state)
{
    (void)state;
    pi2_rng r;
    pi2_rng_seed(&r, 61);
    int paths = 0;
    for (int i = 0; i < PI2_ISA_COUNT; i++) {
        pi2_isa isa = (pi2_isa)i;
        if (!isa_or_skip(isa, "dequant"))
            continue;
        assert_int_equal(pi2_k_set_isa(isa), 0);
        paths++;
        for (int it = 0; it < 16; it++) {
            pi2_qtype t = QTYPES[it & 1];
            int64_t n = 32 * rand_int(&r, 1, 90);
            int nrows = (int)rand_int(&r, 1, 7);
            wrows w = wrows_new(&r, t, n, nrows, it % 3);
            float *got = xmalloc((size_t)(nrows * n), sizeof(float)), *ref = xmalloc((size_t)n, sizeof(float));
            pi2_k_dequant_rows(t, n, nrows, w.wp, w.ws, got);
            for (int k = 0; k < nrows; k++) {
                pi2_q_dequantize_row(t, w.ws[k], w.wp[k], n, ref);
                CHECK(memcmp(got + k * n, ref, (size_t)n * sizeof(float)) == 0, "%s dequant %s n=%lld row %d differs",
                      pi2_k_isa_name(isa), pi2_q_type_name(t), (long long)n, k);
            }
            free(got);
            free(ref);
            wrows_free(&w);
        }
    }
    assert_int_equal(pi2_k_set_isa(pi2_k_isa_best()), 0);
    assert_true(paths >= 1);
}

/* ---- sgemv against double ---- */

static void sgemv_suite(pi2_isa isa)
{
    pi2_rng r;
    pi2_rng_seed(&r, 71 + (uint64_t)isa);
    for (int it = 0; it < 60; it++) {
        int64_t n = it < 40 ? it + 1 : rand_int(&r, 1, 1100);
        /* past 16 rows short ones (n <= 256) go 16 at a time */
        int nrows = it % 2 ? (int)rand_int(&r, 1, 11) : (int)rand_int(&r, 16, 50);
        int64_t ldw = n + rand_int(&r, 0, 3);
        float *W = xmalloc((size_t)(nrows * ldw), sizeof(float)), *x = xmalloc((size_t)n, sizeof(float));
        float *out = xmalloc((size_t)nrows, sizeof(float));
        for (int64_t i = 0; i < nrows * ldw; i++)
            W[i] = (float)ldexp(pi2_rng_normal(&r), (int)rand_int(&r, -6, 6));
        for (int64_t j = 0; j < n; j++)
            x[j] = (float)pi2_rng_normal(&r);
        pi2_k_sgemv_isa(isa, W, ldw, n, nrows, x, out);
        for (int k = 0; k < nrows; k++) {
            double ref = 0, mag = 0;
            for (int64_t j = 0; j < n; j++) {
                ref += (double)W[k * ldw + j] * x[j];
                mag += fabs((double)W[k * ldw + j] * x[j]);
            }
            double tol = ((double)n + 2) * 0x1p-24 * mag; /* any summation order */
            CHECK(fabs((double)out[k] - ref) <= tol, "%s sgemv n=%lld row %d: %.9g vs double %.9g (tol %g)",
                  pi2_k_isa_name(isa), (long long)n, k, (double)out[k], ref, tol);
        }
        free(W);
        free(x);
        free(out);
    }
}

static void test_sgemv(void **state)
{
    (void)state;
    for (int i = 0; i < PI2_ISA_COUNT; i++)
        if (isa_or_skip((pi2_isa)i, "sgemv"))
            sgemv_suite((pi2_isa)i);
}

/* ---- softmax against double ---- */

static void softmax_suite(pi2_isa isa)
{
    pi2_rng r;
    pi2_rng_seed(&r, 79 + (uint64_t)isa);
    for (int it = 0; it < 120; it++) {
        int64_t n = it < 40 ? it + 1 : rand_int(&r, 1, 700);
        double spread = it % 3 == 0 ? 40.0 : it % 3 == 1 ? 4.0 : 0.01; /* underflowing, typical, near-uniform */
        float *x = xmalloc((size_t)n + 1, sizeof(float));
        double *ref = xmalloc((size_t)n, sizeof(double));
        for (int64_t i = 0; i < n; i++)
            x[i] = (float)(spread * pi2_rng_normal(&r) + 100.0 * (it % 5 - 2));
        x[n] = 7.0f; /* past the end: untouched */
        double mx = -INFINITY, sum = 0;
        for (int64_t i = 0; i < n; i++)
            mx = x[i] > mx ? x[i] : mx;
        for (int64_t i = 0; i < n; i++)
            sum += ref[i] = exp((double)x[i] - mx);
        double *arg = xmalloc((size_t)n, sizeof(double));
        for (int64_t i = 0; i < n; i++)
            arg[i] = mx - x[i];
        pi2_k_softmax_isa(isa, x, n);
        for (int64_t i = 0; i < n; i++) {
            /* x - max rounds in float: exp's relative error grows with it */
            double want = ref[i] / sum, tol = (((double)n + 16) * 0x1p-24 + arg[i] * 0x1p-23) * want + 1e-30;
            CHECK(fabs((double)x[i] - want) <= tol, "%s softmax n=%lld [%lld]: %.9g vs double %.9g",
                  pi2_k_isa_name(isa), (long long)n, (long long)i, (double)x[i], want);
        }
        CHECK(x[n] == 7.0f, "%s softmax n=%lld wrote past the end", pi2_k_isa_name(isa), (long long)n);
        free(x);
        free(ref);
        free(arg);
    }
}

static void test_softmax(void **state)
{
    (void)state;
    for (int i = 0; i < PI2_ISA_COUNT; i++)
        if (isa_or_skip((pi2_isa)i, "softmax"))
            softmax_suite((pi2_isa)i);
}

/* ---- fp16 rows to f32 (the fp16 KV cache) ---- */

/* Every one of the 65536 fp16 values, at every length's tail and offset:
 * each ISA's conversion gives the scalar one's bits (NaNs: a NaN; a
 * conversion may quiet them), and writes nothing past n. */
static void test_f16_to_f32(void **state)
{
    (void)state;
    enum { N = 65536 };
    uint16_t *h = xmalloc(N + 64, sizeof(uint16_t));
    float *ref = xmalloc(N, sizeof(float)), *out = xmalloc(N + 1, sizeof(float));
    for (uint32_t i = 0; i < N; i++) {
        h[i] = (uint16_t)i;
        ref[i] = pi2_f16_to_f32((uint16_t)i);
    }
    CHECK(ref[0x3c00] == 1.0f && ref[0x0001] == 0x1p-24f && ref[0xfbff] == -65504.0f && isinf(ref[0x7c00]),
          "scalar fp16 reference wrong");
    for (int i = 0; i < PI2_ISA_COUNT; i++) {
        pi2_isa isa = (pi2_isa)i;
        if (!isa_or_skip(isa, "f16_to_f32"))
            continue;
        static const int64_t big[] = {100, 1031, 4096, N - 7, N};
        for (int c = 0; c < 41 + (int)(sizeof big / sizeof big[0]); c++) {
            int64_t n = c <= 40 ? c : big[c - 41], off = n + n % 7 <= N ? n % 7 : 0; /* unaligned starts too */
            out[n] = 4321.0f;
            pi2_k_f16_to_f32_isa(isa, h + off, n, out);
            for (int64_t j = 0; j < n; j++) {
                float r = ref[off + j];
                CHECK(isnan(r) ? isnan(out[j]) : memcmp(&out[j], &r, sizeof r) == 0,
                      "%s f16_to_f32 n=%lld: fp16 %#06x gave %a, scalar %a", pi2_k_isa_name(isa), (long long)n,
                      (unsigned)h[off + j], (double)out[j], (double)r);
            }
            CHECK(out[n] == 4321.0f, "%s f16_to_f32 n=%lld wrote past the end", pi2_k_isa_name(isa), (long long)n);
        }
    }
    free(h);
    free(ref);
    free(out);
}

/* ---- sgemv_t (rows weighted and added) against double ---- */

static void sgemv_t_suite(pi2_isa isa)
{
    pi2_rng r;
    pi2_rng_seed(&r, 73 + (uint64_t)isa);
    for (int it = 0; it < 80; it++) {
        int64_t n = it < 70 ? it + 1 : rand_int(&r, 1, 300);
        int nrows = it % 7 == 0 ? 0 : (int)rand_int(&r, 1, 40);
        int64_t ldw = n + rand_int(&r, 0, 3);
        float *W = xmalloc((size_t)(nrows * ldw) + 1, sizeof(float)), *c = xmalloc((size_t)nrows + 1, sizeof(float));
        float *out = xmalloc((size_t)n + 1, sizeof(float));
        for (int64_t i = 0; i < nrows * ldw; i++)
            W[i] = (float)ldexp(pi2_rng_normal(&r), (int)rand_int(&r, -6, 6));
        for (int k = 0; k < nrows; k++)
            c[k] = (float)pi2_rng_normal(&r);
        out[n] = 12345.0f; /* past the end: untouched */
        for (int64_t j = 0; j < n; j++)
            out[j] = NAN; /* overwritten, not accumulated */
        pi2_k_sgemv_t_isa(isa, W, ldw, n, nrows, c, out);
        for (int64_t j = 0; j < n; j++) {
            double ref = 0, mag = 0;
            for (int k = 0; k < nrows; k++) {
                ref += (double)W[k * ldw + j] * c[k];
                mag += fabs((double)W[k * ldw + j] * c[k]);
            }
            double tol = ((double)nrows + 2) * 0x1p-24 * mag;
            CHECK(fabs((double)out[j] - ref) <= tol, "%s sgemv_t n=%lld rows %d col %lld: %.9g vs double %.9g",
                  pi2_k_isa_name(isa), (long long)n, nrows, (long long)j, (double)out[j], ref);
        }
        CHECK(out[n] == 12345.0f, "%s sgemv_t n=%lld wrote past the end", pi2_k_isa_name(isa), (long long)n);
        free(W);
        free(c);
        free(out);
    }
}

static void test_sgemv_t(void **state)
{
    (void)state;
    for (int i = 0; i < PI2_ISA_COUNT; i++)
        if (isa_or_skip((pi2_isa)i, "sgemv_t"))
            sgemv_t_suite((pi2_isa)i);
}

/* pi2_k_sgemv_t_group: the bits of one pi2_k_sgemv_t per vector, on every
 * path, for 1..9 vectors (more than one group of 4, ragged), ragged widths
 * and strides; nothing written between or past the outputs. */
static void test_sgemv_t_group(void **state)
{
    (void)state;
    pi2_rng r;
    pi2_rng_seed(&r, 79);
    for (int i = 0; i < PI2_ISA_COUNT; i++) {
        if (!isa_or_skip((pi2_isa)i, "sgemv_t_group"))
            continue;
        for (int it = 0; it < 60; it++) {
            int64_t n = it < 20 ? (it % 4 + 1) * 32 : rand_int(&r, 1, 200);
            int nrows = it % 9 == 0 ? 0 : (int)rand_int(&r, 1, 300), G = 1 + it % 9;
            int64_t ldw = n + rand_int(&r, 0, 3), ldc = nrows + rand_int(&r, 0, 5), ldo = n + rand_int(&r, 1, 4);
            float *W = xmalloc((size_t)(nrows * ldw) + 1, sizeof(float));
            float *c = xmalloc((size_t)(G * ldc) + 1, sizeof(float));
            float *got = xmalloc((size_t)(G * ldo), sizeof(float)), *ref = xmalloc((size_t)(G * ldo), sizeof(float));
            for (int64_t k = 0; k < nrows * ldw; k++)
                W[k] = (float)pi2_rng_normal(&r);
            for (int64_t k = 0; k < G * ldc; k++)
                c[k] = (float)pi2_rng_normal(&r);
            for (int64_t k = 0; k < G * ldo; k++)
                got[k] = ref[k] = 777.0f;
            for (int g = 0; g < G; g++)
                pi2_k_sgemv_t_isa((pi2_isa)i, W, ldw, n, nrows, c + g * ldc, ref + g * ldo);
            pi2_k_sgemv_t_group_isa((pi2_isa)i, W, ldw, n, nrows, c, ldc, G, got, ldo);
            CHECK(memcmp(got, ref, (size_t)(G * ldo) * sizeof(float)) == 0,
                  "%s sgemv_t_group n=%lld rows %d G=%d: differs from one call per vector",
                  pi2_k_isa_name((pi2_isa)i), (long long)n, nrows, G);
            /* the rows in blocks, each block's sums added on (the fp16 KV cache's values): the same bits */
            for (int64_t k = 0; k < G * ldo; k++)
                got[k] = 777.0f;
            int blk = 1 + it % 40;
            for (int b0 = 0; b0 < nrows || (nrows == 0 && b0 == 0); b0 += blk) {
                int nb = nrows - b0 < blk ? nrows - b0 : blk;
                (b0 == 0 ? pi2_k_sgemv_t_group_isa : pi2_k_sgemv_t_group_acc_isa)(
                    (pi2_isa)i, W + (int64_t)b0 * ldw, ldw, n, nb, c + b0, ldc, G, got, ldo);
            }
            CHECK(memcmp(got, ref, (size_t)(G * ldo) * sizeof(float)) == 0,
                  "%s sgemv_t_group_acc n=%lld rows %d G=%d in blocks of %d: differs from one call",
                  pi2_k_isa_name((pi2_isa)i), (long long)n, nrows, G, blk);
            /* and sgemv's rows, each its own sum: a block at a time the same bits as all at once */
            float *x = xmalloc((size_t)n, sizeof(float)), *s1 = xmalloc((size_t)nrows + 1, sizeof(float)),
                  *s2 = xmalloc((size_t)nrows + 1, sizeof(float));
            for (int64_t k = 0; k < n; k++)
                x[k] = (float)pi2_rng_normal(&r);
            pi2_k_sgemv_isa((pi2_isa)i, W, ldw, n, nrows, x, s1);
            for (int b0 = 0; b0 < nrows; b0 += blk)
                pi2_k_sgemv_isa((pi2_isa)i, W + (int64_t)b0 * ldw, ldw, n, nrows - b0 < blk ? nrows - b0 : blk, x,
                                s2 + b0);
            CHECK(nrows == 0 || memcmp(s1, s2, (size_t)nrows * sizeof(float)) == 0,
                  "%s sgemv n=%lld rows %d in blocks of %d: differs from one call", pi2_k_isa_name((pi2_isa)i),
                  (long long)n, nrows, blk);
            free(x);
            free(s1);
            free(s2);
            free(W);
            free(c);
            free(got);
            free(ref);
        }
    }
}

/* Softmax input k of case it: spread out until exp underflows (past the
 * clamp), typical, near-uniform; and in three cases of every 8 the edges:
 * all equal; the max a tie of -0 and +0 (-0 first, which the twin keeps);
 * most far below the clamp (-1e30, -FLT_MAX). */
static float softmax_input(pi2_rng *r, int it, int64_t k)
{
    switch (it % 8) {
    case 5:
        return 3.25f;
    case 6:
        return k % 3 == 0 ? -0.0f : k % 3 == 1 ? 0.0f : (float)-fabs(pi2_rng_normal(r));
    case 7:
        return k % 5 == 2 ? (float)pi2_rng_normal(r) : k % 2 ? -1e30f : -FLT_MAX;
    default:
        return (float)((it % 3 == 0 ? 40.0 : it % 3 == 1 ? 4.0 : 0.01) * pi2_rng_normal(r));
    }
}

/* ---- the f32 kernels that feed selections: bit-identical twins ----
 *
 * Attention's scores and weighted values, softmax and the MoE router run
 * pi2_k_sgemv, pi2_k_sgemv_t and pi2_k_softmax: every path gives the
 * scalar twin's bits (kernels.h, Numerics) on ragged widths and strides,
 * row counts past the 16- and 4-row groups, and long rows. */
static void test_f32_twins_bitwise(void **state)
{
    (void)state;
    pi2_rng r;
    pi2_rng_seed(&r, 83);
    for (int i = PI2_ISA_AVX2; i < PI2_ISA_COUNT; i++) {
        pi2_isa isa = (pi2_isa)i;
        if (!isa_or_skip(isa, "f32 twins"))
            continue;
        for (int it = 0; it < 160; it++) {
            int64_t n = it < 48 ? it + 1 : it < 60 ? 16 * rand_int(&r, 1, 24) : rand_int(&r, 1, 2100);
            int nrows = (int)rand_int(&r, 0, 41);
            int64_t ldw = n + rand_int(&r, 0, 3);
            /* x is sgemv's input (n) and sgemv_t's coefficients (nrows) */
            int64_t nx = n > nrows ? n : nrows;
            float *W = xmalloc((size_t)(nrows * ldw) + 1, sizeof(float)), *x = xmalloc((size_t)nx, sizeof(float));
            float *got = xmalloc((size_t)(n + nrows) + 1, sizeof(float));
            float *ref = xmalloc((size_t)(n + nrows) + 1, sizeof(float));
            for (int64_t k = 0; k < nrows * ldw; k++)
                W[k] = (float)ldexp(pi2_rng_normal(&r), (int)rand_int(&r, -6, 6));
            for (int64_t k = 0; k < nx; k++)
                x[k] = (float)pi2_rng_normal(&r);
            pi2_k_sgemv_isa(isa, W, ldw, n, nrows, x, got);
            pi2_k_sgemv_isa(PI2_ISA_SCALAR, W, ldw, n, nrows, x, ref);
            CHECK(memcmp(got, ref, (size_t)nrows * sizeof(float)) == 0, "%s sgemv n=%lld rows %d: not the twin's bits",
                  pi2_k_isa_name(isa), (long long)n, nrows);
            pi2_k_sgemv_t_isa(isa, W, ldw, n, nrows, x, got);
            pi2_k_sgemv_t_isa(PI2_ISA_SCALAR, W, ldw, n, nrows, x, ref);
            CHECK(memcmp(got, ref, (size_t)n * sizeof(float)) == 0, "%s sgemv_t n=%lld rows %d: not the twin's bits",
                  pi2_k_isa_name(isa), (long long)n, nrows);
            for (int64_t k = 0; k < n; k++)
                got[k] = ref[k] = softmax_input(&r, it, k);
            pi2_k_softmax_isa(isa, got, n);
            pi2_k_softmax_isa(PI2_ISA_SCALAR, ref, n);
            CHECK(memcmp(got, ref, (size_t)n * sizeof(float)) == 0, "%s softmax n=%lld: not the twin's bits",
                  pi2_k_isa_name(isa), (long long)n);
            free(W);
            free(x);
            free(got);
            free(ref);
        }
    }
}

/* ---- probes ---- */

static void test_probes(void **state)
{
    (void)state;
    for (int i = 0; i < PI2_ISA_COUNT; i++) {
        double p = pi2_k_probe_int8_peak((pi2_isa)i, 0.02);
        CHECK(p > 1e6 && isfinite(p), "int8 peak %s: %g MAC/s", pi2_k_isa_name((pi2_isa)i), p);
    }
    static const size_t sizes[] = {1, 31, 1000, 4096 + 7};
    uint8_t *buf = xmalloc(4096 + 7, 1);
    memset(buf, 1, 4096 + 7);
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        double bw = pi2_k_probe_read_bw(buf, sizes[i], 0.005);
        CHECK(bw > 1e6 && isfinite(bw), "read bw over %zu bytes: %g B/s", sizes[i], bw);
    }
    CHECK(pi2_k_probe_read_bw(buf, 0, 0.01) == 0.0, "empty buffer");
    free(buf);
}

/* Threads' rates combine over the span they ran in: side by side they
 * add, one after the other they count once. */
static void test_probe_combine(void **state)
{
    (void)state;
    const double rate[2] = {30e9, 30e9};
    const double t0[2] = {1.0, 1.0}, t1[2] = {1.5, 1.5};
    const double s0[2] = {1.0, 1.5}, s1[2] = {1.5, 2.0};
    const double h0[2] = {1.0, 1.25}, h1[2] = {1.5, 1.75};
    CHECK(fabs(pi2_k_probe_combine(rate, t0, t1, 2) - 60e9) < 1e3, "together: %g", pi2_k_probe_combine(rate, t0, t1, 2));
    CHECK(fabs(pi2_k_probe_combine(rate, s0, s1, 2) - 30e9) < 1e3, "in turn: %g", pi2_k_probe_combine(rate, s0, s1, 2));
    CHECK(fabs(pi2_k_probe_combine(rate, h0, h1, 2) - 40e9) < 1e3, "half overlap: %g",
          pi2_k_probe_combine(rate, h0, h1, 2));
    CHECK(fabs(pi2_k_probe_combine(rate, t0, t1, 1) - 30e9) < 1e3, "one thread");
    CHECK(pi2_k_probe_combine(rate, t0, t0, 2) == 0.0, "no time");
    CHECK(pi2_k_probe_combine(rate, t0, t1, 0) == 0.0, "no threads");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_isa_state),
        cmocka_unit_test(test_act_quantize),
        cmocka_unit_test(test_matmul_scalar_reference),
        cmocka_unit_test(test_matmul_avx2),
        cmocka_unit_test(test_matmul_avx512),
        cmocka_unit_test(test_matmul_neon),
        cmocka_unit_test(test_matmul_dotprod),
        cmocka_unit_test(test_matmul_i8mm),
        cmocka_unit_test(test_matmul_dispatch),
        cmocka_unit_test(test_matmul_gfni),
        cmocka_unit_test(test_matmul_short),
        cmocka_unit_test(test_matmul_pf),
        cmocka_unit_test(test_down_rows_pf),
        cmocka_unit_test(test_axpy_scalar),
        cmocka_unit_test(test_axpy_avx2),
        cmocka_unit_test(test_axpy_avx512),
        cmocka_unit_test(test_down_scalar),
        cmocka_unit_test(test_down_avx2),
        cmocka_unit_test(test_down_avx512),
        cmocka_unit_test(test_down_neon),
        cmocka_unit_test(test_gemm_scalar),
        cmocka_unit_test(test_gemm_avx2),
        cmocka_unit_test(test_gemm_avx512),
        cmocka_unit_test(test_gemm_neon),
        cmocka_unit_test(test_dequant),
        cmocka_unit_test(test_sgemv),
        cmocka_unit_test(test_sgemv_t),
        cmocka_unit_test(test_sgemv_t_group),
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_f16_to_f32),
        cmocka_unit_test(test_f32_twins_bitwise),
        cmocka_unit_test(test_probes),
        cmocka_unit_test(test_probe_combine),
        cmocka_unit_test(test_act_quantize_sb),
        cmocka_unit_test(test_matmul_sb),
    };
    return cmocka_run_group_tests_name("kernels", tests, NULL, NULL);
}
