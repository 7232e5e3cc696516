/* pi2-run: generate text with a bundled model.pi2 (the sparse engine), or
 * with the dense fp32 reference over a Hugging Face directory. */
#include "formats/tokenizer.h"
#include "runtime/engine.h"
#include "runtime/hwprof.h"
#include "runtime/io.h"
#include "runtime/kernels.h"
#include "runtime/planner.h"
#include "runtime/reference.h"
#include "runtime/sample.h"

#include <getopt.h>
#include <pthread.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: pi2-run [generate] MODEL.pi2 [-p TEXT] [-n N] [-t N] [sampling options] [--stats]\n"
            "       pi2-run generate --reference HF_DIR [-p TEXT] [-n N] [sampling options]\n"
            "       pi2-run bench MODEL.pi2 [--bench-pp N] [--bench-tg N] [-t N] [--dense]\n"
            "       pi2-run ppl MODEL.pi2 TEXTFILE [--ppl-tokens N] [--dense]\n"
            "       pi2-run plan MODEL.pi2 --mem-limit SIZE [--min-speed X] [--no-plan]\n"
            "       pi2-run probe hw [-t N]\n"
            "       pi2-run probe io FILE\n"
            "       pi2-run probe profile [MODEL.pi2] [--device-path DIR] [--hw-profile FILE] [-t N]\n"
            "(the older forms --bench, --ppl FILE, --plan-only, --hw-probe, --io-probe FILE and\n"
            "--profile-hw select the same subcommands)\n"
            "\n"
            "Generate text with a bundled, signed model (pi2-bundle output). The container is\n"
            "memory-mapped and checked at load: its signature, then the SHA-256 of every member.\n"
            "Prompts run as dense batches; each generated token runs the sparse FFN: the\n"
            "predictor picks the neurons likely to fire and only their weights are read.\n"
            "Text streams to stdout as it is generated; greedy decoding unless --temp is given.\n"
            "\n"
            "  -p, --prompt T     prompt text (default: empty, generation starts after BOS)\n"
            "  -n, --n-predict N  tokens to generate (default 64); stops earlier at an end of turn\n"
            "                     (the model's EOS ids, with its generation and tokenizer configs') or BOS\n"
            "  -t, --threads N    compute threads (default: all cores)\n"
            "  --temp T           sampling temperature (default 0 = greedy)\n"
            "  --top-k K          keep the K most likely tokens (default 0 = all)\n"
            "  --top-p P          keep the smallest set with probability mass P (default 1)\n"
            "  --seed S           sampling seed (default 1)\n"
            "  --dense            exact mode: no predictors, every neuron computed\n"
            "  --pubkey PUB.pem   key the model must be signed with (default: $PI2_PUBKEY,\n"
            "                     else ~/.config/pi2/pubkey.pem when it exists)\n"
            "  --trust-unsigned   run an unsigned container\n"
            "  --no-verify-ffn    hash only the resident members at load, not the FFN payloads\n"
            "  --mem-limit SIZE   offload: keep the whole footprint (RSS plus the page cache it\n"
            "                     causes) under SIZE (e.g. 3G, 512M); FFN weights are read from\n"
            "                     the file with direct I/O into a neuron cache as they are needed\n"
            "  --hot-share F      offload: share of the FFN memory for the hot segment (default 1: all\n"
            "                     but the smallest neuron cache)\n"
            "  --io NAME          offload: reader, auto, uring or pread (default auto)\n"
            "  --io-depth N       offload: reads in flight (default 64)\n"
            "  --no-mlock         offload: do not pin the hot segment (pinned where permitted)\n"
            "  --gate-first       offload, dReLU: read up/down rows only once the gate fired\n"
            "                     (default: in the same read as a missing gate)\n"
            "  --no-read-ahead    offload: do not read the next layer's likely neurons (MoE: experts) during attention\n"
            "  --plan-only        offload: print the plan for --mem-limit (JSON: hot and gate-only\n"
            "                     groups per FFN, threads, I/O depth, memory, predicted speeds) and stop\n"
            "  --plan FILE        offload: run this plan (a saved --plan-only output)\n"
            "  --no-plan          offload: the fixed split (--hot-share, --io-depth), not the planner's\n"
            "  --min-speed X      offload: refuse a --mem-limit whose best plan decodes below X tok/s\n"
            "  --ctx N            KV cache positions (default: prompt + -n)\n"
            "  --isa NAME         force the kernels: scalar, avx2, avx512vnni (default: best)\n"
            "  --stats            print speed, latency percentiles, sparsity and memory to stderr\n"
            "  --ids              print the prompt and generated token ids to stderr\n"
            "  --bench            fixed workload: prompt processing then generation; prints one\n"
            "                     JSON line (like llama-bench -p 128 -n 64)\n"
            "  --bench-pp N       prompt tokens of --bench (default 128)\n"
            "  --bench-tg N       generated tokens of --bench (default 64)\n"
            "  --ppl FILE         perplexity of a text file, token by token on the decode path\n"
            "  --ppl-tokens N     at most N tokens of it (default 512)\n"
            "  --reference DIR    run the dense fp32 reference over a Hugging Face directory\n");
    fprintf(f, /* in two parts: ISO C caps a string literal at 4095 bytes */
            "  --hw-probe         measure int8 dot peak and memory read bandwidth; print JSON\n"
            "  --io-probe FILE    measure direct-read throughput and latency on FILE (random\n"
            "                     reads of 4K..256K at depths 1, 8, 32, and sequential); print JSON\n"
            "  --profile-hw       measure this machine for the planner, under a minute: pi2's kernels\n"
            "                     on 1..-t threads (default: all cores, at most 16) and direct reads of\n"
            "                     a scratch file in --device-path; save to --hw-profile, print JSON\n"
            "  --device-path DIR  the storage to measure: where the models live (default: the\n"
            "                     directory of MODEL.pi2 when given, else .)\n"
            "  --hw-profile FILE  the hardware profile (default: $PI2_HW_PROFILE, else\n"
            "                     ${XDG_CACHE_HOME:-~/.cache}/pi2/hw-<device>.json)\n"
            "  --profile-seconds X  seconds per --profile-hw figure (default: chosen to finish\n"
            "                     under a minute; small values for tests)\n"
            "  -h, --help         this help\n"
            "\n"
            "examples:\n"
            "  pi2-run model.pi2 --pubkey pub.pem -p \"Once upon a time\" -n 48 --stats\n"
            "  pi2-run bench model.pi2 --pubkey pub.pem -t 2\n"
            "  pi2-run model.pi2 --pubkey pub.pem --mem-limit 3G -p \"Once upon a time\" --stats\n"
            "  pi2-run probe profile model.pi2 -t 2\n"
            "  pi2-run plan model.pi2 --pubkey pub.pem --mem-limit 3G --min-speed 5 > plan.json\n"
            "  pi2-run --reference ../shared/models/tinystories-656k -p \"Once upon a time, there was a\" -n 48\n");
}

/* What a run learns on the way, owned by main and reached through run_opts. */
typedef struct run_state {
    char hw_note[4400];   /* why there is no hardware profile (for --stats and plan), or "" */
    pi2_plan_cal cal;     /* the model's learned planning factors */
    char cal_path[4400];  /* and where they live ("": none) */
} run_state;

typedef struct run_opts {
    run_state *st;
    const char *model, *ref, *prompt, *pubkey, *ppl, *io_probe, *device_path, *hw_profile, *plan_file;
    long long n_predict;
    int threads, ctx;
    bool stats, show_ids, dense, trust_unsigned, verify_ffn, bench, hw_probe, no_mlock, plan_only, gate_first;
    bool no_read_ahead;
    bool profile_hw, no_plan;
    double profile_seconds, min_speed;
    uint64_t mem_limit;
    double hot_share;
    int io_backend, io_depth;
    long long bench_pp, bench_tg, ppl_tokens;
    pi2_sample_opts so;
} run_opts;

static int fail(const pi2_err *e)
{
    fprintf(stderr, "pi2-run: %s\n", e->msg);
    return 1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Percentile p (0..100) of sorted v[n], nearest rank. */
static double pct(const double *v, size_t n, double p)
{
    if (n == 0)
        return 0.0;
    size_t k = (size_t)ceil(p / 100.0 * (double)n);
    return v[k > 0 ? k - 1 : 0];
}

/* One forward step of whichever model runs: token at pos -> logits. */
typedef int (*step_fn)(void *ctx, int32_t token, int pos, float *logits, pi2_err *err);

/* The generation loop shared by both paths: sample from logits (rows
 * past the tokenizer's ids masked: a padded vocabulary's are never valid
 * output), stop at an end of turn (every end-of-turn id the model
 * declares, or BOS: llama2.c-derived models end a story by starting the
 * next) or after n tokens, stream the text UTF-8-safely to stdout, and run
 * the next step. lat[i] (when non-NULL) gets each step's seconds, *n_lat
 * their count; *sampled the number of tokens sampled (the end included). */
static int generate_loop(const run_opts *o, const pi2_model_desc *d, const pi2_tok *tok, pi2_sampler *smp,
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
        fflush(stdout);
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

static int run_reference(const run_opts *o)
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
    int bos = d->bos_id >= 0 ? d->bos_id : pi2_tok_bos(tok);
    long long n_ctx = (long long)n_ids + (bos >= 0) + n_predict;
    if (n_ctx > pi2_desc_max_ctx(d)) {
        rc = pi2_err_set(&err, PI2_ERANGE,
                         "prompt (%zu tokens) plus -n %lld exceeds the model's %d positions; use a smaller -n", n_ids,
                         n_predict, pi2_desc_max_ctx(d));
        goto out;
    }
    if ((rc = pi2_ref_state_create(&st, m, (int)(n_ctx > 0 ? n_ctx : 1), &err)) != 0 ||
        (rc = pi2_sampler_create(&smp, d->vocab, &o->so, &err)) != 0 ||
        (rc = pi2_tok_stream_create(&ts, tok, true, &err)) != 0)
        goto out;
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
    if (o->show_ids) {
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
    if (pos == 0 && n_predict > 0) { /* no BOS and no prompt: nothing to condition on */
        rc = pi2_err_set(&err, PI2_EINVAL, "empty prompt and the model has no BOS token; give -p TEXT");
        goto out;
    }
    ref_ctx rc_ctx = {m, st};
    size_t n_steps = 0;
    long long n_gen = 0;
    if ((rc = generate_loop(o, d, tok, smp, ts, logits, pos, ref_step, &rc_ctx, NULL, &n_steps, &n_gen, &err)) != 0)
        goto out;
    if (o->stats) {
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

/* ---------------- engine path ---------------- */

/* The public key: --pubkey, else $PI2_PUBKEY, else ~/.config/pi2/pubkey.pem
 * when it exists; NULL key (not an error) when none is configured. */
static int load_pubkey(const run_opts *o, pi2_sign_key **key, char *where, size_t wn, pi2_err *err)
{
    *key = NULL;
    const char *path = o->pubkey;
    char buf[4096];
    if (!path)
        path = getenv("PI2_PUBKEY");
    if (path && !*path)
        path = NULL;
    if (!path) {
        const char *home = getenv("HOME");
        if (home && snprintf(buf, sizeof buf, "%s/.config/pi2/pubkey.pem", home) < (int)sizeof buf &&
            access(buf, R_OK) == 0)
            path = buf;
    }
    if (!path)
        return 0;
    snprintf(where, wn, "%s", path);
    return pi2_sign_key_load_public(key, path, err);
}


/* Calibration file of this model: next to the hardware profile, named by
 * the container's identity (device, inode, size, mtime), so a rebuilt
 * container starts afresh. */
static bool cal_path(const run_opts *o, char *buf, size_t n)
{
    char hw[4096], dir[4096] = ".";
    pi2_err e = {0};
    struct stat st;
    if (stat(o->model, &st) != 0)
        return false;
    if (o->hw_profile)
        snprintf(hw, sizeof hw, "%s", o->hw_profile);
    else {
        if (o->device_path)
            snprintf(dir, sizeof dir, "%s", o->device_path);
        else if (strrchr(o->model, '/')) {
            snprintf(dir, sizeof dir, "%s", o->model);
            char *slash = strrchr(dir, '/');
            slash[slash == dir] = 0;
        }
        if (pi2_hwprof_default_path(dir, hw, sizeof hw, &e) != 0)
            return false;
    }
    char *slash = strrchr(hw, '/');
    if (slash)
        slash[1] = 0;
    else
        hw[0] = 0;
    return snprintf(buf, n, "%smodel-%llx-%llx-%llx-%llx.json", hw, (unsigned long long)st.st_dev,
                    (unsigned long long)st.st_ino, (unsigned long long)st.st_size,
                    (unsigned long long)st.st_mtime) < (int)n;
}

/* After a run of at least 8 decode tokens under a plan: fold what it
 * measured into the model's factors. */
static void learn(const run_opts *o, pi2_engine *e, double tok_s, size_t tokens)
{
    pi2_engine_offload_info in;
    pi2_engine_offload_info_get(e, &in);
    if (!in.on || !in.plan || tokens < 8 || !o->st->cal_path[0] || pi2_engine_dense(e))
        return;
    pi2_plan_cal_update(&o->st->cal, in.plan, tok_s, (double)in.reads / (double)tokens);
    pi2_err err = {0};
    if (pi2_plan_cal_save(&o->st->cal, o->st->cal_path, &err) != 0)
        fprintf(stderr, "pi2-run: could not save the model's calibration: %s\n", err.msg);
}

/* The cached hardware profile for the model's device (--hw-profile FILE, or
 * the default path); *out NULL (not an error) when there is none, noted in
 * o->st->hw_note. A corrupt profile file is an error. */
static int load_hw(const run_opts *o, pi2_hwprof **out, pi2_err *err)
{
    char dir[4096] = ".";
    *out = NULL;
    o->st->hw_note[0] = 0;
    if (o->device_path)
        snprintf(dir, sizeof dir, "%s", o->device_path);
    else if (strrchr(o->model, '/')) {
        snprintf(dir, sizeof dir, "%s", o->model);
        char *slash = strrchr(dir, '/');
        slash[slash == dir] = 0;
    }
    pi2_hwprof_opts ho = {.threads = o->threads, .device_dir = dir};
    if (ho.threads <= 0 || ho.threads > PI2_HW_MAX_THREADS) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        ho.threads = n < 1 ? 1 : n > PI2_HW_MAX_THREADS ? PI2_HW_MAX_THREADS : (int)n;
    }
    pi2_hwprof *p = malloc(sizeof *p);
    if (!p)
        return pi2_err_set(err, PI2_ENOMEM, "out of memory");
    bool measured = false;
    pi2_err e2 = {0};
    int rc = pi2_hwprof_get(&ho, o->hw_profile, false, p, &measured, &e2);
    if (rc == PI2_ENOTFOUND) {
        snprintf(o->st->hw_note, sizeof o->st->hw_note, "%s", e2.msg);
        free(p);
        return 0;
    }
    if (rc) {
        free(p);
        return pi2_err_set(err, rc, "%s", e2.msg);
    }
    *out = p;
    return 0;
}

static int open_engine(const run_opts *o, int ctx, pi2_engine **e, pi2_err *err)
{
    pi2_sign_key *key = NULL;
    char where[4096] = "";
    int rc = load_pubkey(o, &key, where, sizeof where, err);
    if (rc)
        return rc;
    pi2_engine_opts eo;
    pi2_engine_defaults(&eo);
    eo.path = o->model;
    eo.pubkey = key;
    eo.trust_unsigned = o->trust_unsigned;
    eo.verify_ffn = o->verify_ffn;
    eo.threads = o->threads;
    eo.ctx = ctx;
    eo.dense = o->dense;
    eo.mem_limit = o->mem_limit;
    eo.hot_share = o->hot_share;
    eo.io_backend = o->io_backend;
    eo.io_depth = o->io_depth;
    eo.lock_hot = !o->no_mlock;
    eo.gate_first = o->gate_first;
    eo.no_read_ahead = o->no_read_ahead;
    eo.plan_only = o->plan_only;
    pi2_hwprof *hw = NULL;
    pi2_plan plan = {0};
    if (o->mem_limit) {
        eo.fixed_split = o->no_plan;
        eo.min_speed = o->min_speed;
        eo.plan_prompt = ctx > 0 ? ctx : 0;
        if (o->plan_file && (rc = pi2_plan_load(o->plan_file, &plan, err)) == 0)
            eo.plan = &plan;
        if (rc == 0 && (rc = load_hw(o, &hw, err)) == 0)
            eo.hw = hw;
        if (rc == 0 && hw && cal_path(o, o->st->cal_path, sizeof o->st->cal_path)) {
            pi2_err ce = {0};
            int cr = pi2_plan_cal_load(o->st->cal_path, &o->st->cal, &ce);
            if (cr && cr != PI2_ENOTFOUND)
                fprintf(stderr, "pi2-run: %s (ignored; the next run rewrites it)\n", ce.msg);
            if (cr)
                pi2_plan_cal_defaults(&o->st->cal);
            eo.cal = &o->st->cal;
        }
        if (rc == 0 && !hw && o->min_speed > 0)
            rc = pi2_err_set(err, PI2_EINVAL, "--min-speed needs a hardware profile: %s", o->st->hw_note);
    }
    if (rc == 0)
        rc = pi2_engine_open(e, &eo, err);
    free(hw);
    pi2_plan_free(&plan);
    pi2_sign_key_free(key);
    pi2_err fresh = {0}; /* first error wins: reset before rewording */
    if (rc == PI2_EINVAL && !key && strstr(err->msg, "public key is needed"))
        *err = fresh, pi2_err_set(err, PI2_EINVAL,
                    "%s is signed: give the signer's public key with --pubkey PUB.pem (or $PI2_PUBKEY, or "
                    "~/.config/pi2/pubkey.pem)",
                    o->model);
    else if (rc == PI2_ESIG && strstr(err->msg, "unsigned container"))
        *err = fresh, pi2_err_set(err, PI2_ESIG, "%s is not signed; run it only if you trust where it came from, with "
                                   "--trust-unsigned",
                    o->model);
    return rc;
}

typedef struct gen_stats {
    double *lat; /* per generated token, seconds */
    size_t n_lat;
    double *reads; /* offloading: per generated token, reads from flash */
    size_t n_reads;
    double t_prefill;
    int n_prefill;
} gen_stats;

/* Reads from flash so far (0: all in memory). */
static uint64_t reads_so_far(const pi2_engine *e)
{
    pi2_engine_offload_info in;
    pi2_engine_offload_info_get(e, &in);
    return in.reads;
}

/* Reads per token: P50, P90 and the most of v[n] (sorted here). A few
 * tokens whose neurons lie outside the hot set can read several times the
 * mean: the mean alone hides them. */
static void reads_pcts(double *v, size_t n, double out[3])
{
    qsort(v, n, sizeof *v, cmp_double);
    out[0] = pct(v, n, 50);
    out[1] = pct(v, n, 90);
    out[2] = n ? v[n - 1] : 0.0;
}

static void print_stats(const run_opts *o, pi2_engine *e, const gen_stats *g, double t_load, FILE *f)
{
    pi2_engine_stats st;
    pi2_engine_stats_get(e, &st);
    double tot = 0;
    for (size_t i = 0; i < g->n_lat; i++)
        tot += g->lat[i];
    qsort(g->lat, g->n_lat, sizeof *g->lat, cmp_double);
    double mean = g->n_lat ? tot / (double)g->n_lat : 0.0;
    fprintf(f, "load %.2f s | prefill %d tokens in %.3f s (%.1f tok/s) | decode %zu tokens in %.3f s (%.2f tok/s)\n",
            t_load, g->n_prefill, g->t_prefill, g->t_prefill > 0 ? g->n_prefill / g->t_prefill : 0.0, g->n_lat, tot,
            tot > 0 ? (double)g->n_lat / tot : 0.0);
    fprintf(f, "per-token latency ms: mean %.2f  P50 %.2f  P90 %.2f  P99 %.2f\n", 1e3 * mean,
            1e3 * pct(g->lat, g->n_lat, 50), 1e3 * pct(g->lat, g->n_lat, 90), 1e3 * pct(g->lat, g->n_lat, 99));
    if (st.neurons > 0)
        fprintf(f, "FFN (%s%s): predicted %.1f%% of neurons, active %.1f%% | weights read %.1f MB/token (dense %.1f MB)\n",
                pi2_engine_dense(e) ? "dense" : "sparse, ", pi2_engine_dense(e) ? "" : pi2_engine_sparsity(e),
                100.0 * (double)st.predicted / (double)st.neurons, 100.0 * (double)st.active / (double)st.neurons,
                st.tokens ? (double)st.weight_bytes / (double)st.tokens / 1e6 : 0.0,
                (double)pi2_engine_dense_bytes(e) / 1e6);
    if (st.moe_choices > 0) {
        const pi2_model_desc *d = pi2_engine_desc(e);
        fprintf(f, "experts: %.1f%% of choices repeat the previous token's (chance %.1f%%)",
                100.0 * (double)st.moe_reused / (double)st.moe_choices, 100.0 * d->n_experts_used / d->n_experts);
        if (st.moe_guesses > 0)
            fprintf(f, " | read-ahead guessed %.1f%% of them before attention",
                    100.0 * (double)st.moe_guessed / (double)st.moe_guesses);
        fputc('\n', f);
    }
    fprintf(f, "threads %d | kernels %s | peak RSS %.1f MB | %s\n", pi2_engine_threads(e),
            pi2_q_isa_name(pi2_q_get_isa()), (double)pi2_peak_rss() / 1048576.0, pi2_engine_signature(e));
    pi2_engine_offload_info in;
    pi2_engine_offload_info_get(e, &in);
    if (!in.on) {
        uint64_t mapped, huge;
        bool redone;
        pi2_engine_pages(e, &mapped, &huge, &redone);
        if (mapped > 0)
            fprintf(f, "pages: %.1f MB of the model mapped, %.0f%% in 2 MiB pages%s\n", (double)mapped / 1048576.0,
                    100.0 * (double)huge / (double)mapped,
                    redone ? " (the page cache held it in 4 KiB pages: dropped at load and read again)"
                    : mapped < PI2_ENGINE_REHUGE_MIN ? " (a small model: 4 KiB pages cost it little)"
                                                     : "");
        return;
    }
    double tok = st.tokens ? (double)st.tokens : 1.0;
    fprintf(f,
            "offload: limit %.0f MB, planned %.0f MB (resident %.0f, KV %.0f, buffers %.0f, hot %.0f, cache %.0f, "
            "overhead %.0f), measured %.0f MB now | %.0f%% of FFN bytes out of memory | reads: %s%s%s\n",
            in.mem_limit / 1048576.0, in.planned / 1048576.0, in.resident / 1048576.0, in.kv / 1048576.0,
            in.buffers / 1048576.0, in.hot / 1048576.0, in.cache / 1048576.0, in.overhead / 1048576.0,
            pi2_engine_footprint(e) / 1048576.0, 100.0 * in.offloaded, in.backend, in.note[0] ? ", " : "", in.note);
    double tsum = 0;
    for (size_t i = 0; i < g->n_lat; i++)
        tsum += g->lat[i];
    char prio[64];
    if (in.io_nice)
        snprintf(prio, sizeof prio, "I/O thread priority +%d", in.io_nice);
    else
        snprintf(prio, sizeof prio, "I/O thread priority unchanged");
    fprintf(f,
            "offload: hit rate %.1f%% (hot %.1f%%, cache %.1f%%, read %.1f%% of %.0f neuron parts/token) | read "
            "%.2f MB/token in %.0f reads (%.0f parts read ahead) | I/O wait %.1f%% of decode time | %s%s\n",
            in.parts ? 100.0 * (double)(in.parts_hot + in.parts_hit) / (double)in.parts : 100.0,
            in.parts ? 100.0 * (double)in.parts_hot / (double)in.parts : 0.0,
            in.parts ? 100.0 * (double)in.parts_hit / (double)in.parts : 0.0,
            in.parts ? 100.0 * (double)in.parts_read / (double)in.parts : 0.0, (double)in.parts / tok,
            (double)in.bytes_read / tok / 1e6, (double)in.reads / tok, (double)in.parts_prefetched / tok,
            tsum > 0 ? 100.0 * in.io_wait_s / tsum : 0.0, prio, in.hot_locked ? " | hot segment locked" : "");
    if (g->n_reads > 0) {
        double rp[3];
        reads_pcts(g->reads, g->n_reads, rp);
        fprintf(f, "offload: reads per token P50 %.0f, P90 %.0f, most %.0f (%zu tokens)\n", rp[0], rp[1], rp[2],
                g->n_reads);
    }
    if (in.plan)
        fprintf(f,
                "plan: %s | %d threads, I/O depth %d%s, gates kept for %.0f MB more | predicted %.2f tok/s decode "
                "(%.1f ms: compute %.1f, I/O %.1f, head %.1f), %.0f tok/s prefill, hit rate %.1f%% | cost model "
                "calibrated by %d earlier runs\n",
                in.plan_source, in.threads, in.io_depth, in.gate_first ? ", gate-first" : "", in.gate_hot / 1048576.0,
                in.plan->pred.decode_tok_s, in.plan->pred.decode_ms, in.plan->pred.compute_ms, in.plan->pred.io_ms,
                in.plan->pred.head_ms, in.plan->pred.prefill_tok_s, 100.0 * in.plan->pred.hit_rate, o->st->cal.runs);
    else
        fprintf(f, "plan: fixed split (%s)\n", o->st->hw_note[0] ? o->st->hw_note : "--no-plan");
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

static int run_generate(const run_opts *o)
{
    pi2_err err = {0};
    pi2_engine *e = NULL;
    pi2_tok_stream *ts = NULL;
    pi2_sampler *smp = NULL;
    int32_t *ids = NULL;
    float *logits = NULL;
    size_t n_ids = 0;
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
    if ((rc = pi2_tok_encode(tok, o->prompt, strlen(o->prompt), &ids, &n_ids, &err)) != 0)
        goto out;
    int bos = d->bos_id >= 0 ? d->bos_id : pi2_tok_bos(tok);
    size_t n_pre = n_ids + (bos >= 0);
    if (n_pre == 0) {
        rc = pi2_err_set(&err, PI2_EINVAL, "empty prompt and the model has no BOS token; give -p TEXT");
        goto out;
    }
    if (o->ctx == 0) { /* the tokenizer lives in the container: size the cache now */
        long long want = (long long)n_pre + o->n_predict;
        if (want > pi2_desc_max_ctx(d))
            want = pi2_desc_max_ctx(d);
        if ((rc = pi2_engine_set_ctx(e, (int)(want > 0 ? want : 1), &err)) != 0)
            goto out;
    }
    if ((long long)n_pre + o->n_predict > pi2_engine_ctx(e)) {
        rc = pi2_err_set(&err, PI2_ERANGE, "prompt (%zu tokens) plus -n %lld exceeds the context of %d positions%s",
                         n_pre, o->n_predict, pi2_engine_ctx(e),
                         pi2_engine_ctx(e) < pi2_desc_max_ctx(d) ? "; raise --ctx" : "; use a smaller -n");
        goto out;
    }
    int32_t *all = realloc(ids, (n_pre + 1) * sizeof *all);
    if (!all) {
        rc = pi2_err_set(&err, PI2_ENOMEM, "out of memory");
        goto out;
    }
    ids = all;
    if (bos >= 0) {
        memmove(ids + 1, ids, n_ids * sizeof *ids);
        ids[0] = bos;
    }
    if ((rc = pi2_sampler_create(&smp, d->vocab, &o->so, &err)) != 0 ||
        (rc = pi2_tok_stream_create(&ts, tok, true, &err)) != 0)
        goto out;
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
    if (o->stats)
        print_stats(o, e, &g, t_load, stderr);
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

/* --plan-only: the memory plan for --mem-limit, as one JSON line. */
static int run_plan(const run_opts *o)
{
    pi2_err err = {0};
    pi2_engine *e = NULL;
    if (!o->mem_limit) {
        fprintf(stderr, "pi2-run: plan needs --mem-limit SIZE\n");
        return 2;
    }
    long long ctx = o->ctx > 0 ? o->ctx
                    : o->bench ? o->bench_pp + o->bench_tg
                               : (long long)strlen(o->prompt) + 4 + o->n_predict;
    if (open_engine(o, (int)(ctx < (1 << 20) ? ctx : 1 << 20), &e, &err) != 0)
        return fail(&err);
    pi2_engine_offload_info in;
    pi2_engine_offload_info_get(e, &in);
    char mem[1536];
    snprintf(mem, sizeof mem,
             "{\"ctx\":%d,\"threads\":%d,\"mem_limit\":%llu,\"minimum_bytes\":%llu,"
             "\"planned_bytes\":%llu,\"resident_bytes\":%llu,\"kv_bytes\":%llu,\"buffer_bytes\":%llu,"
             "\"overhead_bytes\":%llu,\"hot_bytes\":%llu,\"gate_hot_bytes\":%llu,\"cache_bytes\":%llu,"
             "\"cache_slots\":%u,\"ffn_bytes\":%llu,\"offloaded\":%.4f,\"io\":\"%s\",\"io_depth\":%d}",
             pi2_engine_ctx(e), pi2_engine_threads(e), (unsigned long long)in.mem_limit, (unsigned long long)in.minimum,
             (unsigned long long)in.planned, (unsigned long long)in.resident, (unsigned long long)in.kv,
             (unsigned long long)in.buffers, (unsigned long long)in.overhead, (unsigned long long)in.hot,
             (unsigned long long)in.gate_hot, (unsigned long long)in.cache, in.cache_slots,
             (unsigned long long)in.ffn_total, in.offloaded, in.backend, in.io_depth);
    if (in.plan) { /* the plan, loadable with --plan, with the memory it makes */
        char *pj = pi2_plan_json(in.plan, o->model);
        if (!pj) {
            pi2_engine_close(e);
            fprintf(stderr, "pi2-run: out of memory\n");
            return 1;
        }
        size_t n = strlen(pj);
        printf("%.*s,\"source\":\"%s\",\"memory\":%s}\n", (int)(n - 1), pj, in.plan_source, mem);
        free(pj);
    } else {
        printf("{\"model\":\"%s\",\"source\":\"%s\",\"note\":\"%s\",\"memory\":%s}\n", o->model, in.plan_source,
               o->st->hw_note, mem);
    }
    pi2_engine_close(e);
    return 0;
}

/* A fixed English text: the --bench prompt (repeated to length). */
static const char bench_text[] =
    "Once upon a time, in a small town by the sea, there lived an old fisherman and his granddaughter. "
    "Every morning they walked to the harbour, mended the nets and talked about the weather, the boats "
    "and the stories the sailors told. One day a storm came from the north and the sky turned dark. ";

static int run_bench(const run_opts *o)
{
    pi2_err err = {0};
    pi2_engine *e = NULL;
    int32_t *ids = NULL, *prompt = NULL;
    float *logits = NULL;
    double *lat = NULL, *rds = NULL;
    size_t n_ids = 0;
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
    if (pi2_engine_ctx(e) < pp + tg && (rc = pi2_engine_set_ctx(e, pp + tg, &err)) != 0)
        goto out;
    const pi2_tok *tok = pi2_engine_tokenizer(e);
    if ((rc = pi2_tok_encode(tok, bench_text, strlen(bench_text), &ids, &n_ids, &err)) != 0)
        goto out;
    prompt = pi2_malloc_array((size_t)pp, sizeof *prompt);
    logits = pi2_malloc_array((size_t)d->vocab, sizeof *logits);
    lat = pi2_malloc_array((size_t)tg + 1, sizeof *lat);
    rds = pi2_malloc_array((size_t)tg + 1, sizeof *rds);
    if (!prompt || !logits || !lat || !rds || n_ids == 0) {
        rc = pi2_err_set(&err, n_ids == 0 ? PI2_EFORMAT : PI2_ENOMEM,
                         n_ids == 0 ? "the tokenizer produced no tokens for the bench text" : "out of memory");
        goto out;
    }
    int bos = d->bos_id >= 0 ? d->bos_id : pi2_tok_bos(tok);
    for (int i = 0; i < pp; i++)
        prompt[i] = i == 0 && bos >= 0 ? bos : ids[(size_t)(i - (bos >= 0)) % n_ids];
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
    if (in.on) {
        double ntok = tg > 0 ? tg : 1, rp[3];
        reads_pcts(rds, (size_t)tg, rp);
        snprintf(ofl, sizeof ofl,
                 ",\"mem_limit\":%llu,\"minimum_bytes\":%llu,\"planned_bytes\":%llu,\"footprint_bytes\":%llu,\"resident_bytes\":%llu,"
                 "\"hot_bytes\":%llu,\"cache_bytes\":%llu,\"ffn_bytes\":%llu,\"offloaded\":%.4f,\"hit_rate\":%.5f,"
                 "\"cache_hit_rate\":%.5f,\"read_bytes_per_token\":%.0f,\"reads_per_token\":%.1f,"
                 "\"read_size\":%.0f,\"io_wait_share\":%.4f,\"io\":\"%s\",\"io_nice\":%d,\"prefill_read_bytes\":%llu,"
                 "\"parts_per_token\":%.0f,\"parts_read_per_token\":%.1f,\"prefetched_per_token\":%.1f,"
                 "\"prefetch_waits_per_token\":%.1f,\"plan\":\"%s\",\"plan_threads\":%d,\"plan_io_depth\":%d,"
                 "\"gate_first\":%s,\"gate_hot_bytes\":%llu,\"predicted_tok_s\":%.3f,\"predicted_hit_rate\":%.4f,"
                 "\"predicted_prefill_tok_s\":%.2f,\"reads_p50\":%.0f,\"reads_p90\":%.0f,\"reads_max\":%.0f",
                 (unsigned long long)in.mem_limit, (unsigned long long)in.minimum, (unsigned long long)in.planned,
                 (unsigned long long)pi2_engine_footprint(e), (unsigned long long)in.resident,
                 (unsigned long long)in.hot, (unsigned long long)in.cache, (unsigned long long)in.ffn_total,
                 in.offloaded, in.parts ? (double)(in.parts_hot + in.parts_hit) / (double)in.parts : 1.0,
                 in.parts > in.parts_hot ? (double)in.parts_hit / (double)(in.parts - in.parts_hot) : 1.0,
                 (double)in.bytes_read / ntok, (double)in.reads / ntok,
                 in.reads ? (double)in.bytes_read / (double)in.reads : 0.0, tot > 0 ? in.io_wait_s / tot : 0.0,
                 in.backend, in.io_nice, (unsigned long long)in.prefill_bytes_read, (double)in.parts / ntok,
                 (double)in.parts_read / ntok, (double)in.parts_prefetched / ntok, (double)in.prefetch_waits / ntok,
                 in.plan_source, in.threads, in.io_depth, in.gate_first ? "true" : "false",
                 (unsigned long long)in.gate_hot, in.plan ? in.plan->pred.decode_tok_s : 0.0,
                 in.plan ? in.plan->pred.hit_rate : 0.0, in.plan ? in.plan->pred.prefill_tok_s : 0.0, rp[0], rp[1],
                 rp[2]);
    }
    if (in.on && tot > 0)
        learn(o, e, tg / tot, (size_t)tg);
    qsort(lat, (size_t)tg, sizeof *lat, cmp_double);
    pi2_engine_stats st;
    pi2_engine_stats_get(e, &st);
    double nn = st.neurons ? (double)st.neurons : 1.0, nt = st.tokens ? (double)st.tokens : 1.0;
    char moe[128] = "";
    if (st.moe_choices > 0)
        snprintf(moe, sizeof moe, ",\"expert_reuse\":%.4f,\"expert_guessed\":%.4f",
                 (double)st.moe_reused / (double)st.moe_choices,
                 st.moe_guesses ? (double)st.moe_guessed / (double)st.moe_guesses : 0.0);
    char pages[96] = "";
    uint64_t mapped, huge;
    bool redone;
    pi2_engine_pages(e, &mapped, &huge, &redone);
    if (mapped > 0) /* all in memory: how much of the mapping has 2 MiB pages */
        snprintf(pages, sizeof pages, ",\"huge_share\":%.4f,\"pages_reread\":%s", (double)huge / (double)mapped,
                 redone ? "true" : "false");
    printf("{\"model\":\"%s\",\"mode\":\"%s\",\"threads\":%d,\"isa\":\"%s\",\"pp\":%d,\"pp_s\":%.6f,"
           "\"pp_tok_s\":%.3f,\"tg\":%d,\"tg_s\":%.6f,\"tg_tok_s\":%.3f,\"tg_ms_mean\":%.3f,\"tg_ms_p50\":%.3f,"
           "\"tg_ms_p90\":%.3f,\"tg_ms_p99\":%.3f,\"predicted_frac\":%.5f,\"active_frac\":%.5f,"
           "\"weight_bytes_per_token\":%.0f,\"kv_bytes_per_token\":%.0f,\"dense_bytes_per_token\":%llu,"
           "\"prefill_macs_per_token\":%.0f,\"load_s\":%.3f,\"peak_rss_mb\":%.1f%s%s%s}\n",
           o->model, pi2_engine_dense(e) ? "dense" : pi2_engine_sparsity(e), pi2_engine_threads(e),
           pi2_q_isa_name(pi2_q_get_isa()), pp, t_pp, pp / t_pp, tg, tot, tg / tot, 1e3 * tot / tg,
           1e3 * pct(lat, (size_t)tg, 50), 1e3 * pct(lat, (size_t)tg, 90), 1e3 * pct(lat, (size_t)tg, 99),
           (double)st.predicted / nn, (double)st.active / nn, (double)st.weight_bytes / nt, (double)st.kv_bytes / nt,
           (unsigned long long)pi2_engine_dense_bytes(e), pi2_engine_prefill_macs(e), t_load,
           (double)pi2_peak_rss() / 1048576.0, ofl, moe, pages);
    status = 0;
out:
    if (rc)
        fail(&err);
    free(ids);
    free(prompt);
    free(logits);
    free(lat);
    free(rds);
    pi2_engine_close(e);
    return status;
}

static int run_ppl(const run_opts *o)
{
    pi2_err err = {0};
    pi2_engine *e = NULL;
    char *text = NULL;
    int32_t *ids = NULL;
    float *logits = NULL;
    size_t len = 0, n_ids = 0;
    int rc, status = 1;
    if ((rc = pi2_read_file(o->ppl, 64u << 20, &text, &len, &err)) != 0)
        goto out;
    if ((rc = open_engine(o, o->ctx > 0 || !o->mem_limit ? o->ctx : (int)o->ppl_tokens + 1, &e, &err)) != 0)
        goto out;
    const pi2_model_desc *d = pi2_engine_desc(e);
    if (o->ctx == 0) {
        long long want = o->ppl_tokens + 1 < pi2_desc_max_ctx(d) ? o->ppl_tokens + 1 : pi2_desc_max_ctx(d);
        if ((rc = pi2_engine_set_ctx(e, (int)want, &err)) != 0)
            goto out;
    }
    const pi2_tok *tok = pi2_engine_tokenizer(e);
    if ((rc = pi2_tok_encode(tok, text, len, &ids, &n_ids, &err)) != 0)
        goto out;
    int bos = d->bos_id >= 0 ? d->bos_id : pi2_tok_bos(tok);
    size_t n = n_ids < (size_t)o->ppl_tokens ? n_ids : (size_t)o->ppl_tokens;
    if (n + 1 > (size_t)pi2_engine_ctx(e))
        n = (size_t)pi2_engine_ctx(e) - 1;
    if (n < 2) {
        rc = pi2_err_set(&err, PI2_EINVAL, "%s: too little text for a perplexity (%zu tokens)", o->ppl, n_ids);
        goto out;
    }
    if (!(logits = pi2_malloc_array((size_t)d->vocab, sizeof *logits))) {
        rc = pi2_err_set(&err, PI2_ENOMEM, "out of memory");
        goto out;
    }
    double nll = 0;
    size_t scored = 0;
    int pos = 0;
    int32_t cur = bos >= 0 ? bos : ids[0];
    size_t first = bos >= 0 ? 0 : 1;
    double t0 = pi2_now();
    int n_valid = pi2_tok_vocab_size(pi2_engine_tokenizer(e)); /* padding rows past it are never output */
    if (n_valid <= 0 || n_valid > d->vocab)
        n_valid = d->vocab;
    for (size_t i = first; i < n; i++) {
        if ((rc = pi2_engine_decode(e, cur, pos++, logits, &err)) != 0)
            goto out;
        double mx = -INFINITY, s = 0;
        for (int v = 0; v < n_valid; v++)
            mx = logits[v] > mx ? logits[v] : mx;
        for (int v = 0; v < n_valid; v++)
            s += exp((double)logits[v] - mx);
        nll += log(s) + mx - logits[ids[i]];
        scored++;
        cur = ids[i];
    }
    double t = pi2_now() - t0;
    pi2_engine_stats st;
    pi2_engine_stats_get(e, &st);
    printf("perplexity %.4f over %zu tokens (%s; predicted %.1f%%, active %.1f%% of FFN neurons; %.1f tok/s)\n",
           exp(nll / (double)scored), scored, pi2_engine_dense(e) ? "dense" : pi2_engine_sparsity(e),
           st.neurons ? 100.0 * (double)st.predicted / (double)st.neurons : 0.0,
           st.neurons ? 100.0 * (double)st.active / (double)st.neurons : 0.0, (double)scored / t);
    status = 0;
out:
    if (rc)
        fail(&err);
    free(text);
    free(ids);
    free(logits);
    pi2_engine_close(e);
    return status;
}

typedef struct probe_job {
    const uint8_t *buf;
    size_t per;
    double fig[256];
    double t0[256], t1[256];
    bool do_peak;
} probe_job;

static void *probe_thread(void *arg);

/* Storage probe on a file (the filesystem that holds the model). */
static int run_io_probe(const run_opts *o)
{
    pi2_io_opts io;
    pi2_io_defaults(&io);
    io.backend = (pi2_io_backend)o->io_backend;
    io.depth = 32;
    pi2_io *r = NULL;
    pi2_err err = {0};
    if (pi2_io_open(&r, o->io_probe, &io, &err))
        return fail(&err);
    static const uint32_t sizes[] = {4096, 8192, 16384, 32768, 65536, 131072, 262144};
    static const int depths[] = {1, 8, 32};
    printf("{\"file\":\"%s\",\"io\":\"%s\",\"random\":[", o->io_probe, pi2_io_backend_name(pi2_io_backend_used(r)));
    int first = 1, rc = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes && !rc; si++)
        for (size_t di = 0; di < sizeof depths / sizeof *depths && !rc; di++) {
            pi2_io_bench_result b;
            if ((rc = pi2_io_bench(r, sizes[si], depths[di], false, 0.25, &b, &err)) != 0)
                break;
            printf("%s{\"size\":%u,\"depth\":%d,\"bytes_per_s\":%.4g,\"iops\":%.4g,\"lat_us\":%.1f,"
                   "\"cpu_us\":%.2f}",
                   first ? "" : ",", sizes[si], depths[di], b.bytes_per_s, b.iops, b.lat_us, b.cpu_us);
            first = 0;
        }
    pi2_io_bench_result sq = {0};
    if (!rc)
        rc = pi2_io_bench(r, 1u << 20, 8, true, 1.0, &sq, &err);
    printf("],\"sequential_bytes_per_s\":%.4g}\n", sq.bytes_per_s);
    pi2_io_close(r);
    if (rc)
        return fail(&err);
    return 0;
}

static int run_hw_probe(const run_opts *o)
{
    int nt = o->threads > 0 ? o->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (nt < 1)
        nt = 1;
    if (nt > 64)
        nt = 64;
    pi2_isa isa = pi2_q_get_isa();
    double peak1 = pi2_k_probe_int8_peak(isa, 0.3);
    size_t per = (size_t)256 << 20;
    uint8_t *buf = malloc(per * (size_t)nt);
    if (!buf) {
        fprintf(stderr, "pi2-run: --hw-probe: out of memory for a %zu MB buffer\n", per * (size_t)nt >> 20);
        return 1;
    }
    /* distinct bytes on every page: pages of one value can be merged into
     * one physical page (same-page merging), whose reads then come from
     * cache and overstate the bandwidth (81 GB/s seen on a ~30 GB/s VM) */
    pi2_rng rng;
    pi2_rng_seed(&rng, 0x9e3779b97f4a7c15ull);
    for (size_t i = 0; i + 8 <= per * (size_t)nt; i += 8) {
        uint64_t v = pi2_rng_u64(&rng);
        memcpy(buf + i, &v, 8);
    }
    probe_job pj = {.buf = buf, .per = per};
    pthread_t th[64];
    struct {
        probe_job *j;
        int i;
    } args[64];
    double bw1 = pi2_k_probe_read_bw(buf, per, 0.5), bw = 0, peak = 0;
    for (int pass = 0; pass < 2; pass++) {
        pj.do_peak = pass == 1;
        for (int i = 0; i < nt; i++) {
            args[i].j = &pj;
            args[i].i = i;
            pthread_create(&th[i], NULL, probe_thread, &args[i]);
        }
        for (int i = 0; i < nt; i++)
            pthread_join(th[i], NULL);
        double rate = pi2_k_probe_combine(pj.fig, pj.t0, pj.t1, nt);
        if (pj.do_peak)
            peak = rate;
        else
            bw = rate;
    }
    printf("{\"isa\":\"%s\",\"threads\":%d,\"int8_macs_per_s_1t\":%.4g,\"int8_macs_per_s\":%.4g,"
           "\"read_bytes_per_s_1t\":%.4g,\"read_bytes_per_s\":%.4g}\n",
           pi2_q_isa_name(isa), nt, peak1, peak, bw1, bw);
    free(buf);
    return 0;
}

static void *probe_thread(void *arg)
{
    struct {
        probe_job *j;
        int i;
    } *a = arg;
    probe_job *j = a->j;
    j->t0[a->i] = pi2_now();
    if (j->do_peak)
        j->fig[a->i] = pi2_k_probe_int8_peak(pi2_q_get_isa(), 0.3);
    else
        j->fig[a->i] = pi2_k_probe_read_bw(j->buf + (size_t)a->i * j->per, j->per, 0.5);
    j->t1[a->i] = pi2_now();
    return NULL;
}

/* Hardware profile for the planner: measure, save where the planner looks
 * (or --hw-profile), print the saved JSON. args: the optional model. */
static int run_profile_hw(const run_opts *o, int nargs, char **args)
{
    if (nargs > 1) {
        fprintf(stderr, "pi2-run: unexpected argument '%s'; see --help\n", args[1]);
        return 2;
    }
    if (o->threads > PI2_HW_MAX_THREADS) {
        fprintf(stderr, "pi2-run: -t %d: --profile-hw measures at most %d threads\n", o->threads, PI2_HW_MAX_THREADS);
        return 2;
    }
    char dir[4096] = ".";
    if (o->device_path) {
        snprintf(dir, sizeof dir, "%s", o->device_path);
    } else if (nargs == 1 && pi2_is_dir(args[0])) {
        snprintf(dir, sizeof dir, "%s", args[0]);
    } else if (nargs == 1 && strrchr(args[0], '/')) {
        snprintf(dir, sizeof dir, "%s", args[0]);
        char *slash = strrchr(dir, '/');
        slash[slash == dir] = 0; /* "/m.pi2" -> "/" */
    }
    pi2_hwprof_opts ho = {.threads = o->threads, .device_dir = dir, .point_seconds = o->profile_seconds,
                          .log = isatty(2) ? stderr : NULL};
    pi2_err err = {0};
    char path[4096];
    char *text = NULL;
    pi2_hwprof *p = malloc(sizeof *p);
    int rc;
    if (!p)
        rc = pi2_err_set(&err, PI2_ENOMEM, "out of memory");
    else if (o->hw_profile)
        rc = snprintf(path, sizeof path, "%s", o->hw_profile) < (int)sizeof path
                 ? 0
                 : pi2_err_set(&err, PI2_ERANGE, "--hw-profile: path too long");
    else
        rc = pi2_hwprof_default_path(dir, path, sizeof path, &err);
    if (rc == 0 && (rc = pi2_hwprof_measure(&ho, p, &err)) == 0 && (rc = pi2_hwprof_save(p, path, &err)) == 0 &&
        (rc = pi2_read_file(path, 1u << 20, &text, NULL, &err)) == 0) {
        fputs(text, stdout);
        fflush(stdout);
        fprintf(stderr, "pi2-run: hardware profile (%.1f s) saved to %s\n", p->seconds, path);
    }
    free(text);
    free(p);
    return rc ? fail(&err) : 0;
}

/* Subcommands, in the order of run_mode. */
typedef enum { RUN_NONE, RUN_GENERATE, RUN_BENCH, RUN_PPL, RUN_PLAN, RUN_PROBE } run_mode;
static const char *const mode_names[] = {"generate", "bench", "ppl", "plan", "probe"};

/* Turn a subcommand and its positional arguments (argv[*optind..]) into the
 * options the older flag forms set: bench = --bench, ppl MODEL TEXT = --ppl
 * TEXT, plan = --plan-only, probe hw|io FILE|profile [MODEL] = --hw-probe,
 * --io-probe FILE, --profile-hw. 0, or the exit status of a usage error. */
static int apply_mode(run_mode mode, run_opts *o, int *argc, char **argv, int *optind_)
{
    int i = *optind_, n = *argc - i;
    switch (mode) {
    case RUN_NONE:
    case RUN_GENERATE: break;
    case RUN_BENCH: o->bench = true; break;
    case RUN_PLAN: o->plan_only = true; break;
    case RUN_PPL:
        if (!o->ppl) {
            if (n < 2) {
                fprintf(stderr, "pi2-run: usage: pi2-run ppl MODEL.pi2 TEXTFILE (see --help)\n");
                return 2;
            }
            o->ppl = argv[i + 1];
            argv[i + 1] = argv[*argc - 1];
            (*argc)--;
        }
        break;
    case RUN_PROBE: {
        const char *kind = n > 0 ? argv[i] : "";
        if (strcmp(kind, "hw") == 0 && n == 1)
            o->hw_probe = true;
        else if (strcmp(kind, "io") == 0 && n == 2)
            o->io_probe = argv[i + 1];
        else if (strcmp(kind, "profile") == 0 && n <= 2)
            o->profile_hw = true;
        else {
            fprintf(stderr, "pi2-run: usage: pi2-run probe hw | io FILE | profile [MODEL.pi2] (see --help)\n");
            return 2;
        }
        (*optind_)++;
        break;
    }
    }
    return 0;
}

int main(int argc, char **argv)
{
    enum {
        O_REF = 256, O_TEMP, O_TOPK, O_TOPP, O_SEED, O_STATS, O_IDS, O_DENSE, O_PUBKEY, O_TRUST, O_NOVERIFY,
        O_CTX, O_ISA, O_BENCH, O_BPP, O_BTG, O_PPL, O_PPLN, O_PROBE, O_MEM, O_HOT, O_IO, O_IODEPTH, O_MLOCK,
        O_IOPROBE, O_PLAN, O_GATEFIRST, O_PROFHW, O_DEVPATH, O_HWPROF, O_PROFSEC, O_PLANFILE, O_NOPLAN, O_MINSPEED,
        O_NORA
    };
    static const struct option opts[] = {
        {"reference", required_argument, 0, O_REF},   {"prompt", required_argument, 0, 'p'},
        {"n-predict", required_argument, 0, 'n'},     {"threads", required_argument, 0, 't'},
        {"temp", required_argument, 0, O_TEMP},       {"top-k", required_argument, 0, O_TOPK},
        {"top-p", required_argument, 0, O_TOPP},      {"seed", required_argument, 0, O_SEED},
        {"stats", no_argument, 0, O_STATS},           {"ids", no_argument, 0, O_IDS},
        {"dense", no_argument, 0, O_DENSE},           {"pubkey", required_argument, 0, O_PUBKEY},
        {"trust-unsigned", no_argument, 0, O_TRUST},  {"no-verify-ffn", no_argument, 0, O_NOVERIFY},
        {"ctx", required_argument, 0, O_CTX},         {"isa", required_argument, 0, O_ISA},
        {"bench", no_argument, 0, O_BENCH},           {"bench-pp", required_argument, 0, O_BPP},
        {"bench-tg", required_argument, 0, O_BTG},    {"ppl", required_argument, 0, O_PPL},
        {"ppl-tokens", required_argument, 0, O_PPLN}, {"hw-probe", no_argument, 0, O_PROBE},
        {"mem-limit", required_argument, 0, O_MEM},   {"hot-share", required_argument, 0, O_HOT},
        {"io", required_argument, 0, O_IO},           {"io-depth", required_argument, 0, O_IODEPTH},
        {"no-mlock", no_argument, 0, O_MLOCK},        {"gate-first", no_argument, 0, O_GATEFIRST},
        {"io-probe", required_argument, 0, O_IOPROBE}, {"no-read-ahead", no_argument, 0, O_NORA},
        {"profile-hw", no_argument, 0, O_PROFHW},     {"device-path", required_argument, 0, O_DEVPATH},
        {"hw-profile", required_argument, 0, O_HWPROF}, {"profile-seconds", required_argument, 0, O_PROFSEC},
        {"plan", required_argument, 0, O_PLANFILE},   {"no-plan", no_argument, 0, O_NOPLAN},
        {"min-speed", required_argument, 0, O_MINSPEED},
        {"plan-only", no_argument, 0, O_PLAN},        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    run_opts o = {.prompt = "", .n_predict = 64, .verify_ffn = true, .bench_pp = 128, .bench_tg = 64,
                  .hot_share = 1.0, .io_depth = 64,
                  .ppl_tokens = 512, .so = {.temperature = 0, .top_k = 0, .top_p = 1, .seed = 1}};
    run_state st = {0};
    o.st = &st;
    long long v;
    double dv;
    pi2_err err = {0};
    int c, rc = 0;
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    /* The subcommand, when given (none: generate, or the mode a flag names). */
    run_mode mode = RUN_NONE;
    for (int i = 0; i < (int)(sizeof mode_names / sizeof *mode_names); i++)
        if (strcmp(argv[1], mode_names[i]) == 0)
            mode = (run_mode)(i + 1);
    if (mode != RUN_NONE) {
        argv[1] = argv[0];
        argv++, argc--;
    }
    while (rc == 0 && (c = getopt_long(argc, argv, "p:n:t:h", opts, NULL)) != -1) {
        switch (c) {
        case O_REF: o.ref = optarg; break;
        case 'p': o.prompt = optarg; break;
        case 'n': rc = pi2_parse_int("-n", optarg, 0, 1 << 24, &o.n_predict, &err); break;
        case 't': rc = pi2_parse_int("-t", optarg, 1, 256, &v, &err); o.threads = (int)v; break;
        case O_TEMP: rc = pi2_parse_double("--temp", optarg, 0, 1e4, &dv, &err); o.so.temperature = (float)dv; break;
        case O_TOPK: rc = pi2_parse_int("--top-k", optarg, 0, 1 << 30, &v, &err); o.so.top_k = (int)v; break;
        case O_TOPP:
            rc = pi2_parse_double("--top-p", optarg, 1e-9, 1, &dv, &err);
            o.so.top_p = (float)dv;
            break;
        case O_SEED: rc = pi2_parse_int("--seed", optarg, 0, INT64_MAX, &v, &err); o.so.seed = (uint64_t)v; break;
        case O_STATS: o.stats = true; break;
        case O_IDS: o.show_ids = true; break;
        case O_DENSE: o.dense = true; break;
        case O_PUBKEY: o.pubkey = optarg; break;
        case O_TRUST: o.trust_unsigned = true; break;
        case O_NOVERIFY: o.verify_ffn = false; break;
        case O_CTX: rc = pi2_parse_int("--ctx", optarg, 1, 1 << 20, &v, &err); o.ctx = (int)v; break;
        case O_ISA: {
            pi2_isa isa = strcmp(optarg, "scalar") == 0 ? PI2_ISA_SCALAR
                          : strcmp(optarg, "avx2") == 0 ? PI2_ISA_AVX2
                          : strcmp(optarg, "avx512vnni") == 0 ? PI2_ISA_AVX512
                                                              : (pi2_isa)-1;
            if ((int)isa < 0)
                rc = pi2_err_set(&err, PI2_EINVAL, "--isa: '%s' is not one of scalar, avx2, avx512vnni", optarg);
            else if (pi2_q_set_isa(isa) != 0)
                rc = pi2_err_set(&err, PI2_EUNSUPPORTED, "--isa %s: this CPU does not support it", optarg);
            break;
        }
        case O_BENCH: o.bench = true; break;
        case O_BPP: rc = pi2_parse_int("--bench-pp", optarg, 1, 1 << 16, &o.bench_pp, &err); break;
        case O_BTG: rc = pi2_parse_int("--bench-tg", optarg, 1, 1 << 16, &o.bench_tg, &err); break;
        case O_PPL: o.ppl = optarg; break;
        case O_PPLN: rc = pi2_parse_int("--ppl-tokens", optarg, 2, 1 << 20, &o.ppl_tokens, &err); break;
        case O_PROBE: o.hw_probe = true; break;
        case O_MEM:
            rc = pi2_parse_size("--mem-limit", optarg, &o.mem_limit, &err);
            if (rc == 0 && o.mem_limit == 0)
                rc = pi2_err_set(&err, PI2_EINVAL, "--mem-limit: give a size above zero, e.g. 3G or 512M");
            break;
        case O_HOT: rc = pi2_parse_double("--hot-share", optarg, 0, 1, &o.hot_share, &err); break;
        case O_IO:
            if (strcmp(optarg, "auto") == 0)
                o.io_backend = 0;
            else if (strcmp(optarg, "uring") == 0)
                o.io_backend = 1;
            else if (strcmp(optarg, "pread") == 0)
                o.io_backend = 2;
            else
                rc = pi2_err_set(&err, PI2_EINVAL, "--io: '%s' is not one of auto, uring, pread", optarg);
            break;
        case O_IODEPTH: rc = pi2_parse_int("--io-depth", optarg, 1, 4096, &v, &err); o.io_depth = (int)v; break;
        case O_MLOCK: o.no_mlock = true; break;
        case O_GATEFIRST: o.gate_first = true; break;
        case O_NORA: o.no_read_ahead = true; break;
        case O_IOPROBE: o.io_probe = optarg; break;
        case O_PLAN: o.plan_only = true; break;
        case O_PROFHW: o.profile_hw = true; break;
        case O_DEVPATH: o.device_path = optarg; break;
        case O_HWPROF: o.hw_profile = optarg; break;
        case O_PROFSEC: rc = pi2_parse_double("--profile-seconds", optarg, 0.001, 60, &o.profile_seconds, &err); break;
        case O_PLANFILE: o.plan_file = optarg; break;
        case O_NOPLAN: o.no_plan = true; break;
        case O_MINSPEED: rc = pi2_parse_double("--min-speed", optarg, 1e-6, 1e9, &o.min_speed, &err); break;
        case 'h': usage(stdout); return 0;
        default: fprintf(stderr, "pi2-run: see --help\n"); return 2;
        }
    }
    if (rc) {
        fail(&err);
        return 2;
    }
    if (mode != RUN_NONE && (rc = apply_mode(mode, &o, &argc, argv, &optind)) != 0)
        return rc;
    if (o.hw_probe)
        return run_hw_probe(&o);
    if (o.profile_hw)
        return run_profile_hw(&o, argc - optind, argv + optind);
    if (o.io_probe)
        return run_io_probe(&o);
    if (optind < argc)
        o.model = argv[optind++];
    if (optind < argc) {
        fprintf(stderr, "pi2-run: unexpected argument '%s'; see --help\n", argv[optind]);
        return 2;
    }
    if (o.ref && o.model) {
        fprintf(stderr, "pi2-run: give either MODEL.pi2 or --reference HF_DIR, not both\n");
        return 2;
    }
    if (o.ref)
        return run_reference(&o);
    if (!o.model) {
        fprintf(stderr, "pi2-run: no model given; usage: pi2-run MODEL.pi2 -p TEXT (see --help)\n");
        return 2;
    }
    if (!o.mem_limit && (o.plan_file || o.no_plan || o.min_speed > 0)) {
        fprintf(stderr, "pi2-run: %s plans offloading: give --mem-limit SIZE too\n",
                o.plan_file ? "--plan" : o.no_plan ? "--no-plan" : "--min-speed");
        return 2;
    }
    if (o.plan_file && o.no_plan) {
        fprintf(stderr, "pi2-run: give either --plan FILE or --no-plan, not both\n");
        return 2;
    }
    if (o.plan_only)
        return run_plan(&o);
    if (o.bench && o.ppl) {
        fprintf(stderr, "pi2-run: --bench and --ppl are separate runs; give one\n");
        return 2;
    }
    if (o.bench)
        return run_bench(&o);
    if (o.ppl)
        return run_ppl(&o);
    return run_generate(&o);
}
