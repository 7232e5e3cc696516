/* pi2 bundle report as SVG (pi2-bundle inspect --svg FILE).
 *
 * One self-contained SVG 1.1 document (no scripts, no external fonts,
 * images or style sheets; generic "sans-serif" text), 1000 px wide, with a
 * title naming the model (manifest "source") and its quantization, and two
 * panels:
 *
 *   1. activation frequency per FFN: for each (layer[, expert]) with a
 *      profile, one <polyline> of the profile's freq member (already in
 *      bundled, hot-to-cold order) against the neuron's rank as a share of
 *      n_ff (x 0..1, y 0..1), as the mean over at most 400 equal bins (150
 *      past 64 FFNs), coloured by layer on a ramp with a legend; each FFN's
 *      hot share (layout hot_neurons / neurons) is a tick on the top edge,
 *      their mean a dashed vertical line, and a frequency hot rule a dashed
 *      horizontal one. No other element of the document is a <polyline>.
 *   2. the sparsity per-layer entries: predictor recall and precision
 *      (markers) with predicted and true active fractions (bars) per FFN,
 *      and the recall target; without predictors, the sparsity mode and the
 *      per-layer SiLU thresholds (bars), or a note.
 *
 * Every string from the manifest is escaped for XML (& < > " '). Values
 * that are NaN (not measured) or out of [0, 1] are drawn as absent or
 * clamped; the document never contains "nan" or "inf".
 */
#ifndef PI2_BUNDLE_REPORT_SVG_H
#define PI2_BUNDLE_REPORT_SVG_H

#include "bundle/bundle.h"

#include <stdio.h>

/* Write the report of an open bundle to `out`. 0, or PI2_EIO on a write
 * error of the stream. The bundle is only read. */
int pi2_bundle_report_svg(const pi2_bundle *b, FILE *out, pi2_err *err);

/* Render the report and write it to `path` atomically (temporary file in
 * the same directory, fsync, rename): on any failure nothing is left at
 * path. Errors name path: PI2_EIO (cannot create, write or rename),
 * PI2_ENOSPC, PI2_ENOMEM. */
int pi2_bundle_report_svg_write(const pi2_bundle *b, const char *path, pi2_err *err);

#endif
