/* pi2 manifest: the builder, the lookups, and the reader of its flat
 * objects (sections, tensors, config, quant, bundle; the entry and the
 * per-layer objects are formats/manifest_parse.c). See
 * formats/manifest.h for the layout and the checks; the writer, which parses
 * its own output with this reader, is formats/manifest_write.c. */
#include "formats/manifest.h"
#include "formats/manifest_internal.h"
#include "formats/jsonread.h"
#include "formats/jsonutil.h"

#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MF_MAX_ENTRIES ((size_t)1 << 22) /* cap of the growth helpers */

static const char *const role_names[] = { "embed", "out_norm", "lm_head", "attn_norm", "ffn_norm", "q", "k",
                                          "v",     "o",        "gate",    "up",        "down",     "router" };
#define N_ROLES (sizeof role_names / sizeof role_names[0])
static_assert(PI2_T_ROUTER + 1 == N_ROLES, "role table follows pi2_tname");

size_t pi2_mf_pred_elem(pi2_mf_pdtype dt) { return dt == PI2_MF_PRED_F16 ? 2 : dt == PI2_MF_PRED_F32 ? 4 : 0; }

pi2_qtype pi2_mf_pred_qtype(pi2_mf_pdtype dt)
{
    return dt == PI2_MF_PRED_Q8 ? PI2_QT_Q8 : dt == PI2_MF_PRED_Q4 ? PI2_QT_Q4 : PI2_QT_F32;
}

const char *const mf_pred_dtypes[] = { "f32", "f16", "q8", "q4" };

const char *pi2_mf_pred_dtype_name(pi2_mf_pdtype dt)
{
    return (unsigned)dt < 4 ? mf_pred_dtypes[dt] : "?";
}

const char *pi2_manifest_role_name(pi2_tname role)
{
    return (unsigned)role < N_ROLES ? role_names[role] : "?";
}

const char *pi2_manifest_kind_name(pi2_mf_kind kind)
{
    return kind == PI2_MF_CONVERTED ? "converted" : kind == PI2_MF_BUNDLED ? "bundled" : "?";
}

const char *pi2_manifest_mode_name(pi2_mf_mode mode)
{
    switch (mode) {
    case PI2_MF_SPARSE_NONE: return "none";
    case PI2_MF_SPARSE_PREDICTOR: return "predictor";
    case PI2_MF_SPARSE_THRESHOLD: return "threshold";
    }
    return "?";
}

/* ---- lifetime and growth ---- */

pi2_manifest *pi2_manifest_new(void)
{
    pi2_manifest *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->kind = PI2_MF_CONVERTED;
    m->quant_ffn = PI2_QT_Q4;
    m->quant_other = PI2_QT_Q8;
    m->sparsity_mode = PI2_MF_SPARSE_NONE;
    m->recall_target = NAN;
    m->threshold_sparsity = NAN;
    m->ppl_ref = m->ppl_q_dense = m->ppl_q_sparse = NAN;
    return m;
}

void pi2_manifest_free(pi2_manifest *m)
{
    if (!m)
        return;
    free(m->tensors);
    free(m->layers);
    free(m->profile);
    free(m->sections);
    free(m->bundle_json);
    free(m);
}

/* Make room for one more element; returns the (maybe moved) array or NULL
 * with *rc set. The array is unchanged on failure. */
static void *grow(void *arr, size_t n, size_t *cap, size_t elem, size_t max, const char *what, int *rc,
                  pi2_err *err)
{
    if (n >= max) {
        *rc = pi2_err_set(err, PI2_ERANGE, "manifest: more than %zu %s", max, what);
        return NULL;
    }
    if (n < *cap)
        return arr;
    size_t nc = *cap ? *cap * 2 : 16;
    if (nc > max)
        nc = max;
    size_t bytes;
    void *p = pi2_mul_size(nc, elem, &bytes) ? realloc(arr, bytes) : NULL;
    if (!p) {
        *rc = pi2_err_set(err, PI2_ENOMEM, "manifest: out of memory for %s", what);
        return NULL;
    }
    *cap = nc;
    return p;
}

#define APPEND(m, arr, n, cap, max, x, what)                                                       \
    do {                                                                                           \
        if (!(m) || !(x))                                                                          \
            return pi2_err_set(err, PI2_EINVAL, "manifest: NULL argument adding %s", what);        \
        int rc_ = 0;                                                                               \
        void *p_ = grow((m)->arr, (m)->n, &(m)->cap, sizeof *(m)->arr, (max), (what), &rc_, err); \
        if (!p_)                                                                                   \
            return rc_;                                                                            \
        (m)->arr = p_;                                                                             \
        (m)->arr[(m)->n++] = *(x);                                                                 \
        return 0;                                                                                  \
    } while (0)

int pi2_manifest_add_tensor(pi2_manifest *m, const pi2_mf_tensor *t, pi2_err *err)
{
    APPEND(m, tensors, n_tensors, cap_tensors, MF_MAX_ENTRIES, t, "tensors");
}

int pi2_manifest_add_layer(pi2_manifest *m, const pi2_mf_layer *l, pi2_err *err)
{
    APPEND(m, layers, n_layers, cap_layers, MF_MAX_ENTRIES, l, "sparsity entries");
}

int pi2_manifest_add_profile(pi2_manifest *m, const pi2_mf_profile *p, pi2_err *err)
{
    APPEND(m, profile, n_profile, cap_profile, MF_MAX_ENTRIES, p, "profile entries");
}

int pi2_manifest_add_section(pi2_manifest *m, const pi2_ctr_section *s, pi2_err *err)
{
    APPEND(m, sections, n_sections, cap_sections, PI2_CTR_MAX_MEMBERS, s, "sections");
}

int pi2_manifest_add_sections(pi2_manifest *m, const pi2_ctr_section *s, size_t n, pi2_err *err)
{
    if (!m || (n && !s))
        return pi2_err_set(err, PI2_EINVAL, "manifest: NULL argument adding sections");
    size_t n0 = m->n_sections;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(s[i].name, PI2_MF_NAME) == 0 || strcmp(s[i].name, PI2_MF_SIG_NAME) == 0)
            continue;
        int rc = pi2_manifest_add_section(m, &s[i], err);
        if (rc) {
            m->n_sections = n0;
            return rc;
        }
    }
    return 0;
}

int pi2_manifest_set_bundle(pi2_manifest *m, const char *text, pi2_err *err)
{
    if (!m)
        return pi2_err_set(err, PI2_EINVAL, "manifest: NULL manifest");
    char *copy = NULL;
    if (text && !(copy = pi2_strdup(text)))
        return pi2_err_set(err, PI2_ENOMEM, "manifest: out of memory for bundle");
    free(m->bundle_json);
    m->bundle_json = copy;
    return 0;
}

/* ---- lookups ---- */

const pi2_mf_tensor *pi2_manifest_find_tensor(const pi2_manifest *m, pi2_tname role, int layer, int expert)
{
    if (!m)
        return NULL;
    for (size_t i = 0; i < m->n_tensors; i++) {
        const pi2_mf_tensor *t = &m->tensors[i];
        if (t->role == role && t->layer == layer && t->expert == expert)
            return t;
    }
    return NULL;
}

const pi2_ctr_section *pi2_manifest_find_section(const pi2_manifest *m, const char *name)
{
    if (!m || !name)
        return NULL;
    for (size_t i = 0; i < m->n_sections; i++)
        if (strcmp(m->sections[i].name, name) == 0)
            return &m->sections[i];
    return NULL;
}

const pi2_mf_layer *pi2_manifest_find_layer(const pi2_manifest *m, int layer, int expert)
{
    if (!m)
        return NULL;
    for (size_t i = 0; i < m->n_layers; i++)
        if (m->layers[i].layer == layer && m->layers[i].expert == expert)
            return &m->layers[i];
    return NULL;
}

const pi2_mf_profile *pi2_manifest_find_profile(const pi2_manifest *m, int layer, int expert)
{
    if (!m)
        return NULL;
    for (size_t i = 0; i < m->n_profile; i++)
        if (m->profile[i].layer == layer && m->profile[i].expert == expert)
            return &m->profile[i];
    return NULL;
}

/* ---- shapes ---- */

static bool role_is_global(pi2_tname r) { return r == PI2_T_EMBED || r == PI2_T_OUT_NORM || r == PI2_T_LM_HEAD; }
static bool role_is_ffn(pi2_tname r) { return r == PI2_T_GATE || r == PI2_T_UP || r == PI2_T_DOWN; }
static bool role_is_norm(pi2_tname r)
{
    return r == PI2_T_OUT_NORM || r == PI2_T_ATTN_NORM || r == PI2_T_FFN_NORM;
}

/* HF shape [R, C] of a role (norms: [1, d]). */
static void logical_shape(const pi2_model_desc *d, pi2_tname r, int64_t *R, int64_t *C)
{
    int64_t hid = d->hidden, qd = (int64_t)d->n_heads * d->head_dim, kvd = (int64_t)d->n_kv_heads * d->head_dim;
    *C = hid;
    switch (r) {
    case PI2_T_EMBED:
    case PI2_T_LM_HEAD: *R = d->vocab; break;
    case PI2_T_Q: *R = qd; break;
    case PI2_T_K:
    case PI2_T_V: *R = kvd; break;
    case PI2_T_O: *R = hid; *C = qd; break;
    case PI2_T_GATE:
    case PI2_T_UP: *R = d->n_ff; break;
    case PI2_T_DOWN: *R = hid; *C = d->n_ff; break;
    case PI2_T_ROUTER: *R = d->n_experts; break;
    default: *R = 1; break; /* norms */
    }
}

/* Container member name rules (formats/container.h). */
static bool member_name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= PI2_CTR_NAME_MAX || s[0] == '/' || s[n - 1] == '/')
        return false;
    if (strncmp(s, PI2_CTR_PAD_PREFIX, strlen(PI2_CTR_PAD_PREFIX)) == 0)
        return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x21 || (unsigned char)s[i] > 0x7e)
            return false;
    const char *p = s;
    for (;;) {
        const char *e = strchr(p, '/');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == 0 || (len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.'))
            return false;
        if (!e)
            return true;
        p = e + 1;
    }
}

/* ---- reader ---- */

static int cmp_sec_name(const void *a, const void *b)
{
    return strcmp((*(const pi2_ctr_section *const *)a)->name, (*(const pi2_ctr_section *const *)b)->name);
}

const pi2_ctr_section *mf_lookup(const pctx *c, const char *name)
{
    pi2_ctr_section key;
    const pi2_ctr_section *kp = &key;
    snprintf(key.name, sizeof key.name, "%s", name);
    const pi2_ctr_section **hit = c->n_by_name ? bsearch(&kp, c->by_name, c->n_by_name, sizeof *c->by_name,
                                                         cmp_sec_name)
                                               : NULL;
    return hit ? *hit : NULL;
}

/* Member name ("" allowed when allow_empty); if listed, *sec gets its section
 * (may be NULL); a non-empty name must be listed when must_exist. */
int mf_get_member(pctx *c, json_t *o, const char *w, const char *k, bool allow_empty, bool must_exist,
                  char dst[PI2_CTR_NAME_MAX], const pi2_ctr_section **sec)
{
    const char *s;
    json_t *v;
    int rc = pi2_jr_need(&c->r, o, w, k, &v);
    if (rc)
        return rc;
    if (!json_is_string(v))
        return fail(c, PI2_EFORMAT, w, k, "expected a member name string, got %s", pi2_json_type_name(v));
    s = json_string_value(v);
    if (sec)
        *sec = NULL;
    char buf[72];
    if (!*s && json_string_length(v) == 0) {
        if (!allow_empty)
            return fail(c, PI2_EFORMAT, w, k, "empty member name");
        dst[0] = 0;
        return 0;
    }
    if (strlen(s) != json_string_length(v) || !member_name_ok(s))
        return fail(c, PI2_EFORMAT, w, k, "\"%s\" is not a valid member name (1..99 printable bytes, no space)",
                    pi2_jr_clean(s, buf, sizeof buf));
    memcpy(dst, s, strlen(s) + 1);
    if (must_exist) {
        const pi2_ctr_section *hit = mf_lookup(c, s);
        if (!hit)
            return fail(c, PI2_ENOTFOUND, w, k, "member \"%s\" is not in sections", s);
        if (sec)
            *sec = hit;
    }
    return 0;
}

/* ---- sections ---- */

static bool lower_hex64(const char *s)
{
    size_t i = 0;
    for (; s[i]; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return i == 64;
}

int mf_parse_sections(pctx *c, json_t *root)
{
    static const char *const keys[] = { "name", "offset", "size", "sha256" };
    pi2_manifest *m = c->m;
    json_t *arr;
    size_t n;
    int rc = pi2_jr_arr(&c->r, root, "", "sections", PI2_CTR_MAX_MEMBERS, &arr, &n);
    if (rc)
        return rc;
    m->sections = calloc(n ? n : 1, sizeof *m->sections);
    c->by_name = calloc(n ? n : 1, sizeof *c->by_name);
    if (!m->sections || !c->by_name)
        return fail(c, PI2_ENOMEM, "", "sections", "out of memory");
    m->cap_sections = n;
    for (size_t i = 0; i < n; i++) {
        char w[40];
        snprintf(w, sizeof w, "sections[%zu]", i);
        json_t *e;
        pi2_ctr_section *s = &m->sections[i];
        const char *hex;
        if ((rc = pi2_jr_elem_obj(&c->r, arr, i, w, &e)) || (rc = PI2_JR_KEYS(&c->r, e, w, keys, false)) ||
            (rc = mf_get_member(c, e, w, "name", false, false, s->name, NULL)) ||
            (rc = pi2_jr_u64(&c->r, e, w, "offset", INT64_MAX, &s->offset)) ||
            (rc = pi2_jr_u64(&c->r, e, w, "size", (long long)PI2_CTR_MAX_SIZE, &s->size)) ||
            (rc = pi2_jr_str(&c->r, e, w, "sha256", 80, &hex)))
            return rc;
        if (strcmp(s->name, PI2_MF_NAME) == 0 || strcmp(s->name, PI2_MF_SIG_NAME) == 0)
            return fail(c, PI2_EFORMAT, w, "name", "\"%s\" must not be listed in sections", s->name);
        if (!lower_hex64(hex) || pi2_sha256_parse_hex(hex, s->sha256, NULL) != 0)
            return fail(c, PI2_EFORMAT, w, "sha256", "expected 64 lowercase hex digits");
        if (s->offset % PI2_CTR_ALIGN != 0)
            return fail(c, PI2_EFORMAT, w, "offset", "%llu is not a multiple of %u", (unsigned long long)s->offset,
                        PI2_CTR_ALIGN);
        if (i > 0) {
            const pi2_ctr_section *p = &m->sections[i - 1];
            if (s->offset <= p->offset)
                return fail(c, PI2_EFORMAT, w, "offset", "%llu is not after sections[%zu] at %llu (not sorted)",
                            (unsigned long long)s->offset, i - 1, (unsigned long long)p->offset);
            if (s->offset - p->offset < p->size)
                return fail(c, PI2_EFORMAT, w, "offset", "%llu overlaps sections[%zu] (\"%s\", ends at %llu)",
                            (unsigned long long)s->offset, i - 1, p->name,
                            (unsigned long long)(p->offset + p->size));
        }
        m->n_sections = i + 1;
        c->by_name[i] = s;
    }
    c->n_by_name = n;
    qsort(c->by_name, n, sizeof *c->by_name, cmp_sec_name);
    for (size_t i = 1; i < n; i++)
        if (strcmp(c->by_name[i]->name, c->by_name[i - 1]->name) == 0) {
            char w[40];
            snprintf(w, sizeof w, "sections[%zu]", (size_t)(c->by_name[i] - m->sections));
            return fail(c, PI2_EFORMAT, w, "name", "duplicate section \"%s\"", c->by_name[i]->name);
        }
    return 0;
}

/* ---- tensors ---- */

/* name, role, layer and expert: who the tensor is. */
static int tensor_ident(pctx *c, json_t *e, const char *w, pi2_mf_tensor *t)
{
    const pi2_model_desc *d = &c->m->config;
    bool moe = pi2_desc_is_moe(d);
    const char *name;
    int role, rc;
    if ((rc = pi2_jr_str(&c->r, e, w, "name", PI2_MF_TNAME_MAX, &name)))
        return rc;
    if (!*name)
        return fail(c, PI2_EFORMAT, w, "name", "empty tensor name");
    for (const char *p = name; *p; p++)
        if ((unsigned char)*p < 0x21 || (unsigned char)*p > 0x7e)
            return fail(c, PI2_EFORMAT, w, "name", "tensor name is not printable ASCII without spaces");
    memcpy(t->name, name, strlen(name) + 1);
    if ((rc = pi2_jr_enum(&c->r, e, w, "role", role_names, N_ROLES,
                       "embed, out_norm, lm_head, attn_norm, ffn_norm, q, k, v, o, gate, up, down or router",
                       &role)))
        return rc;
    t->role = (pi2_tname)role;
    if ((rc = pi2_jr_i32(&c->r, e, w, "layer", -1, d->n_layers - 1, &t->layer)) ||
        (rc = pi2_jr_i32(&c->r, e, w, "expert", -1, (long long)d->n_experts - 1, &t->expert)))
        return rc;
    if (role_is_global(t->role) && t->layer != -1)
        return fail(c, PI2_ERANGE, w, "layer", "must be -1 for role %s", role_names[role]);
    if (!role_is_global(t->role) && t->layer < 0)
        return fail(c, PI2_ERANGE, w, "layer", "must be in [0, %d) for role %s", d->n_layers, role_names[role]);
    if (moe && role_is_ffn(t->role) && t->expert < 0)
        return fail(c, PI2_ERANGE, w, "expert", "must be in [0, %d) for role %s of a MoE model", d->n_experts,
                    role_names[role]);
    if (!(moe && role_is_ffn(t->role)) && t->expert != -1)
        return fail(c, PI2_ERANGE, w, "expert", "must be -1 for role %s", role_names[role]);
    if (t->role == PI2_T_ROUTER && !moe)
        return fail(c, PI2_EFORMAT, w, "role", "router on a dense model");
    return 0;
}

/* qtype, rows, cols and transposed: how it is stored, against the config. */
static int tensor_shape(pctx *c, json_t *e, const char *w, pi2_mf_tensor *t)
{
    static const char *const qnames[] = { "f32", "q8", "q4" };
    const pi2_manifest *m = c->m;
    const char *role = role_names[t->role];
    int qt, rc;
    if ((rc = pi2_jr_enum(&c->r, e, w, "qtype", qnames, 3, "f32, q8 or q4", &qt)))
        return rc;
    t->qtype = (pi2_qtype)qt;
    if (role_is_ffn(t->role) && t->qtype != m->quant_ffn)
        return fail(c, PI2_EFORMAT, w, "qtype", "%s, but quant.ffn is %s", qnames[qt], pi2_q_type_name(m->quant_ffn));
    bool own = t->role == PI2_T_EMBED || t->role == PI2_T_LM_HEAD || t->role == PI2_T_K || t->role == PI2_T_V ||
               t->role == PI2_T_O; /* may differ from quant.other */
    if (!role_is_ffn(t->role) && !own && t->qtype != PI2_QT_F32 && t->qtype != m->quant_other)
        return fail(c, PI2_EFORMAT, w, "qtype", "%s, but quant.other is %s (or f32)", qnames[qt],
                    pi2_q_type_name(m->quant_other));

    long long rows, cols;
    if ((rc = pi2_jr_int(&c->r, e, w, "rows", 1, INT32_MAX, &rows)) ||
        (rc = pi2_jr_int(&c->r, e, w, "cols", 1, INT32_MAX, &cols)) ||
        (rc = pi2_jr_bool(&c->r, e, w, "transposed", &t->transposed)))
        return rc;
    t->rows = rows;
    t->cols = cols;
    if (t->transposed && role_is_norm(t->role))
        return fail(c, PI2_EFORMAT, w, "transposed", "a norm vector cannot be transposed");
    int64_t R, C;
    logical_shape(&m->config, t->role, &R, &C);
    if (t->transposed) {
        int64_t tmp = R;
        R = C;
        C = tmp;
    }
    if (t->rows != R || t->cols != C)
        return fail(c, PI2_ESHAPE, w, t->rows != R ? "rows" : "cols",
                    "stored shape [%lld, %lld] does not match the config: role %s%s is [%lld, %lld]", rows, cols,
                    role, t->transposed ? " (transposed)" : "", (long long)R, (long long)C);
    if (pi2_q_check_cols(t->qtype, t->cols, "tensor", NULL) != 0)
        return fail(c, PI2_ESHAPE, w, "cols", "%lld columns cannot be stored as %s (groups of %d)", cols,
                    qnames[qt], PI2_Q_GROUP);
    return 0;
}

/* payload and scales: the members holding it, sized for its shape. */
static int tensor_members(pctx *c, json_t *e, const char *w, pi2_mf_tensor *t)
{
    const char *qn = pi2_q_type_name(t->qtype);
    const pi2_ctr_section *ps, *ss;
    int rc;
    if ((rc = mf_get_member(c, e, w, "payload", false, true, t->payload, &ps)) ||
        (rc = mf_get_member(c, e, w, "scales", true, true, t->scales, &ss)))
        return rc;
    if (t->qtype == PI2_QT_F32 && t->scales[0])
        return fail(c, PI2_EFORMAT, w, "scales", "must be \"\" for an f32 tensor");
    if (t->qtype != PI2_QT_F32 && !t->scales[0])
        return fail(c, PI2_EFORMAT, w, "scales", "a %s tensor needs a scales member", qn);
    if (c->m->kind != PI2_MF_CONVERTED)
        return 0;
    long long rows = t->rows, cols = t->cols;
    /* rows, cols < 2^31 and a row is at most 4 bytes per value: no overflow in 64 bits. */
    size_t pb = (size_t)t->rows * pi2_q_payload_row_bytes(t->qtype, t->cols);
    size_t sb = (size_t)t->rows * pi2_q_scale_row_count(t->qtype, t->cols) * 2;
    if (ps->size != pb)
        return fail(c, PI2_ESHAPE, w, "payload", "member \"%s\" holds %llu bytes, expected %zu for %s [%lld, %lld]",
                    ps->name, (unsigned long long)ps->size, pb, qn, rows, cols);
    if (ss && ss->size != sb)
        return fail(c, PI2_ESHAPE, w, "scales", "member \"%s\" holds %llu bytes, expected %zu for %s [%lld, %lld]",
                    ss->name, (unsigned long long)ss->size, sb, qn, rows, cols);
    return 0;
}

static int parse_tensor(pctx *c, json_t *e, const char *w, pi2_mf_tensor *t)
{
    static const char *const keys[] = { "name",  "layer", "expert",     "role",    "qtype",
                                         "rows",  "cols",  "transposed", "payload", "scales" };
    int rc;
    if ((rc = PI2_JR_KEYS(&c->r, e, w, keys, false)) || (rc = tensor_ident(c, e, w, t)) ||
        (rc = tensor_shape(c, e, w, t)))
        return rc;
    return tensor_members(c, e, w, t);
}

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp((*(const pi2_mf_tensor *const *)a)->name, (*(const pi2_mf_tensor *const *)b)->name);
}

static int cmp_tensor_key(const void *a, const void *b)
{
    const pi2_mf_tensor *x = *(const pi2_mf_tensor *const *)a, *y = *(const pi2_mf_tensor *const *)b;
    if (x->role != y->role)
        return x->role < y->role ? -1 : 1;
    if (x->layer != y->layer)
        return x->layer < y->layer ? -1 : 1;
    if (x->expert != y->expert)
        return x->expert < y->expert ? -1 : 1;
    return 0;
}

int mf_parse_tensors(pctx *c, json_t *root)
{
    pi2_manifest *m = c->m;
    const pi2_model_desc *d = &m->config;
    size_t per_layer = 9 + 3 * (size_t)(d->n_experts > 1 ? d->n_experts : 1);
    size_t max = 3 + (size_t)d->n_layers * per_layer;
    json_t *arr;
    size_t n;
    int rc = pi2_jr_arr(&c->r, root, "", "tensors", max, &arr, &n);
    if (rc)
        return rc;
    m->tensors = calloc(n ? n : 1, sizeof *m->tensors);
    const pi2_mf_tensor **idx = calloc(n ? n : 1, sizeof *idx);
    if (!m->tensors || !idx) {
        free(idx);
        return fail(c, PI2_ENOMEM, "", "tensors", "out of memory");
    }
    m->cap_tensors = n;
    for (size_t i = 0; i < n && rc == 0; i++) {
        char w[40];
        snprintf(w, sizeof w, "tensors[%zu]", i);
        json_t *e;
        if ((rc = pi2_jr_elem_obj(&c->r, arr, i, w, &e)) || (rc = parse_tensor(c, e, w, &m->tensors[i])))
            break;
        m->n_tensors = i + 1;
        idx[i] = &m->tensors[i];
    }
    for (int pass = 0; pass < 2 && rc == 0; pass++) {
        qsort(idx, n, sizeof *idx, pass == 0 ? cmp_tensor_name : cmp_tensor_key);
        for (size_t i = 1; i < n && rc == 0; i++) {
            if ((pass == 0 ? cmp_tensor_name : cmp_tensor_key)(&idx[i - 1], &idx[i]) != 0)
                continue;
            char w[40];
            const pi2_mf_tensor *t = idx[i];
            snprintf(w, sizeof w, "tensors[%zu]", (size_t)(t - m->tensors));
            rc = pass == 0 ? fail(c, PI2_EFORMAT, w, "name", "duplicate tensor name \"%s\"", t->name)
                           : fail(c, PI2_EFORMAT, w, "role", "duplicate tensor (role %s, layer %d, expert %d)",
                                  role_names[t->role], t->layer, t->expert);
        }
    }
    free(idx);
    return rc;
}

/* "config" through the one config.json reader, and torch_dtype. */
int mf_parse_config(pctx *c, json_t *root)
{
    static const char *const dtypes[] = { "float32", "float16", "bfloat16" };
    pi2_manifest *m = c->m;
    json_t *cfg;
    int rc, ival;
    if ((rc = pi2_jr_obj(&c->r, root, "", "config", false, &cfg)))
        return rc;
    char *ctext = json_dumps(cfg, JSON_COMPACT);
    if (!ctext)
        return fail(c, PI2_ENOMEM, "", "config", "out of memory");
    char cname[200];
    snprintf(cname, sizeof cname, "%.160s: config", c->r.file);
    rc = pi2_config_parse(ctext, strlen(ctext), cname, &m->config, c->r.err);
    free(ctext);
    if (rc)
        return rc;
    if ((rc = pi2_jr_enum(&c->r, root, "", "torch_dtype", dtypes, 3, "float32, float16 or bfloat16", &ival)))
        return rc;
    snprintf(m->torch_dtype, sizeof m->torch_dtype, "%s", dtypes[ival]);
    return 0;
}

/* "quant": the FFN and other types, the group and the scale type. */
int mf_parse_quant(pctx *c, json_t *root)
{
    static const char *const qkeys[] = { "ffn", "other", "group", "scales" };
    static const char *const qnames[] = { NULL, "q8", "q4" }; /* indexed by pi2_qtype; f32 not allowed */
    static const char *const scales[] = { "f16" };
    pi2_manifest *m = c->m;
    json_t *q;
    long long group;
    const char *qw = "quant";
    int rc, ival;
    if ((rc = pi2_jr_obj(&c->r, root, "", "quant", false, &q)) || (rc = PI2_JR_KEYS(&c->r, q, qw, qkeys, false)) ||
        (rc = pi2_jr_enum(&c->r, q, qw, "ffn", qnames, 3, "q4 or q8", &ival)))
        return rc;
    m->quant_ffn = (pi2_qtype)ival;
    if ((rc = pi2_jr_enum(&c->r, q, qw, "other", qnames, 3, "q8 or q4", &ival)))
        return rc;
    m->quant_other = (pi2_qtype)ival;
    if ((rc = pi2_jr_int(&c->r, q, qw, "group", INT64_MIN, INT64_MAX, &group)))
        return rc;
    if (group != PI2_Q_GROUP)
        return fail(c, PI2_EUNSUPPORTED, qw, "group", "%lld is not supported (this build uses %d)", group, PI2_Q_GROUP);
    return pi2_jr_enum(&c->r, q, qw, "scales", scales, 1, "f16", &ival);
}

/* "bundle": null for kind converted, an object (kept as text for
 * bundle/layout) for kind bundled. */
int mf_parse_bundle_obj(pctx *c, json_t *root)
{
    pi2_manifest *m = c->m;
    json_t *b;
    int rc;
    if ((rc = pi2_jr_obj(&c->r, root, "", "bundle", true, &b)))
        return rc;
    if (b && m->kind == PI2_MF_CONVERTED)
        return fail(c, PI2_EFORMAT, "", "bundle", "must be null for kind converted");
    if (!b && m->kind == PI2_MF_BUNDLED)
        return fail(c, PI2_EFORMAT, "", "bundle", "required (an object) for kind bundled");
    if (b && !(m->bundle_json = json_dumps(b, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17))))
        return fail(c, PI2_ENOMEM, "", "bundle", "out of memory");
    return 0;
}
