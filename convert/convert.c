/* pi2-convert: the stages in order (see convert.h). */
#include "convert/conv.h"
#include "formats/jinja.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void pi2_convert_defaults(pi2_convert_opts *o)
{
    memset(o, 0, sizeof *o);
    o->q_ffn = PI2_QT_Q4;
    o->q_other = PI2_QT_Q8;
    o->recall = 0.99;
    o->pred_input = -1;
    o->silu_sparsity = 0.5;
    o->seed = 1;
}

/* The manifest's tensor list from what stage 1 recorded. */
static int fill_manifest(pi2_conv *c, pi2_err *err)
{
    pi2_manifest *mf = c->mf;
    const pi2_convert_opts *o = c->o;
    mf->kind = PI2_MF_CONVERTED;
    snprintf(mf->created_by, sizeof mf->created_by, "pi2-convert");
    const char *base = strrchr(o->model_dir, '/');
    base = base && base[1] ? base + 1 : o->model_dir;
    snprintf(mf->source, sizeof mf->source, "%s", base);
    for (char *p = mf->source; *p; p++)
        if ((unsigned char)*p < 0x20)
            *p = '?';
    mf->config = *c->desc;
    const pi2_st_tensor *e = pi2_ref_weight(c->m, PI2_T_EMBED, 0, 0);
    snprintf(mf->torch_dtype, sizeof mf->torch_dtype, "%s",
             e->dtype == PI2_DT_F32 ? "float32" : e->dtype == PI2_DT_F16 ? "float16" : "bfloat16");
    mf->quant_ffn = o->q_ffn;
    mf->quant_other = o->q_other;
    snprintf(mf->tokenizer, sizeof mf->tokenizer, "tokenizer.json");
    if (c->chat_template)
        snprintf(mf->chat_template, sizeof mf->chat_template, "tokenizer_config.json");
    bool moe = c->desc->n_experts > 0;
    for (size_t i = 0; i < c->n_tensors; i++) {
        const conv_tensor *t = &c->tensors[i];
        pi2_mf_tensor mt = {0};
        snprintf(mt.name, sizeof mt.name, "%s", t->name);
        mt.role = t->role;
        bool global = t->role == PI2_T_EMBED || t->role == PI2_T_OUT_NORM || t->role == PI2_T_LM_HEAD;
        bool ffn = t->role == PI2_T_GATE || t->role == PI2_T_UP || t->role == PI2_T_DOWN;
        mt.layer = global ? -1 : t->layer;
        mt.expert = ffn && moe ? t->expert : -1;
        mt.qtype = t->qt;
        mt.rows = t->rows;
        mt.cols = t->cols;
        mt.transposed = t->transposed;
        snprintf(mt.payload, sizeof mt.payload, "%s", t->payload);
        snprintf(mt.scales, sizeof mt.scales, "%s", t->scales);
        int rc = pi2_manifest_add_tensor(mf, &mt, err);
        if (rc)
            return rc;
    }
    mf->quality_tokens = c->quality_tokens;
    mf->ppl_ref = c->ppl[0];
    mf->ppl_q_dense = c->ppl[1];
    mf->ppl_q_sparse = c->ppl[2];
    return 0;
}

/* What the model is, as its tensors and config tell (model_type alone does
 * not: Bamboo-base and TurboSparse-Mistral are both "bamboo", and only
 * the second ships predictors in its checkpoint). */
static void describe_family(const pi2_conv *c, char *buf, size_t cap)
{
    const pi2_model_desc *d = c->desc;
    const conv_psrc *p = &c->psrc;
    const char *fam = d->arch == PI2_ARCH_TURBOSPARSE_MIXTRAL                       ? "TurboSparse-Mixtral"
                      : d->arch == PI2_ARCH_BAMBOO && p->kind && !strcmp(p->kind, "checkpoint") ? "TurboSparse-Mistral"
                      : d->arch == PI2_ARCH_BAMBOO                                 ? "Bamboo"
                      : d->arch == PI2_ARCH_SPARSELLAMA || d->act == PI2_ACT_FATRELU ? "ProSparse-style FATReLU Llama"
                      : d->act == PI2_ACT_RELU                                     ? "ReLU Llama (ReluLLaMA-style ReGLU)"
                      : d->act == PI2_ACT_SILU && d->n_experts > 0                 ? "Mixtral (SiLU)"
                      : d->act == PI2_ACT_SILU                                     ? "Llama/Mistral (SiLU)"
                                                                                   : "sparse Llama";
    snprintf(buf, cap, "%s: model_type %s, %s FFN, hidden %d, ffn %d, %d layers, %d experts, vocab %d; predictors %s%s%.512s",
             fam, pi2_arch_name(d->arch), pi2_act_name(d->act), d->hidden, d->n_ff, d->n_layers, d->n_experts,
             d->vocab, p->kind ? p->kind : c->o->train_predictors ? "to be trained" : "none",
             p->kind ? " " : "", p->kind ? p->path : "");
}

/* Bytes the output will take, roughly: FFN weights (about two thirds of
 * a model's) at q_ffn, the rest at q_other, 1-D tensors as f32, with their
 * fp16 scales (one per 32 weights); predictors and profile are small. */
static uint64_t estimate_out_bytes(const pi2_conv *c)
{
    const pi2_convert_opts *o = c->o;
    double b_ffn = o->q_ffn == PI2_QT_Q4 ? 0.5625 : 1.0625, b_other = o->q_other == PI2_QT_Q4 ? 0.5625 : 1.0625;
    double per = (2.0 * b_ffn + b_other) / 3.0, total = 0;
    for (size_t i = 0; i < pi2_st_count(c->st); i++) {
        const pi2_st_tensor *t = pi2_st_at(c->st, i);
        total += t->ndim < 2 ? 4.0 * (double)t->nelem : per * (double)t->nelem;
    }
    return (uint64_t)(total * 1.05) + (1u << 20);
}

/* The model's tokenizer_config.json, kept as a member when it carries a
 * chat_template (pi2-run chat and serve render it). A file that is missing,
 * unreadable or without a template keeps nothing and says so; a template
 * this renderer cannot run is kept, with the reason reported (the user can
 * give another with pi2-run --chat-template). Only a failed write is an
 * error. */
static int keep_chat_template(pi2_conv *c, pi2_err *err)
{
    char path[4096];
    char *text = NULL;
    size_t len = 0;
    pi2_err e = {0};
    pi2_chat_config cc = {0};
    if (!pi2_path_join(path, sizeof path, c->o->model_dir, "tokenizer_config.json") || access(path, F_OK) != 0)
        return 0;
    if (pi2_read_file(path, 16u << 20, &text, &len, &e) != 0 || pi2_jinja_config_parse(text, len, path, &cc, &e) != 0) {
        conv_report(c, "chat template: none kept (%s)\n", e.msg);
        free(text);
        return 0;
    }
    int rc = 0;
    if (!cc.chat_template) {
        conv_report(c, "chat template: none in tokenizer_config.json (chat uses ChatML unless given one)\n");
    } else {
        const pi2_chat_msg m[] = {{"system", "s"}, {"user", "u"}, {"assistant", "a"}, {"user", "v"}};
        const pi2_chat_vars v = {cc.bos_token ? cc.bos_token : "", cc.eos_token ? cc.eos_token : "", true};
        char *out = NULL;
        size_t n;
        pi2_err re = {0};
        if (pi2_jinja_render(cc.chat_template, strlen(cc.chat_template), m, 4, &v, &out, &n, &re) != 0 &&
            pi2_jinja_render(cc.chat_template, strlen(cc.chat_template), m + 1, 3, &v, &out, &n, &re) != 0)
            conv_report(c, "chat template: kept, but it does not render here: %s\n", re.msg);
        else
            conv_report(c, "chat template: kept (from tokenizer_config.json)\n");
        free(out);
        if ((rc = pi2_ctr_writer_add(c->w, "tokenizer_config.json", text, len, err)) == 0)
            c->chat_template = true;
    }
    pi2_jinja_config_free(&cc);
    free(text);
    return rc;
}

/* The output rule (formats/common.h): not an input, not over an existing
 * file without --force, room for the estimate. */
static int check_output(const pi2_conv *c, pi2_err *err)
{
    const pi2_convert_opts *o = c->o;
    const char *inputs[] = {o->model_dir, o->predictors_dir, o->calib_path, c->psrc.kind ? c->psrc.path : NULL};
    return pi2_out_check(o->out_path, inputs, sizeof inputs / sizeof *inputs, o->force ? PI2_OUT_FORCE : 0,
                         estimate_out_bytes(c), err);
}

int pi2_convert(const pi2_convert_opts *o, FILE *report, pi2_err *err)
{
    return pi2_convert_run(o, report, NULL, err);
}

int pi2_convert_run(const pi2_convert_opts *o, FILE *report, pi2_convert_need *need, pi2_err *err)
{
    pi2_conv c = {0};
    c.o = o;
    c.report = report;
    c.t0 = pi2_now();
    c.tty = !o->quiet && isatty(2);
    c.ppl[0] = c.ppl[1] = c.ppl[2] = NAN;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    c.threads = o->threads > 0 ? o->threads : (int)(ncpu > 0 ? ncpu : 1);
    char tokpath[4096];
    char *tokjson = NULL, *mtext = NULL;
    size_t toklen = 0, mlen = 0;
    int rc = pi2_ref_open(&c.m, o->model_dir, err);
    if (rc)
        goto out;
    c.desc = pi2_ref_desc(c.m);
    c.st = pi2_ref_tensors(c.m);
    for (size_t i = 0; i < pi2_st_count(c.st); i++)
        c.bytes_total += pi2_st_at(c.st, i)->nbytes;
    if (!pi2_path_join(tokpath, sizeof tokpath, o->model_dir, "tokenizer.json")) {
        rc = pi2_err_set(err, PI2_ERANGE, "%s: path too long", o->model_dir);
        goto out;
    }
    if ((rc = pi2_read_file(tokpath, 64u << 20, &tokjson, &toklen, err)) != 0 ||
        (rc = pi2_tok_load_mem(&c.tok, tokjson, toklen, tokpath, err)) != 0)
        goto out;
    c.bos = c.desc->bos_id >= 0 ? c.desc->bos_id : pi2_tok_bos(c.tok);
    if (c.bos < 0 || c.bos >= c.desc->vocab) {
        rc = pi2_err_set(err, PI2_EFORMAT, "%s: no usable BOS token for calibration sequences", o->model_dir);
        goto out;
    }
    /* every input checked before the first long stage */
    if ((rc = conv_pred_find(&c, err)) != 0 || (rc = conv_calib_text_load(&c, err)) != 0 ||
        (rc = check_output(&c, err)) != 0)
        goto out;
    if (!(c.mf = pi2_manifest_new())) {
        rc = pi2_err_set(err, PI2_ENOMEM, "out of memory");
        goto out;
    }
    if ((rc = pi2_ctr_writer_create(&c.w, o->out_path, err)) != 0)
        goto out;
    if ((rc = pi2_ctr_writer_add(c.w, "tokenizer.json", tokjson, toklen, err)) != 0 ||
        (rc = keep_chat_template(&c, err)) != 0)
        goto out;
    char family[1024];
    describe_family(&c, family, sizeof family);
    conv_report(&c, "model: %s\n", family);
    /* the calibration run first: its input statistics weigh the 4-bit
     * quantizer (convert_imp.c) */
    if ((rc = conv_calib_run(&c, err)) != 0)
        goto out;
    conv_stage(&c, "quantizing %zu tensors (%.2f GB; ffn %s, other %s)", pi2_st_count(c.st), c.bytes_total / 1e9,
               pi2_q_type_name(o->q_ffn), pi2_q_type_name(o->q_other));
    double t_w = pi2_now();
    if ((rc = conv_write_weights(&c, err)) != 0)
        goto out;
    double t_q = pi2_now() - t_w;
    conv_report(&c, "quantized %zu tensors (ffn %s, attention %s, k, v and o %s, embeddings %s, head %s%s): %.2f GB read "
                "in %.1f s (%.0f MB/s)\n", c.n_tensors, pi2_q_type_name(o->q_ffn), pi2_q_type_name(o->q_other),
                pi2_q_type_name(conv_role_qt(&c, PI2_T_V)), pi2_q_type_name(conv_role_qt(&c, PI2_T_EMBED)), pi2_q_type_name(conv_role_qt(&c, PI2_T_LM_HEAD)),
                c.desc->tie_embeddings ? ", tied" : "", c.bytes_read / 1e9, t_q, t_q > 0 ? c.bytes_read / t_q / 1e6 : 0.0);
    if ((rc = conv_calibrate(&c, err)) != 0)
        goto out;
    conv_stage(&c, "writing %s", o->out_path);
    conv_progress_done(&c);
    size_t ns = 0;
    const pi2_ctr_section *secs = pi2_ctr_writer_sections(c.w, &ns);
    if ((rc = fill_manifest(&c, err)) != 0 || (rc = pi2_manifest_add_sections(c.mf, secs, ns, err)) != 0 ||
        (rc = pi2_manifest_to_json(c.mf, &mtext, &mlen, err)) != 0 ||
        (rc = pi2_ctr_writer_add(c.w, PI2_MF_NAME, mtext, mlen, err)) != 0)
        goto out;
    rc = pi2_ctr_writer_finish(c.w, err);
out:
    conv_progress_done(&c);
    pi2_ctr_writer_free(c.w);
    conv_calib_free(&c);
    conv_pred_close(&c);
    pi2_manifest_free(c.mf);
    pi2_tok_free(c.tok);
    free(c.tensors);
    free(tokjson);
    free(mtext);
    pi2_ref_close(c.m);
    if (need)
        *need = rc ? c.need : PI2_CONVERT_NEED_NOTHING;
    return rc;
}
