/* Internals shared by the engine's load (engine.c) and forward
 * (engine_fwd.c). Not part of the public API. */
#ifndef PI2_ENGINE_INTERNAL_H
#define PI2_ENGINE_INTERNAL_H

#include "bundle/bundle.h"
#include "runtime/engine.h"
#include "runtime/kernels.h"
#include "runtime/pool.h"

#define ENG_TILE 64 /* prefill down-projection tile (neurons) */

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
    int rank;
    float threshold;
    const float *fc1; /* [rank][hidden] */
    const float *fc2; /* [n_ff][rank] */
    bool has_silu_thr;
    float silu_thr;
} eng_ffn;

typedef struct eng_layer {
    const float *attn_norm, *ffn_norm; /* [hidden] */
    eng_mat q, k, v, o;
    const float *router; /* [experts][hidden] on MoE */
    eng_ffn *ffn;        /* [max(experts, 1)] */
} eng_layer;

/* Per-thread scratch. */
typedef struct eng_tls {
    float *part;     /* partial FFN output [PI2_K_MAX_T][hidden] */
    float *g, *u;    /* [n_ff] gate / up results (decode) */
    float *coef;     /* [n_ff] */
    const uint8_t **pp, **pp2; /* [n_ff] row pointer scratch */
    const uint16_t **ps, **ps2;
    float *tile;     /* dequantized down rows [TILE][hidden] (prefill) */
    float *gt, *ut;  /* [PI2_K_MAX_T][TILE] prefill gate / up tile */
    uint32_t *list, *list2; /* [n_ff] neurons (decode) */
    uint32_t n_list;
    uint64_t predicted, active, bytes;
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
    int threads;
    int ctx;
    bool dense;
    pi2_mf_mode mode; /* sparsity the model carries */
    char sig[96];

    eng_mat embed, head;
    bool head_shared; /* tied: head uses embed's tables */
    const float *out_norm;
    eng_layer *layers;
    float *inv_freq; /* [head_dim/2] */
    uint64_t dense_bytes;
    double prefill_macs;

    /* state */
    int n_pos;
    float *kc, *vc; /* [layers][ctx][kv*hd] */
    /* activations, [PI2_K_MAX_T][...] */
    float *x, *xb, *xb2, *q, *att;
    float *aqs;   /* activation scales [T][max_in/32] */
    int8_t *aq;   /* [T][max_in] */
    int32_t *asum;
    float *ph;    /* predictor hidden [max rank] */
    float *router_logits;
    int *chosen;      /* [T][top-k] experts per token */
    uint32_t *sel;    /* [n_ff] predicted neurons, all threads */
    float *scores_all; /* [n_ff] predictor scores */
    float *moe_x, *moe_out, *moe_w; /* gathered tokens of one expert */
    int *moe_tok;
    float *moe_wk;    /* [T][top-k] routing weights */
    float *rope_cs, *rope_sn; /* [T][head_dim/2] */
    eng_tls *tls; /* [threads] */
    int max_in;   /* largest matmul input width */
    int max_ff;

    pi2_engine_stats st;
};

/* Forward entry points (engine_fwd.c). */
int eng_forward(pi2_engine *e, const int32_t *tokens, int T, int pos, bool decode, float *logits, pi2_err *err);

#endif
