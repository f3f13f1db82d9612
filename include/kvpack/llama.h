// CPU reference Llama-family runner (Llama 2/3.x incl. Llama-3.1 rope_scaling, Qwen2 q/k/v biases, SmolLM2) in fp32
// on OpenBLAS. It is the quality oracle for every KV format: every K (after RoPE) and V it writes to its cache goes
// through KvCodec::store() in place, and attention reads only the stored values (see kv_codec.h).
//
// RoPE layout. HF checkpoints rotate pairs (i, i + head_dim/2) ("rotate_half", ggml's NEOX mode). llama.cpp's
// converter permutes the rows of attn_q/attn_k of *llama* models so that ggml's "normal" mode, which rotates adjacent
// pairs (2i, 2i+1), gives the same result. The loader undoes that permutation, so the runner always uses NEOX pairs
// and the K vectors that reach the codec have the same channel order whether the model came from a GGUF file or an
// HF directory (a calibration file made from one applies to the other). Qwen2 GGUFs are not permuted (NEOX in ggml).
// RopeStyle::Interleaved stays available for weights kept in ggml order (tests prove both agree).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvpack/kv_codec.h"
#include "kvpack/model_config.h"

namespace kvpack {

class Tokenizer;

enum class RopeStyle { NeoX, Interleaved };

// All weights in fp32, row-major [out_features, in_features] like torch's nn.Linear.
struct LlamaLayerWeights {
  std::vector<float> attn_norm;             // [d_model]
  std::vector<float> wq, wk, wv;           // [n_heads*head_dim, d_model], [n_kv_heads*head_dim, d_model] x2
  std::vector<float> bq, bk, bv;           // biases (Qwen2) or empty
  std::vector<float> wo;                   // [d_model, n_heads*head_dim]
  std::vector<float> ffn_norm;             // [d_model]
  std::vector<float> w_gate, w_up;         // [d_ff, d_model]
  std::vector<float> w_down;               // [d_model, d_ff]
};

struct LlamaWeights {
  ModelConfig config;
  RopeStyle rope_style = RopeStyle::NeoX;
  // [head_dim/2] divisors of the RoPE inverse frequencies, as llama.cpp stores Llama-3.1 scaling in GGUF files
  // (tensor rope_freqs.weight instead of rope_scaling metadata); empty = none. Applied on top of config.rope_scaling.
  std::vector<float> rope_freq_factors;
  std::vector<float> tok_embd;     // [vocab, d_model]
  std::vector<float> output_norm;  // [d_model]
  std::vector<float> output;       // [vocab, d_model]; empty when tied to tok_embd
  std::vector<LlamaLayerWeights> layers;

  // Throws kvpack::Error naming `source` and the tensor if any size disagrees with the config.
  void validate(const std::string& source) const;
};

// Fetches a tensor by its HF name ("model.layers.3.self_attn.q_proj.weight") as fp32 with the given row-major shape;
// returns false when the tensor does not exist (the caller decides whether it is optional). Throws on a shape mismatch.
using TensorFetch = std::function<bool(const std::string& hf_name, std::span<const int64_t> shape, std::vector<float>& out)>;
LlamaWeights load_llama_weights(const ModelConfig& config, const std::string& source, const TensorFetch& fetch);
// Reorders the rows of a q/k projection (and bias) from llama.cpp's permuted order to HF order, per head.
// rows = n_heads*head_dim; cols = 1 for a bias.
void unpermute_ggml_qk(std::vector<float>& w, int n_heads, int head_dim, int64_t cols);

class LlamaModel {
 public:
  // A .gguf file, or an HF directory with config.json and *.safetensors (the tokenizer from GGUF metadata or the directory's tokenizer.json).
  static LlamaModel load(const std::string& path);
  static LlamaModel from_weights(LlamaWeights w, std::string source = "<memory>");

  LlamaModel(LlamaModel&&) noexcept;
  LlamaModel& operator=(LlamaModel&&) noexcept;
  ~LlamaModel();

  const ModelConfig& config() const { return w_->config; }
  const LlamaWeights& weights() const { return *w_; }
  const std::string& source() const { return source_; }
  bool has_tokenizer() const { return tokenizer_ != nullptr; }
  const Tokenizer& tokenizer() const;  // throws when the model was loaded without one
  // Whether text windows should start with BOS (GGUF tokenizer.ggml.add_bos_token; false when unknown).
  bool add_bos() const { return add_bos_; }
  int bos_id() const { return config().bos_token_id; }
  // Token ids that end generation (EOS/EOT); from the tokenizer when present, else config.eos_token_id.
  bool is_eog(int32_t id) const;

 private:
  LlamaModel() = default;
  std::unique_ptr<LlamaWeights> w_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::string source_;
  bool add_bos_ = false;
};

// fp32 "codec" that stores K/V unchanged (what transformers does in fp32); the default is make_bf16_codec().
std::unique_ptr<KvCodec> make_fp32_codec();

// Logits for positions [first_pos, first_pos + n): logits[i * vocab + j].
using LogitsCallback = std::function<void(int first_pos, int n, const float* logits)>;

// One sequence's KV cache and scratch. Not thread-safe; use one session per thread (sessions share the model).
class LlamaSession {
 public:
  // codec == nullptr: a bf16 cache. The model, codec and observer must outlive the session.
  LlamaSession(const LlamaModel& model, int max_context, const KvCodec* codec = nullptr,
               ForwardObserver* observer = nullptr);
  ~LlamaSession();
  LlamaSession(const LlamaSession&) = delete;
  LlamaSession& operator=(const LlamaSession&) = delete;

  // Appends tokens at position() and runs them through the model in chunks of chunk_size() tokens (batched prefill,
  // causal). logits_cb gets each chunk's logits; pass an empty function to skip the output projection entirely.
  void forward(std::span<const int32_t> tokens, const LogitsCallback& logits_cb);
  // Appends tokens and returns the logits of the last one only ([vocab]).
  std::vector<float> forward_last(std::span<const int32_t> tokens);
  // Greedy decoding: prefill `prompt` (appended to whatever is cached), then up to max_new_tokens tokens, stopping
  // after an end-of-generation token (which is included). on_token sees each new token as it is chosen.
  std::vector<int32_t> generate_greedy(std::span<const int32_t> prompt, int max_new_tokens,
                                       const std::function<void(int32_t)>& on_token = {});

  int position() const { return pos_; }
  int max_context() const { return max_ctx_; }
  void reset() { pos_ = 0; }
  // Largest number of tokens pushed through the layers at once (bounds scratch memory: ~chunk x (vocab + 8 d_ff)).
  int chunk_size() const { return chunk_; }
  void set_chunk_size(int n);
  const KvCodec& codec() const { return *codec_; }

 private:
  void run_chunk(const int32_t* tokens, int n, float* logits_out);
  void attention(int layer, int n, const float* q, float* out);

  const LlamaModel& model_;
  const ModelConfig& cfg_;
  std::unique_ptr<KvCodec> own_codec_;
  const KvCodec* codec_;
  ForwardObserver* observer_;
  int max_ctx_, pos_ = 0, chunk_ = 256;
  std::vector<float> k_cache_, v_cache_;  // [n_layers, max_ctx, n_kv_heads, head_dim] each, as stored by the codec
  std::vector<float> x_, h_, q_, k_, v_, att_, gate_, up_, scores_;
  std::vector<int> positions_;
  std::vector<float> cos_, sin_;  // [max_ctx, head_dim/2] RoPE tables (rope_scaling applied)
};

// Inverse frequencies for RoPE including rope_scaling (llama3 / linear) and optional per-frequency divisors
// (LlamaWeights::rope_freq_factors); size head_dim/2. Exposed for tests.
std::vector<double> rope_inv_freq(const ModelConfig& c, std::span<const float> freq_factors = {});

}  // namespace kvpack
