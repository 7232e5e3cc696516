/* pi2 execution planner: model profile, cost model, solver (planner.h). */
#include "runtime/planner.h"

#include "bundle/layout.h"
#include "formats/jsonutil.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PLAN_LEVELS 48     /* per-FFN choices of hot groups (and of gate groups) */
static const int DEPTHS[] = {16, 32, 64, 128};

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
 * of the group (inclusive): gate, up+down, or whole neuron. */
static uint64_t span_bytes(const pi2_mprof *mp, int kind, uint32_t j0, uint32_t j1)
{
    uint64_t a, b;
    if (kind == 0) { /* one-phase whole neurons */
        a = j0 * 3 * mp->R;
        b = (j1 + 1) * 3 * mp->R;
    } else if (kind == 1) { /* gates */
        a = j0 * mp->R;
        b = (j1 + 1) * mp->R;
    } else if (kind == 2) { /* up+down */
        a = mp->Pg + j0 * 2 * mp->R;
        b = mp->Pg + (j1 + 1) * 2 * mp->R;
    } else { /* gate of j0 through up+down of j1 */
        a = j0 * mp->R;
        b = mp->Pg + (j1 + 1) * 2 * mp->R;
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
 * shows: PERF.md, Planner). Only the marginals carry over: each neuron is selected with its sampled frequency (or its profiled
 * activation frequency without samples), independently. */
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

int pi2_mprof_build(pi2_mprof *mp, const pi2_manifest *mf, const pi2_bundle_layout *bl, const uint8_t *base,
                    uint64_t base_len, const char *name, pi2_err *err)
{
    memset(mp, 0, sizeof *mp);
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
    if (bl->n_ffn != mp->n_ffn || mp->n_ffn == 0)
        return pi2_err_set(err, PI2_ESHAPE, "%s: %zu bundled FFNs, the model has %u", name, bl->n_ffn, mp->n_ffn);
    mp->ffn = pi2_calloc_array(mp->n_ffn, sizeof *mp->ffn);
    if (!mp->ffn)
        return pi2_err_set(err, PI2_ENOMEM, "out of memory for the model profile");
    mp->bits_selected = true;
    pi2_plan_cal_defaults(&mp->cal);
    int rc = 0;
    for (uint32_t fi = 0; fi < mp->n_ffn && rc == 0; fi++) {
        const pi2_bl_ffn *b = &bl->ffn[fi];
        pi2_mprof_ffn *F = &mp->ffn[fi];
        F->neurons = b->neurons;
        F->group = b->group;
        F->groups = b->groups;
        F->words = (b->neurons + 63) / 64;
        F->read_eff = isnan(b->read_eff) ? 0 : b->read_eff;
        if (fi == 0) {
            mp->S = b->slot_bytes;
            mp->Pg = b->gate_part;
        } else if (b->slot_bytes != mp->S || b->gate_part != mp->Pg) {
            rc = pi2_err_set(err, PI2_EUNSUPPORTED, "%s: FFNs of different geometry", name);
            break;
        }
        mp->ffn_total += (uint64_t)b->groups * b->slot_bytes;
        const pi2_mf_layer *ml = pi2_manifest_find_layer(mf, b->layer, b->expert);
        if (ml && ml->has_predictor) { /* decode runs it as Q8 rows, fc2's padded to 32 columns */
            int64_t R = ml->predictor.rank, Rp = (R + PI2_Q_GROUP - 1) / PI2_Q_GROUP * PI2_Q_GROUP;
            uint64_t r1 = pi2_q_payload_row_bytes(PI2_QT_Q8, d->hidden) +
                          2 * pi2_q_scale_row_count(PI2_QT_Q8, d->hidden),
                     r2 = pi2_q_payload_row_bytes(PI2_QT_Q8, Rp) + 2 * pi2_q_scale_row_count(PI2_QT_Q8, Rp);
            F->pred_bytes = (uint64_t)R * r1 + (uint64_t)b->neurons * r2;
        }
        F->p = pi2_calloc_array(b->groups, sizeof *F->p);
        F->n = pi2_calloc_array(b->groups, sizeof *F->n);
        F->q = pi2_calloc_array(b->groups, sizeof *F->q);
        F->sp0 = pi2_calloc_array(b->groups, sizeof *F->sp0);
        F->spg = pi2_calloc_array(b->groups, sizeof *F->spg);
        F->spu = pi2_calloc_array(b->groups, sizeof *F->spu);
        if (!F->p || !F->n || !F->q || !F->sp0 || !F->spg || !F->spu) {
            rc = pi2_err_set(err, PI2_ENOMEM, "out of memory for the model profile");
            break;
        }
        const pi2_mf_profile *pr = pi2_manifest_find_profile(mf, b->layer, b->expert);
        F->fired = pr ? pr->active_frac * b->neurons : 0.5 * b->neurons;
        if (pr && pr->bits[0] && pr->bit_samples > 0) {
            const uint8_t *p;
            if ((rc = member_at(mf, pr->bits, base, base_len, pr->bit_samples * F->words * 8, &p, name, err)))
                break;
            F->bits = (const uint64_t *)(const void *)p;
            if (mp->samples == 0 || pr->bit_samples < mp->samples)
                mp->samples = pr->bit_samples;
            mp->bits_selected = mp->bits_selected && pr->bits_selected;
        } else {
            mp->bits_selected = false;
            if (pr && pr->freq[0]) {
                const uint8_t *p;
                if ((rc = member_at(mf, pr->freq, base, base_len, (uint64_t)b->neurons * 4, &p, name, err)))
                    break;
                F->freq = (const float *)(const void *)p;
            }
        }
    }
    for (uint32_t fi = 0; fi < mp->n_ffn && rc == 0; fi++)
        group_figures(mp, &mp->ffn[fi], mp->ffn[fi].bits ? mp->samples : 0);
    /* how often each FFN runs: dense 1; an expert top-k x its routing share
     * when the layer's profiled shares sum to 1, else top-k / experts */
    for (uint32_t fi = 0; fi < mp->n_ffn && rc == 0; fi++) {
        const pi2_bl_ffn *b = &bl->ffn[fi];
        double sum = 0, share = NAN;
        for (int x = 0; x < d->n_experts; x++) {
            const pi2_mf_profile *pr = pi2_manifest_find_profile(mf, b->layer, x);
            sum += pr && !isnan(pr->route_share) ? pr->route_share : 0;
            if (pr && x == b->expert)
                share = pr->route_share;
        }
        mp->ffn[fi].w = d->n_experts == 0                  ? 1.0
                        : fabs(sum - 1) < 0.01 && !isnan(share) ? mp->top_k * share / sum
                                                              : (double)mp->top_k / d->n_experts;
    }
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

static uint64_t hot_bytes_of(const pi2_mprof *mp, uint32_t h, uint32_t g)
{
    return (uint64_t)h * mp->S + (mp->two_phase ? (uint64_t)(g - h) * mp->Pg : 0);
}

uint64_t pi2_plan_hot_bytes(const pi2_mprof *mp, const pi2_plan *p, uint32_t i)
{
    return hot_bytes_of(mp, p->hot_groups[i], p->gate_groups[i]);
}

static uint64_t plan_hot_total(const pi2_mprof *mp, const pi2_plan *p)
{
    uint64_t t = 0;
    for (uint32_t i = 0; i < p->n_ffn; i++)
        t += pi2_plan_hot_bytes(mp, p, i);
    return t;
}

static uint64_t min_cache(const pi2_mprof *mp, const pi2_plan_mem *mem)
{
    return mem->min_slots * (mem->slot_bytes[0] + (mp->two_phase ? mem->slot_bytes[1] : 0));
}

/* ---- cost model ---- */

typedef struct cfg {
    int t, depth;
    bool gf;
    double k, f; /* the learned compute and read-time factors at t (cfg_make) */
} cfg;

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

static cfg cfg_make(const pi2_mprof *mp, int t, int depth, bool gf)
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
    return (double)F->pred_bytes / gemv_rate(c, PI2_QT_Q8) + F->sel * row + F->fired * (row + drow);
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
static double item_time(const pi2_mprof *mp, const pi2_hwprof *hw, const cfg *c, uint32_t fi, double n1, double b1,
                        double n2, double b2)
{
    const pi2_hw_compute *hc = pi2_hwprof_compute(hw, c->t);
    double w = mp->ffn[fi].w, C = c->k * item_compute(mp, hw, c->t, fi);
    double IO = c->f * reads_time(hw, c->depth, n1, b1, n2, b2);
    return w * layer_time(C, C, IO, overlap_of(mp, hc, c->t));
}

/* Static-hot reads of FFN fi at (h, g) from suffix sums. */
typedef struct suffix {
    double *P, *B0, *BG, *Q, *BU; /* [groups + 1] */
} suffix;

/* Share of FFN F's neurons whose gate (or whole neuron) is not kept. */
static double cold_share(const pi2_mprof *mp, const pi2_mprof_ffn *F, uint32_t h, uint32_t g)
{
    uint64_t kept = (uint64_t)(mp->two_phase ? g : h) * F->group;
    return F->neurons && kept < F->neurons ? (double)(F->neurons - kept) / F->neurons : 0;
}

/* Read-ahead reads of neurons the FFN then does not select (learned:
 * pi2_plan_cal.extra per FFN at cold share 1): one read of one neuron each. */
static void add_extra(const pi2_mprof *mp, double cold, double extra, double *n1, double *b1)
{
    double r = extra * cold;
    *n1 += r;
    *b1 += r * (double)span_bytes(mp, mp->two_phase ? 3 : 0, 0, 0);
}

static void static_reads(const pi2_mprof *mp, const suffix *x, bool gf, uint32_t h, uint32_t g, double *n1,
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

static int suffix_build(const pi2_mprof_ffn *F, suffix *x)
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
    cfg c = cfg_make(mp, p->threads, p->io_depth, p->gate_first);
    double total = 0, io = 0, io_cal = 0, comp = 0, reads = 0, bytes = 0, parts = 0, served = 0, raw_reads = 0,
           raw_cold = 0;
    const pi2_hw_compute *hc = pi2_hwprof_compute(hw, c.t);
    for (uint32_t fi = 0; fi < n; fi++) {
        double n1 = 0, b1 = 0, n2 = 0, b2 = 0;
        const pi2_mprof_ffn *F = &mp->ffn[fi];
        uint32_t h = p->hot_groups[fi], g = p->gate_groups[fi];
        suffix x;
        if (suffix_build(F, &x) == 0) {
            static_reads(mp, &x, p->gate_first, h, g, &n1, &b1, &n2, &b2);
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
        double cold = cold_share(mp, F, h, g);
        raw_reads += w * (n1 + n2);
        raw_cold += w * cold;
        add_extra(mp, cold, mp->cal.extra, &n1, &b1);
        total += item_time(mp, hw, &c, fi, n1, b1, n2, b2);
        comp += w * C;
        io += w * IO;
        io_cal += w * c.f * reads_time(hw, c.depth, n1, b1, n2, b2);
        reads += w * (n1 + n2);
        bytes += w * (b1 + b2);
    }
    double kc = c.k;
    double head_raw = (double)mp->head_bytes / gemv_rate(hc, mp->q_other), head = kc * head_raw;
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

/* ---- solver ---- */

int pi2_plan_fixed(const pi2_mprof *mp, const pi2_plan_mem *mem, uint64_t mem_limit, int threads, int io_depth,
                   double hot_share, bool gate_first, pi2_plan *out, pi2_err *err)
{
    int rc = pi2_plan_alloc(out, mp->n_ffn, err);
    if (rc)
        return rc;
    out->mem_limit = mem_limit;
    out->threads = threads;
    out->io_depth = io_depth;
    out->gate_first = gate_first && mp->two_phase;
    out->fixed_split = true;
    uint64_t fixed = mem->fixed + mem->per_depth * (uint64_t)io_depth, mc = min_cache(mp, mem);
    if (mem_limit < fixed + mc) {
        pi2_plan_free(out);
        return pi2_err_set(err, PI2_ENOMEM, "plan: a memory limit of %.0f MB cannot hold the resident part (%.0f MB)",
                           mem_limit / 1e6, (fixed + mc) / 1e6);
    }
    uint64_t budget = mem_limit - fixed, hot_budget;
    bool all = budget >= mp->ffn_total + mc;
    if (all) {
        hot_budget = mp->ffn_total;
    } else {
        double share = hot_share >= 0 && hot_share <= 1 ? hot_share : 0.5;
        hot_budget = (uint64_t)((double)(budget - mc) * share);
    }
    uint64_t per = hot_budget / mp->n_ffn;
    for (uint32_t i = 0; i < mp->n_ffn; i++) {
        uint64_t H = all ? mp->ffn[i].groups : per / mp->S;
        if (H > mp->ffn[i].groups)
            H = mp->ffn[i].groups;
        out->hot_groups[i] = out->gate_groups[i] = (uint32_t)H;
    }
    return 0;
}

/* One FFN's options at a configuration: for each memory unit count u the
 * cheapest (h, g) within u units (prefix minimum). */
typedef struct item_opts {
    uint32_t m;     /* units of the largest option */
    double *cost;   /* [m + 1], INFINITY where nothing fits */
    uint32_t *h, *g; /* [m + 1] */
} item_opts;

static int item_build(const pi2_mprof *mp, const pi2_hwprof *hw, const cfg *c, uint32_t fi, const suffix *x,
                      uint32_t step, uint64_t unit, bool gate_only, item_opts *io)
{
    const pi2_mprof_ffn *F = &mp->ffn[fi];
    uint32_t K = (F->groups + step - 1) / step;
    uint64_t mu = (hot_bytes_of(mp, F->groups, F->groups) + unit - 1) / unit;
    io->m = (uint32_t)mu;
    io->cost = malloc((mu + 1) * sizeof *io->cost);
    io->h = malloc((mu + 1) * sizeof *io->h);
    io->g = malloc((mu + 1) * sizeof *io->g);
    if (!io->cost || !io->h || !io->g)
        return -1;
    for (uint64_t u = 0; u <= mu; u++)
        io->cost[u] = INFINITY;
    for (uint32_t a = 0; a <= K; a++) {
        uint32_t h = a * step < F->groups ? a * step : F->groups;
        for (uint32_t b = mp->two_phase ? a : K; b <= (mp->two_phase && !gate_only ? a : K); b++) {
            uint32_t g = mp->two_phase ? (b * step < F->groups ? b * step : F->groups) : h;
            uint64_t u = (hot_bytes_of(mp, h, g) + unit - 1) / unit;
            double n1, b1, n2, b2;
            static_reads(mp, x, c->gf, h, g, &n1, &b1, &n2, &b2);
            add_extra(mp, cold_share(mp, F, h, g), mp->cal.extra, &n1, &b1);
            double t = item_time(mp, hw, c, fi, n1, b1, n2, b2);
            if (t < io->cost[u]) {
                io->cost[u] = t;
                io->h[u] = h;
                io->g[u] = g;
            }
            if (!mp->two_phase)
                break;
        }
    }
    for (uint64_t u = 1; u <= mu; u++)
        if (io->cost[u - 1] <= io->cost[u]) {
            io->cost[u] = io->cost[u - 1];
            io->h[u] = io->h[u - 1];
            io->g[u] = io->g[u - 1];
        }
    return 0;
}

static void item_free(item_opts *io)
{
    free(io->cost);
    free(io->h);
    free(io->g);
}

/* Exact multiple-choice knapsack over items: minimise the sum of costs
 * within B units. Writes each item's unit count into pick. */
static double knapsack(const item_opts *it, uint32_t n, uint64_t B, uint32_t *pick, int *ok)
{
    double *dp = malloc((B + 1) * sizeof *dp), *nd = malloc((B + 1) * sizeof *nd);
    uint32_t *arg = malloc((size_t)n * (B + 1) * sizeof *arg);
    *ok = dp && nd && arg;
    if (!*ok) {
        free(dp);
        free(nd);
        free(arg);
        return INFINITY;
    }
    for (uint64_t b = 0; b <= B; b++)
        dp[b] = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t *ai = arg + (size_t)i * (B + 1);
        for (uint64_t b = 0; b <= B; b++) {
            double best = INFINITY;
            uint32_t bu = 0;
            uint64_t top = b < it[i].m ? b : it[i].m;
            for (uint64_t u = 0; u <= top; u++) {
                double v = dp[b - u] + it[i].cost[u];
                if (v < best) {
                    best = v;
                    bu = (uint32_t)u;
                }
            }
            nd[b] = best;
            ai[b] = bu;
        }
        double *t = dp;
        dp = nd;
        nd = t;
    }
    double res = dp[B];
    uint64_t b = B;
    for (uint32_t i = n; i-- > 0;) {
        pick[i] = arg[(size_t)i * (B + 1) + b];
        b -= pick[i];
    }
    free(dp);
    free(nd);
    free(arg);
    return res;
}

int pi2_plan_solve(const pi2_mprof *mp, const pi2_hwprof *hw, const pi2_plan_mem *mem, const pi2_plan_opts *o,
                   pi2_plan *out, pi2_err *err)
{
    memset(out, 0, sizeof *out);
    int threads = o->threads < 1 ? 1 : o->threads;
    if (threads > hw->threads)
        threads = hw->threads;
    int max_depth = o->max_depth > 0 ? o->max_depth : 128;
    if (o->fixed_only) {
        int rc = pi2_plan_fixed(mp, mem, o->mem_limit, threads, 64, 1.0, false, out, err);
        if (rc == 0)
            pi2_plan_predict(mp, hw, out, o->prompt);
        return rc;
    }
    uint32_t n = mp->n_ffn;
    uint32_t levels = n <= 32 ? PLAN_LEVELS : (uint32_t)(PLAN_LEVELS * 32 / n);
    if (levels < 8)
        levels = 8;
    suffix *sx = calloc(n, sizeof *sx);
    item_opts *it = calloc(n, sizeof *it);
    uint32_t *pick = calloc(n, sizeof *pick);
    int rc = 0;
    if (!sx || !it || !pick)
        rc = pi2_err_set(err, PI2_ENOMEM, "out of memory planning");
    for (uint32_t i = 0; rc == 0 && i < n; i++)
        if (suffix_build(&mp->ffn[i], &sx[i]) != 0)
            rc = pi2_err_set(err, PI2_ENOMEM, "out of memory planning");
    double best = INFINITY;
    bool any = false;
    uint64_t mc = min_cache(mp, mem);
    for (int t = 1; rc == 0 && t <= threads; t++)
        for (size_t di = 0; rc == 0 && di < sizeof DEPTHS / sizeof *DEPTHS; di++) {
            int depth = DEPTHS[di];
            if (depth > max_depth)
                continue;
            for (int gf = 0; rc == 0 && gf <= (mp->two_phase ? 1 : 0); gf++) {
                cfg c = cfg_make(mp, t, depth, gf != 0);
                uint64_t fixed = mem->fixed + mem->per_depth * (uint64_t)depth;
                if (o->mem_limit < fixed + mc)
                    continue;
                any = true;
                uint64_t budget = o->mem_limit - fixed - mc;
                pi2_plan cand;
                if ((rc = pi2_plan_alloc(&cand, n, err)) != 0)
                    break;
                cand.mem_limit = o->mem_limit;
                cand.threads = t;
                cand.io_depth = depth;
                cand.gate_first = gf != 0;
                double tot;
                if (budget >= mp->ffn_total) {
                    for (uint32_t i = 0; i < n; i++)
                        cand.hot_groups[i] = cand.gate_groups[i] = mp->ffn[i].groups;
                    tot = 0;
                    for (uint32_t i = 0; i < n; i++) {
                        double n1, b1, n2, b2;
                        static_reads(mp, &sx[i], c.gf, mp->ffn[i].groups, mp->ffn[i].groups, &n1, &b1, &n2, &b2);
                        tot += item_time(mp, hw, &c, i, n1, b1, n2, b2);
                    }
                } else {
                    uint32_t step = (mp->ffn[0].groups + levels - 1) / levels;
                    if (step < 1)
                        step = 1;
                    uint64_t unit = (uint64_t)step * (mp->two_phase ? mp->Pg : mp->S);
                    uint64_t B = budget / unit, sum = 0;
                    for (uint32_t i = 0; rc == 0 && i < n; i++) {
                        item_free(&it[i]);
                        memset(&it[i], 0, sizeof it[i]);
                        if (item_build(mp, hw, &c, i, &sx[i], step, unit, o->gate_only, &it[i]) != 0)
                            rc = pi2_err_set(err, PI2_ENOMEM, "out of memory planning");
                        sum += it[i].m;
                    }
                    if (B > sum)
                        B = sum;
                    int ok = 1;
                    tot = rc ? INFINITY : knapsack(it, n, B, pick, &ok);
                    if (!ok)
                        rc = pi2_err_set(err, PI2_ENOMEM, "out of memory planning");
                    for (uint32_t i = 0; rc == 0 && i < n; i++) {
                        cand.hot_groups[i] = it[i].h[pick[i]];
                        cand.gate_groups[i] = it[i].g[pick[i]];
                    }
                }
                if (rc == 0 && tot < best) {
                    best = tot;
                    pi2_plan_free(out);
                    *out = cand;
                } else {
                    pi2_plan_free(&cand);
                }
            }
        }
    for (uint32_t i = 0; sx && i < n; i++)
        free(sx[i].P);
    for (uint32_t i = 0; it && i < n; i++)
        item_free(&it[i]);
    free(sx);
    free(it);
    free(pick);
    if (rc) {
        pi2_plan_free(out);
        return rc;
    }
    if (!any)
        return pi2_err_set(err, PI2_ENOMEM, "plan: a memory limit of %.0f MB cannot hold the resident part (%.0f MB)",
                           o->mem_limit / 1e6, (mem->fixed + mem->per_depth * 16 + mc) / 1e6);
    pi2_plan_predict(mp, hw, out, o->prompt);
    /* keep the fixed split unless the search predicts a clear gain: the
     * model's error is larger than small differences */
    pi2_plan fx;
    pi2_err fe = {0};
    if (o->min_gain > 0 && pi2_plan_fixed(mp, mem, o->mem_limit, threads, 64, 1.0, false, &fx, &fe) == 0) {
        pi2_plan_predict(mp, hw, &fx, o->prompt);
        if (out->pred.decode_ms >= fx.pred.decode_ms * (1 - o->min_gain)) {
            pi2_plan_free(out);
            *out = fx;
        } else {
            pi2_plan_free(&fx);
        }
    }
    if (o->min_speed > 0 && out->pred.decode_tok_s < o->min_speed) {
        double got = out->pred.decode_tok_s;
        /* the memory that would reach min_speed: bisect on the limit */
        uint64_t lo = o->mem_limit, hi = mem->fixed + mem->per_depth * 128 + mc + mp->ffn_total + (64u << 20);
        pi2_plan_opts oo = *o;
        oo.min_speed = 0;
        pi2_plan tp;
        bool reach = false;
        oo.mem_limit = hi;
        if (hi > lo && pi2_plan_solve(mp, hw, mem, &oo, &tp, err) == 0) {
            reach = tp.pred.decode_tok_s >= o->min_speed;
            pi2_plan_free(&tp);
        }
        for (int it2 = 0; reach && it2 < 20 && hi - lo > (16u << 20); it2++) {
            oo.mem_limit = lo + (hi - lo) / 2;
            if (pi2_plan_solve(mp, hw, mem, &oo, &tp, err) != 0)
                break;
            if (tp.pred.decode_tok_s >= o->min_speed)
                hi = oo.mem_limit;
            else
                lo = oo.mem_limit;
            pi2_plan_free(&tp);
        }
        pi2_plan_free(out);
        if (reach)
            return pi2_err_set(err, PI2_ERANGE,
                               "plan: infeasible: at a memory limit of %.0f MB the best plan decodes %.2f tok/s, below "
                               "the minimum speed %.2f; about %.0f MB would reach it",
                               o->mem_limit / 1e6, got, o->min_speed, hi / 1e6);
        return pi2_err_set(err, PI2_ERANGE,
                           "plan: infeasible: at a memory limit of %.0f MB the best plan decodes %.2f tok/s, below "
                           "the minimum speed %.2f, and no memory limit reaches it on this machine (compute-bound)",
                           o->mem_limit / 1e6, got, o->min_speed);
    }
    return 0;
}

/* ---- calibration ---- */

void pi2_plan_cal_defaults(pi2_plan_cal *c)
{
    memset(c, 0, sizeof *c);
    c->runs = 0;
}

#define CAL_KEEP 0.8 /* weight of the earlier runs at each new one */
#define CAL_K_MIN 0.5 /* the factors' ranges (a file's figures may round past them by 1e-6) */
#define CAL_K_MAX 4.0
#define CAL_F_MIN 0.25
#define CAL_F_MAX 4.0

static bool cal_in(double sum_w, double sum_wk, double lo, double hi)
{
    return sum_w <= 0 || (sum_wk / sum_w >= lo * (1 - 1e-6) && sum_wk / sum_w <= hi * (1 + 1e-6));
}

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

int pi2_plan_cal_save(const pi2_plan_cal *c, const char *path, pi2_err *err)
{
    char buf[4096];
    int n = snprintf(buf, sizeof buf,
                     "{\"version\":6,\"extra_reads\":%.9g,\"runs\":%d,\"reads_sums\":[%.9g,%.9g],\"compute_sums\":[",
                     c->extra, c->runs, c->s_ex, c->n_ex);
    for (int i = 0; i < PI2_HW_MAX_THREADS; i++)
        n += snprintf(buf + n, sizeof buf - (size_t)n, "%s[%.9g,%.9g]", i ? "," : "", c->s_w[i], c->s_wk[i]);
    n += snprintf(buf + n, sizeof buf - (size_t)n, "],\"io_sums\":[");
    for (int i = 0; i < PI2_HW_MAX_THREADS; i++)
        n += snprintf(buf + n, sizeof buf - (size_t)n, "%s[%.9g,%.9g]", i ? "," : "", c->s_io_w[i], c->s_io_wk[i]);
    n += snprintf(buf + n, sizeof buf - (size_t)n, "]}\n");
    pi2_afile *f;
    int rc = pi2_afile_open(&f, path, err);
    if (rc)
        return rc;
    if ((rc = pi2_afile_write(f, buf, (size_t)n, err)) != 0) {
        pi2_afile_abort(f);
        return rc;
    }
    return pi2_afile_commit(f, err);
}

int pi2_plan_cal_load(const char *path, pi2_plan_cal *c, pi2_err *err)
{
    pi2_plan_cal_defaults(c);
    if (access(path, F_OK) != 0)
        return pi2_err_set(err, PI2_ENOTFOUND, "%s: no calibration yet", path);
    char *text;
    size_t len;
    int rc = pi2_read_file(path, 8192, &text, &len, err);
    if (rc)
        return rc;
    json_error_t je;
    json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    json_t *v = o ? json_object_get(o, "version") : NULL, *x = o ? json_object_get(o, "extra_reads") : NULL,
           *r = o ? json_object_get(o, "runs") : NULL, *rs = o ? json_object_get(o, "reads_sums") : NULL,
           *cs = o ? json_object_get(o, "compute_sums") : NULL, *is = o ? json_object_get(o, "io_sums") : NULL;
    bool ok = o && json_is_object(o) && json_object_size(o) == 6 && json_is_integer(v) &&
              json_integer_value(v) == 6 && json_is_number(x) && json_is_integer(r) && json_is_array(rs) &&
              json_array_size(rs) == 2;
    double ex[2], *sums[2][2] = { { c->s_w, c->s_wk }, { c->s_io_w, c->s_io_wk } };
    for (size_t i = 0; ok && i < 2; i++)
        ok = json_is_number(json_array_get(rs, i)) && (ex[i] = json_number_value(json_array_get(rs, i))) >= 0 &&
             isfinite(ex[i]);
    for (int s = 0; ok && s < 2; s++) { /* compute_sums, io_sums: [w, wk] per thread count */
        json_t *a = s == 0 ? cs : is;
        ok = json_is_array(a) && json_array_size(a) == PI2_HW_MAX_THREADS;
        for (size_t i = 0; ok && i < PI2_HW_MAX_THREADS; i++) {
            json_t *pair = json_array_get(a, i);
            ok = json_is_array(pair) && json_array_size(pair) == 2;
            for (size_t j = 0; ok && j < 2; j++)
                ok = json_is_number(json_array_get(pair, j)) &&
                     (sums[s][j][i] = json_number_value(json_array_get(pair, j))) >= 0 && isfinite(sums[s][j][i]);
        }
    }
    if (!ok)
        rc = pi2_err_set(err, PI2_EFORMAT, "%s: not a pi2 model calibration (version 6)", path);
    else if (!(json_number_value(x) >= 0 && json_number_value(x) < 1e7) || json_integer_value(r) < 0 ||
             json_integer_value(r) > 1000000)
        rc = pi2_err_set(err, PI2_ERANGE, "%s: calibration figures out of range", path);
    else {
        c->extra = json_number_value(x);
        c->runs = (int)json_integer_value(r);
        c->s_ex = ex[0];
        c->n_ex = ex[1];
        for (int i = 0; i < PI2_HW_MAX_THREADS; i++)
            if (!cal_in(c->s_w[i], c->s_wk[i], CAL_K_MIN, CAL_K_MAX) ||
                !cal_in(c->s_io_w[i], c->s_io_wk[i], CAL_F_MIN, CAL_F_MAX))
                rc = pi2_err_set(err, PI2_ERANGE, "%s: calibration figures out of range", path);
    }
    json_decref(o);
    if (rc)
        pi2_plan_cal_defaults(c);
    return rc;
}

/* ---- JSON ---- */

char *pi2_plan_json(const pi2_plan *p, const char *model)
{
    json_t *o = json_object(), *h = json_array(), *g = json_array(), *pr = json_object();
    if (!o || !h || !g || !pr) {
        json_decref(o);
        json_decref(h);
        json_decref(g);
        json_decref(pr);
        return NULL;
    }
    for (uint32_t i = 0; i < p->n_ffn; i++) {
        json_array_append_new(h, json_integer(p->hot_groups[i]));
        json_array_append_new(g, json_integer(p->gate_groups[i]));
    }
    const struct pi2_plan_pred *r = &p->pred;
    json_object_set_new(pr, "decode_tok_s", json_real(r->decode_tok_s));
    json_object_set_new(pr, "decode_ms", json_real(r->decode_ms));
    json_object_set_new(pr, "prefill_tok_s", json_real(r->prefill_tok_s));
    json_object_set_new(pr, "compute_ms", json_real(r->compute_ms));
    json_object_set_new(pr, "io_ms", json_real(r->io_ms));
    json_object_set_new(pr, "head_ms", json_real(r->head_ms));
    json_object_set_new(pr, "reads_per_token", json_real(r->reads_per_token));
    json_object_set_new(pr, "mb_per_token", json_real(r->mb_per_token));
    json_object_set_new(pr, "hit_rate", json_real(r->hit_rate));
    json_object_set_new(pr, "hot_mb", json_real(r->hot_mb));
    json_object_set_new(pr, "offloaded", json_real(r->offloaded));
    json_object_set_new(o, "version", json_integer(1));
    json_object_set_new(o, "model", json_string(model ? model : ""));
    json_object_set_new(o, "mem_limit", json_integer((json_int_t)p->mem_limit));
    json_object_set_new(o, "threads", json_integer(p->threads));
    json_object_set_new(o, "io_depth", json_integer(p->io_depth));
    json_object_set_new(o, "gate_first", json_boolean(p->gate_first));
    json_object_set_new(o, "hot_groups", h);
    json_object_set_new(o, "gate_groups", g);
    json_object_set_new(o, "predicted", pr);
    char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
    json_decref(o);
    return s;
}

int pi2_plan_save(const pi2_plan *p, const char *model, const char *path, pi2_err *err)
{
    char *s = pi2_plan_json(p, model);
    if (!s)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory writing the plan", path);
    pi2_afile *f;
    int rc = pi2_afile_open(&f, path, err);
    if (rc == 0) {
        rc = pi2_afile_write(f, s, strlen(s), err);
        if (rc == 0)
            rc = pi2_afile_write(f, "\n", 1, err);
        if (rc == 0)
            rc = pi2_afile_commit(f, err);
        else
            pi2_afile_abort(f);
    }
    free(s);
    return rc;
}

static int jfail(pi2_err *err, int code, const char *path, const char *key, const char *what)
{
    return pi2_err_set(err, code, "%s: plan.%s: %s", path, key, what);
}

static int jint_in(json_t *o, const char *key, long long lo, long long hi, long long *out, const char *path,
                   pi2_err *err)
{
    json_t *v = json_object_get(o, key);
    if (!v)
        return jfail(err, PI2_ENOTFOUND, path, key, "missing");
    if (!json_is_integer(v))
        return pi2_err_set(err, PI2_EFORMAT, "%s: plan.%s: %s, expected an integer", path, key,
                           pi2_json_type_name(v));
    long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return pi2_err_set(err, PI2_ERANGE, "%s: plan.%s: %lld is outside [%lld, %lld]", path, key, x, lo, hi);
    *out = x;
    return 0;
}

int pi2_plan_load(const char *path, pi2_plan *out, pi2_err *err)
{
    static const char *const keys[] = {"version",    "model",      "mem_limit",   "threads",   "io_depth", "gate_first",
                                       "hot_groups", "gate_groups", "predicted", "source",    "memory"};
    memset(out, 0, sizeof *out);
    char *text;
    size_t len;
    int rc = pi2_read_file(path, 1u << 24, &text, &len, err);
    if (rc)
        return rc;
    json_error_t je;
    json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!o)
        return pi2_err_set(err, PI2_EFORMAT, "%s: not a plan: %s (line %d)", path, je.text, je.line);
    if (!json_is_object(o)) {
        rc = pi2_err_set(err, PI2_EFORMAT, "%s: not a plan: %s, expected an object", path, pi2_json_type_name(o));
        json_decref(o);
        return rc;
    }
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v)
    {
        bool known = false;
        for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
            known = known || strcmp(k, keys[i]) == 0;
        if (!known) {
            rc = pi2_err_set(err, PI2_EFORMAT, "%s: plan: unknown key \"%s\"", path, k);
            json_decref(o);
            return rc;
        }
    }
    long long ver, ml, th, dp;
    json_t *h = json_object_get(o, "hot_groups"), *g = json_object_get(o, "gate_groups"),
           *gf = json_object_get(o, "gate_first");
    if ((rc = jint_in(o, "version", 1, 1, &ver, path, err)) ||
        (rc = jint_in(o, "mem_limit", 1, INT64_MAX, &ml, path, err)) ||
        (rc = jint_in(o, "threads", 1, 256, &th, path, err)) ||
        (rc = jint_in(o, "io_depth", 1, 4096, &dp, path, err))) {
        json_decref(o);
        return rc;
    }
    if (!gf || !json_is_boolean(gf))
        rc = jfail(err, gf ? PI2_EFORMAT : PI2_ENOTFOUND, path, "gate_first", gf ? "not a boolean" : "missing");
    else if (!h || !json_is_array(h))
        rc = jfail(err, h ? PI2_EFORMAT : PI2_ENOTFOUND, path, "hot_groups", h ? "not an array" : "missing");
    else if (!g || !json_is_array(g) || json_array_size(g) != json_array_size(h))
        rc = jfail(err, g ? PI2_ESHAPE : PI2_ENOTFOUND, path, "gate_groups",
                   g ? "not an array as long as hot_groups" : "missing");
    else if (json_array_size(h) == 0 || json_array_size(h) > (1u << 20))
        rc = jfail(err, PI2_ESHAPE, path, "hot_groups", "empty or too long");
    if (rc == 0 && (rc = pi2_plan_alloc(out, (uint32_t)json_array_size(h), err)) == 0) {
        out->mem_limit = (uint64_t)ml;
        out->threads = (int)th;
        out->io_depth = (int)dp;
        out->gate_first = json_is_true(gf);
        for (uint32_t i = 0; rc == 0 && i < out->n_ffn; i++) {
            json_t *a = json_array_get(h, i), *b = json_array_get(g, i);
            if (!json_is_integer(a) || !json_is_integer(b) || json_integer_value(a) < 0 ||
                json_integer_value(b) < json_integer_value(a) || json_integer_value(b) > UINT32_MAX)
                rc = pi2_err_set(err, PI2_ERANGE,
                                 "%s: plan.hot_groups[%u] / gate_groups[%u]: want integers 0 <= hot <= gate", path,
                                 i, i);
            else {
                out->hot_groups[i] = (uint32_t)json_integer_value(a);
                out->gate_groups[i] = (uint32_t)json_integer_value(b);
            }
        }
        json_t *pr = json_object_get(o, "predicted");
        if (rc == 0 && pr && json_is_object(pr)) {
            json_t *x;
            if ((x = json_object_get(pr, "decode_tok_s")) && json_is_number(x))
                out->pred.decode_tok_s = json_number_value(x);
            if ((x = json_object_get(pr, "decode_ms")) && json_is_number(x))
                out->pred.decode_ms = json_number_value(x);
            if ((x = json_object_get(pr, "prefill_tok_s")) && json_is_number(x))
                out->pred.prefill_tok_s = json_number_value(x);
        }
        if (rc)
            pi2_plan_free(out);
    }
    json_decref(o);
    return rc;
}
