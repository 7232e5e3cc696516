/* pi2 engine: what it holds — the container's members where they live
 * (the mapping, or the resident region read into memory), and its
 * activation and thread buffers, allocated at open and counted beforehand
 * for the memory plan (the two must agree). */
#include "runtime/state.h"
#include "runtime/ffn.h"
#include "runtime/offload/offload.h"
#include "runtime/planner.h"

#include <stdlib.h>
#include <string.h>

/* The member named `name`, exactly `size` bytes. */
const uint8_t *eng_member(const pi2_engine *e, const char *name, uint64_t size, pi2_err *err)
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

/* pi2_malloc_array that adds the bytes to the engine's buffer total (the
 * memory plan of offloading counts them). */
void *eng_acc_alloc(pi2_engine *e, size_t n, size_t size)
{
    e->buf_bytes += (uint64_t)n * size;
    return pi2_malloc_array(n, size);
}

/* A predictor's scratch (eng_pred_buf) for inputs of D values and hidden
 * layers of up to mr (a multiple of PI2_Q_GROUP): its bytes, as
 * pred_buf_alloc adds them. */
static uint64_t pred_buf_bytes(uint64_t D, uint64_t mr, uint64_t ff)
{
    uint64_t G = PI2_Q_GROUP;
    return mr * 4 + mr / G * 4 + mr + mr / G * 4 + D / G * 4 + D + D / G * 4 + ff * 4 +
           (ff + ENG_PRED_UNIT - 1) / ENG_PRED_UNIT * 4;
}

static bool pred_buf_alloc(pi2_engine *e, eng_pred_buf *b, size_t D, size_t mr)
{
    size_t G = PI2_Q_GROUP, ff = (size_t)e->d.n_ff;
    b->h = eng_acc_alloc(e, mr, sizeof(float));
    b->hs = eng_acc_alloc(e, mr / G, sizeof(float));
    b->hq = eng_acc_alloc(e, mr, 1);
    b->hsum = eng_acc_alloc(e, mr / G, sizeof(int32_t));
    b->xs = eng_acc_alloc(e, D / G, sizeof(float));
    b->xq = eng_acc_alloc(e, D, 1);
    b->xsum = eng_acc_alloc(e, D / G, sizeof(int32_t));
    b->scores = eng_acc_alloc(e, ff, sizeof(float));
    b->n = eng_acc_alloc(e, (ff + ENG_PRED_UNIT - 1) / ENG_PRED_UNIT, sizeof *b->n);
    return b->h && b->hs && b->hq && b->hsum && b->xs && b->xq && b->xsum && b->scores && b->n;
}

static void pred_buf_free(eng_pred_buf *b)
{
    free(b->h);
    free(b->hs);
    free(b->hq);
    free(b->hsum);
    free(b->xs);
    free(b->xq);
    free(b->xsum);
    free(b->scores);
    free(b->n);
}

int eng_alloc_state(pi2_engine *e, pi2_err *err)
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
    e->x = eng_acc_alloc(e, T * D, sizeof(float));
    e->xb = eng_acc_alloc(e, T * (size_t)e->max_in, sizeof(float));
    e->xb2 = eng_acc_alloc(e, T * D, sizeof(float));
    e->q = eng_acc_alloc(e, T * (qd + 2 * kvd), sizeof(float));
    e->att = eng_acc_alloc(e, T * qd, sizeof(float));
    e->aqs = eng_acc_alloc(e, T * (size_t)e->max_in / PI2_Q_GROUP, sizeof(float));
    e->aq = eng_acc_alloc(e, T * (size_t)e->max_in, 1);
    e->asum = eng_acc_alloc(e, T * (size_t)e->max_in / PI2_Q_GROUP, sizeof(int32_t));
    max_rank = (max_rank + PI2_Q_GROUP - 1) / PI2_Q_GROUP * PI2_Q_GROUP;
    bool pb_ok = true;
    for (int i = 0; i < 2; i++)
        pb_ok = pred_buf_alloc(e, &e->pb[i], D, (size_t)max_rank) && pb_ok;
    e->router_logits = eng_acc_alloc(e, (size_t)(E > 0 ? E : 1) * T, sizeof(float));
    e->chosen = eng_acc_alloc(e, (size_t)(E > 0 ? E : 1) * T, sizeof(int));
    e->sel = eng_acc_alloc(e, (size_t)d->n_ff, sizeof(uint32_t));
    e->dec_out = eng_acc_alloc(e, ((size_t)d->n_ff + FFN_CHUNK - 1) / FFN_CHUNK * D, sizeof(float));
    e->share_rng = eng_acc_alloc(e, (size_t)e->tls_n, sizeof *e->share_rng);
    e->moe_x = eng_acc_alloc(e, T * D, sizeof(float));
    e->moe_out = eng_acc_alloc(e, T * D, sizeof(float));
    e->moe_w = eng_acc_alloc(e, T, sizeof(float));
    e->moe_tok = eng_acc_alloc(e, T, sizeof(int));
    e->moe_wk = eng_acc_alloc(e, T * (size_t)(E > 0 ? E : 1), sizeof(float));
    size_t K = pi2_desc_is_moe(d) ? (size_t)d->n_experts_used : 1;
    e->moe_prev = eng_acc_alloc(e, (size_t)d->n_layers * K, sizeof(int));
    e->moe_guess = eng_acc_alloc(e, (size_t)d->n_layers * K, sizeof(int));
    e->moe_prev_pos = -1;
    e->rope_cs = eng_acc_alloc(e, T * (size_t)d->head_dim / 2, sizeof(float));
    e->rope_sn = eng_acc_alloc(e, T * (size_t)d->head_dim / 2, sizeof(float));
    e->tls = calloc((size_t)e->tls_n, sizeof *e->tls);
    e->buf_bytes += (uint64_t)e->tls_n * sizeof *e->tls;
    if (!e->x || !e->xb || !e->xb2 || !e->q || !e->att || !e->aqs || !e->aq || !e->asum ||
        !pb_ok || !e->router_logits || !e->chosen || !e->sel || !e->dec_out || !e->share_rng || !e->moe_x ||
        !e->moe_out || !e->moe_w || !e->moe_tok || !e->moe_wk || !e->moe_prev || !e->moe_guess || !e->rope_cs ||
        !e->rope_sn || !e->tls)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory for the KV cache (%d positions) and buffers", e->path,
                           e->ctx);
    for (size_t i = 0; i < (size_t)d->n_layers * K; i++)
        e->moe_guess[i] = -1;
    for (int t = 0; t < e->tls_n; t++) {
        eng_tls *s = &e->tls[t];
        size_t ff = (size_t)d->n_ff;
        s->part = t == 0 ? eng_acc_alloc(e, T * ENG_PART_LD(D), sizeof(float)) : NULL; /* the prefill FFN's sum */
        s->g = eng_acc_alloc(e, 2 * ff, sizeof(float)); /* dense decode: gate and up results side by side */
        s->u = eng_acc_alloc(e, ff, sizeof(float));
        s->coef = eng_acc_alloc(e, ff, sizeof(float));
        s->pp = eng_acc_alloc(e, 2 * ff, sizeof *s->pp);
        s->ps = eng_acc_alloc(e, 2 * ff, sizeof *s->ps);
        s->pp2 = eng_acc_alloc(e, ff, sizeof *s->pp2);
        s->ps2 = eng_acc_alloc(e, ff, sizeof *s->ps2);
        s->gt = eng_acc_alloc(e, T * ENG_TILE, sizeof(float));
        s->ut = eng_acc_alloc(e, T * ENG_TILE, sizeof(float));
        s->list = eng_acc_alloc(e, ff, sizeof(uint32_t));
        s->list2 = eng_acc_alloc(e, ff, sizeof(uint32_t));
        if ((t == 0 && !s->part) || !s->g || !s->u || !s->coef || !s->pp || !s->ps || !s->pp2 || !s->ps2 ||
            !s->gt || !s->ut || !s->list || !s->list2)
            return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory for thread buffers", e->path);
    }
    return 0;
}

void eng_free_state(pi2_engine *e)
{
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
            free(s->kvrows);
        }
    free(e->tls);
    free(e->x);
    free(e->xb);
    free(e->xb2);
    free(e->q);
    free(e->att);
    free(e->aqs);
    free(e->aq);
    free(e->asum);
    for (int i = 0; i < 2; i++)
        pred_buf_free(&e->pb[i]);
    free(e->router_logits);
    free(e->chosen);
    free(e->sel);
    free(e->dec_out);
    free((void *)e->share_rng);
    free(e->moe_x);
    free(e->moe_out);
    free(e->moe_w);
    free(e->moe_tok);
    free(e->moe_wk);
    free(e->moe_prev);
    free(e->moe_guess);
    free(e->rope_cs);
    free(e->rope_sn);
}

/* Row tables of a bound matrix (alloc_rows): quantized ones only. */
static uint64_t rows_bytes(const pi2_mf_tensor *t, int64_t rows)
{
    return t && t->qtype != PI2_QT_F32 ? (uint64_t)rows * (sizeof(const uint8_t *) + sizeof(const uint16_t *)) : 0;
}

/* What bind_mat, bind_ffn, eng_pred_alloc and eng_alloc_state add to buf_bytes for
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
            continue; /* q8/q4 members are used in place (eng_pred_bind): no copy */
        n += R * D + b->neurons * Rp + 2 * (R * (D / PI2_Q_GROUP) + b->neurons * (Rp / PI2_Q_GROUP));
    }
    uint64_t mi = D > qd ? D : qd, mr = ((uint64_t)max_rank + PI2_Q_GROUP - 1) / PI2_Q_GROUP * PI2_Q_GROUP;
    uint64_t G = PI2_Q_GROUP;
    n += T * D * f * 3 + T * mi * f + T * (qd + 2 * kvd) * f + T * qd * f; /* x, xb2, moe_x, xb, q, att */
    n += T * mi / G * f + T * mi + T * mi / G * 4;                           /* aqs, aq, asum */
    n += 2 * pred_buf_bytes(D, mr, ff);
    n += E * T * f + E * T * sizeof(int) + ff * 4 + (ff + FFN_CHUNK - 1) / FFN_CHUNK * D * f;
    n += (uint64_t)tls * sizeof(uint64_t);
    n += T * D * f + T * f + T * sizeof(int) + T * E * f + 2 * (uint64_t)d->n_layers * K * sizeof(int);
    n += 2 * T * ((uint64_t)d->head_dim / 2) * f;
    n += (uint64_t)tls * sizeof(eng_tls);
    n += T * ENG_PART_LD(D) * f; /* thread 0's: the prefill FFN's sum */
    n += (uint64_t)tls * (2 * ff * f + 2 * ff * f + 4 * ff * sizeof(void *) + 2 * ff * sizeof(void *) +
                          2 * T * ENG_TILE * f + 2 * ff * 4);
    return n;
}

int pi2_engine_buffer_sizes(const pi2_manifest *mf, const pi2_bundle_layout *bl, int threads, bool kv_f16,
                            pi2_plan_bufs *out, pi2_err *err)
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
    out->kv_elem = kv_f16 ? sizeof(uint16_t) : sizeof(float);
    /* per position: the keys and values, each thread's scores and (fp16)
     * each thread's unit's keys and values as f32 (eng_tls.kvrows) */
    out->per_pos = 2ull * (uint64_t)d->n_layers * (uint64_t)d->n_kv_heads * (uint64_t)d->head_dim * out->kv_elem +
                   (uint64_t)threads * PI2_K_MAX_T * sizeof(float) +
                   (kv_f16 ? (uint64_t)threads * 2 * (uint64_t)d->head_dim * sizeof(float) : 0);
    out->chunk = FFN_CHUNK;
    return 0;
}
