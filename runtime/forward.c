/* pi2 engine: the forward pass (prefill batches and sparse decode). */
#include "runtime/forward.h"
#include "runtime/ffn.h"
#include "runtime/ffn_source.h"
#include "runtime/mathops.h"
#include "runtime/moe.h"
#include "runtime/predict.h"
#include "runtime/units.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#define GRAIN 16 /* rows per partition unit */

/* ---- matmul jobs: up to 3 matrices sharing one quantized input ---- */

typedef struct mm_task {
    const eng_mat *m;
    float *out;
    int64_t ldo;
} mm_task;

typedef struct mm_job {
    mm_task t[3];
    int n;
    int T;
    const float *xf; /* f32 input [T][ldx] for f32 matrices */
    int64_t ldx;
    const pi2_engine *e;
} mm_job;

static void mm_rows(const mm_job *j, const mm_task *k, int64_t b, int64_t en, const uint8_t *pf, int64_t pf_len)
{
    const eng_mat *m = k->m;
    if (m->qt == PI2_QT_F32) {
        for (int t = 0; t < j->T; t++)
            pi2_k_sgemv(m->f32 + b * m->cols, m->cols, m->cols, (int)(en - b), j->xf + t * j->ldx,
                        k->out + t * k->ldo + b);
        return;
    }
    pi2_k_matmul_pf(m->qt, m->cols, (int)(en - b), m->rp + b, m->rs + b, j->e->aqs, j->e->aq, j->e->asum, j->T,
                    k->out + b, k->ldo, pf, pf_len);
}

enum {
    MM_UNIT = 64,   /* rows per shared unit (decode) */
    MM_BATCH_T = 4  /* from this many tokens: static halves, each repacked into panels */
};

static int64_t mm_total(const mm_job *j)
{
    int64_t total = 0;
    for (int i = 0; i < j->n; i++)
        total += j->t[i].m->rows;
    return total;
}

/* Rows [b, en) of the job's matrices taken end to end; the first matrix
 * met also prefetches [pf, pf + pf_len). */
static void mm_range(const mm_job *j, int64_t b, int64_t en, const uint8_t *pf, int64_t pf_len)
{
    int64_t base = 0;
    for (int i = 0; i < j->n && b < en; i++) {
        int64_t r = j->t[i].m->rows;
        int64_t lo = b > base ? b : base, hi = en < base + r ? en : base + r;
        if (lo < hi) {
            mm_rows(j, &j->t[i], lo - base, hi - base, pf, pf_len);
            pf = NULL;
            pf_len = 0;
        }
        base += r;
    }
}

bool eng_l2_ahead(long l2_bytes) { return l2_bytes <= 0 || l2_bytes >= ENG_AHEAD_MIN_L2; }

/* Decode: [*p, *p + *len) = the payload of unit u's rows when they lie
 * together in one quantized matrix, else *len = 0. The unit after the one
 * a thread computes is usually its next (eng_share_next), and its rows are
 * read into L2 while this one computes (pi2_k_matmul_pf; figures:
 * runtime/PERF.md). */
static void unit_ahead(const mm_job *j, int64_t u, const uint8_t **p, int64_t *len)
{
    int64_t a0 = u * MM_UNIT, base = 0;
    *p = NULL;
    *len = 0;
    for (int i = 0; i < j->n; i++) {
        const eng_mat *m = j->t[i].m;
        if (a0 < base + m->rows) {
            int64_t r0 = a0 - base, r1 = r0 + MM_UNIT < m->rows ? r0 + MM_UNIT : m->rows;
            if (m->qt == PI2_QT_F32)
                return;
            const uint8_t *st = m->rp[r0], *en = m->rp[r1 - 1] + m->row_bytes;
            if (en > st && (uint64_t)(en - st) <= (uint64_t)(r1 - r0 + 1) * m->row_bytes) {
                *p = st;
                *len = en - st;
            }
            return;
        }
        base += m->rows;
    }
}

/* Batches: static halves (each call repacks its rows into panels); decode:
 * units of rows shared out (each row's result is the same whoever runs it). */
static void mm_fn(void *ctx, int tid, int nt)
{
    const mm_job *j = ctx;
    int64_t total = mm_total(j), b, en;
    if (j->T >= MM_BATCH_T) {
        pi2_pool_split(total, GRAIN, tid, nt, &b, &en);
        mm_range(j, b, en, NULL, 0);
        return;
    }
    for (int64_t u; (u = eng_share_next(j->e, tid, nt)) >= 0;) {
        const uint8_t *pf = NULL;
        int64_t pf_len = 0;
        if (j->e->ahead)
            unit_ahead(j, u + 1, &pf, &pf_len);
        mm_range(j, u * MM_UNIT, (u + 1) * MM_UNIT < total ? (u + 1) * MM_UNIT : total, pf, pf_len);
    }
}

/* Quantize x [T][ldx] (n values each) into the engine's activation
 * buffers from token t0 on. */
static void quant_in(pi2_engine *e, const float *x, int64_t ldx, int T, int64_t n, int t0)
{
    int64_t nb = n / PI2_Q_GROUP;
    pi2_k_act_quantize(x, ldx, T, n, e->aqs + t0 * nb, e->aq + t0 * n, e->asum + t0 * nb);
}

/* Quantize tokens [t0, t1) of a prefill FFN's input x [T][D] for its gate
 * and up kernels. */
static void quant_ffn_rows(pi2_engine *e, const eng_ffn *f, const float *x, int t0, int t1)
{
    int64_t D = e->d.hidden, nb = D / PI2_Q_GROUP, ns = (D + PI2_K_SB - 1) / PI2_K_SB;
    if (ffn_sb(f))
        pi2_k_act_quantize_sb(x + t0 * D, D, t1 - t0, D, e->aqs + t0 * ns, e->aq + t0 * D, e->asum + t0 * nb);
    else
        quant_in(e, x + t0 * D, D, t1 - t0, D, t0);
}

static void run_mm(pi2_engine *e, mm_job *j)
{
    if (j->T < MM_BATCH_T) {
        eng_run_units(e, (mm_total(j) + MM_UNIT - 1) / MM_UNIT, mm_fn, j);
    } else {
        pi2_pool_run(e->pool, mm_fn, j);
    }
}

/* ---- per-token work of a batch, the tokens shared between threads ---- */

enum { PAR_MIN_T = 8 /* fewer tokens: on the calling thread */ };

typedef enum tok_kind { TOK_NORM_Q, TOK_ROPE, TOK_QUANT, TOK_RES_NORM, TOK_FFN_Q, TOK_RES } tok_kind;

typedef struct tok_job {
    pi2_engine *e;
    tok_kind kind;
    int T;
    const float *w;     /* TOK_NORM_Q, TOK_RES_NORM: the norm's weights */
    const float *src;   /* TOK_QUANT, TOK_FFN_Q: rows to quantize */
    int64_t n;          /* TOK_QUANT: their length */
    const eng_ffn *f;   /* TOK_FFN_Q */
    float *kc;          /* TOK_ROPE: the layer's new key rows */
    int64_t qd, kvd, hd;
} tok_job;

static void tok_range(const tok_job *j, int t0, int t1)
{
    pi2_engine *e = j->e;
    int64_t D = e->d.hidden, half = j->hd / 2;
    float eps = e->d.rms_eps;
    switch (j->kind) {
    case TOK_RES_NORM:
    case TOK_RES:
        for (int64_t i = (int64_t)t0 * D; i < (int64_t)t1 * D; i++)
            e->x[i] += e->xb2[i];
        if (j->kind == TOK_RES)
            return;
        /* fall through */
    case TOK_NORM_Q:
        for (int t = t0; t < t1; t++)
            pi2_op_rmsnorm(e->xb + t * D, e->x + t * D, j->w, (int)D, eps);
        if (j->kind == TOK_NORM_Q)
            quant_in(e, e->xb + t0 * D, D, t1 - t0, D, t0);
        return;
    case TOK_ROPE:
        for (int t = t0; t < t1; t++) {
            pi2_op_rope(e->q + t * j->qd, (int)e->d.n_heads, (int)j->hd, e->rope_cs + t * half, e->rope_sn + t * half);
            pi2_op_rope(j->kc + t * j->kvd, (int)e->d.n_kv_heads, (int)j->hd, e->rope_cs + t * half, e->rope_sn + t * half);
        }
        return;
    case TOK_QUANT: quant_in(e, j->src + t0 * j->n, j->n, t1 - t0, j->n, t0); return;
    case TOK_FFN_Q: quant_ffn_rows(e, j->f, j->src, t0, t1); return;
    }
}

static void tok_fn(void *ctx, int tid, int nt)
{
    const tok_job *j = ctx;
    int64_t b, en;
    pi2_pool_split(j->T, 1, tid, nt, &b, &en);
    if (b < en)
        tok_range(j, (int)b, (int)en);
}

/* The job's per-token work for all T tokens (each token's result is the
 * same whichever thread computes it). */
static void run_tok(tok_job *j)
{
    if (j->T < PAR_MIN_T)
        tok_range(j, 0, j->T);
    else
        pi2_pool_run(j->e->pool, tok_fn, j);
}

/* ---- attention ---- */

typedef struct attn_job {
    pi2_engine *e;
    int l, T, pos;
} attn_job;

/* The KV cache is head-major: [layer][KV head][position][head_dim], so the
 * keys (values) an attention unit reads are one ascending stream, not rows
 * a KV row apart, which the prefetchers followed worse (figures:
 * runtime/PERF.md, "A head-major KV cache"). Position pos of KV head kh of
 * layer l in c. */
static void *kv_at(const pi2_engine *e, void *c, int l, int64_t kh, int pos)
{
    int64_t hd = e->d.head_dim;
    size_t i = (((size_t)l * (size_t)e->d.n_kv_heads + (size_t)kh) * (size_t)e->ctx + (size_t)pos) * (size_t)hd;
    return e->kv_f16 ? (void *)((uint16_t *)c + i) : (void *)((float *)c + i);
}

/* One key or value row of hd into the cache at dst: as is, or rounded to
 * fp16 (to nearest even: the same bits on every CPU). */
static void kv_row_put(const pi2_engine *e, void *dst, const float *src, int64_t hd)
{
    if (!e->kv_f16) {
        memcpy(dst, src, (size_t)hd * sizeof(float));
        return;
    }
    uint16_t *h = dst;
    for (int64_t i = 0; i < hd; i++)
        h[i] = pi2_f32_to_f16(src[i]);
}

/* The new keys and values of T tokens, [T][kvd] each (rotated keys), into
 * the cache at positions pos.. of layer l: KV heads [kh0, kh1). */
static void kv_store(const pi2_engine *e, int l, int pos, int T, const float *kn, const float *vn, int64_t kh0,
                     int64_t kh1)
{
    int64_t hd = e->d.head_dim, kvd = (int64_t)e->d.n_kv_heads * hd;
    for (int64_t kh = kh0; kh < kh1; kh++)
        for (int t = 0; t < T; t++) {
            kv_row_put(e, kv_at(e, e->kc, l, kh, pos + t), kn + t * kvd + kh * hd, hd);
            kv_row_put(e, kv_at(e, e->vc, l, kh, pos + t), vn + t * kvd + kh * hd, hd);
        }
}

enum { ENG_HEAD_TOP = 64 };    /* logits that get the head's second term (run_head) */

enum { ATTN_HEADS_UNIT = 4 }; /* heads of one KV head per unit, at most */

/* Causal attention of T tokens at positions pos.. (a batch or one
 * token): unit u = heads [h0, h0 + G) of KV head kh, up to
 * ATTN_HEADS_UNIT of them. Per token, their scores over its visible
 * prefix one head after the other (K stays in cache for the next; scoring
 * 16-key blocks for every head in turn was slower, the prefetcher losing
 * the stream), then the V rows weighted for all of them in one pass
 * (pi2_k_sgemv_t_group: each row read once, and 16 FMA chains instead of
 * one head's 4 waiting on their latency); a BLAS call per head cost many
 * times the arithmetic at decode's size. Faster than a unit per head, with
 * the same bits (runtime/PERF.md). Batches run the same code, so their
 * sums are in the kernels' one order (runtime/kernels.h, Numerics) on
 * every CPU, where a BLAS sgemm picks its kernel, and with it its order,
 * by CPU. */
static int64_t attn_units(const pi2_model_desc *d)
{
    int group = d->n_heads / d->n_kv_heads;
    return (int64_t)d->n_kv_heads * ((group + ATTN_HEADS_UNIT - 1) / ATTN_HEADS_UNIT);
}

/* One token's unit over the fp16 cache: attn_unit's sums, in its order,
 * over rows converted ENG_KV_BLOCK at a time into `rows` (they stay in L1
 * while every head of the unit reads them): the keys' scores row by row,
 * each row's alone; the values' sums continued block after block
 * (pi2_k_sgemv_t_group_acc). The bits of converting all rows first, which
 * a batch does (its tokens read the same rows: once per unit, not per
 * token). */
static void attn_one_f16(const attn_job *j, int64_t kh, int64_t h0, int G, float *S, float *rows)
{
    pi2_engine *e = j->e;
    int hd = e->d.head_dim, vis = j->pos + 1;
    const uint16_t *K = kv_at(e, e->kc, j->l, kh, 0), *V = kv_at(e, e->vc, j->l, kh, 0);
    const float *Q = e->q + h0 * hd;
    float scale = 1.0f / sqrtf((float)hd), *out = e->att + h0 * hd;
    for (int b0 = 0; b0 < vis; b0 += ENG_KV_BLOCK) {
        int nb = vis - b0 < ENG_KV_BLOCK ? vis - b0 : ENG_KV_BLOCK;
        pi2_k_f16_to_f32(K + (size_t)b0 * (size_t)hd, (int64_t)nb * hd, rows);
        for (int g = 0; g < G; g++)
            pi2_k_sgemv(rows, hd, hd, nb, Q + g * hd, S + g * vis + b0);
    }
    for (int g = 0; g < G; g++) {
        float *row = S + g * vis;
        for (int s2 = 0; s2 < vis; s2++)
            row[s2] *= scale;
        pi2_k_softmax(row, vis);
    }
    for (int b0 = 0; b0 < vis; b0 += ENG_KV_BLOCK) {
        int nb = vis - b0 < ENG_KV_BLOCK ? vis - b0 : ENG_KV_BLOCK;
        pi2_k_f16_to_f32(V + (size_t)b0 * (size_t)hd, (int64_t)nb * hd, rows);
        (b0 == 0 ? pi2_k_sgemv_t_group : pi2_k_sgemv_t_group_acc)(rows, hd, hd, nb, S + b0, vis, G, out, hd);
    }
}

static void attn_unit(const attn_job *j, int64_t u, float *S, float *rows)
{
    pi2_engine *e = j->e;
    const pi2_model_desc *d = &e->d;
    int hd = d->head_dim, group = d->n_heads / d->n_kv_heads, per = (group + ATTN_HEADS_UNIT - 1) / ATTN_HEADS_UNIT;
    int64_t kh = u / per, h0 = kh * group + (u % per) * ATTN_HEADS_UNIT;
    int G = (int)((kh + 1) * group - h0 < ATTN_HEADS_UNIT ? (kh + 1) * group - h0 : ATTN_HEADS_UNIT);
    if (e->kv_f16 && j->T == 1) {
        attn_one_f16(j, kh, h0, G, S, rows);
        return;
    }
    int64_t qd = (int64_t)d->n_heads * hd;
    const float *K = kv_at(e, e->kc, j->l, kh, 0), *V = kv_at(e, e->vc, j->l, kh, 0);
    if (e->kv_f16) { /* a batch: the unit's visible rows as f32 once, then the f32 path */
        int64_t n = (int64_t)(j->pos + j->T) * hd;
        pi2_k_f16_to_f32((const uint16_t *)(const void *)K, n, rows);
        pi2_k_f16_to_f32((const uint16_t *)(const void *)V, n, rows + (size_t)e->ctx * (size_t)hd);
        K = rows;
        V = rows + (size_t)e->ctx * (size_t)hd;
    }
    float scale = 1.0f / sqrtf((float)hd);
    for (int t = 0; t < j->T; t++) {
        int vis = j->pos + t + 1;
        const float *Q = e->q + t * qd + h0 * hd;
        for (int g = 0; g < G; g++) {
            float *row = S + g * vis;
            pi2_k_sgemv(K, hd, hd, vis, Q + g * hd, row);
            for (int s2 = 0; s2 < vis; s2++)
                row[s2] *= scale;
            pi2_k_softmax(row, vis);
        }
        pi2_k_sgemv_t_group(V, hd, hd, vis, S, vis, G, e->att + t * qd + h0 * hd, hd);
    }
}

/* The units shared out between the threads (eng_run_units). */
static void attn_fn(void *ctx, int tid, int nt)
{
    const attn_job *j = ctx;
    float *S = j->e->tls[tid].scores; /* a unit's heads' scores, [G][vis] */
    for (int64_t u; (u = eng_share_next(j->e, tid, nt)) >= 0;)
        attn_unit(j, u, S, j->e->tls[tid].kvrows);
}

/* ---- one token's q, k, v, rotary and attention in one job ---- */

enum { QKVA_MAX_KV = 64 }; /* KV heads the one-job path takes (more: the three jobs) */

/* The rows of k, v and q in that order (each matrix's in its own order, so
 * that they stream as in three jobs): the groups of KV heads, each a KV
 * head's key and value rows and its query heads' rows, then complete one
 * after the other as the query rows do, and their attention can start
 * without a barrier after the matmuls. Whoever completes a group's rows
 * applies its rotary; an attention unit waits for its group alone. Each
 * row and each unit computes what the three jobs computed: the same
 * bits. */
typedef struct qkva_job {
    mm_job mm;                      /* t[0..2]: k, v (the new position's rows), q */
    attn_job aj;
    int64_t hd, group, per;         /* head size, query heads per KV head, rows of a group */
    int64_t rows, units2;           /* k's, v's and q's rows; attention units */
    _Atomic int64_t done[QKVA_MAX_KV]; /* rows of each group computed */
    _Atomic bool ready[QKVA_MAX_KV];   /* each group's rows computed and rotated */
    _Atomic int64_t next2;             /* the next attention unit */
} qkva_job;

/* Group kh's rows all computed: its query heads and key rotated, its key
 * and value into the cache. */
static void qkva_rotate(const qkva_job *j, int64_t kh)
{
    const pi2_engine *e = j->aj.e;
    int hd = (int)j->hd;
    pi2_op_rope(e->q + kh * j->group * j->hd, (int)j->group, hd, e->rope_cs, e->rope_sn);
    pi2_op_rope(j->mm.t[0].out + kh * j->hd, 1, hd, e->rope_cs, e->rope_sn);
    kv_store(e, j->aj.l, j->aj.pos, 1, j->mm.t[0].out, j->mm.t[1].out, kh, kh + 1);
}

/* Rows [b, en) of k, v and q end to end computed: counted by group, and
 * a group that is complete rotated and announced. */
static void qkva_count(qkva_job *j, int64_t b, int64_t en)
{
    int64_t kvd = j->mm.t[0].m->rows;
    while (b < en) {
        int64_t r = b < 2 * kvd ? b % kvd : b - 2 * kvd, span = b < 2 * kvd ? j->hd : j->group * j->hd;
        int64_t kh = r / span, n = span - r % span;
        n = n < en - b ? n : en - b;
        if (atomic_fetch_add_explicit(&j->done[kh], n, memory_order_acq_rel) + n == j->per) {
            qkva_rotate(j, kh);
            atomic_store_explicit(&j->ready[kh], true, memory_order_release);
        }
        b += n;
    }
}

static void qkva_fn(void *ctx, int tid, int nt)
{
    qkva_job *j = ctx;
    pi2_engine *e = j->aj.e;
    for (int64_t u; (u = eng_share_next(e, tid, nt)) >= 0;) {
        int64_t b = u * MM_UNIT, en = b + MM_UNIT < j->rows ? b + MM_UNIT : j->rows;
        const uint8_t *pf = NULL;
        int64_t pf_len = 0;
        if (e->ahead)
            unit_ahead(&j->mm, u + 1, &pf, &pf_len);
        mm_range(&j->mm, b, en, pf, pf_len);
        qkva_count(j, b, en);
    }
    /* every row is taken: the groups complete as the rows in flight do */
    float *S = e->tls[tid].scores;
    int64_t per_kv = j->units2 / (int64_t)e->d.n_kv_heads;
    for (int64_t u; (u = atomic_fetch_add_explicit(&j->next2, 1, memory_order_relaxed)) < j->units2;) {
        for (long i = 0; !atomic_load_explicit(&j->ready[u / per_kv], memory_order_acquire);)
            pi2_pool_spin(&i);
        attn_unit(&j->aj, u, S, e->tls[tid].kvrows);
    }
}

/* Layer l's q, k, v, rotary and attention for one token at pos (its
 * normed input quantized); false when the model has more KV heads than
 * the one-job path takes. */
static bool qkv_attend_one(pi2_engine *e, int l, int pos, float *kc, float *vc)
{
    const pi2_model_desc *d = &e->d;
    const eng_layer *L = &e->layers[l];
    if (d->n_kv_heads > QKVA_MAX_KV)
        return false;
    int64_t hd = d->head_dim, qd = d->n_heads * hd, kvd = d->n_kv_heads * hd;
    qkva_job j = {.mm = {.n = 3, .T = 1, .xf = e->xb, .ldx = d->hidden, .e = e}, .aj = {e, l, 1, pos}, .hd = hd,
                  .group = d->n_heads / d->n_kv_heads, .units2 = attn_units(d)};
    j.mm.t[0] = (mm_task){&L->k, kc, kvd};
    j.mm.t[1] = (mm_task){&L->v, vc, kvd};
    j.mm.t[2] = (mm_task){&L->q, e->q, qd};
    j.per = (j.group + 2) * hd;
    j.rows = 2 * kvd + qd;
    for (int kh = 0; kh < d->n_kv_heads; kh++) {
        atomic_init(&j.done[kh], 0);
        atomic_init(&j.ready[kh], false);
    }
    atomic_init(&j.next2, 0);
    eng_run_units(e, (j.rows + MM_UNIT - 1) / MM_UNIT, qkva_fn, &j);
    return true;
}

/* ---- FFN: through its source (runtime/ffn_source.h) ---- */

/* Decode FFN for the token whose normed input is x = e->xb (quantized in
 * the activation buffers) and whose residual before the norm is e->x;
 * out = FFN(x) (accumulate: out += w * FFN(x)). The predictor reads the
 * vector its manifest entry names. */
static int ffn_decode(pi2_engine *e, const eng_ffn *f, const float *x, float *out, bool accumulate, float w,
                      pi2_err *err)
{
    int mode = FFN_DENSE;
    uint32_t n_sel = 0;
    if (!e->dense && f->has_pred) {
        mode = FFN_PRED;
        n_sel = eng_predict(e, f, f->pred_prenorm ? e->x : x, e->sel);
    } else if (!e->dense && f->has_silu_thr) {
        mode = FFN_THRESH;
    }
    return e->ffn->decode(e, f, n_sel, mode, out, accumulate, w, err);
}

/* ---- MoE ---- */

/* Decode statistics of layer l's choices: reuse of the previous token's
 * experts (position pos - 1) and the read-ahead's guess. */
static void moe_count(pi2_engine *e, int l, int pos)
{
    int k = e->d.n_experts_used;
    const int *ch = e->chosen, *prev = e->moe_prev + (size_t)l * k, *g = e->moe_guess + (size_t)l * k;
    for (int r = 0; r < k; r++) {
        e->st.moe_choices++;
        for (int j = 0; j < k; j++) {
            e->st.moe_reused += e->moe_prev_pos == pos - 1 && prev[j] == ch[r];
            e->st.moe_guessed += g[j] == ch[r];
        }
        e->st.moe_guesses += g[r] >= 0;
    }
}

/* FFN of T tokens at positions pos.. of layer l: input xb [T][D] (normed),
 * output xb2 [T][D]. */
static int ffn_block(pi2_engine *e, int l, int T, int pos, bool decode, pi2_err *err)
{
    const pi2_model_desc *d = &e->d;
    const eng_layer *L = &e->layers[l];
    int64_t D = d->hidden;
    int rc;
    if (!pi2_desc_is_moe(d)) {
        if (decode) {
            quant_in(e, e->xb, D, T, D, 0);
            return ffn_decode(e, &L->ffn[0], e->xb, e->xb2, false, 0.0f, err);
        }
        tok_job q = {.e = e, .kind = TOK_FFN_Q, .T = T, .src = e->xb, .f = &L->ffn[0]};
        run_tok(&q);
        return e->ffn->prefill(e, &L->ffn[0], T, e->xb2, false, 0.0f, err);
    }
    int k = d->n_experts_used;
    for (int t = 0; t < T; t++)
        eng_route(e, L->router, e->xb + t * D, e->chosen + (size_t)t * k, e->moe_wk + (size_t)t * k);
    if (decode)
        moe_count(e, l, pos);
    memcpy(e->moe_prev + (size_t)l * k, e->chosen + (size_t)(T - 1) * k, (size_t)k * sizeof(int));
    for (int r = 0; r < k; r++)
        e->moe_guess[(size_t)l * k + r] = -1;
    memset(e->xb2, 0, (size_t)T * (size_t)D * sizeof(float));
    if (decode) {
        quant_in(e, e->xb, D, 1, D, 0);
        for (int r = 0; r < k; r++)
            if ((rc = ffn_decode(e, &L->ffn[e->chosen[r]], e->xb, e->xb2, true, e->moe_wk[r], err)) != 0)
                return rc;
        return 0;
    }
    for (int x = 0; x < d->n_experts; x++) {
        int n = 0;
        for (int t = 0; t < T; t++)
            for (int r = 0; r < k; r++)
                if (e->chosen[(size_t)t * k + r] == x) {
                    e->moe_tok[n] = t;
                    e->moe_w[n] = e->moe_wk[(size_t)t * k + r];
                    memcpy(e->moe_x + (size_t)n * D, e->xb + (size_t)t * D, (size_t)D * sizeof(float));
                    n++;
                }
        if (n == 0) {
            if ((rc = e->ffn->skip(e, &L->ffn[x], err)) != 0)
                return rc;
            continue;
        }
        tok_job q = {.e = e, .kind = TOK_FFN_Q, .T = n, .src = e->moe_x, .f = &L->ffn[x]};
        run_tok(&q);
        if ((rc = e->ffn->prefill(e, &L->ffn[x], n, e->moe_out, false, 0.0f, err)) != 0)
            return rc;
        for (int i = 0; i < n; i++) {
            float *o = e->xb2 + (size_t)e->moe_tok[i] * D;
            const float *src = e->moe_out + (size_t)i * D;
            for (int64_t c = 0; c < D; c++)
                o[c] += e->moe_w[i] * src[c];
        }
    }
    return 0;
}

/* ---- the forward pass ---- */

/* logits = head x for x = e->xb (D values). The int8 quantization of x
 * puts its rounding straight into every logit: on tinystories-656k at q8
 * it moved them by up to 0.06 and flipped a greedy step the fp32 model
 * wins by 0.06 (the weights alone, dequantized, do not). So the
 * ENG_HEAD_TOP largest logits get a second term: what x's quantization
 * left, x - s1 q1, quantized in turn and dotted with their rows, as if x
 * were quantized to about 15 bits. Those are the tokens greedy decoding,
 * top-k and top-p choose among; the rest keep the one-term logit. A
 * second term for every row (the matmul at T = 2) would read the head
 * twice (its cost: runtime/PERF.md). */
static void run_head(pi2_engine *e, float *logits)
{
    const pi2_model_desc *d = &e->d;
    int64_t D = d->hidden, nb = D / PI2_Q_GROUP;
    mm_job hj = {.n = 1, .T = 1, .xf = e->xb, .ldx = D, .e = e};
    hj.t[0] = (mm_task){&e->head, logits, d->vocab};
    if (e->head.qt == PI2_QT_F32) {
        run_mm(e, &hj);
        return;
    }
    quant_in(e, e->xb, D, 1, D, 0);
    run_mm(e, &hj);
    float *rest = e->xb2;
    for (int64_t i = 0; i < D; i++)
        rest[i] = e->xb[i] - e->aqs[i / PI2_Q_GROUP] * (float)e->aq[i];
    pi2_k_act_quantize(rest, D, 1, D, e->aqs + nb, e->aq + D, e->asum + nb);
    int k = d->vocab < ENG_HEAD_TOP ? d->vocab : ENG_HEAD_TOP;
    int32_t top[ENG_HEAD_TOP];
    const uint8_t *rp[ENG_HEAD_TOP];
    const uint16_t *rs[ENG_HEAD_TOP];
    float add[ENG_HEAD_TOP];
    pi2_op_top_k(logits, d->vocab, k, top);
    for (int i = 0; i < k; i++) {
        rp[i] = e->head.rp[top[i]];
        rs[i] = e->head.rs[top[i]];
    }
    pi2_k_matmul(e->head.qt, D, k, rp, rs, e->aqs + nb, e->aq + D, e->asum + nb, 1, add, k);
    for (int i = 0; i < k; i++)
        logits[top[i]] += add[i];
}

/* The tokens' embeddings into e->x and the rotary tables of positions
 * pos .. pos + T - 1. */
static void embed_tokens(pi2_engine *e, const int32_t *tokens, int T, int pos)
{
    const pi2_model_desc *d = &e->d;
    int64_t D = d->hidden, hd = d->head_dim;
    for (int t = 0; t < T; t++)
        pi2_q_dequantize_row(e->embed.qt, e->embed.rs[tokens[t]], e->embed.rp[tokens[t]], D, e->x + t * D);
    int64_t half = hd / 2;
    for (int t = 0; t < T; t++) {
        const float *f = e->inv_freq; /* the reference's: dynamic NTK past max_pos per position */
        if (pi2_rope_varies(d, pos + t)) {
            pi2_rope_inv_freq(d, pos + t, e->inv_freq + half);
            f = e->inv_freq + half;
        }
        for (int64_t i = 0; i < half; i++) {
            float angle = (float)(pos + t) * f[i];
            e->rope_cs[t * half + i] = cosf(angle);
            e->rope_sn[t * half + i] = sinf(angle);
        }
    }
}

/* Layer l's attention block for T tokens at pos: norm, q/k/v, rotary (k
 * and v into the cache), attention, output projection, then the residual
 * add and the FFN's norm. *tj is left for the residual add after the FFN. */
static void attention(pi2_engine *e, int l, int T, int pos, tok_job *tj)
{
    const pi2_model_desc *d = &e->d;
    const eng_layer *L = &e->layers[l];
    int64_t D = d->hidden, hd = d->head_dim, qd = d->n_heads * hd, kvd = d->n_kv_heads * hd;
    /* the new keys and values, [T][kvd] each after the queries, until they
     * are rotated and stored (kv_store) */
    float *kc = e->q + (size_t)T * (size_t)qd, *vc = kc + (size_t)T * (size_t)kvd;
    *tj = (tok_job){.e = e, .kind = TOK_NORM_Q, .T = T, .w = L->attn_norm, .kc = kc, .qd = qd, .kvd = kvd, .hd = hd};
    run_tok(tj);
    if (T != 1 || !qkv_attend_one(e, l, pos, kc, vc)) {
        mm_job j = {.n = 3, .T = T, .xf = e->xb, .ldx = D, .e = e};
        j.t[0] = (mm_task){&L->q, e->q, qd};
        j.t[1] = (mm_task){&L->k, kc, kvd};
        j.t[2] = (mm_task){&L->v, vc, kvd};
        run_mm(e, &j);
        tj->kind = TOK_ROPE;
        run_tok(tj);
        kv_store(e, l, pos, T, kc, vc, 0, d->n_kv_heads);
        attn_job aj = {e, l, T, pos};
        eng_run_units(e, attn_units(d), attn_fn, &aj);
    }
    tj->kind = TOK_QUANT;
    tj->src = e->att;
    tj->n = qd;
    run_tok(tj);
    mm_job oj = {.n = 1, .T = T, .xf = e->att, .ldx = qd, .e = e};
    oj.t[0] = (mm_task){&L->o, e->xb2, D};
    run_mm(e, &oj);
    tj->kind = TOK_RES_NORM;
    tj->w = L->ffn_norm;
    run_tok(tj);
}

int eng_forward(pi2_engine *e, const int32_t *tokens, int T, int pos, bool decode, float *logits, pi2_err *err)
{
    const pi2_model_desc *d = &e->d;
    for (int t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= d->vocab)
            return pi2_err_set(err, PI2_ERANGE, "%s: token id %d out of range [0, %d)", e->path, tokens[t],
                               d->vocab);
    if (pos < 0 || pos > e->n_pos || pos + T > e->ctx)
        return pi2_err_set(err, PI2_ERANGE, "%s: positions %d..%d out of range (cache holds %d of %d)", e->path, pos,
                           pos + T - 1, e->n_pos, e->ctx);
    int64_t D = d->hidden, kvd = (int64_t)d->n_kv_heads * d->head_dim;
    e->n_pos = pos; /* rewind */
    int rc;
    if ((rc = e->ffn->begin_pass(e, decode, err)) != 0)
        return rc;
    embed_tokens(e, tokens, T, pos);
    uint64_t bytes = 0;
    for (int l = 0; l < d->n_layers; l++) {
        const eng_layer *L = &e->layers[l];
        tok_job tj;
        /* the layer's streamed weights ready; the FFN's source may start
         * fetching while the attention computes */
        rc = e->ffn->layer_begin(e, l, decode, err);
        if (rc == 0 && decode)
            rc = e->ffn->layer_ahead(e, l, e->x, err);
        if (rc == 0) {
            attention(e, l, T, pos, &tj);
            rc = ffn_block(e, l, T, pos, decode, err);
        }
        if (rc != 0) {
            e->ffn->end_pass(e, decode);
            e->n_pos = pos; /* this step's cache entries are incomplete */
            e->moe_prev_pos = -1;
            return rc;
        }
        tj.kind = TOK_RES;
        run_tok(&tj);
        if (decode) {
            bytes += (uint64_t)L->q.rows * L->q.row_bytes + (uint64_t)L->k.rows * L->k.row_bytes +
                     (uint64_t)L->v.rows * L->v.row_bytes + (uint64_t)L->o.rows * L->o.row_bytes;
            e->st.kv_bytes += 2ull * (uint64_t)(pos + 1) * (uint64_t)kvd * (e->kv_f16 ? 2u : 4u);
            if (pi2_desc_is_moe(d))
                bytes += (uint64_t)d->n_experts * (uint64_t)D * 4;
        }
    }
    e->ffn->end_pass(e, decode);
    e->n_pos = pos + T;
    e->moe_prev_pos = pos + T - 1;
    if (logits) {
        const float *last = e->x + (T - 1) * D;
        pi2_op_rmsnorm(e->xb, last, e->out_norm, (int)D, d->rms_eps);
        run_head(e, logits);
        if (decode)
            bytes += (uint64_t)e->head.rows * e->head.row_bytes;
    }
    if (decode) {
        e->st.tokens++;
        e->st.weight_bytes += bytes + e->embed.row_bytes;
    }
    return 0;
}
