// Loading Llama-family weights into fp32: from GGUF (dequantized once at load, q/k rows un-permuted back to HF
// order) or from an HF directory (config.json + safetensors). Both go through load_llama_weights(), which knows the
// HF tensor names and checks every shape against the config.
#include <algorithm>
#include <filesystem>
#include <fmt/ranges.h>

#include "kvpack/error.h"
#include "kvpack/gguf.h"
#include "kvpack/hf_config.h"
#include "kvpack/llama.h"
#include "kvpack/safetensors.h"
#include "kvpack/tokenizer.h"

namespace kvpack {
namespace {

int64_t numel(std::span<const int64_t> shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

// HF name -> llama.cpp GGUF name (blk.N.*), or "" when there is no counterpart.
std::string gguf_name(const std::string& hf) {
  if (hf == "model.embed_tokens.weight") return "token_embd.weight";
  if (hf == "model.norm.weight") return "output_norm.weight";
  if (hf == "lm_head.weight") return "output.weight";
  static const std::pair<const char*, const char*> kLayer[] = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
  };
  const std::string prefix = "model.layers.";
  if (hf.rfind(prefix, 0) != 0) return "";
  const size_t dot = hf.find('.', prefix.size());
  if (dot == std::string::npos) return "";
  const std::string layer = hf.substr(prefix.size(), dot - prefix.size()), rest = hf.substr(dot + 1);
  for (const auto& [h, g] : kLayer)
    if (rest == h) return "blk." + layer + "." + g;
  return "";
}

}  // namespace

void unpermute_ggml_qk(std::vector<float>& w, int n_heads, int head_dim, int64_t cols) {
  // llama.cpp's convert_hf_to_gguf permute(): HF row (head, half, i) is stored at GGUF row (head, i, half).
  KVPACK_CHECK(static_cast<int64_t>(w.size()) == int64_t{n_heads} * head_dim * cols,
               "unpermute_ggml_qk: {} values is not {} heads x {} x {}", w.size(), n_heads, head_dim, cols);
  const int half = head_dim / 2;
  std::vector<float> out(w.size());
  for (int h = 0; h < n_heads; ++h)
    for (int s = 0; s < 2; ++s)
      for (int i = 0; i < half; ++i) {
        const int64_t dst = int64_t{h} * head_dim + s * half + i, src = int64_t{h} * head_dim + 2 * i + s;
        std::copy_n(&w[src * cols], cols, &out[dst * cols]);
      }
  w = std::move(out);
}

void LlamaWeights::validate(const std::string& source) const {
  const auto& c = config;
  kvpack::validate(c, source);
  auto check = [&](const std::string& name, const std::vector<float>& v, int64_t expect) {
    KVPACK_CHECK(static_cast<int64_t>(v.size()) == expect, "{}: tensor '{}' has {} values, expected {}", source,
                 name, v.size(), expect);
  };
  const int64_t d = c.d_model, q = int64_t{c.n_heads} * c.head_dim, kv = int64_t{c.n_kv_heads} * c.head_dim;
  check("embed_tokens", tok_embd, int64_t{c.vocab_size} * d);
  check("norm", output_norm, d);
  if (!output.empty()) check("lm_head", output, int64_t{c.vocab_size} * d);
  if (!rope_freq_factors.empty()) check("rope_freqs", rope_freq_factors, c.head_dim / 2);
  KVPACK_CHECK(static_cast<int>(layers.size()) == c.n_layers, "{}: {} layers loaded, config says {}", source,
               layers.size(), c.n_layers);
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto& L = layers[i];
    const std::string p = fmt::format("layers.{}.", i);
    check(p + "input_layernorm", L.attn_norm, d);
    check(p + "q_proj", L.wq, q * d);
    check(p + "k_proj", L.wk, kv * d);
    check(p + "v_proj", L.wv, kv * d);
    check(p + "o_proj", L.wo, d * q);
    check(p + "post_attention_layernorm", L.ffn_norm, d);
    check(p + "gate_proj", L.w_gate, int64_t{c.d_ff} * d);
    check(p + "up_proj", L.w_up, int64_t{c.d_ff} * d);
    check(p + "down_proj", L.w_down, d * c.d_ff);
    if (!L.bq.empty()) check(p + "q_proj.bias", L.bq, q);
    if (!L.bk.empty()) check(p + "k_proj.bias", L.bk, kv);
    if (!L.bv.empty()) check(p + "v_proj.bias", L.bv, kv);
  }
}

LlamaWeights load_llama_weights(const ModelConfig& config, const std::string& source, const TensorFetch& fetch) {
  kvpack::validate(config, source);
  KVPACK_CHECK(config.d_ff > 0, "{}: model field 'd_ff' must be positive, got {}", source, config.d_ff);
  LlamaWeights w;
  w.config = config;
  const int64_t d = config.d_model, q = int64_t{config.n_heads} * config.head_dim,
                kv = int64_t{config.n_kv_heads} * config.head_dim, ff = config.d_ff, V = config.vocab_size;
  auto need = [&](const std::string& name, std::vector<int64_t> shape, std::vector<float>& out) {
    KVPACK_CHECK(fetch(name, shape, out), "{}: required tensor '{}' is missing", source, name);
  };
  need("model.embed_tokens.weight", {V, d}, w.tok_embd);
  need("model.norm.weight", {d}, w.output_norm);
  // No lm_head means the output projection is tied to the embedding (SmolLM2, Llama-3.2-1B, small Qwen2).
  if (!config.tied_embeddings) fetch("lm_head.weight", std::vector<int64_t>{V, d}, w.output);
  w.config.tied_embeddings = w.output.empty();
  w.layers.resize(config.n_layers);
  for (int l = 0; l < config.n_layers; ++l) {
    auto& L = w.layers[l];
    const std::string p = fmt::format("model.layers.{}.", l);
    need(p + "input_layernorm.weight", {d}, L.attn_norm);
    need(p + "self_attn.q_proj.weight", {q, d}, L.wq);
    need(p + "self_attn.k_proj.weight", {kv, d}, L.wk);
    need(p + "self_attn.v_proj.weight", {kv, d}, L.wv);
    need(p + "self_attn.o_proj.weight", {d, q}, L.wo);
    need(p + "post_attention_layernorm.weight", {d}, L.ffn_norm);
    need(p + "mlp.gate_proj.weight", {ff, d}, L.w_gate);
    need(p + "mlp.up_proj.weight", {ff, d}, L.w_up);
    need(p + "mlp.down_proj.weight", {d, ff}, L.w_down);
    if (config.attn_bias) {
      need(p + "self_attn.q_proj.bias", {q}, L.bq);
      need(p + "self_attn.k_proj.bias", {kv}, L.bk);
      need(p + "self_attn.v_proj.bias", {kv}, L.bv);
    } else {  // tolerate biases a config does not announce
      fetch(p + "self_attn.q_proj.bias", std::vector<int64_t>{q}, L.bq);
      fetch(p + "self_attn.k_proj.bias", std::vector<int64_t>{kv}, L.bk);
      fetch(p + "self_attn.v_proj.bias", std::vector<int64_t>{kv}, L.bv);
    }
  }
  w.validate(source);
  return w;
}

LlamaModel::LlamaModel(LlamaModel&&) noexcept = default;
LlamaModel& LlamaModel::operator=(LlamaModel&&) noexcept = default;
LlamaModel::~LlamaModel() = default;

LlamaModel LlamaModel::from_weights(LlamaWeights w, std::string source) {
  w.validate(source);
  LlamaModel m;
  m.w_ = std::make_unique<LlamaWeights>(std::move(w));
  m.source_ = std::move(source);
  return m;
}

const Tokenizer& LlamaModel::tokenizer() const {
  KVPACK_CHECK(tokenizer_ != nullptr, "{}: model was loaded without a tokenizer (a GGUF file, or an HF directory with tokenizer.json, carries one)",
               source_);
  return *tokenizer_;
}

bool LlamaModel::is_eog(int32_t id) const {
  if (tokenizer_) return tokenizer_->is_eog(id);
  return id == config().eos_token_id;
}

LlamaModel LlamaModel::load(const std::string& path) {
  namespace fs = std::filesystem;
  LlamaModel m;
  m.source_ = path;
  if (fs::is_directory(path)) {
    const std::string cfg_path = (fs::path(path) / "config.json").string();
    KVPACK_CHECK(fs::exists(cfg_path), "{}: not a GGUF file and the directory has no config.json", path);
    const ModelConfig cfg = model_config_from_hf_json(cfg_path);
    const auto st = SafetensorsModel::open(path);
    auto fetch = [&](const std::string& name, std::span<const int64_t> shape, std::vector<float>& out) {
      const StTensor* t = st.find(name);
      if (!t) return false;
      KVPACK_CHECK(std::equal(t->shape.begin(), t->shape.end(), shape.begin(), shape.end()),
                   "{}: tensor '{}' has shape [{}], expected [{}]", path, name, fmt::join(t->shape, ", "),
                   fmt::join(shape, ", "));
      out = to_float(*t);
      return true;
    };
    m.w_ = std::make_unique<LlamaWeights>(load_llama_weights(cfg, path, fetch));
    m.w_->rope_style = RopeStyle::NeoX;  // HF modeling code uses rotate_half
    // The tokenizer, when the directory ships one (tokenizer.json; bos/eos and the chat template come from
    // tokenizer_config.json beside it).
    const fs::path tok_path = fs::path(path) / "tokenizer.json";
    if (fs::exists(tok_path)) {
      m.tokenizer_ = std::make_shared<const Tokenizer>(Tokenizer::from_tokenizer_json(tok_path.string()));
      KVPACK_CHECK(m.tokenizer_->vocab_size() <= cfg.vocab_size,
                   "{}: tokenizer.json has {} tokens but config.json vocab_size is {}", path,
                   m.tokenizer_->vocab_size(), cfg.vocab_size);
      m.add_bos_ = m.tokenizer_->add_bos_default();
    }
    return m;
  }

  const auto f = GgufFile::open(path);
  ModelConfig cfg = model_config_from_gguf(f);
  // llama.cpp permutes q/k rows only for the llama architecture (ggml "normal" RoPE); qwen2 uses NEOX unpermuted.
  const bool permuted = cfg.arch == "llama";
  auto fetch = [&](const std::string& name, std::span<const int64_t> shape, std::vector<float>& out) {
    const std::string g = gguf_name(name);
    const GgufTensorInfo* t = g.empty() ? nullptr : f.find_tensor(g);
    if (!t) return false;
    std::vector<int64_t> dims(t->dims.rbegin(), t->dims.rend());  // ggml order is innermost first
    KVPACK_CHECK(numel(dims) == numel(shape) && dims.size() == shape.size() &&
                     std::equal(dims.begin(), dims.end(), shape.begin()),
                 "{}: tensor '{}' has shape {} (ggml order), expected [{}] (row-major)", path, g, t->shape_string(),
                 fmt::join(shape, ", "));
    out = f.dequantize(*t);
    if (permuted) {
      const bool is_q = name.find("q_proj") != std::string::npos, is_k = name.find("k_proj") != std::string::npos;
      const int64_t cols = shape.size() == 2 ? shape[1] : 1;
      if (is_q) unpermute_ggml_qk(out, cfg.n_heads, cfg.head_dim, cols);
      if (is_k) unpermute_ggml_qk(out, cfg.n_kv_heads, cfg.head_dim, cols);
    }
    return true;
  };
  m.w_ = std::make_unique<LlamaWeights>(load_llama_weights(cfg, path, fetch));
  m.w_->rope_style = RopeStyle::NeoX;
  // Llama-3.1 GGUFs carry their rope scaling as per-frequency divisors instead of metadata. model_config_from_gguf
  // recognizes the Llama-3 pattern and sets rope_scaling; the divisors are applied only when it did not, never twice.
  const GgufTensorInfo* rf = f.find_tensor("rope_freqs.weight");
  if (rf && cfg.rope_scaling.type == "none") {
    KVPACK_CHECK(rf->n_elements == cfg.head_dim / 2, "{}: tensor 'rope_freqs.weight' has {} elements, expected {}",
                 path, rf->n_elements, cfg.head_dim / 2);
    m.w_->rope_freq_factors = f.dequantize(*rf);
    rope_inv_freq(m.w_->config, m.w_->rope_freq_factors);  // validates the factors now, not at the first session
  }
  m.tokenizer_ = std::make_shared<const Tokenizer>(Tokenizer::from_gguf(f));
  m.add_bos_ = f.get_bool("tokenizer.ggml.add_bos_token", false);
  auto& c = m.w_->config;
  if (c.bos_token_id < 0) c.bos_token_id = static_cast<int>(f.get_int_opt("tokenizer.ggml.bos_token_id").value_or(-1));
  if (c.eos_token_id < 0) c.eos_token_id = static_cast<int>(f.get_int_opt("tokenizer.ggml.eos_token_id").value_or(-1));
  return m;
}

}  // namespace kvpack
