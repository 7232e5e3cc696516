/* pi2-run: what the subcommands share: messages, percentiles, the generation loop. */
#include "runtime/cli/run.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int fail(const pi2_err *e)
{
    fprintf(stderr, "pi2-run: %s\n", e->msg);
    return 1;
}

void warn_unknown(const pi2_tok *tok, const int32_t *ids, size_t n)
{
    int unk = pi2_tok_unk(tok);
    size_t k = 0;
    for (size_t i = 0; unk >= 0 && i < n; i++)
        k += ids[i] == unk;
    if (k > 0)
        fprintf(stderr, "pi2-run: warning: %zu piece%s of the prompt %s outside the vocabulary: the model sees %s\n", k,
                k == 1 ? "" : "s", k == 1 ? "is" : "are", pi2_tok_piece(tok, unk));
}

int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Percentile p (0..100) of sorted v[n], nearest rank. */
double pct(const double *v, size_t n, double p)
{
    if (n == 0)
        return 0.0;
    size_t k = (size_t)ceil(p / 100.0 * (double)n);
    return v[k > 0 ? k - 1 : 0];
}

/* The generation loop shared by both paths: sample from logits (rows
 * past the tokenizer's ids masked: a padded vocabulary's are never valid
 * output), stop at an end of turn (every end-of-turn id the model
 * declares, or BOS: llama2.c-derived models end a story by starting the
 * next) or after n tokens, stream the text UTF-8-safely to stdout, and run
 * the next step. lat[i] (when non-NULL) gets each step's seconds, *n_lat
 * their count; *sampled the number of tokens sampled (the end included). */
int generate_loop(const run_opts *o, const pi2_model_desc *d, const pi2_tok *tok, pi2_sampler *smp,
                         pi2_tok_stream *ts, float *logits, int pos, step_fn step, void *ctx, double *lat,
                         size_t *n_lat, long long *sampled, pi2_err *err)
{
    int rc, n_valid = pi2_tok_vocab_size(tok);
    if (o->show_ids)
        fprintf(stderr, "generated ids:");
    *sampled = 0;
    for (long long n_gen = 0; n_gen < o->n_predict;) {
        pi2_logits_mask_padding(logits, d->vocab, n_valid);
        int next = pi2_sampler_next(smp, logits);
        n_gen++;
        *sampled = n_gen;
        if (o->show_ids)
            fprintf(stderr, " %d", next);
        if (pi2_desc_is_end(d, next))
            break;
        const char *bytes;
        size_t len;
        if ((rc = pi2_tok_stream_push(ts, next, &bytes, &len, err)) != 0)
            return rc;
        fwrite(bytes, 1, len, stdout);
        if (fflush(stdout) != 0 || ferror(stdout)) /* no use generating what cannot be written */
            return pi2_err_errno(err, PI2_EIO, errno, "cannot write to standard output");
        if (n_gen == o->n_predict)
            break;
        double t0 = pi2_now();
        if ((rc = step(ctx, next, pos++, logits, err)) != 0)
            return rc;
        if (lat)
            lat[(*n_lat)++] = pi2_now() - t0;
    }
    const char *bytes;
    size_t len;
    if ((rc = pi2_tok_stream_flush(ts, &bytes, &len, err)) != 0)
        return rc;
    fwrite(bytes, 1, len, stdout);
    fputc('\n', stdout);
    fflush(stdout);
    if (o->show_ids)
        fprintf(stderr, "\n");
    return 0;
}

int ppl_run(const run_opts *o, const pi2_model_desc *d, const pi2_tok *tok, const char *text, size_t len, int max_pos,
            step_fn step, void *ctx, ppl_result *r, pi2_err *err)
{
    int32_t *ids = NULL;
    size_t n_ids = 0;
    float *logits = NULL;
    int rc = pi2_tok_encode(tok, text, len, &ids, &n_ids, err);
    if (rc)
        return rc;
    int32_t bos = d->bos_id >= 0 ? d->bos_id : pi2_tok_bos(tok);
    size_t n = n_ids < (size_t)o->ppl_tokens ? n_ids : (size_t)o->ppl_tokens;
    if (max_pos > 0 && n + 1 > (size_t)max_pos)
        n = (size_t)max_pos - 1;
    int n_valid = pi2_tok_vocab_size(tok);
    if (n_valid <= 0 || n_valid > d->vocab)
        n_valid = d->vocab;
    if (n < 2)
        rc = pi2_err_set(err, PI2_EINVAL, "%s: too little text for a perplexity (%zu tokens)", o->ppl, n_ids);
    else if (!(logits = pi2_malloc_array((size_t)d->vocab, sizeof *logits)))
        rc = pi2_err_set(err, PI2_ENOMEM, "out of memory");
    double nll = 0, t0 = pi2_now();
    int pos = 0;
    int32_t cur = bos >= 0 ? bos : n_ids ? ids[0] : 0;
    r->scored = 0;
    for (size_t i = bos >= 0 ? 0 : 1; rc == 0 && i < n; i++) {
        if ((rc = step(ctx, cur, pos++, logits, err)) != 0)
            break;
        double mx = -INFINITY, s = 0;
        for (int v = 0; v < n_valid; v++)
            mx = logits[v] > mx ? logits[v] : mx;
        for (int v = 0; v < n_valid; v++)
            s += exp((double)logits[v] - mx);
        nll += log(s) + mx - logits[ids[i]];
        r->scored++;
        cur = ids[i];
    }
    r->secs = pi2_now() - t0;
    r->ppl = r->scored ? exp(nll / (double)r->scored) : 0.0;
    free(ids);
    free(logits);
    return rc;
}
