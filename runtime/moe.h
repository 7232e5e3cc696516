/* MoE routing: which experts a token goes to and with what weights. One
 * rule for the engine, the fp32 reference and calibration, so the three
 * choose the same experts from the same logits. */
#ifndef PI2_MOE_H
#define PI2_MOE_H

/* The k experts with the largest router logits lg[0..n) into chosen[0..k)
 * (1 <= k <= n), largest first, the lower index on ties (repeated argmax
 * with a strict '>'), and the softmax over the chosen logits, in double,
 * into w[0..k). */
void pi2_moe_route(const float *lg, int n, int k, int *chosen, double *w);

/* The engine's routing (moe.c): router logits of x (hidden floats) ->
 * chosen[top-k] experts by pi2_moe_route and their weights wts[top-k]. */
struct pi2_engine;
void eng_route(const struct pi2_engine *e, const float *router, const float *x, int *chosen, float *wts);

#endif
