/* Tiny replicas of the published activation-sparse checkpoints: the files
 * each family ships, as published (names, dtypes, sharding, config fields,
 * predictor files and conventions, tokenizer and generation configs), around
 * a planted-sparsity model (synth.h) of a few MB. They stand for models that
 * cannot be downloaded here, so they follow what the published files contain
 * rather than what pi2 writes itself.
 *
 *   family               writes (DIR, and DIR-predictor for a predictor repository)
 *   turbosparse-mistral  BambooForCausalLM / bamboo, dReLU; config.json and tokenizer_config.json
 *                        as TurboSparse-Mistral-Instruct publishes them (auto_map, sliding_window,
 *                        ChatML chat template, eos_token <|im_end|>) but for the dimensions; vocab
 *                        32064 of which the tokenizer defines 32002 (<|im_end|> 32000,
 *                        <|im_start|> 32001); bf16 in 4 safetensors shards + index; predictors in
 *                        the checkpoint (model.layers.L.mlp.predictor.fc{1,2}.weight)
 *   turbosparse-mixtral  TurboSparseMixtralForCausalLM / turbosparsemixtral, 8 experts, top-2,
 *                        dReLU per expert (w1 gate, w3 up, w2 down), vocab 57024 (32002 defined),
 *                        rope_theta 1e6, predictors per expert in the checkpoint; its
 *                        generation_config.json lists two end-of-turn ids
 *   bamboo               BambooForCausalLM / bamboo as Bamboo-base: vocab 32000, 3 bf16 shards,
 *                        no predictors in the checkpoint; DIR-predictor holds model_{L}.pt
 *                        (PyTorch zip, fc1.weight / fc2.weight, f16) and config.json
 *   prosparse            SparseLlamaForCausalLM / sparsellama, hidden_act fatrelu, hidden_act_param
 *                        0.01 (a neuron fires when its gate is > 0.01), Llama-2 shape (kv = heads),
 *                        2 bf16 shards; DIR-predictor holds model_{L}.pt (f16) and config.json
 *   relullama            LlamaForCausalLM / llama, hidden_act relu (ReGLU), float32, weights as
 *                        pytorch_model-0000N-of-00003.bin + pytorch_model.bin.index.json;
 *                        DIR-predictor holds model_{L}.pt (f32), no config.json
 * Every predictor is the planted one on the pre-norm residual (PowerInfer's
 * convention: the FFN norm's weights differ per dimension, so the normed
 * input gives a measurably worse recall), firing when its score is > 0.
 */
#ifndef PI2_FAMILY_H
#define PI2_FAMILY_H

#include "formats/common.h"

/* Names of the families above, NULL-terminated. */
extern const char *const pi2_family_names[];

/* Write family `name` into `dir` (which must not exist; nor may
 * "<dir>-predictor" for the families with a predictor repository). Both
 * appear only when complete. PI2_EINVAL for an unknown family; I/O errors. */
int pi2_family_write(const char *dir, const char *name, uint64_t seed, int threads, pi2_err *err);

#endif
