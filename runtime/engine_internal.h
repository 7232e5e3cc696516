/* Internals shared by the engine's load (engine.c), forward (forward.c),
 * FFN (ffn.c, ffn_memory.c, the offload/ room), predictor (predict.c) and
 * MoE routing (moe.c). Not part of the public API. */
#ifndef PI2_ENGINE_INTERNAL_H
#define PI2_ENGINE_INTERNAL_H

#include "bundle/bundle.h"
#include "runtime/engine.h"
#include "runtime/kernels.h"
#include "formats/pool.h"
#include "runtime/units.h"

#include <string.h>

#define ENG_TILE 256 /* prefill FFN tile (neurons): gate, up, then their down rows */
/* Row stride (floats) of the partial FFN outputs: one cache line past the
 * hidden size, so the down GEMM's per-token stores to one column strip do
 * not all fall in the same cache sets (a multiple of 4 KiB would). */
#define ENG_PART_LD(D) ((D) + 16)
#define ENG_PRED_UNIT 512 /* neurons per unit of a decode predictor's second layer */
#define ENG_SUM_UNIT 256  /* columns per unit of a decode reduce */

/* A matrix held in the mapping: quantized rows (row pointer tables) or
 * f32 rows. */
typedef struct eng_mat {
    pi2_qtype qt;
    int64_t rows, cols;
    const float *f32;            /* qt == F32: [rows][cols] */
    const uint8_t **rp;          /* qt Q4/Q8: payload row pointers [rows] */
    const uint16_t **rs;         /* scale row pointers [rows] */
    uint64_t row_bytes;          /* payload + scale bytes of one row */
} eng_mat;

/* One FFN (layer, expert) in bundled neuron order. */
typedef struct eng_ffn {
    int layer, expert;
    uint32_t n_ff;
    eng_mat gate, up, down; /* rows = neurons; down rows are down columns */
    /* predictor (bundled order) */
    bool has_pred;
    bool pred_prenorm; /* it reads the residual before the FFN's norm (else the normed input) */
    bool pred_f16;     /* fc1/fc2 hold fp16 (else f32) */
    int rank;
    float threshold;
    const void *fc1; /* [rank][hidden], as stored (eng_pred_w) */
    const void *fc2; /* [n_ff][rank] */
    /* the rows decode runs: a q8/q4 predictor's members in place, or
     * (f32/f16) Q8 rows made at open (engine.c, pred_quantize_all) */
    pi2_qtype pred_qt;        /* PI2_QT_Q8 or PI2_QT_Q4 */
    int rank_p;               /* rank rounded up to 32 (zero columns) */
    uint8_t *pq;              /* the open-time copy, holding all four; NULL in place */
    const uint8_t *q1, *q2;   /* fc1 [rank][hidden], fc2 [n_ff][rank_p] payloads */
    const uint16_t *s1, *s2;  /* their scales */
    bool has_silu_thr;
    float silu_thr;
} eng_ffn;

/* Weight i of a stored predictor matrix (fc1 or fc2 of f) as f32. */
static inline float eng_pred_w(const eng_ffn *f, const void *m, size_t i)
{
    if (f->pred_f16) {
        uint16_t h;
        memcpy(&h, (const uint8_t *)m + 2 * i, 2);
        return pi2_f16_to_f32(h);
    }
    float v;
    memcpy(&v, (const uint8_t *)m + 4 * i, 4);
    return v;
}

typedef struct eng_layer {
    const float *attn_norm, *ffn_norm; /* [hidden] */
    eng_mat q, k, v, o;
    const float *router; /* [experts][hidden] on MoE */
    eng_ffn *ffn;        /* [max(experts, 1)] */
} eng_layer;

/* Per-thread scratch. */
typedef struct eng_tls {
    float *part;     /* partial FFN output [PI2_K_MAX_T][ENG_PART_LD(hidden)] */
    float *g, *u;    /* [2 n_ff] (dense decode: gate and up side by side), [n_ff] gate / up results (decode) */
    float *coef;     /* [n_ff] */
    const uint8_t **pp, **pp2; /* [2 n_ff], [n_ff] row pointer scratch */
    const uint16_t **ps, **ps2;
    float *gt, *ut;  /* [PI2_K_MAX_T][TILE] prefill gate / up tile */
    uint32_t *list, *list2; /* [n_ff] neurons (decode) */
    uint64_t predicted, active, bytes;
    double wait;     /* offloading: seconds idle waiting for reads */
    float *scores;   /* attention scores [PI2_K_MAX_T][ctx] */
} eng_tls;

struct pi2_engine {
    char path[4096];
    pi2_bundle *b;
    const pi2_manifest *mf;
    const pi2_bundle_layout *bl;
    pi2_model_desc d;
    pi2_tok *tok;
    pi2_pool *pool;
    int threads; /* compute threads running (the pool's size) */
    bool ahead;  /* decode prefetches each thread's next unit or chunk into L2 (eng_l2_ahead) */
    int tls_n;   /* per-thread scratch allocated (>= threads; a plan may run fewer) */
    int ctx;
    bool dense;
    pi2_mf_mode mode; /* sparsity the model carries */
    char sig[96];
    bool rehuged; /* open dropped the page cache's 4 KiB pages (pi2_ctr_rehuge) */

    eng_mat embed, head;
    bool head_shared; /* tied: head uses embed's tables */
    const float *out_norm;
    eng_layer *layers;
    float *inv_freq; /* [head_dim]: RoPE's at position 0, then dynamic NTK's at the current one */
    uint64_t dense_bytes;
    uint64_t pred_bytes; /* predictors as decode runs them: Q8 copies, or q8/q4 members in place */
    double prefill_macs;

    /* state */
    int n_pos;
    float *kc, *vc; /* [layers][ctx][kv*hd] */
    /* activations, [PI2_K_MAX_T][...] */
    float *x, *xb, *xb2, *q, *att;
    float *aqs;   /* activation scales [T][max_in/32] */
    int8_t *aq;   /* [T][max_in] */
    int32_t *asum;
    float *ph;    /* predictor hidden [max rank_p] */
    float *pxs, *phs;      /* predictor inputs quantized: x [hidden], hidden [max rank_p] */
    int8_t *pxq, *phq;
    int32_t *pxsum, *phsum;
    float *router_logits;
    int *chosen;      /* [T][top-k] experts per token */
    uint32_t *sel;    /* [n_ff] predicted neurons, all threads */
    float *scores_all; /* [n_ff] predictor scores */
    float *dec_out;    /* [ceil(n_ff / FFN_CHUNK)][hidden] each decode FFN chunk's own output */
    _Atomic uint64_t *share_rng; /* [tls_n] the units of the running shared job left to each thread:
                                    first << 32 | end (jobs run one at a time) */
    uint32_t *pred_n;          /* [ceil(n_ff / ENG_PRED_UNIT)] picks of each predictor unit */
    float *moe_x, *moe_out, *moe_w; /* gathered tokens of one expert */
    int *moe_tok;
    float *moe_wk;    /* [T][top-k] routing weights */
    int *moe_prev;    /* [layers][top-k] experts chosen for the token at moe_prev_pos */
    int *moe_guess;   /* [layers][top-k] the read-ahead's guess for this token (-1: none) */
    int moe_prev_pos; /* -1: none */
    float *rope_cs, *rope_sn; /* [T][head_dim/2] */
    eng_tls *tls; /* [threads] */
    int max_in;   /* largest matmul input width */
    int max_ff;

    pi2_engine_stats st;

    /* where the FFNs are computed (runtime/ffn_source.h): memory or flash */
    const struct ffn_source *ffn;
    /* offloading (runtime/offload/offload.c); NULL / 0 when everything is in memory */
    struct eng_ofl *ofl;
    uint8_t *res;        /* the resident region [0, res_bytes) of the file, read into memory */
    uint64_t res_bytes;
    uint64_t res_released; /* bytes of it given back (the f32 predictors, once quantized) */
    uint64_t buf_bytes;  /* activation and thread buffers (KV cache excluded) */
    int plan_ctx;        /* KV positions the memory plan holds */
};

/* The forward pass (forward.c). */
int eng_forward(pi2_engine *e, const int32_t *tokens, int T, int pos, bool decode, float *logits, pi2_err *err);

/* The FFN job modes. */
enum { FFN_DENSE = 0, FFN_PRED = 1, FFN_THRESH = 2 };
/* Predictor (predict.c) of FFN f on input x (D floats): the predicted neurons, in
 * bundled order, into sel; returns their count. */
uint32_t eng_predict(pi2_engine *e, const eng_ffn *f, const float *x, uint32_t *sel);
/* The same picks among neurons [n0, n_ff) only (fc2 rows below n0 are not
 * read): read-ahead wants only what is not held in memory. */
uint32_t eng_predict_from(pi2_engine *e, const eng_ffn *f, const float *x, uint32_t n0, uint32_t *sel);
/* Whether decode prefetches the next unit of rows (matmuls) or chunk of
 * neurons (--dense FFN) into L2 while it computes the current one, for an
 * L2 of l2_bytes per core (<= 0: unknown). The two must fit beside each
 * other: kept where the L2 is unknown or 1 MiB and up; on a 512 KiB L2,
 * where a --dense chunk alone takes 384 KiB, decode was faster without it
 * (figures: runtime/PERF.md). */
bool eng_l2_ahead(long l2_bytes);
#define ENG_AHEAD_MIN_L2 (1L << 20)

/* FFN computation both sources run (ffn.c). */
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
 * in the activation buffers, added to each thread's partial output (zeroed
 * first when `first`). */
void eng_ffn_prefill_range(pi2_engine *e, const eng_ffn *f, int T, uint32_t n0, uint32_t n1, bool first);
/* out [T][D] = sum of the threads' partial outputs (accumulate: out += w *). */
void eng_ffn_reduce(pi2_engine *e, int T, float *out, bool accumulate, float w);

/* Offloading (runtime/offload/offload.c; the design is described in runtime/offload/offload.h). */
struct pi2_plan_memory;
/* The offloader's own buffers for a model: their shapes, and their bytes
 * at I/O depth 0 and per read in flight (pi2_plan_bufs). */
typedef struct eng_ofl_bufs {
    uint32_t max_sel, max_ch;  /* neurons and chunks a decode job can hold */
    uint32_t win_groups;       /* slots per prefill window */
    uint64_t staging_bytes;    /* per read in flight */
    uint64_t wbuf_bytes;       /* per prefill window */
    size_t rq_cap, ready_cap;  /* queued reads, ready chunks */
    uint64_t bytes, per_depth;
    uint64_t slot_bytes[2];    /* a cache slot with its record: gates (whole neurons one-phase), up+down */
} eng_ofl_bufs;
void eng_ofl_buffers(const pi2_model_desc *d, const pi2_bundle_layout *bl, eng_ofl_bufs *out);
int eng_ofl_load_resident(pi2_engine *e, const pi2_engine_opts *o, pi2_err *err);
/* Run the memory plan m (runtime/planner.h), whose plan it takes over. */
int eng_ofl_open(pi2_engine *e, const pi2_engine_opts *o, struct pi2_plan_memory *m, pi2_err *err);
void eng_ofl_close(pi2_engine *e);
void eng_ofl_stats_reset(pi2_engine *e);
/* MoE (moe.c): router logits of x (D floats) -> chosen[top-k] experts (largest first,
 * lower index on ties) and their softmax weights wts[top-k]. */
void eng_route(const pi2_engine *e, const float *router, const float *x, int *chosen, float *wts);

#endif
