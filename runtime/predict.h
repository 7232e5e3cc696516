/* The runtime predictor (predict.c): which neurons of an FFN will fire for
 * the token, from the predictor's Q8 or Q4 rows. Not part of the public
 * API. */
#ifndef PI2_PREDICT_H
#define PI2_PREDICT_H

#include "runtime/state.h"

/* The predictor of FFN f on input x (D floats): the predicted neurons, in
 * bundled order, into sel; returns their count. */
uint32_t eng_predict(pi2_engine *e, const eng_ffn *f, const float *x, uint32_t *sel);
/* The same picks among neurons [n0, n_ff) only (fc2 rows below n0 are not
 * read): read-ahead wants only what is not held in memory. */
uint32_t eng_predict_from(pi2_engine *e, const eng_ffn *f, const float *x, uint32_t n0, uint32_t *sel);
/* eng_predict_from a step at a time on the calling thread alone, in
 * scratch b (not the engine's: it may run beside a decode step): start
 * quantizes x and runs the first layer, adds the bytes the prediction reads
 * to *bytes and returns the second layer's units; unit u's picks (the same
 * as eng_predict_from's among neurons [n0 + u ENG_PRED_UNIT, + ENG_PRED_UNIT))
 * go to sel, their count returned (and in b->n[u]). */
int64_t eng_pred_start_alone(const pi2_engine *e, const eng_ffn *f, const float *x, uint32_t n0,
                             const eng_pred_buf *b, uint64_t *bytes);
uint32_t eng_pred_unit_alone(const eng_ffn *f, uint32_t n0, int64_t u, uint32_t *sel, const eng_pred_buf *b);

#endif
