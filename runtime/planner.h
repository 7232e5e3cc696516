/* pi2 execution planner: from a model profile (the container) and a
 * hardware profile (runtime/hwprof.h), predict decode and prefill speed for
 * an offloading plan, and choose the plan that decodes fastest within a
 * memory limit.
 *
 * ---- Model profile (pi2_mprof_build) ----
 * Per FFN (layer, expert), from the bundled container's manifest, layout and
 * resident members:
 *   geometry      neurons, group g, groups G, slot bytes S, gate part P_g,
 *                 row bytes R (bundle/layout.h);
 *   hot/cold      the profiled activation frequency of each neuron (bundled
 *                 order: hot to cold) and, from the profile's bit samples
 *                 (the neuron sets the runtime selects: predictor output on
 *                 predictor models), for every group k the share of tokens
 *                 p_k that select at least one of its neurons and the mean
 *                 count n_k selected in it; p_k is what a cold group costs:
 *                 one read when any of its neurons is needed;
 *   co-activation the bundle's cold read efficiency, and n_k / p_k (neurons
 *                 used per group read);
 *   per token     selected neurons (mean popcount of the samples) and firing
 *                 neurons (the profile's active fraction);
 *   predictor     fc1 + fc2 bytes as decode runs them (pi2_plan_pred_bytes);
 *                 attention and head bytes; KV bytes;
 *   routing       MoE: how often each expert runs per token (w_f below).
 * Expected misses as a function of cache size: a static hot set of the
 * first H groups (plus, on two-phase models, the gate parts of the first
 * G >= H groups) leaves the reads of the groups past it; each neuron is
 * selected with its sampled frequency, independently (the bundle grouped
 * neurons on these very samples, so their joint counts overstate how many
 * neurons share a read on new text; runtime/PERF.md, Planner). The LRU
 * cache is left out: plans leave it at its smallest, where it adds little.
 *
 * ---- Cost model (pi2_plan_predict) ----
 * Per decode token, per layer l (FFN f), with t compute threads, depth d:
 *   C_l   attention weights / gemv_q8(t) + KV reads / mem_bw(t)
 *         + predictor bytes / gemv_q8(t) (gemv_q4(t) for q4 predictors)
 *         + sel_f * gather(R) + fired_f * (gather(R) + down(R))   (ns/row)
 *   IO_l  reads_f(H, G) at request size s, all submitted at once: below
 *         one read n * latency(s, 1); up to the deepest probed depth
 *         within d, linear between the probed depths' batch times
 *         (latency(s, 1) at 1, d' / iops(s, d') at d' = 4, 16, 32, 64);
 *         past it the rest at iops(s, d'); two-phase with
 *         gate-first (or gates kept hot without their up+down) adds the
 *         up+down round of the fired groups; plus the I/O thread's copy
 *         of the bytes read (bytes / mem_bw(1));
 *   t_l   k_c C_l + k_io IO_l - overlap(t) * hide(k_c A_l, k_io IO_l),
 *         hide(X, Y) = X + Y - sqrt(X^2 + Y^2), the part of the shorter
 *         that hides under the other: nearly all of it when the other is
 *         much longer, 59% when the two are equal (a layer's missing
 *         parts are read only once its predictor has run, and the layer
 *         ends with its last read's rows; hiding all of the shorter,
 *         min(X, Y), predicted 1 compute thread too fast: PERF.md);
 *         IO_l with the learned read-ahead reads (extra x cold share, one
 *         neuron each), overlap(t) the hardware profile's when the I/O
 *         thread has a core of its own (t < cores; the profile places its
 *         reader so too), else 0 (with the I/O thread sharing the cores,
 *         little of either hides: PERF.md); A_l the compute the reads can
 *         hide under: all of C_l (the read-ahead's reads fly during the
 *         attention, the missing parts' during the predictor and the held
 *         parts' rows, and each missing part is computed as its read lands
 *         while the others fly)
 * Every FFN's time counts w_f times per token: 1 on dense models; on MoE
 * ones top-k x the expert's routing share from the profile (route_share;
 * top-k / experts when the profile has none), with the layer's attention
 * shared among the top-k experts, so the solver gives frequently routed
 * experts more hot groups.
 * plus the output head (k_c bytes / gemv_q8(t)). overlap is the hardware
 * profile's overlap(t), the share of the shorter of compute and reads that
 * its probe hid under the other (scaling hide); k_c, k_io and the extra reads are the model's
 * learned figures (pi2_plan_cal).
 * Reads are the static-hot curve (reads_f(H) = sum of p_k over cold groups).
 * Prefill per token: attention + FFN MACs / matmul(t) for a 64-token tile,
 * plus the cold FFN bytes streamed at seq_bps once per prompt of
 * `prompt` tokens, overlapped the same way.
 *
 * ---- Solver (pi2_plan_solve) ----
 * Decision variables: per FFN H (hot groups) and G (two-phase: groups whose
 * gate part is also kept, G >= H; searched only with gate_only: the cost
 * model prices an 8 KiB up+down read at the disk's 8 KiB rate, about half
 * a 24 KiB one, and so favours gate-only groups, but runs with them were
 * slower (PERF.md): the engine pays a read about the same whatever its size
 * (its I/O thread's CPU), and a fired neuron's up+down costs a second
 * round; given plans can still use them), compute threads t in 1..threads, I/O
 * depth d in {16, 32, 64, 128}, gate-first (two-phase). For each (t, d,
 * gate-first) the per-layer choices are discretised in steps of
 * ceil(groups / 48) groups and solved exactly as a multiple-choice knapsack
 * (dynamic programming over memory in units of one step of gate parts):
 * minimise sum_l t_l subject to sum of hot memory <= the FFN budget
 * (mem_limit minus resident, KV, buffers, overhead and the smallest neuron
 * cache). The best (t, d, gate-first) wins, unless it is predicted less
 * than min_gain (8%) faster than the fixed split (pi2_plan_fixed: equal hot
 * slots, all threads, depth 64, up+down read with a missing gate), which is
 * then kept: the model's error is larger than such differences (PERF.md,
 * Planner). A memory limit that holds
 * every FFN payload puts everything hot. With min_speed > 0 a plan slower
 * than it is PI2_ERANGE "infeasible", naming the best speed and the memory
 * that would reach min_speed (or that none does). The search is exact for
 * the discretised problem: tests compare it with brute force.
 *
 * ---- Plan JSON (pi2_plan_save / pi2_plan_load), version 1 ----
 * { "version": 1, "model": str (signature or path), "mem_limit": int,
 *   "threads": int, "io_depth": int, "gate_first": bool,
 *   "hot_groups": [int x n_ffn], "gate_groups": [int x n_ffn],
 *   "predicted": { "decode_tok_s", "decode_ms", "prefill_tok_s",
 *                  "compute_ms", "io_ms", "head_ms", "reads_per_token",
 *                  "mb_per_token", "hit_rate", "hot_mb", "offloaded" } }
 * "predicted" only when the plan was predicted with a hardware profile.
 * pi2-run plan adds "source", "memory" (the memory plan) and, without a
 * hardware profile, "note", which load accepts and ignores. Load checks keys, types and ranges (hot_groups[i] <= groups, gate_groups
 * in [hot_groups, groups]); the engine checks the plan fits the model and
 * the memory limit.
 */
#ifndef PI2_PLANNER_H
#define PI2_PLANNER_H

#include "bundle/bundle.h"
#include "formats/common.h"
#include "runtime/hwprof.h"

#include <stdint.h>

typedef struct pi2_mprof_ffn {
    uint32_t neurons, group, groups, words;
    double sel;        /* selected neurons per token (mean) */
    double fired;      /* firing neurons per token (mean) */
    double read_eff;   /* bundle's cold read efficiency (0 when unknown) */
    double w;          /* runs per token: 1 dense; an expert top-k x its routing share */
    uint64_t pred_bytes; /* the predictor as decode runs it (pi2_plan_pred_bytes) */
    pi2_qtype pred_qt;   /* ... at this type */
    double *p;         /* [groups] share of tokens that select any neuron of the group */
    double *n;         /* [groups] mean selected neurons of the group per token */
    double *q;         /* [groups] share of tokens where a neuron of the group fires */
    double *sp0;       /* [groups] mean bytes of a read of the group: whole neurons (one-phase) or
                          gate through up+down (two-phase) */
    double *spg, *spu; /* [groups] mean bytes of a gate read, of an up+down read */
    const uint64_t *bits; /* [samples][words] in the container, or NULL */
    const float *freq;    /* [neurons] profiled frequency, or NULL */
} pi2_mprof_ffn;

/* What static profiles cannot know, learned from this model's own runs on
 * this machine (pi2_plan_cal_update):
 *   compute  a factor on the model's compute time per thread count (k_c):
 *            dispatch, imbalance and per-layer work the kernel figures miss;
 *   reads    a factor on the modelled read time per thread count (k_io):
 *            a disk's rates drift from those the profile measured, and the
 *            I/O thread sharing a core with a compute thread reads slower
 *            than on a core of its own;
 *            a thread count run little or not yet leans on (takes) the mean
 *            over all thread counts of each factor;
 *   extra    reads per token per FFN, at a cold share of 1, of neurons the
 *            read-ahead fetched (predicted from the residual before
 *            attention) that the FFN then did not select: mispredictions
 *            spread over all neurons, so they scale with the cold share
 *            (0 until learned; the figures are in PERF.md).
 * Each run gives k_c (with k_io as learned so far) and k_io (with k_c so
 * far) from T = k_c C + k_io IO - overlap hide(k_c A, k_io IO), each
 * weighed by how much it moves the run's time, so runs mostly in memory
 * teach k_c and runs mostly reading k_io; older runs weigh 0.8 per newer
 * one. The sums keep the means' state. */
typedef struct pi2_plan_cal {
    double extra;
    int runs;
    double s_w[PI2_HW_MAX_THREADS], s_wk[PI2_HW_MAX_THREADS]; /* compute factor by thread count: s_wk / s_w */
    double s_io_w[PI2_HW_MAX_THREADS], s_io_wk[PI2_HW_MAX_THREADS]; /* read-time factor likewise */
    double s_ex, n_ex;
} pi2_plan_cal;

typedef struct pi2_mprof {
    int n_layers, experts, top_k, hidden, n_ff, ctx;
    uint32_t n_ffn; /* n_layers * max(experts, 1) */
    bool two_phase;
    pi2_qtype q_ffn, q_other, q_head; /* q_head: the head's (or tied embedding's) own */
    uint64_t R, S, Pg;    /* row bytes (payload and scales), slot bytes, gate part */
    uint64_t Gb, Ub;      /* a neuron's gate unit (0 one-phase) and bundle (3R, or 2P up+down): bundle/layout.h */
    uint64_t attn_bytes;  /* per layer: q, k, v, o payload + scales */
    uint64_t head_bytes;  /* output head */
    uint64_t kv_per_pos;  /* KV bytes per position per layer (f32 k and v) */
    uint64_t ffn_total;   /* FFN payload bytes */
    uint64_t samples;     /* bit samples per FFN (0: none, p from frequencies) */
    bool bits_selected;   /* samples are the selected sets (else activations) */
    pi2_mprof_ffn *ffn;   /* [n_ffn] */
    pi2_plan_cal cal;     /* defaults from build; callers may set it */
    int cores;            /* online CPUs (0: unknown: the I/O thread is assumed to have a core) */
} pi2_mprof;

/* Bytes the engine holds for predictor p of an FFN of `neurons` neurons
 * on a model of hidden size `hidden`, and (qt, may be NULL) the type
 * decode runs it at: q8/q4 predictors are used in place (their payloads
 * and scales), f32/f16 ones as the Q8 copy open makes (fc2's rows padded
 * to 32 columns). pi2_engine_pred_bytes sums what the engine holds. */
uint64_t pi2_plan_pred_bytes(const pi2_mf_predictor *p, int hidden, uint32_t neurons, pi2_qtype *qt);

/* Build from a bundled container's manifest and layout; `base` points at
 * file offset 0 of (at least) the resident region, where the profile and
 * predictor members are. PI2_ESHAPE / PI2_ENOTFOUND for inconsistent input,
 * PI2_ENOMEM. */
int pi2_mprof_build(pi2_mprof *mp, const pi2_manifest *mf, const pi2_bundle_layout *bl, const uint8_t *base,
                    uint64_t base_len, const char *name, pi2_err *err);
void pi2_mprof_free(pi2_mprof *mp);

/* The offloading parameters a plan fixes. */
typedef struct pi2_plan {
    uint64_t mem_limit;
    int threads, io_depth;
    bool gate_first;
    uint32_t n_ffn;
    uint32_t *hot_groups;  /* [n_ffn] */
    uint32_t *gate_groups; /* [n_ffn], >= hot_groups; == hot_groups on one-phase models */
    bool fixed_split;      /* the fixed split's settings: pi2_plan_fixed's, or kept by the solver (min_gain) */
    struct pi2_plan_pred {
        double decode_tok_s, decode_ms, prefill_tok_s;
        double compute_ms, io_ms, head_ms;
        double reads_per_token, mb_per_token, hit_rate;
        double hot_mb, offloaded;
        double raw_compute_ms, raw_io_ms, raw_reads, raw_cold; /* before calibration (cold: sum of FFN cold shares) */
        double overlap;       /* used */
        double raw_window_ms; /* compute the reads can hide under (all but the head) */
    } pred;
} pi2_plan;

/* Memory the engine needs besides the hot segment, for the solver: fixed
 * (resident, KV, buffers, overhead) at I/O depth 0 plus per_depth bytes per
 * request in flight, and the smallest neuron cache: min_slots slots of each
 * kind, slot_bytes[k] bytes per slot with its index record (kind 0: gates,
 * or whole neurons on one-phase models; kind 1: up+down). */
typedef struct pi2_plan_mem {
    uint64_t fixed, per_depth, min_slots, slot_bytes[2];
} pi2_plan_mem;

typedef struct pi2_plan_opts {
    uint64_t mem_limit;
    int threads;      /* most compute threads (>= 1) */
    int max_depth;    /* 0: 128 */
    double min_speed; /* tok/s, 0: none */
    int prompt;       /* prompt length for the prefill figure (0: 128) */
    bool fixed_only;  /* do not search: the fixed split (equal hot slots, 2 threads, depth 64) */
    double min_gain;  /* keep the fixed split unless the search is predicted this much faster (default 0.08;
                         0: the exact optimum) */
    bool gate_only;   /* two-phase: also search gate-only groups (default off, see above) */
} pi2_plan_opts;

void pi2_plan_opts_defaults(pi2_plan_opts *o);
int pi2_plan_alloc(pi2_plan *p, uint32_t n_ffn, pi2_err *err);
void pi2_plan_free(pi2_plan *p);

/* Bytes of hot memory a plan keeps for FFN i. */
uint64_t pi2_plan_hot_bytes(const pi2_mprof *mp, const pi2_plan *p, uint32_t i);

/* Fill p->pred for the plan's settings (prompt: tokens of the prefill
 * figure, 0: 128). */
void pi2_plan_predict(const pi2_mprof *mp, const pi2_hwprof *hw, pi2_plan *p, int prompt);

/* Choose the plan (see above) into *out (allocated here; pi2_plan_free).
 * PI2_ENOMEM when the limit cannot hold the resident part, PI2_ERANGE when
 * min_speed is infeasible (message says why). */
int pi2_plan_solve(const pi2_mprof *mp, const pi2_hwprof *hw, const pi2_plan_mem *mem, const pi2_plan_opts *o,
                   pi2_plan *out, pi2_err *err);
/* The fixed split, run without a plan: what the limit leaves past the
 * fixed costs at io_depth holds every FFN whole when it can; else
 * hot_share (outside [0, 1]: 0.5) of what the smallest caches leave is
 * shared equally between the FFNs, each keeping its first whole groups of
 * neurons hot (gates included: gate groups = hot groups). The plan runs
 * threads compute threads at io_depth, gate-first as given (two-phase
 * models only). PI2_ENOMEM when the limit cannot hold the fixed costs and
 * the smallest caches. The solver compares its plans with this split at
 * hot_share 1, depth 64, no gate-first. */
int pi2_plan_fixed(const pi2_mprof *mp, const pi2_plan_mem *mem, uint64_t mem_limit, int threads, int io_depth,
                   double hot_share, bool gate_first, pi2_plan *out, pi2_err *err);

void pi2_plan_cal_defaults(pi2_plan_cal *c);
/* Fold one run of plan p (its predictions filled) into c: measured decode
 * tok/s and reads per token. Runs with fewer than 8 tokens should not be
 * passed. */
void pi2_plan_cal_update(pi2_plan_cal *c, const pi2_plan *p, double tok_s, double reads);
/* {"version":6,"extra_reads":x,"runs":n,"reads_sums":[2],"compute_sums":[[w,wk] x 16],
 * "io_sums":[[w,wk] x 16]};
 * load gives PI2_ENOTFOUND for a missing file, PI2_EFORMAT / PI2_ERANGE
 * for a bad one. */
int pi2_plan_cal_save(const pi2_plan_cal *c, const char *path, pi2_err *err);
int pi2_plan_cal_load(const char *path, pi2_plan_cal *c, pi2_err *err);

/* ---- Memory model (pi2_plan_memory_make) ----
 * The offloading engine's footprint at a memory limit (runtime/offload/
 * offload.h), from what the container says and the run's options alone:
 * the engine plans with it before it allocates anything, pi2-run plan
 * without opening an engine. Fixed costs:
 *   resident  the resident region less the f32 predictors given back once
 *             their Q8 copy is made (pi2_plan_resident), and less what
 *             streams: the q8/q4 predictors (pred_stream) and the
 *             attention projections of the last attn_stream layers, read
 *             a layer at a time through one ring of pi2_plan_ring_slots
 *             layers that counts with the buffers. Chosen as the options
 *             say, else the first of: nothing, the predictors, then the
 *             predictors and the attention of 1, 2, ... layers, that the
 *             limit holds (a resident byte serves every token); `least`
 *             is the smallest limit with everything that can stream
 *             streamed, the one pi2-run plan starts its table at; a
 *             predicted plan's decode time then counts the ring's reads,
 *             every streamed layer's each token, at the sequential rate,
 *             unhidden;
 *   kv        the KV cache for ctx positions, and each thread's attention
 *             scores;
 *   buffers   the engine's and the offloader's (pi2_engine_buffer_sizes:
 *             the same function sizes their allocations), with the read
 *             staging at the I/O depth, and the neuron caches' indexes;
 *   files     the page cache of what the run reads outside its direct
 *             reads, the check after generating's windows included
 *             (pi2_plan_container_touched);
 *   overhead  pi2_plan_overhead, plus 1/PI2_PLAN_KERNEL_SHARE of what the
 *             run can use (the limit, or everything in memory when that
 *             is less): page tables and kernel memory charged with it.
 * Past them: the smallest neuron cache (an eighth of an FFN's neurons, at
 * least a decode chunk, per cache kind); `minimum` is the smallest limit
 * holding all that, or open's peak (open_peak) when larger, its own
 * kernel share included. The rest goes to the
 * hot segment and the cache: a plan given in the options (checked against
 * the model, the threads and the reader's depth), else the solver's with
 * a hardware profile (unless fixed_split), else the fixed split
 * (pi2_plan_fixed at the options' hot_share, io_depth and gate_first;
 * predicted when a hardware profile is given). The cache gets what the
 * hot segment leaves: the smallest cache of each kind, the rest split
 * 1 : 2 between gates and up+down on two-phase layouts (about R + 2C : 2R
 * a neuron: a gate unit, an up+down entry with its scales),
 * never more slots than neurons. */
/* The process beside its counted allocations: code and shared
 * libraries' pages and the C library's own state (PI2_PLAN_OVERHEAD),
 * each thread's stack and allocator arena (PI2_PLAN_THREAD_OVERHEAD),
 * and the allocator's slack on `sized` bytes of allocations
 * (1/PI2_PLAN_SLACK_SHARE): sized from the model, so a small model's
 * floor is small. */
#define PI2_PLAN_OVERHEAD (16ull << 20)
#define PI2_PLAN_THREAD_OVERHEAD (1ull << 20)
#define PI2_PLAN_SLACK_SHARE 128
uint64_t pi2_plan_overhead(int threads, uint64_t sized);
#define PI2_PLAN_KERNEL_SHARE 256

struct pi2_offload_opts;

/* What the engine holds besides the weights and the KV cache, as a
 * function of the model's shape and the thread count: filled by
 * pi2_engine_buffer_sizes (runtime/engine.h), which the engine and the
 * offloader size their allocations with. */
typedef struct pi2_plan_bufs {
    uint64_t engine;        /* activations, thread scratch, row tables, predictor copies */
    uint64_t offload;       /* the offloader's own at I/O depth 0 ... */
    uint64_t per_depth;     /* ... plus this per read in flight */
    uint64_t slot_bytes[2]; /* a neuron cache slot with its record: gates (whole neurons on one-phase
                               layouts), up+down */
    uint64_t per_pos;       /* bytes per KV position: the cache, each thread's attention scores and
                               (fp16 cache) its unit's rows as f32 */
    uint32_t kv_elem;       /* bytes of one cached key or value element: 4, or 2 (fp16) */
    uint32_t chunk;         /* neurons per decode chunk */
} pi2_plan_bufs;

typedef struct pi2_plan_mem_in {
    const pi2_manifest *mf;
    const pi2_bundle_layout *bl;
    const char *name;               /* the container, for messages */
    const uint8_t *base;            /* file offset 0 of (at least) the resident region: the profile the */
    uint64_t base_len;              /* solver reads (pi2_mprof_build) */
    uint64_t resident;              /* pi2_plan_resident */
    pi2_plan_bufs bufs;             /* pi2_engine_buffer_sizes at `threads` */
    int ctx;                        /* KV positions */
    int threads;                    /* compute threads asked for (a plan may run fewer) */
    int cores;                      /* online CPUs (0: unknown) */
    uint64_t files;                 /* page cache of the files the run reads outside its direct reads:
                                       pi2_plan_container_touched */
    const struct pi2_offload_opts *opts;
} pi2_plan_mem_in;

/* The resident part item by item: what pi2-run plan lists, and what the
 * message of a limit below the minimum names. */
typedef struct pi2_plan_items {
    uint64_t attn;       /* attention projections of the layers that keep them resident */
    uint64_t embed_head; /* embeddings and output head */
    uint64_t norms;
    uint64_t pred;       /* predictors as decode runs them (pi2_plan_pred_bytes; Q8 copies included),
                            or (pred_streamed) the bytes of the ring */
    bool pred_streamed;
    int attn_streamed;   /* layers whose attention streams: out of attn, which holds the ring when the
                            predictors do not stream */
    uint64_t other;      /* the rest of the resident region: profiles, router, tokenizer, manifest */
    uint64_t buffers;    /* the engine's and the offloader's, predictor copies left out */
    uint64_t kv, files, overhead, min_cache;
} pi2_plan_items;

typedef struct pi2_plan_memory {
    uint64_t mem_limit;
    uint64_t resident, kv, buffers, overhead; /* the fixed costs, buffers with the read staging at the
                                                 options' I/O depth (as the minimum) */
    uint64_t files;                /* page cache of the files read (pi2_plan_mem_in) */
    uint64_t fixed;                /* their sum, the staging at the plan's depth */
    uint64_t open_peak;            /* what open holds at most: the whole resident region (f32/f16
                                      predictors included, each given back as its Q8 copy is made:
                                      one copy per thread beyond it), buffers, files */
    uint64_t min_slots;            /* of each cache kind, at the least */
    pi2_plan_items items;
    uint64_t ffn_total;            /* FFN payload bytes */
    uint64_t index;                /* of buffers: the caches' indexes */
    uint64_t min_cache, minimum;
    uint64_t least;                /* the smallest runnable limit with everything that can stream
                                      streamed (the minimum when nothing can) */
    bool pred_stream;              /* the predictors stream through the ring (counted in buffers) */
    int attn_stream;               /* so does the attention of this many layers, the last ones */
    uint64_t ring;                 /* its bytes: pi2_plan_ring_slots slots of the largest layer's */
    uint64_t stream_skipped;       /* bytes the resident part leaves out for it */
    pi2_plan_mem solver;           /* what the solver saw */
    int ring_depth;                /* reads the reader must hold (the plan may pick up to it) */
    pi2_plan plan;                 /* hot and gate groups per FFN, threads, I/O depth, gate-first */
    bool predicted;                /* the plan is one to show: given, made by the solver, or the fixed
                                      split predicted with a hardware profile */
    const char *source;            /* "planned", "planned: the fixed split (no clear gain)", "given",
                                      "fixed split" */
    uint64_t hot, gate_hot;        /* bytes kept in memory (whole slots and gate parts), of them gate parts */
    uint32_t slots[2];             /* cache slots of each kind (slot_bytes of pi2_plan_bufs) */
    uint64_t cache;                /* their bytes */
    uint64_t planned;              /* fixed + hot + cache (<= mem_limit) */
    double offloaded;              /* share of FFN payload bytes not kept */
} pi2_plan_memory;

/* Resident bytes an offloading run keeps: the file before its first FFN
 * member, less the whole pages (of page bytes) of the f32 predictors it
 * gives back once quantized (predictor models). 0 for an inconsistent
 * manifest. */
uint64_t pi2_plan_resident(const pi2_manifest *mf, const pi2_bundle_layout *bl, uint64_t page);
/* Streaming (q8/q4 predictors used in place; attention projections): the
 * resident read leaves out the whole 4 KiB pages of each streamed member
 * (*skipped bytes in all) and decode reads a layer's members into a ring
 * slot of *slot bytes (the largest layer's, members page-rounded), the
 * read of the next streamed layer overlapping the current one. What
 * streams: with pred, every layer's predictors (every expert's); the
 * attention (q, k, v, o payloads and scales) of the last attn layers.
 * False (sizes 0) when that cannot stream: nothing asked, attn out of
 * [0, n_layers], no predictors or f32/f16 ones (quantized at open), no
 * more layers than ring slots (predictors), a member missing or
 * unaligned. */
bool pi2_plan_stream_sizes(const pi2_manifest *mf, const pi2_bundle_layout *bl, bool pred, int attn,
                           uint64_t *skipped, uint64_t *slot);
/* Whether layer l's attention streams when the last attn of n_layers do. */
bool pi2_plan_stream_attn_layer(int n_layers, int attn, int l);
/* Ring slots for n streamed layers: 2 (one in use, the next being read),
 * 1 for two layers or fewer (read after the layer ran). */
int pi2_plan_ring_slots(int n);
/* Page cache a run's open touches in the container outside the resident
 * region's direct read: each member's header page, the manifest and its
 * signature. */
uint64_t pi2_plan_container_touched(const pi2_ctr *c);
/* The resident items as one line, "attention 210 MB, embeddings+head
 * 120 MB, ..." (items of 0 bytes left out; ctx for the KV cache's) into
 * buf; returns the length it needs, as snprintf. */
size_t pi2_plan_items_text(const pi2_plan_items *it, int ctx, char *buf, size_t cap);
/* The fixed costs, the items and the minimum only (no plan, no profile
 * read: in->base may be NULL), so a run refuses a limit below the minimum
 * before it allocates anything large: PI2_ENOMEM with one line naming the
 * container, the limit and each item, as pi2_plan_memory_make. */
int pi2_plan_memory_floor(const pi2_plan_mem_in *in, pi2_plan_memory *out, pi2_err *err);
/* The memory plan at opts->mem_limit (> 0) into *out (pi2_plan_memory_free).
 * PI2_ENOMEM when the limit is below the minimum or a given plan does not
 * fit, PI2_ESHAPE / PI2_ERANGE for a given plan that does not fit the model
 * or the run, PI2_ERANGE for an infeasible min_speed, PI2_EUNSUPPORTED for
 * FFNs of different geometry; messages name the container. */
int pi2_plan_memory_make(const pi2_plan_mem_in *in, pi2_plan_memory *out, pi2_err *err);
/* NULL is a no-op. */
void pi2_plan_memory_free(pi2_plan_memory *m);
/* I/O depth the reader must hold for these options: a plan picks up to
 * 128 (or a given plan's deeper one). */
int pi2_plan_ring_depth(const struct pi2_offload_opts *o);

int pi2_plan_save(const pi2_plan *p, const char *model, const char *path, pi2_err *err);
int pi2_plan_load(const char *path, pi2_plan *out, pi2_err *err);
/* The plan as one line of JSON into a malloc'd string (NULL on ENOMEM). */
char *pi2_plan_json(const pi2_plan *p, const char *model);

#endif
