/* pi2 neuron order: see bundle/order.h. */
#include "bundle/order.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float clamp_freq(float f)
{
    if (!(f > 0)) /* NaN, negative, zero */
        return 0;
    return f > 1 ? 1 : f;
}

uint32_t pi2_order_hot_count(const float *freq, uint32_t n, double min_freq, double share)
{
    if (!isnan(min_freq)) {
        uint32_t h = 0;
        for (uint32_t i = 0; freq && i < n; i++)
            h += clamp_freq(freq[i]) >= min_freq;
        return h;
    }
    if (!(share > 0))
        return 0;
    double h = ceil(share * n - 1e-9);
    return h >= n ? n : (uint32_t)h;
}

typedef struct fkey {
    float f;
    uint32_t i;
} fkey;

static int cmp_fkey(const void *a, const void *b)
{
    const fkey *x = a, *y = b;
    if (x->f != y->f)
        return x->f > y->f ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static inline __attribute__((always_inline)) uint64_t popcount_w(const uint64_t *a, size_t W)
{
    uint64_t s = 0;
    for (size_t w = 0; w < W; w++)
        s += (uint64_t)__builtin_popcountll(a[w]);
    return s;
}

static inline __attribute__((always_inline)) uint64_t popcount_and(const uint64_t *a, const uint64_t *b, size_t W)
{
    uint64_t s = 0;
    for (size_t w = 0; w < W; w++)
        s += (uint64_t)__builtin_popcountll(a[w] & b[w]);
    return s;
}

/* Efficiency of reading `list` (positions into the cold bitsets) in
 * consecutive groups of g: useful neuron reads / all neuron reads. */
static double efficiency(const uint32_t *list, uint32_t m, uint32_t g, const uint64_t *nb, const uint64_t *pc,
                         size_t W, uint64_t *acc)
{
    double useful = 0, total = 0;
    for (uint32_t k = 0; k < m; k += g) {
        uint32_t sz = m - k < g ? m - k : g;
        memset(acc, 0, W * sizeof *acc);
        for (uint32_t j = 0; j < sz; j++) {
            const uint64_t *b = nb + (size_t)list[k + j] * W;
            for (size_t w = 0; w < W; w++)
                acc[w] |= b[w];
            useful += (double)pc[list[k + j]];
        }
        total += (double)sz * (double)popcount_w(acc, W);
    }
    return total > 0 ? useful / total : NAN;
}

/* The greedy grouping (see order.h): groups of positions into a->list. */
typedef struct greedy_args {
    uint32_t m, g;
    size_t W;
    const uint64_t *nb, *pc;
    uint64_t *acc;
    uint32_t *next, *prev, *list, *grp;
} greedy_args;

/* Greedy groups over a doubly linked list of unassigned positions; m is the
 * end marker. Inlined into a POPCNT build and a generic one (the popcounts
 * are the whole cost; without the instruction they are a libgcc call). */
static inline __attribute__((always_inline)) void greedy_body(const greedy_args *a)
{
    uint32_t m = a->m, g = a->g, *next = a->next, *prev = a->prev, *list = a->list, *grp = a->grp;
    size_t W = a->W;
    const uint64_t *nb = a->nb, *pc = a->pc;
    uint64_t *acc = a->acc;
    uint64_t window = PI2_ORDER_BUDGET / ((uint64_t)m * W + 1);
    if (window < 64)
        window = 64;
    for (uint32_t c = 0; c < m; c++) {
        next[c] = c + 1;
        prev[c + 1] = c;
    }
    prev[0] = m;
    next[m] = 0; /* next[m] is the head */
    uint32_t out_n = 0;
#define UNLINK(c) (next[prev[c]] = next[c], prev[next[c]] = prev[c])
    while (next[m] != m) {
        uint32_t seed = next[m], sz = 1;
        UNLINK(seed);
        grp[0] = seed;
        memcpy(acc, nb + (size_t)seed * W, W * sizeof *acc);
        for (; sz < g && next[m] != m; sz++) {
            /* best Jaccard similarity |A & U| / |A | U|, compared exactly as
             * fractions; an empty union counts as 0 / 1 */
            uint32_t best = m;
            uint64_t best_in = 0, best_uni = 1, u = popcount_w(acc, W), seen = 0;
            for (uint32_t c = next[m]; c != m && seen < window; c = next[c], seen++) {
                uint64_t both = popcount_and(acc, nb + (size_t)c * W, W), uni = pc[c] + u - both;
                if (uni == 0)
                    uni = 1;
                if (best == m || both * best_uni > best_in * uni) {
                    best = c;
                    best_in = both;
                    best_uni = uni;
                }
            }
            UNLINK(best);
            grp[sz] = best;
            const uint64_t *b = nb + (size_t)best * W;
            for (size_t w = 0; w < W; w++)
                acc[w] |= b[w];
        }
        qsort(grp, sz, sizeof *grp, cmp_u32);
        memcpy(list + out_n, grp, sz * sizeof *grp);
        out_n += sz;
    }
#undef UNLINK
}

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("popcnt"))) static void greedy_popcnt(const greedy_args *a) { greedy_body(a); }
#endif
static void greedy_generic(const greedy_args *a) { greedy_body(a); }

static bool force_generic;

void pi2_order_force_generic(bool on) { force_generic = on; }

static void greedy_fn(const greedy_args *a)
{
#if defined(__x86_64__) || defined(__i386__)
    if (!force_generic && __builtin_cpu_supports("popcnt")) {
        greedy_popcnt(a);
        return;
    }
#endif
    greedy_generic(a);
}

int pi2_order_neurons(const pi2_order_in *in, uint32_t *perm, pi2_order_stats *st, pi2_err *err)
{
    if (st) {
        st->grouped = false;
        st->read_eff = st->read_eff_freq = NAN;
    }
    if (!in || !perm || in->n < 1 || in->group < 1 || in->hot > in->n || (in->samples && !in->bits))
        return pi2_err_set(err, PI2_EINVAL, "neuron order: bad arguments");
    uint32_t n = in->n, g = in->group;
    if (!in->freq) {
        for (uint32_t i = 0; i < n; i++)
            perm[i] = i;
        return 0;
    }
    fkey *keys = pi2_malloc_array(n, sizeof *keys);
    if (!keys)
        return pi2_err_set(err, PI2_ENOMEM, "neuron order: out of memory");
    for (uint32_t i = 0; i < n; i++)
        keys[i] = (fkey){ clamp_freq(in->freq[i]), i };
    qsort(keys, n, sizeof *keys, cmp_fkey);
    for (uint32_t i = 0; i < n; i++)
        perm[i] = keys[i].i;
    free(keys);

    uint32_t hot = in->hot, m = n - hot;
    uint32_t *cold = perm + hot; /* cold neurons in frequency order */
    uint64_t S = in->samples < PI2_ORDER_MAX_SAMPLES ? in->samples : PI2_ORDER_MAX_SAMPLES;
    if (m == 0 || S == 0)
        return 0;

    /* neuron-major bitsets of the cold neurons over the samples */
    size_t W = (size_t)((S + 63) / 64), words = ((size_t)n + 63) / 64, nbw;
    int rc = 0;
    uint64_t *nb = NULL, *pc = NULL, *acc = NULL;
    uint32_t *pos = NULL, *next = NULL, *prev = NULL, *list = NULL, *grp = NULL;
    if (!pi2_mul_size(W, m, &nbw) || !(nb = pi2_calloc_array(nbw, sizeof *nb)) ||
        !(pc = pi2_malloc_array(m, sizeof *pc)) || !(acc = pi2_malloc_array(W, sizeof *acc)) ||
        !(pos = pi2_malloc_array(n, sizeof *pos)) || !(next = pi2_malloc_array((size_t)m + 1, sizeof *next)) ||
        !(prev = pi2_malloc_array((size_t)m + 1, sizeof *prev)) || !(list = pi2_malloc_array(m, sizeof *list)) ||
        !(grp = pi2_malloc_array(g, sizeof *grp))) {
        rc = pi2_err_set(err, PI2_ENOMEM, "neuron order: out of memory");
        goto out;
    }
    for (uint32_t i = 0; i < n; i++)
        pos[i] = UINT32_MAX;
    for (uint32_t c = 0; c < m; c++)
        pos[cold[c]] = c;
    for (uint64_t s = 0; s < S; s++) {
        const uint64_t *row = in->bits + s * words;
        for (size_t w = 0; w < words; w++) {
            uint64_t x = row[w];
            while (x) {
                size_t j = w * 64 + (size_t)__builtin_ctzll(x);
                x &= x - 1;
                if (j < n && pos[j] != UINT32_MAX)
                    nb[(size_t)pos[j] * W + s / 64] |= 1ull << (s % 64);
            }
        }
    }
    for (uint32_t c = 0; c < m; c++) {
        pc[c] = popcount_w(nb + (size_t)c * W, W);
        list[c] = c;
    }
    double eff_freq = efficiency(list, m, g, nb, pc, W, acc);
    if (g == 1) {
        if (st)
            st->read_eff = st->read_eff_freq = eff_freq;
        goto out;
    }

    greedy_fn(&(greedy_args){ m, g, W, nb, pc, acc, next, prev, list, grp });
    if (st) {
        st->grouped = true;
        st->read_eff = efficiency(list, m, g, nb, pc, W, acc);
        st->read_eff_freq = eff_freq;
    }
    /* positions -> neurons (cold[] is read through list before overwrite) */
    for (uint32_t c = 0; c < m; c++)
        list[c] = cold[list[c]];
    memcpy(cold, list, (size_t)m * sizeof *list);
out:
    free(nb);
    free(pc);
    free(acc);
    free(pos);
    free(next);
    free(prev);
    free(list);
    free(grp);
    return rc;
}
