/* pi2 bundle report as SVG. See bundle/report_svg.h.
 *
 * Plain fprintf into a memory stream, then one atomic write: the document is
 * small (tens of KB for dense models, about 1 MB for 256 experts) and a
 * failure must leave no partial file. Coordinates are printed with one
 * decimal; every number that reaches the text goes through fin() so a NaN
 * from the manifest or a corrupt freq member cannot leak into the output. */
#include "bundle/report_svg.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Page geometry (px). Both panels share the plot's x range. */
#define W 1000
#define PX0 80.0  /* plot left */
#define PX1 730.0 /* plot right */
#define LEG_X 760.0
#define P1_Y0 110.0 /* panel 1 plot top */
#define P1_Y1 410.0 /* panel 1 plot bottom */
#define P2_Y0 520.0
#define P2_Y1 770.0
#define H 840

static double fin(double x) { return isfinite(x) ? x : 0.0; }
static double clamp01(double x) { return !isfinite(x) ? 0.0 : x < 0 ? 0.0 : x > 1 ? 1.0 : x; }

/* Text from the manifest, escaped for XML character data and attributes. */
static void esc(FILE *o, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", o); break;
        case '<': fputs("&lt;", o); break;
        case '>': fputs("&gt;", o); break;
        case '"': fputs("&quot;", o); break;
        case '\'': fputs("&apos;", o); break;
        default:
            if ((unsigned char)*s >= 0x20 || *s == '\t')
                fputc(*s, o); /* the manifest has no control characters; drop any anyway */
        }
    }
}

/* Colour of layer `layer` of n: a viridis-like ramp stopping short of the
 * pale yellow end, which is hard to see on white. */
static void ramp(int layer, int n, char out[8])
{
    static const unsigned char stop[6][3] = { { 68, 1, 84 },    { 65, 68, 135 },  { 42, 120, 142 },
                                              { 34, 168, 132 }, { 122, 209, 81 }, { 189, 223, 38 } };
    double t = n > 1 ? (double)layer / (n - 1) : 0.0;
    t = clamp01(t) * 5;
    int i = (int)t;
    if (i >= 5)
        i = 4;
    double f = t - i;
    int c[3];
    for (int k = 0; k < 3; k++)
        c[k] = (int)lround(stop[i][k] + f * (stop[i + 1][k] - stop[i][k]));
    snprintf(out, 8, "#%02x%02x%02x", c[0] & 255, c[1] & 255, c[2] & 255);
}

static double px1(double x) { return PX0 + clamp01(x) * (PX1 - PX0); }

/* Axes, grid and y ticks of a plot [PX0, PX1] x [y0, y1] for y in [0, ymax]. */
static void y_axis(FILE *o, double y0, double y1, double ymax, int ticks, bool percent, const char *label)
{
    for (int i = 0; i <= ticks; i++) {
        double v = ymax * i / ticks, y = y1 - (y1 - y0) * i / ticks;
        fprintf(o, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>\n", PX0, y, PX1, y);
        fprintf(o, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n", PX0 - 5, y, PX0, y);
        if (percent)
            fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.0f%%</text>\n", PX0 - 8, y + 4, fin(100 * v));
        else
            fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.3g</text>\n", PX0 - 8, y + 4, fin(v));
    }
    fprintf(o, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#333\"/>\n", PX0, y0,
            PX1 - PX0, y1 - y0);
    fprintf(o, "<text transform=\"translate(%.1f %.1f) rotate(-90)\" text-anchor=\"middle\">%s</text>\n", PX0 - 55,
            (y0 + y1) / 2, label);
}

/* ---- panel 1: activation frequency ---- */

static void panel_freq(FILE *o, const pi2_bundle *b)
{
    const pi2_manifest *m = pi2_bundle_manifest(b);
    const pi2_bundle_layout *l = pi2_bundle_layout_get(b);
    const pi2_ctr *c = pi2_bundle_container(b);
    int nl = m->config.n_layers;
    bool moe = pi2_desc_is_moe(&m->config);
    fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" class=\"h\">Activation frequency per FFN, neurons in bundled (hot to cold) "
               "order, %llu profiled tokens</text>\n",
            PX0, P1_Y0 - 30, (unsigned long long)m->profile_tokens);
    y_axis(o, P1_Y0, P1_Y1, 1.0, 5, false, "activation frequency");
    for (int i = 0; i <= 10; i++) {
        double x = px1(i / 10.0);
        fprintf(o, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n", x, P1_Y1, x, P1_Y1 + 5);
        fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%d%%</text>\n", x, P1_Y1 + 19, 10 * i);
    }
    fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">neuron rank as a share of n_ff</text>\n",
            (PX0 + PX1) / 2, P1_Y1 + 38);

    size_t bins_max = l->n_ffn > 64 ? 150 : 400, drawn = 0;
    float *bin = NULL;
    double hot_sum = 0;
    size_t hot_n = 0;
    fputs("<g fill=\"none\" stroke-width=\"1.5\" stroke-linejoin=\"round\">\n", o);
    for (size_t k = 0; k < l->n_ffn; k++) {
        const pi2_bl_ffn *f = &l->ffn[k];
        char col[8];
        ramp(f->layer, nl, col);
        if (f->neurons > 0) {
            double hs = (double)f->hot_neurons / f->neurons;
            hot_sum += hs;
            hot_n++;
            fprintf(o, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\"/>\n", px1(hs), P1_Y0 - 8,
                    px1(hs), P1_Y0, col);
        }
        const pi2_mf_profile *p = pi2_manifest_find_profile(m, f->layer, f->expert);
        const pi2_ctr_member *fm = p ? pi2_ctr_find(c, p->freq) : NULL;
        uint32_t n = f->neurons;
        if (!fm || n == 0 || fm->size != (uint64_t)n * 4)
            continue; /* no profile for this FFN (identity order) */
        size_t nb = n < bins_max ? n : bins_max;
        if (!bin && !(bin = malloc(bins_max * sizeof *bin)))
            break;
        fprintf(o, "<polyline stroke=\"%s\" points=\"", col);
        for (size_t j = 0; j < nb; j++) {
            size_t a = j * n / nb, e = (j + 1) * n / nb;
            double s = 0;
            for (size_t i = a; i < e; i++) {
                float v;
                memcpy(&v, fm->data + 4 * i, 4);
                s += clamp01(v);
            }
            double x = (a + e) / 2.0 / n, y = s / (double)(e - a);
            fprintf(o, "%s%.1f,%.1f", j ? " " : "", px1(x), P1_Y1 - clamp01(y) * (P1_Y1 - P1_Y0));
        }
        fputs("\"><title>layer ", o);
        fprintf(o, "%d", f->layer);
        if (moe)
            fprintf(o, " expert %d", f->expert);
        fprintf(o, ": hot %u of %u neurons</title></polyline>\n", f->hot_neurons, f->neurons);
        drawn++;
    }
    fputs("</g>\n", o);
    free(bin);
    if (hot_n) {
        double hs = hot_sum / hot_n, x = px1(hs);
        fprintf(o, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#c0392b\" stroke-dasharray=\"6 4\"/>\n",
                x, P1_Y0, x, P1_Y1);
        fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#c0392b\">hot share %.1f%% (mean; ticks: per FFN)</text>\n",
                x + 5, P1_Y0 + 16, fin(100 * hs));
    }
    if (!isnan(l->hot_min_freq)) {
        double y = P1_Y1 - clamp01(l->hot_min_freq) * (P1_Y1 - P1_Y0);
        fprintf(o, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#777\" stroke-dasharray=\"2 3\"/>\n",
                PX0, y, PX1, y);
        fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" fill=\"#555\">hot rule: frequency &gt;= %.3g</text>\n",
                PX1 - 5, y - 5, fin(l->hot_min_freq));
    }
    if (!drawn)
        fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" class=\"note\">no activation profile in this "
                   "bundle</text>\n",
                (PX0 + PX1) / 2, (P1_Y0 + P1_Y1) / 2);

    /* legend: one swatch per layer when few, else the ramp with its ends */
    fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" class=\"b\">layer%s</text>\n", LEG_X, P1_Y0 - 8,
            moe ? " (all its experts)" : "");
    if (nl <= 16) {
        for (int i = 0; i < nl; i++) {
            char col[8];
            ramp(i, nl, col);
            double y = P1_Y0 + 4 + 18 * i;
            fprintf(o, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"3\"/>\n", LEG_X,
                    y + 6, LEG_X + 22, y + 6, col);
            fprintf(o, "<text x=\"%.1f\" y=\"%.1f\">layer %d</text>\n", LEG_X + 28, y + 10, i);
        }
    } else {
        fputs("<defs><linearGradient id=\"ramp\" x1=\"0\" y1=\"0\" x2=\"0\" y2=\"1\">", o);
        for (int i = 0; i <= 5; i++) {
            char col[8];
            ramp(i, 6, col);
            fprintf(o, "<stop offset=\"%.2f\" stop-color=\"%s\"/>", i / 5.0, col);
        }
        fputs("</linearGradient></defs>\n", o);
        fprintf(o, "<rect x=\"%.1f\" y=\"%.1f\" width=\"16\" height=\"200\" fill=\"url(#ramp)\"/>\n", LEG_X, P1_Y0 + 4);
        fprintf(o, "<text x=\"%.1f\" y=\"%.1f\">layer 0</text>\n", LEG_X + 24, P1_Y0 + 16);
        fprintf(o, "<text x=\"%.1f\" y=\"%.1f\">layer %d</text>\n", LEG_X + 24, P1_Y0 + 204, nl - 1);
    }
}

/* ---- panel 2: predictors or thresholds ---- */

/* x label of a sparsity entry */
static void entry_label(FILE *o, const pi2_mf_layer *e, bool moe)
{
    if (moe)
        fprintf(o, "%d.%d", e->layer, e->expert);
    else
        fprintf(o, "%d", e->layer);
}

/* Category axis for n entries; returns the slot width. */
static double x_categories(FILE *o, const pi2_manifest *m, bool moe, double y1)
{
    size_t n = m->n_layers;
    double w = (PX1 - PX0) / (double)(n ? n : 1);
    size_t every = n <= 40 ? 1 : (n + 19) / 20;
    for (size_t i = 0; i < n; i += every) {
        double x = PX0 + w * (i + 0.5);
        fprintf(o, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n", x, y1, x, y1 + 5);
        fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", x, y1 + 19);
        entry_label(o, &m->layers[i], moe);
        fputs("</text>\n", o);
    }
    fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", (PX0 + PX1) / 2, y1 + 38,
            moe ? "layer.expert" : "layer");
    return w;
}

/* Legend row `row` of panel 2: a marker of `kind` and its label. */
enum { MK_RECALL, MK_PRECISION, MK_PRED, MK_TRUE, MK_TARGET };
static void legend_item(FILE *o, int row, int kind, const char *label)
{
    double x = LEG_X + 8, y = P2_Y0 + 10 + 20 * row;
    switch (kind) {
    case MK_RECALL: fprintf(o, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4.5\" fill=\"#c0392b\"/>", x, y); break;
    case MK_PRECISION:
        fprintf(o, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"#fff\" stroke=\"#e67e22\" stroke-width=\"2\"/>", x, y);
        break;
    case MK_PRED:
    case MK_TRUE:
        fprintf(o, "<rect x=\"%.1f\" y=\"%.1f\" width=\"10\" height=\"10\" fill=\"%s\"/>", x - 5, y - 5,
                kind == MK_PRED ? "#5b8def" : "#9a9a9a");
        break;
    default:
        fprintf(o, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#c0392b\" stroke-dasharray=\"6 4\"/>",
                x - 8, y, x + 8, y);
    }
    fprintf(o, "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", LEG_X + 24, y + 4, label);
}

static void panel_sparsity(FILE *o, const pi2_manifest *m)
{
    bool moe = pi2_desc_is_moe(&m->config);
    size_t np = 0, nt = 0;
    for (size_t i = 0; i < m->n_layers; i++) {
        np += m->layers[i].has_predictor;
        nt += m->layers[i].has_silu_threshold;
    }
    double y0 = P2_Y0, y1 = P2_Y1;
    if (np) {
        fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" class=\"h\">Activation predictors per FFN: recall and precision, "
                   "predicted vs true active fraction</text>\n",
                PX0, y0 - 30);
        y_axis(o, y0, y1, 1.0, 5, true, "share");
        double w = x_categories(o, m, moe, y1);
        double bw = w * 0.3 < 14 ? w * 0.3 : 14;
        for (size_t i = 0; i < m->n_layers; i++) {
            const pi2_mf_layer *e = &m->layers[i];
            if (!e->has_predictor)
                continue;
            const pi2_pred_report *r = &e->predictor.report;
            double cx = PX0 + w * (i + 0.5);
            fputs("<g>", o);
            fputs("<title>", o);
            entry_label(o, e, moe);
            fprintf(o, ": recall %.3f, precision %.3f, predicted active %.1f%%, true active %.1f%%, rank %d</title>",
                    fin(r->recall), fin(r->precision), fin(100 * r->pred_active_frac), fin(100 * r->true_active_frac),
                    e->predictor.rank);
            if (!isnan(r->pred_active_frac)) {
                double h = clamp01(r->pred_active_frac) * (y1 - y0);
                fprintf(o, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#5b8def\"/>", cx - bw,
                        y1 - h, bw, h);
            }
            if (!isnan(r->true_active_frac)) {
                double h = clamp01(r->true_active_frac) * (y1 - y0);
                fprintf(o, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#9a9a9a\"/>", cx, y1 - h, bw,
                        h);
            }
            if (!isnan(r->recall))
                fprintf(o, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4.5\" fill=\"#c0392b\"/>", cx,
                        y1 - clamp01(r->recall) * (y1 - y0));
            if (!isnan(r->precision))
                fprintf(o, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"#fff\" stroke=\"#e67e22\" stroke-width=\"2\"/>",
                        cx, y1 - clamp01(r->precision) * (y1 - y0));
            fputs("</g>\n", o);
        }
        if (!isnan(m->recall_target)) {
            double y = y1 - clamp01(m->recall_target) * (y1 - y0);
            fprintf(o, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#c0392b\" "
                       "stroke-dasharray=\"6 4\"/>\n",
                    PX0, y, PX1, y);
        }
        legend_item(o, 0, MK_RECALL, "recall");
        legend_item(o, 1, MK_PRECISION, "precision");
        legend_item(o, 2, MK_PRED, "predicted active");
        legend_item(o, 3, MK_TRUE, "true active");
        if (!isnan(m->recall_target)) {
            char t[64];
            snprintf(t, sizeof t, "recall target %.3g", fin(m->recall_target));
            legend_item(o, 4, MK_TARGET, t);
        }
        return;
    }
    if (nt) {
        double mx = 0;
        for (size_t i = 0; i < m->n_layers; i++)
            if (m->layers[i].has_silu_threshold && isfinite(m->layers[i].silu_threshold))
                mx = fmax(mx, m->layers[i].silu_threshold);
        /* a round axis top: 1, 2 or 5 times a power of ten */
        double top = 1;
        if (mx > 0) {
            double p = pow(10, floor(log10(mx)));
            top = mx <= p ? p : mx <= 2 * p ? 2 * p : mx <= 5 * p ? 5 * p : 10 * p;
        }
        fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" class=\"h\">No predictors: sparsity mode %s, SiLU threshold per FFN",
                PX0, y0 - 30, pi2_manifest_mode_name(m->sparsity_mode));
        if (!isnan(m->threshold_sparsity))
            fprintf(o, " (target sparsity %.1f%%)", fin(100 * m->threshold_sparsity));
        fputs("</text>\n", o);
        y_axis(o, y0, y1, top, 5, false, "SiLU threshold");
        double w = x_categories(o, m, moe, y1);
        double bw = w * 0.6 < 24 ? w * 0.6 : 24;
        for (size_t i = 0; i < m->n_layers; i++) {
            const pi2_mf_layer *e = &m->layers[i];
            if (!e->has_silu_threshold)
                continue;
            double v = fin(e->silu_threshold), h = (v < 0 ? 0 : v > top ? top : v) / top * (y1 - y0);
            fprintf(o, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#5b8def\"><title>",
                    PX0 + w * (i + 0.5) - bw / 2, y1 - h, bw, h);
            entry_label(o, e, moe);
            fprintf(o, ": threshold %.4g</title></rect>\n", v);
        }
        return;
    }
    fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" class=\"h\">Sparsity</text>\n", PX0, y0 - 30);
    fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" class=\"note\">no predictors and no thresholds (sparsity mode %s)</text>\n",
            PX0, y0 + 20, pi2_manifest_mode_name(m->sparsity_mode));
}

int pi2_bundle_report_svg(const pi2_bundle *b, FILE *o, pi2_err *err)
{
    const pi2_manifest *m = pi2_bundle_manifest(b);
    const pi2_model_desc *d = &m->config;
    fprintf(o, "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%d\" height=\"%d\" "
               "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n",
            W, H, W, H);
    fputs("<title>pi2 bundle report: ", o);
    esc(o, m->source);
    fputs("</title>\n", o);
    fputs("<style>.h{font-size:14px;font-weight:bold}.b{font-weight:bold}.note{fill:#777;font-style:italic}</style>\n", o);
    fprintf(o, "<rect width=\"%d\" height=\"%d\" fill=\"#fff\"/>\n", W, H);
    fputs("<text x=\"20\" y=\"30\" font-size=\"18\" font-weight=\"bold\">", o);
    esc(o, m->source);
    fprintf(o, " \xe2\x80\x94 ffn %s, other %s</text>\n", pi2_q_type_name(m->quant_ffn), pi2_q_type_name(m->quant_other));
    fprintf(o, "<text x=\"20\" y=\"52\" fill=\"#444\">%s (%s), hidden %d, n_ff %d, %d layers", pi2_arch_name(d->arch),
            pi2_act_name(d->act), d->hidden, d->n_ff, d->n_layers);
    if (pi2_desc_is_moe(d))
        fprintf(o, ", %d experts (top %d)", d->n_experts, d->n_experts_used);
    fprintf(o, "; sparsity %s; bundled by ", pi2_manifest_mode_name(m->sparsity_mode));
    esc(o, m->created_by);
    fputs("</text>\n", o);
    panel_freq(o, b);
    panel_sparsity(o, m);
    fputs("</svg>\n", o);
    return ferror(o) ? pi2_err_set(err, PI2_EIO, "svg report: write error") : 0;
}

int pi2_bundle_report_svg_write(const pi2_bundle *b, const char *path, pi2_err *err)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *o = open_memstream(&buf, &len);
    if (!o)
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory", path);
    pi2_err ignored = { 0 };
    int rc = pi2_bundle_report_svg(b, o, &ignored);
    int cf = fclose(o);
    if (rc || cf) { /* a memory stream only fails for lack of memory */
        free(buf);
        return pi2_err_set(err, PI2_ENOMEM, "%s: out of memory rendering the report", path);
    }
    pi2_afile *f = NULL;
    if (rc == 0)
        rc = pi2_afile_open(&f, path, err);
    if (rc == 0)
        rc = pi2_afile_write(f, buf, len, err);
    if (rc == 0) {
        rc = pi2_afile_commit(f, err); /* frees f, removes the temporary file on failure */
        f = NULL;
    }
    pi2_afile_abort(f);
    free(buf);
    return rc;
}
