/* pi2-convert, stages 1, 3 and 4: calibration run (traces, activation
 * profile, input statistics), predictors (imported or trained, thresholds
 * calibrated to a target recall), SiLU threshold mode, and the quality
 * report (perplexity of the fp32 reference, quantized dense, quantized +
 * predicted sparsity). */
#include "convert/conv.h"

#include "convert/calib.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SEQ_LEN 256         /* calibration sequence length (capped by max positions) */
#define BATCH_SEQ 8         /* sequences per calibration forward */
#define MAX_TRACE 32768     /* trace samples kept per FFN for training */
#define BIT_SAMPLES 1024    /* activation bit rows stored in the profile */

static size_t nffn(const pi2_model_desc *d) { return (size_t)d->n_layers * (d->n_experts > 0 ? d->n_experts : 1); }

static size_t ffn_index(const pi2_model_desc *d, int layer, int expert)
{
    return (size_t)layer * (d->n_experts > 0 ? d->n_experts : 1) + (size_t)expert;
}

/* ---- calibration tokens ---- */

/* Calibration tokens, sequence length and sequences per batched step.
 * Default: as many tokens as a trace holds on small models, 4096 on large
 * ones (the calibration run costs a full forward per token). Large models
 * generate their own text in short sequences, many at a time: each decode
 * step streams every weight once, whatever the batch. */
static void calib_shape(const pi2_conv *c, int *tokens, int *len, int *batch)
{
    uint64_t params = 0;
    for (size_t i = 0; i < pi2_st_count(c->st); i++)
        params += pi2_st_at(c->st, i)->nelem;
    bool big = params >= 100000000u;
    *tokens = c->o->calib_tokens > 0 ? c->o->calib_tokens : big ? 4096 : MAX_TRACE;
    *len = SEQ_LEN;
    *batch = BATCH_SEQ;
    if (big) { /* 64 training sequences a step (their held-out eighth riding
                  along in the same steps); as few steps as the token budget allows */
        *batch = 64 + 64 / 8;
        *len = *tokens / 64;
        *len = *len < 8 ? 8 : *len > 64 ? 64 : *len;
    }
    if (*len > c->desc->max_pos)
        *len = c->desc->max_pos;
}

int conv_calib_text_load(pi2_conv *c, pi2_err *err)
{
    if (!c->o->calib_path)
        return 0;
    char *text = NULL;
    size_t n = 0;
    int rc = pi2_read_file(c->o->calib_path, 256u << 20, &text, &n, err);
    if (rc)
        return rc;
    rc = pi2_tok_encode(c->tok, text, n, &c->calib_ids, &c->n_calib_ids, err);
    free(text);
    int tokens, len, batch;
    calib_shape(c, &tokens, &len, &batch);
    if (rc == 0 && c->n_calib_ids < 2 * (size_t)(len - 1))
        rc = pi2_err_set(err, PI2_EINVAL, "%s: calibration text too short: %zu tokens, need at least %d",
                         c->o->calib_path, c->n_calib_ids, 2 * (len - 1));
    return rc;
}

/* Fill c->calib with n_seq sequences of len tokens, each starting at BOS,
 * from the tokenized --calib text. */
static int calib_from_text(pi2_conv *c, int len, int want_seq, pi2_err *err)
{
    size_t nids = c->n_calib_ids;
    int per = len - 1; /* BOS + per tokens of text */
    int have = (int)(nids / (size_t)per);
    if (have < 2)
        return pi2_err_set(err, PI2_EINVAL, "%s: calibration text too short: %zu tokens, need at least %d",
                           c->o->calib_path, nids, 2 * per);
    c->n_seq = have < want_seq ? have : want_seq;
    c->calib = pi2_malloc_array((size_t)c->n_seq * len, sizeof *c->calib);
    if (!c->calib)
        return pi2_err_set(err, PI2_ENOMEM, "out of memory for calibration tokens");
    for (int q = 0; q < c->n_seq; q++) {
        c->calib[(size_t)q * len] = c->bos;
        memcpy(c->calib + (size_t)q * len + 1, c->calib_ids + (size_t)q * per, (size_t)per * sizeof *c->calib);
    }
    return 0;
}

/* ---- trace collection ---- */

typedef struct trace_ctx {
    pi2_conv *c;
    pi2_err *err;
    int rc;
    int keep_rows; /* rows (sequences of a decode step) >= this are held out; INT32_MAX = all */
    int n_new;     /* tokens per sequence in the current call */
} trace_ctx;

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* The q-quantile of |A[i]| over n values (a strided sample of at most 2^20
 * is plenty): the value below which a share q of them lie. PI2_ENOMEM. */
static int abs_quantile(const float *A, size_t n, double q, float *out, pi2_err *err)
{
    *out = 0.0f;
    if (n == 0)
        return 0;
    size_t m = n < (1u << 20) ? n : (1u << 20), stride = n / m;
    float *v = pi2_malloc_array(m, sizeof *v);
    if (!v)
        return pi2_err_set(err, PI2_ENOMEM, "out of memory for activation statistics");
    for (size_t i = 0; i < m; i++)
        v[i] = fabsf(A[i * stride]);
    qsort(v, m, sizeof *v, cmp_float);
    *out = v[(size_t)(q * (double)(m - 1))];
    free(v);
    return 0;
}

static void on_ffn_trace(void *ctx, int layer, int expert, int n, const int32_t *rows, const float *X, const float *R,
                         float *A)
{
    trace_ctx *t = ctx;
    pi2_conv *c = t->c;
    const pi2_model_desc *d = c->desc;
    if (t->rc)
        return;
    size_t fi = ffn_index(d, layer, expert);
    int F = d->n_ff;
    if (c->silu && !c->silu_set[fi]) {
        t->rc = abs_quantile(A, (size_t)n * F, c->o->silu_sparsity, &c->silu_thr[fi], t->err);
        if (t->rc)
            return;
        c->silu_set[fi] = true;
    }
    float min_abs = c->silu ? c->silu_thr[fi] : 0.0f;
    uint32_t *cnt = c->counts + fi * (size_t)F;
    for (int i = 0; i < n; i++) {
        if (rows[i] / t->n_new >= t->keep_rows)
            continue; /* a held-out sequence */
        const float *a = A + (size_t)i * F;
        for (int j = 0; j < F; j++)
            cnt[j] += fabsf(a[j]) > min_abs;
        c->tokens[fi]++;
        if (pi2_trace_count(c->traces[fi]) < MAX_TRACE) {
            t->rc = pi2_trace_add(c->traces[fi], conv_pred_in(c, X, R) + (size_t)i * d->hidden, a, min_abs, t->err);
            if (t->rc)
                return;
        }
    }
}

/* Input statistics of the training rows (held-out sequences come last:
 * rows ascend sequence-major). */
static void on_input(void *ctx, pi2_tname t, int layer, int expert, int n, const int32_t *rows, const float *in,
                     int64_t cols)
{
    trace_ctx *tc = ctx;
    int kept = 0;
    while (kept < n && (rows ? rows[kept] : kept) / tc->n_new < tc->keep_rows)
        kept++;
    (void)expert;
    conv_imp_add(tc->c, t, layer, kept, in, cols);
}

/* Self-generated calibration text, `batch` sequences per batched decode.
 * The traces of the training sequences are recorded while they are
 * generated (the FFN callback sees every decode step), so no second pass. */
static int calib_generate(pi2_conv *c, int len, int n_seq, int n_held, int batch, pi2_err *err)
{
    c->n_seq = n_seq;
    c->n_held = n_held;
    c->calib = pi2_malloc_array((size_t)n_seq * len, sizeof *c->calib);
    int32_t *prompt = pi2_malloc_array((size_t)batch, sizeof *prompt);
    int32_t *out = pi2_malloc_array((size_t)batch * len, sizeof *out);
    pi2_calib_state *s = NULL;
    trace_ctx tc = {c, err, 0, INT32_MAX, 1};
    pi2_calib_opts co = {.threads = c->threads, .ffn = on_ffn_trace, .ffn_ctx = &tc, .input = on_input,
                         .input_ctx = &tc};
    int rc = !c->calib || !prompt || !out ? pi2_err_set(err, PI2_ENOMEM, "out of memory for calibration tokens") : 0;
    for (int k = 0; rc == 0 && k < batch; k++)
        prompt[k] = c->bos;
    int n_train = n_seq - n_held;
    for (int q0 = 0; rc == 0 && q0 < n_seq; q0 += batch) {
        int nb = n_seq - q0 < batch ? n_seq - q0 : batch;
        pi2_calib_state_free(s);
        s = NULL;
        tc.keep_rows = n_train - q0; /* sequences of this batch past n_train are held out */
        pi2_sample_opts so = {.temperature = 1.0f, .top_k = 0, .top_p = 0.95f,
                              .seed = c->o->seed * 1000003u + (uint64_t)q0};
        rc = pi2_calib_state_create(&s, c->m, nb, len, &co, err);
        if (rc == 0)
            rc = pi2_calib_generate(s, prompt, 1, len, &so, out, err);
        if (rc == 0)
            rc = tc.rc;
        if (rc == 0)
            memcpy(c->calib + (size_t)q0 * len, out, (size_t)nb * len * sizeof *out);
        conv_stage_progress(c, "generating calibration text", q0 + nb, n_seq);
    }
    pi2_calib_state_free(s);
    free(prompt);
    free(out);
    return rc;
}

static int traces_alloc(pi2_conv *c, pi2_err *err)
{
    const pi2_model_desc *d = c->desc;
    size_t nf = nffn(d);
    c->traces = pi2_calloc_array(nf, sizeof *c->traces);
    c->counts = pi2_calloc_array(nf * (size_t)d->n_ff, sizeof *c->counts);
    c->tokens = pi2_calloc_array(nf, sizeof *c->tokens);
    c->silu_thr = pi2_calloc_array(nf, sizeof *c->silu_thr);
    c->silu_set = pi2_calloc_array(nf, sizeof *c->silu_set);
    if (!c->traces || !c->counts || !c->tokens || !c->silu_thr || !c->silu_set)
        return pi2_err_set(err, PI2_ENOMEM, "out of memory for activation traces");
    int rc = 0;
    for (size_t i = 0; i < nf && rc == 0; i++)
        rc = pi2_trace_create(&c->traces[i], d->hidden, d->n_ff, err);
    return rc;
}

/* Traces from a prefill over the training sequences (calibration text). */
static int collect_traces(pi2_conv *c, int len, pi2_err *err)
{
    int rc = 0;
    trace_ctx tc = {c, err, 0, INT32_MAX, len};
    pi2_calib_opts co = {.threads = c->threads, .ffn = on_ffn_trace, .ffn_ctx = &tc, .input = on_input,
                         .input_ctx = &tc};
    pi2_calib_state *s = NULL;
    rc = pi2_calib_state_create(&s, c->m, BATCH_SEQ, len, &co, err);
    int n_train = c->n_seq - c->n_held;
    for (int q0 = 0; rc == 0 && q0 < n_train; q0 += BATCH_SEQ) {
        int nb = n_train - q0 < BATCH_SEQ ? n_train - q0 : BATCH_SEQ;
        pi2_calib_state_free(s);
        s = NULL;
        rc = pi2_calib_state_create(&s, c->m, nb, len, &co, err);
        if (rc == 0)
            rc = pi2_calib_forward(s, c->calib + (size_t)q0 * len, len, NULL, err);
        if (rc == 0)
            rc = tc.rc;
        conv_stage_progress(c, "calibration run", q0 + nb, n_train);
    }
    pi2_calib_state_free(s);
    return rc;
}

/* ---- predictors ---- */

/* The published threshold as the runtime compares (score >= threshold):
 * the smallest float above it, so a neuron fires when score > published. */
static float published_threshold(const pi2_conv *c)
{
    return nextafterf((float)c->psrc.threshold, INFINITY);
}

/* One FFN's imported predictor: read, kept as stored (fp16), then its
 * threshold (published, or calibrated to --recall) and quality measured on
 * the traces with the stored weights. */
static int import_ffn(pi2_conv *c, int l, int e, size_t fi, pi2_err *err)
{
    pi2_trace *tr = c->traces[fi];
    pi2_predictor *p = NULL, *q = NULL;
    int rc = conv_pred_import(c, l, e, &p, err);
    if (rc == 0)
        rc = conv_pred_store(c, fi, p, err);
    if (rc == 0)
        rc = conv_pred_expand(c, fi, &q, err);
    if (rc == 0)
        rc = pi2_pred_set_threshold(q, published_threshold(c));
    if (rc == 0 && c->o->recall_set && pi2_trace_count(tr) > 0 && pi2_trace_active_frac(tr) > 0)
        rc = pi2_pred_calibrate(q, tr, c->o->recall, err);
    if (rc == 0 && pi2_trace_count(tr) > 0)
        rc = pi2_pred_eval(q, tr, &c->reports[fi], err);
    if (rc == 0)
        c->preds[fi].threshold = pi2_pred_threshold(q);
    pi2_pred_free(p);
    pi2_pred_free(q);
    return rc;
}

static int train_ffn(pi2_conv *c, int l, int e, size_t fi, pi2_err *err)
{
    const pi2_model_desc *d = c->desc;
    pi2_trace *tr = c->traces[fi];
    if (pi2_trace_count(tr) < 2 || pi2_trace_active_frac(tr) == 0.0) {
        c->need = PI2_CONVERT_NEED_CALIB;
        return pi2_err_set(err, PI2_EINVAL,
                           "layer %d expert %d: too few calibration samples with active neurons (%zu) "
                           "to train a predictor",
                           l, e, pi2_trace_count(tr));
    }
    pi2_pred_train_opts to;
    pi2_pred_train_defaults(&to);
    to.target_recall = c->o->recall;
    to.seed = c->o->seed + fi;
    to.threads = c->threads;
    /* Small models need rank comparable to their width to reach
     * the recall target at a low predicted-active share. */
    to.rank_min = 2 * d->hidden < 256 ? 2 * d->hidden : 256;
    to.epochs = 30;
    to.patience = 3;
    pi2_predictor *p = NULL;
    int rc = pi2_pred_train(tr, &to, &p, &c->reports[fi], err);
    if (rc == 0)
        rc = conv_pred_store(c, fi, p, err);
    pi2_pred_free(p);
    return rc;
}

static int predictors(pi2_conv *c, pi2_err *err)
{
    const pi2_model_desc *d = c->desc;
    const pi2_convert_opts *o = c->o;
    size_t nf = nffn(d);
    int E = d->n_experts > 0 ? d->n_experts : 1;
    bool import = c->psrc.kind != NULL;
    if (!import && !o->train_predictors)
        return 0;
    c->preds = pi2_calloc_array(nf, sizeof *c->preds);
    c->reports = pi2_calloc_array(nf, sizeof *c->reports);
    if (!c->preds || !c->reports)
        return pi2_err_set(err, PI2_ENOMEM, "out of memory for predictors");
    conv_stage(c, "%s predictors (%s input)", import ? "importing" : "training", pi2_pred_input_name(c->pred_input));
    if (import) {
        conv_report(c, "predictors imported from %s (%s), reading the %s residual; threshold: ", c->psrc.path,
                    c->psrc.kind, c->pred_input == PI2_PRED_IN_PRENORM ? "pre-norm" : "normed (not the published)");
        if (o->recall_set)
            conv_report(c, "calibrated to recall %.3f\n", o->recall);
        else
            conv_report(c, "published (score > %g%s; not calibrated: no target recall asked)\n", c->psrc.threshold,
                        c->psrc.repo_threshold ? ", the repo's sparse_threshold" : "");
    } else {
        conv_report(c, "predictors trained on the %s input, target recall %.3f:\n",
                    c->pred_input == PI2_PRED_IN_PRENORM ? "pre-norm" : "normed", o->recall);
    }
    int rc = 0;
    for (int l = 0; rc == 0 && l < d->n_layers; l++)
        for (int e = 0; rc == 0 && e < E; e++) {
            size_t fi = ffn_index(d, l, e);
            rc = import ? import_ffn(c, l, e, fi, err) : train_ffn(c, l, e, fi, err);
            if (rc)
                break;
            const pi2_pred_report *r = &c->reports[fi];
            char ex[32] = "";
            if (d->n_experts > 0)
                snprintf(ex, sizeof ex, " expert %d", e);
            /* the rows decode runs (conv_pred_expand): q4 groups of 18 bytes or q8 ones of 34 */
            bool q4 = o->q_pred == PI2_QT_Q4;
            uint64_t groups = pi2_pred_bytes_q8(d->hidden, d->n_ff, c->preds[fi].rank) / 34;
            conv_report(c,
                        "  layer %2d%s: rank %4d  recall %.4f  precision %.3f  predicted active %.3f  true active "
                        "%.3f  %.1f MB (%s)",
                        l, ex, c->preds[fi].rank, r->recall, r->precision, r->pred_active_frac, r->true_active_frac,
                        (double)(groups * (q4 ? 18 : 34)) / 1e6, q4 ? "q4" : "q8");
            if (!import)
                conv_report(c, "  trained in %.1f s", r->seconds);
            conv_report(c, "\n");
            conv_stage_progress(c, "predictors", (int)fi + 1, (int)nf);
        }
    return rc;
}

/* ---- quality ---- */

/* Callbacks cannot return errors: the first one is kept here and checked
 * after each forward, so a quality figure is never silently wrong. */
typedef struct q_ctx {
    pi2_conv *c;
    pi2_err *err;
    int rc;
} q_ctx;

/* Quantize-dequantize rows in place, as the converted weights hold them
 * (search: the searched scale, weighed by imp when non-NULL). */
static int qdq_rows(pi2_qtype qt, float *w, int64_t rows, int64_t cols, bool search, const float *imp,
                    pi2_err *err)
{
    if (qt == PI2_QT_F32 || cols % PI2_Q_GROUP != 0)
        return 0;
    size_t pb = pi2_q_payload_row_bytes(qt, cols), sc = pi2_q_scale_row_count(qt, cols);
    uint8_t *p = malloc(pb);
    uint16_t *s = malloc(sc * sizeof *s);
    int rc = p && s ? 0 : pi2_err_set(err, PI2_ENOMEM, "out of memory measuring quantized quality");
    for (int64_t r = 0; rc == 0 && r < rows; r++) {
        float *row = w + (size_t)r * (size_t)cols;
        int q = search ? pi2_q_quantize_row_search(qt, row, cols, imp, s, p) : pi2_q_quantize_row(qt, row, cols, s, p);
        if (q != 0)
            rc = pi2_err_set(err, PI2_ERANGE, "cannot quantize a weight row (non-finite value or scale out of range)");
        else
            pi2_q_dequantize_row(qt, s, p, cols, row);
    }
    free(p);
    free(s);
    return rc;
}

static void on_weight_q(void *ctx, pi2_tname t, int layer, int expert, float *w, int64_t rows, int64_t cols)
{
    q_ctx *q = ctx;
    (void)expert;
    if (q->rc)
        return;
    pi2_qtype qt = conv_role_qt(q->c, t);
    if (t == PI2_T_DOWN) {
        /* stored transposed: groups run along the hidden dimension, i.e. down
         * the columns of this [d, n_ff] matrix */
        float *col = malloc((size_t)rows * sizeof *col);
        if (!col) {
            q->rc = pi2_err_set(q->err, PI2_ENOMEM, "out of memory measuring quantized quality");
            return;
        }
        for (int64_t j = 0; j < cols && q->rc == 0; j++) {
            for (int64_t i = 0; i < rows; i++)
                col[i] = w[(size_t)i * (size_t)cols + (size_t)j];
            q->rc = qdq_rows(qt, col, 1, rows, false, NULL, q->err);
            for (int64_t i = 0; i < rows; i++)
                w[(size_t)i * (size_t)cols + (size_t)j] = col[i];
        }
        free(col);
        return;
    }
    bool search = qt == PI2_QT_Q4 && conv_role_search(t);
    float *imp = search ? malloc((size_t)cols * sizeof *imp) : NULL;
    bool weighted = imp && conv_imp_fill(q->c, t, layer, imp, cols);
    q->rc = qdq_rows(qt, w, rows, cols, search, weighted ? imp : NULL, q->err);
    free(imp);
}

static void on_ffn_sparse(void *ctx, int layer, int expert, int n, const int32_t *rows, const float *X,
                          const float *R, float *A)
{
    q_ctx *q = ctx;
    pi2_conv *c = q->c;
    const pi2_model_desc *d = c->desc;
    (void)rows;
    size_t fi = ffn_index(d, layer, expert);
    int F = d->n_ff;
    size_t W = ((size_t)F + 63) / 64;
    if (q->rc)
        return;
    uint64_t *bits = malloc(W * sizeof *bits);
    pi2_predictor *p = NULL; /* the stored predictor, one FFN at a time */
    if (!bits || (c->preds && conv_pred_expand(c, fi, &p, q->err) != 0)) {
        q->rc = pi2_err_set(q->err, PI2_ENOMEM, "out of memory measuring sparse quality");
        free(bits);
        return;
    }
    const float *in = conv_pred_in(c, X, R);
    for (int i = 0; i < n && q->rc == 0; i++) {
        float *a = A + (size_t)i * F;
        if (p && pi2_pred_predict(p, in + (size_t)i * d->hidden, bits) < 0) {
            q->rc = pi2_err_set(q->err, PI2_ENOMEM, "out of memory measuring sparse quality");
            break;
        }
        for (int j = 0; j < F; j++) {
            bool keep = p ? (bits[j / 64] >> (j % 64)) & 1 : fabsf(a[j]) > c->silu_thr[fi];
            if (!keep)
                a[j] = 0.0f;
        }
    }
    pi2_pred_free(p);
    free(bits);
}

static int quality(pi2_conv *c, int len, pi2_err *err)
{
    int held = c->n_held;
    const int32_t *toks = c->calib + (size_t)(c->n_seq - held) * len;
    double nll[3] = {0, 0, 0};
    bool sparse_mode = c->preds || c->silu;
    int rc = 0;
    for (int k = 0; k < 3 && rc == 0; k++) {
        if (k == 2 && !sparse_mode)
            break;
        q_ctx qc = {c, err, 0};
        pi2_calib_opts co = {.threads = c->threads};
        if (k >= 1) {
            co.weight = on_weight_q;
            co.weight_ctx = &qc;
        }
        if (k == 2) {
            co.ffn = on_ffn_sparse;
            co.ffn_ctx = &qc;
        }
        pi2_calib_state *s = NULL;
        for (int q0 = 0; rc == 0 && q0 < held; q0 += BATCH_SEQ) {
            int nb = held - q0 < BATCH_SEQ ? held - q0 : BATCH_SEQ;
            double part[BATCH_SEQ];
            rc = pi2_calib_state_create(&s, c->m, nb, len, &co, err);
            if (rc == 0)
                rc = pi2_calib_nll(s, toks + (size_t)q0 * len, len, part, err);
            if (rc == 0)
                rc = qc.rc;
            for (int i = 0; rc == 0 && i < nb; i++)
                nll[k] += part[i];
            pi2_calib_state_free(s);
            s = NULL;
        }
        conv_stage_progress(c, "quality", k + 1, 3);
    }
    if (rc)
        return rc;
    double n = (double)held * (len - 1);
    c->quality_tokens = (uint64_t)n;
    c->ppl[0] = exp(nll[0] / n);
    c->ppl[1] = exp(nll[1] / n);
    c->ppl[2] = sparse_mode ? exp(nll[2] / n) : NAN;
    conv_report(c, "quality on %.0f held-out tokens: perplexity fp32 %.4f | quantized dense %.4f (%+.2f%%)", n,
                c->ppl[0], c->ppl[1], 100.0 * (c->ppl[1] / c->ppl[0] - 1));
    if (sparse_mode)
        conv_report(c, " | quantized + %s sparsity %.4f (%+.2f%%)", c->preds ? "predicted" : "threshold", c->ppl[2],
                    100.0 * (c->ppl[2] / c->ppl[0] - 1));
    conv_report(c, "\n");
    return 0;
}

/* ---- profile members ---- */

static int write_profile(pi2_conv *c, pi2_err *err)
{
    const pi2_model_desc *d = c->desc;
    int F = d->n_ff, E = d->n_experts > 0 ? d->n_experts : 1;
    float *freq = pi2_malloc_array((size_t)F, sizeof *freq);
    int rc = 0;
    if (!freq)
        rc = pi2_err_set(err, PI2_ENOMEM, "out of memory for the profile");
    for (int l = 0; rc == 0 && l < d->n_layers; l++) {
        double routed = 0; /* MoE: the layer's routing choices (tokens x top-k) */
        for (int e = 0; e < E; e++)
            routed += (double)c->tokens[ffn_index(d, l, e)];
        for (int e = 0; rc == 0 && e < E; e++) {
            size_t fi = ffn_index(d, l, e);
            const uint32_t *cnt = c->counts + fi * (size_t)F;
            double tok = (double)c->tokens[fi], sum = 0;
            int hot = 0;
            for (int j = 0; j < F; j++) {
                freq[j] = tok > 0 ? (float)(cnt[j] / tok) : 0.0f;
                sum += freq[j];
                hot += freq[j] > 0.5f;
            }
            /* share of all activations that the 10% most frequent neurons carry */
            int top = F / 10 > 0 ? F / 10 : 1;
            float thr;
            if ((rc = abs_quantile(freq, (size_t)F, 1.0 - (double)top / F, &thr, err)) != 0)
                break;
            double topsum = 0;
            int taken = 0;
            for (int j = 0; j < F; j++)
                if (freq[j] > thr) {
                    topsum += freq[j];
                    taken++;
                }
            for (int j = 0; j < F && taken < top; j++)
                if (freq[j] == thr) {
                    topsum += freq[j];
                    taken++;
                }
            pi2_mf_profile p = {0};
            p.layer = l;
            p.expert = d->n_experts > 0 ? e : -1;
            p.active_frac = sum / F;
            p.hot_share = (double)hot / F;
            p.top10_share = sum > 0 ? topsum / sum : 0.0;
            p.route_share = d->n_experts > 0 && routed > 0 ? (double)c->tokens[fi] / routed : NAN;
            snprintf(p.freq, sizeof p.freq, "profile/%d.%d.freq", l, e);
            rc = pi2_ctr_writer_add(c->w, p.freq, freq, (size_t)F * sizeof *freq, err);
            size_t nb = pi2_trace_count(c->traces[fi]) < BIT_SAMPLES ? pi2_trace_count(c->traces[fi]) : BIT_SAMPLES;
            size_t W = ((size_t)F + 63) / 64;
            if (rc == 0 && nb > 0) {
                /* with predictors, the sets the runtime will select (what it
                 * reads and caches); else the activations */
                uint64_t *sel = c->preds ? pi2_malloc_array(W, sizeof *sel) : NULL;
                pi2_predictor *pr = NULL;
                if (c->preds && !sel)
                    rc = pi2_err_set(err, PI2_ENOMEM, "out of memory for the profile");
                if (rc == 0 && c->preds)
                    rc = conv_pred_expand(c, fi, &pr, err);
                snprintf(p.bits, sizeof p.bits, "profile/%d.%d.bits", l, e);
                if (rc == 0)
                    rc = pi2_ctr_writer_begin(c->w, p.bits, nb * W * 8, err);
                for (size_t i = 0; rc == 0 && i < nb; i++) {
                    const uint64_t *row = pi2_trace_bits(c->traces[fi], i);
                    if (sel) {
                        if (pi2_pred_predict(pr, pi2_trace_x(c->traces[fi], i), sel) < 0) {
                            rc = pi2_err_set(err, PI2_ENOMEM, "out of memory for the profile");
                            break;
                        }
                        row = sel;
                    }
                    rc = pi2_ctr_writer_data(c->w, row, W * 8, err);
                }
                free(sel);
                pi2_pred_free(pr);
                if (rc == 0)
                    rc = pi2_ctr_writer_end(c->w, err);
                p.bit_samples = nb;
                p.bits_selected = c->preds != NULL;
            }
            if (rc == 0)
                rc = pi2_manifest_add_profile(c->mf, &p, err);
        }
    }
    free(freq);
    return rc;
}

/* Rows [rows, n] of f16 values m (the first `cols` of each row stored, the
 * rest zero) as qt rows into member `name` and their scales into `sname`,
 * quantized exactly as the engine quantizes f16 predictors at open. */
static int write_q_rows(pi2_conv *c, pi2_qtype qt, const uint16_t *m, int64_t rows, int64_t cols, int64_t n,
                        const char *name, const char *sname, pi2_err *err)
{
    size_t pb = pi2_q_payload_row_bytes(qt, n), sc = pi2_q_scale_row_count(qt, n);
    uint8_t *q = pi2_malloc_array((size_t)rows, pb);
    uint16_t *sv = pi2_malloc_array((size_t)rows * sc, sizeof *sv);
    float *row = calloc((size_t)n, sizeof *row);
    int rc = 0;
    if (!q || !sv || !row)
        rc = pi2_err_set(err, PI2_ENOMEM, "out of memory quantizing a predictor");
    for (int64_t r = 0; r < rows && rc == 0; r++) {
        for (int64_t k = 0; k < cols; k++)
            row[k] = pi2_f16_to_f32(m[r * cols + k]);
        if (pi2_q_quantize_row(qt, row, n, sv + r * (int64_t)sc, q + r * (int64_t)pb))
            rc = pi2_err_set(err, PI2_ERANGE, "%s: a value cannot be quantized", name);
    }
    if (rc == 0)
        rc = pi2_ctr_writer_add(c->w, name, q, (size_t)rows * pb, err);
    if (rc == 0)
        rc = pi2_ctr_writer_add(c->w, sname, sv, (size_t)rows * sc * sizeof *sv, err);
    free(q);
    free(sv);
    free(row);
    return rc;
}

/* Predictor p of layer l, expert e as q8/q4 members (c->o->q_pred) in the
 * layout decode evaluates: fc2's rows padded to rank_p. */
static int write_pred_quant(pi2_conv *c, const conv_pred *p, pi2_mf_predictor *mp, int l, int e, pi2_err *err)
{
    pi2_qtype qt = c->o->q_pred;
    int64_t D = c->desc->hidden, R = p->rank, Rp = (R + PI2_Q_GROUP - 1) / PI2_Q_GROUP * PI2_Q_GROUP;
    mp->dtype = qt == PI2_QT_Q4 ? PI2_MF_PRED_Q4 : PI2_MF_PRED_Q8;
    snprintf(mp->fc1_scales, sizeof mp->fc1_scales, "p/%d.%d.fc1.s", l, e);
    snprintf(mp->fc2_scales, sizeof mp->fc2_scales, "p/%d.%d.fc2.s", l, e);
    int rc = write_q_rows(c, qt, p->fc1, R, D, D, mp->fc1, mp->fc1_scales, err);
    return rc ? rc : write_q_rows(c, qt, p->fc2, c->desc->n_ff, R, Rp, mp->fc2, mp->fc2_scales, err);
}

/* Predictor members and sparsity entries. */
static int write_sparsity(pi2_conv *c, pi2_err *err)
{
    const pi2_model_desc *d = c->desc;
    int E = d->n_experts > 0 ? d->n_experts : 1;
    pi2_manifest *mf = c->mf;
    mf->sparsity_mode = c->preds ? PI2_MF_SPARSE_PREDICTOR : c->silu ? PI2_MF_SPARSE_THRESHOLD : PI2_MF_SPARSE_NONE;
    if (c->silu) /* the labels the predictors learned, or the mode itself */
        mf->threshold_sparsity = c->o->silu_sparsity;
    mf->recall_target = c->preds ? c->o->recall : NAN;
    if (mf->sparsity_mode == PI2_MF_SPARSE_NONE)
        return 0;
    int rc = 0;
    for (int l = 0; rc == 0 && l < d->n_layers; l++)
        for (int e = 0; rc == 0 && e < E; e++) {
            size_t fi = ffn_index(d, l, e);
            pi2_mf_layer ml = {0};
            ml.layer = l;
            ml.expert = d->n_experts > 0 ? e : -1;
            if (c->silu) {
                ml.has_silu_threshold = true;
                ml.silu_threshold = c->silu_thr[fi];
            }
            if (c->preds) {
                const conv_pred *p = &c->preds[fi];
                int r = p->rank;
                ml.has_predictor = true;
                ml.predictor.rank = r;
                ml.predictor.threshold = p->threshold;
                ml.predictor.imported = c->psrc.kind != NULL;
                ml.predictor.input = c->pred_input;
                ml.predictor.dtype = PI2_MF_PRED_F16;
                ml.predictor.report = c->reports[fi];
                snprintf(ml.predictor.fc1, sizeof ml.predictor.fc1, "p/%d.%d.fc1", l, e);
                snprintf(ml.predictor.fc2, sizeof ml.predictor.fc2, "p/%d.%d.fc2", l, e);
                if (c->o->q_pred != PI2_QT_F32)
                    rc = write_pred_quant(c, p, &ml.predictor, l, e, err);
                else
                    rc = pi2_ctr_writer_add(c->w, ml.predictor.fc1, p->fc1, (size_t)r * d->hidden * sizeof *p->fc1,
                                            err);
                if (rc == 0 && c->o->q_pred == PI2_QT_F32)
                    rc = pi2_ctr_writer_add(c->w, ml.predictor.fc2, p->fc2, (size_t)d->n_ff * r * sizeof *p->fc2,
                                            err);
            }
            if (rc == 0)
                rc = pi2_manifest_add_layer(mf, &ml, err);
        }
    return rc;
}

int conv_calib_run(pi2_conv *c, pi2_err *err)
{
    const pi2_model_desc *d = c->desc;
    const pi2_convert_opts *o = c->o;
    int tokens, len, batch;
    calib_shape(c, &tokens, &len, &batch);
    int n_train = (tokens + len - 1) / len;
    if (n_train < 2)
        n_train = 2;
    int n_held = n_train / 8 > 0 ? n_train / 8 : 1;
    c->silu = d->act == PI2_ACT_SILU;
    conv_stage(c, "calibration run: %d sequences of %d tokens (%s)", n_train + n_held, len,
               o->calib_path ? o->calib_path : "text the model generates");
    double t0 = pi2_now();
    int rc = traces_alloc(c, err);
    if (rc == 0)
        rc = conv_imp_alloc(c, err);
    if (rc)
        return rc;
    if (o->calib_path) {
        if ((rc = calib_from_text(c, len, n_train + n_held, err)) != 0)
            return rc;
        c->n_held = c->n_seq / 9 > 0 ? c->n_seq / 9 : 1;
        if ((rc = collect_traces(c, len, err)) != 0)
            return rc;
    } else if ((rc = calib_generate(c, len, n_train + n_held, n_held, batch, err)) != 0) {
        return rc;
    }
    conv_report(c, "calibration: %d sequences x %d tokens (%s), %d held out for quality\n",
                c->n_seq - c->n_held, len, o->calib_path ? o->calib_path : "self-generated", c->n_held);
    double t1 = pi2_now();
    conv_report(c, "calibration run: %.1f s\n", t1 - t0);
    return 0;
}

int conv_calibrate(pi2_conv *c, pi2_err *err)
{
    const pi2_model_desc *d = c->desc;
    const pi2_convert_opts *o = c->o;
    int tokens, len, batch, rc;
    calib_shape(c, &tokens, &len, &batch);
    if ((rc = predictors(c, err)) != 0)
        return rc;
    if (!c->preds)
        conv_report(c, "predictors: none in the checkpoint or beside it, none named, none to train%s\n",
                c->silu ? "; sparsity by the calibrated threshold" : "; the runtime will run dense");
    if ((rc = write_sparsity(c, err)) != 0 || (rc = write_profile(c, err)) != 0)
        return rc;
    if (c->silu) {
        conv_report(c, "SiLU sparsity: per-layer |act| thresholds dropping %.0f%% of activations:",
                    100 * o->silu_sparsity);
        for (size_t i = 0; i < nffn(d) && i < 8; i++)
            conv_report(c, " %.4g", c->silu_thr[i]);
        conv_report(c, "%s\n", nffn(d) > 8 ? " ..." : "");
    }
    c->mf->profile_tokens = c->tokens[0]; /* dense: layer 0's tokens; MoE: its routing choices / top-k */
    if (d->n_experts > 0) {
        uint64_t routed = 0;
        for (int e = 0; e < d->n_experts; e++)
            routed += c->tokens[ffn_index(d, 0, e)];
        c->mf->profile_tokens = routed / (uint64_t)d->n_experts_used;
    }
    if (o->per_layer) {
        conv_report(c, "activation profile (per layer%s):\n", d->n_experts > 0 ? " and expert" : "");
        for (size_t i = 0; i < c->mf->n_profile; i++) {
            const pi2_mf_profile *p = &c->mf->profile[i];
            conv_report(c, "  layer %2d", p->layer);
            if (p->expert >= 0)
                conv_report(c, " expert %d", p->expert);
            conv_report(c, ": active %.3f  hot share (fire > 50%%) %.3f  top-10%% neurons carry %.2f of activations",
                    p->active_frac, p->hot_share, p->top10_share);
            if (p->expert >= 0 && !isnan(p->route_share))
                conv_report(c, "  routed %.3f", p->route_share);
            conv_report(c, "\n");
        }
    }
    conv_stage(c, "measuring quality (fp32, quantized dense%s)", c->preds || c->silu ? ", quantized sparse" : "");
    return quality(c, len, err);
}

void conv_calib_free(pi2_conv *c)
{
    size_t nf = c->desc ? nffn(c->desc) : 0;
    for (size_t i = 0; c->traces && i < nf; i++)
        pi2_trace_free(c->traces[i]);
    for (size_t i = 0; c->preds && i < nf; i++) {
        free(c->preds[i].fc1);
        free(c->preds[i].fc2);
    }
    free(c->calib_ids);
    free(c->traces);
    free(c->preds);
    free(c->reports);
    free(c->counts);
    free(c->tokens);
    free(c->silu_thr);
    free(c->silu_set);
    free(c->calib);
    conv_imp_free(c);
}
