/* pi2-convert: Hugging Face model dir -> converted model.
 *
 * The converted model is a pi2 container (formats/container.h), unsigned,
 * whose manifest.json (formats/manifest.h) has kind "converted". Members:
 *   tokenizer.json            copy of the source tokenizer
 *   w/<hf name>.q, .s         quantized payload and its fp16 scales, kept
 *                             apart (formats/quant.h); FFN down is stored
 *                             transposed ([n_ff, hidden]) so each neuron's
 *                             down column is a contiguous row
 *   w/<hf name>.f32           f32 tensors (norms, MoE router)
 *   p/<layer>.<expert>.fc1    predictor fc1, f16 [rank, hidden]
 *   p/<layer>.<expert>.fc2    predictor fc2, f16 [n_ff, rank]
 *                             (the manifest records the vector each reads)
 *   profile/<l>.<e>.freq      f32 [n_ff] per-neuron activation frequency
 *   profile/<l>.<e>.bits      bits of sampled calibration tokens: the neurons the
 *                             predictor selects (with predictors), else the
 *                             active neurons
 *   manifest.json             written last
 * Everything is streamed tensor by tensor (never the whole model in memory)
 * into a temporary file that is renamed into place only when complete.
 */
#ifndef PI2_CONVERT_H
#define PI2_CONVERT_H

#include "formats/common.h"
#include "formats/quant.h"
#include "predictor/train.h"

#include <stdio.h>

typedef struct pi2_convert_opts {
    const char *model_dir;
    const char *out_path;
    pi2_qtype q_ffn;          /* PI2_QT_Q4 (default) or PI2_QT_Q8 */
    pi2_qtype q_other;        /* attention, embeddings, head: PI2_QT_Q8 (default) or PI2_QT_Q4 */
    pi2_qtype q_embed;        /* the embedding table (and the head when tied): PI2_QT_Q8 or PI2_QT_Q4;
                                 PI2_QT_F32 (0, the default) = as q_other */
    pi2_qtype q_head;         /* an untied output head: likewise */
    pi2_qtype q_kvo;          /* the attention's k, v and o projections: likewise (4-bit k, v and o
                                 cost most of 4-bit attention's quality; q the least) */
    pi2_qtype q_pred;         /* predictors: PI2_QT_F32 (0) stores f16 rows, PI2_QT_Q8 / PI2_QT_Q4 the
                                 quantized rows the runtime evaluates (formats/manifest.h) */
    bool train_predictors;    /* train when the checkpoint has none */
    const char *predictors_dir; /* import predictors from this file or directory (safetensors file,
                                   dir or index; PowerInfer repo of model_{L}.pt + config.json) */
    int pred_input;           /* what predictors read: -1 = default (published ones: prenorm; trained:
                                 PI2_CONV_TRAIN_INPUT), else a pi2_pred_input */
    bool recall_set;          /* --recall given: calibrate imported predictors' thresholds to it too
                                 (else they keep the published threshold) */
    const char *calib_path;   /* calibration text; NULL = text the model generates itself */
    int calib_tokens;         /* calibration tokens (0 = default) */
    double recall;            /* target recall of the predictor thresholds (0.99) */
    double silu_sparsity;     /* SiLU models: share of neurons the threshold mode drops (0.5) */
    int threads;              /* 0 = all cores */
    uint64_t seed;
    bool quiet;               /* no progress lines */
    bool per_layer;           /* report: per-layer activation profile too */
    bool force;               /* replace an existing out_path (else refused) */
} pi2_convert_opts;

/* The input trained predictors read unless told otherwise (see
 * runtime/PERF.md for the measurement behind the choice). */
#define PI2_CONV_TRAIN_INPUT PI2_PRED_IN_NORMED

/* Defaults for every field but the paths. */
void pi2_convert_defaults(pi2_convert_opts *o);

/* Convert. out_path is checked against the output rule (pi2_out_check:
 * not an input, replaced only with force, free space for an estimate of
 * the output) before the first long stage. Progress goes to stderr when it is a terminal and !quiet; the
 * summary (predictor report, quality report) is printed to `report` when it
 * is non-NULL. Nothing is left at out_path on failure. */
int pi2_convert(const pi2_convert_opts *o, FILE *report, pi2_err *err);

/* What a failed conversion needs from the options, when one of them is
 * the remedy: err says what is wrong, the tool names its own flag. */
typedef enum pi2_convert_need {
    PI2_CONVERT_NEED_NOTHING = 0, /* no option helps (or nothing failed) */
    PI2_CONVERT_NEED_PREDICTORS,  /* the predictors beside the weights are unusable: name others
                                     (predictors_dir) or train new ones (train_predictors) */
    PI2_CONVERT_NEED_CALIB,       /* too few calibration samples to train a predictor: more
                                     calibration tokens (calib_tokens) */
} pi2_convert_need;

/* pi2_convert, and *need (when non-NULL) set to what a failure needs. */
int pi2_convert_run(const pi2_convert_opts *o, FILE *report, pi2_convert_need *need, pi2_err *err);

/* Dequantize a converted model back into a Hugging Face model directory
 * (config.json, tokenizer.json, one F32 model.safetensors; FFN down
 * transposed back), so the reference forward runs exactly the quantized
 * weights: the quantized reference the runtime is tested against. `out_dir`
 * must not exist; it appears only when complete. */
int pi2_convert_export(const char *converted, const char *out_dir, pi2_err *err);

#endif
