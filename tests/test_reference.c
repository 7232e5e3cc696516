/* Tests for runtime/reference: golden greedy decoding on the shared real
 * models, MoE invariants and storage/head variants on tiny generated models,
 * and every open/forward error. */
#include "tests/testutil.h"
#include "tests/testjson.h"

#include <jansson.h>
#include <math.h>

#include "formats/hfconfig.h"
#include "formats/safetensors.h"
#include "runtime/reference.h"

/* ------------------------------------------------------------------ */
/* Golden tests on the shared models                                  */
/* ------------------------------------------------------------------ */

#define GOLD_TOL 2e-3

typedef struct act_count {
    int n_layers, n_ff;
    long long nz[16], total[16];
} act_count;

static void count_hook(void *ctx, int layer, int expert, const float *x, const float *act)
{
    (void)x;
    (void)expert;
    act_count *c = ctx;
    assert_true(layer >= 0 && layer < c->n_layers);
    for (int i = 0; i < c->n_ff; i++)
        c->nz[layer] += act[i] != 0.0f;
    c->total[layer] += c->n_ff;
}

/* Best and second-best logits; ties go to the lower id. */
static int top2(const float *logits, int n, float *margin)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best])
            best = i;
    float second = -INFINITY;
    for (int i = 0; i < n; i++)
        if (i != best && logits[i] > second)
            second = logits[i];
    *margin = logits[best] - second;
    return best;
}


static void golden(const char *model, bool drelu)
{
    char dir[1024], path[1200];
    PI2T_SHARED_MODEL(dir, model);
    pi2_err e = { 0 };
    pi2_ref_model *m = NULL;
    if (pi2_ref_open(&m, dir, &e) != 0)
        fail_msg("%s", e.msg);
    const pi2_model_desc *d = pi2_ref_desc(m);
    snprintf(path, sizeof path, "%s/EXPECTED.json", dir);
    json_t *exp = load_json(path);
    json_t *cases = json_object_get(exp, "cases");
    assert_true(json_is_array(cases) && json_array_size(cases) > 0);
    float *logits = malloc(sizeof(float) * (size_t)d->vocab);
    assert_non_null(logits);

    for (size_t ci = 0; ci < json_array_size(cases); ci++) {
        json_t *c = json_array_get(cases, ci);
        json_t *prompt = json_object_get(c, "prompt_ids"), *gen = json_object_get(c, "generated_ids");
        json_t *top5 = json_object_get(c, "first_step_top5");
        size_t np = json_array_size(prompt), ng = json_array_size(gen);
        assert_true(ng > 0 && json_array_size(top5) == 5);
        int max_seq = (int)(1 + np + ng);
        pi2_ref_state *s = NULL;
        assert_int_equal(pi2_ref_state_create(&s, m, max_seq, &e), 0);
        act_count cnt = { .n_layers = d->n_layers, .n_ff = d->n_ff };
        assert_true(d->n_layers <= 16);
        pi2_ref_state_set_hook(s, count_hook, &cnt);

        int pos = 0;
        assert_int_equal(pi2_ref_forward(m, s, 1 /* BOS */, pos++, logits, &e), 0);
        for (size_t i = 0; i < np; i++)
            assert_int_equal(pi2_ref_forward(m, s, jint(prompt, i), pos++, logits, &e), 0);

        /* First step: top-5 ids and logits. */
        for (int r = 0; r < 5; r++) {
            json_t *pair = json_array_get(top5, (size_t)r);
            int id = jint(pair, 0);
            double want = json_number_value(json_array_get(pair, 1));
            int rank = 0;
            for (int i = 0; i < d->vocab; i++)
                rank += logits[i] > logits[id] || (logits[i] == logits[id] && i < id);
            if (rank != r || fabs(logits[id] - want) > GOLD_TOL)
                fail_msg("%s case %zu: top-5 #%d id %d has rank %d, logit %.5f (want %.5f)", model, ci, r, id, rank,
                         (double)logits[id], want);
        }

        /* Greedy decoding reproduces every id. */
        float min_margin = INFINITY;
        act_count before_last = cnt;
        for (size_t i = 0; i < ng; i++) {
            float margin;
            int id = top2(logits, d->vocab, &margin);
            if (id != jint(gen, i))
                fail_msg("%s case %zu step %zu: got id %d, want %d (margin %.5f)", model, ci, i, id, jint(gen, i),
                         (double)margin);
            if (margin < min_margin)
                min_margin = margin;
            before_last = cnt;
            assert_int_equal(pi2_ref_forward(m, s, id, pos++, logits, &e), 0);
        }
        double want_margin = json_number_value(json_object_get(c, "min_top1_margin"));
        assert_true(fabs(min_margin - want_margin) < GOLD_TOL);

        /* Stopping rule: an early stop (not at EOS) happened before a step
         * whose top-1 margin is under 1e-3 (drelu model's rule). */
        int last = jint(gen, ng - 1);
        if (ng < 48 && last != 2) {
            float margin;
            top2(logits, d->vocab, &margin);
            if (margin > 1e-3 + 2e-4)
                fail_msg("%s case %zu: stopped early but the next margin is %.5f", model, ci, (double)margin);
        }

        /* Active fraction: EXPECTED counts "all positions" of the case's
         * text, i.e. BOS + prompt + every generated token (measured: equal
         * to 4 decimals; without the last token it is off by up to 2.3e-3).
         * 5e-4 leaves room for ~10 near-zero activations changing sign. */
        json_t *af = json_object_get(c, "active_fraction_per_layer");
        if (drelu) {
            assert_true(json_is_array(af) && json_array_size(af) == (size_t)d->n_layers);
            for (int l = 0; l < d->n_layers; l++) {
                double want = json_number_value(json_array_get(af, (size_t)l));
                double all = (double)cnt.nz[l] / (double)cnt.total[l];
                double fed = (double)before_last.nz[l] / (double)before_last.total[l];
                if (fabs(all - want) > 5e-4)
                    fail_msg("%s case %zu layer %d: active fraction %.5f (without last token %.5f), want %.4f",
                             model, ci, l, all, fed, want);
            }
        }
        pi2_ref_state_free(s);
    }
    free(logits);
    json_decref(exp);
    pi2_ref_close(m);
}

static void test_golden_tinystories(void **state)
{
    (void)state;
    golden("tinystories-656k", false);
}

static void test_golden_tinystories_drelu(void **state)
{
    (void)state;
    golden("tinystories-656k-drelu", true);
}

/* ------------------------------------------------------------------ */
/* Tiny generated models                                              */
/* ------------------------------------------------------------------ */

typedef struct build_opts {
    pi2_dtype dt;             /* storage of every float tensor */
    bool round_to_bf16;       /* store bf16-representable values (exact-conversion checks) */
    bool experts_identical;   /* MoE experts' weights = the dense FFN's of the same layer */
    bool tied_both;           /* tied: store both names (lm_head with different values) */
    bool tied_as_head;        /* tied: store the matrix once as lm_head.weight */
    bool head_is_embed;       /* untied: lm_head holds the embedding's values */
    int shards;               /* 0/1: one file; 2: two shards + index */
    const char *skip;         /* omit this tensor */
    const char *bad_shape;    /* write this tensor with one extra row */
    const char *int_dtype;    /* write this tensor as I32 */
    bool router_zero;         /* all router logits 0: ties everywhere */
    float embed_std;          /* embedding scale (0: 1.0) */
    uint64_t seed;
} build_opts;

typedef struct spec {
    char name[128];
    char seed_name[128]; /* values are a function of this name and the seed */
    int ndim;
    int64_t shape[2];
    pi2_dtype dt;
    float mean, std;
} spec;

static void add_spec(spec *sp, int *n, const pi2_model_desc *d, const build_opts *o, pi2_tname t, int l, int e,
                     int ndim, int64_t d0, int64_t d1)
{
    spec *s = &sp[*n];
    memset(s, 0, sizeof *s);
    assert_true(pi2_tensor_name(s->name, sizeof s->name, d, t, l, e));
    strcpy(s->seed_name, s->name);
    if (o->experts_identical && (t == PI2_T_GATE || t == PI2_T_UP || t == PI2_T_DOWN)) {
        pi2_model_desc dense = *d;
        dense.arch = PI2_ARCH_LLAMA;
        assert_true(pi2_tensor_name(s->seed_name, sizeof s->seed_name, &dense, t, l, 0));
    }
    s->ndim = ndim;
    s->shape[0] = d0;
    s->shape[1] = d1;
    s->dt = o->dt;
    s->std = ndim == 1 ? 0.2f : 1.0f / sqrtf((float)d1);
    s->mean = ndim == 1 ? 1.0f : 0.0f;
    if (t == PI2_T_EMBED || t == PI2_T_LM_HEAD)
        s->std = o->embed_std > 0 ? o->embed_std : 1.0f;
    if (t == PI2_T_ROUTER && o->router_zero)
        s->std = 0.0f;
    if (o->skip && strcmp(s->name, o->skip) == 0)
        return;
    if (o->bad_shape && strcmp(s->name, o->bad_shape) == 0)
        s->shape[0]++;
    if (o->int_dtype && strcmp(s->name, o->int_dtype) == 0)
        s->dt = PI2_DT_I32;
    (*n)++;
}

static size_t spec_bytes(const spec *s)
{
    size_t n = (size_t)s->shape[0] * (size_t)(s->ndim == 2 ? s->shape[1] : 1);
    return n * pi2_dtype_size(s->dt);
}

static void write_data(pi2_st_writer *w, const spec *s, const build_opts *o)
{
    size_t n = (size_t)s->shape[0] * (size_t)(s->ndim == 2 ? s->shape[1] : 1);
    uint8_t *buf = malloc(spec_bytes(s) + 1);
    assert_non_null(buf);
    pi2_rng r;
    pi2_rng_seed(&r, pi2t_fnv(s->seed_name, strlen(s->seed_name)) ^ o->seed);
    for (size_t i = 0; i < n; i++) {
        float v = s->mean + s->std * (float)pi2_rng_normal(&r);
        if (o->round_to_bf16)
            v = pi2_bf16_to_f32(pi2_f32_to_bf16(v));
        uint16_t h;
        int32_t iv;
        switch (s->dt) {
        case PI2_DT_F32: memcpy(buf + 4 * i, &v, 4); break;
        case PI2_DT_F16: h = pi2_f32_to_f16(v); memcpy(buf + 2 * i, &h, 2); break;
        case PI2_DT_BF16: h = pi2_f32_to_bf16(v); memcpy(buf + 2 * i, &h, 2); break;
        case PI2_DT_I32: iv = (int32_t)(v * 100); memcpy(buf + 4 * i, &iv, 4); break;
        default: fail();
        }
    }
    pi2_err e = { 0 };
    assert_int_equal(pi2_st_writer_write(w, buf, spec_bytes(s), &e), 0);
    free(buf);
}

/* Write config.json and safetensors for `d` into dir (created if needed). */
static void build_model(const char *dir, const pi2_model_desc *d, const build_opts *o)
{
    pi2_err e = { 0 };
    mkdir(dir, 0755);
    assert_int_equal(pi2_config_write(dir, d, &e), 0);
    int64_t D = d->hidden, qd = (int64_t)d->n_heads * d->head_dim, kvd = (int64_t)d->n_kv_heads * d->head_dim;
    int ne = pi2_desc_is_moe(d) ? d->n_experts : 1;
    int cap = 8 + d->n_layers * (8 + 3 * ne);
    spec *sp = calloc((size_t)cap, sizeof *sp);
    assert_non_null(sp);
    int n = 0;
    bool tied_as_head = d->tie_embeddings && o->tied_as_head && !o->tied_both;
    if (!tied_as_head)
        add_spec(sp, &n, d, o, PI2_T_EMBED, 0, 0, 2, d->vocab, D);
    for (int l = 0; l < d->n_layers; l++) {
        add_spec(sp, &n, d, o, PI2_T_ATTN_NORM, l, 0, 1, D, 0);
        add_spec(sp, &n, d, o, PI2_T_Q, l, 0, 2, qd, D);
        add_spec(sp, &n, d, o, PI2_T_K, l, 0, 2, kvd, D);
        add_spec(sp, &n, d, o, PI2_T_V, l, 0, 2, kvd, D);
        add_spec(sp, &n, d, o, PI2_T_O, l, 0, 2, D, qd);
        add_spec(sp, &n, d, o, PI2_T_FFN_NORM, l, 0, 1, D, 0);
        if (pi2_desc_is_moe(d))
            add_spec(sp, &n, d, o, PI2_T_ROUTER, l, 0, 2, d->n_experts, D);
        for (int x = 0; x < ne; x++) {
            add_spec(sp, &n, d, o, PI2_T_GATE, l, x, 2, d->n_ff, D);
            add_spec(sp, &n, d, o, PI2_T_UP, l, x, 2, d->n_ff, D);
            add_spec(sp, &n, d, o, PI2_T_DOWN, l, x, 2, D, d->n_ff);
        }
    }
    add_spec(sp, &n, d, o, PI2_T_OUT_NORM, 0, 0, 1, D, 0);
    if (!d->tie_embeddings || tied_as_head || o->tied_both) {
        add_spec(sp, &n, d, o, PI2_T_LM_HEAD, 0, 0, 2, d->vocab, D);
        spec *h = &sp[n - 1];
        if (strcmp(h->name, "lm_head.weight") == 0 && (tied_as_head || o->head_is_embed))
            strcpy(h->seed_name, "model.embed_tokens.weight");
    }

    int shards = o->shards > 1 ? 2 : 1, split = shards == 2 ? n / 2 : n;
    const char **names = calloc((size_t)n, sizeof *names), **files = calloc((size_t)n, sizeof *files);
    assert_non_null(names);
    assert_non_null(files);
    uint64_t total = 0;
    for (int sh = 0; sh < shards; sh++) {
        char fname[64], path[512];
        if (shards == 1)
            snprintf(fname, sizeof fname, "model.safetensors");
        else
            snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", sh + 1, shards);
        snprintf(path, sizeof path, "%s/%s", dir, fname);
        int lo = sh == 0 ? 0 : split, hi = sh == 0 ? split : n;
        pi2_st_writer *w = NULL;
        assert_int_equal(pi2_st_writer_create(&w, path, &e), 0);
        for (int i = lo; i < hi; i++) {
            assert_int_equal(pi2_st_writer_add(w, sp[i].name, sp[i].dt, sp[i].ndim, sp[i].shape, &e), 0);
            names[i] = sp[i].name;
            files[i] = sh == 0 ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
            total += spec_bytes(&sp[i]);
        }
        for (int i = lo; i < hi; i++)
            write_data(w, &sp[i], o);
        assert_int_equal(pi2_st_writer_finish(w, &e), 0);
    }
    if (shards == 2) {
        char path[512];
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        assert_int_equal(pi2_st_write_index(path, (size_t)n, names, files, total, &e), 0);
    }
    free(names);
    free(files);
    free(sp);
}

static pi2_model_desc tiny_desc(pi2_arch arch, pi2_act act)
{
    pi2_model_desc d = { .arch = arch, .act = act, .hidden = 32, .n_ff = 48, .n_layers = 2, .n_heads = 4,
                         .n_kv_heads = 2, .head_dim = 8, .vocab = 64, .max_pos = 32, .rope_theta = 10000.0,
                         .rms_eps = 1e-5f, .bos_id = 1, .n_eos = 1, .eos_ids = { 2 } };
    if (arch == PI2_ARCH_MIXTRAL || arch == PI2_ARCH_TURBOSPARSE_MIXTRAL) {
        d.n_experts = 4;
        d.n_experts_used = 2;
    }
    return d;
}

static const int SEQ[] = { 1, 17, 5, 63, 0, 42, 17, 9 };
#define SEQ_LEN ((int)(sizeof SEQ / sizeof SEQ[0]))

/* Run SEQ through the model in `dir`; logits of every step into out
 * (SEQ_LEN * vocab floats, caller frees). */
static float *run_seq(const char *dir, pi2_ref_ffn_hook hook, void *ctx)
{
    pi2_err e = { 0 };
    pi2_ref_model *m = NULL;
    if (pi2_ref_open(&m, dir, &e) != 0)
        fail_msg("%s", e.msg);
    int V = pi2_ref_desc(m)->vocab;
    float *out = malloc(sizeof(float) * (size_t)V * SEQ_LEN);
    assert_non_null(out);
    pi2_ref_state *s = NULL;
    assert_int_equal(pi2_ref_state_create(&s, m, SEQ_LEN, &e), 0);
    pi2_ref_state_set_hook(s, hook, ctx);
    for (int p = 0; p < SEQ_LEN; p++)
        assert_int_equal(pi2_ref_forward(m, s, SEQ[p], p, out + (size_t)p * V, &e), 0);
    pi2_ref_state_free(s);
    pi2_ref_close(m);
    return out;
}

static double max_diff(const float *a, const float *b, size_t n)
{
    double mx = 0;
    for (size_t i = 0; i < n; i++) {
        double df = fabs((double)a[i] - b[i]);
        if (!(df <= mx))
            mx = df; /* NaN propagates as a failure */
    }
    return mx;
}

static double max_abs(const float *a, size_t n)
{
    double mx = 0;
    for (size_t i = 0; i < n; i++)
        mx = fmax(mx, fabs((double)a[i]));
    return mx;
}

/* A Mixtral (and TurboSparse-Mixtral) model whose experts all equal a dense
 * model's FFN gives the dense model's logits: top-2 of identical experts
 * with weights summing to 1. */
static void test_moe_identical_experts(void **state)
{
    (void)state;
    char tmp[64], a[128], b[128];
    pi2t_tmpdir(tmp, sizeof tmp);
    static const struct { pi2_arch moe, dense; pi2_act act; } pairs[] = {
        { PI2_ARCH_MIXTRAL, PI2_ARCH_LLAMA, PI2_ACT_SILU },
        { PI2_ARCH_TURBOSPARSE_MIXTRAL, PI2_ARCH_BAMBOO, PI2_ACT_DRELU },
    };
    for (size_t i = 0; i < 2; i++) {
        build_opts o = { .dt = PI2_DT_F32, .experts_identical = true, .seed = 7 };
        pi2_model_desc dd = tiny_desc(pairs[i].dense, pairs[i].act), dm = tiny_desc(pairs[i].moe, pairs[i].act);
        snprintf(a, sizeof a, "%s/dense%zu", tmp, i);
        snprintf(b, sizeof b, "%s/moe%zu", tmp, i);
        build_model(a, &dd, &o);
        build_model(b, &dm, &o);
        float *la = run_seq(a, NULL, NULL), *lb = run_seq(b, NULL, NULL);
        size_t n = (size_t)dd.vocab * SEQ_LEN;
        assert_true(max_abs(la, n) > 0.5);
        if (!(max_diff(la, lb, n) < 1e-4))
            fail_msg("%s vs %s: max diff %g", pi2_arch_name(dm.arch), pi2_arch_name(dd.arch), max_diff(la, lb, n));
        free(la);
        free(lb);
    }
    pi2t_rmtree(tmp);
}

/* Routing: the hook sees exactly the top-k experts by router logit (the
 * test recomputes the logits from the file), largest first. */
typedef struct route_ctx {
    const pi2_st *st;
    const pi2_model_desc *d;
    int calls, seen_mask, k_seen;
    int last_layer, rank;
    float last_logit;
} route_ctx;

static void route_hook(void *vctx, int layer, int expert, const float *x, const float *act)
{
    (void)act;
    route_ctx *c = vctx;
    const pi2_model_desc *d = c->d;
    char name[128];
    assert_true(pi2_tensor_name(name, sizeof name, d, PI2_T_ROUTER, layer, 0));
    const pi2_st_tensor *t = pi2_st_find(c->st, name);
    assert_non_null(t);
    double logit[16];
    for (int e = 0; e < d->n_experts; e++) {
        logit[e] = 0;
        for (int j = 0; j < d->hidden; j++)
            logit[e] += (double)pi2_st_get_f32(t, (size_t)e * d->hidden + j) * x[j];
    }
    /* rank of `expert` among the router logits */
    int rank = 0;
    for (int e = 0; e < d->n_experts; e++)
        rank += logit[e] > logit[expert] || (logit[e] == logit[expert] && e < expert);
    if (layer != c->last_layer || c->rank + 1 >= d->n_experts_used)
        c->rank = -1;
    c->rank++;
    c->last_layer = layer;
    assert_int_equal(rank, c->rank); /* k-th call of a layer is the k-th best expert */
    c->seen_mask |= 1 << expert;
    c->calls++;
}

static void test_moe_routing(void **state)
{
    (void)state;
    char tmp[64], dir[128];
    pi2t_tmpdir(tmp, sizeof tmp);
    for (int k = 1; k <= 2; k++) {
        pi2_model_desc d = tiny_desc(PI2_ARCH_MIXTRAL, PI2_ACT_SILU);
        d.n_experts_used = k;
        build_opts o = { .dt = PI2_DT_F32, .seed = 11 };
        snprintf(dir, sizeof dir, "%s/top%d", tmp, k);
        build_model(dir, &d, &o);
        pi2_err e = { 0 };
        pi2_ref_model *m = NULL;
        assert_int_equal(pi2_ref_open(&m, dir, &e), 0);
        route_ctx c = { .st = pi2_ref_tensors(m), .d = pi2_ref_desc(m), .last_layer = -1 };
        float *logits = run_seq(dir, route_hook, &c);
        assert_int_equal(c.calls, SEQ_LEN * d.n_layers * k);
        assert_true(__builtin_popcount((unsigned)c.seen_mask) >= 2); /* routing really varies */
        free(logits);
        pi2_ref_close(m);
    }
    pi2t_rmtree(tmp);
}

/* Top-1: one expert per layer and token (the router's best, checked by the
 * hook) with weight exactly 1, so identical experts give the dense logits. */
static void test_moe_top1_output(void **state)
{
    (void)state;
    char tmp[64], a[128], b[128];
    pi2t_tmpdir(tmp, sizeof tmp);
    pi2_model_desc dd = tiny_desc(PI2_ARCH_LLAMA, PI2_ACT_SILU), dm = tiny_desc(PI2_ARCH_MIXTRAL, PI2_ACT_SILU);
    dm.n_experts_used = 1;
    build_opts o = { .dt = PI2_DT_F32, .experts_identical = true, .seed = 3 };
    snprintf(a, sizeof a, "%s/dense", tmp);
    snprintf(b, sizeof b, "%s/moe", tmp);
    build_model(a, &dd, &o);
    build_model(b, &dm, &o);
    pi2_err e = { 0 };
    pi2_ref_model *m = NULL;
    assert_int_equal(pi2_ref_open(&m, b, &e), 0);
    route_ctx c = { .st = pi2_ref_tensors(m), .d = pi2_ref_desc(m), .last_layer = -1 };
    float *la = run_seq(a, NULL, NULL), *lb = run_seq(b, route_hook, &c);
    assert_int_equal(c.calls, SEQ_LEN * dm.n_layers);
    /* weight exactly 1: top-1 of identical experts is bit-identical up to
     * the float rounding of 1.0 * y */
    assert_true(max_diff(la, lb, (size_t)dd.vocab * SEQ_LEN) < 1e-5);
    free(la);
    free(lb);
    pi2_ref_close(m);
    pi2t_rmtree(tmp);
}

/* An independent second forward for position 0 only, where attention
 * reduces to o_proj(v) (softmax over one position is 1, RoPE at 0 is the
 * identity): checks MoE mixing weights (softmax over the selected router
 * logits), the GQA head mapping, norms and the head. */
static const pi2_st_tensor *tn(const pi2_st *st, const pi2_model_desc *d, pi2_tname t, int l, int e)
{
    char name[128];
    assert_true(pi2_tensor_name(name, sizeof name, d, t, l, e));
    const pi2_st_tensor *r = pi2_st_find(st, name);
    assert_non_null(r);
    return r;
}

static void mv(double *out, const pi2_st_tensor *w, const double *x, int rows, int cols)
{
    for (int i = 0; i < rows; i++) {
        out[i] = 0;
        for (int j = 0; j < cols; j++)
            out[i] += (double)pi2_st_get_f32(w, (size_t)i * cols + j) * x[j];
    }
}

static void norm(double *out, const double *x, const pi2_st_tensor *w, int n, double eps)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    for (int i = 0; i < n; i++)
        out[i] = x[i] / sqrt(ss / n + eps) * pi2_st_get_f32(w, (size_t)i);
}

static void pos0_logits(const pi2_st *st, const pi2_model_desc *d, int token, double *logits)
{
    enum { MAXD = 256 };
    int D = d->hidden, hd = d->head_dim, kvd = d->n_kv_heads * hd, qd = d->n_heads * hd, ff = d->n_ff;
    assert_true(D <= MAXD && qd <= MAXD && ff <= MAXD && d->n_experts <= 16);
    double x[MAXD], xb[MAXD], v[MAXD], att[MAXD], o[MAXD], g[MAXD], u[MAXD], y[MAXD], mix[MAXD], r[16];
    const pi2_st_tensor *emb = d->tie_embeddings ? pi2_st_find(st, "model.embed_tokens.weight")
                                                 : tn(st, d, PI2_T_EMBED, 0, 0);
    for (int i = 0; i < D; i++)
        x[i] = pi2_st_get_f32(emb, (size_t)token * D + i);
    for (int l = 0; l < d->n_layers; l++) {
        norm(xb, x, tn(st, d, PI2_T_ATTN_NORM, l, 0), D, d->rms_eps);
        mv(v, tn(st, d, PI2_T_V, l, 0), xb, kvd, D);
        for (int h = 0; h < d->n_heads; h++)
            for (int i = 0; i < hd; i++)
                att[h * hd + i] = v[(h / (d->n_heads / d->n_kv_heads)) * hd + i];
        mv(o, tn(st, d, PI2_T_O, l, 0), att, D, qd);
        for (int i = 0; i < D; i++)
            x[i] += o[i];
        norm(xb, x, tn(st, d, PI2_T_FFN_NORM, l, 0), D, d->rms_eps);
        int ne = pi2_desc_is_moe(d) ? d->n_experts : 1, k = pi2_desc_is_moe(d) ? d->n_experts_used : 1;
        double w[16] = { 0 };
        if (pi2_desc_is_moe(d)) {
            mv(r, tn(st, d, PI2_T_ROUTER, l, 0), xb, ne, D);
            /* softmax over all, keep the top k, renormalise (HF Mixtral) */
            double mx = r[0], sum = 0, keep = 0;
            for (int e = 1; e < ne; e++)
                mx = fmax(mx, r[e]);
            for (int e = 0; e < ne; e++)
                sum += exp(r[e] - mx);
            bool sel[16] = { false };
            for (int t = 0; t < k; t++) {
                int best = -1;
                for (int e = 0; e < ne; e++)
                    if (!sel[e] && (best < 0 || r[e] > r[best]))
                        best = e;
                sel[best] = true;
                w[best] = exp(r[best] - mx) / sum;
                keep += w[best];
            }
            for (int e = 0; e < ne; e++)
                w[e] /= keep;
        } else {
            w[0] = 1;
        }
        for (int i = 0; i < D; i++)
            mix[i] = 0;
        for (int e = 0; e < ne; e++) {
            if (w[e] == 0)
                continue;
            mv(g, tn(st, d, PI2_T_GATE, l, e), xb, ff, D);
            mv(u, tn(st, d, PI2_T_UP, l, e), xb, ff, D);
            for (int i = 0; i < ff; i++)
                g[i] = d->act == PI2_ACT_SILU      ? g[i] / (1 + exp(-g[i])) * u[i]
                       : d->act == PI2_ACT_RELU    ? (g[i] > 0 ? g[i] * u[i] : 0)
                       : d->act == PI2_ACT_FATRELU ? (g[i] > d->act_param ? g[i] * u[i] : 0)
                                                   : (g[i] > 0 && u[i] > 0 ? g[i] * u[i] : 0);
            mv(y, tn(st, d, PI2_T_DOWN, l, e), g, D, ff);
            for (int i = 0; i < D; i++)
                mix[i] += w[e] * y[i];
        }
        for (int i = 0; i < D; i++)
            x[i] += mix[i];
    }
    norm(xb, x, tn(st, d, PI2_T_OUT_NORM, 0, 0), D, d->rms_eps);
    const pi2_st_tensor *head = d->tie_embeddings ? emb : tn(st, d, PI2_T_LM_HEAD, 0, 0);
    mv(logits, head, xb, d->vocab, D);
}

static void test_position0_oracle(void **state)
{
    (void)state;
    char tmp[64], dir[128];
    pi2t_tmpdir(tmp, sizeof tmp);
    static const struct { pi2_arch arch; pi2_act act; int k, hd, kv; bool tie, rzero; float estd; } cases[] = {
        { PI2_ARCH_MIXTRAL, PI2_ACT_SILU, 2, 8, 2, false, false, 0 },
        { PI2_ARCH_TURBOSPARSE_MIXTRAL, PI2_ACT_DRELU, 3, 12, 1, true, false, 0 },
        { PI2_ARCH_MIXTRAL, PI2_ACT_SILU, 2, 8, 2, false, true, 0 }, /* ties: experts 0, 1 at 1/2 each */
        { PI2_ARCH_LLAMA, PI2_ACT_RELU, 0, 8, 4, false, false, 0 },
        { PI2_ARCH_LLAMA, PI2_ACT_SILU, 0, 8, 2, true, false, 1e-3f }, /* mean(x^2) ~ eps */
        { PI2_ARCH_SPARSELLAMA, PI2_ACT_FATRELU, 0, 8, 2, false, false, 0 },
        { PI2_ARCH_MIXTRAL, PI2_ACT_FATRELU, 2, 8, 2, false, false, 0 },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        pi2_model_desc d = tiny_desc(cases[c].arch, cases[c].act);
        if (cases[c].act == PI2_ACT_FATRELU)
            d.act_param = 0.3f;
        if (cases[c].k)
            d.n_experts_used = cases[c].k;
        d.head_dim = cases[c].hd;
        d.n_kv_heads = cases[c].kv;
        d.tie_embeddings = cases[c].tie;
        build_opts o = { .dt = PI2_DT_BF16, .seed = 100 + c, .router_zero = cases[c].rzero,
                         .embed_std = cases[c].estd };
        snprintf(dir, sizeof dir, "%s/m%zu", tmp, c);
        build_model(dir, &d, &o);
        pi2_err e = { 0 };
        pi2_ref_model *m = NULL;
        pi2_ref_state *s = NULL;
        assert_int_equal(pi2_ref_open(&m, dir, &e), 0);
        assert_int_equal(pi2_ref_state_create(&s, m, 1, &e), 0);
        float lg[64];
        double want[64];
        for (int t = 0; t < d.vocab; t += 7) {
            assert_int_equal(pi2_ref_forward(m, s, t, 0, lg, &e), 0);
            pos0_logits(pi2_ref_tensors(m), &d, t, want);
            for (int i = 0; i < d.vocab; i++)
                if (!(fabs(lg[i] - want[i]) < 1e-4 * (1 + fabs(want[i]))))
                    fail_msg("%s token %d: logit %d is %.6f, oracle %.6f", pi2_arch_name(d.arch), t, i,
                             (double)lg[i], want[i]);
        }
        pi2_ref_state_free(s);
        pi2_ref_close(m);
    }
    pi2t_rmtree(tmp);
}

/* The hook's activation vector is act(gate x, up x) as the header says,
 * recomputed here from the file; covers all three activations and a
 * head_dim that is not hidden/heads. */
typedef struct act_ctx {
    const pi2_st *st;
    const pi2_model_desc *d;
    int calls, cut;
    double max_err;
} act_ctx;

static void act_hook(void *vctx, int layer, int expert, const float *x, const float *act)
{
    act_ctx *c = vctx;
    const pi2_model_desc *d = c->d;
    char gn[128], un[128];
    assert_int_equal(expert, 0);
    assert_true(pi2_tensor_name(gn, sizeof gn, d, PI2_T_GATE, layer, 0));
    assert_true(pi2_tensor_name(un, sizeof un, d, PI2_T_UP, layer, 0));
    const pi2_st_tensor *g = pi2_st_find(c->st, gn), *u = pi2_st_find(c->st, un);
    for (int i = 0; i < d->n_ff; i++) {
        double gv = 0, uv = 0;
        for (int j = 0; j < d->hidden; j++) {
            gv += (double)pi2_st_get_f32(g, (size_t)i * d->hidden + j) * x[j];
            uv += (double)pi2_st_get_f32(u, (size_t)i * d->hidden + j) * x[j];
        }
        double want = d->act == PI2_ACT_SILU      ? gv / (1 + exp(-gv)) * uv
                      : d->act == PI2_ACT_RELU    ? (gv > 0 ? gv * uv : 0)
                      : d->act == PI2_ACT_FATRELU ? (gv > d->act_param ? gv * uv : 0)
                                                  : (gv > 0 && uv > 0 ? gv * uv : 0);
        /* FATReLU: gates just below the threshold are what separates it from ReGLU */
        c->cut += d->act == PI2_ACT_FATRELU && gv > 0 && gv <= d->act_param;
        if (want == 0 && fabs(gv - d->act_param) > 1e-5) /* away from the edge, where float and double may differ */
            assert_true(act[i] == 0.0f);
        c->max_err = fmax(c->max_err, fabs(want - act[i]));
    }
    c->calls++;
}

static void test_activations(void **state)
{
    (void)state;
    char tmp[64], dir[128];
    pi2t_tmpdir(tmp, sizeof tmp);
    static const struct { pi2_arch arch; pi2_act act; float t; } cases[] = {
        { PI2_ARCH_LLAMA, PI2_ACT_SILU, 0 },
        { PI2_ARCH_MISTRAL, PI2_ACT_RELU, 0 },
        { PI2_ARCH_BAMBOO, PI2_ACT_DRELU, 0 },
        { PI2_ARCH_SPARSELLAMA, PI2_ACT_FATRELU, 0.25f },
        { PI2_ARCH_LLAMA, PI2_ACT_FATRELU, 0.01f },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pi2_model_desc d = tiny_desc(cases[i].arch, cases[i].act);
        d.act_param = cases[i].t;
        d.head_dim = 12; /* heads*hd = 48 != hidden 32 */
        d.n_kv_heads = 1;
        build_opts o = { .dt = PI2_DT_F32, .seed = 5 };
        snprintf(dir, sizeof dir, "%s/m%zu", tmp, i);
        build_model(dir, &d, &o);
        pi2_err e = { 0 };
        pi2_ref_model *m = NULL;
        assert_int_equal(pi2_ref_open(&m, dir, &e), 0);
        act_ctx c = { .st = pi2_ref_tensors(m), .d = pi2_ref_desc(m) };
        float *l = run_seq(dir, act_hook, &c);
        assert_int_equal(c.calls, SEQ_LEN * d.n_layers);
        assert_true(c.max_err < 1e-5);
        if (d.act == PI2_ACT_FATRELU)
            assert_true(c.cut > (d.act_param > 0.1f ? 50 : 0)); /* the threshold cut real gates */
        free(l);
        pi2_ref_close(m);
    }
    pi2t_rmtree(tmp);
}

/* FATReLU with threshold 0 is ReGLU, bit for bit; a threshold changes the
 * logits (ProSparse's 0.01 a little, 0.3 a lot). */
static void test_fatrelu_vs_relu(void **state)
{
    (void)state;
    char tmp[64], dir[128];
    pi2t_tmpdir(tmp, sizeof tmp);
    static const struct { pi2_arch arch; pi2_act act; float t; } v[] = {
        { PI2_ARCH_LLAMA, PI2_ACT_RELU, 0 },
        { PI2_ARCH_SPARSELLAMA, PI2_ACT_FATRELU, 0 },
        { PI2_ARCH_SPARSELLAMA, PI2_ACT_FATRELU, 0.01f },
        { PI2_ARCH_SPARSELLAMA, PI2_ACT_FATRELU, 0.3f },
    };
    float *l[4];
    for (int i = 0; i < 4; i++) {
        pi2_model_desc d = tiny_desc(v[i].arch, v[i].act);
        d.act_param = v[i].t;
        build_opts o = { .dt = PI2_DT_F32, .seed = 31 }; /* the same weights: names do not depend on the arch */
        snprintf(dir, sizeof dir, "%s/v%d", tmp, i);
        build_model(dir, &d, &o);
        l[i] = run_seq(dir, NULL, NULL);
    }
    size_t n = (size_t)64 * SEQ_LEN;
    assert_true(max_diff(l[0], l[1], n) == 0);
    double small = max_diff(l[0], l[2], n), big = max_diff(l[0], l[3], n);
    if (!(small > 0 && big > 10 * small && big > 0.05))
        fail_msg("fatrelu 0.01 moved the logits by %g, 0.3 by %g", small, big);
    for (int i = 0; i < 4; i++)
        free(l[i]);
    pi2t_rmtree(tmp);
}

/* ---- RoPE scaling: an independent double-precision forward ---- */

/* The inverse frequency of pair i at position pos, straight from the
 * formulas of formats/hfconfig.h (HF's modeling_rope_utils) in double. */
static double oracle_inv_freq(const pi2_model_desc *d, int pos, int i)
{
    const pi2_rope_scaling *r = &d->rope;
    double hd = d->head_dim, base = d->rope_theta;
    if (r->type == PI2_ROPE_DYNAMIC && pos + 1 > d->max_pos)
        base *= pow(r->factor * (pos + 1) / d->max_pos - (r->factor - 1), hd / (hd - 2));
    double f = pow(base, -2.0 * i / hd);
    if (r->type == PI2_ROPE_LINEAR)
        return f / r->factor;
    if (r->type == PI2_ROPE_LLAMA3) {
        double wl = 2 * M_PI / f, lo = r->orig_max_pos / r->low_freq_factor,
               hi = r->orig_max_pos / r->high_freq_factor;
        if (wl < hi)
            return f;
        if (wl > lo)
            return f / r->factor;
        double sm = (r->orig_max_pos / wl - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
        return (1 - sm) * f / r->factor + sm * f;
    }
    return f;
}

/* Dense model, tokens[0..n): the last position's logits, everything in
 * double, RoPE (rotate_half) with oracle_inv_freq. */
static void seq_oracle(const pi2_st *st, const pi2_model_desc *d, const int *tok, int n, double *logits)
{
    enum { MAXD = 64, MAXT = 16 };
    int D = d->hidden, hd = d->head_dim, kvd = d->n_kv_heads * hd, qd = d->n_heads * hd, ff = d->n_ff;
    int group = d->n_heads / d->n_kv_heads;
    assert_true(D <= MAXD && qd <= MAXD && ff <= MAXD && n <= MAXT && !pi2_desc_is_moe(d));
    static double K[4][MAXT][MAXD], V[4][MAXT][MAXD];
    assert_true(d->n_layers <= 4);
    double x[MAXD], xb[MAXD], q[MAXD], att[MAXD], o[MAXD], g[MAXD], u[MAXD], y[MAXD], sc[MAXT];
    const pi2_st_tensor *emb = tn(st, d, PI2_T_EMBED, 0, 0);
    for (int p = 0; p < n; p++) {
        for (int i = 0; i < D; i++)
            x[i] = pi2_st_get_f32(emb, (size_t)tok[p] * D + i);
        for (int l = 0; l < d->n_layers; l++) {
            norm(xb, x, tn(st, d, PI2_T_ATTN_NORM, l, 0), D, d->rms_eps);
            mv(q, tn(st, d, PI2_T_Q, l, 0), xb, qd, D);
            mv(K[l][p], tn(st, d, PI2_T_K, l, 0), xb, kvd, D);
            mv(V[l][p], tn(st, d, PI2_T_V, l, 0), xb, kvd, D);
            for (int i = 0; i < hd / 2; i++) {
                double a = p * oracle_inv_freq(d, p, i), c = cos(a), sn = sin(a);
                for (int h = 0; h < d->n_heads; h++) {
                    double *v = q + h * hd, x1 = v[i], x2 = v[i + hd / 2];
                    v[i] = x1 * c - x2 * sn;
                    v[i + hd / 2] = x2 * c + x1 * sn;
                }
                for (int h = 0; h < d->n_kv_heads; h++) {
                    double *v = K[l][p] + h * hd, x1 = v[i], x2 = v[i + hd / 2];
                    v[i] = x1 * c - x2 * sn;
                    v[i + hd / 2] = x2 * c + x1 * sn;
                }
            }
            for (int h = 0; h < d->n_heads; h++) {
                int kh = h / group;
                double mx = -INFINITY, sum = 0;
                for (int t = 0; t <= p; t++) {
                    sc[t] = 0;
                    for (int i = 0; i < hd; i++)
                        sc[t] += q[h * hd + i] * K[l][t][kh * hd + i];
                    sc[t] /= sqrt((double)hd);
                    mx = fmax(mx, sc[t]);
                }
                for (int t = 0; t <= p; t++)
                    sum += sc[t] = exp(sc[t] - mx);
                for (int i = 0; i < hd; i++) {
                    att[h * hd + i] = 0;
                    for (int t = 0; t <= p; t++)
                        att[h * hd + i] += sc[t] / sum * V[l][t][kh * hd + i];
                }
            }
            mv(o, tn(st, d, PI2_T_O, l, 0), att, D, qd);
            for (int i = 0; i < D; i++)
                x[i] += o[i];
            norm(xb, x, tn(st, d, PI2_T_FFN_NORM, l, 0), D, d->rms_eps);
            mv(g, tn(st, d, PI2_T_GATE, l, 0), xb, ff, D);
            mv(u, tn(st, d, PI2_T_UP, l, 0), xb, ff, D);
            for (int i = 0; i < ff; i++)
                g[i] = g[i] / (1 + exp(-g[i])) * u[i];
            mv(y, tn(st, d, PI2_T_DOWN, l, 0), g, D, ff);
            for (int i = 0; i < D; i++)
                x[i] += y[i];
        }
    }
    norm(xb, x, tn(st, d, PI2_T_OUT_NORM, 0, 0), D, d->rms_eps);
    mv(logits, tn(st, d, PI2_T_LM_HEAD, 0, 0), xb, d->vocab, D);
}

/* Each rope_scaling type against the oracle at every position, dynamic
 * past max_position_embeddings (4, factor 2: 8 positions); the scaled
 * models' logits differ from the default's where they should, and the
 * dynamic model equals the default one up to max_position_embeddings. */
static void test_rope_scaling(void **state)
{
    (void)state;
    char tmp[64], dir[128];
    pi2t_tmpdir(tmp, sizeof tmp);
    enum { N = 8 };
    static const int toks[N] = { 1, 17, 5, 63, 0, 42, 17, 9 };
    const pi2_rope_scaling types[] = {
        { .type = PI2_ROPE_DEFAULT },
        { .type = PI2_ROPE_LINEAR, .factor = 4.0 },
        { .type = PI2_ROPE_DYNAMIC, .factor = 2.0 },
        { .type = PI2_ROPE_LLAMA3, .factor = 8.0, .low_freq_factor = 1.0, .high_freq_factor = 4.0, .orig_max_pos = 64 },
        { .type = PI2_ROPE_LLAMA3, .factor = 1.0, .low_freq_factor = 1.0, .high_freq_factor = 4.0, .orig_max_pos = 64 },
    };
    enum { NT = sizeof types / sizeof types[0] };
    static float got[NT][N][64];
    for (int k = 0; k < NT; k++) {
        pi2_model_desc d = tiny_desc(PI2_ARCH_LLAMA, PI2_ACT_SILU);
        d.max_pos = 4;
        d.rope = types[k];
        build_opts o = { .dt = PI2_DT_F32, .seed = 77 }; /* the same weights for every type */
        snprintf(dir, sizeof dir, "%s/r%d", tmp, k);
        build_model(dir, &d, &o);
        pi2_err e = { 0 };
        pi2_ref_model *m = NULL;
        pi2_ref_state *s = NULL;
        assert_int_equal(pi2_ref_open(&m, dir, &e), 0);
        assert_int_equal(pi2_ref_desc(m)->rope.type, d.rope.type);
        int ctx = d.rope.type == PI2_ROPE_DYNAMIC ? N : d.max_pos;
        pi2_err_clear(&e);
        assert_int_equal(pi2_ref_state_create(&s, m, ctx + 1, &e), PI2_ERANGE);
        assert_int_equal(pi2_ref_state_create(&s, m, ctx, &e), 0);
        double want[64];
        for (int p = 0; p < ctx; p++) {
            assert_int_equal(pi2_ref_forward(m, s, toks[p], p, got[k][p], &e), 0);
            seq_oracle(pi2_ref_tensors(m), &d, toks, p + 1, want);
            for (int i = 0; i < d.vocab; i++)
                if (!(fabs(got[k][p][i] - want[i]) < 1e-4 * (1 + fabs(want[i]))))
                    fail_msg("rope %s position %d: logit %d is %.6f, oracle %.6f", pi2_rope_type_name(d.rope.type), p,
                             i, (double)got[k][p][i], want[i]);
        }
        pi2_ref_state_free(s);
        pi2_ref_close(m);
    }
    /* position 0 does not rotate; later ones see the scaling */
    assert_true(max_diff(got[0][0], got[1][0], 64) == 0);
    assert_true(max_diff(got[0][3], got[1][3], 64) > 1e-3);
    assert_true(max_diff(got[0][3], got[3][3], 64) > 1e-3);
    for (int p = 0; p < 4; p++) /* dynamic: the default model up to max_position_embeddings */
        assert_true(max_diff(got[0][p], got[2][p], 64) == 0);
    assert_true(max_diff(got[0][3], got[4][3], 64) < 1e-5); /* llama3 with factor 1 is the default */
    pi2t_rmtree(tmp);
}

/* Tied vs untied heads, both storage names of a tied matrix, sharding. */
static void test_heads_and_shards(void **state)
{
    (void)state;
    char tmp[64], dir[128];
    pi2t_tmpdir(tmp, sizeof tmp);
    pi2_model_desc tied = tiny_desc(PI2_ARCH_LLAMA, PI2_ACT_SILU), untied = tied;
    tied.tie_embeddings = true;
    size_t n = (size_t)tied.vocab * SEQ_LEN;
    struct { const pi2_model_desc *d; build_opts o; } v[] = {
        { &tied, { .dt = PI2_DT_F32, .seed = 9 } },                        /* 0: tied, stored as embed_tokens */
        { &tied, { .dt = PI2_DT_F32, .seed = 9, .tied_as_head = true } },  /* 1: tied, stored as lm_head */
        { &tied, { .dt = PI2_DT_F32, .seed = 9, .tied_both = true } },     /* 2: both stored: embed wins */
        { &untied, { .dt = PI2_DT_F32, .seed = 9, .head_is_embed = true } }, /* 3: untied, equal values */
        { &untied, { .dt = PI2_DT_F32, .seed = 9 } },                      /* 4: untied, own head */
        { &tied, { .dt = PI2_DT_F32, .seed = 9, .shards = 2 } },           /* 5: sharded copy of 0 */
    };
    float *l[6];
    for (int i = 0; i < 6; i++) {
        snprintf(dir, sizeof dir, "%s/v%d", tmp, i);
        build_model(dir, v[i].d, &v[i].o);
        l[i] = run_seq(dir, NULL, NULL);
    }
    snprintf(dir, sizeof dir, "%s/v5/model.safetensors.index.json", tmp);
    assert_true(pi2t_exists(dir));
    assert_true(max_diff(l[0], l[1], n) == 0);
    assert_true(max_diff(l[0], l[2], n) == 0);
    assert_true(max_diff(l[0], l[3], n) == 0);
    assert_true(max_diff(l[0], l[4], n) > 0.1);
    assert_true(max_diff(l[0], l[5], n) == 0);
    for (int i = 0; i < 6; i++)
        free(l[i]);
    pi2t_rmtree(tmp);
}

/* BF16/F16 storage: exact when the values are representable, close otherwise. */
static void test_half_storage(void **state)
{
    (void)state;
    char tmp[64], dir[128];
    pi2t_tmpdir(tmp, sizeof tmp);
    pi2_model_desc d = tiny_desc(PI2_ARCH_MIXTRAL, PI2_ACT_SILU);
    size_t n = (size_t)d.vocab * SEQ_LEN;
    float *l[5];
    const build_opts v[] = {
        { .dt = PI2_DT_F32, .seed = 21 },
        { .dt = PI2_DT_BF16, .seed = 21 },
        { .dt = PI2_DT_F16, .seed = 21 },
        { .dt = PI2_DT_F32, .seed = 21, .round_to_bf16 = true },
        { .dt = PI2_DT_BF16, .seed = 21, .round_to_bf16 = true },
    };
    for (int i = 0; i < 5; i++) {
        snprintf(dir, sizeof dir, "%s/v%d", tmp, i);
        build_model(dir, &d, &v[i]);
        l[i] = run_seq(dir, NULL, NULL);
    }
    double scale = max_abs(l[0], n);
    assert_true(scale > 0.5);
    double dbf = max_diff(l[0], l[1], n), dh = max_diff(l[0], l[2], n);
    if (!(dbf < 0.05 * scale && dh < 0.005 * scale && dh < dbf))
        fail_msg("bf16 diff %g, f16 diff %g, logit scale %g", dbf, dh, scale);
    assert_true(max_diff(l[3], l[4], n) == 0); /* bf16 -> f32 conversion is exact */
    for (int i = 0; i < 5; i++)
        free(l[i]);
    pi2t_rmtree(tmp);
}

/* Rewinding to an earlier position recomputes the same logits. */
static void test_rewind(void **state)
{
    (void)state;
    char tmp[64], dir[128];
    pi2t_tmpdir(tmp, sizeof tmp);
    pi2_model_desc d = tiny_desc(PI2_ARCH_LLAMA, PI2_ACT_SILU);
    build_opts o = { .dt = PI2_DT_F32, .seed = 2 };
    snprintf(dir, sizeof dir, "%s/m", tmp);
    build_model(dir, &d, &o);
    float *ref = run_seq(dir, NULL, NULL);
    pi2_err e = { 0 };
    pi2_ref_model *m = NULL;
    pi2_ref_state *s = NULL;
    assert_int_equal(pi2_ref_open(&m, dir, &e), 0);
    assert_int_equal(pi2_ref_state_create(&s, m, SEQ_LEN, &e), 0);
    float *lg = malloc(sizeof(float) * (size_t)d.vocab);
    assert_non_null(lg);
    for (int p = 0; p < 5; p++)
        assert_int_equal(pi2_ref_forward(m, s, (p * 7) % d.vocab, p, lg, &e), 0); /* some other text */
    /* Back to position 0: the cache is truncated and SEQ runs as if fresh. */
    for (int p = 0; p < SEQ_LEN; p++) {
        assert_int_equal(pi2_ref_forward(m, s, SEQ[p], p, lg, &e), 0);
        assert_true(max_diff(lg, ref + (size_t)p * d.vocab, (size_t)d.vocab) == 0);
    }
    free(lg);
    free(ref);
    pi2_ref_state_free(s);
    pi2_ref_close(m);
    pi2t_rmtree(tmp);
}

static int open_err(const char *dir, pi2_err *e)
{
    pi2_ref_model *m = (pi2_ref_model *)1;
    pi2_err_clear(e);
    int rc = pi2_ref_open(&m, dir, e);
    assert_null(m);
    if (rc) {
        assert_int_equal(e->code, rc);
        assert_null(strchr(e->msg, '\n'));
    }
    return rc;
}

static void test_open_errors(void **state)
{
    (void)state;
    char tmp[64], dir[128];
    pi2t_tmpdir(tmp, sizeof tmp);
    pi2_err e;
    pi2_model_desc d = tiny_desc(PI2_ARCH_LLAMA, PI2_ACT_SILU);
    pi2_model_desc dm = tiny_desc(PI2_ARCH_TURBOSPARSE_MIXTRAL, PI2_ACT_DRELU);

    snprintf(dir, sizeof dir, "%s/none", tmp);
    assert_int_equal(open_err(dir, &e), PI2_ENOTFOUND);

    static const struct { const char *skip, *shape, *idt; bool moe; int code; const char *name; } cases[] = {
        { "model.layers.1.self_attn.k_proj.weight", NULL, NULL, false, PI2_ENOTFOUND, NULL },
        { "model.norm.weight", NULL, NULL, false, PI2_ENOTFOUND, NULL },
        { "model.layers.0.mlp.down_proj.weight", NULL, NULL, false, PI2_ENOTFOUND, NULL },
        { "model.embed_tokens.weight", NULL, NULL, false, PI2_ENOTFOUND, NULL },
        { "lm_head.weight", NULL, NULL, false, PI2_ENOTFOUND, NULL }, /* untied needs lm_head */
        { "model.layers.1.block_sparse_moe.experts.3.w3.weight", NULL, NULL, true, PI2_ENOTFOUND, NULL },
        { "model.layers.0.block_sparse_moe.gate.weight", NULL, NULL, true, PI2_ENOTFOUND, NULL },
        { NULL, "model.layers.0.self_attn.o_proj.weight", NULL, false, PI2_ESHAPE, NULL },
        { NULL, "model.layers.1.post_attention_layernorm.weight", NULL, false, PI2_ESHAPE, NULL },
        { NULL, "lm_head.weight", NULL, false, PI2_ESHAPE, NULL },
        { NULL, "model.layers.1.block_sparse_moe.gate.weight", NULL, true, PI2_ESHAPE, NULL },
        { NULL, "model.layers.0.block_sparse_moe.experts.2.w2.weight", NULL, true, PI2_ESHAPE, NULL },
        { NULL, NULL, "model.layers.0.mlp.gate_proj.weight", false, PI2_EUNSUPPORTED, NULL },
        { NULL, NULL, "model.embed_tokens.weight", false, PI2_EUNSUPPORTED, NULL },
        { NULL, NULL, "model.layers.1.block_sparse_moe.experts.0.w1.weight", true, PI2_EUNSUPPORTED, NULL },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        build_opts o = { .dt = PI2_DT_BF16, .skip = cases[i].skip, .bad_shape = cases[i].shape,
                         .int_dtype = cases[i].idt, .seed = 1 };
        snprintf(dir, sizeof dir, "%s/c%zu", tmp, i);
        build_model(dir, cases[i].moe ? &dm : &d, &o);
        int rc = open_err(dir, &e);
        const char *tn = cases[i].skip ? cases[i].skip : cases[i].shape ? cases[i].shape : cases[i].idt;
        if (rc != cases[i].code || !strstr(e.msg, tn))
            fail_msg("case %zu: got %d (%s), want %d naming %s", i, rc, e.msg, cases[i].code, tn);
    }

    /* Tied model with the matrix under neither name. */
    pi2_model_desc dt = d;
    dt.tie_embeddings = true;
    build_opts o = { .dt = PI2_DT_F16, .skip = "model.embed_tokens.weight", .seed = 1 };
    snprintf(dir, sizeof dir, "%s/tied", tmp);
    build_model(dir, &dt, &o);
    assert_int_equal(open_err(dir, &e), PI2_ENOTFOUND);
    assert_non_null(strstr(e.msg, "lm_head.weight"));

    /* A broken config is reported as such. */
    snprintf(dir, sizeof dir, "%s/c0/config.json", tmp);
    pi2t_write(dir, "{\"model_type\": \"gpt2\"}", 22);
    snprintf(dir, sizeof dir, "%s/c0", tmp);
    assert_int_equal(open_err(dir, &e), PI2_EUNSUPPORTED);
    assert_int_equal(pi2_ref_open(NULL, dir, &e), PI2_EINVAL);

    /* NULL is a no-op for the destructors. */
    pi2_ref_close(NULL);
    pi2_ref_state_free(NULL);
    pi2_ref_state_set_hook(NULL, NULL, NULL);
    pi2t_rmtree(tmp);
}

static void test_forward_errors(void **state)
{
    (void)state;
    char tmp[64], dir[128], dir2[128];
    pi2t_tmpdir(tmp, sizeof tmp);
    pi2_model_desc d = tiny_desc(PI2_ARCH_LLAMA, PI2_ACT_RELU);
    build_opts o = { .dt = PI2_DT_F32, .seed = 4 };
    snprintf(dir, sizeof dir, "%s/m", tmp);
    snprintf(dir2, sizeof dir2, "%s/m2", tmp);
    build_model(dir, &d, &o);
    build_model(dir2, &d, &o);
    pi2_err e = { 0 };
    pi2_ref_model *m = NULL, *m2 = NULL;
    pi2_ref_state *s = NULL;
    assert_int_equal(pi2_ref_open(&m, dir, &e), 0);
    assert_int_equal(pi2_ref_open(&m2, dir2, &e), 0);
    assert_int_equal(pi2_ref_desc(m)->vocab, 64);
    assert_non_null(pi2_st_find(pi2_ref_tensors(m), "lm_head.weight"));

    assert_int_equal(pi2_ref_state_create(&s, m, 0, &e), PI2_ERANGE);
    assert_null(s);
    pi2_err_clear(&e);
    assert_int_equal(pi2_ref_state_create(&s, m, d.max_pos + 1, &e), PI2_ERANGE);
    assert_int_equal(pi2_ref_state_create(&s, m, 4, &e), 0);

    float lg[64];
    pi2_err_clear(&e);
    assert_int_equal(pi2_ref_forward(m, s, -1, 0, lg, &e), PI2_ERANGE);
    assert_non_null(strstr(e.msg, "token id -1"));
    pi2_err_clear(&e);
    assert_int_equal(pi2_ref_forward(m, s, 64, 0, lg, &e), PI2_ERANGE);
    pi2_err_clear(&e);
    assert_int_equal(pi2_ref_forward(m, s, 3, 1, lg, &e), PI2_ERANGE); /* skipping position 0 */
    assert_non_null(strstr(e.msg, "position 1"));
    pi2_err_clear(&e);
    assert_int_equal(pi2_ref_forward(m, s, 3, -1, lg, &e), PI2_ERANGE);
    pi2_err_clear(&e);
    assert_int_equal(pi2_ref_forward(m2, s, 3, 0, lg, &e), PI2_EINVAL); /* state of another model */
    pi2_err_clear(&e);
    assert_int_equal(pi2_ref_forward(m, s, 3, 0, NULL, &e), PI2_EINVAL);
    for (int p = 0; p < 4; p++)
        assert_int_equal(pi2_ref_forward(m, s, 3 + p, p, lg, &e), 0);
    pi2_err_clear(&e);
    assert_int_equal(pi2_ref_forward(m, s, 3, 4, lg, &e), PI2_ERANGE); /* past max_seq */
    for (int i = 0; i < 64; i++)
        assert_true(isfinite(lg[i]));
    pi2_ref_state_free(s);
    pi2_ref_close(m);
    pi2_ref_close(m2);
    pi2t_rmtree(tmp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_tinystories),
        cmocka_unit_test(test_golden_tinystories_drelu),
        cmocka_unit_test(test_moe_identical_experts),
        cmocka_unit_test(test_moe_routing),
        cmocka_unit_test(test_moe_top1_output),
        cmocka_unit_test(test_position0_oracle),
        cmocka_unit_test(test_activations),
        cmocka_unit_test(test_fatrelu_vs_relu),
        cmocka_unit_test(test_rope_scaling),
        cmocka_unit_test(test_heads_and_shards),
        cmocka_unit_test(test_half_storage),
        cmocka_unit_test(test_rewind),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_forward_errors),
    };
    return cmocka_run_group_tests_name("reference", tests, NULL, NULL);
}
