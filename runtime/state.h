/* The engine's state: the model as mapped (matrices, FFNs, layers), the
 * per-thread scratch and struct pi2_engine, shared by the engine's load
 * (engine.c, engine_pred.c, engine_bufs.c), forward (forward.c), FFN
 * (ffn.c, ffn_memory.c, the offload/ room), predictor (predict.c) and MoE
 * routing (moe.c). The load's shared functions are declared at the end;
 * each of the others declares its functions in a header of its own
 * (forward.h, ffn.h, predict.h, moe.h, offload/offload.h). Not part of
 * the public API. */
#ifndef PI2_STATE_H
#define PI2_STATE_H

#include "bundle/bundle.h"
#include "runtime/engine.h"
#include "runtime/kernels.h"
#include "formats/pool.h"

#include <string.h>

#define ENG_TILE 256 /* prefill FFN tile (neurons): gate, up, then their down rows */
/* Row stride (floats) of the prefill FFN's sum: one cache line past the
 * hidden size, so the down GEMM's per-token stores to one column strip do
 * not all fall in the same cache sets (a multiple of 4 KiB would). */
#define ENG_PART_LD(D) ((D) + 16)
#define ENG_PRED_UNIT 512 /* neurons per unit of a decode predictor's second layer */
#define ENG_SUM_UNIT 256  /* columns per unit of a decode reduce */

/* The FFN job modes: every neuron, the predictor's picks, or every neuron
 * with the activations below the FFN's threshold dropped (silu_thr). */
enum { FFN_DENSE = 0, FFN_PRED = 1, FFN_THRESH = 2 };

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
     * (f32/f16) Q8 rows made at open (engine_pred.c, eng_pred_quantize_all) */
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

/* A predictor's scratch for one token (runtime/predict.c): its input
 * quantized (x [hidden]), the hidden layer and it quantized ([max rank_p]),
 * the scores [n_ff] and each fc2 unit's count of picks. */
typedef struct eng_pred_buf {
    float *xs, *h, *hs;
    int8_t *xq, *hq;
    int32_t *xsum, *hsum;
    float *scores;
    uint32_t *n; /* [ceil(n_ff / ENG_PRED_UNIT)] */
} eng_pred_buf;

/* Per-thread scratch. */
/* fp16 KV cache rows converted to f32 at a time, per thread: 32 rows of a
 * 128-float head are 16 KiB, in L1 while the unit's heads read them. */
enum { ENG_KV_BLOCK = 32 };

typedef struct eng_tls {
    float *part;     /* thread 0's: the prefill FFN's sum [PI2_K_MAX_T][ENG_PART_LD(hidden)] (ffn.c) */
    float *g, *u;    /* [2 n_ff] (dense decode: gate and up side by side), [n_ff] gate / up results (decode) */
    float *coef;     /* [n_ff] */
    const uint8_t **pp, **pp2; /* [2 n_ff], [n_ff] row pointer scratch */
    const uint16_t **ps, **ps2;
    float *gt, *ut;  /* [PI2_K_MAX_T][TILE] prefill gate / up tile */
    uint32_t *list, *list2; /* [n_ff] neurons (decode) */
    uint64_t predicted, active, bytes;
    double wait;     /* offloading: seconds idle waiting for reads */
    float *scores;   /* attention scores [PI2_K_MAX_T][ctx] */
    float *kvrows;   /* fp16 KV cache: a unit's keys then values as f32, [2][ctx][head_dim]
                        (one token: a block of ENG_KV_BLOCK rows at a time) */
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
    void *kc, *vc;  /* [layers][kv heads][ctx][hd], f32 or (kv_f16) fp16 */
    bool kv_f16;
    /* activations, [PI2_K_MAX_T][...] */
    float *x, *xb, *xb2, *q, *att;
    float *aqs;   /* activation scales [T][max_in/32] */
    int8_t *aq;   /* [T][max_in] */
    int32_t *asum;
    /* the predictor's scratch: [0] the decode step's, [1] the offloader's
     * read-ahead, which guesses on its own thread while the step runs */
    eng_pred_buf pb[2];
    float *router_logits;
    int *chosen;      /* [T][top-k] experts per token */
    uint32_t *sel;    /* [n_ff] predicted neurons, all threads */
    float *dec_out;    /* [ceil(n_ff / FFN_CHUNK)][hidden] each decode FFN chunk's own output */
    _Atomic uint64_t *share_rng; /* [tls_n] the units of the running shared job left to each thread:
                                    first << 32 | end (jobs run one at a time) */
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
    bool pred_stream;    /* the plan streams the predictors: not in res, read per layer (offload/pstream.c) */
    int attn_stream;     /* ... and the attention of the last attn_stream layers, likewise */
    uint64_t buf_bytes;  /* activation and thread buffers (KV cache excluded) */
    int plan_ctx;        /* KV positions the memory plan holds */
};

/* The engine's open, in three files: engine.c binds the model's tensors
 * and runs the open; engine_pred.c prepares the predictors decode runs;
 * engine_bufs.c allocates the buffers and counts them for the memory plan.
 * Each returns 0 or a PI2_E* code with err filled; what they allocate
 * belongs to e, freed by pi2_engine_close. */

/* The container member `name`, exactly `size` bytes, in the mapping or
 * (offloading) in the resident region read in; NULL on error. */
const uint8_t *eng_member(const pi2_engine *e, const char *name, uint64_t size, pi2_err *err);
/* pi2_malloc_array, counted in e->buf_bytes (the memory plan's engine
 * buffers); NULL when out of memory. */
void *eng_acc_alloc(pi2_engine *e, size_t n, size_t size);
/* f's Q8 predictor copy, allocated (filled by eng_pred_quantize_all). */
int eng_pred_alloc(pi2_engine *e, eng_ffn *f, pi2_err *err);
/* f's q8/q4 predictor p (qtype qt), its members used in place. */
int eng_pred_bind(pi2_engine *e, eng_ffn *f, const pi2_mf_predictor *p, pi2_qtype qt, pi2_err *err);
/* Every Q8 copy filled, over e->pool; offloading, the f32/f16 pages given
 * back (e->res_released). */
int eng_pred_quantize_all(pi2_engine *e, pi2_err *err);
/* The activation, predictor-input, MoE and per-thread buffers (the KV
 * cache is pi2_engine_set_ctx's), after every FFN is bound. */
int eng_alloc_state(pi2_engine *e, pi2_err *err);
/* Frees what eng_alloc_state allocated, and the per-thread attention
 * scores pi2_engine_set_ctx put beside it; any part may be NULL. */
void eng_free_state(pi2_engine *e);
/* rc of a step that read the mapping, or PI2_EIO naming the file when it
 * shrank under the mapping meanwhile (runtime/engine_check.c). */
int eng_step_checked(const pi2_engine *e, int rc, pi2_err *err);

#endif
