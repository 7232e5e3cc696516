/* Predictor trainer: minibatch Adam on weighted BCE, early stopping on a
 * held-out split, calibration (the batched compute is in batch.c). */
#include "predictor/internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
        pred_job_gather(j, tr, idx + i0, nb);
        sum += pred_job_forward(j, p, MODE_LOSS);
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
    /* the split: perm = hold[n_hold] then train[n_train] */
    size_t *hold, *train;
    size_t n_hold, n_train;
    double f;   /* active fraction of the training split */
    double rms; /* input RMS of the training split */
    double pw;  /* positive-class weight */
    pi2_rng rng;
} train_ctx;

static void train_ctx_free(train_ctx *c)
{
    if (c->pool_ok)
        pred_pool_destroy(&c->pl);
    if (c->job_ok)
        pred_job_free(&c->j);
    free(c->perm);
    free(c->best1);
    free(c->best2);
    pi2_pred_free(c->pred);
}

/* The deterministic split (a seeded permutation, the first n_hold held out),
 * the training split's class balance and input scale, the class weight. */
static int train_split(train_ctx *c, const pi2_trace *tr, const pi2_pred_train_opts *o, pi2_err *err)
{
    size_t n = tr->n;
    const int d = tr->d, n_ff = tr->n_ff;
    c->perm = pred_iota(n);
    if (!c->perm)
        return pi2_err_set(err, PI2_ENOMEM, "predictor: out of memory for %zu sample indices", n);
    pi2_rng_seed(&c->rng, o->seed);
    shuffle(c->perm, n, &c->rng);
    size_t n_hold = (size_t)floor(o->holdout * (double)n + 0.5);
    if (n_hold < 1)
        n_hold = 1;
    if (n_hold > n - 1)
        n_hold = n - 1;
    size_t n_train = n - n_hold;
    c->n_hold = n_hold;
    c->n_train = n_train;
    c->hold = c->perm;
    c->train = c->perm + n_hold;

    uint64_t act = 0;
    double sq = 0;
    for (size_t i = 0; i < n_train; i++) {
        act += pred_popcount_row(pi2_trace_bits(tr, c->train[i]), tr->w);
        const float *x = pi2_trace_x(tr, c->train[i]);
        for (int k = 0; k < d; k++)
            sq += (double)x[k] * x[k];
    }
    uint64_t act_hold = 0;
    for (size_t i = 0; i < n_hold; i++)
        act_hold += pred_popcount_row(pi2_trace_bits(tr, c->hold[i]), tr->w);
    if (act_hold == 0)
        return pi2_err_set(err, PI2_EINVAL,
                           "predictor: no active neuron in the %zu held-out samples: nothing to calibrate against",
                           n_hold);
    c->f = (double)act / ((double)n_train * (double)n_ff);
    c->rms = sqrt(sq / ((double)n_train * (double)d));
    if (!(c->rms > 0))
        c->rms = 1;
    c->pw = o->pos_weight;
    if (c->pw == 0) {
        c->pw = c->f > 0 ? (1 - c->f) / c->f : o->pos_weight_max;
        if (c->pw < 1)
            c->pw = 1;
        if (c->pw > o->pos_weight_max)
            c->pw = o->pos_weight_max;
    }
    return 0;
}

/* The predictor of rank r with its starting weights, the training job, the
 * copy of the best weights and the pool. */
static int train_setup(train_ctx *c, const pi2_trace *tr, const pi2_pred_train_opts *o, int r, pi2_err *err)
{
    const int d = tr->d, n_ff = tr->n_ff;
    /* weights: Kaiming-normal fc1 scaled by the input RMS (so h has unit
     * second moment whatever the norm's gain), fc2 ~ N(0, 1/r) (unit-variance
     * scores at the start) */
    int rc = pred_alloc(&c->pred, d, n_ff, r, err);
    if (rc)
        return rc;
    pi2_predictor *pr = c->pred;
    fill_normal(pr->fc1, (size_t)r * d, sqrt(2.0 / d) / c->rms, &c->rng);
    fill_normal(pr->fc2, (size_t)n_ff * r, sqrt(1.0 / r), &c->rng);

    int cap = o->batch < EVAL_BATCH ? EVAL_BATCH : o->batch;
    if (pred_job_alloc(&c->j, d, n_ff, r, cap, true) != 0)
        return pi2_err_set(err, PI2_ENOMEM, "predictor: out of memory for training state (rank %d, d %d, n_ff %d)",
                           r, d, n_ff);
    c->job_ok = true;
    if (o->restore_best) {
        c->best1 = pi2_malloc_array((size_t)r * d, sizeof(float));
        c->best2 = pi2_malloc_array((size_t)n_ff * r, sizeof(float));
        if (!c->best1 || !c->best2)
            return pi2_err_set(err, PI2_ENOMEM, "predictor: out of memory for a copy of the best weights");
    }
    job *j = &c->j;
    j->fc1 = pr->fc1;
    j->fc2 = pr->fc2;
    j->pw = (float)c->pw;
    j->b1 = (float)o->beta1;
    j->b2 = (float)o->beta2;
    j->eps = (float)o->eps;
    j->decay = (float)(1 - o->lr * o->weight_decay);
    pred_pool_init(&c->pl, o->threads ? o->threads : DEFAULT_THREADS);
    c->pool_ok = true;
    return 0;
}

/* One epoch of minibatch steps over the shuffled training split; *loss
 * gets the mean loss per entry. *c1, *c2: beta1^t, beta2^t. */
static int train_epoch(train_ctx *c, const pi2_trace *tr, const pi2_pred_train_opts *o, int epoch, double *c1,
                       double *c2, double *loss, pi2_err *err)
{
    job *j = &c->j;
    shuffle(c->train, c->n_train, &c->rng);
    double sum = 0;
    for (size_t i0 = 0; i0 < c->n_train; i0 += (size_t)o->batch) {
        int nb = c->n_train - i0 < (size_t)o->batch ? (int)(c->n_train - i0) : o->batch;
        *c1 *= o->beta1;
        *c2 *= o->beta2;
        j->lr_c1 = (float)(o->lr / (1 - *c1));
        j->inv_c2 = (float)(1 / sqrt(1 - *c2));
        pred_job_gather(j, tr, c->train + i0, nb);
        sum += pred_job_step(j, &c->pl);
    }
    *loss = sum / ((double)c->n_train * (double)tr->n_ff);
    if (!isfinite(*loss))
        return pi2_err_set(err, PI2_ERANGE,
                           "predictor: training diverged at epoch %d (loss %g); lower the learning rate", epoch,
                           *loss);
    return 0;
}

/* The held-out figures of the current weights: loss, and with the cost
 * metric the predicted-active fraction at the target recall (calibrate +
 * count: two passes) into *metric (the loss with the loss metric). */
static int train_heldout(train_ctx *c, const pi2_trace *tr, const pi2_pred_train_opts *o, int epoch,
                         epoch_result *res, double *cost, double *metric, pi2_err *err)
{
    job *j = &c->j;
    double hl = 0;
    float thr = 0;
    pi2_err cerr = {0};
    int rc = 0;
    *cost = -1;
    if (o->stop_metric == PI2_PRED_STOP_COST)
        rc = pred_calibrate_idx(j, &c->pl, tr, c->hold, c->n_hold, o->target_recall, &thr, &hl, &cerr);
    else
        hl = heldout_loss(j, &c->pl, tr, c->hold, c->n_hold);
    if ((rc == 0 && !isfinite(hl)) || rc == PI2_ERANGE)
        rc = pi2_err_set(err, PI2_ERANGE, "predictor: training diverged at epoch %d (held-out scores are not "
                         "finite); lower the learning rate", epoch);
    else if (rc)
        pi2_err_set(err, rc, "%s", cerr.msg);
    if (rc)
        return rc;
    counts cn = {0};
    if (o->stop_metric == PI2_PRED_STOP_COST) {
        pred_eval_idx(j, &c->pl, tr, c->hold, c->n_hold, thr, &cn);
        *cost = (double)(cn.tp + cn.fp) / (double)cn.total;
    }
    *metric = o->stop_metric == PI2_PRED_STOP_COST ? *cost : hl;
    *res = (epoch_result){epoch, hl, thr, cn};
    return 0;
}

/* The epochs, with early stopping on the held-out metric; *kept gets the
 * figures of the weights kept (copied to best1/best2 with restore_best),
 * *last those of the last epoch. */
static int train_epochs(train_ctx *c, const pi2_trace *tr, const pi2_pred_train_opts *o, double t_start,
                        epoch_result *kept, epoch_result *last, int *epochs_run, bool *stopped, double *train_loss,
                        pi2_err *err)
{
    const pi2_predictor *pr = c->pred;
    const size_t n1 = (size_t)pr->rank * tr->d, n2 = (size_t)tr->n_ff * pr->rank;
    double best = INFINITY;
    int bad = 0, epoch = 0;
    double c1 = 1, c2 = 1; /* beta1^t, beta2^t */
    for (epoch = 1; epoch <= o->epochs; epoch++) {
        double cost = -1, metric = 0;
        int rc = train_epoch(c, tr, o, epoch, &c1, &c2, train_loss, err);
        if (rc == 0)
            rc = train_heldout(c, tr, o, epoch, last, &cost, &metric, err);
        if (rc)
            return rc;
        if (o->verbose) {
            char extra[64] = "";
            if (cost >= 0)
                snprintf(extra, sizeof extra, "  predicted active %.4f", cost);
            fprintf(stderr, "predictor: epoch %d/%d  train loss %.5f  held-out loss %.5f%s  (%.1f s)\n", epoch,
                    o->epochs, *train_loss, last->loss, extra, pi2_now() - t_start);
        }
        bool progress = metric < best * (1 - o->min_delta) || kept->epoch == 0;
        if (metric < best || kept->epoch == 0) { /* a small gain is the new best, but not progress */
            best = metric;
            *kept = *last;
            if (o->restore_best) {
                memcpy(c->best1, pr->fc1, n1 * sizeof(float));
                memcpy(c->best2, pr->fc2, n2 * sizeof(float));
            }
        }
        bad = progress ? 0 : bad + 1;
        if (o->patience > 0 && bad >= o->patience) {
            *stopped = true;
            break;
        }
    }
    *epochs_run = *stopped ? epoch : o->epochs;
    return 0;
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
    train_ctx c;
    memset(&c, 0, sizeof c);
    if ((rc = train_split(&c, tr, o, err)) != 0) {
        train_ctx_free(&c);
        return rc;
    }
    int r = o->rank ? o->rank : pi2_pred_choose_rank(d, n_ff, c.f, o->rank_min, o->rank_max);
    if ((rc = train_setup(&c, tr, o, r, err)) != 0) {
        train_ctx_free(&c);
        return rc;
    }
    pi2_predictor *pr = c.pred;
    blas_guard g = pred_blas_enter();
    double train_loss = 0;
    epoch_result kept = {0}, last = {0};
    int epochs_run = 0;
    bool stopped = false;
    rc = train_epochs(&c, tr, o, t_start, &kept, &last, &epochs_run, &stopped, &train_loss, err);
    if (rc == 0) {
        if (!o->restore_best)
            kept = last;
        else if (kept.epoch != last.epoch) {
            memcpy(pr->fc1, c.best1, (size_t)r * d * sizeof(float));
            memcpy(pr->fc2, c.best2, (size_t)n_ff * r * sizeof(float));
        }
        /* the loss metric did not calibrate along the way */
        if (o->stop_metric != PI2_PRED_STOP_COST) {
            rc = pred_calibrate_idx(&c.j, &c.pl, tr, c.hold, c.n_hold, o->target_recall, &kept.thr, NULL, err);
            if (rc == 0)
                pred_eval_idx(&c.j, &c.pl, tr, c.hold, c.n_hold, kept.thr, &kept.cnt);
        }
    }
    pred_blas_leave(g);
    if (rc) {
        train_ctx_free(&c);
        return rc;
    }
    pr->threshold = kept.thr;
    if (rep) {
        memset(rep, 0, sizeof *rep);
        pred_report_fill(rep, pr, &kept.cnt, c.n_hold);
        rep->n_train = c.n_train;
        rep->epochs = epochs_run;
        rep->early_stopped = stopped;
        rep->best_epoch = kept.epoch;
        rep->pos_weight = c.pw;
        rep->train_loss = train_loss;
        rep->heldout_loss = kept.loss;
        rep->seconds = pi2_now() - t_start;
    }
    c.pred = NULL; /* handed to the caller */
    train_ctx_free(&c);
    *out = pr;
    return 0;
}
