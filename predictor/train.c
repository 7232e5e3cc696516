/* Predictor trainer: traces, minibatch Adam on weighted BCE, calibration.
 *
 * Why the work is cut the way it is: OpenBLAS's own threading splits a GEMM
 * differently for different thread counts, and the rounding follows the
 * split, so weights would depend on the machine. Instead every matmul is cut
 * into fixed blocks (batch rows, neuron columns, rank rows) whose sizes do not
 * depend on the thread count; each block is one single-threaded sgemm call,
 * and our threads take blocks by a static stride. Loss partial sums are kept
 * per block and added in block order. So a seed fixes the result bit for bit.
 */
#include "predictor/train.h"

#include "formats/pool.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROW_BLOCK 64  /* batch rows per task (H, dH) */
#define COL_BLOCK 512 /* neurons per task (scores, fc2 gradient) */
#define RANK_BLOCK 64 /* rank rows per task (fc1 gradient) */
#define EVAL_BATCH 256
#define MAX_THREADS 64
#define DEFAULT_THREADS 2 /* this project's target machines: 2 cores */

static size_t words_for(int n_ff) { return ((size_t)n_ff + 63) / 64; }

/* 64-byte aligned zeroed array of n elements of `size` bytes; NULL on overflow
 * or failure. Alignment keeps the BLAS inputs' layout the same run to run. */
static void *alloc_aligned(size_t n, size_t size)
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

static bool all_finite(const float *v, size_t n, size_t *bad)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(v[i])) {
            *bad = i;
            return false;
        }
    return true;
}

/* ================================ traces ================================ */

struct pi2_trace {
    int d, n_ff;
    size_t w; /* words per sample */
    size_t n, cap;
    float *x;      /* [cap, d] */
    uint64_t *bits; /* [cap, w] */
    uint64_t n_active;
};

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
    if (!all_finite(x, (size_t)t->d, &bad))
        return pi2_err_set(err, PI2_EINVAL, "trace: sample %zu: input x[%zu] is not finite (%g)", t->n, bad,
                           (double)x[bad]);
    return 0;
}

static uint64_t popcount_row(const uint64_t *w, size_t n)
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
    if (!all_finite(act, (size_t)t->n_ff, &bad))
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
    t->n_active += popcount_row(row, t->w);
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
    t->n_active += popcount_row(bits, t->w);
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

/* ============================== predictors ============================== */

struct pi2_predictor {
    int d, n_ff, rank;
    float threshold;
    float *fc1; /* [rank, d] */
    float *fc2; /* [n_ff, rank] */
};

/* Uninitialised weights of the given shape. Caller owns *out. */
static int pred_alloc(pi2_predictor **out, int d, int n_ff, int rank, pi2_err *err)
{
    *out = NULL;
    if (d < 1 || n_ff < 1 || rank < 1 || d > PI2_PRED_MAX_DIM || n_ff > PI2_PRED_MAX_DIM ||
        rank > PI2_PRED_MAX_DIM)
        return pi2_err_set(err, PI2_ERANGE, "predictor: dimensions d=%d n_ff=%d rank=%d must be in [1, %d]", d,
                           n_ff, rank, PI2_PRED_MAX_DIM);
    pi2_predictor *p = calloc(1, sizeof *p);
    if (p) {
        p->fc1 = alloc_aligned((size_t)rank * (size_t)d, sizeof(float));
        p->fc2 = alloc_aligned((size_t)n_ff * (size_t)rank, sizeof(float));
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
    if (!all_finite(fc1, n1, &bad)) {
        pi2_pred_free(p);
        return pi2_err_set(err, PI2_EINVAL, "predictor: fc1[%zu][%zu] is not finite", bad / (size_t)d,
                           bad % (size_t)d);
    }
    if (!all_finite(fc2, n2, &bad)) {
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

/* ============================== thread pool ============================== */

/* Tasks over the compute pool (formats/pool.h): run(fn, ntasks) gives task t
 * to thread t % nthreads (the caller is thread 0) and returns when all tasks
 * are done. Which thread runs a task never changes its result, so a pool
 * that could not be started (pp NULL) runs every task on the caller. */
typedef void (*task_fn)(void *ctx, int task);

typedef struct pool {
    pi2_pool *pp; /* NULL: everything on the caller */
} pool;

typedef struct task_job {
    task_fn fn;
    void *ctx;
    int ntasks;
} task_job;

static void pool_tasks(void *arg, int tid, int nthreads)
{
    task_job *j = arg;
    for (int t = tid; t < j->ntasks; t += nthreads)
        j->fn(j->ctx, t);
}

/* Up to n threads, the caller included; never fails (the results do not
 * depend on the count). */
static void pool_init(pool *p, int n)
{
    p->pp = NULL;
    if (n > 1 && pi2_pool_create(&p->pp, n, NULL) != 0)
        p->pp = NULL;
}

static void pool_run(pool *p, task_fn fn, void *ctx, int ntasks)
{
    task_job j = { fn, ctx, ntasks };
    if (!p || !p->pp) {
        pool_tasks(&j, 0, 1);
        return;
    }
    pi2_pool_run(p->pp, pool_tasks, &j);
}

static void pool_destroy(pool *p)
{
    pi2_pool_free(p->pp);
    p->pp = NULL;
}

/* ============================ batched compute ============================ */

enum { MODE_TRAIN, MODE_LOSS, MODE_SCORES };

/* Everything one minibatch step touches. fc1/fc2 point at the weights being
 * trained (or a predictor's, read-only, in MODE_SCORES/MODE_LOSS). */
typedef struct job {
    int d, n_ff, r;
    size_t w;
    int cap; /* rows the batch buffers hold */
    float *fc1, *fc2;
    float *xb;    /* [cap, d] gathered inputs */
    uint64_t *yb; /* [cap, w] gathered truth */
    float *h;     /* [cap, r] relu(fc1 · x) */
    float *s;     /* [cap, n_ff] scores, then dLoss/dscore */
    int nb;       /* rows in this batch */
    int mode;
    float pw;     /* positive-class weight */
    double *part; /* [col tasks] loss partial sums */
    /* training only */
    float *dh;         /* [cap, r] */
    float *g1, *g2;    /* gradients, shaped as fc1 / fc2 */
    float *m1, *v1, *m2, *v2; /* Adam moments */
    float lr_c1;       /* lr / (1 - beta1^t) */
    float inv_c2;      /* 1 / sqrt(1 - beta2^t) */
    float b1, b2, eps;
    float decay;       /* 1 - lr * weight_decay */
} job;

static void job_free(job *j)
{
    free(j->xb);
    free(j->yb);
    free(j->h);
    free(j->s);
    free(j->part);
    free(j->dh);
    free(j->g1);
    free(j->g2);
    free(j->m1);
    free(j->v1);
    free(j->m2);
    free(j->v2);
}

static int ncol_tasks(int n_ff) { return (n_ff + COL_BLOCK - 1) / COL_BLOCK; }

/* Batch buffers for `cap` rows (plus gradient and Adam state when training). */
static int job_alloc(job *j, int d, int n_ff, int r, int cap, bool train)
{
    memset(j, 0, sizeof *j);
    j->d = d;
    j->n_ff = n_ff;
    j->r = r;
    j->w = words_for(n_ff);
    j->cap = cap;
    j->xb = alloc_aligned((size_t)cap * (size_t)d, sizeof(float));
    j->yb = alloc_aligned((size_t)cap * j->w, sizeof(uint64_t));
    j->h = alloc_aligned((size_t)cap * (size_t)r, sizeof(float));
    j->s = alloc_aligned((size_t)cap * (size_t)n_ff, sizeof(float));
    j->part = calloc((size_t)ncol_tasks(n_ff), sizeof(double));
    bool ok = j->xb && j->yb && j->h && j->s && j->part;
    if (train) {
        size_t n1 = (size_t)r * (size_t)d, n2 = (size_t)n_ff * (size_t)r;
        j->dh = alloc_aligned((size_t)cap * (size_t)r, sizeof(float));
        j->g1 = alloc_aligned(n1, sizeof(float));
        j->m1 = alloc_aligned(n1, sizeof(float));
        j->v1 = alloc_aligned(n1, sizeof(float));
        j->g2 = alloc_aligned(n2, sizeof(float));
        j->m2 = alloc_aligned(n2, sizeof(float));
        j->v2 = alloc_aligned(n2, sizeof(float));
        ok = ok && j->dh && j->g1 && j->m1 && j->v1 && j->g2 && j->m2 && j->v2;
    }
    if (!ok) {
        job_free(j);
        return PI2_ENOMEM;
    }
    return 0;
}

/* Copy samples idx[0..n) of the trace into the batch buffers. */
static void job_gather(job *j, const pi2_trace *tr, const size_t *idx, int n)
{
    for (int b = 0; b < n; b++) {
        memcpy(j->xb + (size_t)b * j->d, pi2_trace_x(tr, idx[b]), (size_t)j->d * sizeof(float));
        memcpy(j->yb + (size_t)b * j->w, pi2_trace_bits(tr, idx[b]), j->w * sizeof(uint64_t));
    }
    j->nb = n;
}

/* h[rows] = relu(xb[rows] · fc1^T)   (rows, r) */
static void task_hidden(void *ctx, int t)
{
    job *j = ctx;
    int r0 = t * ROW_BLOCK, m = j->nb - r0 < ROW_BLOCK ? j->nb - r0 : ROW_BLOCK;
    float *h = j->h + (size_t)r0 * j->r;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, j->r, j->d, 1.0f, j->xb + (size_t)r0 * j->d, j->d,
                j->fc1, j->d, 0.0f, h, j->r);
    for (size_t i = 0; i < (size_t)m * j->r; i++)
        h[i] = h[i] > 0.0f ? h[i] : 0.0f;
}

/* s[:, cols] = h · fc2[cols]^T   (nb, cols); then, unless MODE_SCORES, the
 * weighted BCE of each entry into part[t] and (MODE_TRAIN) its gradient
 * in place of the score:
 *   active:   loss = pw * softplus(-z)   dloss/dz = pw * (sigmoid(z) - 1)
 *   inactive: loss = softplus(z)         dloss/dz = sigmoid(z)
 * The loss is a sum over neurons and a mean over the batch. */
static void task_scores(void *ctx, int t)
{
    job *j = ctx;
    int c0 = t * COL_BLOCK, nc = j->n_ff - c0 < COL_BLOCK ? j->n_ff - c0 : COL_BLOCK;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->nb, nc, j->r, 1.0f, j->h, j->r,
                j->fc2 + (size_t)c0 * j->r, j->r, 0.0f, j->s + c0, j->n_ff);
    if (j->mode == MODE_SCORES)
        return;
    const float pw = j->pw, inv_nb = 1.0f / (float)j->nb;
    const bool train = j->mode == MODE_TRAIN;
    double total = 0;
    for (int b = 0; b < j->nb; b++) {
        float *s = j->s + (size_t)b * j->n_ff;
        const uint64_t *y = j->yb + (size_t)b * j->w;
        /* loss = w * softplus(zc), zc = -z (active, w = pw) or z (inactive):
         * w * max(zc, 0) plus w * log(1 + e), e = exp(-|z|). The log terms are
         * summed as logs of products of 16 factors in (1, 2] per class: two
         * logf per 16 entries instead of one per entry. */
        float lin = 0, lp = 0, ln = 0, pp = 1, pn = 1;
        int k = 0;
        for (int i = c0; i < c0 + nc; i++) {
            float z = s[i];
            float e = expf(-fabsf(z)), q = 1.0f + e;
            float sig = (z >= 0.0f ? 1.0f : e) / q;
            bool pos = (y[i >> 6] >> (i & 63)) & 1;
            float zc = pos ? -z : z, w = pos ? pw : 1.0f;
            lin += w * (zc > 0.0f ? zc : 0.0f);
            pp *= pos ? q : 1.0f;
            pn *= pos ? 1.0f : q;
            if (++k == 16) {
                lp += logf(pp);
                ln += logf(pn);
                pp = pn = 1;
                k = 0;
            }
            if (train)
                s[i] = (pos ? pw * (sig - 1.0f) : sig) * inv_nb;
        }
        total += (double)lin + (double)pw * (lp + logf(pp)) + (double)(ln + logf(pn));
    }
    j->part[t] = total;
}

/* dh[rows] = (g[rows] · fc2) * (h[rows] > 0)   (rows, r) */
static void task_dhidden(void *ctx, int t)
{
    job *j = ctx;
    int r0 = t * ROW_BLOCK, m = j->nb - r0 < ROW_BLOCK ? j->nb - r0 : ROW_BLOCK;
    float *dh = j->dh + (size_t)r0 * j->r;
    const float *h = j->h + (size_t)r0 * j->r;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, j->r, j->n_ff, 1.0f, j->s + (size_t)r0 * j->n_ff,
                j->n_ff, j->fc2, j->r, 0.0f, dh, j->r);
    for (size_t i = 0; i < (size_t)m * j->r; i++)
        if (h[i] <= 0.0f)
            dh[i] = 0.0f;
}

/* AdamW (PyTorch's form: decoupled weight decay) on n parameters. */
static void adam(const job *j, float *p, const float *g, float *m, float *v, size_t n)
{
    const float b1 = j->b1, b2 = j->b2, eps = j->eps, lr_c1 = j->lr_c1, inv_c2 = j->inv_c2, decay = j->decay;
    for (size_t i = 0; i < n; i++) {
        float gi = g[i];
        float mi = b1 * m[i] + (1.0f - b1) * gi;
        float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * decay - lr_c1 * mi / (sqrtf(vi) * inv_c2 + eps);
    }
}

/* Tasks [0, ncol): fc2 rows of one column block: g2 = g^T · h, Adam.
 * Tasks [ncol, ncol + nrank): fc1 rows of one rank block: g1 = dh^T · xb, Adam. */
static void task_update(void *ctx, int t)
{
    job *j = ctx;
    int ncol = ncol_tasks(j->n_ff);
    if (t < ncol) {
        int c0 = t * COL_BLOCK, nc = j->n_ff - c0 < COL_BLOCK ? j->n_ff - c0 : COL_BLOCK;
        size_t off = (size_t)c0 * j->r;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nc, j->r, j->nb, 1.0f, j->s + c0, j->n_ff, j->h, j->r,
                    0.0f, j->g2 + off, j->r);
        adam(j, j->fc2 + off, j->g2 + off, j->m2 + off, j->v2 + off, (size_t)nc * j->r);
    } else {
        int k0 = (t - ncol) * RANK_BLOCK, nk = j->r - k0 < RANK_BLOCK ? j->r - k0 : RANK_BLOCK;
        size_t off = (size_t)k0 * j->d;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, j->d, j->nb, 1.0f, j->dh + k0, j->r, j->xb, j->d,
                    0.0f, j->g1 + off, j->d);
        adam(j, j->fc1 + off, j->g1 + off, j->m1 + off, j->v1 + off, (size_t)nk * j->d);
    }
}

static int nrow_tasks(int nb) { return (nb + ROW_BLOCK - 1) / ROW_BLOCK; }

/* Forward the gathered batch; returns the summed loss (0 in MODE_SCORES). */
static double job_forward(job *j, pool *p, int mode)
{
    j->mode = mode;
    pool_run(p, task_hidden, j, nrow_tasks(j->nb));
    pool_run(p, task_scores, j, ncol_tasks(j->n_ff));
    double loss = 0;
    if (mode != MODE_SCORES)
        for (int t = 0; t < ncol_tasks(j->n_ff); t++)
            loss += j->part[t];
    return loss;
}

/* One Adam step on the gathered batch; returns its summed loss. */
static double job_step(job *j, pool *p)
{
    double loss = job_forward(j, p, MODE_TRAIN);
    pool_run(p, task_dhidden, j, nrow_tasks(j->nb));
    pool_run(p, task_update, j, ncol_tasks(j->n_ff) + (j->r + RANK_BLOCK - 1) / RANK_BLOCK);
    return loss;
}

/* The OpenBLAS thread count is process state: force 1 while we run. */
typedef struct blas_guard {
    int saved;
} blas_guard;

static blas_guard blas_enter(void)
{
    blas_guard g = {openblas_get_num_threads()};
    if (g.saved != 1)
        openblas_set_num_threads(1);
    return g;
}

static void blas_leave(blas_guard g)
{
    if (g.saved != 1)
        openblas_set_num_threads(g.saved);
}

/* ======================= calibration and evaluation ======================= */

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
static int calibrate_idx(job *j, pool *p, const pi2_trace *tr, const size_t *idx, size_t n, double recall,
                         float *thr, double *loss, pi2_err *err)
{
    uint64_t npos = 0;
    for (size_t i = 0; i < n; i++)
        npos += popcount_row(pi2_trace_bits(tr, idx[i]), tr->w);
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
        job_gather(j, tr, idx + i0, nb);
        sum += job_forward(j, p, loss ? MODE_LOSS : MODE_SCORES); /* both keep the scores */
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

typedef struct counts {
    uint64_t tp, fp, fn, total;
} counts;

static void eval_idx(job *j, pool *p, const pi2_trace *tr, const size_t *idx, size_t n, float thr, counts *c)
{
    memset(c, 0, sizeof *c);
    for (size_t i0 = 0; i0 < n; i0 += (size_t)j->cap) {
        int nb = n - i0 < (size_t)j->cap ? (int)(n - i0) : j->cap;
        job_gather(j, tr, idx + i0, nb);
        job_forward(j, p, MODE_SCORES);
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

static void report_fill(pi2_pred_report *rep, const pi2_predictor *pr, const counts *c, size_t n)
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

static size_t *iota(size_t n)
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
    *idx = iota(tr->n);
    if (!*idx || job_alloc(j, pr->d, pr->n_ff, pr->rank, EVAL_BATCH, false) != 0) {
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
    blas_guard g = blas_enter();
    pool pl;
    pool_init(&pl, DEFAULT_THREADS);
    counts c;
    eval_idx(&j, &pl, tr, idx, tr->n, pr->threshold, &c);
    pool_destroy(&pl);
    blas_leave(g);
    memset(rep, 0, sizeof *rep);
    report_fill(rep, pr, &c, tr->n);
    job_free(&j);
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
    blas_guard g = blas_enter();
    pool pl;
    pool_init(&pl, DEFAULT_THREADS);
    float thr;
    rc = calibrate_idx(&j, &pl, tr, idx, tr->n, recall, &thr, NULL, err);
    pool_destroy(&pl);
    blas_leave(g);
    if (rc == 0)
        pr->threshold = thr;
    job_free(&j);
    free(idx);
    return rc;
}

/* ================================ training ================================ */

void pi2_pred_train_defaults(pi2_pred_train_opts *o)
{
    memset(o, 0, sizeof *o);
    o->rank = 0;
    o->rank_min = 64;
    o->rank_max = 1024;
    o->epochs = 10;
    o->batch = 256;
    o->lr = 5e-3;
    o->beta1 = 0.9;
    o->beta2 = 0.999;
    o->eps = 1e-8;
    o->weight_decay = 0;
    o->pos_weight = 0;
    o->pos_weight_max = 100;
    o->holdout = 0.2;
    o->target_recall = 0.99;
    o->stop_metric = PI2_PRED_STOP_COST;
    o->patience = 2;
    o->min_delta = 1e-3;
    o->restore_best = true;
    o->threads = 0;
    o->seed = 1;
    o->verbose = false;
}

static int check_opts(const pi2_pred_train_opts *o, pi2_err *err)
{
#define BAD(...) pi2_err_set(err, PI2_EINVAL, __VA_ARGS__)
    if (o->rank < 0 || o->rank > PI2_PRED_MAX_DIM)
        return BAD("predictor: rank %d must be 0 (auto) or in [1, %d]", o->rank, PI2_PRED_MAX_DIM);
    if (o->rank == 0 && (o->rank_min < 1 || o->rank_min > o->rank_max || o->rank_max > PI2_PRED_MAX_DIM))
        return BAD("predictor: rank bounds [%d, %d] must satisfy 1 <= min <= max <= %d", o->rank_min, o->rank_max,
                   PI2_PRED_MAX_DIM);
    if (o->epochs < 1)
        return BAD("predictor: epochs %d must be >= 1", o->epochs);
    if (o->batch < 1 || o->batch > 65536)
        return BAD("predictor: batch %d must be in [1, 65536]", o->batch);
    if (!(o->lr > 0) || !isfinite(o->lr))
        return BAD("predictor: learning rate %g must be a finite number > 0", o->lr);
    if (!(o->beta1 >= 0 && o->beta1 < 1) || !(o->beta2 >= 0 && o->beta2 < 1))
        return BAD("predictor: Adam betas %g, %g must be in [0, 1)", o->beta1, o->beta2);
    if (!(o->eps > 0) || !isfinite(o->eps))
        return BAD("predictor: Adam eps %g must be a finite number > 0", o->eps);
    if (!(o->weight_decay >= 0 && o->lr * o->weight_decay < 1))
        return BAD("predictor: weight decay %g must be >= 0 with lr * decay < 1", o->weight_decay);
    if (!(o->pos_weight >= 0) || !isfinite(o->pos_weight))
        return BAD("predictor: positive-class weight %g must be 0 (auto) or a finite number > 0", o->pos_weight);
    if (o->pos_weight == 0 && (!(o->pos_weight_max >= 1) || !isfinite(o->pos_weight_max)))
        return BAD("predictor: positive-class weight cap %g must be a finite number >= 1", o->pos_weight_max);
    if (!(o->holdout > 0 && o->holdout < 1))
        return BAD("predictor: held-out fraction %g must be in (0, 1)", o->holdout);
    if (!(o->target_recall > 0 && o->target_recall <= 1))
        return BAD("predictor: target recall %g must be in (0, 1]", o->target_recall);
    if (o->stop_metric != PI2_PRED_STOP_COST && o->stop_metric != PI2_PRED_STOP_LOSS)
        return BAD("predictor: unknown stop metric %d", (int)o->stop_metric);
    if (o->patience < 0)
        return BAD("predictor: patience %d must be >= 0", o->patience);
    if (!(o->min_delta >= 0 && o->min_delta < 1))
        return BAD("predictor: min_delta %g must be in [0, 1)", o->min_delta);
    if (o->threads < 0 || o->threads > MAX_THREADS)
        return BAD("predictor: threads %d must be in [0, %d]", o->threads, MAX_THREADS);
    return 0;
#undef BAD
}

static void shuffle(size_t *v, size_t n, pi2_rng *rng)
{
    for (size_t i = n; i > 1; i--) {
        size_t k = (size_t)(pi2_rng_u64(rng) % i);
        size_t t = v[i - 1];
        v[i - 1] = v[k];
        v[k] = t;
    }
}

/* v[0..n) = scale * N(0, 1) draws (Box-Muller using both outputs). */
static void fill_normal(float *v, size_t n, double scale, pi2_rng *rng)
{
    for (size_t i = 0; i < n; i += 2) {
        double u1 = pi2_rng_uniform(rng), u2 = pi2_rng_uniform(rng);
        if (u1 < 1e-300)
            u1 = 1e-300;
        double rad = scale * sqrt(-2.0 * log(u1)), th = 6.283185307179586 * u2;
        v[i] = (float)(rad * cos(th));
        if (i + 1 < n)
            v[i + 1] = (float)(rad * sin(th));
    }
}

/* Mean loss per entry over samples idx[0..n) (j's weights, MODE_LOSS). */
static double heldout_loss(job *j, pool *p, const pi2_trace *tr, const size_t *idx, size_t n)
{
    double sum = 0;
    for (size_t i0 = 0; i0 < n; i0 += (size_t)j->cap) {
        int nb = n - i0 < (size_t)j->cap ? (int)(n - i0) : j->cap;
        job_gather(j, tr, idx + i0, nb);
        sum += job_forward(j, p, MODE_LOSS);
    }
    return sum / ((double)n * (double)j->n_ff);
}

/* Held-out figures of one epoch's weights (thr/cnt with the cost metric). */
typedef struct epoch_result {
    int epoch;
    double loss;
    float thr;
    counts cnt;
} epoch_result;

/* State of one pi2_pred_train call, freed in one place. */
typedef struct train_ctx {
    size_t *perm;
    pi2_predictor *pred;
    float *best1, *best2;
    job j;
    bool job_ok;
    pool pl;
    bool pool_ok;
} train_ctx;

static void train_ctx_free(train_ctx *c)
{
    if (c->pool_ok)
        pool_destroy(&c->pl);
    if (c->job_ok)
        job_free(&c->j);
    free(c->perm);
    free(c->best1);
    free(c->best2);
    pi2_pred_free(c->pred);
}

int pi2_pred_train(const pi2_trace *tr, const pi2_pred_train_opts *o, pi2_predictor **out, pi2_pred_report *rep,
                   pi2_err *err)
{
    *out = NULL;
    double t_start = pi2_now();
    int rc = check_opts(o, err);
    if (rc)
        return rc;
    size_t n = tr->n;
    if (n < 2)
        return pi2_err_set(err, PI2_EINVAL, "predictor: the trace has %zu sample%s; need at least 2 (train + held out)",
                           n, n == 1 ? "" : "s");
    const int d = tr->d, n_ff = tr->n_ff;

    /* deterministic split: a seeded permutation, the first n_hold held out */
    train_ctx c;
    memset(&c, 0, sizeof c);
    c.perm = iota(n);
    if (!c.perm)
        return pi2_err_set(err, PI2_ENOMEM, "predictor: out of memory for %zu sample indices", n);
    pi2_rng rng;
    pi2_rng_seed(&rng, o->seed);
    shuffle(c.perm, n, &rng);
    size_t n_hold = (size_t)floor(o->holdout * (double)n + 0.5);
    if (n_hold < 1)
        n_hold = 1;
    if (n_hold > n - 1)
        n_hold = n - 1;
    size_t n_train = n - n_hold;
    size_t *hold = c.perm, *train = c.perm + n_hold;

    /* class balance and input scale of the training split */
    uint64_t act = 0;
    double sq = 0;
    for (size_t i = 0; i < n_train; i++) {
        act += popcount_row(pi2_trace_bits(tr, train[i]), tr->w);
        const float *x = pi2_trace_x(tr, train[i]);
        for (int k = 0; k < d; k++)
            sq += (double)x[k] * x[k];
    }
    uint64_t act_hold = 0;
    for (size_t i = 0; i < n_hold; i++)
        act_hold += popcount_row(pi2_trace_bits(tr, hold[i]), tr->w);
    if (act_hold == 0) {
        train_ctx_free(&c);
        return pi2_err_set(err, PI2_EINVAL,
                           "predictor: no active neuron in the %zu held-out samples: nothing to calibrate against",
                           n_hold);
    }
    double f = (double)act / ((double)n_train * (double)n_ff);
    double rms = sqrt(sq / ((double)n_train * (double)d));
    if (!(rms > 0))
        rms = 1;
    double pw = o->pos_weight;
    if (pw == 0) {
        pw = f > 0 ? (1 - f) / f : o->pos_weight_max;
        if (pw < 1)
            pw = 1;
        if (pw > o->pos_weight_max)
            pw = o->pos_weight_max;
    }
    int r = o->rank ? o->rank : pi2_pred_choose_rank(d, n_ff, f, o->rank_min, o->rank_max);

    /* weights: Kaiming-normal fc1 scaled by the input RMS (so h has unit
     * second moment whatever the norm's gain), fc2 ~ N(0, 1/r) (unit-variance
     * scores at the start) */
    if ((rc = pred_alloc(&c.pred, d, n_ff, r, err))) {
        train_ctx_free(&c);
        return rc;
    }
    pi2_predictor *pr = c.pred;
    fill_normal(pr->fc1, (size_t)r * d, sqrt(2.0 / d) / rms, &rng);
    fill_normal(pr->fc2, (size_t)n_ff * r, sqrt(1.0 / r), &rng);

    int cap = o->batch < EVAL_BATCH ? EVAL_BATCH : o->batch;
    if (job_alloc(&c.j, d, n_ff, r, cap, true) != 0) {
        train_ctx_free(&c);
        return pi2_err_set(err, PI2_ENOMEM, "predictor: out of memory for training state (rank %d, d %d, n_ff %d)",
                           r, d, n_ff);
    }
    c.job_ok = true;
    if (o->restore_best) {
        c.best1 = pi2_malloc_array((size_t)r * d, sizeof(float));
        c.best2 = pi2_malloc_array((size_t)n_ff * r, sizeof(float));
        if (!c.best1 || !c.best2) {
            train_ctx_free(&c);
            return pi2_err_set(err, PI2_ENOMEM, "predictor: out of memory for a copy of the best weights");
        }
    }
    job *j = &c.j;
    j->fc1 = pr->fc1;
    j->fc2 = pr->fc2;
    j->pw = (float)pw;
    j->b1 = (float)o->beta1;
    j->b2 = (float)o->beta2;
    j->eps = (float)o->eps;
    j->decay = (float)(1 - o->lr * o->weight_decay);
    pool_init(&c.pl, o->threads ? o->threads : DEFAULT_THREADS);
    c.pool_ok = true;
    blas_guard g = blas_enter();

    double best = INFINITY, train_loss = 0, hl = 0;
    epoch_result kept = {0}, last = {0};
    int bad = 0, epoch = 0;
    bool stopped = false;
    double c1 = 1, c2 = 1; /* beta1^t, beta2^t */
    for (epoch = 1; epoch <= o->epochs; epoch++) {
        shuffle(train, n_train, &rng);
        double sum = 0;
        for (size_t i0 = 0; i0 < n_train; i0 += (size_t)o->batch) {
            int nb = n_train - i0 < (size_t)o->batch ? (int)(n_train - i0) : o->batch;
            c1 *= o->beta1;
            c2 *= o->beta2;
            j->lr_c1 = (float)(o->lr / (1 - c1));
            j->inv_c2 = (float)(1 / sqrt(1 - c2));
            job_gather(j, tr, train + i0, nb);
            sum += job_step(j, &c.pl);
        }
        train_loss = sum / ((double)n_train * (double)n_ff);
        if (!isfinite(train_loss)) {
            blas_leave(g);
            train_ctx_free(&c);
            return pi2_err_set(err, PI2_ERANGE,
                               "predictor: training diverged at epoch %d (loss %g); lower the learning rate", epoch,
                               train_loss);
        }
        /* held-out: loss, and with the cost metric the predicted-active
         * fraction at the target recall (calibrate + count: two passes) */
        double cost = -1;
        float thr = 0;
        pi2_err cerr = {0};
        if (o->stop_metric == PI2_PRED_STOP_COST)
            rc = calibrate_idx(j, &c.pl, tr, hold, n_hold, o->target_recall, &thr, &hl, &cerr);
        else
            hl = heldout_loss(j, &c.pl, tr, hold, n_hold);
        if ((rc == 0 && !isfinite(hl)) || rc == PI2_ERANGE)
            rc = pi2_err_set(err, PI2_ERANGE, "predictor: training diverged at epoch %d (held-out scores are not "
                             "finite); lower the learning rate", epoch);
        else if (rc)
            pi2_err_set(err, rc, "%s", cerr.msg);
        if (rc) {
            blas_leave(g);
            train_ctx_free(&c);
            return rc;
        }
        counts cn = {0};
        if (o->stop_metric == PI2_PRED_STOP_COST) {
            eval_idx(j, &c.pl, tr, hold, n_hold, thr, &cn);
            cost = (double)(cn.tp + cn.fp) / (double)cn.total;
        }
        double metric = o->stop_metric == PI2_PRED_STOP_COST ? cost : hl;
        if (o->verbose) {
            char extra[64] = "";
            if (cost >= 0)
                snprintf(extra, sizeof extra, "  predicted active %.4f", cost);
            fprintf(stderr, "predictor: epoch %d/%d  train loss %.5f  held-out loss %.5f%s  (%.1f s)\n", epoch,
                    o->epochs, train_loss, hl, extra, pi2_now() - t_start);
        }
        last = (epoch_result){epoch, hl, thr, cn};
        bool progress = metric < best * (1 - o->min_delta) || kept.epoch == 0;
        if (metric < best || kept.epoch == 0) { /* a small gain is the new best, but not progress */
            best = metric;
            kept = last;
            if (o->restore_best) {
                memcpy(c.best1, pr->fc1, (size_t)r * d * sizeof(float));
                memcpy(c.best2, pr->fc2, (size_t)n_ff * r * sizeof(float));
            }
        }
        bad = progress ? 0 : bad + 1;
        if (o->patience > 0 && bad >= o->patience) {
            stopped = true;
            break;
        }
    }
    int epochs_run = stopped ? epoch : o->epochs;
    if (!o->restore_best)
        kept = last;
    else if (kept.epoch != last.epoch) {
        memcpy(pr->fc1, c.best1, (size_t)r * d * sizeof(float));
        memcpy(pr->fc2, c.best2, (size_t)n_ff * r * sizeof(float));
    }
    if (o->stop_metric != PI2_PRED_STOP_COST) {
        /* the loss metric did not calibrate along the way */
        rc = calibrate_idx(j, &c.pl, tr, hold, n_hold, o->target_recall, &kept.thr, NULL, err);
        if (rc == 0)
            eval_idx(j, &c.pl, tr, hold, n_hold, kept.thr, &kept.cnt);
    }
    blas_leave(g);
    if (rc) {
        train_ctx_free(&c);
        return rc;
    }
    pr->threshold = kept.thr;
    if (rep) {
        memset(rep, 0, sizeof *rep);
        report_fill(rep, pr, &kept.cnt, n_hold);
        rep->n_train = n_train;
        rep->epochs = epochs_run;
        rep->early_stopped = stopped;
        rep->best_epoch = kept.epoch;
        rep->pos_weight = pw;
        rep->train_loss = train_loss;
        rep->heldout_loss = kept.loss;
        rep->seconds = pi2_now() - t_start;
    }
    c.pred = NULL; /* handed to the caller */
    train_ctx_free(&c);
    *out = pr;
    return 0;
}
