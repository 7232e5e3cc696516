/* Activation predictors: traces, training, calibration, evaluation.
 *
 * A predictor for one FFN layer (or one MoE expert) is a bias-free MLP
 *     score = fc2 · relu(fc1 · x)        x: d floats, the predictor's input
 *     fc1 [rank, d], fc2 [n_ff, rank]    row-major fp32, as in PyTorch
 * and neuron i is predicted active when score_i >= threshold (one threshold
 * per layer). These are the shapes of the `predictor.fc{1,2}.weight` tensors
 * TurboSparse checkpoints ship, so an imported predictor is used as is.
 * Which vector x is (pi2_pred_input) is part of the model: a predictor run
 * on the other one picks other neurons, since the norm's weight differs per
 * dimension (the score's sign is the same for any positive scale of x:
 * the MLP has no bias and relu is positively homogeneous).
 *
 * Trace: the training data of one layer, collected from the reference
 * forward's FFN hook: N samples, each the FFN input x (d floats) and the truth
 * "neuron j was active" (its activation was non-zero) as a packed bitset.
 * Layout in memory: x rows contiguous [N, d]; bits [N, W] uint64 words with
 * W = ceil(n_ff / 64), bit j of sample i = (bits[i*W + j/64] >> (j%64)) & 1;
 * unused high bits of the last word are zero. ~1.8 KiB of bits per sample at
 * n_ff = 14336 next to 16 KiB of x at d = 4096.
 *
 * Training (pi2_pred_train): weighted binary cross-entropy on sigmoid(score)
 * (active entries weighted by pos_weight: recall matters more than
 * precision), summed over neurons and averaged over the minibatch; Adam;
 * shuffled minibatches; a deterministic seeded train / held-out split. After
 * every epoch the held-out split is scored; early stopping and restore_best
 * watch either the predicted-active fraction at the target recall (default:
 * it keeps improving well after the held-out loss turns up from
 * overconfidence) or the loss. At the end the threshold is calibrated on the
 * held-out samples to the target recall and the predictor is evaluated there.
 * Init: fc1 Kaiming-normal divided by the RMS of the training inputs (so the
 * norm's gain does not matter), fc2 N(0, 1/rank).
 * The matmuls of a minibatch go to OpenBLAS (single-threaded calls on fixed
 * blocks, spread over our own threads): the same trace, options and seed give
 * bit-identical weights whatever the thread count. Note: the trainer sets
 * OpenBLAS's process-wide thread count to 1 while it runs and restores it
 * after, so do not run other OpenBLAS work concurrently from other threads.
 * Memory: about 6 copies of the weights (weights, gradients, 2 Adam moments,
 * best copy) plus batch x (n_ff + 2 rank + d) floats, next to the trace.
 *
 * Errors: PI2_EINVAL (bad option, non-finite input, empty trace, a trace
 * without any active neuron to calibrate on), PI2_ESHAPE (predictor and trace
 * dimensions disagree), PI2_ERANGE (dimensions too large, training diverged),
 * PI2_ENOMEM. Messages are one line starting with "predictor:" or "trace:".
 */
#ifndef PI2_PREDICTOR_TRAIN_H
#define PI2_PREDICTOR_TRAIN_H

#include "formats/common.h"
#include "formats/predictor_fmt.h"

#include "predictor/trace.h"
#include "predictor/predictor.h"

/* ---- training ---- */

/* What early stopping and restore_best watch on the held-out split. */
typedef enum pi2_pred_stop {
    PI2_PRED_STOP_COST = 0, /* predicted-active fraction at the target recall
                               (calibrate + evaluate each epoch): what the
                               runtime pays; the default */
    PI2_PRED_STOP_LOSS = 1, /* weighted BCE (cheaper: one forward pass) */
} pi2_pred_stop;

typedef struct pi2_pred_train_opts {
    int rank;             /* 0 = pi2_pred_choose_rank(d, n_ff, f, rank_min, rank_max) */
    int rank_min, rank_max;
    int epochs;           /* cap on passes over the training split */
    int batch;            /* samples per minibatch */
    double lr, beta1, beta2, eps; /* Adam */
    double weight_decay;  /* decoupled (AdamW); 0 = plain Adam */
    double pos_weight;    /* weight of the active class in the loss; 0 = auto:
                             (1 - f) / f of the training split, clamped to
                             [1, pos_weight_max] (balances the classes) */
    double pos_weight_max;
    double holdout;       /* fraction of samples held out, in (0, 1) */
    double target_recall; /* threshold calibration target on held-out, (0, 1] */
    pi2_pred_stop stop_metric;
    int patience;         /* early stop after this many epochs without a relative
                             improvement of the held-out stop metric of at least
                             min_delta; 0 = never stop early (epochs is the cap) */
    double min_delta;
    bool restore_best;    /* keep the weights of the epoch with the best metric */
    int threads;          /* compute threads; 0 = 2 */
    uint64_t seed;        /* split, shuffles and init */
    bool verbose;         /* one progress line per epoch on stderr */
} pi2_pred_train_opts;

/* Defaults: rank 0 (auto, 64..1024), 10 epochs, batch 256, Adam lr 5e-3,
 * betas 0.9/0.999, eps 1e-8, no weight decay, pos_weight auto (max 100), 20%
 * held out, target recall 0.99, stop on cost, patience 2, min_delta 1e-3,
 * restore_best, 2 threads, seed 1. */
void pi2_pred_train_defaults(pi2_pred_train_opts *o);


/* Train a predictor on one layer's trace. The trace needs at least 2 samples
 * (one for training, one held out) and at least one active entry among the
 * held-out samples. Quality figures in *rep (optional) are on the held-out
 * split, at the calibrated threshold. Caller owns *out. PI2_ERANGE if the
 * loss becomes non-finite (lower lr). */
int pi2_pred_train(const pi2_trace *tr, const pi2_pred_train_opts *o, pi2_predictor **out, pi2_pred_report *rep,
                   pi2_err *err);

/* Recall, precision and active fractions of p (at its threshold) over all
 * samples of tr, into the caller's *rep (required). Eval and calibrate use 2
 * threads; their results do not depend on it. PI2_ESHAPE if the
 * dimensions differ, PI2_EINVAL if tr is empty. */
int pi2_pred_eval(const pi2_predictor *p, const pi2_trace *tr, pi2_pred_report *rep, pi2_err *err);

/* Set p's threshold to the largest value at which at least `recall` of the
 * active entries of tr are predicted active (the fewest false positives
 * reaching the target): among the scores of the P truly active entries, the
 * one at rank ceil(recall * P) from the top (found by selection, not a full
 * sort). recall in (0, 1]. PI2_EINVAL if tr has no active entry, PI2_ERANGE
 * if the scores are NaN; p is unchanged on error. */
int pi2_pred_calibrate(pi2_predictor *p, const pi2_trace *tr, double recall, pi2_err *err);

#endif
