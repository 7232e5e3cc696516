/* pi2 neuron order: hot to cold by activation frequency, cold neurons
 * grouped by co-activation, so that one read of a group (bundle/layout.h)
 * fetches neurons that are needed together.
 *
 * Input is one FFN's activation profile as pi2-convert stores it
 * (convert/convert.h): freq, float32 [n] per-neuron activation frequency,
 * and optionally bits, the activation bits of sampled tokens, row-major
 * [samples][ceil(n / 64)] uint64 LE (bit j % 64 of word j / 64 of a row:
 * neuron j fired on that token).
 *
 * The order (pi2_order_neurons):
 *   1. all neurons by frequency, descending (ties: lower index first;
 *      non-finite or negative frequencies count as 0, above 1 as 1);
 *   2. the first `hot` of them are the hot prefix, in that order;
 *   3. the rest are cut into groups of g. With activation bits (and g > 1),
 *      groups are grown greedily: the most frequent unassigned neuron seeds
 *      a group, then g - 1 times the unassigned neuron whose activation set
 *      A (over the samples) is most similar to the union U of the group's
 *      sets so far joins it, by Jaccard similarity |A & U| / |A | U| (ties:
 *      the more frequent), so a group gains neurons that fire when it
 *      already fires and few that would make it fire more often (the read
 *      efficiency below gains over plain frequency order: runtime/PERF.md,
 *      "Bundler"). Candidates are the
 *      next `window` unassigned neurons in frequency order, the window sized
 *      so that a layer costs about PI2_ORDER_BUDGET word operations (near a
 *      full search's read efficiency at a fraction of its time); at most
 *      PI2_ORDER_MAX_SAMPLES samples are used. Members of a group are stored
 *      in frequency order. Without bits, groups are consecutive in
 *      frequency order.
 * The result is deterministic (no randomness, no dependence on threads).
 *
 * Read efficiency (reported in the manifest): over the samples, when every
 * cold group is read whenever one of its neurons fires, the share of the
 * neurons read that actually fired: sum_k sum_{j in k} |A_j| /
 * sum_k |k| * |U_k|. Computed for the chosen groups and for plain frequency
 * order; NaN when there are no bits or no cold activity.
 */
#ifndef PI2_BUNDLE_ORDER_H
#define PI2_BUNDLE_ORDER_H

#include "formats/common.h"

#define PI2_ORDER_MAX_SAMPLES 4096u
#define PI2_ORDER_BUDGET (1ull << 25) /* word operations per FFN for the greedy search */

typedef struct pi2_order_in {
    uint32_t n;           /* neurons (n_ff), >= 1 */
    const float *freq;    /* [n], or NULL: identity order */
    const uint64_t *bits; /* [samples][ceil(n/64)], or NULL */
    uint64_t samples;     /* rows of bits (0 when bits is NULL) */
    uint32_t group;       /* g >= 1 */
    uint32_t hot;         /* hot prefix length, <= n */
} pi2_order_in;

typedef struct pi2_order_stats {
    bool grouped;         /* cold neurons grouped by co-activation */
    double read_eff;      /* NaN if not measurable */
    double read_eff_freq; /* same for groups in plain frequency order */
} pi2_order_stats;

/* Hot prefix length from a frequency profile: the neurons with frequency
 * >= min_freq, or (when min_freq is NaN) ceil(share * n). freq NULL gives 0
 * for the frequency rule. */
uint32_t pi2_order_hot_count(const float *freq, uint32_t n, double min_freq, double share);

/* Fill perm[n] (bundled index -> original index) as described above and
 * *st (may be NULL). PI2_EINVAL for bad arguments, PI2_ENOMEM. */
int pi2_order_neurons(const pi2_order_in *in, uint32_t *perm, pi2_order_stats *st, pi2_err *err);

/* Test hook: run the grouping with generic popcounts even where the CPU has
 * the POPCNT instruction (the two give identical results). Call before any
 * ordering threads start. */
void pi2_order_force_generic(bool on);

#endif
