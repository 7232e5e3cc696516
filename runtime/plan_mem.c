/* pi2 execution planner: the offloading engine's memory model (planner.h). */
#include "runtime/planner.h"

#include "runtime/engine.h"
#include "runtime/hwprof.h"

#include <stdlib.h>
#include <string.h>

static double mb(uint64_t b) { return (double)b / 1048576.0; }

static uint64_t tensor_bytes(const pi2_mf_tensor *t)
{
    if (t->qtype == PI2_QT_F32)
        return (uint64_t)t->rows * (uint64_t)t->cols * 4;
    return (uint64_t)t->rows *
           (pi2_q_payload_row_bytes(t->qtype, t->cols) + 2 * pi2_q_scale_row_count(t->qtype, t->cols));
}

uint64_t pi2_plan_container_touched(const pi2_ctr *c)
{
    const uint64_t page = 4096;
    /* the end of the archive, and the windows of the check after generating
     * (pi2_bundle_recheck) */
    uint64_t n = page + (uint64_t)PI2_BUNDLE_VERIFY_THREADS * PI2_BUNDLE_RECHECK_WINDOW;
    for (size_t i = 0; i < pi2_ctr_count(c); i++) {
        const pi2_ctr_member *m = pi2_ctr_at(c, i);
        n += 2 * page; /* its header's page, and a padding header's */
        if (strcmp(m->name, PI2_MF_NAME) == 0 || strcmp(m->name, PI2_MF_SIG_NAME) == 0)
            n += (m->size + page - 1) / page * page;
    }
    return n;
}

/* Bytes of whole pages of [off, off + n). */
static uint64_t inner_pages(uint64_t off, uint64_t n, uint64_t page)
{
    uint64_t a = (off + page - 1) / page * page, b = (off + n) / page * page;
    return b > a ? b - a : 0;
}

uint64_t pi2_plan_resident(const pi2_manifest *mf, const pi2_bundle_layout *bl, uint64_t page)
{
    uint64_t end = UINT64_MAX;
    for (size_t i = 0; i < bl->n_ffn; i++) {
        const pi2_ctr_section *s = pi2_manifest_find_section(mf, bl->ffn[i].ffn);
        if (!s)
            return 0;
        end = s->offset < end ? s->offset : end;
    }
    if (end == UINT64_MAX)
        return 0;
    if (mf->sparsity_mode != PI2_MF_SPARSE_PREDICTOR || page == 0)
        return end;
    /* the f32 (or f16) predictors, given back once their Q8 copy is made */
    uint64_t released = 0;
    for (size_t i = 0; i < bl->n_ffn; i++) {
        const pi2_bl_ffn *b = &bl->ffn[i];
        const pi2_mf_layer *ml = pi2_manifest_find_layer(mf, b->layer, b->expert);
        if (!ml || !ml->has_predictor)
            continue;
        const pi2_mf_predictor *p = &ml->predictor;
        const pi2_ctr_section *s1 = pi2_manifest_find_section(mf, p->fc1), *s2 = pi2_manifest_find_section(mf, p->fc2);
        if (!s1 || !s2)
            continue;
        uint64_t el = pi2_mf_pred_elem(p->dtype), n1 = (uint64_t)p->rank * (uint64_t)mf->config.hidden * el,
                 n2 = (uint64_t)b->neurons * (uint64_t)p->rank * el;
        if (s1->offset + n1 == s2->offset) /* side by side, as bundled: one range */
            released += inner_pages(s1->offset, n1 + n2, page);
        else
            released += inner_pages(s1->offset, n1, page) + inner_pages(s2->offset, n2, page);
    }
    return released < end ? end - released : 0;
}

int pi2_plan_ring_depth(const pi2_offload_opts *o)
{
    int depth = o->io_depth > 0 ? o->io_depth : 64;
    if ((o->plan || (o->hw && !o->fixed_split)) && depth < 128)
        depth = o->plan && o->plan->io_depth > 128 ? o->plan->io_depth : 128;
    return depth;
}

void pi2_plan_memory_free(pi2_plan_memory *m)
{
    if (!m)
        return;
    pi2_plan_free(&m->plan);
    memset(m, 0, sizeof *m);
}

/* The Q8 copies open makes of f32/f16 predictors: their bytes in all, and
 * the largest one's. */
static uint64_t pred_copies(const pi2_plan_mem_in *in, uint64_t *largest)
{
    const pi2_manifest *mf = in->mf;
    uint64_t all = 0;
    *largest = 0;
    for (size_t i = 0; mf->sparsity_mode == PI2_MF_SPARSE_PREDICTOR && i < in->bl->n_ffn; i++) {
        const pi2_bl_ffn *b = &in->bl->ffn[i];
        const pi2_mf_layer *ml = pi2_manifest_find_layer(mf, b->layer, b->expert);
        if (!ml || !ml->has_predictor || pi2_mf_pred_qtype(ml->predictor.dtype) != PI2_QT_F32)
            continue;
        uint64_t pb = pi2_plan_pred_bytes(&ml->predictor, mf->config.hidden, b->neurons, NULL);
        all += pb;
        *largest = pb > *largest ? pb : *largest;
    }
    return all;
}

/* The resident part item by item (m->items), from the fixed costs. */
static void items_fill(const pi2_plan_mem_in *in, pi2_plan_memory *m)
{
    pi2_plan_items *it = &m->items;
    const pi2_manifest *mf = in->mf;
    memset(it, 0, sizeof *it);
    for (size_t i = 0; i < mf->n_tensors; i++) {
        const pi2_mf_tensor *t = &mf->tensors[i];
        switch (t->role) {
        case PI2_T_EMBED:
        case PI2_T_LM_HEAD: it->embed_head += tensor_bytes(t); break;
        case PI2_T_Q:
        case PI2_T_K:
        case PI2_T_V:
        case PI2_T_O: /* the streamed layers' are in the ring */
            if (!pi2_plan_stream_attn_layer(mf->config.n_layers, m->attn_stream, t->layer))
                it->attn += tensor_bytes(t);
            break;
        case PI2_T_OUT_NORM:
        case PI2_T_ATTN_NORM:
        case PI2_T_FFN_NORM: it->norms += tensor_bytes(t); break;
        default: break; /* FFNs are offloaded; the router is "other" */
        }
    }
    uint64_t largest, copies = pred_copies(in, &largest); /* in the engine's buffers */
    for (size_t i = 0; mf->sparsity_mode == PI2_MF_SPARSE_PREDICTOR && i < in->bl->n_ffn; i++) {
        const pi2_bl_ffn *b = &in->bl->ffn[i];
        const pi2_mf_layer *ml = pi2_manifest_find_layer(mf, b->layer, b->expert);
        if (ml && ml->has_predictor)
            it->pred += pi2_plan_pred_bytes(&ml->predictor, mf->config.hidden, b->neurons, NULL);
    }
    uint64_t held = it->attn + it->embed_head + it->norms + (it->pred - copies);
    /* streamed: out of the resident part; the ring is listed as the
     * predictors when they stream, else as the attention */
    if (m->pred_stream) {
        held = it->attn + it->embed_head + it->norms;
        it->pred = m->ring;
        it->pred_streamed = true;
    } else if (m->attn_stream > 0) {
        it->attn += m->ring;
    }
    it->attn_streamed = m->attn_stream;
    it->other = m->resident > held ? m->resident - held : 0;
    it->buffers = m->buffers > copies + m->ring ? m->buffers - copies - m->ring : 0;
    it->kv = m->kv;
    it->files = m->files;
    it->overhead = m->overhead;
    it->min_cache = m->min_cache;
}

/* Bytes as a message shows them: KB below 0.1 MB, one decimal below 10 MB. */
static int mb_print(char *buf, size_t cap, const char *what, uint64_t b)
{
    if (b < 104858)
        return snprintf(buf, cap, "%s %.0f KB", what, (double)b / 1024.0);
    return snprintf(buf, cap, b < 10 * 1048576ull ? "%s %.1f MB" : "%s %.0f MB", what, mb(b));
}

size_t pi2_plan_items_text(const pi2_plan_items *it, int ctx, char *buf, size_t cap)
{
    char kv[64];
    snprintf(kv, sizeof kv, "KV cache at %d positions", ctx);
    const struct {
        const char *name;
        uint64_t b;
    } row[] = {{"attention", it->attn},       {"embeddings+head", it->embed_head},
               {"predictors", it->pred},
               {"norms", it->norms},          {"other resident", it->other},       {"buffers", it->buffers},
               {kv, it->kv},                  {"files' page cache", it->files},    {"overhead", it->overhead},
               {"smallest neuron cache", it->min_cache}};
    size_t n = 0;
    if (cap)
        buf[0] = 0;
    for (size_t i = 0; i < sizeof row / sizeof *row; i++) {
        bool attn = i == 0 && it->attn_streamed > 0; /* listed when streamed, held or not */
        if (row[i].b == 0 && !attn)
            continue;
        char one[96];
        int w1 = mb_print(one, sizeof one, row[i].name, row[i].b);
        if (w1 > 0 && (size_t)w1 < sizeof one) {
            if (it->pred_streamed && strcmp(row[i].name, "predictors") == 0)
                snprintf(one + w1, sizeof one - (size_t)w1, " (streamed ring%s)",
                         it->attn_streamed > 0 ? ", with the attention" : "");
            else if (attn)
                snprintf(one + w1, sizeof one - (size_t)w1, " (%d layers streamed)", it->attn_streamed);
        }
        int w = snprintf(buf + (n < cap ? n : cap), n < cap ? cap - n : 0, "%s%s", n ? ", " : "", one);
        n += w > 0 ? (size_t)w : 0;
    }
    return n;
}

/* The FFNs' geometry alone (no profile): what the fixed split needs. */
static int geometry(pi2_mprof *mp, const pi2_plan_mem_in *in, pi2_err *err)
{
    const pi2_bundle_layout *bl = in->bl;
    memset(mp, 0, sizeof *mp);
    mp->n_ffn = (uint32_t)bl->n_ffn;
    mp->two_phase = bl->two_phase;
    mp->R = bl->row_bytes;
    if (!(mp->ffn = pi2_calloc_array(bl->n_ffn ? bl->n_ffn : 1, sizeof *mp->ffn)))
        return pi2_err_set(err, PI2_ENOMEM, "out of memory for the model profile");
    for (size_t i = 0; i < bl->n_ffn; i++) {
        const pi2_bl_ffn *b = &bl->ffn[i];
        if (i == 0) {
            mp->S = b->slot_bytes;
            mp->Pg = b->gate_part;
            mp->Gb = b->gate_bytes;
            mp->Ub = b->bundle_bytes;
        } else if (b->slot_bytes != mp->S || b->gate_part != mp->Pg || b->group != bl->ffn[0].group ||
                   b->gate_bytes != mp->Gb || b->bundle_bytes != mp->Ub) {
            pi2_mprof_free(mp);
            return pi2_err_set(err, PI2_EUNSUPPORTED, "%s: FFNs of different geometry", in->name);
        }
        mp->ffn[i].neurons = b->neurons;
        mp->ffn[i].group = b->group;
        mp->ffn[i].groups = b->groups;
        mp->ffn_total += (uint64_t)b->groups * b->slot_bytes;
    }
    return 0;
}

/* The model profile the solver and the predictions read. */
static int profile(pi2_mprof *mp, const pi2_plan_mem_in *in, pi2_err *err)
{
    const pi2_offload_opts *o = in->opts;
    int rc = pi2_mprof_build(mp, in->mf, in->bl, in->base, in->base_len, in->name, err);
    if (rc)
        return rc;
    mp->ctx = o->plan_prompt > 0 ? o->plan_prompt + 32 : 160;
    if (in->bufs.kv_elem) /* the KV bytes attention reads a position, at the cache's type */
        mp->kv_per_pos = mp->kv_per_pos / sizeof(float) * in->bufs.kv_elem;
    if (o->cal)
        mp->cal = *o->cal;
    mp->cores = in->cores;
    return 0;
}

/* A given plan, checked against the model and the run, into m->plan. */
static int plan_given(const pi2_plan_mem_in *in, const pi2_mprof *geo, pi2_plan_memory *m, pi2_err *err)
{
    const pi2_plan *g = in->opts->plan;
    int rc = 0;
    if (g->n_ffn != geo->n_ffn)
        return pi2_err_set(err, PI2_ESHAPE, "%s: the plan is for %u FFNs, this model has %u", in->name, g->n_ffn,
                           geo->n_ffn);
    for (uint32_t i = 0; rc == 0 && i < g->n_ffn; i++)
        if (g->gate_groups[i] > geo->ffn[i].groups || g->hot_groups[i] > g->gate_groups[i] ||
            (!geo->two_phase && g->gate_groups[i] != g->hot_groups[i]))
            rc = pi2_err_set(err, PI2_ESHAPE, "%s: the plan keeps %u hot / %u gate groups of FFN %u, which has %u%s",
                             in->name, g->hot_groups[i], g->gate_groups[i], i, geo->ffn[i].groups,
                             geo->two_phase ? "" : " (one-phase: gate groups must equal hot groups)");
    if (rc == 0 && g->io_depth > m->ring_depth)
        rc = pi2_err_set(err, PI2_ERANGE, "%s: the plan's I/O depth %d exceeds the reader's %d", in->name,
                         g->io_depth, m->ring_depth);
    if (rc == 0 && g->threads > in->threads)
        rc = pi2_err_set(err, PI2_ERANGE, "%s: the plan runs %d threads, more than the %d asked for", in->name,
                         g->threads, in->threads);
    if (rc == 0 && (rc = pi2_plan_alloc(&m->plan, g->n_ffn, err)) == 0) {
        uint32_t *h = m->plan.hot_groups, *gg = m->plan.gate_groups;
        m->plan = *g;
        m->plan.hot_groups = h;
        m->plan.gate_groups = gg;
        m->plan.mem_limit = in->opts->mem_limit;
        memcpy(h, g->hot_groups, g->n_ffn * sizeof *h);
        memcpy(gg, g->gate_groups, g->n_ffn * sizeof *gg);
        memset(&m->plan.pred, 0, sizeof m->plan.pred);
        m->source = "given";
    }
    return rc;
}

/* The plan run: given, the solver's, or the fixed split; predicted with a
 * hardware profile. Into m->plan. */
static int plan_make(const pi2_plan_mem_in *in, const pi2_mprof *geo, int depth, pi2_plan_memory *m, pi2_err *err)
{
    const pi2_offload_opts *o = in->opts;
    pi2_mprof mp;
    int rc;
    if (!o->plan && !(o->hw && !o->fixed_split)) { /* the fixed split */
        m->source = "fixed split";
        if ((rc = pi2_plan_fixed(geo, &m->solver, o->mem_limit, in->threads, depth, o->hot_share,
                                 o->gate_first, &m->plan, err)) != 0)
            return rc;
        pi2_err pe = {0};
        if (o->hw && profile(&mp, in, &pe) == 0) { /* predicted; a profile that cannot be read is no error */
            pi2_plan_predict(&mp, o->hw, &m->plan, o->plan_prompt);
            m->predicted = true;
            pi2_mprof_free(&mp);
        }
        return 0;
    }
    if ((rc = profile(&mp, in, err)) != 0)
        return rc;
    if (o->plan) {
        if ((rc = plan_given(in, geo, m, err)) == 0 && o->hw)
            pi2_plan_predict(&mp, o->hw, &m->plan, o->plan_prompt);
    } else {
        pi2_plan_opts po;
        pi2_plan_opts_defaults(&po);
        po.mem_limit = o->mem_limit;
        po.threads = in->threads;
        po.max_depth = m->ring_depth;
        po.min_speed = o->min_speed;
        po.prompt = o->plan_prompt;
        rc = pi2_plan_solve(&mp, o->hw, &m->solver, &po, &m->plan, err);
        if (rc && err->msg[0] && strncmp(err->msg, in->name, strlen(in->name)) != 0) {
            pi2_err inner = *err;
            pi2_err_clear(err);
            rc = pi2_err_set(err, inner.code, "%s: %s", in->name, inner.msg);
        }
        m->source = m->plan.fixed_split ? "planned: the fixed split (no clear gain)" : "planned";
    }
    m->predicted = rc == 0;
    pi2_mprof_free(&mp);
    return rc;
}

/* Cache slots of what the hot segment leaves (cache_budget). */
static void cache_split(const pi2_plan_mem_in *in, uint64_t cache_budget, uint64_t min_slots, pi2_plan_memory *m)
{
    int n_caches = in->bl->two_phase ? 2 : 1;
    uint64_t neurons = (uint64_t)in->bl->n_ffn * (uint64_t)in->mf->config.n_ff;
    uint64_t extra = m->hot == m->ffn_total || cache_budget < m->min_cache ? 0 : cache_budget - m->min_cache;
    m->cache = 0;
    for (int k = 0; k < n_caches; k++) {
        double share = n_caches == 1 ? 1.0 : (k == 0 ? 1.0 / 3 : 2.0 / 3);
        uint64_t st = in->bufs.slot_bytes[k];
        uint64_t n = min_slots + (uint64_t)((double)extra * share) / st;
        if (n > neurons) /* more slots than neurons is waste */
            n = neurons;
        if (n > UINT32_MAX - 1)
            n = UINT32_MAX - 1;
        m->slots[k] = (uint32_t)n;
        m->cache += n * st;
    }
}

uint64_t pi2_plan_overhead(int threads, uint64_t sized)
{
    return PI2_PLAN_OVERHEAD + (uint64_t)(threads > 0 ? threads : 1) * PI2_PLAN_THREAD_OVERHEAD +
           sized / PI2_PLAN_SLACK_SHARE;
}

/* Member `name` (4 KiB aligned) added to its layer's bytes *per and to
 * *all, page-rounded; false when missing or unaligned. */
static bool stream_member(const pi2_manifest *mf, const char *name, uint64_t *per, uint64_t *all)
{
    const pi2_ctr_section *s = name && name[0] ? pi2_manifest_find_section(mf, name) : NULL;
    if (!s || s->offset % 4096)
        return false;
    uint64_t n = (s->size + 4095) / 4096 * 4096;
    *per += n;
    *all += n;
    return true;
}

/* Every layer's q8/q4 predictors (every expert's) into per[layer]. */
static bool stream_preds(const pi2_manifest *mf, const pi2_bundle_layout *bl, uint64_t *per, uint64_t *all)
{
    int L = mf->config.n_layers;
    if (mf->sparsity_mode != PI2_MF_SPARSE_PREDICTOR || L <= pi2_plan_ring_slots(L) || bl->n_ffn == 0)
        return false;
    for (size_t i = 0; i < bl->n_ffn; i++) {
        const pi2_bl_ffn *b = &bl->ffn[i];
        const pi2_mf_layer *ml = pi2_manifest_find_layer(mf, b->layer, b->expert);
        if (!ml || !ml->has_predictor || pi2_mf_pred_qtype(ml->predictor.dtype) == PI2_QT_F32 || b->layer < 0 ||
            b->layer >= L)
            return false;
        const pi2_mf_predictor *p = &ml->predictor;
        const char *names[4] = {p->fc1, p->fc2, p->fc1_scales, p->fc2_scales};
        for (int k = 0; k < 4; k++)
            if (!stream_member(mf, names[k], &per[b->layer], all))
                return false;
    }
    return true;
}

bool pi2_plan_stream_attn_layer(int n_layers, int attn, int l) { return l >= n_layers - attn && l < n_layers; }

bool pi2_plan_stream_sizes(const pi2_manifest *mf, const pi2_bundle_layout *bl, bool pred, int attn,
                           uint64_t *skipped, uint64_t *slot)
{
    *skipped = *slot = 0;
    int L = mf->config.n_layers;
    if ((!pred && attn <= 0) || attn < 0 || attn > L)
        return false;
    uint64_t *per = pi2_calloc_array((size_t)L, sizeof *per), all = 0;
    bool ok = per != NULL && (!pred || stream_preds(mf, bl, per, &all));
    static const pi2_tname roles[4] = {PI2_T_Q, PI2_T_K, PI2_T_V, PI2_T_O};
    for (int l = L - attn; ok && l < L; l++)
        for (int k = 0; ok && k < 4; k++) {
            const pi2_mf_tensor *t = pi2_manifest_find_tensor(mf, roles[k], l, -1);
            ok = t && stream_member(mf, t->payload, &per[l], &all) &&
                 (t->qtype == PI2_QT_F32 || stream_member(mf, t->scales, &per[l], &all));
        }
    for (int l = 0; ok && l < L; l++)
        *slot = per[l] > *slot ? per[l] : *slot;
    free(per);
    if (!ok)
        *slot = 0;
    else
        *skipped = all;
    return ok;
}

int pi2_plan_ring_slots(int n_layers) { return n_layers > 2 ? 2 : 1; }

/* What streams through the ring: the predictors (pred), and the
 * attention of the last attn layers. */
typedef struct stream_cfg {
    bool pred;
    int attn;
} stream_cfg;

/* The fixed costs, the smallest cache and the minimum into *m, with what
 * c streams (where it can) left out of the resident part and its ring
 * counted in the buffers. */
static void floor_costs(const pi2_plan_mem_in *in, const pi2_mprof *geo, stream_cfg c, pi2_plan_memory *m)
{
    const pi2_offload_opts *o = in->opts;
    const pi2_model_desc *d = &in->mf->config;
    int depth = o->io_depth > 0 ? o->io_depth : 64;
    uint64_t skipped = 0, slot = 0;
    m->mem_limit = o->mem_limit;
    m->ring_depth = pi2_plan_ring_depth(o);
    m->ffn_total = geo->ffn_total;
    bool ok = pi2_plan_stream_sizes(in->mf, in->bl, c.pred, c.attn, &skipped, &slot);
    m->pred_stream = ok && c.pred;
    m->attn_stream = ok ? c.attn : 0;
    m->stream_skipped = ok ? skipped : 0;
    m->ring = ok ? (uint64_t)pi2_plan_ring_slots(c.pred ? d->n_layers : c.attn) * slot : 0;
    /* cache indexes: 4 bytes per neuron per cache */
    int n_caches = geo->two_phase ? 2 : 1;
    m->index = (uint64_t)n_caches * geo->n_ffn * (uint64_t)d->n_ff * 4;
    uint64_t mine = in->bufs.offload + (uint64_t)depth * in->bufs.per_depth;
    m->resident = in->resident > m->stream_skipped ? in->resident - m->stream_skipped : 0;
    m->kv = (uint64_t)in->ctx * in->bufs.per_pos;
    m->buffers = in->bufs.engine + mine + m->index + m->ring;
    m->files = in->files;
    uint64_t base = pi2_plan_overhead(in->threads, m->resident + m->kv + m->buffers);
    uint64_t fixed = m->resident + m->kv + m->buffers + m->files + base;
    /* the smallest cache: a chunk of neurons, or an eighth of an FFN, so a
     * layer's misses can be in flight together */
    m->min_slots = (uint64_t)d->n_ff / 8 > in->bufs.chunk ? (uint64_t)d->n_ff / 8 : in->bufs.chunk;
    m->min_cache = 0;
    for (int k = 0; k < n_caches; k++)
        m->min_cache += m->min_slots * in->bufs.slot_bytes[k];
    /* open holds the whole resident region, f32/f16 predictors included,
     * before the KV cache and the caches; each predictor is given back as
     * its Q8 copy (smaller) is made, so at most one copy per thread is
     * held beyond the region. Streamed members are hashed in their ring,
     * never held. */
    uint64_t largest, copies = pred_copies(in, &largest);
    m->open_peak = pi2_plan_resident(in->mf, in->bl, 0) - m->stream_skipped + (in->bufs.engine - copies) +
                   (uint64_t)in->threads * largest + mine + m->ring + m->files + base;
    /* the kernel's share of what the run can use: the limit, or everything
     * in memory when the limit is larger */
    uint64_t most = fixed + m->ffn_total + m->min_cache;
    m->overhead = base + (o->mem_limit < most ? o->mem_limit : most) / PI2_PLAN_KERNEL_SHARE;
    uint64_t need = fixed + m->min_cache > m->open_peak ? fixed + m->min_cache : m->open_peak;
    m->minimum = need * PI2_PLAN_KERNEL_SHARE / (PI2_PLAN_KERNEL_SHARE - 1) + 1;
    items_fill(in, m);
}

/* The choices of what streams, from the most resident to the least, into
 * cfg (at most n_layers + 2); returns their count. Predictors first (where
 * they can stream and the options let them), then the attention of 1, 2,
 * ... layers more (or the options' count alone). */
static int stream_choices(const pi2_plan_mem_in *in, stream_cfg *cfg)
{
    const pi2_offload_opts *o = in->opts;
    int L = in->mf->config.n_layers, n = 0;
    uint64_t skipped, slot;
    bool pred = o->pred_stream >= 0 && pi2_plan_stream_sizes(in->mf, in->bl, true, 0, &skipped, &slot);
    bool attn = o->attn_stream >= 0 && L > 0 && pi2_plan_stream_sizes(in->mf, in->bl, false, 1, &skipped, &slot);
    int a0 = attn && o->attn_stream > 0 ? (o->attn_stream < L ? o->attn_stream : L) : 0;
    if (!pred || o->pred_stream == 0)
        cfg[n++] = (stream_cfg){false, a0};
    if (pred)
        cfg[n++] = (stream_cfg){true, a0};
    for (int a = 1; attn && o->attn_stream == 0 && a <= L; a++)
        cfg[n++] = (stream_cfg){pred, a};
    return n;
}

/* The fixed costs, the smallest cache and the minimum into *m; PI2_ENOMEM
 * (one line naming each resident item) when the limit cannot hold them.
 * What streams is the first of stream_choices that fits: a resident byte
 * serves every token, a neuron cache byte only the tokens its neuron fires
 * for, so predictors and attention stay resident while they fit. `least`
 * is the minimum of the last choice, the most streamed. */
static int floor_make(const pi2_plan_mem_in *in, const pi2_mprof *geo, pi2_plan_memory *m, pi2_err *err)
{
    const pi2_offload_opts *o = in->opts;
    stream_cfg *cfg = pi2_malloc_array((size_t)in->mf->config.n_layers + 2, sizeof *cfg);
    if (!cfg)
        return pi2_err_set(err, PI2_ENOMEM, "out of memory");
    int n = stream_choices(in, cfg);
    floor_costs(in, geo, cfg[n - 1], m);
    uint64_t least = m->minimum;
    for (int i = 0; i < n - 1 && o->mem_limit >= least; i++) {
        floor_costs(in, geo, cfg[i], m);
        if (o->mem_limit >= m->minimum)
            break;
        if (i == n - 2) /* only the last fits */
            floor_costs(in, geo, cfg[n - 1], m);
    }
    free(cfg);
    m->least = least;
    if (o->mem_limit >= m->minimum)
        return 0;
    char items[640];
    pi2_plan_items_text(&m->items, in->ctx, items, sizeof items);
    char opening[160] = "";
    if (m->open_peak > m->resident + m->kv + m->buffers + m->files + m->min_cache +
                           pi2_plan_overhead(in->threads, m->resident + m->kv + m->buffers))
        snprintf(opening, sizeof opening, "; opening holds the whole %.0f MB resident region while the predictors' "
                 "Q8 copies are made", mb(pi2_plan_resident(in->mf, in->bl, 0)));
    char limit[48];
    mb_print(limit, sizeof limit, "", o->mem_limit);
    /* the least it needs in whole MB, rounded up: a limit of that many runs */
    return pi2_err_set(err, PI2_ENOMEM,
                       "%s: the memory limit of%s cannot hold the resident part: it needs at least %llu MB (%s%s)",
                       in->name, limit, (unsigned long long)((m->minimum + 1048575) / 1048576), items, opening);
}

int pi2_plan_memory_floor(const pi2_plan_mem_in *in, pi2_plan_memory *out, pi2_err *err)
{
    memset(out, 0, sizeof *out);
    pi2_mprof geo;
    int rc = geometry(&geo, in, err);
    if (rc)
        return rc;
    rc = floor_make(in, &geo, out, err);
    pi2_mprof_free(&geo);
    return rc;
}

int pi2_plan_memory_make(const pi2_plan_mem_in *in, pi2_plan_memory *out, pi2_err *err)
{
    const pi2_offload_opts *o = in->opts;
    memset(out, 0, sizeof *out);
    pi2_mprof geo;
    int rc = geometry(&geo, in, err);
    if (rc)
        return rc;
    pi2_plan_memory *m = out;
    int depth = o->io_depth > 0 ? o->io_depth : 64;
    if ((rc = floor_make(in, &geo, m, err)) != 0) {
        pi2_mprof_free(&geo);
        return rc;
    }
    uint64_t fixed = m->resident + m->kv + m->buffers + m->files + m->overhead;
    m->solver = (pi2_plan_mem){.fixed = fixed - (uint64_t)depth * in->bufs.per_depth,
                               .per_depth = in->bufs.per_depth,
                               .min_slots = m->min_slots,
                               .slot_bytes = {in->bufs.slot_bytes[0], in->bufs.slot_bytes[1]}};
    rc = plan_make(in, &geo, depth, m, err);
    if (rc == 0) {
        fixed = m->solver.fixed + (uint64_t)m->plan.io_depth * in->bufs.per_depth;
        for (uint32_t i = 0; i < geo.n_ffn; i++) {
            uint64_t gate = geo.two_phase ? (uint64_t)(m->plan.gate_groups[i] - m->plan.hot_groups[i]) * geo.Pg : 0;
            m->hot += (uint64_t)m->plan.hot_groups[i] * geo.S + gate;
            m->gate_hot += gate;
        }
        if (fixed + m->hot + m->min_cache > o->mem_limit)
            rc = pi2_err_set(err, PI2_ENOMEM, "%s: the plan needs %.0f MB, more than the memory limit of %.0f MB",
                             in->name, mb(fixed + m->hot + m->min_cache) + 1, mb(o->mem_limit));
    }
    if (rc == 0 && m->ring > 0 && m->plan.pred.decode_ms > 0 && o->hw && o->hw->seq_bps > 0) {
        /* each token reads what streams, every layer's: counted whole, as
         * if no compute hid it (the FFN's reads share the disk) */
        struct pi2_plan_pred *r = &m->plan.pred;
        r->decode_ms += (double)m->stream_skipped / o->hw->seq_bps * 1e3;
        r->decode_tok_s = 1e3 / r->decode_ms;
        r->mb_per_token += (double)m->stream_skipped / 1e6;
    }
    if (rc == 0) {
        m->fixed = fixed;
        cache_split(in, o->mem_limit - fixed - m->hot, m->min_slots, m);
        m->planned = fixed + m->hot + m->cache;
        m->offloaded = m->ffn_total ? 1.0 - (double)m->hot / (double)m->ffn_total : 0.0;
    }
    pi2_mprof_free(&geo);
    if (rc)
        pi2_plan_memory_free(m);
    return rc;
}
