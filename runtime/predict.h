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

#endif
