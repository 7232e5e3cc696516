/* pi2-run bench and ppl: the fixed workload and perplexity of a text file. */
#include "runtime/cli/run.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A fixed English text: the --bench prompt (repeated to length). */
static const char bench_text[] =
    "Once upon a time, in a small town by the sea, there lived an old fisherman and his granddaughter. "
    "Every morning they walked to the harbour, mended the nets and talked about the weather, the boats "
    "and the stories the sailors told. One day a storm came from the north and the sky turned dark. ";

/* The offloading fields of the bench JSON (in: the engine's offload
 * info; rds: the bytes read at each of the tg decode steps, tot seconds). */
static void offload_fields(const pi2_engine *e, const pi2_engine_offload_info *in, double *rds, int tg, double tot,
                           char *buf, size_t cap)
{
    double ntok = tg > 0 ? tg : 1, rp[3];
    reads_pcts(rds, (size_t)tg, rp);
    snprintf(buf, cap,
             ",\"mem_limit\":%llu,\"minimum_bytes\":%llu,\"planned_bytes\":%llu,\"footprint_bytes\":%llu,\"resident_bytes\":%llu,"
             "\"hot_bytes\":%llu,\"cache_bytes\":%llu,\"ffn_bytes\":%llu,\"offloaded\":%.4f,\"hit_rate\":%.5f,"
             "\"cache_hit_rate\":%.5f,\"read_bytes_per_token\":%.0f,\"reads_per_token\":%.1f,"
             "\"read_size\":%.0f,\"io_wait_share\":%.4f,\"io\":\"%s\",\"io_nice\":%d,\"prefill_read_bytes\":%llu,"
             "\"parts_per_token\":%.0f,\"parts_read_per_token\":%.1f,\"prefetched_per_token\":%.1f,"
             "\"prefetch_waits_per_token\":%.1f,\"plan\":\"%s\",\"plan_threads\":%d,\"plan_io_depth\":%d,"
             "\"gate_first\":%s,\"gate_hot_bytes\":%llu,\"predicted_tok_s\":%.3f,\"predicted_hit_rate\":%.4f,"
             "\"predicted_prefill_tok_s\":%.2f,\"reads_p50\":%.0f,\"reads_p90\":%.0f,\"reads_max\":%.0f",
             (unsigned long long)in->mem_limit, (unsigned long long)in->minimum, (unsigned long long)in->planned,
             (unsigned long long)pi2_engine_footprint(e), (unsigned long long)in->resident,
             (unsigned long long)in->hot, (unsigned long long)in->cache, (unsigned long long)in->ffn_total,
             in->offloaded, in->parts ? (double)(in->parts_hot + in->parts_hit) / (double)in->parts : 1.0,
             in->parts > in->parts_hot ? (double)in->parts_hit / (double)(in->parts - in->parts_hot) : 1.0,
             (double)in->bytes_read / ntok, (double)in->reads / ntok,
             in->reads ? (double)in->bytes_read / (double)in->reads : 0.0, tot > 0 ? in->io_wait_s / tot : 0.0,
             in->backend, in->io_nice, (unsigned long long)in->prefill_bytes_read, (double)in->parts / ntok,
             (double)in->parts_read / ntok, (double)in->parts_prefetched / ntok, (double)in->prefetch_waits / ntok,
             in->plan_source, in->threads, in->io_depth, in->gate_first ? "true" : "false",
             (unsigned long long)in->gate_hot, in->plan ? in->plan->pred.decode_tok_s : 0.0,
             in->plan ? in->plan->pred.hit_rate : 0.0, in->plan ? in->plan->pred.prefill_tok_s : 0.0, rp[0], rp[1],
             rp[2]);
}

/* The bench JSON's optional fields: expert reuse (MoE) and, all in
 * memory, the share of the mapping on 2 MiB pages. */
static void extra_fields(const pi2_engine *e, const pi2_engine_stats *st, char *moe, size_t mcap, char *pages,
                         size_t pcap)
{
    moe[0] = 0;
    if (st->moe_choices > 0)
        snprintf(moe, mcap, ",\"expert_reuse\":%.4f,\"expert_guessed\":%.4f",
                 (double)st->moe_reused / (double)st->moe_choices,
                 st->moe_guesses ? (double)st->moe_guessed / (double)st->moe_guesses : 0.0);
    pages[0] = 0;
    uint64_t mapped, huge;
    bool redone;
    pi2_engine_pages(e, &mapped, &huge, &redone);
    if (mapped > 0) /* all in memory: how much of the mapping has 2 MiB pages */
        snprintf(pages, pcap, ",\"huge_share\":%.4f,\"pages_reread\":%s", (double)huge / (double)mapped,
                 redone ? "true" : "false");
}

/* The bench prompt: BOS (when the model has one), then the bench text's
 * tokens repeated to pp tokens. */
static int bench_prompt(pi2_engine *e, int pp, int32_t **out, pi2_err *err)
{
    const pi2_model_desc *d = pi2_engine_desc(e);
    const pi2_tok *tok = pi2_engine_tokenizer(e);
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int rc = pi2_tok_encode(tok, bench_text, strlen(bench_text), &ids, &n_ids, err);
    if (rc)
        return rc;
    int32_t *prompt = pi2_malloc_array((size_t)pp, sizeof *prompt);
    if (!prompt || n_ids == 0) {
        free(ids);
        free(prompt);
        return pi2_err_set(err, n_ids == 0 ? PI2_EFORMAT : PI2_ENOMEM,
                           n_ids == 0 ? "the tokenizer produced no tokens for the bench text" : "out of memory");
    }
    int bos = d->bos_id >= 0 ? d->bos_id : pi2_tok_bos(tok);
    for (int i = 0; i < pp; i++)
        prompt[i] = i == 0 && bos >= 0 ? bos : ids[(size_t)(i - (bos >= 0)) % n_ids];
    free(ids);
    *out = prompt;
    return 0;
}

int run_bench(const run_opts *o)
{
    pi2_err err = {0};
    pi2_engine *e = NULL;
    int32_t *prompt = NULL;
    float *logits = NULL;
    double *lat = NULL, *rds = NULL;
    int rc, status = 1;
    int pp = (int)o->bench_pp, tg = (int)o->bench_tg;
    double t0 = pi2_now();
    if ((rc = open_engine(o, o->ctx > 0 || !o->mem_limit ? o->ctx : pp + tg, &e, &err)) != 0)
        goto out;
    double t_load = pi2_now() - t0;
    const pi2_model_desc *d = pi2_engine_desc(e);
    if (pp + tg > pi2_desc_max_ctx(d)) {
        rc = pi2_err_set(&err, PI2_ERANGE, "--bench-pp %d plus --bench-tg %d exceeds the model's %d positions", pp, tg,
                         pi2_desc_max_ctx(d));
        goto out;
    }
    if (pi2_engine_ctx(e) < pp + tg && (rc = pi2_engine_set_ctx(e, pp + tg, &err)) != 0) {
        run_ctx_hint(o, rc, pp + tg, &err);
        goto out;
    }
    const pi2_tok *tok = pi2_engine_tokenizer(e);
    logits = pi2_malloc_array((size_t)d->vocab, sizeof *logits);
    lat = pi2_malloc_array((size_t)tg + 1, sizeof *lat);
    rds = pi2_malloc_array((size_t)tg + 1, sizeof *rds);
    if (!logits || !lat || !rds) {
        rc = pi2_err_set(&err, PI2_ENOMEM, "out of memory");
        goto out;
    }
    if ((rc = bench_prompt(e, pp, &prompt, &err)) != 0)
        goto out;
    /* warm-up: one short prefill and decode (page cache, pool, branch predictors) */
    if ((rc = pi2_engine_prefill(e, prompt, pp < 8 ? pp : 8, 0, logits, &err)) != 0)
        goto out;
    double t1 = pi2_now();
    if ((rc = pi2_engine_prefill(e, prompt, pp, 0, logits, &err)) != 0)
        goto out;
    double t_pp = pi2_now() - t1;
    pi2_engine_stats_reset(e);
    int n_valid = pi2_tok_vocab_size(tok); /* a padded vocabulary's rows past it are never output */
    int next = pi2_argmax(logits, n_valid);
    double tot = 0;
    uint64_t r0 = reads_so_far(e);
    for (int i = 0; i < tg; i++) {
        double s = pi2_now();
        if ((rc = pi2_engine_decode(e, next, pp + i, logits, &err)) != 0)
            goto out;
        lat[i] = pi2_now() - s;
        tot += lat[i];
        uint64_t r1 = reads_so_far(e);
        rds[i] = (double)(r1 - r0);
        r0 = r1;
        next = pi2_argmax(logits, n_valid);
    }
    pi2_engine_offload_info in;
    pi2_engine_offload_info_get(e, &in);
    char ofl[2048] = "";
    if (in.on)
        offload_fields(e, &in, rds, tg, tot, ofl, sizeof ofl);
    if (in.on && tot > 0)
        learn(o, e, tg / tot, (size_t)tg);
    qsort(lat, (size_t)tg, sizeof *lat, cmp_double);
    pi2_engine_stats st;
    pi2_engine_stats_get(e, &st);
    double nn = st.neurons ? (double)st.neurons : 1.0, nt = st.tokens ? (double)st.tokens : 1.0;
    char moe[128], pages[96];
    extra_fields(e, &st, moe, sizeof moe, pages, sizeof pages);
    printf("{\"model\":\"%s\",\"mode\":\"%s\",\"threads\":%d,\"isa\":\"%s\",\"pp\":%d,\"pp_s\":%.6f,"
           "\"pp_tok_s\":%.3f,\"tg\":%d,\"tg_s\":%.6f,\"tg_tok_s\":%.3f,\"tg_ms_mean\":%.3f,\"tg_ms_p50\":%.3f,"
           "\"tg_ms_p90\":%.3f,\"tg_ms_p99\":%.3f,\"predicted_frac\":%.5f,\"active_frac\":%.5f,"
           "\"weight_bytes_per_token\":%.0f,\"kv_bytes_per_token\":%.0f,\"dense_bytes_per_token\":%llu,"
           "\"prefill_macs_per_token\":%.0f,\"load_s\":%.3f,\"peak_rss_mb\":%.1f%s%s%s}\n",
           o->model, pi2_engine_dense(e) ? "dense" : pi2_engine_sparsity(e), pi2_engine_threads(e),
           pi2_k_isa_name(pi2_k_get_isa()), pp, t_pp, pp / t_pp, tg, tot, tg / tot, 1e3 * tot / tg,
           1e3 * pct(lat, (size_t)tg, 50), 1e3 * pct(lat, (size_t)tg, 90), 1e3 * pct(lat, (size_t)tg, 99),
           (double)st.predicted / nn, (double)st.active / nn, (double)st.weight_bytes / nt, (double)st.kv_bytes / nt,
           (unsigned long long)pi2_engine_dense_bytes(e), pi2_engine_prefill_macs(e), t_load,
           (double)pi2_peak_rss() / 1048576.0, ofl, moe, pages);
    /* the summary as llama-bench users read it, beside the JSON line */
    const char *mode = pi2_engine_dense(e) ? "dense" : pi2_engine_sparsity(e);
    fprintf(stderr, "| model | mode | threads | test | t/s |\n|---|---|---:|---:|---:|\n");
    fprintf(stderr, "| %s | %s | %d | pp%d | %.2f |\n", o->model, mode, pi2_engine_threads(e), pp, pp / t_pp);
    fprintf(stderr, "| %s | %s | %d | tg%d | %.2f |\n", o->model, mode, pi2_engine_threads(e), tg, tg / tot);
    status = 0;
out:
    if (rc)
        fail(&err);
    free(prompt);
    free(logits);
    free(lat);
    free(rds);
    pi2_engine_close(e);
    return status;
}

static int ppl_step(void *ctx, int32_t token, int pos, float *logits, pi2_err *err)
{
    return pi2_engine_decode(ctx, token, pos, logits, err);
}

int run_ppl(const run_opts *o)
{
    pi2_err err = {0};
    pi2_engine *e = NULL;
    char *text = NULL;
    size_t len = 0;
    int rc, status = 1;
    if ((rc = pi2_read_file(o->ppl, 64u << 20, &text, &len, &err)) != 0)
        goto out;
    if ((rc = open_engine(o, o->ctx > 0 || !o->mem_limit ? o->ctx : (int)o->ppl_tokens + 1, &e, &err)) != 0)
        goto out;
    const pi2_model_desc *d = pi2_engine_desc(e);
    if (o->ctx == 0) {
        long long want = o->ppl_tokens + 1 < pi2_desc_max_ctx(d) ? o->ppl_tokens + 1 : pi2_desc_max_ctx(d);
        if ((rc = pi2_engine_set_ctx(e, (int)want, &err)) != 0) {
            run_ctx_hint(o, rc, (int)want, &err);
            goto out;
        }
    }
    ppl_result r;
    if ((rc = ppl_run(o, d, pi2_engine_tokenizer(e), text, len, pi2_engine_ctx(e), ppl_step, e, &r, &err)) != 0)
        goto out;
    pi2_engine_stats st;
    pi2_engine_stats_get(e, &st);
    printf("perplexity %.4f over %zu tokens (%s; predicted %.1f%%, active %.1f%% of FFN neurons; %.1f tok/s)\n",
           r.ppl, r.scored, pi2_engine_dense(e) ? "dense" : pi2_engine_sparsity(e),
           st.neurons ? 100.0 * (double)st.predicted / (double)st.neurons : 0.0,
           st.neurons ? 100.0 * (double)st.active / (double)st.neurons : 0.0, (double)r.scored / r.secs);
    status = 0;
out:
    if (rc)
        fail(&err);
    free(text);
    pi2_engine_close(e);
    return status;
}
