/* The predictor's stored description: what a manifest and a container record
 * about an activation predictor (its input vector, its size cap and the
 * per-layer report the converter writes). The trainer (predictor/train.h)
 * and the formats that store its results share these, so the formats do not
 * depend on the trainer.
 */
#ifndef PI2_FORMATS_PREDICTOR_FMT_H
#define PI2_FORMATS_PREDICTOR_FMT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PI2_PRED_MAX_DIM (1 << 20) /* cap on d, n_ff and rank */

/* The vector a predictor reads (manifest key "input"):
 *   PI2_PRED_IN_NORMED   the FFN's input, after post_attention_layernorm
 *   PI2_PRED_IN_PRENORM  the residual stream after attention, BEFORE that
 *                        norm: the PowerInfer convention, which every
 *                        published predictor (TurboSparse in-checkpoint,
 *                        Bamboo / ProSparse / ReluLLaMA repos) follows */
typedef enum pi2_pred_input {
    PI2_PRED_IN_NORMED = 0,
    PI2_PRED_IN_PRENORM = 1,
} pi2_pred_input;

/* "normed" / "prenorm"; "?" for anything else. */
const char *pi2_pred_input_name(pi2_pred_input in);

/* Bytes to store a predictor's weights (fc1 [rank, d], fc2 [n_ff, rank])
 * as fp32, and as 8-bit (ggml Q8_0: each row cut into groups of 32 weights,
 * one int8 per weight plus an fp16 scale per group; a short last group
 * still costs a full 34 bytes). */
uint64_t pi2_pred_bytes_f32(int d, int n_ff, int rank);
uint64_t pi2_pred_bytes_q8(int d, int n_ff, int rank);

/* Per-layer report, as the converter stores it. pi2_pred_eval fills the
 * quality and size fields (recall .. bytes_q8, n_eval, threshold, rank); the
 * training fields stay zero there. */
typedef struct pi2_pred_report {
    int rank;
    float threshold;
    double recall;           /* true active entries predicted active / true active */
    double precision;        /* true active among predicted active (1 if none predicted) */
    double pred_active_frac; /* predicted active entries / all entries */
    double true_active_frac; /* true active entries / all entries */
    uint64_t bytes_f32, bytes_q8;
    size_t n_eval;           /* samples the quality figures are measured on */
    /* training only */
    size_t n_train;
    int epochs;              /* epochs run */
    bool early_stopped;
    int best_epoch;          /* 1-based epoch whose weights were kept */
    double pos_weight;
    double train_loss;       /* mean weighted BCE per entry over the last epoch's
                                minibatches (each before its step) */
    double heldout_loss;     /* same on the held-out split for the kept weights */
    double seconds;          /* wall time of pi2_pred_train */
} pi2_pred_report;

#endif
