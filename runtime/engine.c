/* pi2 engine: open a bundled container and build the model in place. */
#include "runtime/state.h"
#include "runtime/forward.h"
#include "runtime/ffn.h"
#include "runtime/ffn_source.h"
#include "runtime/offload/offload.h"
#include "runtime/planner.h"

#include <assert.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

void pi2_engine_defaults(pi2_engine_opts *o)
{
    memset(o, 0, sizeof *o);
    o->verify_ffn = true;
    o->preload = true;
    o->offload.hot_share = 1.0;
    o->offload.lock_hot = true;
    o->offload.io_depth = 64;
}

static int unsupported(const pi2_engine *e, pi2_err *err, const char *what)
{
    return pi2_err_set(err, PI2_EUNSUPPORTED, "%s: %s", e->path, what);
}

/* The member named `name`, exactly `size` bytes. */
static const uint8_t *member(const pi2_engine *e, const char *name, uint64_t size, pi2_err *err)
{
    const pi2_ctr_member *m = pi2_ctr_find(pi2_bundle_container(e->b), name);
    if (!m) {
        pi2_err_set(err, PI2_ENOTFOUND, "%s: member %s is missing", e->path, name);
        return NULL;
    }
    if (m->size != size) {
        pi2_err_set(err, PI2_ESHAPE, "%s: member %s holds %llu bytes, expected %llu", e->path, name,
                    (unsigned long long)m->size, (unsigned long long)size);
        return NULL;
    }
    if (e->res) { /* offloading: the resident region was read into memory we own */
        if (m->offset > e->res_bytes || m->size > e->res_bytes - m->offset) {
            pi2_err_set(err, PI2_EFORMAT, "%s: member %s lies outside the resident region", e->path, name);
            return NULL;
        }
        return e->res + m->offset;
    }
    return m->data;
}

/* Row tables (16 bytes a row: 35 MB on an 8-expert model) count in the
 * engine's buffer total, as acc_alloc's do. */
static int alloc_rows(pi2_engine *e, eng_mat *m, pi2_err *err)
{
    m->rp = pi2_malloc_array((size_t)m->rows, sizeof *m->rp);
    m->rs = pi2_malloc_array((size_t)m->rows, sizeof *m->rs);
    e->buf_bytes += (uint64_t)m->rows * (sizeof *m->rp + sizeof *m->rs);
    if (!m->rp || !m->rs)
        return pi2_err_set(err, PI2_ENOMEM, "out of memory for row tables");
    return 0;
}

static void free_mat(eng_mat *m)
{
    free(m->rp);
    free(m->rs);
    m->rp = NULL;
    m->rs = NULL;
}

/* pi2_malloc_array that adds the bytes to the engine's buffer total (the
 * memory plan of offloading counts them). */
static void *acc_alloc(pi2_engine *e, size_t n, size_t size)
{
    e->buf_bytes += (uint64_t)n * size;
    return pi2_malloc_array(n, size);
}

/* Offloading: give back the whole pages of [p, p + n) inside the resident
 * region (read into memory the engine owns); returns their bytes, for the
 * caller to count off it. The range is marked no-huge-page first, so that
 * the kernel's background collapse of the 2 MiB pages around it cannot
 * fill the hole again. */
static uint64_t release_res(const pi2_engine *e, const void *p, uint64_t n)
{
    uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE), a = (uint64_t)((const uint8_t *)p - e->res), b = a + n;
    a = (a + pg - 1) / pg * pg;
    b = b / pg * pg;
    if (b <= a)
        return 0;
#ifdef MADV_NOHUGEPAGE
    if (madvise(e->res + a, (size_t)(b - a), MADV_NOHUGEPAGE) != 0)
        return 0;
#endif
    return madvise(e->res + a, (size_t)(b - a), MADV_DONTNEED) == 0 ? b - a : 0;
}

/* Offloading: give back f's f32/f16 predictor once its Q8 copy is made
 * (bytes released). */
static uint64_t release_pred(const pi2_engine *e, eng_ffn *f)
{
    const uint8_t *p1 = (const uint8_t *)f->fc1, *p2 = (const uint8_t *)f->fc2;
    uint64_t el = f->pred_f16 ? 2 : 4, n1 = (uint64_t)f->rank * (uint64_t)e->d.hidden * el,
             n2 = (uint64_t)f->n_ff * (uint64_t)f->rank * el, r;
    if (p1 + n1 == p2) /* side by side, as bundled: one range */
        r = release_res(e, p1, n1 + n2);
    else
        r = release_res(e, p1, n1) + release_res(e, p2, n2);
    f->fc1 = f->fc2 = NULL;
    return r;
}

/* The predictor's decode copy: fc1 and fc2 as Q8 rows (fc2's rows padded
 * with zero columns to rank_p), so decode runs them through the int8
 * matmul: on the 7B-shaped model the f32 predictor read 150 MB a token,
 * a tenth of the bytes, at a fifth of the rate of the int8 kernels.
 * The picks move only where a score is within the quantization error of
 * the threshold (test_predict_q8). */
static int pred_alloc(pi2_engine *e, eng_ffn *f, pi2_err *err)
{
    int64_t D = e->d.hidden, R = f->rank, Rp = (R + PI2_Q_GROUP - 1) / PI2_Q_GROUP * PI2_Q_GROUP, N = f->n_ff;
    size_t b1 = (size_t)(R * D), b2 = (size_t)(N * Rp), c1 = (size_t)(R * (D / PI2_Q_GROUP)),
           c2 = (size_t)(N * (Rp / PI2_Q_GROUP));
    if (!(f->pq = acc_alloc(e, b1 + b2 + 2 * (c1 + c2), 1)))
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory for the predictor of layer %d", e->path, f->layer);
    e->pred_bytes += b1 + b2 + 2 * (c1 + c2);
    f->rank_p = (int)Rp;
    f->pred_qt = PI2_QT_Q8;
    f->q1 = f->pq;
    f->q2 = f->pq + b1;
    f->s1 = (uint16_t *)(void *)(f->pq + b1 + b2);
    f->s2 = f->s1 + c1;
    return 0;
}

/* A q8/q4 predictor (qt): its members, in the layout pred_alloc makes,
 * used in place, so open neither copies nor quantizes them. */
static int pred_bind(pi2_engine *e, eng_ffn *f, const pi2_mf_predictor *p, pi2_qtype qt, pi2_err *err)
{
    int64_t D = e->d.hidden, R = f->rank, Rp = (R + PI2_Q_GROUP - 1) / PI2_Q_GROUP * PI2_Q_GROUP, N = f->n_ff;
    const uint8_t *s1, *s2;
    f->pred_qt = qt;
    f->rank_p = (int)Rp;
    if (!(f->q1 = member(e, p->fc1, (uint64_t)R * pi2_q_payload_row_bytes(qt, D), err)) ||
        !(f->q2 = member(e, p->fc2, (uint64_t)N * pi2_q_payload_row_bytes(qt, Rp), err)) ||
        !(s1 = member(e, p->fc1_scales, (uint64_t)R * pi2_q_scale_row_count(qt, D) * 2, err)) ||
        !(s2 = member(e, p->fc2_scales, (uint64_t)N * pi2_q_scale_row_count(qt, Rp) * 2, err)))
        return err->code;
    f->s1 = (const uint16_t *)(const void *)s1;
    f->s2 = (const uint16_t *)(const void *)s2;
    e->pred_bytes += (uint64_t)R * (pi2_q_payload_row_bytes(qt, D) + pi2_q_scale_row_count(qt, D) * 2) +
                     (uint64_t)N * (pi2_q_payload_row_bytes(qt, Rp) + pi2_q_scale_row_count(qt, Rp) * 2);
    return 0;
}

/* Quantize f's predictor into its Q8 copy: 0, PI2_ENOMEM or PI2_ERANGE. */
static int pred_fill(const pi2_engine *e, eng_ffn *f)
{
    int64_t D = e->d.hidden, R = f->rank, Rp = f->rank_p, N = f->n_ff;
    int64_t W = D > Rp ? D : Rp;
    uint8_t *q1 = f->pq, *q2 = f->pq + R * D; /* the writable view of f's copy (pred_alloc) */
    uint16_t *s1 = (uint16_t *)(void *)(q2 + N * Rp), *s2 = s1 + R * (D / PI2_Q_GROUP);
    float *row = malloc(sizeof(float) * (size_t)W);
    if (!row)
        return PI2_ENOMEM;
    int rc = 0;
    for (int64_t r = 0; r < R && !rc; r++) {
        for (int64_t k = 0; k < D; k++)
            row[k] = eng_pred_w(f, f->fc1, (size_t)(r * D + k));
        rc = pi2_q_quantize_row(PI2_QT_Q8, row, D, s1 + r * (D / PI2_Q_GROUP), q1 + r * D);
    }
    memset(row + R, 0, sizeof(float) * (size_t)(Rp - R));
    for (int64_t i = 0; i < N && !rc; i++) {
        for (int64_t k = 0; k < R; k++)
            row[k] = eng_pred_w(f, f->fc2, (size_t)(i * R + k));
        rc = pi2_q_quantize_row(PI2_QT_Q8, row, Rp, s2 + i * (Rp / PI2_Q_GROUP), q2 + i * Rp);
    }
    free(row);
    return rc ? PI2_ERANGE : 0;
}

typedef struct pred_job {
    pi2_engine *e;
    eng_ffn **f; /* the FFNs with a predictor */
    int n;
    atomic_int next;
    int *rc;            /* [n] */
    _Atomic uint64_t released; /* bytes of f32/f16 predictors given back */
} pred_job;

static void pred_fn(void *ctx, int tid, int nt)
{
    (void)tid;
    (void)nt;
    pred_job *j = ctx;
    for (int k; (k = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < j->n;)
        if ((j->rc[k] = pred_fill(j->e, j->f[k])) == 0 && j->e->res)
            atomic_fetch_add_explicit(&j->released, release_pred(j->e, j->f[k]), memory_order_relaxed);
}

/* Every predictor's Q8 copy, the FFNs shared out over the pool; offloading,
 * each f32/f16 predictor's pages given back as soon as its copy is made
 * (the resident region is read into memory the engine owns, and decode
 * reads only the copy), so open holds the region and about one copy per
 * thread beyond it (pi2_plan_memory's open_peak). */
static int pred_quantize_all(pi2_engine *e, pi2_err *err)
{
    int E = pi2_desc_is_moe(&e->d) ? e->d.n_experts : 1, n = 0;
    pred_job j = {.e = e};
    j.f = pi2_malloc_array((size_t)e->d.n_layers * (size_t)E, sizeof *j.f);
    j.rc = pi2_calloc_array((size_t)e->d.n_layers * (size_t)E, sizeof *j.rc);
    if (!j.f || !j.rc) {
        free(j.f);
        free(j.rc);
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", e->path);
    }
    for (int l = 0; l < e->d.n_layers; l++)
        for (int x = 0; x < E; x++)
            if (e->layers[l].ffn[x].has_pred && e->layers[l].ffn[x].pq) /* q8/q4 members are used in place */
                j.f[n++] = &e->layers[l].ffn[x];
    j.n = n;
    atomic_init(&j.next, 0);
    atomic_init(&j.released, 0);
    if (n > 0)
        pi2_pool_run(e->pool, pred_fn, &j);
    e->res_released += atomic_load(&j.released);
    int rc = 0;
    for (int k = 0; k < n && !rc; k++)
        if (j.rc[k] == PI2_ENOMEM)
            rc = pi2_err_set(err, PI2_ENOMEM, "%s: out of memory quantizing the predictors", e->path);
        else if (j.rc[k])
            rc = pi2_err_set(err, PI2_EFORMAT,
                             "%s: the predictor of layer %d (expert %d) holds a value that cannot be quantized (not "
                             "finite, or beyond fp16 scales)",
                             e->path, j.f[k]->layer, j.f[k]->expert);
    free(j.f);
    free(j.rc);
    return rc;
}

/* A contiguous (non-FFN) matrix of role/layer, expected [rows, cols]. */
static int bind_mat(pi2_engine *e, eng_mat *out, pi2_tname role, int layer, int64_t rows, int64_t cols,
                    pi2_err *err)
{
    const pi2_mf_tensor *t = pi2_manifest_find_tensor(e->mf, role, layer, -1);
    if (!t)
        return pi2_err_set(err, PI2_ENOTFOUND, "%s: no %s tensor for layer %d", e->path,
                           pi2_manifest_role_name(role), layer);
    if (t->rows != rows || t->cols != cols || t->transposed)
        return pi2_err_set(err, PI2_ESHAPE, "%s: tensor %s is [%lld, %lld], expected [%lld, %lld]", e->path,
                           t->name, (long long)t->rows, (long long)t->cols, (long long)rows, (long long)cols);
    memset(out, 0, sizeof *out);
    out->qt = t->qtype;
    out->rows = rows;
    out->cols = cols;
    size_t rb = pi2_q_payload_row_bytes(t->qtype, cols);
    const uint8_t *p = member(e, t->payload, (uint64_t)rows * rb, err);
    if (!p)
        return err->code;
    if (t->qtype == PI2_QT_F32) {
        out->f32 = (const float *)(const void *)p;
        out->row_bytes = rb;
        return 0;
    }
    size_t sc = pi2_q_scale_row_count(t->qtype, cols);
    const uint16_t *s = (const uint16_t *)(const void *)member(e, t->scales, (uint64_t)rows * sc * 2, err);
    if (!s)
        return err->code;
    if (alloc_rows(e, out, err))
        return err->code;
    for (int64_t r = 0; r < rows; r++) {
        out->rp[r] = p + (size_t)r * rb;
        out->rs[r] = s + (size_t)r * sc;
    }
    out->row_bytes = rb + sc * 2;
    return 0;
}

/* An f32 vector tensor (norms) of n floats. */
static const float *bind_vec(pi2_engine *e, pi2_tname role, int layer, int64_t n, pi2_err *err)
{
    const pi2_mf_tensor *t = pi2_manifest_find_tensor(e->mf, role, layer, -1);
    if (!t) {
        pi2_err_set(err, PI2_ENOTFOUND, "%s: no %s tensor for layer %d", e->path, pi2_manifest_role_name(role),
                    layer);
        return NULL;
    }
    if (t->qtype != PI2_QT_F32 || t->rows * t->cols != n) {
        pi2_err_set(err, PI2_ESHAPE, "%s: tensor %s must be %lld f32 values", e->path, t->name, (long long)n);
        return NULL;
    }
    return (const float *)(const void *)member(e, t->payload, (uint64_t)n * 4, err);
}

static int bind_ffn(pi2_engine *e, eng_ffn *f, int layer, int expert, pi2_err *err)
{
    const pi2_model_desc *d = &e->d;
    int mex = pi2_desc_is_moe(d) ? expert : -1;
    const pi2_bl_ffn *bf = pi2_bl_find(e->bl, layer, mex);
    if (!bf)
        return pi2_err_set(err, PI2_ENOTFOUND, "%s: bundle has no FFN for layer %d expert %d", e->path, layer, mex);
    f->layer = layer;
    f->expert = expert;
    f->n_ff = bf->neurons;
    if ((int)bf->neurons != d->n_ff)
        return pi2_err_set(err, PI2_ESHAPE, "%s: FFN %s holds %u neurons, config says %d", e->path, bf->ffn,
                           bf->neurons, d->n_ff);
    const uint8_t *base = NULL;
    if (!e->res) {
        if (!(base = member(e, bf->ffn, (uint64_t)bf->groups * bf->slot_bytes, err)))
            return err->code;
    } else { /* offloading: payload rows are pointed at the hot segment or the cache later */
        const pi2_ctr_member *m = pi2_ctr_find(pi2_bundle_container(e->b), bf->ffn);
        if (!m || m->size != (uint64_t)bf->groups * bf->slot_bytes)
            return pi2_err_set(err, PI2_ESHAPE, "%s: FFN member %s is missing or of the wrong size", e->path, bf->ffn);
    }
    static const pi2_tname roles[3] = {PI2_T_GATE, PI2_T_UP, PI2_T_DOWN};
    eng_mat *mats[3] = {&f->gate, &f->up, &f->down};
    uint64_t rb = e->bl->row_bytes;
    size_t sc = (size_t)d->hidden / PI2_Q_GROUP;
    for (int k = 0; k < 3; k++) {
        const pi2_mf_tensor *t = pi2_manifest_find_tensor(e->mf, roles[k], layer, mex);
        if (!t)
            return pi2_err_set(err, PI2_ENOTFOUND, "%s: no %s tensor for layer %d", e->path,
                               pi2_manifest_role_name(roles[k]), layer);
        if (t->qtype != e->mf->quant_ffn || t->rows != bf->neurons || t->cols != d->hidden)
            return pi2_err_set(err, PI2_ESHAPE, "%s: tensor %s is not [%u, %d] %s", e->path, t->name, bf->neurons,
                               d->hidden, pi2_q_type_name(e->mf->quant_ffn));
        const uint16_t *s =
            (const uint16_t *)(const void *)member(e, t->scales, (uint64_t)bf->neurons * sc * 2, err);
        if (!s)
            return err->code;
        eng_mat *m = mats[k];
        m->qt = t->qtype;
        m->rows = bf->neurons;
        m->cols = d->hidden;
        m->row_bytes = rb + sc * 2;
        if (alloc_rows(e, m, err))
            return err->code;
        for (uint32_t i = 0; i < bf->neurons; i++)
            m->rs[i] = s + (size_t)i * sc;
    }
    for (uint32_t i = 0; base && i < bf->neurons; i++) {
        uint64_t off[3];
        pi2_bl_neuron_offsets(bf, rb, e->bl->two_phase, i, off);
        f->gate.rp[i] = base + off[0];
        f->up.rp[i] = base + off[1];
        f->down.rp[i] = base + off[2];
    }
    const pi2_mf_layer *ml = pi2_manifest_find_layer(e->mf, layer, mex);
    if (e->mode == PI2_MF_SPARSE_PREDICTOR) {
        if (!ml || !ml->has_predictor)
            return pi2_err_set(err, PI2_ENOTFOUND, "%s: no predictor for layer %d", e->path, layer);
        const pi2_mf_predictor *p = &ml->predictor;
        uint64_t el = pi2_mf_pred_elem(p->dtype);
        f->has_pred = true;
        f->pred_prenorm = p->input == PI2_PRED_IN_PRENORM;
        f->pred_f16 = p->dtype == PI2_MF_PRED_F16;
        f->rank = p->rank;
        f->threshold = p->threshold;
        if (pi2_mf_pred_qtype(p->dtype) != PI2_QT_F32)
            return pred_bind(e, f, p, pi2_mf_pred_qtype(p->dtype), err);
        f->fc1 = member(e, p->fc1, (uint64_t)p->rank * d->hidden * el, err);
        if (!f->fc1)
            return err->code;
        f->fc2 = member(e, p->fc2, (uint64_t)p->rank * bf->neurons * el, err);
        if (!f->fc2)
            return err->code;
        if (pred_alloc(e, f, err))
            return err->code;
    } else if (e->mode == PI2_MF_SPARSE_THRESHOLD) {
        if (!ml || !ml->has_silu_threshold)
            return pi2_err_set(err, PI2_ENOTFOUND, "%s: no activation threshold for layer %d", e->path, layer);
        f->has_silu_thr = true;
        f->silu_thr = ml->silu_threshold;
    }
    return 0;
}

static int check_model(pi2_engine *e, pi2_err *err)
{
    const pi2_model_desc *d = &e->d;
    if (d->hidden % PI2_Q_GROUP != 0)
        return unsupported(e, err, "hidden size must be a multiple of 32");
    if (d->head_dim % 2 != 0 || d->n_heads % d->n_kv_heads != 0)
        return unsupported(e, err, "head_dim must be even and heads a multiple of kv heads");
    if ((d->n_heads * d->head_dim) % PI2_Q_GROUP != 0)
        return unsupported(e, err, "heads * head_dim must be a multiple of 32");
    if (e->mf->quant_ffn != PI2_QT_Q4 && e->mf->quant_ffn != PI2_QT_Q8)
        return unsupported(e, err, "FFN weights must be q4 or q8");
    if (pi2_desc_is_moe(d) && (d->n_experts_used < 1 || d->n_experts_used > d->n_experts))
        return unsupported(e, err, "MoE top-k out of range");
    return 0;
}

static int alloc_state(pi2_engine *e, pi2_err *err)
{
    const pi2_model_desc *d = &e->d;
    size_t T = PI2_K_MAX_T, D = (size_t)d->hidden, qd = (size_t)d->n_heads * d->head_dim;
    size_t kvd = (size_t)d->n_kv_heads * d->head_dim;
    e->max_in = (int)(D > qd ? D : qd);
    e->max_ff = d->n_ff;
    int max_rank = 1;
    int E = pi2_desc_is_moe(d) ? d->n_experts : 1;
    for (int l = 0; l < d->n_layers; l++)
        for (int x = 0; x < E; x++)
            if (e->layers[l].ffn[x].rank > max_rank)
                max_rank = e->layers[l].ffn[x].rank;
    e->x = acc_alloc(e, T * D, sizeof(float));
    e->xb = acc_alloc(e, T * (size_t)e->max_in, sizeof(float));
    e->xb2 = acc_alloc(e, T * D, sizeof(float));
    e->q = acc_alloc(e, T * (qd + 2 * kvd), sizeof(float));
    e->att = acc_alloc(e, T * qd, sizeof(float));
    e->aqs = acc_alloc(e, T * (size_t)e->max_in / PI2_Q_GROUP, sizeof(float));
    e->aq = acc_alloc(e, T * (size_t)e->max_in, 1);
    e->asum = acc_alloc(e, T * (size_t)e->max_in / PI2_Q_GROUP, sizeof(int32_t));
    max_rank = (max_rank + PI2_Q_GROUP - 1) / PI2_Q_GROUP * PI2_Q_GROUP;
    e->ph = acc_alloc(e, (size_t)max_rank, sizeof(float));
    e->phs = acc_alloc(e, (size_t)max_rank / PI2_Q_GROUP, sizeof(float));
    e->phq = acc_alloc(e, (size_t)max_rank, 1);
    e->phsum = acc_alloc(e, (size_t)max_rank / PI2_Q_GROUP, sizeof(int32_t));
    e->pxs = acc_alloc(e, D / PI2_Q_GROUP, sizeof(float));
    e->pxq = acc_alloc(e, D, 1);
    e->pxsum = acc_alloc(e, D / PI2_Q_GROUP, sizeof(int32_t));
    e->router_logits = acc_alloc(e, (size_t)(E > 0 ? E : 1) * T, sizeof(float));
    e->chosen = acc_alloc(e, (size_t)(E > 0 ? E : 1) * T, sizeof(int));
    e->sel = acc_alloc(e, (size_t)d->n_ff, sizeof(uint32_t));
    e->scores_all = acc_alloc(e, (size_t)d->n_ff, sizeof(float));
    e->dec_out = acc_alloc(e, ((size_t)d->n_ff + FFN_CHUNK - 1) / FFN_CHUNK * D, sizeof(float));
    e->share_rng = acc_alloc(e, (size_t)e->tls_n, sizeof *e->share_rng);
    e->pred_n = acc_alloc(e, ((size_t)d->n_ff + ENG_PRED_UNIT - 1) / ENG_PRED_UNIT, sizeof *e->pred_n);
    e->moe_x = acc_alloc(e, T * D, sizeof(float));
    e->moe_out = acc_alloc(e, T * D, sizeof(float));
    e->moe_w = acc_alloc(e, T, sizeof(float));
    e->moe_tok = acc_alloc(e, T, sizeof(int));
    e->moe_wk = acc_alloc(e, T * (size_t)(E > 0 ? E : 1), sizeof(float));
    size_t K = pi2_desc_is_moe(d) ? (size_t)d->n_experts_used : 1;
    e->moe_prev = acc_alloc(e, (size_t)d->n_layers * K, sizeof(int));
    e->moe_guess = acc_alloc(e, (size_t)d->n_layers * K, sizeof(int));
    e->moe_prev_pos = -1;
    e->rope_cs = acc_alloc(e, T * (size_t)d->head_dim / 2, sizeof(float));
    e->rope_sn = acc_alloc(e, T * (size_t)d->head_dim / 2, sizeof(float));
    e->tls = calloc((size_t)e->tls_n, sizeof *e->tls);
    e->buf_bytes += (uint64_t)e->tls_n * sizeof *e->tls;
    if (!e->x || !e->xb || !e->xb2 || !e->q || !e->att || !e->aqs || !e->aq || !e->asum ||
        !e->ph || !e->phs || !e->phq || !e->phsum || !e->pxs || !e->pxq || !e->pxsum || !e->router_logits ||
        !e->chosen || !e->sel || !e->scores_all || !e->dec_out || !e->share_rng ||
        !e->pred_n || !e->moe_x || !e->moe_out || !e->moe_w || !e->moe_tok || !e->moe_wk || !e->moe_prev ||
        !e->moe_guess || !e->rope_cs || !e->rope_sn || !e->tls)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory for the KV cache (%d positions) and buffers", e->path,
                           e->ctx);
    for (size_t i = 0; i < (size_t)d->n_layers * K; i++)
        e->moe_guess[i] = -1;
    for (int t = 0; t < e->tls_n; t++) {
        eng_tls *s = &e->tls[t];
        size_t ff = (size_t)d->n_ff;
        s->part = acc_alloc(e, T * ENG_PART_LD(D), sizeof(float));
        s->g = acc_alloc(e, 2 * ff, sizeof(float)); /* dense decode: gate and up results side by side */
        s->u = acc_alloc(e, ff, sizeof(float));
        s->coef = acc_alloc(e, ff, sizeof(float));
        s->pp = acc_alloc(e, 2 * ff, sizeof *s->pp);
        s->ps = acc_alloc(e, 2 * ff, sizeof *s->ps);
        s->pp2 = acc_alloc(e, ff, sizeof *s->pp2);
        s->ps2 = acc_alloc(e, ff, sizeof *s->ps2);
        s->gt = acc_alloc(e, T * ENG_TILE, sizeof(float));
        s->ut = acc_alloc(e, T * ENG_TILE, sizeof(float));
        s->list = acc_alloc(e, ff, sizeof(uint32_t));
        s->list2 = acc_alloc(e, ff, sizeof(uint32_t));
        if (!s->part || !s->g || !s->u || !s->coef || !s->pp || !s->ps || !s->pp2 || !s->ps2 ||
            !s->gt || !s->ut || !s->list || !s->list2)
            return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory for thread buffers", e->path);
    }
    return 0;
}

/* Row tables of a bound matrix (alloc_rows): quantized ones only. */
static uint64_t rows_bytes(const pi2_mf_tensor *t, int64_t rows)
{
    return t && t->qtype != PI2_QT_F32 ? (uint64_t)rows * (sizeof(const uint8_t *) + sizeof(const uint16_t *)) : 0;
}

/* What bind_mat, bind_ffn, pred_alloc and alloc_state add to buf_bytes for
 * this model and tls threads: the engine checks its own count against it. */
static uint64_t engine_buffers(const pi2_manifest *mf, const pi2_bundle_layout *bl, int tls)
{
    const pi2_model_desc *d = &mf->config;
    uint64_t T = PI2_K_MAX_T, D = (uint64_t)d->hidden, qd = (uint64_t)d->n_heads * d->head_dim,
             kvd = (uint64_t)d->n_kv_heads * d->head_dim, ff = (uint64_t)d->n_ff, f = sizeof(float), n = 0;
    bool moe = pi2_desc_is_moe(d);
    uint64_t E = moe ? (uint64_t)d->n_experts : 1, K = moe ? (uint64_t)d->n_experts_used : 1;
    n += rows_bytes(pi2_manifest_find_tensor(mf, PI2_T_EMBED, -1, -1), d->vocab);
    n += rows_bytes(pi2_manifest_find_tensor(mf, PI2_T_LM_HEAD, -1, -1), d->vocab);
    for (int l = 0; l < d->n_layers; l++)
        n += rows_bytes(pi2_manifest_find_tensor(mf, PI2_T_Q, l, -1), (int64_t)qd) +
             rows_bytes(pi2_manifest_find_tensor(mf, PI2_T_K, l, -1), (int64_t)kvd) +
             rows_bytes(pi2_manifest_find_tensor(mf, PI2_T_V, l, -1), (int64_t)kvd) +
             rows_bytes(pi2_manifest_find_tensor(mf, PI2_T_O, l, -1), (int64_t)D);
    int max_rank = 1;
    for (size_t i = 0; i < bl->n_ffn; i++) {
        const pi2_bl_ffn *b = &bl->ffn[i];
        n += 3 * (uint64_t)b->neurons * (sizeof(const uint8_t *) + sizeof(const uint16_t *));
        const pi2_mf_layer *ml = pi2_manifest_find_layer(mf, b->layer, b->expert);
        if (mf->sparsity_mode != PI2_MF_SPARSE_PREDICTOR || !ml || !ml->has_predictor)
            continue;
        uint64_t R = (uint64_t)ml->predictor.rank, Rp = (R + PI2_Q_GROUP - 1) / PI2_Q_GROUP * PI2_Q_GROUP;
        max_rank = ml->predictor.rank > max_rank ? ml->predictor.rank : max_rank;
        if (pi2_mf_pred_qtype(ml->predictor.dtype) != PI2_QT_F32)
            continue; /* q8/q4 members are used in place (pred_bind): no copy */
        n += R * D + b->neurons * Rp + 2 * (R * (D / PI2_Q_GROUP) + b->neurons * (Rp / PI2_Q_GROUP));
    }
    uint64_t mi = D > qd ? D : qd, mr = ((uint64_t)max_rank + PI2_Q_GROUP - 1) / PI2_Q_GROUP * PI2_Q_GROUP;
    uint64_t G = PI2_Q_GROUP;
    n += T * D * f * 3 + T * mi * f + T * (qd + 2 * kvd) * f + T * qd * f; /* x, xb2, moe_x, xb, q, att */
    n += T * mi / G * f + T * mi + T * mi / G * 4;                           /* aqs, aq, asum */
    n += mr * f + mr / G * f + mr + mr / G * 4 + D / G * f + D + D / G * 4;  /* predictor inputs */
    n += E * T * f + E * T * sizeof(int) + ff * 4 + ff * f + (ff + FFN_CHUNK - 1) / FFN_CHUNK * D * f;
    n += (uint64_t)tls * sizeof(uint64_t) + (ff + ENG_PRED_UNIT - 1) / ENG_PRED_UNIT * 4;
    n += T * D * f + T * f + T * sizeof(int) + T * E * f + 2 * (uint64_t)d->n_layers * K * sizeof(int);
    n += 2 * T * ((uint64_t)d->head_dim / 2) * f;
    n += (uint64_t)tls * sizeof(eng_tls);
    n += (uint64_t)tls * (T * ENG_PART_LD(D) * f + 2 * ff * f + 2 * ff * f + 4 * ff * sizeof(void *) +
                          2 * ff * sizeof(void *) + 2 * T * ENG_TILE * f + 2 * ff * 4);
    return n;
}

int pi2_engine_buffer_sizes(const pi2_manifest *mf, const pi2_bundle_layout *bl, int threads, pi2_plan_bufs *out,
                            pi2_err *err)
{
    memset(out, 0, sizeof *out);
    if (bl->n_ffn == 0)
        return pi2_err_set(err, PI2_ESHAPE, "the bundle layout holds no FFN");
    const pi2_model_desc *d = &mf->config;
    eng_ofl_bufs ob;
    eng_ofl_buffers(d, bl, &ob);
    out->engine = engine_buffers(mf, bl, threads);
    out->offload = ob.bytes;
    out->per_depth = ob.per_depth;
    out->slot_bytes[0] = ob.slot_bytes[0];
    out->slot_bytes[1] = ob.slot_bytes[1];
    out->per_pos = 2ull * (uint64_t)d->n_layers * (uint64_t)d->n_kv_heads * (uint64_t)d->head_dim * sizeof(float) +
                   (uint64_t)threads * PI2_K_MAX_T * sizeof(float);
    out->chunk = FFN_CHUNK;
    return 0;
}

typedef struct touch_job {
    const pi2_ctr *c;
    _Atomic uint64_t sink; /* keeps the reads; one add per thread */
} touch_job;

static void touch_fn(void *ctx, int tid, int nt)
{
    touch_job *j = ctx;
    size_t n = pi2_ctr_count(j->c);
    long page = sysconf(_SC_PAGESIZE);
    uint64_t acc = 0;
    for (size_t i = 0; i < n; i++) {
        const pi2_ctr_member *m = pi2_ctr_at(j->c, i);
        int64_t b, en;
        pi2_pool_split((int64_t)m->size, page, tid, nt, &b, &en);
        for (int64_t o = b; o < en; o += page)
            acc += m->data[o];
    }
    atomic_fetch_add_explicit(&j->sink, acc, memory_order_relaxed);
}

/* Offloading: the memory plan (runtime/planner.h), made before anything
 * is allocated, so the pool starts with the plan's threads. */
static int plan_memory(pi2_engine *e, const pi2_engine_opts *o, int ctx, const pi2_plan_bufs *bufs,
                       pi2_plan_memory *m, pi2_err *err)
{
    pi2_plan_mem_in in = {.mf = e->mf, .bl = e->bl, .name = e->path, .base = e->res, .base_len = e->res_bytes,
                          .resident = pi2_plan_resident(e->mf, e->bl, (uint64_t)sysconf(_SC_PAGESIZE)),
                          .bufs = *bufs, .ctx = ctx, .threads = e->tls_n,
                          .cores = (int)sysconf(_SC_NPROCESSORS_ONLN),
                          .files = pi2_plan_container_touched(pi2_bundle_container(e->b)), .opts = &o->offload};
    int rc = pi2_plan_memory_make(&in, m, err);
    if (rc == 0)
        e->threads = m->plan.threads;
    return rc;
}

/* KV positions a run opens with: o->ctx (0: 512), at most the model's. */
static int open_ctx(const pi2_model_desc *d, const pi2_engine_opts *o)
{
    int ctx0 = o->ctx > 0 ? o->ctx : 512, ctx_max = pi2_desc_max_ctx(d); /* larger: clamped to the model's */
    return ctx0 < ctx_max ? ctx0 : ctx_max;
}

/* Offloading: a limit below the minimum is refused before the resident
 * region is read (the fixed costs need only the manifest and layout). */
static int plan_floor(pi2_engine *e, const pi2_engine_opts *o, pi2_err *err)
{
    pi2_plan_bufs bufs;
    pi2_plan_memory m;
    int rc = pi2_engine_buffer_sizes(e->mf, e->bl, e->tls_n, &bufs, err);
    if (rc)
        return rc;
    pi2_plan_mem_in in = {.mf = e->mf, .bl = e->bl, .name = e->path,
                          .resident = pi2_plan_resident(e->mf, e->bl, (uint64_t)sysconf(_SC_PAGESIZE)),
                          .bufs = bufs, .ctx = open_ctx(&e->mf->config, o), .threads = e->tls_n,
                          .cores = (int)sysconf(_SC_NPROCESSORS_ONLN),
                          .files = pi2_plan_container_touched(pi2_bundle_container(e->b)), .opts = &o->offload};
    rc = pi2_plan_memory_floor(&in, &m, err);
    pi2_plan_memory_free(&m);
    return rc;
}

int pi2_engine_open(pi2_engine **out, const pi2_engine_opts *o, pi2_err *err)
{
    *out = NULL;
    if (!o || !o->path)
        return pi2_err_set(err, PI2_EINVAL, "engine: no model path");
    pi2_engine *e = calloc(1, sizeof *e);
    if (!e)
        return pi2_err_set(err, PI2_ENOMEM, "out of memory");
    snprintf(e->path, sizeof e->path, "%s", o->path);
    int rc;
    pi2_plan_memory mem = {0};
    /* in memory, the weights are used in place from the mapping: 2 MiB pages
     * cut the TLB misses of streaming them every token (runtime/PERF.md) */
    pi2_bundle_open_opts bo = {
        .pubkey = o->pubkey, .allow_unsigned = o->trust_unsigned, .huge_pages = o->offload.mem_limit == 0};
    if ((rc = pi2_bundle_open(&e->b, o->path, &bo, err)) != 0) {
        /* A converted (not yet bundled) model fails the signature step
         * first; say what it is instead. */
        pi2_bundle *probe = NULL;
        pi2_bundle_open_opts po = {.allow_unsigned = true, .skip_signature = true};
        pi2_err pe = {0};
        if (pi2_bundle_open(&probe, o->path, &po, &pe) != 0 && strstr(pe.msg, "not a bundled model")) {
            pi2_err fresh = {0};
            *err = fresh;
            rc = pi2_err_set(err, pe.code, "%s", pe.msg);
        }
        pi2_bundle_close(probe);
        goto fail;
    }
    e->mf = pi2_bundle_manifest(e->b);
    e->bl = pi2_bundle_layout_get(e->b);
    e->threads = o->threads > 0 ? o->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    e->ahead = eng_l2_ahead(sysconf(_SC_LEVEL2_CACHE_SIZE));
    if (e->threads < 1)
        e->threads = 1;
    if (e->threads > 256)
        e->threads = 256;
    e->tls_n = e->threads; /* scratch for as many as asked; a plan may run fewer */
    if (o->offload.mem_limit > 0) {
        /* offloading: resident members read with O_DIRECT and hashed there */
        if ((rc = plan_floor(e, o, err)) != 0 || (rc = eng_ofl_load_resident(e, o, err)) != 0)
            goto fail;
    } else if ((rc = pi2_bundle_verify(e->b, !o->verify_ffn, NULL, err)) != 0) {
        goto fail;
    }
    e->d = e->mf->config;
    e->mode = e->mf->sparsity_mode;
    e->dense = o->dense || e->mode == PI2_MF_SPARSE_NONE;
    if (pi2_bundle_sig_status(e->b) == PI2_BUNDLE_SIG_VERIFIED) {
        uint8_t raw[PI2_SIGN_PUBKEY_LEN];
        char fp[17] = "?";
        if (o->pubkey && pi2_sign_key_raw_public(o->pubkey, raw, NULL) == 0)
            pi2_bundle_key_fingerprint(raw, fp);
        snprintf(e->sig, sizeof e->sig, "signed, verified with key %s", fp);
    } else {
        snprintf(e->sig, sizeof e->sig, "unsigned (trusted on request)");
    }
    if ((rc = check_model(e, err)) != 0)
        goto fail;
    const pi2_model_desc *d = &e->d;

    const pi2_ctr_member *tm = pi2_ctr_find(pi2_bundle_container(e->b), e->mf->tokenizer);
    if (!tm) {
        rc = pi2_err_set(err, PI2_ENOTFOUND, "%s: tokenizer member %s is missing", e->path, e->mf->tokenizer);
        goto fail;
    }
    char tname[4200];
    snprintf(tname, sizeof tname, "%s:%s", e->path, e->mf->tokenizer);
    /* offloading: from the copy read in, not the mapping's page cache */
    const uint8_t *tdata = e->res && tm->offset <= e->res_bytes && tm->size <= e->res_bytes - tm->offset
                               ? e->res + tm->offset
                               : tm->data;
    if ((rc = pi2_tok_load_mem(&e->tok, (const char *)tdata, (size_t)tm->size, tname, err)) != 0)
        goto fail;
    if (pi2_tok_vocab_size(e->tok) > d->vocab) {
        rc = pi2_err_set(err, PI2_ESHAPE, "%s: tokenizer has %d tokens, model vocab is %d", e->path,
                         pi2_tok_vocab_size(e->tok), d->vocab);
        goto fail;
    }

    int64_t D = d->hidden, qd = (int64_t)d->n_heads * d->head_dim, kvd = (int64_t)d->n_kv_heads * d->head_dim;
    if ((rc = bind_mat(e, &e->embed, PI2_T_EMBED, -1, d->vocab, D, err)) != 0)
        goto fail;
    if (d->tie_embeddings && !pi2_manifest_find_tensor(e->mf, PI2_T_LM_HEAD, -1, -1)) {
        e->head = e->embed; /* shared row tables: freed once, via embed */
        e->head_shared = true;
    } else if ((rc = bind_mat(e, &e->head, PI2_T_LM_HEAD, -1, d->vocab, D, err)) != 0) {
        goto fail;
    }
    if (e->embed.qt == PI2_QT_F32) {
        rc = unsupported(e, err, "f32 embeddings");
        goto fail;
    }
    if (!(e->out_norm = bind_vec(e, PI2_T_OUT_NORM, -1, D, err))) {
        rc = err->code;
        goto fail;
    }
    int E = pi2_desc_is_moe(d) ? d->n_experts : 1;
    if (!(e->layers = calloc((size_t)d->n_layers, sizeof *e->layers))) {
        rc = pi2_err_set(err, PI2_ENOMEM, "out of memory");
        goto fail;
    }
    for (int l = 0; l < d->n_layers; l++) {
        eng_layer *L = &e->layers[l];
        if (!(L->ffn = calloc((size_t)E, sizeof *L->ffn))) {
            rc = pi2_err_set(err, PI2_ENOMEM, "out of memory");
            goto fail;
        }
        if (!(L->attn_norm = bind_vec(e, PI2_T_ATTN_NORM, l, D, err)) ||
            !(L->ffn_norm = bind_vec(e, PI2_T_FFN_NORM, l, D, err))) {
            rc = err->code;
            goto fail;
        }
        if ((rc = bind_mat(e, &L->q, PI2_T_Q, l, qd, D, err)) || (rc = bind_mat(e, &L->k, PI2_T_K, l, kvd, D, err)) ||
            (rc = bind_mat(e, &L->v, PI2_T_V, l, kvd, D, err)) || (rc = bind_mat(e, &L->o, PI2_T_O, l, D, qd, err)))
            goto fail;
        if (pi2_desc_is_moe(d)) {
            eng_mat r;
            if ((rc = bind_mat(e, &r, PI2_T_ROUTER, l, d->n_experts, D, err)) != 0)
                goto fail;
            if (r.qt != PI2_QT_F32) {
                free_mat(&r);
                rc = unsupported(e, err, "quantized MoE router");
                goto fail;
            }
            L->router = r.f32;
        }
        for (int x = 0; x < E; x++)
            if ((rc = bind_ffn(e, &L->ffn[x], l, x, err)) != 0)
                goto fail;
    }
    if (!(e->inv_freq = pi2_malloc_array((size_t)d->head_dim, sizeof(float)))) {
        rc = pi2_err_set(err, PI2_ENOMEM, "out of memory");
        goto fail;
    }
    pi2_rope_inv_freq(d, 0, e->inv_freq); /* the reference's, rope_scaling included */

    /* dense decode bytes per token */
    uint64_t db = (uint64_t)e->head.rows * e->head.row_bytes + (uint64_t)D * 2; /* + embedding row */
    for (int l = 0; l < d->n_layers; l++) {
        const eng_layer *L = &e->layers[l];
        db += (uint64_t)L->q.rows * L->q.row_bytes + (uint64_t)L->k.rows * L->k.row_bytes +
              (uint64_t)L->v.rows * L->v.row_bytes + (uint64_t)L->o.rows * L->o.row_bytes;
        const eng_ffn *f = &L->ffn[0];
        uint64_t ffb = (uint64_t)f->n_ff * (f->gate.row_bytes + f->up.row_bytes + f->down.row_bytes);
        db += ffb * (uint64_t)(pi2_desc_is_moe(d) ? d->n_experts_used : 1);
    }
    e->dense_bytes = db;

    int ctx0 = open_ctx(d, o);
    pi2_plan_bufs bufs;
    if ((rc = pi2_engine_buffer_sizes(e->mf, e->bl, e->tls_n, &bufs, err)) != 0 ||
        (o->offload.mem_limit > 0 && (rc = plan_memory(e, o, ctx0, &bufs, &mem, err)) != 0))
        goto fail;
    if ((rc = pi2_pool_create(&e->pool, e->threads, err)) != 0)
        goto fail;
    if ((rc = pred_quantize_all(e, err)) != 0)
        goto fail;
    if ((rc = alloc_state(e, err)) != 0)
        goto fail;
    assert(e->buf_bytes == bufs.engine); /* the memory plan counted what was allocated */
    if ((rc = pi2_engine_set_ctx(e, ctx0, err)) != 0)
        goto fail;
    double macs = 0;
    for (int l = 0; l < d->n_layers; l++) {
        const eng_layer *L = &e->layers[l];
        macs += (double)D * (double)(L->q.rows + L->k.rows + L->v.rows) + (double)qd * (double)L->o.rows;
        macs += 3.0 * (double)D * d->n_ff * (pi2_desc_is_moe(d) ? d->n_experts_used : 1);
    }
    e->prefill_macs = macs;
    e->ffn = &eng_ffn_memory;
    if (o->offload.mem_limit > 0) {
        if ((rc = eng_ofl_open(e, o, &mem, err)) != 0)
            goto fail;
        e->ffn = &eng_ffn_flash;
    } else if (o->preload) {
        touch_job tj = {.c = pi2_bundle_container(e->b)};
        pi2_pool_run(e->pool, touch_fn, &tj);
        /* 4 KiB pages from the page cache: once more, read afresh */
        if ((e->rehuged = pi2_ctr_rehuge(tj.c, PI2_ENGINE_REHUGE_MIN)))
            pi2_pool_run(e->pool, touch_fn, &tj);
    }
    pi2_plan_memory_free(&mem);
    *out = e;
    return 0;
fail:
    pi2_plan_memory_free(&mem);
    pi2_engine_close(e);
    return rc ? rc : PI2_EINVAL;
}

void pi2_engine_close(pi2_engine *e)
{
    if (!e)
        return;
    eng_ofl_close(e);
    pi2_pool_free(e->pool);
    if (e->layers) {
        int E = pi2_desc_is_moe(&e->d) ? e->d.n_experts : 1;
        for (int l = 0; l < e->d.n_layers; l++) {
            eng_layer *L = &e->layers[l];
            free_mat(&L->q);
            free_mat(&L->k);
            free_mat(&L->v);
            free_mat(&L->o);
            for (int x = 0; L->ffn && x < E; x++) {
                free_mat(&L->ffn[x].gate);
                free_mat(&L->ffn[x].up);
                free_mat(&L->ffn[x].down);
                free(L->ffn[x].pq);
            }
            free(L->ffn);
        }
        free(e->layers);
    }
    free_mat(&e->embed);
    if (!e->head_shared)
        free_mat(&e->head);
    if (e->tls)
        for (int t = 0; t < e->tls_n; t++) {
            eng_tls *s = &e->tls[t];
            free(s->part);
            free(s->g);
            free(s->u);
            free(s->coef);
            free(s->pp);
            free(s->ps);
            free(s->pp2);
            free(s->ps2);
            free(s->gt);
            free(s->ut);
            free(s->list);
            free(s->list2);
            free(s->scores);
        }
    free(e->tls);
    free(e->kc);
    free(e->vc);
    free(e->x);
    free(e->xb);
    free(e->xb2);
    free(e->q);
    free(e->att);
    free(e->aqs);
    free(e->aq);
    free(e->asum);
    free(e->ph);
    free(e->phs);
    free(e->phq);
    free(e->phsum);
    free(e->pxs);
    free(e->pxq);
    free(e->pxsum);
    free(e->router_logits);
    free(e->chosen);
    free(e->sel);
    free(e->scores_all);
    free(e->dec_out);
    free((void *)e->share_rng);
    free(e->pred_n);
    free(e->moe_x);
    free(e->moe_out);
    free(e->moe_w);
    free(e->moe_tok);
    free(e->moe_wk);
    free(e->moe_prev);
    free(e->moe_guess);
    free(e->rope_cs);
    free(e->rope_sn);
    free(e->inv_freq);
    pi2_tok_free(e->tok);
    pi2_bundle_close(e->b);
    free(e->res);
    free(e);
}

const pi2_model_desc *pi2_engine_desc(const pi2_engine *e) { return &e->d; }
const pi2_tok *pi2_engine_tokenizer(const pi2_engine *e) { return e->tok; }
int pi2_engine_ctx(const pi2_engine *e) { return e->ctx; }
int pi2_engine_threads(const pi2_engine *e) { return e->threads; }
const char *pi2_engine_sparsity(const pi2_engine *e) { return pi2_manifest_mode_name(e->mode); }
void pi2_engine_set_dense(pi2_engine *e, bool dense) { e->dense = dense || e->mode == PI2_MF_SPARSE_NONE; }
bool pi2_engine_dense(const pi2_engine *e) { return e->dense; }
const char *pi2_engine_signature(const pi2_engine *e) { return e->sig; }
uint64_t pi2_engine_dense_bytes(const pi2_engine *e) { return e->dense_bytes; }
uint64_t pi2_engine_pred_bytes(const pi2_engine *e) { return e->pred_bytes; }

void pi2_engine_pages(const pi2_engine *e, uint64_t *mapped, uint64_t *huge, bool *redone)
{
    pi2_err pe = {0};
    *mapped = *huge = 0;
    *redone = e->rehuged;
    if (!e->ofl)
        pi2_ctr_mapped_bytes(pi2_bundle_container(e->b), mapped, huge, &pe); /* zeros when unknown */
}
void pi2_engine_stats_get(const pi2_engine *e, pi2_engine_stats *out) { *out = e->st; }
void pi2_engine_stats_reset(pi2_engine *e)
{
    memset(&e->st, 0, sizeof e->st);
    eng_ofl_stats_reset(e);
}

double pi2_engine_prefill_macs(const pi2_engine *e) { return e->prefill_macs; }

int pi2_engine_set_ctx(pi2_engine *e, int ctx, pi2_err *err)
{
    const pi2_model_desc *d = &e->d;
    if (ctx < 1 || ctx > pi2_desc_max_ctx(d))
        return pi2_err_set(err, PI2_ERANGE, "%s: context of %d positions is out of range (1..%d)", e->path, ctx,
                           pi2_desc_max_ctx(d));
    if (e->ofl && e->plan_ctx > 0 && ctx > e->plan_ctx)
        return pi2_err_set(err, PI2_ERANGE,
                           "%s: a context of %d positions exceeds the %d the memory plan was made for (the plan is "
                           "made at open)",
                           e->path, ctx, e->plan_ctx);
    size_t kv = (size_t)d->n_layers * (size_t)ctx * (size_t)d->n_kv_heads * (size_t)d->head_dim;
    float *kc = pi2_calloc_array(kv, sizeof(float)), *vc = pi2_calloc_array(kv, sizeof(float));
    float **sc = calloc((size_t)e->tls_n, sizeof *sc);
    bool ok = kc && vc && sc;
    for (int t = 0; ok && t < e->tls_n; t++)
        ok = (sc[t] = pi2_malloc_array((size_t)ctx * PI2_K_MAX_T, sizeof(float))) != NULL;
    if (!ok) {
        for (int t = 0; sc && t < e->tls_n; t++)
            free(sc[t]);
        free(sc);
        free(kc);
        free(vc);
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory for a KV cache of %d positions (%.1f MB)", e->path,
                           ctx, 2.0 * (double)kv * 4 / 1e6);
    }
    free(e->kc);
    free(e->vc);
    e->kc = kc;
    e->vc = vc;
    for (int t = 0; t < e->tls_n; t++) {
        free(e->tls[t].scores);
        e->tls[t].scores = sc[t];
    }
    free(sc);
    e->ctx = ctx;
    e->n_pos = 0;
    return 0;
}

int pi2_engine_prefill(pi2_engine *e, const int32_t *tokens, int n, int pos, float *logits, pi2_err *err)
{
    if (n < 1)
        return pi2_err_set(err, PI2_ERANGE, "%s: prefill of %d tokens", e->path, n);
    for (int i = 0; i < n; i += PI2_K_MAX_T) {
        int T = n - i < PI2_K_MAX_T ? n - i : PI2_K_MAX_T;
        int rc = eng_step_checked(e, eng_forward(e, tokens + i, T, pos + i, false, i + T == n ? logits : NULL, err),
                                  err);
        if (rc)
            return rc;
    }
    return 0;
}

int pi2_engine_decode(pi2_engine *e, int32_t token, int pos, float *logits, pi2_err *err)
{
    return eng_step_checked(e, eng_forward(e, &token, 1, pos, true, logits, err), err);
}
