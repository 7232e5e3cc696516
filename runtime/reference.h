/* Dense fp32 reference forward pass over a Hugging Face model directory.
 *
 * This is the oracle every optimised path is tested against: plain loops,
 * weights read in place from the mapped safetensors (F32/F16/BF16 converted
 * element by element), double accumulation in dot products. Supports
 * Llama/Mistral (SwiGLU, ReGLU or FATReLU), ProSparse (sparsellama,
 * FATReLU), Bamboo (dReLU), Mixtral and TurboSparse-Mixtral (top-k MoE,
 * softmax over the selected experts' router logits), GQA attention with a KV
 * cache, RoPE in the HF rotate_half layout with the rope_scaling types of
 * formats/hfconfig.h (linear, dynamic NTK, llama3), tied or untied output
 * head (tied embeddings may be stored once under either
 * model.embed_tokens.weight or lm_head.weight).
 */
#ifndef PI2_REFERENCE_H
#define PI2_REFERENCE_H

#include "formats/hfconfig.h"
#include "formats/safetensors.h"

typedef struct pi2_ref_model pi2_ref_model;
typedef struct pi2_ref_state pi2_ref_state;

/* Open an HF model dir: config.json + safetensors (single or sharded). The
 * description is pi2_config_read_model's: config.json, and every end-of-turn
 * id of generation_config.json and tokenizer_config.json (resolved through
 * tokenizer.json when present; a malformed one of these files is an error
 * naming it). Every tensor the forward needs must exist with the right shape
 * and a float dtype (PI2_ENOTFOUND / PI2_ESHAPE / PI2_EUNSUPPORTED naming the
 * tensor). Caller owns *out. */
int pi2_ref_open(pi2_ref_model **out, const char *hf_dir, pi2_err *err);
/* NULL is a no-op. */
void pi2_ref_close(pi2_ref_model *m);
const pi2_model_desc *pi2_ref_desc(const pi2_ref_model *m);
/* The underlying tensors (e.g. to import predictors). */
const pi2_st *pi2_ref_tensors(const pi2_ref_model *m);
/* Ids the directory's tokenizer.json defines (rows of the head from there to
 * vocab are padding, never valid output: pi2_logits_mask_padding), or 0
 * without tokenizer.json. */
int pi2_ref_n_tokens(const pi2_ref_model *m);
/* The validated tensor view the forward uses for part `t` of `layer` (and
 * `expert`, which must be 0 for dense models): EMBED and LM_HEAD are the same
 * view when embeddings are tied; the view's shape and float dtype were checked
 * at open. NULL for a part the model does not have (ROUTER on a dense model,
 * predictors) or an index out of range. Borrowed: valid until pi2_ref_close. */
const pi2_st_tensor *pi2_ref_weight(const pi2_ref_model *m, pi2_tname t, int layer, int expert);

/* Called for every FFN evaluation (once per layer per token; once per
 * selected expert for MoE) with the FFN input after RMSNorm (`x`, hidden
 * floats) and the activation vector fed to the down projection (`act`, n_ff
 * floats; zero entries are inactive neurons). For traces and profiles.
 * `expert` is 0 for dense models; MoE experts come in routing order (largest
 * router logit first). The pointers are valid only during the call. */
typedef void (*pi2_ref_ffn_hook)(void *ctx, int layer, int expert, const float *x, const float *act);

/* KV cache and scratch for up to `max_seq` positions (1..pi2_desc_max_ctx:
 * max_pos, more with dynamic NTK scaling; else PI2_ERANGE; PI2_ENOMEM if the
 * cache cannot be allocated). The state keeps a pointer to `m`, which must
 * outlive it. Caller owns *out. */
int pi2_ref_state_create(pi2_ref_state **out, const pi2_ref_model *m, int max_seq, pi2_err *err);
void pi2_ref_state_free(pi2_ref_state *s);
void pi2_ref_state_set_hook(pi2_ref_state *s, pi2_ref_ffn_hook hook, void *ctx);
/* During an FFN hook: the residual stream (d floats) whose norm is the
 * hook's x, i.e. after attention and before the FFN's RMSNorm: the input
 * of PowerInfer-convention predictors. */
const float *pi2_ref_state_residual(const pi2_ref_state *s);

/* Run token `token` at position `pos` (0-based, positions must be fed in
 * order from 0 and < max_seq) and write vocab logits. PI2_ERANGE for a bad
 * token id or position. Feeding a position already in the cache (pos <
 * positions fed) rewinds: the cache is truncated to pos and the run goes on
 * from there. PI2_EINVAL if `s` was created for another model.
 * Numerics: double accumulation in every dot product and in attention;
 * RoPE frequencies, angles and cos/sin in float32 as HF computes them. */
int pi2_ref_forward(const pi2_ref_model *m, pi2_ref_state *s, int token, int pos, float *logits, pi2_err *err);

#endif
