/* Bundle writer, first half: the converted input (sections checked against
 * the container and their digests) and the plan, the list of members to
 * write with the input byte ranges each needs. See bundle.c for the why. */
#include "bundle/bundle_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- the converted input ---- */

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

int bw_pread_full(const input *in, void *buf, size_t n, uint64_t off, const char *what, pi2_err *err)
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
void bw_in_drop(const input *in, uint64_t off, uint64_t len)
{
    uint64_t a = (off + 4095) / 4096 * 4096, e = (off + len) / 4096 * 4096;
    if (e > a)
        posix_fadvise(in->fd, (off_t)a, (off_t)(e - a), POSIX_FADV_DONTNEED);
}

int bw_digest_check(const input *in, const pi2_ctr_section *s, const uint8_t got[PI2_SHA256_LEN], pi2_err *err)
{
    if (memcmp(got, s->sha256, PI2_SHA256_LEN) == 0)
        return 0;
    return pi2_err_set(err, PI2_ESIG, "%s: member %s does not match its SHA-256 in the manifest (corrupt converted model)",
                       in->path, s->name);
}

/* Whole member into a new buffer (caller frees *buf), checked against its
 * digest. want_size: required size, or UINT64_MAX for any. */
int bw_in_load(const input *in, const char *name, uint64_t want_size, uint8_t **buf, size_t *len, pi2_err *err)
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
    if ((rc = bw_pread_full(in, b, (size_t)s->size, s->offset, name, err)) ||
        (rc = pi2_sha256(b, (size_t)s->size, d, err)) || (rc = bw_digest_check(in, s, d, err))) {
        free(b);
        return rc;
    }
    *buf = b;
    *len = (size_t)s->size;
    return 0;
}

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

int bw_set_name(char dst[PI2_CTR_NAME_MAX], pi2_err *err, const char *fmt, int l, int e)
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

int bw_find_ffn(const bctx *b, int layer, int expert)
{
    for (size_t i = 0; i < b->n_ffn; i++)
        if (b->ffn[i].layer == layer && b->ffn[i].expert == expert)
            return (int)i;
    return -1;
}

/* Every member of the output, in order (see bundle.h). */
int bw_plan(bctx *b, pi2_err *err)
{
    const pi2_manifest *m = b->in.mf;
    const pi2_model_desc *d = b->d;
    int rc = plan_copy(b, m->tokenizer, err);
    if (rc == 0 && m->chat_template[0])
        rc = plan_copy(b, m->chat_template, err);
    for (size_t i = 0; i < m->n_tensors && rc == 0; i++) {
        const pi2_mf_tensor *t = &m->tensors[i];
        bool ffn = t->role == PI2_T_GATE || t->role == PI2_T_UP || t->role == PI2_T_DOWN;
        if (!ffn) {
            rc = plan_copy(b, t->payload, err);
            if (rc == 0 && t->scales[0])
                rc = plan_copy(b, t->scales, err);
            continue;
        }
        if (bw_find_ffn(b, t->layer, t->expert) < 0) /* its payload and scales go to the FFN's slots */
            return pi2_err_set(err, PI2_EFORMAT, "%s: %s: no FFN for layer %d expert %d", b->in.path, t->name,
                               t->layer, t->expert);
    }
    for (size_t i = 0; i < m->n_layers && rc == 0; i++) {
        const pi2_mf_layer *e = &m->layers[i];
        if (!e->has_predictor)
            continue;
        int f = bw_find_ffn(b, e->layer, e->expert);
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
        int f = bw_find_ffn(b, p->layer, p->expert);
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
        job j = { .kind = J_FFN, .ffn = (int)f, .nparts = 6 };
        snprintf(j.out, sizeof j.out, "%s", s->lay.ffn);
        for (int k = 0; k < 6 && rc == 0; k++) {
            const pi2_ctr_section *sec;
            uint64_t row = k < 3 ? b->pay_bytes : b->row_bytes - b->pay_bytes;
            rc = in_section(&b->in, k < 3 ? s->t[k]->payload : s->t[k - 3]->scales, &sec, err);
            if (rc == 0 && sec->size != (uint64_t)d->n_ff * row)
                rc = pi2_err_set(err, PI2_ESHAPE, "%s: member %s holds %llu bytes, expected %llu", b->in.path,
                                 sec->name, (unsigned long long)sec->size, (unsigned long long)((uint64_t)d->n_ff * row));
            if (rc == 0)
                j.part[k] = (jpart){ sec, 0, sec->size };
        }
        b->total += (uint64_t)s->lay.groups * s->lay.slot_bytes;
        if (rc == 0)
            rc = add_job(b, &j, err);
    }
    return rc;
}
