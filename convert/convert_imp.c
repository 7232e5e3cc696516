/* pi2-convert: the importance of each input column of the attention and
 * head matrices, measured in the calibration run for their 4-bit
 * quantizer: the mean square of the activation the column multiplies
 * (what the expected squared error of the product weighs each weight's
 * error by). */
#include "convert/conv.h"

#include <stdlib.h>

/* A share of the mean importance added to every column: a column the
 * calibration text hardly used still counts a little, so text unlike it
 * does not meet a weight quantized with no regard to its error. */
#define IMP_FLOOR 0.01

/* The accumulator of matrix t's input, or NULL when t is not weighed (Q,
 * K and V share theirs; EMBED rows are looked up, a tied head is the
 * embedding table, stored once for both uses, and the FFN keeps the plain
 * quantizer: conv_role_search). */
static conv_imp_acc *slot(const pi2_conv *c, pi2_tname t, int layer)
{
    const pi2_model_desc *d = c->desc;
    conv_imp *m = c->imp;
    if (!m || (t == PI2_T_LM_HEAD && d->tie_embeddings))
        return NULL;
    switch (t) {
    case PI2_T_Q:
    case PI2_T_K:
    case PI2_T_V:
        return &m->acc[layer];
    case PI2_T_O:
        return &m->acc[d->n_layers + layer];
    case PI2_T_LM_HEAD:
        return &m->acc[m->n_acc - 1];
    default:
        return NULL;
    }
}

int conv_imp_alloc(pi2_conv *c, pi2_err *err)
{
    const pi2_model_desc *d = c->desc;
    size_t L = (size_t)d->n_layers, n = 2 * L + 1;
    conv_imp *m = calloc(1, sizeof *m);
    if (m)
        m->acc = pi2_calloc_array(n, sizeof *m->acc);
    if (!m || !m->acc) {
        free(m);
        return pi2_err_set(err, PI2_ENOMEM, "out of memory for activation statistics");
    }
    m->n_acc = n;
    c->imp = m;
    for (size_t i = 0; i < n; i++) {
        int64_t cols = i >= L && i < 2 * L ? (int64_t)d->n_heads * d->head_dim : d->hidden;
        m->acc[i].cols = cols;
        if (!(m->acc[i].sum = pi2_calloc_array((size_t)cols, sizeof *m->acc[i].sum)))
            return pi2_err_set(err, PI2_ENOMEM, "out of memory for activation statistics");
    }
    return 0;
}

void conv_imp_add(pi2_conv *c, pi2_tname t, int layer, int n, const float *in, int64_t cols)
{
    if (t == PI2_T_K || t == PI2_T_V) /* the same rows as Q's */
        return;
    conv_imp_acc *a = slot(c, t, layer);
    if (!a || a->cols != cols)
        return;
    for (int i = 0; i < n; i++) {
        const float *r = in + (size_t)i * (size_t)cols;
        for (int64_t j = 0; j < cols; j++)
            a->sum[j] += (double)r[j] * r[j];
    }
    a->rows += (uint64_t)n;
}

bool conv_imp_fill(const pi2_conv *c, pi2_tname t, int layer, float *out, int64_t cols)
{
    const conv_imp_acc *a = slot(c, t, layer);
    if (!a || a->rows == 0 || a->cols != cols)
        return false;
    double mean = 0;
    for (int64_t j = 0; j < cols; j++)
        mean += a->sum[j];
    mean /= (double)cols * (double)a->rows;
    if (!(mean > 0) || !(mean < 1e30))
        return false; /* nothing measured, or past float: unweighted */
    for (int64_t j = 0; j < cols; j++)
        out[j] = (float)(a->sum[j] / (double)a->rows + IMP_FLOOR * mean);
    return true;
}

void conv_imp_free(pi2_conv *c)
{
    conv_imp *m = c->imp;
    for (size_t i = 0; m && i < m->n_acc; i++)
        free(m->acc[i].sum);
    if (m)
        free(m->acc);
    free(m);
    c->imp = NULL;
}
