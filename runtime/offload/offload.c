/* pi2 engine: flash offloading (design: runtime/offload/offload.h). */
#include "runtime/offload/offload.h"
#include "runtime/offload/ofl_state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* What the plan left to the steps after it. */
typedef struct ofl_sizes {
    uint64_t hot_total; /* hot segments and kept gates, bytes */
    uint64_t fixed;     /* everything but the FFN weights, bytes */
    uint64_t index;     /* the caches' indexes, bytes (counted with the buffers) */
    int kind;           /* the first cache's part: P_FULL or P_GATE */
    uint32_t slots[2];  /* cache slots: whole neurons or gates, then up+down */
    uint32_t max_sel;   /* most neurons a decode job selects */
} ofl_sizes;

/* The open's steps around the memory plan (eng_ofl_open; defined after it). */
static int ofl_tables(pi2_engine *e, const pi2_engine_opts *o, eng_ofl *x, pi2_err *err);
static int ofl_bind_ffns(pi2_engine *e, eng_ofl *x, pi2_err *err);
static uint32_t ofl_take_buffers(pi2_engine *e, eng_ofl *x);
static void ofl_take_plan(eng_ofl *x, pi2_plan_memory *m);
static void ofl_report_plan(const pi2_engine *e, eng_ofl *x, const pi2_plan_memory *m);
static int ofl_load_hot(pi2_engine *e, const pi2_engine_opts *o, eng_ofl *x, uint64_t hot_total, pi2_err *err);
static int ofl_make_caches(eng_ofl *x, const ofl_sizes *z, pi2_err *err);
static int ofl_alloc_job(pi2_engine *e, eng_ofl *x, uint32_t max_sel, pi2_err *err);
static void ofl_register_buffers(eng_ofl *x);
static int ofl_start_io(pi2_engine *e, eng_ofl *x, pi2_err *err);

/* ---------------- sequential reads (start-up) ---------------- */

/* Read [off, off+len) into dst (4096-aligned, len a multiple of 4096), up to
 * OFL_SEQ_DEPTH reads of OFL_SEQ_REQ in flight. With sha non-NULL, dst is
 * NULL and the bytes are hashed in order through a ring of buffers. */
int ofl_seq_read(pi2_io *io, int depth, uint8_t *dst, uint64_t off, uint64_t len, pi2_sha256_ctx *sha,
                    pi2_err *err)
{
    enum { Q = OFL_SEQ_DEPTH };
    int maxq = depth < Q ? depth : Q;
    pi2_io_req req[Q];
    uint8_t *ring = NULL;
    bool done[Q] = {false};
    uint64_t n_chunks = (len + OFL_SEQ_REQ - 1) / OFL_SEQ_REQ, next = 0, hashed = 0;
    int inflight = 0, rc = 0;
    if (sha && !(ring = pi2_io_alloc_buf((size_t)Q * OFL_SEQ_REQ)))
        return pi2_err_set(err, PI2_ENOMEM, "out of memory for read buffers");
    while ((next < n_chunks && rc == 0) || inflight > 0) {
        while (rc == 0 && next < n_chunks && inflight < maxq && (!sha || next < hashed + Q)) {
            pi2_io_req *r = &req[next % Q];
            uint64_t at = next * OFL_SEQ_REQ;
            *r = (pi2_io_req){.off = off + at, .len = (uint32_t)(len - at < OFL_SEQ_REQ ? len - at : OFL_SEQ_REQ),
                              .buf = sha ? ring + (next % Q) * (size_t)OFL_SEQ_REQ : dst + at,
                              .user = (void *)(uintptr_t)next};
            if ((rc = pi2_io_submit(io, &r, 1, err)) != 0)
                break;
            next++;
            inflight++;
        }
        if (inflight == 0)
            break;
        pi2_io_req *d[Q];
        pi2_err we = {0};
        int n = pi2_io_wait(io, 1, d, Q, &we);
        if (n < 0 && rc == 0)
            rc = pi2_err_set(err, we.code ? we.code : PI2_EIO, "%s", we.msg);
        for (int i = 0; i < (n > 0 ? n : 0); i++) {
            inflight--;
            if (d[i]->result < 0 && rc == 0)
                rc = pi2_err_set(err, we.code ? we.code : PI2_EIO, "%s", we.msg);
            done[(uintptr_t)d[i]->user % Q] = true;
        }
        while (sha && rc == 0 && hashed < next && done[hashed % Q]) {
            done[hashed % Q] = false;
            pi2_io_req *r = &req[hashed % Q];
            if ((rc = pi2_sha256_update(sha, r->buf, r->len, err)) != 0)
                break;
            hashed++;
        }
        if (n < 0)
            break;
    }
    pi2_io_free_buf(ring);
    return rc;
}

static int open_reader(pi2_engine *e, const pi2_engine_opts *o, eng_ofl *x, pi2_err *err)
{
    pi2_io_opts io;
    pi2_io_defaults(&io);
    io.backend = x->io_backend = (pi2_io_backend)o->offload.io_backend;
    x->depth = o->offload.io_depth > 0 ? o->offload.io_depth : 64; /* the start-up reads' */
    io.depth = x->ring_depth = pi2_plan_ring_depth(&o->offload); /* what the plan may pick */
    int rc = pi2_io_open(&x->io, e->path, &io, err);
    if (rc && strstr(err->msg, "O_DIRECT")) { /* tmpfs and friends: documented fallback */
        pi2_err_clear(err);
        io.buffered = x->buffered = true;
        if ((rc = pi2_io_open(&x->io, e->path, &io, err)) == 0)
            snprintf(x->note, sizeof x->note, "no direct I/O on this filesystem: buffered reads (page cache not bounded)");
    }
    if (rc)
        return rc;
    if (!x->note[0])
        snprintf(x->note, sizeof x->note, "%s", pi2_io_backend_note(x->io));
    return 0;
}

int eng_ofl_load_resident(pi2_engine *e, const pi2_engine_opts *o, pi2_err *err)
{
    eng_ofl *x = calloc(1, sizeof *x);
    if (!x)
        return pi2_err_set(err, PI2_ENOMEM, "out of memory");
    e->ofl = x;
    x->e = e;
    int rc = open_reader(e, o, x, err);
    if (rc)
        return rc;
    const pi2_ctr *c = pi2_bundle_container(e->b);
    uint64_t end = UINT64_MAX;
    for (size_t i = 0; i < e->bl->n_ffn; i++) {
        const pi2_ctr_member *m = pi2_ctr_find(c, e->bl->ffn[i].ffn);
        if (!m)
            return pi2_err_set(err, PI2_ENOTFOUND, "%s: FFN member %s is missing", e->path, e->bl->ffn[i].ffn);
        end = m->offset < end ? m->offset : end;
    }
    if (end == UINT64_MAX || end % PI2_IO_ALIGN)
        return pi2_err_set(err, PI2_EFORMAT, "%s: no aligned FFN region", e->path);
    /* every resident member must lie before the first FFN member */
    for (size_t r = 0; r < e->bl->n_resident; r++) {
        const pi2_ctr_section *s = pi2_manifest_find_section(e->mf, e->bl->resident[r]);
        if (!s || s->offset > end || s->size > end - s->offset)
            return pi2_err_set(err, PI2_EFORMAT, "%s: resident member %s lies after the FFN region", e->path,
                               e->bl->resident[r]);
    }
    if ((e->pred_stream || e->attn_stream > 0) && (rc = ofl_ps_open(e, x, err)) != 0)
        return rc;
    if (!(e->res = pi2_io_alloc_buf((size_t)end)))
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory for the resident region (%.1f MB)", e->path,
                           (double)end / 1e6);
    e->res_bytes = end;
    if (x->ps) { /* the region less what streams, hashed in the ring */
        if ((rc = ofl_ps_load_resident(e, x, end, err)) != 0)
            return rc;
    } else {
        pi2_io_prefault(&e->res, &end, 1, e->threads, NULL, NULL);
        if ((rc = ofl_seq_read(x->io, x->depth, e->res, 0, end, NULL, err)) != 0)
            return rc;
        if ((rc = pi2_bundle_verify_copy(e->b, e->res, end, err)) != 0)
            return rc;
    }
    /* the container's pages the open touched (manifest, layout) are not
     * needed before the hot segment fills the budget */
    pi2_ctr_drop_pages(c);
    return 0;
}

/* ---------------- plan and start ---------------- */

static double mb(uint64_t b) { return (double)b / 1048576.0; }


/* Gate parts of the slots [hot groups, gate groups) of every FFN, read
 * sequentially through a window and kept (two-phase plans). */
static int load_gate_parts(pi2_engine *e, eng_ofl *x, bool lock, pi2_err *err)
{
    uint8_t *win = NULL;
    uint64_t wlen = 0;
    int rc = 0;
    for (uint32_t fi = 0; fi < x->n_ffn && rc == 0; fi++) {
        if (x->ghot_len[fi] == 0)
            continue;
        const pi2_bl_ffn *b = x->bl[fi];
        const eng_ffn *f = ffn_at(e, x, fi);
        if (!win) {
            wlen = (OFL_WINDOW / x->S > 0 ? OFL_WINDOW / x->S : 1) * x->S;
            if (!(win = pi2_io_alloc_buf((size_t)wlen)))
                return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory for start-up reads", e->path);
        }
        if (!(x->ghot[fi] = pi2_io_alloc_buf((size_t)x->ghot_len[fi]))) {
            rc = pi2_err_set(err, PI2_ENOMEM, "%s: out of memory for the hot gates", e->path);
            break;
        }
        if (lock && mlock(x->ghot[fi], (size_t)x->ghot_len[fi]) != 0)
            x->info.hot_locked = false;
        uint64_t H = x->hot_len[fi] / b->slot_bytes, G = H + x->ghot_len[fi] / b->gate_part;
        for (uint64_t k0 = H; k0 < G && rc == 0;) {
            uint64_t n = (G - k0) * x->S < wlen ? G - k0 : wlen / x->S;
            if ((rc = ofl_seq_read(x->io, x->depth, win, x->file_off[fi] + k0 * x->S, n * x->S, NULL, err)) != 0)
                break;
            for (uint64_t k = 0; k < n; k++)
                memcpy(x->ghot[fi] + (k0 + k - H) * b->gate_part, win + k * x->S, (size_t)b->gate_part);
            k0 += n;
        }
        pi2_bl_rows at = {.pay = {0}, .sc = {x->P}}; /* a gate unit: the gate row first */
        for (uint32_t i = x->hot_n[fi]; rc == 0 && i < x->ghot_n[fi]; i++)
            ofl_set_rows(f, i, R_GATE,
                         x->ghot[fi] + (uint64_t)(i / b->group - H) * b->gate_part + (uint64_t)(i % b->group) * x->Gb,
                         &at);
    }
    pi2_io_free_buf(win);
    return rc;
}

/* Start-up check of every FFN payload against the signed manifest, read
 * with direct I/O through a small ring (no page cache). */
typedef struct ffn_check {
    pi2_engine *e;
    eng_ofl *x;
    int rc;
    pi2_err err;
} ffn_check;

static void verify_ffn(void *arg)
{
    ffn_check *k = arg;
    pi2_engine *e = k->e;
    eng_ofl *x = k->x;
    pi2_err *err = &k->err;
    int rc = 0;
    for (uint32_t fi = 0; fi < x->n_ffn && rc == 0; fi++) {
        const pi2_ctr_section *s = pi2_manifest_find_section(e->mf, x->bl[fi]->ffn);
        pi2_sha256_ctx *sha = NULL;
        uint8_t dg[PI2_SHA256_LEN];
        if (!s) {
            rc = pi2_err_set(err, PI2_ENOTFOUND, "%s: no section for %s", e->path, x->bl[fi]->ffn);
            break;
        }
        if ((rc = pi2_sha256_init(&sha, err)) != 0)
            break;
        rc = ofl_seq_read(x->io, x->depth, NULL, x->file_off[fi], s->size, sha, err);
        if (rc == 0)
            rc = pi2_sha256_final(sha, dg, err);
        pi2_sha256_free(sha);
        if (rc == 0 && memcmp(dg, s->sha256, sizeof dg) != 0)
            rc = pi2_err_set(err, PI2_ESIG, "%s: member %s does not match its SHA-256 in the signed manifest "
                                            "(corrupt or altered file)",
                             e->path, s->name);
    }
    k->rc = rc;
}

/* The buffers of this module for a model (offload.h): what the
 * memory plan counts (runtime/planner.h) and eng_ofl_open allocates. */
void eng_ofl_buffers(const pi2_model_desc *d, const pi2_bundle_layout *bl, eng_ofl_bufs *out)
{
    const pi2_bl_ffn *b0 = pi2_bl_find(bl, 0, pi2_desc_is_moe(d) ? 0 : -1);
    if (!b0)
        b0 = &bl->ffn[0];
    uint64_t S = b0->slot_bytes, R = bl->row_bytes, D = (uint64_t)d->hidden;
    uint32_t n_ffn = (uint32_t)d->n_layers * (pi2_desc_is_moe(d) ? (uint32_t)d->n_experts : 1);
    memset(out, 0, sizeof *out);
    out->max_sel = (uint32_t)d->n_ff;
    out->max_ch = (out->max_sel + FFN_CHUNK - 1) / FFN_CHUNK;
    out->staging_bytes = S; /* a two-phase gate read may reach into the up+down part */
    /* windows of whole prefill tiles (ENG_TILE neurons), about OFL_WINDOW
     * bytes: the prefill FFN then runs the same tiles on the same threads
     * in the same order as in memory, and gives the same bits. A window
     * reads the slots its neurons lie in; with a group that does not divide
     * a window, the slot astride two windows is read by both (windows of
     * whole slots and whole tiles would need lcm(g, ENG_TILE) neurons:
     * 12 MiB each for g = 7 on a 7B shape) */
    uint64_t g = b0->group, tiles = (uint64_t)OFL_WINDOW * g / ((uint64_t)ENG_TILE * S);
    uint64_t wn = (tiles > 0 ? tiles : 1) * ENG_TILE;
    if (wn > b0->neurons)
        wn = b0->neurons;
    uint64_t wg = wn % g == 0 ? wn / g : (wn + 2 * g - 2) / g; /* the most slots wn neurons lie in */
    out->win_neurons = (uint32_t)wn;
    out->win_groups = (uint32_t)(wg < b0->groups ? wg : b0->groups);
    out->wbuf_bytes = (uint64_t)out->win_groups * S;
    out->rq_cap = 2 * (size_t)out->max_sel + 4 * (size_t)(out->wbuf_bytes / OFL_SEQ_REQ + 1) * OFL_NWIN + 16;
    out->ready_cap = 2 * out->max_ch + 4;
    out->per_depth = out->staging_bytes + sizeof(ofl_req) + sizeof(void *);
    uint64_t max_sel = out->max_sel, max_ch = out->max_ch;
    out->bytes = OFL_NWIN * out->wbuf_bytes + max_ch * D * 4 + out->rq_cap * sizeof(ofl_rd) + max_sel * (4 * 4 + 1) +
                 max_sel * (OFL_PF_SETS * (5 * 4 + 1) + 4) + D * 4 + max_ch * (sizeof(ofl_chunk) + 5 * 4 + 10) +
                 (uint64_t)n_ffn * 64;
    out->slot_bytes[0] = stride_of(bl->two_phase ? b0->gate_bytes : 3 * R) + 32;
    out->slot_bytes[1] = stride_of(2 * R) + 32;
}

int eng_ofl_open(pi2_engine *e, const pi2_engine_opts *o, pi2_plan_memory *m, pi2_err *err)
{
    eng_ofl *x = e->ofl;
    int rc;
    ofl_ps_unbind_all(e, x); /* streamed members are bound as their layer is read */
    if ((rc = ofl_tables(e, o, x, err)) != 0 || (rc = ofl_bind_ffns(e, x, err)) != 0)
        return rc;
    uint32_t max_sel = ofl_take_buffers(e, x);
    /* the plan (runtime/planner.h), run as made: its hot and gate groups,
     * I/O depth and gate-first; the pool already runs its threads */
    ofl_take_plan(x, m);
    ofl_report_plan(e, x, m);
    ofl_sizes z = {m->hot, m->fixed, m->index, x->two_phase ? P_GATE : P_FULL, {m->slots[0], m->slots[1]}, max_sel};
    if ((rc = ofl_load_hot(e, o, x, z.hot_total, err)) != 0 || (rc = ofl_make_caches(x, &z, err)) != 0 ||
        (rc = ofl_alloc_job(e, x, max_sel, err)) != 0 || (rc = ofl_stream_open(e, x, err)) != 0)
        return rc;
    ofl_register_buffers(x);
    e->plan_ctx = e->ctx;
    return ofl_start_io(e, x, err);
}

/* ---- the open's steps around the plan (eng_ofl_open) ---- */

/* Before the plan: the options' switches and the per-FFN tables. */
static int ofl_tables(pi2_engine *e, const pi2_engine_opts *o, eng_ofl *x, pi2_err *err)
{
    const pi2_model_desc *d = &e->d;
    x->E = pi2_desc_is_moe(d) ? (uint32_t)d->n_experts : 1;
    x->n_ffn = (uint32_t)d->n_layers * x->E;
    x->two_phase = e->bl->two_phase;
    x->spec = x->two_phase && !o->offload.gate_first;
    x->read_ahead = !o->offload.no_read_ahead;
    x->R = e->bl->row_bytes;
    x->P = e->bl->pay_bytes;
    x->bl = pi2_calloc_array(x->n_ffn, sizeof *x->bl);
    x->file_off = pi2_calloc_array(x->n_ffn, sizeof *x->file_off);
    x->hot = pi2_calloc_array(x->n_ffn, sizeof *x->hot);
    x->hot_len = pi2_calloc_array(x->n_ffn, sizeof *x->hot_len);
    x->hot_n = pi2_calloc_array(x->n_ffn, sizeof *x->hot_n);
    x->ghot_n = pi2_calloc_array(x->n_ffn, sizeof *x->ghot_n);
    x->ghot = pi2_calloc_array(x->n_ffn, sizeof *x->ghot);
    x->ghot_len = pi2_calloc_array(x->n_ffn, sizeof *x->ghot_len);
    if (!x->bl || !x->file_off || !x->hot || !x->hot_len || !x->hot_n || !x->ghot_n || !x->ghot || !x->ghot_len)
        return pi2_err_set(err, PI2_ENOMEM, "out of memory");
    return 0;
}

/* Each FFN's bundle entry and file offset; every FFN of one geometry
 * (slot, gate part and group sizes), which the caches' slots assume. */
static int ofl_bind_ffns(pi2_engine *e, eng_ofl *x, pi2_err *err)
{
    const pi2_model_desc *d = &e->d;
    for (uint32_t fi = 0; fi < x->n_ffn; fi++) {
        const eng_ffn *f = ffn_at(e, x, fi);
        const pi2_bl_ffn *b = pi2_bl_find(e->bl, f->layer, pi2_desc_is_moe(d) ? f->expert : -1);
        if (!b)
            return pi2_err_set(err, PI2_ENOTFOUND, "%s: no bundle entry for FFN %u", e->path, fi);
        x->bl[fi] = b;
        x->file_off[fi] = pi2_ctr_find(pi2_bundle_container(e->b), b->ffn)->offset;
        if (fi == 0) {
            x->S = b->slot_bytes;
            x->Pg = b->gate_part;
            x->Gb = b->gate_bytes;
            x->g = b->group;
        } else if (b->slot_bytes != x->S || b->gate_part != x->Pg || b->group != x->g || b->gate_bytes != x->Gb) {
            return pi2_err_set(err, PI2_EUNSUPPORTED, "%s: FFNs of different geometry", e->path);
        }
    }
    return 0;
}

/* The buffers of this module: the shapes the memory plan counted. Returns
 * the most neurons a decode job selects. */
static uint32_t ofl_take_buffers(pi2_engine *e, eng_ofl *x)
{
    eng_ofl_bufs bufs;
    eng_ofl_buffers(&e->d, e->bl, &bufs);
    x->max_ch = bufs.max_ch;
    x->staging_bytes = (size_t)bufs.staging_bytes;
    x->win_neurons = bufs.win_neurons;
    x->win_groups = bufs.win_groups;
    x->wbuf_bytes = bufs.wbuf_bytes;
    x->rq_cap = bufs.rq_cap;
    x->ready_cap = bufs.ready_cap;
    return bufs.max_sel;
}

/* The plan taken over from m: I/O depth, gate-first, and each FFN's hot
 * segment and kept gates. The fixed split without a hardware profile
 * keeps no plan to show. */
static void ofl_take_plan(eng_ofl *x, pi2_plan_memory *m)
{
    x->plan = m->plan;
    memset(&m->plan, 0, sizeof m->plan);
    x->depth = x->plan.io_depth;
    x->spec = x->two_phase && !x->plan.gate_first;
    for (uint32_t fi = 0; fi < x->n_ffn; fi++) {
        const pi2_bl_ffn *b = x->bl[fi];
        uint64_t H = x->plan.hot_groups[fi], G = x->two_phase ? x->plan.gate_groups[fi] : H;
        x->hot_len[fi] = H * b->slot_bytes;
        x->hot_n[fi] = (uint32_t)(H * b->group < b->neurons ? H * b->group : b->neurons);
        x->ghot_len[fi] = (G - H) * b->gate_part;
        x->ghot_n[fi] = (uint32_t)(G * b->group < b->neurons ? G * b->group : b->neurons);
    }
    if (!m->predicted)
        pi2_plan_free(&x->plan);
}

/* What pi2_engine_offload_info_get reports of the plan (the cache and
 * the planned total are set again once the caches are made). */
static void ofl_report_plan(const pi2_engine *e, eng_ofl *x, const pi2_plan_memory *m)
{
    pi2_engine_offload_info *in = &x->info;
    in->on = true;
    in->mem_limit = m->mem_limit;
    in->resident = m->resident;
    in->kv = m->kv;
    in->buffers = m->buffers;
    in->overhead = m->overhead;
    in->files = m->files;
    in->ffn_total = m->ffn_total;
    in->minimum = m->least; /* its own kernel share included; the predictors streamed where they can be */
    in->plan_source = m->source;
    in->plan = x->plan.n_ffn > 0 ? &x->plan : NULL;
    in->threads = e->threads;
    in->io_depth = x->depth;
    in->gate_first = x->two_phase && !x->spec;
    in->gate_hot = m->gate_hot;
    in->hot = m->hot;
    in->cache = m->cache;
    in->cache_slots = m->slots[0] + m->slots[1];
    in->planned = m->planned;
    in->offloaded = m->offloaded;
    in->backend = pi2_io_backend_name(pi2_io_backend_used(x->io));
    in->note = x->note;
}

/* The hot segments of the plan, read and (lock_hot) pinned, every other
 * row pointer cleared; then the kept gates of two-phase plans. */
static int ofl_load_hot(pi2_engine *e, const pi2_engine_opts *o, eng_ofl *x, uint64_t hot_total, pi2_err *err)
{
    pi2_engine_offload_info *in = &x->info;
    int rc;
    /* hot segments: all allocated and faulted in first (on every thread) */
    in->hot_locked = hot_total > 0 && o->offload.lock_hot;
    for (uint32_t fi = 0; fi < x->n_ffn; fi++)
        if (x->hot_len[fi] > 0 && !(x->hot[fi] = pi2_io_alloc_buf((size_t)x->hot_len[fi])))
            return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory for the hot segment (%.1f MB)", e->path,
                               mb(hot_total));
    /* the FFN payloads' start-up check (streamed, no page cache) runs on
     * this thread meanwhile */
    ffn_check chk = {e, x, 0, {0}};
    pi2_io_prefault(x->hot, x->hot_len, (int)x->n_ffn, e->threads, o->verify_ffn ? verify_ffn : NULL, &chk);
    if (chk.rc)
        return pi2_err_set(err, chk.rc, "%s", chk.err.msg);
    for (uint32_t fi = 0; fi < x->n_ffn; fi++) {
        const eng_ffn *f = ffn_at(e, x, fi);
        for (uint32_t i = 0; i < f->n_ff; i++)
            ofl_set_rows(f, i, R_ALL, NULL, NULL);
        if (x->hot_len[fi] == 0)
            continue;
        if ((rc = ofl_seq_read(x->io, x->depth, x->hot[fi], x->file_off[fi], x->hot_len[fi], NULL, err)) != 0)
            return rc;
        if (o->offload.lock_hot && mlock(x->hot[fi], (size_t)x->hot_len[fi]) != 0)
            in->hot_locked = false;
        for (uint32_t i = 0; i < x->hot_n[fi]; i++) {
            pi2_bl_rows at;
            pi2_bl_neuron_rows(x->bl[fi], x->R, x->P, x->two_phase, i, &at);
            ofl_set_rows(f, i, R_ALL, x->hot[fi], &at);
        }
    }
    return load_gate_parts(e, x, o->offload.lock_hot, err);
}

/* The neuron caches of the plan's slots; the footprint as allocated. */
static int ofl_make_caches(eng_ofl *x, const ofl_sizes *z, pi2_err *err)
{
    pi2_engine_offload_info *in = &x->info;
    int rc;
    uint32_t *neurons = pi2_malloc_array(x->n_ffn, sizeof *neurons);
    if (!neurons)
        return pi2_err_set(err, PI2_ENOMEM, "out of memory");
    for (uint32_t fi = 0; fi < x->n_ffn; fi++)
        neurons[fi] = x->bl[fi]->neurons;
    rc = pi2_ncache_create(&x->cg, x->n_ffn, neurons, (size_t)part_unit(x, z->kind), z->slots[0], err);
    if (rc == 0 && x->two_phase)
        rc = pi2_ncache_create(&x->cu, x->n_ffn, neurons, (size_t)part_unit(x, P_UD), z->slots[1], err);
    free(neurons);
    if (rc)
        return rc;
    /* the arena as allocated (indexes are counted with the buffers) */
    in->cache = pi2_ncache_footprint(x->cg) + (x->cu ? pi2_ncache_footprint(x->cu) : 0) - z->index;
    in->planned = z->fixed + z->hot_total + in->cache;
    return 0;
}

/* The request pool, the read queue, the decode job's arrays and the
 * read-ahead sets. */
static int ofl_alloc_job(pi2_engine *e, eng_ofl *x, uint32_t max_sel, pi2_err *err)
{
    uint64_t D = (uint64_t)e->d.hidden;
    if (!ofl_job_alloc(x, max_sel, D) || !ofl_ra_alloc(x, max_sel, D))
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory for the offloading buffers", e->path);
    return 0;
}

/* Every decode and prefill read lands in the staging buffers and the
 * stream's windows: registered once with io_uring. */
static void ofl_register_buffers(eng_ofl *x)
{
    void *fb[1 + OFL_NWIN];
    size_t fl[1 + OFL_NWIN];
    fb[0] = x->q.staging;
    fl[0] = (size_t)x->depth * x->staging_bytes;
    for (int b = 0; b < OFL_NWIN; b++) {
        fb[1 + b] = x->st.buf[b];
        fl[1 + b] = (size_t)x->wbuf_bytes;
    }
    if (pi2_io_backend_used(x->io) == PI2_IO_URING && !pi2_io_register(x->io, fb, fl, 1 + OFL_NWIN) && !x->note[0])
        snprintf(x->note, sizeof x->note,
                 "buffers not registered with the ring (locked-memory limit?): each read pins its pages");
}

/* The I/O thread: started, at its priority, and placed on a CPU of its
 * own when the compute threads leave one. */
static int ofl_start_io(pi2_engine *e, eng_ofl *x, pi2_err *err)
{
    pthread_mutex_init(&x->mu, NULL);
    pthread_cond_init(&x->cv_io, NULL);
    pthread_cond_init(&x->cv_compute, NULL);
    pthread_cond_init(&x->cv_stream, NULL);
    if (pthread_create(&x->th, NULL, ofl_io_main, x) != 0)
        return pi2_err_set(err, PI2_EIO, "%s: cannot start the I/O thread", e->path);
    x->th_started = true;
    pthread_setname_np(x->th, "pi2-io"); /* as top -H and the tests see it; failure is harmless */
    pthread_mutex_lock(&x->mu);
    while (!x->io_up)
        pthread_cond_wait(&x->cv_compute, &x->mu);
    pthread_mutex_unlock(&x->mu);
    /* a CPU of its own for the I/O thread when the compute threads leave
     * one free (formats/pool.h); the caller's mask comes back at close */
    if (pi2_cpus_split(e->threads, &x->cpus) && pi2_thread_pin(x->th, &x->cpus.io)) {
        pi2_pool_pin(e->pool, &x->cpus.pool);
        x->pinned = true;
    }
    /* the container's pages touched while opening are not needed any more */
    pi2_ctr_drop_pages(pi2_bundle_container(e->b));
    return 0;
}

void eng_ofl_close(pi2_engine *e)
{
    eng_ofl *x = e->ofl;
    if (!x)
        return;
    if (x->pinned) /* the workers go with the pool; the caller gets its mask back */
        pi2_thread_pin(pthread_self(), &x->cpus.all);
    if (x->th_started) {
        pthread_mutex_lock(&x->mu);
        x->stop = true;
        pthread_cond_broadcast(&x->cv_io);
        pthread_mutex_unlock(&x->mu);
        pthread_join(x->th, NULL);
        pthread_mutex_destroy(&x->mu);
        pthread_cond_destroy(&x->cv_io);
        pthread_cond_destroy(&x->cv_compute);
        pthread_cond_destroy(&x->cv_stream);
    }
    pi2_io_close(x->io); /* waits for reads in flight */
    ofl_ps_free(x);
    for (uint32_t fi = 0; x->hot && fi < x->n_ffn; fi++) {
        if (x->hot[fi] && x->info.hot_locked)
            munlock(x->hot[fi], (size_t)x->hot_len[fi]);
        pi2_io_free_buf(x->hot[fi]);
    }
    ofl_stream_free(x);
    pi2_ncache_free(x->cg);
    pi2_ncache_free(x->cu);
    free(x->bl);
    free(x->file_off);
    free(x->hot);
    free(x->hot_len);
    free(x->hot_n);
    for (uint32_t fi = 0; x->ghot && fi < x->n_ffn; fi++) {
        if (x->ghot[fi] && x->info.hot_locked)
            munlock(x->ghot[fi], (size_t)x->ghot_len[fi]);
        pi2_io_free_buf(x->ghot[fi]);
    }
    free(x->ghot);
    free(x->ghot_len);
    free(x->ghot_n);
    pi2_plan_free(&x->plan);
    ofl_job_free(x);
    ofl_ra_free(x);
    free(x);
    e->ofl = NULL;
}


const ffn_source eng_ffn_flash = {
    .begin_pass = ofl_flash_begin_pass,
    .layer_begin = ofl_flash_layer_begin,
    .layer_ahead = ofl_flash_layer_ahead,
    .decode = ofl_flash_decode,
    .prefill = ofl_flash_prefill,
    .skip = ofl_flash_skip,
    .end_pass = ofl_flash_end_pass,
};

/* ---------------- reports ---------------- */

void pi2_engine_offload_info_get(const pi2_engine *e, pi2_engine_offload_info *out)
{
    memset(out, 0, sizeof *out);
    eng_ofl *x = e->ofl;
    if (!x)
        return;
    /* the I/O thread counts the reads ahead that land after a step */
    if (x->th_started)
        pthread_mutex_lock(&x->mu);
    *out = x->info;
    out->parts = x->cnt.parts;
    out->parts_hot = x->cnt.hot;
    out->parts_hit = x->cnt.hit;
    out->parts_read = x->cnt.read;
    out->reads = x->cnt.reads;
    out->bytes_read = x->cnt.bytes;
    out->parts_prefetched = x->cnt.pf;
    out->prefetch_waits = x->cnt.pfwait;
    out->io_wait_s = x->cnt.wait;
    out->prefill_bytes_read = x->cnt.pre_bytes;
    out->pred_stream = e->pred_stream;
    out->attn_stream = e->attn_stream;
    out->pred_bytes_read = ofl_ps_bytes(x) - x->ps_bytes0;
    if (x->th_started)
        pthread_mutex_unlock(&x->mu);
}

void eng_ofl_stats_reset(pi2_engine *e)
{
    eng_ofl *x = e->ofl;
    if (!x)
        return;
    if (x->th_started) /* as pi2_engine_offload_info_get: reads ahead may still land */
        pthread_mutex_lock(&x->mu);
    x->cnt.parts = x->cnt.hot = x->cnt.hit = x->cnt.read = x->cnt.reads = x->cnt.bytes = x->cnt.pre_bytes = 0;
    x->cnt.pf = x->cnt.pfwait = 0;
    x->cnt.wait = 0;
    x->ps_bytes0 = ofl_ps_bytes(x);
    if (x->th_started)
        pthread_mutex_unlock(&x->mu);
}

uint64_t pi2_engine_footprint(const pi2_engine *e)
{
    uint64_t anon = 0;
    FILE *f = fopen("/proc/self/status", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f))
            if (strncmp(line, "RssAnon:", 8) == 0) {
                anon = strtoull(line + 8, NULL, 10) * 1024;
                break;
            }
        fclose(f);
    }
    return anon + pi2_ctr_cached_bytes(pi2_bundle_container(e->b));
}