/* Hugging Face config.json from a pi2_model_desc: the writer. The reader and
 * the checks it runs first (pi2_config_validate) are formats/hfconfig.c. */
#include "formats/hfconfig.h"

#include "formats/jsonutil.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
    pi2_json_fmt_real(theta, sizeof theta, d->rope_theta);
    pi2_json_fmt_real(eps, sizeof eps, pi2_json_float_value(d->rms_eps));
    bool moe = pi2_desc_is_moe(d);

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
    sb_add(&b, "  \"hidden_act\": \"%s\",\n",
           d->act == PI2_ACT_SILU ? "silu" : d->act == PI2_ACT_FATRELU ? "fatrelu" : "relu");
    if (d->act == PI2_ACT_FATRELU) {
        char t[40];
        pi2_json_fmt_real(t, sizeof t, pi2_json_float_value(d->act_param));
        sb_add(&b, "  \"hidden_act_param\": %s,\n", t);
    }
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
    if (d->rope.type == PI2_ROPE_DEFAULT) {
        sb_add(&b, "  \"rope_scaling\": null,\n");
    } else {
        char f[40];
        const pi2_rope_scaling *r = &d->rope;
        pi2_json_fmt_real(f, sizeof f, r->factor);
        sb_add(&b, "  \"rope_scaling\": {\n    \"factor\": %s,\n", f);
        if (r->type == PI2_ROPE_LLAMA3) {
            char hi[40], lo[40];
            pi2_json_fmt_real(hi, sizeof hi, r->high_freq_factor);
            pi2_json_fmt_real(lo, sizeof lo, r->low_freq_factor);
            sb_add(&b, "    \"high_freq_factor\": %s,\n    \"low_freq_factor\": %s,\n", hi, lo);
            sb_add(&b, "    \"original_max_position_embeddings\": %d,\n", r->orig_max_pos);
        }
        sb_add(&b, "    \"rope_type\": \"%s\"\n  },\n", pi2_rope_type_name(r->type));
    }
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
    int rc = pi2_config_path(path, buf, sizeof buf, &path, err);
    if (rc)
        return rc;
    char *text;
    size_t len;
    pi2_err sub = { 0 };
    rc = pi2_config_format(d, torch_dtype, &text, &len, &sub);
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
