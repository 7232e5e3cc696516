/* pi2 engine: the FFN's computation, both sources' (contract: runtime/ffn.h). */
#include "runtime/ffn.h"
#include "runtime/mathops.h"

#include <math.h>
#include <string.h>

ffn_dec ffn_dec_of(const pi2_engine *e, const eng_ffn *f, int mode)
{
    return (ffn_dec){.f = f,
                     .mode = mode,
                     .act = e->d.act,
                     .act_param = e->d.act_param,
                     .gate_thr = pi2_desc_gate_threshold(&e->d),
                     .D = e->d.hidden,
                     .aqs = e->aqs,
                     .aq = e->aq,
                     .asum = e->asum};
}

void ffn_chunk_gate(const ffn_dec *d, eng_tls *s, const uint32_t *idx, int n)
{
    const eng_ffn *f = d->f;
    for (int k = 0; k < n; k++) {
        s->pp[k] = f->gate.rp[idx[k]];
        s->ps[k] = f->gate.rs[idx[k]];
    }
    pi2_k_matmul(f->gate.qt, d->D, n, s->pp, s->ps, d->aqs, d->aq, d->asum, 1, s->g, 1);
}

/* The activations of the m neurons whose gates are g[pick[r]] and up rows
 * s->u[r] (pick NULL: r itself), and the down columns of those that count
 * (FFN_THRESH: at least the threshold; zeros only when keep_zeros), added
 * in that order into out = 0. Neuron of position k: idx[k], or first + k. */
static int chunk_down(const ffn_dec *d, eng_tls *s, const uint32_t *idx, uint32_t first, const float *g,
                      const uint32_t *pick, int m, bool keep_zeros, float *out, const uint8_t *pf, int64_t pf_len)
{
    const eng_ffn *f = d->f;
    int a = 0;
    for (int r = 0; r < m; r++) {
        uint32_t k = pick ? pick[r] : (uint32_t)r;
        float v = pi2_op_act(d->act, g[k], s->u[r], d->act_param);
        if (d->mode == FFN_THRESH && !(fabsf(v) >= f->silu_thr))
            continue;
        if (!keep_zeros && v == 0.0f)
            continue;
        uint32_t i = idx ? idx[k] : first + k;
        s->pp2[a] = f->down.rp[i];
        s->ps2[a] = f->down.rs[i];
        s->coef[a] = v;
        a++;
    }
    memset(out, 0, (size_t)d->D * sizeof(float));
    /* int8 down projection; in order: over whole aligned groups of 16
     * neurons (the same groups as prefill's); picks: groups of 16 active
     * columns (gathered from all over: twice the float axpy's speed) */
    if (a > 0)
        eng_down_rows(f->down.qt, d->D, a, s->coef, s->pp2, s->ps2, out, pf, pf_len);
    return a;
}

int ffn_chunk_updown(const ffn_dec *d, eng_tls *s, const uint32_t *idx, const float *g, const uint32_t *pick, int m,
                     float *out)
{
    const eng_ffn *f = d->f;
    for (int r = 0; r < m; r++) {
        uint32_t i = idx[pick[r]];
        s->pp[r] = f->up.rp[i];
        s->ps[r] = f->up.rs[i];
    }
    if (m > 0)
        pi2_k_matmul(f->up.qt, d->D, m, s->pp, s->ps, d->aqs, d->aq, d->asum, 1, s->u, 1);
    return chunk_down(d, s, idx, 0, g, pick, m, false, out, NULL, 0);
}

/* Every neuron in order, each with its up row: one pass over the gate and
 * up rows side by side (g0 u0 g1 u1 ...: 2 of every 3 rows of a bundle)
 * instead of a gate pass and an up pass over every third row. */
static ffn_counts chunk_in_order(const ffn_dec *d, eng_tls *s, uint32_t first, int n, float *out, const uint8_t *pf,
                                 int64_t pf_len)
{
    const eng_ffn *f = d->f;
    for (int k = 0; k < n; k++) {
        uint32_t i = first + (uint32_t)k;
        s->pp[2 * k] = f->gate.rp[i];
        s->ps[2 * k] = f->gate.rs[i];
        s->pp[2 * k + 1] = f->up.rp[i];
        s->ps[2 * k + 1] = f->up.rs[i];
    }
    int64_t pf_gu = pf_len / 3 * 2 / 64 * 64; /* the down pass brings the rest */
    pi2_k_matmul_pf(f->gate.qt, d->D, 2 * n, s->pp, s->ps, d->aqs, d->aq, d->asum, 1, s->g, 1, pf, pf_gu);
    for (int k = 0; k < n; k++)
        s->u[k] = s->g[2 * k + 1];
    for (int k = 0; k < n; k++)
        s->g[k] = s->g[2 * k];
    int a = chunk_down(d, s, NULL, first, s->g, NULL, n, d->mode == FFN_DENSE, out, pf ? pf + pf_gu : NULL,
                       pf_len - pf_gu);
    return (ffn_counts){n, n, a};
}

ffn_counts ffn_chunk(const ffn_dec *d, eng_tls *s, const uint32_t *idx, uint32_t first, int n, float *out,
                     const uint8_t *pf, int64_t pf_len)
{
    if (!idx)
        return chunk_in_order(d, s, first, n, out, pf, pf_len);
    ffn_chunk_gate(d, s, idx, n);
    /* the ReLU family: the gate alone decides (FATReLU: above its threshold) */
    bool filter = d->act != PI2_ACT_SILU;
    int m = 0;
    for (int k = 0; k < n; k++)
        if (!filter || s->g[k] > d->gate_thr)
            s->list2[m++] = (uint32_t)k;
    int a = ffn_chunk_updown(d, s, idx, s->g, s->list2, m, out);
    return (ffn_counts){n, m, a};
}

void eng_down_rows(pi2_qtype qt, int64_t D, int a, const float *coef, const uint8_t *const *wp,
                   const uint16_t *const *ws, float *out, const uint8_t *pf, int64_t pf_len)
{
    if (qt == PI2_QT_Q4 || qt == PI2_QT_Q8)
        pi2_k_down_rows_pf(qt, D, a, coef, a, wp, ws, 1, out, D, pf, pf_len);
    else
        pi2_k_axpy_rows(qt, D, a, coef, wp, ws, out);
}

/* out[i] for i in [b, en) = the sum over r < n of base[row_r * stride + i]
 * (row_r = rows[r], or r when rows is NULL), added in that order from 0
 * (accumulate: out[i] += w * sum). Column tiles keep the reads sequential
 * and the adds vectorised; every sum is the same as element by element. */
void eng_sum_rows(float *out, const float *base, int64_t stride, const uint32_t *rows, int64_t n, int64_t b, int64_t en,
                  bool accumulate, float w)
{
    enum { TILE = 256 };
    float acc[TILE];
    for (int64_t i0 = b; i0 < en; i0 += TILE) {
        int m = (int)(en - i0 < TILE ? en - i0 : TILE);
        memset(acc, 0, sizeof acc);
        for (int64_t r = 0; r < n; r++) {
            const float *src = base + (rows ? (int64_t)rows[r] : r) * stride + i0;
            if (m == TILE) /* a constant count: the compiler's vector adds */
                for (int k = 0; k < TILE; k++)
                    acc[k] += src[k];
            else
                for (int k = 0; k < m; k++)
                    acc[k] += src[k];
        }
        for (int k = 0; k < m; k++)
            out[i0 + k] = accumulate ? out[i0 + k] + w * acc[k] : acc[k];
    }
}

/* ---- FFN prefill: dense, T tokens, tiles of neurons ----
 *
 * Tile k = neurons [k ENG_TILE, (k + 1) ENG_TILE). The tiles run in waves
 * of one a thread: each thread computes its tile's gate, up and
 * activations into its own buffer, then every thread adds the wave's
 * tiles' down products, in tile order, into its own slice of the output
 * columns of one sum (tls[0].part). So every output value is the sum of
 * the tiles in tile order whatever the thread count (the down kernels'
 * sums are per 32-value output block: a slice of the columns gives those
 * columns' bits), and a range cut at tile boundaries (the offloading
 * prefill's windows) adds the same tiles in the same order. */

typedef struct ffn_pre_job {
    pi2_engine *e;
    const eng_ffn *f;
    int T;
    int64_t n0, n1; /* neurons */
    int64_t tk0;    /* the wave's first tile */
} ffn_pre_job;

/* Tile tk's neurons [*c, *c + return) within the range (0: none). */
static int pre_tile(const ffn_pre_job *j, int64_t tk, int64_t *c)
{
    *c = tk * ENG_TILE > j->n0 ? tk * ENG_TILE : j->n0;
    int64_t en = (tk + 1) * ENG_TILE < j->n1 ? (tk + 1) * ENG_TILE : j->n1;
    return en > *c ? (int)(en - *c) : 0;
}

/* Phase 1: thread tid's tile of the wave, gate and up, then activations
 * into its gt. */
static void pre_gate_up_fn(void *ctx, int tid, int nt)
{
    (void)nt;
    const ffn_pre_job *j = ctx;
    pi2_engine *e = j->e;
    const eng_ffn *f = j->f;
    eng_tls *s = &e->tls[tid];
    int64_t c, D = e->d.hidden;
    int nc = pre_tile(j, j->tk0 + tid, &c), T = j->T;
    if (nc == 0)
        return;
    if (ffn_sb(f)) {
        pi2_k_matmul_sb(D, nc, f->gate.rp + c, f->gate.rs + c, e->aqs, e->aq, e->asum, T, s->gt, ENG_TILE);
        pi2_k_matmul_sb(D, nc, f->up.rp + c, f->up.rs + c, e->aqs, e->aq, e->asum, T, s->ut, ENG_TILE);
    } else {
        pi2_k_matmul(f->gate.qt, D, nc, f->gate.rp + c, f->gate.rs + c, e->aqs, e->aq, e->asum, T, s->gt, ENG_TILE);
        pi2_k_matmul(f->up.qt, D, nc, f->up.rp + c, f->up.rs + c, e->aqs, e->aq, e->asum, T, s->ut, ENG_TILE);
    }
    for (int t = 0; t < T; t++)
        pi2_op_act_rows(e->d.act, s->gt + t * ENG_TILE, s->ut + t * ENG_TILE, nc, e->d.act_param);
}

/* Phase 2: the wave's tiles' down products, in tile order, into thread
 * tid's slice of the output columns. Q4 rows take the requantized GEMM
 * (faster than the per-block int8 down of decode on AVX-512 VNNI,
 * runtime/PERF.md; its weight rounding is 1/31.75 of a Q4 step), on every
 * ISA so that every path gives the same bits. Q8 rows keep
 * pi2_k_down_rows (the same bits on every path too): requantizing them
 * costs a whole Q8 step, which moved the tinystories golden tokens. */
static void pre_down_fn(void *ctx, int tid, int nt)
{
    const ffn_pre_job *j = ctx;
    pi2_engine *e = j->e;
    const eng_ffn *f = j->f;
    eng_tls *s = &e->tls[tid];
    int64_t D = e->d.hidden, b0, b1, ld = ENG_PART_LD(D);
    pi2_pool_split(D / PI2_Q_GROUP, 1, tid, nt, &b0, &b1);
    if (b1 <= b0)
        return;
    size_t pb = pi2_q_payload_row_bytes(f->down.qt, PI2_Q_GROUP);
    for (int k = 0; k < nt; k++) {
        int64_t c;
        int nc = pre_tile(j, j->tk0 + k, &c);
        for (int r = 0; r < nc; r++) {
            s->pp2[r] = f->down.rp[c + r] + (size_t)b0 * pb;
            s->ps2[r] = f->down.rs[c + r] + b0;
        }
        const float *gt = e->tls[k].gt;
        float *out = e->tls[0].part + b0 * PI2_Q_GROUP;
        int64_t n = (b1 - b0) * PI2_Q_GROUP;
        if (nc > 0 && f->down.qt == PI2_QT_Q4)
            pi2_k_down_gemm(f->down.qt, n, nc, gt, ENG_TILE, s->pp2, s->ps2, j->T, out, ld);
        else if (nc > 0)
            pi2_k_down_rows(f->down.qt, n, nc, gt, ENG_TILE, s->pp2, s->ps2, j->T, out, ld);
    }
}

/* Dense prefill FFN of T tokens whose normed input is quantized in the
 * engine's activation buffers: neurons [n0, n1) added into the sum
 * (first: the sum zeroed first), two pool runs a wave. */
void eng_ffn_prefill_range(pi2_engine *e, const eng_ffn *f, int T, uint32_t n0, uint32_t n1, bool first)
{
    int64_t D = e->d.hidden;
    int nt = pi2_pool_size(e->pool);
    if (first)
        memset(e->tls[0].part, 0, (size_t)T * (size_t)ENG_PART_LD(D) * sizeof(float));
    ffn_pre_job j = {e, f, T, n0, n1, 0};
    for (j.tk0 = n0 / ENG_TILE; j.tk0 * ENG_TILE < (int64_t)n1; j.tk0 += nt) {
        pi2_pool_run(e->pool, pre_gate_up_fn, &j);
        pi2_pool_run(e->pool, pre_down_fn, &j);
    }
}

/* eng_ffn_reduce's job: out [T][D] = the sum (accumulate: out += w * the
 * sum), its values shared out between the threads. */
typedef struct reduce_job {
    pi2_engine *e;
    int T;
    int64_t D;
    float *out; /* [T][D] */
    float w;
    bool accumulate;
} reduce_job;

static void reduce_fn(void *ctx, int tid, int nt)
{
    reduce_job *j = ctx;
    int64_t D = j->D, n = (int64_t)j->T * D, b, en;
    pi2_pool_split(n, 64, tid, nt, &b, &en);
    const float *sum = j->e->tls[0].part;
    for (int64_t i = b; i < en;) { /* row pieces: the sum's rows are ENG_PART_LD(D) apart */
        int64_t c = i % D, m = en - i < D - c ? en - i : D - c;
        const float *q = sum + i / D * ENG_PART_LD(D) + c;
        float *o = j->out + i;
        for (int64_t k = 0; k < m; k++) {
            float v = 0.0f + q[k]; /* -0 as +0: the bits of a sum from zero */
            o[k] = j->accumulate ? o[k] + j->w * v : v;
        }
        i += m;
    }
}

void eng_ffn_reduce(pi2_engine *e, int T, float *out, bool accumulate, float w)
{
    reduce_job r = {e, T, e->d.hidden, out, w, accumulate};
    pi2_pool_run(e->pool, reduce_fn, &r);
}
