/* Batched fp32 calibration forward (see calib.h).
 *
 * Why it is shaped this way: a 7B model does not fit in memory as f32, and
 * converting BF16 weights costs about as much per byte as reading them, so
 * the only way to be fast is to convert each matrix once per call and
 * multiply it against every row of the batch with sgemm. Everything between
 * the matmuls (norms, RoPE, softmax, activations) is cheap next to them and
 * mirrors runtime/reference.c line for line where rounding matters:
 *   - RMSNorm: x * (1/sqrt(mean(x^2) + eps)) in double, rounded to float,
 *     then * weight;
 *   - RoPE: the inverse frequencies of pi2_rope_inv_freq (the config's
 *     rope_scaling; dynamic NTK's per position), angle (float)pos *
 *     inv_freq[i] in float32, cosf/sinf (tabled per position, the same
 *     values), rotate_half pairing i with i + hd/2;
 *   - activations: SiLU in double rounded to float, then * up; ReGLU,
 *     FATReLU and dReLU with the reference's comparisons;
 *   - MoE: router logits with double accumulation rounded to float, top-k by
 *     repeated argmax with strict '>' (ties -> lower index), weights =
 *     softmax over the selected logits in double.
 * Attention runs per sequence and head as two sgemms over the sequence's
 * cache (scores for the whole block, then probabilities times values), with
 * the causal mask applied between them. */
#include "convert/calib.h"
#include "runtime/mathops.h"
#include "runtime/moe.h"

#include "formats/pool.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_THREADS 64

struct pi2_calib_state {
    const pi2_ref_model *m;
    const pi2_model_desc *d;
    pi2_calib_opts o;
    int n_seq, max_len, len;
    int D, hd, qd, kvd, ff, n_exp, k_used;
    float *k_cache, *v_cache; /* (layers, n_seq, max_len, kv*hd) */
    float *rope_cos, *rope_sin; /* (max_len, hd/2) */
    float *norm;              /* (d) the current norm weight */
    float *w;                 /* weight buffer: the largest layer matrix or one head block */
    size_t w_cap;             /* floats */
    int head_rows;            /* head rows per block */
    float *last;              /* (n_seq, vocab) last-position logits */
    bool have_last;
    /* per-call scratch, grown on demand */
    size_t rows_cap;       /* rows the row buffers hold */
    float *x, *xb;         /* (rows, d) residual stream; normed block input */
    float *q, *att;        /* (rows, heads*hd) */
    float *kn, *vn;        /* (rows, kv*hd) new keys and values */
    float *g, *u;          /* (rows, max(ff, head_rows)): activations or head block; (rows, ff) */
    float *xe, *ye;        /* (rows, d) MoE: gathered inputs, expert outputs */
    float *x0, *re;        /* (rows, d) MoE: the residual before the layer's experts; its gathered rows */
    int32_t *rows;         /* (rows) dense: identity; MoE: one expert's rows */
    int *route;            /* (rows, k) MoE expert ids */
    double *route_w;       /* (rows, k) MoE mixing weights */
    double *ew;            /* (rows) one expert's mixing weight per row */
    double *lse_m, *lse_s; /* (rows) NLL: running max and sum of exp */
    double *tgt;           /* (rows) NLL: the target's logit */
    float *scores;         /* (scores_cap) attention scores of one (sequence, head) */
    size_t scores_cap;
    pi2_pool *pool;        /* compute threads, started on first use; NULL: the caller alone */
    bool pool_tried;
};

/* ---- threads: a static partition of [0, n) over up to nt threads ---- */

typedef void (*par_fn)(void *ctx, int tid, int64_t i0, int64_t i1);

typedef struct par_job {
    par_fn fn;
    void *ctx;
    int nt;
    int64_t n;
} par_job;

static void par_main(void *p, int tid, int nthreads)
{
    par_job *j = p;
    for (int t = tid; t < j->nt; t += nthreads)
        j->fn(j->ctx, t, j->n * t / j->nt, j->n * (t + 1) / j->nt);
}

static int n_threads(const pi2_calib_state *s);

/* Run fn over [0, n) as ranges t = 0 .. nt-1 with nt at most the state's
 * thread count, each range at least min_chunk long, on the state's pool.
 * Range t is [n*t/nt, n*(t+1)/nt) whichever thread runs it; without a pool
 * (threads could not be started) the caller runs them all. */
static void par_for(pi2_calib_state *s, int64_t n, int64_t min_chunk, par_fn fn, void *ctx)
{
    int nt = n_threads(s);
    if (min_chunk < 1)
        min_chunk = 1;
    if ((int64_t)nt > n / min_chunk)
        nt = (int)(n / min_chunk);
    if (nt <= 1) {
        if (n > 0)
            fn(ctx, 0, 0, n);
        return;
    }
    if (!s->pool_tried) {
        s->pool_tried = true;
        if (pi2_pool_create(&s->pool, n_threads(s), NULL) != 0)
            s->pool = NULL;
    }
    par_job j = { fn, ctx, nt, n };
    if (s->pool)
        pi2_pool_run(s->pool, par_main, &j);
    else
        par_main(&j, 0, 1);
}

static int n_threads(const pi2_calib_state *s)
{
    if (s->o.threads > 0)
        return s->o.threads < MAX_THREADS ? s->o.threads : MAX_THREADS;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : (int)n;
}

/* ---- weights ---- */

/* Rows [r0, r0 + n) of a 2-D tensor as a tensor view of its own. */
static pi2_st_tensor row_slice(const pi2_st_tensor *t, int64_t r0, int64_t n)
{
    pi2_st_tensor v = *t;
    size_t cols = (size_t)t->shape[1], es = pi2_dtype_size(t->dtype);
    v.shape[0] = n;
    v.nelem = (size_t)n * cols;
    v.data = (const uint8_t *)t->data + (size_t)r0 * cols * es;
    v.nbytes = v.nelem * es;
    return v;
}

typedef struct conv_job {
    const pi2_st_tensor *t;
    int64_t r0; /* first row of the whole job */
    float *out; /* row r0 goes to out[0] */
    int rc[MAX_THREADS];
    pi2_err err[MAX_THREADS];
} conv_job;

/* BF16 -> f32 is a 16-bit shift, but pi2_st_to_f32 goes element by element
 * through a dtype switch (~3.4 ns per element here against ~0.5 for this
 * loop, which the compiler vectorises): on a BF16 7B model that is 20 s per
 * forward call against 3. Same values: pi2_bf16_to_f32 is what both use. */
static void bf16_to_f32(const uint8_t *restrict p, float *restrict out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint16_t b;
        memcpy(&b, p + 2 * i, 2); /* unaligned-safe load */
        out[i] = pi2_bf16_to_f32(b);
    }
}

static void conv_part(void *ctx, int tid, int64_t i0, int64_t i1)
{
    conv_job *j = ctx;
    pi2_st_tensor v = row_slice(j->t, j->r0 + i0, i1 - i0);
    float *out = j->out + (size_t)i0 * (size_t)j->t->shape[1];
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (v.dtype == PI2_DT_BF16) {
        bf16_to_f32(v.data, out, v.nelem);
        j->rc[tid] = 0;
        return;
    }
#endif
    j->rc[tid] = pi2_st_to_f32(&v, out, v.nelem, &j->err[tid]);
}

/* out (n, cols) = rows [r0, r0 + n) of the 2-D tensor t as f32, converted on
 * all threads. */
static int convert_rows(pi2_calib_state *s, const pi2_st_tensor *t, int64_t r0, int64_t n, float *out,
                        pi2_err *err)
{
    conv_job *j = calloc(1, sizeof *j);
    if (!j)
        return pi2_err_set(err, PI2_ENOMEM, "calib: out of memory");
    j->t = t;
    j->r0 = r0;
    j->out = out;
    int64_t min_rows = (1 << 18) / (t->shape[1] > 0 ? t->shape[1] : 1) + 1; /* ~1 MiB of f32 per thread */
    par_for(s, n, min_rows, conv_part, j);
    int rc = 0;
    for (int t2 = 0; t2 < MAX_THREADS && !rc; t2++)
        if ((rc = j->rc[t2]))
            pi2_err_set(err, rc, "%s", j->err[t2].msg);
    free(j);
    return rc;
}

/* The f32 matrix of part t (layer, expert) in s->w, transformed by the
 * weight callback; its mapped pages are released. */
static int load_matrix(pi2_calib_state *s, pi2_tname t, int layer, int expert, float **out, pi2_err *err)
{
    const pi2_st_tensor *w = pi2_ref_weight(s->m, t, layer, expert);
    if (!w || w->ndim != 2 || w->nelem > s->w_cap)
        return pi2_err_set(err, PI2_EINVAL, "calib: no matrix for part %d layer %d expert %d", (int)t, layer,
                           expert);
    int rc = convert_rows(s, w, 0, w->shape[0], s->w, err);
    pi2_st_release(w);
    if (rc)
        return rc;
    if (s->o.weight)
        s->o.weight(s->o.weight_ctx, t, layer, expert, s->w, w->shape[0], w->shape[1]);
    *out = s->w;
    return 0;
}

/* The input hook, when set: matrix t of (layer, expert) multiplies the n
 * rows `in` of `cols` values (batch rows `rows`, NULL: in order). */
static void see_input(const pi2_calib_state *s, pi2_tname t, int layer, int expert, int n, const int32_t *rows,
                      const float *in, int64_t cols)
{
    if (s->o.input)
        s->o.input(s->o.input_ctx, t, layer, expert, n, rows, in, cols);
}

/* A norm weight (d) into s->norm. */
static int load_norm(pi2_calib_state *s, pi2_tname t, int layer, pi2_err *err)
{
    const pi2_st_tensor *w = pi2_ref_weight(s->m, t, layer, 0);
    if (!w)
        return pi2_err_set(err, PI2_EINVAL, "calib: no norm for part %d layer %d", (int)t, layer);
    return pi2_st_to_f32(w, s->norm, (size_t)s->D, err);
}

/* ---- row kernels ---- */

/* In-place RoPE on n_heads vectors of hd floats at position pos. */
static void rope_row(const pi2_calib_state *s, float *v, int n_heads, int pos)
{
    size_t half = (size_t)s->hd / 2;
    pi2_op_rope(v, n_heads, s->hd, s->rope_cos + (size_t)pos * half, s->rope_sin + (size_t)pos * half);
}

typedef struct act_job {
    pi2_act act;
    float t;        /* FATReLU's gate threshold */
    float *g;       /* (n, ff): gate in, activations out */
    const float *u; /* (n, ff) */
    int ff;
} act_job;

static void act_part(void *ctx, int tid, int64_t i0, int64_t i1)
{
    (void)tid;
    const act_job *j = ctx;
    for (int64_t r = i0; r < i1; r++) {
        float *g = j->g + (size_t)r * (size_t)j->ff;
        const float *u = j->u + (size_t)r * (size_t)j->ff;
        pi2_op_act_rows_exact(j->act, g, u, j->ff, j->t); /* the reference's */
    }
}

/* C (m, n) = alpha A (m, k) B (n, k)^T + beta C, row-major, with leading
 * dimensions. The one shape every projection uses. */
static void gemm_nt(int m, int n, int k, float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                    float *C, int ldc)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* ---- state ---- */

static void free_scratch(pi2_calib_state *s)
{
    free(s->x);
    free(s->xb);
    free(s->q);
    free(s->att);
    free(s->kn);
    free(s->vn);
    free(s->g);
    free(s->u);
    free(s->xe);
    free(s->ye);
    free(s->x0);
    free(s->re);
    free(s->rows);
    free(s->route);
    free(s->route_w);
    free(s->ew);
    free(s->lse_m);
    free(s->lse_s);
    free(s->tgt);
    s->x = s->xb = s->q = s->att = s->kn = s->vn = s->g = s->u = s->xe = s->ye = s->x0 = s->re = NULL;
    s->rows = NULL;
    s->route = NULL;
    s->route_w = s->ew = s->lse_m = s->lse_s = s->tgt = NULL;
    s->rows_cap = 0;
}

/* Row buffers for n rows and attention scores for `sc` floats. All or
 * nothing: on failure the old buffers are gone but the state is consistent
 * (rows_cap 0), and the KV cache is untouched. */
static int ensure_scratch(pi2_calib_state *s, size_t n, size_t sc, pi2_err *err)
{
    if (sc > s->scores_cap) {
        float *p = pi2_malloc_array(sc, sizeof(float));
        if (!p)
            return pi2_err_set(err, PI2_ENOMEM, "calib: out of memory for %zu attention scores", sc);
        free(s->scores);
        s->scores = p;
        s->scores_cap = sc;
    }
    if (n <= s->rows_cap)
        return 0;
    free_scratch(s);
    size_t D = (size_t)s->D, k = s->k_used > 0 ? (size_t)s->k_used : 1;
    bool moe = pi2_desc_is_moe(s->d);
    s->x = pi2_malloc_array(n, D * sizeof(float));
    s->xb = pi2_malloc_array(n, D * sizeof(float));
    s->q = pi2_malloc_array(n, (size_t)s->qd * sizeof(float));
    s->att = pi2_malloc_array(n, (size_t)s->qd * sizeof(float));
    s->kn = pi2_malloc_array(n, (size_t)s->kvd * sizeof(float));
    s->vn = pi2_malloc_array(n, (size_t)s->kvd * sizeof(float));
    size_t gcols = (size_t)(s->head_rows > s->ff ? s->head_rows : s->ff);
    s->g = pi2_malloc_array(n, gcols * sizeof(float));
    s->u = pi2_malloc_array(n, (size_t)s->ff * sizeof(float));
    s->rows = pi2_malloc_array(n, sizeof(int32_t));
    s->lse_m = pi2_malloc_array(n, sizeof(double));
    s->lse_s = pi2_malloc_array(n, sizeof(double));
    s->tgt = pi2_malloc_array(n, sizeof(double));
    bool ok = s->x && s->xb && s->q && s->att && s->kn && s->vn && s->g && s->u && s->rows && s->lse_m &&
              s->lse_s && s->tgt;
    if (ok && moe) {
        s->xe = pi2_malloc_array(n, D * sizeof(float));
        s->ye = pi2_malloc_array(n, D * sizeof(float));
        s->x0 = pi2_malloc_array(n, D * sizeof(float));
        s->re = pi2_malloc_array(n, D * sizeof(float));
        s->route = pi2_malloc_array(n, k * sizeof(int));
        s->route_w = pi2_malloc_array(n, k * sizeof(double));
        s->ew = pi2_malloc_array(n, sizeof(double));
        ok = s->xe && s->ye && s->x0 && s->re && s->route && s->route_w && s->ew;
    }
    if (!ok) {
        free_scratch(s);
        return pi2_err_set(err, PI2_ENOMEM, "calib: out of memory for the scratch of %zu rows", n);
    }
    s->rows_cap = n;
    return 0;
}

static pi2_calib_opts default_opts(void) { return (pi2_calib_opts){ 0 }; }

void pi2_calib_set_opts(pi2_calib_state *s, const pi2_calib_opts *o)
{
    if (s)
        s->o = o ? *o : default_opts();
}

int pi2_calib_state_create(pi2_calib_state **out, const pi2_ref_model *m, int n_seq, int max_len,
                           const pi2_calib_opts *o, pi2_err *err)
{
    if (!out || !m)
        return pi2_err_set(err, PI2_EINVAL, "calib: NULL argument");
    *out = NULL;
    const pi2_model_desc *d = pi2_ref_desc(m);
    if (n_seq < 1)
        return pi2_err_set(err, PI2_EINVAL, "calib: n_seq %d must be at least 1", n_seq);
    if (max_len < 1 || max_len > pi2_desc_max_ctx(d))
        return pi2_err_set(err, PI2_ERANGE, "calib: max_len %d out of range [1, %d] (the model's positions)",
                           max_len, pi2_desc_max_ctx(d));
    if ((int64_t)n_seq * max_len > INT32_MAX)
        return pi2_err_set(err, PI2_ERANGE, "calib: %d sequences x %d positions is too many rows", n_seq, max_len);
    size_t kvd = (size_t)d->n_kv_heads * (size_t)d->head_dim, cache;
    if (!pi2_mul_size((size_t)d->n_layers * (size_t)n_seq, (size_t)max_len, &cache) ||
        !pi2_mul_size(cache, kvd, &cache) || !pi2_mul_size(cache, sizeof(float), &cache))
        return pi2_err_set(err, PI2_ERANGE, "calib: KV cache for %d x %d positions overflows", n_seq, max_len);

    pi2_calib_state *s = calloc(1, sizeof *s);
    if (!s)
        return pi2_err_set(err, PI2_ENOMEM, "calib: out of memory");
    s->m = m;
    s->d = d;
    s->o = o ? *o : default_opts();
    s->n_seq = n_seq;
    s->max_len = max_len;
    s->D = d->hidden;
    s->hd = d->head_dim;
    s->qd = d->n_heads * d->head_dim;
    s->kvd = (int)kvd;
    s->ff = d->n_ff;
    s->n_exp = pi2_desc_is_moe(d) ? d->n_experts : 1;
    s->k_used = pi2_desc_is_moe(d) ? d->n_experts_used : 0;

    /* The weight buffer holds the largest layer matrix; the head is
     * converted in blocks of as many rows as fit (at least 64 KiB of them). */
    size_t D = (size_t)s->D, cap = D * (size_t)s->ff;
    size_t parts[] = { (size_t)s->qd * D, kvd * D, (size_t)s->n_exp * D, 16384 };
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++)
        cap = parts[i] > cap ? parts[i] : cap;
    size_t hr = cap / D;
    s->head_rows = hr > (size_t)d->vocab ? d->vocab : hr < 1 ? 1 : (int)hr;
    s->w_cap = cap > (size_t)s->head_rows * D ? cap : (size_t)s->head_rows * D;

    size_t half = (size_t)s->hd / 2;
    s->k_cache = malloc(cache);
    s->v_cache = malloc(cache);
    s->w = pi2_malloc_array(s->w_cap, sizeof(float));
    s->norm = pi2_malloc_array(D, sizeof(float));
    s->last = pi2_malloc_array((size_t)n_seq, (size_t)d->vocab * sizeof(float));
    s->rope_cos = pi2_malloc_array((size_t)max_len, half * sizeof(float));
    s->rope_sin = pi2_malloc_array((size_t)max_len, half * sizeof(float));
    float *inv0 = pi2_malloc_array(half, 2 * sizeof(float)), *inv = inv0 ? inv0 + half : NULL;
    if ((cache && (!s->k_cache || !s->v_cache)) || !s->w || !s->norm || !s->last || !s->rope_cos ||
        !s->rope_sin || !inv0) {
        free(inv0);
        pi2_calib_state_free(s);
        return pi2_err_set(err, PI2_ENOMEM, "calib: out of memory for %d x %d positions (KV cache %zu MiB)", n_seq,
                           max_len, 2 * cache >> 20);
    }
    /* As the reference: the inverse frequencies of the config's RoPE
     * (pi2_rope_inv_freq; dynamic NTK's depend on the position) and
     * angle = pos * inv_freq, all float32. */
    pi2_rope_inv_freq(d, 0, inv0);
    for (int p = 0; p < max_len; p++) {
        const float *f = inv0;
        if (pi2_rope_varies(d, p)) {
            pi2_rope_inv_freq(d, p, inv);
            f = inv;
        }
        for (size_t i = 0; i < half; i++) {
            float angle = (float)p * f[i];
            s->rope_cos[(size_t)p * half + i] = cosf(angle);
            s->rope_sin[(size_t)p * half + i] = sinf(angle);
        }
    }
    free(inv0);
    *out = s;
    return 0;
}

void pi2_calib_state_free(pi2_calib_state *s)
{
    if (!s)
        return;
    free_scratch(s);
    free(s->scores);
    free(s->k_cache);
    free(s->v_cache);
    free(s->w);
    free(s->norm);
    free(s->last);
    free(s->rope_cos);
    free(s->rope_sin);
    pi2_pool_free(s->pool);
    free(s);
}

void pi2_calib_reset(pi2_calib_state *s)
{
    if (s) {
        s->len = 0;
        s->have_last = false;
    }
}

int pi2_calib_len(const pi2_calib_state *s) { return s ? s->len : 0; }
int pi2_calib_n_seq(const pi2_calib_state *s) { return s ? s->n_seq : 0; }
int pi2_calib_max_len(const pi2_calib_state *s) { return s ? s->max_len : 0; }
const float *pi2_calib_logits(const pi2_calib_state *s) { return s && s->have_last ? s->last : NULL; }

/* ---- forward ---- */

/* Self-attention of layer l over all rows: s->xb (normed input) -> x += o(att). */
static int attention(pi2_calib_state *s, int l, int n_new, pi2_err *err)
{
    const pi2_model_desc *d = s->d;
    int N = s->n_seq * n_new, D = s->D, hd = s->hd, qd = s->qd, kvd = s->kvd;
    int nh = d->n_heads, nkv = d->n_kv_heads, group = nh / nkv, T = s->len + n_new;
    float *w;
    int rc;
    if ((rc = load_matrix(s, PI2_T_Q, l, 0, &w, err)))
        return rc;
    see_input(s, PI2_T_Q, l, 0, N, NULL, s->xb, D);
    gemm_nt(N, qd, D, 1.0f, s->xb, D, w, D, 0.0f, s->q, qd); /* (rows, heads*hd) */
    if ((rc = load_matrix(s, PI2_T_K, l, 0, &w, err)))
        return rc;
    see_input(s, PI2_T_K, l, 0, N, NULL, s->xb, D);
    gemm_nt(N, kvd, D, 1.0f, s->xb, D, w, D, 0.0f, s->kn, kvd); /* (rows, kv*hd) */
    if ((rc = load_matrix(s, PI2_T_V, l, 0, &w, err)))
        return rc;
    see_input(s, PI2_T_V, l, 0, N, NULL, s->xb, D);
    gemm_nt(N, kvd, D, 1.0f, s->xb, D, w, D, 0.0f, s->vn, kvd); /* (rows, kv*hd) */

    size_t seq_stride = (size_t)s->max_len * (size_t)kvd;
    float *kc = s->k_cache + (size_t)l * (size_t)s->n_seq * seq_stride; /* (n_seq, max_len, kv*hd) */
    float *vc = s->v_cache + (size_t)l * (size_t)s->n_seq * seq_stride;
    for (int r = 0; r < N; r++) {
        int sq = r / n_new, pos = s->len + r % n_new;
        rope_row(s, s->q + (size_t)r * qd, nh, pos);
        rope_row(s, s->kn + (size_t)r * kvd, nkv, pos);
        memcpy(kc + (size_t)sq * seq_stride + (size_t)pos * kvd, s->kn + (size_t)r * kvd, sizeof(float) * kvd);
        memcpy(vc + (size_t)sq * seq_stride + (size_t)pos * kvd, s->vn + (size_t)r * kvd, sizeof(float) * kvd);
    }

    float scale = (float)(1.0 / sqrt((double)hd));
    float *S = s->scores; /* (n_new, T) */
    for (int sq = 0; sq < s->n_seq; sq++) {
        const float *ks = kc + (size_t)sq * seq_stride, *vs = vc + (size_t)sq * seq_stride; /* (T, kv*hd) */
        for (int h = 0; h < nh; h++) {
            int kh = h / group; /* GQA: kv head shared by `group` query heads */
            const float *qh = s->q + (size_t)sq * n_new * qd + (size_t)h * hd; /* (n_new, hd), ld heads*hd */
            gemm_nt(n_new, T, hd, scale, qh, qd, ks + (size_t)kh * hd, kvd, 0.0f, S, T);
            for (int i = 0; i < n_new; i++) {
                float *row = S + (size_t)i * T;
                int valid = s->len + i + 1; /* causal: positions 0..len+i */
                float mx = row[0];
                for (int t = 1; t < valid; t++)
                    mx = row[t] > mx ? row[t] : mx;
                double sum = 0.0;
                for (int t = 0; t < valid; t++) {
                    row[t] = expf(row[t] - mx);
                    sum += row[t];
                }
                float inv = (float)(1.0 / sum);
                for (int t = 0; t < valid; t++)
                    row[t] *= inv;
                for (int t = valid; t < T; t++)
                    row[t] = 0.0f;
            }
            float *oh = s->att + (size_t)sq * n_new * qd + (size_t)h * hd; /* (n_new, hd), ld heads*hd */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n_new, hd, T, 1.0f, S, T, vs + (size_t)kh * hd,
                        kvd, 0.0f, oh, qd);
        }
    }
    if ((rc = load_matrix(s, PI2_T_O, l, 0, &w, err)))
        return rc;
    see_input(s, PI2_T_O, l, 0, N, NULL, s->att, qd);
    gemm_nt(N, D, qd, 1.0f, s->att, qd, w, qd, 1.0f, s->x, D); /* x += att o^T */
    return 0;
}

/* One FFN (dense, or expert e) over n rows X (n, d), the norm of the
 * residual rows R: s->g (n, ff) gets the activations; then out (n, d) =
 * beta * out + A down^T. */
static int ffn_rows(pi2_calib_state *s, int l, int e, int n, const int32_t *rows, const float *X, const float *R,
                    float *out, float beta, pi2_err *err)
{
    int D = s->D, ff = s->ff;
    float *w;
    int rc;
    if ((rc = load_matrix(s, PI2_T_GATE, l, e, &w, err)))
        return rc;
    see_input(s, PI2_T_GATE, l, e, n, rows, X, D);
    gemm_nt(n, ff, D, 1.0f, X, D, w, D, 0.0f, s->g, ff); /* (n, ff) */
    if ((rc = load_matrix(s, PI2_T_UP, l, e, &w, err)))
        return rc;
    see_input(s, PI2_T_UP, l, e, n, rows, X, D);
    gemm_nt(n, ff, D, 1.0f, X, D, w, D, 0.0f, s->u, ff); /* (n, ff) */
    act_job aj = { s->d->act, pi2_desc_gate_threshold(s->d), s->g, s->u, ff };
    par_for(s, n, 1 + (1 << 15) / ff, act_part, &aj);
    if (s->o.ffn)
        s->o.ffn(s->o.ffn_ctx, l, e, n, rows, X, R, s->g);
    if ((rc = load_matrix(s, PI2_T_DOWN, l, e, &w, err)))
        return rc;
    see_input(s, PI2_T_DOWN, l, e, n, rows, s->g, ff);
    gemm_nt(n, D, ff, 1.0f, s->g, ff, w, ff, beta, out, D); /* (n, d) */
    return 0;
}

/* MoE FFN of layer l over all N rows of s->xb; x += sum of routed experts. */
static int ffn_moe(pi2_calib_state *s, int l, int N, pi2_err *err)
{
    int D = s->D, ne = s->d->n_experts, k = s->k_used;
    float *w;
    int rc;
    if ((rc = load_matrix(s, PI2_T_ROUTER, l, 0, &w, err)))
        return rc;
    for (int r = 0; r < N; r++) {
        const float *xr = s->xb + (size_t)r * D;
        float lg[PI2_CFG_MAX_EXPERTS];
        for (int e = 0; e < ne; e++) {
            const float *we = w + (size_t)e * D;
            double acc = 0.0; /* double, as the reference's router */
            for (int j = 0; j < D; j++)
                acc += (double)we[j] * xr[j];
            lg[e] = (float)acc;
        }
        /* the reference's routing (runtime/moe.h) */
        pi2_moe_route(lg, ne, k, s->route + (size_t)r * k, s->route_w + (size_t)r * k);
    }
    if (s->o.ffn) /* the hook's residual rows: as before any expert of this layer added to it */
        memcpy(s->x0, s->x, sizeof(float) * (size_t)N * (size_t)D);
    for (int e = 0; e < ne; e++) {
        int n = 0;
        for (int r = 0; r < N; r++)
            for (int j = 0; j < k; j++)
                if (s->route[(size_t)r * k + j] == e) {
                    s->rows[n] = r;
                    s->ew[n] = s->route_w[(size_t)r * k + j];
                    memcpy(s->xe + (size_t)n * D, s->xb + (size_t)r * D, sizeof(float) * (size_t)D);
                    if (s->o.ffn)
                        memcpy(s->re + (size_t)n * D, s->x0 + (size_t)r * D, sizeof(float) * (size_t)D);
                    n++;
                }
        if (n == 0)
            continue;
        if ((rc = ffn_rows(s, l, e, n, s->rows, s->xe, s->re, s->ye, 0.0f, err)))
            return rc;
        for (int i = 0; i < n; i++) {
            float *xr = s->x + (size_t)s->rows[i] * D;
            const float *yr = s->ye + (size_t)i * D;
            for (int j = 0; j < D; j++)
                xr[j] += (float)(s->ew[i] * yr[j]);
        }
    }
    return 0;
}

/* The output head over the rows of s->xb listed by mode:
 *   logits != NULL: all N rows into logits (N, vocab);
 *   tokens != NULL (NLL): all N rows, online log-sum-exp and target logits;
 *   else: the n_seq rows already compacted in s->xb, into s->last.
 * The last position's logits of each sequence always land in s->last. */
static int head(pi2_calib_state *s, int n_new, float *logits, const int32_t *tokens, pi2_err *err)
{
    const pi2_st_tensor *h = pi2_ref_weight(s->m, PI2_T_LM_HEAD, 0, 0);
    int D = s->D, V = s->d->vocab, N = s->n_seq * n_new;
    bool nll = tokens != NULL;
    int rows = logits || nll ? N : s->n_seq;
    int n_valid = pi2_ref_n_tokens(s->m); /* a padded vocabulary's rows past it are never output */
    if (n_valid <= 0 || n_valid > V)
        n_valid = V;
    if (nll)
        for (int r = 0; r < N; r++) {
            s->lse_m[r] = -INFINITY;
            s->lse_s[r] = 0.0;
            s->tgt[r] = 0.0;
        }
    see_input(s, PI2_T_LM_HEAD, 0, 0, rows, NULL, s->xb, D);
    int rc = 0;
    for (int c0 = 0; c0 < V && !rc; c0 += s->head_rows) {
        int nb = V - c0 < s->head_rows ? V - c0 : s->head_rows;
        pi2_st_tensor blk = row_slice(h, c0, nb);
        if ((rc = convert_rows(s, h, c0, nb, s->w, err)))
            break;
        pi2_st_release(&blk);
        if (s->o.weight)
            s->o.weight(s->o.weight_ctx, PI2_T_LM_HEAD, 0, 0, s->w, nb, D);
        if (logits) {
            gemm_nt(rows, nb, D, 1.0f, s->xb, D, s->w, D, 0.0f, logits + c0, V);
            continue;
        }
        if (!nll) {
            gemm_nt(rows, nb, D, 1.0f, s->xb, D, s->w, D, 0.0f, s->last + c0, V);
            continue;
        }
        float *C = s->g; /* (N, nb) */
        gemm_nt(N, nb, D, 1.0f, s->xb, D, s->w, D, 0.0f, C, nb);
        int nv = n_valid - c0 < nb ? n_valid - c0 : nb; /* columns the log-softmax counts */
        for (int r = 0; r < N; r++) {
            const float *cr = C + (size_t)r * nb;
            int i = r % n_new, sq = r / n_new;
            if (i == n_new - 1)
                memcpy(s->last + (size_t)sq * V + c0, cr, sizeof(float) * (size_t)nb);
            if (i == n_new - 1 || nv <= 0)
                continue; /* no next token to predict, or padding only */
            float mx = cr[0];
            for (int c = 1; c < nv; c++)
                mx = cr[c] > mx ? cr[c] : mx;
            double sum = 0.0;
            for (int c = 0; c < nv; c++)
                sum += exp((double)cr[c] - mx);
            double m0 = s->lse_m[r], m1 = mx > m0 ? mx : m0;
            s->lse_s[r] = s->lse_s[r] * exp(m0 - m1) + sum * exp(mx - m1);
            s->lse_m[r] = m1;
            int t = tokens[(size_t)sq * n_new + i + 1];
            if (t >= c0 && t < c0 + nb)
                s->tgt[r] = cr[t - c0];
        }
    }
    pi2_st_release(h);
    if (rc == 0 && logits)
        for (int sq = 0; sq < s->n_seq; sq++)
            memcpy(s->last + (size_t)sq * V, logits + ((size_t)sq * n_new + n_new - 1) * V, sizeof(float) * V);
    return rc;
}

/* The whole forward; nll != NULL selects the NLL head (targets from tokens). */
static int run(pi2_calib_state *s, const int32_t *tokens, int n_new, float *logits, double *nll, pi2_err *err)
{
    if (!s || !tokens)
        return pi2_err_set(err, PI2_EINVAL, "calib: NULL argument");
    const pi2_model_desc *d = s->d;
    if (n_new < 1)
        return pi2_err_set(err, PI2_EINVAL, "calib: n_new %d must be at least 1", n_new);
    if (n_new > s->max_len - s->len)
        return pi2_err_set(err, PI2_ERANGE, "calib: appending %d tokens to sequences of %d exceeds max_len %d",
                           n_new, s->len, s->max_len);
    int N = s->n_seq * n_new, D = s->D;
    for (int r = 0; r < N; r++)
        if (tokens[r] < 0 || tokens[r] >= d->vocab)
            return pi2_err_set(err, PI2_ERANGE, "calib: token id %d (sequence %d, index %d) out of range [0, %d)",
                               (int)tokens[r], r / n_new, r % n_new, d->vocab);
    int rc = ensure_scratch(s, (size_t)N, (size_t)n_new * (size_t)(s->len + n_new), err);
    if (rc)
        return rc;
    int saved = openblas_get_num_threads();
    openblas_set_num_threads(n_threads(s));
    s->have_last = false;

    /* embeddings (rows, d) */
    const pi2_st_tensor *emb = pi2_ref_weight(s->m, PI2_T_EMBED, 0, 0);
    for (int r = 0; r < N && !rc; r++) {
        pi2_st_tensor row = row_slice(emb, tokens[r], 1);
        rc = pi2_st_to_f32(&row, s->x + (size_t)r * D, (size_t)D, err);
    }
    pi2_st_release(emb);
    if (!rc && s->o.weight)
        s->o.weight(s->o.weight_ctx, PI2_T_EMBED, 0, 0, s->x, N, D);

    for (int l = 0; l < d->n_layers && !rc; l++) {
        if ((rc = load_norm(s, PI2_T_ATTN_NORM, l, err)))
            break;
        for (int r = 0; r < N; r++)
            pi2_op_rmsnorm_exact(s->xb + (size_t)r * D, s->x + (size_t)r * D, s->norm, D, d->rms_eps);
        if ((rc = attention(s, l, n_new, err)) || (rc = load_norm(s, PI2_T_FFN_NORM, l, err)))
            break;
        for (int r = 0; r < N; r++)
            pi2_op_rmsnorm_exact(s->xb + (size_t)r * D, s->x + (size_t)r * D, s->norm, D, d->rms_eps);
        if (pi2_desc_is_moe(d)) {
            rc = ffn_moe(s, l, N, err);
        } else {
            for (int r = 0; r < N; r++)
                s->rows[r] = r;
            rc = ffn_rows(s, l, 0, N, s->rows, s->xb, s->x, s->x, 1.0f, err); /* x += ffn(xb) */
        }
    }

    if (!rc && !(rc = load_norm(s, PI2_T_OUT_NORM, 0, err))) {
        if (logits || nll) {
            for (int r = 0; r < N; r++)
                pi2_op_rmsnorm_exact(s->xb + (size_t)r * D, s->x + (size_t)r * D, s->norm, D, d->rms_eps);
        } else {
            for (int sq = 0; sq < s->n_seq; sq++) /* only each sequence's last row, compacted */
                pi2_op_rmsnorm_exact(s->xb + (size_t)sq * D, s->x + ((size_t)sq * n_new + n_new - 1) * D, s->norm, D,
                            d->rms_eps);
        }
        rc = head(s, n_new, logits, nll ? tokens : NULL, err);
    }
    openblas_set_num_threads(saved);
    if (rc)
        return rc;
    if (nll)
        for (int sq = 0; sq < s->n_seq; sq++) {
            double acc = 0.0;
            for (int i = 0; i + 1 < n_new; i++) {
                size_t r = (size_t)sq * n_new + i;
                acc += s->lse_m[r] + log(s->lse_s[r]) - s->tgt[r];
            }
            nll[sq] = acc;
        }
    s->len += n_new;
    s->have_last = true;
    return 0;
}

int pi2_calib_forward(pi2_calib_state *s, const int32_t *tokens, int n_new, float *logits, pi2_err *err)
{
    return run(s, tokens, n_new, logits, NULL, err);
}

int pi2_calib_nll(pi2_calib_state *s, const int32_t *tokens, int len, double *nll, pi2_err *err)
{
    if (!s || !tokens || !nll)
        return pi2_err_set(err, PI2_EINVAL, "calib: NULL argument");
    if (len < 1 || len > s->max_len)
        return pi2_err_set(err, PI2_ERANGE, "calib: sequence length %d out of range [1, %d]", len, s->max_len);
    pi2_calib_reset(s);
    return run(s, tokens, len, NULL, nll, err);
}

int pi2_calib_generate(pi2_calib_state *s, const int32_t *prompt, int n_prompt, int len, const pi2_sample_opts *so,
                       int32_t *out, pi2_err *err)
{
    if (!s || !prompt || !so || !out)
        return pi2_err_set(err, PI2_EINVAL, "calib: NULL argument");
    if (n_prompt < 1 || n_prompt > len || len > s->max_len)
        return pi2_err_set(err, PI2_ERANGE, "calib: prompt %d and length %d must satisfy 1 <= prompt <= length <= %d",
                           n_prompt, len, s->max_len);
    int V = s->d->vocab, nq = s->n_seq;
    pi2_sampler **smp = calloc((size_t)nq, sizeof *smp);
    float *lg = pi2_malloc_array((size_t)V, sizeof(float));
    int32_t *tok = pi2_malloc_array((size_t)nq, sizeof(int32_t));
    int rc = smp && lg && tok ? 0 : pi2_err_set(err, PI2_ENOMEM, "calib: out of memory");
    for (int q = 0; q < nq && !rc; q++) {
        pi2_sample_opts o = *so;
        o.seed = so->seed + 0x9e3779b97f4a7c15ull * (uint64_t)(q + 1);
        rc = pi2_sampler_create(&smp[q], V, &o, err);
    }
    if (!rc) {
        pi2_calib_reset(s);
        rc = run(s, prompt, n_prompt, NULL, NULL, err);
        for (int q = 0; q < nq; q++)
            memcpy(out + (size_t)q * len, prompt + (size_t)q * n_prompt, sizeof(int32_t) * (size_t)n_prompt);
    }
    for (int t = n_prompt; t < len && !rc; t++) {
        for (int q = 0; q < nq; q++) {
            memcpy(lg, s->last + (size_t)q * V, sizeof(float) * (size_t)V);
            for (int i = 0; i < s->d->n_eos; i++)
                if (s->d->eos_ids[i] >= 0 && s->d->eos_ids[i] < V)
                    lg[s->d->eos_ids[i]] = -INFINITY;
            pi2_logits_mask_padding(lg, V, pi2_ref_n_tokens(s->m)); /* rows past the tokenizer */
            tok[q] = pi2_sampler_next(smp[q], lg);
            out[(size_t)q * len + t] = tok[q];
        }
        if (t + 1 < len)
            rc = run(s, tok, 1, NULL, NULL, err);
    }
    for (int q = 0; smp && q < nq; q++)
        pi2_sampler_free(smp[q]);
    free(smp);
    free(lg);
    free(tok);
    return rc;
}
