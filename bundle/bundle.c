/* pi2 bundle writer: converted model -> model.pi2. See bundle/bundle.h.
 *
 * Why a plan and a loader thread: the work is two SHA-256 passes (checking
 * the converted bytes, hashing the output) plus a write of every byte, and
 * this machine has two cores. The main thread builds the list of members to
 * write ("jobs") with the input byte ranges each needs; a loader thread
 * reads and checks those ranges in the same order, at most a few jobs ahead,
 * while the main thread lays out and writes the current job. */
#include "bundle/bundle_internal.h"
#include "bundle/order.h"
#include "formats/pool.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void pi2_bundle_defaults(pi2_bundle_opts *o)
{
    memset(o, 0, sizeof *o);
    o->hot_min_freq = 0.5;
    o->hot_share = NAN;
}

void pi2_bundle_key_fingerprint(const uint8_t raw[PI2_SIGN_PUBKEY_LEN], char out[17])
{
    uint8_t d[PI2_SHA256_LEN];
    char hex[PI2_SHA256_HEX_LEN];
    if (pi2_sha256(raw, PI2_SIGN_PUBKEY_LEN, d, NULL) != 0)
        memset(d, 0, sizeof d);
    pi2_sha256_hex(d, hex);
    memcpy(out, hex, 16);
    out[16] = 0;
}

/* ---- neuron order, one FFN per task ---- */

typedef struct order_pool {
    bctx *b;
    pthread_mutex_t mu;
    size_t next;
    int rc;
    pi2_err err;
} order_pool;

static int order_one(bctx *b, ffn_state *s, pi2_err *err)
{
    const pi2_bundle_opts *o = b->o;
    uint32_t n = (uint32_t)b->d->n_ff;
    uint8_t *freq = NULL, *bits = NULL;
    size_t len;
    uint64_t samples = 0;
    int rc = 0;
    if (!(s->perm = pi2_malloc_array(n, sizeof *s->perm)))
        return pi2_err_set(err, PI2_ENOMEM, "out of memory");
    if (s->prof) {
        rc = bw_in_load(&b->in, s->prof->freq, (uint64_t)n * 4, &freq, &len, err);
        if (rc == 0 && s->prof->bits[0]) {
            uint64_t want = s->prof->bit_samples * (((uint64_t)n + 63) / 64) * 8;
            rc = bw_in_load(&b->in, s->prof->bits, want, &bits, &len, err);
            samples = s->prof->bit_samples;
        }
    }
    if (rc == 0) {
        const float *fq = (const float *)(const void *)freq;
        uint32_t hot = pi2_order_hot_count(fq, n, isnan(o->hot_share) ? o->hot_min_freq : NAN, o->hot_share);
        uint32_t hg = (hot + s->lay.group - 1) / s->lay.group;
        pi2_bl_set_hot(&s->lay, hg);
        pi2_order_in in = { n, fq, (const uint64_t *)(const void *)bits, samples, s->lay.group, s->lay.hot_neurons };
        rc = pi2_order_neurons(&in, s->perm, &s->st, err);
        s->lay.order = !freq ? PI2_BL_ORDER_IDENTITY : s->st.grouped ? PI2_BL_ORDER_COACTIVATION
                                                                     : PI2_BL_ORDER_FREQUENCY;
        s->lay.read_eff = s->st.read_eff;
        s->lay.read_eff_freq = s->st.read_eff_freq;
    }
    free(freq);
    free(bits);
    return rc;
}

static void order_worker(void *arg, int tid, int nthreads)
{
    (void)tid;
    (void)nthreads;
    order_pool *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        size_t i = p->next++;
        bool done = i >= p->b->n_ffn || p->rc != 0;
        pthread_mutex_unlock(&p->mu);
        if (done)
            break;
        pi2_err e = { 0 };
        int rc = order_one(p->b, &p->b->ffn[i], &e);
        if (rc) {
            pthread_mutex_lock(&p->mu);
            if (p->rc == 0) {
                p->rc = rc;
                p->err = e;
            }
            pthread_mutex_unlock(&p->mu);
        }
    }
}

static int order_all(bctx *b, pi2_err *err)
{
    order_pool p = { .b = b };
    pthread_mutex_init(&p.mu, NULL);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int T = b->o->threads > 0 ? b->o->threads : (int)(ncpu > 0 ? ncpu : 1);
    if (T > MAX_THREADS)
        T = MAX_THREADS;
    if ((size_t)T > b->n_ffn)
        T = (int)b->n_ffn;
    /* the layers are taken from a shared counter: any thread may take any */
    pi2_pool *pool = NULL;
    if (T > 1 && pi2_pool_create(&pool, T, NULL) != 0)
        pool = NULL;
    if (pool)
        pi2_pool_run_shared(pool, order_worker, &p);
    else
        order_worker(&p, 0, 1);
    pi2_pool_free(pool);
    pthread_mutex_destroy(&p.mu);
    if (p.rc)
        return pi2_err_set(err, p.rc, "%s", p.err.msg);
    return 0;
}

/* ---- setup ---- */

static int open_input(bctx *b, pi2_err *err)
{
    input *in = &b->in;
    in->path = b->o->in_path;
    in->fd = -1;
    int rc = pi2_ctr_open(&in->ctr, in->path, err);
    if (rc)
        return rc;
    const pi2_ctr_member *m = pi2_ctr_find(in->ctr, PI2_MF_NAME);
    if (!m)
        return pi2_err_set(err, PI2_EFORMAT, "%s: no %s: not a pi2 model", in->path, PI2_MF_NAME);
    char name[4200];
    snprintf(name, sizeof name, "%s:%s", in->path, PI2_MF_NAME);
    if ((rc = pi2_manifest_parse((const char *)m->data, (size_t)m->size, name, &in->mf, err)))
        return rc;
    if (in->mf->kind != PI2_MF_CONVERTED)
        return pi2_err_set(err, PI2_EINVAL, "%s: not a converted model (kind %s); pi2-bundle takes pi2-convert output",
                           in->path, pi2_manifest_kind_name(in->mf->kind));
    in->fd = open(in->path, O_RDONLY | O_CLOEXEC);
    if (in->fd < 0)
        return pi2_err_errno(err, PI2_EIO, errno, "%s: cannot open", in->path);
    return 0;
}

/* FFN list (layer-major, expert-minor) with their tensors and geometry. */
static int setup_ffns(bctx *b, pi2_err *err)
{
    const pi2_model_desc *d = b->d;
    const pi2_manifest *m = b->in.mf;
    bool moe = pi2_desc_is_moe(d);
    int E = moe ? d->n_experts : 1;
    b->n_ffn = (size_t)d->n_layers * (size_t)E;
    if (!(b->ffn = pi2_calloc_array(b->n_ffn, sizeof *b->ffn)))
        return pi2_err_set(err, PI2_ENOMEM, "out of memory");
    pi2_bl_ffn geo;
    b->row_bytes = pi2_bl_row_bytes(m->quant_ffn, d->hidden);
    b->pay_bytes = pi2_q_payload_row_bytes(m->quant_ffn, d->hidden);
    b->io_unit = b->o->io_unit ? b->o->io_unit : pi2_bl_auto_io_unit(d, m->quant_ffn, b->two_phase);
    int rc = pi2_bl_geometry(d, m->quant_ffn, b->io_unit, b->two_phase, &geo, err);
    if (rc)
        return rc;
    static const pi2_tname roles[3] = { PI2_T_GATE, PI2_T_UP, PI2_T_DOWN };
    for (int l = 0; l < d->n_layers; l++)
        for (int e = 0; e < E; e++) {
            ffn_state *s = &b->ffn[(size_t)l * (size_t)E + (size_t)e];
            s->layer = l;
            s->expert = moe ? e : -1;
            s->e = e;
            for (int k = 0; k < 3; k++)
                if (!(s->t[k] = pi2_manifest_find_tensor(m, roles[k], l, s->expert)))
                    return pi2_err_set(err, PI2_EFORMAT, "%s: no %s tensor for layer %d expert %d", b->in.path,
                                       pi2_manifest_role_name(roles[k]), l, s->expert);
            s->prof = pi2_manifest_find_profile(m, l, s->expert);
            s->lay = geo;
            s->lay.layer = l;
            s->lay.expert = s->expert;
            if ((rc = bw_set_name(s->lay.ffn, err, "ffn/%d.%d", l, e)) ||
                (rc = bw_set_name(s->lay.perm, err, "perm/%d.%d", l, e)))
                return rc;
        }
    return 0;
}

/* An FFN tensor's rows and their scales are in its FFN's slots. */
static void ffn_members(const bctx *b, pi2_mf_tensor *t)
{
    if (t->role != PI2_T_GATE && t->role != PI2_T_UP && t->role != PI2_T_DOWN)
        return;
    snprintf(t->payload, sizeof t->payload, "%s", b->ffn[bw_find_ffn(b, t->layer, t->expert)].lay.ffn);
    snprintf(t->scales, sizeof t->scales, "%s", t->payload);
}

/* The output manifest: the input's, with FFN payloads and scales pointing
 * at the ffn members, the bundle object and the output's sections. */
static int build_manifest(bctx *b, const char *signer, char **text, size_t *len, pi2_err *err)
{
    const pi2_manifest *im = b->in.mf;
    pi2_manifest *om = pi2_manifest_new();
    pi2_bundle_layout *lay = pi2_bl_new();
    char *bj = NULL;
    int rc = 0;
    if (!om || !lay) {
        rc = pi2_err_set(err, PI2_ENOMEM, "out of memory");
        goto out;
    }
    om->kind = PI2_MF_BUNDLED;
    snprintf(om->created_by, sizeof om->created_by, "pi2-bundle");
    memcpy(om->source, im->source, sizeof om->source);
    om->config = im->config;
    memcpy(om->torch_dtype, im->torch_dtype, sizeof om->torch_dtype);
    om->quant_ffn = im->quant_ffn;
    om->quant_other = im->quant_other;
    memcpy(om->tokenizer, im->tokenizer, sizeof om->tokenizer);
    memcpy(om->chat_template, im->chat_template, sizeof om->chat_template);
    om->sparsity_mode = im->sparsity_mode;
    om->recall_target = im->recall_target;
    om->threshold_sparsity = im->threshold_sparsity;
    om->profile_tokens = im->profile_tokens;
    om->quality_tokens = im->quality_tokens;
    om->ppl_ref = im->ppl_ref;
    om->ppl_q_dense = im->ppl_q_dense;
    om->ppl_q_sparse = im->ppl_q_sparse;
    for (size_t i = 0; i < im->n_tensors && rc == 0; i++) {
        pi2_mf_tensor t = im->tensors[i];
        ffn_members(b, &t);
        rc = pi2_manifest_add_tensor(om, &t, err);
    }
    for (size_t i = 0; i < im->n_layers && rc == 0; i++)
        rc = pi2_manifest_add_layer(om, &im->layers[i], err);
    for (size_t i = 0; i < im->n_profile && rc == 0; i++)
        rc = pi2_manifest_add_profile(om, &im->profile[i], err);
    size_t ns;
    const pi2_ctr_section *secs = pi2_ctr_writer_sections(b->w, &ns);
    if (rc == 0)
        rc = pi2_manifest_add_sections(om, secs, ns, err);

    lay->io_unit = b->io_unit;
    lay->row_bytes = b->row_bytes;
    lay->pay_bytes = b->pay_bytes;
    lay->two_phase = b->two_phase;
    lay->hot_min_freq = isnan(b->o->hot_share) ? b->o->hot_min_freq : NAN;
    lay->hot_share = b->o->hot_share;
    snprintf(lay->signer, sizeof lay->signer, "%s", signer);
    for (size_t i = 0; i < om->n_sections && rc == 0; i++)
        if (strncmp(om->sections[i].name, "ffn/", 4) != 0)
            rc = pi2_bl_add_resident(lay, om->sections[i].name, err);
    for (size_t f = 0; f < b->n_ffn && rc == 0; f++)
        rc = pi2_bl_add_ffn(lay, &b->ffn[f].lay, err);
    if (rc == 0)
        rc = pi2_bl_to_json(lay, &bj, err);
    if (rc == 0)
        rc = pi2_manifest_set_bundle(om, bj, err);
    if (rc == 0)
        rc = pi2_manifest_to_json(om, text, len, err);
    if (rc == 0) {
        /* the writer's own output must pass the reader */
        pi2_manifest *chk = NULL;
        pi2_bundle_layout *cl = NULL;
        rc = pi2_manifest_parse(*text, *len, b->o->out_path, &chk, err);
        if (rc == 0)
            rc = pi2_bundle_layout_parse(chk, b->o->out_path, &cl, err);
        pi2_bl_free(cl);
        pi2_manifest_free(chk);
        if (rc) {
            free(*text);
            *text = NULL;
        }
    }
out:
    free(bj);
    pi2_bl_free(lay);
    pi2_manifest_free(om);
    return rc;
}

static void report_summary(const bctx *b, FILE *r, double t_order, double t_all, const char *fp)
{
    uint64_t hot = 0, cold = 0, hn = 0, neurons = 0;
    double eff = 0, eff_f = 0;
    int n_eff = 0;
    for (size_t f = 0; f < b->n_ffn; f++) {
        const pi2_bl_ffn *L = &b->ffn[f].lay;
        hot += L->hot_size;
        cold += L->cold_size;
        hn += L->hot_neurons;
        neurons += L->neurons;
        if (!isnan(L->read_eff) && !isnan(L->read_eff_freq)) {
            eff += L->read_eff;
            eff_f += L->read_eff_freq;
            n_eff++;
        }
    }
    const pi2_bl_ffn *L0 = &b->ffn[0].lay;
    fprintf(r, "ordered %zu FFNs in %.2f s: hot %.1f%% of neurons (%s %g)", b->n_ffn, t_order,
            neurons ? 100.0 * (double)hn / (double)neurons : 0.0, isnan(b->o->hot_share) ? "frequency >=" : "share",
            isnan(b->o->hot_share) ? b->o->hot_min_freq : b->o->hot_share);
    if (n_eff)
        fprintf(r, "; cold groups of %u, read efficiency %.3f (frequency order %.3f)", L0->group, eff / n_eff,
                eff_f / n_eff);
    fprintf(r, "\n");
    fprintf(r, "layout: %s, io unit %u KiB (%s), group %u, slot %llu bytes\n",
            b->two_phase ? "two-phase (gate part, then up+down)" : "one-phase (gate|up|down)", b->io_unit / 1024,
            b->o->io_unit ? "given" : "auto", L0->group, (unsigned long long)L0->slot_bytes);
    uint64_t res = b->written - hot - cold;
    fprintf(r, "wrote %s: %.3f GB (resident %.3f, hot %.3f, cold %.3f) in %.1f s (%.2f GB/s), %s%s\n", b->o->out_path,
            b->written / 1e9, res / 1e9, hot / 1e9, cold / 1e9, t_all, t_all > 0 ? b->written / t_all / 1e9 : 0.0,
            fp[0] ? "signed with key " : "UNSIGNED", fp);
}

int pi2_bundle_create(const pi2_bundle_opts *o, FILE *report, pi2_err *err)
{
    if (!o || !o->in_path || !o->out_path)
        return pi2_err_set(err, PI2_EINVAL, "bundle: input and output paths are required");
    if (!o->key && !o->allow_unsigned)
        return pi2_err_set(err, PI2_EINVAL, "bundle: no signing key given (an unsigned container must be asked for "
                                            "explicitly)");
    if (o->key && !pi2_sign_key_is_private(o->key))
        return pi2_err_set(err, PI2_EINVAL, "bundle: the signing key is a public key; a private key is needed");
    if (isnan(o->hot_share) ? !(o->hot_min_freq >= 0 && o->hot_min_freq <= 1) : !(o->hot_share >= 0 && o->hot_share <= 1))
        return pi2_err_set(err, PI2_EINVAL, "bundle: hot rule out of [0, 1]");
    bctx b = { .o = o };
    b.in.fd = -1;
    b.t0 = pi2_now();
    b.tty = !o->quiet && isatty(2);
    pthread_mutex_init(&b.mu, NULL);
    pthread_cond_init(&b.cv, NULL);
    char signer[PI2_SHA256_HEX_LEN] = "", fp[17] = "";
    char *mtext = NULL;
    size_t mlen = 0;
    double t_order = 0;
    int rc = open_input(&b, err);
    if (rc)
        goto out;
    b.d = &b.in.mf->config;
    b.two_phase = o->two_phase;
    if (b.two_phase && b.d->act != PI2_ACT_DRELU) {
        rc = pi2_err_set(err, PI2_EINVAL, "%s: a two-phase layout is for drelu only (activation %s)", o->in_path,
                         pi2_act_name(b.d->act));
        goto out;
    }
    if (b.in.mf->quant_ffn != PI2_QT_Q4 && b.in.mf->quant_ffn != PI2_QT_Q8) {
        rc = pi2_err_set(err, PI2_EUNSUPPORTED, "%s: FFN quant %s cannot be bundled", o->in_path,
                         pi2_q_type_name(b.in.mf->quant_ffn));
        goto out;
    }
    if (o->key) {
        uint8_t raw[PI2_SIGN_PUBKEY_LEN], dg[PI2_SHA256_LEN];
        if ((rc = pi2_sign_key_raw_public(o->key, raw, err)))
            goto out;
        memcpy(dg, raw, sizeof raw); /* hex of the raw key: 32 bytes -> 64 digits */
        pi2_sha256_hex(dg, signer);
        pi2_bundle_key_fingerprint(raw, fp);
    }
    if ((rc = setup_ffns(&b, err)))
        goto out;
    double t = pi2_now();
    if (b.tty)
        fprintf(stderr, "\r  ordering neurons of %zu FFNs   ", b.n_ffn);
    if ((rc = order_all(&b, err)))
        goto out;
    t_order = pi2_now() - t;
    if ((rc = bw_plan(&b, err)) || (rc = pi2_ctr_writer_create(&b.w, o->out_path, err)) || (rc = bw_run_jobs(&b, err)))
        goto out;
    if ((rc = build_manifest(&b, signer, &mtext, &mlen, err)) ||
        (rc = pi2_ctr_writer_add(b.w, PI2_MF_NAME, mtext, mlen, err)))
        goto out;
    if (o->key) {
        uint8_t sig[PI2_SIG_LEN];
        if ((rc = pi2_sign(o->key, mtext, mlen, sig, err)) ||
            (rc = pi2_ctr_writer_add(b.w, PI2_MF_SIG_NAME, sig, sizeof sig, err)))
            goto out;
    }
    rc = pi2_ctr_writer_finish(b.w, err);
    if (b.tty)
        fprintf(stderr, "\r%*s\r", 72, "");
    if (rc == 0 && report)
        report_summary(&b, report, t_order, pi2_now() - b.t0, fp);
out:
    if (b.tty && rc)
        fprintf(stderr, "\r%*s\r", 72, "");
    pi2_ctr_writer_free(b.w);
    free(mtext);
    for (size_t f = 0; f < b.n_ffn; f++)
        free(b.ffn[f].perm);
    free(b.ffn);
    free(b.jobs);
    if (b.in.fd >= 0)
        close(b.in.fd);
    pi2_manifest_free(b.in.mf);
    pi2_ctr_close(b.in.ctr);
    pthread_cond_destroy(&b.cv);
    pthread_mutex_destroy(&b.mu);
    return rc;
}
