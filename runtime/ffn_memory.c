/* pi2 engine: the memory FFN source (runtime/ffn_source.h): every weight in
 * the mapping or the resident region. */
#include "runtime/state.h"
#include "runtime/ffn.h"
#include "runtime/ffn_source.h"
#include "runtime/units.h"

#include <stdatomic.h>
#include <string.h>

static int mem_prefill(pi2_engine *e, const eng_ffn *f, int T, float *out, bool accumulate, float w, pi2_err *err)
{
    (void)err;
    eng_ffn_prefill_range(e, f, T, 0, f->n_ff, true);
    eng_ffn_reduce(e, T, out, accumulate, w);
    return 0;
}

/* ---- FFN decode: one token ---- */

typedef struct ffn_dec_job {
    pi2_engine *e;
    const eng_ffn *f;
    int mode;        /* 0 dense, 1 predictor, 2 threshold */
    uint32_t n_sel;  /* predictor: e->sel[0..n_sel) */
    ffn_dec dec;     /* what its chunks share */
    int64_t chunks;
    _Atomic int64_t done; /* chunks computed */
    float *out;           /* the sum of the chunks' outputs (accumulate: out += w * sum) */
    float w;
    bool accumulate;
} ffn_dec_job;

/* Dense decode: [*p, *p + *len) = the bytes of the neurons of the chunk
 * after the one at c0 when they lie together, as in a bundled FFN (each
 * neuron's gate, up and down rows side by side); else *len = 0. A pass
 * over a bundle's gate and up rows skips every third row, which the
 * hardware prefetcher does not run ahead over, so this chunk's passes
 * bring the next chunk toward the core while they compute (the gate and
 * up pass two thirds, the down pass the rest): the thread takes the
 * chunks of its share in order (eng_share_next). Figures: runtime/PERF.md. */
static void chunk_ahead(const eng_ffn *f, int64_t c0, int64_t total, const uint8_t **p, int64_t *len)
{
    *p = NULL;
    *len = 0;
    int64_t a0 = c0 + FFN_CHUNK, a1 = a0 + FFN_CHUNK < total ? a0 + FFN_CHUNK : total;
    if (a0 >= total)
        return;
    /* the last down row's payload or its scales, whichever ends later (two-phase: the scales are in the
     * gate unit, before the payloads) */
    const uint8_t *st = f->gate.rp[a0], *en = f->down.rp[a1 - 1] + pi2_q_payload_row_bytes(f->down.qt, f->down.cols);
    const uint8_t *es = (const uint8_t *)(f->down.rs[a1 - 1] + pi2_q_scale_row_count(f->down.qt, f->down.cols));
    en = es > en ? es : en;
    uint64_t most = 4 * (uint64_t)(a1 - a0) * (f->gate.row_bytes + f->up.row_bytes + f->down.row_bytes);
    if (f->up.rp[a0] > st && f->down.rp[a0] > st && en > st && (uint64_t)(en - st) <= most) {
        *p = st;
        *len = en - st;
    }
}

/* Chunk c of the decode FFN (runtime/ffn.c), into the chunk's own output. */
static void ffn_dec_chunk(const ffn_dec_job *j, eng_tls *s, int64_t c, int64_t total, uint64_t *n_up,
                          uint64_t *n_down)
{
    pi2_engine *e = j->e;
    int64_t c0 = c * FFN_CHUNK;
    int n = (int)(total - c0 < FFN_CHUNK ? total - c0 : FFN_CHUNK);
    const uint32_t *idx = j->mode == FFN_PRED ? e->sel + c0 : NULL;
    const uint8_t *ahead = NULL;
    int64_t ahead_len = 0;
    if (!idx && e->ahead)
        chunk_ahead(j->f, c0, total, &ahead, &ahead_len);
    ffn_counts k = ffn_chunk(&j->dec, s, idx, (uint32_t)c0, n, e->dec_out + c * j->dec.D, ahead, ahead_len);
    s->predicted += (uint64_t)k.gate;
    *n_up += (uint64_t)k.up;
    *n_down += (uint64_t)k.down;
}

/* The chunks' outputs added in chunk order, by whichever thread computed
 * the last chunk: the sums are those of a reduce job of their own (and
 * of any thread count), without one more round through the pool, which
 * cost more than the adds (a predicted FFN has a few chunks). */
static void ffn_dec_done(ffn_dec_job *j)
{
    if (atomic_fetch_add_explicit(&j->done, 1, memory_order_acq_rel) + 1 == j->chunks)
        eng_sum_rows(j->out, j->e->dec_out, j->dec.D, NULL, j->chunks, 0, j->dec.D, j->accumulate, j->w);
}

/* The decode FFN's chunks, shared out as above: a static split also left
 * one thread idle for up to a quarter of the FFN time in memory, hot
 * neurons coming first and firing (cost up and down) far more often. Each
 * chunk writes its own output and the reduce adds them in chunk order, so
 * the result does not depend on which thread ran what, nor on the thread
 * count. */
static void ffn_dec_fn(void *ctx, int tid, int nt)
{
    ffn_dec_job *j = ctx;
    pi2_engine *e = j->e;
    eng_tls *s = &e->tls[tid];
    int64_t total = j->mode == FFN_PRED ? j->n_sel : j->f->n_ff;
    uint64_t n_up = 0, n_down = 0;
    for (int64_t c; (c = eng_share_next(e, tid, nt)) >= 0;) {
        ffn_dec_chunk(j, s, c, total, &n_up, &n_down);
        ffn_dec_done(j);
    }
    const eng_ffn *f = j->f;
    s->active = n_down;
    s->bytes = s->predicted * f->gate.row_bytes + n_up * f->up.row_bytes + n_down * f->down.row_bytes;
}

/* Zero the per-thread counts of a decode FFN job (a thread that skips a
 * shared job leaves its own untouched). */
static void tls_counts_zero(pi2_engine *e)
{
    for (int t = 0; t < e->threads; t++)
        e->tls[t].predicted = e->tls[t].active = e->tls[t].bytes = 0;
}

/* The memory source's decode: the chunks shared out and reduced. */
static int mem_decode(pi2_engine *e, const eng_ffn *f, uint32_t n_sel, int mode, float *out, bool accumulate, float w,
                      pi2_err *err)
{
    (void)err;
    int64_t total = mode == FFN_PRED ? n_sel : f->n_ff, chunks = (total + FFN_CHUNK - 1) / FFN_CHUNK;
    ffn_dec_job j = {.e = e, .f = f, .mode = mode, .n_sel = n_sel, .dec = ffn_dec_of(e, f, mode), .chunks = chunks,
                     .out = out, .w = w, .accumulate = accumulate};
    atomic_init(&j.done, 0);
    tls_counts_zero(e);
    if (chunks == 0) /* out = 0 (accumulate: out += w * 0) */
        eng_sum_rows(out, e->dec_out, e->d.hidden, NULL, 0, 0, e->d.hidden, accumulate, w);
    else
        eng_run_units(e, chunks, ffn_dec_fn, &j);
    e->st.ffn_evals++;
    e->st.neurons += f->n_ff;
    for (int t = 0; t < e->threads; t++) {
        e->st.predicted += e->tls[t].predicted;
        e->st.active += e->tls[t].active;
        e->st.weight_bytes += e->tls[t].bytes;
    }
    return 0;
}

static int mem_begin_pass(pi2_engine *e, bool decode, pi2_err *err)
{
    (void)e, (void)decode, (void)err;
    return 0;
}

static int mem_layer_ahead(pi2_engine *e, int l, const float *x, pi2_err *err)
{
    (void)e, (void)l, (void)x, (void)err;
    return 0;
}

static int mem_layer_begin(pi2_engine *e, int l, bool decode, pi2_err *err)
{
    (void)e, (void)l, (void)decode, (void)err;
    return 0;
}

static int mem_skip(pi2_engine *e, const eng_ffn *f, pi2_err *err)
{
    (void)e, (void)f, (void)err;
    return 0;
}

static void mem_end_pass(pi2_engine *e, bool decode) { (void)e, (void)decode; }

const ffn_source eng_ffn_memory = {
    .begin_pass = mem_begin_pass,
    .layer_begin = mem_layer_begin,
    .layer_ahead = mem_layer_ahead,
    .decode = mem_decode,
    .prefill = mem_prefill,
    .skip = mem_skip,
    .end_pass = mem_end_pass,
};
