/* The trainer's batched compute: a minibatch forward, backward and AdamW
 * step over the task pool.
 *
 * Why the work is cut the way it is: OpenBLAS's own threading splits a GEMM
 * differently for different thread counts, and the rounding follows the
 * split, so weights would depend on the machine. Instead every matmul is cut
 * into fixed blocks (batch rows, neuron columns, rank rows) whose sizes do not
 * depend on the thread count; each block is one single-threaded sgemm call,
 * and our threads take blocks by a static stride. Loss partial sums are kept
 * per block and added in block order. So a seed fixes the result bit for bit.
 */
#include "predictor/internal.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ============================== thread pool ============================== */

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
void pred_pool_init(pool *p, int n)
{
    p->pp = NULL;
    if (n > 1 && pi2_pool_create(&p->pp, n, NULL) != 0)
        p->pp = NULL;
}

static void pred_pool_run(pool *p, task_fn fn, void *ctx, int ntasks)
{
    task_job j = { fn, ctx, ntasks };
    if (!p || !p->pp) {
        pool_tasks(&j, 0, 1);
        return;
    }
    pi2_pool_run(p->pp, pool_tasks, &j);
}

void pred_pool_destroy(pool *p)
{
    pi2_pool_free(p->pp);
    p->pp = NULL;
}

/* ============================ batched compute ============================ */

void pred_job_free(job *j)
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
int pred_job_alloc(job *j, int d, int n_ff, int r, int cap, bool train)
{
    memset(j, 0, sizeof *j);
    j->d = d;
    j->n_ff = n_ff;
    j->r = r;
    j->w = words_for(n_ff);
    j->cap = cap;
    j->xb = pred_alloc_aligned((size_t)cap * (size_t)d, sizeof(float));
    j->yb = pred_alloc_aligned((size_t)cap * j->w, sizeof(uint64_t));
    j->h = pred_alloc_aligned((size_t)cap * (size_t)r, sizeof(float));
    j->s = pred_alloc_aligned((size_t)cap * (size_t)n_ff, sizeof(float));
    j->part = calloc((size_t)ncol_tasks(n_ff), sizeof(double));
    bool ok = j->xb && j->yb && j->h && j->s && j->part;
    if (train) {
        size_t n1 = (size_t)r * (size_t)d, n2 = (size_t)n_ff * (size_t)r;
        j->dh = pred_alloc_aligned((size_t)cap * (size_t)r, sizeof(float));
        j->g1 = pred_alloc_aligned(n1, sizeof(float));
        j->m1 = pred_alloc_aligned(n1, sizeof(float));
        j->v1 = pred_alloc_aligned(n1, sizeof(float));
        j->g2 = pred_alloc_aligned(n2, sizeof(float));
        j->m2 = pred_alloc_aligned(n2, sizeof(float));
        j->v2 = pred_alloc_aligned(n2, sizeof(float));
        ok = ok && j->dh && j->g1 && j->m1 && j->v1 && j->g2 && j->m2 && j->v2;
    }
    if (!ok) {
        pred_job_free(j);
        return PI2_ENOMEM;
    }
    return 0;
}

/* Copy samples idx[0..n) of the trace into the batch buffers. */
void pred_job_gather(job *j, const pi2_trace *tr, const size_t *idx, int n)
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
double pred_job_forward(job *j, pool *p, int mode)
{
    j->mode = mode;
    pred_pool_run(p, task_hidden, j, nrow_tasks(j->nb));
    pred_pool_run(p, task_scores, j, ncol_tasks(j->n_ff));
    double loss = 0;
    if (mode != MODE_SCORES)
        for (int t = 0; t < ncol_tasks(j->n_ff); t++)
            loss += j->part[t];
    return loss;
}

/* One Adam step on the gathered batch; returns its summed loss. */
double pred_job_step(job *j, pool *p)
{
    double loss = pred_job_forward(j, p, MODE_TRAIN);
    pred_pool_run(p, task_dhidden, j, nrow_tasks(j->nb));
    pred_pool_run(p, task_update, j, ncol_tasks(j->n_ff) + (j->r + RANK_BLOCK - 1) / RANK_BLOCK);
    return loss;
}

blas_guard pred_blas_enter(void)
{
    blas_guard g = {openblas_get_num_threads()};
    if (g.saved != 1)
        openblas_set_num_threads(1);
    return g;
}

void pred_blas_leave(blas_guard g)
{
    if (g.saved != 1)
        openblas_set_num_threads(g.saved);
}
