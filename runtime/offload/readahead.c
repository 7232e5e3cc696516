/* pi2 offloading: read-ahead during attention (runtime/offload/offload.h). */
#include "runtime/offload/ofl_state.h"
#include "runtime/mathops.h"
#include "runtime/moe.h"
#include "runtime/predict.h"

#include <stdlib.h>
#include <string.h>

/* Outside mu: copy a landed prefetch read into its reserved slots. */
void ofl_pf_copy(eng_ofl *x, const ofl_req *r)
{
    const ofl_rd *rd = &r->rd;
    const struct ofl_pf *P = &x->ra.set[rd->chunk];
    for (uint32_t idx = rd->a; idx <= rd->b; idx++) {
        if (!(P->flag[idx] & F_GMISS))
            continue;
        uint8_t *ud = P->flag[idx] & F_SPEC ? pi2_ncache_slot_buf(x->cu, P->uslot[idx]) : NULL;
        ofl_copy_part(x, rd->part, P->sel[idx], r->staging, rd->span, pi2_ncache_slot_buf(x->cg, P->gslot[idx]), ud);
    }
}

/* A prefetch read landed (ok) or failed: its parts join the caches unheld,
 * or go to the decode positions waiting for them. */
void ofl_pf_landed(eng_ofl *x, const ofl_rd *rd, bool ok, const pi2_err *er)
{
    struct ofl_pf *P = &x->ra.set[rd->chunk];
    P->sub--;
    x->ra.sub--;
    for (uint32_t idx = rd->a; idx <= rd->b; idx++) {
        uint8_t fl = P->flag[idx];
        if (!(fl & F_GMISS))
            continue;
        uint32_t i = P->sel[idx];
        if (ok) {
            pi2_ncache_commit(x->cg, P->gslot[idx]);
            if (fl & F_SPEC)
                pi2_ncache_commit(x->cu, P->uslot[idx]);
            x->cnt.pf++;
        } else {
            pi2_ncache_abort(x->cg, P->gslot[idx]);
            if (fl & F_SPEC)
                pi2_ncache_abort(x->cu, P->uslot[idx]);
        }
        P->flag[idx] = 0;
        P->pos[i] = 0;
        uint32_t w = P->wait[i];
        P->wait[i] = 0;
        if (!w || x->job.fail || !x->job.f || x->job.fi != P->fi)
            continue;
        uint32_t k = w - 1;
        x->job.flag[k] &= (uint8_t)~F_PFWAIT;
        uint8_t *buf = ok ? pi2_ncache_hold(x->cg, x->job.fi, i, &x->job.gslot[k]) : NULL;
        if (!buf) {
            pi2_err fe = {0};
            if (er && er->code)
                fe = *er;
            else
                pi2_err_set(&fe, PI2_EIO, "%s: read at offset %llu failed", x->e->path,
                            (unsigned long long)rd->file_off);
            ofl_job_fail(x, &fe);
            continue;
        }
        x->job.flag[k] |= F_GHELD;
        set_ptr(x, x->job.f, x->two_phase ? P_GATE : P_FULL, i, buf);
        uint32_t c = k / FFN_CHUNK;
        if (--x->job.ch[c].pending == 0)
            ofl_make_ready(x, c);
    }
    if (ok) {
        x->cnt.reads++;
        x->cnt.bytes += rd->len;
    }
    if (x->job.f && !x->job.fail) /* slots came free for chunks waiting to be admitted */
        ofl_admit(x);
    if (x->ra.sub == 0)
        pthread_cond_broadcast(&x->cv_compute);
}

/* Under mu: a read-ahead for FFN fi begins in the next set of the ring
 * (x->ra.cur), with room for half of what the caches can evict (the rest
 * is left to the step itself). false (nothing begun) when that set is
 * still reading from OFL_PF_SETS guesses back and the caller cannot wait
 * (the I/O thread, which would land those reads). */
static bool pf_begin(eng_ofl *x, uint32_t fi, bool may_wait)
{
    int set = (x->ra.cur + 1) % OFL_PF_SETS;
    struct ofl_pf *P = &x->ra.set[set];
    if (P->sub > 0 && !may_wait)
        return false;
    x->ra.cur = set;
    while (P->sub > 0)
        pthread_cond_wait(&x->cv_compute, &x->mu);
    P->fi = fi;
    P->n = 0;
    x->ra.room_g = pi2_ncache_evictable(x->cg) / 2;
    x->ra.room_u = x->cu ? pi2_ncache_evictable(x->cu) / 2 : 0;
    return true;
}

/* Under mu: the missing ones of n more picks (neurons, ascending) join the
 * running read-ahead, and their reads are queued. */
static void pf_add(eng_ofl *x, const uint32_t *picks, uint32_t n)
{
    struct ofl_pf *P = &x->ra.set[x->ra.cur];
    uint32_t fi = P->fi, hot = x->ghot_n[fi], m0 = P->n, m = m0, room = x->ra.room_g;
    for (uint32_t k = 0; k < n && m - m0 < room; k++) {
        uint32_t i = picks[k];
        if (i < hot || pi2_ncache_contains(x->cg, fi, i))
            continue;
        pi2_err er = {0};
        if (!pi2_ncache_reserve(x->cg, fi, i, false, &P->gslot[m], &er)) {
            if (er.code == PI2_EINVAL) /* in flight for the other prefetch */
                continue;
            room = m - m0; /* the cache is full: no more for this read-ahead */
            break;
        }
        P->sel[m] = i;
        P->flag[m] = F_GMISS;
        P->pos[i] = m + 1;
        if (x->spec && x->ra.room_u > 0 && !pi2_ncache_contains(x->cu, fi, i) &&
            pi2_ncache_reserve(x->cu, fi, i, false, &P->uslot[m], &er)) {
            P->flag[m] |= F_SPEC;
            x->ra.room_u--;
        }
        m++;
    }
    x->ra.room_g = room - (m - m0);
    P->n = m;
    plist l = {P->sel, NULL, P->flag};
    if (m > m0 && ofl_queue_reads(x, &l, J_PF, fi, (uint32_t)x->ra.cur, x->two_phase ? P_GATE : P_FULL, m0, m) > 0)
        pthread_cond_signal(&x->cv_io);
}

/* On the compute threads (the pool's predictor): read ahead for FFN f
 * (MoE, and plans whose compute threads take every core: there a guess on
 * the I/O thread would take a core from them; runtime/PERF.md). */
static void prefetch_ffn(pi2_engine *e, const eng_ffn *f)
{
    eng_ofl *x = e->ofl;
    uint32_t fi = ffn_index(x, f);
    uint32_t n = eng_predict_from(e, f, x->ra.in, x->ghot_n[fi], x->ra.list);
    pthread_mutex_lock(&x->mu);
    if (pf_begin(x, fi, true))
        pf_add(x, x->ra.list, n);
    pthread_mutex_unlock(&x->mu);
}

/* fc2 units the I/O thread scores between two rounds of submitting: the
 * first reads leave after the first units, not after the whole guess */
#define RA_UNITS_STEP 2

void ofl_ra_step(eng_ofl *x)
{
    pi2_engine *e = x->e;
    const eng_ffn *f = &e->layers[x->ra.want].ffn[0];
    uint32_t fi = ffn_index(x, f), n0 = x->ghot_n[fi];
    int64_t u = x->ra.step, u1 = u + RA_UNITS_STEP < x->ra.units ? u + RA_UNITS_STEP : x->ra.units;
    if (u < 0 && !pf_begin(x, fi, false)) {
        x->ra.want = -1;
        pthread_cond_broadcast(&x->cv_compute);
        return;
    }
    pthread_mutex_unlock(&x->mu);
    if (u < 0) {
        uint64_t bytes = 0;
        int64_t units = eng_pred_start_alone(e, f, x->ra.in, n0, &e->pb[1], &bytes);
        pthread_mutex_lock(&x->mu);
        x->ra.bytes += bytes;
        x->ra.units = units;
        x->ra.step = 0;
        return;
    }
    for (int64_t v = u; v < u1; v++)
        eng_pred_unit_alone(f, n0, v, x->ra.list + v * ENG_PRED_UNIT, &e->pb[1]);
    pthread_mutex_lock(&x->mu);
    for (int64_t v = u; v < u1 && x->ra.room_g > 0; v++)
        pf_add(x, x->ra.list + v * ENG_PRED_UNIT, e->pb[1].n[v]);
    x->ra.step = u1;
    if (u1 >= x->ra.units) {
        x->ra.want = -1;
        pthread_cond_broadcast(&x->cv_compute);
    }
}

void ofl_ra_wait(pi2_engine *e)
{
    eng_ofl *x = e->ofl;
    pthread_mutex_lock(&x->mu);
    while (x->ra.want >= 0)
        pthread_cond_wait(&x->cv_compute, &x->mu);
    e->st.weight_bytes += x->ra.bytes;
    x->ra.bytes = 0;
    pthread_mutex_unlock(&x->mu);
}

/* Before layer l's attention, every pass: its slot of the streamed ring
 * bound when its attention streams, or (a sparse decode) its predictors. */
int ofl_flash_layer_begin(pi2_engine *e, int l, bool decode, pi2_err *err)
{
    return ofl_ps_wants(e->ofl, l, decode && !e->dense) ? ofl_ps_need(e, l, err) : 0;
}

/* Decode, before layer l's attention: predict its FFN's neurons from the
 * residual xres (MoE: route it to guess the experts first, into
 * e->moe_guess[l]) and start reading the missing ones. */
int ofl_flash_layer_ahead(pi2_engine *e, int l, const float *xres, pi2_err *err)
{
    eng_ofl *x = e->ofl;
    (void)err; /* a read-ahead that cannot start is no error */
    if (e->dense) /* the predictors (streamed: bound by ofl_flash_layer_begin) do not run */
        return 0;
    const pi2_model_desc *d = &e->d;
    const eng_layer *L = &e->layers[l];
    if (!x->read_ahead)
        return 0;
    /* nothing to read when every neuron of the layer's FFNs is in memory:
     * the predictor (and router) would run for nothing */
    bool cold = false;
    for (uint32_t fi = (uint32_t)l * x->E; fi < (uint32_t)(l + 1) * x->E && !cold; fi++)
        cold = x->ghot_n[fi] < x->bl[fi]->neurons;
    if (!cold)
        return 0;
    pi2_op_rmsnorm(x->ra.in, xres, L->ffn_norm, d->hidden, d->rms_eps);
    if (!pi2_desc_is_moe(d)) {
        if (!L->ffn[0].has_pred)
            return 0;
        if (!x->pinned) { /* the compute threads have every core */
            prefetch_ffn(e, &L->ffn[0]);
            return 0;
        }
        /* the I/O thread has a core of its own: the guess runs there
         * (ofl_ra_step) while this one computes the attention */
        pthread_mutex_lock(&x->mu);
        x->ra.want = l;
        x->ra.step = -1;
        pthread_cond_signal(&x->cv_io);
        pthread_mutex_unlock(&x->mu);
        return 0;
    }
    /* MoE: the router on the same input guesses the experts (in the
     * engine's router buffer, which the layer's own routing uses after the
     * attention: on this thread); their predictors pick the neurons (the
     * guess's weights are not used) */
    int k = d->n_experts_used, *g = e->moe_guess + (size_t)l * k;
    eng_route(e, L->router, x->ra.in, g, e->moe_wk);
    for (int r = 0; r < k; r++)
        if (L->ffn[g[r]].has_pred)
            prefetch_ffn(e, &L->ffn[g[r]]);
    return 0;
}

/* ---------------- the read-ahead's buffers ---------------- */

bool ofl_ra_alloc(eng_ofl *x, uint32_t max_sel, uint64_t D)
{
    bool ok = true;
    for (int p = 0; p < OFL_PF_SETS; p++) {
        struct ofl_pf *P = &x->ra.set[p];
        P->fi = UINT32_MAX;
        P->sel = pi2_malloc_array(max_sel, sizeof *P->sel);
        P->gslot = pi2_malloc_array(max_sel, sizeof *P->gslot);
        P->uslot = pi2_malloc_array(max_sel, sizeof *P->uslot);
        P->flag = pi2_calloc_array(max_sel, 1);
        P->pos = pi2_calloc_array(max_sel, sizeof *P->pos);
        P->wait = pi2_calloc_array(max_sel, sizeof *P->wait);
        ok = ok && P->sel && P->gslot && P->uslot && P->flag && P->pos && P->wait;
    }
    x->ra.want = -1;
    x->ra.list = pi2_malloc_array(max_sel, sizeof *x->ra.list);
    x->ra.in = pi2_malloc_array((size_t)D, sizeof *x->ra.in);
    return ok && x->ra.list && x->ra.in;
}

void ofl_ra_free(eng_ofl *x)
{
    for (int p = 0; p < OFL_PF_SETS; p++) {
        free(x->ra.set[p].sel);
        free(x->ra.set[p].gslot);
        free(x->ra.set[p].uslot);
        free(x->ra.set[p].flag);
        free(x->ra.set[p].pos);
        free(x->ra.set[p].wait);
    }
    free(x->ra.list);
    free(x->ra.in);
}
