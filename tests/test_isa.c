/* The same tokens on every CPU: each test model, run in the default sparse
 * mode on every instruction set this CPU has (scalar, AVX2, AVX-512 VNNI),
 * gives the same greedy tokens, the same neurons selected per token (the
 * predictor's scores against their thresholds, the SiLU threshold, the
 * ReLU-family gate's sign, MoE routing) and the same logits, bit for bit.
 * The kernels whose results feed those decisions compute their floats in
 * one order on every path (runtime/kernels.h, Numerics); this runs whole
 * models through them.
 *
 * Models: the two real TinyStories models of ../shared/models (the dReLU
 * one with trained predictors, whose gates then decide among the
 * predicted neurons; the SiLU one with trained predictors, and as
 * converted, in its threshold mode), with Q4 and Q8 FFN rows, and a
 * generated MoE model with planted predictors. Each prompt is fed token
 * by token (decode) and as one batch (prefill: the tiled FFN, the
 * superblock and down GEMMs of Q4 rows, batches of up to PI2_K_MAX_T
 * tokens, so the longest prompt takes two); the logits after the prompt
 * must agree too. Selected-neuron counts are the engine's stats per
 * decode step (predicted, active, MoE choices).
 *
 * Under emulation (PI2_EMULATED set: make test-arm64 runs this under
 * qemu-user, where float work is ~100x slower) every check stays on every
 * model kind, with fewer steps: 16 generated tokens, the prompts of 1, 12
 * and 150 tokens (the last still two prefill batches), and predictors
 * trained for the dReLU model only (~70 s of emulated float per model);
 * the SiLU model with trained predictors and the Q8 dReLU one are left to
 * the native run (the Q8 rows still run, on the SiLU threshold model). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "bundle/bundle.h"
#include "convert/convert.h"
#include "convert/synth.h"
#include "formats/sign.h"
#include "runtime/engine.h"
#include "runtime/kernels.h"
#include "runtime/sample.h"
#include "tests/testmodel.h"
#include "tests/testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char g_dir[512];
static pi2_sign_key *g_key, *g_pubkey;
static bool g_emulated; /* PI2_EMULATED: fewer steps (above) */

enum { N_PROMPT = 12, N_LONG = 150, N_GEN = 40, N_GEN_EMULATED = 16, MAX_CASES = 4 };

/* One greedy run: tokens, and per step the neurons selected and the
 * logits' hash. */
typedef struct run {
    uint64_t phash; /* the logits after the prompt */
    int32_t tok[N_GEN];
    uint64_t predicted[N_GEN], active[N_GEN], moe[N_GEN];
    uint64_t lhash[N_GEN];
} run;

static int n_gen(void) { return g_emulated ? N_GEN_EMULATED : N_GEN; }

/* Greedy decode of prompt p on the current ISA. */
static void greedy(const char *path, const int32_t *p, int np, bool prefill, run *r)
{
    pi2_engine_opts o;
    pi2_engine_defaults(&o);
    o.path = path;
    o.pubkey = g_pubkey;
    o.threads = 2;
    o.ctx = np + n_gen() + 1;
    pi2_err e = {0};
    pi2_engine *eng = NULL;
    if (pi2_engine_open(&eng, &o, &e))
        fail_msg("open %s: %s", path, e.msg);
    assert_false(pi2_engine_dense(eng));
    assert_string_not_equal(pi2_engine_sparsity(eng), "none");
    const pi2_model_desc *d = pi2_engine_desc(eng);
    float *lg = malloc(sizeof(float) * (size_t)d->vocab);
    assert_non_null(lg);
    if (prefill)
        assert_int_equal(pi2_engine_prefill(eng, p, np, 0, lg, &e), 0);
    else
        for (int i = 0; i < np; i++)
            if (pi2_engine_decode(eng, p[i], i, lg, &e))
                fail_msg("decode: %s", e.msg);
    r->phash = pi2t_fnv(lg, (size_t)d->vocab * sizeof(float));
    for (int s = 0; s < n_gen(); s++) {
        r->tok[s] = pi2_argmax(lg, (int)d->vocab);
        pi2_engine_stats_reset(eng);
        if (pi2_engine_decode(eng, r->tok[s], np + s, lg, &e))
            fail_msg("decode: %s", e.msg);
        pi2_engine_stats st;
        pi2_engine_stats_get(eng, &st);
        r->predicted[s] = st.predicted;
        r->active[s] = st.active;
        r->moe[s] = st.moe_choices;
        r->lhash[s] = pi2t_fnv(lg, (size_t)d->vocab * sizeof(float));
    }
    free(lg);
    pi2_engine_close(eng);
}

/* Every ISA of this CPU against the first (scalar). */
static void across_isas(const char *name, const char *path, int vocab, bool prefill)
{
    pi2_isa isas[PI2_ISA_COUNT];
    int ni = 0;
    for (int i = PI2_ISA_SCALAR; i < PI2_ISA_COUNT; i++)
        if (pi2_k_isa_supported((pi2_isa)i))
            isas[ni++] = (pi2_isa)i;
    int bad = 0;
    for (int c = 0; c < MAX_CASES; c++) {
        if (g_emulated && c == 2) /* the 8-token prompt: as the 12-token one */
            continue;
        int32_t p[N_LONG];
        p[0] = 1;
        uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(c + 1);
        for (int i = 1; i < N_LONG; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            p[i] = 3 + (int32_t)((s >> 33) % (uint64_t)(vocab - 3));
        }
        int np = c == 0 ? 1 : c == 3 ? N_LONG : N_PROMPT - 4 * (c - 1); /* BOS alone, 12, 8, 150 tokens */
        run r[PI2_ISA_COUNT];
        for (int k = 0; k < ni; k++) {
            assert_int_equal(pi2_k_set_isa(isas[k]), 0);
            greedy(path, p, np, prefill, &r[k]);
        }
        pi2_k_set_isa(pi2_k_isa_best());
        for (int k = 1; k < ni; k++) {
            /* first step that differs; logits: 0 after the prompt, s + 1 after step s */
            int tok = -1, sel = -1, lh = r[k].phash != r[0].phash ? 0 : -1;
            for (int st = 0; st < n_gen(); st++) {
                if (tok < 0 && r[k].tok[st] != r[0].tok[st])
                    tok = st;
                if (sel < 0 && (r[k].predicted[st] != r[0].predicted[st] || r[k].active[st] != r[0].active[st] ||
                                r[k].moe[st] != r[0].moe[st]))
                    sel = st;
                if (lh < 0 && r[k].lhash[st] != r[0].lhash[st])
                    lh = st + 1;
            }
            fprintf(stderr, "  %s %s case %d (%d tokens) %s vs %s: tokens %s%d, selections %s%d, logits %s%d\n", name,
                    prefill ? "prefill" : "decode", c, np,
                    pi2_k_isa_name(isas[k]), pi2_k_isa_name(isas[0]), tok < 0 ? "same" : "differ at ", tok,
                    sel < 0 ? "same" : "differ at ", sel, lh < 0 ? "same" : "differ at ", lh);
            bad += tok >= 0 || sel >= 0 || lh >= 0;
        }
    }
    if (bad)
        fail_msg("%s: %d runs differ across instruction sets", name, bad);
}

/* Through decode and through prefill every model must agree. */
static void shared_model(const char *model, const char *name, bool train, pi2_qtype q_ffn)
{
    char dir[1024], out[1200];
    PI2T_SHARED_MODEL(dir, model);
    pi2_err e = {0};
    if (pi2t_convert_bundle_q(dir, g_dir, name, q_ffn, PI2_QT_Q8, PI2_QT_F32, train, 0, g_key, out, sizeof out, &e))
        fail_msg("%s: %s", name, e.msg);
    across_isas(name, out, 2048, false);
    across_isas(name, out, 2048, true);
}

static void test_drelu(void **state)
{
    (void)state;
    shared_model("tinystories-656k-drelu", "ts-drelu", true, PI2_QT_Q4);
}

static void test_silu_predictors(void **state)
{
    (void)state;
    if (g_emulated) {
        print_message("isa: the SiLU model with trained predictors is left to the native run (emulated)\n");
        skip();
    }
    shared_model("tinystories-656k", "ts-pred", true, PI2_QT_Q4);
}

/* Q8 FFN rows: prefill's down projection by pi2_k_down_rows. */
static void test_q8_prefill(void **state)
{
    (void)state;
    if (!g_emulated) /* untrained, the dReLU model would run dense */
        shared_model("tinystories-656k-drelu", "ts-drelu-q8", true, PI2_QT_Q8);
    shared_model("tinystories-656k", "ts-thresh-q8", false, PI2_QT_Q8);
}

static void test_silu_threshold(void **state)
{
    (void)state;
    shared_model("tinystories-656k", "ts-thresh", false, PI2_QT_Q4);
}

/* A small MoE with planted predictors; hidden 320 (10 blocks) and FFN 640
 * (20 blocks: one 16-block step and a tail) take the kernels' short-row
 * and tail paths. */
static void test_moe(void **state)
{
    (void)state;
    pi2_err e = {0};
    pi2_synth_opts so;
    assert_int_equal(pi2_synth_preset("moe", &so, &e), 0);
    so.desc.hidden = 320;
    so.desc.n_ff = 640;
    so.desc.n_layers = 2;
    so.desc.n_heads = 5;
    so.desc.n_kv_heads = 1;
    so.desc.head_dim = 64;
    so.desc.vocab = 1024;
    so.desc.max_pos = 256;
    so.desc.n_experts = 4;
    so.dtype = PI2_DT_F32;
    so.threads = 1;
    char src[700], out[1200];
    snprintf(src, sizeof src, "%s/moe", g_dir);
    assert_int_equal(pi2_synth_write(src, &so, NULL, NULL, &e), 0);
    if (pi2t_convert_bundle(src, g_dir, "moe", PI2_QT_Q4, 0, g_key, out, sizeof out, &e))
        fail_msg("moe: %s", e.msg);
    across_isas("moe", out, 1024, false);
    across_isas("moe", out, 1024, true);
}

static int group_setup(void **state)
{
    (void)state;
    pi2_err e = {0};
    g_emulated = getenv("PI2_EMULATED") != NULL;
    pi2t_tmpdir(g_dir, sizeof g_dir);
    if (pi2t_keypair(g_dir, "k", &g_key, &g_pubkey, &e))
        return fprintf(stderr, "keys: %s\n", e.msg), -1;
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    pi2_sign_key_free(g_key);
    pi2_sign_key_free(g_pubkey);
    pi2t_rmtree(g_dir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_drelu),
        cmocka_unit_test(test_silu_predictors),
        cmocka_unit_test(test_silu_threshold),
        cmocka_unit_test(test_moe),
        cmocka_unit_test(test_q8_prefill),
    };
    return cmocka_run_group_tests_name("isa", tests, group_setup, group_teardown);
}
