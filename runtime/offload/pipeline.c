/* pi2 offloading: the decode job, the pipeline between the I/O thread and
 * the compute threads (runtime/offload/offload.h). */
#include "runtime/offload/ofl_state.h"
#include "runtime/units.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>

/* ---------------- the decode job (everything here runs under mu) ---------------- */

void ofl_job_fail(eng_ofl *x, const pi2_err *er)
{
    if (x->job.fail)
        return;
    x->job.fail = true;
    x->job.fail_err = *er;
    if (!x->job.fail_err.code)
        x->job.fail_err.code = PI2_EIO;
    atomic_store_explicit(&x->job.hint, 1u, memory_order_release);
    pthread_cond_broadcast(&x->cv_compute);
}

void ofl_rq_push(eng_ofl *x, const ofl_rd *rd)
{
    if (x->q.n == x->rq_cap) { /* sized for the worst case: a bug */
        pi2_err er = {0};
        pi2_err_set(&er, PI2_ERANGE, "%s: internal read queue overflow", x->e->path);
        ofl_job_fail(x, &er);
        return;
    }
    x->q.rq[(x->q.head + x->q.n) % x->rq_cap] = *rd;
    x->q.n++;
}

void ofl_make_ready(eng_ofl *x, uint32_t c)
{
    ofl_chunk *C = &x->job.ch[c];
    C->state = C->state == CH_IO || C->state == CH_WAIT ? CH_READY : CH_UD_READY;
    x->job.ready[(x->job.ready_head + x->job.ready_n) % x->ready_cap] = c;
    x->job.ready_n++;
    atomic_store_explicit(&x->job.hint, 1u, memory_order_release);
    if (x->job.n_sleeping > 0)
        pthread_cond_signal(&x->cv_compute);
}

/* Queue one read per bundle group of the missing parts among list indexes
 * [a, b) of FFN fi; returns the number of reads. */
int ofl_queue_reads(eng_ofl *x, const plist *l, uint8_t job, uint32_t fi, uint32_t c, int part, uint32_t a,
                       uint32_t b)
{
    uint8_t miss = part == P_UD ? F_UMISS : F_GMISS;
    uint64_t unit = file_unit(x, part);
    const pi2_bl_ffn *bf = x->bl[fi];
    int n = 0;
    uint32_t idx = a;
    while (idx < b) {
        uint32_t k = pl_k(l, idx);
        if (!(l->flag[k] & miss)) {
            idx++;
            continue;
        }
        uint32_t i = l->sel[k], q = i / bf->group, last = idx;
        int64_t spec_last = (l->flag[k] & F_SPEC) ? (int64_t)(i % bf->group) : -1;
        for (uint32_t t = idx + 1; t < b; t++) {
            uint32_t kt = pl_k(l, t);
            if (l->sel[kt] / bf->group != q)
                break;
            if (l->flag[kt] & miss)
                last = t;
            if (l->flag[kt] & F_SPEC)
                spec_last = l->sel[kt] % bf->group;
        }
        uint32_t jl = l->sel[pl_k(l, last)] % bf->group, jf = i % bf->group;
        uint64_t s0 = part_base(x, part, q) + jf * unit, s1 = part_base(x, part, q) + (jl + 1) * unit;
        if (spec_last >= 0) /* through the up+down rows read along */
            s1 = part_base(x, P_UD, q) + (uint64_t)(spec_last + 1) * file_unit(x, P_UD);
        s0 = s0 / PI2_IO_ALIGN * PI2_IO_ALIGN;
        s1 = (s1 + PI2_IO_ALIGN - 1) / PI2_IO_ALIGN * PI2_IO_ALIGN;
        ofl_rd rd = {.win = -1, .job = job, .fi = fi, .chunk = c, .part = (uint8_t)part, .a = idx, .b = last,
                     .span = s0, .len = (uint32_t)(s1 - s0), .file_off = x->file_off[fi] + s0};
        ofl_rq_push(x, &rd);
        if (job == J_PF) {
            x->ra.set[c].sub++;
            x->ra.sub++;
        } else
            x->job.n_sub++;
        n++;
        idx = last + 1;
    }
    return n;
}

/* Hold or reserve every non-hot part among list indexes [a, b): false (and
 * nothing done) when the cache cannot take them now. */
static bool admit_parts(eng_ofl *x, uint32_t c, int part, uint32_t a, uint32_t b)
{
    pi2_ncache *cache = cache_of(x, part);
    uint32_t hot = part == P_GATE ? x->ghot_n[x->job.fi] : x->hot_n[x->job.fi], need = 0;
    for (uint32_t idx = a; idx < b; idx++)
        need += x->job.sel[pos_at(x, part, idx)] >= hot;
    if (need > pi2_ncache_evictable(cache))
        return false;
    bool ud = part == P_UD;
    uint32_t *slot = ud ? x->job.uslot : x->job.gslot;
    uint8_t held = ud ? F_UHELD : F_GHELD, miss = ud ? F_UMISS : F_GMISS;
    x->cnt.parts += b - a;
    x->cnt.hot += (b - a) - need;
    struct ofl_pf *pfs[OFL_PF_SETS];
    int n_pfs = 0;
    for (int p = 0; part != P_UD && p < OFL_PF_SETS; p++)
        if (x->ra.set[p].fi == x->job.fi && x->ra.set[p].sub > 0)
            pfs[n_pfs++] = &x->ra.set[p];
    int n_wait = 0;
    for (uint32_t idx = a; idx < b; idx++) { /* hits first: reserves must not evict them */
        uint32_t k = pos_at(x, part, idx), i = x->job.sel[k];
        if (i < hot)
            continue;
        struct ofl_pf *P = NULL;
        for (int p = 0; p < n_pfs && !P; p++)
            P = pfs[p]->pos[i] ? pfs[p] : NULL;
        if (P) { /* being read by the prefetch: it hands the part over */
            P->wait[i] = k + 1;
            x->job.flag[k] |= F_PFWAIT;
            n_wait++;
            x->cnt.pfwait++;
            continue;
        }
        uint8_t *buf = pi2_ncache_hold(cache, x->job.fi, i, &slot[k]);
        if (buf) {
            x->job.flag[k] |= held;
            set_ptr(x, x->job.f, part, i, buf);
            x->cnt.hit++;
        } else {
            x->job.flag[k] |= miss;
        }
    }
    for (uint32_t idx = a; idx < b; idx++) {
        uint32_t k = pos_at(x, part, idx);
        if (!(x->job.flag[k] & miss))
            continue;
        pi2_err er = {0};
        uint8_t *buf = pi2_ncache_reserve(cache, x->job.fi, x->job.sel[k], false, &slot[k], &er);
        if (!buf) {
            x->job.flag[k] &= (uint8_t)~miss;
            ofl_job_fail(x, &er);
            return true;
        }
        if (ud) /* the scales ride in the gate unit, held (or in memory) until this admission */
            ofl_fill_ud(x, buf, NULL, x->job.f->gate.rp[x->job.sel[k]] + x->R);
        x->cnt.read++;
    }
    if (part == P_GATE && x->spec) { /* read up+down along with each missing gate: one read, one round trip */
        uint32_t want = 0;
        for (uint32_t idx = a; idx < b; idx++)
            want += (x->job.flag[idx] & F_GMISS) && !pi2_ncache_contains(x->cu, x->job.fi, x->job.sel[idx]);
        if (want > 0 && want <= pi2_ncache_evictable(x->cu))
            for (uint32_t idx = a; idx < b; idx++) {
                if (!(x->job.flag[idx] & F_GMISS) || pi2_ncache_contains(x->cu, x->job.fi, x->job.sel[idx]))
                    continue;
                pi2_err er = {0};
                if (pi2_ncache_reserve(x->cu, x->job.fi, x->job.sel[idx], false, &x->job.uslot[idx], &er))
                    x->job.flag[idx] |= F_SPEC;
            }
    }
    ofl_chunk *C = &x->job.ch[c];
    C->state = ud ? CH_UD_IO : CH_IO;
    plist l = {x->job.sel, ud ? x->job.fired : NULL, x->job.flag};
    C->pending = ofl_queue_reads(x, &l, J_DEC, x->job.fi, c, part, a, b) + n_wait;
    if (C->pending == 0)
        ofl_make_ready(x, c);
    else
        pthread_cond_signal(&x->cv_io);
    return true;
}

static void release_chunk(eng_ofl *x, uint32_t c, uint8_t which)
{
    ofl_chunk *C = &x->job.ch[c];
    for (uint32_t k = C->k0; k < C->k1; k++) {
        if ((which & F_GHELD) && (x->job.flag[k] & F_GHELD)) {
            pi2_ncache_release(x->cg, x->job.gslot[k]);
            x->job.flag[k] &= (uint8_t)~F_GHELD;
        }
        if ((which & F_UHELD) && (x->job.flag[k] & F_UHELD)) {
            pi2_ncache_release(x->cu, x->job.uslot[k]);
            x->job.flag[k] &= (uint8_t)~F_UHELD;
        }
    }
}

/* Admit what the caches can take now: chunks waiting for up+down first,
 * then new chunks in order. */
void ofl_admit(eng_ofl *x)
{
    while (!x->job.fail && x->job.ud_n > 0) {
        uint32_t c = x->job.ud_wait[x->job.ud_head];
        ofl_chunk *C = &x->job.ch[c];
        if (!admit_parts(x, c, P_UD, C->k0, C->k0 + C->n_fired))
            break;
        release_chunk(x, c, F_GHELD); /* the up and down scales are copied from the gates */
        x->job.ud_head = (x->job.ud_head + 1) % x->max_ch;
        x->job.ud_n--;
    }
    while (!x->job.fail && x->job.next_admit < x->job.n_ch) {
        ofl_chunk *C = &x->job.ch[x->job.next_admit];
        if (!admit_parts(x, x->job.next_admit, x->two_phase ? P_GATE : P_FULL, C->k0, C->k1))
            break;
        x->job.next_admit++;
    }
}

/* A compute thread finished a step of chunk c: M_UD (gates computed, some
 * fired) or M_DONE. */
static void chunk_step_done(eng_ofl *x, uint8_t type, uint32_t c)
{
    x->job.running--;
    if (x->job.fail)
        return;
    if (type == M_UD) { /* the gates stay held until the up+down admission copies their scales */
        x->job.ch[c].state = CH_UD_WAIT;
        x->job.ud_wait[(x->job.ud_head + x->job.ud_n) % x->max_ch] = c;
        x->job.ud_n++;
    } else {
        release_chunk(x, c, F_GHELD | F_UHELD);
        x->job.ch[c].state = CH_DONE;
        if (++x->job.n_done == x->job.n_ch) {
            x->job.finished = true;
            atomic_store_explicit(&x->job.hint, 1u, memory_order_release);
            pthread_cond_broadcast(&x->cv_compute);
            return;
        }
    }
    ofl_admit(x);
}

/* A decode read landed (its bytes already copied into the reserved slots). */
void ofl_decode_landed(eng_ofl *x, const ofl_rd *rd)
{
    x->job.n_sub--;
    if (x->job.fail) {
        if (x->job.n_sub == 0)
            pthread_cond_broadcast(&x->cv_compute);
        return;
    }
    int part = rd->part;
    pi2_ncache *cache = cache_of(x, part);
    uint8_t miss = part == P_UD ? F_UMISS : F_GMISS, held = part == P_UD ? F_UHELD : F_GHELD;
    uint32_t *slot = part == P_UD ? x->job.uslot : x->job.gslot;
    for (uint32_t idx = rd->a; idx <= rd->b; idx++) {
        uint32_t k = pos_at(x, part, idx);
        if (!(x->job.flag[k] & miss))
            continue;
        pi2_ncache_commit_hold(cache, slot[k]);
        x->job.flag[k] = (uint8_t)((x->job.flag[k] & ~miss) | held);
        set_ptr(x, x->job.f, part, x->job.sel[k], pi2_ncache_slot_buf(cache, slot[k]));
        if (x->job.flag[k] & F_SPEC) { /* cached, not held: the up+down step holds it if the gate fires */
            pi2_ncache_commit(x->cu, x->job.uslot[k]);
            x->job.flag[k] &= (uint8_t)~F_SPEC;
        }
    }
    x->cnt.reads++;
    x->cnt.bytes += rd->len;
    ofl_chunk *C = &x->job.ch[rd->chunk];
    if (--C->pending == 0)
        ofl_make_ready(x, rd->chunk);
}

void ofl_fill_ud(const eng_ofl *x, uint8_t *dst, const uint8_t *ud, const uint8_t *sc)
{
    size_t R = (size_t)x->R, P = (size_t)x->P, C = R - P;
    if (ud) {
        memcpy(dst, ud, P);
        memcpy(dst + R, ud + P, P);
    }
    if (sc) {
        memcpy(dst + P, sc, C);
        memcpy(dst + R + P, sc + C, C);
    }
}

void ofl_copy_part(const eng_ofl *x, int part, uint32_t i, const uint8_t *staging, uint64_t span, uint8_t *buf,
                   uint8_t *ud)
{
    uint32_t q = i / x->g, j = i % x->g;
    const uint8_t *at = staging + (part_base(x, part, q) + (uint64_t)j * file_unit(x, part) - span);
    if (part == P_UD) /* payloads only: the admission put the scales in */
        ofl_fill_ud(x, buf, at, NULL);
    else
        memcpy(buf, at, (size_t)part_unit(x, part));
    if (ud) /* read along with the gate unit at `at`, which holds the scales */
        ofl_fill_ud(x, ud, staging + (part_base(x, P_UD, q) + (uint64_t)j * file_unit(x, P_UD) - span), at + x->R);
}

/* Outside mu, in the I/O thread: copy a landed read's parts into their
 * reserved slots (only this read writes them). */
void ofl_decode_copy(eng_ofl *x, const ofl_req *r)
{
    const ofl_rd *rd = &r->rd;
    int part = rd->part;
    pi2_ncache *cache = cache_of(x, part);
    uint8_t miss = part == P_UD ? F_UMISS : F_GMISS;
    const uint32_t *slot = part == P_UD ? x->job.uslot : x->job.gslot;
    for (uint32_t idx = rd->a; idx <= rd->b; idx++) {
        uint32_t k = pos_at(x, part, idx);
        if (!(x->job.flag[k] & miss))
            continue;
        uint8_t *ud = x->job.flag[k] & F_SPEC ? pi2_ncache_slot_buf(x->cu, x->job.uslot[k]) : NULL;
        ofl_copy_part(x, part, x->job.sel[k], r->staging, rd->span, pi2_ncache_slot_buf(cache, slot[k]), ud);
    }
}

/* ---------------- compute side of a decode job ---------------- */

/* One-phase chunk, or the gate step of a two-phase chunk (runtime/ffn.c). */
static uint8_t run_gates(eng_ofl *x, eng_tls *s, uint32_t c)
{
    const eng_ffn *f = x->job.f;
    ofl_chunk *C = &x->job.ch[c];
    int n = (int)(C->k1 - C->k0);
    const uint32_t *idx = x->job.sel + C->k0;
    if (x->two_phase) {
        ffn_chunk_gate(&x->job.dec, s, idx, n);
        s->predicted += (uint64_t)n;
        s->bytes += (uint64_t)n * f->gate.row_bytes;
        uint32_t nf = 0;
        for (int q = 0; q < n; q++) {
            x->job.gval[C->k0 + (uint32_t)q] = s->g[q];
            if (s->g[q] > x->job.dec.gate_thr)
                x->job.fired[C->k0 + nf++] = C->k0 + (uint32_t)q;
        }
        C->n_fired = nf;
        return nf ? M_UD : M_DONE;
    }
    ffn_counts k = ffn_chunk(&x->job.dec, s, idx, 0, n, x->job.parts + (size_t)c * (size_t)x->job.dec.D, NULL, 0);
    C->has_out = k.down > 0;
    s->predicted += (uint64_t)k.gate;
    s->active += (uint64_t)k.down;
    s->bytes += (uint64_t)k.gate * f->gate.row_bytes + (uint64_t)k.up * f->up.row_bytes +
                (uint64_t)k.down * f->down.row_bytes;
    return M_DONE;
}

/* The up+down step of a two-phase chunk: its fired neurons. */
static void run_updown(eng_ofl *x, eng_tls *s, uint32_t c)
{
    const eng_ffn *f = x->job.f;
    ofl_chunk *C = &x->job.ch[c];
    int nf = (int)C->n_fired;
    int a = ffn_chunk_updown(&x->job.dec, s, x->job.sel, x->job.gval, x->job.fired + C->k0, nf,
                             x->job.parts + (size_t)c * (size_t)x->job.dec.D);
    C->has_out = a > 0;
    s->active += (uint64_t)a;
    s->bytes += (uint64_t)a * f->down.row_bytes + (uint64_t)nf * f->up.row_bytes;
}

static void compute_fn(void *ctx, int tid, int nt)
{
    (void)nt;
    eng_ofl *x = ctx;
    eng_tls *s = &x->e->tls[tid];
    pthread_mutex_lock(&x->mu);
    for (;;) {
        if (x->job.fail || x->job.finished)
            break;
        if (x->job.ready_n == 0) {
            if (x->job.running == 0 && x->q.n == 0 && x->job.n_sub == 0 && x->ra.sub == 0) {
                /* nothing computing, nothing in flight, and no admission possible */
                pi2_err er = {0};
                pi2_err_set(&er, PI2_ENOMEM, "%s: the neuron cache is too small for one chunk of neurons",
                            x->e->path);
                ofl_job_fail(x, &er);
                break;
            }
            /* reads land every few microseconds: spin (yielding) before sleeping;
             * idle time counts as I/O wait when reads are outstanding */
            double t0 = x->job.n_sub + x->ra.sub + x->q.n > 0 ? pi2_now() : 0.0;
            atomic_store_explicit(&x->job.hint, 0u, memory_order_relaxed);
            pthread_mutex_unlock(&x->mu);
            for (int i = 0; i < OFL_SPIN && atomic_load_explicit(&x->job.hint, memory_order_acquire) == 0; i++)
                if (i % 64 == 63)
                    sched_yield();
            pthread_mutex_lock(&x->mu);
            while (x->job.ready_n == 0 && !x->job.fail && !x->job.finished) {
                x->job.n_sleeping++;
                pthread_cond_wait(&x->cv_compute, &x->mu);
                x->job.n_sleeping--;
            }
            if (t0 > 0)
                s->wait += pi2_now() - t0;
            continue;
        }
        uint32_t c = x->job.ready[x->job.ready_head];
        x->job.ready_head = (x->job.ready_head + 1) % x->ready_cap;
        x->job.ready_n--;
        x->job.running++;
        int state = x->job.ch[c].state;
        pthread_mutex_unlock(&x->mu);
        uint8_t msg;
        if (state == CH_UD_READY) {
            run_updown(x, s, c);
            msg = M_DONE;
        } else {
            msg = run_gates(x, s, c);
        }
        pthread_mutex_lock(&x->mu);
        chunk_step_done(x, msg, c);
    }
    pthread_mutex_unlock(&x->mu);
}

typedef struct ofl_reduce {
    eng_ofl *x;
    float *out;
    bool accumulate;
    float w;
} ofl_reduce;

static void reduce_fn(void *ctx, int tid, int nt)
{
    ofl_reduce *r = ctx;
    eng_ofl *x = r->x;
    int64_t D = x->e->d.hidden;
    for (int64_t u; (u = eng_share_next(x->e, tid, nt)) >= 0;) {
        int64_t b = u * ENG_SUM_UNIT, en = b + ENG_SUM_UNIT < D ? b + ENG_SUM_UNIT : D;
        eng_sum_rows(r->out, x->job.parts, D, x->job.out_rows, x->job.n_out, b, en, r->accumulate, r->w);
    }
}

/* After a failed job, no read in flight: drop reservations and holds. */
static void job_cleanup(eng_ofl *x)
{
    for (uint32_t k = 0; k < x->job.n_sel; k++) {
        uint8_t fl = x->job.flag[k];
        if (fl & F_GMISS)
            pi2_ncache_abort(x->cg, x->job.gslot[k]);
        else if (fl & F_GHELD)
            pi2_ncache_release(x->cg, x->job.gslot[k]);
        if (fl & (F_UMISS | F_SPEC))
            pi2_ncache_abort(x->cu, x->job.uslot[k]);
        if (fl & F_PFWAIT) {
            for (int p = 0; p < OFL_PF_SETS; p++)
                if (x->ra.set[p].fi == x->job.fi)
                    x->ra.set[p].wait[x->job.sel[k]] = 0;
        }
        else if (fl & F_UHELD)
            pi2_ncache_release(x->cu, x->job.uslot[k]);
        x->job.flag[k] = 0;
    }
}

/* Decode FFN of n_sel neurons e->sel[0..n_sel) (mode FFN_*), into out. */
int ofl_flash_decode(pi2_engine *e, const eng_ffn *f, uint32_t n_sel, int mode, float *out, bool accumulate,
                        float w, pi2_err *err)
{
    eng_ofl *x = e->ofl;
    ofl_ra_wait(e);
    int rc = pi2_io_check_size(x->io, err);
    /* streamed predictors: this layer's have run (one FFN a layer), the
     * next read can start */
    if (rc == 0 && x->E == 1)
        rc = ofl_ps_release(e, err);
    if (rc)
        return rc;
    if (mode != FFN_PRED) {
        for (uint32_t i = 0; i < f->n_ff; i++)
            e->sel[i] = i;
        n_sel = f->n_ff;
    }
    e->st.ffn_evals++;
    e->st.neurons += f->n_ff;
    if (n_sel == 0) {
        if (!accumulate)
            memset(out, 0, (size_t)e->d.hidden * sizeof(float));
        return 0;
    }
    for (int t = 0; t < e->threads; t++) {
        eng_tls *s = &e->tls[t];
        s->predicted = s->active = s->bytes = 0;
        s->wait = 0;
    }
    pthread_mutex_lock(&x->mu);
    x->job.f = f;
    x->job.fi = ffn_index(x, f);
    x->job.dec = ffn_dec_of(e, f, mode);
    x->job.sel = e->sel;
    x->job.n_sel = n_sel;
    x->job.n_ch = (n_sel + FFN_CHUNK - 1) / FFN_CHUNK;
    x->job.next_admit = x->job.n_done = x->job.running = 0;
    x->job.ud_head = x->job.ud_n = 0;
    x->job.ready_head = x->job.ready_n = 0;
    x->job.fail = x->job.finished = false;
    memset(x->job.flag, 0, n_sel);
    for (uint32_t c = 0; c < x->job.n_ch; c++) {
        uint32_t k1 = (c + 1) * FFN_CHUNK;
        x->job.ch[c] = (ofl_chunk){.k0 = c * FFN_CHUNK, .k1 = k1 < n_sel ? k1 : n_sel, .state = CH_WAIT};
    }
    ofl_admit(x);
    pthread_mutex_unlock(&x->mu);
    pi2_pool_run_shared(e->pool, compute_fn, x);
    pthread_mutex_lock(&x->mu);
    while (x->job.n_sub > 0) /* failed: wait for the reads in flight */
        pthread_cond_wait(&x->cv_compute, &x->mu);
    bool failed = x->job.fail;
    if (failed)
        job_cleanup(x);
    x->job.f = NULL;
    pthread_mutex_unlock(&x->mu);
    double wait = 0;
    for (int t = 0; t < e->threads; t++) {
        e->st.predicted += e->tls[t].predicted;
        e->st.active += e->tls[t].active;
        e->st.weight_bytes += e->tls[t].bytes;
        wait += e->tls[t].wait;
    }
    x->cnt.wait += wait / e->threads;
    if (failed)
        return pi2_err_set(err, x->job.fail_err.code, "%s", x->job.fail_err.msg);
    x->job.n_out = 0;
    for (uint32_t c = 0; c < x->job.n_ch; c++)
        if (x->job.ch[c].has_out)
            x->job.out_rows[x->job.n_out++] = c;
    ofl_reduce r = {x, out, accumulate, w};
    eng_run_units(e, (e->d.hidden + ENG_SUM_UNIT - 1) / ENG_SUM_UNIT, reduce_fn, &r);
    return 0;
}

/* ---------------- the job's buffers ---------------- */

bool ofl_job_alloc(eng_ofl *x, uint32_t max_sel, uint64_t D)
{
    x->q.reqs = pi2_calloc_array((size_t)x->depth, sizeof *x->q.reqs);
    x->q.free = pi2_malloc_array((size_t)x->depth, sizeof *x->q.free);
    x->q.staging = pi2_io_alloc_buf((size_t)x->depth * x->staging_bytes);
    x->q.rq = pi2_malloc_array(x->rq_cap, sizeof *x->q.rq);
    x->job.ch = pi2_calloc_array(x->max_ch, sizeof *x->job.ch);
    x->job.ud_wait = pi2_malloc_array(x->max_ch, sizeof *x->job.ud_wait);
    x->job.gslot = pi2_malloc_array(max_sel, sizeof *x->job.gslot);
    x->job.uslot = pi2_malloc_array(max_sel, sizeof *x->job.uslot);
    x->job.fired = pi2_malloc_array(max_sel, sizeof *x->job.fired);
    x->job.gval = pi2_malloc_array(max_sel, sizeof *x->job.gval);
    x->job.flag = pi2_calloc_array(max_sel, 1);
    x->job.parts = pi2_malloc_array((size_t)x->max_ch * D, sizeof(float));
    x->job.out_rows = pi2_malloc_array(x->max_ch, sizeof *x->job.out_rows);
    x->job.ready = pi2_malloc_array(x->ready_cap, sizeof *x->job.ready);
    x->q.subs = pi2_malloc_array((size_t)x->depth, sizeof *x->q.subs);
    if (!(x->q.reqs && x->q.free && x->q.staging && x->q.rq && x->q.subs))
        return false;
    if (!(x->job.ch && x->job.ud_wait && x->job.gslot && x->job.uslot && x->job.fired && x->job.gval && x->job.flag &&
          x->job.parts && x->job.out_rows && x->job.ready))
        return false;
    for (int i = 0; i < x->depth; i++) {
        x->q.reqs[i].staging = x->q.staging + (size_t)i * x->staging_bytes;
        x->q.free[x->q.n_free++] = &x->q.reqs[i];
    }
    return true;
}

void ofl_job_free(eng_ofl *x)
{
    free(x->q.reqs);
    free(x->q.free);
    pi2_io_free_buf(x->q.staging);
    free(x->q.rq);
    free(x->job.ch);
    free(x->job.ud_wait);
    free(x->job.gslot);
    free(x->job.uslot);
    free(x->job.fired);
    free(x->job.gval);
    free(x->job.flag);
    free(x->job.parts);
    free(x->job.out_rows);
    free(x->job.ready);
    free(x->q.subs);
}
