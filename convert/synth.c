/* Model generator with planted activation sparsity; see synth.h for the
 * construction. Numbers below are in units where the embedding stream has
 * RMS 1 per coordinate. */
#include "convert/synth.h"

#include "convert/synth_tok.h"
#include "formats/pool.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *const pi2_synth_preset_names[] = {"tiny", "small", "1b", "7b", "moe", NULL};

static void desc_dense(pi2_model_desc *d, int hidden, int ff, int layers, int heads, int kv, int vocab)
{
    memset(d, 0, sizeof *d);
    d->arch = PI2_ARCH_BAMBOO;
    d->act = PI2_ACT_DRELU;
    d->hidden = hidden;
    d->n_ff = ff;
    d->n_layers = layers;
    d->n_heads = heads;
    d->n_kv_heads = kv;
    d->head_dim = hidden / heads;
    d->vocab = vocab;
    d->max_pos = 4096;
    d->rope_theta = 10000.0;
    d->rms_eps = 1e-5f;
    d->tie_embeddings = false;
    d->bos_id = 1;
    d->n_eos = 1;
    d->eos_ids[0] = 2;
}

int pi2_synth_preset(const char *name, pi2_synth_opts *o, pi2_err *err)
{
    memset(o, 0, sizeof *o);
    o->dtype = PI2_DT_BF16;
    o->active_frac = 0.10;
    o->hot_frac = 0.03;
    o->layer_gain = 0.15;
    o->seed = 1;
    if (strcmp(name, "tiny") == 0) {
        desc_dense(&o->desc, 64, 256, 2, 4, 2, 512);
        o->desc.max_pos = 512;
        o->dtype = PI2_DT_F32;
    } else if (strcmp(name, "small") == 0) {
        desc_dense(&o->desc, 256, 1024, 4, 8, 4, 2048);
        o->desc.max_pos = 1024;
        o->dtype = PI2_DT_F32;
    } else if (strcmp(name, "1b") == 0) {
        desc_dense(&o->desc, 2048, 5632, 22, 32, 4, 32000);
    } else if (strcmp(name, "7b") == 0) {
        desc_dense(&o->desc, 4096, 14336, 32, 32, 8, 32000);
    } else if (strcmp(name, "moe") == 0) {
        desc_dense(&o->desc, 2048, 5632, 16, 16, 8, 32000);
        o->desc.arch = PI2_ARCH_TURBOSPARSE_MIXTRAL;
        o->desc.n_experts = 8;
        o->desc.n_experts_used = 2;
        o->predictors = true;
    } else {
        return pi2_err_set(err, PI2_EINVAL, "unknown preset '%s' (tiny, small, 1b, 7b, moe)", name);
    }
    return 0;
}

/* ---- counter-based randomness ---- */

static inline uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t key(uint64_t seed, uint64_t a, uint64_t b, uint64_t c)
{
    return mix64(seed ^ mix64(a * 0x9e3779b97f4a7c15ull ^ mix64(b * 0xc2b2ae3d27d4eb4full ^ mix64(c + 1))));
}

/* Approximately standard normal from 64 random bits (sum of 4 uniforms). */
static inline float hnorm(uint64_t h)
{
    uint32_t s = (uint32_t)(h & 0xffff) + (uint32_t)((h >> 16) & 0xffff) + (uint32_t)((h >> 32) & 0xffff) +
                 (uint32_t)(h >> 48);
    return ((float)s - 131070.0f) * (1.7320508f / 65536.0f);
}

/* y += a * x. Unrolled so the compiler's straight-line vectoriser uses SIMD
 * at -O2; this loop is most of the generator's arithmetic. */
static void axpy(float *restrict y, float a, const float *restrict x, int n)
{
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        y[j + 0] += a * x[j + 0];
        y[j + 1] += a * x[j + 1];
        y[j + 2] += a * x[j + 2];
        y[j + 3] += a * x[j + 3];
        y[j + 4] += a * x[j + 4];
        y[j + 5] += a * x[j + 5];
        y[j + 6] += a * x[j + 6];
        y[j + 7] += a * x[j + 7];
    }
    for (; j < n; j++)
        y[j] += a * x[j];
}

/* Element j of a row whose key is `rk`: one mix per element (splitmix64). */
static inline uint64_t elem(uint64_t rk, uint64_t j) { return mix64(rk + (j + 1) * 0x9e3779b97f4a7c15ull); }

static inline double huni(uint64_t h) { return (double)(h >> 11) * 0x1.0p-53; }

/* Inverse of the standard normal CDF, by bisection on erfc (exact enough). */
static double probit(double p)
{
    double lo = -10, hi = 10;
    for (int i = 0; i < 60; i++) {
        double mid = 0.5 * (lo + hi);
        if (0.5 * erfc(-mid / sqrt(2.0)) < p)
            lo = mid;
        else
            hi = mid;
    }
    return 0.5 * (lo + hi);
}

/* Tensor kinds, also hash domains. */
enum {
    K_EMBED = 1, K_EMBED_H, K_NORM, K_Q, K_K, K_V, K_O, K_GATE, K_UP, K_DOWN, K_ROUTER, K_FC1, K_FC2,
    K_HEAD, K_DIR, K_PLANT_A, K_PLANT_F, K_PLANT_HOT, K_NORM_W,
};

/* Planted parameters of one FFN (layer, expert). */
typedef struct plant {
    int layer, expert;
    float *a;    /* [F, r] unit rows */
    float *b;    /* [F] bias coefficient along u (already divided by S) */
    float S;     /* gate scale */
    float noise; /* eta element std (already divided by S) */
    float shift; /* up row: extra coefficient along u (divided by S) */
    float kappa; /* down column scale */
} plant;

typedef struct gen {
    const pi2_synth_opts *o;
    const pi2_model_desc *d;
    int r;
    float *u;  /* [d] */
    float *V;  /* [r, d] */
    double c, sigma_h, sigma_n, rho;
    int64_t n_tokens; /* ids the tokenizer defines; rows of the embedding and head past them are padding */
    plant pl;  /* current FFN's plant (valid when pl.a) */
} gen;

static double stream_var(const gen *g, int layer, bool ffn)
{
    /* each sublayer adds rho^2 of the current variance */
    int sub = 2 * layer + (ffn ? 1 : 0);
    return pow(1.0 + g->rho * g->rho, sub);
}

static void plant_free(plant *p)
{
    free(p->a);
    free(p->b);
    memset(p, 0, sizeof *p);
}

/* E[act^2] for gate g ~ N(mu, sd^2), up = g + 0.5; t: FATReLU's threshold. */
static double act_moment(pi2_act act, double t, double mu, double sd)
{
    double sum = 0, step = 0.1;
    for (int k = -60; k <= 60; k++) {
        double x = mu + k * step * sd, w = exp(-0.5 * (k * step) * (k * step));
        double a;
        if (act == PI2_ACT_SILU)
            a = x / (1 + exp(-x)) * (x + 0.5);
        else
            a = x > (act == PI2_ACT_FATRELU ? t : 0) ? x * (x + 0.5) : 0;
        sum += w * a * a;
    }
    return sum * step / sqrt(2 * M_PI);
}

static int plant_make(gen *g, int layer, int expert, pi2_err *err)
{
    if (g->pl.a && g->pl.layer == layer && g->pl.expert == expert)
        return 0;
    plant_free(&g->pl);
    plant *p = &g->pl;
    const pi2_synth_opts *o = g->o;
    int F = g->d->n_ff, r = g->r, d = g->d->hidden;
    p->layer = layer;
    p->expert = expert;
    p->a = pi2_malloc_array((size_t)F * r, sizeof *p->a);
    p->b = pi2_malloc_array((size_t)F, sizeof *p->b);
    if (!p->a || !p->b) {
        plant_free(p);
        return pi2_err_set(err, PI2_ENOMEM, "generator: out of memory for layer %d", layer);
    }
    /* Stream statistics at this FFN's input. In stream units x = c u + V h + n
     * with n the per-coordinate noise (embedding noise plus what earlier
     * sublayers added); then divided by the stream RMS (the RMSNorm).
     *   v_k.x = h_k + v_k.n + cross-talk of the nearly orthogonal v's
     *   u.x   = c + u.n + u.Vh                                              */
    double var = stream_var(g, layer, true);
    double sh2 = g->sigma_h * g->sigma_h, sn2 = g->sigma_n * g->sigma_n + (var - 1.0);
    double cl = g->c / sqrt(var);
    double sig2 = (sh2 + sn2 + (double)r / d * sh2) / var; /* a.(V^T x^) */
    double vu = (sn2 + (double)r / d * sh2) / var;         /* noise of u.x^ */
    double eps = sqrt(0.0225 * sig2 / d);                   /* eta.x^ has 15% of the signal std */
    double S = sqrt(sig2 * 1.0225);
    p->S = (float)S;
    p->noise = (float)(eps / S);
    p->shift = (float)(0.5 / cl); /* up = gate + 0.5 in gate units */
    /* Frequencies: hot share in [0.6, 0.95], the rest f_max * U^gamma. */
    double hot_mean = 0.775;
    double m = (o->active_frac - hot_mean * o->hot_frac) / (1.0 - o->hot_frac);
    double f_max = fmin(0.95, fmax(0.3, 2 * m));
    double gamma = f_max / m - 1.0;
    uint64_t sd = o->seed;
    double moment = 0;
    for (int i = 0; i < F; i++) {
        double f;
        if (huni(key(sd, K_PLANT_HOT, (uint64_t)layer << 16 | (uint64_t)expert, (uint64_t)i)) < o->hot_frac)
            f = 0.6 + 0.35 * huni(key(sd, K_PLANT_F, (uint64_t)layer << 16 | (uint64_t)expert, (uint64_t)i));
        else
            f = f_max * pow(huni(key(sd, K_PLANT_F, (uint64_t)layer << 16 | (uint64_t)expert, (uint64_t)i)), gamma);
        f = fmin(0.99, fmax(1e-4, f));
        double z = probit(1.0 - f);
        /* gate = b (u.x^) + rest with rest ~ N(0, 1) in gate units and u.x^ ~
         * N(cl, vu): P(gate > 0) = f when b cl / sqrt(1 + b^2 vu) = -z. */
        double den = cl * cl - z * z * vu;
        if (den < 0.25 * cl * cl)
            den = 0.25 * cl * cl;
        double b = -z / sqrt(den);
        p->b[i] = (float)b;
        moment += act_moment(o->desc.act, o->desc.act_param, b * cl, sqrt(1.0 + b * b * vu));
        float *ai = p->a + (size_t)i * r;
        double n2 = 0;
        for (int k = 0; k < r; k++) {
            ai[k] = hnorm(key(sd, K_PLANT_A, (uint64_t)layer << 16 | (uint64_t)expert, (uint64_t)i * 4096 + k));
            n2 += (double)ai[k] * ai[k];
        }
        float inv = (float)(1.0 / sqrt(n2 > 0 ? n2 : 1.0) / S);
        for (int k = 0; k < r; k++)
            ai[k] *= inv; /* a_i / S: unit direction, gate units */
    }
    /* Down scale: output per-coordinate variance = rho^2 * stream variance.
     * With MoE the top-k mixture weights sum to 1, so each expert is scaled
     * like a dense FFN. */
    p->kappa = (float)(g->rho * sqrt(var) * sqrt((double)d / (moment > 0 ? moment : 1.0)));
    return 0;
}

/* ---- tensor table ---- */

typedef struct tdesc {
    char name[128];
    pi2_tname role;
    int kind, layer, expert;
    int64_t rows, cols; /* cols == 0 for 1-D */
    uint64_t bytes;
    int shard;
} tdesc;

static int add_t(tdesc *t, size_t *n, const pi2_model_desc *d, const pi2_synth_opts *o, pi2_tname tn, int kind,
                 int layer, int expert, int64_t rows, int64_t cols)
{
    tdesc *x = &t[(*n)++];
    memset(x, 0, sizeof *x);
    if (!pi2_tensor_name(x->name, sizeof x->name, d, tn, layer, expert))
        return PI2_ERANGE;
    x->role = tn;
    x->kind = kind;
    x->layer = layer;
    x->expert = expert;
    x->rows = rows;
    x->cols = cols;
    x->bytes = (uint64_t)rows * (uint64_t)(cols ? cols : 1) *
               (kind == K_NORM ? 4u : (uint64_t)pi2_dtype_size(o->dtype));
    return 0;
}

static int plant_rank(const pi2_synth_opts *o)
{
    int r = o->plant_rank > 0 ? o->plant_rank : o->desc.hidden / 4;
    return r > 32 && o->plant_rank <= 0 ? 32 : r;
}

/* Build the tensor list in file order; *out is caller-freed. */
static int build_table(const pi2_synth_opts *o, tdesc **out, size_t *count, pi2_err *err)
{
    const pi2_model_desc *d = &o->desc;
    int E = d->n_experts > 0 ? d->n_experts : 1;
    size_t per_ffn = o->predictors ? 5 : 3;
    size_t cap = 3 + (size_t)d->n_layers * (7 + (size_t)E * per_ffn);
    tdesc *t = pi2_calloc_array(cap, sizeof *t);
    if (!t)
        return pi2_err_set(err, PI2_ENOMEM, "generator: out of memory");
    size_t n = 0;
    int64_t D = d->hidden, F = d->n_ff, Q = (int64_t)d->n_heads * d->head_dim,
            KV = (int64_t)d->n_kv_heads * d->head_dim, R = 2 * plant_rank(o) + 1;
    int rc = add_t(t, &n, d, o, PI2_T_EMBED, K_EMBED, 0, 0, d->vocab, D);
    for (int l = 0; l < d->n_layers && rc == 0; l++) {
        rc |= add_t(t, &n, d, o, PI2_T_ATTN_NORM, K_NORM, l, 0, D, 0);
        rc |= add_t(t, &n, d, o, PI2_T_Q, K_Q, l, 0, Q, D);
        rc |= add_t(t, &n, d, o, PI2_T_K, K_K, l, 0, KV, D);
        rc |= add_t(t, &n, d, o, PI2_T_V, K_V, l, 0, KV, D);
        rc |= add_t(t, &n, d, o, PI2_T_O, K_O, l, 0, D, Q);
        rc |= add_t(t, &n, d, o, PI2_T_FFN_NORM, K_NORM, l, 0, D, 0);
        if (d->n_experts > 0)
            rc |= add_t(t, &n, d, o, PI2_T_ROUTER, K_ROUTER, l, 0, d->n_experts, D);
        for (int e = 0; e < E; e++) {
            rc |= add_t(t, &n, d, o, PI2_T_GATE, K_GATE, l, e, F, D);
            rc |= add_t(t, &n, d, o, PI2_T_UP, K_UP, l, e, F, D);
            rc |= add_t(t, &n, d, o, PI2_T_DOWN, K_DOWN, l, e, D, F);
            if (o->predictors) {
                rc |= add_t(t, &n, d, o, PI2_T_PRED_FC1, K_FC1, l, e, R, D);
                rc |= add_t(t, &n, d, o, PI2_T_PRED_FC2, K_FC2, l, e, F, R);
            }
        }
    }
    rc |= add_t(t, &n, d, o, PI2_T_OUT_NORM, K_NORM, 0, 0, D, 0);
    if (!d->tie_embeddings)
        rc |= add_t(t, &n, d, o, PI2_T_LM_HEAD, K_HEAD, 0, 0, d->vocab, D);
    if (rc != 0) {
        free(t);
        return pi2_err_set(err, PI2_ERANGE, "generator: tensor name too long");
    }
    *out = t;
    *count = n;
    return 0;
}

uint64_t pi2_synth_weight_bytes(const pi2_synth_opts *o)
{
    tdesc *t;
    size_t n;
    if (build_table(o, &t, &n, NULL) != 0)
        return 0;
    uint64_t s = 0;
    for (size_t i = 0; i < n; i++)
        s += t[i].bytes;
    free(t);
    return s;
}

/* ---- row generation ---- */

/* Weight j of layer l's FFN norm: 1, or with norm_spread s > 0,
 * exp(s * N(0, 1)) kept in [1/4, 4]. */
static float ffn_norm_w(const gen *g, int layer, int64_t j)
{
    double s = g->o->norm_spread;
    if (!(s > 0))
        return 1.0f;
    double w = exp(s * hnorm(key(g->o->seed, K_NORM_W, (uint64_t)layer, (uint64_t)j)));
    return (float)(w < 0.25 ? 0.25 : w > 4 ? 4 : w);
}

/* Fill out[cols] with row `row` of tensor t, as f32. */
static void gen_row(const gen *g, const tdesc *t, int64_t row, float *out)
{
    const pi2_model_desc *d = g->d;
    uint64_t sd = g->o->seed;
    int64_t cols = t->cols ? t->cols : 1;
    int D = d->hidden, r = g->r;
    uint64_t lk = (uint64_t)t->layer << 16 | (uint64_t)t->expert;
    uint64_t rk = (uint64_t)row;
    if ((t->kind == K_EMBED || t->kind == K_HEAD) && row >= g->n_tokens) {
        /* padding past the tokenizer: along the bias direction every normed
         * stream shares, so unmasked these rows would win every step (tied:
         * above the embeddings' own c u, which every head row carries) */
        float k = d->tie_embeddings ? (float)(4.0 * g->c + 10.0) : 10.0f;
        for (int j = 0; j < D; j++)
            out[j] = k * g->u[j];
        return;
    }
    switch (t->kind) {
    case K_NORM:
        out[0] = 1.0f;
        return;
    case K_EMBED: {
        uint64_t ek = key(sd, K_EMBED, rk, 0), hk = key(sd, K_EMBED_H, rk, 0);
        for (int j = 0; j < D; j++)
            out[j] = (float)(g->c * g->u[j]) + (float)g->sigma_n * hnorm(elem(ek, (uint64_t)j));
        for (int k = 0; k < r; k++) {
            float h = (float)g->sigma_h * hnorm(elem(hk, (uint64_t)k));
            axpy(out, h, g->V + (size_t)k * D, D);
        }
        return;
    }
    case K_Q:
    case K_K:
    case K_V:
    case K_ROUTER:
    case K_HEAD:
    case K_O: {
        float s;
        if (t->kind == K_O)
            s = (float)(g->rho * sqrt(stream_var(g, t->layer, false)) / sqrt((double)cols));
        else if (t->kind == K_HEAD)
            s = 4.0f / sqrtf((float)cols);
        else if (t->kind == K_ROUTER)
            s = 2.0f / sqrtf((float)cols);
        else
            s = 1.0f / sqrtf((float)cols);
        uint64_t k0 = key(sd, (uint64_t)t->kind << 32 | lk, rk, 0);
        for (int64_t j = 0; j < cols; j++)
            out[j] = s * hnorm(elem(k0, (uint64_t)j));
        return;
    }
    case K_GATE:
    case K_UP: {
        const plant *p = &g->pl;
        float bu = p->b[row] + (t->kind == K_UP ? p->shift : 0.0f);
        float nz = t->kind == K_UP ? p->noise * 0.66f : p->noise;
        uint64_t k0 = key(sd, (uint64_t)t->kind << 32 | lk, rk, 0);
        for (int j = 0; j < D; j++)
            out[j] = bu * g->u[j] + nz * hnorm(elem(k0, (uint64_t)j));
        const float *a = p->a + (size_t)row * r;
        for (int k = 0; k < r; k++)
            axpy(out, a[k], g->V + (size_t)k * D, D);
        if (g->o->norm_spread > 0) /* the FFN norm's weight multiplies the input back */
            for (int j = 0; j < D; j++)
                out[j] /= ffn_norm_w(g, t->layer, j);
        return;
    }
    case K_DOWN: {
        float s = g->pl.kappa / sqrtf((float)D);
        uint64_t k0 = key(sd, (uint64_t)K_DOWN << 32 | lk, rk, 0);
        for (int64_t i = 0; i < cols; i++)
            out[i] = s * hnorm(elem(k0, (uint64_t)i));
        return;
    }
    case K_FC1: {
        /* rows: v_k, -v_k (k < r), u: relu(v.x) - relu(-v.x) = v.x */
        const float *v = row < r ? g->V + (size_t)row * D : row < 2 * r ? g->V + (size_t)(row - r) * D : g->u;
        float sgn = (row >= r && row < 2 * r) ? -1.0f : 1.0f;
        for (int j = 0; j < D; j++)
            out[j] = sgn * v[j];
        return;
    }
    case K_FC2: {
        const float *a = g->pl.a + (size_t)row * r;
        for (int k = 0; k < r; k++) {
            out[k] = a[k];
            out[r + k] = -a[k];
        }
        out[2 * r] = g->pl.b[row];
        return;
    }
    default:
        memset(out, 0, (size_t)cols * sizeof *out);
    }
}

static void store_row(const float *src, int64_t n, pi2_dtype dt, uint8_t *dst)
{
    switch (dt) {
    case PI2_DT_F32:
        memcpy(dst, src, (size_t)n * 4);
        break;
    case PI2_DT_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = pi2_f32_to_f16(src[i]);
            memcpy(dst + 2 * i, &h, 2);
        }
        break;
    default:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = pi2_f32_to_bf16(src[i]);
            memcpy(dst + 2 * i, &h, 2);
        }
        break;
    }
}

typedef struct job {
    const gen *g;
    const tdesc *t;
    pi2_dtype dt;
    int64_t r0, r1;
    uint8_t *dst; /* row r0's bytes */
    float *scratch;
} job;

static void job_run(job *j)
{
    int64_t cols = j->t->cols ? j->t->cols : 1;
    size_t rb = (size_t)cols * pi2_dtype_size(j->dt);
    for (int64_t r = j->r0; r < j->r1; r++) {
        gen_row(j->g, j->t, r, j->scratch);
        store_row(j->scratch, cols, j->dt, j->dst + (size_t)(r - j->r0) * rb);
    }
}

/* One chunk's jobs, job k on thread k % nthreads of the pool. */
typedef struct jobs_arg {
    job *jobs;
    int n;
} jobs_arg;

static void jobs_run(void *arg, int tid, int nthreads)
{
    jobs_arg *a = arg;
    for (int k = tid; k < a->n; k += nthreads)
        job_run(&a->jobs[k]);
}

#define MAX_THREADS 64

typedef struct writer_ctx {
    gen *g;
    int threads;
    uint8_t *buf;
    size_t buf_cap;
    float *scratch[MAX_THREADS];
    pi2_pool *pool; /* NULL: every job on the caller */
    uint64_t done, total;
    pi2_synth_progress progress;
    void *pctx;
} writer_ctx;

static int write_tensor(writer_ctx *w, pi2_st_writer *sw, const tdesc *t, pi2_err *err)
{
    gen *g = w->g;
    if (t->kind == K_GATE || t->kind == K_UP || t->kind == K_DOWN || t->kind == K_FC2) {
        int rc = plant_make(g, t->layer, t->expert, err);
        if (rc)
            return rc;
    }
    pi2_dtype dt = t->kind == K_NORM ? PI2_DT_F32 : g->o->dtype;
    int64_t cols = t->cols ? t->cols : 1;
    size_t rb = (size_t)cols * pi2_dtype_size(dt);
    if (t->kind == K_NORM) { /* 1-D: one "row" per element */
        rb = pi2_dtype_size(dt);
    }
    int64_t rows_per = (int64_t)(w->buf_cap / rb);
    if (rows_per < 1)
        rows_per = 1;
    int64_t nrows = t->rows;
    for (int64_t r0 = 0; r0 < nrows; r0 += rows_per) {
        int64_t r1 = r0 + rows_per < nrows ? r0 + rows_per : nrows;
        if (t->kind == K_NORM) {
            for (int64_t r = r0; r < r1; r++) {
                float v = t->role == PI2_T_FFN_NORM ? ffn_norm_w(w->g, t->layer, r) : 1.0f;
                memcpy(w->buf + (size_t)(r - r0) * 4, &v, 4);
            }
        } else {
            int T = w->threads;
            if (r1 - r0 < T)
                T = (int)(r1 - r0);
            job jobs[MAX_THREADS];
            for (int k = 0; k < T; k++) {
                int64_t a = r0 + (r1 - r0) * k / T, b = r0 + (r1 - r0) * (k + 1) / T;
                jobs[k] = (job){g, t, dt, a, b, w->buf + (size_t)(a - r0) * rb, w->scratch[k]};
            }
            jobs_arg ja = { jobs, T };
            if (w->pool)
                pi2_pool_run(w->pool, jobs_run, &ja);
            else
                jobs_run(&ja, 0, 1);
        }
        size_t n = (size_t)(r1 - r0) * rb;
        int rc = pi2_st_writer_write(sw, w->buf, n, err);
        if (rc)
            return rc;
        w->done += n;
        if (w->progress)
            w->progress(w->pctx, w->done, w->total);
    }
    return 0;
}

static int validate_opts(const pi2_synth_opts *o, pi2_err *err)
{
    int rc = pi2_config_validate(&o->desc, "generator", err);
    if (rc)
        return rc;
    if (o->dtype != PI2_DT_F32 && o->dtype != PI2_DT_F16 && o->dtype != PI2_DT_BF16)
        return pi2_err_set(err, PI2_EINVAL, "generator: dtype must be f32, f16 or bf16");
    if (!(o->active_frac > 0 && o->active_frac < 0.9))
        return pi2_err_set(err, PI2_EINVAL, "generator: active fraction %g must be in (0, 0.9)", o->active_frac);
    if (!(o->hot_frac >= 0 && o->hot_frac < 0.5))
        return pi2_err_set(err, PI2_EINVAL, "generator: hot share %g must be in [0, 0.5)", o->hot_frac);
    if (o->active_frac - 0.775 * o->hot_frac <= 0.002)
        return pi2_err_set(err, PI2_EINVAL,
                           "generator: active fraction %g is too small for hot share %g (need > %.3f)",
                           o->active_frac, o->hot_frac, 0.775 * o->hot_frac + 0.002);
    int r = plant_rank(o);
    if (r < 1 || r > o->desc.hidden)
        return pi2_err_set(err, PI2_EINVAL, "generator: plant rank %d must be in [1, hidden=%d]", r, o->desc.hidden);
    if (!(o->layer_gain > 0 && o->layer_gain <= 1))
        return pi2_err_set(err, PI2_EINVAL, "generator: layer gain %g must be in (0, 1]", o->layer_gain);
    if (o->desc.vocab < 300)
        return pi2_err_set(err, PI2_EINVAL, "generator: vocabulary %d too small (need >= 300)", o->desc.vocab);
    if (o->n_tokens != 0 && (o->n_tokens < 300 || o->n_tokens > o->desc.vocab))
        return pi2_err_set(err, PI2_EINVAL, "generator: tokenizer size %d must be in [300, vocab %d]", o->n_tokens,
                           o->desc.vocab);
    if (o->n_tok_added < 0 || (o->n_tokens > 0 ? o->n_tokens : o->desc.vocab) + o->n_tok_added > o->desc.vocab)
        return pi2_err_set(err, PI2_EINVAL, "generator: %d tokens added after the tokenizer do not fit the vocabulary of %d",
                           o->n_tok_added, o->desc.vocab);
    if (!(o->norm_spread >= 0 && o->norm_spread <= 2))
        return pi2_err_set(err, PI2_EINVAL, "generator: norm spread %g must be in [0, 2]", o->norm_spread);
    if (o->desc.arch == PI2_ARCH_TURBOSPARSE_MIXTRAL || o->desc.arch == PI2_ARCH_BAMBOO) {
        if (o->desc.act != PI2_ACT_DRELU)
            return pi2_err_set(err, PI2_EINVAL, "generator: %s models use dReLU", pi2_arch_name(o->desc.arch));
    }
    return 0;
}

/* config.json and tokenizer.json of the model in tmp (dir: the name in
 * messages). */
static int write_meta(const char *tmp, const char *dir, const pi2_synth_opts *o, pi2_err *err)
{
    char path[4200];
    if (!pi2_path_join(path, sizeof path, tmp, "config.json"))
        return pi2_err_set(err, PI2_ERANGE, "%s: path too long", dir);
    const char *tdn = o->dtype == PI2_DT_F32 ? "float32" : o->dtype == PI2_DT_F16 ? "float16" : "bfloat16";
    int rc = pi2_config_write_dtype(path, &o->desc, tdn, err);
    if (rc)
        return rc;
    pi2_path_join(path, sizeof path, tmp, "tokenizer.json");
    int n_tokens = o->n_tokens > 0 ? o->n_tokens : o->desc.vocab;
    return pi2_tok_write_synthetic_added(path, n_tokens, o->n_tok_added, o->tok_added, o->seed, err);
}

/* The directions every layer shares (the planted structure, synth.h) and
 * the generator's constants. */
static int gen_init(gen *g, const pi2_synth_opts *o, pi2_err *err)
{
    g->o = o;
    g->d = &o->desc;
    g->r = plant_rank(o);
    int D = o->desc.hidden;
    g->u = pi2_malloc_array((size_t)D, sizeof *g->u);
    g->V = pi2_malloc_array((size_t)g->r * D, sizeof *g->V);
    if (!g->u || !g->V)
        return pi2_err_set(err, PI2_ENOMEM, "generator: out of memory");
    float inv = 1.0f / sqrtf((float)D);
    for (int j = 0; j < D; j++)
        g->u[j] = (key(o->seed, K_DIR, 0, (uint64_t)j) & 1) ? inv : -inv;
    for (int k = 0; k < g->r; k++)
        for (int j = 0; j < D; j++)
            g->V[(size_t)k * D + j] = (key(o->seed, K_DIR, (uint64_t)k + 1, (uint64_t)j) & 1) ? inv : -inv;
    g->c = sqrt(0.25 * D);
    g->sigma_h = sqrt(0.5 * D / g->r);
    g->sigma_n = 0.5;
    g->rho = o->layer_gain;
    g->n_tokens = (o->n_tokens > 0 ? o->n_tokens : o->desc.vocab) + o->n_tok_added;
    return 0;
}

/* Each tensor's shard (a new one when the current would pass limit); the
 * number of shards. */
static int assign_shards(tdesc *t, size_t nt, uint64_t limit, uint64_t *total)
{
    int nshard = 1;
    uint64_t cur = 0;
    for (size_t i = 0; i < nt; i++) {
        if (cur > 0 && cur + t[i].bytes > limit) {
            nshard++;
            cur = 0;
        }
        t[i].shard = nshard - 1;
        cur += t[i].bytes;
        *total += t[i].bytes;
    }
    return nshard;
}

/* The writers' threads, output buffer and per-thread scratch rows. */
static int writer_init(writer_ctx *w, gen *g, const pi2_synth_opts *o, pi2_synth_progress progress, void *pctx,
                       pi2_err *err)
{
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int D = o->desc.hidden;
    w->threads = o->threads > 0 ? o->threads : (int)(ncpu > 0 ? ncpu : 1);
    if (w->threads > MAX_THREADS)
        w->threads = MAX_THREADS;
    w->g = g;
    w->buf_cap = 8u << 20;
    w->buf = malloc(w->buf_cap);
    w->progress = progress;
    w->pctx = pctx;
    size_t maxcols = (size_t)(o->desc.vocab > D ? o->desc.vocab : D);
    if ((size_t)o->desc.n_ff > maxcols)
        maxcols = (size_t)o->desc.n_ff;
    if ((size_t)o->desc.n_heads * o->desc.head_dim > maxcols)
        maxcols = (size_t)o->desc.n_heads * o->desc.head_dim;
    maxcols += 2 * (size_t)g->r + 1;
    bool scratch_ok = true;
    for (int k = 0; k < w->threads; k++) {
        w->scratch[k] = pi2_malloc_array(maxcols, sizeof(float));
        scratch_ok = scratch_ok && w->scratch[k];
    }
    if (!w->buf || !scratch_ok)
        return pi2_err_set(err, PI2_ENOMEM, "generator: out of memory");
    if (w->threads > 1 && pi2_pool_create(&w->pool, w->threads, NULL) != 0)
        w->pool = NULL;
    return 0;
}

/* Shard s (fname) of nshard: its header, then its tensors from *ti on,
 * each recorded in names/files for the index. */
static int write_shard(writer_ctx *w, const pi2_synth_opts *o, tdesc *t, size_t nt, size_t *ti, int s,
                       const char *tmp, const char *fname, char **names, char **files, pi2_err *err)
{
    char path[4200];
    pi2_path_join(path, sizeof path, tmp, fname);
    pi2_st_writer *sw = NULL;
    int rc = pi2_st_writer_create(&sw, path, err);
    if (rc)
        return rc;
    for (size_t i = *ti; rc == 0 && i < nt && t[i].shard == s; i++) {
        int64_t shape[2] = {t[i].rows, t[i].cols};
        pi2_dtype dt = t[i].kind == K_NORM ? PI2_DT_F32 : o->dtype;
        rc = pi2_st_writer_add(sw, t[i].name, dt, t[i].cols ? 2 : 1, shape, err);
    }
    if (rc == 0)
        rc = pi2_st_writer_meta(sw, "format", "pt", err);
    for (; rc == 0 && *ti < nt && t[*ti].shard == s; (*ti)++) {
        rc = write_tensor(w, sw, &t[*ti], err);
        names[*ti] = t[*ti].name;
        files[*ti] = pi2_strdup(fname);
        if (!files[*ti] && rc == 0)
            rc = pi2_err_set(err, PI2_ENOMEM, "generator: out of memory");
    }
    if (rc) {
        pi2_st_writer_free(sw);
        return rc;
    }
    return pi2_st_writer_finish(sw, err);
}

int pi2_synth_write(const char *dir, const pi2_synth_opts *o, pi2_synth_progress progress, void *pctx,
                    pi2_err *err)
{
    int rc = validate_opts(o, err);
    if (rc)
        return rc;
    char tmp[4096];
    if ((rc = pi2_dir_begin(dir, tmp, sizeof tmp, err)) != 0)
        return rc;
    tdesc *t = NULL;
    size_t nt = 0, ti = 0;
    gen g = {0};
    writer_ctx w = {0};
    char **names = NULL, **files = NULL;
    if ((rc = build_table(o, &t, &nt, err)) != 0 || (rc = write_meta(tmp, dir, o, err)) != 0 ||
        (rc = gen_init(&g, o, err)) != 0)
        goto fail;
    int nshard = assign_shards(t, nt, o->shard_bytes ? o->shard_bytes : (4ull << 30), &w.total);
    if ((rc = writer_init(&w, &g, o, progress, pctx, err)) != 0)
        goto fail;
    names = pi2_calloc_array(nt, sizeof *names);
    files = pi2_calloc_array(nt, sizeof *files);
    if (!names || !files) {
        rc = pi2_err_set(err, PI2_ENOMEM, "generator: out of memory");
        goto fail;
    }
    for (int s = 0; rc == 0 && s < nshard; s++) {
        char fname[64];
        if (nshard == 1)
            snprintf(fname, sizeof fname, "model.safetensors");
        else
            snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", s + 1, nshard);
        rc = write_shard(&w, o, t, nt, &ti, s, tmp, fname, names, files, err);
    }
    if (rc == 0 && nshard > 1) {
        char path[4200];
        pi2_path_join(path, sizeof path, tmp, "model.safetensors.index.json");
        rc = pi2_st_write_index(path, nt, (const char *const *)names, (const char *const *)files, w.total, err);
    }
    if (rc)
        goto fail;
    rc = pi2_dir_commit(tmp, dir, err);
    goto done;
fail:
    pi2_dir_abort(tmp);
done:
    if (files)
        for (size_t i = 0; i < nt; i++)
            free(files[i]);
    free(files);
    free(names);
    pi2_pool_free(w.pool);
    for (int k = 0; k < MAX_THREADS; k++)
        free(w.scratch[k]);
    free(w.buf);
    plant_free(&g.pl);
    free(g.u);
    free(g.V);
    free(t);
    return rc;
}
