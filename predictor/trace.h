/* Activation traces: one FFN layer's training data for its predictor (the
 * layout and the contract: predictor/train.h). */
#ifndef PI2_PREDICTOR_TRACE_H
#define PI2_PREDICTOR_TRACE_H

#include "formats/common.h"

/* ---- traces ---- */

typedef struct pi2_trace pi2_trace;

/* Empty trace for inputs of `d` floats and `n_ff` neurons (both in
 * [1, PI2_PRED_MAX_DIM]). Caller owns *out (pi2_trace_free). */
int pi2_trace_create(pi2_trace **out, int d, int n_ff, pi2_err *err);
/* NULL is a no-op. */
void pi2_trace_free(pi2_trace *t);
/* Make room for `n` samples in total (optional; adds grow geometrically).
 * PI2_ERANGE if the size overflows, PI2_ENOMEM. */
int pi2_trace_reserve(pi2_trace *t, size_t n, pi2_err *err);
/* Append one sample: x (d floats) and the activations act (n_ff floats);
 * neuron j is active when |act[j]| > min_abs (0 for ReLU-family models; a
 * small magnitude cut-off turns a dense SwiGLU layer into a sparse target).
 * Copies both. PI2_EINVAL (trace unchanged) if x or act holds a NaN/Inf. */
int pi2_trace_add(pi2_trace *t, const float *x, const float *act, float min_abs, pi2_err *err);
/* Append one sample with its truth already packed (W words, layout above).
 * PI2_EINVAL if x is not finite or a bit past n_ff is set. */
int pi2_trace_add_bits(pi2_trace *t, const float *x, const uint64_t *bits, pi2_err *err);

size_t pi2_trace_count(const pi2_trace *t);
int pi2_trace_dim(const pi2_trace *t);
int pi2_trace_nff(const pi2_trace *t);
/* Borrowed pointers into the trace, valid until the next add/reserve/free. */
const float *pi2_trace_x(const pi2_trace *t, size_t i);
const uint64_t *pi2_trace_bits(const pi2_trace *t, size_t i);
bool pi2_trace_active(const pi2_trace *t, size_t i, int j);
/* Active (sample, neuron) entries over all entries; 0 for an empty trace. */
double pi2_trace_active_frac(const pi2_trace *t);

#endif
