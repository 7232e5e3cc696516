/* pi2-convert: where imported predictors come from, found and checked
 * before any long stage, and how the converted model keeps them.
 *
 * Sources, in order:
 *   --predictors PATH   a safetensors file, a directory holding
 *                       model.safetensors(.index.json) or exactly one
 *                       .safetensors file (tensors under the checkpoint's
 *                       own predictor names, hfconfig.h PI2_T_PRED_FC*), or a
 *                       PowerInfer predictor repository: model_{L}.pt for
 *                       every layer L (PyTorch zip state dicts holding
 *                       "fc1.weight" [rank, hidden] and "fc2.weight"
 *                       [n_ff, rank]) with an optional config.json whose
 *                       sparse_threshold raises the published threshold;
 *   the checkpoint      predictor tensors among the weights (TurboSparse);
 *   beside the weights  predictor.safetensors, predictors.safetensors, a
 *                       predictor/ or predictors/ directory, or model_0.pt
 *                       files in the model directory itself; used when they
 *                       check out, else the conversion stops and says why
 *                       (with --train-predictors it trains instead, and the
 *                       report says why the files were not used).
 * Published predictors read the residual before the FFN's norm
 * (PowerInfer's convention) and fire a neuron when its score is above the
 * threshold; both are recorded in the manifest.
 */
#include "convert/conv.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static bool is_file(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static bool float_dtype(pi2_dtype dt) { return dt == PI2_DT_F32 || dt == PI2_DT_F16 || dt == PI2_DT_BF16; }

static int n_ffn_experts(const pi2_model_desc *d) { return d->n_experts > 0 ? d->n_experts : 1; }

/* The two tensors of (layer, expert) in the source, and their names. */
static void lookup(const conv_psrc *p, const pi2_model_desc *d, int l, int e, const pi2_st_tensor **f1,
                   const pi2_st_tensor **f2, char *n1, char *n2, size_t cap)
{
    if (p->layer) {
        snprintf(n1, cap, "fc1.weight");
        snprintf(n2, cap, "fc2.weight");
        *f1 = pi2_st_find(p->layer[l], n1);
        *f2 = pi2_st_find(p->layer[l], n2);
        return;
    }
    pi2_tensor_name(n1, cap, d, PI2_T_PRED_FC1, l, e);
    pi2_tensor_name(n2, cap, d, PI2_T_PRED_FC2, l, e);
    *f1 = pi2_st_find(p->st, n1);
    *f2 = pi2_st_find(p->st, n2);
}

/* Both tensors of (layer, expert) present, float, [r, hidden] and [n_ff, r]. */
static int check_one(const conv_psrc *p, const pi2_model_desc *d, int l, int e, pi2_err *err)
{
    char n1[160], n2[160];
    const pi2_st_tensor *f1, *f2;
    lookup(p, d, l, e, &f1, &f2, n1, n2, sizeof n1);
    const char *where = p->layer ? pi2_st_at(p->layer[l], 0) ? pi2_st_at(p->layer[l], 0)->file : p->path : p->path;
    if (!f1 || !f2)
        return pi2_err_set(err, PI2_ENOTFOUND, "%s: predictor tensor %s (layer %d%s) missing", where,
                           f1 ? n2 : n1, l, d->n_experts > 0 ? ", an expert's" : "");
    if (!float_dtype(f1->dtype) || !float_dtype(f2->dtype))
        return pi2_err_set(err, PI2_EUNSUPPORTED, "%s: predictor tensor %s is %s, expected F32, F16 or BF16",
                           f1->file, float_dtype(f1->dtype) ? n2 : n1,
                           pi2_dtype_name(float_dtype(f1->dtype) ? f2->dtype : f1->dtype));
    if (f1->ndim != 2 || f2->ndim != 2 || f1->shape[1] != d->hidden || f2->shape[0] != d->n_ff ||
        f2->shape[1] != f1->shape[0] || f1->shape[0] < 1 || f1->shape[0] > PI2_PRED_MAX_DIM)
        return pi2_err_set(err, PI2_ESHAPE,
                           "%s: predictor shapes do not match the model: %s is [%lld, %lld], %s is [%lld, %lld]; "
                           "expected [r, %d] and [%d, r]",
                           f1->file, n1, (long long)f1->shape[0], (long long)(f1->ndim > 1 ? f1->shape[1] : 0), n2,
                           (long long)f2->shape[0], (long long)(f2->ndim > 1 ? f2->shape[1] : 0), d->hidden,
                           d->n_ff);
    return 0;
}

static int check_all(const conv_psrc *p, const pi2_model_desc *d, pi2_err *err)
{
    int rc = 0;
    for (int l = 0; rc == 0 && l < d->n_layers; l++)
        for (int e = 0; rc == 0 && e < n_ffn_experts(d); e++)
            rc = check_one(p, d, l, e, err);
    return rc;
}

static void psrc_close(conv_psrc *p)
{
    for (int l = 0; p->layer && l < p->n_layer; l++)
        pi2_st_close(p->layer[l]);
    free(p->layer);
    pi2_st_close(p->own);
    memset(p, 0, sizeof *p);
}

/* A PowerInfer repository: model_0.pt .. model_{n-1}.pt, nothing past. */
static int open_repo(conv_psrc *p, const char *dir, const pi2_model_desc *d, pi2_err *err)
{
    char path[4096], name[64];
    if (d->n_experts > 0)
        return pi2_err_set(err, PI2_EUNSUPPORTED,
                           "%s: a model_{L}.pt predictor repository is one predictor per layer; this model has %d "
                           "experts per layer (its predictors ship in the checkpoint)",
                           dir, d->n_experts);
    snprintf(name, sizeof name, "model_%d.pt", d->n_layers);
    if (pi2_path_join(path, sizeof path, dir, name) && is_file(path))
        return pi2_err_set(err, PI2_ESHAPE, "%s: holds %s but the model has %d layers: predictors of another model?",
                           dir, name, d->n_layers);
    p->layer = pi2_calloc_array((size_t)d->n_layers, sizeof *p->layer);
    if (!p->layer)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", dir);
    p->n_layer = d->n_layers;
    for (int l = 0; l < d->n_layers; l++) {
        snprintf(name, sizeof name, "model_%d.pt", l);
        if (!pi2_path_join(path, sizeof path, dir, name))
            return pi2_err_set(err, PI2_ERANGE, "%s: path too long", dir);
        if (!is_file(path))
            return pi2_err_set(err, PI2_ENOTFOUND, "%s: predictor of layer %d (%s) missing: a PowerInfer repository "
                               "holds model_0.pt .. model_%d.pt", dir, l, name, d->n_layers - 1);
        int rc = pi2_st_open(&p->layer[l], path, err);
        if (rc)
            return rc;
    }
    if (!pi2_path_join(path, sizeof path, dir, "config.json"))
        return pi2_err_set(err, PI2_ERANGE, "%s: path too long", dir);
    if (is_file(path)) {
        int rc = pi2_pred_repo_config_read(path, &p->threshold, &p->repo_threshold, err);
        if (rc)
            return rc;
    }
    p->kind = "PowerInfer repo";
    return 0;
}

/* The one *.safetensors file of dir, if there is exactly one. */
static int one_safetensors(const char *dir, char *out, size_t cap, pi2_err *err)
{
    DIR *dp = opendir(dir);
    if (!dp)
        return pi2_err_errno(err, PI2_EIO, errno, "%s: cannot list", dir);
    int n = 0;
    for (struct dirent *de; (de = readdir(dp)) != NULL;) {
        size_t len = strlen(de->d_name);
        if (len > 12 && strcmp(de->d_name + len - 12, ".safetensors") == 0 && n++ == 0 &&
            !pi2_path_join(out, cap, dir, de->d_name))
            n = -1000;
    }
    closedir(dp);
    if (n == 1)
        return 0;
    return pi2_err_set(err, PI2_ENOTFOUND,
                       n == 0 ? "%s: no predictors here: expected model_{L}.pt files (a PowerInfer repository), "
                                "model.safetensors(.index.json) or one .safetensors file"
                              : "%s: several .safetensors files and no model.safetensors.index.json: give the "
                                "predictor file itself",
                       dir);
}

/* A file or directory given as a predictor source. */
static int open_path(conv_psrc *p, const char *path, const pi2_model_desc *d, pi2_err *err)
{
    char buf[4096];
    snprintf(p->path, sizeof p->path, "%s", path);
    int rc;
    if (pi2_is_dir(path)) {
        if (!pi2_path_join(buf, sizeof buf, path, "model_0.pt"))
            return pi2_err_set(err, PI2_ERANGE, "%s: path too long", path);
        if (is_file(buf))
            return open_repo(p, path, d, err);
        char idx[4096], one[4096];
        if (!pi2_path_join(idx, sizeof idx, path, "model.safetensors.index.json") ||
            !pi2_path_join(one, sizeof one, path, "model.safetensors"))
            return pi2_err_set(err, PI2_ERANGE, "%s: path too long", path);
        if (is_file(idx) || is_file(one))
            rc = pi2_st_open(&p->own, path, err);
        else if ((rc = one_safetensors(path, buf, sizeof buf, err)) == 0)
            rc = pi2_st_open(&p->own, buf, err);
    } else {
        rc = pi2_st_open(&p->own, path, err);
    }
    if (rc)
        return rc;
    p->st = p->own;
    p->kind = "safetensors";
    return 0;
}

/* Predictor files beside the weights: the first candidate that exists. */
static const char *beside(const char *dir, char *buf, size_t cap)
{
    static const char *const names[] = {"predictor.safetensors", "predictors.safetensors", "predictor", "predictors",
                                        "model_0.pt"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        struct stat sb;
        if (pi2_path_join(buf, cap, dir, names[i]) && stat(buf, &sb) == 0)
            return strcmp(names[i], "model_0.pt") == 0 ? dir : buf;
    }
    return NULL;
}

int conv_pred_find(pi2_conv *c, pi2_err *err)
{
    const pi2_convert_opts *o = c->o;
    const pi2_model_desc *d = c->desc;
    conv_psrc *p = &c->psrc;
    char n1[160], buf[4096];
    int rc = 0;
    memset(p, 0, sizeof *p);
    pi2_tensor_name(n1, sizeof n1, d, PI2_T_PRED_FC1, 0, 0);
    if (o->predictors_dir) {
        if ((rc = open_path(p, o->predictors_dir, d, err)) == 0)
            rc = check_all(p, d, err);
    } else if (pi2_st_find(c->st, n1)) {
        p->st = c->st;
        p->kind = "checkpoint";
        snprintf(p->path, sizeof p->path, "%s", o->model_dir);
        rc = check_all(p, d, err);
    } else {
        const char *cand = beside(o->model_dir, buf, sizeof buf);
        if (cand) {
            pi2_err why = {0};
            if ((rc = open_path(p, cand, d, &why)) == 0)
                rc = check_all(p, d, &why);
            if (rc && !o->train_predictors) {
                c->need = PI2_CONVERT_NEED_PREDICTORS;
                return pi2_err_set(err, rc, "predictors beside the weights cannot be used (%s)", why.msg);
            }
            if (rc) {
                conv_report(c, "predictors beside the weights NOT used (%s): training new ones\n", why.msg);
                psrc_close(p);
                rc = 0;
            }
        }
    }
    if (rc) {
        psrc_close(p);
        return rc;
    }
    c->pred_input = o->pred_input >= 0 ? (pi2_pred_input)o->pred_input
                    : p->kind              ? PI2_PRED_IN_PRENORM
                                           : PI2_CONV_TRAIN_INPUT;
    return 0;
}

void conv_pred_close(pi2_conv *c) { psrc_close(&c->psrc); }

int conv_pred_import(pi2_conv *c, int layer, int expert, pi2_predictor **out, pi2_err *err)
{
    const pi2_model_desc *d = c->desc;
    char n1[160], n2[160];
    const pi2_st_tensor *f1, *f2;
    lookup(&c->psrc, d, layer, expert, &f1, &f2, n1, n2, sizeof n1);
    int r = (int)f1->shape[0];
    float *w1 = pi2_malloc_array(f1->nelem, sizeof(float)), *w2 = pi2_malloc_array(f2->nelem, sizeof(float));
    int rc;
    if (!w1 || !w2)
        rc = pi2_err_set(err, PI2_ENOMEM, "out of memory importing the predictor of layer %d", layer);
    else if ((rc = pi2_st_to_f32(f1, w1, f1->nelem, err)) == 0 && (rc = pi2_st_to_f32(f2, w2, f2->nelem, err)) == 0)
        rc = pi2_pred_create(out, d->hidden, d->n_ff, r, w1, w2, 0.0f, err);
    if (rc && rc != PI2_ENOMEM) {
        char m[sizeof err->msg];
        snprintf(m, sizeof m, "%s", err->msg);
        pi2_err_set(err, rc, "%s: layer %d: %s", f1->file, layer, m);
    }
    pi2_st_release(f1);
    pi2_st_release(f2);
    free(w1);
    free(w2);
    return rc;
}

/* fp16 copy of n weights; PI2_ERANGE naming the first one past fp16. */
static int to_f16(const float *w, size_t n, size_t cols, uint16_t *out, const char *what, int layer, int expert,
                  pi2_err *err)
{
    for (size_t i = 0; i < n; i++) {
        if (!(fabsf(w[i]) <= 65504.0f))
            return pi2_err_set(err, PI2_ERANGE,
                               "the predictor of layer %d (expert %d): %s[%zu][%zu] = %g is beyond fp16, in which "
                               "predictors are stored",
                               layer, expert, what, i / cols, i % cols, (double)w[i]);
        out[i] = pi2_f32_to_f16(w[i]);
    }
    return 0;
}

int conv_pred_store(pi2_conv *c, size_t fi, const pi2_predictor *p, pi2_err *err)
{
    const pi2_model_desc *d = c->desc;
    conv_pred *cp = &c->preds[fi];
    int r = pi2_pred_rank(p), E = n_ffn_experts(d);
    size_t n1 = (size_t)r * (size_t)d->hidden, n2 = (size_t)d->n_ff * (size_t)r;
    free(cp->fc1);
    free(cp->fc2);
    cp->fc1 = pi2_malloc_array(n1, sizeof *cp->fc1);
    cp->fc2 = pi2_malloc_array(n2, sizeof *cp->fc2);
    if (!cp->fc1 || !cp->fc2)
        return pi2_err_set(err, PI2_ENOMEM, "out of memory for the predictors");
    int l = (int)(fi / (size_t)E), e = (int)(fi % (size_t)E), rc;
    if ((rc = to_f16(pi2_pred_fc1(p), n1, (size_t)d->hidden, cp->fc1, "fc1", l, e, err)) ||
        (rc = to_f16(pi2_pred_fc2(p), n2, (size_t)r, cp->fc2, "fc2", l, e, err)))
        return rc;
    cp->rank = r;
    cp->threshold = pi2_pred_threshold(p);
    return 0;
}

/* The rows of w [rows][cols] as the runtime runs them: each row padded
 * with zeros to whole groups (as stored), quantized to qt and read back. */
static int as_run(pi2_qtype qt, float *w, int64_t rows, int64_t cols, pi2_err *err)
{
    int64_t cp = (cols + PI2_Q_GROUP - 1) / PI2_Q_GROUP * PI2_Q_GROUP;
    float *row = pi2_calloc_array((size_t)cp, sizeof *row);
    uint8_t *pay = malloc(pi2_q_payload_row_bytes(qt, cp));
    uint16_t *sc = pi2_malloc_array(pi2_q_scale_row_count(qt, cp), sizeof *sc);
    int rc = row && pay && sc ? 0 : pi2_err_set(err, PI2_ENOMEM, "out of memory for a predictor");
    for (int64_t r = 0; rc == 0 && r < rows; r++) {
        float *wr = w + (size_t)r * (size_t)cols;
        memcpy(row, wr, (size_t)cols * sizeof *row);
        if (pi2_q_quantize_row(qt, row, cp, sc, pay) != 0)
            rc = pi2_err_set(err, PI2_ERANGE, "a predictor row cannot be quantized (non-finite value)");
        else
            pi2_q_dequantize_row(qt, sc, pay, cp, row);
        memcpy(wr, row, (size_t)cols * sizeof *row);
    }
    free(row);
    free(pay);
    free(sc);
    return rc;
}

int conv_pred_expand(const pi2_conv *c, size_t fi, pi2_predictor **out, pi2_err *err)
{
    const pi2_model_desc *d = c->desc;
    const conv_pred *cp = &c->preds[fi];
    size_t n1 = (size_t)cp->rank * (size_t)d->hidden, n2 = (size_t)d->n_ff * (size_t)cp->rank;
    float *w1 = pi2_malloc_array(n1, sizeof(float)), *w2 = pi2_malloc_array(n2, sizeof(float));
    /* the rows decode runs: q4 when stored so, else q8 (stored, or made
     * from the f16 rows at open) */
    pi2_qtype qt = c->o->q_pred == PI2_QT_Q4 ? PI2_QT_Q4 : PI2_QT_Q8;
    int rc;
    if (!w1 || !w2) {
        rc = pi2_err_set(err, PI2_ENOMEM, "out of memory for a predictor");
    } else {
        for (size_t i = 0; i < n1; i++)
            w1[i] = pi2_f16_to_f32(cp->fc1[i]);
        for (size_t i = 0; i < n2; i++)
            w2[i] = pi2_f16_to_f32(cp->fc2[i]);
        rc = as_run(qt, w1, cp->rank, d->hidden, err);
        if (rc == 0)
            rc = as_run(qt, w2, d->n_ff, cp->rank, err);
        if (rc == 0)
            rc = pi2_pred_create(out, d->hidden, d->n_ff, cp->rank, w1, w2, cp->threshold, err);
    }
    free(w1);
    free(w2);
    return rc;
}
