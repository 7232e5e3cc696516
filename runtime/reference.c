/* Dense fp32 reference forward pass (see reference.h).
 *
 * Written to be read top to bottom and trusted, not to be fast: every matrix
 * is read in place from the safetensors mapping one row at a time, converted
 * element by element, and dotted with a double accumulator. Numeric choices
 * follow HF transformers' fp32 Llama/Mixtral code where it matters for
 * matching golden logits:
 *   - RMSNorm: x * (1/sqrt(mean(x^2) + eps)) rounded to float, then * weight.
 *   - RoPE: inv_freq = 1 / theta^(2i/hd) and the angle pos*inv_freq computed
 *     in float32 with float cos/sin, as HF's LlamaRotaryEmbedding does; the
 *     rotate_half layout pairs element i with i + hd/2. rope_scaling
 *     (linear, dynamic NTK, llama3) changes inv_freq as HF's
 *     modeling_rope_utils does (pi2_rope_inv_freq; dynamic per position).
 *   - MoE routing: top-k of the router logits (ties -> lower index), weights
 *     = softmax over the k selected logits, which equals Mixtral's softmax
 *     over all experts renormalised over the top-k.
 * Everything else (attention scores, softmax, SiLU) is computed in double
 * and rounded to float when stored. */
#include "runtime/reference.h"
#include "runtime/mathops.h"
#include "runtime/moe.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ref_layer {
    const pi2_st_tensor *attn_norm, *ffn_norm; /* (d) */
    const pi2_st_tensor *q, *k, *v;            /* (heads*hd, d), (kv*hd, d), (kv*hd, d) */
    const pi2_st_tensor *o;                    /* (d, heads*hd) */
    const pi2_st_tensor *router;               /* (experts, d); MoE only */
    const pi2_st_tensor **gate, **up, **down;  /* per expert (1 for dense): (ff, d), (ff, d), (d, ff) */
} ref_layer;

struct pi2_ref_model {
    pi2_model_desc d;
    pi2_st *st;
    char *dir;
    int n_exp; /* experts per layer stored: n_experts for MoE, 1 for dense */
    const pi2_st_tensor *embed;    /* (vocab, d) */
    const pi2_st_tensor *out_norm; /* (d) */
    const pi2_st_tensor *head;     /* (vocab, d); the embedding when tied */
    ref_layer *layers;
    const pi2_st_tensor **ffn; /* backing store of the per-expert pointers: layers*n_exp*3 */
    float *inv_freq;           /* (hd/2) at position 0 */
    int n_tokens;              /* ids the tokenizer defines; 0 without tokenizer.json */
};

struct pi2_ref_state {
    const pi2_ref_model *m;
    int max_seq;
    int n_pos;           /* positions held in the cache */
    float *k_cache;      /* (layers, max_seq, kv*hd) */
    float *v_cache;      /* (layers, max_seq, kv*hd) */
    float *x;            /* (d) residual stream */
    float *xb;           /* (d) normed input of the current block */
    float *xb2;          /* (d) block output */
    float *q;            /* (heads*hd) */
    float *att;          /* (heads*hd) attention output */
    double *scores;      /* (max_seq) */
    float *g, *u, *act;  /* (ff) */
    float *exp_out;      /* (d) one expert's output */
    float *router;       /* (experts) */
    int *chosen;         /* (experts_used) */
    float *inv_freq;     /* (hd/2) dynamic NTK: this position's */
    float *rope_cs, *rope_sn; /* (hd/2) this position's rotation */
    float *normw;        /* (d) a norm's weights as f32 */
    pi2_ref_ffn_hook hook;
    void *hook_ctx;
};

/* ---- reading weights in place ---- */

static inline float ld_f32(const uint8_t *p)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    float f;
    memcpy(&f, p, 4);
    return f;
#else
    union { uint32_t u; float f; } v = { .u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                                              (uint32_t)p[3] << 24 };
    return v.f;
#endif
}

static inline uint16_t ld_u16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* sum_j w[off + j] * x[j] for j < n, in double. Types were validated at open. */
static double row_dot(const pi2_st_tensor *w, size_t off, const float *x, int n)
{
    const uint8_t *p = w->data;
    double acc = 0.0;
    switch (w->dtype) {
    case PI2_DT_F32:
        p += off * 4;
        for (int j = 0; j < n; j++)
            acc += (double)ld_f32(p + 4 * (size_t)j) * x[j];
        break;
    case PI2_DT_F16:
        p += off * 2;
        for (int j = 0; j < n; j++)
            acc += (double)pi2_f16_to_f32(ld_u16(p + 2 * (size_t)j)) * x[j];
        break;
    case PI2_DT_BF16:
        p += off * 2;
        for (int j = 0; j < n; j++)
            acc += (double)pi2_bf16_to_f32(ld_u16(p + 2 * (size_t)j)) * x[j];
        break;
    default: break;
    }
    return acc;
}

/* out[j] = w[off + j] for j < n. */
static void row_get(const pi2_st_tensor *w, size_t off, int n, float *out)
{
    const uint8_t *p = w->data;
    switch (w->dtype) {
    case PI2_DT_F32:
        p += off * 4;
        for (int j = 0; j < n; j++)
            out[j] = ld_f32(p + 4 * (size_t)j);
        break;
    case PI2_DT_F16:
        p += off * 2;
        for (int j = 0; j < n; j++)
            out[j] = pi2_f16_to_f32(ld_u16(p + 2 * (size_t)j));
        break;
    case PI2_DT_BF16:
        p += off * 2;
        for (int j = 0; j < n; j++)
            out[j] = pi2_bf16_to_f32(ld_u16(p + 2 * (size_t)j));
        break;
    default: break;
    }
}

/* out = W x; W (rows, cols) row-major, x (cols), out (rows). The matrix's
 * pages are released afterwards so a model larger than memory streams
 * through the mapping with a flat resident set. */
static void matvec(float *out, const pi2_st_tensor *w, const float *x, int rows, int cols)
{
    for (int i = 0; i < rows; i++)
        out[i] = (float)row_dot(w, (size_t)i * (size_t)cols, x, cols);
    pi2_st_release(w);
}

/* out = x / sqrt(mean(x^2) + eps) * w in double (pi2_op_rmsnorm_exact);
 * x, out, w (n), w read into s->normw first. */
static void rmsnorm(pi2_ref_state *s, float *out, const float *x, const pi2_st_tensor *w, int n, float eps)
{
    for (int i = 0; i < n; i++)
        s->normw[i] = pi2_st_get_f32(w, (size_t)i);
    pi2_op_rmsnorm_exact(out, x, s->normw, n, eps);
}

/* ---- open ---- */

static bool is_float(pi2_dtype dt) { return dt == PI2_DT_F32 || dt == PI2_DT_F16 || dt == PI2_DT_BF16; }

/* The index of t's first NaN or infinity (all exponent bits set, read
 * as the file stores it), or nelem when every value is finite. */
static size_t first_nonfinite(const pi2_st_tensor *t)
{
    const uint8_t *p = t->data;
    if (t->dtype == PI2_DT_F32) {
        for (size_t i = 0; i < t->nelem; i++) {
            uint32_t u;
            memcpy(&u, p + 4 * i, 4);
            if ((u & 0x7f800000u) == 0x7f800000u)
                return i;
        }
        return t->nelem;
    }
    uint16_t exp = t->dtype == PI2_DT_F16 ? 0x7c00 : 0x7f80; /* F16 or BF16 */
    for (size_t i = 0; i < t->nelem; i++) {
        uint16_t u;
        memcpy(&u, p + 2 * i, 2);
        if ((u & exp) == exp)
            return i;
    }
    return t->nelem;
}

/* t, found as name: a float tensor of the shape given, every value finite
 * (a NaN or infinity would run to NaN logits: refused as the converter
 * refuses it). */
static int check_tensor(const pi2_ref_model *m, const pi2_st_tensor *t, const char *name, int ndim, int64_t d0,
                        int64_t d1, pi2_err *err)
{
    if (!t)
        return pi2_err_set(err, PI2_ENOTFOUND, "%s: tensor '%s' not found", m->dir, name);
    if (!is_float(t->dtype)) {
        const char *dn = pi2_dtype_name(t->dtype);
        return pi2_err_set(err, PI2_EUNSUPPORTED, "%s: tensor '%s' has dtype %s, the reference needs F32, F16 or BF16",
                           t->file ? t->file : m->dir, name, dn ? dn : "?");
    }
    int64_t shape[2] = { d0, d1 };
    int rc = pi2_st_expect_shape(t, ndim, shape, err);
    size_t bad = rc ? 0 : first_nonfinite(t);
    if (rc == 0 && bad < t->nelem)
        rc = pi2_err_set(err, PI2_ERANGE, "%s: tensor '%s' holds a non-finite value (NaN or infinity) at element %zu",
                         t->file ? t->file : m->dir, name, bad);
    return rc;
}

/* Find tensor `t` (layer, expert) and check its shape (ndim 1: d0; 2: d0 x d1). */
static int need(pi2_ref_model *m, const pi2_st_tensor **out, pi2_tname t, int layer, int expert, int ndim,
                int64_t d0, int64_t d1, pi2_err *err)
{
    char name[160];
    if (!pi2_tensor_name(name, sizeof name, &m->d, t, layer, expert))
        return pi2_err_set(err, PI2_EINVAL, "%s: no tensor name for part %d layer %d expert %d", m->dir, (int)t,
                           layer, expert);
    *out = pi2_st_find(m->st, name);
    return check_tensor(m, *out, name, ndim, d0, d1, err);
}

/* The embedding and head; a tied model may store the matrix once under
 * either name (HF ties lm_head to embed_tokens, so that one wins if both). */
static int find_embed_head(pi2_ref_model *m, pi2_err *err)
{
    const pi2_model_desc *d = &m->d;
    const char *en = "model.embed_tokens.weight", *hn = "lm_head.weight";
    const pi2_st_tensor *e = pi2_st_find(m->st, en), *h = pi2_st_find(m->st, hn);
    int rc;
    if (d->tie_embeddings) {
        const pi2_st_tensor *t = e ? e : h;
        if (!t)
            return pi2_err_set(err, PI2_ENOTFOUND, "%s: tensor '%s' (or '%s', tied) not found", m->dir, en, hn);
        if ((rc = check_tensor(m, t, t->name, 2, d->vocab, d->hidden, err)))
            return rc;
        m->embed = m->head = t;
        return 0;
    }
    if ((rc = check_tensor(m, e, en, 2, d->vocab, d->hidden, err)) ||
        (rc = check_tensor(m, h, hn, 2, d->vocab, d->hidden, err)))
        return rc;
    m->embed = e;
    m->head = h;
    return 0;
}

static int bind_tensors(pi2_ref_model *m, pi2_err *err)
{
    const pi2_model_desc *d = &m->d;
    int64_t D = d->hidden, qd = (int64_t)d->n_heads * d->head_dim, kvd = (int64_t)d->n_kv_heads * d->head_dim;
    int64_t ff = d->n_ff;
    int rc;
    if ((rc = find_embed_head(m, err)) || (rc = need(m, &m->out_norm, PI2_T_OUT_NORM, 0, 0, 1, D, 0, err)))
        return rc;
    for (int l = 0; l < d->n_layers; l++) {
        ref_layer *L = &m->layers[l];
        if ((rc = need(m, &L->attn_norm, PI2_T_ATTN_NORM, l, 0, 1, D, 0, err)) ||
            (rc = need(m, &L->ffn_norm, PI2_T_FFN_NORM, l, 0, 1, D, 0, err)) ||
            (rc = need(m, &L->q, PI2_T_Q, l, 0, 2, qd, D, err)) ||
            (rc = need(m, &L->k, PI2_T_K, l, 0, 2, kvd, D, err)) ||
            (rc = need(m, &L->v, PI2_T_V, l, 0, 2, kvd, D, err)) ||
            (rc = need(m, &L->o, PI2_T_O, l, 0, 2, D, qd, err)))
            return rc;
        if (pi2_desc_is_moe(d) && (rc = need(m, &L->router, PI2_T_ROUTER, l, 0, 2, d->n_experts, D, err)))
            return rc;
        for (int e = 0; e < m->n_exp; e++)
            if ((rc = need(m, &L->gate[e], PI2_T_GATE, l, e, 2, ff, D, err)) ||
                (rc = need(m, &L->up[e], PI2_T_UP, l, e, 2, ff, D, err)) ||
                (rc = need(m, &L->down[e], PI2_T_DOWN, l, e, 2, D, ff, err)))
                return rc;
    }
    return 0;
}

int pi2_ref_open(pi2_ref_model **out, const char *hf_dir, pi2_err *err)
{
    if (!out || !hf_dir)
        return pi2_err_set(err, PI2_EINVAL, "reference: NULL argument");
    *out = NULL;
    pi2_ref_model *m = calloc(1, sizeof *m);
    if (!m || !(m->dir = pi2_strdup(hf_dir))) {
        free(m);
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", hf_dir);
    }
    int rc = pi2_config_read_model(hf_dir, &m->d, &m->n_tokens, err);
    if (rc == 0)
        rc = pi2_st_open(&m->st, hf_dir, err);
    if (rc) {
        pi2_ref_close(m);
        return rc;
    }
    const pi2_model_desc *d = &m->d;
    m->n_exp = pi2_desc_is_moe(d) ? d->n_experts : 1;
    size_t n_ffn; /* layers * experts * 3 pointers: bounded by the config caps */
    m->layers = pi2_calloc_array((size_t)d->n_layers, sizeof *m->layers);
    m->inv_freq = pi2_malloc_array((size_t)d->head_dim / 2, sizeof *m->inv_freq);
    if (pi2_mul_size((size_t)d->n_layers * (size_t)m->n_exp, 3, &n_ffn))
        m->ffn = pi2_calloc_array(n_ffn, sizeof *m->ffn);
    if (!m->layers || !m->inv_freq || !m->ffn) {
        pi2_ref_close(m);
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", hf_dir);
    }
    for (int l = 0; l < d->n_layers; l++) {
        const pi2_st_tensor **base = m->ffn + (size_t)l * (size_t)m->n_exp * 3;
        m->layers[l].gate = base;
        m->layers[l].up = base + m->n_exp;
        m->layers[l].down = base + 2 * (size_t)m->n_exp;
    }
    /* HF: inv_freq = 1.0 / (base ** (arange(0, hd, 2).float() / hd)), all
     * float32, then the rope_scaling rule (formats/hfconfig.h). */
    pi2_rope_inv_freq(d, 0, m->inv_freq);
    if ((rc = bind_tensors(m, err))) {
        pi2_ref_close(m);
        return rc;
    }
    *out = m;
    return 0;
}

void pi2_ref_close(pi2_ref_model *m)
{
    if (!m)
        return;
    pi2_st_close(m->st);
    free(m->layers);
    free(m->ffn);
    free(m->inv_freq);
    free(m->dir);
    free(m);
}

const pi2_model_desc *pi2_ref_desc(const pi2_ref_model *m) { return m ? &m->d : NULL; }
const pi2_st *pi2_ref_tensors(const pi2_ref_model *m) { return m ? m->st : NULL; }
int pi2_ref_n_tokens(const pi2_ref_model *m) { return m ? m->n_tokens : 0; }

const pi2_st_tensor *pi2_ref_weight(const pi2_ref_model *m, pi2_tname t, int layer, int expert)
{
    if (!m)
        return NULL;
    switch (t) {
    case PI2_T_EMBED: return m->embed;
    case PI2_T_LM_HEAD: return m->head;
    case PI2_T_OUT_NORM: return m->out_norm;
    default: break;
    }
    if (layer < 0 || layer >= m->d.n_layers)
        return NULL;
    const ref_layer *L = &m->layers[layer];
    switch (t) {
    case PI2_T_ATTN_NORM: return L->attn_norm;
    case PI2_T_FFN_NORM: return L->ffn_norm;
    case PI2_T_Q: return L->q;
    case PI2_T_K: return L->k;
    case PI2_T_V: return L->v;
    case PI2_T_O: return L->o;
    case PI2_T_ROUTER: return L->router;
    default: break;
    }
    if (expert < 0 || expert >= m->n_exp)
        return NULL;
    switch (t) {
    case PI2_T_GATE: return L->gate[expert];
    case PI2_T_UP: return L->up[expert];
    case PI2_T_DOWN: return L->down[expert];
    default: return NULL;
    }
}

/* ---- state ---- */

int pi2_ref_state_create(pi2_ref_state **out, const pi2_ref_model *m, int max_seq, pi2_err *err)
{
    if (!out || !m)
        return pi2_err_set(err, PI2_EINVAL, "reference: NULL argument");
    *out = NULL;
    const pi2_model_desc *d = &m->d;
    if (max_seq < 1 || max_seq > pi2_desc_max_ctx(d))
        return pi2_err_set(err, PI2_ERANGE, "%s: max_seq %d out of range [1, %d] (the model's positions)", m->dir,
                           max_seq, pi2_desc_max_ctx(d));
    size_t kvd = (size_t)d->n_kv_heads * (size_t)d->head_dim, qd = (size_t)d->n_heads * (size_t)d->head_dim;
    size_t cache;
    bool ok = pi2_mul_size((size_t)d->n_layers, (size_t)max_seq, &cache) && pi2_mul_size(cache, kvd, &cache);
    pi2_ref_state *s = calloc(1, sizeof *s);
    if (!ok || !s) {
        free(s);
        return pi2_err_set(err, ok ? PI2_ENOMEM : PI2_ERANGE, "%s: KV cache for %d positions: %s", m->dir, max_seq,
                           ok ? "out of memory" : "size overflows");
    }
    s->m = m;
    s->max_seq = max_seq;
    size_t D = (size_t)d->hidden, ff = (size_t)d->n_ff, ne = d->n_experts > 0 ? (size_t)d->n_experts : 1;
    s->k_cache = pi2_malloc_array(cache, sizeof(float));
    s->v_cache = pi2_malloc_array(cache, sizeof(float));
    s->x = pi2_malloc_array(D, sizeof(float));
    s->xb = pi2_malloc_array(D, sizeof(float));
    s->xb2 = pi2_malloc_array(D, sizeof(float));
    s->exp_out = pi2_malloc_array(D, sizeof(float));
    s->q = pi2_malloc_array(qd, sizeof(float));
    s->att = pi2_malloc_array(qd, sizeof(float));
    s->scores = pi2_malloc_array((size_t)max_seq, sizeof(double));
    s->g = pi2_malloc_array(ff, sizeof(float));
    s->u = pi2_malloc_array(ff, sizeof(float));
    s->act = pi2_malloc_array(ff, sizeof(float));
    s->router = pi2_malloc_array(ne, sizeof(float));
    s->chosen = pi2_malloc_array(ne, sizeof(int));
    s->inv_freq = pi2_malloc_array((size_t)d->head_dim / 2, sizeof(float));
    s->rope_cs = pi2_malloc_array((size_t)d->head_dim / 2, sizeof(float));
    s->rope_sn = pi2_malloc_array((size_t)d->head_dim / 2, sizeof(float));
    s->normw = pi2_malloc_array(D, sizeof(float));
    if (!s->inv_freq || !s->rope_cs || !s->rope_sn || !s->normw || !s->k_cache || !s->v_cache || !s->x || !s->xb || !s->xb2 || !s->exp_out || !s->q || !s->att ||
        !s->scores || !s->g || !s->u || !s->act || !s->router || !s->chosen) {
        pi2_ref_state_free(s);
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory for the KV cache and scratch (%d positions)", m->dir,
                           max_seq);
    }
    *out = s;
    return 0;
}

void pi2_ref_state_free(pi2_ref_state *s)
{
    if (!s)
        return;
    free(s->k_cache);
    free(s->v_cache);
    free(s->x);
    free(s->xb);
    free(s->xb2);
    free(s->exp_out);
    free(s->q);
    free(s->att);
    free(s->scores);
    free(s->g);
    free(s->u);
    free(s->act);
    free(s->router);
    free(s->chosen);
    free(s->inv_freq);
    free(s->rope_cs);
    free(s->rope_sn);
    free(s->normw);
    free(s);
}

void pi2_ref_state_set_hook(pi2_ref_state *s, pi2_ref_ffn_hook hook, void *ctx)
{
    if (!s)
        return;
    s->hook = hook;
    s->hook_ctx = ctx;
}

const float *pi2_ref_state_residual(const pi2_ref_state *s) { return s->x; }

/* ---- forward ---- */

/* One FFN (the dense one, or expert e): out = down(act(gate x, up x)). */
static void ffn_one(const pi2_ref_model *m, pi2_ref_state *s, int l, int e, const float *x, float *out)
{
    const pi2_model_desc *d = &m->d;
    const ref_layer *L = &m->layers[l];
    int D = d->hidden, ff = d->n_ff;
    matvec(s->g, L->gate[e], x, ff, D); /* (ff) */
    matvec(s->u, L->up[e], x, ff, D);   /* (ff) */
    for (int i = 0; i < ff; i++)
        s->act[i] = pi2_op_act_exact(d->act, s->g[i], s->u[i], d->act_param);
    if (s->hook)
        s->hook(s->hook_ctx, l, e, x, s->act);
    matvec(out, L->down[e], s->act, D, ff); /* (d) */
}

/* MoE FFN: route x to the top-k experts and mix their outputs into out. */
static void ffn_moe(const pi2_ref_model *m, pi2_ref_state *s, int l, const float *x, float *out)
{
    const pi2_model_desc *d = &m->d;
    int D = d->hidden, ne = d->n_experts, k = d->n_experts_used;
    matvec(s->router, m->layers[l].router, x, ne, D); /* (experts) */
    /* top-k, lower index on ties; softmax over the chosen (runtime/moe.h) */
    double w[PI2_CFG_MAX_EXPERTS];
    pi2_moe_route(s->router, ne, k, s->chosen, w);
    for (int i = 0; i < D; i++)
        out[i] = 0.0f;
    for (int r = 0; r < k; r++) {
        ffn_one(m, s, l, s->chosen[r], x, s->exp_out);
        for (int i = 0; i < D; i++)
            out[i] += (float)(w[r] * s->exp_out[i]);
    }
}

int pi2_ref_forward(const pi2_ref_model *m, pi2_ref_state *s, int token, int pos, float *logits, pi2_err *err)
{
    if (!m || !s || !logits)
        return pi2_err_set(err, PI2_EINVAL, "reference: NULL argument");
    if (s->m != m)
        return pi2_err_set(err, PI2_EINVAL, "%s: state was created for another model", m->dir);
    const pi2_model_desc *d = &m->d;
    if (token < 0 || token >= d->vocab)
        return pi2_err_set(err, PI2_ERANGE, "%s: token id %d out of range [0, %d)", m->dir, token, d->vocab);
    if (pos < 0 || pos >= s->max_seq || pos > s->n_pos)
        return pi2_err_set(err, PI2_ERANGE, "%s: position %d out of range (state holds %d of %d positions)", m->dir,
                           pos, s->n_pos, s->max_seq);

    int D = d->hidden, hd = d->head_dim, nh = d->n_heads, nkv = d->n_kv_heads;
    int qd = nh * hd, kvd = nkv * hd, group = nh / nkv;
    double scale = 1.0 / sqrt((double)hd);
    float *x = s->x; /* (d) */
    const float *inv_freq = m->inv_freq; /* (hd/2) */
    if (pi2_rope_varies(d, pos)) {       /* dynamic NTK past max_position_embeddings */
        pi2_rope_inv_freq(d, pos, s->inv_freq);
        inv_freq = s->inv_freq;
    }
    for (int i = 0; i < hd / 2; i++) { /* RoPE's rotation at pos: angle (float)pos * inv_freq[i] */
        float angle = (float)pos * inv_freq[i];
        s->rope_cs[i] = cosf(angle);
        s->rope_sn[i] = sinf(angle);
    }

    row_get(m->embed, (size_t)token * (size_t)D, D, x);

    for (int l = 0; l < d->n_layers; l++) {
        const ref_layer *L = &m->layers[l];
        float *kc = s->k_cache + (size_t)l * (size_t)s->max_seq * (size_t)kvd; /* (max_seq, kv*hd) */
        float *vc = s->v_cache + (size_t)l * (size_t)s->max_seq * (size_t)kvd; /* (max_seq, kv*hd) */
        float *k_now = kc + (size_t)pos * (size_t)kvd;
        float *v_now = vc + (size_t)pos * (size_t)kvd;

        /* attention */
        rmsnorm(s, s->xb, x, L->attn_norm, D, d->rms_eps);
        matvec(s->q, L->q, s->xb, qd, D);  /* (heads, hd) */
        matvec(k_now, L->k, s->xb, kvd, D); /* (kv, hd) straight into the cache */
        matvec(v_now, L->v, s->xb, kvd, D); /* (kv, hd) */
        pi2_op_rope(s->q, nh, hd, s->rope_cs, s->rope_sn);
        pi2_op_rope(k_now, nkv, hd, s->rope_cs, s->rope_sn);

        for (int h = 0; h < nh; h++) {
            const float *qh = s->q + (size_t)h * hd; /* (hd) */
            int kh = h / group;                       /* GQA: kv head shared by `group` query heads */
            double mx = -INFINITY;
            for (int t = 0; t <= pos; t++) {
                const float *kt = kc + (size_t)t * kvd + (size_t)kh * hd;
                double dot = 0.0;
                for (int i = 0; i < hd; i++)
                    dot += (double)qh[i] * kt[i];
                s->scores[t] = dot * scale;
                if (s->scores[t] > mx)
                    mx = s->scores[t];
            }
            double sum = 0.0;
            for (int t = 0; t <= pos; t++) {
                s->scores[t] = exp(s->scores[t] - mx);
                sum += s->scores[t];
            }
            float *oh = s->att + (size_t)h * hd; /* (hd) */
            for (int i = 0; i < hd; i++) {
                double acc = 0.0;
                for (int t = 0; t <= pos; t++)
                    acc += s->scores[t] * vc[(size_t)t * kvd + (size_t)kh * hd + i];
                oh[i] = (float)(acc / sum);
            }
        }
        matvec(s->xb2, L->o, s->att, D, qd); /* (d) */
        for (int i = 0; i < D; i++)
            x[i] += s->xb2[i];

        /* FFN */
        rmsnorm(s, s->xb, x, L->ffn_norm, D, d->rms_eps);
        if (pi2_desc_is_moe(d))
            ffn_moe(m, s, l, s->xb, s->xb2);
        else
            ffn_one(m, s, l, 0, s->xb, s->xb2);
        for (int i = 0; i < D; i++)
            x[i] += s->xb2[i];
    }

    rmsnorm(s, s->xb, x, m->out_norm, D, d->rms_eps);
    matvec(logits, m->head, s->xb, d->vocab, D); /* (vocab) */
    s->n_pos = pos + 1;
    return 0;
}
