/* pi2 engine: MoE routing. */
#include "runtime/engine_internal.h"

#include <math.h>

void eng_route(const pi2_engine *e, const float *router, const float *x, int *chosen, float *wts)
{
    const pi2_model_desc *d = &e->d;
    int ne = d->n_experts, k = d->n_experts_used;
    float *lg = e->router_logits;
    pi2_k_sgemv(router, d->hidden, d->hidden, ne, x, lg);
    for (int r = 0; r < k; r++) {
        int best = -1;
        for (int x2 = 0; x2 < ne; x2++) {
            bool taken = false;
            for (int t = 0; t < r; t++)
                taken = taken || chosen[t] == x2;
            if (!taken && (best < 0 || lg[x2] > lg[best]))
                best = x2;
        }
        chosen[r] = best;
    }
    double sum = 0.0;
    for (int r = 0; r < k; r++)
        sum += exp((double)lg[chosen[r]] - lg[chosen[0]]);
    for (int r = 0; r < k; r++)
        wts[r] = (float)(exp((double)lg[chosen[r]] - lg[chosen[0]]) / sum);
}
