/* Hugging Face config.json -> one model description, and the HF tensor names
 * of each model part.
 *
 * Accepted model_type values and what they mean for the FFN:
 *   llama, mistral     hidden_act silu    -> SwiGLU  (PI2_ACT_SILU)
 *                      hidden_act relu    -> ReGLU   (PI2_ACT_RELU)
 *                      hidden_act fatrelu -> FATReLU (PI2_ACT_FATRELU)
 *   sparsellama        ProSparse (SparseLlamaForCausalLM): a Llama whose
 *                      hidden_act is fatrelu with hidden_act_param t (0.01
 *                      in the published 7B/13B); silu and relu as llama
 *   mixtral            as mistral, with num_local_experts / num_experts_per_tok
 *   bamboo             dReLU (PI2_ACT_DRELU): relu(x Wg) * relu(x Wu)
 *   turbosparsemixtral dReLU per expert, MoE
 * hidden_act is required to be silu, relu or fatrelu (bamboo/turbosparse:
 * relu only). FATReLU is ReGLU with a threshold: act = (g > t ? g : 0) * up
 * with g = x Wg; so it is accepted wherever relu is (llama, mistral,
 * sparsellama, mixtral), needs hidden_act_param (a number >= 0; t = 0 is
 * ReGLU) and, like ReGLU, has a dense up projection and lets the gate alone
 * decide which neurons fire. hidden_act_param is ignored for other acts.
 *
 * rope_scaling (null, or an object whose type is under "rope_type" or the
 * older "type"; other keys of the object are ignored, as HF does):
 *   default  as null
 *   linear   factor f: every inverse frequency divided by f
 *   dynamic  factor f (HF's dynamic NTK): for a token at position p, with
 *            L = p + 1 > max_position_embeddings M, the base becomes
 *            theta * (f * L / M - (f - 1)) ^ (hd / (hd - 2)); up to M it is
 *            theta. The model then runs up to floor(f * M) positions
 *            (pi2_desc_max_ctx). HF recomputes the base from the length of
 *            each forward call, so its batched prompt uses the batch's last
 *            length for every prompt token; pi2 uses each token's own
 *            length, which is what HF's token-by-token decoding gives: the
 *            two agree except on prompt tokens past M.
 *   llama3   factor, low_freq_factor, high_freq_factor,
 *            original_max_position_embeddings (HF's Llama 3.1 rule: long
 *            wavelengths divided by factor, short ones kept, a smooth blend
 *            between)
 * Every other type (yarn, longrope, su, ntk, ...) is PI2_EUNSUPPORTED.
 *
 * Missing optional keys take the HF defaults (num_key_value_heads = heads,
 * head_dim = hidden/heads, rope_theta 10000, rms_norm_eps 1e-6,
 * tie_word_embeddings false, bos 1, eos 2).
 *
 * End of turn: config.json's eos_token_id is not the whole story (a chat
 * model may end its turns with another token). pi2_config_read_model adds
 * the ids of generation_config.json and tokenizer_config.json; generation
 * also stops on a generated BOS (pi2_desc_is_end): llama2.c-derived models
 * end a story by starting the next one.
 */
#ifndef PI2_HFCONFIG_H
#define PI2_HFCONFIG_H

#include "formats/common.h"
#include "formats/tokenizer.h"

typedef enum pi2_arch {
    PI2_ARCH_LLAMA,
    PI2_ARCH_MISTRAL,
    PI2_ARCH_MIXTRAL,
    PI2_ARCH_BAMBOO,
    PI2_ARCH_TURBOSPARSE_MIXTRAL,
    PI2_ARCH_SPARSELLAMA, /* ProSparse: Llama with FATReLU */
} pi2_arch;

typedef enum pi2_act {
    PI2_ACT_SILU,  /* silu(x Wg) * (x Wu) */
    PI2_ACT_RELU,  /* relu(x Wg) * (x Wu)  (ReGLU) */
    PI2_ACT_DRELU, /* relu(x Wg) * relu(x Wu) */
    PI2_ACT_FATRELU, /* (x Wg > t ? x Wg : 0) * (x Wu), t = act_param (ProSparse) */
} pi2_act;

/* End-of-turn ids a model may declare, all sources together. */
#define PI2_MAX_EOS 8

typedef enum pi2_rope_type {
    PI2_ROPE_DEFAULT, /* rope_scaling null: inv_freq[i] = theta^(-2i/hd) */
    PI2_ROPE_LINEAR,
    PI2_ROPE_DYNAMIC,
    PI2_ROPE_LLAMA3,
} pi2_rope_type;

/* rope_scaling. Fields a type does not use are 0. */
typedef struct pi2_rope_scaling {
    pi2_rope_type type;
    double factor;           /* linear, dynamic, llama3: in [1, PI2_ROPE_MAX_FACTOR] */
    double low_freq_factor;  /* llama3: > 0 */
    double high_freq_factor; /* llama3: > low_freq_factor */
    int orig_max_pos;        /* llama3: original_max_position_embeddings, >= 1 */
} pi2_rope_scaling;
#define PI2_ROPE_MAX_FACTOR 1024.0

typedef struct pi2_model_desc {
    pi2_arch arch;
    pi2_act act;
    float act_param;  /* FATReLU threshold t (hidden_act_param), finite, >= 0; 0 for other acts */
    int hidden;       /* d */
    int n_ff;         /* FFN width (per expert for MoE) */
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;
    int vocab;
    int max_pos;
    double rope_theta;
    pi2_rope_scaling rope;
    float rms_eps;
    bool tie_embeddings;
    int n_experts;      /* 0 for dense models */
    int n_experts_used; /* top-k; 0 for dense */
    int bos_id;         /* -1 if none */
    int n_eos;
    int eos_ids[PI2_MAX_EOS];
} pi2_model_desc;

/* Limits a config must respect (hostile files): each dimension <= 1<<20,
 * layers <= 1024, experts <= 256, vocab <= 1<<22. */
#define PI2_CFG_MAX_DIM (1 << 20)    /* hidden, n_ff, heads, head_dim, heads*head_dim, max_pos */
#define PI2_CFG_MAX_LAYERS 1024
#define PI2_CFG_MAX_EXPERTS 256
#define PI2_CFG_MAX_VOCAB (1 << 22)
#define PI2_CFG_MAX_BYTES (1u << 20) /* config.json size cap */

/* Errors (exact codes, tests rely on them):
 *   PI2_EFORMAT       not JSON, not an object, duplicate key, a key of the
 *                     wrong JSON type (also inside rope_scaling: an object,
 *                     its type a string, factors numbers, original_max_
 *                     position_embeddings an integer; rope_type and type
 *                     both given and different), heads/kv heads/hidden not
 *                     dividing, odd head_dim (RoPE pairs i and i + head_dim/2)
 *   PI2_ENOTFOUND     required key missing (or null): model_type, hidden_act,
 *                     hidden_size, intermediate_size, num_hidden_layers,
 *                     num_attention_heads, vocab_size, max_position_embeddings;
 *                     for MoE types also num_local_experts, num_experts_per_tok;
 *                     hidden_act_param for fatrelu; inside rope_scaling its
 *                     type, factor (linear, dynamic, llama3) and llama3's
 *                     low_freq_factor, high_freq_factor,
 *                     original_max_position_embeddings
 *   PI2_EUNSUPPORTED  unknown model_type or hidden_act, bamboo/turbosparse
 *                     with an act other than relu, a rope_scaling type other
 *                     than default/linear/dynamic/llama3 (the message names
 *                     it), attention_bias/mlp_bias true, num_local_experts > 1
 *                     on a dense model_type
 *   PI2_ERANGE        a size <= 0 or above the caps, experts_used > experts,
 *                     rms_norm_eps not in (0, 1), rope_theta <= 0, bos/eos id
 *                     outside [0, vocab), more than PI2_MAX_EOS eos ids,
 *                     hidden_act_param negative or not finite, a rope factor
 *                     outside [1, PI2_ROPE_MAX_FACTOR], llama3's
 *                     low_freq_factor <= 0 or high_freq_factor <=
 *                     low_freq_factor, original_max_position_embeddings
 *                     outside [1, PI2_CFG_MAX_DIM], dynamic with head_dim 2
 *   PI2_EINVAL        (validate only: descriptions built in code) an enum out
 *                     of range, act_param or rope fields set where the act or
 *                     rope type does not use them
 *   PI2_EIO/ENOTFOUND reading the file; PI2_ENOMEM
 * Keys not listed above are ignored (e.g. sliding_window: the reference does
 * not implement it, so Mistral results are exact only below the window). */

/* The config.json that `path` names into *out: path itself, or
 * path/config.json in buf (cap bytes) when path is a directory.
 * PI2_EINVAL without a path, PI2_ERANGE when the joined path is too long. */
int pi2_config_path(const char *path, char *buf, size_t cap, const char **out, pi2_err *err);
/* Read config.json at `path` (a file, or a directory holding config.json).
 * A pi2 container or a safetensors file given instead is PI2_EFORMAT
 * saying what it is and that a model directory is expected. */
int pi2_config_read(const char *path, pi2_model_desc *out, pi2_err *err);
/* Parse JSON text; `name` is used in messages. */
int pi2_config_parse(const char *json, size_t len, const char *name, pi2_model_desc *out, pi2_err *err);
/* Check internal consistency (heads divide, kv heads divide heads, ...). */
int pi2_config_validate(const pi2_model_desc *d, const char *name, pi2_err *err);
/* Write a config.json for `d` (atomically), as HF would for its arch. */
int pi2_config_write(const char *path, const pi2_model_desc *d, pi2_err *err);
/* The same with a "torch_dtype" entry ("float32", "float16" or "bfloat16";
 * NULL omits it, PI2_EINVAL for anything else). pi2_config_write omits it. */
int pi2_config_write_dtype(const char *path, const pi2_model_desc *d, const char *torch_dtype, pi2_err *err);
/* The config.json text pi2_config_write_dtype would write (validated first),
 * NUL-terminated; caller frees *out. For embedding in manifests. Every
 * field of the description reads back the same through pi2_config_parse
 * (FATReLU as hidden_act "fatrelu" with hidden_act_param, rope_scaling as an
 * object with rope_type, all end-of-turn ids as the eos_token_id list). */
int pi2_config_format(const pi2_model_desc *d, const char *torch_dtype, char **out, size_t *len, pi2_err *err);

/* ---- end of turn from every file of a model directory ----
 *
 * Sources, merged into d->eos_ids without repeats, in this order after the
 * ids already there (config.json's eos_token_id):
 *   generation_config.json   eos_token_id: an integer, a list of them, or null
 *   tokenizer_config.json    eos_token: a string or an AddedToken object
 *                            {"content": "...", ...} (or null), looked up in
 *                            `tok` (tokenizer.json); skipped when tok is NULL
 * A missing file adds nothing; a malformed one (not JSON, not an object, a
 * key of the wrong type) is PI2_EFORMAT, an id outside [0, vocab) or more
 * than PI2_MAX_EOS ids in all PI2_ERANGE, an eos_token the tokenizer does not
 * have PI2_ENOTFOUND; every message names the file. Only those two keys are
 * read. On error *d is unchanged. TurboSparse-Mistral-Instruct: config.json
 * says 2, tokenizer_config.json <|im_end|> = 32000: the list is {2, 32000}. */
int pi2_config_merge_eos(const char *dir, const pi2_tok *tok, pi2_model_desc *d, pi2_err *err);

/* The model directory `dir` as every pi2 tool reads it (a path to a
 * config.json file reads that file alone): config.json
 * (pi2_config_read), then tokenizer.json when it exists (its errors are
 * returned as they are; more tokens than vocab_size is PI2_EFORMAT), then
 * pi2_config_merge_eos. *n_tokens (may be NULL) gets the number of ids the
 * tokenizer defines, 0 without tokenizer.json: rows of the embedding and
 * head from there to vocab are padding (TurboSparse-Mistral: 32002 of
 * 32064) and never valid output. */
int pi2_config_read_model(const char *dir, pi2_model_desc *out, int *n_tokens, pi2_err *err);

/* True when generating `id` ends the text: an end-of-turn id, or BOS. */
bool pi2_desc_is_end(const pi2_model_desc *d, int id);

/* ---- model math the config implies ---- */

/* The value a gate must exceed for a neuron of a ReLU-family FFN to fire
 * (ReGLU, dReLU: 0; FATReLU: act_param); 0 for SiLU, whose gate never
 * decides alone. */
float pi2_desc_gate_threshold(const pi2_model_desc *d);

/* Positions the model runs: max_position_embeddings, or for dynamic NTK
 * floor(factor * max_position_embeddings) capped to PI2_CFG_MAX_DIM. */
int pi2_desc_max_ctx(const pi2_model_desc *d);

/* RoPE inverse frequencies inv_freq[i], i < head_dim/2, for a token at
 * position `pos` (>= 0), in float32 as HF computes them: the default
 * 1 / theta^(2i/hd) (powf of float theta), then the scaling type's rule
 * (see rope_scaling above). Only dynamic depends on pos, and only once
 * pos + 1 > max_pos (pi2_rope_varies). `d` must be valid. */
void pi2_rope_inv_freq(const pi2_model_desc *d, int pos, float *inv_freq);
/* True when pi2_rope_inv_freq at `pos` differs from its value at 0. */
bool pi2_rope_varies(const pi2_model_desc *d, int pos);
const char *pi2_rope_type_name(pi2_rope_type t); /* "default", "linear", ...; "unknown" if invalid */

const char *pi2_arch_name(pi2_arch a); /* the HF model_type; "unknown" if invalid */
const char *pi2_act_name(pi2_act a);   /* "silu", "relu", "drelu", "fatrelu"; "unknown" if invalid */
/* The HF "architectures" class name ("LlamaForCausalLM", ...); "unknown" if invalid. */
const char *pi2_arch_class(pi2_arch a);
bool pi2_desc_is_moe(const pi2_model_desc *d);

/* A PowerInfer predictor repository's config.json (beside its model_{L}.pt
 * files): *threshold = its "sparse_threshold" (*found true) or 0 when the key
 * is absent or null; other keys are ignored. PI2_EFORMAT (not a JSON object,
 * a threshold that is not a number), PI2_ERANGE (not finite), read errors. */
int pi2_pred_repo_config_read(const char *path, double *threshold, bool *found, pi2_err *err);

/* HF tensor names. `layer` and `expert` are ignored where they do not apply. */
typedef enum pi2_tname {
    PI2_T_EMBED,      /* model.embed_tokens.weight        [vocab, d] */
    PI2_T_OUT_NORM,   /* model.norm.weight                [d] */
    PI2_T_LM_HEAD,    /* lm_head.weight                   [vocab, d] */
    PI2_T_ATTN_NORM,  /* model.layers.L.input_layernorm.weight            [d] */
    PI2_T_FFN_NORM,   /* model.layers.L.post_attention_layernorm.weight   [d] */
    PI2_T_Q,          /* model.layers.L.self_attn.q_proj.weight   [heads*hd, d] */
    PI2_T_K,          /* model.layers.L.self_attn.k_proj.weight   [kv*hd, d] */
    PI2_T_V,          /* model.layers.L.self_attn.v_proj.weight   [kv*hd, d] */
    PI2_T_O,          /* model.layers.L.self_attn.o_proj.weight   [d, heads*hd] */
    PI2_T_GATE,       /* dense: model.layers.L.mlp.gate_proj.weight [ff, d];
                         MoE:   model.layers.L.block_sparse_moe.experts.E.w1.weight */
    PI2_T_UP,         /* mlp.up_proj / experts.E.w3            [ff, d] */
    PI2_T_DOWN,       /* mlp.down_proj / experts.E.w2          [d, ff] */
    PI2_T_ROUTER,     /* model.layers.L.block_sparse_moe.gate.weight [experts, d] */
    PI2_T_PRED_FC1,   /* mlp.predictor.fc1.weight / experts.E.predictor.fc1.weight [r, d] */
    PI2_T_PRED_FC2,   /* mlp.predictor.fc2.weight / experts.E.predictor.fc2.weight [ff, r] */
} pi2_tname;

/* Format the name into buf; false if it does not fit, or the part does not
 * exist for this model (PI2_T_ROUTER on a dense model), or layer/expert is
 * negative where it applies. MoE-ness from d. */
bool pi2_tensor_name(char *buf, size_t cap, const pi2_model_desc *d, pi2_tname t, int layer, int expert);

#endif
