/* pi2 engine: the decode FFN's chunk (contract: runtime/ffn.h). */
#include "runtime/ffn.h"

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
        float v = eng_act(d->act, g[k], s->u[r], d->act_param);
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
