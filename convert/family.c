/* Tiny replicas of the published checkpoints (family.h). The weights come
 * from the planted-sparsity generator (synth.h) written to a scratch
 * directory, then re-laid out as each family publishes them. */
#include "convert/family.h"

#include "convert/synth.h"
#include "formats/safetensors.h"
#include "formats/torchzip.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const pi2_family_names[] = {"turbosparse-mistral", "turbosparse-mixtral", "bamboo", "prosparse",
                                        "relullama", NULL};

/* TurboSparse-Mistral-Instruct's tokenizer_config.json, byte for byte. */
static const char TS_TOKENIZER_CONFIG[] =
    "{\n"
    "  \"add_bos_token\": true,\n"
    "  \"add_eos_token\": false,\n"
    "  \"add_prefix_space\": true,\n"
    "  \"added_tokens_decoder\": {\n"
    "    \"0\": {\n"
    "      \"content\": \"<unk>\",\n"
    "      \"lstrip\": false,\n"
    "      \"normalized\": false,\n"
    "      \"rstrip\": false,\n"
    "      \"single_word\": false,\n"
    "      \"special\": true\n"
    "    },\n"
    "    \"1\": {\n"
    "      \"content\": \"<s>\",\n"
    "      \"lstrip\": false,\n"
    "      \"normalized\": false,\n"
    "      \"rstrip\": false,\n"
    "      \"single_word\": false,\n"
    "      \"special\": true\n"
    "    },\n"
    "    \"2\": {\n"
    "      \"content\": \"</s>\",\n"
    "      \"lstrip\": false,\n"
    "      \"normalized\": false,\n"
    "      \"rstrip\": false,\n"
    "      \"single_word\": false,\n"
    "      \"special\": true\n"
    "    },\n"
    "    \"32000\": {\n"
    "      \"content\": \"<|im_end|>\",\n"
    "      \"lstrip\": false,\n"
    "      \"normalized\": false,\n"
    "      \"rstrip\": false,\n"
    "      \"single_word\": false,\n"
    "      \"special\": true\n"
    "    },\n"
    "    \"32001\": {\n"
    "      \"content\": \"<|im_start|>\",\n"
    "      \"lstrip\": false,\n"
    "      \"normalized\": false,\n"
    "      \"rstrip\": false,\n"
    "      \"single_word\": false,\n"
    "      \"special\": true\n"
    "    }\n"
    "  },\n"
    "  \"additional_special_tokens\": [\n"
    "    \"<|im_start|>\"\n"
    "  ],\n"
    "  \"bos_token\": \"<s>\",\n"
    "  \"chat_template\": \"{% if messages[0]['role'] == 'system' %}{% set system_message = messages[0]['content'] %}{% endif %}{% if system_message is defined %}{{ '<|im_start|>system\\\\n' + system_message + '<|im_end|>\\\\n' }}{% endif %}{% for message in messages %}{% set content = message['content'] %}{% if message['role'] == 'user' %}{{ '<|im_start|>user\\\\n' + content + '<|im_end|>\\\\n<|im_start|>assistant\\\\n' }}{% elif message['role'] == 'assistant' %}{{ content + '<|im_end|>' + '\\\\n' }}{% endif %}{% endfor %}\",\n"
    "  \"clean_up_tokenization_spaces\": false,\n"
    "  \"eos_token\": \"<|im_end|>\",\n"
    "  \"legacy\": true,\n"
    "  \"model_max_length\": 32768,\n"
    "  \"pad_token\": \"<unk>\",\n"
    "  \"padding_side\": \"right\",\n"
    "  \"sp_model_kwargs\": {},\n"
    "  \"spaces_between_special_tokens\": false,\n"
    "  \"split_special_tokens\": false,\n"
    "  \"tokenizer_class\": \"LlamaTokenizer\",\n"
    "  \"unk_token\": \"<unk>\",\n"
    "  \"use_default_system_prompt\": false\n"
    "}\n"
    ;

typedef struct family {
    const char *name;
    pi2_arch arch;
    pi2_act act;
    int hidden, ff, layers, heads, kv, experts, used;
    int vocab, tok_vocab, n_added; /* config vocab; the tokenizer's ids: tok_vocab + n_added */
    pi2_dtype dtype;               /* of every stored weight */
    int shards;                    /* weight files */
    bool bin;                      /* pytorch_model-*.bin (PyTorch zip) instead of safetensors */
    bool repo;                     /* predictors in DIR-predictor/model_{L}.pt, not in the checkpoint */
    pi2_dtype repo_dtype;
    bool repo_config;              /* the repository has a config.json */
} family;

static const family families[] = {
    {"turbosparse-mistral", PI2_ARCH_BAMBOO, PI2_ACT_DRELU, 64, 224, 2, 4, 1, 0, 0, 32064, 32000, 2, PI2_DT_BF16, 4,
     false, false, PI2_DT_F16, false},
    {"turbosparse-mixtral", PI2_ARCH_TURBOSPARSE_MIXTRAL, PI2_ACT_DRELU, 64, 224, 2, 4, 1, 8, 2, 57024, 32000, 2,
     PI2_DT_BF16, 3, false, false, PI2_DT_F16, false},
    {"bamboo", PI2_ARCH_BAMBOO, PI2_ACT_DRELU, 64, 224, 2, 4, 1, 0, 0, 32000, 32000, 0, PI2_DT_BF16, 3, false, true,
     PI2_DT_F16, true},
    {"prosparse", PI2_ARCH_SPARSELLAMA, PI2_ACT_FATRELU, 64, 192, 2, 4, 4, 0, 0, 32000, 32000, 0, PI2_DT_BF16, 2,
     false, true, PI2_DT_F16, true},
    {"relullama", PI2_ARCH_LLAMA, PI2_ACT_RELU, 64, 192, 2, 4, 4, 0, 0, 32000, 32000, 0, PI2_DT_F32, 3, true, true,
     PI2_DT_F32, false},
};

static const char *const CHATML[] = {"<|im_end|>", "<|im_start|>"};

/* ---- text files ---- */

static int write_text(const char *dir, const char *name, const char *text, pi2_err *err)
{
    char path[4200];
    if (!pi2_path_join(path, sizeof path, dir, name))
        return pi2_err_set(err, PI2_ERANGE, "%s: path too long", dir);
    pi2_afile *f;
    int rc = pi2_afile_open(&f, path, err);
    if (rc)
        return rc;
    if ((rc = pi2_afile_write(f, text, strlen(text), err)) != 0) {
        pi2_afile_abort(f);
        return rc;
    }
    return pi2_afile_commit(f, err);
}

/* config.json as the family publishes it, for these dimensions. */
static void config_text(const family *f, char *buf, size_t cap)
{
    if (f->arch == PI2_ARCH_BAMBOO && !f->repo) /* TurboSparse-Mistral-Instruct, as published */
        snprintf(buf, cap,
                 "{\n  \"_name_or_path\": \"/mnt/scratch/syx/checkpoint-500/checkpoint-500_bak\",\n"
                 "  \"architectures\": [\n    \"BambooForCausalLM\"\n  ],\n  \"attention_dropout\": 0.0,\n"
                 "  \"auto_map\": {\n    \"AutoConfig\": \"configuration_bamboo.BambooConfig\",\n"
                 "    \"AutoModel\": \"modeling_bamboo.BambooForCausalLM\",\n"
                 "    \"AutoModelForCausalLM\": \"modeling_bamboo.BambooForCausalLM\"\n  },\n"
                 "  \"bos_token_id\": 1,\n  \"eos_token_id\": 2,\n  \"hidden_act\": \"relu\",\n"
                 "  \"hidden_size\": %d,\n  \"initializer_range\": 0.02,\n  \"intermediate_size\": %d,\n"
                 "  \"max_position_embeddings\": 32768,\n  \"model_type\": \"bamboo\",\n"
                 "  \"num_attention_heads\": %d,\n  \"num_hidden_layers\": %d,\n  \"num_key_value_heads\": %d,\n"
                 "  \"rms_norm_eps\": 1e-05,\n  \"rope_theta\": 10000.0,\n  \"sliding_window\": 4096,\n"
                 "  \"tie_word_embeddings\": false,\n  \"torch_dtype\": \"bfloat16\",\n"
                 "  \"transformers_version\": \"4.41.0\",\n  \"use_cache\": false,\n  \"vocab_size\": %d\n}\n",
                 f->hidden, f->ff, f->heads, f->layers, f->kv, f->vocab);
    else if (f->arch == PI2_ARCH_BAMBOO) /* Bamboo-base */
        snprintf(buf, cap,
                 "{\n  \"_name_or_path\": \"PowerInfer/Bamboo-base-v0_1\",\n"
                 "  \"architectures\": [\n    \"BambooForCausalLM\"\n  ],\n  \"attention_dropout\": 0.0,\n"
                 "  \"auto_map\": {\n    \"AutoConfig\": \"configuration_bamboo.BambooConfig\",\n"
                 "    \"AutoModelForCausalLM\": \"modeling_bamboo.BambooForCausalLM\"\n  },\n"
                 "  \"bos_token_id\": 1,\n  \"eos_token_id\": 2,\n  \"hidden_act\": \"relu\",\n"
                 "  \"hidden_size\": %d,\n  \"initializer_range\": 0.02,\n  \"intermediate_size\": %d,\n"
                 "  \"max_position_embeddings\": 32768,\n  \"model_type\": \"bamboo\",\n"
                 "  \"num_attention_heads\": %d,\n  \"num_hidden_layers\": %d,\n  \"num_key_value_heads\": %d,\n"
                 "  \"rms_norm_eps\": 1e-05,\n  \"rope_theta\": 10000.0,\n  \"sliding_window\": 4096,\n"
                 "  \"tie_word_embeddings\": false,\n  \"torch_dtype\": \"bfloat16\",\n"
                 "  \"transformers_version\": \"4.36.2\",\n  \"use_cache\": true,\n  \"vocab_size\": %d\n}\n",
                 f->hidden, f->ff, f->heads, f->layers, f->kv, f->vocab);
    else if (f->arch == PI2_ARCH_TURBOSPARSE_MIXTRAL)
        snprintf(buf, cap,
                 "{\n  \"architectures\": [\n    \"TurboSparseMixtralForCausalLM\"\n  ],\n"
                 "  \"attention_dropout\": 0.0,\n"
                 "  \"auto_map\": {\n    \"AutoConfig\": \"configuration_turbosparsemixtral.TurboSparseMixtralConfig\",\n"
                 "    \"AutoModelForCausalLM\": \"modeling_turbosparsemixtral.TurboSparseMixtralForCausalLM\"\n  },\n"
                 "  \"bos_token_id\": 1,\n  \"eos_token_id\": 2,\n  \"hidden_act\": \"relu\",\n"
                 "  \"hidden_size\": %d,\n  \"initializer_range\": 0.02,\n  \"intermediate_size\": %d,\n"
                 "  \"max_position_embeddings\": 32768,\n  \"model_type\": \"turbosparsemixtral\",\n"
                 "  \"num_attention_heads\": %d,\n  \"num_experts_per_tok\": %d,\n  \"num_hidden_layers\": %d,\n"
                 "  \"num_key_value_heads\": %d,\n  \"num_local_experts\": %d,\n  \"output_router_logits\": false,\n"
                 "  \"rms_norm_eps\": 1e-05,\n  \"rope_theta\": 1000000.0,\n  \"router_aux_loss_coef\": 0.02,\n"
                 "  \"sliding_window\": null,\n  \"tie_word_embeddings\": false,\n  \"torch_dtype\": \"bfloat16\",\n"
                 "  \"transformers_version\": \"4.41.0\",\n  \"use_cache\": true,\n  \"vocab_size\": %d\n}\n",
                 f->hidden, f->ff, f->heads, f->used, f->layers, f->kv, f->experts, f->vocab);
    else if (f->arch == PI2_ARCH_SPARSELLAMA) /* ProSparse-Llama-2 */
        snprintf(buf, cap,
                 "{\n  \"_name_or_path\": \"SparseLLM/prosparse-llama-2-7b\",\n"
                 "  \"architectures\": [\n    \"SparseLlamaForCausalLM\"\n  ],\n"
                 "  \"auto_map\": {\n    \"AutoConfig\": \"configuration_sparsellama.SparseLlamaConfig\",\n"
                 "    \"AutoModelForCausalLM\": \"modeling_sparsellama.SparseLlamaForCausalLM\"\n  },\n"
                 "  \"bos_token_id\": 1,\n  \"eos_token_id\": 2,\n  \"hidden_act\": \"fatrelu\",\n"
                 "  \"hidden_act_param\": 0.01,\n  \"hidden_size\": %d,\n  \"initializer_range\": 0.02,\n"
                 "  \"intermediate_size\": %d,\n  \"max_position_embeddings\": 4096,\n  \"model_type\": \"sparsellama\",\n"
                 "  \"num_attention_heads\": %d,\n  \"num_hidden_layers\": %d,\n  \"num_key_value_heads\": %d,\n"
                 "  \"pretraining_tp\": 1,\n  \"rms_norm_eps\": 1e-05,\n  \"rope_scaling\": null,\n"
                 "  \"rope_theta\": 10000.0,\n  \"tie_word_embeddings\": false,\n  \"torch_dtype\": \"bfloat16\",\n"
                 "  \"transformers_version\": \"4.31.0\",\n  \"use_cache\": true,\n  \"vocab_size\": %d\n}\n",
                 f->hidden, f->ff, f->heads, f->layers, f->kv, f->vocab);
    else /* ReluLLaMA: a Llama-2 config with relu */
        snprintf(buf, cap,
                 "{\n  \"_name_or_path\": \"SparseLLM/ReluLLaMA-7B\",\n"
                 "  \"architectures\": [\n    \"LlamaForCausalLM\"\n  ],\n"
                 "  \"bos_token_id\": 1,\n  \"eos_token_id\": 2,\n  \"hidden_act\": \"relu\",\n"
                 "  \"hidden_size\": %d,\n  \"initializer_range\": 0.02,\n  \"intermediate_size\": %d,\n"
                 "  \"max_position_embeddings\": 4096,\n  \"model_type\": \"llama\",\n"
                 "  \"num_attention_heads\": %d,\n  \"num_hidden_layers\": %d,\n  \"num_key_value_heads\": %d,\n"
                 "  \"pad_token_id\": 0,\n  \"pretraining_tp\": 1,\n  \"rms_norm_eps\": 1e-05,\n"
                 "  \"rope_scaling\": null,\n  \"tie_word_embeddings\": false,\n  \"torch_dtype\": \"float32\",\n"
                 "  \"transformers_version\": \"4.31.0\",\n  \"use_cache\": true,\n  \"vocab_size\": %d\n}\n",
                 f->hidden, f->ff, f->heads, f->layers, f->kv, f->vocab);
}

static const char *tokenizer_config_text(const family *f)
{
    if (f->n_added)
        return TS_TOKENIZER_CONFIG; /* ChatML, <|im_end|> ends a turn */
    if (f->arch == PI2_ARCH_BAMBOO) /* end of sequence as an AddedToken object */
        return "{\n  \"add_bos_token\": true,\n  \"add_eos_token\": false,\n"
               "  \"bos_token\": {\n    \"__type\": \"AddedToken\",\n    \"content\": \"<s>\",\n"
               "    \"lstrip\": false,\n    \"normalized\": false,\n    \"rstrip\": false,\n"
               "    \"single_word\": false\n  },\n  \"clean_up_tokenization_spaces\": false,\n"
               "  \"eos_token\": {\n    \"__type\": \"AddedToken\",\n    \"content\": \"</s>\",\n"
               "    \"lstrip\": false,\n    \"normalized\": false,\n    \"rstrip\": false,\n"
               "    \"single_word\": false\n  },\n  \"legacy\": false,\n  \"model_max_length\": 32768,\n"
               "  \"pad_token\": null,\n  \"sp_model_kwargs\": {},\n  \"tokenizer_class\": \"LlamaTokenizer\",\n"
               "  \"unk_token\": \"<unk>\"\n}\n";
    return "{\n  \"add_bos_token\": true,\n  \"add_eos_token\": false,\n  \"bos_token\": \"<s>\",\n"
           "  \"clean_up_tokenization_spaces\": false,\n  \"eos_token\": \"</s>\",\n  \"legacy\": false,\n"
           "  \"model_max_length\": 1000000000000000019884624838656,\n  \"pad_token\": null,\n"
           "  \"sp_model_kwargs\": {},\n  \"tokenizer_class\": \"LlamaTokenizer\",\n  \"unk_token\": \"<unk>\"\n}\n";
}

static const char *generation_config_text(const family *f)
{
    if (f->arch == PI2_ARCH_TURBOSPARSE_MIXTRAL) /* a list: the end of a turn as well as of the text */
        return "{\n  \"bos_token_id\": 1,\n  \"eos_token_id\": [\n    2,\n    32000\n  ],\n"
               "  \"transformers_version\": \"4.41.0\"\n}\n";
    if (f->arch == PI2_ARCH_LLAMA || f->arch == PI2_ARCH_SPARSELLAMA)
        return "{\n  \"bos_token_id\": 1,\n  \"eos_token_id\": 2,\n  \"pad_token_id\": 0,\n  \"temperature\": 0.6,\n"
               "  \"top_p\": 0.9,\n  \"transformers_version\": \"4.31.0\"\n}\n";
    return "{\n  \"_from_model_config\": true,\n  \"bos_token_id\": 1,\n  \"eos_token_id\": 2,\n"
           "  \"transformers_version\": \"4.41.0\"\n}\n";
}

/* ---- weights ---- */

/* n floats into dt's bytes at out. */
static void store(const float *v, size_t n, pi2_dtype dt, uint8_t *out)
{
    for (size_t i = 0; i < n; i++) {
        if (dt == PI2_DT_F32) {
            memcpy(out + 4 * i, &v[i], 4);
        } else {
            uint16_t h = dt == PI2_DT_F16 ? pi2_f32_to_f16(v[i]) : pi2_f32_to_bf16(v[i]);
            memcpy(out + 2 * i, &h, 2);
        }
    }
}

/* Tensor t converted to dt: a new buffer (caller frees) of nelem * size bytes. */
static int convert_tensor(const pi2_st_tensor *t, pi2_dtype dt, uint8_t **out, pi2_err *err)
{
    float *v = pi2_malloc_array(t->nelem ? t->nelem : 1, sizeof *v);
    uint8_t *b = pi2_malloc_array(t->nelem ? t->nelem : 1, pi2_dtype_size(dt));
    int rc = v && b ? pi2_st_to_f32(t, v, t->nelem, err) : pi2_err_set(err, PI2_ENOMEM, "generator: out of memory");
    if (rc == 0)
        store(v, t->nelem, dt, b);
    free(v);
    if (rc)
        free(b);
    *out = rc ? NULL : b;
    return rc;
}

static bool is_predictor(const char *name) { return strstr(name, ".predictor.fc") != NULL; }

/* One weight file: the tensors idx[0..n) of st, in f->dtype. */
static int write_shard(const family *f, const pi2_st *st, const size_t *idx, size_t n, const char *path, pi2_err *err)
{
    pi2_st_writer *sw = NULL;
    pi2_tz_writer *tw = NULL;
    int rc = f->bin ? pi2_tz_writer_create(&tw, path, err) : pi2_st_writer_create(&sw, path, err);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const pi2_st_tensor *t = pi2_st_at(st, idx[i]);
        rc = f->bin ? pi2_tz_writer_add(tw, t->name, f->dtype, t->ndim, t->shape, err)
                    : pi2_st_writer_add(sw, t->name, f->dtype, t->ndim, t->shape, err);
    }
    if (rc == 0 && sw)
        rc = pi2_st_writer_meta(sw, "format", "pt", err);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const pi2_st_tensor *t = pi2_st_at(st, idx[i]);
        uint8_t *b;
        if ((rc = convert_tensor(t, f->dtype, &b, err)) != 0)
            break;
        size_t nb = t->nelem * pi2_dtype_size(f->dtype);
        rc = f->bin ? pi2_tz_writer_write(tw, b, nb, err) : pi2_st_writer_write(sw, b, nb, err);
        free(b);
    }
    if (rc) {
        pi2_tz_writer_free(tw);
        pi2_st_writer_free(sw);
        return rc;
    }
    return f->bin ? pi2_tz_writer_finish(tw, err) : pi2_st_writer_finish(sw, err);
}

/* The weights (predictors too, unless they go to a repository) in
 * f->shards files of about equal size, and their index. */
static int write_weights(const family *f, const pi2_st *st, const char *tmp, pi2_err *err)
{
    size_t nt = pi2_st_count(st), n = 0;
    size_t *idx = pi2_malloc_array(nt, sizeof *idx);
    const char **names = pi2_malloc_array(nt, sizeof *names), **files = pi2_malloc_array(nt, sizeof *files);
    char (*fname)[64] = pi2_calloc_array((size_t)f->shards, sizeof *fname);
    if (!idx || !names || !files || !fname) {
        free(idx);
        free(names);
        free(files);
        free(fname);
        return pi2_err_set(err, PI2_ENOMEM, "generator: out of memory");
    }
    uint64_t total = 0;
    for (size_t i = 0; i < nt; i++)
        if (!(f->repo && is_predictor(pi2_st_at(st, i)->name))) {
            idx[n++] = i;
            total += pi2_st_at(st, i)->nelem * pi2_dtype_size(f->dtype);
        }
    int rc = 0;
    size_t first = 0;
    uint64_t done = 0;
    for (int s = 0; rc == 0 && s < f->shards; s++) {
        snprintf(fname[s], sizeof fname[s], f->bin ? "pytorch_model-%05d-of-%05d.bin" : "model-%05d-of-%05d.safetensors",
                 s + 1, f->shards);
        size_t last = first; /* up to the s+1-th share of the bytes; every shard gets one tensor at least */
        uint64_t want = total * (uint64_t)(s + 1) / (uint64_t)f->shards;
        while (last < n && (last == first || done < want) && n - last > (size_t)(f->shards - s - 1)) {
            done += pi2_st_at(st, idx[last])->nelem * pi2_dtype_size(f->dtype);
            last++;
        }
        if (s == f->shards - 1)
            last = n;
        char path[4200];
        pi2_path_join(path, sizeof path, tmp, fname[s]);
        rc = write_shard(f, st, idx + first, last - first, path, err);
        for (size_t i = first; i < last; i++) {
            names[i] = pi2_st_at(st, idx[i])->name;
            files[i] = fname[s];
        }
        first = last;
    }
    if (rc == 0) {
        char path[4200];
        pi2_path_join(path, sizeof path, tmp, f->bin ? "pytorch_model.bin.index.json" : "model.safetensors.index.json");
        rc = pi2_st_write_index(path, n, names, files, total, err);
    }
    free(idx);
    free(names);
    free(files);
    free(fname);
    return rc;
}

/* DIR-predictor: model_{L}.pt per layer (and config.json). */
static int write_repo(const family *f, const pi2_st *st, const pi2_model_desc *d, const char *tmp, pi2_err *err)
{
    int rc = 0;
    for (int l = 0; rc == 0 && l < d->n_layers; l++) {
        char n1[128], n2[128], name[64], path[4200];
        pi2_tensor_name(n1, sizeof n1, d, PI2_T_PRED_FC1, l, 0);
        pi2_tensor_name(n2, sizeof n2, d, PI2_T_PRED_FC2, l, 0);
        const pi2_st_tensor *t1 = pi2_st_find(st, n1), *t2 = pi2_st_find(st, n2);
        if (!t1 || !t2)
            return pi2_err_set(err, PI2_ENOTFOUND, "generator: planted predictor of layer %d missing", l);
        uint8_t *b1 = NULL, *b2 = NULL;
        if ((rc = convert_tensor(t1, f->repo_dtype, &b1, err)) == 0 &&
            (rc = convert_tensor(t2, f->repo_dtype, &b2, err)) == 0) {
            pi2_tz_item it[2] = {{"fc1.weight", f->repo_dtype, 2, {t1->shape[0], t1->shape[1]}, b1},
                                 {"fc2.weight", f->repo_dtype, 2, {t2->shape[0], t2->shape[1]}, b2}};
            snprintf(name, sizeof name, "model_%d.pt", l);
            pi2_path_join(path, sizeof path, tmp, name);
            rc = pi2_tz_write(path, 2, it, err);
        }
        free(b1);
        free(b2);
    }
    if (rc == 0 && f->repo_config)
        rc = write_text(tmp, "config.json", "{\n  \"sparse_threshold\": 0.0\n}\n", err);
    return rc;
}

int pi2_family_write(const char *dir, const char *name, uint64_t seed, int threads, pi2_err *err)
{
    const family *f = NULL;
    for (size_t i = 0; i < sizeof families / sizeof *families; i++)
        if (name && strcmp(families[i].name, name) == 0)
            f = &families[i];
    if (!f)
        return pi2_err_set(err, PI2_EINVAL,
                           "unknown family '%s' (turbosparse-mistral, turbosparse-mixtral, bamboo, prosparse, relullama)",
                           name ? name : "(null)");
    pi2_synth_opts o;
    int rc = pi2_synth_preset("tiny", &o, err);
    if (rc)
        return rc;
    pi2_model_desc *d = &o.desc;
    d->arch = f->arch;
    d->act = f->act;
    d->hidden = f->hidden;
    d->n_ff = f->ff;
    d->n_layers = f->layers;
    d->n_heads = f->heads;
    d->n_kv_heads = f->kv;
    d->head_dim = f->hidden / f->heads;
    d->n_experts = f->experts;
    d->n_experts_used = f->used;
    d->vocab = f->vocab;
    d->act_param = f->act == PI2_ACT_FATRELU ? 0.01f : 0.0f;
    o.n_tokens = f->tok_vocab;
    o.dtype = PI2_DT_F32; /* the scratch copy; stored in f->dtype below */
    o.predictors = true;
    o.norm_spread = 0.6;
    o.n_tok_added = f->n_added;
    o.tok_added = f->n_added ? CHATML : NULL;
    o.seed = seed;
    o.threads = threads;

    char scratch[4200], tmp[4200], ptmp[4200] = "", pdir[4200], path[4200];
    char *text = malloc(8192);
    pi2_st *st = NULL;
    if (!text)
        return pi2_err_set(err, PI2_ENOMEM, "generator: out of memory");
    snprintf(pdir, sizeof pdir, "%s-predictor", dir);
    snprintf(scratch, sizeof scratch, "%s.synth", dir);
    bool have_scratch = false, have_tmp = false;
    if ((rc = pi2_dir_begin(dir, tmp, sizeof tmp, err)) != 0)
        goto out;
    have_tmp = true;
    if (f->repo && (rc = pi2_dir_begin(pdir, ptmp, sizeof ptmp, err)) != 0) {
        ptmp[0] = 0;
        goto out;
    }
    if ((rc = pi2_synth_write(scratch, &o, NULL, NULL, err)) != 0)
        goto out;
    have_scratch = true;
    if ((rc = pi2_st_open(&st, scratch, err)) != 0)
        goto out;
    config_text(f, text, 8192);
    pi2_path_join(path, sizeof path, scratch, "tokenizer.json");
    char *tok = NULL;
    size_t toklen = 0;
    if ((rc = write_text(tmp, "config.json", text, err)) != 0 ||
        (rc = write_text(tmp, "tokenizer_config.json", tokenizer_config_text(f), err)) != 0 ||
        (rc = write_text(tmp, "generation_config.json", generation_config_text(f), err)) != 0 ||
        (rc = pi2_read_file(path, 64u << 20, &tok, &toklen, err)) != 0)
        goto out;
    rc = write_text(tmp, "tokenizer.json", tok, err);
    free(tok);
    if (rc || (rc = write_weights(f, st, tmp, err)) != 0 || (f->repo && (rc = write_repo(f, st, d, ptmp, err)) != 0))
        goto out;
    if (f->repo && (rc = pi2_dir_commit(ptmp, pdir, err)) != 0)
        goto out;
    ptmp[0] = 0;
    rc = pi2_dir_commit(tmp, dir, err);
    have_tmp = rc != 0;
    if (rc && f->repo)
        pi2_dir_abort(pdir); /* committed just before: both or neither */
out:
    pi2_st_close(st);
    if (have_scratch)
        pi2_dir_abort(scratch);
    if (ptmp[0])
        pi2_dir_abort(ptmp);
    if (have_tmp && rc)
        pi2_dir_abort(tmp);
    free(text);
    return rc;
}
