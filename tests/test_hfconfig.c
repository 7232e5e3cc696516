/* Tests for formats/hfconfig: parsing every supported arch, HF defaults,
 * every rejection with its exact code, write -> read round trips, names. */
#include "tests/testutil.h"

#include <jansson.h>
#include <math.h>

#include "convert/synth_tok.h"
#include "formats/hfconfig.h"

/* A valid llama config; cases below mutate one key at a time. */
static const char *BASE = "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\","
                          " \"hidden_act\": \"silu\", \"hidden_size\": 64, \"intermediate_size\": 160,"
                          " \"num_hidden_layers\": 3, \"num_attention_heads\": 8, \"num_key_value_heads\": 2,"
                          " \"vocab_size\": 300, \"max_position_embeddings\": 128, \"rope_theta\": 500000.0,"
                          " \"rms_norm_eps\": 1e-05, \"tie_word_embeddings\": false, \"bos_token_id\": 1,"
                          " \"eos_token_id\": 2, \"rope_scaling\": null, \"torch_dtype\": \"bfloat16\"}";

static int parse_str(const char *s, pi2_model_desc *d, pi2_err *e)
{
    pi2_err_clear(e);
    int rc = pi2_config_parse(s, strlen(s), "test.json", d, e);
    if (rc) {
        assert_int_equal(e->code, rc);
        assert_non_null(strstr(e->msg, "test.json"));
        assert_null(strchr(e->msg, '\n'));
    }
    return rc;
}

/* Parse BASE with `key` set to the JSON value `val` (NULL: key removed),
 * optionally model_type/hidden_act overridden first. */
static int parse_mut(const char *type, const char *act, const char *key, const char *val, pi2_model_desc *d,
                     pi2_err *e)
{
    json_error_t je;
    json_t *o = json_loads(BASE, 0, &je);
    assert_non_null(o);
    if (type)
        json_object_set_new(o, "model_type", json_string(type));
    if (act)
        json_object_set_new(o, "hidden_act", json_string(act));
    if (act && strcmp(act, "fatrelu") == 0) /* ProSparse's threshold; cases may remove or change it */
        json_object_set_new(o, "hidden_act_param", json_real(0.01));
    if (type && (strcmp(type, "mixtral") == 0 || strcmp(type, "turbosparsemixtral") == 0)) {
        json_object_set_new(o, "num_local_experts", json_integer(4));
        json_object_set_new(o, "num_experts_per_tok", json_integer(2));
    }
    if (key) {
        if (val) {
            json_t *v = json_loads(val, JSON_DECODE_ANY, &je);
            assert_non_null(v);
            json_object_set_new(o, key, v);
        } else {
            json_object_del(o, key);
        }
    }
    char *s = json_dumps(o, 0);
    assert_non_null(s);
    int rc = parse_str(s, d, e);
    free(s);
    json_decref(o);
    return rc;
}

static void test_shared_models(void **state)
{
    (void)state;
    char dir[1024];
    pi2_model_desc d;
    pi2_err e = { 0 };
    PI2T_SHARED_MODEL(dir, "tinystories-656k");
    assert_int_equal(pi2_config_read(dir, &d, &e), 0);
    assert_int_equal(d.arch, PI2_ARCH_LLAMA);
    assert_int_equal(d.act, PI2_ACT_SILU);
    assert_int_equal(d.hidden, 128);
    assert_int_equal(d.n_ff, 384);
    assert_int_equal(d.n_layers, 2);
    assert_int_equal(d.n_heads, 8);
    assert_int_equal(d.n_kv_heads, 4);
    assert_int_equal(d.head_dim, 16);
    assert_int_equal(d.vocab, 2048);
    assert_int_equal(d.max_pos, 512);
    assert_true(d.tie_embeddings);
    assert_true(d.rope_theta == 10000.0);
    assert_true(d.rms_eps == 1e-6f);
    assert_int_equal(d.n_experts, 0);
    assert_int_equal(d.n_experts_used, 0);
    assert_int_equal(d.bos_id, 1);
    assert_int_equal(d.n_eos, 1);
    assert_int_equal(d.eos_ids[0], 2);
    assert_false(pi2_desc_is_moe(&d));
    /* the whole directory: generation_config.json (2) and tokenizer_config.json
     * (<|end_story|>, 2, next to a model_max_length of 1e30 spelled out) agree */
    int nt = 0;
    assert_int_equal(pi2_config_read_model(dir, &d, &nt, &e), 0);
    assert_int_equal(d.n_eos, 1);
    assert_int_equal(d.eos_ids[0], 2);
    assert_int_equal(nt, 2048);

    PI2T_SHARED_MODEL(dir, "tinystories-656k-drelu");
    char path[1100];
    snprintf(path, sizeof path, "%s/config.json", dir); /* the file form */
    assert_int_equal(pi2_config_read(path, &d, &e), 0);
    assert_int_equal(d.arch, PI2_ARCH_BAMBOO);
    assert_int_equal(d.act, PI2_ACT_DRELU);
    assert_int_equal(d.hidden, 128);
    assert_int_equal(d.n_ff, 384);
    assert_int_equal(d.head_dim, 16);
    assert_true(d.tie_embeddings);
}

static void test_base_and_defaults(void **state)
{
    (void)state;
    pi2_model_desc d;
    pi2_err e;
    assert_int_equal(parse_str(BASE, &d, &e), 0);
    assert_int_equal(d.arch, PI2_ARCH_LLAMA);
    assert_int_equal(d.act, PI2_ACT_SILU);
    assert_int_equal(d.hidden, 64);
    assert_int_equal(d.n_ff, 160);
    assert_int_equal(d.n_layers, 3);
    assert_int_equal(d.n_heads, 8);
    assert_int_equal(d.n_kv_heads, 2);
    assert_int_equal(d.head_dim, 8);
    assert_int_equal(d.vocab, 300);
    assert_int_equal(d.max_pos, 128);
    assert_true(d.rope_theta == 500000.0);
    assert_true(d.rms_eps == 1e-5f);
    assert_false(d.tie_embeddings);

    /* Minimal config: every optional key takes the HF default. */
    const char *min = "{\"model_type\": \"llama\", \"hidden_act\": \"relu\", \"hidden_size\": 48,"
                      " \"intermediate_size\": 96, \"num_hidden_layers\": 1, \"num_attention_heads\": 6,"
                      " \"vocab_size\": 10, \"max_position_embeddings\": 16}";
    assert_int_equal(parse_str(min, &d, &e), 0);
    assert_int_equal(d.act, PI2_ACT_RELU);
    assert_int_equal(d.n_kv_heads, 6);
    assert_int_equal(d.head_dim, 8);
    assert_true(d.rope_theta == 10000.0);
    assert_true(d.rms_eps == 1e-6f);
    assert_false(d.tie_embeddings);
    assert_int_equal(d.bos_id, 1);
    assert_int_equal(d.n_eos, 1);
    assert_int_equal(d.eos_ids[0], 2);

    /* null means "default" for kv heads and head_dim, "none" for bos/eos. */
    assert_int_equal(parse_mut(NULL, NULL, "num_key_value_heads", "null", &d, &e), 0);
    assert_int_equal(d.n_kv_heads, 8);
    assert_int_equal(parse_mut(NULL, NULL, "head_dim", "null", &d, &e), 0);
    assert_int_equal(d.head_dim, 8);
    assert_int_equal(parse_mut(NULL, NULL, "bos_token_id", "null", &d, &e), 0);
    assert_int_equal(d.bos_id, -1);
    assert_int_equal(parse_mut(NULL, NULL, "eos_token_id", "null", &d, &e), 0);
    assert_int_equal(d.n_eos, 0);
    assert_int_equal(parse_mut(NULL, NULL, "eos_token_id", "[2, 7, 299]", &d, &e), 0);
    assert_int_equal(d.n_eos, 3);
    assert_int_equal(d.eos_ids[0], 2);
    assert_int_equal(d.eos_ids[1], 7);
    assert_int_equal(d.eos_ids[2], 299);
    assert_int_equal(parse_mut(NULL, NULL, "eos_token_id", "[]", &d, &e), 0);
    assert_int_equal(d.n_eos, 0);
    /* up to PI2_MAX_EOS ids; a repeated id counts once */
    assert_int_equal(parse_mut(NULL, NULL, "eos_token_id", "[1, 2, 3, 4, 5, 6, 7, 8]", &d, &e), 0);
    assert_int_equal(d.n_eos, 8);
    assert_int_equal(d.eos_ids[7], 8);
    assert_int_equal(parse_mut(NULL, NULL, "eos_token_id", "[7, 2, 7]", &d, &e), 0);
    assert_int_equal(d.n_eos, 2);
    assert_int_equal(d.eos_ids[0], 7);
    assert_int_equal(d.eos_ids[1], 2);
    assert_true(pi2_desc_is_end(&d, 7) && pi2_desc_is_end(&d, 2));
    assert_true(pi2_desc_is_end(&d, 1)); /* BOS: the start of the next text */
    assert_false(pi2_desc_is_end(&d, 3) || pi2_desc_is_end(&d, -1));
    d.bos_id = -1;
    assert_false(pi2_desc_is_end(&d, 1));
    assert_false(pi2_desc_is_end(NULL, 2));
    /* Integer rope_theta is a number too. */
    assert_int_equal(parse_mut(NULL, NULL, "rope_theta", "1000000", &d, &e), 0);
    assert_true(d.rope_theta == 1e6);
    /* Explicit head_dim need not equal hidden/heads. */
    assert_int_equal(parse_mut(NULL, NULL, "head_dim", "32", &d, &e), 0);
    assert_int_equal(d.head_dim, 32);
    /* A dense config may carry the MoE keys when they say "one expert". */
    assert_int_equal(parse_mut(NULL, NULL, "num_local_experts", "1", &d, &e), 0);
    assert_int_equal(d.n_experts, 0);
    assert_int_equal(parse_mut(NULL, NULL, "num_experts_per_tok", "2", &d, &e), 0);
    assert_int_equal(d.n_experts_used, 0);
    assert_int_equal(parse_mut(NULL, NULL, "attention_bias", "false", &d, &e), 0);
}

static void test_every_arch(void **state)
{
    (void)state;
    pi2_model_desc d;
    pi2_err e;
    assert_int_equal(parse_mut("mistral", "silu", NULL, NULL, &d, &e), 0);
    assert_int_equal(d.arch, PI2_ARCH_MISTRAL);
    assert_int_equal(d.act, PI2_ACT_SILU);
    assert_int_equal(parse_mut("mistral", "relu", "head_dim", "16", &d, &e), 0);
    assert_int_equal(d.act, PI2_ACT_RELU);
    assert_int_equal(d.head_dim, 16);

    assert_int_equal(parse_mut("mixtral", "silu", NULL, NULL, &d, &e), 0);
    assert_int_equal(d.arch, PI2_ARCH_MIXTRAL);
    assert_int_equal(d.act, PI2_ACT_SILU);
    assert_int_equal(d.n_experts, 4);
    assert_int_equal(d.n_experts_used, 2);
    assert_true(pi2_desc_is_moe(&d));

    assert_int_equal(parse_mut("bamboo", "relu", NULL, NULL, &d, &e), 0);
    assert_int_equal(d.arch, PI2_ARCH_BAMBOO);
    assert_int_equal(d.act, PI2_ACT_DRELU);
    assert_false(pi2_desc_is_moe(&d));

    assert_int_equal(parse_mut("turbosparsemixtral", "relu", "num_experts_per_tok", "4", &d, &e), 0);
    assert_int_equal(d.arch, PI2_ARCH_TURBOSPARSE_MIXTRAL);
    assert_int_equal(d.act, PI2_ACT_DRELU);
    assert_int_equal(d.n_experts, 4);
    assert_int_equal(d.n_experts_used, 4);
    assert_true(pi2_desc_is_moe(&d));

    assert_string_equal(pi2_arch_name(PI2_ARCH_TURBOSPARSE_MIXTRAL), "turbosparsemixtral");
    assert_string_equal(pi2_arch_name(PI2_ARCH_MIXTRAL), "mixtral");
    /* ProSparse: sparsellama with FATReLU and its threshold */
    assert_int_equal(parse_mut("sparsellama", "fatrelu", NULL, NULL, &d, &e), 0);
    assert_int_equal(d.arch, PI2_ARCH_SPARSELLAMA);
    assert_int_equal(d.act, PI2_ACT_FATRELU);
    assert_true(d.act_param == 0.01f);
    assert_true(pi2_desc_gate_threshold(&d) == 0.01f);
    assert_false(pi2_desc_is_moe(&d));
    assert_int_equal(parse_mut("sparsellama", "fatrelu", "hidden_act_param", "0", &d, &e), 0);
    assert_true(d.act_param == 0.0f);
    assert_int_equal(parse_mut("sparsellama", "fatrelu", "hidden_act_param", "1", &d, &e), 0); /* integer */
    assert_true(d.act_param == 1.0f);
    /* sparsellama also takes Llama's activations; the threshold key is ignored for them */
    assert_int_equal(parse_mut("sparsellama", "relu", "hidden_act_param", "0.5", &d, &e), 0);
    assert_int_equal(d.act, PI2_ACT_RELU);
    assert_true(d.act_param == 0.0f);
    assert_true(pi2_desc_gate_threshold(&d) == 0.0f);
    assert_int_equal(parse_mut("sparsellama", "silu", "hidden_act_param", "\"x\"", &d, &e), 0);
    assert_int_equal(d.act, PI2_ACT_SILU);
    /* fatrelu wherever relu is: llama, mistral, mixtral */
    assert_int_equal(parse_mut("llama", "fatrelu", NULL, NULL, &d, &e), 0);
    assert_int_equal(d.arch, PI2_ARCH_LLAMA);
    assert_int_equal(d.act, PI2_ACT_FATRELU);
    assert_int_equal(parse_mut("mistral", "fatrelu", "hidden_act_param", "0.25", &d, &e), 0);
    assert_true(d.act_param == 0.25f);
    assert_int_equal(parse_mut("mixtral", "fatrelu", NULL, NULL, &d, &e), 0);
    assert_int_equal(d.act, PI2_ACT_FATRELU);
    assert_true(pi2_desc_is_moe(&d));
    /* the gate threshold of the other ReLU-family acts is 0 */
    assert_int_equal(parse_mut("bamboo", "relu", NULL, NULL, &d, &e), 0);
    assert_true(pi2_desc_gate_threshold(&d) == 0.0f);

    assert_string_equal(pi2_arch_class(PI2_ARCH_BAMBOO), "BambooForCausalLM");
    assert_string_equal(pi2_arch_name(PI2_ARCH_SPARSELLAMA), "sparsellama");
    assert_string_equal(pi2_arch_class(PI2_ARCH_SPARSELLAMA), "SparseLlamaForCausalLM");
    assert_string_equal(pi2_act_name(PI2_ACT_FATRELU), "fatrelu");
    assert_string_equal(pi2_rope_type_name(PI2_ROPE_LLAMA3), "llama3");
    assert_string_equal(pi2_rope_type_name((pi2_rope_type)9), "unknown");
    assert_string_equal(pi2_arch_name((pi2_arch)99), "unknown");
    assert_string_equal(pi2_act_name(PI2_ACT_DRELU), "drelu");
    assert_string_equal(pi2_act_name((pi2_act)99), "unknown");
}

typedef struct reject_case {
    const char *type, *act, *key, *val; /* val NULL: remove key */
    int code;
} reject_case;

static void test_rejections(void **state)
{
    (void)state;
    static const reject_case cases[] = {
        /* unknown or unsupported values */
        { "gpt2", NULL, NULL, NULL, PI2_EUNSUPPORTED },
        { "Llama", NULL, NULL, NULL, PI2_EUNSUPPORTED },
        { NULL, "gelu", NULL, NULL, PI2_EUNSUPPORTED },
        { "bamboo", "silu", NULL, NULL, PI2_EUNSUPPORTED },
        { "turbosparsemixtral", "silu", NULL, NULL, PI2_EUNSUPPORTED },
        { NULL, NULL, "rope_scaling", "{\"type\": \"yarn\", \"factor\": 2.0}", PI2_EUNSUPPORTED },
        { NULL, NULL, "rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 4.0, \"beta_fast\": 32.0}",
          PI2_EUNSUPPORTED },
        { NULL, NULL, "rope_scaling", "{\"rope_type\": \"longrope\", \"short_factor\": [1.0], \"long_factor\": [2.0]}",
          PI2_EUNSUPPORTED },
        { NULL, NULL, "rope_scaling", "{\"type\": \"su\", \"factor\": 2.0}", PI2_EUNSUPPORTED },
        { NULL, NULL, "rope_scaling", "{\"type\": \"ntk\", \"factor\": 2.0}", PI2_EUNSUPPORTED },
        { NULL, NULL, "rope_scaling", "{\"rope_type\": \"Linear\", \"factor\": 2.0}", PI2_EUNSUPPORTED },
        { "bamboo", "fatrelu", NULL, NULL, PI2_EUNSUPPORTED },
        { "turbosparsemixtral", "fatrelu", NULL, NULL, PI2_EUNSUPPORTED },
        { "sparsellama", "gelu", NULL, NULL, PI2_EUNSUPPORTED },
        { NULL, "FATReLU", NULL, NULL, PI2_EUNSUPPORTED },
        { NULL, NULL, "attention_bias", "true", PI2_EUNSUPPORTED },
        { NULL, NULL, "mlp_bias", "true", PI2_EUNSUPPORTED },
        { NULL, NULL, "num_local_experts", "8", PI2_EUNSUPPORTED },
        /* missing required keys */
        { NULL, NULL, "model_type", NULL, PI2_ENOTFOUND },
        { NULL, NULL, "hidden_act", NULL, PI2_ENOTFOUND },
        { NULL, NULL, "hidden_size", NULL, PI2_ENOTFOUND },
        { NULL, NULL, "intermediate_size", NULL, PI2_ENOTFOUND },
        { NULL, NULL, "num_hidden_layers", NULL, PI2_ENOTFOUND },
        { NULL, NULL, "num_attention_heads", NULL, PI2_ENOTFOUND },
        { NULL, NULL, "vocab_size", NULL, PI2_ENOTFOUND },
        { NULL, NULL, "max_position_embeddings", NULL, PI2_ENOTFOUND },
        { NULL, NULL, "hidden_size", "null", PI2_ENOTFOUND },
        { "mixtral", NULL, "num_local_experts", NULL, PI2_ENOTFOUND },
        { "mixtral", NULL, "num_experts_per_tok", NULL, PI2_ENOTFOUND },
        { "turbosparsemixtral", "relu", "num_local_experts", NULL, PI2_ENOTFOUND },
        { "sparsellama", "fatrelu", "hidden_act_param", NULL, PI2_ENOTFOUND },
        { NULL, "fatrelu", "hidden_act_param", "null", PI2_ENOTFOUND },
        { NULL, NULL, "rope_scaling", "{}", PI2_ENOTFOUND },
        { NULL, NULL, "rope_scaling", "{\"factor\": 2.0}", PI2_ENOTFOUND },
        { NULL, NULL, "rope_scaling", "{\"rope_type\": null, \"factor\": 2.0}", PI2_ENOTFOUND },
        { NULL, NULL, "rope_scaling", "{\"rope_type\": \"linear\"}", PI2_ENOTFOUND },
        { NULL, NULL, "rope_scaling", "{\"type\": \"dynamic\", \"factor\": null}", PI2_ENOTFOUND },
        { NULL, NULL, "rope_scaling",
          "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"high_freq_factor\": 4.0,"
          " \"original_max_position_embeddings\": 64}", PI2_ENOTFOUND },
        { NULL, NULL, "rope_scaling",
          "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0,"
          " \"original_max_position_embeddings\": 64}", PI2_ENOTFOUND },
        { NULL, NULL, "rope_scaling",
          "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0}",
          PI2_ENOTFOUND },
        { NULL, NULL, "rope_scaling",
          "{\"rope_type\": \"llama3\", \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,"
          " \"original_max_position_embeddings\": 64}", PI2_ENOTFOUND },
        /* wrong JSON types */
        { NULL, NULL, "model_type", "3", PI2_EFORMAT },
        { NULL, NULL, "hidden_act", "[\"silu\"]", PI2_EFORMAT },
        { NULL, NULL, "hidden_size", "\"64\"", PI2_EFORMAT },
        { NULL, NULL, "hidden_size", "64.0", PI2_EFORMAT },
        { NULL, NULL, "num_key_value_heads", "true", PI2_EFORMAT },
        { NULL, NULL, "head_dim", "8.5", PI2_EFORMAT },
        { NULL, NULL, "rope_theta", "\"10000\"", PI2_EFORMAT },
        { NULL, NULL, "rms_norm_eps", "[1e-6]", PI2_EFORMAT },
        { NULL, NULL, "tie_word_embeddings", "1", PI2_EFORMAT },
        { NULL, NULL, "tie_word_embeddings", "\"true\"", PI2_EFORMAT },
        { NULL, NULL, "bos_token_id", "\"<s>\"", PI2_EFORMAT },
        { NULL, NULL, "eos_token_id", "\"</s>\"", PI2_EFORMAT },
        { NULL, NULL, "eos_token_id", "[2, \"x\"]", PI2_EFORMAT },
        { NULL, NULL, "attention_bias", "0", PI2_EFORMAT },
        { "mixtral", NULL, "num_local_experts", "\"8\"", PI2_EFORMAT },
        { NULL, "fatrelu", "hidden_act_param", "\"0.01\"", PI2_EFORMAT },
        { NULL, "fatrelu", "hidden_act_param", "[0.01]", PI2_EFORMAT },
        { NULL, NULL, "rope_scaling", "[\"linear\", 2.0]", PI2_EFORMAT },
        { NULL, NULL, "rope_scaling", "\"linear\"", PI2_EFORMAT },
        { NULL, NULL, "rope_scaling", "2.0", PI2_EFORMAT },
        { NULL, NULL, "rope_scaling", "{\"rope_type\": 1, \"factor\": 2.0}", PI2_EFORMAT },
        { NULL, NULL, "rope_scaling", "{\"type\": [\"linear\"], \"factor\": 2.0}", PI2_EFORMAT },
        { NULL, NULL, "rope_scaling", "{\"rope_type\": \"linear\", \"type\": \"dynamic\", \"factor\": 2.0}",
          PI2_EFORMAT },
        { NULL, NULL, "rope_scaling", "{\"rope_type\": \"linear\", \"factor\": \"2.0\"}", PI2_EFORMAT },
        { NULL, NULL, "rope_scaling", "{\"rope_type\": \"dynamic\", \"factor\": true}", PI2_EFORMAT },
        { NULL, NULL, "rope_scaling",
          "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": \"1\", \"high_freq_factor\": 4.0,"
          " \"original_max_position_embeddings\": 64}", PI2_EFORMAT },
        { NULL, NULL, "rope_scaling",
          "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,"
          " \"original_max_position_embeddings\": 64.0}", PI2_EFORMAT },
        /* non-positive or absurd sizes */
        { NULL, NULL, "hidden_size", "0", PI2_ERANGE },
        { NULL, NULL, "hidden_size", "-64", PI2_ERANGE },
        { NULL, NULL, "hidden_size", "2097152", PI2_ERANGE },
        { NULL, NULL, "hidden_size", "99999999999999", PI2_ERANGE },
        { NULL, NULL, "intermediate_size", "0", PI2_ERANGE },
        { NULL, NULL, "intermediate_size", "1048577", PI2_ERANGE },
        { NULL, NULL, "num_hidden_layers", "0", PI2_ERANGE },
        { NULL, NULL, "num_hidden_layers", "1025", PI2_ERANGE },
        { NULL, NULL, "num_attention_heads", "-8", PI2_ERANGE },
        { NULL, NULL, "num_key_value_heads", "0", PI2_ERANGE },
        { NULL, NULL, "head_dim", "0", PI2_ERANGE },
        { NULL, NULL, "head_dim", "1048576", PI2_ERANGE }, /* heads * head_dim over the cap */
        { NULL, NULL, "vocab_size", "0", PI2_ERANGE },
        { NULL, NULL, "vocab_size", "4194305", PI2_ERANGE },
        { NULL, NULL, "max_position_embeddings", "0", PI2_ERANGE },
        { NULL, NULL, "rope_theta", "0", PI2_ERANGE },
        { NULL, NULL, "rope_theta", "-10000.0", PI2_ERANGE },
        { NULL, NULL, "rms_norm_eps", "0", PI2_ERANGE },
        { NULL, NULL, "rms_norm_eps", "1.5", PI2_ERANGE },
        { NULL, NULL, "bos_token_id", "300", PI2_ERANGE },
        { NULL, NULL, "bos_token_id", "-1", PI2_ERANGE },
        { NULL, NULL, "eos_token_id", "300", PI2_ERANGE },
        { NULL, NULL, "eos_token_id", "-2", PI2_ERANGE },
        { NULL, NULL, "eos_token_id", "[1, 2, 3, 4, 5, 6, 7, 8, 9]", PI2_ERANGE }, /* > PI2_MAX_EOS */
        { NULL, "fatrelu", "hidden_act_param", "-0.01", PI2_ERANGE },
        { NULL, "fatrelu", "hidden_act_param", "1e39", PI2_ERANGE }, /* not a finite float */
        { NULL, NULL, "rope_scaling", "{\"rope_type\": \"linear\", \"factor\": 0.5}", PI2_ERANGE },
        { NULL, NULL, "rope_scaling", "{\"rope_type\": \"dynamic\", \"factor\": 0}", PI2_ERANGE },
        { NULL, NULL, "rope_scaling", "{\"rope_type\": \"dynamic\", \"factor\": -2.0}", PI2_ERANGE },
        { NULL, NULL, "rope_scaling", "{\"type\": \"linear\", \"factor\": 1025.0}", PI2_ERANGE },
        { NULL, NULL, "rope_scaling",
          "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 0.0, \"high_freq_factor\": 4.0,"
          " \"original_max_position_embeddings\": 64}", PI2_ERANGE },
        { NULL, NULL, "rope_scaling",
          "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 4.0, \"high_freq_factor\": 4.0,"
          " \"original_max_position_embeddings\": 64}", PI2_ERANGE },
        { NULL, NULL, "rope_scaling",
          "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,"
          " \"original_max_position_embeddings\": 0}", PI2_ERANGE },
        { NULL, NULL, "rope_scaling",
          "{\"rope_type\": \"llama3\", \"factor\": 0.9, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,"
          " \"original_max_position_embeddings\": 64}", PI2_ERANGE },
        { NULL, NULL, "rope_scaling",
          "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,"
          " \"original_max_position_embeddings\": 2097152}", PI2_ERANGE },
        { NULL, NULL, "eos_token_id", "[2, 300]", PI2_ERANGE },
        { "mixtral", NULL, "num_local_experts", "0", PI2_ERANGE },
        { "mixtral", NULL, "num_local_experts", "257", PI2_ERANGE },
        { "mixtral", NULL, "num_experts_per_tok", "0", PI2_ERANGE },
        { "mixtral", NULL, "num_experts_per_tok", "5", PI2_ERANGE }, /* > 4 experts */
        /* heads not dividing */
        { NULL, NULL, "num_key_value_heads", "3", PI2_EFORMAT },
        { NULL, NULL, "num_key_value_heads", "16", PI2_EFORMAT },
        { NULL, NULL, "num_attention_heads", "7", PI2_EFORMAT }, /* 64 % 7 with no head_dim */
        { NULL, NULL, "head_dim", "7", PI2_EFORMAT },            /* odd: no RoPE pairs */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const reject_case *c = &cases[i];
        pi2_model_desc d;
        pi2_err e;
        int rc = parse_mut(c->type, c->act, c->key, c->val, &d, &e);
        if (rc != c->code)
            fail_msg("case %zu (%s %s %s=%s): got %d (%s), want %d", i, c->type ? c->type : "-",
                     c->act ? c->act : "-", c->key ? c->key : "-", c->val ? c->val : "(removed)", rc, e.msg,
                     c->code);
    }

    /* Whole-document problems. */
    pi2_model_desc d;
    pi2_err e;
    assert_int_equal(parse_str("", &d, &e), PI2_EFORMAT);
    assert_int_equal(parse_str("{\"model_type\": ", &d, &e), PI2_EFORMAT);
    assert_int_equal(parse_str("[1, 2]", &d, &e), PI2_EFORMAT);
    assert_int_equal(parse_str("{\"model_type\": \"llama\", \"model_type\": \"gpt2\"}", &d, &e), PI2_EFORMAT);
    assert_int_equal(parse_str("{\"hidden_size\": NaN}", &d, &e), PI2_EFORMAT);
    assert_int_equal(pi2_config_parse(NULL, 0, "x", &d, &e), PI2_EINVAL);
}

/* Every accepted rope_scaling form: the three types under either key, the
 * published Llama 3 example, "default", extra keys ignored as HF does. */
static void test_rope_scaling(void **state)
{
    (void)state;
    pi2_model_desc d;
    pi2_err e;
    assert_int_equal(parse_mut(NULL, NULL, "rope_scaling", "null", &d, &e), 0);
    assert_int_equal(d.rope.type, PI2_ROPE_DEFAULT);
    assert_int_equal(parse_mut(NULL, NULL, "rope_scaling", NULL, &d, &e), 0);
    assert_int_equal(d.rope.type, PI2_ROPE_DEFAULT);
    assert_int_equal(pi2_desc_max_ctx(&d), 128);
    assert_int_equal(parse_mut(NULL, NULL, "rope_scaling", "{\"rope_type\": \"default\"}", &d, &e), 0);
    assert_int_equal(d.rope.type, PI2_ROPE_DEFAULT);
    assert_true(d.rope.factor == 0);

    assert_int_equal(parse_mut(NULL, NULL, "rope_scaling", "{\"type\": \"linear\", \"factor\": 2.0}", &d, &e), 0);
    assert_int_equal(d.rope.type, PI2_ROPE_LINEAR);
    assert_true(d.rope.factor == 2.0);
    assert_int_equal(pi2_desc_max_ctx(&d), 128); /* linear: max_position_embeddings is the extended length */
    assert_int_equal(parse_mut(NULL, NULL, "rope_scaling", "{\"rope_type\": \"linear\", \"factor\": 4}", &d, &e), 0);
    assert_true(d.rope.factor == 4.0); /* an integer factor is a number too */
    assert_int_equal(parse_mut(NULL, NULL, "rope_scaling",
                               "{\"rope_type\": \"linear\", \"type\": \"linear\", \"factor\": 1.0}", &d, &e), 0);
    assert_int_equal(d.rope.type, PI2_ROPE_LINEAR);

    assert_int_equal(parse_mut(NULL, NULL, "rope_scaling",
                               "{\"type\": \"dynamic\", \"factor\": 2.5, \"original_max_position_embeddings\": 64}",
                               &d, &e), 0);
    assert_int_equal(d.rope.type, PI2_ROPE_DYNAMIC);
    assert_true(d.rope.factor == 2.5);
    assert_int_equal(d.rope.orig_max_pos, 0); /* dynamic does not use it (HF neither) */
    assert_int_equal(pi2_desc_max_ctx(&d), 320); /* 2.5 * 128 */
    assert_false(pi2_rope_varies(&d, 127));
    assert_true(pi2_rope_varies(&d, 128));

    /* as published for Llama 3.1 (shared/published-formats/README.md) */
    assert_int_equal(parse_mut(NULL, NULL, "rope_scaling",
                               "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0,"
                               " \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}",
                               &d, &e), 0);
    assert_int_equal(d.rope.type, PI2_ROPE_LLAMA3);
    assert_true(d.rope.factor == 8.0 && d.rope.low_freq_factor == 1.0 && d.rope.high_freq_factor == 4.0);
    assert_int_equal(d.rope.orig_max_pos, 8192);
    assert_int_equal(pi2_desc_max_ctx(&d), 128);
    assert_false(pi2_rope_varies(&d, 100000));
    assert_int_equal(parse_mut(NULL, NULL, "rope_scaling",
                               "{\"type\": \"llama3\", \"factor\": 32, \"low_freq_factor\": 1,"
                               " \"high_freq_factor\": 4, \"original_max_position_embeddings\": 8192,"
                               " \"attention_factor\": 1.0}", &d, &e), 0);
    assert_true(d.rope.factor == 32.0);

    /* dynamic needs hd > 2 (the base's exponent hd / (hd - 2)); hd 8 here */
    pi2_model_desc x = d;
    x.rope = (pi2_rope_scaling){ .type = PI2_ROPE_DYNAMIC, .factor = 2.0 };
    assert_int_equal(pi2_config_validate(&x, "x", &e), 0);
    x.head_dim = 2;
    x.n_heads = 8;
    pi2_err_clear(&e);
    assert_int_equal(pi2_config_validate(&x, "x", &e), PI2_ERANGE);
    /* the cap of the dynamic context */
    x = d;
    x.max_pos = PI2_CFG_MAX_DIM / 2;
    x.rope = (pi2_rope_scaling){ .type = PI2_ROPE_DYNAMIC, .factor = 3.0 };
    assert_int_equal(pi2_desc_max_ctx(&x), PI2_CFG_MAX_DIM);

    /* descriptions built in code: fields a type does not use must be 0 */
    x = d;
    x.rope = (pi2_rope_scaling){ .type = PI2_ROPE_DEFAULT, .factor = 2.0 };
    pi2_err_clear(&e);
    assert_int_equal(pi2_config_validate(&x, "x", &e), PI2_EINVAL);
    x.rope = (pi2_rope_scaling){ .type = PI2_ROPE_LINEAR, .factor = 2.0, .orig_max_pos = 64 };
    pi2_err_clear(&e);
    assert_int_equal(pi2_config_validate(&x, "x", &e), PI2_EINVAL);
    x.rope = (pi2_rope_scaling){ .type = (pi2_rope_type)7, .factor = 2.0 };
    pi2_err_clear(&e);
    assert_int_equal(pi2_config_validate(&x, "x", &e), PI2_EINVAL);
    x = d;
    x.rope = (pi2_rope_scaling){ 0 };
    x.act_param = 0.5f; /* a threshold without FATReLU */
    pi2_err_clear(&e);
    assert_int_equal(pi2_config_validate(&x, "x", &e), PI2_EINVAL);
    x.act = PI2_ACT_FATRELU;
    assert_int_equal(pi2_config_validate(&x, "x", &e), 0);
    x.act_param = NAN;
    pi2_err_clear(&e);
    assert_int_equal(pi2_config_validate(&x, "x", &e), PI2_ERANGE);
    x.act_param = -1.0f;
    pi2_err_clear(&e);
    assert_int_equal(pi2_config_validate(&x, "x", &e), PI2_ERANGE);
}

/* Inverse frequencies of every type against values computed independently
 * when this test was written (python3, float32 rounding by struct.pack('f')
 * after every step HF's torch code takes in float32; hd = 16, theta 1e4):
 *   default  f32(1 / f32(f32(1e4) ** f32(2i/16)))
 *   linear   f32(default / 4.0)
 *   dynamic  f = 2, M = 32, at position p (L = p + 1): base = 1e4 * (2*L/32 - 1) ** (16/14),
 *            e.g. L = 48: 22081.790273476247; then default with that base
 *   llama3   factor 8, low 1, high 4, orig 64: wl = f32(f32(2 pi) / inv); wl > 64: inv / 8;
 *            16 <= wl <= 64: s = (f32(64 / wl) - 1) / 3, (1 - s) * inv / 8 + s * inv */
static void test_rope_inv_freq(void **state)
{
    (void)state;
    static const double want_default[8] = { 1, 0.316227764, 0.100000001, 0.0316227786,
                                            0.00999999978, 0.00316227786, 0.00100000005, 0.000316227786 };
    static const double want_linear[8] = { 0.25, 0.079056941, 0.0250000004, 0.00790569466,
                                           0.00249999994, 0.000790569466, 0.000250000012, 7.90569466e-05 };
    static const double want_dyn48[8] = { 1, 0.286414951, 0.0820335299, 0.0234956332,
                                          0.0067295013, 0.00192742981, 0.000552044716, 0.000158113879 };
    static const double want_dyn40[8] = { 1, 0.298431128, 0.0890611336, 0.0265786126,
                                          0.00793188531, 0.0023671214, 0.000706422667, 0.000210818514 };
    static const double want_llama3[8] = { 1, 0.244384587, 0.0130422562, 0.00395284733,
                                           0.00124999997, 0.000395284733, 0.000125000006, 3.95284733e-05 };
    pi2_model_desc d = { .arch = PI2_ARCH_LLAMA, .act = PI2_ACT_SILU, .hidden = 64, .n_ff = 64, .n_layers = 1,
                         .n_heads = 4, .n_kv_heads = 4, .head_dim = 16, .vocab = 300, .max_pos = 32,
                         .rope_theta = 10000.0, .rms_eps = 1e-6f, .bos_id = 1, .n_eos = 1, .eos_ids = { 2 } };
    struct { pi2_rope_scaling r; int pos; const double *want; } cases[] = {
        { { .type = PI2_ROPE_DEFAULT }, 0, want_default },
        { { .type = PI2_ROPE_DEFAULT }, 1000, want_default },
        { { .type = PI2_ROPE_LINEAR, .factor = 4.0 }, 5, want_linear },
        { { .type = PI2_ROPE_DYNAMIC, .factor = 2.0 }, 0, want_default },
        { { .type = PI2_ROPE_DYNAMIC, .factor = 2.0 }, 31, want_default }, /* L = 32 = M: unchanged */
        { { .type = PI2_ROPE_DYNAMIC, .factor = 2.0 }, 39, want_dyn40 },
        { { .type = PI2_ROPE_DYNAMIC, .factor = 2.0 }, 47, want_dyn48 },
        { { .type = PI2_ROPE_LLAMA3, .factor = 8.0, .low_freq_factor = 1.0, .high_freq_factor = 4.0,
            .orig_max_pos = 64 }, 3, want_llama3 },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        d.rope = cases[c].r;
        pi2_err e = { 0 };
        assert_int_equal(pi2_config_validate(&d, "x", &e), 0);
        float inv[8];
        pi2_rope_inv_freq(&d, cases[c].pos, inv);
        for (int i = 0; i < 8; i++)
            if (!(fabs(inv[i] - cases[c].want[i]) <= 2e-6 * cases[c].want[i]))
                fail_msg("%s at %d: inv_freq[%d] = %.9g, want %.9g", pi2_rope_type_name(d.rope.type), cases[c].pos,
                         i, (double)inv[i], cases[c].want[i]);
        assert_true(pi2_rope_varies(&d, cases[c].pos) == (cases[c].want == want_dyn40 || cases[c].want == want_dyn48));
    }
}

/* End of turn from every file: the published TurboSparse-Mistral-Instruct
 * config.json and tokenizer_config.json (byte for byte) over a tokenizer
 * that defines its 32002 ids, generation_config.json in each form, each
 * malformed file named in a one-line error, nothing changed on error. */
static void write_turbosparse_tokenizer(const char *path)
{
    pi2_err e = { 0 };
    assert_int_equal(pi2_tok_write_synthetic(path, 32000, 1, &e), 0);
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    assert_non_null(o);
    json_t *added = json_object_get(o, "added_tokens");
    assert_true(json_is_array(added));
    static const char *const extra[] = { "<|im_end|>", "<|im_start|>" };
    for (int i = 0; i < 2; i++)
        json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", 32000 + i, "content",
                                               extra[i], "single_word", 0, "lstrip", 0, "rstrip", 0,
                                               "normalized", 0, "special", 1));
    assert_int_equal(json_dump_file(o, path, 0), 0);
    json_decref(o);
}

static int merge_in(const char *dir, pi2_model_desc *d, int *n_tokens, pi2_err *e)
{
    pi2_err_clear(e);
    int rc = pi2_config_read_model(dir, d, n_tokens, e);
    if (rc) {
        assert_int_equal(e->code, rc);
        assert_null(strchr(e->msg, '\n'));
    }
    return rc;
}

static void test_end_of_turn(void **state)
{
    (void)state;
    const char *sh = pi2t_shared();
    char pub[1024], tmp[64], dir[128], path[256], src[1100];
    if (!sh) {
        fprintf(stderr, "skip: shared dir not found (set PI2_SHARED)\n");
        skip();
    }
    snprintf(pub, sizeof pub, "%s/published-formats/turbosparse-mistral-instruct", sh);
    pi2t_tmpdir(tmp, sizeof tmp);
    snprintf(dir, sizeof dir, "%s/ts", tmp);
    mkdir(dir, 0755);
    for (int i = 0; i < 2; i++) {
        const char *f = i ? "tokenizer_config.json" : "config.json";
        char *txt;
        size_t len;
        pi2_err e = { 0 };
        snprintf(src, sizeof src, "%s/%s", pub, f);
        assert_int_equal(pi2_read_file(src, 1 << 20, &txt, &len, &e), 0);
        snprintf(path, sizeof path, "%s/%s", dir, f);
        pi2t_write(path, txt, len);
        free(txt);
    }
    pi2_model_desc d;
    pi2_err e;
    int nt = -1;
    /* config.json alone: what it says (2); no tokenizer, no count */
    char cfg[256];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    assert_int_equal(merge_in(cfg, &d, &nt, &e), 0); /* a file path: the config only */
    assert_int_equal(d.n_eos, 1);
    assert_int_equal(nt, 0);
    /* without tokenizer.json, tokenizer_config's eos_token cannot be looked up: skipped */
    assert_int_equal(merge_in(dir, &d, &nt, &e), 0);
    assert_int_equal(d.n_eos, 1);
    assert_int_equal(d.eos_ids[0], 2);
    assert_int_equal(nt, 0);

    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    write_turbosparse_tokenizer(path);
    assert_int_equal(merge_in(dir, &d, &nt, &e), 0);
    assert_int_equal(d.arch, PI2_ARCH_BAMBOO);
    assert_int_equal(d.vocab, 32064);
    assert_int_equal(nt, 32002); /* 62 padded rows */
    assert_int_equal(d.n_eos, 2);
    assert_int_equal(d.eos_ids[0], 2);
    assert_int_equal(d.eos_ids[1], 32000); /* <|im_end|> */
    assert_true(pi2_desc_is_end(&d, 32000));
    assert_false(pi2_desc_is_end(&d, 32001));

    /* generation_config.json: an int, a list (repeats merge), null */
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    static const struct { const char *json; int n; int ids[4]; } gen[] = {
        { "{\"bos_token_id\": 1, \"eos_token_id\": 32001}", 3, { 2, 32001, 32000 } },
        { "{\"eos_token_id\": [32000, 7, 2, 7]}", 3, { 2, 32000, 7 } },
        { "{\"eos_token_id\": null, \"do_sample\": true}", 2, { 2, 32000 } },
        { "{}", 2, { 2, 32000 } },
    };
    for (size_t i = 0; i < sizeof gen / sizeof gen[0]; i++) {
        pi2t_write(path, gen[i].json, strlen(gen[i].json));
        assert_int_equal(merge_in(dir, &d, NULL, &e), 0);
        assert_int_equal(d.n_eos, gen[i].n);
        for (int k = 0; k < gen[i].n; k++)
            assert_int_equal(d.eos_ids[k], gen[i].ids[k]);
    }
    /* eos_token as an AddedToken object */
    pi2_model_desc base;
    assert_int_equal(pi2_config_read(dir, &base, &e), 0);
    pi2_tok *tok = NULL;
    snprintf(src, sizeof src, "%s/tokenizer.json", dir);
    assert_int_equal(pi2_tok_load(&tok, src, &e), 0);
    snprintf(src, sizeof src, "%s/tokenizer_config.json", dir);
    const char *obj = "{\"eos_token\": {\"__type\": \"AddedToken\", \"content\": \"<|im_start|>\", \"lstrip\": false}}";
    pi2t_write(src, obj, strlen(obj));
    d = base;
    assert_int_equal(pi2_config_merge_eos(dir, tok, &d, &e), 0);
    assert_int_equal(d.n_eos, 2);
    assert_int_equal(d.eos_ids[1], 32001);
    d = base;
    assert_int_equal(pi2_config_merge_eos(dir, NULL, &d, &e), 0); /* no tokenizer: skipped */
    assert_int_equal(d.n_eos, 1);

    /* malformed files: code, the file named, *d unchanged */
    static const struct { const char *file, *json; int code; } bad[] = {
        { "generation_config.json", "{\"eos_token_id\": \"</s>\"}", PI2_EFORMAT },
        { "generation_config.json", "{\"eos_token_id\": [2, 2.5]}", PI2_EFORMAT },
        { "generation_config.json", "{\"eos_token_id\": 2,", PI2_EFORMAT },
        { "generation_config.json", "[2]", PI2_EFORMAT },
        { "generation_config.json", "{\"eos_token_id\": 2, \"eos_token_id\": 3}", PI2_EFORMAT },
        { "generation_config.json", "{\"eos_token_id\": 32064}", PI2_ERANGE },
        { "generation_config.json", "{\"eos_token_id\": -1}", PI2_ERANGE },
        { "generation_config.json", "{\"eos_token_id\": [3, 4, 5, 6, 7, 8, 9, 10]}", PI2_ERANGE }, /* 9 with 2 */
        { "tokenizer_config.json", "{\"eos_token\": 2}", PI2_EFORMAT },
        { "tokenizer_config.json", "{\"eos_token\": {\"id\": 2}}", PI2_EFORMAT },
        { "tokenizer_config.json", "{\"eos_token\": [\"</s>\"]}", PI2_EFORMAT },
        { "tokenizer_config.json", "not json", PI2_EFORMAT },
        { "tokenizer_config.json", "{\"eos_token\": \"<|endoftext|>\"}", PI2_ENOTFOUND },
    };
    const char *good_tc = "{\"eos_token\": \"<|im_end|>\"}";
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(path, sizeof path, "%s/generation_config.json", dir);
        pi2t_write(path, "{}", 2);
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        pi2t_write(path, good_tc, strlen(good_tc));
        snprintf(path, sizeof path, "%s/%s", dir, bad[i].file);
        pi2t_write(path, bad[i].json, strlen(bad[i].json));
        d = base;
        pi2_err_clear(&e);
        int rc = pi2_config_merge_eos(dir, tok, &d, &e);
        if (rc != bad[i].code || !strstr(e.msg, path) || strchr(e.msg, '\n'))
            fail_msg("case %zu (%s): got %d (%s), want %d naming %s", i, bad[i].json, rc, e.msg, bad[i].code, path);
        assert_int_equal(d.n_eos, 1);
        assert_int_equal(merge_in(dir, &d, &nt, &e), bad[i].code); /* the same through the directory reader */
    }
    /* a tokenizer larger than the vocabulary, a broken tokenizer.json */
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    pi2t_write(path, good_tc, strlen(good_tc));
    snprintf(path, sizeof path, "%s/config.json", dir);
    base.vocab = 32001;
    assert_int_equal(pi2_config_write(path, &base, &e), 0);
    assert_int_equal(merge_in(dir, &d, &nt, &e), PI2_EFORMAT);
    assert_non_null(strstr(e.msg, "tokenizer.json"));
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    pi2t_write(path, "{\"model\": ", 10);
    assert_int_equal(merge_in(dir, &d, &nt, &e), PI2_EFORMAT);
    assert_non_null(strstr(e.msg, "tokenizer.json"));
    pi2_err_clear(&e);
    assert_int_equal(pi2_config_merge_eos(NULL, NULL, &d, &e), PI2_EINVAL);
    pi2_tok_free(tok);
    pi2t_rmtree(tmp);
}

static void test_read_errors(void **state)
{
    (void)state;
    char dir[64], path[128];
    pi2_model_desc d;
    pi2_err e = { 0 };
    pi2t_tmpdir(dir, sizeof dir);
    assert_int_equal(pi2_config_read(dir, &d, &e), PI2_ENOTFOUND); /* dir without config.json */
    assert_non_null(strstr(e.msg, "config.json"));
    snprintf(path, sizeof path, "%s/config.json", dir);
    pi2t_write(path, "{not json", 9);
    pi2_err_clear(&e);
    assert_int_equal(pi2_config_read(dir, &d, &e), PI2_EFORMAT);
    assert_non_null(strstr(e.msg, path));
    /* Over the size cap. */
    size_t big = PI2_CFG_MAX_BYTES + 10;
    char *buf = malloc(big);
    assert_non_null(buf);
    memset(buf, ' ', big);
    pi2t_write(path, buf, big);
    free(buf);
    pi2_err_clear(&e);
    assert_int_equal(pi2_config_read(path, &d, &e), PI2_ERANGE);
    pi2t_rmtree(dir);
}

static void check_same(const pi2_model_desc *a, const pi2_model_desc *b)
{
    assert_int_equal(a->arch, b->arch);
    assert_int_equal(a->act, b->act);
    assert_int_equal(a->hidden, b->hidden);
    assert_int_equal(a->n_ff, b->n_ff);
    assert_int_equal(a->n_layers, b->n_layers);
    assert_int_equal(a->n_heads, b->n_heads);
    assert_int_equal(a->n_kv_heads, b->n_kv_heads);
    assert_int_equal(a->head_dim, b->head_dim);
    assert_int_equal(a->vocab, b->vocab);
    assert_int_equal(a->max_pos, b->max_pos);
    assert_true(a->rope_theta == b->rope_theta);
    assert_true(a->rms_eps == b->rms_eps);
    assert_int_equal(a->tie_embeddings, b->tie_embeddings);
    assert_int_equal(a->n_experts, b->n_experts);
    assert_int_equal(a->n_experts_used, b->n_experts_used);
    assert_int_equal(a->bos_id, b->bos_id);
    assert_int_equal(a->n_eos, b->n_eos);
    for (int i = 0; i < a->n_eos; i++)
        assert_int_equal(a->eos_ids[i], b->eos_ids[i]);
    assert_true(a->act_param == b->act_param);
    assert_int_equal(a->rope.type, b->rope.type);
    assert_true(a->rope.factor == b->rope.factor);
    assert_true(a->rope.low_freq_factor == b->rope.low_freq_factor);
    assert_true(a->rope.high_freq_factor == b->rope.high_freq_factor);
    assert_int_equal(a->rope.orig_max_pos, b->rope.orig_max_pos);
}

static void test_round_trip(void **state)
{
    (void)state;
    char dir[64], path[128];
    pi2t_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    const pi2_model_desc descs[] = {
        { .arch = PI2_ARCH_LLAMA, .act = PI2_ACT_SILU, .hidden = 128, .n_ff = 384, .n_layers = 2, .n_heads = 8,
          .n_kv_heads = 4, .head_dim = 16, .vocab = 2048, .max_pos = 512, .rope_theta = 10000.0,
          .rms_eps = 1e-6f, .tie_embeddings = true, .bos_id = 1, .n_eos = 1, .eos_ids = { 2 } },
        { .arch = PI2_ARCH_MISTRAL, .act = PI2_ACT_RELU, .hidden = 96, .n_ff = 200, .n_layers = 1, .n_heads = 4,
          .n_kv_heads = 1, .head_dim = 40, .vocab = 77, .max_pos = 64, .rope_theta = 1234567.891,
          .rms_eps = 1e-5f, .bos_id = -1, .n_eos = 0 },
        { .arch = PI2_ARCH_MIXTRAL, .act = PI2_ACT_SILU, .hidden = 32, .n_ff = 48, .n_layers = 2, .n_heads = 4,
          .n_kv_heads = 2, .head_dim = 8, .vocab = 50, .max_pos = 32, .rope_theta = 1e6, .rms_eps = 3.3e-7f,
          .n_experts = 8, .n_experts_used = 2, .bos_id = 0, .n_eos = 3, .eos_ids = { 49, 2, 0 } },
        { .arch = PI2_ARCH_BAMBOO, .act = PI2_ACT_DRELU, .hidden = 16, .n_ff = 64, .n_layers = 3, .n_heads = 2,
          .n_kv_heads = 2, .head_dim = 8, .vocab = 20, .max_pos = 8, .rope_theta = 10000.5, .rms_eps = 1e-6f,
          .bos_id = 1, .n_eos = 1, .eos_ids = { 2 } },
        { .arch = PI2_ARCH_TURBOSPARSE_MIXTRAL, .act = PI2_ACT_DRELU, .hidden = 16, .n_ff = 24, .n_layers = 1,
          .n_heads = 2, .n_kv_heads = 1, .head_dim = 8, .vocab = 20, .max_pos = 8, .rope_theta = 1e6,
          .rms_eps = 1e-5f, .n_experts = 8, .n_experts_used = 1, .bos_id = 1, .n_eos = 1, .eos_ids = { 2 } },
        { .arch = PI2_ARCH_SPARSELLAMA, .act = PI2_ACT_FATRELU, .act_param = 0.01f, .hidden = 32, .n_ff = 88,
          .n_layers = 2, .n_heads = 4, .n_kv_heads = 4, .head_dim = 8, .vocab = 32064, .max_pos = 4096,
          .rope_theta = 10000.0, .rms_eps = 1e-5f, .bos_id = 1, .n_eos = 8,
          .eos_ids = { 2, 32000, 32001, 5, 6, 7, 8, 9 } },
        { .arch = PI2_ARCH_LLAMA, .act = PI2_ACT_FATRELU, .act_param = 0.3f, .hidden = 16, .n_ff = 32, .n_layers = 1,
          .n_heads = 2, .n_kv_heads = 1, .head_dim = 8, .vocab = 20, .max_pos = 8, .rope_theta = 5e5,
          .rope = { .type = PI2_ROPE_LINEAR, .factor = 2.0 }, .rms_eps = 1e-5f, .bos_id = 1, .n_eos = 1,
          .eos_ids = { 2 } },
        { .arch = PI2_ARCH_MISTRAL, .act = PI2_ACT_SILU, .hidden = 16, .n_ff = 32, .n_layers = 1, .n_heads = 2,
          .n_kv_heads = 1, .head_dim = 8, .vocab = 20, .max_pos = 8, .rope_theta = 1e4,
          .rope = { .type = PI2_ROPE_DYNAMIC, .factor = 2.5 }, .rms_eps = 1e-5f, .bos_id = 1, .n_eos = 1,
          .eos_ids = { 2 } },
        { .arch = PI2_ARCH_MIXTRAL, .act = PI2_ACT_FATRELU, .act_param = 0.125f, .hidden = 16, .n_ff = 32,
          .n_layers = 1, .n_heads = 2, .n_kv_heads = 1, .head_dim = 8, .vocab = 20, .max_pos = 8, .rope_theta = 5e5,
          .rope = { .type = PI2_ROPE_LLAMA3, .factor = 8.0, .low_freq_factor = 1.0, .high_freq_factor = 4.0,
                    .orig_max_pos = 8192 },
          .rms_eps = 1e-5f, .n_experts = 4, .n_experts_used = 2, .bos_id = 1, .n_eos = 1, .eos_ids = { 2 } },
    };
    for (size_t i = 0; i < sizeof descs / sizeof descs[0]; i++) {
        pi2_err e = { 0 };
        pi2_model_desc back;
        assert_int_equal(pi2_config_write_dtype(i % 2 ? dir : path, &descs[i], i % 2 ? "bfloat16" : NULL, &e), 0);
        assert_int_equal(pi2_config_read(path, &back, &e), 0);
        check_same(&descs[i], &back);
        /* Text checks: HF spellings, pretty floats, the dtype. */
        char *txt;
        size_t len;
        assert_int_equal(pi2_read_file(path, 1 << 20, &txt, &len, &e), 0);
        assert_non_null(strstr(txt, pi2_arch_class(descs[i].arch)));
        if (descs[i].act == PI2_ACT_DRELU)
            assert_non_null(strstr(txt, "\"hidden_act\": \"relu\""));
        if (descs[i].rms_eps == 1e-6f)
            assert_non_null(strstr(txt, "\"rms_norm_eps\": 1e-06,"));
        if (descs[i].rope_theta == 10000.0)
            assert_non_null(strstr(txt, "\"rope_theta\": 10000.0,"));
        if (descs[i].act == PI2_ACT_FATRELU)
            assert_non_null(strstr(txt, "\"hidden_act\": \"fatrelu\",\n  \"hidden_act_param\": "));
        if (descs[i].act_param == 0.01f)
            assert_non_null(strstr(txt, "\"hidden_act_param\": 0.01,"));
        if (descs[i].rope.type == PI2_ROPE_DEFAULT)
            assert_non_null(strstr(txt, "\"rope_scaling\": null,"));
        if (descs[i].rope.type == PI2_ROPE_LLAMA3) /* sorted keys, as HF's save_pretrained */
            assert_non_null(strstr(txt, "\"rope_scaling\": {\n    \"factor\": 8.0,\n"
                                        "    \"high_freq_factor\": 4.0,\n    \"low_freq_factor\": 1.0,\n"
                                        "    \"original_max_position_embeddings\": 8192,\n"
                                        "    \"rope_type\": \"llama3\"\n  },"));
        if (descs[i].rope.type == PI2_ROPE_LINEAR)
            assert_non_null(
                strstr(txt, "\"rope_scaling\": {\n    \"factor\": 2.0,\n    \"rope_type\": \"linear\"\n  },"));
        assert_true((strstr(txt, "\"torch_dtype\": \"bfloat16\"") != NULL) == (i % 2 == 1));
        free(txt);
    }

    /* Invalid descriptions and dtype are refused; nothing is written. */
    char path2[160];
    snprintf(path2, sizeof path2, "%s/bad.json", dir);
    pi2_err e = { 0 };
    pi2_model_desc bad = descs[0];
    bad.n_kv_heads = 3;
    assert_int_equal(pi2_config_write(path2, &bad, &e), PI2_EFORMAT);
    assert_non_null(strstr(e.msg, path2));
    bad = descs[0];
    bad.n_experts = 8; /* dense with experts */
    pi2_err_clear(&e);
    assert_int_equal(pi2_config_write(path2, &bad, &e), PI2_EINVAL);
    bad = descs[2];
    bad.n_experts_used = 9;
    pi2_err_clear(&e);
    assert_int_equal(pi2_config_write(path2, &bad, &e), PI2_ERANGE);
    bad = descs[3];
    bad.act = PI2_ACT_SILU;
    pi2_err_clear(&e);
    assert_int_equal(pi2_config_write(path2, &bad, &e), PI2_EUNSUPPORTED);
    bad = descs[0];
    bad.act = PI2_ACT_DRELU;
    pi2_err_clear(&e);
    assert_int_equal(pi2_config_write(path2, &bad, &e), PI2_EUNSUPPORTED);
    pi2_err_clear(&e);
    assert_int_equal(pi2_config_write_dtype(path2, &descs[0], "float64", &e), PI2_EINVAL);
    assert_false(pi2t_exists(path2));
    pi2_err_clear(&e);
    assert_int_equal(pi2_config_validate(NULL, "x", &e), PI2_EINVAL);

    char *txt;
    size_t len;
    assert_int_equal(pi2_config_format(&descs[2], "float16", &txt, &len, &e), 0);
    assert_int_equal(strlen(txt), len);
    pi2_model_desc back;
    assert_int_equal(pi2_config_parse(txt, len, "mem", &back, &e), 0);
    check_same(&descs[2], &back);
    free(txt);
    pi2t_rmtree(dir);
}

static void test_tensor_names(void **state)
{
    (void)state;
    pi2_model_desc dense = { .arch = PI2_ARCH_LLAMA }, moe = { .arch = PI2_ARCH_MIXTRAL };
    char b[128];
    static const struct {
        pi2_tname t;
        const char *dense, *moe;
    } tab[] = {
        { PI2_T_EMBED, "model.embed_tokens.weight", "model.embed_tokens.weight" },
        { PI2_T_OUT_NORM, "model.norm.weight", "model.norm.weight" },
        { PI2_T_LM_HEAD, "lm_head.weight", "lm_head.weight" },
        { PI2_T_ATTN_NORM, "model.layers.12.input_layernorm.weight", "model.layers.12.input_layernorm.weight" },
        { PI2_T_FFN_NORM, "model.layers.12.post_attention_layernorm.weight",
          "model.layers.12.post_attention_layernorm.weight" },
        { PI2_T_Q, "model.layers.12.self_attn.q_proj.weight", "model.layers.12.self_attn.q_proj.weight" },
        { PI2_T_K, "model.layers.12.self_attn.k_proj.weight", "model.layers.12.self_attn.k_proj.weight" },
        { PI2_T_V, "model.layers.12.self_attn.v_proj.weight", "model.layers.12.self_attn.v_proj.weight" },
        { PI2_T_O, "model.layers.12.self_attn.o_proj.weight", "model.layers.12.self_attn.o_proj.weight" },
        { PI2_T_GATE, "model.layers.12.mlp.gate_proj.weight", "model.layers.12.block_sparse_moe.experts.7.w1.weight" },
        { PI2_T_UP, "model.layers.12.mlp.up_proj.weight", "model.layers.12.block_sparse_moe.experts.7.w3.weight" },
        { PI2_T_DOWN, "model.layers.12.mlp.down_proj.weight", "model.layers.12.block_sparse_moe.experts.7.w2.weight" },
        { PI2_T_ROUTER, NULL, "model.layers.12.block_sparse_moe.gate.weight" },
        { PI2_T_PRED_FC1, "model.layers.12.mlp.predictor.fc1.weight",
          "model.layers.12.block_sparse_moe.experts.7.predictor.fc1.weight" },
        { PI2_T_PRED_FC2, "model.layers.12.mlp.predictor.fc2.weight",
          "model.layers.12.block_sparse_moe.experts.7.predictor.fc2.weight" },
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++) {
        if (tab[i].dense) {
            assert_true(pi2_tensor_name(b, sizeof b, &dense, tab[i].t, 12, 7));
            assert_string_equal(b, tab[i].dense);
            /* Exactly fits with its NUL; one byte less does not. */
            size_t n = strlen(tab[i].dense);
            assert_true(pi2_tensor_name(b, n + 1, &dense, tab[i].t, 12, 7));
            assert_false(pi2_tensor_name(b, n, &dense, tab[i].t, 12, 7));
        } else {
            assert_false(pi2_tensor_name(b, sizeof b, &dense, tab[i].t, 12, 7));
        }
        assert_true(pi2_tensor_name(b, sizeof b, &moe, tab[i].t, 12, 7));
        assert_string_equal(b, tab[i].moe);
    }
    pi2_model_desc ts = { .arch = PI2_ARCH_TURBOSPARSE_MIXTRAL }, bamboo = { .arch = PI2_ARCH_BAMBOO };
    assert_true(pi2_tensor_name(b, sizeof b, &ts, PI2_T_PRED_FC1, 0, 3));
    assert_string_equal(b, "model.layers.0.block_sparse_moe.experts.3.predictor.fc1.weight");
    assert_true(pi2_tensor_name(b, sizeof b, &bamboo, PI2_T_UP, 0, -1)); /* expert ignored when dense */
    assert_string_equal(b, "model.layers.0.mlp.up_proj.weight");
    assert_false(pi2_tensor_name(b, sizeof b, &dense, PI2_T_Q, -1, 0));
    assert_false(pi2_tensor_name(b, sizeof b, &moe, PI2_T_GATE, 0, -1));
    assert_false(pi2_tensor_name(b, sizeof b, &dense, (pi2_tname)99, 0, 0));
    assert_false(pi2_tensor_name(b, 0, &dense, PI2_T_EMBED, 0, 0));
    assert_false(pi2_tensor_name(NULL, 8, &dense, PI2_T_EMBED, 0, 0));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shared_models), cmocka_unit_test(test_base_and_defaults),
        cmocka_unit_test(test_every_arch),    cmocka_unit_test(test_rejections),
        cmocka_unit_test(test_rope_scaling),  cmocka_unit_test(test_rope_inv_freq),
        cmocka_unit_test(test_end_of_turn),
        cmocka_unit_test(test_read_errors),   cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_tensor_names),
    };
    return cmocka_run_group_tests_name("hfconfig", tests, NULL, NULL);
}
