/* Shared state of the pi2-convert stages (not a public contract), and
 * what the stages tell the user (conv.c). convert.c runs the stages in
 * order; each stage's file includes this and nothing of the others',
 * except calibration, which uses the predictor sources. */
#ifndef PI2_CONV_H
#define PI2_CONV_H

#include "convert/convert.h"
#include "formats/container.h"
#include "formats/hfconfig.h"
#include "formats/manifest.h"
#include "formats/safetensors.h"
#include "formats/tokenizer.h"
#include "predictor/train.h"
#include "runtime/reference.h"

#include <stdio.h>

/* A converted tensor, as the manifest will list it. */
typedef struct conv_tensor {
    char name[96];
    pi2_tname role;
    int layer, expert;
    pi2_qtype qt;
    int64_t rows, cols;
    bool transposed;
    char payload[PI2_CTR_NAME_MAX], scales[PI2_CTR_NAME_MAX];
} conv_tensor;

/* Where imported predictors come from (convert_pred.c). */
typedef struct conv_psrc {
    const char *kind;   /* "checkpoint", "safetensors", "PowerInfer repo"; NULL: none */
    char path[4096];    /* the file or directory, for messages and the report */
    const pi2_st *st;   /* a tensor set under the checkpoint's names (TurboSparse) */
    pi2_st *own;        /* st when opened here */
    pi2_st **layer;     /* PowerInfer repo: model_{L}.pt of each layer ("fc1.weight", "fc2.weight") */
    int n_layer;
    double threshold;   /* published threshold: a neuron fires when its score > threshold */
    bool repo_threshold; /* threshold from the repo's config.json (sparse_threshold) */
} conv_psrc;

/* A predictor as the converted model stores it: fp16 weights. */
typedef struct conv_pred {
    int rank;
    float threshold;
    uint16_t *fc1; /* [rank, hidden] */
    uint16_t *fc2; /* [n_ff, rank] */
} conv_pred;

/* Activation statistics of one matrix input (convert_imp.c). */
typedef struct conv_imp_acc {
    double *sum;   /* [cols] sum of squares over the rows seen */
    int64_t cols;
    uint64_t rows;
} conv_imp_acc;

/* The Q/K/V input of each layer, then the O input of each; last the
 * head's. */
typedef struct conv_imp {
    conv_imp_acc *acc;
    size_t n_acc;
} conv_imp;

typedef struct pi2_conv {
    const pi2_convert_opts *o;
    pi2_ref_model *m;
    const pi2_model_desc *desc;
    const pi2_st *st;
    pi2_ctr_writer *w;
    int threads;
    /* progress */
    bool tty;
    bool progress_shown; /* a progress line is on the terminal (cleared before any other line) */
    FILE *report;        /* the summary's stream, or NULL */
    double t0, last_progress;
    uint64_t bytes_read, bytes_total;
    /* converted tensors */
    conv_tensor *tensors;
    size_t n_tensors, cap_tensors;
    pi2_manifest *mf;
    pi2_tok *tok;
    bool chat_template; /* the model's tokenizer_config.json is kept for its chat_template */
    int bos;
    /* calibration (convert_calib.c) */
    int32_t *calib;        /* [n_seq][len] tokens; the last n_held sequences are held out */
    int n_seq, n_held;
    pi2_trace **traces;    /* per FFN (layer-major, expert-minor) */
    uint32_t *counts;      /* [ffn][n_ff] activation counts */
    uint64_t *tokens;      /* [ffn] tokens seen */
    bool silu;             /* SiLU model: threshold mode */
    float *silu_thr;       /* [ffn] |act| threshold */
    bool *silu_set;
    conv_psrc psrc;        /* imported predictors' source (kind NULL: none) */
    pi2_pred_input pred_input; /* what the predictors read, and so what traces record */
    conv_pred *preds;      /* [ffn] or NULL */
    pi2_pred_report *reports;
    int32_t *calib_ids;    /* --calib text, tokenized before the first long stage */
    size_t n_calib_ids;
    uint64_t quality_tokens;
    double ppl[3];         /* fp32, quantized dense, quantized sparse */
    pi2_convert_need need; /* what a failure needs from the options (pi2_convert_run) */
    conv_imp *imp;         /* input statistics of the calibration run, or NULL */
} pi2_conv;

/* Stage 1 (convert_calib.c): the calibration run over the fp32 model
 * (calibration text, activation traces, profile counts, SiLU thresholds,
 * c->imp's input statistics), before the weights are quantized. */
int conv_calib_run(pi2_conv *c, pi2_err *err);
/* Stages 3-4 (convert_calib.c), after the weights: predictors, profile
 * and sparsity members, quality; fills c->mf's sparsity/profile. */
int conv_calibrate(pi2_conv *c, pi2_err *err);
/* Read and tokenize the --calib text (if any) into c->calib_ids, checking
 * it is long enough: before the first long stage. */
int conv_calib_text_load(pi2_conv *c, pi2_err *err);
void conv_calib_free(pi2_conv *c);

/* What the user sees (conv.c). Progress of a counted stage on a
 * terminal. */
void conv_stage_progress(pi2_conv *c, const char *what, int done, int total);

/* A report line (printf-style) to c->report, flushed at once so a
 * redirected report grows as the conversion goes; a progress line on the
 * terminal is cleared first. No-op without a report stream. */
void conv_report(pi2_conv *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* One line on stderr as a stage starts (unless quiet), terminal or not. */
void conv_stage(pi2_conv *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Predictor sources (convert_pred.c). conv_pred_find: resolve where
 * imported predictors come from (--predictors PATH, the checkpoint, files
 * beside the weights) and check every layer's tensors, before any long
 * stage; sets c->psrc and c->pred_input. conv_pred_import: one FFN's
 * predictor from it, as f32 (threshold 0). conv_pred_close frees the
 * source. */
int conv_pred_find(pi2_conv *c, pi2_err *err);
int conv_pred_import(pi2_conv *c, int layer, int expert, pi2_predictor **out, pi2_err *err);
void conv_pred_close(pi2_conv *c);
/* Keep p as FFN fi's stored predictor (fp16; PI2_ERANGE for a weight past
 * fp16, naming it); conv_pred_expand: a new f32 predictor from the stored
 * one, its rows quantized and read back as decode runs them (q4 when
 * --pred-quant q4, else q8), so thresholds, reports, profiles and the
 * quality figure are the runtime's; caller frees. */
int conv_pred_store(pi2_conv *c, size_t fi, const pi2_predictor *p, pi2_err *err);
int conv_pred_expand(const pi2_conv *c, size_t fi, pi2_predictor **out, pi2_err *err);
/* The vector c's predictors read, of X (normed FFN input) and R (residual). */
static inline const float *conv_pred_in(const pi2_conv *c, const float *X, const float *R)
{
    return c->pred_input == PI2_PRED_IN_PRENORM ? R : X;
}

/* Importance of the input columns of the attention and head matrices
 * (convert_imp.c). conv_imp_alloc: zeroed statistics in c->imp
 * (PI2_ENOMEM). conv_imp_add: n rows `in` [n, cols] that matrix t of
 * `layer` multiplied, added in (K and V are skipped: Q's rows are theirs;
 * parts without statistics are ignored). conv_imp_fill: out[cols] = each
 * column's mean square plus a floor of 1% of their mean, the importance
 * pi2_q_quantize_row_search weighs by; false (out untouched) when t has
 * none (EMBED, a tied LM_HEAD, the FFN, ROUTER, nothing measured). */
int conv_imp_alloc(pi2_conv *c, pi2_err *err);
void conv_imp_add(pi2_conv *c, pi2_tname t, int layer, int n, const float *in, int64_t cols);
bool conv_imp_fill(const pi2_conv *c, pi2_tname t, int layer, float *out, int64_t cols);
void conv_imp_free(pi2_conv *c);

/* How part t is stored (convert_weights.c): q_ffn for the FFN, f32 for
 * norms and the router, the embedding's and head's own types (a tied
 * head is the embedding), else q_other. */
pi2_qtype conv_role_qt(const pi2_conv *c, pi2_tname t);
/* Whether part t's 4-bit rows take the searched scale
 * (pi2_q_quantize_row_search): attention, embeddings and head; the FFN
 * keeps the plain scale, about 30x faster to quantize (its gain measured
 * 0.2-1.2% perplexity on the real small models, runtime/PERF.md: not yet
 * worth the converter's time on a 7B model). */
static inline bool conv_role_search(pi2_tname t)
{
    return t != PI2_T_GATE && t != PI2_T_UP && t != PI2_T_DOWN;
}

/* Stage 2 (convert_weights.c): every weight tensor, quantized, into c->w
 * (4-bit attention, embeddings and head with the searched scale, weighed
 * by c->imp). */
int conv_write_weights(pi2_conv *c, pi2_err *err);

/* Append a converted tensor to c->tensors (convert_weights.c). */
int conv_record_tensor(pi2_conv *c, const char *name, pi2_tname role, int layer, int expert, pi2_qtype qt,
                       int64_t rows, int64_t cols, bool transposed, const char *payload, const char *scales,
                       pi2_err *err);

/* Progress line on a terminal (rate-limited; conv.c); conv_progress_done
 * clears it. */
void conv_progress(pi2_conv *c, const char *what);
void conv_progress_done(pi2_conv *c);

#endif
