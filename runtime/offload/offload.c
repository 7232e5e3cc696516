/* pi2 engine: flash offloading (design: runtime/offload/offload.h). */
#include "runtime/offload/offload.h"
#include "runtime/engine_internal.h"
#include "runtime/mathops.h"
#include "runtime/ffn.h"
#include "runtime/ffn_source.h"
#include "runtime/offload/io.h"
#include "runtime/offload/ncache.h"
#include "runtime/planner.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define OFL_SEQ_REQ (1u << 20)       /* sequential read size */
#define OFL_SEQ_DEPTH 8              /* sequential reads in flight */
#define OFL_WINDOW (4u << 20)        /* prefill window, bytes (whole slots) */
#define OFL_NWIN 3                   /* prefill windows read ahead */
#define OFL_OVERHEAD (32ull << 20)   /* code, stacks, allocator slack */
#define OFL_KERNEL_SHARE 256         /* and 1/256 of what the run can use (the limit, or all in memory):
                                        page tables and kernel memory charged with it */
#define OFL_POLL_US 50               /* I/O thread poll while reads are in flight */
#define OFL_SPIN 4000                /* compute thread spins before sleeping */
#define OFL_PF_SETS 8                /* read-ahead sets in flight (MoE: top-k per layer) */

enum { P_FULL = 0, P_GATE = 1, P_UD = 2 };
enum { CH_WAIT = 0, CH_IO, CH_READY, CH_UD_WAIT, CH_UD_IO, CH_UD_READY, CH_DONE };
enum { M_UD = 1, M_DONE = 2 }; /* what a compute step leaves to do */
/* Position flags. F_SPEC: up+down read along with the gate; F_PFWAIT: the
 * part is being read by the prefetch, which hands it over on landing. */
enum { F_GMISS = 1, F_GHELD = 2, F_UMISS = 4, F_UHELD = 8, F_SPEC = 16, F_PFWAIT = 32 };
enum { J_DEC = 0, J_PF = 1 }; /* which list a read serves */

typedef struct ofl_chunk {
    uint32_t k0, k1;  /* positions in the selected list */
    uint32_t n_fired; /* two-phase: fired positions in fired[k0 .. k0 + n_fired) */
    int state;
    int pending;      /* reads outstanding */
    bool has_out;
} ofl_chunk;

/* A read to make: decode parts of one bundle group, or a piece of a
 * prefill window. */
typedef struct ofl_rd {
    int32_t win;        /* >= 0: stream window (dst set); -1: decode or prefetch */
    uint8_t job;        /* J_DEC or J_PF */
    uint32_t fi;
    uint32_t chunk;
    uint8_t part;       /* P_FULL, P_GATE, P_UD */
    uint32_t a, b;      /* positions (P_UD: fired indexes) covered, inclusive */
    uint64_t span;      /* member offset of the first byte read */
    uint32_t len;
    uint64_t file_off;
    uint8_t *dst;       /* stream: destination */
} ofl_rd;

typedef struct ofl_req {
    pi2_io_req io;
    ofl_rd rd;
    uint8_t *staging;
} ofl_req;

/* A prefill window of one FFN. */
typedef struct ofl_win {
    uint32_t fi;
    uint64_t off, len; /* member range */
} ofl_win;

typedef struct eng_ofl {
    pi2_engine *e;
    pi2_io *io;
    int depth;              /* reads in flight (the plan's, or the options') */
    int ring_depth;         /* the reader's capacity (>= depth) */
    char note[256];
    pi2_engine_offload_info info;

    /* plan */
    uint32_t n_ffn, E;
    const pi2_bl_ffn **bl;  /* [n_ffn] */
    uint64_t *file_off;     /* [n_ffn] file offset of each ffn member */
    uint8_t **hot;          /* [n_ffn] hot segment: the member's first hot_groups slots */
    uint64_t *hot_len;
    uint32_t *hot_n;        /* hot neurons */
    uint32_t *ghot_n;       /* neurons whose gate is in memory (>= hot_n; two-phase plans) */
    uint8_t **ghot;         /* [n_ffn] gate parts of slots [hot groups, gate groups) */
    uint64_t *ghot_len;
    pi2_plan plan;          /* the plan run (n_ffn 0: none) */
    bool two_phase;
    bool spec;              /* two-phase: read up+down along with a missing gate */
    bool read_ahead;        /* decode: read ahead during attention */
    uint64_t R, S, Pg;      /* row bytes, slot bytes, gate part */
    uint32_t g;             /* neurons per group */
    pi2_ncache *cg, *cu;    /* one-phase: cg holds whole neurons; two-phase: gates, up+down */

    /* reads */
    ofl_req *reqs;
    ofl_req **free_req;
    int n_free;
    size_t staging_bytes;
    uint8_t *staging;
    ofl_rd *rq;             /* FIFO of reads waiting for a request */
    size_t rq_cap, rq_head, rq_n;

    /* The decode job. Everything below is under mu, except the compute on a
     * chunk a thread has taken (its positions' data is stable then) and the
     * I/O thread's copy into slots it reserved. */
    const eng_ffn *f;
    uint32_t fi;
    ffn_dec dec;            /* what the job's chunks share */
    const uint32_t *sel;
    uint32_t n_sel, n_ch, next_admit, n_done;
    uint32_t max_ch;
    ofl_chunk *ch;
    uint32_t *ud_wait, ud_head, ud_n;
    uint32_t *gslot, *uslot, *fired;
    float *gval;
    uint8_t *flag;
    float *parts;           /* [max_ch][D] */
    uint32_t *out_rows;     /* [max_ch] the chunks with an output, in order */
    uint32_t n_out;
    bool fail, finished;
    pi2_err fail_err;
    uint32_t running;       /* chunk steps being computed */
    uint32_t n_sub;         /* decode reads submitted, not landed */
    uint32_t *ready, ready_head, ready_n, ready_cap;
    int n_sleeping;         /* compute threads waiting on cv_compute */
    atomic_uint hint;       /* set when there is something for compute threads */
    ofl_req **subs;         /* I/O thread: requests taken this round */

    pthread_mutex_t mu;
    pthread_cond_t cv_io, cv_compute, cv_stream;
    pthread_t th;
    bool th_started, stop;
    bool io_up;      /* the I/O thread has set its priority (info.io_nice) */
    bool pinned;     /* threads placed by pi2_cpus_split: restore at close */
    pi2_cpus cpus;

    /* prefill stream */
    ofl_win *win;           /* streamed windows, in consumption order */
    uint32_t n_win;
    uint32_t *win_first;    /* [n_ffn + 1]: first window index of each FFN in win[] */
    uint32_t win_groups;    /* slots per window */
    uint8_t *wbuf[OFL_NWIN];
    uint64_t wbuf_bytes;
    bool s_active, s_cancel, s_failed;
    pi2_err s_err;
    uint32_t s_next;        /* next window to read */
    uint32_t s_consumed;    /* windows released by the main thread */
    int32_t s_ready[OFL_NWIN];   /* window held ready in each buffer, or -1 */
    int s_pending[OFL_NWIN];     /* reads outstanding per buffer */
    uint32_t s_sub;         /* stream reads submitted, not landed */
    uint32_t s_cursor;      /* main thread: next window to consume */

    /* prefetch (decode, under mu): the likely neurons of the FFN about to
     * run, read while its attention computes; entries land in the caches
     * unheld, or are handed to the decode positions waiting for them */
    struct ofl_pf {
        uint32_t fi;          /* FFN of this prefetch (UINT32_MAX: none) */
        uint32_t *sel, n;     /* neurons being prefetched */
        uint32_t *gslot, *uslot;
        uint8_t *flag;
        uint32_t *pos;        /* [n_ff]: neuron -> prefetch position + 1 while in flight */
        uint32_t *wait;       /* [n_ff]: neuron -> decode position + 1 waiting for it */
        uint32_t sub;         /* reads queued or in flight */
    } pf[OFL_PF_SETS];        /* a ring, so one layer's late reads don't hold up the next */
    int pf_cur;
    uint32_t pf_sub;          /* reads of both */
    float *pf_in;             /* normed residual [D] */
    uint32_t *pf_list;        /* predictor output [n_ff] */

    /* counters (under mu) */
    uint64_t c_parts, c_hot, c_hit, c_read, c_reads, c_bytes, c_pre_bytes, c_pf, c_pfwait;
    double c_wait;
} eng_ofl;

/* ---------------- sequential reads (start-up) ---------------- */

/* Read [off, off+len) into dst (4096-aligned, len a multiple of 4096), up to
 * OFL_SEQ_DEPTH reads of OFL_SEQ_REQ in flight. With sha non-NULL, dst is
 * NULL and the bytes are hashed in order through a ring of buffers. */
static int seq_read(pi2_io *io, int depth, uint8_t *dst, uint64_t off, uint64_t len, pi2_sha256_ctx *sha,
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
    io.backend = (pi2_io_backend)o->offload.io_backend;
    io.depth = o->offload.io_depth > 0 ? o->offload.io_depth : 64;
    x->depth = io.depth;
    if ((o->offload.plan || (o->offload.hw && !o->offload.fixed_split)) && io.depth < 128) /* the plan picks the depth */
        io.depth = o->offload.plan && o->offload.plan->io_depth > 128 ? o->offload.plan->io_depth : 128;
    x->ring_depth = io.depth;
    int rc = pi2_io_open(&x->io, e->path, &io, err);
    if (rc && strstr(err->msg, "O_DIRECT")) { /* tmpfs and friends: documented fallback */
        pi2_err_clear(err);
        io.buffered = true;
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
    if (!(e->res = pi2_io_alloc_buf((size_t)end)))
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory for the resident region (%.1f MB)", e->path,
                           (double)end / 1e6);
    e->res_bytes = end;
    pi2_io_prefault(&e->res, &end, 1, e->threads, NULL, NULL);
    if ((rc = seq_read(x->io, x->depth, e->res, 0, end, NULL, err)) != 0)
        return rc;
    if ((rc = pi2_bundle_verify_copy(e->b, e->res, end, err)) != 0)
        return rc;
    /* the container's pages the open touched (manifest, layout) are not
     * needed before the hot segment fills the budget */
    pi2_ctr_drop_pages(c);
    return 0;
}

/* ---------------- plan and start ---------------- */

static double mb(uint64_t b) { return (double)b / 1048576.0; }

static uint32_t ffn_index(const eng_ofl *x, const eng_ffn *f) { return (uint32_t)f->layer * x->E + (uint32_t)f->expert; }

static const eng_ffn *ffn_at(const pi2_engine *e, const eng_ofl *x, uint32_t fi)
{
    return &e->layers[fi / x->E].ffn[fi % x->E];
}

/* Bytes of one cache slot of a part kind. */
static uint64_t part_unit(const eng_ofl *x, int part)
{
    return part == P_FULL ? 3 * x->R : part == P_GATE ? x->R : 2 * x->R;
}
static uint64_t stride_of(uint64_t unit) { return unit % 4096 == 0 ? unit : (unit + 63) / 64 * 64; }

static void set_ptr(const eng_ffn *f, int part, uint32_t i, const uint8_t *buf, uint64_t R)
{
    if (part == P_FULL) {
        f->gate.rp[i] = buf;
        f->up.rp[i] = buf + R;
        f->down.rp[i] = buf + 2 * R;
    } else if (part == P_GATE) {
        f->gate.rp[i] = buf;
    } else {
        f->up.rp[i] = buf;
        f->down.rp[i] = buf + R;
    }
}

static void *io_main(void *arg);

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
            if ((rc = seq_read(x->io, x->depth, win, x->file_off[fi] + k0 * x->S, n * x->S, NULL, err)) != 0)
                break;
            for (uint64_t k = 0; k < n; k++)
                memcpy(x->ghot[fi] + (k0 + k - H) * b->gate_part, win + k * x->S, (size_t)b->gate_part);
            k0 += n;
        }
        for (uint32_t i = x->hot_n[fi]; rc == 0 && i < x->ghot_n[fi]; i++)
            f->gate.rp[i] = x->ghot[fi] + (uint64_t)(i / b->group - H) * b->gate_part + (uint64_t)(i % b->group) * x->R;
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
        rc = seq_read(x->io, x->depth, NULL, x->file_off[fi], s->size, sha, err);
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

/* The buffers of this module for a model (engine_internal.h): what the
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
    out->win_groups = (uint32_t)(OFL_WINDOW / S > 0 ? OFL_WINDOW / S : 1);
    /* windows of whole prefill tiles (ENG_TILE neurons, a power of two):
     * the prefill FFN then runs the same tiles on the same threads in the
     * same order as in memory, and gives the same bits */
    uint32_t gd = ENG_TILE; /* gcd(g, ENG_TILE) */
    while (b0->group % gd != 0)
        gd /= 2;
    uint32_t whole = ENG_TILE / gd; /* slots per whole number of tiles */
    out->win_groups = out->win_groups >= whole ? out->win_groups / whole * whole : whole;
    if (out->win_groups > b0->groups)
        out->win_groups = b0->groups;
    out->wbuf_bytes = (uint64_t)out->win_groups * S;
    out->rq_cap = 2 * (size_t)out->max_sel + 4 * (size_t)(out->wbuf_bytes / OFL_SEQ_REQ + 1) * OFL_NWIN + 16;
    out->ready_cap = 2 * out->max_ch + 4;
    out->per_depth = out->staging_bytes + sizeof(ofl_req) + sizeof(void *);
    uint64_t max_sel = out->max_sel, max_ch = out->max_ch;
    out->bytes = OFL_NWIN * out->wbuf_bytes + max_ch * D * 4 + out->rq_cap * sizeof(ofl_rd) + max_sel * (4 * 4 + 1) +
                 max_sel * (OFL_PF_SETS * (5 * 4 + 1) + 4) + D * 4 + max_ch * (sizeof(ofl_chunk) + 5 * 4 + 10) +
                 (uint64_t)n_ffn * 64;
    out->slot_bytes[0] = stride_of(bl->two_phase ? R : 3 * R) + 32;
    out->slot_bytes[1] = stride_of(2 * R) + 32;
}

int eng_ofl_open(pi2_engine *e, const pi2_engine_opts *o, pi2_plan_memory *m, pi2_err *err)
{
    eng_ofl *x = e->ofl;
    const pi2_model_desc *d = &e->d;
    int rc;
    x->E = pi2_desc_is_moe(d) ? (uint32_t)d->n_experts : 1;
    x->n_ffn = (uint32_t)d->n_layers * x->E;
    x->two_phase = e->bl->two_phase;
    x->spec = x->two_phase && !o->offload.gate_first;
    x->read_ahead = !o->offload.no_read_ahead;
    x->R = e->bl->row_bytes;
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
    uint64_t ffn_total = 0;
    for (uint32_t fi = 0; fi < x->n_ffn; fi++) {
        const eng_ffn *f = ffn_at(e, x, fi);
        const pi2_bl_ffn *b = pi2_bl_find(e->bl, f->layer, pi2_desc_is_moe(d) ? f->expert : -1);
        if (!b)
            return pi2_err_set(err, PI2_ENOTFOUND, "%s: no bundle entry for FFN %u", e->path, fi);
        x->bl[fi] = b;
        x->file_off[fi] = pi2_ctr_find(pi2_bundle_container(e->b), b->ffn)->offset;
        ffn_total += (uint64_t)b->groups * b->slot_bytes;
        if (fi == 0) {
            x->S = b->slot_bytes;
            x->Pg = b->gate_part;
            x->g = b->group;
        } else if (b->slot_bytes != x->S || b->gate_part != x->Pg || b->group != x->g) {
            return pi2_err_set(err, PI2_EUNSUPPORTED, "%s: FFNs of different geometry", e->path);
        }
    }
    /* buffers of this module: the shapes the memory plan counted */
    eng_ofl_bufs bufs;
    eng_ofl_buffers(d, e->bl, &bufs);
    uint32_t max_sel = bufs.max_sel;
    x->max_ch = bufs.max_ch;
    x->staging_bytes = (size_t)bufs.staging_bytes;
    x->win_groups = bufs.win_groups;
    x->wbuf_bytes = bufs.wbuf_bytes;
    x->rq_cap = bufs.rq_cap;
    x->ready_cap = bufs.ready_cap;
    uint64_t D = (uint64_t)d->hidden;
    int kinds[2] = {x->two_phase ? P_GATE : P_FULL, P_UD};
    /* the plan (runtime/planner.h), run as made: its hot and gate groups,
     * I/O depth and gate-first; the pool already runs its threads */
    uint64_t index = m->index, fixed = m->fixed, hot_total = m->hot;
    uint32_t slots[2] = {m->slots[0], m->slots[1]};
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
    if (!m->predicted) /* the fixed split without a hardware profile: no plan to show */
        pi2_plan_free(&x->plan);
    pi2_engine_offload_info *in = &x->info;
    in->on = true;
    in->mem_limit = m->mem_limit;
    in->resident = m->resident;
    in->kv = m->kv;
    in->buffers = m->buffers;
    in->overhead = m->overhead;
    in->ffn_total = m->ffn_total;
    in->minimum = m->minimum; /* its own kernel share included */
    in->plan_source = m->source;
    in->plan = x->plan.n_ffn > 0 ? &x->plan : NULL;
    in->threads = e->threads;
    in->io_depth = x->depth;
    in->gate_first = x->two_phase && !x->spec;
    in->gate_hot = m->gate_hot;
    in->hot = hot_total;
    in->cache = m->cache;
    in->cache_slots = slots[0] + slots[1];
    in->planned = m->planned;
    in->offloaded = m->offloaded;
    in->backend = pi2_io_backend_name(pi2_io_backend_used(x->io));
    in->note = x->note;
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
            f->gate.rp[i] = f->up.rp[i] = f->down.rp[i] = NULL;
        if (x->hot_len[fi] == 0)
            continue;
        if ((rc = seq_read(x->io, x->depth, x->hot[fi], x->file_off[fi], x->hot_len[fi], NULL, err)) != 0)
            return rc;
        if (o->offload.lock_hot && mlock(x->hot[fi], (size_t)x->hot_len[fi]) != 0)
            in->hot_locked = false;
        for (uint32_t i = 0; i < x->hot_n[fi]; i++) {
            uint64_t off[3];
            pi2_bl_neuron_offsets(x->bl[fi], x->R, x->two_phase, i, off);
            f->gate.rp[i] = x->hot[fi] + off[0];
            f->up.rp[i] = x->hot[fi] + off[1];
            f->down.rp[i] = x->hot[fi] + off[2];
        }
    }
    if ((rc = load_gate_parts(e, x, o->offload.lock_hot, err)) != 0)
        return rc;
    /* caches */
    uint32_t *neurons = pi2_malloc_array(x->n_ffn, sizeof *neurons);
    if (!neurons)
        return pi2_err_set(err, PI2_ENOMEM, "out of memory");
    for (uint32_t fi = 0; fi < x->n_ffn; fi++)
        neurons[fi] = x->bl[fi]->neurons;
    rc = pi2_ncache_create(&x->cg, x->n_ffn, neurons, (size_t)part_unit(x, kinds[0]), slots[0], err);
    if (rc == 0 && x->two_phase)
        rc = pi2_ncache_create(&x->cu, x->n_ffn, neurons, (size_t)part_unit(x, P_UD), slots[1], err);
    free(neurons);
    if (rc)
        return rc;
    /* the arena as allocated (indexes are counted with the buffers) */
    in->cache = pi2_ncache_footprint(x->cg) + (x->cu ? pi2_ncache_footprint(x->cu) : 0) - index;
    in->planned = fixed + hot_total + in->cache;
    /* request pool, queues, job arrays */
    x->reqs = pi2_calloc_array((size_t)x->depth, sizeof *x->reqs);
    x->free_req = pi2_malloc_array((size_t)x->depth, sizeof *x->free_req);
    x->staging = pi2_io_alloc_buf((size_t)x->depth * x->staging_bytes);
    x->rq = pi2_malloc_array(x->rq_cap, sizeof *x->rq);
    x->ch = pi2_calloc_array(x->max_ch, sizeof *x->ch);
    x->ud_wait = pi2_malloc_array(x->max_ch, sizeof *x->ud_wait);
    x->gslot = pi2_malloc_array(max_sel, sizeof *x->gslot);
    x->uslot = pi2_malloc_array(max_sel, sizeof *x->uslot);
    x->fired = pi2_malloc_array(max_sel, sizeof *x->fired);
    x->gval = pi2_malloc_array(max_sel, sizeof *x->gval);
    x->flag = pi2_calloc_array(max_sel, 1);
    x->parts = pi2_malloc_array((size_t)x->max_ch * D, sizeof(float));
    x->out_rows = pi2_malloc_array(x->max_ch, sizeof *x->out_rows);
    x->ready = pi2_malloc_array(x->ready_cap, sizeof *x->ready);
    x->subs = pi2_malloc_array((size_t)x->depth, sizeof *x->subs);
    x->win_first = pi2_malloc_array(x->n_ffn + 1, sizeof *x->win_first);
    bool pf_ok = true;
    for (int p = 0; p < OFL_PF_SETS; p++) {
        struct ofl_pf *P = &x->pf[p];
        P->fi = UINT32_MAX;
        P->sel = pi2_malloc_array(max_sel, sizeof *P->sel);
        P->gslot = pi2_malloc_array(max_sel, sizeof *P->gslot);
        P->uslot = pi2_malloc_array(max_sel, sizeof *P->uslot);
        P->flag = pi2_calloc_array(max_sel, 1);
        P->pos = pi2_calloc_array(max_sel, sizeof *P->pos);
        P->wait = pi2_calloc_array(max_sel, sizeof *P->wait);
        pf_ok = pf_ok && P->sel && P->gslot && P->uslot && P->flag && P->pos && P->wait;
    }
    x->pf_list = pi2_malloc_array(max_sel, sizeof *x->pf_list);
    x->pf_in = pi2_malloc_array((size_t)D, sizeof *x->pf_in);
    bool ok = x->reqs && x->free_req && x->staging && x->rq && x->ch && x->ud_wait && x->gslot && x->uslot &&
              x->fired && x->gval && x->flag && x->parts && x->out_rows && x->ready && x->subs && x->win_first && pf_ok &&
              x->pf_list && x->pf_in;
    for (int b = 0; ok && b < OFL_NWIN; b++)
        ok = (x->wbuf[b] = pi2_io_alloc_buf((size_t)x->wbuf_bytes)) != NULL;
    /* streamed prefill windows */
    uint32_t n_win = 0;
    for (uint32_t fi = 0; ok && fi < x->n_ffn; fi++)
        n_win += (x->bl[fi]->groups + x->win_groups - 1) / x->win_groups;
    ok = ok && (x->win = pi2_malloc_array(n_win ? n_win : 1, sizeof *x->win)) != NULL;
    if (!ok)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory for the offloading buffers", e->path);
    for (uint32_t fi = 0; fi < x->n_ffn; fi++) {
        const pi2_bl_ffn *b = x->bl[fi];
        x->win_first[fi] = x->n_win;
        for (uint32_t g0 = 0; g0 < b->groups; g0 += x->win_groups) {
            uint32_t g1 = g0 + x->win_groups < b->groups ? g0 + x->win_groups : b->groups;
            if ((uint64_t)g1 * b->slot_bytes <= x->hot_len[fi])
                continue; /* in the hot segment */
            x->win[x->n_win++] = (ofl_win){fi, (uint64_t)g0 * b->slot_bytes, (uint64_t)(g1 - g0) * b->slot_bytes};
        }
    }
    x->win_first[x->n_ffn] = x->n_win;
    for (int i = 0; i < x->depth; i++) {
        x->reqs[i].staging = x->staging + (size_t)i * x->staging_bytes;
        x->free_req[x->n_free++] = &x->reqs[i];
    }
    for (int b = 0; b < OFL_NWIN; b++)
        x->s_ready[b] = -1;
    /* every decode and prefill read lands in these: pinned once for the
     * ring rather than at each read */
    void *fb[1 + OFL_NWIN];
    size_t fl[1 + OFL_NWIN];
    fb[0] = x->staging;
    fl[0] = (size_t)x->depth * x->staging_bytes;
    for (int b = 0; b < OFL_NWIN; b++) {
        fb[1 + b] = x->wbuf[b];
        fl[1 + b] = (size_t)x->wbuf_bytes;
    }
    if (pi2_io_backend_used(x->io) == PI2_IO_URING && !pi2_io_register(x->io, fb, fl, 1 + OFL_NWIN) && !x->note[0])
        snprintf(x->note, sizeof x->note,
                 "buffers not registered with the ring (locked-memory limit?): each read pins its pages");
    e->plan_ctx = e->ctx;
    pthread_mutex_init(&x->mu, NULL);
    pthread_cond_init(&x->cv_io, NULL);
    pthread_cond_init(&x->cv_compute, NULL);
    pthread_cond_init(&x->cv_stream, NULL);
    if (pthread_create(&x->th, NULL, io_main, x) != 0)
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
    for (uint32_t fi = 0; x->hot && fi < x->n_ffn; fi++) {
        if (x->hot[fi] && x->info.hot_locked)
            munlock(x->hot[fi], (size_t)x->hot_len[fi]);
        pi2_io_free_buf(x->hot[fi]);
    }
    for (int b = 0; b < OFL_NWIN; b++)
        pi2_io_free_buf(x->wbuf[b]);
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
    free(x->reqs);
    free(x->free_req);
    pi2_io_free_buf(x->staging);
    free(x->rq);
    free(x->ch);
    free(x->ud_wait);
    free(x->gslot);
    free(x->uslot);
    free(x->fired);
    free(x->gval);
    free(x->flag);
    free(x->parts);
    free(x->out_rows);
    free(x->ready);
    free(x->subs);
    free(x->win);
    free(x->win_first);
    for (int p = 0; p < OFL_PF_SETS; p++) {
        free(x->pf[p].sel);
        free(x->pf[p].gslot);
        free(x->pf[p].uslot);
        free(x->pf[p].flag);
        free(x->pf[p].pos);
        free(x->pf[p].wait);
    }
    free(x->pf_list);
    free(x->pf_in);
    free(x);
    e->ofl = NULL;
}

/* ---------------- the decode job (everything here runs under mu) ---------------- */

static uint64_t part_base(const eng_ofl *x, int part, uint32_t q)
{
    return (uint64_t)q * x->S + (part == P_UD ? x->Pg : 0);
}

static pi2_ncache *cache_of(const eng_ofl *x, int part) { return part == P_UD ? x->cu : x->cg; }

static void job_fail(eng_ofl *x, const pi2_err *er)
{
    if (x->fail)
        return;
    x->fail = true;
    x->fail_err = *er;
    if (!x->fail_err.code)
        x->fail_err.code = PI2_EIO;
    atomic_store_explicit(&x->hint, 1u, memory_order_release);
    pthread_cond_broadcast(&x->cv_compute);
}

static void rq_push(eng_ofl *x, const ofl_rd *rd)
{
    if (x->rq_n == x->rq_cap) { /* sized for the worst case: a bug */
        pi2_err er = {0};
        pi2_err_set(&er, PI2_ERANGE, "%s: internal read queue overflow", x->e->path);
        job_fail(x, &er);
        return;
    }
    x->rq[(x->rq_head + x->rq_n) % x->rq_cap] = *rd;
    x->rq_n++;
}

static void make_ready(eng_ofl *x, uint32_t c)
{
    ofl_chunk *C = &x->ch[c];
    C->state = C->state == CH_IO || C->state == CH_WAIT ? CH_READY : CH_UD_READY;
    x->ready[(x->ready_head + x->ready_n) % x->ready_cap] = c;
    x->ready_n++;
    atomic_store_explicit(&x->hint, 1u, memory_order_release);
    if (x->n_sleeping > 0)
        pthread_cond_signal(&x->cv_compute);
}

/* Positions list of a part: sel positions, or fired indexes for P_UD. */
static uint32_t pos_at(const eng_ofl *x, int part, uint32_t idx) { return part == P_UD ? x->fired[idx] : idx; }

/* A list of positions: neuron of index idx is sel[map ? map[idx] : idx],
 * its flags flag[...] likewise. */
typedef struct plist {
    const uint32_t *sel, *map;
    const uint8_t *flag;
} plist;
static uint32_t pl_k(const plist *l, uint32_t idx) { return l->map ? l->map[idx] : idx; }

/* Queue one read per bundle group of the missing parts among list indexes
 * [a, b) of FFN fi; returns the number of reads. */
static int queue_reads(eng_ofl *x, const plist *l, uint8_t job, uint32_t fi, uint32_t c, int part, uint32_t a,
                       uint32_t b)
{
    uint8_t miss = part == P_UD ? F_UMISS : F_GMISS;
    uint64_t unit = part_unit(x, part);
    const pi2_bl_ffn *bf = x->bl[fi];
    int n = 0;
    uint32_t idx = a;
    while (idx < b) {
        uint32_t k = pl_k(l, idx);
        if (!(l->flag[k] & miss)) {
            idx++;
            continue;
        }
        uint32_t i = l->sel[k], q = i / bf->group, last = idx;
        int64_t spec_last = (l->flag[k] & F_SPEC) ? (int64_t)(i % bf->group) : -1;
        for (uint32_t t = idx + 1; t < b; t++) {
            uint32_t kt = pl_k(l, t);
            if (l->sel[kt] / bf->group != q)
                break;
            if (l->flag[kt] & miss)
                last = t;
            if (l->flag[kt] & F_SPEC)
                spec_last = l->sel[kt] % bf->group;
        }
        uint32_t jl = l->sel[pl_k(l, last)] % bf->group, jf = i % bf->group;
        uint64_t s0 = part_base(x, part, q) + jf * unit, s1 = part_base(x, part, q) + (jl + 1) * unit;
        if (spec_last >= 0) /* through the up+down rows read along */
            s1 = part_base(x, P_UD, q) + (uint64_t)(spec_last + 1) * part_unit(x, P_UD);
        s0 = s0 / PI2_IO_ALIGN * PI2_IO_ALIGN;
        s1 = (s1 + PI2_IO_ALIGN - 1) / PI2_IO_ALIGN * PI2_IO_ALIGN;
        ofl_rd rd = {.win = -1, .job = job, .fi = fi, .chunk = c, .part = (uint8_t)part, .a = idx, .b = last,
                     .span = s0, .len = (uint32_t)(s1 - s0), .file_off = x->file_off[fi] + s0};
        rq_push(x, &rd);
        if (job == J_PF) {
            x->pf[c].sub++;
            x->pf_sub++;
        } else
            x->n_sub++;
        n++;
        idx = last + 1;
    }
    return n;
}

/* Hold or reserve every non-hot part among list indexes [a, b): false (and
 * nothing done) when the cache cannot take them now. */
static bool admit_parts(eng_ofl *x, uint32_t c, int part, uint32_t a, uint32_t b)
{
    pi2_ncache *cache = cache_of(x, part);
    uint32_t hot = part == P_GATE ? x->ghot_n[x->fi] : x->hot_n[x->fi], need = 0;
    for (uint32_t idx = a; idx < b; idx++)
        need += x->sel[pos_at(x, part, idx)] >= hot;
    if (need > pi2_ncache_evictable(cache))
        return false;
    bool ud = part == P_UD;
    uint32_t *slot = ud ? x->uslot : x->gslot;
    uint8_t held = ud ? F_UHELD : F_GHELD, miss = ud ? F_UMISS : F_GMISS;
    x->c_parts += b - a;
    x->c_hot += (b - a) - need;
    struct ofl_pf *pfs[OFL_PF_SETS];
    int n_pfs = 0;
    for (int p = 0; part != P_UD && p < OFL_PF_SETS; p++)
        if (x->pf[p].fi == x->fi && x->pf[p].sub > 0)
            pfs[n_pfs++] = &x->pf[p];
    int n_wait = 0;
    for (uint32_t idx = a; idx < b; idx++) { /* hits first: reserves must not evict them */
        uint32_t k = pos_at(x, part, idx), i = x->sel[k];
        if (i < hot)
            continue;
        struct ofl_pf *P = NULL;
        for (int p = 0; p < n_pfs && !P; p++)
            P = pfs[p]->pos[i] ? pfs[p] : NULL;
        if (P) { /* being read by the prefetch: it hands the part over */
            P->wait[i] = k + 1;
            x->flag[k] |= F_PFWAIT;
            n_wait++;
            x->c_pfwait++;
            continue;
        }
        uint8_t *buf = pi2_ncache_hold(cache, x->fi, i, &slot[k]);
        if (buf) {
            x->flag[k] |= held;
            set_ptr(x->f, part, i, buf, x->R);
            x->c_hit++;
        } else {
            x->flag[k] |= miss;
        }
    }
    for (uint32_t idx = a; idx < b; idx++) {
        uint32_t k = pos_at(x, part, idx);
        if (!(x->flag[k] & miss))
            continue;
        pi2_err er = {0};
        if (!pi2_ncache_reserve(cache, x->fi, x->sel[k], false, &slot[k], &er)) {
            x->flag[k] &= (uint8_t)~miss;
            job_fail(x, &er);
            return true;
        }
        x->c_read++;
    }
    if (part == P_GATE && x->spec) { /* read up+down along with each missing gate: one read, one round trip */
        uint32_t want = 0;
        for (uint32_t idx = a; idx < b; idx++)
            want += (x->flag[idx] & F_GMISS) && !pi2_ncache_contains(x->cu, x->fi, x->sel[idx]);
        if (want > 0 && want <= pi2_ncache_evictable(x->cu))
            for (uint32_t idx = a; idx < b; idx++) {
                if (!(x->flag[idx] & F_GMISS) || pi2_ncache_contains(x->cu, x->fi, x->sel[idx]))
                    continue;
                pi2_err er = {0};
                if (pi2_ncache_reserve(x->cu, x->fi, x->sel[idx], false, &x->uslot[idx], &er))
                    x->flag[idx] |= F_SPEC;
            }
    }
    ofl_chunk *C = &x->ch[c];
    C->state = ud ? CH_UD_IO : CH_IO;
    plist l = {x->sel, ud ? x->fired : NULL, x->flag};
    C->pending = queue_reads(x, &l, J_DEC, x->fi, c, part, a, b) + n_wait;
    if (C->pending == 0)
        make_ready(x, c);
    else
        pthread_cond_signal(&x->cv_io);
    return true;
}

/* Admit what the caches can take now: chunks waiting for up+down first,
 * then new chunks in order. */
static void admit(eng_ofl *x)
{
    while (!x->fail && x->ud_n > 0) {
        uint32_t c = x->ud_wait[x->ud_head];
        ofl_chunk *C = &x->ch[c];
        if (!admit_parts(x, c, P_UD, C->k0, C->k0 + C->n_fired))
            break;
        x->ud_head = (x->ud_head + 1) % x->max_ch;
        x->ud_n--;
    }
    while (!x->fail && x->next_admit < x->n_ch) {
        ofl_chunk *C = &x->ch[x->next_admit];
        if (!admit_parts(x, x->next_admit, x->two_phase ? P_GATE : P_FULL, C->k0, C->k1))
            break;
        x->next_admit++;
    }
}

static void release_chunk(eng_ofl *x, uint32_t c, uint8_t which)
{
    ofl_chunk *C = &x->ch[c];
    for (uint32_t k = C->k0; k < C->k1; k++) {
        if ((which & F_GHELD) && (x->flag[k] & F_GHELD)) {
            pi2_ncache_release(x->cg, x->gslot[k]);
            x->flag[k] &= (uint8_t)~F_GHELD;
        }
        if ((which & F_UHELD) && (x->flag[k] & F_UHELD)) {
            pi2_ncache_release(x->cu, x->uslot[k]);
            x->flag[k] &= (uint8_t)~F_UHELD;
        }
    }
}

/* A compute thread finished a step of chunk c: M_UD (gates computed, some
 * fired) or M_DONE. */
static void chunk_step_done(eng_ofl *x, uint8_t type, uint32_t c)
{
    x->running--;
    if (x->fail)
        return;
    if (type == M_UD) {
        release_chunk(x, c, F_GHELD);
        x->ch[c].state = CH_UD_WAIT;
        x->ud_wait[(x->ud_head + x->ud_n) % x->max_ch] = c;
        x->ud_n++;
    } else {
        release_chunk(x, c, F_GHELD | F_UHELD);
        x->ch[c].state = CH_DONE;
        if (++x->n_done == x->n_ch) {
            x->finished = true;
            atomic_store_explicit(&x->hint, 1u, memory_order_release);
            pthread_cond_broadcast(&x->cv_compute);
            return;
        }
    }
    admit(x);
}

/* A decode read landed (its bytes already copied into the reserved slots). */
static void decode_landed(eng_ofl *x, const ofl_rd *rd)
{
    x->n_sub--;
    if (x->fail) {
        if (x->n_sub == 0)
            pthread_cond_broadcast(&x->cv_compute);
        return;
    }
    int part = rd->part;
    pi2_ncache *cache = cache_of(x, part);
    uint8_t miss = part == P_UD ? F_UMISS : F_GMISS, held = part == P_UD ? F_UHELD : F_GHELD;
    uint32_t *slot = part == P_UD ? x->uslot : x->gslot;
    for (uint32_t idx = rd->a; idx <= rd->b; idx++) {
        uint32_t k = pos_at(x, part, idx);
        if (!(x->flag[k] & miss))
            continue;
        pi2_ncache_commit_hold(cache, slot[k]);
        x->flag[k] = (uint8_t)((x->flag[k] & ~miss) | held);
        set_ptr(x->f, part, x->sel[k], pi2_ncache_slot_buf(cache, slot[k]), x->R);
        if (x->flag[k] & F_SPEC) { /* cached, not held: the up+down step holds it if the gate fires */
            pi2_ncache_commit(x->cu, x->uslot[k]);
            x->flag[k] &= (uint8_t)~F_SPEC;
        }
    }
    x->c_reads++;
    x->c_bytes += rd->len;
    ofl_chunk *C = &x->ch[rd->chunk];
    if (--C->pending == 0)
        make_ready(x, rd->chunk);
}

/* Outside mu, in the I/O thread: copy a landed read's parts into their
 * reserved slots (only this read writes them). */
static void decode_copy(eng_ofl *x, const ofl_req *r)
{
    const ofl_rd *rd = &r->rd;
    int part = rd->part;
    pi2_ncache *cache = cache_of(x, part);
    uint8_t miss = part == P_UD ? F_UMISS : F_GMISS;
    const uint32_t *slot = part == P_UD ? x->uslot : x->gslot;
    uint64_t unit = part_unit(x, part);
    uint32_t gsz = x->g;
    for (uint32_t idx = rd->a; idx <= rd->b; idx++) {
        uint32_t k = pos_at(x, part, idx);
        if (!(x->flag[k] & miss))
            continue;
        uint32_t i = x->sel[k];
        uint64_t at = part_base(x, part, i / gsz) + (uint64_t)(i % gsz) * unit - rd->span;
        memcpy(pi2_ncache_slot_buf(cache, slot[k]), r->staging + at, (size_t)unit);
        if (x->flag[k] & F_SPEC) {
            at = part_base(x, P_UD, i / gsz) + (uint64_t)(i % gsz) * part_unit(x, P_UD) - rd->span;
            memcpy(pi2_ncache_slot_buf(x->cu, x->uslot[k]), r->staging + at, (size_t)part_unit(x, P_UD));
        }
    }
}

/* Outside mu: copy a landed prefetch read into its reserved slots. */
static void pf_copy(eng_ofl *x, const ofl_req *r)
{
    const ofl_rd *rd = &r->rd;
    const struct ofl_pf *P = &x->pf[rd->chunk];
    int part = rd->part;
    uint64_t unit = part_unit(x, part), uu = part_unit(x, P_UD);
    for (uint32_t idx = rd->a; idx <= rd->b; idx++) {
        if (!(P->flag[idx] & F_GMISS))
            continue;
        uint32_t i = P->sel[idx], q = i / x->g, j = i % x->g;
        memcpy(pi2_ncache_slot_buf(x->cg, P->gslot[idx]), r->staging + (part_base(x, part, q) + j * unit - rd->span),
               (size_t)unit);
        if (P->flag[idx] & F_SPEC)
            memcpy(pi2_ncache_slot_buf(x->cu, P->uslot[idx]),
                   r->staging + (part_base(x, P_UD, q) + j * uu - rd->span), (size_t)uu);
    }
}

/* A prefetch read landed (ok) or failed: its parts join the caches unheld,
 * or go to the decode positions waiting for them. */
static void pf_landed(eng_ofl *x, const ofl_rd *rd, bool ok, const pi2_err *er)
{
    struct ofl_pf *P = &x->pf[rd->chunk];
    P->sub--;
    x->pf_sub--;
    for (uint32_t idx = rd->a; idx <= rd->b; idx++) {
        uint8_t fl = P->flag[idx];
        if (!(fl & F_GMISS))
            continue;
        uint32_t i = P->sel[idx];
        if (ok) {
            pi2_ncache_commit(x->cg, P->gslot[idx]);
            if (fl & F_SPEC)
                pi2_ncache_commit(x->cu, P->uslot[idx]);
            x->c_pf++;
        } else {
            pi2_ncache_abort(x->cg, P->gslot[idx]);
            if (fl & F_SPEC)
                pi2_ncache_abort(x->cu, P->uslot[idx]);
        }
        P->flag[idx] = 0;
        P->pos[i] = 0;
        uint32_t w = P->wait[i];
        P->wait[i] = 0;
        if (!w || x->fail || !x->f || x->fi != P->fi)
            continue;
        uint32_t k = w - 1;
        x->flag[k] &= (uint8_t)~F_PFWAIT;
        uint8_t *buf = ok ? pi2_ncache_hold(x->cg, x->fi, i, &x->gslot[k]) : NULL;
        if (!buf) {
            pi2_err fe = {0};
            if (er && er->code)
                fe = *er;
            else
                pi2_err_set(&fe, PI2_EIO, "%s: read at offset %llu failed", x->e->path,
                            (unsigned long long)rd->file_off);
            job_fail(x, &fe);
            continue;
        }
        x->flag[k] |= F_GHELD;
        set_ptr(x->f, x->two_phase ? P_GATE : P_FULL, i, buf, x->R);
        uint32_t c = k / FFN_CHUNK;
        if (--x->ch[c].pending == 0)
            make_ready(x, c);
    }
    if (ok) {
        x->c_reads++;
        x->c_bytes += rd->len;
    }
    if (x->f && !x->fail) /* slots came free for chunks waiting to be admitted */
        admit(x);
    if (x->pf_sub == 0)
        pthread_cond_broadcast(&x->cv_compute);
}

/* Read ahead the missing neurons FFN f's predictor picks on x->pf_in. */
static void prefetch_ffn(pi2_engine *e, const eng_ffn *f)
{
    eng_ofl *x = e->ofl;
    uint32_t fi = ffn_index(x, f), hot = x->ghot_n[fi];
    uint32_t n = eng_predict_from(e, f, x->pf_in, hot, x->pf_list);
    pthread_mutex_lock(&x->mu);
    int set = x->pf_cur = (x->pf_cur + 1) % OFL_PF_SETS;
    struct ofl_pf *P = &x->pf[set];
    while (P->sub > 0) /* the prefetch two layers back is still reading */
        pthread_cond_wait(&x->cv_compute, &x->mu);
    P->fi = fi;
    /* leave at least half of what can be evicted to the step itself */
    uint32_t room_g = pi2_ncache_evictable(x->cg) / 2, room_u = x->cu ? pi2_ncache_evictable(x->cu) / 2 : 0;
    uint32_t m = 0;
    for (uint32_t k = 0; k < n && m < room_g; k++) {
        uint32_t i = x->pf_list[k];
        if (i < hot || pi2_ncache_contains(x->cg, fi, i))
            continue;
        pi2_err er = {0};
        if (!pi2_ncache_reserve(x->cg, fi, i, false, &P->gslot[m], &er)) {
            if (er.code == PI2_EINVAL) /* in flight for the other prefetch */
                continue;
            break;
        }
        P->sel[m] = i;
        P->flag[m] = F_GMISS;
        P->pos[i] = m + 1;
        if (x->spec && room_u > 0 && !pi2_ncache_contains(x->cu, fi, i) &&
            pi2_ncache_reserve(x->cu, fi, i, false, &P->uslot[m], &er)) {
            P->flag[m] |= F_SPEC;
            room_u--;
        }
        m++;
    }
    P->n = m;
    plist l = {P->sel, NULL, P->flag};
    if (m > 0 && queue_reads(x, &l, J_PF, fi, (uint32_t)set, x->two_phase ? P_GATE : P_FULL, 0, m) > 0)
        pthread_cond_signal(&x->cv_io);
    pthread_mutex_unlock(&x->mu);
}

/* Decode, before layer l's attention: predict its FFN's neurons from the
 * residual xres (MoE: route it to guess the experts first, into
 * e->moe_guess[l]) and start reading the missing ones. */
static void flash_layer_ahead(pi2_engine *e, int l, const float *xres)
{
    eng_ofl *x = e->ofl;
    if (e->dense)
        return;
    const pi2_model_desc *d = &e->d;
    const eng_layer *L = &e->layers[l];
    if (!x->read_ahead)
        return;
    /* nothing to read when every neuron of the layer's FFNs is in memory:
     * the predictor (and router) would run for nothing */
    bool cold = false;
    for (uint32_t fi = (uint32_t)l * x->E; fi < (uint32_t)(l + 1) * x->E && !cold; fi++)
        cold = x->ghot_n[fi] < x->bl[fi]->neurons;
    if (!cold)
        return;
    pi2_op_rmsnorm(x->pf_in, xres, L->ffn_norm, d->hidden, d->rms_eps);
    if (!pi2_desc_is_moe(d)) {
        if (L->ffn[0].has_pred)
            prefetch_ffn(e, &L->ffn[0]);
        return;
    }
    /* MoE: the router on the same input guesses the experts; their
     * predictors pick the neurons (the guess's weights are not used) */
    int k = d->n_experts_used, *g = e->moe_guess + (size_t)l * k;
    eng_route(e, L->router, x->pf_in, g, e->moe_wk);
    for (int r = 0; r < k; r++)
        if (L->ffn[g[r]].has_pred)
            prefetch_ffn(e, &L->ffn[g[r]]);
}

/* ---------------- prefill stream (under mu) ---------------- */

static bool stream_wants(const eng_ofl *x)
{
    return x->s_active && !x->s_cancel && !x->s_failed && x->s_next < x->n_win &&
           x->s_next < x->s_consumed + OFL_NWIN;
}

static void stream_fill(eng_ofl *x)
{
    while (stream_wants(x)) {
        uint32_t w = x->s_next++, b = w % OFL_NWIN;
        const ofl_win *W = &x->win[w];
        x->s_pending[b] = 0;
        for (uint64_t at = 0; at < W->len; at += OFL_SEQ_REQ) {
            uint32_t len = (uint32_t)(W->len - at < OFL_SEQ_REQ ? W->len - at : OFL_SEQ_REQ);
            ofl_rd rd = {.win = (int32_t)w, .len = len, .file_off = x->file_off[W->fi] + W->off + at,
                         .dst = x->wbuf[b] + at};
            rq_push(x, &rd);
            x->s_pending[b]++;
        }
    }
}

static void stream_landed(eng_ofl *x, const ofl_req *r, const pi2_err *er)
{
    x->s_sub--;
    if (r->io.result < 0 && !x->s_failed) {
        x->s_failed = true;
        x->s_err = *er;
        if (!x->s_err.code)
            pi2_err_set(&x->s_err, PI2_EIO, "%s: read at offset %llu failed", x->e->path,
                        (unsigned long long)r->rd.file_off);
    }
    if (r->io.result >= 0) {
        x->c_pre_bytes += r->rd.len;
        uint32_t b = (uint32_t)r->rd.win % OFL_NWIN;
        if (--x->s_pending[b] == 0)
            x->s_ready[b] = r->rd.win;
    }
    pthread_cond_broadcast(&x->cv_stream);
}

/* ---------------- the I/O thread ---------------- */

static void *io_main(void *arg)
{
    eng_ofl *x = arg;
    ofl_req **subs = x->subs;
    pi2_io_req *done[64];
    int gained = pi2_thread_raise_priority(PI2_IO_THREAD_NICE);
    pthread_mutex_lock(&x->mu);
    x->info.io_nice = gained;
    x->io_up = true;
    pthread_cond_broadcast(&x->cv_compute);
    for (;;) {
        while (!x->stop && x->rq_n == 0 && pi2_io_inflight(x->io) == 0 && !stream_wants(x))
            pthread_cond_wait(&x->cv_io, &x->mu);
        if (x->stop)
            break;
        stream_fill(x);
        int m = 0;
        while (x->rq_n > 0 && x->n_free > 0) {
            const ofl_rd *head = &x->rq[x->rq_head];
            if (head->win < 0 && head->job == J_DEC && x->fail) { /* the job failed: drop its reads */
                x->rq_head = (x->rq_head + 1) % x->rq_cap;
                x->rq_n--;
                if (--x->n_sub == 0)
                    pthread_cond_broadcast(&x->cv_compute);
                continue;
            }
            ofl_req *r = x->free_req[--x->n_free];
            r->rd = *head;
            x->rq_head = (x->rq_head + 1) % x->rq_cap;
            x->rq_n--;
            if (r->rd.win >= 0)
                x->s_sub++;
            subs[m++] = r;
        }
        pthread_mutex_unlock(&x->mu);

        /* all taken at once: one system call for the lot (a read each cost
         * one, the I/O thread's main cost on a core it shares) */
        int bad = -1;
        pi2_err ser = {0};
        pi2_io_req *ps[64];
        for (int i0 = 0; i0 < m && bad < 0; i0 += 64) {
            int k = m - i0 < 64 ? m - i0 : 64;
            for (int i = 0; i < k; i++) {
                ofl_req *r = subs[i0 + i];
                r->io = (pi2_io_req){.off = r->rd.file_off, .len = r->rd.len,
                                     .buf = r->rd.win >= 0 ? r->rd.dst : r->staging, .user = r};
                ps[i] = &r->io;
            }
            if (pi2_io_submit(x->io, ps, k, &ser) != 0)
                bad = i0; /* nothing of this batch was queued */
        }
        int n = 0;
        pi2_err er = {0};
        if (pi2_io_inflight(x->io) > 0) {
            n = pi2_io_wait_timeout(x->io, 1, done, 64, OFL_POLL_US, &er);
            if (n < 0)
                n = 0; /* the ring itself failed: the requests report it one by one */
            for (int i = 0; i < n; i++) {
                ofl_req *r = done[i]->user;
                if (r->rd.win < 0 && r->io.result >= 0) {
                    if (r->rd.job == J_PF)
                        pf_copy(x, r);
                    else
                        decode_copy(x, r);
                }
            }
        }

        pthread_mutex_lock(&x->mu);
        for (int i = bad; i >= 0 && i < m; i++) { /* not submitted: fail as reads */
            ofl_req *r = subs[i];
            r->io.result = -EIO;
            if (r->rd.win >= 0) {
                stream_landed(x, r, &ser);
            } else if (r->rd.job == J_PF) {
                pf_landed(x, &r->rd, false, &ser);
            } else {
                x->n_sub--;
                job_fail(x, &ser);
                if (x->n_sub == 0)
                    pthread_cond_broadcast(&x->cv_compute);
            }
            x->free_req[x->n_free++] = r;
        }
        for (int i = 0; i < n; i++) {
            ofl_req *r = done[i]->user;
            if (r->rd.win >= 0) {
                stream_landed(x, r, &er);
            } else if (r->rd.job == J_PF) {
                pf_landed(x, &r->rd, r->io.result >= 0, &er);
            } else if (r->io.result < 0) {
                pi2_err fe = er;
                if (!fe.code)
                    pi2_err_set(&fe, PI2_EIO, "%s: read at offset %llu failed", x->e->path,
                                (unsigned long long)r->rd.file_off);
                x->n_sub--;
                job_fail(x, &fe);
                if (x->n_sub == 0)
                    pthread_cond_broadcast(&x->cv_compute);
            } else {
                decode_landed(x, &r->rd);
            }
            x->free_req[x->n_free++] = r;
        }
    }
    pthread_mutex_unlock(&x->mu);
    return NULL;
}

/* ---------------- compute side of a decode job ---------------- */

/* One-phase chunk, or the gate step of a two-phase chunk (runtime/ffn.c). */
static uint8_t run_gates(eng_ofl *x, eng_tls *s, uint32_t c)
{
    const eng_ffn *f = x->f;
    ofl_chunk *C = &x->ch[c];
    int n = (int)(C->k1 - C->k0);
    const uint32_t *idx = x->sel + C->k0;
    if (x->two_phase) {
        ffn_chunk_gate(&x->dec, s, idx, n);
        s->predicted += (uint64_t)n;
        s->bytes += (uint64_t)n * f->gate.row_bytes;
        uint32_t nf = 0;
        for (int q = 0; q < n; q++) {
            x->gval[C->k0 + (uint32_t)q] = s->g[q];
            if (s->g[q] > x->dec.gate_thr)
                x->fired[C->k0 + nf++] = C->k0 + (uint32_t)q;
        }
        C->n_fired = nf;
        return nf ? M_UD : M_DONE;
    }
    ffn_counts k = ffn_chunk(&x->dec, s, idx, 0, n, x->parts + (size_t)c * (size_t)x->dec.D, NULL, 0);
    C->has_out = k.down > 0;
    s->predicted += (uint64_t)k.gate;
    s->active += (uint64_t)k.down;
    s->bytes += (uint64_t)k.gate * f->gate.row_bytes + (uint64_t)k.up * f->up.row_bytes +
                (uint64_t)k.down * f->down.row_bytes;
    return M_DONE;
}

/* The up+down step of a two-phase chunk: its fired neurons. */
static void run_updown(eng_ofl *x, eng_tls *s, uint32_t c)
{
    const eng_ffn *f = x->f;
    ofl_chunk *C = &x->ch[c];
    int nf = (int)C->n_fired;
    int a = ffn_chunk_updown(&x->dec, s, x->sel, x->gval, x->fired + C->k0, nf,
                             x->parts + (size_t)c * (size_t)x->dec.D);
    C->has_out = a > 0;
    s->active += (uint64_t)a;
    s->bytes += (uint64_t)a * f->down.row_bytes + (uint64_t)nf * f->up.row_bytes;
}

static void compute_fn(void *ctx, int tid, int nt)
{
    (void)nt;
    eng_ofl *x = ctx;
    eng_tls *s = &x->e->tls[tid];
    pthread_mutex_lock(&x->mu);
    for (;;) {
        if (x->fail || x->finished)
            break;
        if (x->ready_n == 0) {
            if (x->running == 0 && x->rq_n == 0 && x->n_sub == 0 && x->pf_sub == 0) {
                /* nothing computing, nothing in flight, and no admission possible */
                pi2_err er = {0};
                pi2_err_set(&er, PI2_ENOMEM, "%s: the neuron cache is too small for one chunk of neurons",
                            x->e->path);
                job_fail(x, &er);
                break;
            }
            /* reads land every few microseconds: spin (yielding) before sleeping;
             * idle time counts as I/O wait when reads are outstanding */
            double t0 = x->n_sub + x->pf_sub + x->rq_n > 0 ? pi2_now() : 0.0;
            atomic_store_explicit(&x->hint, 0u, memory_order_relaxed);
            pthread_mutex_unlock(&x->mu);
            for (int i = 0; i < OFL_SPIN && atomic_load_explicit(&x->hint, memory_order_acquire) == 0; i++)
                if (i % 64 == 63)
                    sched_yield();
            pthread_mutex_lock(&x->mu);
            while (x->ready_n == 0 && !x->fail && !x->finished) {
                x->n_sleeping++;
                pthread_cond_wait(&x->cv_compute, &x->mu);
                x->n_sleeping--;
            }
            if (t0 > 0)
                s->wait += pi2_now() - t0;
            continue;
        }
        uint32_t c = x->ready[x->ready_head];
        x->ready_head = (x->ready_head + 1) % x->ready_cap;
        x->ready_n--;
        x->running++;
        int state = x->ch[c].state;
        pthread_mutex_unlock(&x->mu);
        uint8_t msg;
        if (state == CH_UD_READY) {
            run_updown(x, s, c);
            msg = M_DONE;
        } else {
            msg = run_gates(x, s, c);
        }
        pthread_mutex_lock(&x->mu);
        chunk_step_done(x, msg, c);
    }
    pthread_mutex_unlock(&x->mu);
}

typedef struct ofl_reduce {
    eng_ofl *x;
    float *out;
    bool accumulate;
    float w;
} ofl_reduce;

static void reduce_fn(void *ctx, int tid, int nt)
{
    ofl_reduce *r = ctx;
    eng_ofl *x = r->x;
    int64_t D = x->e->d.hidden;
    for (int64_t u; (u = eng_share_next(x->e, tid, nt)) >= 0;) {
        int64_t b = u * ENG_SUM_UNIT, en = b + ENG_SUM_UNIT < D ? b + ENG_SUM_UNIT : D;
        eng_sum_rows(r->out, x->parts, D, x->out_rows, x->n_out, b, en, r->accumulate, r->w);
    }
}

/* After a failed job, no read in flight: drop reservations and holds. */
static void job_cleanup(eng_ofl *x)
{
    for (uint32_t k = 0; k < x->n_sel; k++) {
        uint8_t fl = x->flag[k];
        if (fl & F_GMISS)
            pi2_ncache_abort(x->cg, x->gslot[k]);
        else if (fl & F_GHELD)
            pi2_ncache_release(x->cg, x->gslot[k]);
        if (fl & (F_UMISS | F_SPEC))
            pi2_ncache_abort(x->cu, x->uslot[k]);
        if (fl & F_PFWAIT) {
            for (int p = 0; p < OFL_PF_SETS; p++)
                if (x->pf[p].fi == x->fi)
                    x->pf[p].wait[x->sel[k]] = 0;
        }
        else if (fl & F_UHELD)
            pi2_ncache_release(x->cu, x->uslot[k]);
        x->flag[k] = 0;
    }
}

/* Decode FFN of n_sel neurons e->sel[0..n_sel) (mode FFN_*), into out. */
static int flash_decode(pi2_engine *e, const eng_ffn *f, uint32_t n_sel, int mode, float *out, bool accumulate,
                        float w, pi2_err *err)
{
    eng_ofl *x = e->ofl;
    int rc = pi2_io_check_size(x->io, err);
    if (rc)
        return rc;
    if (mode != FFN_PRED) {
        for (uint32_t i = 0; i < f->n_ff; i++)
            e->sel[i] = i;
        n_sel = f->n_ff;
    }
    e->st.ffn_evals++;
    e->st.neurons += f->n_ff;
    if (n_sel == 0) {
        if (!accumulate)
            memset(out, 0, (size_t)e->d.hidden * sizeof(float));
        return 0;
    }
    for (int t = 0; t < e->threads; t++) {
        eng_tls *s = &e->tls[t];
        s->predicted = s->active = s->bytes = 0;
        s->wait = 0;
    }
    pthread_mutex_lock(&x->mu);
    x->f = f;
    x->fi = ffn_index(x, f);
    x->dec = ffn_dec_of(e, f, mode);
    x->sel = e->sel;
    x->n_sel = n_sel;
    x->n_ch = (n_sel + FFN_CHUNK - 1) / FFN_CHUNK;
    x->next_admit = x->n_done = x->running = 0;
    x->ud_head = x->ud_n = 0;
    x->ready_head = x->ready_n = 0;
    x->fail = x->finished = false;
    memset(x->flag, 0, n_sel);
    for (uint32_t c = 0; c < x->n_ch; c++) {
        uint32_t k1 = (c + 1) * FFN_CHUNK;
        x->ch[c] = (ofl_chunk){.k0 = c * FFN_CHUNK, .k1 = k1 < n_sel ? k1 : n_sel, .state = CH_WAIT};
    }
    admit(x);
    pthread_mutex_unlock(&x->mu);
    pi2_pool_run_shared(e->pool, compute_fn, x);
    pthread_mutex_lock(&x->mu);
    while (x->n_sub > 0) /* failed: wait for the reads in flight */
        pthread_cond_wait(&x->cv_compute, &x->mu);
    bool failed = x->fail;
    if (failed)
        job_cleanup(x);
    x->f = NULL;
    pthread_mutex_unlock(&x->mu);
    double wait = 0;
    for (int t = 0; t < e->threads; t++) {
        e->st.predicted += e->tls[t].predicted;
        e->st.active += e->tls[t].active;
        e->st.weight_bytes += e->tls[t].bytes;
        wait += e->tls[t].wait;
    }
    x->c_wait += wait / e->threads;
    if (failed)
        return pi2_err_set(err, x->fail_err.code, "%s", x->fail_err.msg);
    x->n_out = 0;
    for (uint32_t c = 0; c < x->n_ch; c++)
        if (x->ch[c].has_out)
            x->out_rows[x->n_out++] = c;
    ofl_reduce r = {x, out, accumulate, w};
    eng_run_units(e, (e->d.hidden + ENG_SUM_UNIT - 1) / ENG_SUM_UNIT, reduce_fn, &r);
    return 0;
}

/* ---------------- prefill stream (main thread side) ---------------- */

static void stream_end(pi2_engine *e)
{
    eng_ofl *x = e->ofl;
    pthread_mutex_lock(&x->mu);
    if (x->s_active) {
        x->s_cancel = true;
        x->rq_n = 0; /* only stream reads are queued during a prefill step */
        while (x->s_sub > 0)
            pthread_cond_wait(&x->cv_stream, &x->mu);
        x->s_active = x->s_cancel = false;
    }
    pthread_mutex_unlock(&x->mu);
}

/* Prefill: a stream of every FFN's flash windows, in layer / expert order,
 * read ahead while earlier ones compute. Every FFN is either computed or
 * skipped, in order. */
static int stream_begin(pi2_engine *e, pi2_err *err)
{
    eng_ofl *x = e->ofl;
    int rc = pi2_io_check_size(x->io, err);
    if (rc)
        return rc;
    stream_end(e); /* a previous step that did not end */
    pthread_mutex_lock(&x->mu);
    while (x->pf_sub > 0) /* a prefetch of the last decode step still reading */
        pthread_cond_wait(&x->cv_compute, &x->mu);
    x->s_active = true;
    x->s_cancel = x->s_failed = false;
    x->s_next = x->s_consumed = 0;
    x->s_cursor = 0;
    for (int b = 0; b < OFL_NWIN; b++)
        x->s_ready[b] = -1;
    pthread_cond_signal(&x->cv_io);
    pthread_mutex_unlock(&x->mu);
    return 0;
}

/* Wait for window w; its buffer, or NULL with err set. */
static const uint8_t *stream_get(eng_ofl *x, uint32_t w, pi2_err *err)
{
    const uint8_t *buf = NULL;
    pthread_mutex_lock(&x->mu);
    while (x->s_ready[w % OFL_NWIN] != (int32_t)w && !x->s_failed)
        pthread_cond_wait(&x->cv_stream, &x->mu);
    if (x->s_ready[w % OFL_NWIN] == (int32_t)w)
        buf = x->wbuf[w % OFL_NWIN];
    else
        pi2_err_set(err, x->s_err.code ? x->s_err.code : PI2_EIO, "%s", x->s_err.msg);
    pthread_mutex_unlock(&x->mu);
    return buf;
}

static void stream_release(eng_ofl *x, uint32_t w)
{
    pthread_mutex_lock(&x->mu);
    x->s_ready[w % OFL_NWIN] = -1;
    x->s_consumed = w + 1;
    pthread_cond_signal(&x->cv_io);
    pthread_mutex_unlock(&x->mu);
}

/* Consume FFN f's windows in order: compute each (T > 0) or skip it. */
static int ffn_windows(pi2_engine *e, const eng_ffn *f, int T, pi2_err *err)
{
    eng_ofl *x = e->ofl;
    uint32_t fi = ffn_index(x, f);
    const pi2_bl_ffn *b = x->bl[fi];
    if (x->s_cursor != x->win_first[fi])
        return pi2_err_set(err, PI2_EINVAL, "%s: prefill stream out of order (FFN %u)", e->path, fi);
    bool first = true;
    for (uint32_t g0 = 0; g0 < b->groups; g0 += x->win_groups) {
        uint32_t g1 = g0 + x->win_groups < b->groups ? g0 + x->win_groups : b->groups;
        uint32_t n0 = g0 * b->group, n1 = g1 * b->group < b->neurons ? g1 * b->group : b->neurons;
        bool hot = (uint64_t)g1 * b->slot_bytes <= x->hot_len[fi];
        uint32_t w = x->s_cursor;
        if (!hot) {
            const uint8_t *buf = stream_get(x, w, err);
            if (!buf)
                return err->code;
            uint64_t base = (uint64_t)g0 * b->slot_bytes;
            for (uint32_t i = n0 > x->hot_n[fi] ? n0 : x->hot_n[fi]; i < n1; i++) {
                uint64_t off[3];
                pi2_bl_neuron_offsets(b, x->R, x->two_phase, i, off);
                if (i >= x->ghot_n[fi]) /* hot gates keep their memory */
                    f->gate.rp[i] = buf + (off[0] - base);
                f->up.rp[i] = buf + (off[1] - base);
                f->down.rp[i] = buf + (off[2] - base);
            }
        }
        if (T > 0 && n1 > n0) {
            eng_ffn_prefill_range(e, f, T, n0, n1, first);
            first = false;
        }
        if (!hot) {
            stream_release(x, w);
            x->s_cursor++;
        }
    }
    return 0;
}

static int flash_prefill(pi2_engine *e, const eng_ffn *f, int T, float *out, bool accumulate, float w, pi2_err *err)
{
    int rc = ffn_windows(e, f, T, err);
    if (rc)
        return rc;
    eng_ffn_reduce(e, T, out, accumulate, w);
    return 0;
}

static int flash_skip(pi2_engine *e, const eng_ffn *f, pi2_err *err) { return ffn_windows(e, f, 0, err); }

static int flash_begin_pass(pi2_engine *e, bool decode, pi2_err *err) { return decode ? 0 : stream_begin(e, err); }

static void flash_end_pass(pi2_engine *e, bool decode)
{
    if (!decode)
        stream_end(e);
}

const ffn_source eng_ffn_flash = {
    .begin_pass = flash_begin_pass,
    .layer_ahead = flash_layer_ahead,
    .decode = flash_decode,
    .prefill = flash_prefill,
    .skip = flash_skip,
    .end_pass = flash_end_pass,
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
    out->parts = x->c_parts;
    out->parts_hot = x->c_hot;
    out->parts_hit = x->c_hit;
    out->parts_read = x->c_read;
    out->reads = x->c_reads;
    out->bytes_read = x->c_bytes;
    out->parts_prefetched = x->c_pf;
    out->prefetch_waits = x->c_pfwait;
    out->io_wait_s = x->c_wait;
    out->prefill_bytes_read = x->c_pre_bytes;
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
    x->c_parts = x->c_hot = x->c_hit = x->c_read = x->c_reads = x->c_bytes = x->c_pre_bytes = 0;
    x->c_pf = x->c_pfwait = 0;
    x->c_wait = 0;
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
