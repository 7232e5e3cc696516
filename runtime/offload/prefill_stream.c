/* pi2 offloading: the prefill's window stream (runtime/offload/offload.h). */
#include "runtime/offload/ofl_state.h"

#include <stdlib.h>

/* ---------------- prefill stream (under mu) ---------------- */

bool ofl_stream_wants(const eng_ofl *x)
{
    return x->st.active && !x->st.cancel && !x->st.failed && x->st.next < x->st.n &&
           x->st.next < x->st.consumed + OFL_NWIN;
}

void ofl_stream_fill(eng_ofl *x)
{
    while (ofl_stream_wants(x)) {
        uint32_t w = x->st.next++, b = w % OFL_NWIN;
        const ofl_win *W = &x->st.win[w];
        x->st.pending[b] = 0;
        for (uint64_t at = 0; at < W->len; at += OFL_SEQ_REQ) {
            uint32_t len = (uint32_t)(W->len - at < OFL_SEQ_REQ ? W->len - at : OFL_SEQ_REQ);
            ofl_rd rd = {.win = (int32_t)w, .len = len, .file_off = x->file_off[W->fi] + W->off + at,
                         .dst = x->st.buf[b] + at};
            ofl_rq_push(x, &rd);
            x->st.pending[b]++;
        }
    }
}

void ofl_stream_landed(eng_ofl *x, const ofl_req *r, const pi2_err *er)
{
    x->st.sub--;
    if (r->io.result < 0 && !x->st.failed) {
        x->st.failed = true;
        x->st.err = *er;
        if (!x->st.err.code)
            pi2_err_set(&x->st.err, PI2_EIO, "%s: read at offset %llu failed", x->e->path,
                        (unsigned long long)r->rd.file_off);
    }
    if (r->io.result >= 0) {
        x->cnt.pre_bytes += r->rd.len;
        uint32_t b = (uint32_t)r->rd.win % OFL_NWIN;
        if (--x->st.pending[b] == 0)
            x->st.ready[b] = r->rd.win;
    }
    pthread_cond_broadcast(&x->cv_stream);
}

/* ---------------- prefill stream (main thread side) ---------------- */

static void stream_end(pi2_engine *e)
{
    eng_ofl *x = e->ofl;
    pthread_mutex_lock(&x->mu);
    if (x->st.active) {
        x->st.cancel = true;
        x->q.n = 0; /* only stream reads are queued during a prefill step */
        while (x->st.sub > 0)
            pthread_cond_wait(&x->cv_stream, &x->mu);
        x->st.active = x->st.cancel = false;
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
    while (x->ra.sub > 0) /* a prefetch of the last decode step still reading */
        pthread_cond_wait(&x->cv_compute, &x->mu);
    x->st.active = true;
    x->st.cancel = x->st.failed = false;
    x->st.next = x->st.consumed = 0;
    x->st.cursor = 0;
    for (int b = 0; b < OFL_NWIN; b++)
        x->st.ready[b] = -1;
    pthread_cond_signal(&x->cv_io);
    pthread_mutex_unlock(&x->mu);
    return 0;
}

/* Wait for window w; its buffer, or NULL with err set. */
static const uint8_t *stream_get(eng_ofl *x, uint32_t w, pi2_err *err)
{
    const uint8_t *buf = NULL;
    pthread_mutex_lock(&x->mu);
    while (x->st.ready[w % OFL_NWIN] != (int32_t)w && !x->st.failed)
        pthread_cond_wait(&x->cv_stream, &x->mu);
    if (x->st.ready[w % OFL_NWIN] == (int32_t)w)
        buf = x->st.buf[w % OFL_NWIN];
    else
        pi2_err_set(err, x->st.err.code ? x->st.err.code : PI2_EIO, "%s", x->st.err.msg);
    pthread_mutex_unlock(&x->mu);
    return buf;
}

static void stream_release(eng_ofl *x, uint32_t w)
{
    pthread_mutex_lock(&x->mu);
    x->st.ready[w % OFL_NWIN] = -1;
    x->st.consumed = w + 1;
    pthread_cond_signal(&x->cv_io);
    pthread_mutex_unlock(&x->mu);
}

/* Consume FFN f's windows in order: compute each (T > 0) or skip it. */
static int ffn_windows(pi2_engine *e, const eng_ffn *f, int T, pi2_err *err)
{
    eng_ofl *x = e->ofl;
    uint32_t fi = ffn_index(x, f);
    const pi2_bl_ffn *b = x->bl[fi];
    if (x->st.cursor != x->st.first[fi])
        return pi2_err_set(err, PI2_EINVAL, "%s: prefill stream out of order (FFN %u)", e->path, fi);
    bool first = true;
    for (uint32_t n0 = 0; n0 < b->neurons; n0 += x->win_neurons) {
        uint32_t n1 = b->neurons - n0 > x->win_neurons ? n0 + x->win_neurons : b->neurons;
        uint32_t g0 = n0 / b->group, g1 = (n1 + b->group - 1) / b->group; /* the slots it reads */
        bool hot = (uint64_t)g1 * b->slot_bytes <= x->hot_len[fi];
        uint32_t w = x->st.cursor;
        if (!hot) {
            const uint8_t *buf = stream_get(x, w, err);
            if (!buf)
                return err->code;
            uint64_t base = (uint64_t)g0 * b->slot_bytes;
            for (uint32_t i = n0 > x->hot_n[fi] ? n0 : x->hot_n[fi]; i < n1; i++) {
                pi2_bl_rows at;
                pi2_bl_neuron_rows(b, x->R, x->P, x->two_phase, i, &at);
                for (int k = 0; k < 3; k++) { /* the window holds the whole slot, scales included */
                    at.pay[k] -= base;
                    at.sc[k] -= base;
                }
                bool gate = i >= x->ghot_n[fi]; /* hot gates keep their memory */
                ofl_set_rows(f, i, gate ? R_ALL : R_UP | R_DOWN, buf, &at);
            }
        }
        if (T > 0 && n1 > n0) {
            eng_ffn_prefill_range(e, f, T, n0, n1, first);
            first = false;
        }
        if (!hot) {
            stream_release(x, w);
            x->st.cursor++;
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
    else /* a pass that failed before its FFN leaves no guess running */
        ofl_ra_wait(e);
}

/* ---------------- the stream's buffers ---------------- */

/* The prefill stream: its buffers and its windows (every FFN's, in order,
 * but those inside the hot segment). */
int ofl_stream_open(pi2_engine *e, eng_ofl *x, pi2_err *err)
{
    bool ok = (x->st.first = pi2_malloc_array(x->n_ffn + 1, sizeof *x->st.first)) != NULL;
    for (int b = 0; ok && b < OFL_NWIN; b++)
        ok = (x->st.buf[b] = pi2_io_alloc_buf((size_t)x->wbuf_bytes)) != NULL;
    /* streamed prefill windows */
    uint32_t n_win = 0;
    for (uint32_t fi = 0; ok && fi < x->n_ffn; fi++)
        n_win += (x->bl[fi]->neurons + x->win_neurons - 1) / x->win_neurons;
    ok = ok && (x->st.win = pi2_malloc_array(n_win ? n_win : 1, sizeof *x->st.win)) != NULL;
    if (!ok)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory for the offloading buffers", e->path);
    for (uint32_t fi = 0; fi < x->n_ffn; fi++) {
        const pi2_bl_ffn *b = x->bl[fi];
        x->st.first[fi] = x->st.n;
        for (uint32_t n0 = 0; n0 < b->neurons; n0 += x->win_neurons) { /* as ffn_windows walks them */
            uint32_t n1 = b->neurons - n0 > x->win_neurons ? n0 + x->win_neurons : b->neurons;
            uint32_t g0 = n0 / b->group, g1 = (n1 + b->group - 1) / b->group;
            if ((uint64_t)g1 * b->slot_bytes <= x->hot_len[fi])
                continue; /* in the hot segment */
            x->st.win[x->st.n++] = (ofl_win){fi, (uint64_t)g0 * b->slot_bytes, (uint64_t)(g1 - g0) * b->slot_bytes};
        }
    }
    x->st.first[x->n_ffn] = x->st.n;
    for (int b = 0; b < OFL_NWIN; b++)
        x->st.ready[b] = -1;
    return 0;
}

void ofl_stream_free(eng_ofl *x)
{
    for (int b = 0; b < OFL_NWIN; b++)
        pi2_io_free_buf(x->st.buf[b]);
    free(x->st.win);
    free(x->st.first);
}
