/* pi2 bundle writer: converted model -> model.pi2. See bundle/bundle.h.
 *
 * Why a plan and a loader thread: the work is two SHA-256 passes (checking
 * the converted bytes, hashing the output) plus a write of every byte, and
 * this machine has two cores. The main thread builds the list of members to
 * write ("jobs") with the input byte ranges each needs; a loader thread
 * reads and checks those ranges in the same order, at most a few jobs ahead,
 * while the main thread lays out and writes the current job. */
#include "bundle/bundle.h"
#include "bundle/order.h"
#include "formats/pool.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define COPY_CHUNK (8u << 20)        /* bytes per chunk of a plain copy */
#define MAX_AHEAD 3                  /* jobs the loader may hold ready */
#define MAX_INFLIGHT (768ull << 20)  /* bytes the loader may hold ready (a bigger job still goes alone) */
#define OUT_CHUNK (8u << 20)         /* FFN member bytes laid out per write */
#define MAX_THREADS 16

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

/* ---- the converted input ---- */

typedef struct input {
    const char *path;
    int fd;
    pi2_ctr *ctr;
    pi2_manifest *mf;
} input;

/* The section `name` of the input, checked against the container member. */
static int in_section(const input *in, const char *name, const pi2_ctr_section **out, pi2_err *err)
{
    const pi2_ctr_section *s = pi2_manifest_find_section(in->mf, name);
    const pi2_ctr_member *m = pi2_ctr_find(in->ctr, name);
    if (!s || !m)
        return pi2_err_set(err, PI2_EFORMAT, "%s: member %s missing", in->path, name);
    if (m->offset != s->offset || m->size != s->size)
        return pi2_err_set(err, PI2_EFORMAT, "%s: member %s is at offset %llu size %llu, manifest says %llu size %llu",
                           in->path, name, (unsigned long long)m->offset, (unsigned long long)m->size,
                           (unsigned long long)s->offset, (unsigned long long)s->size);
    *out = s;
    return 0;
}

static int pread_full(const input *in, void *buf, size_t n, uint64_t off, const char *what, pi2_err *err)
{
    uint8_t *p = buf;
    while (n > 0) {
        ssize_t r = pread(in->fd, p, n > (1u << 30) ? (1u << 30) : n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return pi2_err_errno(err, PI2_EIO, errno, "%s: reading %s", in->path, what);
        if (r == 0)
            return pi2_err_set(err, PI2_EIO, "%s: unexpected end of file reading %s", in->path, what);
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

/* Bytes [off, off + len) of the input are read and not needed again: their
 * whole pages leave the page cache, for the read-ahead to reuse (fresh
 * memory costs a fault per page under a hypervisor that backs it lazily:
 * bundling the 7B-shaped model from a cold cache went from 11.8-13.8 to
 * 10.1-10.4 s). Advisory. */
static void in_drop(const input *in, uint64_t off, uint64_t len)
{
    uint64_t a = (off + 4095) / 4096 * 4096, e = (off + len) / 4096 * 4096;
    if (e > a)
        posix_fadvise(in->fd, (off_t)a, (off_t)(e - a), POSIX_FADV_DONTNEED);
}

static int digest_check(const input *in, const pi2_ctr_section *s, const uint8_t got[PI2_SHA256_LEN], pi2_err *err)
{
    if (memcmp(got, s->sha256, PI2_SHA256_LEN) == 0)
        return 0;
    return pi2_err_set(err, PI2_ESIG, "%s: member %s does not match its SHA-256 in the manifest (corrupt converted model)",
                       in->path, s->name);
}

/* Whole member into a new buffer (caller frees *buf), checked against its
 * digest. want_size: required size, or UINT64_MAX for any. */
static int in_load(const input *in, const char *name, uint64_t want_size, uint8_t **buf, size_t *len, pi2_err *err)
{
    *buf = NULL;
    const pi2_ctr_section *s;
    int rc = in_section(in, name, &s, err);
    if (rc)
        return rc;
    if (want_size != UINT64_MAX && s->size != want_size)
        return pi2_err_set(err, PI2_ESHAPE, "%s: member %s holds %llu bytes, expected %llu", in->path, name,
                           (unsigned long long)s->size, (unsigned long long)want_size);
    if (s->size > SIZE_MAX)
        return pi2_err_set(err, PI2_ERANGE, "%s: member %s too large", in->path, name);
    uint8_t *b = malloc(s->size ? (size_t)s->size : 1);
    uint8_t d[PI2_SHA256_LEN];
    if (!b)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory reading %s", in->path, name);
    if ((rc = pread_full(in, b, (size_t)s->size, s->offset, name, err)) ||
        (rc = pi2_sha256(b, (size_t)s->size, d, err)) || (rc = digest_check(in, s, d, err))) {
        free(b);
        return rc;
    }
    *buf = b;
    *len = (size_t)s->size;
    return 0;
}

/* ---- state ---- */

typedef struct ffn_state {
    int layer, expert;         /* expert -1 on dense models */
    int e;                     /* expert index in member names (0 on dense) */
    const pi2_mf_tensor *t[3]; /* gate, up, down */
    const pi2_mf_profile *prof;
    pi2_bl_ffn lay;
    uint32_t *perm;
    pi2_order_stats st;
} ffn_state;

typedef enum jkind { J_COPY, J_ROWS, J_BITS, J_PERM, J_FFN } jkind;

typedef struct jpart {
    const pi2_ctr_section *sec;
    uint64_t off, len; /* range of the member */
} jpart;

typedef struct job {
    jkind kind;
    int ffn;            /* permutation to apply (J_ROWS, J_BITS, J_PERM, J_FFN) */
    char out[PI2_CTR_NAME_MAX];
    int nparts;
    jpart part[3];
    uint64_t row_bytes; /* J_ROWS */
    uint8_t *buf;       /* filled by the loader */
} job;

typedef struct bctx {
    const pi2_bundle_opts *o;
    input in;
    const pi2_model_desc *d;
    ffn_state *ffn;
    size_t n_ffn;
    uint64_t row_bytes;
    uint32_t io_unit; /* the options' or, for 0, pi2_bl_auto_io_unit's */
    bool two_phase;
    job *jobs;
    size_t n_jobs, cap_jobs;
    pi2_ctr_writer *w;
    /* loader hand-off; job i is read into pool[i % (MAX_AHEAD + 1)], whose
     * previous job has been consumed by then (the loader stays less than
     * MAX_AHEAD jobs ahead),
     * so big buffers are allocated (and their pages zeroed) once */
    uint8_t *pool[MAX_AHEAD + 1];
    uint64_t pool_cap[MAX_AHEAD + 1];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t loaded, consumed;
    uint64_t inflight;
    bool stop, loader_failed;
    pi2_err loader_err;
    /* progress */
    bool tty;
    double t0, last;
    uint64_t written, total;
} bctx;

static int add_job(bctx *b, const job *j, pi2_err *err)
{
    if (b->n_jobs == b->cap_jobs) {
        size_t cap = b->cap_jobs ? 2 * b->cap_jobs : 256, bytes;
        job *p = pi2_mul_size(cap, sizeof *p, &bytes) ? realloc(b->jobs, bytes) : NULL;
        if (!p)
            return pi2_err_set(err, PI2_ENOMEM, "out of memory planning the bundle");
        b->jobs = p;
        b->cap_jobs = cap;
    }
    b->jobs[b->n_jobs++] = *j;
    return 0;
}

static int set_name(char dst[PI2_CTR_NAME_MAX], pi2_err *err, const char *fmt, int l, int e)
{
    if (snprintf(dst, PI2_CTR_NAME_MAX, fmt, l, e) >= PI2_CTR_NAME_MAX)
        return pi2_err_set(err, PI2_ERANGE, "member name too long");
    return 0;
}

/* A plain copy of member `name` in chunks. */
static int plan_copy(bctx *b, const char *name, pi2_err *err)
{
    const pi2_ctr_section *s;
    int rc = in_section(&b->in, name, &s, err);
    if (rc)
        return rc;
    uint64_t off = 0;
    do {
        job j = { .kind = J_COPY, .ffn = -1, .nparts = 1 };
        snprintf(j.out, sizeof j.out, "%s", name);
        uint64_t n = s->size - off < COPY_CHUNK ? s->size - off : COPY_CHUNK;
        j.part[0] = (jpart){ s, off, n };
        rc = add_job(b, &j, err);
        off += n;
    } while (rc == 0 && off < s->size);
    b->total += s->size;
    return rc;
}

/* Member `name` with rows of row_bytes permuted by FFN f. */
static int plan_rows(bctx *b, jkind kind, const char *name, int f, uint64_t rows, uint64_t row_bytes, pi2_err *err)
{
    const pi2_ctr_section *s;
    int rc = in_section(&b->in, name, &s, err);
    if (rc)
        return rc;
    if (kind == J_ROWS && s->size != rows * row_bytes)
        return pi2_err_set(err, PI2_ESHAPE, "%s: member %s holds %llu bytes, expected %llu rows of %llu", b->in.path,
                           name, (unsigned long long)s->size, (unsigned long long)rows, (unsigned long long)row_bytes);
    job j = { .kind = kind, .ffn = f, .nparts = 1, .row_bytes = row_bytes };
    snprintf(j.out, sizeof j.out, "%s", name);
    j.part[0] = (jpart){ s, 0, s->size };
    b->total += s->size;
    return add_job(b, &j, err);
}

static int find_ffn(const bctx *b, int layer, int expert)
{
    for (size_t i = 0; i < b->n_ffn; i++)
        if (b->ffn[i].layer == layer && b->ffn[i].expert == expert)
            return (int)i;
    return -1;
}

/* Every member of the output, in order (see bundle.h). */
static int plan(bctx *b, pi2_err *err)
{
    const pi2_manifest *m = b->in.mf;
    const pi2_model_desc *d = b->d;
    int rc = plan_copy(b, m->tokenizer, err);
    for (size_t i = 0; i < m->n_tensors && rc == 0; i++) {
        const pi2_mf_tensor *t = &m->tensors[i];
        bool ffn = t->role == PI2_T_GATE || t->role == PI2_T_UP || t->role == PI2_T_DOWN;
        if (!ffn) {
            rc = plan_copy(b, t->payload, err);
            if (rc == 0 && t->scales[0])
                rc = plan_copy(b, t->scales, err);
            continue;
        }
        int f = find_ffn(b, t->layer, t->expert);
        if (f < 0)
            return pi2_err_set(err, PI2_EFORMAT, "%s: %s: no FFN for layer %d expert %d", b->in.path, t->name,
                               t->layer, t->expert);
        rc = plan_rows(b, J_ROWS, t->scales, f, (uint64_t)d->n_ff, pi2_q_scale_row_count(t->qtype, t->cols) * 2, err);
    }
    for (size_t i = 0; i < m->n_layers && rc == 0; i++) {
        const pi2_mf_layer *e = &m->layers[i];
        if (!e->has_predictor)
            continue;
        int f = find_ffn(b, e->layer, e->expert);
        if (f < 0)
            return pi2_err_set(err, PI2_EFORMAT, "%s: predictor for layer %d expert %d has no FFN", b->in.path,
                               e->layer, e->expert);
        pi2_qtype qt = pi2_mf_pred_qtype(e->predictor.dtype);
        if (qt != PI2_QT_F32) { /* q8/q4: sizes checked at parse; fc2's payload and scales rows follow the FFN */
            int64_t Rp = (e->predictor.rank + PI2_Q_GROUP - 1) / PI2_Q_GROUP * PI2_Q_GROUP;
            if ((rc = plan_copy(b, e->predictor.fc1, err)) || (rc = plan_copy(b, e->predictor.fc1_scales, err)) ||
                (rc = plan_rows(b, J_ROWS, e->predictor.fc2, f, (uint64_t)d->n_ff, pi2_q_payload_row_bytes(qt, Rp),
                                err)))
                break;
            rc = plan_rows(b, J_ROWS, e->predictor.fc2_scales, f, (uint64_t)d->n_ff,
                           pi2_q_scale_row_count(qt, Rp) * 2, err);
            continue;
        }
        const pi2_ctr_section *s;
        if ((rc = in_section(&b->in, e->predictor.fc1, &s, err)))
            break;
        uint64_t el = pi2_mf_pred_elem(e->predictor.dtype);
        if (s->size != (uint64_t)e->predictor.rank * (uint64_t)d->hidden * el)
            return pi2_err_set(err, PI2_ESHAPE, "%s: member %s holds %llu bytes, expected %s [%d, %d]", b->in.path,
                               s->name, (unsigned long long)s->size, el == 2 ? "f16" : "f32", e->predictor.rank,
                               d->hidden);
        rc = plan_copy(b, e->predictor.fc1, err);
        if (rc == 0)
            rc = plan_rows(b, J_ROWS, e->predictor.fc2, f, (uint64_t)d->n_ff, (uint64_t)e->predictor.rank * el, err);
    }
    for (size_t i = 0; i < m->n_profile && rc == 0; i++) {
        const pi2_mf_profile *p = &m->profile[i];
        int f = find_ffn(b, p->layer, p->expert);
        if (f < 0)
            return pi2_err_set(err, PI2_EFORMAT, "%s: profile for layer %d expert %d has no FFN", b->in.path, p->layer,
                               p->expert);
        rc = plan_rows(b, J_ROWS, p->freq, f, (uint64_t)d->n_ff, 4, err);
        if (rc == 0 && p->bits[0])
            rc = plan_rows(b, J_BITS, p->bits, f, p->bit_samples, 0, err);
    }
    for (size_t f = 0; f < b->n_ffn && rc == 0; f++) {
        job j = { .kind = J_PERM, .ffn = (int)f };
        snprintf(j.out, sizeof j.out, "%s", b->ffn[f].lay.perm);
        b->total += (uint64_t)d->n_ff * 4;
        rc = add_job(b, &j, err);
    }
    for (size_t f = 0; f < b->n_ffn && rc == 0; f++) {
        ffn_state *s = &b->ffn[f];
        job j = { .kind = J_FFN, .ffn = (int)f, .nparts = 3 };
        snprintf(j.out, sizeof j.out, "%s", s->lay.ffn);
        for (int k = 0; k < 3 && rc == 0; k++) {
            const pi2_ctr_section *sec;
            rc = in_section(&b->in, s->t[k]->payload, &sec, err);
            if (rc == 0 && sec->size != (uint64_t)d->n_ff * b->row_bytes)
                rc = pi2_err_set(err, PI2_ESHAPE, "%s: member %s holds %llu bytes, expected %llu", b->in.path,
                                 sec->name, (unsigned long long)sec->size,
                                 (unsigned long long)((uint64_t)d->n_ff * b->row_bytes));
            if (rc == 0)
                j.part[k] = (jpart){ sec, 0, sec->size };
        }
        b->total += (uint64_t)s->lay.groups * s->lay.slot_bytes;
        if (rc == 0)
            rc = add_job(b, &j, err);
    }
    return rc;
}

/* ---- loader thread ---- */

static uint64_t job_bytes(const job *j)
{
    uint64_t n = 0;
    for (int k = 0; k < j->nparts; k++)
        n += j->part[k].len;
    return n;
}

static void *loader_main(void *arg)
{
    bctx *b = arg;
    pi2_sha256_ctx *h = NULL;
    pi2_err err = { 0 };
    int rc = pi2_sha256_init(&h, &err);
    for (size_t i = 0; i < b->n_jobs && rc == 0; i++) {
        job *j = &b->jobs[i];
        uint64_t need = job_bytes(j);
        pthread_mutex_lock(&b->mu);
        while (!b->stop && b->loaded > b->consumed &&
               (b->loaded - b->consumed >= MAX_AHEAD || b->inflight + need > MAX_INFLIGHT))
            pthread_cond_wait(&b->cv, &b->mu);
        bool stop = b->stop;
        pthread_mutex_unlock(&b->mu);
        if (stop)
            break;
        size_t slot = i % (MAX_AHEAD + 1);
        if (need > b->pool_cap[slot]) {
            free(b->pool[slot]);
            b->pool[slot] = malloc((size_t)need);
            b->pool_cap[slot] = b->pool[slot] ? need : 0;
            if (!b->pool[slot]) {
                rc = pi2_err_set(&err, PI2_ENOMEM, "out of memory reading %s", j->part[0].sec->name);
                break;
            }
        }
        uint8_t *buf = b->pool[slot];
        uint64_t at = 0;
        for (int k = 0; k < j->nparts && rc == 0; k++) {
            const jpart *p = &j->part[k];
            rc = pread_full(&b->in, buf + at, (size_t)p->len, p->sec->offset + p->off, p->sec->name, &err);
            if (rc == 0)
                in_drop(&b->in, p->sec->offset + p->off, p->len);
            if (rc == 0)
                rc = pi2_sha256_update(h, buf + at, (size_t)p->len, &err);
            if (rc == 0 && p->off + p->len == p->sec->size) { /* end of the member: check it */
                uint8_t dg[PI2_SHA256_LEN];
                rc = pi2_sha256_final(h, dg, &err);
                if (rc == 0)
                    rc = digest_check(&b->in, p->sec, dg, &err);
            }
            at += p->len;
        }
        if (rc)
            break;
        pthread_mutex_lock(&b->mu);
        j->buf = buf;
        b->inflight += need;
        b->loaded++;
        pthread_cond_broadcast(&b->cv);
        pthread_mutex_unlock(&b->mu);
    }
    pi2_sha256_free(h);
    if (rc) {
        pthread_mutex_lock(&b->mu);
        b->loader_failed = true;
        b->loader_err = err;
        pthread_cond_broadcast(&b->cv);
        pthread_mutex_unlock(&b->mu);
    }
    return NULL;
}

/* Wait for job i's data. */
static int take(bctx *b, size_t i, pi2_err *err)
{
    pthread_mutex_lock(&b->mu);
    while (b->loaded <= i && !b->loader_failed)
        pthread_cond_wait(&b->cv, &b->mu);
    int rc = 0;
    if (b->loaded <= i)
        rc = pi2_err_set(err, b->loader_err.code ? b->loader_err.code : PI2_EIO, "%s", b->loader_err.msg);
    pthread_mutex_unlock(&b->mu);
    return rc;
}

static void release(bctx *b, size_t i)
{
    job *j = &b->jobs[i];
    pthread_mutex_lock(&b->mu);
    j->buf = NULL; /* the pool keeps it */
    b->inflight -= job_bytes(j);
    b->consumed++;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

/* ---- output ---- */

static void progress(bctx *b, uint64_t n)
{
    b->written += n;
    if (!b->tty)
        return;
    double now = pi2_now();
    if (now - b->last < 0.25 && b->written < b->total)
        return;
    b->last = now;
    double el = now - b->t0;
    fprintf(stderr, "\r  bundling %5.1f%%  %.2f / %.2f GB  %.0f MB/s   ",
            b->total ? 100.0 * (double)b->written / (double)b->total : 100.0, b->written / 1e9, b->total / 1e9,
            el > 0 ? b->written / el / 1e6 : 0.0);
}

static int write_data(bctx *b, const void *p, size_t n, pi2_err *err)
{
    int rc = pi2_ctr_writer_data(b->w, p, n, err);
    if (rc == 0)
        progress(b, n);
    return rc;
}

/* out row i = in row perm[i]. */
static void permute_rows(const uint8_t *in, uint8_t *out, const uint32_t *perm, uint32_t n, size_t row)
{
    for (uint32_t i = 0; i < n; i++)
        memcpy(out + (size_t)i * row, in + (size_t)perm[i] * row, row);
}

static int write_rows(bctx *b, const job *j, pi2_err *err)
{
    const ffn_state *f = &b->ffn[j->ffn];
    size_t n = (size_t)j->part[0].len;
    uint8_t *out = malloc(n ? n : 1);
    if (!out)
        return pi2_err_set(err, PI2_ENOMEM, "out of memory writing %s", j->out);
    permute_rows(j->buf, out, f->perm, f->lay.neurons, (size_t)j->row_bytes);
    int rc = pi2_ctr_writer_begin(b->w, j->out, n, err);
    if (rc == 0)
        rc = write_data(b, out, n, err);
    if (rc == 0)
        rc = pi2_ctr_writer_end(b->w, err);
    free(out);
    return rc;
}

/* Activation bits: each sample row keeps its words, bit i = old bit perm[i]. */
static int write_bits(bctx *b, const job *j, pi2_err *err)
{
    const ffn_state *f = &b->ffn[j->ffn];
    uint32_t n = f->lay.neurons;
    size_t words = ((size_t)n + 63) / 64, row = words * 8;
    size_t size = (size_t)j->part[0].len;
    if (size % row != 0)
        return pi2_err_set(err, PI2_ESHAPE, "%s: member %s is not whole rows of %zu bytes", b->in.path, j->out, row);
    uint64_t *out = malloc(size ? size : 1);
    if (!out)
        return pi2_err_set(err, PI2_ENOMEM, "out of memory writing %s", j->out);
    const uint64_t *in = (const uint64_t *)(const void *)j->buf; /* malloc'd: aligned */
    for (size_t s = 0; s < size / row; s++) {
        const uint64_t *r = in + s * words;
        uint64_t *o = out + s * words;
        memset(o, 0, row);
        for (uint32_t i = 0; i < n; i++) {
            uint32_t p = f->perm[i];
            o[i / 64] |= ((r[p / 64] >> (p % 64)) & 1) << (i % 64);
        }
    }
    int rc = pi2_ctr_writer_begin(b->w, j->out, size, err);
    if (rc == 0)
        rc = write_data(b, out, size, err);
    if (rc == 0)
        rc = pi2_ctr_writer_end(b->w, err);
    free(out);
    return rc;
}

static int write_perm(bctx *b, const job *j, pi2_err *err)
{
    const ffn_state *f = &b->ffn[j->ffn];
    size_t n = (size_t)f->lay.neurons * 4;
    int rc = pi2_ctr_writer_begin(b->w, j->out, n, err);
    if (rc == 0)
        rc = write_data(b, f->perm, n, err); /* little-endian host */
    if (rc == 0)
        rc = pi2_ctr_writer_end(b->w, err);
    return rc;
}

/* The FFN member: slots of row-column bundles (bundle/layout.h). */
static int write_ffn(bctx *b, const job *j, uint8_t *chunk, size_t chunk_cap, pi2_err *err)
{
    const ffn_state *f = &b->ffn[j->ffn];
    const pi2_bl_ffn *L = &f->lay;
    size_t R = (size_t)b->row_bytes, mat = (size_t)L->neurons * R;
    const uint8_t *src[3] = { j->buf, j->buf + mat, j->buf + 2 * mat };
    uint64_t size = (uint64_t)L->groups * L->slot_bytes;
    size_t per_chunk = chunk_cap / L->slot_bytes;
    int rc = pi2_ctr_writer_begin(b->w, j->out, size, err);
    for (uint32_t k0 = 0; rc == 0 && k0 < L->groups; k0 += (uint32_t)per_chunk) {
        uint32_t k1 = L->groups - k0 < per_chunk ? L->groups : k0 + (uint32_t)per_chunk;
        size_t bytes = (size_t)(k1 - k0) * L->slot_bytes;
        memset(chunk, 0, bytes);
        uint64_t base = (uint64_t)k0 * L->slot_bytes;
        uint64_t i1 = (uint64_t)k1 * L->group < L->neurons ? (uint64_t)k1 * L->group : L->neurons;
        for (uint32_t i = k0 * L->group; i < i1; i++) {
            uint64_t off[3];
            pi2_bl_neuron_offsets(L, R, b->two_phase, i, off);
            size_t old = f->perm[i];
            for (int m = 0; m < 3; m++)
                memcpy(chunk + (off[m] - base), src[m] + old * R, R);
        }
        rc = write_data(b, chunk, bytes, err);
    }
    if (rc == 0)
        rc = pi2_ctr_writer_end(b->w, err);
    return rc;
}

static int run_jobs(bctx *b, pi2_err *err)
{
    /* the layout chunk: at least one slot */
    size_t cap = OUT_CHUNK;
    for (size_t f = 0; f < b->n_ffn; f++)
        if (b->ffn[f].lay.slot_bytes > cap)
            cap = (size_t)b->ffn[f].lay.slot_bytes;
    uint8_t *chunk = malloc(cap);
    if (!chunk)
        return pi2_err_set(err, PI2_ENOMEM, "out of memory");
    /* A thread of its own, not the pool: the loader reads ahead of the
     * writer for the whole run, handing buffers over under b->mu. */
    pthread_t tid;
    if (pthread_create(&tid, NULL, loader_main, b) != 0) {
        free(chunk);
        return pi2_err_set(err, PI2_ENOMEM, "cannot start the loader thread");
    }
    int rc = 0;
    size_t i = 0;
    for (; i < b->n_jobs && rc == 0; i++) {
        job *j = &b->jobs[i];
        if ((rc = take(b, i, err)))
            break;
        switch (j->kind) {
        case J_COPY:
            if (j->part[0].off == 0)
                rc = pi2_ctr_writer_begin(b->w, j->out, j->part[0].sec->size, err);
            if (rc == 0)
                rc = write_data(b, j->buf, (size_t)j->part[0].len, err);
            if (rc == 0 && j->part[0].off + j->part[0].len == j->part[0].sec->size)
                rc = pi2_ctr_writer_end(b->w, err);
            break;
        case J_ROWS: rc = write_rows(b, j, err); break;
        case J_BITS: rc = write_bits(b, j, err); break;
        case J_PERM: rc = write_perm(b, j, err); break;
        case J_FFN: rc = write_ffn(b, j, chunk, cap, err); break;
        }
        release(b, i);
    }
    pthread_mutex_lock(&b->mu);
    b->stop = true;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
    pthread_join(tid, NULL);
    for (size_t k = 0; k <= MAX_AHEAD; k++) {
        free(b->pool[k]);
        b->pool[k] = NULL;
        b->pool_cap[k] = 0;
    }
    free(chunk);
    return rc;
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
        rc = in_load(&b->in, s->prof->freq, (uint64_t)n * 4, &freq, &len, err);
        if (rc == 0 && s->prof->bits[0]) {
            uint64_t want = s->prof->bit_samples * (((uint64_t)n + 63) / 64) * 8;
            rc = in_load(&b->in, s->prof->bits, want, &bits, &len, err);
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
    b->io_unit = b->o->io_unit ? b->o->io_unit : pi2_bl_auto_io_unit(d, m->quant_ffn);
    int rc = pi2_bl_geometry(d, m->quant_ffn, b->io_unit, &geo, err);
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
            if ((rc = set_name(s->lay.ffn, err, "ffn/%d.%d", l, e)) ||
                (rc = set_name(s->lay.perm, err, "perm/%d.%d", l, e)))
                return rc;
        }
    return 0;
}

/* The output manifest: the input's, with FFN payloads pointing at the ffn
 * members, the bundle object and the output's sections. */
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
        if (t.role == PI2_T_GATE || t.role == PI2_T_UP || t.role == PI2_T_DOWN)
            snprintf(t.payload, sizeof t.payload, "%s", b->ffn[find_ffn(b, t.layer, t.expert)].lay.ffn);
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
            b->o->io_unit ? "--io-unit" : "auto", L0->group, (unsigned long long)L0->slot_bytes);
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
    b.two_phase = b.d->act == PI2_ACT_DRELU;
    if (b.in.mf->quant_ffn != PI2_QT_Q4 && b.in.mf->quant_ffn != PI2_QT_Q8) {
        rc = pi2_err_set(err, PI2_EUNSUPPORTED, "%s: FFN quant %s cannot be bundled", o->in_path,
                         pi2_q_type_name(b.in.mf->quant_ffn));
        goto out;
    }
    b.row_bytes = pi2_q_payload_row_bytes(b.in.mf->quant_ffn, b.d->hidden);
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
    if ((rc = plan(&b, err)) || (rc = pi2_ctr_writer_create(&b.w, o->out_path, err)) || (rc = run_jobs(&b, err)))
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
