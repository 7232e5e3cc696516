/* pi2 offloading: the prefill's window stream (runtime/offload/offload.h). */
#include "runtime/offload/offload_internal.h"

/* ---------------- prefill stream (under mu) ---------------- */

bool ofl_stream_wants(const eng_ofl *x)
{
    return x->s_active && !x->s_cancel && !x->s_failed && x->s_next < x->n_win &&
           x->s_next < x->s_consumed + OFL_NWIN;
}

void ofl_stream_fill(eng_ofl *x)
{
    while (ofl_stream_wants(x)) {
        uint32_t w = x->s_next++, b = w % OFL_NWIN;
        const ofl_win *W = &x->win[w];
        x->s_pending[b] = 0;
        for (uint64_t at = 0; at < W->len; at += OFL_SEQ_REQ) {
            uint32_t len = (uint32_t)(W->len - at < OFL_SEQ_REQ ? W->len - at : OFL_SEQ_REQ);
            ofl_rd rd = {.win = (int32_t)w, .len = len, .file_off = x->file_off[W->fi] + W->off + at,
                         .dst = x->wbuf[b] + at};
            ofl_rq_push(x, &rd);
            x->s_pending[b]++;
        }
    }
}

void ofl_stream_landed(eng_ofl *x, const ofl_req *r, const pi2_err *er)
{
    x->s_sub--;
    if (r->io.result < 0 && !x->s_failed) {
        x->s_failed = true;
        x->s_err = *er;
        if (!x->s_err.code)
            pi2_err_set(&x->s_err, PI2_EIO, "%s: read at offset %llu failed", x->e->path,
                        (unsigned long long)r->rd.file_off);
    }
    if (r->io.result >= 0) {
        x->c_pre_bytes += r->rd.len;
        uint32_t b = (uint32_t)r->rd.win % OFL_NWIN;
        if (--x->s_pending[b] == 0)
            x->s_ready[b] = r->rd.win;
    }
    pthread_cond_broadcast(&x->cv_stream);
}

/* ---------------- prefill stream (main thread side) ---------------- */

static void stream_end(pi2_engine *e)
{
    eng_ofl *x = e->ofl;
    pthread_mutex_lock(&x->mu);
    if (x->s_active) {
        x->s_cancel = true;
        x->rq_n = 0; /* only stream reads are queued during a prefill step */
        while (x->s_sub > 0)
            pthread_cond_wait(&x->cv_stream, &x->mu);
        x->s_active = x->s_cancel = false;
    }
    pthread_mutex_unlock(&x->mu);
}

/* Prefill: a stream of every FFN's flash windows, in layer / expert order,
 * read ahead while earlier ones compute. Every FFN is either computed or
 * skipped, in order. */
static int stream_begin(pi2_engine *e, pi2_err *err)
{
    eng_ofl *x = e->ofl;
    int rc = pi2_io_check_size(x->io, err);
    if (rc)
        return rc;
    stream_end(e); /* a previous step that did not end */
    pthread_mutex_lock(&x->mu);
    while (x->pf_sub > 0) /* a prefetch of the last decode step still reading */
        pthread_cond_wait(&x->cv_compute, &x->mu);
    x->s_active = true;
    x->s_cancel = x->s_failed = false;
    x->s_next = x->s_consumed = 0;
    x->s_cursor = 0;
    for (int b = 0; b < OFL_NWIN; b++)
        x->s_ready[b] = -1;
    pthread_cond_signal(&x->cv_io);
    pthread_mutex_unlock(&x->mu);
    return 0;
}

/* Wait for window w; its buffer, or NULL with err set. */
static const uint8_t *stream_get(eng_ofl *x, uint32_t w, pi2_err *err)
{
    const uint8_t *buf = NULL;
    pthread_mutex_lock(&x->mu);
    while (x->s_ready[w % OFL_NWIN] != (int32_t)w && !x->s_failed)
        pthread_cond_wait(&x->cv_stream, &x->mu);
    if (x->s_ready[w % OFL_NWIN] == (int32_t)w)
        buf = x->wbuf[w % OFL_NWIN];
    else
        pi2_err_set(err, x->s_err.code ? x->s_err.code : PI2_EIO, "%s", x->s_err.msg);
    pthread_mutex_unlock(&x->mu);
    return buf;
}

static void stream_release(eng_ofl *x, uint32_t w)
{
    pthread_mutex_lock(&x->mu);
    x->s_ready[w % OFL_NWIN] = -1;
    x->s_consumed = w + 1;
    pthread_cond_signal(&x->cv_io);
    pthread_mutex_unlock(&x->mu);
}

/* Consume FFN f's windows in order: compute each (T > 0) or skip it. */
static int ffn_windows(pi2_engine *e, const eng_ffn *f, int T, pi2_err *err)
{
    eng_ofl *x = e->ofl;
    uint32_t fi = ffn_index(x, f);
    const pi2_bl_ffn *b = x->bl[fi];
    if (x->s_cursor != x->win_first[fi])
        return pi2_err_set(err, PI2_EINVAL, "%s: prefill stream out of order (FFN %u)", e->path, fi);
    bool first = true;
    for (uint32_t g0 = 0; g0 < b->groups; g0 += x->win_groups) {
        uint32_t g1 = g0 + x->win_groups < b->groups ? g0 + x->win_groups : b->groups;
        uint32_t n0 = g0 * b->group, n1 = g1 * b->group < b->neurons ? g1 * b->group : b->neurons;
        bool hot = (uint64_t)g1 * b->slot_bytes <= x->hot_len[fi];
        uint32_t w = x->s_cursor;
        if (!hot) {
            const uint8_t *buf = stream_get(x, w, err);
            if (!buf)
                return err->code;
            uint64_t base = (uint64_t)g0 * b->slot_bytes;
            for (uint32_t i = n0 > x->hot_n[fi] ? n0 : x->hot_n[fi]; i < n1; i++) {
                uint64_t off[3];
                pi2_bl_neuron_offsets(b, x->R, x->two_phase, i, off);
                bool gate = i >= x->ghot_n[fi]; /* hot gates keep their memory */
                ofl_set_rows(f, i, gate ? R_ALL : R_UP | R_DOWN, gate ? buf + (off[0] - base) : NULL,
                             buf + (off[1] - base), buf + (off[2] - base));
            }
        }
        if (T > 0 && n1 > n0) {
            eng_ffn_prefill_range(e, f, T, n0, n1, first);
            first = false;
        }
        if (!hot) {
            stream_release(x, w);
            x->s_cursor++;
        }
    }
    return 0;
}

int ofl_flash_prefill(pi2_engine *e, const eng_ffn *f, int T, float *out, bool accumulate, float w, pi2_err *err)
{
    int rc = ffn_windows(e, f, T, err);
    if (rc)
        return rc;
    eng_ffn_reduce(e, T, out, accumulate, w);
    return 0;
}

int ofl_flash_skip(pi2_engine *e, const eng_ffn *f, pi2_err *err) { return ffn_windows(e, f, 0, err); }

int ofl_flash_begin_pass(pi2_engine *e, bool decode, pi2_err *err) { return decode ? 0 : stream_begin(e, err); }

void ofl_flash_end_pass(pi2_engine *e, bool decode)
{
    if (!decode)
        stream_end(e);
}
