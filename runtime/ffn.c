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

/* ---- FFN: reduce per-thread partial outputs ---- */

typedef struct reduce_job {
    pi2_engine *e;
    int T;
    int64_t D;
    float *out; /* [T][D] */
    float w;    /* out += w * sum (accumulate) or out = sum (w == 0 means assign) */
    bool accumulate;
} reduce_job;

static void reduce_fn(void *ctx, int tid, int nt)
{
    reduce_job *j = ctx;
    int64_t D = j->D, n = (int64_t)j->T * D, b, en;
    pi2_pool_split(n, 64, tid, nt, &b, &en);
    int threads = j->e->threads;
    float w = j->w;
    for (int64_t i = b; i < en;) { /* row pieces: the parts' rows are ENG_PART_LD(D) apart */
        int64_t c = i % D, m = en - i < D - c ? en - i : D - c, p = i / D * ENG_PART_LD(D) + c;
        float *restrict o = j->out + i; /* the parts are other buffers */
        int64_t k = 0;
        for (; k + 8 <= m; k += 8) { /* runs of a constant 8: vector adds */
            float s[8] = {0};
            for (int t = 0; t < threads; t++) {
                const float *q = j->e->tls[t].part + p + k;
                for (int u = 0; u < 8; u++)
                    s[u] += q[u];
            }
            if (j->accumulate)
                for (int u = 0; u < 8; u++)
                    o[k + u] += w * s[u];
            else
                for (int u = 0; u < 8; u++)
                    o[k + u] = s[u];
        }
        for (; k < m; k++) {
            float s = 0.0f;
            for (int t = 0; t < threads; t++)
                s += j->e->tls[t].part[p + k];
            o[k] = j->accumulate ? o[k] + w * s : s;
        }
        i += m;
    }
}

/* ---- FFN prefill: dense, T tokens, tiles of neurons ---- */

typedef struct ffn_pre_job {
    pi2_engine *e;
    const eng_ffn *f;
    int T;
    int64_t n0, n1; /* neurons */
    bool first;     /* zero the partial outputs first */
} ffn_pre_job;

static void ffn_pre_fn(void *ctx, int tid, int nt)
{
    ffn_pre_job *j = ctx;
    pi2_engine *e = j->e;
    const eng_ffn *f = j->f;
    eng_tls *s = &e->tls[tid];
    int T = j->T;
    int64_t D = e->d.hidden;
    if (j->first)
        memset(s->part, 0, (size_t)T * (size_t)ENG_PART_LD(D) * sizeof(float));
    /* the down projection: Q4 rows take the requantized GEMM (faster than
     * the per-block int8 down of decode on AVX-512 VNNI, runtime/PERF.md;
     * its weight rounding is 1/31.75 of a Q4 step), on every ISA so that
     * every path gives the same bits. Q8 rows keep pi2_k_down_rows (the
     * same bits on every path too): requantizing them costs a whole Q8
     * step, which moved the tinystories golden tokens. */
    bool gemm = f->down.qt == PI2_QT_Q4, sb = ffn_sb(f);
    /* tile k = neurons [k * ENG_TILE, (k + 1) * ENG_TILE) (within the
     * range) runs on thread k % nt: a range cut at tile boundaries (the
     * offloading prefill's windows) gives each thread the same tiles in
     * the same order as one whole range, so the same partial sums */
    for (int64_t tk = j->n0 / ENG_TILE; tk * ENG_TILE < j->n1; tk++) {
        if (tk % nt != tid)
            continue;
        int64_t c = tk * ENG_TILE > j->n0 ? tk * ENG_TILE : j->n0;
        int64_t en = (tk + 1) * ENG_TILE < j->n1 ? (tk + 1) * ENG_TILE : j->n1;
        int nc = (int)(en - c);
        if (sb) {
            pi2_k_matmul_sb(D, nc, f->gate.rp + c, f->gate.rs + c, e->aqs, e->aq, e->asum, T, s->gt, ENG_TILE);
            pi2_k_matmul_sb(D, nc, f->up.rp + c, f->up.rs + c, e->aqs, e->aq, e->asum, T, s->ut, ENG_TILE);
        } else {
            pi2_k_matmul(f->gate.qt, D, nc, f->gate.rp + c, f->gate.rs + c, e->aqs, e->aq, e->asum, T, s->gt,
                         ENG_TILE);
            pi2_k_matmul(f->up.qt, D, nc, f->up.rp + c, f->up.rs + c, e->aqs, e->aq, e->asum, T, s->ut, ENG_TILE);
        }
        for (int t = 0; t < T; t++)
            pi2_op_act_rows(e->d.act, s->gt + t * ENG_TILE, s->ut + t * ENG_TILE, nc, e->d.act_param);
        int64_t ld = ENG_PART_LD(D);
        if (gemm)
            pi2_k_down_gemm(f->down.qt, D, nc, s->gt, ENG_TILE, f->down.rp + c, f->down.rs + c, T, s->part, ld);
        else
            pi2_k_down_rows(f->down.qt, D, nc, s->gt, ENG_TILE, f->down.rp + c, f->down.rs + c, T, s->part, ld);
    }
}

/* Dense prefill FFN of T tokens whose normed input is quantized in the
 * engine's activation buffers; out [T][D] = FFN (accumulate: out += w *). */
void eng_ffn_prefill_range(pi2_engine *e, const eng_ffn *f, int T, uint32_t n0, uint32_t n1, bool first)
{
    ffn_pre_job j = {e, f, T, n0, n1, first};
    pi2_pool_run(e->pool, ffn_pre_fn, &j);
}

void eng_ffn_reduce(pi2_engine *e, int T, float *out, bool accumulate, float w)
{
    reduce_job r = {e, T, e->d.hidden, out, w, accumulate};
    pi2_pool_run(e->pool, reduce_fn, &r);
}
