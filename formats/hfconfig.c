/* Hugging Face config.json -> pi2_model_desc (the writer is hfconfig_write.c), and HF tensor names.
 *
 * Parsing is strict on types (a size must be a JSON integer, a flag a JSON
 * boolean) because a config that a Python reader would coerce silently is
 * usually a sign of a hand-edited or hostile file. Range and consistency
 * checks live in pi2_config_validate so descriptions built in code (test
 * models, converters) get the same checks before they are written. Keys are
 * read through formats/jsonread ("<file>: <key>: <problem>"); HF's defaults
 * for absent or null keys are applied here. */
#include "formats/hfconfig.h"

#include "formats/jsonread.h"
#include "formats/jsonutil.h"

#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const struct {
    pi2_arch arch;
    const char *type;
    const char *cls;
} arch_table[] = {
    { PI2_ARCH_LLAMA, "llama", "LlamaForCausalLM" },
    { PI2_ARCH_MISTRAL, "mistral", "MistralForCausalLM" },
    { PI2_ARCH_MIXTRAL, "mixtral", "MixtralForCausalLM" },
    { PI2_ARCH_BAMBOO, "bamboo", "BambooForCausalLM" },
    { PI2_ARCH_TURBOSPARSE_MIXTRAL, "turbosparsemixtral", "TurboSparseMixtralForCausalLM" },
    { PI2_ARCH_SPARSELLAMA, "sparsellama", "SparseLlamaForCausalLM" },
};
#define N_ARCH (sizeof arch_table / sizeof arch_table[0])

const char *pi2_arch_name(pi2_arch a)
{
    for (size_t i = 0; i < N_ARCH; i++)
        if (arch_table[i].arch == a)
            return arch_table[i].type;
    return "unknown";
}

const char *pi2_arch_class(pi2_arch a)
{
    for (size_t i = 0; i < N_ARCH; i++)
        if (arch_table[i].arch == a)
            return arch_table[i].cls;
    return "unknown";
}

const char *pi2_act_name(pi2_act a)
{
    switch (a) {
    case PI2_ACT_SILU: return "silu";
    case PI2_ACT_RELU: return "relu";
    case PI2_ACT_DRELU: return "drelu";
    case PI2_ACT_FATRELU: return "fatrelu";
    }
    return "unknown";
}

const char *pi2_rope_type_name(pi2_rope_type t)
{
    switch (t) {
    case PI2_ROPE_DEFAULT: return "default";
    case PI2_ROPE_LINEAR: return "linear";
    case PI2_ROPE_DYNAMIC: return "dynamic";
    case PI2_ROPE_LLAMA3: return "llama3";
    }
    return "unknown";
}

static bool arch_valid(pi2_arch a)
{
    for (size_t i = 0; i < N_ARCH; i++)
        if (arch_table[i].arch == a)
            return true;
    return false;
}

static bool arch_is_moe(pi2_arch a) { return a == PI2_ARCH_MIXTRAL || a == PI2_ARCH_TURBOSPARSE_MIXTRAL; }
static bool arch_is_drelu(pi2_arch a) { return a == PI2_ARCH_BAMBOO || a == PI2_ARCH_TURBOSPARSE_MIXTRAL; }

bool pi2_desc_is_moe(const pi2_model_desc *d) { return d && arch_is_moe(d->arch); }

/* ---- validation ---- */

static int check_range(const char *name, const char *key, long long v, long long lo, long long hi, pi2_err *err)
{
    if (v < lo || v > hi)
        return pi2_err_set(err, PI2_ERANGE, "%s: %s %lld out of range [%lld, %lld]", name, key, v, lo, hi);
    return 0;
}

static int validate_rope(const pi2_model_desc *d, const char *name, pi2_err *err)
{
    const pi2_rope_scaling *r = &d->rope;
    if (r->type != PI2_ROPE_DEFAULT && r->type != PI2_ROPE_LINEAR && r->type != PI2_ROPE_DYNAMIC &&
        r->type != PI2_ROPE_LLAMA3)
        return pi2_err_set(err, PI2_EINVAL, "%s: invalid rope scaling type %d", name, (int)r->type);
    bool l3 = r->type == PI2_ROPE_LLAMA3;
    if ((r->type == PI2_ROPE_DEFAULT && r->factor != 0) ||
        (!l3 && (r->low_freq_factor != 0 || r->high_freq_factor != 0 || r->orig_max_pos != 0)))
        return pi2_err_set(err, PI2_EINVAL, "%s: rope_scaling fields set that type %s does not use", name,
                           pi2_rope_type_name(r->type));
    if (r->type == PI2_ROPE_DEFAULT)
        return 0;
    if (!(r->factor >= 1.0 && r->factor <= PI2_ROPE_MAX_FACTOR))
        return pi2_err_set(err, PI2_ERANGE, "%s: rope_scaling.factor %g out of range [1, %g]", name, r->factor,
                           PI2_ROPE_MAX_FACTOR);
    if (r->type == PI2_ROPE_DYNAMIC && d->head_dim <= 2)
        return pi2_err_set(err, PI2_ERANGE, "%s: dynamic rope_scaling needs head_dim > 2 (the base's exponent is "
                           "hd / (hd - 2)), not %d", name, d->head_dim);
    if (!l3)
        return 0;
    if (!(r->low_freq_factor > 0 && isfinite(r->low_freq_factor)))
        return pi2_err_set(err, PI2_ERANGE, "%s: rope_scaling.low_freq_factor %g must be positive", name,
                           r->low_freq_factor);
    if (!(r->high_freq_factor > r->low_freq_factor && isfinite(r->high_freq_factor)))
        return pi2_err_set(err, PI2_ERANGE, "%s: rope_scaling.high_freq_factor %g must exceed low_freq_factor %g",
                           name, r->high_freq_factor, r->low_freq_factor);
    return check_range(name, "rope_scaling.original_max_position_embeddings", r->orig_max_pos, 1, PI2_CFG_MAX_DIM,
                       err);
}

int pi2_config_validate(const pi2_model_desc *d, const char *name, pi2_err *err)
{
    int rc;
    if (!name)
        name = "config";
    if (!d)
        return pi2_err_set(err, PI2_EINVAL, "%s: no model description", name);
    if (!arch_valid(d->arch))
        return pi2_err_set(err, PI2_EINVAL, "%s: invalid arch value %d", name, (int)d->arch);
    if (d->act != PI2_ACT_SILU && d->act != PI2_ACT_RELU && d->act != PI2_ACT_DRELU && d->act != PI2_ACT_FATRELU)
        return pi2_err_set(err, PI2_EINVAL, "%s: invalid act value %d", name, (int)d->act);
    if (d->act == PI2_ACT_FATRELU && !(d->act_param >= 0.0f && isfinite(d->act_param)))
        return pi2_err_set(err, PI2_ERANGE, "%s: hidden_act_param %g must be a finite threshold >= 0", name,
                           (double)d->act_param);
    if (d->act != PI2_ACT_FATRELU && d->act_param != 0.0f)
        return pi2_err_set(err, PI2_EINVAL, "%s: act_param %g given for hidden_act %s (FATReLU only)", name,
                           (double)d->act_param, pi2_act_name(d->act));
    if (arch_is_drelu(d->arch) && d->act != PI2_ACT_DRELU)
        return pi2_err_set(err, PI2_EUNSUPPORTED, "%s: model_type %s needs the dReLU activation, not %s", name,
                           pi2_arch_name(d->arch), pi2_act_name(d->act));
    if (!arch_is_drelu(d->arch) && d->act == PI2_ACT_DRELU)
        return pi2_err_set(err, PI2_EUNSUPPORTED, "%s: model_type %s cannot use the dReLU activation", name,
                           pi2_arch_name(d->arch));

    if ((rc = check_range(name, "hidden_size", d->hidden, 1, PI2_CFG_MAX_DIM, err)) ||
        (rc = check_range(name, "intermediate_size", d->n_ff, 1, PI2_CFG_MAX_DIM, err)) ||
        (rc = check_range(name, "num_hidden_layers", d->n_layers, 1, PI2_CFG_MAX_LAYERS, err)) ||
        (rc = check_range(name, "num_attention_heads", d->n_heads, 1, PI2_CFG_MAX_DIM, err)) ||
        (rc = check_range(name, "num_key_value_heads", d->n_kv_heads, 1, PI2_CFG_MAX_DIM, err)) ||
        (rc = check_range(name, "head_dim", d->head_dim, 1, PI2_CFG_MAX_DIM, err)) ||
        (rc = check_range(name, "num_attention_heads * head_dim", (long long)d->n_heads * d->head_dim, 1,
                          PI2_CFG_MAX_DIM, err)) ||
        (rc = check_range(name, "vocab_size", d->vocab, 1, PI2_CFG_MAX_VOCAB, err)) ||
        (rc = check_range(name, "max_position_embeddings", d->max_pos, 1, PI2_CFG_MAX_DIM, err)))
        return rc;
    /* RoPE rotates pairs (i, i + head_dim/2). */
    if (d->head_dim % 2 != 0)
        return pi2_err_set(err, PI2_EFORMAT, "%s: head_dim %d is odd (RoPE needs an even head_dim)", name,
                           d->head_dim);
    if (d->n_heads % d->n_kv_heads != 0)
        return pi2_err_set(err, PI2_EFORMAT, "%s: num_key_value_heads %d does not divide num_attention_heads %d",
                           name, d->n_kv_heads, d->n_heads);
    if (!(d->rope_theta > 0) || !isfinite(d->rope_theta))
        return pi2_err_set(err, PI2_ERANGE, "%s: rope_theta %g must be positive", name, d->rope_theta);
    if (!(d->rms_eps > 0.0f && d->rms_eps < 1.0f))
        return pi2_err_set(err, PI2_ERANGE, "%s: rms_norm_eps %g out of range (0, 1)", name, (double)d->rms_eps);
    if ((rc = validate_rope(d, name, err)))
        return rc;

    if (arch_is_moe(d->arch)) {
        if ((rc = check_range(name, "num_local_experts", d->n_experts, 1, PI2_CFG_MAX_EXPERTS, err)) ||
            (rc = check_range(name, "num_experts_per_tok", d->n_experts_used, 1, PI2_CFG_MAX_EXPERTS, err)))
            return rc;
        if (d->n_experts_used > d->n_experts)
            return pi2_err_set(err, PI2_ERANGE, "%s: num_experts_per_tok %d exceeds num_local_experts %d", name,
                               d->n_experts_used, d->n_experts);
    } else if (d->n_experts != 0 || d->n_experts_used != 0) {
        return pi2_err_set(err, PI2_EINVAL, "%s: dense model_type %s with %d experts (%d used)", name,
                           pi2_arch_name(d->arch), d->n_experts, d->n_experts_used);
    }

    if (d->bos_id != -1 && (rc = check_range(name, "bos_token_id", d->bos_id, 0, d->vocab - 1, err)))
        return rc;
    if ((rc = check_range(name, "number of eos_token_id values", d->n_eos, 0, PI2_MAX_EOS, err)))
        return rc;
    for (int i = 0; i < d->n_eos; i++)
        if ((rc = check_range(name, "eos_token_id", d->eos_ids[i], 0, d->vocab - 1, err)))
            return rc;
    return 0;
}

/* ---- parsing ---- */

/* A key whose value is absent or JSON null. */
static json_t *get(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return v && !json_is_null(v) ? v : NULL;
}

/* HF's convention: a key that is absent or null takes its default. The
 * readers below apply it, then read through formats/jsonread. */
static int missing(pi2_jr *r, const char *w, const char *key)
{
    return pi2_jr_fail(r, PI2_ENOTFOUND, w, key, "required key is missing");
}

/* Integer key in the int range. Absent/null: missing if required, else
 * *out = dflt. */
static int get_int(pi2_jr *r, json_t *o, const char *key, bool required, int dflt, int *out)
{
    if (!get(o, key)) {
        *out = dflt;
        return required ? missing(r, "", key) : 0;
    }
    return pi2_jr_i32(r, o, "", key, -(long long)INT32_MAX, INT32_MAX, out);
}

/* Number key in [lo, hi] (flags of pi2_jr_real); absent/null: dflt. */
static int get_real(pi2_jr *r, json_t *o, const char *w, const char *key, double dflt, double lo, double hi,
                    unsigned flags, double *out)
{
    if (!get(o, key)) {
        *out = dflt;
        return 0;
    }
    return pi2_jr_real(r, o, w, key, lo, hi, flags, out);
}

static int get_string(pi2_jr *r, json_t *o, const char *key, const char **out)
{
    if (!get(o, key))
        return missing(r, "", key);
    return pi2_jr_str(r, o, "", key, SIZE_MAX, out);
}

/* eos_token_id of o, present and not null: an integer or a list of at most
 * PI2_MAX_EOS integers, each in [0, INT32_MAX], into ids[*n]. */
static int eos_id_list(pi2_jr *r, json_t *o, int ids[PI2_MAX_EOS], int *n)
{
    json_t *v = json_object_get(o, "eos_token_id"), *arr = v;
    size_t na = 1;
    long long x;
    int rc;
    *n = 0;
    if (json_is_integer(v)) {
        if ((rc = pi2_jr_int(r, o, "", "eos_token_id", 0, INT32_MAX, &x)))
            return rc;
        ids[(*n)++] = (int)x;
        return 0;
    }
    if (!json_is_array(v))
        return pi2_jr_fail(r, PI2_EFORMAT, "", "eos_token_id", "expected an integer or a list of integers, got %s",
                           pi2_json_type_name(v));
    if ((rc = pi2_jr_arr(r, o, "", "eos_token_id", PI2_MAX_EOS, &arr, &na)))
        return rc;
    for (size_t i = 0; i < na; i++) {
        char w[40];
        snprintf(w, sizeof w, "eos_token_id[%zu]", i);
        if ((rc = pi2_jr_int_val(r, json_array_get(arr, i), w, NULL, 0, INT32_MAX, &x)))
            return rc;
        ids[(*n)++] = (int)x;
    }
    return 0;
}

/* config.json's end-of-turn ids, without repeats; absent: HF's default 2,
 * null: none. */
static int parse_eos(pi2_jr *r, json_t *o, pi2_model_desc *d)
{
    int ids[PI2_MAX_EOS], n, rc;
    d->n_eos = 0;
    if (!json_object_get(o, "eos_token_id")) { /* HF default */
        d->n_eos = 1;
        d->eos_ids[0] = 2;
        return 0;
    }
    if (!get(o, "eos_token_id"))
        return 0;
    if ((rc = eos_id_list(r, o, ids, &n)))
        return rc;
    for (int i = 0; i < n; i++) {
        bool seen = false;
        for (int k = 0; k < d->n_eos; k++)
            seen = seen || d->eos_ids[k] == ids[i];
        if (!seen)
            d->eos_ids[d->n_eos++] = ids[i];
    }
    return 0;
}

/* A required number inside rope_scaling (ranges: pi2_config_validate). */
static int rope_num(pi2_jr *r, json_t *o, const char *key, double *out)
{
    if (!get(o, key))
        return missing(r, "rope_scaling", key);
    return pi2_jr_real(r, o, "rope_scaling", key, -DBL_MAX, DBL_MAX, 0, out);
}

/* rope_scaling: null, or {"rope_type" (or "type"): ..., factors}. Ranges
 * are checked by pi2_config_validate. */
static int parse_rope(pi2_jr *rd, json_t *root, pi2_model_desc *d)
{
    memset(&d->rope, 0, sizeof d->rope);
    json_t *o = get(root, "rope_scaling");
    if (!o)
        return 0;
    if (!json_is_object(o))
        return pi2_jr_fail(rd, PI2_EFORMAT, "", "rope_scaling", "expected an object or null, got %s",
                           pi2_json_type_name(o));
    json_t *rt = get(o, "rope_type"), *ty = get(o, "type");
    if (!rt && !ty)
        return pi2_jr_fail(rd, PI2_ENOTFOUND, "rope_scaling", "rope_type", "required key is missing (and so is type)");
    const char *t = NULL, *t2 = NULL;
    int rc;
    if ((rt && (rc = pi2_jr_str(rd, o, "rope_scaling", "rope_type", SIZE_MAX, &t))) ||
        (ty && (rc = pi2_jr_str(rd, o, "rope_scaling", "type", SIZE_MAX, &t2))))
        return rc;
    if (t && t2 && strcmp(t, t2) != 0)
        return pi2_jr_fail(rd, PI2_EFORMAT, "rope_scaling", "rope_type", "\"%.32s\" and type \"%.32s\" disagree", t,
                           t2);
    t = t ? t : t2;
    pi2_rope_scaling *r = &d->rope;
    if (strcmp(t, "default") == 0)
        return 0;
    if (strcmp(t, "linear") == 0)
        r->type = PI2_ROPE_LINEAR;
    else if (strcmp(t, "dynamic") == 0)
        r->type = PI2_ROPE_DYNAMIC;
    else if (strcmp(t, "llama3") == 0)
        r->type = PI2_ROPE_LLAMA3;
    else
        return pi2_jr_fail(rd, PI2_EUNSUPPORTED, "rope_scaling", rt ? "rope_type" : "type",
                           "\"%.64s\" is not supported (pi2 runs linear, dynamic and llama3)", t);
    rc = rope_num(rd, o, "factor", &r->factor);
    if (rc || r->type != PI2_ROPE_LLAMA3)
        return rc;
    if ((rc = rope_num(rd, o, "low_freq_factor", &r->low_freq_factor)) ||
        (rc = rope_num(rd, o, "high_freq_factor", &r->high_freq_factor)))
        return rc;
    if (!get(o, "original_max_position_embeddings"))
        return missing(rd, "rope_scaling", "original_max_position_embeddings");
    return pi2_jr_i32(rd, o, "rope_scaling", "original_max_position_embeddings", 1, PI2_CFG_MAX_DIM,
                      &r->orig_max_pos);
}

/* A boolean flag we only support as false (or absent). */
static int reject_true(pi2_jr *r, json_t *o, const char *key)
{
    bool b = false;
    int rc = pi2_jr_bool_or(r, o, "", key, false, &b);
    if (rc)
        return rc;
    if (b)
        return pi2_jr_fail(r, PI2_EUNSUPPORTED, "", key, "true is not supported");
    return 0;
}

/* model_type and hidden_act (with FATReLU's threshold) into d. */
static int parse_arch_act(pi2_jr *r, json_t *root, pi2_model_desc *d)
{
    const char *s = NULL;
    int rc;
    if ((rc = get_string(r, root, "model_type", &s)))
        return rc;
    size_t ai;
    for (ai = 0; ai < N_ARCH; ai++)
        if (strcmp(s, arch_table[ai].type) == 0)
            break;
    if (ai == N_ARCH) {
        char known[160] = "";
        for (size_t k = 0; k < N_ARCH; k++)
            snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", k ? ", " : "", arch_table[k].type);
        return pi2_jr_fail(r, PI2_EUNSUPPORTED, "", "model_type", "\"%.64s\" is not supported (pi2 runs %s)", s,
                           known);
    }
    d->arch = arch_table[ai].arch;

    if ((rc = get_string(r, root, "hidden_act", &s)))
        return rc;
    bool silu = strcmp(s, "silu") == 0, relu = strcmp(s, "relu") == 0, fat = strcmp(s, "fatrelu") == 0;
    if (!silu && !relu && !fat)
        return pi2_jr_fail(r, PI2_EUNSUPPORTED, "", "hidden_act",
                           "\"%.64s\" is not supported (silu, relu or fatrelu)", s);
    if (arch_is_drelu(d->arch)) {
        if (!relu)
            return pi2_err_set(r->err, PI2_EUNSUPPORTED, "%s: model_type %s needs hidden_act relu, not \"%.64s\"",
                               r->file, pi2_arch_name(d->arch), s);
        d->act = PI2_ACT_DRELU;
    } else {
        d->act = silu ? PI2_ACT_SILU : relu ? PI2_ACT_RELU : PI2_ACT_FATRELU;
    }
    if (!fat)
        return 0;
    /* FATReLU's threshold: required, there is no default to assume. */
    if (!get(root, "hidden_act_param"))
        return pi2_jr_fail(r, PI2_ENOTFOUND, "", "hidden_act_param", "required by hidden_act fatrelu (its threshold)");
    return pi2_jr_float(r, root, "", "hidden_act_param", 0, FLT_MAX, &d->act_param);
}

/* The dimensions, bos and eos ids, and HF's default head_dim. */
static int parse_dims(pi2_jr *r, json_t *root, pi2_model_desc *d)
{
    const char *name = r->file;
    int rc;
    if ((rc = get_int(r, root, "hidden_size", true, 0, &d->hidden)) ||
        (rc = get_int(r, root, "intermediate_size", true, 0, &d->n_ff)) ||
        (rc = get_int(r, root, "num_hidden_layers", true, 0, &d->n_layers)) ||
        (rc = get_int(r, root, "num_attention_heads", true, 0, &d->n_heads)) ||
        (rc = get_int(r, root, "vocab_size", true, 0, &d->vocab)) ||
        (rc = get_int(r, root, "max_position_embeddings", true, 0, &d->max_pos)) ||
        (rc = get_int(r, root, "num_key_value_heads", false, d->n_heads, &d->n_kv_heads)) ||
        (rc = get_int(r, root, "head_dim", false, 0, &d->head_dim)) ||
        (rc = get_int(r, root, "bos_token_id", false, 1, &d->bos_id)))
        return rc;
    if (d->bos_id < 0)
        return pi2_err_set(r->err, PI2_ERANGE, "%s: bos_token_id %d is negative", name, d->bos_id);
    if (json_object_get(root, "bos_token_id") && json_is_null(json_object_get(root, "bos_token_id")))
        d->bos_id = -1;
    if ((rc = parse_eos(r, root, d)))
        return rc;
    if (get(root, "head_dim"))
        return 0;
    /* HF default head_dim = hidden / heads; needs exact division. */
    if ((rc = check_range(name, "hidden_size", d->hidden, 1, PI2_CFG_MAX_DIM, r->err)) ||
        (rc = check_range(name, "num_attention_heads", d->n_heads, 1, PI2_CFG_MAX_DIM, r->err)))
        return rc;
    if (d->hidden % d->n_heads != 0)
        return pi2_err_set(r->err, PI2_EFORMAT, "%s: num_attention_heads %d does not divide hidden_size %d", name,
                           d->n_heads, d->hidden);
    d->head_dim = d->hidden / d->n_heads;
    return 0;
}

/* The experts of a MoE type; a dense type may carry the keys (some
 * exporters copy them): one expert is the dense model, more would be
 * silently dropped. */
static int parse_experts(pi2_jr *r, json_t *root, pi2_model_desc *d)
{
    int rc;
    if (arch_is_moe(d->arch)) {
        if ((rc = get_int(r, root, "num_local_experts", true, 0, &d->n_experts)) ||
            (rc = get_int(r, root, "num_experts_per_tok", true, 0, &d->n_experts_used)))
            return rc;
        return 0;
    }
    int ne = 0;
    if ((rc = get_int(r, root, "num_local_experts", false, 0, &ne)))
        return rc;
    if (ne > 1)
        return pi2_err_set(r->err, PI2_EUNSUPPORTED, "%s: num_local_experts %d given for dense model_type %s", r->file,
                           ne, pi2_arch_name(d->arch));
    return 0;
}

static int parse_object(json_t *root, pi2_model_desc *out, const char *name, pi2_err *err)
{
    pi2_model_desc d;
    memset(&d, 0, sizeof d);
    int rc;
    pi2_jr r = { name, err };
    if (!json_is_object(root))
        return pi2_jr_fail(&r, PI2_EFORMAT, "", NULL, "expected an object, got %s", pi2_json_type_name(root));
    if ((rc = parse_arch_act(&r, root, &d)) || (rc = parse_dims(&r, root, &d)))
        return rc;
    double theta = 0, eps = 0;
    if ((rc = get_real(&r, root, "", "rope_theta", 10000.0, -DBL_MAX, DBL_MAX, 0, &theta)) ||
        (rc = get_real(&r, root, "", "rms_norm_eps", 1e-6, 0, 1, PI2_JR_LO_OPEN | PI2_JR_HI_OPEN, &eps)) ||
        (rc = pi2_jr_bool_or(&r, root, "", "tie_word_embeddings", false, &d.tie_embeddings)))
        return rc;
    d.rope_theta = theta;
    d.rms_eps = (float)eps;
    if ((rc = parse_rope(&r, root, &d)) || (rc = reject_true(&r, root, "attention_bias")) ||
        (rc = reject_true(&r, root, "mlp_bias")) || (rc = parse_experts(&r, root, &d)) ||
        (rc = pi2_config_validate(&d, name, err)))
        return rc;
    *out = d;
    return 0;
}

int pi2_config_parse(const char *json, size_t len, const char *name, pi2_model_desc *out, pi2_err *err)
{
    if (!name)
        name = "config.json";
    if (!json || !out)
        return pi2_err_set(err, PI2_EINVAL, "%s: no input", name);
    json_error_t jerr;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return pi2_err_set(err, PI2_EFORMAT, "%s: invalid JSON at line %d column %d: %s", name, jerr.line,
                           jerr.column, jerr.text);
    int rc = parse_object(root, out, name, err);
    json_decref(root);
    return rc;
}

/* What a file given where a Hugging Face model directory belongs is, when
 * its first bytes tell: a pi2 container (a POSIX ustar header, as every
 * converted or bundled model starts) or a safetensors file (an 8-byte
 * header length, then '{'); NULL otherwise. */
static const char *file_kind(const char *path)
{
    unsigned char h[512];
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(h, 1, sizeof h, f) : 0;
    if (f)
        fclose(f);
    if (n == sizeof h && memcmp(h + 257, "ustar", 5) == 0)
        return "a pi2 container (a converted or bundled model)";
    if (n >= 9 && h[8] == '{' && h[0] != '{')
        return "a safetensors file";
    return NULL;
}

int pi2_config_path(const char *path, char *buf, size_t cap, const char **out, pi2_err *err)
{
    if (!path)
        return pi2_err_set(err, PI2_EINVAL, "config: no path");
    *out = path;
    if (pi2_is_dir(path)) {
        if (!pi2_path_join(buf, cap, path, "config.json"))
            return pi2_err_set(err, PI2_ERANGE, "%s: path too long", path);
        *out = buf;
    }
    return 0;
}

int pi2_config_read(const char *path, pi2_model_desc *out, pi2_err *err)
{
    char buf[4096];
    const char *file;
    int rc = pi2_config_path(path, buf, sizeof buf, &file, err);
    if (rc)
        return rc;
    const char *kind = file == path ? file_kind(path) : NULL; /* a file given, not a directory */
    if (kind)
        return pi2_err_set(err, PI2_EFORMAT,
                           "%s: %s, not a Hugging Face model directory; give the directory that holds config.json "
                           "and the weights",
                           path, kind);
    path = file;
    char *text;
    size_t len;
    rc = pi2_read_file(path, PI2_CFG_MAX_BYTES, &text, &len, err);
    if (rc)
        return rc;
    rc = pi2_config_parse(text, len, path, out, err);
    free(text);
    return rc;
}

/* ---- end of turn from every file of a model directory ---- */

/* Add id to d's end-of-turn ids unless there; `file` for messages. */
static int add_eos(pi2_model_desc *d, long long id, const char *file, const char *key, pi2_err *err)
{
    if (id < 0 || id >= d->vocab)
        return pi2_err_set(err, PI2_ERANGE, "%s: %s %lld outside the vocabulary [0, %d)", file, key, id, d->vocab);
    for (int k = 0; k < d->n_eos; k++)
        if (d->eos_ids[k] == id)
            return 0;
    if (d->n_eos == PI2_MAX_EOS)
        return pi2_err_set(err, PI2_ERANGE, "%s: %s %lld makes more than %d end-of-turn ids", file, key, id,
                           PI2_MAX_EOS);
    d->eos_ids[d->n_eos++] = (int)id;
    return 0;
}

/* Parse the JSON object in dir/fname into *root (NULL, not an error, when
 * the file does not exist); path receives the file's path. flags: jansson
 * decoding flags besides JSON_REJECT_DUPLICATES. */
static int load_optional(const char *dir, const char *fname, size_t cap, size_t flags, char *path, size_t pcap,
                         json_t **root, pi2_err *err)
{
    *root = NULL;
    if (!pi2_path_join(path, pcap, dir, fname))
        return pi2_err_set(err, PI2_ERANGE, "%s: path too long", dir);
    char *text = NULL;
    size_t len = 0;
    pi2_err sub = { 0 };
    int rc = pi2_read_file(path, cap, &text, &len, &sub);
    if (rc == PI2_ENOTFOUND)
        return 0;
    if (rc)
        return pi2_err_set(err, rc, "%s", sub.msg);
    json_error_t je;
    json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES | flags, &je);
    free(text);
    if (!o)
        return pi2_err_set(err, PI2_EFORMAT, "%s: invalid JSON at line %d column %d: %s", path, je.line, je.column,
                           je.text);
    if (!json_is_object(o)) {
        json_decref(o);
        return pi2_err_set(err, PI2_EFORMAT, "%s: top level is not a JSON object", path);
    }
    *root = o;
    return 0;
}

#define PI2_TOKCFG_MAX_BYTES (16u << 20) /* tokenizer_config.json: chat templates, added tokens */

int pi2_config_merge_eos(const char *dir, const pi2_tok *tok, pi2_model_desc *d, pi2_err *err)
{
    if (!dir || !d)
        return pi2_err_set(err, PI2_EINVAL, "config: NULL argument");
    pi2_model_desc m = *d;
    char path[4200];
    json_t *o = NULL;
    int rc = load_optional(dir, "generation_config.json", PI2_CFG_MAX_BYTES, 0, path, sizeof path, &o, err);
    if (rc)
        return rc;
    if (o) {
        int ids[PI2_MAX_EOS], n = 0;
        if (get(o, "eos_token_id"))
            rc = eos_id_list(&(pi2_jr){path, err}, o, ids, &n);
        for (int i = 0; rc == 0 && i < n; i++)
            rc = add_eos(&m, ids[i], path, "eos_token_id", err);
        json_decref(o);
        if (rc)
            return rc;
    }
    /* integers as reals: HF writes model_max_length as 1e30 spelled out,
     * past any integer type, and only eos_token is read here */
    if ((rc = load_optional(dir, "tokenizer_config.json", PI2_TOKCFG_MAX_BYTES, JSON_DECODE_INT_AS_REAL, path,
                            sizeof path, &o, err)))
        return rc;
    if (o) {
        /* a string, or an AddedToken object whose content is the token */
        json_t *v = get(o, "eos_token");
        if (v && json_is_object(v))
            v = json_object_get(v, "content");
        const char *content = v && json_is_string(v) ? json_string_value(v) : NULL;
        if (get(o, "eos_token") && !content)
            rc = pi2_err_set(err, PI2_EFORMAT, "%s: eos_token must be a string or an object with a string content",
                             path);
        else if (content && tok) {
            int id = pi2_tok_find(tok, content);
            rc = id >= 0 ? add_eos(&m, id, path, "eos_token", err)
                         : pi2_err_set(err, PI2_ENOTFOUND, "%s: eos_token \"%.64s\" is not a token of tokenizer.json",
                                       path, content);
        }
        json_decref(o);
        if (rc)
            return rc;
    }
    *d = m;
    return 0;
}

int pi2_config_read_model(const char *dir, pi2_model_desc *out, int *n_tokens, pi2_err *err)
{
    if (n_tokens)
        *n_tokens = 0;
    if (!dir || !out)
        return pi2_err_set(err, PI2_EINVAL, "config: NULL argument");
    pi2_model_desc d;
    int rc = pi2_config_read(dir, &d, err);
    if (rc || !pi2_is_dir(dir)) {
        if (rc == 0)
            *out = d;
        return rc;
    }
    char path[4200];
    if (!pi2_path_join(path, sizeof path, dir, "tokenizer.json"))
        return pi2_err_set(err, PI2_ERANGE, "%s: path too long", dir);
    pi2_tok *tok = NULL;
    if (access(path, F_OK) == 0 && (rc = pi2_tok_load(&tok, path, err)) != 0)
        return rc;
    if (tok && pi2_tok_vocab_size(tok) > d.vocab)
        rc = pi2_err_set(err, PI2_EFORMAT, "%s: %d tokens, more than the model's vocab_size %d", path,
                         pi2_tok_vocab_size(tok), d.vocab);
    if (rc == 0)
        rc = pi2_config_merge_eos(dir, tok, &d, err);
    if (rc == 0) {
        *out = d;
        if (n_tokens)
            *n_tokens = tok ? pi2_tok_vocab_size(tok) : 0;
    }
    pi2_tok_free(tok);
    return rc;
}

bool pi2_desc_is_end(const pi2_model_desc *d, int id)
{
    if (!d || id < 0)
        return false;
    if (id == d->bos_id)
        return true;
    for (int k = 0; k < d->n_eos; k++)
        if (id == d->eos_ids[k])
            return true;
    return false;
}

/* ---- model math the config implies ---- */

float pi2_desc_gate_threshold(const pi2_model_desc *d) { return d->act == PI2_ACT_FATRELU ? d->act_param : 0.0f; }

int pi2_desc_max_ctx(const pi2_model_desc *d)
{
    if (d->rope.type != PI2_ROPE_DYNAMIC)
        return d->max_pos;
    double n = fmin(floor(d->rope.factor * d->max_pos), PI2_CFG_MAX_DIM);
    return n > d->max_pos ? (int)n : d->max_pos;
}

bool pi2_rope_varies(const pi2_model_desc *d, int pos)
{
    return d->rope.type == PI2_ROPE_DYNAMIC && (long long)pos + 1 > d->max_pos;
}

/* Each step rounds to float32 where HF's torch code holds a float32 tensor
 * and in double where it computes on Python floats. */
void pi2_rope_inv_freq(const pi2_model_desc *d, int pos, float *inv_freq)
{
    const pi2_rope_scaling *r = &d->rope;
    int hd = d->head_dim, half = hd / 2;
    double base = d->rope_theta;
    if (pi2_rope_varies(d, pos)) {
        /* dynamic NTK: base * ((f * L / M) - (f - 1)) ** (hd / (hd - 2)), L the length so far */
        double f = r->factor, L = (double)pos + 1.0, M = d->max_pos;
        base = base * pow(f * L / M - (f - 1.0), (double)hd / (double)(hd - 2));
    }
    for (int i = 0; i < half; i++)
        inv_freq[i] = 1.0f / powf((float)base, (float)(2 * i) / (float)hd);
    if (r->type == PI2_ROPE_LINEAR) {
        for (int i = 0; i < half; i++)
            inv_freq[i] = inv_freq[i] / (float)r->factor;
    } else if (r->type == PI2_ROPE_LLAMA3) {
        /* wavelengths above orig/low: divided by factor; below orig/high:
         * kept; between: (1 - s) * inv / factor + s * inv with
         * s = (orig / wavelen - low) / (high - low) */
        float factor = (float)r->factor, low = (float)r->low_freq_factor;
        float low_wl = (float)(r->orig_max_pos / r->low_freq_factor);
        float high_wl = (float)(r->orig_max_pos / r->high_freq_factor);
        float span = (float)(r->high_freq_factor - r->low_freq_factor), orig = (float)r->orig_max_pos;
        for (int i = 0; i < half; i++) {
            float inv = inv_freq[i], wl = (float)(2.0 * M_PI) / inv;
            float il = wl > low_wl ? inv / factor : inv;
            if (!(wl < high_wl) && !(wl > low_wl)) {
                float sm = (orig / wl - low) / span;
                il = (1.0f - sm) * il / factor + sm * il;
            }
            inv_freq[i] = il;
        }
    }
}

/* ---- tensor names ---- */

bool pi2_tensor_name(char *buf, size_t cap, const pi2_model_desc *d, pi2_tname t, int layer, int expert)
{
    if (!buf || cap == 0 || !d)
        return false;
    bool moe = pi2_desc_is_moe(d);
    const char *part = NULL; /* per-layer dense/expert suffix */
    int n;
    switch (t) {
    case PI2_T_EMBED: n = snprintf(buf, cap, "model.embed_tokens.weight"); goto done;
    case PI2_T_OUT_NORM: n = snprintf(buf, cap, "model.norm.weight"); goto done;
    case PI2_T_LM_HEAD: n = snprintf(buf, cap, "lm_head.weight"); goto done;
    case PI2_T_ATTN_NORM: part = "input_layernorm.weight"; break;
    case PI2_T_FFN_NORM: part = "post_attention_layernorm.weight"; break;
    case PI2_T_Q: part = "self_attn.q_proj.weight"; break;
    case PI2_T_K: part = "self_attn.k_proj.weight"; break;
    case PI2_T_V: part = "self_attn.v_proj.weight"; break;
    case PI2_T_O: part = "self_attn.o_proj.weight"; break;
    case PI2_T_ROUTER:
        if (!moe)
            return false;
        part = "block_sparse_moe.gate.weight";
        break;
    case PI2_T_GATE:
    case PI2_T_UP:
    case PI2_T_DOWN:
    case PI2_T_PRED_FC1:
    case PI2_T_PRED_FC2: {
        static const char *dense[] = { "gate_proj.weight", "up_proj.weight", "down_proj.weight",
                                       "predictor.fc1.weight", "predictor.fc2.weight" };
        static const char *expert_part[] = { "w1.weight", "w3.weight", "w2.weight", "predictor.fc1.weight",
                                             "predictor.fc2.weight" };
        int k = t == PI2_T_GATE ? 0 : t == PI2_T_UP ? 1 : t == PI2_T_DOWN ? 2 : t == PI2_T_PRED_FC1 ? 3 : 4;
        if (layer < 0)
            return false;
        if (moe) {
            if (expert < 0)
                return false;
            n = snprintf(buf, cap, "model.layers.%d.block_sparse_moe.experts.%d.%s", layer, expert,
                         expert_part[k]);
        } else {
            n = snprintf(buf, cap, "model.layers.%d.mlp.%s", layer, dense[k]);
        }
        goto done;
    }
    default: return false;
    }
    if (layer < 0)
        return false;
    n = snprintf(buf, cap, "model.layers.%d.%s", layer, part);
done:
    return n >= 0 && (size_t)n < cap;
}

/* ---- predictor repositories ---- */

int pi2_pred_repo_config_read(const char *path, double *threshold, bool *found, pi2_err *err)
{
    *found = false;
    *threshold = 0.0;
    char *text;
    size_t len;
    int rc = pi2_read_file(path, PI2_CFG_MAX_BYTES, &text, &len, err);
    if (rc)
        return rc;
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!root || !json_is_object(root)) {
        json_decref(root);
        return pi2_err_set(err, PI2_EFORMAT, "%s: %s", path, root ? "not a JSON object" : "not valid JSON");
    }
    pi2_jr r = { path, err };
    if (get(root, "sparse_threshold")) {
        rc = pi2_jr_real(&r, root, "", "sparse_threshold", -DBL_MAX, DBL_MAX, 0, threshold);
        *found = rc == 0;
    }
    json_decref(root);
    return rc;
}
