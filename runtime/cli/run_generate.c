/* pi2-run generate: text from the engine, or from the fp32 reference (--reference). */
#include "runtime/cli/run.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The one line for a prompt of n_pre positions (BOS included) that, with
 * -n, does not fit a context of ctx positions (the model holds max): what
 * it needs, what there is, and the flag that helps. */
static int too_long(const run_opts *o, size_t n_pre, int ctx, int max, pi2_err *err)
{
    long long need = (long long)n_pre + o->n_predict;
    if ((long long)n_pre > max)
        return pi2_err_set(err, PI2_ERANGE,
                           "the prompt is %zu tokens, more than the model's context of %d positions: shorten it", n_pre,
                           max);
    if (ctx < max)
        return pi2_err_set(err, PI2_ERANGE,
                           "the prompt (%zu tokens) plus -n %lld needs %lld positions, the context holds %d: raise --ctx "
                           "(the model holds %d)%s",
                           n_pre, o->n_predict, need, ctx, max, need > max ? " and use a smaller -n" : "");
    return pi2_err_set(err, PI2_ERANGE,
                       "the prompt (%zu tokens) plus -n %lld needs %lld positions, the model's context holds %d: use -n %lld "
                       "or less",
                       n_pre, o->n_predict, need, max, max - (long long)n_pre);
}

/* ---------------- reference path ---------------- */

/* Per-layer share of FFN neurons that fire, for --stats. */
typedef struct act_stats {
    int n_ff;
    double *share; /* [layers] */
    long *evals;   /* [layers] */
} act_stats;

static void on_ffn(void *ctx, int layer, int expert, const float *x, const float *act)
{
    act_stats *a = ctx;
    (void)expert;
    (void)x;
    int n = 0;
    for (int i = 0; i < a->n_ff; i++)
        n += act[i] != 0.0f;
    a->share[layer] += (double)n / a->n_ff;
    a->evals[layer]++;
}

typedef struct ref_ctx {
    const pi2_ref_model *m;
    pi2_ref_state *st;
} ref_ctx;

static int ref_step(void *ctx, int32_t token, int pos, float *logits, pi2_err *err)
{
    ref_ctx *r = ctx;
    return pi2_ref_forward(r->m, r->st, token, pos, logits, err);
}

/* --stats of a reference run: times and, for a sparse activation, the
 * share of FFN neurons that fired per layer. */
static void ref_print_stats(const pi2_model_desc *d, const act_stats *as, double t_load, size_t n_prompt,
                            double t_prefill, long long n_gen, double t_gen)
{
    int n_pre = (int)n_prompt;
    fprintf(stderr,
            "load %.3f s | prompt %d tokens in %.3f s (%.1f tok/s) | generated %lld tokens in %.3f s "
            "(%.1f tok/s) | peak RSS %.1f MB\n",
            t_load, n_pre, t_prefill, t_prefill > 0 ? n_pre / t_prefill : 0.0, n_gen, t_gen,
            t_gen > 0 ? n_gen / t_gen : 0.0, pi2_peak_rss() / 1048576.0);
    if (d->act == PI2_ACT_SILU)
        return;
    double mean = 0;
    fprintf(stderr, "FFN neurons active per token:");
    for (int l = 0; l < d->n_layers; l++) {
        double sh = as->evals[l] ? as->share[l] / as->evals[l] : 0.0;
        mean += sh / d->n_layers;
        if (d->n_layers <= 8)
            fprintf(stderr, " L%d %.1f%%", l, 100 * sh);
    }
    fprintf(stderr, " | mean %.1f%% of %d (%s)\n", 100 * mean, d->n_ff, pi2_act_name(d->act));
}

int run_reference(const run_opts *o)
{
    const char *ref = o->ref, *prompt = o->prompt;
    long long n_predict = o->n_predict;
    double t0 = pi2_now();
    pi2_ref_model *m = NULL;
    pi2_ref_state *st = NULL;
    pi2_tok *tok = NULL;
    pi2_tok_stream *ts = NULL;
    pi2_sampler *smp = NULL;
    int32_t *ids = NULL;
    float *logits = NULL;
    size_t n_ids = 0;
    int status = 1, rc;
    pi2_err err = {0};
    act_stats as = {0};
    if ((rc = pi2_ref_open(&m, ref, &err)) != 0)
        goto out;
    const pi2_model_desc *d = pi2_ref_desc(m);
    if ((rc = pi2_tok_load(&tok, ref, &err)) != 0)
        goto out;
    if (pi2_tok_vocab_size(tok) > d->vocab) {
        rc = pi2_err_set(&err, PI2_EFORMAT, "%s: tokenizer has %d tokens but the model's vocabulary is %d", ref,
                         pi2_tok_vocab_size(tok), d->vocab);
        goto out;
    }
    if ((rc = pi2_tok_encode(tok, prompt, strlen(prompt), &ids, &n_ids, &err)) != 0)
        goto out;
    warn_unknown(tok, ids, n_ids);
    int bos = d->bos_id >= 0 ? d->bos_id : pi2_tok_bos(tok);
    long long n_ctx = (long long)n_ids + (bos >= 0) + n_predict;
    if (n_ctx > pi2_desc_max_ctx(d)) {
        rc = too_long(o, n_ids + (bos >= 0), pi2_desc_max_ctx(d), pi2_desc_max_ctx(d), &err);
        goto out;
    }
    if ((rc = pi2_ref_state_create(&st, m, (int)(n_ctx > 0 ? n_ctx : 1), &err)) != 0 ||
        (rc = pi2_sampler_create(&smp, d->vocab, &o->so, &err)) != 0 ||
        (rc = pi2_tok_stream_create(&ts, tok, true, &err)) != 0)
        goto out;
    if (n_ids > 0) /* text after the prompt's: no leading strip */
        pi2_tok_stream_continue(ts);
    logits = pi2_malloc_array((size_t)d->vocab, sizeof *logits);
    as.n_ff = d->n_ff;
    as.share = pi2_calloc_array((size_t)d->n_layers, sizeof *as.share);
    as.evals = pi2_calloc_array((size_t)d->n_layers, sizeof *as.evals);
    if (o->stats)
        pi2_ref_state_set_hook(st, on_ffn, &as);
    if (!logits || !as.share || !as.evals) {
        rc = pi2_err_set(&err, PI2_ENOMEM, "out of memory for logits");
        goto out;
    }
    if (o->show_ids) { /* as the bundle's run prints them: BOS first */
        fprintf(stderr, "prompt ids:");
        if (bos >= 0)
            fprintf(stderr, " %d", bos);
        for (size_t i = 0; i < n_ids; i++)
            fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
    }
    double t_load = pi2_now() - t0, t1 = pi2_now();
    int pos = 0;
    if (bos >= 0 && (rc = pi2_ref_forward(m, st, bos, pos++, logits, &err)) != 0)
        goto out;
    for (size_t i = 0; i < n_ids; i++)
        if ((rc = pi2_ref_forward(m, st, ids[i], pos++, logits, &err)) != 0)
            goto out;
    double t_prefill = pi2_now() - t1, t2 = pi2_now();
    fputs(prompt, stdout);
    fflush(stdout);
    if (pos == 0 && n_predict > 0) { /* no BOS and no prompt: nothing to condition on */
        rc = pi2_err_set(&err, PI2_EINVAL, "empty prompt and the model has no BOS token; give -p TEXT");
        goto out;
    }
    ref_ctx rc_ctx = {m, st};
    size_t n_steps = 0;
    long long n_gen = 0;
    if ((rc = generate_loop(o, d, tok, smp, ts, logits, pos, ref_step, &rc_ctx, NULL, &n_steps, &n_gen, &err)) != 0)
        goto out;
    if (o->stats)
        ref_print_stats(d, &as, t_load, n_ids + (bos >= 0), t_prefill, n_gen, pi2_now() - t2);
    status = 0;
out:
    if (rc)
        fail(&err);
    free(logits);
    free(as.share);
    free(as.evals);
    free(ids);
    pi2_tok_stream_free(ts);
    pi2_sampler_free(smp);
    pi2_tok_free(tok);
    pi2_ref_state_free(st);
    pi2_ref_close(m);
    return status;
}

/* --reference with --ppl FILE: the perplexity of the file's text under
 * the fp32 reference, scored as run_ppl scores the bundle's (the same
 * tokens, the same BOS), so the two lines compare. */
int run_reference_ppl(const run_opts *o)
{
    pi2_ref_model *m = NULL;
    pi2_ref_state *st = NULL;
    pi2_tok *tok = NULL;
    char *text = NULL;
    size_t len = 0;
    int rc, status = 1;
    pi2_err err = {0};
    if ((rc = pi2_read_file(o->ppl, 64u << 20, &text, &len, &err)) != 0 ||
        (rc = pi2_ref_open(&m, o->ref, &err)) != 0 || (rc = pi2_tok_load(&tok, o->ref, &err)) != 0)
        goto out;
    const pi2_model_desc *d = pi2_ref_desc(m);
    long long want = o->ppl_tokens + 1 < pi2_desc_max_ctx(d) ? o->ppl_tokens + 1 : pi2_desc_max_ctx(d);
    if ((rc = pi2_ref_state_create(&st, m, (int)want, &err)) != 0)
        goto out;
    ref_ctx c = {m, st};
    ppl_result r;
    if ((rc = ppl_run(o, d, tok, text, len, (int)want, ref_step, &c, &r, &err)) != 0)
        goto out;
    printf("perplexity %.4f over %zu tokens (fp32 reference; %.1f tok/s)\n", r.ppl, r.scored,
           (double)r.scored / r.secs);
    status = 0;
out:
    if (rc)
        fail(&err);
    free(text);
    pi2_tok_free(tok);
    pi2_ref_state_free(st);
    pi2_ref_close(m);
    return status;
}

/* The engine's step; offloading: each step's reads into g. */
typedef struct eng_step_ctx {
    pi2_engine *e;
    gen_stats *g;
    uint64_t reads; /* counted before this step */
} eng_step_ctx;

static int eng_step(void *ctx, int32_t token, int pos, float *logits, pi2_err *err)
{
    eng_step_ctx *c = ctx;
    int rc = pi2_engine_decode(c->e, token, pos, logits, err);
    if (rc == 0 && c->g->reads) {
        uint64_t now = reads_so_far(c->e);
        c->g->reads[c->g->n_reads++] = (double)(now - c->reads);
        c->reads = now;
    }
    return rc;
}

/* The prompt's ids, BOS first when the model has one (*n_pre of them),
 * with the context sized for them and -n (when --ctx is not given). */
static int prompt_ids(const run_opts *o, pi2_engine *e, int32_t **out, size_t *n_out, pi2_err *err)
{
    const pi2_model_desc *d = pi2_engine_desc(e);
    const pi2_tok *tok = pi2_engine_tokenizer(e);
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int rc = pi2_tok_encode(tok, o->prompt, strlen(o->prompt), &ids, &n_ids, err);
    if (rc)
        return rc;
    warn_unknown(tok, ids, n_ids);
    int bos = d->bos_id >= 0 ? d->bos_id : pi2_tok_bos(tok);
    size_t n_pre = n_ids + (bos >= 0);
    if (n_pre == 0) {
        rc = pi2_err_set(err, PI2_EINVAL, "empty prompt and the model has no BOS token; give -p TEXT");
        goto fail;
    }
    if (o->ctx == 0) { /* the tokenizer lives in the container: size the cache now */
        long long want = (long long)n_pre + o->n_predict;
        if (want > pi2_desc_max_ctx(d))
            want = pi2_desc_max_ctx(d);
        if ((rc = pi2_engine_set_ctx(e, (int)(want > 0 ? want : 1), err)) != 0) {
            run_ctx_hint(o, rc, (int)(want > 0 ? want : 1), err);
            goto fail;
        }
    }
    if ((long long)n_pre + o->n_predict > pi2_engine_ctx(e)) {
        rc = too_long(o, n_pre, pi2_engine_ctx(e), pi2_desc_max_ctx(d), err);
        goto fail;
    }
    int32_t *all = realloc(ids, (n_pre + 1) * sizeof *all);
    if (!all) {
        rc = pi2_err_set(err, PI2_ENOMEM, "out of memory");
        goto fail;
    }
    ids = all;
    if (bos >= 0) {
        memmove(ids + 1, ids, n_ids * sizeof *ids);
        ids[0] = bos;
    }
    *out = ids;
    *n_out = n_pre;
    return 0;
fail:
    free(ids);
    return rc;
}

int run_generate(const run_opts *o)
{
    pi2_err err = {0};
    pi2_engine *e = NULL;
    pi2_tok_stream *ts = NULL;
    pi2_sampler *smp = NULL;
    int32_t *ids = NULL;
    float *logits = NULL;
    size_t n_pre = 0;
    gen_stats g = {0};
    int rc, status = 1;
    double t0 = pi2_now();
    /* offloading plans memory for the KV cache at open: size it from the
     * prompt (a token is at least one byte) and -n rather than the default */
    long long hint = (long long)strlen(o->prompt) + 4 + o->n_predict;
    int ctx = o->ctx > 0 || !o->mem_limit ? o->ctx : (int)(hint < (1 << 20) ? hint : 1 << 20);
    if ((rc = open_engine(o, ctx, &e, &err)) != 0)
        goto out;
    const pi2_model_desc *d = pi2_engine_desc(e);
    const pi2_tok *tok = pi2_engine_tokenizer(e);
    if ((rc = prompt_ids(o, e, &ids, &n_pre, &err)) != 0)
        goto out;
    if ((rc = pi2_sampler_create(&smp, d->vocab, &o->so, &err)) != 0 ||
        (rc = pi2_tok_stream_create(&ts, tok, true, &err)) != 0)
        goto out;
    if (n_pre > (size_t)(d->bos_id >= 0 || pi2_tok_bos(tok) >= 0)) /* text after the prompt's: no leading strip */
        pi2_tok_stream_continue(ts);
    logits = pi2_malloc_array((size_t)d->vocab, sizeof *logits);
    g.lat = pi2_malloc_array((size_t)o->n_predict + 1, sizeof *g.lat);
    bool ofl = o->mem_limit > 0;
    if (ofl)
        g.reads = pi2_malloc_array((size_t)o->n_predict + 1, sizeof *g.reads);
    if (!logits || !g.lat || (ofl && !g.reads)) {
        rc = pi2_err_set(&err, PI2_ENOMEM, "out of memory");
        goto out;
    }
    if (o->show_ids) {
        fprintf(stderr, "prompt ids:");
        for (size_t i = 0; i < n_pre; i++)
            fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
    }
    double t_load = pi2_now() - t0, t1 = pi2_now();
    if ((rc = pi2_engine_prefill(e, ids, (int)n_pre, 0, logits, &err)) != 0)
        goto out;
    g.t_prefill = pi2_now() - t1;
    g.n_prefill = (int)n_pre;
    pi2_engine_stats_reset(e);
    int pos = (int)n_pre;
    fputs(o->prompt, stdout);
    fflush(stdout);
    long long n_sampled = 0;
    eng_step_ctx sc = {e, &g, reads_so_far(e)};
    if ((rc = generate_loop(o, d, tok, smp, ts, logits, pos, eng_step, &sc, g.lat, &g.n_lat, &n_sampled, &err)) != 0)
        goto out;
    if (o->stats) { /* the resident members hashed again: the text came from what was verified, or it is said */
        pi2_err ce = {0};
        bool changed = pi2_engine_recheck(e, &ce) != 0;
        print_stats(o, e, &g, t_load, changed, stderr);
        if (changed) {
            err = ce;
            rc = ce.code;
            goto out;
        }
    }
    {
        double tot = 0;
        for (size_t i = 0; i < g.n_lat; i++)
            tot += g.lat[i];
        if (tot > 0)
            learn(o, e, (double)g.n_lat / tot, g.n_lat);
    }
    status = 0;
out:
    if (rc)
        fail(&err);
    free(g.lat);
    free(g.reads);
    free(logits);
    free(ids);
    pi2_tok_stream_free(ts);
    pi2_sampler_free(smp);
    pi2_engine_close(e);
    return status;
}
