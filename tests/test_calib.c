/* Tests for convert/calib: the batched forward against the reference
 * (prefill, batched decode, mixed chunks) on the shared real models and on
 * generated dense dReLU / ReGLU / SiLU and MoE top-2 models; FFN hook inputs
 * and activations against the reference hook; zeroing activations against a
 * reference model whose down columns are zeroed; the weight hook; NLL
 * against reference log-softmax; self-generated text; every error. */
#include "tests/testutil.h"

#include <math.h>

#include "convert/calib.h"
#include "convert/synth.h"
#include "formats/hfconfig.h"
#include "formats/safetensors.h"
#include "runtime/reference.h"
#include "runtime/sample.h"

#define TOL 1e-3

/* Generated models, made once for the whole run. */
enum { M_DRELU, M_RELU, M_SILU, M_MOE, M_MOE_SILU, M_FATRELU, M_LINEAR, M_DYNAMIC, M_LLAMA3, M_PADDED, N_GEN };
static const char *const gen_name[N_GEN] = { "drelu", "reglu", "silu", "moe-drelu-top2", "moe-silu-top2",
                                             "fatrelu", "rope-linear", "rope-dynamic", "rope-llama3",
                                             "padded-vocab" };
static char g_tmp[64];
static char g_dir[N_GEN][128];
static double g_max_err; /* largest logit error seen against the reference */

static void note_err(double e)
{
    if (e > g_max_err)
        g_max_err = e;
}

static int make_models(void **state)
{
    (void)state;
    pi2t_tmpdir(g_tmp, sizeof g_tmp);
    for (int i = 0; i < N_GEN; i++) {
        pi2_synth_opts o;
        pi2_err e = { 0 };
        if (pi2_synth_preset("tiny", &o, &e) != 0)
            return -1;
        pi2_model_desc *d = &o.desc;
        d->hidden = 64;
        d->n_heads = 4;
        d->n_kv_heads = 2;
        d->head_dim = 16;
        d->n_ff = 192;
        d->n_layers = 2;
        d->vocab = 300; /* not a multiple of the head block: a short last block */
        d->max_pos = 128;
        o.seed = 11 + (uint64_t)i;
        o.layer_gain = 0.5; /* FFNs that matter */
        o.threads = 2;
        switch (i) {
        case M_DRELU: o.dtype = PI2_DT_BF16; break;
        case M_RELU: d->arch = PI2_ARCH_LLAMA; d->act = PI2_ACT_RELU; o.dtype = PI2_DT_F16; break;
        case M_SILU: d->arch = PI2_ARCH_LLAMA; d->act = PI2_ACT_SILU; d->tie_embeddings = true; break;
        case M_MOE:
            d->arch = PI2_ARCH_TURBOSPARSE_MIXTRAL;
            d->n_experts = 4;
            d->n_experts_used = 2;
            break;
        case M_MOE_SILU:
            d->arch = PI2_ARCH_MIXTRAL;
            d->act = PI2_ACT_SILU;
            d->n_experts = 4;
            d->n_experts_used = 2;
            o.dtype = PI2_DT_BF16;
            break;
        case M_FATRELU: /* a threshold that cuts many gates */
            d->arch = PI2_ARCH_SPARSELLAMA;
            d->act = PI2_ACT_FATRELU;
            d->act_param = 0.3f;
            break;
        case M_LINEAR:
            d->arch = PI2_ARCH_LLAMA;
            d->act = PI2_ACT_SILU;
            d->rope = (pi2_rope_scaling){ .type = PI2_ROPE_LINEAR, .factor = 4.0 };
            break;
        case M_DYNAMIC: /* past max_position_embeddings within the 24 positions checked */
            d->max_pos = 16;
            d->rope = (pi2_rope_scaling){ .type = PI2_ROPE_DYNAMIC, .factor = 2.0 };
            break;
        case M_LLAMA3: /* hd 16, theta 1e4: wavelengths 6.3 (kept), 20 and 63 (blended), 199.. (divided) */
            d->arch = PI2_ARCH_LLAMA;
            d->act = PI2_ACT_RELU;
            d->rope = (pi2_rope_scaling){ .type = PI2_ROPE_LLAMA3, .factor = 8.0, .low_freq_factor = 1.0,
                                          .high_freq_factor = 4.0, .orig_max_pos = 64 };
            break;
        case M_PADDED: /* 300 tokens, 340 head rows whose padding would win */
            d->vocab = 340;
            o.n_tokens = 300;
            break;
        }
        snprintf(g_dir[i], sizeof g_dir[i], "%s/%s", g_tmp, gen_name[i]);
        if (pi2_synth_write(g_dir[i], &o, NULL, NULL, &e) != 0) {
            fprintf(stderr, "synth %s: %s\n", gen_name[i], e.msg);
            return -1;
        }
    }
    return 0;
}

static int drop_models(void **state)
{
    (void)state;
    pi2t_rmtree(g_tmp);
    print_message("max |calib - reference| logit error over all comparisons: %.3g\n", g_max_err);
    return 0;
}

static pi2_ref_model *open_ref(const char *dir)
{
    pi2_err e = { 0 };
    pi2_ref_model *m = NULL;
    if (pi2_ref_open(&m, dir, &e) != 0)
        fail_msg("%s", e.msg);
    return m;
}

static pi2_calib_state *make_state(const pi2_ref_model *m, int n_seq, int max_len, const pi2_calib_opts *o)
{
    pi2_err e = { 0 };
    pi2_calib_state *s = NULL;
    if (pi2_calib_state_create(&s, m, n_seq, max_len, o, &e) != 0)
        fail_msg("%s", e.msg);
    return s;
}

static void fwd(pi2_calib_state *s, const int32_t *tok, int n_new, float *logits)
{
    pi2_err e = { 0 };
    if (pi2_calib_forward(s, tok, n_new, logits, &e) != 0)
        fail_msg("%s", e.msg);
}

/* Random tokens [n_seq][len]; the first of each sequence is BOS. */
static int32_t *rand_tokens(int n_seq, int len, int vocab, uint64_t seed)
{
    int32_t *t = malloc(sizeof *t * (size_t)n_seq * (size_t)len);
    assert_non_null(t);
    pi2_rng r;
    pi2_rng_seed(&r, seed);
    for (int i = 0; i < n_seq * len; i++)
        t[i] = i % len == 0 ? 1 : (int32_t)(pi2_rng_u64(&r) % (uint64_t)vocab);
    return t;
}

/* Reference logits [n_seq][len][vocab], one sequence at a time; hook optional. */
static float *ref_logits(const pi2_ref_model *m, const int32_t *tok, int n_seq, int len, pi2_ref_ffn_hook hook,
                         void *ctx, int *cur_seq, int *cur_pos)
{
    int V = pi2_ref_desc(m)->vocab;
    float *out = malloc(sizeof(float) * (size_t)n_seq * (size_t)len * (size_t)V);
    assert_non_null(out);
    pi2_err e = { 0 };
    pi2_ref_state *rs = NULL;
    if (pi2_ref_state_create(&rs, m, len, &e) != 0)
        fail_msg("%s", e.msg);
    pi2_ref_state_set_hook(rs, hook, ctx);
    for (int q = 0; q < n_seq; q++)
        for (int p = 0; p < len; p++) {
            if (cur_seq)
                *cur_seq = q;
            if (cur_pos)
                *cur_pos = p;
            if (pi2_ref_forward(m, rs, tok[q * len + p], p, out + ((size_t)q * len + p) * V, &e) != 0)
                fail_msg("%s", e.msg);
        }
    pi2_ref_state_free(rs);
    return out;
}

static double max_diff(const float *a, const float *b, size_t n)
{
    double mx = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= mx)) /* NaN counts */
            mx = isnan(d) ? INFINITY : d;
    }
    return mx;
}

static void expect_close(const char *what, const char *model, const float *a, const float *b, size_t n)
{
    double err = max_diff(a, b, n);
    note_err(err);
    if (!(err < TOL))
        fail_msg("%s on %s: max logit error %g >= %g", what, model, err, TOL);
}

/* (a) prefill of whole sequences, (b) token-by-token batched decode after a
 * reset, (c) mixed chunks (prefill, a block, then decode) against the
 * reference's logits. */
static void check_model(const char *dir, const char *name)
{
    enum { B = 3, L = 24 };
    pi2_ref_model *m = open_ref(dir);
    int V = pi2_ref_desc(m)->vocab;
    int32_t *tok = rand_tokens(B, L, V, 42);
    float *ref = ref_logits(m, tok, B, L, NULL, NULL, NULL, NULL);
    float *got = malloc(sizeof(float) * B * L * (size_t)V), *step = malloc(sizeof(float) * B * (size_t)V);
    int32_t col[B * L];
    assert_non_null(got);
    assert_non_null(step);
    pi2_calib_opts o = { .threads = 2 };
    pi2_calib_state *s = make_state(m, B, L, &o);

    /* (a) prefill */
    fwd(s, tok, L, got);
    expect_close("prefill", name, got, ref, (size_t)B * L * V);
    assert_int_equal(pi2_calib_len(s), L);
    for (int q = 0; q < B; q++) /* kept last-position logits */
        assert_memory_equal(pi2_calib_logits(s) + (size_t)q * V, got + ((size_t)q * L + L - 1) * V,
                            sizeof(float) * V);

    /* (b) batched decode, one token per sequence per call */
    pi2_calib_reset(s);
    assert_null(pi2_calib_logits(s));
    for (int p = 0; p < L; p++) {
        for (int q = 0; q < B; q++)
            col[q] = tok[q * L + p];
        fwd(s, col, 1, p % 2 ? step : NULL);
        const float *have = p % 2 ? step : pi2_calib_logits(s);
        for (int q = 0; q < B; q++)
            expect_close("decode", name, have + (size_t)q * V, ref + ((size_t)q * L + p) * V, (size_t)V);
    }

    /* (c) chunks of 7, 5, then single tokens: blocks starting past 0 */
    pi2_calib_reset(s);
    int p = 0;
    static const int chunks[] = { 7, 5, 1, 1, 3, 1 };
    for (size_t c = 0; c < sizeof chunks / sizeof *chunks; c++) {
        int n = chunks[c];
        for (int q = 0; q < B; q++)
            for (int i = 0; i < n; i++)
                col[q * n + i] = tok[q * L + p + i];
        fwd(s, col, n, got);
        for (int q = 0; q < B; q++)
            expect_close("chunked", name, got + (size_t)q * n * V, ref + ((size_t)q * L + p) * V, (size_t)n * V);
        p += n;
    }
    assert_int_equal(pi2_calib_len(s), p);

    /* one thread gives the same numbers (up to summation order) */
    pi2_calib_opts o1 = { .threads = 1 };
    pi2_calib_set_opts(s, &o1);
    pi2_calib_reset(s);
    fwd(s, tok, L, got);
    expect_close("prefill (1 thread)", name, got, ref, (size_t)B * L * V);

    pi2_calib_state_free(s);
    free(tok);
    free(ref);
    free(got);
    free(step);
    pi2_ref_close(m);
}

static void test_shared_silu(void **state)
{
    (void)state;
    char dir[1024];
    PI2T_SHARED_MODEL(dir, "tinystories-656k");
    check_model(dir, "tinystories-656k");
}

static void test_shared_drelu(void **state)
{
    (void)state;
    char dir[1024];
    PI2T_SHARED_MODEL(dir, "tinystories-656k-drelu");
    check_model(dir, "tinystories-656k-drelu");
}

static void test_generated(void **state)
{
    (void)state;
    for (int i = 0; i < N_GEN; i++)
        check_model(g_dir[i], gen_name[i]);
}

/* ---- the FFN hook sees what the reference hook sees ---- */

enum { HB = 2, HL = 10 };

typedef struct hook_rec {
    int d, ff, n_layers, n_exp;
    int seq, pos;       /* the reference's current token */
    int base, n_new;    /* calib: position of row 0, rows per sequence */
    float *x, *a;       /* reference: [HB][HL][layers][experts][d or ff] */
    unsigned char *ref_seen, *cal_seen; /* [HB][HL][layers][experts] */
    double err_x, err_a;
    double err_r; /* R against X: rmsnorm(R) * ffn_norm should give X */
    const pi2_ref_model *m;
    float eps;
    int calls;
    int qd;              /* heads * head_dim: O's input */
    int in_calls[PI2_T_ROUTER + 1]; /* input hook calls per part */
    double err_in;       /* input hook's GATE/UP rows against X, DOWN's against A */
} hook_rec;

static size_t rec_idx(const hook_rec *h, int q, int p, int l, int e)
{
    return (((size_t)q * HL + p) * h->n_layers + l) * h->n_exp + e;
}

static void ref_hook(void *ctx, int layer, int expert, const float *x, const float *act)
{
    hook_rec *h = ctx;
    size_t i = rec_idx(h, h->seq, h->pos, layer, expert);
    memcpy(h->x + i * h->d, x, sizeof(float) * h->d);
    memcpy(h->a + i * h->ff, act, sizeof(float) * h->ff);
    h->ref_seen[i]++;
}

static void cal_hook(void *ctx, int layer, int expert, int n, const int32_t *rows, const float *X, const float *R,
                     float *A)
{
    hook_rec *h = ctx;
    h->calls++;
    const pi2_st_tensor *nw = pi2_ref_weight(h->m, PI2_T_FFN_NORM, layer, 0);
    for (int r = 0; r < n; r++) {
        const float *rr = R + (size_t)r * h->d;
        double ss = 0;
        for (int j = 0; j < h->d; j++)
            ss += (double)rr[j] * rr[j];
        double inv = 1.0 / sqrt(ss / h->d + h->eps);
        for (int j = 0; j < h->d; j++)
            h->err_r = fmax(h->err_r, fabs(rr[j] * inv * pi2_st_get_f32(nw, (size_t)j) - X[(size_t)r * h->d + j]));
        if (r > 0)
            assert_true(rows[r] > rows[r - 1]);
        int q = rows[r] / h->n_new, p = h->base + rows[r] % h->n_new;
        assert_true(q < HB && p < HL);
        size_t i = rec_idx(h, q, p, layer, expert);
        h->cal_seen[i]++;
        for (int j = 0; j < h->d; j++)
            h->err_x = fmax(h->err_x, fabs((double)X[(size_t)r * h->d + j] - h->x[i * h->d + j]));
        for (int j = 0; j < h->ff; j++)
            h->err_a = fmax(h->err_a, fabs((double)A[(size_t)r * h->ff + j] - h->a[i * h->ff + j]));
    }
}

/* The input hook: every product's rows, the FFN's the same as the FFN
 * hook's X and A (DOWN's after it). */
static void in_hook(void *ctx, pi2_tname t, int layer, int expert, int n, const int32_t *rows, const float *in,
                    int64_t cols)
{
    hook_rec *h = ctx;
    h->in_calls[t]++;
    bool ffn = t == PI2_T_GATE || t == PI2_T_UP || t == PI2_T_DOWN;
    assert_true(ffn == (rows != NULL));
    int w = t == PI2_T_DOWN ? h->ff : t == PI2_T_O ? h->qd : h->d;
    assert_int_equal(cols, w);
    for (int r = 0; ffn && r < n; r++) {
        size_t i = rec_idx(h, rows[r] / h->n_new, h->base + rows[r] % h->n_new, layer, expert);
        const float *want = (t == PI2_T_DOWN ? h->a : h->x) + i * (size_t)w;
        for (int j = 0; j < w; j++)
            h->err_in = fmax(h->err_in, fabs((double)in[(size_t)r * w + j] - want[j]));
    }
}

static void check_hook(const char *dir, const char *name)
{
    pi2_ref_model *m = open_ref(dir);
    const pi2_model_desc *d = pi2_ref_desc(m);
    hook_rec h = { .d = d->hidden, .ff = d->n_ff, .n_layers = d->n_layers,
                   .n_exp = pi2_desc_is_moe(d) ? d->n_experts : 1, .m = m, .eps = d->rms_eps,
                   .qd = d->n_heads * d->head_dim };
    size_t n_slots = (size_t)HB * HL * h.n_layers * h.n_exp;
    h.x = calloc(n_slots * h.d, sizeof(float));
    h.a = calloc(n_slots * h.ff, sizeof(float));
    h.ref_seen = calloc(n_slots, 1);
    h.cal_seen = calloc(n_slots, 1);
    assert_true(h.x && h.a && h.ref_seen && h.cal_seen);
    int32_t *tok = rand_tokens(HB, HL, d->vocab, 7);
    float *ref = ref_logits(m, tok, HB, HL, ref_hook, &h, &h.seq, &h.pos);

    pi2_calib_opts o = { .threads = 2, .ffn = cal_hook, .ffn_ctx = &h, .input = in_hook, .input_ctx = &h };
    pi2_calib_state *s = make_state(m, HB, HL, &o);
    /* prefill of 6, then batched decode of the remaining 4 */
    int32_t col[HB * 6];
    for (int q = 0; q < HB; q++)
        memcpy(col + q * 6, tok + q * HL, sizeof(int32_t) * 6);
    h.base = 0;
    h.n_new = 6;
    fwd(s, col, 6, NULL);
    int expect_calls = h.n_layers; /* dense: once per layer; MoE: at most experts per layer */
    if (h.n_exp == 1)
        assert_int_equal(h.calls, expect_calls);
    for (int p = 6; p < HL; p++) {
        for (int q = 0; q < HB; q++)
            col[q] = tok[q * HL + p];
        h.base = p;
        h.n_new = 1;
        fwd(s, col, 1, NULL);
    }
    for (size_t i = 0; i < n_slots; i++)
        if (h.ref_seen[i] != h.cal_seen[i])
            fail_msg("%s: slot %zu seen %d times by the reference hook, %d by calib", name, i, h.ref_seen[i],
                     h.cal_seen[i]);
    if (!(h.err_x < 1e-4 && h.err_a < TOL))
        fail_msg("%s: hook X error %g, A error %g", name, h.err_x, h.err_a);
    if (!(h.err_r < 1e-4)) /* R is the residual the FFN's norm read (the PowerInfer predictors' input) */
        fail_msg("%s: hook R is not the pre-norm residual of X: error %g", name, h.err_r);
    int fwds = 1 + HL - 6; /* input hook: once per product per forward; the FFN's as the FFN hook */
    const pi2_tname per_layer[] = {PI2_T_Q, PI2_T_K, PI2_T_V, PI2_T_O};
    for (size_t k = 0; k < 4; k++)
        assert_int_equal(h.in_calls[per_layer[k]], fwds * h.n_layers);
    assert_int_equal(h.in_calls[PI2_T_LM_HEAD], fwds);
    assert_int_equal(h.in_calls[PI2_T_GATE], h.calls);
    assert_int_equal(h.in_calls[PI2_T_UP], h.calls);
    assert_int_equal(h.in_calls[PI2_T_DOWN], h.calls);
    assert_int_equal(h.in_calls[PI2_T_EMBED] + h.in_calls[PI2_T_ROUTER], 0);
    if (!(h.err_in < TOL))
        fail_msg("%s: input hook rows differ from the FFN hook's by %g", name, h.err_in);
    print_message("%s: hook max error X %.3g, A %.3g, norm(R) vs X %.3g\n", name, h.err_x, h.err_a, h.err_r);
    pi2_calib_state_free(s);
    free(tok);
    free(ref);
    free(h.x);
    free(h.a);
    free(h.ref_seen);
    free(h.cal_seen);
    pi2_ref_close(m);
}

static void test_hook_dense(void **state)
{
    (void)state;
    check_hook(g_dir[M_DRELU], gen_name[M_DRELU]);
    check_hook(g_dir[M_SILU], gen_name[M_SILU]);
}

static void test_hook_moe(void **state)
{
    (void)state;
    check_hook(g_dir[M_MOE], gen_name[M_MOE]);
    check_hook(g_dir[M_MOE_SILU], gen_name[M_MOE_SILU]);
}

/* ---- zeroing activations == a model whose down columns are zero ---- */

static bool dropped(int j) { return j % 3 == 0; }

static bool is_down(const pi2_ref_model *m, const pi2_st_tensor *t)
{
    const pi2_model_desc *d = pi2_ref_desc(m);
    int ne = pi2_desc_is_moe(d) ? d->n_experts : 1;
    for (int l = 0; l < d->n_layers; l++)
        for (int e = 0; e < ne; e++)
            if (pi2_ref_weight(m, PI2_T_DOWN, l, e) == t)
                return true;
    return false;
}

/* Copy of the model at `src` into `dst` with down columns dropped(j) zeroed. */
static void write_pruned(const pi2_ref_model *m, const char *dst)
{
    pi2_err e = { 0 };
    char path[512];
    assert_int_equal(mkdir(dst, 0755), 0);
    if (pi2_config_write(dst, pi2_ref_desc(m), &e) != 0)
        fail_msg("%s", e.msg);
    snprintf(path, sizeof path, "%s/model.safetensors", dst);
    pi2_st_writer *w = NULL;
    if (pi2_st_writer_create(&w, path, &e) != 0)
        fail_msg("%s", e.msg);
    const pi2_st *st = pi2_ref_tensors(m);
    for (size_t i = 0; i < pi2_st_count(st); i++) {
        const pi2_st_tensor *t = pi2_st_at(st, i);
        if (pi2_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, &e) != 0)
            fail_msg("%s", e.msg);
    }
    for (size_t i = 0; i < pi2_st_count(st); i++) {
        const pi2_st_tensor *t = pi2_st_at(st, i);
        uint8_t *buf = malloc(t->nbytes ? t->nbytes : 1);
        assert_non_null(buf);
        memcpy(buf, t->data, t->nbytes);
        if (is_down(m, t)) { /* (d, ff): zero bytes are +0.0 in every float dtype */
            size_t es = pi2_dtype_size(t->dtype), ff = (size_t)t->shape[1];
            for (size_t r = 0; r < (size_t)t->shape[0]; r++)
                for (size_t j = 0; j < ff; j++)
                    if (dropped((int)j))
                        memset(buf + (r * ff + j) * es, 0, es);
        }
        if (pi2_st_writer_write(w, buf, t->nbytes, &e) != 0)
            fail_msg("%s", e.msg);
        free(buf);
    }
    if (pi2_st_writer_finish(w, &e) != 0)
        fail_msg("%s", e.msg);
}

typedef struct zero_ctx {
    int ff;
    int calls;
    bool all;
} zero_ctx;

static void zero_hook(void *ctx, int layer, int expert, int n, const int32_t *rows, const float *X, const float *R,
                      float *A)
{
    (void)layer;
    (void)expert;
    (void)rows;
    (void)X;
    (void)R;
    zero_ctx *z = ctx;
    z->calls++;
    for (int r = 0; r < n; r++)
        for (int j = 0; j < z->ff; j++)
            if (z->all || dropped(j))
                A[(size_t)r * z->ff + j] = 0.0f;
}

static void zero_down_weight(void *ctx, pi2_tname t, int layer, int expert, float *w, int64_t rows, int64_t cols)
{
    (void)layer;
    (void)expert;
    int *calls = ctx;
    (*calls)++;
    if (t != PI2_T_DOWN)
        return;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < cols; j++)
            if (dropped((int)j))
                w[r * cols + j] = 0.0f;
}

static void check_zeroing(int which)
{
    enum { B = 2, L = 12 };
    pi2_ref_model *m = open_ref(g_dir[which]);
    const pi2_model_desc *d = pi2_ref_desc(m);
    int V = d->vocab;
    char pruned[256];
    snprintf(pruned, sizeof pruned, "%s/%s-pruned", g_tmp, gen_name[which]);
    write_pruned(m, pruned);
    pi2_ref_model *mp = open_ref(pruned);
    int32_t *tok = rand_tokens(B, L, V, 99);
    float *ref = ref_logits(mp, tok, B, L, NULL, NULL, NULL, NULL);
    float *orig = ref_logits(m, tok, B, L, NULL, NULL, NULL, NULL);
    float *got = malloc(sizeof(float) * B * L * (size_t)V);
    assert_non_null(got);
    assert_true(max_diff(ref, orig, (size_t)B * L * V) > 10 * TOL); /* the pruning matters */

    zero_ctx z = { .ff = d->n_ff };
    pi2_calib_opts o = { .threads = 2, .ffn = zero_hook, .ffn_ctx = &z };
    pi2_calib_state *s = make_state(m, B, L, &o);
    fwd(s, tok, L, got);
    expect_close("zeroed activations vs pruned reference", gen_name[which], got, ref, (size_t)B * L * V);

    int wcalls = 0;
    pi2_calib_opts ow = { .threads = 2, .weight = zero_down_weight, .weight_ctx = &wcalls };
    pi2_calib_set_opts(s, &ow);
    pi2_calib_reset(s);
    fwd(s, tok, L, got);
    expect_close("zeroed down columns vs pruned reference", gen_name[which], got, ref, (size_t)B * L * V);
    /* per layer Q K V O (+ router) and gate/up/down per used expert; embed; head blocks */
    assert_true(wcalls >= 1 + d->n_layers * (4 + 3) + 1);

    /* zeroing every activation: the FFNs contribute nothing, NLL changes */
    double nll_dense[B], nll_zero[B];
    pi2_err e = { 0 };
    pi2_calib_set_opts(s, NULL);
    assert_int_equal(pi2_calib_nll(s, tok, L, nll_dense, &e), 0);
    z.all = true;
    pi2_calib_set_opts(s, &o);
    assert_int_equal(pi2_calib_nll(s, tok, L, nll_zero, &e), 0);
    assert_true(fabs(nll_dense[0] - nll_zero[0]) > 1e-3);

    pi2_calib_state_free(s);
    free(tok);
    free(ref);
    free(orig);
    free(got);
    pi2_ref_close(mp);
    pi2_ref_close(m);
}

static void test_zeroing_dense(void **state)
{
    (void)state;
    check_zeroing(M_RELU);
}

static void test_zeroing_moe(void **state)
{
    (void)state;
    check_zeroing(M_MOE);
}

/* ---- NLL ---- */

static void check_nll(const char *dir, const char *name)
{
    enum { B = 3, L = 20 };
    pi2_ref_model *m = open_ref(dir);
    int V = pi2_ref_desc(m)->vocab;
    int32_t *tok = rand_tokens(B, L, V, 5);
    float *ref = ref_logits(m, tok, B, L, NULL, NULL, NULL, NULL);
    pi2_calib_state *s = make_state(m, B, L + 4, NULL);
    double nll[B];
    pi2_err e = { 0 };
    if (pi2_calib_nll(s, tok, L, nll, &e) != 0)
        fail_msg("%s", e.msg);
    double worst = 0;
    for (int q = 0; q < B; q++) {
        double want = 0;
        for (int p = 0; p + 1 < L; p++) {
            const float *lg = ref + ((size_t)q * L + p) * V;
            double mx = lg[0], sum = 0;
            for (int i = 1; i < V; i++)
                mx = fmax(mx, lg[i]);
            for (int i = 0; i < V; i++)
                sum += exp((double)lg[i] - mx);
            want += mx + log(sum) - lg[tok[q * L + p + 1]];
        }
        worst = fmax(worst, fabs(nll[q] - want));
        if (!(fabs(nll[q] - want) < TOL * L))
            fail_msg("%s: sequence %d NLL %.6f, reference %.6f", name, q, nll[q], want);
    }
    print_message("%s: NLL max error %.3g (sums over %d predictions)\n", name, worst, L - 1);
    /* the state holds the sequences; last logits are the last position's */
    assert_int_equal(pi2_calib_len(s), L);
    double err = 0;
    for (int q = 0; q < B; q++)
        err = fmax(err, max_diff(pi2_calib_logits(s) + (size_t)q * V, ref + ((size_t)q * L + L - 1) * V, V));
    note_err(err);
    assert_true(err < TOL);
    /* len 1: no predictions */
    assert_int_equal(pi2_calib_nll(s, tok, 1, nll, &e), 0);
    assert_true(nll[0] == 0.0 && nll[1] == 0.0 && nll[2] == 0.0);
    pi2_calib_state_free(s);
    free(tok);
    free(ref);
    pi2_ref_close(m);
}

static void test_nll(void **state)
{
    (void)state;
    check_nll(g_dir[M_SILU], gen_name[M_SILU]);
    check_nll(g_dir[M_MOE], gen_name[M_MOE]);
    char dir[1024];
    PI2T_SHARED_MODEL(dir, "tinystories-656k");
    check_nll(dir, "tinystories-656k");
}

/* ---- self-generated text ---- */

static void test_generate(void **state)
{
    (void)state;
    char dir[1024];
    PI2T_SHARED_MODEL(dir, "tinystories-656k");
    enum { B = 4, L = 40 };
    pi2_ref_model *m = open_ref(dir);
    const pi2_model_desc *d = pi2_ref_desc(m);
    int V = d->vocab;
    pi2_calib_state *s = make_state(m, B, L, NULL);
    int32_t prompt[B], out[B * L], again[B * L];
    for (int q = 0; q < B; q++)
        prompt[q] = d->bos_id;
    pi2_sample_opts so = { .temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = 3 };
    pi2_err e = { 0 };
    if (pi2_calib_generate(s, prompt, 1, L, &so, out, &e) != 0)
        fail_msg("%s", e.msg);
    assert_int_equal(pi2_calib_len(s), L - 1);
    assert_int_equal(pi2_calib_generate(s, prompt, 1, L, &so, again, &e), 0);
    assert_memory_equal(out, again, sizeof out); /* deterministic for a seed */
    int differ = 0;
    for (int q = 0; q < B; q++) {
        assert_int_equal(out[q * L], d->bos_id);
        for (int i = 1; i < L; i++) {
            assert_true(out[q * L + i] >= 0 && out[q * L + i] < V);
            for (int k = 0; k < d->n_eos; k++)
                assert_int_not_equal(out[q * L + i], d->eos_ids[k]);
        }
        differ += q > 0 && memcmp(out, out + q * L, sizeof(int32_t) * L) != 0;
    }
    assert_true(differ > 0); /* each sequence has its own sampler */

    /* The model finds its own text likelier than shuffled tokens. */
    double nll_own[B], nll_rand[B];
    assert_int_equal(pi2_calib_nll(s, out, L, nll_own, &e), 0);
    int32_t *rnd = rand_tokens(B, L, V, 8);
    assert_int_equal(pi2_calib_nll(s, rnd, L, nll_rand, &e), 0);
    double a = 0, b = 0;
    for (int q = 0; q < B; q++) {
        a += nll_own[q];
        b += nll_rand[q];
    }
    print_message("tinystories-656k: perplexity of its own text %.2f, of random tokens %.2f\n",
                  exp(a / (B * (L - 1))), exp(b / (B * (L - 1))));
    assert_true(a < b);

    /* Greedy generation follows the reference's argmax while its margin is clear. */
    pi2_sample_opts greedy = { .temperature = 0.0f, .top_p = 1.0f };
    int32_t prompts[B * 3];
    for (int q = 0; q < B; q++) {
        prompts[q * 3] = d->bos_id;
        prompts[q * 3 + 1] = 100 + 37 * q;
        prompts[q * 3 + 2] = 200 + 11 * q;
    }
    assert_int_equal(pi2_calib_generate(s, prompts, 3, L, &greedy, out, &e), 0);
    pi2_ref_state *rs = NULL;
    assert_int_equal(pi2_ref_state_create(&rs, m, L, &e), 0);
    float *lg = malloc(sizeof(float) * (size_t)V);
    assert_non_null(lg);
    int checked = 0;
    for (int q = 0; q < B; q++) {
        for (int p = 0; p + 1 < L; p++) {
            assert_int_equal(pi2_ref_forward(m, rs, out[q * L + p], p, lg, &e), 0);
            if (p < 2)
                continue;
            for (int k = 0; k < d->n_eos; k++)
                lg[d->eos_ids[k]] = -INFINITY;
            int best = pi2_argmax(lg, V);
            float second = -INFINITY;
            for (int i = 0; i < V; i++)
                if (i != best && lg[i] > second)
                    second = lg[i];
            if (lg[best] - second < 1e-2)
                break; /* a near tie may go either way; the rest would diverge */
            assert_int_equal(out[q * L + p + 1], best);
            checked++;
        }
    }
    assert_true(checked > B * 10);
    free(lg);
    free(rnd);
    pi2_ref_state_free(rs);
    pi2_calib_state_free(s);
    pi2_ref_close(m);
}

/* A padded vocabulary: the generated text never holds an id past the
 * tokenizer's, though unmasked those rows would win every step; greedy
 * generation follows the reference's masked argmax. */
static void test_generate_padded(void **state)
{
    (void)state;
    enum { B = 3, L = 24 };
    pi2_ref_model *m = open_ref(g_dir[M_PADDED]);
    const pi2_model_desc *d = pi2_ref_desc(m);
    int V = d->vocab, nt = pi2_ref_n_tokens(m);
    assert_int_equal(nt, 300);
    assert_int_equal(V, 340);
    pi2_calib_state *s = make_state(m, B, L, NULL);
    int32_t prompt[B], out[B * L];
    for (int q = 0; q < B; q++)
        prompt[q] = d->bos_id;
    pi2_err e = { 0 };
    for (int greedy = 0; greedy < 2; greedy++) {
        pi2_sample_opts so = { .temperature = greedy ? 0.0f : 1.0f, .top_p = 1.0f, .seed = 9 };
        assert_int_equal(pi2_calib_generate(s, prompt, 1, L, &so, out, &e), 0);
        for (int i = 0; i < B * L; i++)
            assert_true(out[i] >= 0 && out[i] < nt);
    }
    /* out holds the greedy text: the reference's masked argmax at each step,
     * where the unmasked one is padding */
    pi2_ref_state *rs = NULL;
    assert_int_equal(pi2_ref_state_create(&rs, m, L, &e), 0);
    float *lg = malloc(sizeof(float) * (size_t)V);
    assert_non_null(lg);
    int checked = 0;
    for (int p = 0; p + 1 < L; p++) {
        assert_int_equal(pi2_ref_forward(m, rs, out[p], p, lg, &e), 0);
        assert_true(pi2_argmax(lg, V) >= nt);
        for (int k = 0; k < d->n_eos; k++)
            lg[d->eos_ids[k]] = -INFINITY;
        pi2_logits_mask_padding(lg, V, nt);
        int best = pi2_argmax(lg, V);
        float second = -INFINITY;
        for (int i = 0; i < V; i++)
            if (i != best && lg[i] > second)
                second = lg[i];
        if (lg[best] - second < 1e-2)
            break;
        assert_int_equal(out[p + 1], best);
        checked++;
    }
    assert_true(checked > 5);
    free(lg);
    pi2_ref_state_free(rs);
    pi2_calib_state_free(s);
    pi2_ref_close(m);
}

/* ---- errors ---- */

static void test_errors(void **state)
{
    (void)state;
    pi2_ref_model *m = open_ref(g_dir[M_DRELU]);
    const pi2_model_desc *d = pi2_ref_desc(m);
    pi2_calib_state *s = NULL;
    pi2_err e = { 0 };
    assert_int_equal(pi2_calib_state_create(&s, m, 0, 8, NULL, &e), PI2_EINVAL);
    assert_null(s);
    assert_true(strlen(e.msg) > 0 && strchr(e.msg, '\n') == NULL);
    pi2_err_clear(&e);
    assert_int_equal(pi2_calib_state_create(&s, m, -3, 8, NULL, &e), PI2_EINVAL);
    assert_int_equal(pi2_calib_state_create(&s, m, 2, 0, NULL, NULL), PI2_ERANGE);
    assert_int_equal(pi2_calib_state_create(&s, m, 2, d->max_pos + 1, NULL, NULL), PI2_ERANGE);
    pi2_ref_model *md = open_ref(g_dir[M_DYNAMIC]); /* dynamic NTK: factor 2 x 16 positions */
    assert_int_equal(pi2_calib_state_create(&s, md, 2, 33, NULL, NULL), PI2_ERANGE);
    assert_int_equal(pi2_calib_state_create(&s, md, 2, 32, NULL, NULL), 0);
    pi2_calib_state_free(s);
    s = NULL;
    pi2_ref_close(md);
    assert_int_equal(pi2_calib_state_create(&s, NULL, 2, 8, NULL, NULL), PI2_EINVAL);
    assert_int_equal(pi2_calib_state_create(NULL, m, 2, 8, NULL, NULL), PI2_EINVAL);
    assert_int_equal(pi2_calib_state_create(&s, m, 1 << 30, 100, NULL, NULL), PI2_ERANGE); /* rows overflow */

    s = make_state(m, 2, 8, NULL);
    int32_t tok[2 * 8];
    for (int i = 0; i < 16; i++)
        tok[i] = i + 3;
    /* past max_len: nothing happens */
    pi2_err_clear(&e);
    assert_int_equal(pi2_calib_forward(s, tok, 9, NULL, &e), PI2_ERANGE);
    assert_true(strstr(e.msg, "max_len") != NULL);
    assert_int_equal(pi2_calib_len(s), 0);
    fwd(s, tok, 6, NULL);
    assert_int_equal(pi2_calib_forward(s, tok, 3, NULL, NULL), PI2_ERANGE);
    assert_int_equal(pi2_calib_len(s), 6);
    fwd(s, tok, 2, NULL); /* exactly to max_len */
    assert_int_equal(pi2_calib_forward(s, tok, 1, NULL, NULL), PI2_ERANGE);
    assert_int_equal(pi2_calib_len(s), 8);
    pi2_calib_reset(s);
    /* bad token ids: the state is unchanged */
    tok[3] = -1;
    pi2_err_clear(&e);
    assert_int_equal(pi2_calib_forward(s, tok, 2, NULL, &e), PI2_ERANGE);
    assert_true(strstr(e.msg, "token id -1") != NULL);
    tok[3] = d->vocab;
    assert_int_equal(pi2_calib_forward(s, tok, 2, NULL, NULL), PI2_ERANGE);
    assert_int_equal(pi2_calib_len(s), 0);
    assert_null(pi2_calib_logits(s));
    tok[3] = 4;
    /* bad n_new and NULLs */
    assert_int_equal(pi2_calib_forward(s, tok, 0, NULL, NULL), PI2_EINVAL);
    assert_int_equal(pi2_calib_forward(s, NULL, 1, NULL, NULL), PI2_EINVAL);
    assert_int_equal(pi2_calib_forward(NULL, tok, 1, NULL, NULL), PI2_EINVAL);
    double nll[2];
    assert_int_equal(pi2_calib_nll(s, tok, 9, nll, NULL), PI2_ERANGE);
    assert_int_equal(pi2_calib_nll(s, tok, 0, nll, NULL), PI2_ERANGE);
    assert_int_equal(pi2_calib_nll(s, tok, 4, NULL, NULL), PI2_EINVAL);
    tok[2] = d->vocab + 5;
    assert_int_equal(pi2_calib_nll(s, tok, 4, nll, NULL), PI2_ERANGE);
    tok[2] = 5;
    /* generation */
    pi2_sample_opts so = { .temperature = 1.0f, .top_p = 1.0f, .seed = 1 }, bad = { .temperature = -1.0f };
    int32_t out[2 * 8], prompt[2] = { 1, 1 };
    assert_int_equal(pi2_calib_generate(s, prompt, 1, 9, &so, out, NULL), PI2_ERANGE);
    assert_int_equal(pi2_calib_generate(s, prompt, 0, 4, &so, out, NULL), PI2_ERANGE);
    assert_int_equal(pi2_calib_generate(s, prompt, 5, 4, &so, out, NULL), PI2_ERANGE);
    assert_int_equal(pi2_calib_generate(s, prompt, 1, 4, &bad, out, NULL), PI2_EINVAL);
    assert_int_equal(pi2_calib_generate(s, prompt, 1, 4, NULL, out, NULL), PI2_EINVAL);
    prompt[1] = -7;
    assert_int_equal(pi2_calib_generate(s, prompt, 1, 4, &so, out, NULL), PI2_ERANGE);
    /* after all that, the state still works */
    fwd(s, tok, 8, NULL);
    assert_non_null(pi2_calib_logits(s));
    pi2_calib_state_free(s);
    pi2_calib_state_free(NULL); /* no-op */
    pi2_calib_reset(NULL);
    pi2_calib_set_opts(NULL, NULL);
    assert_int_equal(pi2_calib_len(NULL), 0);
    assert_null(pi2_calib_logits(NULL));
    pi2_ref_close(m);
}

/* The accessor the calibration forward reads weights through. */
static void test_ref_weight(void **state)
{
    (void)state;
    pi2_ref_model *m = open_ref(g_dir[M_MOE]);
    const pi2_model_desc *d = pi2_ref_desc(m);
    const pi2_st *st = pi2_ref_tensors(m);
    char name[160];
    assert_true(pi2_tensor_name(name, sizeof name, d, PI2_T_DOWN, 1, 3));
    assert_ptr_equal(pi2_ref_weight(m, PI2_T_DOWN, 1, 3), pi2_st_find(st, name));
    assert_true(pi2_tensor_name(name, sizeof name, d, PI2_T_ROUTER, 0, 0));
    assert_ptr_equal(pi2_ref_weight(m, PI2_T_ROUTER, 0, 0), pi2_st_find(st, name));
    assert_null(pi2_ref_weight(m, PI2_T_DOWN, 1, 4));
    assert_null(pi2_ref_weight(m, PI2_T_Q, 2, 0));
    assert_null(pi2_ref_weight(m, PI2_T_Q, -1, 0));
    assert_null(pi2_ref_weight(m, PI2_T_PRED_FC1, 0, 0));
    assert_null(pi2_ref_weight(NULL, PI2_T_EMBED, 0, 0));
    pi2_ref_close(m);
    m = open_ref(g_dir[M_SILU]); /* tied */
    assert_ptr_equal(pi2_ref_weight(m, PI2_T_EMBED, 0, 0), pi2_ref_weight(m, PI2_T_LM_HEAD, 0, 0));
    assert_null(pi2_ref_weight(m, PI2_T_ROUTER, 0, 0));
    assert_null(pi2_ref_weight(m, PI2_T_GATE, 0, 1));
    pi2_ref_close(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shared_silu),   cmocka_unit_test(test_shared_drelu), cmocka_unit_test(test_generated),
        cmocka_unit_test(test_hook_dense),    cmocka_unit_test(test_hook_moe),     cmocka_unit_test(test_zeroing_dense),
        cmocka_unit_test(test_zeroing_moe),   cmocka_unit_test(test_nll),          cmocka_unit_test(test_generate),
        cmocka_unit_test(test_generate_padded),
        cmocka_unit_test(test_errors),        cmocka_unit_test(test_ref_weight),
    };
    return cmocka_run_group_tests(tests, make_models, drop_models);
}
