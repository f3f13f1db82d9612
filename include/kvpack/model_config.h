// Llama-family model shape, read from GGUF metadata or an HF config.json. Shared by the runner, planner, calibration.
#pragma once
#include <cstdint>
#include <string>

namespace kvpack {

struct RopeScaling {
  std::string type = "none";  // "none", "llama3" (Llama-3.1), "linear"
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  std::string arch = "llama";  // "llama" (Llama 2/3.x, SmolLM2) or "qwen2" (q/k/v biases)
  std::string name;            // human name, e.g. "SmolLM2-135M-Instruct"
  int n_layers = 0;
  int d_model = 0;
  int n_heads = 0;      // query heads
  int n_kv_heads = 0;   // key/value heads (GQA)
  int head_dim = 0;
  int d_ff = 0;
  int vocab_size = 0;
  int64_t max_context = 0;
  double rope_theta = 10000.0;
  double rms_eps = 1e-5;
  RopeScaling rope_scaling;
  bool tied_embeddings = false;
  bool attn_bias = false;        // qwen2: bias on q/k/v projections
  int64_t n_params = 0;          // total parameters (for the planner's weight bytes); 0 when unknown
  int bos_token_id = -1;
  int eos_token_id = -1;

  int group_size() const { return n_kv_heads > 0 ? n_heads / n_kv_heads : 0; }
  // K/V elements stored per token across all layers (K and V together).
  int64_t kv_elements_per_token() const { return int64_t{2} * n_layers * n_kv_heads * head_dim; }
};

// Throws kvpack::Error naming `source` and the field if the shape is inconsistent (zero/negative sizes,
// n_heads not a multiple of n_kv_heads, ...).
void validate(const ModelConfig& c, const std::string& source);

}  // namespace kvpack
