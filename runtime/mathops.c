/* pi2: the small math of a layer (contract: runtime/mathops.h). */
#include "runtime/mathops.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

void pi2_op_rmsnorm(float *restrict out, const float *restrict x, const float *restrict w, int n, float eps)
{
    /* the sum of squares in 8 double chains (one chain waited on each
     * add's latency), runs of a constant 8 so the loops vectorize */
    double s8[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            s8[k] += (double)x[i + k] * x[i + k];
    double ss = ((s8[0] + s8[1]) + (s8[2] + s8[3])) + ((s8[4] + s8[5]) + (s8[6] + s8[7]));
    for (int k = i; k < n; k++)
        ss += (double)x[k] * x[k];
    float inv = (float)(1.0 / sqrt(ss / n + eps));
    for (i = 0; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            out[i + k] = x[i + k] * inv * w[i + k];
    for (; i < n; i++)
        out[i] = x[i] * inv * w[i];
}

void pi2_op_rope(float *v, int n_heads, int hd, const float *cs, const float *sn)
{
    int half = hd / 2;
    for (int h = 0; h < n_heads; h++) {
        float *x = v + (size_t)h * hd;
        for (int i = 0; i < half; i++) {
            float x1 = x[i], x2 = x[i + half];
            x[i] = x1 * cs[i] - x2 * sn[i];
            x[i + half] = x2 * cs[i] + x1 * sn[i];
        }
    }
}

/* t: FATReLU's threshold (pi2_desc_gate_threshold; the gate must exceed it). */
static inline float act_fn(pi2_act a, float g, float u, float t)
{
    switch (a) {
    case PI2_ACT_SILU: return g / (1.0f + expf(-g)) * u;
    case PI2_ACT_RELU: return g > 0.0f ? g * u : 0.0f;
    case PI2_ACT_DRELU: return g > 0.0f && u > 0.0f ? g * u : 0.0f;
    case PI2_ACT_FATRELU: return g > t ? g * u : 0.0f;
    }
    return 0.0f;
}

/* g[k] = act(g[k], u[k]) for k < n, act_fn's results: for the ReLU family
 * the product is computed either way and kept by a bit mask (+0 where the
 * gate is closed), so the compiler's cheap vectorizer takes the loops.
 * Out of line: pi2_op_act runs the same code for its one value, so a NaN's
 * sign (which operand a multiply passes on) cannot differ between the two. */
__attribute__((noinline)) static void act_rows(pi2_act a, float t, float *restrict g, const float *restrict u,
                                               int64_t n)
{
    int64_t k = 0;
    if (a == PI2_ACT_RELU || a == PI2_ACT_DRELU || a == PI2_ACT_FATRELU) {
        bool dr = a == PI2_ACT_DRELU;
        float thr = a == PI2_ACT_FATRELU ? t : 0.0f;
        for (; k + 8 <= n; k += 8)
            for (int i = 0; i < 8; i++) {
                float m = g[k + i] * u[k + i];
                uint32_t b;
                memcpy(&b, &m, sizeof b);
                b &= -(uint32_t)((g[k + i] > thr) & (!dr | (u[k + i] > 0.0f)));
                memcpy(&g[k + i], &b, sizeof b);
            }
    }
    for (; k < n; k++)
        g[k] = act_fn(a, g[k], u[k], t);
}

float pi2_op_act(pi2_act a, float g, float u, float t)
{
    act_rows(a, t, &g, &u, 1);
    return g;
}

void pi2_op_act_rows(pi2_act a, float *restrict g, const float *restrict u, int64_t n, float t)
{
    act_rows(a, t, g, u, n);
}

/* A min-heap of the best so far: most values are rejected by one compare
 * with its root. */
void pi2_op_top_k(const float *v, int64_t n, int k, int32_t *top)
{
    int m = 0;
    for (int64_t i = 0; i < n; i++) {
        if (m == k && !(v[i] > v[top[0]]))
            continue;
        int c;
        if (m < k) { /* sift up */
            c = m++;
            while (c > 0 && v[i] < v[top[(c - 1) / 2]]) {
                top[c] = top[(c - 1) / 2];
                c = (c - 1) / 2;
            }
        } else { /* replace the root, sift down */
            c = 0;
            for (;;) {
                int l = 2 * c + 1, r = l + 1, s = c;
                float sv = v[i];
                if (l < m && v[top[l]] < sv)
                    s = l, sv = v[top[l]];
                if (r < m && v[top[r]] < sv)
                    s = r;
                if (s == c)
                    break;
                top[c] = top[s];
                c = s;
            }
        }
        top[c] = (int32_t)i;
    }
}

void pi2_op_rmsnorm_exact(float *out, const float *x, const float *w, int n, float eps)
{
    double ss = 0.0;
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    double inv = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++)
        out[i] = (float)(x[i] * inv) * w[i];
}

float pi2_op_act_exact(pi2_act a, float g, float u, float t)
{
    if (a == PI2_ACT_SILU)
        return (float)(g / (1.0 + exp(-(double)g))) * u;
    return act_fn(a, g, u, t);
}

void pi2_op_act_rows_exact(pi2_act a, float *g, const float *u, int64_t n, float t)
{
    switch (a) { /* one loop per activation: the calibration's rows are long */
    case PI2_ACT_SILU:
        for (int64_t i = 0; i < n; i++)
            g[i] = (float)(g[i] / (1.0 + exp(-(double)g[i]))) * u[i];
        break;
    case PI2_ACT_RELU:
        for (int64_t i = 0; i < n; i++)
            g[i] = g[i] > 0.0f ? g[i] * u[i] : 0.0f;
        break;
    case PI2_ACT_DRELU:
        for (int64_t i = 0; i < n; i++)
            g[i] = g[i] > 0.0f && u[i] > 0.0f ? g[i] * u[i] : 0.0f;
        break;
    case PI2_ACT_FATRELU:
        for (int64_t i = 0; i < n; i++)
            g[i] = g[i] > t ? g[i] * u[i] : 0.0f;
        break;
    }
}
