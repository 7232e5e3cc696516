#include "runtime/sample.h"

#include <math.h>
#include <stdlib.h>

struct pi2_sampler {
    pi2_sample_opts o;
    int vocab;
    pi2_rng rng;
    struct cand {
        float p;
        int id;
    } *cand;
};

int pi2_sampler_create(pi2_sampler **out, int vocab, const pi2_sample_opts *o, pi2_err *err)
{
    *out = NULL;
    if (vocab <= 0)
        return pi2_err_set(err, PI2_EINVAL, "sampler: vocabulary size %d must be positive", vocab);
    if (!(o->temperature >= 0.0f) || !isfinite(o->temperature))
        return pi2_err_set(err, PI2_EINVAL, "sampler: temperature %g must be a finite number >= 0", (double)o->temperature);
    if (o->top_k < 0)
        return pi2_err_set(err, PI2_EINVAL, "sampler: top-k %d must be >= 0 (0 = no limit)", o->top_k);
    if (!(o->top_p > 0.0f && o->top_p <= 1.0f))
        return pi2_err_set(err, PI2_EINVAL, "sampler: top-p %g must be in (0, 1]", (double)o->top_p);
    pi2_sampler *s = calloc(1, sizeof *s);
    if (!s)
        return pi2_err_set(err, PI2_ENOMEM, "sampler: out of memory");
    s->cand = pi2_malloc_array((size_t)vocab, sizeof *s->cand);
    if (!s->cand) {
        free(s);
        return pi2_err_set(err, PI2_ENOMEM, "sampler: out of memory for %d candidates", vocab);
    }
    s->o = *o;
    s->vocab = vocab;
    pi2_rng_seed(&s->rng, o->seed);
    *out = s;
    return 0;
}

void pi2_sampler_free(pi2_sampler *s)
{
    if (!s)
        return;
    free(s->cand);
    free(s);
}

int pi2_argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best] || (isnan(x[best]) && !isnan(x[i])))
            best = i;
    return best;
}

void pi2_logits_mask_padding(float *logits, int vocab, int n_valid)
{
    if (n_valid <= 0)
        return;
    for (int i = n_valid; i < vocab; i++)
        logits[i] = -INFINITY;
}

static int cand_desc(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    if (x->p != y->p)
        return x->p < y->p ? 1 : -1;
    return x->id - y->id;
}

int pi2_sampler_next(pi2_sampler *s, const float *logits)
{
    int n = s->vocab;
    if (s->o.temperature == 0.0f)
        return pi2_argmax(logits, n);
    int best = pi2_argmax(logits, n);
    float mx = logits[best];
    if (isnan(mx))
        return 0;
    /* softmax over logits / T; NaN entries get probability 0 */
    double sum = 0;
    int m = 0;
    for (int i = 0; i < n; i++) {
        float l = logits[i];
        if (isnan(l))
            continue;
        float p = expf((l - mx) / s->o.temperature);
        s->cand[m].p = p;
        s->cand[m].id = i;
        sum += p;
        m++;
    }
    bool truncate = (s->o.top_k > 0 && s->o.top_k < m) || s->o.top_p < 1.0f;
    if (truncate) {
        qsort(s->cand, (size_t)m, sizeof *s->cand, cand_desc);
        if (s->o.top_k > 0 && s->o.top_k < m)
            m = s->o.top_k;
        sum = 0;
        for (int i = 0; i < m; i++)
            sum += s->cand[i].p;
        if (s->o.top_p < 1.0f) {
            double acc = 0;
            int keep = m;
            for (int i = 0; i < m; i++) {
                acc += s->cand[i].p;
                if (acc >= s->o.top_p * sum) {
                    keep = i + 1;
                    break;
                }
            }
            m = keep;
            sum = acc < sum ? acc : sum;
        }
    }
    double r = pi2_rng_uniform(&s->rng) * sum;
    double acc = 0;
    for (int i = 0; i < m; i++) {
        acc += s->cand[i].p;
        if (r < acc)
            return s->cand[i].id;
    }
    return s->cand[m - 1].id;
}
