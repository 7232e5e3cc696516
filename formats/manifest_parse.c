/* pi2 manifest reader: pi2_manifest_parse, the top level in order, and
 * the per-layer objects it reads here: sparsity (predictors or
 * thresholds), profile and quality, what the converter measured and
 * trained. See formats/manifest.h for the layout and the checks. */
#include "formats/manifest.h"
#include "formats/manifest_internal.h"
#include "formats/jsonread.h"
#include "formats/jsonutil.h"

#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- per-layer entries ---- */

/* layer and expert of a per-layer entry, and a once-only check via seen[]. */
static int get_layer_expert(pctx *c, json_t *e, const char *w, unsigned char *seen, int *layer, int *expert)
{
    const pi2_model_desc *d = &c->m->config;
    bool moe = pi2_desc_is_moe(d);
    int rc;
    if ((rc = pi2_jr_i32(&c->r, e, w, "layer", 0, d->n_layers - 1, layer)) ||
        (rc = pi2_jr_i32(&c->r, e, w, "expert", moe ? 0 : -1, moe ? d->n_experts - 1 : -1, expert)))
        return rc;
    size_t slot = (size_t)*layer * (size_t)(moe ? d->n_experts : 1) + (size_t)(moe ? *expert : 0);
    if (seen[slot])
        return fail(c, PI2_EFORMAT, w, NULL, "duplicate entry for layer %d, expert %d", *layer, *expert);
    seen[slot] = 1;
    return 0;
}

static size_t max_entries(const pi2_model_desc *d)
{
    return (size_t)d->n_layers * (size_t)(pi2_desc_is_moe(d) ? d->n_experts : 1);
}

static int parse_report(pctx *c, json_t *e, const char *w, pi2_pred_report *r)
{
    static const char *const keys[] = { "rank",       "threshold",     "recall",     "precision",
                                        "pred_active_frac", "true_active_frac", "bytes_f32", "bytes_q8",
                                        "n_eval",     "n_train",       "epochs",     "early_stopped",
                                        "best_epoch", "pos_weight",    "train_loss", "heldout_loss",
                                        "seconds" };
    uint64_t n_eval, n_train;
    int rc;
    if ((rc = PI2_JR_KEYS(&c->r, e, w, keys, false)) ||
        (rc = pi2_jr_i32(&c->r, e, w, "rank", 0, PI2_PRED_MAX_DIM, &r->rank)) ||
        (rc = pi2_jr_float(&c->r, e, w, "threshold", -FLT_MAX, FLT_MAX, &r->threshold)) ||
        (rc = pi2_jr_real(&c->r, e, w, "recall", 0, 1, PI2_JR_NULLABLE, &r->recall)) ||
        (rc = pi2_jr_real(&c->r, e, w, "precision", 0, 1, PI2_JR_NULLABLE, &r->precision)) ||
        (rc = pi2_jr_real(&c->r, e, w, "pred_active_frac", 0, 1, PI2_JR_NULLABLE, &r->pred_active_frac)) ||
        (rc = pi2_jr_real(&c->r, e, w, "true_active_frac", 0, 1, PI2_JR_NULLABLE, &r->true_active_frac)) ||
        (rc = pi2_jr_u64(&c->r, e, w, "bytes_f32", INT64_MAX, &r->bytes_f32)) ||
        (rc = pi2_jr_u64(&c->r, e, w, "bytes_q8", INT64_MAX, &r->bytes_q8)) ||
        (rc = pi2_jr_u64(&c->r, e, w, "n_eval", INT64_MAX, &n_eval)) ||
        (rc = pi2_jr_u64(&c->r, e, w, "n_train", INT64_MAX, &n_train)) ||
        (rc = pi2_jr_i32(&c->r, e, w, "epochs", 0, INT32_MAX, &r->epochs)) ||
        (rc = pi2_jr_bool(&c->r, e, w, "early_stopped", &r->early_stopped)) ||
        (rc = pi2_jr_i32(&c->r, e, w, "best_epoch", 0, INT32_MAX, &r->best_epoch)) ||
        (rc = pi2_jr_real(&c->r, e, w, "pos_weight", 0, DBL_MAX, PI2_JR_NULLABLE, &r->pos_weight)) ||
        (rc = pi2_jr_real(&c->r, e, w, "train_loss", 0, DBL_MAX, PI2_JR_NULLABLE, &r->train_loss)) ||
        (rc = pi2_jr_real(&c->r, e, w, "heldout_loss", 0, DBL_MAX, PI2_JR_NULLABLE, &r->heldout_loss)) ||
        (rc = pi2_jr_real(&c->r, e, w, "seconds", 0, DBL_MAX, PI2_JR_NULLABLE, &r->seconds)))
        return rc;
    r->n_eval = (size_t)n_eval;
    r->n_train = (size_t)n_train;
    return 0;
}

/* The scales keys of a q8/q4 predictor (refused for f32/f16) and, in a
 * converted container, the four members' sizes. */
static int parse_pred_scales(pctx *c, json_t *e, const char *w, pi2_mf_predictor *p)
{
    pi2_qtype qt = pi2_mf_pred_qtype(p->dtype);
    static const char *const sk[2] = { "fc1_scales", "fc2_scales" };
    char *dst[2] = { p->fc1_scales, p->fc2_scales };
    if (qt == PI2_QT_F32) {
        for (int k = 0; k < 2; k++)
            if (json_object_get(e, sk[k]))
                return fail(c, PI2_EFORMAT, w, sk[k], "only a q8 or q4 predictor has scales");
        return 0;
    }
    const pi2_ctr_section *sec[2];
    int rc;
    for (int k = 0; k < 2; k++)
        if ((rc = mf_get_member(c, e, w, sk[k], false, true, dst[k], &sec[k])))
            return rc;
    if (c->m->kind != PI2_MF_CONVERTED)
        return 0; /* the bundle reader checks its own layout */
    int64_t R = p->rank, Rp = (R + PI2_Q_GROUP - 1) / PI2_Q_GROUP * PI2_Q_GROUP, D = c->m->config.hidden,
            N = c->m->config.n_ff, cols[2] = { D, Rp }, rows[2] = { R, N };
    const char *names[2] = { p->fc1, p->fc2 };
    for (int k = 0; k < 2; k++) {
        uint64_t pb = (uint64_t)rows[k] * pi2_q_payload_row_bytes(qt, cols[k]),
                 sb = (uint64_t)rows[k] * pi2_q_scale_row_count(qt, cols[k]) * 2;
        const pi2_ctr_section *ps = mf_lookup(c, names[k]);
        if (ps && ps->size != pb)
            return fail(c, PI2_ESHAPE, w, k ? "fc2" : "fc1", "member \"%s\" holds %llu bytes, expected %llu for %s [%lld, %lld]",
                        ps->name, (unsigned long long)ps->size, (unsigned long long)pb, pi2_q_type_name(qt),
                        (long long)rows[k], (long long)cols[k]);
        if (sec[k]->size != sb)
            return fail(c, PI2_ESHAPE, w, sk[k], "member \"%s\" holds %llu bytes, expected %llu for %s [%lld, %lld]",
                        sec[k]->name, (unsigned long long)sec[k]->size, (unsigned long long)sb, pi2_q_type_name(qt),
                        (long long)rows[k], (long long)cols[k]);
    }
    return 0;
}

static int parse_predictor(pctx *c, json_t *e, const char *w, pi2_mf_predictor *p)
{
    static const char *const keys[] = { "rank",       "threshold",  "imported", "input", "dtype", "fc1", "fc2",
                                        "fc1_scales", "fc2_scales", "report" };
    static const char *const inputs[] = { "normed", "prenorm" };
    char wr[120];
    json_t *rep;
    int rc, in = PI2_PRED_IN_NORMED, dt = PI2_MF_PRED_F32;
    if ((rc = PI2_JR_KEYS(&c->r, e, w, keys, false)) ||
        (rc = pi2_jr_i32(&c->r, e, w, "rank", 1, PI2_PRED_MAX_DIM, &p->rank)) ||
        (rc = pi2_jr_float(&c->r, e, w, "threshold", -FLT_MAX, FLT_MAX, &p->threshold)) ||
        (rc = pi2_jr_bool(&c->r, e, w, "imported", &p->imported)) ||
        (json_object_get(e, "input") &&
         (rc = pi2_jr_enum(&c->r, e, w, "input", inputs, 2, "normed or prenorm", &in))) ||
        (json_object_get(e, "dtype") &&
         (rc = pi2_jr_enum(&c->r, e, w, "dtype", mf_pred_dtypes, 4, "f32, f16, q8 or q4", &dt))) ||
        (rc = mf_get_member(c, e, w, "fc1", false, true, p->fc1, NULL)) ||
        (rc = mf_get_member(c, e, w, "fc2", false, true, p->fc2, NULL)) ||
        (rc = pi2_jr_obj(&c->r, e, w, "report", false, &rep)))
        return rc;
    p->input = (pi2_pred_input)in;
    p->dtype = (pi2_mf_pdtype)dt;
    if ((rc = parse_pred_scales(c, e, w, p)))
        return rc;
    snprintf(wr, sizeof wr, "%s.report", w);
    return parse_report(c, rep, wr, &p->report);
}

static int parse_sparsity(pctx *c, json_t *root)
{
    static const char *const keys[] = { "mode", "recall_target", "threshold_sparsity", "per_layer" };
    static const char *const lkeys[] = { "layer", "expert", "predictor", "silu_threshold" };
    static const char *const modes[] = { "none", "predictor", "threshold" };
    pi2_manifest *m = c->m;
    json_t *sp, *arr;
    size_t n;
    int mode, rc;
    const char *w = "sparsity";
    if ((rc = pi2_jr_obj(&c->r, root, "", "sparsity", false, &sp)) || (rc = PI2_JR_KEYS(&c->r, sp, w, keys, false)) ||
        (rc = pi2_jr_enum(&c->r, sp, w, "mode", modes, 3, "predictor, threshold or none", &mode)))
        return rc;
    m->sparsity_mode = (pi2_mf_mode)mode;
    bool pred = mode == PI2_MF_SPARSE_PREDICTOR, thr = mode == PI2_MF_SPARSE_THRESHOLD;
    if ((rc = pi2_jr_real(&c->r, sp, w, "recall_target", 0, 1, PI2_JR_LO_OPEN | PI2_JR_NULLABLE, &m->recall_target)) ||
        (rc = pi2_jr_real(&c->r, sp, w, "threshold_sparsity", 0, 1, PI2_JR_NULLABLE, &m->threshold_sparsity)))
        return rc;
    if (pred && isnan(m->recall_target))
        return fail(c, PI2_EFORMAT, w, "recall_target", "required (a number) for mode predictor");
    if (thr && isnan(m->threshold_sparsity))
        return fail(c, PI2_EFORMAT, w, "threshold_sparsity", "required (a number) for mode threshold");
    size_t max = max_entries(&m->config);
    if ((rc = pi2_jr_arr(&c->r, sp, w, "per_layer", max, &arr, &n)))
        return rc;
    m->layers = calloc(n ? n : 1, sizeof *m->layers);
    unsigned char *seen = calloc(max ? max : 1, 1);
    if (!m->layers || !seen) {
        free(seen);
        return fail(c, PI2_ENOMEM, w, "per_layer", "out of memory");
    }
    m->cap_layers = n;
    for (size_t i = 0; i < n && rc == 0; i++) {
        char lw[64], pw[80];
        snprintf(lw, sizeof lw, "sparsity.per_layer[%zu]", i);
        pi2_mf_layer *l = &m->layers[i];
        json_t *e, *p;
        if ((rc = pi2_jr_elem_obj(&c->r, arr, i, lw, &e)) || (rc = PI2_JR_KEYS(&c->r, e, lw, lkeys, false)) ||
            (rc = get_layer_expert(c, e, lw, seen, &l->layer, &l->expert)) ||
            (rc = pi2_jr_obj(&c->r, e, lw, "predictor", true, &p)))
            break;
        if (p) {
            snprintf(pw, sizeof pw, "%s.predictor", lw);
            if ((rc = parse_predictor(c, p, pw, &l->predictor)))
                break;
            l->has_predictor = true;
        } else if (pred) {
            rc = fail(c, PI2_EFORMAT, lw, "predictor", "required (an object) for mode predictor");
            break;
        }
        double st;
        if ((rc = pi2_jr_real(&c->r, e, lw, "silu_threshold", 0, FLT_MAX, PI2_JR_NULLABLE | PI2_JR_OPTIONAL, &st)))
            break;
        l->has_silu_threshold = !isnan(st);
        l->silu_threshold = l->has_silu_threshold ? (float)st : 0.0f;
        if (thr && !l->has_silu_threshold) {
            rc = fail(c, PI2_ENOTFOUND, lw, "silu_threshold", "required for mode threshold");
            break;
        }
        m->n_layers = i + 1;
    }
    free(seen);
    return rc;
}

static int parse_profile(pctx *c, json_t *root)
{
    static const char *const keys[] = { "tokens", "per_layer" };
    static const char *const lkeys[] = { "layer",       "expert", "active_frac", "hot_share",
                                         "top10_share", "freq",   "bits",        "bit_samples",
                                         "bits_selected", "route_share" };
    pi2_manifest *m = c->m;
    const pi2_model_desc *d = &m->config;
    json_t *pr, *arr;
    size_t n;
    int rc;
    const char *w = "profile";
    size_t max = max_entries(d);
    if ((rc = pi2_jr_obj(&c->r, root, "", "profile", false, &pr)) || (rc = PI2_JR_KEYS(&c->r, pr, w, keys, false)) ||
        (rc = pi2_jr_u64(&c->r, pr, w, "tokens", INT64_MAX, &m->profile_tokens)) ||
        (rc = pi2_jr_arr(&c->r, pr, w, "per_layer", max, &arr, &n)))
        return rc;
    m->profile = calloc(n ? n : 1, sizeof *m->profile);
    unsigned char *seen = calloc(max ? max : 1, 1);
    if (!m->profile || !seen) {
        free(seen);
        return fail(c, PI2_ENOMEM, w, "per_layer", "out of memory");
    }
    m->cap_profile = n;
    uint64_t words = ((uint64_t)d->n_ff + 63) / 64;
    for (size_t i = 0; i < n && rc == 0; i++) {
        char lw[64];
        snprintf(lw, sizeof lw, "profile.per_layer[%zu]", i);
        pi2_mf_profile *p = &m->profile[i];
        json_t *e;
        const pi2_ctr_section *fs, *bs;
        if ((rc = pi2_jr_elem_obj(&c->r, arr, i, lw, &e)) || (rc = PI2_JR_KEYS(&c->r, e, lw, lkeys, false)) ||
            (rc = get_layer_expert(c, e, lw, seen, &p->layer, &p->expert)) ||
            (rc = pi2_jr_real(&c->r, e, lw, "active_frac", 0, 1, 0, &p->active_frac)) ||
            (rc = pi2_jr_real(&c->r, e, lw, "hot_share", 0, 1, 0, &p->hot_share)) ||
            (rc = pi2_jr_real(&c->r, e, lw, "top10_share", 0, 1, 0, &p->top10_share)) ||
            (rc = mf_get_member(c, e, lw, "freq", false, true, p->freq, &fs)) ||
            (rc = pi2_jr_u64(&c->r, e, lw, "bit_samples", INT64_MAX, &p->bit_samples)) ||
            (rc = mf_get_member(c, e, lw, "bits", true, true, p->bits, &bs)))
            break;
        p->bits_selected = false;
        if (json_object_get(e, "bits_selected") && (rc = pi2_jr_bool(&c->r, e, lw, "bits_selected", &p->bits_selected)))
            break;
        p->route_share = NAN;
        if (json_object_get(e, "route_share")) {
            if (p->expert < 0) {
                rc = fail(c, PI2_EFORMAT, lw, "route_share", "on a dense model");
                break;
            }
            if ((rc = pi2_jr_real(&c->r, e, lw, "route_share", 0, 1, 0, &p->route_share)))
                break;
        }
        if (fs->size != (uint64_t)d->n_ff * 4) {
            rc = fail(c, PI2_ESHAPE, lw, "freq", "member \"%s\" holds %llu bytes, expected %llu (float32 [%d])",
                      fs->name, (unsigned long long)fs->size, (unsigned long long)d->n_ff * 4, d->n_ff);
            break;
        }
        if ((p->bit_samples == 0) != (p->bits[0] == 0)) {
            rc = fail(c, PI2_EFORMAT, lw, "bits", "must be \"\" exactly when bit_samples is 0");
            break;
        }
        uint64_t want;
        if (bs && (__builtin_mul_overflow(p->bit_samples, words * 8, &want) || bs->size != want)) {
            rc = fail(c, PI2_ESHAPE, lw, "bits", "member \"%s\" holds %llu bytes, not %llu samples of %llu words",
                      bs->name, (unsigned long long)bs->size, (unsigned long long)p->bit_samples,
                      (unsigned long long)words);
            break;
        }
        m->n_profile = i + 1;
    }
    free(seen);
    return rc;
}

static int parse_quality(pctx *c, json_t *root)
{
    static const char *const keys[] = { "tokens", "ppl_ref", "ppl_q_dense", "ppl_q_sparse" };
    pi2_manifest *m = c->m;
    json_t *q;
    const char *w = "quality";
    int rc;
    if ((rc = pi2_jr_obj(&c->r, root, "", "quality", false, &q)) || (rc = PI2_JR_KEYS(&c->r, q, w, keys, false)) ||
        (rc = pi2_jr_u64(&c->r, q, w, "tokens", INT64_MAX, &m->quality_tokens)) ||
        (rc = pi2_jr_real(&c->r, q, w, "ppl_ref", 0, DBL_MAX, PI2_JR_LO_OPEN | PI2_JR_NULLABLE | PI2_JR_OPTIONAL,
                          &m->ppl_ref)) ||
        (rc = pi2_jr_real(&c->r, q, w, "ppl_q_dense", 0, DBL_MAX, PI2_JR_LO_OPEN | PI2_JR_NULLABLE | PI2_JR_OPTIONAL,
                          &m->ppl_q_dense)) ||
        (rc = pi2_jr_real(&c->r, q, w, "ppl_q_sparse", 0, DBL_MAX, PI2_JR_LO_OPEN | PI2_JR_NULLABLE | PI2_JR_OPTIONAL,
                          &m->ppl_q_sparse)))
        return rc;
    return 0;
}

static int parse_root(pctx *c, json_t *root)
{
    static const char *const keys[] = { "format",   "version",   "kind",    "created_by", "source",
                                        "config",   "torch_dtype", "quant", "tokenizer",  "chat_template", "tensors",
                                        "sparsity", "profile",   "quality", "bundle",     "sections" };
    static const char *const kinds[] = { "converted", "bundled" };
    pi2_manifest *m = c->m;
    int rc, ival;
    long long version;
    const char *s;
    if (!json_is_object(root))
        return fail(c, PI2_EFORMAT, "", "top level", "expected an object, got %s", pi2_json_type_name(root));
    if ((rc = pi2_jr_str(&c->r, root, "", "format", 16, &s)))
        return rc;
    if (strcmp(s, "pi2") != 0)
        return fail(c, PI2_EFORMAT, "", "format", "not a pi2 manifest (expected \"pi2\")");
    if ((rc = pi2_jr_int(&c->r, root, "", "version", INT64_MIN, INT64_MAX, &version)))
        return rc;
    if (version != PI2_MF_VERSION)
        return fail(c, PI2_EUNSUPPORTED, "", "version", "version %lld is not supported (this build reads version %d)",
                    version, PI2_MF_VERSION);
    if ((rc = PI2_JR_KEYS(&c->r, root, "", keys, false)) ||
        (rc = pi2_jr_enum(&c->r, root, "", "kind", kinds, 2, "converted or bundled", &ival)))
        return rc;
    m->kind = (pi2_mf_kind)ival;
    if ((rc = pi2_jr_text(&c->r, root, "", "created_by", m->created_by, sizeof m->created_by)) ||
        (rc = pi2_jr_text(&c->r, root, "", "source", m->source, sizeof m->source)) ||
        (rc = mf_parse_config(c, root)) || (rc = mf_parse_quant(c, root)) || (rc = mf_parse_sections(c, root)) ||
        (rc = mf_get_member(c, root, "", "tokenizer", false, true, m->tokenizer, NULL)) ||
        (json_object_get(root, "chat_template") &&
         (rc = mf_get_member(c, root, "", "chat_template", true, true, m->chat_template, NULL))) ||
        (rc = mf_parse_tensors(c, root)) || (rc = parse_sparsity(c, root)) || (rc = parse_profile(c, root)) ||
        (rc = parse_quality(c, root)))
        return rc;
    return mf_parse_bundle_obj(c, root);
}

int pi2_manifest_parse(const char *text, size_t len, const char *name, pi2_manifest **out, pi2_err *err)
{
    if (out)
        *out = NULL;
    if (!name)
        name = PI2_MF_NAME;
    if (!text || !out)
        return pi2_err_set(err, PI2_EINVAL, "%.200s: no input", name);
    if (len > PI2_MF_MAX_BYTES)
        return pi2_err_set(err, PI2_ERANGE, "%.200s: %zu bytes, more than the %u allowed", name, len,
                           PI2_MF_MAX_BYTES);
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        char buf[100];
        return pi2_err_set(err, PI2_EFORMAT, "%.200s: not valid JSON at line %d column %d: %s", name, je.line,
                           je.column, pi2_jr_clean(je.text, buf, sizeof buf));
    }
    pctx c = { .r = { name, err }, .m = pi2_manifest_new() };
    int rc = c.m ? parse_root(&c, root) : pi2_err_set(err, PI2_ENOMEM, "%.200s: out of memory", name);
    json_decref(root);
    free(c.by_name);
    if (rc) {
        pi2_manifest_free(c.m);
        return rc;
    }
    *out = c.m;
    return 0;
}
