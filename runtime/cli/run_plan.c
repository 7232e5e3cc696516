/* pi2-run plan: the memory plan at --mem-limit, as JSON, made from the
 * container (no engine is opened: nothing is allocated for the model and
 * no FFN payload is read); without a limit, the least memory the model
 * runs in and a table of limits up to all in memory. */
#include "runtime/cli/run.h"
#include "bundle/bundle.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The bundle at o->model, opened and its signature checked as the engine
 * does (a converted, not yet bundled model is named as such); its
 * resident members are hashed once the limit is known to hold them
 * (plan_memory). */
static int open_bundle(const run_opts *o, const pi2_engine_opts *eo, pi2_bundle **b, pi2_err *err)
{
    pi2_bundle_open_opts bo = {.pubkey = eo->pubkey, .allow_unsigned = eo->trust_unsigned};
    int rc = pi2_bundle_open(b, o->model, &bo, err);
    return rc ? pi2_bundle_open_failed(o->model, rc, err) : 0;
}

/* The reader the run would open, for its backend's name: opened and
 * closed, nothing read. */
static const char *io_backend(const run_opts *o, const pi2_engine_opts *eo)
{
    pi2_io_opts io;
    pi2_io_defaults(&io);
    io.backend = (pi2_io_backend)eo->offload.io_backend;
    io.depth = pi2_plan_ring_depth(&eo->offload);
    pi2_io *r = NULL;
    pi2_err err = {0};
    if (pi2_io_open(&r, o->model, &io, &err) != 0) { /* no direct I/O here: the documented fallback */
        io.buffered = true;
        pi2_err_clear(&err);
        if (pi2_io_open(&r, o->model, &io, &err) != 0)
            return "none";
    }
    const char *name = pi2_io_backend_name(pi2_io_backend_used(r));
    pi2_io_close(r);
    return name;
}

/* What the memory model reads for the run's options into *in (base: the
 * resident region in the mapping); *threads, *ctx as run. */
static int mem_in(const run_opts *o, const pi2_engine_opts *eo, pi2_bundle *b, pi2_plan_mem_in *in, int *threads,
                  int *ctx, pi2_err *err)
{
    const pi2_manifest *mf = pi2_bundle_manifest(b);
    const pi2_bundle_layout *bl = pi2_bundle_layout_get(b);
    const pi2_ctr *c = pi2_bundle_container(b);
    int t = eo->threads > 0 ? eo->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    *threads = t < 1 ? 1 : t > 256 ? 256 : t;
    int ctx0 = eo->ctx > 0 ? eo->ctx : 512, ctx_max = pi2_desc_max_ctx(&mf->config);
    *ctx = ctx0 < ctx_max ? ctx0 : ctx_max;
    /* the resident region, in the mapping: everything before the first FFN member */
    uint64_t end = UINT64_MAX;
    for (size_t i = 0; i < bl->n_ffn; i++) {
        const pi2_ctr_member *fm = pi2_ctr_find(c, bl->ffn[i].ffn);
        if (!fm)
            return pi2_err_set(err, PI2_ENOTFOUND, "%s: FFN member %s is missing", o->model, bl->ffn[i].ffn);
        end = fm->offset < end ? fm->offset : end;
    }
    const pi2_ctr_member *m0 = pi2_ctr_at(c, 0);
    *in = (pi2_plan_mem_in){.mf = mf, .bl = bl, .name = o->model, .base = m0->data - m0->offset, .base_len = end,
                            .resident = pi2_plan_resident(mf, bl, (uint64_t)sysconf(_SC_PAGESIZE)), .ctx = *ctx,
                            .threads = *threads, .cores = (int)sysconf(_SC_NPROCESSORS_ONLN),
                            .files = pi2_plan_container_touched(c), .opts = &eo->offload};
    return pi2_engine_buffer_sizes(mf, bl, *threads, eo->kv_f16, &in->bufs, err);
}

/* The memory plan for the run's options into *m: the limit checked
 * against the fixed costs first, then the resident members hashed (their
 * pages read), then the plan made. */
static int plan_memory(const run_opts *o, const pi2_engine_opts *eo, pi2_bundle *b, pi2_plan_memory *m,
                       int *threads, int *ctx, pi2_err *err)
{
    pi2_plan_mem_in in;
    int rc = mem_in(o, eo, b, &in, threads, ctx, err);
    if (rc == 0 && (rc = pi2_plan_memory_floor(&in, m, err)) == 0) {
        pi2_plan_memory_free(m);
        rc = pi2_bundle_verify(b, true, NULL, err);
    }
    return rc ? rc : pi2_plan_memory_make(&in, m, err);
}

/* The resident items as a JSON object into buf. */
static void items_json(const pi2_plan_items *it, char *buf, size_t cap)
{
    snprintf(buf, cap,
             "{\"attention\":%llu,\"embeddings_head\":%llu,\"predictors\":%llu,\"predictors_streamed\":%s,"
             "\"norms\":%llu,\"other\":%llu,\"buffers\":%llu,\"kv\":%llu,\"files\":%llu,\"overhead\":%llu,"
             "\"min_cache\":%llu,\"attention_layers_streamed\":%d}",
             (unsigned long long)it->attn, (unsigned long long)it->embed_head, (unsigned long long)it->pred,
             it->pred_streamed ? "true" : "false",
             (unsigned long long)it->norms, (unsigned long long)it->other, (unsigned long long)it->buffers,
             (unsigned long long)it->kv, (unsigned long long)it->files, (unsigned long long)it->overhead,
             (unsigned long long)it->min_cache, it->attn_streamed);
}

/* One limit of the table: the plan made there, as it runs. */
typedef struct limit_row {
    uint64_t limit;
    double offloaded, tok_s; /* tok_s < 0: not predicted */
    const char *source;
} limit_row;

/* The smallest limit from `limit` up (steps of `step`) that plans, and
 * (all) keeps every FFN in memory: into *row; false when none does within
 * 16 steps. */
static bool row_at(pi2_plan_mem_in *in, pi2_offload_opts *oo, uint64_t limit, uint64_t step, bool all,
                   limit_row *row, pi2_plan_items *items)
{
    for (int tries = 0; tries < 16; tries++, limit += step) {
        pi2_plan_memory m;
        pi2_err e = {0};
        oo->mem_limit = limit;
        if (pi2_plan_memory_make(in, &m, &e) != 0)
            continue;
        bool ok = !all || m.offloaded == 0.0;
        if (ok) {
            *row = (limit_row){limit, m.offloaded, m.predicted ? m.plan.pred.decode_tok_s : -1.0, m.source};
            if (items)
                *items = m.items;
        }
        pi2_plan_memory_free(&m);
        if (ok)
            return true;
    }
    return false;
}

/* The table's rows: the minimum, 75/50/25% of FFN bytes out, all in
 * memory; only limits a plan runs in, each above the last. */
static int table_rows(pi2_plan_mem_in *in, pi2_offload_opts *oo, const pi2_plan_memory *fl, limit_row *rows,
                      pi2_plan_items *items)
{
    /* the hot share of what the caches leave past the minimum: all with
     * the solver, hot_share with the fixed split */
    double h = oo->hw && !oo->fixed_split ? 1.0 : oo->hot_share >= 0 && oo->hot_share <= 1 ? oo->hot_share : 0.5;
    uint64_t F = fl->ffn_total, most = fl->resident + fl->kv + fl->buffers + fl->files + pi2_plan_overhead(in->threads, fl->resident + fl->kv + fl->buffers) + F +
                                       fl->min_cache;
    const double kept[3] = {0.25, 0.5, 0.75};
    uint64_t all = most + most / (PI2_PLAN_KERNEL_SHARE - 1) + 1;
    int n = 0;
    if (!row_at(in, oo, fl->least, 1 << 20, false, &rows[n], items))
        return 0;
    n++;
    for (int k = 0; k < 3 && h > 0; k++) {
        uint64_t L = rows[0].limit + (uint64_t)(kept[k] * (double)F / h * 256.0 / 255.0);
        if (L < all && L > rows[n - 1].limit && row_at(in, oo, L, 1 << 20, false, &rows[n], NULL) &&
            rows[n].offloaded > 0 && rows[n].offloaded < rows[n - 1].offloaded)
            n++;
    }
    if (all <= rows[n - 1].limit)
        all = rows[n - 1].limit + 1;
    if (rows[n - 1].offloaded > 0 && row_at(in, oo, all, F / 64 + (1 << 20), true, &rows[n], NULL))
        n++;
    return n;
}

/* pi2-run plan without --mem-limit: the least memory the model runs in,
 * item by item, and a short table of limits from it to all in memory
 * with the plan's predicted decode speed at each (text on stderr, JSON on
 * stdout). Only limits a plan is made for are listed. */
static int plan_table(const run_opts *o, run_engine_opts *r, pi2_bundle *b, pi2_err *err)
{
    pi2_plan_mem_in in;
    pi2_plan_memory fl;
    pi2_offload_opts *oo = &r->eo.offload;
    int threads = 0, ctx = 0;
    oo->mem_limit = UINT64_MAX / 4;
    int rc = mem_in(o, &r->eo, b, &in, &threads, &ctx, err);
    if (rc == 0 && (rc = pi2_plan_memory_floor(&in, &fl, err)) == 0)
        rc = pi2_bundle_verify(b, true, NULL, err);
    if (rc)
        return rc;
    limit_row rows[5];
    pi2_plan_items items = fl.items;
    int n = table_rows(&in, oo, &fl, rows, &items);
    pi2_plan_memory_free(&fl);
    if (n == 0)
        return pi2_err_set(err, PI2_ENOMEM, "%s: no memory limit makes a plan", o->model);
    char line[640], ij[512];
    pi2_plan_items_text(&items, ctx, line, sizeof line);
    items_json(&items, ij, sizeof ij);
    FILE *info = o->quiet ? NULL : stderr; /* the text beside the JSON */
    if (info)
        fprintf(info, "%s: runs in %.1f MB at the least (%s), at %d positions and %d threads\n", o->model,
            (double)rows[0].limit / 1048576.0, line, ctx, threads);
    if (info)
        fprintf(info, "  %10s  %13s  %s\n", "limit", "FFN bytes out", "decode");
    printf("{\"model\":\"%s\",\"ctx\":%d,\"threads\":%d,\"minimum_bytes\":%llu,\"resident_items\":%s,\"limits\":[",
           o->model, ctx, threads, (unsigned long long)rows[0].limit, ij);
    for (int k = 0; k < n; k++) {
        char tok[48] = "null";
        if (rows[k].tok_s >= 0)
            snprintf(tok, sizeof tok, "%.3f", rows[k].tok_s);
        if (info)
            fprintf(info, "  %7.1f MB  %12.0f%%  %s%s\n", (double)rows[k].limit / 1048576.0,
                    100.0 * rows[k].offloaded, rows[k].tok_s >= 0 ? tok : "-", rows[k].tok_s >= 0 ? " tok/s" : "");
        printf("%s{\"mem_limit\":%llu,\"offloaded\":%.4f,\"decode_tok_s\":%s,\"source\":\"%s\"}", k ? "," : "",
               (unsigned long long)rows[k].limit, rows[k].offloaded, tok, rows[k].source);
    }
    bool pred = rows[0].tok_s >= 0;
    if (!pred && info)
        fprintf(info, "no hardware profile: speed not predicted (%s)\n", o->st->hw_note);
    printf("],\"note\":\"%s\"}\n", pred ? "" : "no hardware profile: speed not predicted");
    return 0;
}

/* s as the body of a JSON string into buf (cut to fit): quotes,
 * backslashes and control characters escaped. */
static const char *json_body(const char *s, char *buf, size_t cap)
{
    size_t n = 0;
    for (; *s && n + 7 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            n += (size_t)snprintf(buf + n, cap - n, "\\%c", c);
        else if (c < 0x20)
            n += (size_t)snprintf(buf + n, cap - n, "\\u%04x", c);
        else
            buf[n++] = (char)c;
    }
    buf[n] = 0;
    return buf;
}

/* pi2-run plan (--plan-only): the memory plan for --mem-limit, as one JSON line. */
int run_plan(const run_opts *o)
{
    pi2_err err = {0};
    long long ctx = o->ctx > 0 ? o->ctx
                    : o->bench ? o->bench_pp + o->bench_tg
                               : (long long)strlen(o->prompt) + 4 + o->n_predict;
    run_engine_opts r;
    run_opts ot = *o; /* without a limit: the hardware profile and calibration a limit would load */
    if (!o->mem_limit)
        ot.mem_limit = UINT64_MAX / 4;
    if (run_opts_engine(&ot, (int)(ctx < (1 << 20) ? ctx : 1 << 20), &r, &err) != 0)
        return fail(&err);
    pi2_bundle *b = NULL;
    pi2_plan_memory m = {0};
    int threads = 0, ctx_run = 0, rc = open_bundle(o, &r.eo, &b, &err);
    if (rc)
        run_flag_hint(o, r.key != NULL, rc, &err);
    else if (!o->mem_limit) {
        rc = plan_table(o, &r, b, &err);
        run_engine_opts_free(&r);
        pi2_bundle_close(b);
        return rc ? fail(&err) : 0;
    } else
        rc = plan_memory(o, &r.eo, b, &m, &threads, &ctx_run, &err);
    const char *io = rc ? "" : io_backend(o, &r.eo);
    run_engine_opts_free(&r);
    pi2_bundle_close(b);
    if (rc)
        return fail(&err);
    char items[512], mem[2048], line[640];
    items_json(&m.items, items, sizeof items);
    pi2_plan_items_text(&m.items, ctx_run, line, sizeof line);
    if (!o->quiet)
        fprintf(stderr, "%s: %.0f MB at the least (%s); planned %.0f MB of %.0f MB, %.0f%% of FFN bytes out\n",
                o->model, (double)m.minimum / 1048576.0 + 1, line, (double)m.planned / 1048576.0,
                (double)m.mem_limit / 1048576.0, 100.0 * m.offloaded);
    snprintf(mem, sizeof mem,
             "{\"ctx\":%d,\"threads\":%d,\"mem_limit\":%llu,\"minimum_bytes\":%llu,"
             "\"planned_bytes\":%llu,\"resident_bytes\":%llu,\"kv_bytes\":%llu,\"buffer_bytes\":%llu,"
             "\"overhead_bytes\":%llu,\"hot_bytes\":%llu,\"gate_hot_bytes\":%llu,\"cache_bytes\":%llu,"
             "\"cache_slots\":%u,\"ffn_bytes\":%llu,\"offloaded\":%.4f,\"io\":\"%s\",\"io_depth\":%d,"
             "\"files_bytes\":%llu,\"open_peak_bytes\":%llu,\"resident_items\":%s}",
             ctx_run, threads, (unsigned long long)m.mem_limit, (unsigned long long)m.minimum,
             (unsigned long long)m.planned, (unsigned long long)m.resident, (unsigned long long)m.kv,
             (unsigned long long)m.buffers, (unsigned long long)m.overhead, (unsigned long long)m.hot,
             (unsigned long long)m.gate_hot, (unsigned long long)m.cache, m.slots[0] + m.slots[1],
             (unsigned long long)m.ffn_total, m.offloaded, io, m.plan.io_depth, (unsigned long long)m.files,
             (unsigned long long)m.open_peak, items);
    /* the plan, loadable with --plan, with the memory it makes; without a
     * hardware profile the fixed split, unpredicted, with a note saying so */
    char *pj = pi2_plan_json(&m.plan, o->model);
    if (!pj) {
        pi2_plan_memory_free(&m);
        fprintf(stderr, "pi2-run: out of memory\n");
        return 1;
    }
    size_t n = strlen(pj);
    char note[1024];
    if (m.predicted)
        printf("%.*s,\"source\":\"%s\",\"memory\":%s}\n", (int)(n - 1), pj, m.source, mem);
    else
        printf("%.*s,\"source\":\"%s\",\"note\":\"%s\",\"memory\":%s}\n", (int)(n - 1), pj, m.source,
               json_body(o->st->hw_note, note, sizeof note), mem);
    free(pj);
    pi2_plan_memory_free(&m);
    return 0;
}
