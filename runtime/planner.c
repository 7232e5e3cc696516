/* pi2 execution planner: model profile, cost model, solver (planner.h). */
#include "runtime/plan_internal.h"

#include "bundle/layout.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
static uint64_t align_dn(uint64_t v, uint64_t a) { return v / a * a; }

/* ---- model profile ---- */

static uint64_t tensor_bytes(const pi2_mf_tensor *t)
{
    if (!t)
        return 0;
    if (t->qtype == PI2_QT_F32)
        return (uint64_t)t->rows * (uint64_t)t->cols * 4;
    return (uint64_t)t->rows *
           (pi2_q_payload_row_bytes(t->qtype, t->cols) + 2 * pi2_q_scale_row_count(t->qtype, t->cols));
}

/* Byte spans of a group's parts (offsets inside the slot) for neurons j0..j1
 * of the group (inclusive): gate units, up+down units, or whole neurons
 * (bundle/layout.h). */
static uint64_t span_bytes(const pi2_mprof *mp, int kind, uint32_t j0, uint32_t j1)
{
    uint64_t a, b;
    if (kind == 0) { /* one-phase whole neurons */
        a = j0 * mp->Ub;
        b = (j1 + 1) * mp->Ub;
    } else if (kind == 1) { /* gates (with the up and down scales) */
        a = j0 * mp->Gb;
        b = (j1 + 1) * mp->Gb;
    } else if (kind == 2) { /* up+down payloads */
        a = mp->Pg + j0 * mp->Ub;
        b = mp->Pg + (j1 + 1) * mp->Ub;
    } else { /* gate of j0 through up+down of j1 */
        a = j0 * mp->Gb;
        b = mp->Pg + (j1 + 1) * mp->Ub;
    }
    return align_up(b, PI2_BL_ALIGN) - align_dn(a, PI2_BL_ALIGN);
}

void pi2_mprof_free(pi2_mprof *mp)
{
    if (!mp)
        return;
    for (uint32_t i = 0; mp->ffn && i < mp->n_ffn; i++) {
        pi2_mprof_ffn *F = &mp->ffn[i];
        free(F->p);
        free(F->n);
        free(F->q);
        free(F->sp0);
        free(F->spg);
        free(F->spu);
    }
    free(mp->ffn);
    memset(mp, 0, sizeof *mp);
}

static int member_at(const pi2_manifest *mf, const char *name, const uint8_t *base, uint64_t base_len,
                     uint64_t want, const uint8_t **out, const char *file, pi2_err *err)
{
    const pi2_ctr_section *s = pi2_manifest_find_section(mf, name);
    if (!s)
        return pi2_err_set(err, PI2_ENOTFOUND, "%s: no member %s", file, name);
    if (s->size != want || s->offset > base_len || s->size > base_len - s->offset)
        return pi2_err_set(err, PI2_ESHAPE, "%s: member %s has %llu bytes, expected %llu in the resident region",
                           file, name, (unsigned long long)s->size, (unsigned long long)want);
    *out = base + s->offset;
    return 0;
}

/* Group figures of FFN F. The bundle grouped neurons by co-activation on
 * these very samples, so their joint counts flatter the grouping (with a
 * few hundred samples, in-sample co-activation is far above what new text
 * shows: PERF.md, Planner). Only the marginals carry over: each neuron is
 * selected with its sampled frequency (or its profiled activation
 * frequency without samples), independently. */
static void group_figures(const pi2_mprof *mp, pi2_mprof_ffn *F, uint64_t ns)
{
    double *f = pi2_calloc_array(F->neurons, sizeof *f);
    if (!f)
        return;
    if (F->bits && ns > 0) {
        for (uint64_t s = 0; s < ns; s++) {
            const uint64_t *row = F->bits + s * F->words;
            for (uint32_t w = 0; w < F->words; w++)
                for (uint64_t b = row[w]; b; b &= b - 1) {
                    uint32_t i = w * 64 + (uint32_t)__builtin_ctzll(b);
                    if (i < F->neurons)
                        f[i] += 1;
                }
        }
        for (uint32_t i = 0; i < F->neurons; i++)
            f[i] /= (double)ns;
    } else {
        for (uint32_t i = 0; i < F->neurons; i++)
            f[i] = F->freq ? F->freq[i] : F->fired / F->neurons;
    }
    double sel = 0;
    for (uint32_t i = 0; i < F->neurons; i++)
        sel += f[i];
    F->sel = sel;
    if (F->fired > F->sel)
        F->fired = F->sel;
    double phi = F->sel > 0 ? F->fired / F->sel : 0;
    for (uint32_t k = 0; k < F->groups; k++) {
        uint32_t i0 = k * F->group, i1 = i0 + F->group < F->neurons ? i0 + F->group : F->neurons, m = i1 - i0;
        double none = 1, nfire = 1, cnt = 0;
        for (uint32_t i = i0; i < i1; i++) {
            none *= 1 - f[i];
            nfire *= 1 - f[i] * phi;
            cnt += f[i];
        }
        F->p[k] = 1 - none;
        F->q[k] = 1 - nfire;
        F->n[k] = cnt;
        /* mean spans of a read, given it happens: exact over the subsets of
         * small groups, the whole group otherwise */
        double s0 = 0, sg = 0, su = 0, pu = 0;
        if (m <= 8 && F->p[k] > 0) { /* 2^m subsets per group: bounded start-up work */
            for (uint32_t mask = 1; mask < (1u << m); mask++) {
                double pr = 1, pf = 1;
                int first = -1, last = -1;
                for (uint32_t j = 0; j < m; j++) {
                    double fj = f[i0 + j];
                    if (mask >> j & 1) {
                        pr *= fj;
                        pf *= fj * phi;
                        if (first < 0)
                            first = (int)j;
                        last = (int)j;
                    } else {
                        pr *= 1 - fj;
                        pf *= 1 - fj * phi;
                    }
                }
                s0 += pr * (double)span_bytes(mp, mp->two_phase ? 3 : 0, (uint32_t)first, (uint32_t)last);
                sg += pr * (double)span_bytes(mp, 1, (uint32_t)first, (uint32_t)last);
                su += pf * (double)span_bytes(mp, 2, (uint32_t)first, (uint32_t)last);
                pu += pf;
            }
            F->sp0[k] = s0 / F->p[k];
            F->spg[k] = sg / F->p[k];
            F->spu[k] = pu > 0 ? su / pu : (double)span_bytes(mp, 2, 0, 0);
        } else {
            F->sp0[k] = (double)span_bytes(mp, mp->two_phase ? 3 : 0, 0, m ? m - 1 : 0);
            F->spg[k] = (double)span_bytes(mp, 1, 0, m ? m - 1 : 0);
            F->spu[k] = (double)span_bytes(mp, 2, 0, m ? m - 1 : 0);
        }
        if (!mp->two_phase)
            F->spu[k] = 0;
    }
    free(f);
}

/* The model-wide figures: shapes, the attention's and the head's bytes. */
static void model_figures(pi2_mprof *mp, const pi2_manifest *mf, const pi2_bundle_layout *bl)
{
    const pi2_model_desc *d = &mf->config;
    int E = d->n_experts > 0 ? d->n_experts : 1;
    mp->n_layers = d->n_layers;
    mp->experts = d->n_experts;
    mp->top_k = d->n_experts > 0 ? d->n_experts_used : 1;
    mp->hidden = d->hidden;
    mp->n_ff = d->n_ff;
    mp->ctx = 128;
    mp->n_ffn = (uint32_t)d->n_layers * (uint32_t)E;
    mp->two_phase = bl->two_phase;
    mp->q_ffn = mf->quant_ffn;
    mp->q_other = mf->quant_other;
    mp->R = bl->row_bytes;
    mp->kv_per_pos = 2ull * (uint64_t)d->n_kv_heads * (uint64_t)d->head_dim * 4;
    for (int r = PI2_T_Q; r <= PI2_T_O; r++)
        mp->attn_bytes += tensor_bytes(pi2_manifest_find_tensor(mf, (pi2_tname)r, 0, -1));
    const pi2_mf_tensor *head = pi2_manifest_find_tensor(mf, PI2_T_LM_HEAD, -1, -1);
    if (!head)
        head = pi2_manifest_find_tensor(mf, PI2_T_EMBED, -1, -1);
    mp->head_bytes = tensor_bytes(head);
    mp->q_head = head && head->qtype != PI2_QT_F32 ? head->qtype : mp->q_other;
}

/* Which activations FFN F's figures come from: the profile's sampled bits
 * (in the resident region at base), else its per-neuron frequencies, else
 * (F->bits and F->freq NULL) its active fraction alone. */
static int ffn_activations(pi2_mprof *mp, pi2_mprof_ffn *F, const pi2_mf_profile *pr, const pi2_manifest *mf,
                           const uint8_t *base, uint64_t base_len, const char *name, pi2_err *err)
{
    const uint8_t *p;
    int rc;
    if (pr && pr->bits[0] && pr->bit_samples > 0) {
        if ((rc = member_at(mf, pr->bits, base, base_len, pr->bit_samples * F->words * 8, &p, name, err)))
            return rc;
        F->bits = (const uint64_t *)(const void *)p;
        if (mp->samples == 0 || pr->bit_samples < mp->samples)
            mp->samples = pr->bit_samples;
        mp->bits_selected = mp->bits_selected && pr->bits_selected;
        return 0;
    }
    mp->bits_selected = false;
    if (pr && pr->freq[0]) {
        if ((rc = member_at(mf, pr->freq, base, base_len, (uint64_t)F->neurons * 4, &p, name, err)))
            return rc;
        F->freq = (const float *)(const void *)p;
    }
    return 0;
}

uint64_t pi2_plan_pred_bytes(const pi2_mf_predictor *p, int hidden, uint32_t neurons, pi2_qtype *qt)
{
    pi2_qtype t = pi2_mf_pred_qtype(p->dtype);
    if (t == PI2_QT_F32) /* quantized at open */
        t = PI2_QT_Q8;
    if (qt)
        *qt = t;
    int64_t R = p->rank, Rp = (R + PI2_Q_GROUP - 1) / PI2_Q_GROUP * PI2_Q_GROUP;
    uint64_t r1 = pi2_q_payload_row_bytes(t, hidden) + 2 * pi2_q_scale_row_count(t, hidden),
             r2 = pi2_q_payload_row_bytes(t, Rp) + 2 * pi2_q_scale_row_count(t, Rp);
    return (uint64_t)R * r1 + (uint64_t)neurons * r2;
}

/* FFN fi's figures from its bundled layout b: geometry (every FFN's slot
 * alike), predictor bytes, the per-group arrays group_figures fills, and
 * where its activations come from. */
static int ffn_figures(pi2_mprof *mp, uint32_t fi, const pi2_bl_ffn *b, const pi2_manifest *mf, const uint8_t *base,
                       uint64_t base_len, const char *name, pi2_err *err)
{
    pi2_mprof_ffn *F = &mp->ffn[fi];
    F->neurons = b->neurons;
    F->group = b->group;
    F->groups = b->groups;
    F->words = (b->neurons + 63) / 64;
    F->read_eff = isnan(b->read_eff) ? 0 : b->read_eff;
    if (fi == 0) {
        mp->S = b->slot_bytes;
        mp->Pg = b->gate_part;
        mp->Gb = b->gate_bytes;
        mp->Ub = b->bundle_bytes;
    } else if (b->slot_bytes != mp->S || b->gate_part != mp->Pg || b->gate_bytes != mp->Gb ||
               b->bundle_bytes != mp->Ub) {
        return pi2_err_set(err, PI2_EUNSUPPORTED, "%s: FFNs of different geometry", name);
    }
    mp->ffn_total += (uint64_t)b->groups * b->slot_bytes;
    const pi2_mf_layer *ml = pi2_manifest_find_layer(mf, b->layer, b->expert);
    if (ml && ml->has_predictor)
        F->pred_bytes = pi2_plan_pred_bytes(&ml->predictor, mf->config.hidden, b->neurons, &F->pred_qt);
    F->p = pi2_calloc_array(b->groups, sizeof *F->p);
    F->n = pi2_calloc_array(b->groups, sizeof *F->n);
    F->q = pi2_calloc_array(b->groups, sizeof *F->q);
    F->sp0 = pi2_calloc_array(b->groups, sizeof *F->sp0);
    F->spg = pi2_calloc_array(b->groups, sizeof *F->spg);
    F->spu = pi2_calloc_array(b->groups, sizeof *F->spu);
    if (!F->p || !F->n || !F->q || !F->sp0 || !F->spg || !F->spu)
        return pi2_err_set(err, PI2_ENOMEM, "out of memory for the model profile");
    const pi2_mf_profile *pr = pi2_manifest_find_profile(mf, b->layer, b->expert);
    F->fired = pr ? pr->active_frac * b->neurons : 0.5 * b->neurons;
    return ffn_activations(mp, F, pr, mf, base, base_len, name, err);
}

/* How often each FFN runs: dense 1; an expert top-k x its routing share
 * when the layer's profiled shares sum to 1, else top-k / experts. */
static void ffn_weights(pi2_mprof *mp, const pi2_manifest *mf, const pi2_bundle_layout *bl)
{
    const pi2_model_desc *d = &mf->config;
    for (uint32_t fi = 0; fi < mp->n_ffn; fi++) {
        const pi2_bl_ffn *b = &bl->ffn[fi];
        double sum = 0, share = NAN;
        for (int x = 0; x < d->n_experts; x++) {
            const pi2_mf_profile *pr = pi2_manifest_find_profile(mf, b->layer, x);
            sum += pr && !isnan(pr->route_share) ? pr->route_share : 0;
            if (pr && x == b->expert)
                share = pr->route_share;
        }
        mp->ffn[fi].w = d->n_experts == 0                      ? 1.0
                        : fabs(sum - 1) < 0.01 && !isnan(share) ? mp->top_k * share / sum
                                                                : (double)mp->top_k / d->n_experts;
    }
}

int pi2_mprof_build(pi2_mprof *mp, const pi2_manifest *mf, const pi2_bundle_layout *bl, const uint8_t *base,
                    uint64_t base_len, const char *name, pi2_err *err)
{
    memset(mp, 0, sizeof *mp);
    model_figures(mp, mf, bl);
    if (bl->n_ffn != mp->n_ffn || mp->n_ffn == 0)
        return pi2_err_set(err, PI2_ESHAPE, "%s: %zu bundled FFNs, the model has %u", name, bl->n_ffn, mp->n_ffn);
    mp->ffn = pi2_calloc_array(mp->n_ffn, sizeof *mp->ffn);
    if (!mp->ffn)
        return pi2_err_set(err, PI2_ENOMEM, "out of memory for the model profile");
    mp->bits_selected = true;
    pi2_plan_cal_defaults(&mp->cal);
    int rc = 0;
    for (uint32_t fi = 0; fi < mp->n_ffn && rc == 0; fi++)
        rc = ffn_figures(mp, fi, &bl->ffn[fi], mf, base, base_len, name, err);
    for (uint32_t fi = 0; fi < mp->n_ffn && rc == 0; fi++)
        group_figures(mp, &mp->ffn[fi], mp->ffn[fi].bits ? mp->samples : 0);
    if (rc == 0)
        ffn_weights(mp, mf, bl);
    if (rc)
        pi2_mprof_free(mp);
    return rc;
}

/* ---- plans ---- */

void pi2_plan_opts_defaults(pi2_plan_opts *o)
{
    memset(o, 0, sizeof *o);
    o->threads = 1;
    o->max_depth = 128;
    o->prompt = 128;
    o->min_gain = 0.08;
    o->gate_only = false;
}

int pi2_plan_alloc(pi2_plan *p, uint32_t n_ffn, pi2_err *err)
{
    memset(p, 0, sizeof *p);
    p->n_ffn = n_ffn;
    p->hot_groups = pi2_calloc_array(n_ffn ? n_ffn : 1, sizeof *p->hot_groups);
    p->gate_groups = pi2_calloc_array(n_ffn ? n_ffn : 1, sizeof *p->gate_groups);
    if (!p->hot_groups || !p->gate_groups) {
        pi2_plan_free(p);
        return pi2_err_set(err, PI2_ENOMEM, "out of memory for a plan");
    }
    return 0;
}

void pi2_plan_free(pi2_plan *p)
{
    if (!p)
        return;
    free(p->hot_groups);
    free(p->gate_groups);
    memset(p, 0, sizeof *p);
}

uint64_t plan_hot_bytes_of(const pi2_mprof *mp, uint32_t h, uint32_t g)
{
    return (uint64_t)h * mp->S + (mp->two_phase ? (uint64_t)(g - h) * mp->Pg : 0);
}

uint64_t pi2_plan_hot_bytes(const pi2_mprof *mp, const pi2_plan *p, uint32_t i)
{
    return plan_hot_bytes_of(mp, p->hot_groups[i], p->gate_groups[i]);
}

static uint64_t plan_hot_total(const pi2_mprof *mp, const pi2_plan *p)
{
    uint64_t t = 0;
    for (uint32_t i = 0; i < p->n_ffn; i++)
        t += pi2_plan_hot_bytes(mp, p, i);
    return t;
}

uint64_t plan_min_cache(const pi2_mprof *mp, const pi2_plan_mem *mem)
{
    return mem->min_slots * (mem->slot_bytes[0] + (mp->two_phase ? mem->slot_bytes[1] : 0));
}

/* ---- cost model ---- */

/* Seconds for n reads of `bytes` in all submitted together, at most
 * `depth` in flight: one read takes the latency at depth 1; up to the
 * deepest probed depth within `depth`, the time of a batch runs linearly
 * between the probed depths' (d / iops(d), never falling as d grows); past
 * it, the rest go at that depth's rate. Continuous and rising in n: with
 * the time of the probed depth at or below n instead, 3 reads cost 3 at
 * depth 1 and 4 reads 4 at depth 4, a third of it, and the solver moved
 * reads into fewer layers for a gain that did not show (PERF.md, Planner). */
static double io_time(const pi2_hwprof *hw, double n, double bytes, int depth)
{
    if (n <= 1e-9)
        return 0;
    uint32_t size = (uint32_t)(bytes / n);
    if (size < PI2_BL_ALIGN)
        size = PI2_BL_ALIGN;
    double t0 = pi2_hwprof_io_at(hw, size, 1).lat_us * 1e-6, d0 = 1, rate = t0 > 0 ? 1 / t0 : 0;
    if (n <= 1)
        return n * t0;
    for (int i = 0; i < PI2_HW_NDEPTHS; i++) {
        int d = PI2_HW_IO_DEPTHS[i];
        if (d <= 1)
            continue;
        if (d > depth)
            break;
        pi2_hw_io io = pi2_hwprof_io_at(hw, size, d);
        if (io.iops <= 0)
            break;
        double t = (double)d / io.iops;
        if (t < t0)
            t = t0;
        if (n <= d)
            return t0 + (t - t0) * (n - d0) / (d - d0);
        t0 = t, d0 = d, rate = io.iops;
    }
    return rate > 0 ? t0 + (n - d0) / rate : n * t0;
}

static double gemv_rate(const pi2_hw_compute *c, pi2_qtype q)
{
    return q == PI2_QT_Q4 ? c->gemv_q4 : c->gemv_q8;
}

#define CAL_PRIOR 0.25 /* weight of the prior in a factor (a run in memory weighs about 1) */

/* A learned factor for t threads from its sums (w, wk per thread count):
 * its own mean leaning by CAL_PRIOR on the mean over all thread counts,
 * which leans likewise on 1 (the profiles as measured). A thread count run
 * little or not at all takes the others' factor, and runs that say little
 * (a factor that hardly moves their time) move it little. */
static double cal_factor(const double *w, const double *wk, int t)
{
    double sw = 0, swk = 0;
    for (int i = 0; i < PI2_HW_MAX_THREADS; i++) {
        sw += w[i];
        swk += wk[i];
    }
    double prior = (swk + CAL_PRIOR) / (sw + CAL_PRIOR);
    if (t < 1 || t > PI2_HW_MAX_THREADS)
        return prior;
    return (wk[t - 1] + CAL_PRIOR * prior) / (w[t - 1] + CAL_PRIOR);
}

static double cal_compute(const pi2_plan_cal *c, int t)
{
    return cal_factor(c->s_w, c->s_wk, t);
}

static double cal_io(const pi2_plan_cal *c, int t)
{
    return cal_factor(c->s_io_w, c->s_io_wk, t);
}

cfg plan_cfg_make(const pi2_mprof *mp, int t, int depth, bool gf)
{
    return (cfg){ t, depth, gf, cal_compute(&mp->cal, t), cal_io(&mp->cal, t) };
}

/* Compute seconds of FFN fi per token where it runs (predictor + sparse rows). */
static double ffn_compute(const pi2_mprof *mp, const pi2_hwprof *hw, int t, uint32_t fi)
{
    const pi2_hw_compute *c = pi2_hwprof_compute(hw, t);
    const pi2_mprof_ffn *F = &mp->ffn[fi];
    const double *g = mp->q_ffn == PI2_QT_Q4 ? c->gather_q4_ns : c->gather_q8_ns;
    const double *dn = mp->q_ffn == PI2_QT_Q4 ? c->down_q4_ns : c->down_q8_ns;
    double row = pi2_hwprof_row_ns(g, mp->hidden) * 1e-9, drow = pi2_hwprof_row_ns(dn, mp->hidden) * 1e-9;
    return (double)F->pred_bytes / gemv_rate(c, F->pred_qt) + F->sel * row + F->fired * (row + drow);
}

/* Attention and the rest of a layer, per token. */
static double attn_compute(const pi2_mprof *mp, const pi2_hwprof *hw, int t)
{
    const pi2_hw_compute *c = pi2_hwprof_compute(hw, t);
    return (double)mp->attn_bytes / gemv_rate(c, mp->q_other) + (double)mp->ctx * mp->kv_per_pos / c->mem_bw;
}

/* Share of the shorter of compute and reads hidden under the other with t
 * compute threads: the hardware profile's, when the I/O thread has a core
 * of its own; none when t compute threads and the I/O thread share fewer
 * cores: then little of either hides (PERF.md, Planner). */
static double overlap_of(const pi2_mprof *mp, const pi2_hw_compute *hc, int t)
{
    return mp->cores > 0 && t + 1 > mp->cores ? 0.0 : hc->overlap;
}

/* Modelled read seconds of rounds 1 and 2 (n reads, b bytes each), with
 * the I/O thread's copy of the bytes; before the learned factor. */
static double reads_time(const pi2_hwprof *hw, int depth, double n1, double b1, double n2, double b2)
{
    return io_time(hw, n1, b1, depth) + io_time(hw, n2, b2, depth) + (b1 + b2) / pi2_hwprof_compute(hw, 1)->mem_bw;
}

/* Compute seconds of FFN fi (with its share of the layer's attention) per
 * run, before the learned factor. With the I/O thread on a core of its own
 * all of it can hide reads: the read-ahead's reads fly during the
 * attention, the missing parts' reads during the predictor and the held
 * parts' rows, and each missing part is computed as its read lands while
 * the others are still in flight. */
static double item_compute(const pi2_mprof *mp, const pi2_hwprof *hw, int t, uint32_t fi)
{
    return ffn_compute(mp, hw, t, fi) + attn_compute(mp, hw, t) / mp->top_k;
}

/* The part of the shorter of compute X and reads Y that the engine hides
 * under the other when the hardware overlaps them fully: X + Y - |(X, Y)|.
 * Nearly all of it when the other is much longer (84% at a third), 59%
 * when they are equal: a layer's missing parts are only read once its
 * predictor has run, and the layer ends with its last read's rows. Hiding
 * all of the shorter (a time of max(X, Y)) predicted 1 compute thread too
 * fast where its reads took about its compute (PERF.md, Planner). */
static double hidden(double X, double Y) { return X + Y - hypot(X, Y); }

/* Time of compute kC (of which kA can hide reads) and reads fIO at overlap ov. */
static double layer_time(double kC, double kA, double fIO, double ov) { return kC + fIO - ov * hidden(kA, fIO); }

/* Seconds per token of one FFN item given its reads: round 1 (n1 reads,
 * b1 bytes) and round 2. */
double plan_item_time(const pi2_mprof *mp, const pi2_hwprof *hw, const cfg *c, uint32_t fi, double n1, double b1,
                        double n2, double b2)
{
    const pi2_hw_compute *hc = pi2_hwprof_compute(hw, c->t);
    double w = mp->ffn[fi].w, C = c->k * item_compute(mp, hw, c->t, fi);
    double IO = c->f * reads_time(hw, c->depth, n1, b1, n2, b2);
    return w * layer_time(C, C, IO, overlap_of(mp, hc, c->t));
}

/* Share of FFN F's neurons whose gate (or whole neuron) is not kept. */
double plan_cold_share(const pi2_mprof *mp, const pi2_mprof_ffn *F, uint32_t h, uint32_t g)
{
    uint64_t kept = (uint64_t)(mp->two_phase ? g : h) * F->group;
    return F->neurons && kept < F->neurons ? (double)(F->neurons - kept) / F->neurons : 0;
}

/* Read-ahead reads of neurons the FFN then does not select (learned:
 * pi2_plan_cal.extra per FFN at cold share 1): one read of one neuron each. */
void plan_add_extra(const pi2_mprof *mp, double cold, double extra, double *n1, double *b1)
{
    double r = extra * cold;
    *n1 += r;
    *b1 += r * (double)span_bytes(mp, mp->two_phase ? 3 : 0, 0, 0);
}

void plan_static_reads(const pi2_mprof *mp, const suffix *x, bool gf, uint32_t h, uint32_t g, double *n1,
                         double *b1, double *n2, double *b2)
{
    if (!mp->two_phase) {
        *n1 = x->P[h];
        *b1 = x->B0[h];
        *n2 = *b2 = 0;
    } else if (!gf) {
        *n1 = x->P[g];
        *b1 = x->B0[g];
        *n2 = x->Q[h] - x->Q[g];
        *b2 = x->BU[h] - x->BU[g];
    } else {
        *n1 = x->P[g];
        *b1 = x->BG[g];
        *n2 = x->Q[h];
        *b2 = x->BU[h];
    }
}

int plan_suffix_build(const pi2_mprof_ffn *F, suffix *x)
{
    size_t n = (size_t)F->groups + 1;
    x->P = calloc(5 * n, sizeof(double));
    if (!x->P)
        return -1;
    x->B0 = x->P + n;
    x->BG = x->B0 + n;
    x->Q = x->BG + n;
    x->BU = x->Q + n;
    for (size_t k = F->groups; k-- > 0;) {
        x->P[k] = x->P[k + 1] + F->p[k];
        x->B0[k] = x->B0[k + 1] + F->p[k] * F->sp0[k];
        x->BG[k] = x->BG[k + 1] + F->p[k] * F->spg[k];
        x->Q[k] = x->Q[k + 1] + F->q[k];
        x->BU[k] = x->BU[k + 1] + F->q[k] * F->spu[k];
    }
    return 0;
}

void pi2_plan_predict(const pi2_mprof *mp, const pi2_hwprof *hw, pi2_plan *p, int prompt)
{
    size_t n = mp->n_ffn;
    cfg c = plan_cfg_make(mp, p->threads, p->io_depth, p->gate_first);
    double total = 0, io = 0, io_cal = 0, comp = 0, reads = 0, bytes = 0, parts = 0, served = 0, raw_reads = 0,
           raw_cold = 0;
    const pi2_hw_compute *hc = pi2_hwprof_compute(hw, c.t);
    for (uint32_t fi = 0; fi < n; fi++) {
        double n1 = 0, b1 = 0, n2 = 0, b2 = 0;
        const pi2_mprof_ffn *F = &mp->ffn[fi];
        uint32_t h = p->hot_groups[fi], g = p->gate_groups[fi];
        suffix x;
        if (plan_suffix_build(F, &x) == 0) {
            plan_static_reads(mp, &x, p->gate_first, h, g, &n1, &b1, &n2, &b2);
            free(x.P);
        }
        {
            double phi = F->sel > 0 ? F->fired / F->sel : 0, miss = 0;
            parts += F->sel + (mp->two_phase ? F->fired : 0);
            for (uint32_t k = mp->two_phase ? g : h; k < F->groups; k++)
                miss += F->n[k];
            for (uint32_t k = h; mp->two_phase && k < F->groups; k++)
                miss += F->n[k] * phi;
            served += F->sel + (mp->two_phase ? F->fired : 0) - miss;
        }
        double w = F->w, C = item_compute(mp, hw, c.t, fi);
        double IO = reads_time(hw, c.depth, n1, b1, n2, b2);
        double cold = plan_cold_share(mp, F, h, g);
        raw_reads += w * (n1 + n2);
        raw_cold += w * cold;
        plan_add_extra(mp, cold, mp->cal.extra, &n1, &b1);
        total += plan_item_time(mp, hw, &c, fi, n1, b1, n2, b2);
        comp += w * C;
        io += w * IO;
        io_cal += w * c.f * reads_time(hw, c.depth, n1, b1, n2, b2);
        reads += w * (n1 + n2);
        bytes += w * (b1 + b2);
    }
    double kc = c.k;
    double head_raw = (double)mp->head_bytes / gemv_rate(hc, mp->q_head), head = kc * head_raw;
    total += head;
    struct pi2_plan_pred *r = &p->pred;
    r->decode_ms = total * 1e3;
    r->decode_tok_s = total > 0 ? 1 / total : 0;
    r->raw_compute_ms = (comp + head_raw) * 1e3;
    r->raw_io_ms = io * 1e3;
    r->raw_reads = raw_reads;
    r->raw_cold = raw_cold;
    r->overlap = overlap_of(mp, hc, c.t);
    r->raw_window_ms = comp * 1e3; /* all of the compute but the head */
    r->compute_ms = kc * comp * 1e3;
    r->io_ms = io_cal * 1e3;
    r->head_ms = head * 1e3;
    r->reads_per_token = reads;
    r->mb_per_token = bytes / 1e6;
    r->hit_rate = parts > 0 ? served / parts : 1;
    uint64_t hot = plan_hot_total(mp, p);
    r->hot_mb = (double)hot / 1e6;
    r->offloaded = mp->ffn_total ? 1 - (double)hot / (double)mp->ffn_total : 0;
    /* prefill: dense tiles, the cold FFN bytes streamed once per prompt */
    if (prompt < 1)
        prompt = 128;
    double attn_macs = (double)mp->attn_bytes / (mp->q_other == PI2_QT_Q4 ? 0.5625 : 1.0625);
    double ffn_macs = 3.0 * mp->hidden * (double)mp->n_ff * mp->top_k;
    double per_tok = mp->n_layers * (attn_macs / (mp->q_other == PI2_QT_Q4 ? hc->matmul_q4 : hc->matmul_q8) +
                                     ffn_macs / (mp->q_ffn == PI2_QT_Q4 ? hc->matmul_q4 : hc->matmul_q8));
    double comp_p = per_tok * prompt, stream = (double)(mp->ffn_total - (hot < mp->ffn_total ? hot : mp->ffn_total)) /
                                                 hw->seq_bps;
    double tp = comp_p + stream - hc->overlap * (comp_p < stream ? comp_p : stream) + head;
    r->prefill_tok_s = tp > 0 ? prompt / tp : 0;
}

/* ---- calibration ---- */

void pi2_plan_cal_defaults(pi2_plan_cal *c)
{
    memset(c, 0, sizeof *c);
    c->runs = 0;
}

#define CAL_KEEP 0.8 /* weight of the earlier runs at each new one */

/* A run's time as a function of one factor x: p = {C, A, IO, ov} with x
 * the compute factor, or {kC, kA, IO, ov} with x the read-time factor. */
typedef double (*time_of)(double x, const double p[4]);
static double time_of_k(double k, const double p[4]) { return layer_time(k * p[0], k * p[1], p[2], p[3]); }
static double time_of_f(double f, const double p[4]) { return layer_time(p[0], p[1], f * p[2], p[3]); }

/* The factor x in [lo, hi] for which the run's time is T (the time rises
 * with x: bisection; the bound when T lies beyond it), and the weight of
 * the run for it: how much x moves T, relative to T. */
static double solve_factor(time_of g, const double p[4], double T, double lo, double hi, double *wt)
{
    double x;
    if (g(lo, p) >= T) {
        x = lo;
    } else if (g(hi, p) <= T) {
        x = hi;
    } else {
        double a = lo, b = hi;
        for (int i = 0; i < 64; i++) {
            double m = 0.5 * (a + b);
            if (g(m, p) < T)
                a = m;
            else
                b = m;
        }
        x = 0.5 * (a + b);
    }
    double e = 1e-4 * x, d = (g(x + e, p) - g(x - e, p)) / (2 * e);
    if (!(d > 1e-9 * T) || !isfinite(d)) { /* x does not move T: nothing learned */
        *wt = 0;
        return 1;
    }
    *wt = (d / T) * (d / T);
    return x;
}

void pi2_plan_cal_update(pi2_plan_cal *c, const pi2_plan *p, double tok_s, double reads)
{
    const struct pi2_plan_pred *r = &p->pred;
    if (!(tok_s > 0) || !(r->raw_compute_ms > 0) || !isfinite(reads) || reads < 0)
        return;
    int t = p->threads < 1 ? 1 : p->threads > PI2_HW_MAX_THREADS ? PI2_HW_MAX_THREADS : p->threads;
    double T = 1e3 / tok_s, C = r->raw_compute_ms, A = r->raw_window_ms, ov = r->overlap;
    /* the run's I/O time under the model: its reads at the model's cost per read */
    double per = r->raw_reads > 0 ? r->raw_io_ms / r->raw_reads : 0;
    double IO = reads > 0 && per > 0 ? reads * per : 0;
    /* one run, two unknowns: each factor is solved with the other as
     * learned so far and weighed by how much it moves the run's time, so
     * runs mostly in memory teach the compute factor and runs mostly
     * reading the read factor */
    double k0 = cal_compute(c, t), f0 = cal_io(c, t), wk, wf;
    double pk[4] = {C, A, f0 * IO, ov}, pf[4] = {k0 * C, k0 * A, IO, ov};
    double k = solve_factor(time_of_k, pk, T, CAL_K_MIN, CAL_K_MAX, &wk);
    c->s_w[t - 1] = CAL_KEEP * c->s_w[t - 1] + wk;
    c->s_wk[t - 1] = CAL_KEEP * c->s_wk[t - 1] + wk * k;
    if (IO > 0) {
        double f = solve_factor(time_of_f, pf, T, CAL_F_MIN, CAL_F_MAX, &wf);
        c->s_io_w[t - 1] = CAL_KEEP * c->s_io_w[t - 1] + wf;
        c->s_io_wk[t - 1] = CAL_KEEP * c->s_io_wk[t - 1] + wf * f;
    }
    if (r->raw_cold > 0.01) {
        double ex = (reads - r->raw_reads) / r->raw_cold;
        c->s_ex = CAL_KEEP * c->s_ex + (ex > 0 ? ex : 0);
        c->n_ex = CAL_KEEP * c->n_ex + 1;
        c->extra = c->s_ex / c->n_ex;
    }
    c->runs++;
}
