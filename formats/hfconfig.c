/* Hugging Face config.json <-> pi2_model_desc, and HF tensor names.
 *
 * Parsing is strict on types (a size must be a JSON integer, a flag a JSON
 * boolean) because a config that a Python reader would coerce silently is
 * usually a sign of a hand-edited or hostile file. Range and consistency
 * checks live in pi2_config_validate so descriptions built in code (test
 * models, converters) get the same checks before they are written. */
#include "formats/hfconfig.h"

#include "formats/jsonutil.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int pi2_config_validate(const pi2_model_desc *d, const char *name, pi2_err *err)
{
    int rc;
    if (!name)
        name = "config";
    if (!d)
        return pi2_err_set(err, PI2_EINVAL, "%s: no model description", name);
    if (!arch_valid(d->arch))
        return pi2_err_set(err, PI2_EINVAL, "%s: invalid arch value %d", name, (int)d->arch);
    if (d->act != PI2_ACT_SILU && d->act != PI2_ACT_RELU && d->act != PI2_ACT_DRELU)
        return pi2_err_set(err, PI2_EINVAL, "%s: invalid act value %d", name, (int)d->act);
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

/* Integer key. Absent/null: PI2_ENOTFOUND if required, else *out = dflt. */
static int get_int(json_t *o, const char *key, bool required, int dflt, int *out, const char *name, pi2_err *err)
{
    json_t *v = get(o, key);
    if (!v) {
        if (required)
            return pi2_err_set(err, PI2_ENOTFOUND, "%s: required key %s is missing", name, key);
        *out = dflt;
        return 0;
    }
    if (!json_is_integer(v))
        return pi2_err_set(err, PI2_EFORMAT, "%s: %s must be an integer", name, key);
    json_int_t x = json_integer_value(v);
    if (x < -(json_int_t)0x7fffffff || x > (json_int_t)0x7fffffff)
        return pi2_err_set(err, PI2_ERANGE, "%s: %s %lld out of range", name, key, (long long)x);
    *out = (int)x;
    return 0;
}

static int get_real(json_t *o, const char *key, double dflt, double *out, const char *name, pi2_err *err)
{
    json_t *v = get(o, key);
    if (!v) {
        *out = dflt;
        return 0;
    }
    if (!json_is_number(v))
        return pi2_err_set(err, PI2_EFORMAT, "%s: %s must be a number", name, key);
    *out = json_number_value(v);
    return 0;
}

static int get_bool(json_t *o, const char *key, bool dflt, bool *out, const char *name, pi2_err *err)
{
    json_t *v = get(o, key);
    if (!v) {
        *out = dflt;
        return 0;
    }
    if (!json_is_boolean(v))
        return pi2_err_set(err, PI2_EFORMAT, "%s: %s must be true or false", name, key);
    *out = json_is_true(v);
    return 0;
}

static int get_string(json_t *o, const char *key, const char **out, const char *name, pi2_err *err)
{
    json_t *v = get(o, key);
    if (!v)
        return pi2_err_set(err, PI2_ENOTFOUND, "%s: required key %s is missing", name, key);
    if (!json_is_string(v))
        return pi2_err_set(err, PI2_EFORMAT, "%s: %s must be a string", name, key);
    *out = json_string_value(v);
    return 0;
}

static int parse_eos(json_t *o, pi2_model_desc *d, const char *name, pi2_err *err)
{
    json_t *v = json_object_get(o, "eos_token_id");
    if (!v) { /* HF default */
        d->n_eos = 1;
        d->eos_ids[0] = 2;
        return 0;
    }
    d->n_eos = 0;
    if (json_is_null(v))
        return 0;
    if (json_is_integer(v)) {
        json_int_t x = json_integer_value(v);
        if (x < 0 || x > 0x7fffffff)
            return pi2_err_set(err, PI2_ERANGE, "%s: eos_token_id %lld out of range", name, (long long)x);
        d->n_eos = 1;
        d->eos_ids[0] = (int)x;
        return 0;
    }
    if (!json_is_array(v))
        return pi2_err_set(err, PI2_EFORMAT, "%s: eos_token_id must be an integer or a list of integers", name);
    size_t n = json_array_size(v);
    if (n > PI2_MAX_EOS)
        return pi2_err_set(err, PI2_ERANGE, "%s: eos_token_id has %zu values, at most %d supported", name, n,
                           PI2_MAX_EOS);
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_integer(e))
            return pi2_err_set(err, PI2_EFORMAT, "%s: eos_token_id must be an integer or a list of integers",
                               name);
        json_int_t x = json_integer_value(e);
        if (x < 0 || x > 0x7fffffff)
            return pi2_err_set(err, PI2_ERANGE, "%s: eos_token_id %lld out of range", name, (long long)x);
        d->eos_ids[d->n_eos++] = (int)x;
    }
    return 0;
}

/* A boolean flag we only support as false (or absent). */
static int reject_true(json_t *o, const char *key, const char *name, pi2_err *err)
{
    bool b = false;
    int rc = get_bool(o, key, false, &b, name, err);
    if (rc)
        return rc;
    if (b)
        return pi2_err_set(err, PI2_EUNSUPPORTED, "%s: %s = true is not supported", name, key);
    return 0;
}

static int parse_object(json_t *root, pi2_model_desc *out, const char *name, pi2_err *err)
{
    pi2_model_desc d;
    memset(&d, 0, sizeof d);
    int rc;
    const char *s = NULL;

    if (!json_is_object(root))
        return pi2_err_set(err, PI2_EFORMAT, "%s: top level is not a JSON object", name);

    if ((rc = get_string(root, "model_type", &s, name, err)))
        return rc;
    size_t ai;
    for (ai = 0; ai < N_ARCH; ai++)
        if (strcmp(s, arch_table[ai].type) == 0)
            break;
    if (ai == N_ARCH) {
        char known[160] = "";
        for (size_t k = 0; k < N_ARCH; k++)
            snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", k ? ", " : "", arch_table[k].type);
        return pi2_err_set(err, PI2_EUNSUPPORTED, "%s: unsupported model_type \"%.64s\" (pi2 runs %s)", name, s,
                           known);
    }
    d.arch = arch_table[ai].arch;

    if ((rc = get_string(root, "hidden_act", &s, name, err)))
        return rc;
    bool silu = strcmp(s, "silu") == 0, relu = strcmp(s, "relu") == 0;
    if (!silu && !relu)
        return pi2_err_set(err, PI2_EUNSUPPORTED, "%s: unsupported hidden_act \"%.64s\" (silu or relu)", name, s);
    if (arch_is_drelu(d.arch)) {
        if (!relu)
            return pi2_err_set(err, PI2_EUNSUPPORTED, "%s: model_type %s needs hidden_act relu, not \"%.64s\"",
                               name, pi2_arch_name(d.arch), s);
        d.act = PI2_ACT_DRELU;
    } else {
        d.act = silu ? PI2_ACT_SILU : PI2_ACT_RELU;
    }

    if ((rc = get_int(root, "hidden_size", true, 0, &d.hidden, name, err)) ||
        (rc = get_int(root, "intermediate_size", true, 0, &d.n_ff, name, err)) ||
        (rc = get_int(root, "num_hidden_layers", true, 0, &d.n_layers, name, err)) ||
        (rc = get_int(root, "num_attention_heads", true, 0, &d.n_heads, name, err)) ||
        (rc = get_int(root, "vocab_size", true, 0, &d.vocab, name, err)) ||
        (rc = get_int(root, "max_position_embeddings", true, 0, &d.max_pos, name, err)) ||
        (rc = get_int(root, "num_key_value_heads", false, d.n_heads, &d.n_kv_heads, name, err)) ||
        (rc = get_int(root, "head_dim", false, 0, &d.head_dim, name, err)) ||
        (rc = get_int(root, "bos_token_id", false, 1, &d.bos_id, name, err)))
        return rc;
    if (d.bos_id < 0)
        return pi2_err_set(err, PI2_ERANGE, "%s: bos_token_id %d is negative", name, d.bos_id);
    if (json_object_get(root, "bos_token_id") && json_is_null(json_object_get(root, "bos_token_id")))
        d.bos_id = -1;
    if ((rc = parse_eos(root, &d, name, err)))
        return rc;

    if (!get(root, "head_dim")) {
        /* HF default head_dim = hidden / heads; needs exact division. */
        if ((rc = check_range(name, "hidden_size", d.hidden, 1, PI2_CFG_MAX_DIM, err)) ||
            (rc = check_range(name, "num_attention_heads", d.n_heads, 1, PI2_CFG_MAX_DIM, err)))
            return rc;
        if (d.hidden % d.n_heads != 0)
            return pi2_err_set(err, PI2_EFORMAT, "%s: num_attention_heads %d does not divide hidden_size %d", name,
                               d.n_heads, d.hidden);
        d.head_dim = d.hidden / d.n_heads;
    }

    double theta = 0, eps = 0;
    if ((rc = get_real(root, "rope_theta", 10000.0, &theta, name, err)) ||
        (rc = get_real(root, "rms_norm_eps", 1e-6, &eps, name, err)) ||
        (rc = get_bool(root, "tie_word_embeddings", false, &d.tie_embeddings, name, err)))
        return rc;
    d.rope_theta = theta;
    if (!(eps > 0 && eps < 1))
        return pi2_err_set(err, PI2_ERANGE, "%s: rms_norm_eps %g out of range (0, 1)", name, eps);
    d.rms_eps = (float)eps;

    if (get(root, "rope_scaling"))
        return pi2_err_set(err, PI2_EUNSUPPORTED, "%s: rope_scaling is not supported (must be null)", name);
    if ((rc = reject_true(root, "attention_bias", name, err)) || (rc = reject_true(root, "mlp_bias", name, err)))
        return rc;

    if (arch_is_moe(d.arch)) {
        if ((rc = get_int(root, "num_local_experts", true, 0, &d.n_experts, name, err)) ||
            (rc = get_int(root, "num_experts_per_tok", true, 0, &d.n_experts_used, name, err)))
            return rc;
    } else {
        /* A dense type may carry the keys (some exporters copy them); one
         * expert is the dense model, more would be silently dropped. */
        int ne = 0;
        if ((rc = get_int(root, "num_local_experts", false, 0, &ne, name, err)))
            return rc;
        if (ne > 1)
            return pi2_err_set(err, PI2_EUNSUPPORTED, "%s: num_local_experts %d given for dense model_type %s",
                               name, ne, pi2_arch_name(d.arch));
    }

    if ((rc = pi2_config_validate(&d, name, err)))
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

int pi2_config_read(const char *path, pi2_model_desc *out, pi2_err *err)
{
    char buf[4096];
    if (!path)
        return pi2_err_set(err, PI2_EINVAL, "config: no path");
    if (pi2_is_dir(path)) {
        if (!pi2_path_join(buf, sizeof buf, path, "config.json"))
            return pi2_err_set(err, PI2_ERANGE, "%s: path too long", path);
        path = buf;
    }
    char *text;
    size_t len;
    int rc = pi2_read_file(path, PI2_CFG_MAX_BYTES, &text, &len, err);
    if (rc)
        return rc;
    rc = pi2_config_parse(text, len, path, out, err);
    free(text);
    return rc;
}

/* ---- writing ---- */

/* Growing text buffer; `failed` sticks after the first allocation failure. */
typedef struct sbuf {
    char *p;
    size_t len, cap;
    bool failed;
} sbuf;

static void sb_add(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_add(sbuf *b, const char *fmt, ...)
{
    if (b->failed)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = true;
            return;
        }
        if (b->p && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t ncap = (b->cap ? b->cap * 2 : 1024) + (size_t)n;
        char *np = realloc(b->p, ncap);
        if (!np) {
            b->failed = true;
            return;
        }
        b->p = np;
        b->cap = ncap;
    }
}

/* Shortest decimal that reads back as the same double, spelled as Python's
 * repr (and so HF's json.dumps) does: fixed notation for exponents in
 * [-4, 16), always with a '.' or an exponent so it stays a float. */
static void fmt_real(char *buf, size_t cap, double v)
{
    int prec = 1;
    for (; prec < 17; prec++) {
        snprintf(buf, cap, "%.*e", prec - 1, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    snprintf(buf, cap, "%.*e", prec - 1, v);
    const char *e = strchr(buf, 'e');
    int exp = e ? atoi(e + 1) : 0;
    if (exp >= -4 && exp < 16) {
        int decimals = prec - 1 - exp;
        snprintf(buf, cap, "%.*f", decimals > 0 ? decimals : 0, v);
        if (!strchr(buf, '.'))
            strncat(buf, ".0", cap - strlen(buf) - 1);
    }
}

/* The double whose shortest decimal form reads back as float f, so that
 * 1e-6f is written "1e-06" rather than "9.99999997e-07". */
static double float_as_short_double(float f)
{
    char buf[32];
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)f);
        if (strtof(buf, NULL) == f)
            return strtod(buf, NULL);
    }
    return (double)f;
}

int pi2_config_format(const pi2_model_desc *d, const char *torch_dtype, char **out, size_t *len, pi2_err *err)
{
    *out = NULL;
    if (len)
        *len = 0;
    int rc = pi2_config_validate(d, "config", err);
    if (rc)
        return rc;
    if (torch_dtype && strcmp(torch_dtype, "float32") != 0 && strcmp(torch_dtype, "float16") != 0 &&
        strcmp(torch_dtype, "bfloat16") != 0)
        return pi2_err_set(err, PI2_EINVAL, "config: torch_dtype \"%.32s\" is not float32, float16 or bfloat16",
                           torch_dtype);
    char theta[40], eps[40];
    fmt_real(theta, sizeof theta, d->rope_theta);
    fmt_real(eps, sizeof eps, float_as_short_double(d->rms_eps));
    bool moe = arch_is_moe(d->arch);

    /* Keys in sorted order, two-space indent: what HF's save_pretrained
     * (json.dumps(indent=2, sort_keys=True)) produces. */
    sbuf b = { 0 };
    sb_add(&b, "{\n  \"architectures\": [\n    \"%s\"\n  ],\n", pi2_arch_class(d->arch));
    sb_add(&b, "  \"attention_bias\": false,\n");
    if (d->bos_id >= 0)
        sb_add(&b, "  \"bos_token_id\": %d,\n", d->bos_id);
    else
        sb_add(&b, "  \"bos_token_id\": null,\n");
    if (d->n_eos == 0) {
        sb_add(&b, "  \"eos_token_id\": null,\n");
    } else if (d->n_eos == 1) {
        sb_add(&b, "  \"eos_token_id\": %d,\n", d->eos_ids[0]);
    } else {
        sb_add(&b, "  \"eos_token_id\": [\n");
        for (int i = 0; i < d->n_eos; i++)
            sb_add(&b, "    %d%s\n", d->eos_ids[i], i + 1 < d->n_eos ? "," : "");
        sb_add(&b, "  ],\n");
    }
    sb_add(&b, "  \"head_dim\": %d,\n", d->head_dim);
    sb_add(&b, "  \"hidden_act\": \"%s\",\n", d->act == PI2_ACT_SILU ? "silu" : "relu");
    sb_add(&b, "  \"hidden_size\": %d,\n", d->hidden);
    sb_add(&b, "  \"intermediate_size\": %d,\n", d->n_ff);
    sb_add(&b, "  \"max_position_embeddings\": %d,\n", d->max_pos);
    sb_add(&b, "  \"mlp_bias\": false,\n");
    sb_add(&b, "  \"model_type\": \"%s\",\n", pi2_arch_name(d->arch));
    sb_add(&b, "  \"num_attention_heads\": %d,\n", d->n_heads);
    if (moe)
        sb_add(&b, "  \"num_experts_per_tok\": %d,\n", d->n_experts_used);
    sb_add(&b, "  \"num_hidden_layers\": %d,\n", d->n_layers);
    sb_add(&b, "  \"num_key_value_heads\": %d,\n", d->n_kv_heads);
    if (moe)
        sb_add(&b, "  \"num_local_experts\": %d,\n", d->n_experts);
    sb_add(&b, "  \"rms_norm_eps\": %s,\n", eps);
    sb_add(&b, "  \"rope_scaling\": null,\n");
    sb_add(&b, "  \"rope_theta\": %s,\n", theta);
    sb_add(&b, "  \"tie_word_embeddings\": %s,\n", d->tie_embeddings ? "true" : "false");
    if (torch_dtype)
        sb_add(&b, "  \"torch_dtype\": \"%s\",\n", torch_dtype);
    sb_add(&b, "  \"use_cache\": true,\n");
    sb_add(&b, "  \"vocab_size\": %d\n}\n", d->vocab);
    if (b.failed) {
        free(b.p);
        return pi2_err_set(err, PI2_ENOMEM, "config: out of memory");
    }
    *out = b.p;
    if (len)
        *len = b.len;
    return 0;
}

int pi2_config_write_dtype(const char *path, const pi2_model_desc *d, const char *torch_dtype, pi2_err *err)
{
    char buf[4096];
    if (!path)
        return pi2_err_set(err, PI2_EINVAL, "config: no path");
    if (pi2_is_dir(path)) {
        if (!pi2_path_join(buf, sizeof buf, path, "config.json"))
            return pi2_err_set(err, PI2_ERANGE, "%s: path too long", path);
        path = buf;
    }
    char *text;
    size_t len;
    pi2_err sub = { 0 };
    int rc = pi2_config_format(d, torch_dtype, &text, &len, &sub);
    if (rc)
        return pi2_err_set(err, rc, "%s: %s", path, sub.msg);
    pi2_afile *f;
    rc = pi2_afile_open(&f, path, err);
    if (rc == 0) {
        rc = pi2_afile_write(f, text, len, err);
        if (rc == 0)
            rc = pi2_afile_commit(f, err);
        else
            pi2_afile_abort(f);
    }
    free(text);
    return rc;
}

int pi2_config_write(const char *path, const pi2_model_desc *d, pi2_err *err)
{
    return pi2_config_write_dtype(path, d, NULL, err);
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
    json_t *v = get(root, "sparse_threshold");
    if (v && !json_is_number(v))
        rc = pi2_err_set(err, PI2_EFORMAT, "%s: sparse_threshold is %s, expected a number", path,
                         pi2_json_type_name(v));
    else if (v && !isfinite(json_number_value(v)))
        rc = pi2_err_set(err, PI2_ERANGE, "%s: sparse_threshold is not finite", path);
    else if (v) {
        *threshold = json_number_value(v);
        *found = true;
    }
    json_decref(root);
    return rc;
}
