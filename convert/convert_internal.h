/* Shared state of the pi2-convert stages (not a public contract). */
#ifndef PI2_CONVERT_INTERNAL_H
#define PI2_CONVERT_INTERNAL_H

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

typedef struct pi2_conv {
    const pi2_convert_opts *o;
    pi2_ref_model *m;
    const pi2_model_desc *desc;
    const pi2_st *st;
    pi2_ctr_writer *w;
    int threads;
    /* progress */
    bool tty;
    double t0, last_progress;
    uint64_t bytes_read, bytes_total;
    /* converted tensors */
    conv_tensor *tensors;
    size_t n_tensors, cap_tensors;
    pi2_manifest *mf;
    pi2_tok *tok;
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
    pi2_predictor **preds; /* [ffn] or NULL */
    pi2_pred_report *reports;
    const char *pred_source;
    uint64_t quality_tokens;
    double ppl[3];         /* fp32, quantized dense, quantized sparse */
} pi2_conv;

/* Stages 2-4 (convert_calib.c): calibration text, traces, predictors,
 * profile and sparsity members, quality; fills c->mf's sparsity/profile. */
int conv_calibrate(pi2_conv *c, FILE *report, pi2_err *err);
void conv_calib_free(pi2_conv *c);

/* Progress of a counted stage on a terminal. */
void conv_stage_progress(pi2_conv *c, const char *what, int done, int total);

/* Stage 1 (convert_weights.c): every weight tensor, quantized, into c->w. */
int conv_write_weights(pi2_conv *c, pi2_err *err);

/* Append a converted tensor to c->tensors. */
int conv_record_tensor(pi2_conv *c, const char *name, pi2_tname role, int layer, int expert, pi2_qtype qt,
                       int64_t rows, int64_t cols, bool transposed, const char *payload, const char *scales,
                       pi2_err *err);

/* Progress line on a terminal (rate-limited). */
void conv_progress(pi2_conv *c, const char *what);

#endif
