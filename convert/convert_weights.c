/* pi2-convert, stage 2: stream every weight tensor of the source model into
 * the container, quantized row by row (see convert.h for member names);
 * 4-bit attention, embedding and head rows with the searched scale
 * (pi2_q_quantize_row_search), weighed by the calibration run's input
 * statistics where it has them. */
#include "convert/conv.h"

#include "formats/pool.h"

#include <stdlib.h>
#include <string.h>

/* One source row as f32. */
static void row_f32(const pi2_st_tensor *t, size_t elem0, int64_t n, float *out)
{
    const uint8_t *p = (const uint8_t *)t->data;
    switch (t->dtype) {
    case PI2_DT_F32:
        memcpy(out, p + elem0 * 4, (size_t)n * 4);
        break;
    case PI2_DT_BF16:
        for (int64_t j = 0; j < n; j++) {
            uint16_t h;
            memcpy(&h, p + (elem0 + (size_t)j) * 2, 2); /* little-endian host */
            out[j] = pi2_bf16_to_f32(h);
        }
        break;
    default: /* F16; the reference checked dtypes at open */
        for (int64_t j = 0; j < n; j++) {
            const uint8_t *q = p + (elem0 + (size_t)j) * 2;
            out[j] = pi2_f16_to_f32((uint16_t)(q[0] | q[1] << 8));
        }
        break;
    }
}

/* A block of output rows [r0, r1) of a tensor as stored: plain rows, or
 * (transposed) columns of the source. */
typedef struct qjob {
    const pi2_st_tensor *t;
    pi2_qtype qt;
    bool transposed;
    int64_t cols;       /* stored row length */
    int64_t src_cols;   /* source row length */
    int64_t r0, r1;
    uint16_t *scales;   /* for row r0 */
    uint8_t *payload;   /* for row r0 */
    float *scratch;     /* cols floats */
    float *tile;        /* transposed: [cols][TBLOCK] floats */
    bool search;        /* pi2_q_quantize_row_search (conv_role_search) */
    const float *imp;   /* its columns' importance (convert_imp.c), or NULL */
    int rc;
} qjob;

#define TBLOCK 64 /* neurons per transposed tile */

static void qjob_run(qjob *j)
{
    size_t pb = pi2_q_payload_row_bytes(j->qt, j->cols), sc = pi2_q_scale_row_count(j->qt, j->cols);
    for (int64_t r0 = j->r0; r0 < j->r1 && j->rc == 0; r0 += (j->transposed ? TBLOCK : 1)) {
        int64_t nb = 1;
        if (j->transposed) {
            /* columns r0.. of the source [cols, src_cols]: read each source
             * row's contiguous slice once into the tile (tile[k][i]) rather
             * than striding down every column (one page per element) */
            nb = j->r1 - r0 < TBLOCK ? j->r1 - r0 : TBLOCK;
            for (int64_t k = 0; k < j->cols; k++)
                row_f32(j->t, (size_t)k * (size_t)j->src_cols + (size_t)r0, nb, j->tile + (size_t)k * TBLOCK);
        }
        for (int64_t i = 0; i < nb && j->rc == 0; i++) {
            int64_t r = r0 + i;
            if (j->transposed)
                for (int64_t k = 0; k < j->cols; k++)
                    j->scratch[k] = j->tile[(size_t)k * TBLOCK + (size_t)i];
            else
                row_f32(j->t, (size_t)r * (size_t)j->src_cols, j->cols, j->scratch);
            uint16_t *s = j->scales ? j->scales + (size_t)(r - j->r0) * sc : NULL;
            uint8_t *p = j->payload + (size_t)(r - j->r0) * pb;
            j->rc = j->search ? pi2_q_quantize_row_search(j->qt, j->scratch, j->cols, j->imp, s, p)
                              : pi2_q_quantize_row(j->qt, j->scratch, j->cols, s, p);
        }
    }
}

/* One chunk's jobs, job k on thread k % nthreads of the pool. */
typedef struct qjobs {
    qjob *jobs;
    int n;
} qjobs;

static void qjobs_run(void *arg, int tid, int nthreads)
{
    qjobs *q = arg;
    for (int k = tid; k < q->n; k += nthreads)
        qjob_run(&q->jobs[k]);
}

#define QMAX_THREADS 16

/* Quantize tensor t into members "<base>.q" + "<base>.s" (or "<base>.f32"),
 * recording it in the manifest. */
static int write_tensor(pi2_conv *c, const pi2_st_tensor *t, const char *hfname, pi2_tname role, int layer,
                        int expert, pi2_qtype qt, bool transposed, pi2_err *err)
{
    int64_t rows = transposed ? t->shape[1] : t->shape[0];
    int64_t cols = t->ndim == 1 ? t->shape[0] : transposed ? t->shape[0] : t->shape[1];
    if (t->ndim == 1)
        rows = 1;
    int64_t src_cols = t->ndim == 1 ? t->shape[0] : t->shape[1];
    int rc = pi2_q_check_cols(qt, cols, hfname, err);
    if (rc)
        return rc;
    char pname[PI2_CTR_NAME_MAX], sname[PI2_CTR_NAME_MAX];
    const char *ext = qt == PI2_QT_F32 ? "f32" : "q";
    if (snprintf(pname, sizeof pname, "w/%s.%s", hfname, ext) >= (int)sizeof pname ||
        snprintf(sname, sizeof sname, "w/%s.s", hfname) >= (int)sizeof sname)
        return pi2_err_set(err, PI2_ERANGE, "%s: tensor name too long for the container", hfname);
    size_t pb = pi2_q_payload_row_bytes(qt, cols), sc = pi2_q_scale_row_count(qt, cols);
    size_t nscales, pbytes;
    if (!pi2_mul_size((size_t)rows, sc, &nscales) || !pi2_mul_size((size_t)rows, pb, &pbytes))
        return pi2_err_set(err, PI2_ERANGE, "%s: tensor too large", hfname);
    uint16_t *scales = sc ? pi2_malloc_array(nscales, sizeof *scales) : NULL;
    int64_t chunk = (int64_t)((4u << 20) / (pb ? pb : 1));
    if (chunk < 1)
        chunk = 1;
    if (transposed && chunk > 512)
        chunk = 512; /* columns: tiles of TBLOCK per thread */
    uint8_t *buf = pi2_malloc_array((size_t)chunk, pb);
    bool search = qt == PI2_QT_Q4 && conv_role_search(role);
    float *imp = search ? pi2_malloc_array((size_t)cols, sizeof *imp) : NULL;
    bool weighted = imp && conv_imp_fill(c, role, layer, imp, cols);
    int T = c->threads < QMAX_THREADS ? c->threads : QMAX_THREADS;
    float *scratch[QMAX_THREADS] = {0}, *tile[QMAX_THREADS] = {0};
    pi2_pool *pool = NULL; /* NULL: every job on the caller */
    if (T > 1 && pi2_pool_create(&pool, T, NULL) != 0)
        pool = NULL;
    bool ok = (scales || !sc) && buf;
    for (int k = 0; k < T && ok; k++) {
        ok = (scratch[k] = pi2_malloc_array((size_t)cols, sizeof(float))) != NULL;
        if (ok && transposed)
            ok = (tile[k] = pi2_malloc_array((size_t)cols * TBLOCK, sizeof(float))) != NULL;
    }
    if (!ok) {
        rc = pi2_err_set(err, PI2_ENOMEM, "%s: out of memory quantizing", hfname);
        goto out;
    }
    rc = pi2_ctr_writer_begin(c->w, pname, pbytes, err);
    for (int64_t r0 = 0; rc == 0 && r0 < rows; r0 += chunk) {
        int64_t r1 = r0 + chunk < rows ? r0 + chunk : rows;
        int n = T < r1 - r0 ? T : (int)(r1 - r0);
        qjob jobs[QMAX_THREADS];
        for (int k = 0; k < n; k++) {
            int64_t a = r0 + (r1 - r0) * k / n, b = r0 + (r1 - r0) * (k + 1) / n;
            jobs[k] = (qjob){t, qt, transposed, cols, src_cols, a, b, sc ? scales + (size_t)a * sc : NULL,
                             buf + (size_t)(a - r0) * pb, scratch[k], tile[k], search, weighted ? imp : NULL, 0};
        }
        qjobs q = { jobs, n };
        if (pool)
            pi2_pool_run(pool, qjobs_run, &q);
        else
            qjobs_run(&q, 0, 1);
        for (int k = 0; k < n && rc == 0; k++)
            if (jobs[k].rc)
                rc = pi2_err_set(err, jobs[k].rc, "%s: cannot quantize (non-finite value or scale out of range)",
                                 hfname);
        if (rc == 0)
            rc = pi2_ctr_writer_data(c->w, buf, (size_t)(r1 - r0) * pb, err);
        c->bytes_read += (uint64_t)(r1 - r0) * (uint64_t)cols * pi2_dtype_size(t->dtype);
        conv_progress(c, "quantizing");
    }
    if (rc == 0)
        rc = pi2_ctr_writer_end(c->w, err);
    if (rc == 0 && sc)
        rc = pi2_ctr_writer_add(c->w, sname, scales, nscales * sizeof *scales, err);
    if (rc == 0)
        rc = conv_record_tensor(c, hfname, role, layer, expert, qt, rows, cols, transposed, pname, sc ? sname : "",
                                err);
    pi2_st_release(t);
out:
    pi2_pool_free(pool);
    for (int k = 0; k < T; k++) {
        free(scratch[k]);
        free(tile[k]);
    }
    free(buf);
    free(imp);
    free(scales);
    return rc;
}

static int one(pi2_conv *c, pi2_tname role, int layer, int expert, pi2_qtype qt, bool transposed, pi2_err *err)
{
    char name[128];
    const pi2_model_desc *d = c->desc;
    if (!pi2_tensor_name(name, sizeof name, d, role, layer, expert))
        return pi2_err_set(err, PI2_ERANGE, "tensor name too long");
    const pi2_st_tensor *t = pi2_st_find(c->st, name);
    if (!t && role == PI2_T_EMBED && d->tie_embeddings) { /* tied, stored once as lm_head */
        pi2_tensor_name(name, sizeof name, d, PI2_T_LM_HEAD, 0, 0);
        t = pi2_st_find(c->st, name);
        pi2_tensor_name(name, sizeof name, d, PI2_T_EMBED, 0, 0); /* record under the embedding's name */
    }
    if (!t)
        return pi2_err_set(err, PI2_ENOTFOUND, "%s: tensor %s not found", c->o->model_dir, name);
    return write_tensor(c, t, name, role, layer, expert, qt, transposed, err);
}

pi2_qtype conv_role_qt(const pi2_conv *c, pi2_tname t)
{
    const pi2_convert_opts *o = c->o;
    if (t == PI2_T_LM_HEAD && c->desc->tie_embeddings)
        t = PI2_T_EMBED;
    switch (t) {
    case PI2_T_GATE:
    case PI2_T_UP:
    case PI2_T_DOWN:
        return o->q_ffn;
    case PI2_T_ATTN_NORM:
    case PI2_T_FFN_NORM:
    case PI2_T_OUT_NORM:
    case PI2_T_ROUTER:
        return PI2_QT_F32;
    case PI2_T_EMBED:
        return o->q_embed != PI2_QT_F32 ? o->q_embed : o->q_other;
    case PI2_T_LM_HEAD:
        return o->q_head != PI2_QT_F32 ? o->q_head : o->q_other;
    case PI2_T_K:
    case PI2_T_V:
    case PI2_T_O:
        return o->q_kvo != PI2_QT_F32 ? o->q_kvo : o->q_other;
    default:
        return o->q_other;
    }
}

int conv_write_weights(pi2_conv *c, pi2_err *err)
{
    const pi2_model_desc *d = c->desc;
    const pi2_convert_opts *o = c->o;
    int E = d->n_experts > 0 ? d->n_experts : 1;
    int rc = one(c, PI2_T_EMBED, 0, 0, conv_role_qt(c, PI2_T_EMBED), false, err);
    for (int l = 0; rc == 0 && l < d->n_layers; l++) {
        rc = one(c, PI2_T_ATTN_NORM, l, 0, PI2_QT_F32, false, err);
        for (int r = PI2_T_Q; rc == 0 && r <= PI2_T_O; r++)
            rc = one(c, (pi2_tname)r, l, 0, conv_role_qt(c, (pi2_tname)r), false, err);
        if (!rc) rc = one(c, PI2_T_FFN_NORM, l, 0, PI2_QT_F32, false, err);
        if (!rc && d->n_experts > 0)
            rc = one(c, PI2_T_ROUTER, l, 0, PI2_QT_F32, false, err);
        for (int e = 0; rc == 0 && e < E; e++) {
            rc = one(c, PI2_T_GATE, l, e, o->q_ffn, false, err);
            if (!rc) rc = one(c, PI2_T_UP, l, e, o->q_ffn, false, err);
            if (!rc) rc = one(c, PI2_T_DOWN, l, e, o->q_ffn, true, err); /* neuron view: columns as rows */
        }
    }
    if (rc == 0)
        rc = one(c, PI2_T_OUT_NORM, 0, 0, PI2_QT_F32, false, err);
    if (rc == 0 && !d->tie_embeddings)
        rc = one(c, PI2_T_LM_HEAD, 0, 0, conv_role_qt(c, PI2_T_LM_HEAD), false, err);
    return rc;
}

int conv_record_tensor(pi2_conv *c, const char *name, pi2_tname role, int layer, int expert, pi2_qtype qt,
                       int64_t rows, int64_t cols, bool transposed, const char *payload, const char *scales,
                       pi2_err *err)
{
    if (pi2_grow(&c->tensors, &c->cap_tensors, c->n_tensors, sizeof *c->tensors, 64))
        return pi2_err_set(err, PI2_ENOMEM, "out of memory");
    conv_tensor *t = &c->tensors[c->n_tensors++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->role = role;
    t->layer = layer;
    t->expert = expert;
    t->qt = qt;
    t->rows = rows;
    t->cols = cols;
    t->transposed = transposed;
    snprintf(t->payload, sizeof t->payload, "%s", payload);
    snprintf(t->scales, sizeof t->scales, "%s", scales);
    return 0;
}
