/* pi2 execution planner: plans and the model's calibration as JSON files
 * (planner.h). */
#include "runtime/plan_internal.h"

#include "formats/jsonread.h"
#include "formats/jsonutil.h"

#include <float.h>
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

/* Array k of o holding exactly n entries. */
static int cal_arr(const pi2_jr *r, json_t *o, const char *w, const char *k, size_t n, json_t **out)
{
    size_t have;
    int rc = pi2_jr_arr(r, o, w, k, n, out, &have);
    if (rc == 0 && have != n)
        rc = pi2_jr_fail(r, PI2_ESHAPE, w, k, "%zu entries, expected %zu", have, n);
    return rc;
}

/* Element i of arr, a finite number >= 0; w names arr. */
static int cal_num(const pi2_jr *r, json_t *arr, const char *w, size_t i, double *out)
{
    char k[64];
    snprintf(k, sizeof k, "%s[%zu]", w, i);
    return pi2_jr_real_val(r, json_array_get(arr, i), k, NULL, 0, DBL_MAX, 0, out);
}

/* compute_sums or io_sums: [w, wk] per thread count into a[], b[]. */
static int cal_sums(const pi2_jr *r, json_t *o, const char *k, double *a, double *b)
{
    json_t *arr, *pair;
    int rc = cal_arr(r, o, "", k, PI2_HW_MAX_THREADS, &arr);
    for (size_t i = 0; rc == 0 && i < PI2_HW_MAX_THREADS; i++) {
        char w[40];
        snprintf(w, sizeof w, "%s[%zu]", k, i);
        pair = json_array_get(arr, i);
        if (!json_is_array(pair) || json_array_size(pair) != 2)
            rc = pi2_jr_fail(r, PI2_EFORMAT, w, NULL, "expected a [w, wk] pair of numbers");
        if (rc == 0)
            rc = cal_num(r, pair, w, 0, &a[i]);
        if (rc == 0)
            rc = cal_num(r, pair, w, 1, &b[i]);
    }
    return rc;
}

/* The members of calibration object o, checked; c is filled as it goes. */
static int cal_read(const pi2_jr *r, json_t *o, pi2_plan_cal *c)
{
    static const char *const keys[] = {"version", "extra_reads", "runs", "reads_sums", "compute_sums", "io_sums"};
    long long ver;
    json_t *rs;
    int rc;
    if ((rc = PI2_JR_KEYS(r, o, "", keys, true)) || (rc = pi2_jr_int(r, o, "", "version", 6, 6, &ver)) ||
        (rc = pi2_jr_real(r, o, "", "extra_reads", 0, 1e7, PI2_JR_HI_OPEN, &c->extra)) ||
        (rc = pi2_jr_i32(r, o, "", "runs", 0, 1000000, &c->runs)) ||
        (rc = cal_arr(r, o, "", "reads_sums", 2, &rs)) || (rc = cal_num(r, rs, "reads_sums", 0, &c->s_ex)) ||
        (rc = cal_num(r, rs, "reads_sums", 1, &c->n_ex)) ||
        (rc = cal_sums(r, o, "compute_sums", c->s_w, c->s_wk)) ||
        (rc = cal_sums(r, o, "io_sums", c->s_io_w, c->s_io_wk)))
        return rc;
    for (int i = 0; i < PI2_HW_MAX_THREADS; i++)
        if (!cal_in(c->s_w[i], c->s_wk[i], CAL_K_MIN, CAL_K_MAX) ||
            !cal_in(c->s_io_w[i], c->s_io_wk[i], CAL_F_MIN, CAL_F_MAX))
            return pi2_err_set(r->err, PI2_ERANGE, "%s: calibration figures out of range", r->file);
    return 0;
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
    if (!json_is_object(o))
        rc = pi2_err_set(err, PI2_EFORMAT, "%s: not a pi2 model calibration (version 6)", path);
    else
        rc = cal_read(&(pi2_jr){path, err}, o, c);
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
    if (r->decode_tok_s > 0) /* predicted with a hardware profile */
        json_object_set_new(o, "predicted", pr);
    else
        json_decref(pr);
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

/* The groups of FFN i: integers 0 <= hot <= gate <= UINT32_MAX. */
static int plan_group(const pi2_jr *r, json_t *h, json_t *g, uint32_t i, pi2_plan *out)
{
    json_t *a = json_array_get(h, i), *b = json_array_get(g, i);
    if (!json_is_integer(a) || !json_is_integer(b) || json_integer_value(a) < 0 ||
        json_integer_value(b) < json_integer_value(a) || json_integer_value(b) > UINT32_MAX) {
        char k[64];
        snprintf(k, sizeof k, "hot_groups[%u] / gate_groups[%u]", i, i);
        return pi2_jr_fail(r, PI2_ERANGE, "plan", k, "want integers 0 <= hot <= gate");
    }
    out->hot_groups[i] = (uint32_t)json_integer_value(a);
    out->gate_groups[i] = (uint32_t)json_integer_value(b);
    return 0;
}

/* hot_groups and gate_groups: arrays of one length, 1..2^20. */
static int plan_group_arrays(const pi2_jr *r, json_t *o, json_t **h, json_t **g, size_t *n)
{
    size_t ng;
    int rc = pi2_jr_arr(r, o, "plan", "hot_groups", SIZE_MAX, h, n);
    if (rc == 0)
        rc = pi2_jr_arr(r, o, "plan", "gate_groups", SIZE_MAX, g, &ng);
    if (rc == 0 && ng != *n)
        rc = pi2_jr_fail(r, PI2_ESHAPE, "plan", "gate_groups", "%zu entries, not as many as hot_groups (%zu)", ng,
                         *n);
    if (rc == 0 && (*n == 0 || *n > (1u << 20)))
        rc = pi2_jr_fail(r, PI2_ESHAPE, "plan", "hot_groups", "%zu entries: empty or too long", *n);
    return rc;
}

/* The optional "predicted" figures the plan was chosen by. */
static int plan_predicted(const pi2_jr *r, json_t *o, struct pi2_plan_pred *pred)
{
    static const char *const keys[] = {"decode_tok_s", "decode_ms", "prefill_tok_s"};
    double *dst[] = {&pred->decode_tok_s, &pred->decode_ms, &pred->prefill_tok_s};
    json_t *pr = json_object_get(o, "predicted");
    if (!pr)
        return 0;
    int rc = pi2_jr_obj(r, o, "plan", "predicted", false, &pr);
    for (size_t i = 0; rc == 0 && i < sizeof keys / sizeof *keys; i++) {
        double x;
        rc = pi2_jr_real(r, pr, "plan.predicted", keys[i], 0, DBL_MAX, PI2_JR_OPTIONAL, &x);
        if (rc == 0 && !isnan(x))
            *dst[i] = x;
    }
    return rc;
}

/* The members of the plan object o, checked (see planner.h). */
static int plan_read(const pi2_jr *r, json_t *o, pi2_plan *out)
{
    static const char *const keys[] = {"version",    "model",      "mem_limit",   "threads",   "io_depth", "gate_first",
                                       "hot_groups", "gate_groups", "predicted", "source",    "memory",   "note"};
    long long ver, ml;
    int th, dp;
    bool gf;
    json_t *h, *g;
    size_t n;
    int rc;
    if ((rc = PI2_JR_KEYS(r, o, "plan", keys, false)) || (rc = pi2_jr_int(r, o, "plan", "version", 1, 1, &ver)) ||
        (rc = pi2_jr_int(r, o, "plan", "mem_limit", 1, INT64_MAX, &ml)) ||
        (rc = pi2_jr_i32(r, o, "plan", "threads", 1, 256, &th)) ||
        (rc = pi2_jr_i32(r, o, "plan", "io_depth", 1, 4096, &dp)) ||
        (rc = pi2_jr_bool(r, o, "plan", "gate_first", &gf)) || (rc = plan_group_arrays(r, o, &h, &g, &n)) ||
        (rc = pi2_plan_alloc(out, (uint32_t)n, r->err)))
        return rc;
    out->mem_limit = (uint64_t)ml;
    out->threads = th;
    out->io_depth = dp;
    out->gate_first = gf;
    for (uint32_t i = 0; rc == 0 && i < out->n_ffn; i++)
        rc = plan_group(r, h, g, i, out);
    if (rc == 0)
        rc = plan_predicted(r, o, &out->pred);
    if (rc)
        pi2_plan_free(out);
    return rc;
}

int pi2_plan_load(const char *path, pi2_plan *out, pi2_err *err)
{
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
    if (!json_is_object(o))
        rc = pi2_err_set(err, PI2_EFORMAT, "%s: not a plan: %s, expected an object", path, pi2_json_type_name(o));
    else
        rc = plan_read(&(pi2_jr){path, err}, o, out);
    json_decref(o);
    return rc;
}
