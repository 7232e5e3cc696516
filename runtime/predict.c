/* pi2 engine: the runtime predictor (decode): which neurons of an FFN
 * will fire for the token, from its Q8 or Q4 rows of the predictor. */
#include "runtime/predict.h"
#include "runtime/units.h"

#include <stdatomic.h>
#include <string.h>

typedef struct pred_job {
    pi2_engine *e;   /* the pool's (NULL: one thread) */
    const eng_ffn *f;
    const eng_pred_buf *b;
    uint32_t n0;     /* score neurons [n0, n_ff) only */
    uint32_t *sel;   /* where the picks go */
    int64_t units1, units2;  /* fc1's units (fc1_unit rows), fc2's of ENG_PRED_UNIT neurons */
    _Atomic int64_t done1;   /* fc1 units computed */
    _Atomic bool hidden;     /* fc1's output rectified and quantized: fc2 may start */
    _Atomic int64_t next2;   /* fc2's next unit */
} pred_job;

/* Q8 rows [b, en) of a predictor matrix (rows of n values, n bytes each
 * from q, n / 32 scales each from s) against the quantized vector (as, aq,
 * asum) of n values, 64 rows per call, each prefetching the next 64 (the
 * rows lie together): out[r - b]. */
static void pred_rows(pi2_qtype qt, const uint8_t *q, const uint16_t *s, int64_t n, int64_t b, int64_t en,
                      const float *as, const int8_t *aq, const int32_t *asum, float *out)
{
    enum { R = 64 };
    const uint8_t *wp[R];
    const uint16_t *ws[R];
    int64_t nb = n / PI2_Q_GROUP, pb = (int64_t)pi2_q_payload_row_bytes(qt, n);
    for (int64_t r0 = b; r0 < en; r0 += R) {
        int m = (int)(en - r0 < R ? en - r0 : R);
        for (int k = 0; k < m; k++) {
            wp[k] = q + (r0 + k) * pb;
            ws[k] = s + (r0 + k) * nb;
        }
        int64_t next = en - (r0 + m) < R ? en - (r0 + m) : R;
        pi2_k_matmul_pf(qt, n, m, wp, ws, as, aq, asum, 1, out + (r0 - b), m, q + (r0 + m) * pb, next * pb);
    }
}

/* Bytes of one row of n values of type qt, scales included. */
static uint64_t q_row_bytes(pi2_qtype qt, int64_t n)
{
    return pi2_q_payload_row_bytes(qt, n) + 2 * pi2_q_scale_row_count(qt, n);
}

/* The predictor's two layers run as one shared job (pi2_pool_run_shared):
 * fc1 in units of fc1_unit rows (eng_share_next); whoever computes the
 * last of them rectifies and quantizes the hidden vector; then fc2 in
 * units of ENG_PRED_UNIT neurons, taken a few at a time (fc2_take) once
 * the hidden vector is ready, each unit's picks written at its own place
 * in the output list and packed in unit order after, so the list is in
 * neuron order whoever ran what.
 * One job instead of two: a round through the pool cost more than the
 * step between the layers. */
static void pred_hidden(const eng_ffn *f, const eng_pred_buf *b)
{
    for (int r = 0; r < f->rank_p; r++)
        b->h[r] = r < f->rank && b->h[r] > 0.0f ? b->h[r] : 0.0f;
    pi2_k_act_quantize(b->h, f->rank_p, 1, f->rank_p, b->hs, b->hq, b->hsum);
}

/* Rows of an fc1 unit: 8 at small ranks, so that every thread gets some;
 * a sixteenth of the rank, up to 64, at large ones, where each call's own
 * costs (the activations split for its rows, its first rows' misses)
 * weighed on units of 8 (runtime/PERF.md). Each row's result is its own:
 * the unit changes no bit. */
static int64_t fc1_unit(const eng_ffn *f)
{
    int64_t n = f->rank / 16 / 8 * 8;
    return n < 8 ? 8 : n > 64 ? 64 : n;
}

static void pred_fc1_unit(const pred_job *j, int64_t u, int64_t D)
{
    const eng_ffn *f = j->f;
    const eng_pred_buf *pb = j->b;
    int64_t n = fc1_unit(f), b = u * n, en = b + n < f->rank ? b + n : f->rank;
    pred_rows(f->pred_qt, f->q1, f->s1, D, b, en, pb->xs, pb->xq, pb->xsum, pb->h + b);
}

/* The first neuron of fc2's unit u (n_ff past the last). */
static int64_t unit_row(const pred_job *j, int64_t u)
{
    int64_t r = j->n0 + u * ENG_PRED_UNIT;
    return r < j->f->n_ff ? r : j->f->n_ff;
}

/* fc2's units [u0, u1), their rows in one pass (one stream through the
 * matrix); unit u's picks at list + (u - u0) ENG_PRED_UNIT, their count
 * in the scratch's n[u]. */
static void pred_fc2_units(const pred_job *j, int64_t u0, int64_t u1, uint32_t *list)
{
    const eng_ffn *f = j->f;
    const eng_pred_buf *pb = j->b;
    float *sc = pb->scores, thr = f->threshold;
    int64_t b = unit_row(j, u0);
    pred_rows(f->pred_qt, f->q2, f->s2, f->rank_p, b, unit_row(j, u1), pb->hs, pb->hq, pb->hsum, sc + b);
    for (int64_t u = u0; u < u1; u++) {
        uint32_t n = 0, *l = list + (u - u0) * ENG_PRED_UNIT;
        for (int64_t i = unit_row(j, u); i < unit_row(j, u + 1); i++)
            if (sc[i] >= thr)
                l[n++] = (uint32_t)i;
        pb->n[u] = n;
    }
}

/* Units of fc2 a thread takes at once: about two takes a thread. Each
 * take starts a stream of its own (the next rows were the other
 * thread's), which weighed on the 1B shape's short rows at one unit a
 * take (runtime/PERF.md). */
static int64_t fc2_take(const pred_job *j, int nt)
{
    int64_t k = j->units2 / (2 * (int64_t)nt);
    return k < 1 ? 1 : k;
}

static void pred_fn(void *ctx, int tid, int nt)
{
    pred_job *j = ctx;
    pi2_engine *e = j->e;
    for (int64_t u; (u = eng_share_next(e, tid, nt)) >= 0;) {
        pred_fc1_unit(j, u, e->d.hidden);
        if (atomic_fetch_add_explicit(&j->done1, 1, memory_order_acq_rel) + 1 == j->units1) {
            pred_hidden(j->f, j->b);
            atomic_store_explicit(&j->hidden, true, memory_order_release);
        }
    }
    /* every fc1 unit is taken: the last one is at most a unit away */
    for (long i = 0; !atomic_load_explicit(&j->hidden, memory_order_acquire);)
        pi2_pool_spin(&i);
    int64_t k = fc2_take(j, nt);
    for (int64_t u; (u = atomic_fetch_add_explicit(&j->next2, k, memory_order_relaxed)) < j->units2;)
        pred_fc2_units(j, u, u + k < j->units2 ? u + k : j->units2, j->sel + u * ENG_PRED_UNIT);
}

/* The job for FFN f on x, its input quantized into the job's scratch. */
static void pred_start(pred_job *j, const pi2_engine *e, const eng_ffn *f, const float *x)
{
    int64_t D = e->d.hidden;
    j->units1 = (f->rank + fc1_unit(f) - 1) / fc1_unit(f);
    j->units2 = (f->n_ff - j->n0 + ENG_PRED_UNIT - 1) / ENG_PRED_UNIT;
    atomic_init(&j->done1, 0);
    atomic_init(&j->hidden, j->units1 == 0);
    atomic_init(&j->next2, 0);
    if (j->units1 == 0)
        pred_hidden(f, j->b);
    pi2_k_act_quantize(x, D, 1, D, j->b->xs, j->b->xq, j->b->xsum);
}

/* Pack the units' lists (each starts at or after its place); their count. */
static uint32_t pred_pack(const pred_job *j)
{
    uint32_t n = 0;
    for (int64_t u = 0; u < j->units2; u++) {
        memmove(j->sel + n, j->sel + u * ENG_PRED_UNIT, j->b->n[u] * sizeof(uint32_t));
        n += j->b->n[u];
    }
    return n;
}

/* Bytes of the predictor rows a prediction from neuron n0 reads. */
static uint64_t pred_read_bytes(const pi2_engine *e, const eng_ffn *f, uint32_t n0)
{
    return (uint64_t)f->rank * q_row_bytes(f->pred_qt, e->d.hidden) +
           (uint64_t)(f->n_ff - n0) * q_row_bytes(f->pred_qt, f->rank_p);
}

uint32_t eng_predict_from(pi2_engine *e, const eng_ffn *f, const float *x, uint32_t n0, uint32_t *sel)
{
    pred_job j = {.e = e, .f = f, .b = &e->pb[0], .n0 = n0 < f->n_ff ? n0 : f->n_ff, .sel = sel};
    pred_start(&j, e, f, x);
    eng_run_units(e, j.units1, pred_fn, &j);
    e->st.weight_bytes += pred_read_bytes(e, f, j.n0);
    return pred_pack(&j);
}

uint32_t eng_predict(pi2_engine *e, const eng_ffn *f, const float *x, uint32_t *sel)
{
    return eng_predict_from(e, f, x, 0, sel);
}

int64_t eng_pred_start_alone(const pi2_engine *e, const eng_ffn *f, const float *x, uint32_t n0,
                             const eng_pred_buf *b, uint64_t *bytes)
{
    pred_job j = {.f = f, .b = b, .n0 = n0 < f->n_ff ? n0 : f->n_ff};
    pred_start(&j, e, f, x);
    for (int64_t u = 0; u < j.units1; u++)
        pred_fc1_unit(&j, u, e->d.hidden);
    if (j.units1 > 0)
        pred_hidden(f, b);
    *bytes += pred_read_bytes(e, f, j.n0);
    return j.units2;
}

uint32_t eng_pred_unit_alone(const eng_ffn *f, uint32_t n0, int64_t u, uint32_t *sel, const eng_pred_buf *b)
{
    pred_job j = {.f = f, .b = b, .n0 = n0 < f->n_ff ? n0 : f->n_ff};
    pred_fc2_units(&j, u, u + 1, sel);
    return b->n[u];
}
