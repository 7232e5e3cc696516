/* pi2-run: generate text. Today: the dense fp32 reference path over a raw
 * Hugging Face model directory (--reference). */
#include "formats/tokenizer.h"
#include "runtime/reference.h"
#include "runtime/sample.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: pi2-run --reference HF_DIR [-p TEXT] [-n N] [sampling options]\n"
            "\n"
            "Generate text with the dense fp32 reference forward pass, reading the weights of a\n"
            "Hugging Face model directory (config.json, tokenizer.json, safetensors) in place.\n"
            "Text streams to stdout as it is generated; greedy decoding unless --temp is given.\n"
            "\n"
            "  --reference DIR  Hugging Face model directory to run on the reference path\n"
            "  -p, --prompt T   prompt text (default: empty, generation starts after BOS)\n"
            "  -n, --n-predict N  tokens to generate (default 64); stops earlier at EOS\n"
            "  --temp T         sampling temperature (default 0 = greedy)\n"
            "  --top-k K        keep the K most likely tokens (default 0 = all)\n"
            "  --top-p P        keep the smallest set with probability mass P (default 1)\n"
            "  --seed S         sampling seed (default 1)\n"
            "  --ids            print the prompt and generated token ids to stderr\n"
            "  --stats          print timing and peak memory to stderr at the end\n"
            "  -h, --help       this help\n"
            "\n"
            "example:\n"
            "  pi2-run --reference ../shared/models/tinystories-656k -p \"Once upon a time, there was a\" -n 48\n");
}

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

static int fail(const pi2_err *e)
{
    fprintf(stderr, "pi2-run: %s\n", e->msg);
    return 1;
}

int main(int argc, char **argv)
{
    enum { O_REF = 256, O_TEMP, O_TOPK, O_TOPP, O_SEED, O_STATS, O_IDS };
    static const struct option opts[] = {
        {"reference", required_argument, 0, O_REF}, {"prompt", required_argument, 0, 'p'},
        {"n-predict", required_argument, 0, 'n'},   {"temp", required_argument, 0, O_TEMP},
        {"top-k", required_argument, 0, O_TOPK},    {"top-p", required_argument, 0, O_TOPP},
        {"seed", required_argument, 0, O_SEED},     {"stats", no_argument, 0, O_STATS},
        {"ids", no_argument, 0, O_IDS},             {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    const char *ref = NULL, *prompt = "";
    long long n_predict = 64, v;
    double dv;
    bool stats = false, show_ids = false;
    pi2_sample_opts so = {.temperature = 0, .top_k = 0, .top_p = 1, .seed = 1};
    pi2_err err = {0};
    int c, rc = 0;
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    while (rc == 0 && (c = getopt_long(argc, argv, "p:n:h", opts, NULL)) != -1) {
        switch (c) {
        case O_REF: ref = optarg; break;
        case 'p': prompt = optarg; break;
        case 'n': rc = pi2_parse_int("-n", optarg, 0, 1 << 24, &n_predict, &err); break;
        case O_TEMP: rc = pi2_parse_double("--temp", optarg, 0, 1e4, &dv, &err); so.temperature = (float)dv; break;
        case O_TOPK: rc = pi2_parse_int("--top-k", optarg, 0, 1 << 30, &v, &err); so.top_k = (int)v; break;
        case O_TOPP:
            rc = pi2_parse_double("--top-p", optarg, 1e-9, 1, &dv, &err);
            so.top_p = (float)dv;
            break;
        case O_SEED: rc = pi2_parse_int("--seed", optarg, 0, INT64_MAX, &v, &err); so.seed = (uint64_t)v; break;
        case O_STATS: stats = true; break;
        case O_IDS: show_ids = true; break;
        case 'h': usage(stdout); return 0;
        default: fprintf(stderr, "pi2-run: see --help\n"); return 2;
        }
    }
    if (rc) {
        fail(&err);
        return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "pi2-run: '%s': running a model.pi2 container is not available yet; use --reference HF_DIR\n",
                argv[optind]);
        return 2;
    }
    if (!ref) {
        fprintf(stderr, "pi2-run: --reference HF_DIR is required; see --help\n");
        return 2;
    }

    double t0 = pi2_now();
    pi2_ref_model *m = NULL;
    pi2_ref_state *st = NULL;
    pi2_tok *tok = NULL;
    pi2_tok_stream *ts = NULL;
    pi2_sampler *smp = NULL;
    int32_t *ids = NULL;
    float *logits = NULL;
    size_t n_ids = 0;
    int status = 1;
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
    int bos = d->bos_id >= 0 ? d->bos_id : pi2_tok_bos(tok);
    long long n_ctx = (long long)n_ids + (bos >= 0) + n_predict;
    if (n_ctx > d->max_pos) {
        rc = pi2_err_set(&err, PI2_ERANGE,
                         "prompt (%zu tokens) plus -n %lld exceeds the model's %d positions; use a smaller -n", n_ids,
                         n_predict, d->max_pos);
        goto out;
    }
    if ((rc = pi2_ref_state_create(&st, m, (int)(n_ctx > 0 ? n_ctx : 1), &err)) != 0 ||
        (rc = pi2_sampler_create(&smp, d->vocab, &so, &err)) != 0 ||
        (rc = pi2_tok_stream_create(&ts, tok, true, &err)) != 0)
        goto out;
    logits = pi2_malloc_array((size_t)d->vocab, sizeof *logits);
    as.n_ff = d->n_ff;
    as.share = pi2_calloc_array((size_t)d->n_layers, sizeof *as.share);
    as.evals = pi2_calloc_array((size_t)d->n_layers, sizeof *as.evals);
    if (stats)
        pi2_ref_state_set_hook(st, on_ffn, &as);
    if (!logits || !as.share || !as.evals) {
        rc = pi2_err_set(&err, PI2_ENOMEM, "out of memory for logits");
        goto out;
    }
    if (show_ids) {
        fprintf(stderr, "prompt ids:");
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
    long long n_gen = 0;
    if (show_ids)
        fprintf(stderr, "generated ids:");
    if (pos == 0 && n_predict > 0) { /* no BOS and no prompt: nothing to condition on */
        rc = pi2_err_set(&err, PI2_EINVAL, "empty prompt and the model has no BOS token; give -p TEXT");
        goto out;
    }
    while (n_gen < n_predict) {
        int next = pi2_sampler_next(smp, logits);
        n_gen++;
        if (show_ids)
            fprintf(stderr, " %d", next);
        bool eos = false;
        for (int k = 0; k < d->n_eos; k++)
            eos = eos || next == d->eos_ids[k];
        if (eos)
            break;
        const char *bytes;
        size_t len;
        if ((rc = pi2_tok_stream_push(ts, next, &bytes, &len, &err)) != 0)
            goto out;
        fwrite(bytes, 1, len, stdout);
        fflush(stdout);
        if (n_gen == n_predict)
            break;
        if ((rc = pi2_ref_forward(m, st, next, pos++, logits, &err)) != 0)
            goto out;
    }
    const char *bytes;
    size_t len;
    if ((rc = pi2_tok_stream_flush(ts, &bytes, &len, &err)) != 0)
        goto out;
    fwrite(bytes, 1, len, stdout);
    fputc('\n', stdout);
    fflush(stdout);
    if (show_ids)
        fprintf(stderr, "\n");
    if (stats) {
        double t_gen = pi2_now() - t2;
        int n_pre = (int)n_ids + (bos >= 0);
        fprintf(stderr,
                "load %.3f s | prompt %d tokens in %.3f s (%.1f tok/s) | generated %lld tokens in %.3f s "
                "(%.1f tok/s) | peak RSS %.1f MB\n",
                t_load, n_pre, t_prefill, t_prefill > 0 ? n_pre / t_prefill : 0.0, n_gen, t_gen,
                t_gen > 0 ? n_gen / t_gen : 0.0, pi2_peak_rss() / 1048576.0);
        if (d->act != PI2_ACT_SILU) {
            double mean = 0;
            fprintf(stderr, "FFN neurons active per token:");
            for (int l = 0; l < d->n_layers; l++) {
                double sh = as.evals[l] ? as.share[l] / as.evals[l] : 0.0;
                mean += sh / d->n_layers;
                if (d->n_layers <= 8)
                    fprintf(stderr, " L%d %.1f%%", l, 100 * sh);
            }
            fprintf(stderr, " | mean %.1f%% of %d (%s)\n", 100 * mean, d->n_ff, pi2_act_name(d->act));
        }
    }
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
