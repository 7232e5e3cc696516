/* Converted model -> F32 Hugging Face dir (the quantized reference). */
#include "convert/convert.h"

#include "formats/container.h"
#include "formats/manifest.h"
#include "formats/safetensors.h"

#include <stdlib.h>
#include <string.h>

/* Open a container and parse its manifest. Caller closes/frees both. */
static int open_converted(const char *path, pi2_ctr **c, pi2_manifest **mf, pi2_err *err)
{
    int rc = pi2_ctr_open(c, path, err);
    if (rc)
        return rc;
    const pi2_ctr_member *m = pi2_ctr_find(*c, PI2_MF_NAME);
    if (!m)
        return pi2_err_set(err, PI2_EFORMAT, "%s: no %s: not a pi2 model", path, PI2_MF_NAME);
    char name[4200];
    snprintf(name, sizeof name, "%s:%s", path, PI2_MF_NAME);
    return pi2_manifest_parse((const char *)m->data, (size_t)m->size, name, mf, err);
}

static const pi2_ctr_member *member(const pi2_ctr *c, const char *name, uint64_t want, pi2_err *err, int *rc)
{
    const pi2_ctr_member *m = pi2_ctr_find(c, name);
    if (!m)
        *rc = pi2_err_set(err, PI2_EFORMAT, "%s: member %s missing", pi2_ctr_path(c), name);
    else if (m->size != want)
        *rc = pi2_err_set(err, PI2_EFORMAT, "%s: member %s holds %llu bytes, expected %llu", pi2_ctr_path(c), name,
                          (unsigned long long)m->size, (unsigned long long)want);
    return *rc ? NULL : m;
}

/* Stream tensor t as F32 rows of its HF shape. */
static int write_tensor(const pi2_ctr *c, const pi2_mf_tensor *t, pi2_st_writer *w, pi2_err *err)
{
    int rc = 0;
    size_t pb = pi2_q_payload_row_bytes(t->qtype, t->cols), sc = pi2_q_scale_row_count(t->qtype, t->cols);
    const pi2_ctr_member *p = member(c, t->payload, (uint64_t)t->rows * pb, err, &rc);
    const pi2_ctr_member *s = sc ? member(c, t->scales, (uint64_t)t->rows * sc * 2, err, &rc) : NULL;
    if (rc)
        return rc;
    const uint16_t *scales = s ? (const uint16_t *)(const void *)s->data : NULL; /* 4 KiB-aligned member */
    if (!t->transposed) {
        float *row = pi2_malloc_array((size_t)t->cols, sizeof *row);
        if (!row)
            return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", t->name);
        for (int64_t r = 0; r < t->rows && rc == 0; r++) {
            pi2_q_dequantize_row(t->qtype, scales ? scales + (size_t)r * sc : NULL, p->data + (size_t)r * pb, t->cols,
                                 row);
            rc = pi2_st_writer_write(w, row, (size_t)t->cols * sizeof *row, err);
        }
        free(row);
        return rc;
    }
    /* stored [rows, cols] = HF [cols, rows] transposed: dequantize all, then
     * write the HF rows (one stored column each) */
    size_t n;
    float *all = pi2_mul_size((size_t)t->rows, (size_t)t->cols, &n) ? pi2_malloc_array(n, sizeof *all) : NULL;
    float *row = pi2_malloc_array((size_t)t->rows, sizeof *row);
    if (!all || !row)
        rc = pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", t->name);
    for (int64_t r = 0; r < t->rows && rc == 0; r++)
        pi2_q_dequantize_row(t->qtype, scales ? scales + (size_t)r * sc : NULL, p->data + (size_t)r * pb, t->cols,
                             all + (size_t)r * (size_t)t->cols);
    for (int64_t j = 0; j < t->cols && rc == 0; j++) {
        for (int64_t r = 0; r < t->rows; r++)
            row[r] = all[(size_t)r * (size_t)t->cols + (size_t)j];
        rc = pi2_st_writer_write(w, row, (size_t)t->rows * sizeof *row, err);
    }
    free(all);
    free(row);
    return rc;
}

int pi2_convert_export(const char *converted, const char *out_dir, pi2_err *err)
{
    pi2_ctr *c = NULL;
    pi2_manifest *mf = NULL;
    pi2_st_writer *w = NULL;
    char tmp[4096], path[4200];
    bool have_tmp = false;
    int rc = open_converted(converted, &c, &mf, err);
    if (rc)
        goto out;
    if (mf->kind != PI2_MF_CONVERTED) {
        rc = pi2_err_set(err, PI2_EUNSUPPORTED, "%s: not a converted model (kind %s)", converted,
                         pi2_manifest_kind_name(mf->kind));
        goto out;
    }
    if ((rc = pi2_dir_begin(out_dir, tmp, sizeof tmp, err)) != 0)
        goto out;
    have_tmp = true;
    pi2_path_join(path, sizeof path, tmp, "config.json");
    if ((rc = pi2_config_write_dtype(path, &mf->config, "float32", err)) != 0)
        goto out;
    const pi2_ctr_member *tk = pi2_ctr_find(c, mf->tokenizer);
    if (!tk) {
        rc = pi2_err_set(err, PI2_EFORMAT, "%s: member %s missing", converted, mf->tokenizer);
        goto out;
    }
    pi2_afile *af = NULL;
    pi2_path_join(path, sizeof path, tmp, "tokenizer.json");
    if ((rc = pi2_afile_open(&af, path, err)) != 0)
        goto out;
    if ((rc = pi2_afile_write(af, tk->data, (size_t)tk->size, err)) != 0) {
        pi2_afile_abort(af);
        goto out;
    }
    if ((rc = pi2_afile_commit(af, err)) != 0)
        goto out;
    pi2_path_join(path, sizeof path, tmp, "model.safetensors");
    if ((rc = pi2_st_writer_create(&w, path, err)) != 0)
        goto out;
    for (size_t i = 0; i < mf->n_tensors && rc == 0; i++) {
        const pi2_mf_tensor *t = &mf->tensors[i];
        bool norm = t->role == PI2_T_ATTN_NORM || t->role == PI2_T_FFN_NORM || t->role == PI2_T_OUT_NORM;
        int64_t shape[2] = {t->transposed ? t->cols : t->rows, t->transposed ? t->rows : t->cols};
        if (norm)
            rc = pi2_st_writer_add(w, t->name, PI2_DT_F32, 1, &t->cols, err);
        else
            rc = pi2_st_writer_add(w, t->name, PI2_DT_F32, 2, shape, err);
    }
    for (size_t i = 0; i < mf->n_tensors && rc == 0; i++)
        rc = write_tensor(c, &mf->tensors[i], w, err);
    if (rc == 0) {
        rc = pi2_st_writer_finish(w, err);
        w = NULL;
    }
    if (rc == 0) {
        rc = pi2_dir_commit(tmp, out_dir, err);
        have_tmp = false;
    }
out:
    pi2_st_writer_free(w);
    if (have_tmp)
        pi2_dir_abort(tmp);
    pi2_manifest_free(mf);
    pi2_ctr_close(c);
    return rc;
}
