/* pi2 offloading: the streamed ring (runtime/offload/offload.h).
 *
 * When the memory plan streams the predictors (q8/q4 members, used as
 * stored) or the attention projections of some layers
 * (pi2_plan_stream_sizes), open reads the resident region without their
 * pages and hashes each layer's members in a ring slot; a pass then reads
 * a streamed layer's members (predictors of every expert, q, k, v, o
 * payloads and scales) into a slot of the ring with direct I/O ahead of
 * use: the streamed layer `slots` ahead is started as soon as a layer is
 * done with its slot (its predictors have run), so the read overlaps the
 * FFN and the next layer's attention. A layer's slot is bound before its
 * attention when its attention streams (every pass: prefill, sparse and
 * dense decode), else before its predictors (sparse decode). Slots keep
 * what they hold (the file does not change), so a pass finds what the
 * last one left. The reader is this room's second one, used by the
 * compute thread alone (the I/O thread owns the first). */
#include "runtime/offload/offload.h"
#include "runtime/offload/ofl_state.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define PS_REQ (4u << 20) /* a read's bytes at most */
#define PS_DEPTH 32       /* reads in flight */
#define PS_MAX_SLOTS 2

enum { PS_EMPTY = 0, PS_READING, PS_READY, PS_INUSE };
/* What a member is: a predictor's fc1, fc2, their scales; an attention
 * matrix's payload or scales. */
enum { PM_FC1 = 0, PM_FC2, PM_S1, PM_S2, PM_ATTN, PM_ATTN_S };

/* One streamed member: where it lies and where a slot holds it. */
typedef struct ps_mem {
    const pi2_ctr_section *s;
    uint64_t at;  /* offset in its layer's slot */
    uint8_t kind; /* PM_* */
    uint8_t x;    /* its expert (predictors), or the matrix: 0..3 for q, k, v, o */
} ps_mem;

typedef struct ofl_pstream {
    pi2_io *io;
    int n_layers, E, slots;
    bool pred;    /* the predictors stream */
    int attn;     /* the attention of the last attn layers does */
    uint64_t slot_bytes;
    ps_mem *mem;  /* every streamed layer's members, layer by layer, each from a page boundary of its slot */
    size_t n_mem;
    size_t *first; /* [n_layers + 1]: layer l's are mem[first[l] .. first[l + 1]) */
    int *order, n_order; /* the streamed layers, ascending: the ring's cycle */
    int *idx;      /* [n_layers]: a layer's place in order, or -1 */
    uint8_t *buf;  /* [slots][slot_bytes] */
    int layer[PS_MAX_SLOTS], state[PS_MAX_SLOTS];
    pi2_io_req *req; /* [slots][max_req] */
    int max_req, n_req[PS_MAX_SLOTS], next[PS_MAX_SLOTS], pending[PS_MAX_SLOTS];
    uint64_t bytes; /* read while running */
} ofl_pstream;

static uint64_t page_up(uint64_t n) { return (n + PI2_IO_ALIGN - 1) / PI2_IO_ALIGN * PI2_IO_ALIGN; }

/* Member `name` of layer l appended to the table at *used of its slot. */
static int ps_add(pi2_engine *e, ofl_pstream *ps, const char *name, int kind, int x, uint64_t *used, pi2_err *err)
{
    ps_mem *m = &ps->mem[ps->n_mem];
    if (!(m->s = name && name[0] ? pi2_manifest_find_section(e->mf, name) : NULL) || m->s->offset % PI2_IO_ALIGN)
        return pi2_err_set(err, PI2_EFORMAT, "%s: streamed member %s is missing or unaligned", e->path,
                           name ? name : "?");
    m->kind = (uint8_t)kind;
    m->x = (uint8_t)x;
    m->at = *used;
    *used += page_up(m->s->size);
    ps->n_mem++;
    return 0;
}

/* Layer l's members: its predictors (every expert's, when they stream),
 * then its attention (when it streams), in one slot. */
static int ps_layer(pi2_engine *e, ofl_pstream *ps, int l, pi2_err *err)
{
    static const pi2_tname roles[4] = {PI2_T_Q, PI2_T_K, PI2_T_V, PI2_T_O};
    uint64_t used = 0;
    int rc = 0;
    ps->first[l] = ps->n_mem;
    for (int x = 0; ps->pred && rc == 0 && x < ps->E; x++) {
        const pi2_mf_layer *ml = pi2_manifest_find_layer(e->mf, l, ps->E > 1 ? x : -1);
        if (!ml || !ml->has_predictor)
            return pi2_err_set(err, PI2_EFORMAT, "%s: no predictor for layer %d expert %d", e->path, l, x);
        const pi2_mf_predictor *p = &ml->predictor;
        const char *names[4] = {p->fc1, p->fc2, p->fc1_scales, p->fc2_scales};
        for (int k = 0; rc == 0 && k < 4; k++)
            rc = ps_add(e, ps, names[k], PM_FC1 + k, x, &used, err);
    }
    for (int k = 0; rc == 0 && pi2_plan_stream_attn_layer(ps->n_layers, ps->attn, l) && k < 4; k++) {
        const pi2_mf_tensor *t = pi2_manifest_find_tensor(e->mf, roles[k], l, -1);
        if (!t)
            return pi2_err_set(err, PI2_EFORMAT, "%s: no %s tensor for layer %d", e->path,
                               pi2_manifest_role_name(roles[k]), l);
        rc = ps_add(e, ps, t->payload, PM_ATTN, k, &used, err);
        if (rc == 0 && t->qtype != PI2_QT_F32)
            rc = ps_add(e, ps, t->scales, PM_ATTN_S, k, &used, err);
    }
    if (rc == 0 && used > ps->slot_bytes) /* the planner's sizes are these */
        rc = pi2_err_set(err, PI2_EFORMAT, "%s: the streamed members of layer %d exceed their ring slot", e->path, l);
    uint64_t n = 0;
    for (size_t i = ps->first[l]; rc == 0 && i < ps->n_mem; i++)
        n += (page_up(ps->mem[i].s->size) + PS_REQ - 1) / PS_REQ;
    ps->max_req = (int)n > ps->max_req ? (int)n : ps->max_req;
    return rc;
}

/* The member table and the ring's cycle. */
static int ps_table(pi2_engine *e, ofl_pstream *ps, pi2_err *err)
{
    size_t L = (size_t)ps->n_layers;
    if (!(ps->mem = pi2_calloc_array(L * ((size_t)ps->E * 4 + 8), sizeof *ps->mem)) ||
        !(ps->first = pi2_calloc_array(L + 1, sizeof *ps->first)) ||
        !(ps->order = pi2_calloc_array(L, sizeof *ps->order)) || !(ps->idx = pi2_calloc_array(L, sizeof *ps->idx)))
        return pi2_err_set(err, PI2_ENOMEM, "out of memory");
    int rc = 0;
    for (int l = 0; rc == 0 && l < ps->n_layers; l++) {
        rc = ps_layer(e, ps, l, err);
        ps->idx[l] = -1;
        if (rc == 0 && ps->n_mem > ps->first[l]) {
            ps->idx[l] = ps->n_order;
            ps->order[ps->n_order++] = l;
        }
    }
    ps->first[L] = ps->n_mem;
    if (rc == 0 && ps->n_order == 0)
        rc = pi2_err_set(err, PI2_EFORMAT, "%s: nothing to stream", e->path);
    return rc;
}

int ofl_ps_open(pi2_engine *e, eng_ofl *x, pi2_err *err)
{
    uint64_t skipped, slot;
    if (!pi2_plan_stream_sizes(e->mf, e->bl, e->pred_stream, e->attn_stream, &skipped, &slot))
        return pi2_err_set(err, PI2_EUNSUPPORTED, "%s: the plan's members cannot be streamed", e->path);
    ofl_pstream *ps = calloc(1, sizeof *ps);
    if (!ps)
        return pi2_err_set(err, PI2_ENOMEM, "out of memory");
    x->ps = ps;
    ps->n_layers = e->mf->config.n_layers;
    ps->E = pi2_desc_is_moe(&e->mf->config) ? e->mf->config.n_experts : 1;
    ps->pred = e->pred_stream;
    ps->attn = e->attn_stream;
    ps->slot_bytes = slot;
    for (int s = 0; s < PS_MAX_SLOTS; s++)
        ps->layer[s] = -1;
    int rc = ps_table(e, ps, err);
    if (rc)
        return rc;
    ps->slots = pi2_plan_ring_slots(ps->n_order); /* the planner's: n_layers with the predictors, else attn */
    if (!(ps->req = pi2_calloc_array((size_t)ps->slots * (size_t)ps->max_req, sizeof *ps->req)) ||
        !(ps->buf = pi2_io_alloc_buf((size_t)(ps->slots * slot))))
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory for the streamed ring (%.1f MB)", e->path,
                           (double)(ps->slots * slot) / 1048576.0);
    pi2_io_opts io;
    pi2_io_defaults(&io);
    io.backend = x->io_backend;
    io.depth = PS_DEPTH;
    io.buffered = x->buffered;
    return pi2_io_open(&ps->io, e->path, &io, err);
}

void ofl_ps_free(eng_ofl *x)
{
    ofl_pstream *ps = x->ps;
    if (!ps)
        return;
    pi2_io_close(ps->io); /* waits for reads in flight */
    pi2_io_free_buf(ps->buf);
    free(ps->req);
    free(ps->mem);
    free(ps->first);
    free(ps->order);
    free(ps->idx);
    free(ps);
    x->ps = NULL;
}

/* ---- open: the resident region without the predictors ---- */

static int cmp_off(const void *a, const void *b)
{
    uint64_t x = (*(const pi2_ctr_section *const *)a)->offset, y = (*(const pi2_ctr_section *const *)b)->offset;
    return x < y ? -1 : x > y;
}

/* Each layer's members read into slot 0 and hashed there against the
 * signed manifest: every byte checked, none kept beyond the ring. */
static int ps_verify(pi2_engine *e, eng_ofl *x, pi2_err *err)
{
    ofl_pstream *ps = x->ps;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < ps->n_mem; i++) {
            const ps_mem *m = &ps->mem[i];
            uint8_t dg[PI2_SHA256_LEN];
            if ((rc = ofl_seq_read(x->io, x->depth, ps->buf + m->at, m->s->offset, page_up(m->s->size), NULL,
                                   err)) != 0 ||
                (rc = pi2_sha256(ps->buf + m->at, (size_t)m->s->size, dg, err)) != 0)
                break;
            if (memcmp(dg, m->s->sha256, sizeof dg) != 0)
                rc = pi2_err_set(err, PI2_ESIG,
                                 "%s: member %s does not match its SHA-256 in the signed manifest (corrupt or "
                                 "altered file)",
                                 e->path, m->s->name);
    }
    if (rc == 0) { /* slot 0 holds the last streamed layer */
        ps->layer[0] = ps->order[ps->n_order - 1];
        ps->state[0] = PS_READY;
    }
    return rc;
}

int ofl_ps_load_resident(pi2_engine *e, eng_ofl *x, uint64_t end, pi2_err *err)
{
    ofl_pstream *ps = x->ps;
    size_t n = ps->n_mem, n_rng = 0;
    const pi2_ctr_section **hole = pi2_malloc_array(n, sizeof *hole);
    const char **names = pi2_malloc_array(n, sizeof *names);
    uint8_t **rb = pi2_malloc_array(n + 1, sizeof *rb);
    uint64_t *ro = pi2_malloc_array(n + 1, sizeof *ro), *rl = pi2_malloc_array(n + 1, sizeof *rl);
    int rc = 0;
    if (!hole || !names || !rb || !ro || !rl) {
        rc = pi2_err_set(err, PI2_ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        hole[i] = ps->mem[i].s;
        names[i] = hole[i]->name;
    }
    qsort(hole, n, sizeof *hole, cmp_off);
    /* the ranges between the holes; the holes' pages never touched, and
     * never made huge pages by a neighbour's fault */
    uint64_t at = 0;
    for (size_t i = 0; i <= n; i++) {
        uint64_t a = i < n ? hole[i]->offset : end, b = i < n ? page_up(hole[i]->offset + hole[i]->size) : end;
        if (a > end || b > end || a < at) {
            rc = pi2_err_set(err, PI2_EFORMAT, "%s: streamed member %s overlaps another or the FFN region", e->path,
                             i < n ? hole[i]->name : "?");
            goto out;
        }
        if (a > at) {
            rb[n_rng] = e->res + at;
            ro[n_rng] = at;
            rl[n_rng++] = a - at;
        }
#ifdef MADV_NOHUGEPAGE
        if (b > a)
            madvise(e->res + a, (size_t)(b - a), MADV_NOHUGEPAGE);
#endif
        at = b;
    }
    pi2_io_prefault(rb, rl, (int)n_rng, e->threads, NULL, NULL);
    for (size_t r = 0; rc == 0 && r < n_rng; r++)
        rc = ofl_seq_read(x->io, x->depth, rb[r], ro[r], rl[r], NULL, err);
    if (rc == 0)
        rc = pi2_bundle_verify_copy_except(e->b, e->res, end, names, n, err);
    if (rc == 0)
        rc = ps_verify(e, x, err);
out:
    free(hole);
    free(names);
    free(rb);
    free(ro);
    free(rl);
    return rc;
}

/* ---- a pass: the ring ---- */

/* Matrix mt's payload rows (or, scales, its scale rows) pointed at p, one
 * after another as stored (p NULL: at nothing). */
static void ps_bind_rows(eng_mat *mt, bool scales, const uint8_t *p)
{
    if (mt->qt == PI2_QT_F32) {
        mt->f32 = (const float *)(const void *)p;
        return;
    }
    size_t step = scales ? pi2_q_scale_row_count(mt->qt, mt->cols) * 2 : pi2_q_payload_row_bytes(mt->qt, mt->cols);
    for (int64_t r = 0; r < mt->rows; r++) {
        const uint8_t *q = p ? p + (size_t)r * step : NULL;
        if (scales)
            mt->rs[r] = (const uint16_t *)(const void *)q;
        else
            mt->rp[r] = q;
    }
}

/* Layer l's streamed rows pointed at slot s (s < 0: at nothing). */
static void ps_bind(pi2_engine *e, ofl_pstream *ps, int l, int s)
{
    const uint8_t *base = s >= 0 ? ps->buf + (uint64_t)s * ps->slot_bytes : NULL;
    eng_layer *L = &e->layers[l];
    eng_mat *mats[4] = {&L->q, &L->k, &L->v, &L->o};
    for (size_t i = ps->first[l]; i < ps->first[l + 1]; i++) {
        const ps_mem *m = &ps->mem[i];
        const uint8_t *p = base ? base + m->at : NULL;
        if (m->kind >= PM_ATTN) { /* x is the matrix */
            ps_bind_rows(mats[m->x], m->kind == PM_ATTN_S, p);
            continue;
        }
        eng_ffn *f = &L->ffn[m->x]; /* x is the expert */
        switch (m->kind) {
        case PM_FC1: f->q1 = p; break;
        case PM_FC2: f->q2 = p; break;
        case PM_S1: f->s1 = (const uint16_t *)(const void *)p; break;
        default: f->s2 = (const uint16_t *)(const void *)p; break;
        }
    }
}

void ofl_ps_unbind_all(pi2_engine *e, eng_ofl *x)
{
    for (int l = 0; x->ps && l < x->ps->n_layers; l++)
        ps_bind(e, x->ps, l, -1);
}

bool ofl_ps_wants(const eng_ofl *x, int l, bool preds)
{
    const ofl_pstream *ps = x->ps;
    return ps && ps->idx[l] >= 0 && ((preds && ps->pred) || pi2_plan_stream_attn_layer(ps->n_layers, ps->attn, l));
}

/* The streamed layer k places after l in the ring's cycle. */
static int ps_after(const ofl_pstream *ps, int l, int k) { return ps->order[(ps->idx[l] + k) % ps->n_order]; }

/* Submit what the reader has room for, slot by slot. */
static int ps_submit(ofl_pstream *ps, pi2_err *err)
{
    for (int s = 0; s < ps->slots; s++)
        while (ps->next[s] < ps->n_req[s] && pi2_io_inflight(ps->io) < PS_DEPTH) {
            pi2_io_req *r = &ps->req[(size_t)s * (size_t)ps->max_req + (size_t)ps->next[s]];
            int rc = pi2_io_submit(ps->io, &r, 1, err);
            if (rc)
                return rc;
            ps->next[s]++;
            ps->pending[s]++;
        }
    return 0;
}

/* Start reading layer l into slot s. */
static int ps_start(ofl_pstream *ps, int s, int l, pi2_err *err)
{
    uint8_t *base = ps->buf + (uint64_t)s * ps->slot_bytes;
    pi2_io_req *req = ps->req + (size_t)s * (size_t)ps->max_req;
    int n = 0;
    for (size_t i = ps->first[l]; i < ps->first[l + 1]; i++) {
        const ps_mem *m = &ps->mem[i];
        uint64_t len = page_up(m->s->size);
        for (uint64_t o = 0; o < len; o += PS_REQ)
            req[n++] = (pi2_io_req){.off = m->s->offset + o,
                                    .len = (uint32_t)(len - o < PS_REQ ? len - o : PS_REQ),
                                    .buf = base + m->at + o,
                                    .user = (void *)(uintptr_t)s};
    }
    ps->layer[s] = l;
    ps->state[s] = PS_READING;
    ps->n_req[s] = n;
    ps->next[s] = ps->pending[s] = 0;
    return ps_submit(ps, err);
}

/* Reap landed reads until slot s (or, s < 0, every slot) is read and
 * has no read in flight (a slot is reused only then). A failed read
 * empties its slot (read again when next needed) and is an error only
 * for the slot waited for. */
static int ps_wait(ofl_pstream *ps, int s, pi2_err *err)
{
    int rc = 0;
    for (;;) {
        bool busy = false;
        for (int k = 0; k < ps->slots; k++)
            busy |= (s < 0 || k == s) && (ps->state[k] == PS_READING || ps->pending[k] > 0);
        if (!busy)
            return rc;
        pi2_io_req *d[PS_DEPTH];
        pi2_err we = {0};
        int n = pi2_io_wait(ps->io, 1, d, PS_DEPTH, &we);
        if (n < 0)
            return pi2_err_set(err, we.code ? we.code : PI2_EIO, "%s", we.msg);
        for (int i = 0; i < n; i++) {
            int k = (int)(uintptr_t)d[i]->user;
            ps->pending[k]--;
            if (d[i]->result < 0) {
                ps->state[k] = PS_EMPTY;
                ps->layer[k] = -1;
                ps->next[k] = ps->n_req[k]; /* nothing more submitted for it */
                if (rc == 0 && (s < 0 || k == s))
                    rc = pi2_err_set(err, we.code ? we.code : PI2_EIO, "%s", we.msg);
            } else {
                ps->bytes += d[i]->len;
            }
            if (ps->state[k] == PS_READING && ps->pending[k] == 0 && ps->next[k] == ps->n_req[k])
                ps->state[k] = PS_READY;
        }
        int sub = ps_submit(ps, err);
        rc = rc ? rc : sub;
        if (sub)
            return rc;
    }
}

static int ps_find(const ofl_pstream *ps, int l)
{
    for (int s = 0; s < ps->slots; s++)
        if (ps->layer[s] == l && ps->state[s] != PS_EMPTY)
            return s;
    return -1;
}

int ofl_ps_release(pi2_engine *e, pi2_err *err)
{
    ofl_pstream *ps = e->ofl->ps;
    int rc = 0;
    for (int s = 0; ps && s < ps->slots && rc == 0; s++) {
        if (ps->state[s] != PS_INUSE)
            continue;
        int l = ps->layer[s], next = ps_after(ps, l, ps->slots);
        ps_bind(e, ps, l, -1);
        ps->state[s] = PS_READY;
        if (ps_find(ps, next) < 0)
            rc = ps_start(ps, s, next, err);
    }
    return rc;
}

int ofl_ps_need(pi2_engine *e, int l, pi2_err *err)
{
    ofl_pstream *ps = e->ofl->ps;
    if (!ps || ps->idx[l] < 0)
        return 0;
    int s = ps_find(ps, l);
    if (s >= 0 && ps->state[s] == PS_INUSE) /* bound since the last pass (a prefill after a decode) */
        return 0;
    int rc = ofl_ps_release(e, err);
    s = rc == 0 ? ps_find(ps, l) : -1;
    if (rc == 0 && s >= 0 && ps_wait(ps, s, err) != 0) {
        /* its read failed (perhaps in flight from a step that failed):
         * once more, afresh */
        pi2_err_clear(err);
        s = -1;
    }
    if (rc == 0 && s < 0) {
        /* not in the ring (the first token, a failed read): every read
         * landed, then l and the layers after it started afresh */
        pi2_err gone = {0};
        ps_wait(ps, -1, &gone); /* failures there only empty their slots */
        for (int k = 0; k < ps->slots && rc == 0; k++)
            if (ps->pending[k] > 0) /* the reader failed as a whole */
                rc = pi2_err_set(err, gone.code ? gone.code : PI2_EIO, "%s", gone.msg);
        for (int k = 0; k < ps->slots && rc == 0; k++)
            rc = ps_start(ps, k, ps_after(ps, l, k), err);
        s = 0;
        if (rc == 0)
            rc = ps_wait(ps, s, err);
    }
    if (rc)
        return rc;
    ps->state[s] = PS_INUSE;
    ps_bind(e, ps, l, s);
    return 0;
}

uint64_t ofl_ps_bytes(const eng_ofl *x) { return x->ps ? x->ps->bytes : 0; }
