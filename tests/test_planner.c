/* The planner (runtime/planner.h): the solver's plan is the best plan under
 * the cost model, checked against brute force over every plan of small
 * instances (one- and two-phase, several limits); the cost model's basic
 * properties (more memory is never slower, reads fall as hot groups grow,
 * one more read in a batch never takes less time, a plan marked as the
 * fixed split is it);
 * infeasible minimum speeds and limits; plan JSON round trip and hostile
 * plan files; the memory model made from a container alone gives the
 * numbers an opened engine runs with (the fixed split at several limits,
 * hot shares, depths; a given plan; the minimum), and counts the FFN scales
 * in the slots, not the resident part. Engine runs of plans are in
 * test_offload. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "bundle/bundle.h"
#include "convert/synth.h"
#include "runtime/engine.h"
#include "runtime/planner.h"
#include "tests/testhw.h"
#include "tests/testmodel.h"
#include "tests/testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { NF = 3, GROUPS = 6, GROUP = 2 };

/* A hand-made model profile: NF FFNs of GROUPS groups, hot to cold; seed 3
 * makes it one MoE layer of NF experts, top-1, routed 60/30/10%. */
static void fake_model(pi2_mprof *mp, bool two_phase, uint64_t seed)
{
    memset(mp, 0, sizeof *mp);
    mp->n_layers = NF;
    mp->top_k = 1;
    mp->hidden = 1024;
    mp->n_ff = GROUPS * GROUP;
    mp->ctx = 64;
    mp->n_ffn = NF;
    mp->two_phase = two_phase;
    mp->q_ffn = PI2_QT_Q4;
    mp->q_other = PI2_QT_Q8;
    mp->R = 512;
    mp->Pg = two_phase ? 4096 : 0;
    mp->S = two_phase ? 3 * 4096 : 4096;
    mp->attn_bytes = 4u << 20;
    mp->head_bytes = 8u << 20;
    mp->kv_per_pos = 4096;
    pi2_plan_cal_defaults(&mp->cal);
    mp->ffn = calloc(NF, sizeof *mp->ffn);
    pi2_rng r;
    pi2_rng_seed(&r, seed);
    for (int i = 0; i < NF; i++) {
        pi2_mprof_ffn *F = &mp->ffn[i];
        F->neurons = GROUPS * GROUP;
        F->group = GROUP;
        F->groups = GROUPS;
        F->words = 1;
        F->pred_bytes = 1u << 20;
        F->p = calloc(GROUPS, sizeof(double));
        F->n = calloc(GROUPS, sizeof(double));
        F->q = calloc(GROUPS, sizeof(double));
        F->sp0 = calloc(GROUPS, sizeof(double));
        F->spg = calloc(GROUPS, sizeof(double));
        F->spu = calloc(GROUPS, sizeof(double));
        double level = 0.9;
        for (int k = 0; k < GROUPS; k++) {
            level *= 0.5 + 0.45 * pi2_rng_uniform(&r); /* mostly falling, like a hot-to-cold order */
            F->p[k] = level;
            F->n[k] = level * (1 + pi2_rng_uniform(&r));
            F->q[k] = level * 0.8;
            F->sp0[k] = (double)mp->S;
            F->spg[k] = 4096;
            F->spu[k] = two_phase ? 8192 : 0;
            F->sel += F->n[k];
        }
        F->fired = F->sel * 0.8;
        F->w = 1;
        mp->ffn_total += (uint64_t)GROUPS * mp->S;
    }
    if (seed == 3) {
        static const double share[NF] = {0.6, 0.3, 0.1};
        mp->n_layers = 1;
        mp->experts = NF;
        for (int i = 0; i < NF; i++)
            mp->ffn[i].w = share[i];
    }
}

static void free_model(pi2_mprof *mp) { pi2_mprof_free(mp); }

static const pi2_plan_mem MEM = {.fixed = 100u << 20, .per_depth = 16384, .min_slots = 4, .slot_bytes = {4096, 8192}};

/* Decode time of a plan under the cost model (static reads). */
static double cost(const pi2_mprof *mp, const pi2_hwprof *hw, pi2_plan *p)
{
    pi2_plan_predict(mp, hw, p, 128);
    return p->pred.decode_ms;
}

static uint64_t hot_total(const pi2_mprof *mp, const pi2_plan *p)
{
    uint64_t t = 0;
    for (uint32_t i = 0; i < p->n_ffn; i++)
        t += pi2_plan_hot_bytes(mp, p, i);
    return t;
}

/* Every plan: (h, g) per FFN, threads, depth, gate-first: its memory and
 * its decode time, computed once per model. */
typedef struct bf_entry {
    uint64_t mem;
    double ms;
} bf_entry;

static bf_entry *brute_all(const pi2_mprof *mp, const pi2_hwprof *hw, int threads, size_t *count)
{
    static const int depths[] = {16, 32, 64, 128};
    pi2_plan p;
    pi2_err e = {0};
    assert_int_equal(pi2_plan_alloc(&p, NF, &e), 0);
    p.mem_limit = 1ull << 40;
    int per = 0;
    int hs[64], gs[64];
    for (int h = 0; h <= GROUPS; h++)
        for (int g = mp->two_phase ? h : GROUPS; g <= GROUPS; g++) {
            hs[per] = h;
            gs[per++] = mp->two_phase ? g : h;
        }
    uint64_t mc = MEM.min_slots * (MEM.slot_bytes[0] + (mp->two_phase ? MEM.slot_bytes[1] : 0));
    size_t cap = (size_t)threads * 4 * 2 * (size_t)per * per * per, n = 0;
    bf_entry *all = malloc(cap * sizeof *all);
    for (int t = 1; t <= threads; t++)
        for (int di = 0; di < 4; di++)
            for (int gf = 0; gf <= (mp->two_phase ? 1 : 0); gf++) {
                p.threads = t;
                p.io_depth = depths[di];
                p.gate_first = gf;
                uint64_t fixed = MEM.fixed + MEM.per_depth * (uint64_t)depths[di];
                for (int a = 0; a < per; a++)
                    for (int b = 0; b < per; b++)
                        for (int c = 0; c < per; c++) {
                            int ch[NF] = {a, b, c};
                            for (int i = 0; i < NF; i++) {
                                p.hot_groups[i] = (uint32_t)hs[ch[i]];
                                p.gate_groups[i] = (uint32_t)gs[ch[i]];
                            }
                            all[n].mem = fixed + hot_total(mp, &p) + mc;
                            all[n++].ms = cost(mp, hw, &p);
                        }
            }
    pi2_plan_free(&p);
    *count = n;
    return all;
}

static double brute_best(const bf_entry *all, size_t n, uint64_t limit)
{
    double best = INFINITY;
    for (size_t i = 0; i < n; i++)
        if (all[i].mem <= limit && all[i].ms < best)
            best = all[i].ms;
    return best;
}

static void solver_vs_brute(bool two_phase)
{
    pi2_hwprof hw;
    pi2t_fake_hw(&hw, 2);
    for (uint64_t seed = 1; seed <= 3; seed++) {
        pi2_mprof mp;
        fake_model(&mp, two_phase, seed);
        uint64_t mc = MEM.min_slots * (MEM.slot_bytes[0] + (two_phase ? MEM.slot_bytes[1] : 0));
        uint64_t base = MEM.fixed + MEM.per_depth * 128 + mc;
        double last = INFINITY;
        size_t nall;
        bf_entry *all = brute_all(&mp, &hw, 2, &nall);
        for (int frac = 0; frac <= 8; frac++) {
            uint64_t limit = base + mp.ffn_total * (uint64_t)frac / 8 + (frac == 3 ? 5000 : 0);
            pi2_plan_opts o;
            pi2_plan_opts_defaults(&o);
            o.mem_limit = limit;
            o.threads = 2;
            o.min_gain = 0;
            o.gate_only = true; /* the brute force enumerates gate-only groups */
            pi2_plan p;
            pi2_err e = {0};
            if (pi2_plan_solve(&mp, &hw, &MEM, &o, &p, &e))
                fail_msg("solve: %s", e.msg);
            double want = brute_best(all, nall, limit);
            double got = p.pred.decode_ms;
            uint64_t used = MEM.fixed + MEM.per_depth * (uint64_t)p.io_depth + hot_total(&mp, &p) + mc;
            assert_true(used <= limit);
            if (fabs(got - want) > 1e-9 * want)
                fail_msg("seed %llu limit %d/8: solver %.9f ms, brute force %.9f ms", (unsigned long long)seed, frac,
                         got, want);
            assert_true(got <= last * (1 + 1e-12)); /* more memory is never slower */
            last = got;
            /* without gate-only groups: never better, and none chosen */
            pi2_plan q;
            o.gate_only = false;
            assert_int_equal(pi2_plan_solve(&mp, &hw, &MEM, &o, &q, &e), 0);
            assert_true(q.pred.decode_ms >= got * (1 - 1e-12));
            for (uint32_t i = 0; i < NF; i++)
                assert_int_equal(q.gate_groups[i], q.hot_groups[i]);
            pi2_plan_free(&q);
            if (frac == 8) /* everything fits: all hot, no reads */
                for (uint32_t i = 0; i < NF; i++)
                    assert_int_equal(p.hot_groups[i], GROUPS);
            pi2_plan_free(&p);
        }
        free(all);
        free_model(&mp);
    }
}

static void test_solver_one_phase(void **state)
{
    (void)state;
    solver_vs_brute(false);
}

static void test_solver_two_phase(void **state)
{
    (void)state;
    solver_vs_brute(true);
}

/* Reads fall as hot groups grow; the fixed split is never better than the
 * solver's plan. */
/* MoE: experts alike but for how often they are routed to get hot groups
 * in that order, and a plan's reads weigh each expert by its share. */
static void test_moe_routing(void **state)
{
    (void)state;
    pi2_hwprof hw;
    pi2t_fake_hw(&hw, 2);
    for (int two = 0; two <= 1; two++) {
        pi2_mprof mp;
        fake_model(&mp, two, 3);
        for (int i = 1; i < NF; i++) {
            pi2_mprof_ffn *F = &mp.ffn[i], *F0 = &mp.ffn[0];
            memcpy(F->p, F0->p, GROUPS * sizeof(double));
            memcpy(F->n, F0->n, GROUPS * sizeof(double));
            memcpy(F->q, F0->q, GROUPS * sizeof(double));
            F->sel = F0->sel;
            F->fired = F0->fired;
        }
        uint64_t mc = MEM.min_slots * (MEM.slot_bytes[0] + (two ? MEM.slot_bytes[1] : 0));
        pi2_plan_opts o;
        pi2_plan_opts_defaults(&o);
        o.mem_limit = MEM.fixed + MEM.per_depth * 16 + mc + mp.ffn_total / 2;
        o.max_depth = 16;
        o.threads = 2;
        o.min_gain = 0;
        pi2_plan p;
        pi2_err e = {0};
        assert_int_equal(pi2_plan_solve(&mp, &hw, &MEM, &o, &p, &e), 0);
        assert_true(p.hot_groups[0] >= p.hot_groups[1] && p.hot_groups[1] >= p.hot_groups[2]);
        if (p.hot_groups[0] <= p.hot_groups[2])
            fail_msg("%s: hot groups %u %u %u", two ? "two-phase" : "one-phase", p.hot_groups[0], p.hot_groups[1],
                     p.hot_groups[2]);
        /* the same plan with the shares swapped reads more */
        double reads = p.pred.reads_per_token;
        mp.ffn[0].w = 0.1;
        mp.ffn[2].w = 0.6;
        pi2_plan_predict(&mp, &hw, &p, 128);
        assert_true(p.pred.reads_per_token > reads);
        pi2_plan_free(&p);
        free_model(&mp);
    }
}

static void test_cost_model(void **state)
{
    (void)state;
    pi2_hwprof hw;
    pi2t_fake_hw(&hw, 2);
    pi2_mprof mp;
    fake_model(&mp, true, 7);
    pi2_plan p;
    pi2_err e = {0};
    assert_int_equal(pi2_plan_alloc(&p, NF, &e), 0);
    p.mem_limit = 1ull << 40;
    p.threads = 2;
    p.io_depth = 32;
    double last_reads = INFINITY, last_ms = INFINITY;
    for (uint32_t h = 0; h <= GROUPS; h++) {
        for (uint32_t i = 0; i < NF; i++)
            p.hot_groups[i] = p.gate_groups[i] = h;
        pi2_plan_predict(&mp, &hw, &p, 128);
        assert_true(p.pred.reads_per_token <= last_reads);
        assert_true(p.pred.decode_ms <= last_ms * (1 + 1e-12));
        assert_true(p.pred.decode_tok_s > 0 && p.pred.prefill_tok_s > 0);
        assert_true(p.pred.hit_rate >= 0 && p.pred.hit_rate <= 1);
        last_reads = p.pred.reads_per_token;
        last_ms = p.pred.decode_ms;
    }
    assert_true(last_reads == 0 && p.pred.hit_rate == 1.0 && p.pred.offloaded == 0.0);
    /* every group selected by every token: an FFN reads exactly its cold
     * groups, 0..GROUPS of them at once; one more read never takes less
     * time, across the probed depths (1, 4) too */
    pi2_mprof all;
    fake_model(&all, false, 7);
    for (uint32_t i = 0; i < NF; i++)
        for (uint32_t k = 0; k < GROUPS; k++)
            all.ffn[i].p[k] = all.ffn[i].n[k] = all.ffn[i].q[k] = 1;
    last_ms = 0;
    for (uint32_t h = GROUPS + 1; h-- > 0;) {
        for (uint32_t i = 0; i < NF; i++)
            p.hot_groups[i] = p.gate_groups[i] = h;
        pi2_plan_predict(&all, &hw, &p, 128);
        if (fabs(p.pred.reads_per_token - (double)NF * (GROUPS - h)) > 1e-9 || p.pred.io_ms < last_ms)
            fail_msg("%u cold groups: %.3f reads, %.6f ms of reads after %.6f", GROUPS - h, p.pred.reads_per_token,
                     p.pred.io_ms, last_ms);
        last_ms = p.pred.io_ms;
    }
    free_model(&all);
    /* one compute thread, the I/O thread on a core of its own: reads of a
     * tenth of each layer's compute or less hide under it by the overlap
     * (0.5 in the fake profile) times 95-100% (X + Y - |(X, Y)| of reads Y
     * under compute X), all of the compute counting as the window */
    p.threads = 1;
    for (uint32_t i = 0; i < NF; i++)
        p.hot_groups[i] = p.gate_groups[i] = GROUPS - 1;
    pi2_plan_predict(&mp, &hw, &p, 128);
    assert_true(p.pred.overlap == 0.5 && p.pred.io_ms > 0 && p.pred.io_ms < 0.1 * p.pred.compute_ms);
    double lo = p.pred.compute_ms + p.pred.head_ms + 0.5 * p.pred.io_ms, hi = lo + 0.5 * 0.05 * p.pred.io_ms;
    if (!(p.pred.decode_ms >= lo * (1 - 1e-12) && p.pred.decode_ms <= hi))
        fail_msg("decode %.9f ms, compute + head + half the reads %.9f ms (+5%% of that half: %.9f)", p.pred.decode_ms,
                 lo, hi);
    pi2_plan_free(&p);
    int kept = 0, own = 0;
    for (int frac = 1; frac < 16; frac++) {
        uint64_t limit = MEM.fixed + MEM.per_depth * 128 + 4 * (4096 + 8192) + mp.ffn_total * (uint64_t)(frac % 8) / 8;
        pi2_plan f, s;
        pi2_plan_opts o;
        pi2_plan_opts_defaults(&o);
        o.mem_limit = limit;
        o.threads = 2;
        if (frac >= 8)
            o.min_gain = 0; /* the exact optimum: the solver's own plans */
        assert_int_equal(pi2_plan_fixed(&mp, &MEM, limit, 2, 64, 1.0, false, &f, &e), 0);
        pi2_plan_predict(&mp, &hw, &f, 128);
        assert_int_equal(pi2_plan_solve(&mp, &hw, &MEM, &o, &s, &e), 0);
        assert_true(s.pred.decode_ms <= f.pred.decode_ms * (1 + 1e-12));
        /* the solver's own plan only when it is predicted min_gain faster;
         * else the fixed split itself, marked so */
        kept += s.fixed_split;
        own += !s.fixed_split;
        if (s.fixed_split) {
            assert_true(s.threads == f.threads && s.io_depth == f.io_depth && s.gate_first == f.gate_first);
            for (uint32_t i = 0; i < NF; i++)
                assert_true(s.hot_groups[i] == f.hot_groups[i] && s.gate_groups[i] == f.gate_groups[i]);
        } else {
            assert_true(s.pred.decode_ms <= f.pred.decode_ms * (1 - o.min_gain) * (1 + 1e-12));
        }
        assert_true(f.fixed_split);
        pi2_plan_free(&f);
        pi2_plan_free(&s);
    }
    assert_true(kept > 0 && own > 0);
    free_model(&mp);
}

static void test_infeasible(void **state)
{
    (void)state;
    pi2_hwprof hw;
    pi2t_fake_hw(&hw, 2);
    pi2_mprof mp;
    fake_model(&mp, true, 3);
    pi2_plan_opts o;
    pi2_plan_opts_defaults(&o);
    o.threads = 2;
    pi2_plan p;
    pi2_err e = {0};
    /* below the resident part */
    o.mem_limit = MEM.fixed / 2;
    assert_int_equal(pi2_plan_solve(&mp, &hw, &MEM, &o, &p, &e), PI2_ENOMEM);
    assert_non_null(strstr(e.msg, "cannot hold the resident part"));
    assert_null(strstr(e.msg, "--")); /* the problem, not a tool's flag */
    /* a speed no limit reaches */
    o.mem_limit = MEM.fixed + MEM.per_depth * 128 + mp.ffn_total / 4;
    o.min_speed = 1e9;
    pi2_err_clear(&e);
    assert_int_equal(pi2_plan_solve(&mp, &hw, &MEM, &o, &p, &e), PI2_ERANGE);
    if (!strstr(e.msg, "infeasible"))
        fail_msg("%s", e.msg);
    assert_non_null(strstr(e.msg, "no memory limit reaches it"));
    /* a speed that more memory reaches: the message says how much */
    o.min_speed = 0;
    uint64_t small = MEM.fixed + MEM.per_depth * 16 + 4 * (4096 + 8192);
    o.mem_limit = small;
    assert_int_equal(pi2_plan_solve(&mp, &hw, &MEM, &o, &p, &e), 0);
    double slow = p.pred.decode_tok_s;
    pi2_plan_free(&p);
    o.mem_limit = 1ull << 40;
    assert_int_equal(pi2_plan_solve(&mp, &hw, &MEM, &o, &p, &e), 0);
    double fast = p.pred.decode_tok_s;
    pi2_plan_free(&p);
    if (!(fast > slow))
        fail_msg("slow %g fast %g", slow, fast);
    o.mem_limit = small;
    o.min_speed = (slow + fast) / 2;
    pi2_err_clear(&e);
    assert_int_equal(pi2_plan_solve(&mp, &hw, &MEM, &o, &p, &e), PI2_ERANGE);
    assert_non_null(strstr(e.msg, "would reach it"));
    free_model(&mp);
}

/* Calibration: runs teach the compute factor per thread count and the
 * read-ahead reads; the file round-trips and hostile files are refused. */
static void test_calibration(void **state)
{
    (void)state;
    pi2_hwprof hw;
    pi2t_fake_hw(&hw, 2);
    pi2_mprof mp;
    fake_model(&mp, true, 5);
    pi2_plan p;
    pi2_err e = {0};
    assert_int_equal(pi2_plan_alloc(&p, NF, &e), 0);
    p.mem_limit = 1ull << 40;
    p.threads = 2;
    p.io_depth = 64;
    for (uint32_t i = 0; i < NF; i++)
        p.hot_groups[i] = p.gate_groups[i] = GROUPS; /* all hot: no reads */
    pi2_plan_predict(&mp, &hw, &p, 128);
    double base = p.pred.decode_ms;
    pi2_plan_cal c;
    pi2_plan_cal_defaults(&c);
    /* the engine runs 1.3x slower than the kernels add up to */
    /* (the first run moves the factor most of the way from 1: the prior
     * weighs a quarter of a run in memory) */
    pi2_plan_cal_update(&c, &p, 1e3 / (base * 1.3), 0);
    mp.cal = c;
    pi2_plan_predict(&mp, &hw, &p, 128);
    assert_true(p.pred.decode_ms / base > 1.2 && p.pred.decode_ms / base < 1.3);
    for (int r = 0; r < 30; r++)
        pi2_plan_cal_update(&c, &p, 1e3 / (base * 1.3), 0);
    mp.cal = c;
    pi2_plan_predict(&mp, &hw, &p, 128);
    assert_true(fabs(p.pred.decode_ms / base - 1.3) < 0.002 * 1.3);
    /* an unmeasured thread count takes the measured one's factor */
    p.threads = 1;
    pi2_plan_predict(&mp, &hw, &p, 128);
    double one = p.pred.decode_ms;
    mp.cal.s_w[1] = mp.cal.s_wk[1] = 0;
    pi2_plan_predict(&mp, &hw, &p, 128);
    assert_true(fabs(one / p.pred.decode_ms - 1.3) < 0.03 * 1.3); /* leaning on 1 a little */
    /* reads: runs an eighth hot whose reads took 1.5x the model's time,
     * alternating with runs all in memory, teach the read factor, the
     * compute factor staying as learned */
    pi2_plan q;
    p.threads = 2;
    for (uint32_t i = 0; i < NF; i++)
        p.hot_groups[i] = p.gate_groups[i] = GROUPS;
    assert_int_equal(pi2_plan_alloc(&q, NF, &e), 0);
    q.mem_limit = p.mem_limit;
    q.threads = 2;
    q.io_depth = 64;
    for (uint32_t i = 0; i < NF; i++)
        q.hot_groups[i] = q.gate_groups[i] = GROUPS / 8;
    for (int i = 0; i < PI2_HW_NSIZES; i++) /* a slow disk: the reads weigh */
        for (int j = 0; j < PI2_HW_NDEPTHS; j++) {
            hw.io[i][j].iops /= 16;
            hw.io[i][j].bytes_per_s /= 16;
            hw.io[i][j].lat_us *= 16;
        }
    pi2_plan_cal slow = c;
    slow.s_io_w[1] = 1e9; /* 1.5 whatever the prior */
    slow.s_io_wk[1] = 1.5e9;
    mp.cal = slow;
    pi2_plan_predict(&mp, &hw, &q, 128);
    double want = q.pred.decode_tok_s, reads = q.pred.raw_reads;
    assert_true(q.pred.io_ms > 0.6 * q.pred.decode_ms);
    pi2_plan_cal learn = c;
    for (int r = 0; r < 20; r++) {
        mp.cal = learn;
        pi2_plan_predict(&mp, &hw, &q, 128);
        pi2_plan_cal_update(&learn, &q, want, reads);
        pi2_plan_predict(&mp, &hw, &p, 128);
        pi2_plan_cal_update(&learn, &p, 1e3 / (base * 1.3), 0);
    }
    mp.cal = learn;
    pi2_plan_predict(&mp, &hw, &q, 128);
    if (!(fabs(q.pred.decode_tok_s / want - 1) < 0.01 && fabs(learn.s_io_wk[1] / learn.s_io_w[1] - 1.5) < 0.03 &&
          fabs(learn.s_wk[1] / learn.s_w[1] - 1.3) < 0.03))
        fail_msg("learned %.4f tok/s for %.4f: read factor %.3f, compute %.3f", q.pred.decode_tok_s, want,
                 learn.s_io_wk[1] / learn.s_io_w[1], learn.s_wk[1] / learn.s_w[1]);
    pi2_plan_free(&q);
    /* read-ahead: a run that read 50 more than the model per token, half cold */
    p.threads = 2;
    for (uint32_t i = 0; i < NF; i++)
        p.hot_groups[i] = p.gate_groups[i] = GROUPS / 2;
    mp.cal = c;
    pi2_plan_predict(&mp, &hw, &p, 128);
    double raw = p.pred.raw_reads, cold = p.pred.raw_cold;
    assert_true(cold > 0.4 * NF && cold < 0.6 * NF);
    pi2_plan_cal_update(&c, &p, p.pred.decode_tok_s, raw + 50);
    assert_true(fabs(c.extra - 50 / cold) < 1e-9);
    mp.cal = c;
    pi2_plan_predict(&mp, &hw, &p, 128);
    assert_true(fabs(p.pred.reads_per_token - (raw + 50)) < 1e-6);
    /* file round trip */
    char dir[64], path[128];
    pi2t_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/model-x.json", dir);
    pi2_plan_cal d;
    assert_int_equal(pi2_plan_cal_load(path, &d, &e), PI2_ENOTFOUND);
    pi2_err_clear(&e);
    assert_int_equal(pi2_plan_cal_save(&c, path, &e), 0);
    assert_int_equal(pi2_plan_cal_load(path, &d, &e), 0);
    assert_true(d.runs == c.runs && fabs(d.extra - c.extra) < 1e-6 * c.extra);
    for (int t = 0; t < PI2_HW_MAX_THREADS; t++)
        assert_true(fabs(d.s_w[t] - c.s_w[t]) <= 1e-8 * (c.s_w[t] + 1e-30) + 1e-30 &&
                    fabs(d.s_io_wk[t] - c.s_io_wk[t]) <= 1e-8 * (c.s_io_wk[t] + 1e-30) + 1e-30);
#define Z16 "[[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0]]"
    static const char *const bad[] = {
        "", "{}", "[]", "{\"version\":3}",
        "{\"version\":6,\"extra_reads\":-1,\"runs\":1,\"reads_sums\":[0,0],\"io_sums\":[],\"compute_sums\":[]}",
        "{\"version\":6,\"extra_reads\":1,\"runs\":1,\"reads_sums\":[0,0],\"io_sums\":" Z16 ","
        "\"compute_sums\":[[1,99],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0]]}",
        "{\"version\":6,\"extra_reads\":1,\"runs\":1,\"reads_sums\":[0,0],\"compute_sums\":" Z16 ","
        "\"io_sums\":[[0,0],[1,9],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0]]}",
        "{\"version\":6,\"extra_reads\":1,\"runs\":1,\"reads_sums\":[0,0],\"compute_sums\":" Z16 ","
        "\"io_sums\":[[0,0],[1,1],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0]]}",
        /* an older version */
        "{\"version\":4,\"extra_reads\":1,\"runs\":1,\"reads_sums\":[0,0],"
        "\"compute_sums\":[[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0],[0,0]]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        FILE *f = fopen(path, "w");
        fputs(bad[i], f);
        fclose(f);
        pi2_err be = {0};
        int rc = pi2_plan_cal_load(path, &d, &be);
        if (rc == 0 || !strstr(be.msg, path))
            fail_msg("case %zu: rc %d \"%s\"", i, rc, be.msg);
        assert_true(d.runs == 0 && d.extra == 0); /* defaults on error */
    }
    pi2t_rmtree(dir);
    pi2_plan_free(&p);
    free_model(&mp);
}

static void test_plan_json(void **state)
{
    (void)state;
    char dir[64], path[128];
    pi2t_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/plan.json", dir);
    pi2_plan p, q;
    pi2_err e = {0};
    assert_int_equal(pi2_plan_alloc(&p, 4, &e), 0);
    p.mem_limit = 3ull << 30;
    p.threads = 2;
    p.io_depth = 32;
    p.gate_first = true;
    for (uint32_t i = 0; i < 4; i++) {
        p.hot_groups[i] = i * 3;
        p.gate_groups[i] = i * 5;
    }
    p.pred.decode_tok_s = 6.5;
    assert_int_equal(pi2_plan_save(&p, "m.pi2", path, &e), 0);
    assert_int_equal(pi2_plan_load(path, &q, &e), 0);
    assert_int_equal(q.n_ffn, 4);
    assert_true(q.mem_limit == p.mem_limit && q.threads == 2 && q.io_depth == 32 && q.gate_first);
    assert_memory_equal(q.hot_groups, p.hot_groups, 4 * sizeof(uint32_t));
    assert_memory_equal(q.gate_groups, p.gate_groups, 4 * sizeof(uint32_t));
    assert_true(fabs(q.pred.decode_tok_s - 6.5) < 1e-9);
    pi2_plan_free(&q);
    /* unpredicted (no hardware profile): no "predicted"; pi2-run plan's
     * "source", "note" and "memory" are accepted and ignored */
    p.pred.decode_tok_s = 0;
    char *js = pi2_plan_json(&p, "m.pi2");
    assert_non_null(js);
    assert_null(strstr(js, "predicted"));
    FILE *pf = fopen(path, "w");
    fprintf(pf, "%.*s,\"source\":\"fixed split\",\"note\":\"no hardware profile\",\"memory\":{\"ctx\":8}}\n",
            (int)strlen(js) - 1, js);
    fclose(pf);
    free(js);
    assert_int_equal(pi2_plan_load(path, &q, &e), 0);
    assert_true(q.n_ffn == 4 && q.pred.decode_tok_s == 0);
    assert_memory_equal(q.gate_groups, p.gate_groups, 4 * sizeof(uint32_t));
    pi2_plan_free(&q);
    pi2_plan_free(&p);
    static const struct {
        const char *text;
        int code;
        const char *msg;
    } bad[] = {
        {"", PI2_EFORMAT, "not a plan"},
        {"[1]", PI2_EFORMAT, "expected an object"},
        {"{\"version\":1,\"mem_limit\":1,\"threads\":1,\"io_depth\":1,\"gate_first\":false,\"hot_groups\":[1],"
         "\"gate_groups\":[1],\"x\":1}",
         PI2_EFORMAT, "unknown key"},
        {"{\"version\":2,\"mem_limit\":1,\"threads\":1,\"io_depth\":1,\"gate_first\":false,\"hot_groups\":[1],"
         "\"gate_groups\":[1]}",
         PI2_ERANGE, "plan.version"},
        {"{\"version\":1,\"mem_limit\":1,\"threads\":0,\"io_depth\":1,\"gate_first\":false,\"hot_groups\":[1],"
         "\"gate_groups\":[1]}",
         PI2_ERANGE, "plan.threads"},
        {"{\"version\":1,\"mem_limit\":1,\"threads\":1,\"io_depth\":1,\"gate_first\":false,\"hot_groups\":[2],"
         "\"gate_groups\":[1]}",
         PI2_ERANGE, "hot <= gate"},
        {"{\"version\":1,\"mem_limit\":1,\"threads\":1,\"io_depth\":1,\"gate_first\":false,\"hot_groups\":[1,2],"
         "\"gate_groups\":[1]}",
         PI2_ESHAPE, "gate_groups"},
        {"{\"version\":1,\"mem_limit\":1,\"threads\":1,\"io_depth\":1,\"gate_first\":false,\"hot_groups\":[-1],"
         "\"gate_groups\":[1]}",
         PI2_ERANGE, "hot_groups[0]"},
        {"{\"version\":1,\"mem_limit\":1,\"threads\":1,\"io_depth\":1,\"hot_groups\":[1],\"gate_groups\":[1]}",
         PI2_ENOTFOUND, "gate_first"},
        {"{\"version\":1,\"mem_limit\":1,\"threads\":1,\"io_depth\":1,\"gate_first\":false,\"hot_groups\":[],"
         "\"gate_groups\":[]}",
         PI2_ESHAPE, "empty"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        FILE *f = fopen(path, "w");
        fputs(bad[i].text, f);
        fclose(f);
        pi2_err be = {0};
        int rc = pi2_plan_load(path, &q, &be);
        if (rc != bad[i].code || !strstr(be.msg, bad[i].msg) || !strstr(be.msg, path))
            fail_msg("case %zu: rc %d, message \"%s\"", i, rc, be.msg);
    }
    /* a missing file names it */
    snprintf(path, sizeof path, "%s/none.json", dir);
    pi2_err_clear(&e);
    assert_int_not_equal(pi2_plan_load(path, &q, &e), 0);
    assert_non_null(strstr(e.msg, "none.json"));
    pi2t_rmtree(dir);
}

/* ---- the memory model against an opened engine ---- */

enum { MEM_THREADS = 2, MEM_CTX = 48 };

static void mem_opts(pi2_engine_opts *o, const char *path, const pi2_sign_key *pub, uint64_t limit)
{
    pi2_engine_defaults(o);
    o->path = path;
    o->pubkey = pub;
    o->threads = MEM_THREADS;
    o->ctx = MEM_CTX;
    o->offload.mem_limit = limit;
    o->offload.attn_stream = -1; /* the attention resident: test_attn_stream lets it stream */
}

/* The memory plan for o, from the container alone; extra: bytes added to
 * the resident part (0: the container's). */
static int plan_of_extra(const pi2_engine_opts *o, uint64_t extra, pi2_plan_memory *m, pi2_err *e)
{
    pi2_bundle *b = NULL;
    pi2_bundle_open_opts bo = {.pubkey = o->pubkey};
    int rc = pi2_bundle_open(&b, o->path, &bo, e);
    if (rc)
        return rc;
    const pi2_manifest *mf = pi2_bundle_manifest(b);
    const pi2_bundle_layout *bl = pi2_bundle_layout_get(b);
    const pi2_ctr *c = pi2_bundle_container(b);
    uint64_t end = UINT64_MAX;
    for (size_t i = 0; i < bl->n_ffn; i++) {
        uint64_t off = pi2_ctr_find(c, bl->ffn[i].ffn)->offset;
        end = off < end ? off : end;
    }
    const pi2_ctr_member *m0 = pi2_ctr_at(c, 0);
    pi2_plan_mem_in in = {.mf = mf, .bl = bl, .name = o->path, .base = m0->data - m0->offset, .base_len = end,
                          .resident = pi2_plan_resident(mf, bl, (uint64_t)sysconf(_SC_PAGESIZE)), .ctx = MEM_CTX,
                          .threads = MEM_THREADS, .cores = (int)sysconf(_SC_NPROCESSORS_ONLN),
                          .files = pi2_plan_container_touched(c), .opts = &o->offload};
    in.resident += extra;
    if ((rc = pi2_engine_buffer_sizes(mf, bl, MEM_THREADS, false, &in.bufs, e)) == 0)
        rc = pi2_plan_memory_make(&in, m, e);
    pi2_bundle_close(b);
    return rc;
}

static int plan_of(const pi2_engine_opts *o, pi2_plan_memory *m, pi2_err *e)
{
    return plan_of_extra(o, 0, m, e);
}

/* The FFN scales travel in the slots (bundle/layout.h): the plan counts
 * them in the FFN bytes and not in the resident part, whose members name
 * none of the converted model's scale members; so the minimum is below
 * the one of the same model with its scales resident (as layout 1 kept
 * them) by at least their bytes. */
static void check_scales_in_slots(const char *conv, const char *path, const pi2_sign_key *pk)
{
    pi2_ctr *cc;
    pi2_manifest *cm;
    pi2t_open_manifest(conv, &cc, &cm);
    pi2_bundle *b = NULL;
    pi2_err e = {0};
    pi2_bundle_open_opts bo = {.pubkey = pk};
    assert_int_equal(pi2_bundle_open(&b, path, &bo, &e), 0);
    const pi2_bundle_layout *bl = pi2_bundle_layout_get(b);
    uint64_t scales = 0, payload = 0;
    for (size_t i = 0; i < cm->n_tensors; i++) {
        const pi2_mf_tensor *t = &cm->tensors[i];
        if (t->role != PI2_T_GATE && t->role != PI2_T_UP && t->role != PI2_T_DOWN)
            continue;
        scales += pi2_ctr_find(cc, t->scales)->size;
        payload += pi2_ctr_find(cc, t->payload)->size;
        for (size_t r = 0; r < bl->n_resident; r++)
            assert_string_not_equal(bl->resident[r], t->scales);
        assert_null(pi2_ctr_find(pi2_bundle_container(b), t->scales));
    }
    assert_true(scales > 0 && scales * 8 == payload); /* q4: 2 bytes of scale a 32 values (16 bytes) */
    pi2_engine_opts o;
    pi2_plan_memory now, v1;
    mem_opts(&o, path, pk, 1ull << 40);
    assert_int_equal(plan_of(&o, &now, &e), 0);
    assert_int_equal(plan_of_extra(&o, scales, &v1, &e), 0);
    assert_true(now.ffn_total >= payload + scales);
    assert_true(now.minimum + scales <= v1.minimum);
    assert_true(now.resident + scales == v1.resident);
    pi2_plan_memory_free(&now);
    pi2_plan_memory_free(&v1);
    pi2_bundle_close(b);
    pi2_manifest_free(cm);
    pi2_ctr_close(cc);
}

/* The engine opened with o runs the memory plan made from the container. */
static void agrees(const pi2_engine_opts *o)
{
    pi2_plan_memory m;
    pi2_err e = {0};
    if (plan_of(o, &m, &e))
        fail_msg("plan at %llu (depth %d, share %.1f, %s): %s", (unsigned long long)o->offload.mem_limit,
                 o->offload.io_depth, o->offload.hot_share,
                 o->offload.hw ? (o->offload.fixed_split ? "fixed, predicted" : "solver") : "fixed", e.msg);
    pi2_engine *eng = NULL;
    if (pi2_engine_open(&eng, o, &e))
        fail_msg("open at %llu: %s", (unsigned long long)o->offload.mem_limit, e.msg);
    pi2_engine_offload_info in;
    pi2_engine_offload_info_get(eng, &in);
    assert_true(in.on);
    assert_true(in.minimum == m.minimum && in.resident == m.resident && in.kv == m.kv);
    assert_true(in.buffers == m.buffers && in.overhead == m.overhead && in.ffn_total == m.ffn_total);
    assert_true(in.hot == m.hot && in.gate_hot == m.gate_hot && in.cache_slots == m.slots[0] + m.slots[1]);
    /* the caches as allocated: their slot records take at most what the plan reserves */
    assert_true(in.cache <= m.cache && in.planned == m.planned - (m.cache - in.cache));
    assert_true(in.offloaded == m.offloaded && m.planned <= m.mem_limit);
    assert_int_equal(in.io_depth, m.plan.io_depth);
    assert_int_equal(in.threads, m.plan.threads);
    assert_int_equal(pi2_engine_threads(eng), m.plan.threads);
    assert_true(in.gate_first == m.plan.gate_first);
    assert_string_equal(in.plan_source, m.source);
    assert_true((in.plan != NULL) == m.predicted);
    if (in.plan) {
        assert_memory_equal(in.plan->hot_groups, m.plan.hot_groups, m.plan.n_ffn * sizeof(uint32_t));
        assert_memory_equal(in.plan->gate_groups, m.plan.gate_groups, m.plan.n_ffn * sizeof(uint32_t));
        assert_true(in.plan->pred.decode_ms == m.plan.pred.decode_ms);
    }
    pi2_engine_close(eng);
    pi2_plan_memory_free(&m);
}

static void test_memory_model(void **state)
{
    (void)state;
    char dir[64], src[160], path[2][1200];
    pi2_err e = {0};
    pi2_sign_key *key = NULL, *pk = NULL;
    pi2t_tmpdir(dir, sizeof dir);
    assert_int_equal(pi2t_keypair(dir, "k", &key, &pk, &e), 0);
    for (int k = 0; k < 2; k++) { /* dReLU (two-phase) with predictors; MoE */
        pi2_synth_opts so;
        assert_int_equal(pi2_synth_preset(k == 0 ? "tiny" : "moe", &so, &e), 0);
        so.threads = 1;
        so.predictors = true;
        so.desc.n_layers = 2;
        if (k == 1) {
            so.desc.hidden = 128;
            so.desc.n_ff = 256;
            so.desc.n_experts = 4;
            so.desc.n_experts_used = 2;
        }
        snprintf(src, sizeof src, "%s/m%d", dir, k);
        if (pi2_synth_write(src, &so, NULL, NULL, &e) ||
            pi2t_convert_bundle(src, dir, k == 0 ? "drelu" : "moe", PI2_QT_Q4, 4096, key, path[k], sizeof path[k], &e))
            fail_msg("model %d: %s", k, e.msg);
    }
    snprintf(src, sizeof src, "%s/drelu.pi2c", dir);
    check_scales_in_slots(src, path[0], pk);
    pi2_hwprof hw;
    pi2t_fake_hw(&hw, MEM_THREADS);
    for (int k = 0; k < 2; k++) {
        pi2_engine_opts o;
        pi2_plan_memory m;
        uint64_t minimum[3], ffn = 0;
        int depths[3] = {1, 64, 200};
        for (int di = 0; di < 3; di++) { /* the minimum at each depth (its read staging) */
            mem_opts(&o, path[k], pk, 1ull << 40);
            o.offload.io_depth = depths[di];
            assert_int_equal(plan_of(&o, &m, &e), 0);
            minimum[di] = m.minimum;
            ffn = m.ffn_total;
            assert_true(m.hot == ffn && m.offloaded == 0.0);
            pi2_plan_memory_free(&m);
        }
        assert_true(minimum[0] < minimum[1] && minimum[1] < minimum[2]);
        /* the minimum opens; a byte less is refused, naming the limit and not a flag */
        mem_opts(&o, path[k], pk, minimum[1] - 1);
        pi2_engine *eng = NULL;
        pi2_err_clear(&e);
        assert_int_equal(pi2_engine_open(&eng, &o, &e), PI2_ENOMEM);
        assert_non_null(strstr(e.msg, "the memory limit"));
        assert_null(strstr(e.msg, "--"));
        assert_true(e.msg[0] != 0); /* the same limit passes at a shallower depth */
        mem_opts(&o, path[k], pk, minimum[1] - 1);
        o.offload.io_depth = 1;
        agrees(&o);
        double shares[4] = {0.0, 0.3, 0.5, 1.0};
        for (int step = 0; step < 5; step++)
            for (int si = 0; si < 4; si++) {
                int di = (step + si) % 3;
                mem_opts(&o, path[k], pk, minimum[di] + ffn * (uint64_t)step / 4);
                o.offload.hot_share = shares[si];
                o.offload.io_depth = depths[di];
                o.offload.gate_first = si == 2;
                agrees(&o);
                if (si == 1) { /* the fixed split predicted, and the solver's plan */
                    o.offload.hw = &hw;
                    o.offload.fixed_split = true;
                    agrees(&o);
                    o.offload.fixed_split = false;
                    if (depths[di] > 1) /* the solver's shallowest is 16: the minimum at depth 1 is too little */
                        agrees(&o);
                }
            }
    }
    pi2_sign_key_free(key);
    pi2_sign_key_free(pk);
    pi2t_rmtree(dir);
}

/* Streamed predictors in the memory plan of model path (can: q8/q4 ones,
 * which stream; f16 ones cannot): resident while the limit holds them;
 * below that, out of the resident part, their ring counted in the buffers
 * and listed as the predictors; the least limit (streamed) opens, as
 * planned, and one byte less is refused. */
static void pred_stream_plan(const char *path, const pi2_sign_key *pk, bool can)
{
    pi2_engine_opts o;
    pi2_plan_memory big, at;
    pi2_err e = {0};
    mem_opts(&o, path, pk, 1ull << 40);
    assert_int_equal(plan_of(&o, &big, &e), 0);
    assert_false(big.pred_stream);
    if (!can) {
        assert_true(big.least == big.minimum);
        pi2_plan_memory_free(&big);
        return;
    }
    assert_true(big.least < big.minimum);
    mem_opts(&o, path, pk, big.least);
    assert_int_equal(plan_of(&o, &at, &e), 0);
    assert_true(at.pred_stream && at.items.pred_streamed);
    assert_true(at.minimum == big.least && at.least == big.least);
    assert_true(at.stream_skipped > 0 && at.ring > 0 && at.items.pred == at.ring);
    assert_true(at.resident == big.resident - at.stream_skipped);
    assert_true(at.buffers == big.buffers + at.ring);
    assert_true(at.planned <= at.mem_limit);
    agrees(&o);
    pi2_plan_memory m2;
    mem_opts(&o, path, pk, big.least - 1);
    assert_int_equal(plan_of(&o, &m2, &e), PI2_ENOMEM);
    assert_non_null(strstr(e.msg, "(streamed ring)"));
    /* never streamed when asked not to: the resident minimum holds */
    o.offload.mem_limit = big.least;
    o.offload.pred_stream = -1;
    assert_int_equal(plan_of(&o, &m2, &e), PI2_ENOMEM);
    pi2_plan_memory_free(&big);
    pi2_plan_memory_free(&at);
}

/* A temp dir (dir, 64 bytes) with a key pair and, in src (160 bytes), a
 * generated tiny model of `layers` layers with predictors. */
static void tiny_pred_model(char *dir, char *src, int layers, pi2_sign_key **key, pi2_sign_key **pk)
{
    pi2_err e = {0};
    pi2t_tmpdir(dir, 64);
    assert_int_equal(pi2t_keypair(dir, "k", key, pk, &e), 0);
    pi2_synth_opts so;
    assert_int_equal(pi2_synth_preset("tiny", &so, &e), 0);
    so.threads = 1;
    so.predictors = true;
    so.desc.n_layers = layers;
    snprintf(src, 160, "%s/m", dir);
    assert_int_equal(pi2_synth_write(src, &so, NULL, NULL, &e), 0);
}

/* The planner counts the predictors as the engine holds them: the Q8 copy
 * of f16 predictors, q8/q4 members in place; and prices them at their type. */
static void test_pred_bytes(void **state)
{
    (void)state;
    char dir[64], src[160], path[1200], name[16];
    pi2_err e = {0};
    pi2_sign_key *key = NULL, *pk = NULL;
    tiny_pred_model(dir, src, 2, &key, &pk);
    pi2_qtype qs[3] = {PI2_QT_F32, PI2_QT_Q8, PI2_QT_Q4};
    uint64_t bytes[3];
    for (int k = 0; k < 3; k++) {
        snprintf(name, sizeof name, "p%d", k);
        if (pi2t_convert_bundle_q(src, dir, name, PI2_QT_Q4, PI2_QT_Q8, qs[k], false, 4096, key, path, sizeof path, &e))
            fail_msg("model %d: %s", k, e.msg);
        for (int off = 0; off < 2; off++) { /* in memory and offloading (the resident region read in) */
            pi2_engine_opts o;
            mem_opts(&o, path, pk, off ? 1ull << 40 : 0);
            pi2_engine *eng = NULL;
            if (pi2_engine_open(&eng, &o, &e))
                fail_msg("open %d: %s", k, e.msg);
            pi2_bundle *b = NULL;
            pi2_bundle_open_opts bo = {.pubkey = pk};
            assert_int_equal(pi2_bundle_open(&b, path, &bo, &e), 0);
            const pi2_ctr_member *m0 = pi2_ctr_at(pi2_bundle_container(b), 0);
            pi2_mprof mp;
            assert_int_equal(pi2_mprof_build(&mp, pi2_bundle_manifest(b), pi2_bundle_layout_get(b),
                                             m0->data - m0->offset, UINT64_MAX, path, &e),
                             0);
            uint64_t sum = 0;
            for (uint32_t i = 0; i < mp.n_ffn; i++) {
                sum += mp.ffn[i].pred_bytes;
                assert_int_equal(mp.ffn[i].pred_qt, qs[k] == PI2_QT_Q4 ? PI2_QT_Q4 : PI2_QT_Q8);
            }
            if (sum != pi2_engine_pred_bytes(eng) || sum == 0)
                fail_msg("predictors at %s: the planner counts %llu bytes, the engine holds %llu", name,
                         (unsigned long long)sum, (unsigned long long)pi2_engine_pred_bytes(eng));
            bytes[k] = sum;
            pi2_mprof_free(&mp);
            pi2_bundle_close(b);
            pi2_engine_close(eng);
        }
        pred_stream_plan(path, pk, qs[k] != PI2_QT_F32);
    }
    assert_true(bytes[0] == bytes[1] && bytes[2] < bytes[1]); /* f16 runs as its Q8 copy; q4 is smaller */
    pi2_sign_key_free(key);
    pi2_sign_key_free(pk);
    pi2t_rmtree(dir);
}

/* Streamed attention in the memory plan of path (L layers; pred: its
 * predictors stream too): kept resident while the limit holds it; below
 * that, the least number of layers that fits streams (the last ones),
 * counted as the ring in the buffers; the least limit streams every
 * layer's and drops by the attention's bytes less the ring's growth. */
static void attn_stream_plan(const char *path, const pi2_sign_key *pk, int L, bool pred)
{
    pi2_engine_opts o;
    pi2_plan_memory big, kept, at, ak, m;
    pi2_err e = {0};
    mem_opts(&o, path, pk, 1ull << 40);
    assert_int_equal(plan_of(&o, &kept, &e), 0); /* the attention resident: its least */
    o.offload.attn_stream = 0;
    assert_int_equal(plan_of(&o, &big, &e), 0);
    assert_true(big.attn_stream == 0 && !big.pred_stream && big.ring == 0);
    assert_true(big.least < kept.least);
    mem_opts(&o, path, pk, kept.least);
    assert_int_equal(plan_of(&o, &ak, &e), 0);
    assert_true(ak.attn_stream == 0 && ak.pred_stream == pred);
    o.offload.attn_stream = 0; /* the limit that keeps it resident: kept resident */
    assert_int_equal(plan_of(&o, &m, &e), 0);
    assert_true(m.attn_stream == 0 && m.minimum == kept.least);
    pi2_plan_memory_free(&m);
    /* one byte less: the least number of layers that fits streams */
    o.offload.mem_limit = kept.least - 1;
    assert_int_equal(plan_of(&o, &m, &e), 0);
    int n = m.attn_stream;
    assert_true(n > 0 && m.items.attn_streamed == n && m.planned <= m.mem_limit);
    pi2_plan_memory_free(&m);
    o.offload.attn_stream = n > 1 ? n - 1 : -1;
    assert_int_equal(plan_of(&o, &m, &e), PI2_ENOMEM);
    pi2_err_clear(&e);
    /* each count forced: the automatic choice at its minimum streams no more */
    for (int k = 1; k <= L; k++) {
        mem_opts(&o, path, pk, 1ull << 40);
        o.offload.attn_stream = k;
        assert_int_equal(plan_of(&o, &m, &e), 0);
        assert_true(m.attn_stream == k);
        o.offload.mem_limit = m.minimum;
        o.offload.attn_stream = 0;
        pi2_plan_memory_free(&m);
        assert_int_equal(plan_of(&o, &m, &e), 0);
        assert_true(m.attn_stream <= k);
        pi2_plan_memory_free(&m);
    }
    /* the least: every layer's streamed; it drops by the attention's bytes
     * less the ring's growth, with the overhead's shares of them */
    mem_opts(&o, path, pk, big.least);
    o.offload.attn_stream = 0;
    assert_int_equal(plan_of(&o, &at, &e), 0);
    assert_true(at.attn_stream == L && at.items.attn_streamed == L && at.pred_stream == pred);
    assert_true(at.minimum == big.least && at.least == big.least);
    uint64_t saved = (at.stream_skipped - ak.stream_skipped) - (at.ring - ak.ring), drop = kept.least - big.least;
    if (drop < saved || drop > saved + saved / 50 + 16)
        fail_msg("least %llu, attention resident %llu: %llu less, the attention saves %llu",
                 (unsigned long long)big.least, (unsigned long long)kept.least, (unsigned long long)drop,
                 (unsigned long long)saved);
    assert_true(at.buffers == ak.buffers + (at.ring - ak.ring));
    char text[1024], want[64];
    pi2_plan_items_text(&at.items, MEM_CTX, text, sizeof text);
    snprintf(want, sizeof want, "(%d layers streamed)", L);
    assert_non_null(strstr(text, want));
    agrees(&o);
    o.offload.mem_limit = big.least - 1;
    pi2_err_clear(&e);
    assert_int_equal(plan_of(&o, &m, &e), PI2_ENOMEM);
    if (!strstr(e.msg, want))
        fail_msg("%s", e.msg);
    fprintf(stderr, "  %d layers%s: least %.2f MB, %.2f MB with the attention resident (%.2f MB saved)\n", L,
            pred ? ", predictors streamed" : "", (double)big.least / 1048576.0, (double)kept.least / 1048576.0,
            (double)saved / 1048576.0);
    pi2_plan_memory_free(&big);
    pi2_plan_memory_free(&kept);
    pi2_plan_memory_free(&at);
    pi2_plan_memory_free(&ak);
}

/* Streamed attention on a model of six layers: q8 predictors (streamed
 * with it) and f16 ones (resident: the ring holds the attention alone). */
static void test_attn_stream(void **state)
{
    (void)state;
    char dir[64], src[160], path[1200], name[16];
    pi2_err e = {0};
    pi2_sign_key *key = NULL, *pk = NULL;
    tiny_pred_model(dir, src, 6, &key, &pk);
    pi2_qtype qs[2] = {PI2_QT_Q8, PI2_QT_F32};
    for (int k = 0; k < 2; k++) {
        snprintf(name, sizeof name, "a%d", k);
        if (pi2t_convert_bundle_q(src, dir, name, PI2_QT_Q4, PI2_QT_Q8, qs[k], false, 4096, key, path, sizeof path, &e))
            fail_msg("model %d: %s", k, e.msg);
        attn_stream_plan(path, pk, 6, qs[k] == PI2_QT_Q8);
    }
    pi2_sign_key_free(key);
    pi2_sign_key_free(pk);
    pi2t_rmtree(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_solver_one_phase), cmocka_unit_test(test_solver_two_phase),
        cmocka_unit_test(test_moe_routing),
        cmocka_unit_test(test_cost_model),       cmocka_unit_test(test_infeasible),
        cmocka_unit_test(test_calibration),      cmocka_unit_test(test_plan_json),
        cmocka_unit_test(test_memory_model),     cmocka_unit_test(test_pred_bytes),
        cmocka_unit_test(test_attn_stream),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
