/* pi2 bundle layout: geometry, offsets, and the strict reader / writer of
 * the manifest's "bundle" object. See bundle/layout.h. */
#include "bundle/layout.h"
#include "formats/jsonread.h"
#include "formats/jsonutil.h"

#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const order_names[] = { "identity", "frequency", "coactivation" };

const char *pi2_bl_order_name(pi2_bl_order o)
{
    return (unsigned)o < 3 ? order_names[o] : "?";
}

static uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* ---- geometry ---- */

uint64_t pi2_bl_row_bytes(pi2_qtype q_ffn, int64_t hidden)
{
    if (q_ffn != PI2_QT_Q4 && q_ffn != PI2_QT_Q8)
        return 0;
    return pi2_q_payload_row_bytes(q_ffn, hidden) + 2 * pi2_q_scale_row_count(q_ffn, hidden);
}

/* The per-neuron units of a layout (bundle/layout.h): one-phase, the
 * bundle 3R and no gate unit; two-phase, the up+down bundle 2P and the gate
 * unit R + 2C. *read is the larger read of a neuron (what g * read <= U
 * bounds). */
static void units(uint64_t R, uint64_t P, bool two, uint64_t *bundle, uint64_t *gate, uint64_t *read)
{
    *bundle = two ? 2 * P : 3 * R;
    *gate = two ? R + 2 * (R - P) : 0;
    *read = *bundle > *gate ? *bundle : *gate;
}

int pi2_bl_geometry(const pi2_model_desc *d, pi2_qtype q_ffn, uint32_t io_unit, bool two_phase, pi2_bl_ffn *out,
                    pi2_err *err)
{
    memset(out, 0, sizeof *out);
    if (two_phase && d->act != PI2_ACT_DRELU)
        return pi2_err_set(err, PI2_EINVAL, "a two-phase layout is for drelu only (activation %s)",
                           pi2_act_name(d->act));
    if (io_unit < PI2_BL_IO_MIN || io_unit > PI2_BL_IO_MAX || (io_unit & (io_unit - 1)) != 0)
        return pi2_err_set(err, PI2_EINVAL, "I/O unit %u is not a power of two in [4K, 256K]", io_unit);
    if (q_ffn != PI2_QT_Q4 && q_ffn != PI2_QT_Q8)
        return pi2_err_set(err, PI2_EINVAL, "FFN quant %s cannot be bundled (q4 or q8)", pi2_q_type_name(q_ffn));
    if (d->n_ff < 1 || d->n_ff > PI2_CFG_MAX_DIM || d->hidden < 1 || d->hidden > PI2_CFG_MAX_DIM)
        return pi2_err_set(err, PI2_ERANGE, "model dimensions out of range (hidden %d, n_ff %d)", d->hidden,
                           d->n_ff);
    /* hidden, n_ff <= 2^20 and R <= 2 hidden: every product below fits 64 bits */
    uint64_t R = pi2_bl_row_bytes(q_ffn, d->hidden), P = pi2_q_payload_row_bytes(q_ffn, d->hidden), read;
    units(R, P, two_phase, &out->bundle_bytes, &out->gate_bytes, &read);
    uint64_t g = io_unit / read;
    if (g < 1)
        g = 1;
    if (g > (uint64_t)d->n_ff)
        g = (uint64_t)d->n_ff;
    out->neurons = (uint32_t)d->n_ff;
    out->group = (uint32_t)g;
    out->gate_part = round_up(g * out->gate_bytes, PI2_BL_ALIGN);
    out->slot_bytes = out->gate_part + round_up(g * out->bundle_bytes, PI2_BL_ALIGN);
    out->groups = (uint32_t)((d->n_ff + g - 1) / g);
    if ((uint64_t)out->groups * out->slot_bytes > PI2_CTR_MAX_SIZE)
        return pi2_err_set(err, PI2_ERANGE, "an FFN of %u groups of %llu bytes exceeds the container's member limit",
                           out->groups, (unsigned long long)out->slot_bytes);
    pi2_bl_set_hot(out, 0);
    out->read_eff = out->read_eff_freq = NAN;
    return 0;
}

uint32_t pi2_bl_auto_io_unit(const pi2_model_desc *d, pi2_qtype q_ffn, bool two_phase)
{
    uint32_t best = PI2_BL_IO_DEFAULT;
    double best_waste = INFINITY;
    for (uint32_t u = PI2_BL_IO_AUTO_MIN; u <= PI2_BL_IO_MAX; u *= 2) {
        pi2_bl_ffn f;
        pi2_err e;
        if (pi2_bl_geometry(d, q_ffn, u, two_phase, &f, &e))
            return PI2_BL_IO_DEFAULT; /* the same call reports the problem to the caller */
        if ((uint64_t)f.group * f.bundle_bytes > u || (uint64_t)f.group * f.gate_bytes > u)
            continue; /* rows wider than u: a read would exceed it */
        /* 3R a neuron either way (two-phase: R + 2C + 2P) */
        uint64_t used = (uint64_t)f.group * 3 * pi2_bl_row_bytes(q_ffn, d->hidden);
        double waste = 1.0 - (double)used / (double)f.slot_bytes;
        if (waste * PI2_BL_IO_AUTO_WASTE <= 1.0)
            return u;
        if (waste < best_waste) {
            best = u;
            best_waste = waste;
        }
    }
    return best;
}

void pi2_bl_set_hot(pi2_bl_ffn *f, uint32_t hot_groups)
{
    if (hot_groups > f->groups)
        hot_groups = f->groups;
    f->hot_groups = hot_groups;
    uint64_t hn = (uint64_t)hot_groups * f->group;
    f->hot_neurons = (uint32_t)(hn < f->neurons ? hn : f->neurons);
    f->hot_offset = 0;
    f->hot_size = (uint64_t)hot_groups * f->slot_bytes;
    f->cold_offset = f->hot_size;
    f->cold_size = (uint64_t)(f->groups - hot_groups) * f->slot_bytes;
}

void pi2_bl_neuron_rows(const pi2_bl_ffn *f, uint64_t row_bytes, uint64_t pay_bytes, bool two_phase, uint32_t i,
                        pi2_bl_rows *out)
{
    uint64_t R = row_bytes, P = pay_bytes, C = R - P;
    uint64_t k = i / f->group, j = i % f->group, base = k * f->slot_bytes;
    if (two_phase) {
        uint64_t gate = base + j * (R + 2 * C), ud = base + f->gate_part + j * 2 * P;
        *out = (pi2_bl_rows){ .pay = { gate, ud, ud + P }, .sc = { gate + P, gate + R, gate + R + C } };
    } else {
        uint64_t n = base + j * 3 * R;
        *out = (pi2_bl_rows){ .pay = { n, n + R, n + 2 * R }, .sc = { n + P, n + R + P, n + 2 * R + P } };
    }
}

int pi2_bl_check_perm(const uint32_t *perm, uint32_t n, const char *what, pi2_err *err)
{
    uint8_t *seen = calloc(n ? n : 1, 1);
    if (!seen)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", what);
    int rc = 0;
    for (uint32_t i = 0; i < n && rc == 0; i++) {
        uint32_t v = perm[i];
        if (v >= n)
            rc = pi2_err_set(err, PI2_EFORMAT, "%s: entry %u is %u, outside [0, %u)", what, i, v, n);
        else if (seen[v]++)
            rc = pi2_err_set(err, PI2_EFORMAT, "%s: entry %u repeats neuron %u (not a permutation)", what, i, v);
    }
    free(seen);
    return rc;
}

/* ---- lifetime ---- */

pi2_bundle_layout *pi2_bl_new(void)
{
    pi2_bundle_layout *l = calloc(1, sizeof *l);
    if (l)
        l->hot_min_freq = l->hot_share = NAN;
    return l;
}

void pi2_bl_free(pi2_bundle_layout *l)
{
    if (!l)
        return;
    free(l->resident);
    free(l->ffn);
    free(l);
}

/* Room for one more element of `elem` bytes in *arr holding n. */
static int grow(void **arr, size_t n, size_t elem, pi2_err *err)
{
    if (n >= PI2_CTR_MAX_MEMBERS)
        return pi2_err_set(err, PI2_ERANGE, "bundle layout: more than %u entries", PI2_CTR_MAX_MEMBERS);
    if (n & (n - 1)) /* grow at powers of two */
        return 0;
    size_t bytes;
    if (!pi2_mul_size(n ? 2 * n : 1, elem, &bytes))
        return pi2_err_set(err, PI2_ENOMEM, "bundle layout: out of memory");
    void *p = realloc(*arr, bytes);
    if (!p)
        return pi2_err_set(err, PI2_ENOMEM, "bundle layout: out of memory");
    *arr = p;
    return 0;
}

int pi2_bl_add_resident(pi2_bundle_layout *l, const char *name, pi2_err *err)
{
    if (!l || !name || strlen(name) >= PI2_CTR_NAME_MAX)
        return pi2_err_set(err, PI2_EINVAL, "bundle layout: bad resident name");
    void *p = l->resident;
    int rc = grow(&p, l->n_resident, sizeof *l->resident, err);
    l->resident = p;
    if (rc)
        return rc;
    memcpy(l->resident[l->n_resident++], name, strlen(name) + 1);
    return 0;
}

int pi2_bl_add_ffn(pi2_bundle_layout *l, const pi2_bl_ffn *f, pi2_err *err)
{
    if (!l || !f)
        return pi2_err_set(err, PI2_EINVAL, "bundle layout: NULL argument");
    void *p = l->ffn;
    int rc = grow(&p, l->n_ffn, sizeof *l->ffn, err);
    l->ffn = p;
    if (rc)
        return rc;
    l->ffn[l->n_ffn++] = *f;
    return 0;
}

const pi2_bl_ffn *pi2_bl_find(const pi2_bundle_layout *l, int layer, int expert)
{
    for (size_t i = 0; l && i < l->n_ffn; i++)
        if (l->ffn[i].layer == layer && l->ffn[i].expert == expert)
            return &l->ffn[i];
    return NULL;
}

/* ---- writer ---- */

static json_t *ju(uint64_t x) { return json_integer((json_int_t)x); }

static json_t *pair(uint64_t a, uint64_t b)
{
    json_t *p = json_array();
    json_array_append_new(p, ju(a));
    json_array_append_new(p, ju(b));
    return p;
}

int pi2_bl_to_json(const pi2_bundle_layout *l, char **text, pi2_err *err)
{
    *text = NULL;
    json_t *o = json_object(), *hr = json_object(), *res = json_array(), *ffn = json_array();
    bool ok = o && hr && res && ffn;
    if (ok) {
        /* the *_new setters take the reference even on failure; a NULL value
         * (allocation failure) makes them fail, which `ok` records */
        ok &= json_object_set_new(o, "version", json_integer(PI2_BL_VERSION)) == 0;
        ok &= json_object_set_new(o, "io_unit", ju(l->io_unit)) == 0;
        ok &= json_object_set_new(o, "align", ju(PI2_BL_ALIGN)) == 0;
        ok &= json_object_set_new(o, "row_bytes", ju(l->row_bytes)) == 0;
        ok &= json_object_set_new(o, "two_phase", json_boolean(l->two_phase)) == 0;
        ok &= json_object_set_new(hr, "min_freq", pi2_json_num(l->hot_min_freq)) == 0;
        ok &= json_object_set_new(hr, "share", pi2_json_num(l->hot_share)) == 0;
        ok &= json_object_set(o, "hot_rule", hr) == 0;
        ok &= json_object_set_new(o, "signer", json_string(l->signer)) == 0;
        for (size_t i = 0; ok && i < l->n_resident; i++)
            ok &= json_array_append_new(res, json_string(l->resident[i])) == 0;
        ok &= json_object_set(o, "resident", res) == 0;
        for (size_t i = 0; ok && i < l->n_ffn; i++) {
            const pi2_bl_ffn *f = &l->ffn[i];
            json_t *e = json_object();
            ok &= e != NULL;
            if (!ok)
                break;
            ok &= json_object_set_new(e, "layer", json_integer(f->layer)) == 0;
            ok &= json_object_set_new(e, "expert", json_integer(f->expert)) == 0;
            ok &= json_object_set_new(e, "ffn", json_string(f->ffn)) == 0;
            ok &= json_object_set_new(e, "perm", json_string(f->perm)) == 0;
            ok &= json_object_set_new(e, "order", json_string(pi2_bl_order_name(f->order))) == 0;
            ok &= json_object_set_new(e, "neurons", ju(f->neurons)) == 0;
            ok &= json_object_set_new(e, "group", ju(f->group)) == 0;
            ok &= json_object_set_new(e, "bundle_bytes", ju(f->bundle_bytes)) == 0;
            ok &= json_object_set_new(e, "gate_bytes", ju(f->gate_bytes)) == 0;
            ok &= json_object_set_new(e, "gate_part", ju(f->gate_part)) == 0;
            ok &= json_object_set_new(e, "slot_bytes", ju(f->slot_bytes)) == 0;
            ok &= json_object_set_new(e, "groups", ju(f->groups)) == 0;
            ok &= json_object_set_new(e, "hot_groups", ju(f->hot_groups)) == 0;
            ok &= json_object_set_new(e, "hot_neurons", ju(f->hot_neurons)) == 0;
            ok &= json_object_set_new(e, "hot", pair(f->hot_offset, f->hot_size)) == 0;
            ok &= json_object_set_new(e, "cold", pair(f->cold_offset, f->cold_size)) == 0;
            ok &= json_object_set_new(e, "read_efficiency", pi2_json_num(f->read_eff)) == 0;
            ok &= json_object_set_new(e, "read_efficiency_freq", pi2_json_num(f->read_eff_freq)) == 0;
            ok &= json_array_append_new(ffn, e) == 0;
        }
        ok &= json_object_set(o, "ffn", ffn) == 0;
    }
    char *s = ok ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(hr);
    json_decref(res);
    json_decref(ffn);
    json_decref(o);
    if (!s)
        return pi2_err_set(err, PI2_ENOMEM, "bundle layout: out of memory writing JSON");
    *text = s;
    return 0;
}

/* ---- reader ---- */

typedef struct lctx {
    pi2_jr r; /* names the manifest in messages */
    const pi2_manifest *mf;
    const pi2_ctr_section **by_name; /* sections sorted by name */
    size_t n;
} lctx;

/* "<name>: bundle.<where>: <message>", the form of the JSON reader's. */
__attribute__((format(printf, 4, 5))) static int fail(lctx *c, int code, const char *where, const char *fmt, ...)
{
    char msg[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return pi2_jr_fail(&c->r, code, "bundle", where, "%s", msg);
}

static int strcmp_ptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* name in the sorted array names[n]? */
static bool is_listed(const char **names, size_t n, const char *name)
{
    return n && bsearch(&name, names, n, sizeof *names, strcmp_ptr) != NULL;
}

static int cmp_sec_name(const void *a, const void *b)
{
    return strcmp((*(const pi2_ctr_section *const *)a)->name, (*(const pi2_ctr_section *const *)b)->name);
}

static const pi2_ctr_section *lookup(const lctx *c, const char *name)
{
    pi2_ctr_section key;
    const pi2_ctr_section *kp = &key;
    if (strlen(name) >= sizeof key.name)
        return NULL;
    memcpy(key.name, name, strlen(name) + 1);
    const pi2_ctr_section **hit =
        c->n ? bsearch(&kp, c->by_name, c->n, sizeof *c->by_name, cmp_sec_name) : NULL;
    return hit ? *hit : NULL;
}

/* A member name that must be listed in sections; *sec gets its section. */
static int get_member(lctx *c, json_t *o, const char *w, const char *k, char dst[PI2_CTR_NAME_MAX],
                      const pi2_ctr_section **sec)
{
    const char *s;
    int rc = pi2_jr_str(&c->r, o, w, k, PI2_CTR_NAME_MAX, &s);
    if (rc)
        return rc;
    const pi2_ctr_section *hit = lookup(c, s);
    if (!hit) {
        char buf[72];
        return pi2_jr_fail(&c->r, PI2_ENOTFOUND, w, k, "member \"%s\" is not in sections",
                           pi2_jr_clean(s, buf, sizeof buf));
    }
    memcpy(dst, s, strlen(s) + 1);
    *sec = hit;
    return 0;
}

/* [offset, size]: two integers in [0, PI2_CTR_MAX_SIZE]. */
static int get_pair(lctx *c, json_t *o, const char *w, const char *k, uint64_t *a, uint64_t *b)
{
    json_t *v;
    int rc = pi2_jr_need(&c->r, o, w, k, &v);
    if (rc)
        return rc;
    if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_integer(json_array_get(v, 0)) ||
        !json_is_integer(json_array_get(v, 1)))
        return pi2_jr_fail(&c->r, PI2_EFORMAT, w, k, "expected [offset, size] (two integers)");
    long long x = json_integer_value(json_array_get(v, 0)), y = json_integer_value(json_array_get(v, 1));
    if (x < 0 || y < 0 || (uint64_t)x > PI2_CTR_MAX_SIZE || (uint64_t)y > PI2_CTR_MAX_SIZE)
        return pi2_jr_fail(&c->r, PI2_ERANGE, w, k, "[%lld, %lld] is out of range", x, y);
    *a = (uint64_t)x;
    *b = (uint64_t)y;
    return 0;
}

/* Entry f's geometry against the model and io_unit, recomputed from its
 * group; fs and ps are its ffn and perm members, fw names it. */
static int check_ffn_geometry(lctx *c, const char *fw, const pi2_bundle_layout *l, const pi2_bl_ffn *f,
                              const pi2_ctr_section *fs, const pi2_ctr_section *ps)
{
    const pi2_model_desc *d = &c->mf->config;
    /* all values are < 2^20 * 2^21: no overflow */
    uint64_t g = f->group, per, gb, read;
    units(l->row_bytes, l->pay_bytes, l->two_phase, &per, &gb, &read);
    uint64_t gate = round_up(g * gb, PI2_BL_ALIGN);
    uint64_t slot = gate + round_up(g * per, PI2_BL_ALIGN);
    uint64_t groups = (f->neurons + g - 1) / g;
    if (f->neurons != (uint32_t)d->n_ff)
        return fail(c, PI2_ESHAPE, fw, "neurons %u, but the model's FFN has %d", f->neurons, d->n_ff);
    if (g > f->neurons)
        return fail(c, PI2_ESHAPE, fw, "group %u is larger than the FFN (%u neurons)", f->group, f->neurons);
    if (g > 1 && g * read > l->io_unit)
        return fail(c, PI2_ESHAPE, fw, "group %u: a read of %llu bytes exceeds io_unit %u", f->group,
                     (unsigned long long)(g * read), l->io_unit);
    if (f->bundle_bytes != per)
        return fail(c, PI2_ESHAPE, fw, "bundle_bytes %llu, expected %llu", (unsigned long long)f->bundle_bytes,
                     (unsigned long long)per);
    if (f->gate_bytes != gb)
        return fail(c, PI2_ESHAPE, fw, "gate_bytes %llu, expected %llu%s", (unsigned long long)f->gate_bytes,
                     (unsigned long long)gb, gb ? " (the gate row and the up and down scales)" : " (one-phase)");
    if (f->gate_part != gate)
        return fail(c, PI2_ESHAPE, fw, "gate_part %llu, expected %llu", (unsigned long long)f->gate_part,
                     (unsigned long long)gate);
    if (f->slot_bytes != slot)
        return fail(c, PI2_ESHAPE, fw, "slot_bytes %llu, expected %llu", (unsigned long long)f->slot_bytes,
                     (unsigned long long)slot);
    if (f->groups != groups)
        return fail(c, PI2_ESHAPE, fw, "groups %u, expected %llu", f->groups, (unsigned long long)groups);
    if (f->hot_groups > f->groups)
        return fail(c, PI2_ESHAPE, fw, "hot_groups %u exceeds groups %u", f->hot_groups, f->groups);
    uint64_t hn = (uint64_t)f->hot_groups * g;
    if (f->hot_neurons != (hn < f->neurons ? hn : f->neurons))
        return fail(c, PI2_ESHAPE, fw, "hot_neurons %u, expected %llu", f->hot_neurons,
                     (unsigned long long)(hn < f->neurons ? hn : f->neurons));
    uint64_t hs = (uint64_t)f->hot_groups * slot, total = groups * slot;
    if (f->hot_offset != 0 || f->hot_size != hs)
        return fail(c, PI2_ESHAPE, fw, "hot region [%llu, %llu], expected [0, %llu]",
                     (unsigned long long)f->hot_offset, (unsigned long long)f->hot_size, (unsigned long long)hs);
    if (f->cold_offset != hs || f->cold_size != total - hs)
        return fail(c, PI2_ESHAPE, fw, "cold region [%llu, %llu], expected [%llu, %llu]",
                     (unsigned long long)f->cold_offset, (unsigned long long)f->cold_size, (unsigned long long)hs,
                     (unsigned long long)(total - hs));
    if (fs->size != total)
        return fail(c, PI2_ESHAPE, fw, "member \"%s\" holds %llu bytes, expected %llu (%llu slots of %llu)",
                    fs->name, (unsigned long long)fs->size, (unsigned long long)total, (unsigned long long)groups,
                    (unsigned long long)slot);
    if (ps->size != (uint64_t)f->neurons * 4)
        return fail(c, PI2_ESHAPE, fw, "member \"%s\" holds %llu bytes, expected %llu (uint32 [%u])", ps->name,
                     (unsigned long long)ps->size, (unsigned long long)f->neurons * 4, f->neurons);
    if (fs == ps)
        return fail(c, PI2_EFORMAT, fw, "ffn and perm are the same member");
    return 0;
}

/* One "ffn" entry; (layer, expert) must be the idx-th of the model. */
static int parse_ffn(lctx *c, json_t *e, size_t idx, const pi2_bundle_layout *l, pi2_bl_ffn *f)
{
    static const char *const keys[] = { "layer",     "expert",       "ffn",         "perm",  "order",
                                        "neurons",   "group",        "bundle_bytes", "gate_bytes", "gate_part",
                                        "slot_bytes", "groups",      "hot_groups",  "hot_neurons",
                                        "hot",       "cold",         "read_efficiency", "read_efficiency_freq" };
    const pi2_model_desc *d = &c->mf->config;
    bool moe = pi2_desc_is_moe(d);
    int E = moe ? d->n_experts : 1;
    char fw[40], w[48]; /* "ffn[i]" for fail(), "bundle.ffn[i]" for the JSON reader */
    snprintf(fw, sizeof fw, "ffn[%zu]", idx);
    snprintf(w, sizeof w, "bundle.%s", fw);
    if (!json_is_object(e))
        return fail(c, PI2_EFORMAT, fw, "expected an object, got %s", pi2_json_type_name(e));
    int rc;
    if ((rc = PI2_JR_KEYS(&c->r, e, w, keys, false)) ||
        (rc = pi2_jr_i32(&c->r, e, w, "layer", 0, d->n_layers - 1, &f->layer)) ||
        (rc = pi2_jr_i32(&c->r, e, w, "expert", moe ? 0 : -1, moe ? d->n_experts - 1 : -1, &f->expert)))
        return rc;
    int want_l = (int)(idx / (size_t)E), want_e = moe ? (int)(idx % (size_t)E) : -1;
    if (f->layer != want_l || f->expert != want_e)
        return fail(c, PI2_EFORMAT, fw, "layer %d expert %d out of order (expected layer %d expert %d)", f->layer,
                     f->expert, want_l, want_e);
    const pi2_ctr_section *fs, *ps;
    int oi;
    if ((rc = get_member(c, e, w, "ffn", f->ffn, &fs)) || (rc = get_member(c, e, w, "perm", f->perm, &ps)) ||
        (rc = pi2_jr_enum(&c->r, e, w, "order", order_names, 3, "coactivation, frequency or identity", &oi)))
        return rc;
    f->order = (pi2_bl_order)oi;
    if ((rc = pi2_jr_u32(&c->r, e, w, "neurons", 1, PI2_CFG_MAX_DIM, &f->neurons)) ||
        (rc = pi2_jr_u32(&c->r, e, w, "group", 1, PI2_CFG_MAX_DIM, &f->group)) ||
        (rc = pi2_jr_u64(&c->r, e, w, "bundle_bytes", PI2_CTR_MAX_SIZE, &f->bundle_bytes)) ||
        (rc = pi2_jr_u64(&c->r, e, w, "gate_bytes", PI2_CTR_MAX_SIZE, &f->gate_bytes)) ||
        (rc = pi2_jr_u64(&c->r, e, w, "gate_part", PI2_CTR_MAX_SIZE, &f->gate_part)) ||
        (rc = pi2_jr_u64(&c->r, e, w, "slot_bytes", PI2_CTR_MAX_SIZE, &f->slot_bytes)) ||
        (rc = pi2_jr_u32(&c->r, e, w, "groups", 1, PI2_CFG_MAX_DIM, &f->groups)) ||
        (rc = pi2_jr_u32(&c->r, e, w, "hot_groups", 0, PI2_CFG_MAX_DIM, &f->hot_groups)) ||
        (rc = pi2_jr_u32(&c->r, e, w, "hot_neurons", 0, PI2_CFG_MAX_DIM, &f->hot_neurons)) ||
        (rc = get_pair(c, e, w, "hot", &f->hot_offset, &f->hot_size)) ||
        (rc = get_pair(c, e, w, "cold", &f->cold_offset, &f->cold_size)) ||
        (rc = pi2_jr_real(&c->r, e, w, "read_efficiency", 0, 1, PI2_JR_NULLABLE, &f->read_eff)) ||
        (rc = pi2_jr_real(&c->r, e, w, "read_efficiency_freq", 0, 1, PI2_JR_NULLABLE, &f->read_eff_freq)))
        return rc;
    return check_ffn_geometry(c, fw, l, f, fs, ps);
}


/* Sizes of every tensor's members, now that the ffn members are known. */
static int check_tensors(lctx *c, const pi2_bundle_layout *l)
{
    const pi2_manifest *m = c->mf;
    const pi2_model_desc *d = &m->config;
    for (size_t i = 0; i < m->n_tensors; i++) {
        const pi2_mf_tensor *t = &m->tensors[i];
        char w[64];
        snprintf(w, sizeof w, "tensors[%zu]", i);
        const pi2_ctr_section *ps = lookup(c, t->payload), *ss = t->scales[0] ? lookup(c, t->scales) : NULL;
        if (!ps || (t->scales[0] && !ss)) /* the manifest parser checked this; be safe */
            return fail(c, PI2_ENOTFOUND, w, "member of %s not in sections", t->name);
        bool ffn = t->role == PI2_T_GATE || t->role == PI2_T_UP || t->role == PI2_T_DOWN;
        /* rows, cols < 2^31, at most 4 bytes a value: fits 64 bits */
        uint64_t pb = (uint64_t)t->rows * pi2_q_payload_row_bytes(t->qtype, t->cols);
        uint64_t sb = (uint64_t)t->rows * pi2_q_scale_row_count(t->qtype, t->cols) * 2;
        if (ffn) {
            const pi2_bl_ffn *f = pi2_bl_find(l, t->layer, t->expert);
            if (!f)
                return fail(c, PI2_ENOTFOUND, w, "no ffn entry for layer %d expert %d", t->layer, t->expert);
            if (strcmp(t->payload, f->ffn) != 0)
                return fail(c, PI2_EFORMAT, w, "%s payload is \"%s\", not the FFN member \"%s\"", t->name,
                            t->payload, f->ffn);
            if (strcmp(t->scales, f->ffn) != 0)
                return fail(c, PI2_EFORMAT, w, "%s scales are \"%s\", not the FFN member \"%s\"", t->name,
                            t->scales, f->ffn);
            if (t->rows != d->n_ff || t->cols != d->hidden || t->transposed != (t->role == PI2_T_DOWN))
                return fail(c, PI2_ESHAPE, w, "%s is not stored as [n_ff, hidden] rows", t->name);
            continue; /* the slots hold payload and scales */
        } else if (ps->size != pb) {
            return fail(c, PI2_ESHAPE, w, "member \"%s\" holds %llu bytes, expected %llu", ps->name,
                        (unsigned long long)ps->size, (unsigned long long)pb);
        }
        if (ss && ss->size != sb)
            return fail(c, PI2_ESHAPE, w, "member \"%s\" holds %llu bytes, expected %llu", ss->name,
                        (unsigned long long)ss->size, (unsigned long long)sb);
        if (ss && lookup(c, t->payload) == ss)
            return fail(c, PI2_EFORMAT, w, "payload and scales are the same member");
    }
    for (size_t i = 0; i < m->n_layers; i++) {
        const pi2_mf_layer *e = &m->layers[i];
        if (!e->has_predictor)
            continue;
        char w[64];
        snprintf(w, sizeof w, "sparsity.per_layer[%zu]", i);
        const pi2_ctr_section *f1 = lookup(c, e->predictor.fc1), *f2 = lookup(c, e->predictor.fc2);
        uint64_t r = (uint64_t)e->predictor.rank, el = pi2_mf_pred_elem(e->predictor.dtype);
        if (!f1 || !f2)
            return fail(c, PI2_ENOTFOUND, w, "predictor member not in sections");
        pi2_qtype qt = pi2_mf_pred_qtype(e->predictor.dtype);
        if (qt != PI2_QT_F32) { /* the rows decode runs, fc2's padded to rank_p */
            const pi2_ctr_section *s1 = lookup(c, e->predictor.fc1_scales), *s2 = lookup(c, e->predictor.fc2_scales);
            uint64_t rp = (r + PI2_Q_GROUP - 1) / PI2_Q_GROUP * PI2_Q_GROUP, n = (uint64_t)d->n_ff;
            if (!s1 || !s2)
                return fail(c, PI2_ENOTFOUND, w, "predictor scales member not in sections");
            if (f1->size != r * pi2_q_payload_row_bytes(qt, d->hidden) ||
                f2->size != n * pi2_q_payload_row_bytes(qt, (int64_t)rp) ||
                s1->size != r * pi2_q_scale_row_count(qt, d->hidden) * 2 ||
                s2->size != n * pi2_q_scale_row_count(qt, (int64_t)rp) * 2)
                return fail(c, PI2_ESHAPE, w, "%s predictor members hold %llu, %llu, %llu and %llu bytes, not [%llu, %d] "
                            "and [%llu, %llu] rows", pi2_q_type_name(qt), (unsigned long long)f1->size,
                            (unsigned long long)f2->size, (unsigned long long)s1->size,
                            (unsigned long long)s2->size, (unsigned long long)r, d->hidden,
                            (unsigned long long)n, (unsigned long long)rp);
            continue;
        }
        if (f1->size != r * (uint64_t)d->hidden * el || f2->size != (uint64_t)d->n_ff * r * el)
            return fail(c, PI2_ESHAPE, w, "predictor members hold %llu and %llu bytes, expected %llu and %llu",
                        (unsigned long long)f1->size, (unsigned long long)f2->size,
                        (unsigned long long)(r * (uint64_t)d->hidden * el), (unsigned long long)(d->n_ff * r * el));
    }
    return 0;
}

/* ffn and perm members distinct across entries; "resident" exactly the
 * other sections, in section order. names: scratch of 2 * n_ffn + 1. */
static int check_members(lctx *c, json_t *root, pi2_bundle_layout *l, const char **names)
{
    const pi2_manifest *m = c->mf;
    size_t nf = l->n_ffn;
    for (size_t i = 0; i < nf; i++) {
        names[2 * i] = l->ffn[i].ffn;
        names[2 * i + 1] = l->ffn[i].perm;
    }
    qsort(names, 2 * nf, sizeof *names, strcmp_ptr);
    for (size_t i = 1; i < 2 * nf; i++)
        if (strcmp(names[i], names[i - 1]) == 0) {
            char buf[72];
            return fail(c, PI2_EFORMAT, "ffn", "member \"%s\" is used by two entries",
                        pi2_jr_clean(names[i], buf, sizeof buf));
        }
    /* the ffn members alone, sorted, to skip them below */
    for (size_t i = 0; i < nf; i++)
        names[i] = l->ffn[i].ffn;
    qsort(names, nf, sizeof *names, strcmp_ptr);

    json_t *res;
    size_t nr;
    int rc = pi2_jr_arr(&c->r, root, "bundle", "resident", SIZE_MAX, &res, &nr);
    if (rc)
        return rc;
    if (nr + nf != m->n_sections)
        return fail(c, PI2_ESHAPE, "resident", "%zu entries, expected %zu (every section but the %zu ffn members)", nr,
                    m->n_sections >= nf ? m->n_sections - nf : 0, nf);
    if (!(l->resident = calloc(nr ? nr : 1, sizeof *l->resident)))
        return fail(c, PI2_ENOMEM, "resident", "out of memory");
    size_t si = 0;
    for (size_t i = 0; i < nr; i++) {
        char w[40];
        snprintf(w, sizeof w, "resident[%zu]", i);
        json_t *s = json_array_get(res, i);
        if (!json_is_string(s) || strlen(json_string_value(s)) != json_string_length(s))
            return fail(c, PI2_EFORMAT, w, "expected a member name string, got %s", pi2_json_type_name(s));
        const char *nm = json_string_value(s);
        while (si < m->n_sections && is_listed(names, nf, m->sections[si].name))
            si++;
        if (si >= m->n_sections || strcmp(m->sections[si].name, nm) != 0) {
            char buf[72];
            return fail(c, PI2_EFORMAT, w, "\"%s\" is not the next non-FFN section (%s)",
                        pi2_jr_clean(nm, buf, sizeof buf),
                        si < m->n_sections ? m->sections[si].name : "none left");
        }
        memcpy(l->resident[i], nm, strlen(nm) + 1);
        l->n_resident = i + 1;
        si++;
    }
    return 0;
}

/* The ffn entries: one per (layer, expert), in order; then the members
 * they name against "resident" and the manifest's tensors. */
static int parse_ffn_entries(lctx *c, json_t *root, pi2_bundle_layout *l)
{
    const pi2_model_desc *d = &c->mf->config;
    int rc;
    json_t *arr;
    size_t na;
    int E = pi2_desc_is_moe(d) ? d->n_experts : 1;
    size_t nf = (size_t)d->n_layers * (size_t)E;
    if ((rc = pi2_jr_arr(&c->r, root, "bundle", "ffn", SIZE_MAX, &arr, &na)))
        return rc;
    if (na != nf)
        return fail(c, PI2_ESHAPE, "ffn", "%zu entries, expected %zu (one per layer and expert)", na, nf);
    if (!(l->ffn = calloc(nf ? nf : 1, sizeof *l->ffn)))
        return fail(c, PI2_ENOMEM, "ffn", "out of memory");
    for (size_t i = 0; i < nf; i++) {
        if ((rc = parse_ffn(c, json_array_get(arr, i), i, l, &l->ffn[i])))
            return rc;
        l->n_ffn = i + 1;
    }
    const char **names = pi2_malloc_array(2 * nf + 1, sizeof *names);
    if (!names)
        return fail(c, PI2_ENOMEM, "ffn", "out of memory");
    rc = check_members(c, root, l, names);
    free(names);
    return rc ? rc : check_tensors(c, l);
}

static int parse_root(lctx *c, json_t *root, pi2_bundle_layout *l)
{
    static const char *const keys[] = { "version", "io_unit", "align",    "row_bytes", "two_phase",
                                        "hot_rule", "signer", "resident", "ffn" };
    static const char *const hkeys[] = { "min_freq", "share" };
    const pi2_manifest *m = c->mf;
    const pi2_model_desc *d = &m->config;
    long long v;
    int rc;
    if (!json_is_object(root))
        return fail(c, PI2_EFORMAT, "", "expected an object, got %s", pi2_json_type_name(root));
    if ((rc = PI2_JR_KEYS(&c->r, root, "bundle", keys, false)) ||
        (rc = pi2_jr_int(&c->r, root, "bundle", "version", INT64_MIN, INT64_MAX, &v)))
        return rc;
    if (v == 1 || v == 2)
        return fail(c, PI2_EUNSUPPORTED, "version", "layout %lld (%s) is no longer read (this build reads %d, "
                    "two-phase up and down scales in the gate part): bundle the converted model again", v,
                    v == 1 ? "FFN scales resident" : "scales beside every row", PI2_BL_VERSION);
    if (v != PI2_BL_VERSION)
        return fail(c, PI2_EUNSUPPORTED, "version", "%lld is not supported (this build reads %d)", v, PI2_BL_VERSION);
    if ((rc = pi2_jr_u32(&c->r, root, "bundle", "io_unit", PI2_BL_IO_MIN, PI2_BL_IO_MAX, &l->io_unit)))
        return rc;
    if (l->io_unit & (l->io_unit - 1))
        return fail(c, PI2_ERANGE, "io_unit", "%u is not a power of two", l->io_unit);
    if ((rc = pi2_jr_int(&c->r, root, "bundle", "align", 0, INT32_MAX, &v)))
        return rc;
    if (v != PI2_BL_ALIGN)
        return fail(c, PI2_EUNSUPPORTED, "align", "%lld (this build uses %u)", v, PI2_BL_ALIGN);
    if ((rc = pi2_jr_u64(&c->r, root, "bundle", "row_bytes", PI2_CTR_MAX_SIZE, &l->row_bytes)))
        return rc;
    if (m->quant_ffn != PI2_QT_Q4 && m->quant_ffn != PI2_QT_Q8)
        return fail(c, PI2_EUNSUPPORTED, "row_bytes", "FFN quant %s cannot be bundled", pi2_q_type_name(m->quant_ffn));
    uint64_t R = pi2_bl_row_bytes(m->quant_ffn, d->hidden);
    l->pay_bytes = pi2_q_payload_row_bytes(m->quant_ffn, d->hidden);
    if (l->row_bytes != R)
        return fail(c, PI2_ESHAPE, "row_bytes", "%llu, expected %llu (%s rows of %d values and their scales)",
                    (unsigned long long)l->row_bytes, (unsigned long long)R, pi2_q_type_name(m->quant_ffn), d->hidden);
    if ((rc = pi2_jr_bool(&c->r, root, "bundle", "two_phase", &l->two_phase)))
        return rc;
    if (l->two_phase && d->act != PI2_ACT_DRELU)
        return fail(c, PI2_EFORMAT, "two_phase", "true for activation %s (two-phase is for drelu only)",
                    pi2_act_name(d->act));
    json_t *hr;
    if ((rc = pi2_jr_obj(&c->r, root, "bundle", "hot_rule", false, &hr)) ||
        (rc = PI2_JR_KEYS(&c->r, hr, "bundle.hot_rule", hkeys, false)) ||
        (rc = pi2_jr_real(&c->r, hr, "bundle.hot_rule", "min_freq", 0, 1, PI2_JR_NULLABLE, &l->hot_min_freq)) ||
        (rc = pi2_jr_real(&c->r, hr, "bundle.hot_rule", "share", 0, 1, PI2_JR_NULLABLE, &l->hot_share)))
        return rc;
    if (isnan(l->hot_min_freq) == isnan(l->hot_share))
        return fail(c, PI2_EFORMAT, "hot_rule", "exactly one of min_freq and share must be a number");
    const char *signer;
    if ((rc = pi2_jr_str(&c->r, root, "bundle", "signer", PI2_SHA256_HEX_LEN, &signer)))
        return rc;
    if (*signer) {
        size_t i = 0;
        while ((signer[i] >= '0' && signer[i] <= '9') || (signer[i] >= 'a' && signer[i] <= 'f'))
            i++;
        if (i != 64 || signer[i])
            return fail(c, PI2_EFORMAT, "signer", "expected \"\" or 64 lowercase hex digits");
    }
    memcpy(l->signer, signer, strlen(signer) + 1);

    return parse_ffn_entries(c, root, l);
}

int pi2_bundle_layout_parse(const pi2_manifest *mf, const char *name, pi2_bundle_layout **out, pi2_err *err)
{
    if (out)
        *out = NULL;
    if (!name)
        name = PI2_MF_NAME;
    if (!mf || !out)
        return pi2_err_set(err, PI2_EINVAL, "%.200s: bundle: no input", name);
    if (!mf->bundle_json)
        return pi2_err_set(err, PI2_EFORMAT, "%.200s: bundle: missing (not a bundled model)", name);
    size_t len = strlen(mf->bundle_json);
    if (len > PI2_BL_MAX_BYTES)
        return pi2_err_set(err, PI2_ERANGE, "%.200s: bundle: %zu bytes, more than the %u allowed", name, len,
                           PI2_BL_MAX_BYTES);
    json_error_t je;
    json_t *root = json_loadb(mf->bundle_json, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        char buf[100];
        return pi2_err_set(err, PI2_EFORMAT, "%.200s: bundle: not valid JSON: %s", name,
                           pi2_jr_clean(je.text, buf, sizeof buf));
    }
    lctx c = { .r = { name, err }, .mf = mf, .n = mf->n_sections };
    pi2_bundle_layout *l = pi2_bl_new();
    c.by_name = pi2_malloc_array(mf->n_sections ? mf->n_sections : 1, sizeof *c.by_name);
    int rc = 0;
    if (!l || !c.by_name)
        rc = pi2_err_set(err, PI2_ENOMEM, "%.200s: bundle: out of memory", name);
    if (rc == 0) {
        for (size_t i = 0; i < mf->n_sections; i++)
            c.by_name[i] = &mf->sections[i];
        qsort(c.by_name, c.n, sizeof *c.by_name, cmp_sec_name);
        rc = parse_root(&c, root, l);
    }
    json_decref(root);
    free(c.by_name);
    if (rc) {
        pi2_bl_free(l);
        return rc;
    }
    *out = l;
    return 0;
}
