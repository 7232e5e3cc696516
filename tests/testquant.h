/* Row generators and quantized-row buffers for the quantizer tests
 * (test_quant.c): rows of every distribution the quantizers must handle. */
#ifndef PI2_TESTQUANT_H
#define PI2_TESTQUANT_H

#include "tests/testutil.h"

#include "formats/common.h"
#include "formats/quant.h"

#include <math.h>

static int64_t rand_int(pi2_rng *r, int64_t lo, int64_t hi) /* [lo, hi] */
{
    return lo + (int64_t)(pi2_rng_u64(r) % (uint64_t)(hi - lo + 1));
}

/* A quantized row with its buffers, sized exactly so ASan sees overreads. */
typedef struct qrow {
    pi2_qtype t;
    int64_t cols;
    uint16_t *scales;
    uint8_t *payload;
} qrow;

static qrow qrow_new(pi2_qtype t, int64_t cols)
{
    qrow q = {t, cols, NULL, NULL};
    size_t ns = pi2_q_scale_row_count(t, cols), nb = pi2_q_payload_row_bytes(t, cols);
    q.scales = pi2_malloc_array(ns ? ns : 1, sizeof(uint16_t));
    q.payload = pi2_malloc_array(nb, 1);
    assert_non_null(q.scales);
    assert_non_null(q.payload);
    return q;
}

static void qrow_free(qrow *q)
{
    free(q->scales);
    free(q->payload);
}

/* ---- row generators ---- */

enum {
    D_GAUSS,
    D_HEAVY,
    D_ZERO,
    D_SPIKE,
    D_F16MAX,
    D_LIMIT,
    D_SUBNORMAL,
    D_MIXED,
    D_GRID,
    D_TIES,
    D_COUNT,
};
static const char *const DIST_NAMES[D_COUNT] = {"gauss", "heavy", "zero",  "spike", "f16max",
                                                "limit", "subnormal", "mixed", "grid",  "ties"};

static void gen_row(pi2_rng *r, int dist, pi2_qtype t, float *x, int64_t cols)
{
    double sigma = pow(10.0, -3.0 + 4.0 * pi2_rng_uniform(r));
    for (int64_t j = 0; j < cols; j++) {
        double v = 0;
        switch (dist) {
        case D_GAUSS:
            v = sigma * pi2_rng_normal(r);
            break;
        case D_HEAVY: /* log-normal scale: most tiny, a few huge */
            v = pi2_rng_normal(r) * exp(1.5 * pi2_rng_normal(r));
            v = fmax(-1e5, fmin(1e5, v));
            break;
        case D_ZERO:
            v = (j % 3 == 0) ? -0.0 : 0.0;
            break;
        case D_SPIKE:
            v = 1e-3 * pi2_rng_normal(r);
            break;
        case D_F16MAX:
            v = 65504.0 * (2.0 * pi2_rng_uniform(r) - 1.0);
            break;
        case D_LIMIT: { /* up to just below the largest accepted magnitude */
            double lim = t == PI2_QT_Q4 ? 524288.0 - 0.0625 : 8323071.0;
            v = lim * (2.0 * pi2_rng_uniform(r) - 1.0);
            if (j % PI2_Q_GROUP == 7)
                v = (pi2_rng_u64(r) & 1) ? lim : -lim;
            if (j % PI2_Q_GROUP == 20) /* the far side of Q4's clamp */
                v = -x[j - 13];
            break;
        }
        case D_SUBNORMAL: /* scales that are fp16 subnormals or flush to zero */
            v = ldexp(pi2_rng_normal(r), -14 - (int)((j / PI2_Q_GROUP * 7) % 24));
            break;
        case D_MIXED:
            v = ldexp(pi2_rng_normal(r), (int)((j / PI2_Q_GROUP * 13) % 40) - 28);
            break;
        case D_GRID: /* exactly representable: q * 2^k */
            v = ldexp((double)rand_int(r, -8, 7), (int)((j / PI2_Q_GROUP) % 9) - 4);
            break;
        case D_TIES: /* k + 1/2 steps of a power-of-two scale */
            v = ldexp((double)(t == PI2_QT_Q4 ? rand_int(r, -8, 7) : rand_int(r, -15, 15)) + 0.5, -3);
            if (j % PI2_Q_GROUP == 0)
                v = t == PI2_QT_Q4 ? -1.0 : 127.0 / 8;
            break;
        }
        x[j] = (float)v;
    }
    if (dist == D_SPIKE)
        x[rand_int(r, 0, cols - 1)] = (float)((pi2_rng_u64(r) & 1 ? 1 : -1) * pow(10.0, 3.0 * pi2_rng_uniform(r)));
}

/* First element of largest magnitude in a group. */
static double group_m(const float *x)
{
    double m = 0, a = 0;
    for (int j = 0; j < PI2_Q_GROUP; j++) {
        if (fabs((double)x[j]) > a) {
            a = fabs((double)x[j]);
            m = x[j];
        }
    }
    return m;
}

#endif
