/* pi2 execution planner: plans and the model's calibration as JSON files
 * (planner.h). */
#include "runtime/plan_internal.h"

#include "formats/jsonutil.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static bool cal_in(double sum_w, double sum_wk, double lo, double hi)
{
    return sum_w <= 0 || (sum_wk / sum_w >= lo * (1 - 1e-6) && sum_wk / sum_w <= hi * (1 + 1e-6));
}

int pi2_plan_cal_save(const pi2_plan_cal *c, const char *path, pi2_err *err)
{
    char buf[4096];
    int n = snprintf(buf, sizeof buf,
                     "{\"version\":6,\"extra_reads\":%.9g,\"runs\":%d,\"reads_sums\":[%.9g,%.9g],\"compute_sums\":[",
                     c->extra, c->runs, c->s_ex, c->n_ex);
    for (int i = 0; i < PI2_HW_MAX_THREADS; i++)
        n += snprintf(buf + n, sizeof buf - (size_t)n, "%s[%.9g,%.9g]", i ? "," : "", c->s_w[i], c->s_wk[i]);
    n += snprintf(buf + n, sizeof buf - (size_t)n, "],\"io_sums\":[");
    for (int i = 0; i < PI2_HW_MAX_THREADS; i++)
        n += snprintf(buf + n, sizeof buf - (size_t)n, "%s[%.9g,%.9g]", i ? "," : "", c->s_io_w[i], c->s_io_wk[i]);
    n += snprintf(buf + n, sizeof buf - (size_t)n, "]}\n");
    pi2_afile *f;
    int rc = pi2_afile_open(&f, path, err);
    if (rc)
        return rc;
    if ((rc = pi2_afile_write(f, buf, (size_t)n, err)) != 0) {
        pi2_afile_abort(f);
        return rc;
    }
    return pi2_afile_commit(f, err);
}

int pi2_plan_cal_load(const char *path, pi2_plan_cal *c, pi2_err *err)
{
    pi2_plan_cal_defaults(c);
    if (access(path, F_OK) != 0)
        return pi2_err_set(err, PI2_ENOTFOUND, "%s: no calibration yet", path);
    char *text;
    size_t len;
    int rc = pi2_read_file(path, 8192, &text, &len, err);
    if (rc)
        return rc;
    json_error_t je;
    json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    json_t *v = o ? json_object_get(o, "version") : NULL, *x = o ? json_object_get(o, "extra_reads") : NULL,
           *r = o ? json_object_get(o, "runs") : NULL, *rs = o ? json_object_get(o, "reads_sums") : NULL,
           *cs = o ? json_object_get(o, "compute_sums") : NULL, *is = o ? json_object_get(o, "io_sums") : NULL;
    bool ok = o && json_is_object(o) && json_object_size(o) == 6 && json_is_integer(v) &&
              json_integer_value(v) == 6 && json_is_number(x) && json_is_integer(r) && json_is_array(rs) &&
              json_array_size(rs) == 2;
    double ex[2], *sums[2][2] = { { c->s_w, c->s_wk }, { c->s_io_w, c->s_io_wk } };
    for (size_t i = 0; ok && i < 2; i++)
        ok = json_is_number(json_array_get(rs, i)) && (ex[i] = json_number_value(json_array_get(rs, i))) >= 0 &&
             isfinite(ex[i]);
    for (int s = 0; ok && s < 2; s++) { /* compute_sums, io_sums: [w, wk] per thread count */
        json_t *a = s == 0 ? cs : is;
        ok = json_is_array(a) && json_array_size(a) == PI2_HW_MAX_THREADS;
        for (size_t i = 0; ok && i < PI2_HW_MAX_THREADS; i++) {
            json_t *pair = json_array_get(a, i);
            ok = json_is_array(pair) && json_array_size(pair) == 2;
            for (size_t j = 0; ok && j < 2; j++)
                ok = json_is_number(json_array_get(pair, j)) &&
                     (sums[s][j][i] = json_number_value(json_array_get(pair, j))) >= 0 && isfinite(sums[s][j][i]);
        }
    }
    if (!ok)
        rc = pi2_err_set(err, PI2_EFORMAT, "%s: not a pi2 model calibration (version 6)", path);
    else if (!(json_number_value(x) >= 0 && json_number_value(x) < 1e7) || json_integer_value(r) < 0 ||
             json_integer_value(r) > 1000000)
        rc = pi2_err_set(err, PI2_ERANGE, "%s: calibration figures out of range", path);
    else {
        c->extra = json_number_value(x);
        c->runs = (int)json_integer_value(r);
        c->s_ex = ex[0];
        c->n_ex = ex[1];
        for (int i = 0; i < PI2_HW_MAX_THREADS; i++)
            if (!cal_in(c->s_w[i], c->s_wk[i], CAL_K_MIN, CAL_K_MAX) ||
                !cal_in(c->s_io_w[i], c->s_io_wk[i], CAL_F_MIN, CAL_F_MAX))
                rc = pi2_err_set(err, PI2_ERANGE, "%s: calibration figures out of range", path);
    }
    json_decref(o);
    if (rc)
        pi2_plan_cal_defaults(c);
    return rc;
}

/* ---- JSON ---- */

char *pi2_plan_json(const pi2_plan *p, const char *model)
{
    json_t *o = json_object(), *h = json_array(), *g = json_array(), *pr = json_object();
    if (!o || !h || !g || !pr) {
        json_decref(o);
        json_decref(h);
        json_decref(g);
        json_decref(pr);
        return NULL;
    }
    for (uint32_t i = 0; i < p->n_ffn; i++) {
        json_array_append_new(h, json_integer(p->hot_groups[i]));
        json_array_append_new(g, json_integer(p->gate_groups[i]));
    }
    const struct pi2_plan_pred *r = &p->pred;
    json_object_set_new(pr, "decode_tok_s", json_real(r->decode_tok_s));
    json_object_set_new(pr, "decode_ms", json_real(r->decode_ms));
    json_object_set_new(pr, "prefill_tok_s", json_real(r->prefill_tok_s));
    json_object_set_new(pr, "compute_ms", json_real(r->compute_ms));
    json_object_set_new(pr, "io_ms", json_real(r->io_ms));
    json_object_set_new(pr, "head_ms", json_real(r->head_ms));
    json_object_set_new(pr, "reads_per_token", json_real(r->reads_per_token));
    json_object_set_new(pr, "mb_per_token", json_real(r->mb_per_token));
    json_object_set_new(pr, "hit_rate", json_real(r->hit_rate));
    json_object_set_new(pr, "hot_mb", json_real(r->hot_mb));
    json_object_set_new(pr, "offloaded", json_real(r->offloaded));
    json_object_set_new(o, "version", json_integer(1));
    json_object_set_new(o, "model", json_string(model ? model : ""));
    json_object_set_new(o, "mem_limit", json_integer((json_int_t)p->mem_limit));
    json_object_set_new(o, "threads", json_integer(p->threads));
    json_object_set_new(o, "io_depth", json_integer(p->io_depth));
    json_object_set_new(o, "gate_first", json_boolean(p->gate_first));
    json_object_set_new(o, "hot_groups", h);
    json_object_set_new(o, "gate_groups", g);
    json_object_set_new(o, "predicted", pr);
    char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
    json_decref(o);
    return s;
}

int pi2_plan_save(const pi2_plan *p, const char *model, const char *path, pi2_err *err)
{
    char *s = pi2_plan_json(p, model);
    if (!s)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory writing the plan", path);
    pi2_afile *f;
    int rc = pi2_afile_open(&f, path, err);
    if (rc == 0) {
        rc = pi2_afile_write(f, s, strlen(s), err);
        if (rc == 0)
            rc = pi2_afile_write(f, "\n", 1, err);
        if (rc == 0)
            rc = pi2_afile_commit(f, err);
        else
            pi2_afile_abort(f);
    }
    free(s);
    return rc;
}

static int jfail(pi2_err *err, int code, const char *path, const char *key, const char *what)
{
    return pi2_err_set(err, code, "%s: plan.%s: %s", path, key, what);
}

static int jint_in(json_t *o, const char *key, long long lo, long long hi, long long *out, const char *path,
                   pi2_err *err)
{
    json_t *v = json_object_get(o, key);
    if (!v)
        return jfail(err, PI2_ENOTFOUND, path, key, "missing");
    if (!json_is_integer(v))
        return pi2_err_set(err, PI2_EFORMAT, "%s: plan.%s: %s, expected an integer", path, key,
                           pi2_json_type_name(v));
    long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return pi2_err_set(err, PI2_ERANGE, "%s: plan.%s: %lld is outside [%lld, %lld]", path, key, x, lo, hi);
    *out = x;
    return 0;
}

int pi2_plan_load(const char *path, pi2_plan *out, pi2_err *err)
{
    static const char *const keys[] = {"version",    "model",      "mem_limit",   "threads",   "io_depth", "gate_first",
                                       "hot_groups", "gate_groups", "predicted", "source",    "memory"};
    memset(out, 0, sizeof *out);
    char *text;
    size_t len;
    int rc = pi2_read_file(path, 1u << 24, &text, &len, err);
    if (rc)
        return rc;
    json_error_t je;
    json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!o)
        return pi2_err_set(err, PI2_EFORMAT, "%s: not a plan: %s (line %d)", path, je.text, je.line);
    if (!json_is_object(o)) {
        rc = pi2_err_set(err, PI2_EFORMAT, "%s: not a plan: %s, expected an object", path, pi2_json_type_name(o));
        json_decref(o);
        return rc;
    }
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v)
    {
        bool known = false;
        for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
            known = known || strcmp(k, keys[i]) == 0;
        if (!known) {
            rc = pi2_err_set(err, PI2_EFORMAT, "%s: plan: unknown key \"%s\"", path, k);
            json_decref(o);
            return rc;
        }
    }
    long long ver, ml, th, dp;
    json_t *h = json_object_get(o, "hot_groups"), *g = json_object_get(o, "gate_groups"),
           *gf = json_object_get(o, "gate_first");
    if ((rc = jint_in(o, "version", 1, 1, &ver, path, err)) ||
        (rc = jint_in(o, "mem_limit", 1, INT64_MAX, &ml, path, err)) ||
        (rc = jint_in(o, "threads", 1, 256, &th, path, err)) ||
        (rc = jint_in(o, "io_depth", 1, 4096, &dp, path, err))) {
        json_decref(o);
        return rc;
    }
    if (!gf || !json_is_boolean(gf))
        rc = jfail(err, gf ? PI2_EFORMAT : PI2_ENOTFOUND, path, "gate_first", gf ? "not a boolean" : "missing");
    else if (!h || !json_is_array(h))
        rc = jfail(err, h ? PI2_EFORMAT : PI2_ENOTFOUND, path, "hot_groups", h ? "not an array" : "missing");
    else if (!g || !json_is_array(g) || json_array_size(g) != json_array_size(h))
        rc = jfail(err, g ? PI2_ESHAPE : PI2_ENOTFOUND, path, "gate_groups",
                   g ? "not an array as long as hot_groups" : "missing");
    else if (json_array_size(h) == 0 || json_array_size(h) > (1u << 20))
        rc = jfail(err, PI2_ESHAPE, path, "hot_groups", "empty or too long");
    if (rc == 0 && (rc = pi2_plan_alloc(out, (uint32_t)json_array_size(h), err)) == 0) {
        out->mem_limit = (uint64_t)ml;
        out->threads = (int)th;
        out->io_depth = (int)dp;
        out->gate_first = json_is_true(gf);
        for (uint32_t i = 0; rc == 0 && i < out->n_ffn; i++) {
            json_t *a = json_array_get(h, i), *b = json_array_get(g, i);
            if (!json_is_integer(a) || !json_is_integer(b) || json_integer_value(a) < 0 ||
                json_integer_value(b) < json_integer_value(a) || json_integer_value(b) > UINT32_MAX)
                rc = pi2_err_set(err, PI2_ERANGE,
                                 "%s: plan.hot_groups[%u] / gate_groups[%u]: want integers 0 <= hot <= gate", path,
                                 i, i);
            else {
                out->hot_groups[i] = (uint32_t)json_integer_value(a);
                out->gate_groups[i] = (uint32_t)json_integer_value(b);
            }
        }
        json_t *pr = json_object_get(o, "predicted");
        if (rc == 0 && pr && json_is_object(pr)) {
            json_t *x;
            if ((x = json_object_get(pr, "decode_tok_s")) && json_is_number(x))
                out->pred.decode_tok_s = json_number_value(x);
            if ((x = json_object_get(pr, "decode_ms")) && json_is_number(x))
                out->pred.decode_ms = json_number_value(x);
            if ((x = json_object_get(pr, "prefill_tok_s")) && json_is_number(x))
                out->pred.prefill_tok_s = json_number_value(x);
        }
        if (rc)
            pi2_plan_free(out);
    }
    json_decref(o);
    return rc;
}
