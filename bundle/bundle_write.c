/* Bundle writer, second half: the loader thread that reads and checks the
 * planned ranges a few jobs ahead, and the main thread's lay-out and write
 * of each member. See bundle.c for the why. */
#include "bundle/bundle_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
            rc = bw_pread_full(&b->in, buf + at, (size_t)p->len, p->sec->offset + p->off, p->sec->name, &err);
            if (rc == 0)
                bw_in_drop(&b->in, p->sec->offset + p->off, p->len);
            if (rc == 0)
                rc = pi2_sha256_update(h, buf + at, (size_t)p->len, &err);
            if (rc == 0 && p->off + p->len == p->sec->size) { /* end of the member: check it */
                uint8_t dg[PI2_SHA256_LEN];
                rc = pi2_sha256_final(h, dg, &err);
                if (rc == 0)
                    rc = bw_digest_check(&b->in, p->sec, dg, &err);
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
int bw_take(bctx *b, size_t i, pi2_err *err)
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
    /* the job's buffer: gate, up, down payloads [n][P], then their scales [n][C] */
    size_t R = (size_t)b->row_bytes, P = (size_t)b->pay_bytes, C = R - P, n = L->neurons;
    const uint8_t *src[3] = { j->buf, j->buf + n * P, j->buf + 2 * n * P };
    const uint8_t *ssrc[3] = { j->buf + 3 * n * P, j->buf + 3 * n * P + n * C, j->buf + 3 * n * P + 2 * n * C };
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
            pi2_bl_rows at;
            pi2_bl_neuron_rows(L, R, P, b->two_phase, i, &at);
            size_t old = f->perm[i];
            for (int m = 0; m < 3; m++) {
                memcpy(chunk + (at.pay[m] - base), src[m] + old * P, P);
                memcpy(chunk + (at.sc[m] - base), ssrc[m] + old * C, C);
            }
        }
        rc = write_data(b, chunk, bytes, err);
    }
    if (rc == 0)
        rc = pi2_ctr_writer_end(b->w, err);
    return rc;
}

int bw_run_jobs(bctx *b, pi2_err *err)
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
        if ((rc = bw_take(b, i, err)))
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
