/* The decode FFN's chunk: the one computation of a chunk of neurons for
 * one token, which the in-memory forward and the flash offloader both run.
 * Not part of the public API.
 *
 * A decode FFN job cuts its neuron list (the predicted neurons in bundled
 * order, or every neuron) into chunks of FFN_CHUNK; each chunk computes
 * gate -> filter -> up -> activation -> down into its own output row, and
 * the rows are added in chunk order. Memory and flash give the same bits
 * because they cut at the same places and run this same code on each
 * chunk; only where the rows come from differs: the chunk reads the row
 * tables of d->f, which the active source keeps pointing at the rows
 * (runtime/ffn_source.h, "Row tables"). */
#ifndef PI2_FFN_H
#define PI2_FFN_H

#include "runtime/state.h"

/* Neurons per chunk of the decode FFN. A chunk's gate, up and down rows are
 * read one after the other while they are close (a bundle keeps a neuron's
 * rows adjacent), so the three passes share cache lines. */
#define FFN_CHUNK 128

/* Prefill FFNs whose gate and up rows are Q4 take the superblock GEMM
 * (pi2_k_matmul_sb): one multiply and FMA per 8 blocks instead of per
 * block. On every ISA: its paths give the same bits, so a prompt says the
 * same thing on AVX2 and AVX-512 machines (runtime/kernels.h, Numerics). */
static inline bool ffn_sb(const eng_ffn *f)
{
    return f->gate.qt == PI2_QT_Q4 && f->up.qt == PI2_QT_Q4;
}

/* What every chunk of one decode FFN job shares. */
typedef struct ffn_dec {
    const eng_ffn *f;
    int mode;         /* FFN_DENSE, FFN_PRED or FFN_THRESH */
    pi2_act act;
    float act_param;  /* FATReLU's threshold, as the activation takes it */
    float gate_thr;   /* pi2_desc_gate_threshold: a ReLU-family gate must exceed it to fire */
    int64_t D;        /* hidden size */
    const float *aqs; /* the FFN's input, quantized (the engine's activation buffers) */
    const int8_t *aq;
    const int32_t *asum;
} ffn_dec;

/* Rows of each matrix a chunk read. */
typedef struct ffn_counts {
    int gate, up, down;
} ffn_counts;

/* The job of FFN f in mode `mode` on the input e has quantized. */
ffn_dec ffn_dec_of(const pi2_engine *e, const eng_ffn *f, int mode);

/* The decode chunk of n neurons (1 <= n <= FFN_CHUNK): idx[0..n) (a list
 * of picks: a ReLU-family gate decides which neurons fire, zero
 * activations are dropped), or first .. first + n in order when idx is
 * NULL (one pass over the gate and up rows side by side; zeros kept in
 * FFN_DENSE). out[0..D) = the sum of the fired neurons' down columns times
 * their activation. [pf, pf + pf_len) is brought toward the core
 * meanwhile (the next chunk's rows; NULL: nothing). Uses s's row pointer
 * and value scratch. */
ffn_counts ffn_chunk(const ffn_dec *d, eng_tls *s, const uint32_t *idx, uint32_t first, int n, float *out,
                     const uint8_t *pf, int64_t pf_len);

/* The chunk's two steps, for a source that reads a chunk's up and down
 * rows only once its gates have decided (flash, two-phase bundles):
 * ffn_chunk_gate puts the gates of neurons idx[0..n) into s->g[0..n);
 * ffn_chunk_updown takes the m neurons idx[pick[r]] (r < m) whose gates
 * g[pick[r]] fired and computes their up rows, activations and down
 * columns into out[0..D), as ffn_chunk does. Returns the active count. */
void ffn_chunk_gate(const ffn_dec *d, eng_tls *s, const uint32_t *idx, int n);
int ffn_chunk_updown(const ffn_dec *d, eng_tls *s, const uint32_t *idx, const float *g, const uint32_t *pick, int m,
                     float *out);

/* The rest both sources run: the decode reduce, the down projection of a
 * list of rows, the dense prefill. */

/* out[i], i in [b, en): the sum over r < n of base[row_r * stride + i]
 * (row_r = rows[r], or r when rows is NULL), in that order from 0;
 * accumulate: out[i] += w * sum. */
void eng_sum_rows(float *out, const float *base, int64_t stride, const uint32_t *rows, int64_t n, int64_t b, int64_t en,
                  bool accumulate, float w);
/* out[0..D) += the down columns of the a neurons in wp / ws with
 * coefficients coef, in that order: the int8 down projection of Q4 / Q8
 * rows (pi2_k_down_rows, groups of 16 in list order), the float axpy of
 * others. Decode in memory and offloaded run the same groups. Q4 / Q8
 * rows also bring [pf, pf + pf_len) toward the core (pi2_k_down_rows_pf;
 * NULL: nothing). */
void eng_down_rows(pi2_qtype qt, int64_t D, int a, const float *coef, const uint8_t *const *wp,
                   const uint16_t *const *ws, float *out, const uint8_t *pf, int64_t pf_len);
/* Dense prefill of neurons [n0, n1) for T tokens whose input is quantized
 * in the activation buffers, added to the prefill FFN's sum (tls[0].part;
 * zeroed first when `first`) tile after tile in order, the same bits on
 * any thread count. */
void eng_ffn_prefill_range(pi2_engine *e, const eng_ffn *f, int T, uint32_t n0, uint32_t n1, bool first);
/* out [T][D] = that sum (accumulate: out += w * the sum). */
void eng_ffn_reduce(pi2_engine *e, int T, float *out, bool accumulate, float w);

#endif
