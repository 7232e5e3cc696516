/* Published checkpoint families (convert/family.h), as a user meets them:
 * each tiny replica is laid out as published (checked here, and against
 * the byte-exact TurboSparse files in ../shared when present), then
 * converted, bundled and run. Imported predictors keep the published
 * convention: they read the pre-norm residual (a wrong vector is caught
 * both in the converter's report and in the runtime's picks), fire when
 * their score is > 0, and sparse decoding stays within 1% of dense. */
#include "bundle/bundle.h"
#include "convert/convert.h"
#include "convert/family.h"
#include "formats/hfconfig.h"
#include "formats/jinja.h"
#include "formats/manifest.h"
#include "formats/safetensors.h"
#include "formats/sign.h"
#include "formats/tokenizer.h"
#include "runtime/engine.h"
#include "runtime/state.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/testmodel.h"
#include "tests/testutil.h"

static char g_dir[64];
static pi2_sign_key *g_key, *g_pubkey;

static int setup(void **state)
{
    (void)state;
    pi2_err e = {0};
    pi2t_tmpdir(g_dir, sizeof g_dir);
    if (pi2t_keypair(g_dir, "k", &g_key, &g_pubkey, &e))
        return fprintf(stderr, "keys: %s\n", e.msg), -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    pi2_sign_key_free(g_key);
    pi2_sign_key_free(g_pubkey);
    pi2t_rmtree(g_dir);
    return 0;
}

/* <g_dir>/<name>, generated once. */
static const char *family_dir(const char *name)
{
    static char dirs[8][160];
    for (int i = 0; pi2_family_names[i]; i++)
        if (strcmp(pi2_family_names[i], name) == 0) {
            snprintf(dirs[i], sizeof dirs[i], "%s/%s", g_dir, name);
            if (!pi2t_exists(dirs[i])) {
                pi2_err e = {0};
                double t0 = pi2_now();
                if (pi2_family_write(dirs[i], name, 1, 2, &e))
                    fail_msg("%s: %s", name, e.msg);
                fprintf(stderr, "  [%s replica in %.1f s]\n", name, pi2_now() - t0);
            }
            return dirs[i];
        }
    fail_msg("no family %s", name);
    return NULL;
}

static char *slurp(const char *path, size_t *n)
{
    char *t = NULL;
    pi2_err e = {0};
    if (pi2_read_file(path, 64u << 20, &t, n, &e))
        fail_msg("%s", e.msg);
    return t;
}

/* The text with the integer values of the given keys replaced by "#". */
static void mask_dims(char *t)
{
    static const char *const keys[] = {"\"hidden_size\": ", "\"intermediate_size\": ", "\"num_attention_heads\": ",
                                       "\"num_hidden_layers\": ", "\"num_key_value_heads\": "};
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
        char *p = strstr(t, keys[k]);
        assert_non_null(p);
        p += strlen(keys[k]);
        char *q = p;
        while (*q >= '0' && *q <= '9')
            q++;
        *p = '#';
        memmove(p + 1, q, strlen(q) + 1);
    }
}

/* ---- layouts ---- */

static void expect_file(const char *dir, const char *name)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    if (!pi2t_exists(p))
        fail_msg("%s missing", p);
}

static void check_layout(const char *name, pi2_arch arch, pi2_act act, int vocab, int experts, pi2_dtype dt,
                         const char *const *files, bool in_ckpt)
{
    const char *dir = family_dir(name);
    for (int i = 0; files[i]; i++)
        expect_file(dir, files[i]);
    pi2_err e = {0};
    pi2_model_desc d;
    if (pi2_config_read(dir, &d, &e))
        fail_msg("%s", e.msg);
    assert_int_equal(d.arch, arch);
    assert_int_equal(d.act, act);
    assert_int_equal(d.vocab, vocab);
    assert_int_equal(d.n_experts, experts);
    pi2_st *st = NULL;
    if (pi2_st_open(&st, dir, &e))
        fail_msg("%s", e.msg);
    size_t preds = 0;
    for (size_t i = 0; i < pi2_st_count(st); i++) {
        const pi2_st_tensor *t = pi2_st_at(st, i);
        assert_int_equal(t->dtype, dt);
        preds += strstr(t->name, ".predictor.fc") != NULL;
    }
    size_t ffns = (size_t)d.n_layers * (size_t)(experts ? experts : 1);
    assert_int_equal(preds, in_ckpt ? 2 * ffns : 0);
    char n1[128];
    assert_true(pi2_tensor_name(n1, sizeof n1, &d, PI2_T_EMBED, 0, 0));
    const pi2_st_tensor *emb = pi2_st_find(st, n1);
    assert_non_null(emb);
    assert_int_equal(emb->shape[0], vocab);
    pi2_st_close(st);
    /* the chat reader takes every family's tokenizer_config.json as written
     * (ReluLLaMA's says model_max_length 1e30 as an integer) */
    char tc[512];
    snprintf(tc, sizeof tc, "%s/tokenizer_config.json", dir);
    if (pi2t_exists(tc)) {
        pi2_chat_config cc;
        if (pi2_jinja_config_read(tc, &cc, &e))
            fail_msg("%s", e.msg);
        assert_non_null(cc.eos_token);
        pi2_jinja_config_free(&cc);
    }
    fprintf(stderr, "  %s: %s / %s, vocab %d, %zu predictor tensors in the checkpoint\n", name, pi2_arch_name(arch),
            pi2_act_name(act), vocab, preds);
}

static void test_layout_turbosparse_mistral(void **state)
{
    (void)state;
    static const char *const files[] = {"config.json", "tokenizer.json", "tokenizer_config.json",
                                        "generation_config.json", "model.safetensors.index.json",
                                        "model-00001-of-00004.safetensors", "model-00004-of-00004.safetensors", NULL};
    check_layout("turbosparse-mistral", PI2_ARCH_BAMBOO, PI2_ACT_DRELU, 32064, 0, PI2_DT_BF16, files, true);
    /* config.json and tokenizer_config.json as published, but for the dimensions */
    const char *sh = pi2t_shared();
    if (!sh) {
        fprintf(stderr, "skip: the published TurboSparse files (set PI2_SHARED to the shared dir)\n");
        return;
    }
    char a[512], b[512];
    const char *dir = family_dir("turbosparse-mistral");
    size_t na, nb;
    snprintf(a, sizeof a, "%s/published-formats/turbosparse-mistral-instruct/tokenizer_config.json", sh);
    snprintf(b, sizeof b, "%s/tokenizer_config.json", dir);
    char *ta = slurp(a, &na), *tb = slurp(b, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(ta, tb, na);
    free(ta);
    free(tb);
    snprintf(a, sizeof a, "%s/published-formats/turbosparse-mistral-instruct/config.json", sh);
    snprintf(b, sizeof b, "%s/config.json", dir);
    ta = slurp(a, &na);
    tb = slurp(b, &nb);
    mask_dims(ta);
    mask_dims(tb);
    assert_string_equal(ta, tb);
    free(ta);
    free(tb);
}

static void test_layout_turbosparse_mixtral(void **state)
{
    (void)state;
    static const char *const files[] = {"config.json", "tokenizer.json", "tokenizer_config.json",
                                        "generation_config.json", "model.safetensors.index.json",
                                        "model-00003-of-00003.safetensors", NULL};
    check_layout("turbosparse-mixtral", PI2_ARCH_TURBOSPARSE_MIXTRAL, PI2_ACT_DRELU, 57024, 8, PI2_DT_BF16, files,
                 true);
}

static void test_layout_bamboo(void **state)
{
    (void)state;
    static const char *const files[] = {"config.json", "tokenizer.json", "model.safetensors.index.json",
                                        "model-00003-of-00003.safetensors", "../bamboo-predictor/model_0.pt",
                                        "../bamboo-predictor/model_1.pt", "../bamboo-predictor/config.json", NULL};
    check_layout("bamboo", PI2_ARCH_BAMBOO, PI2_ACT_DRELU, 32000, 0, PI2_DT_BF16, files, false);
}

static void test_layout_prosparse(void **state)
{
    (void)state;
    static const char *const files[] = {"config.json", "tokenizer.json", "model.safetensors.index.json",
                                        "model-00002-of-00002.safetensors", "../prosparse-predictor/model_1.pt",
                                        "../prosparse-predictor/config.json", NULL};
    check_layout("prosparse", PI2_ARCH_SPARSELLAMA, PI2_ACT_FATRELU, 32000, 0, PI2_DT_BF16, files, false);
    pi2_model_desc d;
    pi2_err e = {0};
    assert_int_equal(pi2_config_read(family_dir("prosparse"), &d, &e), 0);
    assert_true(d.act_param == 0.01f); /* hidden_act_param */
}

static void test_layout_relullama(void **state)
{
    (void)state;
    static const char *const files[] = {"config.json", "tokenizer.json", "pytorch_model.bin.index.json",
                                        "pytorch_model-00001-of-00003.bin", "pytorch_model-00003-of-00003.bin",
                                        "../relullama-predictor/model_1.pt", NULL};
    check_layout("relullama", PI2_ARCH_LLAMA, PI2_ACT_RELU, 32000, 0, PI2_DT_F32, files, false);
    /* PyTorch zip files, not safetensors under another name */
    char p[512];
    snprintf(p, sizeof p, "%s/pytorch_model-00001-of-00003.bin", family_dir("relullama"));
    size_t n;
    char *t = slurp(p, &n);
    assert_true(n > 4 && memcmp(t, "PK\x03\x04", 4) == 0);
    free(t);
}

/* ---- convert, bundle, run ---- */

static int convert(const char *src, const char *out, const char *preds, int input, FILE *report, pi2_err *e)
{
    pi2_convert_opts o;
    pi2_convert_defaults(&o);
    o.model_dir = src;
    o.out_path = out;
    o.predictors_dir = preds;
    o.pred_input = input;
    o.calib_tokens = 1024;
    o.quiet = true;
    o.threads = 1;
    return pi2_convert(&o, report, e);
}

static pi2_manifest *open_manifest(const char *path, pi2_ctr **c)
{
    pi2_err e = {0};
    if (pi2_ctr_open(c, path, &e))
        fail_msg("%s", e.msg);
    const pi2_ctr_member *m = pi2_ctr_find(*c, PI2_MF_NAME);
    assert_non_null(m);
    pi2_manifest *mf = NULL;
    if (pi2_manifest_parse((const char *)m->data, (size_t)m->size, path, &mf, &e))
        fail_msg("%s", e.msg);
    return mf;
}

/* Ids a model can output: the tokenizer's (rows past it are padding). */
static int n_valid(pi2_engine *eng)
{
    int n = pi2_tok_vocab_size(pi2_engine_tokenizer(eng));
    assert_true(n > 0 && n <= pi2_engine_desc(eng)->vocab);
    return n;
}

static double ppl(pi2_engine *eng, const int32_t *ids, int n)
{
    const pi2_model_desc *d = pi2_engine_desc(eng);
    float *lg = malloc(sizeof(float) * d->vocab);
    assert_non_null(lg);
    pi2_err e = {0};
    double nll = 0;
    int V = n_valid(eng);
    for (int i = 0; i + 1 < n; i++) {
        assert_int_equal(pi2_engine_decode(eng, ids[i], i, lg, &e), 0);
        double mx = -INFINITY, s = 0;
        for (int v = 0; v < V; v++)
            mx = lg[v] > mx ? lg[v] : mx;
        for (int v = 0; v < V; v++)
            s += exp(lg[v] - mx);
        nll += log(s) + mx - lg[ids[i + 1]];
    }
    free(lg);
    return exp(nll / (n - 1));
}

/* Text sampled from the dense model from BOS (ids the tokenizer defines): n ids. */
static void sample_text(pi2_engine *eng, int32_t *ids, int n)
{
    const pi2_model_desc *d = pi2_engine_desc(eng);
    float *lg = malloc(sizeof(float) * d->vocab);
    assert_non_null(lg);
    pi2_err e = {0};
    pi2_rng r;
    pi2_rng_seed(&r, 7);
    ids[0] = 1;
    int V = n_valid(eng);
    for (int i = 0; i + 1 < n; i++) {
        assert_int_equal(pi2_engine_decode(eng, ids[i], i, lg, &e), 0);
        double mx = -INFINITY, s = 0, u = pi2_rng_uniform(&r);
        for (int v = 0; v < V; v++)
            mx = lg[v] > mx ? lg[v] : mx;
        for (int v = 0; v < V; v++)
            s += exp(lg[v] - mx);
        int pick = 3;
        for (int v = 0; v < V; v++)
            if ((u -= exp(lg[v] - mx) / s) <= 0) {
                pick = v;
                break;
            }
        ids[i + 1] = pick;
    }
    free(lg);
}

/* Neurons the sparse decode computed that fired, over a text, with every
 * predictor reading its own vector (flip false) or the other one. */
static uint64_t active_with(pi2_engine *eng, const int32_t *ids, int n, bool flip, double *p)
{
    for (int l = 0; l < eng->d.n_layers; l++)
        for (int x = 0; x < (eng->d.n_experts > 0 ? eng->d.n_experts : 1); x++)
            eng->layers[l].ffn[x].pred_prenorm ^= flip;
    pi2_engine_stats_reset(eng);
    *p = ppl(eng, ids, n);
    pi2_engine_stats st;
    pi2_engine_stats_get(eng, &st);
    for (int l = 0; l < eng->d.n_layers; l++)
        for (int x = 0; x < (eng->d.n_experts > 0 ? eng->d.n_experts : 1); x++)
            eng->layers[l].ffn[x].pred_prenorm ^= flip;
    return st.active;
}

static bool has_eos(const pi2_model_desc *d, int id)
{
    for (int i = 0; i < d->n_eos; i++)
        if (d->eos_ids[i] == id)
            return true;
    return false;
}

/* eos: an end-of-turn id the converted model must carry besides config.json's 2 (-1: none). */
static void run_family(const char *name, const char *preds, int eos)
{
    const char *src = family_dir(name);
    char conv[256], out[256], rep[256];
    snprintf(conv, sizeof conv, "%s/%s.pi2c", g_dir, name);
    snprintf(out, sizeof out, "%s/%s.pi2", g_dir, name);
    snprintf(rep, sizeof rep, "%s/%s.report", g_dir, name);
    pi2_err e = {0};
    double t0 = pi2_now();
    FILE *rf = fopen(rep, "w");
    assert_non_null(rf);
    int rc = convert(src, conv, preds, -1, rf, &e);
    fclose(rf);
    if (rc)
        fail_msg("convert %s: %s", name, e.msg);
    size_t n;
    char *report = slurp(rep, &n);
    fprintf(stderr, "%s", report);
    assert_non_null(strstr(report, "predictors imported from"));
    assert_non_null(strstr(report, "pre-norm residual"));
    free(report);
    pi2_ctr *c = NULL;
    pi2_manifest *mf = open_manifest(conv, &c);
    assert_int_equal(mf->sparsity_mode, PI2_MF_SPARSE_PREDICTOR);
    assert_true(has_eos(&mf->config, 2));
    if (eos >= 0 && !has_eos(&mf->config, eos))
        fail_msg("%s: end-of-turn id %d (tokenizer_config.json / generation_config.json) not in the model", name, eos);
    for (size_t i = 0; i < mf->n_layers; i++) {
        const pi2_mf_predictor *p = &mf->layers[i].predictor;
        assert_true(p->imported);
        assert_int_equal(p->input, PI2_PRED_IN_PRENORM);
        assert_int_equal(p->dtype, PI2_MF_PRED_F16);
        assert_true(p->threshold == nextafterf(0.0f, INFINITY)); /* published: score > 0 */
        /* the planted predictors reach ~0.93 at the published threshold */
        if (p->report.n_eval > 20 && !(p->report.recall > 0.85))
            fail_msg("%s layer %d expert %d: imported predictor recall %.4f", name, mf->layers[i].layer,
                     mf->layers[i].expert, p->report.recall);
    }
    fprintf(stderr, "  %s quality: ppl q dense %.4f, q sparse %.4f (%+.3f%%)\n", name, mf->ppl_q_dense,
            mf->ppl_q_sparse, 100 * (mf->ppl_q_sparse / mf->ppl_q_dense - 1));
    assert_true(fabs(mf->ppl_q_sparse / mf->ppl_q_dense - 1) < 0.01);
    pi2_manifest_free(mf);
    pi2_ctr_close(c);

    pi2_bundle_opts bo;
    pi2_bundle_defaults(&bo);
    bo.in_path = conv;
    bo.out_path = out;
    bo.key = g_key;
    bo.quiet = true;
    if (pi2_bundle_create(&bo, NULL, &e))
        fail_msg("bundle %s: %s", name, e.msg);
    pi2_engine_opts o;
    pi2_engine_defaults(&o);
    o.path = out;
    o.pubkey = g_pubkey;
    o.threads = 2;
    o.ctx = 160;
    pi2_engine *eng = NULL;
    if (pi2_engine_open(&eng, &o, &e))
        fail_msg("open %s: %s", out, e.msg);
    enum { N = 160 };
    int32_t ids[N];
    pi2_engine_set_dense(eng, true);
    sample_text(eng, ids, N);
    double pd = ppl(eng, ids, N), ps, pw;
    pi2_engine_set_dense(eng, false);
    uint64_t right = active_with(eng, ids, N, false, &ps), wrong = active_with(eng, ids, N, true, &pw);
    fprintf(stderr,
            "  %s run: perplexity dense %.4f, sparse %.4f (%+.3f%%); neurons found active: %llu reading the "
            "pre-norm residual, %llu reading the normed input (ppl %.4f); %.1f s\n",
            name, pd, ps, 100 * (ps / pd - 1), (unsigned long long)right, (unsigned long long)wrong, pw,
            pi2_now() - t0);
    assert_true(fabs(ps / pd - 1) < 0.01);
    assert_true((double)right > 1.05 * (double)wrong); /* the runtime reads the vector the manifest names */
    pi2_engine_close(eng);
}

static void test_run_turbosparse_mistral(void **state)
{
    (void)state;
    run_family("turbosparse-mistral", NULL, 32000); /* <|im_end|> */
}

static void test_run_turbosparse_mixtral(void **state)
{
    (void)state;
    run_family("turbosparse-mixtral", NULL, 32000);
}

static void test_run_prosparse(void **state)
{
    (void)state;
    char p[256];
    snprintf(p, sizeof p, "%s-predictor", family_dir("prosparse"));
    run_family("prosparse", p, -1);
}

static void test_run_bamboo(void **state)
{
    (void)state;
    char p[256];
    snprintf(p, sizeof p, "%s-predictor", family_dir("bamboo"));
    run_family("bamboo", p, -1);
}

static void test_run_relullama(void **state)
{
    (void)state;
    char p[256];
    snprintf(p, sizeof p, "%s-predictor", family_dir("relullama"));
    run_family("relullama", p, -1);
}

/* Imported predictors fed the normed input instead of the residual they
 * were made for: the converter's measured recall drops. */
static void test_wrong_input(void **state)
{
    (void)state;
    const char *src = family_dir("turbosparse-mistral");
    double recall[2];
    for (int k = 0; k < 2; k++) {
        char conv[256];
        snprintf(conv, sizeof conv, "%s/wrong-%d.pi2c", g_dir, k);
        pi2_err e = {0};
        if (convert(src, conv, NULL, k == 0 ? PI2_PRED_IN_PRENORM : PI2_PRED_IN_NORMED, NULL, &e))
            fail_msg("%s", e.msg);
        pi2_ctr *c = NULL;
        pi2_manifest *mf = open_manifest(conv, &c);
        double sum = 0;
        for (size_t i = 0; i < mf->n_layers; i++)
            sum += mf->layers[i].predictor.report.recall;
        recall[k] = sum / (double)mf->n_layers;
        pi2_manifest_free(mf);
        pi2_ctr_close(c);
    }
    fprintf(stderr, "  published predictors' recall: %.4f on the pre-norm residual, %.4f on the normed input\n",
            recall[0], recall[1]);
    assert_true(recall[0] > recall[1] + 0.05);
}

/* ---- predictor sources that cannot be used: one line, before any work ---- */

static void expect_convert_error(const char *src, const char *preds, int code, const char *needle)
{
    char conv[256];
    snprintf(conv, sizeof conv, "%s/bad.pi2c", g_dir);
    pi2_err e = {0};
    double t0 = pi2_now();
    int rc = convert(src, conv, preds, -1, NULL, &e);
    fprintf(stderr, "  %s -> %s (%.2f s)\n", preds ? preds : src, e.msg, pi2_now() - t0);
    assert_int_equal(rc, code);
    if (!strstr(e.msg, needle))
        fail_msg("message '%s' does not name '%s'", e.msg, needle);
    assert_null(strchr(e.msg, '\n'));
    assert_false(pi2t_exists(conv));
    assert_true(pi2_now() - t0 < 5.0); /* refused before the long stages */
}

static void test_bad_sources(void **state)
{
    (void)state;
    const char *src = family_dir("bamboo");
    char repo[256], bad[256], p[512], q[512];
    snprintf(repo, sizeof repo, "%s-predictor", src);
    snprintf(bad, sizeof bad, "%s/badrepo", g_dir);
    assert_int_equal(mkdir(bad, 0755), 0);
    /* a layer's file missing */
    snprintf(p, sizeof p, "%s/model_0.pt", repo);
    snprintf(q, sizeof q, "%s/model_0.pt", bad);
    pi2t_copy_file(p, q);
    expect_convert_error(src, bad, PI2_ENOTFOUND, "model_1.pt");
    /* one too many */
    snprintf(p, sizeof p, "%s/model_1.pt", repo);
    snprintf(q, sizeof q, "%s/model_1.pt", bad);
    pi2t_copy_file(p, q);
    snprintf(q, sizeof q, "%s/model_2.pt", bad);
    pi2t_copy_file(p, q);
    expect_convert_error(src, bad, PI2_ESHAPE, "model_2.pt");
    unlink(q);
    /* a truncated zip in layer 1's place */
    snprintf(q, sizeof q, "%s/model_1.pt", bad);
    pi2t_write(q, "PK\x03\x04", 4);
    expect_convert_error(src, bad, PI2_EFORMAT, "model_1.pt");
    pi2t_copy_file(p, q);
    /* a config.json that is not one */
    snprintf(q, sizeof q, "%s/config.json", bad);
    pi2t_write(q, "{\"sparse_threshold\": \"high\"}", 28);
    expect_convert_error(src, bad, PI2_EFORMAT, "sparse_threshold");
    unlink(q);
    /* a directory with nothing to import */
    snprintf(q, sizeof q, "%s/empty", g_dir);
    assert_int_equal(mkdir(q, 0755), 0);
    expect_convert_error(src, q, PI2_ENOTFOUND, "model_{L}.pt");
    /* predictors of another model */
    snprintf(p, sizeof p, "%s-predictor", family_dir("relullama"));
    expect_convert_error(src, p, PI2_ESHAPE, "predictor shapes");
}

/* Predictor files beside the weights are found and used; if they cannot
 * be, the conversion says so instead of going dense. */
static void test_beside_weights(void **state)
{
    (void)state;
    const char *src = family_dir("bamboo");
    char dir[256], cmd[1024], conv[256], rep[256];
    snprintf(dir, sizeof dir, "%s/beside", g_dir);
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s' && cp -r '%s-predictor' '%s/predictor'", src, dir, src, dir);
    assert_int_equal(system(cmd), 0);
    snprintf(conv, sizeof conv, "%s/beside.pi2c", g_dir);
    snprintf(rep, sizeof rep, "%s/beside.report", g_dir);
    FILE *rf = fopen(rep, "w");
    assert_non_null(rf);
    pi2_err e = {0};
    int rc = convert(dir, conv, NULL, -1, rf, &e);
    fclose(rf);
    if (rc)
        fail_msg("%s", e.msg);
    size_t n;
    char *t = slurp(rep, &n);
    assert_non_null(strstr(t, "PowerInfer repo"));
    assert_non_null(strstr(t, "/predictor"));
    free(t);
    /* broken: a clear refusal, not a dense model */
    snprintf(cmd, sizeof cmd, "%s/predictor/model_1.pt", dir);
    unlink(cmd);
    unlink(conv);
    expect_convert_error(dir, NULL, PI2_ENOTFOUND, "beside the weights");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_turbosparse_mistral),
        cmocka_unit_test(test_layout_turbosparse_mixtral),
        cmocka_unit_test(test_layout_bamboo),
        cmocka_unit_test(test_layout_prosparse),
        cmocka_unit_test(test_layout_relullama),
        cmocka_unit_test(test_run_turbosparse_mistral),
        cmocka_unit_test(test_run_turbosparse_mixtral),
        cmocka_unit_test(test_run_bamboo),
        cmocka_unit_test(test_run_prosparse),
        cmocka_unit_test(test_run_relullama),
        cmocka_unit_test(test_wrong_input),
        cmocka_unit_test(test_bad_sources),
        cmocka_unit_test(test_beside_weights),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
