/* Threshold calibration and evaluation of a predictor over a trace. */
#include "predictor/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int check_shapes(const pi2_predictor *pr, const pi2_trace *tr, pi2_err *err)
{
    if (pr->d != tr->d || pr->n_ff != tr->n_ff)
        return pi2_err_set(err, PI2_ESHAPE,
                           "predictor: shape d=%d n_ff=%d does not match the trace's d=%d n_ff=%d", pr->d, pr->n_ff,
                           tr->d, tr->n_ff);
    return 0;
}

/* Order-preserving map of a float to an unsigned key (negative floats
 * reversed; NaNs land at either end, never in between), and back. */
static uint32_t float_key(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}

static float key_float(uint32_t k)
{
    uint32_t u = (k & 0x80000000u) ? k & 0x7fffffffu : ~k;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The k-th smallest (0-based) of v[0..n), reordering v: Wirth's quickselect
 * with a median-of-three pivot, O(n) expected (a sort would be a noticeable
 * share of each epoch at millions of active entries). */
static uint32_t select_kth(uint32_t *v, size_t n, size_t k)
{
    ptrdiff_t lo = 0, hi = (ptrdiff_t)n - 1, kk = (ptrdiff_t)k;
    while (lo < hi) {
        uint32_t a = v[lo], b = v[lo + (hi - lo) / 2], c = v[hi];
        uint32_t x = a < b ? (b < c ? b : (a < c ? c : a)) : (a < c ? a : (b < c ? c : b));
        ptrdiff_t i = lo, j = hi;
        do {
            while (v[i] < x)
                i++;
            while (x < v[j])
                j--;
            if (i <= j) {
                uint32_t t = v[i];
                v[i] = v[j];
                v[j] = t;
                i++;
                j--;
            }
        } while (i <= j);
        if (j < kk)
            lo = i;
        if (kk < i)
            hi = j;
    }
    return v[k];
}

/* Threshold reaching `recall` over samples idx[0..n) with weights j->fc1/fc2;
 * with `loss` non-NULL, also the mean weighted loss per entry (same pass). */
int pred_calibrate_idx(job *j, pool *p, const pi2_trace *tr, const size_t *idx, size_t n, double recall,
                       float *thr, double *loss, pi2_err *err)
{
    uint64_t npos = 0;
    for (size_t i = 0; i < n; i++)
        npos += pred_popcount_row(pi2_trace_bits(tr, idx[i]), tr->w);
    if (npos == 0)
        return pi2_err_set(err, PI2_EINVAL, "predictor: no active neuron in the %zu calibration samples", n);
    uint32_t *pos = pi2_malloc_array((size_t)npos, sizeof(uint32_t));
    if (!pos)
        return pi2_err_set(err, PI2_ENOMEM, "predictor: out of memory for %llu calibration scores",
                           (unsigned long long)npos);
    size_t k = 0;
    double sum = 0;
    for (size_t i0 = 0; i0 < n; i0 += (size_t)j->cap) {
        int nb = n - i0 < (size_t)j->cap ? (int)(n - i0) : j->cap;
        pred_job_gather(j, tr, idx + i0, nb);
        sum += pred_job_forward(j, p, loss ? MODE_LOSS : MODE_SCORES); /* both keep the scores */
        for (int b = 0; b < nb; b++) {
            const float *s = j->s + (size_t)b * j->n_ff;
            const uint64_t *y = j->yb + (size_t)b * j->w;
            for (size_t wi = 0; wi < j->w; wi++)
                for (uint64_t bits = y[wi]; bits; bits &= bits - 1)
                    pos[k++] = float_key(s[wi * 64 + (size_t)__builtin_ctzll(bits)]);
        }
    }
    /* need m = ceil(recall * P) positives at or above the threshold: the
     * (P - m)-th smallest score; the tolerance keeps 0.95 * 100 from
     * rounding up to 96 */
    double want = recall * (double)k;
    size_t m = (size_t)ceil(want - 1e-9 * want);
    if (m < 1)
        m = 1;
    if (m > k)
        m = k;
    *thr = key_float(select_kth(pos, k, k - m));
    free(pos);
    if (isnan(*thr))
        return pi2_err_set(err, PI2_ERANGE, "predictor: scores are not finite (weights overflow float)");
    if (loss)
        *loss = sum / ((double)n * (double)j->n_ff);
    return 0;
}

void pred_eval_idx(job *j, pool *p, const pi2_trace *tr, const size_t *idx, size_t n, float thr, counts *c)
{
    memset(c, 0, sizeof *c);
    for (size_t i0 = 0; i0 < n; i0 += (size_t)j->cap) {
        int nb = n - i0 < (size_t)j->cap ? (int)(n - i0) : j->cap;
        pred_job_gather(j, tr, idx + i0, nb);
        pred_job_forward(j, p, MODE_SCORES);
        for (int b = 0; b < nb; b++) {
            const float *s = j->s + (size_t)b * j->n_ff;
            const uint64_t *y = j->yb + (size_t)b * j->w;
            for (int i = 0; i < j->n_ff; i++) {
                bool truth = (y[i >> 6] >> (i & 63)) & 1, pred = s[i] >= thr;
                c->tp += truth && pred;
                c->fp += !truth && pred;
                c->fn += truth && !pred;
            }
        }
    }
    c->total = (uint64_t)n * (uint64_t)j->n_ff;
}

void pred_report_fill(pi2_pred_report *rep, const pi2_predictor *pr, const counts *c, size_t n)
{
    rep->rank = pr->rank;
    rep->threshold = pr->threshold;
    uint64_t pos = c->tp + c->fn, pred = c->tp + c->fp;
    rep->recall = pos ? (double)c->tp / (double)pos : 1.0;
    rep->precision = pred ? (double)c->tp / (double)pred : 1.0;
    rep->pred_active_frac = c->total ? (double)pred / (double)c->total : 0.0;
    rep->true_active_frac = c->total ? (double)pos / (double)c->total : 0.0;
    rep->bytes_f32 = pi2_pred_bytes_f32(pr->d, pr->n_ff, pr->rank);
    rep->bytes_q8 = pi2_pred_bytes_q8(pr->d, pr->n_ff, pr->rank);
    rep->n_eval = n;
}

size_t *pred_iota(size_t n)
{
    size_t *idx = pi2_malloc_array(n, sizeof(size_t));
    if (idx)
        for (size_t i = 0; i < n; i++)
            idx[i] = i;
    return idx;
}

/* Shared front of eval and calibrate: checks, all-sample index, job. */
static int whole_trace_job(const pi2_predictor *pr, const pi2_trace *tr, job *j, size_t **idx, pi2_err *err)
{
    int rc = check_shapes(pr, tr, err);
    if (rc)
        return rc;
    if (tr->n == 0)
        return pi2_err_set(err, PI2_EINVAL, "predictor: the trace is empty");
    *idx = pred_iota(tr->n);
    if (!*idx || pred_job_alloc(j, pr->d, pr->n_ff, pr->rank, EVAL_BATCH, false) != 0) {
        free(*idx);
        *idx = NULL;
        return pi2_err_set(err, PI2_ENOMEM, "predictor: out of memory for evaluation buffers");
    }
    j->fc1 = pr->fc1; /* read only in MODE_SCORES */
    j->fc2 = pr->fc2;
    return 0;
}

int pi2_pred_eval(const pi2_predictor *pr, const pi2_trace *tr, pi2_pred_report *rep, pi2_err *err)
{
    job j;
    size_t *idx;
    int rc = whole_trace_job(pr, tr, &j, &idx, err);
    if (rc)
        return rc;
    blas_guard g = pred_blas_enter();
    pool pl;
    pred_pool_init(&pl, DEFAULT_THREADS);
    counts c;
    pred_eval_idx(&j, &pl, tr, idx, tr->n, pr->threshold, &c);
    pred_pool_destroy(&pl);
    pred_blas_leave(g);
    memset(rep, 0, sizeof *rep);
    pred_report_fill(rep, pr, &c, tr->n);
    pred_job_free(&j);
    free(idx);
    return 0;
}

int pi2_pred_calibrate(pi2_predictor *pr, const pi2_trace *tr, double recall, pi2_err *err)
{
    if (!(recall > 0.0 && recall <= 1.0))
        return pi2_err_set(err, PI2_EINVAL, "predictor: target recall %g must be in (0, 1]", recall);
    job j;
    size_t *idx;
    int rc = whole_trace_job(pr, tr, &j, &idx, err);
    if (rc)
        return rc;
    blas_guard g = pred_blas_enter();
    pool pl;
    pred_pool_init(&pl, DEFAULT_THREADS);
    float thr;
    rc = pred_calibrate_idx(&j, &pl, tr, idx, tr->n, recall, &thr, NULL, err);
    pred_pool_destroy(&pl);
    pred_blas_leave(g);
    if (rc == 0)
        pr->threshold = thr;
    pred_job_free(&j);
    free(idx);
    return rc;
}
