/* Activation traces: (input, active-neuron bits) samples for the trainer. */
#include "predictor/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int pi2_trace_create(pi2_trace **out, int d, int n_ff, pi2_err *err)
{
    *out = NULL;
    if (d < 1 || n_ff < 1 || d > PI2_PRED_MAX_DIM || n_ff > PI2_PRED_MAX_DIM)
        return pi2_err_set(err, PI2_ERANGE, "trace: dimensions d=%d n_ff=%d must be in [1, %d]", d, n_ff,
                           PI2_PRED_MAX_DIM);
    pi2_trace *t = calloc(1, sizeof *t);
    if (!t)
        return pi2_err_set(err, PI2_ENOMEM, "trace: out of memory");
    t->d = d;
    t->n_ff = n_ff;
    t->w = words_for(n_ff);
    *out = t;
    return 0;
}

void pi2_trace_free(pi2_trace *t)
{
    if (!t)
        return;
    free(t->x);
    free(t->bits);
    free(t);
}

int pi2_trace_reserve(pi2_trace *t, size_t n, pi2_err *err)
{
    if (n <= t->cap)
        return 0;
    size_t xb, bb;
    if (!pi2_mul_size(n, (size_t)t->d * sizeof(float), &xb) || !pi2_mul_size(n, t->w * sizeof(uint64_t), &bb))
        return pi2_err_set(err, PI2_ERANGE, "trace: %zu samples overflow the address space", n);
    float *x = realloc(t->x, xb);
    if (!x)
        return pi2_err_set(err, PI2_ENOMEM, "trace: out of memory for %zu samples (%zu MiB of inputs)", n, xb >> 20);
    t->x = x;
    uint64_t *bits = realloc(t->bits, bb);
    if (!bits)
        return pi2_err_set(err, PI2_ENOMEM, "trace: out of memory for %zu samples", n);
    t->bits = bits;
    t->cap = n;
    return 0;
}

static int trace_grow(pi2_trace *t, pi2_err *err)
{
    if (t->n < t->cap)
        return 0;
    size_t want = t->cap < 64 ? 64 : t->cap + t->cap / 2;
    return pi2_trace_reserve(t, want, err);
}

static int trace_check_x(const pi2_trace *t, const float *x, pi2_err *err)
{
    size_t bad;
    if (!pred_all_finite(x, (size_t)t->d, &bad))
        return pi2_err_set(err, PI2_EINVAL, "trace: sample %zu: input x[%zu] is not finite (%g)", t->n, bad,
                           (double)x[bad]);
    return 0;
}

uint64_t pred_popcount_row(const uint64_t *w, size_t n)
{
    uint64_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += (uint64_t)__builtin_popcountll(w[i]);
    return c;
}

int pi2_trace_add(pi2_trace *t, const float *x, const float *act, float min_abs, pi2_err *err)
{
    int rc = trace_check_x(t, x, err);
    if (rc)
        return rc;
    size_t bad;
    if (!pred_all_finite(act, (size_t)t->n_ff, &bad))
        return pi2_err_set(err, PI2_EINVAL, "trace: sample %zu: activation %zu is not finite (%g)", t->n, bad,
                           (double)act[bad]);
    if (!(min_abs >= 0.0f) || !isfinite(min_abs))
        return pi2_err_set(err, PI2_EINVAL, "trace: activation cut-off %g must be a finite number >= 0",
                           (double)min_abs);
    if ((rc = trace_grow(t, err)))
        return rc;
    memcpy(t->x + t->n * (size_t)t->d, x, (size_t)t->d * sizeof(float));
    uint64_t *row = t->bits + t->n * t->w;
    memset(row, 0, t->w * sizeof(uint64_t));
    for (int j = 0; j < t->n_ff; j++)
        if (fabsf(act[j]) > min_abs)
            row[j >> 6] |= 1ull << (j & 63);
    t->n_active += pred_popcount_row(row, t->w);
    t->n++;
    return 0;
}

int pi2_trace_add_bits(pi2_trace *t, const float *x, const uint64_t *bits, pi2_err *err)
{
    int rc = trace_check_x(t, x, err);
    if (rc)
        return rc;
    int tail = t->n_ff & 63;
    if (tail && (bits[t->w - 1] >> tail) != 0)
        return pi2_err_set(err, PI2_EINVAL, "trace: sample %zu: bits set past neuron %d", t->n, t->n_ff - 1);
    if ((rc = trace_grow(t, err)))
        return rc;
    memcpy(t->x + t->n * (size_t)t->d, x, (size_t)t->d * sizeof(float));
    memcpy(t->bits + t->n * t->w, bits, t->w * sizeof(uint64_t));
    t->n_active += pred_popcount_row(bits, t->w);
    t->n++;
    return 0;
}

size_t pi2_trace_count(const pi2_trace *t) { return t->n; }
int pi2_trace_dim(const pi2_trace *t) { return t->d; }
int pi2_trace_nff(const pi2_trace *t) { return t->n_ff; }
const float *pi2_trace_x(const pi2_trace *t, size_t i) { return t->x + i * (size_t)t->d; }
const uint64_t *pi2_trace_bits(const pi2_trace *t, size_t i) { return t->bits + i * t->w; }

bool pi2_trace_active(const pi2_trace *t, size_t i, int j)
{
    return (t->bits[i * t->w + ((size_t)j >> 6)] >> (j & 63)) & 1;
}

double pi2_trace_active_frac(const pi2_trace *t)
{
    return t->n ? (double)t->n_active / ((double)t->n * (double)t->n_ff) : 0.0;
}
