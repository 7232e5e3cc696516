/* The engine (runtime/engine.h) end to end: generated models converted and
 * bundled here, checked against the quantized reference (the converted
 * weights exported to F32 and run through the fp32 reference forward),
 * prefill against decode, sparse against dense, thread counts and kernel
 * paths against each other, trust and tampering, and the tinystories golden
 * ids at q8. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "bundle/bundle.h"
#include "convert/convert.h"
#include "convert/synth.h"
#include "formats/hfconfig.h"
#include "formats/safetensors.h"
#include "formats/quant.h"
#include "runtime/engine.h"
#include "runtime/state.h"
#include "runtime/ffn.h"
#include "runtime/forward.h"
#include "runtime/predict.h"
#include "runtime/reference.h"
#include "runtime/sample.h"
#include "tests/testjson.h"
#include "tests/testmodel.h"
#include "tests/testutil.h"

#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef enum kind { K_DRELU, K_RELU_Q8, K_SILU, K_MOE, K_COUNT } kind;
static const char *const kind_name[K_COUNT] = {"drelu", "relu-q8", "silu", "moe"};

static char g_dir[64];
static char g_src[K_COUNT][128], g_conv[K_COUNT][128], g_pi2[K_COUNT][128], g_exp[K_COUNT][128];
static char g_unsigned[128];

/* The published families' model math: tiny models of each, converted,
 * exported (the quantized reference) and bundled. */
typedef enum fam { F_FATRELU, F_LINEAR, F_DYNAMIC, F_LLAMA3, F_PADDED, F_COUNT } fam;
static const char *const fam_name[F_COUNT] = {"fatrelu", "rope-linear", "rope-dynamic", "rope-llama3", "padded"};
static char f_src[F_COUNT][128], f_pi2[F_COUNT][128], f_exp[F_COUNT][128], f_plain[F_COUNT][128];
static pi2_sign_key *g_key, *g_pubkey, *g_pubkey2;

static int make_model(kind k, pi2_err *e)
{
    pi2_synth_opts so;
    if (pi2_synth_preset("small", &so, e))
        return -1;
    so.threads = 2;
    so.desc.n_layers = 2;
    so.predictors = k == K_DRELU || k == K_MOE || k == K_RELU_Q8;
    if (k == K_SILU || k == K_RELU_Q8) {
        so.desc.arch = PI2_ARCH_LLAMA;
        so.desc.act = k == K_SILU ? PI2_ACT_SILU : PI2_ACT_RELU;
    }
    if (k == K_RELU_Q8) /* one KV head for all: decode attention splits its heads into units of 4 */
        so.desc.n_kv_heads = 1;
    if (k == K_DRELU) { /* a predictor of rank 257 (fc1 in units of 16 rows) and 4 fc2 units (taken 2 at a time
                         * on one thread) */
        so.desc.n_ff = 2048;
        so.plant_rank = 128;
    }
    if (k == K_MOE) {
        so.desc.arch = PI2_ARCH_TURBOSPARSE_MIXTRAL;
        so.desc.n_experts = 4;
        so.desc.n_experts_used = 2;
        so.desc.n_ff = 256;
    }
    if (pi2_synth_write(g_src[k], &so, NULL, NULL, e))
        return -1;
    pi2_convert_opts co;
    pi2_convert_defaults(&co);
    co.model_dir = g_src[k];
    co.out_path = g_conv[k];
    co.calib_tokens = 1024;
    co.quiet = true;
    co.threads = 1; /* OpenBLAS threads synchronise in ways ThreadSanitizer cannot see */
    co.q_ffn = k == K_RELU_Q8 ? PI2_QT_Q8 : PI2_QT_Q4;
    if (pi2_convert(&co, NULL, e))
        return -1;
    if (pi2_convert_export(g_conv[k], g_exp[k], e))
        return -1;
    pi2_bundle_opts bo;
    pi2_bundle_defaults(&bo);
    bo.in_path = g_conv[k];
    bo.out_path = g_pi2[k];
    bo.key = g_key;
    bo.quiet = true;
    return pi2_bundle_create(&bo, NULL, e) ? -1 : 0;
}

/* A family fixture; f_plain: the export with rope_scaling null and
 * FATReLU's threshold 0 (what a runtime that ignored them would compute;
 * dynamic: over as many positions). */
static int make_family(fam f, pi2_err *e)
{
    pi2_synth_opts so;
    if (pi2_synth_preset("tiny", &so, e))
        return -1;
    so.threads = 2;
    so.seed = 40 + (uint64_t)f;
    so.desc.max_pos = 64;
    so.layer_gain = 0.4; /* FFNs that matter */
    pi2_model_desc *d = &so.desc;
    switch (f) {
    case F_FATRELU: /* ProSparse, with a threshold that cuts many gates */
        d->arch = PI2_ARCH_SPARSELLAMA;
        d->act = PI2_ACT_FATRELU;
        d->act_param = 0.5f;
        so.predictors = true;
        so.active_frac = 0.3;
        break;
    case F_LINEAR:
        d->arch = PI2_ARCH_LLAMA;
        d->act = PI2_ACT_SILU;
        d->rope = (pi2_rope_scaling){.type = PI2_ROPE_LINEAR, .factor = 4.0};
        break;
    case F_DYNAMIC: /* 32 positions, 64 with the scaling */
        d->max_pos = 32;
        d->rope = (pi2_rope_scaling){.type = PI2_ROPE_DYNAMIC, .factor = 2.0};
        so.predictors = true;
        break;
    case F_LLAMA3:
        d->arch = PI2_ARCH_LLAMA;
        d->act = PI2_ACT_RELU;
        d->rope = (pi2_rope_scaling){.type = PI2_ROPE_LLAMA3, .factor = 8.0, .low_freq_factor = 1.0,
                                     .high_freq_factor = 4.0, .orig_max_pos = 16};
        so.predictors = true;
        break;
    case F_PADDED: /* 400 tokens, 512 head rows whose padding would win */
        so.n_tokens = 400;
        so.predictors = true;
        break;
    default: return -1;
    }
    if (pi2_synth_write(f_src[f], &so, NULL, NULL, e))
        return -1;
    char conv[160];
    snprintf(conv, sizeof conv, "%s/%s.pi2c", g_dir, fam_name[f]);
    pi2_convert_opts co;
    pi2_convert_defaults(&co);
    co.model_dir = f_src[f];
    co.out_path = conv;
    co.calib_tokens = 256;
    co.quiet = true;
    co.threads = 1;
    if (pi2_convert(&co, NULL, e) || pi2_convert_export(conv, f_exp[f], e))
        return -1;
    /* the plain twin: the same weights with rope_scaling null */
    char cmd[1400], path[700];
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", f_exp[f], f_plain[f]);
    if (system(cmd) != 0)
        return pi2_err_set(e, PI2_EIO, "%s", cmd), -1;
    pi2_model_desc pd;
    snprintf(path, sizeof path, "%s/config.json", f_plain[f]);
    if (pi2_config_read(path, &pd, e))
        return -1;
    pd.max_pos = pi2_desc_max_ctx(&pd); /* dynamic: as many positions, unscaled */
    pd.rope = (pi2_rope_scaling){0};
    if (pd.act == PI2_ACT_FATRELU) { /* FATReLU without its threshold: ReGLU */
        pd.act = PI2_ACT_RELU;
        pd.act_param = 0.0f;
    }
    if (pi2_config_write(path, &pd, e))
        return -1;
    pi2_bundle_opts bo;
    pi2_bundle_defaults(&bo);
    bo.in_path = conv;
    bo.out_path = f_pi2[f];
    bo.key = g_key;
    bo.quiet = true;
    return pi2_bundle_create(&bo, NULL, e) ? -1 : 0;
}

static int group_setup(void **state)
{
    (void)state;
    pi2_err e = {0};
    pi2t_tmpdir(g_dir, sizeof g_dir);
    if (pi2t_keypair(g_dir, "k", &g_key, &g_pubkey, &e) || pi2t_keypair(g_dir, "k2", NULL, &g_pubkey2, &e))
        return fprintf(stderr, "keys: %s\n", e.msg), -1;
    double t0 = pi2_now();
    for (int k = 0; k < K_COUNT; k++) {
        snprintf(g_src[k], sizeof g_src[k], "%s/%s", g_dir, kind_name[k]);
        snprintf(g_conv[k], sizeof g_conv[k], "%s/%s.pi2c", g_dir, kind_name[k]);
        snprintf(g_pi2[k], sizeof g_pi2[k], "%s/%s.pi2", g_dir, kind_name[k]);
        snprintf(g_exp[k], sizeof g_exp[k], "%s/%s.q", g_dir, kind_name[k]);
        if (make_model((kind)k, &e))
            return fprintf(stderr, "%s: %s\n", kind_name[k], e.msg), -1;
    }
    for (int f = 0; f < F_COUNT; f++) {
        snprintf(f_src[f], sizeof f_src[f], "%s/%s", g_dir, fam_name[f]);
        snprintf(f_pi2[f], sizeof f_pi2[f], "%s/%s.pi2", g_dir, fam_name[f]);
        snprintf(f_exp[f], sizeof f_exp[f], "%s/%s.q", g_dir, fam_name[f]);
        snprintf(f_plain[f], sizeof f_plain[f], "%s/%s.plain", g_dir, fam_name[f]);
        if (make_family((fam)f, &e))
            return fprintf(stderr, "%s: %s\n", fam_name[f], e.msg), -1;
    }
    snprintf(g_unsigned, sizeof g_unsigned, "%s/unsigned.pi2", g_dir);
    pi2_bundle_opts bo;
    pi2_bundle_defaults(&bo);
    bo.in_path = g_conv[K_DRELU];
    bo.out_path = g_unsigned;
    bo.allow_unsigned = true;
    bo.quiet = true;
    if (pi2_bundle_create(&bo, NULL, &e))
        return fprintf(stderr, "unsigned: %s\n", e.msg), -1;
    fprintf(stderr, "  [fixtures in %.1f s]\n", pi2_now() - t0);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    pi2_sign_key_free(g_key);
    pi2_sign_key_free(g_pubkey);
    pi2_sign_key_free(g_pubkey2);
    pi2t_rmtree(g_dir);
    return 0;
}

static int reset_isa(void **state)
{
    (void)state;
    pi2_k_set_isa(pi2_k_isa_best());
    return 0;
}

static pi2_engine *open_model(const char *path, int threads, bool dense)
{
    pi2_engine_opts o;
    pi2_engine_defaults(&o);
    o.path = path;
    o.pubkey = g_pubkey;
    o.threads = threads;
    o.dense = dense;
    o.ctx = 256;
    pi2_err e = {0};
    pi2_engine *eng = NULL;
    if (pi2_engine_open(&eng, &o, &e))
        fail_msg("open %s: %s", path, e.msg);
    return eng;
}

/* A deterministic token sequence for a model: BOS then ids drawn from the
 * rng over the non-special range. */
static void make_seq(int32_t *ids, int n, int vocab, uint64_t seed)
{
    pi2_rng r;
    pi2_rng_seed(&r, seed);
    ids[0] = 1;
    for (int i = 1; i < n; i++)
        ids[i] = 3 + (int32_t)(pi2_rng_u64(&r) % (uint64_t)(vocab - 3));
}

static double max_abs(const float *a, int n)
{
    double m = 0;
    for (int i = 0; i < n; i++)
        m = fmax(m, fabs(a[i]));
    return m;
}

static double max_diff(const float *a, const float *b, int n)
{
    double m = 0;
    for (int i = 0; i < n; i++)
        m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

/* ---- dense decode vs the quantized reference ---- */

static void dense_vs_reference(kind k)
{
    pi2_engine *eng = open_model(g_pi2[k], 2, true);
    const pi2_model_desc *d = pi2_engine_desc(eng);
    pi2_err e = {0};
    pi2_ref_model *m = NULL;
    pi2_ref_state *st = NULL;
    assert_int_equal(pi2_ref_open(&m, g_exp[k], &e), 0);
    assert_int_equal(pi2_ref_state_create(&st, m, 64, &e), 0);
    int V = d->vocab, n = 40;
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
    int32_t ids[40];
    make_seq(ids, n, V, 11 + (uint64_t)k);
    double worst = 0;
    int agree = 0;
    for (int i = 0; i < n; i++) {
        assert_int_equal(pi2_engine_decode(eng, ids[i], i, a, &e), 0);
        assert_int_equal(pi2_ref_forward(m, st, ids[i], i, b, &e), 0);
        double rel = max_diff(a, b, V) / max_abs(b, V);
        worst = fmax(worst, rel);
        agree += pi2_argmax(a, V) == pi2_argmax(b, V);
    }
    /* the prefill of the same ids (rewinding): its last logits against
     * the reference's (b holds position n - 1) */
    assert_int_equal(pi2_engine_prefill(eng, ids, n, 0, a, &e), 0);
    double pre = max_diff(a, b, V) / max_abs(b, V);
    fprintf(stderr,
            "  %s dense vs quantized reference: max |logit diff| / max |logit| = %.2e, argmax %d/%d; prefill(%d) "
            "%.2e\n",
            kind_name[k], worst, agree, n, n, pre);
    /* The only difference is int8 activations (rel. error ~0.4% per block;
     * prefill's down projection of Q4 rows also requantizes the weights
     * per 32 neurons, 1/32 of a Q4 step). */
    assert_true(worst < 0.03);
    assert_true(pre < 0.03);
    assert_true(agree >= n - 2);
    free(a);
    free(b);
    pi2_ref_state_free(st);
    pi2_ref_close(m);
    pi2_engine_close(eng);
}

static void test_dense_vs_reference(void **state)
{
    (void)state;
    for (int k = 0; k < K_COUNT; k++)
        dense_vs_reference((kind)k);
}

/* ---- prefill batches vs one-token decode (dense: same arithmetic) ---- */

static void test_prefill_vs_decode(void **state)
{
    (void)state;
    for (int k = 0; k < K_COUNT; k++) {
        pi2_engine *eng = open_model(g_pi2[k], 2, true);
        const pi2_model_desc *d = pi2_engine_desc(eng);
        enum { N = PI2_K_MAX_T + 36 }; /* two batches */
        int V = d->vocab, n = N;
        int32_t ids[N];
        make_seq(ids, n, V, 5);
        float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
        pi2_err e = {0};
        assert_int_equal(pi2_engine_prefill(eng, ids, n, 0, a, &e), 0);
        for (int i = 0; i < n; i++)
            assert_int_equal(pi2_engine_decode(eng, ids[i], i, b, &e), 0);
        double rel = max_diff(a, b, V) / max_abs(b, V);
        fprintf(stderr, "  %s prefill(%d) vs decode: rel %.2e\n", kind_name[k], n, rel);
        /* Q8 rows: both paths run the int8 down projection over the same
         * aligned 16-neuron groups, and float-order differences upstream
         * (tiles vs one token) can still move a coefficient across an int8
         * rounding edge, worth up to a group scale. Q4 rows on AVX-512
         * VNNI: prefill's down is the requantized GEMM (coefficients per
         * 32 neurons), decode's the per-block one; each is ~4e-3 from the
         * exact sum. Hence not 1e-6. */
        assert_true(rel < 2e-2);
        /* rewinding: prefill the second half again from the middle */
        assert_int_equal(pi2_engine_prefill(eng, ids + n / 2, n - n / 2, n / 2, a, &e), 0);
        assert_true(max_diff(a, b, V) / max_abs(b, V) < 2e-2);
        free(a);
        free(b);
        pi2_engine_close(eng);
    }
}

/* ---- sparse vs dense: perplexity on the model's own greedy text ---- */

static double ppl(pi2_engine *eng, const int32_t *ids, int n)
{
    const pi2_model_desc *d = pi2_engine_desc(eng);
    float *lg = malloc(sizeof(float) * d->vocab);
    pi2_err e = {0};
    double nll = 0;
    for (int i = 0; i + 1 < n; i++) {
        assert_int_equal(pi2_engine_decode(eng, ids[i], i, lg, &e), 0);
        double mx = max_abs(lg, d->vocab), s = 0;
        for (int v = 0; v < d->vocab; v++)
            s += exp(lg[v] - mx);
        nll += log(s) + mx - lg[ids[i + 1]];
    }
    free(lg);
    return exp(nll / (n - 1));
}

static void test_sparse_vs_dense(void **state)
{
    (void)state;
    for (int k = 0; k < K_COUNT; k++) {
        pi2_engine *eng = open_model(g_pi2[k], 2, false);
        const pi2_model_desc *d = pi2_engine_desc(eng);
        int n = 200;
        int32_t ids[200];
        /* text: sampled from the dense model at temperature 1 */
        pi2_engine_set_dense(eng, true);
        float *lg = malloc(sizeof(float) * d->vocab);
        pi2_err e = {0};
        pi2_rng r;
        pi2_rng_seed(&r, 99 + (uint64_t)k);
        ids[0] = 1;
        for (int i = 0; i + 1 < n; i++) {
            assert_int_equal(pi2_engine_decode(eng, ids[i], i, lg, &e), 0);
            double mx = max_abs(lg, d->vocab), s = 0, u = pi2_rng_uniform(&r);
            for (int v = 0; v < d->vocab; v++)
                s += exp(lg[v] - mx);
            int pick = d->vocab - 1;
            for (int v = 0; v < d->vocab; v++) {
                u -= exp(lg[v] - mx) / s;
                if (u <= 0) {
                    pick = v;
                    break;
                }
            }
            ids[i + 1] = pick;
        }
        double pd = ppl(eng, ids, n);
        pi2_engine_set_dense(eng, false);
        pi2_engine_stats_reset(eng);
        double ps = ppl(eng, ids, n);
        pi2_engine_stats st;
        pi2_engine_stats_get(eng, &st);
        double pf = (double)st.predicted / (double)st.neurons, af = (double)st.active / (double)st.neurons;
        fprintf(stderr, "  %s (%s): perplexity dense %.4f sparse %.4f (%+.3f%%); predicted %.3f active %.3f\n",
                kind_name[k], pi2_engine_sparsity(eng), pd, ps, 100 * (ps / pd - 1), pf, af);
        assert_true(fabs(ps / pd - 1) < 0.01);
        if (k != K_SILU)
            assert_true(pf < 0.5); /* predictors really skip neurons */
        else
            assert_true(af < 0.9); /* the threshold skips down columns */
        if (k != K_MOE) /* toy experts are smaller than their f32 predictors */
            assert_true(st.weight_bytes / st.tokens < pi2_engine_dense_bytes(eng));
        free(lg);
        pi2_engine_close(eng);
    }
}

/* Decode runs the predictor as Q8 rows (eng_pred_quantize): its picks are
 * those of the f32 predictor in the container except where a score lies
 * within the quantization error of the threshold, on every layer and
 * expert of the predictor models. */
static void test_predict_q8(void **state)
{
    (void)state;
    const kind ks[] = {K_DRELU, K_RELU_Q8, K_MOE};
    for (size_t m = 0; m < sizeof ks / sizeof *ks; m++) {
        pi2_engine *eng = open_model(g_pi2[ks[m]], 2, false);
        const pi2_model_desc *d = pi2_engine_desc(eng);
        int64_t D = d->hidden;
        int E = pi2_desc_is_moe(d) ? d->n_experts : 1;
        float *x = malloc(sizeof(float) * (size_t)D), *sc = malloc(sizeof(float) * (size_t)d->n_ff);
        uint32_t *sel = malloc(sizeof(uint32_t) * (size_t)d->n_ff);
        uint8_t *picked = malloc((size_t)d->n_ff);
        pi2_rng r;
        pi2_rng_seed(&r, 11);
        uint64_t total = 0, differ = 0, agree_picks = 0, f32_picks = 0;
        for (int l = 0; l < d->n_layers; l++)
            for (int ex = 0; ex < E; ex++)
                for (int rep = 0; rep < 4; rep++) {
                    const eng_ffn *f = &eng->layers[l].ffn[ex];
                    assert_true(f->has_pred && f->rank_p % 32 == 0 && f->rank_p >= f->rank);
                    for (int64_t i = 0; i < D; i++)
                        x[i] = (float)(2 * pi2_rng_uniform(&r) - 1);
                    float h[1024];
                    assert_true(f->rank <= 1024);
                    for (int k = 0; k < f->rank; k++) {
                        double a = 0;
                        for (int64_t i = 0; i < D; i++)
                            a += (double)eng_pred_w(f, f->fc1, (size_t)(k * D + i)) * x[i];
                        h[k] = a > 0 ? (float)a : 0.0f;
                    }
                    double smax = 0;
                    for (uint32_t i = 0; i < f->n_ff; i++) {
                        double a = 0;
                        for (int k = 0; k < f->rank; k++)
                            a += (double)eng_pred_w(f, f->fc2, (size_t)((int64_t)i * f->rank + k)) * h[k];
                        sc[i] = (float)a;
                        smax = fmax(smax, fabs(a));
                    }
                    uint32_t n = eng_predict(eng, f, x, sel);
                    memset(picked, 0, f->n_ff);
                    for (uint32_t i = 0; i < n; i++)
                        picked[sel[i]] = 1;
                    for (uint32_t i = 0; i < f->n_ff; i++) {
                        bool want = sc[i] >= f->threshold;
                        total++;
                        f32_picks += want;
                        agree_picks += want && picked[i];
                        if (want != (bool)picked[i]) {
                            differ++;
                            assert_true(fabs(sc[i] - f->threshold) <= 0.03 * smax);
                        }
                    }
                }
        fprintf(stderr, "  %s: q8 predictor picks %.4f of the f32 picks, %llu of %llu neurons differ\n",
                kind_name[ks[m]], (double)agree_picks / (double)f32_picks, (unsigned long long)differ,
                (unsigned long long)total);
        assert_true(differ * 100 <= total);
        assert_true((double)agree_picks >= 0.98 * (double)f32_picks);
        free(x);
        free(sc);
        free(sel);
        free(picked);
        pi2_engine_close(eng);
    }
}

/* The read-ahead's guess, a unit at a time on one thread in its own
 * scratch (the offloader's I/O thread): the pooled predictor's picks from
 * n0 on, in order, and the same bytes counted. */
static void check_alone(pi2_engine *eng, const eng_ffn *f, const float *x, uint32_t n0, const uint32_t *want,
                        uint32_t n_want)
{
    uint32_t *sel = malloc(sizeof(uint32_t) * ((size_t)f->n_ff + ENG_PRED_UNIT)), k = 0;
    uint64_t bytes = 0, before = eng->st.weight_bytes;
    (void)eng_predict_from(eng, f, x, n0, sel);
    uint64_t pooled = eng->st.weight_bytes - before;
    int64_t units = eng_pred_start_alone(eng, f, x, n0, &eng->pb[1], &bytes);
    assert_int_equal(bytes, pooled);
    for (int64_t u = 0; u < units; u++) {
        uint32_t m = eng_pred_unit_alone(f, n0, u, sel + k, &eng->pb[1]);
        assert_int_equal(m, eng->pb[1].n[u]);
        k += m;
    }
    assert_int_equal(k, n_want);
    assert_memory_equal(sel, want, sizeof(uint32_t) * k);
    free(sel);
}

/* Read-ahead scores only the neurons not held in memory: the picks from
 * neuron n0 on are exactly the full predictor's picks at or past n0, in
 * the same order, for every layer and cut, on 1 and 3 threads, and the
 * same step by step on one thread (check_alone). */
static void test_predict_from(void **state)
{
    (void)state;
    for (int threads = 1; threads <= 3; threads += 2) {
        pi2_engine *eng = open_model(g_pi2[K_DRELU], threads, false);
        const pi2_model_desc *d = pi2_engine_desc(eng);
        float *x = malloc(sizeof(float) * (size_t)d->hidden);
        pi2_rng r;
        pi2_rng_seed(&r, 7);
        for (int l = 0; l < d->n_layers; l++) {
            const eng_ffn *f = &eng->layers[l].ffn[0];
            assert_true(f->has_pred);
            uint32_t *all = malloc(sizeof(uint32_t) * f->n_ff), *part = malloc(sizeof(uint32_t) * f->n_ff);
            for (int64_t i = 0; i < d->hidden; i++)
                x[i] = (float)(2 * pi2_rng_uniform(&r) - 1);
            uint32_t n = eng_predict(eng, f, x, all);
            assert_true(n > 0 && n < f->n_ff);
            uint32_t cuts[] = {0, 1, 63, 64, f->n_ff / 2, f->n_ff - 1, f->n_ff, f->n_ff + 5};
            for (size_t c = 0; c < sizeof cuts / sizeof *cuts; c++) {
                uint32_t m = eng_predict_from(eng, f, x, cuts[c], part), k = 0;
                for (uint32_t i = 0; i < n; i++)
                    if (all[i] >= cuts[c]) {
                        assert_true(k < m);
                        assert_int_equal(part[k], all[i]);
                        k++;
                    }
                assert_int_equal(k, m);
                check_alone(eng, f, x, cuts[c], part, m);
            }
            free(all);
            free(part);
        }
        free(x);
        pi2_engine_close(eng);
    }
}

/* The decode sums over column tiles: every output bit-for-bit the plain
 * element-by-element sum in row order, over whole tiles and a ragged tail,
 * with a row list and without, set and accumulated. */
static void test_sum_rows(void **state)
{
    (void)state;
    enum { ROWS = 37, STRIDE = 700 };
    float *base = malloc(sizeof(float) * ROWS * STRIDE), out[STRIDE], want[STRIDE];
    pi2_rng r;
    pi2_rng_seed(&r, 11);
    for (int i = 0; i < ROWS * STRIDE; i++)
        base[i] = (float)(pi2_rng_uniform(&r) * 2e3 - 1e3) * (i % 7 == 0 ? 1e-4f : 1.0f);
    const uint32_t rows[] = {36, 0, 5, 5, 17, 2, 30};
    const int64_t spans[][2] = {{0, 700}, {3, 259}, {256, 512}, {650, 700}, {10, 10}};
    for (int use = 0; use < 2; use++)
        for (int acc = 0; acc < 2; acc++)
            for (size_t sp = 0; sp < sizeof spans / sizeof *spans; sp++) {
                int64_t b = spans[sp][0], en = spans[sp][1], n = use ? 7 : ROWS;
                for (int i = 0; i < STRIDE; i++)
                    out[i] = want[i] = (float)i * 0.5f;
                for (int64_t i = b; i < en; i++) {
                    float s = 0.0f;
                    for (int64_t k = 0; k < n; k++)
                        s += base[(use ? (int64_t)rows[k] : k) * STRIDE + i];
                    want[i] = acc ? want[i] + 0.75f * s : s;
                }
                eng_sum_rows(out, base, STRIDE, use ? rows : NULL, n, b, en, acc != 0, 0.75f);
                assert_memory_equal(out, want, sizeof out);
            }
    free(base);
}

/* ---- thread counts and kernel paths ---- */

/* Logits after n tokens: the first `batch` as one prefill, the rest one at
 * a time (decode). */
/* ahead: 0 or 1 sets the engine's L2 read-ahead of decode, -1 leaves the
 * one its open chose. */
static void run_logits_ahead(const char *path, int threads, bool dense, float *out, int n, int batch, int ahead)
{
    pi2_engine *eng = open_model(path, threads, dense);
    if (ahead >= 0)
        eng->ahead = ahead == 1;
    const pi2_model_desc *d = pi2_engine_desc(eng);
    int32_t ids[48];
    make_seq(ids, n, d->vocab, 3);
    pi2_err e = {0};
    if (batch > 0)
        assert_int_equal(pi2_engine_prefill(eng, ids, batch, 0, out, &e), 0);
    for (int i = batch; i < n; i++)
        assert_int_equal(pi2_engine_decode(eng, ids[i], i, out, &e), 0);
    pi2_engine_close(eng);
}

static void run_logits(const char *path, int threads, bool dense, float *out, int n, int batch)
{
    run_logits_ahead(path, threads, dense, out, n, batch, -1);
}

/* The L2 read-ahead of decode is taken where the L2 is unknown or large
 * enough, and moves no bit of the results (it only prefetches). */
static void test_l2_ahead(void **state)
{
    (void)state;
    assert_true(eng_l2_ahead(0));
    assert_true(eng_l2_ahead(-1));
    assert_false(eng_l2_ahead(512L << 10));
    assert_true(eng_l2_ahead(ENG_AHEAD_MIN_L2));
    assert_true(eng_l2_ahead(2L << 20));
    for (int k = 0; k < K_COUNT; k++) {
        int V = 2048;
        float *a = calloc(V, sizeof(float)), *b = calloc(V, sizeof(float));
        for (int dense = 0; dense < 2; dense++) {
            run_logits_ahead(g_pi2[k], 2, dense, a, 24, 0, 1);
            run_logits_ahead(g_pi2[k], 2, dense, b, 24, 0, 0);
            assert_memory_equal(a, b, (size_t)V * sizeof(float));
        }
        free(a);
        free(b);
    }
}

static void test_threads_and_isa(void **state)
{
    (void)state;
    for (int k = 0; k < K_COUNT; k++) {
        int V = 2048;
        float *a = calloc(V, sizeof(float)), *b = calloc(V, sizeof(float)), *c = calloc(V, sizeof(float));
        run_logits(g_pi2[k], 1, false, a, 48, 24);
        run_logits(g_pi2[k], 3, false, b, 48, 24);
        assert_int_equal(pi2_k_set_isa(PI2_ISA_SCALAR), 0);
        run_logits(g_pi2[k], 2, false, c, 48, 24);
        pi2_k_set_isa(pi2_k_isa_best());
        double r1 = max_diff(a, b, V) / max_abs(a, V), r2 = max_diff(a, c, V) / max_abs(a, V);
        fprintf(stderr, "  %s: 1 vs 3 threads rel %.2e, %s vs scalar on 2 threads rel %.2e\n", kind_name[k], r1,
                pi2_k_isa_name(pi2_k_isa_best()), r2);
        /* prefill and decode: the prefill FFN adds its tiles in tile order
         * on any thread count (runtime/ffn.c; the drelu model has 8), and
         * every kernel path gives the same bits */
        assert_memory_equal(a, b, (size_t)V * sizeof(float));
        assert_memory_equal(a, c, (size_t)V * sizeof(float));
        /* decode alone: each FFN chunk's output is summed in chunk order,
         * whichever thread ran it, so the thread count changes no bit */
        for (int dense = 0; dense < 2; dense++) {
            run_logits(g_pi2[k], 1, dense, a, 24, 0);
            run_logits(g_pi2[k], 3, dense, b, 24, 0);
            assert_memory_equal(a, b, (size_t)V * sizeof(float));
        }
        free(a);
        free(b);
        free(c);
    }
}

/* ---- trust ---- */

static int try_open(const char *path, const pi2_sign_key *key, bool trust, pi2_err *e)
{
    pi2_engine_opts o;
    pi2_engine_defaults(&o);
    o.path = path;
    o.pubkey = key;
    o.trust_unsigned = trust;
    o.threads = 1;
    o.ctx = 16;
    pi2_engine *eng = NULL;
    pi2_err le = {0}; /* first error wins: a fresh one per call */
    int rc = pi2_engine_open(&eng, &o, &le);
    pi2_engine_close(eng);
    *e = le;
    return rc;
}

static void flip_byte(const char *path, uint64_t off)
{
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    uint8_t c;
    assert_int_equal(pread(fd, &c, 1, (off_t)off), 1);
    c ^= 0x5a;
    assert_int_equal(pwrite(fd, &c, 1, (off_t)off), 1);
    close(fd);
}

static void test_trust(void **state)
{
    (void)state;
    pi2_err e = {0};
    assert_int_equal(try_open(g_pi2[K_DRELU], g_pubkey, false, &e), 0);
    assert_int_equal(try_open(g_pi2[K_DRELU], g_pubkey2, false, &e), PI2_ESIG);
    assert_int_equal(try_open(g_pi2[K_DRELU], NULL, false, &e), PI2_EINVAL);
    assert_non_null(strstr(e.msg, "key"));
    assert_int_equal(try_open(g_unsigned, g_pubkey, false, &e), PI2_ESIG);
    assert_non_null(strstr(e.msg, "unsigned"));
    assert_null(strstr(e.msg, "--")); /* the problem, not a tool's flag */
    assert_int_equal(try_open(g_unsigned, NULL, true, &e), 0);

    /* tamper with one byte of a resident member, then of an FFN payload */
    pi2_bundle *b = NULL;
    pi2_bundle_open_opts bo = {.pubkey = g_pubkey};
    assert_int_equal(pi2_bundle_open(&b, g_pi2[K_DRELU], &bo, &e), 0);
    const pi2_ctr *c = pi2_bundle_container(b);
    const pi2_ctr_member *attn = NULL, *ffn = NULL;
    for (size_t i = 0; i < pi2_ctr_count(c); i++) {
        const pi2_ctr_member *m = pi2_ctr_at(c, i);
        if (!attn && strstr(m->name, "self_attn.q_proj") && strstr(m->name, ".q"))
            attn = m;
        if (!ffn && strncmp(m->name, "ffn/", 4) == 0)
            ffn = m;
    }
    assert_non_null(attn);
    assert_non_null(ffn);
    uint64_t off_attn = attn->offset + attn->size / 2, off_ffn = ffn->offset + 7;
    pi2_bundle_close(b);
    char bad[160];
    snprintf(bad, sizeof bad, "%s/bad.pi2", g_dir);
    pi2t_copy_file(g_pi2[K_DRELU], bad);
    flip_byte(bad, off_attn);
    assert_int_equal(try_open(bad, g_pubkey, false, &e), PI2_ESIG);
    assert_non_null(strstr(e.msg, "q_proj"));
    pi2t_copy_file(g_pi2[K_DRELU], bad);
    flip_byte(bad, off_ffn);
    assert_int_equal(try_open(bad, g_pubkey, false, &e), PI2_ESIG);
    assert_non_null(strstr(e.msg, "ffn/"));
    /* truncated file */
    pi2t_copy_file(g_pi2[K_DRELU], bad);
    assert_int_equal(truncate(bad, 10000), 0);
    assert_int_not_equal(try_open(bad, g_pubkey, false, &e), 0);
    assert_non_null(strstr(e.msg, "bad.pi2"));
    /* not a container at all; a converted (unbundled) model */
    pi2t_write(bad, "hello", 5);
    assert_int_not_equal(try_open(bad, g_pubkey, false, &e), 0);
    assert_int_not_equal(try_open(g_conv[K_DRELU], g_pubkey, false, &e), 0);
    assert_non_null(strstr(e.msg, "pi2-bundle"));
    unlink(bad);
}

/* ---- bad calls ---- */

static void test_bad_calls(void **state)
{
    (void)state;
    pi2_engine *eng = open_model(g_pi2[K_DRELU], 2, false);
    const pi2_model_desc *d = pi2_engine_desc(eng);
    float *lg = malloc(sizeof(float) * d->vocab);
    pi2_err e = {0};
    assert_int_equal(pi2_engine_decode(eng, d->vocab, 0, lg, &e), PI2_ERANGE);
    assert_int_equal(pi2_engine_decode(eng, -1, 0, lg, &e), PI2_ERANGE);
    assert_int_equal(pi2_engine_decode(eng, 5, 1, lg, &e), PI2_ERANGE); /* skips position 0 */
    assert_int_equal(pi2_engine_set_ctx(eng, 8, &e), 0);
    int32_t ids[9] = {1, 5, 6, 7, 8, 9, 10, 11, 12};
    assert_int_equal(pi2_engine_prefill(eng, ids, 9, 0, lg, &e), PI2_ERANGE);
    assert_int_equal(pi2_engine_prefill(eng, ids, 8, 0, lg, &e), 0);
    assert_int_equal(pi2_engine_set_ctx(eng, d->max_pos + 1, &e), PI2_ERANGE);
    free(lg);
    pi2_engine_close(eng);
}

/* ---- the families: the runtime gives the reference's greedy tokens ---- */

typedef struct greedy_run {
    int checked;           /* steps compared (not near ties) */
    double worst;          /* max |logit diff| / max |logit| against the reference, every position */
    double worst_plain;    /* the same against the plain twin (f_plain) */
} greedy_run;

/* Greedy decoding from a prompt of `np` tokens for `ng` steps on the engine
 * (dense or sparse) and on the quantized reference side by side, both fed
 * the engine's token: the tokens must agree at every step but those where
 * the reference's top-2 margin is under 3% of its logit scale (a near tie
 * that int8 activations may flip). Padded rows are masked on both sides. */
static greedy_run greedy_vs_reference(fam f, bool dense, int np, int ng)
{
    greedy_run g = {0};
    pi2_engine *eng = open_model(f_pi2[f], 2, dense);
    const pi2_model_desc *d = pi2_engine_desc(eng);
    int V = d->vocab, nt = pi2_tok_vocab_size(pi2_engine_tokenizer(eng));
    pi2_err e = {0};
    pi2_ref_model *m = NULL, *mp = NULL;
    pi2_ref_state *st = NULL, *sp = NULL;
    assert_int_equal(pi2_ref_open(&m, f_exp[f], &e), 0);
    assert_int_equal(pi2_ref_n_tokens(m), nt);
    assert_int_equal(pi2_ref_open(&mp, f_plain[f], &e), 0);
    assert_true(np + ng <= pi2_engine_ctx(eng));
    assert_int_equal(pi2_ref_state_create(&st, m, np + ng, &e), 0);
    assert_int_equal(pi2_ref_state_create(&sp, mp, np + ng, &e), 0);
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V), *c = malloc(sizeof(float) * V);
    int32_t ids[256];
    assert_true(np + ng <= 256);
    make_seq(ids, np, nt, 300 + (uint64_t)f);
    assert_int_equal(pi2_engine_prefill(eng, ids, np, 0, a, &e), 0);
    for (int i = 0; i < np; i++) {
        assert_int_equal(pi2_ref_forward(m, st, ids[i], i, b, &e), 0);
        assert_int_equal(pi2_ref_forward(mp, sp, ids[i], i, c, &e), 0);
    }
    for (int p = np; p < np + ng; p++) {
        double scale = max_abs(b, nt);
        g.worst = fmax(g.worst, max_diff(a, b, nt) / scale);
        g.worst_plain = fmax(g.worst_plain, max_diff(a, c, nt) / scale);
        pi2_logits_mask_padding(a, V, nt);
        pi2_logits_mask_padding(b, V, nt);
        int want = pi2_argmax(b, V), got = pi2_argmax(a, V);
        assert_true(got < nt);
        float second = -INFINITY;
        for (int i = 0; i < V; i++)
            if (i != want && b[i] > second)
                second = b[i];
        if (!(b[want] - second < 0.03 * scale)) {
            if (got != want)
                fail_msg("%s %s step %d: engine token %d, reference %d (margin %.3f of scale %.2f)", fam_name[f],
                         dense ? "dense" : "sparse", p - np, got, want, (double)(b[want] - second), scale);
            g.checked++;
        }
        ids[p] = got;
        if (p + 1 == np + ng)
            break;
        assert_int_equal(pi2_engine_decode(eng, got, p, a, &e), 0);
        assert_int_equal(pi2_ref_forward(m, st, got, p, b, &e), 0);
        assert_int_equal(pi2_ref_forward(mp, sp, got, p, c, &e), 0);
    }
    fprintf(stderr, "  %s %s: %d/%d greedy tokens checked as the reference's, logits within %.2e (plain twin %.2e)\n",
            fam_name[f], dense ? "dense" : "sparse", g.checked, ng, g.worst, g.worst_plain);
    free(a);
    free(b);
    free(c);
    pi2_ref_state_free(st);
    pi2_ref_state_free(sp);
    pi2_ref_close(m);
    pi2_ref_close(mp);
    pi2_engine_close(eng);
    return g;
}

/* FATReLU (ProSparse): dense and sparse decode follow the reference, whose
 * activation cuts the gates at the threshold; the sparse one reads fewer
 * bytes than dense. */
static void test_family_fatrelu(void **state)
{
    (void)state;
    pi2_engine *eng = open_model(f_pi2[F_FATRELU], 2, false);
    const pi2_model_desc *d = pi2_engine_desc(eng);
    assert_int_equal(d->arch, PI2_ARCH_SPARSELLAMA);
    assert_int_equal(d->act, PI2_ACT_FATRELU);
    assert_true(d->act_param == 0.5f);
    assert_true(pi2_desc_gate_threshold(d) == 0.5f);
    assert_string_equal(pi2_engine_sparsity(eng), "predictor");
    pi2_engine_close(eng);
    for (int dense = 1; dense >= 0; dense--) {
        greedy_run g = greedy_vs_reference(F_FATRELU, dense, 8, 40);
        assert_true(g.checked >= 10);
        assert_true(g.worst < (dense ? 0.03 : 0.1));
        assert_true(g.worst_plain > 2 * g.worst); /* the threshold is really applied */
    }
}

/* rope_scaling linear, dynamic (decoding past max_position_embeddings) and
 * llama3: the engine's logits follow the scaled reference and not the plain
 * one, and its greedy tokens are the reference's. */
static void test_family_rope(void **state)
{
    (void)state;
    const fam fs[] = {F_LINEAR, F_DYNAMIC, F_LLAMA3};
    for (size_t i = 0; i < sizeof fs / sizeof *fs; i++) {
        pi2_engine *eng = open_model(f_pi2[fs[i]], 2, true);
        const pi2_model_desc *d = pi2_engine_desc(eng);
        assert_int_equal(d->rope.type, fs[i] == F_LINEAR ? PI2_ROPE_LINEAR
                                       : fs[i] == F_DYNAMIC ? PI2_ROPE_DYNAMIC : PI2_ROPE_LLAMA3);
        /* dynamic: the context goes past max_position_embeddings, to factor x it */
        assert_int_equal(pi2_engine_ctx(eng), 64); /* dynamic: 2 x its 32 positions */
        pi2_err e = {0};
        if (fs[i] == F_DYNAMIC) {
            assert_int_equal(pi2_engine_set_ctx(eng, 65, &e), PI2_ERANGE);
            assert_int_equal(pi2_engine_set_ctx(eng, 64, &e), 0);
        }
        pi2_engine_close(eng);
        int np = 6, ng = fs[i] == F_DYNAMIC ? 58 : 50;
        greedy_run g = greedy_vs_reference(fs[i], true, np, ng);
        assert_true(g.checked >= 10);
        assert_true(g.worst < 0.03);
        assert_true(g.worst_plain > 3 * g.worst); /* the scaling is really applied */
        if (fs[i] != F_LINEAR) {
            greedy_run s = greedy_vs_reference(fs[i], false, np, ng); /* sparse decode too */
            assert_true(s.checked >= 5);
        }
    }
}

/* A padded vocabulary: the engine's logits of the padding rows win every
 * step (the fixture plants them so), and masked greedy decoding is the
 * reference's masked one. */
static void test_family_padded(void **state)
{
    (void)state;
    pi2_engine *eng = open_model(f_pi2[F_PADDED], 2, true);
    const pi2_model_desc *d = pi2_engine_desc(eng);
    assert_int_equal(d->vocab, 512);
    assert_int_equal(pi2_tok_vocab_size(pi2_engine_tokenizer(eng)), 400);
    float *lg = malloc(sizeof(float) * d->vocab);
    int32_t ids[4] = {1, 10, 20, 30};
    pi2_err e = {0};
    assert_int_equal(pi2_engine_prefill(eng, ids, 4, 0, lg, &e), 0);
    assert_true(pi2_argmax(lg, d->vocab) >= 400);
    free(lg);
    pi2_engine_close(eng);
    for (int dense = 1; dense >= 0; dense--) {
        greedy_run g = greedy_vs_reference(F_PADDED, dense, 4, 40);
        assert_true(g.checked >= 10);
    }
}

/* ---- golden: tinystories-656k at q8, dense ---- */

static void golden(const char *name, pi2_qtype qffn, bool must_agree)
{
    char dir[1024], path[1200];
    PI2T_SHARED_MODEL(dir, name);
    snprintf(path, sizeof path, "%s/EXPECTED.json", dir);
    json_t *exp = load_json(path);
    json_t *cases = json_object_get(exp, "cases");
    pi2_err e = {0};
    char out[1200];
    if (pi2t_convert_bundle(dir, g_dir, name, qffn, 0, g_key, out, sizeof out, &e))
        fail_msg("%s: %s", name, e.msg);
    pi2_engine *eng = open_model(out, 2, true);
    const pi2_model_desc *d = pi2_engine_desc(eng);
    float *lg = malloc(sizeof(float) * d->vocab);
    for (size_t ci = 0; ci < json_array_size(cases); ci++) {
        json_t *c = json_array_get(cases, ci);
        json_t *p = json_object_get(c, "prompt_ids"), *g = json_object_get(c, "generated_ids");
        size_t np = json_array_size(p), ng = json_array_size(g);
        int32_t ids[512];
        ids[0] = 1;
        for (size_t i = 0; i < np; i++)
            ids[i + 1] = (int32_t)jint(p, i);
        assert_int_equal(pi2_engine_prefill(eng, ids, (int)np + 1, 0, lg, &e), 0);
        size_t agree = 0;
        int pos = (int)np + 1;
        for (size_t s = 0; s < ng; s++) {
            int next = pi2_argmax(lg, d->vocab);
            if (next != jint(g, s))
                break;
            agree++;
            if (s + 1 < ng)
                assert_int_equal(pi2_engine_decode(eng, next, pos++, lg, &e), 0);
        }
        fprintf(stderr, "  %s q8 case %zu: %zu/%zu greedy ids as expected\n", name, ci, agree, ng);
        if (must_agree && agree < (ng < 16 ? ng : 16))
            fail_msg("%s case %zu diverges at step %zu (< 16)", name, ci, agree);
    }
    free(lg);
    pi2_engine_close(eng);
    json_decref(exp);
}

static void test_golden_tinystories(void **state)
{
    (void)state;
    golden("tinystories-656k", PI2_QT_Q8, true);
}

static void test_golden_tinystories_drelu(void **state)
{
    (void)state;
    golden("tinystories-656k-drelu", PI2_QT_Q8, false); /* report only: not required */
}

/* ---- a predictor whose Q8 copy cannot be made: a clear error at open ---- */

/* Set the first element of F32 tensor `name` of the model in dir to v, in
 * its safetensors file (at the offset the file's header gives). */
static void patch_first_f32(const char *dir, const char *name, float v)
{
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (access(path, R_OK) != 0)
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
    pi2_st *st = NULL;
    pi2_err e = {0};
    assert_int_equal(pi2_st_open(&st, path, &e), 0);
    const pi2_st_tensor *t = pi2_st_find(st, name);
    assert_non_null(t);
    assert_int_equal(t->dtype, PI2_DT_F32);
    FILE *f = fopen(t->file, "r+b");
    assert_non_null(f);
    uint8_t hl[8];
    assert_int_equal(fread(hl, 1, 8, f), 8);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | hl[i];
    assert_true(n > 0 && n < (1u << 24));
    char *hdr = malloc((size_t)n);
    assert_non_null(hdr);
    assert_int_equal(fread(hdr, 1, (size_t)n, f), (size_t)n);
    json_t *root = json_loadb(hdr, (size_t)n, 0, NULL);
    assert_non_null(root);
    json_t *off = json_array_get(json_object_get(json_object_get(root, name), "data_offsets"), 0);
    assert_true(json_is_integer(off));
    assert_int_equal(fseek(f, (long)(8 + n + (uint64_t)json_integer_value(off)), SEEK_SET), 0);
    assert_int_equal(fwrite(&v, sizeof v, 1, f), 1);
    assert_int_equal(fclose(f), 0);
    json_decref(root);
    free(hdr);
    pi2_st_close(st);
}

/* One weight of layer 1's fc1 at 1e9: finite, but past the fp16 the
 * converted model stores predictors in: the conversion refuses it with one
 * line naming the predictor, the layer and the weight. (Its Q8 row scale
 * at open, 1e9 / 127, would be past fp16 too.) */
static void test_predictor_unquantizable(void **state)
{
    (void)state;
    pi2_err e = {0};
    char src[256], out[1300], name[256];
    snprintf(src, sizeof src, "%s/bigpred", g_dir);
    pi2_synth_opts so;
    assert_int_equal(pi2_synth_preset("small", &so, &e), 0);
    so.threads = 2;
    so.desc.n_layers = 2;
    so.predictors = true;
    assert_int_equal(pi2_synth_write(src, &so, NULL, NULL, &e), 0);
    assert_true(pi2_tensor_name(name, sizeof name, &so.desc, PI2_T_PRED_FC1, 1, 0));
    patch_first_f32(src, name, 1e9f);
    int rc = pi2t_convert_bundle(src, g_dir, "bigpred", PI2_QT_Q4, 0, g_key, out, sizeof out, &e);
    fprintf(stderr, "  predictor past fp16: %s\n", e.msg);
    assert_int_equal(rc, PI2_ERANGE);
    assert_non_null(strstr(e.msg, "predictor"));
    assert_non_null(strstr(e.msg, "layer 1"));
    assert_non_null(strstr(e.msg, "fc1[0][0]"));
    assert_null(strchr(e.msg, '\n'));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_dense_vs_reference, reset_isa),
        cmocka_unit_test_teardown(test_prefill_vs_decode, reset_isa),
        cmocka_unit_test_teardown(test_sparse_vs_dense, reset_isa),
        cmocka_unit_test_teardown(test_predict_from, reset_isa),
        cmocka_unit_test_teardown(test_predict_q8, reset_isa),
        cmocka_unit_test_teardown(test_sum_rows, reset_isa),
        cmocka_unit_test_teardown(test_threads_and_isa, reset_isa),
        cmocka_unit_test_teardown(test_l2_ahead, reset_isa),
        cmocka_unit_test_teardown(test_trust, reset_isa),
        cmocka_unit_test_teardown(test_bad_calls, reset_isa),
        cmocka_unit_test_teardown(test_predictor_unquantizable, reset_isa),
        cmocka_unit_test_teardown(test_family_fatrelu, reset_isa),
        cmocka_unit_test_teardown(test_family_rope, reset_isa),
        cmocka_unit_test_teardown(test_family_padded, reset_isa),
        cmocka_unit_test_teardown(test_golden_tinystories, reset_isa),
        cmocka_unit_test_teardown(test_golden_tinystories_drelu, reset_isa),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
