/* pi2 execution planner: the solver and the fixed split (planner.h). */
#include "runtime/plan_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PLAN_LEVELS 48     /* per-FFN choices of hot groups (and of gate groups) */
static const int DEPTHS[] = {16, 32, 64, 128};

/* ---- solver ---- */

int pi2_plan_fixed(const pi2_mprof *mp, const pi2_plan_mem *mem, uint64_t mem_limit, int threads, int io_depth,
                   double hot_share, bool gate_first, pi2_plan *out, pi2_err *err)
{
    int rc = pi2_plan_alloc(out, mp->n_ffn, err);
    if (rc)
        return rc;
    out->mem_limit = mem_limit;
    out->threads = threads;
    out->io_depth = io_depth;
    out->gate_first = gate_first && mp->two_phase;
    out->fixed_split = true;
    uint64_t fixed = mem->fixed + mem->per_depth * (uint64_t)io_depth, mc = plan_min_cache(mp, mem);
    if (mem_limit < fixed + mc) {
        pi2_plan_free(out);
        return pi2_err_set(err, PI2_ENOMEM, "plan: a memory limit of %.0f MB cannot hold the resident part (%.0f MB)",
                           mem_limit / 1e6, (fixed + mc) / 1e6);
    }
    uint64_t budget = mem_limit - fixed, hot_budget;
    bool all = budget >= mp->ffn_total + mc;
    if (all) {
        hot_budget = mp->ffn_total;
    } else {
        double share = hot_share >= 0 && hot_share <= 1 ? hot_share : 0.5;
        hot_budget = (uint64_t)((double)(budget - mc) * share);
    }
    uint64_t per = hot_budget / mp->n_ffn;
    for (uint32_t i = 0; i < mp->n_ffn; i++) {
        uint64_t H = all ? mp->ffn[i].groups : per / mp->S;
        if (H > mp->ffn[i].groups)
            H = mp->ffn[i].groups;
        out->hot_groups[i] = out->gate_groups[i] = (uint32_t)H;
    }
    return 0;
}

/* One FFN's options at a configuration: for each memory unit count u the
 * cheapest (h, g) within u units (prefix minimum). */
typedef struct item_opts {
    uint32_t m;     /* units of the largest option */
    double *cost;   /* [m + 1], INFINITY where nothing fits */
    uint32_t *h, *g; /* [m + 1] */
} item_opts;

static int item_build(const pi2_mprof *mp, const pi2_hwprof *hw, const cfg *c, uint32_t fi, const suffix *x,
                      uint32_t step, uint64_t unit, bool gate_only, item_opts *io)
{
    const pi2_mprof_ffn *F = &mp->ffn[fi];
    uint32_t K = (F->groups + step - 1) / step;
    uint64_t mu = (plan_hot_bytes_of(mp, F->groups, F->groups) + unit - 1) / unit;
    io->m = (uint32_t)mu;
    io->cost = malloc((mu + 1) * sizeof *io->cost);
    io->h = malloc((mu + 1) * sizeof *io->h);
    io->g = malloc((mu + 1) * sizeof *io->g);
    if (!io->cost || !io->h || !io->g)
        return -1;
    for (uint64_t u = 0; u <= mu; u++)
        io->cost[u] = INFINITY;
    for (uint32_t a = 0; a <= K; a++) {
        uint32_t h = a * step < F->groups ? a * step : F->groups;
        for (uint32_t b = mp->two_phase ? a : K; b <= (mp->two_phase && !gate_only ? a : K); b++) {
            uint32_t g = mp->two_phase ? (b * step < F->groups ? b * step : F->groups) : h;
            uint64_t u = (plan_hot_bytes_of(mp, h, g) + unit - 1) / unit;
            double n1, b1, n2, b2;
            plan_static_reads(mp, x, c->gf, h, g, &n1, &b1, &n2, &b2);
            plan_add_extra(mp, plan_cold_share(mp, F, h, g), mp->cal.extra, &n1, &b1);
            double t = plan_item_time(mp, hw, c, fi, n1, b1, n2, b2);
            if (t < io->cost[u]) {
                io->cost[u] = t;
                io->h[u] = h;
                io->g[u] = g;
            }
            if (!mp->two_phase)
                break;
        }
    }
    for (uint64_t u = 1; u <= mu; u++)
        if (io->cost[u - 1] <= io->cost[u]) {
            io->cost[u] = io->cost[u - 1];
            io->h[u] = io->h[u - 1];
            io->g[u] = io->g[u - 1];
        }
    return 0;
}

static void item_free(item_opts *io)
{
    free(io->cost);
    free(io->h);
    free(io->g);
}

/* Exact multiple-choice knapsack over items: minimise the sum of costs
 * within B units. Writes each item's unit count into pick. */
static double knapsack(const item_opts *it, uint32_t n, uint64_t B, uint32_t *pick, int *ok)
{
    double *dp = malloc((B + 1) * sizeof *dp), *nd = malloc((B + 1) * sizeof *nd);
    uint32_t *arg = malloc((size_t)n * (B + 1) * sizeof *arg);
    *ok = dp && nd && arg;
    if (!*ok) {
        free(dp);
        free(nd);
        free(arg);
        return INFINITY;
    }
    for (uint64_t b = 0; b <= B; b++)
        dp[b] = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t *ai = arg + (size_t)i * (B + 1);
        for (uint64_t b = 0; b <= B; b++) {
            double best = INFINITY;
            uint32_t bu = 0;
            uint64_t top = b < it[i].m ? b : it[i].m;
            for (uint64_t u = 0; u <= top; u++) {
                double v = dp[b - u] + it[i].cost[u];
                if (v < best) {
                    best = v;
                    bu = (uint32_t)u;
                }
            }
            nd[b] = best;
            ai[b] = bu;
        }
        double *t = dp;
        dp = nd;
        nd = t;
    }
    double res = dp[B];
    uint64_t b = B;
    for (uint32_t i = n; i-- > 0;) {
        pick[i] = arg[(size_t)i * (B + 1) + b];
        b -= pick[i];
    }
    free(dp);
    free(nd);
    free(arg);
    return res;
}

/* The search's scratch: each FFN's suffix sums, its options at the
 * configuration being tried, and the knapsack's picks. */
typedef struct solve_scratch {
    uint32_t n;
    suffix *sx;
    item_opts *it;
    uint32_t *pick;
} solve_scratch;

static int scratch_make(const pi2_mprof *mp, solve_scratch *s, pi2_err *err)
{
    s->n = mp->n_ffn;
    s->sx = calloc(s->n, sizeof *s->sx);
    s->it = calloc(s->n, sizeof *s->it);
    s->pick = calloc(s->n, sizeof *s->pick);
    if (!s->sx || !s->it || !s->pick)
        return pi2_err_set(err, PI2_ENOMEM, "out of memory planning");
    for (uint32_t i = 0; i < s->n; i++)
        if (plan_suffix_build(&mp->ffn[i], &s->sx[i]) != 0)
            return pi2_err_set(err, PI2_ENOMEM, "out of memory planning");
    return 0;
}

static void scratch_free(solve_scratch *s)
{
    for (uint32_t i = 0; s->sx && i < s->n; i++)
        free(s->sx[i].P);
    for (uint32_t i = 0; s->it && i < s->n; i++)
        item_free(&s->it[i]);
    free(s->sx);
    free(s->it);
    free(s->pick);
}

/* The budget holds every FFN: all hot, each paying only its static reads;
 * their predicted time. */
static double split_all_hot(const pi2_mprof *mp, const pi2_hwprof *hw, const cfg *c, const solve_scratch *s,
                            pi2_plan *cand)
{
    uint32_t n = s->n;
    for (uint32_t i = 0; i < n; i++)
        cand->hot_groups[i] = cand->gate_groups[i] = mp->ffn[i].groups;
    double tot = 0;
    for (uint32_t i = 0; i < n; i++) {
        double n1, b1, n2, b2;
        plan_static_reads(mp, &s->sx[i], c->gf, mp->ffn[i].groups, mp->ffn[i].groups, &n1, &b1, &n2, &b2);
        tot += plan_item_time(mp, hw, c, i, n1, b1, n2, b2);
    }
    return tot;
}

/* The budget holds part of the FFNs: how many hot (and gate) groups each
 * keeps, the split of least predicted time (*tot) among each FFN's options
 * in steps of 1/levels of its groups (the exact knapsack). */
static int split_budget(const pi2_mprof *mp, const pi2_hwprof *hw, const cfg *c, solve_scratch *s, uint64_t budget,
                        uint32_t levels, bool gate_only, pi2_plan *cand, double *tot, pi2_err *err)
{
    uint32_t n = s->n, step = (mp->ffn[0].groups + levels - 1) / levels;
    if (step < 1)
        step = 1;
    uint64_t unit = (uint64_t)step * (mp->two_phase ? mp->Pg : mp->S);
    uint64_t B = budget / unit, sum = 0;
    int rc = 0;
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        item_free(&s->it[i]);
        memset(&s->it[i], 0, sizeof s->it[i]);
        if (item_build(mp, hw, c, i, &s->sx[i], step, unit, gate_only, &s->it[i]) != 0)
            rc = pi2_err_set(err, PI2_ENOMEM, "out of memory planning");
        sum += s->it[i].m;
    }
    if (B > sum)
        B = sum;
    int ok = 1;
    *tot = rc ? INFINITY : knapsack(s->it, n, B, s->pick, &ok);
    if (!ok)
        rc = pi2_err_set(err, PI2_ENOMEM, "out of memory planning");
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        cand->hot_groups[i] = s->it[i].h[s->pick[i]];
        cand->gate_groups[i] = s->it[i].g[s->pick[i]];
    }
    return rc;
}

/* Every configuration (threads up to `threads`, I/O depth, gate first or
 * not) whose fixed costs fit the limit, each with its best split: out
 * takes the one of least predicted time. *any: some configuration fits. */
static int search_configs(const pi2_mprof *mp, const pi2_hwprof *hw, const pi2_plan_mem *mem,
                          const pi2_plan_opts *o, int threads, solve_scratch *s, pi2_plan *out, bool *any,
                          pi2_err *err)
{
    uint32_t n = s->n, levels = n <= 32 ? PLAN_LEVELS : (uint32_t)(PLAN_LEVELS * 32 / n);
    if (levels < 8)
        levels = 8;
    int max_depth = o->max_depth > 0 ? o->max_depth : 128, rc = 0;
    double best = INFINITY;
    uint64_t mc = plan_min_cache(mp, mem);
    for (int t = 1; rc == 0 && t <= threads; t++)
        for (size_t di = 0; rc == 0 && di < sizeof DEPTHS / sizeof *DEPTHS; di++) {
            int depth = DEPTHS[di];
            if (depth > max_depth)
                continue;
            for (int gf = 0; rc == 0 && gf <= (mp->two_phase ? 1 : 0); gf++) {
                cfg c = plan_cfg_make(mp, t, depth, gf != 0);
                uint64_t fixed = mem->fixed + mem->per_depth * (uint64_t)depth;
                if (o->mem_limit < fixed + mc)
                    continue;
                *any = true;
                uint64_t budget = o->mem_limit - fixed - mc;
                pi2_plan cand;
                if ((rc = pi2_plan_alloc(&cand, n, err)) != 0)
                    break;
                cand.mem_limit = o->mem_limit;
                cand.threads = t;
                cand.io_depth = depth;
                cand.gate_first = gf != 0;
                double tot;
                if (budget >= mp->ffn_total)
                    tot = split_all_hot(mp, hw, &c, s, &cand);
                else
                    rc = split_budget(mp, hw, &c, s, budget, levels, o->gate_only, &cand, &tot, err);
                if (rc == 0 && tot < best) {
                    best = tot;
                    pi2_plan_free(out);
                    *out = cand;
                } else {
                    pi2_plan_free(&cand);
                }
            }
        }
    return rc;
}

/* Keep the fixed split unless the search predicts a clear gain
 * (o->min_gain): the model's error is larger than small differences. */
static void prefer_fixed_split(const pi2_mprof *mp, const pi2_hwprof *hw, const pi2_plan_mem *mem,
                               const pi2_plan_opts *o, int threads, pi2_plan *out)
{
    pi2_plan fx;
    pi2_err fe = {0};
    if (o->min_gain > 0 && pi2_plan_fixed(mp, mem, o->mem_limit, threads, 64, 1.0, false, &fx, &fe) == 0) {
        pi2_plan_predict(mp, hw, &fx, o->prompt);
        if (out->pred.decode_ms >= fx.pred.decode_ms * (1 - o->min_gain)) {
            pi2_plan_free(out);
            *out = fx;
        } else {
            pi2_plan_free(&fx);
        }
    }
}

/* The best plan decodes below o->min_speed: out is freed and the plan
 * refused (PI2_ERANGE), naming the memory limit that would reach the
 * speed, found by bisecting on the limit, or that none does. */
static int refuse_too_slow(const pi2_mprof *mp, const pi2_hwprof *hw, const pi2_plan_mem *mem,
                           const pi2_plan_opts *o, pi2_plan *out, pi2_err *err)
{
    double got = out->pred.decode_tok_s;
    uint64_t mc = plan_min_cache(mp, mem);
    uint64_t lo = o->mem_limit, hi = mem->fixed + mem->per_depth * 128 + mc + mp->ffn_total + (64u << 20);
    pi2_plan_opts oo = *o;
    oo.min_speed = 0;
    pi2_plan tp;
    bool reach = false;
    oo.mem_limit = hi;
    if (hi > lo && pi2_plan_solve(mp, hw, mem, &oo, &tp, err) == 0) {
        reach = tp.pred.decode_tok_s >= o->min_speed;
        pi2_plan_free(&tp);
    }
    for (int it2 = 0; reach && it2 < 20 && hi - lo > (16u << 20); it2++) {
        oo.mem_limit = lo + (hi - lo) / 2;
        if (pi2_plan_solve(mp, hw, mem, &oo, &tp, err) != 0)
            break;
        if (tp.pred.decode_tok_s >= o->min_speed)
            hi = oo.mem_limit;
        else
            lo = oo.mem_limit;
        pi2_plan_free(&tp);
    }
    pi2_plan_free(out);
    if (reach)
        return pi2_err_set(err, PI2_ERANGE,
                           "plan: infeasible: at a memory limit of %.0f MB the best plan decodes %.2f tok/s, below "
                           "the minimum speed %.2f; about %.0f MB would reach it",
                           o->mem_limit / 1e6, got, o->min_speed, hi / 1e6);
    return pi2_err_set(err, PI2_ERANGE,
                       "plan: infeasible: at a memory limit of %.0f MB the best plan decodes %.2f tok/s, below "
                       "the minimum speed %.2f, and no memory limit reaches it on this machine (compute-bound)",
                       o->mem_limit / 1e6, got, o->min_speed);
}

int pi2_plan_solve(const pi2_mprof *mp, const pi2_hwprof *hw, const pi2_plan_mem *mem, const pi2_plan_opts *o,
                   pi2_plan *out, pi2_err *err)
{
    memset(out, 0, sizeof *out);
    int threads = o->threads < 1 ? 1 : o->threads;
    if (threads > hw->threads)
        threads = hw->threads;
    if (o->fixed_only) {
        int rc = pi2_plan_fixed(mp, mem, o->mem_limit, threads, 64, 1.0, false, out, err);
        if (rc == 0)
            pi2_plan_predict(mp, hw, out, o->prompt);
        return rc;
    }
    solve_scratch s = {0};
    bool any = false;
    int rc = scratch_make(mp, &s, err);
    if (rc == 0)
        rc = search_configs(mp, hw, mem, o, threads, &s, out, &any, err);
    scratch_free(&s);
    if (rc) {
        pi2_plan_free(out);
        return rc;
    }
    if (!any)
        return pi2_err_set(err, PI2_ENOMEM, "plan: a memory limit of %.0f MB cannot hold the resident part (%.0f MB)",
                           o->mem_limit / 1e6, (mem->fixed + mem->per_depth * 16 + plan_min_cache(mp, mem)) / 1e6);
    pi2_plan_predict(mp, hw, out, o->prompt);
    prefer_fixed_split(mp, hw, mem, o, threads, out);
    if (o->min_speed > 0 && out->pred.decode_tok_s < o->min_speed)
        return refuse_too_slow(mp, hw, mem, o, out, err);
    return 0;
}
