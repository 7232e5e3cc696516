/* pi2-run: opening the engine (trust rules, hardware profile, calibration) and its --stats. */
#include "runtime/cli/run.h"
#include "formats/container.h"
#include "formats/manifest.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
void learn(const run_opts *o, pi2_engine *e, double tok_s, size_t tokens)
{
    pi2_engine_offload_info in;
    pi2_engine_offload_info_get(e, &in);
    if (!in.on || !in.plan || tokens < 8 || !o->st->cal_path[0] || pi2_engine_dense(e))
        return;
    pi2_plan_cal_update(&o->st->cal, in.plan, tok_s, (double)in.reads / (double)tokens);
    pi2_err err = {0};
    if (pi2_plan_cal_save(&o->st->cal, o->st->cal_path, &err) != 0 && !o->quiet)
        fprintf(stderr, "pi2-run: could not save the model's calibration: %s\n", err.msg);
}

/* The cached hardware profile for the model's device (--hw-profile FILE, or
 * the default path); *out NULL (not an error) when there is none, noted in
 * o->st->hw_note. A corrupt profile file is an error. */
int load_hw(const run_opts *o, pi2_hwprof **out, pi2_err *err)
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
    if (rc == PI2_ENOTFOUND) { /* none, or not this machine's: the flag that measures one */
        snprintf(o->st->hw_note, sizeof o->st->hw_note, "%s; run pi2-run --profile-hw", e2.msg);
        free(p);
        return 0;
    }
    if (rc) {
        free(p);
        return pi2_err_set(err, rc, "%s; run pi2-run --profile-hw to measure again", e2.msg);
    }
    *out = p;
    return 0;
}

/* Whether the container at path carries a signature: 1 yes, 0 no, -1 it
 * cannot be read as a container. */
static int container_signed(const char *path)
{
    pi2_ctr *c = NULL;
    if (pi2_ctr_open(&c, path, NULL) != 0)
        return -1;
    int s = pi2_ctr_find(c, PI2_MF_SIG_NAME) != NULL;
    pi2_ctr_close(c);
    return s;
}

/* The library says what is wrong with a refused container; the flag that
 * fixes it is the tool's to name. Chosen from the error code and what the
 * container is (signed or not), never from the message's wording. */
void run_flag_hint(const run_opts *o, bool have_key, int rc, pi2_err *err)
{
    int s = (rc == PI2_EINVAL && !have_key) || (rc == PI2_ESIG && !o->trust_unsigned) ? container_signed(o->model) : -1;
    pi2_err fresh = {0};
    if (rc == PI2_EINVAL && !have_key && s == 1)
        *err = fresh, pi2_err_set(err, PI2_EINVAL,
                    "%s is signed: give the signer's public key with --pubkey PUB.pem (or $PI2_PUBKEY, or "
                    "~/.config/pi2/pubkey.pem)",
                    o->model);
    else if (rc == PI2_ESIG && !o->trust_unsigned && s == 0)
        *err = fresh, pi2_err_set(err, PI2_ESIG,
                    "%s is not signed; run it only if you trust where it came from, with --trust-unsigned",
                    o->model);
}

int run_opts_engine(const run_opts *o, int ctx, run_engine_opts *r, pi2_err *err)
{
    memset(r, 0, sizeof *r);
    char where[4096] = "";
    int rc = load_pubkey(o, &r->key, where, sizeof where, err);
    if (rc)
        return rc;
    pi2_engine_opts *eo = &r->eo;
    pi2_engine_defaults(eo);
    eo->path = o->model;
    eo->pubkey = r->key;
    eo->trust_unsigned = o->trust_unsigned;
    eo->verify_ffn = o->verify_ffn;
    eo->threads = o->threads;
    eo->ctx = ctx;
    eo->dense = o->dense;
    eo->kv_f16 = o->kv_f16;
    eo->offload.mem_limit = o->mem_limit;
    eo->offload.hot_share = o->hot_share;
    eo->offload.io_backend = o->io_backend;
    eo->offload.io_depth = o->io_depth;
    eo->offload.lock_hot = !o->no_mlock;
    eo->offload.gate_first = o->gate_first;
    eo->offload.no_read_ahead = o->no_read_ahead;
    eo->offload.attn_stream = o->stream_attn;
    if (o->mem_limit) {
        eo->offload.fixed_split = o->no_plan;
        eo->offload.min_speed = o->min_speed;
        eo->offload.plan_prompt = ctx > 0 ? ctx : 0;
        if (o->plan_file && (rc = pi2_plan_load(o->plan_file, &r->plan, err)) == 0)
            eo->offload.plan = &r->plan;
        if (rc == 0 && (rc = load_hw(o, &r->hw, err)) == 0)
            eo->offload.hw = r->hw;
        if (rc == 0 && r->hw && cal_path(o, o->st->cal_path, sizeof o->st->cal_path)) {
            pi2_err ce = {0};
            int cr = pi2_plan_cal_load(o->st->cal_path, &o->st->cal, &ce);
            if (cr && cr != PI2_ENOTFOUND && !o->quiet)
                fprintf(stderr, "pi2-run: %s (ignored; the next run rewrites it)\n", ce.msg);
            if (cr)
                pi2_plan_cal_defaults(&o->st->cal);
            eo->offload.cal = &o->st->cal;
        }
        if (rc == 0 && !r->hw && o->min_speed > 0)
            rc = pi2_err_set(err, PI2_EINVAL, "--min-speed needs a hardware profile: %s", o->st->hw_note);
    }
    if (rc)
        run_engine_opts_free(r);
    return rc;
}

void run_engine_opts_free(run_engine_opts *r)
{
    free(r->hw);
    pi2_plan_free(&r->plan);
    pi2_sign_key_free(r->key);
    memset(r, 0, sizeof *r);
}

/* A context the offloading engine's memory plan does not hold (PI2_ERANGE
 * from pi2_engine_set_ctx): the flag that plans for it. */
void run_ctx_hint(const run_opts *o, int rc, int ctx, pi2_err *err)
{
    if (rc != PI2_ERANGE || !o->mem_limit)
        return;
    pi2_err in = *err, fresh = {0};
    *err = fresh;
    pi2_err_set(err, rc, "%s; give --ctx %d", in.msg, ctx);
}

int open_engine(const run_opts *o, int ctx, pi2_engine **e, pi2_err *err)
{
    run_engine_opts r;
    int rc = run_opts_engine(o, ctx, &r, err);
    if (rc)
        return rc; /* the error, if any, is not the engine's */
    rc = pi2_engine_open(e, &r.eo, err);
    bool have_key = r.key != NULL;
    run_engine_opts_free(&r);
    if (rc)
        run_flag_hint(o, have_key, rc, err);
    return rc;
}

/* Reads from flash so far (0: all in memory). */
uint64_t reads_so_far(const pi2_engine *e)
{
    pi2_engine_offload_info in;
    pi2_engine_offload_info_get(e, &in);
    return in.reads;
}

/* Reads per token: P50, P90 and the most of v[n] (sorted here). A few
 * tokens whose neurons lie outside the hot set can read several times the
 * mean: the mean alone hides them. */
void reads_pcts(double *v, size_t n, double out[3])
{
    qsort(v, n, sizeof *v, cmp_double);
    out[0] = pct(v, n, 50);
    out[1] = pct(v, n, 90);
    out[2] = n ? v[n - 1] : 0.0;
}

/* The streamed ring (predictors, attention): its bytes read a token. */
static void print_pred_stream(FILE *f, const pi2_engine_offload_info *in, double tok)
{
    char what[96] = "predictors";
    if (!in->pred_stream && in->attn_stream == 0)
        return;
    if (in->attn_stream > 0)
        snprintf(what, sizeof what, "%sthe attention of %d layers", in->pred_stream ? "predictors and " : "",
                 in->attn_stream);
    fprintf(f, "offload: %s streamed a layer at a time: %.2f MB/token read\n", what,
            (double)in->pred_bytes_read / tok / 1e6);
}

void print_stats(const run_opts *o, pi2_engine *e, const gen_stats *g, double t_load, bool changed, FILE *f)
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
    fprintf(f, "threads %d | kernels %s | peak RSS %.1f MB | %s%s\n", pi2_engine_threads(e),
            pi2_k_isa_name(pi2_k_get_isa()), (double)pi2_peak_rss() / 1048576.0, pi2_engine_signature(e),
            changed ? ", changed since verification" : "");
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
            "offload: limit %.1f MB, planned %.1f MB (resident %.0f, KV %.0f, buffers %.0f, hot %.0f, cache %.0f, "
            "files %.1f, overhead %.0f), measured %.0f MB now | %.0f%% of FFN bytes out of memory | reads: %s%s%s\n",
            in.mem_limit / 1048576.0, in.planned / 1048576.0, in.resident / 1048576.0, in.kv / 1048576.0,
            in.buffers / 1048576.0, in.hot / 1048576.0, in.cache / 1048576.0, in.files / 1048576.0,
            in.overhead / 1048576.0,
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
    print_pred_stream(f, &in, tok);
    if (g->n_reads > 0) {
        double rp[3];
        reads_pcts(g->reads, g->n_reads, rp);
        fprintf(f, "offload: reads per token P50 %.0f, P90 %.0f, most %.0f (%zu tokens)\n", rp[0], rp[1], rp[2],
                g->n_reads);
    }
    if (in.plan && !(in.plan->pred.decode_tok_s > 0)) /* a given plan run without a hardware profile */
        fprintf(f, "plan: %s | %d threads, I/O depth %d%s, gates kept for %.0f MB more | not predicted (%s)\n",
                in.plan_source, in.threads, in.io_depth, in.gate_first ? ", gate-first" : "", in.gate_hot / 1048576.0,
                o->st->hw_note[0] ? o->st->hw_note : "no hardware profile");
    else if (in.plan)
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
