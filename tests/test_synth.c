/* Model generator: generated models load, and their measured activation
 * statistics match what was asked. */
#include "tests/testutil.h"

#include "convert/synth.h"
#include "runtime/reference.h"
#include "runtime/sample.h"

#include <dirent.h>
#include <math.h>

typedef struct acc {
    int layers, ff, r2; /* r2 = predictor rank (2r+1) */
    long tokens[64];
    double active[64];        /* sum over tokens of active share */
    long *count;              /* [layers][ff] firing counts */
    const pi2_st *st;         /* for the planted predictor */
    const pi2_model_desc *d;
    long pred_true_pos, true_pos, pred_pos;
} acc;

static void hook(void *ctx, int layer, int expert, const float *x, const float *act)
{
    acc *a = ctx;
    (void)expert;
    int n = 0;
    for (int i = 0; i < a->ff; i++)
        if (act[i] != 0.0f) {
            n++;
            a->count[(size_t)layer * a->ff + i]++;
        }
    a->active[layer] += (double)n / a->ff;
    a->tokens[layer]++;
    if (!a->st)
        return;
    /* planted predictor: score = fc2 relu(fc1 x) */
    char name[128];
    pi2_tensor_name(name, sizeof name, a->d, PI2_T_PRED_FC1, layer, expert);
    const pi2_st_tensor *fc1 = pi2_st_find(a->st, name);
    pi2_tensor_name(name, sizeof name, a->d, PI2_T_PRED_FC2, layer, expert);
    const pi2_st_tensor *fc2 = pi2_st_find(a->st, name);
    assert_non_null(fc1);
    assert_non_null(fc2);
    int R = (int)fc1->shape[0], D = (int)fc1->shape[1];
    double h[256];
    assert_true(R <= 256);
    for (int m = 0; m < R; m++) {
        double s = 0;
        for (int j = 0; j < D; j++)
            s += pi2_st_get_f32(fc1, (size_t)m * D + j) * x[j];
        h[m] = s > 0 ? s : 0;
    }
    for (int i = 0; i < a->ff; i++) {
        double s = 0;
        for (int m = 0; m < R; m++)
            s += pi2_st_get_f32(fc2, (size_t)i * R + m) * h[m];
        bool pred = s > -0.45; /* 3 sigma of the unpredictable part below 0 */
        bool truth = act[i] != 0.0f;
        a->pred_pos += pred;
        a->true_pos += truth;
        a->pred_true_pos += pred && truth;
    }
}

static void gen_opts(pi2_synth_opts *o)
{
    pi2_err err = {0};
    assert_int_equal(pi2_synth_preset("tiny", o, &err), 0);
    o->desc.hidden = 128;
    o->desc.head_dim = 32;
    o->desc.n_heads = 4;
    o->desc.n_kv_heads = 2;
    o->desc.n_ff = 512;
    o->desc.n_layers = 4;
    o->desc.vocab = 512;
    o->desc.max_pos = 512;
    o->threads = 2;
}

/* Run `ntok` random tokens through the reference with the hook. */
static void measure(const char *dir, acc *a, int ntok, bool predictor)
{
    pi2_err err = {0};
    pi2_ref_model *m = NULL;
    int rc = pi2_ref_open(&m, dir, &err);
    if (rc)
        fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, 0);
    const pi2_model_desc *d = pi2_ref_desc(m);
    memset(a, 0, sizeof *a);
    a->layers = d->n_layers;
    a->ff = d->n_ff;
    a->count = calloc((size_t)d->n_layers * d->n_ff, sizeof *a->count);
    a->d = d;
    a->st = predictor ? pi2_ref_tensors(m) : NULL;
    pi2_ref_state *s = NULL;
    assert_int_equal(pi2_ref_state_create(&s, m, ntok, &err), 0);
    pi2_ref_state_set_hook(s, hook, a);
    float *logits = malloc(sizeof(float) * d->vocab);
    pi2_rng rng;
    pi2_rng_seed(&rng, 7);
    for (int p = 0; p < ntok; p++) {
        int tok = 3 + (int)(pi2_rng_u64(&rng) % (uint64_t)(d->vocab - 3));
        assert_int_equal(pi2_ref_forward(m, s, tok, p, logits, &err), 0);
        for (int v = 0; v < d->vocab; v++)
            assert_true(isfinite(logits[v]) && fabsf(logits[v]) < 100.0f);
    }
    free(logits);
    pi2_ref_state_free(s);
    a->st = NULL;
    a->d = NULL;
    pi2_ref_close(m);
}

static void test_planted_statistics(void **state)
{
    (void)state;
    char tmp[64], dir[128];
    pi2t_tmpdir(tmp, sizeof tmp);
    snprintf(dir, sizeof dir, "%s/m", tmp);
    pi2_synth_opts o;
    gen_opts(&o);
    o.predictors = true;
    pi2_err err = {0};
    int rc = pi2_synth_write(dir, &o, NULL, NULL, &err);
    if (rc)
        fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, 0);
    acc a;
    int ntok = 300;
    measure(dir, &a, ntok, true);
    for (int l = 0; l < a.layers; l++) {
        double frac = a.active[l] / a.tokens[l];
        /* hot share: neurons that fire for most tokens */
        int hot = 0;
        long total = 0;
        long *c = a.count + (size_t)l * a.ff;
        for (int i = 0; i < a.ff; i++) {
            hot += c[i] > ntok / 2;
            total += c[i];
        }
        /* heavy tail: the 10% most frequent neurons carry a large share */
        long sorted[4096];
        memcpy(sorted, c, sizeof(long) * a.ff);
        for (int i = 1; i < a.ff; i++)
            for (int j = i; j > 0 && sorted[j] > sorted[j - 1]; j--) {
                long t = sorted[j];
                sorted[j] = sorted[j - 1];
                sorted[j - 1] = t;
            }
        long top = 0;
        for (int i = 0; i < a.ff / 10; i++)
            top += sorted[i];
        double hot_share = (double)hot / a.ff, top_share = (double)top / (double)total;
        fprintf(stderr, "layer %d: active %.3f (asked 0.10), hot share %.3f (asked 0.03), top-10%% share %.2f\n",
                l, frac, hot_share, top_share);
        assert_true(frac > 0.07 && frac < 0.13);
        assert_true(hot_share >= 0.01 && hot_share <= 0.06);
        assert_true(top_share > 0.4);
    }
    double recall = (double)a.pred_true_pos / a.true_pos;
    double ratio = (double)a.pred_pos / a.true_pos;
    fprintf(stderr, "planted predictor: recall %.4f, predicted/true active %.2f\n", recall, ratio);
    assert_true(recall >= 0.99);
    assert_true(ratio <= 2.0);
    free(a.count);
    pi2t_rmtree(tmp);
}

static void test_other_sparsity_and_act(void **state)
{
    (void)state;
    char tmp[64], dir[128];
    pi2t_tmpdir(tmp, sizeof tmp);
    snprintf(dir, sizeof dir, "%s/m", tmp);
    pi2_synth_opts o;
    gen_opts(&o);
    o.active_frac = 0.25;
    o.hot_frac = 0.05;
    o.desc.arch = PI2_ARCH_LLAMA; /* ReGLU */
    o.desc.act = PI2_ACT_RELU;
    o.dtype = PI2_DT_BF16;
    o.desc.n_layers = 8;
    pi2_err err = {0};
    assert_int_equal(pi2_synth_write(dir, &o, NULL, NULL, &err), 0);
    acc a;
    measure(dir, &a, 200, false);
    for (int l = 0; l < a.layers; l++) {
        double frac = a.active[l] / a.tokens[l];
        fprintf(stderr, "relu layer %d: active %.3f (asked 0.25)\n", l, frac);
        assert_true(frac > 0.20 && frac < 0.30);
    }
    free(a.count);
    pi2t_rmtree(tmp);
}

/* FATReLU (ProSparse's sparsellama): reads back as written; neurons fire
 * when the gate exceeds the threshold, a little under the planted share. */
static void test_fatrelu(void **state)
{
    (void)state;
    char tmp[64], dir[128];
    pi2t_tmpdir(tmp, sizeof tmp);
    snprintf(dir, sizeof dir, "%s/m", tmp);
    pi2_synth_opts o;
    gen_opts(&o);
    o.desc.arch = PI2_ARCH_SPARSELLAMA;
    o.desc.act = PI2_ACT_FATRELU;
    o.desc.act_param = 0.05f;
    pi2_err err = {0};
    assert_int_equal(pi2_synth_write(dir, &o, NULL, NULL, &err), 0);
    pi2_model_desc d;
    assert_int_equal(pi2_config_read(dir, &d, &err), 0);
    assert_int_equal(d.arch, PI2_ARCH_SPARSELLAMA);
    assert_int_equal(d.act, PI2_ACT_FATRELU);
    assert_true(d.act_param == 0.05f);
    acc a;
    measure(dir, &a, 200, false);
    for (int l = 0; l < a.layers; l++) {
        double frac = a.active[l] / a.tokens[l];
        fprintf(stderr, "fatrelu layer %d: active %.3f (asked 0.10, gate > 0.05)\n", l, frac);
        assert_true(frac > 0.06 && frac < 0.13);
    }
    free(a.count);
    /* fatrelu is not bamboo's */
    o.desc.arch = PI2_ARCH_BAMBOO;
    snprintf(dir, sizeof dir, "%s/b", tmp);
    pi2_err_clear(&err);
    assert_int_equal(pi2_synth_write(dir, &o, NULL, NULL, &err), PI2_EUNSUPPORTED);
    pi2t_rmtree(tmp);
}

/* A padded vocabulary: the tokenizer defines n_tokens ids, the head has
 * vocab rows, and the padding rows win every step unless masked. */
static void test_padded_vocab(void **state)
{
    (void)state;
    char tmp[64], dir[128];
    pi2t_tmpdir(tmp, sizeof tmp);
    for (int tied = 0; tied < 2; tied++) {
        snprintf(dir, sizeof dir, "%s/m%d", tmp, tied);
        pi2_synth_opts o;
        gen_opts(&o);
        o.n_tokens = 450;
        o.desc.tie_embeddings = tied;
        pi2_err err = {0};
        assert_int_equal(pi2_synth_write(dir, &o, NULL, NULL, &err), 0);
        pi2_ref_model *m = NULL;
        assert_int_equal(pi2_ref_open(&m, dir, &err), 0);
        const pi2_model_desc *d = pi2_ref_desc(m);
        assert_int_equal(d->vocab, 512);
        assert_int_equal(pi2_ref_n_tokens(m), 450);
        pi2_ref_state *s = NULL;
        assert_int_equal(pi2_ref_state_create(&s, m, 24, &err), 0);
        float lg[512];
        int tok = 1;
        for (int p = 0; p < 24; p++) {
            assert_int_equal(pi2_ref_forward(m, s, tok, p, lg, &err), 0);
            assert_true(pi2_argmax(lg, 512) >= 450); /* unmasked, the padding wins */
            pi2_logits_mask_padding(lg, 512, 450);
            tok = pi2_argmax(lg, 512);
            assert_true(tok < 450 && isfinite(lg[tok]));
            for (int i = 450; i < 512; i++)
                assert_true(lg[i] == -INFINITY);
        }
        pi2_ref_state_free(s);
        pi2_ref_close(m);
    }
    /* the mask's no-op cases */
    float x[4] = {1, 2, 3, 4};
    pi2_logits_mask_padding(x, 4, 0);
    pi2_logits_mask_padding(x, 4, 4);
    pi2_logits_mask_padding(x, 4, 9);
    assert_true(x[0] == 1 && x[3] == 4);
    pi2_logits_mask_padding(x, 4, 3);
    assert_true(x[2] == 3 && x[3] == -INFINITY);
    /* the tokenizer size: at least 300 (the synthetic tokenizer's least), at most vocab */
    pi2_synth_opts o;
    gen_opts(&o);
    pi2_err err = {0};
    snprintf(dir, sizeof dir, "%s/bad", tmp);
    o.n_tokens = 299;
    assert_int_equal(pi2_synth_write(dir, &o, NULL, NULL, &err), PI2_EINVAL);
    o.n_tokens = 513;
    pi2_err_clear(&err);
    assert_int_equal(pi2_synth_write(dir, &o, NULL, NULL, &err), PI2_EINVAL);
    assert_non_null(strstr(err.msg, "tokenizer size"));
    pi2t_rmtree(tmp);
}

static long dir_count(const char *dir, const char *suffix)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    long n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name), s = strlen(suffix);
        n += l >= s && strcmp(e->d_name + l - s, suffix) == 0;
    }
    closedir(d);
    return n;
}

static void test_sharded_and_deterministic(void **state)
{
    (void)state;
    char tmp[64], d1[128], d2[128], cmd[512];
    pi2t_tmpdir(tmp, sizeof tmp);
    snprintf(d1, sizeof d1, "%s/a", tmp);
    snprintf(d2, sizeof d2, "%s/b", tmp);
    pi2_synth_opts o;
    gen_opts(&o);
    o.dtype = PI2_DT_F16;
    o.shard_bytes = 1 << 20;
    pi2_err err = {0};
    assert_int_equal(pi2_synth_write(d1, &o, NULL, NULL, &err), 0);
    o.threads = 1;
    assert_int_equal(pi2_synth_write(d2, &o, NULL, NULL, &err), 0);
    assert_true(dir_count(d1, ".safetensors") > 1);
    assert_int_equal(dir_count(d1, ".index.json"), 1);
    snprintf(cmd, sizeof cmd, "diff -r '%s' '%s' >/dev/null", d1, d2);
    assert_int_equal(system(cmd), 0); /* same bytes whatever the thread count */
    acc a;
    measure(d1, &a, 16, false);
    free(a.count);
    /* an existing directory is refused */
    pi2_err_clear(&err);
    assert_int_equal(pi2_synth_write(d1, &o, NULL, NULL, &err), PI2_EINVAL);
    assert_non_null(strstr(err.msg, "already exists"));
    pi2t_rmtree(tmp);
}

static void test_bad_options_and_disk_full(void **state)
{
    (void)state;
    char tmp[64], dir[128];
    pi2t_tmpdir(tmp, sizeof tmp);
    snprintf(dir, sizeof dir, "%s/m", tmp);
    pi2_synth_opts o;
    pi2_err err = {0};
    assert_int_equal(pi2_synth_preset("nonesuch", &o, &err), PI2_EINVAL);
    gen_opts(&o);
    o.active_frac = 0.02; /* below what the hot share alone gives */
    pi2_err_clear(&err);
    assert_int_equal(pi2_synth_write(dir, &o, NULL, NULL, &err), PI2_EINVAL);
    assert_non_null(strstr(err.msg, "too small"));
    gen_opts(&o);
    o.desc.n_kv_heads = 3;
    pi2_err_clear(&err);
    assert_true(pi2_synth_write(dir, &o, NULL, NULL, &err) < 0);
    /* disk full half way: nothing left behind */
    gen_opts(&o);
    pi2_afile_fail_after(300000);
    pi2_err_clear(&err);
    int rc = pi2_synth_write(dir, &o, NULL, NULL, &err);
    pi2_afile_fail_after(-1);
    assert_int_equal(rc, PI2_ENOSPC);
    assert_false(pi2t_exists(dir));
    DIR *d = opendir(tmp);
    assert_non_null(d);
    struct dirent *e;
    int entries = 0;
    while ((e = readdir(d)) != NULL)
        entries += e->d_name[0] != '.';
    closedir(d);
    assert_int_equal(entries, 0); /* no temporary directory left either */
    pi2t_rmtree(tmp);
}

static void test_weight_bytes(void **state)
{
    (void)state;
    pi2_synth_opts o;
    pi2_err err = {0};
    assert_int_equal(pi2_synth_preset("7b", &o, &err), 0);
    uint64_t b = pi2_synth_weight_bytes(&o);
    /* 7.24e9 parameters in BF16 */
    assert_true(b > 14000000000ull && b < 15000000000ull);
    assert_int_equal(pi2_synth_preset("moe", &o, &err), 0);
    b = pi2_synth_weight_bytes(&o);
    assert_true(b > 8000000000ull && b < 10500000000ull);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_planted_statistics),
        cmocka_unit_test(test_other_sparsity_and_act),
        cmocka_unit_test(test_fatrelu),
        cmocka_unit_test(test_padded_vocab),
        cmocka_unit_test(test_sharded_and_deterministic),
        cmocka_unit_test(test_bad_options_and_disk_full),
        cmocka_unit_test(test_weight_bytes),
    };
    return cmocka_run_group_tests_name("synth", tests, NULL, NULL);
}
