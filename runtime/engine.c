/* pi2 engine: open a bundled container and build the model in place. */
#include "runtime/state.h"
#include "formats/jinja.h"
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

/* Row tables (16 bytes a row: 35 MB on an 8-expert model) count in the
 * engine's buffer total, as eng_acc_alloc's do. */
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
    const uint8_t *p = eng_member(e, t->payload, (uint64_t)rows * rb, err);
    if (!p)
        return err->code;
    if (t->qtype == PI2_QT_F32) {
        out->f32 = (const float *)(const void *)p;
        out->row_bytes = rb;
        return 0;
    }
    size_t sc = pi2_q_scale_row_count(t->qtype, cols);
    const uint16_t *s = (const uint16_t *)(const void *)eng_member(e, t->scales, (uint64_t)rows * sc * 2, err);
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
    return (const float *)(const void *)eng_member(e, t->payload, (uint64_t)n * 4, err);
}

/* FFN bf's payload member: in memory, its base in the mapping; offloading,
 * only checked (*base NULL: payload rows are pointed at the hot segment or
 * the cache later). */
static int ffn_payload(pi2_engine *e, const pi2_bl_ffn *bf, const uint8_t **base, pi2_err *err)
{
    *base = NULL;
    if (!e->res) {
        if (!(*base = eng_member(e, bf->ffn, (uint64_t)bf->groups * bf->slot_bytes, err)))
            return err->code;
        return 0;
    }
    const pi2_ctr_member *m = pi2_ctr_find(pi2_bundle_container(e->b), bf->ffn);
    if (!m || m->size != (uint64_t)bf->groups * bf->slot_bytes)
        return pi2_err_set(err, PI2_ESHAPE, "%s: FFN member %s is missing or of the wrong size", e->path, bf->ffn);
    return 0;
}

/* The row tables of f's gate, up and down; with base non-NULL, each
 * neuron's payload and scale rows where the bundle's layout put them
 * (offloading fills them as rows land: ofl_set_rows). */
static int ffn_rows(pi2_engine *e, eng_ffn *f, const pi2_bl_ffn *bf, int layer, int mex, const uint8_t *base,
                    pi2_err *err)
{
    const pi2_model_desc *d = &e->d;
    static const pi2_tname roles[3] = {PI2_T_GATE, PI2_T_UP, PI2_T_DOWN};
    eng_mat *mats[3] = {&f->gate, &f->up, &f->down};
    uint64_t rb = e->bl->row_bytes;
    for (int k = 0; k < 3; k++) {
        const pi2_mf_tensor *t = pi2_manifest_find_tensor(e->mf, roles[k], layer, mex);
        if (!t)
            return pi2_err_set(err, PI2_ENOTFOUND, "%s: no %s tensor for layer %d", e->path,
                               pi2_manifest_role_name(roles[k]), layer);
        if (t->qtype != e->mf->quant_ffn || t->rows != bf->neurons || t->cols != d->hidden)
            return pi2_err_set(err, PI2_ESHAPE, "%s: tensor %s is not [%u, %d] %s", e->path, t->name, bf->neurons,
                               d->hidden, pi2_q_type_name(e->mf->quant_ffn));
        eng_mat *m = mats[k];
        m->qt = t->qtype;
        m->rows = bf->neurons;
        m->cols = d->hidden;
        m->row_bytes = rb; /* payload and scales (the layout's R) */
        if (alloc_rows(e, m, err))
            return err->code;
        for (uint32_t i = 0; i < bf->neurons; i++)
            m->rs[i] = NULL;
    }
    for (uint32_t i = 0; base && i < bf->neurons; i++) {
        pi2_bl_rows at;
        pi2_bl_neuron_rows(bf, rb, e->bl->pay_bytes, e->bl->two_phase, i, &at);
        for (int k = 0; k < 3; k++) {
            mats[k]->rp[i] = base + at.pay[k];
            mats[k]->rs[i] = (const uint16_t *)(const void *)(base + at.sc[k]); /* even offset: aligned */
        }
    }
    return 0;
}

/* What picks f's neurons in the model's sparsity mode: its predictor
 * (q8/q4 members bound in place, f32/f16 ones given a Q8 copy to fill) or
 * its activation threshold. */
static int ffn_sparsity(pi2_engine *e, eng_ffn *f, const pi2_bl_ffn *bf, int layer, int mex, pi2_err *err)
{
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
            return eng_pred_bind(e, f, p, pi2_mf_pred_qtype(p->dtype), err);
        f->fc1 = eng_member(e, p->fc1, (uint64_t)p->rank * e->d.hidden * el, err);
        if (!f->fc1)
            return err->code;
        f->fc2 = eng_member(e, p->fc2, (uint64_t)p->rank * bf->neurons * el, err);
        if (!f->fc2)
            return err->code;
        if (eng_pred_alloc(e, f, err))
            return err->code;
    } else if (e->mode == PI2_MF_SPARSE_THRESHOLD) {
        if (!ml || !ml->has_silu_threshold)
            return pi2_err_set(err, PI2_ENOTFOUND, "%s: no activation threshold for layer %d", e->path, layer);
        f->has_silu_thr = true;
        f->silu_thr = ml->silu_threshold;
    }
    return 0;
}

/* FFN (layer, expert) as bundled: its payload, row tables and sparsity. */
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
    const uint8_t *base;
    int rc;
    if ((rc = ffn_payload(e, bf, &base, err)) != 0 || (rc = ffn_rows(e, f, bf, layer, mex, base, err)) != 0)
        return rc;
    return ffn_sparsity(e, f, bf, layer, mex, err);
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
    if (rc == 0 && (m->pred_stream != e->pred_stream || m->attn_stream != e->attn_stream))
        /* the floor's inputs are these: it cannot differ */
        rc = pi2_err_set(err, PI2_EINVAL, "%s: the plan streams other members than the floor did", e->path);
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
    int rc = pi2_engine_buffer_sizes(e->mf, e->bl, e->tls_n, e->kv_f16, &bufs, err);
    if (rc)
        return rc;
    pi2_plan_mem_in in = {.mf = e->mf, .bl = e->bl, .name = e->path,
                          .resident = pi2_plan_resident(e->mf, e->bl, (uint64_t)sysconf(_SC_PAGESIZE)),
                          .bufs = bufs, .ctx = open_ctx(&e->mf->config, o), .threads = e->tls_n,
                          .cores = (int)sysconf(_SC_NPROCESSORS_ONLN),
                          .files = pi2_plan_container_touched(pi2_bundle_container(e->b)), .opts = &o->offload};
    rc = pi2_plan_memory_floor(&in, &m, err);
    e->pred_stream = rc == 0 && m.pred_stream; /* the resident read leaves them out */
    e->attn_stream = rc == 0 ? m.attn_stream : 0;
    pi2_plan_memory_free(&m);
    return rc;
}

/* Open the bundle, its signature checked (o->pubkey, o->trust_unsigned);
 * a converted (not yet bundled) model is named as such. */
static int open_bundle(pi2_engine *e, const pi2_engine_opts *o, pi2_err *err)
{
    /* in memory, the weights are used in place from the mapping: 2 MiB pages
     * cut the TLB misses of streaming them every token (runtime/PERF.md) */
    pi2_bundle_open_opts bo = {
        .pubkey = o->pubkey, .allow_unsigned = o->trust_unsigned, .huge_pages = o->offload.mem_limit == 0};
    int rc = pi2_bundle_open(&e->b, o->path, &bo, err);
    if (rc)
        return pi2_bundle_open_failed(o->path, rc, err);
    e->mf = pi2_bundle_manifest(e->b);
    e->bl = pi2_bundle_layout_get(e->b);
    return 0;
}

/* The weights made ready to use: in memory, the mapping's hashes checked
 * (the FFNs' unless !o->verify_ffn); offloading, a limit below the floor
 * refused first, then the resident members read in with O_DIRECT and
 * hashed there. The threads asked for are set first: the floor counts
 * their buffers. */
static int ready_weights(pi2_engine *e, const pi2_engine_opts *o, pi2_err *err)
{
    e->threads = o->threads > 0 ? o->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    e->ahead = eng_l2_ahead(sysconf(_SC_LEVEL2_CACHE_SIZE));
    if (e->threads < 1)
        e->threads = 1;
    if (e->threads > 256)
        e->threads = 256;
    e->tls_n = e->threads; /* scratch for as many as asked; a plan may run fewer */
    int rc;
    if (o->offload.mem_limit > 0) {
        if ((rc = plan_floor(e, o, err)) != 0)
            return rc;
        return eng_ofl_load_resident(e, o, err);
    }
    return pi2_bundle_verify(e->b, !o->verify_ffn, NULL, err);
}

/* The model as the manifest describes it: shape, sparsity, the signature
 * line, checked against what the engine runs. */
static int describe_model(pi2_engine *e, const pi2_engine_opts *o, pi2_err *err)
{
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
    return check_model(e, err);
}

/* The tokenizer member, at most the model's vocabulary. */
static int load_tokenizer(pi2_engine *e, pi2_err *err)
{
    const pi2_ctr_member *tm = pi2_ctr_find(pi2_bundle_container(e->b), e->mf->tokenizer);
    if (!tm)
        return pi2_err_set(err, PI2_ENOTFOUND, "%s: tokenizer member %s is missing", e->path, e->mf->tokenizer);
    char tname[4200];
    snprintf(tname, sizeof tname, "%s:%s", e->path, e->mf->tokenizer);
    /* offloading: from the copy read in, not the mapping's page cache */
    const uint8_t *tdata = e->res && tm->offset <= e->res_bytes && tm->size <= e->res_bytes - tm->offset
                               ? e->res + tm->offset
                               : tm->data;
    int rc = pi2_tok_load_mem(&e->tok, (const char *)tdata, (size_t)tm->size, tname, err);
    if (rc)
        return rc;
    if (pi2_tok_vocab_size(e->tok) > e->d.vocab)
        return pi2_err_set(err, PI2_ESHAPE, "%s: tokenizer has %d tokens, model vocab is %d", e->path,
                           pi2_tok_vocab_size(e->tok), e->d.vocab);
    return 0;
}

/* The embedding, the head (the embedding's rows when tied and the model
 * has no head of its own) and the output norm. */
static int bind_ends(pi2_engine *e, pi2_err *err)
{
    const pi2_model_desc *d = &e->d;
    int rc = bind_mat(e, &e->embed, PI2_T_EMBED, -1, d->vocab, d->hidden, err);
    if (rc)
        return rc;
    if (d->tie_embeddings && !pi2_manifest_find_tensor(e->mf, PI2_T_LM_HEAD, -1, -1)) {
        e->head = e->embed; /* shared row tables: freed once, via embed */
        e->head_shared = true;
    } else if ((rc = bind_mat(e, &e->head, PI2_T_LM_HEAD, -1, d->vocab, d->hidden, err)) != 0) {
        return rc;
    }
    if (e->embed.qt == PI2_QT_F32)
        return unsupported(e, err, "f32 embeddings");
    if (!(e->out_norm = bind_vec(e, PI2_T_OUT_NORM, -1, d->hidden, err)))
        return err->code;
    return 0;
}

/* Layer l: its norms, attention, MoE router and FFNs (every expert's). */
static int bind_layer(pi2_engine *e, int l, pi2_err *err)
{
    const pi2_model_desc *d = &e->d;
    int64_t D = d->hidden, qd = (int64_t)d->n_heads * d->head_dim, kvd = (int64_t)d->n_kv_heads * d->head_dim;
    int E = pi2_desc_is_moe(d) ? d->n_experts : 1, rc;
    eng_layer *L = &e->layers[l];
    if (!(L->ffn = calloc((size_t)E, sizeof *L->ffn)))
        return pi2_err_set(err, PI2_ENOMEM, "out of memory");
    if (!(L->attn_norm = bind_vec(e, PI2_T_ATTN_NORM, l, D, err)) ||
        !(L->ffn_norm = bind_vec(e, PI2_T_FFN_NORM, l, D, err)))
        return err->code;
    if ((rc = bind_mat(e, &L->q, PI2_T_Q, l, qd, D, err)) || (rc = bind_mat(e, &L->k, PI2_T_K, l, kvd, D, err)) ||
        (rc = bind_mat(e, &L->v, PI2_T_V, l, kvd, D, err)) || (rc = bind_mat(e, &L->o, PI2_T_O, l, D, qd, err)))
        return rc;
    if (pi2_desc_is_moe(d)) {
        eng_mat r;
        if ((rc = bind_mat(e, &r, PI2_T_ROUTER, l, d->n_experts, D, err)) != 0)
            return rc;
        if (r.qt != PI2_QT_F32) {
            free_mat(&r);
            return unsupported(e, err, "quantized MoE router");
        }
        L->router = r.f32;
    }
    for (int x = 0; x < E; x++)
        if ((rc = bind_ffn(e, &L->ffn[x], l, x, err)) != 0)
            return rc;
    return 0;
}

/* Every tensor bound where it lies (row tables for the quantized ones),
 * and RoPE's frequencies. */
static int bind_model(pi2_engine *e, pi2_err *err)
{
    const pi2_model_desc *d = &e->d;
    int rc = bind_ends(e, err);
    if (rc)
        return rc;
    if (!(e->layers = calloc((size_t)d->n_layers, sizeof *e->layers)))
        return pi2_err_set(err, PI2_ENOMEM, "out of memory");
    for (int l = 0; l < d->n_layers; l++)
        if ((rc = bind_layer(e, l, err)) != 0)
            return rc;
    if (!(e->inv_freq = pi2_malloc_array((size_t)d->head_dim, sizeof(float))))
        return pi2_err_set(err, PI2_ENOMEM, "out of memory");
    pi2_rope_inv_freq(d, 0, e->inv_freq); /* the reference's, rope_scaling included */
    return 0;
}

/* The figures the tools report: the bytes dense decode reads a token, the
 * multiply-adds of one prefill token. */
static void count_work(pi2_engine *e)
{
    const pi2_model_desc *d = &e->d;
    int64_t D = d->hidden, qd = (int64_t)d->n_heads * d->head_dim;
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
    double macs = 0;
    for (int l = 0; l < d->n_layers; l++) {
        const eng_layer *L = &e->layers[l];
        macs += (double)D * (double)(L->q.rows + L->k.rows + L->v.rows) + (double)qd * (double)L->o.rows;
        macs += 3.0 * (double)D * d->n_ff * (pi2_desc_is_moe(d) ? d->n_experts_used : 1);
    }
    e->prefill_macs = macs;
}

/* The buffers the plan counted (bufs->engine), allocated, and the KV
 * cache of ctx positions. */
static int alloc_buffers(pi2_engine *e, const pi2_plan_bufs *bufs, int ctx, pi2_err *err)
{
    int rc = eng_alloc_state(e, err);
    if (rc)
        return rc;
    assert(e->buf_bytes == bufs->engine); /* the memory plan counted what was allocated */
    (void)bufs;
    return pi2_engine_set_ctx(e, ctx, err);
}

/* Where the FFNs are computed: from flash under the plan (mem), or in
 * memory, the mapping read through once (o->preload) so the first tokens
 * do not fault it in. */
static int start_ffn_source(pi2_engine *e, const pi2_engine_opts *o, pi2_plan_memory *mem, pi2_err *err)
{
    e->ffn = &eng_ffn_memory;
    if (o->offload.mem_limit > 0) {
        int rc = eng_ofl_open(e, o, mem, err);
        if (rc)
            return rc;
        e->ffn = &eng_ffn_flash;
    } else if (o->preload) {
        touch_job tj = {.c = pi2_bundle_container(e->b)};
        pi2_pool_run(e->pool, touch_fn, &tj);
        /* 4 KiB pages from the page cache: once more, read afresh */
        if ((e->rehuged = pi2_ctr_rehuge(tj.c, PI2_ENGINE_REHUGE_MIN)))
            pi2_pool_run(e->pool, touch_fn, &tj);
    }
    return 0;
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
    e->kv_f16 = o->kv_f16;
    pi2_plan_memory mem = {0};
    pi2_plan_bufs bufs;
    int rc, ctx0;
    if ((rc = open_bundle(e, o, err)) != 0 || (rc = ready_weights(e, o, err)) != 0 ||
        (rc = describe_model(e, o, err)) != 0 || (rc = load_tokenizer(e, err)) != 0 ||
        (rc = bind_model(e, err)) != 0)
        goto fail;
    /* offloading: the memory plan, made before anything else is allocated,
     * so the pool starts with the plan's threads */
    ctx0 = open_ctx(&e->d, o);
    if ((rc = pi2_engine_buffer_sizes(e->mf, e->bl, e->tls_n, e->kv_f16, &bufs, err)) != 0 ||
        (o->offload.mem_limit > 0 && (rc = plan_memory(e, o, ctx0, &bufs, &mem, err)) != 0))
        goto fail;
    if ((rc = pi2_pool_create(&e->pool, e->threads, err)) != 0 || (rc = eng_pred_quantize_all(e, err)) != 0 ||
        (rc = alloc_buffers(e, &bufs, ctx0, err)) != 0)
        goto fail;
    count_work(e);
    if ((rc = start_ffn_source(e, o, &mem, err)) != 0)
        goto fail;
    pi2_plan_memory_free(&mem);
    *out = e;
    return 0;
fail:
    pi2_plan_memory_free(&mem);
    pi2_engine_close(e);
    return rc ? rc : PI2_EINVAL;
}

/* The row tables of every bound matrix and the predictors' Q8 copies. */
static void free_layers(pi2_engine *e)
{
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
}

void pi2_engine_close(pi2_engine *e)
{
    if (!e)
        return;
    eng_ofl_close(e);
    pi2_pool_free(e->pool);
    free_layers(e);
    eng_free_state(e);
    free(e->kc);
    free(e->vc);
    free(e->inv_freq);
    pi2_tok_free(e->tok);
    pi2_bundle_close(e->b);
    free(e->res);
    free(e);
}

const pi2_model_desc *pi2_engine_desc(const pi2_engine *e) { return &e->d; }
const pi2_tok *pi2_engine_tokenizer(const pi2_engine *e) { return e->tok; }

int pi2_engine_chat_config(const pi2_engine *e, pi2_chat_config *cc, pi2_err *err)
{
    memset(cc, 0, sizeof *cc);
    if (!e->mf->chat_template[0])
        return pi2_err_set(err, PI2_ENOTFOUND, "%s: the model keeps no chat template", e->path);
    const pi2_ctr_member *m = pi2_ctr_find(pi2_bundle_container(e->b), e->mf->chat_template);
    if (!m)
        return pi2_err_set(err, PI2_ENOTFOUND, "%s: member %s is missing", e->path, e->mf->chat_template);
    const uint8_t *p = eng_member(e, m->name, m->size, err);
    if (!p)
        return err->code;
    char name[600];
    snprintf(name, sizeof name, "%.400s:%.150s", e->path, m->name);
    return pi2_jinja_config_parse((const char *)p, (size_t)m->size, name, cc, err);
}
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
    /* fp16: each thread's unit's rows as f32 (a token's blocks of ENG_KV_BLOCK <= ctx rows fit too) */
    size_t es = e->kv_f16 ? sizeof(uint16_t) : sizeof(float), rows = e->kv_f16 ? 2 * (size_t)ctx * d->head_dim : 0;
    void *kc = pi2_calloc_array(kv, es), *vc = pi2_calloc_array(kv, es);
    float **sc = calloc((size_t)e->tls_n, sizeof *sc), **kr = calloc((size_t)e->tls_n, sizeof *kr);
    bool ok = kc && vc && sc && kr;
    for (int t = 0; ok && t < e->tls_n; t++)
        ok = (sc[t] = pi2_malloc_array((size_t)ctx * PI2_K_MAX_T, sizeof(float))) != NULL &&
             (!rows || (kr[t] = pi2_malloc_array(rows, sizeof(float))) != NULL);
    if (!ok) {
        for (int t = 0; sc && kr && t < e->tls_n; t++) {
            free(sc[t]);
            free(kr[t]);
        }
        free(sc);
        free(kr);
        free(kc);
        free(vc);
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory for a KV cache of %d positions (%.1f MB)", e->path,
                           ctx, 2.0 * (double)kv * (double)es / 1e6);
    }
    free(e->kc);
    free(e->vc);
    e->kc = kc;
    e->vc = vc;
    for (int t = 0; t < e->tls_n; t++) {
        free(e->tls[t].scores);
        e->tls[t].scores = sc[t];
        free(e->tls[t].kvrows);
        e->tls[t].kvrows = kr[t];
    }
    free(sc);
    free(kr);
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
