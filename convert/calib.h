/* Batched fp32 forward for calibration: activation traces, activation
 * profiles, perplexity and quality measurements, self-generated calibration
 * text.
 *
 * The numeric twin of runtime/reference (same RMSNorm rounding, float32 RoPE
 * as HF computes it, GQA, MoE top-k with ties to the lower index and softmax
 * over the k selected router logits) but built for throughput: a state holds
 * `n_seq` sequences, each with its own KV cache of `max_len` positions, and
 * one call appends `n_new` tokens to every sequence (n_new = prompt length
 * for a prefill, 1 for a batched decode step). The call runs layer by layer
 * over all n_seq * n_new rows at once, so every weight matrix is converted to
 * f32 once per call (on row slices in parallel, into one reusable buffer:
 * BF16 by an inlined shift, F16 and F32 by pi2_st_to_f32; the mapped pages
 * are released afterwards) and multiplied
 * with OpenBLAS sgemm. The output head is converted in row blocks, never
 * whole. Matmuls accumulate in float (the reference uses double), so results
 * agree with the reference to about 1e-5 relative, not bit for bit; router
 * logits are computed with double accumulation as the reference does, so
 * near-ties route the same way.
 *
 * Rows: the rows of one call are numbered sequence-major,
 *     row r  <->  sequence r / n_new, position len + r % n_new,
 * where len is pi2_calib_len() before the call (all sequences always hold
 * the same number of positions).
 *
 * Memory, roughly (floats): KV cache 2 * layers * n_seq * max_len * kv_dim;
 * per call N = n_seq * n_new rows of scratch N * (3 d + 2 q_dim + 2 kv_dim +
 * n_ff + N * max(n_ff, head block)) (+ 2 N d for MoE) and n_new * (len + n_new) for
 * attention scores; one weight buffer of the largest layer matrix. A 7B shape
 * (d 4096, ff 14336, 32 layers, 8 kv heads) prefilling 8 x 256 tokens stays
 * near 1.3 GB resident.
 *
 * Threads: OpenBLAS runs the matmuls; its process-wide thread count is set
 * to opts.threads for the duration of each call and restored afterwards, so
 * do not run other OpenBLAS work from other threads concurrently. Weight
 * conversion runs on opts.threads threads of our own. A state is not
 * thread-safe; callbacks run on the calling thread.
 *
 * Errors: PI2_EINVAL (NULL or bad argument, n_seq < 1, n_new < 1, a state of
 * another model), PI2_ERANGE (max_len outside [1, max_position_embeddings],
 * a token id outside [0, vocab), appending past max_len, sizes overflowing),
 * PI2_ENOMEM. A failed call leaves the sequences as they were before it
 * (lengths and cached positions unchanged); only an allocation failure
 * during the run also drops the kept last-position logits.
 */
#ifndef PI2_CALIB_H
#define PI2_CALIB_H

#include "formats/hfconfig.h"
#include "runtime/reference.h"
#include "runtime/sample.h"

/* Weight transform, applied to every matrix right after its f32 conversion
 * and before use (e.g. quantize-dequantize to measure quantized quality).
 * `w` is row-major [rows, cols] and may be modified in place. Called for the
 * 2-D matrices only (Q, K, V, O, GATE, UP, DOWN, ROUTER, EMBED, LM_HEAD; not
 * the norms); `expert` is 0 for dense FFNs and for non-FFN parts, `layer` is
 * 0 for EMBED/LM_HEAD. LM_HEAD comes in blocks of whole rows (several calls
 * per forward) and EMBED as the rows gathered for the call's tokens (one row
 * per token, repeats included), so the transform must be row-local (such as
 * group-wise quantization along rows). With tied embeddings both refer to
 * the same stored matrix. Called once per matrix per forward call, except
 * that MoE experts that no row was routed to are skipped. */
typedef void (*pi2_calib_weight_fn)(void *ctx, pi2_tname t, int layer, int expert, float *w, int64_t rows,
                                    int64_t cols);

/* FFN hook, once per layer per forward call (MoE: once per expert that got
 * at least one row, with only its rows, experts in index order):
 *   X     [n, d]     the FFN input after RMSNorm (read-only)
 *   R     [n, d]     the residual stream the norm was applied to (after
 *                    attention, before the FFN; read-only): what
 *                    PowerInfer-convention predictors read
 *   A     [n, n_ff]  activations fed to the down projection; modifiable:
 *                    zeroed entries are skipped neurons (sparse quality),
 *                    and the values can be recorded as traces
 *   rows  [n]        batch row of each of the n rows (see "Rows" above);
 *                    ascending. For dense layers rows[i] == i.
 * Pointers are valid only during the call. */
typedef void (*pi2_calib_ffn_fn)(void *ctx, int layer, int expert, int n, const int32_t *rows, const float *X,
                                 const float *R, float *A);

/* Input hook: the rows `in` [n, cols] (read-only) that matrix t of
 * (layer, expert) multiplies, once per matrix per forward call, just
 * before the product: Q, K, V (the normed attention input), O (the
 * attention output), GATE, UP (the normed FFN input), DOWN (the
 * activations, after the FFN hook) and LM_HEAD (the final normed rows
 * the head is applied to; `layer` 0); not EMBED or ROUTER. `rows` [n] is
 * the batch row of each for GATE, UP and DOWN (as the FFN hook's), and
 * NULL for the others, whose row i is batch row i; except that for LM_HEAD in a forward that
 * outputs no logits (neither `logits` nor NLL), row i is sequence i's
 * last new position. E.g. the mean square of each input column: the
 * importance an activation-aware quantizer weighs a column's error by. */
typedef void (*pi2_calib_input_fn)(void *ctx, pi2_tname t, int layer, int expert, int n, const int32_t *rows,
                                   const float *in, int64_t cols);

typedef struct pi2_calib_opts {
    int threads; /* OpenBLAS and conversion threads; <= 0: all online CPUs */
    pi2_calib_weight_fn weight;
    void *weight_ctx;
    pi2_calib_ffn_fn ffn;
    void *ffn_ctx;
    pi2_calib_input_fn input;
    void *input_ctx;
} pi2_calib_opts;

typedef struct pi2_calib_state pi2_calib_state;

/* State for `n_seq` sequences of up to `max_len` positions each over `m`,
 * which must outlive it. `o` may be NULL (all cores, no callbacks); it is
 * copied. Caller owns *out (pi2_calib_state_free). */
int pi2_calib_state_create(pi2_calib_state **out, const pi2_ref_model *m, int n_seq, int max_len,
                           const pi2_calib_opts *o, pi2_err *err);
/* NULL is a no-op. */
void pi2_calib_state_free(pi2_calib_state *s);
/* Replace the options (threads, callbacks); o NULL = defaults. */
void pi2_calib_set_opts(pi2_calib_state *s, const pi2_calib_opts *o);
/* Forget every sequence (lengths back to 0); buffers are kept. */
void pi2_calib_reset(pi2_calib_state *s);
/* Positions each sequence holds. */
int pi2_calib_len(const pi2_calib_state *s);
int pi2_calib_n_seq(const pi2_calib_state *s);
int pi2_calib_max_len(const pi2_calib_state *s);

/* Append tokens[q * n_new + i] (i < n_new) to sequence q for every q <
 * n_seq and run the forward over them. If `logits` is non-NULL it receives
 * the logits of every new position, [n_seq][n_new][vocab]. Either way the
 * last new position's logits of each sequence, [n_seq][vocab], are kept and
 * readable through pi2_calib_logits until the next call. */
int pi2_calib_forward(pi2_calib_state *s, const int32_t *tokens, int n_new, float *logits, pi2_err *err);

/* Last-position logits [n_seq][vocab] of the latest successful forward
 * (borrowed, valid until the next forward/free); NULL before any. */
const float *pi2_calib_logits(const pi2_calib_state *s);

/* Perplexity helper: reset, run tokens [n_seq][len] (len in [1, max_len]) as
 * one prefill and write nll[q] = sum over i < len-1 of
 * -log softmax(logits at position i)[tokens[q][i+1]] (natural log, double;
 * the softmax over the ids the tokenizer defines: a padded vocabulary's
 * rows past them are never output, so they are not counted),
 * i.e. len-1 predictions per sequence; perplexity is exp(sum nll / (n_seq *
 * (len-1))). The full logits are never stored: the head is applied block by
 * block with an online log-sum-exp. The callbacks run as in a forward call
 * (so quantized or sparse quality can be measured), and the state holds the
 * sequences afterwards. */
int pi2_calib_nll(pi2_calib_state *s, const int32_t *tokens, int len, double *nll, pi2_err *err);

/* Self-generated calibration text: reset, prefill prompt [n_seq][n_prompt]
 * (n_prompt >= 1, e.g. the BOS id for every sequence), then sample with
 * batched decode steps until each sequence has `len` tokens (n_prompt <= len
 * <= max_len). out [n_seq][len] receives the prompt followed by the sampled
 * tokens. Sequence q samples with its own sampler seeded from so->seed and q
 * (deterministic); the model's EOS ids are never sampled, so every sequence
 * runs to `len`. The FFN callback sees the generation like any forward.
 * PI2_EINVAL also for bad sampling options (runtime/sample.h). */
int pi2_calib_generate(pi2_calib_state *s, const int32_t *prompt, int n_prompt, int len, const pi2_sample_opts *so,
                       int32_t *out, pi2_err *err);

#endif
