/* manifest: round trips for dense, tied, SiLU-threshold and MoE models with
 * every field set, byte-identical output, a container round trip, and a
 * corruption matrix (truncation, each required key removed, each value given
 * the wrong type, out-of-range values, bad sections, references and shapes),
 * edited with jansson. Every failure must be the exact code with a one-line
 * message naming the file and the key. */
#include "tests/testutil.h"

#include "formats/manifest.h"

#include <jansson.h>
#include <math.h>

#define NAME "t.pi2:manifest.json"

/* ---- fixtures ---- */

static pi2_model_desc cfg_llama(void)
{
    pi2_model_desc d = { 0 };
    d.arch = PI2_ARCH_LLAMA;
    d.act = PI2_ACT_RELU;
    d.hidden = 64;
    d.n_ff = 128;
    d.n_layers = 2;
    d.n_heads = 4;
    d.n_kv_heads = 2;
    d.head_dim = 16;
    d.vocab = 96;
    d.max_pos = 256;
    d.rope_theta = 10000.0;
    d.rms_eps = 1e-5f;
    d.bos_id = 1;
    d.n_eos = 1;
    d.eos_ids[0] = 2;
    return d;
}

static pi2_model_desc cfg_bamboo(void)
{
    pi2_model_desc d = cfg_llama();
    d.arch = PI2_ARCH_BAMBOO;
    d.act = PI2_ACT_DRELU;
    d.tie_embeddings = true;
    d.n_eos = 2;
    d.eos_ids[1] = 3;
    d.rope_theta = 1e6;
    return d;
}

static pi2_model_desc cfg_silu(void)
{
    pi2_model_desc d = cfg_llama();
    d.act = PI2_ACT_SILU;
    d.arch = PI2_ARCH_MISTRAL;
    return d;
}

static pi2_model_desc cfg_moe(void)
{
    pi2_model_desc d = cfg_llama();
    d.arch = PI2_ARCH_TURBOSPARSE_MIXTRAL;
    d.act = PI2_ACT_DRELU;
    d.n_ff = 96;
    d.n_layers = 2;
    d.n_experts = 4;
    d.n_experts_used = 2;
    return d;
}

/* Next section at the next free 4 KiB block after a 512-byte header. */
static void add_sec(pi2_manifest *m, const char *name, uint64_t size)
{
    pi2_ctr_section s;
    memset(&s, 0, sizeof s);
    snprintf(s.name, sizeof s.name, "%s", name);
    uint64_t off = 4096;
    if (m->n_sections) {
        const pi2_ctr_section *p = &m->sections[m->n_sections - 1];
        off = (p->offset + p->size + 512 + 4095) / 4096 * 4096;
    }
    s.offset = off;
    s.size = size;
    assert_int_equal(pi2_sha256(name, strlen(name), s.sha256, NULL), 0);
    pi2_err e = { 0 };
    assert_int_equal(pi2_manifest_add_section(m, &s, &e), 0);
}

static void add_tensor(pi2_manifest *m, pi2_tname role, int layer, int expert)
{
    const pi2_model_desc *d = &m->config;
    pi2_mf_tensor t;
    memset(&t, 0, sizeof t);
    assert_true(pi2_tensor_name(t.name, sizeof t.name, d, role, layer, expert));
    t.role = role;
    t.layer = layer;
    t.expert = expert;
    bool norm = role == PI2_T_OUT_NORM || role == PI2_T_ATTN_NORM || role == PI2_T_FFN_NORM;
    bool ffn = role == PI2_T_GATE || role == PI2_T_UP || role == PI2_T_DOWN;
    t.qtype = norm || role == PI2_T_ROUTER ? PI2_QT_F32 : ffn ? m->quant_ffn : m->quant_other;
    int64_t hd = d->head_dim;
    switch (role) {
    case PI2_T_EMBED:
    case PI2_T_LM_HEAD: t.rows = d->vocab; t.cols = d->hidden; break;
    case PI2_T_Q: t.rows = d->n_heads * hd; t.cols = d->hidden; break;
    case PI2_T_K:
    case PI2_T_V: t.rows = d->n_kv_heads * hd; t.cols = d->hidden; break;
    case PI2_T_O: t.rows = d->hidden; t.cols = d->n_heads * hd; break;
    case PI2_T_GATE:
    case PI2_T_UP: t.rows = d->n_ff; t.cols = d->hidden; break;
    case PI2_T_DOWN: t.rows = d->n_ff; t.cols = d->hidden; t.transposed = true; break;
    case PI2_T_ROUTER: t.rows = d->n_experts; t.cols = d->hidden; break;
    default: t.rows = 1; t.cols = d->hidden; break;
    }
    snprintf(t.payload, sizeof t.payload, "t/%.90s.p", t.name);
    add_sec(m, t.payload, (uint64_t)t.rows * pi2_q_payload_row_bytes(t.qtype, t.cols));
    if (t.qtype != PI2_QT_F32) {
        snprintf(t.scales, sizeof t.scales, "t/%.90s.s", t.name);
        add_sec(m, t.scales, (uint64_t)t.rows * pi2_q_scale_row_count(t.qtype, t.cols) * 2);
    }
    pi2_err e = { 0 };
    assert_int_equal(pi2_manifest_add_tensor(m, &t, &e), 0);
}

/* A manifest with every field set; values differ per entry so a mix-up shows. */
static pi2_manifest *make(pi2_model_desc d, pi2_mf_kind kind, pi2_mf_mode mode)
{
    pi2_manifest *m = pi2_manifest_new();
    assert_non_null(m);
    pi2_err e = { 0 };
    bool moe = d.n_experts > 0;
    m->kind = kind;
    snprintf(m->created_by, sizeof m->created_by, "pi2-convert 0.1 \"test\" \\ ü");
    snprintf(m->source, sizeof m->source, "%s-small", pi2_arch_name(d.arch));
    m->config = d;
    snprintf(m->torch_dtype, sizeof m->torch_dtype, "bfloat16");
    m->quant_ffn = PI2_QT_Q4;
    m->quant_other = moe ? PI2_QT_Q4 : PI2_QT_Q8;
    snprintf(m->tokenizer, sizeof m->tokenizer, "tokenizer.json");
    add_sec(m, "tokenizer.json", 1234);

    add_tensor(m, PI2_T_EMBED, -1, -1);
    add_tensor(m, PI2_T_OUT_NORM, -1, -1);
    if (!d.tie_embeddings)
        add_tensor(m, PI2_T_LM_HEAD, -1, -1);
    int ne = moe ? d.n_experts : 1;
    for (int l = 0; l < d.n_layers; l++) {
        static const pi2_tname per[] = { PI2_T_ATTN_NORM, PI2_T_FFN_NORM, PI2_T_Q, PI2_T_K, PI2_T_V, PI2_T_O };
        for (size_t i = 0; i < sizeof per / sizeof per[0]; i++)
            add_tensor(m, per[i], l, -1);
        if (moe)
            add_tensor(m, PI2_T_ROUTER, l, -1);
        for (int x = 0; x < ne; x++) {
            add_tensor(m, PI2_T_GATE, l, moe ? x : -1);
            add_tensor(m, PI2_T_UP, l, moe ? x : -1);
            add_tensor(m, PI2_T_DOWN, l, moe ? x : -1);
        }
    }

    m->sparsity_mode = mode;
    if (mode == PI2_MF_SPARSE_PREDICTOR)
        m->recall_target = 0.95;
    if (mode == PI2_MF_SPARSE_THRESHOLD)
        m->threshold_sparsity = 0.7;
    uint64_t words = ((uint64_t)d.n_ff + 63) / 64;
    for (int l = 0; l < d.n_layers; l++)
        for (int x = 0; x < ne; x++) {
            int ex = moe ? x : -1;
            int k = l * ne + x;
            if (mode != PI2_MF_SPARSE_NONE) {
                pi2_mf_layer ly;
                memset(&ly, 0, sizeof ly);
                ly.layer = l;
                ly.expert = ex;
                if (mode == PI2_MF_SPARSE_PREDICTOR) {
                    pi2_mf_predictor *p = &ly.predictor;
                    ly.has_predictor = true;
                    p->rank = 32 + k;
                    p->threshold = 0.3f + (float)k;
                    p->imported = moe;
                    snprintf(p->fc1, sizeof p->fc1, "pred/%d.%d.fc1", l, ex);
                    snprintf(p->fc2, sizeof p->fc2, "pred/%d.%d.fc2", l, ex);
                    add_sec(m, p->fc1, (uint64_t)p->rank * (uint64_t)d.hidden * 4);
                    add_sec(m, p->fc2, (uint64_t)d.n_ff * (uint64_t)p->rank * 4);
                    pi2_pred_report *r = &p->report;
                    r->rank = p->rank;
                    r->threshold = -1.25f - (float)k;
                    r->recall = 0.991 - k * 1e-3;
                    r->precision = 0.4 + k * 0.01;
                    r->pred_active_frac = 0.12;
                    r->true_active_frac = 1.0 / 3.0;
                    r->bytes_f32 = pi2_pred_bytes_f32(d.hidden, d.n_ff, p->rank);
                    r->bytes_q8 = pi2_pred_bytes_q8(d.hidden, d.n_ff, p->rank);
                    r->n_eval = 100 + (size_t)k;
                    r->n_train = 400 + (size_t)k;
                    r->epochs = 7;
                    r->early_stopped = k % 2 == 0;
                    r->best_epoch = 5;
                    r->pos_weight = 7.5;
                    r->train_loss = 0.0123456789;
                    r->heldout_loss = k == 1 ? NAN : 0.02;
                    r->seconds = 1.5e-3;
                } else {
                    ly.has_silu_threshold = true;
                    ly.silu_threshold = 0.01f * (float)(k + 1);
                }
                assert_int_equal(pi2_manifest_add_layer(m, &ly, &e), 0);
            }
            pi2_mf_profile pr;
            memset(&pr, 0, sizeof pr);
            pr.layer = l;
            pr.expert = ex;
            pr.active_frac = 0.1 + 0.01 * k;
            pr.hot_share = 0.5;
            pr.top10_share = 0.61;
            pr.route_share = moe ? (x + 1.0) / (ne * (ne + 1) / 2.0) : NAN;
            snprintf(pr.freq, sizeof pr.freq, "prof/%d.%d.freq", l, ex);
            add_sec(m, pr.freq, (uint64_t)d.n_ff * 4);
            pr.bit_samples = k == 0 ? 0 : (uint64_t)(3 + k);
            if (pr.bit_samples) {
                snprintf(pr.bits, sizeof pr.bits, "prof/%d.%d.bits", l, ex);
                add_sec(m, pr.bits, pr.bit_samples * words * 8);
            }
            assert_int_equal(pi2_manifest_add_profile(m, &pr, &e), 0);
        }
    m->profile_tokens = 4096;
    m->quality_tokens = 512;
    m->ppl_ref = 7.25;
    m->ppl_q_dense = 7.5;
    m->ppl_q_sparse = mode == PI2_MF_SPARSE_NONE ? NAN : 7.625;
    if (kind == PI2_MF_BUNDLED) {
        add_sec(m, "bundle/perm.0", 512);
        assert_int_equal(pi2_manifest_set_bundle(m,
                                                 "{\"perms\": [\"bundle/perm.0\"], \"io_unit\": 4096, "
                                                 "\"regions\": [{\"a\": 0.1, \"b\": null}], \"x\": 1.0}",
                                                 &e),
                         0);
    }
    return m;
}

static char *to_json(const pi2_manifest *m, size_t *len)
{
    char *text = NULL;
    pi2_err e = { 0 };
    int rc = pi2_manifest_to_json(m, &text, len, &e);
    if (rc)
        print_message("to_json: %d %s\n", rc, e.msg);
    assert_int_equal(rc, 0);
    assert_non_null(text);
    assert_int_equal(strlen(text), *len);
    return text;
}

/* ---- comparisons ---- */

static void same_double(double a, double b)
{
    if (isnan(a) || isnan(b)) {
        assert_true(isnan(a) && isnan(b));
        return;
    }
    assert_true(a == b);
}

static void same_desc(const pi2_model_desc *a, const pi2_model_desc *b)
{
    assert_int_equal(a->arch, b->arch);
    assert_int_equal(a->act, b->act);
    assert_int_equal(a->hidden, b->hidden);
    assert_int_equal(a->n_ff, b->n_ff);
    assert_int_equal(a->n_layers, b->n_layers);
    assert_int_equal(a->n_heads, b->n_heads);
    assert_int_equal(a->n_kv_heads, b->n_kv_heads);
    assert_int_equal(a->head_dim, b->head_dim);
    assert_int_equal(a->vocab, b->vocab);
    assert_int_equal(a->max_pos, b->max_pos);
    same_double(a->rope_theta, b->rope_theta);
    assert_true(a->rms_eps == b->rms_eps);
    assert_int_equal(a->tie_embeddings, b->tie_embeddings);
    assert_int_equal(a->n_experts, b->n_experts);
    assert_int_equal(a->n_experts_used, b->n_experts_used);
    assert_int_equal(a->bos_id, b->bos_id);
    assert_int_equal(a->n_eos, b->n_eos);
    for (int i = 0; i < a->n_eos; i++)
        assert_int_equal(a->eos_ids[i], b->eos_ids[i]);
}

static void same_report(const pi2_pred_report *a, const pi2_pred_report *b)
{
    assert_int_equal(a->rank, b->rank);
    assert_true(a->threshold == b->threshold);
    same_double(a->recall, b->recall);
    same_double(a->precision, b->precision);
    same_double(a->pred_active_frac, b->pred_active_frac);
    same_double(a->true_active_frac, b->true_active_frac);
    assert_int_equal(a->bytes_f32, b->bytes_f32);
    assert_int_equal(a->bytes_q8, b->bytes_q8);
    assert_int_equal(a->n_eval, b->n_eval);
    assert_int_equal(a->n_train, b->n_train);
    assert_int_equal(a->epochs, b->epochs);
    assert_int_equal(a->early_stopped, b->early_stopped);
    assert_int_equal(a->best_epoch, b->best_epoch);
    same_double(a->pos_weight, b->pos_weight);
    same_double(a->train_loss, b->train_loss);
    same_double(a->heldout_loss, b->heldout_loss);
    same_double(a->seconds, b->seconds);
}

static void same_manifest(const pi2_manifest *a, const pi2_manifest *b)
{
    assert_int_equal(a->kind, b->kind);
    assert_string_equal(a->created_by, b->created_by);
    assert_string_equal(a->source, b->source);
    same_desc(&a->config, &b->config);
    assert_string_equal(a->torch_dtype, b->torch_dtype);
    assert_int_equal(a->quant_ffn, b->quant_ffn);
    assert_int_equal(a->quant_other, b->quant_other);
    assert_string_equal(a->tokenizer, b->tokenizer);
    assert_int_equal(a->n_tensors, b->n_tensors);
    for (size_t i = 0; i < a->n_tensors; i++) {
        const pi2_mf_tensor *x = &a->tensors[i], *y = &b->tensors[i];
        assert_string_equal(x->name, y->name);
        assert_int_equal(x->role, y->role);
        assert_int_equal(x->layer, y->layer);
        assert_int_equal(x->expert, y->expert);
        assert_int_equal(x->qtype, y->qtype);
        assert_int_equal(x->rows, y->rows);
        assert_int_equal(x->cols, y->cols);
        assert_int_equal(x->transposed, y->transposed);
        assert_string_equal(x->payload, y->payload);
        assert_string_equal(x->scales, y->scales);
    }
    assert_int_equal(a->sparsity_mode, b->sparsity_mode);
    same_double(a->recall_target, b->recall_target);
    same_double(a->threshold_sparsity, b->threshold_sparsity);
    assert_int_equal(a->n_layers, b->n_layers);
    for (size_t i = 0; i < a->n_layers; i++) {
        const pi2_mf_layer *x = &a->layers[i], *y = &b->layers[i];
        assert_int_equal(x->layer, y->layer);
        assert_int_equal(x->expert, y->expert);
        assert_int_equal(x->has_predictor, y->has_predictor);
        if (x->has_predictor) {
            assert_int_equal(x->predictor.rank, y->predictor.rank);
            assert_true(x->predictor.threshold == y->predictor.threshold);
            assert_int_equal(x->predictor.imported, y->predictor.imported);
            assert_string_equal(x->predictor.fc1, y->predictor.fc1);
            assert_string_equal(x->predictor.fc2, y->predictor.fc2);
            assert_int_equal(x->predictor.dtype, y->predictor.dtype);
            assert_string_equal(x->predictor.fc1_scales, y->predictor.fc1_scales);
            assert_string_equal(x->predictor.fc2_scales, y->predictor.fc2_scales);
            same_report(&x->predictor.report, &y->predictor.report);
        }
        assert_int_equal(x->has_silu_threshold, y->has_silu_threshold);
        if (x->has_silu_threshold)
            assert_true(x->silu_threshold == y->silu_threshold);
    }
    assert_int_equal(a->profile_tokens, b->profile_tokens);
    assert_int_equal(a->n_profile, b->n_profile);
    for (size_t i = 0; i < a->n_profile; i++) {
        const pi2_mf_profile *x = &a->profile[i], *y = &b->profile[i];
        assert_int_equal(x->layer, y->layer);
        assert_int_equal(x->expert, y->expert);
        same_double(x->active_frac, y->active_frac);
        same_double(x->hot_share, y->hot_share);
        same_double(x->top10_share, y->top10_share);
        assert_true(isnan(x->route_share) ? isnan(y->route_share) : x->route_share == y->route_share);
        assert_string_equal(x->freq, y->freq);
        assert_string_equal(x->bits, y->bits);
        assert_int_equal(x->bit_samples, y->bit_samples);
    }
    assert_int_equal(a->quality_tokens, b->quality_tokens);
    same_double(a->ppl_ref, b->ppl_ref);
    same_double(a->ppl_q_dense, b->ppl_q_dense);
    same_double(a->ppl_q_sparse, b->ppl_q_sparse);
    assert_int_equal(a->bundle_json == NULL, b->bundle_json == NULL);
    if (a->bundle_json) {
        json_t *x = json_loads(a->bundle_json, 0, NULL), *y = json_loads(b->bundle_json, 0, NULL);
        assert_non_null(x);
        assert_non_null(y);
        assert_true(json_equal(x, y));
        json_decref(x);
        json_decref(y);
    }
    assert_int_equal(a->n_sections, b->n_sections);
    for (size_t i = 0; i < a->n_sections; i++) {
        assert_string_equal(a->sections[i].name, b->sections[i].name);
        assert_int_equal(a->sections[i].offset, b->sections[i].offset);
        assert_int_equal(a->sections[i].size, b->sections[i].size);
        assert_memory_equal(a->sections[i].sha256, b->sections[i].sha256, PI2_SHA256_LEN);
    }
}

/* to_json twice (same bytes), parse, compare every field, and to_json of the
 * parsed manifest gives the same bytes again. */
static void round_trip(pi2_manifest *m)
{
    size_t len1, len2, len3;
    char *t1 = to_json(m, &len1), *t2 = to_json(m, &len2);
    assert_int_equal(len1, len2);
    assert_memory_equal(t1, t2, len1);
    assert_int_equal(t1[len1 - 1], '\n');

    pi2_manifest *p = NULL;
    pi2_err e = { 0 };
    int rc = pi2_manifest_parse(t1, len1, NAME, &p, &e);
    if (rc)
        print_message("parse: %s\n", e.msg);
    assert_int_equal(rc, 0);
    same_manifest(m, p);
    char *t3 = to_json(p, &len3);
    assert_int_equal(len1, len3);
    assert_memory_equal(t1, t3, len1);
    free(t1);
    free(t2);
    free(t3);
    pi2_manifest_free(p);
}

/* ---- round trips ---- */

static void test_round_trip_llama(void **state)
{
    (void)state;
    pi2_manifest *m = make(cfg_llama(), PI2_MF_CONVERTED, PI2_MF_SPARSE_PREDICTOR);
    round_trip(m);

    /* Reals in their shortest form; fixed key order. */
    size_t len;
    char *t = to_json(m, &len);
    assert_non_null(strstr(t, "\"recall_target\": 0.95,"));
    assert_non_null(strstr(t, "\"rope_theta\": 10000.0,"));
    assert_non_null(strstr(t, "\"rms_norm_eps\": 1e-05,"));
    assert_non_null(strstr(t, "\"seconds\": 0.0015}"));
    assert_non_null(strstr(t, "\"threshold\": 0.3,"));
    assert_non_null(strstr(t, "\"threshold_sparsity\": null,"));
    assert_non_null(strstr(t, "\"heldout_loss\": null"));
    assert_non_null(strstr(t, "\"bundle\": null,"));
    assert_non_null(strstr(t, "\"imported\": false,\n          \"input\": \"normed\",\n          \"dtype\": \"f32\","));
    const char *head = "{\n  \"format\": \"pi2\",\n  \"version\": 1,\n  \"kind\": \"converted\",\n";
    assert_true(strncmp(t, head, strlen(head)) == 0);
    assert_non_null(strstr(t, "{\"name\": \"model.layers.1.mlp.down_proj.weight\", \"layer\": 1, \"expert\": -1, "
                              "\"role\": \"down\", \"qtype\": \"q4\", \"rows\": 128, \"cols\": 64, "
                              "\"transposed\": true,"));
    assert_true(strstr(t, "\"format\"") < strstr(t, "\"config\"") &&
                strstr(t, "\"config\"") < strstr(t, "\"tensors\"") &&
                strstr(t, "\"tensors\"") < strstr(t, "\"sparsity\"") &&
                strstr(t, "\"quality\"") < strstr(t, "\"bundle\"") &&
                strstr(t, "\"bundle\"") < strstr(t, "\"sections\""));
    free(t);
    /* the vector a predictor reads and its members' encoding survive a round trip */
    for (size_t i = 0; i < m->n_layers; i++) {
        m->layers[i].predictor.input = PI2_PRED_IN_PRENORM;
        m->layers[i].predictor.dtype = PI2_MF_PRED_F16;
    }
    round_trip(m);
    t = to_json(m, &len);
    assert_non_null(strstr(t, "\"input\": \"prenorm\",\n          \"dtype\": \"f16\","));
    free(t);
    pi2_manifest_free(m);
}

/* Point every predictor of m at q8/q4 members of the sizes the runtime
 * evaluates (fc2 rows padded to rank_p); fc1_scales of layer `bad` one byte
 * short when bad >= 0. */
static void set_pred_quant(pi2_manifest *m, pi2_mf_pdtype dt, int bad)
{
    pi2_qtype qt = pi2_mf_pred_qtype(dt);
    int64_t D = m->config.hidden, N = m->config.n_ff;
    for (size_t i = 0; i < m->n_layers; i++) {
        pi2_mf_predictor *p = &m->layers[i].predictor;
        int64_t R = p->rank, Rp = (R + PI2_Q_GROUP - 1) / PI2_Q_GROUP * PI2_Q_GROUP;
        p->dtype = dt;
        snprintf(p->fc1, sizeof p->fc1, "pq/%zu.%s.fc1", i, pi2_mf_pred_dtype_name(dt));
        snprintf(p->fc2, sizeof p->fc2, "pq/%zu.%s.fc2", i, pi2_mf_pred_dtype_name(dt));
        snprintf(p->fc1_scales, sizeof p->fc1_scales, "pq/%zu.%s.fc1.s", i, pi2_mf_pred_dtype_name(dt));
        snprintf(p->fc2_scales, sizeof p->fc2_scales, "pq/%zu.%s.fc2.s", i, pi2_mf_pred_dtype_name(dt));
        add_sec(m, p->fc1, (uint64_t)R * pi2_q_payload_row_bytes(qt, D));
        add_sec(m, p->fc2, (uint64_t)N * pi2_q_payload_row_bytes(qt, Rp));
        add_sec(m, p->fc1_scales, (uint64_t)R * pi2_q_scale_row_count(qt, D) * 2 - ((int)i == bad));
        add_sec(m, p->fc2_scales, (uint64_t)N * pi2_q_scale_row_count(qt, Rp) * 2);
    }
}

/* q8 and q4 predictors round-trip with their scales members; an f32 one
 * writes no scales keys, so older manifests stay byte for byte. */
static void test_round_trip_pred_quant(void **state)
{
    (void)state;
    static const pi2_mf_pdtype dts[2] = { PI2_MF_PRED_Q8, PI2_MF_PRED_Q4 };
    for (int k = 0; k < 2; k++) {
        pi2_manifest *m = make(cfg_llama(), PI2_MF_CONVERTED, PI2_MF_SPARSE_PREDICTOR);
        char *t = to_json(m, &(size_t){ 0 });
        assert_null(strstr(t, "fc1_scales"));
        free(t);
        set_pred_quant(m, dts[k], -1);
        round_trip(m);
        size_t len;
        t = to_json(m, &len);
        char want[64];
        snprintf(want, sizeof want, "\"dtype\": \"%s\",", pi2_mf_pred_dtype_name(dts[k]));
        assert_non_null(strstr(t, want));
        assert_non_null(strstr(t, "\"fc1_scales\": \"pq/0."));
        free(t);
        pi2_manifest_free(m);
    }
}

static void test_round_trip_bamboo_bundled(void **state)
{
    (void)state;
    pi2_manifest *m = make(cfg_bamboo(), PI2_MF_BUNDLED, PI2_MF_SPARSE_PREDICTOR);
    round_trip(m);
    assert_null(pi2_manifest_find_tensor(m, PI2_T_LM_HEAD, -1, -1)); /* tied */
    pi2_manifest_free(m);
}

static void test_round_trip_silu_threshold(void **state)
{
    (void)state;
    pi2_manifest *m = make(cfg_silu(), PI2_MF_CONVERTED, PI2_MF_SPARSE_THRESHOLD);
    m->ppl_ref = NAN;
    m->quality_tokens = 0;
    round_trip(m);
    pi2_manifest_free(m);
    m = make(cfg_silu(), PI2_MF_CONVERTED, PI2_MF_SPARSE_NONE);
    round_trip(m);
    pi2_manifest_free(m);
}

static void test_round_trip_moe(void **state)
{
    (void)state;
    pi2_manifest *m = make(cfg_moe(), PI2_MF_CONVERTED, PI2_MF_SPARSE_PREDICTOR);
    round_trip(m);
    const pi2_mf_tensor *t = pi2_manifest_find_tensor(m, PI2_T_DOWN, 1, 3);
    assert_non_null(t);
    assert_string_equal(t->name, "model.layers.1.block_sparse_moe.experts.3.w2.weight");
    assert_true(t->transposed);
    assert_non_null(pi2_manifest_find_tensor(m, PI2_T_ROUTER, 0, -1));
    assert_null(pi2_manifest_find_tensor(m, PI2_T_DOWN, 1, 4));
    const pi2_mf_layer *l = pi2_manifest_find_layer(m, 1, 2);
    assert_non_null(l);
    assert_true(l->predictor.imported);
    assert_int_equal(l->predictor.rank, 32 + 6);
    assert_non_null(pi2_manifest_find_profile(m, 0, 3));
    assert_null(pi2_manifest_find_profile(m, 0, -1));
    pi2_manifest_free(m);
    m = make(cfg_moe(), PI2_MF_BUNDLED, PI2_MF_SPARSE_NONE);
    round_trip(m);
    pi2_manifest_free(m);
}

/* Sections from a real container writer; the manifest goes in last and is
 * read back from the opened container, digests verified. */
static void test_container_round_trip(void **state)
{
    (void)state;
    char dir[64], path[128];
    pi2t_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/model.pi2", dir);
    pi2_manifest *m = make(cfg_llama(), PI2_MF_CONVERTED, PI2_MF_SPARSE_PREDICTOR);
    pi2_err e = { 0 };
    pi2_ctr_writer *w;
    assert_int_equal(pi2_ctr_writer_create(&w, path, &e), 0);
    for (size_t i = 0; i < m->n_sections; i++) {
        size_t n = (size_t)m->sections[i].size;
        uint8_t *buf = calloc(n ? n : 1, 1);
        assert_non_null(buf);
        for (size_t j = 0; j < n; j++)
            buf[j] = (uint8_t)(i + j);
        assert_int_equal(pi2_ctr_writer_add(w, m->sections[i].name, buf, n, &e), 0);
        free(buf);
    }
    size_t n;
    const pi2_ctr_section *secs = pi2_ctr_writer_sections(w, &n);
    m->n_sections = 0;
    assert_int_equal(pi2_manifest_add_sections(m, secs, n, &e), 0);
    assert_int_equal(m->n_sections, n);
    size_t len;
    char *text = to_json(m, &len);
    assert_int_equal(pi2_ctr_writer_add(w, PI2_MF_NAME, text, len, &e), 0);
    assert_int_equal(pi2_ctr_writer_finish(w, &e), 0);
    /* The writer's list now holds manifest.json, which add_sections skips. */
    pi2_manifest *m2 = pi2_manifest_new();
    secs = pi2_ctr_writer_sections(w, &n);
    assert_int_equal(pi2_manifest_add_sections(m2, secs, n, &e), 0);
    assert_int_equal(m2->n_sections, n - 1);
    pi2_manifest_free(m2);
    pi2_ctr_writer_free(w);

    pi2_ctr *c;
    assert_int_equal(pi2_ctr_open(&c, path, &e), 0);
    const pi2_ctr_member *mm = pi2_ctr_find(c, PI2_MF_NAME);
    assert_non_null(mm);
    pi2_manifest *p;
    assert_int_equal(pi2_manifest_parse((const char *)mm->data, (size_t)mm->size, NAME, &p, &e), 0);
    same_manifest(m, p);
    for (size_t i = 0; i < p->n_sections; i++) {
        const pi2_ctr_member *x = pi2_ctr_find(c, p->sections[i].name);
        assert_non_null(x);
        assert_int_equal(x->offset, p->sections[i].offset);
        assert_int_equal(x->size, p->sections[i].size);
        assert_int_equal(pi2_ctr_verify_member(c, x, p->sections[i].sha256, &e), 0);
    }
    const pi2_ctr_section *s = pi2_manifest_find_section(p, p->tensors[0].payload);
    assert_non_null(s);
    assert_null(pi2_manifest_find_section(p, PI2_MF_NAME));
    pi2_ctr_close(c);
    pi2_manifest_free(p);
    free(text);
    pi2_manifest_free(m);
    pi2t_rmtree(dir);
}

/* ---- API edges ---- */

static void test_api(void **state)
{
    (void)state;
    pi2_manifest_free(NULL);
    pi2_manifest *m = pi2_manifest_new();
    assert_non_null(m);
    assert_int_equal(m->kind, PI2_MF_CONVERTED);
    assert_true(isnan(m->ppl_ref) && isnan(m->recall_target));
    assert_null(pi2_manifest_find_tensor(m, PI2_T_EMBED, -1, -1));
    assert_null(pi2_manifest_find_section(m, "x"));
    assert_null(pi2_manifest_find_section(NULL, "x"));
    assert_string_equal(pi2_manifest_role_name(PI2_T_ROUTER), "router");
    assert_string_equal(pi2_manifest_role_name(PI2_T_PRED_FC1), "?");
    assert_string_equal(pi2_manifest_kind_name(PI2_MF_BUNDLED), "bundled");
    assert_string_equal(pi2_manifest_mode_name(PI2_MF_SPARSE_THRESHOLD), "threshold");

    pi2_err e = { 0 };
    assert_int_equal(pi2_manifest_add_tensor(NULL, NULL, &e), PI2_EINVAL);
    pi2_manifest *p = (pi2_manifest *)&e;
    pi2_err_clear(&e);
    assert_int_equal(pi2_manifest_parse(NULL, 0, NULL, &p, &e), PI2_EINVAL);
    assert_null(p);
    char *text = (char *)"x";
    pi2_err_clear(&e);
    assert_int_equal(pi2_manifest_to_json(NULL, &text, NULL, &e), PI2_EINVAL);
    assert_null(text);

    /* Section cap. */
    pi2_ctr_section s;
    memset(&s, 0, sizeof s);
    for (size_t i = 0; i < PI2_CTR_MAX_MEMBERS; i++) {
        snprintf(s.name, sizeof s.name, "s%zu", i);
        assert_int_equal(pi2_manifest_add_section(m, &s, &e), 0);
    }
    pi2_err_clear(&e);
    assert_int_equal(pi2_manifest_add_section(m, &s, &e), PI2_ERANGE);
    assert_int_equal(m->n_sections, PI2_CTR_MAX_MEMBERS);
    assert_int_equal(pi2_manifest_set_bundle(m, "{}", &e), 0);
    assert_int_equal(pi2_manifest_set_bundle(m, NULL, &e), 0);
    assert_null(m->bundle_json);
    pi2_manifest_free(m);
}

static void expect_to_json_error(pi2_manifest *m, int code, const char *needle)
{
    char *text = NULL;
    size_t len = 7;
    pi2_err e = { 0 };
    int rc = pi2_manifest_to_json(m, &text, &len, &e);
    if (rc != code || !strstr(e.msg, needle))
        print_message("to_json: rc %d, msg: %s\n", rc, e.msg);
    assert_int_equal(rc, code);
    assert_null(text);
    assert_int_equal(len, 0);
    assert_non_null(strstr(e.msg, "manifest"));
    assert_non_null(strstr(e.msg, needle));
}

/* A scales member one byte short: one line naming the key, sizes and shape. */
static void test_pred_quant_bad_scales(void **state)
{
    (void)state;
    pi2_manifest *m = make(cfg_llama(), PI2_MF_CONVERTED, PI2_MF_SPARSE_PREDICTOR);
    set_pred_quant(m, PI2_MF_PRED_Q4, 1);
    expect_to_json_error(m, PI2_ESHAPE, "sparsity.per_layer[1].predictor.fc1_scales: member \"pq/1.q4.fc1.s\" holds");
    pi2_manifest_free(m);
}

/* The writer refuses what the reader would refuse. */
static void test_to_json_refuses(void **state)
{
    (void)state;
    pi2_manifest *m = make(cfg_llama(), PI2_MF_CONVERTED, PI2_MF_SPARSE_PREDICTOR);
    m->tensors[9].rows++;
    expect_to_json_error(m, PI2_ESHAPE, "rows");
    m->tensors[9].rows--;

    m->profile[0].hot_share = NAN;
    expect_to_json_error(m, PI2_EFORMAT, "hot_share");
    m->profile[0].hot_share = 0.5;

    snprintf(m->created_by, sizeof m->created_by, "bad \xff utf8");
    expect_to_json_error(m, PI2_EINVAL, "created_by");
    snprintf(m->created_by, sizeof m->created_by, "ok");

    assert_int_equal(pi2_manifest_set_bundle(m, "[1, 2]", NULL), 0);
    expect_to_json_error(m, PI2_EINVAL, "bundle");
    assert_int_equal(pi2_manifest_set_bundle(m, "{\"a\": ", NULL), 0);
    expect_to_json_error(m, PI2_EINVAL, "bundle");
    assert_int_equal(pi2_manifest_set_bundle(m, "{}", NULL), 0);
    expect_to_json_error(m, PI2_EFORMAT, "bundle"); /* converted must not carry one */
    assert_int_equal(pi2_manifest_set_bundle(m, NULL, NULL), 0);

    m->config.hidden = 0;
    expect_to_json_error(m, PI2_ERANGE, "config");
    m->config = cfg_llama();

    m->layers[1].predictor.fc1[0] = 0;
    expect_to_json_error(m, PI2_EFORMAT, "fc1");
    snprintf(m->layers[1].predictor.fc1, sizeof m->layers[1].predictor.fc1, "missing.bin");
    expect_to_json_error(m, PI2_ENOTFOUND, "missing.bin");
    pi2_manifest_free(m);
}

/* ---- corruption matrix ---- */

static char *g_text;   /* valid llama manifest */
static size_t g_len;
static char *g_moe;    /* valid MoE manifest */
static size_t g_moe_len;

static int setup(void **state)
{
    (void)state;
    pi2_manifest *m = make(cfg_llama(), PI2_MF_CONVERTED, PI2_MF_SPARSE_PREDICTOR);
    g_text = to_json(m, &g_len);
    pi2_manifest_free(m);
    m = make(cfg_moe(), PI2_MF_CONVERTED, PI2_MF_SPARSE_PREDICTOR);
    g_moe = to_json(m, &g_moe_len);
    pi2_manifest_free(m);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    free(g_text);
    free(g_moe);
    return 0;
}

/* Parse must fail with `code`, a one-line message naming the file and
 * holding `needle` (if any), and leave *out NULL. */
static void expect_text_error(const char *text, size_t len, int code, const char *needle)
{
    pi2_manifest *m = (pi2_manifest *)&m;
    pi2_err e = { 0 };
    int rc = pi2_manifest_parse(text, len, NAME, &m, &e);
    if (rc != code || (needle && !strstr(e.msg, needle)))
        print_message("expected %d with \"%s\": got %d: %s\n", code, needle ? needle : "", rc, e.msg);
    assert_int_equal(rc, code);
    assert_int_equal(e.code, code);
    assert_null(m);
    assert_true(strncmp(e.msg, NAME ": ", strlen(NAME) + 2) == 0);
    assert_null(strchr(e.msg, '\n'));
    if (needle)
        assert_non_null(strstr(e.msg, needle));
}

static void expect_json_error(json_t *root, int code, const char *needle)
{
    char *s = json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    assert_non_null(s);
    expect_text_error(s, strlen(s), code, needle);
    free(s);
}

static json_t *load(const char *text, size_t len)
{
    json_error_t je;
    json_t *r = json_loadb(text, len, 0, &je);
    assert_non_null(r);
    return r;
}

/* Node at a dotted path ("tensors.3.rows"); numbers index arrays. Returns
 * the parent and the last component. */
static json_t *walk(json_t *root, const char *path, char *last, size_t cap)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    json_t *cur = root;
    char *save = NULL, *tok = strtok_r(buf, ".", &save);
    while (tok) {
        char *next = strtok_r(NULL, ".", &save);
        if (!next) {
            snprintf(last, cap, "%s", tok);
            return cur;
        }
        cur = json_is_array(cur) ? json_array_get(cur, strtoul(tok, NULL, 10)) : json_object_get(cur, tok);
        assert_non_null(cur);
        tok = next;
    }
    fail_msg("empty path");
    return NULL;
}

/* Set path to v (stolen); v NULL deletes the key. */
static void set_path(json_t *root, const char *path, json_t *v)
{
    char last[64];
    json_t *parent = walk(root, path, last, sizeof last);
    if (json_is_array(parent)) {
        assert_non_null(v);
        assert_int_equal(json_array_set_new(parent, strtoul(last, NULL, 10), v), 0);
    } else if (v) {
        assert_int_equal(json_object_set_new(parent, last, v), 0);
    } else {
        assert_int_equal(json_object_del(parent, last), 0);
    }
}

static json_t *get_path(json_t *root, const char *path)
{
    char last[64];
    json_t *parent = walk(root, path, last, sizeof last);
    json_t *v = json_is_array(parent) ? json_array_get(parent, strtoul(last, NULL, 10)) : json_object_get(parent, last);
    assert_non_null(v);
    return v;
}

static void test_valid_fixture(void **state)
{
    (void)state;
    pi2_manifest *m;
    pi2_err e = { 0 };
    assert_int_equal(pi2_manifest_parse(g_text, g_len, NAME, &m, &e), 0);
    /* Index map the matrix below relies on. */
    assert_int_equal(m->tensors[9].role, PI2_T_GATE);
    assert_int_equal(m->tensors[11].role, PI2_T_DOWN);
    assert_int_equal(m->tensors[3].role, PI2_T_ATTN_NORM);
    assert_int_equal(m->tensors[12].role, PI2_T_ATTN_NORM);
    assert_int_equal(m->n_tensors, 21);
    assert_string_equal(m->sections[0].name, "tokenizer.json");
    pi2_manifest_free(m);
}

static void test_truncation(void **state)
{
    (void)state;
    const char *texts[] = { g_text, g_moe };
    size_t lens[] = { g_len, g_moe_len };
    for (int k = 0; k < 2; k++) {
        size_t len = lens[k];
        size_t end = len - 1; /* without the final newline the text is still whole */
        size_t step = end / 400 + 1;
        for (size_t cut = 0; cut < end; cut += (cut < 64 || cut + 64 > end) ? 1 : step) {
            char *copy = malloc(cut + 1);
            assert_non_null(copy);
            memcpy(copy, texts[k], cut);
            expect_text_error(copy, cut, PI2_EFORMAT, "not valid JSON");
            free(copy);
        }
        pi2_manifest *m;
        assert_int_equal(pi2_manifest_parse(texts[k], end, NAME, &m, NULL), 0);
        pi2_manifest_free(m);
    }
    expect_text_error("", 0, PI2_EFORMAT, "not valid JSON");
    expect_text_error("[]", 2, PI2_EFORMAT, "expected an object");
    expect_text_error("{}", PI2_MF_MAX_BYTES + 1ull, PI2_ERANGE, "bytes");
}

static bool skip_subtree(const char *path)
{
    return strcmp(path, "config") == 0 || strcmp(path, "bundle") == 0;
}

static bool optional_key(const char *key)
{
    return strcmp(key, "silu_threshold") == 0 || strcmp(key, "route_share") == 0 || strncmp(key, "ppl_", 4) == 0 ||
           strcmp(key, "input") == 0 || strcmp(key, "dtype") == 0; /* predictor: absent in older manifests */
}

/* Remove every required key of every object, one at a time. */
static int remove_each_key(json_t *root, json_t *node, const char *path)
{
    int n = 0;
    if (json_is_object(node)) {
        size_t nk = json_object_size(node);
        const char **keys = calloc(nk ? nk : 1, sizeof *keys);
        assert_non_null(keys);
        size_t i = 0;
        const char *k;
        json_t *v;
        json_object_foreach(node, k, v) keys[i++] = k;
        for (i = 0; i < nk; i++) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s%s%s", path, *path ? "." : "", keys[i]);
            char key[64];
            snprintf(key, sizeof key, "%s", keys[i]);
            json_t *val = json_incref(json_object_get(node, key));
            if (!optional_key(key)) {
                assert_int_equal(json_object_del(node, key), 0);
                expect_json_error(root, PI2_ENOTFOUND, key);
                n++;
                assert_int_equal(json_object_set(node, key, val), 0);
            }
            if (!skip_subtree(sub))
                n += remove_each_key(root, val, sub);
            json_decref(val);
        }
        free(keys);
    } else if (json_is_array(node)) {
        /* The first element stands for the rest. */
        if (json_array_size(node) > 0) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s.0", path);
            n += remove_each_key(root, json_array_get(node, 0), sub);
        }
    }
    return n;
}

static void test_remove_each_key(void **state)
{
    (void)state;
    json_t *r = load(g_text, g_len);
    int n = remove_each_key(r, r, "");
    assert_true(n > 60);
    json_decref(r);
    r = load(g_moe, g_moe_len);
    remove_each_key(r, r, "");
    json_decref(r);
}

/* Give every value (every node outside config and bundle) a wrong type. */
static int wrong_each_type(json_t *root, json_t *parent, const char *key, size_t idx, json_t *node,
                           const char *path)
{
    int n = 0;
    json_t *bad;
    switch (json_typeof(node)) {
    case JSON_STRING: bad = json_integer(7); break;
    case JSON_INTEGER: bad = json_real(1.5); break;
    case JSON_REAL: bad = json_string("0.5"); break;
    case JSON_TRUE:
    case JSON_FALSE: bad = json_integer(1); break;
    case JSON_NULL: bad = json_string("x"); break;
    default: bad = json_is_array(node) ? json_object() : json_array(); break;
    }
    if (parent) {
        json_incref(node);
        if (key)
            assert_int_equal(json_object_set_new(parent, key, bad), 0);
        else
            assert_int_equal(json_array_set_new(parent, idx, bad), 0);
        char needle[64];
        if (key)
            snprintf(needle, sizeof needle, "%s: expected", key);
        else
            snprintf(needle, sizeof needle, "[%zu]: expected", idx);
        expect_json_error(root, PI2_EFORMAT, needle);
        n++;
        if (key)
            assert_int_equal(json_object_set_new(parent, key, node), 0);
        else
            assert_int_equal(json_array_set_new(parent, idx, node), 0);
    } else {
        json_decref(bad);
    }
    if (skip_subtree(path))
        return n;
    if (json_is_object(node)) {
        const char *k;
        json_t *v;
        void *tmp;
        json_object_foreach_safe(node, tmp, k, v) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s%s%s", path, *path ? "." : "", k);
            n += wrong_each_type(root, node, k, 0, v, sub);
        }
    } else if (json_is_array(node) && json_array_size(node) > 0) {
        char sub[256];
        snprintf(sub, sizeof sub, "%s.0", path);
        n += wrong_each_type(root, node, NULL, 0, json_array_get(node, 0), sub);
    }
    return n;
}

static void test_wrong_types(void **state)
{
    (void)state;
    json_t *r = load(g_text, g_len);
    int n = wrong_each_type(r, NULL, NULL, 0, r, "");
    assert_true(n > 70);
    json_decref(r);
}

typedef struct edit {
    const char *path;
    const char *value; /* JSON text; NULL deletes the key */
    int code;
    const char *needle;
} edit;

/* Llama fixture: d 64, n_ff 128, 2 layers, 4 heads of 16, 2 kv heads,
 * vocab 96. tensors[9] gate L0, [10] up L0, [11] down L0 (transposed),
 * [3] attn_norm L0, [12] attn_norm L1, [1] out_norm; sections[0] is
 * tokenizer.json at 4096 (1234 bytes). */
static const edit k_edits[] = {
    { "format", "\"gguf\"", PI2_EFORMAT, "format: not a pi2 manifest" },
    { "version", "2", PI2_EUNSUPPORTED, "version 2 is not supported (this build reads version 1)" },
    { "version", "0", PI2_EUNSUPPORTED, "version" },
    { "kind", "\"merged\"", PI2_EUNSUPPORTED, "kind: unknown value \"merged\"" },
    { "created_by", "\"\"", PI2_EFORMAT, "created_by" },
    { "source", "\"a\\u0000b\"", PI2_EFORMAT, "not valid JSON" },
    { "source", "\"a\\nb\"", PI2_EFORMAT, "source" },
    { "extra", "1", PI2_EFORMAT, "extra: unknown key" },
    { "torch_dtype", "\"int8\"", PI2_EUNSUPPORTED, "torch_dtype" },
    { "config.hidden_size", NULL, PI2_ENOTFOUND, "hidden_size" },
    { "config.model_type", "\"gpt2\"", PI2_EUNSUPPORTED, "config" },
    { "config.intermediate_size", "100", PI2_ESHAPE, "rows" },
    { "quant.group", "64", PI2_EUNSUPPORTED, "quant.group" },
    { "quant.ffn", "\"q2\"", PI2_EUNSUPPORTED, "quant.ffn" },
    { "quant.ffn", "\"f32\"", PI2_EUNSUPPORTED, "quant.ffn" },
    { "quant.ffn", "\"q8\"", PI2_EFORMAT, "tensors[9].qtype" },
    { "quant.scales", "\"f32\"", PI2_EUNSUPPORTED, "quant.scales" },
    { "quant.x", "1", PI2_EFORMAT, "quant.x: unknown key" },
    { "tokenizer", "\"tok.json\"", PI2_ENOTFOUND, "tokenizer: member \"tok.json\" is not in sections" },
    { "tokenizer", "\"a b\"", PI2_EFORMAT, "not a valid member name" },
    /* sections */
    { "sections.0.sha256", "\"00\"", PI2_EFORMAT, "sections[0].sha256" },
    { "sections.0.sha256", "\"ABCDEF0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF0123456789\"", PI2_EFORMAT,
      "sha256: expected 64 lowercase hex digits" },
    { "sections.0.sha256", "\"zbcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789\"", PI2_EFORMAT,
      "sha256" },
    { "sections.0.size", "5000", PI2_EFORMAT, "sections[1].offset: 8192 overlaps sections[0]" },
    { "sections.1.offset", "8704", PI2_EFORMAT, "sections[1].offset: 8704 is not a multiple of 4096" },
    { "sections.1.offset", "4096", PI2_EFORMAT, "not sorted" },
    { "sections.0.offset", "-4096", PI2_ERANGE, "sections[0].offset" },
    { "sections.0.size", "8589934592", PI2_ERANGE, "sections[0].size" },
    { "sections.0.name", "\"manifest.json\"", PI2_EFORMAT, "must not be listed" },
    { "sections.0.name", "\"manifest.sig\"", PI2_EFORMAT, "must not be listed" },
    { "sections.0.name", "\"../x\"", PI2_EFORMAT, "sections[0].name: \"../x\" is not a valid member name" },
    { "sections.0.name", "\"/abs\"", PI2_EFORMAT, "not a valid member name" },
    { "sections.0.name", "\".pad/000001\"", PI2_EFORMAT, "not a valid member name" },
    { "sections.0.name", "\"a//b\"", PI2_EFORMAT, "not a valid member name" },
    { "sections.0.name", "\"x\\u0001\"", PI2_EFORMAT, "not a valid member name" },
    { "sections.0.name",
      "\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"",
      PI2_EFORMAT, "not a valid member name" },
    { "sections.0.name", "\"\"", PI2_EFORMAT, "sections[0].name: empty member name" },
    { "sections.0.extra", "1", PI2_EFORMAT, "sections[0].extra: unknown key" },
    { "sections.2.name", "\"tokenizer.json\"", PI2_EFORMAT, "duplicate section \"tokenizer.json\"" },
    /* tensors */
    { "tensors.9.rows", "129", PI2_ESHAPE, "tensors[9].rows: stored shape [129, 64]" },
    { "tensors.9.cols", "96", PI2_ESHAPE, "tensors[9].cols" },
    { "tensors.9.rows", "0", PI2_ERANGE, "tensors[9].rows" },
    { "tensors.9.rows", "1e3", PI2_EFORMAT, "tensors[9].rows: expected an integer" },
    { "tensors.11.transposed", "false", PI2_ESHAPE, "tensors[11].rows" },
    { "tensors.3.transposed", "true", PI2_EFORMAT, "tensors[3].transposed" },
    { "tensors.9.layer", "2", PI2_ERANGE, "tensors[9].layer: 2 is out of range [-1, 1]" },
    { "tensors.9.layer", "-1", PI2_ERANGE, "tensors[9].layer" },
    { "tensors.1.layer", "0", PI2_ERANGE, "tensors[1].layer: must be -1" },
    { "tensors.9.expert", "0", PI2_ERANGE, "tensors[9].expert" },
    { "tensors.9.role", "\"predictor\"", PI2_EUNSUPPORTED, "tensors[9].role: unknown value" },
    { "tensors.9.role", "\"router\"", PI2_EFORMAT, "router on a dense model" },
    { "tensors.9.qtype", "\"q8\"", PI2_EFORMAT, "tensors[9].qtype: q8, but quant.ffn is q4" },
    { "tensors.9.qtype", "\"bf16\"", PI2_EUNSUPPORTED, "tensors[9].qtype" },
    { "tensors.5.qtype", "\"q4\"", PI2_EFORMAT, "tensors[5].qtype" },
    { "tensors.1.scales", "\"tokenizer.json\"", PI2_EFORMAT, "tensors[1].scales: must be \"\"" },
    { "tensors.9.scales", "\"\"", PI2_EFORMAT, "tensors[9].scales" },
    { "tensors.9.payload", "\"nope.bin\"", PI2_ENOTFOUND, "tensors[9].payload: member \"nope.bin\" is not in sections" },
    { "tensors.9.payload", "\"tokenizer.json\"", PI2_ESHAPE, "tensors[9].payload: member \"tokenizer.json\" holds 1234" },
    { "tensors.9.scales", "\"tokenizer.json\"", PI2_ESHAPE, "tensors[9].scales" },
    { "tensors.9.name", "\"model.layers.0.mlp.up_proj.weight\"", PI2_EFORMAT, "duplicate tensor name" },
    { "tensors.9.name", "\"\"", PI2_EFORMAT, "tensors[9].name" },
    { "tensors.9.name", "\"a b\"", PI2_EFORMAT, "tensors[9].name" },
    { "tensors.12.layer", "0", PI2_EFORMAT, "duplicate tensor (role attn_norm, layer 0, expert -1)" },
    { "tensors.9.foo", "1", PI2_EFORMAT, "tensors[9].foo: unknown key" },
    { "tensors.9", "3", PI2_EFORMAT, "tensors[9]: expected an object" },
    /* sparsity */
    { "sparsity.mode", "\"magic\"", PI2_EUNSUPPORTED, "sparsity.mode" },
    { "sparsity.recall_target", "1.5", PI2_ERANGE, "sparsity.recall_target: 1.5 is out of range (0, 1]" },
    { "sparsity.recall_target", "0", PI2_ERANGE, "sparsity.recall_target" },
    { "sparsity.recall_target", "null", PI2_EFORMAT, "sparsity.recall_target: required" },
    { "sparsity.threshold_sparsity", "-0.5", PI2_ERANGE, "threshold_sparsity" },
    { "sparsity.mode", "\"threshold\"", PI2_EFORMAT, "threshold_sparsity: required" },
    { "sparsity.per_layer.0.layer", "2", PI2_ERANGE, "sparsity.per_layer[0].layer" },
    { "sparsity.per_layer.0.expert", "0", PI2_ERANGE, "sparsity.per_layer[0].expert" },
    { "sparsity.per_layer.1.layer", "0", PI2_EFORMAT, "sparsity.per_layer[1]: duplicate entry for layer 0" },
    { "sparsity.per_layer.0.predictor", "null", PI2_EFORMAT, "per_layer[0].predictor: required" },
    { "sparsity.per_layer.0.silu_threshold", "-1", PI2_ERANGE, "silu_threshold" },
    { "sparsity.per_layer.0.predictor.rank", "0", PI2_ERANGE, "predictor.rank" },
    { "sparsity.per_layer.0.predictor.threshold", "1e300", PI2_ERANGE, "predictor.threshold" },
    { "sparsity.per_layer.0.predictor.fc1", "\"gone\"", PI2_ENOTFOUND, "predictor.fc1: member \"gone\"" },
    { "sparsity.per_layer.0.predictor.report.recall", "1.01", PI2_ERANGE, "report.recall" },
    { "sparsity.per_layer.0.predictor.report.epochs", "-1", PI2_ERANGE, "report.epochs" },
    { "sparsity.per_layer.0.predictor.report.seconds", "-1", PI2_ERANGE, "report.seconds" },
    { "sparsity.per_layer.0.predictor.report.zzz", "1", PI2_EFORMAT, "report.zzz: unknown key" },
    { "sparsity.per_layer.0.predictor.input", "\"postnorm\"", PI2_EUNSUPPORTED, "predictor.input: unknown value" },
    { "sparsity.per_layer.0.predictor.input", "1", PI2_EFORMAT, "predictor.input: expected a string" },
    { "sparsity.per_layer.0.predictor.dtype", "\"q3\"", PI2_EUNSUPPORTED, "predictor.dtype: unknown value" },
    { "sparsity.per_layer.0.predictor.fc1_scales", "\"tokenizer.json\"", PI2_EFORMAT,
      "predictor.fc1_scales: only a q8 or q4 predictor has scales" },
    { "sparsity.per_layer.0.predictor.dtype", "\"q8\"", PI2_ENOTFOUND, "predictor.fc1_scales: required" },
    /* profile */
    { "profile.tokens", "-1", PI2_ERANGE, "profile.tokens: -1 is out of range (must be >= 0)" },
    { "profile.per_layer.0.active_frac", "-0.1", PI2_ERANGE, "profile.per_layer[0].active_frac" },
    { "profile.per_layer.0.top10_share", "1.5", PI2_ERANGE, "top10_share" },
    { "profile.per_layer.0.route_share", "0.5", PI2_EFORMAT, "route_share: on a dense model" },
    { "profile.per_layer.0.bit_samples", "2", PI2_EFORMAT, "profile.per_layer[0].bits: must be \"\"" },
    { "profile.per_layer.1.bits", "\"\"", PI2_EFORMAT, "profile.per_layer[1].bits" },
    { "profile.per_layer.1.bit_samples", "5", PI2_ESHAPE, "profile.per_layer[1].bits" },
    { "profile.per_layer.0.freq", "\"tokenizer.json\"", PI2_ESHAPE, "profile.per_layer[0].freq" },
    { "profile.per_layer.1.layer", "0", PI2_EFORMAT, "duplicate entry" },
    /* quality, bundle */
    { "quality.ppl_ref", "0", PI2_ERANGE, "quality.ppl_ref: 0 is out of range (must be > 0)" },
    { "quality.ppl_ref", "-3", PI2_ERANGE, "quality.ppl_ref" },
    { "quality.tokens", "1.0", PI2_EFORMAT, "quality.tokens" },
    { "bundle", "{}", PI2_EFORMAT, "bundle: must be null for kind converted" },
    { "kind", "\"bundled\"", PI2_EFORMAT, "bundle: required" },
};

static void test_edits(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof k_edits / sizeof k_edits[0]; i++) {
        const edit *ed = &k_edits[i];
        json_t *r = load(g_text, g_len);
        json_t *v = NULL;
        if (ed->value) {
            json_error_t je;
            v = json_loads(ed->value, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
            if (!v)
                fail_msg("edit %zu: bad test JSON %s", i, ed->value);
        }
        set_path(r, ed->path, v);
        expect_json_error(r, ed->code, ed->needle);
        json_decref(r);
    }
}

/* Edits that need more than one value changed. */
static void test_structural(void **state)
{
    (void)state;
    /* Too many tensors for the config: 3 + 2 * (9 + 3) = 27 allowed. */
    json_t *r = load(g_text, g_len);
    json_t *ts = get_path(r, "tensors");
    while (json_array_size(ts) < 28)
        json_array_append_new(ts, json_deep_copy(json_array_get(ts, 0)));
    expect_json_error(r, PI2_ERANGE, "tensors: 28 entries, at most 27");
    json_decref(r);

    /* Too many per-layer entries (2 layers). */
    r = load(g_text, g_len);
    json_t *pl = get_path(r, "sparsity.per_layer");
    json_array_append_new(pl, json_deep_copy(json_array_get(pl, 0)));
    expect_json_error(r, PI2_ERANGE, "sparsity.per_layer: 3 entries, at most 2");
    json_decref(r);

    /* Swapped sections. */
    r = load(g_text, g_len);
    json_t *ss = get_path(r, "sections");
    json_t *a = json_deep_copy(json_array_get(ss, 1)), *b = json_deep_copy(json_array_get(ss, 2));
    json_array_set_new(ss, 1, b);
    json_array_set_new(ss, 2, a);
    expect_json_error(r, PI2_EFORMAT, "sections[2].offset");
    json_decref(r);

    /* A tensor's payload section removed from the table. */
    r = load(g_text, g_len);
    ss = get_path(r, "sections");
    json_array_remove(ss, json_array_size(ss) - 1);
    expect_json_error(r, PI2_ENOTFOUND, "is not in sections");
    json_decref(r);

    /* Duplicate key in the text. */
    char *dup = malloc(g_len + 32);
    assert_non_null(dup);
    int n = snprintf(dup, g_len + 32, "{\"format\": \"pi2\",%s", g_text + 1);
    expect_text_error(dup, (size_t)n, PI2_EFORMAT, "not valid JSON");
    free(dup);

    /* Threshold mode: a missing silu_threshold. */
    pi2_manifest *m = make(cfg_silu(), PI2_MF_CONVERTED, PI2_MF_SPARSE_THRESHOLD);
    size_t len;
    char *t = to_json(m, &len);
    pi2_manifest_free(m);
    r = load(t, len);
    set_path(r, "sparsity.per_layer.1.silu_threshold", NULL);
    expect_json_error(r, PI2_ENOTFOUND, "sparsity.per_layer[1].silu_threshold: required for mode threshold");
    json_decref(r);
    free(t);

    /* Bundled with a null bundle. */
    m = make(cfg_bamboo(), PI2_MF_BUNDLED, PI2_MF_SPARSE_NONE);
    t = to_json(m, &len);
    pi2_manifest_free(m);
    r = load(t, len);
    set_path(r, "bundle", json_null());
    expect_json_error(r, PI2_EFORMAT, "bundle: required (an object) for kind bundled");
    json_decref(r);
    /* The bundle object is opaque: anything inside goes. */
    r = load(t, len);
    set_path(r, "bundle.anything", json_pack("{s:[i,i]}", "x", 1, 2));
    char *s = json_dumps(r, 0);
    pi2_manifest *p;
    assert_int_equal(pi2_manifest_parse(s, strlen(s), NAME, &p, NULL), 0);
    assert_non_null(strstr(p->bundle_json, "\"anything\":{\"x\":[1,2]}"));
    pi2_manifest_free(p);
    free(s);
    json_decref(r);
    free(t);
}

/* MoE specifics: expert ranges and the router. */
static void test_moe_edits(void **state)
{
    (void)state;
    pi2_manifest *m;
    assert_int_equal(pi2_manifest_parse(g_moe, g_moe_len, NAME, &m, NULL), 0);
    /* find indexes */
    size_t gate = 0, router = 0;
    for (size_t i = 0; i < m->n_tensors; i++) {
        if (m->tensors[i].role == PI2_T_GATE && m->tensors[i].layer == 0 && m->tensors[i].expert == 1)
            gate = i;
        if (m->tensors[i].role == PI2_T_ROUTER && m->tensors[i].layer == 1)
            router = i;
    }
    assert_true(gate > 0 && router > 0);
    pi2_manifest_free(m);

    char path[64];
    json_t *r = load(g_moe, g_moe_len);
    snprintf(path, sizeof path, "tensors.%zu.expert", gate);
    set_path(r, path, json_integer(-1));
    expect_json_error(r, PI2_ERANGE, "expert: must be in [0, 4)");
    json_decref(r);

    r = load(g_moe, g_moe_len);
    set_path(r, path, json_integer(4));
    expect_json_error(r, PI2_ERANGE, "expert: 4 is out of range [-1, 3]");
    json_decref(r);

    r = load(g_moe, g_moe_len);
    snprintf(path, sizeof path, "tensors.%zu.rows", router);
    set_path(r, path, json_integer(8));
    expect_json_error(r, PI2_ESHAPE, "role router is [4, 64]");
    json_decref(r);

    r = load(g_moe, g_moe_len);
    snprintf(path, sizeof path, "tensors.%zu.expert", router);
    set_path(r, path, json_integer(0));
    expect_json_error(r, PI2_ERANGE, "expert: must be -1 for role router");
    json_decref(r);

    r = load(g_moe, g_moe_len);
    set_path(r, "sparsity.per_layer.0.expert", json_integer(-1));
    expect_json_error(r, PI2_ERANGE, "sparsity.per_layer[0].expert");
    json_decref(r);

    r = load(g_moe, g_moe_len);
    set_path(r, "profile.per_layer.3.expert", json_integer(2));
    expect_json_error(r, PI2_EFORMAT, "profile.per_layer[3]: duplicate entry for layer 0, expert 2");
    json_decref(r);
}

/* Random byte edits: never a crash or leak, and whatever the reader accepts
 * the writer writes back (and reads again). */
static void test_fuzz(void **state)
{
    (void)state;
    static const char alphabet[] = "{}[]\":,0123456789-.eE truefalsnl\\x";
    pi2_rng rng;
    pi2_rng_seed(&rng, 42);
    int accepted = 0;
    for (int it = 0; it < 1000; it++) {
        const char *src = it % 2 ? g_moe : g_text;
        size_t len = it % 2 ? g_moe_len : g_len;
        char *t = malloc(len + 1);
        assert_non_null(t);
        memcpy(t, src, len + 1);
        int edits = 1 + (int)(pi2_rng_u64(&rng) % 3);
        for (int k = 0; k < edits; k++) {
            size_t at = (size_t)(pi2_rng_u64(&rng) % len);
            t[at] = alphabet[pi2_rng_u64(&rng) % (sizeof alphabet - 1)];
        }
        pi2_manifest *m = NULL;
        pi2_err e = { 0 };
        int rc = pi2_manifest_parse(t, len, NAME, &m, &e);
        if (rc == 0) {
            accepted++;
            size_t n;
            char *out = to_json(m, &n);
            pi2_manifest *m2;
            assert_int_equal(pi2_manifest_parse(out, n, NAME, &m2, NULL), 0);
            same_manifest(m, m2);
            pi2_manifest_free(m2);
            free(out);
        } else {
            assert_null(m);
            assert_true(rc < 0 && e.code == rc);
            assert_null(strchr(e.msg, '\n'));
        }
        pi2_manifest_free(m);
        free(t);
    }
    print_message("fuzz: %d of 1000 edits still valid\n", accepted);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_llama),
        cmocka_unit_test(test_round_trip_bamboo_bundled),
        cmocka_unit_test(test_round_trip_pred_quant),
        cmocka_unit_test(test_pred_quant_bad_scales),
        cmocka_unit_test(test_round_trip_silu_threshold),
        cmocka_unit_test(test_round_trip_moe),
        cmocka_unit_test(test_container_round_trip),
        cmocka_unit_test(test_api),
        cmocka_unit_test(test_to_json_refuses),
        cmocka_unit_test(test_valid_fixture),
        cmocka_unit_test(test_truncation),
        cmocka_unit_test(test_remove_each_key),
        cmocka_unit_test(test_wrong_types),
        cmocka_unit_test(test_edits),
        cmocka_unit_test(test_structural),
        cmocka_unit_test(test_moe_edits),
        cmocka_unit_test(test_fuzz),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
