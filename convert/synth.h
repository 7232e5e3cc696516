/* Model generator: writes a valid Hugging Face model directory (config.json,
 * tokenizer.json, safetensors — sharded with an index past the shard size)
 * whose FFNs have planted, predictable activation sparsity. For tests, demos
 * and benchmarks; real large checkpoints cannot be downloaded here.
 *
 * How the sparsity is planted (all vectors in the hidden space, d dims):
 *   u        a fixed "bias" direction (random signs / sqrt(d)),
 *   v_1..v_r r "topic" directions of the same kind (r = plant rank).
 * Every token embedding is c*u + sum_k h_k v_k + noise with h_k ~ N(0, s_h^2),
 * so after RMSNorm the FFN input carries a constant component along u and a
 * token-dependent one in span(v). Gate row i is b_i*u + sum_k a_ik v_k + eta
 * (unit a_i, small noise eta), so the gate pre-activation is
 * b_i*c + a_i.h + eta.x: linear in the normalised input (a rank-2r+1 ReLU
 * MLP predicts it exactly, up to eta) and positive with probability f_i, the
 * neuron's planted frequency, by the choice of b_i = -s * Phi^-1(1 - f_i) / c.
 * Frequencies are heavy-tailed: a `hot_frac` share of neurons fire with
 * probability in [0.6, 0.95], the rest follow f = f_max * U^gamma with gamma
 * chosen so the mean is `active_frac`. Up row i = gate row i + a positive
 * shift along u (+ noise), so for dReLU the neuron is active exactly when its
 * gate fires. Down columns are random with a per-layer scale that keeps each
 * layer's output RMS at `layer_gain` of the residual, so the residual stream
 * stays stable through any depth. Attention and head weights are random.
 * With norm_spread, the FFN norm's weight w varies per dimension and gate
 * and up rows are divided by it: the FFN's function is unchanged, the
 * planted predictors (rows v_k, -v_k, u) read the pre-norm residual as
 * published predictors do (their scores' signs do not change with the
 * residual's scale), and fed the normed input instead they lose recall.
 * FATReLU (desc.act_param = t) uses the same plant: a neuron fires when its
 * gate exceeds t, so its frequency is a little under the planted one.
 * Every element comes from a counter-based hash of (seed, tensor, row, col):
 * generation is streamed row block by row block on all threads, never
 * holding a tensor in memory.
 */
#ifndef PI2_SYNTH_H
#define PI2_SYNTH_H

#include "formats/hfconfig.h"
#include "formats/safetensors.h"

typedef struct pi2_synth_opts {
    pi2_model_desc desc;   /* shapes, arch/act, vocab, ... */
    pi2_dtype dtype;       /* F32, F16 or BF16 */
    double active_frac;    /* mean per-token active share of FFN neurons (0.10) */
    double hot_frac;       /* share of hot neurons that fire for most tokens (0.03) */
    int plant_rank;        /* r; 0 = min(32, hidden/4) */
    double layer_gain;     /* RMS of each sublayer's output relative to the stream (0.25) */
    bool predictors;       /* also write planted predictors under the TurboSparse names */
    double norm_spread;    /* > 0: FFN norm weights exp(spread * N(0,1)) (in [1/4, 4]), gate and
                              up rows divided by them, so the FFN computes the same but the
                              normed input differs from the residual per dimension: the
                              planted predictors then fit the pre-norm residual only, as
                              published (PowerInfer) ones do; 0: unit norms */
    uint64_t seed;
    uint64_t shard_bytes;  /* shard size limit; 0 = 4 GiB */
    int threads;           /* 0 = all cores */
    int n_tokens;          /* ids the tokenizer defines, in [300, vocab]; 0 = vocab. Fewer: a padded
                              vocabulary (TurboSparse-Mistral: 32002 of 32064), whose embedding and
                              head rows past them point along u, so that unmasked they would win
                              every step (a test of the masking) */
    int n_tok_added;       /* special tokens the tokenizer adds after those (ids n_tokens ..; ChatML's
                              <|im_end|>, <|im_start|>), real rows; padding starts past them */
    const char *const *tok_added;
} pi2_synth_opts;

/* Fill *o with a preset: "tiny", "small", "1b", "7b" or "moe". */
int pi2_synth_preset(const char *name, pi2_synth_opts *o, pi2_err *err);
/* Names of the presets, NULL-terminated. */
extern const char *const pi2_synth_preset_names[];

/* Total bytes of weights the options describe (for progress and checks). */
uint64_t pi2_synth_weight_bytes(const pi2_synth_opts *o);

/* Progress callback: done and total weight bytes. May be NULL. */
typedef void (*pi2_synth_progress)(void *ctx, uint64_t done, uint64_t total);

/* Write the model directory `dir`, which must not exist. Everything is
 * written into a temporary sibling directory that is renamed to `dir` only
 * when complete, so a failure (including a full disk) leaves nothing at
 * `dir`. */
int pi2_synth_write(const char *dir, const pi2_synth_opts *o, pi2_synth_progress progress, void *ctx,
                    pi2_err *err);

#endif
