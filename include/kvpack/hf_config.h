// Hugging Face `config.json` -> ModelConfig, for LlamaForCausalLM (Llama 2/3.x, SmolLM2) and Qwen2ForCausalLM.
// Used by the safetensors runner (an HF model directory) and by the planner (any published config).
#pragma once
#include <cstdint>
#include <string>

#include "kvpack/model_config.h"

namespace kvpack {

// What config.json says beyond the shape: the dtype the checkpoint is published in (the planner's weight bytes).
struct HfConfigInfo {
  ModelConfig config;
  std::string torch_dtype;  // "bfloat16", "float16", "float32", ...; "" when the file does not say
  int dtype_bytes = 0;      // bytes per weight for torch_dtype; 0 when absent or not a plain float type
};

// `path` is a config.json file or a directory holding one. Throws kvpack::Error naming the file and the field for
// unreadable files, invalid JSON, missing fields, wrong types, non-positive sizes and unsupported architectures, and
// runs kvpack::validate(). n_params is computed from the shapes (count_params).
ModelConfig model_config_from_hf_json(const std::string& path);
HfConfigInfo read_hf_config(const std::string& path);
// The same from JSON text already in memory; `source` names it in error messages (presets, tests, fuzzing).
HfConfigInfo parse_hf_config(const std::string& json_text, const std::string& source);

// Parameters of a Llama-family model from its shape: token embeddings, per layer q/k/v/o (+ q/k/v biases when
// attn_bias), gate/up/down, the two RMSNorm weights, the final norm, and lm_head unless the embeddings are tied.
int64_t count_params(const ModelConfig& c);

}  // namespace kvpack
