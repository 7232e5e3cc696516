/* The trainer's private interface (predictor/train.h is the contract):
 * the trace and predictor structs, the task pool over formats/pool.h, the
 * batched compute of batch.c and the shared helpers. Private to the
 * predictor/ sources. */
#ifndef PI2_PREDICTOR_INTERNAL_H
#define PI2_PREDICTOR_INTERNAL_H

#include "predictor/train.h"

#include "formats/pool.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ROW_BLOCK 64  /* batch rows per task (H, dH) */
#define COL_BLOCK 512 /* neurons per task (scores, fc2 gradient) */
#define RANK_BLOCK 64 /* rank rows per task (fc1 gradient) */
#define EVAL_BATCH 256
#define MAX_THREADS 64
#define DEFAULT_THREADS 2 /* this project's target machines: 2 cores */

static inline size_t words_for(int n_ff) { return ((size_t)n_ff + 63) / 64; }

struct pi2_trace {
    int d, n_ff;
    size_t w; /* words per sample */
    size_t n, cap;
    float *x;      /* [cap, d] */
    uint64_t *bits; /* [cap, w] */
    uint64_t n_active;
};

struct pi2_predictor {
    int d, n_ff, rank;
    float threshold;
    float *fc1; /* [rank, d] */
    float *fc2; /* [n_ff, rank] */
};

/* Tasks over the compute pool (formats/pool.h): run(fn, ntasks) gives task t
 * to thread t % nthreads (the caller is thread 0) and returns when all tasks
 * are done. Which thread runs a task never changes its result, so a pool
 * that could not be started (pp NULL) runs every task on the caller. */
typedef void (*task_fn)(void *ctx, int task);

typedef struct pool {
    pi2_pool *pp; /* NULL: everything on the caller */
} pool;

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

/* The OpenBLAS thread count is process state: force 1 while we run. */
typedef struct blas_guard {
    int saved;
} blas_guard;

typedef struct counts {
    uint64_t tp, fp, fn, total;
} counts;

/* train.c */
void *pred_alloc_aligned(size_t n, size_t size);
bool pred_all_finite(const float *v, size_t n, size_t *bad);

/* trace.c */
uint64_t pred_popcount_row(const uint64_t *w, size_t n);

/* predictor.c */
int pred_alloc(pi2_predictor **out, int d, int n_ff, int rank, pi2_err *err);

/* batch.c */
void pred_pool_init(pool *p, int n);
void pred_pool_destroy(pool *p);
void pred_job_free(job *j);
int pred_job_alloc(job *j, int d, int n_ff, int r, int cap, bool train);
void pred_job_gather(job *j, const pi2_trace *tr, const size_t *idx, int n);
double pred_job_forward(job *j, pool *p, int mode);
double pred_job_step(job *j, pool *p);
blas_guard pred_blas_enter(void);
void pred_blas_leave(blas_guard g);

/* calibrate.c */
int pred_calibrate_idx(job *j, pool *p, const pi2_trace *tr, const size_t *idx, size_t n, double recall,
                       float *thr, double *loss, pi2_err *err);
void pred_eval_idx(job *j, pool *p, const pi2_trace *tr, const size_t *idx, size_t n, float thr, counts *c);
void pred_report_fill(pi2_pred_report *rep, const pi2_predictor *pr, const counts *c, size_t n);
size_t *pred_iota(size_t n);

#endif
