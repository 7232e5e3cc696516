/* pi2 engine: a bundled model.pi2 turned into tokens, all weights in
 * memory (the container is memory-mapped and used in place).
 *
 * ---- Load (pi2_engine_open) ----
 * 1. pi2_bundle_open: structure, signature (a public key, or an unsigned
 *    container only with trust_unsigned), manifest, layout, permutations;
 * 2. SHA-256 of every resident member against the manifest (embeddings,
 *    attention, norms, router, predictors, FFN scales, tokenizer); the FFN
 *    payload members are hashed too unless verify_ffn is false (they are
 *    what later flash offloading reads on demand);
 * 3. views of every tensor inside the mapping (nothing is copied but
 *    per-row pointer tables), the tokenizer; offloading, the memory plan
 *    (runtime/planner.h) before anything is allocated; the thread pool
 *    (the plan's threads), the KV cache for ctx positions and scratch;
 * 4. optionally (preload) every page of the mapping is touched so the
 *    first token does not pay for page faults. When they came from a page
 *    cache that held the file in 4 KiB pages (written by a tool that left
 *    it cached) while the kernel would cache it afresh in 2 MiB ones, they
 *    are dropped and touched again, read in 2 MiB pages (pi2_ctr_rehuge;
 *    what 4 KiB pages cost: runtime/PERF.md, "Huge pages").
 *
 * ---- Forward ----
 * Per layer: RMSNorm -> Q, K, V (int8 matmul over quantized rows) -> RoPE
 * (HF rotate_half, the config's rope_scaling as the reference computes it)
 * -> causal GQA attention over the f32 KV cache -> O ->
 * residual -> RMSNorm -> FFN (dense; or MoE: router, top-k experts, softmax
 * over the selected logits) -> residual; final RMSNorm and the output head.
 *
 * Prefill (pi2_engine_prefill) runs the prompt in batches of up to
 * PI2_K_MAX_T tokens: every matmul is a rows x tokens tiled int8 kernel,
 * the FFN down projection the int8 down kernel (pi2_k_down_rows); FFNs are
 * dense.
 *
 * Decode (pi2_engine_decode) runs one token. Its FFN, per (layer, expert):
 *   predictor mode   scores = fc2 . relu(fc1 . x); neurons with score >=
 *                    threshold are "predicted"; only their gate rows are
 *                    read; up rows only where the gate lets the neuron
 *                    fire (ReGLU / dReLU: gate > 0; FATReLU: gate > its
 *                    threshold t); the output is the sum of
 *                    the active neurons' down columns (the int8 down kernel,
 *                    groups of 16 active columns) - inactive
 *                    neurons' weights are never touched;
 *   threshold mode   (SiLU models) every gate and up row; down only for
 *                    neurons with |activation| >= the calibrated threshold;
 *   dense            (pi2_engine_set_dense, or no predictors) every gate, up
 *                    and down row, as a dense engine computes it: exact.
 * Threads split rows of each matmul, heads of attention, and neurons (or
 * the predicted list) of each FFN. Batches use the pool's static
 * partitions; decode shares its matmul rows (units of 64) and FFN chunks
 * (128 neurons) out: each thread takes its own contiguous share in order,
 * then the last units left in the others' (a thread slowed by an
 * interrupt or the I/O thread no longer holds the other up). Each decode
 * FFN chunk writes its own output, summed in chunk order: in memory,
 * decode results do not depend on the thread count. In memory the container is mapped
 * with huge pages where the kernel allows it (pi2_ctr_open_huge).
 *
 * ---- Files that change (what is and is not covered) ----
 * The container's bytes are checked once, at open (step 2). After that:
 * - cut short (truncated) while in use: a tool that called
 *   pi2_map_guard_install (pi2-run does) does not die of SIGBUS; the
 *   step that read past the new end reads zeros there, and prefill or
 *   decode returns PI2_EIO naming the file ("changed while in use"), its
 *   logits to be discarded. Without the install, SIGBUS ends the process.
 *   Offloading reads FFN rows with pread/io_uring: a short read is an
 *   error of its own (runtime/offload/).
 * - overwritten in place (same size): not seen while running. In memory,
 *   the mapping shows the new bytes at once, so steps after the write
 *   may use them; offloading reads new FFN bytes from the file (its
 *   resident part is a copy made at open). pi2_engine_recheck hashes the
 *   resident members in the file again and says which differs
 *   (pi2-run --stats calls it after generating): a change there is
 *   detected after the fact. FFN payloads are not hashed again: a change
 *   to them goes unnoticed until the next open.
 * - replaced by rename (how pi2's tools write): the engine keeps the file
 *   it opened; nothing changes under it.
 *
 * Errors: those of pi2_bundle_open / pi2_bundle_verify (PI2_ESIG for a bad
 * signature or digest, PI2_EFORMAT, ...), PI2_EUNSUPPORTED for a model
 * this engine cannot run, PI2_ERANGE for a bad token, position or option,
 * PI2_ENOMEM. Messages name the container.
 */
#ifndef PI2_ENGINE_H
#define PI2_ENGINE_H

#include "formats/common.h"
#include "formats/hfconfig.h"
#include "formats/sign.h"
#include "formats/tokenizer.h"

/* Offloading and its plan: one part of the engine's options, read by
 * runtime/offload/ and the planner only. */
typedef struct pi2_offload_opts {
    /* Offloading (0: everything in memory). The process's footprint, RSS
     * plus the page cache it causes, is planned to stay under mem_limit:
     * see runtime/offload/offload.h. */
    uint64_t mem_limit;         /* bytes */
    double hot_share;           /* share of the FFN budget for the hot segment (default 1) */
    int io_backend;             /* pi2_io_backend (default auto) */
    int io_depth;               /* reads in flight (default 64) */
    bool lock_hot;              /* mlock the hot segment where permitted (default true) */
    bool gate_first;            /* two-phase models: read up+down only once the gate fired
                                   (default false: along with a missing gate, one read) */
    bool no_read_ahead;         /* decode: no read-ahead during attention (MoE: no expert guess) */
    /* Planning (runtime/planner.h). With a plan, it is run as given (hot
     * and gate groups per FFN, threads, I/O depth, gate-first); else with a
     * hardware profile the solver chooses one (threads at most `threads`);
     * else, or with fixed_split, the fixed split above (hot_share, io_depth,
     * gate_first), predicted when a hardware profile is given. */
    const struct pi2_plan *plan;
    const struct pi2_hwprof *hw;
    const struct pi2_plan_cal *cal; /* the model's learned factors (NULL: none yet) */
    bool fixed_split;
    double min_speed;           /* tok/s the plan must reach (0: none): PI2_ERANGE otherwise */
    int plan_prompt;            /* prompt tokens for the predicted prefill figure (0: 128) */
    /* q8/q4 predictors: 0 streams them from the container a layer at a
     * time (a ring of pi2_plan_ring_slots layers) only when the limit
     * cannot hold them resident, 1 always, -1 never (runtime/planner.h) */
    int pred_stream;
    /* the attention projections (q, k, v, o) of the last N layers stream
     * through the same ring: 0 the least N the limit needs (0 when it
     * holds them resident), N > 0 that many (at most the model's layers),
     * -1 never */
    int attn_stream;
} pi2_offload_opts;

typedef struct pi2_engine_opts {
    const char *path;           /* model.pi2 */
    const pi2_sign_key *pubkey; /* key the container must be signed with ... */
    bool trust_unsigned;        /* ... or accept an unsigned container */
    bool verify_ffn;            /* also hash the FFN payloads (default true) */
    int threads;                /* compute threads (default 0: all cores) */
    int ctx;                    /* KV cache positions (0: 512), at most the model's (see set_ctx) */
    bool preload;               /* touch every page at load (default true) */
    bool dense;                 /* start in dense mode */
    bool kv_f16;                /* the KV cache in fp16: half the memory and the bytes attention
                                   reads; the keys and values rounded to fp16 (default f32) */
    pi2_offload_opts offload; /* mem_limit 0: everything in memory */
} pi2_engine_opts;

/* Counters since the last pi2_engine_stats_reset (decode only, per FFN
 * evaluation: one per layer per token, per selected expert on MoE). */
typedef struct pi2_engine_stats {
    uint64_t ffn_evals;          /* FFN evaluations */
    uint64_t neurons;            /* neurons those FFNs hold in all */
    uint64_t predicted;          /* neurons whose gate row was computed */
    uint64_t active;             /* neurons whose down column was added */
    uint64_t weight_bytes;       /* weight payload + scale bytes read */
    uint64_t kv_bytes;           /* KV cache bytes read */
    uint64_t tokens;             /* decode tokens */
    /* MoE decode: expert choices (tokens x layers x top-k), those whose
     * expert was also chosen for the previous token in the layer, and those
     * the read-ahead guessed (offloading) out of the guessed ones */
    uint64_t moe_choices, moe_reused, moe_guessed, moe_guesses;
} pi2_engine_stats;

typedef struct pi2_engine pi2_engine;

void pi2_engine_defaults(pi2_engine_opts *o);
/* Open and check (see Load above). Caller closes *out. */
int pi2_engine_open(pi2_engine **out, const pi2_engine_opts *o, pi2_err *err);
/* NULL is a no-op. */
void pi2_engine_close(pi2_engine *e);

const pi2_model_desc *pi2_engine_desc(const pi2_engine *e);
const pi2_tok *pi2_engine_tokenizer(const pi2_engine *e);
/* The model's chat template, when its container keeps one (the
 * tokenizer_config.json the converter found), read into *cc (freed with
 * pi2_jinja_config_free): 0; PI2_ENOTFOUND when the model has none; the
 * reader's codes (formats/jinja.h) otherwise. */
struct pi2_chat_config;
int pi2_engine_chat_config(const pi2_engine *e, struct pi2_chat_config *cc, pi2_err *err);
int pi2_engine_ctx(const pi2_engine *e);
int pi2_engine_threads(const pi2_engine *e);
/* "predictor", "threshold" or "none": what decode uses when not dense. */
const char *pi2_engine_sparsity(const pi2_engine *e);
/* Dense mode on or off (no effect on a model without sparsity data). */
void pi2_engine_set_dense(pi2_engine *e, bool dense);
bool pi2_engine_dense(const pi2_engine *e);
/* Signature status line for reports: "signed by <fingerprint>" / "unsigned". */
const char *pi2_engine_signature(const pi2_engine *e);
/* All in memory: bytes of the container mapped now (*mapped) and of those
 * in 2 MiB pages (*huge); *redone when open dropped 4 KiB pages to read
 * them again in 2 MiB ones. Zeros when offloading or unknown. */
void pi2_engine_pages(const pi2_engine *e, uint64_t *mapped, uint64_t *huge, bool *redone);
/* Below this many bytes mapped, 4 KiB pages are left as they are (a
 * re-read is not worth it). */
#define PI2_ENGINE_REHUGE_MIN ((uint64_t)64 << 20)
/* Bytes of weights a dense decode step reads (payloads + scales). */
uint64_t pi2_engine_dense_bytes(const pi2_engine *e);
/* Bytes of the predictors decode runs (payloads + scales): the Q8 copies
 * open makes of f32/f16 predictors, or q8/q4 members used in place; the
 * planner counts the same (pi2_plan_pred_bytes). 0 without predictors. */
uint64_t pi2_engine_pred_bytes(const pi2_engine *e);
/* Multiply-accumulates per prompt token in the weight matmuls of prefill
 * (attention projections and FFNs; not attention scores or the head). */
double pi2_engine_prefill_macs(const pi2_engine *e);
/* Resize the KV cache to ctx positions (1..pi2_desc_max_ctx: max_pos, more
 * with dynamic NTK scaling); the cache is emptied.
 * PI2_ERANGE, PI2_ENOMEM (the old cache is kept). */
int pi2_engine_set_ctx(pi2_engine *e, int ctx, pi2_err *err);

/* Run n tokens at positions pos .. pos+n-1 (pos <= positions fed: an
 * earlier pos rewinds the cache) and write the last token's logits (vocab
 * floats) when logits is non-NULL. PI2_ERANGE for bad ids or positions
 * beyond ctx. */
int pi2_engine_prefill(pi2_engine *e, const int32_t *tokens, int n, int pos, float *logits, pi2_err *err);
/* One token at pos through the decode path; logits as above. */
int pi2_engine_decode(pi2_engine *e, int32_t token, int pos, float *logits, pi2_err *err);

void pi2_engine_stats_get(const pi2_engine *e, pi2_engine_stats *out);
/* The resident members of the file hashed again against the digests
 * verified at open ("Files that change" above): 0 when all match;
 * PI2_ESIG "changed since verification: ..." naming the first that
 * differs; PI2_EIO when the file was cut short under the mapping. Reads
 * the resident bytes once more through the page cache (offloading: a
 * window at a time, each dropped once hashed, within the memory plan:
 * pi2_bundle_recheck). */
int pi2_engine_recheck(const pi2_engine *e, pi2_err *err);
/* Resets the offloading counters too. */
void pi2_engine_stats_reset(pi2_engine *e);

/* What an engine opened on this model with `threads` threads (and an fp16
 * KV cache or not) holds besides its weights (pi2_plan_bufs,
 * runtime/planner.h): a function of the model's shape alone, which the
 * engine and the offloader size their allocations with and the memory plan
 * counts. PI2_ESHAPE for a layout without FFNs. */
struct pi2_manifest;
struct pi2_bundle_layout;
struct pi2_plan_bufs;
int pi2_engine_buffer_sizes(const struct pi2_manifest *mf, const struct pi2_bundle_layout *bl, int threads,
                            bool kv_f16, struct pi2_plan_bufs *out, pi2_err *err);

/* Offloading plan and counters (runtime/offload/offload.h). */
typedef struct pi2_engine_offload_info {
    bool on;                 /* false: everything in memory, the rest is zero */
    uint64_t mem_limit;      /* bytes asked for */
    uint64_t planned;        /* bytes planned: the sum below (<= mem_limit) */
    uint64_t minimum;        /* the smallest mem_limit this model opens with (same ctx, threads) */
    uint64_t resident, kv, buffers, overhead, hot, cache;
    uint64_t files;          /* page cache of the files read besides the direct reads (planner.h) */
    uint64_t ffn_total;      /* FFN payload bytes in the container */
    double offloaded;        /* share of FFN payload bytes not in the hot segment */
    uint32_t cache_slots;    /* slots of all caches */
    bool hot_locked;         /* mlock succeeded */
    const char *backend;     /* "io_uring" or "pread" */
    const char *note;        /* why the backend or mode is what it is, or "" */
    const char *plan_source; /* "planned", "planned: the fixed split (no clear gain)", "given", "fixed split" */
    const struct pi2_plan *plan; /* the plan run, with its predictions (NULL: fixed split, no hardware profile) */
    int threads, io_depth;   /* as run */
    int io_nice;             /* nice levels the I/O thread runs above the compute threads (0: not permitted,
                                or the process already at the highest priority) */
    bool gate_first;
    uint64_t gate_hot;       /* bytes of gate parts kept beyond the hot slots */
    /* decode counters since the last stats reset */
    uint64_t parts;          /* neuron parts needed (gate, up+down, or whole neurons) */
    uint64_t parts_hot;      /* ... served by the hot segment */
    uint64_t parts_hit;      /* ... by the cache */
    uint64_t parts_read;     /* ... read from flash */
    uint64_t reads, bytes_read;
    uint64_t parts_prefetched; /* parts read ahead during attention (counted in reads and bytes) */
    uint64_t prefetch_waits;   /* parts a step waited for while the read ahead was in flight */
    double io_wait_s;        /* compute threads idle waiting for reads (thread-seconds / threads) */
    uint64_t prefill_bytes_read;
    bool pred_stream;        /* the predictors stream a layer at a time (planner.h) */
    int attn_stream;         /* layers whose attention streams with them (the last ones) */
    uint64_t pred_bytes_read; /* bytes the ring read (predictors, attention) since the last stats reset */
} pi2_engine_offload_info;
void pi2_engine_offload_info_get(const pi2_engine *e, pi2_engine_offload_info *out);
/* Measured footprint now: the process's anonymous resident memory plus the
 * container's pages in the page cache. */
uint64_t pi2_engine_footprint(const pi2_engine *e);

#endif
