/* The small math of a transformer layer, one copy for the engine, the fp32
 * reference and calibration: RMS norm, RoPE, the FFN activations and a
 * top-k. Where precision differs, two variants: the one the engine runs,
 * and the _exact one the reference and calibration run (the sum of squares
 * in one double chain, SiLU's sigmoid in double), so each keeps its bits. */
#ifndef PI2_MATHOPS_H
#define PI2_MATHOPS_H

#include "formats/hfconfig.h"

#include <stdint.h>

/* out[0..n) = x / sqrt(mean(x^2) + eps) * w, the sum of squares in 8
 * double chains, the scale rounded to float (the engine's). */
void pi2_op_rmsnorm(float *restrict out, const float *restrict x, const float *restrict w, int n, float eps);
/* The same in one double chain, the scale kept in double: out[i] =
 * (float)(x[i] * scale) * w[i]. */
void pi2_op_rmsnorm_exact(float *out, const float *x, const float *w, int n, float eps);

/* In place, n_heads vectors of hd floats (hd even): each pair (i, i + hd/2)
 * rotated by the angle whose cosine and sine are cs[i] and sn[i]. */
void pi2_op_rope(float *v, int n_heads, int hd, const float *cs, const float *sn);

/* act(g, u) of the FFN's activation for gate g and up value u; t is
 * FATReLU's threshold (the gate must exceed it; the others ignore it). */
float pi2_op_act(pi2_act a, float g, float u, float t);
/* g[k] = pi2_op_act(a, g[k], u[k], t) for k < n, bit for bit (g and u apart). */
void pi2_op_act_rows(pi2_act a, float *restrict g, const float *restrict u, int64_t n, float t);
/* The reference's: SiLU's sigmoid in double, the ReLU family as above. */
float pi2_op_act_exact(pi2_act a, float g, float u, float t);
/* g[k] = pi2_op_act_exact(a, g[k], u[k], t) for k < n. */
void pi2_op_act_rows_exact(pi2_act a, float *g, const float *u, int64_t n, float t);

/* The indices of the k largest of v[0..n) (1 <= k <= n) into top[], in no
 * particular order (the output head's candidates). */
void pi2_op_top_k(const float *v, int64_t n, int k, int32_t *top);

#endif
