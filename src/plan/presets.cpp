// Planner inputs: GPU presets, model presets (their published HF config.json, embedded verbatim so the same parser
// reads presets and user files), and loading a model from a preset key, an HF config or a GGUF file.
#include <fmt/format.h>

#include <array>
#include <filesystem>
#include <string>

#include "kvpack/error.h"
#include "kvpack/gguf.h"
#include "kvpack/hf_config.h"
#include "kvpack/plan.h"

namespace kvpack {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// reported_bytes: nvidia-smi memory.total. H100: 81,559 MiB (the figure behind the published 58.6 GB budget).
// H200: 143,771 MiB, read off an H200 with `nvidia-smi --query-gpu=memory.total --format=csv` (the CUDA runtime
// sees 616 MiB less: cudaMemGetInfo total 150,109,880,320 bytes).
const std::array<GpuSpec, 2> kGpus{{
    {"h100-80gb", "H100 SXM 80 GB", 80e9, 81559 * kMiB, 8},
    {"h200-141gb", "H200 SXM 141 GB", 141e9, 143771 * kMiB, 8},
}};

struct ModelPreset {
  std::string_view key;
  std::string_view name;
  std::string_view config_json;  // the model's published config.json (Hugging Face), verbatim
};

constexpr std::string_view kLlama31_8B = R"json({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})json";

constexpr std::string_view kLlama31_70B = R"json({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "hidden_act": "silu",
  "hidden_size": 8192,
  "initializer_range": 0.02,
  "intermediate_size": 28672,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 64,
  "num_hidden_layers": 80,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})json";

constexpr std::string_view kSmolLM2_135M = R"json({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 576,
  "initializer_range": 0.041666666666666664,
  "intermediate_size": 1536,
  "is_llama_config": true,
  "max_position_embeddings": 8192,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 9,
  "num_hidden_layers": 30,
  "num_key_value_heads": 3,
  "pad_token_id": 2,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_interleaved": false,
  "rope_scaling": null,
  "rope_theta": 100000,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.42.3",
  "use_cache": true,
  "vocab_size": 49152
})json";

constexpr std::array<ModelPreset, 3> kModels{{
    {"llama-3.1-8b", "Llama-3.1-8B", kLlama31_8B},
    {"llama-3.1-70b", "Llama-3.1-70B", kLlama31_70B},
    {"smollm2-135m", "SmolLM2-135M-Instruct", kSmolLM2_135M},
}};

constexpr std::array<std::string_view, 3> kModelKeys{kModels[0].key, kModels[1].key, kModels[2].key};

std::string known_models() {
  std::string s;
  for (auto k : kModelKeys) s += (s.empty() ? "" : ", ") + std::string(k);
  return s;
}

// Weight bytes of an HF checkpoint: parameters x bytes of the dtype it is published in.
ModelSpec spec_from_hf(const HfConfigInfo& info, std::string source) {
  KVPACK_CHECK(info.dtype_bytes > 0,
               "{}: cannot size the weights: torch_dtype is {} (expected bfloat16, float16 or float32); pass the "
               "weight size explicitly (--weight-bytes)",
               source, info.torch_dtype.empty() ? std::string("missing") : "'" + info.torch_dtype + "'");
  ModelSpec m;
  m.config = info.config;
  m.weight_bytes = static_cast<double>(info.config.n_params) * info.dtype_bytes;
  m.weight_source = fmt::format("params x {} bytes ({})", info.dtype_bytes, info.torch_dtype);
  m.source = std::move(source);
  return m;
}

}  // namespace

std::span<const GpuSpec> gpu_presets() { return kGpus; }

const GpuSpec& gpu_preset(std::string_view key) {
  for (const auto& g : kGpus)
    if (g.key == key) return g;
  // Short forms people type: "h100", "h200".
  for (const auto& g : kGpus)
    if (g.key.substr(0, g.key.find('-')) == key) return g;
  std::string known;
  for (const auto& g : kGpus) known += (known.empty() ? "" : ", ") + g.key;
  fail("unknown GPU preset '{}' (known: {}; or give --gpu-memory-gb)", key, known);
}

std::string_view memory_convention_name(MemoryConvention c) {
  switch (c) {
    case MemoryConvention::published: return "published";
    case MemoryConvention::reported: return "reported";
    case MemoryConvention::nominal: return "nominal";
  }
  return "?";
}

MemoryConvention parse_memory_convention(std::string_view s) {
  for (auto c : {MemoryConvention::published, MemoryConvention::reported, MemoryConvention::nominal})
    if (memory_convention_name(c) == s) return c;
  fail("unknown memory convention '{}' (known: published, reported, nominal)", s);
}

std::span<const std::string_view> model_preset_keys() { return kModelKeys; }

ModelSpec load_model_spec(const std::string& what) {
  KVPACK_CHECK(!what.empty(), "no model given (a preset: {}; an HF config.json; or a .gguf file)", known_models());
  for (const auto& p : kModels) {
    if (p.key != what) continue;
    std::string source = fmt::format("preset {}", p.key);
    ModelSpec m = spec_from_hf(parse_hf_config(std::string(p.config_json), source), source);
    m.config.name = std::string(p.name);
    return m;
  }
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(what, ec))
    fail("model '{}' is neither a preset ({}) nor an existing file or directory", what, known_models());
  if (fs::path(what).extension() == ".gguf") {
    GgufFile f = GgufFile::open(what);
    ModelSpec m;
    m.config = model_config_from_gguf(f);
    // A GGUF is already in its serving precision: the weights are exactly its tensor data.
    uint64_t bytes = 0;
    for (const auto& t : f.tensors()) bytes += t.n_bytes;
    m.weight_bytes = static_cast<double>(bytes);
    m.weight_source = fmt::format("GGUF tensor data ({} tensors)", f.tensors().size());
    m.source = what;
    return m;
  }
  return spec_from_hf(read_hf_config(what), what);
}

}  // namespace kvpack
