/* Tests for pi2-convert: the quantized model (exported back to F32) decodes
 * the golden texts of the shared TinyStories model; predictors trained on the
 * real dReLU model and on a generated one, and predictors imported from a
 * checkpoint, reach the recall target; the SiLU threshold mode; the
 * activation profile; the container's integrity (every section's SHA-256);
 * and every bad input, which must fail with its exact code, a message naming
 * the culprit, and nothing left behind. */
#include "tests/testmodel.h"
#include "tests/testutil.h"
#include "tests/testjson.h"

#include <dirent.h>
#include <jansson.h>
#include <math.h>

#include "convert/convert.h"
#include "convert/synth.h"
#include "formats/container.h"
#include "formats/manifest.h"
#include "formats/safetensors.h"
#include "runtime/reference.h"
#include "runtime/sample.h"

/* ------------------------------------------------------------------ */
/* Helpers                                                            */
/* ------------------------------------------------------------------ */

static void opts_for(pi2_convert_opts *o, const char *model, const char *out, int calib_tokens)
{
    pi2_convert_defaults(o);
    o->model_dir = model;
    o->out_path = out;
    o->calib_tokens = calib_tokens;
    o->quiet = true;
    o->force = true; /* tests convert again into the same file (the output rule: tests/e2e_faults.sh) */
}

static void convert_ok(const pi2_convert_opts *o, FILE *report)
{
    pi2_err e = {0};
    double t0 = pi2_now();
    int rc = pi2_convert(o, report, &e);
    if (rc)
        fail_msg("pi2_convert %s: %s (%s)", o->model_dir, e.msg, pi2_strerror(rc));
    fprintf(stderr, "  [converted %s in %.1f s]\n", o->model_dir, pi2_now() - t0);
}

/* Open a converted model and parse its manifest. The container must hold
 * exactly the manifest's sections plus manifest.json (last), each section at
 * the recorded offset and size with a verifying SHA-256. Caller closes both. */
static void open_converted(const char *path, pi2_ctr **c, pi2_manifest **mf)
{
    pi2t_open_manifest(path, c, mf);
    pi2_err e = {0};
    const pi2_manifest *f = *mf;
    assert_int_equal(f->kind, PI2_MF_CONVERTED);
    assert_null(f->bundle_json);
    size_t n = pi2_ctr_count(*c);
    assert_int_equal(n, f->n_sections + 1);
    assert_string_equal(pi2_ctr_at(*c, n - 1)->name, PI2_MF_NAME);
    for (size_t i = 0; i < f->n_sections; i++) {
        const pi2_ctr_section *s = &f->sections[i];
        const pi2_ctr_member *mm = pi2_ctr_find(*c, s->name);
        if (!mm)
            fail_msg("%s: section %s not in the container", path, s->name);
        assert_int_equal(mm->offset, s->offset);
        assert_int_equal(mm->size, s->size);
        if (pi2_ctr_verify_member(*c, mm, s->sha256, &e))
            fail_msg("%s", e.msg);
    }
    assert_non_null(pi2_ctr_find(*c, f->tokenizer));
}

static const pi2_ctr_member *member(const pi2_ctr *c, const char *name)
{
    const pi2_ctr_member *m = pi2_ctr_find(c, name);
    if (!m)
        fail_msg("member %s missing", name);
    return m;
}

/* Generated model: the "tiny" preset, or (wide) hidden 128, ff 512, 4 layers. */
static void make_synth(const char *dir, bool wide, bool predictors)
{
    pi2_synth_opts o;
    pi2_err e = {0};
    assert_int_equal(pi2_synth_preset("tiny", &o, &e), 0);
    if (wide) {
        o.desc.hidden = 128;
        o.desc.head_dim = 32;
        o.desc.n_heads = 4;
        o.desc.n_kv_heads = 2;
        o.desc.n_ff = 512;
        o.desc.n_layers = 4;
    }
    o.predictors = predictors;
    o.threads = 2;
    if (pi2_synth_write(dir, &o, NULL, NULL, &e))
        fail_msg("%s", e.msg);
}


/* A stored predictor member holds the source tensor's values as fp16,
 * bit for bit what pi2_f32_to_f16 makes of them. */
static void expect_f16_of(const pi2_ctr_member *m, const pi2_st_tensor *t)
{
    assert_int_equal(m->size, t->nelem * 2);
    for (size_t i = 0; i < t->nelem; i++) {
        uint16_t h;
        memcpy(&h, m->data + 2 * i, 2);
        if (h != pi2_f32_to_f16(pi2_st_get_f32(t, i)))
            fail_msg("%s[%zu]: stored %04x, expected the fp16 of %g", t->name, i, h, (double)pi2_st_get_f32(t, i));
    }
}

/* The predictor entries of a converted model: recall at the target and a
 * predicted-active share at most twice the true one, in every layer. */
static void check_predictors(const pi2_ctr *c, const pi2_manifest *mf, bool imported, const char *tag)
{
    const pi2_model_desc *d = &mf->config;
    assert_int_equal(mf->sparsity_mode, PI2_MF_SPARSE_PREDICTOR);
    assert_true(fabs(mf->recall_target - 0.99) < 1e-12);
    assert_true(isnan(mf->threshold_sparsity));
    assert_int_equal(mf->n_layers, (size_t)d->n_layers);
    for (int l = 0; l < d->n_layers; l++) {
        const pi2_mf_layer *L = &mf->layers[l];
        assert_int_equal(L->layer, l);
        assert_int_equal(L->expert, -1);
        assert_true(L->has_predictor);
        assert_false(L->has_silu_threshold);
        const pi2_mf_predictor *p = &L->predictor;
        const pi2_pred_report *r = &p->report;
        fprintf(stderr,
                "  %s layer %d: rank %d  threshold %.4g  recall %.4f  precision %.3f  predicted active %.4f  "
                "true active %.4f  ratio %.2f  (%zu samples)\n",
                tag, l, p->rank, (double)p->threshold, r->recall, r->precision, r->pred_active_frac,
                r->true_active_frac, r->pred_active_frac / r->true_active_frac, r->n_eval);
        assert_int_equal(p->imported, imported);
        assert_int_equal(r->rank, p->rank);
        assert_true(r->threshold == p->threshold); /* figures at the stored threshold */
        assert_true(r->n_eval > 0);
        assert_true(r->true_active_frac > 0.0);
        if (!(r->recall >= 0.99))
            fail_msg("%s layer %d: recall %.6f below the 0.99 target", tag, l, r->recall);
        if (!(r->pred_active_frac <= 2.0 * r->true_active_frac))
            fail_msg("%s layer %d: predicted active %.4f more than twice the true %.4f", tag, l,
                     r->pred_active_frac, r->true_active_frac);
        /* stored as fp16; published predictors read the pre-norm residual */
        assert_int_equal(p->dtype, PI2_MF_PRED_F16);
        assert_int_equal(p->input, imported ? PI2_PRED_IN_PRENORM : PI2_CONV_TRAIN_INPUT);
        assert_int_equal(member(c, p->fc1)->size, (uint64_t)p->rank * (uint64_t)d->hidden * 2);
        assert_int_equal(member(c, p->fc2)->size, (uint64_t)d->n_ff * (uint64_t)p->rank * 2);
    }
}

/* Token sequences the calibration never saw: the golden cases of a shared
 * model (BOS + prompt + expected continuation), random ids, or text the
 * model samples from another seed. */
typedef struct seqs {
    int *tok[8];
    size_t len[8];
    size_t n;
    const char *kind; /* for messages */
    bool sample;      /* tokens after BOS are sampled from the model as it runs */
    uint64_t seed;
} seqs;

static void seqs_golden(seqs *q, const char *model_dir)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/EXPECTED.json", model_dir);
    json_t *exp = load_json(path);
    json_t *cases = json_object_get(exp, "cases");
    memset(q, 0, sizeof *q);
    q->kind = "golden texts";
    for (size_t ci = 0; ci < json_array_size(cases) && q->n < 8; ci++) {
        json_t *cs = json_array_get(cases, ci);
        json_t *pr = json_object_get(cs, "prompt_ids"), *gen = json_object_get(cs, "generated_ids");
        size_t np = json_array_size(pr), ng = json_array_size(gen), k = 0;
        int *t = malloc((1 + np + ng) * sizeof *t);
        assert_non_null(t);
        t[k++] = 1; /* BOS */
        for (size_t i = 0; i < np; i++)
            t[k++] = jint(pr, i);
        for (size_t i = 0; i < ng; i++)
            t[k++] = jint(gen, i);
        q->tok[q->n] = t;
        q->len[q->n++] = k;
    }
    json_decref(exp);
}

static void seqs_random(seqs *q, int vocab, size_t n, size_t len, uint64_t seed)
{
    pi2_rng rng;
    pi2_rng_seed(&rng, seed);
    memset(q, 0, sizeof *q);
    q->kind = "random ids";
    for (; q->n < n && q->n < 8; q->n++) {
        int *t = malloc(len * sizeof *t);
        assert_non_null(t);
        t[0] = 1;
        for (size_t i = 1; i < len; i++)
            t[i] = 3 + (int)(pi2_rng_u64(&rng) % (uint64_t)(vocab - 3));
        q->tok[q->n] = t;
        q->len[q->n] = len;
    }
}

/* Text the model writes itself (temperature 1, top-p 0.95, as the
 * calibration text is made) but from another seed. */
static void seqs_sampled(seqs *q, size_t n, size_t len, uint64_t seed)
{
    memset(q, 0, sizeof *q);
    q->kind = "sampled";
    q->sample = true;
    q->seed = seed;
    for (; q->n < n && q->n < 8; q->n++) {
        q->tok[q->n] = calloc(len, sizeof *q->tok[q->n]);
        assert_non_null(q->tok[q->n]);
        q->tok[q->n][0] = 1;
        q->len[q->n] = len;
    }
}

static void seqs_free(seqs *q)
{
    for (size_t i = 0; i < q->n; i++)
        free(q->tok[i]);
}

/* Out-of-sample check: the stored predictors (container weights, stored
 * threshold) against the source model's true activations on token
 * sequences the calibration never saw. The report's recall is measured on
 * the samples the threshold was calibrated on, so it meets the target by
 * construction; this is the figure that says whether the predictors
 * generalise. Prints per-layer recall and predicted/true active shares and
 * asserts recall >= min_recall. */
#define UNSEEN_MAX_LAYERS 16
#define UNSEEN_RECALL 0.95 /* loose: a few hundred tokens */

typedef struct unseen_ctx {
    pi2_predictor *p[UNSEEN_MAX_LAYERS];
    pi2_pred_input input[UNSEEN_MAX_LAYERS];
    const pi2_ref_state *s; /* for the residual (pre-norm predictors) */
    int n_ff;
    uint64_t *bits;
    long long true_pos[UNSEEN_MAX_LAYERS], active[UNSEEN_MAX_LAYERS], predicted[UNSEEN_MAX_LAYERS],
        entries[UNSEEN_MAX_LAYERS];
} unseen_ctx;

static void unseen_hook(void *ctx, int layer, int expert, const float *x, const float *act)
{
    unseen_ctx *u = ctx;
    (void)expert;
    const float *in = u->input[layer] == PI2_PRED_IN_PRENORM ? pi2_ref_state_residual(u->s) : x;
    assert_true(pi2_pred_predict(u->p[layer], in, u->bits) >= 0);
    for (int i = 0; i < u->n_ff; i++) {
        bool pred = (u->bits[i / 64] >> (i % 64)) & 1, truth = act[i] != 0.0f;
        u->true_pos[layer] += pred && truth;
        u->active[layer] += truth;
        u->predicted[layer] += pred;
    }
    u->entries[layer] += u->n_ff;
}

/* A predictor member's weights as f32 (caller frees). */
static float *pred_f32(const pi2_ctr_member *m, pi2_mf_pdtype dt)
{
    size_t el = pi2_mf_pred_elem(dt), n = (size_t)m->size / el;
    float *w = malloc(n * sizeof *w);
    assert_non_null(w);
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        if (el == 2) {
            memcpy(&h, m->data + 2 * i, 2);
            w[i] = pi2_f16_to_f32(h);
        } else {
            memcpy(&w[i], m->data + 4 * i, 4);
        }
    }
    return w;
}

static void check_unseen(const char *model_dir, const pi2_ctr *c, const pi2_manifest *mf, const seqs *q,
                         double min_recall, const char *tag)
{
    const pi2_model_desc *d = &mf->config;
    assert_true(d->n_layers <= UNSEEN_MAX_LAYERS);
    pi2_err e = {0};
    unseen_ctx u = {.n_ff = d->n_ff};
    u.bits = calloc(((size_t)d->n_ff + 63) / 64, sizeof *u.bits);
    assert_non_null(u.bits);
    for (int l = 0; l < d->n_layers; l++) {
        const pi2_mf_predictor *p = &mf->layers[l].predictor;
        float *fc1 = pred_f32(member(c, p->fc1), p->dtype), *fc2 = pred_f32(member(c, p->fc2), p->dtype);
        if (pi2_pred_create(&u.p[l], d->hidden, d->n_ff, p->rank, fc1, fc2, p->threshold, &e))
            fail_msg("%s", e.msg);
        u.input[l] = p->input;
        free(fc1);
        free(fc2);
    }
    pi2_ref_model *m = NULL;
    if (pi2_ref_open(&m, model_dir, &e))
        fail_msg("%s", e.msg);
    float *logits = malloc(sizeof(float) * (size_t)d->vocab);
    assert_non_null(logits);
    pi2_sampler *smp = NULL;
    pi2_sample_opts so = {.temperature = 1.0f, .top_k = 0, .top_p = 0.95f, .seed = q->seed};
    if (q->sample)
        assert_int_equal(pi2_sampler_create(&smp, d->vocab, &so, &e), 0);
    size_t total = 0;
    for (size_t k = 0; k < q->n; k++) {
        pi2_ref_state *s = NULL;
        assert_int_equal(pi2_ref_state_create(&s, m, (int)q->len[k], &e), 0);
        pi2_ref_state_set_hook(s, unseen_hook, &u);
        u.s = s;
        for (size_t i = 0; i < q->len[k]; i++) {
            assert_int_equal(pi2_ref_forward(m, s, q->tok[k][i], (int)i, logits, &e), 0);
            if (smp && i + 1 < q->len[k])
                q->tok[k][i + 1] = pi2_sampler_next(smp, logits);
        }
        pi2_ref_state_free(s);
        total += q->len[k];
    }
    pi2_sampler_free(smp);
    for (int l = 0; l < d->n_layers; l++) {
        double recall = u.active[l] ? (double)u.true_pos[l] / (double)u.active[l] : 1.0;
        double pa = (double)u.predicted[l] / (double)u.entries[l], ta = (double)u.active[l] / (double)u.entries[l];
        fprintf(stderr,
                "  %s layer %d on %zu unseen tokens (%s): recall %.4f  predicted active %.4f  true active %.4f  "
                "ratio %.2f\n",
                tag, l, total, q->kind, recall, pa, ta, pa / ta);
        if (recall < min_recall)
            fail_msg("%s layer %d: recall %.4f on unseen tokens (want >= %.2f)", tag, l, recall, min_recall);
        pi2_pred_free(u.p[l]);
    }
    free(logits);
    free(u.bits);
    pi2_ref_close(m);
}

/* Quality block: finite perplexities; ppl_q_sparse is "not measured" (NaN)
 * exactly when the model runs dense. */
static void check_quality(const pi2_manifest *mf, const char *tag)
{
    fprintf(stderr, "  %s quality on %llu tokens: ppl fp32 %.5f | q dense %.5f (%+.2f%%) | q sparse %.5f (%+.2f%%)\n",
            tag, (unsigned long long)mf->quality_tokens, mf->ppl_ref, mf->ppl_q_dense,
            100 * (mf->ppl_q_dense / mf->ppl_ref - 1), mf->ppl_q_sparse, 100 * (mf->ppl_q_sparse / mf->ppl_ref - 1));
    assert_true(mf->quality_tokens > 0);
    assert_true(isfinite(mf->ppl_ref) && mf->ppl_ref > 1.0);
    assert_true(isfinite(mf->ppl_q_dense) && mf->ppl_q_dense > 1.0);
    if (mf->sparsity_mode == PI2_MF_SPARSE_NONE)
        assert_true(isnan(mf->ppl_q_sparse));
    else
        assert_true(isfinite(mf->ppl_q_sparse) && mf->ppl_q_sparse > 1.0);
}

/* ------------------------------------------------------------------ */
/* 1. Golden: quantized model, exported to F32, decodes the texts     */
/* ------------------------------------------------------------------ */

/* Greedy decoding of one EXPECTED case (BOS 1 + prompt) on m: the number of
 * leading generated ids equal to the expected ones; at a divergence, the id
 * taken and its logit lead over the expected id. */
static size_t greedy_agree(const pi2_ref_model *m, json_t *cs, int *got, float *lead)
{
    const pi2_model_desc *d = pi2_ref_desc(m);
    json_t *prompt = json_object_get(cs, "prompt_ids"), *gen = json_object_get(cs, "generated_ids");
    size_t np = json_array_size(prompt), ng = json_array_size(gen);
    assert_true(ng > 0);
    pi2_err e = {0};
    pi2_ref_state *s = NULL;
    assert_int_equal(pi2_ref_state_create(&s, m, (int)(1 + np + ng), &e), 0);
    float *logits = malloc(sizeof(float) * (size_t)d->vocab);
    assert_non_null(logits);
    int pos = 0;
    assert_int_equal(pi2_ref_forward(m, s, 1 /* BOS */, pos++, logits, &e), 0);
    for (size_t i = 0; i < np; i++)
        assert_int_equal(pi2_ref_forward(m, s, jint(prompt, i), pos++, logits, &e), 0);
    size_t k = 0;
    for (; k < ng; k++) {
        int best = 0;
        for (int v = 1; v < d->vocab; v++)
            if (logits[v] > logits[best])
                best = v;
        int want = jint(gen, k);
        if (best != want) {
            *got = best;
            *lead = logits[best] - logits[want];
            break;
        }
        if (k + 1 < ng)
            assert_int_equal(pi2_ref_forward(m, s, best, pos++, logits, &e), 0);
    }
    free(logits);
    pi2_ref_state_free(s);
    return k;
}

#define GOLD_PREFIX 16

/* The exported F32 model holds the source weights up to quantization error:
 * norms exactly, every matrix within a relative RMS error of `tol` (catches
 * a transposition or a scale mix-up that greedy agreement alone would only
 * hint at). */
static void check_export_close(const char *src_dir, const char *hf, double tol, const char *tag)
{
    pi2_err e = {0};
    pi2_st *src = NULL, *out = NULL;
    if (pi2_st_open(&src, src_dir, &e) || pi2_st_open(&out, hf, &e))
        fail_msg("%s", e.msg);
    double worst = 0;
    const char *worst_name = "";
    for (size_t i = 0; i < pi2_st_count(out); i++) {
        const pi2_st_tensor *t = pi2_st_at(out, i), *s = pi2_st_find(src, t->name);
        if (!s && strcmp(t->name, "model.embed_tokens.weight") == 0)
            s = pi2_st_find(src, "lm_head.weight"); /* tied, stored once under the head's name */
        if (!s)
            fail_msg("%s: exported tensor %s not in the source", tag, t->name);
        assert_int_equal(t->dtype, PI2_DT_F32);
        assert_int_equal(t->ndim, s->ndim);
        for (int k = 0; k < t->ndim; k++)
            assert_int_equal(t->shape[k], s->shape[k]);
        double err2 = 0, ref2 = 0;
        for (size_t j = 0; j < t->nelem; j++) {
            double a = pi2_st_get_f32(t, j), b = pi2_st_get_f32(s, j);
            err2 += (a - b) * (a - b);
            ref2 += b * b;
        }
        double rel = ref2 > 0 ? sqrt(err2 / ref2) : sqrt(err2);
        if (t->ndim == 1 && err2 != 0)
            fail_msg("%s: norm %s changed in export", tag, t->name);
        if (rel > tol)
            fail_msg("%s: %s relative RMS error %.4f (limit %.3f)", tag, t->name, rel, tol);
        if (rel > worst) {
            worst = rel;
            worst_name = t->name;
        }
    }
    fprintf(stderr, "  %s export: %zu tensors, worst relative RMS error %.4f (%s)\n", tag, pi2_st_count(out), worst,
            worst_name);
    pi2_st_close(out);
    pi2_st_close(src);
}

/* q_embed: the embedding table's (and so the tied head's) own type, q_kvo
 * the attention's k, v and o; 0 = as q_other. */
static void golden_variant(const char *model, const char *tmp, json_t *cases, pi2_qtype q_ffn, pi2_qtype q_other,
                           pi2_qtype q_embed, pi2_qtype q_kvo, bool must_agree)
{
    char out[256], hf[256];
    const char *tag = q_kvo ? "q4-embed-kvo-q8" : q_embed ? "q4-embed-q8" : q_ffn == PI2_QT_Q8 ? "q8" : "q4";
    snprintf(out, sizeof out, "%s/%s.pi2", tmp, tag);
    snprintf(hf, sizeof hf, "%s/%s-hf", tmp, tag);
    pi2_convert_opts o;
    opts_for(&o, model, out, 512);
    o.q_ffn = q_ffn;
    o.q_other = q_other;
    o.q_embed = q_embed;
    o.q_kvo = q_kvo;
    convert_ok(&o, NULL);

    pi2_ctr *c = NULL;
    pi2_manifest *mf = NULL;
    open_converted(out, &c, &mf);
    assert_int_equal(mf->quant_ffn, q_ffn);
    assert_int_equal(mf->quant_other, q_other);
    for (size_t i = 0; i < mf->n_tensors; i++) {
        const pi2_mf_tensor *t = &mf->tensors[i];
        bool ffn = t->role == PI2_T_GATE || t->role == PI2_T_UP || t->role == PI2_T_DOWN;
        bool norm = t->role == PI2_T_ATTN_NORM || t->role == PI2_T_FFN_NORM || t->role == PI2_T_OUT_NORM;
        bool embed = t->role == PI2_T_EMBED || t->role == PI2_T_LM_HEAD;
        bool kvo = t->role == PI2_T_K || t->role == PI2_T_V || t->role == PI2_T_O;
        assert_int_equal(t->qtype, norm  ? PI2_QT_F32
                                   : ffn ? q_ffn
                                   : embed && q_embed ? q_embed
                                   : kvo && q_kvo      ? q_kvo
                                                      : q_other);
        assert_int_equal(t->transposed, t->role == PI2_T_DOWN);
    }
    pi2_manifest_free(mf);
    pi2_ctr_close(c);

    pi2_err e = {0};
    if (pi2_convert_export(out, hf, &e))
        fail_msg("export %s: %s", out, e.msg);
    check_export_close(model, hf, q_ffn == PI2_QT_Q8 && q_other == PI2_QT_Q8 ? 0.02 : 0.2, tag);
    pi2_ref_model *m = NULL;
    if (pi2_ref_open(&m, hf, &e))
        fail_msg("%s", e.msg);
    for (size_t ci = 0; ci < json_array_size(cases); ci++) {
        json_t *cs = json_array_get(cases, ci);
        size_t ng = json_array_size(json_object_get(cs, "generated_ids"));
        int got = -1;
        float lead = 0;
        size_t n = greedy_agree(m, cs, &got, &lead);
        if (n == ng)
            fprintf(stderr, "  %s case %zu: all %zu generated ids agree\n", tag, ci, ng);
        else
            fprintf(stderr, "  %s case %zu: %zu/%zu ids agree; step %zu takes id %d (leads the expected id by %.4f)\n",
                    tag, ci, n, ng, n, got, (double)lead);
        size_t need = ng < GOLD_PREFIX ? ng : GOLD_PREFIX;
        if (must_agree && n < need)
            fail_msg("%s case %zu: diverges at step %zu (< %zu)", tag, ci, n, need);
    }
    pi2_ref_close(m);
}

static void test_golden_q8_q4(void **state)
{
    (void)state;
    char dir[1024], path[1200], tmp[64];
    PI2T_SHARED_MODEL(dir, "tinystories-656k");
    snprintf(path, sizeof path, "%s/EXPECTED.json", dir);
    json_t *exp = load_json(path);
    json_t *cases = json_object_get(exp, "cases");
    assert_true(json_is_array(cases) && json_array_size(cases) > 0);
    pi2t_tmpdir(tmp, sizeof tmp);
    golden_variant(dir, tmp, cases, PI2_QT_Q8, PI2_QT_Q8, 0, 0, true);
    golden_variant(dir, tmp, cases, PI2_QT_Q4, PI2_QT_Q8, 0, 0, false); /* report only */
    /* 4-bit attention with the (tied) embedding kept at q8: a manifest
     * whose embedding differs from quant.other, read back and exported;
     * then k, v and o at q8 too (q alone at 4 bits) */
    golden_variant(dir, tmp, cases, PI2_QT_Q4, PI2_QT_Q4, PI2_QT_Q8, 0, false);
    golden_variant(dir, tmp, cases, PI2_QT_Q4, PI2_QT_Q4, PI2_QT_Q8, PI2_QT_Q8, false);
    json_decref(exp);
    pi2t_rmtree(tmp);
}

/* ------------------------------------------------------------------ */
/* 2-4. Predictors: trained (real dReLU model, generated), imported   */
/* ------------------------------------------------------------------ */

static void test_train_drelu(void **state)
{
    (void)state;
    char dir[1024], tmp[64], out[128];
    PI2T_SHARED_MODEL(dir, "tinystories-656k-drelu");
    pi2t_tmpdir(tmp, sizeof tmp);
    snprintf(out, sizeof out, "%s/d.pi2", tmp);
    pi2_convert_opts o;
    opts_for(&o, dir, out, 0); /* default calibration: the slow one */
    o.train_predictors = true;
    convert_ok(&o, stderr);
    pi2_ctr *c = NULL;
    pi2_manifest *mf = NULL;
    open_converted(out, &c, &mf);
    check_predictors(c, mf, false, "drelu");
    check_quality(mf, "drelu");
    double rel = mf->ppl_q_sparse / mf->ppl_q_dense - 1;
    if (fabs(rel) > 0.05)
        fail_msg("predicted sparsity costs %+.2f%% perplexity over quantized dense (limit 5%%)", 100 * rel);
    seqs q;
    seqs_golden(&q, dir);
    check_unseen(dir, c, mf, &q, UNSEEN_RECALL, "drelu");
    seqs_free(&q);
    for (size_t i = 0; i < mf->n_profile; i++)
        fprintf(stderr, "  drelu profile layer %d: active %.4f (held-out true active %.4f)\n", mf->profile[i].layer,
                mf->profile[i].active_frac, mf->layers[i].predictor.report.true_active_frac);
    pi2_manifest_free(mf);
    pi2_ctr_close(c);
    pi2t_rmtree(tmp);
}

static void test_train_synth(void **state)
{
    (void)state;
    char tmp[64], model[128], out[128];
    pi2t_tmpdir(tmp, sizeof tmp);
    snprintf(model, sizeof model, "%s/m", tmp);
    snprintf(out, sizeof out, "%s/m.pi2", tmp);
    make_synth(model, true, false);
    pi2_convert_opts o;
    opts_for(&o, model, out, 4096);
    o.train_predictors = true;
    convert_ok(&o, stderr);
    pi2_ctr *c = NULL;
    pi2_manifest *mf = NULL;
    open_converted(out, &c, &mf);
    assert_int_equal(mf->config.n_layers, 4);
    assert_int_equal(mf->config.n_ff, 512);
    check_predictors(c, mf, false, "synth trained");
    check_quality(mf, "synth trained");
    assert_true(fabs(mf->ppl_q_sparse / mf->ppl_q_dense - 1) <= 0.05);
    seqs q;
    seqs_sampled(&q, 2, 256, 4242);
    check_unseen(model, c, mf, &q, UNSEEN_RECALL, "synth trained");
    seqs_free(&q);
    /* report only: predictors trained on the model's own text need not
     * generalise to random ids (the planted ones do) */
    seqs_random(&q, mf->config.vocab, 2, 256, 7);
    check_unseen(model, c, mf, &q, 0.0, "synth trained");
    seqs_free(&q);
    pi2_manifest_free(mf);
    pi2_ctr_close(c);
    pi2t_rmtree(tmp);
}

static void test_import_synth(void **state)
{
    (void)state;
    char tmp[64], model[128], out[128];
    pi2t_tmpdir(tmp, sizeof tmp);
    snprintf(model, sizeof model, "%s/m", tmp);
    snprintf(out, sizeof out, "%s/m.pi2", tmp);
    make_synth(model, true, true);
    pi2_convert_opts o;
    opts_for(&o, model, out, 2048);
    /* no train_predictors: the shipped ones are imported; first with their
     * published threshold (a neuron fires when its score is > 0) */
    convert_ok(&o, stderr);
    {
        pi2_ctr *c0 = NULL;
        pi2_manifest *m0 = NULL;
        open_converted(out, &c0, &m0);
        for (int l = 0; l < m0->config.n_layers; l++) {
            const pi2_mf_predictor *p = &m0->layers[l].predictor;
            assert_true(p->threshold == nextafterf(0.0f, INFINITY));
            assert_true(p->imported && p->input == PI2_PRED_IN_PRENORM);
            fprintf(stderr, "  synth imported, published threshold, layer %d: recall %.4f precision %.3f\n", l,
                    p->report.recall, p->report.precision);
            assert_true(p->report.n_eval > 0 && p->report.recall > 0.85); /* reported, and the planted ones are good */
        }
        pi2_manifest_free(m0);
        pi2_ctr_close(c0);
    }
    /* then calibrated to the target recall (--recall given) */
    o.recall_set = true;
    convert_ok(&o, stderr);
    pi2_ctr *c = NULL;
    pi2_manifest *mf = NULL;
    open_converted(out, &c, &mf);
    check_predictors(c, mf, true, "synth imported");
    check_quality(mf, "synth imported");
    seqs q;
    seqs_sampled(&q, 2, 256, 4242);
    check_unseen(model, c, mf, &q, UNSEEN_RECALL, "synth imported");
    seqs_free(&q);
    seqs_random(&q, mf->config.vocab, 2, 256, 7);
    check_unseen(model, c, mf, &q, 0.0, "synth imported");
    seqs_free(&q);

    /* the stored weights are the checkpoint's, bit for bit */
    pi2_err e = {0};
    pi2_st *st = NULL;
    if (pi2_st_open(&st, model, &e))
        fail_msg("%s", e.msg);
    for (int l = 0; l < mf->config.n_layers; l++) {
        const pi2_mf_predictor *p = &mf->layers[l].predictor;
        char n1[128], n2[128];
        assert_true(pi2_tensor_name(n1, sizeof n1, &mf->config, PI2_T_PRED_FC1, l, 0));
        assert_true(pi2_tensor_name(n2, sizeof n2, &mf->config, PI2_T_PRED_FC2, l, 0));
        const pi2_st_tensor *f1 = pi2_st_find(st, n1), *f2 = pi2_st_find(st, n2);
        assert_non_null(f1);
        assert_non_null(f2);
        assert_int_equal(f1->dtype, PI2_DT_F32);
        assert_int_equal(p->rank, f1->shape[0]);
        expect_f16_of(member(c, p->fc1), f1);
        expect_f16_of(member(c, p->fc2), f2);
    }
    pi2_st_close(st);
    pi2_manifest_free(mf);
    pi2_ctr_close(c);
    pi2t_rmtree(tmp);
}

/* MoE (TurboSparse-Mixtral names): per-expert predictors imported from
 * the checkpoint bit for bit, or trained per expert when absent; the
 * profile's routing shares sum to 1 in every layer. */
static void check_moe(const char *model, const char *out, bool imported)
{
    pi2_ctr *c = NULL;
    pi2_manifest *mf = NULL;
    open_converted(out, &c, &mf);
    const pi2_model_desc *d = &mf->config;
    assert_int_equal(d->n_experts, 4);
    assert_int_equal(mf->sparsity_mode, PI2_MF_SPARSE_PREDICTOR);
    assert_int_equal(mf->n_layers, (size_t)d->n_layers * 4);
    pi2_err e = {0};
    pi2_st *st = NULL;
    if (pi2_st_open(&st, model, &e))
        fail_msg("%s", e.msg);
    int good = 0;
    for (int l = 0; l < d->n_layers; l++) {
        double share = 0;
        for (int x = 0; x < 4; x++) {
            const pi2_mf_layer *L = pi2_manifest_find_layer(mf, l, x);
            const pi2_mf_profile *pr = pi2_manifest_find_profile(mf, l, x);
            assert_non_null(L);
            assert_non_null(pr);
            assert_true(L->has_predictor);
            assert_int_equal(L->predictor.imported, imported);
            assert_false(isnan(pr->route_share));
            share += pr->route_share;
            const pi2_pred_report *r = &L->predictor.report;
            good += r->n_eval > 0 && r->recall >= 0.95 && r->pred_active_frac <= 2.5 * r->true_active_frac;
            char n1[128];
            assert_true(pi2_tensor_name(n1, sizeof n1, d, PI2_T_PRED_FC1, l, x));
            const pi2_st_tensor *f1 = pi2_st_find(st, n1);
            const pi2_ctr_member *m1 = member(c, L->predictor.fc1);
            if (imported) {
                assert_non_null(f1);
                expect_f16_of(m1, f1);
            } else {
                assert_null(f1);
                assert_int_equal(m1->size, (uint64_t)L->predictor.rank * (uint64_t)d->hidden * 2);
            }
        }
        if (fabs(share - 1) > 1e-9)
            fail_msg("layer %d: routing shares sum to %.12f", l, share);
    }
    fprintf(stderr, "  moe %s: %d of %d expert predictors reach recall 0.95 at <= 2.5x the true active share\n",
            imported ? "imported" : "trained", good, d->n_layers * 4);
    assert_true(good >= d->n_layers * 4 * 3 / 4); /* experts rarely routed to have few samples */
    pi2_st_close(st);
    pi2_manifest_free(mf);
    pi2_ctr_close(c);
}

static void test_moe_predictors(void **state)
{
    (void)state;
    char tmp[64], model[128], out[128];
    pi2t_tmpdir(tmp, sizeof tmp);
    snprintf(model, sizeof model, "%s/m", tmp);
    snprintf(out, sizeof out, "%s/m.pi2", tmp);
    for (int shipped = 1; shipped >= 0; shipped--) {
        pi2_synth_opts so;
        pi2_err e = {0};
        assert_int_equal(pi2_synth_preset("tiny", &so, &e), 0);
        so.desc.arch = PI2_ARCH_TURBOSPARSE_MIXTRAL;
        so.desc.n_experts = 4;
        so.desc.n_experts_used = 2;
        so.desc.n_ff = 256;
        so.predictors = shipped;
        so.threads = 2;
        pi2t_rmtree(model);
        if (pi2_synth_write(model, &so, NULL, NULL, &e))
            fail_msg("%s", e.msg);
        pi2_convert_opts o;
        opts_for(&o, model, out, 2048);
        o.train_predictors = !shipped;
        o.recall_set = true; /* imported ones too: calibrated to the target */
        convert_ok(&o, NULL);
        check_moe(model, out, shipped);
    }
    pi2t_rmtree(tmp);
}

/* ------------------------------------------------------------------ */
/* 5. SiLU: threshold mode                                            */
/* ------------------------------------------------------------------ */

static void test_silu_threshold(void **state)
{
    (void)state;
    char dir[1024], tmp[64], out[128];
    PI2T_SHARED_MODEL(dir, "tinystories-656k");
    pi2t_tmpdir(tmp, sizeof tmp);
    snprintf(out, sizeof out, "%s/s.pi2", tmp);
    pi2_convert_opts o;
    opts_for(&o, dir, out, 4096);
    convert_ok(&o, stderr);
    pi2_ctr *c = NULL;
    pi2_manifest *mf = NULL;
    open_converted(out, &c, &mf);
    const pi2_model_desc *d = &mf->config;
    assert_int_equal(d->act, PI2_ACT_SILU);
    assert_int_equal(mf->sparsity_mode, PI2_MF_SPARSE_THRESHOLD);
    assert_true(fabs(mf->threshold_sparsity - 0.5) < 1e-12);
    assert_true(isnan(mf->recall_target));
    assert_int_equal(mf->n_layers, (size_t)d->n_layers);
    assert_int_equal(mf->n_profile, (size_t)d->n_layers);
    check_quality(mf, "silu threshold 0.5");
    for (int l = 0; l < d->n_layers; l++) {
        const pi2_mf_layer *L = &mf->layers[l];
        assert_int_equal(L->layer, l);
        assert_false(L->has_predictor);
        assert_true(L->has_silu_threshold);
        assert_true(isfinite(L->silu_threshold) && L->silu_threshold > 0.0f);
        const pi2_mf_profile *p = &mf->profile[l];
        fprintf(stderr, "  silu layer %d: |act| threshold %.4g, active above it %.4f, hot %.4f, top-10%% share %.3f\n",
                l, (double)L->silu_threshold, p->active_frac, p->hot_share, p->top10_share);
        /* the threshold is the 50% |act| quantile of the first batch */
        assert_true(p->active_frac > 0.3 && p->active_frac < 0.7);
    }
    pi2_manifest_free(mf);
    pi2_ctr_close(c);
    pi2t_rmtree(tmp);
}

/* ------------------------------------------------------------------ */
/* 6. Activation profile                                              */
/* ------------------------------------------------------------------ */

static void test_profile_drelu(void **state)
{
    (void)state;
    char dir[1024], path[1200], tmp[64], out[128];
    PI2T_SHARED_MODEL(dir, "tinystories-656k-drelu");
    snprintf(path, sizeof path, "%s/EXPECTED.json", dir);
    json_t *exp = load_json(path);
    json_t *cases = json_object_get(exp, "cases");
    pi2t_tmpdir(tmp, sizeof tmp);
    snprintf(out, sizeof out, "%s/p.pi2", tmp);
    pi2_convert_opts o;
    opts_for(&o, dir, out, 2048);
    convert_ok(&o, NULL);
    pi2_ctr *c = NULL;
    pi2_manifest *mf = NULL;
    open_converted(out, &c, &mf);
    const pi2_model_desc *d = &mf->config;
    assert_int_equal(mf->sparsity_mode, PI2_MF_SPARSE_NONE); /* no predictors, not SiLU */
    assert_int_equal(mf->n_layers, 0);
    assert_int_equal(mf->n_profile, (size_t)d->n_layers);
    assert_true(mf->profile_tokens >= 2048 - 256);
    check_quality(mf, "drelu dense");
    size_t W = ((size_t)d->n_ff + 63) / 64;
    for (int l = 0; l < d->n_layers; l++) {
        const pi2_mf_profile *p = &mf->profile[l];
        assert_int_equal(p->layer, l);
        assert_int_equal(p->expert, -1);
        /* EXPECTED.json: active fraction over each golden case's text */
        double want = 0;
        for (size_t ci = 0; ci < json_array_size(cases); ci++)
            want += json_number_value(json_array_get(json_object_get(json_array_get(cases, ci),
                                                                     "active_fraction_per_layer"),
                                                     (size_t)l));
        want /= (double)json_array_size(cases);

        const pi2_ctr_member *fm = member(c, p->freq);
        assert_int_equal(fm->size, (uint64_t)d->n_ff * 4);
        float *freq = malloc((size_t)d->n_ff * sizeof *freq);
        assert_non_null(freq);
        memcpy(freq, fm->data, (size_t)d->n_ff * sizeof *freq);
        double sum = 0, top = 0;
        int hot = 0;
        for (int j = 0; j < d->n_ff; j++) {
            if (!(freq[j] >= 0.0f && freq[j] <= 1.0f))
                fail_msg("layer %d neuron %d: frequency %g outside [0, 1]", l, j, (double)freq[j]);
            sum += freq[j];
            hot += freq[j] > 0.5f;
        }
        qsort(freq, (size_t)d->n_ff, sizeof *freq, pi2t_cmp_float_desc);
        for (int j = 0; j < d->n_ff / 10; j++)
            top += freq[j];
        free(freq);
        /* the summary figures are those of the freq member */
        assert_true(fabs(sum / d->n_ff - p->active_frac) < 1e-6);
        assert_true(fabs((double)hot / d->n_ff - p->hot_share) < 1e-9);
        assert_true(fabs(top / sum - p->top10_share) < 1e-5);

        assert_true(p->bit_samples > 0 && p->bit_samples <= mf->profile_tokens);
        const pi2_ctr_member *bm = member(c, p->bits);
        assert_int_equal(bm->size, p->bit_samples * W * 8);
        uint64_t ones = 0;
        for (size_t i = 0; i < p->bit_samples * W; i++) {
            uint64_t w;
            memcpy(&w, bm->data + i * 8, 8);
            if (d->n_ff % 64 && i % W == W - 1)
                assert_int_equal(w >> (d->n_ff % 64), 0); /* no bits past n_ff */
            ones += (uint64_t)__builtin_popcountll(w);
        }
        double bits_frac = (double)ones / ((double)p->bit_samples * d->n_ff);
        fprintf(stderr,
                "  drelu profile layer %d: active %.4f (golden texts %.4f; sampled bits %.4f over %llu tokens), "
                "hot %.4f, top-10%% share %.3f\n",
                l, p->active_frac, want, bits_frac, (unsigned long long)p->bit_samples, p->hot_share,
                p->top10_share);
        assert_true(p->active_frac > 0.1 && p->active_frac < 0.4);
        assert_true(fabs(p->active_frac - want) < 0.08);
        assert_true(fabs(bits_frac - p->active_frac) < 0.05);
        assert_true(p->hot_share >= 0 && p->hot_share <= 1);
        assert_true(p->top10_share >= 0.1 && p->top10_share <= 1);
    }
    pi2_manifest_free(mf);
    pi2_ctr_close(c);
    json_decref(exp);
    pi2t_rmtree(tmp);
}

/* ------------------------------------------------------------------ */
/* 7. Bad input: exact code, a message naming the culprit, no output  */
/* ------------------------------------------------------------------ */

/* No entry of dir is the output or a temporary of it (or of anything). */
static void assert_no_output(const char *dir, const char *out_name)
{
    DIR *dp = opendir(dir);
    assert_non_null(dp);
    size_t n = strlen(out_name);
    struct dirent *de;
    while ((de = readdir(dp)) != NULL)
        if (strncmp(de->d_name, out_name, n) == 0 || strstr(de->d_name, ".tmp."))
            fail_msg("%s/%s left behind", dir, de->d_name);
    closedir(dp);
}

/* pi2_convert must fail with `want`, its message containing each of the
 * NULL-terminated needles, and leave nothing at out_path (named `out_name`
 * in `dir`). */
static void expect_fail(const pi2_convert_opts *o, int want, const char *dir, const char *out_name, ...)
{
    pi2_err e = {0};
    int rc = pi2_convert(o, NULL, &e);
    fprintf(stderr, "  error %s: %s\n", pi2_strerror(rc), e.msg);
    if (rc != want)
        fail_msg("got %d (%s: %s), want %d (%s)", rc, pi2_strerror(rc), e.msg, want, pi2_strerror(want));
    assert_int_equal(e.code, rc);
    va_list ap;
    va_start(ap, out_name);
    for (const char *s; (s = va_arg(ap, const char *)) != NULL;)
        if (!strstr(e.msg, s))
            fail_msg("message \"%s\" does not name \"%s\"", e.msg, s);
    va_end(ap);
    assert_false(pi2t_exists(o->out_path));
    assert_no_output(dir, out_name);
}

/* Replace the first `from` in the file by `to`. */
static void edit_file(const char *path, const char *from, const char *to)
{
    char *text = NULL;
    size_t n = 0;
    pi2_err e = {0};
    if (pi2_read_file(path, 1u << 20, &text, &n, &e))
        fail_msg("%s", e.msg);
    char *p = strstr(text, from);
    if (!p)
        fail_msg("%s: no \"%s\"", path, from);
    size_t a = (size_t)(p - text), lf = strlen(from), lt = strlen(to);
    char *res = malloc(n - lf + lt);
    assert_non_null(res);
    memcpy(res, text, a);
    memcpy(res + a, to, lt);
    memcpy(res + a + lt, p + lf, n - a - lf);
    pi2t_write(path, res, n - lf + lt);
    free(res);
    free(text);
}

static void test_bad_model(void **state)
{
    (void)state;
    char tmp[64], model[128], cfg[160], out[128];
    pi2t_tmpdir(tmp, sizeof tmp);
    snprintf(out, sizeof out, "%s/out.pi2", tmp);
    pi2_convert_opts o;

    /* missing model dir */
    snprintf(model, sizeof model, "%s/no-such-model", tmp);
    opts_for(&o, model, out, 512);
    expect_fail(&o, PI2_ENOTFOUND, tmp, "out.pi2", "no-such-model", NULL);

    /* unknown model_type */
    snprintf(model, sizeof model, "%s/arch", tmp);
    make_synth(model, false, false);
    snprintf(cfg, sizeof cfg, "%s/config.json", model);
    edit_file(cfg, "\"bamboo\"", "\"falcon\"");
    opts_for(&o, model, out, 512);
    expect_fail(&o, PI2_EUNSUPPORTED, tmp, "out.pi2", "config.json", "falcon", NULL);

    /* config claims one more layer than the weights hold */
    snprintf(model, sizeof model, "%s/layers", tmp);
    make_synth(model, false, false);
    snprintf(cfg, sizeof cfg, "%s/config.json", model);
    edit_file(cfg, "\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3");
    opts_for(&o, model, out, 512);
    expect_fail(&o, PI2_ENOTFOUND, tmp, "out.pi2", "layers", "model.layers.2.", NULL);

    /* config with another intermediate_size: the FFN weights have the wrong shape */
    snprintf(model, sizeof model, "%s/ffn", tmp);
    make_synth(model, false, false);
    snprintf(cfg, sizeof cfg, "%s/config.json", model);
    edit_file(cfg, "\"intermediate_size\": 256", "\"intermediate_size\": 320");
    opts_for(&o, model, out, 512);
    expect_fail(&o, PI2_ESHAPE, tmp, "out.pi2", "model.layers.0.mlp.", NULL);

    pi2t_rmtree(tmp);
}

/* A predictors dir holding layer 0's fc1 [r1, c1] and (if r2 > 0) fc2 [r2, c2]. */
static void write_preds(const char *dir, const pi2_model_desc *d, int64_t r1, int64_t c1, int64_t r2, int64_t c2)
{
    char path[256], n1[128], n2[128];
    pi2_err e = {0};
    assert_int_equal(mkdir(dir, 0755), 0);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_true(pi2_tensor_name(n1, sizeof n1, d, PI2_T_PRED_FC1, 0, 0));
    assert_true(pi2_tensor_name(n2, sizeof n2, d, PI2_T_PRED_FC2, 0, 0));
    pi2_st_writer *w = NULL;
    int64_t s1[2] = {r1, c1}, s2[2] = {r2, c2};
    assert_int_equal(pi2_st_writer_create(&w, path, &e), 0);
    assert_int_equal(pi2_st_writer_add(w, n1, PI2_DT_F32, 2, s1, &e), 0);
    if (r2 > 0)
        assert_int_equal(pi2_st_writer_add(w, n2, PI2_DT_F32, 2, s2, &e), 0);
    size_t n = (size_t)(r1 * c1 + (r2 > 0 ? r2 * c2 : 0));
    float *zero = calloc(n, sizeof *zero);
    assert_non_null(zero);
    assert_int_equal(pi2_st_writer_write(w, zero, n * sizeof *zero, &e), 0);
    free(zero);
    if (pi2_st_writer_finish(w, &e))
        fail_msg("%s", e.msg);
}

static void test_bad_predictors(void **state)
{
    (void)state;
    char tmp[64], model[128], out[128], preds[128], cfg[160];
    pi2t_tmpdir(tmp, sizeof tmp);
    snprintf(model, sizeof model, "%s/m", tmp);
    snprintf(out, sizeof out, "%s/out.pi2", tmp);
    make_synth(model, false, false);
    snprintf(cfg, sizeof cfg, "%s/config.json", model);
    pi2_model_desc d;
    pi2_err e = {0};
    assert_int_equal(pi2_config_read(cfg, &d, &e), 0);
    pi2_convert_opts o;
    opts_for(&o, model, out, 512);
    o.predictors_dir = preds;

    /* fc1 does not take the hidden size */
    snprintf(preds, sizeof preds, "%s/p-hidden", tmp);
    write_preds(preds, &d, 16, d.hidden + 32, d.n_ff, 16);
    expect_fail(&o, PI2_ESHAPE, tmp, "out.pi2", "p-hidden", "model.layers.0.mlp.predictor.fc1.weight", NULL);

    /* fc2's rank differs from fc1's */
    snprintf(preds, sizeof preds, "%s/p-rank", tmp);
    write_preds(preds, &d, 16, d.hidden, d.n_ff, 8);
    expect_fail(&o, PI2_ESHAPE, tmp, "out.pi2", "p-rank", "model.layers.0.mlp.predictor.fc2.weight", NULL);

    /* fc2 [hidden, r] instead of [n_ff, r] */
    snprintf(preds, sizeof preds, "%s/p-nff", tmp);
    write_preds(preds, &d, 16, d.hidden, d.hidden, 16);
    expect_fail(&o, PI2_ESHAPE, tmp, "out.pi2", "p-nff", NULL);

    /* fc2 missing */
    snprintf(preds, sizeof preds, "%s/p-missing", tmp);
    write_preds(preds, &d, 16, d.hidden, 0, 0);
    expect_fail(&o, PI2_ENOTFOUND, tmp, "out.pi2", "p-missing", "model.layers.0.mlp.predictor.fc2.weight", NULL);

    /* no predictors dir at all */
    snprintf(preds, sizeof preds, "%s/p-none", tmp);
    expect_fail(&o, PI2_ENOTFOUND, tmp, "out.pi2", "p-none", NULL);

    pi2t_rmtree(tmp);
}

static void test_bad_calib(void **state)
{
    (void)state;
    char tmp[64], model[128], out[128], calib[128];
    pi2t_tmpdir(tmp, sizeof tmp);
    snprintf(model, sizeof model, "%s/m", tmp);
    snprintf(out, sizeof out, "%s/out.pi2", tmp);
    make_synth(model, false, false);
    pi2_convert_opts o;
    opts_for(&o, model, out, 512);
    o.calib_path = calib;

    snprintf(calib, sizeof calib, "%s/no-such-text.txt", tmp);
    expect_fail(&o, PI2_ENOTFOUND, tmp, "out.pi2", "no-such-text.txt", NULL);

    snprintf(calib, sizeof calib, "%s/short.txt", tmp);
    const char *text = "Once upon a time, there was a little girl named Lily.\n";
    pi2t_write(calib, text, strlen(text));
    expect_fail(&o, PI2_EINVAL, tmp, "out.pi2", "short.txt", "too short", NULL);

    /* enough text converts */
    size_t n = strlen(text), reps = 400;
    char *big = malloc(n * reps);
    assert_non_null(big);
    for (size_t i = 0; i < reps; i++)
        memcpy(big + i * n, text, n);
    snprintf(calib, sizeof calib, "%s/long.txt", tmp);
    pi2t_write(calib, big, n * reps);
    free(big);
    convert_ok(&o, NULL);
    pi2_ctr *c = NULL;
    pi2_manifest *mf = NULL;
    open_converted(out, &c, &mf);
    assert_true(mf->profile_tokens > 0);
    pi2_manifest_free(mf);
    pi2_ctr_close(c);

    pi2t_rmtree(tmp);
}

static int reset_fail_hook(void **state)
{
    (void)state;
    pi2_afile_fail_after(-1);
    return 0;
}

static void test_disk_full(void **state)
{
    (void)state;
    char tmp[64], model[128], out[128], ok[128];
    pi2t_tmpdir(tmp, sizeof tmp);
    snprintf(model, sizeof model, "%s/m", tmp);
    snprintf(out, sizeof out, "%s/out.pi2", tmp);
    snprintf(ok, sizeof ok, "%s/ok.pi2", tmp);
    make_synth(model, false, false);
    pi2_convert_opts o;
    opts_for(&o, model, ok, 512);
    convert_ok(&o, NULL);
    struct stat st;
    assert_int_equal(stat(ok, &st), 0);
    int64_t size = (int64_t)st.st_size;
    assert_true(size > 8192);
    /* from the first byte to the very last one (the manifest's padding) */
    int64_t at[] = {0, 1, 600, 4096, 70000, size / 2, size - 4096, size - 1};
    o.out_path = out;
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
        fprintf(stderr, "  disk full after %lld of %lld bytes:\n", (long long)at[i], (long long)size);
        pi2_afile_fail_after(at[i]);
        pi2_err e = {0};
        int rc = pi2_convert(&o, NULL, &e);
        pi2_afile_fail_after(-1);
        fprintf(stderr, "  error %s: %s\n", pi2_strerror(rc), e.msg);
        if (rc != PI2_ENOSPC)
            fail_msg("full disk after %lld bytes: got %d (%s), want PI2_ENOSPC", (long long)at[i], rc, e.msg);
        assert_non_null(strstr(e.msg, "out.pi2"));
        assert_false(pi2t_exists(out));
        assert_no_output(tmp, "out.pi2");
    }
    /* and the same conversion goes through once there is room */
    convert_ok(&o, NULL);
    pi2_ctr *c = NULL;
    pi2_manifest *mf = NULL;
    open_converted(out, &c, &mf);
    pi2_manifest_free(mf);
    pi2_ctr_close(c);
    pi2t_rmtree(tmp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_q8_q4),
        cmocka_unit_test(test_train_drelu),
        cmocka_unit_test(test_train_synth),
        cmocka_unit_test(test_import_synth),
        cmocka_unit_test(test_moe_predictors),
        cmocka_unit_test(test_silu_threshold),
        cmocka_unit_test(test_profile_drelu),
        cmocka_unit_test(test_bad_model),
        cmocka_unit_test(test_bad_predictors),
        cmocka_unit_test(test_bad_calib),
        cmocka_unit_test_teardown(test_disk_full, reset_fail_hook),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
