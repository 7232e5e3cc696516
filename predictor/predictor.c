/* Low-rank predictors: weights, scores, the active set, the rank rule. */
#include "predictor/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* 64-byte aligned zeroed array of n elements of `size` bytes; NULL on overflow
 * or failure. Alignment keeps the BLAS inputs' layout the same run to run. */
void *pred_alloc_aligned(size_t n, size_t size)
{
    size_t total;
    if (!pi2_mul_size(n ? n : 1, size, &total) || !pi2_add_size(total, 63, &total))
        return NULL;
    total &= ~(size_t)63;
    void *p = aligned_alloc(64, total);
    if (p)
        memset(p, 0, total);
    return p;
}

bool pred_all_finite(const float *v, size_t n, size_t *bad)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(v[i])) {
            *bad = i;
            return false;
        }
    return true;
}

/* Uninitialised weights of the given shape. Caller owns *out. */
int pred_alloc(pi2_predictor **out, int d, int n_ff, int rank, pi2_err *err)
{
    *out = NULL;
    if (d < 1 || n_ff < 1 || rank < 1 || d > PI2_PRED_MAX_DIM || n_ff > PI2_PRED_MAX_DIM ||
        rank > PI2_PRED_MAX_DIM)
        return pi2_err_set(err, PI2_ERANGE, "predictor: dimensions d=%d n_ff=%d rank=%d must be in [1, %d]", d,
                           n_ff, rank, PI2_PRED_MAX_DIM);
    pi2_predictor *p = calloc(1, sizeof *p);
    if (p) {
        p->fc1 = pred_alloc_aligned((size_t)rank * (size_t)d, sizeof(float));
        p->fc2 = pred_alloc_aligned((size_t)n_ff * (size_t)rank, sizeof(float));
    }
    if (!p || !p->fc1 || !p->fc2) {
        pi2_pred_free(p);
        return pi2_err_set(err, PI2_ENOMEM, "predictor: out of memory for rank %d x (%d + %d) weights", rank, d,
                           n_ff);
    }
    p->d = d;
    p->n_ff = n_ff;
    p->rank = rank;
    *out = p;
    return 0;
}

int pi2_pred_create(pi2_predictor **out, int d, int n_ff, int rank, const float *fc1, const float *fc2,
                    float threshold, pi2_err *err)
{
    *out = NULL;
    if (isnan(threshold))
        return pi2_err_set(err, PI2_EINVAL, "predictor: threshold is NaN");
    pi2_predictor *p;
    int rc = pred_alloc(&p, d, n_ff, rank, err);
    if (rc)
        return rc;
    size_t n1 = (size_t)rank * (size_t)d, n2 = (size_t)n_ff * (size_t)rank, bad;
    if (!pred_all_finite(fc1, n1, &bad)) {
        pi2_pred_free(p);
        return pi2_err_set(err, PI2_EINVAL, "predictor: fc1[%zu][%zu] is not finite", bad / (size_t)d,
                           bad % (size_t)d);
    }
    if (!pred_all_finite(fc2, n2, &bad)) {
        pi2_pred_free(p);
        return pi2_err_set(err, PI2_EINVAL, "predictor: fc2[%zu][%zu] is not finite", bad / (size_t)rank,
                           bad % (size_t)rank);
    }
    memcpy(p->fc1, fc1, n1 * sizeof(float));
    memcpy(p->fc2, fc2, n2 * sizeof(float));
    p->threshold = threshold;
    *out = p;
    return 0;
}

void pi2_pred_free(pi2_predictor *p)
{
    if (!p)
        return;
    free(p->fc1);
    free(p->fc2);
    free(p);
}

int pi2_pred_dim(const pi2_predictor *p) { return p->d; }
int pi2_pred_nff(const pi2_predictor *p) { return p->n_ff; }
int pi2_pred_rank(const pi2_predictor *p) { return p->rank; }
float pi2_pred_threshold(const pi2_predictor *p) { return p->threshold; }
const float *pi2_pred_fc1(const pi2_predictor *p) { return p->fc1; }
const float *pi2_pred_fc2(const pi2_predictor *p) { return p->fc2; }

int pi2_pred_set_threshold(pi2_predictor *p, float threshold)
{
    if (isnan(threshold))
        return PI2_EINVAL;
    p->threshold = threshold;
    return 0;
}

int pi2_pred_score(const pi2_predictor *p, const float *x, float *scores)
{
    int d = p->d, r = p->rank;
    float *h = malloc((size_t)r * sizeof(float));
    if (!h)
        return PI2_ENOMEM;
    for (int k = 0; k < r; k++) { /* h = relu(fc1 · x)   (rank) */
        const float *row = p->fc1 + (size_t)k * d;
        double acc = 0;
        for (int j = 0; j < d; j++)
            acc += (double)row[j] * x[j];
        h[k] = acc > 0 ? (float)acc : 0.0f;
    }
    for (int i = 0; i < p->n_ff; i++) { /* scores = fc2 · h   (n_ff) */
        const float *row = p->fc2 + (size_t)i * r;
        double acc = 0;
        for (int k = 0; k < r; k++)
            acc += (double)row[k] * h[k];
        scores[i] = (float)acc;
    }
    free(h);
    return 0;
}

int pi2_pred_predict(const pi2_predictor *p, const float *x, uint64_t *bits)
{
    size_t w = words_for(p->n_ff);
    memset(bits, 0, w * sizeof(uint64_t));
    float *s = malloc((size_t)p->n_ff * sizeof(float));
    if (!s)
        return PI2_ENOMEM;
    if (pi2_pred_score(p, x, s) != 0) {
        free(s);
        return PI2_ENOMEM;
    }
    int n = 0;
    for (int i = 0; i < p->n_ff; i++)
        if (s[i] >= p->threshold) {
            bits[i >> 6] |= 1ull << (i & 63);
            n++;
        }
    free(s);
    return n;
}

int pi2_pred_choose_rank(int d, int n_ff, double active_frac, int min_rank, int max_rank)
{
    if (d < 1 || n_ff < 1 || !(active_frac >= 0.0 && active_frac <= 1.0) || min_rank < 1 || min_rank > max_rank)
        return PI2_EINVAL;
    double raw = (double)d * sqrt(active_frac) / 2.0;
    double r = floor(raw / 32.0 + 0.5) * 32.0;
    if (r < 32)
        r = 32;
    if (r < min_rank)
        r = min_rank;
    if (r > max_rank)
        r = max_rank;
    return (int)r;
}
