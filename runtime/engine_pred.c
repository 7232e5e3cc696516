/* pi2 engine: the predictors decode runs, prepared at open: bound in
 * place (q8/q4 members) or quantized into Q8 copies (f32/f16 ones). */
#include "runtime/state.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Offloading: give back the whole pages of [p, p + n) inside the resident
 * region (read into memory the engine owns); returns their bytes, for the
 * caller to count off it. The range is marked no-huge-page first, so that
 * the kernel's background collapse of the 2 MiB pages around it cannot
 * fill the hole again. */
static uint64_t release_res(const pi2_engine *e, const void *p, uint64_t n)
{
    uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE), a = (uint64_t)((const uint8_t *)p - e->res), b = a + n;
    a = (a + pg - 1) / pg * pg;
    b = b / pg * pg;
    if (b <= a)
        return 0;
#ifdef MADV_NOHUGEPAGE
    if (madvise(e->res + a, (size_t)(b - a), MADV_NOHUGEPAGE) != 0)
        return 0;
#endif
    return madvise(e->res + a, (size_t)(b - a), MADV_DONTNEED) == 0 ? b - a : 0;
}

/* Offloading: give back f's f32/f16 predictor once its Q8 copy is made
 * (bytes released). */
static uint64_t release_pred(const pi2_engine *e, eng_ffn *f)
{
    const uint8_t *p1 = (const uint8_t *)f->fc1, *p2 = (const uint8_t *)f->fc2;
    uint64_t el = f->pred_f16 ? 2 : 4, n1 = (uint64_t)f->rank * (uint64_t)e->d.hidden * el,
             n2 = (uint64_t)f->n_ff * (uint64_t)f->rank * el, r;
    if (p1 + n1 == p2) /* side by side, as bundled: one range */
        r = release_res(e, p1, n1 + n2);
    else
        r = release_res(e, p1, n1) + release_res(e, p2, n2);
    f->fc1 = f->fc2 = NULL;
    return r;
}

/* The predictor's decode copy: fc1 and fc2 as Q8 rows (fc2's rows padded
 * with zero columns to rank_p), so decode runs them through the int8
 * matmul: on the 7B-shaped model the f32 predictor read 150 MB a token,
 * a tenth of the bytes, at a fifth of the rate of the int8 kernels.
 * The picks move only where a score is within the quantization error of
 * the threshold (test_predict_q8). */
int eng_pred_alloc(pi2_engine *e, eng_ffn *f, pi2_err *err)
{
    int64_t D = e->d.hidden, R = f->rank, Rp = (R + PI2_Q_GROUP - 1) / PI2_Q_GROUP * PI2_Q_GROUP, N = f->n_ff;
    size_t b1 = (size_t)(R * D), b2 = (size_t)(N * Rp), c1 = (size_t)(R * (D / PI2_Q_GROUP)),
           c2 = (size_t)(N * (Rp / PI2_Q_GROUP));
    if (!(f->pq = eng_acc_alloc(e, b1 + b2 + 2 * (c1 + c2), 1)))
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory for the predictor of layer %d", e->path, f->layer);
    e->pred_bytes += b1 + b2 + 2 * (c1 + c2);
    f->rank_p = (int)Rp;
    f->pred_qt = PI2_QT_Q8;
    f->q1 = f->pq;
    f->q2 = f->pq + b1;
    f->s1 = (uint16_t *)(void *)(f->pq + b1 + b2);
    f->s2 = f->s1 + c1;
    return 0;
}

/* A q8/q4 predictor (qt): its members, in the layout eng_pred_alloc makes,
 * used in place, so open neither copies nor quantizes them. */
int eng_pred_bind(pi2_engine *e, eng_ffn *f, const pi2_mf_predictor *p, pi2_qtype qt, pi2_err *err)
{
    int64_t D = e->d.hidden, R = f->rank, Rp = (R + PI2_Q_GROUP - 1) / PI2_Q_GROUP * PI2_Q_GROUP, N = f->n_ff;
    const uint8_t *s1, *s2;
    f->pred_qt = qt;
    f->rank_p = (int)Rp;
    if (!(f->q1 = eng_member(e, p->fc1, (uint64_t)R * pi2_q_payload_row_bytes(qt, D), err)) ||
        !(f->q2 = eng_member(e, p->fc2, (uint64_t)N * pi2_q_payload_row_bytes(qt, Rp), err)) ||
        !(s1 = eng_member(e, p->fc1_scales, (uint64_t)R * pi2_q_scale_row_count(qt, D) * 2, err)) ||
        !(s2 = eng_member(e, p->fc2_scales, (uint64_t)N * pi2_q_scale_row_count(qt, Rp) * 2, err)))
        return err->code;
    f->s1 = (const uint16_t *)(const void *)s1;
    f->s2 = (const uint16_t *)(const void *)s2;
    e->pred_bytes += (uint64_t)R * (pi2_q_payload_row_bytes(qt, D) + pi2_q_scale_row_count(qt, D) * 2) +
                     (uint64_t)N * (pi2_q_payload_row_bytes(qt, Rp) + pi2_q_scale_row_count(qt, Rp) * 2);
    return 0;
}

/* Quantize f's predictor into its Q8 copy: 0, PI2_ENOMEM or PI2_ERANGE. */
static int pred_fill(const pi2_engine *e, eng_ffn *f)
{
    int64_t D = e->d.hidden, R = f->rank, Rp = f->rank_p, N = f->n_ff;
    int64_t W = D > Rp ? D : Rp;
    uint8_t *q1 = f->pq, *q2 = f->pq + R * D; /* the writable view of f's copy (eng_pred_alloc) */
    uint16_t *s1 = (uint16_t *)(void *)(q2 + N * Rp), *s2 = s1 + R * (D / PI2_Q_GROUP);
    float *row = malloc(sizeof(float) * (size_t)W);
    if (!row)
        return PI2_ENOMEM;
    int rc = 0;
    for (int64_t r = 0; r < R && !rc; r++) {
        for (int64_t k = 0; k < D; k++)
            row[k] = eng_pred_w(f, f->fc1, (size_t)(r * D + k));
        rc = pi2_q_quantize_row(PI2_QT_Q8, row, D, s1 + r * (D / PI2_Q_GROUP), q1 + r * D);
    }
    memset(row + R, 0, sizeof(float) * (size_t)(Rp - R));
    for (int64_t i = 0; i < N && !rc; i++) {
        for (int64_t k = 0; k < R; k++)
            row[k] = eng_pred_w(f, f->fc2, (size_t)(i * R + k));
        rc = pi2_q_quantize_row(PI2_QT_Q8, row, Rp, s2 + i * (Rp / PI2_Q_GROUP), q2 + i * Rp);
    }
    free(row);
    return rc ? PI2_ERANGE : 0;
}

typedef struct pred_job {
    pi2_engine *e;
    eng_ffn **f; /* the FFNs with a predictor */
    int n;
    atomic_int next;
    int *rc;            /* [n] */
    _Atomic uint64_t released; /* bytes of f32/f16 predictors given back */
} pred_job;

static void pred_fn(void *ctx, int tid, int nt)
{
    (void)tid;
    (void)nt;
    pred_job *j = ctx;
    for (int k; (k = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < j->n;)
        if ((j->rc[k] = pred_fill(j->e, j->f[k])) == 0 && j->e->res)
            atomic_fetch_add_explicit(&j->released, release_pred(j->e, j->f[k]), memory_order_relaxed);
}

/* Every predictor's Q8 copy, the FFNs shared out over the pool; offloading,
 * each f32/f16 predictor's pages given back as soon as its copy is made
 * (the resident region is read into memory the engine owns, and decode
 * reads only the copy), so open holds the region and about one copy per
 * thread beyond it (pi2_plan_memory's open_peak). */
int eng_pred_quantize_all(pi2_engine *e, pi2_err *err)
{
    int E = pi2_desc_is_moe(&e->d) ? e->d.n_experts : 1, n = 0;
    pred_job j = {.e = e};
    j.f = pi2_malloc_array((size_t)e->d.n_layers * (size_t)E, sizeof *j.f);
    j.rc = pi2_calloc_array((size_t)e->d.n_layers * (size_t)E, sizeof *j.rc);
    if (!j.f || !j.rc) {
        free(j.f);
        free(j.rc);
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", e->path);
    }
    for (int l = 0; l < e->d.n_layers; l++)
        for (int x = 0; x < E; x++)
            if (e->layers[l].ffn[x].has_pred && e->layers[l].ffn[x].pq) /* q8/q4 members are used in place */
                j.f[n++] = &e->layers[l].ffn[x];
    j.n = n;
    atomic_init(&j.next, 0);
    atomic_init(&j.released, 0);
    if (n > 0)
        pi2_pool_run(e->pool, pred_fn, &j);
    e->res_released += atomic_load(&j.released);
    int rc = 0;
    for (int k = 0; k < n && !rc; k++)
        if (j.rc[k] == PI2_ENOMEM)
            rc = pi2_err_set(err, PI2_ENOMEM, "%s: out of memory quantizing the predictors", e->path);
        else if (j.rc[k])
            rc = pi2_err_set(err, PI2_EFORMAT,
                             "%s: the predictor of layer %d (expert %d) holds a value that cannot be quantized (not "
                             "finite, or beyond fp16 scales)",
                             e->path, j.f[k]->layer, j.f[k]->expert);
    free(j.f);
    free(j.rc);
    return rc;
}
