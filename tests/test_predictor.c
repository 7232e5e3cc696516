/* predictor: traces, rank rule, scalar vs batched scoring, calibration,
 * training on planted low-rank activations, determinism, early stop, bad
 * inputs. */
#include "tests/testutil.h"

#include "predictor/train.h"

#include <math.h>

/* Under ASan, let impossible allocations return NULL (as malloc does) so the
 * out-of-memory paths can be tested; unused in plain builds. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

/* ---- planted activations ----
 * x: d-1 standard normal coordinates plus a constant 1 in the last one (real
 * RMSNorm outputs carry such near-constant "massive activation" directions,
 * which is what lets a bias-free MLP express per-neuron offsets).
 * Truth: neuron i active iff a_i = C_i · (U x) + b_i > 0, with U [k, d] a
 * random k-dim subspace (zero on the constant coordinate), C [n_ff, k], and
 * b_i set for a heavy-tailed (log-normal) per-neuron firing rate. */
typedef struct planted {
    int d, n_ff, k;
    float *U, *C, *b;
} planted;

static double norm_quantile(double p)
{
    double lo = -12, hi = 12;
    for (int i = 0; i < 200; i++) {
        double m = (lo + hi) / 2;
        if (0.5 * erfc(-m / sqrt(2.0)) < p)
            lo = m;
        else
            hi = m;
    }
    return (lo + hi) / 2;
}

static void planted_init(planted *P, int d, int n_ff, int k, uint64_t seed)
{
    pi2_rng r;
    pi2_rng_seed(&r, seed);
    P->d = d;
    P->n_ff = n_ff;
    P->k = k;
    P->U = calloc((size_t)k * d, sizeof(float));
    P->C = calloc((size_t)n_ff * k, sizeof(float));
    P->b = calloc((size_t)n_ff, sizeof(float));
    assert_true(P->U && P->C && P->b);
    for (int i = 0; i < k; i++)
        for (int j = 0; j < d - 1; j++)
            P->U[i * d + j] = (float)(pi2_rng_normal(&r) / sqrt(d - 1.0));
    for (int i = 0; i < n_ff; i++) {
        double nn = 0;
        for (int j = 0; j < k; j++) {
            float c = (float)pi2_rng_normal(&r);
            P->C[i * k + j] = c;
            nn += (double)c * c;
        }
        /* median rate 4%, log-normal spread: a few hot neurons, many cold */
        double p = 0.04 * exp(1.2 * pi2_rng_normal(&r));
        if (p > 0.95)
            p = 0.95;
        P->b[i] = (float)(sqrt(nn) * norm_quantile(p));
    }
}

static void planted_free(planted *P)
{
    free(P->U);
    free(P->C);
    free(P->b);
}

static pi2_trace *planted_trace(const planted *P, int n, uint64_t seed)
{
    pi2_rng r;
    pi2_rng_seed(&r, seed);
    pi2_trace *t;
    assert_int_equal(pi2_trace_create(&t, P->d, P->n_ff, NULL), 0);
    float *x = malloc(sizeof(float) * P->d), *act = malloc(sizeof(float) * P->n_ff);
    double *z = malloc(sizeof(double) * P->k);
    for (int s = 0; s < n; s++) {
        for (int j = 0; j < P->d - 1; j++)
            x[j] = (float)pi2_rng_normal(&r);
        x[P->d - 1] = 1.0f;
        for (int i = 0; i < P->k; i++) {
            double a = 0;
            for (int j = 0; j < P->d; j++)
                a += (double)P->U[i * P->d + j] * x[j];
            z[i] = a;
        }
        for (int i = 0; i < P->n_ff; i++) {
            double a = P->b[i];
            for (int j = 0; j < P->k; j++)
                a += (double)P->C[i * P->k + j] * z[j];
            act[i] = a > 0 ? (float)a : 0.0f; /* ReLU-like: inactive = exactly 0 */
        }
        assert_int_equal(pi2_trace_add(t, x, act, 0, NULL), 0);
    }
    free(x);
    free(act);
    free(z);
    return t;
}

/* The exact predictor of a planted model: relu(Ux) - relu(-Ux) = Ux and the
 * constant coordinate carries b, so score_i = a_i. rank = 2k + 1. */
static pi2_predictor *planted_exact(const planted *P, float threshold)
{
    int d = P->d, k = P->k, r = 2 * k + 1;
    float *fc1 = calloc((size_t)r * d, sizeof(float)), *fc2 = calloc((size_t)P->n_ff * r, sizeof(float));
    for (int i = 0; i < k; i++)
        for (int j = 0; j < d; j++) {
            fc1[i * d + j] = P->U[i * d + j];
            fc1[(k + i) * d + j] = -P->U[i * d + j];
        }
    fc1[2 * k * d + d - 1] = 1.0f;
    for (int i = 0; i < P->n_ff; i++) {
        for (int j = 0; j < k; j++) {
            fc2[i * r + j] = P->C[i * k + j];
            fc2[i * r + k + j] = -P->C[i * k + j];
        }
        fc2[i * r + 2 * k] = P->b[i];
    }
    pi2_predictor *p;
    pi2_err err = {0};
    assert_int_equal(pi2_pred_create(&p, d, P->n_ff, r, fc1, fc2, threshold, &err), 0);
    free(fc1);
    free(fc2);
    return p;
}

/* Shared fixtures: one planted layer (d 64, 256 neurons, 8-dim structure),
 * a training trace and a fresh trace from the same distribution. */
static planted g_model;
static pi2_trace *g_train, *g_fresh;

static int group_setup(void **state)
{
    (void)state;
    planted_init(&g_model, 64, 256, 8, 11);
    g_train = planted_trace(&g_model, 8000, 1);
    g_fresh = planted_trace(&g_model, 3000, 2);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    pi2_trace_free(g_train);
    pi2_trace_free(g_fresh);
    planted_free(&g_model);
    return 0;
}

/* A small trace: the first n samples of g_train. */
static pi2_trace *prefix_trace(size_t n)
{
    pi2_trace *t;
    assert_int_equal(pi2_trace_create(&t, pi2_trace_dim(g_train), pi2_trace_nff(g_train), NULL), 0);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(pi2_trace_add_bits(t, pi2_trace_x(g_train, i), pi2_trace_bits(g_train, i), NULL), 0);
    return t;
}

/* ---------------------------------------------------------------- tests */

static void test_trace(void **state)
{
    (void)state;
    pi2_err err = {0};
    pi2_trace *t;
    assert_int_equal(pi2_trace_create(&t, 3, 70, &err), 0);
    assert_int_equal(pi2_trace_count(t), 0);
    assert_true(pi2_trace_active_frac(t) == 0.0);
    float x[3] = {1, -2, 0.5f}, act[70] = {0};
    act[1] = 0.5f;
    act[2] = -2.0f;
    act[3] = 1e-3f; /* below the cut-off */
    act[69] = 7.0f;
    assert_int_equal(pi2_trace_add(t, x, act, 0.01f, &err), 0);
    assert_int_equal(pi2_trace_count(t), 1);
    assert_true(pi2_trace_active(t, 0, 1) && pi2_trace_active(t, 0, 2) && pi2_trace_active(t, 0, 69));
    assert_false(pi2_trace_active(t, 0, 0) || pi2_trace_active(t, 0, 3));
    assert_true(pi2_trace_bits(t, 0)[0] == 0x6ull && pi2_trace_bits(t, 0)[1] == 1ull << 5);
    assert_true(memcmp(pi2_trace_x(t, 0), x, sizeof x) == 0);
    /* with cut-off 0, any non-zero activation counts */
    assert_int_equal(pi2_trace_add(t, x, act, 0, &err), 0);
    assert_true(pi2_trace_active(t, 1, 3));
    uint64_t bits[2] = {1, 0};
    assert_int_equal(pi2_trace_add_bits(t, x, bits, &err), 0);
    assert_int_equal(pi2_trace_count(t), 3);
    assert_true(fabs(pi2_trace_active_frac(t) - 8.0 / 210) < 1e-12);
    /* growth past the initial capacity keeps the data */
    for (int i = 0; i < 500; i++)
        assert_int_equal(pi2_trace_add_bits(t, x, bits, NULL), 0);
    assert_int_equal(pi2_trace_count(t), 503);
    assert_true(pi2_trace_active(t, 1, 3) && pi2_trace_active(t, 502, 0));

    /* bad samples leave the trace unchanged */
    x[1] = NAN;
    assert_int_equal(pi2_trace_add(t, x, act, 0, &err), PI2_EINVAL);
    assert_non_null(strstr(err.msg, "trace: sample 503: input x[1] is not finite"));
    x[1] = 0;
    act[5] = INFINITY;
    pi2_err_clear(&err);
    assert_int_equal(pi2_trace_add(t, x, act, 0, &err), PI2_EINVAL);
    assert_non_null(strstr(err.msg, "activation 5"));
    act[5] = 0;
    assert_int_equal(pi2_trace_add(t, x, act, -1.0f, NULL), PI2_EINVAL);
    assert_int_equal(pi2_trace_add(t, x, act, NAN, NULL), PI2_EINVAL);
    bits[1] = 1ull << 6; /* neuron 70: past n_ff */
    pi2_err_clear(&err);
    assert_int_equal(pi2_trace_add_bits(t, x, bits, &err), PI2_EINVAL);
    assert_non_null(strstr(err.msg, "past neuron 69"));
    assert_int_equal(pi2_trace_count(t), 503);
    /* reserve: an overflowing count is refused without allocating */
    assert_int_equal(pi2_trace_reserve(t, SIZE_MAX / 8, NULL), PI2_ERANGE);
    /* 2^44 samples of 12 + 16 bytes: more than the 47-bit address space */
    pi2_err_clear(&err);
    assert_int_equal(pi2_trace_reserve(t, (size_t)1 << 44, &err), PI2_ENOMEM);
    assert_non_null(strstr(err.msg, "trace: out of memory"));
    assert_int_equal(pi2_trace_reserve(t, 1000, NULL), 0);
    assert_int_equal(pi2_trace_count(t), 503);
    pi2_trace_free(t);
    pi2_trace_free(NULL);

    assert_int_equal(pi2_trace_create(&t, 0, 10, NULL), PI2_ERANGE);
    assert_null(t);
    assert_int_equal(pi2_trace_create(&t, 10, PI2_PRED_MAX_DIM + 1, NULL), PI2_ERANGE);
}

static void test_rank_rule(void **state)
{
    (void)state;
    assert_int_equal(pi2_pred_choose_rank(4096, 14336, 0.02, 32, 1024), 288);
    assert_int_equal(pi2_pred_choose_rank(4096, 14336, 0.05, 32, 1024), 448);
    assert_int_equal(pi2_pred_choose_rank(4096, 14336, 0.10, 32, 1024), 640);
    assert_int_equal(pi2_pred_choose_rank(4096, 14336, 0.25, 32, 1024), 1024);
    assert_int_equal(pi2_pred_choose_rank(4096, 14336, 0.60, 32, 1024), 1024); /* clamped */
    assert_int_equal(pi2_pred_choose_rank(4096, 14336, 0.0, 64, 1024), 64);
    assert_int_equal(pi2_pred_choose_rank(64, 256, 0.1, 1, 1024), 32); /* at least 32 */
    assert_int_equal(pi2_pred_choose_rank(64, 256, 0.1, 16, 16), 16);  /* the caller's max wins */
    /* monotone in the active fraction */
    int prev = 0;
    for (double f = 0; f <= 1.0; f += 0.01) {
        int r = pi2_pred_choose_rank(5120, 13824, f, 32, 2048);
        assert_true(r >= prev && r % 32 == 0);
        prev = r;
    }
    assert_int_equal(pi2_pred_choose_rank(0, 10, 0.1, 32, 64), PI2_EINVAL);
    assert_int_equal(pi2_pred_choose_rank(64, 0, 0.1, 32, 64), PI2_EINVAL);
    assert_int_equal(pi2_pred_choose_rank(64, 10, 1.5, 32, 64), PI2_EINVAL);
    assert_int_equal(pi2_pred_choose_rank(64, 10, NAN, 32, 64), PI2_EINVAL);
    assert_int_equal(pi2_pred_choose_rank(64, 10, 0.1, 0, 64), PI2_EINVAL);
    assert_int_equal(pi2_pred_choose_rank(64, 10, 0.1, 65, 64), PI2_EINVAL);
}

static void test_sizes(void **state)
{
    (void)state;
    assert_int_equal(pi2_pred_bytes_f32(4096, 14336, 512), (uint64_t)512 * (4096 + 14336) * 4);
    /* fc1: 512 rows of 128 groups, fc2: 14336 rows of 16 groups, 34 bytes each */
    assert_int_equal(pi2_pred_bytes_q8(4096, 14336, 512), (uint64_t)(512 * 128 + 14336 * 16) * 34);
    assert_int_equal(pi2_pred_bytes_q8(33, 2, 1), (uint64_t)(1 * 2 + 2 * 1) * 34); /* short groups */
}

static void test_exact_predictor(void **state)
{
    (void)state;
    /* threshold just below 0: every truly active entry (a > 0) is caught even
     * with float rounding; only entries within rounding of 0 can be false
     * positives */
    pi2_predictor *p = planted_exact(&g_model, -1e-4f);
    assert_int_equal(pi2_pred_rank(p), 17);
    pi2_pred_report rep;
    pi2_err err = {0};
    assert_int_equal(pi2_pred_eval(p, g_fresh, &rep, &err), 0);
    assert_true(rep.recall == 1.0);
    assert_true(rep.precision > 0.9999);
    assert_true(fabs(rep.pred_active_frac - rep.true_active_frac) < 1e-4);
    assert_true(fabs(rep.true_active_frac - pi2_trace_active_frac(g_fresh)) < 1e-12);
    assert_int_equal(rep.n_eval, 3000);
    assert_int_equal(rep.rank, 17);
    assert_int_equal(rep.bytes_f32, pi2_pred_bytes_f32(64, 256, 17));
    /* the scalar forward and the bitset prediction agree with the truth */
    float *s = malloc(256 * sizeof(float));
    uint64_t bits[4];
    for (size_t i = 0; i < 50; i++) {
        assert_int_equal(pi2_pred_score(p, pi2_trace_x(g_fresh, i), s), 0);
        int n = pi2_pred_predict(p, pi2_trace_x(g_fresh, i), bits);
        assert_true(n >= 0);
        int truth = 0;
        for (int j = 0; j < 256; j++) {
            bool act = pi2_trace_active(g_fresh, i, j);
            truth += act;
            if (act)
                assert_true(s[j] > -1e-4f);
            assert_int_equal((int)((bits[j >> 6] >> (j & 63)) & 1), s[j] >= -1e-4f);
        }
        assert_true(n >= truth);
    }
    free(s);
    /* a threshold above every score predicts nothing: recall 0, precision 1 */
    assert_int_equal(pi2_pred_set_threshold(p, INFINITY), 0);
    assert_int_equal(pi2_pred_eval(p, g_fresh, &rep, NULL), 0);
    assert_true(rep.recall == 0.0 && rep.precision == 1.0 && rep.pred_active_frac == 0.0);
    assert_int_equal(pi2_pred_set_threshold(p, NAN), PI2_EINVAL);
    assert_true(isinf(pi2_pred_threshold(p)));
    pi2_pred_free(p);
    pi2_pred_free(NULL);
}

/* Batched (OpenBLAS) scoring inside calibrate/eval against the scalar twin:
 * a random predictor, scores from pi2_pred_score, threshold and recall
 * computed here by plain sorting and counting. */
static int cmp_f(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static void test_scalar_twin(void **state)
{
    (void)state;
    const int d = 64, n_ff = 256, r = 48;
    pi2_rng rng;
    pi2_rng_seed(&rng, 5);
    float *fc1 = malloc(sizeof(float) * r * d), *fc2 = malloc(sizeof(float) * n_ff * r);
    for (int i = 0; i < r * d; i++)
        fc1[i] = (float)(pi2_rng_normal(&rng) * 0.2);
    for (int i = 0; i < n_ff * r; i++)
        fc2[i] = (float)(pi2_rng_normal(&rng) * 0.2);
    pi2_predictor *p;
    assert_int_equal(pi2_pred_create(&p, d, n_ff, r, fc1, fc2, 0.0f, NULL), 0);
    assert_true(memcmp(pi2_pred_fc1(p), fc1, sizeof(float) * r * d) == 0);
    assert_true(memcmp(pi2_pred_fc2(p), fc2, sizeof(float) * n_ff * r) == 0);
    pi2_trace *t = prefix_trace(700); /* not a multiple of the batch */
    size_t n = pi2_trace_count(t), npos = 0;
    float *s = malloc(sizeof(float) * n * n_ff), *pos = malloc(sizeof(float) * n * n_ff);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(pi2_pred_score(p, pi2_trace_x(t, i), s + i * n_ff), 0);
        for (int j = 0; j < n_ff; j++)
            if (pi2_trace_active(t, i, j))
                pos[npos++] = s[i * n_ff + j];
    }
    qsort(pos, npos, sizeof(float), cmp_f);
    size_t m = (size_t)ceil(0.9 * (double)npos - 1e-9);
    float want = pos[npos - m];
    assert_int_equal(pi2_pred_calibrate(p, t, 0.9, NULL), 0);
    assert_true(fabsf(pi2_pred_threshold(p) - want) <= 1e-4f * (1 + fabsf(want)));
    /* counts at the calibrated threshold, scalar vs batched */
    float thr = pi2_pred_threshold(p);
    size_t tp = 0, fp = 0;
    for (size_t i = 0; i < n * n_ff; i++) {
        bool truth = pi2_trace_active(t, i / n_ff, (int)(i % n_ff));
        tp += truth && s[i] >= thr;
        fp += !truth && s[i] >= thr;
    }
    pi2_pred_report rep;
    assert_int_equal(pi2_pred_eval(p, t, &rep, NULL), 0);
    assert_true(fabs(rep.recall - (double)tp / (double)npos) < 2e-3);
    assert_true(fabs(rep.pred_active_frac - (double)(tp + fp) / (double)(n * n_ff)) < 2e-3);
    free(s);
    free(pos);
    free(fc1);
    free(fc2);
    pi2_pred_free(p);
    pi2_trace_free(t);
}

static void test_calibrate_targets(void **state)
{
    (void)state;
    pi2_predictor *p = planted_exact(&g_model, 0.0f);
    /* a noisy version of the exact predictor, so calibration has work to do */
    int r = pi2_pred_rank(p), n_ff = pi2_pred_nff(p);
    float *fc2 = malloc(sizeof(float) * n_ff * r);
    memcpy(fc2, pi2_pred_fc2(p), sizeof(float) * n_ff * r);
    pi2_rng rng;
    pi2_rng_seed(&rng, 3);
    for (int i = 0; i < n_ff * r; i++)
        fc2[i] += (float)(0.3 * pi2_rng_normal(&rng));
    pi2_predictor *q;
    assert_int_equal(pi2_pred_create(&q, 64, n_ff, r, pi2_pred_fc1(p), fc2, 0.0f, NULL), 0);
    free(fc2);
    pi2_pred_free(p);
    pi2_trace *t = prefix_trace(2000);
    const double targets[] = {0.5, 0.95, 0.99, 1.0};
    double prev_frac = 0;
    for (size_t k = 0; k < sizeof targets / sizeof targets[0]; k++) {
        pi2_err err = {0};
        assert_int_equal(pi2_pred_calibrate(q, t, targets[k], &err), 0);
        pi2_pred_report rep;
        assert_int_equal(pi2_pred_eval(q, t, &rep, &err), 0);
        /* reaches the target, by no more than ties and one entry */
        assert_true(rep.recall >= targets[k]);
        assert_true(rep.recall < targets[k] + 1e-3 || targets[k] == 1.0);
        assert_true(rep.pred_active_frac >= prev_frac); /* more recall costs more */
        prev_frac = rep.pred_active_frac;
    }
    /* all scores equal (zero weights): the threshold is that score */
    float *z1 = calloc((size_t)r * 64, sizeof(float)), *z2 = calloc((size_t)n_ff * r, sizeof(float));
    pi2_predictor *zero;
    assert_int_equal(pi2_pred_create(&zero, 64, n_ff, r, z1, z2, 5.0f, NULL), 0);
    assert_int_equal(pi2_pred_calibrate(zero, t, 0.9, NULL), 0);
    assert_true(pi2_pred_threshold(zero) == 0.0f);
    pi2_pred_report zr;
    assert_int_equal(pi2_pred_eval(zero, t, &zr, NULL), 0);
    assert_true(zr.recall == 1.0 && zr.pred_active_frac == 1.0);
    pi2_pred_free(zero);
    free(z1);
    free(z2);
    /* bad targets leave the threshold alone */
    float thr = pi2_pred_threshold(q);
    pi2_err err = {0};
    assert_int_equal(pi2_pred_calibrate(q, t, 0.0, &err), PI2_EINVAL);
    assert_non_null(strstr(err.msg, "predictor: target recall 0"));
    assert_int_equal(pi2_pred_calibrate(q, t, 1.5, NULL), PI2_EINVAL);
    assert_int_equal(pi2_pred_calibrate(q, t, NAN, NULL), PI2_EINVAL);
    assert_true(pi2_pred_threshold(q) == thr);
    pi2_pred_free(q);
    pi2_trace_free(t);
}

static void test_train_planted(void **state)
{
    (void)state;
    pi2_pred_train_opts o;
    pi2_pred_train_defaults(&o);
    o.rank = 64;
    o.batch = 64;
    o.epochs = 20;
    o.target_recall = 0.995; /* a margin so that fresh data still sees >= 0.99 */
    pi2_predictor *p;
    pi2_pred_report rep;
    pi2_err err = {0};
    int rc = pi2_pred_train(g_train, &o, &p, &rep, &err);
    if (rc)
        fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, 0);
    double t_frac = rep.true_active_frac;
    fprintf(stderr, "planted: held-out recall %.4f precision %.3f predicted %.4f true %.4f, %d epochs (best %d), "
                    "loss %.4f / %.4f, pos_weight %.1f, %.2f s\n",
            rep.recall, rep.precision, rep.pred_active_frac, t_frac, rep.epochs, rep.best_epoch, rep.train_loss,
            rep.heldout_loss, rep.pos_weight, rep.seconds);
    assert_true(rep.recall >= 0.995);
    assert_true(t_frac > 0.05 && t_frac < 0.15);
    assert_true(rep.pred_active_frac <= 2 * t_frac);
    assert_int_equal(rep.n_eval, 1600);
    assert_int_equal(rep.n_train, 6400);
    assert_int_equal(rep.rank, 64);
    assert_true(rep.threshold == pi2_pred_threshold(p));
    assert_int_equal(rep.bytes_f32, (uint64_t)64 * (64 + 256) * 4);
    assert_int_equal(rep.bytes_q8, (uint64_t)(64 * 2 + 256 * 2) * 34);
    assert_true(rep.epochs >= 1 && rep.epochs <= 20 && rep.best_epoch >= 1 && rep.best_epoch <= rep.epochs);
    assert_true(rep.pos_weight > 5 && rep.pos_weight < 20); /* (1 - f) / f */
    assert_true(isfinite(rep.train_loss) && rep.train_loss > 0 && isfinite(rep.heldout_loss));
    assert_true(rep.seconds > 0);
    /* generalises: fresh samples from the same layer */
    pi2_pred_report fr;
    assert_int_equal(pi2_pred_eval(p, g_fresh, &fr, &err), 0);
    fprintf(stderr, "planted: fresh recall %.4f predicted %.4f true %.4f\n", fr.recall, fr.pred_active_frac,
            fr.true_active_frac);
    assert_true(fr.recall >= 0.99);
    assert_true(fr.pred_active_frac <= 2 * fr.true_active_frac);
    pi2_pred_free(p);
}

static void train_small(const pi2_trace *t, int threads, uint64_t seed, pi2_predictor **p)
{
    pi2_pred_train_opts o;
    pi2_pred_train_defaults(&o);
    o.rank = 0; /* auto, pinned by the bounds */
    o.rank_min = 80;
    o.rank_max = 80; /* two rank blocks of the fc1 update, the last partial */
    o.batch = 150;   /* three row blocks, the last partial; the last batch short */
    o.epochs = 2;
    o.threads = threads;
    o.seed = seed;
    pi2_err err = {0};
    assert_int_equal(pi2_pred_train(t, &o, p, NULL, &err), 0);
    assert_int_equal(pi2_pred_rank(*p), 80);
}

static bool same_weights(const pi2_predictor *a, const pi2_predictor *b)
{
    int r = pi2_pred_rank(a), d = pi2_pred_dim(a), n = pi2_pred_nff(a);
    return r == pi2_pred_rank(b) && memcmp(pi2_pred_fc1(a), pi2_pred_fc1(b), sizeof(float) * r * d) == 0 &&
           memcmp(pi2_pred_fc2(a), pi2_pred_fc2(b), sizeof(float) * n * r) == 0 &&
           memcmp(&(float){pi2_pred_threshold(a)}, &(float){pi2_pred_threshold(b)}, sizeof(float)) == 0;
}

static void test_deterministic(void **state)
{
    (void)state;
    /* 1100 neurons: three column blocks of the score / fc2 phases, the last
     * partial, so every phase really is spread over the threads */
    planted P;
    planted_init(&P, 32, 1100, 4, 21);
    pi2_trace *t = planted_trace(&P, 500, 3);
    pi2_predictor *a, *b, *c, *e;
    train_small(t, 2, 7, &a);
    train_small(t, 2, 7, &b);
    train_small(t, 1, 7, &c); /* the thread count does not change a bit */
    train_small(t, 3, 8, &e);
    assert_true(same_weights(a, b));
    assert_true(same_weights(a, c));
    assert_false(same_weights(a, e)); /* another seed: another split and init */
    pi2_pred_free(a);
    pi2_pred_free(b);
    pi2_pred_free(c);
    pi2_pred_free(e);
    pi2_trace_free(t);
    planted_free(&P);
}

static void test_early_stop(void **state)
{
    (void)state;
    /* few samples, big rank: the held-out loss turns up quickly */
    pi2_trace *t = prefix_trace(600);
    pi2_pred_train_opts o;
    pi2_pred_train_defaults(&o);
    o.rank = 128;
    o.batch = 32;
    o.lr = 1e-2;
    o.epochs = 60;
    o.stop_metric = PI2_PRED_STOP_LOSS;
    o.patience = 2;
    pi2_predictor *p;
    pi2_pred_report rep;
    assert_int_equal(pi2_pred_train(t, &o, &p, &rep, NULL), 0);
    assert_true(rep.early_stopped);
    assert_true(rep.epochs < 60);
    assert_true(rep.best_epoch <= rep.epochs - 2);
    /* the kept weights are the best epoch's: their held-out loss is reported */
    double kept = rep.heldout_loss;
    pi2_pred_free(p);
    o.restore_best = false;
    assert_int_equal(pi2_pred_train(t, &o, &p, &rep, NULL), 0);
    assert_true(rep.best_epoch == rep.epochs);
    assert_true(rep.heldout_loss > kept); /* the last epoch is worse */
    pi2_pred_free(p);
    /* no early stop: the epochs cap */
    o.patience = 0;
    o.epochs = 3;
    assert_int_equal(pi2_pred_train(t, &o, &p, &rep, NULL), 0);
    assert_false(rep.early_stopped);
    assert_int_equal(rep.epochs, 3);
    pi2_pred_free(p);
    pi2_trace_free(t);
}

static void test_bad_inputs(void **state)
{
    (void)state;
    pi2_pred_train_opts o;
    pi2_pred_train_defaults(&o);
    o.epochs = 1;
    pi2_predictor *p = (pi2_predictor *)&o; /* must be reset to NULL on error */
    pi2_err err = {0};

    /* empty and one-sample traces */
    pi2_trace *t;
    assert_int_equal(pi2_trace_create(&t, 64, 256, NULL), 0);
    assert_int_equal(pi2_pred_train(t, &o, &p, NULL, &err), PI2_EINVAL);
    assert_null(p);
    assert_non_null(strstr(err.msg, "predictor: the trace has 0 samples"));
    assert_null(strchr(err.msg, '\n'));
    pi2_trace_add_bits(t, pi2_trace_x(g_train, 0), pi2_trace_bits(g_train, 0), NULL);
    assert_int_equal(pi2_pred_train(t, &o, &p, NULL, NULL), PI2_EINVAL);
    pi2_trace_free(t);

    /* no active neuron anywhere: nothing to calibrate against */
    assert_int_equal(pi2_trace_create(&t, 64, 256, NULL), 0);
    uint64_t none[4] = {0};
    for (int i = 0; i < 20; i++)
        assert_int_equal(pi2_trace_add_bits(t, pi2_trace_x(g_train, (size_t)i), none, NULL), 0);
    pi2_err_clear(&err);
    assert_int_equal(pi2_pred_train(t, &o, &p, NULL, &err), PI2_EINVAL);
    assert_non_null(strstr(err.msg, "no active neuron"));
    pi2_predictor *ex = planted_exact(&g_model, 0.0f);
    assert_int_equal(pi2_pred_calibrate(ex, t, 0.99, NULL), PI2_EINVAL);
    pi2_trace_free(t);

    /* options */
    pi2_trace *small = prefix_trace(100);
    pi2_pred_train_opts bad;
#define EXPECT_BAD(field, value, text)                                             \
    do {                                                                           \
        bad = o;                                                                   \
        bad.field = value;                                                         \
        pi2_err_clear(&err);                                                       \
        assert_int_equal(pi2_pred_train(small, &bad, &p, NULL, &err), PI2_EINVAL); \
        assert_null(p);                                                            \
        assert_non_null(strstr(err.msg, text));                                    \
    } while (0)
    EXPECT_BAD(lr, NAN, "learning rate");
    EXPECT_BAD(lr, 0, "learning rate");
    EXPECT_BAD(beta1, 1.0, "betas");
    EXPECT_BAD(beta2, -0.1, "betas");
    EXPECT_BAD(eps, 0, "eps");
    EXPECT_BAD(epochs, 0, "epochs");
    EXPECT_BAD(batch, 0, "batch");
    EXPECT_BAD(holdout, 0, "held-out fraction");
    EXPECT_BAD(holdout, 1, "held-out fraction");
    EXPECT_BAD(target_recall, 0, "target recall");
    EXPECT_BAD(target_recall, 1.01, "target recall");
    EXPECT_BAD(pos_weight, -1, "positive-class weight");
    EXPECT_BAD(pos_weight, INFINITY, "positive-class weight");
    EXPECT_BAD(rank, -3, "rank");
    EXPECT_BAD(rank_min, 0, "rank bounds");
    EXPECT_BAD(patience, -1, "patience");
    EXPECT_BAD(stop_metric, (pi2_pred_stop)7, "stop metric");
    EXPECT_BAD(threads, 1000, "threads");
    EXPECT_BAD(weight_decay, -1, "weight decay");
#undef EXPECT_BAD

    /* a learning rate that blows up is reported, not returned as weights */
    bad = o;
    bad.lr = 1e30;
    bad.rank = 8;
    pi2_err_clear(&err);
    assert_int_equal(pi2_pred_train(small, &bad, &p, NULL, &err), PI2_ERANGE);
    assert_non_null(strstr(err.msg, "predictor: training diverged at epoch 1"));
    assert_null(p);

    /* shape mismatches */
    pi2_trace *other;
    assert_int_equal(pi2_trace_create(&other, 32, 256, NULL), 0);
    float x32[32] = {0}, act[256] = {1};
    assert_int_equal(pi2_trace_add(other, x32, act, 0, NULL), 0);
    pi2_pred_report rep;
    pi2_err_clear(&err);
    assert_int_equal(pi2_pred_eval(ex, other, &rep, &err), PI2_ESHAPE);
    assert_non_null(strstr(err.msg, "predictor: shape d=64 n_ff=256 does not match the trace's d=32 n_ff=256"));
    assert_int_equal(pi2_pred_calibrate(ex, other, 0.9, NULL), PI2_ESHAPE);
    pi2_trace_free(other);
    /* eval/calibrate on an empty trace */
    assert_int_equal(pi2_trace_create(&other, 64, 256, NULL), 0);
    assert_int_equal(pi2_pred_eval(ex, other, &rep, NULL), PI2_EINVAL);
    assert_int_equal(pi2_pred_calibrate(ex, other, 0.9, NULL), PI2_EINVAL);
    pi2_trace_free(other);

    /* imported weights: non-finite values and impossible shapes */
    float w1[2 * 3] = {0, 1, 2, 3, 4, 5}, w2[4 * 2] = {0};
    pi2_predictor *q = (pi2_predictor *)&o;
    assert_int_equal(pi2_pred_create(&q, 3, 4, 2, w1, w2, 0.5f, &err), 0);
    assert_int_equal(pi2_pred_dim(q), 3);
    assert_int_equal(pi2_pred_nff(q), 4);
    assert_true(pi2_pred_threshold(q) == 0.5f);
    pi2_pred_free(q);
    w1[4] = NAN;
    pi2_err_clear(&err);
    assert_int_equal(pi2_pred_create(&q, 3, 4, 2, w1, w2, 0.5f, &err), PI2_EINVAL);
    assert_null(q);
    assert_non_null(strstr(err.msg, "predictor: fc1[1][1] is not finite"));
    w1[4] = 0;
    w2[7] = -INFINITY;
    pi2_err_clear(&err);
    assert_int_equal(pi2_pred_create(&q, 3, 4, 2, w1, w2, 0.5f, &err), PI2_EINVAL);
    assert_non_null(strstr(err.msg, "fc2[3][1]"));
    w2[7] = 0;
    assert_int_equal(pi2_pred_create(&q, 3, 4, 2, w1, w2, NAN, NULL), PI2_EINVAL);
    assert_int_equal(pi2_pred_create(&q, 3, 4, 0, w1, w2, 0, NULL), PI2_ERANGE);
    assert_int_equal(pi2_pred_create(&q, PI2_PRED_MAX_DIM + 1, 4, 2, w1, w2, 0, NULL), PI2_ERANGE);

    pi2_pred_free(ex);
    pi2_trace_free(small);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trace),          cmocka_unit_test(test_rank_rule),
        cmocka_unit_test(test_sizes),          cmocka_unit_test(test_exact_predictor),
        cmocka_unit_test(test_scalar_twin),    cmocka_unit_test(test_calibrate_targets),
        cmocka_unit_test(test_train_planted),  cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_early_stop),     cmocka_unit_test(test_bad_inputs),
    };
    return cmocka_run_group_tests_name("predictor", tests, group_setup, group_teardown);
}
