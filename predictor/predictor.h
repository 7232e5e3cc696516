/* Activation predictors: the predictor object, its scores and picks, and
 * the rank rule (the model and the contract: predictor/train.h). */
#ifndef PI2_PREDICTOR_PREDICTOR_H
#define PI2_PREDICTOR_PREDICTOR_H

#include "formats/common.h"
#include "formats/predictor_fmt.h"

/* ---- predictors ---- */

typedef struct pi2_predictor pi2_predictor;

/* A predictor from given weights (e.g. imported from a checkpoint): copies
 * fc1 [rank, d] and fc2 [n_ff, rank]. PI2_EINVAL for a non-finite weight or
 * threshold, PI2_ERANGE for a dimension outside [1, PI2_PRED_MAX_DIM].
 * Caller owns *out (pi2_pred_free). */
int pi2_pred_create(pi2_predictor **out, int d, int n_ff, int rank, const float *fc1, const float *fc2,
                    float threshold, pi2_err *err);
/* NULL is a no-op. */
void pi2_pred_free(pi2_predictor *p);
int pi2_pred_dim(const pi2_predictor *p);
int pi2_pred_nff(const pi2_predictor *p);
int pi2_pred_rank(const pi2_predictor *p);
float pi2_pred_threshold(const pi2_predictor *p);
/* PI2_EINVAL (unchanged) for a NaN threshold; +-Inf are allowed. */
int pi2_pred_set_threshold(pi2_predictor *p, float threshold);
/* Borrowed weights, row-major: fc1 [rank, d], fc2 [n_ff, rank]. */
const float *pi2_pred_fc1(const pi2_predictor *p);
const float *pi2_pred_fc2(const pi2_predictor *p);

/* Scalar reference forward (plain loops, double accumulation): scores
 * (n_ff floats, caller's buffer) for one input x (d floats). The twin of the
 * batched OpenBLAS path used by train/eval/calibrate. 0 or PI2_ENOMEM (for
 * its rank-sized scratch). */
int pi2_pred_score(const pi2_predictor *p, const float *x, float *scores);
/* Predicted-active bitset (W words as in a trace, caller's buffer) for one
 * input; returns the number of neurons predicted active, or PI2_ENOMEM. */
int pi2_pred_predict(const pi2_predictor *p, const float *x, uint64_t *bits);

/* ---- rank ---- */

/* Rank for a layer with input size d, n_ff neurons and a measured active
 * fraction f in [0, 1]:
 *     r = d * sqrt(f) / 2, rounded to the nearest multiple of 32 (at least
 *         32), then clamped to [min_rank, max_rank].
 * Less sparse layers get more rank: the set of neurons to predict per token
 * grows with f and the boundary gets harder; sqrt keeps very dense layers
 * from taking the whole budget. d = 4096: f = 0.02 -> 288, 0.05 -> 448,
 * 0.10 -> 640, 0.25 -> 1024. n_ff is only checked: the rank sizes the
 * input side, the shared subspace the scores are read from. Returns the
 * rank, or PI2_EINVAL for d or n_ff < 1, f outside [0, 1] or NaN,
 * min_rank < 1 or min_rank > max_rank. */
int pi2_pred_choose_rank(int d, int n_ff, double active_frac, int min_rank, int max_rank);

#endif
