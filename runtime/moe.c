/* pi2: MoE routing (contract: runtime/moe.h). */
#include "runtime/moe.h"
#include "runtime/state.h"

#include <math.h>

void pi2_moe_route(const float *lg, int n, int k, int *chosen, double *w)
{
    for (int r = 0; r < k; r++) {
        int best = -1;
        for (int x = 0; x < n; x++) {
            bool taken = false;
            for (int t = 0; t < r; t++)
                taken = taken || chosen[t] == x;
            if (!taken && (best < 0 || lg[x] > lg[best]))
                best = x;
        }
        chosen[r] = best;
    }
    /* chosen[0] holds the maximum */
    double sum = 0.0;
    for (int r = 0; r < k; r++)
        sum += exp((double)lg[chosen[r]] - lg[chosen[0]]);
    for (int r = 0; r < k; r++)
        w[r] = exp((double)lg[chosen[r]] - lg[chosen[0]]) / sum;
}

void eng_route(const pi2_engine *e, const float *router, const float *x, int *chosen, float *wts)
{
    const pi2_model_desc *d = &e->d;
    int ne = d->n_experts, k = d->n_experts_used;
    float *lg = e->router_logits;
    double w[PI2_CFG_MAX_EXPERTS];
    pi2_k_sgemv(router, d->hidden, d->hidden, ne, x, lg);
    pi2_moe_route(lg, ne, k, chosen, w);
    for (int r = 0; r < k; r++)
        wts[r] = (float)w[r];
}
