/* Hugging Face config.json -> one model description, and the HF tensor names
 * of each model part.
 *
 * Accepted model_type values and what they mean for the FFN:
 *   llama, mistral     hidden_act silu -> SwiGLU (PI2_ACT_SILU)
 *                      hidden_act relu -> ReGLU  (PI2_ACT_RELU)
 *   mixtral            as mistral, with num_local_experts / num_experts_per_tok
 *   bamboo             dReLU (PI2_ACT_DRELU): relu(x Wg) * relu(x Wu)
 *   turbosparsemixtral dReLU per expert, MoE
 * hidden_act is required to be silu or relu (bamboo/turbosparse: relu only).
 * Missing optional keys take the HF defaults (num_key_value_heads = heads,
 * head_dim = hidden/heads, rope_theta 10000, rms_norm_eps 1e-6,
 * tie_word_embeddings false, bos 1, eos 2).
 */
#ifndef PI2_HFCONFIG_H
#define PI2_HFCONFIG_H

#include "formats/common.h"

typedef enum pi2_arch {
    PI2_ARCH_LLAMA,
    PI2_ARCH_MISTRAL,
    PI2_ARCH_MIXTRAL,
    PI2_ARCH_BAMBOO,
    PI2_ARCH_TURBOSPARSE_MIXTRAL,
} pi2_arch;

typedef enum pi2_act {
    PI2_ACT_SILU,  /* silu(x Wg) * (x Wu) */
    PI2_ACT_RELU,  /* relu(x Wg) * (x Wu)  (ReGLU) */
    PI2_ACT_DRELU, /* relu(x Wg) * relu(x Wu) */
} pi2_act;

#define PI2_MAX_EOS 4

typedef struct pi2_model_desc {
    pi2_arch arch;
    pi2_act act;
    int hidden;       /* d */
    int n_ff;         /* FFN width (per expert for MoE) */
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;
    int vocab;
    int max_pos;
    double rope_theta;
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
 *                     wrong JSON type, heads/kv heads/hidden not dividing,
 *                     odd head_dim (RoPE pairs i and i + head_dim/2)
 *   PI2_ENOTFOUND     required key missing (or null): model_type, hidden_act,
 *                     hidden_size, intermediate_size, num_hidden_layers,
 *                     num_attention_heads, vocab_size, max_position_embeddings;
 *                     for MoE types also num_local_experts, num_experts_per_tok
 *   PI2_EUNSUPPORTED  unknown model_type or hidden_act, bamboo/turbosparse
 *                     with an act other than relu, rope_scaling not null,
 *                     attention_bias/mlp_bias true, num_local_experts > 1 on a
 *                     dense model_type
 *   PI2_ERANGE        a size <= 0 or above the caps, experts_used > experts,
 *                     rms_norm_eps not in (0, 1), rope_theta <= 0, bos/eos id
 *                     outside [0, vocab), more than PI2_MAX_EOS eos ids
 *   PI2_EIO/ENOTFOUND reading the file; PI2_ENOMEM
 * Keys not listed above are ignored (e.g. sliding_window: the reference does
 * not implement it, so Mistral results are exact only below the window). */

/* Read config.json at `path` (a file, or a directory holding config.json). */
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
 * NUL-terminated; caller frees *out. For embedding in manifests. */
int pi2_config_format(const pi2_model_desc *d, const char *torch_dtype, char **out, size_t *len, pi2_err *err);

const char *pi2_arch_name(pi2_arch a); /* the HF model_type; "unknown" if invalid */
const char *pi2_act_name(pi2_act a);   /* "silu", "relu", "drelu"; "unknown" if invalid */
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
