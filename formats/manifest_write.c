/* pi2 manifest: the deterministic writer of manifest.json. See
 * formats/manifest.h for the layout and formats/manifest.c for the reader.
 *
 * Writing builds a jansson tree in a fixed key order and prints it with our
 * own emitter rather than json_dumps: we want the shortest round-trip form of
 * every real (0.95, not 0.94999999999999996) and small records on one line,
 * and the bytes must never depend on anything but the struct, because a
 * bundled manifest is signed over its exact bytes. The writer then parses its
 * own output, so the one set of checks lives in the reader. */
#include "formats/manifest.h"
#include "formats/jsonread.h"
#include "formats/jsonutil.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- writer ---- */


static void emit_string(pi2_sbuf *b, const char *s, size_t n)
{
    pi2_sb_put(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        char esc[8];
        if (ch == '"' || ch == '\\') {
            esc[0] = '\\';
            esc[1] = (char)ch;
            pi2_sb_put(b, esc, 2);
        } else if (ch == '\n') {
            pi2_sb_str(b, "\\n");
        } else if (ch == '\t') {
            pi2_sb_str(b, "\\t");
        } else if (ch < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", ch);
            pi2_sb_str(b, esc);
        } else {
            pi2_sb_put(b, (const char *)&s[i], 1);
        }
    }
    pi2_sb_put(b, "\"", 1);
}

static bool all_scalar(json_t *v)
{
    if (json_is_object(v)) {
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) {
            if (json_is_object(x) || json_is_array(x))
                return false;
        }
        return true;
    }
    size_t i;
    json_t *x;
    json_array_foreach(v, i, x) {
        if (json_is_object(x) || json_is_array(x))
            return false;
    }
    return true;
}

/* Two-space indent; objects and arrays of scalars below the top two levels
 * on one line. */
static void emit(pi2_sbuf *b, json_t *v, int depth)
{
    char num[40];
    switch (json_typeof(v)) {
    case JSON_OBJECT:
    case JSON_ARRAY: {
        bool obj = json_is_object(v);
        size_t n = obj ? json_object_size(v) : json_array_size(v);
        if (n == 0) {
            pi2_sb_str(b, obj ? "{}" : "[]");
            return;
        }
        bool inl = depth >= 2 && all_scalar(v);
        pi2_sb_str(b, obj ? "{" : "[");
        size_t i = 0;
        if (obj) {
            const char *k;
            json_t *x;
            json_object_foreach(v, k, x) {
                pi2_sb_str(b, i++ ? (inl ? ", " : ",") : "");
                if (!inl) {
                    pi2_sb_str(b, "\n");
                    pi2_sb_indent(b, depth + 1);
                }
                emit_string(b, k, strlen(k));
                pi2_sb_str(b, ": ");
                emit(b, x, depth + 1);
            }
        } else {
            json_t *x;
            size_t j;
            json_array_foreach(v, j, x) {
                pi2_sb_str(b, i++ ? (inl ? ", " : ",") : "");
                if (!inl) {
                    pi2_sb_str(b, "\n");
                    pi2_sb_indent(b, depth + 1);
                }
                emit(b, x, depth + 1);
            }
        }
        if (!inl) {
            pi2_sb_str(b, "\n");
            pi2_sb_indent(b, depth);
        }
        pi2_sb_str(b, obj ? "}" : "]");
        return;
    }
    case JSON_STRING: emit_string(b, json_string_value(v), json_string_length(v)); return;
    case JSON_INTEGER:
        snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        pi2_sb_str(b, num);
        return;
    case JSON_REAL:
        pi2_json_fmt_real(num, sizeof num, json_real_value(v));
        pi2_sb_str(b, num);
        return;
    case JSON_TRUE: pi2_sb_str(b, "true"); return;
    case JSON_FALSE: pi2_sb_str(b, "false"); return;
    case JSON_NULL: pi2_sb_str(b, "null"); return;
    }
}

/* Tree builder: the first value that cannot be made (not UTF-8, out of
 * memory) is remembered by key and the build fails. */
typedef struct jb {
    const char *bad;
} jb;

static json_t *put(jb *b, json_t *o, const char *k, json_t *v)
{
    /* json_object_set_new releases v when it fails (also for o == NULL). */
    if ((!v || json_object_set_new(o, k, v) != 0) && !b->bad)
        b->bad = k;
    return o;
}

static void push(jb *b, json_t *a, json_t *v, const char *what)
{
    if ((!v || json_array_append_new(a, v) != 0) && !b->bad)
        b->bad = what;
}

static json_t *jint(long long x) { return json_integer((json_int_t)x); }
static json_t *ju64(uint64_t x) { return json_integer(x > (uint64_t)INT64_MAX ? -1 : (json_int_t)x); }

static json_t *build_report(jb *b, const pi2_pred_report *r)
{
    json_t *o = json_object();
    put(b, o, "rank", jint(r->rank));
    put(b, o, "threshold", pi2_json_float(r->threshold));
    put(b, o, "recall", pi2_json_num(r->recall));
    put(b, o, "precision", pi2_json_num(r->precision));
    put(b, o, "pred_active_frac", pi2_json_num(r->pred_active_frac));
    put(b, o, "true_active_frac", pi2_json_num(r->true_active_frac));
    put(b, o, "bytes_f32", ju64(r->bytes_f32));
    put(b, o, "bytes_q8", ju64(r->bytes_q8));
    put(b, o, "n_eval", ju64(r->n_eval));
    put(b, o, "n_train", ju64(r->n_train));
    put(b, o, "epochs", jint(r->epochs));
    put(b, o, "early_stopped", json_boolean(r->early_stopped));
    put(b, o, "best_epoch", jint(r->best_epoch));
    put(b, o, "pos_weight", pi2_json_num(r->pos_weight));
    put(b, o, "train_loss", pi2_json_num(r->train_loss));
    put(b, o, "heldout_loss", pi2_json_num(r->heldout_loss));
    put(b, o, "seconds", pi2_json_num(r->seconds));
    return o;
}

static json_t *build_quant(jb *b, const pi2_manifest *m)
{
    json_t *q = json_object();
    put(b, q, "ffn", json_string(pi2_q_type_name(m->quant_ffn)));
    put(b, q, "other", json_string(pi2_q_type_name(m->quant_other)));
    put(b, q, "group", jint(PI2_Q_GROUP));
    put(b, q, "scales", json_string("f16"));
    return q;
}

static json_t *build_tensors(jb *b, const pi2_manifest *m)
{
    json_t *ts = json_array();
    for (size_t i = 0; i < m->n_tensors; i++) {
        const pi2_mf_tensor *t = &m->tensors[i];
        json_t *o = json_object();
        put(b, o, "name", json_string(t->name));
        put(b, o, "layer", jint(t->layer));
        put(b, o, "expert", jint(t->expert));
        put(b, o, "role", json_string(pi2_manifest_role_name(t->role)));
        put(b, o, "qtype", json_string(pi2_q_type_name(t->qtype)));
        put(b, o, "rows", jint(t->rows));
        put(b, o, "cols", jint(t->cols));
        put(b, o, "transposed", json_boolean(t->transposed));
        put(b, o, "payload", json_string(t->payload));
        put(b, o, "scales", json_string(t->scales));
        push(b, ts, o, "tensors");
    }
    return ts;
}

static json_t *build_predictor(jb *b, const pi2_mf_predictor *p)
{
    json_t *po = json_object();
    put(b, po, "rank", jint(p->rank));
    put(b, po, "threshold", pi2_json_float(p->threshold));
    put(b, po, "imported", json_boolean(p->imported));
    put(b, po, "input", json_string(pi2_pred_input_name(p->input)));
    put(b, po, "dtype", json_string(pi2_mf_pred_dtype_name(p->dtype)));
    put(b, po, "fc1", json_string(p->fc1));
    put(b, po, "fc2", json_string(p->fc2));
    if (pi2_mf_pred_qtype(p->dtype) != PI2_QT_F32) {
        put(b, po, "fc1_scales", json_string(p->fc1_scales));
        put(b, po, "fc2_scales", json_string(p->fc2_scales));
    }
    put(b, po, "report", build_report(b, &p->report));
    return po;
}

static json_t *build_sparsity(jb *b, const pi2_manifest *m)
{
    json_t *sp = json_object();
    put(b, sp, "mode", json_string(pi2_manifest_mode_name(m->sparsity_mode)));
    put(b, sp, "recall_target", pi2_json_num(m->recall_target));
    put(b, sp, "threshold_sparsity", pi2_json_num(m->threshold_sparsity));
    json_t *pl = json_array();
    for (size_t i = 0; i < m->n_layers; i++) {
        const pi2_mf_layer *l = &m->layers[i];
        json_t *o = json_object();
        put(b, o, "layer", jint(l->layer));
        put(b, o, "expert", jint(l->expert));
        put(b, o, "predictor", l->has_predictor ? build_predictor(b, &l->predictor) : json_null());
        if (l->has_silu_threshold)
            put(b, o, "silu_threshold", pi2_json_float(l->silu_threshold));
        push(b, pl, o, "sparsity.per_layer");
    }
    put(b, sp, "per_layer", pl);
    return sp;
}

static json_t *build_profile(jb *b, const pi2_manifest *m)
{
    json_t *pr = json_object();
    put(b, pr, "tokens", ju64(m->profile_tokens));
    json_t *ppl = json_array();
    for (size_t i = 0; i < m->n_profile; i++) {
        const pi2_mf_profile *p = &m->profile[i];
        json_t *o = json_object();
        put(b, o, "layer", jint(p->layer));
        put(b, o, "expert", jint(p->expert));
        put(b, o, "active_frac", pi2_json_num(p->active_frac));
        put(b, o, "hot_share", pi2_json_num(p->hot_share));
        put(b, o, "top10_share", pi2_json_num(p->top10_share));
        put(b, o, "freq", json_string(p->freq));
        put(b, o, "bits", json_string(p->bits));
        put(b, o, "bit_samples", ju64(p->bit_samples));
        if (p->bits_selected)
            put(b, o, "bits_selected", json_true());
        if (p->expert >= 0 && !isnan(p->route_share))
            put(b, o, "route_share", pi2_json_num(p->route_share));
        push(b, ppl, o, "profile.per_layer");
    }
    put(b, pr, "per_layer", ppl);
    return pr;
}

static json_t *build_quality(jb *b, const pi2_manifest *m)
{
    json_t *qu = json_object();
    put(b, qu, "tokens", ju64(m->quality_tokens));
    put(b, qu, "ppl_ref", pi2_json_num(m->ppl_ref));
    put(b, qu, "ppl_q_dense", pi2_json_num(m->ppl_q_dense));
    put(b, qu, "ppl_q_sparse", pi2_json_num(m->ppl_q_sparse));
    return qu;
}

static json_t *build_sections(jb *b, const pi2_manifest *m)
{
    json_t *ss = json_array();
    for (size_t i = 0; i < m->n_sections; i++) {
        const pi2_ctr_section *s = &m->sections[i];
        char hex[PI2_SHA256_HEX_LEN];
        pi2_sha256_hex(s->sha256, hex);
        json_t *o = json_object();
        put(b, o, "name", json_string(s->name));
        put(b, o, "offset", ju64(s->offset));
        put(b, o, "size", ju64(s->size));
        put(b, o, "sha256", json_string(hex));
        push(b, ss, o, "sections");
    }
    return ss;
}

/* The whole tree, in the fixed key order. */
static json_t *build(jb *b, const pi2_manifest *m, json_t *config, json_t *bundle)
{
    json_t *root = json_object();
    put(b, root, "format", json_string("pi2"));
    put(b, root, "version", jint(PI2_MF_VERSION));
    put(b, root, "kind", json_string(pi2_manifest_kind_name(m->kind)));
    put(b, root, "created_by", json_string(m->created_by));
    put(b, root, "source", json_string(m->source));
    put(b, root, "config", config);
    put(b, root, "torch_dtype", json_string(m->torch_dtype));
    put(b, root, "quant", build_quant(b, m));
    put(b, root, "tokenizer", json_string(m->tokenizer));
    if (m->chat_template[0])
        put(b, root, "chat_template", json_string(m->chat_template));
    put(b, root, "tensors", build_tensors(b, m));
    put(b, root, "sparsity", build_sparsity(b, m));
    put(b, root, "profile", build_profile(b, m));
    put(b, root, "quality", build_quality(b, m));
    put(b, root, "bundle", bundle ? bundle : json_null());
    put(b, root, "sections", build_sections(b, m));
    return root;
}

int pi2_manifest_to_json(const pi2_manifest *m, char **text, size_t *len, pi2_err *err)
{
    if (text)
        *text = NULL;
    if (len)
        *len = 0;
    if (!m || !text)
        return pi2_err_set(err, PI2_EINVAL, "manifest: NULL argument");

    char *ctext = NULL;
    size_t clen = 0;
    pi2_err sub = { 0 };
    int rc = pi2_config_format(&m->config, NULL, &ctext, &clen, &sub);
    if (rc)
        return pi2_err_set(err, rc, "manifest: config: %s", sub.msg);
    json_error_t je;
    json_t *config = json_loadb(ctext, clen, JSON_REJECT_DUPLICATES, &je);
    free(ctext);
    if (!config)
        return pi2_err_set(err, PI2_ENOMEM, "manifest: config: cannot re-read the formatted config: %s", je.text);

    json_t *bundle = NULL;
    if (m->bundle_json) {
        bundle = json_loads(m->bundle_json, JSON_REJECT_DUPLICATES, &je);
        if (!bundle || !json_is_object(bundle)) {
            char buf[100];
            json_decref(bundle);
            json_decref(config);
            return pi2_err_set(err, PI2_EINVAL, "manifest: bundle_json is not a JSON object%s%s",
                               bundle ? "" : ": ", bundle ? "" : pi2_jr_clean(je.text, buf, sizeof buf));
        }
    }

    jb b = { 0 };
    json_t *root = build(&b, m, config, bundle);
    if (b.bad || !root) {
        json_decref(root);
        return pi2_err_set(err, PI2_EINVAL, "manifest: %s: cannot encode (not UTF-8 text, or out of memory)",
                           b.bad ? b.bad : "top level");
    }
    pi2_sbuf s = { 0 };
    emit(&s, root, 0);
    pi2_sb_str(&s, "\n");
    json_decref(root);
    if (s.failed) {
        free(s.p);
        return pi2_err_set(err, PI2_ENOMEM, "manifest: out of memory");
    }
    /* Whatever we write must read back. */
    pi2_manifest *chk = NULL;
    rc = pi2_manifest_parse(s.p, s.len, "manifest", &chk, err);
    pi2_manifest_free(chk);
    if (rc) {
        free(s.p);
        return rc;
    }
    *text = s.p;
    if (len)
        *len = s.len;
    return 0;
}
